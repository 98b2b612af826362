//! Data movement between views: [`copy()`] writes one tensor (or view) into another of the same
//! matrix shape.
//!
//! With [`Tensor::col_range`]/[`Tensor::row_range`] views this is how the model assembles per-head
//! operands without host-side shuffles: MLA's key `[k_nope | k_pe]` per head (the shared `k_pe`
//! copied into every head's rotary columns), the split of a fused projection into query and gate,
//! a window of a cache. Reads and writes are strided DMAs; the vector unit only casts.

use dsl_core::prelude::*;
use dsl_core::SimError;

/// `dst = src` (cast to `dst`'s element type), tile by tile: one program per `BR×BC` window.
#[kernel(
    grid = (cdiv(dst.rows(), BR), cdiv(dst.cols(), BC)),
    tunable(BR = [64, 8, 16, 32, 128], BC = [64, 16, 32, 128, 256])
)]
pub fn copy<S: Float, D: Float>(src: &Tensor<S>, dst: &Tensor<D>) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let t = load_async::<BR, BC>(src, r, c);
    store(dst, r, c, &cast::<D>(&t));
}

/// Copies `src` into `dst` with tiles sized to the shape; errors (naming both shapes) when the
/// matrix shapes differ, since a partial copy would leave stale data behind.
pub fn run_copy<S: Float, D: Float>(
    launcher: &Launcher,
    src: &Tensor<S>,
    dst: &Tensor<D>,
) -> Result<Launch, SimError> {
    if src.rows() != dst.rows() || src.cols() != dst.cols() {
        return Err(SimError::Launch {
            kernel: copy::META.name.to_string(),
            message: format!(
                "source {src:?} and destination {dst:?} differ in shape ({}×{} vs {}×{})",
                src.rows(),
                src.cols(),
                dst.rows(),
                dst.cols()
            ),
        });
    }
    let br = if dst.rows() <= 8 { 8 } else { 64 };
    let bc = if dst.cols() <= 16 {
        16
    } else if dst.cols() <= 32 {
        32
    } else {
        64
    };
    copy::launch(
        launcher,
        &Config::new().with("BR", br).with("BC", bc),
        src,
        dst,
    )
}
