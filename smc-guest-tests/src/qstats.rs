//! Per-queue packet counters of a netdev through the `netdev` generic
//! netlink family (`NETDEV_CMD_QSTATS_GET`, scope queue): what
//! `ynl --family netdev --dump qstats-get` shows. Recent virtio_net kernels
//! report per-queue RX/TX packets only there, no longer in `ethtool -S`.

use crate::netlink::{self, NlSocket, NETLINK_GENERIC, NLM_F_DUMP, NLM_F_REQUEST};
use std::io;

const NETDEV_CMD_QSTATS_GET: u8 = 12;
const NETDEV_A_QSTATS_IFINDEX: u16 = 1;
const NETDEV_A_QSTATS_QUEUE_TYPE: u16 = 2;
const NETDEV_A_QSTATS_QUEUE_ID: u16 = 3;
const NETDEV_A_QSTATS_SCOPE: u16 = 4;
const NETDEV_A_QSTATS_RX_PACKETS: u16 = 8;
const NETDEV_A_QSTATS_RX_BYTES: u16 = 9;
const NETDEV_A_QSTATS_TX_PACKETS: u16 = 10;
const NETDEV_A_QSTATS_TX_BYTES: u16 = 11;
const NETDEV_QSTATS_SCOPE_QUEUE: u32 = 1;

/// Counters of one queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// `true` for an RX queue, `false` for TX.
    pub rx: bool,
    pub queue: u32,
    pub packets: u64,
    pub bytes: u64,
}

/// A `uint` attribute (4 or 8 bytes, native endian).
fn attr_uint(p: &[u8]) -> Option<u64> {
    match p.len() {
        4 => netlink::attr_u32(p).map(u64::from),
        8 => Some(u64::from_ne_bytes(p.try_into().ok()?)),
        _ => None,
    }
}

/// Per-queue counters of interface `ifindex`, RX queues first, by queue id.
pub fn queue_stats(ifindex: u32) -> io::Result<Vec<QueueStats>> {
    let mut sock = NlSocket::open(NETLINK_GENERIC)?;
    let family = netlink::genl_family_id(&mut sock, "netdev")?;
    let seq = sock.next_seq();
    let msg = netlink::build_genl(
        family,
        NLM_F_REQUEST | NLM_F_DUMP,
        seq,
        NETDEV_CMD_QSTATS_GET,
        1,
        &[
            (NETDEV_A_QSTATS_IFINDEX, &ifindex.to_ne_bytes()),
            (
                NETDEV_A_QSTATS_SCOPE,
                &NETDEV_QSTATS_SCOPE_QUEUE.to_ne_bytes(),
            ),
        ],
    );
    let mut out = Vec::new();
    for m in sock.request(&msg, seq, true)? {
        let Some(a) = m.payload.get(netlink::GENL_HDRLEN..) else {
            continue;
        };
        let get = |t| netlink::find_attr(a, t);
        if get(NETDEV_A_QSTATS_IFINDEX).and_then(netlink::attr_u32) != Some(ifindex) {
            continue;
        }
        let rx = get(NETDEV_A_QSTATS_QUEUE_TYPE).and_then(netlink::attr_u32) == Some(0);
        let (p, b) = if rx {
            (NETDEV_A_QSTATS_RX_PACKETS, NETDEV_A_QSTATS_RX_BYTES)
        } else {
            (NETDEV_A_QSTATS_TX_PACKETS, NETDEV_A_QSTATS_TX_BYTES)
        };
        out.push(QueueStats {
            rx,
            queue: get(NETDEV_A_QSTATS_QUEUE_ID)
                .and_then(netlink::attr_u32)
                .unwrap_or(u32::MAX),
            packets: get(p).and_then(attr_uint).unwrap_or(0),
            bytes: get(b).and_then(attr_uint).unwrap_or(0),
        });
    }
    out.sort_by_key(|q| (!q.rx, q.queue));
    Ok(out)
}
