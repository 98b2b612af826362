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
