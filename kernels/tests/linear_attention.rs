//! The linear-attention DSL kernels (recurrent and chunked gated delta rule, GDN and KDA) against
//! the f64 recurrence on random inputs with a non-zero initial state, NaN-poisoned outputs.
//!
//! Tolerances: f32 inputs ≤ 1e-5 relative (to the output RMS), output and final state both; bf16
//! inputs ≤ 1e-2 (the output is rounded to bf16). Chunked kernels are compared with the
//! *recurrent* reference, so "chunked == recurrent" holds in f32 too, for chunk sizes 16/32/64 and
//! lengths not divisible by the chunk. Also: prefill (chunked) then decode (recurrent) with the
//! state updated in place equals one pass; cost-only runs give the same cycles as functional ones;
//! bad shapes are errors.

use dsl_core::prelude::*;
use kernels::gemm::GemmDtype;
use kernels::linear_attention::reference::{recurrent_gated_delta, widen, Decay, DeltaInputs};
use kernels::linear_attention::runner::{
    chunk_sweep, launch_delta, run_delta, DeltaCase, DeltaMode, DeltaTensors,
};
use kernels::reference::rel_error;
use kernels::testdata::Rng;
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

#[allow(clippy::too_many_arguments)]
fn case(
    decay: Decay,
    mode: DeltaMode,
    seq: usize,
    k_heads: usize,
    v_heads: usize,
    dk: usize,
    dv: usize,
    chunk: i64,
    seed: u64,
) -> DeltaCase {
    DeltaCase {
        decay,
        mode,
        seq,
        k_heads,
        v_heads,
        dk,
        dv,
        dtype: GemmDtype::F32,
        config: if mode == DeltaMode::Chunked {
            Config::new().with("C", chunk)
        } else {
            Config::new()
        },
        seed,
    }
}

fn decay_of(kda: bool) -> Decay {
    if kda {
        Decay::PerChannel
    } else {
        Decay::Scalar
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn recurrent_matches_reference(
        k_heads in 1usize..3, group in prop::sample::select(vec![1usize, 2]),
        dk in prop::sample::select(vec![16usize, 32]),
        dv in prop::sample::select(vec![16usize, 32]),
        seq in 1usize..40, kda in any::<bool>(), bf16 in any::<bool>(), seed in any::<u64>(),
    ) {
        let hv = k_heads * group;
        let mut c = case(decay_of(kda), DeltaMode::Recurrent, seq, k_heads, hv, dk, dv, 0, seed);
        if bf16 { c.dtype = GemmDtype::Bf16; }
        let run = run_delta(&launcher(), &c).unwrap();
        let err = run.launch.report.max_rel_error.unwrap();
        prop_assert!(err <= if bf16 { 1e-2 } else { 1e-5 }, "{c:?}: {err}");
    }

    #[test]
    fn chunked_matches_recurrent_reference(
        k_heads in 1usize..3, group in prop::sample::select(vec![1usize, 2]),
        dk in prop::sample::select(vec![16usize, 32, 64]),
        dv in prop::sample::select(vec![16usize, 32]),
        seq in 1usize..300, chunk in prop::sample::select(vec![16i64, 32, 64]),
        kda in any::<bool>(), seed in any::<u64>(),
    ) {
        let hv = k_heads * group;
        let c = case(decay_of(kda), DeltaMode::Chunked, seq, k_heads, hv, dk, dv, chunk, seed);
        let run = run_delta(&launcher(), &c).unwrap();
        let err = run.launch.report.max_rel_error.unwrap();
        prop_assert!(err <= 1e-5, "{c:?}: {err}");
    }
}

#[test]
fn chunked_lengths_around_chunk_boundaries() {
    // Every chunk size against lengths just below, at and above its multiples (and 1, 299, 300).
    for kda in [false, true] {
        for chunk in [16i64, 32, 64] {
            let cs = chunk as usize;
            for seq in [1, cs - 1, cs, cs + 1, 2 * cs + 3, 299, 300] {
                let c = case(
                    decay_of(kda),
                    DeltaMode::Chunked,
                    seq,
                    1,
                    2,
                    32,
                    16,
                    chunk,
                    seq as u64,
                );
                let err = run_delta(&launcher(), &c)
                    .unwrap()
                    .launch
                    .report
                    .max_rel_error
                    .unwrap();
                assert!(err <= 1e-5, "kda {kda} chunk {chunk} seq {seq}: {err}");
            }
        }
    }
}

#[test]
fn realistic_head_dims_and_bf16() {
    // Qwen3-Next's linear-attention heads: dk = dv = 128, 2 value heads per key head.
    for mode in [DeltaMode::Recurrent, DeltaMode::Chunked] {
        for (dtype, tol) in [(GemmDtype::F32, 1e-5), (GemmDtype::Bf16, 1e-2)] {
            let mut c = case(Decay::Scalar, mode, 70, 1, 2, 128, 128, 64, 5);
            c.dtype = dtype;
            let err = run_delta(&launcher(), &c)
                .unwrap()
                .launch
                .report
                .max_rel_error
                .unwrap();
            assert!(err <= tol, "{mode:?} {dtype:?}: {err}");
        }
    }
}

/// Prefill of `n` tokens (chunked kernel) then decode of the rest one token at a time (recurrent
/// kernel), the state tensor updated in place between calls, against the f64 recurrence over the
/// whole sequence.
fn prefill_then_decode(decay: Decay, n: usize, m: usize) {
    let (hk, hv, dk, dv) = (1usize, 2usize, 32usize, 16usize);
    let gw = if decay == Decay::Scalar { 1 } else { dk };
    let total = n + m;
    let mut rng = Rng::new(99);
    let q = rng.vec(total * hk * dk, 1.0);
    let k = rng.vec(total * hk * dk, 1.0);
    let v = rng.vec(total * hv * dv, 1.0);
    let g: Vec<f32> = rng
        .vec(total * hv * gw, 0.15)
        .iter()
        .map(|x| x - 0.15)
        .collect();
    let beta: Vec<f32> = rng.vec(total * hv, 0.5).iter().map(|x| x + 0.5).collect();
    let s0 = rng.vec(hv * dk * dv, 0.5);
    let state = Tensor::<f32>::from_f32(&[hv * dk, dv], &s0).unwrap();
    let rows = |x: &[f32], a: usize, b: usize, w: usize| x[a * w..b * w].to_vec();
    let mut out = Vec::new();
    let mut step = |a: usize, b: usize, mode: DeltaMode| {
        let t =
            |x: &[f32], w: usize| Tensor::<f32>::from_f32(&[b - a, w], &rows(x, a, b, w)).unwrap();
        let tensors = DeltaTensors {
            q: t(&q, hk * dk),
            k: t(&k, hk * dk),
            v: t(&v, hv * dv),
            g: t(&g, hv * gw),
            beta: t(&beta, hv),
            state_in: state.clone(),
            state_out: state.clone(),
            o: Tensor::<f32>::poisoned(&[b - a, hv * dv]),
        };
        let cfg = Config::new().with("C", 32);
        launch_delta(&launcher(), decay, mode, &cfg, &tensors).unwrap();
        out.extend(tensors.o.to_vec().unwrap());
    };
    step(0, n, DeltaMode::Chunked);
    for t in n..total {
        step(t, t + 1, DeltaMode::Recurrent);
    }
    let shape = kernels::linear_attention::reference::DeltaShape {
        seq: total,
        k_heads: hk,
        v_heads: hv,
        dk,
        dv,
        decay,
        qk_l2norm: true,
    };
    let (qw, kw, vw, gw_, bw, sw) = (
        widen(&q),
        widen(&k),
        widen(&v),
        widen(&g),
        widen(&beta),
        widen(&s0),
    );
    let want = recurrent_gated_delta(
        &shape,
        &DeltaInputs {
            q: &qw,
            k: &kw,
            v: &vw,
            g: &gw_,
            beta: &bw,
            state: Some(&sw),
        },
    )
    .unwrap();
    let eo = rel_error(&out, &want.o);
    let es = rel_error(&state.to_vec().unwrap(), &want.state);
    assert!(
        eo <= 1e-5 && es <= 1e-5,
        "{decay:?} n {n} m {m}: o {eo}, state {es}"
    );
}

#[test]
fn prefill_then_decode_equals_one_pass() {
    for decay in [Decay::Scalar, Decay::PerChannel] {
        prefill_then_decode(decay, 45, 5);
        prefill_then_decode(decay, 64, 3);
    }
}

#[test]
fn cost_only_gives_the_same_cycles() {
    for mode in [DeltaMode::Recurrent, DeltaMode::Chunked] {
        for decay in [Decay::Scalar, Decay::PerChannel] {
            let c = case(decay, mode, 100, 2, 4, 64, 64, 32, 3);
            let f = run_delta(&launcher(), &c).unwrap();
            let cost = launcher().with_backend(Backend::CostOnly);
            let k = run_delta(&cost, &c).unwrap();
            assert!(k.output.is_none() && k.launch.report.max_rel_error.is_none());
            assert_eq!(
                f.launch.report.cycles, k.launch.report.cycles,
                "{mode:?} {decay:?}"
            );
            assert!(k.launch.report.cycles > 0);
        }
    }
}

#[test]
fn chunk_sweep_reports_every_chunk_size() {
    let c = case(
        Decay::Scalar,
        DeltaMode::Chunked,
        512,
        1,
        2,
        128,
        128,
        64,
        1,
    );
    let cost = launcher().with_backend(Backend::CostOnly);
    let points = chunk_sweep(&cost, &c);
    let sizes: Vec<usize> = points.iter().map(|p| p.chunk).collect();
    assert_eq!(sizes, vec![16, 32, 64]);
    for p in &points {
        let r = p.result.as_ref().unwrap();
        assert!(r.launch.report.cycles > 0 && r.launch.report.flop > 0);
    }
    // Bigger chunks do more matrix work per token (the C×C products and the inverse).
    let flops: Vec<u64> = points
        .iter()
        .map(|p| p.result.as_ref().unwrap().launch.report.matrix_flop)
        .collect();
    assert!(flops[0] < flops[1] && flops[1] < flops[2], "{flops:?}");
}

#[test]
fn bad_shapes_are_errors() {
    let l = launcher();
    // v_heads not a multiple of k_heads.
    assert!(run_delta(
        &l,
        &case(Decay::Scalar, DeltaMode::Recurrent, 4, 2, 3, 16, 16, 0, 1)
    )
    .is_err());
    // No tokens.
    assert!(run_delta(
        &l,
        &case(Decay::Scalar, DeltaMode::Chunked, 0, 1, 1, 16, 16, 16, 1)
    )
    .is_err());
    // A head dim no tile covers (the largest BDK is 256), a chunk size the kernel does not offer.
    let e = run_delta(
        &l,
        &case(Decay::Scalar, DeltaMode::Recurrent, 4, 1, 1, 300, 16, 0, 1),
    )
    .unwrap_err();
    assert!(e.to_string().contains("key head dim = 300"), "{e}");
    // An awkward head dim runs: covered by a wider tile, the padding masked.
    let r = run_delta(
        &l,
        &case(Decay::Scalar, DeltaMode::Recurrent, 4, 1, 2, 48, 20, 0, 1),
    )
    .unwrap();
    assert!(
        r.launch.report.max_rel_error.unwrap() < 1e-4,
        "{:?}",
        r.launch.report.max_rel_error
    );
    let e = run_delta(
        &l,
        &case(
            Decay::PerChannel,
            DeltaMode::Chunked,
            4,
            1,
            1,
            16,
            16,
            48,
            1,
        ),
    )
    .unwrap_err();
    assert!(e.to_string().contains('C'), "{e}");
}

mod conv {
    use super::*;
    use kernels::linear_attention::conv::{
        launch_short_conv_decode, run_model_short_conv, run_short_conv, short_conv4,
        short_conv_chunked, zero_state, ConvCase,
    };
    use kernels::linear_attention::reference::short_conv as conv_ref;

    /// `taps` random weights `[taps, ch]` (tap-major, as the kernels take them) and the
    /// reference's `[ch, taps]` transpose.
    fn weights(rng: &mut Rng, taps: usize, ch: usize) -> (Tensor<f32>, Vec<f64>) {
        let w = rng.vec(taps * ch, 0.5);
        let wt = kernels::reference::transpose(&w, taps, ch);
        (
            Tensor::<f32>::from_f32(&[taps, ch], &w).unwrap(),
            widen(&wt),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn short_conv_matches_reference(
            seq in 1usize..40, channels in 1usize..300,
            bc in prop::sample::select(vec![32i64, 128]),
            bf16 in any::<bool>(), seed in any::<u64>(),
        ) {
            let c = ConvCase {
                seq, channels,
                dtype: if bf16 { GemmDtype::Bf16 } else { GemmDtype::F32 },
                config: Config::new().with("BC", bc), seed,
            };
            let err = run_short_conv(&launcher(), &c).unwrap().launch.report.max_rel_error.unwrap();
            prop_assert!(err <= if bf16 { 1e-2 } else { 1e-6 }, "{c:?}: {err}");
        }

        /// What the model launches (`launch_short_conv`: the prompt form past one token, the
        /// one-token forms otherwise) at any tap count, checked by `run_model_short_conv` as
        /// `day0 run`'s layer checks use it.
        #[test]
        fn model_short_conv_matches_reference(
            seq in 1usize..80, channels in 1usize..300, taps in 1usize..9,
            bf16 in any::<bool>(), seed in any::<u64>(),
        ) {
            let c = ConvCase {
                seq, channels,
                dtype: if bf16 { GemmDtype::Bf16 } else { GemmDtype::F32 },
                config: Config::new(), seed,
            };
            let run = run_model_short_conv(&launcher(), &c, taps).unwrap();
            let err = run.launch.report.max_rel_error.unwrap();
            prop_assert!(err <= if bf16 { 1e-2 } else { 1e-6 }, "{c:?} taps {taps}: {err}");
            let want = if seq > 1 { "short_conv_chunked" } else if taps == 4 { "short_conv4" } else { "short_conv" };
            prop_assert_eq!(run.launch.report.kernel.as_str(), want);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// The prompt form, any tap count (1 tap has no state; 17 fills a 16-row token tile with
        /// history) and lengths around the token tile, the state updated in place (aliased), f32 ≤ 1e-6 and bf16 ≤ 1e-2 against the
        /// f64 reference, output poisoned.
        #[test]
        fn chunked_conv_matches_reference(
            seq in 1usize..150, channels in 1usize..200, taps in 1usize..18,
            bt in prop::sample::select(vec![16i64, 64]),
            bc in prop::sample::select(vec![16i64, 64, 128]),
            bf16 in any::<bool>(), seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let (w, wt) = weights(&mut rng, taps, channels);
            let hist = taps.saturating_sub(1).max(1);
            let xv = rng.vec(seq * channels, 1.0);
            let sv = rng.vec(hist * channels, 1.0);
            let state = Tensor::<f32>::from_f32(&[hist, channels], &sv).unwrap();
            let cfg = Config::new().with("BT", bt).with("BC", bc);
            let (got, new_state, want) = if bf16 {
                let x = Tensor::<bf16>::from_f32(&[seq, channels], &xv).unwrap();
                let y = Tensor::<bf16>::poisoned(&[seq, channels]);
                short_conv_chunked::launch(&launcher(), &cfg, &x, &w, &state, &state, &y)
                    .unwrap();
                (y.to_vec().unwrap(), state.to_vec().unwrap(), x.to_vec().unwrap())
            } else {
                let x = Tensor::<f32>::from_f32(&[seq, channels], &xv).unwrap();
                let y = Tensor::<f32>::poisoned(&[seq, channels]);
                short_conv_chunked::launch(&launcher(), &cfg, &x, &w, &state, &state, &y)
                    .unwrap();
                (y.to_vec().unwrap(), state.to_vec().unwrap(), x.to_vec().unwrap())
            };
            // One tap keeps a 1-row state the kernel never touches.
            let sv_ref = if taps == 1 { Vec::new() } else { widen(&sv) };
            let (want_y, want_s) = conv_ref(&widen(&want), &wt, &sv_ref, channels).unwrap();
            let tol = if bf16 { 1e-2 } else { 1e-6 };
            let err = rel_error(&got, &want_y);
            prop_assert!(err <= tol, "y: {err}");
            if taps > 1 {
                let err = rel_error(&new_state, &want_s);
                prop_assert!(err <= 1e-6, "state: {err}");
            }
        }

        /// The batched decode form: each sequence's token against its own slot (distinct slots
        /// drawn at random, some slots unused and left as they were), any tap count the history
        /// tile holds, several channel programs; equal to the reference one sequence at a time;
        /// output poisoned.
        #[test]
        fn decode_conv_batch_matches_reference(
            seqs in 1usize..9, channels in 1usize..1200, taps in 2usize..18, seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let (w, wt) = weights(&mut rng, taps, channels);
            let hist = taps - 1;
            let n_slots = seqs + 3;
            let xv = rng.vec(seqs * channels, 1.0);
            let sv = rng.vec(n_slots * hist * channels, 1.0);
            let x = Tensor::<f32>::from_f32(&[seqs, channels], &xv).unwrap();
            let states = Tensor::<f32>::from_f32(&[n_slots, hist, channels], &sv).unwrap();
            let y = Tensor::<f32>::poisoned(&[seqs, channels]);
            // Distinct slots in a random order: the first `seqs` of a seeded shuffle.
            let mut order: Vec<usize> = (0..n_slots).collect();
            for i in (1..n_slots).rev() {
                order.swap(i, (rng.vec(1, 1.0)[0].abs() * 1e6) as usize % (i + 1));
            }
            let slots: Vec<usize> = order[..seqs].to_vec();
            launch_short_conv_decode(&launcher(), &x, &w, &states, Some(&slots), &y).unwrap();
            let (got_y, got_s) = (y.to_vec().unwrap(), states.to_vec().unwrap());
            let per = hist * channels;
            let mut want_states = widen(&sv);
            for (s, &slot) in slots.iter().enumerate() {
                let old = &sv[slot * per..(slot + 1) * per];
                let (want_y, want_s) = conv_ref(
                    &widen(&xv[s * channels..(s + 1) * channels]), &wt, &widen(old), channels,
                ).unwrap();
                let err = rel_error(&got_y[s * channels..(s + 1) * channels], &want_y);
                prop_assert!(err <= 1e-6, "sequence {s}: {err}");
                want_states[slot * per..(slot + 1) * per].copy_from_slice(&want_s);
            }
            prop_assert!(rel_error(&got_s, &want_states) <= 1e-7);
        }
    }

    /// The prompt form and the per-token form sum the taps in one order: a prompt, then its
    /// continuation token by token, equals the whole prompt at once bit for bit.
    #[test]
    fn chunked_prompt_then_tokens_equals_one_pass() {
        let (seq, ch) = (150usize, 70usize);
        let mut rng = Rng::new(9);
        let xv = rng.vec(seq * ch, 1.0);
        let (w, _) = weights(&mut rng, 4, ch);
        let run = |parts: &[usize]| {
            let state = Tensor::<f32>::poisoned(&[3, ch]);
            zero_state::launch(&launcher(), &Config::new(), &state).unwrap();
            let mut out = Vec::new();
            let mut t0 = 0;
            for &n in parts {
                let x = Tensor::<f32>::from_f32(&[n, ch], &xv[t0 * ch..(t0 + n) * ch]).unwrap();
                let y = Tensor::<f32>::poisoned(&[n, ch]);
                kernels::linear_attention::conv::launch_short_conv(
                    &launcher(),
                    &x,
                    &w,
                    &state,
                    &state,
                    &y,
                )
                .unwrap();
                out.extend(y.to_vec().unwrap());
                t0 += n;
            }
            (out, state.to_vec().unwrap())
        };
        let whole = run(&[seq]);
        let mut parts = vec![100, 2, 37];
        parts.extend(std::iter::repeat_n(1, seq - 139));
        assert_eq!(run(&parts), whole);
    }

    #[test]
    fn decode_conv_refuses_bad_slots_and_shapes() {
        let ch = 8;
        let x = Tensor::<f32>::from_f32(&[2, ch], &[0.5; 16]).unwrap();
        let w = Tensor::<f32>::from_f32(&[4, ch], &[0.25; 32]).unwrap();
        let states = Tensor::<f32>::poisoned(&[2, 3, ch]);
        let y = Tensor::<f32>::poisoned(&[2, ch]);
        let err = |slots: Option<&[usize]>, states: &Tensor<f32>| {
            launch_short_conv_decode(&launcher(), &x, &w, states, slots, &y)
                .unwrap_err()
                .to_string()
        };
        assert!(err(Some(&[0, 2]), &states).contains("outside"));
        assert!(err(Some(&[1, 1]), &states).contains("share"));
        assert!(err(Some(&[0]), &states).contains("2 sequences"));
        assert!(err(None, &Tensor::<f32>::poisoned(&[1, 3, ch])).contains("outside"));
        assert!(err(None, &Tensor::<f32>::poisoned(&[2, 2, ch])).contains("[slots, 3, 8]"));
        let w18 = Tensor::<f32>::from_f32(&[18, ch], &[0.25; 18 * 8]).unwrap();
        let e = launch_short_conv_decode(&launcher(), &x, &w18, &states, None, &y).unwrap_err();
        assert!(e.to_string().contains("taps ≤ 17"), "{e}");
    }

    #[test]
    fn split_with_rolling_state_equals_one_pass_and_zero_fill() {
        let (seq, ch) = (23usize, 70usize);
        let mut rng = Rng::new(4);
        let xv = rng.vec(seq * ch, 1.0);
        let w = Tensor::<f32>::from_f32(&[4, ch], &rng.vec(4 * ch, 0.5)).unwrap();
        let cfg = Config::new().with("BC", 32);
        let conv = |x: &[f32], state: &Tensor<f32>| {
            let n = x.len() / ch;
            let x = Tensor::<f32>::from_f32(&[n, ch], x).unwrap();
            let y = Tensor::<f32>::poisoned(&[n, ch]);
            short_conv4::launch(&launcher(), &cfg, &x, &w, state, state, &y).unwrap();
            y.to_vec().unwrap()
        };
        let fresh = || {
            let s = Tensor::<f32>::poisoned(&[3, ch]);
            zero_state::launch(&launcher(), &Config::new(), &s).unwrap();
            assert!(s.to_vec().unwrap().iter().all(|v| *v == 0.0));
            s
        };
        let (s1, s2) = (fresh(), fresh());
        let whole = conv(&xv, &s1);
        let mut parts = conv(&xv[..10 * ch], &s2);
        for t in 10..seq {
            parts.extend(conv(&xv[t * ch..(t + 1) * ch], &s2));
        }
        assert_eq!(parts, whole);
        assert_eq!(s1.to_vec(), s2.to_vec());
    }
}

mod gates {
    use super::*;
    use kernels::linear_attention::gates::{
        gated_rmsnorm_sigmoid, gated_rmsnorm_silu, gdn_gates, kda_gates,
    };
    use kernels::linear_attention::reference::{
        gated_rmsnorm, gdn_gates as gates_ref, kda_gates as kda_ref, OutputGate,
    };

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        #[test]
        fn gdn_gates_match_reference(
            seq in 1usize..150, heads in 1usize..70, seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let a: Vec<f32> = rng.vec(seq * heads, 4.0);
            let b = rng.vec(seq * heads, 4.0);
            let a_log = rng.vec(heads, 1.5);
            let dt = rng.vec(heads, 1.0);
            let t = |v: &[f32], r: usize| Tensor::<f32>::from_f32(&[r, v.len() / r], v).unwrap();
            let g = Tensor::<f32>::poisoned(&[seq, heads]);
            let beta = Tensor::<f32>::poisoned(&[seq, heads]);
            let (ta, tb, tl, td) = (t(&a, seq), t(&b, seq), t(&a_log, 1), t(&dt, 1));
            gdn_gates::launch(&launcher(), &Config::new(), &ta, &tb, &tl, &td, &g, &beta).unwrap();
            let (wg, wb) = gates_ref(&widen(&a), &widen(&b), &widen(&a_log), &widen(&dt)).unwrap();
            prop_assert!(rel_error(&g.to_vec().unwrap(), &wg) <= 1e-5);
            prop_assert!(rel_error(&beta.to_vec().unwrap(), &wb) <= 1e-5);
        }

        /// Any key head dim (not only tile sizes): the `BDK` tile covers it.
        #[test]
        fn kda_gates_match_reference(
            seq in 1usize..100, heads in 1usize..6, dk in 1usize..140, seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let f: Vec<f32> = rng.vec(seq * heads * dk, 4.0);
            let b = rng.vec(seq * heads, 4.0);
            let a_log = rng.vec(heads, 1.5);
            let dt = rng.vec(heads * dk, 1.0);
            let t = |v: &[f32], r: usize| Tensor::<f32>::from_f32(&[r, v.len() / r], v).unwrap();
            let g = Tensor::<f32>::poisoned(&[seq, heads * dk]);
            let beta = Tensor::<f32>::poisoned(&[seq, heads]);
            let (tf, tb, tl, td) = (t(&f, seq), t(&b, seq), t(&a_log, 1), t(&dt, 1));
            let cfg = kernels::tile_choice::cover(
                &kda_gates::META,
                &Config::new(),
                &[("BDK", dk, "head_dim")],
            )
            .unwrap();
            kda_gates::launch(&launcher(), &cfg, &tf, &tb, &tl, &td, &g, &beta).unwrap();
            let (wg, wb) = kda_ref(&widen(&f), &widen(&b), &widen(&a_log), &widen(&dt)).unwrap();
            prop_assert!(rel_error(&g.to_vec().unwrap(), &wg) <= 1e-5);
            prop_assert!(rel_error(&beta.to_vec().unwrap(), &wb) <= 1e-5);
        }

        /// Both output gates (SiLU: Qwen3-Next, sigmoid: Kimi Linear) at any head width.
        #[test]
        fn gated_norms_match_reference(
            rows in 1usize..70, heads in 1usize..4, dv in 1usize..200, sigmoid in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng::new(seed);
            let (o, z) = (rng.vec(rows * heads * dv, 2.0), rng.vec(rows * heads * dv, 3.0));
            let w: Vec<f32> = rng.vec(dv, 0.5).iter().map(|x| x + 1.0).collect();
            let shape = [rows, heads * dv];
            let y = Tensor::<f32>::poisoned(&shape);
            let (to, tz) = (
                Tensor::<f32>::from_f32(&shape, &o).unwrap(),
                Tensor::<f32>::from_f32(&shape, &z).unwrap(),
            );
            let tw = Tensor::<f32>::from_f32(&[1, dv], &w).unwrap();
            let (meta, gate) = if sigmoid {
                (&gated_rmsnorm_sigmoid::META, OutputGate::Sigmoid)
            } else {
                (&gated_rmsnorm_silu::META, OutputGate::Silu)
            };
            let cfg =
                kernels::tile_choice::cover(meta, &Config::new(), &[("BDV", dv, "head_dim")])
                    .unwrap();
            if sigmoid {
                gated_rmsnorm_sigmoid::launch(&launcher(), &cfg, &to, &tz, &tw, &y, 1e-6)
            } else {
                gated_rmsnorm_silu::launch(&launcher(), &cfg, &to, &tz, &tw, &y, 1e-6)
            }
            .unwrap();
            let want = gated_rmsnorm(&widen(&o), &widen(&z), &widen(&w), 1e-6, gate).unwrap();
            prop_assert!(rel_error(&y.to_vec().unwrap(), &want) <= 1e-5);
        }
    }
}
