//! The NIC stats report (`REPORT_STATS`, `struct gve_stats_report` in
//! `gve_adminq.h`).
//!
//! At probe the driver hands the device a zeroed region:
//! `written_count` (BE64) then `stats[]` of 16-byte entries
//! (`stat_name` BE32, `queue_id` BE32, `value` BE64), room for
//! `(GVE_TX_STATS_REPORT_NUM + NIC_TX_STATS_REPORT_NUM) * max_tx +
//! (GVE_RX_STATS_REPORT_NUM + NIC_RX_STATS_REPORT_NUM) * max_rx` entries.
//! The driver writes its own entries from the start (when its
//! `report-stats` private flag is on); the NIC writes its entries at the
//! *end*: `NIC_RX_STATS_REPORT_NUM` (4) per running RX queue, in the order
//! `RX_QUEUE_DROP_CNT`, `RX_NO_BUFFERS_POSTED`, `RX_DROPS_PACKET_OVER_MRU`,
//! `RX_DROPS_INVALID_CHECKSUM` (`NIC_TX_STATS_REPORT_NUM` is 0). That is
//! where `gve_get_ethtool_stats` looks for them (`rx_base_stats_idx` =
//! entries - 4 x running RX queues), keyed by the `queue_id` of each group's
//! first entry; a zero `stat_name` there means "no NIC stats yet".
//!
//! The device refreshes its entries at the interval the driver gave
//! (20 s), at most [`MAX_REFRESH`] apart, and only when a value changed
//! (an idle device asks for no timer).

use std::time::{Duration, Instant};

use pci_model::{DeviceIo, TraceKind};

use crate::counters::inc;
use crate::GveDevice;

/// `RX_QUEUE_DROP_CNT`.
pub const RX_QUEUE_DROP_CNT: u32 = 65;
/// `RX_NO_BUFFERS_POSTED`.
pub const RX_NO_BUFFERS_POSTED: u32 = 66;
/// `RX_DROPS_PACKET_OVER_MRU`.
pub const RX_DROPS_PACKET_OVER_MRU: u32 = 67;
/// `RX_DROPS_INVALID_CHECKSUM`.
pub const RX_DROPS_INVALID_CHECKSUM: u32 = 68;
/// `NIC_RX_STATS_REPORT_NUM`.
pub const NIC_RX_STATS_REPORT_NUM: usize = 4;
/// Size of one `struct stats`.
pub const STAT_LEN: u64 = 16;
/// Size of the `written_count` header.
pub const HEADER_LEN: u64 = 8;
/// Longest time between two refreshes of changed values, whatever
/// interval the driver asked for (so that `ethtool -S` is fresh).
pub const MAX_REFRESH: Duration = Duration::from_secs(1);

/// The region the driver attached with REPORT_STATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsReport {
    /// Guest address of `struct gve_stats_report`.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Refresh interval.
    pub interval: Duration,
    /// When the device last wrote its entries.
    pub written_at: Option<Instant>,
    /// What it wrote: per running RX queue (id, the four values).
    pub written: Vec<(u32, [u64; NIC_RX_STATS_REPORT_NUM])>,
}

impl StatsReport {
    /// A region from REPORT_STATS (`interval` in milliseconds; 0: the
    /// refresh bound).
    pub fn new(addr: u64, len: u64, interval_ms: u64) -> Self {
        let interval = match Duration::from_millis(interval_ms) {
            d if d.is_zero() || d > MAX_REFRESH => MAX_REFRESH,
            d => d,
        };
        StatsReport {
            addr,
            len,
            interval,
            written_at: None,
            written: Vec::new(),
        }
    }
}

impl GveDevice {
    /// The NIC's entries now: per created RX queue, ascending.
    fn nic_stats(&self) -> impl Iterator<Item = (u32, [u64; NIC_RX_STATS_REPORT_NUM])> + '_ {
        self.rx.iter().flatten().map(|q| {
            let c = self
                .counters
                .rx_queues
                .get(q.id as usize)
                .copied()
                .unwrap_or_default();
            (q.id, [c.drops, c.no_buffers, c.oversize, c.csum_errors])
        })
    }

    /// When the NIC entries are to be written next (changed values only;
    /// never written: at once, `now`).
    pub(crate) fn nic_stats_due(&self, now: Instant) -> Option<Instant> {
        let r = self.stats_report.as_ref()?;
        let n = self.rx.iter().flatten().count();
        if n == r.written.len() && self.nic_stats().zip(&r.written).all(|(a, b)| a == *b) {
            return None;
        }
        match r.written_at {
            Some(t) => t.checked_add(r.interval),
            None => Some(now),
        }
    }

    /// Writes the NIC entries at the end of the driver's region when due.
    pub(crate) fn write_nic_stats(&mut self, io: &mut DeviceIo<'_>) {
        if self.nic_stats_due(io.now).is_none_or(|t| t > io.now) {
            return;
        }
        let stats: Vec<_> = self.nic_stats().collect();
        let Some(r) = self.stats_report.as_mut() else {
            return;
        };
        r.written_at = Some(io.now);
        r.written = stats.clone();
        let entries = r.len.saturating_sub(HEADER_LEN) / STAT_LEN;
        let n = (stats.len() * NIC_RX_STATS_REPORT_NUM) as u64;
        if n == 0 || n > entries {
            return;
        }
        let mut b = Vec::with_capacity((n * STAT_LEN) as usize);
        for (q, v) in &stats {
            let names = [
                RX_QUEUE_DROP_CNT,
                RX_NO_BUFFERS_POSTED,
                RX_DROPS_PACKET_OVER_MRU,
                RX_DROPS_INVALID_CHECKSUM,
            ];
            for (name, value) in names.iter().zip(v) {
                b.extend_from_slice(&name.to_be_bytes());
                b.extend_from_slice(&q.to_be_bytes());
                b.extend_from_slice(&value.to_be_bytes());
            }
        }
        let at = r.addr.checked_add(HEADER_LEN + (entries - n) * STAT_LEN);
        match at.map(|a| io.dma.write(a, &b)) {
            Some(Ok(())) => {
                inc(&mut self.counters.nic_stats_written);
                io.trace(TraceKind::Event, || {
                    format!(
                        "NIC stats report: {} RX queues at entry {}",
                        stats.len(),
                        entries - n
                    )
                });
            }
            _ => inc(&mut self.counters.dma_errors),
        }
    }
}
