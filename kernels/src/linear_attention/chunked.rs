//! The gated delta rule in chunks of `C` tokens (the prefill form): one program per value head
//! walks the sequence chunk by chunk, carrying the state `S [DK, DV]` in SRAM; within a chunk
//! everything is matrix-unit work on `C×C`, `C×DK` and `C×DV` tiles.
//!
//! Per chunk (notation of [`super::reference`]; `q`, `k` L2-normalised in the kernel, `q` scaled
//! by `dk^-1/2`):
//! - `G = L g`, the in-chunk cumulative log-decay, with `L = tril(1)` the lower-triangular ones
//!   matrix (a prefix sum as one matmul);
//! - `Γ = tril(exp(G_i − G_j))` (GDN; built with `add_col`/`sub_row`);
//! - `A = strictly_lower(diag(β) (K Kᵀ ⊙ Γ))` and `T = (I + A)⁻¹`, computed as
//!   `(I − A)(I + A²)(I + A⁴)…(I + A^{C/2})` — exact, because `A` is strictly lower triangular
//!   (`A^C = 0`), so `(I + A)⁻¹ = Σ_{n<C} (−A)ⁿ` and that product expands to exactly this sum:
//!   `2·log2(C) − 2` `C×C` matmuls instead of a sequential triangular solve;
//! - `U = T diag(β) V`, `W = T diag(β e^G) K`, `V' = U − W S`;
//! - `O = (Q ⊙ e^G) S + (Q Kᵀ ⊙ Γ) V'`;
//! - `S ← e^{G_last} S + (K ⊙ e^{G_last − G})ᵀ V'` (`G_last` = the chunk's total log-decay).
//!
//! A short last chunk needs nothing special: rows past the end load as zeros (`k = v = 0`,
//! `g = 0`, `β = 0`), exactly the reference code's zero padding, and their outputs are dropped by
//! the store. Layouts are those of [`super::recurrent`].
//!
//! **KDA** ([`chunked_delta_kda()`]): the decay is per key channel, so `Γ` cannot be factored out
//! of `K Kᵀ`; the kernel folds it into the operands instead, `(K ⊙ e^G)(K ⊙ e^{−G})ᵀ`. That is
//! exact but needs `e^{−G}` to stay finite in f32: the in-chunk cumulative log-decay of every
//! channel must stay above ≈ −80 (FLA splits chunks into 16-token sub-chunks for this). Choose `C`
//! so that `C · max|g|` < 80.

use super::recurrent::l2norm_rows;
use dsl_core::prelude::*;

/// `(I + A)⁻¹` of a strictly lower-triangular `A`: `(I − A)(I + A²)(I + A⁴)…(I + A^{C/2})`.
/// `ident` is `I` (passed in so the caller builds it once, outside its chunk loop).
#[kernel(helper)]
pub fn unit_lower_inverse<const C: usize>(
    a: &Tile<f32, C, C>,
    ident: &Tile<f32, C, C>,
) -> Tile<f32, C, C> {
    let mut t = sub(ident, a);
    let mut p = zeros::<f32, C, C>();
    mma(&mut p, a, a);
    // Factor j multiplies in (I + A^(2^j)); after the factors for every 2^j < C, the product holds
    // every power of −A below C. (Shifts over a fixed range: `while` is not in the DSL.)
    for j in 1..16usize {
        if (1usize << j) < C {
            let mut next = zeros::<f32, C, C>();
            mma(&mut next, &t, &add(ident, &p));
            t = next;
            if (2usize << j) < C {
                let mut p2 = zeros::<f32, C, C>();
                mma(&mut p2, &p, &p);
                p = p2;
            }
        }
    }
    t
}

/// Gated DeltaNet prefill: one program per value head, chunks of `C` tokens in order.
#[kernel(
    grid = (beta.cols(),),
    tunable(C = [64, 16, 32], BDK = [128, 16, 32, 64, 256], BDV = [128, 16, 32, 64, 256]),
    constraint(BDK <= 2 * BDV && BDV <= 2 * BDK),
    helpers(l2norm_rows, unit_lower_inverse)
)]
#[allow(clippy::too_many_arguments)]
pub fn chunked_delta<T: Float>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    g: &Tensor<f32>,
    beta: &Tensor<f32>,
    state_in: &Tensor<f32>,
    state_out: &Tensor<f32>,
    o: &Tensor<T>,
) {
    let h = program_id(0);
    let (dk, dv) = (state_in.rows() / beta.cols(), state_in.cols());
    require(
        dk <= BDK && dv <= BDV,
        "the BDK/BDV tiles must cover the head dims (delta_config picks covering tiles)",
    );
    let kvh = h / (beta.cols() / (q.cols() / dk));
    let (qh, kh) = (q.cols_clipped(kvh * dk, dk), k.cols_clipped(kvh * dk, dk));
    let (vh, oh) = (v.cols_clipped(h * dv, dv), o.cols_clipped(h * dv, dv));
    let qscale = 1.0 / (dk as f32).sqrt();
    // Chunk-invariant tiles, built once: the prefix-sum operator, I, and a zero C×C to broadcast
    // G into.
    let ones_lower = tril(&full::<f32, C, C>(1.0), false);
    let ident = eye::<f32, C>();
    let zcc = zeros::<f32, C, C>();
    let mut s = load::<BDK, BDV>(&state_in.rows_clipped(h * dk, (h + 1) * dk), 0, 0);
    for c0 in (0..q.rows()).step_by(C) {
        let tq = load_async::<C, BDK>(&qh, c0, 0);
        let tk = load_async::<C, BDK>(&kh, c0, 0);
        let tv = load_async::<C, BDV>(&vh, c0, 0);
        let tg = load_async::<C, 1>(g, c0, h);
        let tb = load_async::<C, 1>(beta, c0, h);
        let qn = scale(&l2norm_rows(&cast::<f32>(&tq)), qscale);
        let kn = l2norm_rows(&cast::<f32>(&tk));
        let mut gc = zeros::<f32, C, 1>();
        mma(&mut gc, &ones_lower, &tg);
        // Γ_ij = exp(G_i − G_j) on and below the diagonal. Above it the exponent is ≥ 0 and may
        // overflow to +∞; `tril` replaces those entries by 0, so no ∞ survives.
        let gamma = tril(&exp(&sub_row(&add_col(&zcc, &gc), &transpose(&gc))), false);
        let mut kk = zeros::<f32, C, C>();
        mma_bt(&mut kk, &kn, &kn);
        let a = tril(&mul_col(&mul(&kk, &gamma), &tb), true);
        let tinv = unit_lower_inverse::<C>(&a, &ident);
        let eg = exp(&gc);
        let mut u = zeros::<f32, C, BDV>();
        mma(&mut u, &tinv, &mul_col(&cast::<f32>(&tv), &tb));
        let mut w = zeros::<f32, C, BDK>();
        mma(&mut w, &tinv, &mul_col(&kn, &mul(&tb, &eg)));
        // V' = U − W S: the part of the values the carried state does not already predict.
        let mut vp = zeros::<f32, C, BDV>();
        mma(&mut vp, &w, &s);
        let vp = sub(&u, &vp);
        let mut out = zeros::<f32, C, BDV>();
        mma(&mut out, &mul_col(&qn, &eg), &s);
        let mut qk = zeros::<f32, C, C>();
        mma_bt(&mut qk, &qn, &kn);
        mma(&mut out, &mul(&qk, &gamma), &vp);
        store(&oh, c0, 0, &cast::<T>(&out));
        // The chunk's total log-decay (padding rows add 0), then the state carry.
        let glast = col_sum(&tg);
        let kd = mul_col(&kn, &exp(&neg(&sub_row(&gc, &glast))));
        s = mul_col(&s, &broadcast::<f32, BDK, 1>(&exp(&glast)));
        mma_at(&mut s, &kd, &vp);
    }
    store(&state_out.rows_clipped(h * dk, (h + 1) * dk), 0, 0, &s);
}

/// KDA prefill: as [`chunked_delta()`] with per-channel log-decays `g [seq, v_heads·dk]`, folded
/// into the key/query operands (see the module docs for the range this is valid in).
#[kernel(
    grid = (beta.cols(),),
    tunable(C = [64, 16, 32], BDK = [128, 16, 32, 64, 256], BDV = [128, 16, 32, 64, 256]),
    constraint(BDK <= 2 * BDV && BDV <= 2 * BDK),
    helpers(l2norm_rows, unit_lower_inverse)
)]
#[allow(clippy::too_many_arguments)]
pub fn chunked_delta_kda<T: Float>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    g: &Tensor<f32>,
    beta: &Tensor<f32>,
    state_in: &Tensor<f32>,
    state_out: &Tensor<f32>,
    o: &Tensor<T>,
) {
    let h = program_id(0);
    let (dk, dv) = (state_in.rows() / beta.cols(), state_in.cols());
    require(
        dk <= BDK && dv <= BDV,
        "the BDK/BDV tiles must cover the head dims (delta_config picks covering tiles)",
    );
    let kvh = h / (beta.cols() / (q.cols() / dk));
    let (qh, kh) = (q.cols_clipped(kvh * dk, dk), k.cols_clipped(kvh * dk, dk));
    let (vh, oh) = (v.cols_clipped(h * dv, dv), o.cols_clipped(h * dv, dv));
    let qscale = 1.0 / (dk as f32).sqrt();
    let ones_lower = tril(&full::<f32, C, C>(1.0), false);
    let ident = eye::<f32, C>();
    let mut s = load::<BDK, BDV>(&state_in.rows_clipped(h * dk, (h + 1) * dk), 0, 0);
    for c0 in (0..q.rows()).step_by(C) {
        let tq = load_async::<C, BDK>(&qh, c0, 0);
        let tk = load_async::<C, BDK>(&kh, c0, 0);
        let tv = load_async::<C, BDV>(&vh, c0, 0);
        let tg = load_async::<C, BDK>(&g.cols_clipped(h * dk, dk), c0, 0);
        let tb = load_async::<C, 1>(beta, c0, h);
        let qn = scale(&l2norm_rows(&cast::<f32>(&tq)), qscale);
        let kn = l2norm_rows(&cast::<f32>(&tk));
        // G per channel; K ⊙ e^G and K ⊙ e^{−G} carry the decay of each side of a pair.
        let mut gc = zeros::<f32, C, BDK>();
        mma(&mut gc, &ones_lower, &tg);
        let eg = exp(&gc);
        let kp = mul(&kn, &eg);
        let km = mul(&kn, &exp(&neg(&gc)));
        let qp = mul(&qn, &eg);
        let mut kk = zeros::<f32, C, C>();
        mma_bt(&mut kk, &kp, &km);
        let a = tril(&mul_col(&kk, &tb), true);
        let tinv = unit_lower_inverse::<C>(&a, &ident);
        let mut u = zeros::<f32, C, BDV>();
        mma(&mut u, &tinv, &mul_col(&cast::<f32>(&tv), &tb));
        let mut w = zeros::<f32, C, BDK>();
        mma(&mut w, &tinv, &mul_col(&kp, &tb));
        let mut vp = zeros::<f32, C, BDV>();
        mma(&mut vp, &w, &s);
        let vp = sub(&u, &vp);
        let mut out = zeros::<f32, C, BDV>();
        mma(&mut out, &qp, &s);
        let mut qk = zeros::<f32, C, C>();
        mma_bt(&mut qk, &qp, &km);
        mma(&mut out, &tril(&qk, false), &vp);
        store(&oh, c0, 0, &cast::<T>(&out));
        let glast = col_sum(&tg);
        let kd = mul(&kn, &exp(&neg(&sub_row(&gc, &glast))));
        s = mul_col(&s, &transpose(&exp(&glast)));
        mma_at(&mut s, &kd, &vp);
    }
    store(&state_out.rows_clipped(h * dk, (h + 1) * dk), 0, 0, &s);
}
