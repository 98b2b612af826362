//! Prompts with images (Qwen3-VL): the encoder's tokens ([`super::vision`]) replace the image
//! placeholders' rows after the embedding, each DeepStack feature is added to those rows after
//! the language layer of its index, and the text model's rotary positions are multi-axis
//! ([`crate::vision::mrope_positions`]): an image's tokens at `(t, row, column)`, text on the
//! diagonal, and every later token (the decode steps) shifted by the prompt's `rope_delta`.

use super::ops::{view, OpStats, RopeTables};
use super::vision::{encode_functional, VisionOutput, VisionWeights, WEIGHT_PREFIX};
use super::{ForwardError, Generation, Precision, Runner, StepOutput};
use crate::vision::processor::ProcessedImage;
use crate::vision::VisionConfig;
use crate::vision::{expand_image_tokens, mrope_positions};
use crate::weights::Checkpoint;
use dsl_core::bf16;
use dsl_core::Tensor;

/// A prompt's images through the encoder ([`Runner::encode_images`]).
pub struct PromptImages {
    /// Each image's patch grid `[t, h, w]`, in prompt order.
    pub grids: Vec<[usize; 3]>,
    /// The merged tokens and DeepStack features.
    pub encoded: VisionOutput,
    /// The encoder's launches and cycles.
    pub stats: OpStats,
}

/// The encoder's weights at the runner's precision: f32 (the reference path), or bf16 matrices
/// at native precision, as the released checkpoints store them.
pub(super) enum VisionBank {
    F32(VisionWeights<f32>),
    Bf16(VisionWeights<bf16>),
}

impl VisionBank {
    /// Reads the encoder under [`WEIGHT_PREFIX`] at `precision`.
    pub(super) fn load(
        ckpt: &Checkpoint,
        cfg: &VisionConfig,
        precision: Precision,
    ) -> Result<VisionBank, ForwardError> {
        Ok(match precision {
            Precision::F32 => VisionBank::F32(VisionWeights::load(ckpt, cfg, WEIGHT_PREFIX)?),
            Precision::Native => VisionBank::Bf16(VisionWeights::load(ckpt, cfg, WEIGHT_PREFIX)?),
        })
    }
}

/// What the next step places: the rows of its image tokens, the tokens and DeepStack features
/// that go there, and the multi-axis positions of all its tokens.
pub(super) struct StepImages {
    pub rows: Vec<i32>,
    pub tokens: Tensor<f32>,
    pub deepstack: Vec<Tensor<f32>>,
    pub positions: Vec<[usize; 3]>,
}

impl RopeTables {
    /// Multi-axis tables: frequency `i` of `inv_freq` turns with the axis `section` gives it
    /// ([`kernels::vision::rotary::mrope_freqs`]) at each token's `[t, h, w]` position.
    pub(super) fn multi_axis(
        positions: &[[usize; 3]],
        inv_freq: &[f64],
        section: [usize; 3],
        attention_factor: f64,
    ) -> Result<RopeTables, ForwardError> {
        let freqs = kernels::vision::rotary::mrope_freqs(inv_freq, section);
        let (mut c, mut s) = kernels::vision::rotary::axis_cos_sin(positions, &freqs);
        let af = attention_factor as f32;
        c.iter_mut().chain(s.iter_mut()).for_each(|v| *v *= af);
        RopeTables::from_cos_sin(positions.len(), inv_freq.len(), &c, &s, false)
    }
}

impl Runner {
    /// Runs the checkpoint's vision encoder (`model.visual.*`, at f32) on processed images
    /// ([`crate::vision::processor`]); its launches are booked with the runner's.
    pub fn encode_images(
        &mut self,
        images: &[ProcessedImage],
    ) -> Result<PromptImages, ForwardError> {
        let grids: Vec<[usize; 3]> = images.iter().map(|i| i.grid).collect();
        let pixels: Vec<f32> = images
            .iter()
            .flat_map(|i| i.pixels.iter().copied())
            .collect();
        self.encode_patches(&pixels, &grids)
    }

    /// [`Runner::encode_images`] on patch rows as the processor emits them (`pixels`, row-major
    /// `[Σ t·h·w, C·T·P·P]`) of images with patch grids `grids`.
    pub fn encode_patches(
        &mut self,
        pixels: &[f32],
        grids: &[[usize; 3]],
    ) -> Result<PromptImages, ForwardError> {
        let cfg = self.vision_config()?.clone();
        let weights = self
            .vision_weights
            .as_ref()
            .ok_or_else(|| ForwardError::Unsupported {
                what: format!(
                    "images: the checkpoint has no vision encoder weights ({}* tensors)",
                    WEIGHT_PREFIX
                ),
            })?;
        if grids.is_empty() {
            return Err(ForwardError::Workload {
                flag: "--image".into(),
                message: "no images to encode".into(),
            });
        }
        let rows: usize = grids.iter().map(|[t, h, w]| t * h * w).sum();
        if pixels.len() != rows * cfg.patch_values() {
            return Err(ForwardError::Workload {
                flag: "--image".into(),
                message: format!(
                    "{} pixel values for grids {grids:?}: want {rows} patch rows of {}",
                    pixels.len(),
                    cfg.patch_values()
                ),
            });
        }
        let pixels = view(
            Tensor::from_f32(&[rows, cfg.patch_values()], pixels),
            "image patch rows",
        )?;
        let (l, capture) = (&self.ops.launcher, self.capture);
        let (encoded, stats) = match weights {
            VisionBank::F32(w) => encode_functional(&cfg, w, &pixels, grids, l, capture)?,
            VisionBank::Bf16(w) => encode_functional(&cfg, w, &pixels, grids, l, capture)?,
        };
        self.ops.stats.add(&stats);
        Ok(PromptImages {
            grids: grids.to_vec(),
            encoded,
            stats,
        })
    }

    /// Runs a prompt holding images on sequence 0, which must be empty: one `image_token_id` per
    /// image where it goes (widened to the image's token count) or already the full count. Returns
    /// the logits and the prompt as run (placeholders widened). Later [`Runner::forward`] steps
    /// continue the prompt's multi-axis positions.
    pub fn forward_with_images(
        &mut self,
        tokens: &[i64],
        images: &PromptImages,
    ) -> Result<(StepOutput, Vec<i64>), ForwardError> {
        let cfg = self.vision_config()?;
        let (merge, image_token) = (cfg.spatial_merge_size, cfg.image_token_id);
        let section = self
            .cfg
            .rope
            .as_ref()
            .and_then(|r| r.mrope_section)
            .ok_or_else(|| ForwardError::Unsupported {
                what: "images in a model without multi-axis RoPE (rope `mrope_section`)".into(),
            })?;
        if section.iter().sum::<usize>() > self.inv_freq.len() {
            return Err(ForwardError::Unsupported {
                what: format!(
                    "mrope_section {section:?} names more than the {} rotary frequencies of a head",
                    self.inv_freq.len()
                ),
            });
        }
        if self.position() != 0 {
            return Err(ForwardError::Workload {
                flag: "--image".into(),
                message: format!(
                    "images go in the first chunk of a sequence (sequence 0 already holds {} \
                     tokens)",
                    self.position()
                ),
            });
        }
        let (ids, spans) =
            expand_image_tokens(tokens, image_token, &images.grids, merge).map_err(|message| {
                ForwardError::Workload {
                    flag: "--tokens".into(),
                    message,
                }
            })?;
        let rows: Vec<i32> = (0..ids.len())
            .filter(|&i| ids[i] == image_token as i64)
            .map(|i| i as i32)
            .collect();
        if rows.len() != images.encoded.tokens.rows() {
            return Err(ForwardError::Workload {
                flag: "--image".into(),
                message: format!(
                    "{} image token rows but the encoder gave {} tokens",
                    rows.len(),
                    images.encoded.tokens.rows()
                ),
            });
        }
        let (positions, delta) = mrope_positions(&spans, merge);
        self.step_images = Some(StepImages {
            rows,
            tokens: images.encoded.tokens.clone(),
            deepstack: images.encoded.deepstack.clone(),
            positions,
        });
        let out = self.forward(&ids);
        // A step that failed before placing them must not leave them for the next one.
        self.step_images = None;
        let out = out?;
        self.rope_deltas.insert(0, delta);
        Ok((out, ids))
    }

    /// Greedy generation after a prompt holding images ([`Runner::forward_with_images`]); the
    /// [`Generation`]'s prefill includes the encoder's cost (`images.stats`).
    pub fn generate_with_images(
        &mut self,
        prompt: &[i64],
        images: &PromptImages,
        n: usize,
    ) -> Result<(Generation, Vec<i64>), ForwardError> {
        let before = self.ops.stats.clone();
        let (out, ids) = self.forward_with_images(prompt, images)?;
        let mut prefill = self.ops.stats.since(&before);
        prefill.add(&images.stats);
        Ok((self.decode_greedy(out, prefill, n)?, ids))
    }

    fn vision_config(&self) -> Result<&crate::vision::VisionConfig, ForwardError> {
        self.cfg
            .vision
            .as_ref()
            .ok_or_else(|| ForwardError::Unsupported {
                what: format!(
                    "images: {} ({}) has no vision encoder (`vision_config`)",
                    self.cfg.source, self.cfg.model_type
                ),
            })
    }

    /// The rotary position of token `i` of sequence `seq`: its cache index shifted by the
    /// sequence's multi-axis offset (0 for text-only prompts).
    pub(super) fn rope_position(&self, seq: usize, i: usize) -> usize {
        let d = self.rope_deltas.get(&seq).copied().unwrap_or(0);
        (i as i64 + d).max(0) as usize
    }

    /// RoPE tables for `positions` at the model's frequencies (shape-only in cost-only runs).
    pub(super) fn rope_tables(
        &self,
        positions: &[usize],
        interleaved: bool,
    ) -> Result<RopeTables, ForwardError> {
        RopeTables::new(
            self.ops.mem,
            positions,
            &self.inv_freq,
            self.attention_factor,
            interleaved,
        )
    }
}
