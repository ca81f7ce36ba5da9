//! The matrix report: results.md of one run and the report of several runs
//! (`--combine`), against the text the removed Python (ci/matrix.py's
//! `fmt_md` and `combine_runs`) wrote for the same results (tests/data/*.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use guest_results::report::{combine, load_run, markdown, CellOrder};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn order() -> CellOrder {
    CellOrder {
        kernels: vec!["7.3".into(), "6.12".into()],
        cells: vec!["rxe".into(), "siw".into()],
    }
}

#[test]
fn one_run_gives_the_text_the_python_report_gave() {
    let run = load_run(&data("run.json")).expect("run.json");
    let want = std::fs::read_to_string(data("run.md")).expect("run.md");
    assert_eq!(markdown(&run.cells, &run.meta), want);
}

#[test]
fn combined_shards_take_each_cell_from_the_last_run_that_ran_it() {
    let runs = [
        load_run(&data("shard1.json")).expect("shard1"),
        load_run(&data("shard2.json")).expect("shard2"),
    ];
    let c = combine(&runs, &order(), "2026-01-02 03:04");
    assert_eq!(
        c.markdown,
        std::fs::read_to_string(data("combined.md")).expect("combined.md")
    );
    assert_eq!(c.summary, "3 passed, 1 failed, 2 skipped");
    assert!(c.failed);
    // shard 2's rxe replaced shard 1's failed one; the unknown cell is last
    assert!(c.markdown.contains("cells: 7.3/rxe, 9.9/odd"));
    assert!(c.markdown.contains("| 7.3/rxe | **PASS** |"));
}

#[test]
fn the_tables_of_combined_shards_are_those_of_the_whole_run() {
    let whole = load_run(&data("run.json")).expect("run.json");
    let whole_md = markdown(&whole.cells, &whole.meta);
    // the shards, in reverse order: the order of runs does not matter
    let shard = |i: usize| guest_results::report::Run {
        meta: whole.meta.clone(),
        cells: vec![whole.cells[i].clone()],
    };
    let c = combine(&[shard(1), shard(0)], &order(), "now");
    let tables = |md: &str| md.split_once("\n## Cells\n").map(|(_, t)| t.to_string());
    let (whole_tables, combined_tables) = (tables(&whole_md), tables(&c.markdown));
    assert!(whole_tables.is_some());
    // the summary line is the combined counts, the same as the whole run's
    assert_eq!(combined_tables, whole_tables);
}

#[test]
fn the_cli_writes_the_report_and_fails_a_failed_combination() {
    let dir = std::env::temp_dir().join(format!("guest-results-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let out = dir.join("run.md");
    let bin = env!("CARGO_BIN_EXE_guest-results");
    let r = Command::new(bin)
        .args(["report", "--out"])
        .arg(&out)
        .arg(data("run.json"))
        .output()
        .expect("runs");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(
        std::fs::read_to_string(&out).expect("written"),
        std::fs::read_to_string(data("run.md")).expect("run.md")
    );
    let r = Command::new(bin)
        .args([
            "report",
            "--combine",
            "--kernel-order",
            "7.3,6.12",
            "--cell-order",
            "rxe,siw",
        ])
        .args(["--date", "2026-01-02 03:04", "--out"])
        .arg(&out)
        .arg(data("shard1.json"))
        .arg(data("shard2.json"))
        .output()
        .expect("runs");
    assert_eq!(
        r.status.code(),
        Some(1),
        "a failed test fails the combination"
    );
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "3 passed, 1 failed, 2 skipped\n"
    );
    assert_eq!(
        std::fs::read_to_string(&out).expect("written"),
        std::fs::read_to_string(data("combined.md")).expect("combined.md")
    );
    // two runs without --combine is a usage error, not a silent pick
    let r = Command::new(bin)
        .args(["report", "--out"])
        .arg(&out)
        .arg(data("shard1.json"))
        .arg(data("shard2.json"))
        .output()
        .expect("runs");
    assert!(!r.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_results_file_without_cells_is_an_error() {
    let dir = std::env::temp_dir().join(format!("guest-results-nocells-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    std::fs::write(dir.join("results.json"), r#"{"meta": {}}"#).expect("write");
    let e = load_run(&dir)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.ends_with("no cells"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
