//! Multi-head latent attention (DeepSeek-V3 family). The cache holds one latent row per token,
//! `[c_kv | k_pe]`: the `kv_a_layernorm`-ed compressed KV (`kv_lora_rank` wide) and the rotated
//! shared key (`qk_rope_head_dim` wide).
//!
//! - Dense MLA ([`forward`]) runs as transformers does: every step expands the whole cache through
//!   `kv_b_proj` into per-head keys `[k_nope | k_pe]` and values, then causal flash attention of
//!   the new queries (the last positions of the context) against them.
//! - DeepSeek-V3.2's sparse MLA ([`forward_sparse`]) runs the production form instead: the
//!   lightning indexer scores the context, top-k selects `index_topk` tokens per query, and the
//!   weight-absorbed attention (queries mapped into the latent space through `kv_b_proj`'s key
//!   rows, MQA over the selected latent rows gathered from the paged cache, outputs mapped back
//!   through its value rows) runs on those only. Absorbed and naive forms are the same math
//!   (`kernels::attention::reference` proves it); transformers masks the naive form instead.

use super::ops::{view, Mem, Ops, RopeTables};
use super::params::MlaWeights;
use super::ForwardError;
use crate::config::{IndexerDims, MlaDims};
use dsl_core::Tensor;

/// Tokens per page of the latent and indexer-key caches (a declared page size of the DSA kernels).
pub(crate) const PAGE: usize = 64;

/// Per-sequence latent cache of one MLA layer: `capacity` rows in whole pages, allocated
/// contiguously (page `i` of the sequence is pool page `i`; the block table is the identity).
pub(crate) struct LatentCache {
    /// `[pages·PAGE, kv_lora_rank + qk_rope_head_dim]`: `[c_kv | k_pe]` per token.
    pub latent: Tensor<f32>,
    /// `c_kv` columns of `latent`.
    pub c_kv: Tensor<f32>,
    /// `k_pe` columns of `latent` (already rotated).
    pub k_pe: Tensor<f32>,
    /// DeepSeek-V3.2: the indexer's key cache `[pages·PAGE, index_head_dim]`.
    pub index_keys: Option<Tensor<f32>>,
    /// The identity block table `[pages]`.
    pub block_table: Tensor<i32>,
}

impl LatentCache {
    /// An empty (poisoned) cache for at least `capacity` tokens.
    pub fn new(
        m: &MlaDims,
        index_head_dim: Option<usize>,
        capacity: usize,
        mem: Mem,
    ) -> Result<LatentCache, ForwardError> {
        let pages = capacity.div_ceil(PAGE).max(1);
        let rows = pages * PAGE;
        let latent = mem.act(rows, m.kv_lora_rank + m.qk_rope_head_dim);
        let ids: Vec<i32> = (0..pages as i32).collect();
        Ok(LatentCache {
            c_kv: view(latent.col_range(0, m.kv_lora_rank), "c_kv columns")?,
            k_pe: view(
                latent.col_range(m.kv_lora_rank, m.qk_rope_head_dim),
                "k_pe columns",
            )?,
            latent,
            index_keys: index_head_dim.map(|d| mem.act(rows, d)),
            block_table: view(Tensor::from_indices(&[pages], &ids), "block table")?,
        })
    }

    fn pages(&self) -> usize {
        self.latent.rows() / PAGE
    }
}

/// Queries `[T, H·qk]` (rotary part rotated) and, on the q_lora path, the normed q latent the
/// DSA indexer also reads; the new tokens' latent rows are written into the cache.
fn prepare(
    ops: &mut Ops,
    m: &MlaDims,
    w: &MlaWeights,
    x: &Tensor<f32>,
    pos0: usize,
    cache: &LatentCache,
    rope: &RopeTables,
) -> Result<(Tensor<f32>, Option<Tensor<f32>>), ForwardError> {
    let t = x.rows();
    let (nope, rd) = (m.qk_nope_head_dim, m.qk_rope_head_dim);
    // q_a_layernorm and kv_a_layernorm use eps 1e-6 whatever rms_norm_eps says (transformers).
    let (q, q_resid) = match (&w.q_lora, &w.q_proj) {
        (Some((qa, qa_norm, qb)), _) => {
            let a = ops.linear("mla.q_a_proj", x, qa)?;
            let a = ops.rmsnorm("mla.q_a_layernorm", &a, qa_norm, 1e-6)?;
            (ops.linear("mla.q_b_proj", &a, qb)?, Some(a))
        }
        (None, Some(qp)) => (ops.linear("mla.q_proj", x, qp)?, None),
        (None, None) => {
            return Err(ForwardError::Internal {
                what: "MLA weights".into(),
                message: "neither q_a/q_b nor q_proj bound".into(),
            })
        }
    };
    if m.use_rope {
        ops.rope_into("rope", &q, rope, nope + rd, nope, &q)?;
    }
    let ckv = ops.linear("mla.kv_a_proj_with_mqa", x, &w.kv_a)?;
    let c_new = view(cache.c_kv.row_range(pos0, t), "latent cache rows")?;
    let pe_new = view(cache.k_pe.row_range(pos0, t), "rope-key cache rows")?;
    let ckv_c = view(ckv.col_range(0, m.kv_lora_rank), "c_kv columns")?;
    let ckv_pe = view(ckv.col_range(m.kv_lora_rank, rd), "k_pe columns")?;
    ops.rmsnorm_into("mla.kv_a_layernorm", &ckv_c, &w.kv_a_norm, 1e-6, &c_new)?;
    if m.use_rope {
        ops.rope_into("rope", &ckv_pe, rope, rd, 0, &pe_new)?;
    } else {
        // Kimi Linear's MLA has no positional encoding: the shared key part is cached as is.
        ops.copy("mla.k_pe", &ckv_pe, &pe_new)?;
    }
    Ok((q, q_resid))
}

/// Dense MLA over `x [T, H]` (already normed) whose tokens sit at positions `pos0 .. pos0 + T`;
/// appends their latents to `cache` and returns the `o_proj` output `[T, H]`. A prompt expands
/// the context's keys and values and runs flash attention; one token (decode) attends over the
/// latent cache with absorbed queries (paged split-KV decode with one latent head).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    ops: &mut Ops,
    m: &MlaDims,
    w: &MlaWeights,
    x: &Tensor<f32>,
    pos0: usize,
    cache: &LatentCache,
    rope: &RopeTables,
    scale: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let ctx = pos0 + x.rows();
    let (nope, rd, vd, heads) = (
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.v_head_dim,
        m.heads,
    );
    let qk = nope + rd;
    let (q, _) = prepare(ops, m, w, x, pos0, cache, rope)?;
    if x.rows() == 1 || ops.batched_decode {
        // Decode: attention over the latent cache itself (absorbed queries, one latent kv head,
        // values = the first kv_lora_rank columns of each latent row, each row read once), as
        // serving engines run MLA decode — nothing is expanded per step. A batched cost-only
        // decode runs its `b` sequences in one launch over a shared pool of `b` sequences'
        // pages (shape only: nothing is stored; sequence `s` holds pool pages `s·T..`).
        let b = x.rows();
        let (r, d) = (m.kv_lora_rank, m.kv_lora_rank + rd);
        let q_abs = absorb_queries(ops, m, w, &q)?;
        let q3 = view(q_abs.reshaped(&[b, heads, d]), "absorbed query")?;
        let (pool, tables, lens) = if b == 1 {
            let pages = cache.pages();
            let pool = view(cache.latent.reshaped(&[pages, PAGE, d]), "latent pool")?;
            let tables = view(cache.block_table.reshaped(&[1, pages]), "block table")?;
            let lens = view(Tensor::from_indices(&[1], &[ctx as i32]), "context length")?;
            (pool, tables, lens)
        } else {
            let pages = (pos0 + 1).div_ceil(PAGE);
            (
                ops.mem.poisoned(&[b * pages, PAGE, d]),
                Tensor::shape_only(&[b, pages]),
                Tensor::shape_only(&[b]),
            )
        };
        let max_ctx = if b == 1 { ctx } else { pos0 + 1 };
        let o_lat = ops.latent_decode(&q3, &pool, &tables, &lens, max_ctx, r, scale)?;
        let o_lat = view(o_lat.reshaped(&[b, heads * r]), "latent outputs")?;
        let o = values_from_latent(ops, m, w, &o_lat)?;
        return ops.linear("mla.o_proj", &o, &w.o_proj);
    }

    // Prefill: expand the whole context: kv [ctx, H·(nope+v)], then per-head keys and values.
    let c_all = view(cache.c_kv.row_range(0, ctx), "latent cache")?;
    let pe_all = view(cache.k_pe.row_range(0, ctx), "rope-key cache")?;
    // The expansion reads this sequence's whole context: per-sequence work.
    ops.sequence_scope = true;
    let kv = ops.linear("mla.kv_b_proj", &c_all, &w.kv_b)?;
    let k = ops.mem.act(ctx, heads * qk);
    let v = ops.mem.act(ctx, heads * vd);
    for h in 0..heads {
        let src = h * (nope + vd);
        ops.copy(
            "mla.expand_kv",
            &view(kv.col_range(src, nope), "k_nope")?,
            &view(k.col_range(h * qk, nope), "key head")?,
        )?;
        ops.copy(
            "mla.expand_kv",
            &pe_all,
            &view(k.col_range(h * qk + nope, rd), "key rope part")?,
        )?;
        ops.copy(
            "mla.expand_kv",
            &view(kv.col_range(src + nope, vd), "value")?,
            &view(v.col_range(h * vd, vd), "value head")?,
        )?;
    }
    ops.sequence_scope = false;
    let o = ops.attention("mla.attention", &q, &k, &v, qk, vd, scale)?;
    ops.linear("mla.o_proj", &o, &w.o_proj)
}

/// DeepSeek-V3.2 sparse MLA (see the module docs): indexer → top-k → absorbed attention over the
/// selected latent rows. `rope_half` holds the same angles as `rope` for the indexer's
/// half-split rotation of the first `qk_rope_head_dim` dims of its heads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_sparse(
    ops: &mut Ops,
    m: &MlaDims,
    ix: &IndexerDims,
    w: &MlaWeights,
    x: &Tensor<f32>,
    pos0: usize,
    cache: &LatentCache,
    rope: &RopeTables,
    rope_half: &RopeTables,
    scale: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let t = x.rows();
    let ctx = pos0 + t;
    let (heads, r) = (m.heads, m.kv_lora_rank);
    let d = r + m.qk_rope_head_dim;
    let (Some(iw), Some(keys)) = (&w.indexer, &cache.index_keys) else {
        return Err(ForwardError::Internal {
            what: "sparse MLA".into(),
            message: "no indexer weights or key cache".into(),
        });
    };
    let (q, q_resid) = prepare(ops, m, w, x, pos0, cache, rope)?;
    let q_resid = q_resid.ok_or_else(|| ForwardError::Internal {
        what: "DSA indexer".into(),
        message: "needs the q_lora latent".into(),
    })?;

    // Indexer: queries [T, Hi·Di] and this step's keys, both rotated half-split on their first
    // qk_rope_head_dim dims; per-head weights [T, Hi] (Hi^-1/2 folded into weights_proj at load).
    let q_idx = ops.linear("indexer.wq_b", &q_resid, &iw.wq_b)?;
    ops.rope_into("rope", &q_idx, rope_half, ix.head_dim, 0, &q_idx)?;
    let k_raw = ops.linear("indexer.wk", x, &iw.wk)?;
    let k_normed = ops.layernorm("indexer.k_norm", &k_raw, &iw.k_norm_w, &iw.k_norm_b, 1e-6)?;
    let k_new = view(keys.row_range(pos0, t), "indexer key cache rows")?;
    ops.rope_into("rope", &k_normed, rope_half, ix.head_dim, 0, &k_new)?;
    let head_w = ops.linear("indexer.weights_proj", x, &iw.weights_proj)?;
    let pages = cache.pages();
    let key_pool = view(
        keys.reshaped(&[pages, PAGE, ix.head_dim]),
        "indexer key pool",
    )?;
    let scores = ops.indexer_scores(&q_idx, &head_w, &key_pool, &cache.block_table, ctx, ix)?;
    let selected = ops.topk_select(&scores, ctx, ix.topk)?;

    let q_abs = absorb_queries(ops, m, w, &q)?;
    let q3 = view(q_abs.reshaped(&[t, heads, d]), "absorbed queries")?;
    let pool = view(cache.latent.reshaped(&[pages, PAGE, d]), "latent pool")?;
    let o_lat = ops.sparse_mla(
        &q3,
        &pool,
        &cache.block_table,
        &selected,
        ctx,
        ix.topk,
        r,
        scale,
    )?;
    let o_lat = view(o_lat.reshaped(&[t, heads * r]), "latent outputs")?;

    let o = values_from_latent(ops, m, w, &o_lat)?;
    ops.linear("mla.o_proj", &o, &w.o_proj)
}

/// Absorbed queries `[T, H·(R + rd)]`: per head `q_nope · W_UK[h]` (kv_b_proj's key rows of head
/// `h`) then `q_pe`, so attention runs over the latent cache without expanding it.
fn absorb_queries(
    ops: &mut Ops,
    m: &MlaDims,
    w: &MlaWeights,
    q: &Tensor<f32>,
) -> Result<Tensor<f32>, ForwardError> {
    let (nope, rd, heads, r) = (
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.heads,
        m.kv_lora_rank,
    );
    let (qk, d) = (nope + rd, r + rd);
    let q_abs = ops.mem.act(q.rows(), heads * d);
    for h in 0..heads {
        let w_uk_t = view(w.w_uk_t.row_range(h * r, r), "W_UK rows")?;
        ops.linear_into(
            "mla.absorb_q",
            &view(q.col_range(h * qk, nope), "q_nope")?,
            &w_uk_t,
            &view(q_abs.col_range(h * d, r), "absorbed query")?,
        )?;
        ops.copy(
            "mla.absorb_q",
            &view(q.col_range(h * qk + nope, rd), "q_pe")?,
            &view(q_abs.col_range(h * d + r, rd), "absorbed query rope part")?,
        )?;
    }
    Ok(q_abs)
}

/// Back to value space: `o[h] = o_lat[h] · W_UV[h]ᵀ` (kv_b_proj's value rows of head `h`), from
/// latent outputs `[T, H·R]` to `[T, H·v_head_dim]`.
fn values_from_latent(
    ops: &mut Ops,
    m: &MlaDims,
    w: &MlaWeights,
    o_lat: &Tensor<f32>,
) -> Result<Tensor<f32>, ForwardError> {
    let (vd, heads, r) = (m.v_head_dim, m.heads, m.kv_lora_rank);
    let o = ops.mem.act(o_lat.rows(), heads * vd);
    for h in 0..heads {
        let w_uv = view(w.w_uv.row_range(h * vd, vd), "W_UV rows")?;
        ops.linear_into(
            "mla.absorb_o",
            &view(o_lat.col_range(h * r, r), "latent output head")?,
            &w_uv,
            &view(o.col_range(h * vd, vd), "output head")?,
        )?;
    }
    Ok(o)
}
