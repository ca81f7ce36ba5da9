//! The host row "tshark" (ci/matrix.py's tshark_test before): the verdict on
//! tshark's output, and the whole row with a stand-in tshark on PATH.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use guest_results::pyjson::Json;
use guest_results::tshark::judge;

const PHS: &str = "
===================================================================
Protocol Hierarchy Statistics
Filter: 

eth                                      frames:120 bytes:90000
  ip                                     frames:120 bytes:90000
    udp                                  frames:118 bytes:88000
      infiniband                         frames:118 bytes:88000
        smc                              frames:6 bytes:900
    tcp                                  frames:2 bytes:120
      smc                                frames:1 bytes:80
===================================================================
";

fn protos(p: &[&str]) -> Vec<String> {
    p.iter().map(|s| s.to_string()).collect()
}

fn sd(row: &Json) -> (String, String) {
    (row.at("status").to_string(), row.at("detail").to_string())
}

#[test]
fn every_protocol_decoded_and_nothing_malformed_passes() {
    assert_eq!(
        sd(&judge(PHS, "\n", &protos(&["smc", "infiniband"]), 3)),
        (
            "PASS".into(),
            // smc at two levels adds up
            "120 frames, decoded: smc 7, infiniband 118; 0 malformed".into()
        )
    );
}

#[test]
fn a_missing_protocol_or_a_malformed_frame_fails() {
    assert_eq!(
        sd(&judge(PHS, "", &protos(&["iwarp_mpa", "infiniband"]), 0)),
        (
            "FAIL".into(),
            "120 frames; decoded: iwarp_mpa 0, infiniband 118; missing: iwarp_mpa; 0 malformed"
                .into()
        )
    );
    let long = "x".repeat(300);
    let mal = format!("12\tRoCE\t{long}\n\n13\tRoCE\tbad\n");
    let (st, det) = sd(&judge(PHS, &mal, &protos(&["infiniband"]), 0));
    assert_eq!(st, "FAIL");
    let first = format!("12\tRoCE\t{}", &long[..200 - 8]);
    assert_eq!(
        det,
        format!("120 frames; decoded: infiniband 118; missing: -; 2 malformed, first: {first}")
    );
}

/// PATH with `d` first (the stand-in still needs `cat`).
fn path_with(d: &Path) -> String {
    format!(
        "{}:{}",
        d.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A directory holding a stand-in `tshark` that prints `phs` for `-z io,phs`
/// and `mal` for the malformed-frame query, exiting `rc`.
fn fake_tshark(name: &str, phs: &str, mal: &str, rc: i32) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "guest-results-tshark-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    std::fs::write(d.join("phs"), phs).expect("write");
    std::fs::write(d.join("mal"), mal).expect("write");
    let script = format!(
        "#!/bin/sh\ncase \" $* \" in\n*\" -z \"*) cat '{0}/phs'; echo 'Running as user \"root\"' >&2 ;;\n\
         *) cat '{0}/mal'; echo 'tshark: something broke' >&2 ;;\nesac\nexit {rc}\n",
        d.display()
    );
    let t = d.join("tshark");
    std::fs::write(&t, script).expect("write");
    std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::write(d.join("cap.pcap"), "not empty").expect("write");
    d
}

fn row_with_path(path: &str, pcap: &Path, protos: &[&str]) -> Json {
    let mut c = Command::new(env!("CARGO_BIN_EXE_guest-results"));
    c.env("PATH", path).arg("tshark").arg("--pcap").arg(pcap);
    for p in protos {
        c.args(["--proto", p]);
    }
    let out = c.output().expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn the_row_runs_tshark_twice() {
    let d = fake_tshark("ok", PHS, "", 0);
    let path = path_with(&d);
    let r = row_with_path(&path, &d.join("cap.pcap"), &["infiniband"]);
    assert_eq!(r.at("status").str(), "PASS", "{}", r.at("detail"));
    let r = row_with_path(&path, &d.join("none.pcap"), &["infiniband"]);
    assert_eq!(
        sd(&r),
        (
            "FAIL".into(),
            format!("no capture file {}", d.join("none.pcap").display())
        )
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_failing_tshark_fails_the_row_with_its_errors() {
    let d = fake_tshark("rc", PHS, "", 2);
    let r = row_with_path(&path_with(&d), &d.join("cap.pcap"), &["infiniband"]);
    // tshark's "Running as user" warning is left out
    assert_eq!(
        sd(&r),
        (
            "FAIL".into(),
            "tshark failed (rc 2/2): tshark: something broke".into()
        )
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn without_tshark_the_row_is_skipped() {
    let d = fake_tshark("none", PHS, "", 0);
    let r = row_with_path("/nonexistent", &d.join("cap.pcap"), &["infiniband"]);
    assert_eq!(r.at("status").str(), "SKIP");
    assert!(r.at("detail").str().contains("scripts/install-deps.sh"));
    let _ = std::fs::remove_dir_all(&d);
}
