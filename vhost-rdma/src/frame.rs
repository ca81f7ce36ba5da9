//! What every stage of the fabric passes around: a frame with its offload
//! header, the direction a stage sees it in, the fabric's clock, and the
//! flow hash, and the parsed view of a frame ([`FrameView`]). A leaf module:
//! it depends on nothing else in the daemon but the virtio-net header.

use crate::virtio_net::NetHdr;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::OnceLock;
use std::time::Instant;

/// Milliseconds on a process-wide monotonic clock.
pub fn now_ms() -> u64 {
    ms_at(Instant::now())
}

/// `t` in milliseconds on the clock of [`now_ms`] (0 before its start).
pub fn ms_at(t: Instant) -> u64 {
    since_start(t).as_millis() as u64
}

/// `t` in nanoseconds on the clock of [`now_ms`] (0 before its start).
pub fn ns_at(t: Instant) -> u64 {
    u64::try_from(since_start(t).as_nanos()).unwrap_or(u64::MAX)
}

/// The process-wide clock's start: its first use.
fn since_start(t: Instant) -> std::time::Duration {
    static T0: OnceLock<Instant> = OnceLock::new();
    t.saturating_duration_since(*T0.get_or_init(Instant::now))
}

/// The parsed view of a frame: parsed once (by [`view`]), `Copy`, no
/// allocation; steering, RSS, flow rules and faults read it instead of
/// parsing the bytes again. It is the `wire` crate's [`ParsedFrame`], so
/// that the daemon and the NIC models share one parser.
///
/// [`ParsedFrame`]: wire::ParsedFrame
pub type FrameView = wire::ParsedFrame;

/// A frame in flight: the Ethernet frame, its offload description and,
/// once the fabric has parsed it, its view.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    pub hdr: NetHdr,
    pub data: Vec<u8>,
    /// `data`'s view ([`view`]), when the fabric parsed the frame on its
    /// way: a receiver that reads headers (a device port's edge, a virtual
    /// host) takes it instead of parsing again, so that a frame is parsed
    /// once from sender to receiver. None when nothing parsed it yet (a
    /// frame switched on its MAC addresses alone) or its bytes changed
    /// since (TSO segments). Whoever changes `data` after the view was
    /// set clears it; the fabric ignores it at ingress. Boxed: a view is
    /// ~200 bytes and a frame moves through several queues, and only the
    /// frames for receivers that read headers carry one
    /// ([`PortProfile::reads_headers`](crate::fabric::PortProfile)).
    pub view: Option<Box<FrameView>>,
}

impl Frame {
    /// A frame not parsed yet.
    pub fn new(hdr: NetHdr, data: Vec<u8>) -> Self {
        Frame {
            hdr,
            data,
            view: None,
        }
    }

    /// The frame's view: the one it carries, else parsed now (and kept).
    pub fn view(&mut self) -> FrameView {
        **self.view.get_or_insert_with(|| Box::new(view(&self.data)))
    }
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

/// A direction name that is none of `ingress`, `in`, `egress`, `out`, `both`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("direction {0:?}: use ingress, egress or both")]
pub struct DirError(pub String);

impl std::str::FromStr for Dir {
    type Err = DirError;
    fn from_str(s: &str) -> Result<Self, DirError> {
        match s {
            "ingress" | "in" => Ok(Dir::Ingress),
            "egress" | "out" => Ok(Dir::Egress),
            "both" => Ok(Dir::Both),
            _ => Err(DirError(s.to_string())),
        }
    }
}

/// Parses a frame once into the view every stage reads ([`wire::parse()`]:
/// Ethernet with at most one 802.1Q/802.1ad tag, IPv4, IPv6 with extension
/// headers, TCP, UDP, RoCEv2 BTH). Never panics.
pub fn view(f: &[u8]) -> FrameView {
    wire::parse(f)
}

/// A frame's view, parsed when a stage first asks for it: a unicast frame
/// between single-queue ports with no rules, faults or RDMA function is
/// switched on its MAC addresses alone and never parsed; otherwise it is
/// parsed once, whichever stages read it.
#[derive(Debug, Default)]
pub struct LazyView(std::cell::OnceCell<FrameView>);

impl LazyView {
    /// A view parsed already.
    pub fn of(v: FrameView) -> Self {
        let c = std::cell::OnceCell::new();
        let _ = c.set(v);
        LazyView(c)
    }

    /// The view of `data`, which must be the frame this view belongs to.
    pub fn get(&self, data: &[u8]) -> &FrameView {
        self.0.get_or_init(|| view(data))
    }

    /// The view, if a stage asked for it.
    pub fn parsed(&self) -> Option<FrameView> {
        self.0.get().copied()
    }
}

/// FNV-1a over IP addresses and L4 ports (0 for non-IP): keeps a flow on one
/// queue. Parses `f`; [`flow_hash_view`] reads a view parsed already.
pub fn flow_hash(f: &[u8]) -> u32 {
    flow_hash_view(&view(f))
}

/// [`flow_hash`] of a parsed frame.
///
/// VLAN-tagged frames hash to 0, as they did when this function read the
/// ethertype at byte 12 itself. Frames the view finds malformed (an IPv4
/// header with a bad version, IHL or total length) hash to 0; fragments hash
/// over the addresses only (they carry no ports) and IPv6 ports are found
/// behind extension headers: keeping every fragment of a flow, and every
/// IPv6 flow, on one queue is what the hash is for.
pub fn flow_hash_view(v: &FrameView) -> u32 {
    if v.vlan().is_some() {
        return 0;
    }
    let (Some(src), Some(dst)) = (v.src_ip(), v.dst_ip()) else {
        return 0;
    };
    let mut h: u32 = 0x811c_9dc5;
    let mut eat = |b: &[u8]| {
        for &x in b {
            h ^= u32::from(x);
            h = h.wrapping_mul(0x0100_0193);
        }
    };
    for a in [src, dst] {
        match a {
            IpAddr::V4(a) => eat(&a.octets()),
            IpAddr::V6(a) => eat(&a.octets()),
        }
    }
    if let Some((sp, dp)) = v.ports() {
        eat(&sp.to_be_bytes());
        eat(&dp.to_be_bytes());
    }
    h
}

/// Whether `f` is a RoCEv2 packet (IPv4 or IPv6, UDP destination port 4791).
/// Parses `f`; [`is_rocev2_view`] reads a view parsed already.
pub fn is_rocev2(f: &[u8]) -> bool {
    is_rocev2_view(&view(f))
}

/// [`is_rocev2`] of a parsed frame. A VLAN-tagged frame is not RoCEv2 here,
/// as before the view existed: the fabric switches untagged frames to the
/// erdma functions only.
pub fn is_rocev2_view(v: &FrameView) -> bool {
    v.vlan().is_none() && v.is_rocev2()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wire::builder::FrameBuilder;

    fn udp4(dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
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
        v6[14] = 0x60;
        v6[18..20].copy_from_slice(&8u16.to_be_bytes());
        v6[20] = 17;
        v6[56..58].copy_from_slice(&4791u16.to_be_bytes());
        assert!(is_rocev2(&v6));
        assert!(!is_rocev2(&udp4(4791)[..36]), "truncated");
        assert!(!is_rocev2(&[]));
        // Tagged: not RoCEv2 for the fabric, as before.
        let mut tagged = udp4(4791);
        tagged.splice(12..12, [0x81, 0x00, 0, 5]);
        assert!(view(&tagged).is_rocev2() && !is_rocev2(&tagged));
    }

    /// The hash as it was computed from the bytes before the view: the
    /// reference the view-based hash must reproduce for well-formed frames.
    fn flow_hash_bytes(f: &[u8]) -> u32 {
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

    #[test]
    fn flow_hash_of_the_view_is_the_old_hash() {
        let addrs: [(IpAddr, IpAddr); 2] = [
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()),
            ("fe80::1".parse().unwrap(), "2001:db8::9".parse().unwrap()),
        ];
        for (a, b) in addrs {
            for (sp, dp) in [(1, 2), (40000, 5201), (4791, 4791), (0, 65535)] {
                for tcp in [false, true] {
                    let mut fb = if tcp {
                        FrameBuilder::tcp(a, sp, b, dp)
                    } else {
                        FrameBuilder::udp(a, sp, b, dp)
                    };
                    for opts in [vec![], vec![1, 1, 1, 1, 1, 1, 1, 1]] {
                        fb.ipv4_options = opts;
                        let f = fb.build(b"some payload");
                        assert_eq!(flow_hash(&f), flow_hash_bytes(&f), "{a} {sp} {b} {dp}");
                        assert_ne!(flow_hash(&f), 0);
                    }
                    fb.vlan_tci = Some(9);
                    assert_eq!(flow_hash(&fb.build(b"")), 0, "tagged");
                }
            }
            let f = FrameBuilder::new(a, b, wire::builder::Transport::Other(47)).build(b"gre");
            assert_eq!(flow_hash(&f), flow_hash_bytes(&f), "addresses only");
        }
        assert_eq!(flow_hash(&[0u8; 60]), 0, "not IP");
        assert_eq!(flow_hash(&[]), 0);
    }

    #[test]
    fn directions_parse() {
        assert_eq!("in".parse::<Dir>(), Ok(Dir::Ingress));
        assert_eq!(
            "up".parse::<Dir>().unwrap_err().to_string(),
            "direction \"up\": use ingress, egress or both"
        );
    }
}
