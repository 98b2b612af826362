//! # Linear-attention references (float64)
//!
//! The semantics every linear-attention kernel is checked against, transcribed from the reference
//! code (where it and `REFERENCE.md` disagree, the code wins):
//!
//! - Gated DeltaNet (Qwen3-Next): transformers `models/qwen3_next/modeling_qwen3_next.py`,
//!   `torch_recurrent_gated_delta_rule`, `torch_chunk_gated_delta_rule`, `l2norm`,
//!   `causal_conv1d_fn`/`causal_conv1d_update`, `Qwen3NextRMSNormGated`, and the gates in
//!   `Qwen3NextGatedDeltaNet.forward`;
//! - KDA (Kimi Linear): flash-linear-attention `fla/ops/kda/naive.py` (`naive_recurrent_kda`,
//!   `naive_chunk_kda`), transformers `models/kimi_linear/modeling_kimi_linear.py`
//!   (`recurrent_kimi_delta_attention`, `chunk_kimi_delta_attention`, `KimiLinearForgetGate`,
//!   `KimiLinearRMSNormGated`).
//!
//! ## Conventions
//! - **Token-major layouts** (the reference code's `[batch, seq, heads, dim]` with the batch
//!   dropped), row-major: `q`, `k` `[seq, k_heads, dk]`; `v` `[seq, v_heads, dv]`; `g`
//!   `[seq, v_heads]` (GDN) or `[seq, v_heads, dk]` (KDA); `beta` `[seq, v_heads]`; outputs
//!   `[seq, v_heads, dv]`. The **state** is `[v_heads, dk, dv]` (`S[h]` maps keys to values:
//!   `o = Sᵀ q`), as `initial_state` / `last_recurrent_state` in both codes.
//! - **Grouped value heads**: value head `h` reads query/key head `h / (v_heads / k_heads)` —
//!   `repeat_interleave(v_heads // k_heads, dim=2)` in the reference code.
//! - **q, k normalisation** (`use_qk_l2norm_in_kernel=True`, what both models pass):
//!   `x · (Σx² + 1e-6)^-1/2` per head (Qwen's `l2norm` uses `rsqrt`, Kimi's `x / sqrt(..)`: the
//!   same number). Then **q is always scaled by `dk^-1/2`**, normalised or not.
//! - **Decay** `g` is in log space (`≤ 0` for a decaying state): the state is multiplied by
//!   `exp(g)` before the token's delta update. GDN: one `g` per (token, value head); KDA: one per
//!   (token, value head, key channel), applied as `Diag(exp(g))` on the key side of `S`.
//! - **Recurrence** (per value head, per token): `S ← Diag(α) S`; `u = β (v − Sᵀ k)`;
//!   `S ← S + k uᵀ`; `o = Sᵀ q` — i.e. `S_t = (I − β k kᵀ) Diag(α) S_{t−1} + β k vᵀ`.
//! - **Chunked form** (`chunk` tokens at a time; the last chunk may be shorter — the reference
//!   code zero-pads it, which changes nothing because padded tokens have `k = v = 0`, `g = 0`):
//!   `G` = in-chunk cumulative sum of `g`; `Γ_ij = exp(G_i − G_j)` (per channel for KDA);
//!   `A = strictly_lower(diag(β) (K Kᵀ ⊙ Γ))`; `T = (I + A)⁻¹`; `U = T diag(β) V`;
//!   `W = T diag(β) (K ⊙ e^G)`; `V' = U − W S`; `O = (Q ⊙ e^G) S + lower(Q Kᵀ ⊙ Γ) V'`;
//!   `S ← Diag(e^{G_last}) S + (K ⊙ e^{G_last − G})ᵀ V'`.
//!
//! Every function validates its inputs and returns [`LinAttnRefError`] instead of panicking:
//! shapes come from the CLI and from random test cases.

use std::fmt;

/// A reference input that does not fit its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinAttnRefError(pub String);

impl fmt::Display for LinAttnRefError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LinAttnRefError {}

fn fail<T>(message: String) -> Result<T, LinAttnRefError> {
    Err(LinAttnRefError(message))
}

/// Product of `dims`, or an error naming `what` on overflow.
fn product(dims: &[usize], what: &str) -> Result<usize, LinAttnRefError> {
    dims.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| LinAttnRefError(format!("{what}: size {dims:?} overflows")))
    })
}

/// Checks that `name` holds `dims` elements (`layout` names the dimensions for the message).
fn expect_len(name: &str, got: usize, dims: &[usize], layout: &str) -> Result<(), LinAttnRefError> {
    let want = product(dims, name)?;
    if got != want {
        return fail(format!(
            "{name}: expected {want} values ({layout} = {dims:?}), got {got}"
        ));
    }
    Ok(())
}

/// Whether `d` (≥ 1) divides `n`. Written without `%` so clippy's `is_multiple_of` hint (Rust
/// 1.87) does not apply: the workspace declares rust-version 1.85.
fn divides(d: usize, n: usize) -> bool {
    n / d * d == n
}

/// f32 values (what a kernel reads) widened to f64 (what the references compute in).
pub fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|v| *v as f64).collect()
}

/// The epsilon of the q/k L2 normalisation in both reference codes (`l2norm(..., eps=1e-6)`).
pub const L2NORM_EPS: f64 = 1e-6;

/// How the state decays between tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decay {
    /// Gated DeltaNet: one log-decay `g` per (token, value head), `α = exp(g)` scales all of `S`.
    Scalar,
    /// KDA: one log-decay per (token, value head, key channel): `S ← Diag(exp(g)) S`.
    PerChannel,
}

/// Shape and options of one gated-delta-rule call (one sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaShape {
    /// Tokens.
    pub seq: usize,
    /// Query/key heads.
    pub k_heads: usize,
    /// Value heads; a multiple of `k_heads` (each key head serves `v_heads / k_heads` of them).
    pub v_heads: usize,
    /// Query/key head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
    /// GDN (scalar) or KDA (per-channel) decay.
    pub decay: Decay,
    /// L2-normalise q and k per head first (`use_qk_l2norm_in_kernel=True`, as both models do).
    pub qk_l2norm: bool,
}

impl DeltaShape {
    /// Checks the shape: heads and dims non-zero, `k_heads` divides `v_heads`.
    pub fn validate(&self) -> Result<(), LinAttnRefError> {
        if self.k_heads == 0 || self.v_heads == 0 || self.dk == 0 || self.dv == 0 {
            return fail(format!(
                "linear-attention shape {self:?}: heads and head dims must be ≥ 1"
            ));
        }
        // Written without `%` so clippy's `is_multiple_of` hint (Rust 1.87) does not apply: the
        // workspace declares rust-version 1.85.
        if self.v_heads / self.k_heads * self.k_heads != self.v_heads {
            return fail(format!(
                "linear-attention shape: k_heads {} must divide v_heads {} (each key head serves a \
                 group of value heads)",
                self.k_heads, self.v_heads
            ));
        }
        product(
            &[self.seq, self.v_heads, self.dk, self.dv],
            "linear-attention shape",
        )?;
        Ok(())
    }

    /// Key head read by value head `h`: `h / (v_heads / k_heads)`.
    pub fn k_head(&self, h: usize) -> usize {
        h / (self.v_heads / self.k_heads)
    }

    /// Log-decays per (token, value head): 1 (GDN) or `dk` (KDA).
    pub fn g_width(&self) -> usize {
        match self.decay {
            Decay::Scalar => 1,
            Decay::PerChannel => self.dk,
        }
    }

    /// Elements of the state `[v_heads, dk, dv]`.
    pub fn state_len(&self) -> usize {
        self.v_heads * self.dk * self.dv
    }
}

/// The inputs of a gated-delta-rule call, in the layouts of the module docs (all f64).
#[derive(Debug, Clone, Copy)]
pub struct DeltaInputs<'a> {
    /// Queries `[seq, k_heads, dk]`.
    pub q: &'a [f64],
    /// Keys `[seq, k_heads, dk]`.
    pub k: &'a [f64],
    /// Values `[seq, v_heads, dv]`.
    pub v: &'a [f64],
    /// Log-decays `[seq, v_heads]` (GDN) or `[seq, v_heads, dk]` (KDA).
    pub g: &'a [f64],
    /// Write strengths `[seq, v_heads]` (usually `σ(b)` in (0, 1)).
    pub beta: &'a [f64],
    /// Initial state `[v_heads, dk, dv]`; `None` = zeros.
    pub state: Option<&'a [f64]>,
}

/// Output and final state of a gated-delta-rule call.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaOutput {
    /// `o [seq, v_heads, dv]`.
    pub o: Vec<f64>,
    /// The state after the last token, `[v_heads, dk, dv]` (`output_final_state=True`).
    pub state: Vec<f64>,
}

impl DeltaInputs<'_> {
    fn check(&self, s: &DeltaShape) -> Result<(), LinAttnRefError> {
        s.validate()?;
        expect_len(
            "q",
            self.q.len(),
            &[s.seq, s.k_heads, s.dk],
            "[seq, k_heads, dk]",
        )?;
        expect_len(
            "k",
            self.k.len(),
            &[s.seq, s.k_heads, s.dk],
            "[seq, k_heads, dk]",
        )?;
        expect_len(
            "v",
            self.v.len(),
            &[s.seq, s.v_heads, s.dv],
            "[seq, v_heads, dv]",
        )?;
        match s.decay {
            Decay::Scalar => expect_len("g", self.g.len(), &[s.seq, s.v_heads], "[seq, v_heads]")?,
            Decay::PerChannel => expect_len(
                "g",
                self.g.len(),
                &[s.seq, s.v_heads, s.dk],
                "[seq, v_heads, dk]",
            )?,
        }
        expect_len(
            "beta",
            self.beta.len(),
            &[s.seq, s.v_heads],
            "[seq, v_heads]",
        )?;
        if let Some(st) = self.state {
            expect_len(
                "state",
                st.len(),
                &[s.v_heads, s.dk, s.dv],
                "[v_heads, dk, dv]",
            )?;
        }
        Ok(())
    }
}

/// `x · (Σx² + eps)^-1/2` for every row of `width` values (the reference code's `l2norm`).
pub fn l2_normalize_rows(x: &[f64], width: usize, eps: f64) -> Vec<f64> {
    let mut out = x.to_vec();
    for row in out.chunks_exact_mut(width.max(1)) {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() + eps).sqrt();
        for v in row.iter_mut() {
            *v *= inv;
        }
    }
    out
}

/// q and k as the recurrences use them: optionally L2-normalised, q then scaled by `dk^-1/2`.
fn prepare_qk(s: &DeltaShape, q: &[f64], k: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (mut q, k) = if s.qk_l2norm {
        (
            l2_normalize_rows(q, s.dk, L2NORM_EPS),
            l2_normalize_rows(k, s.dk, L2NORM_EPS),
        )
    } else {
        (q.to_vec(), k.to_vec())
    };
    let scale = 1.0 / (s.dk as f64).sqrt();
    for v in q.iter_mut() {
        *v *= scale;
    }
    (q, k)
}

/// Log-decay of value head `h` at token `t`, key channel `d` (GDN ignores `d`).
fn g_at(s: &DeltaShape, g: &[f64], t: usize, h: usize, d: usize) -> f64 {
    match s.decay {
        Decay::Scalar => g[t * s.v_heads + h],
        Decay::PerChannel => g[(t * s.v_heads + h) * s.dk + d],
    }
}

/// The gated delta rule token by token (decode form; `torch_recurrent_gated_delta_rule`,
/// `naive_recurrent_kda`): returns every token's output and the final state.
pub fn recurrent_gated_delta(
    s: &DeltaShape,
    x: &DeltaInputs<'_>,
) -> Result<DeltaOutput, LinAttnRefError> {
    x.check(s)?;
    let (q, k) = prepare_qk(s, x.q, x.k);
    let (dk, dv, hv) = (s.dk, s.dv, s.v_heads);
    let mut state = x
        .state
        .map_or_else(|| vec![0.0; s.state_len()], <[f64]>::to_vec);
    let mut o = vec![0.0; s.seq * hv * dv];
    let mut u = vec![0.0; dv];
    for h in 0..hv {
        let kh = s.k_head(h);
        let sh = &mut state[h * dk * dv..(h + 1) * dk * dv];
        for t in 0..s.seq {
            let qt = &q[(t * s.k_heads + kh) * dk..][..dk];
            let kt = &k[(t * s.k_heads + kh) * dk..][..dk];
            let vt = &x.v[(t * hv + h) * dv..][..dv];
            let beta = x.beta[t * hv + h];
            // Decay first, then the delta update reads the decayed state (both codes).
            for d in 0..dk {
                let a = g_at(s, x.g, t, h, d).exp();
                for e in &mut sh[d * dv..(d + 1) * dv] {
                    *e *= a;
                }
            }
            // u = β (v − Sᵀ k)
            u.copy_from_slice(vt);
            for d in 0..dk {
                for (ue, se) in u.iter_mut().zip(&sh[d * dv..(d + 1) * dv]) {
                    *ue -= kt[d] * se;
                }
            }
            for ue in u.iter_mut() {
                *ue *= beta;
            }
            // S += k uᵀ
            for d in 0..dk {
                for (se, ue) in sh[d * dv..(d + 1) * dv].iter_mut().zip(&u) {
                    *se += kt[d] * ue;
                }
            }
            // o = Sᵀ q (the updated state)
            let ot = &mut o[(t * hv + h) * dv..][..dv];
            for d in 0..dk {
                for (oe, se) in ot.iter_mut().zip(&sh[d * dv..(d + 1) * dv]) {
                    *oe += qt[d] * se;
                }
            }
        }
    }
    Ok(DeltaOutput { o, state })
}

/// The gated delta rule in chunks of `chunk` tokens (prefill form; `torch_chunk_gated_delta_rule`,
/// `chunk_kimi_delta_attention`, `naive_chunk_kda`): the intra-chunk UT transform solved by
/// forward substitution, the state carried between chunks. Any `seq` (the last chunk may be
/// short). Equal to [`recurrent_gated_delta`] up to rounding.
pub fn chunked_gated_delta(
    s: &DeltaShape,
    x: &DeltaInputs<'_>,
    chunk: usize,
) -> Result<DeltaOutput, LinAttnRefError> {
    x.check(s)?;
    if chunk == 0 {
        return fail("chunked gated delta rule: chunk size must be ≥ 1".into());
    }
    let (q, k) = prepare_qk(s, x.q, x.k);
    let (dk, dv, hv, gw) = (s.dk, s.dv, s.v_heads, s.g_width());
    let mut state = x
        .state
        .map_or_else(|| vec![0.0; s.state_len()], <[f64]>::to_vec);
    let mut o = vec![0.0; s.seq * hv * dv];
    for h in 0..hv {
        let kh = s.k_head(h);
        let sh = &mut state[h * dk * dv..(h + 1) * dk * dv];
        for c0 in (0..s.seq).step_by(chunk) {
            let n = chunk.min(s.seq - c0);
            let qr = |i: usize| &q[((c0 + i) * s.k_heads + kh) * dk..][..dk];
            let kr = |i: usize| &k[((c0 + i) * s.k_heads + kh) * dk..][..dk];
            let vr = |i: usize| &x.v[((c0 + i) * hv + h) * dv..][..dv];
            let beta = |i: usize| x.beta[(c0 + i) * hv + h];
            // G: in-chunk cumulative log-decay, [n, gw].
            let mut gc = vec![0.0; n * gw];
            for i in 0..n {
                for d in 0..gw {
                    let prev = if i == 0 { 0.0 } else { gc[(i - 1) * gw + d] };
                    gc[i * gw + d] = prev + g_at(s, x.g, c0 + i, h, d);
                }
            }
            let gd = |i: usize, d: usize| gc[i * gw + if gw == 1 { 0 } else { d }];
            // Σ_d a_d b_d exp(G_id − G_jd): the decayed key/key (or query/key) product.
            let decayed_dot = |a: &[f64], b: &[f64], i: usize, j: usize| -> f64 {
                (0..dk)
                    .map(|d| a[d] * b[d] * (gd(i, d) - gd(j, d)).exp())
                    .sum()
            };
            // A = strictly_lower(diag(β) (K Kᵀ ⊙ Γ)); solve (I + A) [U | W] = diag(β) [V | K ⊙ e^G]
            // by forward substitution (T = (I + A)⁻¹ is never formed).
            let mut a = vec![0.0; n * n];
            for i in 0..n {
                for j in 0..i {
                    a[i * n + j] = beta(i) * decayed_dot(kr(i), kr(j), i, j);
                }
            }
            let mut uu = vec![0.0; n * dv];
            let mut ww = vec![0.0; n * dk];
            for i in 0..n {
                for e in 0..dv {
                    uu[i * dv + e] = beta(i) * vr(i)[e];
                }
                for d in 0..dk {
                    ww[i * dk + d] = beta(i) * kr(i)[d] * gd(i, d).exp();
                }
                for j in 0..i {
                    let aij = a[i * n + j];
                    for e in 0..dv {
                        uu[i * dv + e] -= aij * uu[j * dv + e];
                    }
                    for d in 0..dk {
                        ww[i * dk + d] -= aij * ww[j * dk + d];
                    }
                }
            }
            // V' = U − W S
            let mut vp = uu;
            for i in 0..n {
                for d in 0..dk {
                    let w = ww[i * dk + d];
                    for e in 0..dv {
                        vp[i * dv + e] -= w * sh[d * dv + e];
                    }
                }
            }
            // O = (Q ⊙ e^G) S + lower(Q Kᵀ ⊙ Γ) V'
            for i in 0..n {
                let ot = &mut o[((c0 + i) * hv + h) * dv..][..dv];
                let qi = qr(i);
                for d in 0..dk {
                    let qd = qi[d] * gd(i, d).exp();
                    for e in 0..dv {
                        ot[e] += qd * sh[d * dv + e];
                    }
                }
                for j in 0..=i {
                    let p = decayed_dot(qi, kr(j), i, j);
                    for e in 0..dv {
                        ot[e] += p * vp[j * dv + e];
                    }
                }
            }
            // S ← Diag(e^{G_last}) S + (K ⊙ e^{G_last − G})ᵀ V'
            let last = n - 1;
            for d in 0..dk {
                let decay = gd(last, d).exp();
                for e in 0..dv {
                    sh[d * dv + e] *= decay;
                }
                for j in 0..n {
                    let kd = kr(j)[d] * (gd(last, d) - gd(j, d)).exp();
                    for e in 0..dv {
                        sh[d * dv + e] += kd * vp[j * dv + e];
                    }
                }
            }
        }
    }
    Ok(DeltaOutput { o, state })
}

/// Numerically stable `ln(1 + eˣ)` (torch's `F.softplus` returns `x` above 20; the difference,
/// `ln(1 + e^-x)`, is below 2·10⁻⁹ there — far under any kernel tolerance).
pub fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// Logistic sigmoid `1 / (1 + e^-x)`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x · σ(x)` (SiLU).
pub fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// Gated DeltaNet gates (`Qwen3NextGatedDeltaNet.forward`): from the projections `a`, `b`
/// `[seq, v_heads]` and the per-head parameters `A_log`, `dt_bias` `[v_heads]`, returns
/// `(g, beta)` with `g = −exp(A_log) · softplus(a + dt_bias)` and `β = σ(b)`, both
/// `[seq, v_heads]`.
pub fn gdn_gates(
    a: &[f64],
    b: &[f64],
    a_log: &[f64],
    dt_bias: &[f64],
) -> Result<(Vec<f64>, Vec<f64>), LinAttnRefError> {
    let hv = a_log.len();
    if hv == 0 || dt_bias.len() != hv || a.len() != b.len() || !divides(hv, a.len()) {
        return fail(format!(
            "gdn_gates: a ({}) and b ({}) must be [seq, v_heads] with v_heads = A_log ({}) = \
             dt_bias ({}) ≥ 1",
            a.len(),
            b.len(),
            a_log.len(),
            dt_bias.len()
        ));
    }
    let g = a
        .iter()
        .enumerate()
        .map(|(i, x)| -a_log[i % hv].exp() * softplus(x + dt_bias[i % hv]))
        .collect();
    Ok((g, b.iter().map(|x| sigmoid(*x)).collect()))
}

/// KDA gates (`KimiLinearForgetGate` + `b_proj`): from `f [seq, v_heads, dk]` (the low-rank
/// forget-gate projection), `b [seq, v_heads]`, `A_log [v_heads]` and `dt_bias [v_heads·dk]`,
/// returns `(g, beta)`: `g = −exp(A_log[h]) · softplus(f + dt_bias)` per channel, `β = σ(b)`.
pub fn kda_gates(
    f: &[f64],
    b: &[f64],
    a_log: &[f64],
    dt_bias: &[f64],
) -> Result<(Vec<f64>, Vec<f64>), LinAttnRefError> {
    let hv = a_log.len();
    let width = dt_bias.len();
    if hv == 0
        || width == 0
        || !divides(hv, width)
        || !divides(width, f.len())
        || b.len() * width != f.len() * hv
    {
        return fail(format!(
            "kda_gates: f ({}) must be [seq, v_heads·dk] with v_heads·dk = dt_bias ({}), b ({}) \
             [seq, v_heads] with v_heads = A_log ({}) ≥ 1",
            f.len(),
            width,
            b.len(),
            hv
        ));
    }
    let dk = width / hv;
    let g = f
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let c = i % width;
            -a_log[c / dk].exp() * softplus(x + dt_bias[c])
        })
        .collect();
    Ok((g, b.iter().map(|x| sigmoid(*x)).collect()))
}

/// Short causal depthwise convolution with SiLU (`causal_conv1d_fn` / `causal_conv1d_update`,
/// no bias), continuing from a rolling state.
///
/// `x [seq, channels]` (token-major), `weight [channels, kernel]` (`conv1d.weight.squeeze(1)`),
/// `state [kernel − 1, channels]`: the inputs of the previous `kernel − 1` tokens, oldest first
/// (zeros for a new sequence). `y[t, c] = SiLU(Σ_j weight[c, j] · x̃[t + j, c])` with
/// `x̃ = [state; x]`, so `weight[c, kernel − 1]` multiplies the current token. Returns `y` and the
/// new state (the last `kernel − 1` rows of `x̃`). Calling it on `x[..n]` then `x[n..]` with the
/// state carried equals one call on `x`.
pub fn short_conv(
    x: &[f64],
    weight: &[f64],
    state: &[f64],
    channels: usize,
) -> Result<(Vec<f64>, Vec<f64>), LinAttnRefError> {
    if channels == 0
        || !divides(channels, weight.len())
        || weight.is_empty()
        || !divides(channels, x.len())
    {
        return fail(format!(
            "short_conv: x ({}) must be [seq, channels] and weight ({}) [channels, kernel] with \
             channels = {channels} ≥ 1 and kernel ≥ 1",
            x.len(),
            weight.len()
        ));
    }
    let kernel = weight.len() / channels;
    let hist = kernel - 1;
    expect_len(
        "short_conv state",
        state.len(),
        &[hist, channels],
        "[kernel − 1, channels]",
    )?;
    let seq = x.len() / channels;
    let mut ext = state.to_vec();
    ext.extend_from_slice(x);
    let mut y = vec![0.0; seq * channels];
    for t in 0..seq {
        for c in 0..channels {
            let acc: f64 = (0..kernel)
                .map(|j| weight[c * kernel + j] * ext[(t + j) * channels + c])
                .sum();
            y[t * channels + c] = silu(acc);
        }
    }
    let new_state = ext[seq * channels..].to_vec();
    Ok((y, new_state))
}

/// The activation of the output gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputGate {
    /// Qwen3-Next (`Qwen3NextRMSNormGated`): `· SiLU(z)`.
    Silu,
    /// Kimi Linear (`KimiLinearRMSNormGated`): `· σ(z)`.
    Sigmoid,
}

/// Gated output norm: per row of `width` values, `RMSNorm(o) · w · act(z)` with
/// `RMSNorm(o) = o · (mean(o²) + eps)^-1/2` and `w [width]` the plain weight (not `1 + w`: this
/// norm's weight starts at ones, unlike Qwen3-Next's other RMSNorms).
pub fn gated_rmsnorm(
    o: &[f64],
    z: &[f64],
    weight: &[f64],
    eps: f64,
    gate: OutputGate,
) -> Result<Vec<f64>, LinAttnRefError> {
    let width = weight.len();
    if width == 0 || o.len() != z.len() || !divides(width, o.len()) {
        return fail(format!(
            "gated_rmsnorm: o ({}) and z ({}) must be [rows, width] with width = weight ({}) ≥ 1",
            o.len(),
            z.len(),
            width
        ));
    }
    let mut y = vec![0.0; o.len()];
    for ((yr, or), zr) in y
        .chunks_exact_mut(width)
        .zip(o.chunks_exact(width))
        .zip(z.chunks_exact(width))
    {
        let inv = 1.0 / (or.iter().map(|v| v * v).sum::<f64>() / width as f64 + eps).sqrt();
        for c in 0..width {
            let act = match gate {
                OutputGate::Silu => silu(zr[c]),
                OutputGate::Sigmoid => sigmoid(zr[c]),
            };
            yr[c] = or[c] * inv * weight[c] * act;
        }
    }
    Ok(y)
}

/// Max over elements of `|got − want| / max(|want|, rms(want))`; NaN anywhere gives +∞. For
/// comparing two f64 computations (chunked vs recurrent, prefill-then-decode vs one pass).
pub fn max_rel_diff(got: &[f64], want: &[f64]) -> f64 {
    if got.len() != want.len() {
        return f64::INFINITY;
    }
    let n = want.len().max(1) as f64;
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / n)
        .sqrt()
        .max(f64::MIN_POSITIVE);
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g.is_nan() || w.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs() / w.abs().max(rms)
            }
        })
        .fold(0.0, f64::max)
}
