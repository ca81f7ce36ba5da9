//! wire's frame parsing and devmem-nic: steering (`Nic::classify`: flow rules, RSS
//! from guest-supplied virtio bytes, hash reporting) and header-split
//! placement (`Nic::receive`) on arbitrary frames and configurations.
//!
//! Invariants: parsed offsets lie inside the frame and are ordered;
//! classification is deterministic, side-effect free and names an existing
//! queue; `receive` agrees with `classify`; a placement's segments cover the
//! frame exactly once, in order, within buffer sizes, with the header buffer
//! ending at `split_at` when split; counters add up; placed buffers recycle.
#![no_main]

use devmem_nic::{
    Action, Delivery, FlowMatch, FlowRule, HashConfig, HdsConfig, Masked, Nic, NicConfig,
    QueueConfig, Reason, RssConfig,
};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use wire::parse;

fn check_parsed(frame: &[u8]) {
    let p = parse(frame);
    if p.l3.is_some() {
        assert!(p.l3_offset <= p.l3_end && p.l3_end <= frame.len(), "{p:?}");
        let h = p.l3_header_end().unwrap();
        assert!(
            h <= frame.len(),
            "IP header end {h} beyond frame {}: {p:?}",
            frame.len()
        );
    }
    if p.l4.is_some() {
        assert!(p.l3.is_some());
        let e = p.l4_header_end().unwrap();
        assert!(p.l4_offset >= p.l3_offset && e <= frame.len(), "{p:?}");
    }
    if let Some(s) = p.split_point() {
        assert!(s <= frame.len());
        assert!(p.l4_payload_len().unwrap() <= frame.len() - s);
    }
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let num_queues = u.int_in_range(1u16..=4)?;
    let queue = QueueConfig {
        header_buf_size: u.int_in_range(1usize..=512)?,
        payload_buf_size: u.int_in_range(1usize..=4096)?,
        hds: HdsConfig {
            enabled: u.arbitrary()?,
            thresh: u.int_in_range(0usize..=2000)?,
        },
        max_payload_buffers: u.int_in_range(1usize..=64)?,
        max_frame_len: u.int_in_range(0usize..=70_000)?,
    };
    let Ok(mut nic) = Nic::new(NicConfig {
        num_queues,
        default_queue: u.int_in_range(0..=num_queues - 1)?,
        queue,
        ..NicConfig::default()
    }) else {
        return Ok(());
    };
    // Guest-controlled RSS / hash configuration (virtio-net control commands).
    match u.int_in_range(0u8..=2)? {
        0 => {
            let n = u.int_in_range(0usize..=120)?;
            if let Ok((rss, _max_tx)) = RssConfig::from_virtio_bytes(u.bytes(n)?) {
                let _ = nic.set_rss(Some(rss));
            }
        }
        1 => {
            let n = u.int_in_range(0usize..=60)?;
            if let Ok(h) = HashConfig::from_virtio_bytes(u.bytes(n)?) {
                let _ = nic.set_hash_config(Some(h));
            }
        }
        _ => {}
    }
    if u.arbitrary()? {
        let q: u16 = u.int_in_range(0..=num_queues)?; // may be out of range
        let rule = FlowRule {
            id: u.arbitrary()?,
            priority: u.arbitrary()?,
            matcher: FlowMatch {
                ip_proto: u.arbitrary()?,
                dst_port: u.arbitrary::<Option<u16>>()?.map(Masked::exact),
                ethertype: u.arbitrary()?,
                ..FlowMatch::default()
            },
            action: if u.arbitrary()? {
                Action::Drop
            } else {
                Action::Queue(q)
            },
        };
        let _ = nic.add_rule(rule);
    }
    for q in 0..num_queues {
        for id in 0..4 {
            nic.post_header(q, id).unwrap();
        }
        for id in 100..(100 + u.int_in_range(0u32..=64)?) {
            nic.post_payload(q, id).unwrap();
        }
    }
    let cfg = queue;
    let mut frames = 0u64;
    while !u.is_empty() {
        let len = u.int_in_range(0usize..=3000)?;
        let frame = u.bytes(len.min(u.len()))?;
        check_parsed(frame);
        let d = nic.classify(frame);
        assert_eq!(d, nic.classify(frame), "classify not deterministic");
        assert_eq!(d, nic.classify_parsed(&parse(frame)));
        if let Some(q) = d.queue {
            assert!(q < num_queues, "queue {q} of {num_queues}: {d:?}");
        } else {
            assert!(matches!(d.reason, Reason::Rule { .. }));
        }
        let out = nic.receive(frame);
        frames += 1;
        assert_eq!(out.decision, d);
        if let Delivery::Placed(p) = &out.delivery {
            assert_eq!(Some(p.queue), d.queue);
            let mut at = 0;
            for s in p.segments() {
                assert_eq!(s.frame_range.start, at, "segments not contiguous: {p:?}");
                assert!(s.frame_range.end >= s.frame_range.start);
                at = s.frame_range.end;
            }
            assert_eq!(at, frame.len(), "segments do not cover the frame: {p:?}");
            if let Some(h) = &p.header {
                assert!(h.frame_range.len() <= cfg.header_buf_size);
                if let Some(s) = p.split_at {
                    assert_eq!(h.frame_range.end, s);
                }
            } else {
                assert!(p.split_at.is_none());
            }
            for s in &p.payload {
                assert!(s.frame_range.len() <= cfg.payload_buf_size);
            }
            assert!(p.payload.len() <= cfg.max_payload_buffers);
            if u.arbitrary()? {
                nic.recycle(p).expect("placed buffers recycle");
            }
        }
    }
    let c = nic.counters();
    assert_eq!(c.frames_in, frames);
    assert_eq!(c.delivered + c.drop_rule + c.drop_queue, frames, "{c:?}");
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
