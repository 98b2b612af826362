//! # Architecture parsers: one per known `model_type`, into a [`ModelConfig`]
//!
//! A `model_type` day0 does not know is read by the parser of the family its fields match
//! ([`infer_family`]).
//!
//! Field names and defaults follow transformers' configuration classes
//! (`models/deepseek_v3/configuration_deepseek_v3.py`, `models/deepseek_v32/configuration_deepseek_v32.py`,
//! `models/qwen3_next/configuration_qwen3_next.py`, `models/kimi_linear/configuration_kimi_linear.py`)
//! and the layer structure their modeling files build:
//!
//! - **DeepSeek-V3 / Kimi-K2 / DeepSeek-V3.2**: every layer is MLA (V3.2: MLA + the DSA
//!   indexer); layer `i` has a dense MLP when `i < first_k_dense_replace`, MoE otherwise
//!   (transformers ignores `moe_layer_freq`; so does day0, with a warning when it is not 1). V3.2
//!   files may carry explicit `layer_types` / `mlp_layer_types`, which win.
//! - **DeepSeek-V2** (`deepseek_v2`: V2, V2.5, V2-Lite, Coder-V2): the same layers
//!   (`first_k_dense_replace` default 0) with transformers' `DeepseekV2TopkRouter`: softmax,
//!   `greedy` or `group_limited_greedy` (groups ranked by their best probability), times
//!   `routed_scaling_factor`, never renormalised; no correction bias; RoPE on interleaved pairs.
//! - **Qwen3-Next**: `layer_types` when given, else layer `i` is full (gated GQA) attention when
//!   `(i + 1) % full_attention_interval == 0` and Gated DeltaNet otherwise; MoE when `i` is not in
//!   `mlp_only_layers`, `num_experts > 0` and `(i + 1) % decoder_sparse_step == 0`.
//! - **Qwen3 / Qwen3-MoE** (`qwen3`, `qwen3_moe`): GQA with per-head q/k RMSNorm (plain weight) in
//!   every layer; MoE per Qwen's layout (as Qwen3-Next) with softmax top-k routing, renormalised
//!   when `norm_topk_prob` (default false, as `Qwen3MoeConfig`), no shared expert; `head_dim`
//!   defaults to 128 (`qwen3`) or `hidden_size / heads` (`qwen3_moe`). A sliding window
//!   (`use_sliding_window`: Qwen3-MoE every layer, Qwen3 the layers from `max_window_layers`, or
//!   `layer_types`) makes those layers windowed GQA (`AttentionKind::SlidingGqa`): the prefill and
//!   decode kernels read only each query's last `sliding_window` keys, and the memory plan keeps
//!   that many tokens of their cache.
//! - **Llama / Mistral / Mixtral** (`llama`, `mistral`, `mixtral`): GQA without q/k norms,
//!   `head_dim` defaulting to `hidden_size / heads`, RoPE with `llama3` scaling where given; a dense
//!   SwiGLU MLP (`llama`, `mistral`) or MoE in every layer (`mixtral`: `num_local_experts`, softmax
//!   top-k always renormalised). A non-null `sliding_window` (Mistral, Mixtral) makes every layer
//!   windowed.
//! - **Qwen2** (`qwen2`): as Llama, with q/k/v projection biases; windows as Qwen3. **Qwen2-MoE**
//!   (`qwen2_moe`): biases per `qkv_bias`, Qwen's MoE layout with softmax top-k and a
//!   sigmoid-gated shared expert (as Qwen3-Next's).
//! - **GLM-4.5** (`glm4_moe`): GQA with q/k/v biases (`attention_bias`), optional q/k norms
//!   (`use_qk_norm`), half-split RoPE on the first `partial_rotary_factor` (0.5) of each head;
//!   dense MLP for `i < first_k_dense_replace`, then DeepSeek-V3's MoE and shared experts.
//! - **gpt-oss** (`gpt_oss`): runs cost-only from its config.json: GQA with biases on all
//!   four projections and per-head attention sinks, alternating windowed / full layers, MoE with
//!   biased router and experts, a clamped SwiGLU and MXFP4 experts (see `gpt_oss` below); every
//!   operator has a kernel, but its checkpoints' experts (interleaved gate/up columns, stored
//!   input-major) are not read yet, so numeric runs refuse it.
//! - **Kimi Linear**: `linear_attn_config.kda_layers` / `full_attn_layers` (1-based) when given,
//!   else `layer_types`, else transformers' default; dense MLP for `i < first_k_dense_replace`
//!   (default 1) unless `mlp_layer_types` says otherwise. Its MLA uses no RoPE unless `mla_use_nope` is false (absent: none, as transformers).
//! - **Llama 4** (`llama4`, `llama4_text`): see `llama4` below: chunked RoPE layers, NoPE layers
//!   with the attention temperature, input-scaled top-k sigmoid MoE with a shared expert.
//! - **Ling / Ring** (`bailing_moe`): see `bailing_moe` below (semantics as vLLM reads them).
//!
//! ## day0's hybrid schema (`"model_type": "day0_hybrid"`)
//!
//! For a model that mixes the families above, layer by layer. Sections are required only when a
//! layer uses them; every field listed without a default is required.
//!
//! ```json
//! {
//!   "model_type": "day0_hybrid",
//!   "hidden_size": 4096, "vocab_size": 129280,
//!   "num_hidden_layers": 8,            // optional; must match the expanded `layers`
//!   "rms_norm_eps": 1e-6,              // default 1e-6
//!   "tie_word_embeddings": false,      // default false
//!   "rope_theta": 10000,               // + optional "rope_scaling" or "rope_parameters" (MLA layers)
//!   "mla": { "num_heads": 32, "q_lora_rank": 1536, "kv_lora_rank": 512,   // q_lora_rank may be null
//!            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
//!            "rope_interleave": true },                                   // default true
//!   "indexer": { "n_heads": 64, "head_dim": 128, "topk": 2048 },          // for "dsa" layers
//!   "linear_attention": { "num_key_heads": 16, "num_value_heads": 32,
//!                         "key_head_dim": 128, "value_head_dim": 128,
//!                         "conv_kernel": 4,                               // default 4
//!                         "decay": "scalar" },                            // "scalar" (GDN) | "per_channel" (KDA)
//!   "dense_mlp": { "intermediate_size": 11264 },                          // for "dense" ffn layers
//!   "moe": { "num_experts": 128, "experts_per_token": 8, "intermediate_size": 1536,
//!            "shared_experts": 1,                    // default 0
//!            "shared_intermediate_size": 1536,       // default intermediate_size · shared_experts
//!            "router": "sigmoid_group_topk",         // or "softmax_topk"
//!            "n_group": 1, "topk_group": 1,          // defaults 1, 1
//!            "norm_topk_prob": true,                 // default true
//!            "routed_scaling_factor": 1.0,           // default 1.0
//!            "expert_format": "mxfp4" },             // "mxfp4" | "bf16" | "fp8"; default "bf16"
//!   "layers": [ { "attention": "mla", "ffn": "dense" },
//!               { "attention": "dsa", "ffn": "moe", "repeat": 3 },   // "repeat" (default 1) expands
//!               { "attention": "linear", "ffn": "moe", "repeat": 4 } ]
//! }
//! ```
//!
//! Attention kinds: `mla` (alias `dense`: MLA over all past tokens), `dsa` (alias `sparse_mla`:
//! MLA over the indexer's top-k), `linear` (gated delta rule with `linear_attention.decay`;
//! `gdn` and `kda` force the decay). FFN kinds: `dense`, `moe`. Any other kind is kept by name: the
//! configuration still parses, and the coverage inventory reports the layer as missing.

use serde_json::Value;

use crate::config::{
    AttentionKind, AttnTemperature, ConfigWarning, Decay, DenseMlpDims, ExpertActivation, Family,
    FfnKind, GqaDims, IndexerDims, LayerSpec, LinearAttnDims, MlaDims, ModelConfig, ModelError,
    MoeDims, Obj, RopeConfig, RopeScaling, RouterKind, WeightFormat, SUPPORTED_MODEL_TYPES,
};

/// Fields every Hugging Face config may carry that do not change the forward pass.
const HF_IGNORED: &[&str] = &[
    "architectures",
    "_attn_implementation_autoset",
    "auto_map",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "initializer_range",
    "use_cache",
    "attention_dropout",
    "pretraining_tp",
    "output_router_logits",
    "router_aux_loss_coef",
    "aux_loss_alpha",
    "seq_aux",
    "ep_size",
    "_name_or_path",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "is_decoder",
];

/// Dispatches on `model_type`. A `model_type` day0 does not know is read with the schema of the
/// known family its fields match ([`infer_family`]; for a multimodal file, the fields of its
/// `text_config`), with a warning that says so; a file that matches none is refused.
pub(crate) fn parse(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    if let Some(known) = parse_known(o, model_type) {
        return known;
    }
    let unsupported = || ModelError::UnsupportedModelType {
        file: o.file.to_string(),
        model_type: model_type.to_string(),
    };
    // A multimodal release nests its language model under `text_config`: that is what runs (its
    // other parts are reported as unknown fields).
    let text = match infer_family(o) {
        Some(_) => None,
        None => o.opt_obj("text_config")?,
    };
    let scope = text.as_ref().unwrap_or(o);
    // The language model's own `model_type`, when day0 knows it (Mistral-3's `mistral`) or it is
    // named after one it knows (Qwen3-VL's `qwen3_vl_text` is a Qwen3, whose q/k norm no field
    // announces), else the family its fields match.
    let inner_type = text.as_ref().and_then(|t| t.peek_str("model_type"));
    let inner_known = inner_type.and_then(language_model_type);
    let (parsed_as, because) = match (inner_known, inner_type) {
        (Some(m), Some(named)) if m != named => (
            m,
            format!("its language model (`text_config`) is `{named}`, named after `{m}`"),
        ),
        (Some(m), _) => (m, format!("its language model (`text_config`) is `{m}`")),
        (None, _) => {
            let (p, b) = infer_family(scope).ok_or_else(unsupported)?;
            match text {
                Some(_) => (p, format!("{b} in its language model (`text_config`)")),
                None => (p, b),
            }
        }
    };
    // A field the guessed schema needs names the guess, so the user sees why it is needed.
    let with_guess = |e: ModelError| match e {
        ModelError::MissingField {
            file,
            field,
            needed_by,
        } => ModelError::MissingField {
            file,
            field,
            needed_by: format!("{needed_by}, read as `{parsed_as}` because {because}"),
        },
        other => other,
    };
    let refuse = |fields: Vec<String>| ModelError::UnexplainedFields {
        file: o.file.to_string(),
        model_type: model_type.to_string(),
        parsed_as: format!("`{parsed_as}` ({because})"),
        fields,
    };
    // A language model of a type day0 knows by name is read as that type (its unread fields are
    // warnings, as at the top level); any guess is checked for fields that reshape the network.
    let guessed = inner_known.is_none() || inner_known != inner_type;
    let parsed = parse_known(scope, parsed_as).expect("an inferred family is a known model_type");
    let mut cfg = match parsed {
        // A field the guess needs but the file lacks often means the guess is wrong: fields that
        // reshape the network, left unread too, are the better error (Gemma-3's
        // `query_pre_attn_scalar` before its absent `vocab_size`).
        Err(e @ ModelError::MissingField { .. }) if guessed => {
            let unexplained = unexplained_once_complete(scope, parsed_as, &e);
            return Err(match unexplained.is_empty() {
                true => with_guess(e),
                false => refuse(unexplained),
            });
        }
        other => other.map_err(with_guess)?,
    };
    if guessed {
        let unexplained = unexplained_fields(scope);
        if !unexplained.is_empty() {
            return Err(refuse(unexplained));
        }
    }
    if let Some(t) = &text {
        t.ignore(&["model_type"]);
        outer_quantization(o, t, &mut cfg)?;
        o.ignore(HF_IGNORED);
        // The top level's tie governs the wrapper's head (as transformers' multimodal models).
        if let Some(tie) = o.opt_bool("tie_word_embeddings")? {
            cfg.tie_word_embeddings = tie;
            let inner_default = |w: &ConfigWarning| match w {
                ConfigWarning::Defaulted { field, .. } => field.ends_with("tie_word_embeddings"),
                _ => false,
            };
            cfg.warnings.retain(|w| !inner_default(w));
        }
        o.adopt(t);
    }
    cfg.model_type = model_type.to_string();
    cfg.warnings.insert(
        0,
        ConfigWarning::InferredFamily {
            model_type: model_type.to_string(),
            parsed_as: parsed_as.to_string(),
            because,
        },
    );
    Ok(cfg)
}

/// The known language-model `model_type` a multimodal file's `text_config` names: itself, or the
/// longest known type it extends by `_…` (`qwen3_vl_text` → `qwen3`, `qwen2_5_vl_text` →
/// `qwen2`). `qwen3_vl_moe` and `day0_hybrid` name whole files, not language models.
fn language_model_type(inner: &str) -> Option<&'static str> {
    let usable = || {
        SUPPORTED_MODEL_TYPES
            .iter()
            .copied()
            .filter(|k| !["qwen3_vl_moe", "day0_hybrid"].contains(k))
    };
    usable().find(|k| *k == inner).or_else(|| {
        usable()
            .filter(|k| {
                inner
                    .strip_prefix(k)
                    .is_some_and(|rest| rest.starts_with('_'))
            })
            .max_by_key(|k| k.len())
    })
}

/// The known `model_type` whose schema an unknown one's fields follow, and which fields say so;
/// `None` when nothing identifies the architecture. New releases often reuse an architecture
/// under a new name (GLM-5's `glm_moe_dsa` is DeepSeek-V3.2's MLA + DSA with other sizes): a
/// latent KV rank means MLA (with a DSA indexer when `index_topk` is set, KDA linear attention
/// with `linear_attn_config`), `linear_attention` layers mean Qwen3-Next's hybrid,
/// `n_routed_experts` without MLA DeepSeek-V3's MoE under GQA (GLM-4.5), `experts_per_token`
/// gpt-oss's MoE, an expert count with `moe_intermediate_size` Qwen's MoE layout,
/// `num_local_experts` with `use_routing_bias`, `qk_norm_type` or `attn_type_list` MiniMax-M2's,
/// `moe_num_experts` ERNIE-4.5's,
/// `num_local_experts` alone Mixtral's; a dense decoder with Qwen's window fields is Qwen3 (with
/// `head_dim`) or Qwen2, with `sliding_window` Mistral, else Llama. Expert counts no rule explains
/// are refused rather than read as a dense model.
pub(crate) fn infer_family(o: &Obj) -> Option<(&'static str, String)> {
    let has = |k: &str| o.peek(k);
    let because = |fields: &[&str]| {
        let names: Vec<String> = fields.iter().map(|f| format!("`{f}`")).collect();
        format!("it sets {}", names.join(" and "))
    };
    if has("kv_lora_rank") {
        if has("linear_attn_config") {
            return Some((
                "kimi_linear",
                because(&["kv_lora_rank", "linear_attn_config"]),
            ));
        }
        if has("index_topk") {
            return Some(("deepseek_v32", because(&["kv_lora_rank", "index_topk"])));
        }
        // DeepSeek-V2's router: softmax, greedy or group-limited; V3's: sigmoid, no-aux.
        let v2_router = matches!(
            o.peek_str("topk_method"),
            Some("greedy" | "group_limited_greedy")
        ) || o.peek_str("scoring_func") == Some("softmax");
        let router = match o.peek_str("scoring_func") {
            Some("softmax") => "scoring_func",
            _ => "topk_method",
        };
        return Some(match v2_router {
            true => ("deepseek_v2", because(&["kv_lora_rank", router])),
            false => ("deepseek_v3", because(&["kv_lora_rank"])),
        });
    }
    if o.peek_list_has("layer_types", "linear_attention") || has("linear_num_value_heads") {
        return Some((
            "qwen3_next",
            "its layers include `linear_attention` (Gated DeltaNet)".into(),
        ));
    }
    if !has("num_attention_heads") || !has("hidden_size") || !has("num_hidden_layers") {
        return None;
    }
    // ERNIE-4.5's experts under their own names.
    if has("moe_num_experts") {
        return Some(("ernie4_5_moe", because(&["moe_num_experts"])));
    }
    // MoE: DeepSeek's fields under GQA, gpt-oss's, Qwen's per-expert width, Mixtral's experts of
    // `intermediate_size`. An expert count no schema explains is refused, not read as dense.
    if has("n_routed_experts") {
        return Some((
            "glm4_moe",
            because(&["n_routed_experts", "num_attention_heads"]),
        ));
    }
    let experts = ["num_experts", "num_local_experts"]
        .into_iter()
        .find(|k| has(k));
    if let Some(count) = experts {
        if has("experts_per_token") || has("swiglu_limit") {
            return Some(("gpt_oss", because(&[count, "experts_per_token"])));
        }
        if has("moe_intermediate_size") {
            return Some(match has("shared_expert_intermediate_size") {
                true => (
                    "qwen2_moe",
                    because(&[count, "shared_expert_intermediate_size"]),
                ),
                false => ("qwen3_moe", because(&[count, "moe_intermediate_size"])),
            });
        }
        if count == "num_local_experts" {
            // MiniMax-M2's routing bias, across-heads q/k norm or layer-kind list.
            if let Some(k) = ["use_routing_bias", "qk_norm_type", "attn_type_list"]
                .into_iter()
                .find(|k| has(k))
            {
                return Some(("minimax_m2", because(&[count, k])));
            }
            return Some(("mixtral", because(&["num_local_experts"])));
        }
        return None;
    }
    if !has("intermediate_size") {
        return None;
    }
    // Dense: Qwen's window fields (Qwen3 writes `head_dim`), Mistral's window, else Llama.
    if let Some(window) = ["max_window_layers", "use_sliding_window"]
        .into_iter()
        .find(|k| has(k))
    {
        return Some(match has("head_dim") {
            true => ("qwen3", because(&[window, "head_dim"])),
            false => ("qwen2", because(&[window])),
        });
    }
    if has("sliding_window") {
        return Some(("mistral", because(&["sliding_window"])));
    }
    Some((
        "llama",
        "it is a dense decoder (no experts, no latent attention, no linear attention)".into(),
    ))
}

/// Words in a field's name that say it shapes the network: experts and their layout, layer
/// patterns and windows, routing, RoPE, attention variants, extra norms and caps. A family's
/// schema reads those it knows; any other left unread in an inferred family means the file is
/// another architecture (Hunyuan's `moe_topk`, Llama-4's `interleave_moe_layer_step`
/// and `intermediate_size_mlp`, Gemma-3's `query_pre_attn_scalar`).
const ARCHITECTURE_WORDS: &[&str] = &[
    "expert",
    "moe",
    "interleave",
    "intermediate_size",
    "rope_layers",
    "chunk",
    "window",
    "layer_types",
    "pattern",
    "pre_attn",
    "scoring",
    "routing",
    "router",
    "rotary",
    "qk_norm",
    "qk_layernorm",
    "softcap",
    "per_layer",
    "cross_attention",
    "linear_attn",
    "mamba",
    "ssm",
    "lora",
    "dense",
    "topk",
    "top_k",
    "attn_type",
    "local_base",
];

/// Words that mark training-only or bookkeeping fields, never the network (`router_aux_loss_coef`,
/// `moe_dropout`, `moe_router_dtype`).
const BOOKKEEPING_WORDS: &[&str] = &[
    "loss", "dropout", "init", "token_id", "jitter", "capacity", "dtype",
];

/// The fields of `scope` that its inferred family's schema left unread, whose names say they shape
/// the network ([`ARCHITECTURE_WORDS`]) and whose values do something: a 0, `false`, `null` or
/// empty setting changes nothing (MiniMax-M2's `shared_intermediate_size: 0`).
fn unexplained_fields(scope: &Obj) -> Vec<String> {
    let prefix = scope.path("");
    scope
        .unknown()
        .into_iter()
        .filter(|path| {
            let leaf = path.strip_prefix(&prefix).unwrap_or(path);
            let name = leaf.rsplit('.').next().unwrap_or(leaf).to_ascii_lowercase();
            // Window sizes do nothing while `use_sliding_window` is false (Qwen's files keep
            // `max_window_layers` either way).
            let windows_off = scope.peek_value("use_sliding_window") == Some(&Value::Bool(false));
            if windows_off && name.contains("window") {
                return false;
            }
            // (A nested field's value is not looked up: it counts.)
            let inert = match scope.peek_value(leaf) {
                Some(Value::Null | Value::Bool(false)) => true,
                Some(Value::Number(n)) => n.as_f64() == Some(0.0),
                Some(Value::Array(a)) => a.is_empty(),
                Some(Value::Object(m)) => m.is_empty(),
                Some(Value::String(t)) => t.is_empty(),
                Some(Value::Bool(true)) | None => false,
            };
            !inert
                && ARCHITECTURE_WORDS.iter().any(|w| name.contains(w))
                && !BOOKKEEPING_WORDS.iter().any(|w| name.contains(w))
        })
        .collect()
}

/// [`unexplained_fields`] of `scope` as `parsed_as` would leave them had the file given the
/// fields it lacks (`missing`, then each next one, filled with a placeholder size): a parse that
/// stopped early leaves unread fields its schema does read. Empty when the placeholders do not
/// get the parse through.
fn unexplained_once_complete(scope: &Obj, parsed_as: &str, missing: &ModelError) -> Vec<String> {
    let prefix = scope.path("");
    let mut map = scope.map().clone();
    let mut filled = Vec::new();
    let mut missing = missing.clone();
    // A handful of absent fields at most: more means the guess itself is wrong.
    for _ in 0..8 {
        let ModelError::MissingField { field, .. } = &missing else {
            return Vec::new();
        };
        let leaf = field.strip_prefix(&prefix).unwrap_or(field).to_string();
        if leaf.contains('.') || filled.contains(&leaf) {
            return Vec::new();
        }
        map.insert(leaf.clone(), Value::from(1));
        filled.push(leaf);
        let patched = Obj::root(scope.file, parsed_as, &map);
        match parse_known(&patched, parsed_as) {
            Some(Ok(_)) => {
                return unexplained_fields(&patched)
                    .into_iter()
                    .map(|f| format!("{prefix}{f}"))
                    .collect()
            }
            Some(Err(e @ ModelError::MissingField { .. })) => missing = e,
            _ => return Vec::new(),
        }
    }
    Vec::new()
}

/// The parser of a known `model_type`, or `None` for one day0 does not know.
fn parse_known(o: &Obj, model_type: &str) -> Option<Result<ModelConfig, ModelError>> {
    Some(match model_type {
        "deepseek_v2" => deepseek(o, model_type, Family::DeepseekV2),
        "deepseek_v3" => deepseek(o, model_type, Family::DeepseekV3),
        "kimi_k2" => deepseek(o, model_type, Family::KimiK2),
        "deepseek_v32" => deepseek(o, model_type, Family::DeepseekV32),
        "qwen3_next" => qwen3_next(o, model_type),
        "qwen3_vl_moe" => qwen3_vl_moe(o, model_type),
        "kimi_linear" => kimi_linear(o, model_type),
        "qwen3_moe" | "qwen3" => qwen3(o, model_type),
        "qwen2" | "qwen2_moe" => qwen2(o, model_type),
        "glm4_moe" => glm4_moe(o, model_type),
        "gpt_oss" => gpt_oss(o, model_type),
        "minimax_m2" => minimax_m2(o, model_type),
        "ernie4_5_moe" => ernie45_moe(o, model_type),
        "llama4" | "llama4_text" => llama4(o, model_type),
        "bailing_moe" => bailing_moe(o, model_type),
        "llama" | "mistral" | "mixtral" => llama(o, model_type),
        "day0_hybrid" => hybrid(o, model_type),
        _ => return None,
    })
}

/// Fields shared by the Hugging Face families: activation, biases, MTP layers.
fn common_hf(o: &Obj, w: &mut Vec<ConfigWarning>) -> Result<(), ModelError> {
    common_hf_with(o, w, false)
}

/// [`common_hf`], where `qkv_bias` says the family's `attention_bias` puts biases on the q/k/v
/// projections only, which day0 models (Qwen2, GLM-4.5); elsewhere a true `attention_bias` is
/// reported as ignored.
fn common_hf_with(o: &Obj, w: &mut Vec<ConfigWarning>, qkv_bias: bool) -> Result<(), ModelError> {
    o.ignore(HF_IGNORED);
    if let Some(act) = o.opt_str("hidden_act")? {
        if act != "silu" {
            w.push(ConfigWarning::Ignored {
                field: o.path("hidden_act"),
                reason: format!(
                    "day0's MLP and expert kernels implement SiLU (SwiGLU), not `{act}`"
                ),
            });
        }
    }
    if o.opt_bool("attention_bias")? == Some(true) && !qkv_bias {
        w.push(ConfigWarning::Ignored {
            field: o.path("attention_bias"),
            reason: "projection biases are not modelled in the operator graph".into(),
        });
    }
    if let Some(n) = o.opt_usize("num_nextn_predict_layers")? {
        if n > 0 {
            w.push(ConfigWarning::Ignored {
                field: o.path("num_nextn_predict_layers"),
                reason: format!(
                    "{n} multi-token-prediction layer(s) are not part of the main model graph"
                ),
            });
        }
    }
    Ok(())
}

/// `quantization_config` → the format of the checkpoint's linear layers other than the routed
/// experts (attention, dense MLPs, shared experts).
fn weight_format(o: &Obj) -> Result<WeightFormat, ModelError> {
    Ok(weight_formats(o)?.0)
}

/// `quantization_config` → the format of the routed experts' weights.
fn expert_weight_format(o: &Obj) -> Result<WeightFormat, ModelError> {
    Ok(weight_formats(o)?.1)
}

/// The router of a family that names its scoring function and whether a selection bias is added:
/// sigmoid with the bias is DeepSeek-V3's, softmax without one the plain top-k; any other pair is
/// kept by name (`<scoring>_with_<bias_name>` or `<scoring>_topk`) for the coverage inventory.
fn scored_router(scoring: &str, bias: bool, bias_name: &str) -> RouterKind {
    match (scoring, bias) {
        ("sigmoid", true) => RouterKind::SigmoidGroupTopk,
        ("softmax", false) => RouterKind::SoftmaxTopk,
        (s, true) => RouterKind::Unknown(format!("{s}_with_{bias_name}")),
        (s, false) => RouterKind::Unknown(format!("{s}_topk")),
    }
}

/// A multimodal wrapper may keep `quantization_config` at its top level, beside `text_config`
/// (Llama 4's FP8 release, VL models): the language model's formats come from there when its own
/// block has none, instead of the model being read as floats.
fn outer_quantization(o: &Obj, t: &Obj, cfg: &mut ModelConfig) -> Result<(), ModelError> {
    if t.peek("quantization_config") || !o.peek("quantization_config") {
        return Ok(());
    }
    let (dense, experts) = weight_formats(o)?;
    cfg.weight_format = dense;
    if let Some(m) = cfg.moe.as_mut() {
        m.expert_format = experts;
    }
    Ok(())
}

/// `quantization_config` → (format of the other linear layers, format of the routed experts):
/// one format for both, except where a `compressed-tensors` file keeps some modules in floats.
fn weight_formats(o: &Obj) -> Result<(WeightFormat, WeightFormat), ModelError> {
    let Some(q) = o.opt_obj("quantization_config")? else {
        return Ok((WeightFormat::Float, WeightFormat::Float));
    };
    if q.opt_str("quant_method")? == Some("compressed-tensors") {
        return compressed_tensors(&q);
    }
    let f = single_weight_format(&q)?;
    Ok((f.clone(), f))
}

/// A `compressed-tensors` quantization block (llm-compressor's format). Day0 reads the scheme
/// Kimi-K2-Thinking ships: one config group of symmetric INT4 weights with one scale per
/// `group_size` inputs, activations unquantized (W4A16), `pack-quantized`. Modules the `ignore`
/// list names stay in floats: attention projections there keep the non-expert layers in floats
/// (Kimi-K2-Thinking lists every attention, shared-expert and dense-MLP projection), routed
/// experts there keep the experts in floats. Any other scheme is kept by name, so the coverage
/// inventory reports its expert GEMM as missing.
fn compressed_tensors(q: &Obj) -> Result<(WeightFormat, WeightFormat), ModelError> {
    let format = q.opt_str("format")?.unwrap_or("unknown").to_string();
    let other = || WeightFormat::Other(format!("compressed-tensors/{format}"));
    let ignore = q.opt_str_list("ignore")?.unwrap_or_default();
    q.ignore_rest();
    let groups = match q.opt_obj("config_groups")? {
        Some(g) => g.object_entries()?,
        None => Vec::new(),
    };
    let int4 = match &groups[..] {
        [(_, g)] if format == "pack-quantized" => {
            g.ignore_rest();
            let w4a16 = match (g.opt_obj("weights")?, g.opt_obj("input_activations")?) {
                (Some(w), None) => {
                    w.ignore_rest();
                    let group = w.opt_usize("group_size")?.unwrap_or(0);
                    (w.opt_usize("num_bits")? == Some(4)
                        && w.opt_str("type")? == Some("int")
                        && w.opt_bool("symmetric")? == Some(true)
                        && w.opt_str("strategy")? == Some("group")
                        && kernels::weight::INT4_GROUPS.contains(&group))
                    .then_some(group)
                }
                _ => None,
            };
            w4a16.map(|group| WeightFormat::Int4Group { group })
        }
        _ => None,
    };
    let Some(int4) = int4 else {
        return Ok((other(), other()));
    };
    let names = |pred: &dyn Fn(&str) -> bool| ignore.iter().any(|n| pred(n));
    let routed = |n: &str| n.contains("experts") && !n.contains("shared_expert");
    let dense = if names(&|n| n.contains("attn")) {
        WeightFormat::Float
    } else {
        int4.clone()
    };
    let experts = if names(&routed) {
        WeightFormat::Float
    } else {
        int4
    };
    Ok((dense, experts))
}

/// A `quantization_config` with one format for every linear layer.
fn single_weight_format(q: &Obj) -> Result<WeightFormat, ModelError> {
    // The quantization block's details vary by tool; only the method and block size matter here.
    let method = q.opt_str("quant_method")?.unwrap_or("unknown");
    Ok(match method {
        "fp8" => {
            let block = q
                .opt_usize_list("weight_block_size")?
                .unwrap_or(vec![128, 128]);
            if block.len() != 2 || block.contains(&0) {
                return Err(q.invalid(
                    "weight_block_size",
                    format!("must be two positive integers, found {block:?}"),
                ));
            }
            WeightFormat::Fp8Block {
                block: [block[0], block[1]],
            }
        }
        "mxfp4" => WeightFormat::Mxfp4,
        other => WeightFormat::Other(other.to_string()),
    })
}

/// RoPE from `rope_scaling` or `rope_parameters` (see the module docs of [`crate::config`]).
pub(crate) fn parse_rope(
    o: &Obj,
    default_partial: f64,
    w: &mut Vec<ConfigWarning>,
) -> Result<RopeConfig, ModelError> {
    let scaling = o.opt_obj("rope_scaling")?;
    let params = o.opt_obj("rope_parameters")?;
    let top_theta = o.opt_f64("rope_theta")?;
    let top_partial = o.opt_f64("partial_rotary_factor")?;
    let (chosen, other, source) = match (scaling, params) {
        (Some(s), Some(p)) => {
            w.push(ConfigWarning::Ignored {
                field: o.path("rope_parameters"),
                reason: "`rope_scaling` is also present and takes precedence (as in transformers)"
                    .into(),
            });
            (Some(s), Some(p), Some("rope_scaling"))
        }
        (Some(s), None) => (Some(s), None, Some("rope_scaling")),
        (None, Some(p)) => (Some(p), None, Some("rope_parameters")),
        (None, None) => (None, None, None),
    };
    let mut theta = None;
    let mut partial = None;
    let mut scaling = RopeScaling::None;
    let mut mrope_section = None;
    if let Some(d) = &chosen {
        theta = d.opt_f64("rope_theta")?;
        partial = d.opt_f64("partial_rotary_factor")?;
        let kind = d
            .opt_str("rope_type")?
            .or(d.opt_str("type")?)
            .unwrap_or("default")
            .to_string();
        mrope_section = match d.opt_usize_list("mrope_section")?.as_deref() {
            None => None,
            Some(&[t, h, w]) => Some([t, h, w]),
            Some(_) => {
                return Err(d.invalid(
                    "mrope_section",
                    "must list three frequency counts (temporal, height, width)",
                ))
            }
        };
        // Qwen3-VL interleaves the sections whatever this says (its rotary never reads it).
        d.ignore(&[
            "mrope_interleaved",
            "attention_factor",
            "truncate",
            "long_factor",
            "short_factor",
        ]);
        if kind != "llama3" {
            d.ignore(&["low_freq_factor", "high_freq_factor"]);
        }
        scaling = match kind.as_str() {
            "default" => RopeScaling::None,
            "yarn" => {
                let factor = d
                    .opt_f64("factor")?
                    .ok_or_else(|| d.missing_for("factor", "YaRN RoPE scaling"))?;
                let original = d
                    .opt_usize("original_max_position_embeddings")?
                    .ok_or_else(|| {
                        d.missing_for("original_max_position_embeddings", "YaRN RoPE scaling")
                    })?;
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    beta_fast: d.f64_or("beta_fast", 32.0, w)?,
                    beta_slow: d.f64_or("beta_slow", 1.0, w)?,
                    // Absent is 0 for both, as transformers' `None`: the attention factor
                    // uses `mscale / mscale_all_dim` only when both are given and non-zero
                    // (`_compute_yarn_parameters`), else `0.1 ln(factor) + 1`.
                    mscale: d.f64_or("mscale", 0.0, w)?,
                    mscale_all_dim: d.f64_or("mscale_all_dim", 0.0, w)?,
                    // transformers' default, silently: only gpt-oss's config sets it.
                    truncate: d.opt_bool("truncate")?.unwrap_or(true),
                }
            }
            "linear" => RopeScaling::Linear {
                factor: d
                    .opt_f64("factor")?
                    .ok_or_else(|| d.missing_for("factor", "linear RoPE scaling"))?,
            },
            "llama3" => {
                let need = |key: &str| {
                    d.opt_f64(key)?
                        .ok_or_else(|| d.missing_for(key, "llama3 RoPE scaling"))
                };
                let (factor, low, high) = (
                    need("factor")?,
                    need("low_freq_factor")?,
                    need("high_freq_factor")?,
                );
                // Equal factors (Llama-4-Scout's 1 and 1) leave no band to smooth over: every
                // wavelength is either scaled or kept, and transformers only warns.
                if !(factor > 0.0 && low > 0.0 && high >= low) {
                    return Err(d.invalid(
                        "high_freq_factor",
                        format!(
                            "llama3 RoPE scaling needs factor > 0 and high_freq_factor ≥ \
                             low_freq_factor > 0, found factor {factor}, low {low}, high {high}"
                        ),
                    ));
                }
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: d
                        .opt_usize("original_max_position_embeddings")?
                        .ok_or_else(|| {
                            d.missing_for("original_max_position_embeddings", "llama3 RoPE scaling")
                        })?,
                }
            }
            "dynamic" => RopeScaling::Dynamic {
                factor: d
                    .opt_f64("factor")?
                    .ok_or_else(|| d.missing_for("factor", "dynamic RoPE scaling"))?,
            },
            t => {
                // Parameters of a scaling day0 does not implement: kept by name, not reported
                // field by field.
                d.ignore(&[
                    "factor",
                    "original_max_position_embeddings",
                    "beta_fast",
                    "beta_slow",
                    "mscale",
                    "mscale_all_dim",
                ]);
                RopeScaling::Other(t.to_string())
            }
        };
        o.adopt(d);
    }
    if theta.is_none() {
        theta = top_theta;
    }
    if let Some(p) = &other {
        if theta.is_none() {
            theta = p.opt_f64("rope_theta")?;
        }
        p.ignore_rest();
    }
    if partial.is_none() {
        partial = top_partial;
    }
    let theta = match theta {
        Some(t) => t,
        None => {
            w.push(ConfigWarning::Defaulted {
                field: o.path("rope_theta"),
                value: "10000".into(),
            });
            10000.0
        }
    };
    let partial_rotary_factor = partial.unwrap_or(default_partial);
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
        return Err(o.invalid(
            "partial_rotary_factor",
            format!("must be in (0, 1], found {partial_rotary_factor}"),
        ));
    }
    Ok(RopeConfig {
        theta,
        scaling,
        partial_rotary_factor,
        source,
        mrope_section,
    })
}

/// Validates a layer-kind list's length.
fn check_len<T>(o: &Obj, key: &str, v: &[T], layers: usize) -> Result<(), ModelError> {
    if v.len() != layers {
        return Err(o.invalid(
            key,
            format!(
                "has {} entries but num_hidden_layers is {layers}: one entry per layer",
                v.len()
            ),
        ));
    }
    Ok(())
}

fn mlp_kind(s: &str) -> FfnKind {
    match s {
        "dense" => FfnKind::Dense,
        "sparse" | "moe" => FfnKind::Moe,
        other => FfnKind::Unknown(other.to_string()),
    }
}

/// Checks the group-limited routing can be formed (transformers views the scores as
/// `[tokens, n_group, experts / n_group]` and keeps `topk_group` groups).
fn check_moe(o: &Obj, m: &MoeDims) -> Result<(), ModelError> {
    if m.experts_per_token > m.experts {
        return Err(o.invalid(
            "num_experts_per_tok",
            format!(
                "{} experts per token but only {} experts",
                m.experts_per_token, m.experts
            ),
        ));
    }
    if m.router == RouterKind::SigmoidGroupTopk {
        if m.n_group == 0 || !m.experts.is_multiple_of(m.n_group) {
            return Err(o.invalid(
                "n_group",
                format!(
                    "{} groups do not divide {} experts evenly",
                    m.n_group, m.experts
                ),
            ));
        }
        if m.topk_group == 0 || m.topk_group > m.n_group {
            return Err(o.invalid(
                "topk_group",
                format!(
                    "must be in 1..={} (n_group), found {}",
                    m.n_group, m.topk_group
                ),
            ));
        }
        if m.experts_per_token > m.topk_group * (m.experts / m.n_group) {
            return Err(o.invalid(
                "topk_group",
                format!(
                    "{} groups of {} experts cannot supply {} experts per token",
                    m.topk_group,
                    m.experts / m.n_group,
                    m.experts_per_token
                ),
            ));
        }
    }
    Ok(())
}

/// DeepSeek-V3, Kimi-K2 (same architecture), DeepSeek-V3.2, and DeepSeek-V2 (the same layers
/// with softmax routing; defaults from transformers' `DeepseekV2Config`).
fn deepseek(o: &Obj, model_type: &str, family: Family) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    // MLA caches a latent, not per-head keys: num_key_value_heads has no effect; head_dim /
    // qk_head_dim are derived by transformers.
    o.ignore(&["num_key_value_heads", "head_dim", "qk_head_dim", "mlp_bias"]);
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let vocab_size = o.req_dim("vocab_size")?;
    let heads = o.req_dim("num_attention_heads")?;
    if !o.contains("q_lora_rank") {
        return Err(o.missing("q_lora_rank"));
    }
    let q_lora_rank = o.opt_usize("q_lora_rank")?;
    if q_lora_rank == Some(0) {
        return Err(o.invalid(
            "q_lora_rank",
            "must be at least 1, or null for no query compression",
        ));
    }
    let mla = MlaDims {
        heads,
        q_lora_rank,
        kv_lora_rank: o.req_dim("kv_lora_rank")?,
        qk_nope_head_dim: o.req_dim("qk_nope_head_dim")?,
        qk_rope_head_dim: o.req_dim("qk_rope_head_dim")?,
        v_head_dim: o.req_dim("v_head_dim")?,
        use_rope: true,
        // V2 rotates interleaved pairs always (a complex product), and has no such field.
        rope_interleave: family == Family::DeepseekV2
            || o.bool_or("rope_interleave", true, &mut w)?,
    };
    let intermediate_size = o.req_dim("intermediate_size")?;
    // transformers' DeepseekV3Config / DeepseekV32Config default (V3.2 only when
    // `mlp_layer_types` is absent, which the layer loop below reads first); V2's is 0.
    let v2 = family == Family::DeepseekV2;
    let first_k = o.usize_or("first_k_dense_replace", if v2 { 0 } else { 3 }, &mut w)?;
    let experts = o.req_usize("n_routed_experts")?;
    let weight_format = weight_format(o)?;
    let moe = if experts > 0 {
        // transformers' V2 router is always softmax (the released configs say so too).
        let (scoring, method) = if v2 {
            (
                o.opt_str("scoring_func")?.unwrap_or("softmax"),
                o.opt_str("topk_method")?.unwrap_or("greedy"),
            )
        } else {
            (
                o.opt_str("scoring_func")?.unwrap_or("sigmoid"),
                o.opt_str("topk_method")?.unwrap_or("noaux_tc"),
            )
        };
        let router = match (scoring, method) {
            ("sigmoid", "noaux_tc") => RouterKind::SigmoidGroupTopk,
            ("softmax", "greedy") | ("softmax", "group_limited_greedy") => RouterKind::SoftmaxTopk,
            (s, m) => RouterKind::Unknown(format!("{s}/{m}")),
        };
        // Greedy routing ignores the groups, so they are not read (V2-Lite leaves them null).
        let grouped = method != "greedy";
        if !grouped {
            o.ignore(&["n_group", "topk_group"]);
        }
        // transformers' DeepseekV2TopkRouter never renormalises the chosen weights.
        let norm_topk_prob = if v2 {
            if o.opt_bool("norm_topk_prob")? == Some(true) {
                w.push(ConfigWarning::Ignored {
                    field: o.path("norm_topk_prob"),
                    reason: "true: transformers' DeepseekV2 router does not renormalise the top-k weights".into(),
                });
            }
            false
        } else {
            o.bool_or("norm_topk_prob", true, &mut w)?
        };
        let moe_inter = o.req_dim("moe_intermediate_size")?;
        let shared = o.usize_or("n_shared_experts", if v2 { 2 } else { 1 }, &mut w)?;
        let (n_group, topk_group) = match (grouped, v2) {
            (false, _) => (1, 1),
            (true, false) => (
                o.usize_or("n_group", 8, &mut w)?,
                o.usize_or("topk_group", 4, &mut w)?,
            ),
            // V2's defaults are null: group-limited routing needs both.
            (true, true) => (
                o.opt_usize("n_group")?
                    .ok_or_else(|| o.missing("n_group"))?,
                o.opt_usize("topk_group")?
                    .ok_or_else(|| o.missing("topk_group"))?,
            ),
        };
        let m = MoeDims {
            activation: ExpertActivation::Swiglu,
            biases: false,
            experts,
            experts_per_token: o.req_dim("num_experts_per_tok")?,
            intermediate_size: moe_inter,
            shared_experts: shared,
            shared_intermediate_size: moe_inter * shared,
            shared_expert_gate: false,
            router,
            n_group,
            topk_group,
            norm_topk_prob,
            routed_scaling_factor: o.f64_or(
                "routed_scaling_factor",
                if v2 { 1.0 } else { 2.5 },
                &mut w,
            )?,
            expert_format: expert_weight_format(o)?,
        };
        check_moe(o, &m)?;
        if let Some(f) = o.opt_usize("moe_layer_freq")? {
            if f != 1 {
                w.push(ConfigWarning::Ignored {
                    field: o.path("moe_layer_freq"),
                    reason: format!(
                        "{f}: transformers makes every layer from first_k_dense_replace on MoE"
                    ),
                });
            }
        }
        Some(m)
    } else {
        o.ignore(&[
            "scoring_func",
            "topk_method",
            "moe_intermediate_size",
            "n_shared_experts",
            "num_experts_per_tok",
            "n_group",
            "topk_group",
            "norm_topk_prob",
            "routed_scaling_factor",
            "moe_layer_freq",
        ]);
        None
    };
    let indexer = if family == Family::DeepseekV32 {
        // GLM-5's files select top-k on every layer (`index_topk_freq: 1`); another frequency
        // would reuse selections across layers, which day0 does not model.
        if let Some(freq) = o.opt_usize("index_topk_freq")? {
            if freq != 1 {
                return Err(o.invalid(
                    "index_topk_freq",
                    format!("only 1 (a top-k selection in every layer) is modelled, found {freq}"),
                ));
            }
        }
        Some(IndexerDims {
            heads: o.req_dim("index_n_heads")?,
            head_dim: o.req_dim("index_head_dim")?,
            topk: o.req_dim("index_topk")?,
            rope_interleaved: o.opt_bool("indexer_rope_interleave")?.unwrap_or(false),
        })
    } else {
        None
    };
    let default_attention = if indexer.is_some() {
        AttentionKind::SparseMla
    } else {
        AttentionKind::Mla
    };
    // V3.2 files written by recent transformers may list the kinds explicitly.
    let (attn_list, mlp_list) = if family == Family::DeepseekV32 {
        (
            o.opt_str_list("layer_types")?,
            o.opt_str_list("mlp_layer_types")?,
        )
    } else {
        (None, None)
    };
    let mut layers = Vec::with_capacity(n_layers);
    for i in 0..n_layers {
        let attention = match &attn_list {
            Some(l) => match l.get(i).map(String::as_str) {
                Some("indexed_attention" | "deepseek_sparse_attention" | "sparse_attention") => {
                    AttentionKind::SparseMla
                }
                Some("full_attention" | "attention") => AttentionKind::Mla,
                Some(other) => AttentionKind::Unknown(other.to_string()),
                None => default_attention.clone(),
            },
            None => default_attention.clone(),
        };
        let ffn = match &mlp_list {
            Some(l) => l.get(i).map(|s| mlp_kind(s)).unwrap_or(FfnKind::Dense),
            None if i < first_k || moe.is_none() => FfnKind::Dense,
            None => FfnKind::Moe,
        };
        layers.push(LayerSpec { attention, ffn });
    }
    if let Some(l) = &attn_list {
        check_len(o, "layer_types", l, n_layers)?;
    }
    if let Some(l) = &mlp_list {
        check_len(o, "mlp_layer_types", l, n_layers)?;
    }
    if layers.iter().any(|l| l.ffn == FfnKind::Moe) && moe.is_none() {
        return Err(o.invalid(
            "n_routed_experts",
            "is 0 but a layer is listed as MoE (sparse)",
        ));
    }
    let rope = parse_rope(o, 1.0, &mut w)?;
    Ok(ModelConfig {
        source: o.file.to_string(),
        model_type: model_type.to_string(),
        family,
        hidden_size,
        vocab_size,
        rms_norm_eps: o.f64_or("rms_norm_eps", 1e-6, &mut w)?,
        tie_word_embeddings: o.bool_or("tie_word_embeddings", false, &mut w)?,
        max_position_embeddings: o.opt_usize("max_position_embeddings")?,
        rope: Some(rope),
        mla: Some(mla),
        indexer,
        gqa: None,
        linear_attention: None,
        dense_mlp: Some(DenseMlpDims { intermediate_size }),
        moe,
        layers,
        weight_format,
        warnings: w,
        vision: None,
    })
}

/// Qwen3-Next.
fn qwen3_next(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    o.ignore(&[
        "use_sliding_window",
        "sliding_window",
        "max_window_layers",
        "mamba_ssm_dtype",
    ]);
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let vocab_size = o.req_dim("vocab_size")?;
    let attention: Vec<AttentionKind> = match o.opt_str_list("layer_types")? {
        Some(l) => {
            check_len(o, "layer_types", &l, n_layers)?;
            o.seen("full_attention_interval");
            l.iter()
                .map(|s| match s.as_str() {
                    "linear_attention" => AttentionKind::LinearAttention,
                    "full_attention" => AttentionKind::Gqa,
                    other => AttentionKind::Unknown(other.to_string()),
                })
                .collect()
        }
        None => {
            let interval = o.usize_or("full_attention_interval", 4, &mut w)?;
            if interval == 0 {
                return Err(o.invalid("full_attention_interval", "must be at least 1"));
            }
            (0..n_layers)
                .map(|i| {
                    if (i + 1) % interval == 0 {
                        AttentionKind::Gqa
                    } else {
                        AttentionKind::LinearAttention
                    }
                })
                .collect()
        }
    };
    let gqa = if attention.contains(&AttentionKind::Gqa) {
        let (heads, kv_heads) = gqa_heads(o)?;
        Some(GqaDims {
            qk_norm: true,
            output_gate: true,
            ..GqaDims::new(heads, kv_heads, o.req_dim("head_dim")?)
        })
    } else {
        o.ignore(&["num_attention_heads", "num_key_value_heads", "head_dim"]);
        None
    };
    let linear_attention = if attention.contains(&AttentionKind::LinearAttention) {
        let key_heads = o.req_dim("linear_num_key_heads")?;
        let value_heads = o.req_dim("linear_num_value_heads")?;
        if value_heads % key_heads != 0 {
            return Err(o.invalid(
                "linear_num_value_heads",
                format!("{value_heads} is not a multiple of linear_num_key_heads {key_heads}"),
            ));
        }
        Some(LinearAttnDims {
            key_heads,
            value_heads,
            key_head_dim: o.req_dim("linear_key_head_dim")?,
            value_head_dim: o.req_dim("linear_value_head_dim")?,
            conv_kernel: match o.usize_or("linear_conv_kernel_dim", 4, &mut w)? {
                0 => return Err(o.invalid("linear_conv_kernel_dim", "must be at least 1")),
                k => k,
            },
            decay: Decay::Scalar,
        })
    } else {
        o.ignore(&[
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ]);
        None
    };
    // Qwen3-Next's own files always give the expert count; a new type read with its schema
    // (a dense hybrid such as Qwen3.5's dense models) may have none: every layer is then dense.
    // (The file's own `model_type`: `model_type` here is the schema it is read with.)
    let experts = match o.peek_str("model_type") {
        Some("qwen3_next") => o.req_usize("num_experts")?,
        _ => o.opt_usize("num_experts")?.unwrap_or(0),
    };
    let ffn = qwen_ffn_layout(o, n_layers, experts, &mut w)?;
    let moe = if experts > 0 {
        let m = MoeDims {
            activation: ExpertActivation::Swiglu,
            biases: false,
            experts,
            experts_per_token: o.req_dim("num_experts_per_tok")?,
            intermediate_size: o.req_dim("moe_intermediate_size")?,
            shared_experts: 1,
            shared_intermediate_size: o.req_dim("shared_expert_intermediate_size")?,
            shared_expert_gate: true,
            router: RouterKind::SoftmaxTopk,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: o.bool_or("norm_topk_prob", true, &mut w)?,
            routed_scaling_factor: 1.0,
            expert_format: expert_weight_format(o)?,
        };
        check_moe(o, &m)?;
        Some(m)
    } else {
        None
    };
    let dense_mlp = dense_mlp_dims(o, &ffn)?;
    let weight_format = weight_format(o)?;
    let rope = parse_rope(o, 0.25, &mut w)?;
    let layers = attention
        .into_iter()
        .zip(ffn)
        .map(|(attention, ffn)| LayerSpec { attention, ffn })
        .collect();
    Ok(ModelConfig {
        source: o.file.to_string(),
        model_type: model_type.to_string(),
        family: Family::Qwen3Next,
        hidden_size,
        vocab_size,
        rms_norm_eps: o.f64_or("rms_norm_eps", 1e-6, &mut w)?,
        tie_word_embeddings: o.bool_or("tie_word_embeddings", false, &mut w)?,
        max_position_embeddings: o.opt_usize("max_position_embeddings")?,
        rope: Some(rope),
        mla: None,
        indexer: None,
        gqa,
        linear_attention,
        dense_mlp,
        moe,
        layers,
        weight_format,
        warnings: w,
        vision: None,
    })
}

/// `num_attention_heads` and `num_key_value_heads`, the latter dividing the former.
fn gqa_heads(o: &Obj) -> Result<(usize, usize), ModelError> {
    let heads = o.req_dim("num_attention_heads")?;
    let kv_heads = o.req_dim("num_key_value_heads")?;
    if heads % kv_heads != 0 {
        return Err(o.invalid(
            "num_key_value_heads",
            format!("{kv_heads} does not divide num_attention_heads {heads}"),
        ));
    }
    Ok((heads, kv_heads))
}

/// The dense MLP's width when some layer is dense (`intermediate_size`), else `None` with the
/// field marked as read.
fn dense_mlp_dims(o: &Obj, ffn: &[FfnKind]) -> Result<Option<DenseMlpDims>, ModelError> {
    if ffn.contains(&FfnKind::Dense) {
        Ok(Some(DenseMlpDims {
            intermediate_size: o.req_dim("intermediate_size")?,
        }))
    } else {
        o.seen("intermediate_size");
        Ok(None)
    }
}

/// Qwen's MoE layout: layer `i` is MoE when experts exist, it is not in `mlp_only_layers` and
/// `(i + 1)` is a multiple of `decoder_sparse_step`; dense otherwise.
fn qwen_ffn_layout(
    o: &Obj,
    n_layers: usize,
    experts: usize,
    w: &mut Vec<ConfigWarning>,
) -> Result<Vec<FfnKind>, ModelError> {
    let sparse_step = o.usize_or("decoder_sparse_step", 1, w)?;
    if sparse_step == 0 {
        return Err(o.invalid("decoder_sparse_step", "must be at least 1"));
    }
    let mlp_only = o.opt_usize_list("mlp_only_layers")?.unwrap_or_default();
    Ok((0..n_layers)
        .map(|i| {
            if !mlp_only.contains(&i) && experts > 0 && (i + 1) % sparse_step == 0 {
                FfnKind::Moe
            } else {
                FfnKind::Dense
            }
        })
        .collect())
}

/// Qwen3-VL-MoE (transformers `qwen3_vl_moe`): the language model of `text_config`, a Qwen3-MoE —
/// GQA in every layer with per-head q/k RMSNorm and no output gate, softmax top-k routing always
/// renormalised (transformers never reads `norm_topk_prob`), no shared expert, interleaved M-RoPE
/// (`mrope_section`: which frequencies follow the temporal, height and width positions; on text
/// positions it is plain RoPE, and it costs the same). The vision encoder (`vision_config`) is
/// read by [`crate::vision`].
fn qwen3_vl_moe(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    o.ignore(HF_IGNORED);
    o.ignore(&[
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
    ]);
    let t = o.opt_obj("text_config")?.ok_or_else(|| {
        o.missing_for(
            "text_config",
            "model_type qwen3_vl_moe (its language model)",
        )
    })?;
    common_hf(&t, &mut w)?;
    t.ignore(&["model_type", "norm_topk_prob"]);
    let hidden_size = t.req_dim("hidden_size")?;
    let n_layers = t.req_dim("num_hidden_layers")?;
    let vocab_size = t.req_dim("vocab_size")?;
    let (heads, kv_heads) = gqa_heads(&t)?;
    let head_dim = match t.opt_usize("head_dim")? {
        Some(d) if d > 0 => d,
        Some(_) => return Err(t.invalid("head_dim", "must be at least 1")),
        None => hidden_size / heads,
    };
    // transformers 5 writes `num_local_experts` (its attribute map's name), 4.57 `num_experts`.
    let experts = first_usize(&t, &["num_experts", "num_local_experts"])?
        .ok_or_else(|| t.missing_for("num_experts", "model_type qwen3_vl_moe"))?;
    t.ignore(&[
        "output_router_logits",
        "router_aux_loss_coef",
        "sliding_window",
        "tie_word_embeddings",
    ]);
    let ffn = qwen_ffn_layout(&t, n_layers, experts, &mut w)?;
    let moe = if experts > 0 {
        let m = MoeDims {
            activation: ExpertActivation::Swiglu,
            biases: false,
            experts,
            experts_per_token: t.req_dim("num_experts_per_tok")?,
            intermediate_size: t.req_dim("moe_intermediate_size")?,
            shared_experts: 0,
            shared_intermediate_size: 0,
            shared_expert_gate: false,
            router: RouterKind::SoftmaxTopk,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 1.0,
            expert_format: expert_weight_format(&t)?,
        };
        check_moe(&t, &m)?;
        Some(m)
    } else {
        None
    };
    let dense_mlp = dense_mlp_dims(&t, &ffn)?;
    let weight_format = weight_format(&t)?;
    let rope = parse_rope(&t, 1.0, &mut w)?;
    if let Some(section) = rope.mrope_section {
        if section.iter().sum::<usize>() > head_dim / 2 {
            let field = if t.opt_obj("rope_scaling")?.is_some() {
                "rope_scaling"
            } else {
                "rope_parameters"
            };
            return Err(t.invalid(
                field,
                format!(
                    "mrope_section {section:?} names more frequencies than the {} of a \
                     {head_dim}-wide head",
                    head_dim / 2
                ),
            ));
        }
    }
    // The vision encoder: its fields are checked where they are read; the rest (initializers,
    // the vision model_type) change nothing.
    let vision = match o.opt_obj("vision_config")? {
        Some(v) => {
            let vc = crate::vision::vision_from_obj(o, &v)?;
            v.ignore_rest();
            Some(vc)
        }
        None => None,
    };
    let mut cfg = ModelConfig {
        source: o.file.to_string(),
        model_type: model_type.to_string(),
        family: Family::Qwen3VlMoe,
        hidden_size,
        vocab_size,
        rms_norm_eps: t.f64_or("rms_norm_eps", 1e-6, &mut w)?,
        tie_word_embeddings: o.bool_or("tie_word_embeddings", false, &mut w)?,
        max_position_embeddings: t.opt_usize("max_position_embeddings")?,
        rope: Some(rope),
        mla: None,
        indexer: None,
        gqa: Some(GqaDims {
            qk_norm: true,
            ..GqaDims::new(heads, kv_heads, head_dim)
        }),
        linear_attention: None,
        dense_mlp,
        moe,
        layers: ffn
            .into_iter()
            .map(|ffn| LayerSpec {
                attention: AttentionKind::Gqa,
                ffn,
            })
            .collect(),
        weight_format,
        warnings: w,
        vision,
    };
    outer_quantization(o, &t, &mut cfg)?;
    o.adopt(&t);
    Ok(cfg)
}

/// `head_dim`, or `default` when absent (`hidden_size / heads` for most families); zero either
/// way is an error.
fn head_dim_or(o: &Obj, default: usize) -> Result<usize, ModelError> {
    match o.opt_usize("head_dim")? {
        Some(0) => Err(o.invalid("head_dim", "must be at least 1")),
        Some(d) => Ok(d),
        None if default == 0 => Err(o.invalid(
            "head_dim",
            "absent, and hidden_size / num_attention_heads is 0: give head_dim",
        )),
        None => Ok(default),
    }
}

/// Per-layer attention of a GQA decoder: `layer_types` when given (`full_attention` is GQA,
/// `sliding_attention` windowed GQA; any other kind is kept by name for the coverage inventory),
/// else GQA, or windowed GQA for the layers `sliding(i)` says use a window.
fn gqa_layer_kinds(
    o: &Obj,
    n_layers: usize,
    sliding: impl Fn(usize) -> bool,
) -> Result<Vec<AttentionKind>, ModelError> {
    let kind = |s: &str| match s {
        "full_attention" => AttentionKind::Gqa,
        "sliding_attention" => AttentionKind::SlidingGqa,
        other => AttentionKind::Unknown(other.to_string()),
    };
    match o.opt_str_list("layer_types")? {
        Some(l) => {
            check_len(o, "layer_types", &l, n_layers)?;
            Ok(l.iter().map(|s| kind(s)).collect())
        }
        None => Ok((0..n_layers)
            .map(|i| {
                kind(if sliding(i) {
                    "sliding_attention"
                } else {
                    "full_attention"
                })
            })
            .collect()),
    }
}

/// Qwen's per-layer attention (Qwen2, Qwen3, Qwen3-MoE): a sliding window only with
/// `use_sliding_window` (transformers drops `sliding_window` otherwise), on every layer
/// (`every_layer`: Qwen3-MoE) or on the layers from `max_window_layers` (default 28); explicit
/// `layer_types` win.
fn qwen_layer_kinds(
    o: &Obj,
    n_layers: usize,
    every_layer: bool,
) -> Result<Vec<AttentionKind>, ModelError> {
    let windowed =
        o.opt_bool("use_sliding_window")? == Some(true) && o.opt_usize("sliding_window")?.is_some();
    let max_window_layers = o.opt_usize("max_window_layers")?.unwrap_or(28);
    o.seen("sliding_window");
    gqa_layer_kinds(o, n_layers, |i| {
        windowed && (every_layer || i >= max_window_layers)
    })
}

/// Softmax top-k routing without shared experts (Qwen3-MoE, Mixtral).
fn softmax_moe(
    o: &Obj,
    experts: usize,
    intermediate_key: &str,
    norm_topk_prob: bool,
) -> Result<MoeDims, ModelError> {
    let m = MoeDims {
        activation: ExpertActivation::Swiglu,
        biases: false,
        experts,
        experts_per_token: o.req_dim("num_experts_per_tok")?,
        intermediate_size: o.req_dim(intermediate_key)?,
        shared_experts: 0,
        shared_intermediate_size: 0,
        shared_expert_gate: false,
        router: RouterKind::SoftmaxTopk,
        n_group: 1,
        topk_group: 1,
        norm_topk_prob,
        routed_scaling_factor: 1.0,
        expert_format: expert_weight_format(o)?,
    };
    check_moe(o, &m)?;
    Ok(m)
}

/// A GQA decoder's [`ModelConfig`] from its parts (the families without MLA or linear attention).
#[allow(clippy::too_many_arguments)]
fn gqa_model(
    o: &Obj,
    model_type: &str,
    family: Family,
    gqa: GqaDims,
    attention: Vec<AttentionKind>,
    ffn: Vec<FfnKind>,
    moe: Option<MoeDims>,
    rope: RopeConfig,
    mut w: Vec<ConfigWarning>,
) -> Result<ModelConfig, ModelError> {
    let dense_mlp = dense_mlp_dims(o, &ffn)?;
    let mut gqa = gqa;
    if attention.contains(&AttentionKind::SlidingGqa) {
        let window = o
            .opt_usize("sliding_window")?
            .ok_or_else(|| o.missing_for("sliding_window", "a `sliding_attention` layer"))?;
        if window == 0 {
            return Err(o.invalid("sliding_window", "must be at least 1 token"));
        }
        gqa.sliding_window = Some(window);
    }
    Ok(ModelConfig {
        source: o.file.to_string(),
        model_type: model_type.to_string(),
        family,
        hidden_size: o.req_dim("hidden_size")?,
        vocab_size: o.req_dim("vocab_size")?,
        rms_norm_eps: o.f64_or("rms_norm_eps", 1e-6, &mut w)?,
        tie_word_embeddings: o.bool_or("tie_word_embeddings", false, &mut w)?,
        max_position_embeddings: o.opt_usize("max_position_embeddings")?,
        rope: Some(rope),
        mla: None,
        indexer: None,
        gqa: Some(gqa),
        linear_attention: None,
        dense_mlp,
        moe,
        layers: attention
            .into_iter()
            .zip(ffn)
            .map(|(attention, ffn)| LayerSpec { attention, ffn })
            .collect(),
        weight_format: weight_format(o)?,
        warnings: w,
        vision: None,
    })
}

/// Qwen3 (`qwen3`, dense) and Qwen3-MoE (`qwen3_moe`): see the module docs.
fn qwen3(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let is_moe = model_type == "qwen3_moe";
    let head_dim = head_dim_or(o, if is_moe { hidden_size / heads } else { 128 })?;
    let attention = qwen_layer_kinds(o, n_layers, is_moe)?;
    let (ffn, moe) = if is_moe {
        // transformers 5 writes `num_local_experts` (its attribute map's name), 4.x `num_experts`.
        let experts = first_usize(o, &["num_experts", "num_local_experts"])?
            .ok_or_else(|| o.missing_for("num_experts", "model_type qwen3_moe"))?;
        let ffn = qwen_ffn_layout(o, n_layers, experts, &mut w)?;
        let norm = o.bool_or("norm_topk_prob", false, &mut w)?;
        let moe = if experts > 0 {
            Some(softmax_moe(o, experts, "moe_intermediate_size", norm)?)
        } else {
            o.ignore(&["num_experts_per_tok", "moe_intermediate_size"]);
            None
        };
        (ffn, moe)
    } else {
        (vec![FfnKind::Dense; n_layers], None)
    };
    let rope = parse_rope(o, 1.0, &mut w)?;
    let gqa = GqaDims {
        qk_norm: true,
        ..GqaDims::new(heads, kv_heads, head_dim)
    };
    let family = Family::Qwen3;
    gqa_model(o, model_type, family, gqa, attention, ffn, moe, rope, w)
}

/// gpt-oss (`gpt_oss`; defaults from transformers' `GptOssConfig`): GQA whose four projections
/// carry biases (`attention_bias`, default true) plus one learned sink logit per head,
/// `layer_types` alternating `sliding_attention` (window `sliding_window`, required) and
/// `full_attention`; every layer MoE: a biased router, top-`num_experts_per_tok` of the logits
/// softmaxed (= softmax top-k renormalised), experts with biases and the clamped SwiGLU
/// (`swiglu_alpha` 1.702, `swiglu_limit` 7.0), stored MXFP4 (`quantization_config` `mxfp4`; the
/// attention, router and embeddings stay bf16).
fn gpt_oss(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf_with(o, &mut w, true)?;
    o.ignore(&[
        "router_aux_loss_coef",
        "initial_context_length",
        "experts_per_token",
    ]);
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let head_dim = head_dim_or(o, 64)?;
    let attention = gqa_layer_kinds(o, n_layers, |i| i % 2 == 0)?;
    let experts = first_usize(o, &["num_local_experts", "num_experts"])?.unwrap_or(128);
    if experts == 0 {
        return Err(o.invalid(
            "num_local_experts",
            "gpt-oss layers are all MoE: at least 1 expert",
        ));
    }
    // The router: softmax(topk(logits)) is the top-k of softmax(logits), renormalised.
    let moe = MoeDims {
        activation: ExpertActivation::ClampedSwiglu {
            alpha: o.f64_or("swiglu_alpha", 1.702, &mut w)?,
            limit: o.f64_or("swiglu_limit", 7.0, &mut w)?,
        },
        biases: true,
        ..softmax_moe(o, experts, "intermediate_size", true)?
    };
    let bias = o.bool_or("attention_bias", true, &mut w)?;
    let gqa = GqaDims {
        sinks: true,
        o_bias: bias,
        qkv_bias: bias,
        ..GqaDims::new(heads, kv_heads, head_dim)
    };
    // transformers' default RoPE when the file has none: YaRN ×32 over 4096 positions, θ 150000.
    let rope = if o.contains("rope_scaling") || o.contains("rope_parameters") {
        parse_rope(o, 1.0, &mut w)?
    } else {
        RopeConfig {
            theta: o.f64_or("rope_theta", 150000.0, &mut w)?,
            scaling: RopeScaling::Yarn {
                factor: 32.0,
                original_max_position_embeddings: 4096,
                beta_fast: 32.0,
                beta_slow: 1.0,
                mscale: 0.0,
                mscale_all_dim: 0.0,
                truncate: false,
            },
            partial_rotary_factor: 1.0,
            source: Some("transformers' GptOssConfig default"),
            mrope_section: None,
        }
    };
    let ffn = vec![FfnKind::Moe; n_layers];
    let mut cfg = gqa_model(
        o,
        model_type,
        Family::GptOss,
        gqa,
        attention,
        ffn,
        Some(moe),
        rope,
        w,
    )?;
    // Only the experts are MXFP4 (`modules_to_not_convert`: attention, router, embeddings).
    cfg.weight_format = WeightFormat::Float;
    Ok(cfg)
}

/// Llama (`llama`), Mistral (`mistral`) and Mixtral (`mixtral`): see the module docs.
fn llama(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    o.ignore(&[
        "router_jitter_noise",
        "max_window_layers",
        "use_sliding_window",
    ]);
    if o.opt_bool("mlp_bias")? == Some(true) {
        w.push(ConfigWarning::Ignored {
            field: o.path("mlp_bias"),
            reason: "MLP biases are not modelled in the operator graph".into(),
        });
    }
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let head_dim = head_dim_or(o, hidden_size / heads)?;
    let windowed = model_type != "llama" && o.opt_usize("sliding_window")?.is_some();
    o.seen("sliding_window");
    let attention = gqa_layer_kinds(o, n_layers, |_| windowed)?;
    let (ffn, moe, family) = if model_type == "mixtral" {
        let experts = first_usize(o, &["num_local_experts", "num_experts"])?
            .ok_or_else(|| o.missing_for("num_local_experts", "model_type mixtral"))?;
        let moe = softmax_moe(o, experts, "intermediate_size", true)?;
        (vec![FfnKind::Moe; n_layers], Some(moe), Family::Mixtral)
    } else {
        (vec![FfnKind::Dense; n_layers], None, Family::Llama)
    };
    let rope = parse_rope(o, 1.0, &mut w)?;
    let gqa = GqaDims::new(heads, kv_heads, head_dim);
    gqa_model(o, model_type, family, gqa, attention, ffn, moe, rope, w)
}

/// Qwen2 / Qwen2.5 (`qwen2`: q/k/v biases always, dense SwiGLU, windows as Qwen3's) and
/// Qwen2-MoE / Qwen1.5-MoE (`qwen2_moe`: biases per `qkv_bias`, default true; a window on the odd
/// layers below `max_window_layers` with `use_sliding_window`; MoE per Qwen's layout with softmax
/// top-k, renormalised when `norm_topk_prob` (default false), plus a sigmoid-gated shared expert of
/// width `shared_expert_intermediate_size`).
fn qwen2(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf_with(o, &mut w, true)?;
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let head_dim = head_dim_or(o, hidden_size / heads)?;
    let is_moe = model_type == "qwen2_moe";
    let (attention, qkv_bias) = if is_moe {
        let windowed = o.opt_bool("use_sliding_window")? == Some(true);
        let max_window_layers = o.opt_usize("max_window_layers")?.unwrap_or(28);
        o.seen("sliding_window");
        let kinds = gqa_layer_kinds(o, n_layers, |i| {
            windowed && (i + 1) % 2 == 1 && i < max_window_layers
        })?;
        (kinds, o.bool_or("qkv_bias", true, &mut w)?)
    } else {
        (qwen_layer_kinds(o, n_layers, false)?, true)
    };
    let (ffn, moe) = if is_moe {
        let experts = first_usize(o, &["num_experts", "num_local_experts"])?
            .ok_or_else(|| o.missing_for("num_experts", "model_type qwen2_moe"))?;
        let ffn = qwen_ffn_layout(o, n_layers, experts, &mut w)?;
        let moe = if experts > 0 {
            let m = MoeDims {
                activation: ExpertActivation::Swiglu,
                biases: false,
                shared_experts: 1,
                shared_intermediate_size: o.req_dim("shared_expert_intermediate_size")?,
                shared_expert_gate: true,
                ..softmax_moe(
                    o,
                    experts,
                    "moe_intermediate_size",
                    o.bool_or("norm_topk_prob", false, &mut w)?,
                )?
            };
            Some(m)
        } else {
            // No experts: the MoE fields describe nothing (as `qwen3_moe` with 0 experts).
            o.ignore(&[
                "num_experts_per_tok",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
                "norm_topk_prob",
            ]);
            None
        };
        (ffn, moe)
    } else {
        (vec![FfnKind::Dense; n_layers], None)
    };
    let rope = parse_rope(o, 1.0, &mut w)?;
    let gqa = GqaDims {
        qkv_bias,
        ..GqaDims::new(heads, kv_heads, head_dim)
    };
    gqa_model(
        o,
        model_type,
        Family::Qwen2,
        gqa,
        attention,
        ffn,
        moe,
        rope,
        w,
    )
}

/// GLM-4.5 / 4.6 (`glm4_moe`): GQA with q/k/v biases per `attention_bias`, optional q/k norms
/// (`use_qk_norm`), partial half-split RoPE (`partial_rotary_factor`, default 0.5); dense MLP for
/// the first `first_k_dense_replace` layers (default 1), then DeepSeek-V3's MoE (sigmoid scores
/// with `e_score_correction_bias`, group-limited top-k, `routed_scaling_factor`, shared experts of
/// width `moe_intermediate_size · n_shared_experts`). Defaults are `Glm4MoeConfig`'s.
fn glm4_moe(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf_with(o, &mut w, true)?;
    o.ignore(&["num_mtp_layers"]);
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let head_dim = head_dim_or(o, hidden_size / heads)?;
    let first_k = o.usize_or("first_k_dense_replace", 1, &mut w)?;
    let ffn: Vec<FfnKind> = (0..n_layers)
        .map(|i| {
            if i < first_k {
                FfnKind::Dense
            } else {
                FfnKind::Moe
            }
        })
        .collect();
    let moe_inter = o.req_dim("moe_intermediate_size")?;
    let shared = o.usize_or("n_shared_experts", 1, &mut w)?;
    // GLM-4.5's files leave the router implicit (DeepSeek-V3's); a file read with this schema
    // that names another router keeps it by name, so the coverage inventory reports it.
    let router = match (
        o.opt_str("scoring_func")?.unwrap_or("sigmoid"),
        o.opt_str("topk_method")?.unwrap_or("noaux_tc"),
    ) {
        ("sigmoid", "noaux_tc") => RouterKind::SigmoidGroupTopk,
        (s, m) => RouterKind::Unknown(format!("{s}/{m}")),
    };
    if let Some(f) = o.opt_usize("moe_layer_freq")? {
        if f != 1 {
            return Err(o.invalid(
                "moe_layer_freq",
                format!("only 1 (every layer from first_k_dense_replace on is MoE) is modelled, found {f}"),
            ));
        }
    }
    let moe = MoeDims {
        activation: ExpertActivation::Swiglu,
        biases: false,
        experts: match first_usize(o, &["n_routed_experts", "num_local_experts"])? {
            Some(e) => e,
            None => o.usize_or("n_routed_experts", 128, &mut w)?,
        },
        experts_per_token: o.usize_or("num_experts_per_tok", 8, &mut w)?,
        intermediate_size: moe_inter,
        shared_experts: shared,
        shared_intermediate_size: moe_inter * shared,
        shared_expert_gate: false,
        router,
        n_group: o.usize_or("n_group", 1, &mut w)?,
        topk_group: o.usize_or("topk_group", 1, &mut w)?,
        norm_topk_prob: o.bool_or("norm_topk_prob", true, &mut w)?,
        routed_scaling_factor: o.f64_or("routed_scaling_factor", 1.0, &mut w)?,
        expert_format: expert_weight_format(o)?,
    };
    check_moe(o, &moe)?;
    let gqa = GqaDims {
        qk_norm: o.bool_or("use_qk_norm", false, &mut w)?,
        qkv_bias: o.opt_bool("attention_bias")? == Some(true),
        ..GqaDims::new(heads, kv_heads, head_dim)
    };
    let rope = parse_rope(o, 0.5, &mut w)?;
    let attention = vec![AttentionKind::Gqa; n_layers];
    let moe = (first_k < n_layers).then_some(moe);
    gqa_model(
        o,
        model_type,
        Family::Glm4Moe,
        gqa,
        attention,
        ffn,
        moe,
        rope,
        w,
    )
}

/// MiniMax-M2 (`minimax_m2`; M2.1, M2.5 and M2.7 share the schema; fields as transformers'
/// `MiniMaxM2Config`): GQA whose q/k RMSNorm spans the whole projection
/// (`qk_norm_type: per_layer`) and whose RoPE turns the first `rotary_dim` of each head; in every
/// layer `num_local_experts` experts of width `intermediate_size`, routed as DeepSeek-V3 routes
/// (`scoring_func: sigmoid` with `use_routing_bias`: the bias picks, the scores weigh,
/// renormalised). Lightning-attention layers (`attn_type_list` 0, MiniMax-01's) are kept by name,
/// so the coverage inventory reports them; features day0 does not model yet (per-layer sliding
/// windows, a shared expert) are errors, not silently dropped.
fn minimax_m2(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    // Multi-token-prediction modules are not part of the main model (as DeepSeek's
    // `num_nextn_predict_layers`); the router's jitter is training-only.
    o.ignore(&[
        "use_mtp",
        "num_mtp_modules",
        "mtp_transformer_layers",
        "router_jitter_noise",
    ]);
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let head_dim = head_dim_or(o, hidden_size / heads)?;
    let attention: Vec<AttentionKind> = match o.opt_usize_list("attn_type_list")? {
        None => vec![AttentionKind::Gqa; n_layers],
        Some(kinds) if kinds.len() == n_layers => kinds
            .iter()
            .map(|k| match k {
                1 => AttentionKind::Gqa,
                _ => AttentionKind::Unknown("lightning_attention".into()),
            })
            .collect(),
        Some(kinds) => {
            return Err(o.invalid(
                "attn_type_list",
                format!(
                    "must give one kind per layer ({n_layers}), found {}",
                    kinds.len()
                ),
            ))
        }
    };
    let windowed = match o.peek_value("attn_window_size") {
        None | Some(Value::Null) => false,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|v| v > 0.0),
        Some(Value::Array(a)) => a.iter().any(|v| v.as_f64().is_some_and(|v| v > 0.0)),
        Some(_) => true,
    };
    if windowed {
        return Err(o.invalid(
            "attn_window_size",
            "MiniMax sliding-window layers are not read yet (day0 would attend the whole \
             context); remove the field from a copy to cost the model without windows",
        ));
    }
    o.ignore(&["attn_window_size", "swa_rope_theta"]);
    let qk_norm = o.bool_or("use_qk_norm", false, &mut w)?;
    let across = match o.opt_str("qk_norm_type")? {
        None | Some("per_layer") => true,
        Some("per_head") => false,
        Some(other) => {
            return Err(o.invalid(
                "qk_norm_type",
                format!("must be `per_layer` or `per_head`, found `{other}`"),
            ))
        }
    };
    let rotary_dim = o.opt_usize("rotary_dim")?.unwrap_or(head_dim);
    if rotary_dim == 0 || rotary_dim > head_dim || rotary_dim % 2 != 0 {
        return Err(o.invalid(
            "rotary_dim",
            format!("must be even and at most head_dim ({head_dim}), found {rotary_dim}"),
        ));
    }
    let gqa = GqaDims {
        qk_norm,
        qk_norm_across_heads: qk_norm && across,
        ..GqaDims::new(heads, kv_heads, head_dim)
    };
    let rope = parse_rope(o, rotary_dim as f64 / head_dim as f64, &mut w)?;
    if o.opt_usize("shared_intermediate_size")?.unwrap_or(0) > 0 {
        return Err(o.invalid(
            "shared_intermediate_size",
            "a MiniMax shared expert is not read yet (day0 would leave it out)",
        ));
    }
    let scoring = o.opt_str("scoring_func")?.unwrap_or("softmax");
    let bias = o.opt_bool("use_routing_bias")?.unwrap_or(false);
    let router = scored_router(scoring, bias, "correction_bias");
    let grouped = o.opt_bool("use_grouped_topk")?.unwrap_or(false);
    let (n_group, topk_group) = match grouped {
        true => (
            o.usize_or("num_expert_group", 1, &mut w)?,
            o.usize_or("topk_group", 1, &mut w)?,
        ),
        false => {
            o.ignore(&["num_expert_group", "topk_group"]);
            (1, 1)
        }
    };
    let moe = MoeDims {
        activation: ExpertActivation::Swiglu,
        biases: false,
        experts: o.req_dim("num_local_experts")?,
        experts_per_token: o.req_dim("num_experts_per_tok")?,
        intermediate_size: o.req_dim("intermediate_size")?,
        shared_experts: 0,
        shared_intermediate_size: 0,
        shared_expert_gate: false,
        router,
        n_group,
        topk_group,
        // MiniMax always renormalises the chosen weights.
        norm_topk_prob: true,
        routed_scaling_factor: o.opt_f64("routed_scaling_factor")?.unwrap_or(1.0),
        expert_format: expert_weight_format(o)?,
    };
    check_moe(o, &moe)?;
    let ffn = vec![FfnKind::Moe; n_layers];
    gqa_model(
        o,
        model_type,
        Family::MiniMaxM2,
        gqa,
        attention,
        ffn,
        Some(moe),
        rope,
        w,
    )
}

/// Llama 4 (`llama4`, its language model under `text_config`, or `llama4_text`; fields and
/// defaults as transformers' `Llama4TextConfig`). Layer `i` has RoPE when `no_rope_layers[i]` is
/// 1 (transformers' `use_rope`; absent or empty: every `no_rope_layer_interval`-th layer, 1-based,
/// has none), and attends within chunks of `attention_chunk_size` positions when `layer_types`
/// says `chunked_attention` (by default the RoPE layers; a null chunk size makes them full
/// attention). RoPE turns interleaved pairs, with `use_qk_norm` followed by a weightless RMS norm
/// of each head's query and key; the NoPE layers scale their queries by the attention temperature
/// (`attn_temperature_tuning`, `floor_scale`, `attn_scale`). Layers in `moe_layers` (by default
/// every `interleave_moe_layer_step`-th, 1-based) are MoE — `num_local_experts` experts of
/// `intermediate_size`, top-`num_experts_per_tok` of the logits, each chosen expert's input
/// scaled by the sigmoid of its logit, plus a shared expert of the same width — the others
/// dense MLPs of `intermediate_size_mlp`. The vision encoder (`vision_config`) is not modelled.
fn llama4(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    let text = match model_type {
        "llama4" => {
            o.ignore(HF_IGNORED);
            o.ignore(&["boi_token_index", "eoi_token_index", "image_token_index"]);
            if o.peek_value("vision_config").is_some_and(|v| !v.is_null()) {
                o.seen("vision_config");
                w.push(ConfigWarning::Ignored {
                    field: o.path("vision_config"),
                    reason: "Llama 4's vision encoder is not modelled: day0 runs its language \
                             model on text tokens"
                        .into(),
                });
            }
            Some(o.opt_obj("text_config")?.ok_or_else(|| {
                o.missing_for("text_config", "model_type llama4 (its language model)")
            })?)
        }
        _ => None,
    };
    let t = text.as_ref().unwrap_or(o);
    common_hf(t, &mut w)?;
    // Training-time knobs, and the quantization tooling's flag.
    t.ignore(&["model_type", "router_jitter_noise", "for_llm_compressor"]);
    let hidden_size = t.req_dim("hidden_size")?;
    let n_layers = t.req_dim("num_hidden_layers")?;
    let vocab_size = t.req_dim("vocab_size")?;
    let (heads, kv_heads) = gqa_heads(t)?;
    let head_dim = head_dim_or(t, hidden_size / heads)?;
    // `no_rope_layers[i]` is 1 where layer `i` HAS RoPE (the name reads the other way round).
    let rope_on: Vec<bool> = match t.opt_usize_list("no_rope_layers")? {
        Some(l) if !l.is_empty() => {
            t.seen("no_rope_layer_interval");
            if l.len() != n_layers || l.iter().any(|v| *v > 1) {
                return Err(t.invalid(
                    "no_rope_layers",
                    format!("must give 0 or 1 for each of the {n_layers} layers"),
                ));
            }
            l.iter().map(|v| *v == 1).collect()
        }
        _ => {
            let every = t.usize_or("no_rope_layer_interval", 4, &mut w)?;
            if every == 0 {
                return Err(t.invalid("no_rope_layer_interval", "must be at least 1"));
            }
            (0..n_layers).map(|i| (i + 1) % every != 0).collect()
        }
    };
    let chunk = match t.peek_value("attention_chunk_size") {
        None => {
            w.push(ConfigWarning::Defaulted {
                field: t.path("attention_chunk_size"),
                value: "8192".into(),
            });
            Some(8192)
        }
        Some(Value::Null) => {
            t.seen("attention_chunk_size");
            None
        }
        Some(_) => match t.opt_usize("attention_chunk_size")? {
            Some(0) => return Err(t.invalid("attention_chunk_size", "must be at least 1")),
            c => c,
        },
    };
    let chunked: Vec<bool> = match t.opt_str_list("layer_types")? {
        Some(types) if types.len() == n_layers => types
            .iter()
            .map(|k| match k.as_str() {
                "chunked_attention" => Ok(true),
                "full_attention" => Ok(false),
                other => Err(t.invalid(
                    "layer_types",
                    format!("`{other}` is not `chunked_attention` or `full_attention`"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(types) => {
            return Err(t.invalid(
                "layer_types",
                format!(
                    "must give one kind per layer ({n_layers}), found {}",
                    types.len()
                ),
            ))
        }
        None => rope_on.clone(),
    };
    let attention = rope_on
        .iter()
        .zip(&chunked)
        .enumerate()
        .map(
            |(i, (rope, chunked))| match (rope, *chunked && chunk.is_some()) {
                (true, true) => Ok(AttentionKind::ChunkedGqa),
                (true, false) => Ok(AttentionKind::Gqa),
                (false, false) => Ok(AttentionKind::NopeGqa),
                (false, true) => Err(t.invalid(
                    "layer_types",
                    format!("layer {i} attends in chunks without RoPE, a form day0 does not model"),
                )),
            },
        )
        .collect::<Result<Vec<_>, _>>()?;
    let tuning = match t.peek_value("attn_temperature_tuning") {
        // The released files write 4 (a number) where transformers declares a bool.
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|v| v != 0.0),
        Some(Value::Null) => false,
        None => true,
        Some(_) => return Err(t.invalid("attn_temperature_tuning", "must be a bool (or a number)")),
    };
    t.seen("attn_temperature_tuning");
    let temperature = if tuning && attention.contains(&AttentionKind::NopeGqa) {
        let floor_scale = t.f64_or("floor_scale", 8192.0, &mut w)?;
        if floor_scale <= 0.0 {
            return Err(t.invalid("floor_scale", "must be positive"));
        }
        Some(AttnTemperature {
            floor_scale,
            attn_scale: t.f64_or("attn_scale", 0.1, &mut w)?,
        })
    } else {
        t.ignore(&["floor_scale", "attn_scale"]);
        None
    };
    let gqa = GqaDims {
        qk_l2_norm: t.bool_or("use_qk_norm", true, &mut w)?,
        rope_interleaved: true,
        attention_chunk: chunk.filter(|_| attention.contains(&AttentionKind::ChunkedGqa)),
        temperature,
        ..GqaDims::new(heads, kv_heads, head_dim)
    };
    let experts = t.usize_or("num_local_experts", 16, &mut w)?;
    let moe_layers: Vec<usize> = match t.opt_usize_list("moe_layers")? {
        Some(l) => {
            t.seen("interleave_moe_layer_step");
            if let Some(bad) = l.iter().find(|i| **i >= n_layers) {
                return Err(t.invalid(
                    "moe_layers",
                    format!("layer {bad} is past the model's {n_layers} layers"),
                ));
            }
            l
        }
        None => {
            let step = t.usize_or("interleave_moe_layer_step", 1, &mut w)?;
            if step == 0 {
                return Err(t.invalid("interleave_moe_layer_step", "must be at least 1"));
            }
            (step - 1..n_layers).step_by(step).collect()
        }
    };
    let ffn: Vec<FfnKind> = (0..n_layers)
        .map(|i| match experts > 0 && moe_layers.contains(&i) {
            true => FfnKind::Moe,
            false => FfnKind::Dense,
        })
        .collect();
    let inter = t.usize_or("intermediate_size", 8192, &mut w)?;
    let moe = if ffn.contains(&FfnKind::Moe) {
        let m = MoeDims {
            activation: ExpertActivation::Swiglu,
            biases: false,
            experts,
            experts_per_token: t.usize_or("num_experts_per_tok", 1, &mut w)?,
            intermediate_size: inter,
            shared_experts: 1,
            shared_intermediate_size: inter,
            shared_expert_gate: false,
            router: RouterKind::SigmoidTopkScaledInput,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: false,
            routed_scaling_factor: 1.0,
            expert_format: expert_weight_format(t)?,
        };
        check_moe(t, &m)?;
        Some(m)
    } else {
        t.seen("num_experts_per_tok");
        None
    };
    let dense_mlp = if ffn.contains(&FfnKind::Dense) {
        Some(DenseMlpDims {
            intermediate_size: t.usize_or("intermediate_size_mlp", 16384, &mut w)?,
        })
    } else {
        t.seen("intermediate_size_mlp");
        None
    };
    let rope = parse_rope(t, 1.0, &mut w)?;
    let tie = match &text {
        Some(_) => o.bool_or("tie_word_embeddings", false, &mut w)?,
        None => t.bool_or("tie_word_embeddings", false, &mut w)?,
    };
    let mut cfg = ModelConfig {
        source: o.file.to_string(),
        model_type: model_type.to_string(),
        family: Family::Llama4,
        hidden_size,
        vocab_size,
        rms_norm_eps: t.f64_or("rms_norm_eps", 1e-5, &mut w)?,
        tie_word_embeddings: tie,
        max_position_embeddings: t.opt_usize("max_position_embeddings")?,
        rope: Some(rope),
        mla: None,
        indexer: None,
        gqa: Some(gqa),
        linear_attention: None,
        dense_mlp,
        moe,
        layers: attention
            .into_iter()
            .zip(ffn)
            .map(|(attention, ffn)| LayerSpec { attention, ffn })
            .collect(),
        weight_format: weight_format(t)?,
        warnings: w,
        vision: None,
    };
    if let Some(t) = &text {
        t.ignore(&["tie_word_embeddings"]);
        outer_quantization(o, t, &mut cfg)?;
        o.adopt(t);
    }
    Ok(cfg)
}

/// Ant Group's Ling / Ring MoE (`bailing_moe`: Ling-lite/plus 1.5 and the Ling 2.0 family up to
/// Ling-1T and Ring-1T, whose `BailingMoeV2` files keep the model type; fields and semantics as
/// vLLM's `bailing_moe.py` reads them, no transformers class exists): GQA from one fused
/// `query_key_value` projection, a per-head RMSNorm of q and k with `use_qk_norm` (`use_rmsnorm`),
/// half-split RoPE on `partial_rotary_factor` of each head; layer `i` a dense MLP of
/// `intermediate_size` when `i < first_k_dense_replace`, else `num_experts` experts of
/// `moe_intermediate_size` with `num_shared_experts` shared ones (one MLP of that many times
/// `moe_shared_expert_intermediate_size`). Routing: `score_function` softmax (the default) without
/// a bias, or sigmoid with `moe_router_enable_expert_bias` (DeepSeek-V3's), group-limited when
/// `n_group` and `topk_group` are given, renormalised per `norm_topk_prob`, the routed output times
/// `routed_scaling_factor`. Other combinations are kept by name (coverage reports them), biased
/// projections and LayerNorm q/k norms are errors. Cost-only: its checkpoints are not read yet.
fn bailing_moe(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    // Dropouts, the router's dtype, and the head's weight normalisation (a load-time transform of
    // `lm_head`, no operator).
    o.ignore(&[
        "embedding_dropout",
        "output_dropout",
        "router_dtype",
        "norm_head",
        "norm_softmax",
        "use_rmsnorm",
    ]);
    for key in ["use_bias", "use_qkv_bias"] {
        if o.opt_bool(key)? == Some(true) {
            return Err(o.invalid(
                key,
                "biased projections are not modelled (the Ling releases set false)",
            ));
        }
    }
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let head_dim = head_dim_or(o, hidden_size / heads)?;
    let qk_norm = o.bool_or("use_qk_norm", false, &mut w)?;
    if qk_norm && o.peek_value("use_rmsnorm") == Some(&Value::Bool(false)) {
        return Err(o.invalid(
            "use_rmsnorm",
            "a LayerNorm q/k norm (use_qk_norm without use_rmsnorm) is not modelled; day0's GQA \
             layers normalise q and k with RMSNorm",
        ));
    }
    let gqa = GqaDims {
        qk_norm,
        ..GqaDims::new(heads, kv_heads, head_dim)
    };
    let rope = parse_rope(o, 1.0, &mut w)?;
    let first_k = o.usize_or("first_k_dense_replace", 0, &mut w)?;
    let experts = o.opt_usize("num_experts")?.unwrap_or(0);
    let ffn: Vec<FfnKind> = (0..n_layers)
        .map(|i| match experts > 0 && i >= first_k {
            true => FfnKind::Moe,
            false => FfnKind::Dense,
        })
        .collect();
    let moe = if ffn.contains(&FfnKind::Moe) {
        let scoring = o.opt_str("score_function")?.unwrap_or("softmax");
        let bias = o.bool_or("moe_router_enable_expert_bias", false, &mut w)?;
        let router = scored_router(scoring, bias, "expert_bias");
        // vLLM limits groups only when both fields are set.
        let (n_group, topk_group) = match (o.opt_usize("n_group")?, o.opt_usize("topk_group")?) {
            (Some(g), Some(k)) => (g, k),
            _ => (1, 1),
        };
        let inter = o.req_dim("moe_intermediate_size")?;
        let shared = o.usize_or("num_shared_experts", 0, &mut w)?;
        let shared_width = o
            .opt_usize("moe_shared_expert_intermediate_size")?
            .unwrap_or(inter);
        let m = MoeDims {
            activation: ExpertActivation::Swiglu,
            biases: false,
            experts,
            experts_per_token: o.req_dim("num_experts_per_tok")?,
            intermediate_size: inter,
            shared_experts: shared,
            shared_intermediate_size: shared * shared_width,
            shared_expert_gate: false,
            router,
            n_group,
            topk_group,
            norm_topk_prob: o.bool_or("norm_topk_prob", true, &mut w)?,
            routed_scaling_factor: o.opt_f64("routed_scaling_factor")?.unwrap_or(1.0),
            expert_format: expert_weight_format(o)?,
        };
        check_moe(o, &m)?;
        Some(m)
    } else {
        o.ignore(&[
            "moe_intermediate_size",
            "num_experts_per_tok",
            "num_shared_experts",
            "moe_shared_expert_intermediate_size",
            "score_function",
            "moe_router_enable_expert_bias",
            "n_group",
            "topk_group",
            "norm_topk_prob",
            "routed_scaling_factor",
        ]);
        None
    };
    let attention = vec![AttentionKind::Gqa; n_layers];
    gqa_model(
        o,
        model_type,
        Family::BailingMoe,
        gqa,
        attention,
        ffn,
        moe,
        rope,
        w,
    )
}

/// ERNIE-4.5 MoE (`ernie4_5_moe`; fields as transformers' `Ernie4_5_MoeConfig`): Llama attention
/// (`use_bias` false in the releases; biases are refused), RoPE at `rope_theta`; layer `i` is MoE
/// when `(i + 1) % moe_layer_interval == 0` and `moe_layer_start_index ≤ i ≤
/// moe_layer_end_index` (null: the last layer; lists, as the VL files give per modality, by
/// their extremes, as transformers' converter does), else a dense MLP of `intermediate_size`.
/// A MoE layer has `moe_num_experts` experts of `moe_intermediate_size`, `moe_k` per token, and
/// `moe_num_shared_experts` shared experts as one MLP of `moe_num_shared_experts ·
/// moe_intermediate_size`. Routing ([`RouterKind::SoftmaxBiasTopk`]): softmax probabilities,
/// top-k picked on probabilities plus `e_score_correction_bias`, the picked probabilities
/// renormalised; another `moe_gate_act` is kept by name. Cost-only: its checkpoints are refused
/// by numeric runs (no transformers reference pinned).
fn ernie45_moe(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    // Training-time knobs of the MoE (capacity, aux-free balancing's update, the norm's floor).
    o.ignore(&[
        "moe_capacity",
        "moe_use_aux_free",
        "moe_norm_min",
        "moe_aux_loss_lambda",
        "moe_z_loss_lambda",
        "moe_orthogonal_loss_lambda",
        "moe_group_orthogonal_loss",
        "moe_dropout_prob",
        "moe_group",
        "moe_num_attn_experts",
    ]);
    if o.opt_bool("use_bias")? == Some(true) {
        return Err(o.invalid(
            "use_bias",
            "biases on every projection are not modelled (the ERNIE-4.5 releases set false)",
        ));
    }
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let (heads, kv_heads) = gqa_heads(o)?;
    let head_dim = head_dim_or(o, hidden_size / heads)?;
    let experts = o.opt_usize("moe_num_experts")?.unwrap_or(0);
    // An int, a list (per modality) or null.
    let bound =
        |key: &str, pick: fn(&[usize]) -> Option<usize>| -> Result<Option<usize>, ModelError> {
            match o.peek_value(key) {
                None | Some(Value::Null) => {
                    o.seen(key);
                    Ok(None)
                }
                Some(Value::Array(_)) => Ok(o.opt_usize_list(key)?.as_deref().and_then(pick)),
                Some(_) => o.opt_usize(key),
            }
        };
    let start = bound("moe_layer_start_index", |l| l.iter().min().copied())?.unwrap_or(0);
    let end = bound("moe_layer_end_index", |l| l.iter().max().copied())?.unwrap_or(n_layers - 1);
    let interval = o.opt_usize("moe_layer_interval")?.unwrap_or(1);
    if interval == 0 {
        return Err(o.invalid("moe_layer_interval", "must be at least 1"));
    }
    let ffn: Vec<FfnKind> = (0..n_layers)
        .map(
            |i| match experts > 0 && (i + 1) % interval == 0 && i >= start && i <= end {
                true => FfnKind::Moe,
                false => FfnKind::Dense,
            },
        )
        .collect();
    let moe = if ffn.contains(&FfnKind::Moe) {
        let router = match o.opt_str("moe_gate_act")? {
            None | Some("softmax") => RouterKind::SoftmaxBiasTopk,
            Some(other) => RouterKind::Unknown(format!("{other}_correction_bias_topk")),
        };
        let inter = o.req_dim("moe_intermediate_size")?;
        let shared = o.opt_usize("moe_num_shared_experts")?.unwrap_or(0);
        let m = MoeDims {
            activation: ExpertActivation::Swiglu,
            biases: false,
            experts,
            experts_per_token: o.req_dim("moe_k")?,
            intermediate_size: inter,
            shared_experts: shared,
            shared_intermediate_size: shared * inter,
            shared_expert_gate: false,
            router,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 1.0,
            expert_format: expert_weight_format(o)?,
        };
        check_moe(o, &m)?;
        Some(m)
    } else {
        o.ignore(&[
            "moe_intermediate_size",
            "moe_k",
            "moe_num_shared_experts",
            "moe_gate_act",
        ]);
        None
    };
    let rope = parse_rope(o, 1.0, &mut w)?;
    let attention = vec![AttentionKind::Gqa; n_layers];
    let gqa = GqaDims::new(heads, kv_heads, head_dim);
    gqa_model(
        o,
        model_type,
        Family::Ernie45Moe,
        gqa,
        attention,
        ffn,
        moe,
        rope,
        w,
    )
}

/// The first of several alias keys that is present (Kimi Linear's checkpoints use other names
/// than its configuration class: `attribute_map`).
fn first_usize(o: &Obj, keys: &[&str]) -> Result<Option<usize>, ModelError> {
    let mut found = None;
    for k in keys {
        let v = o.opt_usize(k)?;
        if found.is_none() {
            found = v;
        }
    }
    Ok(found)
}

/// Kimi Linear.
fn kimi_linear(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    common_hf(o, &mut w)?;
    // MLA does not use `head_dim` / `num_key_value_heads`; `use_grouped_topk` is implied by the
    // group counts.
    o.ignore(&[
        "num_key_value_heads",
        "head_dim",
        "qk_head_dim",
        "model_max_length",
        "use_grouped_topk",
    ]);
    let hidden_size = o.req_dim("hidden_size")?;
    let n_layers = o.req_dim("num_hidden_layers")?;
    let vocab_size = o.req_dim("vocab_size")?;
    let lac = o.opt_obj("linear_attn_config")?;
    let mut attention: Option<Vec<AttentionKind>> = None;
    let mut linear_attention = None;
    if let Some(l) = &lac {
        let dim = l.req_dim("head_dim")?;
        linear_attention = Some(LinearAttnDims {
            key_heads: l.req_dim("num_heads")?,
            value_heads: l.req_dim("num_heads")?,
            key_head_dim: dim,
            value_head_dim: dim,
            conv_kernel: l.usize_or("short_conv_kernel_size", 4, &mut w)?,
            decay: Decay::PerChannel,
        });
        let kda = l.opt_usize_list("kda_layers")?;
        let full = l.opt_usize_list("full_attn_layers")?;
        if let (Some(kda), Some(full)) = (kda, full) {
            // 1-based in the checkpoint (transformers: `layer_types[layer - 1]`).
            let mut kinds: Vec<Option<AttentionKind>> = vec![None; n_layers];
            for (list, key, kind) in [
                (&full, "full_attn_layers", AttentionKind::Mla),
                (&kda, "kda_layers", AttentionKind::LinearAttention),
            ] {
                for &layer in list.iter() {
                    if layer == 0 || layer > n_layers {
                        return Err(l.invalid(
                            key,
                            format!(
                                "layer {layer} is outside 1..={n_layers} (the list is 1-based)"
                            ),
                        ));
                    }
                    kinds[layer - 1] = Some(kind.clone());
                }
            }
            if let Some(i) = kinds.iter().position(Option::is_none) {
                return Err(l.invalid(
                    "kda_layers",
                    format!(
                        "layer {} is in neither kda_layers nor full_attn_layers",
                        i + 1
                    ),
                ));
            }
            attention = Some(kinds.into_iter().flatten().collect());
        }
        o.adopt(l);
    }
    if attention.is_none() {
        attention = Some(match o.opt_str_list("layer_types")? {
            Some(l) => {
                check_len(o, "layer_types", &l, n_layers)?;
                l.iter()
                    .map(|s| match s.as_str() {
                        "linear_attention" => AttentionKind::LinearAttention,
                        "full_attention" => AttentionKind::Mla,
                        other => AttentionKind::Unknown(other.to_string()),
                    })
                    .collect()
            }
            None => (0..n_layers)
                .map(|i| {
                    if i > 0 && i % 4 == 0 {
                        AttentionKind::Mla
                    } else {
                        AttentionKind::LinearAttention
                    }
                })
                .collect(),
        });
    }
    let attention = attention.unwrap_or_default();
    if attention.contains(&AttentionKind::LinearAttention) && linear_attention.is_none() {
        return Err(o.missing_for("linear_attn_config", "the linear-attention (KDA) layers"));
    }
    // transformers' KimiLinearAttention never applies RoPE (and does not read the field), and
    // every published Kimi Linear config says `true`: absent means no positional encoding.
    let use_nope = o.opt_bool("mla_use_nope")?.unwrap_or(true);
    let mla = if attention.contains(&AttentionKind::Mla) {
        Some(MlaDims {
            heads: o.req_dim("num_attention_heads")?,
            q_lora_rank: o.opt_usize("q_lora_rank")?.filter(|&r| r > 0),
            kv_lora_rank: o.req_dim("kv_lora_rank")?,
            qk_nope_head_dim: o.req_dim("qk_nope_head_dim")?,
            qk_rope_head_dim: o.req_usize("qk_rope_head_dim")?,
            v_head_dim: o.req_dim("v_head_dim")?,
            use_rope: !use_nope,
            rope_interleave: o.opt_bool("rope_interleave")?.unwrap_or(true),
        })
    } else {
        None
    };
    let experts = first_usize(o, &["num_experts", "num_local_experts", "n_routed_experts"])?
        .ok_or_else(|| o.missing("num_experts"))?;
    let first_k = o.usize_or("first_k_dense_replace", 1, &mut w)?;
    let ffn: Vec<FfnKind> = match o.opt_str_list("mlp_layer_types")? {
        Some(l) => {
            check_len(o, "mlp_layer_types", &l, n_layers)?;
            l.iter().map(|s| mlp_kind(s)).collect()
        }
        None => (0..n_layers)
            .map(|i| {
                if i < first_k || experts == 0 {
                    FfnKind::Dense
                } else {
                    FfnKind::Moe
                }
            })
            .collect(),
    };
    o.seen("moe_layer_freq");
    let weight_format = weight_format(o)?;
    let moe = if experts > 0 {
        let moe_inter = o.req_dim("moe_intermediate_size")?;
        let shared = first_usize(o, &["num_shared_experts", "n_shared_experts"])?.unwrap_or(1);
        let router = match o
            .opt_str("moe_router_activation_func")?
            .unwrap_or("sigmoid")
        {
            "sigmoid" => RouterKind::SigmoidGroupTopk,
            "softmax" => RouterKind::SoftmaxTopk,
            other => RouterKind::Unknown(other.to_string()),
        };
        let norm = match o.opt_bool("moe_renormalize")? {
            Some(b) => {
                o.seen("norm_topk_prob");
                b
            }
            None => o.bool_or("norm_topk_prob", true, &mut w)?,
        };
        let m = MoeDims {
            activation: ExpertActivation::Swiglu,
            biases: false,
            experts,
            experts_per_token: first_usize(o, &["num_experts_per_token", "num_experts_per_tok"])?
                .ok_or_else(|| o.missing("num_experts_per_token"))?,
            intermediate_size: moe_inter,
            shared_experts: shared,
            shared_intermediate_size: moe_inter * shared,
            shared_expert_gate: false,
            router,
            n_group: first_usize(o, &["num_expert_group", "n_group"])?.unwrap_or(1),
            topk_group: o.opt_usize("topk_group")?.unwrap_or(1),
            norm_topk_prob: norm,
            routed_scaling_factor: o.f64_or("routed_scaling_factor", 2.446, &mut w)?,
            expert_format: expert_weight_format(o)?,
        };
        check_moe(o, &m)?;
        Some(m)
    } else {
        None
    };
    let dense_mlp = dense_mlp_dims(o, &ffn)?;
    // Kimi Linear's full-attention layers use no positional encoding when `mla_use_nope`.
    let rope = if mla.as_ref().is_some_and(|m| m.use_rope) {
        Some(parse_rope(o, 1.0, &mut w)?)
    } else {
        o.ignore(&["rope_theta", "rope_scaling", "rope_parameters"]);
        None
    };
    let layers = attention
        .into_iter()
        .zip(ffn)
        .map(|(attention, ffn)| LayerSpec { attention, ffn })
        .collect();
    Ok(ModelConfig {
        source: o.file.to_string(),
        model_type: model_type.to_string(),
        family: Family::KimiLinear,
        hidden_size,
        vocab_size,
        rms_norm_eps: o.f64_or("rms_norm_eps", 1e-5, &mut w)?,
        tie_word_embeddings: o.bool_or("tie_word_embeddings", false, &mut w)?,
        max_position_embeddings: first_usize(o, &["max_position_embeddings", "model_max_length"])?,
        rope,
        mla,
        indexer: None,
        gqa: None,
        linear_attention,
        dense_mlp,
        moe,
        layers,
        weight_format,
        warnings: w,
        vision: None,
    })
}

/// day0's hybrid schema (module docs).
fn hybrid(o: &Obj, model_type: &str) -> Result<ModelConfig, ModelError> {
    let mut w = Vec::new();
    o.seen("name");
    o.seen("description");
    let hidden_size = o.req_dim("hidden_size")?;
    let vocab_size = o.req_dim("vocab_size")?;
    let entries = o
        .opt_obj_list("layers")?
        .ok_or_else(|| o.missing("layers"))?;
    if entries.is_empty() {
        return Err(o.invalid("layers", "must list at least one layer"));
    }
    let linear_section = o.opt_obj("linear_attention")?;
    let section_decay = match &linear_section {
        Some(l) => match l.opt_str("decay")?.unwrap_or("scalar") {
            "scalar" | "gdn" => Some(Decay::Scalar),
            "per_channel" | "kda" => Some(Decay::PerChannel),
            other => {
                return Err(l.invalid(
                    "decay",
                    format!("`{other}`: expected \"scalar\" (GDN) or \"per_channel\" (KDA)"),
                ))
            }
        },
        None => None,
    };
    let mut layers = Vec::new();
    let mut forced_decay: Option<Decay> = None;
    for e in &entries {
        let att = e.req_str("attention")?;
        let ffn = e.req_str("ffn")?;
        let repeat = match e.opt_usize("repeat")? {
            Some(0) => return Err(e.invalid("repeat", "must be at least 1")),
            Some(r) => r,
            None => 1,
        };
        let attention = match att {
            "mla" | "dense" | "dense_mla" => AttentionKind::Mla,
            "dsa" | "sparse_mla" => AttentionKind::SparseMla,
            "linear" => AttentionKind::LinearAttention,
            "gdn" | "kda" => {
                let d = if att == "gdn" {
                    Decay::Scalar
                } else {
                    Decay::PerChannel
                };
                if let Some(prev) = forced_decay.or(section_decay) {
                    if prev != d {
                        return Err(e.invalid(
                            "attention",
                            "mixes GDN and KDA layers; one linear_attention section describes one decay",
                        ));
                    }
                }
                forced_decay = Some(d);
                AttentionKind::LinearAttention
            }
            other => AttentionKind::Unknown(other.to_string()),
        };
        let ffn = match ffn {
            "dense" => FfnKind::Dense,
            "moe" => FfnKind::Moe,
            other => FfnKind::Unknown(other.to_string()),
        };
        for _ in 0..repeat {
            layers.push(LayerSpec {
                attention: attention.clone(),
                ffn: ffn.clone(),
            });
        }
        o.adopt(e);
    }
    if let Some(n) = o.opt_usize("num_hidden_layers")? {
        if n != layers.len() {
            return Err(o.invalid(
                "num_hidden_layers",
                format!("is {n} but `layers` expands to {} layers", layers.len()),
            ));
        }
    }
    let uses = |k: &AttentionKind| layers.iter().any(|l| &l.attention == k);
    let needs_mla = uses(&AttentionKind::Mla) || uses(&AttentionKind::SparseMla);
    let mla_section = o.opt_obj("mla")?;
    let mla = match (&mla_section, needs_mla) {
        (Some(m), _) => {
            let q = if m.contains("q_lora_rank") {
                m.opt_usize("q_lora_rank")?
            } else {
                return Err(m.missing_for(
                    "q_lora_rank",
                    "the mla section (null for no query compression)",
                ));
            };
            let dims = MlaDims {
                heads: m.req_dim("num_heads")?,
                q_lora_rank: q.filter(|&r| r > 0),
                kv_lora_rank: m.req_dim("kv_lora_rank")?,
                qk_nope_head_dim: m.req_dim("qk_nope_head_dim")?,
                qk_rope_head_dim: m.req_dim("qk_rope_head_dim")?,
                v_head_dim: m.req_dim("v_head_dim")?,
                use_rope: true,
                rope_interleave: m.opt_bool("rope_interleave")?.unwrap_or(true),
            };
            o.adopt(m);
            Some(dims)
        }
        (None, true) => return Err(o.missing_for("mla", "layers of attention kind mla/dsa")),
        (None, false) => None,
    };
    let indexer = match (o.opt_obj("indexer")?, uses(&AttentionKind::SparseMla)) {
        (Some(i), _) => {
            let dims = IndexerDims {
                heads: i.req_dim("n_heads")?,
                head_dim: i.req_dim("head_dim")?,
                topk: i.req_dim("topk")?,
                rope_interleaved: false,
            };
            o.adopt(&i);
            Some(dims)
        }
        (None, true) => return Err(o.missing_for("indexer", "layers of attention kind dsa")),
        (None, false) => None,
    };
    let linear_attention = match (&linear_section, uses(&AttentionKind::LinearAttention)) {
        (Some(l), _) => {
            let key_heads = l.req_dim("num_key_heads")?;
            let value_heads = l.req_dim("num_value_heads")?;
            if value_heads % key_heads != 0 {
                return Err(l.invalid(
                    "num_value_heads",
                    format!("{value_heads} is not a multiple of num_key_heads {key_heads}"),
                ));
            }
            let dims = LinearAttnDims {
                key_heads,
                value_heads,
                key_head_dim: l.req_dim("key_head_dim")?,
                value_head_dim: l.req_dim("value_head_dim")?,
                conv_kernel: l.opt_usize("conv_kernel")?.unwrap_or(4),
                decay: forced_decay.or(section_decay).unwrap_or(Decay::Scalar),
            };
            o.adopt(l);
            Some(dims)
        }
        (None, true) => {
            return Err(o.missing_for(
                "linear_attention",
                "layers of attention kind linear/gdn/kda",
            ))
        }
        (None, false) => None,
    };
    let dense_mlp = match (
        o.opt_obj("dense_mlp")?,
        layers.iter().any(|l| l.ffn == FfnKind::Dense),
    ) {
        (Some(d), _) => {
            let dims = DenseMlpDims {
                intermediate_size: d.req_dim("intermediate_size")?,
            };
            o.adopt(&d);
            Some(dims)
        }
        (None, true) => return Err(o.missing_for("dense_mlp", "layers of ffn kind dense")),
        (None, false) => None,
    };
    let moe = match (
        o.opt_obj("moe")?,
        layers.iter().any(|l| l.ffn == FfnKind::Moe),
    ) {
        (Some(m), _) => {
            let inter = m.req_dim("intermediate_size")?;
            let shared = m.opt_usize("shared_experts")?.unwrap_or(0);
            let router = match m.opt_str("router")?.unwrap_or("sigmoid_group_topk") {
                "sigmoid_group_topk" => RouterKind::SigmoidGroupTopk,
                "softmax_topk" => RouterKind::SoftmaxTopk,
                other => RouterKind::Unknown(other.to_string()),
            };
            let expert_format = match m.opt_str("expert_format")?.unwrap_or("bf16") {
                "bf16" | "float" => WeightFormat::Float,
                "mxfp4" => WeightFormat::Mxfp4,
                "fp8" => WeightFormat::Fp8Block { block: [128, 128] },
                other => WeightFormat::Other(other.to_string()),
            };
            let dims = MoeDims {
                activation: ExpertActivation::Swiglu,
                biases: false,
                experts: m.req_dim("num_experts")?,
                experts_per_token: m.req_dim("experts_per_token")?,
                intermediate_size: inter,
                shared_experts: shared,
                shared_intermediate_size: m
                    .opt_usize("shared_intermediate_size")?
                    .unwrap_or(inter * shared),
                shared_expert_gate: m.opt_bool("shared_expert_gate")?.unwrap_or(false),
                router,
                n_group: m.opt_usize("n_group")?.unwrap_or(1),
                topk_group: m.opt_usize("topk_group")?.unwrap_or(1),
                norm_topk_prob: m.opt_bool("norm_topk_prob")?.unwrap_or(true),
                routed_scaling_factor: m.opt_f64("routed_scaling_factor")?.unwrap_or(1.0),
                expert_format,
            };
            check_moe(&m, &dims)?;
            o.adopt(&m);
            Some(dims)
        }
        (None, true) => return Err(o.missing_for("moe", "layers of ffn kind moe")),
        (None, false) => None,
    };
    let rope = if needs_mla {
        Some(parse_rope(o, 1.0, &mut w)?)
    } else {
        o.ignore(&["rope_theta", "rope_scaling", "rope_parameters"]);
        None
    };
    Ok(ModelConfig {
        source: o.file.to_string(),
        model_type: model_type.to_string(),
        family: Family::Day0Hybrid,
        hidden_size,
        vocab_size,
        rms_norm_eps: o.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
        tie_word_embeddings: o.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        max_position_embeddings: o.opt_usize("max_position_embeddings")?,
        rope,
        mla,
        indexer,
        gqa: None,
        linear_attention,
        dense_mlp,
        moe,
        layers,
        weight_format: weight_format(o)?,
        warnings: w,
        vision: None,
    })
}
