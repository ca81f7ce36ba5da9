//! SMC socket diagnostics over NETLINK_SOCK_DIAG (include/uapi/linux/smc_diag.h):
//! did a connection really run over SMC-R / SMC-D, or fall back to TCP, and why.

use crate::codes;
use crate::netlink::{self, NlSocket, NLM_F_DUMP, NLM_F_REQUEST};
use crate::sock::AF_SMC;
use std::fmt;
use std::io;

/// `SOCK_DIAG_BY_FAMILY`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `SMC_DIAG_*` extension attributes.
const SMC_DIAG_CONNINFO: u16 = 1;
const SMC_DIAG_LGRINFO: u16 = 2;
const SMC_DIAG_FALLBACK: u16 = 5;
/// `IB_DEVICE_NAME_MAX`.
const IB_DEVICE_NAME_MAX: usize = 64;
/// `sizeof(struct smc_diag_msg)`: 4 bytes + inet_diag_sockid (48) + uid (4) + inode (8).
const SMC_DIAG_MSG_LEN: usize = 64;

/// `diag_mode` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmcMode {
    /// SMC_DIAG_MODE_SMCR.
    SmcR,
    /// SMC_DIAG_MODE_FALLBACK_TCP.
    FallbackTcp,
    /// SMC_DIAG_MODE_SMCD.
    SmcD,
    /// Anything newer.
    Other(u8),
}

impl SmcMode {
    fn from_u8(v: u8) -> Self {
        match v {
            0 => SmcMode::SmcR,
            1 => SmcMode::FallbackTcp,
            2 => SmcMode::SmcD,
            x => SmcMode::Other(x),
        }
    }

    /// Short name used in result lines.
    pub fn name(&self) -> String {
        match self {
            SmcMode::SmcR => "smcr".into(),
            SmcMode::FallbackTcp => "fallback".into(),
            SmcMode::SmcD => "smcd".into(),
            SmcMode::Other(x) => format!("mode{x}"),
        }
    }
}

/// What sock_diag says about one SMC socket.
#[derive(Clone, Debug)]
pub struct SmcSockInfo {
    /// Connection mode.
    pub mode: SmcMode,
    /// `fallback.reason` (a `SMC_CLC_DECL_*` code, 0 if none).
    pub fallback_reason: u32,
    /// `fallback.peer_diagnosis` (the peer's decline code, 0 if none).
    pub peer_diagnosis: u32,
    /// Socket state (TCP state numbers).
    pub state: u8,
    /// RDMA device of the link (SMC-R, from SMC_DIAG_LGRINFO).
    pub ib_dev: Option<String>,
    /// RDMA port of the link.
    pub ib_port: Option<u8>,
    /// Local GID of the link.
    pub gid: Option<String>,
    /// Peer GID of the link.
    pub peer_gid: Option<String>,
    /// Send buffer size (SMC_DIAG_CONNINFO).
    pub sndbuf_size: Option<u32>,
    /// Local RMB element size.
    pub rmbe_size: Option<u32>,
    /// Peer RMB element size.
    pub peer_rmbe_size: Option<u32>,
}

impl SmcSockInfo {
    /// True when data went over SMC (R or D) rather than TCP.
    pub fn is_smc(&self) -> bool {
        matches!(self.mode, SmcMode::SmcR | SmcMode::SmcD)
    }
}

impl fmt::Display for SmcSockInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mode={}", self.mode.name())?;
        // Values carry no blanks: result lines prefix every token (smc_...).
        if self.mode == SmcMode::FallbackTcp || self.fallback_reason != 0 {
            write!(f, " fallback_reason=0x{:08x}", self.fallback_reason)?;
            if let Some((name, _)) = codes::lookup(self.fallback_reason) {
                write!(f, " fallback_name={name}")?;
            }
        }
        if self.peer_diagnosis != 0 {
            write!(f, " peer_diagnosis=0x{:08x}", self.peer_diagnosis)?;
            if let Some((name, _)) = codes::lookup(self.peer_diagnosis) {
                write!(f, " peer_diagnosis_name={name}")?;
            }
        }
        if let Some(d) = &self.ib_dev {
            write!(f, " ibdev={d}:{}", self.ib_port.unwrap_or(0))?;
        }
        if let Some(g) = &self.gid {
            write!(f, " gid={g}")?;
        }
        if let Some(g) = &self.peer_gid {
            write!(f, " peer_gid={g}")?;
        }
        if let (Some(s), Some(r)) = (self.sndbuf_size, self.rmbe_size) {
            write!(f, " sndbuf={s} rmbe={r}")?;
        }
        Ok(())
    }
}

/// Encodes the dump request (`struct smc_diag_req` after the nlmsghdr).
pub fn smc_diag_request(seq: u32) -> Vec<u8> {
    let mut req = vec![0u8; 4 + 48];
    req[0] = AF_SMC as u8; // diag_family
                           // diag_ext: ask for connection and link group info (bit n-1 for extension n).
    req[3] = (1 << (SMC_DIAG_CONNINFO - 1)) | (1 << (SMC_DIAG_LGRINFO - 1));
    // inet_diag_sockid left zero: the SMC dump ignores it and lists all sockets.
    netlink::build_msg(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, &req)
}

fn cstr(b: &[u8]) -> String {
    netlink::attr_str(b)
}

/// Parses one `smc_diag_msg` (+ attributes); returns its inode and the info.
pub fn parse_smc_diag_msg(p: &[u8]) -> Option<(u64, SmcSockInfo)> {
    if p.len() < SMC_DIAG_MSG_LEN {
        return None;
    }
    let inode = u64::from_ne_bytes(p[56..64].try_into().ok()?);
    let mut info = SmcSockInfo {
        mode: SmcMode::from_u8(p[2]),
        fallback_reason: 0,
        peer_diagnosis: 0,
        state: p[1],
        ib_dev: None,
        ib_port: None,
        gid: None,
        peer_gid: None,
        sndbuf_size: None,
        rmbe_size: None,
        peer_rmbe_size: None,
    };
    for (ty, a) in netlink::attrs(&p[SMC_DIAG_MSG_LEN..]) {
        match ty {
            SMC_DIAG_FALLBACK if a.len() >= 8 => {
                info.fallback_reason = u32::from_ne_bytes(a[0..4].try_into().ok()?);
                info.peer_diagnosis = u32::from_ne_bytes(a[4..8].try_into().ok()?);
            }
            SMC_DIAG_CONNINFO if a.len() >= 16 => {
                info.sndbuf_size = netlink::attr_u32(&a[4..]);
                info.rmbe_size = netlink::attr_u32(&a[8..]);
                info.peer_rmbe_size = netlink::attr_u32(&a[12..]);
            }
            SMC_DIAG_LGRINFO if a.len() >= 1 + IB_DEVICE_NAME_MAX + 1 + 80 => {
                // struct smc_diag_linkinfo: link_id, ibname[64], ibport, gid[40], peer_gid[40]
                let name = cstr(&a[1..1 + IB_DEVICE_NAME_MAX]);
                let port = a[1 + IB_DEVICE_NAME_MAX];
                let g0 = 2 + IB_DEVICE_NAME_MAX;
                info.ib_dev = Some(name);
                info.ib_port = Some(port);
                info.gid = Some(cstr(&a[g0..g0 + 40]));
                info.peer_gid = Some(cstr(&a[g0 + 40..g0 + 80]));
            }
            _ => {}
        }
    }
    Some((inode, info))
}

/// Looks up the SMC socket with inode `inode` in this network namespace.
pub fn query_by_inode(inode: u64) -> io::Result<SmcSockInfo> {
    let mut s = NlSocket::open(netlink::NETLINK_SOCK_DIAG)?;
    let seq = s.next_seq();
    let msgs = s.request(&smc_diag_request(seq), seq, true).map_err(|e| {
        if e.raw_os_error() == Some(libc::ENOENT) {
            io::Error::new(
                io::ErrorKind::NotFound,
                "SMC sock_diag not available (modprobe smc_diag)",
            )
        } else {
            e
        }
    })?;
    for m in &msgs {
        if m.ty != SOCK_DIAG_BY_FAMILY {
            continue;
        }
        if let Some((ino, info)) = parse_smc_diag_msg(&m.payload) {
            if ino == inode {
                return Ok(info);
            }
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "socket inode {inode} not in the SMC sock_diag dump ({} SMC sockets listed)",
            msgs.len()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_layout() {
        let m = smc_diag_request(5);
        assert_eq!(m.len(), 16 + 52);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), 20);
        assert_eq!(u16::from_ne_bytes([m[6], m[7]]), 0x301);
        assert_eq!(m[16], 43);
        assert_eq!(m[19], 0b11);
    }

    #[test]
    fn parses_fallback() {
        let mut p = vec![0u8; SMC_DIAG_MSG_LEN];
        p[0] = 43;
        p[1] = 1; // established
        p[2] = 1; // fallback
        p[56..64].copy_from_slice(&777u64.to_ne_bytes());
        let mut fb = Vec::new();
        fb.extend_from_slice(&0x0500_0000u32.to_ne_bytes());
        fb.extend_from_slice(&0x0303_0008u32.to_ne_bytes());
        netlink::put_attr(&mut p, SMC_DIAG_FALLBACK, &fb);
        let (ino, info) = parse_smc_diag_msg(&p).unwrap();
        assert_eq!(ino, 777);
        assert_eq!(info.mode, SmcMode::FallbackTcp);
        assert!(!info.is_smc());
        let s = info.to_string();
        assert!(
            s.contains("fallback_reason=0x05000000 fallback_name=SMC_CLC_DECL_PEERDECL"),
            "{s}"
        );
        assert!(
            s.contains("peer_diagnosis=0x03030008 peer_diagnosis_name=SMC_CLC_DECL_NOUEID"),
            "{s}"
        );
        // every token is key=value (the CONN line prefixes each with smc_)
        assert!(s.split(' ').all(|t| t.contains('=')), "{s}");
    }
}
