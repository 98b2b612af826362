//! The element format of the paged KV pools (MLA latents, DSA indexer keys, GQA keys and values).
//!
//! The reference path ([`super::Precision::F32`]) caches f32, as the transformers goldens do.
//! Native precision caches bf16, what serving engines hold for a bf16 checkpoint (vLLM's
//! `kv_cache_dtype="auto"`) and what the memory plan (`plan::memory`) counts per token: a decode
//! step reads half the bytes of an f32 cache. Rows are rounded to bf16 as the append kernel
//! writes them, and the attention kernels round their queries to the pool's format on chip, as
//! transformers in bf16 does. Activations stay f32.

use super::ops::Mem;
use dsl_core::{bf16, Float, Tensor};

/// What a KV pool's elements are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheFormat {
    /// f32 rows (the reference path).
    #[default]
    F32,
    /// bf16 rows (native precision).
    Bf16,
}

impl CacheFormat {
    /// Bytes per cached value.
    pub fn bytes(self) -> usize {
        match self {
            CacheFormat::F32 => 4,
            CacheFormat::Bf16 => 2,
        }
    }
}

/// A pool tensor in its [`CacheFormat`]. Kernels are generic over the element type; [`on_cache!`]
/// hands the typed tensor to code written once for both.
#[derive(Debug, Clone)]
pub(crate) enum CacheTensor {
    /// f32 rows.
    F32(Tensor<f32>),
    /// bf16 rows.
    Bf16(Tensor<bf16>),
}

/// Runs `$body` with `$t` bound to the typed tensor inside a [`CacheTensor`].
macro_rules! on_cache {
    ($cache:expr, $t:ident => $body:expr) => {
        match $cache {
            $crate::forward::cache_format::CacheTensor::F32($t) => $body,
            $crate::forward::cache_format::CacheTensor::Bf16($t) => $body,
        }
    };
}
pub(crate) use on_cache;

/// Runs `$body` (a launch result) with `$k` and `$v` bound to the typed tensors of a layer's key
/// and value pools; pools of two formats are a launch error of `$kernel` (both pools of a layer
/// take the runner's cache format).
macro_rules! on_cache_pair {
    ($k_pool:expr, $v_pool:expr, $kernel:expr, ($k:ident, $v:ident) => $body:expr) => {
        match ($k_pool, $v_pool) {
            (
                $crate::forward::cache_format::CacheTensor::F32($k),
                $crate::forward::cache_format::CacheTensor::F32($v),
            ) => $body,
            (
                $crate::forward::cache_format::CacheTensor::Bf16($k),
                $crate::forward::cache_format::CacheTensor::Bf16($v),
            ) => $body,
            (k, v) => Err(dsl_core::SimError::Launch {
                kernel: $kernel.to_string(),
                message: format!(
                    "the key pool is {:?} but the value pool {:?}: both pools of a layer take the runner's cache format",
                    k.format(),
                    v.format()
                ),
            }),
        }
    };
}
pub(crate) use on_cache_pair;

impl CacheTensor {
    /// A fresh (poisoned, or shape-only) pool tensor of `shape` in `format`.
    pub fn new(format: CacheFormat, mem: Mem, shape: &[usize]) -> CacheTensor {
        match format {
            CacheFormat::F32 => CacheTensor::F32(mem.poisoned(shape)),
            CacheFormat::Bf16 => CacheTensor::Bf16(mem.poisoned(shape)),
        }
    }

    /// The same typed tensor, wrapped (for a view made by code generic over the element).
    pub fn wrap<T: Float>(t: Tensor<T>) -> CacheTensor
    where
        Tensor<T>: IntoCache,
    {
        t.into_cache()
    }

    /// Its shape.
    pub fn shape(&self) -> &[usize] {
        on_cache!(self, t => t.shape())
    }

    /// Rows of its 2-D view.
    pub fn rows(&self) -> usize {
        on_cache!(self, t => t.rows())
    }

    /// Columns (the last dimension).
    pub fn cols(&self) -> usize {
        on_cache!(self, t => t.cols())
    }

    /// The same elements under another shape (see [`Tensor::reshaped`]).
    pub fn reshaped(&self, shape: &[usize]) -> Result<CacheTensor, String> {
        on_cache!(self, t => t.reshaped(shape).map(CacheTensor::wrap))
    }

    /// Its format.
    pub fn format(&self) -> CacheFormat {
        match self {
            CacheTensor::F32(_) => CacheFormat::F32,
            CacheTensor::Bf16(_) => CacheFormat::Bf16,
        }
    }
}

/// A typed tensor that a [`CacheTensor`] can hold.
pub(crate) trait IntoCache {
    /// Wraps it.
    fn into_cache(self) -> CacheTensor;
}

impl IntoCache for Tensor<f32> {
    fn into_cache(self) -> CacheTensor {
        CacheTensor::F32(self)
    }
}

impl IntoCache for Tensor<bf16> {
    fn into_cache(self) -> CacheTensor {
        CacheTensor::Bf16(self)
    }
}
