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

use super::cache_format::CacheTensor;
use super::ops::{view, Mem, Ops, RopeTables};
use super::params::MlaWeights;
use super::sequences::{SeqPages, SeqRows, PAGE};
use super::ForwardError;
use crate::config::{IndexerDims, MlaDims};
use dsl_core::Tensor;

/// One MLA layer's paged latent pool, shared by every sequence (pages from the runner's
/// allocator, [`super::sequences`]).
pub(crate) struct LatentPool {
    /// `[pages·PAGE, kv_lora_rank + qk_rope_head_dim]`: `[c_kv | k_pe]` per token.
    pub latent: CacheTensor,
    /// DeepSeek-V3.2: the indexer's key pool `[pages·PAGE, index_head_dim]`.
    pub index_keys: Option<CacheTensor>,
}

impl LatentPool {
    /// An empty (poisoned) pool of `pages` pages.
    pub fn new(
        m: &MlaDims,
        index_head_dim: Option<usize>,
        pages: usize,
        mem: Mem,
    ) -> Result<LatentPool, ForwardError> {
        let d = m.kv_lora_rank + m.qk_rope_head_dim;
        // Dense and sparse MLA alike read an FP8 latent when the cache is FP8, and the DSA
        // indexer FP8 keys (one scale per token each).
        let latent = view(
            CacheTensor::latent(mem.cache, mem, pages, PAGE, d, false),
            "latent pool",
        )?;
        let index_keys = index_head_dim
            .map(|di| {
                view(
                    CacheTensor::latent(mem.cache, mem, pages, PAGE, di, false),
                    "indexer key pool",
                )
            })
            .transpose()?;
        Ok(LatentPool { latent, index_keys })
    }

    fn pages(&self) -> usize {
        self.latent.rows() / PAGE
    }

    /// The pool as pages `[pages, PAGE, d]`, as the paged kernels read it.
    fn paged(&self) -> Result<CacheTensor, ForwardError> {
        let d = self.latent.cols();
        view(
            self.latent.reshaped(&[self.pages(), PAGE, d]),
            "latent pool",
        )
    }
}

/// What [`prepare`] gives the attention: queries `[T, H·qk]` (rotary part rotated), on the
/// q_lora path the normed q latent the DSA indexer also reads, and the new tokens' latent rows
/// `[T, d]` (already appended to the pool).
struct Prepared {
    q: Tensor<f32>,
    q_resid: Option<Tensor<f32>>,
    new_latent: Tensor<f32>,
}

/// Projects the queries and the new tokens' latents of `x` (rows of one or more sequences, `rope`
/// at each row's position), and appends each sequence's latents to its pages of the pool.
fn prepare(
    ops: &mut Ops,
    m: &MlaDims,
    w: &MlaWeights,
    x: &Tensor<f32>,
    seqs: &[SeqRows],
    pool: &LatentPool,
    rope: &RopeTables,
) -> Result<Prepared, ForwardError> {
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
    let new_latent = ops.mem.act(t, m.kv_lora_rank + rd);
    let c_new = view(new_latent.col_range(0, m.kv_lora_rank), "new c_kv")?;
    let pe_new = view(new_latent.col_range(m.kv_lora_rank, rd), "new k_pe")?;
    let ckv_c = view(ckv.col_range(0, m.kv_lora_rank), "c_kv columns")?;
    let ckv_pe = view(ckv.col_range(m.kv_lora_rank, rd), "k_pe columns")?;
    ops.rmsnorm_into("mla.kv_a_layernorm", &ckv_c, &w.kv_a_norm, 1e-6, &c_new)?;
    if m.use_rope {
        ops.rope_into("rope", &ckv_pe, rope, rd, 0, &pe_new)?;
    } else {
        // Kimi Linear's MLA has no positional encoding: the shared key part is cached as is.
        ops.copy("mla.k_pe", &ckv_pe, &pe_new)?;
    }
    append_rows(ops, "mla.cache_append", &new_latent, seqs, &pool.latent)?;
    Ok(Prepared {
        q,
        q_resid,
        new_latent,
    })
}

/// The sequence's latent rows `0 .. ctx` in one tensor `[ctx, d]`: the new rows themselves when
/// they are the whole context, else gathered from its pages.
fn context_rows(
    ops: &mut Ops,
    op: &str,
    pool: &CacheTensor,
    pages: &SeqPages,
    new: &Tensor<f32>,
    ctx: usize,
) -> Result<Tensor<f32>, ForwardError> {
    if new.rows() == ctx {
        Ok(new.clone())
    } else {
        ops.gather_cache_rows(op, pool, &pages.rows(ctx))
    }
}

/// Dense MLA over `x [T, H]` (already normed): the rows of one sequence (a prompt chunk or one
/// decode token), or one decode token of each of several sequences (`seqs`, with `rope` at each
/// row's position). Appends the new latents to each sequence's pages of `pool` and returns the
/// `o_proj` output `[T, H]`. A prompt expands the context's keys and values and runs flash
/// attention; decode tokens attend over the latent pages with absorbed queries, the whole batch
/// in one launch (paged split-KV decode with one latent head).
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward(
    ops: &mut Ops,
    m: &MlaDims,
    w: &MlaWeights,
    x: &Tensor<f32>,
    seqs: &[SeqRows],
    pool: &LatentPool,
    rope: &RopeTables,
    scale: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let (nope, rd, vd, heads) = (
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.v_head_dim,
        m.heads,
    );
    let qk = nope + rd;
    let (r, d) = (m.kv_lora_rank, m.kv_lora_rank + rd);
    let Prepared { q, new_latent, .. } = prepare(ops, m, w, x, seqs, pool, rope)?;
    let b = x.rows();
    if ops.batched_decode && b > 1 {
        // A batched cost-only decode: `b` sequences at one position, in one launch over a
        // shared pool of `b` sequences' pages (shape only: nothing is stored; sequence `s` holds
        // pool pages `s·T..`).
        let pos0 = seqs.first().map_or(0, |sq| sq.pos0);
        let q_abs = absorb_queries(ops, m, w, &q)?;
        let q3 = view(q_abs.reshaped(&[b, heads, d]), "absorbed query")?;
        let pages = (pos0 + 1).div_ceil(PAGE);
        let pool = view(
            CacheTensor::latent(ops.mem.cache, ops.mem, b * pages, PAGE, d, true),
            "latent pool",
        )?;
        let o_lat = ops.latent_decode(
            &q3,
            &pool,
            &Tensor::shape_only(&[b, pages]),
            &Tensor::shape_only(&[b]),
            pos0 + 1,
            r,
            scale,
        )?;
        let o_lat = view(o_lat.reshaped(&[b, heads * r]), "latent outputs")?;
        let o = values_from_latent(ops, m, w, &o_lat)?;
        return ops.linear("mla.o_proj", &o, &w.o_proj);
    }
    if seqs.iter().all(|sq| sq.rows == 1) {
        // Decode: attention over the latent pages themselves (absorbed queries, one latent kv
        // head, values = the first kv_lora_rank columns of each latent row, each row read once),
        // as serving engines run MLA decode — nothing is expanded per step. Every sequence in one
        // launch, each through its own row of the block tables for its own length.
        let n = seqs.len();
        let q_abs = absorb_queries(ops, m, w, &q)?;
        let q3 = view(q_abs.reshaped(&[n, heads, d]), "absorbed query")?;
        let (tables, lens, max_ctx) = SeqRows::decode_tables(seqs)?;
        let o_lat = ops.latent_decode(&q3, &pool.paged()?, &tables, &lens, max_ctx, r, scale)?;
        let o_lat = view(o_lat.reshaped(&[n, heads * r]), "latent outputs")?;
        let o = values_from_latent(ops, m, w, &o_lat)?;
        return ops.linear("mla.o_proj", &o, &w.o_proj);
    }
    let [sq] = seqs else {
        return Err(ForwardError::Internal {
            what: "MLA".into(),
            message: "several sequences in one call must each bring one decode token".into(),
        });
    };
    let (pos0, pages) = (sq.pos0, sq.pages);
    let ctx = pos0 + b;

    // Prefill: expand the whole context: kv [ctx, H·(nope+v)], then per-head keys and values.
    // The gather and the expansion read this sequence's whole context: per-sequence work.
    ops.sequence_scope = true;
    let all = context_rows(
        ops,
        "mla.gather_context",
        &pool.latent,
        pages,
        &new_latent,
        ctx,
    )?;
    let c_all = view(all.col_range(0, m.kv_lora_rank), "latent context")?;
    let pe_all = view(all.col_range(m.kv_lora_rank, rd), "rope-key context")?;
    let kv = ops.linear("mla.kv_b_proj", &c_all, &w.kv_b)?;
    let k = ops.mem.act(ctx, heads * qk);
    let v = ops.mem.act(ctx, heads * vd);
    // One strided copy each for the keys' nope parts and the values (rows (token, head) of the
    // three tensors); the shared rope key goes to every head by one copy per head (a row-index
    // gather of 64-value rows costs a descriptor per row: 8× these copies at 8K tokens).
    let kv_heads = view(kv.reshaped(&[ctx * heads, nope + vd]), "kv heads")?;
    let k_heads = view(k.reshaped(&[ctx * heads, qk]), "key heads")?;
    ops.copy(
        "mla.expand_kv",
        &view(kv_heads.col_range(0, nope), "k_nope")?,
        &view(k_heads.col_range(0, nope), "key heads' nope part")?,
    )?;
    ops.copy(
        "mla.expand_kv",
        &view(kv_heads.col_range(nope, vd), "values")?,
        &view(v.reshaped(&[ctx * heads, vd]), "value heads")?,
    )?;
    for h in 0..heads {
        ops.copy(
            "mla.expand_kv",
            &pe_all,
            &view(k.col_range(h * qk + nope, rd), "key rope part")?,
        )?;
    }
    ops.sequence_scope = false;
    let o = ops.attention("mla.attention", &q, &k, &v, qk, vd, scale, 0, None)?;
    ops.linear("mla.o_proj", &o, &w.o_proj)
}

/// Appends each sequence's rows of `new` (`[T, d]`, the rows of `seqs`) to its pages of `pool`,
/// the whole step in one launch.
pub(crate) fn append_rows(
    ops: &mut Ops,
    op: &str,
    new: &Tensor<f32>,
    seqs: &[SeqRows],
    pool: &CacheTensor,
) -> Result<(), ForwardError> {
    let slots = SeqRows::append_slots(seqs)?;
    // One sequence's chunk is that sequence's work; a batch's rows (several sequences, or a
    // batched cost-only decode's one row per sequence) are covered by this one launch.
    let per_sequence = seqs.len() == 1 && !ops.batched_decode;
    ops.kv_append(op, new, &slots, pool, per_sequence)
}

/// What [`prepare_sparse`] gives the DSA attention: the queries (as [`Prepared::q`]), the
/// indexer's queries `[T, Hi·Di]` (rotated) and per-head weights `[T, Hi]`, and the indexer key
/// pool the new keys went into.
struct Indexed<'a> {
    q: Tensor<f32>,
    q_idx: Tensor<f32>,
    head_w: Tensor<f32>,
    keys: &'a CacheTensor,
}

/// [`prepare`], then the lightning indexer's projections of `x`: queries `[T, Hi·Di]` and this
/// step's keys, both rotated half-split on their first `qk_rope_head_dim` dims (`rope_half`), and
/// per-head weights `[T, Hi]` (`Hi^-1/2` folded into weights_proj at load). Each sequence's new
/// keys are appended to its pages of the indexer key pool.
#[allow(clippy::too_many_arguments)]
fn prepare_sparse<'a>(
    ops: &mut Ops,
    m: &MlaDims,
    ix: &IndexerDims,
    w: &MlaWeights,
    x: &Tensor<f32>,
    seqs: &[SeqRows],
    pool: &'a LatentPool,
    rope: &RopeTables,
    rope_half: &RopeTables,
) -> Result<Indexed<'a>, ForwardError> {
    let (Some(iw), Some(keys)) = (&w.indexer, &pool.index_keys) else {
        return Err(ForwardError::Internal {
            what: "sparse MLA".into(),
            message: "no indexer weights or key cache".into(),
        });
    };
    let Prepared { q, q_resid, .. } = prepare(ops, m, w, x, seqs, pool, rope)?;
    let q_resid = q_resid.ok_or_else(|| ForwardError::Internal {
        what: "DSA indexer".into(),
        message: "needs the q_lora latent".into(),
    })?;
    let q_idx = ops.linear("indexer.wq_b", &q_resid, &iw.wq_b)?;
    ops.rope_into("rope", &q_idx, rope_half, ix.head_dim, 0, &q_idx)?;
    let k_raw = ops.linear("indexer.wk", x, &iw.wk)?;
    let k_normed = ops.layernorm("indexer.k_norm", &k_raw, &iw.k_norm_w, &iw.k_norm_b, 1e-6)?;
    let k_new = ops.mem.act(x.rows(), ix.head_dim);
    ops.rope_into("rope", &k_normed, rope_half, ix.head_dim, 0, &k_new)?;
    append_rows(ops, "indexer.cache_append", &k_new, seqs, keys)?;
    // The per-head weights scale the scores top-k reads: f32, as the selector weight itself.
    let head_w = ops.linear_f32("indexer.weights_proj", x, &iw.weights_proj)?;
    Ok(Indexed {
        q,
        q_idx,
        head_w,
        keys,
    })
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
    pool: &LatentPool,
    pages: &SeqPages,
    rope: &RopeTables,
    rope_half: &RopeTables,
    scale: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let t = x.rows();
    let seq = [SeqRows {
        row0: 0,
        rows: t,
        pos0,
        pages,
    }];
    if ops.batched_decode && t > 1 {
        // A batched cost-only decode: `t` sequences at one position (their new rows appended as
        // one block), one launch per kernel.
        return forward_sparse_decodes(ops, m, ix, w, x, &seq, pool, rope, rope_half, scale);
    }
    let ctx = pos0 + t;
    let (heads, r) = (m.heads, m.kv_lora_rank);
    let d = r + m.qk_rope_head_dim;
    let Indexed {
        q,
        q_idx,
        head_w,
        keys,
    } = prepare_sparse(ops, m, ix, w, x, &seq, pool, rope, rope_half)?;
    let key_pool = view(
        keys.reshaped(&[pool.pages(), PAGE, ix.head_dim]),
        "indexer key pool",
    )?;
    let scores = ops.indexer_scores(&q_idx, &head_w, &key_pool, &pages.table_t, ctx, ix)?;
    let selected = ops.topk_select(&scores, ctx, ix.topk)?;

    let q_abs = absorb_queries(ops, m, w, &q)?;
    let q3 = view(q_abs.reshaped(&[t, heads, d]), "absorbed queries")?;
    let o_lat = ops.sparse_mla(
        &q3,
        &pool.paged()?,
        &pages.table_t,
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

/// DeepSeek-V3.2 sparse MLA for one decode token of each sequence of `seqs` (rows of `x`, `rope`
/// and `rope_half` at each row's position): the indexer, top-k and sparse attention each run once
/// for the whole batch, every sequence through its own block table and length
/// ([`kernels::attention::sparse::indexer_decode_batch`] and its two companions). In a batched
/// cost-only decode (shape only) `seqs` is one block of rows, all at one position, and row `s`
/// holds pool pages `s·T..`, as in [`forward`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_sparse_decodes(
    ops: &mut Ops,
    m: &MlaDims,
    ix: &IndexerDims,
    w: &MlaWeights,
    x: &Tensor<f32>,
    seqs: &[SeqRows],
    pool: &LatentPool,
    rope: &RopeTables,
    rope_half: &RopeTables,
    scale: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let n = x.rows();
    let (heads, r) = (m.heads, m.kv_lora_rank);
    let d = r + m.qk_rope_head_dim;
    let Indexed {
        q,
        q_idx,
        head_w,
        keys,
    } = prepare_sparse(ops, m, ix, w, x, seqs, pool, rope, rope_half)?;
    let (tables, lens, max_ctx, key_pool, latent_pool) = if ops.batched_decode {
        let max_ctx = seqs.first().map_or(1, |sq| sq.pos0 + 1);
        let pages = max_ctx.div_ceil(PAGE);
        (
            Tensor::shape_only(&[n, pages]),
            Tensor::shape_only(&[n]),
            max_ctx,
            view(
                CacheTensor::latent(ops.mem.cache, ops.mem, n * pages, PAGE, ix.head_dim, true),
                "indexer key pool",
            )?,
            view(
                CacheTensor::latent(ops.mem.cache, ops.mem, n * pages, PAGE, d, true),
                "latent pool",
            )?,
        )
    } else {
        let (tables, lens, max_ctx) = SeqRows::decode_tables(seqs)?;
        let key_pool = view(
            keys.reshaped(&[pool.pages(), PAGE, ix.head_dim]),
            "indexer key pool",
        )?;
        (tables, lens, max_ctx, key_pool, pool.paged()?)
    };
    let q_idx3 = view(
        q_idx.reshaped(&[n, ix.heads, ix.head_dim]),
        "indexer queries",
    )?;
    let head_w3 = view(head_w.reshaped(&[n, ix.heads, 1]), "indexer head weights")?;
    let scores =
        ops.indexer_scores_batch(&q_idx3, &head_w3, &key_pool, &tables, &lens, max_ctx, ix)?;
    let selected = ops.topk_select_batch(&scores, &lens, max_ctx, ix.topk)?;
    let q_abs = absorb_queries(ops, m, w, &q)?;
    let q3 = view(q_abs.reshaped(&[n, heads, d]), "absorbed queries")?;
    let o_lat = ops.sparse_mla_batch(
        &q3,
        &latent_pool,
        &tables,
        &lens,
        &selected,
        max_ctx,
        ix.topk,
        r,
        scale,
    )?;
    let o_lat = view(o_lat.reshaped(&[n, heads * r]), "latent outputs")?;
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
    ops.linear_heads_into("mla.absorb_q", q, &w.w_uk_t, &q_abs, heads, qk, d)?;
    // Every head's rope part in one strided copy: rows (token, head) of both tensors.
    let hd = q.rows() * heads;
    ops.copy(
        "mla.absorb_q",
        &view(
            view(q.reshaped(&[hd, qk]), "q heads")?.col_range(nope, rd),
            "q_pe",
        )?,
        &view(
            view(q_abs.reshaped(&[hd, d]), "absorbed heads")?.col_range(r, rd),
            "absorbed query rope part",
        )?,
    )?;
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
    ops.linear_heads_into("mla.absorb_o", o_lat, &w.w_uv, &o, heads, r, vd)?;
    Ok(o)
}
