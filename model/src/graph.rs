//! # Operator graph: a model as the list of operator calls it makes, with shapes
//!
//! [`build`] turns a [`ModelConfig`] into two straight-line graphs — one prefill step over
//! `prefill_tokens` tokens and one decode step for `decode_batch` sequences of `context` tokens —
//! each an ordered list of [`OpCall`]s: embedding, then per layer the pre-norm, the attention
//! block of the layer's kind, the post-attention norm and the feed-forward block, then the final
//! norm and `lm_head`. Each call carries its operator kind ([`OpKind`], what the coverage
//! inventory keys on), the layer, the module name as the reference code names it, input and output
//! shapes, and the sizes a kernel must support (`params`: head dims, widths...).
//!
//! The decomposition is the one day0 runs, not necessarily the reference's:
//! - **MLA** uses the weight-absorbed form in both phases (the cache holds the latent
//!   `c_KV ‖ k_R`; queries are absorbed by `W_UK`, outputs expanded by `W_UV`), so prefill and
//!   decode read the same cache and the same attention kernel family;
//! - **DSA** (DeepSeek-V3.2) adds the lightning indexer (`wq_b`, `wk`, `k_norm` LayerNorm,
//!   `weights_proj`, non-interleaved RoPE), top-`index_topk` selection, and MLA over the selected
//!   rows only;
//! - **Gated GQA** (Qwen3-Next) splits `q_proj` into the query and the output gate, normalises q
//!   and k per head, rotates `partial_rotary_factor` of each head (half-split);
//! - **Gated DeltaNet / KDA** run the projections, the causal short convolution, the gate
//!   computation, the gated delta rule (chunked in prefill, recurrent in decode) and the gated
//!   output RMSNorm;
//! - **MoE** is router logits (a GEMM), scoring + top-k, dispatch (tokens permuted by expert),
//!   grouped expert SwiGLU FFNs, combine (weighted scatter back), plus shared expert(s) and, for
//!   Qwen3-Next, the shared expert's sigmoid gate.
//!
//! Unknown layer kinds become [`OpKind::Unknown`] calls, so nothing a configuration asks for is
//! dropped silently.

use crate::config::{
    AttentionKind, Decay, ExpertActivation, FfnKind, LinearAttnDims, MlaDims, ModelConfig,
    RouterKind, WeightFormat,
};
use std::fmt;

/// Which step of generation a graph describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    /// All prompt tokens at once (causal).
    Prefill,
    /// One new token per sequence against the cache.
    Decode,
}

impl Phase {
    /// `prefill` / `decode`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How expert weights are stored, as far as the expert FFN operator is concerned.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ExpertWeights {
    /// bf16/f16/f32.
    Float,
    /// Block-scaled FP8 in the checkpoint.
    Fp8,
    /// MXFP4.
    Mxfp4,
    /// Group-scaled INT4 (W4A16), with its group size.
    Int4(usize),
    /// Another format, by name.
    Other(String),
}

/// An operator kind: what the coverage inventory keys on. Declaration order is table order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OpKind {
    /// Token ids → embedding rows.
    Embedding,
    /// RMSNorm without a residual (the first layer's input norm, MLA's `q_a`/`kv_a` norms, q/k
    /// norms).
    RmsNorm,
    /// Residual add fused with RMSNorm (pre-norm blocks, final norm).
    RmsNormResidual,
    /// LayerNorm with bias (DSA indexer `k_norm`).
    LayerNorm,
    /// A dense projection `y = x Wᵀ`.
    Linear,
    /// Rotary position embedding applied to q and k.
    Rope,
    /// Writing this step's rows into the paged cache (latent, keys/values, indexer keys).
    KvCacheAppend,
    /// MLA weight absorption: per-head products with `W_UK` (queries) or `W_UV` (outputs).
    MlaAbsorb,
    /// MLA attention over the whole cached latent.
    MlaAttention(Phase),
    /// DSA lightning-indexer scores.
    DsaIndexer(Phase),
    /// DSA top-`index_topk` selection.
    DsaTopk(Phase),
    /// MLA attention over the selected latent rows.
    SparseMlaAttention(Phase),
    /// Grouped-query attention.
    GqaAttention(Phase),
    /// `o · σ(gate)` after attention (Qwen3-Next).
    AttnOutputGate,
    /// A bias row added to every token's projection (`x + b`).
    BiasAdd,
    /// Every row times its own scalar (`x[t, :] · s[t]`): Llama 4's router score on a routed
    /// expert's input, and its NoPE layers' attention temperature on the query.
    RowScale,
    /// Causal depthwise short convolution + SiLU (linear attention).
    ShortConv,
    /// Decay and β gates of the delta rule (`g = −exp(A_log)·softplus(a + dt_bias)`, `β = σ(b)`).
    DeltaGates(Decay),
    /// The gated delta rule itself (chunked in prefill, recurrent in decode).
    DeltaRule(Decay, Phase),
    /// `RMSNorm(o) · act(z)` output norm of linear attention.
    GatedRmsNorm(Decay),
    /// MoE scoring and top-k selection.
    MoeRouter(RouterKind),
    /// Permute tokens by expert (gather).
    MoeDispatch,
    /// Grouped SwiGLU expert FFNs.
    ExpertFfn(ExpertWeights),
    /// Per-expert bias rows added to expert-grouped rows (gpt-oss's expert projection biases).
    ExpertBias,
    /// gpt-oss's clamped SwiGLU of the expert FFN (`alpha`, `limit`).
    ClampedSwiglu,
    /// Weighted scatter of expert outputs back to token order.
    MoeCombine,
    /// Shared expert (SwiGLU MLP every token goes through).
    SharedExpert,
    /// Qwen3-Next's `σ(x · w)` scale of the shared expert's output.
    SharedExpertGate,
    /// Dense SwiGLU MLP.
    DenseMlp,
    /// Output projection to the vocabulary.
    LmHead,
    /// Something day0 does not know (an unknown layer kind or router), by description.
    Unknown(String),
}

impl OpKind {
    /// The stable key used in tables and JSON (`mla_attention.decode`, `moe_router.softmax_topk`).
    pub fn key(&self) -> String {
        match self {
            OpKind::Embedding => "embedding".into(),
            OpKind::RmsNorm => "rmsnorm".into(),
            OpKind::RmsNormResidual => "rmsnorm_residual".into(),
            OpKind::LayerNorm => "layernorm".into(),
            OpKind::Linear => "linear".into(),
            OpKind::Rope => "rope".into(),
            OpKind::KvCacheAppend => "kv_cache_append".into(),
            OpKind::MlaAbsorb => "mla_absorb".into(),
            OpKind::MlaAttention(p) => format!("mla_attention.{p}"),
            OpKind::DsaIndexer(p) => format!("dsa_indexer.{p}"),
            OpKind::DsaTopk(p) => format!("dsa_topk.{p}"),
            OpKind::SparseMlaAttention(p) => format!("sparse_mla_attention.{p}"),
            OpKind::GqaAttention(p) => format!("gqa_attention.{p}"),
            OpKind::AttnOutputGate => "attn_output_gate".into(),
            OpKind::BiasAdd => "bias_add".into(),
            OpKind::RowScale => "row_scale".into(),
            OpKind::ShortConv => "short_conv".into(),
            OpKind::DeltaGates(Decay::Scalar) => "delta_gates.gdn".into(),
            OpKind::DeltaGates(Decay::PerChannel) => "delta_gates.kda".into(),
            OpKind::DeltaRule(Decay::Scalar, p) => format!("gated_delta_rule.{p}"),
            OpKind::DeltaRule(Decay::PerChannel, p) => format!("kda_delta_rule.{p}"),
            OpKind::GatedRmsNorm(Decay::Scalar) => "gated_rmsnorm".into(),
            OpKind::GatedRmsNorm(Decay::PerChannel) => "gated_rmsnorm.kda".into(),
            OpKind::MoeRouter(r) => format!("moe_router.{}", r.name()),
            OpKind::MoeDispatch => "moe_dispatch".into(),
            OpKind::ExpertFfn(ExpertWeights::Float) => "expert_ffn".into(),
            OpKind::ExpertFfn(ExpertWeights::Fp8) => "expert_ffn.fp8".into(),
            OpKind::ExpertFfn(ExpertWeights::Mxfp4) => "expert_ffn.mxfp4".into(),
            OpKind::ExpertFfn(ExpertWeights::Int4(_)) => "expert_ffn.int4".into(),
            OpKind::ExpertFfn(ExpertWeights::Other(s)) => format!("expert_ffn.{s}"),
            OpKind::ExpertBias => "moe_expert_bias".into(),
            OpKind::ClampedSwiglu => "swiglu_clamped".into(),
            OpKind::MoeCombine => "moe_combine".into(),
            OpKind::SharedExpert => "shared_expert".into(),
            OpKind::SharedExpertGate => "shared_expert_gate".into(),
            OpKind::DenseMlp => "dense_mlp".into(),
            OpKind::LmHead => "lm_head".into(),
            OpKind::Unknown(s) => format!("unknown: {s}"),
        }
    }
}

/// A named tensor operand with its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// Name (`x`, `w`, `cache`...).
    pub name: String,
    /// Shape.
    pub dims: Vec<usize>,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        write!(f, "{}[{}]", self.name, d.join(","))
    }
}

/// One operator call.
#[derive(Debug, Clone, PartialEq)]
pub struct OpCall {
    /// Operator kind.
    pub kind: OpKind,
    /// Decoder layer, `None` for model-level calls (embedding, final norm, lm_head).
    pub layer: Option<usize>,
    /// Module name in the reference code's naming (`layers.3.self_attn.q_a_proj`).
    pub name: String,
    /// Inputs (activations and weights).
    pub inputs: Vec<Operand>,
    /// Outputs.
    pub outputs: Vec<Operand>,
    /// Sizes a kernel must support (`D`, `DV`, `width`...).
    pub params: Vec<(&'static str, usize)>,
    /// Variant details (`interleaved, yarn x40, theta 10000`).
    pub detail: Option<String>,
}

impl OpCall {
    /// The value of `param`, if the call has it.
    pub fn param(&self, name: &str) -> Option<usize> {
        self.params
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    }

    /// `x[4096,7168] w[1536,7168] -> y[4096,1536]`.
    pub fn signature(&self) -> String {
        let ins: Vec<String> = self.inputs.iter().map(|o| o.to_string()).collect();
        let outs: Vec<String> = self.outputs.iter().map(|o| o.to_string()).collect();
        format!("{} -> {}", ins.join(" "), outs.join(" "))
    }
}

/// One step's calls.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// Prefill or decode.
    pub phase: Phase,
    /// Tokens processed in the step (prompt length, or sequences in the decode batch).
    pub tokens: usize,
    /// Context each query attends over (prefill: the prompt, causally; decode: the cache length
    /// including the new token).
    pub context: usize,
    /// The calls, in execution order.
    pub ops: Vec<OpCall>,
}

/// Sizes the graphs are instantiated with (shapes only: nothing is allocated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphShape {
    /// Prompt length of the prefill step.
    pub prefill_tokens: usize,
    /// Sequences in the decode step (one new token each).
    pub decode_batch: usize,
    /// Cache length of the decode step (the new token included).
    pub context: usize,
}

impl Default for GraphShape {
    fn default() -> Self {
        GraphShape {
            prefill_tokens: 4096,
            decode_batch: 1,
            context: 4096,
        }
    }
}

/// The prefill and decode graphs of a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelGraph {
    /// Prefill step.
    pub prefill: Graph,
    /// Decode step.
    pub decode: Graph,
}

impl ModelGraph {
    /// Both graphs' calls, prefill first.
    pub fn calls(&self) -> impl Iterator<Item = (Phase, &OpCall)> {
        self.prefill
            .ops
            .iter()
            .map(|c| (Phase::Prefill, c))
            .chain(self.decode.ops.iter().map(|c| (Phase::Decode, c)))
    }
}

/// Builds the prefill and decode graphs.
pub fn build(cfg: &ModelConfig, shape: &GraphShape) -> ModelGraph {
    ModelGraph {
        prefill: build_phase(
            cfg,
            Phase::Prefill,
            shape.prefill_tokens.max(1),
            shape.prefill_tokens.max(1),
        ),
        decode: build_phase(
            cfg,
            Phase::Decode,
            shape.decode_batch.max(1),
            shape.context.max(1),
        ),
    }
}

/// Builds one step's graph: `tokens` new tokens, each attending over up to `context` tokens.
pub fn build_phase(cfg: &ModelConfig, phase: Phase, tokens: usize, context: usize) -> Graph {
    let mut b = Builder {
        cfg,
        phase,
        t: tokens,
        ctx: context,
        layer: None,
        prefix: String::new(),
        ops: Vec::new(),
    };
    let h = cfg.hidden_size;
    b.op(
        OpKind::Embedding,
        "embed_tokens",
        vec![opnd("ids", &[tokens]), opnd("table", &[cfg.vocab_size, h])],
        vec![opnd("x", &[tokens, h])],
        vec![("hidden", h), ("vocab", cfg.vocab_size)],
        None,
    );
    for (i, spec) in cfg.layers.iter().enumerate() {
        b.layer = Some(i);
        b.prefix = format!("layers.{i}.");
        if i == 0 {
            b.norm(OpKind::RmsNorm, "input_layernorm", tokens, h);
        } else {
            b.norm(OpKind::RmsNormResidual, "input_layernorm", tokens, h);
        }
        match &spec.attention {
            AttentionKind::Mla => b.mla(false),
            AttentionKind::SparseMla => b.mla(true),
            AttentionKind::Gqa
            | AttentionKind::SlidingGqa
            | AttentionKind::ChunkedGqa
            | AttentionKind::NopeGqa => b.gqa(&spec.attention),
            AttentionKind::LinearAttention => b.linear_attention(),
            AttentionKind::Unknown(k) => b.unknown(format!("attention kind `{k}`"), "self_attn"),
        }
        b.norm(
            OpKind::RmsNormResidual,
            "post_attention_layernorm",
            tokens,
            h,
        );
        match &spec.ffn {
            FfnKind::Dense => b.dense_mlp(),
            FfnKind::Moe => b.moe(),
            FfnKind::Unknown(k) => b.unknown(format!("ffn kind `{k}`"), "mlp"),
        }
    }
    b.layer = None;
    b.prefix.clear();
    b.norm(OpKind::RmsNormResidual, "norm", tokens, h);
    b.op(
        OpKind::LmHead,
        "lm_head",
        vec![opnd("x", &[tokens, h]), opnd("w", &[cfg.vocab_size, h])],
        vec![opnd("logits", &[tokens, cfg.vocab_size])],
        vec![("M", tokens), ("N", cfg.vocab_size), ("K", h)],
        None,
    );
    Graph {
        phase,
        tokens,
        context,
        ops: b.ops,
    }
}

fn opnd(name: &str, dims: &[usize]) -> Operand {
    Operand {
        name: name.to_string(),
        dims: dims.to_vec(),
    }
}

struct Builder<'c> {
    cfg: &'c ModelConfig,
    phase: Phase,
    t: usize,
    ctx: usize,
    layer: Option<usize>,
    prefix: String,
    ops: Vec<OpCall>,
}

impl Builder<'_> {
    fn op(
        &mut self,
        kind: OpKind,
        name: &str,
        inputs: Vec<Operand>,
        outputs: Vec<Operand>,
        params: Vec<(&'static str, usize)>,
        detail: Option<String>,
    ) {
        self.ops.push(OpCall {
            kind,
            layer: self.layer,
            name: format!("{}{}", self.prefix, name),
            inputs,
            outputs,
            params,
            detail,
        });
    }

    /// `y [T, n] = x [T, k] · w [n, k]ᵀ`.
    fn linear(&mut self, name: &str, k: usize, n: usize) {
        let t = self.t;
        self.op(
            OpKind::Linear,
            name,
            vec![opnd("x", &[t, k]), opnd("w", &[n, k])],
            vec![opnd("y", &[t, n])],
            vec![("M", t), ("N", n), ("K", k)],
            None,
        );
    }

    /// A norm over rows of `width` (residual-fused or plain).
    fn norm(&mut self, kind: OpKind, name: &str, rows: usize, width: usize) {
        let inputs = if kind == OpKind::RmsNormResidual {
            vec![
                opnd("x", &[rows, width]),
                opnd("residual", &[rows, width]),
                opnd("w", &[width]),
            ]
        } else {
            vec![opnd("x", &[rows, width]), opnd("w", &[width])]
        };
        self.op(
            kind,
            name,
            inputs,
            vec![opnd("y", &[rows, width])],
            vec![("width", width)],
            None,
        );
    }

    fn rope(&mut self, name: &str, q: Operand, k: Operand, rotary_dim: usize, style: &str) {
        let detail = match &self.cfg.rope {
            Some(r) => format!("{style}, {}", r.describe()),
            None => style.to_string(),
        };
        let outs = vec![q.clone(), k.clone()];
        self.op(
            OpKind::Rope,
            name,
            vec![q, k],
            outs,
            vec![("rotary_dim", rotary_dim), ("rotary_half", rotary_dim / 2)],
            Some(detail),
        );
    }

    fn cache_append(&mut self, name: &str, rows: Vec<Operand>, width: usize) {
        let ctx = self.ctx;
        self.op(
            OpKind::KvCacheAppend,
            name,
            rows,
            vec![opnd("cache", &[ctx, width])],
            vec![("width", width)],
            None,
        );
    }

    fn unknown(&mut self, what: String, name: &str) {
        let (t, h) = (self.t, self.cfg.hidden_size);
        self.op(
            OpKind::Unknown(what),
            name,
            vec![opnd("x", &[t, h])],
            vec![opnd("y", &[t, h])],
            vec![],
            None,
        );
    }

    /// MLA (absorbed form), optionally with the DSA indexer.
    fn mla(&mut self, sparse: bool) {
        let Some(m) = self.cfg.mla.clone() else {
            return self.unknown("mla without mla dimensions".into(), "self_attn");
        };
        let MlaDims {
            heads,
            q_lora_rank,
            kv_lora_rank: kvl,
            qk_nope_head_dim: nope,
            qk_rope_head_dim: rope,
            v_head_dim: v,
            ..
        } = m;
        let (t, h, ctx) = (self.t, self.cfg.hidden_size, self.ctx);
        let qk = m.qk_head_dim();
        let latent = m.latent_dim();
        match q_lora_rank {
            Some(ql) => {
                self.linear("self_attn.q_a_proj", h, ql);
                self.norm(OpKind::RmsNorm, "self_attn.q_a_layernorm", t, ql);
                self.linear("self_attn.q_b_proj", ql, heads * qk);
            }
            None => self.linear("self_attn.q_proj", h, heads * qk),
        }
        self.linear("self_attn.kv_a_proj_with_mqa", h, latent);
        self.norm(OpKind::RmsNorm, "self_attn.kv_a_layernorm", t, kvl);
        if m.use_rope {
            let style = if m.rope_interleave {
                "interleaved"
            } else {
                "half-split"
            };
            self.rope(
                "self_attn.rope",
                opnd("q_pe", &[t, heads, rope]),
                opnd("k_pe", &[t, rope]),
                rope,
                style,
            );
        }
        self.cache_append(
            "self_attn.latent_cache",
            vec![opnd("c_kv_k_pe", &[t, latent])],
            latent,
        );
        let mut selected = None;
        if sparse {
            let Some(ix) = self.cfg.indexer.clone() else {
                return self.unknown("sparse MLA without indexer dimensions".into(), "self_attn");
            };
            let q_in = q_lora_rank.unwrap_or(h);
            self.linear("self_attn.indexer.wq_b", q_in, ix.heads * ix.head_dim);
            self.linear("self_attn.indexer.wk", h, ix.head_dim);
            self.op(
                OpKind::LayerNorm,
                "self_attn.indexer.k_norm",
                vec![
                    opnd("k", &[t, ix.head_dim]),
                    opnd("w", &[ix.head_dim]),
                    opnd("b", &[ix.head_dim]),
                ],
                vec![opnd("k", &[t, ix.head_dim])],
                vec![("width", ix.head_dim)],
                None,
            );
            if m.use_rope {
                self.rope(
                    "self_attn.indexer.rope",
                    opnd("q", &[t, ix.heads, rope]),
                    opnd("k", &[t, rope]),
                    rope,
                    "half-split (first rope dims)",
                );
            }
            self.linear("self_attn.indexer.weights_proj", h, ix.heads);
            self.cache_append(
                "self_attn.indexer.k_cache",
                vec![opnd("k", &[t, ix.head_dim])],
                ix.head_dim,
            );
            let phase = self.phase;
            self.op(
                OpKind::DsaIndexer(phase),
                "self_attn.indexer",
                vec![
                    opnd("q", &[t, ix.heads, ix.head_dim]),
                    opnd("w", &[t, ix.heads]),
                    opnd("k_cache", &[ctx, ix.head_dim]),
                ],
                vec![opnd("scores", &[t, ctx])],
                vec![("HI", ix.heads), ("DI", ix.head_dim)],
                None,
            );
            let k = ix.topk.min(ctx);
            self.op(
                OpKind::DsaTopk(phase),
                "self_attn.indexer.topk",
                vec![opnd("scores", &[t, ctx])],
                vec![opnd("selected", &[t, k])],
                vec![("K", ix.topk)],
                None,
            );
            selected = Some(k);
        }
        self.op(
            OpKind::MlaAbsorb,
            "self_attn.absorb_q (W_UK)",
            vec![
                opnd("q_nope", &[heads, t, nope]),
                opnd("w_uk", &[heads, kvl, nope]),
            ],
            vec![opnd("q_latent", &[heads, t, kvl])],
            vec![("batch", heads), ("N", kvl), ("K", nope)],
            None,
        );
        let phase = self.phase;
        let (kind, inputs) = match selected {
            Some(k) => (
                OpKind::SparseMlaAttention(phase),
                vec![
                    opnd("q", &[t, heads, latent]),
                    opnd("cache", &[ctx, latent]),
                    opnd("selected", &[t, k]),
                ],
            ),
            None => (
                OpKind::MlaAttention(phase),
                vec![
                    opnd("q", &[t, heads, latent]),
                    opnd("cache", &[ctx, latent]),
                ],
            ),
        };
        // A dense MLA prefill runs expanded (per-head keys of `qk` and values of `v` dims, as
        // transformers does), so coverage checks its tiles against those too.
        let mut dims = vec![("D", latent), ("DV", kvl), ("heads", heads)];
        if selected.is_none() {
            dims.extend([("DQK", qk), ("DVH", v)]);
        }
        self.op(
            kind,
            "self_attn.attention",
            inputs,
            vec![opnd("o_latent", &[t, heads, kvl])],
            dims,
            None,
        );
        self.op(
            OpKind::MlaAbsorb,
            "self_attn.absorb_o (W_UV)",
            vec![
                opnd("o_latent", &[heads, t, kvl]),
                opnd("w_uv", &[heads, v, kvl]),
            ],
            vec![opnd("o", &[heads, t, v])],
            vec![("batch", heads), ("N", v), ("K", kvl)],
            None,
        );
        self.linear("self_attn.o_proj", heads * v, h);
    }

    /// Qwen3-Next gated GQA.
    /// Grouped-query attention, over a sliding window of keys when `sliding`.
    fn gqa(&mut self, kind: &AttentionKind) {
        let Some(g) = self.cfg.gqa.clone() else {
            return self.unknown("gqa without attention dimensions".into(), "self_attn");
        };
        let (t, h, ctx) = (self.t, self.cfg.hidden_size, self.ctx);
        let (nq, nkv, d) = (g.heads, g.kv_heads, g.head_dim);
        self.linear("self_attn.q_proj (query rows)", h, nq * d);
        if g.output_gate {
            self.linear("self_attn.q_proj (gate rows)", h, nq * d);
        }
        self.linear("self_attn.k_proj", h, nkv * d);
        self.linear("self_attn.v_proj", h, nkv * d);
        if g.qkv_bias {
            self.bias_add("self_attn.q_proj.bias", nq * d);
            self.bias_add("self_attn.k_proj.bias", nkv * d);
            self.bias_add("self_attn.v_proj.bias", nkv * d);
        }
        if g.qk_norm_across_heads {
            self.norm(
                OpKind::RmsNorm,
                "self_attn.q_norm (across heads)",
                t,
                nq * d,
            );
            self.norm(
                OpKind::RmsNorm,
                "self_attn.k_norm (across heads)",
                t,
                nkv * d,
            );
        } else if g.qk_norm {
            self.norm(OpKind::RmsNorm, "self_attn.q_norm", t * nq, d);
            self.norm(OpKind::RmsNorm, "self_attn.k_norm", t * nkv, d);
        }
        let nope = *kind == AttentionKind::NopeGqa;
        if !nope {
            let prf = self
                .cfg
                .rope
                .as_ref()
                .map_or(1.0, |r| r.partial_rotary_factor);
            let rd = ((d as f64) * prf).round() as usize;
            let style = match (g.rope_interleaved, rd == d) {
                (true, true) => "interleaved pairs",
                (true, false) => "interleaved pairs, partial",
                (false, true) => "half-split",
                (false, false) => "half-split, partial",
            };
            self.rope(
                "self_attn.rope",
                opnd("q", &[t, nq, rd]),
                opnd("k", &[t, nkv, rd]),
                rd,
                style,
            );
            if g.qk_l2_norm {
                // Llama 4's L2 norm: an RMSNorm without weight, per head, after RoPE.
                self.norm(OpKind::RmsNorm, "self_attn.q_l2_norm", t * nq, d);
                self.norm(OpKind::RmsNorm, "self_attn.k_l2_norm", t * nkv, d);
            }
        } else if let Some(temp) = g.temperature {
            self.op(
                OpKind::RowScale,
                "self_attn.attn_temperature",
                vec![opnd("q", &[t, nq * d]), opnd("scale", &[t, 1])],
                vec![opnd("q", &[t, nq * d])],
                vec![("width", nq * d)],
                Some(format!(
                    "q · (ln(⌊(pos + 1) / {}⌋ + 1) · {} + 1)",
                    temp.floor_scale, temp.attn_scale
                )),
            );
        }
        self.cache_append(
            "self_attn.kv_cache",
            vec![opnd("k", &[t, nkv * d]), opnd("v", &[t, nkv * d])],
            2 * nkv * d,
        );
        let phase = self.phase;
        self.op(
            OpKind::GqaAttention(phase),
            "self_attn.attention",
            vec![
                opnd("q", &[t, nq * d]),
                opnd("k_cache", &[ctx, nkv * d]),
                opnd("v_cache", &[ctx, nkv * d]),
            ],
            vec![opnd("o", &[t, nq * d])],
            vec![("D", d), ("DV", d), ("heads", nq), ("kv_heads", nkv)],
            {
                let mut notes = Vec::new();
                match kind {
                    AttentionKind::SlidingGqa => notes.push(format!(
                        "sliding window: each query sees its last {} keys",
                        g.sliding_window.unwrap_or(0)
                    )),
                    AttentionKind::ChunkedGqa => notes.push(format!(
                        "chunked: each query sees the keys of its own chunk of {} positions",
                        g.attention_chunk.unwrap_or(0)
                    )),
                    AttentionKind::NopeGqa => {
                        notes.push("no positional encoding, whole context".into())
                    }
                    _ => {}
                }
                if g.sinks {
                    notes.push("attention sinks: one logit per head in every softmax".into());
                }
                (!notes.is_empty()).then(|| notes.join("; "))
            },
        );
        if g.output_gate {
            self.op(
                OpKind::AttnOutputGate,
                "self_attn.output_gate",
                vec![opnd("o", &[t, nq * d]), opnd("gate", &[t, nq * d])],
                vec![opnd("o", &[t, nq * d])],
                vec![("width", nq * d)],
                None,
            );
        }
        self.linear("self_attn.o_proj", nq * d, h);
        if g.o_bias {
            self.bias_add("self_attn.o_proj.bias", h);
        }
    }

    /// A bias row added to each of the step's `width`-wide rows.
    fn bias_add(&mut self, name: &str, width: usize) {
        let t = self.t;
        self.op(
            OpKind::BiasAdd,
            name,
            vec![opnd("x", &[t, width]), opnd("b", &[1, width])],
            vec![opnd("x", &[t, width])],
            vec![("width", width)],
            None,
        );
    }

    /// Gated DeltaNet (scalar decay) or KDA (per-channel decay).
    fn linear_attention(&mut self) {
        let Some(l) = self.cfg.linear_attention.clone() else {
            return self.unknown("linear attention without dimensions".into(), "linear_attn");
        };
        let LinearAttnDims {
            key_heads: hk,
            value_heads: hv,
            key_head_dim: dk,
            value_head_dim: dv,
            conv_kernel,
            decay,
        } = l;
        let (t, h) = (self.t, self.cfg.hidden_size);
        let (qk_w, v_w) = (hk * dk, hv * dv);
        match decay {
            Decay::Scalar => {
                self.linear("linear_attn.in_proj_qkvz", h, 2 * qk_w + 2 * v_w);
                self.linear("linear_attn.in_proj_ba", h, 2 * hv);
            }
            Decay::PerChannel => {
                self.linear("self_attn.q_proj", h, qk_w);
                self.linear("self_attn.k_proj", h, qk_w);
                self.linear("self_attn.v_proj", h, v_w);
                self.linear("self_attn.f_a_proj", h, dk);
                self.linear("self_attn.f_b_proj", dk, hv * dk);
                self.linear("self_attn.b_proj", h, hv);
            }
        }
        let channels = 2 * qk_w + v_w;
        self.op(
            OpKind::ShortConv,
            "linear_attn.conv1d",
            vec![
                opnd("qkv", &[t, channels]),
                opnd("w", &[channels, conv_kernel]),
                opnd("conv_state", &[conv_kernel.saturating_sub(1), channels]),
            ],
            vec![opnd("qkv", &[t, channels])],
            vec![("channels", channels), ("kernel", conv_kernel)],
            None,
        );
        let g_width = match decay {
            Decay::Scalar => hv,
            Decay::PerChannel => hv * dk,
        };
        self.op(
            OpKind::DeltaGates(decay),
            "linear_attn.gates",
            vec![opnd("a", &[t, g_width]), opnd("b", &[t, hv])],
            vec![opnd("g", &[t, g_width]), opnd("beta", &[t, hv])],
            vec![("heads", hv), ("DK", dk)],
            None,
        );
        let phase = self.phase;
        self.op(
            OpKind::DeltaRule(decay, phase),
            "linear_attn.delta_rule",
            vec![
                opnd("q", &[t, qk_w]),
                opnd("k", &[t, qk_w]),
                opnd("v", &[t, v_w]),
                opnd("g", &[t, g_width]),
                opnd("beta", &[t, hv]),
                opnd("state", &[hv * dk, dv]),
            ],
            vec![opnd("o", &[t, v_w]), opnd("state", &[hv * dk, dv])],
            vec![("DK", dk), ("DV", dv), ("k_heads", hk), ("v_heads", hv)],
            None,
        );
        if decay == Decay::PerChannel {
            self.linear("self_attn.g_a_proj", h, dv);
            self.linear("self_attn.g_b_proj", dv, v_w);
        }
        self.op(
            OpKind::GatedRmsNorm(decay),
            "linear_attn.norm",
            vec![
                opnd("o", &[t * hv, dv]),
                opnd("z", &[t * hv, dv]),
                opnd("w", &[dv]),
            ],
            vec![opnd("o", &[t * hv, dv])],
            vec![("width", dv)],
            Some(match decay {
                Decay::Scalar => "RMSNorm(o)·w·SiLU(z)".into(),
                Decay::PerChannel => "RMSNorm(o)·w·σ(g)".into(),
            }),
        );
        self.linear("linear_attn.out_proj", v_w, h);
    }

    fn dense_mlp(&mut self) {
        let Some(d) = self.cfg.dense_mlp.clone() else {
            return self.unknown("dense mlp without intermediate_size".into(), "mlp");
        };
        let (t, h, i) = (self.t, self.cfg.hidden_size, d.intermediate_size);
        self.op(
            OpKind::DenseMlp,
            "mlp",
            vec![
                opnd("x", &[t, h]),
                opnd("w_gate", &[i, h]),
                opnd("w_up", &[i, h]),
                opnd("w_down", &[h, i]),
            ],
            vec![opnd("y", &[t, h])],
            vec![("hidden", h), ("inter", i)],
            None,
        );
    }

    fn moe(&mut self) {
        let Some(m) = self.cfg.moe.clone() else {
            return self.unknown("moe without expert dimensions".into(), "mlp");
        };
        let (t, h) = (self.t, self.cfg.hidden_size);
        let (e, k, i) = (m.experts, m.experts_per_token, m.intermediate_size);
        self.linear("mlp.gate", h, e);
        if m.biases {
            self.bias_add("mlp.gate.bias", e);
        }
        let router_detail = format!(
            "top-{k} of {e}, {} group(s) keep {}, norm_topk_prob {}, scale {}",
            m.n_group, m.topk_group, m.norm_topk_prob, m.routed_scaling_factor
        );
        let router = match &m.router {
            RouterKind::Unknown(s) => OpKind::Unknown(format!("moe router `{s}`")),
            r => OpKind::MoeRouter(r.clone()),
        };
        self.op(
            router,
            "mlp.router",
            vec![opnd("logits", &[t, e])],
            vec![opnd("experts", &[t, k]), opnd("weights", &[t, k])],
            vec![
                ("experts", e),
                ("top_k", k),
                ("n_group", m.n_group),
                ("topk_group", m.topk_group),
            ],
            Some(router_detail),
        );
        let cap = (t * k).div_ceil(e).max(1);
        self.op(
            OpKind::MoeDispatch,
            "mlp.dispatch",
            vec![opnd("x", &[t, h]), opnd("experts", &[t, k])],
            vec![opnd("x_sorted", &[e, cap, h])],
            vec![("hidden", h)],
            Some(format!("{} token-expert pairs, ~{cap} per expert", t * k)),
        );
        if m.router == RouterKind::SigmoidTopkScaledInput {
            self.op(
                OpKind::RowScale,
                "mlp.experts.input_scale",
                vec![
                    opnd("x_sorted", &[e, cap, h]),
                    opnd("weights", &[e, cap, 1]),
                ],
                vec![opnd("x_sorted", &[e, cap, h])],
                vec![("width", h)],
                Some("each routed row times its router score (Llama 4)".into()),
            );
        }
        let weights = match &m.expert_format {
            WeightFormat::Float => ExpertWeights::Float,
            WeightFormat::Fp8Block { .. } => ExpertWeights::Fp8,
            WeightFormat::Mxfp4 => ExpertWeights::Mxfp4,
            WeightFormat::Int4Group { group } => ExpertWeights::Int4(*group),
            WeightFormat::Other(s) => ExpertWeights::Other(s.clone()),
        };
        self.op(
            OpKind::ExpertFfn(weights),
            "mlp.experts",
            vec![
                opnd("x_sorted", &[e, cap, h]),
                opnd("w_gate", &[e, i, h]),
                opnd("w_up", &[e, i, h]),
                opnd("w_down", &[e, h, i]),
            ],
            vec![opnd("y_sorted", &[e, cap, h])],
            vec![("hidden", h), ("inter", i), ("experts", e)],
            Some(format!("weights: {}", m.expert_format)),
        );
        if m.biases {
            // One bias row per expert on each of the two projections' grouped rows.
            for (name, width) in [
                ("mlp.experts.gate_up_proj_bias", 2 * i),
                ("mlp.experts.down_proj_bias", h),
            ] {
                self.op(
                    OpKind::ExpertBias,
                    name,
                    vec![opnd("y_sorted", &[e, cap, width]), opnd("b", &[e, width])],
                    vec![opnd("y_sorted", &[e, cap, width])],
                    vec![("width", width), ("experts", e)],
                    None,
                );
            }
        }
        if let ExpertActivation::ClampedSwiglu { alpha, limit } = m.activation {
            self.op(
                OpKind::ClampedSwiglu,
                "mlp.experts.activation",
                vec![opnd("gate", &[e, cap, i]), opnd("up", &[e, cap, i])],
                vec![opnd("h", &[e, cap, i])],
                vec![("inter", i)],
                Some(format!(
                    "in place of SiLU(gate)·up: limit {limit}, alpha {alpha}"
                )),
            );
        }
        self.op(
            OpKind::MoeCombine,
            "mlp.combine",
            vec![opnd("y_sorted", &[e, cap, h]), opnd("weights", &[t, k])],
            vec![opnd("y", &[t, h])],
            vec![("hidden", h)],
            None,
        );
        if m.shared_experts > 0 {
            let si = m.shared_intermediate_size;
            self.op(
                OpKind::SharedExpert,
                "mlp.shared_experts",
                vec![
                    opnd("x", &[t, h]),
                    opnd("w_gate", &[si, h]),
                    opnd("w_up", &[si, h]),
                    opnd("w_down", &[h, si]),
                ],
                vec![opnd("y", &[t, h])],
                vec![("hidden", h), ("inter", si)],
                None,
            );
            if m.shared_expert_gate {
                self.op(
                    OpKind::SharedExpertGate,
                    "mlp.shared_expert_gate",
                    vec![opnd("x", &[t, h]), opnd("w", &[1, h]), opnd("y", &[t, h])],
                    vec![opnd("y", &[t, h])],
                    vec![("hidden", h)],
                    Some("y · σ(x · w)".into()),
                );
            }
        }
    }
}
