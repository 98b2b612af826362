//! day0's systolic-array compute cycles against SCALE-Sim 3.0.0's, as committed in
//! `tools/calibrate/scalesim_table.csv` (written by `tools/calibrate/scalesim_compare.py`, which
//! ran SCALE-Sim itself). A change to the dataflow model that breaks equality fails here.

use accel_sim::systolic::{compute_cycles, Dataflow};
use std::process::Command;

const TABLE: &str = include_str!("../tools/calibrate/scalesim_table.csv");

struct Row {
    m: u64,
    n: u64,
    k: u64,
    dataflow: Dataflow,
    scalesim: u64,
    scalesim_wall_s: f64,
    day0_wall_s: f64,
}

fn rows() -> Vec<Row> {
    let mut lines = TABLE.lines();
    let head: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |name: &str| head.iter().position(|h| *h == name).expect(name);
    let (m, n, k, df, sc, sw, dw) = (
        col("m"),
        col("n"),
        col("k"),
        col("dataflow"),
        col("scalesim_cycles"),
        col("scalesim_wall_s"),
        col("day0_wall_s"),
    );
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Row {
                m: f[m].parse().unwrap(),
                n: f[n].parse().unwrap(),
                k: f[k].parse().unwrap(),
                dataflow: f[df].parse().unwrap(),
                scalesim: f[sc].parse().unwrap(),
                scalesim_wall_s: f[sw].parse().unwrap(),
                day0_wall_s: f[dw].parse().unwrap(),
            }
        })
        .collect()
}

#[test]
fn every_committed_shape_matches_scalesim_exactly() {
    let rows = rows();
    assert!(rows.len() >= 30, "the table covers shapes x os/ws/is");
    for df in Dataflow::ALL {
        assert!(rows.iter().any(|r| r.dataflow == df), "no {df} rows");
    }
    assert!(rows.iter().any(|r| r.m < 64), "skinny shapes are covered");
    for r in &rows {
        assert_eq!(
            compute_cycles(r.m, r.n, r.k, 128, 128, r.dataflow),
            r.scalesim,
            "{}x{}x{} {}",
            r.m,
            r.n,
            r.k,
            r.dataflow
        );
    }
}

#[test]
fn the_command_reports_scalesim_cycles_beside_the_total() {
    for r in rows().iter().filter(|r| r.m * r.n * r.k <= 1 << 24) {
        let out = Command::new(env!("CARGO_BIN_EXE_day0"))
            .args([
                "kernel",
                "gemm",
                "--device",
                "systolic-128",
                "--dataflow",
                r.dataflow.name(),
                "--m",
                &r.m.to_string(),
                "--n",
                &r.n.to_string(),
                "--k",
                &r.k.to_string(),
                "--tile",
                "128x128x128",
                "--cost-only",
                "--json",
            ])
            .output()
            .expect("day0 runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(v["compute_cycles"].as_u64(), Some(r.scalesim));
        assert_eq!(v["dataflow"].as_str(), Some(r.dataflow.name()));
        assert!(v["total_cycles_with_memory"].as_u64().unwrap() >= r.scalesim);
    }
}

#[test]
fn day0_was_at_least_1000x_faster_at_1024_cubed() {
    let big: Vec<Row> = rows()
        .into_iter()
        .filter(|r| (r.m, r.n, r.k) == (1024, 1024, 1024))
        .collect();
    assert!(!big.is_empty(), "1024^3 is in the table");
    for r in big {
        let ratio = r.scalesim_wall_s / r.day0_wall_s;
        assert!(ratio >= 1000.0, "{}: only {ratio:.0}x", r.dataflow);
    }
}

#[test]
fn a_bad_dataflow_is_an_error_not_a_panic() {
    let out = Command::new(env!("CARGO_BIN_EXE_day0"))
        .args([
            "kernel",
            "gemm",
            "--device",
            "systolic-128",
            "--dataflow",
            "rs",
            "--m",
            "8",
            "--n",
            "8",
            "--k",
            "8",
        ])
        .output()
        .expect("day0 runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown dataflow"), "{err}");
}
