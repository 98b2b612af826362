//! Checkpoint packings of quantized weights, read exactly as the models' own loaders read them.
//!
//! ## gpt-oss MXFP4 experts
//! Each expert projection `P` (`gate_up_proj`, `down_proj`) is stored as two tensors:
//! - `P_blocks`: u8 `[experts, rows, G, 16]`: `G` blocks of 32 E2M1 values per row, two per byte,
//!   **low nibble first** (byte `k` holds element `2k` in bits 0–3 and `2k+1` in bits 4–7);
//! - `P_scales`: u8 `[experts, rows, G]`: one E8M0 scale per block, `2^(b − 127)`.
//!
//! [`gpt_oss_dequant`] reproduces Hugging Face transformers'
//! `integrations/mxfp4.py::convert_moe_packed_tensors` bit for bit (golden data in
//! `tests/reference/`): the value is `FP4_VALUES[nibble] · 2^(scale − 127)` (their `ldexp`), the
//! result is reshaped to `[*prefix, G·32]` and then **axes 1 and 2 are swapped**
//! (`out.transpose(1, 2)`), so a `[E, rows, G, 16]` checkpoint gives `[E, G·32, rows]`, ready for
//! `x @ W`. Two deliberate differences, both refusals rather than different numbers:
//! - scale byte `0xFF` is NaN in E8M0 (OCP MX), while transformers' `ldexp` treats it as 2^128;
//!   here it is a [`FormatError::BadScale`] naming the scale tensor;
//! - a shape mismatch (transformers `assert`s) or a rank below 4 (its `transpose(1, 2)` would
//!   fail) is a [`FormatError::Shape`] that names the tensor and the expected shape.
//!
//! Transformers returns bf16 by default; every value with a scale in `0..=254` is exactly
//! representable in bf16 as in `f32`, so the `f32` returned here equals its output widened.
//! [`gpt_oss_to_mx`] gives the same data as an [`MxTensor`] without the transpose or any copy of
//! the bytes, which is what an online-dequantizing kernel reads.
//!
//! ## DeepSeek-V3 block-scaled FP8
//! A weight `[out, in]` is stored as E4M3 codes plus an f32 `<name>_scale_inv` of shape
//! `[ceil(out/128), ceil(in/128)]`; the edge blocks are ragged (cover fewer rows/columns).
//! [`fp8_block_dequant`] computes `W[i, j] = decode(q[i, j]) · scale_inv[i/128, j/128]` as one
//! `f32` multiply (RNE), which is what DeepSeek's `weight_dequant` kernel computes before storing
//! in the model dtype.

use super::mx::{MxElem, MxTensor, MX_BLOCK};
use super::{check_len, e8m0, fp8, numel, unravel, FormatError, Overflow};

/// Bytes per gpt-oss block (32 E2M1 values, two per byte).
pub const GPT_OSS_BYTES_PER_BLOCK: usize = 16;

/// DeepSeek-V3's FP8 weight block edge (128 × 128).
pub const DEEPSEEK_FP8_BLOCK: usize = 128;

/// Validates a gpt-oss `name_blocks` / `name_scales` pair and wraps it as an MXFP4 tensor of
/// logical shape `[*prefix, G·32]` (blocks shape without its last axis, times 32), sharing the
/// byte layout (no repacking).
///
/// `name` is the projection's key without the suffix (e.g. `model.layers.0.mlp.experts.down_proj`);
/// errors name `name_blocks` or `name_scales`.
pub fn gpt_oss_to_mx(
    name: &str,
    blocks: Vec<u8>,
    blocks_shape: &[usize],
    scales: Vec<u8>,
    scales_shape: &[usize],
) -> Result<MxTensor, FormatError> {
    let bname = format!("{name}_blocks");
    let sname = format!("{name}_scales");
    let n = blocks_shape.len();
    if n < 4 || blocks_shape[n - 1] != GPT_OSS_BYTES_PER_BLOCK {
        return Err(FormatError::Shape {
            tensor: bname,
            expected:
                "[experts, rows, groups, 16] (u8; 16 bytes = 32 FP4 values per block; rank ≥ 4)"
                    .into(),
            found: format!("{blocks_shape:?}"),
        });
    }
    check_len(&bname, blocks_shape, blocks.len())?;
    let want_scales = &blocks_shape[..n - 1];
    if scales_shape != want_scales {
        return Err(FormatError::Shape {
            tensor: sname,
            expected: format!("{want_scales:?} (the shape of `{bname}` without its last axis: one E8M0 scale per block)"),
            found: format!("{scales_shape:?}"),
        });
    }
    check_len(&sname, scales_shape, scales.len())?;
    if let Some(i) = scales.iter().position(|&s| s == e8m0::NAN) {
        return Err(FormatError::BadScale {
            tensor: sname,
            index: unravel(i, scales_shape),
            value: "0xFF (the E8M0 NaN)".into(),
        });
    }
    let mut shape = blocks_shape[..n - 2].to_vec();
    shape.push(blocks_shape[n - 2] * MX_BLOCK);
    MxTensor::from_parts(name, MxElem::Fp4E2M1, &shape, blocks, scales)
}

/// Dequantizes a gpt-oss MXFP4 pair exactly as transformers' `convert_moe_packed_tensors` does,
/// including its final `transpose(1, 2)`. Returns the values (row-major) and their shape
/// (`[E, G·32, rows]` for the usual `[E, rows, G, 16]` blocks).
pub fn gpt_oss_dequant(
    name: &str,
    blocks: &[u8],
    blocks_shape: &[usize],
    scales: &[u8],
    scales_shape: &[usize],
) -> Result<(Vec<f32>, Vec<usize>), FormatError> {
    let mx = gpt_oss_to_mx(
        name,
        blocks.to_vec(),
        blocks_shape,
        scales.to_vec(),
        scales_shape,
    )?;
    let flat = mx.dequantize();
    let shape = mx.shape;
    Ok(swap_axes_1_2(&flat, &shape))
}

/// `x.transpose(1, 2).contiguous()` for a row-major tensor of rank ≥ 3.
fn swap_axes_1_2(x: &[f32], shape: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let (d0, d1, d2) = (shape[0], shape[1], shape[2]);
    let inner = numel(&shape[3..]);
    let mut out = vec![0.0f32; x.len()];
    for i0 in 0..d0 {
        for i1 in 0..d1 {
            for i2 in 0..d2 {
                let src = ((i0 * d1 + i1) * d2 + i2) * inner;
                let dst = ((i0 * d2 + i2) * d1 + i1) * inner;
                out[dst..dst + inner].copy_from_slice(&x[src..src + inner]);
            }
        }
    }
    let mut oshape = shape.to_vec();
    oshape.swap(1, 2);
    (out, oshape)
}

/// Checks a DeepSeek-style FP8 weight and its `scale_inv` against each other; returns
/// `(rows, cols, scale_cols)`.
fn check_fp8_block(
    name: &str,
    weight_len: usize,
    shape: &[usize],
    scale_inv: &[f32],
    scale_shape: &[usize],
    block: usize,
) -> Result<(usize, usize, usize), FormatError> {
    let sname = format!("{name}_scale_inv");
    if shape.len() != 2 {
        return Err(FormatError::Shape {
            tensor: name.to_string(),
            expected: "[out_features, in_features] (a 2-D FP8 E4M3 weight)".into(),
            found: format!("{shape:?}"),
        });
    }
    if block == 0 {
        return Err(FormatError::Shape {
            tensor: sname,
            expected: "a block edge ≥ 1 (DeepSeek-V3 uses 128)".into(),
            found: "block = 0".into(),
        });
    }
    check_len(name, shape, weight_len)?;
    let (rows, cols) = (shape[0], shape[1]);
    let want = [rows.div_ceil(block), cols.div_ceil(block)];
    if scale_shape != want {
        return Err(FormatError::Shape {
            tensor: sname,
            expected: format!(
                "{want:?} (ceil({rows}/{block}), ceil({cols}/{block}): one f32 per {block}×{block} block of `{name}`)"
            ),
            found: format!("{scale_shape:?}"),
        });
    }
    check_len(&sname, scale_shape, scale_inv.len())?;
    if let Some(i) = scale_inv.iter().position(|s| !s.is_finite()) {
        return Err(FormatError::BadScale {
            tensor: sname,
            index: unravel(i, scale_shape),
            value: format!("{}", scale_inv[i]),
        });
    }
    Ok((rows, cols, want[1]))
}

/// Dequantizes a DeepSeek-V3 block-scaled FP8 weight: `W[i, j] = e4m3(q[i, j]) ·
/// scale_inv[i / block, j / block]` (one `f32` multiply). `name` is the weight's key; its scale
/// is named `name_scale_inv` in errors. NaN/inf scales are errors; E4M3 NaN codes in the weight
/// itself decode to NaN (data, not metadata).
pub fn fp8_block_dequant(
    name: &str,
    weight: &[u8],
    shape: &[usize],
    scale_inv: &[f32],
    scale_shape: &[usize],
    block: usize,
) -> Result<Vec<f32>, FormatError> {
    let (rows, cols, scols) =
        check_fp8_block(name, weight.len(), shape, scale_inv, scale_shape, block)?;
    let mut out = vec![0.0f32; rows * cols];
    for i in 0..rows {
        let srow = &scale_inv[(i / block) * scols..(i / block + 1) * scols];
        let q = &weight[i * cols..(i + 1) * cols];
        let o = &mut out[i * cols..(i + 1) * cols];
        for (bj, (qc, oc)) in q.chunks(block).zip(o.chunks_mut(block)).enumerate() {
            let s = srow[bj];
            for (d, c) in oc.iter_mut().zip(qc) {
                *d = fp8::E4M3_TABLE[*c as usize] * s;
            }
        }
    }
    Ok(out)
}

/// A block-scaled FP8 weight as DeepSeek-V3 stores it (the result of [`fp8_block_quant`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8BlockWeight {
    /// E4M3 codes, row-major `[rows, cols]`.
    pub weight: Vec<u8>,
    /// `weight_scale_inv`: one f32 per block, row-major `scale_shape`.
    pub scale_inv: Vec<f32>,
    /// `[ceil(rows / block), ceil(cols / block)]`.
    pub scale_shape: [usize; 2],
}

/// Quantizes a 2-D `f32` weight DeepSeek-style, for building test weights: per `block`×`block`
/// block, `scale_inv = amax / 448` (1 for an all-zero block, so that it stays finite) and
/// `q = e4m3(x / scale_inv)` with RNE and [`Overflow::Saturate`].
pub fn fp8_block_quant(
    name: &str,
    x: &[f32],
    shape: &[usize],
    block: usize,
) -> Result<Fp8BlockWeight, FormatError> {
    if shape.len() != 2 || block == 0 {
        return Err(FormatError::Shape {
            tensor: name.to_string(),
            expected: "[out_features, in_features] with a block edge ≥ 1".into(),
            found: format!("{shape:?}, block {block}"),
        });
    }
    check_len(name, shape, x.len())?;
    let (rows, cols) = (shape[0], shape[1]);
    let sshape = [rows.div_ceil(block), cols.div_ceil(block)];
    let mut scale = vec![0.0f32; sshape[0] * sshape[1]];
    for i in 0..rows {
        for j in 0..cols {
            let s = &mut scale[(i / block) * sshape[1] + j / block];
            let a = x[i * cols + j].abs();
            if a > *s || a.is_nan() {
                *s = a;
            }
        }
    }
    for s in &mut scale {
        *s = if *s == 0.0 { 1.0 } else { *s / fp8::E4M3_MAX };
    }
    let mut q = vec![0u8; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            let s = scale[(i / block) * sshape[1] + j / block];
            q[i * cols + j] = fp8::encode_e4m3(x[i * cols + j] / s, Overflow::Saturate);
        }
    }
    Ok(Fp8BlockWeight {
        weight: q,
        scale_inv: scale,
        scale_shape: sshape,
    })
}
