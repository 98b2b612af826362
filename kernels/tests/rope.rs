//! RoPE: the kernel against the f64 reference (both pair layouts, partial spans at an offset),
//! the interleaved layout's equivalence with Hugging Face's de-interleave + half-split for
//! attention scores, and the host tables (`inv_freq`, `attention_factor`, `cos_sin`) against
//! golden data from transformers (`tests/reference/golden/rope.json`, made by
//! `tests/reference/gen_rope.py`; no Python needed).
//!
//! Tolerances: kernel f32 ≤ 1e-5 max relative error (reference RMS as the floor; two products
//! and a sum per element). Tables: `inv_freq` ≤ 5e-7 relative (a few f32 ulps: torch's vectorised
//! `pow` is not correctly rounded), `attention_factor` ≤ 1e-12, `cos`/`sin` ≤ 1e-6 absolute (the
//! same f32 angles; torch's f32 `cos`/`sin` are within an ulp or two).

use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::reference::{self, rel_error};
use kernels::rope::{attention_factor, cos_sin, inv_freq, rope, run_rope, RopeScalingParams};
use kernels::testdata::Rng;
use proptest::prelude::*;
use serde_json::Value;

const TOL: f64 = 1e-5;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

/// Random `x [tokens, heads·d]` and tables for random positions; runs `run_rope` and returns the
/// max relative error against the reference.
fn check(
    tokens: usize,
    heads: usize,
    d: usize,
    offset: usize,
    rot: usize,
    interleaved: bool,
    seed: u64,
) -> f64 {
    let mut rng = Rng::new(seed);
    let xv = rng.vec(tokens * heads * d, 1.0);
    let positions: Vec<usize> = (0..tokens)
        .map(|_| (rng.next_u64() % 5000) as usize)
        .collect();
    let freqs = inv_freq(rot, 10000.0, &RopeScalingParams::None);
    let (cv, sv) = cos_sin(&positions, &freqs, 1.0);
    let t = |shape: &[usize], v: &[f32]| Tensor::<f32>::from_f32(shape, v).unwrap();
    let out = Tensor::<f32>::poisoned(&[tokens, heads * d]);
    run_rope(
        &launcher(),
        &t(&[tokens, heads * d], &xv),
        &t(&[tokens, rot / 2], &cv),
        &t(&[tokens, rot / 2], &sv),
        &out,
        d,
        offset,
        rot,
        interleaved,
    )
    .unwrap();
    let want = reference::rope(&xv, &cv, &sv, tokens, d, offset, rot, interleaved);
    rel_error(&out.to_vec().unwrap(), &want)
}

/// (head dim, rotated dims) pairs the kernel declares, from DeepSeek (192 with 64 rotated, 64),
/// Qwen3-Next (256 with 64, 16 with 4) and tiny checkpoints.
fn head_spans() -> Vec<(usize, usize)> {
    vec![
        (16, 4),
        (16, 16),
        (24, 8),
        (32, 16),
        (32, 8),
        (48, 16),
        (64, 64),
        (96, 48),
        (128, 64),
        (192, 64),
        (256, 64),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn matches_reference(
        tokens in 1usize..40,
        heads in 1usize..5,
        (d, rot) in prop::sample::select(head_spans()),
        at in 0usize..1000,
        interleaved in any::<bool>(),
        seed in any::<u64>(),
    ) {
        // Any offset that keeps the span inside the head.
        let offset = at % (d - rot + 1);
        let err = check(tokens, heads, d, offset, rot, interleaved, seed);
        prop_assert!(err <= TOL, "T={tokens} H={heads} D={d} span {offset}+{rot} interleaved={interleaved}: {err}");
    }
}

/// The two spans of real models at their real offsets, both layouts.
#[test]
fn deepseek_and_qwen_spans() {
    for (d, offset, rot) in [(192, 128, 64), (64, 0, 64), (256, 0, 64)] {
        for interleaved in [false, true] {
            let err = check(5, 3, d, offset, rot, interleaved, 7);
            assert!(
                err <= TOL,
                "D={d} {offset}+{rot} interleaved={interleaved}: {err}"
            );
        }
    }
}

/// `out` = `x` (in place) gives the same numbers as a separate output, in both layouts.
#[test]
fn in_place_equals_out_of_place() {
    let (tokens, heads, d, offset, rot) = (7usize, 3usize, 48usize, 16usize, 16usize);
    let xv = Rng::new(11).vec(tokens * heads * d, 1.0);
    let positions: Vec<usize> = (0..tokens).map(|t| 5 * t).collect();
    let (cv, sv) = cos_sin(
        &positions,
        &inv_freq(rot, 1e4, &RopeScalingParams::None),
        1.0,
    );
    let t = |shape: &[usize], v: &[f32]| Tensor::<f32>::from_f32(shape, v).unwrap();
    let (c, s) = (t(&[tokens, rot / 2], &cv), t(&[tokens, rot / 2], &sv));
    for interleaved in [false, true] {
        let x = t(&[tokens, heads * d], &xv);
        let out = Tensor::<f32>::poisoned(&[tokens, heads * d]);
        run_rope(&launcher(), &x, &c, &s, &out, d, offset, rot, interleaved).unwrap();
        run_rope(
            &launcher(),
            &x,
            &c,
            &s,
            &x.clone(),
            d,
            offset,
            rot,
            interleaved,
        )
        .unwrap();
        assert_eq!(
            x.to_vec().unwrap(),
            out.to_vec().unwrap(),
            "interleaved={interleaved}"
        );
    }
}

/// Interleaved rotation in place vs Hugging Face's de-interleave (the same permutation of q and
/// k) followed by half-split rotation: the q·k scores agree (to f64 rounding).
#[test]
fn interleaved_scores_equal_hf_deinterleave_then_half_split() {
    let (tokens, d) = (6usize, 16usize);
    let mut rng = Rng::new(3);
    let (q, k) = (rng.vec(tokens * d, 1.0), rng.vec(tokens * d, 1.0));
    let positions: Vec<usize> = (0..tokens).map(|t| 3 * t + 1).collect();
    let (c, s) = cos_sin(
        &positions,
        &inv_freq(d, 10000.0, &RopeScalingParams::None),
        1.0,
    );
    // HF: x.view(d/2, 2).transpose → evens then odds.
    let deinterleave = |x: &[f32]| -> Vec<f32> {
        x.chunks_exact(d)
            .flat_map(|row| {
                let even = row.iter().step_by(2).copied();
                let odd = row.iter().skip(1).step_by(2).copied();
                even.chain(odd).collect::<Vec<f32>>()
            })
            .collect()
    };
    let ours_q = reference::rope(&q, &c, &s, tokens, d, 0, d, true);
    let ours_k = reference::rope(&k, &c, &s, tokens, d, 0, d, true);
    let hf_q = reference::rope(&deinterleave(&q), &c, &s, tokens, d, 0, d, false);
    let hf_k = reference::rope(&deinterleave(&k), &c, &s, tokens, d, 0, d, false);
    let dot = |a: &[f64], b: &[f64], i: usize, j: usize| -> f64 {
        (0..d).map(|e| a[i * d + e] * b[j * d + e]).sum()
    };
    for i in 0..tokens {
        for j in 0..tokens {
            let (ours, hf) = (dot(&ours_q, &ours_k, i, j), dot(&hf_q, &hf_k, i, j));
            assert!(
                (ours - hf).abs() <= 1e-12 * (1.0 + hf.abs()),
                "({i},{j}): {ours} vs {hf}"
            );
        }
    }
    // The rotated vectors themselves differ (by the permutation): the comparison is not vacuous.
    assert!(ours_q.iter().zip(&hf_q).any(|(a, b)| a != b));
}

#[test]
fn bad_shapes_are_launch_errors() {
    let l = launcher();
    let t = |shape: &[usize]| Tensor::<f32>::poisoned(shape);
    // (head_dim, offset, rot_dim, x shape, cos/sin shape, words the message must hold)
    type Case = (usize, usize, usize, [usize; 2], [usize; 2], &'static str);
    let cases: [Case; 6] = [
        (0, 0, 2, [2, 40], [2, 1], "head dimension 0"),
        (32, 20, 16, [2, 64], [2, 8], "inside the head"),
        (32, 0, 7, [2, 64], [2, 3], "even width"),
        (32, 0, 34, [2, 64], [2, 17], "inside the head"),
        (32, 0, 16, [2, 70], [2, 8], "whole number of heads"),
        (32, 0, 16, [2, 64], [3, 8], "cos is"),
    ];
    for (d, off, rot, xs, cs, words) in cases {
        let x = t(&xs);
        match run_rope(&l, &x, &t(&cs), &t(&cs), &x.clone(), d, off, rot, false) {
            Err(SimError::Launch { message, .. }) => assert!(message.contains(words), "{message}"),
            other => panic!("{words}: expected a launch error, got {other:?}"),
        }
    }
}

#[test]
fn cost_only_cycles_equal_functional() {
    let (tokens, heads, d, rot) = (9, 4, 192, 64);
    let x = Tensor::<f32>::from_f32(
        &[tokens, heads * d],
        &Rng::new(5).vec(tokens * heads * d, 1.0),
    )
    .unwrap();
    let (c, s) = cos_sin(
        &[0, 1, 2, 3, 4, 5, 6, 7, 8],
        &inv_freq(rot, 1e4, &RopeScalingParams::None),
        1.0,
    );
    let ct = Tensor::<f32>::from_f32(&[tokens, rot / 2], &c).unwrap();
    let st = Tensor::<f32>::from_f32(&[tokens, rot / 2], &s).unwrap();
    let out = Tensor::<f32>::poisoned(&[tokens, heads * d]);
    let f = run_rope(&launcher(), &x, &ct, &st, &out, d, 128, rot, true).unwrap();
    let so = |shape: &[usize]| Tensor::<f32>::shape_only(shape);
    let c = run_rope(
        &launcher().with_backend(Backend::CostOnly),
        &so(&[tokens, heads * d]),
        &so(&[tokens, rot / 2]),
        &so(&[tokens, rot / 2]),
        &so(&[tokens, heads * d]),
        d,
        128,
        rot,
        true,
    )
    .unwrap();
    assert!(f.report.cycles > 0);
    assert_eq!(f.report.cycles, c.report.cycles);
}

#[test]
fn registered() {
    let imps = kernels::registry::implementations("rope");
    assert_eq!(imps.len(), 1);
    assert_eq!(imps[0].meta.name, rope::META.name);
}

// ---------------------------------------------------------------------------------------------
// Golden tables from transformers.
// ---------------------------------------------------------------------------------------------

fn golden() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/reference/golden/rope.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn scaling(v: &Value) -> RopeScalingParams {
    let f = |k: &str| v[k].as_f64().unwrap();
    match v["type"].as_str().unwrap() {
        "none" => RopeScalingParams::None,
        "linear" => RopeScalingParams::Linear {
            factor: f("factor"),
        },
        "yarn" => RopeScalingParams::Yarn {
            factor: f("factor"),
            original_max_position_embeddings: v["original_max_position_embeddings"]
                .as_u64()
                .unwrap() as usize,
            beta_fast: f("beta_fast"),
            beta_slow: f("beta_slow"),
            mscale: f("mscale"),
            mscale_all_dim: f("mscale_all_dim"),
            truncate: v["truncate"].as_bool().unwrap(),
        },
        "llama3" => RopeScalingParams::Llama3 {
            factor: f("factor"),
            low_freq_factor: f("low_freq_factor"),
            high_freq_factor: f("high_freq_factor"),
            original_max_position_embeddings: v["original_max_position_embeddings"]
                .as_u64()
                .unwrap() as usize,
        },
        other => panic!("unknown scaling {other}"),
    }
}

#[test]
fn tables_match_transformers() {
    let g = golden();
    let cases = g["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 8);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let rot = case["rot_dim"].as_u64().unwrap() as usize;
        let theta = case["theta"].as_f64().unwrap();
        let sc = scaling(&case["scaling"]);
        let freqs = inv_freq(rot, theta, &sc);
        let want = floats(&case["inv_freq"]);
        assert_eq!(freqs.len(), want.len(), "{name}");
        for (i, (got, want)) in freqs.iter().zip(&want).enumerate() {
            assert!(
                (got - want).abs() <= 5e-7 * want.abs(),
                "{name} inv_freq[{i}]: {got} vs {want}"
            );
        }
        let af = attention_factor(&sc);
        let want_af = case["attention_factor"].as_f64().unwrap();
        assert!(
            (af - want_af).abs() <= 1e-12,
            "{name} attention factor: {af} vs {want_af}"
        );
        let positions: Vec<usize> = case["positions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_u64().unwrap() as usize)
            .collect();
        // The tables from torch's own frequencies, so this compares cos_sin alone.
        let (c, s) = cos_sin(&positions, &want, want_af);
        for (what, got, want) in [
            ("cos", c, floats(&case["cos"])),
            ("sin", s, floats(&case["sin"])),
        ] {
            assert_eq!(got.len(), want.len(), "{name} {what}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (*g as f64 - w).abs() <= 1e-6,
                    "{name} {what}[{i}]: {g} vs {w}"
                );
            }
        }
    }
}

/// A YaRN configuration with `mscale` ≠ `mscale_all_dim` really scales the tables (the golden
/// data has one), and DeepSeek-V3's (both 1.0) does not.
#[test]
fn yarn_attention_factor_cases() {
    let yarn = |mscale: f64, all: f64| RopeScalingParams::Yarn {
        factor: 40.0,
        original_max_position_embeddings: 4096,
        beta_fast: 32.0,
        beta_slow: 1.0,
        mscale,
        mscale_all_dim: all,
        truncate: true,
    };
    assert_eq!(attention_factor(&yarn(1.0, 1.0)), 1.0);
    let expected = (0.1 * 0.707 * 40f64.ln() + 1.0) / (0.1 * 40f64.ln() + 1.0);
    assert!((attention_factor(&yarn(0.707, 1.0)) - expected).abs() < 1e-15);
    assert!((attention_factor(&yarn(0.0, 0.0)) - (0.1 * 40f64.ln() + 1.0)).abs() < 1e-15);
    assert_eq!(
        attention_factor(&RopeScalingParams::Linear { factor: 4.0 }),
        1.0
    );
}
