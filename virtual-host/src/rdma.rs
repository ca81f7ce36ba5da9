//! The host's RDMA device: RC queue pairs (roce-model) behind RoCEv2 over
//! IPv4, memory regions, and the small IPv4 → MAC cache RoCE frames need.

use crate::{HostCounters, HostError, HostLimits, ServiceCtx};
use ib_cm::{CmConfig, CmCounters, CmEvent, CmManager, ConnId, ConnectParams, LocalQp, RemoteQp};
use roce_model::wire::{EthernetHeader, Ipv4Header, UdpHeader};
use roce_model::{
    Access, Completion, IcrcScope, Memory, NetLayer, ProtectionDomain, QpAttr, QpCaps, QpState,
    QueuePair, RecvWr, RoceFrame, SendWr,
};
use roce_model::{Deth, Opcode, PacketBuilder};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};
use wire::ethernet::ETHERTYPE_IPV4;
use wire::ip::IPPROTO_UDP;
use wire::roce::ROCEV2_PORT;

/// Neighbours remembered for RoCE traffic.
const NEIGHBOR_LIMIT: usize = 64;
/// Frames waiting for the fabric are bounded by the caller's queue; ARP
/// requests for one address go out at most this often.
const ARP_RETRY: Duration = Duration::from_millis(200);
/// Longest a retired QP lingers to finish sending.
const RETIRE_GRACE: Duration = Duration::from_secs(2);

/// CM events waiting for their services; more are dropped (counted).
const CM_EVENT_LIMIT: usize = 256;
/// The GSI QP number.
pub const GSI_QPN: u32 = 1;

/// Counters of the GSI agent (QP1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GsiCounters {
    /// MADs received on QP1 (UD SEND_ONLY with the GSI Q_Key).
    pub mads_rx: u64,
    /// MADs sent from QP1.
    pub mads_tx: u64,
    /// Packets to QP1 that were not UD SEND_ONLY.
    pub not_ud_send: u64,
    /// Packets to QP1 with a Q_Key other than 0x80010000.
    pub bad_qkey: u64,
    /// MADs the CM refused (truncated, not CM, unknown attribute …).
    pub bad_mads: u64,
    /// MADs dropped for want of the peer's MAC (the CM resends).
    pub no_neighbor: u64,
    /// CM events dropped because no service took them.
    pub events_dropped: u64,
}

/// A queue pair with its path.
struct QpEntry {
    qp: QueuePair,
    remote_ip: Ipv4Addr,
    udp_src_port: u16,
}

/// IPv4 → MAC, learned from frames addressed to the host; bounded (oldest
/// entry goes first).
#[derive(Default)]
pub(crate) struct Neighbors {
    entries: VecDeque<(Ipv4Addr, [u8; 6])>,
    asked: Vec<(Ipv4Addr, Instant)>,
}

impl Neighbors {
    pub(crate) fn learn(&mut self, ip: Ipv4Addr, mac: [u8; 6]) {
        if ip.is_unspecified() || ip.is_broadcast() || mac[0] & 1 != 0 {
            return;
        }
        if let Some(e) = self.entries.iter_mut().find(|e| e.0 == ip) {
            e.1 = mac;
            return;
        }
        if self.entries.len() >= NEIGHBOR_LIMIT {
            self.entries.pop_front();
        }
        self.entries.push_back((ip, mac));
        self.asked.retain(|a| a.0 != ip);
    }

    pub(crate) fn lookup(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        self.entries.iter().find(|e| e.0 == ip).map(|e| e.1)
    }

    /// Whether to send an ARP request for `ip` now.
    fn should_ask(&mut self, ip: Ipv4Addr, now: Instant) -> bool {
        if let Some(a) = self.asked.iter_mut().find(|a| a.0 == ip) {
            if now.saturating_duration_since(a.1) < ARP_RETRY {
                return false;
            }
            a.1 = now;
            return true;
        }
        if self.asked.len() >= NEIGHBOR_LIMIT {
            self.asked.remove(0);
        }
        self.asked.push((ip, now));
        true
    }
}

/// A service that takes CM events ([`dispatch_cm`]).
pub(crate) trait CmService {
    /// A connection request: accept or reject it.
    fn cm_request(&mut self, ctx: &mut ServiceCtx<'_>, request: CmRequest);
    /// An event of one of the service's connections.
    fn cm_event(&mut self, ctx: &mut ServiceCtx<'_>, conn: ConnId, event: CmEvent);
}

/// Hands service `id`'s CM events to it; whether there were any.
pub(crate) fn dispatch_cm(service: &mut impl CmService, id: u32, ctx: &mut ServiceCtx<'_>) -> bool {
    let mut moved = false;
    while let Some(e) = ctx.rdma.cm_next_event(id) {
        moved = true;
        match e {
            ServiceCmEvent::Refused => {}
            ServiceCmEvent::Request(r) => service.cm_request(ctx, r),
            ServiceCmEvent::Conn(conn, event) => service.cm_event(ctx, conn, event),
        }
    }
    moved
}

/// A connection request from an IPv4 peer.
#[derive(Debug)]
pub(crate) struct CmRequest {
    /// The new connection.
    pub(crate) conn: ConnId,
    /// Where it came from.
    pub(crate) peer: Ipv4Addr,
    /// The peer's QP and private data.
    pub(crate) remote: RemoteQp,
}

/// A CM event as a service's dispatcher takes it
/// ([`RdmaDevice::cm_next_event`]).
#[derive(Debug)]
pub(crate) enum ServiceCmEvent {
    /// A connection request from an IPv4 peer: accept or reject it.
    Request(CmRequest),
    /// A request from an address the services do not speak, already
    /// rejected.
    Refused,
    /// An event of a connection the service has.
    Conn(ConnId, CmEvent),
}

/// The RDMA side of a virtual host.
pub struct RdmaDevice {
    mac: [u8; 6],
    ip: Ipv4Addr,
    limits: HostLimits,
    mem: Memory,
    pd: ProtectionDomain,
    qps: BTreeMap<u32, QpEntry>,
    next_qpn: u32,
    mrs: Vec<(u32, usize)>,
    /// QPs whose owner is done, kept until their last ACKs are out.
    retiring: Vec<(u32, Instant)>,
    ident: u16,
    pub(crate) neighbors: Neighbors,
    /// The IB CM behind the GSI QP.
    cm: CmManager,
    /// Listening service ID → owning service.
    cm_listeners: HashMap<u64, u32>,
    /// Connection → owning service.
    cm_owner: HashMap<ConnId, u32>,
    /// QPN → its CM connection (first packet before the RTU establishes it).
    cm_qps: HashMap<u32, ConnId>,
    /// Events for services: (owner, event).
    cm_events: VecDeque<(u32, CmEvent)>,
    gsi_psn: u32,
    gsi: GsiCounters,
}

impl RdmaDevice {
    pub(crate) fn new(mac: [u8; 6], ip: Ipv4Addr, limits: HostLimits, seed: u64) -> Self {
        let mut mem = Memory::new(seed).with_max_regions(limits.max_mrs);
        let pd = mem.alloc_pd();
        RdmaDevice {
            mac,
            ip,
            limits,
            mem,
            pd,
            qps: BTreeMap::new(),
            // rxe numbers QPs from 17; start elsewhere so traces tell the sides apart.
            next_qpn: 0x100 | ((seed as u32) & 0xff),
            mrs: Vec::new(),
            retiring: Vec::new(),
            ident: seed as u16,
            neighbors: Neighbors::default(),
            cm: CmManager::new(
                CmConfig {
                    local_ca_guid: ca_guid(mac),
                    max_connections: limits.max_qps,
                    ..CmConfig::default()
                },
                (seed as u32) | 0x1000,
            ),
            cm_listeners: HashMap::new(),
            cm_owner: HashMap::new(),
            cm_qps: HashMap::new(),
            cm_events: VecDeque::new(),
            gsi_psn: (seed as u32) & 0xff_ffff,
            gsi: GsiCounters::default(),
        }
    }

    /// The host's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// GSI agent counters.
    pub fn gsi_counters(&self) -> GsiCounters {
        self.gsi
    }

    /// CM counters.
    pub fn cm_counters(&self) -> CmCounters {
        self.cm.counters().clone()
    }

    /// Accept CM REQs for `service_id` on behalf of service `owner`.
    pub fn cm_listen(&mut self, service_id: u64, owner: u32) -> Result<(), HostError> {
        self.cm
            .listen(service_id)
            .map_err(|e| HostError::Invalid(e.to_string()))?;
        self.cm_listeners.insert(service_id, owner);
        Ok(())
    }

    /// Drops everything CM-related of service `owner`: its listeners
    /// and its connections' bookkeeping (connections still open are
    /// disconnected).
    pub fn cm_release_owner(&mut self, owner: u32, now: Instant) {
        let sids: Vec<u64> = self
            .cm_listeners
            .iter()
            .filter(|(_, &o)| o == owner)
            .map(|(&s, _)| s)
            .collect();
        for sid in sids {
            self.cm.unlisten(sid);
            self.cm_listeners.remove(&sid);
        }
        let conns: Vec<ConnId> = self
            .cm_owner
            .iter()
            .filter(|(_, &o)| o == owner)
            .map(|(&c, _)| c)
            .collect();
        for c in conns {
            let _ = self.cm.disconnect(c, now);
            self.cm_owner.remove(&c);
        }
        self.cm_events.retain(|e| e.0 != owner);
    }

    /// Starts an active CM connection for service `owner`.
    pub fn cm_connect(
        &mut self,
        peer: Ipv4Addr,
        params: ConnectParams,
        owner: u32,
        qpn: u32,
        now: Instant,
    ) -> Result<ConnId, HostError> {
        let c = self
            .cm
            .connect(IpAddr::V4(peer), params, now)
            .map_err(|e| HostError::Rdma(format!("CM connect: {e}")))?;
        self.cm_owner.insert(c, owner);
        self.cm_qps.insert(qpn, c);
        Ok(c)
    }

    /// Accepts a connection request with QP `qpn`.
    pub fn cm_accept(
        &mut self,
        conn: ConnId,
        local: LocalQp,
        now: Instant,
    ) -> Result<(), HostError> {
        let qpn = local.qpn;
        self.cm
            .accept(conn, local, now)
            .map_err(|e| HostError::Rdma(format!("CM accept: {e}")))?;
        self.cm_qps.insert(qpn, conn);
        Ok(())
    }

    /// Rejects a connection request.
    pub fn cm_reject(&mut self, conn: ConnId, reason: u16) {
        let _ = self.cm.reject(conn, reason);
        self.cm_owner.remove(&conn);
    }

    /// Disconnects (DREQ) or abandons a connection in setup (REJ).
    pub fn cm_disconnect(&mut self, conn: ConnId, now: Instant) {
        let _ = self.cm.disconnect(conn, now);
        self.route_cm_events();
    }

    /// The next CM event for service `owner`, sorted for its dispatcher.
    /// The services speak IPv4 only, so a request from any other address
    /// is rejected here and comes back as [`ServiceCmEvent::Refused`].
    pub(crate) fn cm_next_event(&mut self, owner: u32) -> Option<ServiceCmEvent> {
        let i = self.cm_events.iter().position(|e| e.0 == owner)?;
        let e = self.cm_events.remove(i)?.1;
        Some(match e {
            CmEvent::ConnectRequest {
                conn,
                peer: IpAddr::V4(peer),
                remote,
                ..
            } => ServiceCmEvent::Request(CmRequest { conn, peer, remote }),
            CmEvent::ConnectRequest { conn, .. } => {
                self.cm_reject(conn, ib_cm::reject_reason::UNSUPPORTED);
                ServiceCmEvent::Refused
            }
            other => ServiceCmEvent::Conn(other.conn(), other),
        })
    }

    /// Moves the CM's events to their services' queues.
    fn route_cm_events(&mut self) {
        while let Some(e) = self.cm.poll_event() {
            let owner = match &e {
                CmEvent::ConnectRequest {
                    conn, service_id, ..
                } => match self.cm_listeners.get(service_id) {
                    Some(&o) => {
                        self.cm_owner.insert(*conn, o);
                        Some(o)
                    }
                    None => {
                        let _ = self
                            .cm
                            .reject(*conn, ib_cm::reject_reason::INVALID_SERVICE_ID);
                        None
                    }
                },
                CmEvent::Established { conn, .. } => self.cm_owner.get(conn).copied(),
                CmEvent::Rejected { conn, .. }
                | CmEvent::Disconnected { conn }
                | CmEvent::Failed { conn, .. } => {
                    let c = *conn;
                    self.cm_qps.retain(|_, v| *v != c);
                    self.cm_owner.remove(&c)
                }
            };
            let Some(owner) = owner else { continue };
            if self.cm_events.len() >= CM_EVENT_LIMIT {
                self.cm_events.pop_front();
                self.gsi.events_dropped += 1;
            }
            self.cm_events.push_back((owner, e));
        }
    }

    /// A UD packet for QP1: a MAD for the CM.
    fn handle_gsi(&mut self, src: Ipv4Addr, pkt: &roce_model::RocePacket<'_>, now: Instant) {
        if pkt.bth.opcode != Opcode::UdSendOnly {
            self.gsi.not_ud_send += 1;
            return;
        }
        if pkt.ext.deth.map(|d| d.qkey) != Some(ib_cm::GSI_QKEY) {
            self.gsi.bad_qkey += 1;
            return;
        }
        self.gsi.mads_rx += 1;
        if self
            .cm
            .handle_mad(IpAddr::V4(src), pkt.payload, now)
            .is_err()
        {
            self.gsi.bad_mads += 1;
        }
        self.route_cm_events();
    }

    /// Moves the CM's MADs out as UD SENDs from QP1 to the peers' QP1.
    fn transmit_mads(
        &mut self,
        out: &mut VecDeque<Vec<u8>>,
        out_limit: usize,
        arp_for: &mut Vec<Ipv4Addr>,
    ) -> bool {
        let mut any = false;
        while out.len() < out_limit {
            let Some(m) = self.cm.poll_transmit() else {
                break;
            };
            any = true;
            let IpAddr::V4(peer) = m.peer else { continue };
            let Some(dst_mac) = self.neighbors.lookup(peer) else {
                self.gsi.no_neighbor += 1;
                arp_for.push(peer);
                continue;
            };
            self.gsi_psn = (self.gsi_psn + 1) & 0xff_ffff;
            let pkt = PacketBuilder::new(Opcode::UdSendOnly, GSI_QPN, self.gsi_psn)
                .deth(Deth {
                    qkey: ib_cm::GSI_QKEY,
                    src_qp: GSI_QPN,
                })
                .payload(&m.mad)
                .build_unsealed();
            let Ok(pkt) = pkt else { continue };
            // rxe varies the source port per flow; any value in its range works.
            let sport = 0xc000 | (self.gsi_psn as u16 & 0x3fff);
            if let Some(f) = frame_rocev2(
                &mut self.ident,
                self.mac,
                self.ip,
                pkt,
                dst_mac,
                peer,
                sport,
            ) {
                out.push_back(f);
                self.gsi.mads_tx += 1;
            }
        }
        any
    }

    /// Queue pairs in use.
    pub fn qp_count(&self) -> usize {
        self.qps.len()
    }

    /// Memory regions in use.
    pub fn mr_count(&self) -> usize {
        self.mrs.len()
    }

    /// Registers a zeroed region of `len` bytes at iova 0 with local write
    /// access; returns its lkey.
    pub fn register_mr(&mut self, len: usize) -> Result<u32, HostError> {
        self.register_mr_access(len, Access::LOCAL_WRITE)
    }

    /// Registers a zeroed region of `len` bytes at iova 0 with `access`;
    /// returns its lkey (= rkey).
    pub fn register_mr_access(&mut self, len: usize, access: Access) -> Result<u32, HostError> {
        self.register_mr_at(0, len, access)
    }

    /// Registers a zeroed region of `len` bytes at `iova` with `access`;
    /// returns its lkey (= rkey).
    pub fn register_mr_at(
        &mut self,
        iova: u64,
        len: usize,
        access: Access,
    ) -> Result<u32, HostError> {
        if self.mrs.len() >= self.limits.max_mrs {
            return Err(HostError::Limit {
                what: "memory regions",
                limit: self.limits.max_mrs,
            });
        }
        let used: usize = self.mrs.iter().map(|m| m.1).sum();
        if used.saturating_add(len) > self.limits.max_mr_bytes {
            return Err(HostError::Limit {
                what: "registered bytes",
                limit: self.limits.max_mr_bytes,
            });
        }
        let keys = self
            .mem
            .register(self.pd, iova, vec![0u8; len], access)
            .map_err(|e| HostError::Rdma(e.to_string()))?;
        self.mrs.push((keys.lkey, len));
        Ok(keys.lkey)
    }

    /// Deregisters a region.
    pub fn deregister_mr(&mut self, lkey: u32) {
        if self.mem.deregister(lkey).is_ok() {
            self.mrs.retain(|m| m.0 != lkey);
        }
    }

    /// Reads `len` bytes of region `lkey` at `iova`.
    pub fn read(&self, lkey: u32, iova: u64, len: usize) -> Result<Vec<u8>, HostError> {
        self.mem
            .read(lkey, iova, len)
            .map_err(|e| HostError::Rdma(e.to_string()))
    }

    /// Writes into region `lkey` at `iova`.
    pub fn write(&mut self, lkey: u32, iova: u64, data: &[u8]) -> Result<(), HostError> {
        self.mem
            .write(lkey, iova, data)
            .map_err(|e| HostError::Rdma(e.to_string()))
    }

    /// Creates an RC QP in INIT towards `remote_ip`; returns its number.
    pub fn create_qp(&mut self, remote_ip: Ipv4Addr, caps: QpCaps) -> Result<u32, HostError> {
        if self.qps.len() >= self.limits.max_qps {
            return Err(HostError::Limit {
                what: "queue pairs",
                limit: self.limits.max_qps,
            });
        }
        let mut qpn = self.next_qpn;
        while self.qps.contains_key(&qpn) || qpn < 2 {
            qpn = (qpn + 1) & 0xff_ffff;
        }
        self.next_qpn = (qpn + 1) & 0xff_ffff;
        let mut qp = QueuePair::new(qpn, self.pd, caps);
        // INIT at once, so receives can be posted before the exchange.
        qp.modify(QpState::Init, &QpAttr::default())
            .map_err(|e| HostError::Rdma(e.to_string()))?;
        // Flow entropy per QP, in the range rxe uses.
        let udp_src_port = 0xc000 | (qpn as u16 & 0x3fff);
        self.qps.insert(
            qpn,
            QpEntry {
                qp,
                remote_ip,
                udp_src_port,
            },
        );
        Ok(qpn)
    }

    /// Moves a QP from INIT to RTS with `attr`.
    pub fn connect_qp(&mut self, qpn: u32, attr: &QpAttr) -> Result<(), HostError> {
        let e = self.qps.get_mut(&qpn).ok_or(HostError::NoSuchQp(qpn))?;
        e.qp.modify(QpState::Rtr, attr)
            .and_then(|_| e.qp.modify(QpState::Rts, attr))
            .map_err(|e| HostError::Rdma(e.to_string()))
    }

    /// Destroys a QP now.
    pub fn destroy_qp(&mut self, qpn: u32) {
        self.qps.remove(&qpn);
        self.retiring.retain(|r| r.0 != qpn);
    }

    /// Destroys a QP once it has nothing left to send (the ACK of the last
    /// message the peer sent is usually still queued when the last
    /// completion is seen), or after a grace period.
    pub fn retire_qp(&mut self, qpn: u32, now: Instant) {
        if self.qps.contains_key(&qpn) && !self.retiring.iter().any(|r| r.0 == qpn) {
            self.retiring.push((qpn, now + RETIRE_GRACE));
        }
    }

    /// Posts a send work request.
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), HostError> {
        let e = self.qps.get_mut(&qpn).ok_or(HostError::NoSuchQp(qpn))?;
        e.qp.post_send(wr)
            .map_err(|e| HostError::Rdma(e.to_string()))
    }

    /// Posts a receive work request.
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), HostError> {
        let e = self.qps.get_mut(&qpn).ok_or(HostError::NoSuchQp(qpn))?;
        e.qp.post_recv(wr)
            .map_err(|e| HostError::Rdma(e.to_string()))
    }

    /// A QP's counters.
    pub fn qp_stats(&self, qpn: u32) -> Option<roce_model::QpStats> {
        self.qps.get(&qpn).map(|e| *e.qp.stats())
    }

    /// The next completion of a QP.
    pub fn poll_completion(&mut self, qpn: u32) -> Option<Completion> {
        self.qps.get_mut(&qpn)?.qp.poll_completion()
    }

    /// Handles a RoCEv2 frame addressed to this host; `view` is its
    /// `wire::parse` view, which locates the RoCE layers (no second walk).
    pub(crate) fn handle_frame(
        &mut self,
        frame: &[u8],
        view: &wire::ParsedFrame,
        now: Instant,
        c: &mut HostCounters,
    ) {
        let f = match RoceFrame::from_parsed(frame, view) {
            Ok(f) => f,
            Err(_) => {
                c.roce_malformed += 1;
                return;
            }
        };
        if f.verify_icrc().is_err() {
            c.roce_icrc_errors += 1;
            return;
        }
        let NetLayer::Ipv4 { ip, .. } = f.net else {
            c.roce_malformed += 1;
            return;
        };
        let src = Ipv4Addr::from(ip.src);
        if Ipv4Addr::from(ip.dst) != self.ip {
            c.roce_no_qp += 1;
            return;
        }
        if f.packet.bth.dest_qp == GSI_QPN {
            self.neighbors.learn(src, f.eth.src);
            self.handle_gsi(src, &f.packet, now);
            return;
        }
        let Some(e) = self.qps.get_mut(&f.packet.bth.dest_qp) else {
            c.roce_no_qp += 1;
            return;
        };
        // rxe drops RC packets from an address other than the QP's path.
        if e.remote_ip != src {
            c.roce_no_qp += 1;
            return;
        }
        self.neighbors.learn(src, f.eth.src);
        c.roce_rx += 1;
        if e.qp.handle_packet(&f.packet, now, &mut self.mem).is_err() {
            c.roce_dropped += 1;
        } else if let Some(&conn) = self.cm_qps.get(&f.packet.bth.dest_qp) {
            // Data before the RTU: the RTU was lost, the peer is connected.
            self.cm.notify_established(conn);
            self.route_cm_events();
        }
    }

    /// Runs QP timers.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.cm.poll_timeout().is_some_and(|t| t <= now) {
            self.cm.handle_timeout(now);
            self.route_cm_events();
        }
        for e in self.qps.values_mut() {
            if e.qp.poll_timeout().is_some_and(|t| t <= now) {
                e.qp.handle_timeout(now);
            }
        }
    }

    /// Earliest QP timer.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        let retire = self.retiring.iter().map(|r| r.1).min();
        self.qps
            .values()
            .filter_map(|e| e.qp.poll_timeout())
            .chain(retire)
            .chain(self.cm.poll_timeout())
            .min()
    }

    /// Moves every QP's pending packets into `out` as Ethernet frames.
    /// Returns whether anything was produced.
    pub(crate) fn transmit(
        &mut self,
        now: Instant,
        out: &mut VecDeque<Vec<u8>>,
        out_limit: usize,
        c: &mut HostCounters,
    ) -> bool {
        let mut arp_for = Vec::new();
        let mut any = false;
        for e in self.qps.values_mut() {
            while out.len() < out_limit {
                let Some(pkt) = e.qp.poll_transmit(now, &self.mem) else {
                    break;
                };
                any = true;
                let Some(dst_mac) = self.neighbors.lookup(e.remote_ip) else {
                    // The QP's retransmit timer sends it again once ARP answered.
                    c.roce_tx_no_neighbor += 1;
                    arp_for.push(e.remote_ip);
                    continue;
                };
                let Some(f) = frame_rocev2(
                    &mut self.ident,
                    self.mac,
                    self.ip,
                    pkt,
                    dst_mac,
                    e.remote_ip,
                    e.udp_src_port,
                ) else {
                    c.roce_dropped += 1;
                    continue;
                };
                out.push_back(f);
                c.roce_tx += 1;
            }
        }
        // MADs after the QPs' packets: the ACK of a last message leaves
        // before the DREQ that follows it.
        any |= self.transmit_mads(out, out_limit, &mut arp_for);
        let qps = &mut self.qps;
        self.retiring.retain(|&(qpn, until)| {
            let idle = qps.get(&qpn).is_none_or(|e| e.qp.is_idle());
            if idle || now >= until {
                qps.remove(&qpn);
                false
            } else {
                true
            }
        });
        for ip in arp_for {
            if out.len() < out_limit && self.neighbors.should_ask(ip, now) {
                out.push_back(arp_request(self.mac, self.ip, ip));
                c.arp_requests_sent += 1;
            }
        }
        any
    }
}

/// Frames a BTH..ICRC packet (ICRC still zero) from `src_mac`/`src` to
/// `dst_mac`/`remote` as RoCEv2 over IPv4 with UDP source port `sport`,
/// stamping the next IP ident from `ident`; `None` when it is too long for
/// an IP datagram or the ICRC cannot be sealed. A free function so the
/// transmit loop can frame while it holds the queue pairs.
fn frame_rocev2(
    ident: &mut u16,
    src_mac: [u8; 6],
    src: Ipv4Addr,
    mut pkt: Vec<u8>,
    dst_mac: [u8; 6],
    remote: Ipv4Addr,
    sport: u16,
) -> Option<Vec<u8>> {
    *ident = ident.wrapping_add(1);
    let udp_len = pkt.len() + UdpHeader::LEN;
    let total = u16::try_from(udp_len + 20).ok()?;
    let ip = Ipv4Header {
        tos: 0,
        total_len: total,
        ident: *ident,
        flags_frag: Ipv4Header::DF,
        ttl: 64,
        protocol: IPPROTO_UDP,
        checksum: 0,
        src: src.octets(),
        dst: remote.octets(),
    }
    .emit();
    let udp = UdpHeader {
        src_port: sport,
        dst_port: ROCEV2_PORT,
        len: udp_len as u16,
        checksum: 0,
    }
    .emit();
    (IcrcScope::Ipv4 { ip: &ip, udp: &udp })
        .seal(&mut pkt)
        .ok()?;
    let mut f = Vec::with_capacity(14 + 28 + pkt.len());
    EthernetHeader {
        dst: dst_mac,
        src: src_mac,
        vlan_tci: None,
        ethertype: ETHERTYPE_IPV4,
    }
    .emit(&mut f);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&udp);
    f.extend_from_slice(&pkt);
    Some(f)
}

/// A broadcast ARP request for `target`.
pub(crate) fn arp_request(mac: [u8; 6], ip: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    use wire::arp::{Arp, ARP_LEN, OP_REQUEST};
    use wire::ethernet::{ETHERTYPE_ARP, ETH_HLEN};
    let mut f = vec![0u8; ETH_HLEN + ARP_LEN];
    f[0..6].fill(0xff);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_ARP.to_be_bytes());
    Arp {
        op: OP_REQUEST,
        sender_mac: mac,
        sender_ip: ip.octets(),
        target_mac: [0; 6],
        target_ip: target.octets(),
    }
    .emit(&mut f[ETH_HLEN..]);
    f
}

/// An EUI-64 style CA GUID from the MAC (as rxe derives its node GUID).
fn ca_guid(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 2,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}
