#!/usr/bin/env python3
"""Self-test of ci/plot.py on sample tables (no benchmark, no guest).

Prints PASS/FAIL/SKIPPED per test and "N passed, M failed, K skipped"
(scripts/test.sh counts it); without matplotlib the PNG tests are SKIPPED
loudly, the table parsing is tested anyway.

    python3 ci/test_plot.py
"""

import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import plot  # noqa: E402

SMC = """# SMC-R vs TCP

text before the table

| conns | proto | MiB/s | tool CPU s/GiB (client / server) | client usr/sys/softirq ticks s | secs | mode |
|---|---|---|---|---|---|---|
| 1 | smc | 212.40 | 1.20 / 0.90 | 1/2/3 | 0.6 | SMCR |
| 1 | tcp | 98.10 | 2.20 / 1.90 | 1/2/3 | 1.3 | - |
| 1 | **SMC/TCP** | 2.17 | 0.55 / 0.47 | | | |
| 4 | tcp **FAIL** | ? | ? / ? | ?/?/? | ? | - |

| second | table |
|---|---|
| x | 1 |
"""
FABRIC = """| streams | vhost-rdma daemon (pci, 1q) Mbit/s (retr) | QEMU -netdev stream Mbit/s (retr) | ratio daemon/stream |
|---|---|---|---|
| 1 (-P 1) | 1234 (5) | 1300 (0) | 0.95 |
| 4 (-P 4) | FAILED | 2000 (-) | - |
"""


def png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def run_plot(*args):
    return subprocess.run([sys.executable, os.path.join(HERE, "plot.py"), *args], capture_output=True, text=True)


class Parse(unittest.TestCase):
    def test_smc_table(self):
        ts = plot.tables(SMC)
        self.assertEqual(len(ts), 2)
        labels, cols = plot.series(ts[0])
        self.assertEqual(labels, ["1 smc", "1 tcp", "4 tcp FAIL"])  # ratio row left out
        self.assertEqual([n for n, _ in cols], ["MiB/s", "tool CPU s/GiB (client)", "tool CPU s/GiB (server)", "secs"])
        self.assertEqual(cols[0][1], [212.4, 98.1, None])
        self.assertEqual(cols[2][1], [0.9, 1.9, None])

    def test_notes_and_gaps(self):
        labels, cols = plot.series(plot.tables(FABRIC)[0])
        self.assertEqual(labels, ["1 (-P 1)", "4 (-P 4)"])
        self.assertEqual(dict(cols)["vhost-rdma daemon (pci, 1q) Mbit/s (retr)"], [1234.0, None])
        self.assertEqual(dict(cols)["ratio daemon/stream"], [0.95, None])


HAVE_PLOT = run_plot("--help").returncode == 0 and run_plot(os.devnull, os.devnull).returncode != 3


class Png(unittest.TestCase):
    def setUp(self):
        if not HAVE_PLOT:
            self.skipTest("matplotlib is not installed (python3-matplotlib): no PNG can be drawn")
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_bar_chart(self):
        open(f"{self.d}/t.md", "w").write(SMC)
        r = run_plot(f"{self.d}/t.md", f"{self.d}/t.png", "--title", "SMC-R vs TCP")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("3 rows x 4 columns", r.stdout)
        w, h = png_size(f"{self.d}/t.png")
        self.assertGreater(w, 300)
        self.assertGreater(h, 200)

    def test_second_table_and_missing_table(self):
        open(f"{self.d}/t.md", "w").write(SMC)
        self.assertEqual(run_plot(f"{self.d}/t.md", f"{self.d}/2.png", "--table", "2").returncode, 0)
        r = run_plot(f"{self.d}/t.md", f"{self.d}/3.png", "--table", "3")
        self.assertEqual(r.returncode, 1)
        self.assertFalse(os.path.exists(f"{self.d}/3.png"))

    def test_csv_line_chart(self):
        open(f"{self.d}/rss.csv", "w").write("wall_s,soak_s,vmrss_kib\n0.0,,1000\n5.0,0.0,1100\n10.0,5.0,1090\n")
        r = run_plot("--csv", f"{self.d}/rss.csv", f"{self.d}/rss.png", "--x", "wall_s", "--y", "vmrss_kib")
        self.assertEqual(r.returncode, 0, r.stderr)
        png_size(f"{self.d}/rss.png")


class Records(unittest.TextTestResult):
    """Prints one record line per test (the format scripts/test.sh counts)."""

    def addSuccess(self, test):
        super().addSuccess(test)
        print(f"PASS {test.id()}: ok", flush=True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        print(f"FAIL {test.id()}: {err[1]}", flush=True)

    def addError(self, test, err):
        super().addError(test, err)
        print(f"FAIL {test.id()}: error {err[1]!r}", flush=True)

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        print(f"SKIPPED {test.id()}: {reason}", flush=True)


if __name__ == "__main__":
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    res = unittest.TextTestRunner(resultclass=Records, verbosity=0).run(suite)
    nf = len(res.failures) + len(res.errors)
    print(f"{res.testsRun - nf - len(res.skipped)} passed, {nf} failed, {len(res.skipped)} skipped")
    sys.exit(1 if nf else 0)
