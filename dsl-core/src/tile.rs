//! `Tile<T, R, C>`: an `R×C` block of `T` in a core's on-chip SRAM.

use crate::elem::Elem;
use crate::tensor::DeviceMem;
use accel_sim::functional::{MatRef, PackedB};
use accel_sim::program::BufId;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

/// An on-chip tile. Its shape is part of its type, so `mma` of mismatched tiles does not compile.
///
/// Created only by intrinsics (`load`, `zeros`, element-wise ops...). In a functional run it holds
/// `R·C` values, row-major; in a cost-only run it holds none, except an `i32` tile loaded from an
/// index tensor that has data (see `load`).
pub struct Tile<T: Elem, const R: usize, const C: usize> {
    pub(crate) buf: BufId,
    /// The values (functional runs); read them through [`Tile::vals`] and its siblings, which copy
    /// a deferred load when first asked.
    pub(crate) host: Host,
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
        self.give_back_buffer();
    }
}

/// A functional tile's values on the host.
pub(crate) enum Host {
    /// None: a cost-only tile.
    None,
    /// `R·C` values, row-major, in a buffer of the tile's own.
    Owned(Vec<f32>),
    /// A load whose window lies wholly inside its tensor, not copied yet: the matrix unit reads it
    /// in place (as BLAS reads a matrix it packs), anything else copies it on first use. This
    /// spares the functional GEMM a copy of every A and B tile (about a sixth of its host time).
    Deferred(Arc<DeferredLoad>),
}

/// A loaded window not copied out of device memory yet (see [`Host::Deferred`]).
///
/// Reading it later gives what copying it at the load would have given: no other program of the
/// launch writes the elements a program loads (the [`DeviceMem`] invariant), and before the
/// loading program itself stores over the window, `store` copies it
/// ([`crate::ctx::Ctx::settle_deferred`]). One a kernel keeps past its program is copied when the
/// program ends ([`crate::ctx::Ctx::settle_all_deferred`]), so none reads memory after its launch.
pub(crate) struct DeferredLoad {
    mem: Arc<DeviceMem>,
    /// Memory index of the window's first element, and the memory's row pitch.
    start: usize,
    stride: usize,
    rows: usize,
    cols: usize,
    /// The copy, once something other than the matrix unit asked for the values (or a store was
    /// about to overwrite them).
    copy: OnceLock<Vec<f32>>,
}

impl DeferredLoad {
    /// The `rows×cols` window at memory index `start` (row pitch `stride`) of `mem`.
    pub(crate) fn new(
        mem: Arc<DeviceMem>,
        start: usize,
        stride: usize,
        rows: usize,
        cols: usize,
    ) -> DeferredLoad {
        DeferredLoad {
            mem,
            start,
            stride,
            rows,
            cols,
            copy: OnceLock::new(),
        }
    }

    /// The values, row-major, copied out of device memory on the first call.
    pub(crate) fn values(&self) -> &Vec<f32> {
        self.copy.get_or_init(|| self.read())
    }

    /// A copy of the window in a buffer of its own.
    fn read(&self) -> Vec<f32> {
        // Every element is written by the copy (the window is the whole tile).
        let mut v = crate::tile_buffers::take(self.rows * self.cols);
        self.mem.read_rows(
            self.start,
            self.stride,
            self.rows,
            self.cols,
            &mut v,
            self.cols,
        );
        v
    }

    /// The window as a B operand of the matrix unit, packed (`transposed`: the product uses its
    /// transpose), once per launch and host thread (`crate::packed_operands`); `None` once copied
    /// (a store may have overwritten the memory since: the copy holds the values).
    pub(crate) fn packed(&self, launch: u64, transposed: bool) -> Option<Arc<PackedB>> {
        if self.copy.get().is_some() {
            return None;
        }
        let key = crate::packed_operands::WindowKey {
            mem: Arc::as_ptr(&self.mem) as usize,
            start: self.start,
            stride: self.stride,
            rows: self.rows,
            cols: self.cols,
            transposed,
        };
        Some(crate::packed_operands::get_or_pack(
            launch,
            key,
            Arc::downgrade(&self.mem),
            || {
                let b = self.operand();
                if transposed {
                    PackedB::new_transposed(b)
                } else {
                    PackedB::new(b)
                }
            },
        ))
    }

    /// The window as a matrix operand: the copy if there is one, else device memory in place.
    fn operand(&self) -> MatRef<'_> {
        match self.copy.get() {
            Some(v) => MatRef::dense(v, self.rows, self.cols),
            None => self
                .mem
                .window_ref(self.start, self.stride, self.rows, self.cols),
        }
    }

    /// Copies the window now if it shares an element range with `[lo, hi)` of `mem` (a store
    /// is about to write there).
    pub(crate) fn settle_if_overlapping(&self, mem: &Arc<DeviceMem>, lo: usize, hi: usize) {
        let end = self.start + (self.rows - 1) * self.stride + self.cols;
        if Arc::ptr_eq(&self.mem, mem) && self.start < hi && lo < end {
            self.values();
        }
    }

    /// The values as a buffer of their own: the copy if made, else a new one.
    fn into_values(self: Arc<Self>) -> Vec<f32> {
        match Arc::try_unwrap(self) {
            Ok(mut d) => d.copy.take().unwrap_or_else(|| d.read()),
            Err(shared) => crate::tile_buffers::copied(shared.values()),
        }
    }
}

impl Drop for DeferredLoad {
    fn drop(&mut self) {
        if let Some(v) = self.copy.take() {
            crate::tile_buffers::give(v);
        }
    }
}

impl<T: Elem, const R: usize, const C: usize> Tile<T, R, C> {
    /// The values (`None` in cost-only runs), copying a deferred load on first use.
    pub(crate) fn vals(&self) -> Option<&Vec<f32>> {
        match &self.host {
            Host::None => None,
            Host::Owned(v) => Some(v),
            Host::Deferred(d) => Some(d.values()),
        }
    }

    /// The values for writing (`None` in cost-only runs): a deferred load becomes the tile's own.
    pub(crate) fn vals_mut(&mut self) -> Option<&mut Vec<f32>> {
        if matches!(self.host, Host::Deferred(_)) {
            let v = self.take_vals();
            self.host = Host::from(v);
        }
        match &mut self.host {
            Host::Owned(v) => Some(v),
            _ => None,
        }
    }

    /// Takes the values out, leaving a cost-only tile.
    pub(crate) fn take_vals(&mut self) -> Option<Vec<f32>> {
        match std::mem::replace(&mut self.host, Host::None) {
            Host::None => None,
            Host::Owned(v) => Some(v),
            Host::Deferred(d) => Some(d.into_values()),
        }
    }

    /// Replaces the values, giving an owned buffer it held back to the free list.
    #[inline]
    pub(crate) fn set_host(&mut self, host: Host) {
        self.give_back_buffer();
        self.host = host;
    }

    /// Gives an owned buffer back to the free list, in place (leaving it empty): moving the
    /// 24-byte `Host` out through the stack on every drop stalled on store forwarding (7% of a
    /// cost-only 256-card run's CPU).
    #[inline]
    fn give_back_buffer(&mut self) {
        if let Host::Owned(v) = &mut self.host {
            crate::tile_buffers::give(std::mem::take(v));
        }
    }

    /// The tile's own buffer, to be refilled (`None` for a cost-only tile or a deferred load,
    /// which is dropped uncopied); leaves a cost-only tile.
    pub(crate) fn take_owned(&mut self) -> Option<Vec<f32>> {
        match std::mem::replace(&mut self.host, Host::None) {
            Host::Owned(v) => Some(v),
            _ => None,
        }
    }

    /// The deferred load the tile is, if it is one.
    pub(crate) fn deferred(&self) -> Option<&Arc<DeferredLoad>> {
        match &self.host {
            Host::Deferred(d) => Some(d),
            _ => None,
        }
    }

    /// The values as an `R×C` matrix operand, read in place when the tile is a deferred load.
    pub(crate) fn operand(&self) -> Option<MatRef<'_>> {
        match &self.host {
            Host::None => None,
            Host::Owned(v) => Some(MatRef::dense(v, R, C)),
            Host::Deferred(d) => Some(d.operand()),
        }
    }
}

impl From<Option<Vec<f32>>> for Host {
    #[inline]
    fn from(v: Option<Vec<f32>>) -> Host {
        v.map_or(Host::None, Host::Owned)
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
        self.vals().map(|v| v.as_slice())
    }
}

impl<T: Elem, const R: usize, const C: usize> std::fmt::Debug for Tile<T, R, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tile<{}, {R}, {C}>#{}", T::DTYPE, self.buf)
    }
}
