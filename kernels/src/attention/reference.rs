//! # Attention references (float64)
//!
//! The semantics every attention kernel is checked against: inputs as the kernels see them (f32;
//! bf16 inputs are widened first), all arithmetic in f64, outputs in f64. Each function validates
//! its shapes and returns [`AttnRefError`] instead of panicking, because shapes come from the CLI
//! and from random test cases.
//!
//! ## Conventions (shared by every function here)
//! - **Token-major layouts**, as the reference code's `[batch, seq, heads, dim]` tensors with the
//!   batch dropped: queries `[sq, heads, d]`, keys `[skv, kv_heads, d]`, values
//!   `[skv, kv_heads, dv]`, outputs `[sq, heads, dv]`; all row-major.
//! - **Queries are the last `sq` positions of a context of `skv` tokens**: query `i` sits at
//!   position `p = skv − sq + i` and attends keys `0..=p` (causal). One-shot prefill is
//!   `sq = skv`, decode is `sq = 1`, and a prefill chunk against a cache that already holds the
//!   earlier tokens is anything in between — so "chunked prefill == one pass" is a statement about
//!   this one function.
//! - **Grouped-query heads**: query head `h` reads key/value head `h / (heads / kv_heads)`, the
//!   mapping of transformers' `repeat_kv` (`models/llama/modeling_llama.py`, also in
//!   `models/deepseek_v32/modeling_deepseek_v32.py`); `kv_heads = 1` is MQA.
//! - **Scores** are `scale · q·k`; the caller passes `scale` (usually `head_dim^-1/2`; for MLA see
//!   [`mla_softmax_scale`]). Softmax subtracts the row maximum, so large scores do not overflow.
//!
//! ## MLA (DeepSeek-V3 multi-head latent attention)
//! From DeepSeek-V3 `inference/model.py` (class `MLA`, `attn_impl` `"naive"` and `"absorb"`) and
//! DeepSeek-V3.2-Exp `inference/model.py` (class `MLA`, its "MHA prefill" and "MHA decode"
//! branches), cross-checked with transformers `models/deepseek_v3/modeling_deepseek_v3.py`:
//! - queries `q [sq, H, nope + rope]`, split `[q_nope | q_rope]` (RoPE already applied);
//! - the cache holds per token the normalised latent `c_KV [kv_lora]` and the rotated shared key
//!   `k_R [rope]`;
//! - `w_kv_b` is `kv_b_proj.weight` / `wkv_b.weight`, `[H·(nope + v), kv_lora]` viewed as
//!   `[H, nope + v, kv_lora]`: rows `0..nope` of head `h` are `W_UK,h`, the remaining `v` rows
//!   `W_UV,h`;
//! - **naive**: `k_h = [W_UK,h c_KV ; k_R]`, `v_h = W_UV,h c_KV`, ordinary attention
//!   ([`mla_naive`]);
//! - **absorbed**: `q̃_h = W_UK,hᵀ q_nope,h`, score `= (q̃_h·c_KV,s + q_rope,h·k_R,s)·τ`,
//!   `õ_h = Σ_s p_s c_KV,s`, `o_h = W_UV,h õ_h` ([`mla_absorbed`]). That is multi-query attention
//!   over the latent cache: one "key" `[c_KV ; k_R]` of `kv_lora + rope` values per token shared
//!   by all heads, whose value is its first `kv_lora` values ([`mqa_dense`]).
//!
//! ## DSA (DeepSeek-V3.2 indexed sparse attention)
//! From DeepSeek-V3.2-Exp `inference/model.py` (class `Indexer`), `inference/kernel.py`
//! (`fp8_index`: ReLU of the per-head dot products, times the per-head weight, summed over heads)
//! and transformers `models/deepseek_v32/modeling_deepseek_v32.py` (`DeepseekV32Indexer`):
//! - [`indexer_scores`]: `I(t,s) = Σ_j w(t,j) · ReLU(scale · q(t,j)·k(s))` for `s ≤ p(t)`, `−∞`
//!   after. The caller passes `w` already multiplied by `index_n_heads^-1/2` (as `weights_proj(x)
//!   · n_heads^-0.5` in both codes) and `scale = index_head_dim^-1/2` (their `softmax_scale`).
//!   DeepSeek multiplies the scale after the ReLU, transformers before: the same for a positive
//!   scale. The official FP8 quantisation and Hadamard rotation of `q` and `k` are left out (the
//!   rotation is orthogonal, so dot products are unchanged up to rounding).
//! - [`topk`] / [`select_topk`]: per query the `k = min(index_topk, p + 1)` best causal keys. The
//!   reference code uses `torch.topk`, whose order among equal scores is unspecified; here it is
//!   fixed: **higher score first, equal scores by lower key index, NaN below everything, −0 = +0**.
//! - [`mqa_sparse`] / [`mla_sparse`]: attention restricted to the selected keys, gathered — the
//!   reference code's "0 on the selection, −∞ elsewhere" mask, computed as FlashMLA's
//!   `flash_mla_sparse_fwd` does it (softmax over the gathered `[c_KV ; k_R]` rows, values = their
//!   first `kv_lora` columns).

use std::cmp::Ordering;
use std::fmt;

/// Why a reference refused its inputs: which argument, what was expected, what was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttnRefError(pub String);

impl fmt::Display for AttnRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AttnRefError {}

fn fail<T>(message: String) -> Result<T, AttnRefError> {
    Err(AttnRefError(message))
}

/// Product of `dims`, or an error naming `what` on overflow.
fn product(dims: &[usize], what: &str) -> Result<usize, AttnRefError> {
    dims.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| AttnRefError(format!("{what}: size {dims:?} overflows")))
    })
}

/// Checks that `name` holds `dims` elements (`layout` names the dimensions for the message).
fn expect_len(name: &str, got: usize, dims: &[usize], layout: &str) -> Result<(), AttnRefError> {
    let want = product(dims, name)?;
    if got != want {
        return fail(format!(
            "{name}: expected {want} values ({layout} = {dims:?}), got {got}"
        ));
    }
    Ok(())
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|v| *v as f64).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// In-place `exp(x − max) / Σ exp(x − max)`; `−∞` entries become exactly 0. The row must hold at
/// least one finite value (callers guarantee one unmasked key per query).
fn softmax_in_place(row: &mut [f64]) {
    softmax_with_sink(row, f64::NEG_INFINITY)
}

/// [`softmax_in_place`] with one more logit, `sink`, in the denominator and no output of its own
/// (gpt-oss's attention sinks: transformers appends the sink as a last column, softmaxes, and
/// drops it). A sink of −∞ is none.
fn softmax_with_sink(row: &mut [f64], sink: f64) {
    let m = row.iter().fold(sink, |m, v| m.max(*v));
    let mut z = if sink == f64::NEG_INFINITY {
        0.0
    } else {
        (sink - m).exp()
    };
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        z += *v;
    }
    for v in row.iter_mut() {
        *v /= z;
    }
}

// ---------------------------------------------------------------------------------------------
// Grouped-query attention: prefill and decode
// ---------------------------------------------------------------------------------------------

/// Shape of one causal attention call (one sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    /// Queries: the last `sq` positions of the context.
    pub sq: usize,
    /// Context length (keys and values), `≥ sq`.
    pub skv: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; divides `heads` (`= heads`: MHA, `1`: MQA).
    pub kv_heads: usize,
    /// Query/key head dimension.
    pub head_dim: usize,
    /// Value (and output) head dimension.
    pub v_head_dim: usize,
}

impl AttnShape {
    /// Decode: one query, the newest token, attending to a context of `ctx` tokens.
    pub fn decode(
        ctx: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
    ) -> AttnShape {
        AttnShape {
            sq: 1,
            skv: ctx,
            heads,
            kv_heads,
            head_dim,
            v_head_dim,
        }
    }

    /// Checks the shape: heads and dims non-zero, `kv_heads` divides `heads`, `sq ≤ skv`.
    pub fn validate(&self) -> Result<(), AttnRefError> {
        if self.heads == 0 || self.kv_heads == 0 || self.head_dim == 0 || self.v_head_dim == 0 {
            return fail(format!(
                "attention shape {self:?}: heads and head dims must be ≥ 1"
            ));
        }
        // Written without `%` so clippy's `is_multiple_of` hint (Rust 1.87) does not apply: the
        // workspace declares rust-version 1.85.
        if self.heads / self.kv_heads * self.kv_heads != self.heads {
            return fail(format!(
                "attention shape: kv_heads {} must divide heads {} (each group of heads shares one \
                 key/value head)",
                self.kv_heads, self.heads
            ));
        }
        if self.sq > self.skv {
            return fail(format!(
                "attention shape: {} queries but a context of only {} tokens (queries are the last \
                 sq positions of the context, so sq ≤ skv)",
                self.sq, self.skv
            ));
        }
        Ok(())
    }

    /// Position in the context of query `i`: `skv − sq + i`.
    pub fn query_position(&self, i: usize) -> usize {
        self.skv - self.sq + i
    }

    /// Key/value head read by query head `h`: `h / (heads / kv_heads)`.
    pub fn kv_head(&self, h: usize) -> usize {
        h / (self.heads / self.kv_heads)
    }

    fn check_inputs(&self, q: usize, k: usize, v: usize) -> Result<(), AttnRefError> {
        self.validate()?;
        expect_len(
            "q",
            q,
            &[self.sq, self.heads, self.head_dim],
            "[sq, heads, head_dim]",
        )?;
        expect_len(
            "k",
            k,
            &[self.skv, self.kv_heads, self.head_dim],
            "[skv, kv_heads, head_dim]",
        )?;
        expect_len(
            "v",
            v,
            &[self.skv, self.kv_heads, self.v_head_dim],
            "[skv, kv_heads, v_head_dim]",
        )
    }
}

/// Dense causal attention in the mask formulation of the reference code (`scores + mask`, then a
/// softmax over the whole row): masked keys get `−∞` and weight exactly 0; with `window > 0` the
/// keys `window` or more positions before the query are masked too. Shape already checked.
fn dense_causal(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    s: &AttnShape,
    scale: f64,
    window: usize,
    sinks: &[f32],
) -> Vec<f64> {
    let (d, dv, hk) = (s.head_dim, s.v_head_dim, s.kv_heads);
    let mut out = vec![0.0f64; s.sq * s.heads * dv];
    let mut p = vec![0.0f64; s.skv];
    for i in 0..s.sq {
        let pos = s.query_position(i);
        for h in 0..s.heads {
            let g = s.kv_head(h);
            let qv = &q[(i * s.heads + h) * d..][..d];
            for (j, pj) in p.iter_mut().enumerate() {
                *pj = if j <= pos && (window == 0 || j + window > pos) {
                    dot(qv, &k[(j * hk + g) * d..][..d]) * scale
                } else {
                    f64::NEG_INFINITY
                };
            }
            softmax_with_sink(
                &mut p,
                sinks.get(h).map_or(f64::NEG_INFINITY, |v| *v as f64),
            );
            let o = &mut out[(i * s.heads + h) * dv..][..dv];
            for (j, pj) in p.iter().enumerate() {
                for (oc, vc) in o.iter_mut().zip(&v[(j * hk + g) * dv..][..dv]) {
                    *oc += pj * vc;
                }
            }
        }
    }
    out
}

/// Causal grouped-query attention for prefill (or a prefill chunk): `q [sq, heads, head_dim]`
/// against `k [skv, kv_heads, head_dim]`, `v [skv, kv_heads, v_head_dim]`, where query `i` sits at
/// position `skv − sq + i` and sees keys `0..=skv − sq + i`. Returns `o [sq, heads, v_head_dim]`.
pub fn attention_prefill(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    attention_prefill_sinks(q, k, v, shape, scale, 0, &[])
}

/// [`attention_prefill`] over a sliding window (transformers' `sliding_window`): query `i` at
/// position `pos` sees keys `pos − window + 1 ..= pos` (all of `0..=pos` when `window` is 0),
/// with attention sinks (gpt-oss): head `h`'s softmax has one more logit, `sinks[h]`, in its
/// denominator and no value of its own, so a query can attend to "nothing". `sinks` holds one
/// logit per query head, or is empty for none.
pub fn attention_prefill_sinks(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    scale: f64,
    window: usize,
    sinks: &[f32],
) -> Result<Vec<f64>, AttnRefError> {
    shape.check_inputs(q.len(), k.len(), v.len())?;
    if !sinks.is_empty() && sinks.len() != shape.heads {
        return fail(format!(
            "attention sinks: one logit per query head ({}), got {}",
            shape.heads,
            sinks.len()
        ));
    }
    Ok(dense_causal(
        &widen(q),
        &widen(k),
        &widen(v),
        &shape,
        scale,
        window,
        sinks,
    ))
}

/// Decode attention: one query `q [heads, head_dim]` (the newest token) over the whole context
/// `k [ctx, kv_heads, head_dim]`, `v [ctx, kv_heads, v_head_dim]`. `shape.sq` must be 1 (see
/// [`AttnShape::decode`]). Returns `o [heads, v_head_dim]`; equal to the last row of
/// [`attention_prefill`] over the same context.
pub fn attention_decode(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: AttnShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    one_query(&shape)?;
    attention_prefill(q, k, v, shape, scale)
}

/// Decode shapes hold one query per sequence.
fn one_query(shape: &AttnShape) -> Result<(), AttnRefError> {
    if shape.sq != 1 {
        return fail(format!(
            "attention_decode: one query per sequence, got sq = {} (use attention_prefill)",
            shape.sq
        ));
    }
    Ok(())
}

/// Gathers `tokens` rows of `row_len` values from a paged pool laid out `[pages, page_size,
/// row_len]`: token `t` is row `block_table[t / page_size] · page_size + t % page_size`. Returns
/// the contiguous `[tokens, row_len]` rows — what a paged kernel reads, in logical order.
pub fn gather_pages(
    pool: &[f32],
    row_len: usize,
    page_size: usize,
    block_table: &[usize],
    tokens: usize,
) -> Result<Vec<f32>, AttnRefError> {
    if page_size == 0 || row_len == 0 {
        return fail("gather_pages: page_size and row_len must be ≥ 1".to_string());
    }
    let page_len = product(&[page_size, row_len], "page")?;
    let pages = pool.len() / page_len;
    if pages * page_len != pool.len() {
        return fail(format!(
            "gather_pages: pool of {} values is not a whole number of pages of {page_size} × \
             {row_len}",
            pool.len()
        ));
    }
    let need = tokens.div_ceil(page_size);
    if block_table.len() < need {
        return fail(format!(
            "gather_pages: {tokens} tokens need {need} block-table entries, got {}",
            block_table.len()
        ));
    }
    let mut out = Vec::with_capacity(tokens.saturating_mul(row_len));
    for t in 0..tokens {
        let page = block_table[t / page_size];
        if page >= pages {
            return fail(format!(
                "gather_pages: block table entry {} is page {page}, but the pool has {pages} pages",
                t / page_size
            ));
        }
        let row = page * page_size + t % page_size;
        out.extend_from_slice(&pool[row * row_len..][..row_len]);
    }
    Ok(out)
}

/// Decode attention over a paged cache: `k_pool [pages, page_size, kv_heads, head_dim]`,
/// `v_pool [pages, page_size, kv_heads, v_head_dim]`, the sequence's `block_table` and its context
/// length `shape.skv`. Defined as [`attention_decode`] over the gathered rows, so a paged kernel
/// and a contiguous one have the same reference.
pub fn attention_decode_paged(
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    block_table: &[usize],
    page_size: usize,
    shape: AttnShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    attention_decode_paged_sinks(
        q,
        k_pool,
        v_pool,
        block_table,
        page_size,
        shape,
        scale,
        0,
        &[],
    )
}

/// [`attention_decode_paged`] over a sliding window (the query sees its last `window` keys, all
/// of them when `window` is 0) with attention sinks (see [`attention_prefill_sinks`]; empty for
/// none).
#[allow(clippy::too_many_arguments)]
pub fn attention_decode_paged_sinks(
    q: &[f32],
    k_pool: &[f32],
    v_pool: &[f32],
    block_table: &[usize],
    page_size: usize,
    shape: AttnShape,
    scale: f64,
    window: usize,
    sinks: &[f32],
) -> Result<Vec<f64>, AttnRefError> {
    shape.validate()?;
    one_query(&shape)?;
    let k_row = product(&[shape.kv_heads, shape.head_dim], "k row")?;
    let v_row = product(&[shape.kv_heads, shape.v_head_dim], "v row")?;
    let k = gather_pages(k_pool, k_row, page_size, block_table, shape.skv)?;
    let v = gather_pages(v_pool, v_row, page_size, block_table, shape.skv)?;
    attention_prefill_sinks(q, &k, &v, shape, scale, window, sinks)
}

// ---------------------------------------------------------------------------------------------
// Multi-query attention over a latent cache (dense and sparse)
// ---------------------------------------------------------------------------------------------

/// Shape of multi-query attention over a latent cache: every head reads the same `kv` row of `dk`
/// values as its key and the row's first `dv` values as its value (MLA's absorbed form:
/// `dk = kv_lora + rope`, `dv = kv_lora`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MqaShape {
    /// Queries: the last `sq` positions of the context.
    pub sq: usize,
    /// Context length, `≥ sq`.
    pub skv: usize,
    /// Query heads.
    pub heads: usize,
    /// Key dimension (values per cached token).
    pub dk: usize,
    /// Value dimension: the first `dv ≤ dk` values of each cached token.
    pub dv: usize,
}

impl MqaShape {
    /// Checks the shape: non-zero heads and dims, `dv ≤ dk`, `sq ≤ skv`.
    pub fn validate(&self) -> Result<(), AttnRefError> {
        if self.heads == 0 || self.dk == 0 || self.dv == 0 {
            return fail(format!(
                "latent MQA shape {self:?}: heads, dk and dv must be ≥ 1"
            ));
        }
        if self.dv > self.dk {
            return fail(format!(
                "latent MQA shape: dv {} > dk {} (the value is the first dv values of each cached \
                 token)",
                self.dv, self.dk
            ));
        }
        if self.sq > self.skv {
            return fail(format!(
                "latent MQA shape: {} queries but a context of only {} tokens (sq ≤ skv)",
                self.sq, self.skv
            ));
        }
        Ok(())
    }

    /// Position in the context of query `i`: `skv − sq + i`.
    pub fn query_position(&self, i: usize) -> usize {
        self.skv - self.sq + i
    }

    fn check_inputs(&self, q: usize, kv: usize) -> Result<(), AttnRefError> {
        self.validate()?;
        expect_len("q", q, &[self.sq, self.heads, self.dk], "[sq, heads, dk]")?;
        expect_len("kv", kv, &[self.skv, self.dk], "[skv, dk]")
    }

    /// Checks a selection: one non-empty list per query, each index causal (`≤` the query's
    /// position), none repeated — the reference code turns the selection into a 0/−∞ mask, where a
    /// repeated index cannot count twice, so a repeated index here is an error, not a weight.
    fn check_indices(&self, indices: &[Vec<usize>]) -> Result<(), AttnRefError> {
        if indices.len() != self.sq {
            return fail(format!(
                "indices: one list per query expected ({}), got {}",
                self.sq,
                indices.len()
            ));
        }
        let mut seen = vec![usize::MAX; self.skv];
        for (i, list) in indices.iter().enumerate() {
            let pos = self.query_position(i);
            if list.is_empty() {
                return fail(format!(
                    "indices: query {i} selects no key (top-k must be ≥ 1)"
                ));
            }
            for &s in list {
                if s > pos {
                    return fail(format!(
                        "indices: query {i} (position {pos}) selects key {s}, which is in its \
                         future (or past the context of {})",
                        self.skv
                    ));
                }
                if seen[s] == i {
                    return fail(format!("indices: query {i} selects key {s} twice"));
                }
                seen[s] = i;
            }
        }
        Ok(())
    }
}

/// Dense causal latent MQA on f64 inputs (shape already checked): the GQA reference with one
/// key/value head whose value is the first `dv` columns of the key.
fn mqa_dense_f64(q: &[f64], kv: &[f64], s: &MqaShape, scale: f64) -> Vec<f64> {
    let v: Vec<f64> = kv
        .chunks_exact(s.dk)
        .flat_map(|row| row[..s.dv].iter().copied())
        .collect();
    let shape = AttnShape {
        sq: s.sq,
        skv: s.skv,
        heads: s.heads,
        kv_heads: 1,
        head_dim: s.dk,
        v_head_dim: s.dv,
    };
    dense_causal(q, kv, &v, &shape, scale, 0, &[])
}

/// Sparse latent MQA on f64 inputs (shape and indices already checked): for each query, a softmax
/// over the gathered selected rows only, then the weighted sum of their first `dv` values.
fn mqa_sparse_f64(
    q: &[f64],
    kv: &[f64],
    indices: &[Vec<usize>],
    s: &MqaShape,
    scale: f64,
) -> Vec<f64> {
    let (dk, dv) = (s.dk, s.dv);
    let mut out = vec![0.0f64; s.sq * s.heads * dv];
    for (i, sel) in indices.iter().enumerate() {
        let rows: Vec<&[f64]> = sel.iter().map(|&j| &kv[j * dk..][..dk]).collect();
        for h in 0..s.heads {
            let qv = &q[(i * s.heads + h) * dk..][..dk];
            let mut p: Vec<f64> = rows.iter().map(|r| dot(qv, r) * scale).collect();
            softmax_in_place(&mut p);
            let o = &mut out[(i * s.heads + h) * dv..][..dv];
            for (pj, r) in p.iter().zip(&rows) {
                for (oc, vc) in o.iter_mut().zip(&r[..dv]) {
                    *oc += pj * vc;
                }
            }
        }
    }
    out
}

/// Dense causal multi-query attention over a latent cache: `q [sq, heads, dk]`, `kv [skv, dk]`;
/// every head's value is the first `dv` values of each row. Returns `o [sq, heads, dv]`.
pub fn mqa_dense(
    q: &[f32],
    kv: &[f32],
    shape: MqaShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    shape.check_inputs(q.len(), kv.len())?;
    Ok(mqa_dense_f64(&widen(q), &widen(kv), &shape, scale))
}

/// Sparse multi-query attention over a latent cache: like [`mqa_dense`], but query `i` attends
/// only the keys in `indices[i]` (gathered, in any order; each causal and distinct — checked).
/// With every causal key selected it equals [`mqa_dense`]. Returns `o [sq, heads, dv]`.
pub fn mqa_sparse(
    q: &[f32],
    kv: &[f32],
    indices: &[Vec<usize>],
    shape: MqaShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    shape.check_inputs(q.len(), kv.len())?;
    shape.check_indices(indices)?;
    Ok(mqa_sparse_f64(
        &widen(q),
        &widen(kv),
        indices,
        &shape,
        scale,
    ))
}

// ---------------------------------------------------------------------------------------------
// MLA
// ---------------------------------------------------------------------------------------------

/// Shape of one MLA call (one sequence), in DeepSeek-V3's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlaShape {
    /// Queries: the last `sq` positions of the context.
    pub sq: usize,
    /// Context length, `≥ sq`.
    pub skv: usize,
    /// Attention heads (`n_heads`, 128 in DeepSeek-V3).
    pub heads: usize,
    /// Latent width `kv_lora_rank` (512).
    pub kv_lora_rank: usize,
    /// Per-head query/key dims without RoPE, `qk_nope_head_dim` (128).
    pub qk_nope_head_dim: usize,
    /// Per-head query dims with RoPE and the shared key `k_R`, `qk_rope_head_dim` (64).
    pub qk_rope_head_dim: usize,
    /// Per-head value dims, `v_head_dim` (128).
    pub v_head_dim: usize,
}

impl MlaShape {
    /// Checks the shape: every dim ≥ 1, `sq ≤ skv`.
    pub fn validate(&self) -> Result<(), AttnRefError> {
        if self.heads == 0
            || self.kv_lora_rank == 0
            || self.qk_nope_head_dim == 0
            || self.qk_rope_head_dim == 0
            || self.v_head_dim == 0
        {
            return fail(format!("MLA shape {self:?}: heads and dims must be ≥ 1"));
        }
        if self.sq > self.skv {
            return fail(format!(
                "MLA shape: {} queries but a context of only {} tokens (sq ≤ skv)",
                self.sq, self.skv
            ));
        }
        Ok(())
    }

    /// Per-head query width `qk_nope_head_dim + qk_rope_head_dim` (192).
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Values cached per token: `kv_lora_rank + qk_rope_head_dim` (576).
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// The latent MQA this MLA call becomes in absorbed form.
    pub fn latent_mqa(&self) -> MqaShape {
        MqaShape {
            sq: self.sq,
            skv: self.skv,
            heads: self.heads,
            dk: self.latent_dim(),
            dv: self.kv_lora_rank,
        }
    }

    fn check_weights(&self, w_kv_b: usize) -> Result<(), AttnRefError> {
        expect_len(
            "w_kv_b",
            w_kv_b,
            &[
                self.heads,
                self.qk_nope_head_dim + self.v_head_dim,
                self.kv_lora_rank,
            ],
            "[heads · (qk_nope_head_dim + v_head_dim), kv_lora_rank]",
        )
    }

    fn check_inputs(
        &self,
        q: usize,
        c_kv: usize,
        k_rope: usize,
        w_kv_b: usize,
    ) -> Result<(), AttnRefError> {
        self.validate()?;
        expect_len(
            "q",
            q,
            &[self.sq, self.heads, self.qk_head_dim()],
            "[sq, heads, qk_nope_head_dim + qk_rope_head_dim]",
        )?;
        expect_len(
            "c_kv",
            c_kv,
            &[self.skv, self.kv_lora_rank],
            "[skv, kv_lora_rank]",
        )?;
        expect_len(
            "k_rope",
            k_rope,
            &[self.skv, self.qk_rope_head_dim],
            "[skv, qk_rope_head_dim]",
        )?;
        self.check_weights(w_kv_b)
    }

    /// Row `a` of `W_UK,h` inside `w_kv_b` (`kv_lora_rank` values).
    fn w_uk_row<'w>(&self, w: &'w [f64], h: usize, a: usize) -> &'w [f64] {
        let rows = self.qk_nope_head_dim + self.v_head_dim;
        &w[(h * rows + a) * self.kv_lora_rank..][..self.kv_lora_rank]
    }

    /// Row `b` of `W_UV,h` inside `w_kv_b` (`kv_lora_rank` values).
    fn w_uv_row<'w>(&self, w: &'w [f64], h: usize, b: usize) -> &'w [f64] {
        self.w_uk_row(w, h, self.qk_nope_head_dim + b)
    }
}

/// MLA softmax scale τ = `(qk_nope + qk_rope)^-1/2 · m²` with the YaRN attention factor
/// `m = 0.1 · mscale_all_dim · ln(rope_factor) + 1`, and `m = 1` when `rope_factor ≤ 1` or
/// `mscale_all_dim = 0` (transformers `yarn_get_mscale` / `yarn_apply_mscale` in
/// `models/deepseek_v32/modeling_deepseek_v32.py`; DeepSeek's `inference/model.py` applies the
/// same factor, named `mscale`, only when `max_seq_len > original_seq_len` — pass
/// `rope_factor = 1` when YaRN is off). DeepSeek-V3: factor 40, mscale_all_dim 1, τ ≈ 0.13523.
pub fn mla_softmax_scale(
    qk_nope_head_dim: usize,
    qk_rope_head_dim: usize,
    rope_factor: f64,
    mscale_all_dim: f64,
) -> f64 {
    let base = ((qk_nope_head_dim + qk_rope_head_dim) as f64).powf(-0.5);
    let m = if rope_factor <= 1.0 || mscale_all_dim == 0.0 {
        1.0
    } else {
        0.1 * mscale_all_dim * rope_factor.ln() + 1.0
    };
    base * m * m
}

/// Naive MLA (the prefill form): expand per-head keys `k_h = [W_UK,h c_KV ; k_R]` and values
/// `v_h = W_UV,h c_KV`, then causal multi-head attention with scale τ. Inputs: `q [sq, heads,
/// nope + rope]`, `c_kv [skv, kv_lora]`, `k_rope [skv, rope]`, `w_kv_b [heads · (nope + v),
/// kv_lora]`. Returns `o [sq, heads, v_head_dim]` (before `wo`).
pub fn mla_naive(
    q: &[f32],
    c_kv: &[f32],
    k_rope: &[f32],
    w_kv_b: &[f32],
    shape: MlaShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    shape.check_inputs(q.len(), c_kv.len(), k_rope.len(), w_kv_b.len())?;
    let (h_n, r, nope, rope, dv) = (
        shape.heads,
        shape.kv_lora_rank,
        shape.qk_nope_head_dim,
        shape.qk_rope_head_dim,
        shape.v_head_dim,
    );
    let dqk = shape.qk_head_dim();
    let (c, kr, w) = (widen(c_kv), widen(k_rope), widen(w_kv_b));
    let mut k = vec![0.0f64; shape.skv * h_n * dqk];
    let mut v = vec![0.0f64; shape.skv * h_n * dv];
    for s in 0..shape.skv {
        let cs = &c[s * r..][..r];
        for h in 0..h_n {
            let kh = &mut k[(s * h_n + h) * dqk..][..dqk];
            for (a, ka) in kh[..nope].iter_mut().enumerate() {
                *ka = dot(shape.w_uk_row(&w, h, a), cs);
            }
            kh[nope..].copy_from_slice(&kr[s * rope..][..rope]);
            let vh = &mut v[(s * h_n + h) * dv..][..dv];
            for (b, vb) in vh.iter_mut().enumerate() {
                *vb = dot(shape.w_uv_row(&w, h, b), cs);
            }
        }
    }
    let attn = AttnShape {
        sq: shape.sq,
        skv: shape.skv,
        heads: h_n,
        kv_heads: h_n,
        head_dim: dqk,
        v_head_dim: dv,
    };
    Ok(dense_causal(&widen(q), &k, &v, &attn, scale, 0, &[]))
}

/// Absorbed query `[q̃ ; q_rope]` per head, `[sq, heads, kv_lora + rope]`, with
/// `q̃_h = W_UK,hᵀ q_nope,h` (DeepSeek: `einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :nope])`): the
/// query of the latent MQA ([`MlaShape::latent_mqa`]).
pub fn mla_absorb_query(
    q: &[f32],
    w_kv_b: &[f32],
    shape: MlaShape,
) -> Result<Vec<f64>, AttnRefError> {
    shape.validate()?;
    expect_len(
        "q",
        q.len(),
        &[shape.sq, shape.heads, shape.qk_head_dim()],
        "[sq, heads, qk_nope_head_dim + qk_rope_head_dim]",
    )?;
    shape.check_weights(w_kv_b.len())?;
    Ok(absorb_query_f64(&widen(q), &widen(w_kv_b), &shape))
}

fn absorb_query_f64(q: &[f64], w: &[f64], s: &MlaShape) -> Vec<f64> {
    let (r, nope, dqk, dl) = (
        s.kv_lora_rank,
        s.qk_nope_head_dim,
        s.qk_head_dim(),
        s.latent_dim(),
    );
    let mut out = vec![0.0f64; s.sq * s.heads * dl];
    for i in 0..s.sq {
        for h in 0..s.heads {
            let qh = &q[(i * s.heads + h) * dqk..][..dqk];
            let oh = &mut out[(i * s.heads + h) * dl..][..dl];
            for (a, qa) in qh[..nope].iter().enumerate() {
                for (oc, wc) in oh[..r].iter_mut().zip(s.w_uk_row(w, h, a)) {
                    *oc += qa * wc;
                }
            }
            oh[r..].copy_from_slice(&qh[nope..]);
        }
    }
    out
}

/// The latent cache rows `[c_KV ; k_R]`, `[skv, kv_lora + rope]`: what MLA decode reads per token
/// (DeepSeek's `kv_cache` and `pe_cache` side by side).
pub fn mla_latent_cache(
    c_kv: &[f32],
    k_rope: &[f32],
    shape: MlaShape,
) -> Result<Vec<f64>, AttnRefError> {
    shape.validate()?;
    expect_len(
        "c_kv",
        c_kv.len(),
        &[shape.skv, shape.kv_lora_rank],
        "[skv, kv_lora_rank]",
    )?;
    expect_len(
        "k_rope",
        k_rope.len(),
        &[shape.skv, shape.qk_rope_head_dim],
        "[skv, qk_rope_head_dim]",
    )?;
    Ok(latent_cache_f64(c_kv, k_rope, &shape))
}

fn latent_cache_f64(c_kv: &[f32], k_rope: &[f32], s: &MlaShape) -> Vec<f64> {
    let (r, rope) = (s.kv_lora_rank, s.qk_rope_head_dim);
    let mut out = Vec::with_capacity(s.skv * s.latent_dim());
    for t in 0..s.skv {
        out.extend(c_kv[t * r..][..r].iter().map(|v| *v as f64));
        out.extend(k_rope[t * rope..][..rope].iter().map(|v| *v as f64));
    }
    out
}

/// Output projection of the absorbed form: `o_h = W_UV,h õ_h` for `õ [sq, heads, kv_lora]`
/// (DeepSeek: `einsum("bshc,hdc->bshd", x, wkv_b[:, -v_head_dim:])`). Returns
/// `[sq, heads, v_head_dim]`.
pub fn mla_project_output(
    o_latent: &[f64],
    w_kv_b: &[f32],
    shape: MlaShape,
) -> Result<Vec<f64>, AttnRefError> {
    shape.validate()?;
    expect_len(
        "o_latent",
        o_latent.len(),
        &[shape.sq, shape.heads, shape.kv_lora_rank],
        "[sq, heads, kv_lora_rank]",
    )?;
    shape.check_weights(w_kv_b.len())?;
    Ok(project_output_f64(o_latent, &widen(w_kv_b), &shape))
}

fn project_output_f64(o_lat: &[f64], w: &[f64], s: &MlaShape) -> Vec<f64> {
    let (r, dv) = (s.kv_lora_rank, s.v_head_dim);
    let mut out = vec![0.0f64; s.sq * s.heads * dv];
    for i in 0..s.sq {
        for h in 0..s.heads {
            let oh = &o_lat[(i * s.heads + h) * r..][..r];
            for (b, ob) in out[(i * s.heads + h) * dv..][..dv].iter_mut().enumerate() {
                *ob = dot(s.w_uv_row(w, h, b), oh);
            }
        }
    }
    out
}

/// Absorbed MLA (the decode form): absorb `W_UK` into the query ([`mla_absorb_query`]), run
/// causal multi-query attention over the latent cache `[c_KV ; k_R]` with value `c_KV`, then apply
/// `W_UV` ([`mla_project_output`]). Same inputs and output as [`mla_naive`], to which it is
/// mathematically equal — only the association of the products differs.
pub fn mla_absorbed(
    q: &[f32],
    c_kv: &[f32],
    k_rope: &[f32],
    w_kv_b: &[f32],
    shape: MlaShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    shape.check_inputs(q.len(), c_kv.len(), k_rope.len(), w_kv_b.len())?;
    let w = widen(w_kv_b);
    let q_lat = absorb_query_f64(&widen(q), &w, &shape);
    let kv = latent_cache_f64(c_kv, k_rope, &shape);
    let o_lat = mqa_dense_f64(&q_lat, &kv, &shape.latent_mqa(), scale);
    Ok(project_output_f64(&o_lat, &w, &shape))
}

/// Sparse absorbed MLA (DSA's attention): as [`mla_absorbed`], but query `i` attends only the
/// keys in `indices[i]` (from [`select_topk`]), gathered from the latent cache. With every causal
/// key selected it equals [`mla_absorbed`] (and so [`mla_naive`]).
pub fn mla_sparse(
    q: &[f32],
    c_kv: &[f32],
    k_rope: &[f32],
    w_kv_b: &[f32],
    indices: &[Vec<usize>],
    shape: MlaShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    shape.check_inputs(q.len(), c_kv.len(), k_rope.len(), w_kv_b.len())?;
    let mqa = shape.latent_mqa();
    mqa.check_indices(indices)?;
    let w = widen(w_kv_b);
    let q_lat = absorb_query_f64(&widen(q), &w, &shape);
    let kv = latent_cache_f64(c_kv, k_rope, &shape);
    let o_lat = mqa_sparse_f64(&q_lat, &kv, indices, &mqa, scale);
    Ok(project_output_f64(&o_lat, &w, &shape))
}

// ---------------------------------------------------------------------------------------------
// DSA lightning indexer and top-k
// ---------------------------------------------------------------------------------------------

/// Shape of one lightning-indexer call (one sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerShape {
    /// Queries: the last `sq` positions of the context.
    pub sq: usize,
    /// Context length, `≥ sq`.
    pub skv: usize,
    /// Index heads `index_n_heads` (64 in DeepSeek-V3.2).
    pub index_heads: usize,
    /// Index head dim `index_head_dim` (128).
    pub index_head_dim: usize,
}

impl IndexerShape {
    /// Checks the shape: heads and dim ≥ 1, `sq ≤ skv`.
    pub fn validate(&self) -> Result<(), AttnRefError> {
        if self.index_heads == 0 || self.index_head_dim == 0 {
            return fail(format!(
                "indexer shape {self:?}: heads and head dim must be ≥ 1"
            ));
        }
        if self.sq > self.skv {
            return fail(format!(
                "indexer shape: {} queries but a context of only {} tokens (sq ≤ skv)",
                self.sq, self.skv
            ));
        }
        Ok(())
    }

    /// Position in the context of query `i`: `skv − sq + i`.
    pub fn query_position(&self, i: usize) -> usize {
        self.skv - self.sq + i
    }
}

/// Lightning-indexer scores `I [sq, skv]`: `I(t,s) = Σ_j w(t,j) · ReLU(scale · q(t,j)·k(s))` for
/// keys `s ≤` the query's position, `−∞` after (the causal mask the reference code adds before
/// top-k). Inputs: `q [sq, index_heads, index_head_dim]` (RoPE applied), `k [skv,
/// index_head_dim]` (one head, shared), `w [sq, index_heads]` already including the
/// `index_n_heads^-1/2` factor; `scale` is `index_head_dim^-1/2` in DeepSeek-V3.2.
pub fn indexer_scores(
    q: &[f32],
    k: &[f32],
    w: &[f32],
    shape: IndexerShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    shape.validate()?;
    let (nh, d) = (shape.index_heads, shape.index_head_dim);
    expect_len(
        "q",
        q.len(),
        &[shape.sq, nh, d],
        "[sq, index_heads, index_head_dim]",
    )?;
    expect_len("k", k.len(), &[shape.skv, d], "[skv, index_head_dim]")?;
    expect_len("w", w.len(), &[shape.sq, nh], "[sq, index_heads]")?;
    let (q, k, w) = (widen(q), widen(k), widen(w));
    let mut out = vec![f64::NEG_INFINITY; shape.sq * shape.skv];
    for i in 0..shape.sq {
        let pos = shape.query_position(i);
        let row = &mut out[i * shape.skv..][..shape.skv];
        for (s, score) in row.iter_mut().enumerate().take(pos + 1) {
            let ks = &k[s * d..][..d];
            *score = (0..nh)
                .map(|j| w[i * nh + j] * (scale * dot(&q[(i * nh + j) * d..][..d], ks)).max(0.0))
                .sum();
        }
    }
    Ok(out)
}

/// Rank order of two candidates: higher score first; equal scores (−0 = +0) by lower index; NaN
/// after every number.
fn rank_order(scores: &[f64], a: usize, b: usize) -> Ordering {
    let (sa, sb) = (scores[a], scores[b]);
    match (sa.is_nan(), sb.is_nan()) {
        (true, true) => a.cmp(&b),
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => sb
            .partial_cmp(&sa)
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(&b)),
    }
}

/// The `min(k, scores.len())` best indices of `scores`, best first. Deterministic tie-breaking,
/// which `torch.topk` (used by the reference code) does not promise: higher score first, equal
/// scores by **lower index** first, `−0.0` equal to `+0.0`, NaN ranked below every number
/// (including `−∞`), so a NaN never displaces a real score.
pub fn topk(scores: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    let k = k.min(idx.len());
    if k > 0 && k < idx.len() {
        // Partition first so long contexts sort only the winners.
        idx.select_nth_unstable_by(k - 1, |&a, &b| rank_order(scores, a, b));
    }
    idx.truncate(k);
    idx.sort_by(|&a, &b| rank_order(scores, a, b));
    idx
}

/// DSA top-k selection for every query of an `[sq, skv]` score matrix (from
/// [`indexer_scores`]): query `i` ranks only its causal keys `0..=p` (`p = skv − sq + i`) and keeps
/// `min(index_topk, p + 1)` of them ([`topk`]'s order and tie-breaking). Matches the reference
/// code's `topk(min(index_topk, end_pos))` over causally masked scores, whose masked picks are
/// masked again afterwards. `index_topk` must be ≥ 1.
pub fn select_topk(
    scores: &[f64],
    sq: usize,
    skv: usize,
    index_topk: usize,
) -> Result<Vec<Vec<usize>>, AttnRefError> {
    if index_topk == 0 {
        return fail("select_topk: index_topk must be ≥ 1".to_string());
    }
    if sq > skv {
        return fail(format!(
            "select_topk: {sq} queries but a context of {skv} tokens"
        ));
    }
    expect_len("scores", scores.len(), &[sq, skv], "[sq, skv]")?;
    Ok((0..sq)
        .map(|i| {
            let pos = skv - sq + i;
            topk(&scores[i * skv..][..pos + 1], index_topk)
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// Bidirectional attention over packed variable-length segments
// ---------------------------------------------------------------------------------------------

/// Packed segments of one bidirectional attention call (vision patches of several images).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VarlenShape {
    /// Length of each segment, in packing order.
    pub lens: Vec<usize>,
    /// Heads (queries, keys and values alike).
    pub heads: usize,
    /// Head dimension (queries, keys and values alike).
    pub head_dim: usize,
}

impl VarlenShape {
    /// Rows of the packed activations: the sum of the segment lengths.
    pub fn rows(&self) -> usize {
        self.lens.iter().sum()
    }

    /// The segment bounds: `[0, l0, l0 + l1, …, rows]`.
    pub fn cu_seqlens(&self) -> Vec<i32> {
        std::iter::once(0)
            .chain(self.lens.iter().scan(0usize, |acc, l| {
                *acc += l;
                Some(*acc as i32)
            }))
            .collect()
    }
}

/// Bidirectional attention within each segment: `q`, `k`, `v [rows, heads, head_dim]` packed, a
/// query of segment `b` attends to every key of segment `b` and to no other (no causal mask).
/// Returns `o [rows, heads, head_dim]`.
pub fn attention_varlen(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    shape: &VarlenShape,
    scale: f64,
) -> Result<Vec<f64>, AttnRefError> {
    let (h, d) = (shape.heads, shape.head_dim);
    if h == 0 || d == 0 {
        return fail(format!(
            "varlen shape {shape:?}: heads and head_dim must be ≥ 1"
        ));
    }
    let dims = [shape.rows(), h, d];
    for (name, got) in [("q", q.len()), ("k", k.len()), ("v", v.len())] {
        expect_len(name, got, &dims, "[rows, heads, head_dim]")?;
    }
    let (q, k, v) = (widen(q), widen(k), widen(v));
    let mut out = vec![0.0f64; q.len()];
    let mut start = 0;
    for &len in &shape.lens {
        let mut p = vec![0.0f64; len];
        for i in start..start + len {
            for hh in 0..h {
                let qv = &q[(i * h + hh) * d..][..d];
                for (j, pj) in p.iter_mut().enumerate() {
                    *pj = dot(qv, &k[((start + j) * h + hh) * d..][..d]) * scale;
                }
                softmax_in_place(&mut p);
                let o = &mut out[(i * h + hh) * d..][..d];
                for (j, pj) in p.iter().enumerate() {
                    for (oc, vc) in o.iter_mut().zip(&v[((start + j) * h + hh) * d..][..d]) {
                        *oc += pj * vc;
                    }
                }
            }
        }
        start += len;
    }
    Ok(out)
}
