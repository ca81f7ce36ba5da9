//! Two endpoints over real loopback TCP (tokio).

use std::time::Duration;

use siw::tcp::TcpEndpoint;
use siw::{
    Access, Completion, Config, ConnError, Event, MpaConfig, Sge, WcOpcode, WcStatus, WorkRequest,
};
use tokio::net::TcpListener;
use tokio::time::timeout;

fn cfg(crc: bool) -> Config {
    Config {
        mpa: MpaConfig {
            crc_required: crc,
            ..MpaConfig::default()
        },
        max_fpdu_len: 9000,
        ..Config::default()
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Connects an initiator and a responder over 127.0.0.1.
async fn pair(ca: Config, cb: Config) -> (TcpEndpoint, TcpEndpoint) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut b = TcpEndpoint::accept(s, cb).unwrap();
        match b.next_event().await {
            Some(Event::ConnectRequest { private_data, .. }) => {
                assert_eq!(private_data, b"client");
                b.conn_mut().accept(b"server").unwrap();
            }
            e => panic!("unexpected {e:?}"),
        }
        assert!(matches!(
            b.next_event().await,
            Some(Event::Connected { .. })
        ));
        b
    });
    let mut a = TcpEndpoint::connect(addr, ca, b"client").await.unwrap();
    match a.next_event().await {
        Some(Event::Connected { private_data, .. }) => assert_eq!(private_data, b"server"),
        e => panic!("unexpected {e:?}"),
    }
    (a, server.await.unwrap())
}

async fn next_completion(ep: &mut TcpEndpoint) -> Completion {
    match ep.next_event().await {
        Some(Event::Completion(c)) => c,
        Some(e) => panic!("unexpected event {e:?}"),
        None => panic!("connection ended"),
    }
}

async fn exchange(crc: bool) {
    let (mut a, mut b) = pair(cfg(crc), cfg(crc)).await;
    assert_eq!(a.conn().negotiated().unwrap().crc, crc);
    const N: usize = 4 << 20;
    let b_sink = b.conn_mut().register_mr(vec![0; N], Access::REMOTE_WRITE);
    let b_src = b.conn_mut().register_mr(pattern(N, 5), Access::REMOTE_READ);
    let b_recv = b
        .conn_mut()
        .register_mr(vec![0; 2 * 4096], Access::LOCAL_WRITE);
    for i in 0..2u64 {
        let sge = Sge {
            stag: b_recv,
            addr: i * 4096,
            len: 4096,
        };
        b.conn_mut().post_recv(i, sge).unwrap();
    }
    let a_src = a.conn_mut().register_mr(pattern(N, 9), Access::NONE);
    let a_sink = a.conn_mut().register_mr(vec![0; N], Access::LOCAL_WRITE);

    // b: serve until the second Send ("bye") arrives, then hand b back.
    let server = tokio::spawn(async move {
        let c0 = next_completion(&mut b).await;
        let c1 = next_completion(&mut b).await;
        (b, c0, c1)
    });

    let full = |stag| Sge {
        stag,
        addr: 0,
        len: N as u32,
    };
    let c = a.conn_mut();
    c.post_send(
        1,
        WorkRequest::Write {
            local: full(a_src),
            remote_stag: b_sink,
            remote_addr: 0,
        },
    )
    .unwrap();
    c.post_send(
        2,
        WorkRequest::Read {
            local: full(a_sink),
            remote_stag: b_src,
            remote_addr: 0,
        },
    )
    .unwrap();
    c.post_send(
        3,
        WorkRequest::Send {
            local: Sge {
                stag: a_src,
                addr: 100,
                len: 3000,
            },
            solicited: false,
            invalidate: None,
        },
    )
    .unwrap();
    for (id, op) in [
        (1, WcOpcode::Write),
        (2, WcOpcode::Read),
        (3, WcOpcode::Send),
    ] {
        let c = next_completion(&mut a).await;
        assert_eq!((c.wr_id, c.opcode, c.status), (id, op, WcStatus::Success));
    }
    assert_eq!(a.conn().mem().data(a_sink).unwrap(), &pattern(N, 5)[..]);
    let bye = Sge {
        stag: a_src,
        addr: 0,
        len: 3,
    };
    a.conn_mut()
        .post_send(
            4,
            WorkRequest::Send {
                local: bye,
                solicited: true,
                invalidate: None,
            },
        )
        .unwrap();
    assert_eq!(next_completion(&mut a).await.wr_id, 4);
    let (b, c0, c1) = server.await.unwrap();
    assert_eq!(
        (c0.wr_id, c0.byte_len, c0.status),
        (0, 3000, WcStatus::Success)
    );
    assert_eq!((c1.wr_id, c1.byte_len, c1.solicited), (1, 3, true));
    let m = b.conn().mem();
    assert_eq!(m.data(b_sink).unwrap(), &pattern(N, 9)[..]);
    assert_eq!(&m.data(b_recv).unwrap()[..3000], &pattern(N, 9)[100..3100]);
    assert_eq!(&m.data(b_recv).unwrap()[4096..4099], &pattern(N, 9)[..3]);
}

#[tokio::test]
async fn loopback_write_read_send_crc_off() {
    timeout(Duration::from_secs(30), exchange(false))
        .await
        .unwrap();
}

#[tokio::test]
async fn loopback_write_read_send_crc_on() {
    timeout(Duration::from_secs(30), exchange(true))
        .await
        .unwrap();
}

#[tokio::test]
async fn loopback_reject() {
    timeout(Duration::from_secs(10), async {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let mut b = TcpEndpoint::accept(s, Config::default()).unwrap();
            assert!(matches!(
                b.next_event().await,
                Some(Event::ConnectRequest { .. })
            ));
            b.conn_mut().reject(b"busy").unwrap();
            assert_eq!(b.next_event().await, Some(Event::Closed));
            assert_eq!(b.next_event().await, None);
        });
        let mut a = TcpEndpoint::connect(addr, Config::default(), b"x")
            .await
            .unwrap();
        assert_eq!(
            a.next_event().await,
            Some(Event::Rejected {
                private_data: b"busy".to_vec()
            })
        );
        server.await.unwrap();
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn peer_dies_mid_transfer() {
    timeout(Duration::from_secs(20), async {
        let (mut a, mut b) = pair(cfg(true), cfg(true)).await;
        const N: usize = 8 << 20;
        let src = b.conn_mut().register_mr(pattern(N, 1), Access::REMOTE_READ);
        let sink = a.conn_mut().register_mr(vec![0; N], Access::LOCAL_WRITE);
        // b serves for a moment, then its socket is dropped.
        let server = tokio::spawn(async move {
            let _ = timeout(Duration::from_millis(100), async {
                while b.next_event().await.is_some() {}
            })
            .await;
            drop(b);
        });
        let read = WorkRequest::Read {
            local: Sge {
                stag: sink,
                addr: 0,
                len: N as u32,
            },
            remote_stag: src,
            remote_addr: 0,
        };
        let mut next_id = 0u64;
        for _ in 0..4 {
            a.conn_mut().post_send(next_id, read).unwrap();
            next_id += 1;
        }
        let mut error = None;
        let mut flushed = 0;
        while let Some(ev) = a.next_event().await {
            match ev {
                Event::Completion(c) if c.status == WcStatus::Success => {
                    // Keep the pipe full.
                    let _ = a.conn_mut().post_send(next_id, read);
                    next_id += 1;
                }
                Event::Completion(c) => {
                    assert_eq!(c.status, WcStatus::Flushed);
                    flushed += 1;
                }
                Event::Error(e) => error = Some(e),
                Event::Closed => {}
                e => panic!("unexpected {e:?}"),
            }
        }
        server.await.unwrap();
        assert!(matches!(error, Some(ConnError::StreamLost(_))), "{error:?}");
        assert!(flushed > 0);
        assert!(a.conn().is_finished());
        // Posting now fails cleanly.
        assert!(a.conn_mut().post_send(99, read).is_err());
    })
    .await
    .unwrap();
}
