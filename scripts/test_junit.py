#!/usr/bin/env python3
"""Self-test of scripts/junit.py and ci/matrix.py --junit (no cargo, no guests).

    python3 scripts/test_junit.py      # part of scripts/test.sh
"""

import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "ci"))
import junit  # noqa: E402
import matrix  # noqa: E402

E2E_LOG = """[e2e-vhost] logs: /tmp/x
PASS ping: 3/3 replies
FAIL ib_write_bw: rc=1 \x1b[31mtimeout\x1b[0m
SKIPPED rping: no rdma_cm in this kernel
noise PASS not-a-record: at line start only

== e2e-vhost summary
PASS ping: 3/3 replies
FAIL ib_write_bw: rc=1 timeout
SKIPPED rping: no rdma_cm in this kernel
3 cases: 1 passed, 1 failed, 1 skipped
1 passed, 1 failed, 1 skipped
"""

CARGO_LOG = """   Compiling pci-model v0.1.0
     Running unittests src/lib.rs (/t/debug/deps/pci_model-0123456789abcdef)

running 3 tests
test bar::parses ... ok
test bar::breaks ... FAILED
test slow ... ignored, needs a guest

failures:

---- bar::breaks stdout ----
thread 'bar::breaks' panicked at src/bar.rs:9:5:
assertion `left == right` failed

failures:
    bar::breaks

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out

     Running tests/vhost_user.rs (/t/debug/deps/vhost_user-fedcba9876543210)

running 1 test
test connects ... ok

test result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out

   Doc-tests pci_model

running 1 test
test pci-model/src/lib.rs - Bar (line 3) ... ok
"""


def cases_of(path):
    """(classname, name, status) of every testcase in a JUnit file."""
    out = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        st = "FAIL" if tc.find("failure") is not None else "SKIP" if tc.find("skipped") is not None else "PASS"
        out.append((tc.get("classname"), tc.get("name"), st))
    return out


class JunitTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_records_last_wins_and_statuses(self):
        cs = junit.parse_records(E2E_LOG, "e2e-vhost")
        self.assertEqual([(c.name, c.status) for c in cs],
                         [("ping", "PASS"), ("ib_write_bw", "FAIL"), ("rping", "SKIP")])
        self.assertEqual(cs[1].detail, "rc=1 timeout")
        self.assertEqual(junit.summary_counts(E2E_LOG), (1, 1, 1))

    def test_record_name_with_spaces(self):
        cs = junit.parse_records("PASS cargo fmt --check: ok\nFAIL no import cycles\n", "s")
        self.assertEqual([(c.name, c.status, c.detail) for c in cs],
                         [("cargo fmt --check", "PASS", "ok"), ("no import cycles", "FAIL", "")])

    def test_libtest(self):
        cs = junit.parse_libtest(CARGO_LOG, "cargo")
        self.assertEqual([(c.suite, c.name, c.status) for c in cs], [
            ("cargo.pci_model", "bar::parses", "PASS"), ("cargo.pci_model", "bar::breaks", "FAIL"),
            ("cargo.pci_model", "slow", "SKIP"), ("cargo.vhost_user", "connects", "PASS"),
            ("cargo.doc-pci_model", "pci-model/src/lib.rs - Bar (line 3)", "PASS")])
        self.assertIn("assertion `left == right` failed", cs[1].output)
        self.assertNotIn("bar::parses", cs[1].output)

    def test_cli_writes_one_case_per_test_and_merges(self):
        open(f"{self.d}/e2e.log", "w").write(E2E_LOG + "\x00")
        open(f"{self.d}/cargo.log", "w").write(CARGO_LOG)
        other = f"{self.d}/other.xml"
        junit.write([junit.Case("matrix.7.3/rxe", "ping", "PASS"), junit.Case("matrix.7.3/rxe", "rping", "SKIP")],
                    other)
        out = f"{self.d}/all.xml"
        r = subprocess.run([sys.executable, os.path.join(HERE, "junit.py"), "--out", out,
                            "--records", f"e2e-vhost={self.d}/e2e.log", "--libtest", f"cargo={self.d}/cargo.log",
                            "--merge", other], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("10 cases (5 passed, 2 failed, 3 skipped)", r.stdout)
        cs = cases_of(out)
        self.assertEqual(len(cs), 10)
        self.assertIn(("e2e-vhost", "ib_write_bw", "FAIL"), cs)
        self.assertIn(("matrix.7.3/rxe", "rping", "SKIP"), cs)
        root = ET.parse(out).getroot()
        self.assertEqual((root.get("tests"), root.get("failures"), root.get("skipped")), ("10", "2", "3"))
        fail = next(tc for tc in root.iter("testcase") if tc.get("name") == "bar::breaks").find("failure")
        self.assertIn("panicked", fail.text)

    def test_summary_mismatch_is_reported(self):
        open(f"{self.d}/x.log", "w").write("PASS a: ok\n2 passed, 0 failed, 0 skipped\n")
        r = subprocess.run([sys.executable, os.path.join(HERE, "junit.py"), "--out", f"{self.d}/x.xml",
                            "--records", f"x={self.d}/x.log"], capture_output=True, text=True)
        self.assertIn("the summary says 2/0/0", r.stderr)

    def test_unreadable_merge_is_a_failure(self):
        bad = f"{self.d}/bad.xml"
        open(bad, "w").write("<testsuites><testsuite>")
        subprocess.run([sys.executable, os.path.join(HERE, "junit.py"), "--out", f"{self.d}/o.xml",
                        "--merge", bad], check=True, capture_output=True)
        self.assertEqual([s for *_, s in cases_of(f"{self.d}/o.xml")], ["FAIL"])

    def test_matrix_junit(self):
        results = [{"kernel": "7.3", "cell": "rxe", "tests": [
            {"test": "ibv_rc_pingpong", "status": "PASS", "secs": 12, "bw": "", "detail": ""},
            {"test": "ib_write_bw", "status": "FAIL", "secs": 3, "bw": "5.1", "detail": "server rc=1"}]},
            {"kernel": "7.3", "cell": "smcr", "tests": [
                {"test": "tshark", "status": "SKIP", "secs": 0, "bw": "", "detail": "--no-capture"}]}]
        out = f"{self.d}/m.xml"
        matrix.write_junit(results, out)
        self.assertEqual(cases_of(out), [("matrix.7.3/rxe", "ibv_rc_pingpong", "PASS"),
                                         ("matrix.7.3/rxe", "ib_write_bw", "FAIL"),
                                         ("matrix.7.3/smcr", "tshark", "SKIP")])
        tc = list(ET.parse(out).getroot().iter("testcase"))
        self.assertEqual(tc[0].get("time"), "12.000")
        self.assertIn("5.1 MiB/s", tc[1].find("failure").get("message"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
