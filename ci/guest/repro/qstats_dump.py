#!/usr/bin/env python3
"""Dump one interface's netdev queue stats over generic netlink, as the
kernel's drivers/net/stats.py does (`ynl --family netdev --dump qstats-get`).

Usage: qstats_dump.py IFNAME [--per-queue]

Prints "QSTATS ifindex=N attrs=..." per reply message and "RESULT ok
messages=N" at the end; with the gve driver of Linux 7.3 and the link down
the kernel oopses inside this dump instead (docs/upstream-suites.md).
Python 3 standard library only (no ynl, no spec files in the guest).
"""
import os
import socket
import struct
import sys

NETLINK_GENERIC = 16
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
# include/uapi/linux/netdev.h
NETDEV_CMD_QSTATS_GET = 12
NETDEV_A_QSTATS_IFINDEX = 1
NETDEV_A_QSTATS_SCOPE = 4
NETDEV_QSTATS_SCOPE_QUEUE = 1


def attr(kind, payload):
    n = 4 + len(payload)
    return struct.pack("=HH", n, kind) + payload + b"\0" * ((4 - n % 4) % 4)


def attrs(buf):
    out, i = {}, 0
    while i + 4 <= len(buf):
        n, kind = struct.unpack_from("=HH", buf, i)
        if n < 4:
            break
        out.setdefault(kind & 0x3FFF, buf[i + 4:i + n])
        i += (n + 3) & ~3
    return out


def request(sock, family, cmd, flags, payload, seq):
    body = struct.pack("=BBH", cmd, 1, 0) + payload
    sock.send(struct.pack("=IHHII", 16 + len(body), family, NLM_F_REQUEST | flags, seq, os.getpid()) + body)


def replies(sock):
    """Yield (type, payload after the genl header) until DONE; raise on an error reply."""
    while True:
        data = sock.recv(1 << 16)
        i = 0
        while i + 16 <= len(data):
            n, kind, _, _, _ = struct.unpack_from("=IHHII", data, i)
            msg = data[i + 16:i + n]
            i += (n + 3) & ~3
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                err = struct.unpack_from("=i", msg)[0]
                if err:
                    raise OSError(-err, os.strerror(-err))
                return
            yield kind, msg[4:]


def main():
    ifname = sys.argv[1]
    per_queue = "--per-queue" in sys.argv[2:]
    ifindex = socket.if_nametoindex(ifname)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
    sock.bind((0, 0))
    request(sock, GENL_ID_CTRL, CTRL_CMD_GETFAMILY, NLM_F_ACK, attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0"), 1)
    family = None
    for _, payload in replies(sock):
        family = struct.unpack("=H", attrs(payload)[CTRL_ATTR_FAMILY_ID][:2])[0]
    if family is None:
        sys.exit("no generic netlink family 'netdev'")
    req = attr(NETDEV_A_QSTATS_IFINDEX, struct.pack("=I", ifindex))
    if per_queue:
        req += attr(NETDEV_A_QSTATS_SCOPE, struct.pack("=I", NETDEV_QSTATS_SCOPE_QUEUE))
    print(f"dumping qstats of {ifname} (ifindex {ifindex}, scope {'queue' if per_queue else 'device'})", flush=True)
    request(sock, family, NETDEV_CMD_QSTATS_GET, NLM_F_DUMP, req, 2)
    count = 0
    for _, payload in replies(sock):
        count += 1
        print(f"QSTATS {sorted(attrs(payload))}", flush=True)
    print(f"RESULT ok messages={count}")


if __name__ == "__main__":
    main()
