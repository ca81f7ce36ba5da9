//! rdma_cm's private-data header in a REQ (`struct cma_hdr` in
//! drivers/infiniband/core/cma.c) and its service IDs.
//!
//! Layout (36 bytes): `cma_version` (0), `ip_version` (upper 4 bits),
//! be16 source port, then source and destination address as 16-byte
//! unions; an IPv4 address sits in the last 4 bytes of its union.

use crate::error::CmError;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Length of the header at the start of a REQ's private data.
pub const CMA_HDR_LEN: usize = 36;
/// rdma_cm's `CMA_VERSION`.
pub const CMA_VERSION: u8 = 0;
/// `RDMA_PS_TCP`: the port space of rping, ucmatose, perftest `-R`.
pub const RDMA_PS_TCP: u16 = 0x0106;
/// `RDMA_PS_UDP`.
pub const RDMA_PS_UDP: u16 = 0x0111;
/// `RDMA_PS_IB`.
pub const RDMA_PS_IB: u16 = 0x013f;

/// rdma_cm's service ID for a port space and port (`rdma_get_service_id`).
pub fn service_id(port_space: u16, port: u16) -> u64 {
    (u64::from(port_space) << 16) | u64::from(port)
}

/// The port of an rdma_cm service ID in `port_space`, if it is one.
pub fn service_port(service_id: u64, port_space: u16) -> Option<u16> {
    if service_id >> 16 == u64::from(port_space) {
        Some(service_id as u16)
    } else {
        None
    }
}

/// The addressing rdma_cm puts in front of a REQ's private data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// Source (active side) address.
    pub src: IpAddr,
    /// Active side's port (its rdma_cm ID's local port).
    pub src_port: u16,
    /// Destination (passive side) address.
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Parses the header at the start of `pd`; the rest is the
    /// application's private data.
    pub fn parse(pd: &[u8]) -> Result<Self, CmError> {
        if pd.len() < CMA_HDR_LEN {
            return Err(CmError::CmaHeader("shorter than 36 bytes"));
        }
        if pd[0] != CMA_VERSION {
            return Err(CmError::CmaHeader("unknown cma_version"));
        }
        let addr = |o: usize| -> Result<IpAddr, CmError> {
            match pd[1] >> 4 {
                4 => Ok(IpAddr::V4(Ipv4Addr::new(
                    pd[o + 12],
                    pd[o + 13],
                    pd[o + 14],
                    pd[o + 15],
                ))),
                6 => {
                    let mut b = [0u8; 16];
                    b.copy_from_slice(&pd[o..o + 16]);
                    Ok(IpAddr::V6(Ipv6Addr::from(b)))
                }
                _ => Err(CmError::CmaHeader("ip_version neither 4 nor 6")),
            }
        };
        Ok(Self {
            src_port: u16::from_be_bytes([pd[2], pd[3]]),
            src: addr(4)?,
            dst: addr(20)?,
        })
    }

    /// The header followed by the application's private data, as the
    /// active side puts it into a REQ (at most 56 application bytes fit).
    pub fn to_private_data(&self, app: &[u8]) -> Result<Vec<u8>, CmError> {
        if self.src.is_ipv4() != self.dst.is_ipv4() {
            return Err(CmError::CmaHeader("mixed IPv4/IPv6 addresses"));
        }
        let max = crate::msg::REQ_PRIVATE_LEN - CMA_HDR_LEN;
        if app.len() > max {
            return Err(CmError::FieldTooLong {
                field: "rdma_cm private data",
                max,
                len: app.len(),
            });
        }
        let mut pd = vec![0u8; CMA_HDR_LEN];
        pd[0] = CMA_VERSION;
        pd[1] = if self.src.is_ipv4() { 0x40 } else { 0x60 };
        pd[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        for (o, a) in [(4, self.src), (20, self.dst)] {
            match a {
                IpAddr::V4(v4) => pd[o + 12..o + 16].copy_from_slice(&v4.octets()),
                IpAddr::V6(v6) => pd[o..o + 16].copy_from_slice(&v6.octets()),
            }
        }
        pd.extend_from_slice(app);
        Ok(pd)
    }
}
