#!/usr/bin/env python3
"""Checks one direction of an iWARP (siw) TCP connection in a daemon capture.

usage: check-iwarp-stream.py PCAP SRC_PORT DST_PORT [--crc]

For every capture interface that recorded the direction (a frame crossing
the fabric is recorded at the sender's port on ingress and at the receiver's
on egress), the TCP stream is reassembled by sequence number and checked:

* retransmitted bytes equal the first transmission (a sender that changes
  data it already handed to TCP shows up here);
* the FPDUs parse (MPA length, DDP/RDMAP header), and a tagged message's
  segments continue where the previous one ended (TO + length, same STag),
  as the receiver's `siw: write off` check demands; with --crc the MPA CRC;
* the reassembled streams of all interfaces are identical (the fabric
  delivered what the sender sent).

Needs tshark. Prints the first problems; exit status 1 if any.
"""
import subprocess
import sys

POLY = 0x82F63B78
T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    T.append(c)


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def segments(pcap, sport, dport):
    out = subprocess.run(
        ["tshark", "-n", "-r", pcap, "-Y", f"tcp.srcport=={sport} && tcp.dstport=={dport} && tcp.len>0",
         "-T", "fields", "-e", "frame.interface_id", "-e", "frame.number", "-e", "tcp.seq_raw", "-e", "tcp.payload"],
        capture_output=True, text=True, check=True).stdout
    per_if = {}
    for line in out.splitlines():
        f = line.split("\t")
        if len(f) < 4 or not f[3]:
            continue
        per_if.setdefault(f[0], []).append((int(f[1]), int(f[2]), bytes.fromhex(f[3].replace(":", ""))))
    return per_if


def reassemble(segs, problems, where):
    """Stream bytes from the lowest sequence number; retransmissions compared byte by byte."""
    base = min(s for _, s, _ in segs)
    buf = {}
    for frame, seq, data in segs:
        off = (seq - base) & 0xFFFFFFFF
        for i, b in enumerate(data):
            old = buf.get(off + i)
            if old is None:
                buf[off + i] = b
            elif old != b:
                problems.append(f"{where}: frame {frame} retransmits stream byte {off + i} as {b:#04x}, "
                                f"first sent as {old:#04x}")
                break
    n = 0
    while n in buf:
        n += 1
    if n != len(buf):
        problems.append(f"{where}: stream has a hole at byte {n} ({len(buf)} bytes seen)")
    return bytes(buf[i] for i in range(n))


def walk_fpdus(s, crc, problems, where):
    off = 0
    if s.startswith(b"MPA ID Req Frame") or s.startswith(b"MPA ID Rep Frame"):
        off = 20 + int.from_bytes(s[18:20], "big")
    tagged = {}  # stag -> expected next TO
    n = 0
    while off + 2 <= len(s):
        ulen = int.from_bytes(s[off:off + 2], "big")
        total = 2 + ulen
        total += (-total) % 4
        if off + total + 4 > len(s):
            break  # partial FPDU at the end of the capture
        ulpdu = s[off + 2:off + 2 + ulen]
        if crc:
            want = int.from_bytes(s[off + total:off + total + 4], "little")
            got = crc32c(s[off:off + total])
            if want != got:
                problems.append(f"{where}: FPDU {n} at stream byte {off}: CRC {want:#010x}, computed {got:#010x}")
        if len(ulpdu) < 2:
            problems.append(f"{where}: FPDU {n} at stream byte {off}: ULPDU of {ulen} bytes")
            break
        ddp = ulpdu[0]
        if ddp & 0x80:  # tagged: STag, TO
            if len(ulpdu) < 14:
                problems.append(f"{where}: FPDU {n} at stream byte {off}: short tagged header")
                break
            stag = int.from_bytes(ulpdu[2:6], "big")
            to = int.from_bytes(ulpdu[6:14], "big")
            plen = len(ulpdu) - 14
            exp = tagged.get(stag)
            if exp is not None and exp != to:
                problems.append(f"{where}: FPDU {n} at stream byte {off}: tagged STag {stag:#x} TO {to:#x}, "
                                f"the previous segment ended at {exp:#x} (siw: 'write off')")
            tagged[stag] = None if ddp & 0x40 else to + plen
            if ddp & 0x40:
                tagged.pop(stag, None)
        n += 1
        off += total + 4
    return n


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    crc = "--crc" in sys.argv
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    pcap, sport, dport = args
    per_if = segments(pcap, sport, dport)
    if not per_if:
        print(f"no TCP data {sport} -> {dport} in {pcap}")
        return 1
    problems, streams = [], {}
    for iface, segs in sorted(per_if.items()):
        where = f"interface {iface}"
        streams[iface] = reassemble(segs, problems, where)
        n = walk_fpdus(streams[iface], crc, problems, where)
        print(f"{where}: {len(segs)} segments, {len(streams[iface])} stream bytes, {n} FPDUs")
    ifs = sorted(streams)
    for other in ifs[1:]:
        a, b = streams[ifs[0]], streams[other]
        m = min(len(a), len(b))
        diff = next((i for i in range(m) if a[i] != b[i]), None)
        if diff is not None:
            problems.append(f"interfaces {ifs[0]} and {other} differ at stream byte {diff}")
    for p in problems[:20]:
        print("PROBLEM", p)
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
