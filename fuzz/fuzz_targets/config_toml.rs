//! Daemon configuration parsing: the TOML file (`DaemonConfig::from_toml`),
//! the `--port NAME=SOCKET[,k=v...]` command-line form (`PortConfig`'s
//! `FromStr`) and MAC addresses.
//!
//! Invariants: accepted configurations satisfy the documented limits (names
//! of ASCII letters, digits, '-' and '_'; 1..=MAX_QUEUE_PAIRS queue pairs;
//! 1..=1048576 RX queue frames; flow rules that build a steering table);
//! `validate` never panics; a MAC formats back to a string that parses to the
//! same MAC.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vhost_rdma::config::MAX_QUEUE_PAIRS;
use vhost_rdma::steering::PortSteering;
use vhost_rdma::{DaemonConfig, MacAddr, PortConfig};

fn check_port(p: &PortConfig) {
    assert!(!p.name.is_empty());
    assert!(p
        .name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
    assert!((1..=MAX_QUEUE_PAIRS).contains(&p.queue_pairs));
    assert!((1..=1 << 20).contains(&p.rx_queue_frames));
    PortSteering::new(p.queue_pairs, &p.flow_rules).expect("accepted rules build");
    let m: MacAddr = p.mac.to_string().parse().expect("MAC formats back");
    assert_eq!(m, p.mac);
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(cfg) = DaemonConfig::from_toml(s) {
        for p in &cfg.ports {
            check_port(p);
        }
        let _ = cfg.validate();
    }
    if let Ok(p) = s.parse::<PortConfig>() {
        check_port(&p);
    }
    if let Ok(m) = s.parse::<MacAddr>() {
        let again: MacAddr = m.to_string().parse().expect("MAC formats back");
        assert_eq!(again, m);
    }
});
