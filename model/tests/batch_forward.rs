//! Issue #13 item 2: one forward step serves a batch of sequences, each with its own query length
//! and context, prefill chunks mixed with decodes (continuous batching). Every sequence gets the
//! logits it gets when run alone, over the reference (f32) cache and over an FP8 cache (whose
//! batched decodes run their own kernels: DSA's batched indexer and sparse attention).

use dsl_core::Launcher;
use model::forward::{CacheFormat, Precision, Runner};
use std::path::PathBuf;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

const CAPACITY: usize = 32;

fn runner(name: &str) -> Runner {
    runner_in(name, CacheFormat::F32)
}

/// [`runner`] with its KV pools in `cache`.
fn runner_in(name: &str, cache: CacheFormat) -> Runner {
    let mut r = Runner::load_at(
        &testdata(&format!("tiny/{name}")),
        Launcher::for_device("npu-910b").unwrap(),
        CAPACITY,
        Precision::F32,
    )
    .unwrap();
    r.set_kv_cache(cache).unwrap();
    r
}

/// Three sequences: their prompts and the tokens each then decodes (fixed ids, so the runs cannot
/// diverge through a different argmax).
fn sequences() -> Vec<(Vec<i64>, Vec<i64>)> {
    let toks = |n: usize, seed: i64| {
        (0..n as i64)
            .map(|i| (i * 31 + seed * 17) % 200 + 1)
            .collect()
    };
    vec![
        (toks(7, 1), toks(3, 2)),
        (toks(11, 3), toks(2, 4)),
        (toks(4, 5), toks(3, 6)),
    ]
}

/// Each sequence alone: its prompt in one step, then one step per decode token; the logits of
/// every position, row by row.
fn alone(name: &str, cache: CacheFormat, prompt: &[i64], decode: &[i64]) -> Vec<Vec<f32>> {
    let mut r = runner_in(name, cache);
    let out = r.forward(prompt).unwrap();
    let mut rows: Vec<Vec<f32>> = (0..out.tokens).map(|t| out.row(t).to_vec()).collect();
    for tok in decode {
        rows.push(r.forward(&[*tok]).unwrap().row(0).to_vec());
    }
    rows
}

/// Relative L2 distance of two logit rows.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn a_batch_gives_each_sequence_the_logits_it_gets_alone() {
    // Llama 4's chunks are 8 positions: its sequences decode at different offsets within their
    // chunks (one decode launch each) and sequence 1's second prompt chunk crosses a boundary.
    let f32_cache = [
        "deepseek_v3",
        "deepseek_v32",
        "qwen3_next",
        "kimi_linear",
        "llama4",
    ]
    .map(|name| (name, CacheFormat::F32));
    // DeepSeek-V3.2 reads every prompt chunk's context from its FP8 pools, so chunking changes
    // nothing. (Dense MLA's first chunk attends its own rows unquantised and a later chunk reads
    // them from the FP8 pool: sequence 1's chunked prompt differs from its whole prompt by FP8's
    // error, which `fp8_kv_cache.rs` bounds.)
    let fp8_cache = [("deepseek_v32", CacheFormat::Fp8)];
    for (name, cache) in f32_cache.into_iter().chain(fp8_cache) {
        let seqs = sequences();
        let want: Vec<Vec<Vec<f32>>> = seqs.iter().map(|(p, d)| alone(name, cache, p, d)).collect();
        let mut r = runner_in(name, cache);
        // A page (64 tokens) per sequence.
        r.serve(3, 3 * 64).unwrap();
        assert_eq!(r.add_sequence().unwrap(), 1);
        assert_eq!(r.add_sequence().unwrap(), 2);
        let mut got: Vec<Vec<Vec<f32>>> = vec![Vec::new(); 3];
        let (p0, d0) = (&seqs[0].0, &seqs[0].1);
        let (p1, d1) = (&seqs[1].0, &seqs[1].1);
        let (p2, d2) = (&seqs[2].0, &seqs[2].1);
        // Step 1: sequence 0's whole prompt, the first chunk of sequence 1's.
        // Step 2: sequence 0 decodes, sequence 1's second chunk, sequence 2's whole prompt.
        // Steps 3-4: everyone decodes (sequence 1 stops after its two tokens).
        let steps: Vec<Vec<(usize, &[i64])>> = vec![
            vec![(0, &p0[..]), (1, &p1[..5])],
            vec![(0, &d0[..1]), (1, &p1[5..]), (2, &p2[..])],
            vec![(2, &d2[..1]), (0, &d0[1..2]), (1, &d1[..1])],
            vec![(0, &d0[2..3]), (1, &d1[1..2]), (2, &d2[1..2])],
            vec![(2, &d2[2..3])],
        ];
        for step in &steps {
            let outs = r.forward_batch(step).unwrap();
            assert_eq!(outs.len(), step.len());
            for ((seq, toks), out) in step.iter().zip(&outs) {
                assert_eq!(out.tokens, toks.len());
                for t in 0..out.tokens {
                    got[*seq].push(out.row(t).to_vec());
                }
            }
        }
        for s in 0..3 {
            assert_eq!(got[s].len(), want[s].len(), "{name} sequence {s}");
            assert_eq!(r.sequence_position(s), Some(want[s].len()));
            for (pos, (g, w)) in got[s].iter().zip(&want[s]).enumerate() {
                let d = rel_l2(g, w);
                assert!(
                    d < 1e-5,
                    "{name} ({cache:?} cache): sequence {s} position {pos}: batched logits {d:.2e} from alone"
                );
            }
        }
    }
}

#[test]
fn bad_batches_are_errors() {
    let mut r = runner("deepseek_v3");
    let e = r
        .forward_batch(&[(1, &[3, 4][..])])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("sequence 1") && e.contains("add_sequence"),
        "{e}"
    );
    // The default pools hold sequence 0 only.
    let e = r.add_sequence().unwrap_err().to_string();
    assert!(e.contains("Runner::serve"), "{e}");
    r.serve(2, 2 * CAPACITY).unwrap();
    r.add_sequence().unwrap();
    let e = r
        .forward_batch(&[(1, &[3][..]), (1, &[4][..])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("twice"), "{e}");
    let e = r.forward_batch(&[]).unwrap_err().to_string();
    assert!(e.contains("empty batch"), "{e}");
    let long = vec![1i64; CAPACITY + 1];
    let e = r
        .forward_batch(&[(0, &[1][..]), (1, &long[..])])
        .unwrap_err();
    assert!(e.to_string().contains("cache slots"), "{e}");
}

#[test]
fn released_sequences_give_their_pages_and_slots_back() {
    let mut r = runner("qwen3_next");
    // Two sequences at a time, and pages for 2 × 64 tokens: each admits, runs and leaves.
    r.serve(2, 128).unwrap();
    let empty = r.pool_usage();
    assert_eq!(
        (empty.sequences, empty.slots_in_use, empty.pages_in_use),
        (1, 1, 0)
    );
    let s = r.add_sequence().unwrap();
    assert!(r.add_sequence().is_err(), "only two slots");
    r.forward_batch(&[(0, &[1, 2, 3][..]), (s, &[4, 5][..])])
        .unwrap();
    let busy = r.pool_usage();
    assert_eq!((busy.sequences, busy.tokens, busy.pages_in_use), (2, 5, 2));
    r.release_sequence(s).unwrap();
    assert!(r.release_sequence(s).is_err(), "released twice");
    assert!(
        r.forward_batch(&[(s, &[1][..])]).is_err(),
        "a released sequence"
    );
    r.audit_pools().unwrap();
    let after = r.pool_usage();
    assert_eq!(
        (after.sequences, after.slots_in_use, after.pages_in_use),
        (1, 1, 1)
    );
    // Ids are never reused; the freed slot serves the next one.
    assert_eq!(r.add_sequence().unwrap(), s + 1);
    // Resizing needs empty pools.
    assert!(r.serve(4, 256).to_string_err().contains("release"));
}

trait ErrText {
    fn to_string_err(self) -> String;
}

impl<T, E: std::fmt::Display> ErrText for Result<T, E> {
    fn to_string_err(self) -> String {
        self.err().map(|e| e.to_string()).unwrap_or_default()
    }
}

#[test]
fn a_full_pool_refuses_a_step_and_leaves_every_sequence_as_it_was() {
    let mut r = runner("deepseek_v3");
    // One page of 64 tokens for two sequences.
    r.serve(2, 64).unwrap();
    let s = r.add_sequence().unwrap();
    r.forward_batch(&[(0, &[1, 2][..])]).unwrap();
    let before = r.pool_usage();
    let e = r
        .forward_batch(&[(0, &[3][..]), (s, &[4][..])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("page") && e.contains("release"), "{e}");
    assert_eq!(r.pool_usage(), before);
    assert_eq!(r.sequence_position(0), Some(2));
    assert_eq!(r.sequence_position(s), Some(0));
    r.audit_pools().unwrap();
    // Sequence 0 alone still runs on.
    r.forward_batch(&[(0, &[3][..])]).unwrap();
}

#[test]
fn mla_decodes_of_a_step_attend_in_one_launch_per_layer() {
    let mut r = runner("deepseek_v3");
    r.serve(3, 3 * 64).unwrap();
    let (a, b) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
    r.forward_batch(&[(0, &[1, 2, 3][..]), (a, &[4, 5][..]), (b, &[6][..])])
        .unwrap();
    let launches = |r: &Runner| r.stats().per_op.get("mla.decode_split").map_or(0, |e| e.0);
    let before = launches(&r);
    // Three decodes (and a prefill chunk, which runs on its own) in one step.
    r.forward_batch(&[(a, &[7][..]), (0, &[8][..]), (b, &[9, 10][..])])
        .unwrap();
    r.forward_batch(&[(a, &[11][..]), (0, &[12][..]), (b, &[13][..])])
        .unwrap();
    let layers = r.config().num_layers() as u64;
    assert_eq!(
        launches(&r) - before,
        2 * layers,
        "one batched decode launch per layer and step"
    );
}

/// DeepSeek-V3.2's sparse MLA: the indexer, top-k and sparse attention of a step's decodes run
/// once per sparse layer for the whole batch (a prefill chunk beside them runs on its own).
#[test]
fn dsa_decodes_of_a_step_run_one_launch_per_kernel_and_layer() {
    let mut r = runner("deepseek_v32");
    r.serve(3, 3 * 64).unwrap();
    let (a, b) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
    r.forward_batch(&[(0, &[1, 2, 3][..]), (a, &[4, 5][..]), (b, &[6][..])])
        .unwrap();
    let ops = ["indexer.scores", "indexer.topk", "mla.sparse_attention"];
    let launches = |r: &Runner| ops.map(|op| r.stats().per_op.get(op).map_or(0, |e| e.0));
    let before = launches(&r);
    r.forward_batch(&[(a, &[7][..]), (0, &[8][..]), (b, &[9][..])])
        .unwrap();
    let sparse = r
        .config()
        .layers
        .iter()
        .filter(|l| l.attention == model::config::AttentionKind::SparseMla)
        .count() as u64;
    assert!(sparse > 0);
    let after = launches(&r);
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(
            after[i] - before[i],
            sparse,
            "{op}: one batched launch per sparse layer"
        );
    }
    // A prefill chunk beside two decodes: its own launches, plus the decodes' one.
    r.forward_batch(&[(a, &[10][..]), (0, &[11][..]), (b, &[12, 13][..])])
        .unwrap();
    assert_eq!(launches(&r)[0] - after[0], 2 * sparse);
}

#[test]
fn gqa_decodes_of_a_step_attend_in_one_launch_per_layer() {
    let mut r = runner("qwen3_next");
    r.serve(3, 3 * 64).unwrap();
    let (a, b) = (r.add_sequence().unwrap(), r.add_sequence().unwrap());
    r.forward_batch(&[(0, &[1, 2, 3][..]), (a, &[4, 5][..]), (b, &[6][..])])
        .unwrap();
    let launches = |r: &Runner| r.stats().per_op.get("attn.decode_split").map_or(0, |e| e.0);
    let before = launches(&r);
    r.forward_batch(&[(a, &[7][..]), (0, &[8][..]), (b, &[9][..])])
        .unwrap();
    let full = r
        .config()
        .layers
        .iter()
        .filter(|l| l.attention == model::config::AttentionKind::Gqa)
        .count() as u64;
    assert!(full > 0);
    assert_eq!(
        launches(&r) - before,
        full,
        "one batched decode launch per GQA layer"
    );
}
