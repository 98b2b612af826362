//! GEMM: `C[M×N] = A[M×K] · B[K×N]` with f32 accumulation (inputs bf16, f16 or f32).
//!
//! DSL implementations of the same operator:
//! - [`gemm()`]: the straightforward tiling: load A and B tiles, multiply, repeat. Each load waits,
//!   and a tile's SRAM is reused only after the matrix unit is done with it, so DMA and compute
//!   serialise;
//! - [`gemm_db()`]: double-buffered: the next K-step's tiles are requested (`load_async`) before the
//!   current ones are multiplied, so DMA overlaps the matrix unit;
//! - [`gemm_pipelined()`]: three K-steps in flight, for DMA latency longer than one step;
//! - [`gemm_persistent()`]: pipelined and persistent: one program per core walks its share of the
//!   output tiles as one stream of K-steps, prefetching the next tile's first steps during the
//!   current tile's last ones and storing each tile while the matrix unit starts the next, so the
//!   pipeline fill and the last store are paid once per core instead of once per tile.

use dsl_core::prelude::*;

/// Naive tiled GEMM: one program per `BM×BN` output tile, K in steps of `BK`.
#[kernel(
    grid = (cdiv(c.rows(), BM), cdiv(c.cols(), BN)),
    tunable(BM = [128, 32, 64, 256, 512], BN = [128, 32, 64, 256, 512], BK = [64, 32, 128, 256, 512])
)]
pub fn gemm<T: Float>(a: &Tensor<T>, b: &Tensor<T>, c: &Tensor<f32>) {
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    for k in (0..a.cols()).step_by(BK) {
        let ta = load::<BM, BK>(a, row, k);
        let tb = load::<BK, BN>(b, k, col);
        mma(&mut acc, &ta, &tb);
    }
    store(c, row, col, &acc);
}

/// Double-buffered tiled GEMM: prefetches K-step `k + BK` while multiplying step `k`.
#[kernel(
    grid = (cdiv(c.rows(), BM), cdiv(c.cols(), BN)),
    tunable(BM = [128, 32, 64, 256, 512], BN = [128, 32, 64, 256, 512], BK = [64, 32, 128, 256, 512])
)]
pub fn gemm_db<T: Float>(a: &Tensor<T>, b: &Tensor<T>, c: &Tensor<f32>) {
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    let mut ta = load_async::<BM, BK>(a, row, 0);
    let mut tb = load_async::<BK, BN>(b, 0, col);
    for k in (BK..a.cols() + BK).step_by(BK) {
        // Past the last step this window lies outside A and B: it moves no bytes.
        let next_a = load_async::<BM, BK>(a, row, k);
        let next_b = load_async::<BK, BN>(b, k, col);
        mma(&mut acc, &ta, &tb);
        ta = next_a;
        tb = next_b;
    }
    store(c, row, col, &acc);
}

/// Origin of K-step `j` of this program's work in [`gemm_persistent()`]: (row of the A window,
/// column of the B window, K offset of both). Program `p` of `P` owns output tiles `p, p + P, ...`
/// of the `BM×BN` tile grid of a `rows×cols` output, each `⌈depth / BK⌉` steps long, tiles
/// numbered as [`grouped_tile`] numbers them (bands of `group` tile columns, row by row inside a
/// band), so the `P` tiles in flight at once cover a compact block of the output and share its
/// A row panels and B column panels in L2. A `group` of 1 numbers the tiles down the columns (at
/// 1024³ on `npu-910b` that spread first reads from HBM over more programs than row-major order:
/// 16549 against 16738 cycles, measured before the bandwidth sharing counted programs by their
/// share of HBM bytes). Past its last tile the origin is `(rows, cols, depth)`: windows outside A
/// and B, which move no bytes, so the prefetch at the end of the stream costs nothing.
#[kernel(helper, helpers(grouped_tile))]
pub fn persistent_step<const BM: usize, const BN: usize, const BK: usize>(
    rows: usize,
    cols: usize,
    depth: usize,
    group: usize,
    j: usize,
) -> (usize, usize, usize) {
    // K = 0 still takes one (empty) step per tile, so the tile is stored as zeros.
    let ksteps = usize::max(cdiv(depth, BK), 1);
    let t = program_id(0) + (j / ksteps) * num_programs(0);
    if t < cdiv(rows, BM) * cdiv(cols, BN) {
        let (r, c) = grouped_tile(cdiv(rows, BM), cdiv(cols, BN), group, t);
        (r * BM, c * BN, (j % ksteps) * BK)
    } else {
        (rows, cols, depth)
    }
}

/// (tile row, tile column) of output tile `t` of a `tiles_m×tiles_n` tile grid numbered in bands
/// of `group` tile columns: band `b` holds columns `b·group ..`, and inside a band the tiles go
/// row by row (the last band may be narrower). A `group` of 1 (or 0) is plain column-major order;
/// with `tiles_m = 1` every group gives the same order. The grouping is the L2 rasterisation of
/// tuned GEMM libraries (CUTLASS's threadblock swizzle, Triton's `GROUP_SIZE_M` with rows and
/// columns exchanged): `P` consecutive tiles cover about `P / group` tile rows and `group` tile
/// columns, so one K-step of them reads `P / group` A panels and `group` B panels instead of the
/// `P` A panels of a column-major wave.
#[kernel(helper)]
pub fn grouped_tile(tiles_m: usize, tiles_n: usize, group: usize, t: usize) -> (usize, usize) {
    let g = usize::max(group, 1);
    let band = t / (g * usize::max(tiles_m, 1));
    // The last band holds the columns left over (at least one while `t` is a tile).
    let width = usize::max(usize::min(g, tiles_n.saturating_sub(band * g)), 1);
    let u = t - band * g * usize::max(tiles_m, 1);
    (u / width, band * g + u % width)
}

/// The band width (in tile columns) [`gemm_persistent()`] and [`crate::gemm_fp8::gemm_fp8`]
/// number their tiles in (see [`grouped_tile`]): the `P = min(tiles, cores)` tiles in flight at
/// once cover `r` tile rows × `g` tile columns, and one K-step of them reads `r·BM + g·BN` rows of
/// A and B; with `r·g = P` that is least at `g = √(P·BM/BN)` (rounded, within `1..=tiles_n`).
/// A pure function of the shapes and the device, so the cycles of a launch are too.
pub fn tile_group(rows: usize, cols: usize, bm: usize, bn: usize, cores: usize) -> usize {
    let (bm, bn) = (bm.max(1), bn.max(1));
    let tiles_n = cols.div_ceil(bn).max(1);
    let p = persistent_programs(rows, cols, bm, bn, cores).max(1);
    let g = ((p * bm) as f64 / bn as f64).sqrt().round() as usize;
    g.clamp(1, tiles_n)
}

/// Persistent pipelined tiled GEMM: `min(tiles, cores)` programs, program `p` of `P` computing the
/// output tiles `p, p + P, p + 2·P, ...` (see [`persistent_step`]) as one stream of K-steps with two steps in flight while a
/// third is multiplied (as [`gemm_pipelined()`]), across tile boundaries: the next tile's first
/// steps load during the current tile's last ones, and each finished tile is stored on DMA-out
/// while the matrix unit starts the next. The pipeline fill and the last store are paid once per
/// core, not once per tile.
///
/// `cores` is the device's core count (see [`persistent_programs`]); `group` the band width of the
/// tile order (see [`grouped_tile`]; [`run_gemm`] passes [`tile_group`]). Besides powers of two the
/// tile sides include 176 (11 cube fragments of 16): it cuts 1024 into 6 tiles, so a 1024×1024
/// output has 8×6 = 48 tiles, two per core on 24 cores, where 128×128 tiles leave a third wave
/// on two thirds of the cores.
#[kernel(
    grid = (persistent_programs(c.rows(), c.cols(), BM, BN, cores),),
    tunable(BM = [128, 64, 176, 256, 512], BN = [128, 64, 176, 256, 512], BK = [128, 64, 256, 512]),
    helpers(persistent_step)
)]
pub fn gemm_persistent<T: Float>(
    a: &Tensor<T>,
    b: &Tensor<T>,
    c: &Tensor<f32>,
    cores: usize,
    group: usize,
) {
    let (rows, cols, depth) = (c.rows(), c.cols(), a.cols());
    let ksteps = usize::max(cdiv(depth, BK), 1);
    let steps = cdiv(
        cdiv(rows, BM) * cdiv(cols, BN) - program_id(0),
        num_programs(0),
    ) * ksteps;
    let (r0, c0, k0) = persistent_step::<BM, BN, BK>(rows, cols, depth, group, 0);
    let mut ta = load_async::<BM, BK>(a, r0, k0);
    let mut tb = load_async::<BK, BN>(b, k0, c0);
    let (r1, c1, k1) = persistent_step::<BM, BN, BK>(rows, cols, depth, group, 1);
    let mut na = load_async::<BM, BK>(a, r1, k1);
    let mut nb = load_async::<BK, BN>(b, k1, c1);
    let mut acc = zeros::<f32, BM, BN>();
    for i in 0..steps {
        let (r, col, k) = persistent_step::<BM, BN, BK>(rows, cols, depth, group, i + 2);
        let next_a = load_async::<BM, BK>(a, r, k);
        let next_b = load_async::<BK, BN>(b, k, col);
        mma(&mut acc, &ta, &tb);
        ta = na;
        tb = nb;
        na = next_a;
        nb = next_b;
        if (i + 1) % ksteps == 0 {
            // The next tile's accumulator is taken before the store is issued, so it does not
            // reuse this one's SRAM: the store drains on DMA-out while the matrix unit goes on.
            let (row, col, _) = persistent_step::<BM, BN, BK>(rows, cols, depth, group, i);
            let done = acc;
            acc = zeros::<f32, BM, BN>();
            store(c, row, col, &done);
        }
    }
}

/// Grid of [`gemm_persistent()`]: one program per core, or one per `BM×BN` output tile of an
/// `rows×cols` output when there are fewer tiles than cores (a `cores` of 0 counts as 1: one
/// program then walks every tile). A pure function of the shapes and the device, so the cycles of
/// a launch are too.
pub const fn persistent_programs(
    rows: usize,
    cols: usize,
    bm: usize,
    bn: usize,
    cores: usize,
) -> usize {
    let tiles = rows.div_ceil(bm) * cols.div_ceil(bn);
    let cores = if cores == 0 { 1 } else { cores };
    if tiles < cores {
        tiles
    } else {
        cores
    }
}

/// Three-stage pipelined tiled GEMM: keeps two K-steps in flight while multiplying a third, so a
/// DMA latency longer than one matrix step is still hidden (a double buffer hides only one step).
#[kernel(
    grid = (cdiv(c.rows(), BM), cdiv(c.cols(), BN)),
    tunable(BM = [128, 32, 64, 256, 512], BN = [128, 32, 64, 256, 512], BK = [64, 32, 128, 256, 512])
)]
pub fn gemm_pipelined<T: Float>(a: &Tensor<T>, b: &Tensor<T>, c: &Tensor<f32>) {
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    let mut ta = load_async::<BM, BK>(a, row, 0);
    let mut tb = load_async::<BK, BN>(b, 0, col);
    let mut na = load_async::<BM, BK>(a, row, BK);
    let mut nb = load_async::<BK, BN>(b, BK, col);
    for k in (2 * BK..a.cols() + 2 * BK).step_by(BK) {
        // Windows past the end of K move no bytes.
        let next_a = load_async::<BM, BK>(a, row, k);
        let next_b = load_async::<BK, BN>(b, k, col);
        mma(&mut acc, &ta, &tb);
        ta = na;
        tb = nb;
        na = next_a;
        nb = next_b;
    }
    store(c, row, col, &acc);
}

/// Which GEMM implementation to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmVariant {
    /// [`gemm()`]: no prefetch.
    Naive,
    /// [`gemm_db()`]: double-buffered.
    DoubleBuffered,
    /// [`gemm_pipelined()`]: three stages in flight.
    Pipelined,
    /// [`gemm_persistent()`]: double-buffered, one program per core looping over its tiles.
    Persistent,
    /// [`crate::hand_tuned::gemm`]: hand-written against accel-sim's lower-level API.
    HandTuned,
}

impl GemmVariant {
    /// The kernel's metadata.
    pub fn meta(self) -> &'static dsl_core::KernelMeta {
        match self {
            GemmVariant::Naive => &gemm::META,
            GemmVariant::DoubleBuffered => &gemm_db::META,
            GemmVariant::Pipelined => &gemm_pipelined::META,
            GemmVariant::Persistent => &gemm_persistent::META,
            GemmVariant::HandTuned => &crate::hand_tuned::gemm::META,
        }
    }
}

/// Input dtype of a GEMM case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmDtype {
    /// f32 inputs.
    F32,
    /// bf16 inputs, f32 accumulation.
    Bf16,
}

/// One GEMM problem: shapes, dtype, implementation, tile choice and data seed.
#[derive(Debug, Clone)]
pub struct GemmCase {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Reduction depth.
    pub k: usize,
    /// Input dtype.
    pub dtype: GemmDtype,
    /// Implementation.
    pub variant: GemmVariant,
    /// Tunable values (`BM`, `BN`, `BK`).
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// The outcome of a GEMM case: the report (with `max_rel_error` set in functional runs) and the
/// output (functional runs only).
#[derive(Debug)]
pub struct GemmRun {
    /// The launch.
    pub launch: Launch,
    /// C, row-major (functional runs).
    pub output: Option<Vec<f32>>,
}

/// Runs a GEMM case: random inputs (uniform in [-1, 1)), output poisoned with NaN, launch, and —
/// in functional runs — comparison with the f64 reference of the rounded inputs.
pub fn run_gemm(launcher: &Launcher, case: &GemmCase) -> Result<GemmRun, dsl_core::SimError> {
    match case.dtype {
        GemmDtype::F32 => run_typed::<f32>(launcher, case),
        GemmDtype::Bf16 => run_typed::<bf16>(launcher, case),
    }
}

fn run_typed<T: Float>(
    launcher: &Launcher,
    case: &GemmCase,
) -> Result<GemmRun, dsl_core::SimError> {
    let (m, n, k) = (case.m, case.n, case.k);
    let mut t = crate::testdata::CaseTensors::new(launcher, case.seed, case.variant.meta().name);
    let a = t.input::<T>(&[m, k], 0.0, 1.0)?;
    let b = t.input::<T>(&[k, n], 0.0, 1.0)?;
    let c = t.output::<f32>(&[m, n]);
    let mut launch = match case.variant {
        GemmVariant::Naive => gemm::launch(launcher, &case.config, &a, &b, &c)?,
        GemmVariant::DoubleBuffered => gemm_db::launch(launcher, &case.config, &a, &b, &c)?,
        GemmVariant::Pipelined => gemm_pipelined::launch(launcher, &case.config, &a, &b, &c)?,
        GemmVariant::Persistent => {
            let cores = launcher.preset.cores as usize;
            // An unknown tile fails in the launch, which says why; the order is then moot.
            let cfg = gemm_persistent::META
                .resolve(&case.config)
                .unwrap_or_default();
            let tile = |name: &str| cfg.get(name).unwrap_or(1).max(1) as usize;
            let group = tile_group(m, n, tile("BM"), tile("BN"), cores);
            gemm_persistent::launch(launcher, &case.config, &a, &b, &c, cores, group)?
        }
        GemmVariant::HandTuned => {
            crate::hand_tuned::gemm::launch(launcher, &case.config, &a, &b, &c)?
        }
    };
    let output = c.to_vec();
    if let (Some(out), Some(av), Some(bv)) = (&output, a.to_vec(), b.to_vec()) {
        let want = reference_of(&av, &bv, m, n, k);
        launch.report.max_rel_error = Some(crate::reference::rel_error(out, &want));
    }
    Ok(GemmRun { launch, output })
}

/// The f64 reference of `a · b`, computed once for the same inputs: the kernel suite checks
/// every GEMM variant on one seeded 1024³ case, whose reference alone is ~1 G f64 multiply-adds.
/// Keyed by the shape and a hash of the inputs' bits; the last two are kept.
fn reference_of(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> std::sync::Arc<Vec<f64>> {
    use std::sync::{Arc, Mutex};
    type Entry = ((usize, usize, usize, u64), Arc<Vec<f64>>);
    static RECENT: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
    let hash = a.iter().chain(b).fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
    });
    let key = (m, n, k, hash);
    let lock = || RECENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, r)) = lock().iter().find(|(k2, _)| *k2 == key) {
        return r.clone();
    }
    let r = Arc::new(crate::reference::gemm(a, b, m, n, k));
    let mut recent = lock();
    recent.push((key, r.clone()));
    if recent.len() > 2 {
        recent.remove(0);
    }
    r
}
