//! OCP FP4 E2M1: sign, 2 exponent bits (bias 1), 1 mantissa bit; no infinity, no NaN.
//!
//! Codes 0–7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; codes 8–15 their negatives (8 is −0). Code 1 (0.5)
//! is the only subnormal.
//!
//! Because the format has neither infinity nor NaN:
//! - overflow (|x| > 6, or ±inf) gives ±6 under both [`Overflow`] policies (`NanOrInf` has
//!   nothing else to give; this is also what ml_dtypes does);
//! - a NaN input encodes as `0b1000` (−0) for +NaN and `0b0000` for −NaN, as ml_dtypes does (the
//!   OCP MX spec leaves NaN conversion implementation-defined). In an MX block this never shows:
//!   a NaN anywhere in the block makes the block's scale NaN, and the whole block decodes as NaN.
//!   [`round_e2m1_slice`], which keeps values as `f32`, leaves NaN as NaN so that poisoned data
//!   is still visible downstream.
//!
//! Packed storage puts two codes in a byte, **low nibble first** (element 2k in bits 0–3,
//! element 2k+1 in bits 4–7), as gpt-oss checkpoints and the OCP MX layout do.

use super::minifloat::{Spec, Specials};
use super::Overflow;

pub(crate) const E2M1: Spec = Spec {
    bits: 4,
    man_bits: 1,
    bias: 1,
    max_code: 0x7,
    max: 6.0,
    emax: 2,
    specials: Specials::None,
};

/// Largest finite E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Every E2M1 code decoded: `[0, 0.5, 1, 1.5, 2, 3, 4, 6, −0, −0.5, …, −6]`.
pub static E2M1_TABLE: [f32; 16] = E2M1.table::<16>();

/// Every byte of packed E2M1 decoded as its (low nibble, high nibble) pair: one lookup yields two
/// elements, which is what makes MXFP4 dequantization cheap.
pub static E2M1_PAIR_TABLE: [[f32; 2]; 256] = {
    let mut t = [[0.0f32; 2]; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = [E2M1.decode((b & 0xF) as u8), E2M1.decode((b >> 4) as u8)];
        b += 1;
    }
    t
};

/// Decodes one E2M1 code (the high nibble of `code` is ignored).
#[inline]
pub fn decode_e2m1(code: u8) -> f32 {
    E2M1_TABLE[(code & 0xF) as usize]
}

/// Encodes `x` as an E2M1 code in the low nibble: RNE, ±6 on overflow, NaN as described in the
/// module docs.
#[inline]
pub fn encode_e2m1(x: f32, ovf: Overflow) -> u8 {
    E2M1.encode(x, ovf)
}

/// Decodes one code per byte (low nibble) into `dst`.
pub fn decode_e2m1_slice(src: &[u8], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "decode_e2m1_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = E2M1_TABLE[(*s & 0xF) as usize];
    }
}

/// Encodes into one code per byte (low nibble).
pub fn encode_e2m1_slice(src: &[f32], dst: &mut [u8], ovf: Overflow) {
    assert_eq!(src.len(), dst.len(), "encode_e2m1_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = E2M1.encode(*s, ovf);
    }
}

/// Decodes packed E2M1 (two per byte, low nibble first) into `dst`, which holds `2 · src.len()`
/// values.
pub fn decode_e2m1_packed(src: &[u8], dst: &mut [f32]) {
    assert_eq!(
        2 * src.len(),
        dst.len(),
        "decode_e2m1_packed: dst must hold two values per byte"
    );
    for (d, s) in dst.chunks_exact_mut(2).zip(src) {
        d.copy_from_slice(&E2M1_PAIR_TABLE[*s as usize]);
    }
}

/// Encodes into packed E2M1 (two per byte, low nibble first). An odd-length `src` leaves the last
/// high nibble zero (+0).
pub fn encode_e2m1_packed(src: &[f32], dst: &mut [u8], ovf: Overflow) {
    assert_eq!(
        src.len().div_ceil(2),
        dst.len(),
        "encode_e2m1_packed: dst must hold ceil(n/2) bytes"
    );
    for (d, s) in dst.iter_mut().zip(src.chunks(2)) {
        let lo = E2M1.encode(s[0], ovf);
        let hi = if s.len() > 1 {
            E2M1.encode(s[1], ovf)
        } else {
            0
        };
        *d = lo | (hi << 4);
    }
}

/// Rounds every element to the nearest E2M1 value in place (kept as `f32`; SIMD); NaN stays NaN.
pub fn round_e2m1_slice(x: &mut [f32], ovf: Overflow) {
    E2M1.round_slice(x, ovf);
}
