//! Built-in model presets: the public `config.json` files of the models day0 plans for, compiled
//! into the binary so `day0 run --model kimi-k2` works from any directory. Each file's source is
//! in `model/testdata/README.md`; a path to any other `config.json` works wherever a preset name
//! does.

use crate::config::{load_config, parse_config, ModelConfig, ModelError};
use std::path::Path;

/// A built-in model: its name, what it is, and its configuration text.
#[derive(Debug, Clone, Copy)]
pub struct ModelPreset {
    /// The name `--model` takes.
    pub name: &'static str,
    /// One line on what the model is.
    pub description: &'static str,
    /// The parameter counts (total, active) the model card states, rounded as it rounds them
    /// (Kimi-K2: "1T" and "32B"), when there are any.
    pub published: Option<(f64, f64)>,
    /// The `config.json` text.
    pub config: &'static str,
    /// The file the text came from, for errors and reports.
    pub file: &'static str,
}

/// Every built-in model, in the order `day0 models` lists them.
pub const MODEL_PRESETS: &[ModelPreset] = &[
    ModelPreset {
        name: "kimi-k2",
        description: "Moonshot Kimi-K2-Instruct: DeepSeek-V3 architecture, 384 experts",
        published: Some((1e12, 32e9)),
        config: include_str!("../../testdata/kimi_k2_config.json"),
        file: "model/testdata/kimi_k2_config.json",
    },
    ModelPreset {
        name: "kimi-k2-thinking",
        description: "Moonshot Kimi-K2-Thinking: Kimi-K2's architecture, routed experts in INT4 (W4A16, a bf16 scale per 32)",
        published: Some((1e12, 32e9)),
        config: include_str!("../../testdata/kimi_k2_thinking_config.json"),
        file: "model/testdata/kimi_k2_thinking_config.json",
    },
    ModelPreset {
        name: "deepseek-v3",
        description: "DeepSeek-V3 (671B): MLA, 256 experts, FP8 block-scaled weights",
        published: Some((671e9, 37e9)),
        config: include_str!("../../testdata/deepseek_v3_config.json"),
        file: "model/testdata/deepseek_v3_config.json",
    },
    ModelPreset {
        name: "deepseek-v3.2",
        description: "DeepSeek-V3.2 (671B): DeepSeek-V3 plus the DSA lightning indexer",
        published: Some((671e9, 37e9)),
        config: include_str!("../../testdata/deepseek_v32_config.json"),
        file: "model/testdata/deepseek_v32_config.json",
    },
    ModelPreset {
        name: "qwen3-next-80b",
        description: "Qwen3-Next-80B-A3B: Gated DeltaNet + gated attention (3:1), 512 experts",
        published: Some((80e9, 3e9)),
        config: include_str!("../../testdata/qwen3_next_config.json"),
        file: "model/testdata/qwen3_next_config.json",
    },
    ModelPreset {
        name: "qwen3-235b-a22b",
        description: "Qwen3-235B-A22B: GQA with q/k norm in 94 layers, 128 experts (8 active)",
        published: Some((235e9, 22e9)),
        config: include_str!("../../testdata/qwen3_235b_a22b_config.json"),
        file: "model/testdata/qwen3_235b_a22b_config.json",
    },
    ModelPreset {
        name: "mixtral-8x22b",
        description: "Mixtral-8x22B: GQA, 8 experts (2 active) in every layer",
        published: Some((141e9, 39e9)),
        config: include_str!("../../testdata/mixtral_8x22b_config.json"),
        file: "model/testdata/mixtral_8x22b_config.json",
    },
    ModelPreset {
        name: "llama-3.1-405b",
        description: "Llama-3.1-405B: dense GQA, llama3 RoPE scaling to 128K",
        published: Some((405e9, 405e9)),
        config: include_str!("../../testdata/llama31_405b_config.json"),
        file: "model/testdata/llama31_405b_config.json",
    },
    ModelPreset {
        name: "gpt-oss-120b",
        description: "OpenAI gpt-oss-120b: GQA with sinks, alternating 128-token windows, 128 MXFP4 experts (4 active)",
        published: Some((117e9, 5.1e9)),
        config: include_str!("../../testdata/gpt_oss_120b_config.json"),
        file: "model/testdata/gpt_oss_120b_config.json",
    },
    ModelPreset {
        name: "llama-4-scout",
        description: "Llama 4 Scout (language model): 48 layers, 3 of 4 chunked (8192) with RoPE, 1 of 4 NoPE; 16 experts + shared in every layer",
        published: Some((109e9, 17e9)),
        config: include_str!("../../testdata/llama4_scout_config.json"),
        file: "model/testdata/llama4_scout_config.json",
    },
    ModelPreset {
        name: "llama-4-maverick",
        description: "Llama 4 Maverick (language model): Scout's attention, 128 experts + shared in every other layer, dense between",
        published: Some((400e9, 17e9)),
        config: include_str!("../../testdata/llama4_maverick_config.json"),
        file: "model/testdata/llama4_maverick_config.json",
    },
    ModelPreset {
        name: "hybrid-3t",
        description: "day0's release-day model: ~2.9T, 1M context, DSA-MLA 1:3 Gated DeltaNet, 1024 MXFP4 experts",
        published: None,
        config: include_str!("../../testdata/hybrid_3t_config.json"),
        file: "model/testdata/hybrid_3t_config.json",
    },
];

/// Loads a model by preset name, or from a `config.json` (or a directory holding one) when
/// `name_or_path` is not a preset name.
pub fn load_model(name_or_path: &str) -> Result<ModelConfig, ModelError> {
    if let Some(p) = MODEL_PRESETS.iter().find(|p| p.name == name_or_path) {
        return parse_config(p.config, p.file);
    }
    let path = Path::new(name_or_path);
    if path.exists() {
        return load_config(path);
    }
    Err(ModelError::Io {
        file: name_or_path.to_string(),
        message: format!(
            "neither a model preset ({}) nor an existing config.json path",
            MODEL_PRESETS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}
