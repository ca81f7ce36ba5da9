#!/usr/bin/env python3
"""JUnit XML from the project's test output (Python 3 standard library only).

Used by scripts/test.sh --junit and ci/matrix.sh --junit. Inputs, each SUITE=PATH:

  --records SUITE=LOG   result records, one per test, as scripts/lib-e2e.sh and
                        the check scripts print them at the start of a line:
                            PASS NAME: detail | FAIL NAME: detail | SKIPPED NAME: detail
                        (a later record of the same NAME replaces an earlier one:
                        lib-e2e.sh repeats every record in its closing summary)
  --libtest SUITE=LOG   `cargo test` output: one case per "test NAME ... ok|FAILED|ignored"
                        line, the class being the test binary ("Running ... (deps/NAME-hash)");
                        a failure carries its "---- NAME stdout ----" section
  --merge PATH          the <testsuite>s of another JUnit file (ci/matrix.sh's)

    scripts/junit.py --out FILE [--name NAME] [inputs...]

prints "junit: FILE: N cases (P passed, F failed, S skipped)". In Python:
Case, parse_records, parse_libtest, write.
"""

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass

RECORD_RE = re.compile(r"^(PASS|FAIL|SKIPPED|SKIP)\s+(\S.*?)(?::\s+(.*))?\s*$")
LIBTEST_RE = re.compile(r"^test (.+?)(?: - should panic)? \.\.\. (ok|FAILED|ignored)(?:, (.*))?\s*$")
RUNNING_RE = re.compile(r"^\s*Running (?:unittests )?(\S+)(?: \((?:.*/)?([^/]+?)(?:-[0-9a-f]{16})?\))?\s*$")
SUMMARY_RE = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) skipped)?")
# characters XML 1.0 cannot carry (terminal escapes, NULs in guest consoles)
BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Case:
    suite: str
    name: str
    status: str  # PASS | FAIL | SKIP
    detail: str = ""
    secs: float = 0.0
    output: str = ""


def clean(s):
    return BAD_XML.sub("?", ANSI.sub("", s))


def parse_records(text, suite):
    """Cases from PASS/FAIL/SKIPPED record lines; the last record of a name wins."""
    cases = {}
    for line in text.splitlines():
        m = RECORD_RE.match(clean(line))
        if m:
            st = {"SKIPPED": "SKIP"}.get(m.group(1), m.group(1))
            cases[m.group(2)] = Case(suite, m.group(2), st, m.group(3) or "")
    return list(cases.values())


def summary_counts(text):
    """(passed, failed, skipped) of the last "N passed, M failed, K skipped" line, or None."""
    last = None
    for line in text.splitlines():
        m = SUMMARY_RE.match(line)
        if m:
            last = (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))
    return last


def parse_libtest(text, suite):
    """Cases from `cargo test` output, classed by test binary."""
    cases, binary = [], suite
    for line in text.splitlines():
        line = clean(line)
        m = RUNNING_RE.match(line)
        if m and ("/" in m.group(1) or m.group(2)):
            binary = f"{suite}.{m.group(2) or m.group(1)}"
            continue
        if line.startswith("   Doc-tests "):
            binary = f"{suite}.doc-{line.split()[-1]}"
            continue
        m = LIBTEST_RE.match(line)
        if m:
            st = {"ok": "PASS", "FAILED": "FAIL", "ignored": "SKIP"}[m.group(2)]
            cases.append(Case(binary, m.group(1), st, m.group(3) or ""))
    # the captured output of failed tests: "---- NAME stdout ----" up to the next section
    sections = re.split(r"^---- (\S+) stdout ----$", clean(text), flags=re.M)
    out = {sections[i]: sections[i + 1].split("\nfailures:\n")[0].strip()
           for i in range(1, len(sections) - 1, 2)}
    for c in cases:
        if c.status == "FAIL":
            c.output = out.get(c.name, "")
    return cases


def write(cases, path, name="vhost-rdma", merged=()):
    """Writes <testsuites> with one <testsuite> per suite (in first-seen order)
    plus the <testsuite> elements of `merged`."""
    root = ET.Element("testsuites", name=name)
    suites = {}
    for c in cases:
        suites.setdefault(c.suite, []).append(c)
    for sname, cs in suites.items():
        ts = ET.SubElement(root, "testsuite", name=sname, tests=str(len(cs)),
                           failures=str(sum(c.status == "FAIL" for c in cs)),
                           skipped=str(sum(c.status == "SKIP" for c in cs)), errors="0",
                           time=f"{sum(c.secs for c in cs):.3f}")
        for c in cs:
            tc = ET.SubElement(ts, "testcase", classname=sname, name=clean(c.name), time=f"{c.secs:.3f}")
            if c.status == "FAIL":
                f = ET.SubElement(tc, "failure", message=clean(c.detail)[:1000] or "failed")
                f.text = clean(c.output or c.detail)
            elif c.status == "SKIP":
                ET.SubElement(tc, "skipped", message=clean(c.detail)[:1000])
            elif c.output:
                ET.SubElement(tc, "system-out").text = clean(c.output)
    for ts in merged:
        root.append(ts)
    n = {s: sum(1 for c in cases if c.status == s) for s in ("PASS", "FAIL", "SKIP")}
    for ts in merged:
        for tc in ts.iter("testcase"):
            st = "FAIL" if tc.find("failure") is not None or tc.find("error") is not None else \
                "SKIP" if tc.find("skipped") is not None else "PASS"
            n[st] += 1
    root.set("tests", str(sum(n.values())))
    root.set("failures", str(n["FAIL"]))
    root.set("skipped", str(n["SKIP"]))
    ET.indent(root) if hasattr(ET, "indent") else None
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    return n


def _suite_path(arg):
    if "=" not in arg:
        raise argparse.ArgumentTypeError(f"{arg!r}: want SUITE=PATH")
    return tuple(arg.split("=", 1))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="scripts/junit.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--name", default="vhost-rdma")
    ap.add_argument("--records", type=_suite_path, action="append", default=[], metavar="SUITE=LOG")
    ap.add_argument("--libtest", type=_suite_path, action="append", default=[], metavar="SUITE=LOG")
    ap.add_argument("--merge", action="append", default=[], metavar="JUNIT")
    a = ap.parse_args(argv)
    cases, merged = [], []
    # inputs in command-line order would need one list; records first, then
    # cargo, then merged files is the order test.sh runs them in
    for suite, path in a.records:
        text = open(path, errors="replace").read()
        got = parse_records(text, suite)
        want = summary_counts(text)
        have = tuple(sum(1 for c in got if c.status == s) for s in ("PASS", "FAIL", "SKIP"))
        if want is not None and want != have:
            print(f"junit: {suite}: the summary says {want[0]}/{want[1]}/{want[2]} passed/failed/skipped "
                  f"but its records are {have[0]}/{have[1]}/{have[2]}", file=sys.stderr)
        cases += got
    for suite, path in a.libtest:
        cases += parse_libtest(open(path, errors="replace").read(), suite)
    for path in a.merge:
        try:
            merged += list(ET.parse(path).getroot().iter("testsuite"))
        except (OSError, ET.ParseError) as e:
            cases.append(Case("junit", f"merge {path}", "FAIL", f"cannot read {path}: {e}"))
    n = write(cases, a.out, a.name, merged)
    print(f"junit: {a.out}: {sum(n.values())} cases ({n['PASS']} passed, {n['FAIL']} failed, "
          f"{n['SKIP']} skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
