//! Grouped-query attention in all its forms: Qwen3-Next's full-attention layer (per-head RMSNorm
//! on queries and keys, partial half-split RoPE, and a sigmoid output gate: `q_proj` yields, per
//! head, the query followed by its gate, `[q(D) | gate(D)]`), plain GQA (Llama, Qwen, with
//! biases, sinks or a sliding window), and Llama 4's chunked layers (RoPE on interleaved pairs,
//! L2-normed q/k, attention within chunks of positions) and NoPE layers (no RoPE, the query scaled
//! by its attention temperature). The cache holds keys (normed and rotated) and values per token.

use super::cache_format::CacheTensor;
use super::ops::{view, Mem, Ops, RopeTables};
use super::params::GqaWeights;
use super::sequences::{SeqRows, PAGE};
use super::ForwardError;
use crate::config::{AttentionKind, GqaDims};
use dsl_core::Tensor;

/// The position of each of the `t` rows of a call: each sequence's rows from its first position
/// on, or (a batched cost-only decode, whose `seqs` describe fewer rows) every row at the first
/// sequence's position.
fn row_positions(seqs: &[SeqRows], t: usize) -> Vec<usize> {
    if seqs.iter().map(|sq| sq.rows).sum::<usize>() == t {
        seqs.iter()
            .flat_map(|sq| sq.pos0..sq.pos0 + sq.rows)
            .collect()
    } else {
        vec![seqs.first().map_or(0, |sq| sq.pos0); t]
    }
}

/// One attention layer's paged key and value pools, shared by every sequence (pages from the
/// runner's allocator, [`super::sequences`]).
pub(crate) struct KvPool {
    /// `[pages·PAGE, kv_heads·D]`.
    pub k: CacheTensor,
    /// `[pages·PAGE, kv_heads·D]`.
    pub v: CacheTensor,
}

impl KvPool {
    /// An empty (poisoned) pool of `pages` pages in the runner's cache format.
    pub fn new(g: &GqaDims, pages: usize, mem: Mem) -> Result<KvPool, ForwardError> {
        let pool = || {
            view(
                CacheTensor::pool(mem.cache, mem, pages, PAGE, g.kv_heads, g.head_dim, false),
                "key/value pool",
            )
        };
        Ok(KvPool {
            k: pool()?,
            v: pool()?,
        })
    }

    /// A pool as pages `[pages, PAGE, W]`, as the paged decode kernel reads it.
    fn paged(t: &CacheTensor, what: &str) -> Result<CacheTensor, ForwardError> {
        view(t.reshaped(&[t.rows() / PAGE, PAGE, t.cols()]), what)
    }
}

/// Gated GQA over `x [T, H]` (already normed): the rows of one sequence (a prompt chunk or one
/// decode token), or one decode token of each of several sequences (`seqs`, with `rope` at each
/// row's position). Appends the new keys and values to each sequence's pages of `pool`. Decode
/// tokens attend over the pages directly, the whole batch in one launch (paged split-KV decode);
/// a chunk runs flash attention over its context, gathered from the pages when earlier tokens
/// are cached. `kind` is the layer's form (a window, chunks, or no positions).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    ops: &mut Ops,
    g: &GqaDims,
    w: &GqaWeights,
    x: &Tensor<f32>,
    seqs: &[SeqRows],
    pool: &KvPool,
    rope: &RopeTables,
    eps: f64,
    kind: &AttentionKind,
) -> Result<Tensor<f32>, ForwardError> {
    let (t, d, hq, hkv) = (x.rows(), g.head_dim, g.heads, g.kv_heads);
    let window = match kind {
        AttentionKind::SlidingGqa => g.sliding_window.unwrap_or(0),
        _ => 0,
    };
    let chunk = match kind {
        AttentionKind::ChunkedGqa => g.attention_chunk.unwrap_or(0),
        _ => 0,
    };
    let qg = ops.linear("attn.q_proj", x, &w.q_proj)?;
    if let Some([qb, _, _]) = &w.qkv_bias {
        // In place, before any split, norm or RoPE (transformers' biased `nn.Linear`; with an
        // output gate the bias row spans `q_proj`'s interleaved query and gate columns).
        ops.add_bias("attn.qkv_bias", &qg, qb)?;
    }
    let (q, gate) = if g.output_gate {
        let (q, gate) = (ops.mem.act(t, hq * d), ops.mem.act(t, hq * d));
        // Rows (token, head) of the three tensors: each half of every head in one strided copy.
        let heads = view(qg.reshaped(&[t * hq, 2 * d]), "query/gate heads")?;
        for (half, dst) in [(0, &q), (d, &gate)] {
            ops.copy(
                "attn.split_query_gate",
                &view(heads.col_range(half, d), "query or gate half")?,
                &view(dst.reshaped(&[t * hq, d]), "query or gate heads")?,
            )?;
        }
        (q, Some(gate))
    } else {
        (qg, None)
    };
    let k = ops.linear("attn.k_proj", x, &w.k_proj)?;
    let v_new = ops.linear("attn.v_proj", x, &w.v_proj)?;
    if let Some([_, kb, vb]) = &w.qkv_bias {
        ops.add_bias("attn.qkv_bias", &k, kb)?;
        ops.add_bias("attn.qkv_bias", &v_new, vb)?;
    }
    let (q, k) = match (&w.q_norm, &w.k_norm) {
        (Some(qn), Some(kn)) if g.qk_norm_across_heads => {
            // One RMSNorm over each token's whole projection (MiniMax-M2).
            let qo = ops.rmsnorm("attn.q_norm", &q, qn, eps)?;
            let ko = ops.rmsnorm("attn.k_norm", &k, kn, eps)?;
            (qo, ko)
        }
        (Some(qn), Some(kn)) => {
            // Per-head norms: the same RMSNorm over rows of D.
            let qh = view(q.reshaped(&[t * hq, d]), "query heads")?;
            let kh = view(k.reshaped(&[t * hkv, d]), "key heads")?;
            let qo = ops.rmsnorm("attn.q_norm", &qh, qn, eps)?;
            let ko = ops.rmsnorm("attn.k_norm", &kh, kn, eps)?;
            (
                view(qo.reshaped(&[t, hq * d]), "queries")?,
                view(ko.reshaped(&[t, hkv * d]), "keys")?,
            )
        }
        _ => (q, k),
    };
    let (q, k_new) = if *kind == AttentionKind::NopeGqa {
        let q = match &g.temperature {
            Some(temp) => {
                let scales = row_positions(seqs, t)
                    .into_iter()
                    .map(|p| temp.at(p) as f32)
                    .collect::<Vec<_>>();
                let s = match ops.mem.shape_only {
                    true => Tensor::shape_only(&[t, 1]),
                    false => view(Tensor::from_f32(&[t, 1], &scales), "attention temperatures")?,
                };
                ops.mul_col("attn.temperature", &s, &q)?
            }
            None => q,
        };
        (q, k)
    } else {
        let k_new = ops.mem.act(t, hkv * d);
        ops.rope_into("rope", &q, rope, d, 0, &q)?;
        ops.rope_into("rope", &k, rope, d, 0, &k_new)?;
        if g.qk_l2_norm {
            // Llama 4's L2 norm: each head's RMSNorm without a weight, after RoPE.
            let ones = ops.mem.filled(&[1, d], 1.0, "unit norm weight")?;
            let qh = view(q.reshaped(&[t * hq, d]), "query heads")?;
            let kh = view(k_new.reshaped(&[t * hkv, d]), "key heads")?;
            let qo = ops.rmsnorm("attn.q_l2_norm", &qh, &ones, eps)?;
            let ko = ops.rmsnorm("attn.k_l2_norm", &kh, &ones, eps)?;
            (
                view(qo.reshaped(&[t, hq * d]), "queries")?,
                view(ko.reshaped(&[t, hkv * d]), "keys")?,
            )
        } else {
            (q, k_new)
        }
    };
    for (new, pool) in [(&k_new, &pool.k), (&v_new, &pool.v)] {
        super::mla::append_rows(ops, "attn.cache_append", new, seqs, pool)?;
    }
    let scale = (d as f64).powf(-0.5);
    // The keys a decode token at `pos` reads: its window, or its chunk so far.
    let decode_window = |pos: usize| match chunk {
        0 => window,
        c => pos % c + 1,
    };
    let o = if ops.batched_decode && t > 1 {
        // A batched cost-only decode (`Runner::batch_decode`): `t` sequences at one position, in
        // one launch over shape-only pools of `t` sequences' pages (sequence `s` holds pages
        // `s·T..`), as the MLA layer runs it.
        let pos0 = seqs.first().map_or(0, |sq| sq.pos0);
        let pages = (pos0 + 1).div_ceil(PAGE);
        let mem = ops.mem;
        let pool = || {
            view(
                CacheTensor::pool(mem.cache, mem, t * pages, PAGE, hkv, d, true),
                "key/value pool",
            )
        };
        ops.gqa_decode(
            "attn.decode",
            &q,
            &pool()?,
            &pool()?,
            &Tensor::shape_only(&[t, pages]),
            &Tensor::shape_only(&[t]),
            pos0 + 1,
            hkv,
            d,
            d,
            scale,
            decode_window(pos0),
            w.sinks.as_ref(),
        )?
    } else if seqs.iter().all(|sq| sq.rows == 1) {
        let decode = |ops: &mut Ops, q: &Tensor<f32>, seqs: &[SeqRows], window: usize| {
            let (tables, lens, max_ctx) = SeqRows::decode_tables(seqs)?;
            ops.gqa_decode(
                "attn.decode",
                q,
                &KvPool::paged(&pool.k, "key pool")?,
                &KvPool::paged(&pool.v, "value pool")?,
                &tables,
                &lens,
                max_ctx,
                hkv,
                d,
                d,
                scale,
                window,
                w.sinks.as_ref(),
            )
        };
        let first = decode_window(seqs.first().map_or(0, |sq| sq.pos0));
        if seqs.iter().all(|sq| decode_window(sq.pos0) == first) {
            decode(ops, &q, seqs, first)?
        } else {
            // Sequences at different offsets within their chunks read different numbers of
            // keys: one decode each (the kernel takes one window).
            let o = ops.mem.act(t, hq * d);
            for (j, sq) in seqs.iter().enumerate() {
                let qj = view(q.row_range(j, 1), "a decode query")?;
                let oj = decode(ops, &qj, std::slice::from_ref(sq), decode_window(sq.pos0))?;
                ops.copy(
                    "attn.decode_gather",
                    &oj,
                    &view(o.row_range(j, 1), "a decode output")?,
                )?;
            }
            o
        }
    } else {
        let [sq] = seqs else {
            return Err(ForwardError::Internal {
                what: "GQA".into(),
                message: "several sequences in one call must each bring one decode token".into(),
            });
        };
        let (pos0, pages) = (sq.pos0, sq.pages);
        let ctx = pos0 + t;
        // The first position any query of the call attends: a chunked layer reads nothing before
        // the chunk of its first query (its rows of `k_all` start there).
        let base = match chunk {
            0 => 0,
            c => pos0 / c * c,
        };
        let (k_all, v_all) = if pos0 == 0 {
            (k_new, v_new)
        } else {
            let rows = pages.rows(ctx);
            let rows = &rows[base..];
            (
                ops.gather_cache_rows("attn.gather_context", &pool.k, rows)?,
                ops.gather_cache_rows("attn.gather_context", &pool.v, rows)?,
            )
        };
        match chunk {
            0 => ops.attention(
                "attn.attention",
                &q,
                &k_all,
                &v_all,
                d,
                d,
                scale,
                window,
                w.sinks.as_ref(),
            )?,
            c => {
                // Chunked attention: the queries of each chunk attend causally over that chunk's
                // keys only, one attention per chunk the rows touch.
                let o = ops.mem.act(t, hq * d);
                let mut p = pos0;
                while p < ctx {
                    let start = p / c * c;
                    let end = (start + c).min(ctx);
                    let keys = |all: &Tensor<f32>, what| {
                        view(all.row_range(start - base, end - start), what)
                    };
                    ops.attention_into(
                        "attn.attention",
                        &view(q.row_range(p - pos0, end - p), "a chunk's queries")?,
                        &keys(&k_all, "a chunk's keys")?,
                        &keys(&v_all, "a chunk's values")?,
                        &view(o.row_range(p - pos0, end - p), "a chunk's outputs")?,
                        d,
                        d,
                        scale,
                        0,
                        w.sinks.as_ref(),
                    )?;
                    p = end;
                }
                o
            }
        }
    };
    let o = match gate {
        Some(gate) => ops.sigmoid_mul("attn.output_gate", &gate, &o)?,
        None => o,
    };
    let out = ops.linear("attn.o_proj", &o, &w.o_proj)?;
    if let Some(b) = &w.o_bias {
        ops.add_bias("attn.o_bias", &out, b)?;
    }
    Ok(out)
}
