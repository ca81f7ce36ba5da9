#!/usr/bin/env python3
"""Host-only self-test of ci/matrix.py's stuck-guest diagnosis (no QEMU, no
daemon): a fake `vhost-rdma ctl`, a fake QEMU human monitor on a unix
socket, and real processes standing in for a spinning and an idle QEMU.
Also --shard I/N and --combine (the cell plan and result records, no guest),
the calls of scripts/guest-results (the verdicts themselves: guest-results/tests/),
and the bring-your-own-kernel option (--kernel PATH, --append) of
scripts/run-guests, ci/matrix.sh and scripts/demo.sh: the image checks and
the options reaching QEMU's command line (run-guests --dry-run), no guest.

    python3 ci/test_matrix.py      # part of scripts/test.sh
"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import matrix  # noqa: E402

# A text symbol table as /proc/kallsyms shows it (types t/T are kept).
KALLSYMS = """ffffffff81000000 T _text
ffffffff81000100 T queued_spin_lock_slowpath
ffffffff81000200 t _raw_spin_lock_irqsave
ffffffff81000300 t check_type_state.constprop.0
ffffffff81000400 T rxe_rcv
ffffffff81000500 d some_data
ffffffff81000600 T udp_queue_rcv_one_skb
ffffffff81000700 T __local_bh_enable_ip
"""

FAKE_CTL = """#!/usr/bin/env python3
import json, os, sys
n_file = os.path.join(os.path.dirname(sys.argv[0]), "calls")
n = int(open(n_file).read()) if os.path.exists(n_file) else 0
open(n_file, "w").write(str(n + 1))
if "status" in sys.argv:
    print(json.dumps({"ports": [
        {"name": "a", "rx_frames": 10, "rx_drops": 0, "tx_frames": 5},
        {"name": "b", "rx_frames": 3, "rx_drops": 7 * n, "tx_frames": 1},
        {"name": "b1", "rx_frames": 3, "rx_drops": 0, "tx_frames": 1},
        {"name": "bb", "rx_frames": 0, "rx_drops": 999 * n, "tx_frames": 0}]}))
elif "flows" in sys.argv:
    print(json.dumps({"roce": [], "iwarp": [], "smc": []}))
else:
    sys.exit(1)
"""


class FakeMonitor(threading.Thread):
    """Answers `info registers` with a RIP inside queued_spin_lock_slowpath and
    `x /256gx` with a stack holding return addresses and data words."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(1)

    def run(self):
        conn, _ = self.srv.accept()
        self.srv.close()
        with conn:
            conn.sendall(b"QEMU 11.1.3 monitor - type 'help' for more information\r\n(qemu) ")
            buf = b""
            while True:
                data = conn.recv(4096)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.startswith(b"info registers"):
                        out = (b"info registers\r\nRAX=0000000000000000 RBX=0000000000000001\r\n"
                               b"RSI=0 RDI=0 RBP=0 RSP=ffffc90000001000\r\n"
                               b"R8 =0\r\nRIP=ffffffff81000123 RFL=00000002\r\n")
                    elif line.startswith(b"x /256gx 0xffffc90000001000"):
                        # the IRQ stack: the softirq's frames, then the saved task stack pointer
                        out = (b"x /256gx 0xffffc90000001000\r\n"
                               b"ffffc90000001000: 0xffffffff8100022d 0x0000000000000007\r\n"
                               b"ffffc90000001010: 0xffffffff81000349 0xffff888003c1a000\r\n"
                               b"ffffc90000001020: 0xffffffff810004be 0xffffffff8100069b\r\n"
                               b"ffffc90000001030: 0xffffc90000001100 0xffffc90000208e40\r\n")
                    elif line.startswith(b"x /256gx 0xffffc90000208e40"):
                        out = (b"x /256gx 0xffffc90000208e40\r\n"
                               b"ffffc90000208e40: 0xffffffff81000710 0x0000000000000000\r\n"
                               b"ffffc90000208e50: 0xffffffff81000421 0xffffffff81000105\r\n")
                    else:
                        out = b"unknown command\r\n"
                    conn.sendall(out + b"(qemu) ")


class StuckGuestTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.d = self.tmp.name
        self.ctl = os.path.join(self.d, "fakectl")
        with open(self.ctl, "w") as f:
            f.write(FAKE_CTL)
        os.chmod(self.ctl, 0o755)
        os.makedirs(os.path.join(self.d, "b.job"))
        with open(os.path.join(self.d, "b.job", "kallsyms"), "w") as f:
            f.write(KALLSYMS)
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.kill()
            p.wait()
        self.tmp.cleanup()

    def qemu_stand_in(self, busy):
        code = "while True: pass" if busy else "import time; time.sleep(60)"
        p = subprocess.Popen([sys.executable, "-c", code])
        self.procs.append(p)
        return p.pid

    def run_watch(self, silence, grace, window, stop_guests=lambda: None):
        """Runs StuckGuestWatch to its end (at most 30 s) over the consoles in self.d."""
        watch = matrix.ConsoleWatch(self.d, False)
        watch.start()
        s = matrix.StuckGuestWatch(watch, self.d, self.ctl, silence=silence, grace=grace, window=window)
        s.stop_guests = stop_guests
        s.start()
        s.join(30)
        watch.stop()
        return s.diagnosis or ""

    def write_consoles(self, a_text):
        with open(os.path.join(self.d, "a.console.log"), "w") as f:
            f.write(a_text)
        open(os.path.join(self.d, "b.console.log"), "w").close()

    def test_barrier_abort_names_the_spinning_function_and_stops(self):
        pid = self.qemu_stand_in(busy=True)
        with open(os.path.join(self.d, "run-guests.log"), "w") as f:
            f.write(f"run-guests: started a (pid {os.getpid()}), console: x\n"
                    f"run-guests: started b (pid {pid}), console: y\n")
        FakeMonitor(os.path.join(self.d, "b.mon")).start()
        self.write_consoles("CI-ABORT barrier=5 label=smc-stream done\n")
        stopped = []
        diag = self.run_watch(1000, 0.5, 2, lambda: stopped.append(True))
        self.assertEqual(stopped, [True], "the guests were not stopped")
        self.assertIn("guest b never reached barrier 'smc-stream done' (a gave up)", diag)
        self.assertIn("stopped inside its kernel", diag)
        self.assertIn("queued_spin_lock_slowpath (20/20)", diag)
        self.assertIn("stack scan: _raw_spin_lock_irqsave+0x2d < check_type_state.constprop.0+0x49 < "
                      "rxe_rcv+0xbe < udp_queue_rcv_one_skb+0x9b;", diag)
        # the word 0xffffc90000001100 is on the same stack (< 16 KiB away): not followed
        self.assertIn("below it (saved stack pointer 0xffffc90000208e40): __local_bh_enable_ip+0x10 < "
                      "rxe_rcv+0x21 < queued_spin_lock_slowpath+0x5", diag)
        # port b and its second NIC b1 are the guest's; "bb" is another guest's port
        self.assertIn("port b: +0 frames into the guest, +7 dropped", diag)
        self.assertIn("port b1:", diag)
        self.assertNotIn("port bb", diag)
        self.assertNotIn("guest a", diag.split(":", 1)[1])
        self.assertTrue(os.path.exists(os.path.join(self.d, "stuck-flows.json")))

    def test_silence_diagnoses_both_guests_and_idle_is_not_a_spin(self):
        pid_a, pid_b = self.qemu_stand_in(busy=False), self.qemu_stand_in(busy=False)
        with open(os.path.join(self.d, "run-guests.log"), "w") as f:
            f.write(f"run-guests: started a (pid {pid_a})\nrun-guests: started b (pid {pid_b})\n")
        self.write_consoles("")
        diag = self.run_watch(1, 0, 1)
        self.assertIn("neither guest printed a line for 1 s", diag)
        self.assertIn("guest a idle (waiting for something)", diag)
        self.assertIn("guest b idle", diag)
        self.assertIn("no RIP samples (no monitor socket)", diag)
        self.assertNotIn("stopped inside its kernel", diag)

    def test_a_cell_that_ends_is_left_alone(self):
        self.write_consoles("CI-TEST test=x role=server status=PASS secs=1 reason=\"\"\n")
        watch = matrix.ConsoleWatch(self.d, False)
        watch.start()
        stopped = []
        s = matrix.StuckGuestWatch(watch, self.d, self.ctl, silence=1000, grace=0, window=1)
        s.stop_guests = lambda: stopped.append(True)
        s.start()
        time.sleep(3)
        s.stop()
        watch.stop()
        self.assertIsNone(s.diagnosis)
        self.assertEqual(stopped, [])


class ShardCombineTest(unittest.TestCase):
    """--shard I/N splits a run's cells; --combine of the shards' results
    gives the table one run of all the cells gives (no guests booted: the
    cell plan via --dry-run, and result records as run_cell writes them)."""

    def plan(self, *args):
        out = subprocess.run([sys.executable, os.path.join(matrix.HERE, "matrix.py"), "--dry-run", *args],
                             capture_output=True, text=True, check=True).stdout
        return [line.split(":", 1)[0] for line in out.splitlines() if line]

    def test_shards_cover_every_cell_exactly_once(self):
        for args in ([], ["--kernel", "7.3"], ["--cells", "rxe,siw-conn,7.3/smcr-failover"], ["--quick"]):
            whole = self.plan(*args)
            self.assertTrue(whole, args)
            for n in (1, 2, 3, len(whole) + 1):
                shards = [self.plan(*args, "--shard", f"{i}/{n}") for i in range(1, n + 1)]
                flat = [c for s in shards for c in s]
                self.assertEqual(sorted(flat), sorted(whole), f"{args} N={n}: every cell once")
                self.assertEqual(len(flat), len(set(flat)), f"{args} N={n}: no cell twice")
                # stable order: index % N == I - 1
                for i, s in enumerate(shards, 1):
                    self.assertEqual(s, [c for j, c in enumerate(whole) if j % n == i - 1])
        self.assertEqual(len(self.plan("--shard", "1/2")), (len(self.plan()) + 1) // 2)
        for bad in ("0/2", "3/2", "2", "a/b", "1/0"):
            r = subprocess.run([sys.executable, os.path.join(matrix.HERE, "matrix.py"), "--dry-run",
                                "--shard", bad], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2, bad)
            self.assertIn("I/N", r.stderr, bad)

    @staticmethod
    def record(kc, status="PASS"):
        """A result record of one cell, as run_cell writes it to results.json."""
        k, c = kc
        tests = [{"test": t, "status": "FAIL" if status == "FAIL" and i == 0 else "PASS", "secs": 3 + i,
                  "bw": f"{i}.5" if i % 2 else "", "detail": f"{c} {t} detail"}
                 for i, (t, _) in enumerate(matrix.CELLS[c]["tests"])]
        return {"kernel": k, "cell": c, "what": matrix.CELLS[c]["what"], "status": status, "wall_s": 42.5,
                "boot_s": {"a": 5.1, "b": 5.2}, "guest_kernel": {"a": f"{k}.4-rdma", "b": f"{k}.4-rdma"},
                "problems": [], "logs": None, "tests": tests, "net": "vhost-user",
                "daemon_counters": {"a": {"rx_frames": 10, "rx_drops": 0}}}

    def write_run(self, d, name, cells, command):
        res = [self.record(kc, "FAIL" if kc == ("7.3", "siw") else "PASS") for kc in cells]
        n = {s: sum(1 for r in res for t in r["tests"] if t["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
        meta = {"date": "2026-11-25_160000", "host": "h", "commit": "abc", "qemu_version": "QEMU 11.1",
                "accel": "tcg", "command": command,
                "summary": f"{n['PASS']} passed, {n['FAIL']} failed, {n['SKIP']} skipped", "cells_failed": []}
        p = os.path.join(d, name)
        os.makedirs(p)
        with open(os.path.join(p, "results.json"), "w") as f:
            matrix.json.dump({"meta": meta, "cells": res}, f)
        return p, res, meta

    @staticmethod
    def tables(md):
        """Everything from the Cells table on: Cells, Tests, daemon counters,
        the summary line."""
        return md.split("\n## Cells\n", 1)[1]

    def test_combine_of_the_shards_gives_the_whole_runs_table(self):
        whole_cells = [tuple(c.split("/")) for c in self.plan()]
        with tempfile.TemporaryDirectory() as d:
            whole, _, _ = self.write_run(d, "whole", whole_cells, "ci/matrix.sh")
            matrix.write_report(os.path.join(whole, "results.json"), os.path.join(d, "whole.md"))
            with open(os.path.join(d, "whole.md")) as f:
                whole_md = f.read()
            # Shards finish in any order; combine in reverse to show order does not matter.
            parts = []
            for i in (2, 1):
                p, _, _ = self.write_run(d, f"shard{i}", matrix.shard_cells(whole_cells, i, 2),
                                         f"ci/matrix.sh --shard {i}/2")
                parts.append(p)
            out = os.path.join(d, "combined.md")
            rc = matrix.combine_runs(parts, out)
            self.assertEqual(rc, 1, "a failed cell fails the combined run")
            with open(out) as f:
                combined = f.read()
            self.assertEqual(self.tables(combined), self.tables(whole_md))
            self.assertIn("| 7.3/siw | **FAIL** |", combined)
            self.assertIn("## Source runs", combined)
            self.assertIn("`ci/matrix.sh --shard 1/2`", combined)
            # Every cell row appears once, in the whole run's order.
            rows = [line.split(" | ")[0][2:] for line in combined.split("\n## Cells\n", 1)[1].split("\n## Tests")[0]
                    .splitlines() if line.startswith("| ") and not line.startswith("| cell")]
            self.assertEqual(rows, [f"{k}/{c}" for k, c in whole_cells])


class SideLaneTest(unittest.TestCase):
    """--jobs 2: the side lane's matrix process gets the parent's options but
    only the waiting cells, the parent's image and QEMU, and no build."""

    def test_the_side_lane_runs_exactly_the_waiting_cells_with_the_parents_options(self):
        waiting = [k for k in matrix.QUICK if k[1] in matrix.WAITING_CELLS]
        self.assertTrue(waiting and len(waiting) < len(matrix.QUICK), "the quick tier has cells for both lanes")
        parent = ["--quick", "--jobs", "2", "--junit", "/tmp/j.xml", "--tool-timeout=90", "--results", "/r",
                  "--cells=rxe", "--append", "loglevel=8", "--no-build", "--keep-logs"]
        args = matrix.side_lane_args(parent, waiting, "/r/side-lane", "/q/qemu", {"7.3": "/img"}, "32M")
        for gone in ("--quick", "--jobs", "--junit", "/tmp/j.xml", "/r", "--cells=rxe"):
            self.assertNotIn(gone, args)
        for kept in ("--tool-timeout=90", "--append", "loglevel=8", "--keep-logs"):
            self.assertIn(kept, args)
        self.assertEqual(args.count("--no-build"), 1)
        self.assertEqual(args[args.index("--qemu") + 1], "/q/qemu")
        self.assertEqual(args[args.index("--image-7.3") + 1], "/img")
        self.assertEqual(args[args.index("--results") + 1], "/r/side-lane")
        plan = subprocess.run([sys.executable, os.path.join(matrix.HERE, "matrix.py"), "--dry-run", *args],
                              capture_output=True, text=True, check=True).stdout
        self.assertEqual([line.split(":", 1)[0] for line in plan.splitlines() if line],
                         [f"{k}/{c}" for k, c in waiting])

    def test_an_abbreviated_option_is_refused(self):
        # side_lane_args filters options by their full names
        r = subprocess.run([sys.executable, os.path.join(matrix.HERE, "matrix.py"), "--dry-run", "--qui"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)


def fake_bzimage(path, version="7.3.9-mydriver (dev@box) #3 SMP PREEMPT_DYNAMIC"):
    """A file with what an x86 bzImage's setup header has: the boot flag,
    'HdrS', boot protocol 2.15 and the offset of the version string."""
    img = bytearray(0x1000)
    img[0x1FE:0x200] = b"\x55\xaa"
    img[0x202:0x206] = b"HdrS"
    img[0x206:0x208] = (0x020F).to_bytes(2, "little")
    img[0x20E:0x210] = (0x0600 - 0x200).to_bytes(2, "little")
    v = version.encode() + b"\0"
    img[0x600:0x600 + len(v)] = v
    with open(path, "wb") as f:
        f.write(bytes(img))
    return path


class ByoKernelTest(unittest.TestCase):
    """Bring your own kernel: --kernel PATH (a bzImage) and --append, the
    same option names in scripts/run-guests, ci/matrix.sh and scripts/demo.sh;
    a missing file or a file that is not a bzImage is refused with the reason."""

    ROOT = os.path.dirname(matrix.HERE)

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.good = fake_bzimage(os.path.join(self.dir, "bzImage"))
        self.text = os.path.join(self.dir, "notes.txt")
        with open(self.text, "w") as f:
            f.write("not a kernel\n" * 100)
        self.elf = os.path.join(self.dir, "vmlinux")
        with open(self.elf, "wb") as f:
            f.write(b"\x7fELF" + bytes(0x1000))
        self.rootfs = os.path.join(self.dir, "rootfs.ext4")
        open(self.rootfs, "wb").close()

    def tearDown(self):
        self.tmp.cleanup()

    def test_run_guests_warns_for_the_config_beside_the_image(self):
        # the checks themselves are guest-runner's tests (guest-runner/src/kernel.rs)
        tree = os.path.join(self.dir, "linux")
        os.makedirs(os.path.join(tree, "arch", "x86", "boot"))
        img = fake_bzimage(os.path.join(tree, "arch", "x86", "boot", "bzImage"))
        with open(os.path.join(tree, ".config"), "w") as f:
            f.write("CONFIG_GVE=m\n")
        r = self.run_guests("--kernel", img, "--rootfs", self.rootfs, "--qemu", "/nonexistent/qemu",
                            "--guest", "a")
        self.assertIn("warning: " + os.path.join(tree, ".config") + ": CONFIG_GVE is a module", r.stderr)

    def matrix_plan(self, *args):
        return subprocess.run([sys.executable, os.path.join(matrix.HERE, "matrix.py"), "--dry-run", *args],
                              capture_output=True, text=True)

    def test_matrix_kernel_path(self):
        r = self.matrix_plan("--kernel", self.good, "--cells", "7.3/rxe,smcr", "--append", "loglevel=8")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual([line.split(":", 1)[0] for line in r.stdout.splitlines() if line],
                         ["7.3/rxe", "7.3/smcr"], "the image's series picks the cells")
        self.assertIn("7.3.9-mydriver", r.stderr)
        for args, why in (([self.text], "is not a bzImage"),
                          ([os.path.join(self.dir, "nope")], "not found"),
                          ([self.good, "--cells", "6.12/rxe"], "is a 7.3 kernel; it cannot run 6.12/rxe"),
                          (["7.2"], "a kernel series")):
            r = self.matrix_plan("--kernel", *args)
            self.assertEqual(r.returncode, 2, args)
            self.assertIn(why, r.stderr, args)
        other = fake_bzimage(os.path.join(self.dir, "bz5"), "5.10.0 #1")
        r = self.matrix_plan("--kernel", other)
        self.assertEqual(r.returncode, 2)
        self.assertIn("series 5.10", r.stderr)

    def test_matrix_passes_the_kernel_to_run_guests(self):
        """run_cell's run-guests command line carries --kernel and --append."""
        import argparse
        a = argparse.Namespace(kernel=self.good, append="gve.debug=1", quick=False, cells="rxe", shard=None)
        matrix.resolve_kernel(a)
        self.assertEqual((a.kernel, a.kernel_image), ("7.3", self.good))
        self.assertEqual(matrix.select_cells(a), [("7.3", "rxe")])
        a2 = argparse.Namespace(kernel="6.12", append="", quick=False, cells="rxe", shard=None)
        matrix.resolve_kernel(a2)
        self.assertIsNone(a2.kernel_image, "a series is not a path")
        with open(os.path.join(matrix.HERE, "matrix.py")) as f:
            src = f.read()
        self.assertIn('args += ["--kernel", a.kernel_image]', src)
        self.assertIn('args += ["--append", a.append]', src)

    def run_guests(self, *args):
        # the first call may build guest-runner (scripts/guest-runner)
        return subprocess.run([os.path.join(self.ROOT, "scripts", "run-guests"), *args],
                              capture_output=True, text=True, timeout=600)

    def test_run_guests_refuses_a_bad_kernel(self):
        for k, why in ((self.text, "is not a bzImage"), (os.path.join(self.dir, "gone"), "not found"),
                       (self.elf, "is an ELF file")):
            r = self.run_guests("--kernel", k, "--rootfs", self.rootfs, "--net", "none", "--dry-run",
                                "--guest", "a")
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(why, r.stderr)
            self.assertIn("(--kernel)", r.stderr)

    def test_run_guests_boots_the_given_kernel_with_the_additions(self):
        # --dry-run prints QEMU's command line; QEMU must be found, but is not run
        qemu = shutil.which(os.environ.get("QEMU", "qemu-system-x86_64"))
        if not qemu:
            self.skipTest("no qemu-system-x86_64 on PATH (run-guests looks it up before --dry-run)")
        r = self.run_guests("--qemu", qemu, "--kernel", self.good, "--rootfs", self.rootfs, "--net", "none",
                            "--accel", "tcg", "--append", "gve.debug=1 loglevel=8", "--dry-run",
                            "--logdir", os.path.join(self.dir, "logs"), "--guest", "a")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"-kernel {self.good}", r.stdout.replace("'", ""))
        self.assertRegex(r.stdout, r"-append '[^']*vr\.name=a[^']* gve\.debug=1 loglevel=8'")
        self.assertIn("7.3.9-mydriver", r.stderr)

    def test_demo_and_e2e_scripts_take_the_same_options(self):
        for script in ("demo.sh", "e2e-gve.sh", "e2e-erdma.sh"):
            r = subprocess.run(["bash", os.path.join(self.ROOT, "scripts", script), "--help"],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, script)
            self.assertIn("--kernel PATH", r.stdout, script)
            self.assertIn("--append ARGS", r.stdout, script)
        # the e2e scripts too refuse a bad image, before they build anything
        for script in ("e2e-gve.sh", "e2e-erdma.sh"):
            r = subprocess.run(["bash", os.path.join(self.ROOT, "scripts", script), "--no-build",
                                "--kernel", self.text, "--logdir", os.path.join(self.dir, script)],
                               capture_output=True, text=True, timeout=120)
            self.assertNotEqual(r.returncode, 0, script)
            self.assertIn("is not a bzImage", r.stdout + r.stderr, script)
        # the demo refuses a bad image before it builds anything
        r = subprocess.run(["bash", os.path.join(self.ROOT, "scripts", "demo.sh"), "--no-build",
                            "--kernel", self.text, "--logdir", os.path.join(self.dir, "demo")],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is not a bzImage", r.stdout + r.stderr)


class VerdictGlueTest(unittest.TestCase):
    """matrix.py's calls of scripts/guest-results (the verdicts are tested in guest-results/tests/)."""

    def test_guest_rows_host_rows_and_junit(self):
        with tempfile.TemporaryDirectory() as d:
            for role, (name, _, _) in matrix.GUESTS.items():
                os.makedirs(os.path.join(d, f"{name}.job"))
                with open(os.path.join(d, f"{name}.job", "out.log"), "w") as f:
                    f.write(f"CI-KERNEL 7.3.4\nCI-TEST test=ping role={role} status=PASS secs=2 reason=\"3/3\"\n")
            g = matrix.guest_rows("rxe", d)
            rows = {t["test"]: t for t in g["tests"]}
            self.assertEqual(rows["ping"]["status"], "PASS", rows["ping"])
            self.assertEqual(rows["tshark"]["detail"], "host-side test did not run")
            self.assertEqual(rows["rping"]["status"], "FAIL")
            self.assertEqual(g["guest_kernel"], {"a": "7.3.4", "b": "7.3.4"})
            self.assertEqual(matrix.host_row("checker-clean", "--checker", "null")["status"], "FAIL")
            self.assertEqual(matrix.host_row("tshark", "--pcap", os.path.join(d, "none.pcap"))["status"],
                             "FAIL" if shutil.which("tshark") else "SKIP")
            bad = matrix.host_row("loss-evidence", "--faults", "not json", "--counters", "{}")
            self.assertIn("scripts/guest-results loss-evidence failed", bad["detail"])
            self.assertIsNone(matrix.known_flake_failures({"tests": g["tests"]}, "rxe"))
            res = os.path.join(d, "results.json")
            with open(res, "w") as f:
                matrix.json.dump({"meta": {}, "cells": [{"kernel": "7.3", "cell": "rxe", "tests": g["tests"]}]}, f)
            matrix.write_junit(res, os.path.join(d, "j.xml"))
            with open(os.path.join(d, "j.xml")) as f:
                self.assertIn('<testsuite name="matrix.7.3/rxe"', f.read())


class FaultCasesTest(unittest.TestCase):
    """The fault cells' configuration; the judge itself is guest-results/tests/faults.rs."""

    def test_every_fault_case_is_a_server_row_of_its_cell_and_its_regexes_compile(self):
        for cell, cases in matrix.FAULT_CASES.items():
            tests = dict(matrix.CELLS[cell]["tests"])
            for c in cases:
                self.assertEqual(tests.get(f"fault-{c['case']}"), ["server"], c["case"])
            with tempfile.TemporaryDirectory() as d:
                dest = os.path.join(d, "faults.md")
                rows = matrix.fault_rows("7.3", cell, [], dest)
                self.assertEqual(rows, [], rows)  # no "fault-verdict" row: guest-results took every case
                with open(dest) as f:
                    self.assertEqual(sum(1 for ln in f if ln.startswith("| `")), len(cases))


if __name__ == "__main__":
    unittest.main(verbosity=2)
