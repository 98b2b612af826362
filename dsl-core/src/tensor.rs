//! `Tensor<T>`: a tensor in device memory, as a kernel sees it.

use crate::elem::Elem;
use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Device memory backing a functional tensor.
///
/// Programs of one launch run on host threads at once and write disjoint windows of their output
/// tensors, like blocks on an accelerator; overlapping writes are a kernel bug (a race), exactly as on
/// hardware.
pub(crate) struct DeviceMem {
    data: UnsafeCell<Vec<f32>>,
}

// SAFETY: see the type's documentation: concurrent access is to disjoint windows, by construction of
// the kernels; readers of a tensor never run concurrently with writers of the same elements.
unsafe impl Sync for DeviceMem {}
unsafe impl Send for DeviceMem {}

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
    _t: PhantomData<T>,
}

impl<T: Elem> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor<{}>{:?}{}",
            T::DTYPE,
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
            mem: mem.map(|v| {
                Arc::new(DeviceMem {
                    data: UnsafeCell::new(v),
                })
            }),
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
        let d = self.data()?;
        if self.is_dense() {
            return Some(d[..self.len()].to_vec());
        }
        let c = self.cols();
        Some(
            (0..self.rows())
                .flat_map(|r| d[r * self.stride..r * self.stride + c].iter().copied())
                .collect(),
        )
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

    /// Read access to the data during a launch: the memory from the view's first element to its
    /// last; row `r` starts at `r * row_stride()`.
    pub(crate) fn data(&self) -> Option<&[f32]> {
        // SAFETY: see `DeviceMem`.
        let len = match self.rows() {
            0 => 0,
            r => (r - 1) * self.stride + self.cols(),
        };
        let len = if self.cols() == 0 { 0 } else { len };
        self.mem
            .as_ref()
            .map(|m| unsafe { &(&*m.data.get())[self.offset..self.offset + len] })
    }

    /// Writes `vals` (row-major `rows×cols`, already clipped) at (`row`, `col`).
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
            let c = self.stride;
            // SAFETY: see `DeviceMem`: programs write disjoint windows.
            let data = unsafe { &mut *m.data.get() };
            for r in 0..rows {
                let dst = self.offset + (row + r) * c + col;
                data[dst..dst + cols].copy_from_slice(&vals[r * src_stride..r * src_stride + cols]);
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
