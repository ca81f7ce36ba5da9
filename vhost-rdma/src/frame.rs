//! What every stage of the fabric passes around: a frame with its offload
//! header, the direction a stage sees it in, the fabric's clock, and the
//! flow hash. A leaf module: it depends on nothing else in the daemon.

use crate::virtio_net::NetHdr;
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds on a process-wide monotonic clock.
pub fn now_ms() -> u64 {
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// A frame in flight: the Ethernet frame and its offload description.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub hdr: NetHdr,
    pub data: Vec<u8>,
}

/// Which frames of a port a rule sees.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dir {
    /// Frames the guest sent.
    Ingress,
    /// Frames towards the guest.
    Egress,
    /// Both.
    #[default]
    Both,
}

impl Dir {
    /// Whether a rule for `self` sees frames going `d`.
    pub fn covers(self, d: Dir) -> bool {
        self == Dir::Both || self == d
    }
}

impl std::str::FromStr for Dir {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ingress" | "in" => Ok(Dir::Ingress),
            "egress" | "out" => Ok(Dir::Egress),
            "both" => Ok(Dir::Both),
            _ => Err(format!("direction {s:?}: use ingress, egress or both")),
        }
    }
}

/// FNV-1a over IP addresses and L4 ports (0 for non-IP): keeps a flow on one
/// queue.
pub fn flow_hash(f: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= u32::from(x);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    let et = match f.get(12..14) {
        Some(e) => u16::from_be_bytes([e[0], e[1]]),
        None => return 0,
    };
    let (addrs, l4, proto) = match et {
        0x0800 => {
            let ihl = usize::from(f.get(14).copied().unwrap_or(0) & 0xf) * 4;
            (f.get(26..34), 14 + ihl, f.get(23).copied())
        }
        0x86dd => (f.get(22..54), 54, f.get(20).copied()),
        _ => return 0,
    };
    if let Some(a) = addrs {
        eat(a);
    }
    if matches!(proto, Some(6) | Some(17)) {
        if let Some(p) = f.get(l4..l4 + 4) {
            eat(p);
        }
    }
    h
}

/// Whether `f` is a RoCEv2 packet (IPv4 or IPv6, UDP destination port 4791).
pub fn is_rocev2(f: &[u8]) -> bool {
    const ROCE_PORT: u16 = 4791;
    let Some(et) = f.get(12..14).map(|e| u16::from_be_bytes([e[0], e[1]])) else {
        return false;
    };
    let l4 = match et {
        0x0800 if f.get(23) == Some(&17) => {
            14 + usize::from(f.get(14).copied().unwrap_or(0) & 0xf) * 4
        }
        0x86dd if f.get(20) == Some(&17) => 54,
        _ => return false,
    };
    f.get(l4 + 2..l4 + 4)
        .is_some_and(|p| u16::from_be_bytes([p[0], p[1]]) == ROCE_PORT)
}

#[cfg(test)]
mod tests {
    use super::is_rocev2;

    fn udp4(dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[23] = 17;
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    #[test]
    fn rocev2_is_udp_4791_over_ipv4_or_ipv6() {
        assert!(is_rocev2(&udp4(4791)));
        assert!(!is_rocev2(&udp4(4792)));
        let mut tcp = udp4(4791);
        tcp[23] = 6;
        assert!(!is_rocev2(&tcp));
        let mut v6 = vec![0u8; 14 + 40 + 8];
        v6[12..14].copy_from_slice(&0x86ddu16.to_be_bytes());
        v6[20] = 17;
        v6[56..58].copy_from_slice(&4791u16.to_be_bytes());
        assert!(is_rocev2(&v6));
        assert!(!is_rocev2(&udp4(4791)[..36]), "truncated");
        assert!(!is_rocev2(&[]));
    }
}
