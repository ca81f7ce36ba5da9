//! Runs every `vhost-rdma` command line shown in `README.md` and
//! `docs/*.md` against a live daemon, so the examples cannot rot (issue 16).
//!
//! What counts as an example (`doc_examples/extract.rs`): a line of a fenced
//! code block whose command word is `vhost-rdma` (or a path ending in
//! `/vhost-rdma`), after an optional `$ ` prompt, `sudo` and `NAME=VALUE`
//! prefixes, with `\` continuations joined. In a block that has `$ `
//! prompts, only the prompt lines are commands (the rest is output). A block
//! assigning a command to a variable (`C="vhost-rdma ctl ..."`) makes
//! `$C ...` lines examples too (in that block and the file's later ones).
//! Anything after a shell operator (`|`, `>`, `;`, `&&`, ...) or a `#`
//! comment is not run.
//!
//! How an example is run:
//!   - socket paths: every `*.sock` path (alone or inside `NAME=PATH,...`)
//!     is rewritten to a temporary directory, keeping its file name; for
//!     `ctl` the `--control` value becomes the live daemon's control socket,
//!     which is also in `VHOST_RDMA_CONTROL` (as the README's `export` sets
//!     it);
//!   - `check-capture FILE.pcapng`: FILE becomes an empty capture of that
//!     name in the example's directory;
//!   - `[...]` optional parts: run without them, and once with each group
//!     (each `|` alternative separately); a group holding a placeholder is
//!     only left out;
//!   - placeholders: an argument that is an upper-case word (`ID`, `N`,
//!     `PORT`) becomes `1`; an example with `<...>` placeholders left is
//!     SKIPPED;
//!   - `ctl` lines go, in document order, to one live daemon (this
//!     process's, a `TestFabric`: ports a, b; virtual host vh with a
//!     pingpong-server); a runtime refusal (no guest
//!     on the port, no such rule) is fine, a usage error is not: exit status
//!     2, or clap's words ("unexpected argument", "unrecognized subcommand",
//!     "invalid value", "required arguments", "Usage:") on stderr; nor is a
//!     crash (killed by a signal, a panic). A hang (10 s) fails too;
//!   - `serve` lines start their own daemon (paths rewritten, in parallel
//!     with the rest) which must come up (every rewritten socket present,
//!     process alive) and is then stopped with SIGTERM (5 s); one that
//!     finds its address taken by another program is tried twice more;
//!   - anything else (`--help`, `--print-capabilities`, ...) runs once, same
//!     rule as `ctl`.
//!
//! An HTML comment `<!-- example: skip REASON -->` on the line before a
//! fence skips that block's examples (SKIPPED with the reason), for examples
//! that need a guest or root.
//!
//! Prints one PASS/FAIL/SKIPPED line per example variant (`cargo test -p
//! vhost-rdma --test doc_examples -- --nocapture`) and "N passed, M failed,
//! K skipped";
//! fails listing every failing example with its FILE:LINE and why.

mod common;
#[path = "doc_examples/extract.rs"]
mod extract;

use std::fmt;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{daemon_cmd, terminate, TempDir, TestFabric};
use vhost_rdma::control::{request_within, Request};

/// How long a command may take to answer, and a `serve` to come up.
const HANG: Duration = Duration::from_secs(10);
/// How long a `serve` example may take to stop after SIGTERM.
const STOP: Duration = Duration::from_secs(5);
/// What clap says about a command line it refuses.
const USAGE_WORDS: &[&str] = &[
    "unexpected argument",
    "unrecognized subcommand",
    "invalid value",
    "required arguments were not provided",
    "a value is required",
    "Usage:",
];
/// Fewer examples than this in README.md and docs/ means the extractor
/// broke (81 examples, of them 74 `ctl` and 12 `serve` command lines
/// counting `[...]` variants, when this was written).
const MIN_EXAMPLES: usize = 60;
/// Nor fewer `ctl` and `serve` command lines than these.
const MIN_CTL: usize = 50;
const MIN_SERVE: usize = 8;
/// Threads running `serve` and other independent examples beside the `ctl`
/// sequence.
const WORKERS: usize = 3;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Pass,
    Fail,
    Skipped,
}

/// One result line.
#[derive(Clone, Debug)]
struct Record {
    verdict: Verdict,
    name: String,
    detail: String,
}

impl Record {
    fn new(verdict: Verdict, name: &str, detail: impl Into<String>) -> Record {
        Record {
            verdict,
            name: name.to_string(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = match self.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skipped => "SKIPPED",
        };
        write!(f, "{v} {}: {}", self.name, self.detail)
    }
}

/// What to do with one variant of an example.
enum Job {
    /// Already decided (a skip, a line that does not split).
    Done(Record),
    /// `ctl ARGS` against the live daemon, in document order.
    Ctl(Vec<String>),
    /// `serve ...` (the variant's text: rewritten into its own directory).
    Serve(String),
    /// Anything else, run once (the variant's text: rewritten into its own
    /// directory).
    Other(String),
}

/// The results of a run, in document order.
struct Report {
    records: Vec<Record>,
    /// Examples found (a variant is not another example).
    examples: usize,
    ctl: usize,
    serve: usize,
}

impl Report {
    fn count(&self, v: Verdict) -> usize {
        self.records.iter().filter(|r| r.verdict == v).count()
    }

    fn summary(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.count(Verdict::Pass),
            self.count(Verdict::Fail),
            self.count(Verdict::Skipped)
        )
    }
}

/// `README.md` and `docs/*.md`, as (path from the repository root, text).
fn doc_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && !n.starts_with('.'))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    std::iter::once("README.md".to_string())
        .chain(docs)
        .map(|rel| {
            let text = std::fs::read_to_string(root.join(&rel))
                .unwrap_or_else(|e| panic!("reading {rel}: {e}"));
            (rel, text)
        })
        .collect()
}

/// The live daemon the `ctl` examples talk to: ports a and b, virtual host
/// vh with a pingpong-server, a control socket; its directory is also the
/// capture directory (and the `ctl` lines' working directory, so
/// `capture start --file NAME` names a file there).
fn live_daemon() -> TestFabric {
    TestFabric::start_hosts(
        2,
        |i, dir| {
            let name = ["a", "b"][i];
            format!("{name}={}", dir.join(format!("{name}.sock")).display())
                .parse()
                .unwrap()
        },
        vec!["vh=10.77.0.10/24,service=pingpong-server".parse().unwrap()],
        true,
    )
}

/// Runs the examples of `files` ((name, Markdown text)).
fn run(files: &[(String, String)]) -> Report {
    let tmp = TempDir::new("doc-examples");
    let mut fab = live_daemon();
    let live = fab.dir().to_path_buf();
    let control = fab.control_socket();
    // the `ctl` lines' runtime directory: `ctl --pid` looks there
    let runtime = tmp.path().join("run");
    std::fs::create_dir_all(&runtime).unwrap();

    let mut report = Report {
        records: Vec::new(),
        examples: 0,
        ctl: 0,
        serve: 0,
    };
    let mut jobs: Vec<(String, Job)> = Vec::new();
    for (rel, text) in files {
        for ex in extract::examples(rel, text) {
            report.examples += 1;
            for v in extract::variants(&ex.text) {
                let name = format!("{} {}", ex.place, extract::display(&v));
                let job = plan(&name, &v, &ex, &live, &control);
                match &job {
                    Job::Ctl(_) => report.ctl += 1,
                    Job::Serve(_) => report.serve += 1,
                    _ => {}
                }
                jobs.push((name, job));
            }
        }
    }

    let ctl_env = Env {
        cwd: live.clone(),
        control: control.clone(),
        runtime: runtime.clone(),
    };
    let mut results: Vec<Option<Record>> = vec![None; jobs.len()];
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let jobs = &jobs;
        let ctl_env = &ctl_env;
        // `ctl` lines in document order: they change the daemon's state
        // (rules added, then deleted by number; a capture started, then
        // stopped)
        let ctl = s.spawn(move || {
            let mut out = Vec::new();
            for (i, (name, job)) in jobs.iter().enumerate() {
                if let Job::Ctl(args) = job {
                    out.push((i, run_command(name, args, ctl_env)));
                }
            }
            out
        });
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let next = &next;
                let tmp = tmp.path();
                let runtime = &runtime;
                let control = &control;
                s.spawn(move || {
                    let mut out = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((name, job)) = jobs.get(i) else {
                            break;
                        };
                        let r = match job {
                            Job::Ctl(_) => continue,
                            Job::Done(r) => r.clone(),
                            Job::Serve(text) => run_serve(name, text, tmp, i),
                            Job::Other(text) => {
                                let cwd = tmp.join(format!("other.{i}"));
                                std::fs::create_dir_all(&cwd).unwrap();
                                let mut args = extract::argv(text, cwd.to_str().unwrap(), None)
                                    .unwrap()
                                    .unwrap();
                                capture_fixture(&mut args, &cwd);
                                let env = Env {
                                    cwd,
                                    control: control.clone(),
                                    runtime: runtime.clone(),
                                };
                                run_command(name, &args, &env)
                            }
                        };
                        out.push((i, r));
                    }
                    out
                })
            })
            .collect();
        for h in std::iter::once(ctl).chain(workers) {
            for (i, r) in h.join().unwrap() {
                results[i] = Some(r);
            }
        }
    });
    report.records = results.into_iter().map(Option::unwrap).collect();

    // the daemon must have survived them all, and stop cleanly
    if let Err(e) = request_within(&control, &Request::Status, HANG) {
        report.records.push(Record::new(
            Verdict::Fail,
            "live daemon",
            format!("does not answer after the examples: {e:#}"),
        ));
    }
    if let Some(server) = fab.server.take() {
        if let Err(e) = server.shutdown() {
            report.records.push(Record::new(
                Verdict::Fail,
                "live daemon",
                format!("shutdown: {e:#}"),
            ));
        }
    }
    report
}

/// What to do with variant `text` of example `ex`.
fn plan(name: &str, text: &str, ex: &extract::Example, live: &Path, control: &Path) -> Job {
    if let Some(why) = &ex.skip {
        return Job::Done(Record::new(Verdict::Skipped, name, why.clone()));
    }
    let live = live.to_str().unwrap();
    let args = match extract::argv(text, live, None) {
        Ok(Some(a)) => a,
        Ok(None) => {
            return Job::Done(Record::new(
                Verdict::Skipped,
                name,
                "a <...> placeholder the check cannot fill",
            ))
        }
        Err(e) => {
            return Job::Done(Record::new(
                Verdict::Fail,
                name,
                format!("the command line does not split into words: {e}"),
            ))
        }
    };
    match args.first().map(String::as_str) {
        Some("serve") => Job::Serve(text.to_string()),
        Some("ctl") => {
            // again, with `--control` the live daemon's socket
            let args = extract::argv(text, live, control.to_str())
                .unwrap()
                .unwrap();
            Job::Ctl(args)
        }
        _ => Job::Other(text.to_string()),
    }
}

/// `check-capture FILE`: FILE becomes a capture (an empty section with
/// one Ethernet interface, as a capture with no traffic yet) of that name in
/// the example's directory, so the example checks a real file.
fn capture_fixture(args: &mut [String], cwd: &Path) {
    use wire::capture::pcapng;
    if args.first().map(String::as_str) != Some("check-capture") {
        return;
    }
    let Some(file) = args.get_mut(1).filter(|f| f.ends_with(".pcapng")) else {
        return;
    };
    let name = Path::new(file.as_str()).file_name().unwrap().to_owned();
    let path = cwd.join(name);
    let mut bytes = pcapng::shb("doc_examples");
    bytes.extend(pcapng::idb("a", 65535));
    std::fs::write(&path, bytes).unwrap();
    *file = path.to_str().unwrap().to_string();
}

/// The environment of a `ctl` or other short-lived command.
struct Env {
    cwd: PathBuf,
    control: PathBuf,
    runtime: PathBuf,
}

/// Runs `vhost-rdma ARGS`: it must answer within [`HANG`], without a usage
/// error or a crash.
fn run_command(name: &str, args: &[String], env: &Env) -> Record {
    let mut cmd = daemon_cmd();
    cmd.args(args)
        .current_dir(&env.cwd)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .env("XDG_RUNTIME_DIR", &env.runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env("VHOST_RDMA_CONTROL", &env.control);
    let child = cmd.spawn().expect("spawning vhost-rdma");
    let Some((status, _out, err)) = wait_output(child, HANG) else {
        return Record::new(
            Verdict::Fail,
            name,
            format!("no answer within {}s", HANG.as_secs()),
        );
    };
    let (verdict, detail) = judge(status, &err);
    Record::new(verdict, name, detail)
}

/// The verdict on a command that ended with `status`, `stderr` its error
/// output.
fn judge(status: ExitStatus, stderr: &str) -> (Verdict, String) {
    let err = stderr.trim();
    let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let last = err.lines().last().unwrap_or("");
    if status.code() == Some(2) {
        return (Verdict::Fail, format!("exit status 2 (usage): {first}"));
    }
    if let Some(w) = USAGE_WORDS.iter().find(|w| err.contains(*w)) {
        return (
            Verdict::Fail,
            format!("clap usage message ('{w}'): {first}"),
        );
    }
    match status.code() {
        None => (Verdict::Fail, format!("crashed ({status}): {first}")),
        Some(101) if err.contains("panicked at") => (Verdict::Fail, format!("panicked: {first}")),
        Some(0) => (Verdict::Pass, "exit 0".to_string()),
        Some(c) => (
            Verdict::Pass,
            format!("exit {c}, a runtime refusal, not a usage error: {last}"),
        ),
    }
}

/// Waits up to `limit` for `child` to exit, collecting its output; None
/// (the child killed) if it does not.
fn wait_output(mut child: Child, limit: Duration) -> Option<(ExitStatus, String, String)> {
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<String> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t0.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    status.map(|st| (st, out, err))
}

/// How a process ended, for a record.
fn ended(st: ExitStatus) -> String {
    match st.code() {
        Some(c) => format!("exited {c}"),
        None => format!("{st}"),
    }
}

/// The line of a daemon's log that says why it stopped: its first error
/// (clap's, or the daemon's own), else its last line.
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    match lines
        .clone()
        .find(|l| l.to_ascii_lowercase().contains("error"))
        .or_else(|| lines.next_back())
    {
        Some(l) => format!("; its log: {l}"),
        None => "; its log is empty".to_string(),
    }
}

/// Runs `serve` example number `i` with its sockets in a directory of its
/// own under `tmp`: it must come up (every socket it names present, still
/// running) and stop on SIGTERM. An address another program holds (the
/// fixed UDP ports of the uplink examples) is tried again, twice.
fn run_serve(name: &str, text: &str, tmp: &Path, i: usize) -> Record {
    let mut attempt = 1;
    loop {
        let dir = tmp.join(format!("serve.{i}.{attempt}"));
        let (mut r, busy) = serve_once(name, text, &dir);
        if !busy || attempt == 3 {
            if attempt > 1 {
                r.detail += &format!(" (attempt {attempt}: the address was in use before)");
            }
            return r;
        }
        attempt += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One run of a `serve` example in `dir`; true if it failed on an address
/// in use.
fn serve_once(name: &str, text: &str, dir: &Path) -> (Record, bool) {
    std::fs::create_dir_all(dir).unwrap();
    let args = extract::argv(text, dir.to_str().unwrap(), None)
        .unwrap()
        .unwrap();
    let socks: Vec<PathBuf> = extract::sockets(&args)
        .into_iter()
        .map(PathBuf::from)
        .collect();
    let log_path = dir.join("daemon.log");
    let log = File::create(&log_path).unwrap();
    // cwd: relative paths in examples (capture files) land in `dir`;
    // XDG_RUNTIME_DIR: so does a daemon's own control socket (serve
    // without --control), out of the way of `ctl --pid` and other serves
    let mut child = daemon_cmd()
        .args(&args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0")
        .env("XDG_RUNTIME_DIR", dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawning vhost-rdma serve");
    let t0 = Instant::now();
    let up = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Err(ended(st));
        }
        if socks.iter().all(|s| s.exists()) {
            break Ok(());
        }
        if t0.elapsed() >= HANG {
            let missing: Vec<String> = socks
                .iter()
                .filter(|s| !s.exists())
                .map(|s| s.display().to_string())
                .collect();
            break Err(format!(
                "sockets {} missing after {}s",
                missing.join(", "),
                HANG.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // still running once its sockets are there (not an exit right after)?
    let up = up.and_then(|()| match child.try_wait().unwrap() {
        Some(st) => Err(format!("{} right after its sockets appeared", ended(st))),
        None => Ok(()),
    });
    let stopped = terminate(&mut child, STOP);
    let busy = up.is_err()
        && std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("Address already in use");
    let r = match (up, stopped) {
        (Err(why), _) => Record::new(
            Verdict::Fail,
            name,
            format!("serve did not come up: {why}{}", log_tail(&log_path)),
        ),
        (Ok(()), None) => Record::new(
            Verdict::Fail,
            name,
            format!(
                "did not stop within {} s of SIGTERM (killed)",
                STOP.as_secs()
            ),
        ),
        (Ok(()), Some(_)) => Record::new(
            Verdict::Pass,
            name,
            format!("came up ({} sockets) and stopped on SIGTERM", socks.len()),
        ),
    };
    (r, busy)
}

/// Prints a report, one line per example variant, then its summary.
fn print(report: &Report) {
    for r in &report.records {
        println!("{r}");
    }
    println!(
        "{} examples: {} ctl, {} serve command lines",
        report.examples, report.ctl, report.serve
    );
    println!("{}", report.summary());
}

/// Every `vhost-rdma` command line of README.md and docs/*.md.
#[test]
fn documented_command_lines_run() {
    let files = doc_files();
    let report = run(&files);
    print(&report);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        report.examples >= MIN_EXAMPLES && report.ctl >= MIN_CTL && report.serve >= MIN_SERVE,
        "only {} examples ({} ctl, {} serve lines) in {}; expected at least {MIN_EXAMPLES} \
         ({MIN_CTL} ctl, {MIN_SERVE} serve): is the extractor broken?",
        report.examples,
        report.ctl,
        report.serve,
        names.join(", ")
    );
    let failed: Vec<String> = report
        .records
        .iter()
        .filter(|r| r.verdict == Verdict::Fail)
        .map(|r| format!("  {r}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of the documented command lines failed ({}):\n{}",
        failed.len(),
        report.summary(),
        failed.join("\n")
    );
}

/// The verdicts themselves, on a made-up page of good and broken examples.
#[test]
fn broken_examples_fail() {
    let page = "\
```sh
vhost-rdma ctl --control /run/x/ctl.sock status
vhost-rdma ctl statuss
vhost-rdma ctl status --no-such-flag
vhost-rdma ctl faults del 99
vhost-rdma ctl host <name> stop 1
vhost-rdma serve --port a=/run/x/a.sock --control /run/x/c.sock
vhost-rdma serve --port a=/run/x/a.sock --no-such-flag
vhost-rdma serve --port a=/run/x/a.sock,kind=no-such-kind
vhost-rdma --print-capabilities
```
<!-- example: skip needs a guest -->
```
vhost-rdma ctl statuss
```
";
    let report = run(&[("page.md".to_string(), page.to_string())]);
    print(&report);
    let got: Vec<(&str, Verdict)> = report
        .records
        .iter()
        .map(|r| (r.name.split(' ').next().unwrap(), r.verdict))
        .collect();
    use Verdict::*;
    assert_eq!(
        got,
        [
            ("page.md:2", Pass),
            ("page.md:3", Fail),
            ("page.md:4", Fail),
            ("page.md:5", Pass),
            ("page.md:6", Skipped),
            ("page.md:7", Pass),
            ("page.md:8", Fail),
            ("page.md:9", Fail),
            ("page.md:10", Pass),
            ("page.md:14", Skipped),
        ]
    );
    assert_eq!((report.examples, report.ctl, report.serve), (10, 4, 3));
    let detail = |line: &str| {
        let r = report
            .records
            .iter()
            .find(|r| r.name.starts_with(&format!("{line} ")))
            .unwrap();
        r.detail.clone()
    };
    assert!(
        detail("page.md:3").starts_with("exit status 2 (usage)"),
        "{}",
        detail("page.md:3")
    );
    assert!(
        detail("page.md:5").starts_with("exit 1, a runtime refusal"),
        "{}",
        detail("page.md:5")
    );
    assert!(
        detail("page.md:7").contains("came up (2 sockets)"),
        "{}",
        detail("page.md:7")
    );
    assert!(
        detail("page.md:9").starts_with("serve did not come up: exited 2"),
        "{}",
        detail("page.md:9")
    );
    assert_eq!(detail("page.md:14"), "needs a guest");
}

/// A command that does not answer fails after [`HANG`] without blocking
/// the run; one that answers in time passes.
#[test]
fn a_hang_fails_within_its_limit() {
    let mut cmd = std::process::Command::new("sleep");
    let child = cmd
        .arg("30")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    assert!(wait_output(child, Duration::from_millis(200)).is_none());
    assert!(t0.elapsed() < Duration::from_secs(5));
    let child = std::process::Command::new("sh")
        .args(["-c", "echo out; echo err >&2; exit 3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (st, out, err) = wait_output(child, HANG).unwrap();
    assert_eq!(
        (st.code(), out.as_str(), err.as_str()),
        (Some(3), "out\n", "err\n")
    );
    let (v, d) = judge(st, &err);
    assert_eq!(
        (v, d.as_str()),
        (
            Verdict::Pass,
            "exit 3, a runtime refusal, not a usage error: err"
        )
    );
}
