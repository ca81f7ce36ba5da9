//! The plain types both erdma test drivers use: this crate's in-process
//! one (`common/mod.rs`) and vfio-user-server's over the vfio-user edge
//! (`vfio-user-server/tests/common/erdma.rs`, by `#[path]`).

/// A ring in guest memory and the driver's consumer index on it.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    pub addr: u64,
    pub depth: u32,
    pub ci: u32,
    pub dbrec: u64,
}

impl Ring {
    /// A fresh ring (consumer index 0).
    pub fn new(addr: u64, depth: u32, dbrec: u64) -> Self {
        Ring {
            addr,
            depth,
            ci: 0,
            dbrec,
        }
    }
}

/// A decoded work CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wc {
    pub opcode: u8,
    pub qtype: u8,
    pub syndrome: u8,
    pub qe_idx: u32,
    pub qpn: u32,
    /// Immediate data (the le32 field, as the driver reads it).
    pub imm: u32,
    pub size: u32,
    pub ud_info: u32,
}

/// IPv4-mapped GID (erdma has RoCEv2 GIDs only).
pub fn v4_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}
