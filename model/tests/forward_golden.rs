//! The numeric forward pass against transformers: tiny random-weight checkpoints written by
//! `save_pretrained` (tests/reference/gen_models.py, semantics in tests/reference/MODELS.md) with
//! the logits, per-layer hidden states and greedy continuation transformers 5.24 produced in f32.
//!
//! Tolerances: prefill logits and every hidden state ≤ 1e-4 max relative error (the reference's
//! RMS as the floor for near-zero entries); the 16 greedy tokens exactly; the logits of every
//! decode step (which exercise the caches and the single-token kernels) ≤ 1e-4.

use dsl_core::Launcher;
use model::forward::validate::validate;
use model::forward::Runner;
use model::weights::read_all_f32;
use std::path::{Path, PathBuf};

const TOL: f64 = 1e-4;

fn tiny(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tiny")
        .join(name)
}

type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

fn golden(name: &str) -> Tensors {
    read_all_f32(&tiny(name).join("golden.safetensors")).unwrap()
}

fn tensor<'a>(g: &'a Tensors, name: &str) -> &'a [f32] {
    &g.iter().find(|(n, _, _)| n == name).unwrap().2
}

fn ids(g: &Tensors, name: &str) -> Vec<i64> {
    tensor(g, name).iter().map(|v| *v as i64).collect()
}

fn runner(name: &str, capacity: usize) -> Runner {
    let launcher = Launcher::for_device("npu-910b").unwrap();
    Runner::load(&tiny(name), launcher, capacity).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Prefill logits and every layer's hidden state, then 16 greedy tokens with their logits.
fn check_model(name: &str) {
    let g = golden(name);
    let prompt = ids(&g, "input_ids");
    let want_tokens = ids(&g, "generated");

    let mut r = runner(name, prompt.len());
    let v = validate(&mut r, &prompt, &g, TOL).unwrap();
    for d in &v.diffs {
        assert!(
            !d.flagged,
            "{name}: {} max rel error {:.3e} (cosine {:.9}, worst position {})",
            d.name, d.max_rel, d.cosine, d.worst_position
        );
    }
    assert_eq!(
        v.diffs.len(),
        r.config().num_layers() + 2,
        "{name}: every layer and the logits compared"
    );

    let mut r = runner(name, prompt.len() + want_tokens.len());
    let gen = r.generate(&prompt, want_tokens.len()).unwrap();
    let got: Vec<i64> = gen.tokens.iter().map(|t| *t as i64).collect();
    assert_eq!(got, want_tokens, "{name}: greedy tokens");
    let decode = tensor(&g, "decode_logits");
    let vocab = r.config().vocab_size;
    for (j, row) in gen.step_logits.iter().enumerate() {
        let d = model::forward::validate::compare(
            &format!("decode step {j}"),
            row,
            &decode[j * vocab..(j + 1) * vocab],
            vocab,
            TOL,
        );
        assert!(
            !d.flagged,
            "{name}: {} max rel error {:.3e}",
            d.name, d.max_rel
        );
    }
    assert!(gen.prefill.total_cycles() > 0 && gen.decode.total_cycles() > 0);
}

#[test]
fn deepseek_v3_matches_transformers() {
    check_model("deepseek_v3");
}

#[test]
fn deepseek_v32_sparse_matches_transformers() {
    check_model("deepseek_v32");
}

#[test]
fn qwen3_next_matches_transformers() {
    check_model("qwen3_next");
}

/// Other dims and options than the models the code was developed against (q_proj instead of the
/// q_lora path, half-split rope slice, no rope scaling, 3 experts per token, no renormalisation).
#[test]
fn unseen_deepseek_v3_checkpoint_matches_transformers() {
    check_model("deepseek_v3_unseen");
}

/// Running the prompt in two chunks (prefill, then the rest against the cache) gives the same
/// logits as one pass.
#[test]
fn chunked_prompt_equals_one_pass() {
    for name in ["deepseek_v3", "qwen3_next", "deepseek_v32"] {
        let g = golden(name);
        let prompt = ids(&g, "input_ids");
        let mut one = runner(name, prompt.len());
        let full = one.forward(&prompt).unwrap();
        let mut two = runner(name, prompt.len());
        let split = 11;
        let a = two.forward(&prompt[..split]).unwrap();
        let b = two.forward(&prompt[split..]).unwrap();
        let mut joined = a.logits.clone();
        joined.extend_from_slice(&b.logits);
        let d =
            model::forward::validate::compare("chunked", &joined, &full.logits, full.vocab, 1e-5);
        assert!(
            !d.flagged,
            "{name}: chunked prefill differs by {:.3e}",
            d.max_rel
        );
    }
}

/// User errors are values: a token outside the vocabulary, more tokens than the caches hold.
#[test]
fn bad_tokens_and_capacity_are_errors() {
    let mut r = runner("deepseek_v3", 4);
    let e = r.forward(&[1, 2, 99999]).unwrap_err().to_string();
    assert!(e.contains("99999") && e.contains("position 2"), "{e}");
    let e = r.forward(&[1, 2, 3, 4, 5]).unwrap_err().to_string();
    assert!(e.contains("5") && e.contains("capacity"), "{e}");
}
