//! Stored dtypes → `f32` (and integer tensors → `i64`), with the checkpoint's quantized packings.
//!
//! Every conversion is exact: F32 is copied, BF16/F16 are widened (both are subsets of f32), FP8
//! E4M3 is dequantised with DeepSeek's 128 × 128 block scales by
//! `accel_sim::formats::packing::fp8_block_dequant`, MXFP4 experts by
//! `accel_sim::formats::packing::gpt_oss_dequant` (the formats module owns the bit-level
//! semantics; this module only finds the tensors and checks their shapes). Bytes are read
//! little-endian from the mapping, so unaligned tensor offsets are fine.

use super::checkpoint::{Checkpoint, Entry};
use super::error::WeightError;
use accel_sim::formats::{bf16, f16, packing};
use safetensors::Dtype;

/// Dtypes [`Checkpoint::f32`] converts without side tensors.
pub const FLOAT_DTYPES: &str = "F32, BF16, F16";

/// The suffix of DeepSeek's FP8 block scales: `<weight>_scale_inv`.
pub const FP8_SCALE_SUFFIX: &str = "_scale_inv";

/// The suffixes of a gpt-oss MXFP4 pair: `<prefix>_blocks`, `<prefix>_scales`.
pub const MXFP4_BLOCKS_SUFFIX: &str = "_blocks";
/// See [`MXFP4_BLOCKS_SUFFIX`].
pub const MXFP4_SCALES_SUFFIX: &str = "_scales";

/// Packed MXFP4 as stored: `(blocks, blocks_shape, scales, scales_shape)`.
pub type Mxfp4Raw = (Vec<u8>, Vec<usize>, Vec<u8>, Vec<usize>);

/// Borrowed [`Mxfp4Raw`].
type Mxfp4Parts<'a> = (&'a [u8], Vec<usize>, &'a [u8], Vec<usize>);

/// `bytes` of a float dtype as f32; `None` for any other dtype.
pub(crate) fn float_to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    Some(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| bf16::decode(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| f16::decode(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        _ => return None,
    })
}

/// `bytes` of an integer dtype as i64; `None` for any other dtype.
pub(crate) fn int_to_i64(dtype: Dtype, bytes: &[u8]) -> Option<Vec<i64>> {
    Some(match dtype {
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("chunks_exact(8)")))
            .collect(),
        Dtype::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            .collect(),
        _ => return None,
    })
}

/// The shape transformers' MXFP4 dequantisation gives for `blocks_shape` (`[E, rows, G, 16]` →
/// `[E, G·32, rows]`: the blocks' rows become the last axis); `None` when the rank is below 4 or
/// the last axis is not 16 bytes.
pub fn mxfp4_logical_shape(blocks_shape: &[usize]) -> Option<Vec<usize>> {
    let n = blocks_shape.len();
    if n < 4 || blocks_shape[n - 1] != packing::GPT_OSS_BYTES_PER_BLOCK {
        return None;
    }
    let mut shape = blocks_shape[..n - 2].to_vec();
    shape.push(blocks_shape[n - 2] * 32);
    shape.swap(1, 2);
    Some(shape)
}

impl Checkpoint {
    /// The tensor as f32, row-major, after checking its shape is `expected` exactly.
    ///
    /// Converts F32/BF16/F16; F8_E4M3 with a sibling `<name>_scale_inv` (DeepSeek 128×128 block
    /// scales, dequantised); refuses other dtypes with an error naming the tensor and dtype.
    pub fn f32(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>, WeightError> {
        let e = self.entry(name, Some(expected))?;
        self.check_shape(name, e, expected)?;
        if let Some(v) = float_to_f32(e.dtype, self.bytes(e)) {
            return Ok(v);
        }
        if e.dtype == Dtype::F8_E4M3 {
            return self.fp8_block(name, e);
        }
        Err(WeightError::UnsupportedDtype {
            file: self.file_of(e),
            tensor: name.to_string(),
            dtype: e.dtype.to_string(),
            accepted: format!(
                "{FLOAT_DTYPES}, or F8_E4M3 with a `{name}{FP8_SCALE_SUFFIX}` block-scale tensor"
            ),
        })
    }

    /// An integer tensor (I64, or I32 widened) of any shape, e.g. the golden files' `input_ids`.
    pub fn i64(&self, name: &str) -> Result<Vec<i64>, WeightError> {
        let e = self.entry(name, None)?;
        int_to_i64(e.dtype, self.bytes(e)).ok_or_else(|| WeightError::UnsupportedDtype {
            file: self.file_of(e),
            tensor: name.to_string(),
            dtype: e.dtype.to_string(),
            accepted: "I64, I32".into(),
        })
    }

    /// MXFP4 expert weights stored as `<prefix>_blocks` (U8) + `<prefix>_scales` (U8), gpt-oss
    /// layout, dequantised to f32 exactly as transformers' `convert_moe_packed_tensors` does.
    ///
    /// `expected` is the dequantised shape, checked before any work: blocks `[E, rows, G, 16]`
    /// give `[E, G·32, rows]` (see [`mxfp4_logical_shape`]), e.g. `[E, hidden, 2·inter]` for
    /// `gate_up_proj` stored with `2·inter` rows of `hidden` values.
    pub fn mxfp4_f32(&self, prefix: &str, expected: &[usize]) -> Result<Vec<f32>, WeightError> {
        let (blocks, bshape, scales, sshape) = self.mxfp4_parts(prefix, Some(expected))?;
        let bname = format!("{prefix}{MXFP4_BLOCKS_SUFFIX}");
        let e = self.entry(&bname, None)?;
        match mxfp4_logical_shape(&bshape) {
            Some(logical) if logical == expected => {}
            Some(logical) => {
                return Err(WeightError::WrongShape {
                    file: self.file_of(e),
                    tensor: prefix.to_string(),
                    expected: expected.to_vec(),
                    found: logical,
                })
            }
            // Rank or block size wrong: let the format check phrase the error.
            None => {}
        }
        packing::gpt_oss_dequant(prefix, blocks, &bshape, scales, &sshape)
            .map(|(v, _)| v)
            .map_err(|err| WeightError::Format {
                file: self.file_of(e),
                tensor: prefix.to_string(),
                message: err.to_string(),
            })
    }

    /// Raw packed MXFP4 blocks and scales, for kernels that dequantise on the fly:
    /// `(blocks, blocks_shape, scales, scales_shape)` as stored.
    pub fn mxfp4_raw(&self, prefix: &str) -> Result<Mxfp4Raw, WeightError> {
        let (b, bs, s, ss) = self.mxfp4_parts(prefix, None)?;
        Ok((b.to_vec(), bs, s.to_vec(), ss))
    }

    /// Borrowed MXFP4 parts, dtypes checked (blocks U8; scales U8 or F8_E8M0, the same bytes).
    fn mxfp4_parts(
        &self,
        prefix: &str,
        expected: Option<&[usize]>,
    ) -> Result<Mxfp4Parts<'_>, WeightError> {
        let bname = format!("{prefix}{MXFP4_BLOCKS_SUFFIX}");
        let sname = format!("{prefix}{MXFP4_SCALES_SUFFIX}");
        // The expected shape belongs to the dequantised tensor, not to either part: report it
        // only on the prefix.
        let b = self.tensors.get(&bname).ok_or_else(|| {
            let mut err = self.missing(&bname, None);
            if let WeightError::MissingTensor { expected: x, .. } = &mut err {
                *x = expected.map(<[usize]>::to_vec);
            }
            err
        })?;
        let s = self.entry(&sname, None)?;
        self.require_dtype(&bname, b, &[Dtype::U8], "U8 (two E2M1 values per byte)")?;
        self.require_dtype(
            &sname,
            s,
            &[Dtype::U8, Dtype::F8_E8M0],
            "U8 or F8_E8M0 (one E8M0 scale per block)",
        )?;
        Ok((
            self.bytes(b),
            b.shape.clone(),
            self.bytes(s),
            s.shape.clone(),
        ))
    }

    fn require_dtype(
        &self,
        name: &str,
        e: &Entry,
        ok: &[Dtype],
        accepted: &str,
    ) -> Result<(), WeightError> {
        if ok.contains(&e.dtype) {
            return Ok(());
        }
        Err(WeightError::UnsupportedDtype {
            file: self.file_of(e),
            tensor: name.to_string(),
            dtype: e.dtype.to_string(),
            accepted: accepted.to_string(),
        })
    }

    pub(crate) fn check_shape(
        &self,
        name: &str,
        e: &Entry,
        expected: &[usize],
    ) -> Result<(), WeightError> {
        if e.shape == expected {
            return Ok(());
        }
        Err(WeightError::WrongShape {
            file: self.file_of(e),
            tensor: name.to_string(),
            expected: expected.to_vec(),
            found: e.shape.clone(),
        })
    }

    /// DeepSeek FP8: E4M3 codes times the f32 (or bf16) block scale `<name>_scale_inv`.
    fn fp8_block(&self, name: &str, e: &Entry) -> Result<Vec<f32>, WeightError> {
        let sname = format!("{name}{FP8_SCALE_SUFFIX}");
        let s = self
            .tensors
            .get(&sname)
            .ok_or_else(|| WeightError::UnsupportedDtype {
                file: self.file_of(e),
                tensor: name.to_string(),
                dtype: e.dtype.to_string(),
                accepted: format!(
                    "F8_E4M3 only with its block scales `{sname}`, which the checkpoint lacks"
                ),
            })?;
        let scale =
            float_to_f32(s.dtype, self.bytes(s)).ok_or_else(|| WeightError::UnsupportedDtype {
                file: self.file_of(s),
                tensor: sname.clone(),
                dtype: s.dtype.to_string(),
                accepted: FLOAT_DTYPES.into(),
            })?;
        packing::fp8_block_dequant(
            name,
            self.bytes(e),
            &e.shape,
            &scale,
            &s.shape,
            packing::DEEPSEEK_FP8_BLOCK,
        )
        .map_err(|err| WeightError::Format {
            file: self.file_of(e),
            tensor: name.to_string(),
            message: err.to_string(),
        })
    }
}
