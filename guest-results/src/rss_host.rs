//! The host side of the matrix's rss cell (`guest-runner rss-host`;
//! `cell_rss` in ci/guest/ci-lib.sh is the guest side).
//!
//! Guest A walks through [`STEPS`]; at each it writes `STEP.req` into its 9p
//! job dir and waits for `STEP.ack`. Here each step's guest view (`ethtool
//! -x` dumps, FLOW lines in out.log) is compared with the daemon's (`vhost-rdma
//! ctl rss|flow-rule --json`), one "CHECK-OK   what" or "CHECK-FAIL what"
//! line per comparison on stdout. At the end (or on an error) guest B is
//! released through `JOB_B/stop`; an error also writes `JOB_A/abort` so A
//! stops waiting.

use std::collections::{BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use regex::Regex;
use serde_json::{json, Value};

use crate::run_cmd::output_within;

/// The guest's steps, in order.
pub const STEPS: [&str; 5] = ["default", "equal2", "hkey", "flows", "rules"];
/// Guest A's address (the one under test).
const A_IP: &str = "10.77.0.1";
/// Guest B's address (the iperf3 server, the traffic source).
const B_IP: &str = "10.77.0.2";
/// The limit of one `ctl` call.
const CTL_TIMEOUT: Duration = Duration::from_secs(30);
/// Entries of the RETA the guest and the daemon must agree on.
const RETA_LEN: usize = 128;

/// Why the host side gave up before judging every step (reported as
/// "CHECK-FAIL host helper: ...").
#[derive(Debug, thiserror::Error)]
pub enum RssHostError {
    /// A file in a job dir could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// the file
        path: PathBuf,
        /// the I/O error
        source: std::io::Error,
    },
    /// A `ctl` call failed, timed out or printed no JSON.
    #[error("ctl {args}: {why}")]
    Ctl {
        /// the ctl arguments
        args: String,
        /// what went wrong
        why: String,
    },
    /// A JSON file or answer lacks what the checks need.
    #[error("{0}")]
    Missing(String),
}

/// Where the daemon and the guests' job dirs are.
#[derive(Debug, Clone)]
pub struct Setup {
    /// the vhost-rdma binary
    pub daemon: PathBuf,
    /// its control socket
    pub ctl: PathBuf,
    /// guest A's job dir (steps, ethtool dumps, out.log)
    pub job_a: PathBuf,
    /// guest B's job dir (`stop` releases B)
    pub job_b: PathBuf,
    /// flows.json: {"key": "aa:bb:..", "flows": [["tcp", PORT]...], "move_sport": PORT}
    pub flows: PathBuf,
    /// how long to wait for each step's request
    pub step_timeout: Duration,
}

/// Python's `str()` of a JSON value, so messages read as they did
/// (None, True, [1, 2], 'name' inside lists).
fn py(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!(
            "{{{}}}",
            o.iter()
                .map(|(k, v)| format!("'{k}': {}", py_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Number(n) => n.to_string(),
    }
}

/// Python's `repr()` of a JSON value (strings quoted).
fn py_repr(v: &Value) -> String {
    match v {
        Value::String(s) => format!("'{s}'"),
        _ => py(v),
    }
}

/// A list of numbers as Python prints it: "[1, 2, 3]".
fn py_list<T: std::fmt::Display>(v: &[T]) -> String {
    format!(
        "[{}]",
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// An integer as `{:#010x}` ("0x0000abcd"), anything else as Python prints it.
fn hex10(v: &Value) -> String {
    v.as_u64().map_or_else(|| py(v), |n| format!("{n:#010x}"))
}

/// Python's truth value of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// A JSON array of integers, `None` when it is not one.
fn ints(v: &Value) -> Option<Vec<i64>> {
    v.as_array()?.iter().map(Value::as_i64).collect()
}

/// A JSON number as f64 for comparisons (missing or null: `None`).
fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// The flow name the daemon and the guest's FLOW lines use for traffic
/// towards A: from B:5201 (iperf3 -R data) to A:sport.
pub fn flow_name(proto: &str, sport: u64) -> String {
    format!("{B_IP}:5201-{A_IP}:{sport}/{proto}")
}

/// (RETA, key hex without colons) from `ethtool -x` output.
pub fn parse_ethtool_x(text: &str) -> (Vec<i64>, Option<String>) {
    static ROW: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^\s*(\d+):\s+([\d\s]+)$").expect("ROW regex"));
    let (mut table, mut key, mut want_key) = (Vec::new(), None, false);
    for line in text.lines() {
        if !want_key {
            if let Some(m) = ROW.captures(line) {
                table.extend(
                    m[2].split_whitespace()
                        .filter_map(|x| x.parse::<i64>().ok()),
                );
                continue;
            }
        }
        if line.starts_with("RSS hash key:") {
            want_key = true;
            continue;
        }
        if want_key {
            key = Some(line.trim().replace(':', "").to_lowercase());
            want_key = false;
        }
    }
    (table, key)
}

/// The FLOW lines of A's out.log: flow name -> (exit status, per-queue RX
/// packet deltas).
pub fn parse_flow_lines(text: &str) -> HashMap<String, (i64, Vec<i64>)> {
    static FLOW: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^FLOW (\S+) rc=(\d+) before=\[([\d ]*)\] after=\[([\d ]*)\]")
            .expect("FLOW regex")
    });
    let nums = |s: &str| -> Vec<i64> {
        s.split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect()
    };
    let mut out = HashMap::new();
    for line in text.lines() {
        let Some(m) = FLOW.captures(line) else {
            continue;
        };
        let (b, a) = (nums(&m[3]), nums(&m[4]));
        let d = b.iter().zip(&a).map(|(x, y)| y - x).collect();
        out.insert(m[1].to_string(), (m[2].parse().unwrap_or(i64::MAX), d));
    }
    out
}

/// The index of the largest delta (the first of equals), `None` for no deltas.
fn busiest(d: &[i64]) -> Option<usize> {
    let max = *d.iter().max()?;
    d.iter().position(|&x| x == max)
}

/// The host side's state: the setup and the checks that failed so far.
struct Host {
    s: Setup,
    fails: Vec<String>,
}

impl Host {
    fn log(&self, msg: &str) {
        println!("[rss-host] {msg}");
    }

    /// Prints one CHECK line and remembers a failure; returns `ok`.
    fn check(&mut self, ok: bool, what: &str) -> bool {
        println!("{}{what}", if ok { "CHECK-OK   " } else { "CHECK-FAIL " });
        let _ = std::io::stdout().flush();
        if !ok {
            self.fails.push(what.to_string());
        }
        ok
    }

    fn ctl_cmd(&self, json: bool, args: &[String]) -> Command {
        let mut c = Command::new(&self.s.daemon);
        c.arg("ctl").arg("--control").arg(&self.s.ctl);
        if json {
            c.arg("--json");
        }
        c.args(args);
        c
    }

    /// `ctl --json ARGS`: its JSON answer; a failing call is an error.
    fn ctl(&self, args: &[&str]) -> Result<Value, RssHostError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let err = |why: String| RssHostError::Ctl {
            args: args.join(" "),
            why,
        };
        let o = output_within(&mut self.ctl_cmd(true, &args), CTL_TIMEOUT)
            .map_err(|e| err(e.to_string()))?;
        if !o.status.success() {
            return Err(err(String::from_utf8_lossy(&o.stderr).trim().to_string()));
        }
        serde_json::from_slice(&o.stdout).map_err(|e| err(format!("no JSON answer: {e}")))
    }

    /// `ctl ARGS` for the log: what it printed, stdout then stderr.
    fn ctl_human(&self, args: &[String]) -> Result<String, RssHostError> {
        let o = output_within(&mut self.ctl_cmd(false, args), CTL_TIMEOUT).map_err(|e| {
            RssHostError::Ctl {
                args: args.join(" "),
                why: e.to_string(),
            }
        })?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }

    /// `ctl rss --port a [--predict FLOW]...`
    fn rss(&self, predict: &[String]) -> Result<Value, RssHostError> {
        let mut a = vec!["rss", "--port", "a"];
        for p in predict {
            a.extend(["--predict", p.as_str()]);
        }
        self.ctl(&a)
    }

    fn path_a(&self, name: &str) -> PathBuf {
        self.s.job_a.join(name)
    }

    fn read_a(&self, name: &str) -> Result<String, RssHostError> {
        let path = self.path_a(name);
        let bytes = std::fs::read(&path).map_err(|source| RssHostError::Io { path, source })?;
        // guest output may hold stray bytes: they cost a character, not the run
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Waits for A's `STEP.req`; false on a timeout or when A aborted.
    fn wait_step(&self, step: &str) -> bool {
        let req = self.path_a(&format!("{step}.req"));
        let t0 = Instant::now();
        while !req.exists() {
            if t0.elapsed() > self.s.step_timeout || self.path_a("abort").exists() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        true
    }

    /// Writes `STEP.ack` with `text` whole (through a rename: A polls for it).
    fn ack(&self, step: &str, text: &str) -> Result<(), RssHostError> {
        let tmp = self.path_a(&format!("{step}.ack.tmp"));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RssHostError::Io { path, source }
        };
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, self.path_a(&format!("{step}.ack"))).map_err(io(&tmp))
    }

    /// The checks of the ethtool steps (default, equal2, hkey); hkey also asks
    /// the model where each test flow goes and returns its predictions.
    fn ethtool_step(
        &mut self,
        step: &str,
        st: &Value,
        spec: &Spec,
    ) -> Result<HashMap<String, Value>, RssHostError> {
        let (table, key) = parse_ethtool_x(&self.read_a(&format!("x-{step}.txt"))?);
        let reta = &st["indirection_table"];
        let reta_head: Vec<Value> = reta
            .as_array()
            .map(|a| a.iter().take(8).cloned().collect())
            .unwrap_or_default();
        let key_head: String = st["key"].as_str().unwrap_or("").chars().take(16).collect();
        self.check(
            truthy(&st["rss_negotiated"]) && truthy(&st["hash_report_negotiated"]),
            &format!(
                "{step}: guest negotiated RSS and HASH_REPORT (rss={} hash_report={})",
                py(&st["rss_negotiated"]),
                py(&st["hash_report_negotiated"])
            ),
        );
        self.check(
            st["mode"] == "rss",
            &format!("{step}: daemon RSS mode is rss ({})", py(&st["mode"])),
        );
        self.check(
            table.len() == RETA_LEN,
            &format!(
                "{step}: ethtool -x shows a 128-entry RETA ({})",
                table.len()
            ),
        );
        self.check(
            ints(reta).as_ref() == Some(&table),
            &format!(
                "{step}: guest RETA == daemon table (daemon {}...)",
                py(&Value::Array(reta_head))
            ),
        );
        self.check(
            key.as_deref().is_some_and(|k| st["key"] == k),
            &format!("{step}: guest key == daemon key ({key_head}...)"),
        );
        let spread = |n: i64| (0..RETA_LEN as i64).map(|i| i % n).collect::<Vec<_>>();
        let mut predicted = HashMap::new();
        match step {
            "default" => {
                self.check(
                    table == spread(4),
                    &format!("{step}: default RETA spreads over 4 queues"),
                );
                self.check(
                    num(&st["active_queue_pairs"]) == Some(4.0)
                        && num(&st["max_tx_vq"]) == Some(4.0),
                    &format!(
                        "{step}: 4 queue pairs in use (max_tx_vq {})",
                        py(&st["max_tx_vq"])
                    ),
                );
                let names: Vec<String> = st["hash_type_names"]
                    .as_array()
                    .map(|a| a.iter().map(py).collect())
                    .unwrap_or_default();
                let types = st["hash_types"]
                    .as_u64()
                    .map_or_else(|| py(&st["hash_types"]), |t| format!("{t:#x}"));
                self.log(&format!("hash types {types} {}", names.join(" ")));
            }
            "equal2" => {
                self.check(
                    ints(reta) == Some(spread(2)),
                    &format!("{step}: ethtool -X equal 2 -> daemon table 0,1,0,1..."),
                );
            }
            "hkey" => {
                self.check(
                    st["key"] == spec.key_hex.as_str(),
                    &format!("{step}: ethtool -X hkey -> daemon key {key_head}..."),
                );
                self.check(
                    ints(reta) == Some(spread(4)),
                    &format!("{step}: ethtool -X equal 4 -> daemon table 0..3"),
                );
                let mut names: Vec<String> =
                    spec.flows.iter().map(|(p, s)| flow_name(p, *s)).collect();
                names.push(flow_name("tcp", spec.move_sport));
                let pr = self.rss(&names)?;
                for p in pr["predictions"].as_array().into_iter().flatten() {
                    if let Some(f) = p["flow"].as_str() {
                        predicted.insert(f.to_string(), p.clone());
                    }
                }
                let mut args: Vec<String> = ["rss", "--port", "a"].map(String::from).to_vec();
                for n in &names {
                    args.extend(["--predict".to_string(), n.clone()]);
                }
                println!("{}", self.ctl_human(&args)?);
                for n in &names {
                    let p = predicted
                        .get(n)
                        .ok_or_else(|| RssHostError::Missing(format!("no prediction for {n}")))?;
                    self.check(
                        !p["queue"].is_null()
                            && p["how"].as_str().is_some_and(|h| h.starts_with("rss")),
                        &format!(
                            "predict {n}: queue {} via {}",
                            py(&p["queue"]),
                            py(&p["how"])
                        ),
                    );
                }
                // Forget earlier flows, so the table below is about this run only.
                self.ctl(&["rss", "--port", "a", "--clear-flows"])?;
            }
            _ => {}
        }
        Ok(predicted)
    }

    /// The flows step: each test flow peaked on the predicted queue in the
    /// guest and in the daemon's flow table; then two flow rules are added.
    /// Returns the rules for the last step.
    fn flows_step(
        &mut self,
        spec: &Spec,
        predicted: &HashMap<String, Value>,
    ) -> Result<Rules, RssHostError> {
        let got = parse_flow_lines(&self.read_a("out.log")?);
        let st = self.rss(&[])?;
        let seen: HashMap<String, &Value> = st["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| Some((f["flow"].as_str()?.to_string(), f)))
            .collect();
        let mut queues_used = BTreeSet::new();
        for (proto, sport) in &spec.flows {
            let n = flow_name(proto, *sport);
            let (p, measured) = (predicted.get(&n), got.get(&n));
            let (Some(p), Some((rc, d)), Some(best)) =
                (p, measured, measured.and_then(|(_, d)| busiest(d)))
            else {
                self.check(false, &format!("{n}: measured and predicted"));
                continue;
            };
            let total: i64 = d.iter().sum();
            queues_used.insert(best);
            self.check(*rc == 0, &format!("{n}: traffic ran (rc {rc})"));
            let peak = d[best] as f64;
            self.check(
                p["queue"].as_u64() == Some(best as u64)
                    && peak >= 0.7 * total as f64
                    && peak >= 20.0,
                &format!(
                    "{n}: guest rx queue {best} == predicted {} (per-queue rx_packets deltas {})",
                    py(&p["queue"]),
                    py_list(d)
                ),
            );
            let f = seen.get(&n);
            if !self.check(f.is_some(), &format!("{n}: daemon saw the flow")) {
                continue;
            }
            let Some(f) = f else { continue };
            self.check(
                f["queue"] == p["queue"]
                    && f["hash_value"] == p["hash_value"]
                    && f["hash_report"] == p["hash_report"],
                &format!(
                    "{n}: daemon steered to queue {} with hash {} report {} == model ({}, {}, {})",
                    py(&f["queue"]),
                    hex10(&f["hash_value"]),
                    py(&f["hash_report"]),
                    py(&p["queue"]),
                    hex10(&p["hash_value"]),
                    py(&p["hash_report_name"])
                ),
            );
            self.check(
                num(&f["frames"]).is_some_and(|x| x > 0.0) && f["hash_reported"] == f["frames"],
                &format!(
                    "{n}: all {} frames carried the hash in a 20-byte RX header ({})",
                    py(&f["frames"]),
                    py(&f["hash_reported"])
                ),
            );
        }
        let used: Vec<usize> = queues_used.iter().copied().collect();
        self.check(
            used.len() == 4,
            &format!("flows arrived on all 4 queues {}", py_list(&used)),
        );
        // Rules: move a fresh TCP flow off its RSS queue, drop another.
        let n = flow_name("tcp", spec.move_sport);
        let rss_queue = predicted
            .get(&n)
            .and_then(|p| p["queue"].as_u64())
            .ok_or_else(|| RssHostError::Missing(format!("no predicted queue for {n}")))?;
        let target = (rss_queue + 1) % 4;
        let move_port = spec.move_sport.to_string();
        let target_s = target.to_string();
        // `flow-rule add --port a --proto tcp MATCH...`: the new rule's id.
        let add_rule = |rest: &[&str]| {
            let mut args = vec!["flow-rule", "add", "--port", "a", "--proto", "tcp"];
            args.extend_from_slice(rest);
            let r = self.ctl(&args)?;
            r["rule_id"]
                .as_u64()
                .ok_or_else(|| RssHostError::Missing(format!("flow-rule add: no rule_id in {r}")))
        };
        let move_id = add_rule(&[
            "--dst-ip",
            A_IP,
            "--dst-port",
            &move_port,
            "--queue",
            &target_s,
        ])?;
        let drop_id = add_rule(&[
            "--src-ip",
            B_IP,
            "--src-port",
            "5202",
            "--drop",
            "--priority",
            "1",
        ])?;
        println!(
            "{}",
            self.ctl_human(&["flow-rule", "list", "--port", "a"].map(String::from))?
        );
        // for whoever reads the logs afterwards (the Python tool read it back too)
        let path = self.path_a("rules.json");
        let text = json!({"move_id": move_id, "drop_id": drop_id, "target": target}).to_string();
        std::fs::write(&path, text).map_err(|source| RssHostError::Io { path, source })?;
        self.ack("flows", &format!("{target}\n"))?;
        Ok(Rules {
            move_id,
            drop_id,
            target,
            rss_queue,
        })
    }

    /// The rules step: the moved flow landed on the rule's queue, the dropped
    /// one timed out and the drops were counted.
    fn rules_step(&mut self, spec: &Spec, rules: &Rules) -> Result<(), RssHostError> {
        let log = self.read_a("out.log")?;
        let got = parse_flow_lines(&log);
        let st = self.rss(&[])?;
        let lst: HashMap<u64, Value> = self.ctl(&["flow-rule", "list", "--port", "a"])?["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| Some((r["id"].as_u64()?, r.clone())))
            .collect();
        let hits = |id: u64| -> Result<Value, RssHostError> {
            lst.get(&id)
                .map(|r| r["hits"].clone())
                .ok_or_else(|| RssHostError::Missing(format!("flow rule {id} is not listed")))
        };
        let n = flow_name("tcp", spec.move_sport);
        let t = rules.target as usize;
        match got.get(&n).filter(|(_, d)| !d.is_empty()) {
            Some((rc, d)) => {
                self.check(true, &format!("{n}: measured"));
                let best = busiest(d).unwrap_or(0);
                let total: i64 = d.iter().sum();
                self.check(
                    *rc == 0 && best == t && d.get(t).is_some_and(|&x| x as f64 >= 0.7 * total as f64),
                    &format!(
                        "{n}: flow rule {} moved it to queue {best} (wanted {t}, RSS said {}; deltas {})",
                        rules.move_id,
                        rules.rss_queue,
                        py_list(d)
                    ),
                );
            }
            None => {
                self.check(false, &format!("{n}: measured"));
            }
        }
        let move_hits = hits(rules.move_id)?;
        self.check(
            num(&move_hits).is_some_and(|h| h > 0.0),
            &format!("move rule hits {}", py(&move_hits)),
        );
        let drop_rc = got.get("drop").map(|(rc, _)| *rc);
        self.check(
            drop_rc.is_some_and(|rc| rc != 0),
            &format!(
                "dropped flow: guest connect to B:5202 failed (nc rc {})",
                drop_rc.map_or_else(|| "None".to_string(), |rc| rc.to_string())
            ),
        );
        self.check(
            !log.contains("refused"),
            "dropped flow: timed out, not refused (B's RSTs were dropped)",
        );
        let drop_hits = hits(rules.drop_id)?;
        let h = num(&drop_hits).unwrap_or(0.0);
        self.check(
            h > 0.0 && num(&st["rule_drops"]).is_some_and(|d| d >= h),
            &format!(
                "drop rule {}: {} hits, {} frames dropped by rules",
                rules.drop_id,
                py(&drop_hits),
                py(&st["rule_drops"])
            ),
        );
        let prefix = format!("{B_IP}:5202-");
        let f = st["flows"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["flow"].as_str().is_some_and(|s| s.starts_with(&prefix)));
        self.check(
            f.is_some_and(|f| {
                f["queue"].is_null() && f["how"] == format!("rule {}", rules.drop_id).as_str()
            }),
            &format!(
                "{}: daemon flow table says dropped by the rule",
                f.map_or_else(|| "B:5202 flow".to_string(), |f| py(&f["flow"]))
            ),
        );
        println!(
            "{}",
            self.ctl_human(&["rss", "--port", "a"].map(String::from))?
        );
        self.ack("rules", "")
    }

    /// Every step in order; stops at the first step A does not reach.
    fn run(&mut self) -> Result<(), RssHostError> {
        let spec = Spec::load(&self.s.flows)?;
        let mut predicted = HashMap::new();
        let mut rules = None;
        for step in STEPS {
            self.log(&format!("waiting for guest step {step}"));
            if !self.wait_step(step) {
                self.check(false, &format!("guest reached step {step}"));
                break;
            }
            match step {
                "flows" => rules = Some(self.flows_step(&spec, &predicted)?),
                "rules" => {
                    let r = rules
                        .take()
                        .ok_or_else(|| RssHostError::Missing("rules step before flows".into()))?;
                    self.rules_step(&spec, &r)?;
                }
                _ => {
                    let st = self.rss(&[])?;
                    let p = self.ethtool_step(step, &st, &spec)?;
                    if step == "hkey" {
                        predicted = p;
                    }
                    self.ack(step, "")?;
                }
            }
        }
        Ok(())
    }
}

/// The rules added at the flows step.
struct Rules {
    move_id: u64,
    drop_id: u64,
    /// the queue the move rule sends its flow to
    target: u64,
    /// the queue RSS would have picked
    rss_queue: u64,
}

/// flows.json: the hash key and the test flows.
struct Spec {
    /// the key in the daemon's format: hex without colons, lower case
    key_hex: String,
    /// (protocol, A's port) of every test flow
    flows: Vec<(String, u64)>,
    /// A's port of the flow the move rule steers
    move_sport: u64,
}

impl Spec {
    fn load(path: &Path) -> Result<Spec, RssHostError> {
        let text = std::fs::read_to_string(path).map_err(|source| RssHostError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let bad = |what: &str| RssHostError::Missing(format!("{}: {what}", path.display()));
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
        let key_hex = v["key"]
            .as_str()
            .ok_or_else(|| bad("no key"))?
            .replace(':', "")
            .to_lowercase();
        let flows = v["flows"]
            .as_array()
            .ok_or_else(|| bad("no flows"))?
            .iter()
            .map(|f| Some((f[0].as_str()?.to_string(), f[1].as_u64()?)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("flows: want [[PROTO, PORT]...]"))?;
        let move_sport = v["move_sport"]
            .as_u64()
            .ok_or_else(|| bad("no move_sport"))?;
        Ok(Spec {
            key_hex,
            flows,
            move_sport,
        })
    }
}

/// Runs the host side; true when every check passed and every step was seen.
/// An error is reported as a "CHECK-FAIL host helper" line and also stops
/// guest A (`abort`); guest B is released (`stop`) in every case.
pub fn run(setup: Setup) -> bool {
    let mut host = Host {
        s: setup,
        fails: Vec::new(),
    };
    let touch = |p: PathBuf| {
        let _ = std::fs::write(p, "");
    };
    match host.run() {
        Ok(()) => {
            // let B finish
            touch(host.s.job_b.join("stop"));
            host.log(&format!("{} failed checks", host.fails.len()));
            host.fails.is_empty()
        }
        Err(e) => {
            println!("CHECK-FAIL host helper: {e}");
            touch(host.s.job_a.join("abort"));
            touch(host.s.job_b.join("stop"));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETHTOOL_X: &str = "RX flow hash indirection table for eth0 with 4 RX ring(s):
    0:      0     1     2     3     0     1     2     3
    8:      0     1     2     3     0     1     2     3
RSS hash key:
5A:7F:10:35
RSS hash function:
    toeplitz: on
";

    #[test]
    fn ethtool_x() {
        let (t, k) = parse_ethtool_x(ETHTOOL_X);
        assert_eq!(t, [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
        assert_eq!(k.as_deref(), Some("5a7f1035"));
        assert_eq!(parse_ethtool_x("nothing\n"), (vec![], None));
    }

    #[test]
    fn flow_lines() {
        let log = "noise\nFLOW 10.77.0.2:5201-10.77.0.1:41001/tcp rc=0 before=[1 2 3 4 ] after=[1 502 3 10 ]\n\
                   FLOW drop rc=1 before=[] after=[]\n";
        let f = parse_flow_lines(log);
        assert_eq!(f[&flow_name("tcp", 41001)], (0, vec![0, 500, 0, 6]));
        assert_eq!(f["drop"], (1, vec![]));
        assert_eq!(busiest(&[0, 500, 0, 500]), Some(1));
        assert_eq!(busiest(&[]), None);
    }

    #[test]
    fn python_formatting() {
        assert_eq!(py(&json!(null)), "None");
        assert_eq!(py(&json!(true)), "True");
        assert_eq!(py(&json!([0, 1, "a"])), "[0, 1, 'a']");
        assert_eq!(hex10(&json!(0xabcd)), "0x0000abcd");
        assert_eq!(hex10(&json!(null)), "None");
        assert_eq!(py_list(&[1, -2]), "[1, -2]");
        assert!(!truthy(&json!(0)) && truthy(&json!(1)) && !truthy(&json!(null)));
    }
}
