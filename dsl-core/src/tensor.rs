//! `Tensor<T>`: a tensor in device memory, as a kernel sees it.

use crate::elem::Elem;
use accel_sim::DType;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Device memory backing a functional tensor.
///
/// Programs of one launch run on host threads at once, like blocks on an accelerator, and read
/// and write windows of the same tensors. The memory is a slice of [`UnsafeCell`]s and is only ever
/// accessed through raw pointers to exactly the elements an access touches (one row of a window at
/// a time): no `&mut` to the buffer or any part of it is formed while a launch runs, and a
/// `&[f32]` only over one row of a window the matrix unit reads in place
/// ([`DeviceMem::window_ref`]), elements nobody writes while it lives, so programs touching
/// disjoint elements never alias a reference another thread writes under.
///
/// # The invariant
///
/// Within one launch, an element that one program stores is neither loaded nor stored by another
/// program of the launch (a race, as on hardware). Accesses of different launches are ordered:
/// a launch joins its programs before it returns. A program may read and write its own elements
/// in any order. Every access is bounds-checked against the memory (views are clipped to it, so a
/// failed check is a front-end bug, reported by a panic, never an access outside the buffer).
///
/// The hazard checks (`crate::hazard`, on by default in functional launches) verify the invariant
/// for every launch from each program's recorded windows and report a violation by kernel, line and
/// element; they run after the launch, so they name a race rather than prevent it, and a kernel
/// that races is in error whatever the memory model. Element-wise atomics would make even a racing
/// kernel defined, but cost about a fifth of the functional GEMM's speed (unvectorised copies:
/// measured, see the hazard commit's report), so copies stay `memcpy`s.
pub(crate) struct DeviceMem {
    cells: Box<[UnsafeCell<f32>]>,
}

// SAFETY: every access goes through raw pointers to exactly the elements touched, under the
// invariant above (no element written by one thread while another reads or writes it, within a
// launch; launches are ordered by rayon's join). `UnsafeCell` gives the write permission through a
// shared reference.
unsafe impl Sync for DeviceMem {}

impl DeviceMem {
    fn new(values: Vec<f32>) -> DeviceMem {
        DeviceMem {
            cells: values.into_iter().map(UnsafeCell::new).collect(),
        }
    }

    /// Pointer to element `start`, after checking that `len` elements from it are in the memory.
    ///
    /// # Panics
    /// If the range passes the end of the memory (a front-end bug: views are clipped).
    #[inline]
    fn at(&self, start: usize, len: usize) -> *mut f32 {
        assert!(
            start
                .checked_add(len)
                .is_some_and(|end| end <= self.cells.len()),
            "device memory access {start}+{len} past {} elements",
            self.cells.len()
        );
        // In bounds (checked above); `UnsafeCell<f32>` has the layout of `f32`, and the pointer
        // derives from the whole slice, so it covers the `len` elements that follow.
        UnsafeCell::raw_get(self.cells[start..].as_ptr())
    }

    /// Pointer to the first element of a `rows×cols` window (row pitch `stride`) at `start`,
    /// after checking that the window's whole extent is in the memory (with the extent's product
    /// checked, so a wrapped one cannot pass [`DeviceMem::at`]).
    ///
    /// # Panics
    /// If the window passes the end of the memory (a front-end bug: views are clipped).
    #[inline]
    fn window_at(&self, start: usize, stride: usize, rows: usize, cols: usize) -> *mut f32 {
        let extent = match rows {
            0 => 0,
            _ => (rows - 1)
                .checked_mul(stride)
                .and_then(|e| e.checked_add(cols))
                .expect("device memory window extent overflows"),
        };
        self.at(start, extent)
    }

    /// Elements in the memory.
    fn len(&self) -> usize {
        self.cells.len()
    }

    /// Element `i`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> f32 {
        // SAFETY: in bounds (`at`); no other program writes it during the launch (invariant).
        unsafe { *self.at(i, 1) }
    }

    /// Copies `dst.len()` elements starting at memory index `start` into `dst`.
    #[inline]
    pub(crate) fn read(&self, start: usize, dst: &mut [f32]) {
        let src = self.at(start, dst.len());
        // SAFETY: in bounds (`at`); `dst` is the caller's own buffer, so the ranges do not overlap;
        // no other program writes these elements during the launch (invariant).
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) }
    }

    /// Copies a `rows×cols` window (row pitch `stride`, first element `start`) into the first
    /// `cols` elements of each `dst_pitch`-long row of `dst`: one bounds check for the window
    /// instead of one per row.
    pub(crate) fn read_rows(
        &self,
        start: usize,
        stride: usize,
        rows: usize,
        cols: usize,
        dst: &mut [f32],
        dst_pitch: usize,
    ) {
        if rows == 0 || cols == 0 {
            return;
        }
        assert!(cols <= dst_pitch && (rows - 1) * dst_pitch + cols <= dst.len());
        let base = self.window_at(start, stride, rows, cols);
        for r in 0..rows {
            // SAFETY: row `r` lies inside the range `at` checked; `dst` is the caller's own
            // buffer (no overlap) and holds the row (asserted); no other program writes these
            // elements during the launch (invariant).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    base.add(r * stride),
                    dst.as_mut_ptr().add(r * dst_pitch),
                    cols,
                )
            }
        }
    }

    /// The `rows×cols` window at `start` (row pitch `stride`) as a matrix operand read in place
    /// (a deferred tile load, `crate::tile::DeferredLoad`), its extent bounds-checked like
    /// [`DeviceMem::read_rows`]. It reads exactly the window's elements, which, for as long as the
    /// operand is used (one matrix-unit instruction), no program writes: not another (invariant),
    /// nor the one reading, which is inside that instruction.
    pub(crate) fn window_ref(
        &self,
        start: usize,
        stride: usize,
        rows: usize,
        cols: usize,
    ) -> accel_sim::functional::MatRef<'_> {
        let base = self.window_at(start, stride, rows, cols);
        // SAFETY: every row's `cols` elements lie inside the range `window_at` checked, and nobody
        // writes them while the operand is in use (see above).
        unsafe { accel_sim::functional::MatRef::from_raw(base, stride, rows, cols) }
    }

    /// Writes `src` at memory index `start`.
    #[inline]
    pub(crate) fn write(&self, start: usize, src: &[f32]) {
        let dst = self.at(start, src.len());
        // SAFETY: in bounds (`at`); `src` is the caller's own buffer, so the ranges do not overlap;
        // no other program reads or writes these elements during the launch (invariant).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) }
    }
}

/// A row-major tensor in (simulated) device memory. Kernels address it as a matrix: the last
/// dimension is the columns and all leading dimensions fold into rows.
///
/// A tensor either holds data (functional runs) or only its shape (cost-only runs of production
/// shapes that cannot be materialised).
#[derive(Clone)]
pub struct Tensor<T: Elem> {
    id: u64,
    shape: Vec<usize>,
    /// First element of this view in the underlying memory (views share memory: see [`Tensor::at`]).
    offset: usize,
    /// Distance in elements between consecutive rows: `cols` for a dense tensor, more for a column
    /// window of a wider tensor (see [`Tensor::col_range`]).
    stride: usize,
    mem: Option<Arc<DeviceMem>>,
    /// Whether this is a view a kernel clipped itself ([`Tensor::at`], [`Tensor::rows_clipped`],
    /// [`Tensor::cols_clipped`]) or one derived from such a view: a window wholly outside it is by
    /// design (an expert with no rows), not an out-of-bounds access (see `crate::hazard`).
    clipped: bool,
    /// The format the elements are held in device memory: `T`'s own, or a narrower float for an
    /// f32 activation kept in bf16 (see [`Tensor::stored_as`]).
    stored: DType,
    _t: PhantomData<T>,
}

impl<T: Elem> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor<{}{}>{:?}{}",
            T::DTYPE,
            if self.stored == T::DTYPE {
                String::new()
            } else {
                format!(", stored {}", self.stored.name())
            },
            self.shape,
            if self.mem.is_some() {
                ""
            } else {
                " (shape only)"
            }
        )
    }
}

impl<T: Elem> Tensor<T> {
    fn with_mem(shape: &[usize], mem: Option<Vec<f32>>) -> Tensor<T> {
        Tensor {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            shape: shape.to_vec(),
            offset: 0,
            stride: shape.last().copied().unwrap_or(1),
            mem: mem.map(|v| Arc::new(DeviceMem::new(v))),
            clipped: false,
            stored: T::DTYPE,
            _t: PhantomData,
        }
    }

    /// A tensor holding `data` (row-major), rounded to `T`. Errors if the length does not match.
    pub fn from_f32(shape: &[usize], data: &[f32]) -> Result<Tensor<T>, String> {
        let n: usize = shape.iter().product();
        if data.len() != n {
            return Err(format!(
                "tensor of shape {shape:?} needs {n} values, got {}",
                data.len()
            ));
        }
        let mut v = data.to_vec();
        T::round(&mut v);
        Ok(Self::with_mem(shape, Some(v)))
    }

    /// A tensor filled with NaN: outputs start poisoned so an element a kernel forgets to write fails.
    pub fn poisoned(shape: &[usize]) -> Tensor<T> {
        let n: usize = shape.iter().product();
        Self::with_mem(shape, Some(vec![f32::NAN; n]))
    }

    /// A tensor with a shape and no data, for cost-only launches.
    pub fn shape_only(shape: &[usize]) -> Tensor<T> {
        Self::with_mem(shape, None)
    }

    /// The same tensor held in device memory as `dtype`, a narrower float than `T` (an f32
    /// activation kept in bf16, as a bf16 deployment holds it): every store rounds to `dtype`
    /// (existing data is rounded now), loads move `dtype`'s bytes, and kernels still see `T`
    /// values, as a kernel that loads bf16 and computes in f32 does. Views inherit it. Errors
    /// unless `T` is f32 and `dtype` a 16-bit float (or `dtype` is `T`'s own), and for a view of
    /// part of a memory (the format belongs to the whole tensor).
    pub fn stored_as(mut self, dtype: DType) -> Result<Tensor<T>, String> {
        if dtype == T::DTYPE {
            return Ok(self);
        }
        if T::DTYPE != DType::F32 || !matches!(dtype, DType::Bf16 | DType::F16) {
            return Err(format!(
                "{self:?} cannot be held as {}: only an f32 tensor can be stored as bf16 or f16",
                dtype.name()
            ));
        }
        if let Some(m) = &self.mem {
            if self.offset != 0 || self.span() != m.len() {
                return Err(format!(
                    "{self:?} is a view of a larger memory: hold the whole tensor as {}, not a view",
                    dtype.name()
                ));
            }
        }
        self.stored = dtype;
        if let Some(m) = &self.mem {
            // Round what it already holds (a fresh poisoned tensor stays NaN).
            let mut v = vec![0.0; m.len()];
            m.read(0, &mut v);
            accel_sim::functional::round_to(&mut v, dtype);
            m.write(0, &v);
        }
        Ok(self)
    }

    /// The format the elements are held in device memory (`T`'s own unless [`Tensor::stored_as`]
    /// narrowed it): what loads and stores move and round to.
    pub fn storage(&self) -> DType {
        self.stored
    }

    /// Launch-unique id (used by the cache model).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Rows when viewed as a matrix (product of all but the last dimension).
    pub fn rows(&self) -> usize {
        match self.shape.len() {
            0 => 1,
            n => self.shape[..n - 1].iter().product(),
        }
    }

    /// Columns when viewed as a matrix (the last dimension).
    pub fn cols(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the tensor has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the tensor holds data.
    pub fn has_data(&self) -> bool {
        self.mem.is_some()
    }

    /// Copies the data out, row-major over the view's shape (`None` for a shape-only tensor).
    pub fn to_vec(&self) -> Option<Vec<f32>> {
        let m = self.mem.as_deref()?;
        let (rows, cols) = (self.rows(), self.cols());
        let mut out = vec![0.0; rows * cols];
        if cols > 0 {
            for (r, row) in out.chunks_exact_mut(cols).enumerate() {
                m.read(self.offset + r * self.stride, row);
            }
        }
        Some(out)
    }

    /// The `index`-th sub-tensor along the first dimension, sharing memory: `x.at(h)` of a
    /// `[H, S, D]` tensor is the `[S, D]` matrix of head `h`. Loads and stores through the view are
    /// bounded by the view, so a ragged tile never touches the next head. An index past the end
    /// gives an empty view (loads read the fill value, stores write nothing): no panic.
    pub fn at(&self, index: usize) -> Tensor<T> {
        let inner: Vec<usize> = self.shape.iter().skip(1).copied().collect();
        // Rows of the sub-tensor times the row stride (1 element per step for a vector).
        let stride: usize = match inner.len() {
            0 => 1,
            n => inner[..n - 1].iter().product::<usize>() * self.stride,
        };
        let first = self.shape.first().copied().unwrap_or(1);
        let mut view = Tensor {
            id: self.id,
            shape: inner,
            offset: self.offset,
            stride: self.stride,
            mem: self.mem.clone(),
            clipped: true,
            stored: self.stored,
            _t: PhantomData,
        };
        if index < first {
            view.offset += index * stride;
        } else if let Some(d) = view.shape.first_mut() {
            *d = 0;
        } else {
            view.shape = vec![0];
        }
        view
    }

    /// Rows `start..end` of the tensor viewed as a matrix (`[end − start, cols]`), sharing memory,
    /// for use inside kernels (infallible; the host-side, checked form is [`Tensor::row_range`]):
    /// the rows one expert owns in a grouped (expert-sorted) activation matrix, whose bounds come
    /// from device memory at run time. Loads and stores through the view stay inside those rows, so
    /// a ragged tile never touches the next group. Bounds are clipped to the tensor (`end` past the
    /// last row, or `start > end`, give a shorter or empty view): no panic.
    pub fn rows_clipped(&self, start: usize, end: usize) -> Tensor<T> {
        let rows = self.rows();
        let start = start.min(rows);
        let end = end.clamp(start, rows);
        Tensor {
            id: self.id,
            shape: vec![end - start, self.cols()],
            offset: self.offset + start * self.stride,
            stride: self.stride,
            mem: self.mem.clone(),
            clipped: true,
            stored: self.stored,
            _t: PhantomData,
        }
    }

    /// Columns `start .. start + width` of the tensor viewed as a matrix, sharing memory, for use
    /// inside kernels (infallible; the host-side, checked form is [`Tensor::col_range`]): one head
    /// of a token-major `[T, H·D]` activation whose head dimension is a run-time value. Loads
    /// through the view read only its columns (a tile wider than the head is zero-filled past it)
    /// and stores write only its columns, so a covering tile never touches the next head. Bounds
    /// are clipped to the tensor: no panic.
    pub fn cols_clipped(&self, start: usize, width: usize) -> Tensor<T> {
        let cols = self.cols();
        let start = start.min(cols);
        let width = width.min(cols - start);
        // Leading dimensions are kept, so a column window of a paged pool `[pages, P, H·D]` is
        // still a pool of pages.
        let mut shape = self.shape.clone();
        match shape.last_mut() {
            Some(last) => *last = width,
            None => shape.push(width),
        }
        Tensor {
            id: self.id,
            shape,
            offset: self.offset + start,
            stride: self.stride,
            mem: self.mem.clone(),
            clipped: true,
            stored: self.stored,
            _t: PhantomData,
        }
    }

    /// A view of the first `shape.iter().product()` elements with another shape (e.g. one reusable
    /// workspace serving several weights in turn). Errors if the view would be larger.
    pub fn reshaped(&self, shape: &[usize]) -> Result<Tensor<T>, String> {
        if !self.is_dense() {
            return Err(format!(
                "cannot reshape {self:?}: it is a column window (row stride {}) of a wider tensor",
                self.stride
            ));
        }
        let n: usize = shape.iter().product();
        if n > self.len() {
            return Err(format!(
                "cannot view {self:?} as {shape:?}: {n} elements needed, {} available",
                self.len()
            ));
        }
        Ok(Tensor {
            id: self.id,
            shape: shape.to_vec(),
            offset: self.offset,
            stride: shape.last().copied().unwrap_or(1),
            mem: self.mem.clone(),
            clipped: self.clipped,
            stored: self.stored,
            _t: PhantomData,
        })
    }

    /// Rows `start .. start + rows` of the tensor viewed as a matrix, sharing memory: an expert's
    /// slice of dispatched tokens, one head's rows of a stacked weight, a window of a cache.
    /// Errors if the range passes the end.
    pub fn row_range(&self, start: usize, rows: usize) -> Result<Tensor<T>, String> {
        let have = self.rows();
        if start.checked_add(rows).is_none_or(|end| end > have) {
            return Err(format!(
                "rows {start}..{} are outside {self:?}, which has {have} rows",
                start.saturating_add(rows)
            ));
        }
        Ok(Tensor {
            id: self.id,
            shape: vec![rows, self.cols()],
            offset: self.offset + start * self.stride,
            stride: self.stride,
            mem: self.mem.clone(),
            clipped: self.clipped,
            stored: self.stored,
            _t: PhantomData,
        })
    }

    /// Columns `start .. start + width` of the tensor viewed as a matrix, sharing memory (a strided
    /// view, as a DMA descriptor with a row pitch addresses it): one head of a token-major
    /// `[T, H·D]` activation, the rotary part of a query, the value half of a fused projection.
    /// Kernels read and write it like any tensor. Errors if the range passes the last column.
    pub fn col_range(&self, start: usize, width: usize) -> Result<Tensor<T>, String> {
        let have = self.cols();
        if start.checked_add(width).is_none_or(|end| end > have) {
            return Err(format!(
                "columns {start}..{} are outside {self:?}, which has {have} columns",
                start.saturating_add(width)
            ));
        }
        Ok(Tensor {
            id: self.id,
            shape: vec![self.rows(), width],
            offset: self.offset + start,
            stride: self.stride,
            mem: self.mem.clone(),
            clipped: self.clipped,
            stored: self.stored,
            _t: PhantomData,
        })
    }

    /// Distance in elements between consecutive rows in memory.
    pub fn row_stride(&self) -> usize {
        self.stride
    }

    /// Whether rows are contiguous (not a column window of a wider tensor).
    pub fn is_dense(&self) -> bool {
        self.stride == self.cols() || self.rows() <= 1
    }

    /// Memory index of logical element `i` (row-major over the view's shape).
    pub(crate) fn mem_index(&self, i: usize) -> usize {
        let c = self.cols().max(1);
        (i / c) * self.stride + i % c
    }

    /// Element offset of this view in the underlying memory (for cache-reuse keys).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Whether this view was clipped inside a kernel (see the field's documentation).
    pub(crate) fn is_clipped(&self) -> bool {
        self.clipped
    }

    /// Elements of memory the view spans: from its first element to its last (row `r` starts at
    /// `r * row_stride()`); 0 for an empty view.
    pub(crate) fn span(&self) -> usize {
        match (self.rows(), self.cols()) {
            (0, _) | (_, 0) => 0,
            (r, c) => (r - 1) * self.stride + c,
        }
    }

    /// Element `i` of the view's span (`i < span()`), `None` for a shape-only tensor. Used during
    /// launches by any number of programs at once (see [`DeviceMem`]).
    pub(crate) fn span_get(&self, i: usize) -> Option<f32> {
        debug_assert!(i < self.span());
        self.mem.as_ref().map(|m| m.get(self.offset + i))
    }

    /// Copies `dst.len()` elements of the view's span starting at `i` into `dst`; false for a
    /// shape-only tensor. The range must lie inside the span.
    pub(crate) fn span_read(&self, i: usize, dst: &mut [f32]) -> bool {
        debug_assert!(i + dst.len() <= self.span());
        match &self.mem {
            Some(m) => {
                m.read(self.offset + i, dst);
                true
            }
            None => false,
        }
    }

    /// Copies the `rows×cols` window whose first element is span index `i` (row pitch: the
    /// view's) into `dst`, row `r` at `dst[r·dst_pitch..]`; false for a shape-only tensor. The
    /// window must lie inside the span.
    pub(crate) fn window_read(
        &self,
        i: usize,
        rows: usize,
        cols: usize,
        dst: &mut [f32],
        dst_pitch: usize,
    ) -> bool {
        debug_assert!(rows == 0 || i + (rows - 1) * self.stride + cols <= self.span());
        match &self.mem {
            Some(m) => {
                m.read_rows(self.offset + i, self.stride, rows, cols, dst, dst_pitch);
                true
            }
            None => false,
        }
    }

    /// The memory behind this view and the memory index and row pitch of its element `i`, for a
    /// load that reads its window later (`crate::tile::DeferredLoad`); `None` when shape-only.
    pub(crate) fn mem_at(&self, i: usize) -> Option<(&Arc<DeviceMem>, usize, usize)> {
        self.mem.as_ref().map(|m| (m, self.offset + i, self.stride))
    }

    /// Writes `vals` (row-major `rows×cols` with row pitch `src_stride`, already clipped to the
    /// view) at (`row`, `col`), row by row into exactly the window: other programs may be reading
    /// or writing other windows of the same memory at the same time (see [`DeviceMem`]).
    pub(crate) fn write_window(
        &self,
        row: usize,
        col: usize,
        rows: usize,
        cols: usize,
        vals: &[f32],
        src_stride: usize,
    ) {
        if cols == 0 || rows == 0 {
            // A window wholly outside the tensor writes nothing (its start may be past the end).
            return;
        }
        if let Some(m) = &self.mem {
            debug_assert!(row + rows <= self.rows() && col + cols <= self.cols());
            // A tensor held narrower than `T` rounds what is stored into it.
            let mut rounded = (self.stored != T::DTYPE).then(|| vec![0.0; cols]);
            for r in 0..rows {
                let dst = self.offset + (row + r) * self.stride + col;
                let src = &vals[r * src_stride..r * src_stride + cols];
                match rounded.as_mut() {
                    Some(buf) => {
                        buf.copy_from_slice(src);
                        accel_sim::functional::round_to(buf, self.stored);
                        m.write(dst, buf);
                    }
                    None => m.write(dst, src),
                }
            }
        }
    }
}

impl Tensor<u8> {
    /// A byte tensor (packed FP4 blocks, E8M0 scales...). Errors if the length does not match.
    pub fn from_bytes(shape: &[usize], bytes: &[u8]) -> Result<Tensor<u8>, String> {
        let v: Vec<f32> = bytes.iter().map(|b| *b as f32).collect();
        Tensor::from_f32(shape, &v)
    }

    /// The bytes (`None` for a shape-only tensor; NaN-poisoned elements read as 0).
    pub fn to_bytes(&self) -> Option<Vec<u8>> {
        self.to_vec().map(|v| v.iter().map(|x| *x as u8).collect())
    }
}

impl Tensor<i32> {
    /// An index tensor. Indices must be below 2^24 in magnitude (they are held exactly as f32).
    pub fn from_indices(shape: &[usize], idx: &[i32]) -> Result<Tensor<i32>, String> {
        const LIMIT: i32 = 1 << 24;
        if let Some(bad) = idx.iter().find(|i| i.abs() >= LIMIT) {
            return Err(format!("index {bad} is out of the supported range ±2^24"));
        }
        let v: Vec<f32> = idx.iter().map(|i| *i as f32).collect();
        Tensor::from_f32(shape, &v)
    }
}

impl Tensor<crate::elem::fp8e4m3> {
    /// An FP8 E4M3 tensor from its codes (one byte per element, as checkpoints store them).
    pub fn from_e4m3_codes(
        shape: &[usize],
        codes: &[u8],
    ) -> Result<Tensor<crate::elem::fp8e4m3>, String> {
        let v: Vec<f32> = codes
            .iter()
            .map(|c| accel_sim::formats::fp8::decode_e4m3(*c))
            .collect();
        Tensor::from_f32(shape, &v)
    }
}

/// Hand-written programs ([`accel_sim::manual`]) read and write tensors through their 2-D view.
impl<T: Elem> accel_sim::manual::DeviceTensor for Tensor<T> {
    fn id(&self) -> u64 {
        self.id
    }
    fn dtype(&self) -> accel_sim::DType {
        self.stored
    }
    fn rows(&self) -> usize {
        Tensor::rows(self)
    }
    fn cols(&self) -> usize {
        Tensor::cols(self)
    }
    fn row_stride(&self) -> usize {
        self.stride
    }
    fn offset(&self) -> usize {
        self.offset
    }
    fn has_data(&self) -> bool {
        self.mem.is_some()
    }
    fn read_row(&self, row: usize, col: usize, dst: &mut [f32]) {
        self.span_read(row * self.stride + col, dst);
    }
    fn write_row(&self, row: usize, col: usize, src: &[f32]) {
        self.write_window(row, col, 1, src.len(), src, src.len());
    }
    fn describe(&self) -> String {
        format!("{self:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Programs of a launch on host threads: writers of disjoint windows (rows, and a column
    /// window of a row nobody else writes) while readers read windows nobody writes and the
    /// host-side `to_vec` reads other rows, all at once. Defined behaviour under the invariant of
    /// [`DeviceMem`] (checked by Miri: `cargo +nightly miri test -p dsl-core --lib tensor`); with
    /// the former `&mut` of the whole `Vec` per store it was not, even for disjoint windows.
    #[test]
    fn concurrent_disjoint_windows_are_defined_behaviour() {
        let t = Tensor::<f32>::from_f32(&[5, 6], &[0.5; 30]).unwrap();
        let head = t.rows_clipped(4, 5).cols_clipped(2, 3);
        std::thread::scope(|s| {
            for p in 0..4usize {
                let (t, head) = (&t, &head);
                s.spawn(move || {
                    let vals = [p as f32 + 1.0; 6];
                    t.write_window(p, 0, 1, 3, &vals, 6);
                    if p == 0 {
                        head.write_window(0, 0, 1, 3, &vals, 3);
                    }
                    let mut row = [0.0; 3];
                    assert!(t.span_read(p * 6 + 3, &mut row));
                    assert_eq!(row, [0.5; 3]);
                    assert_eq!(t.span_get(4 * 6), Some(0.5));
                });
            }
        });
        let v = t.to_vec().unwrap();
        for p in 0..4 {
            assert_eq!(
                &v[p * 6..p * 6 + 6],
                &[
                    p as f32 + 1.0,
                    p as f32 + 1.0,
                    p as f32 + 1.0,
                    0.5,
                    0.5,
                    0.5
                ]
            );
        }
        assert_eq!(&v[24..30], &[0.5, 0.5, 1.0, 1.0, 1.0, 0.5]);
    }
}
