//! Element types a kernel can name: `f32`, `bf16`, `f16`.

use accel_sim::functional::round_to;
use accel_sim::DType;
pub use half::{bf16, f16};

/// A floating-point element type usable in tiles and tensors.
///
/// Values are held as `f32` on the host (every supported format is exactly representable in f32);
/// `DTYPE` decides rounding and byte accounting.
pub trait Float: Copy + Send + Sync + 'static {
    /// The simulator's dtype for this element.
    const DTYPE: DType;

    /// Rounds host values to this format in place (round-to-nearest-even).
    fn round(x: &mut [f32]) {
        round_to(x, Self::DTYPE);
    }
}

impl Float for f32 {
    const DTYPE: DType = DType::F32;
}
impl Float for bf16 {
    const DTYPE: DType = DType::Bf16;
}
impl Float for f16 {
    const DTYPE: DType = DType::F16;
}
