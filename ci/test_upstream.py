#!/usr/bin/env python3
"""Host-only tests of ci/upstream.py: the unittest-log parser and the expectations judge.

Run: python3 ci/test_upstream.py (scripts/test.sh runs it).
"""

import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upstream  # noqa: E402

LOG = """UPSTREAM-CASES 6
UPSTREAM-ROUND 1 cases=6
test_a (tests.test_x.XTest.test_a) ... ok
test_b (tests.test_x.XTest.test_b)
Check something with a docstring ... skipped 'Device does not support it'
test_c (tests.test_x.XTest.test_c) ... some output the test printed
FAIL
test_d (tests.test_y.YTest.test_d) ... ERROR
test_e (tests.test_y.YTest.test_e) ... UPSTREAM-END 1 rc=139
UPSTREAM-KILLED id=tests.test_y.YTest.test_e rc=139 why=python3 exited 139
UPSTREAM-ROUND 2 cases=1

======================================================================
FAIL: test_c (tests.test_x.XTest.test_c)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "x.py", line 3, in test_c
AssertionError: 1 != 2

======================================================================
ERROR: test_d (tests.test_y.YTest.test_d)
----------------------------------------------------------------------
Traceback (most recent call last):
pyverbs.pyverbs_error.PyverbsRDMAError: Failed to create CQ. Errno: 22, Invalid argument

----------------------------------------------------------------------
Ran 4 tests in 1.0s
"""


class ParseLog(unittest.TestCase):
    def test_every_verdict(self):
        res, listed = upstream.parse_log(LOG)
        self.assertEqual(listed, 6)
        self.assertEqual(res["tests.test_x.XTest.test_a"], ("pass", ""))
        self.assertEqual(res["tests.test_x.XTest.test_b"], ("skip", "Device does not support it"))
        self.assertEqual(res["tests.test_x.XTest.test_c"], ("fail", "AssertionError: 1 != 2"))
        self.assertEqual(res["tests.test_y.YTest.test_d"][0], "error")
        self.assertIn("Errno: 22", res["tests.test_y.YTest.test_d"][1])
        self.assertEqual(res["tests.test_y.YTest.test_e"], ("killed", "python3 exited 139 (rc=139)"))
        self.assertEqual(upstream.deaths(LOG), [("tests.test_y.YTest.test_e", "python3 exited 139 (rc=139)")])

    def test_a_killed_case_rerun_takes_its_new_verdict(self):
        res, _ = upstream.parse_log(LOG + "test_e (tests.test_y.YTest.test_e) ... ok\n")
        self.assertEqual(res["tests.test_y.YTest.test_e"], ("pass", ""))


KTAP = """UPSTREAM-FILE stats.py
TAP version 13
1..3
ok 1 stats.check_pause
# Check failed 1 != 2 rx_packets
not ok 2 stats.check_fec
ok 3 stats.check_rmon # SKIP no rmon stats
# Totals: pass:1 fail:1 xfail:0 xpass:0 skip:1 error:0

UPSTREAM-FILE-END stats.py rc=1
UPSTREAM-FILE hw/gro_hw.py
TAP version 13
1..2
ok 1 gro_hw.test_a # XFAIL device does not coalesce
UPSTREAM-FILE-END hw/gro_hw.py rc=124 secs=300
UPSTREAM-FILE hw/csum.py
Traceback (most recent call last):
ModuleNotFoundError: No module named 'yaml'
UPSTREAM-FILE-END hw/csum.py rc=1
UPSTREAM-FILE-NOT-RUN ping.py why=oopses the driver
"""


class ParseKtap(unittest.TestCase):
    def test_cases_files_and_timeouts(self):
        res = upstream.parse_ktap_log(KTAP)
        self.assertEqual(res["stats.check_pause"], ("pass", ""))
        self.assertEqual(res["stats.check_fec"][0], "fail")
        self.assertIn("1 != 2", res["stats.check_fec"][1])
        self.assertEqual(res["stats.check_rmon"], ("skip", "no rmon stats"))
        self.assertNotIn("stats.py", res)  # all 3 results came
        self.assertEqual(res["hw/gro_hw.test_a"][0], "pass")
        self.assertEqual(res["hw/gro_hw.py"][0], "killed")  # 1 of 2 results, then the timeout
        self.assertEqual(res["hw/csum.py"][0], "error")
        self.assertIn("rc=1", res["hw/csum.py"][1])
        self.assertEqual(res["ping.py"], ("missing", "not run: oopses the driver"))


class Judge(unittest.TestCase):
    def write(self, text):
        f = tempfile.NamedTemporaryFile("w", suffix=".expect", delete=False)
        f.write(text)
        f.close()
        self.addCleanup(os.unlink, f.name)
        return f.name

    def test_reason_is_mandatory(self):
        with self.assertRaises(upstream.ExpectError):
            upstream.load_expect(self.write("tests.test_x.* skip\n"))
        with self.assertRaises(upstream.ExpectError):
            upstream.load_expect(self.write("tests.test_x.XTest.test_a maybe because\n"))

    def test_first_match_wins_and_default_is_pass(self):
        rules = upstream.load_expect(self.write(
            "# comment\ntests.test_x.XTest.test_b fail driver bug, see docs\ntests.test_x.* skip not on this device\n"))
        self.assertEqual(upstream.expected(rules, "tests.test_x.XTest.test_b"), ("fail", "driver bug, see docs"))
        self.assertEqual(upstream.expected(rules, "tests.test_x.XTest.test_z")[0], "skip")
        self.assertEqual(upstream.expected(rules, "tests.test_q.Q.test_a"), ("pass", ""))

    def test_alternatives(self):
        rules = upstream.load_expect(self.write("tests.test_y.* error|killed varies between runs\n"))
        res, _ = upstream.parse_log(LOG)
        j = upstream.judge(res, rules)
        self.assertTrue(j["tests.test_y.YTest.test_d"]["ok"])
        self.assertTrue(j["tests.test_y.YTest.test_e"]["ok"])
        self.assertFalse(j["tests.test_x.XTest.test_b"]["ok"])  # skip, expected pass

    def test_changed_results_fail_both_ways(self):
        res, _ = upstream.parse_log(LOG)
        rules = upstream.load_expect(self.write(
            "tests.test_x.XTest.test_a fail used to fail\n"      # now passes: must fail the row
            "tests.test_x.XTest.test_b skip no such feature\n"   # as expected
            "tests.test_x.XTest.test_c fail known\n"
            "tests.test_y.YTest.test_d error known\n"
            "tests.test_y.YTest.test_e killed known crash\n"))
        listed = list(res) + ["tests.test_z.Z.test_never"]
        j = upstream.judge(res, rules, listed)
        self.assertFalse(j["tests.test_x.XTest.test_a"]["ok"])
        self.assertTrue(j["tests.test_x.XTest.test_b"]["ok"])
        self.assertTrue(j["tests.test_y.YTest.test_e"]["ok"])
        self.assertEqual(j["tests.test_z.Z.test_never"]["got"], "missing")
        self.assertFalse(j["tests.test_z.Z.test_never"]["ok"])
        rows = {r["test"]: r for r in upstream.rows({"erdma": j, "rxe": j}, ["erdma", "rxe"])}
        self.assertEqual(rows["rdma-core:test_x.XTest.test_a"]["status"], "FAIL")
        self.assertEqual(rows["rdma-core:test_x.XTest.test_b"]["status"], "PASS")
        md = upstream.table_md({"erdma": j, "rxe": j}, ["erdma", "rxe"], "t", "cmd")
        self.assertIn("| test_x.XTest.test_b | skip | skip |", md)


if __name__ == "__main__":
    unittest.main()
