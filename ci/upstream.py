"""Upstream test suites run on our devices (issue 28): results and expectations.

ci/matrix.py's `upstream-rdma` cell runs rdma-core's own `tests/` (pyverbs,
unmodified, as packaged with the guest's rdma-core) on the emulated erdma
function in one guest and on rdma_rxe in the other (the baseline). This
module turns each guest's unittest log into one result per upstream case and
judges it against a committed expectations file per suite and device:

    ci/upstream/rdma-core-erdma.expect
    ci/upstream/rdma-core-rxe.expect

A line there is `PATTERN STATUS REASON`: PATTERN a case id or an fnmatch
pattern of ids (the first matching line wins, so exact ids go first),
STATUS one of pass, fail, error, skip, killed, missing (or several joined by
`|` for a case whose outcome varies between runs, e.g. `pass|killed`), and
REASON why (mandatory for anything but pass). A case no line matches is expected to
pass. A case whose result differs from its expectation fails the cell, so a
case that starts passing fails too until its line is removed: the file stays
the true list of what does not pass, and why.

Python 3 standard library only.
"""

import fnmatch
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECT_DIR = os.path.join(HERE, "upstream")
STATUSES = ("pass", "fail", "error", "skip", "killed", "missing")

# "name (tests.mod.Class.name)" starts a case; unittest -v prints " ... RESULT"
# on that line, or on the docstring's line below it.
START_RE = re.compile(r"^(\S+) \((tests\.[^)\s]+)\)(?: \.\.\. (.*))?$")
DOC_RESULT_RE = re.compile(r"^.* \.\.\. (.*)$")
RESULT_RE = re.compile(r"^(ok|FAIL|ERROR|expected failure|unexpected success|skipped (.*))$")
SECTION_RE = re.compile(r"^(FAIL|ERROR): \S+ \((tests\.[^)\s]+)\)")
KILLED_RE = re.compile(r"^UPSTREAM-KILLED id=(\S+) rc=(-?\d+) why=(.*)$")
CASES_RE = re.compile(r"^UPSTREAM-CASES (\d+)$")


class ExpectError(ValueError):
    pass


def _result(token):
    """unittest's verdict word -> (status, detail)."""
    m = RESULT_RE.match(token.strip())
    if not m:
        return None
    word = m.group(1)
    if word == "ok":
        return "pass", ""
    if word == "FAIL":
        return "fail", ""
    if word == "ERROR":
        return "error", ""
    if word == "expected failure":
        return "pass", "expected failure"
    if word == "unexpected success":
        return "fail", "unexpected success"
    return "skip", m.group(2).strip().strip("'\"")


def parse_log(text):
    """One guest's rdma-core.ROLE.log -> ({case id: (status, detail)}, number of cases listed or None).

    Cases that started but printed no verdict are "killed" (with the
    UPSTREAM-KILLED line's reason when the guest wrote one); cases the
    traceback sections name FAIL/ERROR take that verdict and its last line.
    """
    lines = text.splitlines()
    res, listed, killed = {}, None, {}
    pending = None  # case id waiting for its verdict
    for line in lines:
        m = CASES_RE.match(line)
        if m:
            listed = int(m.group(1))
            continue
        m = KILLED_RE.match(line)
        if m:
            killed[m.group(1)] = f"{m.group(3)} (rc={m.group(2)})"
            pending = None
            continue
        m = START_RE.match(line)
        if m:
            cid, rest = m.group(2), m.group(3)
            res.setdefault(cid, ("killed", "started, no verdict"))
            pending = cid
            if rest is not None:
                r = _result(rest)
                if r:
                    res[cid], pending = r, None
            continue
        if pending is None:
            continue
        r = _result(line)
        if r is None:
            m = DOC_RESULT_RE.match(line)
            if m:
                r = _result(m.group(1))
        if r:
            res[pending], pending = r, None
    # traceback sections: the error's last line says what went wrong
    for i, line in enumerate(lines):
        m = SECTION_RE.match(line)
        if not m:
            continue
        cid = m.group(2)
        # header, a "-----" rule, the traceback, a blank line; its last line is the exception
        msg, in_tb = "", False
        for nxt in lines[i + 1:]:
            if nxt.startswith("-" * 20):
                if in_tb:
                    break
                in_tb = True
                continue
            if nxt.startswith("=" * 20):
                break
            if in_tb and nxt.strip():
                msg = nxt.strip()
        res[cid] = ("fail" if m.group(1) == "FAIL" else "error", msg[:300])
    for cid, why in killed.items():
        if cid in res and res[cid][0] == "killed":
            res[cid] = ("killed", why)
    return res, listed


KTAP_RE = re.compile(r"^(not )?ok (\d+) (\S+)(?: # (.*))?$")
FILE_RE = re.compile(r"^UPSTREAM-FILE (\S+)$")
# "secs=" (the file's wall time in the guest) is optional: older logs lack it
FILE_END_RE = re.compile(r"^UPSTREAM-FILE-END (\S+) rc=(-?\d+)(?: secs=\d+)?$")
FILE_NOT_RUN_RE = re.compile(r"^UPSTREAM-FILE-NOT-RUN (\S+) why=(.*)$")
PLAN_RE = re.compile(r"^1\.\.(\d+)$")


def parse_ktap_log(text):
    """The NIC suite's log (kselftest KTAP per file, between UPSTREAM-FILE and
    UPSTREAM-FILE-END lines) -> {case id: (status, detail)}.

    A case id is the file's directory prefix ("hw/" or none) and the name
    KTAP prints ("hw/rss_ctx.test_rss_key_indir"). "ok ... # SKIP why" is a
    skip, "# XFAIL" a pass (an expected failure the suite itself allows),
    "not ok" a fail with the nearest "# " comment lines above as detail. A
    file that printed fewer results than its plan, or none, adds the case
    "FILE" (e.g. "hw/gro_hw.py") as killed (its timeout) or error; a file
    the guest did not run adds it as missing with the guest's reason.
    """
    res, cur, prefix, plan, seen, notes, last = {}, None, "", None, 0, [], ""
    for line in text.splitlines():
        m = FILE_RE.match(line)
        if m:
            cur, plan, seen, notes, last = m.group(1), None, 0, [], ""
            prefix = cur.rsplit("/", 1)[0] + "/" if "/" in cur else ""
            continue
        m = FILE_NOT_RUN_RE.match(line)
        if m:
            res[m.group(1)] = ("missing", f"not run: {m.group(2)}")
            continue
        m = FILE_END_RE.match(line)
        if m and cur:
            rc = int(m.group(2))
            if plan is None or seen < plan:
                why = (f"stopped by its timeout (rc={rc})" if rc in (124, 137)
                       else f"exited rc={rc} after {seen} of {plan if plan is not None else '?'} results")
                res[cur] = ("killed" if rc in (124, 137) else "error", why + (f": {last}" if last else ""))
            cur = None
            continue
        if cur is None:
            continue
        if line.strip():
            last = line.strip()[:200]
        m = PLAN_RE.match(line.strip())
        if m and plan is None:
            plan = int(m.group(1))
            continue
        m = KTAP_RE.match(line.strip())
        if m:
            seen += 1
            cid = prefix + m.group(3)
            comment = (m.group(4) or "").strip()
            if comment.startswith("SKIP"):
                res[cid] = ("skip", comment[4:].strip(" :") or "skipped")
            elif comment.startswith("XFAIL"):
                res[cid] = ("pass", "XFAIL " + comment[5:].strip(" :"))
            elif m.group(1):
                detail = " | ".join(n for n in notes[-3:] if n)
                res[cid] = ("fail", (comment + " " + detail).strip()[:300])
            else:
                res[cid] = ("pass", "")
            notes = []
            continue
        if line.startswith("# "):
            notes.append(line[2:].strip())
            notes = notes[-6:]
    return res


def deaths(text):
    """[(case id, why)] of every python3 process death the guest recorded (UPSTREAM-KILLED lines)."""
    return [(m.group(1), f"{m.group(3)} (rc={m.group(2)})")
            for m in (KILLED_RE.match(ln) for ln in text.splitlines()) if m]


def load_expect(path):
    """[(pattern, status, reason)] from an expectations file; ExpectError on a bad line."""
    rules = []
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split(None, 2)
            if len(parts) < 2 or not all(s in STATUSES for s in parts[1].split("|")):
                raise ExpectError(f"{path}:{n}: want 'PATTERN STATUS REASON', STATUS one of {', '.join(STATUSES)}")
            reason = parts[2].strip() if len(parts) > 2 else ""
            if parts[1] != "pass" and not reason:
                raise ExpectError(f"{path}:{n}: {parts[0]} is expected to {parts[1]} but gives no reason")
            rules.append((parts[0], parts[1], reason))
    return rules


def expected(rules, cid):
    """(status, reason) the expectations give case `cid` (pass when no rule matches)."""
    for pat, status, reason in rules:
        if pat == cid or fnmatch.fnmatchcase(cid, pat):
            return status, reason
    return "pass", ""


def judge(results, rules, all_cases=None):
    """{case: (status, detail)} against the rules -> {case: dict(got, detail, want, reason, ok)}.

    all_cases: every case id the suite listed; those with no result are "missing".
    """
    cases = set(results) | set(all_cases or ())
    out = {}
    for cid in sorted(cases):
        got, detail = results.get(cid, ("missing", "never started"))
        want, reason = expected(rules, cid)
        out[cid] = {"got": got, "detail": detail, "want": want, "reason": reason, "ok": got in want.split("|")}
    return out


def case_name(cid):
    """How tables and rows name a case: rdma-core ids without their "tests." package."""
    return cid[len("tests."):] if cid.startswith("tests.") else cid


def rows(judged, devices, prefix="rdma-core"):
    """Matrix rows (one per case) from {device: judged}: PASS when every device gave what its file expects."""
    out = []
    cases = sorted(set().union(*(j.keys() for j in judged.values())))
    for cid in cases:
        bad, parts = [], []
        for dev in devices:
            j = judged[dev].get(cid)
            if j is None:
                bad.append(f"{dev}: no result")
                continue
            parts.append(f"{dev} {j['got']}")
            if not j["ok"]:
                bad.append(f"{dev}: got {j['got']} ({j['detail'] or '-'}), expected {j['want']}"
                           + (f" ({j['reason']})" if j["reason"] else ""))
        out.append({"test": f"{prefix}:{case_name(cid)}", "status": "FAIL" if bad else "PASS",
                    "secs": 0, "bw": "", "detail": "; ".join(bad) if bad else ", ".join(parts)})
    return out


def table_md(judged, devices, title, command, notes=()):
    """The committed table: case, one column per device, reason; `notes` are lines printed above it."""
    cases = sorted(set().union(*(j.keys() for j in judged.values())))
    counts = {d: {s: sum(1 for j in judged[d].values() if j["got"] == s) for s in STATUSES} for d in devices}
    out = [f"# {title}", "", f"Command: `{command}`", ""]
    for d in devices:
        c = counts[d]
        out.append(f"- {d}: " + ", ".join(f"{c[s]} {s}" for s in STATUSES if c[s]))
    out += [f"- {n}" for n in notes]
    out += ["", "| case | " + " | ".join(devices) + " | reason |", "|---|" + "---|" * len(devices) + "---|"]
    for cid in cases:
        cells, reasons = [], []
        for d in devices:
            j = judged[d].get(cid)
            if j is None:
                cells.append("-")
                continue
            mark = j["got"] if j["ok"] else f"**{j['got']}** (expected {j['want']})"
            cells.append(mark)
            why = j["reason"] or (j["detail"] if j["got"] == "skip" else "")
            if why and why not in reasons:
                reasons.append(f"{d}: {why}" if len(devices) > 1 and j["got"] != "pass" else why)
        out.append(f"| {case_name(cid)} | " + " | ".join(cells) + " | "
                   + "; ".join(r.replace("|", "\\|") for r in reasons) + " |")
    return "\n".join(out) + "\n"
