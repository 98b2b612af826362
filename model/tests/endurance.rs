//! Issue #16 item 5, endurance: a runner serves many sequences of random prompt and output lengths
//! through chunked prefill and decode, continuously batched, out of fixed pools (paged KV cache
//! pages, linear-attention state slots) that sequences take on admission and give back when they
//! finish. Checked on tiny checkpoints of each attention family:
//! - every page and every slot returns to its pool, and the pools' bookkeeping audits clean after
//!   every step;
//! - the process's resident memory stays flat after warm-up (nothing grows per served sequence);
//! - a fixed sequence served alone at the start and again at the end gets identical logits, bit
//!   for bit (other sequences' pages and slots, reused, leave nothing behind), and the same
//!   sequence batched with others mid-run gets the same logits within rounding.
//!
//! One test in its own binary, so no other test shares the process whose memory it reads.
//! `DAY0_ENDURANCE_REQUESTS` serves more sequences per model (the longer run in BENCHMARKS.md).

use dsl_core::Launcher;
use kernels::testdata::Rng;
use model::forward::{Precision, Runner};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Instant;

/// Tokens one sequence may hold.
const CAPACITY: usize = 96;
/// Sequences in flight at once.
const MAX_SEQUENCES: usize = 4;
/// Pages of 64 tokens in the pool: fewer than `MAX_SEQUENCES` full-length sequences need, so
/// admission waits for pages as a serving engine's does.
const POOL_TOKENS: usize = 6 * 64;
/// Prefill chunk.
const CHUNK: usize = 16;

fn tiny(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/tiny")
        .join(name)
}

/// Resident set size of this process in bytes (Linux `/proc/self/statm`), if readable.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// One request: its prompt and how many tokens it decodes.
#[derive(Clone)]
struct Request {
    prompt: Vec<i64>,
    decode: usize,
}

/// A request being served: its sequence id, what it still has to prefill, its decode budget, the
/// last token it produced, and every logit row it got.
struct Active {
    req: usize,
    seq: usize,
    prefilled: usize,
    decoded: usize,
    next: i64,
    rows: Vec<Vec<f32>>,
}

fn argmax(v: &[f32]) -> i64 {
    model::forward::argmax(v) as i64
}

/// Pages a request needs over its whole life.
fn pages_for(r: &Request) -> usize {
    (r.prompt.len() + r.decode).div_ceil(64)
}

/// Serves `requests` to completion with continuous batching; returns request `keep`'s logit rows
/// (prompt rows, then one per decoded token; the others' are dropped, or the test itself would
/// grow) and the number of steps.
fn serve(
    r: &mut Runner,
    requests: &[Request],
    keep: Option<usize>,
    vocab: usize,
) -> (Vec<Vec<f32>>, usize) {
    let mut queue: VecDeque<usize> = (0..requests.len()).collect();
    let mut active: Vec<Active> = Vec::new();
    let mut kept = Vec::new();
    let total_pages = r.pool_usage().pages;
    let mut steps = 0;
    while !queue.is_empty() || !active.is_empty() {
        // Admit while a slot is free and the pool can hold every admitted request to its end.
        while let Some(&next) = queue.front() {
            let reserved: usize = active.iter().map(|a| pages_for(&requests[a.req])).sum();
            let usage = r.pool_usage();
            if usage.sequences >= usage.max_sequences
                || reserved + pages_for(&requests[next]) > total_pages
            {
                break;
            }
            queue.pop_front();
            let seq = r.add_sequence().expect("a free slot");
            active.push(Active {
                req: next,
                seq,
                prefilled: 0,
                decoded: 0,
                next: 0,
                rows: Vec::new(),
            });
        }
        assert!(
            !active.is_empty(),
            "nothing admitted: a request outgrows the pool"
        );
        // One step: the next prompt chunk of each prefilling request, one token of each decoder.
        let chunks: Vec<Vec<i64>> = active
            .iter()
            .map(|a| {
                let p = &requests[a.req].prompt;
                if a.prefilled < p.len() {
                    p[a.prefilled..(a.prefilled + CHUNK).min(p.len())].to_vec()
                } else {
                    vec![a.next]
                }
            })
            .collect();
        let batch: Vec<(usize, &[i64])> = active
            .iter()
            .zip(&chunks)
            .map(|(a, c)| (a.seq, &c[..]))
            .collect();
        let outs = r.forward_batch(&batch).expect("a step");
        steps += 1;
        r.audit_pools().expect("pools consistent after a step");
        for ((a, c), out) in active.iter_mut().zip(&chunks).zip(&outs) {
            assert_eq!(out.logits.len(), c.len() * vocab);
            if keep == Some(a.req) {
                for t in 0..out.tokens {
                    a.rows.push(out.row(t).to_vec());
                }
            }
            if a.prefilled < requests[a.req].prompt.len() {
                a.prefilled += c.len();
            } else {
                a.decoded += 1;
            }
            a.next = argmax(out.row(out.tokens - 1)) % vocab as i64;
        }
        // Finished requests leave and give their pages and slot back.
        let mut i = 0;
        while i < active.len() {
            let a = &active[i];
            if a.prefilled == requests[a.req].prompt.len() && a.decoded == requests[a.req].decode {
                let a = active.swap_remove(i);
                r.release_sequence(a.seq).expect("release");
                if keep == Some(a.req) {
                    kept = a.rows;
                }
            } else {
                i += 1;
            }
        }
    }
    (kept, steps)
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

#[test]
fn serving_many_sequences_returns_every_page_and_slot_and_stays_flat() {
    let requests_per_model: usize = std::env::var("DAY0_ENDURANCE_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    // GQA + Gated DeltaNet; MLA + DSA; MLA + KDA.
    for name in ["qwen3_next", "deepseek_v32", "kimi_linear"] {
        let start = Instant::now();
        let launcher = Launcher::for_device("npu-910b").unwrap();
        let mut r = Runner::load_at(&tiny(name), launcher, CAPACITY, Precision::F32).unwrap();
        r.serve(MAX_SEQUENCES, POOL_TOKENS).unwrap();
        // Sequence 0 is not used: serving starts from empty pools.
        r.release_sequence(0).unwrap();
        let empty = r.pool_usage();
        assert_eq!(
            (empty.sequences, empty.pages_in_use, empty.slots_in_use),
            (0, 0, 0)
        );
        let vocab = r.config().vocab_size;

        let mut rng = Rng::new(0xe4d0 ^ name.len() as u64);
        let mut draw = |lo: usize, hi: usize| lo + (rng.next_u64() % (hi - lo + 1) as u64) as usize;
        let fixed = Request {
            prompt: (0..21)
                .map(|i| (i * 37 + 5) % (vocab as i64 - 1) + 1)
                .collect(),
            decode: 6,
        };
        let mut requests: Vec<Request> = (0..requests_per_model)
            .map(|_| {
                let n = draw(1, 70);
                let prompt = (0..n).map(|_| draw(1, vocab - 1) as i64).collect();
                Request {
                    prompt,
                    decode: draw(1, 24),
                }
            })
            .collect();
        // The fixed sequence also rides along mid-run, batched with the others.
        let mid = requests.len() / 2;
        requests.insert(mid, fixed.clone());

        let alone = std::slice::from_ref(&fixed);
        let (first, _) = serve(&mut r, alone, Some(0), vocab);
        // Warm-up: the first quarter of the requests, then the resident memory it settled at.
        let warm = requests.len() / 4;
        let (_, warm_steps) = serve(&mut r, &requests[..warm], None, vocab);
        let rss_warm = rss_bytes();
        let (batched, steps) = serve(&mut r, &requests[warm..], Some(mid - warm), vocab);
        let rss_end = rss_bytes();
        let (last, _) = serve(&mut r, alone, Some(0), vocab);

        // Every page and slot is back; the books agree.
        let usage = r.pool_usage();
        assert_eq!(
            (
                usage.sequences,
                usage.tokens,
                usage.pages_in_use,
                usage.slots_in_use
            ),
            (0, 0, 0, 0),
            "{name}: pools not empty after serving: {usage:?}"
        );
        r.audit_pools().unwrap();

        // The fixed sequence: identical alone at the start and the end, within rounding batched.
        assert_eq!(first.len(), fixed.prompt.len() + fixed.decode);
        assert!(
            first == last,
            "{name}: the fixed sequence's logits changed over the run"
        );
        assert_eq!(batched.len(), first.len());
        for (pos, (b, f)) in batched.iter().zip(&first).enumerate() {
            let d = rel_l2(b, f);
            assert!(
                d < 1e-5,
                "{name}: position {pos}: batched {d:.2e} from alone"
            );
        }

        // Resident memory: flat after warm-up (allocator slack allowed, not growth per sequence).
        if let (Some(w), Some(e)) = (rss_warm, rss_end) {
            let grown = e.saturating_sub(w);
            assert!(
                grown < 8 << 20,
                "{name}: resident memory grew {} MiB over {} requests after warm-up ({} → {} MiB)",
                grown >> 20,
                requests.len() - warm,
                w >> 20,
                e >> 20
            );
            eprintln!(
                "{name}: {} requests, {} steps ({} warm-up), RSS {} → {} MiB, {:.1} s",
                requests.len(),
                warm_steps + steps,
                warm_steps,
                w >> 20,
                e >> 20,
                start.elapsed().as_secs_f64()
            );
        }
    }
}
