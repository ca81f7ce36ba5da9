#!/usr/bin/env python3
"""PNG plots next to the benchmark and soak Markdown tables (issue 16).

    ci/plot.py TABLE.md OUT.png [--title T] [--table N]
        one horizontal bar chart per numeric column of the file's N-th (first)
        Markdown table, side by side, one bar per row
    ci/plot.py --csv FILE.csv OUT.png --x COL --y COL[,COL...] [--title T]
        a line chart (the soak's rss.csv: memory over time)

Table rules: the first column and the non-numeric columns right after it label the rows;
a column is plotted when its cells are numbers (a trailing note such as
"1234 (5)" keeps the first number; "?", "-", "FAILED" are gaps); cells
"a / b" under a header "NAME (x / y)" become two columns "NAME (x)" and
"NAME (y)"; other cells holding several numbers and rows whose label is bold
(the ratio rows, "**SMC/TCP**") are left out.

Needs matplotlib (Debian: python3-matplotlib, scripts/install-deps.sh), Agg
backend, no display. Without it: prints "plot: SKIPPED ..." and exits 3; the
bench scripts go on (a missing plot never fails a benchmark).
"""

import argparse
import csv
import math
import os
import re
import sys

NUM = re.compile(r"^\s*(-?\d+(?:\.\d+)?)(?:\s*[a-zA-Z%/]*)?(?:\s*\(.*\))?\s*$")
SYSTEM_PYTHON = "/usr/bin/python3"


def tables(text):
    """Every Markdown table of text: lists of rows (lists of cell strings), header first."""
    out, cur = [], []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("|") and s.endswith("|") and len(s) > 1:
            cells = [c.strip() for c in s[1:-1].split("|")]
            if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
                continue  # the header separator
            cur.append(cells)
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def number(cell):
    m = NUM.match(cell.replace("**", ""))
    return float(m.group(1)) if m else None


def split_pairs(table):
    """A column "NAME (x / y)" whose cells are "a / b" becomes "NAME (x)" and "NAME (y)"."""
    head = table[0]
    for i in reversed(range(len(head))):
        m = re.fullmatch(r"(.*?)\s*\((\w[^/()]*?) / (\w[^/()]*?)\)", head[i])
        cells = [r[i] if i < len(r) else "" for r in table[1:]]
        if m and any(" / " in c for c in cells) and all(" / " in c or not c.strip() for c in cells):
            table = [r[:i] + [f"{m.group(1)} ({m.group(2)})", f"{m.group(1)} ({m.group(3)})"] + r[i + 1:]
                     if n == 0 else r[:i] + (r[i].split(" / ", 1) if " / " in r[i] else ["", ""]) + r[i + 1:]
                     for n, r in enumerate(table)]
    return table


def series(table):
    """(row labels, [(column name, values)]) of a parsed table."""
    table = split_pairs(table)
    head, rows = table[0], [r for r in table[1:] if len(r) == len(table[0])]
    gap = {"?", "-", "", "FAILED", "n/a"}
    numeric = [i for i in range(len(head))
               if any(number(r[i]) is not None for r in rows)
               and all(number(r[i]) is not None or r[i].replace("*", "") in gap for r in rows)]
    # the first column always labels (it may be a number: connections, pair),
    # and so do the non-numeric columns right after it
    nlab = next((i for i in range(1, len(head)) if i in numeric), len(head))
    rows = [r for r in rows if not any(re.fullmatch(r"\*\*.*\*\*", c) for c in r[:nlab])]
    labels = [" ".join(c.replace("**", "") for c in r[:nlab] if c) for r in rows]
    cols = [(head[i], [number(r[i]) for r in rows]) for i in numeric if i >= nlab]
    return labels, cols


def pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def bar_chart(plt, labels, cols, title, out):
    ncol = min(3, len(cols))  # at most 3 charts side by side, then a new row
    nrow = math.ceil(len(cols) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(max(4.0, 3.6 * ncol), nrow * (1.0 + 0.45 * len(labels)) + 0.4),
                             sharey=True, squeeze=False)
    y = list(range(len(labels)))
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(cols):]:
        ax.set_visible(False)
    for ax, (name, vals) in zip(flat, cols):
        v = [0 if x is None else x for x in vals]
        bars = ax.barh(y, v, color="#4878a8")
        for b, x in zip(bars, vals):
            ax.annotate("?" if x is None else f"{x:g}", (b.get_width(), b.get_y() + b.get_height() / 2),
                        xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
        ax.set_title(name, fontsize=9, wrap=True)
        ax.margins(x=0.25)
        ax.tick_params(axis="x", labelsize=8)
    for row in axes:
        row[0].set_yticks(y, labels, fontsize=8)
    axes[0][0].invert_yaxis()  # shared: the table's first row on top everywhere
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def line_chart(plt, path, x, ys, title, out):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for y in ys:
        pts = [(float(r[x]), float(r[y])) for r in rows if r.get(x) not in (None, "") and r.get(y) not in (None, "")]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=y)
    ax.set_xlabel(x)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return len(rows)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="ci/plot.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="Markdown file (or CSV with --csv)")
    ap.add_argument("out", help="PNG to write")
    ap.add_argument("--title")
    ap.add_argument("--table", type=int, default=1, help="which table of the file (1 = first)")
    ap.add_argument("--csv", action="store_true", help="input is CSV: line chart of --y over --x")
    ap.add_argument("--x")
    ap.add_argument("--y", help="comma list of columns")
    a = ap.parse_args(argv)
    plt = pyplot()
    if plt is None:
        # Debian's python3-matplotlib belongs to /usr/bin/python3; a python3 from
        # pyenv or a venv earlier in PATH does not see it: retry with Debian's once.
        if (os.access(SYSTEM_PYTHON, os.X_OK) and not os.environ.get("VR_PLOT_REEXEC")
                and os.path.realpath(sys.executable) != os.path.realpath(SYSTEM_PYTHON)):
            os.execve(SYSTEM_PYTHON, [SYSTEM_PYTHON, os.path.abspath(__file__)] + argv,
                      dict(os.environ, VR_PLOT_REEXEC="1"))
        print(f"plot: SKIPPED {a.out}: matplotlib is not installed (apt-get install python3-matplotlib)",
              file=sys.stderr)
        return 3
    title = a.title or os.path.basename(a.input)
    if a.csv:
        if not a.x or not a.y:
            ap.error("--csv needs --x and --y")
        n = line_chart(plt, a.input, a.x, a.y.split(","), title, a.out)
        print(f"plot: {a.out} ({n} points)")
        return 0
    ts = tables(open(a.input, errors="replace").read())
    if len(ts) < a.table:
        print(f"plot: no table {a.table} in {a.input}", file=sys.stderr)
        return 1
    labels, cols = series(ts[a.table - 1])
    cols = [(n, v) for n, v in cols if any(x is not None and not math.isnan(x) for x in v)]
    if not labels or not cols:
        print(f"plot: table {a.table} of {a.input} has no numeric column", file=sys.stderr)
        return 1
    bar_chart(plt, labels, cols, title, a.out)
    print(f"plot: {a.out} ({len(labels)} rows x {len(cols)} columns: {', '.join(n for n, _ in cols)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
