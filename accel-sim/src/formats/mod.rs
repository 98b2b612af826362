//! Low-precision number formats, exactly: encode from `f32`, decode to `f32`, block scaling, and
//! the checkpoint packings new models ship their weights in.
//!
//! One module per format:
//! - [`bf16`], [`mod@f16`]: the 16-bit IEEE-like formats (via the `half` crate);
//! - [`fp8`]: OCP FP8 E4M3 ("fn": no infinity, NaN `0x7F`/`0xFF`) and E5M2 (IEEE-like);
//! - [`fp4`]: OCP FP4 E2M1 (no infinity, no NaN);
//! - [`e8m0`]: the MX shared scale, `2^(b − 127)`, `0xFF` = NaN;
//! - [`mx`]: MXFP4 / MXFP8 block tensors (32 elements share one E8M0 scale) with the OCP MX v1.0
//!   quantization rule;
//! - [`packing`]: the gpt-oss `*_blocks`/`*_scales` MXFP4 layout (exactly as Hugging Face
//!   transformers dequantizes it) and DeepSeek-V3 block-scaled FP8 weights.
//!
//! Conventions kept by every module, because silent differences here become wrong models later:
//! - encoding from `f32` rounds to nearest, ties to even (RNE); subnormals are exact;
//! - what happens on overflow is never implicit: every encoder takes an [`Overflow`] policy;
//! - bad packed data (wrong shapes, NaN scales) is a [`FormatError`] naming the tensor and the
//!   shape it should have had, never a panic.
//!
//! Golden data produced by independent implementations (ml_dtypes, numpy, torch + transformers)
//! lives in `tests/reference/` at the workspace root; `accel-sim/tests/formats_golden.rs` compares
//! against it bit for bit.

use std::fmt;

pub mod bf16;
pub mod e8m0;
pub mod f16;
pub mod fp4;
pub mod fp8;
pub(crate) mod minifloat;
pub mod mx;
pub mod packing;

/// What an encoder does with a value beyond the format's largest finite magnitude (including
/// ±infinity).
///
/// There is no default: hardware and libraries disagree (ml_dtypes' E4M3 cast turns 465 into NaN,
/// torch's and NVIDIA's `.satfinite` conversions give 448), so the caller says which it wants.
/// NaN inputs are not overflow: they stay NaN in every format that has one (see [`fp4`] for E2M1,
/// which has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Overflow {
    /// Clamp to ±(largest finite value); ±infinity also becomes ±max. This is NVIDIA's
    /// `cvt.satfinite` / torch's E4M3 cast behaviour, and what the OCP MX rule asks for elements.
    Saturate,
    /// What an IEEE-style cast does, and what ml_dtypes does: overflow becomes ±infinity where the
    /// format has one (E5M2, bf16, f16), NaN where it has only NaN (E4M3, E8M0), and ±max where it
    /// has neither (E2M1).
    NanOrInf,
}

/// Bad quantized data or metadata: always names the tensor and says what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// A tensor's shape is not the one the format requires.
    Shape {
        /// Tensor name (checkpoint key, or a descriptive name).
        tensor: String,
        /// The shape that was required, and why (e.g. `[2, 8, 3]` (blocks shape without its last axis)).
        expected: String,
        /// The shape that was given.
        found: String,
    },
    /// A buffer's length does not match its declared shape.
    Length {
        /// Tensor name.
        tensor: String,
        /// Declared shape.
        shape: Vec<usize>,
        /// Elements (or bytes) the shape implies.
        expected: usize,
        /// Elements (or bytes) present.
        found: usize,
    },
    /// A scale that must be a finite number is not (E8M0 `0xFF`, or a NaN/inf/zero f32 scale).
    BadScale {
        /// Tensor name (the scale tensor).
        tensor: String,
        /// Multi-index of the first offending scale.
        index: Vec<usize>,
        /// The offending value, as written in the checkpoint (e.g. `0xFF (E8M0 NaN)`).
        value: String,
    },
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Shape { tensor, expected, found } => {
                write!(f, "tensor `{tensor}`: expected shape {expected}, found {found}")
            }
            FormatError::Length { tensor, shape, expected, found } => write!(
                f,
                "tensor `{tensor}`: shape {shape:?} needs {expected} elements, but the buffer holds {found}"
            ),
            FormatError::BadScale { tensor, index, value } => write!(
                f,
                "tensor `{tensor}`: scale at index {index:?} is {value}; scales must be finite \
                 (the checkpoint is corrupt or was written with a different convention)"
            ),
        }
    }
}

impl std::error::Error for FormatError {}

/// Product of a shape's extents (the element count); `[]` is a scalar (1).
pub(crate) fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Checks that `len` matches `shape`, naming `tensor` otherwise.
pub(crate) fn check_len(tensor: &str, shape: &[usize], len: usize) -> Result<(), FormatError> {
    let expected = numel(shape);
    if expected != len {
        return Err(FormatError::Length {
            tensor: tensor.to_string(),
            shape: shape.to_vec(),
            expected,
            found: len,
        });
    }
    Ok(())
}

/// The multi-index of flat position `flat` in a row-major `shape` (for error messages).
pub(crate) fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (i, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[i] = flat % d;
            flat /= d;
        }
    }
    idx
}
