//! Split-K linear layers: the decode shapes' answer to a grid smaller than the device.
//!
//! A decode step multiplies a few rows by a wide weight: `y[M×N] = x[M×K] · w[N×K]ᵀ` with M of
//! one batch (64 sequences), K the hidden size (7168) and N often small (a router's 256 experts, a
//! 576-wide latent projection, 1536 query-LoRA rows). One program per output tile then leaves most
//! cores idle (DeepSeek-V3's `q_a_proj` at M = 64 is 12 tiles of 128 columns on 132 SMs), and each
//! of those few programs streams its whole K alone: the weight, the only thing the step must read,
//! comes in at a fraction of HBM bandwidth. Splitting K over `S` programs per tile (cuBLAS's and
//! CUTLASS's split-K, "stream-K" in its persistent form) puts `S` times more programs to work; each
//! writes its partial tile to an `[M, S·N]` f32 workspace and [`split_k_reduce()`] sums them.
//!
//! Whether and how far to split is not a tunable of the kernels but the launch's decision:
//! [`fastest_split`] times the candidates on the simulator (a split pays only while the cores it
//! adds outweigh the partials it writes and reads back), and
//! [`crate::linear::run_linear_weight`] runs the winner for every stored weight format.

use crate::gemm_fp8::fp8_matmul_bt_tile;
use crate::linear::{cast_matmul_bt_tile, fp8w_matmul_bt_tile};
use crate::moe::expert_gemm::matmul_bt_tile;
use dsl_core::prelude::*;
use dsl_core::SimError;

/// Fewest K-steps a split keeps: below this a split's pipeline fill and its partial tile's store
/// and reload outweigh what its core adds.
pub const MIN_STEPS_PER_SPLIT: usize = 4;

/// Most K splits of one output tile: the partial tiles written and read back grow with it.
pub const MAX_SPLITS: usize = 16;

/// Split-K linear layer over float weights (f32 activations and weights): program `(i, j, s)`
/// multiplies row tile `i` by column tile `j` over the `span` columns of K from `s·span`
/// ([`matmul_bt_tile`] on column views of both operands, so the tile's loads stop at the
/// split's end) and stores the f32 partial tile into columns `s·N ..` of the `[M, S·N]`
/// workspace `part` (each output row's `S` partials side by side, so [`split_k_reduce()`] reads
/// them in one go).
#[kernel(
    grid = (cdiv(x.rows(), BM), cdiv(w.rows(), BN), cdiv(x.cols(), usize::max(span, 1))),
    tunable(BM = [64, 8, 16, 32, 128], BN = [128, 16, 32, 64], BK = [64, 16, 32, 128]),
    helpers(matmul_bt_tile)
)]
pub fn linear_split_k<T: Float>(x: &Tensor<T>, w: &Tensor<T>, part: &Tensor<f32>, span: usize) {
    let (row, col, s) = (program_id(0) * BM, program_id(1) * BN, program_id(2));
    let k0 = s * span;
    let acc = matmul_bt_tile::<T, BM, BN, BK>(
        &x.cols_clipped(k0, span),
        &w.cols_clipped(k0, span),
        row,
        col,
    );
    store(&part.cols_clipped(s * w.rows(), w.rows()), row, col, &acc);
}

/// Split-K linear layer over a bf16 (or any `T`) weight with f32 activations rounded to `T` on
/// chip ([`crate::linear::linear_cast()`]'s product, split as [`linear_split_k()`]).
#[kernel(
    grid = (cdiv(x.rows(), BM), cdiv(w.rows(), BN), cdiv(x.cols(), usize::max(span, 1))),
    tunable(BM = [64, 8, 16, 32, 128], BN = [128, 16, 32, 64], BK = [64, 16, 32, 128]),
    helpers(cast_matmul_bt_tile)
)]
pub fn linear_cast_split_k<T: Float>(
    x: &Tensor<f32>,
    w: &Tensor<T>,
    part: &Tensor<f32>,
    span: usize,
) {
    let (row, col, s) = (program_id(0) * BM, program_id(1) * BN, program_id(2));
    let k0 = s * span;
    let acc = cast_matmul_bt_tile::<T, BM, BN, BK>(
        &x.cols_clipped(k0, span),
        &w.cols_clipped(k0, span),
        row,
        col,
    );
    store(&part.cols_clipped(s * w.rows(), w.rows()), row, col, &acc);
}

/// Split-K W8A8 linear layer over a block-FP8 weight ([`crate::linear::linear_fp8()`]'s product,
/// split as [`linear_split_k()`]). `span` is a whole number of 128-wide scale blocks, so each
/// split's scales are the column window `k0/128 ..` of both scale tensors.
#[kernel(
    grid = (cdiv(a.rows(), BM), cdiv(w.rows(), BN), cdiv(a.cols(), usize::max(span, 1))),
    tunable(BM = [64, 16, 32, 128], BN = [128, 64, 32], BK = [128]),
    helpers(fp8_matmul_bt_tile)
)]
pub fn linear_fp8_split_k(
    a: &Tensor<fp8e4m3>,
    sa: &Tensor<f32>,
    w: &Tensor<fp8e4m3>,
    sw: &Tensor<f32>,
    part: &Tensor<f32>,
    span: usize,
) {
    let (row, col, s) = (program_id(0) * BM, program_id(1) * BN, program_id(2));
    let k0 = s * span;
    let acc = fp8_matmul_bt_tile::<BM, BN, BK>(
        &a.cols_clipped(k0, span),
        &sa.cols_clipped(k0 / 128, span / 128),
        &w.cols_clipped(k0, span),
        &sw.cols_clipped(k0 / 128, span / 128),
        row,
        col,
    );
    store(&part.cols_clipped(s * w.rows(), w.rows()), row, col, &acc);
}

/// Split-K block-FP8 linear layer on a matrix unit without an FP8 mode (W8A16,
/// [`crate::linear::linear_fp8w()`]'s product, split as [`linear_split_k()`]). `span` is a whole
/// number of 128-wide scale blocks.
#[kernel(
    grid = (cdiv(x.rows(), BM), cdiv(w.rows(), BN), cdiv(x.cols(), usize::max(span, 1))),
    tunable(BM = [64, 16, 32, 128], BN = [128, 64, 32], BK = [128]),
    helpers(fp8w_matmul_bt_tile)
)]
pub fn linear_fp8w_split_k<T: Float>(
    x: &Tensor<f32>,
    w: &Tensor<fp8e4m3>,
    sw: &Tensor<f32>,
    part: &Tensor<f32>,
    span: usize,
) {
    let (row, col, s) = (program_id(0) * BM, program_id(1) * BN, program_id(2));
    let k0 = s * span;
    let acc = fp8w_matmul_bt_tile::<T, BM, BN, BK>(
        &x.cols_clipped(k0, span),
        &w.cols_clipped(k0, span),
        &sw.cols_clipped(k0 / 128, span / 128),
        row,
        col,
    );
    store(&part.cols_clipped(s * w.rows(), w.rows()), row, col, &acc);
}

/// Sums the `S` partial rows of a split-K product: `y[r] = Σ_s part[r·S + s]` (`part [M·S, N]`:
/// the split kernels' `[M, S·N]` workspace, each row's splits side by side, read as rows; `y [M,
/// N]`; f32). A program sums `BR` output rows of `BC` columns: each row's `S` partials are one
/// `SB`-row tile (`SB ≥ S`; rows past `S` lie outside the row's view and read as 0), and the next
/// two rows' tiles load while this one is summed, so a program waits on the memory latency once,
/// not once per row.
#[kernel(
    grid = (cdiv(y.rows(), BR), cdiv(y.cols(), BC)),
    tunable(SB = [16, 2, 4, 8], BR = [8, 1, 2, 4, 16, 32], BC = [128, 64, 256])
)]
pub fn split_k_reduce(part: &Tensor<f32>, y: &Tensor<f32>) {
    let (first, col) = (program_id(0) * BR, program_id(1) * BC);
    let end = usize::min(first + BR, y.rows());
    let splits = part.rows() / y.rows();
    // Row `r`'s partials are rows `r·S .. (r+1)·S`; past this program's rows the view is empty
    // and its load moves no bytes.
    let (lo, hi) = (first * splits, end * splits);
    let mut t0 = load_async::<SB, BC>(&part.rows_clipped(lo, usize::min(lo + splits, hi)), 0, col);
    let mut t1 = load_async::<SB, BC>(
        &part.rows_clipped(usize::min(lo + splits, hi), usize::min(lo + 2 * splits, hi)),
        0,
        col,
    );
    for r in first..end {
        let next = usize::min((r + 2) * splits, hi);
        let t2 = load_async::<SB, BC>(
            &part.rows_clipped(next, usize::min(next + splits, hi)),
            0,
            col,
        );
        store(y, r, col, &col_sum(&t0));
        t0 = t1;
        t1 = t2;
    }
}

/// Most ways to split the K of an `m×n×k` product tiled `bm×bn` with `bk`-deep steps on `cores`
/// cores: 1 (no split) when the output tiles fill more than half the cores or K is too short to
/// share; otherwise as many splits as fill the cores, each at least [`MIN_STEPS_PER_SPLIT`] steps
/// deep, and at most [`MAX_SPLITS`].
pub fn max_splits(
    m: usize,
    n: usize,
    k: usize,
    bm: usize,
    bn: usize,
    bk: usize,
    cores: usize,
) -> usize {
    let tiles = m.div_ceil(bm.max(1)) * n.div_ceil(bn.max(1));
    let steps = k.div_ceil(bk.max(1));
    if tiles == 0 || tiles * 2 > cores {
        return 1;
    }
    (cores / tiles)
        .min(steps / MIN_STEPS_PER_SPLIT)
        .clamp(1, MAX_SPLITS)
}

/// The K columns each of `splits` splits of a `k`-deep product covers: whole `bk`-wide steps.
pub fn split_width(k: usize, bk: usize, splits: usize) -> usize {
    k.div_ceil(bk.max(1)).div_ceil(splits.max(1)) * bk.max(1)
}

/// The split of an `m×n×k` product in `cfg`'s tiles (`BM`, `BN`, `BK`) that runs fastest on
/// `launcher`'s device: `run(l, s)` launches the product split `s` ways (1: the unsplit kernel) on
/// `l`, and each candidate (1, then 2, 4, 8, 16 up to [`max_splits`], as splits of whole steps) is
/// timed cost-only on a clone of `launcher`; the fewest splits win a tie. Like Triton's autotuning
/// at the first launch, but on the simulator, so the choice is a pure function of the shapes and
/// the device (and shared through the launcher's memo with every later launch of the shape).
pub fn fastest_split<F>(
    launcher: &Launcher,
    (m, n, k): (usize, usize, usize),
    cfg: &Config,
    run: F,
) -> Result<usize, SimError>
where
    F: Fn(&Launcher, usize) -> Result<Vec<(&'static str, Launch)>, SimError>,
{
    let tile = |name: &str| cfg.get(name).unwrap_or(1).max(1) as usize;
    let bk = tile("BK");
    let most = max_splits(
        m,
        n,
        k,
        tile("BM"),
        tile("BN"),
        bk,
        launcher.preset.cores as usize,
    );
    if most < 2 {
        return Ok(1);
    }
    let probe = launcher
        .clone()
        .with_backend(dsl_core::Backend::CostOnly)
        .with_trace(false);
    let steps = k.div_ceil(bk);
    let mut best: Option<(u64, usize)> = None;
    let mut tried = Vec::new();
    for want in [1, 2, 4, 8, 16].into_iter().filter(|s| *s <= most) {
        // Splits of whole steps: `want` may round to fewer non-empty ones.
        let s = steps.div_ceil(steps.div_ceil(want));
        if tried.contains(&s) {
            continue;
        }
        tried.push(s);
        let cycles: u64 = run(&probe, s)?.iter().map(|(_, l)| l.report.cycles).sum();
        if best.is_none_or(|(c, _)| cycles < c) {
            best = Some((cycles, s));
        }
    }
    Ok(best.map_or(1, |(_, s)| s))
}

/// Launches an `m×n×k` product split the [`fastest_split`] way: `run(l, s)` as there, timed on
/// the candidates, then run on `launcher` at the winner.
pub fn run_fastest_split<F>(
    launcher: &Launcher,
    dims: (usize, usize, usize),
    cfg: &Config,
    run: F,
) -> Result<Vec<(&'static str, Launch)>, SimError>
where
    F: Fn(&Launcher, usize) -> Result<Vec<(&'static str, Launch)>, SimError>,
{
    run(launcher, fastest_split(launcher, dims, cfg, &run)?)
}

/// Runs a split-K product into `y [M, N]`: `partials` launches the split kernel into the
/// `[M, S·N]` workspace it is given, then [`split_k_reduce()`] sums each row's `S` partials into
/// `y`. Returns both launches with their kernels' names.
pub fn run_split<F>(
    launcher: &Launcher,
    y: &Tensor<f32>,
    splits: usize,
    partials: F,
) -> Result<Vec<(&'static str, Launch)>, SimError>
where
    F: FnOnce(&Tensor<f32>) -> Result<(&'static str, Launch), SimError>,
{
    let (m, n) = (y.rows(), y.cols());
    let name = split_k_reduce::META.name;
    let part = crate::weight::scratch::<f32>(launcher, &[m, splits * n]);
    let first = partials(&part)?;
    let rows = part
        .reshaped(&[m * splits, n])
        .map_err(|e| crate::weight::bad(name, e))?;
    let sb =
        crate::tile_choice::at_least(&split_k_reduce::META, "SB", splits).ok_or_else(|| {
            crate::weight::bad(
                name,
                format!("{splits} splits exceed the largest partial tile (at most {MAX_SPLITS})"),
            )
        })?;
    let cfg = Config::new().with("SB", sb).with("BR", 8).with("BC", 128);
    let reduce = split_k_reduce::launch(launcher, &cfg, &rows, y)?;
    Ok(vec![first, (name, reduce)])
}
