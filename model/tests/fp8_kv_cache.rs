//! Issue #13 item 1, the KV cache in FP8 E4M3 with per-token scales (`--kv-dtype fp8`): every
//! pool holds one byte per value plus one f32 scale per token and cached row (the MLA latent,
//! dense and DeepSeek-V3.2's sparse MLA, the DSA indexer's keys, GQA's keys and values per
//! key/value head), written by the quantising append, read by the FP8 latent decode, the batched
//! FP8 GQA decode, the FP8 indexer and sparse attention (prompt chunks and decodes), and, for a
//! later prefill chunk, gathered dequantised.
//!
//! Tolerance of FP8 against the bf16 cache: each cached value carries a relative error of at most
//! u = 2^-4 (E4M3's unit roundoff); attention outputs move by a weighted mean of such errors
//! (see `kernels/tests/attention_decode.rs`), and the tiny checkpoints' logits by at most a few u
//! after their layers. The bound is 2u = 0.125 relative L2 per logit row (measured: see the
//! printed distances), and the distance must be visibly above rounding noise (> 1e-4), or the
//! cache was not quantised.

use dsl_core::{Backend, Launcher};
use model::forward::{CacheFormat, Precision, Runner};
use std::path::PathBuf;

fn tiny(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tiny")
        .join(name)
}

fn runner(name: &str, cache: CacheFormat) -> Runner {
    let mut r = Runner::load_at(
        &tiny(name),
        Launcher::for_device("npu-910b").unwrap(),
        32,
        Precision::Native,
    )
    .unwrap();
    r.set_kv_cache(cache).unwrap();
    r
}

/// Two sequences in one runner: sequence 0's prompt in two chunks (the second gathers the first
/// chunk's cached context), sequence 1's prompt, then three steps where both decode. Every
/// position's logits, per sequence.
fn serve(name: &str, cache: CacheFormat) -> Vec<Vec<Vec<f32>>> {
    let mut r = runner(name, cache);
    r.serve(2, 2 * 64).unwrap();
    assert_eq!(r.add_sequence().unwrap(), 1);
    let toks = |n: usize, seed: i64| -> Vec<i64> {
        (0..n as i64)
            .map(|i| (i * 37 + seed * 11) % 150 + 1)
            .collect()
    };
    let (p0, p1) = (toks(9, 1), toks(6, 2));
    let steps: Vec<Vec<(usize, Vec<i64>)>> = vec![
        vec![(0, p0[..5].to_vec()), (1, p1.clone())],
        vec![(0, p0[5..].to_vec()), (1, toks(1, 3))],
        vec![(0, toks(1, 4)), (1, toks(1, 5))],
        vec![(1, toks(1, 6)), (0, toks(1, 7))],
    ];
    let mut got = vec![Vec::new(), Vec::new()];
    for step in &steps {
        let batch: Vec<(usize, &[i64])> = step.iter().map(|(s, t)| (*s, &t[..])).collect();
        for ((seq, _), out) in step.iter().zip(r.forward_batch(&batch).unwrap()) {
            for t in 0..out.tokens {
                let row = out.row(t).to_vec();
                assert!(
                    row.iter().all(|v| v.is_finite()),
                    "{name}: a logit of sequence {seq} is not finite"
                );
                got[*seq].push(row);
            }
        }
    }
    got
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The largest distance of `a`'s logit rows from `b`'s.
fn max_distance(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f64 {
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| rel_l2(x, y))
        .fold(0.0, f64::max)
}

#[test]
fn an_fp8_cache_stays_within_the_e4m3_bound_of_bf16() {
    // Dense MLA with rope (V3, V2) and without (Kimi Linear, whose KDA layers keep no KV cache);
    // GQA keys and values (Qwen3-Next's gated full-attention layers beside its Gated DeltaNet
    // layers; gpt-oss's sliding windows and attention sinks); V3.2's sparse MLA below.
    for name in [
        "deepseek_v3",
        "deepseek_v2",
        "kimi_linear",
        "qwen3_next",
        "gpt_oss",
    ] {
        let bf16 = serve(name, CacheFormat::Bf16);
        let fp8 = serve(name, CacheFormat::Fp8);
        let d = max_distance(&fp8, &bf16);
        println!("{name}: FP8 cache vs bf16, largest logit-row distance {d:.3e}");
        assert!(d <= 0.125, "{name}: {d}");
        assert!(d > 1e-4, "{name}: {d} — was the cache quantised?");
    }
}

#[test]
fn the_cache_format_is_chosen_before_any_token() {
    let mut r = runner("deepseek_v3", CacheFormat::Bf16);
    r.forward(&[1, 2, 3]).unwrap();
    let e = r.set_kv_cache(CacheFormat::Fp8).unwrap_err().to_string();
    assert!(e.contains("--kv-dtype") && e.contains("3 tokens"), "{e}");
}

/// One cost-only decode step of `cfg` at context 4000 on h800 with its cache in `cache`: each
/// of `ops`'s (HBM bytes, launches).
fn cost_only_decode(
    cfg: &model::config::ModelConfig,
    cache: CacheFormat,
    ops: &[&str],
) -> Vec<(u64, u64)> {
    let l = Launcher::for_device("h800")
        .unwrap()
        .with_backend(Backend::CostOnly);
    let mut r = Runner::cost_only(cfg.clone(), l, 4096).unwrap();
    r.set_kv_cache(cache).unwrap();
    r.seek(4000).unwrap();
    r.forward(&[1]).unwrap();
    let s = r.stats();
    ops.iter()
        .map(|op| (s.traffic[*op].hbm_bytes, s.per_op[*op].0))
        .collect()
}

/// A cost-only decode step over an FP8 cache moves the bytes the cache's rows take in the decode
/// attention, in the same launches: a row of `d` values is `d` code bytes plus a 4-byte scale
/// against `2d` bytes in bf16 (queries and partials unchanged, a few percent more): the MLA
/// latent decode (DeepSeek-V3, whose tiny checkpoint's latent rows are 48 wide → 0.542) and the
/// batched GQA decode (Qwen3-Next's full-attention layers, whose tiny checkpoint's heads are 16
/// wide → 0.625).
#[test]
fn a_cost_only_fp8_decode_reads_the_bytes_of_its_rows() {
    for (name, op) in [
        ("deepseek_v3", "mla.decode_split"),
        ("qwen3_next", "attn.decode_split"),
    ] {
        let cfg = model::config::load_config(&tiny(name).join("config.json")).unwrap();
        let d = match (&cfg.mla, &cfg.gqa) {
            (Some(m), _) => m.latent_dim(),
            (None, Some(g)) => g.head_dim,
            _ => unreachable!("{name} has a KV cache"),
        } as f64;
        let (bf16, n16) = cost_only_decode(&cfg, CacheFormat::Bf16, &[op])[0];
        let (fp8, n8) = cost_only_decode(&cfg, CacheFormat::Fp8, &[op])[0];
        assert_eq!(n16, n8, "{name}");
        let (ratio, rows) = (fp8 as f64 / bf16 as f64, (d + 4.0) / (2.0 * d));
        println!("{name} {op} bytes, FP8 / bf16: {ratio:.3} (rows alone {rows:.3})");
        assert!(
            (rows - 0.02..rows + 0.06).contains(&ratio),
            "{name}: fp8 {fp8} / bf16 {bf16} = {ratio}, rows alone {rows}"
        );
    }
}

/// DeepSeek-V3.2's cost-only decode step over an FP8 cache: the sparse attention gathers each
/// selected row's codes and scale (580 bytes against bf16's 1152) and the indexer scans FP8 keys
/// (132 bytes against 256 per token), so both move well under the bf16 cache's bytes, in the same
/// launches.
#[test]
fn a_cost_only_fp8_sparse_decode_gathers_fewer_bytes() {
    let mut cfg = model::config::load_config(&tiny("deepseek_v32").join("config.json")).unwrap();
    // DeepSeek-V3.2's own top-k: the gathered rows, not the queries, dominate the bytes.
    cfg.indexer.as_mut().unwrap().topk = 2048;
    let ops = ["mla.sparse_attention", "indexer.scores"];
    let bf16 = cost_only_decode(&cfg, CacheFormat::Bf16, &ops);
    let fp8 = cost_only_decode(&cfg, CacheFormat::Fp8, &ops);
    for (op, (b, f)) in ops.iter().zip(bf16.iter().zip(&fp8)) {
        assert_eq!(b.1, f.1, "{op}: launches");
        let ratio = f.0 as f64 / b.0 as f64;
        println!("{op} bytes, FP8 / bf16: {ratio:.3}");
        assert!(ratio < 0.75, "{op}: fp8 {f:?} / bf16 {b:?} = {ratio}");
    }
}

/// One sequence of DeepSeek-V3.2 (a prompt in two chunks, then three decodes) with its router
/// choices and indexer selections recorded: each token's logits, and per token what decided its
/// output in every layer, as a string to compare: its experts and the set of keys it attended
/// (the first `min(topk, position + 1)` entries of its selection row; the order within the set
/// changes no output).
fn serve_recorded(cache: CacheFormat) -> (Vec<Vec<f32>>, Vec<String>) {
    let mut r = runner("deepseek_v32", cache);
    let topk = r.config().indexer.as_ref().unwrap().topk;
    r.record_routing();
    let toks: Vec<i64> = (0..12i64).map(|i| (i * 37 + 11) % 150 + 1).collect();
    let mut logits = Vec::new();
    for chunk in [
        &toks[..5],
        &toks[5..9],
        &toks[9..10],
        &toks[10..11],
        &toks[11..],
    ] {
        let out = r.forward(chunk).unwrap();
        logits.extend((0..out.tokens).map(|t| out.row(t).to_vec()));
    }
    let rec = r.take_recording().unwrap();
    let mut choices = Vec::new();
    for step in &rec.steps {
        for t in 0..step.tokens {
            let attended = (step.position + t + 1).min(topk);
            let row = |v: &Option<Vec<i32>>, keep: usize| {
                v.as_ref().map(|v| {
                    let width = v.len() / step.tokens;
                    let mut set = v[t * width..][..keep.min(width)].to_vec();
                    set.sort_unstable();
                    set
                })
            };
            let per_layer: Vec<String> = step
                .layers
                .iter()
                .map(|l| {
                    format!(
                        "{:?}/{:?}",
                        row(&l.experts, usize::MAX),
                        row(&l.selected, attended)
                    )
                })
                .collect();
            choices.push(per_layer.join(" "));
        }
    }
    (logits, choices)
}

/// DeepSeek-V3.2's sparse MLA over an FP8 cache (prompt chunks and decodes read the indexer keys
/// and the latent through `indexer_prefill_fp8` and `sparse_mla_fp8`): every token whose
/// discrete choices (router experts, indexer selection) came out as the bf16 cache's is within
/// the E4M3 bound above. A token whose choice flipped (FP8 moves the hidden state and the keys,
/// and a near-tie of the tiny router or indexer can go the other way) moves by a different
/// expert's output or key, not by quantisation error: it is not compared, and most tokens must be.
/// (The filter is per token: a flipped choice also changes the cache rows that token writes in
/// later layers, which later tokens read only through their attention weights, within the
/// bound's margin.)
#[test]
fn an_fp8_sparse_latent_cache_stays_within_the_e4m3_bound_where_choices_agree() {
    let (bf16, c16) = serve_recorded(CacheFormat::Bf16);
    let (fp8, c8) = serve_recorded(CacheFormat::Fp8);
    assert_eq!((bf16.len(), c16.len(), c8.len()), (12, 12, 12));
    let agree: Vec<usize> = (0..12).filter(|t| c16[*t] == c8[*t]).collect();
    assert!(
        agree.len() >= 8,
        "only tokens {agree:?} made the bf16 run's choices"
    );
    let d = agree
        .iter()
        .map(|t| rel_l2(&fp8[*t], &bf16[*t]))
        .fold(0.0, f64::max);
    println!(
        "deepseek_v32: FP8 latent cache vs bf16, largest logit-row distance {d:.3e} over {} of 12 tokens",
        agree.len()
    );
    assert!(d <= 0.125, "{d}");
    assert!(d > 1e-4, "{d} — was the cache quantised?");
}
