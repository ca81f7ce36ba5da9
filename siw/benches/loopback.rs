//! Loopback bandwidth: plain TCP vs. siw endpoints (RDMA WRITE and READ),
//! CRC off and on, siw-sized (1460) and jumbo (65535) FPDUs.
//!
//! `cargo bench -p siw --features tokio --bench loopback` (set
//! `SIW_BENCH_MIB` to change the volume per row, default 512).

use std::time::{Duration, Instant};

use siw::tcp::TcpEndpoint;
use siw::{Access, Config, Event, MpaConfig, Sge, WcStatus, WorkRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CHUNK: usize = 1 << 20;
const WINDOW: usize = 16;

fn total_bytes() -> usize {
    std::env::var("SIW_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(512)
        << 20
}

async fn plain_tcp(total: usize) -> Duration {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let rx = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 256 * 1024];
        let mut n = 0;
        while n < total {
            let r = s.read(&mut buf).await.unwrap();
            assert!(r > 0);
            n += r;
        }
        s.write_all(b"k").await.unwrap();
    });
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let buf = vec![0x5au8; 256 * 1024];
    let t = Instant::now();
    let mut n = 0;
    while n < total {
        s.write_all(&buf).await.unwrap();
        n += buf.len();
    }
    let mut k = [0u8; 1];
    s.read_exact(&mut k).await.unwrap();
    let d = t.elapsed();
    rx.await.unwrap();
    d
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Write,
    Read,
}

async fn siw_run(op: Op, crc: bool, fpdu: usize, total: usize) -> Duration {
    let cfg = Config {
        mpa: MpaConfig {
            crc_required: crc,
            ..MpaConfig::default()
        },
        max_fpdu_len: fpdu,
        ..Config::default()
    };
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let cfg_b = cfg.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut b = TcpEndpoint::accept(s, cfg_b).unwrap();
        let region = b.conn_mut().register_mr(
            vec![0x33; WINDOW * CHUNK],
            Access::REMOTE_WRITE | Access::REMOTE_READ,
        );
        let mut tx = Some(tx);
        while let Some(ev) = b.next_event().await {
            if let Event::ConnectRequest { .. } = ev {
                b.conn_mut().accept(&region.to_be_bytes()).unwrap();
            }
            if let Event::Connected { .. } = ev {
                let _ = tx.take().map(|t| t.send(()));
            }
        }
    });
    let mut a = TcpEndpoint::connect(addr, cfg, b"bench").await.unwrap();
    let remote = match a.next_event().await {
        Some(Event::Connected { private_data, .. }) => {
            u32::from_be_bytes(private_data[..4].try_into().unwrap())
        }
        e => panic!("{e:?}"),
    };
    rx.await.unwrap();
    let local = a
        .conn_mut()
        .register_mr(vec![0x44; WINDOW * CHUNK], Access::LOCAL_WRITE);
    let wr = |i: usize| {
        let slot = (i % WINDOW) as u64 * CHUNK as u64;
        let local = Sge {
            stag: local,
            addr: slot,
            len: CHUNK as u32,
        };
        match op {
            Op::Write => WorkRequest::Write {
                local,
                remote_stag: remote,
                remote_addr: slot,
            },
            Op::Read => WorkRequest::Read {
                local,
                remote_stag: remote,
                remote_addr: slot,
            },
        }
    };
    let n = total / CHUNK;
    let t = Instant::now();
    let mut posted = 0;
    while posted < WINDOW.min(n) {
        a.conn_mut().post_send(posted as u64, wr(posted)).unwrap();
        posted += 1;
    }
    let mut done = 0;
    while done < n {
        match a.next_event().await {
            Some(Event::Completion(c)) => {
                assert_eq!(c.status, WcStatus::Success);
                done += 1;
                if posted < n {
                    a.conn_mut().post_send(posted as u64, wr(posted)).unwrap();
                    posted += 1;
                }
            }
            e => panic!("{e:?}"),
        }
    }
    // Writes complete once handed to TCP: a final 1-byte READ round trip
    // proves the peer has placed everything.
    let fence = Sge {
        stag: local,
        addr: 0,
        len: 1,
    };
    a.conn_mut()
        .post_send(
            u64::MAX,
            WorkRequest::Read {
                local: fence,
                remote_stag: remote,
                remote_addr: 0,
            },
        )
        .unwrap();
    match a.next_event().await {
        Some(Event::Completion(c)) => assert_eq!(c.wr_id, u64::MAX),
        e => panic!("{e:?}"),
    }
    let d = t.elapsed();
    a.conn_mut().close();
    while a.next_event().await.is_some() {}
    drop(a);
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    d
}

fn gbps(bytes: usize, d: Duration) -> f64 {
    bytes as f64 * 8.0 / d.as_secs_f64() / 1e9
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let total = total_bytes();
    println!(
        "siw loopback bandwidth, {} MiB per row, {} MiB messages, window {}",
        total >> 20,
        CHUNK >> 20,
        WINDOW
    );
    println!(
        "{:<14} {:>6} {:>5} {:>10} {:>10} {:>8}",
        "transport", "fpdu", "crc", "Gbit/s", "MiB/s", "vs tcp"
    );
    rt.block_on(async {
        // Warm-up.
        plain_tcp(total / 8).await;
        let d = plain_tcp(total).await;
        let base = gbps(total, d);
        println!(
            "{:<14} {:>6} {:>5} {:>10.2} {:>10.0} {:>7.0}%",
            "tcp",
            "-",
            "-",
            base,
            total as f64 / d.as_secs_f64() / 1048576.0,
            100.0
        );
        for (op, name) in [(Op::Write, "siw WRITE"), (Op::Read, "siw READ")] {
            for fpdu in [1460usize, 65535] {
                for crc in [false, true] {
                    let d = siw_run(op, crc, fpdu, total).await;
                    let g = gbps(total, d);
                    println!(
                        "{:<14} {:>6} {:>5} {:>10.2} {:>10.0} {:>7.0}%",
                        name,
                        fpdu,
                        if crc { "on" } else { "off" },
                        g,
                        total as f64 / d.as_secs_f64() / 1048576.0,
                        g / base * 100.0
                    );
                }
            }
        }
    });
}
