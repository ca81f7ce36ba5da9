//! CM codec: round trips for all seven messages, hostile input, rdma_cm header.

use ib_cm::msg::*;
use ib_cm::*;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr};

fn bytes(n: usize) -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), n)
}

fn path() -> impl Strategy<Value = PathInfo> {
    (
        any::<(u16, u16, [u8; 16], [u8; 16])>(),
        (0u32..1 << 20, 0u8..64, any::<u8>(), any::<u8>()),
        (0u8..16, any::<bool>(), 0u8..32),
    )
        .prop_map(
            |((ll, rl, lg, rg), (fl, pr, tc, hl), (sl, sn, t))| PathInfo {
                local_lid: ll,
                remote_lid: rl,
                local_gid: lg,
                remote_gid: rg,
                flow_label: fl,
                packet_rate: pr,
                traffic_class: tc,
                hop_limit: hl,
                sl,
                subnet_local: sn,
                local_ack_timeout: t,
            },
        )
}

fn req() -> impl Strategy<Value = Req> {
    (
        (any::<(u32, u64, u64, u32)>(), 0u32..1 << 24, 0u32..1 << 24),
        (
            any::<(u8, u8)>(),
            0u32..1 << 24,
            0u32..1 << 24,
            0u32..1 << 24,
        ),
        (
            0u8..32,
            0u8..4,
            any::<bool>(),
            0u8..32,
            0u8..8,
            any::<u16>(),
        ),
        (
            0u8..16,
            any::<bool>(),
            0u8..8,
            0u8..16,
            any::<bool>(),
            0u8..8,
        ),
        (path(), path(), any::<bool>(), bytes(REQ_PRIVATE_LEN)),
    )
        .prop_map(
            |(
                ((lc, sid, guid, qkey), qpn, vendor),
                ((rr, id), leecn, reecn, psn),
                (rt, tt, e2e, lt, rc, pkey),
                (mtu, rdc, rnr, mcr, srq, ett),
                (p, a, sap, pd),
            )| Req {
                local_comm_id: lc,
                vendor_id: vendor,
                service_id: sid,
                local_ca_guid: guid,
                local_qkey: qkey,
                local_qpn: qpn,
                responder_resources: rr,
                local_eecn: leecn,
                initiator_depth: id,
                remote_eecn: reecn,
                remote_cm_response_timeout: rt,
                transport_type: tt,
                end_to_end_flow_control: e2e,
                starting_psn: psn,
                local_cm_response_timeout: lt,
                retry_count: rc,
                pkey,
                path_mtu: mtu,
                rdc_exists: rdc,
                rnr_retry_count: rnr,
                max_cm_retries: mcr,
                srq,
                extended_transport_type: ett,
                primary_path: p,
                alternate_path: a,
                sap_supported: sap,
                private_data: pd,
            },
        )
}

fn rep() -> impl Strategy<Value = Rep> {
    (
        any::<(u32, u32, u32, u64)>(),
        (0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24, 0u32..1 << 24),
        (
            any::<(u8, u8)>(),
            0u8..32,
            0u8..4,
            any::<bool>(),
            0u8..8,
            any::<bool>(),
        ),
        bytes(REP_PRIVATE_LEN),
    )
        .prop_map(
            |(
                (l, r, qkey, guid),
                (qpn, vendor, eecn, psn),
                ((rr, id), tad, fo, e2e, rnr, srq),
                pd,
            )| {
                Rep {
                    local_comm_id: l,
                    remote_comm_id: r,
                    local_qkey: qkey,
                    local_qpn: qpn,
                    vendor_id: vendor,
                    local_eecn: eecn,
                    starting_psn: psn,
                    responder_resources: rr,
                    initiator_depth: id,
                    target_ack_delay: tad,
                    failover_accepted: fo,
                    end_to_end_flow_control: e2e,
                    rnr_retry_count: rnr,
                    srq,
                    local_ca_guid: guid,
                    private_data: pd,
                }
            },
        )
}

fn message() -> impl Strategy<Value = CmMessage> {
    prop_oneof![
        req().prop_map(|r| CmMessage::Req(Box::new(r))),
        rep().prop_map(CmMessage::Rep),
        (any::<(u32, u32)>(), 0u8..4, 0u8..32, bytes(MRA_PRIVATE_LEN)).prop_map(
            |((l, r), m, t, pd)| CmMessage::Mra(Mra {
                local_comm_id: l,
                remote_comm_id: r,
                message_mraed: m,
                service_timeout: t,
                private_data: pd,
            })
        ),
        (
            any::<(u32, u32, u16)>(),
            0u8..4,
            0u8..128,
            bytes(REJ_ARI_LEN),
            bytes(REJ_PRIVATE_LEN)
        )
            .prop_map(|((l, r, reason), m, al, ari, pd)| CmMessage::Rej(Rej {
                local_comm_id: l,
                remote_comm_id: r,
                message_rejected: m,
                ari_length: al,
                reason,
                ari,
                private_data: pd,
            })),
        (any::<(u32, u32)>(), bytes(RTU_PRIVATE_LEN)).prop_map(|((l, r), pd)| CmMessage::Rtu(
            Rtu {
                local_comm_id: l,
                remote_comm_id: r,
                private_data: pd,
            }
        )),
        (any::<(u32, u32)>(), 0u32..1 << 24, bytes(DREQ_PRIVATE_LEN)).prop_map(
            |((l, r), q, pd)| CmMessage::Dreq(Dreq {
                local_comm_id: l,
                remote_comm_id: r,
                remote_qpn: q,
                private_data: pd,
            })
        ),
        (any::<(u32, u32)>(), bytes(DREP_PRIVATE_LEN)).prop_map(|((l, r), pd)| CmMessage::Drep(
            Drep {
                local_comm_id: l,
                remote_comm_id: r,
                private_data: pd,
            }
        )),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_message_round_trips(msg in message(), tid in any::<u64>()) {
        let mad = CmMad { tid, msg };
        let wire = mad.encode().unwrap();
        prop_assert_eq!(wire.len(), MAD_LEN);
        prop_assert_eq!(&wire[..4], &[1u8, 7, 2, 3][..]);
        let back = CmMad::parse(&wire).unwrap();
        prop_assert_eq!(&back, &mad);
        prop_assert_eq!(back.encode().unwrap(), wire);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_reencode_stably(
        mut raw in proptest::collection::vec(any::<u8>(), 0..300),
        attr in 0x10u16..0x17,
        force_header in any::<bool>(),
    ) {
        if force_header && raw.len() >= 24 {
            raw[..4].copy_from_slice(&[1, 7, 2, 3]);
            raw[16..18].copy_from_slice(&attr.to_be_bytes());
        }
        if let Ok(m) = CmMad::parse(&raw) {
            // Reserved bits may differ; the parsed view must be stable.
            let wire = m.encode().unwrap();
            prop_assert_eq!(CmMad::parse(&wire).unwrap(), m);
        }
    }

    #[test]
    fn cma_header_round_trips(src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), port in any::<u16>(),
                              app in proptest::collection::vec(any::<u8>(), 0..=56)) {
        let h = CmaHeader { src: IpAddr::V4(src.into()), src_port: port, dst: IpAddr::V4(dst.into()) };
        let pd = h.to_private_data(&app).unwrap();
        prop_assert_eq!(CmaHeader::parse(&pd).unwrap(), h);
        prop_assert_eq!(&pd[36..], &app[..]);
    }
}

#[test]
fn hostile_headers_are_clear_errors() {
    let good = CmMad {
        tid: 7,
        msg: CmMessage::Rtu(Rtu::default()),
    }
    .encode()
    .unwrap();
    for len in [0, 1, 23, 24, 255] {
        assert_eq!(
            CmMad::parse(&good[..len]),
            Err(CmError::Truncated { len }),
            "{len} bytes"
        );
    }
    let mut m = good;
    m[0] = 2;
    assert_eq!(CmMad::parse(&m), Err(CmError::BaseVersion(2)));
    let mut m = good;
    m[1] = 0x81;
    assert_eq!(CmMad::parse(&m), Err(CmError::NotCm(0x81)));
    let mut m = good;
    m[2] = 1;
    assert_eq!(CmMad::parse(&m), Err(CmError::ClassVersion(1)));
    let mut m = good;
    m[3] = 0x81;
    assert_eq!(CmMad::parse(&m), Err(CmError::Method(0x81)));
    for attr in [0x0001u16, 0x0017, 0x0018, 0x0019, 0x001a, 0xffff] {
        let mut m = good;
        m[16..18].copy_from_slice(&attr.to_be_bytes());
        assert_eq!(CmMad::parse(&m), Err(CmError::UnknownAttribute(attr)));
    }
    // Oversized private data is refused, not truncated.
    let too_long = CmMad {
        tid: 0,
        msg: CmMessage::Rtu(Rtu {
            private_data: vec![0; RTU_PRIVATE_LEN + 1],
            ..Rtu::default()
        }),
    };
    assert!(matches!(
        too_long.encode(),
        Err(CmError::FieldTooLong { max: 224, .. })
    ));
}

#[test]
fn req_fields_sit_where_linux_puts_them() {
    // Offsets from Linux's ibta_vol1_c12.h (CM data starts at MAD byte 24).
    let req = Req {
        local_comm_id: 0x1122_3344,
        service_id: service_id(RDMA_PS_TCP, 7174),
        local_qpn: 0x00ab_cdef,
        responder_resources: 0x10,
        initiator_depth: 0x20,
        remote_cm_response_timeout: 20,
        starting_psn: 0x0012_3456,
        local_cm_response_timeout: 20,
        retry_count: 7,
        pkey: 0xffff,
        path_mtu: 3,
        rnr_retry_count: 6,
        max_cm_retries: 15,
        ..Req::default()
    };
    let w = CmMad {
        tid: 1,
        msg: CmMessage::Req(Box::new(req)),
    }
    .encode()
    .unwrap();
    assert_eq!(&w[16..18], &[0x00, 0x10]);
    assert_eq!(&w[24..28], &[0x11, 0x22, 0x33, 0x44]);
    assert_eq!(&w[32..40], &[0, 0, 0, 0, 0x01, 0x06, 0x1c, 0x06]);
    assert_eq!(&w[56..60], &[0xab, 0xcd, 0xef, 0x10]);
    assert_eq!(w[63], 0x20);
    assert_eq!(w[67], 20 << 3); // RC = 0, no flow control
    assert_eq!(&w[68..72], &[0x12, 0x34, 0x56, (20 << 3) | 7]);
    assert_eq!(&w[72..76], &[0xff, 0xff, 0x36, 0xf0]);
}

#[test]
fn cma_header_ipv4_layout_and_errors() {
    let h = CmaHeader {
        src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        src_port: 0x1234,
        dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 9)),
    };
    let pd = h.to_private_data(b"").unwrap();
    assert_eq!(pd.len(), 36);
    assert_eq!(&pd[..4], &[0, 0x40, 0x12, 0x34]);
    assert_eq!(&pd[16..20], &[10, 0, 0, 2]);
    assert_eq!(&pd[32..36], &[10, 0, 0, 9]);
    assert!(CmaHeader::parse(&pd[..35]).is_err());
    let mut bad = pd.clone();
    bad[1] = 0x50;
    assert!(CmaHeader::parse(&bad).is_err());
    bad[1] = 0x40;
    bad[0] = 1;
    assert!(CmaHeader::parse(&bad).is_err());
    assert!(h.to_private_data(&[0; 57]).is_err());
    assert_eq!(
        service_port(service_id(RDMA_PS_TCP, 7471), RDMA_PS_TCP),
        Some(7471)
    );
    assert_eq!(service_port(0x0000_0000_0111_1d2f, RDMA_PS_TCP), None);
}
