#!/usr/bin/env python3
"""Host side of scripts/e2e-rss.sh: follows guest A's steps through files in
its 9p job dir (A writes STEP.req, we check and write STEP.ack), asks the
daemon (`vhost-rdma ctl rss/flow-rule --json`) and compares.

Usage: e2e-rss-host.py DAEMON CTL_SOCK JOB_A JOB_B FLOWS_JSON
Prints CHECK-OK / CHECK-FAIL lines; exit 0 only if every check passed and
every step was seen. Python 3 standard library only."""

import json
import os
import re
import subprocess
import sys
import time

DAEMON, CTL, JOB_A, JOB_B, FLOWS = sys.argv[1:6]
STEPS = ["default", "equal2", "hkey", "flows", "rules"]
STEP_TIMEOUT = float(os.environ.get("E2E_RSS_STEP_TIMEOUT", "900"))
fails = []
A_IP, B_IP = "10.77.0.1", "10.77.0.2"


def log(*a):
    print("[e2e-rss-host]", *a, flush=True)


def check(ok, what):
    print(("CHECK-OK   " if ok else "CHECK-FAIL ") + what, flush=True)
    if not ok:
        fails.append(what)
    return ok


def ctl(*args):
    r = subprocess.run([DAEMON, "ctl", "--control", CTL, "--json", *args],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise RuntimeError(f"ctl {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def ctl_human(*args):
    r = subprocess.run([DAEMON, "ctl", "--control", CTL, *args],
                       capture_output=True, text=True, timeout=30)
    return r.stdout + r.stderr


def rss(predict=()):
    a = ["rss", "--port", "a"]
    for p in predict:
        a += ["--predict", p]
    return ctl(*a)


def parse_ethtool_x(path):
    """(table, key bytes) from `ethtool -x` output."""
    table, key, want_key = [], None, False
    with open(path) as f:
        for line in f:
            m = re.match(r"^\s*(\d+):\s+([\d\s]+)$", line)
            if m and not want_key:
                table += [int(x) for x in m.group(2).split()]
                continue
            if line.startswith("RSS hash key:"):
                want_key = True
                continue
            if want_key:
                key = line.strip().replace(":", "").lower()
                want_key = False
    return table, key


def wait_step(step):
    req = os.path.join(JOB_A, step + ".req")
    t0 = time.monotonic()
    while not os.path.exists(req):
        if time.monotonic() - t0 > STEP_TIMEOUT:
            return False
        if os.path.exists(os.path.join(JOB_A, "abort")):
            return False
        time.sleep(0.5)
    return True


def ack(step, text=""):
    with open(os.path.join(JOB_A, step + ".ack.tmp"), "w") as f:
        f.write(text)
    os.rename(os.path.join(JOB_A, step + ".ack.tmp"), os.path.join(JOB_A, step + ".ack"))


def flow_name(proto, sport, dport=None, src=B_IP, sp=5201, dst=A_IP):
    # traffic towards A: from B:5201 (iperf3 -R data) to A:sport
    return f"{src}:{sp}-{dst}:{sport}/{proto}"


def read_flow_lines():
    """FLOW lines from A's out.log: name -> per-queue deltas."""
    out = {}
    with open(os.path.join(JOB_A, "out.log"), errors="replace") as f:
        for line in f:
            m = re.match(r"^FLOW (\S+) rc=(\d+) before=\[([\d ]*)\] after=\[([\d ]*)\]", line)
            if not m:
                continue
            b = [int(x) for x in m.group(3).split()]
            a = [int(x) for x in m.group(4).split()]
            out[m.group(1)] = (int(m.group(2)), [y - x for x, y in zip(b, a)])
    return out


def main():
    spec = json.load(open(FLOWS))
    key_hex = spec["key"].replace(":", "").lower()
    predicted = {}
    for step in STEPS:
        log(f"waiting for guest step {step}")
        if not wait_step(step):
            check(False, f"guest reached step {step}")
            break
        st = rss()
        if step in ("default", "equal2", "hkey"):
            table, key = parse_ethtool_x(os.path.join(JOB_A, f"x-{step}.txt"))
            check(st["rss_negotiated"] and st["hash_report_negotiated"],
                  f"{step}: guest negotiated RSS and HASH_REPORT "
                  f"(rss={st['rss_negotiated']} hash_report={st['hash_report_negotiated']})")
            check(st["mode"] == "rss", f"{step}: daemon RSS mode is rss ({st['mode']})")
            check(len(table) == 128, f"{step}: ethtool -x shows a 128-entry RETA ({len(table)})")
            check(table == st["indirection_table"],
                  f"{step}: guest RETA == daemon table (daemon {st['indirection_table'][:8]}...)")
            check(key == st["key"], f"{step}: guest key == daemon key ({st['key'][:16]}...)")
            if step == "default":
                check(table == [i % 4 for i in range(128)], f"{step}: default RETA spreads over 4 queues")
                check(st["active_queue_pairs"] == 4 and st["max_tx_vq"] == 4,
                      f"{step}: 4 queue pairs in use (max_tx_vq {st['max_tx_vq']})")
                log("hash types", hex(st["hash_types"]), " ".join(st["hash_type_names"]))
            if step == "equal2":
                check(st["indirection_table"] == [i % 2 for i in range(128)],
                      f"{step}: ethtool -X equal 2 -> daemon table 0,1,0,1...")
            if step == "hkey":
                check(st["key"] == key_hex, f"{step}: ethtool -X hkey -> daemon key {st['key'][:16]}...")
                check(st["indirection_table"] == [i % 4 for i in range(128)],
                      f"{step}: ethtool -X equal 4 -> daemon table 0..3")
                names = [flow_name(p, s) for p, s in spec["flows"]]
                names += [flow_name("tcp", spec["move_sport"])]
                pr = rss(names)["predictions"]
                predicted = {p["flow"]: p for p in pr}
                print(ctl_human("rss", "--port", "a", *sum((["--predict", n] for n in names), [])),
                      flush=True)
                for n in names:
                    check(predicted[n]["queue"] is not None and predicted[n]["how"].startswith("rss"),
                          f"predict {n}: queue {predicted[n]['queue']} via {predicted[n]['how']}")
                # Forget earlier flows, so the table below is about this run only.
                ctl("rss", "--port", "a", "--clear-flows")
            ack(step)
        elif step == "flows":
            got = read_flow_lines()
            st = rss()
            seen = {f["flow"]: f for f in st["flows"]}
            queues_used = set()
            for proto, sport in spec["flows"]:
                n = flow_name(proto, sport)
                p = predicted.get(n)
                rc, d = got.get(n, (None, []))
                if p is None or not d:
                    check(False, f"{n}: measured and predicted")
                    continue
                total = sum(d)
                best = max(range(len(d)), key=lambda i: d[i])
                queues_used.add(best)
                check(rc == 0, f"{n}: traffic ran (rc {rc})")
                check(best == p["queue"] and d[best] >= 0.7 * total and d[best] >= 20,
                      f"{n}: guest rx queue {best} == predicted {p['queue']} "
                      f"(per-queue rx_packets deltas {d})")
                f = seen.get(n)
                if not check(f is not None, f"{n}: daemon saw the flow"):
                    continue
                check(f["queue"] == p["queue"] and f["hash_value"] == p["hash_value"]
                      and f["hash_report"] == p["hash_report"],
                      f"{n}: daemon steered to queue {f['queue']} with hash {f['hash_value']:#010x} "
                      f"report {f['hash_report']} == model ({p['queue']}, {p['hash_value']:#010x}, "
                      f"{p['hash_report_name']})")
                check(f["frames"] > 0 and f["hash_reported"] == f["frames"],
                      f"{n}: all {f['frames']} frames carried the hash in a 20-byte RX header "
                      f"({f['hash_reported']})")
            check(len(queues_used) == 4, f"flows arrived on all 4 queues {sorted(queues_used)}")
            # Rules: move a fresh TCP flow off its RSS queue, drop another.
            n = flow_name("tcp", spec["move_sport"])
            target = (predicted[n]["queue"] + 1) % 4
            r = ctl("flow-rule", "add", "--port", "a", "--proto", "tcp", "--dst-ip", A_IP,
                    "--dst-port", str(spec["move_sport"]), "--queue", str(target))
            move_id = r["rule_id"]
            r = ctl("flow-rule", "add", "--port", "a", "--proto", "tcp", "--src-ip", B_IP,
                    "--src-port", "5202", "--drop", "--priority", "1")
            drop_id = r["rule_id"]
            print(ctl_human("flow-rule", "list", "--port", "a"), flush=True)
            with open(os.path.join(JOB_A, "rules.json"), "w") as fh:
                json.dump({"move_id": move_id, "drop_id": drop_id, "target": target}, fh)
            ack(step, f"{target}\n")
        elif step == "rules":
            rules = json.load(open(os.path.join(JOB_A, "rules.json")))
            got = read_flow_lines()
            st = rss()
            lst = {r["id"]: r for r in ctl("flow-rule", "list", "--port", "a")["rules"]}
            n = flow_name("tcp", spec["move_sport"])
            rc, d = got.get(n, (None, []))
            t = rules["target"]
            if check(bool(d), f"{n}: measured"):
                best = max(range(len(d)), key=lambda i: d[i])
                check(rc == 0 and best == t and d[t] >= 0.7 * sum(d),
                      f"{n}: flow rule {rules['move_id']} moved it to queue {best} (wanted {t}, "
                      f"RSS said {predicted[n]['queue']}; deltas {d})")
            check(lst[rules["move_id"]]["hits"] > 0,
                  f"move rule hits {lst[rules['move_id']]['hits']}")
            rc, d = got.get("drop", (None, []))
            check(rc not in (None, 0), f"dropped flow: guest connect to B:5202 failed (nc rc {rc})")
            refused = "refused" in open(os.path.join(JOB_A, "out.log"), errors="replace").read()
            check(not refused, "dropped flow: timed out, not refused (B's RSTs were dropped)")
            hits = lst[rules["drop_id"]]["hits"]
            check(hits > 0 and st["rule_drops"] >= hits,
                  f"drop rule {rules['drop_id']}: {hits} hits, {st['rule_drops']} frames dropped by rules")
            f = next((f for f in st["flows"] if f["flow"].startswith(f"{B_IP}:5202-")), None)
            check(f is not None and f["queue"] is None and f["how"] == f"rule {rules['drop_id']}",
                  f"{f['flow'] if f else 'B:5202 flow'}: daemon flow table says dropped by the rule")
            print(ctl_human("rss", "--port", "a"), flush=True)
            ack(step)
    # let B finish
    open(os.path.join(JOB_B, "stop"), "w").close()
    log(f"{len(fails)} failed checks")
    return 1 if fails else 0


if __name__ == "__main__":
    try:
        rc = main()
    except Exception as e:  # report, release B, fail
        print(f"CHECK-FAIL host helper: {e!r}", flush=True)
        open(os.path.join(JOB_A, "abort"), "w").close()
        open(os.path.join(JOB_B, "stop"), "w").close()
        rc = 1
    sys.exit(rc)
