//! Multi-card numerics (issue #14 item 8): tiny DeepSeek-V3, V3.2, Qwen3-Next and Kimi Linear
//! split over 4 simulated cards — tensor-parallel attention (MLA, gated GQA, Gated DeltaNet, KDA),
//! dense MLP and shared expert, expert-parallel routed experts — give the logits and greedy tokens
//! of one card, with the collectives moving real rows between the cards.
//!
//! Tolerance: the split changes only the order of f32 sums (each all-reduce adds the cards'
//! partial outputs), so logits agree to within 1e-4 of the largest logit; the greedy tokens are
//! exact.

use accel_sim::cluster::ClusterPreset;
use dsl_core::Launcher;
use model::forward::{greedy_steps, run_on_cards, ForwardError, Runner};
use model::plan::parallel::Plan;
use std::path::PathBuf;

const DEVICE: &str = "npu-910b";
const STEPS: usize = 3;
const TOLERANCE: f32 = 1e-4;

fn tiny(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tiny")
        .join(name)
}

/// Distinct prompts of distinct lengths, one per replica.
fn prompts(n: usize) -> Vec<Vec<i64>> {
    (0..n)
        .map(|r| {
            (0..7 - r % 3)
                .map(|i| ((r * 53 + i * 31 + 7) % 256) as i64)
                .collect()
        })
        .collect()
}

/// One card's logits for each step of `prompt` then `STEPS` greedy tokens.
fn one_card(model: &str, prompt: &[i64]) -> (Vec<Vec<f32>>, Vec<i64>) {
    let launcher = Launcher::for_device(DEVICE).unwrap();
    let mut r = Runner::load(&tiny(model), launcher, prompt.len() + STEPS).unwrap();
    let (outputs, tokens) = greedy_steps(&mut r, prompt, STEPS).unwrap();
    (outputs.into_iter().map(|o| o.logits).collect(), tokens)
}

fn check_plan(model: &str, spec: &str) {
    let cluster = ClusterPreset::load("h200-node").unwrap();
    let plan = Plan::parse(spec, Some(4), "--plan").unwrap();
    let prompts = prompts(plan.dp);
    let runs = run_on_cards(&tiny(model), DEVICE, &cluster, &plan, &prompts, STEPS)
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(runs.len(), 4);
    for (d, prompt) in prompts.iter().enumerate() {
        let (want, want_tokens) = one_card(model, prompt);
        let cards: Vec<_> = runs.iter().filter(|r| r.replica == d).collect();
        assert_eq!(cards.len(), plan.tp, "{spec}: replica {d}");
        for run in &cards {
            assert_eq!(run.tokens, want_tokens, "{spec}: card {} tokens", run.card);
            assert_eq!(run.steps.len(), want.len());
            for (s, (got, want)) in run.steps.iter().zip(&want).enumerate() {
                assert_eq!(got.logits.len(), want.len());
                let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
                let worst = got
                    .logits
                    .iter()
                    .zip(want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    worst <= TOLERANCE * scale,
                    "{spec}: card {} step {s}: max |Δlogit| {worst:e} > {TOLERANCE:e} · {scale}",
                    run.card
                );
                // The replica's cards hold the same all-reduced rows, so the same bits.
                assert_eq!(got.logits, cards[0].steps[s].logits, "{spec}: step {s}");
            }
            // The collectives the plan implies ran, and cost time.
            let booked = |op: &str| run.stats.per_op.get(op).copied().unwrap_or((0, 0));
            if plan.tp > 1 {
                for op in ["attention.all_reduce", "ffn.all_reduce"] {
                    let (n, cycles) = booked(op);
                    assert!(
                        n > 0 && cycles > 0,
                        "{spec}: card {}: {op} {n} {cycles}",
                        run.card
                    );
                }
            }
            if plan.ep > 1 {
                for op in ["moe.ep_dispatch", "moe.ep_combine"] {
                    let (n, cycles) = booked(op);
                    assert!(
                        n > 0 && cycles > 0,
                        "{spec}: card {}: {op} {n} {cycles}",
                        run.card
                    );
                }
            }
        }
    }
}

#[test]
fn four_cards_tp2_ep2_give_the_logits_of_one_card() {
    check_plan("deepseek_v3", "tp=2,dp=2,ep=2");
}

#[test]
fn other_four_card_splits_give_the_logits_of_one_card() {
    // Pure tensor parallelism with experts over pairs, and attention data parallelism with every
    // card an expert rank.
    check_plan("deepseek_v3", "tp=4,ep=2");
    check_plan("deepseek_v3", "tp=1,dp=4,ep=4");
}

#[test]
fn four_cards_of_a_dsa_model_give_the_logits_of_one_card() {
    // DeepSeek-V3.2: sparse MLA heads split, the indexer whole on every card.
    check_plan("deepseek_v32", "tp=2,dp=2,ep=2");
}

#[test]
fn four_cards_of_hybrid_linear_attention_models_give_the_logits_of_one_card() {
    // Qwen3-Next: gated GQA and Gated DeltaNet split by heads (key/value heads and their
    // convolution channels, gates and state with them).
    check_plan("qwen3_next", "tp=2,dp=2,ep=2");
    // Kimi Linear: KDA heads and MLA heads split.
    check_plan("kimi_linear", "tp=2,dp=2,ep=2");
}

#[test]
fn four_cards_of_gqa_models_give_the_logits_of_one_card() {
    // Qwen3-MoE (q/k norms, a dense first layer) and Mixtral: GQA heads split, experts over pairs.
    check_plan("qwen3_moe", "tp=2,dp=2,ep=2");
    check_plan("mixtral", "tp=2,dp=2,ep=2");
    // Llama: dense, pure tensor parallelism; Mistral: the same over a sliding window.
    check_plan("llama", "tp=4,ep=1");
    check_plan("mistral", "tp=2,dp=2,ep=1");
    // GLM-4.5 and Qwen2: the q/k/v biases split with their heads.
    check_plan("glm4_moe", "tp=2,dp=2,ep=2");
    check_plan("qwen2", "tp=2,dp=2,ep=1");
    // gpt-oss: sinks split with their heads, the o_proj bias added once, expert biases with
    // their experts.
    check_plan("gpt_oss", "tp=2,dp=2,ep=4");
    // Qwen2-MoE: biases and the gated shared expert split by tensor parallelism.
    check_plan("qwen2_moe", "tp=2,dp=2,ep=2");
}

#[test]
fn four_cards_of_deepseek_v2_give_the_logits_of_one_card() {
    // MLA heads split; the group-limited softmax router runs on every card over all experts.
    check_plan("deepseek_v2", "tp=2,dp=2,ep=2");
}

#[test]
fn bad_multi_card_runs_are_errors_not_hangs() {
    let cluster = ClusterPreset::load("h200-node").unwrap();
    let run = |dir: &str, spec: &str, n: usize| -> ForwardError {
        let plan = Plan::parse(spec, None, "--plan").unwrap();
        run_on_cards(&tiny(dir), DEVICE, &cluster, &plan, &prompts(n), 1).unwrap_err()
    };
    // tp=3 does not divide the 4 heads.
    let e = run("deepseek_v3", "tp=3", 1).to_string();
    assert!(e.contains("--plan tp"), "{e}");
    // More replicas than prompts.
    let e = run("deepseek_v3", "tp=2,dp=2,ep=2", 1).to_string();
    assert!(e.contains("prompts"), "{e}");
    // tp=4 does not divide Qwen3-Next's 2 linear-attention key heads.
    let e = run("qwen3_next", "tp=4", 1).to_string();
    assert!(
        e.contains("--plan tp") && e.contains("linear-attention"),
        "{e}"
    );
}
