//! Random and mutated frames never panic, and every placement covers the
//! frame exactly once.

mod common;

use std::net::Ipv4Addr;

use common::{assert_covers, v4, v6, Rng};
use devmem_nic::{
    Action, Delivery, FlowMatch, FlowRule, HdsConfig, IpMatch, Masked, Nic, NicConfig, QueueConfig,
    Reason, RssConfig,
};
use wire::builder::{FrameBuilder, Ipv6Ext};
use wire::parse;

fn fuzz_nic() -> Nic {
    let mut nic = Nic::new(NicConfig {
        num_queues: 4,
        queue: QueueConfig {
            header_buf_size: 128,
            payload_buf_size: 512,
            hds: HdsConfig {
                enabled: true,
                thresh: 0,
            },
            max_payload_buffers: 16,
            max_frame_len: 4096,
        },
        ..NicConfig::default()
    })
    .unwrap();
    nic.set_rss(Some(RssConfig::equal(4))).unwrap();
    nic.add_rule(FlowRule {
        id: 1,
        priority: 0,
        matcher: FlowMatch {
            dst_port: Some(Masked::exact(5201)),
            ..FlowMatch::default()
        },
        action: Action::Queue(3),
    })
    .unwrap();
    nic.add_rule(FlowRule {
        id: 2,
        priority: 1,
        matcher: FlowMatch {
            src_ip: Some(IpMatch::v4_prefix(Ipv4Addr::new(10, 0, 0, 0), 8)),
            ..FlowMatch::default()
        },
        action: Action::Drop,
    })
    .unwrap();
    for q in 0..4 {
        for id in 0..8 {
            nic.post_header(q, id).unwrap();
        }
        for id in 0..32 {
            nic.post_payload(q, id).unwrap();
        }
    }
    nic
}

fn check(nic: &mut Nic, frame: &[u8]) {
    let p = parse(frame);
    if let Some(end) = p.split_point() {
        assert!(end <= frame.len() && p.l3_end <= frame.len());
    }
    let out = nic.receive(frame);
    assert_eq!(out.decision, nic.classify(frame));
    match out.delivery {
        Delivery::Placed(pl) => {
            assert_covers(&pl, frame.len());
            assert_eq!(Some(pl.queue), out.decision.queue);
            nic.recycle(&pl).unwrap();
        }
        Delivery::Dropped(_) => {}
    }
    if let Reason::Rss { bucket, .. } = out.decision.reason {
        assert!(bucket < 128);
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut nic = fuzz_nic();
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    for _ in 0..20_000 {
        let len = rng.below(300);
        let mut f = rng.bytes(len);
        // Bias towards IP ethertypes so deeper layers get exercised.
        if len >= 14 {
            match rng.below(4) {
                0 => f[12..14].copy_from_slice(&[0x08, 0x00]),
                1 => f[12..14].copy_from_slice(&[0x86, 0xdd]),
                2 => f[12..14].copy_from_slice(&[0x81, 0x00]),
                _ => {}
            }
        }
        check(&mut nic, &f);
    }
    // Lengths around the limits, including > max_frame_len and empty.
    for len in [0, 1, 13, 14, 17, 18, 33, 34, 53, 54, 4096, 4097, 9000] {
        check(&mut nic, &vec![0x45; len]);
    }
}

#[test]
fn mutated_valid_frames_never_panic() {
    let mut nic = fuzz_nic();
    let mut rng = Rng(42);
    let mut e6 = FrameBuilder::tcp(v6("2001:db8::1"), 1, v6("2001:db8::2"), 5201);
    e6.ipv6_ext = vec![
        Ipv6Ext::HopByHop,
        Ipv6Ext::Routing2("2001:db8::3".parse().unwrap()),
        Ipv6Ext::HomeAddress("2001:db8::4".parse().unwrap()),
        Ipv6Ext::Fragment {
            offset: 0,
            more: false,
        },
    ];
    let mut tagged = FrameBuilder::udp(v4([192, 168, 0, 1]), 53, v4([192, 168, 0, 2]), 53);
    tagged.vlan_tci = Some(5);
    tagged.ipv4_options = vec![1, 1, 1, 1, 1, 1, 1, 0];
    let seeds: Vec<Vec<u8>> = vec![
        FrameBuilder::tcp(v4([10, 0, 0, 1]), 1, v4([10, 0, 0, 2]), 5201).build(&[1; 200]),
        FrameBuilder::tcp(v4([11, 0, 0, 1]), 1, v4([10, 0, 0, 2]), 80).build(&[2; 1500]),
        e6.build(&[3; 700]),
        tagged.build(&[4; 64]),
    ];
    for i in 0..20_000 {
        let mut f = seeds[i % seeds.len()].clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(f.len().min(120));
            f[at] = rng.next() as u8;
        }
        if rng.below(3) == 0 {
            let cut = rng.below(f.len() + 1);
            f.truncate(cut);
        }
        check(&mut nic, &f);
    }
    let c = *nic.counters();
    assert_eq!(c.frames_in, 20_000);
    assert_eq!(c.delivered + c.drop_rule + c.drop_queue, c.frames_in);
}
