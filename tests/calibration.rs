//! Error against real chips: recomputes the calibration table from the committed measurements
//! (`accel-sim/calibration/measurements.toml`) and the presets' committed efficiency factors,
//! so any change to the timing model shows its effect on fidelity here. After a deliberate
//! timing change, refit with `cargo run --release -- calibrate --fit --write` (see
//! CALIBRATION.md) and update CALIBRATION.md's table from `day0 calibrate`.

use accel_sim::calibration::{Split, HOLDOUT_MAX_ABS_ERROR, MEAN_ABS_ERROR};
use std::collections::BTreeMap;

#[test]
fn held_out_rows_within_25_percent_and_mean_under_15() {
    let c = day0::calibrate::table(&BTreeMap::new()).expect("table");
    println!("{}", c.markdown());
    // Every fit row must run: the factors are fitted on them.
    for (m, why) in &c.not_modelled {
        assert_eq!(
            m.split,
            Split::Holdout,
            "fit row {} cannot run: {why}",
            m.id
        );
    }
    let t = &c.table;
    assert!(t.rows.iter().any(|r| r.measurement.split == Split::Holdout));
    for r in &t.rows {
        assert!(
            r.predicted.is_finite() && r.predicted > 0.0,
            "{}",
            r.measurement.id
        );
    }
    assert!(
        t.failures().is_empty(),
        "calibration out of bounds (held-out ±{}%, mean {}%): {:?}",
        HOLDOUT_MAX_ABS_ERROR * 100.0,
        MEAN_ABS_ERROR * 100.0,
        t.failures()
    );
}

#[test]
fn committed_calibration_md_matches_the_table() {
    // CALIBRATION.md carries the table `day0 calibrate` prints; a timing change that moves a
    // figure must update it too.
    let c = day0::calibrate::table(&BTreeMap::new()).expect("table");
    let doc = include_str!("../CALIBRATION.md");
    for line in c
        .markdown()
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| id"))
    {
        assert!(doc.contains(line), "CALIBRATION.md lacks the row:\n{line}");
    }
}
