//! Structured build -> parse round trip: an arbitrary opcode, BTH fields,
//! extension headers, payload and network layer (RoCEv2/IPv4, RoCEv2/IPv6,
//! RoCEv1/GRH, optional VLAN) go through `FrameBuilder::build`; whatever the
//! builder accepts must parse back with `RoceFrame::parse` to exactly the same
//! fields and verify its ICRC.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use roce_model::{ExtHeaders, FrameBuilder, NetParams, Opcode, PacketBuilder, RoceFrame};

fn net(u: &mut Unstructured<'_>) -> Result<NetParams> {
    Ok(match u.int_in_range(0u8..=2)? {
        0 => NetParams::Ipv4 {
            src: u.arbitrary()?,
            dst: u.arbitrary()?,
            tos: u.arbitrary()?,
            ttl: u.arbitrary()?,
            ident: u.arbitrary()?,
            udp_src_port: u.arbitrary()?,
        },
        1 => NetParams::Ipv6 {
            src: u.arbitrary()?,
            dst: u.arbitrary()?,
            traffic_class: u.arbitrary()?,
            flow_label: u.arbitrary::<u32>()? & 0xf_ffff,
            hop_limit: u.arbitrary()?,
            udp_src_port: u.arbitrary()?,
        },
        _ => NetParams::Grh {
            sgid: u.arbitrary()?,
            dgid: u.arbitrary()?,
            traffic_class: u.arbitrary()?,
            flow_label: u.arbitrary::<u32>()? & 0xf_ffff,
            hop_limit: u.arbitrary()?,
        },
    })
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let op = Opcode::ALL[u.choose_index(Opcode::ALL.len())?];
    let info = op.info();
    let mut b = PacketBuilder::new(
        op,
        u.arbitrary::<u32>()? & 0xff_ffff,
        u.arbitrary::<u32>()? & 0xff_ffff,
    )
    .ack_req(u.arbitrary()?)
    .se(u.arbitrary()?)
    .mig(u.arbitrary()?)
    .pkey(u.arbitrary()?)
    .ecn(u.arbitrary()?, u.arbitrary()?);
    // Arbitrary but well-formed extension headers: decode them from raw bytes.
    let raw = u.bytes(info.ext_len())?;
    let Ok((ext, n)) = ExtHeaders::parse(info.headers, raw) else {
        return Ok(());
    };
    assert_eq!(n, info.ext_len());
    b.ext = ext;
    let payload_len = match info.payload.fixed_len() {
        Some(n) => n,
        None => u.int_in_range(0..=600)?,
    };
    let payload = u.bytes(payload_len)?;
    b = b.payload(payload);
    let fb = FrameBuilder {
        dst_mac: u.arbitrary()?,
        src_mac: u.arbitrary()?,
        vlan_tci: u.arbitrary()?,
        net: net(u)?,
    };
    let Ok(frame) = fb.build(&b) else {
        return Ok(());
    };
    let f = RoceFrame::parse(&frame)
        .unwrap_or_else(|e| panic!("built frame does not parse: {e} ({op:?})"));
    f.verify_icrc().expect("built frame's ICRC verifies");
    assert_eq!(f.eth.dst, fb.dst_mac);
    assert_eq!(f.eth.src, fb.src_mac);
    assert_eq!(f.eth.vlan_tci, fb.vlan_tci);
    let mut want = b.bth;
    want.pad_cnt = b.pad_cnt();
    assert_eq!(f.packet.bth, want);
    assert_eq!(f.packet.ext, b.ext);
    assert_eq!(f.packet.payload, payload);
    assert_eq!(f.packet.to_builder().payload, payload);
    // The transport part alone also round-trips.
    let unsealed = b
        .build_unsealed()
        .expect("packet builds when the frame did");
    assert_eq!(unsealed.len(), b.wire_len());
    assert_eq!(
        &unsealed[..unsealed.len() - 4],
        &f.packet.raw[..f.packet.raw.len() - 4]
    );
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
