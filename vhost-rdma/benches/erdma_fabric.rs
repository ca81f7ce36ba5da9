//! The erdma data path through the daemon, without a VM: a `Server` in this
//! process with two erdma functions (each paired with a virtio-net netdev
//! port, as in a guest), both driven over their vfio-user sockets by the
//! project's test driver (`vfio-user-server/tests/common/erdma.rs`: the
//! Linux driver's layouts, guest RAM a memfd the driver maps and
//! `DMA_MAP`s). Every register access and doorbell is a vfio-user message;
//! doorbells are posted writes (`VFIO_USER_F_NO_REPLY`), as QEMU sends BAR
//! writes, so the driver does not wait for the daemon to run the SQ
//! (`ERDMA_BENCH_ACKED_DOORBELLS=1`: acknowledged writes, each a round
//! trip, as `vfio_user::Client` sends them);
//! frames go function → fabric → function on the daemon's own threads;
//! completions come back as CQEs with a CEQ interrupt on an eventfd, which
//! the driver waits for as the kernel does (no busy polling: on 2 cores a
//! polling driver would take the daemon's CPU).
//!
//! RDMA WRITE and SEND at 64 B and 64 KiB, at netdev MTU 1500 (path MTU
//! 1024, the default) and 9000 (path MTU 4096), 64 messages in flight.
//! Reported per case: GB/s of payload, the daemon's CPU ns per payload
//! byte (the process's CPU time less this driver thread's), and `memcpy`
//! of the same size in the same run. The last message's bytes are checked
//! at the receiver.
//!
//! `cargo bench -p vhost-rdma --bench erdma_fabric` (`ERDMA_BENCH_MIB=N`:
//! payload per 64 KiB case, default 256; 1/64 of it at 64 B;
//! `ERDMA_BENCH_ONLY=WRITE-65536-9000`: one case). One `erdma-fabric-bench`
//! line per case.

#[path = "../../vfio-user-server/tests/common/mod.rs"]
mod common;
#[path = "../../erdma-device/benches/common/shared.rs"]
mod shared;

use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

use common::erdma::*;
use vhost_rdma::config::PortKind;
use vhost_rdma::{DaemonConfig, PortConfig, Server};

/// Messages in flight (SQ of 256 WQEBBs, 2 per WRITE SQE).
const BATCH: usize = 64;
/// The MR's virtual address; the buffer is two 64 KiB halves (source,
/// sink) at this VA on both sides.
const VA: u64 = 0x7000_0000;
const BUF: u64 = 128 << 10;
const STAG: u32 = 0x100;
const QPN_A: u32 = 2;
const QPN_B: u32 = 3;

/// CPU ns of this thread, and of the whole process.
fn cpu_ns() -> (u64, u64) {
    let t = |who| {
        // SAFETY: getrusage writes into the struct we pass.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer to a rusage.
        unsafe { libc::getrusage(who, &mut ru) };
        let us = |tv: libc::timeval| tv.tv_sec as u64 * 1_000_000 + tv.tv_usec as u64;
        (us(ru.ru_utime) + us(ru.ru_stime)) * 1000
    };
    (t(libc::RUSAGE_THREAD), t(libc::RUSAGE_SELF))
}

/// One side: the driver, its QP and the guest-physical address of its
/// buffer.
struct Side {
    d: Driver,
    qp: Qp,
    buf: u64,
}

/// Probes the function on `sock`, sets its GID and MTU, registers the
/// buffer (level-1 MTT) and brings QP `qpn` to RTS towards `peer`.
fn side(sock: &Path, ip: [u8; 4], mtu: u32, qpn: u32, peer: (Av, u32)) -> Side {
    let mut d = Driver::connect(vfio_user::Client::new(sock).expect("vfio-user connect"));
    d.probe();
    assert_eq!(d.conf_mtu(mtu), 0, "CONF_MTU");
    assert_eq!(d.set_gid(0, ip), 0, "SET_GID");
    assert_eq!(d.create_cq(1, 1024, 1), 0, "CREATE_CQ");
    let qp = d.create_qp(qpn, 1, 256, 256);
    let buf = d.alloc(BUF, 4096);
    let pages: Vec<u64> = (0..BUF / 4096).map(|i| buf + i * 4096).collect();
    let table = d.alloc(8 * pages.len() as u64, 4096);
    let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
    d.write(table, &bytes);
    assert_eq!(
        d.reg_mr(STAG, VA, BUF as u32, &pages, Some(table)),
        0,
        "REG_MR"
    );
    d.qp_to_rts(qpn, &peer.0, peer.1);
    if std::env::var_os("ERDMA_BENCH_ACKED_DOORBELLS").is_none() {
        d.post_doorbells(sock);
    }
    d.arm_cq(1);
    Side { d, qp, buf }
}

/// Waits for `n` CQEs on CQ 1 as the kernel does: drain, re-arm, drain
/// again (a CQE between the two is not lost), then sleep on the CEQ's
/// interrupt. Panics on an error CQE or after 10 s without progress.
fn wait_cqes(s: &mut Side, n: usize) {
    let mut got = 0;
    loop {
        while let Some(wc) = s.d.poll_cq(1) {
            assert_eq!(wc.syndrome, 0, "CQE status: {wc:?}");
            got += 1;
        }
        if got >= n {
            return;
        }
        s.d.ceq_events(1);
        s.d.arm_cq(1);
        if let Some(wc) = s.d.poll_cq(1) {
            assert_eq!(wc.syndrome, 0, "CQE status: {wc:?}");
            got += 1;
            continue;
        }
        let mut pfd = libc::pollfd {
            fd: s.d.vectors[1].as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        assert!(r > 0, "no completion in 10 s ({got} of {n})");
        s.d.irqs(1);
    }
}

/// `02:00:00:00:00:0a` as bytes (the daemon's stats print MACs so).
fn parse_mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).expect("MAC byte"))
        .collect();
    v.try_into().expect("six MAC bytes")
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Write,
    Send,
}

/// Runs `count` messages of `size` bytes from A to B; returns (seconds,
/// daemon CPU ns).
fn run(a: &mut Side, b: &mut Side, op: Op, size: u32, count: usize) -> (f64, u64) {
    let t0 = Instant::now();
    let (me0, all0) = cpu_ns();
    let mut done = 0;
    while done < count {
        let n = BATCH.min(count - done);
        if op == Op::Send {
            for _ in 0..n {
                b.d.post_recv(&mut b.qp, VA + 65536, size, STAG);
            }
        }
        for _ in 0..n {
            let sqe = match op {
                Op::Write => write_sqe(size, VA, STAG, VA + 65536, STAG),
                Op::Send => send_sqe(size, VA, STAG),
            };
            a.d.post_send(&mut a.qp, sqe);
        }
        wait_cqes(a, n);
        if op == Op::Send {
            wait_cqes(b, n);
        }
        done += n;
    }
    let (me1, all1) = cpu_ns();
    ((t0.elapsed().as_secs_f64()), (all1 - all0) - (me1 - me0))
}

fn main() {
    let only = std::env::var("ERDMA_BENCH_ONLY").unwrap_or_default();
    let dir = tempfile::tempdir().expect("temp dir");
    let port = |name: &str, kind: PortKind, netdev: Option<&str>| {
        let sock = dir.path().join(format!("{name}.sock"));
        match (kind, netdev) {
            (PortKind::Erdma, Some(nd)) => PortConfig::erdma(name, sock, nd),
            (PortKind::VirtioNet, None) => PortConfig::new(name, sock),
            other => unreachable!("{other:?}"),
        }
    };
    let server = Server::start(DaemonConfig {
        ports: vec![
            port("na", PortKind::default(), None),
            port("ra", PortKind::Erdma, Some("na")),
            port("nb", PortKind::default(), None),
            port("rb", PortKind::Erdma, Some("nb")),
        ],
        ..DaemonConfig::default()
    })
    .expect("daemon");
    println!(
        "{:<6} {:>7} {:>5} {:>9} {:>9} {:>15} {:>12} {:>10}",
        "op", "size", "mtu", "messages", "GB/s", "daemon CPU ns/B", "memcpy GB/s", "vs memcpy"
    );
    for mtu in [1500u32, 9000] {
        let stats = server.stats();
        let (mac_a, mac_b) = (parse_mac(&stats[1].mac), parse_mac(&stats[3].mac));
        let mut a = side(
            &dir.path().join("ra.sock"),
            IP_A,
            mtu,
            QPN_A,
            (Av::to(mac_b, IP_B), QPN_B),
        );
        let mut b = side(
            &dir.path().join("rb.sock"),
            IP_B,
            mtu,
            QPN_B,
            (Av::to(mac_a, IP_A), QPN_A),
        );
        let pattern: Vec<u8> = (0..65536u32).map(|i| (i * 7 + 3) as u8).collect();
        a.d.write(a.buf, &pattern);
        for (op, name) in [(Op::Write, "WRITE"), (Op::Send, "SEND")] {
            for size in [64u32, 65536] {
                if !only.is_empty() && only != format!("{name}-{size}-{mtu}") {
                    continue;
                }
                let count = shared::messages(size, BATCH);
                run(&mut a, &mut b, op, size, BATCH); // warm-up
                b.d.write(b.buf + 65536, &vec![0; size as usize]);
                let (secs, cpu) = run(&mut a, &mut b, op, size, count);
                let landed = b.d.read(b.buf + 65536, size as usize);
                assert_eq!(landed, pattern[..size as usize], "payload at the receiver");
                let (gbs, ns_per_byte, mgbs) = shared::rates(count, size, secs, cpu);
                println!(
                    "{:<6} {:>7} {:>5} {:>9} {:>9.3} {:>15.3} {:>12.2} {:>9.1}%",
                    name,
                    size,
                    mtu,
                    count,
                    gbs,
                    ns_per_byte,
                    mgbs,
                    100.0 * gbs / mgbs
                );
                println!(
                    "erdma-fabric-bench op={name} size={size} mtu={mtu} messages={count} gbps={gbs:.4} daemon_cpu_ns_per_byte={ns_per_byte:.4} memcpy_gbps={mgbs:.3}"
                );
            }
        }
        // The next MTU starts from fresh functions: the drivers let go
        // (the daemon resets a device whose client leaves).
        drop(a);
        drop(b);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    server.shutdown().expect("daemon shutdown");
}
