//! Golden vectors: real frames captured from ConnectX hardware and an IB fabric.

use roce_model::pcap::*;
use roce_model::*;

const SCAPY: &str = "scapy_roce_hw_vectors.pcap";
const IB: &str = "wireshark-samplecaptures_infiniband.erf.pcap";

fn scapy_frames() -> Vec<Vec<u8>> {
    let p = read_pcap(&testdata(SCAPY));
    assert_eq!(p.linktype, LINKTYPE_ETHERNET);
    assert_eq!(p.records.len(), 3);
    p.records
}

#[test]
fn connectx4_cnp() {
    let frames = scapy_frames();
    let f = RoceFrame::parse(&frames[0]).unwrap();
    let NetLayer::Ipv4 { ip, udp, .. } = f.net else {
        panic!("expected IPv4")
    };
    assert_eq!(ip.src, [10, 0, 17, 1]);
    assert_eq!(ip.dst, [10, 0, 18, 1]);
    assert_eq!(ip.tos, 0xc2, "DSCP 48, ECN ECT(0)");
    assert_eq!(udp.src_port, 0, "ConnectX-4 CNP uses UDP source port 0");
    assert_eq!(udp.checksum, 0);
    let p = f.packet;
    assert_eq!(p.bth.opcode, Opcode::Cnp);
    assert_eq!(p.bth.dest_qp, 0x000118);
    assert_eq!(p.bth.pkey, 0xffff);
    assert!(p.bth.becn && !p.bth.fecn, "CNP sets BECN");
    assert_eq!(p.bth.psn, 0);
    assert_eq!(p.payload, &[0u8; 16], "16 reserved bytes");
    assert_eq!(p.icrc, [0x82, 0xfd, 0x00, 0x2a]);
    assert_eq!(p.icrc_value(), 0x2a00_fd82);
    f.verify_icrc().unwrap();
    // The free-function form agrees.
    let eth = 14;
    let crc = icrc_ipv4(
        &frames[0][eth..eth + 20],
        &frames[0][eth + 20..eth + 28],
        &frames[0][eth + 28..frames[0].len() - 4],
    )
    .unwrap();
    assert_eq!(crc.to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);

    // Rebuild the identical frame from its parsed fields.
    let NetLayer::Ipv4 { ip, .. } = f.net else {
        unreachable!()
    };
    let fb = FrameBuilder {
        dst_mac: f.eth.dst,
        src_mac: f.eth.src,
        vlan_tci: None,
        net: NetParams::Ipv4 {
            src: ip.src,
            dst: ip.dst,
            tos: ip.tos,
            ttl: ip.ttl,
            ident: ip.ident,
            udp_src_port: 0,
        },
    };
    let rebuilt = fb.build(&p.to_builder()).unwrap();
    assert_eq!(rebuilt, frames[0]);
}

#[test]
fn rocev1_write_only_and_ack() {
    let frames = scapy_frames();

    let w = RoceFrame::parse(&frames[1]).unwrap();
    assert_eq!(w.eth.ethertype, ::wire::ethernet::ETHERTYPE_ROCE_V1);
    let NetLayer::Grh { grh, .. } = w.net else {
        panic!("expected GRH")
    };
    assert_eq!(grh.version, 6);
    assert_eq!(grh.traffic_class, 2);
    assert_eq!(grh.next_header, 0x1b);
    assert_eq!(grh.hop_limit, 0x40);
    assert_eq!(grh.payload_len, 0x28);
    let p = w.packet;
    assert_eq!(p.bth.opcode, Opcode::RcWriteOnly);
    assert!(p.bth.mig, "Mellanox sets MigReq");
    assert!(p.bth.ack_req);
    assert_eq!(p.bth.pad_cnt, 3);
    assert_eq!(p.bth.dest_qp, 0x10a);
    assert_eq!(p.bth.psn, 0xa788bc);
    let reth = p.ext.reth.unwrap();
    assert_eq!(reth.va, 0x0000_55d4_c072_6000);
    assert_eq!(reth.rkey, 0x47b3);
    assert_eq!(reth.len, 5);
    assert_eq!(p.payload, &[0, 0, 0, 0, 1]);
    assert_eq!(p.pad, &[0, 0, 0]);
    w.verify_icrc().unwrap();

    let a = RoceFrame::parse(&frames[2]).unwrap();
    let p = a.packet;
    assert_eq!(p.bth.opcode, Opcode::RcAcknowledge);
    assert_eq!(p.bth.dest_qp, 0x109);
    assert_eq!(p.bth.psn, 0xa788c0);
    let aeth = p.ext.aeth.unwrap();
    // Mellanox hardware advertises credit code 0 here, not rxe's 0x1F.
    assert_eq!(aeth.syndrome, AethSyndrome::Ack { credits: 0 });
    assert_eq!(aeth.msn, 5);
    assert!(p.payload.is_empty());
    a.verify_icrc().unwrap();

    // Rebuild both frames byte for byte.
    for (f, raw) in [(w, &frames[1]), (a, &frames[2])] {
        let NetLayer::Grh { grh, .. } = f.net else {
            unreachable!()
        };
        let fb = FrameBuilder {
            dst_mac: f.eth.dst,
            src_mac: f.eth.src,
            vlan_tci: None,
            net: NetParams::Grh {
                sgid: grh.src,
                dgid: grh.dst,
                traffic_class: grh.traffic_class,
                flow_label: grh.flow_label,
                hop_limit: grh.hop_limit,
            },
        };
        assert_eq!(&fb.build(&f.packet.to_builder()).unwrap(), raw);
    }
}

#[test]
fn every_scapy_frame_breaks_on_any_byte_flip_after_ethernet() {
    for raw in scapy_frames() {
        for i in 14..raw.len() {
            let mut m = raw.clone();
            m[i] ^= 0x81;
            let ok = RoceFrame::parse(&m).map(|f| f.verify_icrc().is_ok());
            // Masked fields (IP TOS/TTL/checksum, GRH TC/FL/HL, BTH byte 4) may flip freely.
            let masked = if raw[12] == 0x08 {
                matches!(i - 14, 1 | 8 | 10 | 11)
                    || i == 14 + 20 + 6
                    || i == 14 + 20 + 7
                    || i == 14 + 28 + 4
            } else {
                matches!(i - 14, 1..=3 | 7) || i == 14 + 40 + 4
            };
            if masked {
                assert_eq!(ok, Ok(true), "byte {i} is masked");
            } else {
                assert_ne!(ok, Ok(true), "byte {i} flip went unnoticed");
            }
        }
    }
}

fn ib_frames() -> Vec<Vec<u8>> {
    let p = read_pcap(&testdata(IB));
    assert_eq!(p.linktype, LINKTYPE_ERF);
    p.records
        .iter()
        .map(|r| {
            let e = parse_erf(r);
            assert_eq!(e.rtype, ERF_TYPE_INFINIBAND);
            e.payload.to_vec()
        })
        .collect()
}

#[test]
fn infiniband_capture_all_crcs_verify() {
    let frames = ib_frames();
    assert_eq!(frames.len(), 43);
    let (mut local, mut global) = (0, 0);
    for (i, raw) in frames.iter().enumerate() {
        let f = IbFrame::parse(raw).unwrap_or_else(|e| panic!("frame {}: {e}", i + 1));
        f.verify_icrc()
            .unwrap_or_else(|e| panic!("frame {} ICRC: {e}", i + 1));
        assert_eq!(f.verify_vcrc(), Ok(true), "frame {} VCRC", i + 1);
        match f.grh {
            None => local += 1,
            Some(parsed_grh) => {
                global += 1;
                // The six GRH frames are IPoIB multicast; with a GRH the LRH is
                // entirely outside the ICRC, VL masking alone does not verify them.
                assert!(f.lrh.dlid >= 0xc000, "multicast DLID");
                let lrh = &raw[..8];
                let grh = &raw[8..48];
                let rest = &raw[48..raw.len() - 6];
                // "LRH with only VL masked, then masked GRH" (the PROTOCOLS.md 1.5
                // reading) does not reproduce the wire ICRC.
                let mut v = lrh.to_vec();
                v[0] |= 0xf0;
                let mut g = grh.to_vec();
                g[0] |= 0x0f;
                g[1..4].fill(0xff);
                g[7] = 0xff;
                v.extend_from_slice(&g);
                v.extend_from_slice(rest);
                v[48 + 4] = 0xff;
                let c = crc::Crc::<u32>::new(&crc::CRC_32_ISO_HDLC).checksum(&v);
                assert_ne!(c, f.packet.icrc_value());
                assert_eq!(
                    icrc_ib(lrh, Some(grh), rest).unwrap(),
                    f.packet.icrc_value()
                );
                assert_eq!(parsed_grh.next_header, 0x1b);
            }
        }
    }
    assert_eq!((local, global), (37, 6));
}

#[test]
fn infiniband_send_ack_pairs() {
    let frames = ib_frames();
    let parsed: Vec<_> = frames.iter().map(|r| IbFrame::parse(r).unwrap()).collect();
    let sends: Vec<_> = parsed
        .iter()
        .filter(|f| f.packet.bth.opcode == Opcode::RcSendOnly)
        .collect();
    let acks: Vec<_> = parsed
        .iter()
        .filter(|f| f.packet.bth.opcode == Opcode::RcAcknowledge)
        .collect();
    assert_eq!((sends.len(), acks.len()), (10, 9));
    let mut msn_by_qp = std::collections::HashMap::new();
    for a in &acks {
        let p = &a.packet;
        let aeth = p.ext.aeth.unwrap();
        assert_eq!(aeth.syndrome, AethSyndrome::Ack { credits: 0x1f });
        assert!(p.payload.is_empty());
        // MSN counts up by one per message on each connection, starting at 1.
        let last = msn_by_qp.entry(p.bth.dest_qp).or_insert(0u32);
        assert_eq!(aeth.msn, *last + 1, "ACK to QP {:#x}", p.bth.dest_qp);
        *last = aeth.msn;
        // Each ACK answers the SEND_ONLY with the same PSN, sent the other way.
        let s = sends
            .iter()
            .find(|s| s.packet.bth.psn == p.bth.psn)
            .expect("matching SEND_ONLY");
        assert!(s.packet.bth.ack_req);
        assert_eq!((s.lrh.slid, s.lrh.dlid), (a.lrh.dlid, a.lrh.slid));
    }
    let mut per_qp: Vec<_> = msn_by_qp.into_iter().collect();
    per_qp.sort();
    assert_eq!(per_qp, vec![(0x6c004a, 2), (0x870408, 6), (0x890408, 1)]);
    // SEND_ONLY payloads are IPoIB: a 4-byte encapsulation header with an ethertype.
    for s in &sends {
        let et = u16::from_be_bytes([s.packet.payload[0], s.packet.payload[1]]);
        assert!(et == 0x0800 || et == 0x86dd);
    }
}

#[test]
fn infiniband_ud_headers() {
    for raw in ib_frames() {
        let f = IbFrame::parse(&raw).unwrap();
        if f.packet.bth.opcode != Opcode::UdSendOnly {
            continue;
        }
        let deth = f.packet.ext.deth.unwrap();
        match f.packet.bth.dest_qp {
            0 => {
                // SMPs: QP0 on VL15 with Q_Key 0.
                assert_eq!(f.lrh.vl, 15);
                assert_eq!(deth.qkey, 0);
            }
            1 => assert_eq!(deth.qkey, Deth::GSI_QKEY),
            _ => {}
        }
    }
}
