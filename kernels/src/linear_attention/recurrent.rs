//! The gated delta rule token by token (the decode form): one program per value head keeps that
//! head's state `S [DK, DV]` in SRAM for the whole call, loaded from a state tensor and stored
//! back.
//!
//! Per token (`q`, `k` L2-normalised in the kernel, `q` scaled by `dk^-1/2`):
//! `S' = Diag(α) S` (GDN: `α = e^g` one scalar; KDA: one per key channel), `u = β (v − k S')`,
//! `S = S' + kᵀ ⊗ u` (an outer product on the matrix unit: [`mma_at`](dsl_core::intrinsics::mma_at)
//! with `K = 1`), `o = q S`.
//!
//! Layouts (token-major, as [`super::reference`]): `q`, `k` `[seq, k_heads·dk]`; `v`, `o`
//! `[seq, v_heads·dv]`; `g` `[seq, v_heads]` (GDN) or `[seq, v_heads·dk]` (KDA), log-decays;
//! `beta` `[seq, v_heads]`; states `[v_heads·dk, dv]` f32 (head `h` in rows `h·dk..`). Value head
//! `h` reads key head `h / (v_heads / k_heads)`. The head dims `dk` and `dv` are run-time values,
//! read from the state's shape; each head is a column view held in `BDK`/`BDV`-wide tiles that
//! cover it. The padding stays exactly zero through every update (zero key channels and value
//! columns add nothing), and the stores drop it. `state_in` and `state_out` may be the same tensor
//! (each program reads its head's state before writing it), which is how a serving loop updates a
//! sequence's state slot in place.

use dsl_core::prelude::*;

/// `x · (Σx² + 1e-6)^-1/2` for every row: the reference code's `l2norm` of q and k.
#[kernel(helper)]
pub fn l2norm_rows<const R: usize, const C: usize>(x: &Tile<f32, R, C>) -> Tile<f32, R, C> {
    mul_col(x, &rsqrt(&add_scalar(&row_sum(&square(x)), 1e-6)))
}

/// Gated DeltaNet decode: one program per value head, tokens in order.
#[kernel(
    grid = (beta.cols(),),
    tunable(BDK = [128, 16, 32, 64, 256], BDV = [128, 16, 32, 64, 256]),
    constraint(BDK <= 2 * BDV && BDV <= 2 * BDK),
    helpers(l2norm_rows)
)]
#[allow(clippy::too_many_arguments)]
pub fn recurrent_delta<T: Float>(
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
    let mut s = load::<BDK, BDV>(&state_in.rows_clipped(h * dk, (h + 1) * dk), 0, 0);
    for t in 0..q.rows() {
        let tq = load_async::<1, BDK>(&qh, t, 0);
        let tk = load_async::<1, BDK>(&kh, t, 0);
        let tv = load_async::<1, BDV>(&vh, t, 0);
        let tg = load_async::<1, 1>(g, t, h);
        let tb = load_async::<1, 1>(beta, t, h);
        let qn = scale(&l2norm_rows(&cast::<f32>(&tq)), qscale);
        let kn = l2norm_rows(&cast::<f32>(&tk));
        // Decay first: the delta update reads the decayed state.
        s = mul_col(&s, &broadcast::<f32, BDK, 1>(&exp(&tg)));
        let mut ks = zeros::<f32, 1, BDV>();
        mma(&mut ks, &kn, &s);
        let u = mul_col(&sub(&cast::<f32>(&tv), &ks), &tb);
        mma_at(&mut s, &kn, &u);
        let mut ot = zeros::<f32, 1, BDV>();
        mma(&mut ot, &qn, &s);
        store(&oh, t, 0, &cast::<T>(&ot));
    }
    store(&state_out.rows_clipped(h * dk, (h + 1) * dk), 0, 0, &s);
}

/// KDA decode: as [`recurrent_delta()`] with one log-decay per key channel (`g [seq, v_heads·dk]`),
/// applied to the rows of `S`.
#[kernel(
    grid = (beta.cols(),),
    tunable(BDK = [128, 16, 32, 64, 256], BDV = [128, 16, 32, 64, 256]),
    constraint(BDK <= 2 * BDV && BDV <= 2 * BDK),
    helpers(l2norm_rows)
)]
#[allow(clippy::too_many_arguments)]
pub fn recurrent_delta_kda<T: Float>(
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
    let mut s = load::<BDK, BDV>(&state_in.rows_clipped(h * dk, (h + 1) * dk), 0, 0);
    for t in 0..q.rows() {
        let tq = load_async::<1, BDK>(&qh, t, 0);
        let tk = load_async::<1, BDK>(&kh, t, 0);
        let tv = load_async::<1, BDV>(&vh, t, 0);
        let tg = load_async::<1, BDK>(&g.cols_clipped(h * dk, dk), t, 0);
        let tb = load_async::<1, 1>(beta, t, h);
        let qn = scale(&l2norm_rows(&cast::<f32>(&tq)), qscale);
        let kn = l2norm_rows(&cast::<f32>(&tk));
        // Diag(α) S: the per-channel decays as a column, one per row of S.
        s = mul_col(&s, &transpose(&exp(&tg)));
        let mut ks = zeros::<f32, 1, BDV>();
        mma(&mut ks, &kn, &s);
        let u = mul_col(&sub(&cast::<f32>(&tv), &ks), &tb);
        mma_at(&mut s, &kn, &u);
        let mut ot = zeros::<f32, 1, BDV>();
        mma(&mut ot, &qn, &s);
        store(&oh, t, 0, &cast::<T>(&ot));
    }
    store(&state_out.rows_clipped(h * dk, (h + 1) * dk), 0, 0, &s);
}
