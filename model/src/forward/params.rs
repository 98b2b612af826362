//! The checkpoint's tensors bound to the layers that use them, as device tensors: norms, conv taps
//! and gate parameters in f32, projections as [`Weight`]s in the format the
//! [`Precision`] asks for ([`Loader::linear`]).
//!
//! Names are Hugging Face's (what `save_pretrained` writes). Routed experts are read in whatever
//! layout the checkpoint stores them ([`crate::weights::ExpertBank`]) and stacked once into
//! `[E, 2I, H]` (gate rows then up rows per expert) and `[E, H, I]`.

use super::ForwardError;
use super::Precision;
use crate::config::{AttentionKind, FfnKind, ModelConfig, WeightFormat};
use crate::weights::Checkpoint;
use dsl_core::{bf16, Tensor};
use kernels::weight::{Format, Weight};

/// Loads tensors by name with the expected shape (f32 tensors, or projections as [`Weight`]s);
/// without a checkpoint (a cost-only run from config.json alone) every tensor is shape-only, of
/// the shape the config implies.
pub(crate) struct Loader<'a> {
    pub ckpt: Option<&'a Checkpoint>,
    /// The precision projections are held in.
    pub precision: Precision,
    /// Attention, dense-MLP and shared-expert projections' stored format (the config's
    /// `quantization_config`).
    pub dense: Format,
    /// Routed experts' stored format.
    pub experts: Format,
}

/// A device tensor from host data; `what` names it in the (internal) error.
fn device(what: &str, shape: &[usize], data: &[f32]) -> Result<Tensor<f32>, ForwardError> {
    Tensor::from_f32(shape, data).map_err(|message| ForwardError::Internal {
        what: what.to_string(),
        message,
    })
}

impl Loader<'_> {
    /// A device tensor of `shape` from host values made by `make` (a checkpoint's tensors
    /// rearranged), or shape-only without a checkpoint (`make` is then not called).
    pub fn derived(
        &self,
        what: &str,
        shape: &[usize],
        make: impl FnOnce(&Checkpoint) -> Result<Vec<f32>, ForwardError>,
    ) -> Result<Tensor<f32>, ForwardError> {
        match self.ckpt {
            Some(c) => device(what, shape, &make(c)?),
            None => Ok(Tensor::shape_only(shape)),
        }
    }

    /// The tensor `name`, which must have exactly `shape`.
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor<f32>, ForwardError> {
        self.derived(name, shape, |c| Ok(c.f32(name, shape)?))
    }

    /// The format a projection of stored format `stored` is held in: f32 at [`Precision::F32`];
    /// at [`Precision::Native`] the stored format in cost-only runs, and bf16 when a (float)
    /// checkpoint's values are loaded.
    fn held(&self, stored: Format) -> Format {
        match (self.precision, self.ckpt) {
            (Precision::F32, _) => Format::F32,
            (Precision::Native, None) => stored,
            (Precision::Native, Some(_)) => Format::Bf16,
        }
    }

    /// A weight of logical `shape` in `format`, from host values made by `make` (a checkpoint's
    /// tensors rearranged), or shape-only without a checkpoint.
    pub fn derived_weight(
        &self,
        what: &str,
        format: Format,
        shape: &[usize],
        make: impl FnOnce(&Checkpoint) -> Result<Vec<f32>, ForwardError>,
    ) -> Result<Weight, ForwardError> {
        let internal = |message: String| ForwardError::Internal {
            what: what.to_string(),
            message,
        };
        let Some(c) = self.ckpt else {
            return Weight::shape_only(format, shape).map_err(internal);
        };
        let values = make(c)?;
        match format {
            Format::F32 => Ok(Weight::F32(device(what, shape, &values)?)),
            Format::Bf16 => Tensor::<bf16>::from_f32(shape, &values)
                .map(Weight::Bf16)
                .map_err(internal),
            other => Err(internal(format!(
                "loading checkpoint values into {} is not supported; load them as bf16",
                other.name()
            ))),
        }
    }

    /// An attention, dense-MLP or shared-expert projection `name` of `shape`, in the checkpoint's
    /// linear-layer format.
    pub fn linear(&self, name: &str, shape: &[usize]) -> Result<Weight, ForwardError> {
        self.derived_weight(name, self.held(self.dense), shape, |c| {
            Ok(c.f32(name, shape)?)
        })
    }

    /// A projection checkpoints keep in bf16 even when the linear layers are quantized
    /// (`lm_head`, gates).
    pub fn plain(&self, name: &str, shape: &[usize]) -> Result<Weight, ForwardError> {
        self.derived_weight(name, self.held(Format::Bf16), shape, |c| {
            Ok(c.f32(name, shape)?)
        })
    }

    /// A projection whose output picks experts or tokens, kept in f32 at every precision as
    /// transformers keeps it (`_keep_in_fp32_modules`: DeepSeek's router `gate.weight`, the DSA
    /// indexer's `weights_proj`): a bf16 rounding there flips near-tied selections.
    pub fn selector(&self, name: &str, shape: &[usize]) -> Result<Weight, ForwardError> {
        self.derived_weight(name, Format::F32, shape, |c| Ok(c.f32(name, shape)?))
    }

    /// Whether the checkpoint holds `name` (without one: assumed, the config says it is needed).
    pub fn has(&self, name: &str) -> bool {
        self.ckpt.is_none_or(|c| c.contains(name))
    }

    /// Like [`Loader::get`] when the tensor exists, `None` when it does not.
    pub fn opt(&self, name: &str, shape: &[usize]) -> Result<Option<Tensor<f32>>, ForwardError> {
        if self.has(name) {
            self.get(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// A vector `name` of `len` values (a norm weight, a per-head gate parameter) as a `[1, len]`
    /// row, the layout the kernels broadcast over rows.
    pub fn row(&self, name: &str, len: usize) -> Result<Tensor<f32>, ForwardError> {
        self.norm(name, len, false)
    }

    /// An RMSNorm weight stored as an offset from 1 (Qwen3-Next's `(1 + weight)`), converted to the
    /// plain multiplier once at load time so one RMSNorm kernel serves both conventions.
    pub fn norm(
        &self,
        name: &str,
        len: usize,
        one_plus: bool,
    ) -> Result<Tensor<f32>, ForwardError> {
        self.derived(name, &[1, len], |c| {
            let mut data = c.f32(name, &[len])?;
            if one_plus {
                data.iter_mut().for_each(|w| *w += 1.0);
            }
            Ok(data)
        })
    }
}

/// MLA projections (DeepSeek-V3 family).
pub(crate) struct MlaWeights {
    /// `q_a_proj`, `q_a_layernorm`, `q_b_proj` when `q_lora_rank` is set.
    pub q_lora: Option<(Weight, Tensor<f32>, Weight)>,
    /// `q_proj` when it is not.
    pub q_proj: Option<Weight>,
    pub kv_a: Weight,
    pub kv_a_norm: Tensor<f32>,
    pub kv_b: Weight,
    pub o_proj: Weight,
    /// Absorbed decode: `W_UKᵀ` per head, `[H·R, nope]` (kv_b_proj's key rows of each head,
    /// transposed), so queries map into the latent space as a linear layer.
    pub w_uk_t: Weight,
    /// Absorbed decode: `W_UV` per head, `[H·v_head_dim, R]` (kv_b_proj's value rows).
    pub w_uv: Weight,
    /// DeepSeek-V3.2's lightning indexer.
    pub indexer: Option<IndexerWeights>,
}

/// DeepSeek-V3.2 indexer projections.
pub(crate) struct IndexerWeights {
    pub wq_b: Weight,
    pub wk: Weight,
    pub k_norm_w: Tensor<f32>,
    pub k_norm_b: Tensor<f32>,
    pub weights_proj: Weight,
}

/// A SwiGLU MLP (dense layers, shared experts).
pub(crate) struct MlpWeights {
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// A mixture-of-experts block.
pub(crate) struct MoeWeights {
    /// Router `[E, H]`.
    pub router: Weight,
    /// `e_score_correction_bias` `[1, E]` (DeepSeek): steers selection only.
    pub bias: Option<Tensor<f32>>,
    /// The router's linear bias `[1, E]` (gpt-oss), added to the logits.
    pub router_bias: Option<Tensor<f32>>,
    /// `[E, 2I, H]`: rows `0..I` of each expert are the gate projection, `I..2I` the up projection.
    pub gate_up: Weight,
    /// `[E, H, I]`.
    pub down: Weight,
    /// Per-expert biases (gpt-oss): of `gate_up` `[E, 2I]` (gate then up, as its rows) and of
    /// `down` `[E, H]`.
    pub expert_biases: Option<(Tensor<f32>, Tensor<f32>)>,
    /// The experts' activation between the two projections.
    pub activation: crate::config::ExpertActivation,
    pub shared: Option<MlpWeights>,
    /// Qwen3-Next `shared_expert_gate` `[1, H]`.
    pub shared_gate: Option<Weight>,
}

/// The feed-forward block of a layer.
// One per layer, so the size difference between the variants costs nothing worth a `Box`.
#[allow(clippy::large_enum_variant)]
pub(crate) enum FfnWeights {
    Dense(MlpWeights),
    Moe(MoeWeights),
}

/// Qwen3-Next gated full attention.
pub(crate) struct GqaWeights {
    /// `[Hq·D·2, H]` with the output gate (per head `[q | gate]`), `[Hq·D, H]` without.
    pub q_proj: Weight,
    pub k_proj: Weight,
    pub v_proj: Weight,
    pub o_proj: Weight,
    /// Per-head norms, `1 + weight` already applied.
    pub q_norm: Option<Tensor<f32>>,
    pub k_norm: Option<Tensor<f32>>,
    /// `[1, N]` bias rows of q, k and v (`qkv_bias`).
    pub qkv_bias: Option<[Tensor<f32>; 3]>,
    /// `[1, H]` bias row of `o_proj` (gpt-oss).
    pub o_bias: Option<Tensor<f32>>,
    /// `[Hq, 1]` attention sinks, one logit per query head in every softmax's denominator
    /// (gpt-oss's `self_attn.sinks`).
    pub sinks: Option<Tensor<f32>>,
}

/// Qwen3-Next Gated DeltaNet.
pub(crate) struct LinearAttnWeights {
    pub in_proj_qkvz: Weight,
    pub in_proj_ba: Weight,
    /// `conv1d.weight [C, 1, 4]` transposed to tap-major `[4, C]` (one contiguous row per tap).
    pub conv_taps: Tensor<f32>,
    /// `[1, Nv]`.
    pub a_log: Tensor<f32>,
    /// `[1, Nv]`.
    pub dt_bias: Tensor<f32>,
    /// Gated norm weight `[1, dv]` (plain weight).
    pub norm: Tensor<f32>,
    pub out_proj: Weight,
}

/// Kimi Linear KDA (`KimiLinearDeltaAttention`): separate q/k/v projections and convolutions,
/// a low-rank forget gate per key channel and a low-rank sigmoid output gate.
pub(crate) struct KdaWeights {
    pub q_proj: Weight,
    pub k_proj: Weight,
    pub v_proj: Weight,
    /// `{q,k,v}_conv1d.weight [C, 1, K]` stacked (`[q | k | v]` channels) and transposed to
    /// tap-major `[K, 2·H·dk + H·dv]`, so one convolution covers the three.
    pub conv_taps: Tensor<f32>,
    /// `f_a_proj [dk, H]`, `f_b_proj [H·dk, dk]`: the forget gate's low-rank projection.
    pub f_a: Weight,
    pub f_b: Weight,
    /// `[1, heads·dk]`.
    pub dt_bias: Tensor<f32>,
    /// `A_log [1, 1, heads, 1]` as `[1, heads]`.
    pub a_log: Tensor<f32>,
    /// `b_proj [heads, H]` (β = σ(b)).
    pub b_proj: Weight,
    /// `g_a_proj [dv, H]`, `g_b_proj [H·dv, dv]`: the output gate's low-rank projection.
    pub g_a: Weight,
    pub g_b: Weight,
    /// `o_norm.weight` `[1, dv]` (plain weight).
    pub o_norm: Tensor<f32>,
    pub o_proj: Weight,
}

/// The attention block of a layer.
// One per layer, as above.
#[allow(clippy::large_enum_variant)]
pub(crate) enum AttnWeights {
    Mla(MlaWeights),
    Gqa(GqaWeights),
    Linear(LinearAttnWeights),
    Kda(KdaWeights),
}

/// One decoder layer.
pub(crate) struct LayerWeights {
    pub input_norm: Tensor<f32>,
    pub post_attn_norm: Tensor<f32>,
    pub attn: AttnWeights,
    pub ffn: FfnWeights,
}

/// The whole model.
pub(crate) struct ModelWeights {
    pub embed: Tensor<f32>,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Tensor<f32>,
    pub lm_head: Weight,
}

fn mlp(ld: &Loader, prefix: &str, hidden: usize, inter: usize) -> Result<MlpWeights, ForwardError> {
    Ok(MlpWeights {
        gate: ld.linear(&format!("{prefix}.gate_proj.weight"), &[inter, hidden])?,
        up: ld.linear(&format!("{prefix}.up_proj.weight"), &[inter, hidden])?,
        down: ld.linear(&format!("{prefix}.down_proj.weight"), &[hidden, inter])?,
    })
}

fn mla(ld: &Loader, cfg: &ModelConfig, p: &str) -> Result<MlaWeights, ForwardError> {
    let m = cfg.mla.as_ref().ok_or_else(|| missing_dims(cfg, "MLA"))?;
    let h = cfg.hidden_size;
    let qk = m.qk_head_dim();
    let q_lora = match m.q_lora_rank {
        Some(r) => Some((
            ld.linear(&format!("{p}.q_a_proj.weight"), &[r, h])?,
            ld.get(&format!("{p}.q_a_layernorm.weight"), &[r])?,
            ld.linear(&format!("{p}.q_b_proj.weight"), &[m.heads * qk, r])?,
        )),
        None => None,
    };
    let q_proj = match m.q_lora_rank {
        None => Some(ld.linear(&format!("{p}.q_proj.weight"), &[m.heads * qk, h])?),
        Some(_) => None,
    };
    let indexer = match (
        &cfg.indexer,
        cfg.layers
            .iter()
            .any(|l| l.attention == AttentionKind::SparseMla),
    ) {
        (Some(ix), true) => {
            let q_in = m.q_lora_rank.ok_or_else(|| ForwardError::Unsupported {
                what: "a DSA indexer without q_lora_rank (its query reads the q_a latent)".into(),
            })?;
            let ip = format!("{p}.indexer");
            Some(IndexerWeights {
                wq_b: ld.linear(
                    &format!("{ip}.wq_b.weight"),
                    &[ix.heads * ix.head_dim, q_in],
                )?,
                wk: ld.linear(&format!("{ip}.wk.weight"), &[ix.head_dim, h])?,
                k_norm_w: ld.row(&format!("{ip}.k_norm.weight"), ix.head_dim)?,
                k_norm_b: ld.row(&format!("{ip}.k_norm.bias"), ix.head_dim)?,
                weights_proj: {
                    let name = format!("{ip}.weights_proj.weight");
                    let s = (ix.heads as f32).powf(-0.5);
                    ld.derived_weight(&name, Format::F32, &[ix.heads, h], |c| {
                        let mut data = c.f32(&name, &[ix.heads, h])?;
                        data.iter_mut().for_each(|w| *w *= s);
                        Ok(data)
                    })?
                },
            })
        }
        _ => None,
    };
    let kv_b_name = format!("{p}.kv_b_proj.weight");
    let (nope, vd, r) = (m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank);
    let kv_b_shape = [m.heads * (nope + vd), r];
    // The absorbed decode's per-head matrices, split out of kv_b_proj once at load time (bf16 at
    // native precision, as DeepSeek's inference code dequantizes kv_b for its absorbed path).
    let absorb = ld.held(Format::Bf16);
    let w_uk_t = ld.derived_weight("W_UK (transposed)", absorb, &[m.heads * r, nope], |c| {
        let kv_b = c.f32(&kv_b_name, &kv_b_shape)?;
        let mut out = Vec::with_capacity(m.heads * r * nope);
        for hd in 0..m.heads {
            let rows = &kv_b[hd * (nope + vd) * r..(hd * (nope + vd) + nope) * r];
            out.extend(kernels::reference::transpose(rows, nope, r));
        }
        Ok(out)
    })?;
    let w_uv = ld.derived_weight("W_UV", absorb, &[m.heads * vd, r], |c| {
        let kv_b = c.f32(&kv_b_name, &kv_b_shape)?;
        let mut out = Vec::with_capacity(m.heads * vd * r);
        for hd in 0..m.heads {
            out.extend_from_slice(&kv_b[(hd * (nope + vd) + nope) * r..(hd + 1) * (nope + vd) * r]);
        }
        Ok(out)
    })?;
    Ok(MlaWeights {
        q_lora,
        q_proj,
        kv_a: ld.linear(
            &format!("{p}.kv_a_proj_with_mqa.weight"),
            &[m.kv_lora_rank + m.qk_rope_head_dim, h],
        )?,
        kv_a_norm: ld.get(&format!("{p}.kv_a_layernorm.weight"), &[m.kv_lora_rank])?,
        kv_b: ld.linear(&kv_b_name, &kv_b_shape)?,
        o_proj: ld.linear(&format!("{p}.o_proj.weight"), &[h, m.heads * m.v_head_dim])?,
        w_uk_t,
        w_uv,
        indexer,
    })
}

fn moe(ld: &Loader, cfg: &ModelConfig, layer: usize, p: &str) -> Result<MoeWeights, ForwardError> {
    let m = cfg.moe.as_ref().ok_or_else(|| missing_dims(cfg, "MoE"))?;
    let (h, i, e) = (cfg.hidden_size, m.intermediate_size, m.experts);
    let bank = crate::weights::expert_banks(cfg)
        .into_iter()
        .find(|b| b.layer == layer)
        .ok_or_else(|| ForwardError::Internal {
            what: format!("layer {layer} experts"),
            message: "no expert bank for a MoE layer".into(),
        })?;
    // Whatever the checkpoint's layout (per expert, fused, MXFP4), as [E, 2I, H]: per expert the
    // gate rows then the up rows, so one grouped GEMM produces both halves.
    let what = format!("layer {layer} experts");
    // MXFP4 packs K in 32-value blocks, INT4 in its groups: experts whose sizes do not divide
    // are held in bf16.
    let format = match ld.held(ld.experts) {
        Format::Mxfp4 if h % 32 != 0 || i % 32 != 0 => Format::Bf16,
        Format::Int4 { group } if h % group != 0 || i % group != 0 => Format::Bf16,
        f => f,
    };
    let gate_up = ld.derived_weight(&what, format, &[e, 2 * i, h], |c| {
        let ew = bank.load_f32(c)?;
        let mut gu = Vec::with_capacity(2 * e * i * h);
        for x in 0..e {
            gu.extend_from_slice(&ew.gate[x * i * h..(x + 1) * i * h]);
            gu.extend_from_slice(&ew.up[x * i * h..(x + 1) * i * h]);
        }
        Ok(gu)
    })?;
    let down = ld.derived_weight(&what, format, &[e, h, i], |c| Ok(bank.load_f32(c)?.down))?;
    let shared_prefix = if ld.has(&format!("{p}.shared_experts.gate_proj.weight")) {
        format!("{p}.shared_experts")
    } else {
        format!("{p}.shared_expert")
    };
    let shared = if m.shared_experts > 0 {
        Some(mlp(ld, &shared_prefix, h, m.shared_intermediate_size)?)
    } else {
        None
    };
    let shared_gate = if m.shared_expert_gate {
        Some(ld.plain(&format!("{p}.shared_expert_gate.weight"), &[1, h])?)
    } else {
        None
    };
    let router_name = match cfg.family {
        crate::config::Family::GptOss | crate::config::Family::Llama4 => "router",
        _ => "gate",
    };
    let (bias_name, bias_shape) = crate::weights::names::correction_bias_tensor(cfg.family, e);
    let (router_bias, expert_biases) = if m.biases {
        let gate_up_bias = format!("{p}.experts.gate_up_proj_bias");
        let down_bias = format!("{p}.experts.down_proj_bias");
        // In the order of `gate_up`'s rows: per expert the gate biases, then the up biases.
        let (gate_col, up_col) = crate::weights::gate_up_columns(i, bank.interleaved);
        let gate_up_bias = ld.derived(&gate_up_bias, &[e, 2 * i], |c| {
            let b = c.f32(&gate_up_bias, &[e, 2 * i])?;
            Ok(b.chunks_exact(2 * i)
                .flat_map(|row| {
                    let (g, u) = (&gate_col, &up_col);
                    (0..i)
                        .map(move |r| row[g(r)])
                        .chain((0..i).map(move |r| row[u(r)]))
                })
                .collect())
        })?;
        (
            Some(ld.row(&format!("{p}.{router_name}.bias"), e)?),
            Some((
                gate_up_bias,
                ld.derived(&down_bias, &[e, h], |c| Ok(c.f32(&down_bias, &[e, h])?))?,
            )),
        )
    } else {
        (None, None)
    };
    Ok(MoeWeights {
        router: ld.selector(&format!("{p}.{router_name}.weight"), &[e, h])?,
        router_bias,
        expert_biases,
        activation: m.activation,
        bias: ld
            .opt(&format!("{p}.{bias_name}"), &bias_shape)?
            .map(|b| b.reshaped(&[1, e]))
            .transpose()
            .map_err(|message| ForwardError::Internal {
                what: "router bias".into(),
                message,
            })?,
        gate_up,
        down,
        shared,
        shared_gate,
    })
}

fn gqa(
    ld: &Loader,
    cfg: &ModelConfig,
    p: &str,
    one_plus: bool,
) -> Result<GqaWeights, ForwardError> {
    let g = cfg
        .gqa
        .as_ref()
        .ok_or_else(|| missing_dims(cfg, "attention"))?;
    let (h, d) = (cfg.hidden_size, g.head_dim);
    let q_rows = g.heads * d * if g.output_gate { 2 } else { 1 };
    let (q_norm, k_norm) = if g.qk_norm {
        // One weight per head's dimension, or per dimension of every head (across heads).
        let (qn, kn) = match g.qk_norm_across_heads {
            true => (g.heads * d, g.kv_heads * d),
            false => (d, d),
        };
        (
            Some(ld.norm(&format!("{p}.q_norm.weight"), qn, one_plus)?),
            Some(ld.norm(&format!("{p}.k_norm.weight"), kn, one_plus)?),
        )
    } else {
        (None, None)
    };
    Ok(GqaWeights {
        q_proj: ld.linear(&format!("{p}.q_proj.weight"), &[q_rows, h])?,
        k_proj: ld.linear(&format!("{p}.k_proj.weight"), &[g.kv_heads * d, h])?,
        v_proj: ld.linear(&format!("{p}.v_proj.weight"), &[g.kv_heads * d, h])?,
        o_proj: ld.linear(&format!("{p}.o_proj.weight"), &[h, g.heads * d])?,
        q_norm,
        k_norm,
        qkv_bias: if g.qkv_bias {
            Some([
                ld.row(&format!("{p}.q_proj.bias"), q_rows)?,
                ld.row(&format!("{p}.k_proj.bias"), g.kv_heads * d)?,
                ld.row(&format!("{p}.v_proj.bias"), g.kv_heads * d)?,
            ])
        } else {
            None
        },
        o_bias: if g.o_bias {
            Some(ld.row(&format!("{p}.o_proj.bias"), h)?)
        } else {
            None
        },
        sinks: if g.sinks {
            let name = format!("{p}.sinks");
            Some(ld.derived(&name, &[g.heads, 1], |c| Ok(c.f32(&name, &[g.heads])?))?)
        } else {
            None
        },
    })
}

fn kda(ld: &Loader, cfg: &ModelConfig, p: &str) -> Result<KdaWeights, ForwardError> {
    let l = cfg
        .linear_attention
        .as_ref()
        .ok_or_else(|| missing_dims(cfg, "linear-attention"))?;
    let h = cfg.hidden_size;
    let (heads, dk, dv) = (l.key_heads, l.key_head_dim, l.value_head_dim);
    let (key, value) = (heads * dk, l.value_heads * dv);
    let conv_dim = 2 * key + value;
    let conv_taps = ld.derived("conv taps", &[l.conv_kernel, conv_dim], |c| {
        let mut taps = Vec::with_capacity(conv_dim * l.conv_kernel);
        for (part, width) in [("q", key), ("k", key), ("v", value)] {
            taps.extend(c.f32(
                &format!("{p}.{part}_conv1d.weight"),
                &[width, 1, l.conv_kernel],
            )?);
        }
        Ok(kernels::reference::transpose(
            &taps,
            conv_dim,
            l.conv_kernel,
        ))
    })?;
    let a_log_name = format!("{p}.A_log");
    let a_log = ld.derived(&a_log_name, &[1, heads], |c| {
        Ok(c.f32(&a_log_name, &[1, 1, heads, 1])?)
    })?;
    Ok(KdaWeights {
        q_proj: ld.linear(&format!("{p}.q_proj.weight"), &[key, h])?,
        k_proj: ld.linear(&format!("{p}.k_proj.weight"), &[key, h])?,
        v_proj: ld.linear(&format!("{p}.v_proj.weight"), &[value, h])?,
        conv_taps,
        f_a: ld.linear(&format!("{p}.f_a_proj.weight"), &[dk, h])?,
        f_b: ld.linear(&format!("{p}.f_b_proj.weight"), &[key, dk])?,
        dt_bias: ld.row(&format!("{p}.dt_bias"), key)?,
        a_log,
        b_proj: ld.linear(&format!("{p}.b_proj.weight"), &[heads, h])?,
        g_a: ld.linear(&format!("{p}.g_a_proj.weight"), &[dv, h])?,
        g_b: ld.linear(&format!("{p}.g_b_proj.weight"), &[value, dv])?,
        o_norm: ld.row(&format!("{p}.o_norm.weight"), dv)?,
        o_proj: ld.linear(&format!("{p}.o_proj.weight"), &[h, value])?,
    })
}

fn linear_attn(ld: &Loader, cfg: &ModelConfig, p: &str) -> Result<LinearAttnWeights, ForwardError> {
    let l = cfg
        .linear_attention
        .as_ref()
        .ok_or_else(|| missing_dims(cfg, "linear-attention"))?;
    let h = cfg.hidden_size;
    let (qk, v) = (
        l.key_heads * l.key_head_dim,
        l.value_heads * l.value_head_dim,
    );
    let conv_dim = 2 * qk + v;
    let conv_name = format!("{p}.conv1d.weight");
    let conv_taps = ld.derived("conv taps", &[l.conv_kernel, conv_dim], |c| {
        let taps = c.f32(&conv_name, &[conv_dim, 1, l.conv_kernel])?;
        Ok(kernels::reference::transpose(
            &taps,
            conv_dim,
            l.conv_kernel,
        ))
    })?;
    let row = |name: &str, n: usize| ld.row(&format!("{p}.{name}"), n);
    // The checkpoint groups the fused projections' outputs per key head ([q | k | v | z] and
    // [b | a] of each group); held part-major, so the projection's output is already
    // `[q | k | v]` (the convolution's channels) then z, and `[b | a]` is b then a: views, with
    // no copy per group in every layer and step.
    let (nk, r) = (l.key_heads, l.value_heads / l.key_heads.max(1));
    let (dk, dv) = (l.key_head_dim, l.value_head_dim);
    let grouped = |name: String, rows: usize, parts: [usize; 4], nparts: usize| {
        let shape = [rows, h];
        ld.derived_weight(&name, ld.held(ld.dense), &shape, |c| {
            Ok(part_major(&c.f32(&name, &shape)?, h, nk, &parts[..nparts]))
        })
    };
    Ok(LinearAttnWeights {
        in_proj_qkvz: grouped(
            format!("{p}.in_proj_qkvz.weight"),
            2 * qk + 2 * v,
            [dk, dk, r * dv, r * dv],
            4,
        )?,
        in_proj_ba: grouped(
            format!("{p}.in_proj_ba.weight"),
            2 * l.value_heads,
            [r, r, 0, 0],
            2,
        )?,
        conv_taps,
        a_log: row("A_log", l.value_heads)?,
        dt_bias: row("dt_bias", l.value_heads)?,
        norm: row("norm.weight", l.value_head_dim)?,
        out_proj: ld.linear(&format!("{p}.out_proj.weight"), &[h, v])?,
    })
}

/// Rows of a weight stored group-major (`groups` groups, each the parts `parts` rows tall, rows
/// `row_len` wide) rearranged part-major: every group's part 0, then every group's part 1, ...
fn part_major(values: &[f32], row_len: usize, groups: usize, parts: &[usize]) -> Vec<f32> {
    let group: usize = parts.iter().sum();
    let mut out = Vec::with_capacity(values.len());
    let mut offset = 0;
    for part in parts {
        for g in 0..groups {
            let start = (g * group + offset) * row_len;
            out.extend_from_slice(&values[start..start + part * row_len]);
        }
        offset += part;
    }
    out
}

fn missing_dims(cfg: &ModelConfig, what: &str) -> ForwardError {
    ForwardError::Unsupported {
        what: format!(
            "{}: layers need {what} dimensions the config does not give",
            cfg.source
        ),
    }
}

impl ModelWeights {
    /// Binds every tensor the config's layers need; the first missing or misshapen tensor is an
    /// error naming it and the shape expected.
    /// Without a checkpoint (`None`) every tensor is shape-only (cost-only runs).
    /// Projections are held as `precision` says ([`Loader::linear`]).
    pub fn load(
        cfg: &ModelConfig,
        ckpt: Option<&Checkpoint>,
        precision: Precision,
    ) -> Result<ModelWeights, ForwardError> {
        let stored = |f: &WeightFormat| match f {
            WeightFormat::Fp8Block { .. } => Format::Fp8Block,
            WeightFormat::Mxfp4 => Format::Mxfp4,
            WeightFormat::Int4Group { group } => Format::Int4 { group: *group },
            WeightFormat::Float | WeightFormat::Other(_) => Format::Bf16,
        };
        if ckpt.is_some() && cfg.indexer.as_ref().is_some_and(|i| i.rope_interleaved) {
            return Err(ForwardError::Unsupported {
                what:
                    "an indexer whose RoPE rotates interleaved pairs (`indexer_rope_interleave`, \
                       GLM-5): cost-only runs take its config.json, numeric runs rotate halves"
                        .into(),
            });
        }
        let unbound = match cfg.family {
            crate::config::Family::MiniMaxM2 => Some("MiniMax-M2"),
            crate::config::Family::Ernie45Moe => Some("ERNIE-4.5 MoE"),
            crate::config::Family::BailingMoe => Some("Ling / Ring (bailing_moe)"),
            _ => None,
        };
        let int4 = |f: &WeightFormat| matches!(f, WeightFormat::Int4Group { .. });
        let int4_experts = cfg.moe.as_ref().is_some_and(|m| int4(&m.expert_format));
        if ckpt.is_some() && (int4(&cfg.weight_format) || int4_experts) {
            return Err(ForwardError::Unsupported {
                what: "INT4 (compressed-tensors pack-quantized) checkpoints: cost-only runs take \
                       its config.json and run the INT4 expert GEMM, but numeric runs do not \
                       unpack `weight_packed`/`weight_scale` yet"
                    .into(),
            });
        }
        if let (Some(name), Some(_)) = (unbound, ckpt) {
            return Err(ForwardError::Unsupported {
                what: format!(
                    "{name} checkpoints: cost-only runs take its config.json, but its weights \
                     are not bound against a transformers reference yet"
                ),
            });
        }
        let ld = Loader {
            ckpt,
            precision,
            // A dense MXFP4 or INT4 layer has no kernel: hold it in bf16.
            dense: match stored(&cfg.weight_format) {
                Format::Mxfp4 | Format::Int4 { .. } => Format::Bf16,
                f => f,
            },
            experts: cfg
                .moe
                .as_ref()
                .map_or(Format::Bf16, |m| stored(&m.expert_format)),
        };
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let m = cfg.family.tensor_prefix();
        let embed = ld.get(&format!("{m}embed_tokens.weight"), &[v, h])?;
        // Qwen3-Next stores its RMSNorm weights as offsets from 1.
        let one_plus = cfg.family == crate::config::Family::Qwen3Next;
        // The FFN module's name (`mlp`, Kimi Linear's `block_sparse_moe`).
        let (ffn_module, _) = crate::weights::names::ffn_names(cfg.family);
        let mut layers = Vec::with_capacity(cfg.layers.len());
        for (l, spec) in cfg.layers.iter().enumerate() {
            let p = format!("{m}layers.{l}");
            let attn = match &spec.attention {
                AttentionKind::Mla | AttentionKind::SparseMla => {
                    AttnWeights::Mla(mla(&ld, cfg, &format!("{p}.self_attn"))?)
                }
                AttentionKind::Gqa
                | AttentionKind::SlidingGqa
                | AttentionKind::ChunkedGqa
                | AttentionKind::NopeGqa => {
                    AttnWeights::Gqa(gqa(&ld, cfg, &format!("{p}.self_attn"), one_plus)?)
                }
                AttentionKind::LinearAttention => {
                    match cfg.linear_attention.as_ref().map(|l| l.decay) {
                        Some(crate::config::Decay::PerChannel) => {
                            AttnWeights::Kda(kda(&ld, cfg, &format!("{p}.self_attn"))?)
                        }
                        _ => {
                            AttnWeights::Linear(linear_attn(&ld, cfg, &format!("{p}.linear_attn"))?)
                        }
                    }
                }
                other => {
                    return Err(ForwardError::Unsupported {
                        what: format!("layer {l}: numeric forward of `{}` attention", other.name()),
                    })
                }
            };
            let ffn = match &spec.ffn {
                FfnKind::Dense => {
                    let i = cfg
                        .dense_mlp
                        .as_ref()
                        .ok_or_else(|| missing_dims(cfg, "dense MLP"))?
                        .intermediate_size;
                    FfnWeights::Dense(mlp(&ld, &format!("{p}.{ffn_module}"), h, i)?)
                }
                FfnKind::Moe => FfnWeights::Moe(moe(&ld, cfg, l, &format!("{p}.{ffn_module}"))?),
                FfnKind::Unknown(k) => {
                    return Err(ForwardError::Unsupported {
                        what: format!("layer {l}: feed-forward kind `{k}`"),
                    })
                }
            };
            layers.push(LayerWeights {
                input_norm: ld.norm(&format!("{p}.input_layernorm.weight"), h, one_plus)?,
                post_attn_norm: ld.norm(
                    &format!("{p}.post_attention_layernorm.weight"),
                    h,
                    one_plus,
                )?,
                attn,
                ffn,
            });
        }
        let lm_head = if !ld.has("lm_head.weight") && cfg.tie_word_embeddings {
            ld.plain(&format!("{m}embed_tokens.weight"), &[v, h])?
        } else {
            ld.plain("lm_head.weight", &[v, h])?
        };
        Ok(ModelWeights {
            embed,
            layers,
            final_norm: ld.norm(&format!("{m}norm.weight"), h, one_plus)?,
            lm_head,
        })
    }
}
