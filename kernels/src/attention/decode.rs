//! Decode attention over a paged KV cache, split along the context (flash-decoding), and the
//! combine that merges the splits. The same kernel serves MLA's absorbed decode: a single latent
//! "key/value head" (`kv_heads = 1`), keys of `kv_lora + rope` values and values that are the
//! first `kv_lora` of them (the same pool passed as `k_pool` and `v_pool`).
//!
//! Layouts (token-major, as [`super::reference`]):
//! - `q [Hkv, G, D]`: the newest token's queries, grouped by the key/value head they read;
//! - `k_pool [pages, P, Hkv·D]`, `v_pool [pages, P, Hkv·DV]`: fixed-size pages of `P` tokens;
//! - `block_table [n]` (i32): the sequence's pages in logical order;
//! - partials `o_part [S, Hkv, G, DV]`, `lse_part [S, Hkv, G, 1]` (f32) for `S` splits;
//! - output `o [Hkv·G, DV]`.
//!
//! Batched launches ([`paged_decode_latent()`], [`paged_decode_gqa_batch()`]) serve `S` sequences
//! at once (`S` here counts sequences, not splits): queries `[S·Hkv, G, D]`,
//! `block_tables [S, T]`, `ctx_lens [S]` (i32), partials `[splits, S·Hkv, G, DV]`, output
//! `[S·Hkv·G, DV]`.

use super::fp8_kv::{
    paged_decode_gqa_batch_fp8, paged_decode_latent_fp8, paged_decode_split_fp8, Fp8Tensors,
};
use super::prefill::softmax_start;
use super::reference::{
    attention_decode_paged, attention_decode_paged_sinks, mqa_dense, AttnShape, MqaShape,
};
use crate::gemm::GemmDtype;
use dsl_core::prelude::*;
use dsl_core::SimError;

/// One step of the online softmax shared by the split-KV and sparse attention kernels: folds a
/// masked score tile `s [BH, BK]` into the running row max `m` and denominator `l`, rescales the
/// accumulator `acc` by `e^(m_old − m_new)`, and returns the new probabilities, which the caller
/// multiplies by its value tile (how the values are stored differs between callers).
#[kernel(helper)]
pub fn online_softmax_step<const BH: usize, const BK: usize, const DV: usize>(
    s: &Tile<f32, BH, BK>,
    m: &mut Tile<f32, BH, 1>,
    l: &mut Tile<f32, BH, 1>,
    acc: &mut Tile<f32, BH, DV>,
) -> Tile<f32, BH, BK> {
    let m_new = maximum(m, &row_max(s));
    let pr = exp(&sub_col(s, &m_new));
    let alpha = exp(&sub(m, &m_new));
    *l = add(&mul(l, &alpha), &row_sum(&pr));
    *acc = mul_col(acc, &alpha);
    *m = m_new;
    pr
}

/// Where key block `b` of a latent decode split lies: `(pool page, first row in the page, valid
/// rows of the page)`, the page through the 64-entry block-table tile `idx` (reloaded when `b`
/// starts a new 64-page window); past the split's last block, a row past the last page's rows,
/// so a load there moves nothing.
#[kernel(helper)]
#[allow(clippy::too_many_arguments, clippy::manual_is_multiple_of)]
pub fn latent_block_at<const BK: usize>(
    table: &Tensor<i32>,
    idx: &mut Tile<i32, 1, 64>,
    b: usize,
    blocks: usize,
    p0: usize,
    p1: usize,
    per_page: usize,
    first_page: usize,
    ctx_len: usize,
    page_size: usize,
) -> (usize, usize, usize) {
    let pn = usize::min(p0 + b / per_page, p1 - 1);
    if b < blocks && b % per_page == 0 && (pn - p0) % 64 == 0 && pn > p0 {
        *idx = load::<1, 64>(table, 0, pn);
    }
    let page_n = index_at(idx, (pn - p0) % 64, first_page + pn);
    let kbn = if b < blocks {
        (b % per_page) * BK
    } else {
        page_size
    };
    let valid_n = usize::min(ctx_len, (pn + 1) * page_size) - pn * page_size;
    (page_n, kbn, valid_n)
}

/// Requests key block `b` of a latent decode split ([`latent_block_at()`] says where it lies).
#[kernel(helper, helpers(latent_block_at))]
#[allow(clippy::too_many_arguments)]
pub fn next_latent_block<T: Float, const BK: usize, const BD: usize>(
    kh: &Tensor<T>,
    table: &Tensor<i32>,
    idx: &mut Tile<i32, 1, 64>,
    b: usize,
    blocks: usize,
    p0: usize,
    p1: usize,
    per_page: usize,
    first_page: usize,
    ctx_len: usize,
    page_size: usize,
) -> Tile<T, BK, BD> {
    let (page_n, kbn, valid_n) = latent_block_at::<BK>(
        table, idx, b, blocks, p0, p1, per_page, first_page, ctx_len, page_size,
    );
    load_async::<BK, BD>(&kh.at(page_n).rows_clipped(0, valid_n), kbn, 0)
}

/// The work of one split-KV decode program (grid: head blocks × splits): its key/value head, its
/// first query row and its page range `p0..p1` of pages of `page_size` tokens (balanced, never
/// empty: the runner keeps splits ≤ pages).
#[kernel(helper, helpers(split_rows, split_pages))]
pub fn split_program<const BH: usize>(
    q_rows_per_head: usize,
    ctx_len: usize,
    page_size: usize,
) -> (usize, usize, usize, usize) {
    let (kvh, r0) = split_rows::<BH>(q_rows_per_head);
    let (p0, p1) = split_pages(0, ctx_len, page_size);
    (kvh, r0, p0, p1)
}

/// A split-KV program's key/value head (or sequence, in a batched launch) and first query row,
/// from its grid position along axis 0 (head blocks of `BH` rows).
#[kernel(helper)]
pub fn split_rows<const BH: usize>(q_rows_per_head: usize) -> (usize, usize) {
    let blocks = cdiv(q_rows_per_head, BH);
    let kvh = program_id(0) / blocks;
    (kvh, (program_id(0) - kvh * blocks) * BH)
}

/// A split-KV program's page range `p0..p1` of the pages `first..` of a context of `ctx_len`
/// tokens (`first` > 0: a sliding window's first page): axis 1 of the grid splits them evenly (a
/// split of a context shorter than the grid's splits may be empty).
#[kernel(helper)]
pub fn split_pages(first: usize, ctx_len: usize, page_size: usize) -> (usize, usize) {
    let split = program_id(1);
    let splits = num_programs(1);
    let n_pages = cdiv(ctx_len, page_size).saturating_sub(first);
    (
        first + split * n_pages / splits,
        first + (split + 1) * n_pages / splits,
    )
}

/// Stores a split program's partial output `acc / l` and log-sum-exp `m + ln l` for
/// [`decode_combine`].
#[kernel(helper)]
pub fn store_split_partials<const BH: usize, const DV: usize>(
    o_part: &Tensor<f32>,
    lse_part: &Tensor<f32>,
    kvh: usize,
    r0: usize,
    m: &Tile<f32, BH, 1>,
    l: &Tile<f32, BH, 1>,
    acc: &Tile<f32, BH, DV>,
) {
    let split = program_id(1);
    store(&o_part.at(split).at(kvh), r0, 0, &div_col(acc, l));
    store(&lse_part.at(split).at(kvh), r0, 0, &add(m, &ln(l)));
}

/// One program per (block of `BH` query rows of one key/value head, context split). Head dims
/// and the page size are run-time values read from the tensors (`q [Hkv, G, D]`,
/// `k_pool [pages, page, Hkv·D]`, `o_part [S, Hkv, G, DV]`): each page is read `BK` keys at a time
/// through column views of its head, in `BD`/`BDV`-wide tiles that cover the head dims.
#[kernel(
    grid = (q.shape()[0] * cdiv(q.shape()[1], BH), o_part.shape()[0]),
    tunable(
        BH = [16, 64, 128],
        BK = [64, 16, 128],
        BD = [128, 16, 32, 64, 256, 576],
        BDV = [128, 16, 32, 64, 256, 512]
    ),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(online_softmax_step, split_program, store_split_partials)
)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_split<T: Float>(
    q: &Tensor<T>,
    k_pool: &Tensor<T>,
    v_pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    o_part: &Tensor<f32>,
    lse_part: &Tensor<f32>,
    ctx_len: usize,
    sm_scale: f32,
) {
    let (d, dv, page_size) = (q.shape()[2], o_part.shape()[3], k_pool.shape()[1]);
    require(
        d <= BD && dv <= BDV,
        "the BD/BDV tiles must cover the head dims (decode_config picks covering tiles)",
    );
    let (kvh, r0, p0, p1) = split_program::<BH>(q.shape()[1], ctx_len, page_size);
    let tq = load::<BH, BD>(&q.at(kvh), r0, 0);
    let kh = k_pool.cols_clipped(kvh * d, d);
    let vh = v_pool.cols_clipped(kvh * dv, dv);
    let mut m = full::<f32, BH, 1>(f32::NEG_INFINITY);
    let mut l = zeros::<f32, BH, 1>();
    let mut acc = zeros::<f32, BH, BDV>();
    for p in p0..p1 {
        let page = load_index(block_table, p, p);
        // Keys past the page (a tile wider than it) or past the context score −∞; rows of the
        // last page past the context are never read (a cache holds garbage there, and a value
        // of NaN times a zero probability would still poison the output).
        let limit = usize::min(ctx_len, (p + 1) * page_size);
        let valid = limit - p * page_size;
        let (kp, vp) = (
            kh.at(page).rows_clipped(0, valid),
            vh.at(page).rows_clipped(0, valid),
        );
        for kb in (0..valid).step_by(BK) {
            let tk = load_async::<BK, BD>(&kp, kb, 0);
            let tv = load_async::<BK, BDV>(&vp, kb, 0);
            let mut s = zeros::<f32, BH, BK>();
            mma_bt(&mut s, &tq, &tk);
            let s = mask_keys(&scale(&s, sm_scale), 0, p * page_size + kb, limit, false);
            let pr = online_softmax_step(&s, &mut m, &mut l, &mut acc);
            mma(&mut acc, &cast::<T>(&pr), &tv);
        }
    }
    store_split_partials(o_part, lse_part, kvh, r0, &m, &l, &acc);
}

/// Split-KV decode over MLA's latent cache for a batch of sequences in one launch, reading each
/// latent row **once**, as FlashMLA does. Sequence `s` has queries `q[s] [G, D]` (one latent
/// head), its pages in row `s` of `block_tables [S, T]` and its context length in
/// `ctx_lens[s]`; all share one pool `kv_pool [pages, P, D]`. The values are the first `dv`
/// columns of the keys, so the probabilities multiply the key tile itself and the accumulator's
/// columns past `dv` (the rope part, `D − dv` of them) are computed and dropped by the store
/// into `o_part [splits, S, G, dv]`. [`paged_decode_split()`] with a shared pool loads every
/// page twice (as keys, `P × D`, and as values, `P × dv`): ~1.9× the bytes at MLA's 576/512.
///
/// A program reads its sequence's length first (a 4-byte read, as FlashMLA reads
/// `cache_seqlens`), then splits that sequence's pages evenly over the grid's splits; a split
/// with no pages (a context shorter than the others) writes a zero partial and a log-sum-exp of
/// −∞, which [`decode_combine`] weighs by zero. In a cost-only run without data, every context
/// is `max_ctx` and sequence `s`'s page `p` is pool page `s·T + p`, as an allocator gives
/// distinct sequences distinct pages.
///
/// The key blocks of a split are one stream (`⌈P / BK⌉` blocks per page, a block never crossing a
/// page), pipelined as FlashMLA and FA3 do: block `b + 1`'s scores go to the matrix unit before
/// block `b`'s softmax, so the two units overlap, and block `b + 2`'s tile is requested then
/// (three key tiles live). Pages come from a tile of 64 block-table entries loaded once per 64
/// pages, so neither a table read nor a tile's latency sits between two blocks. The extra
/// `D − dv` value columns cost matrix work only (memory-bound shapes do not see it;
/// compute-bound ones pay `(D − dv) / (D + dv)` more FLOP in the value product).
#[kernel(
    grid = (q.shape()[0] * cdiv(q.shape()[1], BH), o_part.shape()[0]),
    tunable(BH = [16, 64, 32], BK = [64, 16, 32], BD = [576, 128, 256, 512]),
    helpers(online_softmax_step, split_rows, split_pages, store_split_partials, next_latent_block)
)]
// `is_multiple_of` is not in the DSL's method subset; `% 64 == 0` is.
#[allow(clippy::too_many_arguments, clippy::manual_is_multiple_of)]
pub fn paged_decode_latent<Q: Float, T: Float>(
    q: &Tensor<Q>,
    kv_pool: &Tensor<T>,
    block_tables: &Tensor<i32>,
    ctx_lens: &Tensor<i32>,
    o_part: &Tensor<f32>,
    lse_part: &Tensor<f32>,
    max_ctx: usize,
    sm_scale: f32,
) {
    let (d, dv, page_size) = (q.shape()[2], o_part.shape()[3], kv_pool.shape()[1]);
    require(
        d <= BD && dv <= d,
        "a BD tile covering the latent dim, values no wider than keys \
         (decode_latent_config picks a covering tile)",
    );
    let (seq, r0) = split_rows::<BH>(q.shape()[1]);
    // Queries in another format than the pool (f32 activations over a bf16 cache) convert on
    // chip, once per program.
    let tq = cast::<T>(&load_async::<BH, BD>(&q.at(seq), r0, 0));
    let ctx_len = load_index(ctx_lens, seq, max_ctx);
    let (p0, p1) = split_pages(0, ctx_len, page_size);
    let table = block_tables.at(seq);
    let first_page = seq * block_tables.cols();
    let kh = kv_pool.cols_clipped(0, d);
    let per_page = cdiv(page_size, BK);
    let blocks = (p1 - p0) * per_page;
    let mut m = full::<f32, BH, 1>(f32::NEG_INFINITY);
    let mut l = zeros::<f32, BH, 1>();
    let mut acc = zeros::<f32, BH, BD>();
    if blocks == 0 {
        // No pages in this split: a zero partial that the combine weighs by e^−∞ = 0.
        let split = program_id(1);
        store(&o_part.at(split).at(seq), r0, 0, &acc);
        store(&lse_part.at(split).at(seq), r0, 0, &m);
    } else {
        // The split's block-table entries, 64 pages at a time, as a tile: `index_at` reads one
        // from it without a trip to memory. (`load_index` per block would queue each 4-byte
        // read behind the tile in flight on the in-order DMA queue and stall the issue for it
        // and for the memory latency, every block.)
        let mut idx = load::<1, 64>(&table, 0, p0);
        let page0 = index_at(&idx, 0, first_page + p0);
        let valid0 = usize::min(ctx_len, (p0 + 1) * page_size) - p0 * page_size;
        let mut tk = load_async::<BK, BD>(&kh.at(page0).rows_clipped(0, valid0), 0, 0);
        // Block 1's tile (past the split's last block: a window past the last page's rows, which
        // moves nothing), then block 0's scores.
        let mut tk1 = next_latent_block::<T, BK, BD>(
            &kh, &table, &mut idx, 1, blocks, p0, p1, per_page, first_page, ctx_len, page_size,
        );
        let mut s = zeros::<f32, BH, BK>();
        mma_bt(&mut s, &tq, &tk);
        for b in 0..blocks {
            let p = p0 + b / per_page;
            let kb = (b % per_page) * BK;
            // Block b + 1's scores first: the matrix unit runs them during this block's softmax.
            let mut s_next = zeros::<f32, BH, BK>();
            if b + 1 < blocks {
                mma_bt(&mut s_next, &tq, &tk1);
            }
            let tk2 = next_latent_block::<T, BK, BD>(
                &kh,
                &table,
                &mut idx,
                b + 2,
                blocks,
                p0,
                p1,
                per_page,
                first_page,
                ctx_len,
                page_size,
            );
            let limit = usize::min(ctx_len, (p + 1) * page_size);
            let sc = mask_keys(&scale(&s, sm_scale), 0, p * page_size + kb, limit, false);
            let pr = online_softmax_step(&sc, &mut m, &mut l, &mut acc);
            // The key tile is the value tile: its first dv columns are the latent values.
            mma(&mut acc, &cast::<T>(&pr), &tk);
            s = s_next;
            tk = tk1;
            tk1 = tk2;
        }
        store_split_partials(o_part, lse_part, seq, r0, &m, &l, &acc);
    }
}

/// The latent decode's tiles: `BD` covering the latent dim, `BH` covering the query rows (at
/// most 64), `BK` the largest declared key tile within a page, each unless `base` sets it.
pub fn decode_latent_config(
    base: &Config,
    head_dim: usize,
    page_size: usize,
    q_rows: usize,
) -> Result<Config, SimError> {
    let meta = &paged_decode_latent::META;
    let mut base = base.clone();
    if base.get("BK").is_none() {
        let bks = crate::tile_choice::declared(meta, "BK");
        let bk = bks
            .iter()
            .copied()
            .filter(|b| *b as usize <= page_size)
            .max()
            .or(bks.first().copied());
        if let Some(bk) = bk {
            base = base.with("BK", bk);
        }
    }
    if base.get("BH").is_none() {
        if let Some(bh) = crate::tile_choice::covering(meta, "BH", q_rows, 64) {
            base = base.with("BH", bh);
        }
    }
    crate::tile_choice::cover(meta, &base, &[("BD", head_dim, "head_dim")])
}

/// The work of one batched GQA decode program ([`paged_decode_gqa_batch()`] and its FP8 form),
/// from its row `row` of `q [S·Hkv, G, D]` (`kv_heads` = Hkv, `group` = G) and first query row
/// `r0`: its sequence, key/value
/// head, context length (one 4-byte read), window start `w0` (0 without a window), its share
/// `p0..p1` of the window's pages, and the softmax's starting max and sum: the query heads'
/// attention sinks (`sinks [Hq, 1]`, −∞ for none) in the first split, so the combine counts each
/// sink once, an empty start in the others.
#[kernel(helper, helpers(split_pages, softmax_start))]
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
pub fn gqa_batch_program<const BH: usize>(
    row: usize,
    r0: usize,
    kv_heads: usize,
    group: usize,
    ctx_lens: &Tensor<i32>,
    max_ctx: usize,
    window: usize,
    page_size: usize,
    sinks: &Tensor<f32>,
) -> (
    usize,
    usize,
    usize,
    usize,
    usize,
    usize,
    Tile<f32, BH, 1>,
    Tile<f32, BH, 1>,
) {
    let (seq, kvh) = (row / kv_heads, row % kv_heads);
    let ctx_len = load_index(ctx_lens, seq, max_ctx);
    // A sliding window reads only its keys: from `w0`, split over the window's pages.
    let w0 = if window > 0 {
        ctx_len.saturating_sub(window)
    } else {
        0
    };
    let (p0, p1) = split_pages(w0 / page_size, ctx_len, page_size);
    let (m, l) = if program_id(1) == 0 {
        softmax_start(&load_async::<BH, 1>(
            &sinks.rows_clipped(kvh * group, (kvh + 1) * group),
            r0,
            0,
        ))
    } else {
        (full::<f32, BH, 1>(f32::NEG_INFINITY), zeros::<f32, BH, 1>())
    };
    (seq, kvh, ctx_len, w0, p0, p1, m, l)
}

/// Page `p` of a batched GQA decode split (`p0..`): `(pool page, limit, valid rows, first key
/// block)`. The page comes through the 64-entry block-table tile `idx` (reloaded every 64 pages);
/// `limit` is the page's end within the context (keys past it score −∞) and only the `valid`
/// rows before it are read (a cache holds garbage past the context, and a value of NaN times a
/// zero probability would still poison the output); a sliding window's first page starts at the
/// block holding `w0`, so every block read has a key in the window and no row's running max
/// stays −∞.
#[kernel(helper)]
#[allow(clippy::too_many_arguments, clippy::manual_is_multiple_of)]
pub fn gqa_page_at<const BK: usize>(
    table: &Tensor<i32>,
    idx: &mut Tile<i32, 1, 64>,
    p: usize,
    p0: usize,
    first_page: usize,
    ctx_len: usize,
    page_size: usize,
    w0: usize,
) -> (usize, usize, usize, usize) {
    if p > p0 && (p - p0) % 64 == 0 {
        *idx = load::<1, 64>(table, 0, p);
    }
    let page = index_at(idx, (p - p0) % 64, first_page + p);
    let limit = usize::min(ctx_len, (p + 1) * page_size);
    let valid = limit - p * page_size;
    let kb0 = w0.saturating_sub(p * page_size) / BK * BK;
    (page, limit, valid, kb0)
}

/// Scores `s` of the keys from position `k0` masked to −∞ at or past `limit` and, with a sliding
/// `window` (> 0), before its start `w0`.
#[kernel(helper)]
pub fn mask_decode_keys<const BH: usize, const BK: usize>(
    s: &Tile<f32, BH, BK>,
    k0: usize,
    limit: usize,
    window: usize,
    w0: usize,
) -> Tile<f32, BH, BK> {
    let s = mask_keys(s, 0, k0, limit, false);
    if window > 0 {
        mask_before(&s, k0, w0)
    } else {
        s
    }
}

/// Split-KV decode of grouped-query attention for a batch of sequences in one launch: the GQA
/// counterpart of [`paged_decode_latent()`], so a serving step's single-token decodes over one
/// shared paged cache cost one launch instead of one per sequence. Sequence `s` has one decode
/// token whose queries are `q[s·Hkv + h] [G, D]` for each key/value head `h`
/// (`q [S·Hkv, G, D]`), its pages in row `s` of `block_tables [S, T]` and its context length in
/// `ctx_lens[s]`; all sequences share `k_pool [pages, P, Hkv·D]` and `v_pool [pages, P, Hkv·DV]`
/// (laid out as [`paged_decode_split()`]'s). Partials go to row `s·Hkv + h` of
/// `o_part [splits, S·Hkv, G, DV]` and `lse_part [splits, S·Hkv, G, 1]`; [`decode_combine`] over
/// them gives `o [S·Hkv·G, DV]`, each sequence's `Hkv·G` query heads in order.
///
/// A program (grid: `S·Hkv` rows × head blocks of `BH`, × splits) reads its sequence's length
/// (one 4-byte read), splits that sequence's pages evenly over the grid's splits and reads each
/// of its key/value head's rows once, `BK` keys of a page at a time; a split with no pages (a
/// context shorter than the others) writes a zero partial and a log-sum-exp of −∞, which the
/// combine weighs by zero. In a cost-only run without data, every context is `max_ctx` and
/// sequence `s`'s page `p` is pool page `s·T + p`, as an allocator gives distinct sequences
/// distinct pages.
#[kernel(
    grid = (q.shape()[0] * cdiv(q.shape()[1], BH), o_part.shape()[0]),
    tunable(
        BH = [16, 64, 128],
        BK = [64, 16, 128],
        BD = [128, 16, 32, 64, 256, 576],
        BDV = [128, 16, 32, 64, 256, 512]
    ),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(
        online_softmax_step,
        split_rows,
        gqa_batch_program,
        gqa_page_at,
        mask_decode_keys,
        store_split_partials
    )
)]
#[allow(clippy::too_many_arguments)]
pub fn paged_decode_gqa_batch<Q: Float, T: Float>(
    q: &Tensor<Q>,
    k_pool: &Tensor<T>,
    v_pool: &Tensor<T>,
    block_tables: &Tensor<i32>,
    ctx_lens: &Tensor<i32>,
    o_part: &Tensor<f32>,
    lse_part: &Tensor<f32>,
    max_ctx: usize,
    sm_scale: f32,
    window: usize,
    sinks: &Tensor<f32>,
) {
    let (d, dv, page_size) = (q.shape()[2], o_part.shape()[3], k_pool.shape()[1]);
    require(
        d <= BD && dv <= BDV,
        "the BD/BDV tiles must cover the head dims (decode_config picks covering tiles)",
    );
    let (row, r0) = split_rows::<BH>(q.shape()[1]);
    // Queries convert to the pool's format on chip (see `paged_decode_latent`).
    let tq = cast::<T>(&load_async::<BH, BD>(&q.at(row), r0, 0));
    // The key/value heads per sequence follow from the batch: q holds S·Hkv rows of heads.
    let kv_heads = q.shape()[0] / ctx_lens.shape()[0];
    let (seq, kvh, ctx_len, w0, p0, p1, mut m, mut l) = gqa_batch_program::<BH>(
        row,
        r0,
        kv_heads,
        q.shape()[1],
        ctx_lens,
        max_ctx,
        window,
        page_size,
        sinks,
    );
    let table = block_tables.at(seq);
    let first_page = seq * block_tables.cols();
    let kh = k_pool.cols_clipped(kvh * d, d);
    let vh = v_pool.cols_clipped(kvh * dv, dv);
    let mut acc = zeros::<f32, BH, BDV>();
    if p1 == p0 {
        // No pages in this split: a zero partial that the combine weighs by e^(m − lse) (acc / l
        // would be 0 / 0 = NaN, which a zero weight does not cancel): zero for −∞, the sink's
        // share in the first split.
        let split = program_id(1);
        store(&o_part.at(split).at(row), r0, 0, &acc);
        store(&lse_part.at(split).at(row), r0, 0, &m);
    } else {
        // The split's block-table entries, 64 pages at a time, as a tile: `index_at` reads one
        // from it without a trip to memory (a `load_index` per page would put a 4-byte read and
        // its latency between every two pages).
        let mut idx = load::<1, 64>(&table, 0, p0);
        for p in p0..p1 {
            let (page, limit, valid, kb0) =
                gqa_page_at::<BK>(&table, &mut idx, p, p0, first_page, ctx_len, page_size, w0);
            let (kp, vp) = (
                kh.at(page).rows_clipped(0, valid),
                vh.at(page).rows_clipped(0, valid),
            );
            for kb in (kb0..valid).step_by(BK) {
                let tk = load_async::<BK, BD>(&kp, kb, 0);
                let tv = load_async::<BK, BDV>(&vp, kb, 0);
                let mut s = zeros::<f32, BH, BK>();
                mma_bt(&mut s, &tq, &tk);
                let s =
                    mask_decode_keys(&scale(&s, sm_scale), p * page_size + kb, limit, window, w0);
                let pr = online_softmax_step(&s, &mut m, &mut l, &mut acc);
                mma(&mut acc, &cast::<T>(&pr), &tv);
            }
        }
        store_split_partials(o_part, lse_part, row, r0, &m, &l, &acc);
    }
}

/// Merges split partials: `o = Σ_s e^(lse_s − m) o_s / Σ_s e^(lse_s − m)`, `m = max_s lse_s`.
/// The value head dim is a run-time value (`o`'s columns), covered by `BDV`-wide tiles.
#[kernel(grid = (cdiv(o.rows(), BH),), tunable(BH = [16, 64, 128], BDV = [128, 16, 32, 64, 256, 512]))]
pub fn decode_combine<T: Float>(o_part: &Tensor<f32>, lse_part: &Tensor<f32>, o: &Tensor<T>) {
    require(
        o.cols() <= BDV,
        "the BDV tile must cover the value head dim (combine_config)",
    );
    let r = program_id(0) * BH;
    let splits = o_part.shape()[0];
    let mut m = full::<f32, BH, 1>(f32::NEG_INFINITY);
    for s in 0..splits {
        m = maximum(&m, &load::<BH, 1>(&lse_part.at(s), r, 0));
    }
    let mut num = zeros::<f32, BH, BDV>();
    let mut den = zeros::<f32, BH, 1>();
    for s in 0..splits {
        let w = exp(&sub(&load_async::<BH, 1>(&lse_part.at(s), r, 0), &m));
        num = add(
            &num,
            &mul_col(&load_async::<BH, BDV>(&o_part.at(s), r, 0), &w),
        );
        den = add(&den, &w);
    }
    store(o, r, 0, &cast::<T>(&div_col(&num, &den)));
}

/// The split-KV decode tiles (also of the FP8 variant, whose space is the same): `BD`/`BDV` the
/// smallest pair covering the head dims, `BK` the largest key tile within a page (the page size
/// itself when it is a declared tile), `BH` covering the query rows per key/value head (at most
/// 64), each unless `base` sets it.
pub fn decode_config(
    meta: &dsl_core::KernelMeta,
    base: &Config,
    head_dim: usize,
    v_head_dim: usize,
    page_size: usize,
    q_rows_per_head: usize,
) -> Result<Config, SimError> {
    let mut base = base.clone();
    if base.get("BK").is_none() {
        let bks = crate::tile_choice::declared(meta, "BK");
        let bk = bks
            .iter()
            .copied()
            .filter(|b| *b as usize <= page_size)
            .max()
            .or(bks.first().copied());
        if let Some(bk) = bk {
            base = base.with("BK", bk);
        }
    }
    if base.get("BH").is_none() {
        if let Some(bh) = crate::tile_choice::covering(meta, "BH", q_rows_per_head, 64) {
            base = base.with("BH", bh);
        }
    }
    crate::tile_choice::cover(
        meta,
        &base,
        &[
            ("BD", head_dim, "head_dim"),
            ("BDV", v_head_dim, "v_head_dim"),
        ],
    )
}

/// The combine's tiles: `BDV` covering the value head dim, `BH = 16`.
pub fn combine_config(v_head_dim: usize) -> Result<Config, SimError> {
    crate::tile_choice::cover(
        &decode_combine::META,
        &Config::new().with("BH", 16),
        &[("BDV", v_head_dim, "v_head_dim")],
    )
}

/// One decode problem over a paged cache.
#[derive(Debug, Clone)]
pub struct DecodeCase {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (1 for MLA's latent cache).
    pub kv_heads: usize,
    /// Key (and query) head dimension (`kv_lora + rope` for MLA).
    pub head_dim: usize,
    /// Value head dimension (`kv_lora` for MLA, whose values are the first `kv_lora` key values).
    pub v_head_dim: usize,
    /// Whether keys and values share one pool (MLA latent cache).
    pub shared_kv: bool,
    /// Context length (the newest token included).
    pub ctx: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Context splits (flash-decoding); clamped to the number of pages.
    pub splits: usize,
    /// Element dtype (queries, output; the cache too unless `fp8_kv`).
    pub dtype: GemmDtype,
    /// Store the cache as FP8 E4M3 with one f32 scale per token and key/value head
    /// ([`super::fp8_kv`]); the error is then measured against the unquantised cache.
    pub fp8_kv: bool,
    /// Seed of the random inputs (and of the scrambled block table).
    pub seed: u64,
}

/// A decode run: both launches chained in one report, and the output `[heads, v_head_dim]`.
#[derive(Debug)]
pub struct DecodeRun {
    /// Split kernel + combine.
    pub report: dsl_core::Report,
    /// Output (functional runs).
    pub output: Option<Vec<f32>>,
    /// With `fp8_kv`: the output vs the f64 reference of the *dequantised* cache, i.e. the kernel's
    /// own error (`report.max_rel_error` is the error the FP8 cache costs).
    pub dequantized_error: Option<f64>,
    /// Bytes of the context's cache as stored (values and FP8 scales; spare pool pages excluded).
    pub kv_cache_bytes: u64,
    /// Bytes of the same cache in bf16, the usual unquantised serving format.
    pub kv_cache_bytes_bf16: u64,
}

/// Runs paged decode on random data with a scrambled block table, checked against the f64
/// reference (contiguous attention over the gathered pages; for a shared pool, latent MQA). With
/// `fp8_kv` the pools are quantised ([`super::fp8_kv::quantize_per_token`]) and the reference
/// still reads the unquantised values, so `max_rel_error` is the error the FP8 cache costs.
pub fn run_decode(launcher: &Launcher, case: &DecodeCase) -> Result<DecodeRun, SimError> {
    run_decode_with(launcher, case, false)
}

/// [`run_decode`] for MLA's latent cache with [`paged_decode_latent()`] (with `fp8_kv`,
/// [`paged_decode_latent_fp8()`]), which reads each latent row once: the case must have a shared
/// pool (`shared_kv`, one kv head). Same inputs, reference and report.
pub fn run_decode_latent(launcher: &Launcher, case: &DecodeCase) -> Result<DecodeRun, SimError> {
    if !case.shared_kv {
        return Err(SimError::Launch {
            kernel: paged_decode_latent::META.name.into(),
            message: "the latent decode needs a shared (latent) pool".into(),
        });
    }
    run_decode_with(launcher, case, true)
}

/// A batch of MLA decodes in **one** [`paged_decode_latent()`] launch: sequence `s` has
/// context `contexts[s]` (each its own length), its pages scattered through one shared pool
/// with spare pages, as an allocator leaves it; heads, dims, page size, splits, dtype and seed
/// come from `case` (its `ctx` is ignored). Checked against the f64 reference of each sequence
/// alone; the output is `[S·heads, v_head_dim]`.
pub fn run_decode_latent_batch(
    launcher: &Launcher,
    case: &DecodeCase,
    contexts: &[usize],
) -> Result<DecodeRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: paged_decode_latent::META.name.into(),
        message,
    };
    if contexts.is_empty() || contexts.contains(&0) || case.page_size == 0 {
        return Err(fail(
            "a batch needs at least one sequence, each with context ≥ 1, and pages of ≥ 1 token"
                .into(),
        ));
    }
    if case.kv_heads != 1 || !case.shared_kv || case.v_head_dim > case.head_dim {
        return Err(fail(
            "the latent decode needs one shared latent head (v_head_dim ≤ head_dim)".into(),
        ));
    }
    latent_fitting(case, case.heads, |cfg| match case.dtype {
        GemmDtype::F32 => run_latent_batch::<f32>(launcher, case, contexts, cfg),
        GemmDtype::Bf16 => run_latent_batch::<bf16>(launcher, case, contexts, cfg),
    })
}

/// A batch's pages for the batched decode runners: every sequence's pages drawn from one
/// scrambled pool with spare pages, as an allocator leaves it, its block-table rows (padded past
/// its pages with entries the kernel never reads), lengths, the split count and the longest
/// context. The pool holds at least `S·T` pages, the pages a cost-only run without table data
/// reads (sequence `s`'s page `p` at `s·T + p`). Tables and lengths carry data in cost-only runs
/// too, so those model the same page ranges.
struct BatchPages {
    tables: Vec<Vec<usize>>,
    pool_pages: usize,
    splits: usize,
    max_ctx: usize,
    block_tables: Tensor<i32>,
    ctx_lens: Tensor<i32>,
}

impl BatchPages {
    fn new(case: &DecodeCase, contexts: &[usize], kernel: &str) -> Result<BatchPages, SimError> {
        let fail = |message: String| SimError::Launch {
            kernel: kernel.into(),
            message,
        };
        let (b, page) = (contexts.len(), case.page_size);
        let pages: Vec<usize> = contexts.iter().map(|c| c.div_ceil(page)).collect();
        let width = pages.iter().copied().max().unwrap_or(1);
        let pool_pages = (pages.iter().sum::<usize>() + 3).max(b * width);
        let mut rng = crate::testdata::Rng::new(case.seed);
        let mut free: Vec<usize> = (0..pool_pages).collect();
        for i in (1..free.len()).rev() {
            free.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let tables: Vec<Vec<usize>> = pages.iter().map(|n| free.drain(..*n).collect()).collect();
        let flat: Vec<i32> = tables
            .iter()
            .flat_map(|row| (0..width).map(|i| row.get(i).copied().unwrap_or(0) as i32))
            .collect();
        let lens: Vec<i32> = contexts.iter().map(|c| *c as i32).collect();
        Ok(BatchPages {
            pool_pages,
            splits: case.splits.clamp(1, width),
            max_ctx: contexts.iter().copied().max().unwrap_or(1),
            block_tables: Tensor::<i32>::from_indices(&[b, width], &flat).map_err(fail)?,
            ctx_lens: Tensor::<i32>::from_indices(&[b], &lens).map_err(fail)?,
            tables,
        })
    }
}

fn run_latent_batch<T: Float>(
    launcher: &Launcher,
    case: &DecodeCase,
    contexts: &[usize],
    cfg: &Config,
) -> Result<DecodeRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: paged_decode_latent::META.name.into(),
        message,
    };
    let (b, g, d, dv, page) = (
        contexts.len(),
        case.heads,
        case.head_dim,
        case.v_head_dim,
        case.page_size,
    );
    let BatchPages {
        tables,
        pool_pages,
        splits,
        max_ctx,
        block_tables,
        ctx_lens,
    } = BatchPages::new(case, contexts, paged_decode_latent::META.name)?;
    let mut t = crate::testdata::CaseTensors::new(
        launcher,
        case.seed ^ 0x5eed,
        paged_decode_latent::META.name,
    );
    let q = t.input::<T>(&[b, g, d], 0.0, 1.0)?;
    let pool = t.input::<T>(&[pool_pages, page, d], 0.0, 1.0)?;
    let o_part = t.output::<f32>(&[splits, b, g, dv]);
    let lse_part = t.output::<f32>(&[splits, b, g, 1]);
    let o = t.output::<T>(&[b * g, dv]);
    let sm_scale = 1.0 / (d as f32).sqrt();
    let pool8 = if case.fp8_kv {
        Some(Fp8Tensors::quantize(&pool, 1, d).map_err(fail)?)
    } else {
        None
    };
    let split = match &pool8 {
        Some(p8) => paged_decode_latent_fp8::launch::<T, T>(
            launcher,
            cfg,
            &q,
            &p8.codes,
            &p8.scales,
            &block_tables,
            &ctx_lens,
            &o_part,
            &lse_part,
            max_ctx,
            sm_scale,
        )?,
        None => paged_decode_latent::launch(
            launcher,
            cfg,
            &q,
            &pool,
            &block_tables,
            &ctx_lens,
            &o_part,
            &lse_part,
            max_ctx,
            sm_scale,
        )?,
    };
    let combine = decode_combine::launch(launcher, &combine_config(dv)?, &o_part, &lse_part, &o)?;
    let mut report =
        dsl_core::Report::chain("paged_decode_latent", &[split.report, combine.report])
            .expect("two launches");
    let output = o.to_vec();
    let reference = |kv: &[f32], qv: &[f32]| -> Result<Vec<f64>, SimError> {
        let mut want = Vec::new();
        for (s, ctx) in contexts.iter().enumerate() {
            let rows = super::reference::gather_pages(kv, d, page, &tables[s], *ctx)
                .map_err(|e| fail(e.to_string()))?;
            let ms = MqaShape {
                sq: 1,
                skv: *ctx,
                heads: g,
                dk: d,
                dv,
            };
            let qs = &qv[s * g * d..(s + 1) * g * d];
            want.extend(
                mqa_dense(qs, &rows, ms, sm_scale as f64).map_err(|e| fail(e.to_string()))?,
            );
        }
        Ok(want)
    };
    let mut dequantized_error = None;
    if let (Some(out), Some(qv), Some(kv)) = (&output, q.to_vec(), pool.to_vec()) {
        report.max_rel_error = Some(crate::reference::rel_error(out, &reference(&kv, &qv)?));
        if let Some(p8) = &pool8 {
            let want = reference(&p8.dequantized(), &qv)?;
            dequantized_error = Some(crate::reference::rel_error(out, &want));
        }
    }
    let tokens: usize = contexts.iter().sum();
    // FP8: one byte per value and one f32 scale per token.
    let per_token = if case.fp8_kv {
        d as u64 + 4
    } else {
        d as u64 * T::DTYPE.bytes_for(1)
    };
    Ok(DecodeRun {
        report,
        output,
        dequantized_error,
        kv_cache_bytes: per_token * tokens as u64,
        kv_cache_bytes_bf16: (2 * d * tokens) as u64,
    })
}

/// A batch of GQA decodes in **one** [`paged_decode_gqa_batch()`] launch: sequence `s` has
/// context `contexts[s]` (each its own length), its pages scattered through one shared pool with
/// spare pages, as an allocator leaves it; heads, kv heads, dims, page size, splits, dtype and
/// seed come from `case` (its `ctx` is ignored). Checked against the f64 reference of each
/// sequence alone ([`attention_decode_paged`], as [`run_decode`]); the output is
/// `[S·heads, v_head_dim]`. With `fp8_kv` the pools are quantised per (token, key/value head)
/// and read by [`paged_decode_gqa_batch_fp8()`]; `max_rel_error` is then the error against the
/// unquantised pools and `dequantized_error` the kernel's own. Separate key and value pools only:
/// `shared_kv` (use [`run_decode_latent_batch`]) is refused with an error.
pub fn run_decode_gqa_batch(
    launcher: &Launcher,
    case: &DecodeCase,
    contexts: &[usize],
) -> Result<DecodeRun, SimError> {
    run_decode_gqa_batch_windowed(launcher, case, contexts, 0)
}

/// [`run_decode_gqa_batch`] over a sliding window: each sequence attends to its last `window`
/// keys (0: all of them), checked against
/// [`super::reference::attention_decode_paged_sinks`].
pub fn run_decode_gqa_batch_windowed(
    launcher: &Launcher,
    case: &DecodeCase,
    contexts: &[usize],
    window: usize,
) -> Result<DecodeRun, SimError> {
    run_decode_gqa_batch_with(launcher, case, contexts, window, false)
}

/// [`run_decode_gqa_batch_windowed`], with random attention sinks (one logit per query head in
/// every softmax's denominator, gpt-oss) when `sinks`, checked against
/// [`attention_decode_paged_sinks`].
pub fn run_decode_gqa_batch_with(
    launcher: &Launcher,
    case: &DecodeCase,
    contexts: &[usize],
    window: usize,
    sinks: bool,
) -> Result<DecodeRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: paged_decode_gqa_batch::META.name.into(),
        message,
    };
    if contexts.is_empty() || contexts.contains(&0) || case.page_size == 0 {
        return Err(fail(
            "a batch needs at least one sequence, each with context ≥ 1, and pages of ≥ 1 token"
                .into(),
        ));
    }
    if case.shared_kv {
        return Err(fail(
            "the batched GQA decode needs separate key and value pools (a shared latent pool: \
             run_decode_latent_batch)"
                .into(),
        ));
    }
    // Zero heads or dims, and heads that are not a multiple of kv_heads, are refused here.
    AttnShape {
        sq: 1,
        skv: 1,
        heads: case.heads,
        kv_heads: case.kv_heads,
        head_dim: case.head_dim,
        v_head_dim: case.v_head_dim,
    }
    .validate()
    .map_err(|e| fail(e.to_string()))?;
    let group = case.heads / case.kv_heads;
    let meta = if case.fp8_kv {
        &paged_decode_gqa_batch_fp8::META
    } else {
        &paged_decode_gqa_batch::META
    };
    let cfg = decode_config(
        meta,
        &Config::new(),
        case.head_dim,
        case.v_head_dim,
        case.page_size,
        group,
    )?;
    match case.dtype {
        GemmDtype::F32 => run_gqa_batch::<f32>(launcher, case, contexts, &cfg, window, sinks),
        GemmDtype::Bf16 => run_gqa_batch::<bf16>(launcher, case, contexts, &cfg, window, sinks),
    }
}

fn run_gqa_batch<T: Float>(
    launcher: &Launcher,
    case: &DecodeCase,
    contexts: &[usize],
    cfg: &Config,
    window: usize,
    with_sinks: bool,
) -> Result<DecodeRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: paged_decode_gqa_batch::META.name.into(),
        message,
    };
    let (b, hkv, d, dv, page) = (
        contexts.len(),
        case.kv_heads,
        case.head_dim,
        case.v_head_dim,
        case.page_size,
    );
    let group = case.heads / hkv;
    let BatchPages {
        tables,
        pool_pages,
        splits,
        max_ctx,
        block_tables,
        ctx_lens,
    } = BatchPages::new(case, contexts, paged_decode_gqa_batch::META.name)?;
    let mut t = crate::testdata::CaseTensors::new(
        launcher,
        case.seed ^ 0x5eed,
        paged_decode_gqa_batch::META.name,
    );
    let q = t.input::<T>(&[b * hkv, group, d], 0.0, 1.0)?;
    let k_pool = t.input::<T>(&[pool_pages, page, hkv * d], 0.0, 1.0)?;
    let v_pool = t.input::<T>(&[pool_pages, page, hkv * dv], 0.0, 1.0)?;
    let o_part = t.output::<f32>(&[splits, b * hkv, group, dv]);
    let lse_part = t.output::<f32>(&[splits, b * hkv, group, 1]);
    let o = t.output::<T>(&[b * case.heads, dv]);
    let sinks = if with_sinks {
        t.input::<f32>(&[case.heads, 1], 0.0, 2.0)?
    } else {
        super::sinks_tensor(
            launcher,
            paged_decode_gqa_batch::META.name,
            case.heads,
            None,
        )?
    };
    let sm_scale = 1.0 / (d as f32).sqrt();
    let pools8 = if case.fp8_kv {
        Some((
            Fp8Tensors::quantize(&k_pool, hkv, d).map_err(fail)?,
            Fp8Tensors::quantize(&v_pool, hkv, dv).map_err(fail)?,
        ))
    } else {
        None
    };
    let split = match &pools8 {
        Some((k8, v8)) => paged_decode_gqa_batch_fp8::launch::<T, T>(
            launcher,
            cfg,
            &q,
            &k8.codes,
            &v8.codes,
            &k8.scales,
            &v8.scales,
            &block_tables,
            &ctx_lens,
            &o_part,
            &lse_part,
            max_ctx,
            sm_scale,
            window,
            &sinks,
        )?,
        None => paged_decode_gqa_batch::launch(
            launcher,
            cfg,
            &q,
            &k_pool,
            &v_pool,
            &block_tables,
            &ctx_lens,
            &o_part,
            &lse_part,
            max_ctx,
            sm_scale,
            window,
            &sinks,
        )?,
    };
    let combine = decode_combine::launch(launcher, &combine_config(dv)?, &o_part, &lse_part, &o)?;
    let mut report =
        dsl_core::Report::chain("paged_decode_gqa_batch", &[split.report, combine.report])
            .expect("two launches");
    let output = o.to_vec();
    let sink_values = if with_sinks {
        sinks.to_vec().unwrap_or_default()
    } else {
        Vec::new()
    };
    // Each sequence alone through its own pages, over the pools `kv`/`vv`.
    let reference = |qv: &[f32], kv: &[f32], vv: &[f32]| -> Result<Vec<f64>, SimError> {
        let q_len = case.heads * d;
        let mut want = Vec::new();
        for (s, ctx) in contexts.iter().enumerate() {
            let shape = AttnShape {
                sq: 1,
                skv: *ctx,
                heads: case.heads,
                kv_heads: hkv,
                head_dim: d,
                v_head_dim: dv,
            };
            let qs = &qv[s * q_len..(s + 1) * q_len];
            want.extend(
                attention_decode_paged_sinks(
                    qs,
                    kv,
                    vv,
                    &tables[s],
                    page,
                    shape,
                    sm_scale as f64,
                    window,
                    &sink_values,
                )
                .map_err(|e| fail(e.to_string()))?,
            );
        }
        Ok(want)
    };
    let mut dequantized_error = None;
    if let (Some(out), Some(qv), Some(kv), Some(vv)) =
        (&output, q.to_vec(), k_pool.to_vec(), v_pool.to_vec())
    {
        report.max_rel_error = Some(crate::reference::rel_error(out, &reference(&qv, &kv, &vv)?));
        if let Some((k8, v8)) = &pools8 {
            let want = reference(&qv, &k8.dequantized(), &v8.dequantized())?;
            dequantized_error = Some(crate::reference::rel_error(out, &want));
        }
    }
    let tokens = contexts.iter().sum::<usize>() as u64;
    let values = (hkv * (d + dv)) as u64 * tokens;
    // FP8: one byte per value and one f32 scale per (token, key/value head) in each pool.
    let kv_cache_bytes = if case.fp8_kv {
        values + 2 * 4 * hkv as u64 * tokens
    } else {
        values * T::DTYPE.bytes_for(1)
    };
    Ok(DecodeRun {
        report,
        output,
        dequantized_error,
        kv_cache_bytes,
        kv_cache_bytes_bf16: 2 * values,
    })
}

fn run_decode_with(
    launcher: &Launcher,
    case: &DecodeCase,
    latent: bool,
) -> Result<DecodeRun, SimError> {
    let name = if latent {
        paged_decode_latent::META.name
    } else {
        paged_decode_split::META.name
    };
    let fail = |message: String| SimError::Launch {
        kernel: name.into(),
        message,
    };
    let shape = AttnShape {
        sq: 1,
        skv: case.ctx,
        heads: case.heads,
        kv_heads: case.kv_heads,
        head_dim: case.head_dim,
        v_head_dim: case.v_head_dim,
    };
    shape.validate().map_err(|e| fail(e.to_string()))?;
    if case.page_size == 0 || case.ctx == 0 {
        return Err(fail("page size and context must be ≥ 1".into()));
    }
    if case.shared_kv && (case.kv_heads != 1 || case.v_head_dim > case.head_dim) {
        return Err(fail(
            "a shared (latent) pool needs one kv head and v_head_dim ≤ head_dim".into(),
        ));
    }
    let group = case.heads / case.kv_heads;
    let meta = if case.fp8_kv {
        &paged_decode_split_fp8::META
    } else {
        &paged_decode_split::META
    };
    let run = |cfg: &Config| match case.dtype {
        GemmDtype::F32 => run_typed::<f32>(launcher, case, shape, cfg, group, latent),
        GemmDtype::Bf16 => run_typed::<bf16>(launcher, case, shape, cfg, group, latent),
    };
    if latent {
        return latent_fitting(case, group, run);
    }
    run(&decode_config(
        meta,
        &Config::new(),
        case.head_dim,
        case.v_head_dim,
        case.page_size,
        group,
    )?)
}

/// Runs the latent decode with the largest key tile within a page that fits the core: the
/// pipelined kernel holds three key tiles, so at 64 rows 576-wide bf16 rows overflow a 228 KB
/// SM (and f32 ones a 512 KB NPU core); the next smaller tile is tried then.
fn latent_fitting(
    case: &DecodeCase,
    q_rows: usize,
    run: impl Fn(&Config) -> Result<DecodeRun, SimError>,
) -> Result<DecodeRun, SimError> {
    let mut last = None;
    for bk in crate::tile_choice::up_to(&paged_decode_latent::META, "BK", case.page_size) {
        let base = Config::new().with("BK", bk);
        let r = run(&decode_latent_config(
            &base,
            case.head_dim,
            case.page_size,
            q_rows,
        )?);
        if !matches!(r, Err(SimError::SramOverflow { .. })) {
            return r;
        }
        last = Some(r);
    }
    match last {
        Some(r) => r,
        // A page smaller than every declared key tile: the default choice.
        None => run(&decode_latent_config(
            &Config::new(),
            case.head_dim,
            case.page_size,
            q_rows,
        )?),
    }
}

fn run_typed<T: Float>(
    launcher: &Launcher,
    case: &DecodeCase,
    shape: AttnShape,
    cfg: &Config,
    group: usize,
    latent: bool,
) -> Result<DecodeRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: paged_decode_split::META.name.into(),
        message,
    };
    let n_pages = case.ctx.div_ceil(case.page_size);
    let splits = case.splits.clamp(1, n_pages);
    // A pool with spare pages and a scrambled block table, as a real allocator leaves it.
    let pool_pages = n_pages + 3;
    let mut rng = crate::testdata::Rng::new(case.seed);
    let mut table: Vec<usize> = (0..pool_pages).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    table.truncate(n_pages);
    let krow = case.kv_heads * case.head_dim;
    let vrow = case.kv_heads * case.v_head_dim;
    let mut t = crate::testdata::CaseTensors::new(
        launcher,
        case.seed ^ 0x5eed,
        paged_decode_split::META.name,
    );
    let q = t.input::<T>(&[case.kv_heads, group, case.head_dim], 0.0, 1.0)?;
    let k_pool = t.input::<T>(&[pool_pages, case.page_size, krow], 0.0, 1.0)?;
    let v_pool = if case.shared_kv {
        k_pool.clone()
    } else {
        t.input::<T>(&[pool_pages, case.page_size, vrow], 0.0, 1.0)?
    };
    let idx: Vec<i32> = table.iter().map(|p| *p as i32).collect();
    let block_table = if launcher.backend == Backend::Functional {
        Tensor::<i32>::from_indices(&[n_pages], &idx).map_err(fail)?
    } else {
        Tensor::shape_only(&[n_pages])
    };
    let o_part = t.output::<f32>(&[splits, case.kv_heads, group, case.v_head_dim]);
    let lse_part = t.output::<f32>(&[splits, case.kv_heads, group, 1]);
    let o = t.output::<T>(&[case.heads, case.v_head_dim]);
    let sm_scale = 1.0 / (case.head_dim as f32).sqrt();
    let fp8_pools = if case.fp8_kv {
        let k8 = Fp8Tensors::quantize(&k_pool, case.kv_heads, case.head_dim).map_err(fail)?;
        let v8 = if case.shared_kv {
            k8.clone()
        } else {
            Fp8Tensors::quantize(&v_pool, case.kv_heads, case.v_head_dim).map_err(fail)?
        };
        Some((k8, v8))
    } else {
        None
    };
    // One sequence of the batched latent kernels: a one-row table and its length (read by the
    // kernel, as in a batch).
    let latent_table = || -> Result<_, SimError> {
        Ok((
            block_table.reshaped(&[1, n_pages]).map_err(fail)?,
            Tensor::<i32>::from_indices(&[1], &[case.ctx as i32]).map_err(fail)?,
        ))
    };
    let split = if let (true, Some((k8, _))) = (latent, &fp8_pools) {
        let (tables, ctx_lens) = latent_table()?;
        paged_decode_latent_fp8::launch::<T, T>(
            launcher, cfg, &q, &k8.codes, &k8.scales, &tables, &ctx_lens, &o_part, &lse_part,
            case.ctx, sm_scale,
        )?
    } else if let Some((k8, v8)) = &fp8_pools {
        paged_decode_split_fp8::launch(
            launcher,
            cfg,
            &q,
            &k8.codes,
            &v8.codes,
            &k8.scales,
            &v8.scales,
            &block_table,
            &o_part,
            &lse_part,
            case.ctx,
            sm_scale,
        )?
    } else if latent {
        let (tables, ctx_lens) = latent_table()?;
        paged_decode_latent::launch(
            launcher, cfg, &q, &k_pool, &tables, &ctx_lens, &o_part, &lse_part, case.ctx, sm_scale,
        )?
    } else {
        paged_decode_split::launch(
            launcher,
            cfg,
            &q,
            &k_pool,
            &v_pool,
            &block_table,
            &o_part,
            &lse_part,
            case.ctx,
            sm_scale,
        )?
    };
    let comb_cfg = combine_config(case.v_head_dim)?;
    let combine = decode_combine::launch(launcher, &comb_cfg, &o_part, &lse_part, &o)?;
    let mut report = dsl_core::Report::chain("paged_decode", &[split.report, combine.report])
        .expect("two launches");
    let output = o.to_vec();
    let reference = |kv: &[f32], vv: &[f32], qv: &[f32]| {
        if case.shared_kv {
            let rows = super::reference::gather_pages(kv, krow, case.page_size, &table, case.ctx)?;
            let ms = MqaShape {
                sq: 1,
                skv: case.ctx,
                heads: case.heads,
                dk: case.head_dim,
                dv: case.v_head_dim,
            };
            mqa_dense(qv, &rows, ms, sm_scale as f64)
        } else {
            attention_decode_paged(qv, kv, vv, &table, case.page_size, shape, sm_scale as f64)
        }
    };
    let mut dequantized_error = None;
    if let (Some(out), Some(qv), Some(kv), Some(vv)) =
        (&output, q.to_vec(), k_pool.to_vec(), v_pool.to_vec())
    {
        let want = reference(&kv, &vv, &qv).map_err(|e| fail(e.to_string()))?;
        report.max_rel_error = Some(crate::reference::rel_error(out, &want));
        if let Some((k8, v8)) = &fp8_pools {
            let want = reference(&k8.dequantized(), &v8.dequantized(), &qv)
                .map_err(|e| fail(e.to_string()))?;
            dequantized_error = Some(crate::reference::rel_error(out, &want));
        }
    }
    // Values per token: the keys, and the values unless they are the keys' first columns.
    let values = (krow + if case.shared_kv { 0 } else { vrow }) as u64;
    let pools = if case.shared_kv { 1 } else { 2 };
    let per_token = if case.fp8_kv {
        values + 4 * (pools * case.kv_heads) as u64
    } else {
        values * T::DTYPE.bytes_for(1)
    };
    Ok(DecodeRun {
        report,
        output,
        dequantized_error,
        kv_cache_bytes: per_token * case.ctx as u64,
        kv_cache_bytes_bf16: 2 * values * case.ctx as u64,
    })
}
