//! The fabric: an L2 learning switch between ports, with a bounded receive
//! queue per destination queue pair.
//!
//! This module is the switch, [`Fabric`]: the MAC learning table (keyed by
//! `mac_table`'s hash, bounded by `[limits] mac-table`), routing (known
//! unicast to one port and the queue pair its steering picks, else flood;
//! RoCEv2 to a port's RDMA function; an RDMA function's frames to MAC zero
//! by destination IPv4 from the neighbour table), back-pressure, the stages
//! at its ingress and egress points (capture, checker, faults: `stages`)
//! and delivery. The rest, by concern:
//!
//! - `rx_queue`: [`RxQueue`], the frames waiting for one queue pair's RX
//!   buffers, its two bounds, its wake-up of the port's worker, the senders
//!   paused on it and its stuck-guest watch;
//! - `batch`: [`Batch`], what a sender hands the fabric frames in (the
//!   time its port read, frames staged per receive queue, the wake-ups it
//!   owes), [`Adapted`] and [`Ingress`];
//! - `port`: [`PortShared`], a port's state shared by the fabric and the
//!   port's own threads, and [`PortProfile`], what its kind tells the switch;
//! - `offloads`: [`RxOffloads`], the offloads a receiver takes as they
//!   are, and the finishing of the others (TSO segmentation, checksum) on
//!   delivery;
//! - `fault_timer`: the thread that releases frames fault rules held.
//!
//! What the switch knows of a port is its configuration, its profile and
//! its receiver's [`RxOffloads`]: no port kind and no virtio ring or
//! feature bit (a virtio-net port derives its `RxOffloads` from its guest's
//! features, `ports::virtio_net::offloads`). Frames do carry the virtio-net
//! header (`Frame::hdr`), the fabric's form of a frame's offloads.
//!
//! Threads: the switch runs on its senders' threads (each port's TX
//! workers, device pumps, uplink and virtual host threads), which hand it
//! frames in a [`Batch`] carrying the time they read: the switch and its
//! stages read no clock. Its only system calls there are the wake-ups it
//! owes the receiving workers (an eventfd write). It starts one thread of
//! its own, the fault timer ([`Fabric::start_fault_timer`], which the
//! server calls at start and ends with [`Fabric::stop_fault_timer`]): it
//! reads the clock and switches the frames fault rules delayed or
//! reordered at that time, as one more sender.

mod batch;
mod fault_timer;
mod mac_table;
mod offloads;
mod port;
mod rx_queue;
#[cfg(test)]
mod testing;

pub use crate::frame::{flow_hash, Frame, FrameView, LazyView};
pub use crate::stats::StuckGuest;
pub use batch::{Adapted, Batch, Ingress, STAGE_FRAMES};
pub use mac_table::{MacHashKey, MacHasher};
pub use offloads::RxOffloads;
pub use port::{PortProfile, PortShared};
pub use rx_queue::{RxQueue, STALL_MS};

use crate::frame::Dir;
use crate::stages::{Passed, Stage};
use crate::stats::QueueCounters;
use mac_table::MacTable;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Arc, RwLock};
use std::time::Instant;

/// Where a frame goes, looked up once per frame.
enum Route {
    /// To one port, to the queue pair steering chose.
    Unicast(usize, crate::steering::Steer),
    /// To every other port.
    Flood,
    /// Back to its own port: nowhere.
    Nowhere,
}

/// A request named a port the daemon does not have.
#[derive(Debug, thiserror::Error)]
#[error("no port named {0:?}")]
pub struct NoSuchPort(pub String);

/// The L2 switch.
#[derive(Debug)]
pub struct Fabric {
    pub ports: Vec<Arc<PortShared>>,
    macs: RwLock<MacTable>,
    /// Bumped on every change of `macs` (see `learn_from`).
    macs_gen: AtomicU64,
    /// Source MACs not learned because the table was full.
    pub mac_table_full: AtomicU64,
    /// IPv4 neighbours from ARP: where an erdma function's frames to MAC
    /// zero go (`neighbors`).
    pub neighbors: crate::neighbors::NeighborTable,
    /// erdma frames to MAC zero whose destination IPv4 no ARP announced
    /// (dropped).
    pub rdma_unresolved: AtomicU64,
    /// Control connections refused at `limits.control_connections`.
    pub control_refused: AtomicU64,
    /// Flow rules refused at `limits.flow_rules`.
    pub flow_rules_refused: AtomicU64,
    /// Table bounds (`[limits]`).
    pub limits: crate::config::Limits,
    /// Fault injection rules and link states (`faults`).
    pub faults: crate::faults::Faults,
    /// pcapng capture point (`capture`).
    pub capture: crate::capture::Capture,
    /// Live protocol checker (`checker`), fed at ingress before faults.
    pub checker: crate::checker::FabricChecker,
    /// Whether a batch wakes a receiver at its first frame for it as well
    /// as when it ends: worth it only when the receiver's worker can run
    /// beside the sender. Confined to one CPU (`--cpu-affinity 3`, a 1-CPU
    /// host), the early wake would only preempt the sender and cost a
    /// second wake-up per batch (`set_early_wake`).
    early_wake: AtomicBool,
}

impl Fabric {
    /// A fabric over the given ports, with default [`Limits`](crate::config::Limits).
    pub fn new(ports: Vec<Arc<PortShared>>) -> Self {
        Self::with_limits(ports, crate::config::Limits::default())
    }

    /// Sets whether receivers are woken at a batch's first frame for them
    /// as well as at its end (on by default; the server turns it off when
    /// the process may use one CPU only).
    pub fn set_early_wake(&self, on: bool) {
        self.early_wake.store(on, Relaxed);
    }

    /// A fabric over the given ports with the given table bounds.
    pub fn with_limits(ports: Vec<Arc<PortShared>>, limits: crate::config::Limits) -> Self {
        let faults =
            crate::faults::Faults::new(ports.iter().map(|p| p.cfg().name.clone()).collect());
        faults.set_max_rules(limits.fault_rules);
        let capture = crate::capture::Capture::default();
        capture.set_max_bytes(limits.capture_max_bytes);
        // Threads that may pass a queue's room check just before another
        // fills it: every TX worker and virtual host, and the fault timer.
        // Each may hold, unseen by the others, the frames its batch staged
        // for the queue: fewer than `STAGE_FRAMES` and the one it checks,
        // and, for one that honours back-pressure, no more than the limit
        // (its check counts them).
        let senders: usize = ports
            .iter()
            .map(|p| usize::from(p.cfg().queue_pairs.max(1)))
            .sum::<usize>()
            + 1;
        for q in ports.iter().flat_map(|p| p.rx_queues().iter()) {
            q.set_headroom(senders.saturating_mul(STAGE_FRAMES.min(q.limit())));
            q.set_stuck_ms(limits.stuck_guest_ms);
        }
        // An RDMA function and its guest's virtio-net port share a MAC.
        for r in &ports {
            let Some(nd) = r.profile().rdma_function_of.as_deref() else {
                continue;
            };
            if let Some(n) = ports.iter().find(|p| p.cfg().name == nd) {
                let _ = n.rdma_companion.set(r.index());
            }
        }
        Fabric {
            faults,
            capture,
            checker: crate::checker::FabricChecker::default(),
            ports,
            macs: RwLock::new(MacTable::default()),
            macs_gen: AtomicU64::new(0),
            mac_table_full: AtomicU64::new(0),
            neighbors: crate::neighbors::NeighborTable::new(limits.mac_table),
            rdma_unresolved: AtomicU64::new(0),
            control_refused: AtomicU64::new(0),
            flow_rules_refused: AtomicU64::new(0),
            early_wake: AtomicBool::new(true),
            limits,
        }
    }

    /// The port named `name`.
    pub fn port_by_name(&self, name: &str) -> Result<&PortShared, NoSuchPort> {
        self.ports
            .iter()
            .find(|p| p.cfg().name == name)
            .map(|p| &**p)
            .ok_or_else(|| NoSuchPort(name.to_string()))
    }

    /// Forgets what was learned on a port (its guest went away).
    pub fn forget_port(&self, port: usize) {
        if let Ok(mut m) = self.macs.write() {
            m.retain(|_, p| *p != port);
            self.macs_gen.fetch_add(1, Release);
        }
    }

    /// Learns `src` on `port`; false when the table is full.
    fn learn(&self, src: [u8; 6], port: usize) -> bool {
        if src[0] & 1 != 0 {
            return false;
        }
        if let Ok(m) = self.macs.read() {
            if m.get(&src) == Some(&port) {
                return true;
            }
        }
        if let Ok(mut m) = self.macs.write() {
            if m.len() >= self.limits.mac_table && !m.contains_key(&src) {
                self.mac_table_full.fetch_add(1, Relaxed);
                if let Some(p) = self.ports.get(port) {
                    crate::guest_warn!(p.log(), port = %p.cfg().name,
                        "MAC table full ([limits] mac-table = {}): {} not learned, its frames flood",
                        self.limits.mac_table, crate::config::MacAddr(src));
                }
                return false;
            }
            m.insert(src, port);
            self.macs_gen.fetch_add(1, Release);
        }
        true
    }

    /// The receive queue of port `p` a frame steered by `s` would wait for,
    /// if it is congested (back-pressure) for a sender with batch `b`
    /// (counting the frames `b` has staged for it) at the batch's time.
    fn congested(&self, p: usize, s: &crate::steering::Steer, b: &Batch<'_>) -> Option<&RxQueue> {
        let q = self.ports.get(p)?.rx_queues().get(s.queue?)?;
        b.congested(q).then_some(q)
    }

    /// Where a frame from `src` goes now (MAC table, an erdma function's
    /// RoCEv2, steering): looked up once and used by both the congestion
    /// check and delivery.
    fn route(&self, src: usize, data: &[u8], v: &LazyView) -> Route {
        let Some(dst) = data.get(0..6) else {
            return Route::Nowhere;
        };
        if dst[0] & 1 != 0 {
            return Route::Flood;
        }
        let mut d = [0u8; 6];
        d.copy_from_slice(dst);
        let known = self.macs.read().ok().and_then(|m| m.get(&d).copied());
        match known.map(|p| self.rdma_target(p, data, v)) {
            None => Route::Flood,
            Some(p) if p == src => Route::Nowhere,
            Some(p) => match self.ports.get(p) {
                Some(port) if port.is_connected() => Route::Unicast(p, port.steer_lazy(data, v)),
                _ => Route::Nowhere,
            },
        }
    }

    /// Switches a frame a port sent on port `src` at `now`, on its own.
    /// Returns how many copies were queued (receivers are woken before
    /// returning).
    pub fn forward(&self, src: usize, frame: Frame, now: Instant) -> usize {
        self.forward_in(src, frame, &mut Batch::new(now))
    }

    /// Switches a frame a port sent on port `src` as one of `batch` (no
    /// back-pressure: for ports that cannot leave a frame where it was).
    /// Returns how many copies were queued or staged in `batch` (see
    /// [`Batch`]); staged ones are pushed, and receivers woken, at the
    /// latest when the batch ends.
    pub fn forward_in<'a>(&'a self, src: usize, frame: Frame, batch: &mut Batch<'a>) -> usize {
        match self.ingress_inner(src, frame, batch, false) {
            Ingress::Forwarded(n) => n,
            Ingress::Congested(..) => 0,
        }
    }

    /// Switches a frame a guest sent on port `src`, as one of a batch:
    /// receivers are recorded and frames staged in `wakes` (the caller
    /// flushes it once per batch, and before it pauses), and a frame whose
    /// receiver is congested, counting what `wakes` staged for it, comes
    /// back untouched.
    pub fn ingress<'a>(&'a self, src: usize, frame: Frame, wakes: &mut Batch<'a>) -> Ingress<'a> {
        self.ingress_inner(src, frame, wakes, true)
    }

    fn ingress_inner<'a>(
        &'a self,
        src: usize,
        mut frame: Frame,
        wakes: &mut Batch<'a>,
        back_pressure: bool,
    ) -> Ingress<'a> {
        if frame.data.len() < 14 {
            return Ingress::Forwarded(0);
        }
        let Some(sp) = self.ports.get(src) else {
            return Ingress::Forwarded(0);
        };
        // What the fabric switches it parses itself (below, once): a view a
        // sender left on the frame is not taken on trust.
        frame.view = None;
        // delivered by IP when the QP's address vector has no MAC
        if sp.profile().zero_mac_by_ip && !self.neighbors.fill_zero_dmac(&mut frame.data) {
            self.rdma_unresolved.fetch_add(1, Relaxed);
            crate::guest_warn!(sp.log(), port = %sp.cfg().name,
                "RDMA frame to MAC 00:00:00:00:00:00 and an IPv4 address no ARP on the fabric announced: dropped");
            return Ingress::Forwarded(0);
        }
        if sp.profile().learns && !self.faults.active() {
            // (With faults on, `switch` learns from what passes them.) An
            // erdma function does not learn: it sends with its netdev's MAC,
            // the netdev port owns the MAC in the table, RoCEv2 goes to the
            // function.
            self.learn_from(src, &frame.data);
        }
        // Parsed at most once, when routing, steering or faults first ask.
        let v = LazyView::default();
        let route = self.route(src, &frame.data, &v);
        if back_pressure {
            if let Route::Unicast(p, s) = &route {
                if let Some(q) = self.congested(*p, s, wakes) {
                    return Ingress::Congested(q, frame);
                }
            }
        }
        if sp.profile().learns {
            self.neighbors.observe(&frame.data);
        }
        match crate::stages::run(
            &self.ingress_stages(),
            src,
            &sp.cfg().name,
            Dir::Ingress,
            wakes.now(),
            frame,
            &v,
        ) {
            // No stage took it: as routed above.
            Passed::Same(f) => Ingress::Forwarded(self.send(src, f, &v, route, wakes)),
            // Changed, held, dropped or multiplied (faults): routed afresh.
            Passed::Changed(frames) => Ingress::Forwarded(
                frames
                    .into_iter()
                    .map(|(f, fv)| self.switch(src, f, &LazyView::of(fv), wakes))
                    .sum(),
            ),
        }
    }

    /// The stages at ingress, in order: the capture records what the port
    /// sent, the checker judges it, then faults act.
    fn ingress_stages(&self) -> [&dyn Stage; 3] {
        [&self.capture, &self.checker, &self.faults]
    }

    /// The stages at egress, in order: faults act on what the receiver would
    /// get, the capture records what it gets (faults first: `deliver_now`
    /// skips them for a frame they held and released).
    fn egress_stages(&self) -> [&dyn Stage; 2] {
        [&self.faults, &self.capture]
    }

    /// Where a frame for port `p` goes: its erdma function for RoCEv2, else `p`.
    fn rdma_target(&self, p: usize, data: &[u8], v: &LazyView) -> usize {
        match self.ports.get(p).and_then(|x| x.rdma_companion.get()) {
            Some(&r) if crate::frame::is_rocev2_view(v.get(data)) => r,
            _ => p,
        }
    }

    /// Learns a frame's source MAC on `src`. A port sends from one MAC
    /// nearly always: when the table has not changed since this port last
    /// learned this MAC, the table is not even read.
    fn learn_from(&self, src: usize, data: &[u8]) {
        let mut smac = [0u8; 6];
        smac.copy_from_slice(&data[6..12]);
        let Some(p) = self.ports.get(src) else {
            return;
        };
        if smac[0] & 1 != 0 {
            return; // never learned
        }
        // Read before the table is: a change racing with us leaves a stale
        // generation here, and the next frame looks again.
        let gen = self.macs_gen.load(Acquire) & 0xffff;
        let mut m = [0u8; 8];
        m[..6].copy_from_slice(&smac);
        let tag = (u64::from_be_bytes(m) | gen).wrapping_add(1);
        if p.learned.load(Relaxed) == tag {
            return;
        }
        if self.learn(smac, src) {
            p.learned.store(tag, Relaxed);
        }
    }

    /// Switches a frame past ingress faults (a rule may have changed it, or
    /// held it while the table changed: routed afresh).
    fn switch<'a>(
        &'a self,
        src: usize,
        frame: Frame,
        v: &LazyView,
        wakes: &mut Batch<'a>,
    ) -> usize {
        if frame.data.len() < 14 {
            return 0;
        }
        if self.ports.get(src).is_some_and(|p| p.profile().learns) {
            self.learn_from(src, &frame.data);
        }
        let route = self.route(src, &frame.data, v);
        self.send(src, frame, v, route, wakes)
    }

    fn send<'a>(
        &'a self,
        src: usize,
        frame: Frame,
        v: &LazyView,
        route: Route,
        wakes: &mut Batch<'a>,
    ) -> usize {
        match route {
            Route::Nowhere => {
                crate::buffers::give(frame.data);
                0
            }
            Route::Unicast(p, s) => self.deliver(p, frame, v, Some(s), wakes),
            Route::Flood => {
                // Every copy carries the view on (`deliver_now`): parsed
                // here, once, for a frame with several receivers, so that
                // they do not each parse their copy.
                if self.ports.len() > 2 {
                    let _ = v.get(&frame.data);
                }
                // A copy for every other port but the last, which gets the
                // frame; none for a port with no guest, which would only
                // drop it (`deliver_now` checks again, for one that goes
                // meanwhile).
                let mut n = 0;
                let mut last = None;
                for p in (0..self.ports.len()).filter(|&p| p != src && self.ports[p].is_connected())
                {
                    if let Some(prev) = last.replace(p) {
                        n += self.deliver(prev, frame.clone(), v, None, wakes);
                    }
                }
                match last {
                    Some(p) => n + self.deliver(p, frame, v, None, wakes),
                    None => n,
                }
            }
        }
    }

    fn deliver<'a>(
        &'a self,
        port: usize,
        frame: Frame,
        v: &LazyView,
        steer: Option<crate::steering::Steer>,
        wakes: &mut Batch<'a>,
    ) -> usize {
        self.deliver_now(port, frame, v, steer, true, wakes)
    }

    /// Queues a frame for a port: chooses its queue (`steer`: the choice
    /// made when the frame was routed; None: now), finishes its offloads for
    /// the receiver, runs the egress stages (faults only if `with_faults`:
    /// not for a frame they held and released) and queues what passes in
    /// `wakes` (at once or staged, see [`Batch`]).
    fn deliver_now<'a>(
        &'a self,
        port: usize,
        frame: Frame,
        v: &LazyView,
        steer: Option<crate::steering::Steer>,
        with_faults: bool,
        wakes: &mut Batch<'a>,
    ) -> usize {
        let Some(dst) = self.ports.get(port) else {
            return 0;
        };
        if !dst.is_connected() {
            return 0;
        }
        let s = steer.unwrap_or_else(|| dst.steer_lazy(&frame.data, v));
        let rx = dst.rx_offloads();
        let report = rx.contains(RxOffloads::HASH_REPORT);
        if with_faults {
            // (A released frame was counted when it first came by.)
            dst.steering().record(&s, report && s.hash_report != 0);
        }
        let Some(r) = s.queue.and_then(|q| dst.rx_queues().get(q)) else {
            crate::buffers::give(frame.data);
            return 0;
        };
        let all = self.egress_stages();
        // A frame the faults held and released skips them.
        let stages = &all[usize::from(!with_faults)..];
        let staged = stages.iter().any(|s| s.active());
        let mut frames = match offloads::adapt(frame, rx) {
            // The view, if routing or a stage made it, goes with the frame
            // to the egress stages and a receiver that reads headers
            // (finishing a checksum moves no header); TSO segments are new
            // frames, parsed by whoever reads them.
            Ok(Adapted::One(mut f)) => {
                if staged || dst.profile().reads_headers {
                    f.view = v.parsed().map(Box::new);
                }
                Adapted::One(f)
            }
            Ok(f) => f,
            Err(e) => {
                // Validated at TX already; this would be our own bug. Count it.
                let q = &dst.rx_queues()[0];
                QueueCounters::add(&q.counters.rx_drops, 1);
                crate::guest_warn!(dst.log(), port = %dst.cfg().name, "cannot finish offloads of frame: {e}");
                return 0;
            }
        };
        if report {
            for f in frames.frames_mut() {
                f.hdr.hash_value = s.hash_value;
                f.hdr.hash_report = s.hash_report;
            }
        }
        if staged {
            frames = match self.egress(stages, dst, frames, wakes.now()) {
                Some(f) => f,
                None => return 0,
            };
        }
        wakes.queue(r, &dst.connected, frames, self.early_wake.load(Relaxed))
    }

    /// Runs a receiver's frames (one, or a TSO frame's segments) through the
    /// egress stages; None when nothing is left.
    fn egress(
        &self,
        stages: &[&dyn Stage],
        dst: &PortShared,
        frames: Adapted,
        now: Instant,
    ) -> Option<Adapted> {
        let list = match frames {
            Adapted::One(f) => vec![f],
            Adapted::Many(v) => v,
        };
        let reads_headers = dst.profile().reads_headers;
        let mut out = Vec::with_capacity(list.len());
        for mut f in list {
            // The view delivery carries, if any (a TSO segment has none:
            // parsed if a stage asks). Taken off the frame while stages
            // may change or hold it, put back on what passes.
            let v = f
                .view
                .take()
                .map_or_else(LazyView::default, |b| LazyView::of(*b));
            match crate::stages::run(
                stages,
                dst.index(),
                &dst.cfg().name,
                Dir::Egress,
                now,
                f,
                &v,
            ) {
                Passed::Same(mut f) => {
                    if reads_headers {
                        f.view = v.parsed().map(Box::new);
                    }
                    out.push(f);
                }
                Passed::Changed(fs) => out.extend(fs.into_iter().map(|(mut f, fv)| {
                    if reads_headers {
                        f.view = Some(Box::new(fv));
                    }
                    f
                })),
            }
        }
        match out.len() {
            0 => None,
            1 => out.pop().map(Adapted::One),
            _ => Some(Adapted::Many(out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PortConfig;
    use testing::*;

    /// A flood copies a frame only for ports with a guest: the one
    /// connected receiver among ports without one gets the sender's own
    /// buffer, not a copy (the copies for the others were made and
    /// dropped unused).
    #[test]
    fn a_flood_copies_only_for_connected_ports() {
        let port = |i: usize, connected: bool| {
            let p = PortShared::new(
                i,
                PortConfig::new(&format!("p{i}"), ""),
                PortProfile::default(),
            )
            .unwrap();
            p.connected.store(connected, Relaxed);
            p.rx_queues()[0].enabled.store(true, Relaxed);
            Arc::new(p)
        };
        let fab = Fabric::new(vec![
            port(0, true),
            port(1, false),
            port(2, true),
            port(3, false),
        ]);
        let f = arp(MAC_A, [10, 0, 0, 1]);
        let sent = f.data.as_ptr();
        assert_eq!(fab.forward(0, f, Instant::now()), 1, "one receiver");
        let got = fab.ports[2].rx_queues()[0]
            .pop()
            .expect("the broadcast at port 2");
        assert_eq!(got.data.as_ptr(), sent, "the sender's buffer, not a copy");
        assert!(
            fab.ports[0].rx_queues()[0].pop().is_none(),
            "not back to its sender"
        );
    }

    /// The switch acts on a port's profile alone, whatever its kind: an
    /// RDMA function is not learned from, RoCEv2 to its netdev port's MAC
    /// goes to it, and its frames to MAC zero go by the neighbour table
    /// (unresolved ones are dropped and counted).
    #[test]
    fn profiles_drive_learning_rdma_pairing_and_mac_zero() {
        let port = |i: usize, name: &str, profile: PortProfile| {
            let p = PortShared::new(i, PortConfig::new(name, ""), profile).unwrap();
            p.connected.store(true, Relaxed);
            p.rx_queues()[0].enabled.store(true, Relaxed);
            Arc::new(p)
        };
        let function = PortProfile {
            form: "rdma",
            learns: false,
            zero_mac_by_ip: true,
            always_attached: true,
            rdma_function_of: Some("vm".into()),
            reads_headers: true,
        };
        let f = Fabric::new(vec![
            port(0, "vm", PortProfile::default()),
            port(1, "peer", PortProfile::default()),
            port(2, "fn", function),
        ]);
        let (vm, peer) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
        let queued = |p: usize| f.ports[p].rx_queues()[0].clear();
        assert_eq!(f.forward(0, arp(vm, [10, 0, 0, 1]), Instant::now()), 2);
        assert_eq!(f.forward(1, arp(peer, [10, 0, 0, 2]), Instant::now()), 2);
        for p in 0..3 {
            queued(p);
        }
        // The function sends with its netdev's MAC, which stays the netdev's.
        assert_eq!(
            f.forward(2, udp(peer, vm, [10, 0, 0, 2], 9), Instant::now()),
            1
        );
        assert_eq!(queued(1), 1);
        assert_eq!(
            f.forward(1, udp(vm, peer, [10, 0, 0, 1], 9), Instant::now()),
            1
        );
        assert_eq!((queued(0), queued(2)), (1, 0));
        // RoCEv2 to the netdev's MAC goes to the function.
        assert_eq!(
            f.forward(1, udp(vm, peer, [10, 0, 0, 1], 4791), Instant::now()),
            1
        );
        assert_eq!((queued(0), queued(2)), (0, 1));
        // MAC zero: delivered by destination IPv4, or dropped and counted.
        assert_eq!(
            f.forward(2, udp([0; 6], vm, [10, 0, 0, 2], 4791), Instant::now()),
            1
        );
        assert_eq!(queued(1), 1);
        assert_eq!(
            f.forward(2, udp([0; 6], vm, [10, 0, 0, 7], 4791), Instant::now()),
            0
        );
        assert_eq!(f.rdma_unresolved.load(Relaxed), 1);
        // Another port's frame to MAC zero is switched like any unknown MAC.
        assert_eq!(
            f.forward(1, udp([0; 6], peer, [10, 0, 0, 1], 4791), Instant::now()),
            2
        );
        assert_eq!(f.rdma_unresolved.load(Relaxed), 1);
    }
}
