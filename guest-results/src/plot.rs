//! `guest-results plot`: SVG charts next to the benchmark and soak Markdown
//! tables (issue 16; ci/plot.py before issue 26).
//!
//! - [`bar_chart_file`]: one horizontal bar chart per numeric column of a
//!   Markdown table, side by side (at most 3 per row), one bar per table row.
//! - [`line_chart_file`]: a line chart from a CSV file (the soak's rss.csv:
//!   the daemon's memory over time).
//!
//! SVG is written directly: a plain text format every browser shows, so the
//! plots need no plotting library and never get skipped.
//!
//! Table rules ([`series`]): the first column and the non-numeric columns
//! right after it label the rows; a column is plotted when its cells are
//! numbers (a trailing unit or note such as "1234 (5)" keeps the first
//! number; "?", "-", "", "FAILED", "n/a" are gaps); cells "a / b" under a
//! header "NAME (x / y)" become two columns "NAME (x)" and "NAME (y)"; other
//! cells holding several numbers, and rows whose label is bold (the ratio
//! rows, "**SMC/TCP**"), are left out.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;

use crate::pytext::{splitlines, strip};

/// Why a chart was not drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Reading the input or writing the chart failed.
    #[error("{path}: {source}")]
    Io {
        /// the file
        path: String,
        /// the I/O error
        source: std::io::Error,
    },
    /// The Markdown file has fewer tables than asked for.
    #[error("no table {n} in {path}")]
    NoTable {
        /// the table's number (1 = first)
        n: usize,
        /// the Markdown file
        path: String,
    },
    /// The table has no row or no column with a number in it.
    #[error("table {n} of {path} has no numeric column")]
    NoNumeric {
        /// the table's number (1 = first)
        n: usize,
        /// the Markdown file
        path: String,
    },
    /// A CSV cell under --x or --y is not a number.
    #[error("{path} line {line}: column {col}: {cell:?} is not a number")]
    CsvNumber {
        /// the CSV file
        path: String,
        /// 1-based line number
        line: usize,
        /// the column's name
        col: String,
        /// the cell
        cell: String,
    },
}

/// A cell that is a number, maybe followed by a unit and a note in parentheses.
static NUM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(-?\d+(?:\.\d+)?)(?:\s*[a-zA-Z%/]*)?(?:\s*\(.*\))?\s*$").expect("NUM regex")
});
static SEPARATOR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^:?-{3,}:?$").expect("SEPARATOR regex"));
static PAIR_HEAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(.*?)\s*\((\w[^/()]*?) / (\w[^/()]*?)\)$").expect("PAIR_HEAD regex")
});
static BOLD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^\*\*.*\*\*$").expect("BOLD regex"));

/// A Markdown table: rows of cell strings, the header first.
pub type Table = Vec<Vec<String>>;

/// One plotted column: its header and one value per labelled row (`None`: a gap).
pub type Column = (String, Vec<Option<f64>>);

/// Every Markdown table of `text`, the header separator rows left out.
pub fn tables(text: &str) -> Vec<Table> {
    let mut out = Vec::new();
    let mut cur: Table = Vec::new();
    for line in splitlines(text) {
        let s = strip(line);
        if s.len() > 1 && s.starts_with('|') && s.ends_with('|') {
            let cells: Vec<String> = s[1..s.len() - 1]
                .split('|')
                .map(|c| strip(c).to_string())
                .collect();
            if cells.iter().all(|c| SEPARATOR.is_match(c)) {
                continue;
            }
            cur.push(cells);
        } else if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The number a cell starts with, bold markers ignored; `None` when the cell
/// is not a number (with optional unit and note).
pub fn number(cell: &str) -> Option<f64> {
    let cell = cell.replace("**", "");
    let m = NUM.captures(&cell)?;
    m.get(1)?.as_str().parse().ok()
}

/// Splits every column "NAME (x / y)" whose cells are "a / b" (or empty)
/// into "NAME (x)" and "NAME (y)".
fn split_pairs(mut table: Table) -> Table {
    let Some(head) = table.first().cloned() else {
        return table;
    };
    for i in (0..head.len()).rev() {
        let Some(m) = PAIR_HEAD.captures(&head[i]) else {
            continue;
        };
        let cells: Vec<&str> = table[1..]
            .iter()
            .map(|r| r.get(i).map_or("", String::as_str))
            .collect();
        if !cells.iter().any(|c| c.contains(" / "))
            || !cells
                .iter()
                .all(|c| c.contains(" / ") || strip(c).is_empty())
        {
            continue;
        }
        let name = &m[1];
        let split = [format!("{name} ({})", &m[2]), format!("{name} ({})", &m[3])];
        for (n, r) in table.iter_mut().enumerate() {
            // A row too short to have this column stays short: series() drops
            // rows whose length differs from the header's anyway.
            let Some(cell) = r.get(i) else { continue };
            let two = if n == 0 {
                split.clone()
            } else if let Some((a, b)) = cell.split_once(" / ") {
                [a.to_string(), b.to_string()]
            } else {
                [String::new(), String::new()]
            };
            r.splice(i..=i, two);
        }
    }
    table
}

/// The row labels and the plotted columns of a parsed table (see the module
/// docs for the rules).
pub fn series(table: &Table) -> (Vec<String>, Vec<Column>) {
    let table = split_pairs(table.clone());
    let Some(head) = table.first() else {
        return (Vec::new(), Vec::new());
    };
    let rows: Vec<&Vec<String>> = table[1..]
        .iter()
        .filter(|r| r.len() == head.len())
        .collect();
    let gap = |c: &str| {
        matches!(
            c.replace('*', "").as_str(),
            "?" | "-" | "" | "FAILED" | "n/a"
        )
    };
    let numeric: Vec<usize> = (0..head.len())
        .filter(|&i| {
            rows.iter().any(|r| number(&r[i]).is_some())
                && rows.iter().all(|r| number(&r[i]).is_some() || gap(&r[i]))
        })
        .collect();
    // The first column always labels (it may be a number: connections, a
    // pair), and so do the non-numeric columns right after it.
    let nlab = (1..head.len())
        .find(|i| numeric.contains(i))
        .unwrap_or(head.len());
    let rows: Vec<&Vec<String>> = rows
        .into_iter()
        .filter(|r| !r[..nlab].iter().any(|c| BOLD.is_match(c)))
        .collect();
    let labels = rows
        .iter()
        .map(|r| {
            r[..nlab]
                .iter()
                .filter(|c| !c.is_empty())
                .map(|c| c.replace("**", ""))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let cols = numeric
        .iter()
        .filter(|&&i| i >= nlab)
        .map(|&i| {
            (
                head[i].clone(),
                rows.iter().map(|r| number(&r[i])).collect(),
            )
        })
        .collect();
    (labels, cols)
}

/// Python's `format(x, "g")`: 6 significant digits, trailing zeros dropped,
/// scientific notation below 1e-4 and from 1e6 on (the bar annotations and
/// axis ticks read like the numbers in the tables).
pub fn fmt_g(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let sci = format!("{x:.5e}"); // rounds to 6 significant digits first
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mant), exp.abs())
    } else {
        let decimals = usize::try_from(5 - exp).unwrap_or(0);
        trim(&format!("{x:.decimals$}"))
    }
}

/// Text escaped for SVG character data and attribute values.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A rough width of `s` in pixels at font size `px` (no font metrics here:
/// enough to keep labels from overlapping the bars).
fn text_w(s: &str, px: f64) -> f64 {
    s.chars().count() as f64 * px * 0.6
}

/// Round tick positions covering `lo..=hi` (steps of 1, 2 or 5 times a
/// power of ten, about 5 ticks).
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = hi - lo;
    // an empty, NaN or infinite span has no steps: one tick at its start
    if span.is_nan() || span <= 0.0 || !span.is_finite() {
        return vec![lo];
    }
    let raw = span / 5.0;
    let e = raw.log10().floor() as i32;
    let m = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .find(|m| m * 10f64.powi(e) >= raw)
        .unwrap_or(10.0);
    // A tick is k * m * 10^e; dividing by 10^-e (an exact integer) rather
    // than multiplying by 10^e (inexact) keeps 0.6 from printing as 0.6000000000000001.
    // (+ 0.0 turns the -0 that ceil() gives for a range starting just below 0 into 0)
    let at = |k: f64| {
        0.0 + if e < 0 {
            k * m / 10f64.powi(-e)
        } else {
            k * m * 10f64.powi(e)
        }
    };
    let step = at(1.0);
    let mut out = Vec::new();
    let mut k = (lo / step).ceil();
    while at(k) <= hi + step * 1e-9 && out.len() < 50 {
        out.push(at(k));
        k += 1.0;
    }
    out
}

/// Wraps a title into lines of at most `width` characters at spaces.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in s.split(' ') {
        match lines.last_mut() {
            Some(l) if l.chars().count() + 1 + word.chars().count() <= width => {
                l.push(' ');
                l.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

const BAR: &str = "#4878a8";
const FONT: &str = "font-family=\"sans-serif\"";

/// An SVG of horizontal bar charts: one panel per column, at most 3 side by
/// side, the table's first row on top in every panel; each bar annotated with
/// its value ("?" for a gap).
pub fn bar_chart_svg(labels: &[String], cols: &[Column], title: &str) -> String {
    let ncol = cols.len().clamp(1, 3);
    let nrow = cols.len().div_ceil(ncol).max(1);
    let bar_h = 16.0;
    let row_h = 24.0;
    let label_w = labels.iter().map(|l| text_w(l, 11.0)).fold(0.0, f64::max) + 12.0;
    let panel_w = 250.0;
    let gutter = 20.0;
    // Panel titles (the column headers) can be long: wrap them to the panel.
    let title_chars = (panel_w / (10.0 * 0.6)) as usize;
    let panel_titles: Vec<Vec<String>> = cols.iter().map(|(n, _)| wrap(n, title_chars)).collect();
    let title_lines = panel_titles.iter().map(Vec::len).max().unwrap_or(1) as f64;
    let head_h = 14.0 * title_lines + 8.0;
    let axis_h = 26.0;
    let plot_h = row_h * labels.len() as f64;
    let block_h = head_h + plot_h + axis_h;
    let top = 36.0;
    let width = label_w + ncol as f64 * (panel_w + gutter) + 10.0;
    let height = top + nrow as f64 * block_h + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" {FONT}>"
    );
    let _ = writeln!(
        s,
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{:.1}\" y=\"22\" font-size=\"14\" text-anchor=\"middle\">{}</text>",
        width / 2.0,
        esc(title)
    );
    for (k, ((_, vals), ptitle)) in cols.iter().zip(&panel_titles).enumerate() {
        let (pr, pc) = (k / ncol, k % ncol);
        let x0 = label_w + pc as f64 * (panel_w + gutter);
        let y_head = top + pr as f64 * block_h;
        let y0 = y_head + head_h;
        // Scale: from 0 (or the smallest negative value) to the largest
        // value, with room on the right for the annotations.
        let lo = vals.iter().flatten().fold(0.0, |a: f64, &b| a.min(b));
        let hi = vals.iter().flatten().fold(0.0, |a: f64, &b| a.max(b));
        let span = if hi - lo > 0.0 { hi - lo } else { 1.0 };
        let (lo_v, hi_v) = (
            lo - 0.05 * span * f64::from(u8::from(lo < 0.0)),
            hi + 0.25 * span,
        );
        let sx = |v: f64| x0 + (v - lo_v) / (hi_v - lo_v) * panel_w;
        for (j, line) in ptitle.iter().enumerate() {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
                x0 + panel_w / 2.0,
                y_head + 12.0 + 14.0 * j as f64,
                esc(line)
            );
        }
        let _ = writeln!(
            s,
            "<rect x=\"{x0:.1}\" y=\"{y0:.1}\" width=\"{panel_w:.1}\" height=\"{plot_h:.1}\" \
             fill=\"none\" stroke=\"#888\"/>"
        );
        for t in ticks(lo_v, hi_v) {
            let x = sx(t);
            let _ = writeln!(
                s,
                "<line x1=\"{x:.1}\" y1=\"{y0:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n\
                 <text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"9\" text-anchor=\"middle\">{}</text>",
                y0 + plot_h,
                y0 + plot_h + 13.0,
                esc(&fmt_g(t))
            );
        }
        for (j, v) in vals.iter().enumerate() {
            let yc = y0 + row_h * (j as f64 + 0.5);
            let x_zero = sx(0.0);
            let x_v = sx(v.unwrap_or(0.0));
            let (bx, bw) = (x_zero.min(x_v), (x_v - x_zero).abs());
            let _ = writeln!(
                s,
                "<rect x=\"{bx:.1}\" y=\"{:.1}\" width=\"{bw:.1}\" height=\"{bar_h:.1}\" fill=\"{BAR}\"/>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\">{}</text>",
                yc - bar_h / 2.0,
                x_v.max(x_zero) + 3.0,
                yc + 3.0,
                v.map_or_else(|| "?".to_string(), fmt_g)
            );
        }
        // The row labels, left of the first panel of every panel row.
        if pc == 0 {
            for (j, l) in labels.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">{}</text>",
                    x0 - 6.0,
                    y0 + row_h * (j as f64 + 0.5) + 4.0,
                    esc(l)
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}

/// The line colours, one per --y column in order.
const LINES: [&str; 6] = [
    "#4878a8", "#d8703a", "#4a9a4a", "#b04848", "#8060a8", "#806040",
];

/// An SVG line chart: one line per series of (x, y) points, a legend, the x
/// axis named `xlabel`.
pub fn line_chart_svg(series: &[(String, Vec<(f64, f64)>)], xlabel: &str, title: &str) -> String {
    // The legend goes right of the plot, where no line can cross it.
    let legend_w = series
        .iter()
        .map(|(n, _)| text_w(n, 10.0))
        .fold(0.0, f64::max)
        + 36.0;
    let (left, right, top, bottom) = (70.0, 10.0 + legend_w, 36.0, 50.0);
    let (width, height) = (700.0 + legend_w, 380.0);
    let pts = || series.iter().flat_map(|(_, p)| p.iter());
    let bounds = |f: fn(&(f64, f64)) -> f64| {
        let (lo, hi) = pts()
            .map(f)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
                (a.min(v), b.max(v))
            });
        if !lo.is_finite() {
            (0.0, 1.0)
        } else if hi > lo {
            let pad = (hi - lo) * 0.05;
            (lo - pad, hi + pad)
        } else {
            (lo - 1.0, hi + 1.0) // one point or a flat line: a visible band
        }
    };
    let (x_lo, x_hi) = bounds(|p| p.0);
    let (y_lo, y_hi) = bounds(|p| p.1);
    let (pw, ph) = (width - left - right, height - top - bottom);
    let sx = |x: f64| left + (x - x_lo) / (x_hi - x_lo) * pw;
    let sy = |y: f64| top + ph - (y - y_lo) / (y_hi - y_lo) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" {FONT}>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{:.1}\" y=\"22\" font-size=\"14\" text-anchor=\"middle\">{}</text>\n\
         <rect x=\"{left:.1}\" y=\"{top:.1}\" width=\"{pw:.1}\" height=\"{ph:.1}\" fill=\"none\" stroke=\"#888\"/>",
        width / 2.0,
        esc(title)
    );
    for t in ticks(x_lo, x_hi) {
        let x = sx(t);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{top:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{}</text>",
            top + ph,
            top + ph + 14.0,
            esc(&fmt_g(t))
        );
    }
    for t in ticks(y_lo, y_hi) {
        let y = sy(t);
        let _ = writeln!(
            s,
            "<line x1=\"{left:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\">{}</text>",
            left + pw,
            left - 4.0,
            y + 3.0,
            esc(&fmt_g(t))
        );
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>",
        left + pw / 2.0,
        height - 12.0,
        esc(xlabel)
    );
    for (k, (name, p)) in series.iter().enumerate() {
        let colour = LINES[k % LINES.len()];
        let path: Vec<String> = p
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.5\" points=\"{}\"/>",
            path.join(" ")
        );
        let ly = top + 14.0 + 14.0 * k as f64;
        let lx = left + pw + 10.0;
        let _ = writeln!(
            s,
            "<line x1=\"{lx:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{colour}\" stroke-width=\"2\"/>\n\
             <text x=\"{:.1}\" y=\"{ly:.1}\" font-size=\"10\">{}</text>",
            ly - 3.0,
            lx + 18.0,
            ly - 3.0,
            lx + 22.0,
            esc(name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn read(path: &Path) -> Result<String, PlotError> {
    let bytes = std::fs::read(path).map_err(|source| PlotError::Io {
        path: path.display().to_string(),
        source,
    })?;
    // like Python's errors="replace": a stray byte costs one character, not the plot
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

fn write(path: &Path, text: &str) -> Result<(), PlotError> {
    std::fs::write(path, text).map_err(|source| PlotError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// What a drawn bar chart shows.
#[derive(Debug)]
pub struct BarSummary {
    /// rows (bars per panel)
    pub rows: usize,
    /// the plotted columns' headers
    pub columns: Vec<String>,
}

/// Draws the `n`-th (1 = first) Markdown table of `input` to the SVG `out`.
/// Columns without any number are left out; nothing is written when no
/// row or no column remains.
pub fn bar_chart_file(
    input: &Path,
    out: &Path,
    n: usize,
    title: &str,
) -> Result<BarSummary, PlotError> {
    let ts = tables(&read(input)?);
    let t = n
        .checked_sub(1)
        .and_then(|i| ts.get(i))
        .ok_or_else(|| PlotError::NoTable {
            n,
            path: input.display().to_string(),
        })?;
    let (labels, cols) = series(t);
    let cols: Vec<Column> = cols
        .into_iter()
        .filter(|(_, v)| v.iter().any(Option::is_some))
        .collect();
    if labels.is_empty() || cols.is_empty() {
        return Err(PlotError::NoNumeric {
            n,
            path: input.display().to_string(),
        });
    }
    write(out, &bar_chart_svg(&labels, &cols, title))?;
    Ok(BarSummary {
        rows: labels.len(),
        columns: cols.into_iter().map(|(n, _)| n).collect(),
    })
}

/// Splits one CSV record (RFC 4180 quoting: "a,b" and "" inside quotes).
fn csv_fields(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        let cur = out.last_mut().expect("out starts non-empty");
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => out.push(String::new()),
            _ => cur.push(c),
        }
    }
    out
}

/// Draws a line chart of the CSV columns `ys` over the column `x` of
/// `input` to the SVG `out`; rows with an empty or missing x or y cell are
/// no point of that line. Returns the number of data rows.
pub fn line_chart_file(
    input: &Path,
    out: &Path,
    x: &str,
    ys: &[String],
    title: &str,
) -> Result<usize, PlotError> {
    let text = read(input)?;
    let lines: Vec<&str> = crate::pytext::file_lines(&text);
    let Some((head, rows)) = lines.split_first() else {
        write(out, &line_chart_svg(&[], x, title))?;
        return Ok(0);
    };
    let head = csv_fields(head);
    // (line number, cells) of the data rows; blank lines are no rows (csv.DictReader)
    let rows: Vec<(usize, Vec<String>)> = rows
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_empty())
        .map(|(i, l)| (i + 2, csv_fields(l)))
        .collect();
    let col = |name: &str| head.iter().position(|h| h == name);
    let num = |line: usize, name: &str, cell: &str| {
        cell.trim()
            .parse::<f64>()
            .map_err(|_| PlotError::CsvNumber {
                path: input.display().to_string(),
                line,
                col: name.to_string(),
                cell: cell.to_string(),
            })
    };
    let xi = col(x);
    let mut series = Vec::new();
    for y in ys {
        let yi = col(y);
        let mut pts = Vec::new();
        for (line, r) in &rows {
            let cell = |i: Option<usize>| i.and_then(|i| r.get(i)).filter(|c| !c.is_empty());
            if let (Some(xc), Some(yc)) = (cell(xi), cell(yi)) {
                pts.push((num(*line, x, xc)?, num(*line, y, yc)?));
            }
        }
        series.push((y.clone(), pts));
    }
    write(out, &line_chart_svg(&series, x, title))?;
    Ok(rows.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ci/bench_smc.py's table: pairs, a bold ratio row, a row of gaps.
    const SMC: &str = include_str!("../tests/data/smc-bench.md");

    /// scripts/bench-fabric.sh's table: notes after numbers, FAILED and "-" gaps.
    const FABRIC: &str = "| streams | vhost-rdma daemon (pci, 1q) Mbit/s (retr) | QEMU -netdev stream Mbit/s (retr) | ratio daemon/stream |
|---|---|---|---|
| 1 (-P 1) | 1234 (5) | 1300 (0) | 0.95 |
| 4 (-P 4) | FAILED | 2000 (-) | - |
";

    #[test]
    fn smc_table() {
        let ts = tables(SMC);
        assert_eq!(ts.len(), 2);
        let (labels, cols) = series(&ts[0]);
        // the ratio row is left out, the bold note in a label kept as text
        assert_eq!(labels, ["1 smc", "1 tcp", "4 tcp FAIL"]);
        let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "MiB/s",
                "tool CPU s/GiB (client)",
                "tool CPU s/GiB (server)",
                "secs"
            ]
        );
        assert_eq!(cols[0].1, [Some(212.4), Some(98.1), None]);
        assert_eq!(cols[2].1, [Some(0.9), Some(1.9), None]);
    }

    #[test]
    fn notes_and_gaps() {
        let (labels, cols) = series(&tables(FABRIC)[0]);
        assert_eq!(labels, ["1 (-P 1)", "4 (-P 4)"]);
        let col = |n: &str| cols.iter().find(|(c, _)| c == n).map(|(_, v)| v.clone());
        assert_eq!(
            col("vhost-rdma daemon (pci, 1q) Mbit/s (retr)"),
            Some(vec![Some(1234.0), None])
        );
        assert_eq!(col("ratio daemon/stream"), Some(vec![Some(0.95), None]));
        assert_eq!(
            col("QEMU -netdev stream Mbit/s (retr)"),
            Some(vec![Some(1300.0), Some(2000.0)])
        );
    }

    #[test]
    fn numbers() {
        assert_eq!(number("1234 (5)"), Some(1234.0));
        assert_eq!(number("**2.5** x"), Some(2.5));
        assert_eq!(number("-3 MiB/s"), Some(-3.0));
        assert_eq!(number("12%"), Some(12.0));
        assert_eq!(number("1/2/3"), None);
        assert_eq!(number("1.2 / 3.4"), None);
        assert_eq!(number("?"), None);
        assert_eq!(number(""), None);
    }

    #[test]
    fn a_pair_column_with_a_stray_cell_stays_whole() {
        // one cell without " / ": the column is not split and, holding no
        // plain number, not plotted
        let t = tables("| a | b (x / y) | c |\n|---|---|---|\n| r | 1 / 2 | 3 |\n| s | 4 | 5 |\n");
        let (_, cols) = series(&t[0]);
        let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["c"]);
    }

    #[test]
    fn g_format() {
        assert_eq!(fmt_g(212.4), "212.4");
        assert_eq!(fmt_g(1234.0), "1234");
        assert_eq!(fmt_g(0.95), "0.95");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(0.00001), "1e-05");
        assert_eq!(fmt_g(-2.5), "-2.5");
        assert_eq!(fmt_g(0.0), "0");
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(ticks(0.0, 265.5), [0.0, 100.0, 200.0]);
        assert_eq!(ticks(-10.0, 35.0), [-10.0, 0.0, 10.0, 20.0, 30.0]);
        assert_eq!(ticks(0.0, 1.0), [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        assert_eq!(ticks(3.0, 3.0), [3.0]);
        assert!(ticks(-0.5, 10.0)[0].is_sign_positive(), "no -0 tick");
    }

    #[test]
    fn svg_escapes_text() {
        let svg = bar_chart_svg(
            &["a<b".into()],
            &[("x & y".into(), vec![Some(1.0)])],
            "\"t\"",
        );
        assert!(
            svg.contains("a&lt;b") && svg.contains("x &amp; y") && svg.contains("&quot;t&quot;")
        );
        assert!(!svg.contains("a<b"));
    }

    #[test]
    fn csv_quotes() {
        assert_eq!(
            csv_fields("1,\"a,b\",\"x\"\"y\","),
            ["1", "a,b", "x\"y", ""]
        );
    }
}
