#!/usr/bin/env python3
"""Runs every `vhost-rdma` command line shown in README.md and docs/*.md
against a live daemon, so the examples cannot rot (issue 16).

    scripts/check-doc-examples.py [--bin PATH] [FILE.md...]

What counts as an example: a line of a fenced code block whose command word
is `vhost-rdma` (or a path ending in /vhost-rdma), after an optional `$ `
prompt, `sudo` and NAME=VALUE prefixes, with `\\` continuations joined. In a
block that has `$ ` prompts, only the prompt lines are commands (the rest is
output). A block assigning a command to a variable (`C="vhost-rdma ctl ..."`)
makes `$C ...` lines examples too (in that block and the file's later ones). Anything after a shell operator
(`|`, `>`, `;`, `&&`, ...) or a `#` comment is not run.

How an example is run:
  - socket paths: every `*.sock` path (alone or inside `NAME=PATH,...`) is
    rewritten to the temporary directory, keeping its file name; for `ctl`
    the `--control` value becomes the live daemon's control socket, which is
    also in VHOST_RDMA_CONTROL (as the README's `export` sets it);
  - `[...]` optional parts: run without them, and once with each group (each
    `|` alternative separately); a group holding a placeholder is only left out;
  - placeholders: an argument that is an upper-case word (`ID`, `N`, `PORT`)
    becomes `1`; an example with `<...>` placeholders left is SKIPPED;
  - `ctl` lines go to one live daemon (ports a, b; virtual host vh with a
    pingpong-server); a runtime refusal (no guest on the port, no such
    rule) is fine, a usage error is not: exit status 2, or clap's words
    ("unexpected argument", "unrecognized subcommand", "invalid value",
    "required arguments", "Usage:") on stderr. A hang (10 s) fails too;
  - `serve` lines start their own daemon (paths rewritten) which must come up
    (every rewritten socket present, process alive) and is then stopped;
  - anything else (`--help`, `--print-capabilities`, ...) runs once, same rule.
An HTML comment `<!-- example: skip REASON -->` on the line before a fence
skips that block's examples (printed as SKIPPED with the reason), for
examples that need a guest or root.

Prints one PASS/FAIL/SKIPPED line per example and ends with
"N passed, M failed, K skipped"; exit 1 if any failed.
"""

import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_RE = re.compile(r"<!--\s*example:\s*skip\b\s*(.*?)\s*-->")
FENCE_RE = re.compile(r"^\s*(```|~~~)")
ASSIGN_RE = re.compile(r"""^([A-Za-z_][A-Za-z0-9_]*)=(["'])(.*vhost-rdma\b.*)\2\s*$""")
OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>", "2>&1", "|&"}
USAGE_WORDS = ("unexpected argument", "unrecognized subcommand", "invalid value",
               "required arguments were not provided", "a value is required", "Usage:")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")
TIMEOUT = 10


def blocks(path):
    """Yields (first line number, lines, skip reason or None) of every fenced block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE_RE.match(lines[i])
        if not m:
            i += 1
            continue
        skip = None
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            sm = SKIP_RE.search(lines[j])
            if sm:
                skip = sm.group(1) or "marked skip"
        end = i + 1
        while end < len(lines) and not lines[end].lstrip().startswith(m.group(1)):
            end += 1
        yield i + 2, lines[i + 1:end], skip
        i = end + 1


def logical_lines(first, body):
    """(line number, text) with `\\` continuations joined."""
    out, cur, start = [], "", None
    for n, ln in enumerate(body, first):
        if start is None:
            start = n
        if ln.rstrip().endswith("\\"):
            cur += ln.rstrip()[:-1] + " "
            continue
        out.append((start, cur + ln))
        cur, start = "", None
    if cur:
        out.append((start, cur))
    return out


def examples(path):
    """(where, command text, skip reason) for every example of a Markdown file."""
    rel = os.path.relpath(path, ROOT)
    vars_ = {}  # a variable set in one block is used in later ones (one shell session per file)
    for first, body, skip in blocks(path):
        prompts = any(ln.startswith("$ ") for ln in body)
        for n, text in logical_lines(first, body):
            if prompts:
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            m = ASSIGN_RE.match(text.strip())
            if m:
                vars_[m.group(1)] = m.group(3)
                continue
            for name, val in vars_.items():
                text = re.sub(r"^(\s*)\$\{?" + name + r"\b\}?", lambda mm: mm.group(1) + val, text)
            try:
                toks = shlex.split(text, comments=True)
            except ValueError:
                continue
            while toks and (toks[0] == "sudo" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0])):
                toks.pop(0)
            if toks and os.path.basename(toks[0]) == "vhost-rdma":
                yield f"{rel}:{n}", text, skip


def variants(text):
    """The command lines an example stands for: without its [...] groups, then
    with each group (each | alternative) in turn."""
    groups = list(re.finditer(r"\[([^\[\]]*)\]", text))
    strip = lambda keep=None, alt=None: "".join(  # noqa: E731
        (text[prev:g.start()] + (alt if g is keep else ""))
        for prev, g in zip([0] + [x.end() for x in groups], groups)) + text[groups[-1].end():]
    if not groups:
        return [text]
    out = [strip()]
    for g in groups:
        words = g.group(1).split()
        if any(PLACEHOLDER.match(w) for w in words) or "<" in g.group(1):
            continue
        for alt in g.group(1).split("|"):
            out.append(strip(g, alt.strip()))
    return out


def argv_of(text, tmp, control):
    """The argv of one variant: cut at shell operators, sockets and placeholders
    rewritten. None if a <...> placeholder is left."""
    toks = shlex.split(text, comments=True)
    while toks and (toks[0] == "sudo" or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", toks[0])):
        toks.pop(0)
    cut = next((i for i, t in enumerate(toks) if t in OPERATORS or t.startswith(("2>", ">"))), len(toks))
    toks = toks[1:cut]
    if any("<" in t and ">" in t for t in toks):
        return None
    out = []
    for i, t in enumerate(toks):
        if i > 0 and toks[i - 1] == "--control" and control:
            t = control
        else:
            t = re.sub(r"(?<![\w.-])(/?[\w./-]*?)([\w.-]+\.sock)\b", lambda m: os.path.join(tmp, m.group(2)), t)
        if PLACEHOLDER.match(t):
            t = "1"
        out.append(t)
    return out


def usage_error(rc, err):
    if rc == 2:
        return "exit status 2 (usage)"
    hit = next((w for w in USAGE_WORDS if w in err), None)
    return f"clap usage message ({hit!r})" if hit else None


def start_daemon(binary, args, tmp, wait_for):
    log = open(os.path.join(tmp, "daemon.log"), "ab")
    # cwd: relative paths in examples (capture files) land in the temporary directory;
    # XDG_RUNTIME_DIR: so does a daemon's own control socket (serve without --control)
    p = subprocess.Popen([binary] + args, stdout=log, stderr=subprocess.STDOUT, cwd=tmp,
                         env=dict(os.environ, NO_COLOR="1", RUST_BACKTRACE="0", XDG_RUNTIME_DIR=tmp))
    t0 = time.monotonic()
    while time.monotonic() - t0 < TIMEOUT:
        if p.poll() is not None:
            return p, f"exited {p.returncode}"
        if all(os.path.exists(w) for w in wait_for):
            return p, None
        time.sleep(0.05)
    return p, f"sockets {', '.join(w for w in wait_for if not os.path.exists(w))} missing after {TIMEOUT}s"


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            return "did not stop within 5 s of SIGTERM (killed)"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"),
                                                  "debug", "vhost-rdma"), help="the daemon (default: cargo's debug build)")
    ap.add_argument("files", nargs="*", help="Markdown files (default README.md docs/*.md)")
    a = ap.parse_args()
    files = a.files or [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    n = {"PASS": 0, "FAIL": 0, "SKIPPED": 0}

    def record(st, name, detail):
        n[st] += 1
        print(f"{st} {name}: {detail}", flush=True)

    if not os.access(a.bin, os.X_OK):
        record("FAIL", "daemon binary", f"{a.bin} missing (cargo build -p vhost-rdma)")
        print(f"{n['PASS']} passed, {n['FAIL']} failed, {n['SKIPPED']} skipped")
        return 1
    tmp = tempfile.mkdtemp(prefix="vr-doc-examples.")
    live = os.path.join(tmp, "live")
    os.makedirs(live)
    control = os.path.join(live, "ctl.sock")
    # ctl runs in the capture directory: `capture start --file NAME` names a file there
    captures = os.path.join(live, "captures")
    os.makedirs(captures)
    daemon, why = start_daemon(a.bin, ["serve", "--port", f"a={live}/a.sock", "--port", f"b={live}/b.sock",
                                       "--host", "vh=10.77.0.10/24,service=pingpong-server",
                                       "--capture-dir", captures, "--control", control], tmp, [control])
    if why:
        record("FAIL", "live daemon", f"did not come up: {why} (log {tmp}/daemon.log)")
        stop(daemon)
        print(f"{n['PASS']} passed, {n['FAIL']} failed, {n['SKIPPED']} skipped")
        return 1
    env = dict(os.environ, VHOST_RDMA_CONTROL=control, NO_COLOR="1", RUST_BACKTRACE="0",
               XDG_RUNTIME_DIR=tmp)
    found = 0
    try:
        for path in files:
            for where, text, skip in examples(path):
                found += 1
                for k, v in enumerate(variants(text)):
                    name = f"{where} {' '.join(shlex.split(v, comments=True))}"
                    if skip:
                        record("SKIPPED", name, skip)
                        continue
                    args = argv_of(v, tmp, None)
                    if args is None:
                        record("SKIPPED", name, "a <...> placeholder the check cannot fill")
                        continue
                    if args[:1] == ["serve"]:
                        sdir = tempfile.mkdtemp(dir=tmp, prefix="serve.")
                        args = argv_of(v, sdir, None)
                        socks = [s for t in args for s in re.findall(r"(/[^,=\s]*\.sock)", t)]
                        p, why = start_daemon(a.bin, args, sdir, socks)
                        bad = stop(p)
                        if why:
                            record("FAIL", name, f"serve did not come up: {why}; log {sdir}/daemon.log")
                        elif bad:
                            record("FAIL", name, bad)
                        else:
                            record("PASS", name, f"came up ({len(socks)} sockets) and stopped on SIGTERM")
                        continue
                    if args[:1] == ["ctl"]:
                        args = argv_of(v, live, control)
                    try:
                        r = subprocess.run([a.bin] + args, capture_output=True, text=True, env=env,
                                           timeout=TIMEOUT, stdin=subprocess.DEVNULL, cwd=captures)
                    except subprocess.TimeoutExpired:
                        record("FAIL", name, f"no answer within {TIMEOUT}s")
                        continue
                    err = r.stderr.strip()
                    bad = usage_error(r.returncode, err)
                    if bad:
                        first = next((ln for ln in err.splitlines() if ln.strip()), "")
                        record("FAIL", name, f"{bad}: {first}")
                    elif r.returncode == 0:
                        record("PASS", name, "exit 0")
                    else:
                        record("PASS", name, f"exit {r.returncode}, a runtime refusal, not a usage error: "
                                             f"{err.splitlines()[-1] if err else ''}")
        if daemon.poll() is not None:
            record("FAIL", "live daemon", f"died during the examples (exit {daemon.returncode}, log {tmp}/daemon.log)")
    finally:
        bad = stop(daemon)
    if bad:
        record("FAIL", "live daemon", bad)
    if found == 0:
        record("FAIL", "examples", f"no vhost-rdma example found in {', '.join(files)}: the extractor is broken")
    if not n["FAIL"]:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"logs: {tmp}")
    print(f"{n['PASS']} passed, {n['FAIL']} failed, {n['SKIPPED']} skipped")
    return 1 if n["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
