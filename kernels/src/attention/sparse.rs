//! DeepSeek-V3.2 indexed sparse attention (DSA), decode and prefill: the lightning indexer scores
//! every past token, a top-k kernel selects `index_topk` of them per query token, and MLA's
//! absorbed attention runs over the selected latent rows only (MQA, gathered from the paged
//! cache).
//!
//! Layouts (one sequence; `sq` query tokens, the last `sq` positions of a context of `ctx`):
//! - indexer: `q_idx [sq, HI·DI]`, `w [sq, HI]` (f32, `index_n_heads^-1/2` folded in), key cache
//!   `k_idx_pool [pages, P, DI]`; scores `[sq, n·P]`, `−∞` after each query's position;
//! - selections `[sq, K]` (i32, best first);
//! - latent cache `kv_pool [pages, P, D]` (`D = kv_lora + rope`), values = its first `DV` columns;
//!   `q [sq, H, D]` (absorbed queries), `o [sq, H, DV]`;
//! - `block_table [n]` (i32) shared by both caches (the indexer key cache is part of the paged cache).
//!
//! Decode (`sq = 1`) scores with [`indexer_decode`] (index heads as the matrix rows); prefill
//! with [`indexer_prefill`] (query tokens as the rows, one matrix product per index head, pages
//! after a block's last query skipped: seq²/2 work). [`topk_select`] and [`sparse_mla`] serve
//! both: one program per query row / per (head block, query token), each query with its own
//! selection, so the attention work grows with seq·topk, not with the context.
//!
//! ## Prefill semantics, and where the two reference codes differ
//! Checked against DeepSeek-V3.2-Exp `inference/model.py` (`Indexer.forward`, `MLA.forward`) and
//! transformers 5.24 `models/deepseek_v32/modeling_deepseek_v32.py` (`DeepseekV32Indexer`,
//! `DeepseekV32Attention`); day0 follows transformers where they differ:
//! - **k per row.** DeepSeek takes `topk(min(index_topk, end_pos))` of the causally masked
//!   scores, transformers `topk(min(index_topk, T))` with `T` the key count; both then re-apply
//!   the causal mask, so a row with fewer than `index_topk` causal candidates attends all of them.
//!   Here row `t` keeps exactly `min(index_topk, position + 1)` entries (the same keys).
//! - **Scale.** transformers applies `softmax_scale` before the ReLU, DeepSeek after (inside
//!   `weights`): equal for a positive scale; the kernel folds it into the head weights.
//! - **FP8 / Hadamard.** DeepSeek quantises the indexer's q and k to FP8 after a Hadamard
//!   rotation; transformers scores in f32 without either. day0 keeps the queries unquantised and
//!   unrotated; with an FP8 cache (`--kv-dtype fp8`) its keys are E4M3 codes with one scale per
//!   token (`super::fp8_kv::indexer_prefill_fp8`, `indexer_decode_batch_fp8`).
//! - **Attention form.** Both reference codes run prefill as naive MHA with a `0/−∞` index mask;
//!   day0 runs the absorbed latent MQA over the gathered rows (FlashMLA's sparse prefill form),
//!   which [`super::reference`] proves equal to the naive form.
//! - **Ties.** `torch.topk` leaves the order of equal scores unspecified; here higher score first,
//!   then lower index (see [`super::reference::topk`]).

use super::decode::online_softmax_step;
use super::fp8_kv::{
    indexer_decode_batch_fp8, indexer_prefill_fp8, sparse_mla_batch_fp8, sparse_mla_fp8, Fp8Tensors,
};
use super::reference::{indexer_scores, mqa_sparse, select_topk, IndexerShape, MqaShape};
use dsl_core::prelude::*;
use dsl_core::SimError;

/// Lightning indexer, one program per page: `I(s) = Σ_j w_j · ReLU(scale · q_j·k_s)`, `−∞` past
/// the context; scores written in logical token order to `scores [1, n·page]`. `q_idx [HI', DI']`
/// (index heads as rows), the index head dim and the page size (`k_idx_pool [pages, page, DI']`)
/// are run-time values covered by `HI`/`DI`-wide tiles and a loop over `BK` keys of the page.
#[kernel(grid = (cdiv(ctx_len, k_idx_pool.shape()[1]),), tunable(HI = [64, 16, 32, 128], DI = [128, 32, 64, 256], BK = [64, 16, 128]), helpers(score_page))]
pub fn indexer_decode<Q: Float, T: Float>(
    q_idx: &Tensor<Q>,
    w: &Tensor<f32>,
    k_idx_pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    scores: &Tensor<f32>,
    ctx_len: usize,
    idx_scale: f32,
) {
    require(
        q_idx.rows() <= HI && q_idx.cols() <= DI,
        "the HI/DI tiles must cover the index heads and index head dim (dsa_tiles)",
    );
    let p = program_id(0);
    let page_size = k_idx_pool.shape()[1];
    let page = load_index(block_table, p, p);
    // Queries convert to the key pool's format on chip.
    let tq = cast::<T>(&load_async::<HI, DI>(q_idx, 0, 0));
    let tw = load_async::<HI, 1>(w, 0, 0);
    // This page's scores: a key tile wider than the page writes nothing past it.
    let out = scores.cols_clipped(p * page_size, page_size);
    score_page::<T, HI, DI, BK>(
        &tq,
        &tw,
        &k_idx_pool.at(page),
        &out,
        p * page_size,
        ctx_len,
        idx_scale,
    );
}

/// The indexer scores of one page of keys (`keys [P, DI']`) for one query token's index heads
/// (`tq`, weights `tw`), `BK` keys at a time, written to `out`'s first row (`−∞` from `ctx_len` on;
/// the page starts at token `first`).
#[kernel(helper)]
#[allow(clippy::too_many_arguments)]
pub fn score_page<T: Float, const HI: usize, const DI: usize, const BK: usize>(
    tq: &Tile<T, HI, DI>,
    tw: &Tile<f32, HI, 1>,
    keys: &Tensor<T>,
    out: &Tensor<f32>,
    first: usize,
    ctx_len: usize,
    idx_scale: f32,
) {
    for kb in (0..keys.rows()).step_by(BK) {
        let tk = load_async::<BK, DI>(keys, kb, 0);
        let mut s = zeros::<f32, HI, BK>();
        mma_bt(&mut s, tq, &tk);
        let act = relu(&scale(&s, idx_scale));
        let mut score = zeros::<f32, 1, BK>();
        mma_at(&mut score, tw, &act);
        store(
            out,
            0,
            kb,
            &mask_keys(&score, 0, first + kb, ctx_len, false),
        );
    }
}

/// Lightning indexer for one query token of each of `S` sequences (batched decode), one program
/// per (sequence, page): as [`indexer_decode()`] with `q_idx [S, HI', DI']`, `w [S, HI', 1]`,
/// block tables `[S, T]`, lengths `ctx_lens [S]` and `scores [S, T·P]`. A page past its sequence's
/// length is written `−∞` without being read, so a step's work follows each sequence's own
/// context. In a cost-only run without data every length is `max_ctx` and sequence `s`'s page `p`
/// is pool page `s·T + p`.
#[kernel(grid = (ctx_lens.len(), cdiv(max_ctx, k_idx_pool.shape()[1])), tunable(HI = [64, 16, 32, 128], DI = [128, 32, 64, 256], BK = [64, 16, 128]), helpers(score_page))]
#[allow(clippy::too_many_arguments)]
pub fn indexer_decode_batch<Q: Float, T: Float>(
    q_idx: &Tensor<Q>,
    w: &Tensor<f32>,
    k_idx_pool: &Tensor<T>,
    block_tables: &Tensor<i32>,
    ctx_lens: &Tensor<i32>,
    scores: &Tensor<f32>,
    max_ctx: usize,
    idx_scale: f32,
) {
    require(
        q_idx.shape()[1] <= HI && q_idx.shape()[2] <= DI,
        "the HI/DI tiles must cover the index heads and index head dim (dsa_tiles)",
    );
    let s = program_id(0);
    let p = program_id(1);
    let page_size = k_idx_pool.shape()[1];
    let ctx_len = load_index(ctx_lens, s, max_ctx);
    let out = scores
        .rows_clipped(s, s + 1)
        .cols_clipped(p * page_size, page_size);
    if p * page_size >= ctx_len {
        for kb in (0..page_size).step_by(BK) {
            store(&out, 0, kb, &full::<f32, 1, BK>(f32::NEG_INFINITY));
        }
    } else {
        let page = load_index(&block_tables.at(s), p, s * block_tables.cols() + p);
        let tq = cast::<T>(&load_async::<HI, DI>(&q_idx.at(s), 0, 0));
        let tw = load_async::<HI, 1>(&w.at(s), 0, 0);
        score_page::<T, HI, DI, BK>(
            &tq,
            &tw,
            &k_idx_pool.at(page),
            &out,
            p * page_size,
            ctx_len,
            idx_scale,
        );
    }
}

/// Lightning indexer for a block of query tokens (prefill), one program per (block of `BQ` query
/// tokens, page of keys): `I(t,s) = Σ_j w(t,j) · ReLU(scale · q(t,j)·k(s))` for keys at or
/// before token `t`'s position (`ctx_len − sq + t`), `−∞` after, written to `scores [sq, n·page]`.
/// `q_idx [sq, HI·DI']` (index heads side by side), `w [sq, HI]`; the index head dim
/// (`q_idx.cols() / w.cols()`) and the page size are run-time values, covered by `DI`-wide tiles
/// and a loop over `BK` keys of the page. A page wholly in the future of the block is written
/// `−∞` without being read, so the work grows with seq²/2.
#[kernel(grid = (cdiv(q_idx.rows(), BQ), cdiv(ctx_len, k_idx_pool.shape()[1])), tunable(BQ = [64, 16, 32, 128], DI = [128, 32, 64, 256], BK = [64, 16, 128]))]
pub fn indexer_prefill<Q: Float, T: Float>(
    q_idx: &Tensor<Q>,
    w: &Tensor<f32>,
    k_idx_pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    scores: &Tensor<f32>,
    ctx_len: usize,
    idx_scale: f32,
) {
    let t0 = program_id(0) * BQ;
    let p = program_id(1);
    let page_size = k_idx_pool.shape()[1];
    let di = q_idx.cols() / w.cols();
    require(
        di <= DI,
        "the DI tile must cover the index head dim (dsa_tiles)",
    );
    let q_pos = ctx_len - q_idx.rows() + t0;
    let out = scores.cols_clipped(p * page_size, page_size);
    let future = p * page_size >= q_pos + BQ;
    let page = if future {
        0
    } else {
        load_index(block_table, p, p)
    };
    for kb in (0..page_size).step_by(BK) {
        let mut score = full::<f32, BQ, BK>(f32::NEG_INFINITY);
        if !future {
            let tk = load_async::<BK, DI>(&k_idx_pool.at(page), kb, 0);
            let mut acc = zeros::<f32, BQ, BK>();
            for j in 0..w.cols() {
                let tq = cast::<T>(&load_async::<BQ, DI>(
                    &q_idx.cols_clipped(j * di, di),
                    t0,
                    0,
                ));
                // The positive scale commutes with ReLU: fold it into the per-token head weights.
                let wj = scale(&load_async::<BQ, 1>(w, t0, j), idx_scale);
                let mut s = zeros::<f32, BQ, BK>();
                mma_bt(&mut s, &tq, &tk);
                acc = add(&acc, &mul_col(&relu(&s), &wj));
            }
            score = mask_keys(&acc, q_pos, p * page_size + kb, ctx_len, true);
        }
        store(&out, t0, kb, &score);
    }
}

/// Top-`K` selection, one program per query row of `scores [sq, L]` (the last `sq` positions of a
/// context of `ctx_len` tokens): row `t` ranks only its causal candidates `0..=ctx_len − sq + t`,
/// best first, deterministic ties (see `dsl_core::intrinsics::topk_update`), and writes the token
/// indices to `selected [sq, K]`. A row with fewer than `K` candidates leaves `−∞`-scored filler
/// after them; attention reads only the first `min(K, position + 1)`.
#[kernel(grid = (scores.rows(),), tunable(K = [2048, 16, 64, 256, 512, 1024], C = [1024, 256]), helpers(topk_row))]
pub fn topk_select(scores: &Tensor<f32>, selected: &Tensor<i32>, ctx_len: usize) {
    require(
        selected.cols() <= K,
        "the K tile must cover index_topk (the columns of `selected`)",
    );
    let t = program_id(0);
    // Candidates after the row's position are −∞ already; skipping them saves the merge passes.
    let end = (ctx_len + t + 1).saturating_sub(scores.rows());
    topk_row::<K, C>(scores, selected, t, end);
}

/// Ranks row `t`'s first `end` candidates of `scores`, `C` at a time, and writes the best `K`
/// token indices (best first, `−1` filler) to row `t` of `selected`.
#[kernel(helper)]
pub fn topk_row<const K: usize, const C: usize>(
    scores: &Tensor<f32>,
    selected: &Tensor<i32>,
    t: usize,
    end: usize,
) {
    let mut best = full::<f32, 1, K>(f32::NEG_INFINITY);
    let mut best_idx = full::<i32, 1, K>(-1.0);
    for c0 in (0..end).step_by(C) {
        let cand = load_async_or::<1, C>(scores, t, c0, f32::NEG_INFINITY);
        topk_update(&mut best, &mut best_idx, &cand, c0);
    }
    store(selected, t, 0, &best_idx);
}

/// Top-`K` selection for one decode token of each of `S` sequences: row `s` of `scores [S, L]`
/// ranks its sequence's `ctx_lens[s]` candidates (as [`topk_select()`], best first, deterministic
/// ties) into row `s` of `selected [S, K]`. Cost-only: every length is `max_ctx`.
#[kernel(grid = (scores.rows(),), tunable(K = [2048, 16, 64, 256, 512, 1024], C = [1024, 256]), helpers(topk_row))]
pub fn topk_select_batch(
    scores: &Tensor<f32>,
    selected: &Tensor<i32>,
    ctx_lens: &Tensor<i32>,
    max_ctx: usize,
) {
    require(
        selected.cols() <= K,
        "the K tile must cover index_topk (the columns of `selected`)",
    );
    let s = program_id(0);
    let end = usize::min(load_index(ctx_lens, s, max_ctx), scores.cols());
    topk_row::<K, C>(scores, selected, s, end);
}

/// Sparse gather attention (MQA over the latent cache), for any number of query tokens: one
/// program per (block of `BH` heads, query token `t`), a token's head blocks side by side so all
/// but the first find its gathered rows in L2. Token `t` sits at position `ctx_len − sq + t` and
/// attends the first `min(topk, position + 1)` entries of its own selection `selected [sq, K]`,
/// gathered `BK` latent rows at a time from the paged pool, once: the key tile is the value tile
/// (values are the first `dv` columns of each row). `q [sq, H, d]`, `o [sq, H, dv]`. Decode is
/// `sq = 1`. The latent dims `d` and `dv` are run-time values (the tensors' last dims): `BD`
/// covers `d` and the accumulator is `BD` wide; `BDV` must cover `dv`, and the store drops the
/// rope columns past `dv`.
#[kernel(
    grid = (cdiv(q.shape()[1], BH), q.shape()[0]),
    tunable(BH = [64, 16, 128], BK = [64, 32], BD = [576, 16, 32, 64, 128, 256], BDV = [512, 16, 32, 64, 128, 256]),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(online_softmax_step)
)]
#[allow(clippy::too_many_arguments)]
pub fn sparse_mla<Q: Float, T: Float>(
    q: &Tensor<Q>,
    kv_pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    selected: &Tensor<i32>,
    o: &Tensor<Q>,
    ctx_len: usize,
    topk: usize,
    sm_scale: f32,
) {
    require(
        q.shape()[2] <= BD && o.shape()[2] <= BDV,
        "the BD/BDV tiles must cover the latent dims (dsa_tiles)",
    );
    let t = program_id(1);
    let r = program_id(0) * BH;
    let count = usize::min(topk, (ctx_len + t + 1).saturating_sub(q.shape()[0]));
    let sel = selected.at(t);
    // Queries convert to the pool's format on chip; the output is in the queries'.
    let tq = cast::<T>(&load::<BH, BD>(&q.at(t), r, 0));
    // The loop of `attend_selection`, written out: `day0 profile` charges a helper's cycles to
    // its call line, and this prototype's profile shows the gather, matrix and softmax lines.
    let mut m = full::<f32, BH, 1>(f32::NEG_INFINITY);
    let mut l = zeros::<f32, BH, 1>();
    let mut acc = zeros::<f32, BH, BD>();
    for i0 in (0..count).step_by(BK) {
        let tk = gather_rows::<BK, BD>(kv_pool, block_table, &sel, i0, count, 0);
        let mut s = zeros::<f32, BH, BK>();
        mma_bt(&mut s, &tq, &tk);
        let s = mask_keys(&scale(&s, sm_scale), 0, i0, count, false);
        let pr = online_softmax_step(&s, &mut m, &mut l, &mut acc);
        // The key tile is the value tile (its first dv columns), gathered once.
        mma(&mut acc, &cast::<T>(&pr), &tk);
    }
    // The store keeps the first dv columns; the rope columns past them are dropped.
    store(&o.at(t), r, 0, &cast::<Q>(&div_col(&acc, &l)));
}

/// Attention of one query tile `tq` (`BH` heads) over the first `count` latent rows of its
/// selection `sel`, gathered `BK` at a time (once: the key tile is the value tile) through
/// `block_table` from `kv_pool`; values are each row's first columns. Returns the normalised
/// output (f32) over all `BD` columns: the caller's store keeps the value columns.
#[kernel(helper, helpers(online_softmax_step))]
pub fn attend_selection<T: Float, const BH: usize, const BK: usize, const BD: usize>(
    tq: &Tile<T, BH, BD>,
    kv_pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    sel: &Tensor<i32>,
    count: usize,
    sm_scale: f32,
) -> Tile<f32, BH, BD> {
    let mut m = full::<f32, BH, 1>(f32::NEG_INFINITY);
    let mut l = zeros::<f32, BH, 1>();
    let mut acc = zeros::<f32, BH, BD>();
    for i0 in (0..count).step_by(BK) {
        let tk = gather_rows::<BK, BD>(kv_pool, block_table, sel, i0, count, 0);
        let mut s = zeros::<f32, BH, BK>();
        mma_bt(&mut s, tq, &tk);
        let s = mask_keys(&scale(&s, sm_scale), 0, i0, count, false);
        let pr = online_softmax_step(&s, &mut m, &mut l, &mut acc);
        mma(&mut acc, &cast::<T>(&pr), &tk);
    }
    div_col(&acc, &l)
}

/// Sparse attention for one decode token of each of `S` sequences (batched decode), one program
/// per (block of `BH` heads, sequence): as [`sparse_mla()`] with `q [S, H, d]`, block tables
/// `[S, T]`, lengths `ctx_lens [S]` and selections `selected [S, K]`; sequence `s` attends the
/// first `min(topk, ctx_lens[s])` entries of its selection through its own table. A sequence's
/// head blocks are neighbouring programs, so they run side by side and all but the first find the
/// gathered rows in L2. Cost-only: every length is `max_ctx` (the selections' positions are the
/// identity).
#[kernel(
    grid = (cdiv(q.shape()[1], BH), q.shape()[0]),
    tunable(BH = [64, 16, 128], BK = [64, 32], BD = [576, 16, 32, 64, 128, 256], BDV = [512, 16, 32, 64, 128, 256]),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(attend_selection)
)]
#[allow(clippy::too_many_arguments)]
pub fn sparse_mla_batch<Q: Float, T: Float>(
    q: &Tensor<Q>,
    kv_pool: &Tensor<T>,
    block_tables: &Tensor<i32>,
    ctx_lens: &Tensor<i32>,
    selected: &Tensor<i32>,
    o: &Tensor<Q>,
    max_ctx: usize,
    topk: usize,
    sm_scale: f32,
) {
    require(
        q.shape()[2] <= BD && o.shape()[2] <= BDV,
        "the BD/BDV tiles must cover the latent dims (dsa_tiles)",
    );
    let s = program_id(1);
    let r = program_id(0) * BH;
    let count = usize::min(topk, load_index(ctx_lens, s, max_ctx));
    let tq = cast::<T>(&load::<BH, BD>(&q.at(s), r, 0));
    let out = attend_selection::<T, BH, BK, BD>(
        &tq,
        kv_pool,
        &block_tables.at(s),
        &selected.at(s),
        count,
        sm_scale,
    );
    store(&o.at(s), r, 0, &cast::<Q>(&out));
}

/// The DSA tiles for a problem: the indexer's (`HI`/`BQ` covering the index heads or query block,
/// `DI` the index head dim, `BK` within the page), the top-k width (`K` ≥ `topk`) and the sparse
/// attention's (`BD`/`BDV` covering the latent dims, `BH` at most 16 rows for rows wider than
/// 256 values, else 64: tiles that fit every preset's on-chip memory; the forward tries 64-head
/// blocks first where they fit, `model::forward::ops`).
#[derive(Debug, Clone)]
pub struct DsaTiles {
    /// Indexer configuration.
    pub indexer: Config,
    /// Top-k configuration.
    pub topk: Config,
    /// Sparse attention configuration.
    pub attention: Config,
}

/// Picks [`DsaTiles`]; `decode` selects [`indexer_decode`] (else [`indexer_prefill`]). Errors name
/// the dimension no tile covers.
#[allow(clippy::too_many_arguments)]
pub fn dsa_tiles(
    decode: bool,
    seq: usize,
    index_heads: usize,
    index_dim: usize,
    page_size: usize,
    topk: usize,
    heads: usize,
    head_dim: usize,
    v_head_dim: usize,
) -> Result<DsaTiles, SimError> {
    let (imeta, rows_tile, rows) = if decode {
        (&indexer_decode::META, "HI", index_heads)
    } else {
        (&indexer_prefill::META, "BQ", seq.min(64))
    };
    let bks = crate::tile_choice::declared(imeta, "BK");
    let bk = bks
        .iter()
        .copied()
        .filter(|b| *b as usize <= page_size)
        .max()
        .or(bks.first().copied())
        .unwrap_or(64);
    let indexer = crate::tile_choice::cover(
        imeta,
        &Config::new().with("BK", bk),
        &[
            (
                rows_tile,
                rows,
                if decode {
                    "index_n_heads"
                } else {
                    "query block"
                },
            ),
            ("DI", index_dim, "index_head_dim"),
        ],
    )?;
    let topk_cfg = Config::new().with("K", tune_value(&topk_select::META, "K", topk)?);
    let bh = tune_value(
        &sparse_mla::META,
        "BH",
        heads.min(if head_dim > 256 { 16 } else { 64 }),
    )?;
    // A 576-wide latent row takes 32-key blocks here, which fit a 228 KiB SRAM at 16 heads in f32
    // (the standalone runs' precision).
    let attention = crate::tile_choice::cover(
        &sparse_mla::META,
        &Config::new()
            .with("BH", bh)
            .with("BK", if head_dim > 256 { 32 } else { 64 }),
        &[
            ("BD", head_dim, "kv_lora_rank + qk_rope_head_dim"),
            ("BDV", v_head_dim, "kv_lora_rank"),
        ],
    )?;
    Ok(DsaTiles {
        indexer,
        topk: topk_cfg,
        attention,
    })
}

/// One DSA problem on one sequence: `seq` query tokens, the last `seq` positions of a context of
/// `ctx` tokens (decode: `seq = 1`; prefill: `seq = ctx`; a prefill chunk: anything between).
#[derive(Debug, Clone)]
pub struct DsaCase {
    /// Query tokens.
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Context length (the query tokens included).
    pub ctx: usize,
    /// `index_topk`.
    pub topk: usize,
    /// Index heads.
    pub index_heads: usize,
    /// Index head dimension.
    pub index_dim: usize,
    /// Latent row: `kv_lora + rope`.
    pub head_dim: usize,
    /// `kv_lora` (values are the first `kv_lora` latent values).
    pub v_head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Seed.
    pub seed: u64,
}

/// The inputs of a DSA run as the kernels read them (f32; shape-only in cost-only runs), kept so
/// a test can run other kernels (the dense ones) on exactly the same data.
#[derive(Debug, Clone)]
pub struct DsaInputs {
    /// Indexer queries `[seq, index_heads·index_dim]`.
    pub q_idx: Tensor<f32>,
    /// Indexer head weights `[seq, index_heads]` (`index_heads^-1/2` folded in).
    pub w: Tensor<f32>,
    /// Paged indexer key cache `[pages, P, index_dim]`.
    pub k_idx_pool: Tensor<f32>,
    /// Absorbed queries `[seq, heads, head_dim]`.
    pub q: Tensor<f32>,
    /// Paged latent cache `[pages, P, head_dim]`.
    pub kv_pool: Tensor<f32>,
    /// The sequence's pages in logical order (shared by both caches), as a kernel argument.
    pub block_table: Tensor<i32>,
    /// The same block table on the host.
    pub table: Vec<usize>,
}

/// The three launches of a DSA step, their reports, and the checks made in functional runs.
#[derive(Debug)]
pub struct DsaRun {
    /// Indexer (grows with the context; with seq·context for prefill).
    pub indexer: dsl_core::Report,
    /// Top-k selection (grows with the context).
    pub topk: dsl_core::Report,
    /// Sparse attention (grows with `index_topk`, not with the context).
    pub attention: dsl_core::Report,
    /// All three chained.
    pub total: dsl_core::Report,
    /// Indexer scores vs the f64 reference (functional runs); `∞` if a score after its query's
    /// position is not `−∞`.
    pub indexer_error: Option<f64>,
    /// Whether every row of the kernel's selection equals the reference top-k of the kernel's own
    /// scores (same order, same ties).
    pub selection_matches: Option<bool>,
    /// Sparse attention vs the f64 reference over the kernel's selection.
    pub attention_error: Option<f64>,
    /// FP8 runs ([`run_dsa_prefill_fp8`]): the attention error against the unquantised cache
    /// (`attention_error` is then against the dequantised one).
    pub quantized_error: Option<f64>,
    /// The inputs (FP8 runs: `k_idx_pool` and `kv_pool` hold the dequantised pools after the
    /// check).
    pub inputs: DsaInputs,
    /// Attention output `[seq, heads, v_head_dim]` (functional runs).
    pub output: Option<Vec<f32>>,
}

/// The smallest of the kernel's `name` sizes that is `≥ want` (tiles may overhang; loads mask).
pub(super) fn tune_value(
    meta: &dsl_core::KernelMeta,
    name: &str,
    want: usize,
) -> Result<i64, SimError> {
    meta.smallest_fitting(name, want, name)
}

/// Runs a DSA decode step (f32, `case.seq` must be 1) on random data with a scrambled block
/// table: [`indexer_decode`] (index heads as the matrix rows), [`topk_select`], [`sparse_mla`].
pub fn run_dsa_decode(launcher: &Launcher, case: &DsaCase) -> Result<DsaRun, SimError> {
    if case.seq != 1 {
        return Err(SimError::Launch {
            kernel: "dsa_decode".into(),
            message: format!(
                "decode runs one query token, got seq = {}; use run_dsa_prefill (CLI: --kind dsa-prefill)",
                case.seq
            ),
        });
    }
    run_dsa(launcher, case, "dsa_decode", false)
}

/// A batched DSA decode step ([`run_dsa_decode_batch`]): the three launches' reports and, in
/// functional runs, the worst check over the sequences.
#[derive(Debug)]
pub struct DsaBatchRun {
    /// [`indexer_decode_batch`].
    pub indexer: dsl_core::Report,
    /// [`topk_select_batch`].
    pub topk: dsl_core::Report,
    /// [`sparse_mla_batch`].
    pub attention: dsl_core::Report,
    /// All three chained.
    pub total: dsl_core::Report,
    /// Largest indexer error over the sequences (`∞` if a score past a query's context is not
    /// `−∞`).
    pub indexer_error: Option<f64>,
    /// Whether every sequence's selection equals the reference top-k of its own scores.
    pub selection_matches: Option<bool>,
    /// Largest attention error over the sequences (FP8 runs: against the dequantised cache).
    pub attention_error: Option<f64>,
    /// FP8 runs: the largest attention error against the unquantised cache.
    pub quantized_error: Option<f64>,
    /// Attention output `[S, heads, v_head_dim]` (functional runs).
    pub output: Option<Vec<f32>>,
}

/// Runs one batched DSA decode step (f32) on random data: one query token for each sequence of
/// context `contexts[s]`, all sequences' pages scrambled over one shared pool, with
/// [`indexer_decode_batch`], [`topk_select_batch`] and [`sparse_mla_batch`] (one launch each).
/// `case.ctx` and `case.seq` are ignored. Functional runs check each sequence against the f64
/// references as [`run_dsa_decode`] does.
pub fn run_dsa_decode_batch(
    launcher: &Launcher,
    case: &DsaCase,
    contexts: &[usize],
) -> Result<DsaBatchRun, SimError> {
    dsa_decode_batch(launcher, case, contexts, false)
}

/// [`run_dsa_decode_batch`] over an FP8 cache: the random indexer keys and latent rows are
/// quantised per token ([`Fp8Tensors::quantize`]), the indexer is
/// [`indexer_decode_batch_fp8`](super::fp8_kv::indexer_decode_batch_fp8) and the attention
/// [`sparse_mla_batch_fp8`](super::fp8_kv::sparse_mla_batch_fp8); the indexer and
/// `attention_error` are checked against the f64 references over the dequantised pools,
/// `quantized_error` is the attention against the unquantised latent.
pub fn run_dsa_decode_batch_fp8(
    launcher: &Launcher,
    case: &DsaCase,
    contexts: &[usize],
) -> Result<DsaBatchRun, SimError> {
    dsa_decode_batch(launcher, case, contexts, true)
}

fn dsa_decode_batch(
    launcher: &Launcher,
    case: &DsaCase,
    contexts: &[usize],
    fp8: bool,
) -> Result<DsaBatchRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: "dsa_decode_batch".into(),
        message,
    };
    if contexts.is_empty() || contexts.contains(&0) {
        return Err(fail(format!(
            "every sequence needs a context of at least 1 token, got {contexts:?}"
        )));
    }
    if case.topk == 0 || case.heads == 0 || case.page_size == 0 || case.index_heads == 0 {
        return Err(fail(format!("empty problem: {case:?}")));
    }
    let DsaTiles {
        indexer: icfg,
        topk: kcfg,
        attention: acfg,
    } = dsa_tiles(
        true,
        1,
        case.index_heads,
        case.index_dim,
        case.page_size,
        case.topk,
        case.heads,
        case.head_dim,
        case.v_head_dim,
    )?;
    let (n, ps) = (contexts.len(), case.page_size);
    let max_ctx = contexts.iter().copied().max().unwrap_or(1);
    let width_pages = max_ctx.div_ceil(ps);
    // Every sequence's pages drawn without repeats from one pool with spare pages.
    let needed: usize = contexts.iter().map(|c| c.div_ceil(ps)).sum();
    let pool_pages = needed + 2;
    let mut rng = crate::testdata::Rng::new(case.seed);
    let mut order: Vec<usize> = (0..pool_pages).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut next = order.into_iter();
    let tables: Vec<Vec<usize>> = contexts
        .iter()
        .map(|c| next.by_ref().take(c.div_ceil(ps)).collect())
        .collect();
    let mut t = crate::testdata::CaseTensors::new(launcher, case.seed ^ 0xba7c, "dsa_decode_batch");
    let (hi, di) = (case.index_heads, case.index_dim);
    let q_idx = t.input::<f32>(&[n, hi, di], 0.0, 1.0)?;
    let w = t.input::<f32>(&[n, hi, 1], 0.0, 1.0 / (hi as f32).sqrt())?;
    let k_idx_pool = t.input::<f32>(&[pool_pages, ps, di], 0.0, 1.0)?;
    let q = t.input::<f32>(&[n, case.heads, case.head_dim], 0.0, 1.0)?;
    let kv_pool = t.input::<f32>(&[pool_pages, ps, case.head_dim], 0.0, 1.0)?;
    let (block_tables, ctx_lens) = if launcher.backend == Backend::Functional {
        // Rows padded with page 0 past a sequence's own pages (never read).
        let flat: Vec<i32> = tables
            .iter()
            .flat_map(|tb| (0..width_pages).map(|p| tb.get(p).copied().unwrap_or(0) as i32))
            .collect();
        let lens: Vec<i32> = contexts.iter().map(|c| *c as i32).collect();
        (
            Tensor::from_indices(&[n, width_pages], &flat).map_err(fail)?,
            Tensor::from_indices(&[n], &lens).map_err(fail)?,
        )
    } else {
        (
            Tensor::shape_only(&[n, width_pages]),
            Tensor::shape_only(&[n]),
        )
    };
    let scores = t.output::<f32>(&[n, width_pages * ps]);
    let k_sel = kcfg.get("K").unwrap_or(0) as usize;
    let selected = t.output::<i32>(&[n, k_sel]);
    let o = t.output::<f32>(&[n, case.heads, case.v_head_dim]);
    let idx_scale = 1.0 / (di as f32).sqrt();
    let sm_scale = 1.0 / (case.head_dim as f32).sqrt();
    let keys8 = if fp8 {
        Some(Fp8Tensors::quantize(&k_idx_pool, 1, di).map_err(fail)?)
    } else {
        None
    };
    let indexer = match &keys8 {
        Some(k8) => indexer_decode_batch_fp8::launch::<f32, f32>(
            launcher,
            &icfg,
            &q_idx,
            &w,
            &k8.codes,
            &k8.scales,
            &block_tables,
            &ctx_lens,
            &scores,
            max_ctx,
            idx_scale,
        )?,
        None => indexer_decode_batch::launch(
            launcher,
            &icfg,
            &q_idx,
            &w,
            &k_idx_pool,
            &block_tables,
            &ctx_lens,
            &scores,
            max_ctx,
            idx_scale,
        )?,
    }
    .report;
    let topk =
        topk_select_batch::launch(launcher, &kcfg, &scores, &selected, &ctx_lens, max_ctx)?.report;
    let pool8 = if fp8 {
        Some(Fp8Tensors::quantize(&kv_pool, 1, case.head_dim).map_err(fail)?)
    } else {
        None
    };
    let attention = match &pool8 {
        Some(p8) => sparse_mla_batch_fp8::launch::<f32, f32>(
            launcher,
            &acfg,
            &q,
            &p8.codes,
            &p8.token_scales().map_err(fail)?,
            &block_tables,
            &ctx_lens,
            &selected,
            &o,
            max_ctx,
            case.topk,
            sm_scale,
        )?,
        None => sparse_mla_batch::launch(
            launcher,
            &acfg,
            &q,
            &kv_pool,
            &block_tables,
            &ctx_lens,
            &selected,
            &o,
            max_ctx,
            case.topk,
            sm_scale,
        )?,
    }
    .report;
    let total = dsl_core::Report::chain(
        "dsa_decode_batch",
        &[indexer.clone(), topk.clone(), attention.clone()],
    )
    .expect("three launches");
    let mut run = DsaBatchRun {
        indexer,
        topk,
        attention,
        total,
        indexer_error: None,
        selection_matches: None,
        attention_error: None,
        quantized_error: None,
        output: o.to_vec(),
    };
    let host = (
        q_idx.to_vec(),
        w.to_vec(),
        k_idx_pool.to_vec(),
        q.to_vec(),
        kv_pool.to_vec(),
        scores.to_vec(),
        selected.to_vec(),
    );
    if let (Some(qi), Some(wv), Some(kp), Some(qv), Some(kvp), Some(sc), Some(sel)) = host {
        let out = run.output.as_deref().unwrap_or(&[]);
        let sw = width_pages * ps;
        let (qw, ow) = (case.heads * case.head_dim, case.heads * case.v_head_dim);
        // Each sequence checked alone against the latent rows `kv` (f64 references).
        let check = |kv: &[f32], keys: &[f32]| -> Result<(f64, f64, bool), SimError> {
            let (mut ie, mut ae, mut same) = (0.0f64, 0.0f64, true);
            for (s, (table, ctx)) in tables.iter().zip(contexts).enumerate() {
                let one = DsaCase {
                    seq: 1,
                    ctx: *ctx,
                    ..case.clone()
                };
                let data = SequenceData {
                    q_idx: &qi[s * hi * di..][..hi * di],
                    w: &wv[s * hi..][..hi],
                    k_idx_pool: keys,
                    q: &qv[s * qw..][..qw],
                    kv_pool: kv,
                    table,
                    out: &out[s * ow..][..ow],
                    scores: &sc[s * sw..][..sw],
                    selected: &sel[s * k_sel..][..k_sel],
                    k_sel,
                };
                let c = check_sequence(&one, &data, (idx_scale, sm_scale))
                    .map_err(|e| fail(e.to_string()))?;
                ie = ie.max(c.indexer_error);
                ae = ae.max(c.attention_error);
                same &= c.selection_matches;
            }
            Ok((ie, ae, same))
        };
        let (ie, ae, same) = match (&pool8, &keys8) {
            (Some(p8), Some(k8)) => {
                // The attention against the unquantised latent (over the kernel's selection).
                let (_, quantized, _) = check(&kvp, &k8.dequantized())?;
                run.quantized_error = Some(quantized);
                check(&p8.dequantized(), &k8.dequantized())?
            }
            _ => check(&kvp, &kp)?,
        };
        run.indexer_error = Some(ie);
        run.attention_error = Some(ae);
        run.selection_matches = Some(same);
        run.total.max_rel_error = Some(ie.max(ae));
    }
    Ok(run)
}

/// Runs DSA for a block of `case.seq` query tokens (prefill, or a prefill chunk against a cache
/// that holds the earlier tokens; f32) on random data with a scrambled block table:
/// [`indexer_prefill`] (seq × context, causal), [`topk_select`] per query row, [`sparse_mla`]
/// per query token (seq × topk).
pub fn run_dsa_prefill(launcher: &Launcher, case: &DsaCase) -> Result<DsaRun, SimError> {
    run_dsa(launcher, case, "dsa_prefill", false)
}

/// [`run_dsa_prefill`] over an FP8 cache (also a one-token decode, `case.seq = 1`): the random
/// indexer keys and latent rows are quantised per token, the indexer is
/// [`indexer_prefill_fp8`](super::fp8_kv::indexer_prefill_fp8) and the attention
/// [`sparse_mla_fp8`](super::fp8_kv::sparse_mla_fp8); the indexer and `attention_error` are
/// checked against the f64 references over the dequantised pools (which `inputs` then holds),
/// `quantized_error` is the attention against the unquantised latent.
pub fn run_dsa_prefill_fp8(launcher: &Launcher, case: &DsaCase) -> Result<DsaRun, SimError> {
    run_dsa(launcher, case, "dsa_prefill", true)
}

/// A DSA step of `case` (`name`: `dsa_decode` runs [`indexer_decode`], else the prefill
/// indexer); `fp8` quantises both pools and runs the FP8 prefill kernels (prefill only).
fn run_dsa(
    launcher: &Launcher,
    case: &DsaCase,
    name: &'static str,
    fp8: bool,
) -> Result<DsaRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: name.into(),
        message,
    };
    if case.ctx == 0 || case.seq == 0 || case.topk == 0 || case.heads == 0 || case.page_size == 0 {
        return Err(fail(format!("empty problem: {case:?}")));
    }
    if case.seq > case.ctx {
        return Err(fail(format!(
            "{} query tokens but a context of {} (the queries are the last seq positions; seq ≤ ctx)",
            case.seq, case.ctx
        )));
    }
    if case.index_heads == 0 {
        return Err(fail("index_heads must be ≥ 1".into()));
    }
    // The FP8 kernels serve the prefill indexer only (the model's decodes are batched).
    let decode = name == "dsa_decode" && !fp8;
    let DsaTiles {
        indexer: icfg,
        topk: kcfg,
        attention: acfg,
    } = dsa_tiles(
        decode,
        case.seq,
        case.index_heads,
        case.index_dim,
        case.page_size,
        case.topk,
        case.heads,
        case.head_dim,
        case.v_head_dim,
    )?;
    let inputs = dsa_inputs(launcher, case)?;
    let n_pages = inputs.table.len();
    let t = crate::testdata::CaseTensors::new(launcher, case.seed ^ 0x0d5a, name);
    let scores = t.output::<f32>(&[case.seq, n_pages * case.page_size]);
    let k_sel = kcfg.get("K").unwrap_or(0) as usize;
    let selected = t.output::<i32>(&[case.seq, k_sel]);
    let o = t.output::<f32>(&[case.seq, case.heads, case.v_head_dim]);
    let idx_scale = 1.0 / (case.index_dim as f32).sqrt();
    let sm_scale = 1.0 / (case.head_dim as f32).sqrt();
    let i = &inputs;
    // FP8 runs quantise both pools: the indexer's keys and the latent rows.
    let (keys8, pool8) = if fp8 {
        (
            Some(Fp8Tensors::quantize(&i.k_idx_pool, 1, case.index_dim).map_err(fail)?),
            Some(Fp8Tensors::quantize(&i.kv_pool, 1, case.head_dim).map_err(fail)?),
        )
    } else {
        (None, None)
    };
    let indexer = if decode {
        let view = |x: &Tensor<f32>, shape: &[usize]| x.reshaped(shape).map_err(fail);
        indexer_decode::launch(
            launcher,
            &icfg,
            &view(&i.q_idx, &[case.index_heads, case.index_dim])?,
            &view(&i.w, &[case.index_heads, 1])?,
            &i.k_idx_pool,
            &i.block_table,
            &scores,
            case.ctx,
            idx_scale,
        )?
    } else if let Some(k8) = &keys8 {
        indexer_prefill_fp8::launch::<f32, f32>(
            launcher,
            &icfg,
            &i.q_idx,
            &i.w,
            &k8.codes,
            &k8.scales,
            &i.block_table,
            &scores,
            case.ctx,
            idx_scale,
        )?
    } else {
        indexer_prefill::launch(
            launcher,
            &icfg,
            &i.q_idx,
            &i.w,
            &i.k_idx_pool,
            &i.block_table,
            &scores,
            case.ctx,
            idx_scale,
        )?
    }
    .report;
    let topk = topk_select::launch(launcher, &kcfg, &scores, &selected, case.ctx)?.report;
    let attention = match &pool8 {
        Some(p8) => sparse_mla_fp8::launch::<f32, f32>(
            launcher,
            &acfg,
            &i.q,
            &p8.codes,
            &p8.token_scales().map_err(fail)?,
            &i.block_table,
            &selected,
            &o,
            case.ctx,
            case.topk,
            sm_scale,
        )?,
        None => sparse_mla::launch(
            launcher,
            &acfg,
            &i.q,
            &i.kv_pool,
            &i.block_table,
            &selected,
            &o,
            case.ctx,
            case.topk,
            sm_scale,
        )?,
    }
    .report;
    let total = dsl_core::Report::chain(name, &[indexer.clone(), topk.clone(), attention.clone()])
        .expect("three launches");
    let mut run = DsaRun {
        indexer,
        topk,
        attention,
        total,
        indexer_error: None,
        selection_matches: None,
        attention_error: None,
        quantized_error: None,
        output: o.to_vec(),
        inputs,
    };
    if let (Some(sc), Some(sel)) = (scores.to_vec(), selected.to_vec()) {
        let check = |run: &mut DsaRun| {
            check_against_references(run, case, &sc, &sel, k_sel, (idx_scale, sm_scale))
                .map_err(|e| fail(e.to_string()))
        };
        if let (Some(p8), Some(k8)) = (&pool8, &keys8) {
            // The indexer against the values its key codes stand for; the attention first against
            // the unquantised latent (over the kernel's selection), then against the dequantised.
            run.inputs.k_idx_pool =
                Tensor::from_f32(run.inputs.k_idx_pool.shape(), &k8.dequantized()).map_err(fail)?;
            check(&mut run)?;
            run.quantized_error = run.attention_error;
            run.inputs.kv_pool =
                Tensor::from_f32(run.inputs.kv_pool.shape(), &p8.dequantized()).map_err(fail)?;
        }
        check(&mut run)?;
    }
    Ok(run)
}

/// Random inputs of a DSA case: caches in a pool with spare pages and a scrambled block table, as
/// a real allocator leaves them.
fn dsa_inputs(launcher: &Launcher, case: &DsaCase) -> Result<DsaInputs, SimError> {
    let n_pages = case.ctx.div_ceil(case.page_size);
    let pool_pages = n_pages + 2;
    let mut rng = crate::testdata::Rng::new(case.seed);
    let mut table: Vec<usize> = (0..pool_pages).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    table.truncate(n_pages);
    let mut t = crate::testdata::CaseTensors::new(launcher, case.seed ^ 0xd5a, "dsa");
    let (hi, di) = (case.index_heads, case.index_dim);
    let q_idx = t.input::<f32>(&[case.seq, hi * di], 0.0, 1.0)?;
    let w = t.input::<f32>(&[case.seq, hi], 0.0, 1.0 / (hi as f32).sqrt())?;
    let k_idx_pool = t.input::<f32>(&[pool_pages, case.page_size, di], 0.0, 1.0)?;
    let q = t.input::<f32>(&[case.seq, case.heads, case.head_dim], 0.0, 1.0)?;
    let kv_pool = t.input::<f32>(&[pool_pages, case.page_size, case.head_dim], 0.0, 1.0)?;
    let idx: Vec<i32> = table.iter().map(|p| *p as i32).collect();
    let block_table = if launcher.backend == Backend::Functional {
        Tensor::from_indices(&[n_pages], &idx).map_err(|message| SimError::Launch {
            kernel: "dsa".into(),
            message,
        })?
    } else {
        Tensor::shape_only(&[n_pages])
    };
    Ok(DsaInputs {
        q_idx,
        w,
        k_idx_pool,
        q,
        kv_pool,
        block_table,
        table,
    })
}

/// Fills the run's checks from [`check_sequence`] on the run's one sequence.
fn check_against_references(
    run: &mut DsaRun,
    case: &DsaCase,
    scores: &[f32],
    selected: &[f32],
    k_sel: usize,
    scales: (f32, f32),
) -> Result<(), super::reference::AttnRefError> {
    let i = &run.inputs;
    let (Some(qi), Some(wv), Some(kp), Some(qv), Some(kvp), Some(out)) = (
        i.q_idx.to_vec(),
        i.w.to_vec(),
        i.k_idx_pool.to_vec(),
        i.q.to_vec(),
        i.kv_pool.to_vec(),
        run.output.as_ref(),
    ) else {
        return Ok(());
    };
    let c = check_sequence(
        case,
        &SequenceData {
            q_idx: &qi,
            w: &wv,
            k_idx_pool: &kp,
            q: &qv,
            kv_pool: &kvp,
            table: &i.table,
            out,
            scores,
            selected,
            k_sel,
        },
        scales,
    )?;
    run.indexer_error = Some(c.indexer_error);
    run.selection_matches = Some(c.selection_matches);
    run.attention_error = Some(c.attention_error);
    run.total.max_rel_error = Some(c.indexer_error.max(c.attention_error));
    Ok(())
}

/// One sequence's data as [`check_sequence`] reads it (host copies; the pools whole).
struct SequenceData<'a> {
    q_idx: &'a [f32],
    w: &'a [f32],
    k_idx_pool: &'a [f32],
    q: &'a [f32],
    kv_pool: &'a [f32],
    table: &'a [usize],
    out: &'a [f32],
    /// The kernel's scores, `case.seq` rows of equal width.
    scores: &'a [f32],
    /// The kernel's selections, `case.seq` rows of `k_sel`.
    selected: &'a [f32],
    k_sel: usize,
}

/// What [`check_sequence`] found.
struct SequenceCheck {
    indexer_error: f64,
    selection_matches: bool,
    attention_error: f64,
}

/// Checks one sequence's DSA outputs: the indexer against [`indexer_scores`] (causal part; the
/// rest must be `−∞`: error `∞` otherwise), each row's selection against [`select_topk`] of the
/// kernel's own scores, and attention against [`mqa_sparse`] over the kernel's selection.
fn check_sequence(
    case: &DsaCase,
    d: &SequenceData,
    (idx_scale, sm_scale): (f32, f32),
) -> Result<SequenceCheck, super::reference::AttnRefError> {
    let (sq, ctx, k_sel, scores) = (case.seq, case.ctx, d.k_sel, d.scores);
    let width = scores.len() / sq;
    let k_rows =
        super::reference::gather_pages(d.k_idx_pool, case.index_dim, case.page_size, d.table, ctx)?;
    let ishape = IndexerShape {
        sq,
        skv: ctx,
        index_heads: case.index_heads,
        index_head_dim: case.index_dim,
    };
    let want = indexer_scores(d.q_idx, &k_rows, d.w, ishape, idx_scale as f64)?;
    // The kernel's scores over the context, row by row; the causal part compared, the rest −∞
    // (past the context too: a batched decode writes its whole padded row).
    let own: Vec<f32> = (0..sq)
        .flat_map(|t| scores[t * width..][..ctx].iter().copied())
        .collect();
    let (mut got_c, mut want_c, mut masked_ok) = (Vec::new(), Vec::new(), true);
    for (g, w) in own.iter().zip(&want) {
        if w.is_finite() {
            got_c.push(*g);
            want_c.push(*w);
        } else {
            masked_ok &= *g == f32::NEG_INFINITY;
        }
    }
    masked_ok &= (0..sq).all(|t| {
        scores[t * width..][ctx..width]
            .iter()
            .all(|v| *v == f32::NEG_INFINITY)
    });
    let err = crate::reference::rel_error(&got_c, &want_c);
    let own64: Vec<f64> = own.iter().map(|v| *v as f64).collect();
    let want_sel = select_topk(&own64, sq, ctx, case.topk)?;
    let got: Vec<Vec<usize>> = want_sel
        .iter()
        .enumerate()
        .map(|(t, w)| {
            d.selected[t * k_sel..][..w.len()]
                .iter()
                .map(|v| *v as usize)
                .collect()
        })
        .collect();
    let rows =
        super::reference::gather_pages(d.kv_pool, case.head_dim, case.page_size, d.table, ctx)?;
    let ms = MqaShape {
        sq,
        skv: ctx,
        heads: case.heads,
        dk: case.head_dim,
        dv: case.v_head_dim,
    };
    let attention_error = match mqa_sparse(d.q, &rows, &got, ms, sm_scale as f64) {
        Ok(want_o) => crate::reference::rel_error(d.out, &want_o),
        // A wrong selection may hold indices the reference refuses (future, repeated): no match.
        Err(_) if got != want_sel => f64::INFINITY,
        Err(e) => return Err(e),
    };
    Ok(SequenceCheck {
        indexer_error: if masked_ok { err } else { f64::INFINITY },
        selection_matches: got == want_sel,
        attention_error,
    })
}
