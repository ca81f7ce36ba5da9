//! Why a matrix cell's guest stopped making progress (`guest-runner
//! stuck-diagnosis`): run by the matrix when one guest gave up at a
//! barrier (its peer never arrived) or both went silent for longer than
//! any tool timeout.
//!
//! Over a window of seconds it samples each suspect guest's QEMU CPU use
//! (`/proc/PID/stat`; the pids from `run-guests.log`) and the daemon's
//! counters of the guest's ports (`ctl status`). A guest whose QEMU burns
//! a core while its RX ring is not refilled (`rx_drops` growing: its
//! driver no longer takes frames) has stopped inside its kernel; one that
//! idles is waiting for something. Then it reads where the guest's CPU is
//! through its QEMU monitor socket (`NAME.mon`, `run-guests --monitor`):
//! 20 RIP samples and a scan of the stack (and of the stack below an IRQ
//! stack), symbolized with the guest's `/proc/kallsyms` (saved by
//! `ci-lib.sh` as `NAME.job/kallsyms`). The checker's flows view is saved
//! as `stuck-flows.json`. The diagnosis is one line on stdout.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use regex::bytes::Regex;
use serde_json::Value;

/// What to diagnose.
#[derive(Debug, Clone, clap::Args)]
pub struct StuckOptions {
    /// the cell's work dir (run-guests.log, ctl.sock, NAME.mon, NAME.job/)
    #[arg(long)]
    pub dir: PathBuf,
    /// the vhost-rdma binary (for `ctl`)
    #[arg(long)]
    pub daemon: PathBuf,
    /// seconds to sample CPU and port counters over
    #[arg(long, default_value = "5")]
    pub window: String,
    /// what was seen (the diagnosis's first words)
    #[arg(long)]
    pub why: String,
    /// the guests to look at (a, b)
    #[arg(required = true)]
    pub guests: Vec<String>,
}

/// Runs the diagnosis and prints it; exit 0.
pub fn run(o: &StuckOptions) -> i32 {
    println!("{}", diagnose(o));
    0
}

/// `vhost-rdma ctl --json ARGS` against the cell's daemon: its reply, or
/// `None`.
fn ctl_json(o: &StuckOptions, args: &[&str]) -> Option<Value> {
    crate::daemon::ctl_json(&o.daemon, &o.dir.join("ctl.sock"), args, CTL_WAIT)
}

/// How long a `ctl` request may take.
const CTL_WAIT: Duration = Duration::from_secs(20);

/// The daemon's ports by name (`ctl status`).
fn port_counters(o: &StuckOptions) -> BTreeMap<String, Value> {
    let st = ctl_json(o, &["status"]).unwrap_or(Value::Null);
    st["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["name"].as_str()?.to_string(), p.clone())))
        .collect()
}

/// The guests' QEMU pids (`started NAME (pid N)` in run-guests.log).
fn qemu_pids(dir: &Path) -> BTreeMap<String, u32> {
    let re = regex::Regex::new(r"started (\w+) \(pid (\d+)\)").expect("constant regex");
    let text = std::fs::read_to_string(dir.join("run-guests.log")).unwrap_or_default();
    re.captures_iter(&text)
        .filter_map(|c| Some((c[1].to_string(), c[2].parse().ok()?)))
        .collect()
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn counter(p: &Value, key: &str) -> i64 {
    p.get(key).and_then(Value::as_i64).unwrap_or(0)
}

/// Whether daemon port `name` is guest `g`'s: `g`, or `g` and a NIC number.
fn guest_port(name: &str, g: &str) -> bool {
    name == g
        || name
            .strip_prefix(g)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The diagnosis line.
pub fn diagnose(o: &StuckOptions) -> String {
    let window: f64 = o.window.parse().unwrap_or(5.0);
    let pids = qemu_pids(&o.dir);
    let (t0, p0) = (Instant::now(), port_counters(o));
    let c0: Vec<Option<u64>> = o
        .guests
        .iter()
        .map(|g| pids.get(g).and_then(|&p| cpu_ticks(p)))
        .collect();
    std::thread::sleep(Duration::from_secs_f64(window.max(0.0)));
    let (t1, p1) = (Instant::now(), port_counters(o));
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut states = Vec::new();
    for (g, c0) in o.guests.iter().zip(c0) {
        let c1 = pids.get(g).and_then(|&p| cpu_ticks(p));
        let secs = (t1 - t0).as_secs_f64();
        let cpu = match (c0, c1) {
            (Some(a), Some(b)) if secs > 0.0 => {
                Some(100.0 * (b.saturating_sub(a)) as f64 / hz / secs)
            }
            _ => None,
        };
        let (mut ports, mut starved) = (Vec::new(), false);
        for (name, a1) in p1.iter().filter(|(n, _)| guest_port(n, g)) {
            let a0 = p0.get(name).cloned().unwrap_or(Value::Null);
            let drops = counter(a1, "rx_drops") - counter(&a0, "rx_drops");
            starved |= drops > 0;
            ports.push(format!(
                "port {name}: +{} frames into the guest, +{drops} dropped for want of RX buffers \
                 ({} in all), +{} out",
                counter(a1, "rx_frames") - counter(&a0, "rx_frames"),
                counter(a1, "rx_drops"),
                counter(a1, "tx_frames") - counter(&a0, "tx_frames"),
            ));
        }
        // A TCG guest that idles costs its QEMU a few % of a core; one
        // spinning in its kernel takes a whole core, or what a loaded host
        // leaves of it.
        let verdict = match cpu {
            Some(c) if c >= 50.0 && starved => {
                "stopped inside its kernel (QEMU busy, the guest no longer services its NIC)"
            }
            Some(c) if c < 20.0 => "idle (waiting for something)",
            _ => "not progressing",
        };
        let cpu_s = cpu.map_or("CPU unknown".to_string(), |c| format!("{c:.0} % CPU"));
        let s = rip_samples(&o.dir.join(format!("{g}.mon")));
        let where_ = if s.rips.is_empty() {
            "; no RIP samples (no monitor socket)".to_string()
        } else {
            let syms = Symbols::load(&o.dir.join(format!("{g}.job/kallsyms")));
            format!(
                "; its CPU was in {} ({} samples of RIP)",
                syms.describe(&s),
                s.rips.len()
            )
        };
        states.push(format!(
            "guest {g} {verdict}: QEMU {cpu_s} over {} s; {}{where_}",
            o.window,
            ports.join("; ")
        ));
    }
    if let Some(fl) = ctl_json(o, &["flows"]) {
        let text = serde_json::to_string_pretty(&fl).unwrap_or_default();
        if let Err(e) = std::fs::write(o.dir.join("stuck-flows.json"), text) {
            eprintln!("stuck-diagnosis: stuck-flows.json: {e}");
        }
    }
    format!(
        "{}: {}; guests stopped (flows view in stuck-flows.json)",
        o.why,
        states.join(" | ")
    )
}

/// What the monitor showed: RIP samples, the stack at the last RSP, and
/// the stack below it (`below[0]` its address; empty if none).
#[derive(Debug, Default)]
pub struct Samples {
    /// RIPs, one per `info registers`.
    pub rips: Vec<u64>,
    /// 256 words at the last RSP.
    pub stack: Vec<u64>,
    /// The saved stack pointer, then 256 words there.
    pub below: Vec<u64>,
}

/// A QEMU human monitor connection.
struct Monitor {
    sock: UnixStream,
    buf: Vec<u8>,
}

impl Monitor {
    /// Sends `cmd` and returns what came before the next `(qemu)` prompt.
    fn ask(&mut self, cmd: &[u8]) -> std::io::Result<Vec<u8>> {
        self.sock.write_all(cmd)?;
        const PROMPT: &[u8] = b"(qemu)";
        loop {
            if let Some(i) = self.buf.windows(PROMPT.len()).position(|w| w == PROMPT) {
                let out = self.buf[..i].to_vec();
                self.buf.drain(..i + PROMPT.len());
                return Ok(out);
            }
            let mut chunk = [0u8; 65536];
            let n = self.sock.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::other("monitor closed"));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Runs one HMP command through a guest's monitor socket (`run-guests
/// --monitor`, `DIR/NAME.mon`) and returns its answer.
pub fn hmp(path: &Path, cmd: &str) -> std::io::Result<String> {
    let sock = UnixStream::connect(path)?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    sock.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut m = Monitor {
        sock,
        buf: Vec::new(),
    };
    m.ask(b"")?; // the banner and first prompt
    let out = m.ask(format!("{cmd}\n").as_bytes())?;
    let out = String::from_utf8_lossy(&out);
    // the monitor echoes the command line first
    Ok(out
        .lines()
        .skip(1)
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_string())
}

/// The 64-bit words of an `x /Ngx` reply (after each line's address).
fn words(out: &[u8]) -> Vec<u64> {
    let re = regex::Regex::new(r"0x([0-9a-fA-F]{16})").expect("constant regex");
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| l.split_once(':').map(|(_, rest)| rest.to_string()))
        .flat_map(|rest| {
            re.captures_iter(&rest)
                .filter_map(|c| u64::from_str_radix(&c[1], 16).ok())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// 20 `info registers` 0.1 s apart through monitor socket `path`, then the
/// stack at the last RSP (2 KiB: deep enough to reach the frame that let
/// a softirq in) and, if a word there points into another kernel stack
/// (same region, more than 16 KiB away: the task stack below an IRQ
/// stack), 2 KiB there. What was read before an error is kept.
pub fn rip_samples(path: &Path) -> Samples {
    let mut s = Samples::default();
    let _ = sample_into(path, &mut s);
    s
}

fn sample_into(path: &Path, s: &mut Samples) -> std::io::Result<()> {
    let sock = UnixStream::connect(path)?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    sock.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut m = Monitor {
        sock,
        buf: Vec::new(),
    };
    m.ask(b"")?; // the banner and first prompt
    let rip = Regex::new(r"RIP=([0-9a-fA-F]{16})").expect("constant regex");
    let rsp_re = Regex::new(r"RSP=([0-9a-fA-F]{16})").expect("constant regex");
    let hex = |c: Option<regex::bytes::Captures<'_>>| {
        c.and_then(|c| u64::from_str_radix(std::str::from_utf8(&c[1]).ok()?, 16).ok())
    };
    let mut rsp = None;
    for _ in 0..20 {
        let out = m.ask(b"info registers\n")?;
        if let Some(r) = hex(rip.captures(&out)) {
            s.rips.push(r);
        }
        if let Some(r) = hex(rsp_re.captures(&out)) {
            rsp = Some(r);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let Some(rsp) = rsp else {
        return Ok(());
    };
    s.stack = words(&m.ask(format!("x /256gx {rsp:#x}\n").as_bytes())?);
    let saved = s
        .stack
        .iter()
        .copied()
        .rfind(|&w| w >> 40 == rsp >> 40 && w.abs_diff(rsp) > 0x4000);
    if let Some(at) = saved {
        let more = words(&m.ask(format!("x /256gx {at:#x}\n").as_bytes())?);
        s.below = std::iter::once(at).chain(more).collect();
    }
    Ok(())
}

/// A guest's kernel text symbols, by address.
pub struct Symbols(Vec<(u64, String)>);

impl Symbols {
    /// The text symbols (`t`/`T`) of a `/proc/kallsyms` copy; none if it
    /// cannot be read.
    pub fn load(path: &Path) -> Symbols {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        Symbols::parse(&text)
    }

    /// [`Symbols::load`] of the file's text.
    pub fn parse(text: &str) -> Symbols {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let p: Vec<&str> = l.split_whitespace().collect();
                if p.len() < 3 || !matches!(p[1], "t" | "T") {
                    return None;
                }
                Some((u64::from_str_radix(p[0], 16).ok()?, p[2].to_string()))
            })
            .collect();
        syms.sort();
        Symbols(syms)
    }

    /// `function+0xoff` for a kernel text address (at most 64 KiB past the
    /// symbol), or `None`.
    pub fn lookup(&self, addr: u64) -> Option<String> {
        let i = self.0.partition_point(|(a, _)| *a <= addr).checked_sub(1)?;
        let (a, name) = &self.0[i];
        if addr < 0xffff_0000_0000_0000 || addr - a > 0x10000 {
            return None;
        }
        Some(format!("{name}+{:#x}", addr - a))
    }

    /// The four functions the RIPs were in most (with their counts), then
    /// every stack word that points into kernel text, innermost first
    /// (like the kernel's `?` frames: likely callers), then the same for
    /// the stack below.
    pub fn describe(&self, s: &Samples) -> String {
        let mut count: Vec<(String, usize)> = Vec::new();
        for &r in &s.rips {
            let name = self.lookup(r).unwrap_or_else(|| format!("{r:#x}"));
            let f = name.split('+').next().unwrap_or_default().to_string();
            match count.iter_mut().find(|(n, _)| *n == f) {
                Some((_, k)) => *k += 1,
                None => count.push((f, 1)),
            }
        }
        // Stable: equal counts keep the order they were first seen in.
        count.sort_by_key(|(_, k)| std::cmp::Reverse(*k));
        let mut out = count
            .iter()
            .take(4)
            .map(|(f, k)| format!("{f} ({k}/{})", s.rips.len()))
            .collect::<Vec<_>>()
            .join(", ");
        let frames = |ws: &[u64]| -> Vec<String> {
            ws.iter().filter_map(|&w| self.lookup(w)).take(48).collect()
        };
        let f = frames(&s.stack);
        if !f.is_empty() {
            out += &format!("; stack scan: {}", f.join(" < "));
        }
        if let Some((at, rest)) = s.below.split_first() {
            let f = frames(rest);
            if !f.is_empty() {
                out += &format!(
                    "; below it (saved stack pointer {at:#x}): {}",
                    f.join(" < ")
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "ffffffff81000100 T queued_spin_lock_slowpath\n\
                            ffffffff81000200 T _raw_spin_lock_irqsave\n\
                            ffffffff81000300 t check_type_state.constprop.0\n\
                            ffffffff81000400 t rxe_rcv [rdma_rxe]\n\
                            ffffffff81000500 d some_data\n";

    #[test]
    fn symbols_name_text_addresses_only() {
        let s = Symbols::parse(KALLSYMS);
        assert_eq!(
            s.lookup(0xffffffff8100022d).as_deref(),
            Some("_raw_spin_lock_irqsave+0x2d")
        );
        assert_eq!(s.lookup(0xffffffff81000000), None, "before the first");
        assert_eq!(s.lookup(0x7), None, "not kernel text");
        assert_eq!(s.lookup(0xffffffff81020000), None, "too far past");
        let d = s.describe(&Samples {
            rips: vec![0xffffffff81000123; 3],
            stack: vec![7, 0xffffffff81000349],
            below: vec![0xffffc90000208e40, 0xffffffff81000421],
        });
        assert_eq!(
            d,
            "queued_spin_lock_slowpath (3/3); stack scan: check_type_state.constprop.0+0x49; \
             below it (saved stack pointer 0xffffc90000208e40): rxe_rcv+0x21"
        );
    }

    #[test]
    fn a_guests_ports_are_its_name_and_its_nics() {
        assert!(guest_port("b", "b"));
        assert!(guest_port("b1", "b"));
        assert!(!guest_port("bb", "b"));
        assert!(!guest_port("b1x", "b"));
    }
}
