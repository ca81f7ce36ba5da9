//! Frames and fabrics the fabric's unit tests share.

use super::*;
use crate::config::PortConfig;
use crate::virtio_net::NetHdr;
use std::sync::atomic::Ordering::*;

pub(super) fn frame(tag: u8) -> Frame {
    Frame::new(NetHdr::default(), vec![tag; 64])
}

pub(super) const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 0xa];
pub(super) const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 0xb];

/// Ports A (0) and B (1), with `limit` frames per receive queue, the
/// switch knowing B's MAC (A's frames to it are unicast: back-pressure
/// applies).
pub(super) fn a_and_b(limit: usize) -> Fabric {
    let port = |i: usize, name: &str| {
        let mut cfg = PortConfig::new(name, "");
        cfg.rx_queue_frames = limit;
        let p = PortShared::new(i, cfg, PortProfile::default()).unwrap();
        p.connected.store(true, Relaxed);
        p.rx_queues()[0].enabled.store(true, Relaxed);
        Arc::new(p)
    };
    let f = Fabric::new(vec![port(0, "a"), port(1, "b")]);
    assert_eq!(f.forward(1, arp(MAC_B, [10, 0, 0, 2]), Instant::now()), 1);
    assert_eq!(f.ports[0].rx_queues()[0].clear(), 1);
    f
}

/// A's frame number `t` to B.
pub(super) fn to_b(t: u16) -> Frame {
    udp(MAC_B, MAC_A, [10, 0, 0, 2], 1000 + t)
}

/// Sends frames `ts` from A to B in batch `b`; each must be forwarded.
pub(super) fn send_a_to_b<'a>(f: &'a Fabric, b: &mut Batch<'a>, ts: std::ops::Range<u16>) {
    for t in ts {
        assert!(
            matches!(f.ingress(0, to_b(t), b), Ingress::Forwarded(1)),
            "frame {t}"
        );
    }
}

/// What waits in B's queue, in order.
pub(super) fn at_b(f: &Fabric) -> Vec<Frame> {
    std::iter::from_fn(|| f.ports[1].rx_queues()[0].pop()).collect()
}

pub(super) fn arp(mac: [u8; 6], ip: [u8; 4]) -> Frame {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&[10, 0, 0, 9]);
    Frame::new(NetHdr::default(), f)
}

/// An IPv4 UDP frame to `dport` (4791: RoCEv2).
pub(super) fn udp(dst: [u8; 6], src: [u8; 6], dst_ip: [u8; 4], dport: u16) -> Frame {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 36, 0, 0, 0, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&[10, 0, 0, 1]);
    f.extend_from_slice(&dst_ip);
    f.extend_from_slice(&[0x12, 0x34]);
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 16, 0, 0]);
    f.extend_from_slice(&[0; 8]);
    Frame::new(NetHdr::default(), f)
}
