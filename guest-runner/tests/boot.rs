//! `guest-runner boot` end to end with a fake QEMU: a shell script that
//! speaks the guest's side of the protocol (VR-BOOTED, runs the job from the
//! 9p `job` directory, VR-RESULT), so the runner's verdicts, timeouts,
//! fail-fast, retries, signals and log layout are tested without a guest.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const FAKE_QEMU: &str = r#"#!/bin/sh
[ "$1" = --version ] && { echo "QEMU emulator version 11.1.0 (fake)"; exit 0; }
prev=
for a in "$@"; do
    case "$prev" in
        -append) for w in $a; do case $w in vr.name=*) name=${w#vr.name=} ;; esac; done ;;
        -fsdev) case $a in local,id=fsjob,path=*) job=${a#local,id=fsjob,path=}; job=${job%%,*} ;; esac ;;
        -netdev) case $a in stream,*server=on*) : >"${a##*addr.path=}" ;; esac ;;
    esac
    prev=$a
done
echo "fake firmware"
if [ -f "$job/panic-once" ] && [ ! -f "$job/panicked" ]; then
    : >"$job/panicked"; echo "Kernel panic - not syncing: fake"; exit 1
fi
[ -f "$job/crash" ] && { echo "fake qemu: crashed" >&2; exit 1; }
echo "VR-BOOTED name=$name"
(cd "$job" && sh ./run.sh >out.log 2>&1); rc=$?
cat "$job/out.log"
echo "VR-RESULT name=$name rc=$rc"
"#;

struct Fixture {
    dir: String,
}

impl Fixture {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("guest-runner-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("img")).unwrap();
        let dir = dir.to_string_lossy().into_owned();
        let mut img = vec![0u8; 0x1000];
        img[0x1FE..0x200].copy_from_slice(&[0x55, 0xAA]);
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x206..0x208].copy_from_slice(&0x020Fu16.to_le_bytes());
        img[0x20E..0x210].copy_from_slice(&0x400u16.to_le_bytes());
        img[0x600..0x607].copy_from_slice(b"7.3.9 #");
        std::fs::write(format!("{dir}/img/bzImage"), img).unwrap();
        std::fs::write(format!("{dir}/img/rootfs.ext4"), "").unwrap();
        let q = format!("{dir}/qemu");
        std::fs::write(&q, FAKE_QEMU).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o755)).unwrap();
        Fixture { dir }
    }

    fn p(&self, rel: &str) -> String {
        format!("{}/{rel}", self.dir)
    }

    /// Writes job script `NAME.sh`, returns its path.
    fn job(&self, name: &str, body: &str) -> String {
        let p = self.p(&format!("{name}.sh"));
        std::fs::write(&p, body).unwrap();
        p
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_guest-runner"));
        c.args([
            "boot",
            "--qemu",
            &self.p("qemu"),
            "--image",
            &self.p("img"),
            "--logdir",
            &self.p("log"),
        ]);
        c.args(args).env("VHOST_RDMA_CACHE", self.p("cache"));
        c
    }

    fn run(&self, args: &[&str]) -> (i32, String, String) {
        let Output {
            status,
            stdout,
            stderr,
        } = self.cmd(args).output().unwrap();
        let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (status.code().unwrap_or(-1), s(stdout), s(stderr))
    }

    fn summary(&self) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.p("log/summary.json")).unwrap()).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn two_guests_pass_and_leave_their_logs() {
    let f = Fixture::new("ok");
    let a = f.job("a", "echo hello from a\n");
    let (rc, out, err) = f.run(&[
        "--accel",
        "tcg",
        "--net",
        "stream",
        "--guest",
        &format!("a,ip=10.77.0.1/24,cmd={a}"),
        "--guest",
        "b",
    ]);
    assert_eq!(rc, 0, "{out}\n{err}");
    assert!(err.contains("run-guests: started a (pid "), "{err}");
    assert!(
        err.contains(&format!("), console: {}", f.p("log/a.console.log"))),
        "{err}"
    );
    assert!(
        err.contains("run-guests: accel: tcg (requested with --accel)\n"),
        "{err}"
    );
    assert!(
        err.contains("run-guests: a: rc=0\n") && err.contains("run-guests: b: rc=0\n"),
        "{err}"
    );
    assert!(
        out.contains(&format!("RUN-GUESTS OK logdir={}\n", f.p("log"))),
        "{out}"
    );
    let table: Vec<&str> = out.lines().take(4).collect();
    assert_eq!(table[0], "guest  accel  boot_s  run_s  rc  status");
    assert_eq!(table[1], "-----  -----  ------  -----  --  ------");
    assert!(
        table[2].starts_with("a      tcg    ") && table[2].ends_with("  0   ok"),
        "{table:?}"
    );
    for file in [
        "a.job/run.sh",
        "a.job/out.log",
        "a.console.log",
        "a.qemu.log",
        "a.qemu-cmd.sh",
        "b.job/run.sh",
    ] {
        assert!(Path::new(&f.p(&format!("log/{file}"))).exists(), "{file}");
    }
    assert_eq!(
        std::fs::read_to_string(f.p("log/a.job/out.log")).unwrap(),
        "hello from a\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.p("log/b.job/run.sh")).unwrap(),
        "echo no command given; exit 0\n"
    );
    let console = std::fs::read_to_string(f.p("log/a.console.log")).unwrap();
    assert!(
        console.ends_with("hello from a\nVR-RESULT name=a rc=0\n"),
        "{console}"
    );
    let cmd = std::fs::read_to_string(f.p("log/a.qemu-cmd.sh")).unwrap();
    assert!(
        cmd.starts_with("#!/bin/sh\n") && cmd.contains("-netdev stream,id=n0,server=on"),
        "{cmd}"
    );
    let s = f.summary();
    assert_eq!(s["accel"], "tcg");
    assert_eq!(s["logdir"], f.p("log"));
    assert_eq!(s["guests"][0]["name"], "a");
    assert_eq!(s["guests"][0]["status"], "DONE");
    assert_eq!(s["guests"][0]["rc"], 0);
    assert!(
        s["guests"][1]["boot_s"].is_f64() && s["guests"][1]["run_s"].is_f64(),
        "{s}"
    );
    assert_eq!(s["guests"][1]["job_dir"], f.p("log/b.job"));
}

#[test]
fn a_failed_guest_stops_the_others_and_shows_its_console() {
    let f = Fixture::new("fail");
    let a = f.job("a", "echo something broke; exit 3\n");
    let b = f.job("b", "sleep 30\n");
    let (rc, out, err) = f.run(&[
        "--accel",
        "tcg",
        "--net",
        "none",
        "--guest",
        &format!("a,cmd={a}"),
        "--guest",
        &format!("b,cmd={b}"),
    ]);
    assert_eq!(rc, 1, "{out}\n{err}");
    assert!(err.contains("run-guests: a: DONE rc=3 \n"), "{err}");
    assert!(out.contains("--- a: FAIL rc=3\n"), "{out}");
    assert!(
        out.contains("--- last console lines (") && out.contains("    something broke\n"),
        "{out}"
    );
    assert!(
        out.contains("--- b: KILLED: stopped because a failed (DONE)\n"),
        "{out}"
    );
    assert!(out.contains("RUN-GUESTS FAILED logdir="), "{out}");
    assert_eq!(f.summary()["guests"][1]["status"], "KILLED");
}

#[test]
fn timeouts_crashes_and_early_panics() {
    let f = Fixture::new("bad");
    let slow = f.job("slow", "sleep 30\n");
    std::fs::create_dir_all(f.p("log/c.job")).unwrap();
    std::fs::write(f.p("log/c.job/crash"), "").unwrap();
    std::fs::create_dir_all(f.p("log/p.job")).unwrap();
    std::fs::write(f.p("log/p.job/panic-once"), "").unwrap();
    let t0 = Instant::now();
    let (rc, out, err) = f.run(&[
        "--accel",
        "tcg",
        "--net",
        "none",
        "--no-fail-fast",
        "--tail",
        "1",
        "--guest",
        &format!("t,cmd={slow},timeout=1"),
        "--guest",
        "c",
        "--guest",
        "p",
    ]);
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert_eq!(rc, 1, "{out}\n{err}");
    assert!(
        err.contains("run-guests: t: TIMEOUT rc=None no VR-RESULT after 1 s\n"),
        "{err}"
    );
    assert!(
        err.contains("run-guests: c: CRASH rc=None QEMU exited with status 1 and no VR-RESULT: fake qemu: crashed"),
        "{err}"
    );
    assert!(
        out.contains("--- QEMU stderr (") && out.contains("    fake qemu: crashed\n"),
        "{out}"
    );
    // --tail 1: the last console line only
    assert!(
        out.contains("console.log):\n    VR-BOOTED name=t\n--- c"),
        "{out}"
    );
    assert!(
        err.contains("run-guests: p: kernel panic before VR-BOOTED ("),
        "{err}"
    );
    assert!(
        err.contains("booting it again (a TCG early-boot flake, retry 1 of 1)"),
        "{err}"
    );
    assert!(err.contains("run-guests: p: rc=0\n"), "{err}");
    assert!(std::fs::read_to_string(f.p("log/p.console.panic.log"))
        .unwrap()
        .contains("Kernel panic"));
}

#[test]
fn sigterm_stops_the_guests() {
    let f = Fixture::new("term");
    let slow = f.job("slow", "sleep 60\n");
    let child = f
        .cmd(&[
            "--accel",
            "tcg",
            "--net",
            "none",
            "--guest",
            &format!("a,cmd={slow}"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let console = f.p("log/a.console.log");
    let t0 = Instant::now();
    while !std::fs::read_to_string(&console).is_ok_and(|c| c.contains("VR-BOOTED")) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the fake guest did not boot"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: a signal to the child we started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(130), "{o}\n{e}");
    assert!(
        e.contains("run-guests: interrupted (SIGTERM); stopping guests"),
        "{e}"
    );
    assert!(o.contains("--- a: KILLED: interrupted by SIGTERM"), "{o}");
    let pid: i32 = e
        .split("started a (pid ")
        .nth(1)
        .unwrap()
        .split(')')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // SAFETY: signal 0 only checks for the process.
    assert_ne!(unsafe { libc::kill(pid, 0) }, 0, "QEMU {pid} still runs");
}

#[test]
fn setup_errors_exit_2() {
    let f = Fixture::new("setup");
    let (rc, _, err) = f.run(&[
        "--accel",
        "tcg",
        "--sock-wait",
        "0.2",
        "--guest",
        &format!("a,sock={}", f.p("no.sock")),
    ]);
    assert_eq!(rc, 2);
    assert!(
        err.contains(&format!(
            "run-guests: error: guest a: vhost-user socket {} did not appear within 0.2 s",
            f.p("no.sock")
        )),
        "{err}"
    );
    let (rc, _, err) = f.run(&["--guest", "a", "--guest", "a"]);
    assert_eq!(
        (rc, err.trim_end()),
        (2, "run-guests: error: duplicate guest name a")
    );
    let (rc, _, err) = f.run(&["--dry-run", "--guest", "a,cmd=/nonexistent.sh"]);
    assert_eq!(
        (rc, err.trim_end()),
        (
            2,
            "run-guests: error: guest a: cmd file /nonexistent.sh not found"
        )
    );
}

#[test]
fn dry_run_and_the_probe_cache() {
    let f = Fixture::new("probe");
    // --probe-only probes with a tiny guest (the fake one boots under any accel)
    let (rc, out, err) = f.run(&["--probe-only", "--reprobe"]);
    assert_eq!(rc, 0, "{err}");
    let accel = out.trim();
    // kvm when /dev/kvm is usable (the fake guest boots under any accelerator)
    assert!(
        accel == "kvm"
            || accel == "tcg" && !Path::new("/dev/kvm").exists()
            || err.contains("permissions"),
        "{err}"
    );
    let cache: serde_json::Value =
        serde_json::from_slice(&std::fs::read(f.p("cache/accel-probe.json")).unwrap()).unwrap();
    let (key, v) = cache.as_object().unwrap().iter().next().unwrap();
    assert!(
        key.ends_with("|QEMU emulator version 11.1.0 (fake)"),
        "{key}"
    );
    assert_eq!(v["accel"], accel);
    assert_eq!(v["when"].as_str().unwrap().len(), 19);
    // the next run takes the cached verdict; --dry-run prints the command lines
    let (rc, out, err) = f.run(&[
        "--dry-run",
        "--monitor",
        "--net",
        "none",
        "--guest",
        "a,ip=10.0.0.1/24",
    ]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        err.contains(&format!(
            "run-guests: accel: {accel} (cached probe verdict ({}, ",
            f.p("cache/accel-probe.json")
        )),
        "{err}"
    );
    assert!(
        out.starts_with(&format!("# guest a\n{} \\\n  -accel ", f.p("qemu"))),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "  -monitor unix:{},server=on,wait=off \\\n",
            f.p("log/a.mon")
        )),
        "{out}"
    );
    assert!(out.contains("  -append 'root=/dev/vda ro init=/sbin/vr-init console=ttyS0 panic=-1 vr.name=a vr.ip=10.0.0.1/24' \\\n"), "{out}");
}

#[test]
fn kernel_check() {
    let f = Fixture::new("kcheck");
    let run = |p: &str| {
        Command::new(env!("CARGO_BIN_EXE_guest-runner"))
            .args(["kernel-check", p])
            .output()
            .unwrap()
    };
    let out = run(&f.p("img/bzImage"));
    assert_eq!(
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).as_ref()
        ),
        (Some(0), "7.3.9 #\n")
    );
    let out = run(&f.p("img/rootfs.ext4"));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("error: kernel image "),
        "{out:?}"
    );
}

/// The demo takes the same kernel options as run-guests and the matrix,
/// and refuses a file that is no bzImage before it builds anything.
#[test]
fn the_demo_takes_the_same_kernel_options() {
    let f = Fixture::new("script-opts");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let text = f.p("notes.txt");
    std::fs::write(&text, "not a kernel\n".repeat(100)).unwrap();
    let runner = env!("CARGO_BIN_EXE_guest-runner");
    let out = Command::new(runner)
        .args(["demo", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        help.contains("--kernel <KERNEL>") && help.contains("--append <APPEND>"),
        "{help}"
    );
    let logdir = f.p("log-demo");
    let out = Command::new(runner)
        .env("VHOST_RDMA_ROOT", root)
        .args(["demo", "--no-build", "--kernel", &text, "--logdir", &logdir])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let all = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(all.contains("is not a bzImage"), "{all}");
}
