//! The vision encoder's forward pass (Qwen3-VL's `Qwen3VLMoeVisionModel.forward`), on the same
//! [`Ops`] as the language model: functional on data, cost-only on shapes.
//!
//! Per image (patch grid `[t, h, w]`, patches in `merge × merge` blocks as the processor emits
//! them):
//! 1. patch embedding: the Conv3d whose kernel equals its stride is a linear layer with bias over
//!    each patch's `C·T·P·P` values; plus the learned position embeddings interpolated to the
//!    grid ([`kernels::vision::pos_embed`]);
//! 2. `depth` pre-norm blocks: LayerNorm, fused qkv with bias, 2D rotary on q and k
//!    ([`kernels::vision::rotary`]), bidirectional attention within each image
//!    ([`kernels::attention::varlen`]), output projection, residual; LayerNorm, MLP
//!    (fc1, GELU, fc2, all with bias), residual;
//! 3. after the blocks named in `deepstack_visual_indexes`, a DeepStack merger (concatenate each
//!    `merge × merge` block, LayerNorm over the concatenation, fc1, exact GELU, fc2);
//! 4. the final merger (LayerNorm per patch, then concatenate, fc1, exact GELU, fc2): one language
//!    token per block, `out_hidden_size` wide.

use super::ops::{view, Mem, OpStats, Ops, RopeTables};
use super::ForwardError;
use crate::vision::VisionConfig;
use crate::weights::Checkpoint;
use dsl_core::prelude::*;
use kernels::vision::{pos_embed, rotary};

/// Where the released Qwen3-VL checkpoints keep the encoder's tensors.
pub const WEIGHT_PREFIX: &str = "model.visual.";

/// LayerNorm eps of every norm in the encoder.
const NORM_EPS: f64 = 1e-6;

/// A linear layer with a bias: weight `[out, in]`, bias `[1, out]`.
pub struct Linear<T: Float> {
    /// `[out, in]`.
    pub w: Tensor<T>,
    /// `[1, out]`, f32.
    pub b: Tensor<f32>,
}

/// A LayerNorm's weight and bias, `[width]` each.
pub struct Norm {
    /// Scale.
    pub w: Tensor<f32>,
    /// Shift.
    pub b: Tensor<f32>,
}

/// One encoder block's weights.
pub struct BlockWeights<T: Float> {
    /// Before attention.
    pub norm1: Norm,
    /// Fused q, k, v projection (`[3·hidden, hidden]`: all q heads, then k, then v).
    pub qkv: Linear<T>,
    /// Attention output projection.
    pub proj: Linear<T>,
    /// Before the MLP.
    pub norm2: Norm,
    /// MLP up projection.
    pub fc1: Linear<T>,
    /// MLP down projection.
    pub fc2: Linear<T>,
}

/// A patch merger's weights: the final merger normalises each patch before concatenating a block
/// (`postshuffle` false), a DeepStack merger normalises the concatenation (`postshuffle` true).
pub struct MergerWeights<T: Float> {
    /// LayerNorm over `hidden` or over `merge²·hidden` (`postshuffle`).
    pub norm: Norm,
    /// Normalise after concatenating the block.
    pub postshuffle: bool,
    /// `merge²·hidden → merge²·hidden`.
    pub fc1: Linear<T>,
    /// `merge²·hidden → out_hidden_size`.
    pub fc2: Linear<T>,
}

/// Every weight of the encoder.
pub struct VisionWeights<T: Float> {
    /// The patch embedding as a linear layer (`[hidden, C·T·P·P]`).
    pub patch: Linear<T>,
    /// Learned position embeddings `[side², hidden]`.
    pub pos_embed: Tensor<f32>,
    /// The blocks.
    pub blocks: Vec<BlockWeights<T>>,
    /// The final merger.
    pub merger: MergerWeights<T>,
    /// One DeepStack merger per `deepstack_visual_indexes` entry.
    pub deepstack: Vec<MergerWeights<T>>,
}

impl<T: Float> VisionWeights<T> {
    /// Shape-only weights of `cfg` (cost-only runs at the released sizes).
    pub fn shape_only(cfg: &VisionConfig) -> VisionWeights<T> {
        let (h, i, m) = (cfg.hidden_size, cfg.intermediate_size, cfg.merged_width());
        let linear = |o: usize, i: usize| Linear {
            w: Tensor::shape_only(&[o, i]),
            b: Tensor::shape_only(&[1, o]),
        };
        let norm = |n: usize| Norm {
            w: Tensor::shape_only(&[n]),
            b: Tensor::shape_only(&[n]),
        };
        let merger = |postshuffle: bool| MergerWeights {
            norm: norm(if postshuffle { m } else { h }),
            postshuffle,
            fc1: linear(m, m),
            fc2: linear(cfg.out_hidden_size, m),
        };
        VisionWeights {
            patch: linear(h, cfg.patch_values()),
            pos_embed: Tensor::shape_only(&[cfg.num_position_embeddings, h]),
            blocks: (0..cfg.depth)
                .map(|_| BlockWeights {
                    norm1: norm(h),
                    qkv: linear(3 * h, h),
                    proj: linear(h, h),
                    norm2: norm(h),
                    fc1: linear(i, h),
                    fc2: linear(h, i),
                })
                .collect(),
            merger: merger(false),
            deepstack: cfg
                .deepstack_visual_indexes
                .iter()
                .map(|_| merger(true))
                .collect(),
        }
    }
}

impl<T: Float> VisionWeights<T> {
    /// The encoder's weights from a checkpoint under `prefix` (`model.visual.` in the released
    /// Qwen3-VL checkpoints), the matrices held as `T` (f32 for the reference path, bf16 at native
    /// precision), biases, norms and position embeddings in f32: transformers' names, the Conv3d
    /// patch embedding `[hidden, C, T, P, P]` read as the linear layer `[hidden, C·T·P·P]` it is.
    pub fn load(
        ckpt: &Checkpoint,
        cfg: &VisionConfig,
        prefix: &str,
    ) -> Result<VisionWeights<T>, ForwardError> {
        let (h, i, m) = (cfg.hidden_size, cfg.intermediate_size, cfg.merged_width());
        let values = |name: &str, shape: &[usize]| ckpt.f32(&format!("{prefix}{name}"), shape);
        let read = |name: &str, shape: &[usize], as_shape: &[usize]| {
            view(
                Tensor::<f32>::from_f32(as_shape, &values(name, shape)?),
                name,
            )
        };
        let matrix = |name: &str, shape: &[usize], as_shape: &[usize]| {
            view(Tensor::<T>::from_f32(as_shape, &values(name, shape)?), name)
        };
        let linear = |name: &str, o: usize, i: usize| -> Result<Linear<T>, ForwardError> {
            Ok(Linear {
                w: matrix(&format!("{name}.weight"), &[o, i], &[o, i])?,
                b: read(&format!("{name}.bias"), &[o], &[1, o])?,
            })
        };
        let norm = |name: &str, n: usize| -> Result<Norm, ForwardError> {
            Ok(Norm {
                w: read(&format!("{name}.weight"), &[n], &[n])?,
                b: read(&format!("{name}.bias"), &[n], &[n])?,
            })
        };
        let merger = |name: &str, postshuffle: bool| -> Result<MergerWeights<T>, ForwardError> {
            Ok(MergerWeights {
                norm: norm(&format!("{name}.norm"), if postshuffle { m } else { h })?,
                postshuffle,
                fc1: linear(&format!("{name}.linear_fc1"), m, m)?,
                fc2: linear(&format!("{name}.linear_fc2"), cfg.out_hidden_size, m)?,
            })
        };
        let (c, t, p) = (cfg.in_channels, cfg.temporal_patch_size, cfg.patch_size);
        Ok(VisionWeights {
            patch: Linear {
                w: matrix(
                    "patch_embed.proj.weight",
                    &[h, c, t, p, p],
                    &[h, cfg.patch_values()],
                )?,
                b: read("patch_embed.proj.bias", &[h], &[1, h])?,
            },
            pos_embed: read(
                "pos_embed.weight",
                &[cfg.num_position_embeddings, h],
                &[cfg.num_position_embeddings, h],
            )?,
            blocks: (0..cfg.depth)
                .map(|b| {
                    let n = |s: &str| format!("blocks.{b}.{s}");
                    Ok(BlockWeights {
                        norm1: norm(&n("norm1"), h)?,
                        qkv: linear(&n("attn.qkv"), 3 * h, h)?,
                        proj: linear(&n("attn.proj"), h, h)?,
                        norm2: norm(&n("norm2"), h)?,
                        fc1: linear(&n("mlp.linear_fc1"), i, h)?,
                        fc2: linear(&n("mlp.linear_fc2"), h, i)?,
                    })
                })
                .collect::<Result<_, ForwardError>>()?,
            merger: merger("merger", false)?,
            deepstack: (0..cfg.deepstack_visual_indexes.len())
                .map(|j| merger(&format!("deepstack_merger_list.{j}"), true))
                .collect::<Result<_, _>>()?,
        })
    }
}

/// Encodes `pixels` (patch rows of images with patch grids `grids`) functionally on `launcher`
/// with `weights`: the tokens and DeepStack features (and each block's output with
/// `capture_blocks`), and the launches' costs.
pub fn encode_functional<T: Float>(
    cfg: &VisionConfig,
    weights: &VisionWeights<T>,
    pixels: &Tensor<f32>,
    grids: &[[usize; 3]],
    launcher: &Launcher,
    capture_blocks: bool,
) -> Result<(VisionOutput, OpStats), ForwardError> {
    let launcher = launcher.clone().with_backend(dsl_core::Backend::Functional);
    encode_on(launcher, cfg, weights, pixels, grids, capture_blocks)
}

/// [`encode`] on its own bookkeeping for `launcher` (whose backend decides functional or
/// cost-only): the output and the launches' costs.
fn encode_on<T: Float>(
    launcher: Launcher,
    cfg: &VisionConfig,
    weights: &VisionWeights<T>,
    pixels: &Tensor<f32>,
    grids: &[[usize; 3]],
    capture_blocks: bool,
) -> Result<(VisionOutput, OpStats), ForwardError> {
    // The encoder keeps no cache; the format only sizes pools it never allocates.
    let mem = Mem::new(
        &launcher,
        super::cache_format::CacheFormat::F32,
        dsl_core::accel_sim::DType::F32,
    );
    let mut ops = Ops::new(launcher, mem);
    let out = encode(&mut ops, cfg, weights, pixels, grids, capture_blocks)?;
    Ok((out, ops.stats))
}

/// What the encoder hands the language model.
pub struct VisionOutput {
    /// One row per merged token (`[Σ t·h·w / merge², out_hidden_size]`), images in order.
    pub tokens: Tensor<f32>,
    /// The DeepStack features, one tensor like `tokens` per `deepstack_visual_indexes` entry.
    pub deepstack: Vec<Tensor<f32>>,
    /// Each block's output `[Σ t·h·w, hidden]` (the hidden states transformers records per
    /// vision block), when captured; empty otherwise.
    pub blocks: Vec<Tensor<f32>>,
}

/// Segment bounds of the packed patches: one segment per frame of each image.
pub fn cu_seqlens(grids: &[[usize; 3]]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for &[t, h, w] in grids {
        for _ in 0..t {
            cu.push(cu[cu.len() - 1] + (h * w) as i32);
        }
    }
    cu
}

/// Runs the encoder on `pixels [Σ t·h·w, C·T·P·P]` (patch rows in the processor's order) of
/// images with patch grids `grids`, booking every launch in `ops` under `vision.*` names;
/// `capture` keeps each block's output.
pub(crate) fn encode<T: Float>(
    ops: &mut Ops,
    cfg: &VisionConfig,
    w: &VisionWeights<T>,
    pixels: &Tensor<f32>,
    grids: &[[usize; 3]],
    capture: bool,
) -> Result<VisionOutput, ForwardError> {
    let merge = cfg.spatial_merge_size;
    let n: usize = grids.iter().map(|[t, h, w]| t * h * w).sum();
    if let Some(g) = grids
        .iter()
        .find(|[t, h, w]| *t == 0 || h % merge != 0 || w % merge != 0)
    {
        return Err(ForwardError::Workload {
            flag: "--image".into(),
            message: format!(
                "patch grid {g:?} must have whole {merge}×{merge} blocks of patches (the \
                 processor's resize makes each side a multiple of patch_size · merge)"
            ),
        });
    }
    if pixels.rows() != n || pixels.cols() != cfg.patch_values() {
        return Err(ForwardError::Workload {
            flag: "--image".into(),
            message: format!(
                "pixel rows {pixels:?} must be [{n}, {}] for grids {grids:?}",
                cfg.patch_values()
            ),
        });
    }
    let (hid, hd) = (cfg.hidden_size, cfg.head_dim());
    let patches = ops.linear_bias("vision.patch_embed", pixels, &w.patch.w, &w.patch.b)?;
    let (idx, wts) = pos_embed::bilinear_taps(grids, cfg.pos_embed_side(), merge);
    let pos = ops.pos_embed_bilinear("vision.pos_embed", &w.pos_embed, &idx, &wts)?;
    let mut x = ops.add("vision.add", &patches, &pos)?;
    let positions = rotary::vision_positions(grids, merge);
    let (cos, sin) = rotary::axis_cos_sin(&positions, &rotary::vision_freqs(hd, cfg.rope_theta));
    let tables = RopeTables::from_cos_sin(n, hd / 2, &cos, &sin, false)?;
    let cu = cu_seqlens(grids);
    let (mut deepstack, mut blocks) = (Vec::new(), Vec::new());
    for (i, b) in w.blocks.iter().enumerate() {
        let y = ops.layernorm("vision.norm", &x, &b.norm1.w, &b.norm1.b, NORM_EPS)?;
        let qkv = ops.linear_bias("vision.qkv", &y, &b.qkv.w, &b.qkv.b)?;
        let part = |j: usize| view(qkv.col_range(j * hid, hid), "vision qkv");
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let (qr, kr) = (ops.mem.act(n, hid), ops.mem.act(n, hid));
        ops.rope_into("vision.rope", &q, &tables, hd, 0, &qr)?;
        ops.rope_into("vision.rope", &k, &tables, hd, 0, &kr)?;
        let a = ops.varlen_attention("vision.attention", &qr, &kr, &v, &cu, hd)?;
        let o = ops.linear_bias("vision.proj", &a, &b.proj.w, &b.proj.b)?;
        x = ops.add("vision.add", &x, &o)?;
        let y = ops.layernorm("vision.norm", &x, &b.norm2.w, &b.norm2.b, NORM_EPS)?;
        let f = ops.linear_bias("vision.fc1", &y, &b.fc1.w, &b.fc1.b)?;
        let g = ops.gelu("vision.gelu", &f, cfg.gelu_tanh)?;
        let f = ops.linear_bias("vision.fc2", &g, &b.fc2.w, &b.fc2.b)?;
        x = ops.add("vision.add", &x, &f)?;
        if capture {
            blocks.push(x.clone());
        }
        if let Some(j) = cfg.deepstack_visual_indexes.iter().position(|d| *d == i) {
            deepstack.push(merge_blocks(
                ops,
                cfg,
                &w.deepstack[j],
                &x,
                "vision.deepstack_merger",
            )?);
        }
    }
    let tokens = merge_blocks(ops, cfg, &w.merger, &x, "vision.merger")?;
    Ok(VisionOutput {
        tokens,
        deepstack,
        blocks,
    })
}

/// A patch merger: each `merge × merge` block of patches (consecutive rows) becomes one token.
fn merge_blocks<T: Float>(
    ops: &mut Ops,
    cfg: &VisionConfig,
    m: &MergerWeights<T>,
    x: &Tensor<f32>,
    op: &str,
) -> Result<Tensor<f32>, ForwardError> {
    let width = cfg.merged_width();
    let tokens = x.rows() * x.cols() / width;
    let norm = format!("{op}.norm");
    let y = if m.postshuffle {
        let blocks = view(x.reshaped(&[tokens, width]), "merger blocks")?;
        ops.layernorm(&norm, &blocks, &m.norm.w, &m.norm.b, NORM_EPS)?
    } else {
        let y = ops.layernorm(&norm, x, &m.norm.w, &m.norm.b, NORM_EPS)?;
        view(y.reshaped(&[tokens, width]), "merger blocks")?
    };
    let f = ops.linear_bias(&format!("{op}.fc1"), &y, &m.fc1.w, &m.fc1.b)?;
    let g = ops.gelu(&format!("{op}.gelu"), &f, false)?;
    ops.linear_bias(&format!("{op}.fc2"), &g, &m.fc2.w, &m.fc2.b)
}

/// The cost of encoding images at a configuration's sizes, cost-only.
pub struct VisionCost {
    /// Patch grids of the images, after the processor's resize.
    pub grids: Vec<[usize; 3]>,
    /// Patches through the encoder.
    pub patches: usize,
    /// Language tokens the images become.
    pub tokens: usize,
    /// Launches and cycles per operator.
    pub stats: OpStats,
}

/// Encodes images with patch grids `grids` cost-only on `launcher`'s device (bf16 weights, as
/// released checkpoints hold them), every launch memoised across blocks.
pub fn encode_cost(
    cfg: &VisionConfig,
    grids: &[[usize; 3]],
    launcher: &Launcher,
) -> Result<VisionCost, ForwardError> {
    let launcher = launcher
        .clone()
        .with_backend(dsl_core::Backend::CostOnly)
        .with_memo(true);
    let weights = VisionWeights::<bf16>::shape_only(cfg);
    let patches: usize = grids.iter().map(|[t, h, w]| t * h * w).sum();
    let pixels = Tensor::shape_only(&[patches, cfg.patch_values()]);
    let (out, stats) = encode_on(launcher, cfg, &weights, &pixels, grids, false)?;
    Ok(VisionCost {
        grids: grids.to_vec(),
        patches,
        tokens: out.tokens.rows(),
        stats,
    })
}
