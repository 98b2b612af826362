//! E8M0: the OCP MX shared scale. Eight exponent bits, no sign, no mantissa, no zero, no
//! infinity: byte `b` is `2^(b − 127)` for `b` in `0..=254` (so `0x00` is 2^−127, `0x7F` is 1,
//! `0xFE` is 2^127) and `0xFF` is NaN.
//!
//! 2^−127 is a subnormal `f32`, so every non-NaN scale is exactly representable in `f32`.
//!
//! Encoding from `f32` follows ml_dtypes' `float8_e8m0fnu` cast (so golden data compares bit for
//! bit): a normal positive `x = m · 2^e` (1 ≤ m < 2) becomes `e + 127`, plus one when `m ≥ 1.5`
//! (the tie `m = 1.5` rounds up: with no mantissa bits, the bit that decides a tie is the implicit
//! 1). Below 2^−126 ml_dtypes rounds as if code 0 were zero: values above 2^−127 become `0x01`,
//! the rest `0x00`. MX quantization does not go through this rounding: it
//! computes the exponent directly (see [`super::mx`]).

use super::Overflow;

/// The NaN code.
pub const NAN: u8 = 0xFF;
/// The exponent bias: byte `b` means `2^(b − BIAS)`.
pub const BIAS: i32 = 127;
/// The code of 1.0.
pub const ONE: u8 = 127;

/// Decodes one scale byte: `2^(b − 127)`, or NaN for `0xFF`.
#[inline]
pub fn decode(b: u8) -> f32 {
    match b {
        NAN => f32::NAN,
        // 2^−127 is subnormal: mantissa bit 22 with a zero exponent field.
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits((b as u32) << 23),
    }
}

/// Decodes a slice of scale bytes into `dst`.
pub fn decode_slice(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "e8m0::decode_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = decode(*s);
    }
}

/// Encodes an unbiased exponent `e` (the scale `2^e`) if it is in range `−127..=127`.
#[inline]
pub fn from_exponent(e: i32) -> Option<u8> {
    if (-BIAS..=BIAS).contains(&e) {
        Some((e + BIAS) as u8)
    } else {
        None
    }
}

/// The unbiased exponent of a scale byte (`None` for NaN).
#[inline]
pub fn exponent(b: u8) -> Option<i32> {
    if b == NAN {
        None
    } else {
        Some(b as i32 - BIAS)
    }
}

/// Encodes `x` as the nearest power of two (see the module docs for the rounding).
///
/// Values with no E8M0 counterpart: NaN → `0xFF`; zero, negative values and −inf → `0xFF` under
/// [`Overflow::NanOrInf`] (as ml_dtypes) or `0x00` (the smallest scale) under
/// [`Overflow::Saturate`]; values that round past 2^127, and +inf, → `0xFF` or `0xFE`.
pub fn encode(x: f32, ovf: Overflow) -> u8 {
    let bits = x.to_bits();
    if x.is_nan() {
        return NAN;
    }
    let sat = ovf == Overflow::Saturate;
    if bits >> 31 != 0 || x == 0.0 {
        return if sat { 0 } else { NAN };
    }
    if x.is_infinite() {
        return if sat { 254 } else { NAN };
    }
    let fexp = (bits >> 23) as i32;
    if fexp == 0 {
        // Below 2^−126 (f32 subnormals), ml_dtypes rounds on an IEEE-style grid whose step is
        // 2^−126 (as if code 0 were zero): above the midpoint 2^−127 goes up to code 1, the rest
        // (the tie 2^−127 included, to the even code) to code 0, which decodes as 2^−127.
        return if x > f32::from_bits(0x0040_0000) {
            1
        } else {
            0
        };
    }
    // x = (1 + f) · 2^e; the top fraction bit tells whether the significand is ≥ 1.5.
    let biased = fexp + (bits & 0x40_0000 != 0) as i32;
    if biased >= 255 {
        if sat {
            254
        } else {
            NAN
        }
    } else {
        biased as u8
    }
}

/// Encodes a slice.
pub fn encode_slice(src: &[f32], dst: &mut [u8], ovf: Overflow) {
    assert_eq!(src.len(), dst.len(), "e8m0::encode_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = encode(*s, ovf);
    }
}
