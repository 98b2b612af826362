//! Float64 references: the semantics every kernel is checked against.

/// `C = A·B` in f64 from f32 inputs (row-major, A m×k, B k×n).
pub fn gemm(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p] as f64;
            let row = &b[p * n..(p + 1) * n];
            for (cj, bj) in c[i * n..(i + 1) * n].iter_mut().zip(row) {
                *cj += x * *bj as f64;
            }
        }
    }
    c
}

/// Max over elements of |got − want| / max(|want|, floor): relative error with an absolute floor for
/// near-zero references. NaN anywhere (including an unwritten, poisoned output) gives +∞.
pub fn max_rel_error(got: &[f32], want: &[f64], floor: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "result and reference lengths differ");
    let mut worst = 0.0f64;
    for (g, w) in got.iter().zip(want) {
        let g = *g as f64;
        if !g.is_finite() || !w.is_finite() {
            if g.to_bits() != w.to_bits() && !(g.is_infinite() && g == *w) {
                return f64::INFINITY;
            }
            continue;
        }
        worst = worst.max((g - w).abs() / w.abs().max(floor));
    }
    worst
}

/// Scale floor for [`max_rel_error`]: a fraction of the reference's RMS, so that relative error is
/// measured against the size of typical outputs, not against accidental near-zeros.
pub fn rms_floor(want: &[f64]) -> f64 {
    let n = want.len().max(1) as f64;
    (want.iter().map(|v| v * v).sum::<f64>() / n)
        .sqrt()
        .max(f64::MIN_POSITIVE)
}

/// Row softmax in f64 of a row-major `rows×cols` matrix: `exp(x − max) / Σ exp(x − max)` per row.
pub fn softmax_rows(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    assert_eq!(x.len(), rows * cols, "softmax_rows: input length");
    let mut y = vec![0.0f64; rows * cols];
    for (yr, xr) in y
        .chunks_exact_mut(cols.max(1))
        .zip(x.chunks_exact(cols.max(1)))
    {
        let m = xr.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
        let mut s = 0.0f64;
        for (o, v) in yr.iter_mut().zip(xr) {
            *o = (*v as f64 - m).exp();
            s += *o;
        }
        for o in yr.iter_mut() {
            *o /= s;
        }
    }
    y
}

/// Residual add + RMSNorm in f64 over row-major `rows×h` inputs: returns `(hs, y)` with
/// `hs = x + residual` and `y = hs / sqrt(mean(hs²) + eps) · weight` (weight has `h` elements).
pub fn rmsnorm_residual(
    x: &[f32],
    residual: &[f32],
    weight: &[f32],
    rows: usize,
    h: usize,
    eps: f32,
) -> (Vec<f64>, Vec<f64>) {
    assert_eq!(x.len(), rows * h, "rmsnorm_residual: x length");
    assert_eq!(
        residual.len(),
        rows * h,
        "rmsnorm_residual: residual length"
    );
    assert_eq!(weight.len(), h, "rmsnorm_residual: weight length");
    let hs: Vec<f64> = x
        .iter()
        .zip(residual)
        .map(|(a, b)| *a as f64 + *b as f64)
        .collect();
    let mut y = vec![0.0f64; rows * h];
    for (yr, hr) in y.chunks_exact_mut(h.max(1)).zip(hs.chunks_exact(h.max(1))) {
        let ms = hr.iter().map(|v| v * v).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((o, v), w) in yr.iter_mut().zip(hr).zip(weight) {
            *o = v * inv * *w as f64;
        }
    }
    (hs, y)
}

/// [`max_rel_error`] with the [`rms_floor`] of the reference: the error every kernel check reports.
pub fn rel_error(got: &[f32], want: &[f64]) -> f64 {
    max_rel_error(got, want, rms_floor(want))
}

/// `aᵀ` of a row-major `rows×cols` matrix (a helper for references of `x · Wᵀ` products).
pub fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

/// `y = x · wᵀ` in f64 (a linear layer, weight `[n, k]` output-major), x `m×k`.
pub fn linear(x: &[f32], w: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    gemm(x, &transpose(w, n, k), m, n, k)
}

/// RMSNorm in f64 over row-major `rows×h`: `y = x / sqrt(mean(x²) + eps) · weight`.
pub fn rmsnorm(x: &[f32], weight: &[f32], rows: usize, h: usize, eps: f32) -> Vec<f64> {
    assert_eq!(x.len(), rows * h, "rmsnorm: x length");
    assert_eq!(weight.len(), h, "rmsnorm: weight length");
    let mut y = vec![0.0f64; rows * h];
    for (yr, xr) in y.chunks_exact_mut(h.max(1)).zip(x.chunks_exact(h.max(1))) {
        let ms = xr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / h as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((o, v), w) in yr.iter_mut().zip(xr).zip(weight) {
            *o = *v as f64 * inv * *w as f64;
        }
    }
    y
}

/// LayerNorm in f64 over row-major `rows×h` (biased variance, as `torch.nn.LayerNorm`):
/// `y = (x − mean) / sqrt(var + eps) · weight + bias`.
pub fn layernorm(
    x: &[f32],
    weight: &[f32],
    bias: &[f32],
    rows: usize,
    h: usize,
    eps: f32,
) -> Vec<f64> {
    assert_eq!(x.len(), rows * h, "layernorm: x length");
    assert_eq!(weight.len(), h, "layernorm: weight length");
    assert_eq!(bias.len(), h, "layernorm: bias length");
    let mut y = vec![0.0f64; rows * h];
    for (yr, xr) in y.chunks_exact_mut(h.max(1)).zip(x.chunks_exact(h.max(1))) {
        let mean = xr.iter().map(|v| *v as f64).sum::<f64>() / h as f64;
        let var = xr.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / h as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (((o, v), w), b) in yr.iter_mut().zip(xr).zip(weight).zip(bias) {
            *o = (*v as f64 - mean) * inv * *w as f64 + *b as f64;
        }
    }
    y
}

/// Logistic sigmoid in f64.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Rotary embedding in f64 of token-major `x [tokens, heads·head_dim]` with `cos`, `sin`
/// `[tokens, rot_dim/2]`: in each head, dims `rot_offset..rot_offset + rot_dim` rotate pairwise
/// by frequency `i` — pairs `(i, i + rot_dim/2)` (half-split) or `(2i, 2i + 1)` (interleaved,
/// written back in place) — `(a, b) → (a·cos − b·sin, b·cos + a·sin)`; the rest are copied.
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    tokens: usize,
    head_dim: usize,
    rot_offset: usize,
    rot_dim: usize,
    interleaved: bool,
) -> Vec<f64> {
    let half = rot_dim / 2;
    assert!(
        rot_offset + rot_dim <= head_dim,
        "rope: span outside the head"
    );
    assert_eq!(cos.len(), tokens * half, "rope: cos length");
    assert_eq!(sin.len(), tokens * half, "rope: sin length");
    let width = x.len() / tokens.max(1);
    let mut y: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    for t in 0..tokens {
        for h in 0..width / head_dim {
            let base = t * width + h * head_dim + rot_offset;
            for i in 0..half {
                let (ia, ib) = if interleaved {
                    (base + 2 * i, base + 2 * i + 1)
                } else {
                    (base + i, base + half + i)
                };
                let (a, b) = (x[ia] as f64, x[ib] as f64);
                let (c, s) = (cos[t * half + i] as f64, sin[t * half + i] as f64);
                y[ia] = a * c - b * s;
                y[ib] = b * c + a * s;
            }
        }
    }
    y
}

/// A host model of a paged KV-cache append: `pool` (`[pages·page_size, width]`, row-major) after
/// row `i` of `new` is written at token position `start + i` through `block_table`.
pub fn kv_cache_append(
    pool: &[f32],
    new: &[f32],
    width: usize,
    block_table: &[usize],
    start: usize,
    page_size: usize,
) -> Vec<f64> {
    let mut out: Vec<f64> = pool.iter().map(|v| *v as f64).collect();
    for (i, row) in new.chunks_exact(width.max(1)).enumerate() {
        let pos = start + i;
        let dst = (block_table[pos / page_size] * page_size + pos % page_size) * width;
        for (o, v) in out[dst..dst + width].iter_mut().zip(row) {
            *o = *v as f64;
        }
    }
    out
}

/// Token embedding in f64: row `ids[t]` of the row-major `table [_, h]` for each token.
pub fn embedding(ids: &[i32], table: &[f32], h: usize) -> Vec<f64> {
    ids.iter()
        .flat_map(|id| table[*id as usize * h..(*id as usize + 1) * h].iter())
        .map(|v| *v as f64)
        .collect()
}

/// `x[t, :] + b` in f64 for row-major `x [T, N]` and `b [N]` (a bias row).
pub fn add_bias(x: &[f32], b: &[f32]) -> Vec<f64> {
    assert!(
        !b.is_empty() && x.len().is_multiple_of(b.len()),
        "add_bias: lengths"
    );
    x.chunks(b.len())
        .flat_map(|row| row.iter().zip(b).map(|(x, b)| *x as f64 + *b as f64))
        .collect()
}

/// Element-wise `a + b` in f64.
pub fn add(a: &[f32], b: &[f32]) -> Vec<f64> {
    assert_eq!(a.len(), b.len(), "add: lengths");
    a.iter()
        .zip(b)
        .map(|(x, y)| *x as f64 + *y as f64)
        .collect()
}

/// Element-wise `x · σ(gate)` in f64 (same shapes).
pub fn sigmoid_mul(gate: &[f32], x: &[f32]) -> Vec<f64> {
    assert_eq!(gate.len(), x.len(), "sigmoid_mul: lengths");
    gate.iter()
        .zip(x)
        .map(|(g, v)| *v as f64 * sigmoid(*g as f64))
        .collect()
}

/// `x[t, :] · σ(gate[t])` in f64 for row-major `x [gate.len(), cols]`.
pub fn sigmoid_mul_col(gate: &[f32], x: &[f32], cols: usize) -> Vec<f64> {
    assert_eq!(x.len(), gate.len() * cols, "sigmoid_mul_col: x length");
    x.chunks_exact(cols.max(1))
        .zip(gate)
        .flat_map(|(row, g)| {
            let s = sigmoid(*g as f64);
            row.iter().map(move |v| *v as f64 * s)
        })
        .collect()
}

/// `x[t, :] · s[t]` in f64 for row-major `x [s.len(), cols]`.
pub fn mul_col(s: &[f32], x: &[f32], cols: usize) -> Vec<f64> {
    assert_eq!(x.len(), s.len() * cols, "mul_col: x length");
    x.chunks_exact(cols.max(1))
        .zip(s)
        .flat_map(|(row, v)| row.iter().map(move |e| *e as f64 * *v as f64))
        .collect()
}

/// erf(x) in f64 to ~1e-15: its Taylor series for |x| < 3, else 1 − erfc(|x|) from the continued
/// fraction erfc(x) = e^(−x²)/√π · 1/(x + ½/(x + 1/(x + (3/2)/(x + …)))) (std has no erf).
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let v = if a < 3.0 {
        // Σ (−1)ⁿ x^(2n+1) / (n! (2n+1)) · 2/√π; terms fall below 1e-17 of the sum by n = 60.
        let (mut term, mut sum) = (a, a);
        for n in 1..80 {
            term *= -a * a / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        let mut f = a;
        for k in (1..=80).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
    };
    v.copysign(x)
}

/// GELU in f64: exact `x·Φ(x)`, or with `approximate` the tanh form
/// `½x(1 + tanh(√(2/π)(x + 0.044715x³)))` (torch's `gelu(approximate="tanh")`).
pub fn gelu(x: &[f32], approximate: bool) -> Vec<f64> {
    x.iter()
        .map(|v| {
            let v = *v as f64;
            if approximate {
                let u = (2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v);
                0.5 * v * (1.0 + u.tanh())
            } else {
                0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2))
            }
        })
        .collect()
}

/// `y = x · wᵀ + bias` in f64 (a linear layer with bias, weight `[n, k]`), x `m×k`.
pub fn linear_bias(x: &[f32], w: &[f32], bias: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    assert_eq!(bias.len(), n, "linear_bias: bias length");
    let mut y = linear(x, w, m, n, k);
    for row in y.chunks_exact_mut(n.max(1)) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += *b as f64;
        }
    }
    y
}
