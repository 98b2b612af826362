//! IEEE binary16 (5 exponent bits, 10 mantissa bits, bias 15): largest finite 65504, smallest
//! subnormal 2^−24.
//!
//! Encoding rounds to nearest even via the `half` crate (exact for subnormals, NaN kept quiet);
//! the slice versions use its vectorised conversions (F16C where the CPU has it). Values that
//! round past 65504 become ±inf under [`Overflow::NanOrInf`] (IEEE, numpy) or ±65504 under
//! [`Overflow::Saturate`].

use super::Overflow;
use half::f16;
use half::slice::HalfFloatSliceExt;

/// Largest finite f16 magnitude, as bits (65504).
pub const MAX_BITS: u16 = 0x7BFF;

/// Decodes f16 bits exactly.
#[inline]
pub fn decode(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

/// Encodes `x` as f16 bits: RNE; overflow and ±inf per `ovf`; NaN stays NaN.
#[inline]
pub fn encode(x: f32, ovf: Overflow) -> u16 {
    saturate(f16::from_f32(x).to_bits(), ovf)
}

#[inline]
fn saturate(b: u16, ovf: Overflow) -> u16 {
    if ovf == Overflow::Saturate && b & 0x7FFF == 0x7C00 {
        (b & 0x8000) | MAX_BITS
    } else {
        b
    }
}

/// Decodes a slice of f16 bits (vectorised by `half`).
pub fn decode_slice(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "f16::decode_slice: length mismatch");
    let h: &[f16] = bytemuck::cast_slice(src);
    h.convert_to_f32_slice(dst);
}

/// Encodes a slice as f16 bits (vectorised by `half`, then the overflow policy).
pub fn encode_slice(src: &[f32], dst: &mut [u16], ovf: Overflow) {
    assert_eq!(src.len(), dst.len(), "f16::encode_slice: length mismatch");
    let h: &mut [f16] = bytemuck::cast_slice_mut(dst);
    h.convert_from_f32_slice(src);
    if ovf == Overflow::Saturate {
        for b in dst.iter_mut() {
            *b = saturate(*b, ovf);
        }
    }
}
