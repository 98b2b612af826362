//! The numeric forward pass against transformers: tiny random-weight checkpoints written by
//! `save_pretrained` (tests/reference/gen_models.py, semantics in tests/reference/MODELS.md) with
//! the logits, per-layer hidden states and greedy continuation transformers 5.24 produced in f32.
//!
//! Tolerances: prefill logits and every hidden state ≤ 1e-4 max relative error (the reference's
//! RMS as the floor for near-zero entries); the 16 greedy tokens exactly; the logits of every
//! decode step (which exercise the caches and the single-token kernels) ≤ 1e-4.
//!
//! Every directory under `testdata/tiny` with a `golden.safetensors` is checked (no list to keep
//! in sync): the four presets and the `awk_*` awkward shapes (`gen_models.py --awkward`: head dims,
//! spans and hidden sizes off every power of two, long prompts, absent optional fields).
//! `DAY0_TINY=name,...` runs only those named.

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
    try_runner(name, capacity).unwrap_or_else(|e| panic!("{e}"))
}

fn try_runner(name: &str, capacity: usize) -> Result<Runner, String> {
    let launcher = Launcher::for_device("npu-910b").map_err(|e| e.to_string())?;
    Runner::load(&tiny(name), launcher, capacity).map_err(|e| format!("{name}: load: {e}"))
}

/// What one checkpoint's check measured.
struct Checked {
    prompt: usize,
    worst_prefill: f64,
    worst_decode: f64,
}

/// Prefill logits and every layer's hidden state, then 16 greedy tokens with their logits.
/// Errors and mismatches come back as text naming the checkpoint.
fn check_model(name: &str) -> Result<Checked, String> {
    let g = golden(name);
    let prompt = ids(&g, "input_ids");
    let want_tokens = ids(&g, "generated");

    let mut r = try_runner(name, prompt.len())?;
    let v = validate(&mut r, &prompt, &g, TOL).map_err(|e| format!("{name}: prefill: {e}"))?;
    for d in &v.diffs {
        if d.flagged {
            return Err(format!(
                "{name}: {} max rel error {:.3e} (cosine {:.9}, worst position {})",
                d.name, d.max_rel, d.cosine, d.worst_position
            ));
        }
    }
    if v.diffs.len() != r.config().num_layers() + 2 {
        return Err(format!(
            "{name}: compared {} tensors, want every layer, the embedding and the logits ({})",
            v.diffs.len(),
            r.config().num_layers() + 2
        ));
    }

    let mut r = try_runner(name, prompt.len() + want_tokens.len())?;
    let gen = r
        .generate(&prompt, want_tokens.len())
        .map_err(|e| format!("{name}: generate: {e}"))?;
    let got: Vec<i64> = gen.tokens.iter().map(|t| *t as i64).collect();
    if got != want_tokens {
        return Err(format!(
            "{name}: greedy tokens {got:?}, transformers {want_tokens:?}"
        ));
    }
    let decode = tensor(&g, "decode_logits");
    let vocab = r.config().vocab_size;
    let mut worst_decode = 0.0f64;
    for (j, row) in gen.step_logits.iter().enumerate() {
        let d = model::forward::validate::compare(
            &format!("decode step {j}"),
            row,
            &decode[j * vocab..(j + 1) * vocab],
            vocab,
            TOL,
        );
        if d.flagged {
            return Err(format!(
                "{name}: {} max rel error {:.3e}",
                d.name, d.max_rel
            ));
        }
        worst_decode = worst_decode.max(d.max_rel);
    }
    if gen.prefill.total_cycles() == 0 || gen.decode.total_cycles() == 0 {
        return Err(format!("{name}: no cycles booked"));
    }
    Ok(Checked {
        prompt: prompt.len(),
        worst_prefill: v.tail_error(),
        worst_decode,
    })
}

/// Every directory under `testdata/tiny` holding a `golden.safetensors`, sorted.
fn tiny_checkpoints() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("golden.safetensors").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// [`check_model`] with a panic inside day0 turned into an error (user input must never panic,
/// and one checkpoint's panic must not hide the others' results).
fn check_catching(name: &str) -> Result<Checked, String> {
    match std::panic::catch_unwind(|| check_model(name)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "(non-string panic)".into());
            Err(format!("{name}: PANIC: {msg}"))
        }
    }
}

/// Every checkpoint under `testdata/tiny` (not a list: a new directory is tested by being there)
/// against transformers: prefill logits and every hidden state, 16 greedy tokens, every decode
/// step's logits. `DAY0_TINY=name[,name]` restricts the run to those checkpoints.
#[test]
fn every_tiny_checkpoint_matches_transformers() {
    let only: Option<Vec<String>> = std::env::var("DAY0_TINY")
        .ok()
        .map(|s| s.split(',').map(|t| t.trim().to_string()).collect());
    let names = tiny_checkpoints();
    assert!(names.len() >= 4, "found only {names:?}");
    let mut failures = Vec::new();
    let mut report = Vec::new();
    for name in &names {
        if let Some(only) = &only {
            if !only.contains(name) {
                continue;
            }
        }
        let t0 = std::time::Instant::now();
        let result = check_catching(name);
        let secs = t0.elapsed().as_secs_f64();
        match result {
            Ok(c) => report.push(format!(
                "  ok  {name:<28} {:>3} tokens  {secs:6.1} s  prefill rel {:.1e}, decode rel {:.1e}",
                c.prompt, c.worst_prefill, c.worst_decode
            )),
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "tiny checkpoints against transformers:\n{}",
        report.join("\n")
    );
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Running the prompt in two chunks (prefill, then the rest against the cache) gives the same
/// logits as one pass.
#[test]
fn chunked_prompt_equals_one_pass() {
    // (name, split): the long ones split past a 64-token GDN chunk / key tile, and mid-chunk;
    // Llama 4's second part starts inside its second 8-position attention chunk (it reads the
    // cache from that chunk's start only).
    for (name, split) in [
        ("llama4", 11),
        ("deepseek_v3", 11),
        ("qwen3_next", 11),
        ("deepseek_v32", 11),
        ("awk_fit_qn_long", 70),
        ("awk_fit_v32_long", 45),
    ] {
        let g = golden(name);
        let prompt = ids(&g, "input_ids");
        let mut one = runner(name, prompt.len());
        let full = one.forward(&prompt).unwrap();
        let mut two = runner(name, prompt.len());
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

/// `path`'s safetensors file with every tensor name mapped by `rename` (the header rewritten, the
/// data untouched: offsets count from the data area).
fn renamed_safetensors(path: &Path, rename: impl Fn(&str) -> String) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let header: serde_json::Map<String, serde_json::Value> = header
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "__metadata__" => (k, v),
            _ => (rename(&k), v),
        })
        .collect();
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&text);
    out.extend_from_slice(&bytes[8 + n..]);
    out
}

/// Llama 4's released checkpoints are saved by `Llama4ForConditionalGeneration`: the language
/// model under `language_model.model.`, its head `language_model.lm_head.weight`. The tiny Llama 4
/// saved that way gives the same logits as saved by `Llama4ForCausalLM`.
#[test]
fn a_multimodal_wrappers_names_load_as_the_text_model() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny("llama4");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let wrapped = renamed_safetensors(&src.join("model.safetensors"), |n| {
        format!("language_model.{n}")
    });
    assert!(
        !wrapped.windows(6).any(|w| w == b"\"model"),
        "every name moved"
    );
    std::fs::write(dir.path().join("model.safetensors"), wrapped).unwrap();
    let g = golden("llama4");
    let prompt = ids(&g, "input_ids");
    let want = runner("llama4", prompt.len()).forward(&prompt).unwrap();
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let mut r = Runner::load(dir.path(), launcher, prompt.len()).unwrap();
    let got = r.forward(&prompt).unwrap();
    assert_eq!(got.logits, want.logits);
}
