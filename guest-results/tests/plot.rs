//! `guest-results plot` end to end (the tests of ci/test_plot.py, removed):
//! the binary on sample tables, its exit status, message and SVG.

use std::path::Path;
use std::process::{Command, Output};

/// ci/bench_smc.py's table (a pair column, a bold ratio row, a row of gaps)
/// and a second table after it.
const SMC: &str = include_str!("data/smc-bench.md");

fn plot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_guest-results"))
        .arg("plot")
        .args(args)
        .output()
        .expect("run guest-results")
}

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("guest-results-plot-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// The width and height attributes of an SVG's root element.
fn svg_size(path: &Path) -> (f64, f64) {
    let s = std::fs::read_to_string(path).expect("read svg");
    assert!(
        s.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
        "not an SVG: {s:.80}"
    );
    assert!(s.trim_end().ends_with("</svg>"), "unterminated SVG");
    let attr = |name: &str| -> f64 {
        let start = s.find(&format!(" {name}=\"")).expect("attribute") + name.len() + 3;
        let end = start + s[start..].find('"').expect("closing quote");
        s[start..end].parse().expect("number")
    };
    (attr("width"), attr("height"))
}

#[test]
fn bar_chart() {
    let d = tmpdir("bar");
    std::fs::write(d.join("t.md"), SMC).expect("write");
    let out = d.join("t.svg");
    let r = plot(&[
        d.join("t.md").to_str().expect("utf-8"),
        out.to_str().expect("utf-8"),
        "--title",
        "SMC-R vs TCP",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(
        stdout.contains(
            "3 rows x 4 columns: MiB/s, tool CPU s/GiB (client), tool CPU s/GiB (server), secs"
        ),
        "{stdout}"
    );
    let (w, h) = svg_size(&out);
    assert!(w > 300.0 && h > 200.0, "{w}x{h}");
    let svg = std::fs::read_to_string(&out).expect("read");
    // every row label, every value, and "?" for the gaps
    for text in [
        ">1 smc<",
        ">4 tcp FAIL<",
        ">212.4<",
        ">0.9<",
        ">?<",
        ">SMC-R vs TCP<",
    ] {
        assert!(svg.contains(text), "{text} missing");
    }
    // the ratio row is no bar
    assert!(!svg.contains("SMC/TCP") && !svg.contains(">2.17<"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn second_table_and_missing_table() {
    let d = tmpdir("tables");
    let md = d.join("t.md");
    std::fs::write(&md, SMC).expect("write");
    let md = md.to_str().expect("utf-8");
    let two = d.join("2.svg");
    let r = plot(&[md, two.to_str().expect("utf-8"), "--table", "2"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(String::from_utf8_lossy(&r.stdout).contains("1 rows x 1 columns: table"));
    let three = d.join("3.svg");
    let r = plot(&[md, three.to_str().expect("utf-8"), "--table", "3"]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("no table 3"));
    assert!(!three.exists());
    // an old caller's PNG name gets an error, not SVG bytes in a .png
    let png = d.join("t.png");
    let r = plot(&[md, png.to_str().expect("utf-8")]);
    assert_eq!(r.status.code(), Some(1));
    assert!(!png.exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn no_numeric_column() {
    let d = tmpdir("nonum");
    let md = d.join("t.md");
    std::fs::write(&md, "| a | b |\n|---|---|\n| x | y |\n").expect("write");
    let out = d.join("t.svg");
    let r = plot(&[md.to_str().expect("utf-8"), out.to_str().expect("utf-8")]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("no numeric column"));
    assert!(!out.exists());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn csv_line_chart() {
    let d = tmpdir("csv");
    let csv = d.join("rss.csv");
    std::fs::write(
        &csv,
        "wall_s,soak_s,vmrss_kib\n0.0,,1000\n5.0,0.0,1100\n10.0,5.0,1090\n",
    )
    .expect("write");
    let out = d.join("rss.svg");
    let (csv, out_s) = (csv.to_str().expect("utf-8"), out.to_str().expect("utf-8"));
    let r = plot(&[
        "--csv",
        csv,
        out_s,
        "--x",
        "wall_s",
        "--y",
        "vmrss_kib,soak_s",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert!(String::from_utf8_lossy(&r.stdout).contains("(3 points)"));
    svg_size(&out);
    let svg = std::fs::read_to_string(&out).expect("read");
    let lines: Vec<&str> = svg.lines().filter(|l| l.starts_with("<polyline")).collect();
    assert_eq!(lines.len(), 2);
    // vmrss_kib has 3 points; soak_s is empty in the first row: 2 points
    assert_eq!(lines[0].matches(',').count(), 3, "{}", lines[0]);
    assert_eq!(lines[1].matches(',').count(), 2, "{}", lines[1]);
    // --csv without --y is a usage error
    let r = plot(&["--csv", csv, out_s, "--x", "wall_s"]);
    assert_eq!(r.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn csv_cell_not_a_number() {
    let d = tmpdir("csvbad");
    let csv = d.join("rss.csv");
    std::fs::write(&csv, "t,v\n0,1\n1,oops\n").expect("write");
    let out = d.join("rss.svg");
    let r = plot(&[
        "--csv",
        csv.to_str().expect("utf-8"),
        out.to_str().expect("utf-8"),
        "--x",
        "t",
        "--y",
        "v",
    ]);
    assert_eq!(r.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&r.stderr).contains("line 3: column v: \"oops\""));
    let _ = std::fs::remove_dir_all(&d);
}
