//! The SMC generic netlink family `SMC_GEN_NETLINK` (include/uapi/linux/smc.h):
//! user EID table and SMC-R device listing.

use crate::netlink::{self, NlSocket, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST};
use anyhow::{bail, Context, Result};
use std::io;

/// Generic netlink family name.
pub const SMC_GENL_FAMILY_NAME: &str = "SMC_GEN_NETLINK";
/// Family version.
pub const SMC_GENL_FAMILY_VERSION: u8 = 1;
/// Length of an EID.
pub const SMC_MAX_EID_LEN: usize = 32;

/// Commands (enum after `SMC_GENL_FAMILY commands`).
pub mod cmd {
    /// Dump system info.
    pub const GET_SYS_INFO: u8 = 1;
    /// Dump SMC-R devices.
    pub const GET_DEV_SMCR: u8 = 6;
    /// Dump the user EID table.
    pub const DUMP_UEID: u8 = 9;
    /// Add a user EID.
    pub const ADD_UEID: u8 = 10;
    /// Remove a user EID.
    pub const REMOVE_UEID: u8 = 11;
    /// Remove all user EIDs.
    pub const FLUSH_UEID: u8 = 12;
}

/// Top-level attributes.
const SMC_GEN_SYS_INFO: u16 = 1;
const SMC_GEN_DEV_SMCR: u16 = 6;
/// `SMC_NLA_EID_TABLE_ENTRY`.
pub const SMC_NLA_EID_TABLE_ENTRY: u16 = 1;

// SMC_GEN_SYS_INFO nested attributes.
const SMC_NLA_SYS_VER: u16 = 1;
const SMC_NLA_SYS_REL: u16 = 2;
const SMC_NLA_SYS_IS_ISM_V2: u16 = 3;
const SMC_NLA_SYS_LOCAL_HOST: u16 = 4;
const SMC_NLA_SYS_SEID: u16 = 5;
const SMC_NLA_SYS_IS_SMCR_V2: u16 = 6;

// SMC_GEN_DEV_SMCR nested attributes.
const SMC_NLA_DEV_USE_CNT: u16 = 1;
const SMC_NLA_DEV_IS_CRIT: u16 = 2;
const SMC_NLA_DEV_PCI_ID: u16 = 7;
const SMC_NLA_DEV_PORT: u16 = 8;
const SMC_NLA_DEV_PORT2: u16 = 9;
const SMC_NLA_DEV_IB_NAME: u16 = 10;

// SMC_NLA_DEV_PORT nested attributes.
const SMC_NLA_DEV_PORT_PNET_USR: u16 = 1;
const SMC_NLA_DEV_PORT_PNETID: u16 = 2;
const SMC_NLA_DEV_PORT_NETDEV: u16 = 3;
const SMC_NLA_DEV_PORT_STATE: u16 = 4;
const SMC_NLA_DEV_PORT_VALID: u16 = 5;
const SMC_NLA_DEV_PORT_LNK_CNT: u16 = 6;

/// Normalises a user EID the way the kernel wants it (`smc_clc_ueid_valid`):
/// upper-case, characters `A-Z 0-9 . -`, first character alphanumeric, at most
/// 32 characters, blank-padded to exactly 32.
pub fn normalize_ueid(eid: &str) -> Result<[u8; SMC_MAX_EID_LEN]> {
    let e = eid.trim_end().to_ascii_uppercase();
    if e.is_empty() {
        bail!("empty EID");
    }
    if e.len() > SMC_MAX_EID_LEN {
        bail!(
            "EID {eid:?} is {} characters long; the maximum is {SMC_MAX_EID_LEN}",
            e.len()
        );
    }
    let first = e.as_bytes()[0];
    if !first.is_ascii_alphanumeric() {
        bail!("EID {eid:?} must start with a letter or digit");
    }
    if let Some(c) = e
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '.' || *c == '-'))
    {
        bail!("EID {eid:?} contains {c:?}; allowed are A-Z, 0-9, '.' and '-'");
    }
    let mut out = [b' '; SMC_MAX_EID_LEN];
    out[..e.len()].copy_from_slice(e.as_bytes());
    Ok(out)
}

/// Builds the ADD_UEID / REMOVE_UEID request: the attribute carries the
/// 32-byte blank-padded EID plus a NUL (the kernel checks `nla_len == 33`).
pub fn ueid_request(family: u16, seq: u32, command: u8, eid: &[u8; SMC_MAX_EID_LEN]) -> Vec<u8> {
    let mut payload = eid.to_vec();
    payload.push(0);
    netlink::build_genl(
        family,
        NLM_F_REQUEST | NLM_F_ACK,
        seq,
        command,
        SMC_GENL_FAMILY_VERSION,
        &[(SMC_NLA_EID_TABLE_ENTRY, &payload)],
    )
}

/// An open connection to the SMC generic netlink family.
pub struct SmcNl {
    sock: NlSocket,
    family: u16,
}

impl SmcNl {
    /// Opens a generic netlink socket and resolves `SMC_GEN_NETLINK`.
    pub fn open() -> Result<SmcNl> {
        let mut sock = NlSocket::open(netlink::NETLINK_GENERIC).context("netlink socket")?;
        let family = netlink::genl_family_id(&mut sock, SMC_GENL_FAMILY_NAME).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                anyhow::anyhow!(
                    "generic netlink family {SMC_GENL_FAMILY_NAME} not found: load the smc module (modprobe smc)"
                )
            } else {
                anyhow::Error::new(e).context("resolving SMC_GEN_NETLINK")
            }
        })?;
        Ok(SmcNl { sock, family })
    }

    fn dump(&mut self, command: u8) -> Result<Vec<Vec<u8>>> {
        let seq = self.sock.next_seq();
        let msg = netlink::build_genl(
            self.family,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            command,
            SMC_GENL_FAMILY_VERSION,
            &[],
        );
        let replies = self.sock.request(&msg, seq, true)?;
        Ok(replies
            .into_iter()
            .filter(|m| m.ty == self.family && m.payload.len() >= netlink::GENL_HDRLEN)
            .map(|m| m.payload[netlink::GENL_HDRLEN..].to_vec())
            .collect())
    }

    fn do_ueid(&mut self, command: u8, eid: &str) -> Result<()> {
        let e = normalize_ueid(eid)?;
        let seq = self.sock.next_seq();
        let msg = ueid_request(self.family, seq, command, &e);
        self.sock
            .request(&msg, seq, false)
            .map(|_| ())
            .map_err(|err| {
                let what = if command == cmd::ADD_UEID {
                    "add"
                } else {
                    "remove"
                };
                let hint = match err.raw_os_error() {
                    Some(libc::EEXIST) => " (already in the table)",
                    Some(libc::ERANGE) => " (table full: the kernel keeps at most 4 user EIDs)",
                    Some(libc::ENOENT) => " (not in the table)",
                    Some(libc::EINVAL) => " (kernel rejected the EID format)",
                    Some(libc::EPERM) => " (needs CAP_NET_ADMIN)",
                    _ => "",
                };
                anyhow::anyhow!(
                    "{what} UEID {:?}: {err}{hint}",
                    String::from_utf8_lossy(&e).trim_end()
                )
            })
    }

    /// Adds a user EID.
    pub fn ueid_add(&mut self, eid: &str) -> Result<()> {
        self.do_ueid(cmd::ADD_UEID, eid)
    }

    /// Removes a user EID.
    pub fn ueid_del(&mut self, eid: &str) -> Result<()> {
        self.do_ueid(cmd::REMOVE_UEID, eid)
    }

    /// Removes every user EID.
    pub fn ueid_flush(&mut self) -> Result<()> {
        let seq = self.sock.next_seq();
        let msg = netlink::build_genl(
            self.family,
            NLM_F_REQUEST | NLM_F_ACK,
            seq,
            cmd::FLUSH_UEID,
            SMC_GENL_FAMILY_VERSION,
            &[],
        );
        self.sock.request(&msg, seq, false)?;
        Ok(())
    }

    /// Lists the user EIDs (blank padding removed).
    pub fn ueid_list(&mut self) -> Result<Vec<String>> {
        Ok(self
            .dump(cmd::DUMP_UEID)?
            .iter()
            .filter_map(|p| netlink::find_attr(p, SMC_NLA_EID_TABLE_ENTRY))
            .map(|a| netlink::attr_str(a).trim_end().to_string())
            .collect())
    }

    /// System information (SMC version, release, v2 capabilities).
    pub fn sys_info(&mut self) -> Result<SysInfo> {
        let msgs = self.dump(cmd::GET_SYS_INFO)?;
        let nest = msgs
            .iter()
            .find_map(|p| netlink::find_attr(p, SMC_GEN_SYS_INFO))
            .context("no SMC_GEN_SYS_INFO in reply")?;
        let u8a = |t| netlink::find_attr(nest, t).and_then(netlink::attr_u8);
        Ok(SysInfo {
            version: u8a(SMC_NLA_SYS_VER),
            release: u8a(SMC_NLA_SYS_REL),
            is_ism_v2: u8a(SMC_NLA_SYS_IS_ISM_V2),
            is_smcr_v2: u8a(SMC_NLA_SYS_IS_SMCR_V2),
            local_host: netlink::find_attr(nest, SMC_NLA_SYS_LOCAL_HOST).map(netlink::attr_str),
            seid: netlink::find_attr(nest, SMC_NLA_SYS_SEID).map(netlink::attr_str),
        })
    }

    /// RDMA devices known to SMC-R (`smc_ib_devices`).
    pub fn smcr_devices(&mut self) -> Result<Vec<SmcrDevice>> {
        Ok(self
            .dump(cmd::GET_DEV_SMCR)?
            .iter()
            .filter_map(|p| netlink::find_attr(p, SMC_GEN_DEV_SMCR))
            .map(parse_smcr_device)
            .collect())
    }
}

/// `SMC_GEN_SYS_INFO` contents.
#[derive(Debug, Clone, Default)]
pub struct SysInfo {
    /// SMC version (1 or 2).
    pub version: Option<u8>,
    /// Release (v2.x).
    pub release: Option<u8>,
    /// ISMv2 hardware present.
    pub is_ism_v2: Option<u8>,
    /// SMC-Rv2 capable (a RoCEv2 device is present).
    pub is_smcr_v2: Option<u8>,
    /// Hostname sent in CLC.
    pub local_host: Option<String>,
    /// System EID (s390 only).
    pub seid: Option<String>,
}

/// One port of an SMC-R device.
#[derive(Debug, Clone, Default)]
pub struct SmcrPort {
    /// 1-based port number.
    pub port: u8,
    /// Port reported valid.
    pub valid: bool,
    /// Port active (IB_PORT_ACTIVE).
    pub active: bool,
    /// ifindex of the associated net device (0 if none).
    pub netdev_ifindex: u32,
    /// Name of that net device, if resolvable here.
    pub netdev: Option<String>,
    /// PNET id.
    pub pnetid: String,
    /// PNET id set by user.
    pub pnetid_by_user: bool,
    /// Links using this port.
    pub link_count: u32,
}

/// An RDMA device as SMC-R sees it.
#[derive(Debug, Clone, Default)]
pub struct SmcrDevice {
    /// ib device name (`rxe0`, `mlx5_0`).
    pub ib_name: String,
    /// PCI id, if the device has a PCI parent.
    pub pci_id: Option<String>,
    /// Device is critical (last link of a link group).
    pub is_critical: bool,
    /// Use count.
    pub use_count: Option<u32>,
    /// Ports.
    pub ports: Vec<SmcrPort>,
}

impl SmcrDevice {
    /// Usable for SMC-R: at least one valid, active port.
    pub fn usable(&self) -> bool {
        self.ports.iter().any(|p| p.valid && p.active)
    }
}

fn ifname(idx: u32) -> Option<String> {
    if idx == 0 {
        return None;
    }
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buffer of IF_NAMESIZE as required.
    let p = unsafe { libc::if_indextoname(idx, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated string.
    Some(
        unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

fn parse_smcr_device(nest: &[u8]) -> SmcrDevice {
    let mut d = SmcrDevice::default();
    for (ty, p) in netlink::attrs(nest) {
        match ty {
            SMC_NLA_DEV_IB_NAME => d.ib_name = netlink::attr_str(p),
            SMC_NLA_DEV_PCI_ID => d.pci_id = Some(netlink::attr_str(p)),
            SMC_NLA_DEV_IS_CRIT => d.is_critical = netlink::attr_u8(p) == Some(1),
            SMC_NLA_DEV_USE_CNT => d.use_count = netlink::attr_u32(p),
            SMC_NLA_DEV_PORT | SMC_NLA_DEV_PORT2 => {
                let mut port = SmcrPort {
                    port: (ty - SMC_NLA_DEV_PORT + 1) as u8,
                    ..Default::default()
                };
                for (pt, pp) in netlink::attrs(p) {
                    match pt {
                        SMC_NLA_DEV_PORT_PNET_USR => {
                            port.pnetid_by_user = netlink::attr_u8(pp) == Some(1)
                        }
                        SMC_NLA_DEV_PORT_PNETID => {
                            port.pnetid = netlink::attr_str(pp).trim().to_string()
                        }
                        SMC_NLA_DEV_PORT_NETDEV => {
                            port.netdev_ifindex = netlink::attr_u32(pp).unwrap_or(0)
                        }
                        SMC_NLA_DEV_PORT_STATE => port.active = netlink::attr_u8(pp) == Some(1),
                        SMC_NLA_DEV_PORT_VALID => port.valid = netlink::attr_u8(pp) == Some(1),
                        SMC_NLA_DEV_PORT_LNK_CNT => {
                            port.link_count = netlink::attr_u32(pp).unwrap_or(0)
                        }
                        _ => {}
                    }
                }
                port.netdev = ifname(port.netdev_ifindex);
                d.ports.push(port);
            }
            _ => {}
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ueid_rules() {
        let e = normalize_ueid("vhost-rdma.test").unwrap();
        assert_eq!(&e[..15], b"VHOST-RDMA.TEST");
        assert!(e[15..].iter().all(|&b| b == b' '));
        assert!(normalize_ueid("").is_err());
        assert!(normalize_ueid("-ABC").is_err());
        assert!(normalize_ueid(".ABC").is_err());
        assert!(normalize_ueid("A B").is_err());
        assert!(normalize_ueid("A_B").is_err());
        assert!(normalize_ueid(&"A".repeat(33)).is_err());
        assert!(normalize_ueid(&"A".repeat(32)).is_ok());
        assert!(normalize_ueid("1ABC").is_ok());
    }

    #[test]
    fn ueid_add_request_layout() {
        let eid = normalize_ueid("SMC-TEST").unwrap();
        let m = ueid_request(0x1a, 0x01020304, cmd::ADD_UEID, &eid);
        // nlmsghdr(16) + genlmsghdr(4) + nlattr(4 + 33, padded to 40) = 60.
        assert_eq!(m.len(), 60);
        let mut want = Vec::new();
        want.extend_from_slice(&60u32.to_ne_bytes()); // nlmsg_len
        want.extend_from_slice(&0x1au16.to_ne_bytes()); // nlmsg_type = family id
        want.extend_from_slice(&(0x1u16 | 0x4).to_ne_bytes()); // REQUEST | ACK
        want.extend_from_slice(&0x01020304u32.to_ne_bytes()); // seq
        want.extend_from_slice(&0u32.to_ne_bytes()); // pid
        want.extend_from_slice(&[10, 1, 0, 0]); // cmd ADD_UEID, version 1
        want.extend_from_slice(&37u16.to_ne_bytes()); // nla_len = 4 + 33
        want.extend_from_slice(&1u16.to_ne_bytes()); // SMC_NLA_EID_TABLE_ENTRY
        want.extend_from_slice(b"SMC-TEST                        "); // 32, blank padded
        want.push(0); // NUL
        want.extend_from_slice(&[0, 0, 0]); // pad to 4
        assert_eq!(m, want);
    }

    #[test]
    fn parses_device_nest() {
        let mut port = Vec::new();
        netlink::put_attr(&mut port, SMC_NLA_DEV_PORT_PNET_USR, &[0]);
        netlink::put_attr(&mut port, SMC_NLA_DEV_PORT_PNETID, b"\0");
        netlink::put_attr(&mut port, SMC_NLA_DEV_PORT_NETDEV, &2u32.to_ne_bytes());
        netlink::put_attr(&mut port, SMC_NLA_DEV_PORT_VALID, &[1]);
        netlink::put_attr(&mut port, SMC_NLA_DEV_PORT_STATE, &[1]);
        netlink::put_attr(&mut port, SMC_NLA_DEV_PORT_LNK_CNT, &3u32.to_ne_bytes());
        let mut dev = Vec::new();
        netlink::put_attr(&mut dev, SMC_NLA_DEV_IS_CRIT, &[0]);
        netlink::put_attr(&mut dev, SMC_NLA_DEV_IB_NAME, b"rxe0\0");
        netlink::put_attr(&mut dev, 0x8000 | SMC_NLA_DEV_PORT, &port);
        let d = parse_smcr_device(&dev);
        assert_eq!(d.ib_name, "rxe0");
        assert_eq!(d.ports.len(), 1);
        assert_eq!(d.ports[0].port, 1);
        assert_eq!(d.ports[0].netdev_ifindex, 2);
        assert_eq!(d.ports[0].link_count, 3);
        assert!(d.usable());
    }
}
