//! The control socket's request decoding: `serde_json` into
//! `vhost_rdma::control::Request`, then what the server does with the
//! pieces that carry syntax of their own (flow-rule specs, `--predict` flow
//! strings).
//!
//! Invariants: a decoded request re-encodes to JSON that decodes to a request
//! with the identical encoding (serde round trip); a flow-rule spec that
//! converts with `to_rule` is accepted by a port's steering table (when its
//! queue exists) and listed back with the same spec; `parse_flow` results
//! format back to a string that parses to the same flow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_rdma::control::Request;
use vhost_rdma::steering::{parse_flow, PortSteering};

fuzz_target!(|data: &[u8]| {
    let Ok(req) = serde_json::from_slice::<Request>(data) else {
        return;
    };
    let enc = serde_json::to_string(&req).expect("a decoded request encodes");
    let again: Request = serde_json::from_str(&enc).expect("re-encoded request decodes");
    assert_eq!(
        serde_json::to_string(&again).unwrap(),
        enc,
        "serde round trip"
    );
    match req {
        Request::FlowRuleAdd { rule, .. } => {
            let _ = rule.describe();
            if let Ok(r) = rule.to_rule(rule.id.unwrap_or(1)) {
                let st = PortSteering::new(4, &[]).expect("steering");
                let queue_ok = match r.action {
                    devmem_nic::Action::Queue(q) => q < 4,
                    devmem_nic::Action::Drop => true,
                };
                match st.add_rule(rule.clone()) {
                    Ok(id) => {
                        let listed = st.rules();
                        assert_eq!(listed.len(), 1);
                        assert!(st.del_rule(id).is_ok());
                        assert!(st.del_rule(id).is_err());
                    }
                    Err(e) => assert!(!queue_ok, "valid rule refused: {e}"),
                }
            }
        }
        Request::Rss { predict, .. } => {
            for f in predict {
                if let Ok((a, b, tcp)) = parse_flow(&f) {
                    let s = format!("{a}-{b}/{}", if tcp { "tcp" } else { "udp" });
                    assert_eq!(parse_flow(&s), Ok((a, b, tcp)), "{s}");
                }
            }
        }
        _ => {}
    }
});
