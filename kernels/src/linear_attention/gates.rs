//! The element-wise parts around the delta rule: the gates (Gated DeltaNet's per head, KDA's per
//! key channel) and the gated output norms (SiLU gate for Qwen3-Next, sigmoid gate for Kimi
//! Linear); see [`super::reference::gdn_gates`], [`super::reference::kda_gates`] and
//! [`super::reference::gated_rmsnorm`].
//!
//! Layouts (token-major): GDN `a`, `b`, `g`, `beta` `[seq, v_heads]`, `a_log`, `dt_bias`
//! `[1, v_heads]`; KDA `f`, `g` `[seq, heads·dk]`, `b`, `beta` `[seq, heads]`, `a_log`
//! `[1, heads]`, `dt_bias` `[1, heads·dk]`; norms `o`, `z`, `y` `[seq, v_heads·dv]`, `weight`
//! `[1, dv]` (shared by the heads, as `Qwen3NextRMSNormGated(head_v_dim)` and
//! `KimiLinearRMSNormGated(head_dim)` are).

use dsl_core::prelude::*;

/// `g = −exp(A_log) · softplus(a + dt_bias)`, `β = σ(b)`: one program per `BR` tokens × `BH`
/// value heads (heads past the end are masked by the loads and stores).
#[kernel(
    grid = (cdiv(a.rows(), BR), cdiv(a.cols(), BH)),
    tunable(BR = [64, 16, 32, 128], BH = [32, 8, 16, 64, 128])
)]
pub fn gdn_gates(
    a: &Tensor<f32>,
    b: &Tensor<f32>,
    a_log: &Tensor<f32>,
    dt_bias: &Tensor<f32>,
    g: &Tensor<f32>,
    beta: &Tensor<f32>,
) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BH);
    let ta = load_async::<BR, BH>(a, r, c);
    let tb = load_async::<BR, BH>(b, r, c);
    let decay_rate = exp(&load_async::<1, BH>(a_log, 0, c));
    let dt = load_async::<1, BH>(dt_bias, 0, c);
    store(
        g,
        r,
        c,
        &neg(&mul_row(&softplus(&add_row(&ta, &dt)), &decay_rate)),
    );
    store(beta, r, c, &sigmoid(&tb));
}

/// KDA's gates (`KimiLinearForgetGate` and `σ(b_proj)`): `g = −exp(A_log[h]) · softplus(f +
/// dt_bias)` for each key channel of head `h`, `β = σ(b)`. `dk = f.cols() / a_log.cols()` is a
/// run-time value covered by a `BDK`-wide tile (padding is neither read nor stored): one program
/// per `BR` tokens × one head.
#[kernel(
    grid = (cdiv(f.rows(), BR), a_log.cols()),
    tunable(BR = [32, 8, 16, 64], BDK = [128, 16, 32, 64, 256])
)]
pub fn kda_gates(
    f: &Tensor<f32>,
    b: &Tensor<f32>,
    a_log: &Tensor<f32>,
    dt_bias: &Tensor<f32>,
    g: &Tensor<f32>,
    beta: &Tensor<f32>,
) {
    let dk = f.cols() / a_log.cols();
    require(dk <= BDK, "the BDK tile must cover the key head dim");
    let (r, h) = (program_id(0) * BR, program_id(1));
    let tf = load_async::<BR, BDK>(&f.cols_clipped(h * dk, dk), r, 0);
    let dt = load_async::<1, BDK>(&dt_bias.cols_clipped(h * dk, dk), 0, 0);
    let rate = broadcast::<_, 1, BDK>(&exp(&load_async::<1, 1>(a_log, 0, h)));
    store(
        &g.cols_clipped(h * dk, dk),
        r,
        0,
        &neg(&mul_row(&softplus(&add_row(&tf, &dt)), &rate)),
    );
    store(beta, r, h, &sigmoid(&load_async::<BR, 1>(b, r, h)));
}

/// `RMSNorm(o) · w` for one head of `dv = weight.cols()` values at column `c`, rows `r..r + BR`
/// of `o`, in f32 (both gated norms share it; the padding of the `BDV` tile adds nothing to the
/// sum of squares).
#[kernel(helper)]
fn rms_normed_head<T: Float, const BR: usize, const BDV: usize>(
    o: &Tensor<T>,
    weight: &Tensor<f32>,
    r: usize,
    c: usize,
    eps: f32,
) -> Tile<f32, BR, BDV> {
    let dv = weight.cols();
    let to = cast::<f32>(&load_async::<BR, BDV>(&o.cols_clipped(c, dv), r, 0));
    let w = load_async::<1, BDV>(weight, 0, 0);
    let inv = rsqrt(&add_scalar(
        &scale(&row_sum(&square(&to)), 1.0 / dv as f32),
        eps,
    ));
    mul_row(&mul_col(&to, &inv), &w)
}

/// Qwen3-Next's gated output norm, `RMSNorm(o) · w · SiLU(z)` per head of `dv = weight.cols()`
/// values (a run-time value, covered by a `BDV`-wide tile; the store drops the padding): one
/// program per `BR` tokens × one value head.
#[kernel(
    grid = (cdiv(o.rows(), BR), o.cols() / weight.cols()),
    tunable(BR = [32, 8, 16, 64], BDV = [128, 16, 32, 64, 256, 512]),
    helpers(rms_normed_head)
)]
pub fn gated_rmsnorm_silu<T: Float>(
    o: &Tensor<T>,
    z: &Tensor<T>,
    weight: &Tensor<f32>,
    y: &Tensor<T>,
    eps: f32,
) {
    let dv = weight.cols();
    require(dv <= BDV, "the BDV tile must cover the value head dim");
    let (r, c) = (program_id(0) * BR, program_id(1) * dv);
    let normed = rms_normed_head::<T, BR, BDV>(o, weight, r, c, eps);
    let tz = cast::<f32>(&load_async::<BR, BDV>(&z.cols_clipped(c, dv), r, 0));
    store(
        &y.cols_clipped(c, dv),
        r,
        0,
        &cast::<T>(&mul(&normed, &silu(&tz))),
    );
}

/// Kimi Linear's gated output norm (`KimiLinearRMSNormGated`), `RMSNorm(o) · w · σ(z)` per head
/// of `dv = weight.cols()` values, `z` the low-rank output gate (`g_b_proj(g_a_proj(x))`): one
/// program per `BR` tokens × one head, as [`gated_rmsnorm_silu`].
#[kernel(
    grid = (cdiv(o.rows(), BR), o.cols() / weight.cols()),
    tunable(BR = [32, 8, 16, 64], BDV = [128, 16, 32, 64, 256, 512]),
    helpers(rms_normed_head)
)]
pub fn gated_rmsnorm_sigmoid<T: Float>(
    o: &Tensor<T>,
    z: &Tensor<T>,
    weight: &Tensor<f32>,
    y: &Tensor<T>,
    eps: f32,
) {
    let dv = weight.cols();
    require(dv <= BDV, "the BDV tile must cover the value head dim");
    let (r, c) = (program_id(0) * BR, program_id(1) * dv);
    let normed = rms_normed_head::<T, BR, BDV>(o, weight, r, c, eps);
    let tz = cast::<f32>(&load_async::<BR, BDV>(&z.cols_clipped(c, dv), r, 0));
    store(
        &y.cols_clipped(c, dv),
        r,
        0,
        &cast::<T>(&mul(&normed, &sigmoid(&tz))),
    );
}
