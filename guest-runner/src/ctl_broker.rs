//! The broker of the cells whose guests ask for `ctl` (`guest-runner
//! ctl-broker`): runs `vhost-rdma ctl ARGS` against the cell's daemon for
//! its guests, so that each fault case arms its fault exactly when its
//! traffic is ready, the gve cell's status snapshots show the device at
//! the moment its rows describe, and `vxlan-rdma` adds its loss rules once
//! its loss-free rows are done.
//!
//! A guest (`ci-lib.sh` `ci_ctl`) writes its request, one argument per
//! line, to `/job/ctl-req.N` (written as `.tmp` and renamed, so it is whole
//! when seen); the answer goes to `/job/ctl-rep.N` the same way: a first
//! line `rc=RC`, then ctl's stdout and stderr. Only the commands these
//! cells need run ([`ALLOWED`]: none that writes a file the guest names, after an optional leading `--json`; never
//! with another daemon's `--control` or a `--pid`): anything else is
//! answered `rc=2` without running. Every request and answer is logged to
//! `ctl-broker.log` in the cell's dir. The broker runs until SIGTERM, then
//! answers what is left once more.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `ctl` commands a guest may have run.
pub const ALLOWED: [&str; 5] = ["device-fault", "faults", "link", "trace", "status"];

/// Where and for whom to broker.
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerOptions {
    /// the cell's work dir (ctl.sock, NAME.job/, ctl-broker.log)
    #[arg(long)]
    pub dir: PathBuf,
    /// the vhost-rdma binary (for `ctl`)
    #[arg(long)]
    pub daemon: PathBuf,
    /// the guests whose job dirs to watch
    #[arg(long, value_delimiter = ',', default_value = "a,b")]
    pub names: Vec<String>,
    /// milliseconds between looks
    #[arg(long, default_value_t = 300)]
    pub period_ms: u64,
    /// look once and exit
    #[arg(long)]
    pub once: bool,
}

/// The broker's state: the requests it answered.
pub struct Broker {
    dir: PathBuf,
    daemon: PathBuf,
    names: Vec<String>,
    seen: HashSet<(String, u64)>,
    /// Requests answered.
    pub count: u64,
}

/// Whether a guest's request may run: a known ctl command, nothing that
/// names another control socket or process.
pub fn allowed(args: &[String]) -> bool {
    let rest = match args.first().map(String::as_str) {
        Some("--json") => &args[1..],
        _ => args,
    };
    rest.first().is_some_and(|c| ALLOWED.contains(&c.as_str()))
        && !args
            .iter()
            .any(|a| a.starts_with("--control") || a.starts_with("--pid"))
}

impl Broker {
    /// A broker for `names`' job dirs under `dir`, running `daemon ctl`.
    pub fn new(dir: &Path, daemon: &Path, names: &[String]) -> Broker {
        Broker {
            dir: dir.to_path_buf(),
            daemon: daemon.to_path_buf(),
            names: names.to_vec(),
            seen: HashSet::new(),
            count: 0,
        }
    }

    fn execute(&self, args: &[String]) -> (i32, String) {
        if !allowed(args) {
            return (
                2,
                format!(
                    "guest-runner ctl-broker: refused (allowed: {}): {args:?}\n",
                    ALLOWED.join(", ")
                ),
            );
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let sock = self.dir.join("ctl.sock");
        let o = crate::daemon::ctl(&self.daemon, &sock, &args, Duration::from_secs(60));
        // -1: ctl did not run or answer in time (3, as before, for the guest)
        (if o.code == -1 { 3 } else { o.code }, o.stdout + &o.stderr)
    }

    /// Answers every new request once, each guest's in request order.
    pub fn poll(&mut self) {
        for name in self.names.clone() {
            let jd = self.dir.join(format!("{name}.job"));
            let Ok(entries) = std::fs::read_dir(&jd) else {
                continue;
            };
            let mut reqs: Vec<u64> = entries
                .filter_map(|e| {
                    let f = e.ok()?.file_name().into_string().ok()?;
                    let n = f.strip_prefix("ctl-req.")?;
                    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                        .then(|| n.parse().ok())
                        .flatten()
                })
                .collect();
            reqs.sort_unstable();
            for n in reqs {
                if !self.seen.insert((name.clone(), n)) {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(jd.join(format!("ctl-req.{n}"))) else {
                    continue;
                };
                let args: Vec<String> = text
                    .lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(str::to_string)
                    .collect();
                let (rc, out) = self.execute(&args);
                self.count += 1;
                let tmp = jd.join(format!("ctl-rep.{n}.tmp"));
                let written = std::fs::write(&tmp, format!("rc={rc}\n{out}"))
                    .and_then(|()| std::fs::rename(&tmp, jd.join(format!("ctl-rep.{n}"))));
                if let Err(e) = written {
                    eprintln!("ctl-broker: {name}#{n}: {e}");
                }
                let time = crate::paths::local_time();
                let mut log = format!(
                    "{} {name}#{n}: ctl {} -> rc={rc}\n",
                    time.rsplit(' ').next().unwrap_or_default(),
                    args.join(" ")
                );
                for l in out.lines().take(40) {
                    log += &format!("    {l}\n");
                }
                let logged = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("ctl-broker.log"))
                    .and_then(|mut f| f.write_all(log.as_bytes()));
                if let Err(e) = logged {
                    eprintln!("ctl-broker: ctl-broker.log: {e}");
                }
            }
        }
    }
}

/// Runs the broker until SIGTERM (or once); exit 0.
pub fn run(o: &BrokerOptions) -> i32 {
    let mut b = Broker::new(&o.dir, &o.daemon, &o.names);
    if o.once {
        b.poll();
        return 0;
    }
    crate::boot::install_signal_handlers();
    while crate::boot::check_signal().is_ok() {
        b.poll();
        std::thread::sleep(Duration::from_millis(o.period_ms));
    }
    b.poll();
    0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A stand-in for `vhost-rdma`: logs its arguments, answers `rule 3
    /// added` to `device-fault add`, fails anything else with rc 1.
    const FAKE_CTL: &str = "#!/bin/sh\n\
        echo \"$*\" >> \"$(dirname \"$0\")/argv\"\n\
        case \"$*\" in *'device-fault add'*) echo 'rule 3 added'; exit 0;; esac\n\
        echo 'no such rule' >&2; exit 1\n";

    struct Cell {
        dir: PathBuf,
        broker: Broker,
    }

    fn cell() -> Cell {
        let dir = PathBuf::from(crate::paths::mkdtemp("ctl-broker-test.").expect("temp dir"));
        let ctl = dir.join("vhost-rdma");
        std::fs::write(&ctl, FAKE_CTL).expect("fake ctl");
        std::fs::set_permissions(&ctl, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        for g in ["a", "b"] {
            std::fs::create_dir(dir.join(format!("{g}.job"))).expect("job dir");
        }
        let broker = Broker::new(&dir, &ctl, &["a".into(), "b".into()]);
        Cell { dir, broker }
    }

    impl Cell {
        fn request(&self, guest: &str, n: u32, args: &[&str]) {
            let text: String = args.iter().map(|a| format!("{a}\n")).collect();
            std::fs::write(self.dir.join(format!("{guest}.job/ctl-req.{n}")), text)
                .expect("request");
        }
        fn reply(&self, guest: &str, n: u32) -> String {
            std::fs::read_to_string(self.dir.join(format!("{guest}.job/ctl-rep.{n}")))
                .unwrap_or_default()
        }
    }

    impl Drop for Cell {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    fn requests_run_once_and_answer_with_the_exit_status() {
        let mut c = cell();
        c.request(
            "a",
            1,
            &[
                "device-fault",
                "add",
                "--port",
                "ag",
                "--kind",
                "rx-error",
                "queue=0",
            ],
        );
        c.request("b", 1, &["--json", "device-fault", "list"]);
        c.broker.poll();
        c.broker.poll(); // a second look runs nothing again
        assert_eq!(c.reply("a", 1), "rc=0\nrule 3 added\n");
        assert!(c.reply("b", 1).starts_with("rc=1\n"));
        let calls = std::fs::read_to_string(c.dir.join("argv")).unwrap_or_default();
        let sock = c.dir.join("ctl.sock");
        let sock = sock.display();
        assert_eq!(
            calls.lines().collect::<Vec<_>>(),
            [
                format!("ctl --control {sock} device-fault add --port ag --kind rx-error queue=0"),
                format!("ctl --control {sock} --json device-fault list"),
            ]
        );
        assert_eq!(c.broker.count, 2);
        let log = std::fs::read_to_string(c.dir.join("ctl-broker.log")).unwrap_or_default();
        assert!(log.contains("a#1: ctl device-fault add"), "{log}");
    }

    #[test]
    fn other_commands_are_refused_without_running() {
        let mut c = cell();
        let reqs: [&[&str]; 4] = [
            &["shutdown"],
            &["--control", "/x", "status"],
            &[],
            // a capture writes a file the guest names
            &["capture", "start", "--file", "/etc/x"],
        ];
        for (n, args) in reqs.iter().enumerate() {
            c.request("a", n as u32 + 1, args);
        }
        c.broker.poll();
        for n in 1..=4 {
            assert!(c.reply("a", n).starts_with("rc=2\n"), "{n}");
        }
        assert!(!c.dir.join("argv").exists());
        let a = |v: &[&str]| allowed(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(a(&["link", "--port", "ag", "down"]));
        assert!(a(&["faults", "add", "--port", "up", "--action", "drop"]));
        assert!(a(&["trace", "stop", "--port", "ar"]));
        assert!(!a(&["trace", "--control=/tmp/other.sock"]));
        assert!(!a(&["status", "--pid", "1"]));
    }
}
