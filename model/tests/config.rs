//! Configuration parsing: the published DeepSeek-V3.2 and Kimi-K2 files, Qwen3-Next, Kimi Linear,
//! Qwen3-MoE, Llama 3.1 and Mixtral, day0's hybrid schema; RoPE from either key; errors that name the field and the file; unknown
//! fields as warnings.

use model::config::{
    load_config, parse_config, AttentionKind, ConfigWarning, Decay, Family, FfnKind, ModelError,
    RopeScaling, RouterKind, WeightFormat,
};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn text(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).expect("test data file")
}

/// The test file as JSON, edited by `f`, re-serialised.
fn edited(name: &str, f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let mut v: Value = serde_json::from_str(&text(name)).expect("valid test JSON");
    f(v.as_object_mut().expect("object"));
    v.to_string()
}

#[test]
fn deepseek_v32_published_config() {
    let c = load_config(&testdata("deepseek_v32_config.json")).expect("parses");
    assert_eq!(c.family, Family::DeepseekV32);
    assert_eq!(c.model_type, "deepseek_v32");
    assert_eq!((c.hidden_size, c.vocab_size), (7168, 129280));
    assert_eq!(c.num_layers(), 61);
    assert!(c
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::SparseMla));
    assert!(c.layers[..3].iter().all(|l| l.ffn == FfnKind::Dense));
    assert!(c.layers[3..].iter().all(|l| l.ffn == FfnKind::Moe));
    let m = c.mla.as_ref().expect("mla");
    assert_eq!(
        (m.heads, m.q_lora_rank, m.kv_lora_rank),
        (128, Some(1536), 512)
    );
    assert_eq!(
        (m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
        (128, 64, 128)
    );
    assert_eq!(m.latent_dim(), 576);
    let ix = c.indexer.as_ref().expect("indexer");
    assert_eq!((ix.heads, ix.head_dim, ix.topk), (64, 128, 2048));
    let moe = c.moe.as_ref().expect("moe");
    assert_eq!(
        (moe.experts, moe.experts_per_token, moe.intermediate_size),
        (256, 8, 2048)
    );
    assert_eq!(
        (moe.shared_experts, moe.shared_intermediate_size),
        (1, 2048)
    );
    assert_eq!((moe.n_group, moe.topk_group), (8, 4));
    assert_eq!(moe.router, RouterKind::SigmoidGroupTopk);
    assert!(moe.norm_topk_prob);
    assert_eq!(moe.routed_scaling_factor, 2.5);
    assert_eq!(c.dense_mlp.as_ref().unwrap().intermediate_size, 18432);
    assert_eq!(
        c.weight_format,
        WeightFormat::Fp8Block { block: [128, 128] }
    );
    let rope = c.rope.as_ref().expect("rope");
    assert_eq!(rope.source, Some("rope_scaling"));
    assert_eq!(rope.theta, 10000.0);
    match rope.scaling {
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale_all_dim,
            ..
        } => {
            assert_eq!(factor, 40.0);
            assert_eq!(original_max_position_embeddings, 4096);
            assert_eq!((beta_fast, beta_slow, mscale_all_dim), (32.0, 1.0, 1.0));
        }
        ref other => panic!("expected YaRN, got {other:?}"),
    }
    // τ = (nope + rope)^-1/2 · m², m = 0.1 · mscale_all_dim · ln(factor) + 1.
    let mscale = 0.1 * 40f64.ln() + 1.0;
    let want = 192f64.powf(-0.5) * mscale * mscale;
    assert!((rope.mla_softmax_scale(192) - want).abs() < 1e-12);
    // Every field of the published file is known.
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
    // The MTP layer is reported as not part of the graph, not silently dropped.
    assert!(c.warnings.iter().any(|w| matches!(w,
        ConfigWarning::Ignored { field, .. } if field == "num_nextn_predict_layers")));
}

#[test]
fn kimi_k2_published_config() {
    let c = load_config(&testdata("kimi_k2_config.json")).expect("parses");
    assert_eq!(c.family, Family::KimiK2);
    assert_eq!(c.num_layers(), 61);
    assert_eq!(c.vocab_size, 163840);
    assert!(c.layers.iter().all(|l| l.attention == AttentionKind::Mla));
    assert_eq!(c.layers[0].ffn, FfnKind::Dense);
    assert!(c.layers[1..].iter().all(|l| l.ffn == FfnKind::Moe));
    assert!(c.indexer.is_none());
    assert_eq!(c.mla.as_ref().unwrap().heads, 64);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.experts, moe.experts_per_token), (384, 8));
    assert_eq!((moe.n_group, moe.topk_group), (1, 1));
    assert_eq!(moe.routed_scaling_factor, 2.827);
    let rope = c.rope.as_ref().unwrap();
    assert_eq!(rope.theta, 50000.0);
    assert!(matches!(rope.scaling, RopeScaling::Yarn { factor, .. } if factor == 32.0));
    // auto_map, aux_loss_alpha, seq_aux, pretraining_tp... are known to the reference.
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
}

#[test]
fn qwen3_next_layers_from_full_attention_interval() {
    let c = load_config(&testdata("qwen3_next_config.json")).expect("parses");
    assert_eq!(c.family, Family::Qwen3Next);
    assert_eq!(c.num_layers(), 48);
    for (i, l) in c.layers.iter().enumerate() {
        let want = if (i + 1) % 4 == 0 {
            AttentionKind::Gqa
        } else {
            AttentionKind::LinearAttention
        };
        assert_eq!(l.attention, want, "layer {i}");
        assert_eq!(l.ffn, FfnKind::Moe, "layer {i}");
    }
    let g = c.gqa.as_ref().unwrap();
    assert_eq!((g.heads, g.kv_heads, g.head_dim), (16, 2, 256));
    assert!(g.output_gate && g.qk_norm);
    let l = c.linear_attention.as_ref().unwrap();
    assert_eq!(
        (l.key_heads, l.value_heads, l.key_head_dim, l.value_head_dim),
        (16, 32, 128, 128)
    );
    assert_eq!((l.conv_kernel, l.decay), (4, Decay::Scalar));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (moe.experts, moe.experts_per_token, moe.intermediate_size),
        (512, 10, 512)
    );
    assert_eq!(moe.shared_intermediate_size, 512);
    assert!(moe.shared_expert_gate);
    assert_eq!(moe.router, RouterKind::SoftmaxTopk);
    let rope = c.rope.as_ref().unwrap();
    assert_eq!(rope.partial_rotary_factor, 0.25);
    assert_eq!(rope.theta, 5_000_000.0);
    // `"rope_scaling": null` is plain RoPE.
    assert_eq!(
        (rope.scaling.clone(), rope.source),
        (RopeScaling::None, None)
    );
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
}

#[test]
fn qwen3_next_explicit_layer_types_win_and_unknown_kinds_are_kept() {
    let t = edited("qwen3_next_config.json", |m| {
        let mut kinds = vec![Value::from("linear_attention"); 48];
        kinds[0] = Value::from("full_attention");
        kinds[5] = Value::from("sliding_attention");
        m.insert("layer_types".into(), Value::from(kinds));
    });
    let c = parse_config(&t, "qwen3_next_edited.json").expect("parses");
    assert_eq!(c.layers[0].attention, AttentionKind::Gqa);
    assert_eq!(c.layers[3].attention, AttentionKind::LinearAttention);
    assert_eq!(
        c.layers[5].attention,
        AttentionKind::Unknown("sliding_attention".into())
    );
}

#[test]
fn kimi_linear_layers_from_linear_attn_config() {
    let c = load_config(&testdata("kimi_linear_config.json")).expect("parses");
    assert_eq!(c.family, Family::KimiLinear);
    assert_eq!(c.num_layers(), 27);
    // `full_attn_layers` is 1-based: 4, 8, ..., 24, 27.
    let full: Vec<usize> = c
        .layers
        .iter()
        .enumerate()
        .filter(|(_, l)| l.attention == AttentionKind::Mla)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(full, vec![3, 7, 11, 15, 19, 23, 26]);
    let l = c.linear_attention.as_ref().unwrap();
    assert_eq!(
        (l.key_heads, l.value_heads, l.key_head_dim, l.decay),
        (32, 32, 128, Decay::PerChannel)
    );
    let m = c.mla.as_ref().unwrap();
    assert_eq!(m.q_lora_rank, None);
    assert!(!m.use_rope, "mla_use_nope: no positional encoding");
    assert!(c.rope.is_none());
    assert_eq!(c.layers[0].ffn, FfnKind::Dense);
    assert!(c.layers[1..].iter().all(|l| l.ffn == FfnKind::Moe));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (moe.experts, moe.experts_per_token, moe.shared_experts),
        (256, 8, 1)
    );
    assert_eq!(c.max_position_embeddings, Some(1048576));
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
}

#[test]
fn day0_hybrid_schema() {
    let c = load_config(&testdata("day0_hybrid_config.json")).expect("parses");
    assert_eq!(c.family, Family::Day0Hybrid);
    assert_eq!(c.num_layers(), 12);
    let kinds: Vec<&str> = c
        .layers
        .iter()
        .map(|l| match l.attention {
            AttentionKind::Mla => "mla",
            AttentionKind::SparseMla => "dsa",
            AttentionKind::LinearAttention => "lin",
            _ => "?",
        })
        .collect();
    assert_eq!(
        kinds,
        ["mla", "lin", "lin", "lin", "dsa", "lin", "lin", "lin", "dsa", "lin", "lin", "dsa"]
    );
    assert_eq!(c.layers[0].ffn, FfnKind::Dense);
    assert!(c.layers[1..].iter().all(|l| l.ffn == FfnKind::Moe));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(moe.expert_format, WeightFormat::Mxfp4);
    assert_eq!((moe.n_group, moe.topk_group), (8, 4));
    let rope = c.rope.as_ref().unwrap();
    assert_eq!(rope.source, Some("rope_parameters"));
    assert!(matches!(rope.scaling, RopeScaling::Yarn { factor, .. } if factor == 40.0));
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn rope_parameters_and_rope_scaling_read_the_same() {
    // transformers 5 writes `rope_parameters` with `rope_type` and `rope_theta` inside.
    let t = edited("kimi_k2_config.json", |m| {
        let mut p = m.remove("rope_scaling").unwrap();
        let theta = m.remove("rope_theta").unwrap();
        let p = p.as_object_mut().unwrap();
        p.remove("type");
        p.insert("rope_type".into(), Value::from("yarn"));
        p.insert("rope_theta".into(), theta);
        m.insert("rope_parameters".into(), Value::Object(p.clone()));
    });
    let new = parse_config(&t, "k2_rope_parameters.json").expect("parses");
    let old = load_config(&testdata("kimi_k2_config.json")).unwrap();
    let (a, b) = (new.rope.clone().unwrap(), old.rope.unwrap());
    assert_eq!(a.source, Some("rope_parameters"));
    assert_eq!(b.source, Some("rope_scaling"));
    assert_eq!((a.theta, a.scaling), (b.theta, b.scaling));
    assert!(
        new.unknown_fields().is_empty(),
        "{:?}",
        new.unknown_fields()
    );
}

#[test]
fn rope_scaling_wins_over_rope_parameters() {
    let t = edited("deepseek_v32_config.json", |m| {
        let p: Value = serde_json::json!({"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0});
        m.insert("rope_parameters".into(), p);
    });
    let c = parse_config(&t, "both.json").expect("parses");
    let rope = c.rope.unwrap();
    assert!(matches!(rope.scaling, RopeScaling::Yarn { factor, .. } if factor == 40.0));
    assert_eq!(rope.theta, 10000.0);
    assert!(c.warnings.iter().any(|w| matches!(w,
        ConfigWarning::Ignored { field, .. } if field == "rope_parameters")));
}

#[test]
fn missing_required_field_names_field_and_file() {
    let t = edited("deepseek_v32_config.json", |m| {
        m.remove("index_topk");
    });
    let e = parse_config(&t, "v32_without_topk.json").unwrap_err();
    match &e {
        ModelError::MissingField { file, field, .. } => {
            assert_eq!(file, "v32_without_topk.json");
            assert_eq!(field, "index_topk");
        }
        other => panic!("expected MissingField, got {other:?}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains("index_topk") && msg.contains("v32_without_topk.json"),
        "{msg}"
    );
    assert!(msg.contains("deepseek_v32"), "{msg}");

    // A shape field of K2, and q_lora_rank, which must be present even when null.
    for field in [
        "hidden_size",
        "kv_lora_rank",
        "n_routed_experts",
        "q_lora_rank",
    ] {
        let t = edited("kimi_k2_config.json", |m| {
            m.remove(field);
        });
        let e = parse_config(&t, "k2.json").unwrap_err();
        assert_eq!(e.field(), Some(field), "{e}");
        assert_eq!(e.file(), "k2.json");
    }
    // Nested fields are named with their section.
    let t = edited("day0_hybrid_config.json", |m| {
        m["indexer"].as_object_mut().unwrap().remove("topk");
    });
    let e = parse_config(&t, "hybrid.json").unwrap_err();
    assert_eq!(e.field(), Some("indexer.topk"), "{e}");
    // A section a layer kind needs.
    let t = edited("day0_hybrid_config.json", |m| {
        m.remove("linear_attention");
    });
    let e = parse_config(&t, "hybrid.json").unwrap_err();
    assert_eq!(e.field(), Some("linear_attention"), "{e}");
    assert!(e.to_string().contains("linear"), "{e}");
    // The YaRN factor inside the rope dict.
    let t = edited("deepseek_v32_config.json", |m| {
        m["rope_scaling"].as_object_mut().unwrap().remove("factor");
    });
    let e = parse_config(&t, "v32.json").unwrap_err();
    assert_eq!(e.field(), Some("rope_scaling.factor"), "{e}");
}

#[test]
fn null_q_lora_rank_means_no_query_compression() {
    let t = edited("kimi_k2_config.json", |m| {
        m.insert("q_lora_rank".into(), Value::Null);
    });
    let c = parse_config(&t, "k2.json").expect("parses");
    assert_eq!(c.mla.unwrap().q_lora_rank, None);
}

#[test]
fn malformed_json_is_an_error_with_position() {
    let e = load_config(&testdata("malformed_config.json")).unwrap_err();
    match &e {
        ModelError::Json {
            file, line, column, ..
        } => {
            assert!(file.ends_with("malformed_config.json"), "{file}");
            // The missing comma after "qk_nope_head_dim": 128 is noticed on the next line.
            assert_eq!(*line, 10);
            assert!(*column > 0);
        }
        other => panic!("expected Json, got {other:?}"),
    }
    assert!(e.to_string().contains("malformed JSON"), "{e}");
    // Not an object at all.
    let e = parse_config("[1, 2]", "array.json").unwrap_err();
    assert!(matches!(e, ModelError::WrongType { .. }), "{e:?}");
    // Empty file.
    let e = parse_config("", "empty.json").unwrap_err();
    assert!(matches!(e, ModelError::Json { .. }), "{e:?}");
}

#[test]
fn unknown_fields_are_warnings_not_errors() {
    let t = edited("deepseek_v32_config.json", |m| {
        m.insert("index_warmup_steps".into(), Value::from(4));
        m["rope_scaling"]
            .as_object_mut()
            .unwrap()
            .insert("new_knob".into(), Value::from(1));
    });
    let c = parse_config(&t, "v32_plus.json").expect("unknown fields are not fatal");
    let mut unknown = c.unknown_fields();
    unknown.sort();
    assert_eq!(unknown, vec!["index_warmup_steps", "rope_scaling.new_knob"]);
    assert!(c
        .warnings
        .iter()
        .any(|w| w.to_string().contains("unknown field `index_warmup_steps`")));
}

#[test]
fn wrong_types_and_invalid_values_are_errors() {
    let t = edited("kimi_k2_config.json", |m| {
        m.insert("hidden_size".into(), Value::from("7168"));
    });
    let e = parse_config(&t, "k2.json").unwrap_err();
    match &e {
        ModelError::WrongType {
            field, expected, ..
        } => {
            assert_eq!(field, "hidden_size");
            assert_eq!(*expected, "a non-negative integer");
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    // Group-limited routing that cannot be formed.
    let t = edited("deepseek_v32_config.json", |m| {
        m.insert("n_group".into(), Value::from(7));
    });
    let e = parse_config(&t, "v32.json").unwrap_err();
    assert_eq!(e.field(), Some("n_group"), "{e}");
    // A layer list of the wrong length.
    let t = edited("qwen3_next_config.json", |m| {
        m.insert(
            "layer_types".into(),
            Value::from(vec!["linear_attention"; 3]),
        );
    });
    let e = parse_config(&t, "q.json").unwrap_err();
    assert!(
        matches!(&e, ModelError::InvalidValue { field, .. } if field == "layer_types"),
        "{e:?}"
    );
    // Zero heads.
    let t = edited("kimi_k2_config.json", |m| {
        m.insert("num_attention_heads".into(), Value::from(0));
    });
    assert!(matches!(
        parse_config(&t, "k2.json").unwrap_err(),
        ModelError::InvalidValue { .. }
    ));
    // The hybrid's num_hidden_layers must match its expanded layer list.
    let t = edited("day0_hybrid_config.json", |m| {
        m.insert("num_hidden_layers".into(), Value::from(13));
    });
    let e = parse_config(&t, "hybrid.json").unwrap_err();
    assert_eq!(e.field(), Some("num_hidden_layers"));
}

/// A release that reuses a known architecture under a new `model_type` (GLM-5's `glm_moe_dsa` is
/// DeepSeek-V3.2's MLA + DSA at other sizes): day0 reads it with the schema its fields match,
/// keeps its name, says so in the first warning, and builds exactly the model the known type
/// builds.
#[test]
fn an_unknown_model_type_is_read_as_the_family_its_fields_match() {
    for (file, known, renamed, deciding) in [
        (
            "deepseek_v32_config.json",
            "deepseek_v32",
            "glm_moe_dsa",
            "index_topk",
        ),
        (
            "deepseek_v3_config.json",
            "deepseek_v3",
            "deepseek_v3_1",
            "kv_lora_rank",
        ),
        (
            "qwen3_next_config.json",
            "qwen3_next",
            "qwen3_5_moe",
            "linear_attention",
        ),
        (
            "kimi_linear_config.json",
            "kimi_linear",
            "kimi_linear_2",
            "linear_attn_config",
        ),
        (
            "qwen3_235b_a22b_config.json",
            "qwen3_moe",
            "qwen3_coder",
            "num_experts",
        ),
        (
            "mixtral_8x22b_config.json",
            "mixtral",
            "mixtral_2",
            "num_local_experts",
        ),
        (
            "llama31_405b_config.json",
            "llama",
            "llama_next",
            "dense decoder",
        ),
        (
            "tiny/deepseek_v2/config.json",
            "deepseek_v2",
            "deepseek_v2_5",
            "kv_lora_rank",
        ),
        (
            "tiny/glm4_moe/config.json",
            "glm4_moe",
            "glm4_6",
            "n_routed_experts",
        ),
        (
            "tiny/gpt_oss/config.json",
            "gpt_oss",
            "gpt_oss_2",
            "experts_per_token",
        ),
        (
            "tiny/qwen2/config.json",
            "qwen2",
            "qwen2_5",
            "max_window_layers",
        ),
        (
            "tiny/qwen2_moe/config.json",
            "qwen2_moe",
            "qwen2_5_moe",
            "shared_expert",
        ),
        (
            "tiny/mistral/config.json",
            "mistral",
            "ministral",
            "sliding_window",
        ),
        (
            "minimax_m2_config.json",
            "minimax_m2",
            "minimax_m3",
            "use_routing_bias",
        ),
        (
            "ernie45_21b_a3b_config.json",
            "ernie4_5_moe",
            "ernie5_moe",
            "moe_num_experts",
        ),
    ] {
        let original = load_config(&testdata(file)).expect("parses");
        assert_eq!(original.model_type, known, "{file}");
        let text = edited(file, |m| {
            m.insert("model_type".into(), Value::from(renamed));
        });
        let cfg = parse_config(&text, "renamed.json").expect("an inferred family parses");
        assert_eq!(cfg.model_type, renamed);
        match &cfg.warnings[0] {
            ConfigWarning::InferredFamily {
                model_type,
                parsed_as,
                because,
            } => {
                assert_eq!((model_type.as_str(), parsed_as.as_str()), (renamed, known));
                assert!(because.contains(deciding), "{file}: {because}");
            }
            other => panic!("{file}: first warning {other:?}"),
        }
        let shown = cfg.warnings[0].to_string();
        assert!(shown.contains(renamed) && shown.contains(known), "{shown}");
        let mut same = cfg.clone();
        same.model_type = original.model_type.clone();
        same.source = original.source.clone();
        same.warnings.remove(0);
        assert_eq!(same, original, "{file} renamed {renamed}");
    }
    // A multimodal release nests its language model under `text_config` (Qwen3.5): that model
    // is read, the top level's tie wins, and the rest (the vision tower) is reported unknown.
    let mut inner_text: Value = serde_json::from_str(&text("qwen3_next_config.json")).unwrap();
    inner_text["tie_word_embeddings"] = Value::from(false);
    let wrapped = serde_json::json!({
        "model_type": "qwen3_5_moe",
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "tie_word_embeddings": true,
        "vision_config": {"depth": 27},
        "text_config": inner_text,
    });
    let cfg = parse_config(&wrapped.to_string(), "q35.json").expect("parses");
    let original = load_config(&testdata("qwen3_next_config.json")).unwrap();
    assert_eq!(
        (cfg.family, cfg.model_type.as_str()),
        (Family::Qwen3Next, "qwen3_5_moe")
    );
    assert_eq!(cfg.layers, original.layers);
    assert_eq!(
        (cfg.linear_attention.clone(), cfg.moe.clone()),
        (original.linear_attention.clone(), original.moe.clone())
    );
    assert!(cfg.tie_word_embeddings, "the top level's tie wins");
    assert!(
        cfg.warnings[0].to_string().contains("`text_config`"),
        "{}",
        cfg.warnings[0]
    );
    let unknown: Vec<String> = cfg
        .warnings
        .iter()
        .filter_map(|w| match w {
            ConfigWarning::UnknownField { field } => Some(field.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(unknown, ["vision_config"], "{:?}", cfg.warnings);
    // Nothing that names an architecture: still refused, naming the type.
    let e = parse_config(
        r#"{"model_type": "mamba9", "hidden_size": 64, "state_size": 16}"#,
        "m.json",
    )
    .unwrap_err();
    assert!(
        matches!(&e, ModelError::UnsupportedModelType { model_type, .. } if model_type == "mamba9")
    );
}

/// An unknown `model_type` whose fields match a known family except for fields that reshape the
/// network is refused, naming them: Hunyuan's experts (`moe_*` lists) under a dense decoder's fields,
/// Llama-4's interleaved MoE layers under Mixtral's (a derivative under a new name: `llama4_text`
/// itself has its parser), a MiniMax-like sigmoid router and partial RoPE.
/// The same fields set to nothing (0, false, null) change nothing and pass.
#[test]
fn inferred_family_refuses_fields_that_reshape_the_network() {
    let cases: [(&str, &str, serde_json::Value, &[&str]); 3] = [
        (
            "llama31_405b_config.json",
            "hunyuan_next",
            serde_json::json!({"moe_topk": [8], "num_shared_expert": [1],
                "moe_intermediate_size": [3584], "use_mixed_mlp_moe": true}),
            &["moe_topk", "num_shared_expert", "moe_intermediate_size"],
        ),
        (
            "mixtral_8x22b_config.json",
            "llama4_derivative",
            serde_json::json!({"interleave_moe_layer_step": 2, "intermediate_size_mlp": 16384,
                "attention_chunk_size": 8192}),
            &[
                "interleave_moe_layer_step",
                "intermediate_size_mlp",
                "attention_chunk_size",
            ],
        ),
        (
            "mixtral_8x22b_config.json",
            "mixtral_sigmoid",
            serde_json::json!({"scoring_func": "sigmoid", "rotary_dim": 64,
                "shared_intermediate_size": 0, "router_aux_loss_coef": 0.001,
                "moe_router_dtype": "float32"}),
            &["scoring_func", "rotary_dim"],
        ),
    ];
    for (file, model_type, extra, named) in cases {
        let with = |m: &mut serde_json::Map<String, serde_json::Value>| {
            m.insert("model_type".into(), serde_json::json!(model_type));
            for (k, v) in extra.as_object().unwrap() {
                m.insert(k.clone(), v.clone());
            }
        };
        let e = parse_config(&edited(file, with), "new.json").unwrap_err();
        match &e {
            ModelError::UnexplainedFields {
                model_type: m,
                fields,
                ..
            } => {
                assert_eq!(m, model_type);
                let mut got: Vec<&str> = fields.iter().map(String::as_str).collect();
                let mut want = named.to_vec();
                if model_type == "hunyuan_next" {
                    want.push("use_mixed_mlp_moe");
                }
                got.sort();
                want.sort();
                assert_eq!(got, want, "{e}");
            }
            other => panic!("{model_type}: {other:?}"),
        }
        let shown = e.to_string();
        assert!(
            shown.contains("new.json") && shown.contains(model_type) && shown.contains(named[0]),
            "{shown}"
        );
        // Inside a multimodal file's `text_config` the fields are named with their path.
        let mut inner: serde_json::Value = serde_json::from_str(&edited(file, with)).unwrap();
        inner.as_object_mut().unwrap().remove("model_type");
        let wrapped = serde_json::json!({"model_type": "some_vl", "text_config": inner,
            "vision_config": {"depth": 2}});
        match parse_config(&wrapped.to_string(), "vl.json").unwrap_err() {
            ModelError::UnexplainedFields { fields, .. } => assert!(
                fields.iter().all(|f| f.starts_with("text_config.")),
                "{fields:?}"
            ),
            other => panic!("{model_type} in text_config: {other:?}"),
        }
    }
    // Set to nothing, the same kind of fields pass (with an unknown-field warning each).
    let cfg = parse_config(
        &edited("mixtral_8x22b_config.json", |m| {
            m.insert("model_type".into(), serde_json::json!("mixtral_next"));
            m.insert("shared_intermediate_size".into(), serde_json::json!(0));
            m.insert("use_qk_norm".into(), serde_json::json!(false));
            m.insert("attention_chunk_size".into(), serde_json::Value::Null);
        }),
        "inert.json",
    )
    .expect("inert fields pass");
    assert_eq!(cfg.family, Family::Mixtral);
    assert_eq!(cfg.unknown_fields().len(), 3, "{:?}", cfg.unknown_fields());
}

/// Llama 4's release files (Maverick's as a public TensorRT-LLM fixture transcribes it, Scout's
/// reconstructed from it; see model/testdata/README.md): the text model nested under
/// `text_config`, the vision encoder a warning. Scout: 48 layers, RoPE and 8192-token chunks in 3
/// of 4, NoPE with the attention temperature (`attn_temperature_tuning` written as 4) in every
/// 4th, L2 q/k norm, 16 experts + a shared one in every layer; Maverick: no q/k norm, 128 experts
/// in every other layer, dense MLPs of 16384 between. Counts against the model cards (Scout's
/// 109B includes its vision encoder: the language model is below it), complete coverage, and a
/// chunked layer's cache capped at a chunk.
#[test]
fn llama4_published_configs() {
    let scout = load_config(&testdata("llama4_scout_config.json")).expect("parses");
    let maverick = load_config(&testdata("llama4_maverick_config.json")).expect("parses");
    for c in [&scout, &maverick] {
        assert_eq!(
            (c.family, c.model_type.as_str()),
            (Family::Llama4, "llama4")
        );
        assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
        assert!(
            c.warnings.iter().any(
                |w| matches!(w, ConfigWarning::Ignored { field, .. } if field == "vision_config")
            ),
            "{:?}",
            c.warnings
        );
        assert_eq!(c.num_layers(), 48);
        for (i, l) in c.layers.iter().enumerate() {
            let want = match (i + 1) % 4 {
                0 => AttentionKind::NopeGqa,
                _ => AttentionKind::ChunkedGqa,
            };
            assert_eq!(l.attention, want, "layer {i}");
        }
        let g = c.gqa.as_ref().unwrap();
        assert_eq!((g.heads, g.kv_heads, g.head_dim), (40, 8, 128));
        assert_eq!(g.attention_chunk, Some(8192));
        assert!(g.rope_interleaved && !g.qk_norm);
        let t = g.temperature.expect("attention temperature");
        assert_eq!((t.floor_scale, t.attn_scale), (8192.0, 0.1));
        // 1 for the first 8191 positions, then ln 2 · 0.1 + 1.
        assert_eq!(t.at(8190), 1.0);
        assert!((t.at(8191) - (1.0 + 0.1 * 2f64.ln())).abs() < 1e-12);
        let m = c.moe.as_ref().unwrap();
        assert_eq!(m.router, RouterKind::SigmoidTopkScaledInput);
        assert_eq!(
            (m.experts_per_token, m.intermediate_size, m.shared_experts),
            (1, 8192, 1)
        );
        assert!(!m.norm_topk_prob && m.routed_scaling_factor == 1.0);
        let cov = model::coverage::Coverage::of_config(c);
        assert!(cov.is_complete(), "{}", cov.missing().join("; "));
        // A chunked layer keeps at most a chunk of keys, a NoPE layer its whole context.
        assert_eq!(c.keys_kept(0, 100_000), 8192);
        assert_eq!(c.keys_kept(3, 100_000), 100_000);
        assert_eq!(c.keys_kept(0, 5000), 5000);
    }
    assert!(scout.gqa.as_ref().unwrap().qk_l2_norm);
    assert!(!maverick.gqa.as_ref().unwrap().qk_l2_norm);
    assert_eq!(scout.moe.as_ref().unwrap().experts, 16);
    assert!(scout.layers.iter().all(|l| l.ffn == FfnKind::Moe));
    assert_eq!(maverick.moe.as_ref().unwrap().experts, 128);
    for (i, l) in maverick.layers.iter().enumerate() {
        let want = if i % 2 == 1 {
            FfnKind::Moe
        } else {
            FfnKind::Dense
        };
        assert_eq!(l.ffn, want, "layer {i}");
    }
    assert_eq!(
        maverick.dense_mlp.as_ref().unwrap().intermediate_size,
        16384
    );
    let (s, m) = (
        model::plan::params::count(&scout),
        model::plan::params::count(&maverick),
    );
    let rel = |got: u64, want: f64| got as f64 / want - 1.0;
    assert!(rel(m.total(), 400e9).abs() < 0.01, "{}", m.total());
    assert!(
        (-0.02..0.0).contains(&rel(s.total(), 109e9)),
        "{}",
        s.total()
    );
    for n in [&s, &m] {
        assert!(rel(n.active(), 17e9).abs() < 0.03, "{}", n.active());
    }
    // Without the temperature, or with a null chunk size (full attention with RoPE), or a chunked
    // layer without RoPE.
    let edit = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        parse_config(
            &edited("llama4_scout_config.json", |m| {
                f(m["text_config"].as_object_mut().unwrap())
            }),
            "s.json",
        )
    };
    let off = edit(&|t| {
        t.insert("attn_temperature_tuning".into(), Value::Bool(false));
    })
    .unwrap();
    assert!(off.gqa.unwrap().temperature.is_none());
    let full = edit(&|t| {
        t.insert("attention_chunk_size".into(), Value::Null);
    })
    .unwrap();
    assert_eq!(full.layers[0].attention, AttentionKind::Gqa);
    assert!(full.gqa.unwrap().attention_chunk.is_none());
    let e = edit(&|t| {
        t.insert(
            "layer_types".into(),
            serde_json::json!(vec!["chunked_attention"; 48]),
        );
    })
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("layer 3 attends in chunks without RoPE"),
        "{e}"
    );
    let e = edit(&|t| {
        t.insert("no_rope_layers".into(), serde_json::json!([1, 0]));
    })
    .unwrap_err();
    assert!(e.to_string().contains("no_rope_layers"), "{e}");
}

/// Ant Group's `bailing_moe`: Ling-lite-1.5's published file (softmax top-6 of 64 renormalised, 2
/// shared experts, no q/k norm: 16.8B total and 2.75B active on its model card) and a Ling-1T-sized
/// Ling 2.0 file (constructed, see model/testdata/README.md: sigmoid routing with the expert bias
/// in 8 groups keep 4, one shared expert, 4 dense layers, q/k RMSNorm, RoPE on half of each head;
/// 1T total, about 50B active). Both fully covered; numeric runs refuse the family; a LayerNorm
/// q/k norm and biased projections are errors.
#[test]
fn bailing_moe_configs() {
    let lite = load_config(&testdata("ling_lite_15_config.json")).expect("parses");
    assert_eq!(lite.family, Family::BailingMoe);
    assert!(
        lite.unknown_fields().is_empty(),
        "{:?}",
        lite.unknown_fields()
    );
    let m = lite.moe.as_ref().unwrap();
    assert_eq!(m.router, RouterKind::SoftmaxTopk);
    assert_eq!(
        (m.experts, m.experts_per_token, m.shared_intermediate_size),
        (64, 6, 2 * 1408)
    );
    assert_eq!((m.n_group, m.topk_group), (1, 1));
    assert!(m.norm_topk_prob && !lite.gqa.as_ref().unwrap().qk_norm);
    assert!(lite.layers.iter().all(|l| l.ffn == FfnKind::Moe));
    let n = model::plan::params::count(&lite);
    assert!(
        (n.total() as f64 / 16.8e9 - 1.0).abs() < 0.03,
        "{}",
        n.total()
    );
    assert!(
        (n.active() as f64 / 2.75e9 - 1.0).abs() < 0.03,
        "{}",
        n.active()
    );

    let big = load_config(&testdata("ling_1t_config.json")).expect("parses");
    assert!(
        big.unknown_fields().is_empty(),
        "{:?}",
        big.unknown_fields()
    );
    let m = big.moe.as_ref().unwrap();
    assert_eq!(m.router, RouterKind::SigmoidGroupTopk);
    assert_eq!(
        (m.n_group, m.topk_group, m.routed_scaling_factor),
        (8, 4, 2.5)
    );
    assert_eq!((m.shared_experts, m.shared_intermediate_size), (1, 2048));
    let g = big.gqa.as_ref().unwrap();
    assert!(g.qk_norm && !g.qk_norm_across_heads);
    assert_eq!(big.rope.as_ref().unwrap().partial_rotary_factor, 0.5);
    assert_eq!(
        big.layers
            .iter()
            .filter(|l| l.ffn == FfnKind::Dense)
            .count(),
        4
    );
    let n = model::plan::params::count(&big);
    assert!(
        (n.total() as f64 / 1e12 - 1.0).abs() < 0.01,
        "{}",
        n.total()
    );
    assert!(
        (n.active() as f64 / 50e9 - 1.0).abs() < 0.05,
        "{}",
        n.active()
    );
    for c in [&lite, &big] {
        let cov = model::coverage::Coverage::of_config(c);
        assert!(cov.is_complete(), "{}", cov.missing().join("; "));
    }
    // A sigmoid router without the expert bias is kept by name and reported missing.
    let odd = parse_config(
        &edited("ling_1t_config.json", |m| {
            m.insert("moe_router_enable_expert_bias".into(), Value::Bool(false));
        }),
        "odd.json",
    )
    .unwrap();
    assert_eq!(
        odd.moe.as_ref().unwrap().router,
        RouterKind::Unknown("sigmoid_topk".into())
    );
    assert!(!model::coverage::Coverage::of_config(&odd).is_complete());
    for (key, value) in [("use_rmsnorm", false), ("use_qkv_bias", true)] {
        let e = parse_config(
            &edited("ling_1t_config.json", |m| {
                m.insert(key.into(), Value::Bool(value));
            }),
            "bad.json",
        )
        .unwrap_err();
        assert!(e.to_string().contains(key), "{e}");
    }
}

/// A multimodal wrapper that keeps `quantization_config` at its top level, beside `text_config`
/// (Llama 4's FP8 release, a VL wrapper around a DeepSeek-V3-style language model): the language
/// model takes its formats from there, whether its type is known or inferred, instead of being
/// read as floats.
#[test]
fn outer_quantization_config_reaches_the_language_model() {
    let fp8 = parse_config(
        &edited("llama4_maverick_config.json", |m| {
            m.insert(
                "quantization_config".into(),
                serde_json::json!({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0,
                    "modules_to_not_convert": ["vision_model"]}),
            );
        }),
        "maverick-fp8.json",
    )
    .unwrap();
    assert_eq!(
        fp8.moe.as_ref().unwrap().expert_format,
        WeightFormat::Other("fbgemm_fp8".into())
    );
    assert!(!model::coverage::Coverage::of_config(&fp8).is_complete());
    // Kimi-K2's file nested as an unknown wrapper's `text_config`, its FP8 block moved out.
    let k2: Value = serde_json::from_str(&text("kimi_k2_config.json")).unwrap();
    let mut inner = k2.as_object().unwrap().clone();
    let quant = inner.remove("quantization_config").unwrap();
    let wrapper = serde_json::json!({"model_type": "kimi_vl_next", "text_config": inner,
        "quantization_config": quant});
    let c = parse_config(&wrapper.to_string(), "wrapper.json").unwrap();
    assert!(c.inferred_family().is_some());
    assert!(matches!(c.weight_format, WeightFormat::Fp8Block { .. }));
    assert!(matches!(
        c.moe.as_ref().unwrap().expert_format,
        WeightFormat::Fp8Block { .. }
    ));
}

/// MiniMax-M2's published file (M2.7's, same sizes): every field read, 62 GQA layers with the q/k
/// norm across heads and RoPE on 64 of 128 dimensions, 256 FP8 experts routed by sigmoid scores
/// with a correction bias; counts against the published 230B total (228.70B in its safetensors,
/// its FP8 block scales included) and 10B active (without the embeddings); complete
/// coverage; numeric runs refuse its checkpoints; what day0 does not model is an error.
#[test]
fn minimax_m2_published_config() {
    let c = load_config(&testdata("minimax_m2_config.json")).expect("parses");
    assert_eq!(
        (c.family, c.model_type.as_str()),
        (Family::MiniMaxM2, "minimax_m2")
    );
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
    assert_eq!(c.num_layers(), 62);
    assert!(c
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::Gqa && l.ffn == FfnKind::Moe));
    let g = c.gqa.as_ref().unwrap();
    assert_eq!((g.heads, g.kv_heads, g.head_dim), (48, 8, 128));
    assert!(g.qk_norm && g.qk_norm_across_heads && !g.qkv_bias);
    let rope = c.rope.as_ref().unwrap();
    assert_eq!((rope.theta, rope.partial_rotary_factor), (5e6, 0.5));
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.experts,
            m.experts_per_token,
            m.intermediate_size,
            m.shared_experts
        ),
        (256, 8, 1536, 0)
    );
    assert_eq!(m.router, RouterKind::SigmoidGroupTopk);
    assert!(m.norm_topk_prob && m.routed_scaling_factor == 1.0);
    assert_eq!((m.n_group, m.topk_group), (1, 1));
    assert!(matches!(m.expert_format, WeightFormat::Fp8Block { .. }));
    let n = model::plan::params::count(&c);
    let total = n.total() as f64;
    assert!((total / 230e9 - 1.0).abs() < 0.01, "{total}");
    assert!((total / 228.70e9 - 1.0).abs() < 0.001, "{total}");
    let active = (n.active() - n.embedding - n.lm_head) as f64;
    assert!((active / 10e9 - 1.0).abs() < 0.03, "{active}");
    let cov = model::coverage::Coverage::of_config(&c);
    assert!(cov.is_complete(), "{}", cov.missing().join("; "));
    // Its checkpoints are refused by name, before any tensor is read.
    let dir = std::env::temp_dir().join(format!("day0-minimax-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), text("minimax_m2_config.json")).unwrap();
    let none: Vec<(String, safetensors::tensor::TensorView)> = Vec::new();
    safetensors::serialize_to_file(none, None, &dir.join("model.safetensors")).unwrap();
    let launcher = dsl_core::Launcher::for_device("npu-910b").unwrap();
    let e = model::forward::Runner::load(&dir, launcher, 16)
        .err()
        .expect("refused");
    std::fs::remove_dir_all(&dir).ok();
    assert!(e.to_string().contains("MiniMax-M2"), "{e}");
    // MiniMax-01's lightning-attention layers are kept by name (coverage reports them); windows
    // and a shared expert, which day0 does not read yet, are errors naming the field.
    let hybrid = parse_config(
        &edited("minimax_m2_config.json", |o| {
            let mut kinds = vec![serde_json::json!(1); 62];
            kinds[0] = serde_json::json!(0);
            o.insert("attn_type_list".into(), Value::from(kinds));
        }),
        "m01.json",
    )
    .unwrap();
    assert_eq!(
        hybrid.layers[0].attention,
        AttentionKind::Unknown("lightning_attention".into())
    );
    assert!(!model::coverage::Coverage::of_config(&hybrid).is_complete());
    for (field, value) in [
        ("attn_window_size", serde_json::json!(4096)),
        ("shared_intermediate_size", serde_json::json!(1536)),
        ("qk_norm_type", serde_json::json!("per_token")),
        ("rotary_dim", serde_json::json!(256)),
    ] {
        let e = parse_config(
            &edited("minimax_m2_config.json", |o| {
                o.insert(field.into(), value);
            }),
            "m.json",
        )
        .unwrap_err();
        assert_eq!(e.field(), Some(field), "{e}");
    }
    // The softmax router without a bias is Mixtral's; other mixes are kept by name.
    let softmax = parse_config(
        &edited("minimax_m2_config.json", |o| {
            o.insert("scoring_func".into(), serde_json::json!("softmax"));
            o.insert("use_routing_bias".into(), serde_json::json!(false));
        }),
        "s.json",
    )
    .unwrap();
    assert_eq!(softmax.moe.unwrap().router, RouterKind::SoftmaxTopk);
}

/// When the guessed family also lacks a field it needs, fields that reshape the network are the
/// better error (Gemma-3's `text_config` has no `vocab_size`, and its `query_pre_attn_scalar` says
/// it is not Mistral); without such fields the missing one is still named. Fields the guessed
/// schema reads after the missing one are not blamed.
#[test]
fn a_missing_field_with_unexplained_ones_names_the_unexplained() {
    let gemma_like = |extra: bool| {
        edited("tiny/mistral/config.json", |o| {
            o.insert("model_type".into(), serde_json::json!("gemma9"));
            o.remove("vocab_size");
            if extra {
                o.insert("query_pre_attn_scalar".into(), serde_json::json!(168));
                o.insert("sliding_window_pattern".into(), serde_json::json!(6));
            }
        })
    };
    match parse_config(&gemma_like(true), "g.json").unwrap_err() {
        ModelError::UnexplainedFields { fields, .. } => {
            assert_eq!(fields, ["query_pre_attn_scalar", "sliding_window_pattern"])
        }
        other => panic!("{other:?}"),
    }
    let e = parse_config(&gemma_like(false), "g.json").unwrap_err();
    assert_eq!(e.field(), Some("vocab_size"), "{e}");
}

/// A multimodal file's language model named after a known type (Qwen3-VL's `qwen3_vl_text`) is
/// read with that type's schema: a Qwen3 with its q/k norm, which no field announces (its fields
/// alone read as Llama). Experts under a dense name still make the guard refuse.
#[test]
fn a_language_model_named_after_a_known_type_uses_its_schema() {
    let mut inner: Value =
        serde_json::from_str(&text("tiny/qwen3_moe/config.json")).expect("valid JSON");
    let o = inner.as_object_mut().unwrap();
    for k in [
        "num_local_experts",
        "moe_intermediate_size",
        "num_experts_per_tok",
        "decoder_sparse_step",
        "mlp_only_layers",
        "norm_topk_prob",
        "use_sliding_window",
        "sliding_window",
        "router_aux_loss_coef",
        "output_router_logits",
    ] {
        o.remove(k);
    }
    o.insert("model_type".into(), serde_json::json!("qwen3_vl_text"));
    let wrap = |inner: &Value| {
        serde_json::json!({"model_type": "qwen3_vl", "text_config": inner,
            "vision_config": {"depth": 2}})
        .to_string()
    };
    let c = parse_config(&wrap(&inner), "vl.json").expect("parses");
    assert_eq!(c.family, Family::Qwen3);
    assert!(c.gqa.as_ref().unwrap().qk_norm);
    assert!(c.moe.is_none());
    assert!(
        c.warnings[0].to_string().contains("named after `qwen3`"),
        "{}",
        c.warnings[0]
    );
    // Fields alone (no inner type) read as Llama, without the q/k norm.
    inner.as_object_mut().unwrap().remove("model_type");
    let guessed = parse_config(&wrap(&inner), "vl.json").unwrap();
    assert_eq!(guessed.family, Family::Llama);
    // A MoE language model whose name extends only a dense type is refused by its expert field.
    inner["model_type"] = serde_json::json!("qwen3_vl_moe_text");
    inner["num_experts"] = serde_json::json!(8);
    match parse_config(&wrap(&inner), "vl.json").unwrap_err() {
        ModelError::UnexplainedFields { fields, .. } => {
            assert_eq!(fields, ["text_config.num_experts"])
        }
        other => panic!("{other:?}"),
    }
}

/// A hybrid of Gated DeltaNet and gated attention without experts (a new type read with
/// Qwen3-Next's schema, as Qwen3.5's dense models are) has dense MLPs in every layer; Qwen3-Next's
/// own files still need their expert count.
#[test]
fn a_dense_linear_attention_hybrid_reads_as_dense() {
    let strip = |o: &mut serde_json::Map<String, Value>| {
        for k in [
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "norm_topk_prob",
            "decoder_sparse_step",
            "mlp_only_layers",
        ] {
            o.remove(k);
        }
    };
    let text = edited("qwen3_next_config.json", |o| {
        strip(o);
        o.insert("model_type".into(), serde_json::json!("qwen3_5_text"));
    });
    let c = parse_config(&text, "dense.json").expect("a dense hybrid parses");
    assert_eq!(c.family, Family::Qwen3Next);
    assert!(c.moe.is_none());
    assert_eq!(c.dense_mlp.as_ref().unwrap().intermediate_size, 5120);
    assert!(c.layers.iter().all(|l| l.ffn == FfnKind::Dense));
    assert!(model::coverage::Coverage::of_config(&c).is_complete());
    let own = parse_config(&edited("qwen3_next_config.json", strip), "q.json").unwrap_err();
    assert_eq!(own.field(), Some("num_experts"), "{own}");
}

/// GLM-5 (`glm_moe_dsa`) is DeepSeek-V3.2's MLA + DSA at other sizes, with two indexer fields of
/// its own: `indexer_rope_interleave` (read; numeric runs, which rotate halves, refuse it) and
/// `index_topk_freq` (1 read, another frequency refused by field); `moe_router_dtype` is
/// bookkeeping. None of them makes the inferred family refuse the file.
#[test]
fn glm5_indexer_fields_are_read() {
    let glm5 = |freq: u64| {
        edited("deepseek_v32_config.json", |o| {
            o.insert("model_type".into(), serde_json::json!("glm_moe_dsa"));
            o.insert("indexer_rope_interleave".into(), serde_json::json!(true));
            o.insert("index_topk_freq".into(), serde_json::json!(freq));
            o.insert("moe_router_dtype".into(), serde_json::json!("float32"));
        })
    };
    let c = parse_config(&glm5(1), "glm5.json").expect("GLM-5's fields parse");
    assert_eq!(c.family, Family::DeepseekV32);
    assert!(c.indexer.as_ref().unwrap().rope_interleaved);
    let v32 = load_config(&testdata("deepseek_v32_config.json")).unwrap();
    assert!(!v32.indexer.as_ref().unwrap().rope_interleaved);
    let e = parse_config(&glm5(2), "glm5.json").unwrap_err();
    assert_eq!(e.field(), Some("index_topk_freq"), "{e}");
}

/// A tied embedding is also the `lm_head`, which every token reads whole: leaving out the input
/// embedding leaves it in.
#[test]
fn active_without_input_embedding_keeps_a_tied_head() {
    let untied = load_config(&testdata("llama31_405b_config.json")).unwrap();
    let n = model::plan::params::count(&untied);
    assert_eq!(n.active_without_input_embedding(), n.active() - n.embedding);
    let tied = parse_config(
        &edited("llama31_405b_config.json", |o| {
            o.insert("tie_word_embeddings".into(), serde_json::json!(true));
        }),
        "tied.json",
    )
    .unwrap();
    let n = model::plan::params::count(&tied);
    assert_eq!(n.lm_head, 0);
    assert_eq!(n.active_without_input_embedding(), n.active());
}

/// ERNIE-4.5-21B-A3B (`ernie4_5_moe`): layer 0 dense, layers 1–27 MoE of 64 experts (6 per token)
/// with two shared experts; 21B total and 3B active as published (rounded down); its router
/// (softmax, top-k on probability plus a correction bias) has a kernel, so coverage is complete;
/// a VL file's per-modality layer bounds read by their extremes.
#[test]
fn ernie45_moe_config() {
    let c = load_config(&testdata("ernie45_21b_a3b_config.json")).expect("parses");
    assert_eq!(c.family, Family::Ernie45Moe);
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
    assert_eq!(c.layers[0].ffn, FfnKind::Dense);
    assert!(c.layers[1..].iter().all(|l| l.ffn == FfnKind::Moe));
    assert_eq!(c.dense_mlp.as_ref().unwrap().intermediate_size, 12288);
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (
            m.experts,
            m.experts_per_token,
            m.intermediate_size,
            m.shared_experts,
            m.shared_intermediate_size
        ),
        (64, 6, 1536, 2, 3072)
    );
    assert_eq!(m.router, RouterKind::SoftmaxBiasTopk);
    let g = c.gqa.as_ref().unwrap();
    assert_eq!((g.heads, g.kv_heads, g.head_dim), (20, 4, 128));
    assert!(c.tie_word_embeddings);
    let n = model::plan::params::count(&c);
    // The card's "21B" and "3B" are rounded down: the tensors hold 21.83B (64 experts of 7.9M
    // in 27 layers alone are 20.4B).
    let (total, active) = (n.total() as f64, n.active_without_input_embedding() as f64);
    assert!((total - 21.825e9).abs() < 0.01e9, "{total}");
    assert!((21e9..22e9).contains(&total), "{total}");
    assert!((3e9..4e9).contains(&active), "{active}");
    let cov = model::coverage::Coverage::of_config(&c);
    assert!(cov.is_complete(), "{:?}", cov.missing());
    // Another gate activation is kept by name, so coverage reports it.
    let other = parse_config(
        &edited("ernie45_21b_a3b_config.json", |o| {
            o.insert("moe_gate_act".into(), serde_json::json!("sigmoid"));
        }),
        "g.json",
    )
    .unwrap();
    assert!(!model::coverage::Coverage::of_config(&other).is_complete());
    // Per-modality bounds (ERNIE-4.5-VL) by their extremes; an interval of 2 and an end index.
    let c = parse_config(
        &edited("ernie45_21b_a3b_config.json", |o| {
            o.insert("moe_layer_start_index".into(), serde_json::json!([3, 1]));
            o.insert("moe_layer_end_index".into(), serde_json::json!([20, 25]));
            o.insert("moe_layer_interval".into(), serde_json::json!(2));
        }),
        "vl.json",
    )
    .unwrap();
    let moe_layers: Vec<usize> = (0..28)
        .filter(|&i| c.layers[i].ffn == FfnKind::Moe)
        .collect();
    assert_eq!(
        moe_layers,
        (1..=25).filter(|i| (i + 1) % 2 == 0).collect::<Vec<_>>()
    );
    let e = parse_config(
        &edited("ernie45_21b_a3b_config.json", |o| {
            o.insert("use_bias".into(), serde_json::json!(true));
        }),
        "b.json",
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("use_bias"), "{e}");
}

#[test]
fn unsupported_or_missing_model_type() {
    let e = parse_config(r#"{"model_type": "gemma3"}"#, "gpt.json").unwrap_err();
    assert!(
        matches!(&e, ModelError::UnsupportedModelType { model_type, .. } if model_type == "gemma3")
    );
    assert!(
        e.to_string().contains("deepseek_v32"),
        "lists the supported types: {e}"
    );
    let e = parse_config(r#"{"hidden_size": 8}"#, "none.json").unwrap_err();
    assert_eq!(e.field(), Some("model_type"));
}

#[test]
fn unknown_layer_kind_parses_and_is_kept() {
    let c = load_config(&testdata("unknown_layer_kind_config.json")).expect("parses");
    assert_eq!(c.num_layers(), 4);
    assert_eq!(
        c.layers[1].attention,
        AttentionKind::Unknown("mamba2".into())
    );
    assert_eq!(
        c.layers[2].attention,
        AttentionKind::Unknown("mamba2".into())
    );
    assert_eq!(c.unknown_fields(), vec!["sliding_window_pattern"]);
}

#[test]
fn load_from_a_model_directory_and_missing_files() {
    let dir = std::env::temp_dir().join(format!("day0-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), text("kimi_k2_config.json")).unwrap();
    let c = load_config(&dir).expect("directory with config.json");
    assert_eq!(c.family, Family::KimiK2);
    assert!(c.source.ends_with("config.json"));
    std::fs::remove_dir_all(&dir).ok();
    let e = load_config(&testdata("no_such_config.json")).unwrap_err();
    assert!(matches!(e, ModelError::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("no_such_config.json"));
}

/// Optional DeepSeek fields take transformers' defaults when absent, each recorded as a warning:
/// `first_k_dense_replace` is 3 (DeepseekV3Config / DeepseekV32Config), so a file without it has
/// three dense layers first (model/testdata/tiny/awk_v3_defaults is such a file).
#[test]
fn absent_first_k_dense_replace_is_transformers_default_3() {
    let t = edited("kimi_k2_config.json", |m| {
        m.remove("first_k_dense_replace");
    });
    let c = parse_config(&t, "k2.json").expect("parses");
    let dense: Vec<bool> = c.layers.iter().map(|l| l.ffn == FfnKind::Dense).collect();
    assert_eq!(&dense[..4], &[true, true, true, false]);
    assert!(dense[3..].iter().all(|d| !d));
    assert!(c.warnings.iter().any(|w| matches!(w,
        ConfigWarning::Defaulted { field, value } if field == "first_k_dense_replace" && value == "3")));
    let c = load_config(&testdata("tiny/awk_v3_defaults")).expect("parses");
    let ffn: Vec<FfnKind> = c.layers.iter().map(|l| l.ffn.clone()).collect();
    assert_eq!(
        ffn,
        [FfnKind::Dense, FfnKind::Dense, FfnKind::Dense, FfnKind::Moe]
    );
}

/// YaRN's `mscale` absent is not 1: transformers scales cos/sin by `mscale / mscale_all_dim` only
/// when both are given (truthy), and by `0.1 ln(factor) + 1` otherwise. day0 reads an absent
/// `mscale` as 0 ("not given"), which its attention factor treats the same way
/// (model/testdata/tiny/awk_v3_yarn_no_mscale: `mscale_all_dim` 0.8 without `mscale`).
#[test]
fn yarn_absent_mscale_is_not_given() {
    let c = load_config(&testdata("tiny/awk_v3_yarn_no_mscale")).expect("parses");
    let rope = c.rope.as_ref().expect("rope");
    match rope.scaling {
        RopeScaling::Yarn {
            factor,
            mscale,
            mscale_all_dim,
            beta_fast,
            beta_slow,
            ..
        } => {
            assert_eq!((factor, mscale, mscale_all_dim), (6.0, 0.0, 0.8));
            assert_eq!((beta_fast, beta_slow), (32.0, 1.0));
        }
        ref other => panic!("expected YaRN, got {other:?}"),
    }
    // The softmax correction still uses mscale_all_dim: m = 0.1 · 0.8 · ln 6 + 1.
    let m = 0.1 * 0.8 * 6f64.ln() + 1.0;
    assert!((rope.mla_mscale() - m).abs() < 1e-15);
    // Both given and different (awk_v3_yarn_mscale): read as written.
    let c = load_config(&testdata("tiny/awk_v3_yarn_mscale")).expect("parses");
    match c.rope.as_ref().unwrap().scaling {
        RopeScaling::Yarn {
            mscale,
            mscale_all_dim,
            ..
        } => assert_eq!((mscale, mscale_all_dim), (1.0, 0.5)),
        ref other => panic!("expected YaRN, got {other:?}"),
    }
}

#[test]
fn qwen3_moe_published_config() {
    let c = load_config(&testdata("qwen3_235b_a22b_config.json")).unwrap();
    assert_eq!(c.family, Family::Qwen3);
    assert_eq!(c.num_layers(), 94);
    let g = c.gqa.as_ref().unwrap();
    assert_eq!((g.heads, g.kv_heads, g.head_dim), (64, 4, 128));
    assert!(g.qk_norm && !g.output_gate);
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.experts, m.experts_per_token, m.intermediate_size),
        (128, 8, 1536)
    );
    assert!(m.router == RouterKind::SoftmaxTopk && m.shared_experts == 0);
    assert!(m.norm_topk_prob);
    assert!(c
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::Gqa && l.ffn == FfnKind::Moe));
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
    // Qwen3MoeConfig's defaults: no renormalisation, head_dim = hidden / heads; dense layers
    // from `mlp_only_layers`.
    let c = parse_config(
        &edited("qwen3_235b_a22b_config.json", |o| {
            o.remove("norm_topk_prob");
            o.remove("head_dim");
            o.insert("mlp_only_layers".into(), serde_json::json!([0, 5]));
        }),
        "q.json",
    )
    .unwrap();
    assert!(!c.moe.as_ref().unwrap().norm_topk_prob);
    assert_eq!(c.gqa.as_ref().unwrap().head_dim, 4096 / 64);
    assert_eq!(c.layers[0].ffn, FfnKind::Dense);
    assert_eq!(c.layers[5].ffn, FfnKind::Dense);
    assert_eq!(c.dense_mlp.as_ref().unwrap().intermediate_size, 12288);
    // A sliding window is windowed GQA, which day0's kernels lack (the coverage inventory says so).
    let c = parse_config(
        &edited("qwen3_235b_a22b_config.json", |o| {
            o.insert("use_sliding_window".into(), Value::Bool(true));
            o.insert("sliding_window".into(), serde_json::json!(4096));
        }),
        "q.json",
    )
    .unwrap();
    assert!(c
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::SlidingGqa));
    assert_eq!(c.gqa.as_ref().unwrap().sliding_window, Some(4096));
}

#[test]
fn qwen3_dense_takes_its_window_layers_and_head_dim_default() {
    let dense = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        parse_config(
            &edited("qwen3_235b_a22b_config.json", |o| {
                o.insert("model_type".into(), "qwen3".into());
                for k in [
                    "num_experts",
                    "num_experts_per_tok",
                    "moe_intermediate_size",
                ] {
                    o.remove(k);
                }
                o.insert("num_hidden_layers".into(), serde_json::json!(6));
                f(o);
            }),
            "qwen3.json",
        )
        .unwrap()
    };
    let c = dense(&|o| {
        o.remove("head_dim");
    });
    assert!(c.moe.is_none() && c.layers.iter().all(|l| l.ffn == FfnKind::Dense));
    // Qwen3Config's head_dim default is 128 whatever hidden / heads is.
    assert_eq!(c.gqa.as_ref().unwrap().head_dim, 128);
    // Windows from `max_window_layers` on, as transformers builds `layer_types`.
    let c = dense(&|o| {
        o.insert("use_sliding_window".into(), Value::Bool(true));
        o.insert("sliding_window".into(), serde_json::json!(4096));
        o.insert("max_window_layers".into(), serde_json::json!(4));
    });
    let kinds: Vec<bool> = c
        .layers
        .iter()
        .map(|l| l.attention == AttentionKind::Gqa)
        .collect();
    assert_eq!(kinds, [true, true, true, true, false, false]);
}

#[test]
fn llama_31_published_config_with_llama3_rope() {
    let c = load_config(&testdata("llama31_405b_config.json")).unwrap();
    assert_eq!(c.family, Family::Llama);
    assert_eq!(c.num_layers(), 126);
    let g = c.gqa.as_ref().unwrap();
    assert_eq!((g.heads, g.kv_heads, g.head_dim), (128, 8, 128));
    assert!(!g.qk_norm && !g.output_gate);
    assert!(c.moe.is_none());
    assert_eq!(c.dense_mlp.as_ref().unwrap().intermediate_size, 53248);
    let rope = c.rope.as_ref().unwrap();
    assert_eq!(rope.theta, 500000.0);
    assert_eq!(
        rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
    // A llama3 scaling without its band is an error naming the field and the file.
    let e = parse_config(
        &edited("llama31_405b_config.json", |o| {
            o["rope_scaling"]
                .as_object_mut()
                .unwrap()
                .remove("low_freq_factor");
        }),
        "l.json",
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("low_freq_factor") && e.to_string().contains("l.json"),
        "{e}"
    );
    // Equal factors (Llama-4-Scout's low 1, high 1) leave no band: accepted, as transformers
    // does; an inverted band is still an error.
    let equal = parse_config(
        &edited("llama31_405b_config.json", |o| {
            o["rope_scaling"]["high_freq_factor"] = serde_json::json!(1.0);
        }),
        "scout_rope.json",
    )
    .expect("equal llama3 factors parse");
    assert!(matches!(
        equal.rope.as_ref().unwrap().scaling,
        RopeScaling::Llama3 { low_freq_factor, high_freq_factor, .. }
            if low_freq_factor == 1.0 && high_freq_factor == 1.0
    ));
    let e = parse_config(
        &edited("llama31_405b_config.json", |o| {
            o["rope_scaling"]["high_freq_factor"] = serde_json::json!(0.5);
        }),
        "inverted.json",
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("rope_scaling.high_freq_factor"), "{e}");
    // No head_dim and more heads than hidden dims: an error naming head_dim, not a zero width.
    let e = parse_config(
        &edited("llama31_405b_config.json", |o| {
            o.insert("hidden_size".into(), serde_json::json!(64));
        }),
        "tiny.json",
    )
    .unwrap_err();
    assert_eq!(e.field(), Some("head_dim"), "{e}");
}

#[test]
fn mixtral_published_config_and_sliding_window() {
    let c = load_config(&testdata("mixtral_8x22b_config.json")).unwrap();
    assert_eq!(c.family, Family::Mixtral);
    let m = c.moe.as_ref().unwrap();
    assert_eq!(
        (m.experts, m.experts_per_token, m.intermediate_size),
        (8, 2, 16384)
    );
    assert!(m.norm_topk_prob && m.router == RouterKind::SoftmaxTopk);
    assert!(c.dense_mlp.is_none());
    assert!(c
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::Gqa && l.ffn == FfnKind::Moe));
    // Mistral-7B-v0.1's 4096-token window: every layer windowed.
    let c = parse_config(
        &edited("mixtral_8x22b_config.json", |o| {
            o.insert("sliding_window".into(), serde_json::json!(4096));
        }),
        "m.json",
    )
    .unwrap();
    assert!(c
        .layers
        .iter()
        .all(|l| l.attention == AttentionKind::SlidingGqa));
    assert_eq!(c.gqa.as_ref().unwrap().sliding_window, Some(4096));
}

/// Qwen2.5-72B's published sizes (`qwen2`: q/k/v biases always) and GLM-4.5's (`glm4_moe`:
/// biases per `attention_bias`, partial RoPE 0.5 by default, DeepSeek-V3's MoE after
/// `first_k_dense_replace` dense layers), with `Glm4MoeConfig`'s defaults where fields are absent.
#[test]
fn qwen2_and_glm4_moe_configs() {
    let qwen25 = serde_json::json!({
        "model_type": "qwen2", "hidden_size": 8192, "intermediate_size": 29568,
        "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
        "vocab_size": 152064, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768, "max_window_layers": 70, "sliding_window": 131072,
        "use_sliding_window": false, "tie_word_embeddings": false
    });
    let c = parse_config(&qwen25.to_string(), "qwen25.json").unwrap();
    assert_eq!(c.family, Family::Qwen2);
    let g = c.gqa.as_ref().unwrap();
    assert!(g.qkv_bias && !g.qk_norm && !g.output_gate && g.head_dim == 128);
    assert!(c.layers.iter().all(|l| l.attention == AttentionKind::Gqa));
    assert!(c.unknown_fields().is_empty(), "{:?}", c.unknown_fields());
    assert!(
        !c.warnings.iter().any(|w| w.to_string().contains("bias")),
        "biases are modelled: {:?}",
        c.warnings
    );
    let glm = serde_json::json!({
        "model_type": "glm4_moe", "hidden_size": 5120, "intermediate_size": 12288,
        "num_hidden_layers": 92, "num_attention_heads": 96, "num_key_value_heads": 8,
        "head_dim": 128, "attention_bias": true, "first_k_dense_replace": 3,
        "moe_intermediate_size": 1536, "n_routed_experts": 160, "num_experts_per_tok": 8,
        "n_shared_experts": 1, "routed_scaling_factor": 2.5, "vocab_size": 151552,
        "rope_theta": 1000000, "num_nextn_predict_layers": 1
    });
    let c = parse_config(&glm.to_string(), "glm.json").unwrap();
    assert_eq!(c.family, Family::Glm4Moe);
    let g = c.gqa.as_ref().unwrap();
    assert!(g.qkv_bias && !g.qk_norm);
    assert_eq!(c.rope.as_ref().unwrap().partial_rotary_factor, 0.5);
    let m = c.moe.as_ref().unwrap();
    assert!(m.router == RouterKind::SigmoidGroupTopk && m.norm_topk_prob);
    assert_eq!(
        (
            m.experts,
            m.experts_per_token,
            m.shared_intermediate_size,
            m.n_group
        ),
        (160, 8, 1536, 1)
    );
    assert!(c.layers[..3].iter().all(|l| l.ffn == FfnKind::Dense));
    assert!(c.layers[3..].iter().all(|l| l.ffn == FfnKind::Moe));
    // A file read with this schema that names another router keeps it by name (coverage then
    // reports it); MoE on only some layers is refused by field.
    let mut other = glm.clone();
    other["scoring_func"] = serde_json::json!("softmax");
    let c = parse_config(&other.to_string(), "glm.json").unwrap();
    assert_eq!(
        c.moe.as_ref().unwrap().router,
        RouterKind::Unknown("softmax/noaux_tc".into())
    );
    assert!(!model::coverage::Coverage::of_config(&c).is_complete());
    let mut sparse = glm.clone();
    sparse["moe_layer_freq"] = serde_json::json!(2);
    let e = parse_config(&sparse.to_string(), "glm.json").unwrap_err();
    assert_eq!(e.field(), Some("moe_layer_freq"), "{e}");
}

/// DeepSeek-V2 (236B, 21B active) and V2-Lite (15.7B) as their released config.json files give
/// them: softmax routing, group-limited on V2 (8 groups keep 3), greedy on Lite (groups null),
/// scaled and never renormalised, no query compression on Lite, YaRN in the old `rope_scaling`
/// form. Active counts here include the input embedding, which DeepSeek's "21B" leaves out.
#[test]
fn deepseek_v2_configs() {
    let v2 = serde_json::json!({
        "model_type": "deepseek_v2", "hidden_size": 5120, "intermediate_size": 12288,
        "moe_intermediate_size": 1536, "num_hidden_layers": 60, "num_attention_heads": 128,
        "num_key_value_heads": 128, "n_shared_experts": 2, "n_routed_experts": 160,
        "ep_size": 1, "routed_scaling_factor": 16.0, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
        "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3,
        "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1,
        "norm_topk_prob": false, "scoring_func": "softmax", "aux_loss_alpha": 0.003,
        "seq_aux": true, "hidden_act": "silu", "max_position_embeddings": 163840,
        "rms_norm_eps": 1e-6, "vocab_size": 102400, "rope_theta": 10000,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
            "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "type": "yarn"},
        "attention_bias": false, "tie_word_embeddings": false
    });
    let c = parse_config(&v2.to_string(), "v2.json").unwrap();
    assert_eq!(c.family, Family::DeepseekV2);
    let m = c.moe.as_ref().unwrap();
    assert_eq!(m.router, RouterKind::SoftmaxTopk);
    assert_eq!((m.n_group, m.topk_group, m.experts_per_token), (8, 3, 6));
    assert!(!m.norm_topk_prob && m.routed_scaling_factor == 16.0);
    assert!(
        c.layers[0].ffn == FfnKind::Dense && c.layers[1..].iter().all(|l| l.ffn == FfnKind::Moe)
    );
    assert!(c.mla.as_ref().unwrap().rope_interleave);
    assert!(
        !c.warnings
            .iter()
            .any(|w| w.to_string().contains("rope_interleave")),
        "{:?}",
        c.warnings
    );
    let n = model::plan::params::count(&c);
    let (total, active) = (n.total() as f64 / 1e9, n.active() as f64 / 1e9);
    assert!((total / 236.0 - 1.0).abs() < 0.01, "{total}");
    assert!((active / 21.0 - 1.0).abs() < 0.03, "{active}");

    let mut lite = v2.clone();
    for (k, v) in [
        ("hidden_size", serde_json::json!(2048)),
        ("intermediate_size", serde_json::json!(10944)),
        ("moe_intermediate_size", serde_json::json!(1408)),
        ("num_hidden_layers", serde_json::json!(27)),
        ("num_attention_heads", serde_json::json!(16)),
        ("num_key_value_heads", serde_json::json!(16)),
        ("n_routed_experts", serde_json::json!(64)),
        ("routed_scaling_factor", serde_json::json!(1.0)),
        ("q_lora_rank", serde_json::Value::Null),
        ("topk_method", serde_json::json!("greedy")),
        ("n_group", serde_json::Value::Null),
        ("topk_group", serde_json::Value::Null),
    ] {
        lite[k] = v;
    }
    let c = parse_config(&lite.to_string(), "lite.json").unwrap();
    let m = c.moe.as_ref().unwrap();
    assert_eq!((m.n_group, m.topk_group), (1, 1));
    assert_eq!(c.mla.as_ref().unwrap().q_lora_rank, None);
    let total = model::plan::params::count(&c).total() as f64 / 1e9;
    assert!((total / 15.7 - 1.0).abs() < 0.01, "{total}");

    // Group-limited routing without its groups names the field.
    let mut bad = v2.clone();
    bad["n_group"] = serde_json::Value::Null;
    let err = parse_config(&bad.to_string(), "bad.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("n_group"), "{err}");
}

/// gpt-oss-120b and -20b as their released config.json files give them: parsed, counted (OpenAI's
/// model card: 116.83B and 20.91B; active 5.13B and 3.61B without the input embedding, which
/// day0's active count includes), and inventoried with what day0 lacks.
#[test]
fn gpt_oss_configs_are_counted_and_inventoried() {
    let layer_types: Vec<Value> = (0..36)
        .map(|i| {
            Value::from(if i % 2 == 0 {
                "sliding_attention"
            } else {
                "full_attention"
            })
        })
        .collect();
    let big = serde_json::json!({
        "model_type": "gpt_oss", "attention_bias": true, "experts_per_token": 4,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
        "intermediate_size": 2880, "layer_types": layer_types, "max_position_embeddings": 131072,
        "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 36,
        "num_key_value_heads": 8, "num_local_experts": 128, "rms_norm_eps": 1e-5,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn",
            "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
            "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": false},
        "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128,
        "swiglu_limit": 7.0, "tie_word_embeddings": false, "vocab_size": 201088
    });
    let c = parse_config(&big.to_string(), "gpt-oss-120b.json").unwrap();
    assert_eq!(c.family, Family::GptOss);
    assert_eq!(c.layers[0].attention, AttentionKind::SlidingGqa);
    assert_eq!(c.layers[1].attention, AttentionKind::Gqa);
    let g = c.gqa.as_ref().unwrap();
    assert!(g.sinks && g.o_bias && g.qkv_bias && g.sliding_window == Some(128));
    // gpt-oss's YaRN keeps the correction range's fractional bounds (`truncate: false`).
    assert!(matches!(
        c.rope.as_ref().unwrap().scaling,
        RopeScaling::Yarn {
            truncate: false,
            ..
        }
    ));
    let m = c.moe.as_ref().unwrap();
    assert!(m.biases && m.expert_format == WeightFormat::Mxfp4);
    assert_eq!(c.weight_format, WeightFormat::Float);
    let n = model::plan::params::count(&c);
    let embed = (201088 * 2880) as f64;
    let (total, active) = (n.total() as f64, n.active() as f64 - embed);
    assert_eq!(n.active_without_input_embedding() as f64, active);
    assert!((total / 116.83e9 - 1.0).abs() < 0.01, "{total}");
    assert!((active / 5.13e9 - 1.0).abs() < 0.03, "{active}");
    let cov = model::coverage::Coverage::of_config(&c);
    let missing = cov.missing().join("; ");
    // Sinks (an argument of the GQA attention kernels), the clamped SwiGLU and the expert
    // biases all have kernels: nothing is missing.
    assert!(cov.is_complete(), "{missing}");

    let mut small = big.clone();
    small["num_hidden_layers"] = serde_json::json!(24);
    small["num_local_experts"] = serde_json::json!(32);
    small["layer_types"] = Value::from(big["layer_types"].as_array().unwrap()[..24].to_vec());
    let c = parse_config(&small.to_string(), "gpt-oss-20b.json").unwrap();
    let n = model::plan::params::count(&c);
    let (total, active) = (n.total() as f64, n.active_without_input_embedding() as f64);
    assert!((total / 20.91e9 - 1.0).abs() < 0.01, "{total}");
    assert!((active / 3.61e9 - 1.0).abs() < 0.03, "{active}");
}

/// Kimi-K2-Thinking's `compressed-tensors` block: one group of symmetric INT4 weights with a bf16
/// scale per 32 inputs, activations unquantized (W4A16), `pack-quantized`; the `ignore` list keeps
/// attention, shared-expert and dense-MLP projections in bf16. The routed experts read as
/// `Int4Group { 32 }` (4.5 bits a value in the memory plan), the rest as floats, and the coverage
/// inventory finds the INT4 grouped expert GEMM. Other schemes are kept by name and reported
/// missing; an `ignore` list naming the routed experts keeps them in floats.
#[test]
fn kimi_k2_thinking_int4_experts() {
    let c = load_config(&testdata("kimi_k2_thinking_config.json")).expect("parses");
    assert_eq!(c.weight_format, WeightFormat::Float);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(moe.expert_format, WeightFormat::Int4Group { group: 32 });
    let k2 = load_config(&testdata("kimi_k2_config.json")).unwrap();
    // Kimi-K2's own warnings (a defaulted RoPE layout), nothing from the quantization block.
    assert_eq!(c.warnings, k2.warnings);
    let (n, n2) = (
        model::plan::params::count(&c),
        model::plan::params::count(&k2),
    );
    assert_eq!((n.total(), n.active()), (n2.total(), n2.active()));
    assert_eq!(
        model::plan::memory::bytes_per_param(&moe.expert_format),
        0.5 + 2.0 / 32.0
    );
    let cov = model::coverage::Coverage::of_config(&c);
    assert!(cov.is_complete(), "{}", cov.missing().join("; "));
    let row = cov
        .row("expert_ffn.int4")
        .expect("the INT4 expert FFN is inventoried");
    assert!(
        row.kernels.iter().any(|k| k == "grouped_linear_int4"),
        "{:?}",
        row.kernels
    );

    let with_quant = |f: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let t = edited("kimi_k2_thinking_config.json", |o| {
            f(o["quantization_config"].as_object_mut().unwrap())
        });
        parse_config(&t, "k2_thinking_edited.json").expect("parses")
    };
    // NVFP4 (another compressed-tensors scheme): kept by name, its expert GEMM missing.
    let c = with_quant(&|q| {
        q.insert("format".into(), Value::from("nvfp4-pack-quantized"));
    });
    let other = WeightFormat::Other("compressed-tensors/nvfp4-pack-quantized".into());
    assert_eq!(c.moe.as_ref().unwrap().expert_format, other);
    let cov = model::coverage::Coverage::of_config(&c);
    assert!(
        cov.missing()
            .iter()
            .any(|m| m.contains("expert_ffn.compressed-tensors/nvfp4")),
        "{:?}",
        cov.missing()
    );
    // Asymmetric INT4, or a group the kernels do not read: the same.
    for (key, value) in [
        ("symmetric", Value::from(false)),
        ("group_size", Value::from(256)),
    ] {
        let c = with_quant(&|q| {
            q["config_groups"]["group_0"]["weights"][key] = value.clone();
        });
        assert!(
            matches!(
                c.moe.as_ref().unwrap().expert_format,
                WeightFormat::Other(_)
            ),
            "{key}"
        );
    }
    // Every linear layer in INT4 (nothing but the head ignored); routed experts ignored.
    let c = with_quant(&|q| {
        q.insert("ignore".into(), serde_json::json!(["lm_head"]));
    });
    assert_eq!(c.weight_format, WeightFormat::Int4Group { group: 32 });
    let c = with_quant(&|q| {
        q.insert("ignore".into(), serde_json::json!(["re:.*mlp\\.experts.*"]));
    });
    assert_eq!(c.moe.as_ref().unwrap().expert_format, WeightFormat::Float);
    assert_eq!(c.weight_format, WeightFormat::Int4Group { group: 32 });
}
