//! The hand-tuned MXFP4 expert GEMM (`expert_gemm_mxfp4_hand`, accel-sim's manual API) against
//! the f64 product of the dequantized weights, and its cycles beside the DSL prototype
//! (`expert_gemm_mxfp4`) on the same inputs and tiles.
//!
//! Tolerance: relative error ≤ 1e-5 (the reference's RMS as the floor, see
//! `reference::rel_error`), as the DSL kernel's test: MXFP4 values are exact in bf16 and the
//! activations are bf16, so only f32 accumulation error remains. Inputs are fresh random values
//! quantized with the OCP rule; the output starts poisoned with NaN.

use dsl_core::{Backend, Config, Launcher, Report};
use kernels::hand_tuned::expert_gemm_mxfp4 as hand;
use proptest::prelude::*;

fn run(
    launcher: &Launcher,
    hand_tuned: bool,
    shape: [usize; 4],
    config: &Config,
    seed: u64,
) -> Report {
    hand::run_case(launcher, hand_tuned, shape, config, seed).unwrap()
}

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").expect("built-in preset")
}

fn tiles(bm: i64, bn: i64, bk: i64) -> Config {
    Config::new().with("BM", bm).with("BN", bn).with("BK", bk)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Random ragged shapes (K a multiple of the 32-value block), tiles and ring depths.
    #[test]
    fn matches_f64_reference(
        experts in 1usize..4, tokens in 1usize..40, kb in 1usize..12, n in 1usize..300,
        bm in prop::sample::select(vec![16i64, 32]), bn in prop::sample::select(vec![64i64, 128]),
        bk in prop::sample::select(vec![64i64, 128]), stages in prop::sample::select(vec![2i64, 3, 4]),
        seed in any::<u64>(),
    ) {
        let config = tiles(bm, bn, bk).with("STAGES", stages);
        let r = run(&launcher(), true, [experts, tokens, n, kb * 32], &config, seed);
        let err = r.max_rel_error.unwrap();
        prop_assert!(err <= 1e-5, "{experts}x{tokens}x{n}x{} {config}: {err}", kb * 32);
        prop_assert!(r.cycles >= r.roofline_cycles);
    }
}

#[test]
fn cost_only_cycles_equal_functional_cycles() {
    let config = tiles(16, 64, 128).with("STAGES", 3);
    let shape = [2, 20, 150, 384];
    let f = run(&launcher(), true, shape, &config, 3);
    let o = run(
        &launcher().with_backend(Backend::CostOnly),
        true,
        shape,
        &config,
        3,
    );
    assert_eq!((f.cycles, f.hbm_bytes), (o.cycles, o.hbm_bytes));
}

/// On npu-910b, at the same tiles, the hand-tuned kernel beats its DSL prototype at a decode shape
/// (16 tokens per expert) and at a prefill shape (512 tokens per expert): its vector unit
/// dequantizes the next K-step while the matrix unit multiplies this one.
#[test]
fn beats_the_dsl_prototype_at_decode_and_prefill_shapes() {
    let l = launcher().with_backend(Backend::CostOnly);
    for (shape, bm) in [([8, 16, 2048, 7168], 16), ([4, 512, 2048, 7168], 128)] {
        let config = tiles(bm, 128, 128);
        let dsl = run(&l, false, shape, &config, 1).cycles;
        let hand = run(&l, true, shape, &config.clone().with("STAGES", 3), 1).cycles;
        eprintln!("{shape:?} {config}: hand-tuned {hand} cycles, DSL {dsl}");
        assert!(hand < dsl, "{shape:?}: hand-tuned {hand} cycles, DSL {dsl}");
    }
}
