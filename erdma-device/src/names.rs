//! The driver's names (`erdma_hw.h`) for registers, commands, CQE statuses,
//! opcodes and AEQ types: for the device trace and for fault parameters.

/// Command opcodes: (submodule, opcode, `CMDQ_OPCODE_*`).
pub const CMD_OPCODES: &[(u8, u8, &str)] = &[
    (0, 0, "CMDQ_OPCODE_QUERY_DEVICE"),
    (0, 1, "CMDQ_OPCODE_CREATE_QP"),
    (0, 2, "CMDQ_OPCODE_DESTROY_QP"),
    (0, 3, "CMDQ_OPCODE_MODIFY_QP"),
    (0, 4, "CMDQ_OPCODE_CREATE_CQ"),
    (0, 5, "CMDQ_OPCODE_DESTROY_CQ"),
    (0, 6, "CMDQ_OPCODE_REFLUSH"),
    (0, 8, "CMDQ_OPCODE_REG_MR"),
    (0, 9, "CMDQ_OPCODE_DEREG_MR"),
    (0, 14, "CMDQ_OPCODE_SET_GID"),
    (0, 15, "CMDQ_OPCODE_CREATE_AH"),
    (0, 16, "CMDQ_OPCODE_DESTROY_AH"),
    (0, 17, "CMDQ_OPCODE_QUERY_QP"),
    (1, 0, "CMDQ_OPCODE_CREATE_EQ"),
    (1, 1, "CMDQ_OPCODE_DESTROY_EQ"),
    (1, 2, "CMDQ_OPCODE_QUERY_FW_INFO"),
    (1, 3, "CMDQ_OPCODE_CONF_MTU"),
    (1, 4, "CMDQ_OPCODE_GET_STATS"),
    (1, 5, "CMDQ_OPCODE_CONF_DEVICE"),
    (1, 8, "CMDQ_OPCODE_ALLOC_DB"),
    (1, 9, "CMDQ_OPCODE_FREE_DB"),
];

/// AEQE types (`ERDMA_AE_TYPE_*`).
pub const AE_TYPES: &[(u8, &str)] = &[
    (0, "ERDMA_AE_TYPE_QP_FATAL_EVENT"),
    (1, "ERDMA_AE_TYPE_QP_ERQ_ERR_EVENT"),
    (2, "ERDMA_AE_TYPE_ACC_ERR_EVENT"),
    (3, "ERDMA_AE_TYPE_CQ_ERR"),
    (4, "ERDMA_AE_TYPE_OTHER_ERROR"),
];

/// CQE statuses (`enum erdma_wc_status`).
pub const WC_STATUS: &[(u8, &str)] = &[
    (0, "ERDMA_WC_SUCCESS"),
    (1, "ERDMA_WC_GENERAL_ERR"),
    (2, "ERDMA_WC_RECV_WQE_FORMAT_ERR"),
    (3, "ERDMA_WC_RECV_STAG_INVALID_ERR"),
    (4, "ERDMA_WC_RECV_ADDR_VIOLATION_ERR"),
    (5, "ERDMA_WC_RECV_RIGHT_VIOLATION_ERR"),
    (6, "ERDMA_WC_RECV_PDID_ERR"),
    (7, "ERDMA_WC_RECV_WARRPING_ERR"),
    (8, "ERDMA_WC_SEND_WQE_FORMAT_ERR"),
    (9, "ERDMA_WC_SEND_WQE_ORD_EXCEED"),
    (10, "ERDMA_WC_SEND_STAG_INVALID_ERR"),
    (11, "ERDMA_WC_SEND_ADDR_VIOLATION_ERR"),
    (12, "ERDMA_WC_SEND_RIGHT_VIOLATION_ERR"),
    (13, "ERDMA_WC_SEND_PDID_ERR"),
    (14, "ERDMA_WC_SEND_WARRPING_ERR"),
    (15, "ERDMA_WC_FLUSH_ERR"),
    (16, "ERDMA_WC_RETRY_EXC_ERR"),
];

/// Work opcodes (`enum erdma_opcode`).
pub const OPCODES: &[(u8, &str)] = &[
    (0, "ERDMA_OP_WRITE"),
    (1, "ERDMA_OP_READ"),
    (2, "ERDMA_OP_SEND"),
    (3, "ERDMA_OP_SEND_WITH_IMM"),
    (4, "ERDMA_OP_RECEIVE"),
    (5, "ERDMA_OP_RECV_IMM"),
    (6, "ERDMA_OP_RECV_INV"),
    (9, "ERDMA_OP_WRITE_WITH_IMM"),
    (12, "ERDMA_OP_RSP_SEND_IMM"),
    (13, "ERDMA_OP_SEND_WITH_INV"),
    (14, "ERDMA_OP_REG_MR"),
    (15, "ERDMA_OP_LOCAL_INV"),
    (16, "ERDMA_OP_READ_WITH_INV"),
    (17, "ERDMA_OP_ATOMIC_CAS"),
    (18, "ERDMA_OP_ATOMIC_FAA"),
];

/// Looks `s` up in `table` by name: any case, `-` for `_`, with or
/// without one of `prefixes`, and without a trailing `_EVENT`.
pub(crate) fn lookup<T>(
    s: &str,
    prefixes: &[&str],
    table: impl Iterator<Item = (&'static str, T)>,
) -> Option<T> {
    let norm = |t: &str| {
        let mut t = t.to_ascii_uppercase().replace('-', "_");
        for p in prefixes {
            if let Some(r) = t.strip_prefix(p) {
                t = r.to_owned();
            }
        }
        t.strip_suffix("_EVENT").map(str::to_owned).unwrap_or(t)
    };
    let want = norm(s);
    table
        .into_iter()
        .find(|(n, _)| norm(n) == want)
        .map(|(_, v)| v)
}

fn short(table: &[(u8, &'static str)], v: u8, prefix: &str) -> Option<&'static str> {
    table
        .iter()
        .find(|(n, _)| *n == v)
        .map(|(_, name)| name.strip_prefix(prefix).unwrap_or(name))
}

/// `CMDQ_OPCODE_*` of a command, or `CMDQ_OPCODE_?`.
pub fn cmd_opcode(submod: u8, opcode: u8) -> &'static str {
    CMD_OPCODES
        .iter()
        .find(|(m, o, _)| *m == submod && *o == opcode)
        .map_or("CMDQ_OPCODE_?", |(_, _, n)| n)
}

/// An AEQE type without its prefix (`QP_FATAL_EVENT`), or `?`.
pub fn ae_type(t: u8) -> &'static str {
    short(AE_TYPES, t, "ERDMA_AE_TYPE_").unwrap_or("?")
}

/// A CQE status without its prefix (`RETRY_EXC_ERR`), or `?`.
pub fn wc_status(s: u8) -> &'static str {
    short(WC_STATUS, s, "ERDMA_WC_").unwrap_or("?")
}

/// A work opcode without its prefix (`SEND`), or `?`.
pub fn opcode(o: u8) -> &'static str {
    short(OPCODES, o, "ERDMA_OP_").unwrap_or("?")
}

/// The driver's name of the BAR 0 register or doorbell space at `offset`
/// (the 64-bit registers answer for both halves).
pub fn register(offset: u64) -> Option<&'static str> {
    use crate::regs;
    Some(match offset & !3 {
        0x00 => "ERDMA_REGS_VERSION_REG",
        0x0c => "ERDMA_REGS_DEV_PROTO_REG",
        0x10 => "ERDMA_REGS_DEV_CTRL_REG",
        0x14 => "ERDMA_REGS_DEV_ST_REG",
        0x18 => "ERDMA_REGS_NETDEV_MAC_L_REG",
        0x1c => "ERDMA_REGS_NETDEV_MAC_H_REG",
        0x20 => "ERDMA_REGS_CMDQ_SQ_ADDR_L_REG",
        0x24 => "ERDMA_REGS_CMDQ_SQ_ADDR_H_REG",
        0x28 => "ERDMA_REGS_CMDQ_CQ_ADDR_L_REG",
        0x2c => "ERDMA_REGS_CMDQ_CQ_ADDR_H_REG",
        0x30 => "ERDMA_REGS_CMDQ_DEPTH_REG",
        0x34 => "ERDMA_REGS_CMDQ_EQ_DEPTH_REG",
        0x38 => "ERDMA_REGS_CMDQ_EQ_ADDR_L_REG",
        0x3c => "ERDMA_REGS_CMDQ_EQ_ADDR_H_REG",
        0x40 => "ERDMA_REGS_AEQ_ADDR_L_REG",
        0x44 => "ERDMA_REGS_AEQ_ADDR_H_REG",
        0x48 => "ERDMA_REGS_AEQ_DEPTH_REG",
        0x4c => "ERDMA_REGS_GRP_NUM_REG",
        0x50 | 0x54 => "ERDMA_REGS_AEQ_DB_REG",
        0x60 | 0x64 => "ERDMA_CMDQ_SQ_DB_HOST_ADDR_REG",
        0x68 | 0x6c => "ERDMA_CMDQ_CQ_DB_HOST_ADDR_REG",
        0x70 | 0x74 => "ERDMA_CMDQ_EQ_DB_HOST_ADDR_REG",
        0x78 | 0x7c => "ERDMA_AEQ_DB_HOST_ADDR_REG",
        0x80 | 0x84 => "ERDMA_REGS_STATS_TSO_IN_PKTS_REG",
        0x88 | 0x8c => "ERDMA_REGS_STATS_TSO_OUT_PKTS_REG",
        0x90 | 0x94 => "ERDMA_REGS_STATS_TSO_OUT_BYTES_REG",
        0x98 | 0x9c => "ERDMA_REGS_STATS_TX_DROP_PKTS_REG",
        0xa0 | 0xa4 => "ERDMA_REGS_STATS_TX_BPS_METER_DROP_PKTS_REG",
        0xa8 | 0xac => "ERDMA_REGS_STATS_TX_PPS_METER_DROP_PKTS_REG",
        0xc0 | 0xc4 => "ERDMA_REGS_STATS_RX_PKTS_REG",
        0xc8 | 0xcc => "ERDMA_REGS_STATS_RX_BYTES_REG",
        0xd0 | 0xd4 => "ERDMA_REGS_STATS_RX_DROP_PKTS_REG",
        0xd8 | 0xdc => "ERDMA_REGS_STATS_RX_BPS_METER_DROP_PKTS_REG",
        0xe0 | 0xe4 => "ERDMA_REGS_STATS_RX_PPS_METER_DROP_PKTS_REG",
        0x100..=0x1ff => "ERDMA_REGS_CEQ_DB_BASE_REG",
        0x200..=0x207 => "ERDMA_CMDQ_SQDB_REG",
        0x300..=0x307 => "ERDMA_CMDQ_CQDB_REG",
        o if o >= regs::FUNC_BAR_SIZE => return None,
        o if o >= regs::DB_POOL_START => "extended doorbell page",
        o if o >= regs::CQDB_SPACE => "ERDMA_BAR_CQDB_SPACE",
        o if o >= regs::RQDB_SPACE => "ERDMA_BAR_RQDB_SPACE",
        o if o >= regs::SQDB_SPACE => "ERDMA_BAR_SQDB_SPACE",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_with_and_without_prefix() {
        let t = || AE_TYPES.iter().map(|(v, n)| (*n, *v));
        assert_eq!(lookup("qp_fatal", &["ERDMA_AE_TYPE_"], t()), Some(0));
        assert_eq!(
            lookup("ERDMA_AE_TYPE_ACC_ERR_EVENT", &["ERDMA_AE_TYPE_"], t()),
            Some(2)
        );
        assert_eq!(lookup("cq-err", &["ERDMA_AE_TYPE_"], t()), Some(3));
        assert_eq!(lookup("nope", &["ERDMA_AE_TYPE_"], t()), None);
        assert_eq!(register(0x64), Some("ERDMA_CMDQ_SQ_DB_HOST_ADDR_REG"));
        assert_eq!(register(0x1000), Some("ERDMA_BAR_SQDB_SPACE"));
        assert_eq!(register(0x5c), None);
        assert_eq!(cmd_opcode(1, 3), "CMDQ_OPCODE_CONF_MTU");
    }
}
