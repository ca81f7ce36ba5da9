//! SMC CLC decline / fallback reason codes (`SMC_CLC_DECL_*`, Linux
//! `net/smc/smc_clc.h`). The same 32-bit codes appear as a socket's
//! `fallback.reason` and `fallback.peer_diagnosis` in SMC sock_diag.

/// `(code, name, meaning)` for every decline code known to recent kernels.
pub const DECLINE_CODES: &[(u32, &str, &str)] = &[
    (
        0x0101_0000,
        "SMC_CLC_DECL_MEM",
        "insufficient memory resources",
    ),
    (
        0x0201_0000,
        "SMC_CLC_DECL_TIMEOUT_CL",
        "timeout waiting for QP confirm link",
    ),
    (
        0x0202_0000,
        "SMC_CLC_DECL_TIMEOUT_AL",
        "timeout waiting for QP add link",
    ),
    (0x0300_0000, "SMC_CLC_DECL_CNFERR", "configuration error"),
    (
        0x0301_0000,
        "SMC_CLC_DECL_PEERNOSMC",
        "peer did not indicate SMC",
    ),
    (0x0302_0000, "SMC_CLC_DECL_IPSEC", "IPsec usage"),
    (
        0x0303_0000,
        "SMC_CLC_DECL_NOSMCDEV",
        "no SMC device found (R or D)",
    ),
    (
        0x0303_0001,
        "SMC_CLC_DECL_NOSMCDDEV",
        "no SMC-D device found",
    ),
    (
        0x0303_0002,
        "SMC_CLC_DECL_NOSMCRDEV",
        "no SMC-R device found",
    ),
    (
        0x0303_0003,
        "SMC_CLC_DECL_NOISM2SUPP",
        "hardware has no ISMv2 support",
    ),
    (
        0x0303_0004,
        "SMC_CLC_DECL_NOV2EXT",
        "peer sent no CLC v2 extension",
    ),
    (
        0x0303_0005,
        "SMC_CLC_DECL_NOV2DEXT",
        "peer sent no CLC SMC-Dv2 extension",
    ),
    (0x0303_0006, "SMC_CLC_DECL_NOSEID", "peer sent no SEID"),
    (
        0x0303_0007,
        "SMC_CLC_DECL_NOSMCD2DEV",
        "no SMC-Dv2 device found; a server keeps the first error, so this also \
         masks a later SMC-Rv2 failure such as a UEID mismatch when the client \
         proposed SMC-Dv2 too (e.g. its loopback-ism device)",
    ),
    (
        0x0303_0008,
        "SMC_CLC_DECL_NOUEID",
        "peer sent no UEID (configure the same UEID on both sides)",
    ),
    (
        0x0303_0009,
        "SMC_CLC_DECL_RELEASEERR",
        "release version negotiation failed",
    ),
    (
        0x0303_000a,
        "SMC_CLC_DECL_MAXCONNERR",
        "max connections negotiation failed",
    ),
    (
        0x0303_000b,
        "SMC_CLC_DECL_MAXLINKERR",
        "max links negotiation failed",
    ),
    (
        0x0304_0000,
        "SMC_CLC_DECL_MODEUNSUPP",
        "SMC modes do not match (R or D)",
    ),
    (
        0x0305_0000,
        "SMC_CLC_DECL_RMBE_EC",
        "peer has eyecatcher in RMBE",
    ),
    (
        0x0306_0000,
        "SMC_CLC_DECL_OPTUNSUPP",
        "socket option not supported by SMC (e.g. TCP fastopen)",
    ),
    (
        0x0307_0000,
        "SMC_CLC_DECL_DIFFPREFIX",
        "IP prefix / subnet mismatch",
    ),
    (
        0x0308_0000,
        "SMC_CLC_DECL_GETVLANERR",
        "error getting VLAN id of IP device",
    ),
    (
        0x0309_0000,
        "SMC_CLC_DECL_ISMVLANERR",
        "error registering VLAN id on ISM device",
    ),
    (
        0x030a_0000,
        "SMC_CLC_DECL_NOACTLINK",
        "no active SMC-R link in link group",
    ),
    (
        0x030b_0000,
        "SMC_CLC_DECL_NOSRVLINK",
        "SMC-R link from server not found",
    ),
    (
        0x030c_0000,
        "SMC_CLC_DECL_VERSMISMAT",
        "SMC version mismatch",
    ),
    (
        0x030d_0000,
        "SMC_CLC_DECL_MAX_DMB",
        "SMC-D DMB limit exceeded",
    ),
    (
        0x030e_0000,
        "SMC_CLC_DECL_NOROUTE",
        "SMC-Rv2 connection: no route to peer",
    ),
    (
        0x030f_0000,
        "SMC_CLC_DECL_NOINDIRECT",
        "SMC-Rv2 connection: indirect mismatch",
    ),
    (0x0400_0000, "SMC_CLC_DECL_SYNCERR", "synchronization error"),
    (
        0x0500_0000,
        "SMC_CLC_DECL_PEERDECL",
        "peer declined during handshake (see peer diagnosis)",
    ),
    (
        0x0600_0000,
        "SMC_CLC_DECL_REPLY",
        "reply to a received decline (older kernels)",
    ),
    (
        0x0700_0000,
        "SMC_CLC_DECL_SEND",
        "sending problem (older kernels)",
    ),
    (0x0999_0000, "SMC_CLC_DECL_INTERR", "internal error"),
    (
        0x0999_0001,
        "SMC_CLC_DECL_ERR_RTOK",
        "rtoken handling failed",
    ),
    (
        0x0999_0002,
        "SMC_CLC_DECL_ERR_RDYLNK",
        "ib ready link failed",
    ),
    (
        0x0999_0003,
        "SMC_CLC_DECL_ERR_REGBUF",
        "reg rdma bufs failed",
    ),
    (
        0x9999_0000,
        "SMC_CLC_DECL_INTERR",
        "internal error (older kernels)",
    ),
];

/// Name and meaning of a decline code, if known.
pub fn lookup(code: u32) -> Option<(&'static str, &'static str)> {
    DECLINE_CODES
        .iter()
        .find(|(c, _, _)| *c == code)
        .map(|(_, n, m)| (*n, *m))
}

/// `0x03030008 (SMC_CLC_DECL_NOUEID: peer sent no UEID ...)`; `0` prints as `0 (none)`.
pub fn describe(code: u32) -> String {
    if code == 0 {
        return "0 (none)".into();
    }
    match lookup(code) {
        Some((name, meaning)) => format!("0x{code:08x} ({name}: {meaning})"),
        None => format!("0x{code:08x} (unknown code)"),
    }
}

/// Short form: `0x03030008 (SMC_CLC_DECL_NOUEID)`.
pub fn short(code: u32) -> String {
    match lookup(code) {
        Some((name, _)) => format!("0x{code:08x} ({name})"),
        None if code == 0 => "0".into(),
        None => format!("0x{code:08x}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_codes() {
        assert_eq!(lookup(0x0303_0008).unwrap().0, "SMC_CLC_DECL_NOUEID");
        assert_eq!(short(0x030e_0000), "0x030e0000 (SMC_CLC_DECL_NOROUTE)");
        assert!(describe(0x1234_5678).contains("unknown"));
        assert_eq!(describe(0), "0 (none)");
        // Every code is listed once, except the two historic INTERR values.
        let mut codes: Vec<u32> = DECLINE_CODES.iter().map(|c| c.0).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), DECLINE_CODES.len());
    }
}
