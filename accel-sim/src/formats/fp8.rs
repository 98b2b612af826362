//! OCP 8-bit floats (OFP8): E4M3 "fn" and E5M2.
//!
//! | | E4M3 (fn) | E5M2 |
//! |---|---|---|
//! | exponent bias | 7 | 15 |
//! | largest finite | 448 (`0x7E`) | 57344 (`0x7B`) |
//! | smallest normal | 2^−6 | 2^−14 |
//! | smallest subnormal | 2^−9 | 2^−16 |
//! | infinity | none | `0x7C` / `0xFC` |
//! | NaN | `0x7F` / `0xFF` only | `0x7D..=0x7F` / `0xFD..=0xFF` |
//!
//! Decoding goes through 256-entry tables (exact, and the fastest thing on a host: one load per
//! element). Encoding is exact integer RNE ([`encode_e4m3`]); rounding tiles that stay in `f32`
//! uses the SIMD path ([`round_e4m3_slice`]), which agrees with `decode(encode(x))` for every `x`.
//!
//! With [`Overflow::NanOrInf`] the results are ml_dtypes' `float8_e4m3fn` / `float8_e5m2` casts:
//! for E4M3, any |x| > 464 rounds past 448 and becomes NaN, while 464 itself is a tie that goes
//! to the even code 448 (`0x7E`); for E5M2, |x| ≥ 61440 becomes ±inf (the tie between 57344,
//! `0x7B`, and infinity, `0x7C`, goes to the even code).

use super::minifloat::{Spec, Specials};
use super::Overflow;

pub(crate) const E4M3: Spec = Spec {
    bits: 8,
    man_bits: 3,
    bias: 7,
    max_code: 0x7E,
    max: 448.0,
    emax: 8,
    specials: Specials::FnNanOnlyAllOnes,
};

pub(crate) const E5M2: Spec = Spec {
    bits: 8,
    man_bits: 2,
    bias: 15,
    max_code: 0x7B,
    max: 57344.0,
    emax: 15,
    specials: Specials::Ieee,
};

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Largest finite E5M2 magnitude.
pub const E5M2_MAX: f32 = 57344.0;
/// The canonical E4M3 NaN code (positive); `0xFF` is the negative one.
pub const E4M3_NAN: u8 = 0x7F;
/// E5M2 +infinity.
pub const E5M2_INF: u8 = 0x7C;
/// The E5M2 quiet NaN code our encoder writes for a positive NaN (what ml_dtypes writes).
pub const E5M2_NAN: u8 = 0x7E;

/// Every E4M3 code decoded (NaN codes → quiet NaN with the code's sign).
pub static E4M3_TABLE: [f32; 256] = E4M3.table::<256>();
/// Every E5M2 code decoded.
pub static E5M2_TABLE: [f32; 256] = E5M2.table::<256>();

/// Decodes one E4M3 code.
#[inline]
pub fn decode_e4m3(code: u8) -> f32 {
    E4M3_TABLE[code as usize]
}

/// Decodes one E5M2 code.
#[inline]
pub fn decode_e5m2(code: u8) -> f32 {
    E5M2_TABLE[code as usize]
}

/// Encodes `x` as E4M3: RNE, subnormals exact, overflow and ±inf per `ovf`, NaN → `0x7F`/`0xFF`
/// (sign kept).
#[inline]
pub fn encode_e4m3(x: f32, ovf: Overflow) -> u8 {
    E4M3.encode(x, ovf)
}

/// Encodes `x` as E5M2: RNE, subnormals exact, overflow and ±inf per `ovf`, NaN → `0x7E`/`0xFE`.
#[inline]
pub fn encode_e5m2(x: f32, ovf: Overflow) -> u8 {
    E5M2.encode(x, ovf)
}

/// Decodes a slice of E4M3 codes into `dst` (table lookup). Panics if the lengths differ (a
/// programming error, not bad data).
pub fn decode_e4m3_slice(src: &[u8], dst: &mut [f32]) {
    decode_with(&E4M3_TABLE, src, dst);
}

/// Decodes a slice of E5M2 codes into `dst` (table lookup).
pub fn decode_e5m2_slice(src: &[u8], dst: &mut [f32]) {
    decode_with(&E5M2_TABLE, src, dst);
}

/// Encodes a slice as E4M3 codes.
pub fn encode_e4m3_slice(src: &[f32], dst: &mut [u8], ovf: Overflow) {
    assert_eq!(src.len(), dst.len(), "encode_e4m3_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = E4M3.encode(*s, ovf);
    }
}

/// Encodes a slice as E5M2 codes.
pub fn encode_e5m2_slice(src: &[f32], dst: &mut [u8], ovf: Overflow) {
    assert_eq!(src.len(), dst.len(), "encode_e5m2_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = E5M2.encode(*s, ovf);
    }
}

/// Rounds every element to the nearest E4M3 value in place (kept as `f32`; SIMD); NaN stays NaN.
pub fn round_e4m3_slice(x: &mut [f32], ovf: Overflow) {
    E4M3.round_slice(x, ovf);
}

/// Rounds every element to the nearest E5M2 value in place (kept as `f32`; SIMD); NaN stays NaN.
pub fn round_e5m2_slice(x: &mut [f32], ovf: Overflow) {
    E5M2.round_slice(x, ovf);
}

pub(crate) fn decode_with(table: &[f32; 256], src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "decode: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = table[*s as usize];
    }
}
