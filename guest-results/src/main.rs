//! `guest-results upstream`: one upstream matrix cell's verdict, by hand (the matrix calls the
//! library).
//! `guest-results junit`: JUnit XML from test logs (scripts/test.sh --junit).
//! `guest-results report`: a matrix run's results.md, or one report from several runs (--combine).
//! `guest-results tshark`: the host row "tshark" (does a capture decode as it should?).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use guest_results::cell::{judge_cell, Device, Suite};
use guest_results::junit::{self, Case, Status};
use guest_results::report::{self, CellOrder};
use guest_results::tshark;

/// The results side of vhost-rdma's guest tests: judges what the guests logged.
#[derive(Parser)]
#[command(name = "guest-results", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum SuiteArg {
    RdmaCore,
    Nic,
}

#[derive(Subcommand)]
enum Cmd {
    /// Judge one upstream cell: each device's log against EXPECT_DIR/SUITE-DEV.expect. Prints JSON
    /// {"rows": [{test, status, secs, bw, detail}...], "notes": [...], "passed": [[DEV, N]...]}
    /// and writes the Markdown table to --md.
    Upstream {
        #[arg(long, value_enum)]
        suite: SuiteArg,
        /// the directory of the SUITE-DEVICE.expect files (ci/upstream)
        #[arg(long)]
        expect_dir: PathBuf,
        /// GUEST=DEV=LOG[=CASES_FILE], once per guest in the table's column order (LOG, a missing
        /// file counts as empty; CASES_FILE, rdma-core's list of every case id)
        #[arg(long = "device", required = true)]
        devices: Vec<String>,
        /// the table's heading
        #[arg(long)]
        title: String,
        /// the command the table says produced it
        #[arg(long)]
        command: String,
        /// where to write the Markdown table
        #[arg(long)]
        md: Option<PathBuf>,
    },
    /// Write JUnit XML: one <testsuite> per input suite, one <testcase> per test. Prints
    /// "junit: FILE: N cases (P passed, F failed, S skipped)".
    Junit {
        /// the JUnit file to write
        #[arg(long)]
        out: PathBuf,
        /// the <testsuites> name
        #[arg(long, default_value = "vhost-rdma")]
        name: String,
        /// SUITE=LOG: result records "PASS|FAIL|SKIPPED NAME: detail" at the start of a line (a
        /// later record of a NAME replaces an earlier one)
        #[arg(long, value_name = "SUITE=LOG")]
        records: Vec<String>,
        /// SUITE=LOG: `cargo test` output, classed by test binary
        #[arg(long, value_name = "SUITE=LOG")]
        libtest: Vec<String>,
        /// a matrix run's results.json: one <testsuite> matrix.KERNEL/CELL per cell
        #[arg(long, value_name = "RESULTS_JSON")]
        matrix: Vec<PathBuf>,
        /// the <testsuite>s of another JUnit file (one that cannot be read is a failed case)
        #[arg(long, value_name = "JUNIT")]
        merge: Vec<PathBuf>,
    },
    /// The host row "tshark": the capture decodes as every --proto and no frame is malformed (runs
    /// tshark twice; SKIP without tshark). Prints the row as JSON.
    Tshark {
        /// the capture
        #[arg(long)]
        pcap: PathBuf,
        /// a protocol the capture must carry (tshark's name: infiniband, iwarp_mpa, smc, ...)
        #[arg(long = "proto")]
        protos: Vec<String>,
        /// seconds each tshark run may take
        #[arg(long, default_value_t = 900)]
        timeout: u64,
    },
    /// Write a matrix run's Markdown report (results.md) from its results.json. With --combine,
    /// one report from several runs (a later run's cell replaces an earlier one's); it prints the
    /// summary line and exits 1 when a test failed.
    Report {
        /// results.json files, or the run directories holding them
        #[arg(required = true)]
        runs: Vec<PathBuf>,
        /// where to write the Markdown
        #[arg(long)]
        out: PathBuf,
        /// combine the runs (ci/matrix.sh --combine)
        #[arg(long)]
        combine: bool,
        /// --combine: the kernels in the order the report lists them, comma-separated
        #[arg(long, value_delimiter = ',')]
        kernel_order: Vec<String>,
        /// --combine: the cells in the order the report lists them, comma-separated
        #[arg(long, value_delimiter = ',')]
        cell_order: Vec<String>,
        /// --combine: the report's date
        #[arg(long, default_value = "")]
        date: String,
    },
    /// SVG charts next to the bench and soak tables: one horizontal bar chart per numeric column
    /// of a Markdown table (guest_results::plot documents the table rules), or with --csv a line
    /// chart of --y over --x (the soak's rss.csv).
    Plot {
        /// the Markdown file (CSV with --csv)
        input: PathBuf,
        /// the SVG to write (its name must end in .svg)
        out: PathBuf,
        /// the chart's heading (default: the input's file name)
        #[arg(long)]
        title: Option<String>,
        /// which table of the file (1 = first)
        #[arg(long, default_value_t = 1)]
        table: usize,
        /// the input is CSV: a line chart of --y over --x
        #[arg(long, requires_all = ["x", "y"])]
        csv: bool,
        /// the CSV column on the x axis
        #[arg(long)]
        x: Option<String>,
        /// comma list of CSV columns, one line each
        #[arg(long, value_delimiter = ',')]
        y: Vec<String>,
    },
    /// The daemon's CPU time per GiB moved (ci/bench-erdma.sh; guest_results::daemon_cpu).
    DaemonCpu {
        #[command(subcommand)]
        cmd: DaemonCpuCmd,
    },
}

#[derive(Subcommand)]
enum DaemonCpuCmd {
    /// Every 0.5 s until PID exits, append "<seconds> <cpu ticks> <bytes>" to --out: the
    /// process's user + system time and the bytes its ports sent (`ctl status --json`).
    Sample {
        /// the daemon's process id
        #[arg(long)]
        pid: u32,
        /// the vhost-rdma binary (for `ctl`)
        #[arg(long)]
        daemon: PathBuf,
        /// the daemon's control socket
        #[arg(long)]
        control: PathBuf,
        /// the samples file to write
        #[arg(long)]
        out: PathBuf,
    },
    /// One line per PAYLOAD, "<cpu s per GiB> <bytes>": the largest bursts of traffic in FILE,
    /// in time order, the daemon's CPU over each divided by its PAYLOAD bytes ("0 0" when fewer
    /// bursts than payloads).
    Bursts {
        /// a samples file (daemon-cpu sample --out)
        file: PathBuf,
        /// the bytes each burst moved, in time order
        #[arg(required = true)]
        payloads: Vec<u64>,
    },
}

fn write_report(
    runs: &[PathBuf],
    out: &std::path::Path,
    combine: bool,
    order: CellOrder,
    date: &str,
) -> anyhow::Result<ExitCode> {
    let loaded = runs
        .iter()
        .map(|p| report::load_run(p))
        .collect::<Result<Vec<_>, _>>()?;
    let (md, code) = if combine {
        let c = report::combine(&loaded, &order, date);
        println!("{}", c.summary);
        (c.markdown, if c.failed { 1 } else { 0 })
    } else {
        let [run] = &loaded[..] else {
            bail!("{} runs given: one, or --combine", loaded.len());
        };
        (report::markdown(&run.cells, &run.meta), 0)
    };
    std::fs::write(out, md).with_context(|| format!("writing {}", out.display()))?;
    Ok(ExitCode::from(code))
}

fn suite_path(arg: &str) -> anyhow::Result<(&str, &str)> {
    arg.split_once('=')
        .with_context(|| format!("{arg:?}: want SUITE=PATH"))
}

fn read_text(path: &str) -> anyhow::Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {path}"))?;
    Ok(junit::text_of(&bytes))
}

fn write_junit(
    out: &std::path::Path,
    name: &str,
    records: &[String],
    libtest: &[String],
    matrix: &[PathBuf],
    merge: &[PathBuf],
) -> anyhow::Result<()> {
    let mut cases = Vec::new();
    // records, then cargo, then matrix results, then merged files: the order
    // test.sh and matrix.sh produce them in
    for arg in records {
        let (suite, path) = suite_path(arg)?;
        let text = read_text(path)?;
        let got = junit::parse_records(&text, suite);
        let mut have = junit::Counts::default();
        for c in &got {
            match c.status {
                Status::Pass => have.passed += 1,
                Status::Fail => have.failed += 1,
                Status::Skip => have.skipped += 1,
                Status::Other => {}
            }
        }
        if let Some(want) = junit::summary_counts(&text) {
            if want != have {
                eprintln!(
                    "junit: {suite}: the summary says {}/{}/{} passed/failed/skipped but its \
                     records are {}/{}/{}",
                    want.passed, want.failed, want.skipped, have.passed, have.failed, have.skipped
                );
            }
        }
        cases.extend(got);
    }
    for arg in libtest {
        let (suite, path) = suite_path(arg)?;
        cases.extend(junit::parse_libtest(&read_text(path)?, suite));
    }
    for path in matrix {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let cells = v.get("cells").and_then(|c| c.as_array());
        cases.extend(junit::matrix_cases(cells.map_or(&[][..], |c| c)));
    }
    let mut merged = Vec::new();
    for path in merge {
        let got = std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|b| String::from_utf8(b).map_err(|e| e.to_string()))
            .and_then(|t| junit::testsuites_of(&t).map_err(|e| e.to_string()));
        match got {
            Ok(ts) => merged.extend(ts),
            Err(e) => cases.push(Case::new(
                "junit",
                &format!("merge {}", path.display()),
                Status::Fail,
                &format!("cannot read {}: {e}", path.display()),
            )),
        }
    }
    let (root, n) = junit::document(&cases, name, merged);
    std::fs::write(out, root.to_document())
        .with_context(|| format!("writing {}", out.display()))?;
    println!(
        "junit: {}: {} cases ({} passed, {} failed, {} skipped)",
        out.display(),
        n.total(),
        n.passed,
        n.failed,
        n.skipped
    );
    Ok(())
}

fn device(spec: &str) -> anyhow::Result<Device> {
    let p: Vec<&str> = spec.splitn(4, '=').collect();
    if p.len() < 3 || p[..3].iter().any(|s| s.is_empty()) {
        bail!("--device {spec:?}: want GUEST=DEV=LOG[=CASES_FILE]");
    }
    Ok(Device {
        guest: p[0].into(),
        dev: p[1].into(),
        log: p[2].into(),
        cases: p.get(3).map(|s| s.to_string()),
    })
}

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().cmd {
        Cmd::Upstream {
            suite,
            expect_dir,
            devices,
            title,
            command,
            md,
        } => {
            let devices = devices
                .iter()
                .map(|s| device(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let suite = match suite {
                SuiteArg::RdmaCore => Suite::RdmaCore,
                SuiteArg::Nic => Suite::Nic,
            };
            let v = judge_cell(suite, &expect_dir, &devices, &title, &command);
            if let Some(md) = md {
                std::fs::write(&md, &v.markdown)
                    .with_context(|| format!("writing {}", md.display()))?;
            }
            println!("{}", serde_json::to_string(&v)?);
        }
        Cmd::Junit {
            out,
            name,
            records,
            libtest,
            matrix,
            merge,
        } => write_junit(&out, &name, &records, &libtest, &matrix, &merge)?,
        Cmd::Tshark {
            pcap,
            protos,
            timeout,
        } => {
            let row = tshark::tshark_row(&pcap, &protos, std::time::Duration::from_secs(timeout));
            println!("{}", serde_json::to_string(&row)?);
        }
        Cmd::Report {
            runs,
            out,
            combine,
            kernel_order,
            cell_order,
            date,
        } => {
            let order = CellOrder {
                kernels: kernel_order,
                cells: cell_order,
            };
            return write_report(&runs, &out, combine, order, &date);
        }
        Cmd::Plot {
            input,
            out,
            title,
            table,
            csv,
            x,
            y,
        } => plot(&input, &out, title, table, csv.then_some((x, y)))?,
        Cmd::DaemonCpu { cmd } => daemon_cpu(cmd)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `guest-results plot`: prints what it drew ("plot: OUT (...)"), like ci/plot.py did.
fn plot(
    input: &std::path::Path,
    out: &std::path::Path,
    title: Option<String>,
    table: usize,
    csv: Option<(Option<String>, Vec<String>)>,
) -> anyhow::Result<()> {
    use guest_results::plot;
    // The bench scripts used to write PNGs: an old name must not get SVG inside.
    if out.extension().and_then(|e| e.to_str()) != Some("svg") {
        bail!("plot: {}: the chart is SVG, name it .svg", out.display());
    }
    let title = title.unwrap_or_else(|| {
        input
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    });
    match csv {
        Some((x, ys)) => {
            let (Some(x), false) = (x, ys.is_empty()) else {
                bail!("plot: --csv needs --x and --y");
            };
            let n = plot::line_chart_file(input, out, &x, &ys, &title)
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            println!("plot: {} ({n} points)", out.display());
        }
        None => {
            let s = plot::bar_chart_file(input, out, table, &title)
                .map_err(|e| anyhow::anyhow!("plot: {e}"))?;
            println!(
                "plot: {} ({} rows x {} columns: {})",
                out.display(),
                s.rows,
                s.columns.len(),
                s.columns.join(", ")
            );
        }
    }
    Ok(())
}

/// `guest-results daemon-cpu sample|bursts`.
fn daemon_cpu(cmd: DaemonCpuCmd) -> anyhow::Result<()> {
    use guest_results::daemon_cpu;
    match cmd {
        DaemonCpuCmd::Sample {
            pid,
            daemon,
            control,
            out,
        } => daemon_cpu::sample(pid, &daemon, &control, &out)?,
        DaemonCpuCmd::Bursts { file, payloads } => {
            for line in daemon_cpu::bursts_file(&file, &payloads, daemon_cpu::clock_ticks())? {
                println!("{line}");
            }
        }
    }
    Ok(())
}
