//! A weight matrix (or a stack of expert matrices) as device memory holds it: in f32, in bf16, in
//! DeepSeek's block-scaled FP8 E4M3, packed MXFP4, or packed group-scaled INT4. The linear and grouped-expert runners take a
//! [`Weight`] and launch the kernel that reads that format, so a model keeps each weight in the
//! checkpoint's own format and the simulator reads exactly the bytes a real deployment reads.
//!
//! Shapes are Hugging Face's output-major `[.., N, K]` (`nn.Linear`'s `[out, in]`), with a leading
//! expert axis for expert stacks.

use dsl_core::prelude::*;
use dsl_core::{Backend, SimError};

/// Side of the square FP8 scale block (DeepSeek-V3 `weight_block_size`).
pub const FP8_BLOCK: usize = 128;

/// Values per MXFP4 block (one E8M0 scale each; OCP MX spec v1.0, section 5).
pub const MX_BLOCK: usize = 32;

/// One weight in device memory, in its stored format.
pub enum Weight {
    /// f32 `[.., N, K]` (the reference-precision path).
    F32(Tensor<f32>),
    /// bf16 `[.., N, K]`.
    Bf16(Tensor<bf16>),
    /// FP8 E4M3 `[.., N, K]` with f32 block scales `[.., ⌈N/128⌉, ⌈K/128⌉]`.
    Fp8Block {
        /// E4M3 weights.
        weight: Tensor<fp8e4m3>,
        /// `weight_scale_inv` per 128×128 block.
        scale_inv: Tensor<f32>,
    },
    /// MXFP4: packed E2M1 pairs `[.., N, K/2]` and E8M0 scales `[.., N, K/32]`.
    Mxfp4 {
        /// Packed elements.
        blocks: Tensor<u8>,
        /// Block scales.
        scales: Tensor<u8>,
    },
    /// Symmetric INT4 with one bf16 scale per `group` consecutive inputs (compressed-tensors'
    /// `pack-quantized` W4A16, Kimi-K2-Thinking's experts): code pairs `[.., N, K/2]` (code `q`
    /// means `q − 8`) and scales `[.., N, K/group]`.
    Int4 {
        /// Packed codes.
        packed: Tensor<u8>,
        /// Group scales.
        scales: Tensor<bf16>,
    },
}

/// A stored format, without data: what [`Weight::shape_only`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// f32.
    F32,
    /// bf16.
    Bf16,
    /// Block-scaled FP8 E4M3 (128×128 blocks).
    Fp8Block,
    /// MXFP4 (32-value blocks).
    Mxfp4,
    /// Group-scaled symmetric INT4 (bf16 scales).
    Int4 {
        /// Inputs per scale (a divisor of 128: 32 for Kimi-K2-Thinking, 128 for most others).
        group: usize,
    },
}

impl Format {
    /// The format's name in reports and errors.
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::Bf16 => "bf16",
            Format::Fp8Block => "fp8 e4m3 (128x128 block scales)",
            Format::Mxfp4 => "mxfp4",
            Format::Int4 { .. } => "int4 (bf16 group scales)",
        }
    }
}

impl Weight {
    /// A shape-only weight of logical shape `[.., N, K]` in `format` (cost-only runs). MXFP4 needs
    /// `K` a multiple of 32.
    pub fn shape_only(format: Format, shape: &[usize]) -> Result<Weight, String> {
        let (lead, n, k) = split(shape)?;
        let with = |tail: [usize; 2]| [lead, &tail[..]].concat();
        Ok(match format {
            Format::F32 => Weight::F32(Tensor::shape_only(shape)),
            Format::Bf16 => Weight::Bf16(Tensor::shape_only(shape)),
            Format::Fp8Block => Weight::Fp8Block {
                weight: Tensor::shape_only(shape),
                scale_inv: Tensor::shape_only(&with([
                    n.div_ceil(FP8_BLOCK),
                    k.div_ceil(FP8_BLOCK),
                ])),
            },
            Format::Mxfp4 => {
                if !k.is_multiple_of(MX_BLOCK) {
                    return Err(format!(
                        "an MXFP4 weight needs its input size a multiple of {MX_BLOCK}, got {shape:?}"
                    ));
                }
                Weight::Mxfp4 {
                    blocks: Tensor::shape_only(&with([n, k / 2])),
                    scales: Tensor::shape_only(&with([n, k / MX_BLOCK])),
                }
            }
            Format::Int4 { group } => {
                check_int4_group(group, k, shape)?;
                Weight::Int4 {
                    packed: Tensor::shape_only(&with([n, k / 2])),
                    scales: Tensor::shape_only(&with([n, k / group])),
                }
            }
        })
    }

    /// The stored format.
    pub fn format(&self) -> Format {
        match self {
            Weight::F32(_) => Format::F32,
            Weight::Bf16(_) => Format::Bf16,
            Weight::Fp8Block { .. } => Format::Fp8Block,
            Weight::Mxfp4 { .. } => Format::Mxfp4,
            Weight::Int4 { packed, scales } => Format::Int4 {
                group: int4_group(packed, scales),
            },
        }
    }

    /// The logical shape `[.., N, K]` (MXFP4: `K` is twice the packed width).
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Weight::F32(t) => t.shape().to_vec(),
            Weight::Bf16(t) => t.shape().to_vec(),
            Weight::Fp8Block { weight, .. } => weight.shape().to_vec(),
            Weight::Mxfp4 { blocks: packed, .. } | Weight::Int4 { packed, .. } => {
                let mut s = packed.shape().to_vec();
                if let Some(k) = s.last_mut() {
                    *k *= 2;
                }
                s
            }
        }
    }

    /// Output features `N` (rows of the matrix).
    pub fn out_features(&self) -> usize {
        let s = self.shape();
        s.get(s.len().wrapping_sub(2)).copied().unwrap_or(0)
    }

    /// Input features `K`.
    pub fn in_features(&self) -> usize {
        self.shape().last().copied().unwrap_or(0)
    }

    /// Rows `start..start + rows` (output features) of a 2-D weight, as a view. An FP8 weight's
    /// rows must start on a 128-row scale block (and end on one, or at the last row).
    pub fn row_range(&self, start: usize, rows: usize) -> Result<Weight, String> {
        Ok(match self {
            Weight::F32(t) => Weight::F32(t.row_range(start, rows)?),
            Weight::Bf16(t) => Weight::Bf16(t.row_range(start, rows)?),
            Weight::Fp8Block { weight, scale_inv } => {
                let n = weight.rows();
                if !start.is_multiple_of(FP8_BLOCK)
                    || (!rows.is_multiple_of(FP8_BLOCK) && start + rows != n)
                {
                    return Err(format!(
                        "rows {start}..{} of an FP8 weight cut its {FP8_BLOCK}-row scale blocks",
                        start + rows
                    ));
                }
                Weight::Fp8Block {
                    weight: weight.row_range(start, rows)?,
                    scale_inv: scale_inv.row_range(start / FP8_BLOCK, rows.div_ceil(FP8_BLOCK))?,
                }
            }
            Weight::Mxfp4 { blocks, scales } => Weight::Mxfp4 {
                blocks: blocks.row_range(start, rows)?,
                scales: scales.row_range(start, rows)?,
            },
            Weight::Int4 { packed, scales } => Weight::Int4 {
                packed: packed.row_range(start, rows)?,
                scales: scales.row_range(start, rows)?,
            },
        })
    }

    /// A one-expert `[1, N, K]` weight (as [`crate::moe::expert_gemm::prepare_weight`] makes them)
    /// as the `[N, K]` weight of a dense linear layer: the same memory, the leading axis dropped.
    pub fn without_expert_axis(self) -> Result<Weight, String> {
        let drop = |s: &[usize]| -> Result<Vec<usize>, String> {
            match s {
                [1, rest @ ..] if !rest.is_empty() => Ok(rest.to_vec()),
                _ => Err(format!("{s:?} is not a one-expert [1, N, K] weight")),
            }
        };
        Ok(match self {
            Weight::F32(t) => Weight::F32(t.reshaped(&drop(t.shape())?)?),
            Weight::Bf16(t) => Weight::Bf16(t.reshaped(&drop(t.shape())?)?),
            Weight::Fp8Block { weight, scale_inv } => Weight::Fp8Block {
                weight: weight.reshaped(&drop(weight.shape())?)?,
                scale_inv: scale_inv.reshaped(&drop(scale_inv.shape())?)?,
            },
            Weight::Mxfp4 { blocks, scales } => Weight::Mxfp4 {
                blocks: blocks.reshaped(&drop(blocks.shape())?)?,
                scales: scales.reshaped(&drop(scales.shape())?)?,
            },
            Weight::Int4 { packed, scales } => Weight::Int4 {
                packed: packed.reshaped(&drop(packed.shape())?)?,
                scales: scales.reshaped(&drop(scales.shape())?)?,
            },
        })
    }

    /// Bytes the weight occupies in device memory, scales included.
    pub fn stored_bytes(&self) -> u64 {
        let bytes = |len: usize, elem: usize| (len * elem) as u64;
        match self {
            Weight::F32(t) => bytes(t.len(), 4),
            Weight::Bf16(t) => bytes(t.len(), 2),
            Weight::Fp8Block { weight, scale_inv } => {
                bytes(weight.len(), 1) + bytes(scale_inv.len(), 4)
            }
            Weight::Mxfp4 { blocks, scales } => bytes(blocks.len(), 1) + bytes(scales.len(), 1),
            Weight::Int4 { packed, scales } => bytes(packed.len(), 1) + bytes(scales.len(), 2),
        }
    }
}

/// Checks an INT4 weight's group size against its input size `k` (the kernels load one scale
/// column per group of a 128-wide K tile, so the group must divide 128).
pub fn check_int4_group(group: usize, k: usize, shape: &[usize]) -> Result<(), String> {
    if group == 0 || !INT4_GROUPS.contains(&group) {
        return Err(format!(
            "an INT4 weight's group size must be one of {INT4_GROUPS:?}, got {group}"
        ));
    }
    if !k.is_multiple_of(group) {
        return Err(format!(
            "an INT4 weight with groups of {group} needs its input size a multiple of {group}, got {shape:?}"
        ));
    }
    Ok(())
}

/// The group size an INT4 weight's tensors imply: inputs (two per packed byte) per scale column.
pub(crate) fn int4_group(packed: &Tensor<u8>, scales: &Tensor<bf16>) -> usize {
    2 * packed.cols() / scales.cols().max(1)
}

/// Group sizes the INT4 kernels read (divisors of their 128-wide K tile).
pub const INT4_GROUPS: [usize; 3] = [32, 64, 128];

/// `(leading axes, N, K)` of a weight shape of rank ≥ 2.
fn split(shape: &[usize]) -> Result<(&[usize], usize, usize), String> {
    match shape {
        [lead @ .., n, k] => Ok((lead, *n, *k)),
        _ => Err(format!(
            "a weight needs at least two axes [N, K], got {shape:?}"
        )),
    }
}

/// A device tensor for a kernel's intermediate result: poisoned in functional runs (so an
/// unwritten element shows), shape-only in cost-only runs.
pub(crate) fn scratch<T: Elem>(launcher: &Launcher, shape: &[usize]) -> Tensor<T> {
    if launcher.backend == Backend::Functional {
        Tensor::poisoned(shape)
    } else {
        Tensor::shape_only(shape)
    }
}

/// A launch error of `kernel`.
pub(crate) fn bad(kernel: &str, message: String) -> SimError {
    SimError::Launch {
        kernel: kernel.to_string(),
        message,
    }
}
