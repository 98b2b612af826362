//! The tensors a model needs, with the names Hugging Face writes and the shapes its
//! [`ModelConfig`] implies.
//!
//! Names are those transformers 5.24's `save_pretrained` writes (checked by saving tiny random
//! models of each architecture and listing the files): it converts its in-memory fused expert
//! parameters back to the per-expert names the Hub checkpoints use, so the **per-expert** layout
//! is the default. Shapes are PyTorch's `nn.Linear` layout, `[out_features, in_features]`.
//!
//! | family | attention | feed-forward |
//! |---|---|---|
//! | `deepseek_v3`, `kimi_k2`, `deepseek_v2` | `self_attn.{q_a_proj, q_a_layernorm, q_b_proj}` (or `q_proj` when `q_lora_rank` is null), `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj` | dense `mlp.{gate,up,down}_proj`; MoE `mlp.gate.weight`, `mlp.gate.e_score_correction_bias` (not V2), `mlp.experts.{e}.{gate,up,down}_proj`, `mlp.shared_experts.*` |
//! | `deepseek_v32` | as V3, plus `self_attn.indexer.{wq_b, wk, k_norm (weight, bias), weights_proj}` | as V3 |
//! | `qwen3_next` | full: `self_attn.{q_proj (query + gate), k_proj, v_proj, o_proj, q_norm, k_norm}`; linear: `linear_attn.{in_proj_qkvz, in_proj_ba, conv1d, dt_bias, A_log, norm, out_proj}` | `mlp.gate`, `mlp.experts.{e}.*`, `mlp.shared_expert.*`, `mlp.shared_expert_gate` |
//! | `qwen3_vl_moe` | `model.language_model.layers.N.self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}` (every name under `model.language_model.`; the vision encoder's under `model.visual.`, [`crate::vision::VisionConfig::tensor_shapes`]) | `mlp.gate`, fused `mlp.experts.{gate_up_proj, down_proj}` |
//! | `qwen3`, `qwen3_moe` | `self_attn.{q_proj, k_proj, v_proj, o_proj, q_norm, k_norm}` | dense `mlp.{gate,up,down}_proj`; MoE `mlp.gate`, `mlp.experts.{e}.*` |
//! | `llama`, `mistral` | `self_attn.{q_proj, k_proj, v_proj, o_proj}` | `mlp.{gate,up,down}_proj` |
//! | `mixtral` | as Llama | `block_sparse_moe.gate`, experts `w1` (gate), `w3` (up), `w2` (down) |
//! | `qwen2` | as Llama, plus `self_attn.{q,k,v}_proj.bias` | `mlp.{gate,up,down}_proj` |
//! | `glm4_moe` | as Qwen2 (biases per `attention_bias`), `q_norm`/`k_norm` with `use_qk_norm` | as DeepSeek-V3 |
//! | `gpt_oss` | as Qwen2, plus `self_attn.o_proj.bias` and `self_attn.sinks [heads]` | `mlp.router.{weight, bias}`, fused input-major `mlp.experts.{gate_up_proj, down_proj}` (gate/up columns interleaved; MXFP4 `_blocks`/`_scales` in the releases) with `gate_up_proj_bias`, `down_proj_bias` |
//! | `minimax_m2` (from its modeling code, not a saved checkpoint) | as Llama, plus `self_attn.q_norm [heads·D]`, `self_attn.k_norm [kv_heads·D]` (across heads) | `block_sparse_moe.gate`, `block_sparse_moe.e_score_correction_bias` (beside the gate), experts `w1`, `w3`, `w2` |
//! | `kimi_linear` | MLA as V3; KDA: `self_attn.{q,k,v}_proj`, `{q,k,v}_conv1d`, `f_a_proj`, `f_b_proj`, `dt_bias`, `A_log`, `b_proj`, `g_a_proj`, `g_b_proj`, `o_norm`, `o_proj` | `block_sparse_moe.*`, experts `w1` (gate), `w3` (up), `w2` (down) |
//!
//! Every model also has `model.embed_tokens.weight`, `model.norm.weight`, per layer
//! `input_layernorm` / `post_attention_layernorm`, and `lm_head.weight` (optional when
//! `tie_word_embeddings`: transformers then does not write it).
//!
//! `day0_hybrid` has no Hugging Face modeling file; day0 names its tensors with the conventions
//! above: MLA/DSA layers as DeepSeek-V3.2, GDN layers as Qwen3-Next, KDA layers as Kimi Linear,
//! MoE as DeepSeek-V3 (`e_score_correction_bias` only with the sigmoid router).
//!
//! Routed experts come in four layouts ([`ExpertLayout`]): per expert (what `save_pretrained`
//! and the Hub write), fused (transformers' in-memory `experts.gate_up_proj [E, 2I, H]` and
//! `experts.down_proj [E, H, I]`), fused input-major (`[E, H, 2I]` and `[E, I, H]`: the released
//! Qwen3-VL-MoE checkpoints), and gpt-oss MXFP4 (`experts.gate_up_proj_blocks/_scales`,
//! `experts.down_proj_blocks/_scales`). [`expected_tensors`] lists the one the configuration's
//! format implies (MXFP4 when the experts are stored as MXFP4, per expert otherwise);
//! [`crate::weights::verify`] accepts any of them ([`ExpertBank::detect`]), and
//! [`ExpertBank::load_f32`] reads any of them into one layout.
//!
//! Attention or FFN kinds day0 does not know (`Unknown`) contribute no expected tensors: the
//! coverage inventory reports them, and their tensors show up as extras.

use super::experts::{ExpertBank, ExpertLayout};
use crate::config::{
    AttentionKind, Decay, Family, FfnKind, ModelConfig, MoeDims, RouterKind, WeightFormat,
};

/// How a tensor is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// One tensor of this name: F32/BF16/F16, or FP8 E4M3 with a `<name>_scale_inv` sibling.
    Float,
    /// gpt-oss MXFP4: `<name>_blocks` + `<name>_scales`; the shape is the dequantised one
    /// ([`crate::weights::mxfp4_logical_shape`]).
    Mxfp4,
}

/// One tensor a model needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedTensor {
    /// The Hugging Face name (for [`Storage::Mxfp4`], the prefix of the pair).
    pub name: String,
    /// The shape the configuration implies.
    pub shape: Vec<usize>,
    /// Whether its absence is an error (`lm_head.weight` with tied embeddings is not).
    pub required: bool,
    /// How it is stored.
    pub storage: Storage,
}

impl ExpectedTensor {
    /// A required [`Storage::Float`] tensor.
    pub(crate) fn float(name: String, shape: Vec<usize>) -> ExpectedTensor {
        ExpectedTensor {
            name,
            shape,
            required: true,
            storage: Storage::Float,
        }
    }
}

/// The layout the configuration's expert format implies.
pub fn default_expert_layout(moe: &MoeDims) -> ExpertLayout {
    match moe.expert_format {
        WeightFormat::Mxfp4 => ExpertLayout::Mxfp4,
        _ => ExpertLayout::PerExpert,
    }
}

/// The tensors a model needs, with Hugging Face names and shapes, from its ModelConfig: model-wide
/// tensors, then layer by layer, routed experts in [`default_expert_layout`].
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<ExpectedTensor> {
    let banks = expert_banks(cfg);
    let layout = cfg.moe.as_ref().map(default_expert_layout);
    let mut out = Vec::new();
    for part in expected_parts(cfg) {
        match part {
            Part::Tensor(t) => out.push(t),
            Part::Bank(b) => {
                out.extend(banks[b].tensors(layout.unwrap_or(ExpertLayout::PerExpert)))
            }
        }
    }
    out
}

/// The routed-expert banks of every MoE layer, in layer order.
pub fn expert_banks(cfg: &ModelConfig) -> Vec<ExpertBank> {
    let Some(moe) = &cfg.moe else {
        return Vec::new();
    };
    let (ffn, projections) = ffn_names(cfg.family);
    cfg.layers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.ffn == FfnKind::Moe)
        .map(|(i, _)| ExpertBank {
            layer: i,
            prefix: format!("{}layers.{i}.{ffn}.experts", cfg.family.tensor_prefix()),
            experts: moe.experts,
            hidden: cfg.hidden_size,
            intermediate: moe.intermediate_size,
            projections,
            interleaved: cfg.family == Family::GptOss,
        })
        .collect()
}

/// An expected tensor, or the place of a routed-expert bank (an index into [`expert_banks`]),
/// whose tensors depend on the layout the checkpoint uses.
#[derive(Debug, Clone)]
pub(crate) enum Part {
    Tensor(ExpectedTensor),
    Bank(usize),
}

/// The FFN module name and the per-expert projection names of a family.
pub(crate) fn ffn_names(family: Family) -> (&'static str, [&'static str; 3]) {
    match family {
        Family::KimiLinear | Family::Mixtral | Family::MiniMaxM2 => {
            ("block_sparse_moe", ["w1", "w3", "w2"])
        }
        Family::Llama4 => ("feed_forward", ["gate_proj", "up_proj", "down_proj"]),
        _ => ("mlp", ["gate_proj", "up_proj", "down_proj"]),
    }
}

/// The router's `e_score_correction_bias` under the FFN module, and its shape: in the gate for
/// DeepSeek-V3 and its kin, beside it for MiniMax-M2, in `moe_statics` for ERNIE-4.5, which keeps
/// one row per expert group (its text models have one).
pub(crate) fn correction_bias_tensor(family: Family, experts: usize) -> (&'static str, Vec<usize>) {
    match family {
        Family::MiniMaxM2 => ("e_score_correction_bias", vec![experts]),
        Family::Ernie45Moe => ("moe_statics.e_score_correction_bias", vec![1, experts]),
        Family::BailingMoe => ("gate.expert_bias", vec![experts]),
        _ => ("gate.e_score_correction_bias", vec![experts]),
    }
}

/// Everything a model needs, expert banks left as [`Part::Bank`].
pub(crate) fn expected_parts(cfg: &ModelConfig) -> Vec<Part> {
    let h = cfg.hidden_size;
    let m = cfg.family.tensor_prefix();
    let mut out = vec![Part::Tensor(ExpectedTensor::float(
        format!("{m}embed_tokens.weight"),
        vec![cfg.vocab_size, h],
    ))];
    let mut bank = 0;
    for (l, spec) in cfg.layers.iter().enumerate() {
        let p = format!("{m}layers.{l}");
        let mut push = |name: String, shape: Vec<usize>| {
            out.push(Part::Tensor(ExpectedTensor::float(name, shape)))
        };
        push(format!("{p}.input_layernorm.weight"), vec![h]);
        push(format!("{p}.post_attention_layernorm.weight"), vec![h]);
        attention(cfg, &spec.attention, &p, &mut push);
        let moe_layer = ffn(cfg, &spec.ffn, &p, &mut push);
        if moe_layer {
            out.push(Part::Bank(bank));
            bank += 1;
        }
    }
    if let Some(v) = &cfg.vision {
        for (name, shape) in v.tensor_shapes("model.visual.") {
            out.push(Part::Tensor(ExpectedTensor::float(name, shape)));
        }
    }
    out.push(Part::Tensor(ExpectedTensor::float(
        format!("{m}norm.weight"),
        vec![h],
    )));
    out.push(Part::Tensor(ExpectedTensor {
        name: "lm_head.weight".into(),
        shape: vec![cfg.vocab_size, h],
        required: !cfg.tie_word_embeddings,
        storage: Storage::Float,
    }));
    out
}

/// One layer's attention tensors.
fn attention(
    cfg: &ModelConfig,
    kind: &AttentionKind,
    p: &str,
    push: &mut impl FnMut(String, Vec<usize>),
) {
    let h = cfg.hidden_size;
    match kind {
        AttentionKind::Mla | AttentionKind::SparseMla => {
            let Some(m) = &cfg.mla else { return };
            let a = format!("{p}.self_attn");
            let q_out = m.heads * m.qk_head_dim();
            match m.q_lora_rank {
                Some(r) => {
                    push(format!("{a}.q_a_proj.weight"), vec![r, h]);
                    push(format!("{a}.q_a_layernorm.weight"), vec![r]);
                    push(format!("{a}.q_b_proj.weight"), vec![q_out, r]);
                }
                None => push(format!("{a}.q_proj.weight"), vec![q_out, h]),
            }
            push(
                format!("{a}.kv_a_proj_with_mqa.weight"),
                vec![m.kv_lora_rank + m.qk_rope_head_dim, h],
            );
            push(format!("{a}.kv_a_layernorm.weight"), vec![m.kv_lora_rank]);
            push(
                format!("{a}.kv_b_proj.weight"),
                vec![
                    m.heads * (m.qk_nope_head_dim + m.v_head_dim),
                    m.kv_lora_rank,
                ],
            );
            push(
                format!("{a}.o_proj.weight"),
                vec![h, m.heads * m.v_head_dim],
            );
            if *kind == AttentionKind::SparseMla {
                if let Some(ix) = &cfg.indexer {
                    let i = format!("{a}.indexer");
                    // The indexer's queries come from the compressed query; transformers (and
                    // DeepSeek's reference) cannot build one without q_lora_rank, so a model
                    // without it can only project from the hidden state.
                    let q_in = m.q_lora_rank.unwrap_or(h);
                    push(
                        format!("{i}.wq_b.weight"),
                        vec![ix.heads * ix.head_dim, q_in],
                    );
                    push(format!("{i}.wk.weight"), vec![ix.head_dim, h]);
                    push(format!("{i}.k_norm.weight"), vec![ix.head_dim]);
                    push(format!("{i}.k_norm.bias"), vec![ix.head_dim]);
                    push(format!("{i}.weights_proj.weight"), vec![ix.heads, h]);
                }
            }
        }
        AttentionKind::Gqa
        | AttentionKind::SlidingGqa
        | AttentionKind::ChunkedGqa
        | AttentionKind::NopeGqa => {
            let Some(g) = &cfg.gqa else { return };
            let a = format!("{p}.self_attn");
            let gate = if g.output_gate { 2 } else { 1 };
            push(
                format!("{a}.q_proj.weight"),
                vec![g.heads * g.head_dim * gate, h],
            );
            push(
                format!("{a}.k_proj.weight"),
                vec![g.kv_heads * g.head_dim, h],
            );
            push(
                format!("{a}.v_proj.weight"),
                vec![g.kv_heads * g.head_dim, h],
            );
            push(format!("{a}.o_proj.weight"), vec![h, g.heads * g.head_dim]);
            if g.qkv_bias {
                push(
                    format!("{a}.q_proj.bias"),
                    vec![g.heads * g.head_dim * gate],
                );
                push(format!("{a}.k_proj.bias"), vec![g.kv_heads * g.head_dim]);
                push(format!("{a}.v_proj.bias"), vec![g.kv_heads * g.head_dim]);
            }
            if g.qk_norm {
                let (q, k) = match g.qk_norm_across_heads {
                    true => (g.heads * g.head_dim, g.kv_heads * g.head_dim),
                    false => (g.head_dim, g.head_dim),
                };
                push(format!("{a}.q_norm.weight"), vec![q]);
                push(format!("{a}.k_norm.weight"), vec![k]);
            }
            if g.o_bias {
                push(format!("{a}.o_proj.bias"), vec![h]);
            }
            if g.sinks {
                push(format!("{a}.sinks"), vec![g.heads]);
            }
        }
        AttentionKind::LinearAttention => {
            let Some(la) = &cfg.linear_attention else {
                return;
            };
            let (hk, hv, dk, dv, kc) = (
                la.key_heads,
                la.value_heads,
                la.key_head_dim,
                la.value_head_dim,
                la.conv_kernel,
            );
            match la.decay {
                // Qwen3-Next Gated DeltaNet.
                Decay::Scalar => {
                    let a = format!("{p}.linear_attn");
                    let key = hk * dk;
                    let value = hv * dv;
                    push(
                        format!("{a}.in_proj_qkvz.weight"),
                        vec![2 * key + 2 * value, h],
                    );
                    push(format!("{a}.in_proj_ba.weight"), vec![2 * hv, h]);
                    push(format!("{a}.conv1d.weight"), vec![2 * key + value, 1, kc]);
                    push(format!("{a}.dt_bias"), vec![hv]);
                    push(format!("{a}.A_log"), vec![hv]);
                    push(format!("{a}.norm.weight"), vec![dv]);
                    push(format!("{a}.out_proj.weight"), vec![h, value]);
                }
                // Kimi Linear KDA (its heads and head dims are shared by keys and values).
                Decay::PerChannel => {
                    let a = format!("{p}.self_attn");
                    let key = hk * dk;
                    let value = hv * dv;
                    push(format!("{a}.q_proj.weight"), vec![key, h]);
                    push(format!("{a}.k_proj.weight"), vec![key, h]);
                    push(format!("{a}.v_proj.weight"), vec![value, h]);
                    push(format!("{a}.q_conv1d.weight"), vec![key, 1, kc]);
                    push(format!("{a}.k_conv1d.weight"), vec![key, 1, kc]);
                    push(format!("{a}.v_conv1d.weight"), vec![value, 1, kc]);
                    push(format!("{a}.f_a_proj.weight"), vec![dk, h]);
                    push(format!("{a}.f_b_proj.weight"), vec![key, dk]);
                    push(format!("{a}.dt_bias"), vec![key]);
                    push(format!("{a}.A_log"), vec![1, 1, hk, 1]);
                    push(format!("{a}.b_proj.weight"), vec![hk, h]);
                    push(format!("{a}.g_a_proj.weight"), vec![dv, h]);
                    push(format!("{a}.g_b_proj.weight"), vec![value, dv]);
                    push(format!("{a}.o_norm.weight"), vec![dv]);
                    push(format!("{a}.o_proj.weight"), vec![h, value]);
                }
            }
        }
        AttentionKind::Unknown(_) => {}
    }
}

/// One layer's feed-forward tensors other than the routed experts; whether it has an expert bank.
fn ffn(
    cfg: &ModelConfig,
    kind: &FfnKind,
    p: &str,
    push: &mut impl FnMut(String, Vec<usize>),
) -> bool {
    let h = cfg.hidden_size;
    let (module, _) = ffn_names(cfg.family);
    let m = format!("{p}.{module}");
    let swiglu = |prefix: &str, inter: usize, push: &mut dyn FnMut(String, Vec<usize>)| {
        push(format!("{prefix}.gate_proj.weight"), vec![inter, h]);
        push(format!("{prefix}.up_proj.weight"), vec![inter, h]);
        push(format!("{prefix}.down_proj.weight"), vec![h, inter]);
    };
    match kind {
        FfnKind::Dense => {
            if let Some(d) = &cfg.dense_mlp {
                swiglu(&m, d.intermediate_size, push);
            }
            false
        }
        FfnKind::Moe => {
            let Some(moe) = &cfg.moe else { return false };
            if matches!(cfg.family, Family::GptOss | Family::Llama4) {
                push(format!("{m}.router.weight"), vec![moe.experts, h]);
            } else {
                push(format!("{m}.gate.weight"), vec![moe.experts, h]);
            }
            if moe.biases {
                // gpt-oss: the router's bias and each expert's (gate_up's interleaved like its
                // columns).
                push(format!("{m}.router.bias"), vec![moe.experts]);
                push(
                    format!("{m}.experts.gate_up_proj_bias"),
                    vec![moe.experts, 2 * moe.intermediate_size],
                );
                push(format!("{m}.experts.down_proj_bias"), vec![moe.experts, h]);
            }
            let correction_bias = match cfg.family {
                // transformers' DeepSeek-V3 / Kimi router always has the bias parameter.
                Family::DeepseekV3
                | Family::KimiK2
                | Family::DeepseekV32
                | Family::KimiLinear
                | Family::Glm4Moe
                | Family::MiniMaxM2
                | Family::Ernie45Moe => true,
                Family::Qwen3Next
                | Family::Qwen3VlMoe
                | Family::Qwen3
                | Family::Llama
                | Family::Mixtral
                | Family::Qwen2
                | Family::GptOss
                | Family::Llama4 => false,
                Family::Day0Hybrid | Family::DeepseekV2 | Family::BailingMoe => {
                    moe.router == RouterKind::SigmoidGroupTopk
                }
            };
            if correction_bias {
                let (name, shape) = correction_bias_tensor(cfg.family, moe.experts);
                push(format!("{m}.{name}"), shape);
            }
            if moe.shared_experts > 0 && moe.shared_intermediate_size > 0 {
                if moe.shared_expert_gate {
                    // Qwen3-Next: one sigmoid-gated shared expert.
                    swiglu(
                        &format!("{m}.shared_expert"),
                        moe.shared_intermediate_size,
                        push,
                    );
                    push(format!("{m}.shared_expert_gate.weight"), vec![1, h]);
                } else {
                    // Llama 4 names its one shared expert in the singular.
                    let name = match cfg.family {
                        Family::Llama4 => "shared_expert",
                        _ => "shared_experts",
                    };
                    swiglu(&format!("{m}.{name}"), moe.shared_intermediate_size, push);
                }
            }
            true
        }
        FfnKind::Unknown(_) => false,
    }
}
