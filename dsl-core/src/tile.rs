//! `Tile<T, R, C>`: an `R×C` block of `T` in a core's on-chip SRAM.

use crate::elem::Elem;
use accel_sim::program::BufId;
use std::marker::PhantomData;

/// An on-chip tile. Its shape is part of its type, so `mma` of mismatched tiles does not compile.
///
/// Created only by intrinsics (`load`, `zeros`, element-wise ops...). In a cost-only run it holds no
/// data; in a functional run it holds `R·C` values, row-major.
pub struct Tile<T: Elem, const R: usize, const C: usize> {
    pub(crate) buf: BufId,
    pub(crate) data: Option<Vec<f32>>,
    pub(crate) _t: PhantomData<T>,
}

impl<T: Elem, const R: usize, const C: usize> Tile<T, R, C> {
    /// Rows.
    pub const ROWS: usize = R;
    /// Columns.
    pub const COLS: usize = C;

    /// The values, row-major (`None` in cost-only runs). For tests and debugging.
    pub fn values(&self) -> Option<&[f32]> {
        self.data.as_deref()
    }
}

impl<T: Elem, const R: usize, const C: usize> std::fmt::Debug for Tile<T, R, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tile<{}, {R}, {C}>#{}", T::DTYPE, self.buf)
    }
}
