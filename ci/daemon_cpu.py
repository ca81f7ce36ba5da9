#!/usr/bin/env python3
"""The daemon's CPU time per GiB moved, for the guest benches.

  daemon_cpu.py sample --pid PID --daemon BIN --control SOCK --out FILE
      every 0.5 s until PID exits: "<seconds> <cpu ticks> <bytes>", where
      cpu ticks are the process's user + system time (USER_HZ, /proc/PID/stat)
      and bytes are the frames its ports sent (virtio-net ports' tx_bytes
      plus erdma functions' tx_bytes, from `ctl status --json`).
  daemon_cpu.py bursts FILE PAYLOAD [PAYLOAD...]
      splits the samples into bursts of traffic (bytes growing; a burst ends
      after 2 s without growth), takes the len(PAYLOAD) largest in time
      order, and prints one line per burst: "<cpu s per GiB> <bytes>", the
      daemon's CPU over the burst divided by that burst's PAYLOAD bytes.
"""
import json
import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def sent_bytes(daemon, control):
    out = subprocess.run([daemon, "ctl", "--control", control, "status", "--json"],
                         capture_output=True, text=True, timeout=10).stdout
    st = json.loads(out)
    total = sum(p.get("tx_bytes", 0) for p in st.get("ports", []))
    for d in st.get("devices", []):
        total += d.get("erdma", {}).get("counters", {}).get("tx_bytes", 0)
    return total


def sample(args):
    opts = dict(zip(args[::2], args[1::2]))
    pid, out = int(opts["--pid"]), opts["--out"]
    with open(out, "w") as f:
        while True:
            try:
                line = f"{time.monotonic():.3f} {cpu_ticks(pid)} {sent_bytes(opts['--daemon'], opts['--control'])}"
            except (OSError, ValueError, subprocess.SubprocessError):
                if not os.path.exists(f"/proc/{pid}"):
                    return 0
                time.sleep(0.5)
                continue
            print(line, file=f, flush=True)
            time.sleep(0.5)


def bursts(args):
    path, payloads = args[0], [int(p) for p in args[1:]]
    rows = [tuple(float(x) for x in line.split()) for line in open(path) if line.strip()]
    found, start, quiet = [], None, 0
    for i in range(1, len(rows)):
        grew = rows[i][2] - rows[i - 1][2] > 256 << 10
        if grew:
            start = i - 1 if start is None else start
            quiet, last = 0, i
        elif start is not None:
            quiet += rows[i][0] - rows[i - 1][0]
            if quiet >= 2.0:
                found.append((start, last))
                start = None
    if start is not None:
        found.append((start, last))
    size = lambda b: rows[b[1]][2] - rows[b[0]][2]
    chosen = sorted(sorted(found, key=size, reverse=True)[: len(payloads)])
    for (a, b), payload in zip(chosen, payloads):
        cpu_s = (rows[b][1] - rows[a][1]) / HZ
        print(f"{cpu_s / (payload / 2**30):.2f} {int(rows[b][2] - rows[a][2])}")
    for _ in range(len(payloads) - len(chosen)):
        print("0 0")
    return 0


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    sys.exit(sample(rest) if cmd == "sample" else bursts(rest))
