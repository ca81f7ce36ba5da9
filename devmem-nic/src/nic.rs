//! The NIC: rules, then RSS, then placement on the chosen queue.

use std::collections::HashMap;

use crate::error::NicError;
use crate::pool::BufferId;
use crate::queue::{DropReason, Placement, QueueConfig, QueueCounters, RxQueue};
use crate::rss::{HashConfig, HashReport, HashResult, RssConfig, RssLimits};
use crate::steering::{Action, FlowRule, RuleTable};
use wire::parse::{parse, ParsedFrame};

/// NIC-wide configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NicConfig {
    /// Number of receive queues (at least 1).
    pub num_queues: u16,
    /// Maximum number of flow rules.
    pub max_rules: usize,
    /// Queue for frames when neither a rule nor RSS decides.
    pub default_queue: u16,
    /// RSS limits advertised to the driver.
    pub rss_limits: RssLimits,
    /// Configuration shared by every queue at creation.
    pub queue: QueueConfig,
}

impl Default for NicConfig {
    /// One queue, 256 rules, default limits and queue configuration.
    fn default() -> Self {
        NicConfig {
            num_queues: 1,
            max_rules: 256,
            default_queue: 0,
            rss_limits: RssLimits::default(),
            queue: QueueConfig::default(),
        }
    }
}

/// Why a frame went where it went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A flow rule matched (its action is in `Decision::queue`).
    Rule {
        /// The rule's id.
        id: u32,
    },
    /// RSS hashed the frame and the indirection table chose the queue.
    Rss {
        /// The hash value.
        hash: u32,
        /// The indirection-table index (`hash & mask`).
        bucket: usize,
        /// The hash type used.
        hash_type: HashReport,
    },
    /// RSS is on but no enabled hash type applies: the unclassified queue.
    Unclassified,
    /// RSS is off and no rule matched: the default queue.
    Default,
}

/// A steering decision for one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The receive queue, or `None` to drop.
    pub queue: Option<u16>,
    /// Why.
    pub reason: Reason,
    /// `hash_report` for the virtio-net header (NONE if no hash was
    /// calculated or no hash configuration is set). Calculated even when a
    /// rule decided the queue.
    pub hash_report: HashReport,
    /// `hash_value` for the virtio-net header (0 with `HashReport::None`).
    pub hash_value: u32,
}

/// What happened to a received frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Placed into buffers of `Placement::queue`.
    Placed(Placement),
    /// Dropped and counted.
    Dropped(DropReason),
}

/// The result of [`Nic::receive`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RxOutcome {
    /// The steering decision.
    pub decision: Decision,
    /// Placement or drop.
    pub delivery: Delivery,
}

/// NIC-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// Frames passed to [`Nic::receive`].
    pub frames_in: u64,
    /// Frames placed on some queue.
    pub delivered: u64,
    /// Frames dropped by a `Drop` rule (they reach no queue).
    pub drop_rule: u64,
    /// Frames dropped for buffer or size reasons (also counted per queue).
    pub drop_queue: u64,
}

/// The receive model of a multi-queue NIC.
#[derive(Debug, Clone)]
pub struct Nic {
    config: NicConfig,
    rules: RuleTable,
    rule_hits: HashMap<u32, u64>,
    rss: Option<RssConfig>,
    hash_only: Option<HashConfig>,
    queues: Vec<RxQueue>,
    counters: NicCounters,
}

impl Nic {
    /// A NIC with `config.num_queues` queues, no rules and RSS off.
    pub fn new(config: NicConfig) -> Result<Self, NicError> {
        if config.num_queues == 0 {
            return Err(NicError::NoQueues);
        }
        check_queue(config.default_queue, config.num_queues)?;
        let queues = (0..config.num_queues)
            .map(|i| RxQueue::new(i, config.queue))
            .collect::<Result<_, _>>()?;
        Ok(Nic {
            rules: RuleTable::new(config.max_rules),
            config,
            rule_hits: HashMap::new(),
            rss: None,
            hash_only: None,
            queues,
            counters: NicCounters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NicConfig {
        &self.config
    }

    /// Number of receive queues.
    pub fn num_queues(&self) -> u16 {
        self.config.num_queues
    }

    /// Enables RSS (validated against limits and queue count), or disables
    /// it with `None`.
    pub fn set_rss(&mut self, rss: Option<RssConfig>) -> Result<(), NicError> {
        if let Some(r) = &rss {
            r.validate(&self.config.rss_limits, self.config.num_queues)?;
        }
        self.rss = rss;
        Ok(())
    }

    /// The active RSS configuration.
    pub fn rss(&self) -> Option<&RssConfig> {
        self.rss.as_ref()
    }

    /// Sets the hash configuration used for hash reporting while RSS is off
    /// (`VIRTIO_NET_CTRL_MQ_HASH_CONFIG`). With RSS on, RSS's own hash
    /// configuration is used.
    pub fn set_hash_config(&mut self, hash: Option<HashConfig>) -> Result<(), NicError> {
        if let Some(h) = &hash {
            h.validate(&self.config.rss_limits)?;
        }
        self.hash_only = hash;
        Ok(())
    }

    /// Installs a flow rule (checked: unique id, room left, queue exists).
    pub fn add_rule(&mut self, rule: FlowRule) -> Result<(), NicError> {
        if let Action::Queue(q) = rule.action {
            check_queue(q, self.config.num_queues)?;
        }
        self.rules.insert(rule)?;
        self.rule_hits.insert(rule.id, 0);
        Ok(())
    }

    /// Removes a flow rule by id.
    pub fn remove_rule(&mut self, id: u32) -> Result<FlowRule, NicError> {
        let r = self.rules.remove(id)?;
        self.rule_hits.remove(&id);
        Ok(r)
    }

    /// The rule table.
    pub fn rules(&self) -> &RuleTable {
        &self.rules
    }

    /// Frames a rule has matched in [`receive`](Self::receive) since it was
    /// added.
    pub fn rule_hits(&self, id: u32) -> Option<u64> {
        self.rule_hits.get(&id).copied()
    }

    /// A queue.
    pub fn queue(&self, q: u16) -> Result<&RxQueue, NicError> {
        check_queue(q, self.config.num_queues)?;
        Ok(&self.queues[usize::from(q)])
    }

    /// A queue, mutably (to post and recycle buffers or change HDS).
    pub fn queue_mut(&mut self, q: u16) -> Result<&mut RxQueue, NicError> {
        check_queue(q, self.config.num_queues)?;
        Ok(&mut self.queues[usize::from(q)])
    }

    /// Posts a header buffer to queue `q`.
    pub fn post_header(&mut self, q: u16, id: BufferId) -> Result<(), NicError> {
        self.queue_mut(q)?.header_pool.post(id)
    }

    /// Posts a payload buffer to queue `q`.
    pub fn post_payload(&mut self, q: u16, id: BufferId) -> Result<(), NicError> {
        self.queue_mut(q)?.payload_pool.post(id)
    }

    /// Recycles every buffer of a placement (convenience for consumers that
    /// release a whole frame at once).
    pub fn recycle(&mut self, placement: &Placement) -> Result<(), NicError> {
        let q = self.queue_mut(placement.queue)?;
        if let Some(h) = &placement.header {
            q.header_pool.recycle(h.buffer)?;
        }
        placement
            .payload
            .iter()
            .try_for_each(|s| q.payload_pool.recycle(s.buffer))
    }

    /// NIC-wide counters.
    pub fn counters(&self) -> &NicCounters {
        &self.counters
    }

    /// Per-queue counters.
    pub fn queue_counters(&self, q: u16) -> Result<&QueueCounters, NicError> {
        Ok(self.queue(q)?.counters())
    }

    /// Steering decision for a frame, without side effects.
    pub fn classify(&self, frame: &[u8]) -> Decision {
        self.classify_parsed(&parse(frame))
    }

    /// Steering decision for an already parsed frame: rules first (lowest
    /// priority number, then insertion order), then RSS, then the default
    /// queue.
    pub fn classify_parsed(&self, p: &ParsedFrame) -> Decision {
        let hash_cfg = self
            .rss
            .as_ref()
            .map(|r| &r.hash)
            .or(self.hash_only.as_ref());
        let hash = hash_cfg.and_then(|h| h.hash(p));
        let (hash_report, hash_value) = match hash {
            Some(HashResult { value, report }) => (report, value),
            None => (HashReport::None, 0),
        };
        let (queue, reason) = if let Some(rule) = self.rules.lookup(p) {
            let q = match rule.action {
                Action::Queue(q) => Some(q),
                Action::Drop => None,
            };
            (q, Reason::Rule { id: rule.id })
        } else if let Some(rss) = &self.rss {
            match hash {
                Some(h) => {
                    let bucket = rss.bucket(h.value);
                    (
                        Some(rss.indirection_table[bucket]),
                        Reason::Rss {
                            hash: h.value,
                            bucket,
                            hash_type: h.report,
                        },
                    )
                }
                None => (Some(rss.unclassified_queue), Reason::Unclassified),
            }
        } else {
            (Some(self.config.default_queue), Reason::Default)
        };
        Decision {
            queue,
            reason,
            hash_report,
            hash_value,
        }
    }

    /// Classifies a frame and places it into the chosen queue's buffers,
    /// updating counters. Never panics on any input.
    pub fn receive(&mut self, frame: &[u8]) -> RxOutcome {
        self.counters.frames_in += 1;
        let parsed = parse(frame);
        let decision = self.classify_parsed(&parsed);
        if let Reason::Rule { id } = decision.reason {
            if let Some(h) = self.rule_hits.get_mut(&id) {
                *h += 1;
            }
        }
        let delivery = match decision.queue {
            None => {
                self.counters.drop_rule += 1;
                // Only a rule yields `queue: None`.
                let id = match decision.reason {
                    Reason::Rule { id } => id,
                    _ => u32::MAX,
                };
                Delivery::Dropped(DropReason::Rule { id })
            }
            Some(q) => match self.queues[usize::from(q)].place(frame, &parsed) {
                Ok(p) => {
                    self.counters.delivered += 1;
                    Delivery::Placed(p)
                }
                Err(r) => {
                    self.counters.drop_queue += 1;
                    Delivery::Dropped(r)
                }
            },
        };
        RxOutcome { decision, delivery }
    }
}

fn check_queue(queue: u16, num_queues: u16) -> Result<(), NicError> {
    if queue < num_queues {
        Ok(())
    } else {
        Err(NicError::NoSuchQueue { queue, num_queues })
    }
}
