//! A matrix cell's rows from its guests' out.log (`guestlog::judge_guests`,
//! which replaced ci/matrix.py's parse_guest and combine).

use guest_results::guestlog::{combine, judge_guests, parse_guest, GuestOut, TestLine};

const SERVER_LOG: &str = "CI-KERNEL 7.3.4-rdma  \r
CI-TEST test=ping role=server status=PASS secs=3 reason=\"3/3\"
CI-TEST test=ib_write_bw role=server status=PASS secs=9 bw=700.5 reason=\"server side\"
CI-TEST test=rping role=server status=SKIP secs=0 reason=\"no rdma_cm\"
CI-TEST test=evidence-x role=server status=PASS secs=1 reason=\"extra\"
== CI-DIAG server: rdma statistic show link rxe0/1
    duplicate_request 4
    out_of_seq_request 2
== CI-DIAG server: ip -s link show eth0
    2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500
        RX:  bytes packets errors dropped  missed   mcast
          1000      10      0       3       0       0
        TX:  bytes packets errors dropped carrier collsns
          2000      20      1       0       0       0
== CI-DIAG server: tcp counters
    TcpRetransSegs 5
== CI-DIAG server: dmesg (rdma/siw/rxe/tcp)
    CI-TEST test=in-dmesg role=server status=FAIL secs=1 reason=\"indented: not a result\"
    rxe 7
";

const CLIENT_LOG: &str = "CI-KERNEL 7.3.4-rdma
CI-TEST test=ping role=client status=PASS secs=4 reason=\"3/3\"
CI-TEST test=ib_write_bw role=client status=FAIL secs=2 bw=812.5 reason=\"rc=1\"
CI-TEST test=rping role=client status=SKIP secs=0 reason=\"no rdma_cm\"
CI-ABORT barrier=5 label=ucmatose
";

fn tests() -> Vec<(String, Vec<String>)> {
    let both = || vec!["server".to_string(), "client".to_string()];
    vec![
        ("ping".into(), both()),
        ("ib_write_bw".into(), both()),
        ("rping".into(), both()),
        ("ucmatose".into(), both()),
        ("tshark".into(), vec!["host".into()]),
    ]
}

fn mine(lines: Vec<TestLine>, role: &str) -> Vec<TestLine> {
    lines.into_iter().filter(|x| x.role == role).collect()
}

#[test]
fn the_log_gives_results_kernel_abort_and_counters() {
    let g = parse_guest(SERVER_LOG);
    let names: Vec<_> = g.lines.iter().map(|x| x.test.as_str()).collect();
    assert_eq!(names, ["ping", "ib_write_bw", "rping", "evidence-x"]);
    assert_eq!(g.lines[1].bw, "700.5");
    assert_eq!(g.lines[1].secs, 9);
    assert_eq!(g.kernel.as_deref(), Some("7.3.4-rdma"));
    assert_eq!(g.aborted, None);
    let diag: Vec<_> = g.diag.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        diag,
        [
            ("duplicate_request", 4),
            ("out_of_seq_request", 2),
            ("eth0_rx_packets", 10),
            ("eth0_rx_errors", 0),
            ("eth0_rx_dropped", 3),
            ("eth0_rx_missed", 0),
            ("eth0_tx_packets", 20),
            ("eth0_tx_errors", 1),
            ("eth0_tx_dropped", 0),
            ("TcpRetransSegs", 5),
        ]
    );
    let c = parse_guest(CLIENT_LOG);
    assert_eq!(
        c.aborted.as_deref(),
        Some("CI-ABORT barrier=5 label=ucmatose")
    );
}

#[test]
fn rows_combine_both_roles() {
    let per_role = vec![
        (
            "server".to_string(),
            mine(parse_guest(SERVER_LOG).lines, "server"),
        ),
        (
            "client".to_string(),
            mine(parse_guest(CLIENT_LOG).lines, "client"),
        ),
    ];
    let aborted = vec![(
        "client".to_string(),
        "CI-ABORT barrier=5 label=ucmatose".to_string(),
    )];
    let rows = combine(&tests(), &per_role, &aborted);
    let got: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.test.as_str(),
                r.status.as_str(),
                r.secs,
                r.bw.as_str(),
                r.detail.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("ping", "PASS", 4, "", "server: PASS 3/3 | client: PASS 3/3"),
            // the client's bandwidth, a failure from either side fails it
            ("ib_write_bw", "FAIL", 9, "812.5", "client: FAIL rc=1"),
            (
                "rping",
                "SKIP",
                0,
                "",
                "server: SKIP no rdma_cm | client: SKIP no rdma_cm"
            ),
            (
                "ucmatose",
                "FAIL",
                0,
                "",
                "no result from server, client (client: CI-ABORT barrier=5 label=ucmatose)"
            ),
            ("tshark", "FAIL", 0, "", "host-side test did not run"),
            // a test the cell does not name, judged on the roles that reported it
            ("evidence-x", "PASS", 1, "", "server: PASS extra"),
        ]
    );
}

#[test]
fn a_guest_without_results_fails_every_test_it_owes() {
    let rows = combine(&tests()[..1], &[], &[]);
    assert_eq!(rows[0].status, "FAIL");
    assert_eq!(
        rows[0].detail,
        "no result from server, client (guest died or timed out)"
    );
}

#[test]
fn a_cells_rows_counters_and_kernels_from_its_guests_logs() {
    let dir = std::env::temp_dir().join(format!("guest-results-guests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("a.log"), SERVER_LOG).expect("write");
    let tests = vec![(
        "ping".to_string(),
        vec!["server".to_string(), "client".to_string()],
    )];
    let guests = [
        GuestOut {
            role: "server".into(),
            name: "a".into(),
            log: dir.join("a.log"),
        },
        GuestOut {
            role: "client".into(),
            name: "b".into(),
            log: dir.join("missing.log"),
        },
    ];
    let v = judge_guests(&tests, &guests);
    let text = serde_json::to_string(&v).expect("JSON");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["tests"][0]["status"], "FAIL");
    assert_eq!(
        v["tests"][0]["detail"], "no result from client (guest died or timed out)",
        "a failed row lists only what did not pass"
    );
    assert_eq!(v["counters"]["a"]["eth0_rx_dropped"], 3);
    assert!(v["counters"].get("b").is_none(), "no counters, no entry");
    assert_eq!(v["guest_kernel"]["a"], "7.3.4-rdma");
    // the rows keep results.json's key order
    assert!(text.contains(r#"{"test":"ping","status":"FAIL","secs":3,"bw":"","detail":"#));
    let _ = std::fs::remove_dir_all(&dir);
}
