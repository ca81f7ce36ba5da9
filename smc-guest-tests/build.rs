//! Generates the librdmacm binding (`src/verbs_cm.rs`, feature `verbs`) from
//! the system's `<rdma/rdma_cma.h>` with bindgen, so the layouts of
//! `rdma_cm_id`, `rdma_cm_event`, `rdma_conn_param`, ... are the header's,
//! and links `librdmacm`. No fallback: without the headers or libclang the
//! build fails naming the Debian packages.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "verbs")]
    rdmacm::generate();
}

#[cfg(feature = "verbs")]
mod rdmacm {
    use std::path::PathBuf;

    const INSTALL: &str = "apt-get install librdmacm-dev libclang-dev \
                           (scripts/install-deps.sh installs both)";

    /// librdmacm functions `src/verbs_cm.rs` calls.
    const FUNCTIONS: &[&str] = &[
        "rdma_create_event_channel",
        "rdma_destroy_event_channel",
        "rdma_create_id",
        "rdma_destroy_id",
        "rdma_bind_addr",
        "rdma_listen",
        "rdma_resolve_addr",
        "rdma_resolve_route",
        "rdma_connect",
        "rdma_accept",
        "rdma_disconnect",
        "rdma_get_cm_event",
        "rdma_ack_cm_event",
        "rdma_event_str",
    ];

    /// Types it names (what they contain follows, with the header's layout).
    const TYPES: &[&str] = &[
        "rdma_event_channel",
        "rdma_cm_id",
        "rdma_cm_event",
        "rdma_cm_event_type",
        "rdma_conn_param",
        "rdma_port_space",
    ];

    /// Enumerators it uses (`RDMA_PS_TCP`, `RDMA_CM_EVENT_*`).
    const CONSTANTS: &[&str] = &["RDMA_PS_TCP", "RDMA_CM_EVENT_.*"];

    pub fn generate() {
        let mut b = bindgen::Builder::default()
            .header_contents("rdmacm.h", "#include <rdma/rdma_cma.h>\n")
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
            // C enums as typed constants, named as in C (`RDMA_PS_TCP`): an
            // unknown value from the library is then no Rust UB
            .default_enum_style(bindgen::EnumVariation::Consts)
            .prepend_enum_name(false)
            .generate_comments(false)
            .layout_tests(true);
        for f in FUNCTIONS {
            b = b.allowlist_function(f);
        }
        for t in TYPES {
            b = b.allowlist_type(t);
        }
        for c in CONSTANTS {
            b = b.allowlist_var(c);
        }
        // bindgen panics (rather than returning an error) when it cannot load
        // libclang: turn that into the same one clear message.
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || b.generate()));
        std::panic::set_hook(hook);
        let bindings = match res {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => fail(&format!(
                "bindgen could not read <rdma/rdma_cma.h> (librdmacm headers): {e}"
            )),
            Err(p) => {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                fail(&format!("bindgen could not run (libclang missing?): {why}"))
            }
        };
        let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("rdmacm.rs");
        bindings
            .write_to_file(&out)
            .unwrap_or_else(|e| fail(&format!("writing {}: {e}", out.display())));
        // the binary runs dynamically linked against the guest's librdmacm.so.1
        println!("cargo:rustc-link-lib=dylib=rdmacm");
    }

    fn fail(why: &str) -> ! {
        eprintln!("error: smc-guest-tests (feature `verbs`): {why}");
        eprintln!("error: install the librdmacm headers and libclang: {INSTALL}");
        eprintln!("error: (or build without the verbs test: --no-default-features)");
        // an exit, not a panic: no backtrace under RUST_BACKTRACE
        std::process::exit(1);
    }
}
