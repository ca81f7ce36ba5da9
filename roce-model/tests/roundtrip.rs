//! Property tests: build → parse round trips for every opcode and every
//! ICRC scope, single-byte corruption detection, and never-panic fuzzing.

use proptest::prelude::*;
use roce_model::*;

fn arb_opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

fn arb_syndrome() -> impl Strategy<Value = AethSyndrome> {
    (0u8..0x80).prop_map(AethSyndrome::from_byte)
}

/// All headers filled at random; the test keeps those the opcode needs.
fn arb_ext() -> impl Strategy<Value = ExtHeaders> {
    (
        (any::<u32>(), 0u32..1 << 24).prop_map(|(qkey, src_qp)| Deth { qkey, src_qp }),
        (0u8..16, 0u8..4).prop_map(|(placement_type, selectivity)| Feth {
            placement_type,
            selectivity,
        }),
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(va, rkey, len)| Reth {
            va,
            rkey,
            len,
        }),
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
            |(va, rkey, swap_add, compare)| AtomicEth {
                va,
                rkey,
                swap_add,
                compare,
            },
        ),
        any::<u32>(),
        any::<u32>(),
        (arb_syndrome(), 0u32..1 << 24).prop_map(|(syndrome, msn)| Aeth { syndrome, msn }),
        any::<u64>(),
    )
        .prop_map(
            |(deth, feth, reth, atomic_eth, imm, ieth, aeth, orig)| ExtHeaders {
                deth: Some(deth),
                feth: Some(feth),
                reth: Some(reth),
                atomic_eth: Some(atomic_eth),
                imm_dt: Some(ImmDt { imm }),
                ieth: Some(Ieth { rkey: ieth }),
                aeth: Some(aeth),
                atomic_ack_eth: Some(AtomicAckEth { orig }),
            },
        )
}

fn keep_only(ext: ExtHeaders, set: HeaderSet) -> ExtHeaders {
    ExtHeaders {
        deth: ext.deth.filter(|_| set.contains(HeaderSet::DETH)),
        feth: ext.feth.filter(|_| set.contains(HeaderSet::FETH)),
        reth: ext.reth.filter(|_| set.contains(HeaderSet::RETH)),
        atomic_eth: ext
            .atomic_eth
            .filter(|_| set.contains(HeaderSet::ATOMIC_ETH)),
        imm_dt: ext.imm_dt.filter(|_| set.contains(HeaderSet::IMM_DT)),
        ieth: ext.ieth.filter(|_| set.contains(HeaderSet::IETH)),
        aeth: ext.aeth.filter(|_| set.contains(HeaderSet::AETH)),
        atomic_ack_eth: ext
            .atomic_ack_eth
            .filter(|_| set.contains(HeaderSet::ATOMIC_ACK_ETH)),
    }
}

#[derive(Debug, Clone)]
struct Case {
    bth: Bth,
    ext: ExtHeaders,
    payload: Vec<u8>,
}

fn arb_case() -> impl Strategy<Value = Case> {
    (
        arb_opcode(),
        any::<[bool; 6]>(),
        any::<u16>(),
        0u32..1 << 24,
        0u32..1 << 24,
        arb_ext(),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(op, flags, pkey, qp, psn, ext, mut payload)| {
            let info = op.info();
            if let Some(n) = info.payload.fixed_len() {
                payload.resize(n, 0);
            }
            let mut bth = Bth::new(op, qp, psn);
            [bth.se, bth.mig, bth.fecn, bth.becn, bth.ack_req, _] = flags;
            bth.pkey = pkey;
            Case {
                bth,
                ext: keep_only(ext, info.headers),
                payload,
            }
        })
}

/// Outer headers for each ICRC flavour; `variant` picks one.
struct Outer {
    ip4: [u8; 20],
    ip6: [u8; 40],
    udp: [u8; 8],
    lrh: [u8; 8],
}

fn outer(seed: u8) -> Outer {
    let ip4 = wire::Ipv4Header {
        tos: seed,
        total_len: 100,
        ident: u16::from(seed) * 7,
        flags_frag: wire::Ipv4Header::DF,
        ttl: 64,
        protocol: 17,
        checksum: 0,
        src: [10, 0, 0, seed],
        dst: [10, 0, 1, 2],
    }
    .emit();
    let ip6 = wire::Ipv6Header {
        version: 6,
        traffic_class: seed,
        flow_label: u32::from(seed) << 8,
        payload_len: 80,
        next_header: 17,
        hop_limit: 64,
        src: [seed; 16],
        dst: [2; 16],
    }
    .emit();
    let udp = wire::UdpHeader {
        src_port: 0xc000 | u16::from(seed),
        dst_port: ::wire::roce::ROCEV2_PORT,
        len: 80,
        checksum: 0,
    }
    .emit();
    let mut lrh = [0u8; 8];
    wire::Lrh {
        vl: seed & 0xf,
        lver: 0,
        sl: 0,
        lnh: 2,
        dlid: 4,
        pkt_len: 20,
        slid: 1,
    }
    .write(&mut lrh)
    .unwrap();
    Outer { ip4, ip6, udp, lrh }
}

fn scope<'a>(o: &'a Outer, variant: u8) -> IcrcScope<'a> {
    match variant % 5 {
        0 => IcrcScope::Ipv4 {
            ip: &o.ip4,
            udp: &o.udp,
        },
        1 => IcrcScope::Ipv6 {
            ip: &o.ip6,
            udp: &o.udp,
        },
        2 => IcrcScope::Grh(&o.ip6),
        3 => IcrcScope::Ib {
            lrh: &o.lrh,
            grh: None,
        },
        _ => IcrcScope::Ib {
            lrh: &o.lrh,
            grh: Some(&o.ip6),
        },
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn build_parse_roundtrip(case in arb_case(), seed in any::<u8>(), variant in 0u8..5,
                             flip_at in any::<prop::sample::Index>(), flip in 1u8..=255) {
        let o = outer(seed);
        let sc = scope(&o, variant);
        let b = PacketBuilder { bth: case.bth, ext: case.ext, payload: &case.payload };
        let bytes = b.build(&sc).unwrap();
        prop_assert_eq!(bytes.len(), b.wire_len());
        prop_assert_eq!(bytes.len() % 4, 0);

        let p = RocePacket::parse(&bytes).unwrap();
        let mut want_bth = case.bth;
        want_bth.pad_cnt = (case.payload.len().wrapping_neg() & 3) as u8;
        prop_assert_eq!(p.bth, want_bth);
        prop_assert_eq!(p.ext, case.ext);
        prop_assert_eq!(p.payload, &case.payload[..]);
        prop_assert!(p.pad.iter().all(|&x| x == 0));
        p.verify_icrc(&sc).unwrap();
        prop_assert_eq!(p.to_builder().build(&sc).unwrap(), bytes.clone());

        // Any single corrupted byte outside BTH byte 4 must be caught, either
        // by the parser or by the ICRC.
        let i = flip_at.index(bytes.len());
        let mut bad = bytes.clone();
        bad[i] ^= flip;
        let still_ok = RocePacket::parse(&bad).map(|q| q.verify_icrc(&sc).is_ok());
        if i == 4 {
            prop_assert_eq!(still_ok, Ok(true), "BTH byte 4 is masked");
        } else {
            prop_assert_ne!(still_ok, Ok(true), "flip at {} undetected", i);
        }
    }

    #[test]
    fn frame_roundtrip(case in arb_case(), seed in any::<u8>(), v6 in 0u8..3,
                       vlan in proptest::option::of(any::<u16>())) {
        let net = match v6 {
            0 => NetParams::Ipv4 { src: [192, 168, 0, seed], dst: [192, 168, 1, 1], tos: seed,
                                   ttl: 64, ident: u16::from(seed), udp_src_port: 0xc000 | u16::from(seed) },
            1 => NetParams::Ipv6 { src: [seed; 16], dst: [0xfe; 16], traffic_class: seed,
                                   flow_label: 0xabcde, hop_limit: 64, udp_src_port: 0xd000 },
            _ => NetParams::Grh { sgid: [seed; 16], dgid: [0xfe; 16], traffic_class: seed,
                                  flow_label: 0x12345, hop_limit: 1 },
        };
        let fb = FrameBuilder { dst_mac: [2, 0, 0, 0, 0, 1], src_mac: [2, 0, 0, 0, 0, seed], vlan_tci: vlan, net };
        let b = PacketBuilder { bth: case.bth, ext: case.ext, payload: &case.payload };
        let frame = fb.build(&b).unwrap();
        let f = RoceFrame::parse(&frame).unwrap();
        f.verify_icrc().unwrap();
        // From the fabric's parsed view: the same frame, the walk not redone.
        prop_assert_eq!(RoceFrame::from_parsed(&frame, &::wire::parse(&frame)), Ok(f));
        prop_assert_eq!(f.eth.vlan_tci, vlan);
        prop_assert_eq!(f.packet.ext, case.ext);
        prop_assert_eq!(f.packet.payload, &case.payload[..]);
        let eth_len = if vlan.is_some() { 18 } else { 14 };
        match f.net {
            NetLayer::Ipv4 { ip_raw, udp, .. } => {
                prop_assert!(wire::Ipv4Header::checksum_ok(ip_raw));
                prop_assert_eq!(udp.checksum, 0);
                prop_assert_eq!(udp.src_port, 0xc000 | u16::from(seed));
            }
            NetLayer::Ipv6 { ip, udp, .. } => {
                // Summing the pseudo-header and the datagram with its checksum gives 0xFFFF.
                let l4 = &frame[eth_len + 40..];
                let pseudo = ::wire::checksum::pseudo_v6(&ip.src, &ip.dst, 17, l4.len());
                prop_assert!(::wire::checksum::verify(l4, pseudo));
                prop_assert_ne!(udp.checksum, 0);
            }
            NetLayer::Grh { grh, .. } => {
                prop_assert_eq!(grh.next_header, 0x1b);
                prop_assert_eq!(grh.flow_label, 0x12345);
            }
        }
        // ECN marking by a switch (IP TOS / traffic class) must not break the ICRC.
        let mut marked = frame.clone();
        match v6 {
            0 => marked[eth_len + 1] |= 3,
            _ => marked[eth_len + 1] |= 0x30,
        }
        prop_assert!(RoceFrame::parse(&marked).unwrap().verify_icrc().is_ok());
    }

    #[test]
    fn random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..200)) {
        exercise(&data);
    }

    #[test]
    fn mutated_frames_never_panic(case in arb_case(), v in 0u8..3,
                                  muts in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
                                  cut in any::<prop::sample::Index>()) {
        let net = match v {
            0 => NetParams::Ipv4 { src: [1; 4], dst: [2; 4], tos: 0, ttl: 64, ident: 0, udp_src_port: 1 },
            1 => NetParams::Ipv6 { src: [1; 16], dst: [2; 16], traffic_class: 0, flow_label: 0, hop_limit: 64, udp_src_port: 1 },
            _ => NetParams::Grh { sgid: [1; 16], dgid: [2; 16], traffic_class: 0, flow_label: 0, hop_limit: 64 },
        };
        let fb = FrameBuilder { dst_mac: [0; 6], src_mac: [0; 6], vlan_tci: None, net };
        let b = PacketBuilder { bth: case.bth, ext: case.ext, payload: &case.payload };
        let mut frame = fb.build(&b).unwrap();
        for (at, val) in muts {
            let i = at.index(frame.len());
            frame[i] = val;
        }
        let n = cut.index(frame.len() + 1);
        exercise(&frame[..n]);
        exercise(&frame);
    }
}

fn exercise(data: &[u8]) {
    // Reading the headers from `wire::parse`'s view finds the layers the
    // full parse does, and takes the same frames but for one: an IPv6
    // header with another version nibble, which is no IPv6 to the view.
    match (
        RoceFrame::from_parsed(data, &::wire::parse(data)).ok(),
        RoceFrame::parse(data).ok(),
    ) {
        (Some(v), full) => assert_eq!(Some(v), full),
        (None, Some(f)) => assert!(
            matches!(f.net, NetLayer::Ipv6 { ip, .. } if ip.version != 6),
            "refused from the view only: {f:?}"
        ),
        (None, None) => {}
    }
    if let Ok(p) = RocePacket::parse(data) {
        let _ = p.info();
        let _ = p.verify_icrc(&IcrcScope::Grh(&[0; 40]));
        let _ = p.verify_icrc(&IcrcScope::Ipv4 {
            ip: &[0x45; 20],
            udp: &[0; 8],
        });
    }
    if let Ok(f) = RoceFrame::parse(data) {
        let _ = f.verify_icrc();
    }
    if let Ok(f) = IbFrame::parse(data) {
        let _ = f.verify_icrc();
        let _ = f.verify_vcrc();
    }
    let _ = Bth::parse(data);
    let _ = Aeth::parse(data);
    let _ = AtomicEth::parse(data);
    let _ = wire::Lrh::parse(data);
    let _ = icrc_ipv4(data, data, data);
    let _ = icrc_ipv6(data, data, data);
    let _ = icrc_ib(data, Some(data), data);
    let _ = icrc_ib(data, None, data);
    for scope in [
        IcrcScope::Grh(data),
        IcrcScope::Ipv4 {
            ip: data,
            udp: data,
        },
    ] {
        let _ = scope.verify(data);
    }
}

/// Exhaustive sweep: every opcode byte, every BTH byte-1 value, lengths 0..=96.
#[test]
fn exhaustive_small_packets_never_panic() {
    let mut buf = [0u8; 96];
    for op in 0..=255u8 {
        for b1 in [0x00, 0x10, 0x20, 0x30, 0x01, 0xf0] {
            buf[0] = op;
            buf[1] = b1;
            for len in 0..=buf.len() {
                exercise(&buf[..len]);
            }
        }
    }
}

#[test]
fn builder_rejects_wrong_headers_and_sizes() {
    let r = PacketBuilder::new(Opcode::RcWriteOnly, 1, 1).build_unsealed();
    assert!(matches!(
        r,
        Err(CodecError::MissingHeader { header: "RETH", .. })
    ));
    let r = PacketBuilder::new(Opcode::RcSendOnly, 1, 1)
        .imm(5)
        .build_unsealed();
    assert!(matches!(
        r,
        Err(CodecError::UnexpectedHeader {
            header: "ImmDt",
            ..
        })
    ));
    let r = PacketBuilder::new(Opcode::RcAtomicWrite, 1, 1)
        .reth(Reth::default())
        .payload(&[0; 4])
        .build_unsealed();
    assert!(matches!(
        r,
        Err(CodecError::PayloadLength { expected: 8, .. })
    ));
    let r = PacketBuilder::new(Opcode::RcAcknowledge, 1, 1)
        .aeth(Aeth {
            syndrome: AethSyndrome::Ack { credits: 31 },
            msn: 1,
        })
        .payload(&[1])
        .build_unsealed();
    assert!(matches!(
        r,
        Err(CodecError::PayloadLength { expected: 0, .. })
    ));
    let r = PacketBuilder::new(Opcode::RcSendOnly, 1 << 24, 1).build_unsealed();
    assert!(matches!(r, Err(CodecError::FieldRange { .. })));
}

#[test]
fn parser_rejects_malformed() {
    let grh = [0x60u8; 40];
    let sc = IcrcScope::Grh(&grh);
    let good = PacketBuilder::new(Opcode::RcSendOnly, 7, 9)
        .payload(&[1, 2, 3])
        .build(&sc)
        .unwrap();
    assert_eq!(good.len(), 12 + 4 + 4);
    assert_eq!(good[1] & 0x30, 0x10, "pad 1");
    RocePacket::parse(&good).unwrap();

    let mut bad = good.clone();
    bad[0] = 0x15; // reserved RC opcode
    assert_eq!(RocePacket::parse(&bad), Err(CodecError::BadOpcode(0x15)));
    let mut bad = good.clone();
    bad[1] |= 0x01;
    assert_eq!(RocePacket::parse(&bad), Err(CodecError::BadTver(1)));
    // Drop 2 bytes of payload: 2 bytes + pad 1 is misaligned.
    let mut bad = good.clone();
    bad.drain(12..14);
    assert_eq!(RocePacket::parse(&bad), Err(CodecError::Misaligned(2)));
    // Pad 3 on an empty payload.
    let mut bad = PacketBuilder::new(Opcode::RcSendOnly, 7, 9)
        .build(&sc)
        .unwrap();
    bad[1] |= 0x30;
    assert!(matches!(
        RocePacket::parse(&bad),
        Err(CodecError::BadPad { pad: 3, avail: 0 })
    ));
    // Truncated extension header.
    let ack = PacketBuilder::new(Opcode::RcAcknowledge, 7, 9)
        .aeth(Aeth {
            syndrome: AethSyndrome::Nak {
                code: NakCode::PsnSequenceError,
            },
            msn: 3,
        })
        .build(&sc)
        .unwrap();
    assert_eq!(ack[12], 0x60);
    assert!(matches!(
        RocePacket::parse(&ack[..18]),
        Err(CodecError::Truncated { .. })
    ));
    let mut bad = ack.clone();
    bad[19] ^= 1;
    let p = RocePacket::parse(&bad).unwrap();
    assert!(matches!(
        p.verify_icrc(&sc),
        Err(CodecError::IcrcMismatch { .. })
    ));
}

/// An engine's packet written into a frame after header room and finished
/// in place is the frame `FrameBuilder::build` makes of the same packet,
/// for every network layer.
#[test]
fn transmit_into_a_frame_equals_build() {
    use std::time::Instant;
    let mut mem = Memory::new(7);
    let pd = mem.alloc_pd();
    let data: Vec<u8> = (0..3000u32).map(|i| (i % 253) as u8).collect();
    let k = mem
        .register(pd, 0x1000, data.clone(), Access::LOCAL_WRITE)
        .unwrap();
    let nets = [
        NetParams::Ipv4 {
            src: [10, 0, 0, 1],
            dst: [10, 0, 0, 2],
            tos: 0,
            ttl: 64,
            ident: 9,
            udp_src_port: 0xc000,
        },
        NetParams::Ipv6 {
            src: [0xfe; 16],
            dst: [0xfd; 16],
            traffic_class: 0,
            flow_label: 5,
            hop_limit: 64,
            udp_src_port: 0xc000,
        },
        NetParams::Grh {
            sgid: [1; 16],
            dgid: [2; 16],
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
        },
    ];
    for net in nets {
        for vlan_tci in [None, Some(7)] {
            let fb = FrameBuilder {
                dst_mac: [2, 0, 0, 0, 0, 2],
                src_mac: [2, 0, 0, 0, 0, 1],
                vlan_tci,
                net,
            };
            let mut qp = QueuePair::new(0x11, pd, QpCaps::default());
            qp.connect(&QpAttr {
                dest_qpn: 0x22,
                pmtu: Mtu::Mtu1024,
                ..QpAttr::default()
            })
            .unwrap();
            qp.post_send(SendWr::new(
                1,
                SendOp::Send,
                vec![Sge::new(0x1000, 3000, k.lkey)],
            ))
            .unwrap();
            let now = Instant::now();
            let mut n = 0;
            let mut frame = Vec::new();
            while qp.poll_transmit_into(now, &mem, &mut frame, fb.header_len()) {
                let pkt = RocePacket::parse(&frame[fb.header_len()..]).unwrap();
                let built = fb.build(&pkt.to_builder()).unwrap();
                fb.wrap_in_place(&mut frame).unwrap();
                assert_eq!(frame, built, "packet {n}");
                let f = RoceFrame::parse(&frame).unwrap();
                if !matches!(net, NetParams::Grh { .. }) {
                    f.verify_icrc().unwrap();
                }
                assert_eq!(
                    f.packet.payload,
                    &data[n * 1024..(n * 1024 + 1024).min(3000)]
                );
                n += 1;
            }
            assert_eq!(n, 3);
        }
    }
    // A buffer too short for the headers is an error, not a panic.
    let fb = FrameBuilder {
        dst_mac: [0; 6],
        src_mac: [0; 6],
        vlan_tci: None,
        net: nets[0],
    };
    assert!(fb.wrap_in_place(&mut [0u8; 20]).is_err());
}

/// Inline payload is sent as the work request carries it; inline data on
/// a READ, or beyond `max_inline_data`, is refused at post time.
#[test]
fn inline_sends() {
    use std::time::Instant;
    let mem = Memory::new(3);
    let pd = ProtectionDomain::new(4);
    let mut qp = QueuePair::new(
        0x11,
        pd,
        QpCaps {
            max_inline_data: 16,
            ..QpCaps::default()
        },
    );
    qp.connect(&QpAttr {
        dest_qpn: 0x22,
        ..QpAttr::default()
    })
    .unwrap();
    qp.post_send(SendWr::inline(1, SendOp::Send, b"inline!".to_vec()))
        .unwrap();
    assert!(qp
        .post_send(SendWr::inline(2, SendOp::Send, vec![0; 17]))
        .is_err());
    assert!(qp
        .post_send(SendWr::inline(
            3,
            SendOp::RdmaRead {
                remote_addr: 0,
                rkey: 1
            },
            vec![1]
        ))
        .is_err());
    let pkt = qp.poll_transmit(Instant::now(), &mem).unwrap();
    assert_eq!(RocePacket::parse(&pkt).unwrap().payload, b"inline!");
}
