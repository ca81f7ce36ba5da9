//! `vhost-rdma check-capture` on captures written with the daemon's own
//! pcapng writer (`wire::capture::pcapng`), frames from `wire`'s builder and MPA /
//! DDP bytes from `siw`'s codec: a clean capture passes; a bad MPA CRC and a
//! retransmission that changed its bytes are findings (exit 1); an
//! unreadable file is exit 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use siw::ddp::{Header, Opcode};
use siw::mpa::{write_fpdu, FrameKind, MpaFrame};
use wire::capture::pcapng;

type Ep = ([u8; 4], u16);

/// One direction of a TCP connection: segments with running sequence numbers.
struct Dir {
    src: Ep,
    dst: Ep,
    seq: u32,
}

impl Dir {
    fn frame(&self, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut b = wire::builder::FrameBuilder::tcp(
            self.src.0.into(),
            self.src.1,
            self.dst.0.into(),
            self.dst.1,
        );
        b.src_mac = [2, 0, 0, 0, 0, self.src.0[3]];
        b.dst_mac = [2, 0, 0, 0, 0, self.dst.0[3]];
        let mut f = b.build(payload);
        // Ethernet (14) + IPv4 (20) + ports (4): the sequence number.
        f[38..42].copy_from_slice(&seq.to_be_bytes());
        f
    }
    /// The next segment, and its sequence number.
    fn seg(&mut self, payload: &[u8]) -> (u32, Vec<u8>) {
        let s = self.seq;
        self.seq = self.seq.wrapping_add(payload.len() as u32);
        (s, self.frame(s, payload))
    }
}

fn mpa(kind: FrameKind, crc: bool) -> Vec<u8> {
    let mut f = MpaFrame::new(kind, 1);
    f.crc = crc;
    f.to_bytes().unwrap()
}

fn send(msn: u32, body: &[u8], crc: bool) -> Vec<u8> {
    let mut hdr = Vec::new();
    Header::untagged(Opcode::Send, true, 0, 0, msn, 0).encode(&mut hdr);
    let mut out = Vec::new();
    write_fpdu(&mut out, &hdr, body, crc);
    out
}

/// A pcapng with ports p0 (the initiators') and p1 (the responders'):
/// each frame is recorded at its sender's port and at its receiver's, as
/// the daemon records the fabric.
struct Cap {
    bytes: Vec<u8>,
    ts: u64,
}

impl Cap {
    fn new() -> Self {
        let mut bytes = pcapng::shb("check-capture test");
        bytes.extend(pcapng::idb("p0", 65535));
        bytes.extend(pcapng::idb("p1", 65535));
        Cap {
            bytes,
            ts: 1_000_000_000,
        }
    }
    fn on(&mut self, iface: u32, f: &[u8]) {
        self.ts += 1000;
        self.bytes
            .extend(pcapng::epb(iface, self.ts, f, f.len() as u32, 0));
    }
    /// `f` from port `from` to the other one, both sightings equal.
    fn cross(&mut self, from: u32, f: &[u8]) {
        self.on(from, f);
        self.on(1 - from, f);
    }
    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, &self.bytes).unwrap();
        p
    }
}

/// An iWARP connection from initiator port `ip` to responder port `rp`
/// (MPA Request/Reply, `crc` asked for by the initiator).
fn connect(cap: &mut Cap, ip: u16, rp: u16, crc: bool) -> (Dir, Dir) {
    let mut i = Dir {
        src: ([10, 0, 0, 1], ip),
        dst: ([10, 0, 0, 2], rp),
        seq: 1000,
    };
    let mut r = Dir {
        src: ([10, 0, 0, 2], rp),
        dst: ([10, 0, 0, 1], ip),
        seq: 9000,
    };
    cap.cross(0, &i.seg(&mpa(FrameKind::Request, crc)).1);
    cap.cross(1, &r.seg(&mpa(FrameKind::Reply, false)).1);
    (i, r)
}

/// Two connections, both with CRC: A (40000 -> 7174) clean, with a
/// retransmission that repeats its bytes; B (40001 -> 7175) as `bad` says.
fn capture(bad: bool) -> Cap {
    let mut cap = Cap::new();
    let (mut ai, mut ar) = connect(&mut cap, 40000, 7174, true);
    let (mut bi, mut br) = connect(&mut cap, 40001, 7175, true);
    let (seq, f) = ai.seg(&send(1, b"ping 1", true));
    cap.cross(0, &f);
    cap.cross(0, &ai.frame(seq, &send(1, b"ping 1", true))); // retransmitted as sent
    cap.cross(1, &ar.seg(&send(1, b"pong 1", true)).1);
    cap.cross(0, &ai.seg(&send(2, b"ping 2", true)).1);
    // B: a Send, its retransmission, then a Send whose CRC is broken.
    let first = send(1, b"data", true);
    let (seq, f) = bi.seg(&first);
    cap.cross(0, &f);
    let mut again = first.clone();
    if bad {
        again[2 + 18 + 1] = b'A'; // "dAta": TCP sent changed bytes
    }
    cap.cross(0, &bi.frame(seq, &again));
    let mut crc = send(2, b"more", true);
    if bad {
        let n = crc.len();
        crc[n - 1] ^= 0x40;
    }
    cap.cross(0, &bi.seg(&crc).1);
    cap.cross(1, &br.seg(&send(1, b"ok", true)).1);
    cap
}

fn check(args: &[&str]) -> (i32, String) {
    let o: Output = Command::new(env!("CARGO_BIN_EXE_vhost-rdma"))
        .arg("check-capture")
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), text)
}

#[test]
fn clean_capture_passes() {
    let dir = tempfile::tempdir().unwrap();
    let p = capture(false).write(dir.path(), "clean.pcapng");
    let (rc, out) = check(&[p.to_str().unwrap(), "--require-crc"]);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.contains("interface p0") && out.contains("interface p1"),
        "{out}"
    );
    assert!(
        out.contains("iwarp#1 10.0.0.1:40000 <-> 10.0.0.2:7174 [established, crc]"),
        "{out}"
    );
    assert!(
        out.contains("iwarp#2 10.0.0.1:40001 <-> 10.0.0.2:7175"),
        "{out}"
    );
    assert!(
        out.contains("0 finding(s) (0 shown), 0 problem(s)"),
        "{out}"
    );
    // Every frame was seen twice (both ports) and compared.
    assert!(out.contains("differing sightings 0"), "{out}");
}

#[test]
fn bad_crc_and_changed_retransmission_are_findings() {
    let dir = tempfile::tempdir().unwrap();
    let p = capture(true).write(dir.path(), "bad.pcapng");
    let (rc, out) = check(&[p.to_str().unwrap()]);
    assert_eq!(rc, 1, "{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("s [")).collect();
    assert_eq!(lines.len(), 2, "{out}");
    // The retransmission on the sender's port (p0), byte 20 + 21 of B's stream.
    assert!(
        lines[0].contains("[retransmit-differs] iwarp#2 10.0.0.1:40001 <-> 10.0.0.2:7175")
            && lines[0].contains("seq 41 (port p0)")
            && lines[0].contains("0x41, first 0x61"),
        "{out}"
    );
    assert!(
        lines[1].contains("[mpa-crc] iwarp#2") && lines[1].contains("(port p0)"),
        "{out}"
    );
    assert!(
        out.contains("2 finding(s) (2 shown), 0 problem(s)"),
        "{out}"
    );
    // Connection A alone is clean.
    let (rc, out) = check(&[p.to_str().unwrap(), "--flow", "7174:40000"]);
    assert_eq!(rc, 0, "{out}");
    assert!(!out.contains("iwarp#2"), "{out}");
    // JSON carries the same findings.
    let (rc, out) = check(&[p.to_str().unwrap(), "--json"]);
    assert_eq!(rc, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["retransmit-differs", "mpa-crc"]);
    assert_eq!(v["interfaces"][1]["name"], "p1");
}

#[test]
fn a_port_that_delivers_other_bytes_is_a_finding() {
    let mut cap = Cap::new();
    let (mut i, _r) = connect(&mut cap, 40000, 7174, false);
    let f = i.seg(&send(1, b"abcd", false)).1;
    cap.on(0, &f);
    let mut g = f.clone();
    let n = g.len();
    g[n - 5] = b'D'; // before the 4 (unused) CRC bytes
    cap.on(1, &g);
    let dir = tempfile::tempdir().unwrap();
    let p = cap.write(dir.path(), "fabric.pcapng");
    let (rc, out) = check(&[p.to_str().unwrap()]);
    assert_eq!(rc, 1, "{out}");
    assert!(
        out.contains("[retransmit-differs]")
            && out.contains("(port p1)")
            && out.contains("first on port p0"),
        "{out}"
    );
    // Without CRC: --require-crc names the connection.
    let (rc, out) = check(&[p.to_str().unwrap(), "--require-crc", "--flow", "40000:7174"]);
    assert_eq!(rc, 1);
    assert!(
        out.contains("PROBLEM iwarp#1 10.0.0.1:40000 <-> 10.0.0.2:7174: MPA CRC not negotiated"),
        "{out}"
    );
}

#[test]
fn cut_frames_cut_files_and_missing_flows() {
    let dir = tempfile::tempdir().unwrap();
    let cap = capture(false);
    // A file cut inside its last block: what precedes is checked.
    let p = dir.path().join("cut.pcapng");
    std::fs::write(&p, &cap.bytes[..cap.bytes.len() - 10]).unwrap();
    let (rc, out) = check(&[p.to_str().unwrap()]);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("reading stopped at byte"), "{out}");
    // A flow that is not there.
    let p = cap.write(dir.path(), "c.pcapng");
    let (rc, out) = check(&[p.to_str().unwrap(), "--flow", "1:2"]);
    assert_eq!(rc, 1);
    assert!(
        out.contains("PROBLEM no iWARP or SMC connection between ports 1 and 2"),
        "{out}"
    );
    // Frames cut by the snap length are counted, not checked.
    let mut short = Cap::new();
    let (mut i, _r) = connect(&mut short, 40000, 7174, false);
    let f = i.seg(&send(1, &[7; 100], false)).1;
    short.ts += 1;
    short
        .bytes
        .extend(pcapng::epb(0, short.ts, &f[..60], f.len() as u32, 0));
    let p = short.write(dir.path(), "snap.pcapng");
    let (_, out) = check(&[p.to_str().unwrap()]);
    assert!(out.contains("cut-by-snaplen 1 (not checked)"), "{out}");
}

#[test]
fn unreadable_files_and_bad_options_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let (rc, out) = check(&[dir.path().join("none.pcapng").to_str().unwrap()]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("vhost-rdma: error:"), "{out}");
    let p = dir.path().join("text");
    std::fs::write(&p, "not a capture").unwrap();
    let (rc, out) = check(&[p.to_str().unwrap()]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("not a pcapng or pcap file"), "{out}");
    let (rc, _) = check(&[p.to_str().unwrap(), "--flow", "7174"]);
    assert_eq!(rc, 2);
}
