//! Grouped expert GEMM over dispatched rows: after [`super::dispatch::moe_dispatch()`] the rows of
//! `x [N, K]` are sorted by expert, expert `e` owning rows `offsets[e]..offsets[e+1]` (a
//! [`super::dispatch::RoutingPlan`]'s `expert_offsets`), and `y[r] = x[r] · w[e]ᵀ` with `w [E, Nout,
//! K]` (HF's per-expert `[out, in]`). Unlike [`super::expert_gemm::expert_gemm()`] (a fixed number of
//! tokens per expert), the per-expert row counts come from device memory at run time.
//!
//! [`run_expert_swiglu_grouped`] composes the routed expert FFN from it: gate, up, SwiGLU, down.

use super::expert_gemm::{matmul_bt_tile, swiglu};
use crate::gemm_fp8::fp8_matmul_bt_tile;
use crate::linear::{cast_matmul_bt_tile, fp8w_matmul_bt_tile};
use crate::tile_order::{grouped_grid, grouped_tile};
use crate::weight::{bad, Weight};
use dsl_core::prelude::*;
use dsl_core::{Report, SimError};

/// `y[r] = x[r] · w[e(r)]ᵀ`: one program per (row tile of a balanced share, output tile, expert),
/// walked in groups of row tiles ([`crate::tile_order::grouped_grid`]). An expert has as many row
/// tiles as its share under balanced routing (`⌈N / E⌉` rows), rounded up to whole groups; each
/// program strides over its expert's row tiles by that count, so balanced routing gives at most
/// one tile per program, a skewed expert loops over more, and the grid never has the `E·⌈N / BM⌉`
/// mostly-empty programs of a grid sized for an expert owning every row. Programs with no rows
/// read their two offsets (8 bytes) and stop: an expert with 0 rows does no work and moves none
/// of its weight bytes. Cost-only runs have no offsets and assume balanced routing.
#[kernel(
    grid = grouped_grid(x.rows(), w.shape()[0], BM, cdiv(w.shape()[1], BN)),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64, 256], BK = [128, 64, 256]),
    helpers(grouped_tile, matmul_bt_tile)
)]
pub fn grouped_linear<T: Float>(
    x: &Tensor<T>,
    w: &Tensor<T>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) {
    let experts = w.shape()[0];
    let (e, tile_row, tile_col, stride) = grouped_tile(experts);
    let start = load_index(offsets, e, e * x.rows() / experts);
    let end = load_index(offsets, e + 1, (e + 1) * x.rows() / experts);
    // Views bounded to this expert's rows: ragged tiles never touch the next expert's rows.
    let (xe, ye, we) = (
        x.rows_clipped(start, end),
        y.rows_clipped(start, end),
        w.at(e),
    );
    let col = tile_col * BN;
    for row in (tile_row * BM..xe.rows()).step_by(stride * BM) {
        let acc = matmul_bt_tile::<T, BM, BN, BK>(&xe, &we, row, col);
        store(&ye, row, col, &acc);
    }
}

/// Checks `offsets` (`[E + 1]` or `[E + 1, 1]`) against `experts` and the `rows` of the dispatched
/// matrix; when the tensor holds data, also that it starts at 0, never decreases and ends at `rows`.
pub fn check_offsets(
    kernel: &str,
    offsets: &Tensor<i32>,
    experts: usize,
    rows: usize,
) -> Result<(), SimError> {
    if offsets.len() != experts + 1 {
        return Err(bad(
            kernel,
            format!(
                "`offsets` must hold E + 1 = {} entries (one per expert, plus the end), got {offsets:?}",
                experts + 1
            ),
        ));
    }
    if let Some(v) = offsets.to_vec() {
        let ok = v.first() == Some(&0.0)
            && v.last() == Some(&(rows as f32))
            && v.windows(2).all(|p| p[0] <= p[1]);
        if !ok {
            return Err(bad(
                kernel,
                format!(
                    "`offsets` {v:?} must start at 0, never decrease and end at the {rows} dispatched rows"
                ),
            ));
        }
    }
    Ok(())
}

/// Runs [`grouped_linear()`] after checking shapes (`x [N, K]`, `w [E, Nout, K]`, `offsets`,
/// `y [N, Nout]`), with `BM` the smallest row tile covering the average rows per expert.
pub fn run_grouped_linear<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    w: &Tensor<T>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) -> Result<Report, SimError> {
    let name = grouped_linear::META.name;
    let [e, n_out, k] = match w.shape() {
        [e, n, k] if *e > 0 && *n > 0 && *k > 0 => [*e, *n, *k],
        _ => {
            return Err(bad(
                name,
                format!("`w` must be [E, Nout, K] with every size ≥ 1, got {w:?}"),
            ))
        }
    };
    let n = x.rows();
    if x.shape() != [n, k] {
        return Err(bad(
            name,
            format!("`x` must be [N, K] with K = {k} (the weight's input size), got {x:?}"),
        ));
    }
    if y.shape() != [n, n_out] {
        return Err(bad(
            name,
            format!("`y` must be [N, Nout] = [{n}, {n_out}], got {y:?}"),
        ));
    }
    check_offsets(name, offsets, e, n)?;
    let bm = row_tile(n, e);
    let elem = std::mem::size_of::<T>() as u64;
    let bk = deep_k(launcher, bm, elem, elem);
    let config = Config::new().with("BM", bm).with("BK", bk);
    Ok(grouped_linear::launch(launcher, &config, x, w, offsets, y)?.report)
}

/// The smallest row tile covering an expert's balanced share of `rows` over `experts`: decode-sized
/// batches stream each weight once with little padding; prefill uses the largest tile.
fn row_tile(rows: usize, experts: usize) -> i64 {
    let per_expert = rows.div_ceil(experts.max(1)).max(1);
    [16i64, 32, 64, 128]
        .into_iter()
        .find(|b| *b as usize >= per_expert)
        .unwrap_or(128)
}

/// The deepest K tile whose double-buffered operands (`x` elements of `x_elem` bytes, weight
/// elements of `w_elem`, for `BN = 128`) and the accumulator, where it lives in on-chip memory
/// rather than registers, fit a core: BK = 128 on a 512 KB NPU core, 64 on an H100-class SM's
/// 228 KB.
fn deep_k(launcher: &Launcher, bm: i64, x_elem: u64, w_elem: u64) -> i64 {
    let (bm, bn) = (bm as u64, 128u64);
    let acc = if launcher.preset.accumulators.is_some() {
        0
    } else {
        bm * bn * 4
    };
    let sram = launcher.preset.sram.bytes_per_core;
    [128i64, 64]
        .into_iter()
        .find(|bk| 2 * (bm * x_elem + bn * w_elem) * *bk as u64 + acc <= sram)
        .unwrap_or(64)
}

/// The routed expert FFN over dispatched rows: `out[r] = (SiLU(x Wg[e]ᵀ) ⊙ (x Wu[e]ᵀ)) Wd[e]ᵀ` for
/// the rows of each expert `e`: `xe [N, H]`, `w_gate`/`w_up [E, I, H]`, `w_down [E, H, I]`,
/// `offsets` (`E + 1` entries), `out [N, H]` (f32). Four launches (gate, up, [`swiglu()`], down),
/// chained into one report. The SwiGLU activation is rounded to `T` before the down projection.
/// HF stores gate and up fused (`gate_up_proj [E, 2I, H]`, gate first): split it on load.
#[allow(clippy::too_many_arguments)]
pub fn run_expert_swiglu_grouped<T: Float>(
    launcher: &Launcher,
    xe: &Tensor<T>,
    w_gate: &Tensor<T>,
    w_up: &Tensor<T>,
    w_down: &Tensor<T>,
    offsets: &Tensor<i32>,
    out: &Tensor<f32>,
) -> Result<Report, SimError> {
    let name = "expert_swiglu_grouped";
    let [e, i, h] = match w_gate.shape() {
        [e, i, h] => [*e, *i, *h],
        _ => {
            return Err(bad(
                name,
                format!("`w_gate` must be [E, I, H], got {w_gate:?}"),
            ))
        }
    };
    if w_up.shape() != [e, i, h] {
        return Err(bad(
            name,
            format!("`w_up` must be [E, I, H] = [{e}, {i}, {h}] like `w_gate`, got {w_up:?}"),
        ));
    }
    if w_down.shape() != [e, h, i] {
        return Err(bad(
            name,
            format!("`w_down` must be [E, H, I] = [{e}, {h}, {i}], got {w_down:?}"),
        ));
    }
    let n = xe.rows();
    let functional = launcher.backend == Backend::Functional;
    let scratch = |shape: &[usize]| {
        if functional {
            Tensor::<f32>::poisoned(shape)
        } else {
            Tensor::<f32>::shape_only(shape)
        }
    };
    let (g, u) = (scratch(&[n, i]), scratch(&[n, i]));
    let act = if functional {
        Tensor::<T>::poisoned(&[n, i])
    } else {
        Tensor::<T>::shape_only(&[n, i])
    };
    let parts = [
        run_grouped_linear(launcher, xe, w_gate, offsets, &g)?,
        run_grouped_linear(launcher, xe, w_up, offsets, &u)?,
        swiglu::launch(launcher, &Config::new(), &g, &u, &act)?.report,
        run_grouped_linear(launcher, &act, w_down, offsets, out)?,
    ];
    Report::chain(name, &parts).ok_or_else(|| bad(name, "no launch to report".into()))
}

/// [`grouped_linear()`] for bf16 (any `T`) expert weights with f32 rows rounded to `T` on chip.
#[kernel(
    grid = grouped_grid(x.rows(), w.shape()[0], BM, cdiv(w.shape()[1], BN)),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64, 256], BK = [128, 64, 256]),
    helpers(grouped_tile, cast_matmul_bt_tile)
)]
pub fn grouped_linear_cast<T: Float>(
    x: &Tensor<f32>,
    w: &Tensor<T>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) {
    let experts = w.shape()[0];
    let (e, tile_row, tile_col, stride) = grouped_tile(experts);
    let start = load_index(offsets, e, e * x.rows() / experts);
    let end = load_index(offsets, e + 1, (e + 1) * x.rows() / experts);
    let (xe, ye, we) = (
        x.rows_clipped(start, end),
        y.rows_clipped(start, end),
        w.at(e),
    );
    let col = tile_col * BN;
    for row in (tile_row * BM..xe.rows()).step_by(stride * BM) {
        let acc = cast_matmul_bt_tile::<T, BM, BN, BK>(&xe, &we, row, col);
        store(&ye, row, col, &acc);
    }
}

/// [`grouped_linear()`] for DeepSeek block-FP8 expert weights (`w [E, N, K]` E4M3, `sw [E,
/// ⌈N/128⌉, ⌈K/128⌉]`) over rows quantized by [`crate::linear::act_quant_fp8()`] (W8A8).
#[kernel(
    grid = grouped_grid(a.rows(), w.shape()[0], BM, cdiv(w.shape()[1], BN)),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64], BK = [128]),
    helpers(grouped_tile, fp8_matmul_bt_tile)
)]
pub fn grouped_linear_fp8(
    a: &Tensor<fp8e4m3>,
    sa: &Tensor<f32>,
    w: &Tensor<fp8e4m3>,
    sw: &Tensor<f32>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) {
    let experts = w.shape()[0];
    let (e, tile_row, tile_col, stride) = grouped_tile(experts);
    let start = load_index(offsets, e, e * a.rows() / experts);
    let end = load_index(offsets, e + 1, (e + 1) * a.rows() / experts);
    let (ae, sae, ye) = (
        a.rows_clipped(start, end),
        sa.rows_clipped(start, end),
        y.rows_clipped(start, end),
    );
    let (we, swe) = (w.at(e), sw.at(e));
    let col = tile_col * BN;
    for row in (tile_row * BM..ae.rows()).step_by(stride * BM) {
        let acc = fp8_matmul_bt_tile::<BM, BN, BK>(&ae, &sae, &we, &swe, row, col);
        store(&ye, row, col, &acc);
    }
}

/// [`grouped_linear_fp8()`] on a matrix unit without an FP8 mode: f32 rows and E4M3 codes rounded
/// to `T` on chip (W8A16, [`fp8w_matmul_bt_tile()`]).
#[kernel(
    grid = grouped_grid(x.rows(), w.shape()[0], BM, cdiv(w.shape()[1], BN)),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64], BK = [128]),
    helpers(grouped_tile, fp8w_matmul_bt_tile)
)]
pub fn grouped_linear_fp8w<T: Float>(
    x: &Tensor<f32>,
    w: &Tensor<fp8e4m3>,
    sw: &Tensor<f32>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) {
    let experts = w.shape()[0];
    let (e, tile_row, tile_col, stride) = grouped_tile(experts);
    let start = load_index(offsets, e, e * x.rows() / experts);
    let end = load_index(offsets, e + 1, (e + 1) * x.rows() / experts);
    let (xe, ye) = (x.rows_clipped(start, end), y.rows_clipped(start, end));
    let (we, swe) = (w.at(e), sw.at(e));
    let col = tile_col * BN;
    for row in (tile_row * BM..xe.rows()).step_by(stride * BM) {
        let acc = fp8w_matmul_bt_tile::<T, BM, BN, BK>(&xe, &we, &swe, row, col);
        store(&ye, row, col, &acc);
    }
}

/// One `BM×BN` output tile of `x · wᵀ` with `w` packed MXFP4 (`blocks [N, K/2]`, `scales [N,
/// K/32]`): each weight tile is dequantized to `T` in SRAM and each f32 activation tile rounded to
/// `T`, so the packed weight never expands in device memory. Double-buffered.
#[kernel(helper)]
pub fn mxfp4_matmul_bt_tile<
    T: Float,
    const BM: usize,
    const BN: usize,
    const BK: usize,
    const BKB: usize,
    const BKS: usize,
>(
    x: &Tensor<f32>,
    blocks: &Tensor<u8>,
    scales: &Tensor<u8>,
    row: usize,
    col: usize,
) -> Tile<f32, BM, BN> {
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(x, row, 0);
    let mut tb = load_async::<BN, BKB>(blocks, col, 0);
    let mut ts = load_async::<BN, BKS>(scales, col, 0);
    for k in (BK..x.cols() + BK).step_by(BK) {
        let next_x = load_async::<BM, BK>(x, row, k);
        let next_b = load_async::<BN, BKB>(blocks, col, k / 2);
        let next_s = load_async::<BN, BKS>(scales, col, k / 32);
        let w = dequant_mxfp4::<T, BN, BK>(&tb, &ts);
        mma_bt(&mut acc, &cast::<T>(&tx), &w);
        tx = next_x;
        tb = next_b;
        ts = next_s;
    }
    acc
}

/// [`grouped_linear()`] for MXFP4 expert weights, dequantized on chip to `T`.
#[kernel(
    grid = grouped_grid(x.rows(), blocks.shape()[0], BM, cdiv(blocks.shape()[1], BN)),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64, 256], BK = [128, 64, 256]),
    derived(BKB = BK / 2, BKS = BK / 32),
    helpers(grouped_tile, mxfp4_matmul_bt_tile)
)]
pub fn grouped_linear_mxfp4<T: Float>(
    x: &Tensor<f32>,
    blocks: &Tensor<u8>,
    scales: &Tensor<u8>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) {
    let experts = blocks.shape()[0];
    let (e, tile_row, tile_col, stride) = grouped_tile(experts);
    let start = load_index(offsets, e, e * x.rows() / experts);
    let end = load_index(offsets, e + 1, (e + 1) * x.rows() / experts);
    let (xe, ye) = (x.rows_clipped(start, end), y.rows_clipped(start, end));
    let (be, se) = (blocks.at(e), scales.at(e));
    let col = tile_col * BN;
    for row in (tile_row * BM..xe.rows()).step_by(stride * BM) {
        let acc = mxfp4_matmul_bt_tile::<T, BM, BN, BK, BKB, BKS>(&xe, &be, &se, row, col);
        store(&ye, row, col, &acc);
    }
}

/// One `BM×BN` output tile of `x · wᵀ` with `w` packed group-scaled INT4 (`packed [N, K/2]`,
/// `scales [N, K/GS]` bf16): each weight tile is dequantized to `T` in SRAM and each f32 activation
/// tile rounded to `T` (W4A16), so the packed weight never expands in device memory.
/// Double-buffered, as [`mxfp4_matmul_bt_tile()`].
#[kernel(helper)]
pub fn int4_matmul_bt_tile<
    T: Float,
    const BM: usize,
    const BN: usize,
    const BK: usize,
    const BKB: usize,
    const BKS: usize,
>(
    x: &Tensor<f32>,
    packed: &Tensor<u8>,
    scales: &Tensor<bf16>,
    row: usize,
    col: usize,
) -> Tile<f32, BM, BN> {
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(x, row, 0);
    let mut tq = load_async::<BN, BKB>(packed, col, 0);
    let mut ts = load_async::<BN, BKS>(scales, col, 0);
    for k in (BK..x.cols() + BK).step_by(BK) {
        let next_x = load_async::<BM, BK>(x, row, k);
        let next_q = load_async::<BN, BKB>(packed, col, k / 2);
        let next_s = load_async::<BN, BKS>(scales, col, k / (BK / BKS));
        let w = dequant_int4::<T, BN, BK>(&tq, &ts);
        mma_bt(&mut acc, &cast::<T>(&tx), &w);
        tx = next_x;
        tq = next_q;
        ts = next_s;
    }
    acc
}

/// [`grouped_linear()`] for group-scaled INT4 expert weights (W4A16: Kimi-K2-Thinking's
/// `pack-quantized` experts, groups of 32), dequantized on chip to `T`. `GS` is the weight's group
/// size, fixed by the runner ([`run_grouped_linear_weight`]), not tuned.
#[kernel(
    grid = grouped_grid(x.rows(), packed.shape()[0], BM, cdiv(packed.shape()[1], BN)),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64, 256], BK = [128], GS = [32, 64, 128]),
    derived(BKB = BK / 2, BKS = BK / GS),
    helpers(grouped_tile, int4_matmul_bt_tile)
)]
pub fn grouped_linear_int4<T: Float>(
    x: &Tensor<f32>,
    packed: &Tensor<u8>,
    scales: &Tensor<bf16>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) {
    require(
        scales.cols() * GS == packed.cols() * 2,
        "the scales must hold one column per GS inputs (the runner sets GS to the weight's group)",
    );
    let experts = packed.shape()[0];
    let (e, tile_row, tile_col, stride) = grouped_tile(experts);
    let start = load_index(offsets, e, e * x.rows() / experts);
    let end = load_index(offsets, e + 1, (e + 1) * x.rows() / experts);
    let (xe, ye) = (x.rows_clipped(start, end), y.rows_clipped(start, end));
    let (qe, se) = (packed.at(e), scales.at(e));
    let col = tile_col * BN;
    for row in (tile_row * BM..xe.rows()).step_by(stride * BM) {
        let acc = int4_matmul_bt_tile::<T, BM, BN, BK, BKB, BKS>(&xe, &qe, &se, row, col);
        store(&ye, row, col, &acc);
    }
}

/// Per-expert biases on grouped rows, in place: `y[r] += bias[e(r)]` for the rows
/// `offsets[e]..offsets[e+1]` of `y [N, Nout]` with `bias [E, Nout]` (gpt-oss's
/// `gate_up_proj_bias` / `down_proj_bias`, added to each expert's projection). One program per
/// (row tile of a balanced share, column tile, expert), striding over its expert's row tiles as
/// [`grouped_linear()`] does; the expert's bias tile is read once per program.
#[kernel(
    grid = (
        cdiv(cdiv(y.rows(), usize::max(bias.rows(), 1)), BR),
        cdiv(y.cols(), BC),
        bias.rows()
    ),
    tunable(BR = [16, 32, 64], BC = [256, 128, 512])
)]
pub fn grouped_add_bias(y: &Tensor<f32>, bias: &Tensor<f32>, offsets: &Tensor<i32>) {
    let e = program_id(2);
    let experts = num_programs(2);
    let start = load_index(offsets, e, e * y.rows() / experts);
    let end = load_index(offsets, e + 1, (e + 1) * y.rows() / experts);
    let ye = y.rows_clipped(start, end);
    let col = program_id(1) * BC;
    let tb = load_async::<1, BC>(bias, e, col);
    for row in (program_id(0) * BR..ye.rows()).step_by(num_programs(0) * BR) {
        let t = load_async::<BR, BC>(&ye, row, col);
        store(&ye, row, col, &add_row(&t, &tb));
    }
}

/// Runs [`grouped_add_bias()`] on `y [N, Nout]` with `bias [E, Nout]` and `offsets [E + 1]`,
/// checking the shapes first.
pub fn run_grouped_add_bias(
    launcher: &Launcher,
    y: &Tensor<f32>,
    bias: &Tensor<f32>,
    offsets: &Tensor<i32>,
) -> Result<dsl_core::Launch, SimError> {
    let name = grouped_add_bias::META.name;
    let (e, n) = (bias.rows(), y.rows());
    if bias.shape().len() != 2 || e == 0 || bias.cols() != y.cols() {
        return Err(bad(
            name,
            format!(
                "`bias` must be [E, Nout] with E ≥ 1 and Nout = {} (y's width), got {bias:?}",
                y.cols()
            ),
        ));
    }
    check_offsets(name, offsets, e, n)?;
    let cfg = Config::new().with("BR", 16).with("BC", 256);
    grouped_add_bias::launch(launcher, &cfg, y, bias, offsets)
}

/// [`grouped_linear_mxfp4()`]'s hand-tuned swap
/// ([`crate::hand_tuned::expert_gemm_mxfp4::launch_grouped`]) on an MXFP4 expert weight: the
/// prototype's row tile (the even share of rows, up to 128), `BN = 128`, the deepest K-step that
/// fits the core and a two-deep ring, moving to shallower K-steps while the buffers overflow it.
pub fn run_grouped_linear_mxfp4_hand(
    launcher: &Launcher,
    x: &Tensor<f32>,
    w: &Weight,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) -> Result<dsl_core::Launch, SimError> {
    use crate::hand_tuned::expert_gemm_mxfp4::{launch_grouped, GROUPED_META};
    let Weight::Mxfp4 { blocks, scales } = w else {
        return Err(bad(
            GROUPED_META.name,
            format!("takes an MXFP4 expert weight, got {}", w.format().name()),
        ));
    };
    let e = blocks.shape().first().copied().unwrap_or(1);
    let bm = row_tile(x.rows(), e);
    let mut last = None;
    for bk in [deep_k(launcher, bm, 4, 2), 64] {
        let cfg = Config::new()
            .with("BM", bm)
            .with("BN", 128)
            .with("BK", bk)
            .with("STAGES", 2);
        match launch_grouped(launcher, &cfg, x, blocks, scales, offsets, y) {
            Err(e @ SimError::SramOverflow { .. }) => last = Some(e),
            r => return r,
        }
    }
    Err(last.expect("a configuration was tried"))
}

/// Per-expert `y[r] = x[r] · w[e(r)]ᵀ` for expert weights in any stored format: f32 →
/// [`grouped_linear()`], bf16 → [`grouped_linear_cast()`], FP8 → the rows quantized by
/// [`crate::linear::act_quant_fp8()`] then [`grouped_linear_fp8()`] (W8A8; [`grouped_linear_fp8w()`],
/// W8A16, where the matrix unit has no FP8 mode), MXFP4 → [`grouped_linear_mxfp4()`]
/// (dequantized on chip to bf16). `x [N, K]` f32, `y [N, Nout]` f32. Returns each launch with its
/// kernel's name.
pub fn run_grouped_linear_weight(
    launcher: &Launcher,
    x: &Tensor<f32>,
    w: &Weight,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) -> Result<Vec<(&'static str, Report)>, SimError> {
    let shape = w.shape();
    let name = match w {
        Weight::F32(_) => grouped_linear::META.name,
        Weight::Bf16(_) => grouped_linear_cast::META.name,
        Weight::Fp8Block { .. } => grouped_linear_fp8::META.name,
        Weight::Mxfp4 { .. } => grouped_linear_mxfp4::META.name,
        Weight::Int4 { .. } => grouped_linear_int4::META.name,
    };
    let [e, n_out, k] = match shape[..] {
        [e, n, k] if e > 0 && n > 0 && k > 0 => [e, n, k],
        _ => {
            return Err(bad(
                name,
                format!(
                    "the expert weight must be [E, Nout, K] with every size ≥ 1, got {} {shape:?}",
                    w.format().name()
                ),
            ))
        }
    };
    let n = x.rows();
    if x.shape() != [n, k] || y.shape() != [n, n_out] {
        return Err(bad(
            name,
            format!(
                "`x` must be [N, {k}] and `y` [N, {n_out}] for a [{e}, {n_out}, {k}] expert weight, \
                 got x {x:?}, y {y:?}"
            ),
        ));
    }
    check_offsets(name, offsets, e, n)?;
    let bm = row_tile(n, e);
    // The native formats' tiles are the tuning table's where it holds this launch.
    let key = crate::tunable::grouped_key(n, e, n_out, k);
    match w {
        Weight::F32(wt) => Ok(vec![(
            name,
            run_grouped_linear(launcher, x, wt, offsets, y)?,
        )]),
        Weight::Bf16(wt) => {
            let cfg = Config::new()
                .with("BM", bm)
                .with("BK", deep_k(launcher, bm, 4, 2));
            let cfg = launcher.tiles(&grouped_linear_cast::META, &key, cfg);
            let l = grouped_linear_cast::launch(launcher, &cfg, x, wt, offsets, y)?;
            Ok(vec![(name, l.report)])
        }
        Weight::Fp8Block { weight, scale_inv } => {
            if !crate::linear::has_fp8_matrix(launcher) {
                // W8A16 casts each weight tile to bf16 on chip: a row tile covering the expert's
                // rows (up to 128) casts it once for all of them.
                let cfg = Config::new().with("BM", bm).with("BK", 128);
                let cfg = launcher.tiles(&grouped_linear_fp8w::META, &key, cfg);
                let l = grouped_linear_fp8w::launch::<bf16>(
                    launcher, &cfg, x, weight, scale_inv, offsets, y,
                )?;
                return Ok(vec![(grouped_linear_fp8w::META.name, l.report)]);
            }
            let per_expert = n.div_ceil(e);
            let cfg = Config::new()
                .with("BM", crate::linear::fp8_row_tile(per_expert))
                .with("BK", 128);
            let cfg = launcher.tiles(&grouped_linear_fp8::META, &key, cfg);
            let (q, quant) = crate::linear::run_act_quant_fp8(launcher, x)?;
            let l = grouped_linear_fp8::launch(
                launcher, &cfg, &q.codes, &q.scales, weight, scale_inv, offsets, y,
            )?;
            Ok(vec![
                (crate::linear::act_quant_fp8::META.name, quant.report),
                (name, l.report),
            ])
        }
        Weight::Mxfp4 { blocks, scales } => {
            let cfg = Config::new()
                .with("BM", bm)
                .with("BK", deep_k(launcher, bm, 4, 2));
            let cfg = launcher.tiles(&grouped_linear_mxfp4::META, &key, cfg);
            let l = grouped_linear_mxfp4::launch::<bf16>(
                launcher, &cfg, x, blocks, scales, offsets, y,
            )?;
            Ok(vec![(name, l.report)])
        }
        Weight::Int4 { packed, scales } => {
            let group = crate::weight::int4_group(packed, scales);
            crate::weight::check_int4_group(group, k, &shape).map_err(|m| bad(name, m))?;
            if scales.cols() * group != k {
                return Err(bad(
                    name,
                    format!("INT4 scales {scales:?} do not hold one column per group of {group} of K = {k}"),
                ));
            }
            let cfg = Config::new()
                .with("BM", bm)
                .with("BK", 128)
                .with("GS", group as i64);
            let cfg = launcher.tiles(&grouped_linear_int4::META, &key, cfg);
            // The group is the weight's, whatever a tuning table holds.
            let cfg = cfg.with("GS", group as i64);
            let l =
                grouped_linear_int4::launch::<bf16>(launcher, &cfg, x, packed, scales, offsets, y)?;
            Ok(vec![(name, l.report)])
        }
    }
}
