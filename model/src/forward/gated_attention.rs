//! Qwen3-Next's full-attention layer: grouped-query attention with per-head RMSNorm on queries
//! and keys, partial half-split RoPE, and a sigmoid output gate. `q_proj` yields, per head, the
//! query followed by its gate (`[q(D) | gate(D)]`); the cache holds keys (normed and rotated) and
//! values per token.

use super::ops::{view, Mem, Ops, RopeTables};
use super::params::GqaWeights;
use super::ForwardError;
use crate::config::GqaDims;
use dsl_core::Tensor;

/// Per-sequence key/value cache of one attention layer.
pub(crate) struct KvCache {
    /// `[capacity, kv_heads·D]`.
    pub k: Tensor<f32>,
    /// `[capacity, kv_heads·D]`.
    pub v: Tensor<f32>,
}

impl KvCache {
    /// An empty (poisoned) cache for `capacity` tokens.
    pub fn new(g: &GqaDims, capacity: usize, mem: Mem) -> KvCache {
        KvCache {
            k: mem.act(capacity, g.kv_heads * g.head_dim),
            v: mem.act(capacity, g.kv_heads * g.head_dim),
        }
    }
}

/// Gated GQA over `x [T, H]` (already normed) at positions `pos0 ..`; appends to `cache`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    ops: &mut Ops,
    g: &GqaDims,
    w: &GqaWeights,
    x: &Tensor<f32>,
    pos0: usize,
    cache: &KvCache,
    rope: &RopeTables,
    eps: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let (t, d, hq, hkv) = (x.rows(), g.head_dim, g.heads, g.kv_heads);
    let ctx = pos0 + t;
    let qg = ops.linear("attn.q_proj", x, &w.q_proj)?;
    let (q, gate) = if g.output_gate {
        let (q, gate) = (ops.mem.act(t, hq * d), ops.mem.act(t, hq * d));
        for h in 0..hq {
            let src = h * 2 * d;
            ops.copy(
                "attn.split_query_gate",
                &view(qg.col_range(src, d), "query head")?,
                &view(q.col_range(h * d, d), "query")?,
            )?;
            ops.copy(
                "attn.split_query_gate",
                &view(qg.col_range(src + d, d), "gate head")?,
                &view(gate.col_range(h * d, d), "gate")?,
            )?;
        }
        (q, Some(gate))
    } else {
        (qg, None)
    };
    let k = ops.linear("attn.k_proj", x, &w.k_proj)?;
    let k_new = view(cache.k.row_range(pos0, t), "key cache rows")?;
    let v_new = view(cache.v.row_range(pos0, t), "value cache rows")?;
    ops.linear_into("attn.v_proj", x, &w.v_proj, &v_new)?;
    let (q, k) = match (&w.q_norm, &w.k_norm) {
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
    let k_all = view(cache.k.row_range(0, ctx), "key cache")?;
    let v_all = view(cache.v.row_range(0, ctx), "value cache")?;
    let o = ops.attention(
        "attn.attention",
        &q,
        &k_all,
        &v_all,
        d,
        d,
        (d as f64).powf(-0.5),
    )?;
    let o = match gate {
        Some(gate) => ops.sigmoid_mul("attn.output_gate", &gate, &o)?,
        None => o,
    };
    ops.linear("attn.o_proj", &o, &w.o_proj)
}
