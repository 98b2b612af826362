//! Whole safetensors files of f32 tensors: what `day0 forward --logits-out` writes, and what
//! golden files and reference activations are read with.

use super::checkpoint::Checkpoint;
use super::convert::{float_to_f32, int_to_i64, FLOAT_DTYPES};
use super::error::WeightError;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// Largest integer magnitude every f32 represents exactly (2^24).
const F32_EXACT_INT: i64 = 1 << 24;

/// One tensor of a whole file: `(name, shape, values)`.
pub type NamedTensor = (String, Vec<usize>, Vec<f32>);

/// Writes f32 tensors to a safetensors file (used by `day0 forward --logits-out`).
///
/// Each tensor is `(name, shape, values)` with `values.len()` the product of `shape`; `metadata`
/// goes to the header's `__metadata__`. The file is written to a sibling temporary file and renamed
/// (the safetensors crate's writer), so a reader never sees half a file.
pub fn write_f32(
    path: &Path,
    tensors: &[(&str, &[usize], &[f32])],
    metadata: &[(&str, &str)],
) -> Result<(), WeightError> {
    let file = path.display().to_string();
    let bad = |tensor: &str, message: String| WeightError::Write {
        file: file.clone(),
        tensor: tensor.to_string(),
        message,
    };
    let mut seen = BTreeSet::new();
    let mut bytes: Vec<Vec<u8>> = Vec::with_capacity(tensors.len());
    for (name, shape, values) in tensors {
        if name.is_empty() {
            return Err(bad(name, "tensor names must not be empty".into()));
        }
        if !seen.insert(*name) {
            return Err(bad(name, "the name is given twice".into()));
        }
        let numel = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| bad(name, format!("shape {shape:?} overflows")))?;
        if numel != values.len() {
            return Err(bad(
                name,
                format!(
                    "shape {shape:?} needs {numel} values, {} given",
                    values.len()
                ),
            ));
        }
        bytes.push(values.iter().flat_map(|v| v.to_le_bytes()).collect());
    }
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), b)| {
            TensorView::new(Dtype::F32, shape.to_vec(), b)
                .map(|v| (name.to_string(), v))
                .map_err(|e| bad(name, e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let meta: Option<HashMap<String, String>> = (!metadata.is_empty()).then(|| {
        metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    safetensors::serialize_to_file(views, meta, path).map_err(|e| bad("(file)", e.to_string()))
}

/// Reads every tensor of one safetensors file as f32 (golden files, reference activations),
/// sorted by name: `(name, shape, values)`.
///
/// Float tensors (F32/BF16/F16) convert exactly; integer tensors (I64/I32, e.g. `input_ids`)
/// convert when every value is exactly an f32 (|v| ≤ 2^24), else the tensor is refused (read it
/// with [`Checkpoint::open_file`] and [`Checkpoint::i64`]). Other dtypes are refused by name.
pub fn read_all_f32(path: &Path) -> Result<Vec<NamedTensor>, WeightError> {
    let ckpt = Checkpoint::open_file(path)?;
    ckpt.tensors
        .iter()
        .map(|(name, e)| {
            let bytes = ckpt.bytes(e);
            let refuse = |accepted: &str| WeightError::UnsupportedDtype {
                file: ckpt.file_of(e),
                tensor: name.clone(),
                dtype: e.dtype.to_string(),
                accepted: accepted.to_string(),
            };
            let values = match float_to_f32(e.dtype, bytes) {
                Some(v) => v,
                None => {
                    let ints = int_to_i64(e.dtype, bytes)
                        .ok_or_else(|| refuse(&format!("{FLOAT_DTYPES}, I64, I32")))?;
                    if ints.iter().any(|v| v.abs() > F32_EXACT_INT) {
                        return Err(refuse(
                            "integers only up to 2^24 in magnitude as f32 (read larger ones \
                             with Checkpoint::i64)",
                        ));
                    }
                    ints.into_iter().map(|v| v as f32).collect()
                }
            };
            Ok((name.clone(), e.shape.clone(), values))
        })
        .collect()
}
