//! # Vision encoders of multimodal models: configuration and image geometry
//!
//! A multimodal release (Qwen3-VL-MoE, transformers `qwen3_vl_moe`) puts a vision transformer in
//! front of its language model. This module reads the encoder's `vision_config` from the
//! checkpoint's `config.json` and sizes an image the way the checkpoint's processor does
//! (`Qwen2VLImageProcessorFast.smart_resize`): the patch grid decides how many vision tokens, and
//! so how much encoder work, an image costs. The encoder's forward pass is
//! [`crate::forward::vision`].
//!
//! Facts (transformers 4.57.1, `models/qwen3_vl/modeling_qwen3_vl.py` and
//! `models/qwen2_vl/image_processing_qwen2_vl_fast.py`; Qwen3-VL's `preprocessor_config.json`):
//! patches of `patch_size²` pixels over `temporal_patch_size` frames (a still image is repeated to
//! fill them), `spatial_merge_size²` neighbouring patches merged into one language token, sides
//! rounded to multiples of `patch_size · spatial_merge_size` with the total pixels kept within
//! `[min_pixels, max_pixels]` (65,536 and 16,777,216 for Qwen3-VL).

pub mod processor;

use crate::config::{parse_json, read_config_file, ModelError, Obj};
use serde_json::Map;
use std::fmt;
use std::path::Path;

/// The vision encoder of a Qwen3-VL-style model (`vision_config` of its `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    /// Transformer blocks.
    pub depth: usize,
    /// Width of the encoder's hidden states.
    pub hidden_size: usize,
    /// Width of each block's MLP.
    pub intermediate_size: usize,
    /// Attention heads (head dim = `hidden_size / num_heads`).
    pub num_heads: usize,
    /// Colour channels of the input.
    pub in_channels: usize,
    /// Side of a patch, in pixels.
    pub patch_size: usize,
    /// Frames per patch (a still image is repeated to fill them).
    pub temporal_patch_size: usize,
    /// Side of the block of patches the merger fuses into one language token.
    pub spatial_merge_size: usize,
    /// Width of the merged tokens: the language model's hidden size.
    pub out_hidden_size: usize,
    /// Learned position embeddings (a square grid of this many).
    pub num_position_embeddings: usize,
    /// Blocks whose outputs feed the DeepStack mergers (0-based; each merged output is added to
    /// the hidden states after language layer `i` for the `i`-th entry).
    pub deepstack_visual_indexes: Vec<usize>,
    /// The MLP's activation is the tanh GELU (`gelu_pytorch_tanh`) rather than the exact one.
    pub gelu_tanh: bool,
    /// Base of the 2D rotary frequencies (`rope_parameters.rope_theta`, 10000 when absent).
    pub rope_theta: f64,
    /// The prompt token each image token replaces (the top-level `image_token_id`; transformers'
    /// default 151655 when absent): a prompt holds one per encoder output row, or one per image
    /// that [`expand_image_tokens`] widens.
    pub image_token_id: usize,
}

impl VisionConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Values per patch row the patch embedding reads: channels × frames × pixels.
    pub fn patch_values(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Width of a merged token before the merger's projection (`merge² · hidden`).
    pub fn merged_width(&self) -> usize {
        self.hidden_size * self.spatial_merge_size * self.spatial_merge_size
    }

    /// Side of the learned position-embedding grid.
    pub fn pos_embed_side(&self) -> usize {
        (self.num_position_embeddings as f64).sqrt().round() as usize
    }

    /// Every tensor of the encoder, name (after `prefix`, `model.visual.` in Qwen3-VL
    /// checkpoints) and shape, as transformers names them: what weight verification expects.
    pub fn tensor_shapes(&self, prefix: &str) -> Vec<(String, Vec<usize>)> {
        let (h, i, m) = (
            self.hidden_size,
            self.intermediate_size,
            self.merged_width(),
        );
        let mut out = Vec::new();
        let mut linear = |name: String, o: usize, i: usize| {
            out.push((format!("{prefix}{name}.weight"), vec![o, i]));
            out.push((format!("{prefix}{name}.bias"), vec![o]));
        };
        let (c, t, p) = (self.in_channels, self.temporal_patch_size, self.patch_size);
        for b in 0..self.depth {
            linear(format!("blocks.{b}.attn.qkv"), 3 * h, h);
            linear(format!("blocks.{b}.attn.proj"), h, h);
            linear(format!("blocks.{b}.mlp.linear_fc1"), i, h);
            linear(format!("blocks.{b}.mlp.linear_fc2"), h, i);
        }
        let mergers = std::iter::once(("merger".to_string(), h)).chain(
            (0..self.deepstack_visual_indexes.len())
                .map(|j| (format!("deepstack_merger_list.{j}"), m)),
        );
        let mut norms = Vec::new();
        for (name, norm) in mergers {
            linear(format!("{name}.linear_fc1"), m, m);
            linear(format!("{name}.linear_fc2"), self.out_hidden_size, m);
            norms.push((format!("{name}.norm"), norm));
        }
        for b in 0..self.depth {
            norms.push((format!("blocks.{b}.norm1"), h));
            norms.push((format!("blocks.{b}.norm2"), h));
        }
        for (name, n) in norms {
            out.push((format!("{prefix}{name}.weight"), vec![n]));
            out.push((format!("{prefix}{name}.bias"), vec![n]));
        }
        out.push((
            format!("{prefix}patch_embed.proj.weight"),
            vec![h, c, t, p, p],
        ));
        out.push((format!("{prefix}patch_embed.proj.bias"), vec![h]));
        out.push((
            format!("{prefix}pos_embed.weight"),
            vec![self.num_position_embeddings, h],
        ));
        out
    }

    /// Encoder parameters: patch embedding, position table, blocks, the merger and the DeepStack
    /// mergers.
    pub fn params(&self) -> u64 {
        let (h, i, m) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.merged_width() as u64,
        );
        let linear = |i: u64, o: u64| i * o + o;
        let block = 2 * 2 * h + linear(h, 3 * h) + linear(h, h) + linear(h, i) + linear(i, h);
        let merger = |norm: u64| 2 * norm + linear(m, m) + linear(m, self.out_hidden_size as u64);
        linear(self.patch_values() as u64, h)
            + self.num_position_embeddings as u64 * h
            + self.depth as u64 * block
            + merger(h)
            + self.deepstack_visual_indexes.len() as u64 * merger(m)
    }
}

/// An image the processor cannot take, or a configuration without a vision encoder.
#[derive(Debug, Clone, PartialEq)]
pub enum VisionError {
    /// The configuration (file) has no usable `vision_config`.
    Config(ModelError),
    /// An image size outside what the processor accepts: what, and the limit.
    Image {
        /// The image (a file name or `--image-size`).
        what: String,
        /// Why, with the limit.
        message: String,
    },
}

impl fmt::Display for VisionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VisionError::Config(e) => write!(f, "{e}"),
            VisionError::Image { what, message } => write!(f, "{what}: {message}"),
        }
    }
}

impl std::error::Error for VisionError {}

impl From<ModelError> for VisionError {
    fn from(e: ModelError) -> VisionError {
        VisionError::Config(e)
    }
}

/// Reads the `vision_config` of a multimodal `config.json` (a file, or a directory holding one).
pub fn load_vision_config(path: &Path) -> Result<VisionConfig, VisionError> {
    let (text, name) = read_config_file(path)?;
    parse_vision_config(&text, &name)
}

/// Parses the `vision_config` object of a configuration's text; `file` names it in errors.
pub fn parse_vision_config(text: &str, file: &str) -> Result<VisionConfig, VisionError> {
    let value = parse_json(text, file)?;
    let empty = Map::new();
    let root = Obj::root(file, "qwen3_vl_moe", value.as_object().unwrap_or(&empty));
    let v = root
        .opt_obj("vision_config")?
        .ok_or_else(|| ModelError::MissingField {
            file: file.to_string(),
            field: "vision_config".into(),
            needed_by: "a vision encoder (a multimodal model's config.json holds one)".into(),
        })?;
    Ok(vision_from_obj(&root, &v)?)
}

/// transformers' `Qwen3VLMoeConfig.image_token_id` when a config leaves it out.
const DEFAULT_IMAGE_TOKEN_ID: usize = 151655;

/// The vision encoder from a `vision_config` object `v` of the configuration `root` being read
/// (also what the `qwen3_vl_moe` parser keeps in [`crate::config::ModelConfig::vision`]).
pub(crate) fn vision_from_obj(root: &Obj, v: &Obj) -> Result<VisionConfig, ModelError> {
    let hidden_size = v.req_dim("hidden_size")?;
    let num_heads = v.req_dim("num_heads")?;
    if hidden_size % num_heads != 0 || (hidden_size / num_heads) % 2 != 0 {
        return Err(v.invalid(
            "num_heads",
            "must divide hidden_size into heads of an even width (2D rotary pairs)",
        ));
    }
    let act = v.opt_str("hidden_act")?.unwrap_or("gelu_pytorch_tanh");
    let gelu_tanh = match act {
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => true,
        "gelu" => false,
        _ => {
            return Err(v.invalid(
                "hidden_act",
                "day0's vision MLP runs gelu or gelu_pytorch_tanh",
            ))
        }
    };
    let cfg = VisionConfig {
        depth: v.req_dim("depth")?,
        hidden_size,
        intermediate_size: v.req_dim("intermediate_size")?,
        num_heads,
        in_channels: v.opt_usize("in_channels")?.unwrap_or(3),
        patch_size: v.req_dim("patch_size")?,
        temporal_patch_size: v.opt_usize("temporal_patch_size")?.unwrap_or(2).max(1),
        spatial_merge_size: v.opt_usize("spatial_merge_size")?.unwrap_or(2).max(1),
        out_hidden_size: v.req_dim("out_hidden_size")?,
        num_position_embeddings: v.req_dim("num_position_embeddings")?,
        deepstack_visual_indexes: v
            .opt_usize_list("deepstack_visual_indexes")?
            .unwrap_or_default(),
        gelu_tanh,
        image_token_id: root
            .opt_usize("image_token_id")?
            .unwrap_or(DEFAULT_IMAGE_TOKEN_ID),
        rope_theta: match v.opt_obj("rope_parameters")? {
            Some(r) => r.opt_f64("rope_theta")?.unwrap_or(10000.0),
            None => 10000.0,
        },
    };
    let side = cfg.pos_embed_side();
    if side * side != cfg.num_position_embeddings {
        return Err(v.invalid(
            "num_position_embeddings",
            "must be a square (a grid of learned positions)",
        ));
    }
    if let Some(bad) = cfg
        .deepstack_visual_indexes
        .iter()
        .find(|i| **i >= cfg.depth)
    {
        return Err(v.invalid(
            "deepstack_visual_indexes",
            format!(
                "names block {bad}, but the encoder has {} blocks",
                cfg.depth
            ),
        ));
    }
    Ok(cfg)
}

/// The processor's pixel budget (Qwen3-VL's `preprocessor_config.json` `size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PixelLimits {
    /// Fewest pixels after resizing (`size.shortest_edge`).
    pub min_pixels: u64,
    /// Most pixels after resizing (`size.longest_edge`).
    pub max_pixels: u64,
}

impl PixelLimits {
    /// Qwen3-VL's: 65,536 to 16,777,216 pixels.
    pub const QWEN3_VL: PixelLimits = PixelLimits {
        min_pixels: 65_536,
        max_pixels: 16_777_216,
    };
}

/// Python's `round` (halves to even), which `smart_resize` uses.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

/// The size an image of `height × width` pixels is resized to (transformers' `smart_resize`):
/// each side a multiple of `factor`, the aspect ratio kept as closely as that allows, the pixel
/// count within `limits`. An empty image or an aspect ratio above 200 is an error naming `what`
/// and the limit.
pub fn smart_resize(
    what: &str,
    height: usize,
    width: usize,
    factor: usize,
    limits: PixelLimits,
) -> Result<(usize, usize), VisionError> {
    let bad = |message: String| VisionError::Image {
        what: what.to_string(),
        message,
    };
    if height == 0 || width == 0 {
        return Err(bad(format!(
            "a {height}×{width} image has no pixels (each side must be at least 1)"
        )));
    }
    let (h, w, f) = (height as f64, width as f64, factor.max(1) as f64);
    let ratio = h.max(w) / h.min(w);
    if ratio > 200.0 {
        return Err(bad(format!(
            "aspect ratio {ratio:.1} is above the processor's limit of 200"
        )));
    }
    let (mut hb, mut wb) = (round_half_even(h / f) * f, round_half_even(w / f) * f);
    if hb * wb > limits.max_pixels as f64 {
        let beta = (h * w / limits.max_pixels as f64).sqrt();
        hb = f.max((h / beta / f).floor() * f);
        wb = f.max((w / beta / f).floor() * f);
    } else if hb * wb < limits.min_pixels as f64 {
        let beta = (limits.min_pixels as f64 / (h * w)).sqrt();
        hb = (h * beta / f).ceil() * f;
        wb = (w * beta / f).ceil() * f;
    }
    // transformers returns the 0 and fails later; with a min_pixels of 0 a side under half a
    // patch block rounds away.
    if hb == 0.0 || wb == 0.0 {
        return Err(bad(format!(
            "a {height}×{width} image resizes to {hb}×{wb}: a side rounds to less than one \
             {factor}-pixel block (min_pixels {} does not lift it; raise it or use a larger image)",
            limits.min_pixels
        )));
    }
    Ok((hb as usize, wb as usize))
}

impl VisionConfig {
    /// The patch grid `[t, h, w]` of a still image of `height × width` pixels after the
    /// processor's resize (`what` names it in errors).
    pub fn image_grid(
        &self,
        what: &str,
        height: usize,
        width: usize,
        limits: PixelLimits,
    ) -> Result<[usize; 3], VisionError> {
        let factor = self.patch_size * self.spatial_merge_size;
        let (h, w) = smart_resize(what, height, width, factor, limits)?;
        Ok([1, h / self.patch_size, w / self.patch_size])
    }
}

/// A run of a multimodal prompt: text tokens, or one image's tokens (its patch grid `[t, h, w]`,
/// `t·h·w / merge²` tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptSpan {
    /// This many text tokens.
    Text(usize),
    /// An image with this patch grid.
    Image([usize; 3]),
}

/// The multi-axis RoPE positions `[t, h, w]` of every token of a prompt, as transformers'
/// Qwen3-VL `get_rope_index` computes them, and the offset later tokens continue from
/// (`rope_deltas`: the largest position + 1 − the prompt's length; a decode token at index `i`
/// sits at `i + delta` on all three axes). Text tokens count up on all three axes; an image's
/// tokens (merged blocks, row-major) sit at `t = start`, `h = start + row`, `w = start + column`,
/// and the text after it resumes at `start + max(rows, columns)`.
pub fn mrope_positions(spans: &[PromptSpan], merge: usize) -> (Vec<[usize; 3]>, i64) {
    let m = merge.max(1);
    let mut out = Vec::new();
    let mut pos = 0usize;
    for span in spans {
        match *span {
            PromptSpan::Text(n) => {
                out.extend((pos..pos + n).map(|p| [p, p, p]));
                pos += n;
            }
            PromptSpan::Image([t, h, w]) => {
                let (rows, cols) = (h / m, w / m);
                for ft in 0..t {
                    for r in 0..rows {
                        for c in 0..cols {
                            out.push([pos + ft, pos + r, pos + c]);
                        }
                    }
                }
                pos += rows.max(cols);
            }
        }
    }
    let max = out
        .iter()
        .flat_map(|p| p.iter())
        .copied()
        .max()
        .map_or(-1, |v| v as i64);
    let delta = max + 1 - out.len() as i64;
    (out, delta)
}

/// A prompt's images placed: the token ids with each image's placeholder run widened to the
/// image's token count, and the prompt's [`PromptSpan`]s. Each maximal run of `image_token_id`
/// is one image, in order: one placeholder (as a chat template writes `<|image_pad|>` before the
/// processor widens it) or already exactly `t·h·w / merge²` of them. The message of an error says
/// what does not match and how to fix it.
pub fn expand_image_tokens(
    tokens: &[i64],
    image_token_id: usize,
    grids: &[[usize; 3]],
    merge: usize,
) -> Result<(Vec<i64>, Vec<PromptSpan>), String> {
    let m = merge.max(1);
    let image = image_token_id as i64;
    let (mut out, mut spans) = (Vec::with_capacity(tokens.len()), Vec::new());
    let mut images = grids.iter();
    let mut i = 0;
    while i < tokens.len() {
        let run = tokens[i..]
            .iter()
            .take_while(|&&t| (t == image) == (tokens[i] == image))
            .count();
        if tokens[i] != image {
            out.extend_from_slice(&tokens[i..i + run]);
            spans.push(PromptSpan::Text(run));
        } else {
            let k = spans
                .iter()
                .filter(|s| matches!(s, PromptSpan::Image(_)))
                .count();
            let &[t, h, w] = images.next().ok_or_else(|| {
                format!(
                    "the prompt has more runs of the image token {image_token_id} than the {} \
                     image(s) given: put one image token where each image goes",
                    grids.len()
                )
            })?;
            let n = t * (h / m) * (w / m);
            if run != 1 && run != n {
                return Err(format!(
                    "image {k} (grid {t}×{h}×{w}) becomes {n} tokens, but its run of the image \
                     token {image_token_id} holds {run}: give one placeholder (day0 widens it) \
                     or exactly {n}"
                ));
            }
            out.extend(std::iter::repeat_n(image, n));
            spans.push(PromptSpan::Image([t, h, w]));
        }
        i += run;
    }
    let left = images.count();
    if left > 0 {
        return Err(format!(
            "{} image(s) given but only {} image token run(s) in the prompt: put one image \
             token {image_token_id} where each image goes",
            grids.len(),
            grids.len() - left
        ));
    }
    Ok((out, spans))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mrope_positions_match_transformers() {
        // transformers 5.25 `Qwen3VLMoeModel.get_rope_index` on text 3, an image of 4×6 patches,
        // text 2, an image of 6×2 patches, text 1 (merge 2).
        let spans = [
            PromptSpan::Text(3),
            PromptSpan::Image([1, 4, 6]),
            PromptSpan::Text(2),
            PromptSpan::Image([1, 6, 2]),
            PromptSpan::Text(1),
        ];
        let (pos, delta) = mrope_positions(&spans, 2);
        let want = [
            [0, 0, 0],
            [1, 1, 1],
            [2, 2, 2],
            [3, 3, 3],
            [3, 3, 4],
            [3, 3, 5],
            [3, 4, 3],
            [3, 4, 4],
            [3, 4, 5],
            [6, 6, 6],
            [7, 7, 7],
            [8, 8, 8],
            [8, 9, 8],
            [8, 10, 8],
            [11, 11, 11],
        ];
        assert_eq!(pos, want);
        assert_eq!(delta, -3);
        // Text alone: plain positions, no offset.
        assert_eq!(
            mrope_positions(&[PromptSpan::Text(4)], 2),
            (vec![[0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3]], 0)
        );
    }

    #[test]
    fn image_placeholders_widen_to_each_image() {
        let grids = [[1, 4, 6], [1, 2, 2]];
        // One placeholder each, or already the full count; text around them kept.
        let (ids, spans) = expand_image_tokens(&[5, 9, 7, 9], 9, &grids, 2).unwrap();
        assert_eq!(ids, [5, 9, 9, 9, 9, 9, 9, 7, 9]);
        assert_eq!(
            spans,
            [
                PromptSpan::Text(1),
                PromptSpan::Image([1, 4, 6]),
                PromptSpan::Text(1),
                PromptSpan::Image([1, 2, 2]),
            ]
        );
        let full = [9, 9, 9, 9, 9, 9, 3, 9];
        assert_eq!(expand_image_tokens(&full, 9, &grids, 2).unwrap().0, full);
        // Wrong counts name the fix.
        let e = expand_image_tokens(&[9, 9, 3, 9], 9, &grids, 2).unwrap_err();
        assert!(e.contains("image 0") && e.contains("exactly 6"), "{e}");
        let e = expand_image_tokens(&[9, 3], 9, &grids, 2).unwrap_err();
        assert!(e.contains("2 image(s) given but only 1"), "{e}");
        let e = expand_image_tokens(&[9, 3, 9, 3, 9], 9, &grids, 2).unwrap_err();
        assert!(e.contains("more runs"), "{e}");
    }

    #[test]
    fn an_image_that_rounds_to_nothing_is_an_error() {
        let limits = PixelLimits {
            min_pixels: 0,
            max_pixels: 1 << 20,
        };
        let e = smart_resize("tiny.png", 10, 100, 32, limits)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tiny.png") && e.contains("min_pixels 0"), "{e}");
        // The same image with Qwen3-VL's floor is lifted to whole blocks.
        let limits = PixelLimits {
            min_pixels: 64 * 64,
            ..limits
        };
        assert_eq!(
            smart_resize("tiny.png", 10, 100, 32, limits).unwrap(),
            (32, 224)
        );
    }

    #[test]
    fn smart_resize_matches_transformers() {
        // Worked examples computed with transformers 4.57.1's smart_resize (factor 32, Qwen3-VL's
        // pixel limits).
        let l = PixelLimits::QWEN3_VL;
        for ((h, w), want) in [
            ((480, 640), (480, 640)),
            ((1080, 1920), (1088, 1920)),
            ((100, 300), (160, 448)),
            ((4000, 6000), (3328, 4992)),
            ((16, 16), (256, 256)),
            ((1024, 1024), (1024, 1024)),
        ] {
            assert_eq!(smart_resize("t", h, w, 32, l).unwrap(), want, "{h}x{w}");
        }
        // Python rounds 2.5 to 2 and 3.5 to 4.
        assert_eq!(round_half_even(2.5), 2.0);
        assert_eq!(round_half_even(3.5), 4.0);
        assert!(matches!(
            smart_resize("a.png", 0, 10, 32, l),
            Err(VisionError::Image { .. })
        ));
        let e = smart_resize("long.png", 10, 2500, 32, l)
            .unwrap_err()
            .to_string();
        assert!(e.contains("long.png") && e.contains("200"), "{e}");
    }
}
