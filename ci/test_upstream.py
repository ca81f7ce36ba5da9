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
