//! Real frames from roce-model/testdata (ConnectX hardware, an IB fabric)
//! must produce no findings.

use roce_model::pcap::*;
use wire_checker::Checker;

#[test]
fn scapy_hardware_vectors_are_clean() {
    let p = read_pcap(&testdata("scapy_roce_hw_vectors.pcap"));
    assert_eq!(p.linktype, LINKTYPE_ETHERNET);
    let mut c = Checker::default();
    for (i, f) in p.records.iter().enumerate() {
        c.observe(i as u64, "hw", f);
    }
    assert_eq!(c.findings(), vec![]);
    let s = c.stats();
    assert_eq!(
        s.roce_packets, 3,
        "CNP (RoCEv2) and a RoCEv1 WRITE ONLY / ACK pair examined"
    );
    // The vectors are unrelated packets (the ACK answers PSN 0xa788c0, the
    // WRITE has 0xa788bc): three unpaired halves, nothing to judge across.
    let flows = c.flows();
    assert_eq!(flows.roce.len(), 3, "{flows:#?}");
    assert!(flows.roce.iter().all(|x| !x.paired));
}

#[test]
fn infiniband_capture_is_clean() {
    let p = read_pcap(&testdata("wireshark-samplecaptures_infiniband.erf.pcap"));
    assert_eq!(p.linktype, LINKTYPE_ERF);
    let mut c = Checker::default();
    for (i, r) in p.records.iter().enumerate() {
        let e = parse_erf(r);
        assert_eq!(e.rtype, ERF_TYPE_INFINIBAND);
        c.observe_ib(i as u64, "ib", e.payload);
    }
    assert_eq!(c.findings(), vec![], "{:#?}", c.flows());
    let flows = c.flows();
    let rc: Vec<_> = flows.roce.iter().filter(|x| x.transport == "rc").collect();
    assert!(!rc.is_empty());
    // SEND ONLY / ACK pairs: every RC connection is paired and counts ACKs.
    for x in &rc {
        assert!(x.paired, "{x:#?}");
        assert!(x.halves.iter().map(|h| h.acks).sum::<u64>() > 0);
    }
}
