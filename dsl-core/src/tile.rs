//! `Tile<T, R, C>`: an `R×C` block of `T` in a core's on-chip SRAM.

use crate::elem::Elem;
use accel_sim::program::BufId;
use std::marker::PhantomData;

/// An on-chip tile. Its shape is part of its type, so `mma` of mismatched tiles does not compile.
///
/// Created only by intrinsics (`load`, `zeros`, element-wise ops...). In a functional run it holds
/// `R·C` values, row-major; in a cost-only run it holds none, except an `i32` tile loaded from an
/// index tensor that has data (see `load`).
pub struct Tile<T: Elem, const R: usize, const C: usize> {
    pub(crate) buf: BufId,
    pub(crate) data: Option<Vec<f32>>,
    pub(crate) _t: PhantomData<T>,
    /// Rows and columns holding the problem's data (the rest pads a ragged edge): a load records
    /// its window, element-wise results keep the smallest extent of their inputs, an accumulator
    /// the extent of what was multiplied into it. `mma` counts its useful FLOP over these, so the
    /// report's `flop` is the problem's work, not the padded tiles'. Known in cost-only runs too.
    pub(crate) valid: [usize; 2],
    /// Whether the tile is a constant fill (`zeros`, `full`) that nothing has written yet: as an
    /// accumulator it takes the extent of its first product; as an operand it does not narrow.
    pub(crate) fill: bool,
}

/// A dropped tile's host buffer goes back to its thread's free list (`crate::tile_buffers`), for
/// the next tile of that size.
impl<T: Elem, const R: usize, const C: usize> Drop for Tile<T, R, C> {
    fn drop(&mut self) {
        if let Some(v) = self.data.take() {
            crate::tile_buffers::give(v);
        }
    }
}

impl<T: Elem, const R: usize, const C: usize> Tile<T, R, C> {
    /// The valid extent of element-wise results of `inputs` (see [`Tile::valid`]).
    pub(crate) fn extent_of(inputs: &[([usize; 2], bool)]) -> [usize; 2] {
        inputs
            .iter()
            .filter(|(_, fill)| !fill)
            .fold([R, C], |a, (v, _)| [a[0].min(v[0]), a[1].min(v[1])])
    }
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
