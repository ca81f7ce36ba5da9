#!/usr/bin/env python3
"""Fail when the top-level modules of a workspace crate import each other in
a cycle. A module's dependencies are the `crate::MODULE` paths it names
(outside `#[cfg(test)] mod tests` and comments). Binary-only modules (main.rs
and what it declares) count like any other.

    scripts/check-module-cycles.py [-v]    # -v: print each crate's graph
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def crates():
    text = open(os.path.join(ROOT, "Cargo.toml")).read()
    members = re.search(r"members\s*=\s*\[(.*?)\]", text, re.S).group(1)
    return re.findall(r'"([^"]+)"', members)


def graph(crate):
    src = os.path.join(ROOT, crate, "src")
    files = {}
    for root, _, names in os.walk(src):
        for n in names:
            if n.endswith(".rs"):
                rel = os.path.relpath(os.path.join(root, n), src)
                top = rel.split(os.sep)[0].removesuffix(".rs")
                if top not in ("lib", "main"):
                    files.setdefault(top, []).append(os.path.join(root, n))
    deps = {m: set() for m in files}
    for m, paths in files.items():
        for p in paths:
            code = open(p).read()
            code = re.sub(r"#\[cfg\(test\)\]\s*mod tests\s*\{.*", "", code, flags=re.S)
            code = re.sub(r"//.*", "", code)
            for t in re.findall(r"crate::(\w+)", code):
                if t != m and t in files:
                    deps[m].add(t)
            for group in re.findall(r"use crate::\{([^}]*)\}", code):
                for t in re.findall(r"\b(\w+)\b", group):
                    if t != m and t in files:
                        deps[m].add(t)
    return deps


def cycles(deps):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in deps[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(deps):
        if v not in index:
            visit(v)
    return out


def main():
    sys.setrecursionlimit(10000)
    bad = 0
    for c in crates():
        deps = graph(c)
        if "-v" in sys.argv:
            for m in sorted(deps):
                print(f"{c}: {m} -> {', '.join(sorted(deps[m])) or '-'}")
        for cyc in cycles(deps):
            bad += 1
            print(f"{c}: import cycle between modules {', '.join(cyc)}")
    if bad:
        print(f"{bad} import cycle(s)")
        return 1
    print(f"{len(crates())} crates: no import cycle between top-level modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
