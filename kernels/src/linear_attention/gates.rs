//! The element-wise parts around the delta rule: the Gated DeltaNet gates and the gated output
//! norm (see [`super::reference::gdn_gates`] and [`super::reference::gated_rmsnorm`]).
//!
//! Layouts (token-major): `a`, `b`, `g`, `beta` `[seq, v_heads]`; `a_log`, `dt_bias`
//! `[1, v_heads]`; `o`, `z`, `y` `[seq, v_heads·dv]`; `weight` `[1, dv]` (shared by the heads, as
//! `Qwen3NextRMSNormGated(head_v_dim)` is).

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

/// Qwen3-Next's gated output norm, `RMSNorm(o) · w · SiLU(z)` per head of `dv = weight.cols()`
/// values (a run-time value, covered by a `BDV`-wide tile; the padding adds nothing to the sum of
/// squares and the store drops it): one program per `BR` tokens × one value head.
#[kernel(
    grid = (cdiv(o.rows(), BR), o.cols() / weight.cols()),
    tunable(BR = [32, 8, 16, 64], BDV = [128, 16, 32, 64, 256, 512])
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
    let to = cast::<f32>(&load_async::<BR, BDV>(&o.cols_clipped(c, dv), r, 0));
    let tz = cast::<f32>(&load_async::<BR, BDV>(&z.cols_clipped(c, dv), r, 0));
    let w = load_async::<1, BDV>(weight, 0, 0);
    let inv = rsqrt(&add_scalar(
        &scale(&row_sum(&square(&to)), 1.0 / dv as f32),
        eps,
    ));
    let normed = mul_row(&mul_col(&to, &inv), &w);
    store(
        &y.cols_clipped(c, dv),
        r,
        0,
        &cast::<T>(&mul(&normed, &silu(&tz))),
    );
}
