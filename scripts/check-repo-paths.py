#!/usr/bin/env python3
"""Fail when a tracked file refers to a path outside the repository.

A user's clone has nothing beside it, so code, tests and docs may not reach
into a sibling directory (such as a `shared/` beside the checkout) or into
the developers' workplace
(`/work/...`). Checked: every relative path written with leading `../` that,
resolved against the directory of the file that names it, leaves the
repository; and every absolute `/work/` path. `.ci/run` (CI's own
configuration) is exempt. A line that must name such a path (a symlink
target inside a built tree, say) carries the marker `repo-paths: allow`.

    scripts/check-repo-paths.py        # exit 1 and one line per finding
"""
import os
import re
import subprocess
import sys

# .ci/run may point at CI's prebuilt kernels; this file names the patterns it looks for.
EXEMPT_FILES = {".ci/run", "scripts/check-repo-paths.py"}
BINARY_SUFFIXES = (".pcap", ".pcapng", ".lock", ".png", ".gz", ".bin")
# `../` runs not glued to a preceding path component or variable ($X/..).
RELATIVE = re.compile(r"(?<![\w$}/.\-])((?:\.\./)+)([\w.\-]+)")
WORKPLACE = re.compile(r"(?<![\w.\-])/work/")
MARKER = "repo-paths: allow"


def main() -> int:
    root = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    files = subprocess.check_output(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root, text=True
    ).splitlines()
    findings = []
    for name in files:
        if name in EXEMPT_FILES or name.endswith(BINARY_SUFFIXES):
            continue
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        depth = name.count("/")  # directories between the file and the root
        for lineno, line in enumerate(text.splitlines(), 1):
            if MARKER in line:
                continue
            for m in RELATIVE.finditer(line):
                if m.group(1).count("../") > depth:
                    findings.append(f"{name}:{lineno}: '{m.group(0)}' leaves the repository")
            if WORKPLACE.search(line):
                findings.append(f"{name}:{lineno}: absolute /work/ path")
    for f in findings:
        print(f)
    if findings:
        print(f"{len(findings)} reference(s) to paths outside the repository; "
              "bring the file in, or make it an option (see scripts/check-repo-paths.py)")
        return 1
    print(f"checked {len(files)} files: no path outside the repository")
    return 0


if __name__ == "__main__":
    sys.exit(main())
