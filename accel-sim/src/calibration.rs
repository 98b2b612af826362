//! Error against real chips: published measurements, day0's predictions, and the fit of the
//! presets' efficiency factors.
//!
//! The measurements are data (`accel-sim/calibration/measurements.toml`, embedded as
//! [`MEASUREMENTS`]): one row per published figure, with its source, the preset it runs on,
//! the workload and shape, and whether the row is used to fit the efficiency factors
//! (`split = "fit"`) or only checked (`split = "holdout"`). Running a workload needs the kernel
//! library, so the runner lives in the `day0` crate (`day0::calibrate`); this module holds
//! what does not: parsing, error statistics, and the search that fits factors given any
//! predictor.

use crate::error::SimError;
use crate::preset::Efficiency;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The committed measurements file.
pub const MEASUREMENTS: &str = include_str!("../calibration/measurements.toml");

/// Acceptance bound on every held-out row's absolute relative error.
pub const HOLDOUT_MAX_ABS_ERROR: f64 = 0.25;
/// Acceptance bound on the mean absolute relative error over all rows.
pub const MEAN_ABS_ERROR: f64 = 0.15;

/// What a published figure measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Metric {
    /// Useful FLOP per second, in TFLOP/s (the publisher's FLOP count).
    Tflops,
    /// Bytes per second, in GB/s (the publisher's byte count).
    Gbps,
}

impl Metric {
    /// Unit as printed.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Tflops => "TFLOP/s",
            Metric::Gbps => "GB/s",
        }
    }
}

/// Whether a row is used to fit the efficiency factors or held out to check them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// The factors are fitted on this row.
    Fit,
    /// Only checked: the factors never see it.
    Holdout,
}

/// One published measurement.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    /// Short unique name.
    pub id: String,
    /// Preset the figure is predicted on.
    pub device: String,
    /// Workload (`gemm`, `gemm-fp8`, `attention-prefill`, `mla-decode`); the runner maps it to
    /// a kernel.
    pub workload: String,
    /// The workload's dimensions (names depend on the workload).
    pub shape: BTreeMap<String, u64>,
    /// What the figure measures.
    pub metric: Metric,
    /// The published figure, in the metric's unit.
    pub measured: f64,
    /// Fit or holdout.
    pub split: Split,
    /// Where the figure was published: document and section, or address.
    pub source: String,
    /// How the row maps onto day0 (what is approximated), if anything.
    #[serde(default)]
    pub note: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    row: Vec<Measurement>,
}

/// Parses a measurements file; `source` names it in errors.
pub fn parse(source: &str, text: &str) -> Result<Vec<Measurement>, SimError> {
    let bad = |field: Option<String>, message: String| SimError::Preset {
        source: source.to_string(),
        field,
        message,
    };
    let file: File = toml::from_str(text).map_err(|e| bad(None, e.message().to_string()))?;
    let mut seen = std::collections::BTreeSet::new();
    for m in &file.row {
        if !seen.insert(m.id.clone()) {
            return Err(bad(
                Some("id".into()),
                format!("duplicate row id `{}`", m.id),
            ));
        }
        if !(m.measured.is_finite() && m.measured > 0.0) {
            return Err(bad(
                Some(format!("{}.measured", m.id)),
                "must be a positive number".into(),
            ));
        }
        if m.source.trim().is_empty() {
            return Err(bad(
                Some(format!("{}.source", m.id)),
                "every figure names its source".into(),
            ));
        }
    }
    Ok(file.row)
}

/// What day0 predicts for one workload: its time and the publisher's count of its work.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Prediction {
    /// Predicted time in seconds.
    pub time_s: f64,
    /// FLOP by the publisher's formula.
    pub flop: f64,
    /// Bytes by the publisher's formula.
    pub bytes: f64,
}

impl Prediction {
    /// The predicted figure in `metric`'s unit.
    pub fn value(&self, metric: Metric) -> f64 {
        match metric {
            Metric::Tflops => self.flop / self.time_s / 1e12,
            Metric::Gbps => self.bytes / self.time_s / 1e9,
        }
    }
}

/// One row of the calibration table.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The measurement.
    pub measurement: Measurement,
    /// day0's figure in the same unit.
    pub predicted: f64,
    /// (predicted − measured) / measured.
    pub error: f64,
}

/// The calibration table with its statistics.
#[derive(Debug, Clone, Serialize)]
pub struct Table {
    /// One row per measurement, in file order.
    pub rows: Vec<Row>,
    /// Mean absolute relative error over all rows.
    pub mean_abs_error: f64,
    /// Mean absolute relative error over the fit rows.
    pub fit_mean_abs_error: f64,
    /// Largest absolute relative error over the held-out rows.
    pub holdout_max_abs_error: f64,
    /// Efficiency factors used, per device.
    pub factors: BTreeMap<String, Efficiency>,
}

impl Table {
    /// Builds the table from measurements and their predictions (same order).
    pub fn new(
        measurements: &[Measurement],
        predictions: &[Prediction],
        factors: BTreeMap<String, Efficiency>,
    ) -> Table {
        let rows: Vec<Row> = measurements
            .iter()
            .zip(predictions)
            .map(|(m, p)| {
                let predicted = p.value(m.metric);
                Row {
                    measurement: m.clone(),
                    predicted,
                    error: (predicted - m.measured) / m.measured,
                }
            })
            .collect();
        let mean = |it: &mut dyn Iterator<Item = f64>| {
            let (s, n) = it.fold((0.0, 0usize), |(s, n), e| (s + e.abs(), n + 1));
            if n == 0 {
                0.0
            } else {
                s / n as f64
            }
        };
        let mean_abs_error = mean(&mut rows.iter().map(|r| r.error));
        let fit_mean_abs_error = mean(
            &mut rows
                .iter()
                .filter(|r| r.measurement.split == Split::Fit)
                .map(|r| r.error),
        );
        let holdout_max_abs_error = rows
            .iter()
            .filter(|r| r.measurement.split == Split::Holdout)
            .map(|r| r.error.abs())
            .fold(0.0, f64::max);
        Table {
            rows,
            mean_abs_error,
            fit_mean_abs_error,
            holdout_max_abs_error,
            factors,
        }
    }

    /// The held-out rows whose error exceeds [`HOLDOUT_MAX_ABS_ERROR`], and whether the mean
    /// exceeds [`MEAN_ABS_ERROR`], as sentences (empty when the table passes).
    pub fn failures(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .rows
            .iter()
            .filter(|r| {
                r.measurement.split == Split::Holdout && r.error.abs() > HOLDOUT_MAX_ABS_ERROR
            })
            .map(|r| {
                format!(
                    "held-out row `{}` is off by {:+.1}% (bound ±{:.0}%)",
                    r.measurement.id,
                    r.error * 100.0,
                    HOLDOUT_MAX_ABS_ERROR * 100.0
                )
            })
            .collect();
        if self.mean_abs_error > MEAN_ABS_ERROR {
            out.push(format!(
                "mean absolute error {:.1}% exceeds {:.0}%",
                self.mean_abs_error * 100.0,
                MEAN_ABS_ERROR * 100.0
            ));
        }
        out
    }

    /// The table as Markdown (the body of CALIBRATION.md's table).
    pub fn markdown(&self) -> String {
        let mut s = String::from(
            "| id | device | workload | shape | split | measured | day0 | error | source |\n\
             |---|---|---|---|---|---:|---:|---:|---|\n",
        );
        for r in &self.rows {
            let m = &r.measurement;
            let shape: Vec<String> = m.shape.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {:.0} {} | {:.0} | {:+.1}% | {} |\n",
                m.id,
                m.device,
                m.workload,
                shape.join(" "),
                match m.split {
                    Split::Fit => "fit",
                    Split::Holdout => "holdout",
                },
                m.measured,
                m.metric.unit(),
                r.predicted,
                r.error * 100.0,
                m.source
            ));
        }
        s.push_str(&format!(
            "\nMean absolute error {:.1}% (fit rows {:.1}%); largest held-out error {:.1}%.\n",
            self.mean_abs_error * 100.0,
            self.fit_mean_abs_error * 100.0,
            self.holdout_max_abs_error * 100.0
        ));
        for (d, e) in &self.factors {
            s.push_str(&format!(
                "Factors on `{d}`: matrix {:.3}, hbm {:.3}.\n",
                e.matrix, e.hbm
            ));
        }
        s
    }
}

/// Minimises `f` over `[lo, hi]` by golden-section search to within `tol` (the error curves
/// are unimodal in one factor: too low overshoots the time, too high undershoots it).
pub fn golden_min(mut f: impl FnMut(f64) -> f64, lo: f64, hi: f64, tol: f64) -> f64 {
    let g = (5f64.sqrt() - 1.0) / 2.0;
    let (mut a, mut b) = (lo, hi);
    let mut c = b - g * (b - a);
    let mut d = a + g * (b - a);
    let (mut fc, mut fd) = (f(c), f(d));
    while b - a > tol {
        if fc <= fd {
            b = d;
            d = c;
            fd = fc;
            c = b - g * (b - a);
            fc = f(c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + g * (b - a);
            fd = f(d);
        }
    }
    (a + b) / 2.0
}

/// Fits one device's factors: coordinate descent over `matrix` then `hbm` (two sweeps), each by
/// [`golden_min`] on `[0.3, 1.0]`, minimising `loss` (the fit rows' mean absolute error).
/// Results are rounded to 0.005 so the committed presets stay readable.
pub fn fit_factors(mut loss: impl FnMut(&Efficiency) -> f64, start: Efficiency) -> Efficiency {
    let mut e = start;
    for _ in 0..2 {
        e.matrix = golden_min(
            |x| {
                loss(&Efficiency {
                    matrix: x,
                    hbm: e.hbm,
                })
            },
            0.3,
            1.0,
            0.004,
        );
        e.hbm = golden_min(
            |x| {
                loss(&Efficiency {
                    matrix: e.matrix,
                    hbm: x,
                })
            },
            0.3,
            1.0,
            0.004,
        );
    }
    let round = |x: f64| ((x / 0.005).round() * 0.005).clamp(0.005, 1.0);
    Efficiency {
        matrix: round(e.matrix),
        hbm: round(e.hbm),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_measurements_parse() {
        let rows = parse("measurements.toml", MEASUREMENTS).unwrap();
        assert!(rows.len() >= 8);
        assert!(rows.iter().any(|r| r.split == Split::Holdout));
        assert!(rows.iter().any(|r| r.split == Split::Fit));
    }

    #[test]
    fn duplicate_ids_are_named() {
        let one =
            "[[row]]\nid = \"a\"\ndevice = \"h800\"\nworkload = \"gemm\"\nshape = { m = 1 }\n\
                   metric = \"tflops\"\nmeasured = 1.0\nsplit = \"fit\"\nsource = \"x\"\n";
        let e = parse("t", &format!("{one}{one}")).unwrap_err().to_string();
        assert!(e.contains("duplicate row id `a`"), "{e}");
    }

    #[test]
    fn golden_section_finds_the_minimum() {
        let x = golden_min(|x| (x - 0.7).abs(), 0.3, 1.0, 1e-4);
        assert!((x - 0.7).abs() < 1e-3, "{x}");
    }
}
