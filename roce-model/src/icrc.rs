//! Invariant CRC (ICRC) for RoCEv2 (IPv4/IPv6), RoCEv1 (GRH) and native InfiniBand.
//!
//! Algorithm (IBA 7.8.1, RoCEv2 annex A17.4.1): standard reflected CRC-32
//! (IEEE 802.3, init `0xFFFF_FFFF`, final xor `0xFFFF_FFFF`) over
//!
//! 1. the LRH — for RoCE and for any packet with a GRH this is replaced by
//!    8 bytes of `0xFF` (routers rewrite the LRH, so it is not invariant);
//!    for a local IB packet it is the real LRH with the VL nibble set to `0xF`;
//! 2. the network header with its variant fields set to ones: IPv4 TOS, TTL
//!    and header checksum; IPv6/GRH traffic class, flow label and hop limit;
//! 3. the UDP header (RoCEv2) with checksum `0xFFFF`;
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to `0xFF`;
//! 5. the remaining headers, payload and pad (not the ICRC itself).
//!
//! The result is placed on the wire **little-endian** (`u32::to_le_bytes`):
//! the ConnectX-4 CNP in the test data computes to `0x2a00_fd82` and carries
//! the bytes `82 fd 00 2a`.

use crc::{Algorithm, Crc};

use crate::error::{need, CodecError, Result};

/// Size of the ICRC trailer (the one constant, in `wire`).
pub use wire::roce::ICRC_LEN;

/// CRC-32/ISO-HDLC (the IEEE CRC-32, reflected, as the ICRC is), with the
/// processor's carry-less multiply where it has one: every payload byte is
/// summed once when a frame is sealed and once when it is verified, so this
/// is most of the per-byte cost of a RoCEv2 data path.
struct Icrc(crc32fast::Hasher);

impl Icrc {
    fn new() -> Self {
        Icrc(crc32fast::Hasher::new())
    }
    fn masked_lrh(mut self) -> Self {
        self.0.update(&[0xff; 8]);
        self
    }
    fn update(&mut self, b: &[u8]) {
        self.0.update(b);
    }
    /// Append `hdr` (≤ 64 bytes) after setting the bytes selected by `mask` to ones.
    fn update_masked(&mut self, hdr: &[u8], mask: impl Fn(&mut [u8])) {
        let mut tmp = [0u8; 64];
        let n = hdr.len().min(64);
        tmp[..n].copy_from_slice(&hdr[..n]);
        mask(&mut tmp[..n]);
        self.0.update(&tmp[..n]);
    }
    /// Append BTH onward (without ICRC) with BTH byte 4 masked.
    fn transport(&mut self, rest: &[u8]) -> Result<()> {
        let bth = need(rest, 12, "BTH")?;
        self.update_masked(bth, |b| b[4] = 0xff);
        self.update(&rest[12..]);
        Ok(())
    }
    fn finish(self) -> u32 {
        self.0.finalize()
    }
}

fn mask_grh(b: &mut [u8]) {
    // Version(4) | TClass(8) | FlowLabel(20) | PayLen(16) | NxtHdr(8) | HopLmt(8)
    b[0] |= 0x0f;
    b[1] = 0xff;
    b[2] = 0xff;
    b[3] = 0xff;
    b[7] = 0xff;
}

fn ipv4_header(ip: &[u8]) -> Result<&[u8]> {
    let first = need(ip, 20, "IPv4")?;
    let ihl = usize::from(first[0] & 0x0f) * 4;
    if first[0] >> 4 != 4 || ihl < 20 {
        return Err(CodecError::BadHeader("IPv4"));
    }
    need(ip, ihl, "IPv4 options")
}

/// ICRC of a RoCEv2 packet over IPv4.
///
/// `ip` is the IPv4 header (options included, length from IHL), `udp` the UDP
/// header and `rest` the bytes from the BTH up to (excluding) the ICRC.
pub fn icrc_ipv4(ip: &[u8], udp: &[u8], rest: &[u8]) -> Result<u32> {
    let ip = ipv4_header(ip)?;
    let udp = need(udp, 8, "UDP")?;
    let mut c = Icrc::new().masked_lrh();
    c.update_masked(ip, |b| {
        b[1] = 0xff;
        b[8] = 0xff;
        b[10] = 0xff;
        b[11] = 0xff;
    });
    c.update_masked(udp, |b| {
        b[6] = 0xff;
        b[7] = 0xff;
    });
    c.transport(rest)?;
    Ok(c.finish())
}

/// ICRC of a RoCEv2 packet over IPv6 (`ip` is the 40-byte fixed header; no extension headers).
pub fn icrc_ipv6(ip: &[u8], udp: &[u8], rest: &[u8]) -> Result<u32> {
    let ip = need(ip, 40, "IPv6")?;
    let udp = need(udp, 8, "UDP")?;
    let mut c = Icrc::new().masked_lrh();
    c.update_masked(ip, mask_grh);
    c.update_masked(udp, |b| {
        b[6] = 0xff;
        b[7] = 0xff;
    });
    c.transport(rest)?;
    Ok(c.finish())
}

/// ICRC of a RoCEv1 packet (Ethertype 0x8915): 40-byte GRH then BTH onward.
pub fn icrc_grh(grh: &[u8], rest: &[u8]) -> Result<u32> {
    let grh = need(grh, 40, "GRH")?;
    let mut c = Icrc::new().masked_lrh();
    c.update_masked(grh, mask_grh);
    c.transport(rest)?;
    Ok(c.finish())
}

/// ICRC of a native InfiniBand packet.
///
/// Without a GRH the 8-byte LRH is covered with its VL nibble masked; with a
/// GRH the LRH is replaced by ones (exactly as RoCEv1) — this is what the six
/// multicast GRH frames of Wireshark's `infiniband.pcap` require.
pub fn icrc_ib(lrh: &[u8], grh: Option<&[u8]>, rest: &[u8]) -> Result<u32> {
    let lrh = need(lrh, 8, "LRH")?;
    match grh {
        Some(g) => icrc_grh(g, rest),
        None => {
            let mut c = Icrc::new();
            c.update_masked(lrh, |b| b[0] |= 0xf0);
            c.transport(rest)?;
            Ok(c.finish())
        }
    }
}

/// What precedes the BTH, i.e. which variant of the ICRC applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IcrcScope<'a> {
    /// RoCEv2 over IPv4: the IPv4 header and UDP header as sent.
    Ipv4 {
        /// IPv4 header (with options).
        ip: &'a [u8],
        /// UDP header.
        udp: &'a [u8],
    },
    /// RoCEv2 over IPv6.
    Ipv6 {
        /// IPv6 fixed header.
        ip: &'a [u8],
        /// UDP header.
        udp: &'a [u8],
    },
    /// RoCEv1: the GRH.
    Grh(&'a [u8]),
    /// Native InfiniBand: LRH and optional GRH.
    Ib {
        /// 8-byte LRH.
        lrh: &'a [u8],
        /// GRH if LNH says one is present.
        grh: Option<&'a [u8]>,
    },
}

impl IcrcScope<'_> {
    /// Compute the ICRC of `rest` (BTH onward, without the ICRC field).
    pub fn compute(&self, rest: &[u8]) -> Result<u32> {
        match *self {
            IcrcScope::Ipv4 { ip, udp } => icrc_ipv4(ip, udp, rest),
            IcrcScope::Ipv6 { ip, udp } => icrc_ipv6(ip, udp, rest),
            IcrcScope::Grh(g) => icrc_grh(g, rest),
            IcrcScope::Ib { lrh, grh } => icrc_ib(lrh, grh, rest),
        }
    }

    /// Verify `packet` (BTH onward, **with** the trailing 4-byte ICRC).
    pub fn verify(&self, packet: &[u8]) -> Result<()> {
        let Some(body_len) = packet.len().checked_sub(ICRC_LEN) else {
            return Err(CodecError::Truncated {
                what: "ICRC",
                need: ICRC_LEN,
                have: packet.len(),
            });
        };
        let (body, tail) = packet.split_at(body_len);
        let found = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        let computed = self.compute(body)?;
        if computed == found {
            Ok(())
        } else {
            Err(CodecError::IcrcMismatch { computed, found })
        }
    }

    /// Overwrite the last 4 bytes of `packet` (BTH..ICRC) with the correct ICRC.
    pub fn seal(&self, packet: &mut [u8]) -> Result<()> {
        let Some(body_len) = packet.len().checked_sub(ICRC_LEN) else {
            return Err(CodecError::BufferTooSmall {
                need: ICRC_LEN,
                have: packet.len(),
            });
        };
        let crc = self.compute(&packet[..body_len])?;
        packet[body_len..].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }
}

/// The InfiniBand VCRC (IBA 7.8.2): reflected CRC-16, polynomial 0x100B,
/// init and final xor 0xFFFF, over LRH through ICRC; little-endian on the
/// wire. Verified on all 43 frames of Wireshark's `infiniband.pcap`.
pub const CRC_16_IB_VCRC: Algorithm<u16> = Algorithm {
    width: 16,
    poly: 0x100b,
    init: 0xffff,
    refin: true,
    refout: true,
    xorout: 0xffff,
    check: 0x0a3d,
    residue: 0xf6aa,
};

const CRC16_VCRC: Crc<u16> = Crc::<u16>::new(&CRC_16_IB_VCRC);

/// VCRC of a native IB packet (`lrh_to_icrc`: LRH through ICRC inclusive).
pub fn vcrc(lrh_to_icrc: &[u8]) -> u16 {
    CRC16_VCRC.checksum(lrh_to_icrc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_matches_rxe() {
        // rxe starts crc32_le from 0xdebb20e3 == state after 8 bytes of 0xff
        // (crc32_le works on the un-inverted register).
        let mut d = Icrc::new();
        d.update(&[0xff; 8]);
        // finalize() applies the final xor; undo it to get the running register.
        assert_eq!(!d.finish(), 0xdebb_20e3);
    }

    #[test]
    fn vcrc_check_value() {
        assert_eq!(vcrc(b"123456789"), 0x0a3d);
    }

    #[test]
    fn short_inputs_error() {
        assert!(icrc_ipv4(&[0x45; 19], &[0; 8], &[0; 12]).is_err());
        assert!(icrc_ipv4(&[0x46; 20], &[0; 8], &[0; 12]).is_err()); // IHL 6 > 20 bytes
        assert!(icrc_ipv6(&[0x60; 40], &[0; 7], &[0; 12]).is_err());
        assert!(icrc_grh(&[0x60; 40], &[0; 11]).is_err());
        assert!(IcrcScope::Grh(&[0; 40]).verify(&[0; 3]).is_err());
    }
}
