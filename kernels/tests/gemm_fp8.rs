//! The block-scaled FP8 GEMM (`gemm_fp8`, DeepGEMM layout) against the f64 product of its
//! dequantized inputs, on every tile and pipeline depth, with few cores so the tiles are taken in
//! several bands of the grouped order.
//!
//! Tolerance: relative error ≤ 1e-2 (against the reference's RMS as the floor, see
//! `reference::rel_error`): the output is bf16 (relative rounding 2^-9 ≈ 2e-3), the reference
//! multiplies the *dequantized* E4M3 inputs in f64, so the FP8 rounding is the format's and only
//! the f32 accumulation and the bf16 output rounding remain. Inputs are fresh random values
//! quantized per row and 128 columns (A) and per 128×128 block (B); sizes are drawn ragged; the
//! output starts poisoned with NaN, so an element no program wrote fails.

use dsl_core::{Backend, Config, Launcher, SimError};
use kernels::gemm_fp8::{run_gemm_fp8, Fp8GemmCase};
use proptest::prelude::*;

/// h800 (FP8 matrix mode) with `cores` cores.
fn launcher(cores: u64) -> Launcher {
    let mut l = Launcher::for_device("h800").expect("built-in preset");
    l.preset.cores = cores;
    l
}

fn config(bm: i64, bn: i64, st: i64) -> Config {
    Config::new()
        .with("BM", bm)
        .with("BN", bn)
        .with("BK", 128)
        .with("ST", st)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random ragged shapes, every declared tile, both pipeline depths, 1 to 8 cores.
    #[test]
    fn matches_the_dequantized_f64_product(
        m in 1usize..150, n in 1usize..300, k in 1usize..600,
        bm in prop::sample::select(vec![16i64, 32, 64, 128]),
        bn in prop::sample::select(vec![16i64, 32, 64, 128]),
        st in prop::sample::select(vec![2i64, 4]),
        cores in 1u64..9,
        seed in any::<u64>(),
    ) {
        let l = launcher(cores);
        let case = Fp8GemmCase { m, n, k, config: config(bm, bn, st), seed };
        let result = run_gemm_fp8(&l, &case);
        prop_assume!(!matches!(result, Err(SimError::SramOverflow { .. })));
        let run = result.unwrap();
        let out = run.output.as_ref().expect("functional run");
        prop_assert!(out.iter().all(|v| v.is_finite()), "an output element was not written");
        let err = run.launch.report.max_rel_error.expect("functional run");
        prop_assert!(err <= 1e-2, "{m}x{n}x{k} BM={bm} BN={bn} ST={st}: rel error {err}");
        // Cost-only gives the same cycles (the kernel is data-independent).
        let cost = run_gemm_fp8(&l.clone().with_backend(Backend::CostOnly), &case).unwrap();
        prop_assert_eq!(cost.launch.report.cycles, run.launch.report.cycles);
    }
}

/// The deeper pipeline computes the same numbers as the double buffer, bit for bit (same
/// products, same promotion order), and is never slower on a memory-bound decode shape.
#[test]
fn four_stages_match_two_and_hide_more_latency() {
    let l = launcher(132);
    let run = |st| {
        run_gemm_fp8(
            &l,
            &Fp8GemmCase {
                m: 64,
                n: 512,
                k: 2048,
                config: config(64, 32, st),
                seed: 5,
            },
        )
        .unwrap()
    };
    let (two, four) = (run(2), run(4));
    assert_eq!(two.output, four.output);
    assert!(
        four.launch.report.cycles <= two.launch.report.cycles,
        "4 stages {} cycles, 2 stages {}",
        four.launch.report.cycles,
        two.launch.report.cycles
    );
}
