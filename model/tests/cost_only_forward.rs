//! The forward pass run cost-only from config.json alone (issue #13 item 3, first part): the same
//! layer code on shape-only weights and caches. Checks that every committed configuration runs,
//! that timing one layer per kind (the memo) books exactly what timing every layer books, and that
//! a cost-only run prices the same kernels a functional run of the checkpoint launches.

use dsl_core::Launcher;
use model::config::load_config;
use model::forward::{CacheFormat, Precision, Runner};
use std::path::PathBuf;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

fn cost_runner(rel: &str, capacity: usize) -> Runner {
    let cfg = load_config(&testdata(rel)).expect("config parses");
    Runner::cost_only(cfg, launcher(), capacity).expect("cost-only runner")
}

/// Every tiny checkpoint's config and the production configs (Kimi-K2 at a trillion parameters
/// included: nothing is materialised) run a prefill and decode steps cost-only.
#[test]
fn every_committed_config_runs_cost_only() {
    let mut configs = vec![
        "kimi_k2_config.json".to_string(),
        "deepseek_v32_config.json".to_string(),
        "qwen3_next_config.json".to_string(),
        "kimi_linear_config.json".to_string(),
    ];
    for e in std::fs::read_dir(testdata("tiny")).unwrap() {
        let e = e.unwrap();
        if e.path().join("config.json").exists() {
            configs.push(format!(
                "tiny/{}/config.json",
                e.file_name().to_string_lossy()
            ));
        }
    }
    configs.sort();
    for c in &configs {
        let mut r = cost_runner(c, 40);
        let run = r.cost_run(37, 3).unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(run.prefill.total_cycles() > 0, "{c}");
        assert_eq!(run.decode_steps, 2, "{c}");
        let layers = r.config().num_layers() as u64;
        // One input norm per layer per step (and nothing materialised: no logits come back).
        let norms = run.decode.per_op["input_layernorm"].0;
        assert_eq!(norms, 2 * layers, "{c}: input_layernorm launches");
    }
}

/// The memo (one layer of each kind timed per step) books the same launches and cycles, operator
/// by operator, as timing every layer.
#[test]
fn memoised_layers_book_what_every_layer_books() {
    for c in [
        "tiny/deepseek_v32/config.json",
        "tiny/qwen3_next/config.json",
        "tiny/kimi_linear/config.json",
        "kimi_linear_config.json",
    ] {
        let mut memo = cost_runner(c, 24);
        let mut every = cost_runner(c, 24);
        every.memoise_layers(false);
        let a = memo.cost_run(20, 4).unwrap();
        let b = every.cost_run(20, 4).unwrap();
        assert_eq!(a.prefill, b.prefill, "{c}: prefill");
        assert_eq!(a.decode, b.decode, "{c}: decode");
    }
}

/// The launch memo (each distinct cost-only launch simulated once, across layers and steps) books
/// the same launches and cycles, operator by operator, as simulating every launch; and it is
/// used: the repeated layers and decode steps are answered from it.
#[test]
fn the_launch_memo_books_what_simulating_every_launch_books() {
    // (config, whether the layer memo is on): the production configs keep it (61 layers simulated
    // one by one would make this test slow); without it every tiny layer launches, and the launch
    // memo is what repeats them.
    for (c, layer_memo) in [
        ("kimi_k2_config.json", true),
        ("deepseek_v32_config.json", true),
        ("tiny/qwen3_next/config.json", false),
        ("tiny/kimi_linear/config.json", false),
        ("tiny/deepseek_v32/config.json", false),
    ] {
        let mut memo = cost_runner(c, 40);
        let mut every = cost_runner(c, 40);
        every.memoise_launches(false);
        memo.memoise_layers(layer_memo);
        every.memoise_layers(layer_memo);
        let a = memo.cost_run(32, 4).unwrap();
        let b = every.cost_run(32, 4).unwrap();
        assert_eq!(a.prefill, b.prefill, "{c}: prefill");
        assert_eq!(a.decode, b.decode, "{c}: decode");
        let (hits, misses) = memo.memo_counts();
        assert_eq!(every.memo_counts(), (0, 0), "{c}");
        assert!(
            hits > misses,
            "{c}: {hits} launches answered from the memo, {misses} simulated"
        );
    }
}

/// A cost-only run launches the operators a functional run of the checkpoint launches, as often,
/// and for data-independent operators at the same cycles (routing, top-k selection and what they
/// gather are data-dependent; cost-only runs route uniformly).
/// Both precisions: f32, and native (the tiny checkpoint is float, so bf16 weights either way).
#[test]
fn cost_only_prices_the_functional_launches() {
    for precision in [Precision::F32, Precision::Native] {
        let dir = testdata("tiny/qwen3_next");
        let mut f = Runner::load_at(&dir, launcher(), 24, precision).unwrap();
        let prompt: Vec<i64> = (0..20).map(|i| (i * 7 % 200) as i64).collect();
        f.forward(&prompt).unwrap();
        let functional = f.stats().clone();
        let cfg = load_config(&testdata("tiny/qwen3_next/config.json")).unwrap();
        let mut c = Runner::cost_only_at(cfg, launcher(), 24, precision).unwrap();
        c.forward(&[0; 20]).unwrap();
        let cost = c.stats().clone();
        let launches = |s: &model::forward::OpStats| -> Vec<(String, u64)> {
            s.per_op.iter().map(|(k, (n, _))| (k.clone(), *n)).collect()
        };
        assert_eq!(launches(&functional), launches(&cost), "{precision:?}");
        for op in [
            "input_layernorm",
            "linear_attn.in_proj_qkvz",
            "linear_attn.conv",
            "linear_attn.delta_chunked",
            "attn.q_proj",
        ] {
            assert_eq!(functional.per_op[op], cost.per_op[op], "{op} {precision:?}");
        }
    }
}

/// The per-layer-kind split of a cost run covers the phase exactly: its kinds' cycles and
/// launches add up to the phase's, with the decoder layers under their kinds and the rest under
/// `head`.
#[test]
fn cost_by_layer_kind_adds_up_to_the_phase() {
    for c in ["deepseek_v32_config.json", "tiny/qwen3_next/config.json"] {
        let mut r = cost_runner(c, 40);
        let run = r.cost_run(30, 4).unwrap();
        for (phase, kinds) in [
            (&run.prefill, &run.prefill_by_kind),
            (&run.decode, &run.decode_by_kind),
        ] {
            let cycles: u64 = kinds.values().map(|s| s.total_cycles()).sum();
            let launches: u64 = kinds.values().map(|s| s.launches()).sum();
            assert_eq!(cycles, phase.total_cycles(), "{c}");
            assert_eq!(launches, phase.launches(), "{c}");
            assert!(kinds["head"].per_op.contains_key("lm_head"), "{c}");
            assert!(kinds.len() >= 2, "{c}: {:?}", kinds.keys());
        }
    }
}

/// Native precision keeps the KV pools in bf16, the reference path in f32: the attention decode,
/// whose HBM traffic is the cache it reads, moves about half the bytes, and the cache append
/// writes half. MLA latents (Kimi-K2) and GQA keys and values (Qwen3-Next) both.
#[test]
fn native_precision_caches_bf16() {
    for (c, decode, append) in [
        (
            "kimi_k2_config.json",
            "mla.decode_split",
            "mla.cache_append",
        ),
        (
            "tiny/qwen3_next/config.json",
            "attn.decode_split",
            "attn.cache_append",
        ),
    ] {
        let bytes = |precision: Precision| {
            let cfg = load_config(&testdata(c)).unwrap();
            let mut r = Runner::cost_only_at(cfg, launcher(), 2100, precision).unwrap();
            let format = r.cache_format();
            let run = r.cost_run(2048, 3).unwrap();
            let t = |op: &str| {
                run.decode
                    .traffic
                    .get(op)
                    .unwrap_or_else(|| panic!("{c}: no {op} in {:?}", run.decode.traffic.keys()))
                    .hbm_bytes as f64
            };
            (format, t(decode), t(append))
        };
        let (f32_format, f32_decode, f32_append) = bytes(Precision::F32);
        let (native_format, native_decode, native_append) = bytes(Precision::Native);
        assert_eq!(
            (f32_format, native_format),
            (CacheFormat::F32, CacheFormat::Bf16),
            "{c}"
        );
        assert_eq!(CacheFormat::Bf16.bytes() * 2, CacheFormat::F32.bytes());
        // The decode also reads its f32 queries and writes f32 partial outputs: a little over half.
        let r = native_decode / f32_decode;
        assert!(
            (0.5..0.65).contains(&r),
            "{c}: {decode} bytes bf16/f32 = {r:.3}"
        );
        let r = native_append / f32_append;
        assert!(
            (0.5..0.8).contains(&r),
            "{c}: {append} bytes bf16/f32 = {r:.3}"
        );
    }
}

/// The chunked KDA recurrence takes the largest chunk whose tiles fit the card, as the Gated
/// DeltaNet layer does: on an h800 (228 KB of shared memory per SM) Kimi-Linear's C = 64
/// overflows and a smaller chunk runs, where a fixed C made the whole prefill fail.
#[test]
fn kda_prefill_takes_a_chunk_that_fits_the_card() {
    let cfg = load_config(&testdata("kimi_linear_config.json")).unwrap();
    let h800 = Launcher::for_device("h800").unwrap();
    let mut r = Runner::cost_only(cfg, h800, 300).unwrap();
    let run = r.cost_run(256, 2).unwrap();
    let layers = r
        .config()
        .layers
        .iter()
        .filter(|l| l.attention == model::config::AttentionKind::LinearAttention)
        .count() as u64;
    assert_eq!(run.prefill.per_op["kda.delta_chunked"].0, layers);
    assert_eq!(run.decode.per_op["kda.delta_recurrent"].0, layers);
}
