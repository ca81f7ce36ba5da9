//! `guest-results upstream`: one upstream matrix cell's verdict (ci/matrix.py's `upstream_rows()`).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use guest_results::cell::{judge_cell, Device, Suite};

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
    /// One fact the demo (scripts/demo.sh) reads from the daemon's `ctl --json` replies or from
    /// tshark's protocol hierarchy, printed as one line of words (a missing reply reads as empty).
    DemoView {
        #[command(subcommand)]
        view: DemoView,
    },
}

#[derive(Subcommand)]
enum DemoView {
    /// "OK FAILED ITERATIONS VERIFIED ERROR" of the virtual host's service KIND on PORT
    Svc {
        hosts: PathBuf,
        kind: String,
        port: String,
    },
    /// the virtual hosts' events not shown yet ("HOST: EVENT"); SEEN remembers what was shown
    Events { hosts: PathBuf, seen: PathBuf },
    /// the bytes each port moved since BASE (`ctl --json status` replies)
    Rates { status: PathBuf, base: PathBuf },
    /// "N TEXT": SMC-R v2 sessions the checker saw confirmed
    Smc { flows: PathBuf },
    /// "RC_CONNS SMC_LINK_CONNS IWARP SMC_V2_CONFIRMED"
    Flows { flows: PathBuf },
    /// the checker's findings total
    Findings { findings: PathBuf },
    /// the erdma functions' counters, a few lines
    Erdma { status: PathBuf },
    /// "SPLIT_PACKETS HEADER_BYTES PAYLOAD_BYTES RX_PACKETS" of the gVNIC
    Gve { status: PathBuf },
    /// "ROCE SMC_R CLC IWARP MALFORMED" frames in tshark's `-z io,phs` output
    Phs { file: PathBuf },
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

fn main() -> anyhow::Result<()> {
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
        Cmd::DemoView { view } => {
            use guest_results::demo_view as dv;
            let line = match view {
                DemoView::Svc { hosts, kind, port } => dv::service(&hosts, &kind, &port),
                DemoView::Events { hosts, seen } => dv::events(&hosts, &seen)?,
                DemoView::Rates { status, base } => dv::rates(&status, &base),
                DemoView::Smc { flows } => dv::smc(&flows),
                DemoView::Flows { flows } => dv::flows(&flows),
                DemoView::Findings { findings } => dv::findings(&findings),
                DemoView::Erdma { status } => dv::erdma(&status),
                DemoView::Gve { status } => dv::gve(&status),
                DemoView::Phs { file } => {
                    dv::phs(&std::fs::read_to_string(&file).unwrap_or_default())
                }
            };
            if !line.is_empty() {
                println!("{line}");
            }
        }
    }
    Ok(())
}
