//! `vhost-rdma check-capture FILE`: the live protocol checker run over a
//! capture after the fact.
//!
//! Every whole Ethernet frame of the file goes through one
//! [`wire_checker::Checker`], in file order, with its interface's name as
//! the port. A daemon capture of the whole fabric records a frame twice,
//! at the sender's port and at the receiver's: the first sighting is
//! parsed, the second is compared with it byte by byte like a TCP
//! retransmission (`retransmit-differs`), so "the fabric delivered what
//! the sender sent" and "a retransmission repeats the first transmission"
//! are one rule, checked within `--window` bytes of each stream.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use serde::Serialize;
use wire::capture::{CaptureReader, ReadError};
use wire_checker::net::TcpSegment;
use wire_checker::{Addr, Checker, CheckerConfig, Finding, FlowsView};

/// Exit status: a finding or a problem.
pub const EXIT_FINDINGS: i32 = 1;
/// Exit status: the file could not be read (as clap's usage errors).
pub const EXIT_ERROR: i32 = 2;

/// Options of `check-capture`.
#[derive(clap::Args, Debug)]
pub struct CheckCaptureArgs {
    /// The capture: a daemon's pcapng (`ctl capture start`), or any pcapng
    /// or classic pcap of Ethernet frames.
    pub file: PathBuf,
    /// Only the TCP connection(s) between these two ports, both directions
    /// (e.g. 40000:7174); no other frames are checked, and it is a problem
    /// when no iWARP or SMC connection between them was followed.
    #[arg(long, value_name = "PORT:PORT", value_parser = parse_flow)]
    pub flow: Option<(u16, u16)>,
    /// Every iWARP connection followed must have negotiated MPA CRC.
    #[arg(long)]
    pub require_crc: bool,
    /// Bytes of each TCP direction kept to compare bytes seen again
    /// (retransmissions, the receiver's port's copy) with their first
    /// sighting; older ones are counted unchecked.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub window: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

fn parse_flow(s: &str) -> Result<(u16, u16), String> {
    let bad = || format!("{s:?} is not PORT:PORT (e.g. 40000:7174)");
    let (a, b) = s.split_once(':').ok_or_else(bad)?;
    Ok((a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?))
}

/// One interface of the capture.
#[derive(Debug, Default, Serialize)]
pub struct IfaceReport {
    /// Its name (the daemon's port).
    pub name: String,
    /// Frames recorded on it.
    pub frames: u64,
    /// Of those, given to the checker.
    pub checked: u64,
    /// Cut by the snap length (not checked: their bytes are missing).
    pub cut: u64,
    /// On an interface whose link type is not Ethernet (not checked).
    pub not_ethernet: u64,
}

/// A TCP connection with data that the checker did not follow.
#[derive(Debug, Serialize)]
pub struct Unfollowed {
    /// `A:P <-> B:Q`.
    pub connection: String,
    /// Segments with data (all interfaces).
    pub segments: u64,
}

/// What `check-capture` found.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// The file.
    pub file: String,
    /// Per interface, in file order.
    pub interfaces: Vec<IfaceReport>,
    /// Where reading stopped early (a cut file): the frames before it were checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_error: Option<String>,
    /// The checker's flow table at the end.
    pub flows: FlowsView,
    /// TCP connections with data not followed (the capture began after
    /// their MPA or CLC exchange, or they are neither).
    pub unfollowed: Vec<Unfollowed>,
    /// The findings kept (oldest first; timestamps from the first frame).
    pub findings: Vec<Finding>,
    /// Findings reported in all, and dropped from the kept ones.
    pub findings_total: u64,
    pub findings_dropped: u64,
    /// What the options ask for that the capture does not show.
    pub problems: Vec<String>,
}

impl Report {
    /// Whether the capture fails the check.
    pub fn failed(&self) -> bool {
        self.findings_total > 0 || !self.problems.is_empty()
    }
}

fn ep(a: Addr, p: u16) -> String {
    match a {
        Addr::V6(_) => format!("[{a}]:{p}"),
        _ => format!("{a}:{p}"),
    }
}

/// Runs the checker over the capture at `path`; `Err` when it cannot be
/// opened or is not a capture (a file cut short is checked up to the cut).
pub fn check(path: &Path, args: &CheckCaptureArgs) -> Result<Report, ReadError> {
    let f = File::open(path)?;
    let mut r = CaptureReader::new(BufReader::with_capacity(1 << 20, f))?;
    let mut c = Checker::new(CheckerConfig {
        max_flows: vhost_rdma::checker::MAX_LIMIT,
        max_findings: 10_000,
        retransmit_window: args.window,
        ..CheckerConfig::default()
    });
    let mut rep = Report {
        file: path.display().to_string(),
        ..Report::default()
    };
    let mut tcp: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut t0 = None;
    loop {
        let p = match r.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e @ (ReadError::Truncated { .. } | ReadError::Malformed { .. })) => {
                rep.read_error = Some(e.to_string());
                break;
            }
            Err(e) => return Err(e),
        };
        let ifaces = r.interfaces();
        while rep.interfaces.len() < ifaces.len() {
            rep.interfaces.push(IfaceReport {
                name: ifaces[rep.interfaces.len()].name.clone(),
                ..IfaceReport::default()
            });
        }
        let i = &mut rep.interfaces[p.iface];
        i.frames += 1;
        if ifaces[p.iface].linktype != 1 {
            i.not_ethernet += 1;
            continue;
        }
        if !p.whole() {
            i.cut += 1;
            continue;
        }
        let seg = TcpSegment::parse(&p.data);
        if let Some((a, b)) = args.flow {
            match seg {
                Some(s) if (s.sport, s.dport) == (a, b) || (s.sport, s.dport) == (b, a) => {}
                _ => continue,
            }
        }
        if let Some(s) = seg.filter(|s| !s.payload.is_empty()) {
            let (x, y) = (ep(s.src, s.sport), ep(s.dst, s.dport));
            *tcp.entry(if x <= y { (x, y) } else { (y, x) }).or_default() += 1;
        }
        i.checked += 1;
        let t0 = *t0.get_or_insert(p.ts_ns);
        c.observe(p.ts_ns.saturating_sub(t0), &i.name, &p.data);
    }
    rep.flows = c.flows();
    let st = c.stats();
    rep.findings = c.findings();
    rep.findings_total = st.findings;
    rep.findings_dropped = st.findings_dropped;
    let followed: Vec<&str> = rep
        .flows
        .iwarp
        .iter()
        .map(|x| x.connection.as_str())
        .chain(rep.flows.smc.iter().map(|x| x.connection.as_str()))
        .collect();
    for ((x, y), segments) in tcp {
        let (ab, ba) = (format!(" {x} <-> {y}"), format!(" {y} <-> {x}"));
        if !followed
            .iter()
            .any(|n| n.ends_with(&ab) || n.ends_with(&ba))
        {
            rep.unfollowed.push(Unfollowed {
                connection: format!("{x} <-> {y}"),
                segments,
            });
        }
    }
    if let Some((a, b)) = args.flow {
        if followed.is_empty() {
            rep.problems.push(format!(
                "no iWARP or SMC connection between ports {a} and {b} followed (no MPA Request or CLC proposal seen)"
            ));
        }
    }
    if args.require_crc {
        for x in &rep.flows.iwarp {
            match x.crc {
                Some(true) => {}
                Some(false) => rep
                    .problems
                    .push(format!("{}: MPA CRC not negotiated", x.connection)),
                None => rep
                    .problems
                    .push(format!("{}: no MPA Reply seen, CRC unknown", x.connection)),
            }
        }
    }
    Ok(rep)
}

/// Prints the report as text.
pub fn print(rep: &Report) {
    println!("{}:", rep.file);
    for i in &rep.interfaces {
        print!(
            "  interface {:<12} frames {:>9} checked {:>9}",
            i.name, i.frames, i.checked
        );
        if i.cut > 0 {
            print!(" cut-by-snaplen {} (not checked)", i.cut);
        }
        if i.not_ethernet > 0 {
            print!(" not-ethernet {} (not checked)", i.not_ethernet);
        }
        println!();
    }
    if let Some(e) = &rep.read_error {
        println!("  reading stopped at {e}; the frames before it were checked");
    }
    if rep.interfaces.iter().any(|i| i.cut > 0) {
        println!(
            "  frames cut by the snap length leave holes in their streams (stream-unparsed); capture whole frames to check them"
        );
    }
    super::checker::print_flows(&rep.flows);
    if !rep.unfollowed.is_empty() {
        println!(
            "TCP connections with data not followed (their MPA Request or CLC proposal is not in the capture, or they are neither):"
        );
        for u in &rep.unfollowed {
            println!("  {} ({} segments)", u.connection, u.segments);
        }
    }
    for f in &rep.findings {
        println!("{:>12.6}s {f}", f.ts_ns as f64 / 1e9);
    }
    for p in &rep.problems {
        println!("PROBLEM {p}");
    }
    println!(
        "{} finding(s) ({} shown), {} problem(s)",
        rep.findings_total,
        rep.findings.len(),
        rep.problems.len()
    );
}

/// `check-capture`: the exit status (0 clean, 1 findings or problems, 2
/// the file cannot be read).
pub fn run(args: &CheckCaptureArgs) -> i32 {
    let rep = match check(&args.file, args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("vhost-rdma: error: {}: {e}", args.file.display());
            return EXIT_ERROR;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&rep) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("vhost-rdma: error: {e}");
                return EXIT_ERROR;
            }
        }
    } else {
        print(&rep);
    }
    if rep.failed() {
        EXIT_FINDINGS
    } else {
        0
    }
}
