//! # Coverage inventory: which of a model's operators day0 can run, and with what
//!
//! The release-day triage question: given a `config.json`, which operators does the model need,
//! and for each, is there a kernel? [`inventory`] parses the configuration, builds the prefill and
//! decode operator graphs ([`crate::graph`]) and classifies every operator kind:
//!
//! - **`hand-tuned`**: every kernel it runs has a hand-tuned implementation registered in
//!   [`kernels::registry`] (`ImplKind::HandTuned`: written against accel-sim's manual API, in
//!   `kernels::hand_tuned`), and nothing else: a DSL kernel tuned by hand is still `dsl`;
//! - **`dsl`**: a DSL kernel of the `kernels` crate implements the operator (the row names the
//!   tuned DSL versions when there are any);
//! - **`composite`**: assembled from kernels written for other operators (how is said in the
//!   row: e.g. plain RMSNorm as `rmsnorm_residual` with a zero residual);
//! - **`missing`**: no kernel with the operator's semantics, or no tile of the kernel's space
//!   covers the model's sizes (a dimension above the largest tile). Problem dimensions are run-time
//!   values of every kernel, so a size is never missing because it is absent from a list; the
//!   notes say which tiles each operator would use.
//!
//! The kernel names are the real `KernelMeta::name`s of the `kernels` crate (this module refers to
//! each kernel's `META`, so a renamed kernel is a compile error here, not a stale table), and the
//! size checks read the kernels' declared tunable values. [`rules`] is the one place that maps
//! operator kinds to kernels: when a kernel lands, its operator moves from `missing` there.
//!
//! [`Coverage::table`] is the ten-second view (one line per operator kind: layers, status,
//! kernels), [`Coverage::to_json`] the machine-readable one, [`Coverage::missing`] the list a CLI
//! exits non-zero on.

use crate::config::{load_config, Decay, ModelConfig, ModelError, RouterKind, WeightFormat};
use crate::graph::{self, ExpertWeights, GraphShape, ModelGraph, OpCall, OpKind, Phase};
use dsl_core::KernelMeta;
use kernels::registry::{self, ImplKind};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

/// How an operator is covered. Ordered best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    /// Hand-tuned kernels in the registry.
    HandTuned,
    /// A DSL kernel.
    Dsl,
    /// Built from kernels written for other operators.
    Composite,
    /// No kernel (or none that takes the model's sizes).
    Missing,
}

impl Status {
    /// `hand-tuned`, `dsl`, `composite`, `missing`.
    pub fn name(self) -> &'static str {
        match self {
            Status::HandTuned => "hand-tuned",
            Status::Dsl => "dsl",
            Status::Composite => "composite",
            Status::Missing => "missing",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A size an operator needs from a kernel's declared tile space.
#[derive(Debug, Clone, Copy)]
pub enum Check {
    /// Tiles of `kernel` must cover the call's sizes: for each `(tunable, param)`, a point of the
    /// kernel's instantiated tile space with `tunable ≥ param` (problem dimensions are run-time
    /// values; only a dimension above the largest tile is refused). The tiles chosen are noted.
    Covers {
        /// The kernel.
        kernel: &'static KernelMeta,
        /// `(tunable, the call's size it covers)` pairs (`("BD", "D")`).
        dims: &'static [(&'static str, &'static str)],
    },
    /// The call's `param` must not exceed the largest declared `tunable` value (a whole row in one
    /// tile, ragged columns masked).
    AtMost {
        /// The kernel.
        kernel: &'static KernelMeta,
        /// Its tunable (`BH`).
        tunable: &'static str,
        /// The call's size (`width`).
        param: &'static str,
    },
    /// The call's `param` must be a multiple of `of` (MXFP4 blocks of 32 along K).
    MultipleOf {
        /// The call's size.
        param: &'static str,
        /// The divisor.
        of: usize,
        /// Why.
        why: &'static str,
    },
    /// The call's `param` must equal `value` (a kernel written for one size).
    Equals {
        /// The call's size.
        param: &'static str,
        /// The only value the kernel implements.
        value: usize,
        /// Which kernel fixes it.
        kernel: &'static KernelMeta,
    },
}

impl Check {
    /// `None` when the call satisfies the check, else why not.
    fn failure(&self, call: &OpCall) -> Option<String> {
        match *self {
            Check::Covers { kernel, dims } => self_cover(kernel, dims, call).err(),
            Check::AtMost {
                kernel,
                tunable,
                param,
            } => {
                let v = call.param(param)?;
                let max = tunable_values(kernel, tunable)
                    .into_iter()
                    .max()
                    .unwrap_or(0);
                (v as i64 > max).then(|| {
                    format!(
                        "{param} {v} exceeds {}'s largest {tunable} {max}",
                        kernel.name
                    )
                })
            }
            Check::MultipleOf { param, of, why } => {
                let v = call.param(param)?;
                (v % of != 0).then(|| format!("{param} {v} is not a multiple of {of} ({why})"))
            }
            Check::Equals {
                param,
                value,
                kernel,
            } => {
                let v = call.param(param)?;
                (v != value).then(|| {
                    format!(
                        "{} implements {param}={value} only, model needs {v}",
                        kernel.name
                    )
                })
            }
        }
    }
}

impl Check {
    /// The tiles a [`Check::Covers`] picks for the call (`flash_prefill BD=256 BDV=128`), for the
    /// inventory's notes; `None` for other checks or when no tile covers.
    fn tiles(&self, call: &OpCall) -> Option<String> {
        match *self {
            Check::Covers { kernel, dims } => {
                let cfg = self_cover(kernel, dims, call).ok()?;
                let parts: Vec<String> = dims
                    .iter()
                    .filter_map(|(t, _)| cfg.get(t).map(|v| format!("{t}={v}")))
                    .collect();
                Some(format!("tiles {} {}", kernel.name, parts.join(" ")))
            }
            _ => None,
        }
    }
}

/// The covering tiles of `kernel` for the call's sizes, or why there are none.
fn self_cover(
    kernel: &'static KernelMeta,
    dims: &[(&'static str, &'static str)],
    call: &OpCall,
) -> Result<dsl_core::Config, String> {
    let want: Vec<(&str, usize, &str)> = dims
        .iter()
        .filter_map(|(t, p)| call.param(p).map(|v| (*t, v, *p)))
        .collect();
    kernels::tile_choice::cover(kernel, &dsl_core::Config::new(), &want).map_err(|e| e.to_string())
}

fn tunable_values(kernel: &KernelMeta, tunable: &str) -> Vec<i64> {
    kernel
        .tunables
        .iter()
        .find(|(n, _)| *n == tunable)
        .map(|(_, v)| v.to_vec())
        .unwrap_or_default()
}

/// How one operator kind is covered: status, kernels, size checks, and a short "how".
#[derive(Debug, Clone)]
pub struct Rule {
    /// Status when every check passes.
    pub status: Status,
    /// The kernels it runs.
    pub kernels: Vec<&'static KernelMeta>,
    /// Sizes the kernels must take.
    pub checks: Vec<Check>,
    /// One short line: how it is built, or what is missing.
    pub how: String,
}

fn rule(status: Status, kernels: Vec<&'static KernelMeta>, checks: Vec<Check>, how: &str) -> Rule {
    Rule {
        status,
        kernels,
        checks,
        how: how.to_string(),
    }
}

fn missing(how: &str) -> Rule {
    rule(Status::Missing, vec![], vec![], how)
}

/// The registry's implementations of `op` with `checks` on each (built from its metadata), or
/// missing with `absent` when none is registered.
fn from_registry(
    op: &str,
    checks: impl Fn(&'static KernelMeta) -> Vec<Check>,
    absent: &str,
) -> Rule {
    match registered(op) {
        Some((s, k)) => {
            let c = k.iter().flat_map(|m| checks(m)).collect();
            rule(s, k, c, "")
        }
        None => missing(absent),
    }
}

/// Implementations registered for `op` in [`kernels::registry`]: `HandTuned` with the hand-tuned
/// ones when any is `HandTuned`, else `Dsl` with the tuned DSL ones (or all of them when none is
/// tuned); `None` when the registry has none.
fn registered(op: &str) -> Option<(Status, Vec<&'static KernelMeta>)> {
    let impls = registry::implementations(op);
    if impls.is_empty() {
        return None;
    }
    let of = |kind: ImplKind| -> Vec<&'static KernelMeta> {
        impls
            .iter()
            .filter(|i| i.kind == kind)
            .map(|i| i.meta)
            .collect()
    };
    let (hand, tuned) = (of(ImplKind::HandTuned), of(ImplKind::DslTuned));
    Some(if !hand.is_empty() {
        (Status::HandTuned, hand)
    } else if !tuned.is_empty() {
        (Status::Dsl, tuned)
    } else {
        (Status::Dsl, impls.iter().map(|i| i.meta).collect())
    })
}

/// The operator → kernel table.
pub fn rules(kind: &OpKind) -> Rule {
    use kernels::attention::{decode, prefill, sparse};
    use kernels::linear_attention::{chunked, conv, recurrent};
    use kernels::moe::expert_gemm as moe;
    // Projections run the `linear` kernels (the model has no GEMM swap yet), not `gemm`.
    let gemm = registered("linear");
    let norm = registered("rmsnorm_residual");
    let covers = |kernel: &'static KernelMeta, dims: &'static [(&'static str, &'static str)]| {
        Check::Covers { kernel, dims }
    };
    let swiglu = &moe::swiglu::META;
    match kind {
        OpKind::Embedding => from_registry("embedding", |_| vec![], "no embedding kernel"),
        // One row tile up to the largest BH, the column-tile loop above: any width runs.
        OpKind::RmsNormResidual => match norm {
            Some((s, k)) => rule(
                s,
                k,
                vec![],
                "one row tile up to BH 16384, a column-tile loop above",
            ),
            None => missing("no rmsnorm_residual in the registry"),
        },
        OpKind::RmsNorm => from_registry("rmsnorm", |_| vec![], "no RMSNorm kernel"),
        OpKind::LayerNorm => from_registry("layernorm", |_| vec![], "no LayerNorm kernel"),
        OpKind::Linear | OpKind::LmHead => match gemm {
            Some((s, k)) => rule(s, k, vec![], ""),
            None => missing("no GEMM in the registry"),
        },
        OpKind::Rope => from_registry(
            "rope",
            // Head and span widths are run-time values, looped over in tiles: any size runs.
            |_| vec![],
            "no rotary-embedding kernel",
        ),
        OpKind::KvCacheAppend => from_registry(
            "kv_cache_append",
            |_| vec![],
            "no kernel writes new rows into cache pages",
        ),
        OpKind::MlaAbsorb => rule(
            Status::Dsl,
            vec![&kernels::linear::linear_heads::META],
            vec![],
            "every head's map in one launch (heads on the grid)",
        ),
        OpKind::MlaAttention(Phase::Decode) => {
            // The forward's latent decode: one kernel over every sequence's pages, its BD tile
            // covering the whole latent row (values are its first DV columns).
            let k = vec![
                &decode::paged_decode_latent::META,
                &decode::decode_combine::META,
            ];
            let c = vec![
                covers(&decode::paged_decode_latent::META, &[("BD", "D")]),
                covers(&decode::decode_combine::META, &[("BDV", "DV")]),
            ];
            rule(Status::Dsl, k, c, "latent MQA (kv_heads 1)")
        }
        OpKind::MlaAttention(Phase::Prefill) => {
            // The forward's dense MLA prefill (`forward::mla`): the context's latents expanded
            // through kv_b_proj (a GEMM) into per-head keys and values, then flash attention.
            let m = &prefill::flash_prefill::META;
            rule(
                Status::Composite,
                vec![m],
                vec![covers(m, &[("BD", "DQK"), ("BDV", "DVH")])],
                "context expanded through kv_b_proj into per-head keys and values",
            )
        }
        OpKind::DsaIndexer(Phase::Decode) => {
            let m = &sparse::indexer_decode::META;
            let c = vec![covers(m, &[("HI", "HI"), ("DI", "DI")])];
            rule(Status::Dsl, vec![m], c, "")
        }
        OpKind::DsaIndexer(Phase::Prefill) => {
            let m = &sparse::indexer_prefill::META;
            rule(Status::Dsl, vec![m], vec![covers(m, &[("DI", "DI")])], "")
        }
        OpKind::DsaTopk(p) => {
            let m = &sparse::topk_select::META;
            let c = vec![covers(m, &[("K", "K")])];
            let note = match p {
                Phase::Decode => "",
                Phase::Prefill => "one selection per query token",
            };
            rule(Status::Dsl, vec![m], c, note)
        }
        OpKind::SparseMlaAttention(p) => {
            let m = &sparse::sparse_mla::META;
            let c = vec![covers(m, &[("BD", "D"), ("BDV", "DV")])];
            let note = match p {
                Phase::Decode => "",
                Phase::Prefill => "each query token with its own selection",
            };
            rule(Status::Dsl, vec![m], c, note)
        }
        OpKind::GqaAttention(Phase::Prefill) => {
            let m = &prefill::flash_prefill::META;
            rule(
                Status::Dsl,
                vec![m],
                vec![covers(m, &[("BD", "D"), ("BDV", "DV")])],
                "",
            )
        }
        OpKind::GqaAttention(Phase::Decode) => rule(
            Status::Dsl,
            vec![
                &decode::paged_decode_gqa_batch::META,
                &decode::decode_combine::META,
            ],
            vec![
                covers(
                    &decode::paged_decode_gqa_batch::META,
                    &[("BD", "D"), ("BDV", "DV")],
                ),
                covers(&decode::decode_combine::META, &[("BDV", "DV")]),
            ],
            "every sequence in one launch, windows and sinks in the kernel",
        ),
        OpKind::AttnOutputGate => {
            from_registry("sigmoid_mul", |_| vec![], "no sigmoid-gate kernel")
        }
        OpKind::BiasAdd => from_registry("add_bias", |_| vec![], "no bias-add kernel"),
        OpKind::RowScale => from_registry("mul_col", |_| vec![], "no per-row scale kernel"),
        OpKind::ShortConv => rule(
            Status::Dsl,
            vec![
                &conv::short_conv_chunked::META,
                &conv::short_conv4::META,
                &conv::short_conv::META,
                &conv::short_conv_decode::META,
            ],
            vec![],
            "any tap count: prompts in token blocks, one token per sequence or a batch's tokens",
        ),
        OpKind::DeltaGates(Decay::Scalar) => rule(
            Status::Dsl,
            vec![&kernels::linear_attention::gates::gdn_gates::META],
            vec![],
            "",
        ),
        OpKind::DeltaGates(Decay::PerChannel) => {
            let m = &kernels::linear_attention::gates::kda_gates::META;
            rule(Status::Dsl, vec![m], vec![covers(m, &[("BDK", "DK")])], "")
        }
        OpKind::DeltaRule(decay, p) => {
            let m: &'static KernelMeta = match (decay, p) {
                (Decay::Scalar, Phase::Prefill) => &chunked::chunked_delta::META,
                (Decay::Scalar, Phase::Decode) => &recurrent::recurrent_delta::META,
                (Decay::PerChannel, Phase::Prefill) => &chunked::chunked_delta_kda::META,
                (Decay::PerChannel, Phase::Decode) => &recurrent::recurrent_delta_kda::META,
            };
            rule(
                Status::Dsl,
                vec![m],
                vec![covers(m, &[("BDK", "DK"), ("BDV", "DV")])],
                "",
            )
        }
        OpKind::GatedRmsNorm(decay) => {
            let m = match decay {
                Decay::Scalar => &kernels::linear_attention::gates::gated_rmsnorm_silu::META,
                Decay::PerChannel => &kernels::linear_attention::gates::gated_rmsnorm_sigmoid::META,
            };
            rule(
                Status::Dsl,
                vec![m],
                vec![covers(m, &[("BDV", "width")])],
                "",
            )
        }
        OpKind::MoeRouter(RouterKind::SigmoidGroupTopk) => from_registry(
            "moe_router_sigmoid_group_topk",
            |_| vec![],
            "no sigmoid + bias + group-limited top-k kernel",
        ),
        OpKind::MoeRouter(RouterKind::SoftmaxTopk) => from_registry(
            "moe_router_softmax_topk",
            |_| vec![],
            "no per-token softmax top-k kernel",
        ),
        OpKind::MoeRouter(RouterKind::SoftmaxBiasTopk) => from_registry(
            "moe_router_softmax_bias_topk",
            |_| vec![],
            "no softmax + correction-bias top-k kernel",
        ),
        // Top-k of the logits with their sigmoids as weights: the sigmoid group top-k kernel with
        // no correction bias, one group and no renormalisation picks the same experts (the
        // sigmoid is monotonic) and writes the same weights.
        OpKind::MoeRouter(RouterKind::SigmoidTopkScaledInput) => from_registry(
            "moe_router_sigmoid_group_topk",
            |_| vec![],
            "no sigmoid top-k kernel",
        ),
        OpKind::MoeRouter(RouterKind::Unknown(_)) => missing("unknown router"),
        OpKind::MoeDispatch => from_registry(
            "moe_dispatch",
            |_| vec![],
            "no permute/gather-by-expert kernel",
        ),
        // What the forward launches: the grouped GEMM over the dispatched rows in the
        // checkpoint's format (FP8 after quantizing the rows, W8A16 where the matrix unit has
        // no FP8 mode), then SwiGLU; the library's fused per-expert kernels (`expert_gemm*`)
        // are for `day0 tune` and swaps, not what a model step runs.
        // What the forward launches: the grouped GEMM over the dispatched rows in the
        // checkpoint's format (FP8 after quantizing the rows, W8A16 where the matrix unit has
        // no FP8 mode), then SwiGLU; the library's fused per-expert kernels (`expert_gemm*`)
        // are for `day0 tune` and swaps, not what a model step runs.
        OpKind::ExpertFfn(w) => {
            let (op, quantize, block, why) = match w {
                ExpertWeights::Float => ("moe_grouped_linear_bf16", false, 0, ""),
                ExpertWeights::Fp8 => ("moe_grouped_linear_fp8", true, 0, ""),
                ExpertWeights::Mxfp4 => (
                    "moe_grouped_linear_mxfp4",
                    false,
                    32,
                    "MXFP4 blocks of 32 along K",
                ),
                ExpertWeights::Int4(group) => (
                    "moe_grouped_linear_int4",
                    false,
                    *group,
                    "one INT4 scale per group along K",
                ),
                ExpertWeights::Other(_) => return missing("no expert GEMM for this weight format"),
            };
            // Every implementation: the forward picks per launch (W8A8 or W8A16 by device; the
            // faster of the MXFP4 prototype and its hand-tuned swap).
            let all = registry::implementations(op);
            if all.is_empty() {
                return missing("no grouped expert GEMM for this weight format");
            }
            let hand = all.iter().any(|i| i.kind == ImplKind::HandTuned);
            let status = if hand { Status::HandTuned } else { Status::Dsl };
            let mut k: Vec<&'static KernelMeta> = all.iter().map(|i| i.meta).collect();
            if quantize {
                let Some((_, q)) = registered("act_quant_fp8") else {
                    return missing("no per-token FP8 activation quantizer");
                };
                k.splice(0..0, q);
            }
            k.push(swiglu);
            let checks = match block {
                0 => vec![],
                of => ["hidden", "inter"]
                    .into_iter()
                    .map(|param| Check::MultipleOf { param, of, why })
                    .collect(),
            };
            rule(status, k, checks, "")
        }
        OpKind::ExpertBias => from_registry(
            "moe_grouped_bias",
            |_| vec![],
            "no kernel adds per-expert biases to grouped rows",
        ),
        OpKind::ClampedSwiglu => {
            from_registry("swiglu_clamped", |_| vec![], "no clamped SwiGLU kernel")
        }
        OpKind::MoeCombine => {
            from_registry("moe_combine", |_| vec![], "no weighted combine kernel")
        }
        OpKind::SharedExpert | OpKind::DenseMlp => match gemm {
            Some((_, mut k)) => {
                k.truncate(1);
                k.push(swiglu);
                rule(
                    Status::Composite,
                    k,
                    vec![],
                    "gate/up GEMM + swiglu + down GEMM",
                )
            }
            None => missing("no GEMM in the registry"),
        },
        OpKind::SharedExpertGate => match (gemm, registered("sigmoid_mul_col")) {
            (Some((_, mut k)), Some((_, g))) => {
                k.truncate(1);
                k.extend(g);
                rule(
                    Status::Composite,
                    k,
                    vec![],
                    "gate GEMM + per-row sigmoid scale",
                )
            }
            _ => missing("no sigmoid-gate kernel"),
        },
        OpKind::Unknown(_) => missing("not a known layer kind: no operator mapping"),
    }
}

/// One operator kind in the inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct CoverageRow {
    /// The operator kind's key (`mla_attention.decode`).
    pub op: String,
    /// Layers that call it (0 for model-level operators).
    pub layers: usize,
    /// Calls in the prefill and decode graphs together.
    pub calls: usize,
    /// Status (the worst over its calls: a size check that fails makes it `missing`).
    pub status: Status,
    /// Kernel names (`KernelMeta::name`).
    pub kernels: Vec<String>,
    /// How it is built, or why it is missing.
    pub how: String,
    /// Variant details seen (`interleaved, yarn x40, theta 10000`).
    pub details: Vec<String>,
    /// One call's shapes, as an example.
    pub example: String,
}

/// The inventory of one model.
#[derive(Debug, Clone, PartialEq)]
pub struct Coverage {
    /// The configuration file.
    pub source: String,
    /// `model_type`.
    pub model_type: String,
    /// Architecture name.
    pub family: String,
    /// Decoder layers.
    pub layers: usize,
    /// Layer kinds (`attention: 61 sparse_mla; ffn: 3 dense + 58 moe`).
    pub layer_summary: String,
    /// One row per operator kind, in graph order of kinds.
    pub rows: Vec<CoverageRow>,
    /// Facts that qualify the table (weight formats, shapes used).
    pub notes: Vec<String>,
    /// Configuration warnings (unknown fields, defaults applied).
    pub warnings: Vec<String>,
}

/// Parses the configuration at `path` (a file, or a model directory with `config.json`) and
/// takes its inventory with the default graph shape (4096-token prefill, one-token decode at a
/// 4096-token context). What `day0 coverage --config FILE` calls.
pub fn inventory(path: &Path) -> Result<Coverage, ModelError> {
    let cfg = load_config(path)?;
    let mut c = Coverage::of_config(&cfg);
    // A multimodal configuration's vision encoder (a bad `vision_config` is the vision command's
    // error to report; the language model's inventory stands without it).
    if let Ok(v) = crate::vision::load_vision_config(path) {
        c.add_vision(&v);
    }
    Ok(c)
}

impl Coverage {
    /// Adds the vision encoder's operators (`vision.*` rows, `layers` = encoder blocks) and the
    /// hand-off to the language model: image tokens placed at the prompt's placeholders, DeepStack
    /// injection, and the text model's multi-axis RoPE tables.
    pub fn add_vision(&mut self, v: &crate::vision::VisionConfig) {
        use kernels::attention::varlen::varlen_attention;
        use kernels::vision::{pos_embed::pos_embed_bilinear, scatter::scatter_rows};
        let (lin, norm, gelu, rope) = (
            &kernels::linear::linear_bias::META,
            &kernels::norm::layernorm::META,
            &kernels::elementwise::gelu::META,
            &kernels::rope::rope::META,
        );
        let hd = v.head_dim();
        let attention_covers =
            kernels::tile_choice::at_least(&varlen_attention::META, "BD", hd).is_some();
        let depth = v.depth;
        let mergers = 1 + v.deepstack_visual_indexes.len();
        let rows: Vec<(&str, usize, Status, Vec<&KernelMeta>, String)> = vec![
            (
                "vision.patch_embed",
                0,
                Status::Dsl,
                vec![lin],
                "Conv3d (kernel = stride) as a GEMM over patch rows".into(),
            ),
            (
                "vision.pos_embed",
                0,
                Status::Dsl,
                vec![&pos_embed_bilinear::META],
                "learned grid, bilinear to each image".into(),
            ),
            (
                "vision.layernorm",
                depth,
                Status::Dsl,
                vec![norm],
                String::new(),
            ),
            (
                "vision.qkv_proj_mlp",
                depth,
                Status::Dsl,
                vec![lin],
                "qkv, proj, fc1, fc2 with bias".into(),
            ),
            (
                "vision.rope_2d",
                depth,
                Status::Composite,
                vec![rope],
                "the rope kernel on (row, column) tables".into(),
            ),
            (
                "vision.attention",
                depth,
                if attention_covers {
                    Status::Dsl
                } else {
                    Status::Missing
                },
                vec![&varlen_attention::META],
                if attention_covers {
                    "bidirectional within each image (cu_seqlens)".into()
                } else {
                    format!("no BD tile covers head_dim {hd}")
                },
            ),
            (
                "vision.gelu",
                depth,
                Status::Dsl,
                vec![gelu],
                if v.gelu_tanh { "tanh form" } else { "exact" }.into(),
            ),
            (
                "vision.merger",
                mergers,
                Status::Composite,
                vec![norm, lin, gelu],
                "LayerNorm, fc1, exact GELU, fc2 over each merged block".into(),
            ),
            (
                "vision.image_tokens",
                0,
                Status::Dsl,
                vec![&scatter_rows::META],
                "image embeddings written at the placeholder tokens".into(),
            ),
            (
                "vision.deepstack",
                v.deepstack_visual_indexes.len(),
                Status::Dsl,
                vec![&scatter_rows::META],
                "added to early language layers at image positions".into(),
            ),
            (
                "text.mrope",
                0,
                Status::Composite,
                vec![rope],
                "the rope kernel on interleaved (t, h, w) tables".into(),
            ),
        ];
        for (op, layers, status, metas, how) in rows {
            self.rows.push(CoverageRow {
                op: op.to_string(),
                layers,
                calls: layers.max(1),
                status,
                kernels: metas.iter().map(|m| m.name.to_string()).collect(),
                how,
                details: vec![],
                example: format!(
                    "{}x{} patches of {} values, {} heads of {hd}",
                    v.patch_size,
                    v.patch_size,
                    v.patch_values(),
                    v.num_heads
                ),
            });
        }
        self.notes.push(format!(
            "vision encoder: {} blocks, hidden {}, merged {}x{} to {} (day0 vision costs it)",
            v.depth, v.hidden_size, v.spatial_merge_size, v.spatial_merge_size, v.out_hidden_size
        ));
    }
}

impl Coverage {
    /// The inventory of a parsed configuration (default graph shape).
    pub fn of_config(cfg: &ModelConfig) -> Coverage {
        let shape = GraphShape::default();
        let g = graph::build(cfg, &shape);
        Coverage::of_graph(cfg, &g)
    }

    /// The inventory of given graphs.
    pub fn of_graph(cfg: &ModelConfig, g: &ModelGraph) -> Coverage {
        struct Acc {
            kind: OpKind,
            layers: BTreeSet<usize>,
            calls: usize,
            failures: BTreeSet<String>,
            details: BTreeSet<String>,
            example: String,
        }
        let mut accs: Vec<Acc> = Vec::new();
        for (_, call) in g.calls() {
            let i = match accs.iter().position(|a| a.kind == call.kind) {
                Some(i) => i,
                None => {
                    accs.push(Acc {
                        kind: call.kind.clone(),
                        layers: BTreeSet::new(),
                        calls: 0,
                        failures: BTreeSet::new(),
                        details: BTreeSet::new(),
                        example: format!("{}: {}", call.name, call.signature()),
                    });
                    accs.len() - 1
                }
            };
            let a = &mut accs[i];
            a.calls += 1;
            if let Some(l) = call.layer {
                a.layers.insert(l);
            }
            if let Some(d) = &call.detail {
                a.details.insert(d.clone());
            }
            for c in rules(&call.kind).checks {
                if let Some(f) = c.failure(call) {
                    a.failures.insert(f);
                }
                if let Some(t) = c.tiles(call) {
                    a.details.insert(t);
                }
            }
        }
        accs.sort_by(|a, b| a.kind.cmp(&b.kind));
        let rows = accs
            .into_iter()
            .map(|a| {
                let r = rules(&a.kind);
                let (status, how) = if a.failures.is_empty() {
                    (r.status, r.how)
                } else {
                    (
                        Status::Missing,
                        a.failures.into_iter().collect::<Vec<_>>().join("; "),
                    )
                };
                CoverageRow {
                    op: a.kind.key(),
                    layers: a.layers.len(),
                    calls: a.calls,
                    status,
                    kernels: r.kernels.iter().map(|m| m.name.to_string()).collect(),
                    how,
                    details: a.details.into_iter().collect(),
                    example: a.example,
                }
            })
            .collect();
        let mut notes = vec![format!(
            "shapes: prefill {} tokens; decode {} sequence(s) at context {}",
            g.prefill.tokens, g.decode.tokens, g.decode.context
        )];
        match &cfg.weight_format {
            WeightFormat::Fp8Block { block } => notes.push(format!(
                "checkpoint weights are FP8 E4M3 with {}x{} block scales, read as stored at native \
                 precision: projections run act_quant_fp8 + linear_fp8 (W8A8; the `linear` row \
                 lists the kernels an f32/bf16 run uses), routed experts act_quant_fp8 + \
                 grouped_linear_fp8 (W8A16 forms on a matrix unit without an FP8 mode)",
                block[0], block[1]
            )),
            WeightFormat::Other(m) => notes.push(format!(
                "checkpoint quantization `{m}` is not modelled: `linear` assumes bf16 weights"
            )),
            _ => {}
        }
        if let Some(r) = &cfg.rope {
            if let Some(src) = r.source {
                notes.push(format!("RoPE from `{src}`: {}", r.describe()));
            }
        }
        Coverage {
            source: cfg.source.clone(),
            model_type: cfg.model_type.clone(),
            family: cfg.family.display_name().to_string(),
            layers: cfg.num_layers(),
            layer_summary: cfg.layer_summary(),
            rows,
            notes,
            warnings: cfg.warnings.iter().map(|w| w.to_string()).collect(),
        }
    }

    /// The operator kinds with status `missing`, by key (unknown layer kinds included, named).
    pub fn missing(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|r| r.status == Status::Missing)
            .map(|r| r.op.clone())
            .collect()
    }

    /// Whether nothing is missing.
    pub fn is_complete(&self) -> bool {
        self.rows.iter().all(|r| r.status != Status::Missing)
    }

    /// The row of operator kind `op`.
    pub fn row(&self, op: &str) -> Option<&CoverageRow> {
        self.rows.iter().find(|r| r.op == op)
    }

    /// Number of rows per status, best first.
    pub fn counts(&self) -> Vec<(Status, usize)> {
        [
            Status::HandTuned,
            Status::Dsl,
            Status::Composite,
            Status::Missing,
        ]
        .into_iter()
        .map(|s| (s, self.rows.iter().filter(|r| r.status == s).count()))
        .collect()
    }

    /// The ten-second view: one line per operator kind (layers, status, kernels, how), a summary
    /// line and the missing operators by name.
    pub fn table(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!("coverage of {}\n", self.source));
        out.push_str(&format!(
            "model: {} ({}), {} layers ({})\n\n",
            self.model_type, self.family, self.layers, self.layer_summary
        ));
        let w = self
            .rows
            .iter()
            .map(|r| r.op.len())
            .max()
            .unwrap_or(8)
            .max("operator".len());
        out.push_str(&format!(
            "{:<w$}  {:>6}  {:<10}  kernel(s)\n",
            "operator", "layers", "status"
        ));
        for r in &self.rows {
            let layers = if r.layers == 0 {
                "model".to_string()
            } else {
                r.layers.to_string()
            };
            let kernels =
                if r.status == Status::Missing && !r.how.is_empty() && r.kernels.is_empty() {
                    format!("- ({})", r.how)
                } else if r.status == Status::Missing {
                    format!("{} -- {}", r.kernels.join(" + "), r.how)
                } else if r.how.is_empty() {
                    r.kernels.join(" + ")
                } else {
                    format!("{} ({})", r.kernels.join(" + "), r.how)
                };
            out.push_str(&format!(
                "{:<w$}  {:>6}  {:<10}  {}\n",
                r.op,
                layers,
                r.status.name(),
                kernels
            ));
        }
        let counts: Vec<String> = self
            .counts()
            .into_iter()
            .map(|(s, n)| format!("{n} {s}"))
            .collect();
        out.push_str(&format!(
            "\n{} operators: {}\n",
            self.rows.len(),
            counts.join(", ")
        ));
        let missing = self.missing();
        if missing.is_empty() {
            out.push_str("missing: none\n");
        } else {
            out.push_str(&format!(
                "MISSING ({}): {}\n",
                missing.len(),
                missing.join(", ")
            ));
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        for w in &self.warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
        out
    }

    /// The inventory as JSON: model, rows (op, layers, calls, status, kernels, how, details,
    /// example), missing, counts, notes, warnings.
    pub fn to_json(&self) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "op": r.op,
                    "layers": r.layers,
                    "calls": r.calls,
                    "status": r.status.name(),
                    "kernels": r.kernels,
                    "how": r.how,
                    "details": r.details,
                    "example": r.example,
                })
            })
            .collect();
        let counts: serde_json::Map<String, Value> = self
            .counts()
            .into_iter()
            .map(|(s, n)| (s.name().to_string(), json!(n)))
            .collect();
        json!({
            "source": self.source,
            "model_type": self.model_type,
            "family": self.family,
            "layers": self.layers,
            "layer_summary": self.layer_summary,
            "complete": self.is_complete(),
            "counts": counts,
            "missing": self.missing(),
            "operators": rows,
            "notes": self.notes,
            "warnings": self.warnings,
        })
    }

    /// [`Coverage::to_json`], pretty-printed.
    pub fn to_json_string(&self) -> String {
        serde_json::to_string_pretty(&self.to_json())
            .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}
