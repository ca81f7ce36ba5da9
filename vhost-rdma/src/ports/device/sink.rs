//! Frames a device sends (`DeviceIo::tx` of one model call) into the
//! fabric: one [`Batch`] per call, as a virtio-net TX pass does, with the
//! same back-pressure. The time is read once per call, receivers are woken
//! once per batch, and a receiver that is full but alive pauses the
//! device's TX: the sink answers [`SinkState::Full`], the model then leaves
//! its TX descriptors in their rings (`DeviceIo::tx_paused`, honoured by
//! gve) until the pump resumes it, when the receiver has drained to half
//! (its waiter list writes the port's `tx_resume`) or after
//! [`STALL_MS`](crate::fabric::STALL_MS) (the port's `tx_timer`).

use crate::fabric::{Batch, Fabric, Frame, Ingress, PortShared};
use crate::stats::QueueCounters;
use crate::virtio_net::NetHdr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vfio_user_server::{FrameSink, SinkState};

/// The sink of a device port's vfio-user server.
pub(super) struct DeviceSink {
    pub(super) fabric: Arc<Fabric>,
    pub(super) port: Arc<PortShared>,
}

impl DeviceSink {
    /// Arms the stall timer: a receiver that stops reading must not keep
    /// the device paused (after it, it counts as stalled and senders drop
    /// instead of waiting).
    fn arm_stall_timer(&self) {
        if let Some(t) = self.port.tx_timers().first() {
            let mut t = t.lock().unwrap_or_else(|e| e.into_inner());
            let _ = t.reset(Duration::from_millis(crate::fabric::STALL_MS), None);
        }
    }
}

impl FrameSink for DeviceSink {
    fn send(&mut self, frames: Vec<Vec<u8>>) -> SinkState {
        let (fabric, port) = (&*self.fabric, &*self.port);
        let Some(rxq) = port.rx_queues().first() else {
            return SinkState::Ready;
        };
        let bytes: usize = frames.iter().map(Vec::len).sum();
        QueueCounters::add(&rxq.counters.tx_frames, frames.len() as u64);
        QueueCounters::add(&rxq.counters.tx_bytes, bytes as u64);
        // One time read per call; receivers woken once, when it ends.
        let mut batch = Batch::new(Instant::now());
        let mut full = false;
        for data in frames {
            let f = Frame::new(NetHdr::default(), data);
            let f = if full {
                Some(f)
            } else {
                match fabric.ingress(port.index(), f, &mut batch) {
                    Ingress::Forwarded(_) => None,
                    Ingress::Congested(q, f) => {
                        // Register first, then look again: a drain between
                        // the two cannot be missed.
                        if let Some(r) = port.tx_resume().first() {
                            q.add_waiter(r);
                        }
                        if batch.congested(q) {
                            full = true;
                            port.count_tx_pause();
                            self.arm_stall_timer();
                            tracing::trace!(port = %port.cfg().name, "device tx paused");
                        }
                        Some(f)
                    }
                }
            };
            if let Some(f) = f {
                // The model took this frame (and the rest of the call's)
                // from its ring already: it cannot go back. Forwarded in
                // the batch, behind what it staged; a receiver past its
                // drop bound drops and counts it.
                fabric.forward_in(port.index(), f, &mut batch);
            }
        }
        drop(batch);
        if full {
            SinkState::Full
        } else {
            SinkState::Ready
        }
    }
}
