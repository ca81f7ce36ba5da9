//! MAD header and the seven CM messages of IBA vol. 1 ch. 12 (tables 106–113)
//! as Linux lays them out (`include/rdma/ibta_vol1_c12.h`).
//!
//! Every field offset below is relative to the CM data, which starts after
//! the 24-byte MAD header. IBA numbers bits from the most significant one,
//! so a "5-bit field at byte 43" is the top five bits of that byte.
//! Reserved bits are ignored when parsing and written as zero.

use crate::error::CmError;

/// A MAD is always 256 bytes on the wire (the UD payload of a GSI SEND).
pub const MAD_LEN: usize = 256;
/// Common MAD header: versions, class, method, status, TID, attribute.
pub const MAD_HDR_LEN: usize = 24;
/// CM data after the MAD header.
pub const CM_DATA_LEN: usize = MAD_LEN - MAD_HDR_LEN;
/// `IB_MGMT_BASE_VERSION`.
pub const MAD_BASE_VERSION: u8 = 1;
/// `IB_MGMT_CLASS_CM`.
pub const MGMT_CLASS_CM: u8 = 0x07;
/// `IB_CM_CLASS_VERSION` (IBA 1.2).
pub const CM_CLASS_VERSION: u8 = 2;
/// `IB_MGMT_METHOD_SEND`: every CM message uses it.
pub const METHOD_SEND: u8 = 0x03;
/// Q_Key of the GSI QP (QP1).
pub const GSI_QKEY: u32 = 0x8001_0000;

/// Private-data field sizes (bytes) per message.
pub const REQ_PRIVATE_LEN: usize = 92;
/// MRA private data.
pub const MRA_PRIVATE_LEN: usize = 222;
/// REJ private data.
pub const REJ_PRIVATE_LEN: usize = 148;
/// REJ additional rejection information.
pub const REJ_ARI_LEN: usize = 72;
/// REP private data.
pub const REP_PRIVATE_LEN: usize = 196;
/// RTU private data.
pub const RTU_PRIVATE_LEN: usize = 224;
/// DREQ private data.
pub const DREQ_PRIVATE_LEN: usize = 220;
/// DREP private data.
pub const DREP_PRIVATE_LEN: usize = 224;

/// CM attribute IDs (the MAD `attr_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum AttrId {
    /// Connection request.
    Req = 0x0010,
    /// Message receipt acknowledgement (asks for more time).
    Mra = 0x0011,
    /// Reject.
    Rej = 0x0012,
    /// Reply to a REQ.
    Rep = 0x0013,
    /// Ready to use.
    Rtu = 0x0014,
    /// Disconnect request.
    Dreq = 0x0015,
    /// Disconnect reply.
    Drep = 0x0016,
}

impl AttrId {
    /// The attribute for a wire value, `None` for SIDR/LAP/APR/ClassPortInfo
    /// and anything unknown.
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x10 => Self::Req,
            0x11 => Self::Mra,
            0x12 => Self::Rej,
            0x13 => Self::Rep,
            0x14 => Self::Rtu,
            0x15 => Self::Dreq,
            0x16 => Self::Drep,
            _ => return None,
        })
    }
}

/// Which message an MRA or REJ refers to (2-bit field).
pub const MSG_REQ: u8 = 0;
/// The message was a REP.
pub const MSG_REP: u8 = 1;
/// Other (LAP for MRA, "other" for REJ).
pub const MSG_OTHER: u8 = 2;

/// REJ reason codes used here (IBA table 109).
pub mod reject_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No resources (our connection limits).
    pub const NO_RESOURCES: u16 = 3;
    /// The peer did not answer in time.
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Nobody listens on the service ID.
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Transport type not supported (we do RC only).
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// The application refused (rdma_reject).
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// Path information inside a REQ (44 bytes, primary and alternate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathInfo {
    /// Local port LID (0xffff, "permissive", on RoCE).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Sender's GID (RoCE: the IPv4-mapped address).
    pub local_gid: [u8; 16],
    /// Receiver's GID.
    pub remote_gid: [u8; 16],
    /// 20-bit flow label.
    pub flow_label: u32,
    /// 6-bit packet rate.
    pub packet_rate: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// 4-bit service level.
    pub sl: u8,
    /// Subnet-local bit.
    pub subnet_local: bool,
    /// 5-bit local ACK timeout (4.096 µs × 2^n).
    pub local_ack_timeout: u8,
}

const PATH_LEN: usize = 44;

impl PathInfo {
    fn read(d: &[u8]) -> Self {
        Self {
            local_lid: be16(d, 0),
            remote_lid: be16(d, 2),
            local_gid: arr16(d, 4),
            remote_gid: arr16(d, 20),
            flow_label: be32(d, 36) >> 12,
            packet_rate: d[39] & 0x3f,
            traffic_class: d[40],
            hop_limit: d[41],
            sl: d[42] >> 4,
            subnet_local: d[42] & 0x08 != 0,
            local_ack_timeout: d[43] >> 3,
        }
    }

    fn write(&self, d: &mut [u8]) {
        d[0..2].copy_from_slice(&self.local_lid.to_be_bytes());
        d[2..4].copy_from_slice(&self.remote_lid.to_be_bytes());
        d[4..20].copy_from_slice(&self.local_gid);
        d[20..36].copy_from_slice(&self.remote_gid);
        let w = ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f);
        d[36..40].copy_from_slice(&w.to_be_bytes());
        d[40] = self.traffic_class;
        d[41] = self.hop_limit;
        d[42] = ((self.sl & 0xf) << 4) | if self.subnet_local { 0x08 } else { 0 };
        // The low three bits of the last byte belong to the caller (SAP
        // supported in the alternate path of a REQ).
        d[43] = (d[43] & 0x07) | ((self.local_ack_timeout & 0x1f) << 3);
    }
}

/// REQ (table 106).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Req {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// 24-bit vendor ID.
    pub vendor_id: u32,
    /// Service ID (rdma_cm: port space << 16 | port).
    pub service_id: u64,
    /// Sender's CA GUID.
    pub local_ca_guid: u64,
    /// Sender's Q_Key (UD/RD only).
    pub local_qkey: u32,
    /// Sender's 24-bit QPN.
    pub local_qpn: u32,
    /// Responder resources the sender offers (its max_dest_rd_atomic).
    pub responder_resources: u8,
    /// 24-bit local EECN.
    pub local_eecn: u32,
    /// Initiator depth (the sender's max_rd_atomic).
    pub initiator_depth: u8,
    /// 24-bit remote EECN.
    pub remote_eecn: u32,
    /// 5-bit timeout the sender waits for our response.
    pub remote_cm_response_timeout: u8,
    /// 2-bit transport service type (0 = RC, 1 = UC, 3 = XRC via ext.).
    pub transport_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Sender's 24-bit starting PSN: the PSN the sender expects to
    /// receive, which the receiver of the REQ sends with.
    pub starting_psn: u32,
    /// 5-bit timeout we may take to answer.
    pub local_cm_response_timeout: u8,
    /// 3-bit transport retry count.
    pub retry_count: u8,
    /// P_Key.
    pub pkey: u16,
    /// 4-bit path MTU (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// 3-bit RNR retry count.
    pub rnr_retry_count: u8,
    /// 4-bit maximum CM retries.
    pub max_cm_retries: u8,
    /// Sender uses an SRQ.
    pub srq: bool,
    /// 3-bit extended transport type.
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: PathInfo,
    /// Alternate path (all zero when absent).
    pub alternate_path: PathInfo,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data (rdma_cm: its `cma_hdr` then the application's data).
    pub private_data: Vec<u8>,
}

/// MRA (table 107).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Mra {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// 2-bit: which message is acknowledged (`MSG_REQ`, `MSG_REP`, `MSG_OTHER`).
    pub message_mraed: u8,
    /// 5-bit service timeout: extra time the sender needs.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// REJ (table 108).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rej {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID (0 if unknown).
    pub remote_comm_id: u32,
    /// 2-bit: which message is rejected.
    pub message_rejected: u8,
    /// 7-bit length of the additional rejection information.
    pub ari_length: u8,
    /// Reason (`reject_reason`).
    pub reason: u16,
    /// Additional rejection information (72 bytes).
    pub ari: Vec<u8>,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// REP (table 110).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rep {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID (the REQ's local one).
    pub remote_comm_id: u32,
    /// Sender's Q_Key.
    pub local_qkey: u32,
    /// Sender's 24-bit QPN.
    pub local_qpn: u32,
    /// 24-bit vendor ID (split over three bytes on the wire).
    pub vendor_id: u32,
    /// 24-bit local EECN.
    pub local_eecn: u32,
    /// Sender's 24-bit starting PSN: the PSN the sender expects to
    /// receive, which the receiver of the REP sends with.
    pub starting_psn: u32,
    /// Responder resources the sender grants.
    pub responder_resources: u8,
    /// Initiator depth of the sender.
    pub initiator_depth: u8,
    /// 5-bit target ACK delay.
    pub target_ack_delay: u8,
    /// 2-bit failover accepted.
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// 3-bit RNR retry count.
    pub rnr_retry_count: u8,
    /// Sender uses an SRQ.
    pub srq: bool,
    /// Sender's CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// RTU (table 111).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rtu {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// DREQ (table 112).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dreq {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// Receiver's 24-bit QPN.
    pub remote_qpn: u32,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// DREP (table 113).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Drep {
    /// Sender's communication ID.
    pub local_comm_id: u32,
    /// Receiver's communication ID.
    pub remote_comm_id: u32,
    /// Private data.
    pub private_data: Vec<u8>,
}

/// One CM message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmMessage {
    /// REQ.
    Req(Box<Req>),
    /// MRA.
    Mra(Mra),
    /// REJ.
    Rej(Rej),
    /// REP.
    Rep(Rep),
    /// RTU.
    Rtu(Rtu),
    /// DREQ.
    Dreq(Dreq),
    /// DREP.
    Drep(Drep),
}

impl CmMessage {
    /// The attribute ID this message travels under.
    pub fn attr_id(&self) -> AttrId {
        match self {
            Self::Req(_) => AttrId::Req,
            Self::Mra(_) => AttrId::Mra,
            Self::Rej(_) => AttrId::Rej,
            Self::Rep(_) => AttrId::Rep,
            Self::Rtu(_) => AttrId::Rtu,
            Self::Dreq(_) => AttrId::Dreq,
            Self::Drep(_) => AttrId::Drep,
        }
    }

    /// The sender's communication ID.
    pub fn local_comm_id(&self) -> u32 {
        match self {
            Self::Req(m) => m.local_comm_id,
            Self::Mra(m) => m.local_comm_id,
            Self::Rej(m) => m.local_comm_id,
            Self::Rep(m) => m.local_comm_id,
            Self::Rtu(m) => m.local_comm_id,
            Self::Dreq(m) => m.local_comm_id,
            Self::Drep(m) => m.local_comm_id,
        }
    }

    /// The receiver's communication ID (0 for a REQ, which has none).
    pub fn remote_comm_id(&self) -> u32 {
        match self {
            Self::Req(_) => 0,
            Self::Mra(m) => m.remote_comm_id,
            Self::Rej(m) => m.remote_comm_id,
            Self::Rep(m) => m.remote_comm_id,
            Self::Rtu(m) => m.remote_comm_id,
            Self::Dreq(m) => m.remote_comm_id,
            Self::Drep(m) => m.remote_comm_id,
        }
    }
}

/// A CM MAD: the transaction ID of its header and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmMad {
    /// Transaction ID (a REP/RTU/REJ reuses the REQ's, a DREP the DREQ's).
    pub tid: u64,
    /// The message.
    pub msg: CmMessage,
}

fn be16(d: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([d[o], d[o + 1]])
}
fn be24(d: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([0, d[o], d[o + 1], d[o + 2]])
}
fn be32(d: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]])
}
fn be64(d: &[u8], o: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[o..o + 8]);
    u64::from_be_bytes(b)
}
fn arr16(d: &[u8], o: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b.copy_from_slice(&d[o..o + 16]);
    b
}
fn put16(d: &mut [u8], o: usize, v: u16) {
    d[o..o + 2].copy_from_slice(&v.to_be_bytes());
}
fn put24(d: &mut [u8], o: usize, v: u32) {
    d[o..o + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}
fn put32(d: &mut [u8], o: usize, v: u32) {
    d[o..o + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(d: &mut [u8], o: usize, v: u64) {
    d[o..o + 8].copy_from_slice(&v.to_be_bytes());
}

fn put_blob(
    d: &mut [u8],
    o: usize,
    max: usize,
    v: &[u8],
    field: &'static str,
) -> Result<(), CmError> {
    if v.len() > max {
        return Err(CmError::FieldTooLong {
            field,
            max,
            len: v.len(),
        });
    }
    d[o..o + v.len()].copy_from_slice(v);
    Ok(())
}

impl CmMad {
    /// Parses a 256-byte CM MAD (longer input: the rest is ignored).
    ///
    /// Private-data fields come back at their full wire size (the CM has no
    /// length field: the consumer knows its own format).
    pub fn parse(buf: &[u8]) -> Result<Self, CmError> {
        if buf.len() < MAD_LEN {
            return Err(CmError::Truncated { len: buf.len() });
        }
        let h = &buf[..MAD_HDR_LEN];
        if h[0] != MAD_BASE_VERSION {
            return Err(CmError::BaseVersion(h[0]));
        }
        if h[1] != MGMT_CLASS_CM {
            return Err(CmError::NotCm(h[1]));
        }
        if h[2] != CM_CLASS_VERSION {
            return Err(CmError::ClassVersion(h[2]));
        }
        if h[3] != METHOD_SEND {
            return Err(CmError::Method(h[3]));
        }
        let tid = be64(h, 8);
        let attr = be16(h, 16);
        let d = &buf[MAD_HDR_LEN..MAD_LEN];
        let local = be32(d, 0);
        let remote = be32(d, 4);
        let msg = match AttrId::from_u16(attr).ok_or(CmError::UnknownAttribute(attr))? {
            AttrId::Req => CmMessage::Req(Box::new(Req {
                local_comm_id: local,
                vendor_id: be24(d, 5),
                service_id: be64(d, 8),
                local_ca_guid: be64(d, 16),
                local_qkey: be32(d, 28),
                local_qpn: be24(d, 32),
                responder_resources: d[35],
                local_eecn: be24(d, 36),
                initiator_depth: d[39],
                remote_eecn: be24(d, 40),
                remote_cm_response_timeout: d[43] >> 3,
                transport_type: (d[43] >> 1) & 0x3,
                end_to_end_flow_control: d[43] & 1 != 0,
                starting_psn: be24(d, 44),
                local_cm_response_timeout: d[47] >> 3,
                retry_count: d[47] & 0x7,
                pkey: be16(d, 48),
                path_mtu: d[50] >> 4,
                rdc_exists: d[50] & 0x08 != 0,
                rnr_retry_count: d[50] & 0x7,
                max_cm_retries: d[51] >> 4,
                srq: d[51] & 0x08 != 0,
                extended_transport_type: d[51] & 0x7,
                primary_path: PathInfo::read(&d[52..52 + PATH_LEN]),
                alternate_path: PathInfo::read(&d[96..96 + PATH_LEN]),
                sap_supported: d[139] & 0x04 != 0,
                private_data: d[140..].to_vec(),
            })),
            AttrId::Mra => CmMessage::Mra(Mra {
                local_comm_id: local,
                remote_comm_id: remote,
                message_mraed: d[8] >> 6,
                service_timeout: d[9] >> 3,
                private_data: d[10..].to_vec(),
            }),
            AttrId::Rej => CmMessage::Rej(Rej {
                local_comm_id: local,
                remote_comm_id: remote,
                message_rejected: d[8] >> 6,
                ari_length: d[9] >> 1,
                reason: be16(d, 10),
                ari: d[12..84].to_vec(),
                private_data: d[84..].to_vec(),
            }),
            AttrId::Rep => CmMessage::Rep(Rep {
                local_comm_id: local,
                remote_comm_id: remote,
                local_qkey: be32(d, 8),
                local_qpn: be24(d, 12),
                vendor_id: u32::from_be_bytes([0, d[15], d[19], d[23]]),
                local_eecn: be24(d, 16),
                starting_psn: be24(d, 20),
                responder_resources: d[24],
                initiator_depth: d[25],
                target_ack_delay: d[26] >> 3,
                failover_accepted: (d[26] >> 1) & 0x3,
                end_to_end_flow_control: d[26] & 1 != 0,
                rnr_retry_count: d[27] >> 5,
                srq: d[27] & 0x10 != 0,
                local_ca_guid: be64(d, 28),
                private_data: d[36..].to_vec(),
            }),
            AttrId::Rtu => CmMessage::Rtu(Rtu {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: d[8..].to_vec(),
            }),
            AttrId::Dreq => CmMessage::Dreq(Dreq {
                local_comm_id: local,
                remote_comm_id: remote,
                remote_qpn: be24(d, 8),
                private_data: d[12..].to_vec(),
            }),
            AttrId::Drep => CmMessage::Drep(Drep {
                local_comm_id: local,
                remote_comm_id: remote,
                private_data: d[8..].to_vec(),
            }),
        };
        Ok(Self { tid, msg })
    }

    /// Encodes the MAD (256 bytes). Private data shorter than its field is
    /// zero-padded; longer is an error. Out-of-range narrow fields are
    /// masked to their width.
    pub fn encode(&self) -> Result<[u8; MAD_LEN], CmError> {
        let mut buf = [0u8; MAD_LEN];
        buf[0] = MAD_BASE_VERSION;
        buf[1] = MGMT_CLASS_CM;
        buf[2] = CM_CLASS_VERSION;
        buf[3] = METHOD_SEND;
        put64(&mut buf, 8, self.tid);
        put16(&mut buf, 16, self.msg.attr_id() as u16);
        let d = &mut buf[MAD_HDR_LEN..];
        put32(d, 0, self.msg.local_comm_id());
        match &self.msg {
            CmMessage::Req(m) => {
                put24(d, 5, m.vendor_id & 0xff_ffff);
                put64(d, 8, m.service_id);
                put64(d, 16, m.local_ca_guid);
                put32(d, 28, m.local_qkey);
                put24(d, 32, m.local_qpn & 0xff_ffff);
                d[35] = m.responder_resources;
                put24(d, 36, m.local_eecn & 0xff_ffff);
                d[39] = m.initiator_depth;
                put24(d, 40, m.remote_eecn & 0xff_ffff);
                d[43] = ((m.remote_cm_response_timeout & 0x1f) << 3)
                    | ((m.transport_type & 0x3) << 1)
                    | u8::from(m.end_to_end_flow_control);
                put24(d, 44, m.starting_psn & 0xff_ffff);
                d[47] = ((m.local_cm_response_timeout & 0x1f) << 3) | (m.retry_count & 0x7);
                put16(d, 48, m.pkey);
                d[50] = ((m.path_mtu & 0xf) << 4)
                    | if m.rdc_exists { 0x08 } else { 0 }
                    | (m.rnr_retry_count & 0x7);
                d[51] = ((m.max_cm_retries & 0xf) << 4)
                    | if m.srq { 0x08 } else { 0 }
                    | (m.extended_transport_type & 0x7);
                m.primary_path.write(&mut d[52..52 + PATH_LEN]);
                if m.sap_supported {
                    d[139] = 0x04;
                }
                m.alternate_path.write(&mut d[96..96 + PATH_LEN]);
                put_blob(d, 140, REQ_PRIVATE_LEN, &m.private_data, "REQ private data")?;
            }
            CmMessage::Mra(m) => {
                put32(d, 4, m.remote_comm_id);
                d[8] = (m.message_mraed & 0x3) << 6;
                d[9] = (m.service_timeout & 0x1f) << 3;
                put_blob(d, 10, MRA_PRIVATE_LEN, &m.private_data, "MRA private data")?;
            }
            CmMessage::Rej(m) => {
                put32(d, 4, m.remote_comm_id);
                d[8] = (m.message_rejected & 0x3) << 6;
                d[9] = (m.ari_length & 0x7f) << 1;
                put16(d, 10, m.reason);
                put_blob(d, 12, REJ_ARI_LEN, &m.ari, "REJ ARI")?;
                put_blob(d, 84, REJ_PRIVATE_LEN, &m.private_data, "REJ private data")?;
            }
            CmMessage::Rep(m) => {
                put32(d, 4, m.remote_comm_id);
                put32(d, 8, m.local_qkey);
                put24(d, 12, m.local_qpn & 0xff_ffff);
                let v = m.vendor_id.to_be_bytes();
                d[15] = v[1];
                put24(d, 16, m.local_eecn & 0xff_ffff);
                d[19] = v[2];
                put24(d, 20, m.starting_psn & 0xff_ffff);
                d[23] = v[3];
                d[24] = m.responder_resources;
                d[25] = m.initiator_depth;
                d[26] = ((m.target_ack_delay & 0x1f) << 3)
                    | ((m.failover_accepted & 0x3) << 1)
                    | u8::from(m.end_to_end_flow_control);
                d[27] = ((m.rnr_retry_count & 0x7) << 5) | if m.srq { 0x10 } else { 0 };
                put64(d, 28, m.local_ca_guid);
                put_blob(d, 36, REP_PRIVATE_LEN, &m.private_data, "REP private data")?;
            }
            CmMessage::Rtu(m) => {
                put32(d, 4, m.remote_comm_id);
                put_blob(d, 8, RTU_PRIVATE_LEN, &m.private_data, "RTU private data")?;
            }
            CmMessage::Dreq(m) => {
                put32(d, 4, m.remote_comm_id);
                put24(d, 8, m.remote_qpn & 0xff_ffff);
                put_blob(
                    d,
                    12,
                    DREQ_PRIVATE_LEN,
                    &m.private_data,
                    "DREQ private data",
                )?;
            }
            CmMessage::Drep(m) => {
                put32(d, 4, m.remote_comm_id);
                put_blob(d, 8, DREP_PRIVATE_LEN, &m.private_data, "DREP private data")?;
            }
        }
        Ok(buf)
    }
}

/// The IPv4-mapped GID (`::ffff:a.b.c.d`) rxe uses for an IPv4 address.
pub fn ipv4_mapped_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// CM timeouts are encoded as 4.096 µs × 2^n (n ≤ 31).
pub fn cm_timeout(code: u8) -> std::time::Duration {
    std::time::Duration::from_nanos(4096u64 << u32::from(code.min(31)))
}
