//! GEMM: `C[M×N] = A[M×K] · B[K×N]` with f32 accumulation (inputs bf16, f16 or f32).
//!
//! Two DSL implementations of the same operator:
//! - [`gemm()`]: the straightforward tiling: load A and B tiles, multiply, repeat. Each load waits,
//!   and a tile's SRAM is reused only after the matrix unit is done with it, so DMA and compute
//!   serialise;
//! - [`gemm_db()`]: double-buffered: the next K-step's tiles are requested (`load_async`) before the
//!   current ones are multiplied, so DMA overlaps the matrix unit.

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
}

impl GemmVariant {
    /// The kernel's metadata.
    pub fn meta(self) -> &'static dsl_core::KernelMeta {
        match self {
            GemmVariant::Naive => &gemm::META,
            GemmVariant::DoubleBuffered => &gemm_db::META,
            GemmVariant::Pipelined => &gemm_pipelined::META,
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
    };
    let output = c.to_vec();
    if let (Some(out), Some(av), Some(bv)) = (&output, a.to_vec(), b.to_vec()) {
        let want = crate::reference::gemm(&av, &bv, m, n, k);
        launch.report.max_rel_error = Some(crate::reference::rel_error(out, &want));
    }
    Ok(GemmRun { launch, output })
}
