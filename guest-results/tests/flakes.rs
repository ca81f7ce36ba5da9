//! Known flakes: a failed cell is rerun only when every failure names one.

use guest_results::flakes::{failed_only_by_known_flakes, known_flakes};
use guest_results::pyjson::Json;

fn rows(json: &str) -> Vec<Json> {
    let j: Json = serde_json::from_str(json).expect("test JSON");
    j.items().to_vec()
}

const SIW_RACE: &str = r#"[
    {"test": "ping", "status": "PASS", "detail": ""},
    {"test": "rping", "status": "FAIL", "detail": "client: FAIL rc=1 (siw_accept lost-wakeup race, see ci/README.md)"},
    {"test": "ib_send_bw", "status": "FAIL", "detail": "server: FAIL perftest could not calibrate its clock (r=0.5)"}]"#;

#[test]
fn the_siw_races_count_in_siw_cells_only() {
    assert_eq!(
        known_flakes("rxe"),
        ["perftest could not calibrate its clock"]
    );
    assert_eq!(known_flakes("siw-conn").len(), 3);
    assert_eq!(
        failed_only_by_known_flakes(&rows(SIW_RACE), "siw").as_deref(),
        Some("rping: siw_accept lost-wakeup race; ib_send_bw: perftest could not calibrate its clock")
    );
    assert_eq!(failed_only_by_known_flakes(&rows(SIW_RACE), "rxe"), None);
}

/// An LLC answer that came too late under load: rerun in the loss-free
/// SMC-R cells only.
#[test]
fn the_smc_llc_timeout_counts_in_loss_free_smcr_cells() {
    let late = r#"[{"test": "smc-64conns", "status": "FAIL", "detail": "client: FAIL rc=1 STREAM-RESULT smc_mode=mixed fallback_name=SMC_CLC_DECL_ERR_REGBUF errors=1"}]"#;
    for cell in ["smcr", "erdma-smcr", "erdma-rxe-smcr"] {
        assert!(
            failed_only_by_known_flakes(&rows(late), cell).is_some(),
            "{cell}"
        );
    }
    for cell in ["smcr-lossy", "smcr-lossy-4conns", "rxe"] {
        assert_eq!(
            failed_only_by_known_flakes(&rows(late), cell),
            None,
            "{cell}"
        );
    }
}

#[test]
fn any_other_failure_or_none_at_all_is_no_flake() {
    let other = SIW_RACE
        .replace("(r=0.5)", "")
        .replace("perftest could not calibrate its clock", "server rc=1");
    assert_eq!(failed_only_by_known_flakes(&rows(&other), "siw"), None);
    let passed = r#"[{"test": "ping", "status": "PASS", "detail": "siw_accept lost-wakeup race"}]"#;
    assert_eq!(failed_only_by_known_flakes(&rows(passed), "siw"), None);
    assert_eq!(failed_only_by_known_flakes(&[], "siw"), None);
}
