//! What a receiver gets for a frame: the frame's offloads (its virtio-net
//! header, `Frame::hdr`: TSO, a checksum left to finish, the hash report)
//! that the receiving port takes as they are ([`RxOffloads`], which the
//! port's kind sets: a virtio-net port from the features its guest
//! negotiated, `ports::virtio_net`; the other kinds take none), and
//! [`adapt`], which finishes the others before the frame is queued: TSO
//! segmented, the checksum completed, the header cleared. The switch reads
//! no feature bits: only these.

use super::batch::Adapted;
use crate::frame::Frame;
use crate::offload;
use crate::virtio_net::NetHdr;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};

/// The offloads a port's receiver takes as they are (a set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxOffloads(u8);

impl RxOffloads {
    /// None: every frame arrives finished, with a cleared header.
    pub const NONE: Self = RxOffloads(0);
    /// A checksum left to finish (`NEEDS_CSUM`) and the rest of the header
    /// as sent; also needed to take a TSO frame whole.
    pub const CSUM: Self = RxOffloads(1);
    /// TSO frames over IPv4, whole.
    pub const TSO4: Self = RxOffloads(1 << 1);
    /// TSO frames over IPv6, whole.
    pub const TSO6: Self = RxOffloads(1 << 2);
    /// TSO frames with ECN (CWR) whole, where TSO4 or TSO6 allows.
    pub const TSO_ECN: Self = RxOffloads(1 << 3);
    /// The RSS hash, reported in the header.
    pub const HASH_REPORT: Self = RxOffloads(1 << 4);

    /// Whether every offload of `other` is taken.
    pub const fn contains(self, other: Self) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets.
    pub const fn union(self, other: Self) -> Self {
        RxOffloads(self.0 | other.0)
    }

    /// The set as bits (for an atomic).
    pub(super) const fn bits(self) -> u8 {
        self.0
    }

    /// The set of [`bits`](Self::bits).
    pub(super) const fn from_bits(b: u8) -> Self {
        RxOffloads(b)
    }
}

impl std::ops::BitOr for RxOffloads {
    type Output = Self;
    fn bitor(self, other: Self) -> Self {
        self.union(other)
    }
}

/// The frames a receiver taking `rx` gets for `f`: the frame itself, its
/// offloads finished in place (checksum) or its TSO segments.
pub(super) fn adapt(mut f: Frame, rx: RxOffloads) -> Result<Adapted, offload::OffloadError> {
    let h = f.hdr;
    if h.gso_kind() != VIRTIO_NET_HDR_GSO_NONE as u8 {
        let ok = match u32::from(h.gso_kind()) {
            VIRTIO_NET_HDR_GSO_TCPV4 => rx.contains(RxOffloads::TSO4),
            VIRTIO_NET_HDR_GSO_TCPV6 => rx.contains(RxOffloads::TSO6),
            _ => false,
        } && (!h.gso_ecn() || rx.contains(RxOffloads::TSO_ECN))
            && rx.contains(RxOffloads::CSUM);
        if ok {
            return Ok(Adapted::One(f));
        }
        let segs = offload::segment_tcp(&f.data, &h)?;
        crate::buffers::give(f.data);
        return Ok(Adapted::Many(
            segs.into_iter()
                .map(|data| Frame::new(NetHdr::default(), data))
                .collect(),
        ));
    }
    let csum = rx.contains(RxOffloads::CSUM);
    if h.needs_csum() && !csum {
        offload::finish_csum(&mut f.data, h.csum_start, h.csum_offset)?;
        f.hdr = NetHdr::default();
        return Ok(Adapted::One(f));
    }
    if !csum {
        f.hdr = NetHdr::default();
    }
    Ok(Adapted::One(f))
}
