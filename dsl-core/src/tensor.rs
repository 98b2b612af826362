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

    /// Copies the data out (`None` for a shape-only tensor).
    pub fn to_vec(&self) -> Option<Vec<f32>> {
        self.data().map(<[f32]>::to_vec)
    }

    /// The `index`-th sub-tensor along the first dimension, sharing memory: `x.at(h)` of a
    /// `[H, S, D]` tensor is the `[S, D]` matrix of head `h`. Loads and stores through the view are
    /// bounded by the view, so a ragged tile never touches the next head. An index past the end
    /// gives an empty view (loads read the fill value, stores write nothing): no panic.
    pub fn at(&self, index: usize) -> Tensor<T> {
        let inner: Vec<usize> = self.shape.iter().skip(1).copied().collect();
        let stride: usize = inner.iter().product();
        let first = self.shape.first().copied().unwrap_or(1);
        let mut view = Tensor {
            id: self.id,
            shape: inner,
            offset: self.offset,
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

    /// Rows `start..end` of the tensor viewed as a matrix (`[end − start, cols]`), sharing memory:
    /// the rows one expert owns in a grouped (expert-sorted) activation matrix, whose bounds come
    /// from device memory at run time. Loads and stores through the view stay inside those rows, so
    /// a ragged tile never touches the next group. Bounds are clipped to the tensor (`end` past the
    /// last row, or `start > end`, give a shorter or empty view): no panic.
    pub fn row_range(&self, start: usize, end: usize) -> Tensor<T> {
        let rows = self.rows();
        let start = start.min(rows);
        let end = end.clamp(start, rows);
        Tensor {
            id: self.id,
            shape: vec![end - start, self.cols()],
            offset: self.offset + start * self.cols(),
            mem: self.mem.clone(),
            _t: PhantomData,
        }
    }

    /// A view of the first `shape.iter().product()` elements with another shape (e.g. one reusable
    /// workspace serving several weights in turn). Errors if the view would be larger.
    pub fn reshaped(&self, shape: &[usize]) -> Result<Tensor<T>, String> {
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
            mem: self.mem.clone(),
            _t: PhantomData,
        })
    }

    /// Element offset of this view in the underlying memory (for cache-reuse keys).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Read access to the data during a launch.
    pub(crate) fn data(&self) -> Option<&[f32]> {
        // SAFETY: see `DeviceMem`.
        let len = self.len();
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
            let c = self.cols();
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
