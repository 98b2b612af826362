//! RMSNorm fused with the residual add (the pre-norm transformer block's
//! `h = x + residual; y = rmsnorm(h) · weight`):
//!
//! - `h = x + residual`, stored to `h_out` (the new residual stream);
//! - `y = h · rsqrt(mean(h²) + eps) · weight`, with the mean over the true hidden size `H`.
//!
//! [`rmsnorm_residual()`] holds a whole row in one tile of width `BH ≥ H` (ragged columns load as 0
//! and add nothing to the sum of squares). `h` is computed in f32; `y` is normalised from that f32
//! `h` (not from its `T`-rounded copy in `h_out`), then cast to `T`.
//!
//! The kernel requires `BH ≥ H`: with a narrower tile it would normalise only the first `BH`
//! columns and leave the rest unwritten. [`run_rmsnorm_residual`] picks the smallest declared `BH`
//! that fits and refuses (with a `SimError::Launch`) shapes wider than the largest one; direct
//! callers of `rmsnorm_residual::launch` must do the same (see [`bh_for`]).

use crate::gemm::GemmDtype;
use dsl_core::prelude::*;
use dsl_core::SimError;

/// Fused residual add + RMSNorm: one program per `BR` rows, the whole row (`H ≤ BH`) in one tile.
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BH = [1024, 2048, 4096, 8192, 256, 512], BR = [1, 2, 4, 8])
)]
pub fn rmsnorm_residual<T: Float>(
    x: &Tensor<T>,
    residual: &Tensor<T>,
    weight: &Tensor<T>,
    h_out: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) {
    let r = program_id(0) * BR;
    let xt = cast::<f32>(&load::<BR, BH>(x, r, 0));
    let rt = cast::<f32>(&load::<BR, BH>(residual, r, 0));
    let h = add(&xt, &rt);
    store(h_out, r, 0, &cast::<T>(&h));
    // mean(h²) over the true width: padding columns are 0 and add nothing.
    let ms = scale(&row_sum(&square(&h)), (1.0f64 / x.cols() as f64) as f32);
    let inv = rsqrt(&add_scalar(&ms, eps));
    let w = cast::<f32>(&load::<1, BH>(weight, 0, 0));
    let yn = mul_row(&mul_col(&h, &inv), &w);
    store(y, r, 0, &cast::<T>(&yn));
}

/// The declared `BH` values, ascending.
fn bh_values() -> Vec<i64> {
    let mut v: Vec<i64> = rmsnorm_residual::META
        .tunables
        .iter()
        .find(|(n, _)| *n == "BH")
        .map(|(_, v)| v.to_vec())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// The smallest declared `BH` that holds a row of `h` elements, or a `SimError::Launch` naming `h`
/// and the largest `BH` when none does.
pub fn bh_for(h: usize) -> Result<i64, SimError> {
    let vals = bh_values();
    vals.iter()
        .copied()
        .find(|&b| b as usize >= h)
        .ok_or_else(|| SimError::Launch {
            kernel: rmsnorm_residual::META.name.to_string(),
            message: format!(
                "hidden size H={h} does not fit one row tile: the largest BH is {}; \
                 rmsnorm_residual keeps a whole row on chip (add a wider BH or split the row)",
                vals.last().copied().unwrap_or(0)
            ),
        })
}

/// One fused residual-add + RMSNorm problem.
#[derive(Debug, Clone)]
pub struct RmsNormCase {
    /// Rows (tokens).
    pub rows: usize,
    /// Hidden size `H` (columns).
    pub hidden: usize,
    /// Element dtype of every tensor.
    pub dtype: GemmDtype,
    /// Tunable values (`BH`, `BR`); an unset `BH` becomes the smallest declared value ≥ `H`.
    pub config: Config,
    /// The epsilon inside the square root.
    pub eps: f32,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// The outcome of a case: the report (with `max_rel_error` = the worse of `h` and `y` in
/// functional runs) and both outputs (functional runs only).
#[derive(Debug)]
pub struct RmsNormRun {
    /// The launch.
    pub launch: Launch,
    /// `h = x + residual`, row-major (functional runs).
    pub h: Option<Vec<f32>>,
    /// `y`, row-major (functional runs).
    pub y: Option<Vec<f32>>,
    /// Max relative error of `h` (functional runs).
    pub h_rel_error: Option<f64>,
    /// Max relative error of `y` (functional runs).
    pub y_rel_error: Option<f64>,
}

/// Runs a case: x and residual uniform in [-1, 1), weight uniform in [0.5, 1.5), outputs poisoned
/// with NaN, launch, and — in functional runs — comparison of both outputs with the f64 reference
/// of the rounded inputs. Picks `BH` when the config leaves it unset; refuses `H` wider than the
/// chosen (or largest) `BH` with a `SimError::Launch`.
pub fn run_rmsnorm_residual(
    launcher: &Launcher,
    case: &RmsNormCase,
) -> Result<RmsNormRun, SimError> {
    match case.dtype {
        GemmDtype::F32 => run_typed::<f32>(launcher, case),
        GemmDtype::Bf16 => run_typed::<bf16>(launcher, case),
    }
}

fn run_typed<T: Float>(launcher: &Launcher, case: &RmsNormCase) -> Result<RmsNormRun, SimError> {
    let (rows, hid) = (case.rows, case.hidden);
    let name = rmsnorm_residual::META.name;
    let bad = |e: String| SimError::Launch {
        kernel: name.to_string(),
        message: e,
    };
    let config = match case.config.get("BH") {
        Some(bh) if (bh as usize) < hid => {
            return Err(bad(format!(
                "BH={bh} is narrower than the hidden size H={hid}; rmsnorm_residual needs BH ≥ H \
                 (leave BH unset to pick the smallest that fits)"
            )))
        }
        Some(_) => case.config.clone(),
        None => case.config.clone().with("BH", bh_for(hid)?),
    };
    let shape = [rows, hid];
    let mut t = crate::testdata::CaseTensors::new(launcher, case.seed, name);
    let x = t.input::<T>(&shape, 0.0, 1.0)?;
    let res = t.input::<T>(&shape, 0.0, 1.0)?;
    let w = t.input::<T>(&[hid], 1.0, 0.5)?;
    let (h, y) = (t.output::<T>(&shape), t.output::<T>(&shape));
    let mut launch = rmsnorm_residual::launch(launcher, &config, &x, &res, &w, &h, &y, case.eps)?;
    let (hv, yv) = (h.to_vec(), y.to_vec());
    let (mut h_rel_error, mut y_rel_error) = (None, None);
    if let (Some(ho), Some(yo), Some(xv), Some(rv), Some(wv)) =
        (&hv, &yv, x.to_vec(), res.to_vec(), w.to_vec())
    {
        let (want_h, want_y) =
            crate::reference::rmsnorm_residual(&xv, &rv, &wv, rows, hid, case.eps);
        let eh = crate::reference::rel_error(ho, &want_h);
        let ey = crate::reference::rel_error(yo, &want_y);
        h_rel_error = Some(eh);
        y_rel_error = Some(ey);
        launch.report.max_rel_error = Some(eh.max(ey));
    }
    Ok(RmsNormRun {
        launch,
        h: hv,
        y: yv,
        h_rel_error,
        y_rel_error,
    })
}
