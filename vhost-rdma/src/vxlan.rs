//! VXLAN (RFC 7348) encapsulation for `kind=vxlan` uplink ports, sans-IO:
//! header build and parse, the VNI check, which configured remote VTEPs a
//! frame goes to (learned inner MAC, else all of them: head-end
//! replication), the size rules (`df=`) and the counters. The UDP socket
//! and its thread live in [`crate::ports::uplink`].
//!
//! What goes on the wire is exactly what a Linux `vxlan` netdev sends and
//! expects: an 8-byte header (flags `0x08`, the I bit, then a 24-bit VNI)
//! in front of the inner Ethernet frame (no FCS), in a UDP datagram.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;
use wire::ethernet::ETH_HLEN;
use wire::vxlan::VXLAN_HLEN;

/// Bytes VXLAN over IPv4 adds around an inner frame on the underlay: outer
/// IPv4 (20) + UDP (8) + VXLAN (8) + the inner Ethernet header (14), which
/// the underlay MTU does not count for the outer frame but must carry for
/// the inner one. A guest MTU of `underlay MTU - 50` fits.
pub const ENCAP_OVERHEAD: usize = 50;
/// Underlay MTU assumed unless `mtu=` says otherwise (an Ethernet path).
pub const DEFAULT_UNDERLAY_MTU: u32 = 1500;
/// Largest UDP payload over IPv4 (65535 - 20 - 8): what one datagram can
/// carry at all, fragmented or not.
pub const MAX_UDP_PAYLOAD: usize = 65507;
/// Largest inner frame with `df=unset`: one datagram's payload less the
/// VXLAN header. (Equal to the `df=set` bound at `mtu=65535`.)
pub const MAX_FRAGMENTED_INNER: usize = MAX_UDP_PAYLOAD - VXLAN_HLEN;
/// VNI used unless `vni=` says otherwise.
pub const DEFAULT_VNI: u32 = 1;
/// Largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;
/// Inner MACs remembered per uplink (which remote VTEP they sit behind);
/// beyond it, frames to unlearned MACs go to every remote.
pub const MAX_LEARNED: usize = 4096;
/// The I flag: the VNI field is valid (RFC 7348 section 5).
const FLAG_I: u8 = 0x08;

/// Why a datagram from the underlay was not passed to the fabric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RxDrop {
    /// Sent from an address that is not a configured remote.
    #[error("datagram from {0}, which is not a configured remote")]
    UnknownSource(SocketAddr),
    /// Shorter than the VXLAN header plus an Ethernet header.
    #[error("datagram of {0} bytes is too short for VXLAN and an Ethernet header")]
    Short(usize),
    /// The I flag is clear (or reserved flags are set, as some other
    /// protocol on the port would).
    #[error("VXLAN flags {0:#04x}: the I flag must be the only one set")]
    BadFlags(u8),
    /// A VNI other than this port's.
    #[error("VNI {got}, this port is VNI {want}")]
    WrongVni { got: u32, want: u32 },
    /// The inner frame is larger than the path MTU allows.
    #[error("inner frame of {len} bytes exceeds {max} (underlay MTU {mtu})")]
    Oversized { len: usize, max: usize, mtu: u32 },
}

/// Why a frame from the fabric was not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TxDrop {
    /// `df=set`: too large for one unfragmented packet on the underlay
    /// path MTU.
    #[error(
        "frame of {len} bytes does not fit VXLAN over underlay MTU {mtu} (largest inner frame \
         {max}): set the guest MTU to {guest_mtu} or less, or raise the port's mtu=, or let \
         the kernel fragment with df=unset"
    )]
    Oversized {
        len: usize,
        max: usize,
        mtu: u32,
        guest_mtu: u32,
    },
    /// `df=unset`: too large even for a fragmented datagram.
    #[error(
        "frame of {len} bytes does not fit one VXLAN datagram even fragmented (largest inner \
         frame {max}, a {MAX_UDP_PAYLOAD}-byte UDP payload)"
    )]
    BeyondFragmentation { len: usize, max: usize },
    /// Shorter than an Ethernet header.
    #[error("frame of {0} bytes is shorter than an Ethernet header")]
    Short(usize),
}

/// Builds the VXLAN header for `vni`.
pub fn header(vni: u32) -> [u8; VXLAN_HLEN] {
    let v = (vni & MAX_VNI).to_be_bytes();
    [FLAG_I, 0, 0, 0, v[1], v[2], v[3], 0]
}

/// Parses a VXLAN datagram: its VNI and inner frame.
pub fn parse(datagram: &[u8]) -> Result<(u32, &[u8]), RxDrop> {
    if datagram.len() < VXLAN_HLEN + ETH_HLEN {
        return Err(RxDrop::Short(datagram.len()));
    }
    // RFC 7348: receivers ignore the reserved bits, but a datagram with
    // only reserved bits set is not VXLAN (e.g. VXLAN-GPE or noise): refuse
    // anything but exactly I, as Linux does without extensions.
    if datagram[0] != FLAG_I {
        return Err(RxDrop::BadFlags(datagram[0]));
    }
    let vni = u32::from_be_bytes([0, datagram[4], datagram[5], datagram[6]]);
    Ok((vni, &datagram[VXLAN_HLEN..]))
}

/// Whether the outer IP packets may be fragmented (`df=`, named after the
/// `df` setting of a Linux `vxlan` netdev, whose default is also unset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DontFragment {
    /// `df=unset`: outer IPv4 packets never carry DF, so a datagram larger
    /// than the path MTU is fragmented (by the sending kernel or a router
    /// on the way) and reassembled by the receiving kernel. Guests keep
    /// their default MTU over a 1500-byte underlay, at the cost of two
    /// packets per full-size frame. Frames up to [`MAX_FRAGMENTED_INNER`].
    #[default]
    Unset,
    /// `df=set`: RFC 7348 section 4.3 ("VTEPs MUST NOT fragment"): DF on
    /// every outer packet; a frame whose datagram does not fit `mtu=` is
    /// dropped and counted, and so is an inner frame received larger than
    /// that rule allows.
    Set,
}

impl std::str::FromStr for DontFragment {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "unset" => Ok(DontFragment::Unset),
            "set" => Ok(DontFragment::Set),
            _ => Err(ConfigError::Df),
        }
    }
}

impl std::fmt::Display for DontFragment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DontFragment::Unset => "unset",
            DontFragment::Set => "set",
        })
    }
}

/// Settings of a VXLAN uplink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanConfig {
    /// Address the port's UDP socket binds.
    pub local: SocketAddr,
    /// Remote VTEPs: frames go to these addresses and ports; datagrams are
    /// heard from these IP addresses only (from any source port).
    pub remotes: Vec<SocketAddr>,
    /// VXLAN network identifier (24 bits).
    pub vni: u32,
    /// MTU of the underlay path (outer IP packet): the size rule with
    /// `df=set`; with `df=unset`, what counts a frame as `tx_over_mtu`.
    pub underlay_mtu: u32,
    /// Whether outer packets may be fragmented (`df=`).
    pub df: DontFragment,
}

impl VxlanConfig {
    /// Largest inner Ethernet frame (header included, no FCS) whose
    /// datagram fits one unfragmented packet on the underlay path.
    pub fn unfragmented_inner_frame(&self) -> usize {
        (self.underlay_mtu as usize + ETH_HLEN).saturating_sub(ENCAP_OVERHEAD)
    }

    /// Largest inner frame sent or accepted: one unfragmented packet with
    /// `df=set`, one (fragmented) datagram with `df=unset`.
    pub fn max_inner_frame(&self) -> usize {
        match self.df {
            DontFragment::Set => self.unfragmented_inner_frame(),
            DontFragment::Unset => MAX_FRAGMENTED_INNER,
        }
    }

    /// Checks the VNI, MTU and remote list.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.vni > MAX_VNI {
            return Err(ConfigError::Vni(self.vni));
        }
        // The smallest IPv4 MTU (RFC 791) plus the encapsulation; the UDP
        // length field caps the top.
        if !(576..=65535).contains(&self.underlay_mtu) {
            return Err(ConfigError::Mtu(self.underlay_mtu));
        }
        if self.remotes.is_empty() {
            return Err(ConfigError::NoRemote);
        }
        for (i, r) in self.remotes.iter().enumerate() {
            if r.ip().is_unspecified() || r.port() == 0 {
                return Err(ConfigError::NotUnicast(*r));
            }
            if r.is_ipv4() != self.local.is_ipv4() {
                return Err(ConfigError::MixedIpVersions {
                    remote: *r,
                    local: self.local,
                });
            }
            if self.remotes[..i].contains(r) {
                return Err(ConfigError::RemoteTwice(*r));
            }
        }
        Ok(())
    }
}

/// Why a VXLAN uplink's settings ([`VxlanConfig::check`]) were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The VNI does not fit 24 bits.
    #[error("vni={0} exceeds the 24-bit maximum {MAX_VNI}")]
    Vni(u32),
    /// The underlay MTU is outside what IPv4 and UDP allow.
    #[error("mtu={0} must be between 576 and 65535")]
    Mtu(u32),
    /// `df=` other than `set` or `unset`.
    #[error("df= must be set (RFC 7348: never fragment, drop what does not fit mtu=) or unset (the default: the kernel fragments)")]
    Df,
    /// No remote VTEP.
    #[error("needs at least one remote=IP:PORT")]
    NoRemote,
    /// A remote with the unspecified address or port 0.
    #[error("remote={0} is not a unicast address and port")]
    NotUnicast(SocketAddr),
    /// A remote of the other IP version than `local`.
    #[error("remote={remote} and local={local} are of different IP versions")]
    MixedIpVersions {
        /// The remote.
        remote: SocketAddr,
        /// The local address.
        local: SocketAddr,
    },
    /// The same remote twice.
    #[error("remote={0} is given twice")]
    RemoteTwice(SocketAddr),
}

/// Live counters of a VXLAN uplink (beyond the port's frame counters).
#[derive(Debug, Default)]
pub struct Counters {
    tx_datagrams: AtomicU64,
    tx_oversized: AtomicU64,
    tx_over_mtu: AtomicU64,
    tx_short: AtomicU64,
    tx_send_errors: AtomicU64,
    rx_datagrams: AtomicU64,
    rx_unknown_source: AtomicU64,
    rx_short: AtomicU64,
    rx_bad_flags: AtomicU64,
    rx_wrong_vni: AtomicU64,
    rx_oversized: AtomicU64,
    learned_full: AtomicU64,
}

/// A snapshot of [`Counters`] (`ctl status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanStats {
    /// Datagrams sent (a flooded frame counts once per remote).
    pub tx_datagrams: u64,
    /// Frames from the fabric dropped as too large: beyond `mtu=` with
    /// `df=set`, beyond one datagram (fragmented) with `df=unset`.
    pub tx_oversized: u64,
    /// `df=unset`: frames sent whose outer packet exceeds `mtu=`, left to
    /// IP fragmentation (two or more packets each on a path of that MTU).
    #[serde(default)]
    pub tx_over_mtu: u64,
    /// Frames from the fabric shorter than an Ethernet header.
    pub tx_short: u64,
    /// Datagrams the socket refused to send.
    pub tx_send_errors: u64,
    /// Datagrams received from configured remotes, valid or not.
    pub rx_datagrams: u64,
    /// Datagrams from addresses that are not configured remotes.
    pub rx_unknown_source: u64,
    /// Datagrams too short for VXLAN plus an Ethernet header.
    pub rx_short: u64,
    /// Datagrams without exactly the I flag.
    pub rx_bad_flags: u64,
    /// Datagrams for another VNI.
    pub rx_wrong_vni: u64,
    /// Inner frames larger than [`VxlanConfig::max_inner_frame`] (or
    /// datagrams longer than the receive buffer).
    pub rx_oversized: u64,
    /// Inner MACs not learned because the table was full.
    pub learned_full: u64,
    /// Inner MACs learned now.
    pub learned: u64,
}

/// Where an encapsulated frame goes.
#[derive(Debug, PartialEq, Eq)]
pub struct Egress {
    /// The datagram payload (VXLAN header + inner frame).
    pub datagram: Vec<u8>,
    /// Indices into the configured remotes: the one the destination MAC
    /// was learned behind, else all (broadcast, multicast, unknown unicast).
    pub remotes: Vec<usize>,
}

/// The encapsulation state of one VXLAN uplink: settings, the learned
/// inner-MAC-to-remote table and the counters. Shared by the socket thread
/// and the control socket.
#[derive(Debug)]
pub struct VxlanEndpoint {
    cfg: VxlanConfig,
    learned: RwLock<HashMap<[u8; 6], usize>>,
    counters: Counters,
}

fn add(c: &AtomicU64) {
    c.fetch_add(1, Relaxed);
}

impl VxlanEndpoint {
    /// An endpoint with nothing learned.
    pub fn new(cfg: VxlanConfig) -> Self {
        VxlanEndpoint {
            cfg,
            learned: RwLock::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &VxlanConfig {
        &self.cfg
    }

    /// Encapsulates a frame from the fabric and picks its remotes; counts
    /// and refuses what cannot go.
    pub fn egress(&self, inner: &[u8]) -> Result<Egress, TxDrop> {
        if inner.len() < ETH_HLEN {
            add(&self.counters.tx_short);
            return Err(TxDrop::Short(inner.len()));
        }
        let max = self.cfg.max_inner_frame();
        if inner.len() > max {
            add(&self.counters.tx_oversized);
            return Err(match self.cfg.df {
                DontFragment::Set => TxDrop::Oversized {
                    len: inner.len(),
                    max,
                    mtu: self.cfg.underlay_mtu,
                    guest_mtu: self.cfg.underlay_mtu.saturating_sub(ENCAP_OVERHEAD as u32),
                },
                DontFragment::Unset => TxDrop::BeyondFragmentation {
                    len: inner.len(),
                    max,
                },
            });
        }
        if inner.len() > self.cfg.unfragmented_inner_frame() {
            add(&self.counters.tx_over_mtu);
        }
        let mut datagram = Vec::with_capacity(VXLAN_HLEN + inner.len());
        datagram.extend_from_slice(&header(self.cfg.vni));
        datagram.extend_from_slice(inner);
        let dst: [u8; 6] = inner[0..6].try_into().unwrap_or_default();
        let learned = if dst[0] & 1 == 0 {
            self.learned.read().ok().and_then(|m| m.get(&dst).copied())
        } else {
            None
        };
        let remotes = match learned {
            Some(r) => vec![r],
            None => (0..self.cfg.remotes.len()).collect(),
        };
        Ok(Egress { datagram, remotes })
    }

    /// Counts a datagram sent (or not: `ok` false).
    pub fn sent(&self, ok: bool) {
        add(if ok {
            &self.counters.tx_datagrams
        } else {
            &self.counters.tx_send_errors
        });
    }

    /// Checks a datagram from the underlay and returns its inner frame for
    /// the fabric; learns which remote the inner source MAC sits behind.
    /// `truncated`: the datagram did not fit the receive buffer.
    pub fn ingress<'a>(
        &self,
        from: SocketAddr,
        datagram: &'a [u8],
        truncated: bool,
    ) -> Result<&'a [u8], RxDrop> {
        let Some(remote) = self.remote_index(from) else {
            add(&self.counters.rx_unknown_source);
            return Err(RxDrop::UnknownSource(from));
        };
        add(&self.counters.rx_datagrams);
        let (vni, inner) = parse(datagram).inspect_err(|e| match e {
            RxDrop::Short(_) => add(&self.counters.rx_short),
            _ => add(&self.counters.rx_bad_flags),
        })?;
        if vni != self.cfg.vni {
            add(&self.counters.rx_wrong_vni);
            return Err(RxDrop::WrongVni {
                got: vni,
                want: self.cfg.vni,
            });
        }
        let max = self.cfg.max_inner_frame();
        if truncated || inner.len() > max {
            add(&self.counters.rx_oversized);
            return Err(RxDrop::Oversized {
                len: inner.len(),
                max,
                mtu: self.cfg.underlay_mtu,
            });
        }
        let src: [u8; 6] = inner[6..12].try_into().unwrap_or_default();
        self.learn(src, remote);
        Ok(inner)
    }

    /// The configured remote a datagram came from, by IP address only:
    /// RFC 7348 senders (Linux among them) pick the UDP source port from a
    /// hash of the inner flow, so it says nothing of who sent. IPv4-mapped
    /// IPv6 sources (a dual-stack socket) compare as IPv4.
    fn remote_index(&self, from: SocketAddr) -> Option<usize> {
        let ip = match from.ip() {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
            v4 => v4,
        };
        self.cfg.remotes.iter().position(|r| r.ip() == ip)
    }

    fn learn(&self, src: [u8; 6], remote: usize) {
        if src[0] & 1 != 0 || self.cfg.remotes.len() < 2 {
            // One remote: every frame goes there anyway.
            return;
        }
        if self
            .learned
            .read()
            .is_ok_and(|m| m.get(&src) == Some(&remote))
        {
            return;
        }
        if let Ok(mut m) = self.learned.write() {
            if m.len() >= MAX_LEARNED && !m.contains_key(&src) {
                add(&self.counters.learned_full);
                return;
            }
            m.insert(src, remote);
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> VxlanStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Relaxed);
        VxlanStats {
            tx_datagrams: l(&c.tx_datagrams),
            tx_oversized: l(&c.tx_oversized),
            tx_over_mtu: l(&c.tx_over_mtu),
            tx_short: l(&c.tx_short),
            tx_send_errors: l(&c.tx_send_errors),
            rx_datagrams: l(&c.rx_datagrams),
            rx_unknown_source: l(&c.rx_unknown_source),
            rx_short: l(&c.rx_short),
            rx_bad_flags: l(&c.rx_bad_flags),
            rx_wrong_vni: l(&c.rx_wrong_vni),
            rx_oversized: l(&c.rx_oversized),
            learned_full: l(&c.learned_full),
            learned: self.learned.read().map(|m| m.len() as u64).unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(remotes: &[&str]) -> VxlanConfig {
        VxlanConfig {
            local: "127.0.0.1:4789".parse().unwrap(),
            remotes: remotes.iter().map(|r| r.parse().unwrap()).collect(),
            vni: 42,
            underlay_mtu: DEFAULT_UNDERLAY_MTU,
            df: DontFragment::Set,
        }
    }

    fn frame(dst: u8, src: u8, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[0..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, dst]);
        f[6..12].copy_from_slice(&[0x52, 0x54, 0, 0, 0, src]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        for (i, b) in f.iter_mut().enumerate().skip(14) {
            *b = i as u8;
        }
        f
    }

    /// The header is RFC 7348's: I flag, 24-bit VNI in bytes 4..7, the rest
    /// zero. (Linux sends 08 00 00 00 VV VV VV 00.)
    #[test]
    fn header_layout_matches_rfc_7348() {
        assert_eq!(header(42), [0x08, 0, 0, 0, 0, 0, 42, 0]);
        assert_eq!(header(0xabcdef), [0x08, 0, 0, 0, 0xab, 0xcd, 0xef, 0]);
        let mut d = header(0x123456).to_vec();
        d.extend_from_slice(&frame(1, 2, 60));
        let (vni, inner) = parse(&d).unwrap();
        assert_eq!(vni, 0x123456);
        assert_eq!(inner, &frame(1, 2, 60)[..]);
    }

    #[test]
    fn encap_then_decap_gives_the_frame_back() {
        let a = VxlanEndpoint::new(cfg(&["127.0.0.1:5000"]));
        let f = frame(1, 2, 100);
        let e = a.egress(&f).unwrap();
        assert_eq!(e.remotes, vec![0]);
        assert_eq!(&e.datagram[..8], &header(42));
        let inner = a
            .ingress("127.0.0.1:5000".parse().unwrap(), &e.datagram, false)
            .unwrap();
        assert_eq!(inner, &f[..]);
        assert_eq!(a.stats().rx_datagrams, 1);
    }

    /// `df=set`, 1500 underlay: an inner frame of 1464 bytes (guest MTU
    /// 1450) fits, one more byte does not, counted; `mtu=` moves the bound.
    #[test]
    fn df_set_keeps_the_path_mtu_rule() {
        let a = VxlanEndpoint::new(cfg(&["127.0.0.1:5000"]));
        assert_eq!(a.config().max_inner_frame(), 1464);
        assert!(a.egress(&frame(1, 2, 1464)).is_ok());
        let e = a.egress(&frame(1, 2, 1465)).unwrap_err();
        assert_eq!(
            e,
            TxDrop::Oversized {
                len: 1465,
                max: 1464,
                mtu: 1500,
                guest_mtu: 1450
            }
        );
        assert!(e.to_string().contains("guest MTU to 1450"), "{e}");
        assert_eq!(a.stats().tx_oversized, 1);
        let mut c = cfg(&["127.0.0.1:5000"]);
        c.underlay_mtu = 9000;
        let j = VxlanEndpoint::new(c);
        assert_eq!(j.config().max_inner_frame(), 8964);
        assert!(j.egress(&frame(1, 2, 8964)).is_ok());
        assert!(j.egress(&frame(1, 2, 8965)).is_err());
        // And inbound: a frame a peer with a larger MTU sent is refused.
        let mut d = header(42).to_vec();
        d.extend_from_slice(&frame(1, 2, 1465));
        assert!(matches!(
            a.ingress("127.0.0.1:5000".parse().unwrap(), &d, false),
            Err(RxDrop::Oversized { len: 1465, .. })
        ));
        d.truncate(8 + 100);
        assert!(matches!(
            a.ingress("127.0.0.1:5000".parse().unwrap(), &d, true),
            Err(RxDrop::Oversized { .. })
        ));
        assert_eq!(a.stats().rx_oversized, 2);
    }

    /// `df=unset` (the default): over a 1500 underlay, full-size (1514)
    /// and jumbo frames go out (counted as over `mtu=`: the kernel
    /// fragments them) and are accepted inbound, up to what one UDP
    /// datagram carries; one byte more is dropped and counted both ways.
    #[test]
    fn df_unset_leaves_fragmentation_to_ip_up_to_one_datagram() {
        let mut c = cfg(&["127.0.0.1:5000"]);
        c.df = DontFragment::Unset;
        let a = VxlanEndpoint::new(c);
        let from: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        assert_eq!(a.config().unfragmented_inner_frame(), 1464);
        assert_eq!(a.config().max_inner_frame(), 65499);
        for len in [1464, 1514, 9014, MAX_FRAGMENTED_INNER] {
            let f = frame(1, 2, len);
            let e = a.egress(&f).unwrap();
            assert!(e.datagram.len() <= MAX_UDP_PAYLOAD, "{len}");
            assert_eq!(a.ingress(from, &e.datagram, false), Ok(&f[..]), "{len}");
        }
        assert_eq!(a.stats().tx_over_mtu, 3, "all but the 1464-byte frame");
        let e = a
            .egress(&frame(1, 2, MAX_FRAGMENTED_INNER + 1))
            .unwrap_err();
        assert_eq!(
            e,
            TxDrop::BeyondFragmentation {
                len: 65500,
                max: 65499
            }
        );
        assert!(e.to_string().contains("even fragmented"), "{e}");
        let mut d = header(42).to_vec();
        d.extend_from_slice(&frame(1, 2, MAX_FRAGMENTED_INNER + 1));
        assert!(matches!(
            a.ingress(from, &d, false),
            Err(RxDrop::Oversized { len: 65500, .. })
        ));
        let s = a.stats();
        assert_eq!((s.tx_oversized, s.rx_oversized, s.tx_over_mtu), (1, 1, 3));
        // At mtu=65535 the two rules meet.
        let mut c = cfg(&["127.0.0.1:5000"]);
        c.underlay_mtu = 65535;
        assert_eq!(c.max_inner_frame(), MAX_FRAGMENTED_INNER);
    }

    #[test]
    fn df_parses_as_linux_spells_it() {
        assert_eq!("unset".parse(), Ok(DontFragment::Unset));
        assert_eq!("set".parse(), Ok(DontFragment::Set));
        assert_eq!(DontFragment::default(), DontFragment::Unset);
        assert_eq!(DontFragment::Set.to_string(), "set");
        // Linux's third value copies the inner DF bit; not offered here.
        assert_eq!("inherit".parse::<DontFragment>(), Err(ConfigError::Df));
        assert_eq!(
            serde_json::to_string(&DontFragment::Unset).unwrap(),
            "\"unset\""
        );
    }

    /// Short, garbage, wrong-VNI and stranger datagrams are refused with
    /// their own counters; nothing panics whatever the bytes.
    #[test]
    fn hostile_datagrams_are_counted_and_dropped() {
        let a = VxlanEndpoint::new(cfg(&["127.0.0.1:5000"]));
        let from: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let stranger: SocketAddr = "127.0.0.2:5000".parse().unwrap();
        let mut good = header(42).to_vec();
        good.extend_from_slice(&frame(1, 2, 60));
        assert_eq!(
            a.ingress(stranger, &good, false),
            Err(RxDrop::UnknownSource(stranger))
        );
        // A remote's datagrams come from any source port (flow entropy).
        let other_port: SocketAddr = "127.0.0.1:5001".parse().unwrap();
        assert_eq!(a.ingress(other_port, &good, false), Ok(&good[8..]));
        for n in [0, 1, 7, 8, 21] {
            assert_eq!(a.ingress(from, &good[..n], false), Err(RxDrop::Short(n)));
        }
        let mut bad = good.clone();
        bad[0] = 0x0c; // I plus a GPE-style flag
        assert_eq!(a.ingress(from, &bad, false), Err(RxDrop::BadFlags(0x0c)));
        bad[0] = 0;
        assert_eq!(a.ingress(from, &bad, false), Err(RxDrop::BadFlags(0)));
        let mut other = header(43).to_vec();
        other.extend_from_slice(&frame(1, 2, 60));
        assert_eq!(
            a.ingress(from, &other, false),
            Err(RxDrop::WrongVni { got: 43, want: 42 })
        );
        let s = a.stats();
        assert_eq!(
            (
                s.rx_unknown_source,
                s.rx_short,
                s.rx_bad_flags,
                s.rx_wrong_vni
            ),
            (1, 5, 2, 1)
        );
        assert_eq!(s.rx_datagrams, 9, "strangers are not counted as received");
        // Pseudo-random garbage of every length up to 100: no panic, and
        // what passes is exactly a well-formed VNI-42 datagram.
        let mut x: u32 = 0x1234_5678;
        for len in 0..100 {
            let d: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            if let Ok(inner) = a.ingress(from, &d, false) {
                assert_eq!(&d[..8], &header(42));
                assert_eq!(inner.len(), len - 8);
            }
        }
    }

    /// With several remotes: unknown and broadcast destinations go to all
    /// of them; a MAC heard behind one remote then goes there only.
    #[test]
    fn flood_list_and_learning_per_remote() {
        let a = VxlanEndpoint::new(cfg(&["10.0.0.1:4789", "10.0.0.2:4789", "10.0.0.3:4789"]));
        let f = frame(7, 1, 60);
        assert_eq!(a.egress(&f).unwrap().remotes, vec![0, 1, 2]);
        let mut bcast = f.clone();
        bcast[0..6].fill(0xff);
        assert_eq!(a.egress(&bcast).unwrap().remotes, vec![0, 1, 2]);
        // MAC ..:07 speaks from the second remote.
        let mut d = header(42).to_vec();
        d.extend_from_slice(&frame(1, 7, 60));
        a.ingress("10.0.0.2:4789".parse().unwrap(), &d, false)
            .unwrap();
        assert_eq!(a.egress(&f).unwrap().remotes, vec![1]);
        assert_eq!(a.egress(&bcast).unwrap().remotes, vec![0, 1, 2]);
        // It moves to the third.
        a.ingress("10.0.0.3:4789".parse().unwrap(), &d, false)
            .unwrap();
        assert_eq!(a.egress(&f).unwrap().remotes, vec![2]);
        assert_eq!(a.stats().learned, 1);
    }

    #[test]
    fn config_checks() {
        assert!(cfg(&["127.0.0.1:4789"]).check().is_ok());
        let e = cfg(&[]).check().unwrap_err();
        assert_eq!(e, ConfigError::NoRemote);
        assert!(e.to_string().contains("remote"));
        assert!(cfg(&["0.0.0.0:4789"]).check().is_err());
        assert_eq!(
            cfg(&["[::1]:4789"]).check().unwrap_err().to_string(),
            "remote=[::1]:4789 and local=127.0.0.1:4789 are of different IP versions"
        );
        assert_eq!(
            cfg(&["127.0.0.1:1", "127.0.0.1:1"])
                .check()
                .unwrap_err()
                .to_string(),
            "remote=127.0.0.1:1 is given twice"
        );
        let mut c = cfg(&["127.0.0.1:4789"]);
        c.vni = 1 << 24;
        assert_eq!(
            c.check().unwrap_err().to_string(),
            "vni=16777216 exceeds the 24-bit maximum 16777215"
        );
        c.vni = 1;
        c.underlay_mtu = 100;
        assert_eq!(
            c.check().unwrap_err().to_string(),
            "mtu=100 must be between 576 and 65535"
        );
    }
}
