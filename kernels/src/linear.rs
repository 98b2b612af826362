//! Linear layer: `y[M×N] = x[M×K] · w[N×K]ᵀ` with f32 accumulation, the weight stored output-major
//! (`[out, in]`, as Hugging Face `nn.Linear` checkpoints store it). The projections of a forward pass
//! (q/kv/o, MLP, router, lm_head) are all this.
//!
//! [`linear()`] double-buffers its K loop like [`crate::gemm::gemm_db()`] and multiplies with
//! `mma_bt`, so the weight is read in its stored layout (no transposed copy). Ragged M, N and K are
//! masked by the loads (outside elements read as 0 and add nothing) and the store.
//!
//! [`run_linear`] checks the shapes and picks the tiles, so callers need not know the tunable
//! space: [`tiles_for`] takes, per dimension, the smallest declared tile that covers it, capped for
//! large shapes at a size whose double-buffered tiles fit on chip.

use dsl_core::prelude::*;
use dsl_core::SimError;

/// Double-buffered linear layer: one program per `BM×BN` output tile, K in steps of `BK`.
#[kernel(
    grid = (cdiv(y.rows(), BM), cdiv(y.cols(), BN)),
    tunable(BM = [64, 8, 16, 32, 128], BN = [128, 16, 32, 64], BK = [64, 16, 32, 128])
)]
pub fn linear<T: Float>(x: &Tensor<T>, w: &Tensor<T>, y: &Tensor<f32>) {
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(x, row, 0);
    let mut tw = load_async::<BN, BK>(w, col, 0);
    for k in (BK..x.cols() + BK).step_by(BK) {
        // Past the last step the windows lie outside x and w: they move no bytes.
        let next_x = load_async::<BM, BK>(x, row, k);
        let next_w = load_async::<BN, BK>(w, col, k);
        mma_bt(&mut acc, &tx, &tw);
        tx = next_x;
        tw = next_w;
    }
    store(y, row, col, &acc);
}

/// Largest tiles [`tiles_for`] picks (M, N, K): 64×128 outputs with 64-deep f32 operands,
/// double-buffered, take 128 KiB, inside every preset's on-chip buffer (228 KiB on h200).
const TILE_CAP: [i64; 3] = [64, 128, 64];

/// The tile configuration [`run_linear`] uses for `y[m×n] = x[m×k] · w[n×k]ᵀ`: per dimension the
/// smallest declared tile ≥ the size, or the largest declared one up to [`TILE_CAP`] when none is.
pub fn tiles_for(m: usize, n: usize, k: usize) -> Config {
    let [cm, cn, ck] = TILE_CAP;
    crate::tile_choice::covering_config(
        &linear::META,
        Config::new(),
        &[("BM", m, cm), ("BN", n, cn), ("BK", k, ck)],
    )
}

/// Runs [`linear()`] on `x [M, K]`, `w [N, K]` into `y [M, N]` (f32) with the tiles of
/// [`tiles_for`]. Shapes that do not line up are a `SimError::Launch` naming both tensors.
pub fn run_linear<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    w: &Tensor<T>,
    y: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let (m, k) = (x.rows(), x.cols());
    let n = w.rows();
    if w.cols() != k || y.rows() != m || y.cols() != n {
        return Err(SimError::Launch {
            kernel: linear::META.name.to_string(),
            message: format!(
                "shapes do not line up: x {x:?} is [M={m}, K={k}], so the weight must be \
                 [N, {k}] (got {w:?}) and y [{m}, N] with N = the weight's rows ({n}) (got {y:?})"
            ),
        });
    }
    linear::launch(launcher, &tiles_for(m, n, k), x, w, y)
}
