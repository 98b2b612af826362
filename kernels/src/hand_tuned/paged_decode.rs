//! Hand-tuned split-KV paged decode attention (flash-decoding), written against
//! [`accel_sim::manual`]: the swap target of [`crate::attention::decode::paged_decode_split`] (same
//! tensors, same grid of head blocks × context splits, same partials for
//! [`crate::attention::decode::decode_combine`]).
//!
//! The DSL prototype reads each page's block-table entry with a blocking 4-byte load (the issue
//! stream stops for a DMA round trip per page), scales and masks every score tile, and leaves the
//! loads' overlap to the front end. Here:
//! - **the split's block table in one load**: its entries arrive in one DMA and are read out by
//!   one-element register moves, so no page waits on a device round trip;
//! - **a `STAGES`-deep key/value ring across pages**: block `b + STAGES`'s keys load as soon as
//!   block `b`'s scores are done, its values as soon as block `b`'s output product is;
//! - **scores one block ahead**: block `b + 1`'s `q·kᵀ` is issued before block `b`'s softmax, so
//!   the matrix unit computes it while the vector unit works (two score and probability buffers);
//! - **less vector work per block**: the softmax scale is folded into the queries once; only a block
//!   that runs past its page's last token is masked; the first block initialises the running max,
//!   sum and accumulator directly (no fills, no rescale); the running max alternates between two
//!   buffers instead of being copied;
//! - **exact head widths**: buffers are placed at the head dims, not padded to a tile menu.

use super::Placer;
use accel_sim::functional::{Binary, Reduce, Unary};
use accel_sim::manual::{Accumulate, Buffer, DeviceTensor, Event, ManualProgram};
use accel_sim::DType;
use dsl_core::{Config, Float, KernelMeta, Launch, Launcher, SimError, Tensor};
use std::collections::VecDeque;

const SOURCE: &str = include_str!("paged_decode.rs");

/// Registry and tuning metadata of [`launch`]: query rows per program `BH`, keys per block `BK`
/// (a block never crosses a page: a page shorter than `BK` gives page-sized blocks) and the depth
/// of the key/value ring `STAGES`.
pub static META: KernelMeta = super::meta(
    "paged_decode_hand",
    &[
        "q",
        "k_pool",
        "v_pool",
        "block_table",
        "o_part",
        "lse_part",
        "ctx_len",
        "sm_scale",
    ],
    &[
        ("BH", &[16, 32, 64, 128]),
        ("BK", &[64, 32, 128]),
        ("STAGES", &[3, 2, 4]),
    ],
    file!(),
    SOURCE,
);

/// The tensors of one split-KV decode launch over `S` sequences (`S = 1`: the layout
/// [`crate::attention::decode::paged_decode_split`] takes; `S > 1`: the layout of
/// [`crate::attention::decode::paged_decode_gqa_batch`]): `q [S·Hkv, G, D]`,
/// `k_pool [pages, P, Hkv·D]`, `v_pool [pages, P, Hkv·DV]`, `block_table [T]` or `[S, T]` (i32),
/// `o_part [splits, S·Hkv, G, DV]` and `lse_part [splits, S·Hkv, G, 1]` (f32).
pub struct DecodeTensors<'a, Q: Float, T: Float> {
    /// The newest token's queries of each sequence, grouped by key/value head (any float type:
    /// they are scaled and converted to the cache's type on chip).
    pub q: &'a Tensor<Q>,
    /// The key pages, shared by the sequences.
    pub k_pool: &'a Tensor<T>,
    /// The value pages.
    pub v_pool: &'a Tensor<T>,
    /// Each sequence's pages in logical order (one row per sequence).
    pub block_table: &'a Tensor<i32>,
    /// `[S]`: each sequence's context length, read by its programs (as FlashMLA reads
    /// `cache_seqlens`); `None`: every sequence has the launch's `ctx_len`. Cost-only runs have
    /// no data and take `ctx_len`.
    pub ctx_lens: Option<&'a Tensor<i32>>,
    /// Each split's normalised partial output.
    pub o_part: &'a Tensor<f32>,
    /// Each split's log-sum-exp.
    pub lse_part: &'a Tensor<f32>,
}

/// Runs the hand-tuned split-KV decode, scores scaled by `sm_scale`, each sequence over the first
/// `ctx_len` tokens of its pages (or its own length from `ctx_lens`, at most `ctx_len`); one
/// program per (block of `BH` query rows of one sequence's key/value head, split).
pub fn launch<Q: Float, T: Float>(
    launcher: &Launcher,
    config: &Config,
    t: &DecodeTensors<'_, Q, T>,
    ctx_len: usize,
    sm_scale: f32,
) -> Result<Launch, SimError> {
    let cfg = META.resolve(config)?;
    let (q_heads, g, d) = match t.q.shape() {
        [h, g, d] => (*h, *g, *d),
        s => return Err(bad(format!("`q` must be [S·Hkv, G, D], got {s:?}"))),
    };
    let (seqs, table_len) = match t.block_table.shape() {
        [n] => (1, *n),
        [s, n] => (*s, *n),
        s => {
            return Err(bad(format!(
                "`block_table` must be [T] or [S, T], got {s:?}"
            )))
        }
    };
    let hkv = q_heads / seqs.max(1);
    let (splits, dv) = match t.o_part.shape() {
        [s, h, gg, dv] if *h == q_heads && *gg == g => (*s, *dv),
        s => {
            return Err(bad(format!(
                "`o_part` must be [splits, {q_heads}, {g}, DV], got {s:?}"
            )))
        }
    };
    let (pool_pages, page) = match t.k_pool.shape() {
        [n, p, w] if *w == hkv * d && hkv * seqs == q_heads => (*n, *p),
        s => {
            return Err(bad(format!(
                "`k_pool` must be [pages, P, Hkv·D] with {seqs} sequence(s) × Hkv = {q_heads} query head rows and D = {d}, got {s:?}"
            )))
        }
    };
    let n_pages = ctx_len.div_ceil(page.max(1));
    let lens_ok = t.ctx_lens.is_none_or(|c| c.shape() == [seqs]);
    if t.v_pool.shape() != [pool_pages, page, hkv * dv]
        || t.lse_part.shape() != [splits, q_heads, g, 1]
        || table_len < n_pages
        || !lens_ok
        || ctx_len == 0
    {
        return Err(bad(format!(
            "shapes do not chain at ctx_len {ctx_len}: v_pool {:?} (want [{pool_pages}, {page}, {}]), lse_part {:?} (want [{splits}, {q_heads}, {g}, 1]), block_table rows of {table_len} entries (want ≥ {n_pages}), ctx_lens {:?} (want [{seqs}])",
            t.v_pool.shape(),
            hkv * dv,
            t.lse_part.shape(),
            t.ctx_lens.map(|c| c.shape().to_vec())
        )));
    }
    let tile = |name: &str| cfg.get(name).unwrap_or(1).max(1) as usize;
    let (bh, bk, stages) = (tile("BH"), tile("BK").min(page), tile("STAGES"));
    let blocks_per_head = g.div_ceil(bh);
    let grid = [q_heads * blocks_per_head, splits, 1];
    launcher.run_manual(META.name, SOURCE, &cfg, grid, &|pid, p| {
        let qh = pid[0] / blocks_per_head;
        let work = Split {
            seq: qh / hkv,
            kvh: qh % hkv,
            qh,
            r0: (pid[0] % blocks_per_head) * bh,
            split: pid[1],
            splits,
            table_len,
            max_ctx: ctx_len,
            page,
            d,
            dv,
            bh,
            bk,
            stages,
            sm_scale,
        };
        program::<Q, T>(p, t, &work);
    })
}

fn bad(message: String) -> SimError {
    SimError::Launch {
        kernel: META.name.to_string(),
        message,
    }
}

/// One program's work: its sequence, key/value head (and that head's row of the queries), first
/// query row and split, and the tiles.
struct Split {
    seq: usize,
    kvh: usize,
    qh: usize,
    r0: usize,
    split: usize,
    splits: usize,
    /// Entries per block-table row.
    table_len: usize,
    max_ctx: usize,
    page: usize,
    d: usize,
    dv: usize,
    bh: usize,
    bk: usize,
    stages: usize,
    sm_scale: f32,
}

/// One key block of a split: its page's position in the split, its first row in the page, and
/// how many of its rows hold context.
#[derive(Clone, Copy)]
struct Block {
    page_slot: usize,
    row: usize,
    valid: usize,
}

/// One program: its split's block table, the key/value ring and the online softmax over the
/// split's key blocks, then its partial output and log-sum-exp.
fn program<Q: Float, T: Float>(p: &mut ManualProgram, t: &DecodeTensors<'_, Q, T>, w: &Split) {
    let dt = T::DTYPE;
    let mut sram = Placer::default();
    let mut place = |p: &mut ManualProgram, name, rows, cols, dtype: DType| {
        sram.place(p, line!(), name, rows, cols, dtype)
    };
    // The sequence's length first (4 bytes), then its share of the pages.
    let ctx_len = match t.ctx_lens {
        Some(lens) => {
            let len = place(p, "ctx_len", 1, 1, DType::I32);
            let e = p.at(line!()).dma_in(lens, 0, w.seq, len, &[]);
            p.at(line!()).index_at(len, 0, w.max_ctx, &[e])
        }
        None => w.max_ctx,
    };
    if ctx_len > w.max_ctx {
        p.fail(format!(
            "sequence {} has {ctx_len} tokens, past the launch's ctx_len {}",
            w.seq, w.max_ctx
        ));
        return;
    }
    let n_pages = ctx_len.div_ceil(w.page);
    let (p0, p1) = (
        w.split * n_pages / w.splits,
        (w.split + 1) * n_pages / w.splits,
    );
    let table = match t.block_table.shape().len() {
        1 => t.block_table.clone(),
        _ => t.block_table.at(w.seq),
    };
    let acc = place(p, "acc", w.bh, w.dv, DType::F32);
    let m = [
        place(p, "m0", w.bh, 1, DType::F32),
        place(p, "m1", w.bh, 1, DType::F32),
    ];
    let l = place(p, "l", w.bh, 1, DType::F32);
    let o_part = t.o_part.at(w.split).at(w.qh);
    let lse_part = t.lse_part.at(w.split).at(w.qh);
    if p1 == p0 {
        // A split with no pages (a context shorter than the grid's splits): a zero partial with a
        // log-sum-exp of −∞, which the combine weighs by zero.
        let z = p.at(line!()).fill(acc, 0.0, &[]);
        let n = p.at(line!()).fill(l, f32::NEG_INFINITY, &[]);
        p.at(line!()).dma_out(acc, &o_part, w.r0, 0, &[z]);
        p.at(line!()).dma_out(l, &lse_part, w.r0, 0, &[n]);
        return;
    }
    let blocks: Vec<Block> = (p0..p1)
        .flat_map(|pg| {
            let valid = ctx_len.min((pg + 1) * w.page) - pg * w.page;
            (0..valid).step_by(w.bk).map(move |row| Block {
                page_slot: pg - p0,
                row,
                valid: (valid - row).min(w.bk),
            })
        })
        .collect();
    let tbl = place(p, "block_table", 1, p1 - p0, DType::I32);
    // The queries arrive in the format device memory holds them in (bf16 activations at native
    // precision): DMA does not convert.
    let q_dt = DeviceTensor::dtype(t.q);
    let q_in = place(p, "q_in", w.bh, w.d, q_dt);
    let q = if q_dt == dt {
        q_in
    } else {
        place(p, "q", w.bh, w.d, dt)
    };
    let ks: Vec<Buffer> = (0..w.stages)
        .map(|_| place(p, "k_stage", w.bk, w.d, dt))
        .collect();
    let vs: Vec<Buffer> = (0..w.stages)
        .map(|_| place(p, "v_stage", w.bk, w.dv, dt))
        .collect();
    let s = [
        place(p, "s0", w.bh, w.bk, DType::F32),
        place(p, "s1", w.bh, w.bk, DType::F32),
    ];
    let pt = [
        place(p, "p0", w.bh, w.bk, dt),
        place(p, "p1", w.bh, w.bk, dt),
    ];
    let alpha = place(p, "alpha", w.bh, 1, DType::F32);
    let rsum = place(p, "row_sum", w.bh, 1, DType::F32);

    // The split's block-table entries in one load, then each page read out once. Cost-only runs
    // have no table: sequence `s`'s page `p` is pool page `s·T + p`, as an allocator gives
    // distinct sequences distinct pages (the DSL kernels' assumption too), so no sequence's reads
    // hit the L2 lines of another's.
    let e_tbl = p.at(line!()).dma_in(&table, 0, p0, tbl, &[]);
    let first_page = w.seq * w.table_len;
    let pages: Vec<usize> = (0..p1 - p0)
        .map(|j| {
            p.at(line!())
                .index_at(tbl, j, first_page + p0 + j, &[e_tbl])
        })
        .collect();
    let e_q = p.at(line!()).dma_in(&t.q.at(w.qh), w.r0, 0, q_in, &[]);
    // The softmax scale folded into the queries once, not into every score tile; then the
    // queries in the cache's type, which the matrix unit multiplies.
    let mut e_qs = p
        .at(line!())
        .scalar(q_in, w.sm_scale, q_in, Binary::Mul, &[e_q]);
    if q != q_in {
        e_qs = p.at(line!()).cast(q_in, q, &[]);
    }
    let (kh, vh) = (
        t.k_pool.cols_clipped(w.kvh * w.d, w.d),
        t.v_pool.cols_clipped(w.kvh * w.dv, w.dv),
    );
    // Block `b`'s key and value loads into stage `b mod STAGES`, after the events that free it.
    let load = |p: &mut ManualProgram, b: usize, k_free: &[Event], v_free: &[Event]| {
        let blk = blocks[b];
        let pg = pages[blk.page_slot];
        let (kp, vp) = (
            kh.at(pg).rows_clipped(0, blk.row + blk.valid),
            vh.at(pg).rows_clipped(0, blk.row + blk.valid),
        );
        let st = b % w.stages;
        let ek = p.at(line!()).dma_in(&kp, blk.row, 0, ks[st], k_free);
        let ev = p.at(line!()).dma_in(&vp, blk.row, 0, vs[st], v_free);
        (ek, ev)
    };
    let mut loads: VecDeque<(Event, Event)> = (0..w.stages.min(blocks.len()))
        .map(|b| load(p, b, &[], &[]))
        .collect();
    let Some(&(ek0, _)) = loads.front() else {
        return;
    };
    let mut scores = p
        .at(line!())
        .mma_bt(s[0], q, ks[0], Accumulate::Overwrite, &[ek0, e_qs]);
    // The last vector read of each score buffer (its cast) and the last output product.
    let mut cast_of: [Option<Event>; 2] = [None, None];
    let mut product: Option<Event> = None;
    for (b, blk) in blocks.iter().enumerate() {
        let (cur, next) = (b % 2, (b + 1) % 2);
        let Some((_, ev)) = loads.pop_front() else {
            break;
        };
        let s_b = scores;
        // Block b + 1's scores, so the matrix unit works through block b's softmax.
        if let Some(&(ek, _)) = loads.front() {
            let mut wait = vec![ek];
            wait.extend(cast_of[next]);
            scores = p.at(line!()).mma_bt(
                s[next],
                q,
                ks[(b + 1) % w.stages],
                Accumulate::Overwrite,
                &wait,
            );
        }
        let sc = s[cur];
        // Only a block running past its page's context is masked; the first vector op of the
        // block waits on its scores.
        let first = if blk.valid < w.bk {
            p.at(line!()).mask_cols(sc, blk.valid, &[s_b]);
            vec![]
        } else {
            vec![s_b]
        };
        if b == 0 {
            p.at(line!()).reduce_rows(sc, m[0], Reduce::Max, &first);
            p.at(line!()).col_bcast(sc, m[0], sc, Binary::Sub, &[]);
            p.at(line!()).unary(sc, sc, Unary::Exp, &[]);
            p.at(line!()).reduce_rows(sc, l, Reduce::Sum, &[]);
        } else {
            let (mo, mn) = (m[next], m[cur]);
            p.at(line!()).reduce_rows(sc, mn, Reduce::Max, &first);
            p.at(line!()).binary(mo, mn, mn, Binary::Max, &[]);
            p.at(line!()).binary(mo, mn, alpha, Binary::Sub, &[]);
            p.at(line!()).unary(alpha, alpha, Unary::Exp, &[]);
            p.at(line!()).col_bcast(sc, mn, sc, Binary::Sub, &[]);
            p.at(line!()).unary(sc, sc, Unary::Exp, &[]);
            p.at(line!()).reduce_rows(sc, rsum, Reduce::Sum, &[]);
            p.at(line!()).binary(l, alpha, l, Binary::Mul, &[]);
            p.at(line!()).binary(l, rsum, l, Binary::Add, &[]);
            // The accumulator is the matrix unit's until its last product is done.
            let last_product: Vec<Event> = product.into_iter().collect();
            p.at(line!())
                .col_bcast(acc, alpha, acc, Binary::Mul, &last_product);
        }
        let cast = p.at(line!()).cast(sc, pt[cur], &[]);
        cast_of[cur] = Some(cast);
        let mode = if b == 0 {
            Accumulate::Overwrite
        } else {
            Accumulate::Add
        };
        let pv = p
            .at(line!())
            .mma(acc, pt[cur], vs[b % w.stages], mode, &[cast, ev]);
        product = Some(pv);
        if b + w.stages < blocks.len() {
            loads.push_back(load(p, b + w.stages, &[s_b], &[pv]));
        }
    }
    let last_m = m[(blocks.len() - 1) % 2];
    let last_product: Vec<Event> = product.into_iter().collect();
    let e_o = p
        .at(line!())
        .col_bcast(acc, l, acc, Binary::Div, &last_product);
    p.at(line!()).dma_out(acc, &o_part, w.r0, 0, &[e_o]);
    p.at(line!()).unary(l, rsum, Unary::Ln, &[]);
    let e_lse = p.at(line!()).binary(rsum, last_m, rsum, Binary::Add, &[]);
    p.at(line!()).dma_out(rsum, &lse_part, w.r0, 0, &[e_lse]);
}

/// One decode problem for [`run_case`]: `heads` queries over `kv_heads` key/value heads (a
/// multiple), `ctx` tokens of the paged cache in pages of `page`, split `splits` ways (clamped to
/// the pages). Field names are `day0 tune attention_decode --shape` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DecodeShape {
    /// Context length (the newest token included).
    pub ctx: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query and key head dimension.
    pub head_dim: usize,
    /// Value head dimension.
    pub v_head_dim: usize,
    /// Tokens per page.
    pub page: usize,
    /// Context splits.
    pub splits: usize,
}

/// Runs the hand-tuned kernel (`hand_tuned`) or its DSL prototype at `config`, then
/// `decode_combine` at its covering tiles, one report for both (the combine is part of what a
/// split choice costs), on random queries and key/value pools (`seed`) with spare pages and a
/// scrambled block table; outputs start poisoned. In functional runs the report's
/// `max_rel_error` is against [`crate::attention::reference::attention_decode_paged`]. What
/// `day0 tune`/`day0 compare attention_decode` and the tests run.
pub fn run_case<T: Float>(
    launcher: &Launcher,
    hand_tuned: bool,
    shape: &DecodeShape,
    config: &Config,
    seed: u64,
) -> Result<dsl_core::Report, SimError> {
    use crate::attention::decode::{combine_config, decode_combine, paged_decode_split};
    use crate::attention::reference::{attention_decode_paged, AttnShape};
    let DecodeShape {
        ctx,
        heads,
        kv_heads,
        head_dim,
        v_head_dim,
        page,
        splits,
    } = *shape;
    if [ctx, heads, kv_heads, head_dim, v_head_dim, page].contains(&0) || heads % kv_heads != 0 {
        return Err(bad(format!(
            "{shape:?}: every size must be ≥ 1 and heads a multiple of kv_heads"
        )));
    }
    let group = heads / kv_heads;
    let n_pages = ctx.div_ceil(page);
    let splits = splits.clamp(1, n_pages);
    let pool_pages = n_pages + 3;
    let mut rng = crate::testdata::Rng::new(seed);
    let mut table: Vec<usize> = (0..pool_pages).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    table.truncate(n_pages);
    let (krow, vrow) = (kv_heads * head_dim, kv_heads * v_head_dim);
    let mut t = crate::testdata::CaseTensors::new(launcher, seed ^ 0xdec, "paged_decode");
    let q = t.input::<T>(&[kv_heads, group, head_dim], 0.0, 1.0)?;
    let k_pool = t.input::<T>(&[pool_pages, page, krow], 0.0, 1.0)?;
    let v_pool = t.input::<T>(&[pool_pages, page, vrow], 0.0, 1.0)?;
    let block_table = if launcher.backend == dsl_core::Backend::Functional {
        let idx: Vec<i32> = table.iter().map(|p| *p as i32).collect();
        Tensor::from_indices(&[n_pages], &idx).map_err(bad)?
    } else {
        Tensor::shape_only(&[n_pages])
    };
    let o_part = t.output::<f32>(&[splits, kv_heads, group, v_head_dim]);
    let lse_part = t.output::<f32>(&[splits, kv_heads, group, 1]);
    let o = t.output::<T>(&[heads, v_head_dim]);
    let sm_scale = 1.0 / (head_dim as f32).sqrt();
    let split = if hand_tuned {
        let tensors = DecodeTensors {
            q: &q,
            k_pool: &k_pool,
            v_pool: &v_pool,
            block_table: &block_table,
            ctx_lens: None,
            o_part: &o_part,
            lse_part: &lse_part,
        };
        launch(launcher, config, &tensors, ctx, sm_scale)?
    } else {
        paged_decode_split::launch(
            launcher,
            config,
            &q,
            &k_pool,
            &v_pool,
            &block_table,
            &o_part,
            &lse_part,
            ctx,
            sm_scale,
        )?
    };
    let combine = decode_combine::launch(
        launcher,
        &combine_config(v_head_dim)?,
        &o_part,
        &lse_part,
        &o,
    )?;
    let name = if hand_tuned {
        META.name
    } else {
        paged_decode_split::META.name
    };
    let mut report = dsl_core::Report::chain(name, &[split.report, combine.report])
        .ok_or_else(|| bad("no launches to report".into()))?;
    // The chain is named after its first part; keep the tuned kernel's tiles on it.
    report.config = config.0.clone();
    if let (Some(out), Some(qv), Some(kv), Some(vv)) =
        (o.to_vec(), q.to_vec(), k_pool.to_vec(), v_pool.to_vec())
    {
        let ashape = AttnShape::decode(ctx, heads, kv_heads, head_dim, v_head_dim);
        let want = attention_decode_paged(&qv, &kv, &vv, &table, page, ashape, sm_scale as f64)
            .map_err(|e| bad(e.to_string()))?;
        report.max_rel_error = Some(crate::reference::rel_error(&out, &want));
    }
    Ok(report)
}
