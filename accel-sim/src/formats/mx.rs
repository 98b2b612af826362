//! OCP Microscaling (MX v1.0) block tensors: MXFP4 (E2M1 elements) and MXFP8 (E4M3 or E5M2
//! elements), 32 consecutive elements sharing one E8M0 power-of-two scale.
//!
//! ## Quantization (the OCP MX v1.0 rule, §6.3)
//! For a block `V` of 32 values:
//! 1. `shared_exp = floor(log2(max_i |V_i|)) − emax_elem`, with `emax_elem` the exponent of the
//!    element format's largest normal (E2M1: 2, E4M3: 8, E5M2: 15);
//! 2. the scale is `X = 2^shared_exp`, stored as E8M0;
//! 3. each element is `quantize(V_i / X)`: round to nearest even, **saturating** at the element
//!    format's largest value (the spec's "clamping normal numbers to max").
//!
//! What the spec leaves open, decided as Microsoft's `microxcaling` reference library
//! (`mx/mx_ops.py::_quantize_mx`, the code accompanying the spec) does:
//! - `shared_exp` below −127 is clamped to −127 (scale byte `0x00`); this includes the all-zero
//!   block (the library takes log2 of the smallest normal for a zero max), so a zero block gets
//!   scale `0x00` and zero elements;
//! - a block containing NaN or ±inf gets the NaN scale `0xFF` (its element codes are written as
//!   zeros; they are meaningless, as the whole block decodes to NaN);
//! - `floor(log2(amax))` is taken exactly, from the float's exponent bits (subnormal inputs
//!   included). The reference computes it with a float `log2`, which can round up to the next
//!   integer for an `amax` just below a power of two; the spec's definition is the exact one.
//!
//! Because the element is rounded *after* the scale is chosen, an `amax` whose mantissa is above
//! the element format's largest (e.g. 7·2^k for E2M1, whose largest is 6) saturates:
//! `amax = 7` gets scale 1 and quantizes to 6.
//!
//! ## Error bound (MXFP4)
//! With scale `X`, an element with `|v| ≤ 6X` is off by at most half the E2M1 spacing at its
//! magnitude: `X/4` below `2X`, `X/2` below `4X`, `X` up to `6X`. Only elements above `6X`
//! (possible only when the block's max has mantissa > 1.5) saturate, off by `|v| − 6X < 2X`.
//! So per block `max |v − v̂| ≤ 2X = 2^(⌊log2 amax⌋ − 1) ≤ amax/2`, and `≤ X ≤ amax/4` when no
//! element exceeds `6X`. (`accel-sim/tests/formats_props.rs` checks the per-element form.)
//!
//! ## Layout
//! Blocks run along the last axis of the logical shape `[.., cols]`; each row is padded with
//! zeros to a whole number of blocks. `data` is `[rows, blocks_per_row, bytes_per_block]`
//! (MXFP4: 16 bytes, two elements per byte, low nibble first; MXFP8: 32 bytes) and `scales` is
//! `[rows, blocks_per_row]` — for MXFP4 exactly the gpt-oss `*_blocks` / `*_scales` layout.

use super::minifloat::Spec;
use super::{check_len, e8m0, fp4, fp8, numel, FormatError, Overflow};
use wide::f32x8;

/// Elements per MX block.
pub const MX_BLOCK: usize = 32;

/// The element format of an MX tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MxElem {
    /// MXFP4: FP4 E2M1 elements.
    Fp4E2M1,
    /// MXFP8 with FP8 E4M3 elements.
    Fp8E4M3,
    /// MXFP8 with FP8 E5M2 elements.
    Fp8E5M2,
}

impl MxElem {
    /// Exponent of the element format's largest normal (`emax_elem` in the OCP MX tables).
    pub const fn emax(self) -> i32 {
        self.spec().emax
    }

    /// Bits per element.
    pub const fn bits(self) -> u32 {
        self.spec().bits
    }

    /// Largest finite element value.
    pub const fn max(self) -> f32 {
        self.spec().max
    }

    /// Bytes of element data per block (16 for MXFP4, 32 for MXFP8).
    pub const fn bytes_per_block(self) -> usize {
        MX_BLOCK * self.bits() as usize / 8
    }

    /// A short name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            MxElem::Fp4E2M1 => "mxfp4 (e2m1)",
            MxElem::Fp8E4M3 => "mxfp8 (e4m3)",
            MxElem::Fp8E5M2 => "mxfp8 (e5m2)",
        }
    }

    pub(crate) const fn spec(self) -> Spec {
        match self {
            MxElem::Fp4E2M1 => fp4::E2M1,
            MxElem::Fp8E4M3 => fp8::E4M3,
            MxElem::Fp8E5M2 => fp8::E5M2,
        }
    }

    /// Decodes one element code.
    #[inline]
    pub fn decode(self, code: u8) -> f32 {
        match self {
            MxElem::Fp4E2M1 => fp4::E2M1_TABLE[(code & 0xF) as usize],
            MxElem::Fp8E4M3 => fp8::E4M3_TABLE[code as usize],
            MxElem::Fp8E5M2 => fp8::E5M2_TABLE[code as usize],
        }
    }

    /// Encodes one element (RNE, overflow per `ovf`).
    #[inline]
    pub fn encode(self, x: f32, ovf: Overflow) -> u8 {
        self.spec().encode(x, ovf)
    }
}

/// `floor(log2(a))` for a finite `a > 0`, exactly (from the exponent bits; subnormals included).
#[inline]
fn floor_log2(a: f32) -> i32 {
    let bits = a.to_bits() & 0x7FFF_FFFF;
    let fexp = (bits >> 23) as i32;
    if fexp == 0 {
        // Subnormal: value = frac · 2^−149, leading one at bit 31 − lz.
        (31 - bits.leading_zeros() as i32) - 149
    } else {
        fexp - 127
    }
}

/// The E8M0 scale byte the OCP MX rule gives a block whose largest magnitude is `amax`
/// (see the module docs): NaN for a NaN or infinite `amax`, `0x00` for zero.
pub fn shared_scale(amax: f32, elem: MxElem) -> u8 {
    if !amax.is_finite() {
        return e8m0::NAN;
    }
    if amax == 0.0 {
        return 0;
    }
    let e = floor_log2(amax) - elem.emax();
    // Finite f32 has floor(log2) ≤ 127 and emax ≥ 2, so only the lower clamp can apply.
    (e.max(-e8m0::BIAS) + e8m0::BIAS) as u8
}

/// Quantizes one block (`x.len() ≤ 32`; a short block is a ragged tail, padded with zeros by the
/// caller's layout) into one element code per entry of `codes`, and returns the scale byte.
pub fn quantize_block(x: &[f32], elem: MxElem, codes: &mut [u8]) -> u8 {
    assert!(
        x.len() <= MX_BLOCK && codes.len() == x.len(),
        "quantize_block: bad block length"
    );
    let mut amax = 0.0f32;
    for v in x {
        let a = v.abs();
        // NaN must win (f32::max would drop it).
        if a.is_nan() || a > amax {
            amax = a;
            if a.is_nan() {
                break;
            }
        }
    }
    let scale = shared_scale(amax, elem);
    let Some(e) = e8m0::exponent(scale) else {
        codes.fill(0);
        return scale;
    };
    // 1/X = 2^−e is a normal f32 (−e ∈ [−125, 127]); v · 2^−e is exact unless it falls below
    // 2^−126, and such values round to ±0 in every element format either way.
    let inv = f32::from_bits(((127 - e) as u32) << 23);
    let spec = elem.spec();
    for (c, v) in codes.iter_mut().zip(x) {
        *c = spec.encode(v * inv, Overflow::Saturate);
    }
    scale
}

/// Dequantizes one block: `out[i] = decode(element i) · 2^(scale − 127)`; a NaN scale makes every
/// output NaN. `data` is the block's element bytes (16 for MXFP4, 32 for MXFP8); `out.len() ≤ 32`
/// takes the first elements (ragged tail).
///
/// The products are exact unless they leave the `f32` range (E2M1 6 · 2^127 is ±inf, as torch's
/// `ldexp` gives too).
#[inline]
pub fn dequantize_block(elem: MxElem, data: &[u8], scale: u8, out: &mut [f32]) {
    assert!(
        out.len() <= MX_BLOCK && data.len() == elem.bytes_per_block(),
        "dequantize_block: a block is {} bytes and at most 32 values",
        elem.bytes_per_block()
    );
    if scale == e8m0::NAN {
        out.fill(f32::NAN);
        return;
    }
    let s = e8m0::decode(scale);
    match <&mut [f32; MX_BLOCK]>::try_from(&mut *out) {
        // Full blocks (the hot case) are written in place; a ragged tail goes through a buffer.
        Ok(full) => decode_scaled(elem, data, s, full),
        Err(_) => {
            let mut vals = [0.0f32; MX_BLOCK];
            decode_scaled(elem, data, s, &mut vals);
            let n = out.len();
            out.copy_from_slice(&vals[..n]);
        }
    }
}

/// Table lookups, then one multiply by the (power-of-two) scale, eight lanes at a time.
#[inline(always)]
fn decode_scaled(elem: MxElem, data: &[u8], s: f32, out: &mut [f32; MX_BLOCK]) {
    match elem {
        MxElem::Fp4E2M1 => {
            // One lookup per byte yields both of its elements (low nibble first), scaled at once.
            for (pair, b) in out.chunks_exact_mut(2).zip(data) {
                let [lo, hi] = fp4::E2M1_PAIR_TABLE[*b as usize];
                pair[0] = lo * s;
                pair[1] = hi * s;
            }
            return;
        }
        MxElem::Fp8E4M3 => fp8::decode_with(&fp8::E4M3_TABLE, data, out),
        MxElem::Fp8E5M2 => fp8::decode_with(&fp8::E5M2_TABLE, data, out),
    }
    let sv = f32x8::splat(s);
    for chunk in out.chunks_exact_mut(8) {
        let v = f32x8::new(chunk.try_into().expect("8 lanes")) * sv;
        chunk.copy_from_slice(&v.to_array());
    }
}

/// An MX-quantized tensor: element codes and E8M0 scales, blocks along the last axis (see the
/// module docs for the byte layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MxTensor {
    /// Element format.
    pub elem: MxElem,
    /// Logical shape (`[.., cols]`); blocks run along the last axis.
    pub shape: Vec<usize>,
    /// Element bytes, `[rows, blocks_per_row, bytes_per_block]`.
    pub data: Vec<u8>,
    /// E8M0 scale bytes, `[rows, blocks_per_row]`.
    pub scales: Vec<u8>,
}

impl MxTensor {
    /// Rows (product of all axes but the last).
    pub fn rows(&self) -> usize {
        numel(&self.shape[..self.shape.len() - 1])
    }

    /// Elements per row (the last axis).
    pub fn cols(&self) -> usize {
        *self.shape.last().expect("rank ≥ 1")
    }

    /// Blocks per row: `ceil(cols / 32)`.
    pub fn blocks_per_row(&self) -> usize {
        self.cols().div_ceil(MX_BLOCK)
    }

    /// Bytes of device memory the tensor occupies (element data plus scales).
    pub fn nbytes(&self) -> usize {
        self.data.len() + self.scales.len()
    }

    /// Quantizes `x` (row-major, `shape`) with the OCP MX rule. `name` only labels errors.
    pub fn quantize(
        name: &str,
        x: &[f32],
        shape: &[usize],
        elem: MxElem,
    ) -> Result<Self, FormatError> {
        check_rank(name, shape)?;
        check_len(name, shape, x.len())?;
        let cols = *shape.last().expect("rank ≥ 1");
        let rows = numel(&shape[..shape.len() - 1]);
        let g = cols.div_ceil(MX_BLOCK);
        let bpb = elem.bytes_per_block();
        let mut data = vec![0u8; rows * g * bpb];
        let mut scales = vec![0u8; rows * g];
        let mut codes = [0u8; MX_BLOCK];
        for r in 0..rows {
            let row = &x[r * cols..(r + 1) * cols];
            for (b, blk) in row.chunks(MX_BLOCK).enumerate() {
                let n = blk.len();
                codes.fill(0);
                scales[r * g + b] = quantize_block(blk, elem, &mut codes[..n]);
                let dst = &mut data[(r * g + b) * bpb..(r * g + b + 1) * bpb];
                pack_codes(elem, &codes, dst);
            }
        }
        Ok(MxTensor {
            elem,
            shape: shape.to_vec(),
            data,
            scales,
        })
    }

    /// Wraps already-quantized bytes, checking that their lengths match `shape` (errors name
    /// `name`). NaN scales are allowed (the MX spec gives them a meaning: the block is NaN).
    pub fn from_parts(
        name: &str,
        elem: MxElem,
        shape: &[usize],
        data: Vec<u8>,
        scales: Vec<u8>,
    ) -> Result<Self, FormatError> {
        check_rank(name, shape)?;
        let cols = *shape.last().expect("rank ≥ 1");
        let rows = numel(&shape[..shape.len() - 1]);
        let g = cols.div_ceil(MX_BLOCK);
        let mut dshape = shape[..shape.len() - 1].to_vec();
        dshape.extend([g, elem.bytes_per_block()]);
        check_len(&format!("{name} (element data)"), &dshape, data.len())?;
        check_len(
            &format!("{name} (scales)"),
            &dshape[..dshape.len() - 1],
            scales.len(),
        )?;
        debug_assert_eq!(scales.len(), rows * g);
        Ok(MxTensor {
            elem,
            shape: shape.to_vec(),
            data,
            scales,
        })
    }

    /// Dequantizes into a new row-major `f32` buffer of `shape`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; numel(&self.shape)];
        self.dequantize_into(&mut out);
        out
    }

    /// Dequantizes into `out` (row-major, `numel(shape)` values).
    pub fn dequantize_into(&self, out: &mut [f32]) {
        let (rows, cols, g) = (self.rows(), self.cols(), self.blocks_per_row());
        assert_eq!(out.len(), rows * cols, "dequantize_into: output length");
        let bpb = self.elem.bytes_per_block();
        for r in 0..rows {
            let orow = &mut out[r * cols..(r + 1) * cols];
            for (b, o) in orow.chunks_mut(MX_BLOCK).enumerate() {
                let k = r * g + b;
                dequantize_block(
                    self.elem,
                    &self.data[k * bpb..(k + 1) * bpb],
                    self.scales[k],
                    o,
                );
            }
        }
    }
}

/// Writes one block's codes (one per byte) into its packed bytes.
fn pack_codes(elem: MxElem, codes: &[u8; MX_BLOCK], dst: &mut [u8]) {
    match elem {
        MxElem::Fp4E2M1 => {
            for (d, pair) in dst.iter_mut().zip(codes.chunks_exact(2)) {
                *d = (pair[0] & 0xF) | (pair[1] << 4);
            }
        }
        MxElem::Fp8E4M3 | MxElem::Fp8E5M2 => dst.copy_from_slice(codes),
    }
}

fn check_rank(name: &str, shape: &[usize]) -> Result<(), FormatError> {
    if shape.is_empty() {
        return Err(FormatError::Shape {
            tensor: name.to_string(),
            expected: "rank ≥ 1 (MX blocks run along the last axis)".into(),
            found: "[] (a scalar)".into(),
        });
    }
    Ok(())
}
