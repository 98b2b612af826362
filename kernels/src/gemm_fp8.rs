//! FP8 block-scaled GEMM, DeepGEMM style: `C[M×N] = (A·sa)[M×K] · ((B·sb)[N×K])ᵀ`, bf16 out.
//!
//! The layout and scaling are DeepSeek-V3's (technical report, arXiv:2412.19437, section 3.3.2
//! "fine-grained quantization"; `deep_gemm.gemm_fp8_fp8_bf16_nt`): A holds E4M3 activations
//! with one f32 scale per row and 128 columns (`sa [M, ⌈K/128⌉]`), B holds E4M3 weights `[N, K]`
//! ("NT": both operands K-major) with one f32 scale per 128×128 block (`sb [⌈N/128⌉, ⌈K/128⌉]`).
//! Each 128-deep partial product of the raw codes runs on the matrix unit at its FP8 rate and
//! is promoted to the f32 accumulator with both scales on the vector unit, as DeepGEMM's
//! two-level accumulation does on CUDA cores.

use crate::gemm::{grouped_tile, tile_group};
use crate::testdata::Rng;
use dsl_core::prelude::*;
use dsl_core::{Backend, SimError};

/// One `BM×BN` output tile `(A·sa)[row..] · ((B·sb)[col..])ᵀ` over the whole K, in 128-wide scale
/// blocks, double-buffered: the raw E4M3 codes multiply on the matrix unit at the FP8 rate and each
/// 128-deep partial product is promoted into the f32 accumulator with the row's and the block's
/// scales. `BN` must divide 128 so that the B tile lies in one scale block.
#[kernel(helper)]
pub fn fp8_matmul_bt_tile<const BM: usize, const BN: usize, const BK: usize>(
    a: &Tensor<fp8e4m3>,
    sa: &Tensor<f32>,
    b: &Tensor<fp8e4m3>,
    sb: &Tensor<f32>,
    row: usize,
    col: usize,
) -> Tile<f32, BM, BN> {
    let mut acc = zeros::<f32, BM, BN>();
    let mut ta = load_async::<BM, BK>(a, row, 0);
    let mut tb = load_async::<BN, BK>(b, col, 0);
    let mut tsa = load_async::<BM, 1>(sa, row, 0);
    let mut tsb = load_async::<1, 1>(sb, col / 128, 0);
    let mut part = zeros::<f32, BM, BN>();
    for k in (BK..a.cols() + BK).step_by(BK) {
        // Past the last step these windows lie outside the tensors: they move no bytes.
        let next_a = load_async::<BM, BK>(a, row, k);
        let next_b = load_async::<BN, BK>(b, col, k);
        let next_sa = load_async::<BM, 1>(sa, row, k / 128);
        let next_sb = load_async::<1, 1>(sb, col / 128, k / 128);
        mma_bt(&mut part, &ta, &tb);
        // The next step's partial sum is zeroed before this one is promoted, so the vector unit
        // clears it while the matrix unit waits for data, and the next product starts as soon as
        // its tiles land instead of after the promotion (Hopper's wgmma overwrites its
        // accumulator; the promotion then overlaps the next wgmma, as in DeepGEMM).
        let done = part;
        part = zeros::<f32, BM, BN>();
        // Promotion: the partial sum of raw codes times the row's and the block's scale.
        let s = mul(&tsa, &broadcast::<f32, BM, 1>(&tsb));
        acc = add(&acc, &mul_col(&done, &s));
        ta = next_a;
        tb = next_b;
        tsa = next_sa;
        tsb = next_sb;
    }
    acc
}

/// [`fp8_matmul_bt_tile`] with a four-stage pipeline: three K-steps in flight while a fourth is
/// multiplied, as DeepGEMM keeps several TMA stages in flight (its memory-bound decode shapes
/// need more bytes in flight per SM than one step: a program's bandwidth is about the bytes it
/// has in flight over the memory latency). Same numbers as the double-buffered helper; more SRAM
/// (four A, B and scale tiles live).
#[kernel(helper)]
pub fn fp8_matmul_bt_tile_deep<const BM: usize, const BN: usize, const BK: usize>(
    a: &Tensor<fp8e4m3>,
    sa: &Tensor<f32>,
    b: &Tensor<fp8e4m3>,
    sb: &Tensor<f32>,
    row: usize,
    col: usize,
) -> Tile<f32, BM, BN> {
    let mut acc = zeros::<f32, BM, BN>();
    let mut ta = load_async::<BM, BK>(a, row, 0);
    let mut tb = load_async::<BN, BK>(b, col, 0);
    let mut tsa = load_async::<BM, 1>(sa, row, 0);
    let mut tsb = load_async::<1, 1>(sb, col / 128, 0);
    let mut ta1 = load_async::<BM, BK>(a, row, BK);
    let mut tb1 = load_async::<BN, BK>(b, col, BK);
    let mut tsa1 = load_async::<BM, 1>(sa, row, BK / 128);
    let mut tsb1 = load_async::<1, 1>(sb, col / 128, BK / 128);
    let mut ta2 = load_async::<BM, BK>(a, row, 2 * BK);
    let mut tb2 = load_async::<BN, BK>(b, col, 2 * BK);
    let mut tsa2 = load_async::<BM, 1>(sa, row, 2 * BK / 128);
    let mut tsb2 = load_async::<1, 1>(sb, col / 128, 2 * BK / 128);
    let mut part = zeros::<f32, BM, BN>();
    for k in (3 * BK..a.cols() + 3 * BK).step_by(BK) {
        // Past the last step these windows lie outside the tensors: they move no bytes.
        let next_a = load_async::<BM, BK>(a, row, k);
        let next_b = load_async::<BN, BK>(b, col, k);
        let next_sa = load_async::<BM, 1>(sa, row, k / 128);
        let next_sb = load_async::<1, 1>(sb, col / 128, k / 128);
        mma_bt(&mut part, &ta, &tb);
        // As in the double-buffered helper: the next partial sum is zeroed before this one's
        // promotion.
        let done = part;
        part = zeros::<f32, BM, BN>();
        let s = mul(&tsa, &broadcast::<f32, BM, 1>(&tsb));
        acc = add(&acc, &mul_col(&done, &s));
        ta = ta1;
        tb = tb1;
        tsa = tsa1;
        tsb = tsb1;
        ta1 = ta2;
        tb1 = tb2;
        tsa1 = tsa2;
        tsb1 = tsb2;
        ta2 = next_a;
        tb2 = next_b;
        tsa2 = next_sa;
        tsb2 = next_sb;
    }
    acc
}

/// One program per `BM×BN` output tile, K in 128-wide scale blocks, `ST` pipeline stages (2:
/// [`fp8_matmul_bt_tile`], double-buffered; 4: [`fp8_matmul_bt_tile_deep`]). `BN` divides 128 so
/// that every B tile lies in one scale block; `BN = 16` lets a decode shape's few weight rows
/// fill every core (N = 2112 gives 132 tiles). The grid is one-dimensional and tiles are taken in
/// bands of `group` tile columns ([`crate::gemm::grouped_tile`]; [`run_gemm_fp8`] passes
/// [`crate::gemm::tile_group`]), so the programs in flight at once share their A and B panels
/// in L2.
#[kernel(
    grid = (cdiv(c.rows(), BM) * cdiv(c.cols(), BN),),
    tunable(BM = [128, 64, 32, 16], BN = [128, 64, 32, 16], BK = [128], ST = [2, 4]),
    helpers(fp8_matmul_bt_tile, fp8_matmul_bt_tile_deep, grouped_tile)
)]
pub fn gemm_fp8(
    a: &Tensor<fp8e4m3>,
    sa: &Tensor<f32>,
    b: &Tensor<fp8e4m3>,
    sb: &Tensor<f32>,
    c: &Tensor<bf16>,
    group: usize,
) {
    let (tr, tc) = grouped_tile(cdiv(c.rows(), BM), cdiv(c.cols(), BN), group, program_id(0));
    let (row, col) = (tr * BM, tc * BN);
    let acc = if ST >= 4 {
        fp8_matmul_bt_tile_deep::<BM, BN, BK>(a, sa, b, sb, row, col)
    } else {
        fp8_matmul_bt_tile::<BM, BN, BK>(a, sa, b, sb, row, col)
    };
    store(c, row, col, &cast::<bf16>(&acc));
}

/// One FP8 GEMM problem.
#[derive(Debug, Clone)]
pub struct Fp8GemmCase {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of C (rows of B).
    pub n: usize,
    /// Reduction depth.
    pub k: usize,
    /// Tunable values (`BM`, `BN`, `BK`, `ST`).
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// Per-row, per-128-column quantization of activations (`scale = amax / 448`, 1 for an all-zero
/// group so it stays finite): E4M3 codes, scales `[m, ⌈k/128⌉]`, and the dequantized values.
fn quantize_rows(x: &[f32], m: usize, k: usize) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    use accel_sim::formats::fp8::{decode_e4m3, encode_e4m3};
    use accel_sim::formats::Overflow;
    let kb = k.div_ceil(128);
    let (mut codes, mut scales, mut values) =
        (vec![0u8; m * k], vec![1f32; m * kb], vec![0f32; m * k]);
    for i in 0..m {
        for j in 0..kb {
            let span = i * k + j * 128..i * k + ((j + 1) * 128).min(k);
            let amax = x[span.clone()].iter().fold(0f32, |a, v| a.max(v.abs()));
            let s = if amax > 0.0 { amax / 448.0 } else { 1.0 };
            scales[i * kb + j] = s;
            for p in span {
                codes[p] = encode_e4m3(x[p] / s, Overflow::Saturate);
                values[p] = decode_e4m3(codes[p]) * s;
            }
        }
    }
    (codes, scales, values)
}

/// Runs an FP8 GEMM case: random inputs quantized DeepSeek-style, output poisoned, launch, and
/// in functional runs the comparison with the f64 product of the dequantized inputs (the FP8
/// rounding is the format's, not the kernel's; the kernel must match the dequantized product to
/// bf16 output precision).
pub fn run_gemm_fp8(
    launcher: &Launcher,
    case: &Fp8GemmCase,
) -> Result<crate::gemm::GemmRun, SimError> {
    let (m, n, k) = (case.m, case.n, case.k);
    let name = gemm_fp8::META.name;
    let fail = |message: String| SimError::Launch {
        kernel: name.to_string(),
        message,
    };
    if m == 0 || n == 0 || k == 0 {
        return Err(fail(format!(
            "m, n and k must be positive (got {m}x{n}x{k})"
        )));
    }
    let (kb, nb) = (k.div_ceil(128), n.div_ceil(128));
    // An unknown tile fails in the launch, which says why; the order is then moot.
    let cfg = gemm_fp8::META.resolve(&case.config).unwrap_or_default();
    let tile = |name: &str| cfg.get(name).unwrap_or(1).max(1) as usize;
    let group = tile_group(m, n, tile("BM"), tile("BN"), launcher.preset.cores as usize);
    let c = if launcher.backend == Backend::Functional {
        Tensor::<bf16>::poisoned(&[m, n])
    } else {
        Tensor::shape_only(&[m, n])
    };
    if launcher.backend != Backend::Functional {
        let launch = gemm_fp8::launch(
            launcher,
            &case.config,
            &Tensor::shape_only(&[m, k]),
            &Tensor::shape_only(&[m, kb]),
            &Tensor::shape_only(&[n, k]),
            &Tensor::shape_only(&[nb, kb]),
            &c,
            group,
        )?;
        return Ok(crate::gemm::GemmRun {
            launch,
            output: None,
        });
    }
    use accel_sim::formats::packing::{fp8_block_dequant, fp8_block_quant};
    let mut rng = Rng::new(case.seed);
    let (a_codes, a_scales, a_values) = quantize_rows(&rng.vec(m * k, 1.0), m, k);
    let qb = fp8_block_quant(name, &rng.vec(n * k, 1.0), &[n, k], 128)
        .map_err(|e| fail(e.to_string()))?;
    let b_values = fp8_block_dequant(
        name,
        &qb.weight,
        &[n, k],
        &qb.scale_inv,
        &qb.scale_shape,
        128,
    )
    .map_err(|e| fail(e.to_string()))?;
    let a = Tensor::from_e4m3_codes(&[m, k], &a_codes).map_err(fail)?;
    let sa = Tensor::from_f32(&[m, kb], &a_scales).map_err(fail)?;
    let b = Tensor::from_e4m3_codes(&[n, k], &qb.weight).map_err(fail)?;
    let sb = Tensor::from_f32(&[nb, kb], &qb.scale_inv).map_err(fail)?;
    let mut launch = gemm_fp8::launch(launcher, &case.config, &a, &sa, &b, &sb, &c, group)?;
    let output = c.to_vec();
    if let Some(out) = &output {
        let bt = crate::reference::transpose(&b_values, n, k);
        let want = crate::reference::gemm(&a_values, &bt, m, n, k);
        launch.report.max_rel_error = Some(crate::reference::rel_error(out, &want));
    }
    Ok(crate::gemm::GemmRun { launch, output })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ragged_fp8_gemm_matches_the_dequantized_product() {
        let l = Launcher::for_device("h800").unwrap();
        for (m, n, k, bm, bn) in [(37, 200, 300, 32, 64), (64, 128, 256, 64, 128)] {
            let case = Fp8GemmCase {
                m,
                n,
                k,
                config: Config::new().with("BM", bm).with("BN", bn).with("BK", 128),
                seed: 3,
            };
            let run = run_gemm_fp8(&l, &case).unwrap();
            let err = run.launch.report.max_rel_error.unwrap();
            assert!(err < 1e-2, "{m}x{n}x{k}: {err}");
            let cost = run_gemm_fp8(&l.clone().with_backend(Backend::CostOnly), &case).unwrap();
            assert_eq!(cost.launch.report.cycles, run.launch.report.cycles);
        }
    }
}
