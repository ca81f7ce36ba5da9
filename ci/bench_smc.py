#!/usr/bin/env python3
"""SMC-R vs TCP benchmark between two guests on the vhost-rdma daemon (run through ci/bench-smc.sh).

One boot: daemon (two vhost-user ports) + guests A (server, 10.77.0.1) and B
(client, 10.77.0.2) from scripts/run-guests, rxe0 and the same UEID in both;
then for each connection count, `smc-guest-tests stream --proto smc` and
`--proto tcp` (client -> server, the same total bytes), barriers between the
phases. Guest side: ci/guest/ci-lib.sh + ci/guest/bench-smc.sh. Prints a
Markdown table (also written to <results>/bench.md, raw rows to bench.json).
Reuses ci/matrix.py (daemon, run-guests, verdict parsing). Python 3 stdlib only.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import matrix  # noqa: E402

BENCH_RE = re.compile(r"^CI-BENCH (.*)$")


def parse_bench(out_log):
    rows = []
    try:
        with open(out_log, errors="replace") as f:
            for ln in f:
                m = BENCH_RE.match(ln.strip())
                if m:
                    rows.append(dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv))
    except OSError:
        pass
    return rows


def fnum(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def table(rows, total_mib):
    """rows: CI-BENCH dicts of both guests. One line per (conns, proto) + ratio lines."""
    by = {}
    for r in rows:
        by[(int(r["conns"]), r["proto"], r["role"])] = r
    out = ["| conns | proto | MiB/s | tool CPU s/GiB (client / server) | whole-guest CPU s/GiB (client / server) "
           "| client usr/sys/softirq ticks s | server usr/sys/softirq ticks s | secs | mode |",
           "|---|---|---|---|---|---|---|---|---|"]
    per = {}
    for conns in sorted({k[0] for k in by}):
        for proto in ("smc", "tcp"):
            c, s = by.get((conns, proto, "client")), by.get((conns, proto, "server"))
            if not c and not s:
                continue
            c, s = c or {}, s or {}
            gib = (fnum(c.get("bytes")) or fnum(s.get("bytes")) or total_mib * 2**20) / 2**30
            mib = fnum(c.get("mibps")) or fnum(s.get("mibps"))

            def g(r):
                b = fnum(r.get("guest_busy_s"))
                return b / gib if b is not None and gib else None
            d = {"mibps": mib, "tool_c": fnum(c.get("cpu_s_per_gib")), "tool_s": fnum(s.get("cpu_s_per_gib")),
                 "guest_c": g(c), "guest_s": g(s)}
            ok = c.get("rc") == "0" and s.get("rc") == "0" and c.get("status") == "pass" and s.get("status") == "pass"
            per[(conns, proto)] = d
            f = lambda v, p=2: "?" if v is None else f"{v:.{p}f}"  # noqa: E731
            split = lambda r: "/".join(r.get(k, "?") for k in ("guest_user_s", "guest_sys_s", "guest_softirq_s"))  # noqa: E731
            mode = c.get("smc_mode") or s.get("smc_mode") or "-"
            out.append(f"| {conns} | {proto}{'' if ok else ' **FAIL**'} | {f(mib)} | {f(d['tool_c'])} / {f(d['tool_s'])} "
                       f"| {f(d['guest_c'])} / {f(d['guest_s'])} | {split(c)} | {split(s)} "
                       f"| {f(fnum(c.get('secs')), 1)} | {mode} |")
        a, b = per.get((conns, "smc")), per.get((conns, "tcp"))
        if a and b:
            def r(k):
                return f"{a[k] / b[k]:.2f}" if a[k] is not None and b[k] else "?"
            out.append(f"| {conns} | **SMC/TCP** | {r('mibps')} | {r('tool_c')} / {r('tool_s')} "
                       f"| {r('guest_c')} / {r('guest_s')} | | | | |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(prog="ci/bench-smc.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="7.3", choices=matrix.KERNELS)
    ap.add_argument("--image", help="guest image dir (default: scripts/build-guest-image.sh --kernel K)")
    ap.add_argument("--qemu", help="QEMU 11.1 (default: scripts/setup-qemu.sh)")
    ap.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--profile", default="release")
    ap.add_argument("--total", type=int, default=128, help="MiB per run, split over the connections (128)")
    ap.add_argument("--conns", default="1,4", help="connection counts (1,4)")
    ap.add_argument("--protos", default="smc,tcp")
    ap.add_argument("--timeout", type=int, default=2400, help="per guest seconds, boot to result")
    ap.add_argument("--results", help="results dir (default ci/results/bench-smc-<date>)")
    ap.add_argument("--verbose", "-v", action="store_true")
    a = ap.parse_args()
    conns = [int(x) for x in a.conns.split(",") if x]
    if any(c < 1 or a.total % c for c in conns):
        ap.error("--total must divide by every --conns value")

    date = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    resdir = os.path.abspath(a.results or os.path.join(HERE, "results", f"bench-smc-{date}"))
    os.makedirs(resdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="vr-bench-smc.")
    tdir = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(matrix.ROOT, "target"), a.profile)
    if not a.no_build:
        matrix.say(f"cargo build --profile {a.profile} -p vhost-rdma -p smc-guest-tests")
        rc = subprocess.call(["cargo", "build", "--profile", a.profile, "-p", "vhost-rdma", "-p", "smc-guest-tests"],
                             cwd=matrix.ROOT)
        if rc:
            print("cargo build failed", file=sys.stderr)
            return 2
    daemon_bin, sgt = os.path.join(tdir, "vhost-rdma"), os.path.join(tdir, "smc-guest-tests")
    for b in (daemon_bin, sgt):
        if not os.access(b, os.X_OK):
            print(f"missing binary {b}", file=sys.stderr)
            return 2
    qemu = a.qemu or matrix.last_line([os.path.join(matrix.ROOT, "scripts", "setup-qemu.sh")],
                                      os.path.join(work, "qemu.log"))
    img = a.image or matrix.last_line([os.path.join(matrix.ROOT, "scripts", "build-guest-image.sh"),
                                       "--kernel", a.kernel], os.path.join(work, f"image-{a.kernel}.log"))
    if not qemu or not img or not os.path.isfile(f"{img}/bzImage"):
        print(f"no QEMU ({qemu!r}) or guest image ({img!r})", file=sys.stderr)
        return 2

    vrbin = os.path.join(work, "vrbin")
    os.makedirs(os.path.join(vrbin, "bin"))
    os.makedirs(os.path.join(vrbin, "ci"))
    shutil.copy(sgt, os.path.join(vrbin, "bin", "smc-guest-tests"))
    for fn in ("ci-lib.sh", "bench-smc.sh"):
        shutil.copy(os.path.join(HERE, "guest", fn), os.path.join(vrbin, "ci", fn))

    names = [f"bench-{p}-{c}" for c in conns for p in a.protos.split(",")]
    matrix.CELLS["smc-bench"] = {
        "what": f"SMC-R vs TCP stream, {a.total} MiB client->server per run, conns {a.conns}, "
                "tool CPU (getrusage) and whole-guest CPU (/proc/stat)",
        "call": ". /opt/vr/ci/bench-smc.sh; cell_smc_bench",
        "tests": [("link-add-rxe", matrix.BOTH), ("smc-ueid", matrix.BOTH), ("smc-devices", matrix.BOTH)]
                 + [(n, matrix.BOTH) for n in names],
        "timeout": a.timeout,
    }
    matrix.JOB_ENV.update(CI_BENCH_CONNS=" ".join(map(str, conns)), CI_BENCH_TOTAL_MIB=str(a.total),
                          CI_BENCH_PROTOS=" ".join(a.protos.split(",")))
    ns = argparse.Namespace(accel=a.accel, timeout=a.timeout, verbose=a.verbose, keep_logs=True)
    logsdir = os.path.join(resdir, "logs")
    res = matrix.run_cell(ns, a.kernel, "smc-bench", img, qemu, daemon_bin, vrbin, work, logsdir)
    rows = []
    for g in ("a", "b"):
        rows += parse_bench(os.path.join(logsdir, f"{a.kernel}-smc-bench", f"{g}.job", "out.log"))
    shutil.rmtree(work, ignore_errors=True)
    accel = res.get("accel") or a.accel
    md = [f"# SMC-R vs TCP, {date}", "",
          f"Guests: Linux {', '.join(sorted(set(res['guest_kernel'].values()))) or a.kernel}, 1 vCPU, "
          f"accel {accel}, through the vhost-rdma daemon (virtio-net pci, 1 queue pair); "
          f"client -> server, {a.total} MiB per run split over the connections, every byte verified; "
          f"command `ci/bench-smc.sh {' '.join(sys.argv[1:])}`.", "",
          "CPU s/GiB: *tool* = getrusage of the smc-guest-tests process (`cpu_s_per_gib`); "
          "*whole-guest* = that guest's busy time over the stream run (elapsed - idle - iowait from /proc/uptime, "
          "1 vCPU; includes softirq, kworkers and everything else the guest ran), per GiB moved. The "
          "usr/sys/softirq split is from /proc/stat ticks (tick-sampled accounting: under TCG it undercounts, "
          "use it for proportions only).",
          "", table(rows, a.total), "",
          f"Cell: {res['status']}, wall {res['wall_s']} s; logs: {logsdir}/{a.kernel}-smc-bench/", ""]
    bad = [t for t in res["tests"] if t["status"] != "PASS"]
    for t in bad:
        md.append(f"- {t['status']} {t['test']}: {t['detail'][:400]}")
    text = "\n".join(md)
    with open(os.path.join(resdir, "bench.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(resdir, "bench.json"), "w") as f:
        json.dump({"rows": rows, "cell": res}, f, indent=1)
    # an SVG chart next to the table (scripts/guest-results plot); a failed plot never fails the bench
    subprocess.call([os.path.join(ROOT, "scripts", "guest-results"), "plot", os.path.join(resdir, "bench.md"),
                     os.path.join(resdir, "bench.svg"), "--title", "SMC-R vs TCP"])
    print("\n" + text)
    return 0 if res["status"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
