//! Functional semantics of the tile instructions: what each one computes, on the host, with SIMD.
//!
//! On-chip tiles hold their elements as `f32` whatever their logical dtype (bf16, f16 and the FP8/FP4
//! formats are exactly representable in f32); the logical dtype decides rounding (see [`round_to`])
//! and byte accounting. All kernels here are written over `wide::f32x8` so that the functional
//! backend runs at host-BLAS speed, and they are deterministic: the same inputs give the same bits
//! on any thread count (no data-dependent reduction order).

use crate::dtype::DType;
use wide::f32x8;

const L: usize = 8;

#[inline(always)]
fn ld(s: &[f32], i: usize) -> f32x8 {
    let arr: [f32; L] = s[i..i + L].try_into().expect("8 lanes");
    f32x8::new(arr)
}

#[inline(always)]
fn st(d: &mut [f32], i: usize, v: f32x8) {
    d[i..i + L].copy_from_slice(&v.to_array());
}

/// `c[m×n] += a[m×k] · b[k×n]`, all row-major, f32 accumulation.
///
/// Register-blocked 4×16 micro-kernel (8 accumulators of 8 lanes), B rows streamed contiguously.
/// Within one output element the k-sum is always in ascending order, so results do not depend on
/// how the caller splits the work.
pub fn mma_f32(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize) {
    assert!(
        c.len() >= m * n && a.len() >= m * k && b.len() >= k * n,
        "mma_f32: slice too short"
    );
    const MR: usize = 4;
    const NR: usize = 16;
    let n_main = n - n % NR;
    let m_main = m - m % MR;
    let mut i = 0;
    while i < m_main {
        let mut j = 0;
        while j < n_main {
            micro_4x16(c, a, b, i, j, n, k);
            j += NR;
        }
        if j < n {
            for r in i..i + MR {
                row_tail(c, a, b, r, j, n, k);
            }
        }
        i += MR;
    }
    for r in m_main..m {
        let mut j = 0;
        while j + L <= n {
            let mut acc = ld(c, r * n + j);
            for p in 0..k {
                acc = f32x8::splat(a[r * k + p]).mul_add(ld(b, p * n + j), acc);
            }
            st(c, r * n + j, acc);
            j += L;
        }
        if j < n {
            row_tail(c, a, b, r, j, n, k);
        }
    }
}

#[inline(always)]
fn micro_4x16(c: &mut [f32], a: &[f32], b: &[f32], i: usize, j: usize, n: usize, k: usize) {
    let (r0, r1, r2, r3) = (i * n + j, (i + 1) * n + j, (i + 2) * n + j, (i + 3) * n + j);
    let mut c00 = ld(c, r0);
    let mut c01 = ld(c, r0 + L);
    let mut c10 = ld(c, r1);
    let mut c11 = ld(c, r1 + L);
    let mut c20 = ld(c, r2);
    let mut c21 = ld(c, r2 + L);
    let mut c30 = ld(c, r3);
    let mut c31 = ld(c, r3 + L);
    let (a0, a1, a2, a3) = (
        &a[i * k..],
        &a[(i + 1) * k..],
        &a[(i + 2) * k..],
        &a[(i + 3) * k..],
    );
    for p in 0..k {
        let bp = p * n + j;
        let b0 = ld(b, bp);
        let b1 = ld(b, bp + L);
        let x0 = f32x8::splat(a0[p]);
        c00 = x0.mul_add(b0, c00);
        c01 = x0.mul_add(b1, c01);
        let x1 = f32x8::splat(a1[p]);
        c10 = x1.mul_add(b0, c10);
        c11 = x1.mul_add(b1, c11);
        let x2 = f32x8::splat(a2[p]);
        c20 = x2.mul_add(b0, c20);
        c21 = x2.mul_add(b1, c21);
        let x3 = f32x8::splat(a3[p]);
        c30 = x3.mul_add(b0, c30);
        c31 = x3.mul_add(b1, c31);
    }
    st(c, r0, c00);
    st(c, r0 + L, c01);
    st(c, r1, c10);
    st(c, r1 + L, c11);
    st(c, r2, c20);
    st(c, r2 + L, c21);
    st(c, r3, c30);
    st(c, r3 + L, c31);
}

/// Columns `j..n` of row `r`, scalar, same ascending-k order (uses fused multiply-add like the SIMD path).
fn row_tail(c: &mut [f32], a: &[f32], b: &[f32], r: usize, j: usize, n: usize, k: usize) {
    for col in j..n {
        let mut acc = c[r * n + col];
        for p in 0..k {
            acc = a[r * k + p].mul_add(b[p * n + col], acc);
        }
        c[r * n + col] = acc;
    }
}

/// `c[m×n] += a[m×k] · b[n×k]ᵀ` (B given row-major as n×k, e.g. keys in attention).
pub fn mma_f32_bt(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize) {
    let mut bt = vec![0.0f32; k * n];
    transpose(&mut bt, b, n, k);
    mma_f32(c, a, &bt, m, n, k);
}

/// `dst[c×r] = src[r×c]ᵀ`.
pub fn transpose(dst: &mut [f32], src: &[f32], r: usize, c: usize) {
    const B: usize = 16;
    for i0 in (0..r).step_by(B) {
        for j0 in (0..c).step_by(B) {
            for i in i0..(i0 + B).min(r) {
                for j in j0..(j0 + B).min(c) {
                    dst[j * r + i] = src[i * c + j];
                }
            }
        }
    }
}

/// Element-wise unary operations of the vector unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unary {
    /// −x
    Neg,
    /// |x|
    Abs,
    /// eˣ
    Exp,
    /// ln x
    Ln,
    /// √x
    Sqrt,
    /// 1/√x
    Rsqrt,
    /// 1/x
    Recip,
    /// x²
    Square,
    /// max(x, 0)
    Relu,
    /// 1/(1+e⁻ˣ)
    Sigmoid,
    /// x·σ(x)
    Silu,
    /// ln(1+eˣ), overflow-safe
    Softplus,
}

impl Unary {
    /// Whether the op costs a transcendental-unit pass in the timing model.
    pub fn is_transcendental(self) -> bool {
        matches!(
            self,
            Unary::Exp
                | Unary::Ln
                | Unary::Sqrt
                | Unary::Rsqrt
                | Unary::Recip
                | Unary::Sigmoid
                | Unary::Silu
                | Unary::Softplus
        )
    }

    #[inline(always)]
    fn simd(self, x: f32x8) -> f32x8 {
        let one = f32x8::splat(1.0);
        match self {
            Unary::Neg => -x,
            Unary::Abs => x.abs(),
            Unary::Exp => x.exp(),
            Unary::Ln => x.ln(),
            Unary::Sqrt => x.sqrt(),
            Unary::Rsqrt => one / x.sqrt(),
            Unary::Recip => one / x,
            Unary::Square => x * x,
            Unary::Relu => x.max(f32x8::ZERO),
            Unary::Sigmoid => one / (one + (-x).exp()),
            Unary::Silu => x / (one + (-x).exp()),
            Unary::Softplus => {
                // ln(1+e^x) = max(x,0) + ln(1+e^-|x|): no overflow for large |x|.
                x.max(f32x8::ZERO) + (one + (-x.abs()).exp()).ln()
            }
        }
    }

    /// Scalar form, used for ragged tails (same formulas as the SIMD form).
    pub fn scalar(self, x: f32) -> f32 {
        let mut arr = [0.0f32; L];
        arr[0] = x;
        self.simd(f32x8::new(arr)).to_array()[0]
    }
}

/// Element-wise binary operations of the vector unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binary {
    /// a + b
    Add,
    /// a − b
    Sub,
    /// a · b
    Mul,
    /// a / b
    Div,
    /// max(a, b) (NaN-propagating)
    Max,
    /// min(a, b) (NaN-propagating)
    Min,
}

impl Binary {
    #[inline(always)]
    fn simd(self, a: f32x8, b: f32x8) -> f32x8 {
        match self {
            Binary::Add => a + b,
            Binary::Sub => a - b,
            Binary::Mul => a * b,
            Binary::Div => a / b,
            Binary::Max => nan_max(a, b),
            Binary::Min => -nan_max(-a, -b),
        }
    }

    /// Scalar form (same semantics as the SIMD form).
    pub fn scalar(self, a: f32, b: f32) -> f32 {
        let mut x = [0.0f32; L];
        let mut y = [0.0f32; L];
        x[0] = a;
        y[0] = b;
        self.simd(f32x8::new(x), f32x8::new(y)).to_array()[0]
    }
}

/// max that propagates NaN from either side (so a NaN never silently disappears).
#[inline(always)]
fn nan_max(a: f32x8, b: f32x8) -> f32x8 {
    let m = a.max(b);
    let a_nan = a.is_nan();
    let b_nan = b.is_nan();
    let m = a_nan.bitselect(a, m);
    b_nan.bitselect(b, m)
}

/// `out[i] = op(x[i])`.
pub fn unary(out: &mut [f32], x: &[f32], op: Unary) {
    let n = x.len();
    let mut i = 0;
    while i + L <= n {
        st(out, i, op.simd(ld(x, i)));
        i += L;
    }
    for t in i..n {
        out[t] = op.scalar(x[t]);
    }
}

/// `out[i] = op(a[i], b[i])`.
pub fn binary(out: &mut [f32], a: &[f32], b: &[f32], op: Binary) {
    let n = a.len();
    let mut i = 0;
    while i + L <= n {
        st(out, i, op.simd(ld(a, i), ld(b, i)));
        i += L;
    }
    for t in i..n {
        out[t] = op.scalar(a[t], b[t]);
    }
}

/// `out[i] = op(a[i], s)` with a scalar right operand.
pub fn binary_scalar(out: &mut [f32], a: &[f32], s: f32, op: Binary) {
    let n = a.len();
    let sv = f32x8::splat(s);
    let mut i = 0;
    while i + L <= n {
        st(out, i, op.simd(ld(a, i), sv));
        i += L;
    }
    for t in i..n {
        out[t] = op.scalar(a[t], s);
    }
}

/// `out[r][c] = op(a[r][c], v[c])`: a row vector broadcast down the rows of an `rows×cols` tile.
pub fn binary_row_bcast(out: &mut [f32], a: &[f32], v: &[f32], cols: usize, op: Binary) {
    for (o, x) in out.chunks_exact_mut(cols).zip(a.chunks_exact(cols)) {
        binary(o, x, v, op);
    }
}

/// `out[r][c] = op(a[r][c], v[r])`: a column vector broadcast across the columns.
pub fn binary_col_bcast(out: &mut [f32], a: &[f32], v: &[f32], cols: usize, op: Binary) {
    for ((o, x), s) in out.chunks_exact_mut(cols).zip(a.chunks_exact(cols)).zip(v) {
        binary_scalar(o, x, *s, op);
    }
}

/// Reductions of the vector unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduce {
    /// Σ
    Sum,
    /// max (NaN-propagating)
    Max,
    /// min (NaN-propagating)
    Min,
}

impl Reduce {
    fn identity(self) -> f32 {
        match self {
            Reduce::Sum => 0.0,
            Reduce::Max => f32::NEG_INFINITY,
            Reduce::Min => f32::INFINITY,
        }
    }
    fn combine(self) -> Binary {
        match self {
            Reduce::Sum => Binary::Add,
            Reduce::Max => Binary::Max,
            Reduce::Min => Binary::Min,
        }
    }
}

/// Reduces each row of an `rows×cols` tile: `out[r] = reduce(a[r][..])`.
///
/// Fixed association order: 8 lane-wise partials over the row, then lanes 0..8 in order, then the
/// tail in order.
pub fn reduce_rows(out: &mut [f32], a: &[f32], cols: usize, op: Reduce) {
    let comb = op.combine();
    for (o, row) in out.iter_mut().zip(a.chunks_exact(cols)) {
        let mut acc = f32x8::splat(op.identity());
        let mut i = 0;
        while i + L <= cols {
            acc = comb.simd(acc, ld(row, i));
            i += L;
        }
        let mut s = op.identity();
        for v in acc.to_array() {
            s = comb.scalar(s, v);
        }
        for v in &row[i..] {
            s = comb.scalar(s, *v);
        }
        *o = s;
    }
}

/// Reduces each column of an `rows×cols` tile: `out[c] = reduce(a[..][c])` (rows in order).
pub fn reduce_cols(out: &mut [f32], a: &[f32], cols: usize, op: Reduce) {
    out[..cols].fill(op.identity());
    let comb = op.combine();
    let mut tmp = vec![0.0f32; cols];
    for row in a.chunks_exact(cols) {
        binary(&mut tmp, &out[..cols], row, comb);
        out[..cols].copy_from_slice(&tmp);
    }
}

/// Rounds every element to the nearest value of `dtype` (round-to-nearest-even); f32 is unchanged.
///
/// bf16 and f16 round here; the FP8/FP4 formats are implemented in their own modules.
pub fn round_to(x: &mut [f32], dtype: DType) {
    match dtype {
        DType::F32 | DType::I32 | DType::U8 => {}
        DType::Bf16 => round_bf16(x),
        DType::F16 => {
            for v in x.iter_mut() {
                *v = half::f16::from_f32(*v).to_f32();
            }
        }
        DType::Fp8e4m3 | DType::Fp8e5m2 | DType::Fp4e2m1 => {
            // The FP8/FP4 encoders belong to the formats layer; until they land, refuse loudly.
            unimplemented_format(dtype)
        }
    }
}

#[cold]
fn unimplemented_format(dtype: DType) {
    panic!("rounding to {dtype} is provided by the formats module");
}

/// RNE to bf16 with the integer trick, 8 lanes at a time; NaN stays NaN (quietened).
pub fn round_bf16(x: &mut [f32]) {
    use wide::u32x8;
    let n = x.len();
    let mut i = 0;
    let bias = u32x8::splat(0x7FFF);
    let one = u32x8::splat(1);
    let mask = u32x8::splat(0xFFFF_0000);
    while i + L <= n {
        let v = ld(x, i);
        let bits: u32x8 = bytemuck::cast(v);
        let lsb = (bits >> 16) & one;
        let rounded: u32x8 = (bits + bias + lsb) & mask;
        let r: f32x8 = bytemuck::cast(rounded);
        // NaN inputs: keep them NaN (the add above could carry into the exponent of a NaN payload).
        let out = v.is_nan().bitselect(f32x8::splat(f32::NAN), r);
        st(x, i, out);
        i += L;
    }
    for v in &mut x[i..] {
        *v = half::bf16::from_f32(*v).to_f32();
    }
}

/// Whether any element is greater than `limit` (used by hazard checks on poisoned memory).
pub fn any_gt(x: &[f32], limit: f32) -> bool {
    let lim = f32x8::splat(limit);
    let mut i = 0;
    while i + L <= x.len() {
        if ld(x, i).simd_gt(lim).any() {
            return true;
        }
        i += L;
    }
    x[i..].iter().any(|v| *v > limit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn mma_ref(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
        let mut c = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for p in 0..k {
                    c[i * n + j] += a[i * k + p] as f64 * b[p * n + j] as f64;
                }
            }
        }
        c
    }

    proptest! {
        #[test]
        fn mma_matches_f64(m in 1usize..40, n in 1usize..40, k in 1usize..40, seed in any::<u64>()) {
            let mut s = seed | 1;
            let mut rnd = || { s ^= s << 13; s ^= s >> 7; s ^= s << 17; ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 };
            let a: Vec<f32> = (0..m * k).map(|_| rnd()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rnd()).collect();
            let mut c = vec![0.0f32; m * n];
            mma_f32(&mut c, &a, &b, m, n, k);
            let r = mma_ref(&a, &b, m, n, k);
            for (x, y) in c.iter().zip(&r) {
                prop_assert!((*x as f64 - y).abs() <= 1e-5 * (k as f64).sqrt() + 1e-6 * y.abs(), "{x} vs {y}");
            }
        }

        #[test]
        fn bf16_rounding_matches_half(x in any::<f32>()) {
            let mut v = vec![x; 9];
            round_bf16(&mut v);
            let want = half::bf16::from_f32(x).to_f32();
            for y in v {
                prop_assert!(y.to_bits() == want.to_bits() || (y.is_nan() && want.is_nan()), "{x}: {y} vs {want}");
            }
        }
    }

    #[test]
    fn max_propagates_nan() {
        let a = [1.0, f32::NAN, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
        let mut out = [0.0];
        reduce_rows(&mut out, &a, 9, Reduce::Max);
        assert!(out[0].is_nan());
    }
}
