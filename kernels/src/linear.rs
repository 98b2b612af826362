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

use crate::gemm_fp8::fp8_matmul_bt_tile;
use crate::moe::expert_gemm::matmul_bt_tile;
use crate::split_k::{
    linear_cast_split_k, linear_fp8_split_k, linear_fp8w_split_k, linear_split_k,
    run_fastest_split, run_split, split_width,
};
use crate::tile_order::{grouped_grid, grouped_tile};
use dsl_core::prelude::*;
use dsl_core::SimError;

/// Double-buffered linear layer: one program per `BM×BN` output tile, K in steps of `BK`, the
/// tiles walked in groups of row tiles ([`crate::tile_order`]).
#[kernel(
    grid = grouped_grid(y.rows(), 1, BM, cdiv(y.cols(), BN)),
    tunable(BM = [64, 8, 16, 32, 128], BN = [128, 16, 32, 64], BK = [64, 16, 32, 128]),
    helpers(grouped_tile, matmul_bt_tile)
)]
pub fn linear<T: Float>(x: &Tensor<T>, w: &Tensor<T>, y: &Tensor<f32>) {
    let (_one, tile_row, tile_col, stride) = grouped_tile(1);
    let col = tile_col * BN;
    // At most one row tile: the loop skips the grid's padding programs past the last one.
    for row in (tile_row * BM..y.rows()).step_by(stride * BM) {
        let acc = matmul_bt_tile::<T, BM, BN, BK>(x, w, row, col);
        store(y, row, col, &acc);
    }
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

/// One `BM×BN` output tile of `x · wᵀ` over the whole K for f32 activations and a weight stored
/// as `T`: each activation tile is rounded to `T` on chip, so the matrix unit runs at `T`'s rate
/// whatever format device memory holds the activations in (f32 on the reference path, bf16 at
/// native precision: `Tensor::stored_as`).
/// Double-buffered like [`linear()`].
#[kernel(helper)]
pub fn cast_matmul_bt_tile<T: Float, const BM: usize, const BN: usize, const BK: usize>(
    x: &Tensor<f32>,
    w: &Tensor<T>,
    row: usize,
    col: usize,
) -> Tile<f32, BM, BN> {
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(x, row, 0);
    let mut tw = load_async::<BN, BK>(w, col, 0);
    for k in (BK..x.cols() + BK).step_by(BK) {
        let next_x = load_async::<BM, BK>(x, row, k);
        let next_w = load_async::<BN, BK>(w, col, k);
        mma_bt(&mut acc, &cast::<T>(&tx), &tw);
        tx = next_x;
        tw = next_w;
    }
    acc
}

/// Linear layer over a bf16 (or any `T`) weight with f32 activations rounded to `T` on chip.
#[kernel(
    grid = grouped_grid(y.rows(), 1, BM, cdiv(y.cols(), BN)),
    tunable(BM = [64, 8, 16, 32, 128], BN = [128, 16, 32, 64], BK = [64, 16, 32, 128]),
    helpers(grouped_tile, cast_matmul_bt_tile)
)]
pub fn linear_cast<T: Float>(x: &Tensor<f32>, w: &Tensor<T>, y: &Tensor<f32>) {
    let (_one, tile_row, tile_col, stride) = grouped_tile(1);
    let col = tile_col * BN;
    for row in (tile_row * BM..y.rows()).step_by(stride * BM) {
        let acc = cast_matmul_bt_tile::<T, BM, BN, BK>(x, w, row, col);
        store(y, row, col, &acc);
    }
}

/// Linear layer with a bias, `y = x · wᵀ + bias` (vision transformers' projections, Qwen3-VL's
/// patch embedding and merger): [`linear_cast()`]'s tile with the bias row added on chip before the
/// store. `bias` is `[1, N]` f32.
#[kernel(
    grid = grouped_grid(y.rows(), 1, BM, cdiv(y.cols(), BN)),
    tunable(BM = [64, 8, 16, 32, 128], BN = [128, 16, 32, 64], BK = [64, 16, 32, 128]),
    helpers(grouped_tile, cast_matmul_bt_tile)
)]
pub fn linear_bias<T: Float>(x: &Tensor<f32>, w: &Tensor<T>, bias: &Tensor<f32>, y: &Tensor<f32>) {
    let (_one, tile_row, tile_col, stride) = grouped_tile(1);
    let col = tile_col * BN;
    for row in (tile_row * BM..y.rows()).step_by(stride * BM) {
        let acc = cast_matmul_bt_tile::<T, BM, BN, BK>(x, w, row, col);
        let b = load::<1, BN>(bias, 0, col);
        store(y, row, col, &add_row(&acc, &b));
    }
}

/// Runs [`linear_bias()`] on `x [M, K]` (f32), `w [N, K]`, `bias [1, N]` into `y [M, N]` with the
/// tiles of [`tiles_for`]. Shapes that do not line up are a `SimError::Launch` naming them.
pub fn run_linear_bias<T: Float>(
    launcher: &Launcher,
    x: &Tensor<f32>,
    w: &Tensor<T>,
    bias: &Tensor<f32>,
    y: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let (m, k) = (x.rows(), x.cols());
    let n = w.rows();
    if w.cols() != k || y.rows() != m || y.cols() != n || bias.len() != n {
        return Err(SimError::Launch {
            kernel: linear_bias::META.name.to_string(),
            message: format!(
                "shapes do not line up: x {x:?} is [M={m}, K={k}], so the weight must be \
                 [N, {k}] (got {w:?}), the bias [1, N] (got {bias:?}) and y [{m}, N] with N = the \
                 weight's rows ({n}) (got {y:?})"
            ),
        });
    }
    let bias = bias.reshaped(&[1, n]).map_err(|message| SimError::Launch {
        kernel: linear_bias::META.name.to_string(),
        message,
    })?;
    linear_bias::launch(launcher, &tiles_for(m, n, k), x, w, &bias, y)
}

/// Per-head linear maps in one launch: head `h` maps columns `h·x_stride .. h·x_stride + K` of
/// `x [M, ·]` through rows `h·N .. (h+1)·N` of `w [H·N, K]` into columns `h·y_stride ..
/// h·y_stride + N` of `y [M, ·]`. MLA's absorbed projections are this (each query head through
/// its own slice of `kv_b_proj`, as DeepSeek's inference code does with one `einsum`): the heads
/// are the grid's third axis, as experts are in a grouped GEMM, so all heads' tiles fill the
/// machine together instead of one small launch per head. Activations are rounded to `T` on chip.
#[kernel(
    grid = grouped_grid(y.rows() * heads, heads, BM, cdiv(w.rows() / usize::max(heads, 1), BN)),
    tunable(BM = [64, 8, 16, 32, 128], BN = [128, 16, 32, 64], BK = [64, 16, 32, 128]),
    helpers(grouped_tile, cast_matmul_bt_tile)
)]
pub fn linear_heads<T: Float>(
    x: &Tensor<f32>,
    w: &Tensor<T>,
    y: &Tensor<f32>,
    heads: usize,
    x_stride: usize,
    y_stride: usize,
) {
    // (No heads is refused by the wrapper; here it must not divide by zero.)
    let heads = usize::max(heads, 1);
    let (h, tile_row, tile_col, stride) = grouped_tile(heads);
    let (n, k) = (w.rows() / heads, w.cols());
    let xh = x.cols_clipped(h * x_stride, k);
    let wh = w.rows_clipped(h * n, (h + 1) * n);
    let yh = y.cols_clipped(h * y_stride, n);
    let col = tile_col * BN;
    for row in (tile_row * BM..y.rows()).step_by(stride * BM) {
        let acc = cast_matmul_bt_tile::<T, BM, BN, BK>(&xh, &wh, row, col);
        store(&yh, row, col, &acc);
    }
}

/// Runs [`linear_heads()`] over `heads` heads of `x` (f32) through an f32 or bf16 `w [H·N, K]`
/// into `y`, with the tiles [`tiles_for`] picks for one head. Errors (`SimError::Launch`) name
/// what does not fit: no heads, weight rows that do not split into the heads, head windows past
/// the end of `x` or `y`, output heads that overlap (`y_stride < N`), rows of `x` and `y` that
/// differ, or a stored format other than f32/bf16.
pub fn run_linear_heads(
    launcher: &Launcher,
    x: &Tensor<f32>,
    w: &crate::weight::Weight,
    y: &Tensor<f32>,
    heads: usize,
    x_stride: usize,
    y_stride: usize,
) -> Result<Launch, SimError> {
    use crate::weight::Weight;
    let bad = |message: String| SimError::Launch {
        kernel: linear_heads::META.name.to_string(),
        message,
    };
    let [rows, k] = w.shape()[..] else {
        return Err(bad(format!("the weight {:?} is not [H·N, K]", w.shape())));
    };
    if heads == 0 || rows / heads * heads != rows {
        return Err(bad(format!(
            "the weight's {rows} rows do not split into {heads} heads (give heads ≥ 1 dividing them)"
        )));
    }
    let n = rows / heads;
    let last = heads - 1;
    if x.rows() != y.rows() {
        return Err(bad(format!(
            "x {x:?} has {} rows but y {y:?} {}: one output row per input row",
            x.rows(),
            y.rows()
        )));
    }
    let past = |stride: usize, width: usize, cols: usize| {
        last.checked_mul(stride)
            .and_then(|v| v.checked_add(width))
            .is_none_or(|end| end > cols)
    };
    if past(x_stride, k, x.cols()) || past(y_stride, n, y.cols()) {
        return Err(bad(format!(
            "{heads} heads of K={k} inputs every {x_stride} columns of x {x:?} into N={n} outputs \
             every {y_stride} columns of y {y:?}: the last head's window lies outside its tensor"
        )));
    }
    if heads > 1 && y_stride < n {
        return Err(bad(format!(
            "output heads {y_stride} columns apart overlap: each writes N={n} columns"
        )));
    }
    let cfg = crate::tile_choice::covering_config(
        &linear_heads::META,
        Config::new(),
        &[
            ("BM", x.rows(), TILE_CAP[0]),
            ("BN", n, TILE_CAP[1]),
            ("BK", k, TILE_CAP[2]),
        ],
    );
    match w {
        Weight::F32(wt) => {
            linear_heads::launch(launcher, &cfg, x, wt, y, heads, x_stride, y_stride)
        }
        Weight::Bf16(wt) => {
            linear_heads::launch(launcher, &cfg, x, wt, y, heads, x_stride, y_stride)
        }
        other => Err(bad(format!(
            "per-head maps take f32 or bf16 weights, not {} (dequantize it at load)",
            other.format().name()
        ))),
    }
}

/// Per-token, per-128-column FP8 quantization of activations (DeepSeek-V3's `act_quant`, the
/// input side of its W8A8 GEMMs): for each row and 128-wide column block, `s = max(amax, 1e-4) /
/// 448` and `q = e4m3(x / s)`. `q [M, K]`, `s [M, ⌈K/128⌉]`.
#[kernel(grid = (cdiv(x.rows(), BR), cdiv(x.cols(), 128)), tunable(BR = [32, 8, 16, 64]))]
pub fn act_quant_fp8(x: &Tensor<f32>, q: &Tensor<fp8e4m3>, s: &Tensor<f32>) {
    let row = program_id(0) * BR;
    let blk = program_id(1);
    let t = load::<BR, 128>(x, row, blk * 128);
    // Columns past K read as 0 and change no maximum; the floor keeps an all-zero block finite.
    let amax = maximum(&row_max(&abs(&t)), &full::<f32, BR, 1>(1e-4));
    let sc = scale(&amax, 1.0 / 448.0);
    store(q, row, blk * 128, &cast::<fp8e4m3>(&div_col(&t, &sc)));
    store(s, row, blk, &sc);
}

/// W8A8 linear layer (DeepSeek-V3 block-FP8 weights): `y = (a·sa) · (w·sw)ᵀ` in f32, from the
/// activations [`act_quant_fp8()`] wrote and the weight's E4M3 codes with 128×128 block scales.
#[kernel(
    grid = grouped_grid(y.rows(), 1, BM, cdiv(y.cols(), BN)),
    tunable(BM = [64, 16, 32, 128], BN = [128, 64, 32], BK = [128]),
    helpers(grouped_tile, fp8_matmul_bt_tile)
)]
pub fn linear_fp8(
    a: &Tensor<fp8e4m3>,
    sa: &Tensor<f32>,
    w: &Tensor<fp8e4m3>,
    sw: &Tensor<f32>,
    y: &Tensor<f32>,
) {
    let (_one, tile_row, tile_col, stride) = grouped_tile(1);
    let col = tile_col * BN;
    for row in (tile_row * BM..y.rows()).step_by(stride * BM) {
        let acc = fp8_matmul_bt_tile::<BM, BN, BK>(a, sa, w, sw, row, col);
        store(y, row, col, &acc);
    }
}

/// One `BM×BN` output tile of `x · (w·sw)ᵀ` for f32 activations and a block-FP8 weight on a
/// matrix unit without an FP8 mode (W8A16): the E4M3 codes and the activations are rounded to `T`
/// on chip (codes exactly), each 128-deep partial product is scaled by the weight's block scale
/// and accumulated in f32. `BK` is the 128-wide scale block and `BN` divides it.
#[kernel(helper)]
pub fn fp8w_matmul_bt_tile<T: Float, const BM: usize, const BN: usize, const BK: usize>(
    x: &Tensor<f32>,
    w: &Tensor<fp8e4m3>,
    sw: &Tensor<f32>,
    row: usize,
    col: usize,
) -> Tile<f32, BM, BN> {
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(x, row, 0);
    let mut tw = load_async::<BN, BK>(w, col, 0);
    let mut ts = load_async::<1, 1>(sw, col / 128, 0);
    for k in (BK..x.cols() + BK).step_by(BK) {
        let next_x = load_async::<BM, BK>(x, row, k);
        let next_w = load_async::<BN, BK>(w, col, k);
        let next_s = load_async::<1, 1>(sw, col / 128, k / 128);
        let mut part = zeros::<f32, BM, BN>();
        mma_bt(&mut part, &cast::<T>(&tx), &cast::<T>(&tw));
        acc = add(&acc, &mul(&part, &broadcast::<f32, BM, BN>(&ts)));
        tx = next_x;
        tw = next_w;
        ts = next_s;
    }
    acc
}

/// Block-FP8 linear layer on a matrix unit without an FP8 mode (W8A16, see
/// [`fp8w_matmul_bt_tile()`]).
#[kernel(
    grid = grouped_grid(y.rows(), 1, BM, cdiv(y.cols(), BN)),
    tunable(BM = [64, 16, 32, 128], BN = [128, 64, 32], BK = [128]),
    helpers(grouped_tile, fp8w_matmul_bt_tile)
)]
pub fn linear_fp8w<T: Float>(
    x: &Tensor<f32>,
    w: &Tensor<fp8e4m3>,
    sw: &Tensor<f32>,
    y: &Tensor<f32>,
) {
    let (_one, tile_row, tile_col, stride) = grouped_tile(1);
    let col = tile_col * BN;
    for row in (tile_row * BM..y.rows()).step_by(stride * BM) {
        let acc = fp8w_matmul_bt_tile::<T, BM, BN, BK>(x, w, sw, row, col);
        store(y, row, col, &acc);
    }
}

/// Whether `launcher`'s matrix unit multiplies E4M3 natively (W8A8); otherwise FP8 weights run
/// W8A16 in bf16.
pub fn has_fp8_matrix(launcher: &Launcher) -> bool {
    launcher
        .preset
        .matrix_flop_per_cycle(accel_sim::DType::Fp8e4m3)
        .is_some()
}

/// The activations `x [m, k]` as [`run_linear_weight`] multiplies them against a weight in
/// `format` on `launcher`'s device, for an f64 reference of exactly what the kernel computes: f32
/// as they are; bf16-rounded for bf16 and MXFP4 weights, and for FP8 weights run W8A16; for W8A8,
/// the codes times the scales of [`act_quant_fp8()`]'s per-token, per-128-column quantisation,
/// in the kernel's own f32 arithmetic.
pub fn activations_as_multiplied(
    launcher: &Launcher,
    x: &[f32],
    m: usize,
    k: usize,
    format: crate::weight::Format,
) -> Vec<f32> {
    use crate::weight::Format;
    use accel_sim::formats::fp8::{decode_e4m3, encode_e4m3};
    use accel_sim::formats::Overflow;
    let round_bf16 = || x.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
    match format {
        Format::F32 => x.to_vec(),
        Format::Bf16 | Format::Mxfp4 | Format::Int4 { .. } => round_bf16(),
        Format::Fp8Block if !has_fp8_matrix(launcher) => round_bf16(),
        Format::Fp8Block => {
            let mut out = vec![0f32; m * k];
            for i in 0..m {
                for b in 0..k.div_ceil(128) {
                    let span = i * k + b * 128..i * k + ((b + 1) * 128).min(k);
                    let amax = x[span.clone()].iter().fold(0f32, |a, v| a.max(v.abs()));
                    let s = amax.max(1e-4) * (1.0 / 448.0);
                    for p in span {
                        out[p] = decode_e4m3(encode_e4m3(x[p] / s, Overflow::Saturate)) * s;
                    }
                }
            }
            out
        }
    }
}

/// The `BM` of an FP8 GEMM over `m` rows: the smallest of 16/32/64 covering them; 128 once there
/// are at least 128 rows (a taller tile reads each weight tile for twice the rows: an 8192-row
/// Kimi-K2 projection ran 1.4–1.7× fewer cycles on `npu-910b` and `h200`); 64 in between, where a
/// 128-row tile would multiply padding and leave cores idle.
pub(crate) fn fp8_row_tile(m: usize) -> i64 {
    match m {
        0..=64 => [16i64, 32, 64]
            .into_iter()
            .find(|b| *b as usize >= m)
            .unwrap_or(64),
        65..=127 => 64,
        _ => 128,
    }
}

/// Activations quantized for a W8A8 GEMM: E4M3 codes `[M, K]` and per-row block scales.
pub struct QuantizedActivations {
    /// E4M3 codes.
    pub codes: Tensor<fp8e4m3>,
    /// `[M, ⌈K/128⌉]` scales.
    pub scales: Tensor<f32>,
}

/// Launches [`act_quant_fp8()`] on `x [M, K]` into fresh device tensors.
pub fn run_act_quant_fp8(
    launcher: &Launcher,
    x: &Tensor<f32>,
) -> Result<(QuantizedActivations, Launch), SimError> {
    let (m, k) = (x.rows(), x.cols());
    let q = QuantizedActivations {
        codes: crate::weight::scratch(launcher, &[m, k]),
        scales: crate::weight::scratch(launcher, &[m, k.div_ceil(128)]),
    };
    // Row blocks as tall as the rows, up to 64 (a 32 KiB f32 tile): each program is one DMA in
    // and two out, so taller blocks mean fewer, longer transfers.
    let bm = crate::tile_choice::covering(&act_quant_fp8::META, "BR", m, 64).unwrap_or(32);
    let cfg = Config::new().with("BR", bm);
    let launch = act_quant_fp8::launch(launcher, &cfg, x, &q.codes, &q.scales)?;
    Ok((q, launch))
}

/// `y = x · wᵀ` for a weight in any stored format ([`crate::weight::Weight`]), with f32
/// activations `x [M, K]` and output `y [M, N]`. Returns each launch with the kernel's name:
/// f32 → [`linear()`]; bf16 → [`linear_cast()`]; FP8 → [`act_quant_fp8()`] then [`linear_fp8()`]
/// (W8A8) where the matrix unit has an FP8 mode, [`linear_fp8w()`] (W8A16) where it has not.
/// A decode shape whose output tiles leave cores idle runs the format's split-K kernel and
/// [`crate::split_k::split_k_reduce()`] instead of the unsplit kernel when the simulator finds
/// that faster ([`crate::split_k::fastest_split`]). MXFP4 is an expert format
/// ([`crate::moe::grouped::run_grouped_linear_weight`]) and is refused.
pub fn run_linear_weight(
    launcher: &Launcher,
    x: &Tensor<f32>,
    w: &crate::weight::Weight,
    y: &Tensor<f32>,
) -> Result<Vec<(&'static str, Launch)>, SimError> {
    use crate::weight::Weight;
    let (m, k, n) = (x.rows(), x.cols(), w.out_features());
    let name = match w {
        Weight::F32(_) => linear::META.name,
        Weight::Bf16(_) => linear_cast::META.name,
        _ => linear_fp8::META.name,
    };
    if w.shape() != [n, k] || y.rows() != m || y.cols() != n {
        return Err(crate::weight::bad(
            name,
            format!(
                "shapes do not line up: x {x:?} is [M={m}, K={k}], so the weight must be [N, {k}] \
                 (got {} {:?}) and y [{m}, N] (got {y:?})",
                w.format().name(),
                w.shape()
            ),
        ));
    }
    // The native formats' tiles are the tuning table's where it holds this launch.
    let key = crate::tunable::linear_key(m, n, k);
    // A decode shape whose output tiles leave cores idle may split K ([`crate::split_k`]).
    let split =
        |cfg: &Config, s: usize| split_width(k, cfg.get("BK").unwrap_or(1).max(1) as usize, s);
    match w {
        Weight::F32(wt) => {
            let cfg = tiles_for(m, n, k);
            let run = |l: &Launcher, s: usize| match s {
                1 => Ok(vec![(name, linear::launch(l, &cfg, x, wt, y)?)]),
                _ => run_split(l, y, s, |part| {
                    let span = split(&cfg, s);
                    let r = linear_split_k::launch(l, &cfg, x, wt, part, span)?;
                    Ok((linear_split_k::META.name, r))
                }),
            };
            run_fastest_split(launcher, (m, n, k), &cfg, run)
        }
        Weight::Bf16(wt) => {
            let cfg = launcher.tiles(&linear_cast::META, &key, tiles_for(m, n, k));
            let run = |l: &Launcher, s: usize| match s {
                1 => Ok(vec![(name, linear_cast::launch(l, &cfg, x, wt, y)?)]),
                _ => run_split(l, y, s, |part| {
                    let span = split(&cfg, s);
                    let r = linear_cast_split_k::launch(l, &cfg, x, wt, part, span)?;
                    Ok((linear_cast_split_k::META.name, r))
                }),
            };
            run_fastest_split(launcher, (m, n, k), &cfg, run)
        }
        Weight::Fp8Block { weight, scale_inv } => {
            let bn = if n <= 64 { 64 } else { 128 };
            let cfg = Config::new()
                .with("BM", fp8_row_tile(m))
                .with("BN", bn)
                .with("BK", 128);
            if !has_fp8_matrix(launcher) {
                let cfg = launcher.tiles(&linear_fp8w::META, &key, cfg);
                let run = |l: &Launcher, s: usize| match s {
                    1 => {
                        let r = linear_fp8w::launch::<bf16>(l, &cfg, x, weight, scale_inv, y)?;
                        Ok(vec![(linear_fp8w::META.name, r)])
                    }
                    _ => run_split(l, y, s, |part| {
                        let span = split(&cfg, s);
                        let r = linear_fp8w_split_k::launch::<bf16>(
                            l, &cfg, x, weight, scale_inv, part, span,
                        )?;
                        Ok((linear_fp8w_split_k::META.name, r))
                    }),
                };
                return run_fastest_split(launcher, (m, n, k), &cfg, run);
            }
            let cfg = launcher.tiles(&linear_fp8::META, &key, cfg);
            let (q, quant) = run_act_quant_fp8(launcher, x)?;
            let (a, sa) = (&q.codes, &q.scales);
            let run = |l: &Launcher, s: usize| match s {
                1 => Ok(vec![(
                    name,
                    linear_fp8::launch(l, &cfg, a, sa, weight, scale_inv, y)?,
                )]),
                _ => run_split(l, y, s, |part| {
                    let span = split(&cfg, s);
                    let r =
                        linear_fp8_split_k::launch(l, &cfg, a, sa, weight, scale_inv, part, span)?;
                    Ok((linear_fp8_split_k::META.name, r))
                }),
            };
            let mut launches = vec![(act_quant_fp8::META.name, quant)];
            launches.extend(run_fastest_split(launcher, (m, n, k), &cfg, run)?);
            Ok(launches)
        }
        Weight::Mxfp4 { .. } | Weight::Int4 { .. } => Err(crate::weight::bad(
            name,
            format!(
                "{} is an expert-weight format here; a dense linear layer in it is not supported \
                 (store the weight in bf16 or FP8)",
                w.format().name()
            ),
        )),
    }
}
