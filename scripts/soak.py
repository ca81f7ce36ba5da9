#!/usr/bin/env python3
"""Soak test (issue 8): ONE vhost-rdma daemon, FOUR Linux 7.3 guests, N minutes.

Pair 1 (guests a = server, b = client): SMC-R streams over rxe (UEID set),
every byte verified, one stream round after another.
Pair 2 (guests c = server, d = client): siw on eth0 (rping -V, verbs
write/read) and rxe on eth1 (ib_write_bw, verbs send/write/read), in a loop.
The daemon drops 0.5 % and reorders 1 % of the RoCEv2 frames (UDP 4791) its
ports receive (`ctl faults add`).

The host samples the daemon's VmRSS every few seconds; after the warm-up the
mean of the next 30 s is the baseline, the mean of the last 30 s before the
stop is the end value. Pass = end RSS within 10 % of the baseline, every
transfer passed on both sides (data-verified ones counted separately), the
daemon alive with the same PID and no panic in its log.

Guest side: ci/guest/soak-lib.sh (on top of ci/guest/ci-lib.sh).
Python 3 standard library only. Run through scripts/soak.sh.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEST_RE = re.compile(r'^CI-TEST test=(\S+) role=(\S+) status=(\S+) secs=(\d+)(?: bw=(\S*))? reason="(.*)"\s*$')
# name, role, eth0 ip, mac, pair, eth1 (port, ip, mac) or None
GUESTS = [
    ("a", "server", "10.77.0.1", "52:54:00:77:02:0a", 1, None),
    ("b", "client", "10.77.0.2", "52:54:00:77:02:0b", 1, None),
    ("c", "server", "10.77.0.3", "52:54:00:77:02:0c", 2, ("c1", "10.77.1.3", "52:54:00:77:02:1c")),
    ("d", "client", "10.77.0.4", "52:54:00:77:02:0d", 2, ("d1", "10.77.1.4", "52:54:00:77:02:1d")),
]
PAIR_CALL = {1: "soak_pair_smcr", 2: "soak_pair_rdma"}
PAIR_WHAT = {1: "SMC-R streams over rxe", 2: "siw rping/verbs + rxe ib_write_bw/verbs"}
# transfers whose data the tool checks (perftest checks nothing: completion only)
VERIFIED_RE = re.compile(r"^(smc-|rping-siw-|verbs-)")
KNOWN_SIW_RACES = ("siw_accept lost-wakeup race", "siw rejected the MPA reply")


def say(msg):
    print(f"[soak] {msg}", file=sys.stderr, flush=True)


def last_line(cmd, log):
    with open(log, "w") as lf:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=lf, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    return lines[-1].strip() if p.returncode == 0 and lines else None


def rss_kib(pid):
    """VmRSS, RssAnon and RssShmem of `pid` in KiB (None if it is gone)."""
    got = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                k = ln.split(":")[0]
                if k in ("VmRSS", "RssAnon", "RssShmem"):
                    got[k] = int(ln.split()[1])
    except OSError:
        return None
    if len(got) != 3:
        return None
    return got["VmRSS"], got["RssAnon"], got["RssShmem"]


def ctl(daemon_bin, d, *args):
    return subprocess.run([daemon_bin, "ctl", "--control", f"{d}/ctl.sock", *args],
                          capture_output=True, text=True, timeout=30)


def read_int(path):
    try:
        with open(path) as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def parse_guest(out_log):
    rows, aborted, done = [], None, None
    try:
        with open(out_log, errors="replace") as f:
            for ln in f:
                m = TEST_RE.match(ln.strip())
                if m:
                    rows.append({"test": m.group(1), "role": m.group(2), "status": m.group(3),
                                 "secs": int(m.group(4)), "bw": m.group(5) or "", "reason": m.group(6)})
                elif ln.startswith("CI-ABORT"):
                    aborted = ln.strip()
                elif ln.startswith("SOAK-DONE"):
                    done = ln.strip()
    except OSError:
        pass
    return rows, aborted, done


def combine(pair, per_role):
    """One row per test of a pair: FAIL if a side failed or did not report, SKIP if both skipped."""
    names = []
    for role in ("server", "client"):
        for r in per_role.get(role, []):
            if r["test"] not in names:
                names.append(r["test"])
    out = []
    for n in names:
        sides = {role: next((r for r in per_role.get(role, []) if r["test"] == n), None)
                 for role in ("server", "client")}
        st = [s["status"] if s else "MISSING" for s in sides.values()]
        if all(s == "SKIP" for s in st):
            status = "SKIP"
        elif any(s in ("FAIL", "MISSING") for s in st):
            status = "FAIL"
        else:
            status = "PASS"
        why = "; ".join(f"{role}: {s['reason'] if s else 'no result line'}" for role, s in sides.items()
                        if status != "PASS" and (not s or s["status"] != "PASS"))
        if status == "PASS":
            why = next((s["reason"] for s in sides.values() if s), "")
        race = any(k in why for k in KNOWN_SIW_RACES)
        bw = next((s["bw"] for s in sides.values() if s and s["bw"]), "")
        out.append({"pair": pair, "test": n, "status": status, "bw": bw, "detail": why[:400],
                    "known_siw_race": race, "verified": bool(VERIFIED_RE.match(n))})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10, help="soak length after both pairs started (10)")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds before the RSS baseline (default: 120, at most a third of the soak)")
    ap.add_argument("--sample-secs", type=float, default=3, help="RSS sampling period (3)")
    ap.add_argument("--rss-tolerance", type=float, default=10,
                    help="allowed change of the daemon's own RSS (VmRSS - RssShmem: heap, stacks and mapped "
                         "binary, without the guests' shared memory) in %% (10)")
    ap.add_argument("--rss-slack-kib", type=int, default=0,
                    help="... or this many KiB if larger (0)")
    ap.add_argument("--siw-settle-ms", type=int, default=300,
                    help="pair 2's siw: the daemon's mpa-settle workaround for Linux siw's connection-setup races "
                         "(300; 0 = off)")
    ap.add_argument("--drop", type=float, default=0.005, help="drop probability on the RoCE path (0.005)")
    ap.add_argument("--reorder", type=float, default=0.01, help="reorder probability on the RoCE path (0.01)")
    ap.add_argument("--smc-bytes", default="4M", help="SMC-R bytes per connection and direction per round (4M)")
    ap.add_argument("--image", help="7.3 guest image dir (default: scripts/build-guest-image.sh --kernel 7.3)")
    ap.add_argument("--qemu", help="QEMU (default: scripts/setup-qemu.sh)")
    ap.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    ap.add_argument("--pairs", default="1,2", help="pairs to run: 1 (SMC-R), 2 (siw + rxe) or 1,2 (default)")
    ap.add_argument("--no-checker", action="store_true", help="switch the daemon's protocol checker off (A/B runs)")
    ap.add_argument("--stop-grace", type=float, default=900,
                    help="seconds the guests may take to finish after the stop before they are killed (900)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--results", help="results dir (default ci/results/soak-<date>, gitignored)")
    a = ap.parse_args()
    try:
        pairs = sorted({int(p) for p in a.pairs.split(",") if p})
    except ValueError:
        ap.error("--pairs: a comma list of 1 and 2")
    if not pairs or any(p not in PAIR_CALL for p in pairs):
        ap.error("--pairs: a comma list of 1 and 2")
    guests = [g for g in GUESTS if g[4] in pairs]
    soak_s = a.minutes * 60
    warmup = a.warmup if a.warmup is not None else min(120.0, soak_s / 3)
    if warmup + 60 > soak_s:
        ap.error(f"--warmup {warmup:.0f}s leaves less than 60 s of soak after the baseline")

    date = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    resdir = os.path.abspath(a.results or os.path.join(ROOT, "ci", "results", f"soak-{date}"))
    os.makedirs(resdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="vr-soak.")
    say(f"results: {resdir}; work dir: {work}")
    tdir = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), "release")
    if not a.no_build:
        say("cargo build --release -p vhost-rdma -p smc-guest-tests")
        with open(f"{resdir}/build.log", "w") as bl:
            if subprocess.call(["cargo", "build", "--release", "-p", "vhost-rdma", "-p", "smc-guest-tests"],
                               cwd=ROOT, stdout=bl, stderr=subprocess.STDOUT):
                say(f"cargo build failed: {resdir}/build.log")
                return 2
    daemon_bin, sgt = f"{tdir}/vhost-rdma", f"{tdir}/smc-guest-tests"
    qemu = a.qemu or last_line([f"{ROOT}/scripts/setup-qemu.sh"], f"{work}/qemu.log")
    image = a.image or last_line([f"{ROOT}/scripts/build-guest-image.sh", "--kernel", "7.3"], f"{work}/image.log")
    for what, p in (("daemon", daemon_bin), ("smc-guest-tests", sgt), ("qemu", qemu)):
        if not p or not os.access(p, os.X_OK):
            say(f"missing {what}: {p!r}")
            return 2
    if not image or not os.path.isfile(f"{image}/bzImage"):
        say(f"no 7.3 guest image: {image!r}")
        return 2
    vrbin = f"{work}/vrbin"
    os.makedirs(f"{vrbin}/bin")
    os.makedirs(f"{vrbin}/ci")
    shutil.copy(sgt, f"{vrbin}/bin/smc-guest-tests")
    for lib in ("ci-lib.sh", "soak-lib.sh"):
        shutil.copy(f"{ROOT}/ci/guest/{lib}", f"{vrbin}/ci/{lib}")
    shutil.copy(f"{ROOT}/scripts/guest/rdma-lib.sh", f"{vrbin}/ci/rdma-lib.sh")

    # the daemon: six ports (pair 2 has a second NIC per guest for rxe)
    args = [daemon_bin, "serve", "--control", f"{work}/ctl.sock"]
    ports = []
    for name, _, _, mac, _, nic1 in guests:
        ports.append((name, mac))
        if nic1:
            ports.append((nic1[0], nic1[2]))
    for name, mac in ports:
        args += ["--port", f"{name}={work}/{name}.sock,mac={mac},queues=1,form=pci"]
    dlog = open(f"{resdir}/daemon.log", "w")
    daemon = subprocess.Popen(args, stdout=dlog, stderr=subprocess.STDOUT, env=dict(os.environ, NO_COLOR="1"))
    for _ in range(100):
        if all(os.path.exists(f"{work}/{n}.sock") for n, _ in ports) and os.path.exists(f"{work}/ctl.sock"):
            break
        time.sleep(0.1)
    problems = []
    for i, (name, _) in enumerate(ports):
        for action, extra in (("drop", ["--prob", str(a.drop)]),
                              ("reorder", ["--prob", str(a.reorder), "--window", "3", "--hold-ms", "10"])):
            r = ctl(daemon_bin, work, "faults", "add", "--port", name, "--dir", "ingress", "--action", action,
                    "--proto", "udp", "--dst-port", "4791", "--seed", str(100 + 10 * i + len(action)), *extra)
            if r.returncode != 0:
                problems.append(f"ctl faults add {name} {action}: {r.stderr.strip()}")
    if a.siw_settle_ms > 0 and "c" in [n for n, _ in ports]:
        # the documented Linux siw workaround (docs/faults-and-captures.md, "Linux siw workaround"), as in the matrix's siw cells
        r = ctl(daemon_bin, work, "faults", "add", "--port", "c", "--dir", "both", "--proto", "tcp",
                "--action", "mpa-settle", "--delay-ms", str(a.siw_settle_ms))
        if r.returncode != 0:
            problems.append(f"ctl faults add c mpa-settle: {r.stderr.strip()}")
    if a.no_checker:
        r = ctl(daemon_bin, work, "checker", "off")
        if r.returncode != 0:
            problems.append(f"ctl checker off: {r.stderr.strip()}")
    say(f"daemon pid {daemon.pid}; faults on the RoCE path: drop {a.drop * 100:g} %, reorder {a.reorder * 100:g} %")

    # Tool and stream timeouts well below the barrier timeout: a transfer
    # that hangs is killed, counted as failed, and the pair carries on with
    # its next round instead of losing its barriers.
    env = {"CI_TOOL_TIMEOUT": "240", "CI_VERBS_SIZE": "61441", "CI_VERBS_ITERS": "4",
           "CI_STREAM_TIMEOUT": "240", "CI_BARRIER_TIMEOUT": "420",
           "SOAK_SMC_BYTES": a.smc_bytes, "SOAK_PERFTEST_ITERS": "100"}
    rg = [f"{ROOT}/scripts/run-guests", "--qemu", qemu, "--image", image, "--accel", a.accel,
          "--timeout", str(int(soak_s + 1800)), "--guest-bin", vrbin, "--net", "vhost-user", "--form", "pci",
          "--queues", "1", "--logdir", work, "--no-fail-fast"]
    for name, role, ip, mac, pair, nic1 in guests:
        peer = next(g for g in guests if g[4] == pair and g[0] != name)
        lines = [f"ROLE={role} SELF={ip} PEER={peer[2]} CELL=7.3/soak-pair{pair}"]
        if nic1:
            lines.append(f"SELF1={nic1[1]} PEER1={peer[5][1]}")
        lines += ["export ROLE SELF PEER CELL SELF1 PEER1"]
        lines += [f"{k}={v}; export {k}" for k, v in env.items()]
        lines += ['echo "CI-KERNEL $(uname -r)"', ". /opt/vr/ci/ci-lib.sh", ". /opt/vr/ci/soak-lib.sh",
                  PAIR_CALL[pair], "exit 0"]
        with open(f"{work}/{name}.sh", "w") as f:
            f.write("\n".join(lines) + "\n")
        spec = f"{name},ip={ip}/24,sock={work}/{name}.sock,mac={mac},cmd={work}/{name}.sh"
        if nic1:
            spec += f",ip1={nic1[1]}/24,sock1={work}/{nic1[0]}.sock,mac1={nic1[2]}"
        rg += ["--guest", spec]
    t_start = time.monotonic()
    rgp = subprocess.Popen(rg, stdout=open(f"{resdir}/run-guests.log", "w"), stderr=subprocess.STDOUT)

    def stop_all(*_):
        rgp.terminate()
        daemon.terminate()
        sys.exit(130)
    signal.signal(signal.SIGTERM, stop_all)

    samples = []  # (seconds since soak start or None before it, kib)
    soak_t0 = None
    stop_sent = False
    stop_time = None
    stop_at_round = {}
    seen_pid = daemon.pid
    rss_csv = open(f"{resdir}/rss.csv", "w")
    rss_csv.write("wall_s,soak_s,vmrss_kib,rss_anon_kib,rss_shmem_kib,rounds_pair1,rounds_pair2\n")
    try:
        while rgp.poll() is None:
            time.sleep(a.sample_secs)
            now = time.monotonic()
            rounds = {p: max(read_int(f"{work}/{g[0]}.job/round") for g in guests if g[4] == p) for p in pairs}
            if soak_t0 is None and all(read_int(f"{work}/{g[0]}.job/round") >= 1 for g in guests):
                soak_t0 = now
                say(f"both pairs started round 1 after {now - t_start:.0f}s of boot and setup; soak "
                    f"{soak_s:.0f}s, RSS baseline after {warmup:.0f}s")
            if daemon.poll() is not None:
                problems.append(f"daemon exited with {daemon.returncode} during the run")
                break
            kib = rss_kib(daemon.pid)
            st = None if soak_t0 is None else now - soak_t0
            if kib is not None:
                samples.append((st, *kib))
            rss_csv.write(f"{now - t_start:.1f},{'' if st is None else f'{st:.1f}'},"
                          f"{','.join(map(str, kib or ('', '', '')))},"
                          f"{rounds.get(1, '')},{rounds.get(2, '')}\n")
            rss_csv.flush()
            if stop_time is not None and now - stop_time > a.stop_grace:
                problems.append(f"guests still running {a.stop_grace:.0f}s after the stop (hung?): stopped them")
                rgp.terminate()
                try:
                    rgp.wait(30)
                except subprocess.TimeoutExpired:
                    rgp.kill()
                break
            if soak_t0 is None and now - t_start > 900:
                problems.append("the pairs did not both start within 15 min of boot")
                for g in guests:
                    write_atomic(f"{work}/{g[0]}.job/stop", "1\n")
                stop_sent = True
                stop_time = now
            if st is not None and st >= soak_s and not stop_sent:
                for p in pairs:
                    # above any round either guest may be about to start (soak-lib.sh)
                    stop_at_round[p] = rounds[p] + 2
                    for g in guests:
                        if g[4] == p:
                            write_atomic(f"{work}/{g[0]}.job/stop", f"{stop_at_round[p]}\n")
                stop_sent = True
                stop_time = now
                say(f"time is up: pairs stop before rounds {stop_at_round}; waiting for the running rounds")
        rg_rc = rgp.wait()
    except KeyboardInterrupt:
        rgp.terminate()
        rgp.wait(30)
        daemon.terminate()
        raise
    rss_csv.close()
    if daemon.poll() is not None and not any("daemon exited" in p for p in problems):
        problems.append(f"daemon exited with {daemon.returncode} during the run")
    daemon_up = daemon.poll() is None  # one process for the whole run, never restarted
    # the daemon's own view at the end
    for what in ("status", "checker"):
        st = ctl(daemon_bin, work, "--json", what)
        with open(f"{resdir}/daemon-{what}.json", "w") as f:
            f.write(st.stdout if st.returncode == 0 else st.stderr)
    fl = ctl(daemon_bin, work, "faults", "list")
    with open(f"{resdir}/faults.txt", "w") as f:
        f.write(fl.stdout + fl.stderr)
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        try:
            if daemon.wait(15) != 0:
                problems.append(f"daemon exited {daemon.returncode} on SIGTERM")
        except subprocess.TimeoutExpired:
            daemon.kill()
            problems.append("daemon did not stop within 15 s of SIGTERM")
    dlog.close()
    with open(f"{resdir}/daemon.log", errors="replace") as f:
        if any("panicked" in ln for ln in f):
            problems.append("daemon panicked (daemon.log)")
    if rg_rc != 0:
        problems.append(f"run-guests exit {rg_rc} (a guest failed or timed out; run-guests.log)")

    # transfers
    rows, rounds_done = [], {}
    for pair in pairs:
        per_role = {}
        for name, role, _, _, p, _ in guests:
            if p != pair:
                continue
            r, ab, done = parse_guest(f"{work}/{name}.job/out.log")
            per_role[role] = r
            if ab:
                problems.append(f"guest {name}: {ab}")
            if not done:
                problems.append(f"guest {name} did not finish its rounds (no SOAK-DONE line)")
            else:
                rounds_done[name] = int(done.split("rounds=")[1])
        rows += combine(pair, per_role)
    setup_re = re.compile(r"^(link-add|smc-ueid|smc-devices)")
    transfers = [r for r in rows if not setup_re.match(r["test"])]
    setup = [r for r in rows if setup_re.match(r["test"])]
    n_pass = sum(r["status"] == "PASS" for r in transfers)
    n_fail = sum(r["status"] == "FAIL" for r in transfers)
    n_skip = sum(r["status"] == "SKIP" for r in transfers)
    n_verified = sum(r["status"] == "PASS" and r["verified"] for r in transfers)
    n_race = sum(r["status"] == "FAIL" and r["known_siw_race"] for r in transfers)
    for r in setup:
        if r["status"] != "PASS":
            problems.append(f"setup {r['test']} (pair {r['pair']}): {r['status']} {r['detail']}")

    # RSS
    # Judged: VmRSS - RssShmem, the daemon's own memory (heap, stacks, its
    # mapped binary). VmRSS also counts the pages of
    # the guests' shared memory (memfd) the daemon has touched (RssShmem):
    # it grows as the guests hand out buffers in pages not used before, up
    # to their RAM, and is returned when they disconnect; it is reported.
    soak_samples = [s for s in samples if s[0] is not None]
    base = [s for s in soak_samples if warmup <= s[0] < warmup + 30]
    end = [s for s in soak_samples if soak_s - 30 <= s[0] < soak_s]
    rss = {"samples": len(samples), "max_vmrss_kib": max((s[1] for s in samples), default=0),
           "max_anon_kib": max((s[2] for s in samples), default=0)}

    def mean(rows, i):
        return sum(r[i] for r in rows) / len(rows)
    if base and end:
        for name, i in (("vmrss", 1), ("anon", 2), ("shmem", 3)):
            b, e = mean(base, i), mean(end, i)
            rss[f"{name}_baseline_kib"] = round(b)
            rss[f"{name}_end_kib"] = round(e)
            rss[f"{name}_change_pct"] = round((e - b) / b * 100, 2) if b else None
        # the daemon's own resident memory: VmRSS without the guests' shared memory
        b = rss["vmrss_baseline_kib"] - rss["shmem_baseline_kib"]
        e = rss["vmrss_end_kib"] - rss["shmem_end_kib"]
        rss.update(own_baseline_kib=b, own_end_kib=e, own_change_pct=round((e - b) / b * 100, 2) if b else None)
        allowed = max(b * a.rss_tolerance / 100, a.rss_slack_kib)
        if abs(e - b) > allowed:
            problems.append(f"daemon's own RSS (VmRSS - RssShmem) changed {e - b:+d} KiB "
                            f"({rss['own_change_pct']:+.1f} %, baseline {b} KiB after {warmup:.0f}s, end {e} KiB), "
                            f"more than {allowed:.0f} KiB")
    else:
        problems.append("not enough RSS samples for a baseline and an end value")
    if not transfers:
        problems.append("no transfers ran")

    # per-kind table
    kinds = {}
    for r in transfers:
        k = re.sub(r"-\d+(-|$)", r"\1", r["test"])  # smc-3 -> smc, verbs-siw-3-write -> verbs-siw-write
        d = kinds.setdefault((r["pair"], k), {"n": 0, "pass": 0, "fail": 0, "skip": 0, "race": 0,
                                              "verified": r["verified"]})
        d["n"] += 1
        d["pass"] += r["status"] == "PASS"
        d["fail"] += r["status"] == "FAIL"
        d["skip"] += r["status"] == "SKIP"
        d["race"] += r["status"] == "FAIL" and r["known_siw_race"]
    ok = not problems and n_fail == 0
    lines = [f"# soak {date}: {'PASS' if ok else 'FAIL'}", "",
             f"- pairs {a.pairs}{', checker off' if a.no_checker else ''}; {a.minutes:g} min soak ({soak_s:.0f}s after both pairs started; wall "
             f"{time.monotonic() - t_start:.0f}s), {len(guests)} guests (7.3, {image}), one daemon (pid {seen_pid}, "
             f"up for the whole run: {'yes' if daemon_up else 'NO'}, never restarted), faults on UDP 4791 ingress of every port: drop {a.drop * 100:g} %, "
             f"reorder {a.reorder * 100:g} % (window 3)",
             f"- transfers: {len(transfers)} run, {n_pass} passed, {n_fail} failed"
             f"{f' ({n_race} on a known siw race)' if n_race else ''}, {n_skip} skipped; "
             f"{n_verified} passed with their data verified (ib_write_bw checks completion only)",
             f"- rounds: {rounds_done}",
             f"- daemon's own RSS (VmRSS - RssShmem, judged): baseline {rss.get('own_baseline_kib', '?')} KiB (mean "
             f"of {len(base)} samples {warmup:.0f}-{warmup + 30:.0f}s), end {rss.get('own_end_kib', '?')} KiB (mean "
             f"of {len(end)} samples, last 30 s), change {rss.get('own_change_pct', '?')} % (limit ±"
             f"{a.rss_tolerance:g} %{f' or {a.rss_slack_kib} KiB' if a.rss_slack_kib else ''}); of it heap "
             f"(RssAnon) {rss.get('anon_baseline_kib', '?')} -> {rss.get('anon_end_kib', '?')} KiB, max "
             f"{rss['max_anon_kib']} KiB",
             f"- daemon VmRSS (reported): {rss.get('vmrss_baseline_kib', '?')} -> {rss.get('vmrss_end_kib', '?')} "
             f"KiB ({rss.get('vmrss_change_pct', '?')} %), of which guest shared memory touched (RssShmem) "
             f"{rss.get('shmem_baseline_kib', '?')} -> {rss.get('shmem_end_kib', '?')} KiB; max VmRSS "
             f"{rss['max_vmrss_kib']} KiB; {rss['samples']} samples (rss.csv)", "",
             "| pair | transfer | run | passed | failed | skipped | data verified |",
             "|---|---|---|---|---|---|---|"]
    for (pair, k), d in sorted(kinds.items()):
        fail = f"{d['fail']}" + (f" ({d['race']} known siw race)" if d["race"] else "")
        lines.append(f"| {pair} | {k} | {d['n']} | {d['pass']} | {fail} | {d['skip']} | "
                     f"{'yes' if d['verified'] else 'no (completion)'} |")
    lines.append("")
    for r in transfers:
        if r["status"] == "FAIL":
            lines.append(f"- FAIL pair {r['pair']} {r['test']}: {r['detail']}")
    for p in problems:
        lines.append(f"- problem: {p}")
    report = "\n".join(lines) + "\n"
    with open(f"{resdir}/summary.md", "w") as f:
        f.write(report)
    # SVG charts next to the table: the transfers, and the daemon's memory
    # over the run (scripts/guest-results plot; a failed plot never fails the soak)
    gr = os.path.join(ROOT, "scripts", "guest-results")
    subprocess.call([gr, "plot", f"{resdir}/summary.md", f"{resdir}/summary.svg",
                     "--title", f"soak {date}: transfers"])
    subprocess.call([gr, "plot", "--csv", f"{resdir}/rss.csv", f"{resdir}/rss.svg", "--x", "wall_s",
                     "--y", "vmrss_kib,rss_anon_kib,rss_shmem_kib", "--title", f"soak {date}: daemon memory (KiB)"])
    with open(f"{resdir}/summary.json", "w") as f:
        json.dump({"pass": ok, "minutes": a.minutes, "warmup_s": warmup, "rss": rss, "rounds": rounds_done,
                   "transfers": transfers, "setup": setup, "problems": problems}, f, indent=1)
    for name, *_ in guests:
        for fn in (f"{name}.console.log", f"{name}.sh"):
            if os.path.exists(f"{work}/{fn}"):
                shutil.copy(f"{work}/{fn}", resdir)
        if os.path.isdir(f"{work}/{name}.job"):
            shutil.copytree(f"{work}/{name}.job", f"{resdir}/{name}.job", dirs_exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    print(report)
    print(f"results: {resdir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
