//! The intrinsics a kernel calls. Each takes the program's [`Ctx`] first; `#[kernel]` inserts it, so
//! kernel source reads `load::<BM, BK>(a, row, col)`.
//!
//! Every intrinsic does two things: computes its result (functional backend only, with the SIMD
//! semantics in `accel_sim::functional`) and records one tile instruction for the timing model.
//! Destination operands come first (`mma(&mut acc, &a, &b)`), as in an instruction set.
//!
//! This file is the one definition of every intrinsic: `#[kernel]` reads it (dsl-macros'
//! `intrinsics.rs` parses it at compile time) and treats each `pub fn` here as an intrinsic. Adding
//! one is adding its `pub fn`, with a doc comment; its generic parameters, in order, are what a
//! kernel's turbofish gives (a `const` one is a tile shape, a type one an element type), and a first
//! parameter `ctx: &mut Ctx` is inserted by the macro (pure scalar helpers like [`cdiv`] take none).
//! A doc line `Usage: `...`` says how it is written in a kernel, for error messages. So keep every
//! intrinsic a plain `pub fn` in this file (no macro-generated or re-exported ones: the macro would
//! not see them, and refuses the file) and everything else private. Its cost formula belongs in
//! `accel_sim::isa`, next to the instruction it records.

use crate::ctx::Ctx;
use crate::elem::{bf16, Elem, Float};
use crate::hazard::Taint;
use crate::tensor::Tensor;
use crate::tile::{DeferredLoad, Host, Tile};
use accel_sim::functional::{self as f, Binary, Reduce, Unary};
use accel_sim::isa::{self, Op, Region, VectorClass};
use accel_sim::program::{BufId, Instr};
use accel_sim::DType;
use std::sync::Arc;

/// This program's index along grid `axis` (0, 1 or 2).
pub fn program_id(ctx: &mut Ctx, axis: usize) -> usize {
    if axis > 2 {
        ctx.fail(format!(
            "program_id axis {axis} out of range; the grid has axes 0, 1, 2"
        ));
        return 0;
    }
    ctx.pid[axis]
}

/// Number of programs along grid `axis`.
pub fn num_programs(ctx: &mut Ctx, axis: usize) -> usize {
    if axis > 2 {
        ctx.fail(format!(
            "num_programs axis {axis} out of range; the grid has axes 0, 1, 2"
        ));
        return 1;
    }
    ctx.grid[axis]
}

/// Refuses the launch (an error naming the kernel, this line and `what`) unless `cond` holds: a
/// kernel states what its tiles must cover, so a tile too small for a run-time dimension is an
/// error instead of a partial answer. Issues no instruction (costs nothing).
pub fn require(ctx: &mut Ctx, cond: bool, what: &str) {
    if !cond {
        ctx.fail(format!("requirement not met: {what}"));
    }
}

/// Ceiling division for grid and loop bounds.
pub const fn cdiv(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

fn load_impl<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    t: &Tensor<T>,
    row: usize,
    col: usize,
    fill: f32,
    blocking: bool,
) -> Tile<T, R, C> {
    let tile = ctx.new_tile::<T, R, C>(None);
    load_window(ctx, tile, t, row, col, fill, blocking)
}

/// The host values of [`load_window`]'s tile: the `vr×vc` part of the window at (`row`, `col`) that
/// lies in `t`, `fill` around it. Out of line, so the cost-only path of every load stays small.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn host_window<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    tile: &mut Tile<T, R, C>,
    t: &Tensor<T>,
    row: usize,
    col: usize,
    fill: f32,
    vr: usize,
    vc: usize,
) {
    let stride = t.row_stride();
    // A functional window wholly inside the tensor is read where it lies when it is used (see
    // `Host::Deferred`); small tiles are copied at once, which costs less than deferring.
    let in_place = ctx.functional && ctx.defer_loads && vr == R && vc == C && R * C >= 64;
    if let Some((mem, start, pitch)) = t.mem_at(row * stride + col).filter(|_| in_place) {
        let load = Arc::new(DeferredLoad::new(mem.clone(), start, pitch, R, C));
        ctx.defer(&load);
        tile.set_host(Host::Deferred(load));
        return;
    }
    let mut fv = [fill];
    T::round(&mut fv);
    // Every element is written below (the window's data, then the fill around it), so the
    // buffer's old contents never show.
    let mut v = match tile.take_owned() {
        Some(v) => v,
        None => crate::tile_buffers::take(R * C),
    };
    v.resize(R * C, fv[0]);
    let copied = if t.has_data() {
        t.window_read(row * stride + col, vr, vc, &mut v, C);
        if vc < C {
            for r in 0..vr {
                v[r * C + vc..(r + 1) * C].fill(fv[0]);
            }
        }
        vr
    } else {
        ctx.fail(format!(
            "functional launch given a shape-only tensor {t:?}; create it with data"
        ));
        0
    };
    v[copied * C..].fill(fv[0]);
    tile.set_host(Host::Owned(v));
}

/// Fills `tile` (wholly) from the `R×C` window at (`row`, `col`) of `t` and records the load:
/// what [`load`], [`load_async`], their `_or` forms and [`load_into`] share.
fn load_window<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    mut tile: Tile<T, R, C>,
    t: &Tensor<T>,
    row: usize,
    col: usize,
    fill: f32,
    blocking: bool,
) -> Tile<T, R, C> {
    let (rows, cols) = (t.rows(), t.cols());
    let vr = rows.saturating_sub(row).min(R);
    let vc = cols.saturating_sub(col).min(C);
    // (A window wholly outside the tensor, vc == 0 or vr == 0, copies nothing.)
    let (vr_data, stride) = (if vc == 0 { 0 } else { vr }, t.row_stride());
    // A cost-only run still reads the indices an index tensor holds (a routing plan, a block
    // table), as `load_index` does: which rows the kernel reads next, and so its L2 hits, depend
    // on them. Index tiles are small; every other tile is shape-only (and a reused tile drops
    // what it held).
    let index_data = !ctx.functional && T::DTYPE == DType::I32 && t.has_data();
    if ctx.functional || index_data {
        host_window(ctx, &mut tile, t, row, col, fill, vr_data, vc);
        if ctx.checked() {
            ctx.note_read(t.id(), t.offset() + row * stride + col, stride, vr_data, vc);
        }
    } else {
        tile.set_host(Host::None);
    }
    tile.valid = if vc == 0 { [0, 0] } else { [vr, vc] };
    tile.fill = false;
    let bytes = t.storage().bytes_for((vr * vc) as u64);
    let region = Region {
        tensor: t.id(),
        offset: (t.offset() + row * t.row_stride() + col) as u64,
        rows: vr as u64,
        cols: vc as u64,
    };
    let ins = Instr::new(Op::Load { bytes, region }, ctx.line, &[], Some(tile.buf));
    ctx.issue(if blocking { ins.blocking() } else { ins });
    if ctx.checked() && R > 0 && C > 0 && (row >= rows || col >= cols) && !t.is_clipped() {
        // Read later, this tile would be the fill value, not data (see `crate::hazard`).
        let what = format!(
            "line {} loads the {R}x{C} window at [{row}, {col}] of {}, which has {rows} rows and {cols} columns",
            ctx.line,
            ctx.tensor_name(t)
        );
        ctx.taint(
            tile.buf,
            Taint::Outside {
                line: ctx.line,
                what,
            },
        );
    }
    tile
}

/// Loads the `R×C` window at (`row`, `col`) of `t` into a new tile and waits for it.
/// Elements outside the tensor read as 0 (ragged edges); only in-bounds bytes move. In a
/// cost-only run an `i32` tile still carries the indices its tensor holds, if it holds any, for
/// [`index_at`]; other tiles are shape-only.
///
/// Usage: `load::<R, C>(tensor, row, col)`
pub fn load<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    t: &Tensor<T>,
    row: usize,
    col: usize,
) -> Tile<T, R, C> {
    load_impl(ctx, t, row, col, 0.0, true)
}

/// Like [`load`] but does not wait: the program keeps issuing, and the tile's consumers wait for
/// the data. Loading the next tile before consuming the current one double-buffers.
///
/// Usage: `load_async::<R, C>(tensor, row, col)`
pub fn load_async<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    t: &Tensor<T>,
    row: usize,
    col: usize,
) -> Tile<T, R, C> {
    load_impl(ctx, t, row, col, 0.0, false)
}

/// [`load`] with elements outside the tensor set to `fill` (e.g. `f32::NEG_INFINITY` before a max).
///
/// Usage: `load_or::<R, C>(tensor, row, col, fill)`
pub fn load_or<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    t: &Tensor<T>,
    row: usize,
    col: usize,
    fill: f32,
) -> Tile<T, R, C> {
    load_impl(ctx, t, row, col, fill, true)
}

/// [`load_async`] with elements outside the tensor set to `fill`.
///
/// Usage: `load_async_or::<R, C>(tensor, row, col, fill)`
pub fn load_async_or<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    t: &Tensor<T>,
    row: usize,
    col: usize,
    fill: f32,
) -> Tile<T, R, C> {
    load_impl(ctx, t, row, col, fill, false)
}

/// Stores `tile` to the window at (`row`, `col`) of `t`; elements outside the tensor are dropped
/// (a ragged edge). In a hazard-checked launch a window that starts outside a tensor the kernel did
/// not clip itself is an error, and with `check_finite` so is a stored NaN or ±∞ (see
/// [`crate::hazard`]).
pub fn store<T: Elem, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tensor<T>,
    row: usize,
    col: usize,
    tile: &Tile<T, R, C>,
) {
    let (rows, cols) = (t.rows(), t.cols());
    let vr = rows.saturating_sub(row).min(R);
    let vc = cols.saturating_sub(col).min(C);
    if ctx.functional {
        if vr > 0 && vc > 0 {
            if let Some((mem, lo, pitch)) = t.mem_at(row * t.row_stride() + col) {
                if !ctx.deferred.is_empty() {
                    ctx.settle_deferred(mem, lo, lo + (vr - 1) * pitch + vc);
                }
                crate::packed_operands::forget_memory(Arc::as_ptr(mem) as usize);
            }
        }
        if let Some(d) = tile.vals() {
            if t.has_data() {
                t.write_window(row, col, vr, vc, d, C);
            } else {
                ctx.fail(format!(
                    "functional launch given a shape-only output tensor {t:?}"
                ));
            }
            if ctx.check_finite() && vc > 0 {
                let bad = (0..vr).find_map(|r| {
                    d[r * C..r * C + vc]
                        .iter()
                        .position(|x| !x.is_finite())
                        .map(|c| (r, c, d[r * C + c]))
                });
                if let Some((r, c, x)) = bad {
                    let name = ctx.tensor_name(t);
                    ctx.fail(format!(
                        "non-finite value: this line stores {x} into {name}[{}, {}] (tile element [{r}, {c}]); the first launch and line to produce one",
                        row + r,
                        col + c
                    ));
                }
            }
        }
        if ctx.checked() {
            if R > 0 && C > 0 && (row >= rows || col >= cols) && !t.is_clipped() {
                let name = ctx.tensor_name(t);
                ctx.fail(format!(
                    "hazard: out-of-bounds store: the {R}x{C} window at [{row}, {col}] of {name}, which has {rows} rows and {cols} columns; no element of it is inside the tensor, so it is not a ragged edge (clip the view with `rows_clipped`/`cols_clipped`/`at` if empty windows are intended)"
                ));
            }
            let stride = t.row_stride();
            ctx.note_write(
                t.id(),
                t.offset() + row * stride + col,
                stride,
                if vc == 0 { 0 } else { vr },
                vc,
            );
        }
    }
    let bytes = t.storage().bytes_for((vr * vc) as u64);
    ctx.issue(Instr::new(Op::Store { bytes }, ctx.line, &[tile.buf], None));
}

fn vec_op(
    ctx: &mut Ctx,
    elems: usize,
    dtype: DType,
    class: VectorClass,
    reads: &[u32],
    write: u32,
) {
    vec_op_useful(ctx, elems, elems, dtype, class, reads, write);
}

/// [`vec_op`] of which only `useful` element ops are the problem's work.
fn vec_op_useful(
    ctx: &mut Ctx,
    elems: usize,
    useful: usize,
    dtype: DType,
    class: VectorClass,
    reads: &[u32],
    write: u32,
) {
    let ins = Instr::new(
        Op::Vector {
            elems: elems as u64,
            dtype,
            class,
            useful: useful as u64,
        },
        ctx.line,
        reads,
        Some(write),
    );
    ctx.issue(ins);
}

/// A new tile with every element `value` (rounded to `T`).
///
/// Usage: `full::<f32, R, C>(value)`
pub fn full<T: Elem, const R: usize, const C: usize>(ctx: &mut Ctx, value: f32) -> Tile<T, R, C> {
    let data = ctx.functional.then(|| {
        let mut fv = [value];
        T::round(&mut fv);
        crate::tile_buffers::filled(R * C, fv[0])
    });
    let mut t = ctx.new_tile::<T, R, C>(data);
    t.fill = true;
    // A constant fill computes nothing of the problem.
    vec_op_useful(ctx, R * C, 0, T::DTYPE, VectorClass::Simple, &[], t.buf);
    t
}

/// A new tile of zeros (typically an accumulator).
///
/// Usage: `zeros::<f32, R, C>()`
pub fn zeros<T: Elem, const R: usize, const C: usize>(ctx: &mut Ctx) -> Tile<T, R, C> {
    full::<T, R, C>(ctx, 0.0)
}

/// A new tile whose contents are undefined until an intrinsic writes it wholly ([`load_into`]):
/// on-chip memory reserved without a fill, so no vector pass is spent on values that will be
/// overwritten (a buffer of a manual double-buffering ring). Reading it first — including as the
/// accumulator of an `mma`, which adds to it — is a hazard (an error at the reading line) in a
/// checked launch; unchecked, it reads NaN. Issues no instruction.
///
/// Usage: `empty::<f32, R, C>()`
pub fn empty<T: Elem, const R: usize, const C: usize>(ctx: &mut Ctx) -> Tile<T, R, C> {
    let data = ctx
        .functional
        .then(|| crate::tile_buffers::filled(R * C, f32::NAN));
    let t = ctx.new_tile::<T, R, C>(data);
    if ctx.checked() {
        ctx.taint(t.buf, Taint::Empty { line: ctx.line });
    }
    t
}

/// [`load`] into an existing tile (its previous contents are replaced wholly, padding included):
/// reuses the tile's on-chip buffer instead of allocating one, e.g. to fill an [`empty`] tile.
/// Waits for the data, like [`load`].
///
/// Usage: `load_into(&mut tile, tensor, row, col)`
pub fn load_into<T: Elem, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    tile: &mut Tile<T, R, C>,
    t: &Tensor<T>,
    row: usize,
    col: usize,
) {
    let taken = Tile {
        buf: tile.buf,
        host: std::mem::replace(&mut tile.host, Host::None),
        _t: std::marker::PhantomData,
        valid: tile.valid,
        fill: tile.fill,
    };
    *tile = load_window(ctx, taken, t, row, col, 0.0, true);
}

/// The useful FLOP of an MMA whose operands hold `vm×vk` and `vk×vn` of the problem's data, and
/// the accumulator's new valid extent: a fresh fill takes the product's, one already holding data
/// keeps the larger of the two (it is still that much of the output).
fn mma_useful<const M: usize, const N: usize>(
    acc: &mut Tile<f32, M, N>,
    vm: usize,
    vn: usize,
    vk: usize,
) -> u64 {
    acc.valid = if acc.fill {
        [vm, vn]
    } else {
        [acc.valid[0].max(vm), acc.valid[1].max(vn)]
    };
    acc.fill = false;
    isa::mma_flop(vm as u64, vn as u64, vk as u64)
}

/// The functional part of [`mma`] (`acc += a·b`) and [`mma_bt`] (`transposed`: `acc += a·bᵀ`):
/// operands read in place, and a B that is a deferred load packed once per launch and thread.
fn host_mma<
    T: Float,
    const M: usize,
    const N: usize,
    const K: usize,
    const BR: usize,
    const BC: usize,
>(
    ctx: &Ctx,
    acc: &mut Tile<f32, M, N>,
    a: &Tile<T, M, K>,
    b: &Tile<T, BR, BC>,
    transposed: bool,
) {
    let (Some(x), Some(c)) = (a.operand(), acc.vals_mut()) else {
        return;
    };
    if let Some(packed) = b.deferred().and_then(|d| d.packed(ctx.launch, transposed)) {
        f::mma_f32_packed(c, x, &packed);
    } else if let Some(y) = b.operand() {
        if transposed {
            f::mma_f32_bt_ref(c, x, y);
        } else {
            f::mma_f32_ref(c, x, y);
        }
    }
}

/// `acc[M×N] += a[M×K] · b[K×N]` on the matrix unit (inputs `T`, accumulation f32).
pub fn mma<T: Float, const M: usize, const N: usize, const K: usize>(
    ctx: &mut Ctx,
    acc: &mut Tile<f32, M, N>,
    a: &Tile<T, M, K>,
    b: &Tile<T, K, N>,
) {
    host_mma(ctx, acc, a, b, false);
    let (vm, vn, vk) = (a.valid[0], b.valid[1], a.valid[1].min(b.valid[0]));
    let useful = mma_useful(acc, vm, vn, vk);
    let op = Op::Mma {
        m: M as u64,
        n: N as u64,
        k: K as u64,
        dtype: T::DTYPE,
        useful,
    };
    ctx.issue(Instr::new(
        op,
        ctx.line,
        &[a.buf, b.buf, acc.buf],
        Some(acc.buf),
    ));
}

/// `acc[M×N] += a[M×K] · b[N×K]ᵀ` (e.g. queries times keys).
pub fn mma_bt<T: Float, const M: usize, const N: usize, const K: usize>(
    ctx: &mut Ctx,
    acc: &mut Tile<f32, M, N>,
    a: &Tile<T, M, K>,
    b: &Tile<T, N, K>,
) {
    host_mma(ctx, acc, a, b, true);
    let (vm, vn, vk) = (a.valid[0], b.valid[0], a.valid[1].min(b.valid[1]));
    let useful = mma_useful(acc, vm, vn, vk);
    let op = Op::Mma {
        m: M as u64,
        n: N as u64,
        k: K as u64,
        dtype: T::DTYPE,
        useful,
    };
    ctx.issue(Instr::new(
        op,
        ctx.line,
        &[a.buf, b.buf, acc.buf],
        Some(acc.buf),
    ));
}

/// Converts a tile to another element type (round-to-nearest-even).
///
/// Usage: `cast::<f32>(&tile)`
pub fn cast<U: Elem, T: Elem, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<U, R, C> {
    let data = t.vals().map(|d| {
        let mut v = crate::tile_buffers::copied(d);
        U::round(&mut v);
        v
    });
    let mut out = ctx.new_tile::<U, R, C>(data);
    out.valid = Tile::<U, R, C>::extent_of(&[(t.valid, t.fill)]);
    let wider = if T::DTYPE.bits() >= U::DTYPE.bits() {
        T::DTYPE
    } else {
        U::DTYPE
    };
    vec_op(ctx, R * C, wider, VectorClass::Simple, &[t.buf], out.buf);
    out
}

fn unary_op<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
    op: Unary,
) -> Tile<T, R, C> {
    let data = t.vals().map(|d| {
        let mut v = crate::tile_buffers::filled(R * C, 0.0);
        f::unary(&mut v, d, op);
        T::round(&mut v);
        v
    });
    let mut out = ctx.new_tile::<T, R, C>(data);
    out.valid = Tile::<T, R, C>::extent_of(&[(t.valid, t.fill)]);
    let class = if op.is_transcendental() {
        VectorClass::Transcendental
    } else {
        VectorClass::Simple
    };
    vec_op(ctx, R * C, T::DTYPE, class, &[t.buf], out.buf);
    out
}

/// Element-wise eˣ.
pub fn exp<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Exp)
}

/// Element-wise natural logarithm.
pub fn ln<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Ln)
}

/// Element-wise square root.
pub fn sqrt<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Sqrt)
}

/// Element-wise 1/√x.
pub fn rsqrt<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Rsqrt)
}

/// Element-wise 1/x.
pub fn recip<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Recip)
}

/// Element-wise −x.
pub fn neg<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Neg)
}

/// Element-wise |x|.
pub fn abs<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Abs)
}

/// Element-wise x².
pub fn square<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Square)
}

/// Element-wise max(x, 0).
pub fn relu<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Relu)
}

/// Element-wise logistic sigmoid.
pub fn sigmoid<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Sigmoid)
}

/// Element-wise x·σ(x) (SiLU / swish).
pub fn silu<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Silu)
}

/// Element-wise ln(1 + eˣ).
pub fn softplus<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Softplus)
}

/// Element-wise exact GELU, x·Φ(x) = ½x(1 + erf(x/√2)) (`torch.nn.GELU()`).
pub fn gelu<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::Gelu)
}

/// Element-wise tanh GELU, ½x(1 + tanh(√(2/π)(x + 0.044715x³))) (`gelu_pytorch_tanh`).
pub fn gelu_tanh<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    unary_op(ctx, t, Unary::GeluTanh)
}

fn binary_op<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    b: &Tile<T, R, C>,
    op: Binary,
) -> Tile<T, R, C> {
    let data = match (a.vals(), b.vals()) {
        (Some(x), Some(y)) => {
            let mut v = crate::tile_buffers::filled(R * C, 0.0);
            f::binary(&mut v, x, y, op);
            T::round(&mut v);
            Some(v)
        }
        _ => None,
    };
    let mut out = ctx.new_tile::<T, R, C>(data);
    out.valid = Tile::<T, R, C>::extent_of(&[(a.valid, a.fill), (b.valid, b.fill)]);
    vec_op(
        ctx,
        R * C,
        T::DTYPE,
        VectorClass::Simple,
        &[a.buf, b.buf],
        out.buf,
    );
    out
}

/// Element-wise a + b.
pub fn add<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    b: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    binary_op(ctx, a, b, Binary::Add)
}

/// Element-wise a − b.
pub fn sub<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    b: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    binary_op(ctx, a, b, Binary::Sub)
}

/// Element-wise a · b.
pub fn mul<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    b: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    binary_op(ctx, a, b, Binary::Mul)
}

/// Element-wise a / b.
pub fn div<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    b: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    binary_op(ctx, a, b, Binary::Div)
}

/// Element-wise max(a, b) (NaN propagates).
pub fn maximum<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    b: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    binary_op(ctx, a, b, Binary::Max)
}

/// Element-wise min(a, b) (NaN propagates).
pub fn minimum<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    b: &Tile<T, R, C>,
) -> Tile<T, R, C> {
    binary_op(ctx, a, b, Binary::Min)
}

fn scalar_op<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
    s: f32,
    op: Binary,
) -> Tile<T, R, C> {
    let data = t.vals().map(|d| {
        let mut v = crate::tile_buffers::filled(R * C, 0.0);
        f::binary_scalar(&mut v, d, s, op);
        T::round(&mut v);
        v
    });
    let mut out = ctx.new_tile::<T, R, C>(data);
    out.valid = Tile::<T, R, C>::extent_of(&[(t.valid, t.fill)]);
    vec_op(ctx, R * C, T::DTYPE, VectorClass::Simple, &[t.buf], out.buf);
    out
}

/// Element-wise t · s for a scalar s.
pub fn scale<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
    s: f32,
) -> Tile<T, R, C> {
    scalar_op(ctx, t, s, Binary::Mul)
}

/// Element-wise t + s for a scalar s.
pub fn add_scalar<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
    s: f32,
) -> Tile<T, R, C> {
    scalar_op(ctx, t, s, Binary::Add)
}

fn col_bcast<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, R, 1>,
    op: Binary,
) -> Tile<T, R, C> {
    let data = match (a.vals(), v.vals()) {
        (Some(x), Some(y)) => {
            let mut o = crate::tile_buffers::filled(R * C, 0.0);
            f::binary_col_bcast(&mut o, x, y, C, op);
            T::round(&mut o);
            Some(o)
        }
        _ => None,
    };
    let out = ctx.new_tile::<T, R, C>(data);
    vec_op(
        ctx,
        R * C,
        T::DTYPE,
        VectorClass::Simple,
        &[a.buf, v.buf],
        out.buf,
    );
    out
}

fn row_bcast<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, 1, C>,
    op: Binary,
) -> Tile<T, R, C> {
    let data = match (a.vals(), v.vals()) {
        (Some(x), Some(y)) => {
            let mut o = crate::tile_buffers::filled(R * C, 0.0);
            f::binary_row_bcast(&mut o, x, y, C, op);
            T::round(&mut o);
            Some(o)
        }
        _ => None,
    };
    let out = ctx.new_tile::<T, R, C>(data);
    vec_op(
        ctx,
        R * C,
        T::DTYPE,
        VectorClass::Simple,
        &[a.buf, v.buf],
        out.buf,
    );
    out
}

/// `a[r][c] + v[r]`: adds a column vector to every column.
pub fn add_col<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, R, 1>,
) -> Tile<T, R, C> {
    col_bcast(ctx, a, v, Binary::Add)
}

/// `a[r][c] − v[r]`.
pub fn sub_col<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, R, 1>,
) -> Tile<T, R, C> {
    col_bcast(ctx, a, v, Binary::Sub)
}

/// `a[r][c] · v[r]`.
pub fn mul_col<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, R, 1>,
) -> Tile<T, R, C> {
    col_bcast(ctx, a, v, Binary::Mul)
}

/// `a[r][c] / v[r]`.
pub fn div_col<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, R, 1>,
) -> Tile<T, R, C> {
    col_bcast(ctx, a, v, Binary::Div)
}

/// `a[r][c] + v[c]`: adds a row vector to every row.
pub fn add_row<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, 1, C>,
) -> Tile<T, R, C> {
    row_bcast(ctx, a, v, Binary::Add)
}

/// `a[r][c] − v[c]`.
pub fn sub_row<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, 1, C>,
) -> Tile<T, R, C> {
    row_bcast(ctx, a, v, Binary::Sub)
}

/// `a[r][c] · v[c]`.
pub fn mul_row<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, 1, C>,
) -> Tile<T, R, C> {
    row_bcast(ctx, a, v, Binary::Mul)
}

/// `a[r][c] / v[c]`.
pub fn div_row<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    a: &Tile<T, R, C>,
    v: &Tile<T, 1, C>,
) -> Tile<T, R, C> {
    row_bcast(ctx, a, v, Binary::Div)
}

fn reduce_rows_op<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
    op: Reduce,
) -> Tile<f32, R, 1> {
    let data = t.vals().map(|d| {
        let mut v = crate::tile_buffers::filled(R, 0.0);
        f::reduce_rows(&mut v, d, C, op);
        v
    });
    let out = ctx.new_tile::<f32, R, 1>(data);
    vec_op(
        ctx,
        R * C,
        T::DTYPE,
        VectorClass::Reduction,
        &[t.buf],
        out.buf,
    );
    out
}

fn reduce_cols_op<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
    op: Reduce,
) -> Tile<f32, 1, C> {
    let data = t.vals().map(|d| {
        let mut v = crate::tile_buffers::filled(C, 0.0);
        f::reduce_cols(&mut v, d, C, op);
        v
    });
    let out = ctx.new_tile::<f32, 1, C>(data);
    vec_op(
        ctx,
        R * C,
        T::DTYPE,
        VectorClass::Reduction,
        &[t.buf],
        out.buf,
    );
    out
}

/// Sum of each row → an `R×1` f32 tile.
pub fn row_sum<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<f32, R, 1> {
    reduce_rows_op(ctx, t, Reduce::Sum)
}

/// Max of each row → an `R×1` f32 tile.
pub fn row_max<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<f32, R, 1> {
    reduce_rows_op(ctx, t, Reduce::Max)
}

/// Sum of each column → a `1×C` f32 tile.
pub fn col_sum<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<f32, 1, C> {
    reduce_cols_op(ctx, t, Reduce::Sum)
}

/// Max of each column → a `1×C` f32 tile.
pub fn col_max<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<f32, 1, C> {
    reduce_cols_op(ctx, t, Reduce::Max)
}

/// Masks an attention score tile: element (r, c) holds the score of the query at absolute position
/// `q_pos + r` against the key at absolute position `k_pos + c`; it becomes −∞ when the key is past
/// the context (`≥ kv_len`) or, with `causal`, after the query. One vector pass (compare + select).
pub fn mask_keys<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    s: &Tile<T, R, C>,
    q_pos: usize,
    k_pos: usize,
    kv_len: usize,
    causal: bool,
) -> Tile<T, R, C> {
    mask_columns(ctx, s, |r| {
        // Keys at column ≥ `limit` are masked for this row.
        let mut limit = kv_len.saturating_sub(k_pos);
        if causal {
            limit = limit.min((q_pos + r + 1).saturating_sub(k_pos));
        }
        limit..C
    })
}

/// The masks' one vector pass (compare + select): row `r`'s columns `masked(r)` become −∞.
fn mask_columns<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    s: &Tile<T, R, C>,
    masked: impl Fn(usize) -> std::ops::Range<usize>,
) -> Tile<T, R, C> {
    let data = s.vals().map(|d| {
        let mut v = crate::tile_buffers::copied(d);
        for (r, row) in v.chunks_exact_mut(C).enumerate() {
            let cols = masked(r);
            for x in &mut row[cols.start.min(C)..cols.end.min(C)] {
                *x = f32::NEG_INFINITY;
            }
        }
        v
    });
    let out = ctx.new_tile::<T, R, C>(data);
    vec_op(ctx, R * C, T::DTYPE, VectorClass::Simple, &[s.buf], out.buf);
    out
}

/// Masks the keys a sliding window leaves behind: element (r, c), the score of the query at
/// absolute position `q_pos + r` against the key at `k_pos + c`, becomes −∞ when the key is
/// `window` or more positions older than the query (each query sees itself and the `window − 1`
/// keys before it, as transformers' `sliding_window`). `window` 0 masks nothing. One vector pass
/// (compare + select), as [`mask_keys`].
pub fn mask_window<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    s: &Tile<T, R, C>,
    q_pos: usize,
    k_pos: usize,
    window: usize,
) -> Tile<T, R, C> {
    mask_columns(ctx, s, |r| {
        // Keys before `first` are out of this query's window.
        let first = if window > 0 {
            (q_pos + r + 1).saturating_sub(window)
        } else {
            0
        };
        0..first.saturating_sub(k_pos)
    })
}

/// Masks the keys before absolute position `first` in every row (column `c` holds the key at
/// `k_pos + c`): a decode query's sliding window, whose rows are heads at one position. One
/// vector pass (compare + select), as [`mask_keys`].
pub fn mask_before<T: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    s: &Tile<T, R, C>,
    k_pos: usize,
    first: usize,
) -> Tile<T, R, C> {
    mask_columns(ctx, s, |_| 0..first.saturating_sub(k_pos))
}

/// Dequantizes an MXFP4 tile on chip (vector unit): `blocks` holds `R×C` E2M1 values packed two per
/// byte (element `2j` in the low nibble of byte `j`, as gpt-oss checkpoints store them), `scales`
/// one E8M0 byte per 32 elements of a row; element `(r, c)` = E2M1(nibble) · 2^(scale − 127),
/// rounded to `U`. A NaN scale (0xFF) makes its 32 elements NaN. The packed tile sizes must be
/// `C/2` and `C/32` columns (use `derived(CB = C / 2, CS = C / 32)`). Costed as
/// [`isa::mxfp4_dequant_elems`] vector element passes.
///
/// Usage: `dequant_mxfp4::<bf16, R, C>(&blocks, &scales)`
pub fn dequant_mxfp4<U: Float, const R: usize, const C: usize, const CB: usize, const CS: usize>(
    ctx: &mut Ctx,
    blocks: &Tile<u8, R, CB>,
    scales: &Tile<u8, R, CS>,
) -> Tile<U, R, C> {
    if CB * 2 != C || CS * 32 != C {
        ctx.fail(format!(
            "dequant_mxfp4 to {R}x{C} needs blocks of {R}x{} bytes and scales of {R}x{} bytes, got {R}x{CB} and {R}x{CS}",
            C / 2,
            C.div_ceil(32)
        ));
    }
    let data = match (blocks.vals(), scales.vals()) {
        (Some(b), Some(s)) if CB * 2 == C && CS * 32 == C => {
            Some(f::dequant_mxfp4(b, s, R, C, U::DTYPE))
        }
        _ => None,
    };
    let elems = isa::mxfp4_dequant_elems(R as u64, C as u64);
    dequantized(ctx, data, elems, [blocks.buf, scales.buf])
}

/// The tile a dequantization intrinsic made (`data`, `None` in cost-only runs), issued as `elems`
/// simple vector passes over the packed codes and the scales `reads`.
fn dequantized<U: Float, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    data: Option<Vec<f32>>,
    elems: u64,
    reads: [BufId; 2],
) -> Tile<U, R, C> {
    let out = ctx.new_tile::<U, R, C>(data);
    vec_op(
        ctx,
        elems as usize,
        U::DTYPE,
        VectorClass::Simple,
        &reads,
        out.buf,
    );
    out
}

/// Dequantizes a symmetric group-scaled INT4 tile on chip (vector unit): `packed` holds `R×C` 4-bit
/// codes two per byte (element `2j` in the low nibble of byte `j`: compressed-tensors'
/// `pack-quantized` layout, Kimi-K2-Thinking's experts), a code `q` meaning `q − 8`; `scales` holds
/// one bf16 scale per group of `C / CS` consecutive elements of a row. Element `(r, c)` =
/// `(q − 8) · scale`, rounded to `U`. The packed tile must have `C/2` columns and `C` must be a
/// multiple of `CS` (use `derived(CB = C / 2, CS = C / GROUP)`). Costed as
/// [`isa::int4_dequant_elems`] vector element passes.
///
/// Usage: `dequant_int4::<bf16, R, C>(&packed, &scales)`
pub fn dequant_int4<U: Float, const R: usize, const C: usize, const CB: usize, const CS: usize>(
    ctx: &mut Ctx,
    packed: &Tile<u8, R, CB>,
    scales: &Tile<bf16, R, CS>,
) -> Tile<U, R, C> {
    let fits = CB * 2 == C && CS > 0 && C.is_multiple_of(CS);
    if !fits {
        ctx.fail(format!(
            "dequant_int4 to {R}x{C} needs packed codes of {R}x{} bytes and scales of {R}xG groups with G dividing {C}, got {R}x{CB} and {R}x{CS}",
            C / 2
        ));
    }
    let data = match (packed.vals(), scales.vals()) {
        (Some(q), Some(s)) if fits => Some(f::dequant_int4(q, s, R, C, C / CS, U::DTYPE)),
        _ => None,
    };
    let elems = isa::int4_dequant_elems(R as u64, C as u64);
    dequantized(ctx, data, elems, [packed.buf, scales.buf])
}

/// `acc[M×N] += a[K×M]ᵀ · b[K×N]` (e.g. a state update `Kᵀ V`; with `K = 1`, an outer product).
pub fn mma_at<T: Float, const M: usize, const N: usize, const K: usize>(
    ctx: &mut Ctx,
    acc: &mut Tile<f32, M, N>,
    a: &Tile<T, K, M>,
    b: &Tile<T, K, N>,
) {
    if let (Some(c), Some(x), Some(y)) = (acc.vals_mut(), a.vals(), b.vals()) {
        let mut at = crate::tile_buffers::filled(M * K, 0.0);
        f::transpose(&mut at, x, K, M);
        f::mma_f32(c, &at, y, M, N, K);
        crate::tile_buffers::give(at);
    }
    let (vm, vn, vk) = (a.valid[1], b.valid[1], a.valid[0].min(b.valid[0]));
    let useful = mma_useful(acc, vm, vn, vk);
    let op = Op::Mma {
        m: M as u64,
        n: N as u64,
        k: K as u64,
        dtype: T::DTYPE,
        useful,
    };
    ctx.issue(Instr::new(
        op,
        ctx.line,
        &[a.buf, b.buf, acc.buf],
        Some(acc.buf),
    ));
}

/// Splits the columns of an `R×C` tile into its even and odd ones: `(t[:, 0::2], t[:, 1::2])`,
/// each `R×CH` with `C = 2·CH` (use `derived(CH = C / 2)`). For layouts that interleave pairs
/// (complex numbers, DeepSeek's interleaved RoPE); [`interleave`] is the inverse. One vector pass.
pub fn deinterleave<T: Elem, const R: usize, const C: usize, const CH: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> (Tile<T, R, CH>, Tile<T, R, CH>) {
    if 2 * CH != C {
        ctx.fail(format!(
            "deinterleave of a {R}x{C} tile gives two {R}x{} tiles, not {R}x{CH}",
            C / 2
        ));
    }
    let (even, odd) = match t.vals() {
        Some(d) if 2 * CH == C => {
            let (mut e, mut o) = (
                crate::tile_buffers::filled(R * CH, 0.0),
                crate::tile_buffers::filled(R * CH, 0.0),
            );
            for (r, row) in d.chunks_exact(C).enumerate() {
                for (j, pair) in row.chunks_exact(2).enumerate() {
                    e[r * CH + j] = pair[0];
                    o[r * CH + j] = pair[1];
                }
            }
            (Some(e), Some(o))
        }
        _ => (None, None),
    };
    let (even, odd) = (
        ctx.new_tile::<T, R, CH>(even),
        ctx.new_tile::<T, R, CH>(odd),
    );
    vec_op(
        ctx,
        R * CH,
        T::DTYPE,
        VectorClass::Simple,
        &[t.buf],
        even.buf,
    );
    vec_op(
        ctx,
        R * CH,
        T::DTYPE,
        VectorClass::Simple,
        &[t.buf],
        odd.buf,
    );
    (even, odd)
}

/// Interleaves the columns of two `R×CH` tiles into one `R×C` tile (`C = 2·CH`): column `2j` from
/// `even`, `2j + 1` from `odd`. The inverse of [`deinterleave`]. One vector pass.
pub fn interleave<T: Elem, const R: usize, const CH: usize, const C: usize>(
    ctx: &mut Ctx,
    even: &Tile<T, R, CH>,
    odd: &Tile<T, R, CH>,
) -> Tile<T, R, C> {
    if 2 * CH != C {
        ctx.fail(format!(
            "interleave of two {R}x{CH} tiles gives a {R}x{} tile, not {R}x{C}",
            2 * CH
        ));
    }
    let data = match (even.vals(), odd.vals()) {
        (Some(e), Some(o)) if 2 * CH == C => {
            let mut v = crate::tile_buffers::filled(R * C, 0.0);
            for (j, pair) in v.chunks_exact_mut(2).enumerate() {
                pair[0] = e[j];
                pair[1] = o[j];
            }
            Some(v)
        }
        _ => None,
    };
    let out = ctx.new_tile::<T, R, C>(data);
    vec_op(
        ctx,
        R * C,
        T::DTYPE,
        VectorClass::Simple,
        &[even.buf, odd.buf],
        out.buf,
    );
    out
}

/// `tᵀ`: a `C×R` tile from an `R×C` one (one vector pass).
pub fn transpose<T: Elem, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
) -> Tile<T, C, R> {
    let data = t.vals().map(|d| {
        let mut v = crate::tile_buffers::filled(R * C, 0.0);
        f::transpose(&mut v, d, R, C);
        v
    });
    let mut out = ctx.new_tile::<T, C, R>(data);
    out.valid = [t.valid[1], t.valid[0]];
    vec_op(ctx, R * C, T::DTYPE, VectorClass::Simple, &[t.buf], out.buf);
    out
}

/// `cur`'s rows moved down by `s` (a run-time count, at most `R`), the top `s` rows taken from
/// the bottom of `prev`: row `r` is `prev[R − s + r]` for `r < s`, else `cur[r − s]` (one vector
/// pass). A window sliding over a stream of row tiles, such as a causal convolution's taps over
/// consecutive token blocks, without loading overlapping windows from memory again.
///
/// Usage: `shift_rows(&prev, &cur, s)`
pub fn shift_rows<T: Elem, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    prev: &Tile<T, R, C>,
    cur: &Tile<T, R, C>,
    s: usize,
) -> Tile<T, R, C> {
    if s > R {
        ctx.fail(format!(
            "shift_rows by {s} rows of a {R}-row tile: at most {R}"
        ));
    }
    let s = s.min(R);
    let data = match (prev.vals(), cur.vals()) {
        (Some(p), Some(c)) => {
            let mut v = crate::tile_buffers::filled(R * C, 0.0);
            v[..s * C].copy_from_slice(&p[(R - s) * C..]);
            v[s * C..].copy_from_slice(&c[..(R - s) * C]);
            Some(v)
        }
        _ => None,
    };
    let mut out = ctx.new_tile::<T, R, C>(data);
    let cols = Tile::<T, R, C>::extent_of(&[(prev.valid, prev.fill), (cur.valid, cur.fill)])[1];
    let rows = if cur.fill {
        R
    } else {
        (cur.valid[0] + s).min(R)
    };
    out.valid = [rows, cols];
    vec_op(
        ctx,
        R * C,
        T::DTYPE,
        VectorClass::Simple,
        &[prev.buf, cur.buf],
        out.buf,
    );
    out
}

/// A `1×1` tile's value repeated over `R×C` (a per-head scalar such as a decay, applied to a tile).
///
/// Usage: `broadcast::<_, R, C>(&scalar_tile)`
pub fn broadcast<T: Elem, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    s: &Tile<T, 1, 1>,
) -> Tile<T, R, C> {
    let data = s.vals().map(|d| crate::tile_buffers::filled(R * C, d[0]));
    let out = ctx.new_tile::<T, R, C>(data);
    vec_op(ctx, R * C, T::DTYPE, VectorClass::Simple, &[s.buf], out.buf);
    out
}

/// Lower-triangular part of a square-indexed tile: element (r, c) kept when `c ≤ r` (or `c < r`
/// with `strict`), zero elsewhere. For chunked linear attention's causal masks.
pub fn tril<T: Elem, const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<T, R, C>,
    strict: bool,
) -> Tile<T, R, C> {
    let data = t.vals().map(|d| {
        let mut v = crate::tile_buffers::copied(d);
        for (r, row) in v.chunks_exact_mut(C).enumerate() {
            let keep = if strict { r } else { r + 1 };
            for x in row.iter_mut().skip(keep) {
                *x = 0.0;
            }
        }
        v
    });
    let mut out = ctx.new_tile::<T, R, C>(data);
    out.valid = Tile::<T, R, C>::extent_of(&[(t.valid, t.fill)]);
    vec_op(ctx, R * C, T::DTYPE, VectorClass::Simple, &[t.buf], out.buf);
    out
}

/// The `N×N` identity.
///
/// Usage: `eye::<f32, N>()`
pub fn eye<T: Elem, const N: usize>(ctx: &mut Ctx) -> Tile<T, N, N> {
    let data = ctx.functional.then(|| {
        let mut v = crate::tile_buffers::filled(N * N, 0.0);
        for i in 0..N {
            v[i * N + i] = 1.0;
        }
        v
    });
    let out = ctx.new_tile::<T, N, N>(data);
    vec_op(ctx, N * N, T::DTYPE, VectorClass::Simple, &[], out.buf);
    out
}

/// Entry `i` of index data of `len` entries read by `get` (`None` without data, as from a
/// shape-only tensor: `fallback`) as a scalar; a negative, non-finite or out-of-range entry is a
/// kernel error naming `holder()` (the tensor or tile; only formatted on error).
fn read_index(
    ctx: &mut Ctx,
    data: Option<(usize, &dyn Fn(usize) -> f32)>,
    i: usize,
    fallback: usize,
    holder: &dyn Fn() -> String,
) -> usize {
    match data {
        Some((len, get)) if i < len => {
            let v = get(i);
            if v.is_finite() && v >= 0.0 {
                v as usize
            } else {
                ctx.fail(format!(
                    "index {} holds {v} at {i}; indices must be non-negative",
                    holder()
                ));
                0
            }
        }
        Some((len, _)) => {
            ctx.fail(format!(
                "index position {i} is outside {} ({len} entries)",
                holder()
            ));
            0
        }
        None => fallback,
    }
}

/// Reads one index from device memory into the program (a block-table entry, a selected token):
/// a small blocking DMA, since the next addresses depend on it. A cost-only run reads the entry
/// when the tensor holds data (a routing plan, a block table) and otherwise returns `fallback`
/// (e.g. the identity page mapping).
pub fn load_index(ctx: &mut Ctx, t: &Tensor<i32>, i: usize, fallback: usize) -> usize {
    // Logical entry `i` of a (possibly strided) index view, at its memory position.
    let at = if i < t.len() {
        t.mem_index(i)
    } else {
        usize::MAX
    };
    let get = |j: usize| t.span_get(j).unwrap_or(f32::NAN);
    let data = t
        .has_data()
        .then_some((t.span(), &get as &dyn Fn(usize) -> f32));
    let value = read_index(ctx, data, at, fallback, &|| format!("tensor {t:?}"));
    if ctx.checked() && at < t.span() {
        ctx.note_read(t.id(), t.offset() + at, 1, 1, 1);
    }
    let region = Region {
        tensor: t.id(),
        offset: (t.offset() + i) as u64,
        rows: 1,
        cols: 1,
    };
    ctx.issue(Instr::new(Op::Load { bytes: 4, region }, ctx.line, &[], None).blocking());
    value
}

/// Reads element `i` (row-major) of an index tile into the program as a scalar (a selected expert,
/// a kept group), so the next addresses can depend on it — the tile counterpart of
/// [`load_index`]. A register move on the vector unit; the program waits for it. In cost-only runs
/// a tile has data only when loaded from an index tensor that holds some (see [`load`]);
/// otherwise it returns `fallback`. A negative or out-of-range entry is a kernel error.
pub fn index_at<const R: usize, const C: usize>(
    ctx: &mut Ctx,
    t: &Tile<i32, R, C>,
    i: usize,
    fallback: usize,
) -> usize {
    let get = |j: usize| t.vals().map_or(f32::NAN, |d| d[j]);
    let data = t.vals().map(|d| (d.len(), &get as &dyn Fn(usize) -> f32));
    let value = read_index(ctx, data, i, fallback, &|| format!("tile {t:?}"));
    let op = Op::Vector {
        elems: 1,
        dtype: DType::I32,
        class: VectorClass::Simple,
        // Reading an index moves data; it computes nothing.
        useful: 0,
    };
    ctx.issue(Instr::new(op, ctx.line, &[t.buf], None).blocking());
    value
}

/// Total order of top-k selection: higher score first, equal scores by lower index, `−0 = +0`,
/// NaN below everything (so a NaN never displaces a real score).
fn topk_before(a: (f32, f32), b: (f32, f32)) -> std::cmp::Ordering {
    let key = |v: f32| {
        if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v + 0.0
        }
    };
    let nan_rank = |v: f32| v.is_nan() as u8;
    nan_rank(a.0)
        .cmp(&nan_rank(b.0))
        .then(
            key(b.0)
                .partial_cmp(&key(a.0))
                .unwrap_or(std::cmp::Ordering::Equal),
        )
        .then(a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal))
}

/// Merges `C` candidate scores (indices `base..base+C`) into a running top-`K` (`best`, best
/// first; `best_idx` holds the indices). Repeated over a row's tiles it selects the row's top-`K`
/// with a deterministic order (higher score first, ties by lower index, NaN last). Start from `full(-inf)` scores and `full(-1)`
/// indices. Costed as a bitonic merge on the vector unit ([`isa::topk_merge_elems`]).
pub fn topk_update<const K: usize, const C: usize>(
    ctx: &mut Ctx,
    best: &mut Tile<f32, 1, K>,
    best_idx: &mut Tile<i32, 1, K>,
    cand: &Tile<f32, 1, C>,
    base: usize,
) {
    if let (Some(bv), Some(bi), Some(cv)) = (best.vals_mut(), best_idx.vals_mut(), cand.vals()) {
        let mut all: Vec<(f32, f32)> = bv.iter().copied().zip(bi.iter().copied()).collect();
        all.extend(cv.iter().enumerate().map(|(c, v)| (*v, (base + c) as f32)));
        all.sort_by(|a, b| topk_before(*a, *b));
        for (k, (v, i)) in all.into_iter().take(K).enumerate() {
            bv[k] = v;
            bi[k] = i;
        }
    }
    let passes = isa::topk_merge_elems(K as u64, C as u64);
    let op = Op::Vector {
        elems: passes,
        dtype: accel_sim::DType::F32,
        class: VectorClass::Simple,
        useful: passes,
    };
    ctx.issue(Instr::new(
        op.clone(),
        ctx.line,
        &[best.buf, best_idx.buf, cand.buf],
        Some(best.buf),
    ));
    ctx.issue(Instr::new(
        Op::Vector {
            elems: 0,
            dtype: accel_sim::DType::I32,
            class: VectorClass::Simple,
            useful: 0,
        },
        ctx.line,
        &[best.buf],
        Some(best_idx.buf),
    ));
}

/// Gathers `R` rows of a paged pool into a tile: row `r` is logical token `idx[i0 + r]` of a
/// sequence whose pages are `block_table` (`pool [pages, P, row]`), columns `col..col+C`. Rows
/// `r ≥ count` read as 0. One gather DMA: the indices, the block-table entries and the rows move.
#[allow(clippy::too_many_arguments)]
pub fn gather_rows<const R: usize, const C: usize, T: Elem>(
    ctx: &mut Ctx,
    pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    idx: &Tensor<i32>,
    i0: usize,
    count: usize,
    col: usize,
) -> Tile<T, R, C> {
    let page = pool.shape().get(1).copied().unwrap_or(1).max(1);
    let row_len = pool.cols();
    let pitch = pool.row_stride();
    let rows = count
        .saturating_sub(i0)
        .min(R)
        .min(idx.len().saturating_sub(i0));
    let vc = row_len.saturating_sub(col).min(C);
    let data = if ctx.functional {
        let mut v = crate::tile_buffers::filled(R * C, 0.0);
        let checked = ctx.checked();
        if !block_table.is_dense() || !idx.is_dense() {
            ctx.fail(
                "gather_rows: the block table and the index list must be dense (not column windows)"
                    .into(),
            );
        } else if pool.has_data() && block_table.has_data() && idx.has_data() {
            let (bt_len, pool_span) = (block_table.span(), pool.span());
            for r in 0..rows {
                let s = idx.span_get(i0 + r).unwrap_or(0.0) as usize;
                let Some(pg) =
                    (s / page < bt_len).then(|| block_table.span_get(s / page).unwrap_or(0.0))
                else {
                    ctx.fail(format!(
                        "gather_rows: token {s} is past the block table ({bt_len} pages)"
                    ));
                    break;
                };
                let src = (pg as usize * page + s % page) * pitch + col;
                if src + vc > pool_span {
                    ctx.fail(format!(
                        "gather_rows: token {s} maps outside the pool {pool:?}"
                    ));
                    break;
                }
                pool.span_read(src, &mut v[r * C..r * C + vc]);
                if checked {
                    ctx.note_read(block_table.id(), block_table.offset() + s / page, 1, 1, 1);
                    ctx.note_read(pool.id(), pool.offset() + src, pitch, 1, vc);
                }
            }
            if checked {
                ctx.note_read(idx.id(), idx.offset() + i0, 1, 1, rows);
            }
        } else {
            ctx.fail("gather_rows: functional launch given shape-only tensors".into());
        }
        T::round(&mut v);
        Some(v)
    } else {
        None
    };
    let tile = ctx.new_tile::<T, R, C>(data);
    let bytes = isa::gather_bytes(pool.storage().bytes_for((rows * vc) as u64), rows as u64);
    // Keyed by the index window: programs gathering the same selection hit in L2.
    let region = Region {
        tensor: pool.id(),
        offset: u64::MAX - (idx.offset() + i0) as u64,
        rows: rows as u64,
        cols: (col + vc) as u64,
    };
    ctx.issue(Instr::new(
        Op::Load { bytes, region },
        ctx.line,
        &[],
        Some(tile.buf),
    ));
    tile
}
