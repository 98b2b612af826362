//! # Weights: safetensors checkpoints, memory-mapped, read as f32
//!
//! Release day's weights are Hugging Face safetensors files: `model.safetensors`, or shards named
//! by `model.safetensors.index.json`. [`Checkpoint::open`] maps them (reading only the headers);
//! [`Checkpoint::f32`] reads one tensor as row-major f32 after checking its shape, converting
//! F32/BF16/F16 and DeepSeek's block-scaled FP8; [`Checkpoint::mxfp4_f32`] /
//! [`Checkpoint::mxfp4_raw`] read gpt-oss-style MXFP4 experts. [`expected_tensors`] says which
//! tensors a [`ModelConfig`] needs under which Hugging Face names ([`names`] documents them per
//! architecture), and [`verify`] checks a checkpoint against them, reporting every problem at once.
//! [`write_f32`] / [`read_all_f32`] handle whole files of f32 tensors (logits out, golden files).
//!
//! Modules: [`checkpoint`] (files, index, mmap, truncation checks), [`convert`] (dtypes → f32),
//! [`names`] (expected tensors per architecture), [`experts`] (routed-expert layouts, each read
//! into one), [`verification`] ([`check`], [`verify`]), [`tensor_file`] (whole-file write/read),
//! [`error`] ([`WeightError`]: every variant names the file and the tensor).
//!
//! [`ModelConfig`]: crate::config::ModelConfig

pub mod checkpoint;
pub mod convert;
pub mod error;
pub mod experts;
pub mod names;
pub mod tensor_file;
pub mod verification;

pub use checkpoint::{Checkpoint, TensorInfo};
pub use convert::{mxfp4_logical_shape, Mxfp4Raw};
pub use error::WeightError;
pub use experts::{gate_up_columns, ExpertBank, ExpertLayout, ExpertWeights};
pub use names::{expected_tensors, expert_banks, ExpectedTensor, Storage};
pub use tensor_file::{read_all_f32, write_f32, NamedTensor};
pub use verification::{check, verify, VerifyReport};

use std::collections::HashMap;

/// Most close names a missing-tensor error lists.
const MAX_CLOSE: usize = 3;

/// Finds names close to a missing one: same numbers in the same order (layer, expert), and an
/// edit distance of at most `max(2, len / 10)` — a prefix typo (`model.layer.0...`), a module
/// renamed by one letter (`shared_expert` vs `shared_experts`), `q_proj` vs `q_a_proj`. Grouping by
/// the numbers first keeps this cheap on checkpoints with 10^5 tensors.
pub(crate) struct CloseNames {
    by_numbers: HashMap<Vec<u64>, Vec<String>>,
}

impl CloseNames {
    /// Indexes `names`.
    pub(crate) fn new<'a>(names: impl Iterator<Item = &'a str>) -> CloseNames {
        let mut by_numbers: HashMap<Vec<u64>, Vec<String>> = HashMap::new();
        for n in names {
            by_numbers
                .entry(numbers(n))
                .or_default()
                .push(n.to_string());
        }
        CloseNames { by_numbers }
    }

    /// Up to [`MAX_CLOSE`] names close to `name`, closest first.
    pub(crate) fn find(&self, name: &str) -> Vec<String> {
        let Some(group) = self.by_numbers.get(&numbers(name)) else {
            return Vec::new();
        };
        let limit = (name.len() / 10).max(2);
        let mut scored: Vec<(usize, &String)> = group
            .iter()
            .filter(|c| c.len().abs_diff(name.len()) <= limit)
            .filter_map(|c| {
                let d = edit_distance(name, c);
                (d <= limit && d > 0).then_some((d, c))
            })
            .collect();
        scored.sort();
        scored
            .into_iter()
            .take(MAX_CLOSE)
            .map(|(_, c)| c.clone())
            .collect()
    }
}

/// Close names for one missing tensor (see [`CloseNames`]).
pub(crate) fn close_names<'a>(name: &str, names: impl Iterator<Item = &'a str>) -> Vec<String> {
    let key = numbers(name);
    CloseNames::new(names.filter(|n| numbers(n) == key)).find(name)
}

/// The decimal numbers in a name, in order (`model.layers.3.mlp.experts.17...` → `[3, 17]`).
fn numbers(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(u64::MAX))
        .collect()
}

/// Levenshtein distance over bytes (tensor names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, &ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}
