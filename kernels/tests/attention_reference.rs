//! The float64 attention references against each other and against known answers:
//! chunked prefill == one-shot prefill; decode == last prefill row; paged decode == contiguous
//! decode; absorbed MLA == naive MLA (to 1e-10 in f64); sparse attention with k ≥ context ==
//! dense; top-k tie-breaking deterministic; indexer scores as the formula says; bad shapes are
//! errors, not panics.
//!
//! All inputs are random (`kernels::testdata::Rng`, uniform in [−1, 1), never zeros); proptest
//! draws the shapes and seeds.

use kernels::attention::reference::*;
use kernels::testdata::Rng;
use proptest::prelude::*;

/// Max over elements of |got − want| / max(|want|, rms(want)).
fn max_rel(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let n = want.len().max(1) as f64;
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / n)
        .sqrt()
        .max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() || w.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs() / w.abs().max(rms)
            }
        })
        .fold(0.0, f64::max)
}

fn shuffle(rng: &mut Rng, v: &mut [usize]) {
    for i in (1..v.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
}

/// Rows `[a, b)` of a row-major tensor with rows of `row` values.
fn rows(x: &[f32], row: usize, a: usize, b: usize) -> Vec<f32> {
    x[a * row..b * row].to_vec()
}

/// Splits `0..total` into chunks of the given sizes (cycled), the last one ragged.
fn chunk_bounds(total: usize, sizes: &[usize]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut a = 0;
    let mut i = 0;
    while a < total {
        let b = (a + sizes[i % sizes.len()]).min(total);
        out.push((a, b));
        a = b;
        i += 1;
    }
    out
}

fn head_pairs() -> impl Strategy<Value = (usize, usize)> {
    prop::sample::select(vec![(1, 1), (4, 4), (4, 2), (4, 1), (6, 3), (6, 2), (8, 1)])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn chunked_prefill_equals_one_shot(
        s in 1usize..40,
        (heads, kv_heads) in head_pairs(),
        d in 1usize..20,
        dv in 1usize..20,
        sizes in prop::collection::vec(1usize..12, 1..6),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let q = rng.vec(s * heads * d, 1.0);
        let k = rng.vec(s * kv_heads * d, 1.0);
        let v = rng.vec(s * kv_heads * dv, 1.0);
        let scale = (d as f64).powf(-0.5);
        let full = AttnShape { sq: s, skv: s, heads, kv_heads, head_dim: d, v_head_dim: dv };
        let one_shot = attention_prefill(&q, &k, &v, full, scale).unwrap();
        // Several chunkings: the drawn sizes, token by token, and one chunk.
        for sizes in [sizes.clone(), vec![1], vec![s]] {
            let mut chunked = Vec::with_capacity(one_shot.len());
            for (a, b) in chunk_bounds(s, &sizes) {
                // Chunk [a, b) against the cache of everything up to b.
                let shape = AttnShape { sq: b - a, skv: b, ..full };
                let out = attention_prefill(
                    &rows(&q, heads * d, a, b),
                    &rows(&k, kv_heads * d, 0, b),
                    &rows(&v, kv_heads * dv, 0, b),
                    shape,
                    scale,
                ).unwrap();
                chunked.extend(out);
            }
            let err = max_rel(&chunked, &one_shot);
            prop_assert!(err <= 1e-12, "chunks {:?}: rel err {}", sizes, err);
        }
    }

    #[test]
    fn decode_is_last_prefill_row_and_paged_equals_contiguous(
        ctx in 1usize..50,
        (heads, kv_heads) in head_pairs(),
        d in 1usize..16,
        dv in 1usize..16,
        page_size in 1usize..9,
        extra_pages in 0usize..4,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let (kr, vr) = (kv_heads * d, kv_heads * dv);
        let q_all = rng.vec(ctx * heads * d, 1.0);
        let k = rng.vec(ctx * kr, 1.0);
        let v = rng.vec(ctx * vr, 1.0);
        let scale = (d as f64).powf(-0.5);
        let prefill = attention_prefill(
            &q_all, &k, &v,
            AttnShape { sq: ctx, skv: ctx, heads, kv_heads, head_dim: d, v_head_dim: dv },
            scale,
        ).unwrap();
        let q = rows(&q_all, heads * d, ctx - 1, ctx);
        let shape = AttnShape::decode(ctx, heads, kv_heads, d, dv);
        let decode = attention_decode(&q, &k, &v, shape, scale).unwrap();
        prop_assert!(max_rel(&decode, &prefill[(ctx - 1) * heads * dv..]) <= 1e-12);

        // A pool with spare pages of random junk, the sequence's pages in scrambled order.
        let used = ctx.div_ceil(page_size);
        let pages = used + extra_pages;
        let mut perm: Vec<usize> = (0..pages).collect();
        shuffle(&mut rng, &mut perm);
        let table = &perm[..used];
        let mut k_pool = rng.vec(pages * page_size * kr, 1.0);
        let mut v_pool = rng.vec(pages * page_size * vr, 1.0);
        for t in 0..ctx {
            let row = table[t / page_size] * page_size + t % page_size;
            k_pool[row * kr..][..kr].copy_from_slice(&k[t * kr..][..kr]);
            v_pool[row * vr..][..vr].copy_from_slice(&v[t * vr..][..vr]);
        }
        let paged = attention_decode_paged(&q, &k_pool, &v_pool, table, page_size, shape, scale)
            .unwrap();
        prop_assert_eq!(paged, decode);
    }

    #[test]
    fn absorbed_mla_equals_naive(
        heads in 1usize..5,
        kv_lora_rank in 1usize..24,
        nope in 1usize..12,
        rope in 1usize..8,
        v_head_dim in 1usize..12,
        skv in 1usize..20,
        sq_frac in 0.0f64..1.0,
        yarn in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let sq = 1 + ((skv - 1) as f64 * sq_frac) as usize;
        let shape = MlaShape {
            sq, skv, heads, kv_lora_rank,
            qk_nope_head_dim: nope, qk_rope_head_dim: rope, v_head_dim,
        };
        let mut rng = Rng::new(seed);
        let q = rng.vec(sq * heads * (nope + rope), 1.0);
        let c_kv = rng.vec(skv * kv_lora_rank, 1.0);
        let k_rope = rng.vec(skv * rope, 1.0);
        let w_kv_b = rng.vec(heads * (nope + v_head_dim) * kv_lora_rank, 1.0);
        let scale = if yarn { mla_softmax_scale(nope, rope, 40.0, 1.0) }
                    else { mla_softmax_scale(nope, rope, 1.0, 0.0) };
        let naive = mla_naive(&q, &c_kv, &k_rope, &w_kv_b, shape, scale).unwrap();
        let absorbed = mla_absorbed(&q, &c_kv, &k_rope, &w_kv_b, shape, scale).unwrap();
        let err = max_rel(&absorbed, &naive);
        prop_assert!(err <= 1e-10, "{:?}: rel err {}", shape, err);
    }

    #[test]
    fn sparse_with_k_at_least_ctx_equals_dense(
        heads in 1usize..5,
        kv_lora_rank in 1usize..20,
        nope in 1usize..10,
        rope in 1usize..8,
        v_head_dim in 1usize..10,
        index_heads in 1usize..5,
        index_head_dim in 1usize..16,
        skv in 1usize..24,
        sq_frac in 0.0f64..1.0,
        topk_extra in 0usize..5,
        seed in any::<u64>(),
    ) {
        let sq = 1 + ((skv - 1) as f64 * sq_frac) as usize;
        let shape = MlaShape {
            sq, skv, heads, kv_lora_rank,
            qk_nope_head_dim: nope, qk_rope_head_dim: rope, v_head_dim,
        };
        let mut rng = Rng::new(seed);
        let q = rng.vec(sq * heads * (nope + rope), 1.0);
        let c_kv = rng.vec(skv * kv_lora_rank, 1.0);
        let k_rope = rng.vec(skv * rope, 1.0);
        let w_kv_b = rng.vec(heads * (nope + v_head_dim) * kv_lora_rank, 1.0);
        let scale = mla_softmax_scale(nope, rope, 40.0, 1.0);
        // The indexer picks the keys; with k ≥ context it must pick every causal key.
        let ishape = IndexerShape { sq, skv, index_heads, index_head_dim };
        let iq = rng.vec(sq * index_heads * index_head_dim, 1.0);
        let ik = rng.vec(skv * index_head_dim, 1.0);
        let iw = rng.vec(sq * index_heads, (index_heads as f32).powf(-0.5));
        let scores = indexer_scores(&iq, &ik, &iw, ishape, (index_head_dim as f64).powf(-0.5))
            .unwrap();
        let sel = select_topk(&scores, sq, skv, skv + topk_extra).unwrap();
        for (i, s) in sel.iter().enumerate() {
            prop_assert_eq!(s.len(), skv - sq + i + 1);
        }
        let sparse = mla_sparse(&q, &c_kv, &k_rope, &w_kv_b, &sel, shape, scale).unwrap();
        let dense = mla_absorbed(&q, &c_kv, &k_rope, &w_kv_b, shape, scale).unwrap();
        let naive = mla_naive(&q, &c_kv, &k_rope, &w_kv_b, shape, scale).unwrap();
        let e_dense = max_rel(&sparse, &dense);
        let e_naive = max_rel(&sparse, &naive);
        prop_assert!(e_dense <= 1e-12, "sparse vs dense absorbed: {}", e_dense);
        prop_assert!(e_naive <= 1e-10, "sparse vs naive: {}", e_naive);
        // The same at the latent-MQA level, on f32 latent inputs as a kernel would see them.
        let mqa = shape.latent_mqa();
        let ql = rng.vec(sq * heads * mqa.dk, 1.0);
        let kvl = rng.vec(skv * mqa.dk, 1.0);
        let a = mqa_sparse(&ql, &kvl, &sel, mqa, scale).unwrap();
        let b = mqa_dense(&ql, &kvl, mqa, scale).unwrap();
        prop_assert!(max_rel(&a, &b) <= 1e-12);
    }

    #[test]
    fn sparse_attends_only_the_selected_keys(
        heads in 1usize..5,
        dk in 2usize..24,
        dv_frac in 0.0f64..1.0,
        ctx in 2usize..40,
        topk in 1usize..40,
        seed in any::<u64>(),
    ) {
        let dv = 1 + ((dk - 1) as f64 * dv_frac) as usize;
        let mut rng = Rng::new(seed);
        let shape = MqaShape { sq: 1, skv: ctx, heads, dk, dv };
        let q = rng.vec(heads * dk, 1.0);
        let kv = rng.vec(ctx * dk, 1.0);
        let scores: Vec<f64> = rng.vec(ctx, 1.0).into_iter().map(f64::from).collect();
        let sel = select_topk(&scores, 1, ctx, topk).unwrap();
        prop_assert_eq!(sel[0].len(), topk.min(ctx));
        let sparse = mqa_sparse(&q, &kv, &sel, shape, 0.3).unwrap();
        // Dense decode over a cache holding only the selected rows gives the same output...
        let mut picked = sel[0].clone();
        picked.sort_unstable();
        let compact: Vec<f32> = picked.iter().flat_map(|&s| kv[s * dk..][..dk].to_vec()).collect();
        let dense = mqa_dense(&q, &compact, MqaShape { skv: picked.len(), ..shape }, 0.3).unwrap();
        prop_assert!(max_rel(&sparse, &dense) <= 1e-12);
        // ...and the gather order does not matter.
        let mut shuffled = sel[0].clone();
        shuffle(&mut rng, &mut shuffled);
        let again = mqa_sparse(&q, &kv, &[shuffled], shape, 0.3).unwrap();
        prop_assert!(max_rel(&again, &sparse) <= 1e-12);
    }

    #[test]
    fn topk_matches_a_full_sort_and_is_deterministic(
        n in 0usize..300,
        levels in 1u32..6,
        k in 0usize..320,
        seed in any::<u64>(),
    ) {
        // Few distinct levels, so ties are everywhere.
        let mut rng = Rng::new(seed);
        let scores: Vec<f64> = (0..n)
            .map(|_| ((rng.uniform() + 1.0) * levels as f32 / 2.0).floor() as f64 - 1.5)
            .collect();
        let got = topk(&scores, k);
        prop_assert_eq!(&got, &topk(&scores, k), "not deterministic");
        let mut want: Vec<usize> = (0..n).collect();
        want.sort_by(|&a, &b| scores[b].partial_cmp(&scores[a]).unwrap().then(a.cmp(&b)));
        want.truncate(k.min(n));
        prop_assert_eq!(got, want);
    }
}

#[test]
fn prefill_known_answers() {
    let mut rng = Rng::new(7);
    let (s, heads, kv_heads, d, dv) = (9, 6, 2, 5, 3);
    let q = rng.vec(s * heads * d, 1.0);
    let v = rng.vec(s * kv_heads * dv, 1.0);
    // Identical keys: every causal key scores the same, so query i averages values 0..=i.
    let key = rng.vec(kv_heads * d, 1.0);
    let k: Vec<f32> = (0..s).flat_map(|_| key.clone()).collect();
    let shape = AttnShape {
        sq: s,
        skv: s,
        heads,
        kv_heads,
        head_dim: d,
        v_head_dim: dv,
    };
    let o = attention_prefill(&q, &k, &v, shape, 0.37).unwrap();
    for i in 0..s {
        for h in 0..heads {
            let g = shape.kv_head(h);
            for c in 0..dv {
                let mean = (0..=i)
                    .map(|j| v[(j * kv_heads + g) * dv + c] as f64)
                    .sum::<f64>()
                    / (i + 1) as f64;
                let got = o[(i * heads + h) * dv + c];
                assert!(
                    (got - mean).abs() <= 1e-14,
                    "query {i} head {h}: {got} vs {mean}"
                );
            }
        }
    }
    // The first query sees only key 0: its output is exactly v[0] of its group.
    let k = rng.vec(s * kv_heads * d, 1.0);
    let o = attention_prefill(&q, &k, &v, shape, 0.37).unwrap();
    for h in 0..heads {
        let g = shape.kv_head(h);
        for c in 0..dv {
            assert_eq!(o[h * dv + c], v[g * dv + c] as f64);
        }
    }
    // GQA == MHA with each key/value head repeated for its group (transformers' repeat_kv).
    let group = heads / kv_heads;
    let rep = |x: &[f32], dim: usize| -> Vec<f32> {
        (0..s)
            .flat_map(|t| {
                (0..heads).flat_map(move |h| {
                    let g = h / group;
                    x[(t * kv_heads + g) * dim..][..dim].to_vec()
                })
            })
            .collect()
    };
    let mha = attention_prefill(
        &q,
        &rep(&k, d),
        &rep(&v, dv),
        AttnShape {
            kv_heads: heads,
            ..shape
        },
        0.37,
    )
    .unwrap();
    assert_eq!(mha, o);
}

#[test]
fn mla_softmax_scale_follows_yarn() {
    // DeepSeek-V3: nope 128 + rope 64, YaRN factor 40, mscale_all_dim 1.
    let m = 0.1 * 40f64.ln() + 1.0;
    let want = 192f64.powf(-0.5) * m * m;
    assert_eq!(mla_softmax_scale(128, 64, 40.0, 1.0), want);
    assert!((want - 0.135234).abs() < 1e-6, "{want}");
    // No YaRN (factor ≤ 1) or mscale_all_dim 0: the plain 1/sqrt(d).
    assert_eq!(mla_softmax_scale(128, 64, 1.0, 1.0), 192f64.powf(-0.5));
    assert_eq!(mla_softmax_scale(128, 64, 40.0, 0.0), 192f64.powf(-0.5));
}

#[test]
fn indexer_scores_known_answer() {
    // sq = skv = 2, two index heads of dim 2. Query 0 sees key 0 only.
    let q = [
        0.5f32, -0.25, -0.75, 0.5, /* query 1 */ 0.25, 0.5, 1.0, -0.5,
    ];
    let k = [0.5f32, 0.75, /* key 1 */ -0.5, 0.25];
    let w = [0.5f32, -1.5, /* query 1 */ 0.75, 0.25];
    let scale = 2.0;
    let shape = IndexerShape {
        sq: 2,
        skv: 2,
        index_heads: 2,
        index_head_dim: 2,
    };
    let s = indexer_scores(&q, &k, &w, shape, scale).unwrap();
    let relu = |x: f64| x.max(0.0);
    let dot = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum::<f64>()
    };
    // I(0,0) = 0.5·ReLU(2·(0.25 − 0.1875)) − 1.5·ReLU(2·(−0.375 + 0.375)) = 0.0625.
    let i00 =
        0.5 * relu(scale * dot(&q[0..2], &k[0..2])) - 1.5 * relu(scale * dot(&q[2..4], &k[0..2]));
    assert_eq!(s[0], i00);
    assert_eq!(s[0], 0.0625);
    assert_eq!(s[1], f64::NEG_INFINITY, "query 0 must not see key 1");
    for key in 0..2 {
        let kk = &k[key * 2..][..2];
        let want = 0.75 * relu(scale * dot(&q[4..6], kk)) + 0.25 * relu(scale * dot(&q[6..8], kk));
        assert_eq!(s[2 + key], want);
    }
    // Key 1 for query 1: head 0 dot = −0.125+0.125 = 0, head 1 dot = −0.5−0.125 < 0: score 0.
    assert_eq!(s[3], 0.0);
}

#[test]
fn indexer_scores_are_causal_and_relu_gated() {
    let mut rng = Rng::new(11);
    let shape = IndexerShape {
        sq: 5,
        skv: 12,
        index_heads: 3,
        index_head_dim: 8,
    };
    let q = rng.vec(5 * 3 * 8, 1.0);
    let k = rng.vec(12 * 8, 1.0);
    let w: Vec<f32> = rng.vec(5 * 3, 1.0).into_iter().map(f32::abs).collect();
    let s = indexer_scores(&q, &k, &w, shape, 8f64.powf(-0.5)).unwrap();
    for i in 0..5 {
        let pos = shape.query_position(i);
        for key in 0..12 {
            let v = s[i * 12 + key];
            if key <= pos {
                // Positive weights and a ReLU: never negative.
                assert!(v.is_finite() && v >= 0.0, "I({i},{key}) = {v}");
            } else {
                assert_eq!(v, f64::NEG_INFINITY, "I({i},{key}) is in the future");
            }
        }
    }
    // Negating the weights negates every visible score (w sits outside the ReLU).
    let neg: Vec<f32> = w.iter().map(|x| -x).collect();
    let sn = indexer_scores(&q, &k, &neg, shape, 8f64.powf(-0.5)).unwrap();
    for (a, b) in s.iter().zip(&sn) {
        if a.is_finite() {
            assert_eq!(*b, -a);
        }
    }
}

#[test]
fn topk_tie_breaking_is_documented_behaviour() {
    let s = [1.0, 3.0, 3.0, 2.0, 3.0];
    assert_eq!(topk(&s, 2), [1, 2]);
    assert_eq!(topk(&s, 4), [1, 2, 4, 3]);
    assert_eq!(topk(&s, 10), [1, 2, 4, 3, 0]);
    assert!(topk(&s, 0).is_empty());
    // −0 and +0 tie, so the lower index wins.
    assert_eq!(topk(&[-0.0, 0.0], 1), [0]);
    assert_eq!(topk(&[0.0, -0.0], 1), [0]);
    // NaN ranks below everything, −∞ included.
    let n = [f64::NAN, f64::NEG_INFINITY, 1.0, f64::NAN];
    assert_eq!(topk(&n, 2), [2, 1]);
    assert_eq!(topk(&n, 4), [2, 1, 0, 3]);
    // Causal selection: query i keeps min(topk, p + 1) keys, all at or before its position.
    let mut rng = Rng::new(3);
    let (sq, skv) = (4, 10);
    let shape = IndexerShape {
        sq,
        skv,
        index_heads: 2,
        index_head_dim: 4,
    };
    let scores = indexer_scores(
        &rng.vec(sq * 2 * 4, 1.0),
        &rng.vec(skv * 4, 1.0),
        &rng.vec(sq * 2, 1.0),
        shape,
        0.5,
    )
    .unwrap();
    let sel = select_topk(&scores, sq, skv, 8).unwrap();
    for (i, s) in sel.iter().enumerate() {
        let pos = skv - sq + i;
        assert_eq!(s.len(), 8.min(pos + 1));
        assert!(s.iter().all(|&j| j <= pos));
        assert_eq!(s, &topk(&scores[i * skv..][..pos + 1], 8));
    }
    assert_eq!(
        select_topk(&scores, sq, skv, 8).unwrap(),
        sel,
        "deterministic"
    );
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let x = vec![0.5f32; 64];
    let shape = AttnShape {
        sq: 2,
        skv: 4,
        heads: 4,
        kv_heads: 3,
        head_dim: 2,
        v_head_dim: 2,
    };
    let e = attention_prefill(&x, &x, &x, shape, 1.0).unwrap_err();
    assert!(e.0.contains("must divide"), "{e}");
    let e = attention_prefill(
        &x,
        &x,
        &x,
        AttnShape {
            sq: 5,
            kv_heads: 2,
            ..shape
        },
        1.0,
    )
    .unwrap_err();
    assert!(e.0.contains("sq ≤ skv"), "{e}");
    let e = attention_prefill(
        &x[..3],
        &x,
        &x,
        AttnShape {
            kv_heads: 2,
            ..shape
        },
        1.0,
    )
    .unwrap_err();
    assert!(e.0.starts_with("q: expected 16 values"), "{e}");
    let e = attention_decode(
        &x,
        &x,
        &x,
        AttnShape {
            kv_heads: 2,
            ..shape
        },
        1.0,
    )
    .unwrap_err();
    assert!(e.0.contains("one query"), "{e}");
    // Paged: a block table too short, or pointing outside the pool.
    let dec = AttnShape::decode(5, 2, 1, 2, 2);
    assert!(attention_decode_paged(&x[..4], &x[..16], &x[..16], &[0], 2, dec, 1.0).is_err());
    assert!(attention_decode_paged(&x[..4], &x[..16], &x[..16], &[0, 1, 9], 2, dec, 1.0).is_err());
    assert!(gather_pages(&x[..15], 2, 2, &[0], 1).is_err());
    // Sparse: future, repeated, missing or empty selections.
    let m = MqaShape {
        sq: 2,
        skv: 3,
        heads: 1,
        dk: 4,
        dv: 2,
    };
    let (q, kv) = (&x[..8], &x[..12]);
    assert!(mqa_sparse(q, kv, &[vec![0], vec![2]], m, 1.0).is_ok());
    let e = mqa_sparse(q, kv, &[vec![2], vec![2]], m, 1.0).unwrap_err();
    assert!(e.0.contains("future"), "{e}");
    let e = mqa_sparse(q, kv, &[vec![0, 0], vec![2]], m, 1.0).unwrap_err();
    assert!(e.0.contains("twice"), "{e}");
    assert!(mqa_sparse(q, kv, &[vec![0]], m, 1.0).is_err());
    assert!(mqa_sparse(q, kv, &[vec![], vec![1]], m, 1.0).is_err());
    assert!(mqa_dense(q, kv, MqaShape { dv: 5, ..m }, 1.0).is_err());
    // MLA: a weight of the wrong size names the expected layout.
    let mla = MlaShape {
        sq: 1,
        skv: 2,
        heads: 2,
        kv_lora_rank: 3,
        qk_nope_head_dim: 2,
        qk_rope_head_dim: 2,
        v_head_dim: 2,
    };
    let e = mla_absorbed(&x[..8], &x[..6], &x[..4], &x[..23], mla, 1.0).unwrap_err();
    assert!(e.0.contains("w_kv_b"), "{e}");
    assert!(mla_naive(&x[..8], &x[..6], &x[..4], &x[..24], mla, 1.0).is_ok());
    // Top-k of 0 is a configuration error.
    assert!(select_topk(&[1.0], 1, 1, 0).is_err());
    assert!(indexer_scores(
        &x[..4],
        &x[..4],
        &x[..2],
        IndexerShape {
            sq: 2,
            skv: 1,
            index_heads: 1,
            index_head_dim: 2
        },
        1.0
    )
    .is_err());
}

#[test]
fn mla_naive_is_mha_over_expanded_keys_with_the_kv_b_proj_layout() {
    // Independent of the module's weight indexing: expand keys and values by hand from
    // kv_b_proj.weight viewed [heads, nope + v, kv_lora] (rows 0..nope = W_UK, the rest W_UV),
    // as DeepSeek's `wkv_b.view(n_heads, -1, kv_lora_rank)` does, and run plain MHA.
    let (sq, skv, heads, r, nope, rope, dv) = (3, 7, 3, 5, 4, 2, 3);
    let shape = MlaShape {
        sq,
        skv,
        heads,
        kv_lora_rank: r,
        qk_nope_head_dim: nope,
        qk_rope_head_dim: rope,
        v_head_dim: dv,
    };
    let mut rng = Rng::new(5);
    let q = rng.vec(sq * heads * (nope + rope), 1.0);
    let c_kv = rng.vec(skv * r, 1.0);
    let k_rope = rng.vec(skv * rope, 1.0);
    let w = rng.vec(heads * (nope + dv) * r, 1.0);
    let wrow = |h: usize, row: usize| &w[(h * (nope + dv) + row) * r..][..r];
    let mut k = Vec::new();
    let mut v = Vec::new();
    for t in 0..skv {
        let c = &c_kv[t * r..][..r];
        for h in 0..heads {
            for a in 0..nope {
                let x: f64 = wrow(h, a)
                    .iter()
                    .zip(c)
                    .map(|(p, q)| *p as f64 * *q as f64)
                    .sum();
                k.push(x as f32);
            }
            k.extend_from_slice(&k_rope[t * rope..][..rope]);
            for b in 0..dv {
                let x: f64 = wrow(h, nope + b)
                    .iter()
                    .zip(c)
                    .map(|(p, q)| *p as f64 * *q as f64)
                    .sum();
                v.push(x as f32);
            }
        }
    }
    let mha = attention_prefill(
        &q,
        &k,
        &v,
        AttnShape {
            sq,
            skv,
            heads,
            kv_heads: heads,
            head_dim: nope + rope,
            v_head_dim: dv,
        },
        0.3,
    )
    .unwrap();
    let naive = mla_naive(&q, &c_kv, &k_rope, &w, shape, 0.3).unwrap();
    // The hand expansion is rounded to f32, hence the looser bound.
    let err = max_rel(&naive, &mha);
    assert!(err <= 1e-6, "rel err {err}");
}
