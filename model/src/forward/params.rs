//! The checkpoint's tensors bound to the layers that use them, as device tensors (f32).
//!
//! Names are Hugging Face's (what `save_pretrained` writes). Routed experts are read in whatever
//! layout the checkpoint stores them ([`crate::weights::ExpertBank`]) and stacked once into
//! `[E, 2I, H]` (gate rows then up rows per expert) and `[E, H, I]`.

use super::ForwardError;
use crate::config::{AttentionKind, FfnKind, ModelConfig};
use crate::weights::Checkpoint;
use dsl_core::Tensor;

/// Loads tensors by name with the expected shape, as f32 device tensors; without a checkpoint
/// (a cost-only run from config.json alone) every tensor is shape-only, of the shape the config
/// implies.
pub(crate) struct Loader<'a> {
    pub ckpt: Option<&'a Checkpoint>,
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

    /// The tensor times a constant folded in at load time (the indexer's `index_n_heads^-1/2`,
    /// which transformers applies to the projection's output: the same product).
    pub fn scaled(&self, name: &str, shape: &[usize], s: f32) -> Result<Tensor<f32>, ForwardError> {
        self.derived(name, shape, |c| {
            let mut data = c.f32(name, shape)?;
            data.iter_mut().for_each(|w| *w *= s);
            Ok(data)
        })
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
    pub q_lora: Option<(Tensor<f32>, Tensor<f32>, Tensor<f32>)>,
    /// `q_proj` when it is not.
    pub q_proj: Option<Tensor<f32>>,
    pub kv_a: Tensor<f32>,
    pub kv_a_norm: Tensor<f32>,
    pub kv_b: Tensor<f32>,
    pub o_proj: Tensor<f32>,
    /// DeepSeek-V3.2's lightning indexer.
    pub indexer: Option<IndexerWeights>,
}

/// DeepSeek-V3.2 indexer projections.
pub(crate) struct IndexerWeights {
    pub wq_b: Tensor<f32>,
    pub wk: Tensor<f32>,
    pub k_norm_w: Tensor<f32>,
    pub k_norm_b: Tensor<f32>,
    pub weights_proj: Tensor<f32>,
}

/// A SwiGLU MLP (dense layers, shared experts).
pub(crate) struct MlpWeights {
    pub gate: Tensor<f32>,
    pub up: Tensor<f32>,
    pub down: Tensor<f32>,
}

/// A mixture-of-experts block.
pub(crate) struct MoeWeights {
    /// Router `[E, H]`.
    pub router: Tensor<f32>,
    /// `e_score_correction_bias` `[1, E]` (DeepSeek).
    pub bias: Option<Tensor<f32>>,
    /// `[E, 2I, H]`: rows `0..I` of each expert are the gate projection, `I..2I` the up projection.
    pub gate_up: Tensor<f32>,
    /// `[E, H, I]`.
    pub down: Tensor<f32>,
    pub shared: Option<MlpWeights>,
    /// Qwen3-Next `shared_expert_gate` `[1, H]`.
    pub shared_gate: Option<Tensor<f32>>,
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
    pub q_proj: Tensor<f32>,
    pub k_proj: Tensor<f32>,
    pub v_proj: Tensor<f32>,
    pub o_proj: Tensor<f32>,
    /// Per-head norms, `1 + weight` already applied.
    pub q_norm: Option<Tensor<f32>>,
    pub k_norm: Option<Tensor<f32>>,
}

/// Qwen3-Next Gated DeltaNet.
pub(crate) struct LinearAttnWeights {
    pub in_proj_qkvz: Tensor<f32>,
    pub in_proj_ba: Tensor<f32>,
    /// `conv1d.weight [C, 1, 4]` transposed to tap-major `[4, C]` (one contiguous row per tap).
    pub conv_taps: Tensor<f32>,
    /// `[1, Nv]`.
    pub a_log: Tensor<f32>,
    /// `[1, Nv]`.
    pub dt_bias: Tensor<f32>,
    /// Gated norm weight `[1, dv]` (plain weight).
    pub norm: Tensor<f32>,
    pub out_proj: Tensor<f32>,
}

/// Kimi Linear KDA (`KimiLinearDeltaAttention`): separate q/k/v projections and convolutions,
/// a low-rank forget gate per key channel and a low-rank sigmoid output gate.
pub(crate) struct KdaWeights {
    pub q_proj: Tensor<f32>,
    pub k_proj: Tensor<f32>,
    pub v_proj: Tensor<f32>,
    /// `{q,k,v}_conv1d.weight [C, 1, K]` stacked (`[q | k | v]` channels) and transposed to
    /// tap-major `[K, 2·H·dk + H·dv]`, so one convolution covers the three.
    pub conv_taps: Tensor<f32>,
    /// `f_a_proj [dk, H]`, `f_b_proj [H·dk, dk]`: the forget gate's low-rank projection.
    pub f_a: Tensor<f32>,
    pub f_b: Tensor<f32>,
    /// `[1, heads·dk]`.
    pub dt_bias: Tensor<f32>,
    /// `A_log [1, 1, heads, 1]` as `[1, heads]`.
    pub a_log: Tensor<f32>,
    /// `b_proj [heads, H]` (β = σ(b)).
    pub b_proj: Tensor<f32>,
    /// `g_a_proj [dv, H]`, `g_b_proj [H·dv, dv]`: the output gate's low-rank projection.
    pub g_a: Tensor<f32>,
    pub g_b: Tensor<f32>,
    /// `o_norm.weight` `[1, dv]` (plain weight).
    pub o_norm: Tensor<f32>,
    pub o_proj: Tensor<f32>,
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
    pub lm_head: Tensor<f32>,
}

fn mlp(ld: &Loader, prefix: &str, hidden: usize, inter: usize) -> Result<MlpWeights, ForwardError> {
    Ok(MlpWeights {
        gate: ld.get(&format!("{prefix}.gate_proj.weight"), &[inter, hidden])?,
        up: ld.get(&format!("{prefix}.up_proj.weight"), &[inter, hidden])?,
        down: ld.get(&format!("{prefix}.down_proj.weight"), &[hidden, inter])?,
    })
}

fn mla(ld: &Loader, cfg: &ModelConfig, p: &str) -> Result<MlaWeights, ForwardError> {
    let m = cfg.mla.as_ref().ok_or_else(|| missing_dims(cfg, "MLA"))?;
    let h = cfg.hidden_size;
    let qk = m.qk_head_dim();
    let q_lora = match m.q_lora_rank {
        Some(r) => Some((
            ld.get(&format!("{p}.q_a_proj.weight"), &[r, h])?,
            ld.get(&format!("{p}.q_a_layernorm.weight"), &[r])?,
            ld.get(&format!("{p}.q_b_proj.weight"), &[m.heads * qk, r])?,
        )),
        None => None,
    };
    let q_proj = match m.q_lora_rank {
        None => Some(ld.get(&format!("{p}.q_proj.weight"), &[m.heads * qk, h])?),
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
                wq_b: ld.get(
                    &format!("{ip}.wq_b.weight"),
                    &[ix.heads * ix.head_dim, q_in],
                )?,
                wk: ld.get(&format!("{ip}.wk.weight"), &[ix.head_dim, h])?,
                k_norm_w: ld.row(&format!("{ip}.k_norm.weight"), ix.head_dim)?,
                k_norm_b: ld.row(&format!("{ip}.k_norm.bias"), ix.head_dim)?,
                weights_proj: ld.scaled(
                    &format!("{ip}.weights_proj.weight"),
                    &[ix.heads, h],
                    (ix.heads as f32).powf(-0.5),
                )?,
            })
        }
        _ => None,
    };
    Ok(MlaWeights {
        q_lora,
        q_proj,
        kv_a: ld.get(
            &format!("{p}.kv_a_proj_with_mqa.weight"),
            &[m.kv_lora_rank + m.qk_rope_head_dim, h],
        )?,
        kv_a_norm: ld.get(&format!("{p}.kv_a_layernorm.weight"), &[m.kv_lora_rank])?,
        kv_b: ld.get(
            &format!("{p}.kv_b_proj.weight"),
            &[
                m.heads * (m.qk_nope_head_dim + m.v_head_dim),
                m.kv_lora_rank,
            ],
        )?,
        o_proj: ld.get(&format!("{p}.o_proj.weight"), &[h, m.heads * m.v_head_dim])?,
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
    let (gate_up, down) = match ld.ckpt {
        Some(c) => {
            let ew = bank.load_f32(c)?;
            let mut gu = Vec::with_capacity(2 * e * i * h);
            for x in 0..e {
                gu.extend_from_slice(&ew.gate[x * i * h..(x + 1) * i * h]);
                gu.extend_from_slice(&ew.up[x * i * h..(x + 1) * i * h]);
            }
            (
                device(&what, &[e, 2 * i, h], &gu)?,
                device(&what, &[e, h, i], &ew.down)?,
            )
        }
        None => (
            Tensor::shape_only(&[e, 2 * i, h]),
            Tensor::shape_only(&[e, h, i]),
        ),
    };
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
        Some(ld.get(&format!("{p}.shared_expert_gate.weight"), &[1, h])?)
    } else {
        None
    };
    Ok(MoeWeights {
        router: ld.get(&format!("{p}.gate.weight"), &[e, h])?,
        bias: ld
            .opt(&format!("{p}.gate.e_score_correction_bias"), &[e])?
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
        (
            Some(ld.norm(&format!("{p}.q_norm.weight"), d, one_plus)?),
            Some(ld.norm(&format!("{p}.k_norm.weight"), d, one_plus)?),
        )
    } else {
        (None, None)
    };
    Ok(GqaWeights {
        q_proj: ld.get(&format!("{p}.q_proj.weight"), &[q_rows, h])?,
        k_proj: ld.get(&format!("{p}.k_proj.weight"), &[g.kv_heads * d, h])?,
        v_proj: ld.get(&format!("{p}.v_proj.weight"), &[g.kv_heads * d, h])?,
        o_proj: ld.get(&format!("{p}.o_proj.weight"), &[h, g.heads * d])?,
        q_norm,
        k_norm,
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
        q_proj: ld.get(&format!("{p}.q_proj.weight"), &[key, h])?,
        k_proj: ld.get(&format!("{p}.k_proj.weight"), &[key, h])?,
        v_proj: ld.get(&format!("{p}.v_proj.weight"), &[value, h])?,
        conv_taps,
        f_a: ld.get(&format!("{p}.f_a_proj.weight"), &[dk, h])?,
        f_b: ld.get(&format!("{p}.f_b_proj.weight"), &[key, dk])?,
        dt_bias: ld.row(&format!("{p}.dt_bias"), key)?,
        a_log,
        b_proj: ld.get(&format!("{p}.b_proj.weight"), &[heads, h])?,
        g_a: ld.get(&format!("{p}.g_a_proj.weight"), &[dv, h])?,
        g_b: ld.get(&format!("{p}.g_b_proj.weight"), &[value, dv])?,
        o_norm: ld.row(&format!("{p}.o_norm.weight"), dv)?,
        o_proj: ld.get(&format!("{p}.o_proj.weight"), &[h, value])?,
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
    Ok(LinearAttnWeights {
        in_proj_qkvz: ld.get(&format!("{p}.in_proj_qkvz.weight"), &[2 * qk + 2 * v, h])?,
        in_proj_ba: ld.get(&format!("{p}.in_proj_ba.weight"), &[2 * l.value_heads, h])?,
        conv_taps,
        a_log: row("A_log", l.value_heads)?,
        dt_bias: row("dt_bias", l.value_heads)?,
        norm: row("norm.weight", l.value_head_dim)?,
        out_proj: ld.get(&format!("{p}.out_proj.weight"), &[h, v])?,
    })
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
    pub fn load(
        cfg: &ModelConfig,
        ckpt: Option<&Checkpoint>,
    ) -> Result<ModelWeights, ForwardError> {
        let ld = Loader { ckpt };
        let (h, v) = (cfg.hidden_size, cfg.vocab_size);
        let embed = ld.get("model.embed_tokens.weight", &[v, h])?;
        // Qwen3-Next stores its RMSNorm weights as offsets from 1.
        let one_plus = cfg.family == crate::config::Family::Qwen3Next;
        // The FFN module's name (`mlp`, Kimi Linear's `block_sparse_moe`).
        let (ffn_module, _) = crate::weights::names::ffn_names(cfg.family);
        let mut layers = Vec::with_capacity(cfg.layers.len());
        for (l, spec) in cfg.layers.iter().enumerate() {
            let p = format!("model.layers.{l}");
            let attn = match &spec.attention {
                AttentionKind::Mla | AttentionKind::SparseMla => {
                    AttnWeights::Mla(mla(&ld, cfg, &format!("{p}.self_attn"))?)
                }
                AttentionKind::Gqa => {
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
        let lm_head = match ld.opt("lm_head.weight", &[v, h])? {
            Some(w) => w,
            None if cfg.tie_word_embeddings => embed.clone(),
            None => ld.get("lm_head.weight", &[v, h])?,
        };
        Ok(ModelWeights {
            embed,
            layers,
            final_norm: ld.norm("model.norm.weight", h, one_plus)?,
            lm_head,
        })
    }
}
