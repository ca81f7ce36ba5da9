#!/usr/bin/env python3
"""Regenerates the small committed seed corpora in fuzz/corpus/<target>/.

Sources: the golden RoCE captures in roce-model/testdata (Ethernet frames and
their BTH..ICRC parts), hand-built MPA/DDP/RDMAP frames as in siw's tests,
virtio-net headers with TCP frames, and the README's JSON/TOML examples.
Deterministic; run from anywhere: python3 fuzz/gen_seeds.py
"""
import os, struct, sys, hashlib

HERE = os.path.dirname(os.path.abspath(__file__))
TESTDATA = os.environ.get("ROCE_TESTDATA", os.path.join(HERE, "..", "roce-model", "testdata"))
OUT = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def pcap_records(path):
    b = open(path, "rb").read()
    magic = struct.unpack("<I", b[:4])[0]
    e = "<" if magic in (0xA1B2C3D4, 0xA1B23C4D) else ">"
    link = struct.unpack(e + "I", b[20:24])[0] & 0x0FFFFFFF
    off, recs = 24, []
    while off + 16 <= len(b):
        incl = struct.unpack(e + "I", b[off + 8:off + 12])[0]
        off += 16
        recs.append(b[off:off + incl])
        off += incl
    return link, recs


def bth_part(frame):
    """BTH..ICRC of a RoCE Ethernet frame (v1 GRH or v2 IPv4/IPv6), else None."""
    et, off = struct.unpack(">H", frame[12:14])[0], 14
    if et == 0x8100:
        et, off = struct.unpack(">H", frame[16:18])[0], 18
    if et == 0x8915:
        return frame[off + 40:]
    if et == 0x0800:
        ihl = (frame[off] & 15) * 4
        tot = struct.unpack(">H", frame[off + 2:off + 4])[0]
        return frame[off + ihl + 8:off + tot]
    if et == 0x86DD:
        return frame[off + 48:]
    return None


# CRC32C (Castagnoli), reflected, as MPA uses it.
_T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _T.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    for x in data:
        c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def fpdu(ulpdu, crc):
    body = struct.pack(">H", len(ulpdu)) + ulpdu + b"\0" * ((4 - (2 + len(ulpdu)) % 4) % 4)
    return body + struct.pack("<I", crc32c(body) if crc else 0)


def mpa_frame(req, flags, rev, pd, ird_ord=None):
    key = b"MPA ID Req Frame" if req else b"MPA ID Rep Frame"
    if ird_ord is not None:
        flags |= 0x10
        pd = struct.pack(">HH", *ird_ord) + pd
    return key + bytes([flags, rev]) + struct.pack(">H", len(pd)) + pd


def ddp_tagged(op, last, stag, to):
    c = 0x8000 | (0x4000 if last else 0) | 0x0100 | 0x0040 | op
    return struct.pack(">HIQ", c, stag, to)


def ddp_untagged(op, last, rsvd, qn, msn, mo):
    c = (0x4000 if last else 0) | 0x0100 | 0x0040 | op
    return struct.pack(">HIIII", c, rsvd, qn, msn, mo)


def ones(data):
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(">%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def tcp4_frame(payload, vlan=False):
    eth = b"\x02" * 6 + b"\x04" * 6 + (b"\x81\x00\x00\x05" if vlan else b"") + b"\x08\x00"
    ip = bytearray(struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40 + len(payload), 7, 0x4000, 64, 6, 0,
                               bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])))
    struct.pack_into(">H", ip, 10, 0xFFFF ^ ones(bytes(ip)))
    tcp = struct.pack(">HHIIBBHHH", 40000, 5201, 1000, 0, 5 << 4, 0x18, 512, 0, 0)
    return eth + bytes(ip) + tcp + payload


def tcp6_frame(payload):
    eth = b"\x02" * 6 + b"\x04" * 6 + b"\x86\xdd"
    ip = struct.pack(">IHBB16s16s", 0x60000000, 20 + len(payload), 6, 64, b"\xfd" + b"\0" * 14 + b"\1",
                     b"\xfd" + b"\0" * 14 + b"\2")
    tcp = struct.pack(">HHIIBBHHH", 40000, 5201, 1, 0, 5 << 4, 0x19, 512, 0, 0)
    return eth + ip + tcp + payload


def nethdr(flags, gso, hdr_len, gso_size, cs, co, nb=0):
    return struct.pack("<BBHHHHH", flags, gso, hdr_len, gso_size, cs, co, nb)


def main():
    _, eth = pcap_records(os.path.join(TESTDATA, "scapy_roce_hw_vectors.pcap"))
    _, erf = pcap_records(os.path.join(TESTDATA, "wireshark-samplecaptures_infiniband.erf.pcap"))
    for i, f in enumerate(eth):
        put("roce_frame", "scapy-%d" % i, f)
        put("nic_classify", "scapy-%d" % i, b"\x01" * 12 + f)
        p = bth_part(f)
        if p:
            put("roce_packet", "scapy-%d" % i, p)
            put("roce_rc_engine", "scapy-%d" % i, b"\x00\x00\x0f" + bytes([len(p) - 12]) + p)
    # ERF records: 16-byte ERF header, then (for IB) the LRH onwards.
    for i, r in enumerate(erf[:6]):
        put("roce_frame", "erf-ib-%d" % i, r[16:])
        put("roce_packet", "erf-ib-%d" % i, r[16 + 8:])
    for i in range(4):
        put("roce_build", "h%d" % i, hashlib.sha256(b"roce_build%d" % i).digest() * 4)
        put("steering_guest", "h%d" % i, hashlib.sha256(b"steer%d" % i).digest() * 8)
        put("roce_rc_engine", "h%d" % i, hashlib.sha256(b"rc%d" % i).digest() * 16)

    # MPA request / reply frames.
    mpas = {
        "req-v2-enh": mpa_frame(True, 0x00, 2, b"hello from a", (16, 16)),
        "req-v2-crc": mpa_frame(True, 0x40, 2, b"", (0x8010, 0x4010)),
        "req-v1": mpa_frame(True, 0x00, 1, b"x" * 7),
        "rep-v2": mpa_frame(False, 0x00, 2, b"hello from b", (16, 16)),
        "rep-reject": mpa_frame(False, 0x20, 2, b"no"),
    }
    for n, m in mpas.items():
        put("siw_mpa", n, b"\x00" + m)
    put("siw_mpa", "cfg-crc", b"\x01" + mpas["req-v2-crc"])

    # DDP/RDMAP headers (opcodes: 0 write, 1 read req, 2 read resp, 3 send, 7 terminate).
    write = ddp_tagged(0, True, 0x100, 0) + b"data" * 4
    readreq = ddp_untagged(1, True, 0, 1, 1, 0) + struct.pack(">IQIIQ", 0x200, 0, 64, 0x100, 0)
    send = ddp_untagged(3, True, 0, 0, 1, 0) + b"payload!"
    readresp = ddp_tagged(2, True, 0x200, 0) + b"r" * 16
    term = ddp_untagged(7, True, 0, 2, 1, 0) + struct.pack(">I", 0x12345000 | 0xC000) + b"\0\x20" + write[:14]
    for n, u in [("write", write), ("readreq", readreq), ("send", send), ("readresp", readresp),
                 ("terminate", term)]:
        put("siw_ddp", n, u)
        put("siw_deframer", n, b"\x01\xff\xff" + fpdu(u, True))
    put("siw_deframer", "nocrc-two", b"\x00\x05\xdc" + fpdu(send, False) + fpdu(write, False))
    put("siw_deframer", "crc-split", b"\x01\x05\xdc" + fpdu(readreq, True) + fpdu(send, True)[:9])
    put("siw_engine", "responder-req", b"\x00" + mpa_frame(True, 0, 2, b"hello", (16, 16)) +
        fpdu(ddp_untagged(0, True, 0, 0, 0, 0)[:2] + b"\0" * 16, False))
    put("siw_engine", "responder-req-seg", b"\x0e" + mpa_frame(True, 0x40, 2, b"x", (16, 16)))
    prog = b""
    for u, fl in [(send, 0), (write, 1), (readreq, 0), (readresp, 1), (term, 0)]:
        prog += bytes([len(u), fl]) + u
    put("siw_engine", "connected", b"\x01" + prog)
    put("siw_engine", "connected-crc-read", b"\x07" + prog)
    put("siw_engine", "connected-seg", b"\x19" + prog)

    # nic_classify: config bytes, then frames.
    put("nic_classify", "tcp4", b"\x02\x40\x00\x80\x00\x01\x00\x00\x20\xff\xff\x02" + tcp4_frame(b"x" * 300))
    put("nic_classify", "tcp6", b"\x00" * 12 + tcp6_frame(b"y" * 100))

    # virtio-net header + frame.
    f4 = tcp4_frame(b"A" * 3000)
    f4v = tcp4_frame(b"B" * 1000, vlan=True)
    f6 = tcp6_frame(b"C" * 2500)
    put("virtio_offload", "csum-tcp4", nethdr(1, 0, 0, 0, 34, 16) + tcp4_frame(b"abc"))
    put("virtio_offload", "csum-udp", nethdr(1, 0, 0, 0, 34, 6) + tcp4_frame(b"abcd"))
    put("virtio_offload", "tso4", nethdr(1, 1, 54, 1448, 34, 16) + f4)
    put("virtio_offload", "tso4-vlan-ecn", nethdr(1, 0x81, 58, 536, 38, 16) + f4v)
    put("virtio_offload", "tso6", nethdr(1, 4, 74, 1440, 54, 16) + f6)
    put("virtio_offload", "none", nethdr(0, 0, 0, 0, 0, 0, 1) + tcp4_frame(b""))

    # Control socket JSON.
    for n, j in {
        "status": '{"cmd":"status"}',
        "rule-tcp": '{"cmd":"flow-rule-add","port":"a","rule":{"proto":"tcp","dst-port":5201,"queue":3}}',
        "rule-drop": '{"cmd":"flow-rule-add","port":"a","rule":{"src-ip":"10.0.0.0/8","drop":true,"priority":1}}',
        "rule-mac": '{"cmd":"flow-rule-add","port":"b","rule":{"id":7,"dst-mac":"52:54:00:00:00:0a","ethertype":2048,"dst-ip":"fd00::2/64","proto":"17","src-port":1,"queue":0}}',
        "list": '{"cmd":"flow-rule-list","port":"a"}',
        "del": '{"cmd":"flow-rule-del","port":"a","id":1}',
        "rss": '{"cmd":"rss","port":"a","predict":["10.0.0.1:4000-10.0.0.2:5201/tcp","[fd00::1]:1-[fd00::2]:2/udp"],"clear_flows":true}',
    }.items():
        put("control_json", n, j.encode())

    # TOML configuration, command-line port specs, MACs.
    put("config_toml", "readme", b'''control = "/run/vhost-rdma/ctl.sock"
[[port]]
name = "a"
socket = "/run/vhost-rdma/a.sock"
mac = "52:54:00:00:00:0a"
queues = 2
form = "pci"
rx-queue-frames = 1024
''')
    put("config_toml", "rules", b'''[[port]]
name = "a"
socket = "/run/vhost-rdma/a.sock"
queues = 4
form = "testdev"
[[port.flow-rule]]
proto = "tcp"
dst-port = 5201
queue = 3
[[port.flow-rule]]
src-ip = "10.0.0.0/8"
drop = true
priority = 1
''')
    put("config_toml", "cli-port", b"a=/tmp/a.sock,mac=52:54:00:00:00:0a,queues=4,form=testdev,rx-queue-frames=64")
    put("config_toml", "mac", b"52:54:00:12:34:56")
    chains_seeds()


# ---- virtio_chains: 32-byte control header + guest memory region 0 ----------
F_NEXT, F_WRITE, F_INDIRECT = 1, 2, 4


def chains_seed(size_log2, bits, descs, avail, mem_blobs, next_avail=0, pause=0,
                rx_lens=(1, 24, 3), rings=None):
    hdr = bytearray(32)
    hdr[0] = size_log2
    hdr[1] = bits
    hdr[2:4] = struct.pack("<H", next_avail)
    hdr[4] = pause
    hdr[5:8] = bytes(rx_lens)
    if rings:
        hdr[8:32] = struct.pack("<QQQ", *rings)
    mem = bytearray(0x7000)
    for i, (addr, ln, flags, nxt) in enumerate(descs):
        mem[16 * i:16 * i + 16] = struct.pack("<QIHH", addr, ln, flags, nxt)
    idx = (next_avail + len(avail)) & 0xFFFF
    mem[0x1000:0x1004] = struct.pack("<HH", 0, idx)
    for i, h in enumerate(avail):
        slot = (next_avail + i) % (1 << size_log2)
        mem[0x1004 + 2 * slot:0x1006 + 2 * slot] = struct.pack("<H", h)
    for addr, blob in mem_blobs:
        mem[addr:addr + len(blob)] = blob
    return bytes(hdr) + bytes(mem)


def chains_seeds():
    frame = bytes(12) + tcp4_frame(b"hostile guest")
    fl = len(frame)
    t = "virtio_chains"
    put(t, "tx-single", chains_seed(8, 0, [(0x3000, fl, 0, 0)], [0], [(0x3000, frame)]))
    put(t, "tx-chain-indirect", chains_seed(
        8, 0,
        [(0x4000, 32, F_INDIRECT, 0), (0x3000, 12, F_NEXT, 2), (0x300C, fl - 12, 0, 0)],
        [0, 1],
        [(0x3000, frame),
         (0x4000, struct.pack("<QIHH", 0x3000, 12, F_NEXT, 1) + struct.pack("<QIHH", 0x300C, fl - 12, 0, 0))]))
    put(t, "rx-mrg", chains_seed(
        8, 0x02 | 0x01,
        [(0x5000, 2048, F_WRITE, 0), (0x5800, 100, F_WRITE | F_NEXT, 2), (0x6000, 4000, F_WRITE, 0),
         (0x4000, 32, F_INDIRECT, 0)],
        [0, 1, 3],
        [(0x4000, struct.pack("<QIHH", 0x6800, 64, F_WRITE | F_NEXT, 1) + struct.pack("<QIHH", 0x6840, 0, F_WRITE, 0))]))
    put(t, "rx-small", chains_seed(
        4, 0, [(0x5000, 64, F_WRITE, 0), (0x5800, 0, F_WRITE, 0)], [0, 1], [], rx_lens=(1, 1, 1)))
    put(t, "loop", chains_seed(8, 0, [(0x3000, 12, F_NEXT, 1), (0x300C, 60, F_NEXT, 0)], [0], [(0x3000, frame)]))
    put(t, "huge-zero-len", chains_seed(
        8, 0, [(0x3000, 0xFFFFFFFF, 0, 0), (0x3000, 0, F_NEXT, 2), (0x3000, 0, 0, 0)], [0, 1], [(0x3000, frame)]))
    put(t, "out-of-bounds", chains_seed(
        8, 0,
        [(0xFFF0, 0x100, 0, 0), (0x18000, 64, 0, 0), (0x20000, 0x4000, 0, 0), (0x23FF0, 0x20, F_WRITE, 0),
         (0xFFFFFFFFFFFFFFF0, 0x40, 0, 0)],
        [0, 1, 2, 3, 4, 77], [(0x3000, frame)]))
    put(t, "rings-elsewhere", chains_seed(
        3, 0x40 | 0x01, [], [], [], rings=(0x20000, 0xFFFE, 0x21000)))
    put(t, "ctrl", chains_seed(
        8, 0, [(0x3000, 4, F_NEXT, 1), (0x3100, 1, F_WRITE, 0)], [0],
        [(0x3000, bytes([4, 0, 2, 0]))]))
    put(t, "tx-pause", chains_seed(
        8, 0x80 | 0x08, [(0x3000, fl, 0, 0), (0x3000, fl, 0, 0), (0x3000, fl, 0, 0)], [0, 1, 2],
        [(0x3000, frame)], pause=1))
    put(t, "wrap-size1", chains_seed(0, 0x01, [(0x3000, fl, 0, 0)], [0], [(0x3000, frame)], next_avail=0xFFFF))
    put(t, "bad-size", chains_seed(0x80 | 3, 0, [(0x3000, fl, 0, 0)], [0], [(0x3000, frame)]))
    put(t, "tx-hash-tso", chains_seed(
        8, 0x04 | 0x08 | 0x10, [(0x3000, fl + 8, 0, 0)], [0],
        [(0x3000, nethdr(1, 1, 54, 4, 34, 16) + bytes(8) + tcp4_frame(b"x" * 200))]))


if __name__ == "__main__":
    main()
