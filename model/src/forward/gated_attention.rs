//! Qwen3-Next's full-attention layer: grouped-query attention with per-head RMSNorm on queries
//! and keys, partial half-split RoPE, and a sigmoid output gate. `q_proj` yields, per head, the
//! query followed by its gate (`[q(D) | gate(D)]`); the cache holds keys (normed and rotated) and
//! values per token.

use super::cache_format::CacheTensor;
use super::ops::{view, Mem, Ops, RopeTables};
use super::params::GqaWeights;
use super::sequences::{SeqRows, PAGE};
use super::ForwardError;
use crate::config::GqaDims;
use dsl_core::Tensor;

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
/// are cached.
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
    window: usize,
) -> Result<Tensor<f32>, ForwardError> {
    let (t, d, hq, hkv) = (x.rows(), g.head_dim, g.heads, g.kv_heads);
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
    let k_new = ops.mem.act(t, hkv * d);
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
    ops.rope_into("rope", &q, rope, d, 0, &q)?;
    ops.rope_into("rope", &k, rope, d, 0, &k_new)?;
    for (new, pool) in [(&k_new, &pool.k), (&v_new, &pool.v)] {
        super::mla::append_rows(ops, "attn.cache_append", new, seqs, pool)?;
    }
    let scale = (d as f64).powf(-0.5);
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
            window,
            w.sinks.as_ref(),
        )?
    } else if seqs.iter().all(|sq| sq.rows == 1) {
        let (tables, lens, max_ctx) = SeqRows::decode_tables(seqs)?;
        ops.gqa_decode(
            "attn.decode",
            &q,
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
        )?
    } else {
        let [sq] = seqs else {
            return Err(ForwardError::Internal {
                what: "GQA".into(),
                message: "several sequences in one call must each bring one decode token".into(),
            });
        };
        let (pos0, pages) = (sq.pos0, sq.pages);
        let ctx = pos0 + t;
        let (k_all, v_all) = if pos0 == 0 {
            (k_new, v_new)
        } else {
            let rows = pages.rows(ctx);
            (
                ops.gather_cache_rows("attn.gather_context", &pool.k, &rows)?,
                ops.gather_cache_rows("attn.gather_context", &pool.v, &rows)?,
            )
        };
        ops.attention(
            "attn.attention",
            &q,
            &k_all,
            &v_all,
            d,
            d,
            scale,
            window,
            w.sinks.as_ref(),
        )?
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
