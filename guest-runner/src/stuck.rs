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
    /// Connects to a monitor socket and reads past its banner.
    fn connect(path: &Path) -> std::io::Result<Monitor> {
        let sock = UnixStream::connect(path)?;
        sock.set_read_timeout(Some(Duration::from_secs(5)))?;
        sock.set_write_timeout(Some(Duration::from_secs(5)))?;
        let mut m = Monitor {
            sock,
            buf: Vec::new(),
        };
        m.ask(b"")?; // the banner and first prompt
        Ok(m)
    }

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
    let mut m = Monitor::connect(path)?;
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
    let mut m = Monitor::connect(path)?;
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

    /// `vhost-rdma ctl` as the diagnosis calls it: port b's drops grow by
    /// 7 a call, another guest's port `bb` by 999.
    const FAKE_CTL: &str = r#"#!/bin/sh
d=$(dirname "$0"); n=$(cat "$d/calls" 2>/dev/null || echo 0); echo $((n + 1)) >"$d/calls"
case " $* " in
*" status"*) printf '{"ports": [{"name": "a", "rx_frames": 10, "rx_drops": 0, "tx_frames": 5}, {"name": "b", "rx_frames": 3, "rx_drops": %d, "tx_frames": 1}, {"name": "b1", "rx_frames": 3, "rx_drops": 0, "tx_frames": 1}, {"name": "bb", "rx_frames": 0, "rx_drops": %d, "tx_frames": 0}]}\n' $((7 * n)) $((999 * n)) ;;
*" flows"*) echo '{"roce": [], "iwarp": [], "smc": []}' ;;
*) exit 1 ;;
esac
"#;

    /// A QEMU human monitor stand-in: a RIP inside
    /// queued_spin_lock_slowpath, an IRQ stack with return addresses and
    /// the saved task stack pointer, and the task stack below it.
    fn fake_monitor(path: &Path) -> std::thread::JoinHandle<()> {
        let srv = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let Ok((mut conn, _)) = srv.accept() else {
                return;
            };
            let _ = conn
                .write_all(b"QEMU 11.1.3 monitor - type 'help' for more information\r\n(qemu) ");
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            while let Ok(n @ 1..) = conn.read(&mut chunk) {
                buf.extend_from_slice(&chunk[..n]);
                while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=i).collect();
                    let out: &[u8] = if line.starts_with(b"info registers") {
                        b"info registers\r\nRAX=0000000000000000 RBX=0000000000000001\r\n\
                          RSI=0 RDI=0 RBP=0 RSP=ffffc90000001000\r\nR8 =0\r\n\
                          RIP=ffffffff81000123 RFL=00000002\r\n"
                    } else if line.starts_with(b"x /256gx 0xffffc90000001000") {
                        b"x /256gx 0xffffc90000001000\r\n\
                          ffffc90000001000: 0xffffffff8100022d 0x0000000000000007\r\n\
                          ffffc90000001010: 0xffffffff81000349 0xffff888003c1a000\r\n\
                          ffffc90000001020: 0xffffffff810004be 0xffffffff8100069b\r\n\
                          ffffc90000001030: 0xffffc90000001100 0xffffc90000208e40\r\n"
                    } else if line.starts_with(b"x /256gx 0xffffc90000208e40") {
                        b"x /256gx 0xffffc90000208e40\r\n\
                          ffffc90000208e40: 0xffffffff81000710 0x0000000000000000\r\n\
                          ffffc90000208e50: 0xffffffff81000421 0xffffffff81000105\r\n"
                    } else {
                        b"unknown command\r\n"
                    };
                    let _ = conn.write_all(out);
                    let _ = conn.write_all(b"(qemu) ");
                }
            }
        })
    }

    /// A stand-in QEMU: spinning or idle; killed on drop.
    struct StandIn(std::process::Child);

    impl StandIn {
        fn new(busy: bool) -> StandIn {
            let script = if busy {
                "while :; do :; done"
            } else {
                "sleep 60"
            };
            // raised priority where allowed (root): a spinning stand-in must
            // look busy (>= 50 % of a CPU) even while cargo builds beside it on
            // two cores; `nice` runs it anyway when it may not raise it
            StandIn(
                std::process::Command::new("nice")
                    .args(["-n", "-15", "sh", "-c", script])
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        }
    }

    impl Drop for StandIn {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("stuck-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("b.job")).unwrap();
        std::fs::write(
            d.join("b.job/kallsyms"),
            "ffffffff81000000 T _text\nffffffff81000100 T queued_spin_lock_slowpath\n\
             ffffffff81000200 t _raw_spin_lock_irqsave\nffffffff81000300 t check_type_state.constprop.0\n\
             ffffffff81000400 T rxe_rcv\nffffffff81000500 d some_data\n\
             ffffffff81000600 T udp_queue_rcv_one_skb\nffffffff81000700 T __local_bh_enable_ip\n",
        )
        .unwrap();
        let ctl = d.join("fakectl");
        std::fs::write(&ctl, FAKE_CTL).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    /// A guest whose QEMU spins while its RX ring is not refilled has
    /// stopped inside its kernel: the diagnosis names where (RIP samples,
    /// the stack scan, the stack below the IRQ stack), its ports' drops
    /// (not another guest's) and saves the flows view.
    #[test]
    fn a_spinning_guest_is_named_with_its_stack() {
        let d = scratch("spin");
        let busy = StandIn::new(true);
        std::fs::write(
            d.join("run-guests.log"),
            format!(
                "run-guests: started a (pid {}), console: x\nrun-guests: started b (pid {}), console: y\n",
                std::process::id(),
                busy.0.id()
            ),
        )
        .unwrap();
        let mon = fake_monitor(&d.join("b.mon"));
        let o = StuckOptions {
            dir: d.clone(),
            daemon: d.join("fakectl"),
            window: "2".into(),
            why: "guest b never reached barrier 'smc-stream done' (a gave up)".into(),
            guests: vec!["b".into()],
        };
        let diag = diagnose(&o);
        let _ = mon.join();
        for want in [
            "guest b never reached barrier 'smc-stream done' (a gave up)",
            "stopped inside its kernel",
            "queued_spin_lock_slowpath (20/20)",
            "stack scan: _raw_spin_lock_irqsave+0x2d < check_type_state.constprop.0+0x49 < \
             rxe_rcv+0xbe < udp_queue_rcv_one_skb+0x9b;",
            // 0xffffc90000001100 is on the same stack (< 16 KiB away): not followed
            "below it (saved stack pointer 0xffffc90000208e40): __local_bh_enable_ip+0x10 < \
             rxe_rcv+0x21 < queued_spin_lock_slowpath+0x5",
            "port b: +0 frames into the guest, +7 dropped",
            "port b1:",
        ] {
            assert!(diag.contains(want), "{want:?} not in {diag}");
        }
        assert!(!diag.contains("port bb"), "{diag}");
        assert!(d.join("stuck-flows.json").exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Two idle QEMUs without monitors: both guests are waiting, not
    /// spinning.
    #[test]
    fn idle_guests_are_waiting() {
        let d = scratch("idle");
        let (a, b) = (StandIn::new(false), StandIn::new(false));
        std::fs::write(
            d.join("run-guests.log"),
            format!(
                "run-guests: started a (pid {})\nrun-guests: started b (pid {})\n",
                a.0.id(),
                b.0.id()
            ),
        )
        .unwrap();
        let o = StuckOptions {
            dir: d.clone(),
            daemon: d.join("fakectl"),
            window: "1".into(),
            why: "neither guest printed a line for 1 s".into(),
            guests: vec!["a".into(), "b".into()],
        };
        let diag = diagnose(&o);
        for want in [
            "neither guest printed a line for 1 s",
            "guest a idle (waiting for something)",
            "guest b idle",
            "no RIP samples (no monitor socket)",
        ] {
            assert!(diag.contains(want), "{want:?} not in {diag}");
        }
        assert!(!diag.contains("stopped inside its kernel"), "{diag}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
