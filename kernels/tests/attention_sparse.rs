//! DSA decode: the indexer against its f64 reference, the top-k kernel against the reference
//! selection of the kernel's own scores (exact: same order, same ties), sparse attention against
//! the f64 reference over that selection, and sparse == dense when `index_topk ≥ ctx`.
//! Tolerance: f32 ≤ 1e-5 relative to the output RMS.

use dsl_core::prelude::*;
use kernels::attention::sparse::{run_dsa_decode, DsaDecodeCase};
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

fn case(ctx: usize, topk: usize, seed: u64) -> DsaDecodeCase {
    DsaDecodeCase {
        heads: 16,
        ctx,
        topk,
        index_heads: 16,
        index_dim: 64,
        head_dim: 128,
        v_head_dim: 128,
        page_size: 16,
        seed,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn dsa_decode_matches_references(ctx in 1usize..600, topk in prop::sample::select(vec![16usize, 64, 256]), seed in any::<u64>()) {
        let run = run_dsa_decode(&launcher(), &case(ctx, topk, seed)).unwrap();
        prop_assert!(run.indexer_error.unwrap() <= 1e-5, "indexer {:?}", run.indexer_error);
        prop_assert_eq!(run.selection_matches, Some(true));
        prop_assert!(run.attention_error.unwrap() <= 1e-5, "attention {:?}", run.attention_error);
    }
}

#[test]
fn cost_grows_with_topk_not_context_except_the_indexer() {
    let cost = launcher().with_backend(Backend::CostOnly);
    let prod = |ctx, topk| {
        let c = DsaDecodeCase {
            heads: 128,
            ctx,
            topk,
            index_heads: 64,
            index_dim: 128,
            head_dim: 576,
            v_head_dim: 512,
            page_size: 64,
            seed: 0,
        };
        run_dsa_decode(&cost, &c).unwrap()
    };
    let start = std::time::Instant::now();
    let a = prod(131072, 2048);
    let host = start.elapsed();
    let b = prod(32768, 2048);
    let c = prod(131072, 512);
    // Sparse attention: same cost at 4x the context, ~4x less at 4x fewer selected tokens.
    assert_eq!(a.attention.cycles, b.attention.cycles);
    assert!(c.attention.cycles * 3 < a.attention.cycles);
    // The indexer grows with the context.
    assert!(a.indexer.cycles > 3 * b.indexer.cycles);
    // Production shape (128 heads, ctx 131072, topk 2048, 512 + 64) runs cost-only in under a second.
    assert!(host.as_secs_f64() < 1.0, "{host:?}");
}
