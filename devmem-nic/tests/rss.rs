//! RSS through whole frames: hash-type selection, Microsoft vectors,
//! indirection, unclassified queue, hash_report, virtio config parsing.

mod common;

use common::{v4, v6};
use devmem_nic::{
    hash_types as ht, toeplitz_hash, HashConfig, HashReport, Nic, NicConfig, NicError, Reason,
    RssConfig, RssLimits, DEFAULT_RSS_KEY,
};
use wire::builder::{FrameBuilder, Ipv6Ext, Transport};

#[path = "common/rss_vectors.rs"]
mod rss_vectors;
use rss_vectors::{V4, V6};

fn rss_nic(queues: u16, types: u32) -> Nic {
    let mut nic = Nic::new(NicConfig {
        num_queues: queues,
        ..NicConfig::default()
    })
    .unwrap();
    let mut rss = RssConfig::equal(queues);
    rss.hash.hash_types = types;
    nic.set_rss(Some(rss)).unwrap();
    nic
}

fn rss_of(nic: &Nic, frame: &[u8]) -> (u32, HashReport) {
    let d = nic.classify(frame);
    match d.reason {
        Reason::Rss {
            hash,
            bucket,
            hash_type,
        } => {
            assert_eq!(hash, d.hash_value);
            assert_eq!(hash_type, d.hash_report);
            assert_eq!(bucket, hash as usize & 127);
            assert_eq!(d.queue, Some(nic.rss().unwrap().indirection_table[bucket]));
            (hash, hash_type)
        }
        r => panic!("expected an RSS decision, got {r:?}"),
    }
}

#[test]
fn microsoft_vectors_ipv4_frames() {
    let nic = rss_nic(4, ht::ALL);
    for (s, sp, d, dp, h_ip, h_tcp) in V4 {
        let tcp = FrameBuilder::tcp(v4(s), sp, v4(d), dp).build(b"hello");
        assert_eq!(rss_of(&nic, &tcp), (h_tcp, HashReport::Tcpv4));
        // ICMP: no ports, so the IPv4 2-tuple.
        let icmp = FrameBuilder::new(v4(s), v4(d), Transport::Other(1)).build(&[8, 0, 0, 0]);
        assert_eq!(rss_of(&nic, &icmp), (h_ip, HashReport::Ipv4));
        // UDP hashes over the same 4-tuple layout.
        let udp = FrameBuilder::udp(v4(s), sp, v4(d), dp).build(b"x");
        assert_eq!(rss_of(&nic, &udp), (h_tcp, HashReport::Udpv4));
    }
}

#[test]
fn microsoft_vectors_ipv6_frames() {
    let nic = rss_nic(4, ht::ALL);
    for (s, sp, d, dp, h_ip, h_tcp) in V6 {
        let tcp = FrameBuilder::tcp(v6(s), sp, v6(d), dp).build(b"hello");
        assert_eq!(rss_of(&nic, &tcp), (h_tcp, HashReport::Tcpv6));
        let other = FrameBuilder::new(v6(s), v6(d), Transport::Other(58)).build(&[128, 0, 0, 0]);
        assert_eq!(rss_of(&nic, &other), (h_ip, HashReport::Ipv6));
        let udp = FrameBuilder::udp(v6(s), sp, v6(d), dp).build(b"x");
        assert_eq!(rss_of(&nic, &udp), (h_tcp, HashReport::Udpv6));
    }
}

#[test]
fn hash_type_selection_follows_enabled_bits() {
    let (s, sp, d, dp, h_ip, h_tcp) = V4[0];
    let tcp = FrameBuilder::tcp(v4(s), sp, v4(d), dp).build(b"p");
    let udp = FrameBuilder::udp(v4(s), sp, v4(d), dp).build(b"p");
    // TCP disabled: falls back to IPv4.
    let nic = rss_nic(2, ht::IPV4 | ht::UDPV4);
    assert_eq!(rss_of(&nic, &tcp), (h_ip, HashReport::Ipv4));
    assert_eq!(rss_of(&nic, &udp), (h_tcp, HashReport::Udpv4));
    // Only TCP enabled: UDP and ICMP are unclassified.
    let nic = rss_nic(2, ht::TCPV4);
    assert_eq!(rss_of(&nic, &tcp), (h_tcp, HashReport::Tcpv4));
    let d = nic.classify(&udp);
    assert_eq!(d.reason, Reason::Unclassified);
    assert_eq!(d.queue, Some(0));
    assert_eq!(d.hash_report, HashReport::None);
    assert_eq!(d.hash_value, 0);
    // IPv6 types do not apply to IPv4.
    let nic = rss_nic(2, ht::IPV6 | ht::TCPV6 | ht::IP_EX);
    assert_eq!(nic.classify(&tcp).reason, Reason::Unclassified);
}

#[test]
fn fragments_options_and_vlan() {
    let (s, sp, d, dp, h_ip, h_tcp) = V4[1];
    let nic = rss_nic(4, ht::ALL);
    let mut b = FrameBuilder::tcp(v4(s), sp, v4(d), dp);
    // First fragment (MF set) carries the TCP header but hashes as IP only.
    b.ipv4_fragment = (0, true);
    assert_eq!(rss_of(&nic, &b.build(b"data")), (h_ip, HashReport::Ipv4));
    b.ipv4_fragment = (100, false);
    assert_eq!(rss_of(&nic, &b.build(b"data")), (h_ip, HashReport::Ipv4));
    // IPv4 options are skipped.
    b.ipv4_fragment = (0, false);
    b.ipv4_options = vec![1, 1, 1, 0x94, 4, 0, 0]; // NOPs + Router Alert
    assert_eq!(rss_of(&nic, &b.build(b"data")), (h_tcp, HashReport::Tcpv4));
    // One VLAN tag is skipped.
    b.vlan_tci = Some(0x2064);
    assert_eq!(rss_of(&nic, &b.build(b"data")), (h_tcp, HashReport::Tcpv4));
    // IPv6 fragment header: IP only (IP_EX when enabled, since it is an ext header).
    let (s6, sp6, d6, dp6, h6_ip, _) = V6[0];
    let mut b6 = FrameBuilder::tcp(v6(s6), sp6, v6(d6), dp6);
    b6.ipv6_ext = vec![Ipv6Ext::Fragment {
        offset: 0,
        more: true,
    }];
    let frag6 = b6.build(b"data");
    assert_eq!(rss_of(&nic, &frag6), (h6_ip, HashReport::Ipv6Ex));
    let nic_noex = rss_nic(4, ht::IPV6 | ht::TCPV6);
    assert_eq!(rss_of(&nic_noex, &frag6), (h6_ip, HashReport::Ipv6));
}

#[test]
fn ipv6_extension_header_types() {
    let (s, sp, d, dp, h_ip, h_tcp) = V6[0];
    let home: std::net::Ipv6Addr = "2001:db8::100".parse().unwrap();
    let care: std::net::Ipv6Addr = "2001:db8::200".parse().unwrap();
    let mut b = FrameBuilder::tcp(v6(s), sp, v6(d), dp);

    // Extension headers without HAO/RT2: EX types over the plain addresses.
    b.ipv6_ext = vec![Ipv6Ext::HopByHop];
    let nic = rss_nic(4, ht::ALL);
    assert_eq!(rss_of(&nic, &b.build(b"x")), (h_tcp, HashReport::Tcpv6Ex));
    // Without EX bits the non-EX rules apply, skipping the ext headers.
    let nic6 = rss_nic(4, ht::IPV6 | ht::TCPV6 | ht::UDPV6);
    assert_eq!(rss_of(&nic6, &b.build(b"x")), (h_tcp, HashReport::Tcpv6));

    // Home Address option and type 2 Routing header replace src and dst.
    b.ipv6_ext = vec![
        Ipv6Ext::HopByHop,
        Ipv6Ext::Routing2(care),
        Ipv6Ext::HomeAddress(home),
    ];
    let frame = b.build(b"x");
    let mut input = Vec::new();
    input.extend_from_slice(&home.octets());
    input.extend_from_slice(&care.octets());
    let ip_ex = toeplitz_hash(&DEFAULT_RSS_KEY, &input);
    input.extend_from_slice(&sp.to_be_bytes());
    input.extend_from_slice(&dp.to_be_bytes());
    let tcp_ex = toeplitz_hash(&DEFAULT_RSS_KEY, &input);
    assert_eq!(rss_of(&nic, &frame), (tcp_ex, HashReport::Tcpv6Ex));
    assert_eq!(
        rss_of(&rss_nic(4, ht::IP_EX | ht::TCPV6), &frame),
        (ip_ex, HashReport::Ipv6Ex),
        "IP_EX is tried before the non-EX TCPv6 rule"
    );
    assert_eq!(
        rss_of(&rss_nic(4, ht::TCPV6 | ht::IPV6), &frame),
        (h_tcp, HashReport::Tcpv6),
        "without EX bits the fixed-header addresses are used"
    );
    // UDP_EX.
    let mut u = FrameBuilder::udp(v6(s), sp, v6(d), dp);
    u.ipv6_ext = vec![Ipv6Ext::HomeAddress(home)];
    let mut input = Vec::new();
    input.extend_from_slice(&home.octets());
    input.extend_from_slice(&v6_octets(d));
    input.extend_from_slice(&sp.to_be_bytes());
    input.extend_from_slice(&dp.to_be_bytes());
    assert_eq!(
        rss_of(&nic, &u.build(b"x")),
        (toeplitz_hash(&DEFAULT_RSS_KEY, &input), HashReport::Udpv6Ex)
    );
    // No ext headers: EX bits alone do not apply.
    let plain = FrameBuilder::tcp(v6(s), sp, v6(d), dp).build(b"x");
    assert_eq!(
        rss_nic(4, ht::IP_EX | ht::TCP_EX).classify(&plain).reason,
        Reason::Unclassified
    );
    let _ = h_ip;
}

fn v6_octets(s: &str) -> [u8; 16] {
    s.parse::<std::net::Ipv6Addr>().unwrap().octets()
}

#[test]
fn indirection_and_unclassified_queue() {
    let mut nic = Nic::new(NicConfig {
        num_queues: 4,
        ..NicConfig::default()
    })
    .unwrap();
    let rss = RssConfig {
        hash: HashConfig::default(),
        indirection_table: vec![3, 2, 1, 0],
        unclassified_queue: 2,
    };
    nic.set_rss(Some(rss)).unwrap();
    for (s, sp, d, dp, _, h_tcp) in V4 {
        let f = FrameBuilder::tcp(v4(s), sp, v4(d), dp).build(b"");
        let dec = nic.classify(&f);
        let bucket = (h_tcp & 3) as usize;
        assert_eq!(
            dec.reason,
            Reason::Rss {
                hash: h_tcp,
                bucket,
                hash_type: HashReport::Tcpv4
            }
        );
        assert_eq!(dec.queue, Some(3 - bucket as u16));
        assert_eq!(dec.hash_report.code(), 2);
    }
    // ARP is never hashed: unclassified queue.
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.extend_from_slice(&[0; 28]);
    let d = nic.classify(&arp);
    assert_eq!((d.queue, d.reason), (Some(2), Reason::Unclassified));
    // RSS off: default queue, no hash unless a hash config is set.
    nic.set_rss(None).unwrap();
    let f = FrameBuilder::tcp(v4(V4[0].0), V4[0].1, v4(V4[0].2), V4[0].3).build(b"");
    let d = nic.classify(&f);
    assert_eq!(
        (d.queue, d.reason, d.hash_report),
        (Some(0), Reason::Default, HashReport::None)
    );
    nic.set_hash_config(Some(HashConfig::default())).unwrap();
    let d = nic.classify(&f);
    assert_eq!((d.queue, d.reason), (Some(0), Reason::Default));
    assert_eq!((d.hash_report, d.hash_value), (HashReport::Tcpv4, V4[0].5));
}

#[test]
fn rss_validation() {
    let mut nic = Nic::new(NicConfig {
        num_queues: 2,
        ..NicConfig::default()
    })
    .unwrap();
    let mut r = RssConfig::equal(2);
    r.indirection_table = vec![0, 1, 0];
    assert_eq!(
        nic.set_rss(Some(r.clone())),
        Err(NicError::BadIndirectionTable { len: 3, max: 128 })
    );
    r.indirection_table = vec![0; 256];
    assert!(matches!(
        nic.set_rss(Some(r.clone())),
        Err(NicError::BadIndirectionTable { .. })
    ));
    r.indirection_table = vec![];
    assert!(matches!(
        nic.set_rss(Some(r.clone())),
        Err(NicError::BadIndirectionTable { .. })
    ));
    r.indirection_table = vec![0, 2];
    assert_eq!(
        nic.set_rss(Some(r.clone())),
        Err(NicError::NoSuchQueue {
            queue: 2,
            num_queues: 2
        })
    );
    r.indirection_table = vec![1];
    r.unclassified_queue = 5;
    assert!(matches!(
        nic.set_rss(Some(r.clone())),
        Err(NicError::NoSuchQueue { queue: 5, .. })
    ));
    r.unclassified_queue = 1;
    r.hash.key = vec![0; 41];
    assert_eq!(
        nic.set_rss(Some(r.clone())),
        Err(NicError::KeyTooLong { len: 41, max: 40 })
    );
    r.hash.key = vec![0; 40];
    r.hash.hash_types = 1 << 9;
    assert_eq!(
        nic.set_rss(Some(r.clone())),
        Err(NicError::UnsupportedHashTypes(1 << 9))
    );
    r.hash.hash_types = ht::ALL;
    nic.set_rss(Some(r)).unwrap();

    // A device advertising a 52-byte key accepts one.
    let mut big = Nic::new(NicConfig {
        num_queues: 2,
        rss_limits: RssLimits {
            max_key_size: 52,
            ..RssLimits::default()
        },
        ..NicConfig::default()
    })
    .unwrap();
    let mut r = RssConfig::equal(2);
    r.hash.key = vec![0x6d; 52];
    big.set_rss(Some(r)).unwrap();
}

#[test]
fn virtio_rss_config_bytes() {
    let mut b = Vec::new();
    b.extend_from_slice(&(ht::TCPV4 | ht::IPV4).to_le_bytes());
    b.extend_from_slice(&3u16.to_le_bytes()); // mask: 4 entries
    b.extend_from_slice(&1u16.to_le_bytes()); // unclassified
    for q in [0u16, 1, 2, 3] {
        b.extend_from_slice(&q.to_le_bytes());
    }
    b.extend_from_slice(&4u16.to_le_bytes()); // max_tx_vq
    b.push(40);
    b.extend_from_slice(&DEFAULT_RSS_KEY);
    let (cfg, max_tx) = RssConfig::from_virtio_bytes(&b).unwrap();
    assert_eq!(max_tx, 4);
    assert_eq!(cfg.indirection_table, vec![0, 1, 2, 3]);
    assert_eq!(cfg.unclassified_queue, 1);
    assert_eq!(cfg.hash.hash_types, ht::TCPV4 | ht::IPV4);
    assert_eq!(cfg.hash.key, DEFAULT_RSS_KEY.to_vec());
    for cut in 0..b.len() {
        assert!(matches!(
            RssConfig::from_virtio_bytes(&b[..cut]),
            Err(NicError::Truncated { .. })
        ));
    }

    let mut h = Vec::new();
    h.extend_from_slice(&ht::ALL.to_le_bytes());
    h.extend_from_slice(&[0; 8]);
    h.push(2);
    h.extend_from_slice(&[0xaa, 0xbb]);
    let hc = HashConfig::from_virtio_bytes(&h).unwrap();
    assert_eq!((hc.hash_types, hc.key), (ht::ALL, vec![0xaa, 0xbb]));
    assert!(HashConfig::from_virtio_bytes(&h[..14]).is_err());
}
