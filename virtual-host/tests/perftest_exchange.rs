//! The perftest servers' TCP exchange, driven by a scripted client on a
//! plain smoltcp interface (the RDMA phase is covered by the guest test,
//! the guest matrix's `vhost-rxe` cell).

mod common;

use common::{limited_host, Node, TcpClient, IP_A, MAC_A};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};
use virtual_host::perftest::{Keys, KEY_MSG_LEN};
use virtual_host::pingpong::gid_of;
use virtual_host::{EventKind, HostLimits, ServiceKind, ServiceSpec, VirtualHost};

const IP_C: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);

/// The perftest client: a smoltcp TCP socket at `IP_C`.
type Client = TcpClient;

/// Moves frames until both sides are quiet.
fn pump(a: &mut VirtualHost, c: &mut Client, now: &mut Instant) {
    for _ in 0..200 {
        *now += Duration::from_millis(1);
        c.poll(*now);
        a.tick(*now);
        let mut moved = false;
        while let Some(f) = c.dev.tx.pop_front() {
            a.rx(&f, *now);
            moved = true;
        }
        for f in a.tx() {
            c.dev.rx.push_back(f);
            moved = true;
        }
        if !moved {
            return;
        }
    }
}

/// The client side of one exchange item: writes `mine`, reads as many bytes back.
fn item(a: &mut VirtualHost, c: &mut Client, now: &mut Instant, mine: &[u8]) -> Vec<u8> {
    assert_eq!(c.sock().send_slice(mine), Ok(mine.len()));
    let mut got = Vec::new();
    for _ in 0..50 {
        pump(a, c, now);
        let mut buf = vec![0u8; mine.len() - got.len()];
        if let Ok(n) = c.sock().recv_slice(&mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        if got.len() == mine.len() {
            return got;
        }
    }
    panic!("no {}-byte answer (have {})", mine.len(), got.len());
}

/// Host A (seeded with `seed`) serving `kind` on `port`, and a client
/// connected to it from `client_port`.
fn serve_and_connect(
    kind: ServiceKind,
    port: u16,
    seed: u64,
    client_port: u16,
    now: &mut Instant,
) -> (VirtualHost, Client) {
    let mut a = limited_host("a", MAC_A, IP_A, HostLimits::default(), seed, *now);
    let mut spec = ServiceSpec::new(kind);
    spec.port = port;
    a.start_service(spec, *now).unwrap();
    let mut c = Client::new(*now, IP_C);
    c.connect(port, client_port);
    pump(&mut a, &mut c, now);
    (a, c)
}

fn exchange(kind: ServiceKind, port: u16, items_after_keys: &[usize]) {
    let mut now = Instant::now();
    let (mut a, mut c) = serve_and_connect(kind, port, 7, 40000, &mut now);
    assert!(c.sock().may_send(), "connected");

    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"6.24");
    let r = item(&mut a, &mut c, &mut now, &v);
    assert_eq!(&r[..5], b"6.24\0");
    assert_eq!(
        item(&mut a, &mut c, &mut now, &4096u32.to_be_bytes()),
        4096u32.to_be_bytes()
    );
    assert_eq!(
        item(&mut a, &mut c, &mut now, &64u32.to_be_bytes()),
        64u32.to_be_bytes()
    );
    assert_eq!(
        item(&mut a, &mut c, &mut now, b"5\0"),
        b"3\0",
        "we offer MTU 1024"
    );
    let mine = Keys {
        lid: 0,
        out_reads: 16,
        qpn: 0x22,
        psn: 0x1234,
        rkey: 0x99,
        vaddr: 0x7f00_0000_0000,
        gid: gid_of(IP_C),
        srqn: 0,
    };
    let theirs = Keys::decode(&item(&mut a, &mut c, &mut now, &mine.encode())).unwrap();
    assert_eq!(theirs.gid, gid_of(IP_A));
    assert_ne!(theirs.qpn, 0);
    assert_ne!(theirs.rkey, 0);
    assert_eq!(a.status().qps, 1, "QP created on the first keys");
    for &len in items_after_keys {
        let msg = if len == KEY_MSG_LEN {
            mine.encode().to_vec()
        } else {
            vec![0u8; len]
        };
        let r = item(&mut a, &mut c, &mut now, &msg);
        if len == KEY_MSG_LEN {
            assert_eq!(Keys::decode(&r).unwrap(), theirs, "same keys every time");
        }
    }
    pump(&mut a, &mut c, &mut now);
    let ev: Vec<_> = std::iter::from_fn(|| a.poll_event()).collect();
    assert!(
        ev.iter()
            .any(|e| matches!(e.kind, EventKind::SessionFinished { iterations: 0, .. })),
        "{ev:?}"
    );
    let st = a.status();
    assert_eq!((st.qps, st.mrs), (0, 0), "resources released");
    assert_eq!(st.services[0].sessions_ok, 1);
}

#[test]
fn write_bw_server_speaks_perftest_6_24() {
    let k = KEY_MSG_LEN;
    exchange(
        ServiceKind::WriteBwServer,
        18517,
        &[k, k, k, 8, 8, 8, 8, 8, k],
    );
}

#[test]
fn send_bw_server_speaks_perftest_6_24() {
    let k = KEY_MSG_LEN;
    exchange(ServiceKind::SendBwServer, 18518, &[k, k, k, k]);
}

#[test]
fn read_and_atomic_bw_servers_follow_the_write_exchange() {
    let k = KEY_MSG_LEN;
    exchange(
        ServiceKind::ReadBwServer,
        18519,
        &[k, k, k, 8, 8, 8, 8, 8, k],
    );
    exchange(
        ServiceKind::AtomicBwServer,
        18520,
        &[k, k, k, 8, 8, 8, 8, 8, k],
    );
}

#[test]
fn garbage_keys_fail_the_session_and_the_server_listens_again() {
    let mut now = Instant::now();
    let (mut a, mut c) = serve_and_connect(ServiceKind::WriteBwServer, 18517, 9, 40001, &mut now);
    item(
        &mut a,
        &mut c,
        &mut now,
        &[b'6', b'.', b'2', b'4', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    item(&mut a, &mut c, &mut now, &[0, 0, 16, 0]);
    item(&mut a, &mut c, &mut now, &[0, 0, 0, 64]);
    item(&mut a, &mut c, &mut now, b"3\0");
    assert_eq!(c.sock().send_slice(&[b'z'; KEY_MSG_LEN]), Ok(KEY_MSG_LEN));
    for _ in 0..10 {
        pump(&mut a, &mut c, &mut now);
    }
    assert!(!c.sock().is_open(), "the server reset the connection");
    let st = a.status();
    assert_eq!(st.services[0].sessions_failed, 1);
    assert!(st.services[0]
        .last_error
        .as_deref()
        .unwrap_or("")
        .contains("keys"));
    assert_eq!(st.services[0].state, "listening");
    assert_eq!((st.qps, st.mrs), (0, 0));
}
