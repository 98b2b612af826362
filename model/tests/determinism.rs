//! Issue #16 item 7: the model's numbers and cycle counts are the same at any thread count and on
//! every run — the functional forward (logits bit for bit, every operator's launches and cycles)
//! and the cost-only forward at production scale. Launches run their programs on the current
//! rayon pool, so each run is made inside a pool of a given size.

use dsl_core::Launcher;
use model::config::load_config;
use model::forward::{CostRun, OpStats, Precision, Runner};
use std::path::PathBuf;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool")
        .install(f)
}

/// A prompt, then three decode steps: every logit's bits and the operators' books.
fn functional(name: &str, precision: Precision) -> (Vec<u32>, OpStats) {
    let mut r = Runner::load_at(
        &testdata(&format!("tiny/{name}")),
        Launcher::for_device("npu-910b").unwrap(),
        16,
        precision,
    )
    .unwrap();
    let mut bits: Vec<u32> = Vec::new();
    let out = r.forward(&[3, 17, 42, 5, 99, 7, 64, 11, 2]).unwrap();
    bits.extend(out.logits.iter().map(|v| v.to_bits()));
    for tok in [8, 150, 33] {
        let out = r.forward(&[tok]).unwrap();
        bits.extend(out.logits.iter().map(|v| v.to_bits()));
    }
    (bits, r.stats().clone())
}

#[test]
fn the_functional_forward_is_identical_at_one_and_three_threads_and_on_every_run() {
    for (name, precision) in [
        ("deepseek_v32", Precision::F32),
        ("qwen3_next", Precision::Native),
        ("kimi_linear", Precision::F32),
    ] {
        let one = in_pool(1, || functional(name, precision));
        let three = in_pool(3, || functional(name, precision));
        let again = in_pool(3, || functional(name, precision));
        assert!(
            one.0.iter().all(|b| f32::from_bits(*b).is_finite()),
            "{name}"
        );
        assert_eq!(
            one.0, three.0,
            "{name}: logits differ between 1 and 3 threads"
        );
        assert_eq!(
            one.1, three.1,
            "{name}: books differ between 1 and 3 threads"
        );
        assert_eq!(three.0, again.0, "{name}: logits differ between two runs");
        assert_eq!(three.1, again.1, "{name}: books differ between two runs");
    }
}

fn cost(rel: &str) -> CostRun {
    let cfg = load_config(&testdata(rel)).unwrap();
    let mut r = Runner::cost_only(cfg, Launcher::for_device("npu-910b").unwrap(), 300).unwrap();
    r.cost_run(256, 3).unwrap()
}

#[test]
fn the_cost_only_forward_is_identical_at_one_and_three_threads_and_on_every_run() {
    for rel in ["kimi_k2_config.json", "deepseek_v32_config.json"] {
        let one = in_pool(1, || cost(rel));
        let three = in_pool(3, || cost(rel));
        let again = in_pool(3, || cost(rel));
        assert!(one.decode.total_cycles() > 0, "{rel}");
        assert_eq!(one.prefill, three.prefill, "{rel}: prefill, 1 vs 3 threads");
        assert_eq!(one.decode, three.decode, "{rel}: decode, 1 vs 3 threads");
        assert_eq!(three.prefill, again.prefill, "{rel}: prefill, two runs");
        assert_eq!(three.decode, again.decode, "{rel}: decode, two runs");
    }
}
