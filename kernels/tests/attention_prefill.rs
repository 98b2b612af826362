//! Flash prefill attention against the f64 reference, chunked == one-shot, determinism.
//!
//! Tolerances: f32 inputs ≤ 1e-5 relative; bf16 inputs ≤ 1e-2 (the kernel feeds the softmax
//! probabilities to the matrix unit in bf16, as flash attention does, while the reference keeps
//! them in f64). Relative to the larger of the output's and the values' RMS: an output row is an
//! average of value rows and can cancel to near zero, but its rounding error scales with the
//! values averaged (with the output RMS alone, bf16 cases with long contexts and head dim 16 came
//! out at 1.1e-2 about once in twenty runs).

use dsl_core::prelude::*;
use kernels::attention::prefill::{
    flash_prefill, run_prefill, run_prefill_with, PrefillCase, PrefillKernel,
};
use kernels::attention::sinks_tensor;
use kernels::gemm::GemmDtype;
use kernels::testdata::Rng;
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20))]

    /// Causal, and over sliding windows (of one key, inside a key tile, across tiles), against
    /// the f64 reference.
    #[test]
    fn prefill_matches_reference(
        kv_heads in 1usize..3, group in prop::sample::select(vec![1usize, 2, 4]),
        head_dim in prop::sample::select(vec![16usize, 32, 64]),
        sq in 1usize..90, extra in 0usize..60,
        bq in prop::sample::select(vec![16i64, 32, 64]), bk in prop::sample::select(vec![16i64, 32, 64]),
        bf16 in any::<bool>(), seed in any::<u64>(),
        window in prop::sample::select(vec![0usize, 0, 1, 5, 16, 40]), sinks in any::<bool>(),
    ) {
        let case = PrefillCase {
            window, sinks,
            heads: kv_heads * group, kv_heads, head_dim, v_head_dim: head_dim, sq, skv: sq + extra,
            dtype: if bf16 { GemmDtype::Bf16 } else { GemmDtype::F32 },
            config: Config::new().with("BQ", bq).with("BK", bk), seed,
        };
        let run = run_prefill(&launcher(), &case).unwrap();
        let err = run.launch.report.max_rel_error.unwrap();
        let tol = if bf16 { 1e-2 } else { 1e-5 };
        prop_assert!(err <= tol, "{case:?}: {err}");
    }
}

#[test]
fn chunked_prefill_equals_one_shot() {
    let (s, h, hkv, d) = (150usize, 4usize, 2usize, 32usize);
    let mut rng = Rng::new(11);
    let qv = rng.vec(s * h * d, 1.0);
    let kv = rng.vec(s * hkv * d, 1.0);
    let vv = rng.vec(s * hkv * d, 1.0);
    let cfg = Config::new()
        .with("BQ", 32)
        .with("BK", 32)
        .with("BD", d as i64)
        .with("BDV", d as i64);
    let scale = 1.0 / (d as f32).sqrt();
    let rows = |v: &[f32], r0: usize, r1: usize, w: usize| v[r0 * w..r1 * w].to_vec();
    let run = |q: &[f32], k: &[f32], v: &[f32], sq: usize, skv: usize| {
        let q = Tensor::<f32>::from_f32(&[sq, h * d], q).unwrap();
        let k = Tensor::<f32>::from_f32(&[skv, hkv * d], k).unwrap();
        let v = Tensor::<f32>::from_f32(&[skv, hkv * d], v).unwrap();
        let o = Tensor::<f32>::poisoned(&[sq, h * d]);
        let sinks = sinks_tensor(&launcher(), "flash_prefill", h, None).unwrap();
        flash_prefill::launch(
            &launcher(),
            &cfg,
            &q,
            &k,
            &v,
            &o,
            d,
            d,
            scale,
            true,
            0,
            &sinks,
        )
        .unwrap();
        o.to_vec().unwrap()
    };
    let whole = run(&qv, &kv, &vv, s, s);
    for chunks in [
        vec![0, 150],
        vec![0, 64, 150],
        vec![0, 1, 17, 100, 149, 150],
    ] {
        let mut got = Vec::new();
        for w in chunks.windows(2) {
            let (a, b) = (w[0], w[1]);
            got.extend(run(
                &rows(&qv, a, b, h * d),
                &rows(&kv, 0, b, hkv * d),
                &rows(&vv, 0, b, hkv * d),
                b - a,
                b,
            ));
        }
        let worst = got
            .iter()
            .zip(&whole)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(worst <= 1e-5, "chunks {chunks:?}: max abs diff {worst}");
    }
}

#[test]
fn prefill_is_deterministic_and_cost_only_matches() {
    let case = PrefillCase {
        window: 0,
        sinks: false,
        heads: 4,
        kv_heads: 1,
        head_dim: 64,
        v_head_dim: 64,
        sq: 77,
        skv: 130,
        dtype: GemmDtype::Bf16,
        config: Config::new(),
        seed: 5,
    };
    let one = run_prefill(&launcher().with_threads(1), &case).unwrap();
    let two = run_prefill(&launcher().with_threads(2), &case).unwrap();
    assert_eq!(one.launch.report, two.launch.report);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(one.output.as_ref().unwrap()),
        bits(two.output.as_ref().unwrap())
    );
    let cost = run_prefill(&launcher().with_backend(Backend::CostOnly), &case).unwrap();
    assert_eq!(cost.launch.report.cycles, one.launch.report.cycles);
}

#[test]
fn bad_shapes_are_errors() {
    let mut case = PrefillCase {
        window: 0,
        sinks: false,
        heads: 3,
        kv_heads: 2,
        head_dim: 64,
        v_head_dim: 64,
        sq: 8,
        skv: 8,
        dtype: GemmDtype::F32,
        config: Config::new(),
        seed: 1,
    };
    assert!(
        run_prefill(&launcher(), &case).is_err(),
        "kv_heads must divide heads"
    );
    case.kv_heads = 1;
    case.skv = 4;
    assert!(run_prefill(&launcher(), &case).is_err(), "sq > skv");
    case.skv = 8;
    // A head dim above the largest tile is refused, naming the dimension.
    case.head_dim = 600;
    let e = run_prefill(&launcher(), &case).unwrap_err().to_string();
    assert!(e.contains("head_dim = 600"), "{e}");
    // An awkward head dim runs in a covering tile.
    case.head_dim = 48;
    let run = run_prefill(&launcher(), &case).unwrap();
    assert!(run.launch.report.max_rel_error.unwrap() <= 1e-5);
    // A tile too small for the head is refused by the kernel's `require`, not a partial answer.
    case.config = Config::new().with("BD", 32).with("BDV", 32);
    let e = run_prefill(&launcher(), &case).unwrap_err().to_string();
    assert!(e.contains("no tile configuration"), "{e}");
    // Launched directly with that tile, the kernel's own `require` refuses it.
    let t = |r: usize, c: usize| Tensor::<f32>::from_f32(&[r, c], &vec![0.5; r * c]).unwrap();
    let o = Tensor::<f32>::poisoned(&[8, 48]);
    let cfg = Config::new().with("BD", 32).with("BDV", 32);
    let e = flash_prefill::launch(
        &launcher(),
        &cfg,
        &t(8, 48),
        &t(8, 48),
        &t(8, 48),
        &o,
        48,
        48,
        0.1,
        true,
        0,
        &sinks_tensor(&launcher(), "flash_prefill", 1, None).unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("requirement not met"), "{e}");
}

/// MLA's naive prefill form: per-head keys of `nope + rope = 192` values, values of 128.
#[test]
fn mla_naive_prefill_shapes() {
    let case = PrefillCase {
        window: 0,
        sinks: false,
        heads: 4,
        kv_heads: 4,
        head_dim: 192,
        v_head_dim: 128,
        sq: 70,
        skv: 90,
        dtype: GemmDtype::F32,
        config: Config::new(),
        seed: 12,
    };
    let err = run_prefill(&launcher(), &case)
        .unwrap()
        .launch
        .report
        .max_rel_error
        .unwrap();
    assert!(err <= 1e-5, "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20))]

    /// The software-pipelined prefill (FA3's schedule) against the same f64 reference and
    /// tolerances, on ragged lengths (a block past the keys is issued and must add nothing),
    /// GQA groups and both dtypes; it must also give the plain kernel's numbers exactly (same
    /// products, same online-softmax order), and cost-only its cycles.
    #[test]
    fn pipelined_prefill_matches_reference(
        kv_heads in 1usize..3, group in prop::sample::select(vec![1usize, 2, 4]),
        head_dim in prop::sample::select(vec![16usize, 32, 64, 100]),
        sq in 1usize..90, extra in 0usize..60,
        bq in prop::sample::select(vec![16i64, 64]), bk in prop::sample::select(vec![16i64, 64]),
        bf16 in any::<bool>(), seed in any::<u64>(),
        window in prop::sample::select(vec![0usize, 0, 1, 5, 16, 40]), sinks in any::<bool>(),
    ) {
        let case = PrefillCase {
            window, sinks,
            heads: kv_heads * group, kv_heads, head_dim, v_head_dim: head_dim, sq, skv: sq + extra,
            dtype: if bf16 { GemmDtype::Bf16 } else { GemmDtype::F32 },
            config: Config::new().with("BQ", bq).with("BK", bk), seed,
        };
        let run = run_prefill_with(&launcher(), &case, PrefillKernel::Pipelined).unwrap();
        let out = run.output.as_ref().unwrap();
        prop_assert!(out.iter().all(|v| v.is_finite()), "an output element was not written");
        let err = run.launch.report.max_rel_error.unwrap();
        let tol = if bf16 { 1e-2 } else { 1e-5 };
        prop_assert!(err <= tol, "{case:?}: {err}");
        let plain = run_prefill_with(&launcher(), &case, PrefillKernel::Flash).unwrap();
        prop_assert_eq!(&plain.output, &run.output);
        let cost = run_prefill_with(
            &launcher().with_backend(Backend::CostOnly), &case, PrefillKernel::Pipelined,
        ).unwrap();
        prop_assert_eq!(cost.launch.report.cycles, run.launch.report.cycles);
    }
}

/// A window changes the output (it is not silently ignored) and both kernels agree on it, with
/// query tiles whose later rows see no key in the tile's first key blocks.
#[test]
fn windowed_prefill_differs_from_causal_and_both_kernels_agree() {
    let case = |window| PrefillCase {
        window,
        sinks: false,
        heads: 2,
        kv_heads: 1,
        head_dim: 32,
        v_head_dim: 32,
        sq: 100,
        skv: 100,
        dtype: GemmDtype::F32,
        config: Config::new().with("BQ", 64).with("BK", 16),
        seed: 5,
    };
    let windowed = run_prefill(&launcher(), &case(7)).unwrap();
    assert!(windowed.launch.report.max_rel_error.unwrap() <= 1e-5);
    let causal = run_prefill(&launcher(), &case(0)).unwrap();
    let (w, c) = (windowed.output.unwrap(), causal.output.unwrap());
    // The first 7 queries see the same keys either way; later ones do not.
    assert_eq!(w[..7 * 64], c[..7 * 64]);
    assert!(w[90 * 64..].iter().zip(&c[90 * 64..]).any(|(a, b)| a != b));
    let pipelined = run_prefill_with(&launcher(), &case(7), PrefillKernel::Pipelined).unwrap();
    assert_eq!(pipelined.output.unwrap(), w);
    // Cost: a window reads fewer key blocks than the whole causal prefix.
    assert!(windowed.launch.report.cycles < causal.launch.report.cycles);
}

/// Attention sinks (gpt-oss) change the output (they are not silently ignored), match the f64
/// reference in both kernels, windowed or not, and the two kernels agree exactly.
#[test]
fn sinks_change_the_output_and_both_kernels_agree() {
    for window in [0usize, 9] {
        let case = |sinks| PrefillCase {
            window,
            sinks,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            v_head_dim: 32,
            sq: 70,
            skv: 90,
            dtype: GemmDtype::F32,
            config: Config::new().with("BQ", 64).with("BK", 16),
            seed: 8,
        };
        let with = run_prefill(&launcher(), &case(true)).unwrap();
        assert!(with.launch.report.max_rel_error.unwrap() <= 1e-5);
        let without = run_prefill(&launcher(), &case(false)).unwrap();
        let (a, b) = (with.output.unwrap(), without.output.unwrap());
        assert!(a.iter().zip(&b).any(|(x, y)| x != y));
        let pipelined =
            run_prefill_with(&launcher(), &case(true), PrefillKernel::Pipelined).unwrap();
        assert_eq!(pipelined.output.unwrap(), a);
    }
}
