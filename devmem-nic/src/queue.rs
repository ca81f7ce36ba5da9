//! A receive queue: header and payload buffer pools, the header/data split
//! policy, and per-queue counters.

use std::ops::Range;

use crate::error::NicError;
use crate::pool::{BufferId, BufferPool};
use wire::parse::ParsedFrame;

/// Header/data split settings (`ethtool -G tcp-data-split on hds-thresh N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HdsConfig {
    /// Split enabled (`tcp-data-split on`).
    pub enabled: bool,
    /// Split only when the L4 payload is longer than this many bytes. 0 splits
    /// every frame that has at least one payload byte (the devmem rule).
    pub thresh: usize,
}

/// Static configuration of one receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Size of each header buffer.
    pub header_buf_size: usize,
    /// Size of each payload buffer.
    pub payload_buf_size: usize,
    /// Header/data split.
    pub hds: HdsConfig,
    /// Most payload buffers one frame may use; more is a "too big" drop.
    pub max_payload_buffers: usize,
    /// Largest frame accepted; longer is a "too big" drop.
    pub max_frame_len: usize,
}

impl Default for QueueConfig {
    /// 256-byte header buffers, 4096-byte payload buffers, split on with
    /// threshold 0, up to 64 payload buffers and 65 550-byte frames (a full
    /// 64 KiB IP datagram plus Ethernet and one VLAN tag).
    fn default() -> Self {
        QueueConfig {
            header_buf_size: 256,
            payload_buf_size: 4096,
            hds: HdsConfig {
                enabled: true,
                thresh: 0,
            },
            max_payload_buffers: 64,
            max_frame_len: 65_535 + 18,
        }
    }
}

/// A run of frame bytes written at offset 0 of one buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// The buffer written.
    pub buffer: BufferId,
    /// The frame bytes it receives (its length is the buffer's used length).
    pub frame_range: Range<usize>,
}

/// Where a frame's bytes go. Segments in order cover the whole frame exactly
/// once: `header` (if any) first, then `payload`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The queue the frame was placed on.
    pub queue: u16,
    /// The header buffer, if one was used.
    pub header: Option<Segment>,
    /// Payload buffers, in order.
    pub payload: Vec<Segment>,
    /// `Some(offset)` if the frame was split there (header = `..offset`).
    pub split_at: Option<usize>,
}

impl Placement {
    /// All segments in frame order.
    pub fn segments(&self) -> impl Iterator<Item = &Segment> {
        self.header.iter().chain(self.payload.iter())
    }

    /// Every buffer id used.
    pub fn buffers(&self) -> impl Iterator<Item = BufferId> + '_ {
        self.segments().map(|s| s.buffer)
    }
}

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// A flow rule with action `Drop` matched.
    Rule {
        /// The rule's id.
        id: u32,
    },
    /// The queue had no free header buffer.
    NoHeaderBuffer,
    /// The queue had too few free payload buffers.
    NoPayloadBuffer,
    /// The frame (or its headers) cannot fit the queue's buffers or limits.
    TooBig,
}

/// Per-queue counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Frames placed.
    pub frames: u64,
    /// Bytes placed.
    pub bytes: u64,
    /// Frames placed with a header/data split.
    pub split_frames: u64,
    /// Drops: no header buffer.
    pub drop_no_header_buffer: u64,
    /// Drops: not enough payload buffers.
    pub drop_no_payload_buffer: u64,
    /// Drops: too big.
    pub drop_too_big: u64,
}

/// One receive queue.
#[derive(Debug, Clone)]
pub struct RxQueue {
    index: u16,
    config: QueueConfig,
    /// Header buffers.
    pub header_pool: BufferPool,
    /// Payload buffers.
    pub payload_pool: BufferPool,
    counters: QueueCounters,
}

impl RxQueue {
    /// A queue with empty pools.
    pub fn new(index: u16, config: QueueConfig) -> Result<Self, NicError> {
        Ok(RxQueue {
            index,
            config,
            header_pool: BufferPool::new(config.header_buf_size)?,
            payload_pool: BufferPool::new(config.payload_buf_size)?,
            counters: QueueCounters::default(),
        })
    }

    /// The queue's configuration.
    pub fn config(&self) -> &QueueConfig {
        &self.config
    }

    /// Changes the header/data split settings (buffers stay as they are).
    pub fn set_hds(&mut self, hds: HdsConfig) {
        self.config.hds = hds;
    }

    /// The queue's counters.
    pub fn counters(&self) -> &QueueCounters {
        &self.counters
    }

    /// Decides where a frame goes and takes the buffers, or returns why it
    /// cannot be placed (counted). Nothing is taken on failure.
    ///
    /// Policy:
    /// * split off: the whole frame goes into payload buffers;
    /// * split on and the frame is IP with an L4 payload longer than
    ///   `hds.thresh`: bytes before [`ParsedFrame::split_point`] (end of the
    ///   TCP/UDP header, else of the IP headers) go into one header buffer,
    ///   the rest, Ethernet padding included, into payload buffers;
    /// * split on but not split (non-IP, or payload not above the threshold):
    ///   the whole frame goes into one header buffer if it fits, else into
    ///   payload buffers.
    ///
    /// The payload length compared with the threshold comes from the IP
    /// length fields, so Ethernet padding never causes a split.
    pub fn place(&mut self, frame: &[u8], parsed: &ParsedFrame) -> Result<Placement, DropReason> {
        let r = self.plan(frame, parsed);
        match &r {
            Ok(p) => {
                self.counters.frames += 1;
                self.counters.bytes += frame.len() as u64;
                if p.split_at.is_some() {
                    self.counters.split_frames += 1;
                }
            }
            Err(DropReason::NoHeaderBuffer) => self.counters.drop_no_header_buffer += 1,
            Err(DropReason::NoPayloadBuffer) => self.counters.drop_no_payload_buffer += 1,
            Err(DropReason::TooBig) => self.counters.drop_too_big += 1,
            Err(DropReason::Rule { .. }) => {}
        }
        r
    }

    fn plan(&mut self, frame: &[u8], parsed: &ParsedFrame) -> Result<Placement, DropReason> {
        let len = frame.len();
        if len > self.config.max_frame_len {
            return Err(DropReason::TooBig);
        }
        let hds = self.config.hds;
        let split = if hds.enabled {
            parsed
                .split_point()
                .filter(|_| parsed.l4_payload_len().unwrap_or(0) > hds.thresh)
        } else {
            None
        };
        let (header_len, payload_start) = match split {
            Some(at) => {
                if at > self.config.header_buf_size {
                    return Err(DropReason::TooBig);
                }
                (Some(at), at)
            }
            None if hds.enabled && len <= self.config.header_buf_size => (Some(len), len),
            None => (None, 0),
        };
        let payload_len = len - payload_start;
        let pbs = self.config.payload_buf_size;
        // Without a header buffer even an empty frame occupies one buffer.
        let n_payload = if header_len.is_none() {
            payload_len.div_ceil(pbs).max(1)
        } else {
            payload_len.div_ceil(pbs)
        };
        if n_payload > self.config.max_payload_buffers {
            return Err(DropReason::TooBig);
        }
        if header_len.is_some() && self.header_pool.available() == 0 {
            return Err(DropReason::NoHeaderBuffer);
        }
        if self.payload_pool.available() < n_payload {
            return Err(DropReason::NoPayloadBuffer);
        }
        let header = header_len.and_then(|hl| {
            let id = self.header_pool.take(1)?[0];
            Some(Segment {
                buffer: id,
                frame_range: 0..hl,
            })
        });
        let ids = self.payload_pool.take(n_payload).unwrap_or_default();
        let payload = ids
            .into_iter()
            .enumerate()
            .map(|(i, id)| {
                let start = payload_start + i * pbs;
                Segment {
                    buffer: id,
                    frame_range: start..(start + pbs).min(len),
                }
            })
            .collect();
        Ok(Placement {
            queue: self.index,
            header,
            payload,
            split_at: split,
        })
    }
}
