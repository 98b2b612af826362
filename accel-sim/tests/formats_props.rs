//! Properties of the formats layer, checked against brute force rather than against the code's
//! own arithmetic:
//! - `decode(encode(x))` is the representable value nearest to `x`, ties to the even code
//!   (found by scanning every code), for random in-range `x`; overflow follows the chosen policy;
//! - the SIMD in-`f32` rounding equals `decode(encode(x))` for any `f32` (NaN, inf, subnormals);
//! - MX quantize → dequantize: each element is the nearest element value times the block scale,
//!   and MXFP4's per-block error stays within the bound stated in `formats::mx`.

use accel_sim::formats::mx::{shared_scale, MxElem, MxTensor, MX_BLOCK};
use accel_sim::formats::{e8m0, fp4, fp8, Overflow};
use proptest::prelude::*;

/// The three small formats, with what the properties need to know about each.
#[derive(Clone, Copy, Debug)]
enum Fmt {
    E4M3,
    E5M2,
    E2M1,
}

impl Fmt {
    fn encode(self, x: f32, ovf: Overflow) -> u8 {
        match self {
            Fmt::E4M3 => fp8::encode_e4m3(x, ovf),
            Fmt::E5M2 => fp8::encode_e5m2(x, ovf),
            Fmt::E2M1 => fp4::encode_e2m1(x, ovf),
        }
    }
    fn decode(self, c: u8) -> f32 {
        match self {
            Fmt::E4M3 => fp8::decode_e4m3(c),
            Fmt::E5M2 => fp8::decode_e5m2(c),
            Fmt::E2M1 => fp4::decode_e2m1(c),
        }
    }
    fn codes(self) -> u32 {
        match self {
            Fmt::E2M1 => 16,
            _ => 256,
        }
    }
    fn max(self) -> f32 {
        match self {
            Fmt::E4M3 => 448.0,
            Fmt::E5M2 => 57344.0,
            Fmt::E2M1 => 6.0,
        }
    }
    /// Exponent of the largest finite value.
    fn emax(self) -> i32 {
        match self {
            Fmt::E4M3 => 8,
            Fmt::E5M2 => 15,
            Fmt::E2M1 => 2,
        }
    }
    /// A few binades below the smallest subnormal (everything there rounds to ±0 or the
    /// smallest subnormal).
    fn elow(self) -> i32 {
        match self {
            Fmt::E4M3 => -12,
            Fmt::E5M2 => -19,
            Fmt::E2M1 => -3,
        }
    }
    fn round(self, x: &mut [f32], ovf: Overflow) {
        match self {
            Fmt::E4M3 => fp8::round_e4m3_slice(x, ovf),
            Fmt::E5M2 => fp8::round_e5m2_slice(x, ovf),
            Fmt::E2M1 => fp4::round_e2m1_slice(x, ovf),
        }
    }
}

/// Brute force: the finite value nearest to `x` (|x| ≤ max), ties to the code with an even
/// mantissa; a zero result carries `x`'s sign.
fn nearest(f: Fmt, x: f32) -> f32 {
    let xd = x as f64;
    let mut best: Option<(f64, u32, f32)> = None;
    for c in 0..f.codes() {
        let v = f.decode(c as u8);
        if !v.is_finite() {
            continue;
        }
        let d = (xd - v as f64).abs();
        let better = match best {
            None => true,
            Some((bd, bc, _)) => d < bd || (d == bd && bc & 1 == 1 && c & 1 == 0),
        };
        if better {
            best = Some((d, c, v));
        }
    }
    let v = best.expect("finite codes").2;
    if v == 0.0 {
        if x.is_sign_negative() {
            -0.0
        } else {
            0.0
        }
    } else {
        v
    }
}

fn same(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// A random f32 spread over binades around a format's range: sign · (1 + m/2^23) · 2^e.
fn spread(emin: i32, emax: i32) -> impl Strategy<Value = f32> {
    (any::<bool>(), emin..=emax, 0u32..(1 << 23)).prop_map(|(neg, e, m)| {
        let v = (1.0 + m as f64 / (1u64 << 23) as f64) * 2f64.powi(e);
        (if neg { -v } else { v }) as f32
    })
}

fn fmt() -> impl Strategy<Value = Fmt> {
    prop_oneof![Just(Fmt::E4M3), Just(Fmt::E5M2), Just(Fmt::E2M1)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// decode(encode(x)) is the nearest representable value, ties to even, subnormals included.
    #[test]
    fn encode_is_round_to_nearest_even((f, x) in fmt().prop_flat_map(|f| (Just(f), spread(f.elow(), f.emax())))) {
        prop_assume!(x.abs() <= f.max());
        for ovf in [Overflow::Saturate, Overflow::NanOrInf] {
            let got = f.decode(f.encode(x, ovf));
            let want = nearest(f, x);
            prop_assert!(same(got, want), "{f:?} {x:e}: got {got:e}, nearest {want:e}");
        }
    }

    /// Exact ties (midpoints between neighbours) go to the even code.
    #[test]
    fn ties_go_to_even(f in fmt(), c in 0u8..=255, neg in any::<bool>()) {
        let half = (f.codes() / 2) as u8; // codes per sign
        let c = c % (half - 1);
        let (a, b) = (f.decode(c), f.decode(c + 1));
        prop_assume!(a.is_finite() && b.is_finite() && b <= f.max());
        let mid = ((a as f64 + b as f64) / 2.0) as f32; // exact: a few bits only
        let x = if neg { -mid } else { mid };
        let got = f.encode(x, Overflow::NanOrInf);
        let want = if c & 1 == 0 { c } else { c + 1 };
        prop_assert_eq!(got & (half - 1), want, "{:?} tie {:e}", f, x);
    }

    /// Overflow follows the policy: saturate → ±max; NanOrInf → NaN (E4M3), ±inf (E5M2), ±6 (E2M1),
    /// exactly from the point where RNE would leave the finite range.
    #[test]
    fn overflow_follows_the_policy((f, x) in fmt().prop_flat_map(|f| (Just(f), spread(f.emax(), 40)))) {
        prop_assume!(x.abs() > f.max());
        let sat = f.decode(f.encode(x, Overflow::Saturate));
        prop_assert_eq!(sat, f.max().copysign(x));
        let raw = f.decode(f.encode(x, Overflow::NanOrInf));
        match f {
            // 464 is the tie between 448 (even code 0x7E) and the NaN slot: it stays 448.
            Fmt::E4M3 if x.abs() <= 464.0 => prop_assert_eq!(raw, 448f32.copysign(x)),
            Fmt::E4M3 => prop_assert!(raw.is_nan()),
            // 61440 is the tie between 57344 (odd code 0x7B) and inf (0x7C, even): inf.
            Fmt::E5M2 if x.abs() < 61440.0 => prop_assert_eq!(raw, 57344f32.copysign(x)),
            Fmt::E5M2 => prop_assert_eq!(raw, f32::INFINITY.copysign(x)),
            Fmt::E2M1 => prop_assert_eq!(raw, 6f32.copysign(x)),
        }
    }

    /// The SIMD rounding kept in f32 agrees with decode(encode(x)) for every f32, any length.
    #[test]
    fn simd_rounding_equals_decode_encode(
        f in fmt(),
        xs in prop::collection::vec(prop_oneof![proptest::num::f32::ANY, spread(-30, 20)], 0..40),
        sat in any::<bool>(),
    ) {
        let ovf = if sat { Overflow::Saturate } else { Overflow::NanOrInf };
        let mut r = xs.clone();
        f.round(&mut r, ovf);
        for (x, got) in xs.iter().zip(&r) {
            if x.is_nan() {
                prop_assert!(got.is_nan());
            } else {
                let want = f.decode(f.encode(*x, ovf));
                prop_assert!(same(*got, want), "{:?} {:e}: simd {:e}, scalar {:e}", f, x, got, want);
            }
        }
    }

    /// E8M0: powers of two round-trip; encoding is monotone.
    #[test]
    fn e8m0_round_trips_powers_of_two(e in -127i32..=127, x in spread(-126, 126), y in spread(-126, 126)) {
        let b = e8m0::from_exponent(e).expect("in range");
        prop_assert_eq!(e8m0::decode(b) as f64, 2f64.powi(e));
        prop_assert_eq!(e8m0::encode(e8m0::decode(b), Overflow::NanOrInf), b);
        let (x, y) = (x.abs(), y.abs());
        let (lo, hi) = if x <= y { (x, y) } else { (y, x) };
        prop_assert!(e8m0::encode(lo, Overflow::NanOrInf) <= e8m0::encode(hi, Overflow::NanOrInf));
    }

    /// MX: every element is the nearest element value (saturating) times the block scale, and the
    /// scale is 2^(floor(log2 amax) − emax).
    #[test]
    fn mx_elements_are_nearest_times_scale(
        elem in prop_oneof![Just(MxElem::Fp4E2M1), Just(MxElem::Fp8E4M3), Just(MxElem::Fp8E5M2)],
        rows in 1usize..4,
        cols in 1usize..100,
        mag in -100i32..100,
        seed in any::<u64>(),
    ) {
        let x = random_values(rows * cols, mag, seed);
        let t = MxTensor::quantize("x", &x, &[rows, cols], elem).expect("quantize");
        let y = t.dequantize();
        let table: Vec<f64> = (0..if elem == MxElem::Fp4E2M1 { 16 } else { 256 })
            .map(|c| elem.decode(c as u8) as f64)
            .filter(|v| v.is_finite())
            .collect();
        let g = cols.div_ceil(MX_BLOCK);
        for r in 0..rows {
            for (b, blk) in x[r * cols..(r + 1) * cols].chunks(MX_BLOCK).enumerate() {
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let s = t.scales[r * g + b];
                prop_assert_eq!(s, shared_scale(amax, elem));
                let xs = e8m0::decode(s) as f64;
                if amax > 0.0 {
                    let unclamped = (amax as f64).log2().floor() as i32 - elem.emax();
                    if unclamped >= -127 {
                        prop_assert_eq!(s as i32 - 127, unclamped);
                    }
                }
                for (i, v) in blk.iter().enumerate() {
                    let a = (*v as f64 / xs).abs().min(elem.max() as f64);
                    let nearest_dist = table.iter().map(|t| (a - t).abs()).fold(f64::INFINITY, f64::min);
                    let over = (*v as f64 / xs).abs() - a; // saturation error (scaled), 0 if none
                    let err = (*v as f64 - y[r * cols + b * MX_BLOCK + i] as f64).abs();
                    prop_assert_eq!(err, (nearest_dist + over) * xs, "elem {:?} value {:e}", elem, v);
                }
            }
        }
    }

    /// MXFP4 error bound (see `formats::mx`): with block scale X, an element is off by at most
    /// X/4 below 2X, X/2 below 4X, X up to 6X, and |v| − 6X (< 2X) above; per block the error is
    /// at most 2X ≤ amax/2, and at most X ≤ amax/4 when no element exceeds 6X.
    #[test]
    fn mxfp4_error_within_bound(cols in 1usize..130, mag in -100i32..100, seed in any::<u64>()) {
        let x = random_values(cols, mag, seed);
        let t = MxTensor::quantize("w", &x, &[1, cols], MxElem::Fp4E2M1).expect("quantize");
        let y = t.dequantize();
        for (b, blk) in x.chunks(MX_BLOCK).enumerate() {
            let xs = e8m0::decode(t.scales[b]) as f64;
            let amax = blk.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
            let mut block_err = 0f64;
            for (i, v) in blk.iter().enumerate() {
                let a = (*v as f64).abs() / xs;
                let err = (*v as f64 - y[b * MX_BLOCK + i] as f64).abs();
                let bound = if a < 2.0 { 0.25 * xs } else if a < 4.0 { 0.5 * xs } else if a <= 6.0 { xs } else { (a - 6.0) * xs };
                prop_assert!(err <= bound, "value {:e}: error {:e} > bound {:e} (scale {:e})", v, err, bound, xs);
                block_err = block_err.max(err);
            }
            prop_assert!(block_err <= 2.0 * xs && block_err <= amax / 2.0);
            if amax <= 6.0 * xs {
                prop_assert!(block_err <= xs && block_err <= amax / 4.0);
            }
        }
    }
}

/// Deterministic pseudo-random values: mostly normal-ish around 2^mag, some exact zeros, some
/// spread over ±8 binades (so blocks have a real dynamic range).
fn random_values(n: usize, mag: i32, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|_| {
            let r = next();
            if r % 17 == 0 {
                return 0.0;
            }
            let u = (r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            let spread = ((next() % 17) as i32) - 8;
            (u * 2f64.powi(mag + spread)) as f32
        })
        .collect()
}

#[test]
fn mx_special_blocks() {
    // amax 7 → scale 1 (E2M1 emax 2: floor(log2 7) − 2 = 0) and 7 saturates to 6.
    let mut x = vec![0.5f32; 32];
    x[3] = 7.0;
    let t = MxTensor::quantize("x", &x, &[32], MxElem::Fp4E2M1).unwrap();
    assert_eq!(t.scales, vec![e8m0::ONE]);
    assert_eq!(t.dequantize()[3], 6.0);
    // All-zero block: scale 0x00 (2^−127), zeros back.
    let t = MxTensor::quantize("x", &[0.0; 40], &[40], MxElem::Fp8E4M3).unwrap();
    assert_eq!(t.scales, vec![0, 0]);
    assert!(t.dequantize().iter().all(|v| *v == 0.0));
    // NaN or inf anywhere → NaN scale → the whole block NaN; the other block is untouched.
    let mut x = vec![1.0f32; 64];
    x[40] = f32::NEG_INFINITY;
    x[5] = f32::NAN;
    for elem in [MxElem::Fp4E2M1, MxElem::Fp8E4M3, MxElem::Fp8E5M2] {
        let t = MxTensor::quantize("x", &x, &[64], elem).unwrap();
        assert_eq!(t.scales, vec![e8m0::NAN, e8m0::NAN]);
        assert!(t.dequantize().iter().all(|v| v.is_nan()));
    }
    let mut x = vec![1.0f32; 64];
    x[40] = f32::NAN;
    let t = MxTensor::quantize("x", &x, &[64], MxElem::Fp4E2M1).unwrap();
    let y = t.dequantize();
    assert!(y[..32].iter().all(|v| *v == 1.0) && y[32..].iter().all(|v| v.is_nan()));
    // Tiny blocks clamp the scale at 2^−127 and lose what E2M1 cannot hold.
    let t = MxTensor::quantize("x", &[1e-40, -3e-39], &[2], MxElem::Fp4E2M1).unwrap();
    assert_eq!(t.scales, vec![0]);
    // 1e-40 / 2^−127 ≈ 0.017 → 0; −3e-39 / 2^−127 ≈ −0.51 → −0.5, i.e. −2^−128.
    assert_eq!(t.dequantize(), vec![0.0, -f32::from_bits(0x0020_0000)]);
}

#[test]
fn fp8_block_quant_round_trips_within_e4m3_precision() {
    use accel_sim::formats::packing::{fp8_block_dequant, fp8_block_quant};
    let (rows, cols) = (130, 300); // ragged edge blocks of 2 rows and 44 columns
    let x = random_values(rows * cols, 0, 7);
    let q = fp8_block_quant("w", &x, &[rows, cols], 128).unwrap();
    assert_eq!(q.scale_shape, [2, 3]);
    let y = fp8_block_dequant(
        "w",
        &q.weight,
        &[rows, cols],
        &q.scale_inv,
        &q.scale_shape,
        128,
    )
    .unwrap();
    for i in 0..rows {
        for j in 0..cols {
            let s = q.scale_inv[(i / 128) * 3 + j / 128] as f64;
            let (v, w) = (x[i * cols + j] as f64, y[i * cols + j] as f64);
            // Half an E4M3 ulp (2^−4 relative for normals, 2^−10 · s absolute for subnormals),
            // with a little room for the f32 division x / s before rounding.
            let bound = (v.abs() * 2f64.powi(-4)).max(s * 2f64.powi(-10)) * 1.001;
            assert!((v - w).abs() <= bound, "[{i}, {j}]: {v:e} → {w:e}");
        }
    }
}

#[test]
fn round_to_uses_the_formats_layer_saturating() {
    use accel_sim::functional::round_to;
    use accel_sim::DType;
    let x = vec![
        0.0,
        -0.0,
        1e-9,
        0.3,
        1.0625,
        3.3,
        5.0,
        7.0,
        300.0,
        464.0,
        465.0,
        1e6,
        -1e6,
        60000.0,
        1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    type Enc = fn(f32, Overflow) -> u8;
    type Dec = fn(u8) -> f32;
    let cases: [(DType, Enc, Dec); 3] = [
        (DType::Fp8e4m3, fp8::encode_e4m3, fp8::decode_e4m3),
        (DType::Fp8e5m2, fp8::encode_e5m2, fp8::decode_e5m2),
        (DType::Fp4e2m1, fp4::encode_e2m1, fp4::decode_e2m1),
    ];
    for (dt, enc, dec) in cases {
        let mut y = x.clone();
        round_to(&mut y, dt);
        for (a, b) in x.iter().zip(&y) {
            if a.is_nan() {
                assert!(b.is_nan(), "{dt}: NaN stays NaN");
            } else {
                assert!(
                    same(*b, dec(enc(*a, Overflow::Saturate))),
                    "{dt}: {a:e} → {b:e}"
                );
                assert!(b.is_finite(), "{dt}: saturating policy: {a:e} → {b:e}");
            }
        }
    }
}
