//! Row softmax: `y[r][c] = exp(x[r][c] − max_r) / Σ_c exp(x[r][c] − max_r)` over the last dimension.
//!
//! [`softmax()`] handles rows of any width with two passes over column tiles of width `BC`:
//! 1. online statistics: a running row max `m` and a running sum `s` of `exp(x − m)`, rescaled by
//!    `exp(m_old − m_new)` whenever the max grows (one read of the row);
//! 2. output: `exp(x − m) / s`, cast back to `T` and stored (a second read of the row).
//!
//! Everything is computed in f32 (bf16 tiles are widened with `cast::<f32>`). Ragged edges load as
//! −∞, so padding never wins the max and contributes `exp(−∞) = 0` to the sum. Rows past the end of
//! the tensor are all −∞ and turn into NaN, but only in their own (never stored) rows: every
//! operation here is row-local.

use crate::gemm::GemmDtype;
use dsl_core::prelude::*;

/// Numerically stable row softmax: one program per `BR` rows, columns in tiles of `BC`.
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BR = [8, 16, 32, 1, 4], BC = [256, 512, 1024, 64, 128])
)]
pub fn softmax<T: Float>(x: &Tensor<T>, y: &Tensor<T>) {
    let r = program_id(0) * BR;
    // Pass 1: running max and rescaled running sum.
    let mut m = full::<f32, BR, 1>(f32::NEG_INFINITY);
    let mut s = zeros::<f32, BR, 1>();
    for c in (0..x.cols()).step_by(BC) {
        let t = load_or::<BR, BC>(x, r, c, f32::NEG_INFINITY);
        let tf = cast::<f32>(&t);
        let m_new = maximum(&m, &row_max(&tf));
        // exp(−∞ − m_new) = 0 on the first tile of an in-bounds row (m_new is finite there).
        let alpha = exp(&sub(&m, &m_new));
        let p = exp(&sub_col(&tf, &m_new));
        s = add(&mul(&s, &alpha), &row_sum(&p));
        m = m_new;
    }
    // Pass 2: normalised output.
    for c in (0..x.cols()).step_by(BC) {
        let t = load_or::<BR, BC>(x, r, c, f32::NEG_INFINITY);
        let tf = cast::<f32>(&t);
        let p = exp(&sub_col(&tf, &m));
        let o = div_col(&p, &s);
        store(y, r, c, &cast::<T>(&o));
    }
}

/// One softmax problem: shape, dtype, tile choice and data seed.
#[derive(Debug, Clone)]
pub struct SoftmaxCase {
    /// Rows (independent softmaxes).
    pub rows: usize,
    /// Columns (the softmax dimension).
    pub cols: usize,
    /// Element dtype of x and y.
    pub dtype: GemmDtype,
    /// Tunable values (`BR`, `BC`); unset ones take their first declared value.
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// The outcome of a softmax case: the report (with `max_rel_error` set in functional runs) and the
/// output (functional runs only).
#[derive(Debug)]
pub struct SoftmaxRun {
    /// The launch.
    pub launch: Launch,
    /// y, row-major, as f32 values of `T` (functional runs).
    pub output: Option<Vec<f32>>,
}

/// Scale of the random inputs: uniform in [-INPUT_SCALE, INPUT_SCALE), wide enough that the row max
/// matters (outputs span e⁻⁸ in ratio).
pub const INPUT_SCALE: f32 = 4.0;

/// Runs a softmax case: random inputs (uniform in ±[`INPUT_SCALE`]), output poisoned with NaN,
/// launch, and — in functional runs — comparison with the f64 reference of the rounded inputs.
pub fn run_softmax(
    launcher: &Launcher,
    case: &SoftmaxCase,
) -> Result<SoftmaxRun, dsl_core::SimError> {
    match case.dtype {
        GemmDtype::F32 => run_typed::<f32>(launcher, case),
        GemmDtype::Bf16 => run_typed::<bf16>(launcher, case),
    }
}

fn run_typed<T: Float>(
    launcher: &Launcher,
    case: &SoftmaxCase,
) -> Result<SoftmaxRun, dsl_core::SimError> {
    let (rows, cols) = (case.rows, case.cols);
    let mut t = crate::testdata::CaseTensors::new(launcher, case.seed, softmax::META.name);
    let x = t.input::<T>(&[rows, cols], 0.0, INPUT_SCALE)?;
    let y = t.output::<T>(&[rows, cols]);
    let mut launch = softmax::launch(launcher, &case.config, &x, &y)?;
    let output = y.to_vec();
    if let (Some(out), Some(xv)) = (&output, x.to_vec()) {
        let want = crate::reference::softmax_rows(&xv, rows, cols);
        launch.report.max_rel_error = Some(crate::reference::rel_error(out, &want));
    }
    Ok(SoftmaxRun { launch, output })
}
