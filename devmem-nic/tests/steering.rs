//! Flow rules: priority, insertion order, masks, removal, limits, and their
//! place before RSS.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use common::{nic_with_buffers, v4, v6};
use devmem_nic::{
    Action, Delivery, DropReason, FlowMatch, FlowRule, IpMatch, Masked, Nic, NicConfig, NicError,
    QueueConfig, Reason, RssConfig,
};
use wire::builder::FrameBuilder;
use wire::ethernet::ETHERTYPE_IPV6;
use wire::ip::{IPPROTO_TCP, IPPROTO_UDP};

fn nic(queues: u16) -> Nic {
    Nic::new(NicConfig {
        num_queues: queues,
        max_rules: 8,
        ..NicConfig::default()
    })
    .unwrap()
}

fn rule(id: u32, priority: u32, matcher: FlowMatch, action: Action) -> FlowRule {
    FlowRule {
        id,
        priority,
        matcher,
        action,
    }
}

fn tcp4(dst_port: u16) -> Vec<u8> {
    FrameBuilder::tcp(v4([10, 0, 0, 1]), 40000, v4([10, 0, 0, 2]), dst_port).build(b"payload")
}

fn dport(p: u16) -> FlowMatch {
    FlowMatch {
        dst_port: Some(Masked::exact(p)),
        ..FlowMatch::default()
    }
}

#[test]
fn priority_then_insertion_order() {
    let mut n = nic(8);
    // Overlapping rules: a broad one added first with a worse priority.
    let broad = FlowMatch {
        dst_ip: Some(IpMatch::v4_prefix(Ipv4Addr::new(10, 0, 0, 0), 8)),
        ..FlowMatch::default()
    };
    n.add_rule(rule(1, 10, broad, Action::Queue(1))).unwrap();
    n.add_rule(rule(2, 5, dport(5201), Action::Queue(2)))
        .unwrap();
    // Same priority as rule 2, inserted later: loses the tie.
    n.add_rule(rule(3, 5, dport(5201), Action::Queue(3)))
        .unwrap();
    let order: Vec<u32> = n.rules().iter().map(|r| r.id).collect();
    assert_eq!(order, vec![2, 3, 1]);

    let d = n.classify(&tcp4(5201));
    assert_eq!((d.queue, d.reason), (Some(2), Reason::Rule { id: 2 }));
    let d = n.classify(&tcp4(80));
    assert_eq!((d.queue, d.reason), (Some(1), Reason::Rule { id: 1 }));

    // Removing the winner exposes the tie-loser, then the broad rule.
    assert_eq!(n.remove_rule(2).unwrap().id, 2);
    assert_eq!(n.classify(&tcp4(5201)).reason, Reason::Rule { id: 3 });
    n.remove_rule(3).unwrap();
    assert_eq!(n.classify(&tcp4(5201)).reason, Reason::Rule { id: 1 });
    assert_eq!(n.remove_rule(3), Err(NicError::NoSuchRule(3)));
    n.remove_rule(1).unwrap();
    assert_eq!(n.classify(&tcp4(5201)).reason, Reason::Default);

    // A later-inserted rule with a better priority wins over an earlier one.
    n.add_rule(rule(10, 100, dport(5201), Action::Queue(4)))
        .unwrap();
    n.add_rule(rule(11, 1, dport(5201), Action::Queue(5)))
        .unwrap();
    assert_eq!(n.classify(&tcp4(5201)).queue, Some(5));
}

#[test]
fn masks_and_edge_cases() {
    let mut n = nic(8);
    // Port mask: 0x1f00 matches 0x1400..=0x14ff (5120..=5375).
    let masked_port = FlowMatch {
        dst_port: Some(Masked {
            value: 0x1400,
            mask: 0xff00,
        }),
        ..FlowMatch::default()
    };
    n.add_rule(rule(1, 0, masked_port, Action::Queue(1)))
        .unwrap();
    assert_eq!(n.classify(&tcp4(0x1400)).queue, Some(1));
    assert_eq!(n.classify(&tcp4(0x14ff)).queue, Some(1));
    assert_eq!(n.classify(&tcp4(0x1500)).queue, Some(0));
    assert_eq!(n.classify(&tcp4(0x13ff)).queue, Some(0));
    n.remove_rule(1).unwrap();

    // Bits outside the mask in the rule value are ignored.
    let sloppy = FlowMatch {
        dst_port: Some(Masked {
            value: 0x14ff,
            mask: 0xff00,
        }),
        ..FlowMatch::default()
    };
    n.add_rule(rule(2, 0, sloppy, Action::Queue(2))).unwrap();
    assert_eq!(n.classify(&tcp4(0x1401)).queue, Some(2));
    n.remove_rule(2).unwrap();

    // Zero mask = wildcard on the value, but the layer must exist: a port
    // rule never matches ICMP, fragments or ARP.
    let any_port = FlowMatch {
        dst_port: Some(Masked { value: 0, mask: 0 }),
        ..FlowMatch::default()
    };
    n.add_rule(rule(3, 0, any_port, Action::Queue(3))).unwrap();
    assert_eq!(n.classify(&tcp4(1)).queue, Some(3));
    let udp = FrameBuilder::udp(v4([1, 1, 1, 1]), 53, v4([2, 2, 2, 2]), 9).build(b"q");
    assert_eq!(n.classify(&udp).queue, Some(3), "ports match UDP too");
    let icmp = FrameBuilder::new(
        v4([1, 1, 1, 1]),
        v4([2, 2, 2, 2]),
        wire::builder::Transport::Other(1),
    )
    .build(&[8, 0, 0, 0]);
    assert_eq!(n.classify(&icmp).queue, Some(0));
    let mut frag = FrameBuilder::tcp(v4([10, 0, 0, 1]), 1, v4([10, 0, 0, 2]), 2);
    frag.ipv4_fragment = (0, true);
    assert_eq!(
        n.classify(&frag.build(b"x")).queue,
        Some(0),
        "fragments have no ports"
    );
    n.remove_rule(3).unwrap();

    // IPv4 /0 matches any IPv4 but never IPv6; /32 is exact; /31 covers two.
    let any_v4 = FlowMatch {
        src_ip: Some(IpMatch::v4_prefix(Ipv4Addr::UNSPECIFIED, 0)),
        ..FlowMatch::default()
    };
    n.add_rule(rule(4, 0, any_v4, Action::Queue(4))).unwrap();
    let t6 = FrameBuilder::tcp(v6("2001:db8::1"), 1, v6("2001:db8::2"), 5201).build(b"x");
    assert_eq!(n.classify(&tcp4(9)).queue, Some(4));
    assert_eq!(n.classify(&t6).queue, Some(0));
    n.remove_rule(4).unwrap();
    let pair = FlowMatch {
        dst_ip: Some(IpMatch::v4_prefix(Ipv4Addr::new(10, 0, 0, 3), 31)),
        ..FlowMatch::default()
    };
    n.add_rule(rule(5, 0, pair, Action::Queue(5))).unwrap();
    assert_eq!(
        n.classify(&tcp4(1)).queue,
        Some(5),
        "10.0.0.2 is in 10.0.0.2/31"
    );
    n.remove_rule(5).unwrap();

    // IPv6 prefix + protocol + ethertype + MAC masks combined.
    let v6rule = FlowMatch {
        dst_mac: Some(Masked {
            value: [0x52, 0x54, 0, 0, 0, 0],
            mask: [0xff, 0xff, 0, 0, 0, 0],
        }),
        ethertype: Some(ETHERTYPE_IPV6),
        dst_ip: Some(IpMatch::v6_prefix(
            "2001:db8::".parse::<Ipv6Addr>().unwrap(),
            64,
        )),
        ip_proto: Some(IPPROTO_TCP),
        dst_port: Some(Masked::exact(5201)),
        ..FlowMatch::default()
    };
    n.add_rule(rule(6, 0, v6rule, Action::Queue(6))).unwrap();
    assert_eq!(n.classify(&t6).queue, Some(6));
    let u6 = FrameBuilder::udp(v6("2001:db8::1"), 1, v6("2001:db8::2"), 5201).build(b"x");
    assert_eq!(n.classify(&u6).queue, Some(0), "protocol differs");
    let other_net = FrameBuilder::tcp(v6("2001:db8::1"), 1, v6("2001:db9::2"), 5201).build(b"x");
    assert_eq!(n.classify(&other_net).queue, Some(0), "prefix differs");
    let mut other_mac = FrameBuilder::tcp(v6("2001:db8::1"), 1, v6("2001:db8::2"), 5201);
    other_mac.dst_mac = [0x02, 0, 0, 0, 0, 1];
    assert_eq!(
        n.classify(&other_mac.build(b"x")).queue,
        Some(0),
        "MAC differs"
    );
    other_mac.dst_mac = [0x52, 0x54, 9, 9, 9, 9];
    assert_eq!(
        n.classify(&other_mac.build(b"x")).queue,
        Some(6),
        "masked MAC bytes ignored"
    );
    // The ethertype is the one behind the VLAN tag.
    let mut tagged = FrameBuilder::tcp(v6("2001:db8::1"), 1, v6("2001:db8::2"), 5201);
    tagged.vlan_tci = Some(7);
    assert_eq!(n.classify(&tagged.build(b"x")).queue, Some(6));

    // Source MAC and UDP protocol.
    let src_mac = FlowMatch {
        src_mac: Some(Masked::exact([0x52, 0x54, 0, 0, 0, 0x0b])),
        ip_proto: Some(IPPROTO_UDP),
        ..FlowMatch::default()
    };
    n.add_rule(rule(7, 0, src_mac, Action::Queue(7))).unwrap();
    assert_eq!(n.classify(&udp).queue, Some(7));
}

#[test]
fn limits_and_errors() {
    let mut n = nic(2);
    for id in 0..8 {
        n.add_rule(rule(id, id, dport(id as u16), Action::Queue(1)))
            .unwrap();
    }
    assert_eq!(
        n.add_rule(rule(100, 0, dport(1), Action::Drop)),
        Err(NicError::RuleTableFull { max: 8 })
    );
    n.remove_rule(0).unwrap();
    assert_eq!(
        n.add_rule(rule(1, 0, dport(1), Action::Drop)),
        Err(NicError::DuplicateRule(1))
    );
    assert_eq!(
        n.add_rule(rule(100, 0, dport(1), Action::Queue(2))),
        Err(NicError::NoSuchQueue {
            queue: 2,
            num_queues: 2
        })
    );
    n.add_rule(rule(100, 0, dport(1), Action::Drop)).unwrap();
    assert_eq!(n.rules().len(), 8);
}

#[test]
fn rules_apply_before_rss_and_drop_is_counted() {
    let mut n = nic_with_buffers(4, QueueConfig::default(), 8, 8);
    n.set_rss(Some(RssConfig::equal(4))).unwrap();
    n.add_rule(rule(7, 0, dport(5201), Action::Queue(3)))
        .unwrap();
    n.add_rule(rule(8, 0, dport(22), Action::Drop)).unwrap();

    let out = n.receive(&tcp4(5201));
    assert_eq!(out.decision.reason, Reason::Rule { id: 7 });
    assert_eq!(out.decision.queue, Some(3));
    // The hash is still reported for the virtio header.
    assert_eq!(out.decision.hash_report, devmem_nic::HashReport::Tcpv4);
    assert!(matches!(out.delivery, Delivery::Placed(ref p) if p.queue == 3));

    let out = n.receive(&tcp4(22));
    assert_eq!(out.decision.queue, None);
    assert_eq!(out.delivery, Delivery::Dropped(DropReason::Rule { id: 8 }));
    assert_eq!(n.counters().drop_rule, 1);
    assert_eq!(n.rule_hits(8), Some(1));
    assert_eq!(n.rule_hits(7), Some(1));

    let out = n.receive(&tcp4(80));
    assert!(matches!(out.decision.reason, Reason::Rss { .. }));
    assert_eq!(n.counters().frames_in, 3);
    assert_eq!(n.counters().delivered, 2);
}
