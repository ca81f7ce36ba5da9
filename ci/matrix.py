#!/usr/bin/env python3
"""Guest RDMA / SMC-R test matrix for vhost-rdma (run through ci/matrix.sh).

Cells = guest kernel x {rxe, siw, smcr, smc-noueid}. Every cell starts its own
vhost-rdma daemon (two vhost-user ports), boots two guests A (server side,
10.77.0.1) and B (client side, 10.77.0.2) with scripts/run-guests and runs the
cell's tests inside them (guest side: ci/guest/ci-lib.sh). Cells run one after
the other: never more than two guests at a time.

The cells themselves (rows, devices, fault rules, environment, time limits,
the fault cells' cases) are guest-runner/src/cells.rs, read through
`scripts/guest-runner matrix-cells`; the verdicts are guest-results/.

Python 3 standard library only.
"""

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KERNELS = ["7.3", "6.12"]
# the results side (verdicts, reports, JUnit): the guest-results crate, built on first use
GUEST_RESULTS = os.path.join(ROOT, "scripts", "guest-results")

BOTH = ("server", "client")


def _cell_table():
    """The cells (guest-runner/src/cells.rs: each cell's rows and the roles that report them, its
    devices, fault rules, guest environment and time limit; the fault cells' cases and traces), from
    `scripts/guest-runner matrix-cells` (built on first use)."""
    try:
        r = subprocess.run([os.path.join(ROOT, "scripts", "guest-runner"), "matrix-cells"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return json.loads(r.stdout)
        why = f"exit {r.returncode}: {r.stderr.strip()[-500:]}"
    except (OSError, ValueError) as e:
        why = str(e)
    sys.exit(f"ci/matrix.py: scripts/guest-runner matrix-cells failed ({why})")


_TABLE = _cell_table()
CELLS = _TABLE["cells"]
# Captures (issue 6): the daemon records the whole fabric (pcapng) in the capture cells and a host-side
# `tshark` test checks these dissectors decode it (by the cell name's prefix).
CAPTURE_PROTOS = _TABLE["capture_protos"]
FAULT_CASES = _TABLE["fault_cases"]
# The device traces a fault cell keeps: file -> names that must appear in it.
FAULT_TRACES = _TABLE["fault_traces"]
FAULT_CELLS = _TABLE["fault_cells"]
# Cells whose guests spend most of their wall time idle, waiting for driver
# timeouts (a command queue's 15 s, a watchdog's 5 s, a QP's retries): with
# --jobs 2 they run beside the other cells, which then lose little CPU (two
# TCG guests idle in HLT). Their verdicts are evidence (dmesg, counters,
# completion statuses), not timings.
WAITING_CELLS = FAULT_CELLS
# 7.3 only unless named with a kernel or --kernel is given (issue 6 asks for 7.3)
LOSSY_CELLS = _TABLE["lossy_cells"]
# 7.3 only: erdma's RoCEv2 mode is newer than 6.12
ERDMA_CELLS = _TABLE["erdma_cells"]
CELL_ORDER = _TABLE["cell_order"]
# not run by default (diagnostics): siw-conn, smcr-lossy-4conns (ci/README.md)
EXTRA_CELLS = _TABLE["extra_cells"]


SIW_SETTLE_MS = 300


def siw_settle_rule(ms):
    """The daemon's `mpa-settle` rule (docs/faults-and-captures.md, "Linux siw workaround"): on port a, both
    directions, TCP data right behind an MPA Reply waits `ms` so that the guest kernel's two siw
    connection-setup races (ci/README.md) are not hit. Used in the siw cells (not in siw-conn, which
    exists to show the races) unless --siw-settle-ms 0."""
    return {"port": "a", "dir": "both", "proto": "tcp", "action": "mpa-settle", "delay-ms": ms}


def cell_faults(a, cell):
    """Fault rules of a cell: the siw workaround first, then the cell's own (lossy) rules."""
    rules = list(CELLS[cell].get("faults", ()))
    ms = getattr(a, "siw_settle_ms", None)
    if cell == "siw-conn":
        ms = ms or 0  # the diagnostic cell shows the races unless --siw-settle-ms is given
    elif ms is None:
        ms = SIW_SETTLE_MS
    if cell.split("-")[0] == "siw" and ms > 0:
        rules.insert(0, siw_settle_rule(ms))
    return rules
# gve-faults: 101-184 s under TCG (2026-11-28); erdma-faults (210-253 s: the driver's 15 s command timeout,
# a failed rping and a re-probe, RC retries on a downed port) stays in the full tier (ci/README.md)
QUICK = [("7.3", "rxe"), ("7.3", "smcr"), ("7.3", "erdma-smcr"), ("7.3", "upstream-rdma"), ("7.3", "upstream-nic"),
         ("7.3", "gve-faults"), ("7.3", "erdma-faults")]
# smc-noueid phase 1 (client without UEID). 7.3 (CONFIG_DIBS_LO): the client
# proposes SMC-Dv2 over its loopback device without an EID and the server
# declines NOUEID. 6.12 (our fragment has no CONFIG_SMC_LO): the client has no
# SMCv2-capable device at all without a UEID, declines NOSMCDEV itself and the
# server reports PEERDECL with peer diagnosis NOSMCDEV.
NOUEID_PHASE1_CODE = {"7.3": "0x03030008", "6.12": "0x03030000"}
# second NIC (cells with "nics": 2): role -> (port name, ip, mac); same subnet as eth0
GUESTS_NIC1 = {
    "server": ("a1", "10.77.0.11", "52:54:00:77:01:1a"),
    "client": ("b1", "10.77.0.12", "52:54:00:77:01:1b"),
}
GUESTS = {  # role -> (name, ip, mac)
    "server": ("a", "10.77.0.1", "52:54:00:77:01:0a"),
    "client": ("b", "10.77.0.2", "52:54:00:77:01:0b"),
}


def say(msg):
    print(f"[matrix] {msg}", file=sys.stderr, flush=True)


def last_line(cmd, log):
    """Run a provisioning script, stderr to log (and our stderr), return its last stdout line."""
    with open(log, "w") as lf:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out_lines = []

        def pump():
            for line in p.stderr:
                lf.write(line)
                lf.flush()
                sys.stderr.write("    " + line)

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        for line in p.stdout:
            out_lines.append(line.rstrip("\n"))
        p.wait()
        t.join(5)
    if p.returncode != 0 or not out_lines:
        return None
    return out_lines[-1].strip()


GVE_MACS = {"server": "52:54:00:77:02:0a", "client": "52:54:00:77:02:0b"}


def gve_port(role):
    """Daemon port name of a role's emulated gVNIC (cells with "nic")."""
    return GUESTS[role][0] + "g"


def erdma_port(role):
    """Daemon port name of a role's erdma function (paired with its virtio-net port)."""
    return GUESTS[role][0] + "r"


class Daemon:
    def __init__(self, binary, d, faults=(), nics=1, rdma=None, nic=None, gve_queues=4, erdma_opts=""):
        self.binary, self.d, self.p, self.faults, self.nics = binary, d, None, list(faults), nics
        self.gve_queues, self.erdma_opts = gve_queues, erdma_opts
        self.rdma = rdma or {}
        self.nic = nic or {}
        # sockets the guests connect to: one per virtio-net port, erdma function and gVNIC
        self.sockets = [f"{d}/{GUESTS[r][0]}.sock" for r in BOTH] + [
            f"{d}/{erdma_port(r)}.sock" for r in BOTH if self.rdma.get(r) == "erdma"] + [
            f"{d}/{gve_port(r)}.sock" for r in BOTH if self.nic.get(r) == "gve"]

    def start(self):
        args = [self.binary, "serve"]
        if self.faults:
            # [[fault]] tables of the config file (docs/faults-and-captures.md)
            with open(f"{self.d}/daemon.toml", "w") as f:
                for r in self.faults:
                    f.write("[[fault]]\n")
                    for k, v in r.items():
                        f.write(f"{k} = {json.dumps(v)}\n")
                    f.write("\n")
            args += ["--config", f"{self.d}/daemon.toml"]
        for role in BOTH:
            for name, _, mac in [GUESTS[role]] + ([GUESTS_NIC1[role]] if self.nics > 1 else []):
                args += ["--port", f"{name}={self.d}/{name}.sock,mac={mac},queues=1,form=pci"]
            if self.rdma.get(role) == "erdma":
                name = GUESTS[role][0]
                args += ["--port", f"{erdma_port(role)}={self.d}/{erdma_port(role)}.sock,kind=erdma,netdev={name}"
                         + (f",{self.erdma_opts}" if self.erdma_opts else "")]
            if self.nic.get(role) == "gve":
                mac = GVE_MACS[role]
                args += ["--port", f"{gve_port(role)}={self.d}/{gve_port(role)}.sock,kind=gve,queues={self.gve_queues},"
                                   f"mtu=9000,gro-hold-us=10000,nic-timestamp=on,mac={mac}"]
        args += ["--control", f"{self.d}/ctl.sock", "--capture-dir", self.d]
        env = dict(os.environ, NO_COLOR="1")
        self.log = open(f"{self.d}/daemon.log", "w")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(100):
            if all(os.path.exists(p) for p in self.sockets):
                return None
            if self.p.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        return "daemon did not create its sockets (see daemon.log)"

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def stop(self):
        """Returns None or a problem description."""
        if self.p is None:
            return None
        prob = None
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                rc = self.p.wait(10)
                if rc != 0:
                    prob = f"daemon exited {rc} on SIGTERM"
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
                prob = "daemon did not stop within 10 s of SIGTERM"
        self.log.close()
        self.p = None
        return prob


class NoDaemon:
    """--net stream: the guests are linked by QEMU's -netdev stream, no daemon."""

    def start(self):
        return None

    def alive(self):
        return True

    def stop(self):
        return None


JOB_ENV = {}  # CI_* variables for ci-lib.sh


class ConsoleWatch(threading.Thread):
    """Echoes the guests' CI-TEST / SKIPPED / BARRIER / CI-ABORT console lines while a cell runs."""

    KEYS = ("CI-TEST", "SKIPPED", "BARRIER", "CI-ABORT", "VR-RESULT")

    def __init__(self, d, verbose):
        super().__init__(daemon=True)
        self.d, self.verbose, self.done = d, verbose, threading.Event()
        self.pos = {}
        self.aborted = None  # (guest, barrier label) of the first CI-ABORT line
        self.last_line = time.monotonic()  # when either console last printed a line


    def poll(self):
        for g in ("a", "b"):
            fn = f"{self.d}/{g}.console.log"
            try:
                with open(fn, "rb") as f:
                    f.seek(self.pos.get(g, 0))
                    data = f.read()
            except OSError:
                continue
            cut = data.rfind(b"\n") + 1  # only complete lines
            self.pos[g] = self.pos.get(g, 0) + cut
            for line in data[:cut].decode("utf-8", "replace").splitlines():
                self.last_line = time.monotonic()
                if line.startswith("CI-ABORT") and self.aborted is None:
                    m = re.search(r"label=(.*)$", line)
                    self.aborted = (g, m.group(1).strip() if m else "?")
                if self.verbose or any(k in line for k in self.KEYS):
                    print(f"    [{g}] {line.rstrip()[:300]}", flush=True)

    def run(self):
        while not self.done.wait(2):
            self.poll()
        self.poll()

    def stop(self):
        self.done.set()
        self.join(5)


class StuckGuestWatch(threading.Thread):
    """When one guest gives up at a barrier (CI-ABORT: its peer never arrived), or neither prints a
    line for `silence` s, find out why (`scripts/guest-runner stuck-diagnosis`, guest-runner/src/stuck.rs:
    the suspect QEMUs' CPU use and the daemon's counters of their ports over `window` s, where their CPU
    is, the flows view saved as stuck-flows.json) and stop the cell instead of waiting for its whole
    timeout. After a barrier abort it first waits `grace` s (the peer may still finish on its own). The
    diagnosis goes into the cell's problems and `stop_guests()` is called (it ends run-guests)."""

    def __init__(self, watch, d, daemon_bin, silence, grace=120, window=5):
        super().__init__(daemon=True)
        self.watch, self.d, self.daemon_bin = watch, d, daemon_bin
        self.grace, self.window, self.silence = grace, window, silence
        self.done = threading.Event()
        self.diagnosis = None
        self.stop_guests = None  # set by run_cell: ends run-guests
        self.proc = None

    def run(self):
        while not self.done.wait(2):
            if self.watch.aborted or time.monotonic() - self.watch.last_line > self.silence:
                break
        if self.done.is_set():
            return
        if self.watch.aborted:
            who, label = self.watch.aborted
            guests = ["b" if who == "a" else "a"]
            why = f"guest {guests[0]} never reached barrier '{label}' ({who} gave up)"
            if self.done.wait(self.grace):
                return
        else:
            guests = ["a", "b"]
            why = f"neither guest printed a line for {self.silence} s (longer than any tool timeout)"
        self.proc = subprocess.Popen([os.path.join(ROOT, "scripts", "guest-runner"), "stuck-diagnosis",
                                      "--dir", self.d, "--daemon", self.daemon_bin, "--window", str(self.window),
                                      "--why", why, *guests], stdout=subprocess.PIPE, text=True)
        out = self.proc.communicate()[0].strip()
        if self.done.is_set():
            return
        self.diagnosis = out or f"{why}: the stuck-guest diagnosis failed (rc={self.proc.returncode})"
        print(f"    [host] {self.diagnosis}", flush=True)
        if self.stop_guests:
            self.stop_guests()

    def stop(self):
        self.done.set()
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
        self.join(10)


def job_script(role, cell, kernel):
    _, self_ip, _ = GUESTS[role]
    peer_ip = GUESTS["client" if role == "server" else "server"][1]
    extra = ""
    # Phase 1 of smc-noueid (UEID on the server only): the decline code depends
    # on whether the client kernel has an SMC-D loopback device (ci/README.md).
    env = dict(JOB_ENV, CI_NOUEID_CODE=NOUEID_PHASE1_CODE[kernel], **CELLS[cell].get("env", {}))
    if CELLS[cell].get("rdma"):
        env["CI_RDMA"] = CELLS[cell]["rdma"][role]
    if CELLS[cell].get("nic"):
        env["CI_NIC"] = CELLS[cell]["nic"][role]
    for var, val in env.items():
        if val:
            extra += f"{var}={shlex.quote(str(val))}; export {var}\n"
    return (
        f"ROLE={role} SELF={self_ip} PEER={peer_ip} CELL={kernel}/{cell}\n"
        "export ROLE SELF PEER CELL\n"
        f"{extra}"
        'echo "CI-KERNEL $(uname -r)"\n'
        ". /opt/vr/ci/ci-lib.sh\n"
        f"{CELLS[cell]['call']}\n"
        "exit 0\n"
    )


def guest_results(*args, input=None):
    """Runs `scripts/guest-results ARGS` (guest-results/: the verdicts and reports), INPUT on its stdin,
    and returns (its JSON output, ""), or (None, why) when it failed."""
    try:
        r = subprocess.run([GUEST_RESULTS, *args], input=input, capture_output=True, text=True)
        if r.returncode == 0:
            return json.loads(r.stdout), ""
        return None, f"rc={r.returncode}: {r.stderr.strip()[-300:]}"
    except (OSError, ValueError) as e:
        return None, str(e)


def guest_rows(cell, d):
    """The cell's test rows from both guests' out.log (`scripts/guest-results guests`): a test needs a
    CI-TEST line from each role CELLS names for it, any FAIL fails it, all SKIP skips it; a host-side test
    gets a FAIL row run_cell replaces. Returns {"tests", "counters", "guest_kernel"}."""
    args = ["guests", "--tests", json.dumps(CELLS[cell]["tests"])]
    for role in BOTH:
        name = GUESTS[role][0]
        args += ["--guest", f"{role}={name}={d}/{name}.job/out.log"]
    v, why = guest_results(*args)
    if v is None:
        v = {"tests": [{"test": "guest-results", "status": "FAIL", "secs": 0, "bw": "",
                        "detail": f"scripts/guest-results guests failed: {why}"}], "counters": {}, "guest_kernel": {}}
    return v


def daemon_counters(daemon_bin, d):
    """`vhost-rdma ctl status` of the cell's daemon (saved as daemon-status.json): per-port error counters."""
    try:
        out = subprocess.run([daemon_bin, "ctl", "--json", "--control", f"{d}/ctl.sock", "status"],
                             capture_output=True, text=True, timeout=20).stdout
        st = json.loads(out)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    with open(f"{d}/daemon-status.json", "w") as f:
        json.dump(st, f, indent=1)
    keys = ("tx_frames", "rx_frames", "rx_drops", "rx_errors", "tx_errors", "tx_pauses", "ctrl_errors")
    out = {p["name"]: {k: p.get(k) for k in keys} for p in st.get("ports", [])}
    for dev in st.get("devices", []):
        # erdma functions: the RC engines' recovery counters and the device's errors
        c = (dev.get("erdma") or {}).get("counters") or {}
        out.setdefault(dev.get("port", "?"), {}).update(
            {k: v for k, v in c.items() if k.startswith("rc_") or k in ("dma_errors", "bad_wqes", "rx_dropped")})
    return out


def ctl_json(daemon_bin, d, *args):
    """`vhost-rdma ctl --json ARGS` against the cell's daemon: parsed reply or None."""
    try:
        r = subprocess.run([daemon_bin, "ctl", "--json", "--control", f"{d}/ctl.sock", *args],
                           capture_output=True, text=True, timeout=20)
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


class CaptureLimit(threading.Thread):
    """Stops the fabric capture once it holds --capture-max-records records, so
    a long SMC-R stream does not leave tshark a gigabyte to read (the
    handshakes, LLC/CDC and the first data are what the tshark test needs)."""

    def __init__(self, daemon_bin, d, max_records):
        super().__init__(daemon=True)
        self.daemon_bin, self.d, self.max = daemon_bin, d, max_records
        self.done = threading.Event()
        self.capped_at = None

    def run(self):
        while not self.done.wait(2):
            st = ctl_json(self.daemon_bin, self.d, "capture", "status")
            if st and st.get("records", 0) >= self.max:
                ctl_json(self.daemon_bin, self.d, "capture", "stop")
                self.capped_at = st.get("records")
                return

    def stop(self):
        self.done.set()
        self.join(10)


class FailoverDriver:
    """smcr-failover cell: `scripts/guest-runner failover-driver` (guest-runner/src/failover.rs), from
    start() until stop(): once the SMC-R stream runs (>= 500 frames/s out of the server guest for 3 s),
    it takes the daemon port of the busier server NIC (a or a1) down with `ctl link down`, and up again
    after `up_after` s (or when stopped); then it writes the failover-evidence row."""

    def __init__(self, daemon_bin, d, up_after=30):
        self.out = f"{d}/failover-evidence.json"
        self.cmd = [os.path.join(ROOT, "scripts", "guest-runner"), "failover-driver", "--dir", d,
                    "--daemon", daemon_bin, "--up-after", str(up_after), "--out", self.out]
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.cmd)

    def stop(self):
        end_process(self.proc, 60)

    def evidence(self):
        """The failover-evidence row the driver wrote."""
        try:
            with open(self.out) as f:
                return json.load(f)
        except (OSError, ValueError) as e:
            return {"test": "failover-evidence", "status": "FAIL", "secs": 0, "bw": "",
                    "detail": f"scripts/guest-runner failover-driver wrote no row: {e}"}


def host_row(test, *args):
    """A host-side row judged by `scripts/guest-results TEST ARGS` (guest-results/): tshark (the capture
    decodes as the cell's protocols, no malformed frame; SKIP without tshark), checker-clean (the protocol
    checker saw no rule broken), loss-evidence (every fault rule acted and the guests counted
    retransmissions)."""
    v, why = guest_results(test, *args)
    return v or {"test": test, "status": "FAIL", "secs": 0, "bw": "",
                 "detail": f"scripts/guest-results {test} failed: {why}"}


def end_process(proc, grace):
    """SIGTERM to a helper process (if started), SIGKILL after `grace` s."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class CtlBroker:
    """Device-fault cells: `scripts/guest-runner ctl-broker` (guest-runner/src/ctl_broker.rs) runs
    `vhost-rdma ctl` against the cell's daemon for the guests (a request in /job/ctl-req.N, one
    argument per line; the answer in /job/ctl-rep.N; device-fault, link, trace and status only),
    logged to ctl-broker.log in the cell dir, from start() until stop()."""

    def __init__(self, daemon_bin, d):
        self.cmd = [os.path.join(ROOT, "scripts", "guest-runner"), "ctl-broker", "--dir", d, "--daemon", daemon_bin]
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.cmd)

    def stop(self):
        """Ends the broker (it answers what is left once more)."""
        end_process(self.proc, 30)


def fault_rows(kernel, cell, rows, dest):
    """A fault cell's rows with each fault-CASE row judged against FAULT_CASES (`scripts/guest-results
    faults`): the rule fired (hits=N > 0, unless the case says the device keeps no hit count), every
    expected evidence regex matches, and traffic recovered after the clear exactly when the 7.3 driver is
    expected to recover (a case it does not recover from passes only when it does not, as a finding).
    The driver developer's table (docs/driver-bench.md) goes to DEST."""
    v, why = guest_results("faults", "--cases", json.dumps(FAULT_CASES[cell]), "--kernel", kernel, "--cell", cell,
                           "--command", f"ci/matrix.sh --cells {kernel}/{cell}", "--md", dest, input=json.dumps(rows))
    if v is None:
        return rows + [{"test": "fault-verdict", "status": "FAIL", "secs": 0, "bw": "",
                        "detail": f"scripts/guest-results faults failed: {why}"}]
    return v


def trace_row(d, traces):
    """Host row "device-trace" (`scripts/guest-results trace`): every trace file of the cell exists in the
    capture dir, has records, and names the driver interactions expected in it."""
    v, why = guest_results("trace", "--dir", d, "--traces", json.dumps(traces))
    return v or {"test": "device-trace", "status": "FAIL", "secs": 0, "bw": "",
                 "detail": f"scripts/guest-results trace failed: {why}"}


def upstream_rows(a, kernel, cell, d, logsdir):
    """One row per upstream case of an `upstream` cell, judged against ci/upstream/SUITE-DEVICE.expect
    by `scripts/guest-results upstream` (guest-results/); the table (case, device per role, reason)
    goes to the results dir as upstream-KERNEL-CELL.md."""
    suite = CELLS[cell]["upstream"]
    device_of = CELLS[cell].get("rdma") if suite == "rdma-core" else CELLS[cell].get("nic")
    cmd = f"ci/matrix.sh --cells {kernel}/{cell}"
    dest = os.path.join(os.path.dirname(logsdir), f"upstream-{kernel}-{cell}.md")
    args = ["upstream", "--suite", suite,
            "--expect-dir", os.path.join(ROOT, "ci", "upstream"), "--title", f"{suite} tests on {kernel}/{cell}",
            "--command", cmd, "--md", dest]
    for role in BOTH:
        name = GUESTS[role][0]
        spec = f"{name}={device_of[role]}={d}/{name}.job/{suite}.{role}.log"
        if suite == "rdma-core":
            spec += f"={d}/{name}.job/{suite}-cases.{role}"
        args += ["--device", spec]
    v, why = guest_results(*args)
    if v is None:
        return [{"test": f"{suite}-verdict", "status": "FAIL", "secs": 0, "bw": "",
                 "detail": f"scripts/guest-results upstream failed: {why}"}]
    for n in v["notes"]:
        print(f"   {n}", flush=True)
    print(f"   upstream {suite}: " + ", ".join(f"{dev} {n} pass" for dev, n in v["passed"]) + f"; table {dest}",
          flush=True)
    return v["rows"]


def checker_report(daemon_bin, d):
    """The protocol checker's view of the cell: `ctl --json findings` and `ctl --json flows`, saved as
    checker-findings.json / checker-flows.json; returns {"findings": N, "rules": {rule: count}} or None."""
    out = {}
    for what in ("findings", "flows"):
        try:
            r = subprocess.run([daemon_bin, "ctl", "--json", "--control", f"{d}/ctl.sock", what],
                               capture_output=True, text=True, timeout=20)
            out[what] = json.loads(r.stdout)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return None
        with open(f"{d}/checker-{what}.json", "w") as f:
            json.dump(out[what], f, indent=1)
    rules = {}
    for x in out["findings"].get("findings", []):
        rules[x["rule"]] = rules.get(x["rule"], 0) + 1
    return {"findings": out["findings"].get("total", 0), "rules": rules}


def run_cell(a, kernel, cell, image, qemu, daemon_bin, vrbin, workroot, logsdir):
    d = os.path.join(workroot, f"{kernel}-{cell}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    spec = CELLS[cell]
    faults = cell_faults(a, cell)
    what = spec["what"]
    if any(r.get("action") == "mpa-settle" for r in faults):
        what += f" [daemon siw workaround: mpa-settle {faults[0]['delay-ms']} ms]"
    print(f"\n== cell {kernel}/{cell}: {what}", flush=True)
    t0 = time.monotonic()
    res = {"kernel": kernel, "cell": cell, "what": what, "status": "FAIL", "wall_s": 0,
           "boot_s": {}, "guest_kernel": {}, "tests": [], "problems": [], "logs": None}
    net = getattr(a, "net", "vhost-user")
    res["net"] = net
    # --net stream: QEMU's own virtio-net + -netdev stream (no daemon), to tell daemon issues from guest ones
    if spec.get("rdma") and net != "vhost-user":
        res["problems"].append("the erdma function needs the daemon (--net vhost-user)")
    dm = (Daemon(daemon_bin, d, faults, spec.get("nics", 1), spec.get("rdma"), spec.get("nic"),
                 spec.get("gve_queues", 4), spec.get("erdma_opts", "")) if net == "vhost-user" else NoDaemon())
    err = dm.start()
    if err:
        res["problems"].append(err)
        res["tests"] = [{"test": t, "status": "FAIL", "secs": 0, "bw": "", "detail": err}
                        for t, _ in spec["tests"]]
    else:
        cap, pcap = None, f"{d}/fabric.pcapng"
        if spec.get("capture") and a.capture and net == "vhost-user":
            snap = ["--snaplen", str(a.capture_snaplen)] if a.capture_snaplen else []
            # captures never replace a file: a rerun's cell starts a new one
            if os.path.lexists(pcap):
                os.remove(pcap)
            if ctl_json(daemon_bin, d, "capture", "start", "--file", pcap, *snap) is None:
                res["problems"].append("ctl capture start failed")
            else:
                cap = CaptureLimit(daemon_bin, d, a.capture_max_records)
                cap.start()
        broker = None
        if spec.get("ctl_broker") and net == "vhost-user":
            broker = CtlBroker(daemon_bin, d)
            broker.start()
            # the gVNIC's probe happens at boot: its trace starts before the guests do
            if "trace-gve-probe.txt" in FAULT_TRACES.get(cell, {}):
                if ctl_json(daemon_bin, d, "trace", "start", "--port", gve_port("server"),
                            "--file", "trace-gve-probe.txt") is None:
                    res["problems"].append("ctl trace start --port ag failed")
        args = [os.path.join(ROOT, "scripts", "run-guests"), "--qemu", qemu, "--image", image,
                "--accel", a.accel, "--timeout", str(a.timeout or spec["timeout"]),
                "--guest-bin", vrbin, "--net", net, "--form", "pci", "--queues", "1",
                "--logdir", d, "--monitor"]
        if getattr(a, "kernel_image", None):
            args += ["--kernel", a.kernel_image]
        if getattr(a, "append", ""):
            args += ["--append", a.append]
        for role in BOTH:
            name, ip, mac = GUESTS[role]
            with open(f"{d}/{name}.sh", "w") as f:
                f.write(job_script(role, cell, kernel))
            sock = f"sock={d}/{name}.sock," if net == "vhost-user" else ""
            nic1 = ""
            if spec.get("nics", 1) > 1:
                n1, ip1, mac1 = GUESTS_NIC1[role]
                nic1 = f"ip1={ip1}/24,sock1={d}/{n1}.sock,mac1={mac1},"
            vfio = (f"vfio={d}/{erdma_port(role)}.sock,"
                    if (spec.get("rdma") or {}).get(role) == "erdma" and net == "vhost-user" else "")
            if (spec.get("nic") or {}).get(role) == "gve" and net == "vhost-user":
                vfio = f"vfio={d}/{gve_port(role)}.sock,"
            args += ["--guest", f"{name},ip={ip}/24,{sock}{nic1}{vfio}mac={mac},cmd={d}/{name}.sh"]
        watch = ConsoleWatch(d, a.verbose)
        watch.start()
        fo = None
        if spec.get("failover") and net == "vhost-user":
            fo = FailoverDriver(daemon_bin, d)
            fo.start()
        stuck = None
        if net == "vhost-user":
            # silence: longer than the longest tool timeout a cell's guests use (a stream may run
            # quietly for CI_STREAM_TIMEOUT s), plus the barrier timeout
            env = dict(JOB_ENV, **spec.get("env", {}))
            quiet = max(int(env.get("CI_STREAM_TIMEOUT") or 1800), int(env.get("CI_TOOL_TIMEOUT") or 180))  # ci-lib.sh defaults
            stuck = StuckGuestWatch(watch, d, daemon_bin, silence=quiet + 600)
        with open(f"{d}/run-guests.log", "w") as rl:
            p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if stuck:
                stuck.stop_guests = p.terminate  # run-guests stops its QEMUs on SIGTERM
                stuck.start()
            try:
                for line in p.stdout:
                    rl.write(line)
                    rl.flush()  # StuckGuestWatch reads the QEMU pids from it
                    if a.verbose:
                        sys.stdout.write("    " + line)
                        sys.stdout.flush()
                rg = p.wait()
                watch.stop()
            except BaseException:
                watch.stop()
                # interrupted: stop the guests (run-guests kills its QEMUs on SIGTERM) and the daemon
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                dm.stop()
                raise
        if stuck:
            stuck.stop()
            if stuck.diagnosis:
                res["problems"].append(stuck.diagnosis)
        if rg != 0:
            res["problems"].append(f"run-guests exit {rg}")
        dc = daemon_counters(daemon_bin, d)
        if dc:
            res["daemon_counters"] = dc
        if fo:
            fo.stop()
        if broker:
            broker.stop()
            dfl = ctl_json(daemon_bin, d, "device-fault", "list")
            if dfl is not None:
                with open(f"{d}/device-faults.json", "w") as f:
                    json.dump(dfl, f, indent=1)
            # the device traces stay with the results (must-show 4), passed or not
            tdest = os.path.join(os.path.dirname(logsdir), "traces", f"{kernel}-{cell}")
            for fn in sorted(os.listdir(d)):
                if fn.startswith("trace-"):
                    os.makedirs(tdest, exist_ok=True)
                    shutil.copy(os.path.join(d, fn), tdest)
                    res.setdefault("traces", []).append(os.path.relpath(os.path.join(tdest, fn),
                                                                        os.path.dirname(logsdir)))
        fault_list = ctl_json(daemon_bin, d, "faults", "list") if faults else None
        if fault_list is not None:
            with open(f"{d}/faults.json", "w") as f:
                json.dump(fault_list, f, indent=1)
            for r in (fault_list.get("faults", fault_list) or {}).get("rules", []):
                if (r.get("rule") or {}).get("action") == "mpa-settle":
                    res["siw_settle"] = f"mpa-settle rule: {r.get('matched')} TCP frames matched, " \
                                        f"{r.get('acted')} data segments held behind an MPA Reply"
                    print(f"   {res['siw_settle']}", flush=True)
        if cap:
            cap.stop()
            ctl_json(daemon_bin, d, "capture", "stop")
            if cap.capped_at:
                res["capture_capped_at"] = cap.capped_at
        ck = checker_report(daemon_bin, d)
        if ck is not None:
            # Reported, not judged: a finding is a protocol rule broken on the wire.
            res["checker"] = ck
            print(f"   checker: {ck['findings']} finding(s) {ck['rules'] or ''}", flush=True)
        if not dm.alive():
            res["problems"].append("daemon died during the run")
        prob = dm.stop()
        if prob:
            res["problems"].append(prob)
        try:
            with open(f"{d}/daemon.log", errors="replace") as f:
                bad = [ln.rstrip() for ln in f if re.search(r"panicked|ERROR", ln)]
            if any("panicked" in ln for ln in bad):
                res["problems"].append("daemon panicked")
            if bad:
                res["daemon_errors"] = bad[-10:]
        except OSError:
            pass
        g = guest_rows(cell, d)
        if g["counters"]:
            res["counters"] = g["counters"]
        res["guest_kernel"].update(g["guest_kernel"])
        res["tests"] = g["tests"]
        host_rows = {}
        if spec.get("capture"):
            if not a.capture:
                host_rows["tshark"] = {"test": "tshark", "status": "SKIP", "secs": 0, "bw": "",
                                       "detail": "--no-capture given"}
            elif net != "vhost-user":
                host_rows["tshark"] = {"test": "tshark", "status": "SKIP", "secs": 0, "bw": "",
                                       "detail": "--net stream: no daemon, no capture"}
            else:
                protos = spec.get("capture_protos") or CAPTURE_PROTOS[cell.split("-")[0]]
                host_rows["tshark"] = host_row("tshark", "--pcap", pcap, *[a for p in protos for a in ("--proto", p)])
                if cap and cap.capped_at:
                    host_rows["tshark"]["detail"] += f" (capture stopped at {cap.capped_at} records)"
        if spec.get("failover"):
            host_rows["failover-evidence"] = (fo.evidence() if fo else
                                              {"test": "failover-evidence", "status": "SKIP", "secs": 0, "bw": "",
                                               "detail": "--net stream: no daemon to take a link down"})
        if spec.get("checker_clean"):
            host_rows["checker-clean"] = host_row("checker-clean", "--checker", json.dumps(ck))
        if spec.get("faults"):
            # the erdma functions' RC engines run in the daemon: their recovery counters are its own
            cnt = dict(res.get("counters") or {})
            for port, c in (res.get("daemon_counters") or {}).items():
                if any(k.startswith("rc_") for k in c):
                    cnt[f"daemon:{port}"] = c
            host_rows["loss-evidence"] = host_row("loss-evidence", "--faults", json.dumps(fault_list),
                                                  "--counters", json.dumps(cnt))
        if cell in FAULT_TRACES:
            host_rows["device-trace"] = (trace_row(d, FAULT_TRACES[cell]) if net == "vhost-user" else
                                         {"test": "device-trace", "status": "SKIP", "secs": 0, "bw": "",
                                          "detail": "--net stream: no daemon"})
        res["tests"] = [host_rows.get(t["test"], t) for t in res["tests"]]
        if cell in FAULT_CASES:
            dest = os.path.join(os.path.dirname(logsdir), f"faults-{kernel}-{cell}.md")
            res["tests"] = fault_rows(kernel, cell, res["tests"], dest)
            res["fault_table"] = os.path.relpath(dest, os.path.dirname(logsdir))
            print(f"   fault table: {dest}" + (f"; traces: {', '.join(res.get('traces', []))}"
                                                if res.get("traces") else ""), flush=True)
        if spec.get("upstream"):
            res["tests"] += upstream_rows(a, kernel, cell, d, logsdir)
        try:
            with open(f"{d}/summary.json") as f:
                sj = json.load(f)
            res["accel"] = sj.get("accel")
            for g in sj.get("guests", []):
                res["boot_s"][g["name"]] = g.get("boot_s")
        except (OSError, ValueError):
            pass
        for gname, gk in res["guest_kernel"].items():
            if not gk.startswith(kernel + "."):
                res["problems"].append(f"guest {gname} runs kernel {gk}, not {kernel}")
    res["wall_s"] = round(time.monotonic() - t0, 1)
    failed = any(t["status"] == "FAIL" for t in res["tests"]) or res["problems"]
    res["status"] = "FAIL" if failed else "PASS"
    for t in res["tests"]:
        if t["status"] == "SKIP":
            print(f"\n*** SKIPPED {kernel}/{cell} {t['test']}: {t['detail']} ***\n", flush=True)
    if failed or a.keep_logs:
        dest = os.path.join(logsdir, f"{kernel}-{cell}")
        shutil.rmtree(dest, ignore_errors=True)
        os.makedirs(dest)
        keep = ["a.console.log", "b.console.log", "daemon.log", "daemon-status.json", "run-guests.log", "summary.json",
                "stuck-flows.json",
                "a.sh", "b.sh", "a.qemu-cmd.sh", "b.qemu-cmd.sh", "faults.json", "daemon.toml",
                "checker-findings.json", "checker-flows.json", "ctl-broker.log", "device-faults.json"]
        if failed:
            keep.append("fabric.pcapng")  # the wire of a failed cell (malformed frames, a broken stream)
        for fn in keep:
            if os.path.exists(f"{d}/{fn}"):
                shutil.copy(f"{d}/{fn}", dest)
        for gname in ("a", "b"):
            jd = f"{d}/{gname}.job"
            if os.path.isdir(jd):
                shutil.copytree(jd, f"{dest}/{gname}.job", dirs_exist_ok=True)
        res["logs"] = os.path.relpath(dest, os.path.dirname(logsdir))
        if failed:
            for gname in ("a", "b"):
                cl = f"{d}/{gname}.console.log"
                if os.path.exists(cl):
                    print(f"--- {gname} console tail ({dest}/{gname}.console.log):")
                    with open(cl, errors="replace") as f:
                        for ln in f.readlines()[-30:]:
                            print("    " + ln.rstrip())
    shutil.rmtree(d, ignore_errors=True)
    st = res["status"]
    nt = {s: sum(1 for t in res["tests"] if t["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
    print(f"{st} {kernel}/{cell}: {nt['PASS']} passed, {nt['FAIL']} failed, {nt['SKIP']} skipped, "
          f"wall {res['wall_s']}s" + (f"; problems: {'; '.join(res['problems'])}" if res["problems"] else ""),
          flush=True)
    for t in res["tests"]:
        bw = f" {t['bw']} MiB/s" if t["bw"] else ""
        print(f"    {t['status']:4} {t['test']:16} {t['secs']:4}s{bw}  {t['detail'][:200]}")
    return res


def known_flake_failures(res, cell):
    """"TEST: FLAKE; ..." when every failed test of the cell names a recognised flake (`scripts/guest-results
    flakes`: the two diagnosed siw connection-setup races in the siw cells, ci/README.md; perftest's clock
    calibration on a loaded host everywhere), else None: anything else fails at once."""
    v, _ = guest_results("flakes", "--cell", cell, input=json.dumps(res["tests"]))
    return v.get("why") if v else None


def run_cell_with_reruns(a, kernel, cell, image, qemu, daemon_bin, vrbin, workroot, logsdir):
    """run_cell, rerun (at most --siw-reruns times) while a siw cell fails only
    by a recognised guest-kernel siw race. Every earlier attempt stays in the
    result ("reruns") and in results.md, with its logs."""
    reruns = []
    while True:
        res = run_cell(a, kernel, cell, image, qemu, daemon_bin, vrbin, workroot, logsdir)
        if res["status"] != "FAIL" or len(reruns) >= a.siw_reruns:
            break
        why = known_flake_failures(res, cell)
        if why is None:
            break
        if res.get("logs"):
            src = os.path.join(os.path.dirname(logsdir), res["logs"])
            dst = f"{src}-attempt{len(reruns) + 1}"
            shutil.rmtree(dst, ignore_errors=True)
            os.rename(src, dst)
            res["logs"] = os.path.relpath(dst, os.path.dirname(logsdir))
        reruns.append({"attempt": len(reruns) + 1, "failed": [t for t in res["tests"] if t["status"] == "FAIL"],
                       "race": why, "logs": res.get("logs"), "wall_s": res["wall_s"]})
        print(f"\n*** RERUN {kernel}/{cell}: attempt {len(reruns)} failed only by a known flake "
              f"({why}); rerunning the cell ({len(reruns)}/{a.siw_reruns}) ***\n", flush=True)
    res["reruns"] = reruns
    return res


def write_report(results_json, out):
    """results.md of a run from its results.json (`scripts/guest-results report`, guest-results/)."""
    r = subprocess.run([GUEST_RESULTS, "report", results_json, "--out", out], capture_output=True, text=True)
    if r.returncode != 0:
        say(f"writing {out} failed (rc={r.returncode}): {r.stderr.strip()[-300:]}")


def combine_runs(paths, out):
    """--combine: one table from several runs' results.json (a later run's cell
    replaces an earlier run's same kernel/cell), e.g. the shards (--shard I/N)
    of one matrix run on several machines; `scripts/guest-results report
    --combine` (guest-results/) writes it and prints the summary line. The
    Cells and Tests tables are the ones a single run of all those cells gives
    (same rows, same order); a "Source runs" section names every run and the
    cells taken from it. Returns 1 when a test failed."""
    return subprocess.run([GUEST_RESULTS, "report", "--combine", "--out", out,
                           "--kernel-order", ",".join(KERNELS), "--cell-order", ",".join(CELL_ORDER + EXTRA_CELLS),
                           "--date", datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), *paths]).returncode


def write_junit(results_json, path):
    """--junit: one <testsuite> per cell (matrix.KERNEL/CELL), one <testcase> per test, from the run's
    results.json (`scripts/guest-results junit --matrix`, guest-results/)."""
    r = subprocess.run([GUEST_RESULTS, "junit", "--out", path,
                        "--name", "ci/matrix.sh", "--matrix", results_json], capture_output=True, text=True)
    say(r.stdout.strip() if r.returncode == 0 else
        f"junit: writing {path} failed (rc={r.returncode}): {r.stderr.strip()[-300:]}")


def cell_key(kc):
    """Sort key of a (kernel, cell): the order a run runs and reports cells."""
    order = CELL_ORDER + EXTRA_CELLS
    return (KERNELS.index(kc[0]) if kc[0] in KERNELS else 99, order.index(kc[1]) if kc[1] in order else 99)


def parse_shard(text):
    """`I/N` (1 <= I <= N) -> (I, N); ValueError otherwise."""
    m = re.fullmatch(r"([0-9]+)/([0-9]+)", text or "")
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise ValueError(f"--shard {text!r}: expected I/N with 1 <= I <= N, e.g. 1/2")
    return int(m.group(1)), int(m.group(2))


def shard_cells(sel, i, n):
    """The cells of shard I of N: those whose index in the run's stable order
    (`sel`, sorted by cell_key) is I-1 modulo N. Shards 1..N together hold
    every cell exactly once, whatever machine computes them."""
    return [kc for idx, kc in enumerate(sorted(sel, key=cell_key)) if idx % n == i - 1]


def kernel_check(path):
    """The version string of bzImage `path` (`scripts/guest-runner kernel-check`,
    built on first use); ValueError with the reason for an unusable image."""
    try:
        r = subprocess.run([os.path.join(ROOT, "scripts", "guest-runner"), "kernel-check", path],
                           capture_output=True, text=True)
    except OSError as e:
        raise ValueError(f"--kernel: cannot run scripts/guest-runner: {e}") from None
    if r.returncode != 0:
        err = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        why = err[-1][len("error: "):] if err else (r.stderr.strip() or f"exit {r.returncode}")
        raise ValueError(f"--kernel: {why}")
    return r.stdout.strip()


def resolve_kernel(a):
    """--kernel is a series (7.3, 6.12, all) or a bring-your-own bzImage PATH.
    For a path: checks the image (`guest-runner kernel-check`) and sets
    a.kernel_image to it, a.kernel_version to its version string and a.kernel
    to its series (from the version: the cells' root disk and expectations);
    the series must be one the matrix knows. ValueError says what is wrong."""
    a.kernel_image, a.kernel_version = None, None
    if a.kernel in KERNELS + ["all"]:
        return
    looks_like_path = os.sep in a.kernel or os.path.exists(a.kernel)
    if not looks_like_path:
        raise ValueError(f"--kernel {a.kernel!r}: a kernel series ({', '.join(KERNELS)}, all) or the path "
                         "of a bzImage (bring your own kernel)")
    version = kernel_check(a.kernel)
    m = re.match(r"(\d+)\.(\d+)", version)
    series = f"{m.group(1)}.{m.group(2)}" if m else None
    if series not in KERNELS:
        raise ValueError(f"--kernel {a.kernel}: Linux {version} is of series {series}; the matrix's cells know "
                         f"{', '.join(KERNELS)} (the series picks the root disk and the expectations)")
    a.kernel_image, a.kernel_version, a.kernel = os.path.abspath(a.kernel), version, series


def select_cells(a):
    """The (kernel, cell) list the arguments ask for, in the run's order;
    ValueError for an unknown cell, or, with a bring-your-own kernel
    (a.kernel_image), for a cell of another series."""
    if a.quick:
        sel = list(QUICK)
    else:
        kernels = KERNELS if a.kernel == "all" else [a.kernel]
        named = [c for c in a.cells.split(",") if c]
        cells = named or CELL_ORDER
        sel = []
        for c in cells:
            if "/" in c:
                k, c2 = c.split("/", 1)
                if k not in KERNELS or c2 not in CELLS:
                    raise ValueError(f"unknown cell {c}")
                sel.append((k, c2))
            else:
                if c not in CELLS:
                    raise ValueError(f"unknown cell {c} (have {', '.join(CELL_ORDER)})")
                # the lossy cells run on 7.3 only unless named with a kernel
                # or --kernel is given (issue 6 asks for 7.3)
                # erdma's RoCEv2 mode is newer than 6.12: its cells are 7.3 only
                sel += [(k, c) for k in kernels
                        if (c not in LOSSY_CELLS or k == "7.3" or a.kernel != "all")
                        and (c not in ERDMA_CELLS or k == "7.3")]
    sel = sorted(set(sel), key=cell_key)
    if getattr(a, "kernel_image", None):
        other = [f"{k}/{c}" for k, c in sel if k != a.kernel]
        if other:
            raise ValueError(f"--kernel {a.kernel_image} is a {a.kernel} kernel; it cannot run "
                             f"{', '.join(other)}")
    if getattr(a, "shard", None):
        sel = shard_cells(sel, *parse_shard(a.shard))
    return sel


# options a side lane's matrix process does not inherit: the parent chooses
# its cells, results, images and QEMU, and builds once for both
SIDE_LANE_DROP = {"--quick": 0, "--dry-run": 0, "--no-build": 0, "--cells": 1, "--shard": 1, "--junit": 1,
                  "--results": 1, "--jobs": 1, "--qemu": 1, "--image-7.3": 1, "--image-6.12": 1,
                  "--combine-out": 1}


def side_lane_args(argv, cells, results, qemu, images, smc_big_bytes):
    """The argument list of the side lane's matrix process (--jobs 2): the
    parent's own arguments less SIDE_LANE_DROP (as "--opt value" or
    "--opt=value"), then CELLS ([(kernel, cell)]), RESULTS, QEMU and the
    parent's IMAGES ({series: dir}), with no build."""
    out, skip = [], 0
    for tok in argv:
        if skip:
            skip -= 1
            continue
        name = tok.split("=", 1)[0]
        if name in SIDE_LANE_DROP:
            skip = SIDE_LANE_DROP[name] if "=" not in tok else 0
            continue
        out.append(tok)
    out += ["--cells", ",".join(f"{k}/{c}" for k, c in cells), "--results", results, "--no-build",
            "--qemu", qemu, "--smc-big-bytes", smc_big_bytes]
    for k, img in sorted(images.items()):
        out += [f"--image-{k}", img]
    return out


class SideLane:
    """--jobs 2: WAITING_CELLS in a second matrix process beside this one; its
    lines are echoed with a "[side]" prefix and its cells' results merged."""

    def __init__(self, argv, cells, resdir, qemu, images, smc_big_bytes):
        self.cells, self.dir = cells, os.path.join(resdir, "side-lane")
        cmd = [sys.executable, os.path.abspath(__file__)] + side_lane_args(
            argv, cells, self.dir, qemu, images, smc_big_bytes)
        say("beside the other cells (--jobs 2): " + " ".join(f"{k}/{c}" for k, c in cells))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.echo = threading.Thread(target=self._echo, daemon=True)
        self.echo.start()

    def _echo(self):
        for line in self.proc.stdout:
            print(f"[side] {line}", end="", flush=True)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def results(self):
        """Wait for the side lane; its cells' result rows (a FAIL row per cell it did not report)."""
        self.proc.wait()
        self.echo.join(timeout=10)
        try:
            with open(os.path.join(self.dir, "results.json")) as f:
                got = {(r["kernel"], r["cell"]): r for r in json.load(f)["cells"]}
        except (OSError, ValueError, KeyError):
            got = {}
        out = []
        for k, c in self.cells:
            r = got.get((k, c))
            if r is None:
                why = f"the side lane (--jobs 2) exited {self.proc.returncode} without a result for it"
                r = {"kernel": k, "cell": c, "what": CELLS[c]["what"], "status": "FAIL", "wall_s": 0,
                     "boot_s": {}, "guest_kernel": {}, "problems": [why], "logs": None,
                     "tests": [{"test": t, "status": "FAIL", "secs": 0, "bw": "", "detail": why}
                               for t, _ in CELLS[c]["tests"]]}
            elif r.get("logs"):
                r["logs"] = os.path.join("side-lane", r["logs"])
            out.append(r)
        return out


def _terminate(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    signal.signal(signal.SIGTERM, _terminate)
    ap = argparse.ArgumentParser(
        prog="ci/matrix.sh", allow_abbrev=False,  # side_lane_args() filters options by their full names
        description="Guest RDMA / SMC-R test matrix: kernel x {rxe, siw, smcr, smc-noueid}, "
                    "two guests per cell through the vhost-rdma daemon.",
        epilog="Cells: " + "; ".join(f"{c}: {CELLS[c]['what']}" for c in CELL_ORDER)
               + ". Ends with 'N passed, M failed, K skipped' (tests); exit 1 if any failed.")
    ap.add_argument("--kernel", default="all", metavar="SERIES|PATH",
                    help="guest kernel(s): " + ", ".join(KERNELS) + " or all (default); or the PATH of a bzImage "
                         "to bring your own kernel (drivers built in; its version's series picks the cells' root "
                         "disk: docs/guest-tests.md, 'Bring your own kernel')")
    ap.add_argument("--append", default="", metavar="ARGS",
                    help="guest kernel command-line additions (run-guests --append)")
    ap.add_argument("--cells", default="", help="comma list of " + ",".join(CELL_ORDER)
                    + " or KERNEL/CELL (default: all cells)")
    ap.add_argument("--quick", action="store_true", help="CI tier: 7.3/rxe, 7.3/smcr, 7.3/erdma-smcr, 7.3/upstream-rdma, 7.3/upstream-nic, 7.3/gve-faults and 7.3/erdma-faults only")
    ap.add_argument("--image-7.3", dest="image_7_3", help="guest image dir for 7.3 (default: build-guest-image.sh)")
    ap.add_argument("--image-6.12", dest="image_6_12", help="guest image dir for 6.12 (default: build-guest-image.sh)")
    ap.add_argument("--qemu", help="QEMU 11.1 (default: scripts/setup-qemu.sh)")
    ap.add_argument("--accel", default="auto", choices=["auto", "kvm", "tcg"])
    ap.add_argument("--net", default="vhost-user", choices=["vhost-user", "stream"],
                    help="guest link: vhost-user = through the vhost-rdma daemon (default); stream = QEMU's own "
                         "virtio-net + -netdev stream, no daemon (to check whether a failure involves the daemon)")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build")
    ap.add_argument("--profile", default="release")
    ap.add_argument("--timeout", type=int, default=0, help="per guest seconds, boot to result (default per cell)")
    ap.add_argument("--results", help="results dir (default ci/results/<date>)")
    ap.add_argument("--keep-logs", action="store_true", help="keep the logs of passed cells too")
    ap.add_argument("--dry-run", action="store_true", help="list the cells and exit")
    ap.add_argument("--verbose", "-v", action="store_true", help="echo all guest output")
    ap.add_argument("--smc-bytes", default="64M", help="smcr cell: bytes per connection and direction (64M)")
    ap.add_argument("--smc-big-bytes", default=None,
                    help="smcr cell: bytes of the one-connection s2c stream (256M; 32M with --quick)")
    ap.add_argument("--smc-many-bytes", default="256K",
                    help="smcr cell: bytes per connection and direction of the 64-connection stream (256K)")
    ap.add_argument("--perftest-iters", type=int, default=500, help="perftest -n (500 x 64 KiB)")
    ap.add_argument("--verbs-size", type=int, default=61441,
                    help="smc-guest-tests verbs --size: bytes per SEND/WRITE/READ (61441 = 15 pages + 1 byte)")
    ap.add_argument("--verbs-iters", type=int, default=8, help="smc-guest-tests verbs --iters (8)")
    ap.add_argument("--tool-timeout", type=int, default=180, help="guest: seconds per RDMA tool run (180)")
    ap.add_argument("--siw-read-outs", type=int, default=16,
                    help="siw: ib_read_bw -o N (16; 0 = perftest's default 128, which fails, see ci/README.md)")
    ap.add_argument("--siw-trace", type=int, default=1, choices=[0, 1],
                    help="siw cell: kprobes on siw connection management + tcp reset/retransmit tracepoints in the "
                         "guests, failures echoed in the console (CI-DIAG), full trace in /job/siw-trace.ROLE.log (1)")
    ap.add_argument("--no-capture", dest="capture", action="store_false",
                    help="do not capture the fabric in the rxe/siw/smcr cells (their tshark test is then SKIPPED)")
    ap.add_argument("--capture-snaplen", type=int, default=0,
                    help="capture truncation length (0 = whole frames, the default: truncated FPDUs and LLC "
                         "messages can make tshark report frames as malformed)")
    ap.add_argument("--capture-max-records", type=int, default=100000,
                    help="stop a cell's capture after this many records (100000)")
    ap.add_argument("--siw-reruns", type=int, default=2,
                    help="rerun a cell at most N times when every failure is a recognised flake: a guest-kernel "
                         "siw race (siw cells) or perftest failing to calibrate its clock on a loaded host "
                         "(2; 0 = never); earlier attempts are reported")
    ap.add_argument("--siw-settle-ms", type=int, default=None,
                    help="siw cells: the daemon holds TCP data behind an MPA Reply this long (`mpa-settle` "
                         f"fault action), a workaround for the guest kernel's siw connection-setup races "
                         f"({SIW_SETTLE_MS}; 0 = off, to see the races; the siw-conn cell runs without it "
                         "unless this is given)")
    ap.add_argument("--siw-conn-rounds", type=int, default=5, help="siw-conn cell: rounds (5)")
    ap.add_argument("--try-unsupported", action="store_true",
                    help="siw: also run ibv_rc_pingpong (expected to fail) as evidence for its SKIP")
    ap.add_argument("--shard", metavar="I/N",
                    help="run only the cells whose index in the selection's stable order is I-1 modulo N "
                         "(shards 1/N .. N/N together run every cell once; merge them with --combine)")
    ap.add_argument("--combine", nargs="+", metavar="RESULTS_DIR",
                    help="write one Markdown table (--combine-out) from these runs' results.json (e.g. the "
                         "shards of one run) and exit; its tables are those one run of all the cells gives")
    ap.add_argument("--combine-out", default=os.path.join(HERE, "RESULTS.md"))
    ap.add_argument("--junit", metavar="FILE", help="also write the results as JUnit XML (one case per test)")
    ap.add_argument("--jobs", type=int, default=1, choices=[1, 2],
                    help="2: the cells that mostly wait for driver timeouts (" + ", ".join(WAITING_CELLS)
                         + ") run beside the others, in a second matrix process (1: one cell at a time)")
    a = ap.parse_args()
    if a.combine:
        return combine_runs(a.combine, a.combine_out)
    if a.smc_big_bytes is None:
        a.smc_big_bytes = "32M" if a.quick else "256M"
    for opt in ("smc_bytes", "smc_big_bytes", "smc_many_bytes"):
        if not re.fullmatch(r"[0-9]+[KMGkmg]?", getattr(a, opt)):
            ap.error(f"--{opt.replace('_', '-')}: a number with an optional K/M/G suffix")
    JOB_ENV.update(CI_SMC_BYTES=a.smc_bytes, CI_SMC_BIG_BYTES=a.smc_big_bytes, CI_SMC_MANY_BYTES=a.smc_many_bytes,
                   CI_PERFTEST_ITERS=str(a.perftest_iters),
                   CI_VERBS_SIZE=str(a.verbs_size), CI_VERBS_ITERS=str(a.verbs_iters),
                   CI_TOOL_TIMEOUT=str(a.tool_timeout), CI_SIW_READ_OUTS=str(a.siw_read_outs),
                   CI_SIW_TRACE=str(a.siw_trace), CI_SIW_CONN_ROUNDS=str(a.siw_conn_rounds),
                   CI_TRY_UNSUPPORTED="1" if a.try_unsupported or os.environ.get("CI_TRY_UNSUPPORTED") else "",
                   # upstream-nic: only these files (e.g. "gro.py hw/gro_hw.py"), for a quick check
                   CI_NIC_FILES=os.environ.get("CI_NIC_FILES", ""))

    CELLS["siw-conn"]["tests"] = [("link-add-siw", BOTH)] + [
        (f"{t}-{r}", BOTH) for r in range(1, a.siw_conn_rounds + 1) for t in ("ucmatose", "ib_read_bw")]
    try:
        resolve_kernel(a)
        sel = select_cells(a)
    except ValueError as e:
        ap.error(str(e))
    if a.kernel_image:
        say(f"guest kernel (--kernel): {a.kernel_image}, Linux {a.kernel_version}")
    if a.dry_run:
        for k, c in sel:
            print(f"{k}/{c}: {CELLS[c]['what']}")
        return 0

    date = datetime.datetime.now().strftime("%Y-%m-%d_%H%M%S")
    resdir = os.path.abspath(a.results or os.path.join(HERE, "results", date))
    os.makedirs(resdir, exist_ok=True)
    logsdir = os.path.join(resdir, "logs")
    work = tempfile.mkdtemp(prefix="vr-matrix.")
    say(f"results: {resdir}; work dir: {work}")
    say("cells: " + " ".join(f"{k}/{c}" for k, c in sel))

    results = []

    def fail_all(kc_list, why):
        for k, c in kc_list:
            results.append({"kernel": k, "cell": c, "what": CELLS[c]["what"], "status": "FAIL", "wall_s": 0,
                            "boot_s": {}, "guest_kernel": {}, "problems": [why], "logs": None,
                            "tests": [{"test": t, "status": "FAIL", "secs": 0, "bw": "", "detail": why}
                                      for t, _ in CELLS[c]["tests"]]})
            print(f"FAIL {k}/{c}: {why}", flush=True)

    tdir = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"), a.profile)
    setup_err = None
    if not a.no_build:
        say(f"cargo build --profile {a.profile} -p vhost-rdma -p smc-guest-tests")
        with open(os.path.join(work, "build.log"), "w") as bl:
            rc = subprocess.call(["cargo", "build", "--profile", a.profile, "-p", "vhost-rdma",
                                  "-p", "smc-guest-tests"], cwd=ROOT, stdout=bl, stderr=subprocess.STDOUT)
        if rc != 0:
            os.makedirs(logsdir, exist_ok=True)
            shutil.copy(os.path.join(work, "build.log"), logsdir)
            setup_err = f"cargo build failed (logs/build.log)"
    daemon_bin, sgt = os.path.join(tdir, "vhost-rdma"), os.path.join(tdir, "smc-guest-tests")
    if not setup_err:
        for b in (daemon_bin, sgt):
            if not os.access(b, os.X_OK):
                setup_err = f"missing binary {b}"
    qemu = a.qemu
    if not setup_err and not qemu:
        say("QEMU 11.1: scripts/setup-qemu.sh")
        qemu = last_line([os.path.join(ROOT, "scripts", "setup-qemu.sh")], os.path.join(work, "qemu.log"))
        if not qemu or not os.access(qemu, os.X_OK):
            setup_err = "scripts/setup-qemu.sh failed"
    if setup_err:
        fail_all(sel, setup_err)
    else:
        vrbin = os.path.join(work, "vrbin")
        os.makedirs(os.path.join(vrbin, "bin"))
        os.makedirs(os.path.join(vrbin, "ci"))
        shutil.copy(sgt, os.path.join(vrbin, "bin", "smc-guest-tests"))
        shutil.copy(os.path.join(HERE, "guest", "ci-lib.sh"), os.path.join(vrbin, "ci", "ci-lib.sh"))
        shutil.copy(os.path.join(ROOT, "scripts", "guest", "rdma-lib.sh"), os.path.join(vrbin, "ci", "rdma-lib.sh"))
        shutil.copytree(os.path.join(HERE, "guest", "repro"), os.path.join(vrbin, "ci", "repro"))
        if any(CELLS[c].get("upstream") == "nic" for _, c in sel):
            # the kernel's NIC selftests, from the guest kernel's own source
            nst = last_line([os.path.join(ROOT, "scripts", "build-nic-selftests.sh")],
                            os.path.join(work, "nic-selftests.log"))
            if nst:
                shutil.copytree(os.path.join(nst, "src"), os.path.join(vrbin, "nic-selftests"), symlinks=True)
            else:
                say("scripts/build-nic-selftests.sh failed: the upstream-nic cells will report no results")
        interrupted = False
        images = {"7.3": a.image_7_3, "6.12": a.image_6_12}
        side = None
        for k in KERNELS:
            kc = [x for x in sel if x[0] == k]
            if not kc:
                continue
            img = images[k]
            if not img:
                say(f"guest image {k}: scripts/build-guest-image.sh --kernel {k} (a first build compiles the kernel: ~6 min on 2 cores)")
                img = last_line([os.path.join(ROOT, "scripts", "build-guest-image.sh"), "--kernel", k],
                                os.path.join(work, f"image-{k}.log"))
            if not img or not (os.path.isfile(f"{img}/bzImage") and os.path.isfile(f"{img}/rootfs.ext4")):
                fail_all(kc, f"no guest image for kernel {k} ({img!r})")
                continue
            say(f"image {k}: {img}")
            waiting = [x for x in kc if x[1] in WAITING_CELLS]
            if a.jobs > 1 and side is None and waiting and len(waiting) < len(kc):
                side = SideLane(sys.argv[1:], waiting, resdir, qemu, {k: img}, a.smc_big_bytes)
                kc = [x for x in kc if x not in waiting]
            for _, c in kc:
                try:
                    results.append(run_cell_with_reruns(a, k, c, img, qemu, daemon_bin, vrbin, work, logsdir))
                except KeyboardInterrupt:
                    interrupted = True
                    fail_all([(k, c)], "interrupted")
                    break
            if interrupted:
                break
        if side is not None:
            if interrupted:
                side.stop()
            say("waiting for the side lane")
            try:
                results += side.results()
            except KeyboardInterrupt:
                side.stop()
                results += side.results()
            results.sort(key=lambda r: cell_key((r["kernel"], r["cell"])))

    n = {s: sum(1 for r in results for t in r["tests"] if t["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
    summary = f"{n['PASS']} passed, {n['FAIL']} failed, {n['SKIP']} skipped"
    n_reruns = sum(len(r.get("reruns", [])) for r in results)
    if n_reruns:
        summary += f" ({n_reruns} cell rerun(s) after a known flake, listed in results.md)"
    cells_failed = [f"{r['kernel']}/{r['cell']}" for r in results if r["status"] == "FAIL"]
    try:
        commit = subprocess.run(["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    qv = ""
    if qemu:
        try:
            qv = subprocess.run([qemu, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        except OSError:
            pass
    meta = {"date": date, "host": os.uname().nodename, "commit": commit, "qemu_version": qv,
            "accel": next((r.get("accel") for r in results if r.get("accel")), a.accel),
            "command": " ".join(["ci/matrix.sh"] + sys.argv[1:]), "summary": summary,
            "kernel_image": a.kernel_image, "kernel_version": a.kernel_version,
            "cells_failed": cells_failed}
    with open(os.path.join(resdir, "results.json"), "w") as f:
        json.dump({"meta": meta, "cells": results}, f, indent=1)
    write_report(os.path.join(resdir, "results.json"), os.path.join(resdir, "results.md"))
    if a.junit:
        write_junit(os.path.join(resdir, "results.json"), a.junit)
    shutil.rmtree(work, ignore_errors=True)

    print("\n== matrix summary")
    for r in results:
        nt = {s: sum(1 for t in r["tests"] if t["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
        print(f"{r['status']} {r['kernel']}/{r['cell']}: {nt['PASS']}/{nt['FAIL']}/{nt['SKIP']} "
              f"pass/fail/skip, wall {r['wall_s']}s")
    print(f"results: {resdir}/results.md")
    if cells_failed:
        print(f"logs of failed cells: {logsdir}")
    print(summary)
    return 1 if n["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
