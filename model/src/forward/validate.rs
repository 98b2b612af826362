//! Layer-by-layer comparison of a forward pass with reference activations (a file of
//! `hidden_states.{i}` and `logits` tensors, as `tests/reference/gen_models.py` writes them from
//! transformers): where does day0 first diverge from the reference, and how badly at worst.
//!
//! The relative error is `max |ours − ref| / max(|ref|, rms(ref))` over the whole tensor — the
//! tail, not the mean — with the position (token) where it occurs; cosine similarity is per
//! tensor. A layer is flagged when its relative error exceeds the threshold.

use super::{ForwardError, Runner};
use kernels::reference::rel_error;

/// The comparison of one tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDiff {
    /// `embedding`, `layer 3`, `logits`.
    pub name: String,
    /// Cosine similarity of the flattened tensors.
    pub cosine: f64,
    /// Largest absolute difference.
    pub max_abs: f64,
    /// Largest relative difference (see the module docs).
    pub max_rel: f64,
    /// Relative L2 distance `‖ours − reference‖ / ‖reference‖` over all positions (the measure
    /// the native-precision check bounds by transformers' own bf16 distance).
    pub rel_l2: f64,
    /// Token position of the largest absolute difference.
    pub worst_position: usize,
    /// Whether `max_rel` exceeds the threshold (or anything is NaN).
    pub flagged: bool,
}

/// A whole validation run.
#[derive(Debug, Clone, PartialEq)]
pub struct Validation {
    /// The tokens run.
    pub tokens: usize,
    /// One entry per reference tensor found, in model order.
    pub diffs: Vec<TensorDiff>,
    /// The threshold used.
    pub threshold: f64,
}

impl Validation {
    /// The worst relative error over every tensor.
    pub fn tail_error(&self) -> f64 {
        self.diffs.iter().map(|d| d.max_rel).fold(0.0, f64::max)
    }

    /// The first flagged tensor (where the divergence starts), if any.
    pub fn first_flagged(&self) -> Option<&TensorDiff> {
        self.diffs.iter().find(|d| d.flagged)
    }
}

/// Compares `ours` with `reference` (row-major, `width` values per token).
pub fn compare(
    name: &str,
    ours: &[f32],
    reference: &[f32],
    width: usize,
    threshold: f64,
) -> TensorDiff {
    let want: Vec<f64> = reference.iter().map(|v| *v as f64).collect();
    let max_rel = if ours.len() == reference.len() {
        rel_error(ours, &want)
    } else {
        f64::INFINITY
    };
    let (mut dot, mut na, mut nb, mut max_abs, mut worst) = (0.0, 0.0, 0.0, 0.0f64, 0);
    let mut nd = 0.0;
    for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
        let (a, b) = (*a as f64, *b as f64);
        dot += a * b;
        na += a * a;
        nb += b * b;
        nd += (a - b) * (a - b);
        let d = (a - b).abs();
        if d > max_abs || d.is_nan() {
            max_abs = d;
            worst = i / width.max(1);
        }
    }
    let cosine = dot / (na.sqrt() * nb.sqrt()).max(f64::MIN_POSITIVE);
    TensorDiff {
        name: name.to_string(),
        cosine,
        max_abs,
        max_rel,
        rel_l2: if ours.len() == reference.len() {
            nd.sqrt() / nb.sqrt().max(f64::MIN_POSITIVE)
        } else {
            f64::INFINITY
        },
        worst_position: worst,
        flagged: max_rel.is_nan() || max_rel > threshold,
    }
}

/// Runs `tokens` through a fresh `runner` with hidden-state capture and compares every
/// `hidden_states.{i}` and `logits` tensor of `reference` (name, shape, data). A reference with
/// images (`pixel_values` and `image_grid_thw`, as `tests/reference/gen_vision.py` writes them)
/// runs them through the vision encoder first and also compares each encoder block's output
/// (`vision.hidden_states.{i}`) and the encoder's outputs (`vision.tokens`,
/// `vision.deepstack.{j}`); `tokens` then hold the image placeholders.
pub fn validate(
    runner: &mut Runner,
    tokens: &[i64],
    reference: &[(String, Vec<usize>, Vec<f32>)],
    threshold: f64,
) -> Result<Validation, ForwardError> {
    let find = |name: &str| reference.iter().find(|(n, _, _)| n == name);
    let mut diffs = Vec::new();
    runner.capture_hidden(true);
    let images = match (find("pixel_values"), find("image_grid_thw")) {
        (Some((_, _, pixels)), Some((_, _, grid))) => {
            let grids: Vec<[usize; 3]> = grid
                .chunks_exact(3)
                .map(|g| [g[0] as usize, g[1] as usize, g[2] as usize])
                .collect();
            let images = runner.encode_patches(pixels, &grids);
            if images.is_err() {
                runner.capture_hidden(false);
            }
            let images = images?;
            let enc = &images.encoded;
            let blocks = enc.blocks.iter().enumerate();
            let outputs = blocks
                .map(|(i, b)| (format!("vision.hidden_states.{i}"), b))
                .chain(std::iter::once(("vision.tokens".to_string(), &enc.tokens)))
                .chain(
                    enc.deepstack
                        .iter()
                        .enumerate()
                        .map(|(j, d)| (format!("vision.deepstack.{j}"), d)),
                );
            for (name, t) in outputs {
                if let Some((_, _, data)) = find(&name) {
                    let ours = t.to_vec().unwrap_or_default();
                    diffs.push(compare(&name, &ours, data, t.cols(), threshold));
                }
            }
            Some(images)
        }
        _ => None,
    };
    let out = match &images {
        Some(images) => runner.forward_with_images(tokens, images).map(|(o, _)| o),
        None => runner.forward(tokens),
    };
    runner.capture_hidden(false);
    let out = out?;
    for (i, ours) in out.hidden_states.iter().enumerate() {
        if let Some((_, shape, data)) = find(&format!("hidden_states.{i}")) {
            let name = if i == 0 {
                "embedding".to_string()
            } else {
                format!("layer {}", i - 1)
            };
            let width = shape.last().copied().unwrap_or(1);
            diffs.push(compare(&name, ours, data, width, threshold));
        }
    }
    if let Some((_, _, data)) = find("logits") {
        diffs.push(compare("logits", &out.logits, data, out.vocab, threshold));
    }
    if diffs.is_empty() {
        return Err(ForwardError::Unsupported {
            what: "a reference file without `hidden_states.{i}` or `logits` tensors".into(),
        });
    }
    Ok(Validation {
        tokens: out.tokens,
        diffs,
        threshold,
    })
}
