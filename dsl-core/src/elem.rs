//! Element types a kernel can name: floats (`f32`, `bf16`, `f16`) that the vector and matrix units
//! compute in, and raw integers (`u8` packed blocks and scales, `i32` indices) that are only moved
//! and converted.

use accel_sim::functional::round_to;
use accel_sim::DType;
pub use half::{bf16, f16};

/// An element type of tiles and tensors.
///
/// Values are held as `f32` on the host (every supported format, and every `u8` and every `i32`
/// index below 2^24, is exactly representable in f32); `DTYPE` decides rounding and byte accounting.
pub trait Elem: Copy + Send + Sync + 'static {
    /// The simulator's dtype for this element.
    const DTYPE: DType;

    /// Rounds host values to this format in place (floats: round-to-nearest-even).
    fn round(x: &mut [f32]) {
        round_to(x, Self::DTYPE);
    }
}

/// An element type the vector and matrix units compute in.
pub trait Float: Elem {}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
}
impl Elem for bf16 {
    const DTYPE: DType = DType::Bf16;
}
impl Elem for f16 {
    const DTYPE: DType = DType::F16;
}
impl Float for f32 {}
impl Float for bf16 {}
impl Float for f16 {}

impl Elem for u8 {
    const DTYPE: DType = DType::U8;
    /// Bytes: nearest integer, clamped to 0..=255 (NaN stays NaN so a poisoned byte is visible).
    fn round(x: &mut [f32]) {
        for v in x {
            *v = v.round_ties_even().clamp(0.0, 255.0);
        }
    }
}

impl Elem for i32 {
    const DTYPE: DType = DType::I32;
    /// Indices: nearest integer (exact below 2^24).
    fn round(x: &mut [f32]) {
        for v in x {
            *v = v.round_ties_even();
        }
    }
}

/// OCP FP8 E4M3 ("fn": bias 7, max 448, no infinity) elements, e.g. DeepSeek-V3 block-scaled
/// weights. A marker type: values are held as the f32 they decode to; rounding saturates at ±448.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct fp8e4m3;

impl Elem for fp8e4m3 {
    const DTYPE: DType = DType::Fp8e4m3;
}
impl Float for fp8e4m3 {}
