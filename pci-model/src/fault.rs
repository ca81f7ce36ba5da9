//! Device faults: the driver bench's rules, as the edge hands them to a
//! model ([`crate::PciDevice::add_fault`]).
//!
//! A rule names a fault *kind* the model knows (`reset-request`,
//! `cqe-status`, ...), kind-specific `key=value` parameters (which opcode,
//! which QP, which status), and how often it fires once its condition is met:
//! at most `count` times (default once), each time with probability `prob`
//! (default 1) drawn from the rule's own seeded PRNG. The same seed and the
//! same driver behaviour give the same faults.
//!
//! The model keeps its rules in a [`FaultRules`] table: it asks
//! [`FaultRules::fire`] at each place a kind may strike, and the table keeps
//! the counters (`matched`, `hits`) that `ctl status` shows. A rule stays in
//! the table, visible with its counters, until it is cleared, also after its
//! count is spent and when it never matched.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

/// Rules one device may hold. Adding more is refused.
pub const MAX_DEVICE_FAULT_RULES: usize = 64;

/// Why a fault rule was refused. The text is what `ctl` prints.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultError {
    /// The model has no fault of that kind.
    #[error("device fault kind {kind:?} is not one of this device's: {known}")]
    UnknownKind {
        /// The kind asked for.
        kind: String,
        /// The kinds the device has, comma-separated.
        known: String,
    },
    /// A parameter the kind does not take.
    #[error("device fault {kind}: no parameter {param:?} (takes: {takes})")]
    UnknownParam {
        /// The rule's kind.
        kind: String,
        /// The parameter given.
        param: String,
        /// The parameters the kind takes, comma-separated.
        takes: String,
    },
    /// A parameter the kind needs is missing.
    #[error("device fault {kind}: needs {param}=")]
    MissingParam {
        /// The rule's kind.
        kind: String,
        /// The parameter.
        param: &'static str,
    },
    /// A parameter's value does not parse or is out of range.
    #[error("device fault {kind}: {param}={value:?}: {why}")]
    BadValue {
        /// The rule's kind.
        kind: String,
        /// The parameter.
        param: String,
        /// Its value.
        value: String,
        /// What would be accepted.
        why: ValueError,
    },
    /// `prob` outside 0..=1, or `count` 0.
    #[error("device fault trigger: {0}")]
    Trigger(String),
    /// The device holds [`MAX_DEVICE_FAULT_RULES`] rules already.
    #[error("too many device fault rules (at most {MAX_DEVICE_FAULT_RULES}); clear some first")]
    TooMany,
    /// A rule with that id exists.
    #[error("device fault rule {0} exists")]
    DuplicateId(u32),
    /// No rule has that id.
    #[error("no device fault rule {0}")]
    NoSuchRule(u32),
    /// The device has no fault injection at all.
    #[error("this device has no device faults")]
    Unsupported,
}

/// Why one parameter value was refused: what the parameter accepts (`a
/// number (decimal or 0x hex)`). A value's parser knows only the text it
/// was given, so this is all it can say; [`FaultSpec::get`] puts the rule's
/// kind, the parameter and the value around it in a
/// [`FaultError::BadValue`], which is what `ctl` prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{expected}")]
pub struct ValueError {
    /// What would be accepted, worded to follow `param=value: `.
    pub expected: Cow<'static, str>,
}

impl ValueError {
    /// The value is not `expected` (a fixed text or one built from the
    /// device's name tables).
    pub fn expected(expected: impl Into<Cow<'static, str>>) -> Self {
        ValueError {
            expected: expected.into(),
        }
    }
}

/// One kind of fault a model can inject, for `ctl device-fault kinds` and
/// the error that lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultKindInfo {
    /// The kind's name (`adminq-status`).
    pub name: &'static str,
    /// Its parameters, `name=meaning` each.
    pub params: &'static [&'static str],
    /// What it does, in one sentence.
    pub doc: &'static str,
}

/// A rule as the edge received it, before the model checks its kind.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FaultSpec {
    /// The fault kind.
    pub kind: String,
    /// Kind-specific parameters.
    pub params: BTreeMap<String, String>,
    /// Fire at most this many times (`None`: once).
    pub count: Option<u64>,
    /// Fire with this probability each time the condition is met (`None`: 1).
    pub prob: Option<f64>,
    /// The PRNG seed (`None`: the rule id).
    pub seed: Option<u64>,
}

impl FaultSpec {
    /// `kind` with no parameters, firing once.
    pub fn new(kind: &str) -> Self {
        FaultSpec {
            kind: kind.to_owned(),
            ..FaultSpec::default()
        }
    }

    /// Adds a parameter.
    pub fn param(mut self, key: &str, value: impl fmt::Display) -> Self {
        self.params.insert(key.to_owned(), value.to_string());
        self
    }

    /// Checks that every parameter is one of `takes` (names without `=...`).
    pub fn check_params(&self, takes: &[&str]) -> Result<(), FaultError> {
        for k in self.params.keys() {
            if !takes.iter().any(|t| param_name(t) == k) {
                return Err(FaultError::UnknownParam {
                    kind: self.kind.clone(),
                    param: k.clone(),
                    takes: if takes.is_empty() {
                        "nothing".into()
                    } else {
                        takes
                            .iter()
                            .map(|t| param_name(t))
                            .collect::<Vec<_>>()
                            .join(", ")
                    },
                });
            }
        }
        Ok(())
    }

    /// Parameter `key` parsed with `parse` (which says what it accepts on
    /// failure), or `None` when absent.
    pub fn get<T>(
        &self,
        key: &'static str,
        parse: impl FnOnce(&str) -> Result<T, ValueError>,
    ) -> Result<Option<T>, FaultError> {
        let Some(v) = self.params.get(key) else {
            return Ok(None);
        };
        parse(v).map(Some).map_err(|why| FaultError::BadValue {
            kind: self.kind.clone(),
            param: key.to_owned(),
            value: v.clone(),
            why,
        })
    }

    /// [`FaultSpec::get`] for a parameter the kind needs.
    pub fn require<T>(
        &self,
        key: &'static str,
        parse: impl FnOnce(&str) -> Result<T, ValueError>,
    ) -> Result<T, FaultError> {
        self.get(key, parse)?.ok_or(FaultError::MissingParam {
            kind: self.kind.clone(),
            param: key,
        })
    }

    /// `key=value ...` in key order: how `ctl` shows the parameters.
    pub fn params_text(&self) -> String {
        self.params
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

fn param_name(t: &str) -> &str {
    t.split('=').next().unwrap_or(t)
}

/// Parses a number in decimal or `0x` hex, for fault parameters.
pub fn parse_number(s: &str) -> Result<u64, ValueError> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| ValueError::expected("a number (decimal or 0x hex)"))
}

/// A fault rule's own PRNG: splitmix64 from the rule's seed, so that a rule
/// fires the same way for the same seed. The device models' rules here and
/// the fabric's frame fault rules (`vhost-rdma`) use it alike.
#[derive(Debug, Clone)]
pub struct FaultRng(u64);

impl FaultRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        FaultRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n); 0 when `n` is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }
}

/// A rule's state and counters, as `ctl status` shows them (with the
/// `serde` feature, in the edge's control protocol as is).
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct FaultStatus {
    /// The rule's id (chosen by the edge).
    pub id: u32,
    /// Its kind.
    pub kind: String,
    /// Its parameters, `key=value ...`.
    #[cfg_attr(feature = "serde", serde(default))]
    pub params: String,
    /// Fires at most this many times.
    pub count: u64,
    /// Probability per match.
    pub prob: f64,
    /// PRNG seed.
    pub seed: u64,
    /// Times its condition was met.
    pub matched: u64,
    /// Times it fired.
    pub hits: u64,
    /// Its count is spent (it stays listed until cleared).
    #[cfg_attr(feature = "serde", serde(default))]
    pub spent: bool,
}

/// One rule in a model's table: the edge's spec, the model's typed kind
/// `K`, and the trigger state.
#[derive(Debug, Clone)]
pub struct FaultRule<K> {
    /// The rule's id.
    pub id: u32,
    /// The typed kind the model parsed from the spec.
    pub kind: K,
    spec: FaultSpec,
    count: u64,
    prob: f64,
    seed: u64,
    rng: FaultRng,
    matched: u64,
    hits: u64,
}

impl<K> FaultRule<K> {
    /// The rule's spec as added.
    pub fn spec(&self) -> &FaultSpec {
        &self.spec
    }

    /// Times it fired.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Its count is spent.
    pub fn spent(&self) -> bool {
        self.hits >= self.count
    }

    /// The condition for this rule is met: decides whether it fires now
    /// (count left, probability), counting both.
    pub fn fire(&mut self) -> bool {
        if self.spent() {
            return false;
        }
        self.matched += 1;
        let go = self.prob >= 1.0 || self.rng.unit() < self.prob;
        if go {
            self.hits += 1;
        }
        go
    }

    /// Its status for `ctl`.
    pub fn status(&self) -> FaultStatus {
        FaultStatus {
            id: self.id,
            kind: self.spec.kind.clone(),
            params: self.spec.params_text(),
            count: self.count,
            prob: self.prob,
            seed: self.seed,
            matched: self.matched,
            hits: self.hits,
            spent: self.spent(),
        }
    }
}

/// A model's fault rules, in the order they were added.
#[derive(Debug, Clone)]
pub struct FaultRules<K> {
    rules: Vec<FaultRule<K>>,
}

impl<K> Default for FaultRules<K> {
    fn default() -> Self {
        FaultRules { rules: Vec::new() }
    }
}

impl<K> FaultRules<K> {
    /// Adds rule `id` of the typed `kind` the model parsed from `spec`.
    pub fn add(&mut self, id: u32, spec: &FaultSpec, kind: K) -> Result<(), FaultError> {
        if self.rules.iter().any(|r| r.id == id) {
            return Err(FaultError::DuplicateId(id));
        }
        if self.rules.len() >= MAX_DEVICE_FAULT_RULES {
            return Err(FaultError::TooMany);
        }
        let count = spec.count.unwrap_or(1);
        if count == 0 {
            return Err(FaultError::Trigger("count must be at least 1".into()));
        }
        let prob = spec.prob.unwrap_or(1.0);
        if !(0.0..=1.0).contains(&prob) {
            return Err(FaultError::Trigger(format!("prob {prob} is not in 0..=1")));
        }
        let seed = spec.seed.unwrap_or(u64::from(id));
        self.rules.push(FaultRule {
            id,
            kind,
            spec: spec.clone(),
            count,
            prob,
            seed,
            rng: FaultRng::new(seed),
            matched: 0,
            hits: 0,
        });
        Ok(())
    }

    /// Removes rule `id`, or every rule (`None`); returns the removed rules
    /// (the model undoes lasting effects, such as a stalled queue).
    pub fn clear(&mut self, id: Option<u32>) -> Result<Vec<FaultRule<K>>, FaultError> {
        match id {
            None => Ok(std::mem::take(&mut self.rules)),
            Some(id) => {
                let i = self
                    .rules
                    .iter()
                    .position(|r| r.id == id)
                    .ok_or(FaultError::NoSuchRule(id))?;
                Ok(vec![self.rules.remove(i)])
            }
        }
    }

    /// No rule at all (the fast path checks this first).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The first rule (in insertion order) for which `matches` holds and
    /// which fires now; `None` when none does. Every matching rule that is
    /// asked counts the match, so a rule that never fires stays visible.
    pub fn fire(&mut self, mut matches: impl FnMut(&K) -> bool) -> Option<&mut FaultRule<K>> {
        let i = self
            .rules
            .iter_mut()
            .position(|r| !r.spent() && matches(&r.kind) && r.fire())?;
        self.rules.get_mut(i)
    }

    /// Rule `id` fires now (an immediate kind, acted on when it is added):
    /// false when there is no such rule or its `prob` said no (the rule then
    /// stays listed, unspent).
    pub fn fire_id(&mut self, id: u32) -> bool {
        self.rules
            .iter_mut()
            .find(|r| r.id == id)
            .is_some_and(|r| r.fire())
    }

    /// Every rule, for lasting faults (`qp-stall`: "is any rule stalling
    /// this QP?").
    pub fn iter(&self) -> impl Iterator<Item = &FaultRule<K>> {
        self.rules.iter()
    }

    /// Every rule, mutable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut FaultRule<K>> {
        self.rules.iter_mut()
    }

    /// The rules' status, in order.
    pub fn status(&self) -> Vec<FaultStatus> {
        self.rules.iter().map(FaultRule::status).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_and_prob_are_seeded_and_counted() {
        let mut rules = FaultRules::default();
        let mut spec = FaultSpec::new("x");
        spec.count = Some(3);
        spec.prob = Some(0.5);
        spec.seed = Some(7);
        rules.add(1, &spec, ()).unwrap();
        let fired: Vec<bool> = (0..40).map(|_| rules.fire(|_| true).is_some()).collect();
        let again = {
            let mut r2 = FaultRules::default();
            r2.add(1, &spec, ()).unwrap();
            (0..40)
                .map(|_| r2.fire(|_| true).is_some())
                .collect::<Vec<_>>()
        };
        assert_eq!(fired, again, "same seed, same decisions");
        assert_eq!(fired.iter().filter(|f| **f).count(), 3, "at most count");
        let st = &rules.status()[0];
        assert!(st.spent && st.hits == 3 && st.matched > 3, "{st:?}");
    }

    #[test]
    fn refusals_say_why() {
        let mut rules: FaultRules<()> = FaultRules::default();
        let mut spec = FaultSpec::new("x");
        spec.prob = Some(1.5);
        assert!(matches!(
            rules.add(1, &spec, ()),
            Err(FaultError::Trigger(_))
        ));
        spec.prob = None;
        rules.add(1, &spec, ()).unwrap();
        assert_eq!(rules.add(1, &spec, ()), Err(FaultError::DuplicateId(1)));
        assert_eq!(rules.clear(Some(9)).unwrap_err(), FaultError::NoSuchRule(9));
        let spec = FaultSpec::new("x").param("qpn", "zz");
        assert!(spec.check_params(&["qp=the QP"]).is_err());
        let e = spec.require("qpn", parse_number).unwrap_err();
        assert_eq!(
            e.to_string(),
            "device fault x: qpn=\"zz\": a number (decimal or 0x hex)"
        );
    }

    #[test]
    fn a_rule_that_never_matches_stays_listed() {
        let mut rules = FaultRules::default();
        rules.add(4, &FaultSpec::new("x"), 5u32).unwrap();
        assert!(rules.fire(|k| *k == 6).is_none());
        let st = rules.status();
        assert_eq!((st.len(), st[0].matched, st[0].hits), (1, 0, 0));
    }
}
