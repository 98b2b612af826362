//! The rule of the tunable space (ARCHITECTURE.md, "Tunables are tiles"): a tunable is a tile size
//! or a schedule choice, never a problem dimension. Problem dimensions (head dims, spans, page
//! sizes, expert counts, top-k...) are kernel arguments or tensor shapes, and any released value
//! runs.
//!
//! Two checks:
//! - every registered kernel's `META` names only tunables of the tile/schedule vocabulary below
//!   (a new kernel that declares `D = [..]` fails here, and its author must make `D` a run-time
//!   value covered by a tile);
//! - for the kernels whose tiles cover a run-time dimension, any point of the instantiated space
//!   on awkward shapes gives the reference's answer or refuses with an error (a tile too small
//!   for the dimension, or too big for on-chip memory): never a different answer.

use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::attention::prefill::{run_prefill, PrefillCase};
use kernels::gemm::GemmDtype;
use kernels::linear_attention::reference::Decay;
use kernels::linear_attention::runner::{delta_meta, run_delta, DeltaCase, DeltaMode};
use kernels::testdata::Rng;
use proptest::prelude::*;

/// The tile and schedule names kernels may declare, with what each one is. Extend it with a new
/// tile's meaning; never with a problem dimension.
const VOCABULARY: &[(&str, &str)] = &[
    ("BM", "rows of an output tile"),
    ("BN", "columns of an output tile"),
    ("BK", "the reduction (or key) step of a tile loop"),
    (
        "ST",
        "pipeline stages of a K loop: K-steps in flight plus the one multiplied (schedule)",
    ),
    ("BQ", "query rows per program"),
    (
        "BH",
        "heads, hidden columns or rows per program (a whole-row tile covers its row)",
    ),
    ("BR", "rows per program"),
    ("BC", "columns per program"),
    ("BT", "tokens per program"),
    ("BD", "head-dim tile covering the key head dim"),
    ("BDV", "head-dim tile covering the value head dim"),
    (
        "BDK",
        "head-dim tile covering the key head dim of a linear-attention state",
    ),
    ("BW", "row-width tile of a cache append"),
    (
        "SB",
        "partial rows of a split-K reduction (covers the splits)",
    ),
    ("GS", "experts per step when reading a router group"),
    ("GB", "group-score slots (covers n_group)"),
    ("KB", "top-k slots (covers the experts per token)"),
    ("EB", "experts per step of a router row"),
    (
        "HI",
        "index-head rows of the decode indexer (covers index_n_heads)",
    ),
    ("DI", "index-head-dim tile (covers index_head_dim)"),
    ("K", "top-k slots of the DSA selection (covers index_topk)"),
    (
        "STAGES",
        "depth of a hand-tuned kernel's load ring (schedule)",
    ),
    (
        "C",
        "chunk length of a chunked scan, or candidates per top-k merge (schedule)",
    ),
];

#[test]
fn every_registered_kernel_declares_only_tiles_and_schedules() {
    let mut bad = Vec::new();
    for imp in kernels::registry::all() {
        for (name, values) in imp.meta.tunables {
            if !VOCABULARY.iter().any(|(v, _)| v == name) {
                bad.push(format!("{}: tunable `{name}`", imp.meta.name));
            }
            if values.iter().any(|v| *v <= 0) {
                bad.push(format!(
                    "{}: `{name}` has a non-positive size",
                    imp.meta.name
                ));
            }
        }
        assert!(
            !imp.meta.space().is_empty(),
            "{}: empty tunable space",
            imp.meta.name
        );
    }
    assert!(
        bad.is_empty(),
        "tunables outside the tile/schedule vocabulary (make the dimension a run-time value \
         covered by a tile, or add the tile's meaning to VOCABULARY): {bad:#?}"
    );
}

/// An error that says a tile does not cover a dimension or does not fit on chip: the only
/// acceptable outcome of a tile choice other than the right answer.
fn is_tile_refusal(e: &SimError) -> bool {
    let s = e.to_string();
    s.contains("requirement not met")
        || s.contains("covers")
        || s.contains("SRAM")
        || s.contains("capacity")
}

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Flash prefill at awkward head dims under any instantiated tile point.
    #[test]
    fn prefill_tiles_never_change_the_answer(
        head_dim in prop::sample::select(vec![8usize, 12, 20, 40, 72, 100, 192]),
        v_shrink in prop::sample::select(vec![0usize, 4, 8]),
        sq in 1usize..70, extra in 0usize..40, point in any::<prop::sample::Index>(), seed in any::<u64>(),
    ) {
        let meta = &kernels::attention::prefill::flash_prefill::META;
        let space = meta.space();
        let config = space[point.index(space.len())].clone();
        let case = PrefillCase {
            window: 0, sinks: seed % 2 == 0,
            heads: 2, kv_heads: 1, head_dim, v_head_dim: head_dim.saturating_sub(v_shrink).max(1),
            sq, skv: sq + extra, dtype: GemmDtype::F32, config: config.clone(), seed,
        };
        match run_prefill(&launcher(), &case) {
            Ok(run) => {
                let err = run.launch.report.max_rel_error.unwrap();
                prop_assert!(err <= 1e-5, "{config}: {case:?}: {err}");
            }
            Err(e) => prop_assert!(is_tile_refusal(&e), "{config}: {e}"),
        }
    }

    /// The gated delta rule (both forms, both decays) at awkward head dims under any tile point.
    #[test]
    fn delta_rule_tiles_never_change_the_answer(
        dk in prop::sample::select(vec![8usize, 12, 20, 40, 72, 100]),
        dv in prop::sample::select(vec![8usize, 12, 20, 40, 72]),
        chunked in any::<bool>(), kda in any::<bool>(), seq in 1usize..40,
        point in any::<prop::sample::Index>(), seed in any::<u64>(),
    ) {
        let (mode, decay) = (
            if chunked { DeltaMode::Chunked } else { DeltaMode::Recurrent },
            if kda { Decay::PerChannel } else { Decay::Scalar },
        );
        let space = delta_meta(mode, decay).space();
        let config = space[point.index(space.len())].clone();
        let case = DeltaCase {
            decay, mode, seq, k_heads: 1, v_heads: 2, dk, dv, dtype: GemmDtype::F32,
            config: config.clone(), seed,
        };
        match run_delta(&launcher(), &case) {
            Ok(run) => {
                let err = run.launch.report.max_rel_error.unwrap();
                prop_assert!(err <= 1e-4, "{config}: {case:?}: {err}");
            }
            Err(e) => prop_assert!(is_tile_refusal(&e), "{config}: {e}"),
        }
    }

    /// RoPE at awkward head dims and spans, every tile point, both pair layouts, in place or not.
    #[test]
    fn rope_tiles_never_change_the_answer(
        head_dim in prop::sample::select(vec![8usize, 12, 20, 40, 72, 100, 192]),
        span_frac in 1usize..=4, interleaved in any::<bool>(), tokens in 1usize..40,
        point in any::<prop::sample::Index>(), seed in any::<u64>(),
    ) {
        let meta = &kernels::rope::rope::META;
        let space = meta.space();
        let config = space[point.index(space.len())].clone();
        let heads = 3;
        let rot_dim = (head_dim * span_frac / 4) & !1;
        prop_assume!(rot_dim >= 2);
        let rot_offset = head_dim - rot_dim;
        let mut rng = Rng::new(seed);
        let x = rng.vec(tokens * heads * head_dim, 1.0);
        let (cos, sin) = (rng.vec(tokens * rot_dim / 2, 1.0), rng.vec(tokens * rot_dim / 2, 1.0));
        let t = |v: &[f32], c: usize| Tensor::<f32>::from_f32(&[tokens, c], v).unwrap();
        let xt = t(&x, heads * head_dim);
        let out = Tensor::<f32>::poisoned(&[tokens, heads * head_dim]);
        let l = launcher();
        let r = kernels::rope::rope::launch(
            &l, &config, &xt, &t(&cos, rot_dim / 2), &t(&sin, rot_dim / 2), &out,
            head_dim, rot_offset, rot_dim, interleaved,
        );
        prop_assert!(r.is_ok(), "{config}: {:?}", r.err());
        let want = kernels::reference::rope(&x, &cos, &sin, tokens, head_dim, rot_offset, rot_dim, interleaved);
        let err = kernels::reference::rel_error(&out.to_vec().unwrap(), &want);
        prop_assert!(err <= 1e-6, "{config}: head_dim {head_dim} span {rot_offset}+{rot_dim}: {err}");
    }
}
