//! Guest-controlled steering in vhost-rdma (`steering::PortSteering`): the
//! virtio-net control commands VIRTIO_NET_CTRL_MQ_RSS_CONFIG and
//! VIRTIO_NET_CTRL_MQ_HASH_CONFIG with arbitrary payloads, device resets,
//! then per-frame queue selection (`steer`) and accounting (`record`).
//!
//! Invariants: a successful RSS_CONFIG returns `max_tx_vq` in
//! `1..=queue_pairs`; `steer` is deterministic and picks an existing queue
//! pair (0 when the chosen one is not enabled); a hash report of NONE comes
//! with a zero hash; reset turns RSS off.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use vhost_rdma::steering::PortSteering;

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let qps = u.int_in_range(1u16..=16)?;
    let st = PortSteering::new(qps, &[]).expect("steering");
    let enabled_mask: u16 = u.arbitrary()?;
    let enabled = |q: usize| enabled_mask & (1 << q) != 0;
    while !u.is_empty() {
        match u.int_in_range(0u8..=5)? {
            0 => {
                let n = u.int_in_range(0usize..=300)?;
                let b = u.bytes(n.min(u.len()))?;
                if let Ok(m) = st.set_rss_from_guest(b, qps) {
                    assert!((1..=qps).contains(&m));
                    assert!(st.rss_on());
                }
            }
            1 => {
                let n = u.int_in_range(0usize..=60)?;
                let b = u.bytes(n.min(u.len()))?;
                let _ = st.set_hash_from_guest(b);
            }
            2 => {
                st.reset_guest_config();
                assert!(!st.rss_on());
            }
            _ => {
                let n = u.int_in_range(0usize..=1600)?;
                let frame = u.bytes(n.min(u.len()))?;
                let active = u.int_in_range(0usize..=20)?;
                let s = st.steer(frame, active, enabled);
                let t = st.steer(frame, active, enabled);
                assert_eq!(
                    (s.queue, s.hash_value, s.hash_report),
                    (t.queue, t.hash_value, t.hash_report)
                );
                if let Some(q) = s.queue {
                    assert!(q < usize::from(qps), "queue {q} of {qps}");
                    assert!(q == 0 || enabled(q), "queue {q} not enabled");
                }
                if s.hash_report == 0 {
                    assert_eq!(s.hash_value, 0);
                }
                st.record(&s, u.arbitrary()?);
            }
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
