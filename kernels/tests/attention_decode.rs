//! Paged split-KV decode (and MLA's absorbed decode over the latent cache) against the f64
//! references: paged == contiguous attention over the gathered pages.
//!
//! Tolerances: f32 ≤ 1e-5 relative (to the output RMS); bf16 ≤ 1e-2 (probabilities enter the
//! matrix unit in bf16).

use dsl_core::prelude::*;
use kernels::attention::decode::{run_decode, DecodeCase};
use kernels::gemm::GemmDtype;
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20))]

    #[test]
    fn paged_decode_matches_reference(
        kv_heads in 1usize..3, group in prop::sample::select(vec![1usize, 3, 8]),
        head_dim in prop::sample::select(vec![64usize, 128]),
        ctx in 1usize..400, page_size in prop::sample::select(vec![16usize, 64]),
        splits in 1usize..5, bf16 in any::<bool>(), seed in any::<u64>(),
    ) {
        let case = DecodeCase {
            heads: kv_heads * group, kv_heads, head_dim, v_head_dim: head_dim, shared_kv: false,
            ctx, page_size, splits, dtype: if bf16 { GemmDtype::Bf16 } else { GemmDtype::F32 }, seed,
        };
        let run = run_decode(&launcher(), &case).unwrap();
        let err = run.report.max_rel_error.unwrap();
        prop_assert!(err <= if bf16 { 1e-2 } else { 1e-5 }, "{case:?}: {err}");
    }
}

#[test]
fn mla_absorbed_decode_over_the_latent_cache() {
    for splits in [1, 3] {
        let case = DecodeCase {
            heads: 16,
            kv_heads: 1,
            head_dim: 576,
            v_head_dim: 512,
            shared_kv: true,
            ctx: 150,
            page_size: 64,
            splits,
            dtype: GemmDtype::F32,
            seed: 2,
        };
        let err = run_decode(&launcher(), &case)
            .unwrap()
            .report
            .max_rel_error
            .unwrap();
        assert!(err <= 1e-5, "splits {splits}: {err}");
    }
}

#[test]
fn splits_do_not_change_the_result_beyond_rounding_and_cost_only_matches() {
    let base = DecodeCase {
        heads: 8,
        kv_heads: 2,
        head_dim: 128,
        v_head_dim: 128,
        shared_kv: false,
        ctx: 1000,
        page_size: 64,
        splits: 1,
        dtype: GemmDtype::F32,
        seed: 9,
    };
    let one = run_decode(&launcher(), &base).unwrap();
    let four = run_decode(
        &launcher(),
        &DecodeCase {
            splits: 4,
            ..base.clone()
        },
    )
    .unwrap();
    let diff = one
        .output
        .unwrap()
        .iter()
        .zip(four.output.unwrap())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(diff <= 1e-5, "{diff}");
    let cost = run_decode(
        &launcher().with_backend(Backend::CostOnly),
        &DecodeCase { splits: 4, ..base },
    )
    .unwrap();
    assert_eq!(cost.report.cycles, four.report.cycles);
    assert_eq!(
        four.report.bound, "memory",
        "decode attention is memory-bound on npu-910b"
    );
}
