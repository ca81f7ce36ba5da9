//! Responder side of RC: incoming RDMA WRITE / READ / atomics and SEND with
//! invalidate aimed at guest MRs.
//!
//! The engine checks rkeys against its own `roce_model::Memory`, which cannot
//! hold driver-chosen keys nor reach guest memory. So before a request goes
//! to the engine, the device validates the guest stag itself (PD, rights,
//! bounds, through the MTT) and rewrites the key in the parsed packet to a
//! stand-in region registered at the same iova:
//!
//! * WRITE: a sink that discards writes; after the engine accepts a packet
//!   (its expected PSN advanced) the device copies that packet's payload
//!   into the guest MR at the running address.
//! * READ: a snapshot of the guest bytes taken when the request arrives,
//!   kept in a small per-QP ring so that duplicate READs replay the same
//!   bytes.
//! * Atomics: an 8-byte snapshot; the result is copied back after the engine
//!   executes it (atomic with respect to the fabric, not to guest CPUs).
//! * SEND with invalidate: a dummy region whose invalidation the device maps
//!   back to the guest MR.
//!
//! A guest key that fails validation is rewritten to 0 (never a valid
//! engine key) so the engine answers with a remote access NAK.

use pci_model::DeviceIo;
use roce_model::{MemError, MemoryAccess, OpKind, Psn, RocePacket};

use crate::device::ErdmaDevice;
use crate::mr::acc;
use crate::qp::{ReadStage, RxWrite};

/// Most READ snapshots kept per QP (replays of older READs get a NAK).
pub const READ_RING: usize = 16;
/// Largest incoming READ served (bytes).
pub const MAX_READ_STAGE: u32 = 16 << 20;

/// A region that accepts and discards writes.
struct Sink(usize);

impl MemoryAccess for Sink {
    fn size(&self) -> usize {
        self.0
    }
    fn read_at(&self, _offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        dst.fill(0);
        Ok(())
    }
    fn write_at(&mut self, _offset: usize, _src: &[u8]) -> Result<(), MemError> {
        Ok(())
    }
}

/// A region holding a snapshot.
struct Snap(Vec<u8>);

impl MemoryAccess for Snap {
    fn size(&self) -> usize {
        self.0.len()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemError> {
        let s = self
            .0
            .get(offset..offset + dst.len())
            .ok_or(MemError::Backing("out of range"))?;
        dst.copy_from_slice(s);
        Ok(())
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), MemError> {
        self.0
            .get_mut(offset..offset + src.len())
            .ok_or(MemError::Backing("out of range"))?
            .copy_from_slice(src);
        Ok(())
    }
}

/// What to do after the engine handled a rewritten request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fixup {
    /// Nothing.
    None,
    /// Copy the payload into the WRITE in progress if accepted.
    Write,
    /// Copy 8 bytes back from the atomic snapshot, then drop it.
    Atomic {
        stage_key: u32,
        guest_stag: u32,
        va: u64,
    },
    /// A dummy key stands for a guest key to invalidate.
    Invalidate { dummy: u32, guest: u32 },
}

impl ErdmaDevice {
    /// Rewrites the keys of an incoming request; returns the follow-up.
    pub(crate) fn rewrite_request(
        &mut self,
        qpn: u32,
        pkt: &mut RocePacket<'_>,
        io: &mut DeviceIo<'_>,
    ) -> Fixup {
        let info = pkt.info();
        if !info.is_request() {
            return Fixup::None;
        }
        let Some(qp) = self.qps.get(&qpn) else {
            return Fixup::None;
        };
        let (pd, epd) = (qp.pd, qp.engine_pd);
        let Some(epd) = epd else {
            return Fixup::None;
        };
        let expected = qp.engine.as_ref().map(|e| e.expected_psn());
        let duplicate = expected.is_some_and(|e| Psn::new(pkt.bth.psn).is_before(e));
        // A request past the expected PSN (one before it was lost) is
        // dropped by the engine with a sequence NAK: it must not touch the
        // stand-ins, or the WRITE in progress loses its region and its
        // retransmitted packets meet a remote access error.
        if expected.is_some_and(|e| Psn::new(pkt.bth.psn).is_after(e)) {
            return Fixup::None;
        }
        match info.kind {
            OpKind::Write => {
                if !info.position.starts() || duplicate {
                    return Fixup::Write;
                }
                let Some(mut reth) = pkt.ext.reth else {
                    return Fixup::None;
                };
                self.drop_rx_write(qpn);
                if reth.len == 0 {
                    return Fixup::Write;
                }
                let ok = self
                    .mrs
                    .lookup(reth.rkey, Some(pd), acc::RW)
                    .is_ok_and(|mr| mr.check(reth.va, u64::from(reth.len)).is_ok());
                let key = if ok {
                    self.shadow
                        .register(
                            epd,
                            reth.va,
                            Sink(reth.len as usize),
                            roce_model::Access::REMOTE_WRITE,
                        )
                        .ok()
                        .map(|k| k.rkey)
                } else {
                    None
                };
                if let (Some(k), Some(qp)) = (key, self.qps.get_mut(&qpn)) {
                    qp.rx_write = Some(RxWrite {
                        stage_key: k,
                        guest_stag: reth.rkey,
                        next_va: reth.va,
                    });
                }
                reth.rkey = key.unwrap_or(0);
                pkt.ext.reth = Some(reth);
                Fixup::Write
            }
            OpKind::ReadRequest => {
                let Some(mut reth) = pkt.ext.reth else {
                    return Fixup::None;
                };
                if reth.len == 0 {
                    return Fixup::None;
                }
                let guest = reth.rkey;
                let psn = Psn::new(pkt.bth.psn);
                // A duplicate is matched by PSN, as the engine matches its
                // resource: the same buffer is often read again and again,
                // so its address says nothing about which READ this retries.
                let key = if duplicate {
                    self.qps.get(&qpn).and_then(|q| {
                        q.read_stages
                            .iter()
                            .rev()
                            .find(|s| {
                                s.guest_stag == guest
                                    && !psn.is_before(Psn::new(s.first_psn))
                                    && !psn.is_after(Psn::new(s.last_psn))
                            })
                            .map(|s| s.stage_key)
                    })
                } else {
                    let pmtu = self.engine_mtu().bytes().max(1);
                    let last = psn.add(reth.len.div_ceil(pmtu).max(1) - 1);
                    self.snapshot_read(qpn, pd, epd, guest, reth.va, reth.len, (psn, last), io)
                };
                reth.rkey = key.unwrap_or(0);
                pkt.ext.reth = Some(reth);
                Fixup::None
            }
            OpKind::Atomic => {
                let Some(mut a) = pkt.ext.atomic_eth else {
                    return Fixup::None;
                };
                let guest = a.rkey;
                let mut snap = [0u8; 8];
                let ok = a.va & 7 == 0
                    && self
                        .mrs
                        .lookup(guest, Some(pd), acc::RA)
                        .is_ok_and(|mr| mr.read(io.dma, a.va, &mut snap).is_ok());
                let key = if ok {
                    self.shadow
                        .register(
                            epd,
                            a.va,
                            Snap(snap.to_vec()),
                            roce_model::Access::REMOTE_ATOMIC,
                        )
                        .ok()
                        .map(|k| k.rkey)
                } else {
                    None
                };
                a.rkey = key.unwrap_or(0);
                pkt.ext.atomic_eth = Some(a);
                match key {
                    Some(stage_key) => Fixup::Atomic {
                        stage_key,
                        guest_stag: guest,
                        va: a.va,
                    },
                    None => Fixup::None,
                }
            }
            OpKind::Send => {
                let Some(mut ieth) = pkt.ext.ieth else {
                    return Fixup::None;
                };
                let guest = ieth.rkey;
                let valid = self
                    .mrs
                    .get(guest >> 8)
                    .is_some_and(|m| m.key == (guest & 0xff) as u8 && m.pd == pd);
                let dummy = if valid {
                    self.shadow
                        .register(epd, 0, Sink(0), roce_model::Access::NONE)
                        .ok()
                        .map(|k| k.rkey)
                } else {
                    None
                };
                ieth.rkey = dummy.unwrap_or(0);
                pkt.ext.ieth = Some(ieth);
                match dummy {
                    Some(d) => Fixup::Invalidate { dummy: d, guest },
                    None => Fixup::None,
                }
            }
            _ => Fixup::None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn snapshot_read(
        &mut self,
        qpn: u32,
        pd: u32,
        epd: roce_model::ProtectionDomain,
        guest: u32,
        va: u64,
        len: u32,
        (first, last): (Psn, Psn),
        io: &mut DeviceIo<'_>,
    ) -> Option<u32> {
        if len > MAX_READ_STAGE {
            return None;
        }
        let mr = self.mrs.lookup(guest, Some(pd), acc::RR).ok()?;
        let mut data = vec![0u8; len as usize];
        if let Err(e) = mr.read(io.dma, va, &mut data) {
            if matches!(e, crate::mr::XlateError::Dma(_)) {
                self.counters.dma_errors += 1;
            }
            return None;
        }
        let k = self
            .shadow
            .register(epd, va, Snap(data), roce_model::Access::REMOTE_READ)
            .ok()?
            .rkey;
        let qp = self.qps.get_mut(&qpn)?;
        qp.read_stages.push_back(ReadStage {
            guest_stag: guest,
            va,
            len,
            stage_key: k,
            first_psn: first.value(),
            last_psn: last.value(),
        });
        let mut evicted = Vec::new();
        while qp.read_stages.len() > READ_RING {
            if let Some(old) = qp.read_stages.pop_front() {
                evicted.push(old.stage_key);
            }
        }
        for e in evicted {
            let _ = self.shadow.deregister(e);
        }
        Some(k)
    }

    fn drop_rx_write(&mut self, qpn: u32) {
        if let Some(w) = self.qps.get_mut(&qpn).and_then(|q| q.rx_write.take()) {
            let _ = self.shadow.deregister(w.stage_key);
        }
    }

    /// After the engine handled the request: place data, copy results.
    pub(crate) fn finish_request(
        &mut self,
        qpn: u32,
        pkt: &RocePacket<'_>,
        fixup: Fixup,
        accepted: bool,
        io: &mut DeviceIo<'_>,
    ) {
        let pd = match self.qps.get(&qpn) {
            Some(q) => q.pd,
            None => return,
        };
        match fixup {
            Fixup::None => {}
            Fixup::Write => {
                let Some(w) = self.qps.get(&qpn).and_then(|q| q.rx_write) else {
                    return;
                };
                if accepted && !pkt.payload.is_empty() {
                    let r = self
                        .mrs
                        .lookup(w.guest_stag, Some(pd), acc::RW)
                        .map_err(|_| ())
                        .and_then(|mr| mr.write(io.dma, w.next_va, pkt.payload).map_err(|_| ()));
                    if r.is_err() {
                        self.counters.dma_errors += 1;
                    }
                    if let Some(q) = self.qps.get_mut(&qpn) {
                        if let Some(rw) = q.rx_write.as_mut() {
                            rw.next_va = rw.next_va.wrapping_add(pkt.payload.len() as u64);
                        }
                    }
                }
                if accepted && pkt.info().position.ends() {
                    self.drop_rx_write(qpn);
                }
            }
            Fixup::Atomic {
                stage_key,
                guest_stag,
                va,
            } => {
                if accepted {
                    if let Ok(v) = self.shadow.read(stage_key, va, 8) {
                        let r = self
                            .mrs
                            .lookup(guest_stag, Some(pd), acc::RA)
                            .map_err(|_| ())
                            .and_then(|mr| mr.write(io.dma, va, &v).map_err(|_| ()));
                        if r.is_err() {
                            self.counters.dma_errors += 1;
                        }
                    }
                }
                let _ = self.shadow.deregister(stage_key);
            }
            Fixup::Invalidate { dummy, guest } => {
                let _ = self.shadow.deregister(dummy);
                if accepted {
                    if let Some(q) = self.qps.get_mut(&qpn) {
                        // Bounded: only the latest few are ever pending.
                        if q.pending_inv.len() >= 16 {
                            q.pending_inv.remove(0);
                        }
                        q.pending_inv.push((dummy, guest));
                    }
                }
            }
        }
    }
}
