//! Counters kept per port and per queue, and rate-limited logging of guest
//! errors (a hostile guest must not be able to flood the log).

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

/// Live counters of one queue pair (atomics, updated on the data path). The
/// TX worker writes the `tx_` ones, the RX worker the `rx_` ones: they sit
/// on separate cache lines so the two threads do not contend for one.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub struct QueueCounters {
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub tx_errors: AtomicU64,
    _rx_apart: [u64; 5],
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub rx_drops: AtomicU64,
    pub rx_errors: AtomicU64,
}

impl QueueCounters {
    /// Adds `v` to one counter.
    pub fn add(c: &AtomicU64, v: u64) {
        c.fetch_add(v, Relaxed);
    }

    /// A plain copy of the counters.
    pub fn snapshot(&self) -> QueueStats {
        QueueStats {
            tx_frames: self.tx_frames.load(Relaxed),
            tx_bytes: self.tx_bytes.load(Relaxed),
            tx_errors: self.tx_errors.load(Relaxed),
            rx_frames: self.rx_frames.load(Relaxed),
            rx_bytes: self.rx_bytes.load(Relaxed),
            rx_drops: self.rx_drops.load(Relaxed),
            rx_errors: self.rx_errors.load(Relaxed),
        }
    }
}

/// Counters of one queue pair (or a port's sums of them). `tx` is
/// guest-to-fabric, `rx` fabric-to-guest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct QueueStats {
    pub tx_frames: u64,
    pub tx_bytes: u64,
    /// Malformed chains or frames refused on this TX queue.
    pub tx_errors: u64,
    pub rx_frames: u64,
    pub rx_bytes: u64,
    /// Frames lost towards the guest: pending queue full, or no RX buffer fit.
    pub rx_drops: u64,
    /// Malformed RX chains the guest posted.
    pub rx_errors: u64,
}

impl QueueStats {
    /// Adds `q`'s counters to these.
    pub fn add(&mut self, q: &QueueStats) {
        self.tx_frames += q.tx_frames;
        self.tx_bytes += q.tx_bytes;
        self.tx_errors += q.tx_errors;
        self.rx_frames += q.rx_frames;
        self.rx_bytes += q.rx_bytes;
        self.rx_drops += q.rx_drops;
        self.rx_errors += q.rx_errors;
    }
}

/// Counters of one port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PortStats {
    pub name: String,
    pub socket: String,
    pub mac: String,
    pub form: String,
    pub connected: bool,
    /// Connections accepted since start.
    pub connections: u64,
    /// Virtio features acked by the current (or last) guest.
    pub features: u64,
    pub queue_pairs: u16,
    pub active_queue_pairs: u16,
    /// The sums of `queues` ([`PortStats::sum_queues`]), at the top level
    /// of the JSON form.
    #[serde(flatten)]
    pub totals: QueueStats,
    /// Control-queue commands refused (test-device form).
    pub ctrl_errors: u64,
    /// Times the port's TX paused because its receiver was full (back-pressure).
    pub tx_pauses: u64,
    /// Guest connections the daemon ended because the front end sent a
    /// request it refused (unoffered features, bad vring parameters, ...).
    #[serde(default)]
    pub protocol_errors: u64,
    pub queues: Vec<QueueStats>,
    /// The guest has taken no frames for `[limits] stuck-guest-ms` or more
    /// while frames waited for it (none: it takes them, or nothing waits).
    #[serde(default)]
    pub stuck: Option<StuckReport>,
    /// Times the port's guest was reported stuck (each logged once).
    #[serde(default)]
    pub stuck_reports: u64,
}

/// A stuck guest as `ctl status` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct StuckReport {
    /// Which queue, for how long, how many frames dropped.
    #[serde(flatten)]
    pub guest: StuckGuest,
    /// The sentence the log printed ("guest on port p1 has taken no frames
    /// for 30 s; 74519 dropped"), with the numbers of now.
    pub text: String,
}

impl PortStats {
    /// Fills the port totals from the per-queue counters.
    pub fn sum_queues(&mut self) {
        self.totals = QueueStats::default();
        for q in &self.queues {
            self.totals.add(q);
        }
    }
}

/// Allows `burst` log lines per second, then counts the suppressed ones and
/// reports them with the next line that gets through.
#[derive(Debug, Default)]
pub struct LogLimiter {
    second: AtomicU64,
    count: AtomicU64,
    suppressed: AtomicU64,
}

impl LogLimiter {
    const BURST: u64 = 5;

    /// Returns `Some(suppressed_since_last)` when a line may be logged now.
    pub fn allow(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        if self.second.swap(now, Relaxed) != now {
            self.count.store(0, Relaxed);
        }
        if self.count.fetch_add(1, Relaxed) < Self::BURST {
            Some(self.suppressed.swap(0, Relaxed))
        } else {
            self.suppressed.fetch_add(1, Relaxed);
            None
        }
    }
}

/// Logs a warning about a guest error through a [`LogLimiter`].
#[macro_export]
macro_rules! guest_warn {
    ($limiter:expr, $($arg:tt)+) => {
        if let Some(suppressed) = $limiter.allow() {
            if suppressed > 0 {
                tracing::warn!(suppressed, $($arg)+);
            } else {
                tracing::warn!($($arg)+);
            }
        }
    };
}

/// A guest that has taken no frames on one receive queue for at least
/// `[limits] stuck-guest-ms` while frames waited for it.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StuckGuest {
    /// The receive queue pair (0 for a device port: its one pending queue).
    pub queue: usize,
    /// Milliseconds since frames began to wait with no RX buffer.
    pub for_ms: u64,
    /// Frames dropped for the queue since then.
    pub dropped: u64,
}

impl StuckGuest {
    /// The report's sentence for port `port` (`queues`: the port's queue
    /// pairs; the queue is named only when there are several).
    pub fn describe(&self, port: &str, queues: usize) -> String {
        let q = if queues > 1 {
            format!(" on queue {}", self.queue)
        } else {
            String::new()
        };
        let time = if self.for_ms >= 1000 {
            format!("{} s", self.for_ms / 1000)
        } else {
            format!("{} ms", self.for_ms)
        };
        format!(
            "guest on port {port} has taken no frames{q} for {time}; {} dropped",
            self.dropped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ctl status --json` keeps a port's totals at the port's top level
    /// (scripts read `rx_drops` there), and reads back the same.
    #[test]
    fn port_totals_are_top_level_json() {
        let q = |n| QueueStats {
            tx_frames: n,
            rx_drops: 2 * n,
            ..QueueStats::default()
        };
        let mut p = PortStats {
            name: "a".into(),
            queues: vec![q(1), q(3)],
            ..PortStats::default()
        };
        p.sum_queues();
        assert_eq!((p.totals.tx_frames, p.totals.rx_drops), (4, 8));
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["tx_frames"], 4);
        assert_eq!(v["rx_drops"], 8);
        assert!(v.get("totals").is_none(), "{v}");
        let back: PortStats = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }
}
