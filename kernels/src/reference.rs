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
    (want.iter().map(|v| v * v).sum::<f64>() / n).sqrt().max(f64::MIN_POSITIVE)
}
