#!/usr/bin/env python3
"""Checks the MPA CRC of every FPDU of one TCP direction in a capture.

usage: check-mpa-crc.py PCAP IFACE_ID SRC_PORT DST_PORT

PCAP is a daemon capture with whole frames (scripts/e2e-vhost-iwarp.sh
--capture with capture_snaplen=2000); IFACE_ID picks one capture port (a
frame crossing the fabric is recorded on both ports). The stream is
reassembled by sequence number; an MPA Request/Reply at its start is
skipped; each FPDU's CRC-32C (little-endian on the wire, as siw) is
recomputed. Needs tshark. Exit status 1 if a CRC is wrong.
"""
import subprocess, sys

pcap, iface, sport, dport = sys.argv[1:5]
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

out = subprocess.run(["tshark", "-r", pcap, "-Y",
    f"frame.interface_id=={iface} && tcp.srcport=={sport} && tcp.dstport=={dport} && tcp.len>0",
    "-T", "fields", "-e", "frame.number", "-e", "tcp.seq_raw", "-e", "tcp.payload"],
    capture_output=True, text=True).stdout
segs = {}
for line in out.splitlines():
    f = line.split("\t")
    if len(f) < 3 or not f[2]:
        continue
    segs.setdefault(int(f[1]), (int(f[0]), bytes.fromhex(f[2].replace(":", ""))))
if not segs:
    print("no segments"); sys.exit(1)
base = min(segs)
stream = bytearray()
frames = []  # (stream offset, frame number)
for seq in sorted(segs):
    fn, data = segs[seq]
    off = (seq - base) & 0xFFFFFFFF
    if off > len(stream):
        print(f"gap at {len(stream)} (next seg at {off}, frame {fn})"); break
    new = data[len(stream) - off:]
    if new:
        frames.append((len(stream), fn))
        stream += new
print(f"stream {len(stream)} bytes, {len(frames)} segments")
# MPA Request/Reply: 16-byte key..., u16 pd_len at 18
if stream[:4] == b"MPA ":
    pd = int.from_bytes(stream[18:20], "big")
    pos = 20 + pd
    print(f"MPA frame {stream[:16]!r} flags {stream[16]:#x} rev {stream[17]} pd {pd}")
else:
    pos = 0
n = bad = 0
def frame_at(o):
    best = None
    for so, fn in frames:
        if so <= o: best = fn
        else: break
    return best
while pos + 2 <= len(stream):
    ulen = int.from_bytes(stream[pos:pos+2], "big")
    total = 2 + ulen
    pad = (4 - total % 4) % 4
    end = pos + total + pad + 4
    if end > len(stream):
        break
    body = stream[pos:pos+total+pad]
    got = int.from_bytes(stream[pos+total+pad:end], "little")
    want = crc32c(body)
    n += 1
    if got != want:
        bad += 1
        if bad <= 5:
            ctrl = stream[pos+2:pos+4]
            print(f"BAD CRC fpdu #{n} at {pos} len {ulen} ctrl {ctrl.hex()} got {got:08x} want {want:08x} frames {frame_at(pos)}..{frame_at(end-1)}")
    pos = end
print(f"{n} FPDUs, {bad} bad CRC, {len(stream)-pos} bytes left")
sys.exit(1 if bad else 0)
