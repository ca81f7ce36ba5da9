//! What a virtio-net guest's receiver takes, from the features it
//! negotiated: the port hands the fabric [`rx_offloads`] of them with the
//! features (`PortShared::set_features`), and the fabric finishes the
//! offloads of a frame the receiver does not take (TSO segmented, checksum
//! completed) before queueing it, reading no feature bit itself.

use crate::fabric::RxOffloads;
use crate::virtio_net::bit;
use virtio_bindings::bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_ECN, VIRTIO_NET_F_GUEST_TSO4,
    VIRTIO_NET_F_GUEST_TSO6, VIRTIO_NET_F_HASH_REPORT,
};

/// The offloads a guest that negotiated `features` takes in the frames it
/// receives: `VIRTIO_NET_F_GUEST_CSUM` (partial checksums, needed for
/// TSO frames too), `GUEST_TSO4`, `GUEST_TSO6`, `GUEST_ECN` and
/// `HASH_REPORT`.
pub fn rx_offloads(features: u64) -> RxOffloads {
    [
        (VIRTIO_NET_F_GUEST_CSUM, RxOffloads::CSUM),
        (VIRTIO_NET_F_GUEST_TSO4, RxOffloads::TSO4),
        (VIRTIO_NET_F_GUEST_TSO6, RxOffloads::TSO6),
        (VIRTIO_NET_F_GUEST_ECN, RxOffloads::TSO_ECN),
        (VIRTIO_NET_F_HASH_REPORT, RxOffloads::HASH_REPORT),
    ]
    .into_iter()
    .filter(|&(f, _)| features & bit(f) != 0)
    .fold(RxOffloads::NONE, |s, (_, o)| s | o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_feature_gives_its_offload() {
        assert_eq!(rx_offloads(0), RxOffloads::NONE);
        let all = bit(VIRTIO_NET_F_GUEST_CSUM)
            | bit(VIRTIO_NET_F_GUEST_TSO4)
            | bit(VIRTIO_NET_F_GUEST_TSO6)
            | bit(VIRTIO_NET_F_GUEST_ECN)
            | bit(VIRTIO_NET_F_HASH_REPORT);
        let r = rx_offloads(all | bit(VIRTIO_NET_F_GUEST_TSO4 + 40));
        for o in [
            RxOffloads::CSUM,
            RxOffloads::TSO4,
            RxOffloads::TSO6,
            RxOffloads::TSO_ECN,
            RxOffloads::HASH_REPORT,
        ] {
            assert!(r.contains(o), "{o:?}");
        }
        let csum = rx_offloads(bit(VIRTIO_NET_F_GUEST_CSUM));
        assert!(csum.contains(RxOffloads::CSUM) && !csum.contains(RxOffloads::TSO4));
    }
}
