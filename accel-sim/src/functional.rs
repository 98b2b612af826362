//! Functional semantics of the tile instructions: what each one computes, on the host, with SIMD.
//!
//! On-chip tiles hold their elements as `f32` whatever their logical dtype (bf16, f16 and the FP8/FP4
//! formats are exactly representable in f32); the logical dtype decides rounding (see [`round_to`])
//! and byte accounting. All kernels here are written over `wide::f32x8` (the matrix multiply over
//! `wide::f32x16` where AVX-512 is available) so that the functional backend runs at host-BLAS
//! speed, and they are deterministic: the same inputs give the same bits
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

// ---------------------------------------------------------------------------------------------
// Matrix multiply (the matrix unit's functional semantics).
//
// BLAS-style: B is packed into column panels of `NR` columns (`k` rows of `NR` contiguous lanes,
// zero-padded), and an `MR×NR` register-blocked micro-kernel walks `MR` rows of A (read in place,
// one broadcast per element) against one B panel, k ascending. Row blocks are the outer loop: the
// `MR` rows of A stay in L1 across the panels, the packed panels stream sequentially, and the next
// C block is the next cache lines of the same C rows (hardware-prefetched). Measured faster than
// panels-outer, packing A, or software-prefetching C.
//
// With AVX-512 (the native target of this workspace's CI machines) the micro-kernel is 8×32 on
// `f32x16` (16 accumulators, 32 vector registers); otherwise 6×16 on `f32x8` (12 accumulators, 16
// registers).
//
// Determinism: every output element is `c + Σ_p a[i,p]·b[p,j]`, summed with fused multiply-add in
// ascending `p`, whatever the tile shape, edge handling or caller's split of the work. Padding lanes
// (zeros) only ever feed discarded outputs.
// ---------------------------------------------------------------------------------------------

#[cfg(target_feature = "avx512f")]
mod mk {
    pub type V = wide::f32x16;
    pub const VL: usize = 16;
    pub const MR: usize = 8;
}
#[cfg(not(target_feature = "avx512f"))]
mod mk {
    pub type V = wide::f32x8;
    pub const VL: usize = 8;
    pub const MR: usize = 6;
}
use mk::{MR, V, VL};
/// Columns of a packed B panel: two vectors.
const NR: usize = 2 * VL;

/// One packed row of a B panel: `NR` columns as two vectors.
type BRow = [V; 2];

thread_local! {
    /// Per-thread packing buffer, reused across calls.
    static PACK: std::cell::RefCell<PackedB> = std::cell::RefCell::new(PackedB::default());
}

/// How the B operand is laid out in memory.
#[derive(Clone, Copy)]
enum BLayout {
    /// `k×n` row-major.
    RowMajor,
    /// `n×k` row-major (the product uses its transpose).
    Transposed,
}

/// A read-only row-major matrix operand of the matrix multiply: `rows` rows of `cols` elements,
/// row `r` starting `r·stride` elements after the first. A tile's own buffer (`stride = cols`), or
/// a window of a larger memory read in place (`stride` = the memory's row pitch), so a tile
/// loaded from device memory can feed the matrix unit without first being copied out.
///
/// Only the `cols` elements of each row are ever read (never the gap between rows, which may
/// belong to someone else).
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    ptr: *const f32,
    stride: usize,
    rows: usize,
    cols: usize,
    _borrow: std::marker::PhantomData<&'a [f32]>,
}

impl<'a> MatRef<'a> {
    /// The first `rows·cols` elements of `s`, row-major.
    ///
    /// # Panics
    /// If `s` holds fewer than `rows·cols` elements.
    pub fn dense(s: &'a [f32], rows: usize, cols: usize) -> MatRef<'a> {
        MatRef::strided(s, cols, rows, cols)
    }

    /// A window of `s`: `rows` rows of `cols` elements, `stride` apart, from `s[0]`.
    ///
    /// # Panics
    /// If `cols > stride` (with more than one row) or the last row passes the end of `s`.
    pub fn strided(s: &'a [f32], stride: usize, rows: usize, cols: usize) -> MatRef<'a> {
        let end = match rows {
            0 => Some(0),
            _ => (rows - 1)
                .checked_mul(stride)
                .and_then(|e| e.checked_add(cols)),
        };
        assert!(
            (rows <= 1 || cols <= stride) && end.is_some_and(|e| e <= s.len()),
            "MatRef::strided: {rows}x{cols} at pitch {stride} does not fit a slice of {}",
            s.len()
        );
        MatRef {
            ptr: s.as_ptr(),
            stride,
            rows,
            cols,
            _borrow: std::marker::PhantomData,
        }
    }

    /// A window of `rows` rows of `cols` elements, `stride` apart, from `ptr`.
    ///
    /// # Safety
    /// For `'a`, every row's `cols` elements (`ptr + r·stride ..`, `r < rows`) must be valid for
    /// reads and must not be written by anyone.
    pub unsafe fn from_raw(ptr: *const f32, stride: usize, rows: usize, cols: usize) -> MatRef<'a> {
        MatRef {
            ptr,
            stride,
            rows,
            cols,
            _borrow: std::marker::PhantomData,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r`.
    ///
    /// # Panics
    /// If `r` is not a row.
    #[inline]
    pub fn row(&self, r: usize) -> &'a [f32] {
        assert!(r < self.rows, "MatRef::row {r} of {}", self.rows);
        // SAFETY: row `r` is one of the rows the constructor vouched for (`dense` checked the
        // slice holds it), for `'a`.
        unsafe { std::slice::from_raw_parts(self.ptr.add(r * self.stride), self.cols) }
    }
}

/// `c[m×n] += a[m×k] · b[k×n]`, all row-major, f32 accumulation.
///
/// Packed, register-blocked micro-kernel (8×32 with AVX-512, else 6×16). Within one output element
/// the k-sum is always in ascending order with fused multiply-adds, so results do not depend on
/// how the caller splits the work.
pub fn mma_f32(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize) {
    assert!(
        c.len() >= m * n && a.len() >= m * k && b.len() >= k * n,
        "mma_f32: slice too short"
    );
    mma_f32_ref(c, MatRef::dense(a, m, k), MatRef::dense(b, k, n));
}

/// `c[m×n] += a[m×k] · b[n×k]ᵀ` (B given row-major as n×k, e.g. keys in attention).
///
/// Same summation order as [`mma_f32`] on the transposed B (B is transposed while packing).
pub fn mma_f32_bt(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize) {
    assert!(
        c.len() >= m * n && a.len() >= m * k && b.len() >= k * n,
        "mma_f32_bt: slice too short"
    );
    mma_f32_bt_ref(c, MatRef::dense(a, m, k), MatRef::dense(b, n, k));
}

/// [`mma_f32`] on operands read in place: `c[m×n] += a · b` with `a` m×k and `b` k×n
/// (`c` row-major, dense). The same bits as [`mma_f32`] on dense copies of `a` and `b`.
///
/// # Panics
/// If `c` holds fewer than `m·n` elements or the inner dimensions differ (checked by
/// [`mma_f32_packed`], which it packs B for).
pub fn mma_f32_ref(c: &mut [f32], a: MatRef<'_>, b: MatRef<'_>) {
    mma_packed(c, a, b, BLayout::RowMajor);
}

/// [`mma_f32_bt`] on operands read in place: `c[m×n] += a · bᵀ` with `a` m×k and `b` n×k.
///
/// # Panics
/// If `c` holds fewer than `m·n` elements or the inner dimensions differ (checked by
/// [`mma_f32_packed`]).
pub fn mma_f32_bt_ref(c: &mut [f32], a: MatRef<'_>, b: MatRef<'_>) {
    mma_packed(c, a, b, BLayout::Transposed);
}

fn mma_packed(c: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, layout: BLayout) {
    PACK.with(|cell| {
        let mut packed = cell.borrow_mut();
        packed.pack_as(b, layout);
        mma_f32_packed(c, a, &packed);
    });
}

/// The B operand of a matrix multiply packed for the micro-kernel: `⌈n/NR⌉` column panels of
/// `k` rows of `NR` lanes (zero-padded past `n`). Packing once and multiplying many times is how
/// BLAS amortises it; a caller that multiplies the same B by several A's (programs of one
/// launch reading the same weight window) can keep one (see [`mma_f32_packed`]).
#[derive(Default)]
pub struct PackedB {
    panels: Vec<BRow>,
    k: usize,
    n: usize,
}

impl PackedB {
    /// `b` (k×n, row-major) packed.
    pub fn new(b: MatRef<'_>) -> PackedB {
        let mut p = PackedB::default();
        p.pack_as(b, BLayout::RowMajor);
        p
    }

    /// `bᵀ` packed, for `b` given n×k (as [`mma_f32_bt`] takes it).
    pub fn new_transposed(b: MatRef<'_>) -> PackedB {
        let mut p = PackedB::default();
        p.pack_as(b, BLayout::Transposed);
        p
    }

    /// Repacks this buffer with `b` laid out as `layout`.
    fn pack_as(&mut self, b: MatRef<'_>, layout: BLayout) {
        let (k, n) = match layout {
            BLayout::RowMajor => (b.rows, b.cols),
            BLayout::Transposed => (b.cols, b.rows),
        };
        pack_b(&mut self.panels, b, n, k, layout);
        (self.k, self.n) = (k, n);
    }

    /// Host bytes it holds.
    pub fn bytes(&self) -> usize {
        self.panels.len() * std::mem::size_of::<BRow>()
    }
}

/// `c[m×n] += a · b` with `a` m×k read in place and `b` packed ([`PackedB`], k×n); `c`
/// row-major, dense. The same bits as [`mma_f32`] on the same values.
///
/// # Panics
/// If `c` holds fewer than `m·n` elements or the inner dimensions differ.
pub fn mma_f32_packed(c: &mut [f32], a: MatRef<'_>, b: &PackedB) {
    let (m, k, n) = (a.rows, b.k, b.n);
    assert!(
        a.cols == k && c.len() >= m * n,
        "mma_f32_packed: a {m}x{}, b {k}x{n}, c of {}",
        a.cols,
        c.len()
    );
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    for i0 in (0..m).step_by(MR) {
        let mr = MR.min(m - i0);
        // A is read in place: MR row slices of length k. Past the last row a ragged block
        // repeats its first row: those accumulators are never stored.
        let rows: [&[f32]; MR] = std::array::from_fn(|i| a.row(i0 + if i < mr { i } else { 0 }));
        for jp in 0..n.div_ceil(NR) {
            let bp = &b.panels[jp * k..(jp + 1) * k];
            let j0 = jp * NR;
            let nc = NR.min(n - j0);
            let mut acc = [[V::ZERO; 2]; MR];
            load_c(&mut acc, c, n, i0, j0, mr, nc);
            micro(&mut acc, &rows, bp);
            store_c(&acc, c, n, i0, j0, mr, nc);
        }
    }
}

/// The `MR×NR` micro-kernel: `acc += A-rows · bp` over the `k` packed steps, k ascending.
#[inline(always)]
fn micro(acc: &mut [[V; 2]; MR], rows: &[&[f32]; MR], bp: &[BRow]) {
    let k = bp.len();
    // Every row has length k (checked once here, so the loop below has no bounds checks).
    let rows: [&[f32]; MR] = std::array::from_fn(|i| &rows[i][..k]);
    let mut r = *acc;
    for (p, y) in bp.iter().enumerate() {
        let (b0, b1) = (y[0], y[1]);
        for i in 0..MR {
            let s = V::splat(rows[i][p]);
            r[i][0] = s.mul_add(b0, r[i][0]);
            r[i][1] = s.mul_add(b1, r[i][1]);
        }
    }
    *acc = r;
}

/// Loads the `mr×nc` block of C at (`i0`, `j0`) into the accumulators (the rest stays zero).
#[inline(always)]
fn load_c(acc: &mut [[V; 2]; MR], c: &[f32], n: usize, i0: usize, j0: usize, mr: usize, nc: usize) {
    for (i, row) in acc.iter_mut().enumerate().take(mr) {
        let src = &c[(i0 + i) * n + j0..(i0 + i) * n + j0 + nc];
        if nc == NR {
            row[0] = V::new(src[..VL].try_into().expect("VL lanes"));
            row[1] = V::new(src[VL..].try_into().expect("VL lanes"));
        } else {
            let mut t = [0.0f32; NR];
            t[..nc].copy_from_slice(src);
            row[0] = V::new(t[..VL].try_into().expect("VL lanes"));
            row[1] = V::new(t[VL..].try_into().expect("VL lanes"));
        }
    }
}

/// Stores the `mr×nc` valid part of the accumulators back to C.
#[inline(always)]
fn store_c(
    acc: &[[V; 2]; MR],
    c: &mut [f32],
    n: usize,
    i0: usize,
    j0: usize,
    mr: usize,
    nc: usize,
) {
    for (i, row) in acc.iter().enumerate().take(mr) {
        let dst = &mut c[(i0 + i) * n + j0..(i0 + i) * n + j0 + nc];
        if nc == NR {
            dst[..VL].copy_from_slice(row[0].as_array());
            dst[VL..].copy_from_slice(row[1].as_array());
        } else {
            let mut t = [0.0f32; NR];
            t[..VL].copy_from_slice(row[0].as_array());
            t[VL..].copy_from_slice(row[1].as_array());
            dst.copy_from_slice(&t[..nc]);
        }
    }
}

/// Packs B into `ceil(n/NR)` panels of `k` rows of `NR` columns (zero-padded past `n`).
fn pack_b(out: &mut Vec<BRow>, b: MatRef<'_>, n: usize, k: usize, layout: BLayout) {
    let panels = n.div_ceil(NR);
    out.clear();
    out.resize(panels * k, [V::ZERO; 2]);
    match layout {
        BLayout::RowMajor => {
            // Row by row, so each source row (often a window of a wider matrix, rows a page
            // apart) is read front to back once, its panels' pieces scattered to their panels.
            for p in 0..k {
                let row = b.row(p);
                for jp in 0..panels {
                    let j0 = jp * NR;
                    let t: [f32; NR] = match row.get(j0..j0 + NR) {
                        Some(full) => full.try_into().expect("NR lanes"),
                        None => {
                            let mut t = [0.0f32; NR];
                            t[..n - j0].copy_from_slice(&row[j0..n]);
                            t
                        }
                    };
                    out[jp * k + p] = bytemuck::cast::<[f32; NR], BRow>(t);
                }
            }
        }
        BLayout::Transposed => {
            for jp in 0..panels {
                let j0 = jp * NR;
                let nc = NR.min(n - j0);
                // Column j of the product's B is row j of the given n×k matrix.
                let cols: [&[f32]; NR] =
                    std::array::from_fn(|jj| if jj < nc { b.row(j0 + jj) } else { &[] });
                for (p, dst) in out[jp * k..(jp + 1) * k].iter_mut().enumerate() {
                    let mut t = [0.0f32; NR];
                    for (jj, col) in cols.iter().enumerate().take(nc) {
                        t[jj] = col[p];
                    }
                    *dst = bytemuck::cast::<[f32; NR], BRow>(t);
                }
            }
        }
    }
}

/// `dst[c×r] = src[r×c]ᵀ`.
pub fn transpose(dst: &mut [f32], src: &[f32], r: usize, c: usize) {
    assert!(
        dst.len() >= r * c && src.len() >= r * c,
        "transpose: slice too short"
    );
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
    /// x·Φ(x) = ½x(1 + erf(x/√2)), the exact GELU (`nn.GELU()`); erf to ~1.2e-7 relative
    /// ([`erfc_abs`]).
    Gelu,
    /// ½x(1 + tanh(√(2/π)(x + 0.044715x³))), the tanh GELU (`gelu_pytorch_tanh`), computed as
    /// x·σ(2√(2/π)(x + 0.044715x³)) (the same function: ½(1 + tanh u) = σ(2u)).
    GeluTanh,
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
                | Unary::Gelu
                | Unary::GeluTanh
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
            Unary::Gelu => {
                // ½x·erfc(−x/√2): for x ≥ 0, 2 − erfc(|z|); for x < 0, erfc(|z|) (no cancellation
                // on the negative tail, where GELU is small).
                let c = erfc_abs(x * f32x8::splat(std::f32::consts::FRAC_1_SQRT_2));
                let two = f32x8::splat(2.0);
                let e = x.simd_ge(f32x8::ZERO).select(two - c, c);
                f32x8::splat(0.5) * x * e
            }
            Unary::GeluTanh => {
                const K: f32 = 2.0 * 0.797_884_6; // 2·√(2/π)
                let u = f32x8::splat(K) * (x + f32x8::splat(0.044_715) * x * x * x);
                x / (one + (-u).exp())
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

/// erfc(|z|) to ~1.2e-7 relative error (Numerical Recipes' Chebyshev fit, `erfcc`): enough for
/// an f32 GELU, and one exp per element as the vector unit's transcendental pass.
#[inline(always)]
fn erfc_abs(z: f32x8) -> f32x8 {
    const C: [f32; 10] = [
        -1.265_512_2,
        1.000_023_7,
        0.374_091_96,
        0.096_784_18,
        -0.186_288_06,
        0.278_868_07,
        -1.135_204,
        1.488_515_9,
        -0.822_152_23,
        0.170_872_77,
    ];
    let a = z.abs();
    let t = f32x8::splat(1.0) / (f32x8::splat(1.0) + f32x8::splat(0.5) * a);
    let mut poly = f32x8::splat(C[9]);
    for c in C[..9].iter().rev() {
        poly = poly * t + f32x8::splat(*c);
    }
    t * (poly - a * a).exp()
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

/// Dequantizes a symmetric group-scaled INT4 tile (compressed-tensors' `pack-quantized` W4A16, as
/// Kimi-K2-Thinking's experts store it): `packed` holds `rows × cols/2` bytes, two 4-bit codes
/// each (element `2j` in the low nibble of byte `j`, the little-endian order of the format's
/// int32 words), a code `q` meaning the integer `q − 8`; `scales` holds `rows × cols/group` scales,
/// one per `group` consecutive elements of a row. Returns `(q − 8) · scale` rounded to `dtype`.
/// `cols` must be even and a multiple of `group`. The semantics of the DSL's `dequant_int4`.
pub fn dequant_int4(
    packed: &[f32],
    scales: &[f32],
    rows: usize,
    cols: usize,
    group: usize,
    dtype: DType,
) -> Vec<f32> {
    let (cb, cs) = (cols / 2, cols / group.max(1));
    let mut out = vec![0.0f32; rows * cols];
    for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
        for (c, x) in row.iter_mut().enumerate() {
            let byte = packed[r * cb + c / 2] as u8;
            let code = if c % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            *x = (i32::from(code) - 8) as f32 * scales[r * cs + c / group];
        }
    }
    round_to(&mut out, dtype);
    out
}

/// Dequantizes an MXFP4 tile: `blocks` holds `rows × cols/2` bytes (two E2M1 codes each, low
/// nibble first) and `scales` `rows × cols/32` E8M0 scales (each byte as the f32 the front ends
/// hold); returns `rows × cols` values rounded to `dtype`. A NaN scale (0xFF) makes its 32
/// elements NaN. `cols` must be a multiple of 32. The semantics of the DSL's `dequant_mxfp4` and of
/// the manual API's.
pub fn dequant_mxfp4(
    blocks: &[f32],
    scales: &[f32],
    rows: usize,
    cols: usize,
    dtype: DType,
) -> Vec<f32> {
    let (cb, cs) = (cols / 2, cols / 32);
    let mut out = vec![0.0f32; rows * cols];
    let bytes: Vec<u8> = blocks.iter().map(|v| *v as u8).collect();
    for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
        crate::formats::fp4::decode_e2m1_packed(&bytes[r * cb..(r + 1) * cb], row);
        for (g, chunk) in row.chunks_exact_mut(32).enumerate() {
            let scale = crate::formats::e8m0::decode(scales[r * cs + g] as u8);
            chunk.iter_mut().for_each(|x| *x *= scale);
        }
    }
    round_to(&mut out, dtype);
    out
}

/// Rounds every element to the nearest value of `dtype` (round-to-nearest-even); f32 is unchanged.
///
/// bf16 and f16 round here; the FP8/FP4 formats round in [`crate::formats`] (SIMD, exact), with
/// [`Overflow::Saturate`](crate::formats::Overflow::Saturate): a value beyond the format's largest
/// finite magnitude (or ±inf) becomes ±max (E4M3 ±448, E5M2 ±57344, E2M1 ±6). That is what
/// accelerators' conversion instructions do (`cvt.satfinite`, torch's E4M3 cast), and it keeps
/// the on-chip `f32` stand-in a value of the format; NaN stays NaN (so poisoned data stays
/// visible, also for E2M1, which has no NaN of its own).
pub fn round_to(x: &mut [f32], dtype: DType) {
    use crate::formats::{fp4, fp8, Overflow};
    match dtype {
        DType::F32 | DType::I32 | DType::U8 => {}
        DType::Bf16 => round_bf16(x),
        DType::F16 => {
            for v in x.iter_mut() {
                *v = half::f16::from_f32(*v).to_f32();
            }
        }
        DType::Fp8e4m3 => fp8::round_e4m3_slice(x, Overflow::Saturate),
        DType::Fp8e5m2 => fp8::round_e5m2_slice(x, Overflow::Saturate),
        DType::Fp4e2m1 => fp4::round_e2m1_slice(x, Overflow::Saturate),
    }
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

    /// Scalar model of the required order: `c = fma(a[i,p], b[p,j], c)` for p ascending.
    #[cfg(target_feature = "fma")]
    fn mma_fma_order(c: &mut [f32], a: &[f32], b: &[f32], m: usize, n: usize, k: usize) {
        for i in 0..m {
            for j in 0..n {
                let mut acc = c[i * n + j];
                for p in 0..k {
                    acc = a[i * k + p].mul_add(b[p * n + j], acc);
                }
                c[i * n + j] = acc;
            }
        }
    }

    fn rnd_vec(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    // Bit-exactness against scalar `f32::mul_add` needs the SIMD multiply-add to be fused too
    // (always the case with this workspace's `target-cpu=native` on FMA machines).
    #[cfg(target_feature = "fma")]
    proptest! {
        /// Bit-exact against the ascending-k fused order, whatever the shape (edges included),
        /// and splitting K into two calls gives the same bits.
        #[test]
        fn mma_is_ascending_k_fma(m in 1usize..70, n in 1usize..70, k in 1usize..50, split in 0usize..50, seed in any::<u64>()) {
            let a = rnd_vec(m * k, seed);
            let b = rnd_vec(k * n, seed ^ 0x9E37);
            let c0 = rnd_vec(m * n, seed ^ 0x51);
            let mut want = c0.clone();
            mma_fma_order(&mut want, &a, &b, m, n, k);
            let mut got = c0.clone();
            mma_f32(&mut got, &a, &b, m, n, k);
            prop_assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
            // K split in two calls: [0, k1) then [k1, k).
            let k1 = split.min(k);
            let a1: Vec<f32> = (0..m).flat_map(|i| a[i * k..i * k + k1].to_vec()).collect();
            let a2: Vec<f32> = (0..m).flat_map(|i| a[i * k + k1..(i + 1) * k].to_vec()).collect();
            let mut got2 = c0.clone();
            mma_f32(&mut got2, &a1, &b[..k1 * n], m, n, k1);
            mma_f32(&mut got2, &a2, &b[k1 * n..], m, n, k - k1);
            prop_assert!(got2.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    proptest! {
        /// `mma_f32_bt` equals `mma_f32` on the explicitly transposed B, bit for bit.
        #[test]
        fn mma_bt_matches_transpose(m in 1usize..50, n in 1usize..70, k in 1usize..50, seed in any::<u64>()) {
            let a = rnd_vec(m * k, seed);
            let bt = rnd_vec(n * k, seed ^ 0x77);
            let mut b = vec![0.0f32; k * n];
            transpose(&mut b, &bt, n, k);
            let mut want = vec![0.0f32; m * n];
            mma_f32(&mut want, &a, &b, m, n, k);
            let mut got = vec![0.0f32; m * n];
            mma_f32_bt(&mut got, &a, &bt, m, n, k);
            prop_assert!(got.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
    }

    proptest! {
        /// Operands read in place from windows of wider matrices (`mma_f32_ref`,
        /// `mma_f32_bt_ref`) and a B packed ahead (`mma_f32_packed`) give the bits of
        /// `mma_f32` / `mma_f32_bt` on dense copies.
        #[test]
        fn in_place_and_packed_operands_match_dense(m in 1usize..40, n in 1usize..70, k in 1usize..40, pad_a in 0usize..9, pad_b in 0usize..9, off in 0usize..5, seed in any::<u64>()) {
            let (lda, ldb, ldbt) = (k + pad_a, n + pad_b, k + pad_b);
            let wide_a = rnd_vec(off + m * lda, seed);
            let wide_b = rnd_vec(off + k * ldb, seed ^ 0x3);
            let wide_bt = rnd_vec(off + n * ldbt, seed ^ 0x5);
            let dense = |w: &[f32], ld: usize, r: usize, c: usize| -> Vec<f32> {
                (0..r).flat_map(|i| w[off + i * ld..off + i * ld + c].to_vec()).collect()
            };
            let (a, b, bt) = (dense(&wide_a, lda, m, k), dense(&wide_b, ldb, k, n), dense(&wide_bt, ldbt, n, k));
            let ar = MatRef::strided(&wide_a[off..], lda, m, k);
            let br = MatRef::strided(&wide_b[off..], ldb, k, n);
            let btr = MatRef::strided(&wide_bt[off..], ldbt, n, k);
            let c0 = rnd_vec(m * n, seed ^ 0x7);
            let same = |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits());

            let mut want = c0.clone();
            mma_f32(&mut want, &a, &b, m, n, k);
            let mut got = c0.clone();
            mma_f32_ref(&mut got, ar, br);
            prop_assert!(same(&got, &want));
            let mut got = c0.clone();
            mma_f32_packed(&mut got, ar, &PackedB::new(br));
            prop_assert!(same(&got, &want));

            let mut want = c0.clone();
            mma_f32_bt(&mut want, &a, &bt, m, n, k);
            let mut got = c0.clone();
            mma_f32_bt_ref(&mut got, ar, btr);
            prop_assert!(same(&got, &want));
            let mut got = c0.clone();
            mma_f32_packed(&mut got, ar, &PackedB::new_transposed(btr));
            prop_assert!(same(&got, &want));
        }
    }

    #[cfg(target_feature = "fma")]
    #[test]
    fn mma_tile_sizes_bit_exact() {
        for &(m, n, k) in &[(128, 128, 64), (64, 256, 32), (256, 64, 128), (16, 16, 16)] {
            let a = rnd_vec(m * k, 3);
            let b = rnd_vec(k * n, 5);
            let mut want = vec![0.0f32; m * n];
            mma_fma_order(&mut want, &a, &b, m, n, k);
            let mut got = vec![0.0f32; m * n];
            mma_f32(&mut got, &a, &b, m, n, k);
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{m}x{n}x{k}"
            );
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
