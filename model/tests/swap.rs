//! Issue #15 item 2: the forward swaps an operator's DSL prototype for its hand-tuned kernel in one
//! line (`Runner::set_implementation`, `day0 forward --impl op=name`), with the same numbers and
//! its own cycles.

use dsl_core::{Backend, Launcher};
use model::config::load_config;
use model::forward::{Precision, Runner};
use std::path::PathBuf;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The tiny Qwen3-Next (gated GQA full-attention layers) with three sequences of different
/// lengths decoding in one step: the hand-tuned decode (each program reading its sequence's
/// length and block-table row) gives each sequence the logits the DSL kernel gives, within f32
/// rounding (the softmax scale is folded into the queries), and books its own cycles.
#[test]
fn the_hand_tuned_gqa_decode_swaps_in_with_the_same_logits() {
    let run = |hand: bool| {
        let mut r = Runner::load_at(
            &testdata("tiny/qwen3_next"),
            Launcher::for_device("npu-910b").unwrap(),
            32,
            Precision::F32,
        )
        .unwrap();
        let name = if hand {
            "paged_decode_hand"
        } else {
            "paged_decode_gqa_batch"
        };
        r.set_implementation("attention_decode_batch", name)
            .unwrap();
        r.serve(3, 3 * 64).unwrap();
        let (a, b) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
        r.forward_batch(&[(0, &[1, 2, 3, 4, 5][..]), (a, &[6, 7][..]), (b, &[8][..])])
            .unwrap();
        let mut rows = Vec::new();
        for step in [[9, 10, 11], [12, 13, 14]] {
            let outs = r
                .forward_batch(&[(b, &step[..1]), (0, &step[1..2]), (a, &step[2..])])
                .unwrap();
            rows.extend(outs.iter().map(|o| o.row(0).to_vec()));
        }
        let split = r.stats().per_op["attn.decode_split"];
        (rows, split)
    };
    let (dsl, dsl_split) = run(false);
    let (hand, hand_split) = run(true);
    for (i, (h, d)) in hand.iter().zip(&dsl).enumerate() {
        let e = rel_l2(h, d);
        assert!(e < 1e-5, "row {i}: {e:.2e}");
    }
    assert_eq!(hand_split.0, dsl_split.0, "the same launches");
    assert_ne!(hand_split.1, dsl_split.1, "another kernel's cycles");
}

/// At Qwen3-Next-80B's real sizes (cost-only), the swapped decode step is faster than the DSL one
/// and everything but the attention decode costs the same; unpinned, the forward runs the faster
/// one (the fastest verified implementation is the default).
#[test]
fn the_swap_speeds_up_a_cost_only_decode_step() {
    let cfg = load_config(&testdata("qwen3_next_config.json")).unwrap();
    let step = |pin: Option<&str>| {
        let l = Launcher::for_device("npu-910b")
            .unwrap()
            .with_backend(Backend::CostOnly);
        let mut r = Runner::cost_only_at(cfg.clone(), l, 8193, Precision::Native).unwrap();
        if let Some(name) = pin {
            r.set_implementation("attention_decode_batch", name)
                .unwrap();
        }
        r.seek(8192).unwrap();
        let before = r.stats().clone();
        r.forward(&[0]).unwrap();
        (r.stats().since(&before), r.implementation_picks().clone())
    };
    let ((dsl, _), (hand, _)) = (
        step(Some("paged_decode_gqa_batch")),
        step(Some("paged_decode_hand")),
    );
    // Unpinned, every launch runs the faster one: the hand-tuned kernel's cycles.
    let (auto, picks) = step(None);
    assert_eq!(auto.per_op, hand.per_op);
    assert!(picks
        .iter()
        .all(|((op, name), n)| *op == "attention_decode_batch"
            && *name == "paged_decode_hand"
            && *n > 0));
    assert!(!picks.is_empty());
    let split = |s: &model::forward::OpStats| s.per_op["attn.decode_split"].1;
    assert!(
        split(&hand) < split(&dsl),
        "{} vs {}",
        split(&hand),
        split(&dsl)
    );
    for (op, (n, c)) in &dsl.per_op {
        if op != "attn.decode_split" {
            assert_eq!(hand.per_op[op], (*n, *c), "{op}");
        }
    }
}

/// A swap the forward cannot make is an error naming the flag.
#[test]
fn an_unknown_swap_names_the_flag() {
    let cfg = load_config(&testdata("qwen3_next_config.json")).unwrap();
    let l = Launcher::for_device("npu-910b")
        .unwrap()
        .with_backend(Backend::CostOnly);
    let mut r = Runner::cost_only_at(cfg, l, 64, Precision::Native).unwrap();
    for (op, name) in [
        ("attention_decode_batch", "gemm_hand"),
        ("rmsnorm", "paged_decode_hand"),
    ] {
        let e = r.set_implementation(op, name).unwrap_err().to_string();
        assert!(e.contains("--impl"), "{e}");
    }
}

/// The deployment estimator runs every card role's forward with the swap (`day0 run --impl`,
/// `day0 forward --batch --impl`): a batched decode step of Qwen3-Next on one card spends less in
/// the GQA decode, for the same HBM bytes.
#[test]
fn the_estimator_prices_a_decode_batch_with_the_swap() {
    use model::plan::estimate::{Estimator, Phase, Routing};
    use model::plan::parallel::Plan;
    let cfg = load_config(&testdata("qwen3_next_config.json")).unwrap();
    let cluster = accel_sim::cluster::ClusterPreset::single_card("npu-910b").unwrap();
    let one = Plan {
        tp: 1,
        dp: 1,
        pp: 1,
        ep: 1,
    };
    let dsl = Estimator::new(cfg.clone(), cluster.clone(), Routing::Uniform)
        .unwrap()
        .with_implementation("attention_decode_batch", "paged_decode_gqa_batch")
        .unwrap();
    let hand = Estimator::new(cfg, cluster, Routing::Uniform)
        .unwrap()
        .with_implementation("attention_decode_batch", "paged_decode_hand")
        .unwrap();
    let (d, h) = (
        dsl.estimate(&one, Phase::Decode, 8, 8192).unwrap(),
        hand.estimate(&one, Phase::Decode, 8, 8192).unwrap(),
    );
    let split =
        |e: &model::plan::estimate::StepEstimate| e.ops["gqa+moe"]["attn.decode_split"].cycles;
    assert!(split(&h) < split(&d), "{} vs {}", split(&h), split(&d));
    assert!(h.step_s < d.step_s);
    // The same bytes move: each sequence reads its own pages (a cost-only run without block
    // tables gives them distinct pool pages, so one sequence's reads never hit another's lines).
    let (hb, db) = (h.hbm_bytes_per_card, d.hbm_bytes_per_card);
    assert!((hb - db).abs() <= 1e-3 * db, "{hb} vs {db}");
    assert!(dsl
        .with_implementation("attention_decode_batch", "nope")
        .is_err());
}

/// The MXFP4 expert GEMM swaps the same way: at the hybrid model's real sizes (cost-only, MXFP4
/// experts), the hand-tuned grouped kernel runs the experts' prefill and decode in fewer cycles
/// than the DSL prototype, nothing else moves, and unpinned the forward runs it.
#[test]
fn the_hand_tuned_mxfp4_expert_gemm_swaps_in_at_hybrid_sizes() {
    let cfg = load_config(&testdata("day0_hybrid_config.json")).unwrap();
    let run = |pin: Option<&str>| {
        let l = Launcher::for_device("npu-910b")
            .unwrap()
            .with_backend(Backend::CostOnly);
        let mut r = Runner::cost_only_at(cfg.clone(), l, 600, Precision::Native).unwrap();
        if let Some(name) = pin {
            r.set_implementation("moe_grouped_linear_mxfp4", name)
                .unwrap();
        }
        let run = r.cost_run(512, 2).unwrap();
        (run.prefill, run.decode, r.implementation_picks().clone())
    };
    let (dp, dd, _) = run(Some("grouped_linear_mxfp4"));
    let (hp, hd, _) = run(Some("grouped_linear_mxfp4_hand"));
    let (ap, ad, picks) = run(None);
    let experts = |s: &model::forward::OpStats| {
        s.per_op
            .iter()
            .filter(|(op, _)| op.starts_with("moe.experts"))
            .map(|(_, (_, c))| *c)
            .sum::<u64>()
    };
    for (what, d, h) in [("prefill", &dp, &hp), ("decode", &dd, &hd)] {
        assert!(
            experts(h) < experts(d),
            "{what}: {} vs {}",
            experts(h),
            experts(d)
        );
        for (op, (n, c)) in &d.per_op {
            if !op.starts_with("moe.experts") {
                assert_eq!(h.per_op[op], (*n, *c), "{what} {op}");
            }
        }
    }
    assert_eq!((ap.per_op, ad.per_op), (hp.per_op, hd.per_op));
    assert!(picks
        .iter()
        .any(|((op, name), n)| *op == "moe_grouped_linear_mxfp4"
            && *name == "grouped_linear_mxfp4_hand"
            && *n > 0));
}
