//! `guest-results daemon-cpu bursts` end to end: a samples file in, one
//! line per payload out (what ci/bench-erdma.sh reads with `read -r`).

use std::process::Command;

#[test]
fn bursts_cli() {
    let d = std::env::temp_dir().join(format!("guest-results-dcpu-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    let f = d.join("daemon-cpu.log");
    // one burst of 512 MiB over 1 s with 50 ticks, then quiet
    let mut text = String::from("10.000 100 0\n10.500 100 0\n");
    text += "11.000 125 268435456\n11.500 150 536870912\n";
    for i in 0..6 {
        text += &format!("{}.000 151 536871000\n", 12 + i);
    }
    std::fs::write(&f, text).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_guest-results"))
        .args(["daemon-cpu", "bursts"])
        .arg(&f)
        .args(["536870912", "1048576"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let hz = guest_results::daemon_cpu::clock_ticks();
    let want = format!("{:.2} 536870912\n0 0\n", 50.0 / hz / 0.5);
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
    // a malformed line is an error, not a made-up number
    std::fs::write(&f, "1 2\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_guest-results"))
        .args(["daemon-cpu", "bursts"])
        .arg(&f)
        .arg("1")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&d);
}
