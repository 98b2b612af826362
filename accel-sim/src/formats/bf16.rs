//! bfloat16: the top half of an `f32` (8 exponent bits, 7 mantissa bits), with infinity and NaN.
//!
//! Encoding rounds to nearest even (the `half` crate, which also keeps NaN a quiet NaN).
//! Only values within half an ulp of `f32::MAX` can overflow; [`Overflow`] says whether they
//! become ±inf or ±max (`0x7F7F`, 3.3895e38).

use super::Overflow;
use half::bf16;

/// Largest finite bf16 magnitude, as bits.
pub const MAX_BITS: u16 = 0x7F7F;

/// Decodes bf16 bits: exact (a bf16 is an `f32` with the low 16 bits zero).
#[inline]
pub fn decode(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Encodes `x` as bf16 bits: RNE; overflow and ±inf per `ovf`; NaN stays (quiet) NaN.
#[inline]
pub fn encode(x: f32, ovf: Overflow) -> u16 {
    let b = bf16::from_f32(x).to_bits();
    if ovf == Overflow::Saturate && b & 0x7FFF == 0x7F80 {
        // ±inf (from overflow or from an infinite input) → ±max.
        (b & 0x8000) | MAX_BITS
    } else {
        b
    }
}

/// Decodes a slice of bf16 bits (a shift per element; the compiler vectorises it).
pub fn decode_slice(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "bf16::decode_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = decode(*s);
    }
}

/// Encodes a slice as bf16 bits.
pub fn encode_slice(src: &[f32], dst: &mut [u16], ovf: Overflow) {
    assert_eq!(src.len(), dst.len(), "bf16::encode_slice: length mismatch");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = encode(*s, ovf);
    }
}
