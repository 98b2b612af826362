//! # Model configurations: from `config.json` to one normalised description
//!
//! Release day starts with a Hugging Face `config.json`. [`load_config`] reads one (a file, or a
//! model directory holding `config.json`) and [`parse_config`] parses its text into a
//! [`ModelConfig`]: the same normalised description whatever the source layout — model-wide sizes,
//! the dimensions of each attention and feed-forward family the model uses, and one [`LayerSpec`]
//! per layer saying which attention and which feed-forward block that layer runs. The operator
//! graph ([`crate::graph`]) and the coverage inventory ([`crate::coverage`]) are built from it.
//!
//! Supported `model_type`s (parsers in [`crate::arch`], which documents each field's source):
//!
//! | `model_type` | architecture | layers |
//! |---|---|---|
//! | `deepseek_v3`, `kimi_k2` | DeepSeek-V3 (Kimi-K2 uses it) | MLA; dense MLP for the first `first_k_dense_replace`, then MoE |
//! | `deepseek_v32` | DeepSeek-V3.2 | MLA + DSA indexer (`index_n_heads`, `index_head_dim`, `index_topk`) |
//! | `qwen3_next` | Qwen3-Next | gated GQA every `full_attention_interval`-th layer, Gated DeltaNet elsewhere (or `layer_types`) |
//! | `qwen3_vl_moe` | Qwen3-VL-MoE's language model (`text_config`; the vision encoder is [`crate::vision`]) | GQA with q/k norm in every layer; MoE per `decoder_sparse_step` / `mlp_only_layers`, no shared expert |
//! | `kimi_linear` | Kimi Linear | KDA / MLA (no RoPE) from `linear_attn_config` |
//! | `qwen3_moe`, `qwen3` | Qwen3 (MoE, dense) | GQA with q/k norm in every layer; MoE per `decoder_sparse_step` / `mlp_only_layers` (`qwen3`: dense MLP) |
//! | `llama`, `mistral` | Llama 2/3 (`llama3` RoPE scaling), Mistral | GQA, dense SwiGLU MLP |
//! | `mixtral` | Mixtral | GQA, MoE (softmax top-k, renormalised) in every layer |
//! | `qwen2`, `qwen2_moe` | Qwen2 / Qwen2.5, Qwen2-MoE | GQA with q/k/v biases; dense SwiGLU MLP, or Qwen's MoE layout with a sigmoid-gated shared expert |
//! | `glm4_moe` | GLM-4.5 / 4.6 | GQA with q/k/v biases and partial RoPE; dense MLP for `first_k_dense_replace`, then DeepSeek-V3's MoE |
//! | `llama4`, `llama4_text` | Llama 4's language model (`text_config`) | RoPE layers chunked (`attention_chunk_size`), every `no_rope_layer_interval`-th NoPE with the attention temperature; MoE in `moe_layers` (input-scaled top-k sigmoid + shared expert), dense MLPs of `intermediate_size_mlp` elsewhere |
//! | `bailing_moe` | Ling / Ring (Ling-lite 1.5, Ling 2.0 to Ling-1T) | GQA with q/k RMSNorm and partial RoPE; dense MLP for `first_k_dense_replace`, then softmax or sigmoid + expert-bias MoE with shared experts |
//! | `day0_hybrid` | day0's own schema (see [`crate::arch`]) | per-layer kind: MLA / sparse-indexed MLA / linear attention; MoE with MXFP4 experts |
//!
//! Rules, following the reference code (transformers' `configuration_*.py`) where it has one:
//! - **Required fields** are the ones that fix tensor shapes or the layer structure; a missing one
//!   is [`ModelError::MissingField`] naming the field and the file. Behavioural fields that the
//!   reference configuration class defaults (e.g. `n_group`, `rms_norm_eps`) take the same default,
//!   recorded as a [`ConfigWarning::Defaulted`] so nothing is silently assumed.
//! - **An unknown `model_type`** (a release that reuses an architecture under a new name, as
//!   GLM-5's `glm_moe_dsa` reuses DeepSeek-V3.2's) is read with the schema of the family its
//!   fields match (`crate::arch::infer_family`: a latent KV rank is MLA, `index_topk` a DSA
//!   indexer, `linear_attention` layers Qwen3-Next's hybrid, ...; a multimodal file's
//!   `text_config`, its language model, when the top level names nothing), keeping its name, with a
//!   [`ConfigWarning::InferredFamily`] first among the warnings; a file whose fields name no
//!   architecture is [`ModelError::UnsupportedModelType`].
//! - **Unknown fields** are not fatal: each is reported as a [`ConfigWarning::UnknownField`].
//!   Fields the reference knows but that do not change the forward pass (token ids, training-only
//!   coefficients, `auto_map`, ...) are accepted silently.
//! - **RoPE** parameters are read from `rope_scaling` (older files) or `rope_parameters` (what
//!   transformers 5 writes); when both are present `rope_scaling` wins, as in transformers'
//!   `convert_rope_params_to_dict`. `rope_theta` may sit at the top level or inside the dict.
//! - **Errors are values** ([`ModelError`], with the file and the field), never panics.

use serde_json::{Map, Value};
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

/// What went wrong reading a configuration. Every variant names the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelError {
    /// The file could not be read.
    Io {
        /// The path given.
        file: String,
        /// The operating system's message.
        message: String,
    },
    /// The file is not valid JSON.
    Json {
        /// The file.
        file: String,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column of the error.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A required field is absent (or `null` where a value is needed).
    MissingField {
        /// The file.
        file: String,
        /// The field, with its enclosing objects (`linear_attn_config.num_heads`).
        field: String,
        /// Why it is required (the model type, or the layer kind that needs it).
        needed_by: String,
    },
    /// A field holds the wrong JSON type.
    WrongType {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// What was expected (`a non-negative integer`, ...).
        expected: &'static str,
        /// What was found (`a string "abc"`, ...).
        found: String,
    },
    /// A field has a value the model cannot have (zero heads, a layer list of the wrong length...).
    InvalidValue {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// What is wrong and what to change.
        message: String,
    },
    /// `model_type` names an architecture day0 does not parse.
    UnsupportedModelType {
        /// The file.
        file: String,
        /// The `model_type` found.
        model_type: String,
    },
    /// An unknown `model_type` whose fields match a known family's, except for fields that
    /// change the architecture and that schema does not read (ERNIE-4.5's `moe_num_experts`,
    /// Llama-4's `interleave_moe_layer_step`): read that way it would be another network.
    UnexplainedFields {
        /// The file.
        file: String,
        /// The `model_type` found.
        model_type: String,
        /// The known family its other fields match, and why (`` `mixtral` (it sets …) ``).
        parsed_as: String,
        /// The fields that schema leaves unread (full names).
        fields: Vec<String>,
    },
}

/// The `model_type`s [`parse_config`] knows by name; any other is read with the schema of the
/// family its fields match, with a [`ConfigWarning::InferredFamily`], or refused.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "deepseek_v32",
    "qwen3_next",
    "qwen3_vl_moe",
    "kimi_linear",
    "qwen3_moe",
    "qwen3",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "glm4_moe",
    "gpt_oss",
    "minimax_m2",
    "ernie4_5_moe",
    "llama4",
    "llama4_text",
    "bailing_moe",
    "day0_hybrid",
];

impl ModelError {
    /// The file the error is about.
    pub fn file(&self) -> &str {
        match self {
            ModelError::Io { file, .. }
            | ModelError::Json { file, .. }
            | ModelError::MissingField { file, .. }
            | ModelError::WrongType { file, .. }
            | ModelError::InvalidValue { file, .. }
            | ModelError::UnsupportedModelType { file, .. }
            | ModelError::UnexplainedFields { file, .. } => file,
        }
    }

    /// The field the error is about, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ModelError::MissingField { field, .. }
            | ModelError::WrongType { field, .. }
            | ModelError::InvalidValue { field, .. } => Some(field),
            _ => None,
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::Io { file, message } => write!(f, "{file}: cannot read: {message}"),
            ModelError::Json {
                file,
                line,
                column,
                message,
            } => write!(f, "{file}:{line}:{column}: malformed JSON: {message}"),
            ModelError::MissingField {
                file,
                field,
                needed_by,
            } => write!(
                f,
                "{file}: required field `{field}` is missing (needed by {needed_by})"
            ),
            ModelError::WrongType {
                file,
                field,
                expected,
                found,
            } => write!(
                f,
                "{file}: field `{field}` must be {expected}, found {found}"
            ),
            ModelError::InvalidValue {
                file,
                field,
                message,
            } => write!(f, "{file}: field `{field}`: {message}"),
            ModelError::UnsupportedModelType { file, model_type } => write!(
                f,
                "{file}: model_type `{model_type}` is not supported (supported: {}), and its \
                 fields (or its `text_config`'s) name no known architecture: `kv_lora_rank` \
                 (MLA), `linear_attention` layers, or `num_attention_heads`, `hidden_size` and \
                 `num_hidden_layers` with `n_routed_experts`, `num_local_experts`, an expert count \
                 with `moe_intermediate_size`, or a dense `intermediate_size`",
                SUPPORTED_MODEL_TYPES.join(", ")
            ),
            ModelError::UnexplainedFields {
                file,
                model_type,
                parsed_as,
                fields,
            } => {
                let names: Vec<String> = fields.iter().map(|f| format!("`{f}`")).collect();
                let (verb, them) = match fields.len() {
                    1 => ("changes", "it"),
                    _ => ("change", "them"),
                };
                write!(
                    f,
                    "{file}: model_type `{model_type}` is not one day0 knows; its fields match \
                     {parsed_as}, but {} {verb} the architecture and that schema does not read \
                     {them}, so day0 would model another network (a MoE as dense, other layer \
                     patterns). It needs a parser of its own (model/src/arch.rs, \
                     `parse_known`); if the fields change nothing, remove {them} from a copy of \
                     the file",
                    names.join(", "),
                )
            }
        }
    }
}

impl std::error::Error for ModelError {}

/// Something worth telling the user that does not stop the parse.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigWarning {
    /// A field the parser does not know (a new architecture feature, or a typo).
    UnknownField {
        /// The field, with its enclosing objects.
        field: String,
    },
    /// An optional field was absent; the reference configuration's default was used.
    Defaulted {
        /// The field.
        field: String,
        /// The value used.
        value: String,
    },
    /// `model_type` is not one day0 knows: the file was read with the schema of the known
    /// family its fields match (a release that reuses an architecture under a new name).
    InferredFamily {
        /// The `model_type` as written.
        model_type: String,
        /// The known `model_type` whose parser read the file.
        parsed_as: String,
        /// The fields that decided it.
        because: String,
    },
    /// A field was read but has no effect on day0's model (with why).
    Ignored {
        /// The field.
        field: String,
        /// Why it has no effect.
        reason: String,
    },
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::UnknownField { field } => write!(f, "unknown field `{field}` (ignored)"),
            ConfigWarning::Defaulted { field, value } => {
                write!(f, "`{field}` not set: using the reference default {value}")
            }
            ConfigWarning::Ignored { field, reason } => write!(f, "`{field}` ignored: {reason}"),
            ConfigWarning::InferredFamily {
                model_type,
                parsed_as,
                because,
            } => write!(
                f,
                "model_type `{model_type}` is not one day0 knows: read as `{parsed_as}` because \
                 {because} (`day0 coverage --config FILE` lists the fields that schema does not \
                 know: check that none of them changes the architecture)"
            ),
        }
    }
}

/// The architecture a configuration describes (from its `model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `deepseek_v2`: DeepSeek-V2, V2.5, V2-Lite and Coder-V2 (MLA, the query compression
    /// optional; softmax routing, greedy or group-limited by each group's best expert, scaled and
    /// never renormalised, no correction bias).
    DeepseekV2,
    /// `deepseek_v3`.
    DeepseekV3,
    /// `kimi_k2` (DeepSeek-V3 architecture, other sizes).
    KimiK2,
    /// `deepseek_v32` (DeepSeek-V3 + DSA indexer).
    DeepseekV32,
    /// `qwen3_next`.
    Qwen3Next,
    /// `kimi_linear`.
    KimiLinear,
    /// `qwen3_vl_moe`: the language model of Qwen3-VL-MoE (its vision encoder: [`crate::vision`]).
    Qwen3VlMoe,
    /// `qwen3_moe` and `qwen3`: Qwen3 (GQA with q/k RMSNorm in every layer; MoE with softmax
    /// top-k routing, or dense).
    Qwen3,
    /// `llama` and `mistral`: GQA without q/k norms, dense SwiGLU MLP.
    Llama,
    /// `mixtral`: Mistral attention, MoE with softmax top-k routing renormalised, experts
    /// under `block_sparse_moe` (`w1` gate, `w3` up, `w2` down).
    Mixtral,
    /// `qwen2` and `qwen2_moe`: Qwen2 / Qwen2.5, GQA with q/k/v biases; dense SwiGLU MLP, or MoE
    /// with a sigmoid-gated shared expert.
    Qwen2,
    /// `glm4_moe`: GLM-4.5, GQA (q/k/v biases, partial RoPE) with DeepSeek-V3's MoE.
    Glm4Moe,
    /// `gpt_oss`: gpt-oss-120b / 20b. GQA with biases and attention sinks, alternating
    /// sliding-window and full layers, MoE with biased experts, a clamped SwiGLU and MXFP4
    /// weights. Every operator has a kernel: cost-only runs from its config.json; its checkpoints'
    /// experts (interleaved gate/up, input-major) are not read yet, so numeric runs refuse it.
    GptOss,
    /// `minimax_m2`: MiniMax-M2 (M2.1, M2.5, M2.7): GQA with a q/k RMSNorm across all heads and
    /// RoPE on part of each head, DeepSeek-V3's sigmoid routing with a correction bias over
    /// Mixtral-style experts in every layer. Cost-only from its config.json; its checkpoints are
    /// not read yet (no transformers reference of it is pinned), so numeric runs refuse it.
    MiniMaxM2,
    /// `ernie4_5_moe`: Baidu ERNIE-4.5 (21B-A3B, 300B-A47B): Llama attention; from
    /// `moe_layer_start_index` on, every `moe_layer_interval`-th layer a MoE with
    /// `moe_num_shared_experts` shared experts, routed by softmax scores whose top-k is picked
    /// with a correction bias (`moe_statics`) — a router day0 has no kernel for yet, so coverage
    /// reports it missing and runs stop there.
    Ernie45Moe,
    /// `llama4` / `llama4_text`: Llama 4 (Scout, Maverick). GQA whose RoPE layers attend within
    /// chunks of `attention_chunk_size` positions (L2-normed q/k with `use_qk_norm`) and whose
    /// every `no_rope_layer_interval`-th layer attends the whole context without positions (the
    /// query scaled by a temperature); MoE in the `moe_layers` (top-k on the router logits,
    /// the sigmoid of each chosen logit scaling the expert's *input*, plus a shared expert),
    /// dense SwiGLU MLPs of `intermediate_size_mlp` elsewhere. The language model only (its
    /// vision encoder is not modelled); checkpoints under `Llama4ForCausalLM`'s names (`model.`,
    /// experts fused input-major) run on data, and so do the multimodal releases'
    /// (`language_model.model.`, read under the text model's names by
    /// [`crate::weights::Checkpoint::open`]).
    Llama4,
    /// `bailing_moe`: Ant Group's Ling / Ring MoE (Ling-lite 1.5, Ling 2.0 up to Ling-1T): GQA
    /// with per-head q/k RMSNorm and partial RoPE, dense MLPs before `first_k_dense_replace`,
    /// then softmax or DeepSeek-V3 sigmoid routing with shared experts. Cost-only from its
    /// config.json (no transformers reference of it to bind checkpoints against).
    BailingMoe,
    /// `day0_hybrid`, day0's own schema.
    Day0Hybrid,
}

impl Family {
    /// The prefix of the language model's tensor names: `model.`, or `model.language_model.` for
    /// a multimodal checkpoint whose `model` also holds the vision encoder (`model.visual.`).
    pub fn tensor_prefix(self) -> &'static str {
        match self {
            Family::Qwen3VlMoe => "model.language_model.",
            _ => "model.",
        }
    }

    /// A human name for tables.
    pub fn display_name(self) -> &'static str {
        match self {
            Family::DeepseekV2 => "DeepSeek-V2",
            Family::DeepseekV3 => "DeepSeek-V3",
            Family::KimiK2 => "Kimi-K2 (DeepSeek-V3 architecture)",
            Family::DeepseekV32 => "DeepSeek-V3.2 (MLA + DSA)",
            Family::Qwen3Next => "Qwen3-Next (Gated DeltaNet + gated attention)",
            Family::KimiLinear => "Kimi Linear (KDA + MLA)",
            Family::Qwen3VlMoe => "Qwen3-VL-MoE (language model; vision encoder: day0 vision)",
            Family::Qwen3 => "Qwen3 (GQA with q/k norm)",
            Family::Llama => "Llama / Mistral (GQA)",
            Family::Mixtral => "Mixtral (GQA + softmax top-k MoE)",
            Family::Qwen2 => "Qwen2 (GQA with q/k/v biases)",
            Family::Glm4Moe => "GLM-4.5 (GQA with q/k/v biases, DeepSeek-V3 MoE)",
            Family::GptOss => "gpt-oss (GQA with sinks, sliding windows, MXFP4 MoE)",
            Family::MiniMaxM2 => "MiniMax-M2 (GQA with q/k norm across heads, sigmoid MoE)",
            Family::Ernie45Moe => "ERNIE-4.5 MoE (GQA, softmax MoE with a correction bias)",
            Family::Llama4 => "Llama 4 (chunked and NoPE GQA, top-k sigmoid MoE + shared expert)",
            Family::BailingMoe => {
                "Ling / Ring (bailing_moe: GQA with q/k norm, DeepSeek-style MoE)"
            }
            Family::Day0Hybrid => "day0 hybrid",
        }
    }
}

/// Which attention a layer runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AttentionKind {
    /// Multi-head latent attention over all past tokens ([`ModelConfig::mla`]).
    Mla,
    /// MLA restricted to the `index_topk` tokens a DSA indexer selects ([`ModelConfig::indexer`]).
    SparseMla,
    /// Grouped-query attention ([`ModelConfig::gqa`]; Qwen3-Next's gated variant).
    Gqa,
    /// Linear attention with the gated delta rule ([`ModelConfig::linear_attention`]), GDN or KDA.
    LinearAttention,
    /// Grouped-query attention over a sliding window of [`GqaDims::sliding_window`] keys
    /// (transformers' `sliding_attention` layers: Mistral, Qwen with `use_sliding_window`,
    /// gpt-oss). Its weights are GQA's; the prefill and decode kernels take the window.
    SlidingGqa,
    /// Grouped-query attention within chunks of [`GqaDims::attention_chunk`] positions
    /// (Llama 4's `chunked_attention` layers): a query at position `p` attends the keys from
    /// `⌊p/C⌋·C` to `p`. Prefill runs causal attention chunk by chunk; decode reads the last
    /// `p mod C + 1` keys; the cache keeps at most `C` tokens. Its weights are GQA's.
    ChunkedGqa,
    /// Grouped-query attention without positional encoding over the whole context (Llama 4's
    /// NoPE layers): no RoPE, and with [`GqaDims::temperature`] the query scaled by its
    /// position's attention temperature. Its weights are GQA's.
    NopeGqa,
    /// A kind day0 does not know: kept by name so the coverage inventory reports it.
    Unknown(String),
}

impl AttentionKind {
    /// Whether the layer is grouped-query attention of any form (plain, windowed, chunked or
    /// without positions): GQA's weights, a key/value cache.
    pub fn is_gqa(&self) -> bool {
        matches!(
            self,
            AttentionKind::Gqa
                | AttentionKind::SlidingGqa
                | AttentionKind::ChunkedGqa
                | AttentionKind::NopeGqa
        )
    }

    /// Short name (`mla`, `sparse_mla`, `gqa`, `linear`, or the unknown name).
    pub fn name(&self) -> String {
        match self {
            AttentionKind::Mla => "mla".into(),
            AttentionKind::SparseMla => "sparse_mla".into(),
            AttentionKind::Gqa => "gqa".into(),
            AttentionKind::LinearAttention => "linear".into(),
            AttentionKind::SlidingGqa => "sliding_attention".into(),
            AttentionKind::ChunkedGqa => "chunked_attention".into(),
            AttentionKind::NopeGqa => "nope_attention".into(),
            AttentionKind::Unknown(s) => s.clone(),
        }
    }
}

/// Which feed-forward block a layer runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FfnKind {
    /// A dense SwiGLU MLP ([`ModelConfig::dense_mlp`]).
    Dense,
    /// Mixture of experts ([`ModelConfig::moe`]).
    Moe,
    /// A kind day0 does not know, kept by name.
    Unknown(String),
}

impl FfnKind {
    /// Short name (`dense`, `moe`, or the unknown name).
    pub fn name(&self) -> String {
        match self {
            FfnKind::Dense => "dense".into(),
            FfnKind::Moe => "moe".into(),
            FfnKind::Unknown(s) => s.clone(),
        }
    }
}

/// One decoder layer: its attention and its feed-forward block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerSpec {
    /// The attention block.
    pub attention: AttentionKind,
    /// The feed-forward block.
    pub ffn: FfnKind,
}

impl LayerSpec {
    /// The layer's kind as reports group it: `"<attention>+<ffn>"`, e.g. `mla+moe`.
    pub fn kind(&self) -> String {
        format!("{}+{}", self.attention.name(), self.ffn.name())
    }
}

/// Multi-head latent attention (DeepSeek-V2/V3) dimensions.
#[derive(Debug, Clone, PartialEq)]
pub struct MlaDims {
    /// Attention heads.
    pub heads: usize,
    /// `q_lora_rank`; `None` (JSON `null`) means queries are projected directly (`q_proj`).
    pub q_lora_rank: Option<usize>,
    /// `kv_lora_rank`: width of the cached latent `c_KV`.
    pub kv_lora_rank: usize,
    /// `qk_nope_head_dim`.
    pub qk_nope_head_dim: usize,
    /// `qk_rope_head_dim` (also the width of the shared rotated key `k_R`).
    pub qk_rope_head_dim: usize,
    /// `v_head_dim`.
    pub v_head_dim: usize,
    /// Whether RoPE is applied (Kimi Linear's MLA uses none: `mla_use_nope`).
    pub use_rope: bool,
    /// RoPE pairs adjacent dims (`rope_interleave`, transformers default `true` for DeepSeek).
    pub rope_interleave: bool,
}

impl MlaDims {
    /// `qk_nope_head_dim + qk_rope_head_dim`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Width of one cached latent row: `kv_lora_rank + qk_rope_head_dim`.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// DeepSeek-V3.2 lightning indexer (DSA) dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexerDims {
    /// `index_n_heads`.
    pub heads: usize,
    /// `index_head_dim`.
    pub head_dim: usize,
    /// `index_topk`: tokens each query attends to.
    pub topk: usize,
    /// The indexer's RoPE rotates interleaved pairs (GLM-5's `indexer_rope_interleave: true`);
    /// DeepSeek-V3.2's rotates halves. The same cost either way; numeric runs implement halves
    /// only and refuse interleaved checkpoints.
    pub rope_interleaved: bool,
}

/// Grouped-query attention dimensions (Qwen3-Next full-attention layers).
#[derive(Debug, Clone, PartialEq)]
pub struct GqaDims {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Per-head RMSNorm of q and k (Qwen3-Next: yes).
    pub qk_norm: bool,
    /// With [`GqaDims::qk_norm`]: one RMSNorm over all heads of the projection (weights of
    /// `heads·D` and `kv_heads·D`), MiniMax-M2's `qk_norm_type: per_layer`, not one per head.
    pub qk_norm_across_heads: bool,
    /// Sigmoid output gate from a second half of `q_proj` (Qwen3-Next: yes).
    pub output_gate: bool,
    /// A learned per-head logit in every softmax's denominator ("attention sinks": gpt-oss's
    /// `self_attn.sinks`), the `sinks` argument of the GQA prefill and decode kernels.
    pub sinks: bool,
    /// `o_proj` carries a bias (gpt-oss's `attention_bias` biases all four projections).
    pub o_bias: bool,
    /// Keys a [`AttentionKind::SlidingGqa`] layer attends to: the last `sliding_window`
    /// positions, the query's own included.
    pub sliding_window: Option<usize>,
    /// q/k/v projections carry biases (`attention_bias`: Qwen2, GLM-4.5); `o_proj` has none.
    pub qkv_bias: bool,
    /// Positions per chunk of an [`AttentionKind::ChunkedGqa`] layer (`attention_chunk_size`).
    pub attention_chunk: Option<usize>,
    /// Each head's query and key divided by their RMS after RoPE, without a weight (Llama 4's
    /// `use_qk_norm`: `Llama4TextL2Norm`, on the layers with RoPE only).
    pub qk_l2_norm: bool,
    /// RoPE turns adjacent pairs `(2i, 2i+1)` (Llama 4's complex form), not the halves.
    pub rope_interleaved: bool,
    /// The attention temperature of [`AttentionKind::NopeGqa`] layers (Llama 4's
    /// `attn_temperature_tuning`), or none.
    pub temperature: Option<AttnTemperature>,
}

/// Llama 4's attention temperature on its NoPE layers: the query at position `p` is scaled by
/// `ln(⌊(p + 1) / floor_scale⌋ + 1) · attn_scale + 1` (1 for the first `floor_scale − 1`
/// positions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemperature {
    /// `floor_scale`.
    pub floor_scale: f64,
    /// `attn_scale`.
    pub attn_scale: f64,
}

impl AttnTemperature {
    /// The scale of the query at position `pos`.
    pub fn at(&self, pos: usize) -> f64 {
        ((((pos as f64) + 1.0) / self.floor_scale).floor() + 1.0).ln() * self.attn_scale + 1.0
    }
}

impl ModelConfig {
    /// The warning that `model_type` was not known and the file was read as another family's
    /// (every number from this config stands on that guess), if it was.
    pub fn inferred_family(&self) -> Option<&ConfigWarning> {
        self.warnings
            .iter()
            .find(|w| matches!(w, ConfigWarning::InferredFamily { .. }))
    }

    /// The sliding window of layer `l`'s attention: its keys per query, 0 for a layer that sees
    /// its whole context (or an index past the layers).
    pub fn window_of(&self, l: usize) -> usize {
        match (self.layers.get(l).map(|s| &s.attention), &self.gqa) {
            (Some(AttentionKind::SlidingGqa), Some(g)) => g.sliding_window.unwrap_or(0),
            _ => 0,
        }
    }

    /// The chunk of layer `l`'s attention: positions per chunk of a chunked layer, 0 for any
    /// other layer (or an index past the layers).
    pub fn chunk_of(&self, l: usize) -> usize {
        match (self.layers.get(l).map(|s| &s.attention), &self.gqa) {
            (Some(AttentionKind::ChunkedGqa), Some(g)) => g.attention_chunk.unwrap_or(0),
            _ => 0,
        }
    }

    /// The most keys a query of layer `l` attends at context `ctx`, and so the tokens its cache
    /// must keep: a sliding window's width, a chunk's length, else the whole context.
    pub fn keys_kept(&self, l: usize, ctx: usize) -> usize {
        match (self.window_of(l), self.chunk_of(l)) {
            (w, _) if w > 0 => w.min(ctx),
            (_, c) if c > 0 => c.min(ctx),
            _ => ctx,
        }
    }
}

impl GqaDims {
    /// Plain grouped-query attention: no q/k norms, gate, biases, sinks or window.
    pub fn new(heads: usize, kv_heads: usize, head_dim: usize) -> GqaDims {
        GqaDims {
            heads,
            kv_heads,
            head_dim,
            qk_norm: false,
            qk_norm_across_heads: false,
            output_gate: false,
            qkv_bias: false,
            sinks: false,
            o_bias: false,
            sliding_window: None,
            attention_chunk: None,
            qk_l2_norm: false,
            rope_interleaved: false,
            temperature: None,
        }
    }
}

/// How the gated delta rule decays its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Decay {
    /// Gated DeltaNet (Qwen3-Next): one scalar per head and token.
    Scalar,
    /// KDA (Kimi Linear): one per key channel.
    PerChannel,
}

/// Linear-attention (gated delta rule) dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearAttnDims {
    /// Query/key heads.
    pub key_heads: usize,
    /// Value heads (a multiple of `key_heads`).
    pub value_heads: usize,
    /// Key head dimension.
    pub key_head_dim: usize,
    /// Value head dimension.
    pub value_head_dim: usize,
    /// Causal short-convolution kernel size.
    pub conv_kernel: usize,
    /// GDN or KDA.
    pub decay: Decay,
}

/// Dense SwiGLU MLP dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenseMlpDims {
    /// Intermediate size.
    pub intermediate_size: usize,
}

/// How the router picks experts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouterKind {
    /// DeepSeek-V3: sigmoid scores, `e_score_correction_bias` for selection, group-limited top-k.
    SigmoidGroupTopk,
    /// Softmax over experts, top-k (Qwen3-Next, DeepSeek-V2 greedy).
    SoftmaxTopk,
    /// Softmax over experts, top-k picked on probability plus `e_score_correction_bias`, the
    /// unbiased probabilities renormalised (ERNIE-4.5).
    SoftmaxBiasTopk,
    /// Top-k of the raw logits, each chosen expert's score the sigmoid of its logit, never
    /// renormalised, and the score scaling the expert's *input* rather than its output (Llama 4:
    /// `routed_in = x · score`; the outputs are summed).
    SigmoidTopkScaledInput,
    /// A scoring/selection day0 does not know (`scoring_func/topk_method`).
    Unknown(String),
}

impl RouterKind {
    /// Short name used in operator names.
    pub fn name(&self) -> String {
        match self {
            RouterKind::SigmoidGroupTopk => "sigmoid_group_topk".into(),
            RouterKind::SoftmaxTopk => "softmax_topk".into(),
            RouterKind::SoftmaxBiasTopk => "softmax_bias_topk".into(),
            RouterKind::SigmoidTopkScaledInput => "sigmoid_topk_scaled_input".into(),
            RouterKind::Unknown(s) => s.clone(),
        }
    }
}

/// Storage format of weights in the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightFormat {
    /// Plain floats (bf16/f16/f32; `torch_dtype`).
    Float,
    /// Block-scaled FP8 E4M3 (`quantization_config.quant_method = "fp8"`), block `[rows, cols]`.
    Fp8Block {
        /// `weight_block_size`.
        block: [usize; 2],
    },
    /// MXFP4 (32 E2M1 values + one E8M0 scale per block).
    Mxfp4,
    /// Symmetric INT4 with one bf16 scale per `group` inputs, weights only (W4A16): the
    /// `compressed-tensors` `pack-quantized` scheme Kimi-K2-Thinking ships its experts in.
    Int4Group {
        /// Inputs per scale.
        group: usize,
    },
    /// Another `quant_method`, by name.
    Other(String),
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WeightFormat::Float => write!(f, "float"),
            WeightFormat::Fp8Block { block } => {
                write!(f, "fp8 e4m3, block-scaled {}x{}", block[0], block[1])
            }
            WeightFormat::Mxfp4 => write!(f, "mxfp4"),
            WeightFormat::Int4Group { group } => write!(f, "int4 (W4A16, bf16 scale per {group})"),
            WeightFormat::Other(s) => write!(f, "{s}"),
        }
    }
}

/// The routed experts' gated activation `act(gate) · up`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertActivation {
    /// `silu(gate) · up`.
    Swiglu,
    /// gpt-oss's: `gate` clamped above at `limit`, `up` to `±limit`, then
    /// `gate · σ(alpha · gate) · (up + 1)` (the `swiglu_clamped` kernel).
    ClampedSwiglu {
        /// `swiglu_alpha`.
        alpha: f64,
        /// `swiglu_limit`.
        limit: f64,
    },
}

/// Mixture-of-experts dimensions and routing.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeDims {
    /// Routed experts.
    pub experts: usize,
    /// Experts per token.
    pub experts_per_token: usize,
    /// Intermediate size of one routed expert.
    pub intermediate_size: usize,
    /// Number of shared experts (DeepSeek: `n_shared_experts`; Qwen3-Next: 1).
    pub shared_experts: usize,
    /// Intermediate size of the shared expert block (DeepSeek: `moe_intermediate_size ·
    /// n_shared_experts`; Qwen3-Next: `shared_expert_intermediate_size`).
    pub shared_intermediate_size: usize,
    /// Whether the shared expert's output is scaled by `σ(x · w_gate)` (Qwen3-Next).
    pub shared_expert_gate: bool,
    /// Router.
    pub router: RouterKind,
    /// Expert groups (`n_group`).
    pub n_group: usize,
    /// Groups kept per token (`topk_group`).
    pub topk_group: usize,
    /// Renormalise the selected weights (`norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// The routed experts' activation.
    pub activation: ExpertActivation,
    /// The router and every expert projection carry biases (gpt-oss): the router's is a bias
    /// row on its logits, the experts' are added per expert to the grouped rows
    /// (`grouped_add_bias`).
    pub biases: bool,
    /// `routed_scaling_factor`.
    pub routed_scaling_factor: f64,
    /// Expert weight storage.
    pub expert_format: WeightFormat,
}

/// RoPE scaling.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// YaRN (DeepSeek-V3 and derivatives).
    Yarn {
        /// `factor`.
        factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
        /// `beta_fast` (default 32).
        beta_fast: f64,
        /// `beta_slow` (default 1).
        beta_slow: f64,
        /// `mscale` (default 0 = not given: transformers then scales cos/sin by
        /// `0.1 ln(factor) + 1` whatever `mscale_all_dim` is).
        mscale: f64,
        /// `mscale_all_dim` (default 0 = not given).
        mscale_all_dim: f64,
        /// `truncate` (default true): the correction range's bounds rounded to whole dimensions
        /// (floor/ceil), as DeepSeek's YaRN does; gpt-oss sets it false.
        truncate: bool,
    },
    /// Linear position interpolation.
    Linear {
        /// `factor`.
        factor: f64,
    },
    /// Dynamic NTK.
    Dynamic {
        /// `factor`.
        factor: f64,
    },
    /// Llama 3.1's frequency-dependent interpolation (`rope_type` `llama3`): wavelengths longer
    /// than `original / low_freq_factor` are divided by `factor`, shorter than `original /
    /// high_freq_factor` kept, the band between blended.
    Llama3 {
        /// `factor`.
        factor: f64,
        /// `low_freq_factor`.
        low_freq_factor: f64,
        /// `high_freq_factor`.
        high_freq_factor: f64,
        /// `original_max_position_embeddings`.
        original_max_position_embeddings: usize,
    },
    /// Another `rope_type`, by name (parameters kept unparsed).
    Other(String),
}

/// Rotary position embedding parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeConfig {
    /// Base frequency `rope_theta`.
    pub theta: f64,
    /// Scaling.
    pub scaling: RopeScaling,
    /// Fraction of the head dimension rotated (Qwen3-Next: 0.25).
    pub partial_rotary_factor: f64,
    /// Which key the parameters came from (`rope_scaling`, `rope_parameters`, or `None` if only
    /// `rope_theta` / defaults were used).
    pub source: Option<&'static str>,
    /// Multi-axis RoPE (Qwen3-VL's `mrope_section`): how many of each head's frequencies follow
    /// the temporal, height and width positions of a token, interleaved (frequency `i` on h when
    /// `i % 3 == 1 && i < 3·h`, on w when `i % 3 == 2 && i < 3·w`, else on t). Text tokens sit at
    /// the same position on all three axes, where it is plain RoPE.
    pub mrope_section: Option<[usize; 3]>,
}

impl RopeConfig {
    /// The YaRN attention-scale correction `m` (transformers `yarn_get_mscale(factor,
    /// mscale_all_dim)`): `0.1 · mscale_all_dim · ln(factor) + 1` when `factor > 1` and
    /// `mscale_all_dim ≠ 0`, else 1. DeepSeek's MLA multiplies its softmax scale by `m²`.
    pub fn mla_mscale(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn {
                factor,
                mscale_all_dim,
                ..
            } if mscale_all_dim != 0.0 && factor > 1.0 => 0.1 * mscale_all_dim * factor.ln() + 1.0,
            _ => 1.0,
        }
    }

    /// MLA softmax scale `τ = qk_head_dim^-1/2 · m²`.
    pub fn mla_softmax_scale(&self, qk_head_dim: usize) -> f64 {
        let m = self.mla_mscale();
        (qk_head_dim as f64).powf(-0.5) * m * m
    }

    /// Short description (`yarn x40 (theta 10000)`).
    pub fn describe(&self) -> String {
        let s = match &self.scaling {
            RopeScaling::None => "plain".to_string(),
            RopeScaling::Yarn { factor, .. } => format!("yarn x{factor}"),
            RopeScaling::Linear { factor } => format!("linear x{factor}"),
            RopeScaling::Dynamic { factor } => format!("dynamic x{factor}"),
            RopeScaling::Llama3 { factor, .. } => format!("llama3 x{factor}"),
            RopeScaling::Other(t) => t.clone(),
        };
        format!("{s}, theta {}", self.theta)
    }
}

/// A parsed, normalised model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The file it came from (as given).
    pub source: String,
    /// `model_type` as written.
    pub model_type: String,
    /// Architecture.
    pub family: Family,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f64,
    /// `tie_word_embeddings`.
    pub tie_word_embeddings: bool,
    /// `max_position_embeddings`, when given.
    pub max_position_embeddings: Option<usize>,
    /// RoPE (absent for models whose layers use none).
    pub rope: Option<RopeConfig>,
    /// MLA dimensions, when a layer uses MLA or sparse MLA.
    pub mla: Option<MlaDims>,
    /// DSA indexer dimensions, when a layer uses sparse MLA.
    pub indexer: Option<IndexerDims>,
    /// GQA dimensions, when a layer uses GQA.
    pub gqa: Option<GqaDims>,
    /// Linear-attention dimensions, when a layer uses it.
    pub linear_attention: Option<LinearAttnDims>,
    /// Dense MLP dimensions, when a layer uses one.
    pub dense_mlp: Option<DenseMlpDims>,
    /// MoE dimensions, when a layer uses MoE.
    pub moe: Option<MoeDims>,
    /// One entry per decoder layer.
    pub layers: Vec<LayerSpec>,
    /// Storage format of the (non-expert) weights.
    pub weight_format: WeightFormat,
    /// Unknown fields, defaults applied, fields ignored.
    pub warnings: Vec<ConfigWarning>,
    /// The vision encoder of a multimodal model (`vision_config`), read by [`crate::vision`].
    pub vision: Option<crate::vision::VisionConfig>,
}

impl ModelConfig {
    /// Number of decoder layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The unknown fields found, by name.
    pub fn unknown_fields(&self) -> Vec<&str> {
        self.warnings
            .iter()
            .filter_map(|w| match w {
                ConfigWarning::UnknownField { field } => Some(field.as_str()),
                _ => None,
            })
            .collect()
    }

    /// Layer indices per (attention, ffn) kind, for summaries: `[(kind name, count)]` in first-seen
    /// order.
    pub fn layer_summary(&self) -> String {
        let mut att: Vec<(String, usize)> = Vec::new();
        let mut ffn: Vec<(String, usize)> = Vec::new();
        for l in &self.layers {
            bump(&mut att, l.attention.name());
            bump(&mut ffn, l.ffn.name());
        }
        let join = |v: &[(String, usize)]| {
            v.iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(" + ")
        };
        format!("attention: {}; ffn: {}", join(&att), join(&ffn))
    }
}

fn bump(v: &mut Vec<(String, usize)>, k: String) {
    match v.iter_mut().find(|(n, _)| *n == k) {
        Some((_, c)) => *c += 1,
        None => v.push((k, 1)),
    }
}

/// Reads and parses a configuration: `path` is a `config.json`-style file, or a directory holding
/// `config.json`.
pub fn load_config(path: &Path) -> Result<ModelConfig, ModelError> {
    let (text, name) = read_config_file(path)?;
    parse_config(&text, &name)
}

/// The text of a `config.json`-style file (or of `config.json` in a directory), and its name for
/// errors.
pub(crate) fn read_config_file(path: &Path) -> Result<(String, String), ModelError> {
    let file = if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    };
    let name = file.display().to_string();
    let text = std::fs::read_to_string(&file).map_err(|e| ModelError::Io {
        file: name.clone(),
        message: e.to_string(),
    })?;
    Ok((text, name))
}

/// The JSON value of a configuration's text; a syntax error names `file`, line and column.
pub(crate) fn parse_json(text: &str, file: &str) -> Result<Value, ModelError> {
    serde_json::from_str(text).map_err(|e| ModelError::Json {
        file: file.to_string(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })
}

/// Parses the text of a configuration; `file` names it in errors and warnings.
pub fn parse_config(text: &str, file: &str) -> Result<ModelConfig, ModelError> {
    let value = parse_json(text, file)?;
    let map = match &value {
        Value::Object(m) => m,
        other => {
            return Err(ModelError::WrongType {
                file: file.to_string(),
                field: "(top level)".into(),
                expected: "a JSON object",
                found: describe(other),
            })
        }
    };
    let model_type = match map.get("model_type") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(ModelError::WrongType {
                file: file.to_string(),
                field: "model_type".into(),
                expected: "a string",
                found: describe(other),
            })
        }
        None => {
            return Err(ModelError::MissingField {
                file: file.to_string(),
                field: "model_type".into(),
                needed_by: "every config.json (it selects the architecture)".into(),
            })
        }
    };
    let obj = Obj::root(file, &model_type, map);
    obj.seen("model_type");
    let mut cfg = crate::arch::parse(&obj, &model_type)?;
    for field in obj.unknown() {
        cfg.warnings.push(ConfigWarning::UnknownField { field });
    }
    Ok(cfg)
}

/// A short description of a JSON value for error messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("a boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("a string {s:?}"),
        Value::Array(a) => format!("an array of {} elements", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// A JSON object being read: typed accessors that name the field and the file in errors, and a
/// record of the keys read so the rest can be reported as unknown.
pub(crate) struct Obj<'a> {
    pub(crate) file: &'a str,
    /// Why fields of this object are required (the model type, by default).
    pub(crate) needed_by: String,
    prefix: String,
    map: &'a Map<String, Value>,
    seen: RefCell<BTreeSet<String>>,
    children: RefCell<Vec<Vec<String>>>,
}

impl<'a> Obj<'a> {
    pub(crate) fn root(file: &'a str, model_type: &str, map: &'a Map<String, Value>) -> Obj<'a> {
        Obj {
            file,
            needed_by: format!("model_type {model_type}"),
            prefix: String::new(),
            map,
            seen: RefCell::new(BTreeSet::new()),
            children: RefCell::new(Vec::new()),
        }
    }

    /// The full name of `key` (`rope_scaling.factor`).
    pub(crate) fn path(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// Marks `key` as known without reading it.
    pub(crate) fn seen(&self, key: &str) {
        self.seen.borrow_mut().insert(key.to_string());
    }

    /// Marks every key in `keys` as known (fields the reference accepts that do not change the
    /// forward pass).
    pub(crate) fn ignore(&self, keys: &[&str]) {
        for k in keys {
            self.seen(k);
        }
    }

    /// Whether `key` is present at all (even as `null`); marks it known.
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.seen(key);
        self.map.contains_key(key)
    }

    /// Whether `key` is present and not `null`, without marking it known (to recognise a schema
    /// before parsing it).
    pub(crate) fn peek(&self, key: &str) -> bool {
        !matches!(self.map.get(key), None | Some(Value::Null))
    }

    /// The whole JSON object, without marking anything known.
    pub(crate) fn map(&self) -> &'a Map<String, Value> {
        self.map
    }

    /// The raw value of `key`, without marking it known.
    pub(crate) fn peek_value(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    /// The string value of `key`, if it is one, without marking it known.
    pub(crate) fn peek_str(&self, key: &str) -> Option<&'a str> {
        self.map.get(key).and_then(Value::as_str)
    }

    /// Whether `key` is a list holding the string `item`, without marking it known.
    pub(crate) fn peek_list_has(&self, key: &str, item: &str) -> bool {
        self.map
            .get(key)
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|v| v.as_str() == Some(item)))
    }

    /// The value of `key`, `None` when absent or `null`; marks it known.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.seen(key);
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub(crate) fn missing(&self, key: &str) -> ModelError {
        ModelError::MissingField {
            file: self.file.to_string(),
            field: self.path(key),
            needed_by: self.needed_by.clone(),
        }
    }

    pub(crate) fn missing_for(&self, key: &str, needed_by: &str) -> ModelError {
        ModelError::MissingField {
            file: self.file.to_string(),
            field: self.path(key),
            needed_by: needed_by.to_string(),
        }
    }

    pub(crate) fn invalid(&self, key: &str, message: impl Into<String>) -> ModelError {
        ModelError::InvalidValue {
            file: self.file.to_string(),
            field: self.path(key),
            message: message.into(),
        }
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &Value) -> ModelError {
        ModelError::WrongType {
            file: self.file.to_string(),
            field: self.path(key),
            expected,
            found: describe(v),
        }
    }

    fn as_usize(&self, key: &str, v: &Value) -> Result<usize, ModelError> {
        let u = if let Some(u) = v.as_u64() {
            u
        } else {
            // Some files write integers as floats (`4096.0`); accept exact ones.
            match v.as_f64() {
                Some(f) if f >= 0.0 && f.fract() == 0.0 && f < 1e15 => f as u64,
                _ => return Err(self.wrong(key, "a non-negative integer", v)),
            }
        };
        let limit = if POSITION_FIELDS.contains(&key) {
            MAX_POSITIONS
        } else {
            MAX_SIZE
        };
        if u > limit {
            return Err(self.invalid(
                key,
                format!(
                    "{u} is above {limit}, beyond any released model; refused so that a typo \
                     cannot make day0 build tensors that do not fit any machine"
                ),
            ));
        }
        usize::try_from(u).map_err(|_| self.invalid(key, "value too large"))
    }

    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>, ModelError> {
        self.get(key).map(|v| self.as_usize(key, v)).transpose()
    }

    pub(crate) fn req_usize(&self, key: &str) -> Result<usize, ModelError> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    /// A required, non-zero integer (a count or a dimension).
    pub(crate) fn req_dim(&self, key: &str) -> Result<usize, ModelError> {
        let v = self.req_usize(key)?;
        if v == 0 {
            return Err(self.invalid(key, "must be at least 1"));
        }
        Ok(v)
    }

    /// An optional integer with the reference default, recorded in `warnings` when used.
    pub(crate) fn usize_or(
        &self,
        key: &str,
        default: usize,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<usize, ModelError> {
        match self.opt_usize(key)? {
            Some(v) => Ok(v),
            None => {
                warnings.push(ConfigWarning::Defaulted {
                    field: self.path(key),
                    value: default.to_string(),
                });
                Ok(default)
            }
        }
    }

    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a number", v)),
        }
    }

    pub(crate) fn f64_or(
        &self,
        key: &str,
        default: f64,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<f64, ModelError> {
        match self.opt_f64(key)? {
            Some(v) => Ok(v),
            None => {
                warnings.push(ConfigWarning::Defaulted {
                    field: self.path(key),
                    value: default.to_string(),
                });
                Ok(default)
            }
        }
    }

    pub(crate) fn opt_bool(&self, key: &str) -> Result<Option<bool>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a boolean", v)),
        }
    }

    pub(crate) fn bool_or(
        &self,
        key: &str,
        default: bool,
        warnings: &mut Vec<ConfigWarning>,
    ) -> Result<bool, ModelError> {
        match self.opt_bool(key)? {
            Some(v) => Ok(v),
            None => {
                warnings.push(ConfigWarning::Defaulted {
                    field: self.path(key),
                    value: default.to_string(),
                });
                Ok(default)
            }
        }
    }

    pub(crate) fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a string", v)),
        }
    }

    pub(crate) fn req_str(&self, key: &str) -> Result<&'a str, ModelError> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    pub(crate) fn opt_str_list(&self, key: &str) -> Result<Option<Vec<String>>, ModelError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v
            .as_array()
            .ok_or_else(|| self.wrong(key, "an array of strings", v))?;
        arr.iter()
            .map(|e| {
                e.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| self.wrong(key, "an array of strings", e))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    pub(crate) fn opt_usize_list(&self, key: &str) -> Result<Option<Vec<usize>>, ModelError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v
            .as_array()
            .ok_or_else(|| self.wrong(key, "an array of integers", v))?;
        arr.iter()
            .map(|e| self.as_usize(key, e))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The array of objects under `key`, each read as an [`Obj`] (`key[i].`); unknown fields of
    /// the elements are reported with the parent's.
    pub(crate) fn opt_obj_list(&self, key: &str) -> Result<Option<Vec<Obj<'a>>>, ModelError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v
            .as_array()
            .ok_or_else(|| self.wrong(key, "an array of objects", v))?;
        arr.iter()
            .enumerate()
            .map(|(i, e)| match e {
                Value::Object(m) => Ok(self.child(&format!("{key}[{i}]"), m)),
                other => Err(self.wrong(key, "an array of objects", other)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// The object under `key`, `None` when absent or `null`.
    pub(crate) fn opt_obj(&self, key: &str) -> Result<Option<Obj<'a>>, ModelError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(self.child(key, m))),
            Some(other) => Err(self.wrong(key, "an object", other)),
        }
    }

    fn child(&self, key: &str, m: &'a Map<String, Value>) -> Obj<'a> {
        Obj {
            file: self.file,
            needed_by: self.needed_by.clone(),
            prefix: format!("{}{}.", self.prefix, key),
            map: m,
            seen: RefCell::new(BTreeSet::new()),
            children: RefCell::new(Vec::new()),
        }
    }

    /// The object-valued entries of this object, by key (`config_groups`' named groups), each
    /// marked known; a value that is not an object is an error naming it.
    pub(crate) fn object_entries(&self) -> Result<Vec<(String, Obj<'a>)>, ModelError> {
        self.map
            .iter()
            .map(|(k, v)| match v {
                Value::Object(m) => {
                    self.seen(k);
                    Ok((k.clone(), self.child(k, m)))
                }
                other => Err(self.wrong(k, "an object", other)),
            })
            .collect()
    }

    /// Marks every key of this object as known (a block read only in part on purpose).
    pub(crate) fn ignore_rest(&self) {
        let mut seen = self.seen.borrow_mut();
        for k in self.map.keys() {
            seen.insert(k.clone());
        }
    }

    /// Reports a child's unknown keys with this object's (call when done with the child).
    pub(crate) fn adopt(&self, child: &Obj<'a>) {
        let mut u = child.unknown();
        u.sort();
        self.children.borrow_mut().push(u);
    }

    /// Keys never read or marked, with their full names, plus those of adopted children.
    pub(crate) fn unknown(&self) -> Vec<String> {
        let seen = self.seen.borrow();
        let mut out: Vec<String> = self
            .map
            .keys()
            .filter(|k| !seen.contains(*k))
            .map(|k| self.path(k))
            .collect();
        for c in self.children.borrow().iter() {
            out.extend(c.iter().cloned());
        }
        out
    }
}

/// The largest size or count a config may give (2^20): released models stay far below it (hidden
/// sizes reach ~25k, vocabularies ~262k, experts 512), and every kernel index must stay within
/// the ±2^24 an index tensor holds.
const MAX_SIZE: u64 = 1 << 20;

/// The largest context a config may give (2^31 tokens).
const MAX_POSITIONS: u64 = 1 << 31;

/// Fields that count positions, not sizes: they may exceed [`MAX_SIZE`] (up to [`MAX_POSITIONS`]).
const POSITION_FIELDS: [&str; 2] = [
    "max_position_embeddings",
    "original_max_position_embeddings",
];
