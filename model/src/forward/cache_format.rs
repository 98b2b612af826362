//! The element format of the paged KV pools (MLA latents, DSA indexer keys, GQA keys and values).
//!
//! The reference path ([`super::Precision::F32`]) caches f32, as the transformers goldens do.
//! Native precision caches bf16, what serving engines hold for a bf16 checkpoint (vLLM's
//! `kv_cache_dtype="auto"`) and what the memory plan (`plan::memory`) counts per token: a decode
//! step reads half the bytes of an f32 cache. Rows are rounded to bf16 as the append kernel
//! writes them, and the attention kernels round their queries to the pool's format on chip, as
//! transformers in bf16 does (the activations themselves are held in bf16 at native precision,
//! [`super::Precision::activations`]).
//!
//! [`CacheFormat::Fp8`] (`--kv-dtype fp8`) stores every pool as E4M3 codes with one f32 scale per
//! token and key/value head ([`kernels::attention::fp8_kv`]): the MLA latent (DeepSeek-V3,
//! Kimi-K2, and the sparse MLA of DeepSeek-V3.2), the DSA indexer's keys, and GQA's keys and
//! values (Qwen3-Next's full-attention layers, sliding windows and sinks included). The layout is
//! that of V3.2's own FP8 cache but with one scale per token where FlashMLA keeps four: the append
//! quantises, the decodes (absorbed MLA, batched GQA), the sparse attention and the indexer
//! convert the codes on chip (the sparse kernels gather each row's scale with it; the indexer
//! scales each key's finished score), a prefill chunk's cached context is gathered dequantised.

use super::ops::Mem;
use dsl_core::{bf16, Float, Tensor};
use kernels::attention::fp8_kv::Fp8Tensors;

/// What a KV pool's elements are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheFormat {
    /// f32 rows (the reference path).
    #[default]
    F32,
    /// bf16 rows (native precision).
    Bf16,
    /// FP8 E4M3 codes plus one f32 scale per token and key/value head (every pool: MLA latents,
    /// DSA indexer keys, GQA keys and values).
    Fp8,
}

impl CacheFormat {
    /// Bytes per cached value (FP8: the codes; each token adds a 4-byte scale).
    pub fn bytes(self) -> usize {
        match self {
            CacheFormat::F32 => 4,
            CacheFormat::Bf16 => 2,
            CacheFormat::Fp8 => 1,
        }
    }

    /// Short name for reports (`f32`, `bf16`, `fp8`).
    pub fn name(self) -> &'static str {
        match self {
            CacheFormat::F32 => "f32",
            CacheFormat::Bf16 => "bf16",
            CacheFormat::Fp8 => "fp8",
        }
    }
}

impl std::str::FromStr for CacheFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<CacheFormat, String> {
        match s {
            "f32" => Ok(CacheFormat::F32),
            "bf16" => Ok(CacheFormat::Bf16),
            "fp8" => Ok(CacheFormat::Fp8),
            other => Err(format!(
                "unknown KV cache type `{other}`: expected `bf16`, `fp8` or `f32`"
            )),
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
    /// E4M3 codes and per-(token, head) scales.
    Fp8(Fp8Tensors),
}

/// Runs `$body` (a launch result) with `$t` bound to the typed tensor inside a [`CacheTensor`]
/// of floats; an FP8 pool, which only the kernels written for it read, is a launch error.
macro_rules! on_cache {
    ($cache:expr, $t:ident => $body:expr) => {
        match $cache {
            $crate::forward::cache_format::CacheTensor::F32($t) => $body,
            $crate::forward::cache_format::CacheTensor::Bf16($t) => $body,
            $crate::forward::cache_format::CacheTensor::Fp8(_) => {
                Err($crate::forward::cache_format::fp8_unsupported())
            }
        }
    };
}
pub(crate) use on_cache;

/// The error of a kernel without an FP8 form handed an FP8 pool, or of an FP8 kernel handed
/// another (the forward never does: every reader matches FP8 pools to its FP8 form first).
pub(crate) fn fp8_unsupported() -> dsl_core::SimError {
    dsl_core::SimError::Launch {
        kernel: "kv cache".into(),
        message: "this kernel reads f32 or bf16 pools, and its FP8 form FP8 pools only: a \
                  layer's pools take the runner's cache format"
            .into(),
    }
}

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
            (
                $crate::forward::cache_format::CacheTensor::Fp8(_),
                _,
            )
            | (
                _,
                $crate::forward::cache_format::CacheTensor::Fp8(_),
            ) => Err($crate::forward::cache_format::fp8_unsupported()),
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
    /// A fresh pool of `pages` pages of `page` tokens, each token `heads` rows of `dim` values,
    /// shaped `[pages·page, heads·dim]` (or `[pages, page, heads·dim]` with `paged`), in `format`:
    /// NaN-poisoned (shape only in cost-only runs); FP8 codes with one scale per token and head
    /// for [`CacheFormat::Fp8`].
    pub fn pool(
        format: CacheFormat,
        mem: Mem,
        pages: usize,
        page: usize,
        heads: usize,
        dim: usize,
        paged: bool,
    ) -> Result<CacheTensor, String> {
        let shape = if paged {
            vec![pages, page, heads * dim]
        } else {
            vec![pages * page, heads * dim]
        };
        Ok(match format {
            CacheFormat::Fp8 => CacheTensor::Fp8(
                Fp8Tensors::empty(pages, page, heads, dim, mem.shape_only).reshaped(&shape)?,
            ),
            CacheFormat::F32 => CacheTensor::F32(mem.poisoned(&shape)),
            CacheFormat::Bf16 => CacheTensor::Bf16(mem.poisoned(&shape)),
        })
    }

    /// A fresh one-head latent pool (MLA latents, DSA indexer keys): [`CacheTensor::pool`] with
    /// one row of `d` values per token.
    pub fn latent(
        format: CacheFormat,
        mem: Mem,
        pages: usize,
        page: usize,
        d: usize,
        paged: bool,
    ) -> Result<CacheTensor, String> {
        CacheTensor::pool(format, mem, pages, page, 1, d, paged)
    }

    /// The same typed tensor, wrapped (for a view made by code generic over the element).
    pub fn wrap<T: Float>(t: Tensor<T>) -> CacheTensor
    where
        Tensor<T>: IntoCache,
    {
        t.into_cache()
    }

    /// Its shape (FP8: the codes').
    pub fn shape(&self) -> &[usize] {
        match self {
            CacheTensor::F32(t) => t.shape(),
            CacheTensor::Bf16(t) => t.shape(),
            CacheTensor::Fp8(p) => p.codes.shape(),
        }
    }

    /// Rows of its 2-D view.
    pub fn rows(&self) -> usize {
        self.shape()[..self.shape().len().saturating_sub(1)]
            .iter()
            .product()
    }

    /// Columns (the last dimension).
    pub fn cols(&self) -> usize {
        self.shape().last().copied().unwrap_or(1)
    }

    /// The same elements under another shape (see [`Tensor::reshaped`]; FP8: the codes, the
    /// scales keep theirs).
    pub fn reshaped(&self, shape: &[usize]) -> Result<CacheTensor, String> {
        match self {
            CacheTensor::F32(t) => t.reshaped(shape).map(CacheTensor::wrap),
            CacheTensor::Bf16(t) => t.reshaped(shape).map(CacheTensor::wrap),
            CacheTensor::Fp8(p) => p.reshaped(shape).map(CacheTensor::Fp8),
        }
    }

    /// Its format.
    pub fn format(&self) -> CacheFormat {
        match self {
            CacheTensor::F32(_) => CacheFormat::F32,
            CacheTensor::Bf16(_) => CacheFormat::Bf16,
            CacheTensor::Fp8(_) => CacheFormat::Fp8,
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
