//! Known flakes: whether a failed matrix cell
//! failed only by a recognised flake, and may be rerun. It replaced
//! ci/matrix.py's `known_flakes` and `failed_only_by_known_siw_race`.

use crate::pyjson::Json;

/// Failure reasons ci/guest/ci-lib.sh gives when its siw diagnosis
/// recognises one of the two connection-setup races in the guest kernel's
/// siw (ci/README.md, "siw: rdma_cm connection setup is flaky").
pub const KNOWN_SIW_RACES: [&str; 2] =
    ["siw_accept lost-wakeup race", "siw rejected the MPA reply"];

/// Not about the transport: perftest's clock calibration (TSC samples
/// against gettimeofday, r^2 >= 0.9) fails on a loaded TCG host; the tool
/// then prints no report and exits 1, and its peer fails with it.
pub const KNOWN_HOST_FLAKES: [&str; 1] = ["perftest could not calibrate its clock"];

/// Not about the transport either: when SMC-R registers a new buffer its
/// LLC waits 2 s (`SMC_LLC_WAIT_TIME`) for the peer's CONFIRM_RKEY answer;
/// with 64 connections opening at once on a loaded TCG host the answer can
/// come later, and that one connection falls back to TCP with
/// `SMC_CLC_DECL_ERR_REGBUF` (the guest's dmesg then shows the late answer
/// as "dropped unexpected LLC msg"; seen once, 2026-11-29, with no frame
/// dropped and no checker finding).
pub const KNOWN_SMC_FLAKES: [&str; 1] = ["SMC_CLC_DECL_ERR_REGBUF"];

/// The flakes recognised in a cell: the host ones everywhere, the siw races
/// in the siw cells, the SMC-R LLC timeout in the loss-free SMC-R cells
/// (under loss the same decline comes with the rxe deadlock, which must
/// not be rerun away).
pub fn known_flakes(cell: &str) -> Vec<&'static str> {
    let mut k = KNOWN_HOST_FLAKES.to_vec();
    if cell.starts_with("siw") {
        k.extend(KNOWN_SIW_RACES);
    }
    if cell.contains("smcr") && !cell.contains("lossy") {
        k.extend(KNOWN_SMC_FLAKES);
    }
    k
}

/// When every failed row of `tests` names a known flake of the cell (and
/// one failed at least): "TEST: FLAKE; ..." for the record of the rerun.
/// Anything else fails the cell at once (`None`).
pub fn failed_only_by_known_flakes(tests: &[Json], cell: &str) -> Option<String> {
    let known = known_flakes(cell);
    let fails: Vec<&Json> = tests
        .iter()
        .filter(|t| t.at("status").str() == "FAIL")
        .collect();
    if fails.is_empty() {
        return None;
    }
    let why: Option<Vec<String>> = fails
        .iter()
        .map(|t| {
            let detail = t.at("detail").str();
            known
                .iter()
                .find(|k| detail.contains(*k))
                .map(|k| format!("{}: {k}", t.at("test")))
        })
        .collect();
    why.map(|w| w.join("; "))
}
