//! Systolic-array dataflows timed as SCALE-Sim times them.
//!
//! A systolic array of `R × C` processing elements runs a GEMM `C[M×N] = A[M×K] · B[K×N]` in one
//! of three dataflows. SCALE-Sim (`scalesim-project/scale-sim-v3`, package `scalesim` 3.0.0) maps a
//! GEMM of its `-i gemm` topology format to a convolution with an `M × K` input feature map, `N`
//! filters of `1 × K` and one channel (`topology_utils.py`, `load_arrays_gemm`), so its
//! spatio-temporal dimensions (`calc_spatio_temporal_params`) are:
//!
//! | dataflow | `Sr` (array rows) | `Sc` (array columns) | `T` (time) |
//! |---|---|---|---|
//! | output stationary (`os`) | M | N | K |
//! | weight stationary (`ws`) | K | N | M |
//! | input stationary (`is`)  | K | M | N |
//!
//! The work is cut into `⌈Sr/R⌉ · ⌈Sc/C⌉` folds. Each fold's demand matrix, as built by
//! `compute/systolic_compute_{os,ws,is}.py`, is `T + R + C − 2` rows long for OS (operands stream
//! in skewed for `T` cycles, then the last partial sums ripple across `R + C − 2` PEs) and
//! `T + 2R + C − 2` for WS and IS (an extra `R` cycles to preload the stationary operand into the
//! array). The folds run back to back, and the compute report counts the demand rows minus one:
//!
//! `compute_cycles = ⌈Sr/R⌉ · ⌈Sc/C⌉ · (T + R + C − 2) − 1` (OS),
//! `compute_cycles = ⌈Sr/R⌉ · ⌈Sc/C⌉ · (T + 2R + C − 2) − 1` (WS, IS).
//!
//! That is SCALE-Sim's "Total Cycles" with its memory never stalling (its "Stall Cycles" are
//! 0 when the SRAM and interface bandwidth suffice). `tools/calibrate/scalesim_compare.py`
//! checks these formulas against SCALE-Sim itself on ragged, skinny and square shapes; the
//! table it writes is pinned by `tests/systolic_scalesim.rs`.
//!
//! The time with memory ([`SystolicTiming::total_cycles`]) is day0's own estimate, not
//! SCALE-Sim's: the first fold's operands arrive after one DRAM latency, then compute and the
//! DRAM traffic overlap (SCALE-Sim's SRAMs are double-buffered), so the slower of the two sets
//! the pace.

use crate::error::SimError;
use crate::preset::DevicePreset;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Shape of a systolic array (the `[systolic]` section of a preset).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SystolicArray {
    /// Processing-element rows (SCALE-Sim `ArrayHeight`).
    pub rows: u64,
    /// Processing-element columns (SCALE-Sim `ArrayWidth`).
    pub cols: u64,
}

/// Which operand stays in the processing elements while the others stream through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Dataflow {
    /// Output stationary: each PE accumulates one output element over K.
    #[default]
    Os,
    /// Weight stationary: each PE holds one element of B; A streams through.
    Ws,
    /// Input stationary: each PE holds one element of A; B streams through.
    Is,
}

impl Dataflow {
    /// The name SCALE-Sim's config uses (`os`, `ws`, `is`).
    pub fn name(self) -> &'static str {
        match self {
            Dataflow::Os => "os",
            Dataflow::Ws => "ws",
            Dataflow::Is => "is",
        }
    }

    /// All three dataflows, in SCALE-Sim's order.
    pub const ALL: [Dataflow; 3] = [Dataflow::Os, Dataflow::Ws, Dataflow::Is];
}

impl fmt::Display for Dataflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dataflow {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "os" => Ok(Dataflow::Os),
            "ws" => Ok(Dataflow::Ws),
            "is" => Ok(Dataflow::Is),
            other => Err(format!(
                "unknown dataflow `{other}`; use os (output stationary), ws (weight stationary) \
                 or is (input stationary)"
            )),
        }
    }
}

/// SCALE-Sim's spatio-temporal dimensions of a GEMM under a dataflow: `(Sr, Sc, T)`.
pub fn spatio_temporal(m: u64, n: u64, k: u64, dataflow: Dataflow) -> (u64, u64, u64) {
    match dataflow {
        Dataflow::Os => (m, n, k),
        Dataflow::Ws => (k, n, m),
        Dataflow::Is => (k, m, n),
    }
}

/// One GEMM on one systolic array: SCALE-Sim's compute cycles and day0's time with memory.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SystolicTiming {
    /// Dataflow.
    pub dataflow: Dataflow,
    /// Array rows `R`.
    pub rows: u64,
    /// Array columns `C`.
    pub cols: u64,
    /// Spatial rows `Sr` of the mapping.
    pub sr: u64,
    /// Spatial columns `Sc` of the mapping.
    pub sc: u64,
    /// Temporal dimension `T` of the mapping.
    pub t: u64,
    /// `⌈Sr/R⌉`.
    pub row_folds: u64,
    /// `⌈Sc/C⌉`.
    pub col_folds: u64,
    /// Cycles one fold takes (its demand-matrix rows).
    pub cycles_per_fold: u64,
    /// SCALE-Sim's compute cycles ("Total Cycles" without stalls).
    pub compute_cycles: u64,
    /// Useful MACs over PE-cycles of the folds (SCALE-Sim's mapping efficiency: the share of
    /// PEs the ragged folds keep mapped).
    pub mapping_efficiency: f64,
    /// Useful MACs over `R·C·compute_cycles` (SCALE-Sim's compute utilisation, near enough).
    pub compute_utilization: f64,
    /// Bytes moved from and to DRAM (day0's estimate, see [`gemm_timing`]).
    pub dram_bytes: u64,
    /// Cycles the DRAM traffic needs at the preset's bandwidth.
    pub memory_cycles: u64,
    /// day0's time with memory: one DRAM latency, then compute and traffic overlapped.
    pub total_cycles: u64,
}

/// SCALE-Sim's compute cycles for a GEMM on an `rows × cols` array (see the module docs).
/// Zero-sized problems take no cycles.
pub fn compute_cycles(m: u64, n: u64, k: u64, rows: u64, cols: u64, dataflow: Dataflow) -> u64 {
    let (sr, sc, t) = spatio_temporal(m, n, k, dataflow);
    if sr == 0 || sc == 0 || t == 0 || rows == 0 || cols == 0 {
        return 0;
    }
    let folds = sr.div_ceil(rows) * sc.div_ceil(cols);
    folds * fold_cycles(t, rows, cols, dataflow) - 1
}

/// Demand-matrix rows of one fold: `T + R + C − 2`, plus `R` preload cycles for WS and IS.
fn fold_cycles(t: u64, rows: u64, cols: u64, dataflow: Dataflow) -> u64 {
    let preload = match dataflow {
        Dataflow::Os => 0,
        Dataflow::Ws | Dataflow::Is => rows,
    };
    t + preload + rows + cols - 2
}

/// Times a GEMM with `elem_bytes`-byte inputs and outputs on `preset`'s systolic array.
///
/// DRAM traffic: if A, B and C fit the preset's SRAM together, each is moved once. Otherwise
/// the stationary fold's operand panel is kept while the other operand streams past it once per
/// fold row: `Sr·T + ⌈Sr/R⌉·Sc·T` input words plus the `M·N` outputs (an estimate of what a
/// double-buffered scratchpad with no larger reuse moves).
pub fn gemm_timing(
    preset: &DevicePreset,
    m: u64,
    n: u64,
    k: u64,
    elem_bytes: u64,
    dataflow: Dataflow,
) -> Result<SystolicTiming, SimError> {
    let array = preset.systolic.as_ref().ok_or_else(|| SimError::Preset {
        source: preset.name.clone(),
        field: Some("systolic".into()),
        message: "this device has no systolic array; dataflow timing needs a `[systolic]` \
                  section with `rows` and `cols` (see presets/systolic-128.toml)"
            .into(),
    })?;
    let (rows, cols) = (array.rows, array.cols);
    let (sr, sc, t) = spatio_temporal(m, n, k, dataflow);
    let row_folds = sr.div_ceil(rows);
    let col_folds = sc.div_ceil(cols);
    let cycles_per_fold = fold_cycles(t, rows, cols, dataflow);
    let compute = compute_cycles(m, n, k, rows, cols, dataflow);
    let macs = m as f64 * n as f64 * k as f64;
    let folds = (row_folds * col_folds) as f64;
    let mapping_efficiency = if folds > 0.0 {
        (sr * sc) as f64 / (folds * (rows * cols) as f64)
    } else {
        0.0
    };
    let compute_utilization = if compute > 0 {
        macs / ((rows * cols) as f64 * compute as f64)
    } else {
        0.0
    };
    let (a, b, c) = (m * k, k * n, m * n);
    let fits = (a + b + c).saturating_mul(elem_bytes) <= preset.sram.bytes_per_core;
    let input_words = if fits {
        a + b
    } else {
        sr * t + row_folds * sc * t
    };
    let dram_bytes = (input_words + c) * elem_bytes;
    let memory_cycles = (dram_bytes as f64 / preset.hbm_bytes_per_cycle()).ceil() as u64;
    let total_cycles = if compute == 0 {
        0
    } else {
        preset.hbm_latency_cycles() + compute.max(memory_cycles)
    };
    Ok(SystolicTiming {
        dataflow,
        rows,
        cols,
        sr,
        sc,
        t,
        row_folds,
        col_folds,
        cycles_per_fold,
        compute_cycles: compute,
        mapping_efficiency,
        compute_utilization,
        dram_bytes,
        memory_cycles,
        total_cycles,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values read off SCALE-Sim 3.0.0's COMPUTE_REPORT.csv on an 8×8 and an 8×4 array
    /// (ample SRAM, `InterfaceBandwidth: CALC`, zero stalls).
    #[test]
    fn small_arrays_match_scalesim() {
        let cases = [
            // (R, C, M, N, K, os, ws, is)
            (8, 8, 20, 13, 30, 263, 335, 419),
            (8, 8, 5, 17, 9, 68, 161, 77),
            (8, 4, 20, 13, 30, 479, 607, 619),
            (8, 4, 5, 17, 9, 94, 229, 139),
        ];
        for (r, c, m, n, k, os, ws, is) in cases {
            assert_eq!(compute_cycles(m, n, k, r, c, Dataflow::Os), os);
            assert_eq!(compute_cycles(m, n, k, r, c, Dataflow::Ws), ws);
            assert_eq!(compute_cycles(m, n, k, r, c, Dataflow::Is), is);
        }
    }

    #[test]
    fn dataflow_parses_and_rejects() {
        assert_eq!("WS".parse::<Dataflow>(), Ok(Dataflow::Ws));
        assert!("rs".parse::<Dataflow>().unwrap_err().contains("os"));
    }

    #[test]
    fn timing_needs_a_systolic_device() {
        let p = DevicePreset::load("h200").unwrap();
        let e = gemm_timing(&p, 8, 8, 8, 2, Dataflow::Os).unwrap_err();
        assert!(e.to_string().contains("systolic"), "{e}");
        let s = DevicePreset::load("systolic-128").unwrap();
        let t = gemm_timing(&s, 1024, 1024, 1024, 2, Dataflow::Os).unwrap();
        assert_eq!(t.compute_cycles, 64 * (1024 + 254) - 1);
        assert!(t.total_cycles >= t.compute_cycles && t.total_cycles >= t.memory_cycles);
    }
}
