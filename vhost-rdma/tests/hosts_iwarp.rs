//! No-VM test of iWARP services in the daemon: two virtual hosts on the
//! fabric run rping and ucmatose against each other, one started with
//! `--host`, the other through the control socket (with MPA CRC asked for).

mod common;

use common::{serve_hosts, virtual_hosts, TempDir};
use std::time::{Duration, Instant};
use vhost_rdma::config::HostSpec;
use vhost_rdma::control::{request, Request};
use vhost_rdma::ports::host::ServiceRequest;

/// Polls the control socket until `kind` on host `name` has finished a
/// session or failed one.
fn wait_session(
    ctl: &std::path::Path,
    name: &str,
    kind: &str,
) -> vhost_rdma::ports::host::ServiceStats {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let hs = virtual_hosts(ctl);
        let h = hs.iter().find(|h| h.name == name).expect("host");
        let s = h.services.iter().find(|s| s.kind == kind).expect("service");
        if s.sessions_ok + s.sessions_failed > 0 || Instant::now() > end {
            return s.clone();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn two_virtual_hosts_run_rping_and_ucmatose_over_iwarp() {
    let dir = TempDir::new("hosts-iwarp");
    let server: HostSpec = "srv=10.77.0.10/24,service=rping-server,service=ucmatose-server"
        .parse()
        .unwrap();
    let client: HostSpec = "cli=10.77.0.11/24".parse().unwrap();
    let (_daemon, _, ctl) = serve_hosts(dir.path(), vec![server, client]);
    // rping's count is the client's alone; ucmatose's must match on both
    // sides (the server's is the default, 10).
    for (kind, n) in [("rping-client", 5), ("ucmatose-client", 10)] {
        let r = request(
            &ctl,
            &Request::HostStart {
                host: "cli".into(),
                service: ServiceRequest {
                    kind: kind.into(),
                    peer: Some("10.77.0.10".parse().unwrap()),
                    iters: Some(n),
                    mpa_crc: Some(kind == "rping-client"),
                    ..ServiceRequest::default()
                },
            },
        )
        .unwrap();
        assert!(r.ok, "{r:?}");
        let s = wait_session(&ctl, "cli", kind);
        assert_eq!(
            (s.sessions_ok, s.last_iterations, s.last_verified),
            (1, n, n),
            "{s:?}"
        );
    }
    let hs = virtual_hosts(&ctl);
    let srv = hs.iter().find(|h| h.name == "srv").unwrap();
    // Both server sessions finished with every ping / message checked.
    for (kind, n) in [("rping-server", 5), ("ucmatose-server", 10)] {
        let s = wait_session(&ctl, "srv", kind);
        assert_eq!((s.sessions_ok, s.last_verified), (1, n), "{s:?}");
    }
    // Only the rping connection asked for CRC.
    assert_eq!(
        (srv.iwarp.connected, srv.iwarp.connected_crc),
        (2, 1),
        "{srv:?}"
    );
    assert_eq!(srv.iwarp.mpa_errors + srv.iwarp.crc_errors, 0);
}

#[test]
fn perftest_rdma_cm_between_two_virtual_hosts() {
    let dir = TempDir::new("hosts-iwarp-perftest");
    let mut server: HostSpec = "srv=10.77.0.10/24".parse().unwrap();
    let mut spec = virtual_host::ServiceSpec::new(virtual_host::ServiceKind::ReadBwServer);
    spec.rdma_cm = true;
    spec.size = 16384;
    spec.iters = 40;
    server.services.push(spec);
    let client: HostSpec = "cli=10.77.0.11/24".parse().unwrap();
    let (_daemon, _, ctl) = serve_hosts(dir.path(), vec![server, client]);
    // The client through the control socket, as `ctl host cli start
    // read-bw-client --rdma-cm --mpa-crc ...` sends it.
    let r = request(
        &ctl,
        &Request::HostStart {
            host: "cli".into(),
            service: ServiceRequest {
                kind: "read-bw-client".into(),
                peer: Some("10.77.0.10".parse().unwrap()),
                size: Some(16384),
                iters: Some(40),
                mpa_crc: Some(true),
                rdma_cm: Some(true),
                ..ServiceRequest::default()
            },
        },
    )
    .unwrap();
    assert!(r.ok, "{r:?}");
    let c = wait_session(&ctl, "cli", "read-bw-client");
    assert_eq!((c.sessions_ok, c.last_iterations), (1, 40), "{c:?}");
    let s = wait_session(&ctl, "srv", "read-bw-server");
    assert_eq!((s.sessions_ok, s.last_iterations), (1, 40), "{s:?}");
    let hs = virtual_hosts(&ctl);
    let srv = hs.iter().find(|h| h.name == "srv").unwrap();
    // Control and data connection, both with CRC (the client asked).
    assert_eq!(
        (srv.iwarp.connected, srv.iwarp.connected_crc),
        (2, 2),
        "{srv:?}"
    );
}
