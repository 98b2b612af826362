//! FP8 E4M3 KV cache: the paged pools hold one byte per value plus one f32 scale per (token,
//! key/value head), and the kernels that read them (GQA and MLA decode, DSA's indexer and sparse
//! attention for prompt chunks and decodes) convert the codes on chip.
//!
//! **Scale granularity: per token** (per cached row of a key/value head), `scale = amax / 448`
//! (448 = E4M3's largest finite value), codes rounded to nearest-even. This is the granularity of
//! DeepSeek-V3.2's FP8 latent cache (FlashMLA's sparse-decode layout, vLLM's `fp8_ds_mla`), which
//! quantises each token on its own, but coarser: FlashMLA keeps 4 scales per token (one per 128
//! latent values) and the 64 RoPE values in bf16 (656 B/token); here all `kv_lora + rope` values
//! of a token share one scale (576 B + 4 B = 580 B/token). vLLM's generic `--kv-cache-dtype fp8`
//! uses one per-tensor scale instead; a per-token scale needs no calibration and cannot overflow.
//!
//! The kernel never rounds a dequantised value: codes are exact in the compute dtype, key scales
//! multiply the score columns and value scales the probability columns before the value product
//! (`Σ_s p_s·(σ_s c_s) = Σ_s (p_s σ_s)·c_s`), as DeepSeek's FP8 GEMMs scale partial products.

use super::decode::{
    gqa_batch_program, gqa_page_at, latent_block_at, mask_decode_keys, online_softmax_step,
    split_pages, split_program, split_rows, store_split_partials,
};
use super::kv_append::{append_rows_config, append_slots, append_table, device_rows, device_slots};
use accel_sim::formats::fp8::{decode_e4m3, encode_e4m3};
use accel_sim::formats::Overflow;
use dsl_core::prelude::*;
use dsl_core::SimError;

/// Largest finite E4M3 value: a token's largest magnitude maps to it.
pub const E4M3_MAX: f32 = 448.0;

/// Smallest amax a scale is taken from: an all-zero row keeps a tiny, normal scale (its codes are
/// 0) instead of dividing by zero; rows below it lose nothing an f32 activation holds.
pub const AMAX_FLOOR: f32 = 1e-30;

/// Unit roundoff of E4M3 (3 mantissa bits, round-to-nearest-even): a value in the normal range
/// is stored with relative error ≤ 2^-4.
pub const E4M3_UNIT_ROUNDOFF: f64 = 1.0 / 16.0;

/// Absolute error bound, in units of the token's scale, for values below E4M3's normal range
/// (< 2^-6): half the subnormal spacing 2^-9.
pub const E4M3_SUBNORMAL_HALF_STEP: f64 = 1.0 / 1024.0;

/// An FP8 pool: `codes [pages, P, heads·dim]` and `scales [pages, heads, P]` (one per token and
/// head, laid out so a page's scales for one head load as one `1×P` row).
#[derive(Debug, Clone)]
pub struct Fp8Pool {
    /// E4M3 codes, one byte per value.
    pub codes: Vec<u8>,
    /// f32 scales (`value ≈ decode(code) · scale`).
    pub scales: Vec<f32>,
}

impl Fp8Pool {
    /// The values the codes stand for: `decode(code) · scale`, in the pool's
    /// `[pages, P, heads·dim]` order.
    pub fn dequantized(&self, page_size: usize, heads: usize, dim: usize) -> Vec<f32> {
        let values: Vec<f32> = self.codes.iter().map(|c| decode_e4m3(*c)).collect();
        dequantize(&values, &self.scales, page_size, heads, dim)
    }
}

/// Quantises a pool `[pages, page_size, heads·dim]` per (token, head): `scale = max(amax,`
/// [`AMAX_FLOOR`]`) / 448`, codes `RNE(value / scale)`, as [`kv_cache_append_fp8()`] does on chip. Errors on a length that does not match or a
/// non-finite value (FP8 E4M3 cannot hold it), naming its position.
pub fn quantize_per_token(
    pool: &[f32],
    page_size: usize,
    heads: usize,
    dim: usize,
) -> Result<Fp8Pool, String> {
    let row = heads * dim;
    // Whole pages, written without `%` (no `is_multiple_of`: the workspace's rust-version is 1.85).
    let page_len = row * page_size;
    if page_len == 0 || pool.len() / page_len * page_len != pool.len() {
        return Err(format!(
            "FP8 KV pool: {} values do not form pages of {page_size} tokens × {heads} heads × {dim}",
            pool.len()
        ));
    }
    let pages = pool.len() / (row * page_size);
    let mut codes = vec![0u8; pool.len()];
    let mut scales = vec![1.0f32; pages * heads * page_size];
    for (tok, vals) in pool.chunks_exact(row).enumerate() {
        let (page, slot) = (tok / page_size, tok % page_size);
        for (head, hv) in vals.chunks_exact(dim).enumerate() {
            if let Some(bad) = hv.iter().position(|v| !v.is_finite()) {
                return Err(format!(
                    "FP8 KV pool: value {} of head {head} at page {page}, slot {slot} is {}; \
                     E4M3 cannot hold it",
                    bad, hv[bad]
                ));
            }
            let amax = hv.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let scale = amax.max(AMAX_FLOOR) / E4M3_MAX;
            scales[(page * heads + head) * page_size + slot] = scale;
            let out = &mut codes[tok * row + head * dim..][..dim];
            for (c, v) in out.iter_mut().zip(hv) {
                *c = encode_e4m3(v / scale, Overflow::Saturate);
            }
        }
    }
    Ok(Fp8Pool { codes, scales })
}

/// A pool quantised with [`quantize_per_token`] as device tensors: codes `[pages, P, heads·dim]`
/// and scales `[pages, heads, P]` (shape-only for a shape-only pool: cost-only runs).
#[derive(Debug, Clone)]
pub struct Fp8Tensors {
    /// E4M3 codes.
    pub codes: Tensor<fp8e4m3>,
    /// Per-(token, head) scales.
    pub scales: Tensor<f32>,
    heads: usize,
    dim: usize,
}

impl Fp8Tensors {
    /// Key/value heads per token (each with its own scale).
    pub fn heads(&self) -> usize {
        self.heads
    }

    /// Values per head.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The same pool with its codes under another shape of the same rows (`[pages, P, W]` or
    /// `[pages·P, W]`); the scales keep theirs.
    pub fn reshaped(&self, shape: &[usize]) -> Result<Fp8Tensors, String> {
        let pool = Fp8Tensors {
            codes: self.codes.reshaped(shape)?,
            scales: self.scales.clone(),
            heads: self.heads,
            dim: self.dim,
        };
        pool.check()?;
        Ok(pool)
    }

    /// Tokens per page (from the scales: the codes may be viewed `[pages·P, W]`).
    pub fn page_size(&self) -> usize {
        self.scales.shape().get(2).copied().unwrap_or(0)
    }

    /// Checks that the codes are `[pages, P, heads·dim]` (or `[pages·P, heads·dim]`) and the scales
    /// `[pages, heads, P]`; the error says what is what.
    pub fn check(&self) -> Result<(), String> {
        let (cs, ss) = (self.codes.shape(), self.scales.shape());
        let width = self.heads * self.dim;
        // A paged view must page as the scales do (the decode kernels take P from the codes).
        let paged_ok = cs.len() != 3 || (ss.len() == 3 && cs[0] == ss[0] && cs[1] == ss[2]);
        if ss.len() != 3
            || ss[1] != self.heads
            || self.codes.rows() != ss[0] * ss[2]
            || self.codes.cols() != width
            || !paged_ok
        {
            return Err(format!(
                "codes {cs:?} and scales {ss:?} are not [pages, P, {width}] and [pages, {}, P]",
                self.heads
            ));
        }
        Ok(())
    }

    /// Quantises `pool [pages, P, heads·dim]`; errors name what does not fit.
    pub fn quantize<T: Elem>(pool: &Tensor<T>, heads: usize, dim: usize) -> Result<Self, String> {
        let shape = pool.shape().to_vec();
        let [pages, page_size, _] = shape[..] else {
            return Err(format!(
                "FP8 KV pool: expected [pages, page_size, heads·dim], got {shape:?}"
            ));
        };
        let scale_shape = [pages, heads, page_size];
        let (codes, scales) = match pool.to_vec() {
            Some(v) => {
                let q = quantize_per_token(&v, page_size, heads, dim)?;
                (
                    Tensor::from_e4m3_codes(&shape, &q.codes)?,
                    Tensor::from_f32(&scale_shape, &q.scales)?,
                )
            }
            None => (Tensor::shape_only(&shape), Tensor::shape_only(&scale_shape)),
        };
        Ok(Fp8Tensors {
            codes,
            scales,
            heads,
            dim,
        })
    }

    /// A pool of `pages` pages of `page_size` tokens whose every code and scale reads NaN until an
    /// append writes it ([`kv_cache_append_fp8()`]), or (`shape_only`) one without data, for
    /// cost-only runs.
    pub fn empty(
        pages: usize,
        page_size: usize,
        heads: usize,
        dim: usize,
        shape_only: bool,
    ) -> Self {
        let (shape, scale_shape) = ([pages, page_size, heads * dim], [pages, heads, page_size]);
        let (codes, scales) = if shape_only {
            (Tensor::shape_only(&shape), Tensor::shape_only(&scale_shape))
        } else {
            (Tensor::poisoned(&shape), Tensor::poisoned(&scale_shape))
        };
        Fp8Tensors {
            codes,
            scales,
            heads,
            dim,
        }
    }

    /// The scales of a one-head pool viewed `[pages, P, 1]` (the same memory as `[pages, 1, P]`):
    /// one row per token, which the sparse kernels gather with the codes' rows
    /// ([`sparse_mla_fp8()`]). Errors for a pool of several heads.
    pub fn token_scales(&self) -> Result<Tensor<f32>, String> {
        let ss = self.scales.shape();
        if self.heads != 1 || ss.len() != 3 {
            return Err(format!(
                "per-token scale rows need a one-head pool, not scales {ss:?} of {} heads",
                self.heads
            ));
        }
        self.scales.reshaped(&[ss[0], ss[2], 1])
    }

    /// The values the cache stands for (`decode(code) · scale`, `[pages, P, heads·dim]`); empty
    /// for shape-only tensors.
    pub fn dequantized(&self) -> Vec<f32> {
        match (self.codes.to_vec(), self.scales.to_vec()) {
            (Some(c), Some(s)) => {
                // Pages from the scales: the codes may be viewed `[pages·P, W]`.
                let page_size = self.scales.shape()[2];
                dequantize(&c, &s, page_size, self.heads, self.dim)
            }
            _ => Vec::new(),
        }
    }
}

/// `value · scale` per (token, head): `values [pages, P, heads·dim]` (decoded E4M3),
/// `scales [pages, heads, P]`.
fn dequantize(
    values: &[f32],
    scales: &[f32],
    page_size: usize,
    heads: usize,
    dim: usize,
) -> Vec<f32> {
    let row = heads * dim;
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let (tok, col) = (i / row, i % row);
            let (page, slot, head) = (tok / page_size, tok % page_size, col / dim);
            v * scales[(page * heads + head) * page_size + slot]
        })
        .collect()
}

/// Split-KV paged decode over FP8 pools (see the module doc): as
/// [`super::decode::paged_decode_split`] (run-time head dims and page size, covering tiles), with
/// `k_scale`/`v_scale [pages, Hkv, page]`.
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
pub fn paged_decode_split_fp8<T: Float>(
    q: &Tensor<T>,
    k_pool: &Tensor<fp8e4m3>,
    v_pool: &Tensor<fp8e4m3>,
    k_scale: &Tensor<f32>,
    v_scale: &Tensor<f32>,
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
        let limit = usize::min(ctx_len, (p + 1) * page_size);
        // Rows (and scales) of the last page past the context are never read: see
        // `paged_decode_split`.
        let valid = limit - p * page_size;
        let (kp, vp) = (
            kh.at(page).rows_clipped(0, valid),
            vh.at(page).rows_clipped(0, valid),
        );
        let (ksp, vsp) = (
            k_scale.at(page).cols_clipped(0, valid),
            v_scale.at(page).cols_clipped(0, valid),
        );
        for kb in (0..valid).step_by(BK) {
            let tk = load_async::<BK, BD>(&kp, kb, 0);
            let tv = load_async::<BK, BDV>(&vp, kb, 0);
            let ks = load_async::<1, BK>(&ksp, kvh, kb);
            let vs = load_async::<1, BK>(&vsp, kvh, kb);
            let mut s = zeros::<f32, BH, BK>();
            mma_bt(&mut s, &tq, &cast::<T>(&tk));
            let s = mask_keys(
                &scale(&mul_row(&s, &ks), sm_scale),
                0,
                p * page_size + kb,
                limit,
                false,
            );
            let pr = online_softmax_step(&s, &mut m, &mut l, &mut acc);
            mma(&mut acc, &cast::<T>(&mul_row(&pr, &vs)), &cast::<T>(&tv));
        }
    }
    store_split_partials(o_part, lse_part, kvh, r0, &m, &l, &acc);
}

/// Batched GQA decode over FP8 pools: [`super::decode::paged_decode_gqa_batch()`] (one decode
/// token of each of `S` sequences, each through its own block-table row and length, sliding
/// windows and attention sinks in the kernel) with the key and value pools as E4M3 codes
/// `k_pool [pages, P, Hkv·D]`, `v_pool [pages, P, Hkv·DV]` and one f32 scale per (token,
/// key/value head), `k_scale`/`v_scale [pages, Hkv, P]` (as [`kv_cache_append_fp8()`] writes
/// them). Each block's codes convert to the compute dtype `T` on chip; key scales multiply the
/// score columns, value scales the probability columns, as in [`paged_decode_split_fp8()`]. Half
/// the cache bytes of a bf16 pool per step, for one conversion per key and value block.
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
pub fn paged_decode_gqa_batch_fp8<Q: Float, T: Float>(
    q: &Tensor<Q>,
    k_pool: &Tensor<fp8e4m3>,
    v_pool: &Tensor<fp8e4m3>,
    k_scale: &Tensor<f32>,
    v_scale: &Tensor<f32>,
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
    let tq = cast::<T>(&load_async::<BH, BD>(&q.at(row), r0, 0));
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
        // No pages in this split: see `paged_decode_gqa_batch`.
        let split = program_id(1);
        store(&o_part.at(split).at(row), r0, 0, &acc);
        store(&lse_part.at(split).at(row), r0, 0, &m);
    } else {
        let mut idx = load::<1, 64>(&table, 0, p0);
        for p in p0..p1 {
            let (page, limit, valid, kb0) =
                gqa_page_at::<BK>(&table, &mut idx, p, p0, first_page, ctx_len, page_size, w0);
            let (kp, vp) = (
                kh.at(page).rows_clipped(0, valid),
                vh.at(page).rows_clipped(0, valid),
            );
            let (ksp, vsp) = (
                k_scale.at(page).cols_clipped(0, valid),
                v_scale.at(page).cols_clipped(0, valid),
            );
            for kb in (kb0..valid).step_by(BK) {
                let tk = load_async::<BK, BD>(&kp, kb, 0);
                let tv = load_async::<BK, BDV>(&vp, kb, 0);
                let ks = load_async::<1, BK>(&ksp, kvh, kb);
                let vs = load_async::<1, BK>(&vsp, kvh, kb);
                let mut s = zeros::<f32, BH, BK>();
                mma_bt(&mut s, &tq, &cast::<T>(&tk));
                let s = mask_decode_keys(
                    &scale(&mul_row(&s, &ks), sm_scale),
                    p * page_size + kb,
                    limit,
                    window,
                    w0,
                );
                let pr = online_softmax_step(&s, &mut m, &mut l, &mut acc);
                mma(&mut acc, &cast::<T>(&mul_row(&pr, &vs)), &cast::<T>(&tv));
            }
        }
        store_split_partials(o_part, lse_part, row, r0, &m, &l, &acc);
    }
}

/// MLA's absorbed decode over an FP8 latent cache: [`super::decode::paged_decode_latent()`]
/// (batched, one latent head, each latent row read once, pipelined the same way) with the pool as
/// E4M3 codes `kv_codes [pages, P, D]` and one f32 scale per token, `kv_scales [pages, 1, P]`
/// (as [`kv_cache_append_fp8()`] writes them, heads = 1). Each key block's codes convert to the
/// compute dtype `T` on chip (exact: every E4M3 value is a bf16), as FlashMLA's FP8 decode
/// dequantises in registers; the token scales multiply the score columns before the softmax and
/// the probability columns before the value product, so no dequantised value is ever rounded.
/// Half the bytes of a bf16 cache per step, for one vector-unit conversion per key block.
#[kernel(
    grid = (q.shape()[0] * cdiv(q.shape()[1], BH), o_part.shape()[0]),
    tunable(BH = [16, 64, 32], BK = [64, 16, 32], BD = [576, 128, 256, 512]),
    helpers(online_softmax_step, split_rows, split_pages, store_split_partials, latent_block_at)
)]
// `is_multiple_of` is not in the DSL's method subset; `% 64 == 0` is.
#[allow(clippy::too_many_arguments, clippy::manual_is_multiple_of)]
pub fn paged_decode_latent_fp8<Q: Float, T: Float>(
    q: &Tensor<Q>,
    kv_codes: &Tensor<fp8e4m3>,
    kv_scales: &Tensor<f32>,
    block_tables: &Tensor<i32>,
    ctx_lens: &Tensor<i32>,
    o_part: &Tensor<f32>,
    lse_part: &Tensor<f32>,
    max_ctx: usize,
    sm_scale: f32,
) {
    let (d, dv, page_size) = (q.shape()[2], o_part.shape()[3], kv_codes.shape()[1]);
    require(
        d <= BD && dv <= d,
        "a BD tile covering the latent dim, values no wider than keys \
         (decode_latent_config picks a covering tile)",
    );
    let (seq, r0) = split_rows::<BH>(q.shape()[1]);
    let tq = cast::<T>(&load_async::<BH, BD>(&q.at(seq), r0, 0));
    let ctx_len = load_index(ctx_lens, seq, max_ctx);
    let (p0, p1) = split_pages(0, ctx_len, page_size);
    let table = block_tables.at(seq);
    let first_page = seq * block_tables.cols();
    let kh = kv_codes.cols_clipped(0, d);
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
        // Block-table entries 64 pages at a time, as in `paged_decode_latent`.
        let mut idx = load::<1, 64>(&table, 0, p0);
        let (page0, kb0, valid0) = latent_block_at::<BK>(
            &table, &mut idx, 0, blocks, p0, p1, per_page, first_page, ctx_len, page_size,
        );
        let tk = load_async::<BK, BD>(&kh.at(page0).rows_clipped(0, valid0), kb0, 0);
        let mut ks = load_async::<1, BK>(&kv_scales.at(page0).cols_clipped(0, valid0), 0, kb0);
        let (page1, kb1, valid1) = latent_block_at::<BK>(
            &table, &mut idx, 1, blocks, p0, p1, per_page, first_page, ctx_len, page_size,
        );
        let mut tk1 = load_async::<BK, BD>(&kh.at(page1).rows_clipped(0, valid1), kb1, 0);
        let mut ks1 = load_async::<1, BK>(&kv_scales.at(page1).cols_clipped(0, valid1), 0, kb1);
        // Codes convert when their block's scores are due, not as they are requested: a
        // conversion waits for its tile, and the block two ahead must stay in flight.
        let mut tkc = cast::<T>(&tk);
        let mut s = zeros::<f32, BH, BK>();
        mma_bt(&mut s, &tq, &tkc);
        for b in 0..blocks {
            let p = p0 + b / per_page;
            let kb = (b % per_page) * BK;
            // Block b + 1's scores first: the matrix unit runs them during this block's softmax.
            // (The last block converts the empty tile past the split too: one conversion more
            // per program, as a kernel without a conditional tile would pay.)
            let tk1c = cast::<T>(&tk1);
            let mut s_next = zeros::<f32, BH, BK>();
            if b + 1 < blocks {
                mma_bt(&mut s_next, &tq, &tk1c);
            }
            let (page2, kb2, valid2) = latent_block_at::<BK>(
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
            let tk2 = load_async::<BK, BD>(&kh.at(page2).rows_clipped(0, valid2), kb2, 0);
            let ks2 = load_async::<1, BK>(&kv_scales.at(page2).cols_clipped(0, valid2), 0, kb2);
            let limit = usize::min(ctx_len, (p + 1) * page_size);
            let sc = mask_keys(
                &scale(&mul_row(&s, &ks), sm_scale),
                0,
                p * page_size + kb,
                limit,
                false,
            );
            let pr = online_softmax_step(&sc, &mut m, &mut l, &mut acc);
            // Σ_t p_t·(σ_t c_t) = Σ_t (p_t σ_t)·c_t: the codes' tile is the value tile.
            mma(&mut acc, &cast::<T>(&mul_row(&pr, &ks)), &tkc);
            s = s_next;
            tkc = tk1c;
            tk1 = tk2;
            ks = ks1;
            ks1 = ks2;
        }
        store_split_partials(o_part, lse_part, seq, r0, &m, &l, &acc);
    }
}

/// Attention of one query tile `tq` (`BH` heads, already in `T`) over the first `count` latent
/// rows of its selection `sel`, gathered `BK` at a time through `block_table` from an FP8 pool:
/// the codes (`codes [pages, P, d]`, converted to `T` on chip; the key tile is the value tile) and
/// their tokens' scales (`scales [pages, P, 1]`, one per token, gathered alongside and turned into
/// a row), which multiply the score columns and the probability columns as in
/// [`paged_decode_latent_fp8()`]. Returns the normalised f32 output over all `BD` columns.
#[kernel(helper, helpers(online_softmax_step))]
#[allow(clippy::too_many_arguments)]
pub fn attend_selection_fp8<T: Float, const BH: usize, const BK: usize, const BD: usize>(
    tq: &Tile<T, BH, BD>,
    codes: &Tensor<fp8e4m3>,
    scales: &Tensor<f32>,
    block_table: &Tensor<i32>,
    sel: &Tensor<i32>,
    count: usize,
    sm_scale: f32,
) -> Tile<f32, BH, BD> {
    let mut m = full::<f32, BH, 1>(f32::NEG_INFINITY);
    let mut l = zeros::<f32, BH, 1>();
    let mut acc = zeros::<f32, BH, BD>();
    for i0 in (0..count).step_by(BK) {
        let tk = cast::<T>(&gather_rows::<BK, BD>(
            codes,
            block_table,
            sel,
            i0,
            count,
            0,
        ));
        // Rows past `count` gather scale 0 and their scores are masked below.
        let ks = transpose(&gather_rows::<BK, 1>(
            scales,
            block_table,
            sel,
            i0,
            count,
            0,
        ));
        let mut s = zeros::<f32, BH, BK>();
        mma_bt(&mut s, tq, &tk);
        let s = mask_keys(&scale(&mul_row(&s, &ks), sm_scale), 0, i0, count, false);
        let pr = online_softmax_step(&s, &mut m, &mut l, &mut acc);
        // Σ_t p_t·(σ_t c_t) = Σ_t (p_t σ_t)·c_t: the codes' tile is the value tile.
        mma(&mut acc, &cast::<T>(&mul_row(&pr, &ks)), &tk);
    }
    div_col(&acc, &l)
}

/// DeepSeek-V3.2 sparse MLA over an FP8 latent cache (a prompt chunk's queries, or one decode
/// token): [`super::sparse::sparse_mla()`] with the pool as E4M3 codes `[pages, P, d]` and one
/// f32 scale per token (`scales [pages, P, 1]`, [`Fp8Tensors::token_scales`]), read by
/// [`attend_selection_fp8()`]. Half the gathered bytes of a bf16 pool, for one conversion per
/// gathered tile.
#[kernel(
    grid = (cdiv(q.shape()[1], BH), q.shape()[0]),
    tunable(BH = [64, 16, 128], BK = [64, 32], BD = [576, 16, 32, 64, 128, 256], BDV = [512, 16, 32, 64, 128, 256]),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(attend_selection_fp8)
)]
#[allow(clippy::too_many_arguments)]
pub fn sparse_mla_fp8<Q: Float, T: Float>(
    q: &Tensor<Q>,
    codes: &Tensor<fp8e4m3>,
    scales: &Tensor<f32>,
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
    let tq = cast::<T>(&load::<BH, BD>(&q.at(t), r, 0));
    let out = attend_selection_fp8::<T, BH, BK, BD>(
        &tq,
        codes,
        scales,
        block_table,
        &selected.at(t),
        count,
        sm_scale,
    );
    store(&o.at(t), r, 0, &cast::<Q>(&out));
}

/// Batched DSA decode over an FP8 latent cache: [`super::sparse::sparse_mla_batch()`] (one token
/// of each of `S` sequences, each through its own block table, length and selection) reading
/// codes and per-token scales as [`sparse_mla_fp8()`] does.
#[kernel(
    grid = (cdiv(q.shape()[1], BH), q.shape()[0]),
    tunable(BH = [64, 16, 128], BK = [64, 32], BD = [576, 16, 32, 64, 128, 256], BDV = [512, 16, 32, 64, 128, 256]),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(attend_selection_fp8)
)]
#[allow(clippy::too_many_arguments)]
pub fn sparse_mla_batch_fp8<Q: Float, T: Float>(
    q: &Tensor<Q>,
    codes: &Tensor<fp8e4m3>,
    scales: &Tensor<f32>,
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
    let out = attend_selection_fp8::<T, BH, BK, BD>(
        &tq,
        codes,
        scales,
        &block_tables.at(s),
        &selected.at(s),
        count,
        sm_scale,
    );
    store(&o.at(s), r, 0, &cast::<Q>(&out));
}

/// DSA lightning indexer for one query token of each of `S` sequences over FP8 keys:
/// [`super::sparse::indexer_decode_batch()`] with the key pool as E4M3 codes
/// `[pages, P, DI']` and one f32 scale per token (`scales [pages, 1, P]`, a page's scales one
/// row). The codes convert to `T` on chip; a key's positive scale commutes with the ReLU, so it
/// multiplies the key's finished score (`Σ_j w_j·ReLU(σ q_j·c) = σ·Σ_j w_j·ReLU(q_j·c)`), as
/// DeepSeek-V3.2's FP8 indexer applies its key scales.
#[kernel(grid = (ctx_lens.len(), cdiv(max_ctx, codes.shape()[1])), tunable(HI = [64, 16, 32, 128], DI = [128, 32, 64, 256], BK = [64, 16, 128]))]
#[allow(clippy::too_many_arguments)]
pub fn indexer_decode_batch_fp8<Q: Float, T: Float>(
    q_idx: &Tensor<Q>,
    w: &Tensor<f32>,
    codes: &Tensor<fp8e4m3>,
    scales: &Tensor<f32>,
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
    let page_size = codes.shape()[1];
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
        let keys = codes.at(page);
        for kb in (0..page_size).step_by(BK) {
            let tk = load_async::<BK, DI>(&keys, kb, 0);
            let ks = load_async::<1, BK>(&scales.at(page), 0, kb);
            let mut sc = zeros::<f32, HI, BK>();
            mma_bt(&mut sc, &tq, &cast::<T>(&tk));
            let act = relu(&scale(&sc, idx_scale));
            let mut score = zeros::<f32, 1, BK>();
            mma_at(&mut score, &tw, &act);
            store(
                &out,
                0,
                kb,
                &mask_keys(&mul(&score, &ks), 0, p * page_size + kb, ctx_len, false),
            );
        }
    }
}

/// DSA lightning indexer for a block of query tokens (prefill) over FP8 keys:
/// [`super::sparse::indexer_prefill()`] with the key pool as E4M3 codes `[pages, P, DI']` and
/// one f32 scale per token (`scales [pages, 1, P]`); each key tile's codes convert to `T` once
/// and serve every index head, and the keys' scales multiply the summed scores' columns, as in
/// [`indexer_decode_batch_fp8()`].
#[kernel(grid = (cdiv(q_idx.rows(), BQ), cdiv(ctx_len, codes.shape()[1])), tunable(BQ = [64, 16, 32, 128], DI = [128, 32, 64, 256], BK = [64, 16, 128]))]
#[allow(clippy::too_many_arguments)]
pub fn indexer_prefill_fp8<Q: Float, T: Float>(
    q_idx: &Tensor<Q>,
    w: &Tensor<f32>,
    codes: &Tensor<fp8e4m3>,
    scales: &Tensor<f32>,
    block_table: &Tensor<i32>,
    scores: &Tensor<f32>,
    ctx_len: usize,
    idx_scale: f32,
) {
    let t0 = program_id(0) * BQ;
    let p = program_id(1);
    let page_size = codes.shape()[1];
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
            let tk = cast::<T>(&load_async::<BK, DI>(&codes.at(page), kb, 0));
            let ks = load_async::<1, BK>(&scales.at(page), 0, kb);
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
            score = mask_keys(
                &mul_row(&acc, &ks),
                q_pos,
                p * page_size + kb,
                ctx_len,
                true,
            );
        }
        store(&out, t0, kb, &score);
    }
}

/// Quantising paged append (the writer of the FP8 pools [`paged_decode_split_fp8()`],
/// [`paged_decode_gqa_batch_fp8()`], [`paged_decode_latent_fp8()`] and the DSA kernels read): row `i` of `new [n, heads·dim]` goes to pool row
/// `slots[i]` (page `slot / P`, slot `slot % P`, as [`super::kv_append`]); each head's `dim`
/// values are stored as E4M3 codes on that row of `codes [pages, P, heads·dim]`, and their scale
/// `max(amax, AMAX_FLOOR) / 448` at `scales [page, head, slot]`, as [`quantize_per_token`] does.
/// One program per `BR` new rows of one head; the row amax is a vector-unit reduction, the codes
/// a saturating cast.
#[kernel(
    grid = (cdiv(new.rows(), BR), scales.shape()[1]),
    tunable(BR = [16, 1, 4, 64], BD = [128, 64, 256, 512, 576, 1024])
)]
pub fn kv_cache_append_fp8<S: Float>(
    new: &Tensor<S>,
    slots: &Tensor<i32>,
    codes: &Tensor<fp8e4m3>,
    scales: &Tensor<f32>,
) {
    let (r0, h) = (program_id(0) * BR, program_id(1));
    let dim = new.cols() / scales.shape()[1];
    require(
        dim <= BD,
        "the BD tile must cover a head's values (the runner picks a covering tile)",
    );
    // Pages of `P` tokens, from the scales (the codes may be viewed `[pages·P, W]`).
    let p = usize::max(scales.shape()[2], 1);
    let src = new.cols_clipped(h * dim, dim);
    let dst = codes.cols_clipped(h * dim, dim);
    for i in r0..usize::min(r0 + BR, new.rows()) {
        // Cost-only runs have no slot table: the identity mapping costs the same.
        let slot = load_index(slots, i, i);
        // Columns past the head read as 0 and change no maximum.
        let x = cast::<f32>(&load::<1, BD>(&src, i, 0));
        let amax = maximum(&row_max(&abs(&x)), &full::<f32, 1, 1>(AMAX_FLOOR));
        let sc = div(&amax, &full::<f32, 1, 1>(E4M3_MAX));
        store(&dst, slot, 0, &cast::<fp8e4m3>(&div_col(&x, &sc)));
        store(&scales.at(slot / p), h, slot % p, &sc);
    }
}

/// Runs [`kv_cache_append_fp8()`] for one sequence: quantises `new [n, heads·dim]` into token
/// positions `start..start + n` of the sequence whose pages are `block_table`, in `codes [pages,
/// P, heads·dim]` and `scales [pages, heads, P]`. Errors (`SimError::Launch`) name what does not
/// fit: every check of [`run_kv_cache_append_fp8_slots`], and of
/// [`super::kv_append::run_kv_cache_append`] (a table too short, a page outside the pool).
pub fn run_kv_cache_append_fp8<S: Float>(
    launcher: &Launcher,
    new: &Tensor<S>,
    block_table: &[usize],
    pool: &Fp8Tensors,
    start: usize,
) -> Result<Launch, SimError> {
    let meta = &kv_cache_append_fp8::META;
    pool.check().map_err(|message| SimError::Launch {
        kernel: meta.name.to_string(),
        message,
    })?;
    let page_size = pool.page_size();
    append_table(meta, new.rows(), &pool.codes, block_table, start, page_size)?;
    let slots = append_slots(block_table, start, new.rows(), page_size);
    run_kv_cache_append_fp8_slots(launcher, new, &slots, pool)
}

/// Runs [`kv_cache_append_fp8()`] with row `i` of `new [n, heads·dim]` quantised into pool row
/// `slots[i]`: the new rows of any number of sequences in one launch. Errors (`SimError::Launch`)
/// name what does not fit: codes and scales that are not `[pages, P, heads·dim]` and
/// `[pages, heads, P]`, a width that differs from the pool's, a slot count that differs from the
/// rows, a slot outside the pool, or two rows sent to one slot.
pub fn run_kv_cache_append_fp8_slots<S: Float>(
    launcher: &Launcher,
    new: &Tensor<S>,
    slots: &[usize],
    pool: &Fp8Tensors,
) -> Result<Launch, SimError> {
    let meta = &kv_cache_append_fp8::META;
    let bad = |message: String| SimError::Launch {
        kernel: meta.name.to_string(),
        message,
    };
    pool.check().map_err(bad)?;
    if new.cols() != pool.heads * pool.dim {
        return Err(bad(format!(
            "new rows {new:?} are {} wide but the pool stores {} heads × {} per token",
            new.cols(),
            pool.heads,
            pool.dim
        )));
    }
    let (codes, scales) = (&pool.codes, &pool.scales);
    let slots = device_slots(meta, new.rows(), slots, codes.rows())?;
    let config = crate::tile_choice::covering_config(
        meta,
        append_rows_config(launcher, meta, new.rows(), pool.heads),
        &[("BD", pool.dim, 1024)],
    );
    kv_cache_append_fp8::launch(launcher, &config, new, &slots, codes, scales)
}

/// Pool rows `rows[i]` of an FP8 pool (`codes [pages, P, heads·dim]`, `scales [pages, heads, P]`)
/// dequantised into row `i` of `out [n, heads·dim]` (f32): a sequence's context gathered for a
/// kernel that reads it contiguously (a prefill chunk's attention over the cached tokens). One
/// program per `BR` rows of one head; each row is its codes converted and times its scale.
#[kernel(
    grid = (cdiv(out.rows(), BR), scales.shape()[1]),
    tunable(BR = [16, 1, 4, 64], BD = [128, 64, 256, 512, 576, 1024])
)]
pub fn gather_dequant_fp8(
    rows: &Tensor<i32>,
    codes: &Tensor<fp8e4m3>,
    scales: &Tensor<f32>,
    out: &Tensor<f32>,
) {
    let (r0, h) = (program_id(0) * BR, program_id(1));
    let dim = out.cols() / scales.shape()[1];
    require(
        dim <= BD,
        "the BD tile must cover a head's values (the runner picks a covering tile)",
    );
    let p = usize::max(scales.shape()[2], 1);
    let src = codes.cols_clipped(h * dim, dim);
    let dst = out.cols_clipped(h * dim, dim);
    for i in r0..usize::min(r0 + BR, out.rows()) {
        // Cost-only runs have no row table: the identity mapping costs the same.
        let slot = load_index(rows, i, i);
        let x = load_async::<1, BD>(&src, slot, 0);
        let sc = load_async::<1, 1>(&scales.at(slot / p), h, slot % p);
        store(&dst, i, 0, &mul_col(&cast::<f32>(&x), &sc));
    }
}

/// Runs [`gather_dequant_fp8()`]: pool rows `rows` of `pool` into a fresh-written `out [n,
/// heads·dim]`. Errors (`SimError::Launch`) name a width that differs from the pool's, a row count
/// that differs from `out`'s, or a row outside the pool.
pub fn run_gather_dequant_fp8(
    launcher: &Launcher,
    pool: &Fp8Tensors,
    rows: &[usize],
    out: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let meta = &gather_dequant_fp8::META;
    let bad = |message: String| SimError::Launch {
        kernel: meta.name.to_string(),
        message,
    };
    pool.check().map_err(bad)?;
    let width = pool.heads * pool.dim;
    if out.cols() != width || out.rows() != rows.len() {
        return Err(bad(format!(
            "out {out:?} must be [{} rows, {width}] for the pool's {} heads × {}",
            rows.len(),
            pool.heads,
            pool.dim
        )));
    }
    let pool_rows = pool.codes.rows();
    let rows = device_rows(meta, rows, pool_rows, "row", |i, r| {
        format!("row {i} asks for pool row {r}, outside the pool's {pool_rows} rows")
    })?;
    // Rows spread over the cores, as the appends' (each program walks its rows in series).
    let config = crate::tile_choice::covering_config(
        meta,
        append_rows_config(launcher, meta, out.rows(), pool.heads),
        &[("BD", pool.dim, 1024)],
    );
    gather_dequant_fp8::launch(launcher, &config, &rows, &pool.codes, &pool.scales, out)
}
