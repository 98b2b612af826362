//! Parameter counts from a configuration: what a model holds (`total`) and what one token reads
//! (`active`), split into the parts a parallel plan shards differently (attention by tensor
//! parallelism, routed experts by expert parallelism, embeddings by vocabulary).
//!
//! The counts follow the tensors the checkpoint stores and [`crate::forward`] binds, one formula
//! per layer kind, so they match the published totals (DeepSeek-V3: 671B, Kimi-K2: 1.03T) without
//! the multi-token-prediction head, which is not part of the main model. Active parameters count
//! every non-routed tensor (embeddings and `lm_head` included, as Kimi-K2's and Qwen's "activated"
//! figures do) plus `experts_per_token` routed experts per MoE layer. Vendors differ here: OpenAI's
//! and DeepSeek-V2's figures leave out the input embedding (a token reads one row of it), so
//! [`ParamCount::active_without_input_embedding`] gives that count too (gpt-oss-20b: 3.61B).

use crate::config::{AttentionKind, Decay, FfnKind, ModelConfig};

/// Parameters of one decoder layer, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LayerParams {
    /// Attention projections, their norms and gates (sharded by tensor parallelism).
    pub attention: u64,
    /// A DSA lightning indexer's projections and key norm (replicated: every tensor-parallel
    /// card holds it whole, as DeepSeek-V3.2's reference inference code does).
    pub indexer: u64,
    /// The layer's two RMSNorm weights (replicated).
    pub norms: u64,
    /// A dense MLP, when the layer has one (sharded by tensor parallelism).
    pub dense_mlp: u64,
    /// Shared experts and their gate (sharded by tensor parallelism).
    pub shared_experts: u64,
    /// The router's weight and bias (replicated).
    pub router: u64,
    /// One routed expert (gate, up and down projections).
    pub per_expert: u64,
    /// Routed experts in the layer.
    pub experts: u64,
    /// Routed experts one token runs through.
    pub experts_per_token: u64,
}

impl LayerParams {
    /// Everything the layer stores.
    pub fn total(&self) -> u64 {
        self.dense_part() + self.per_expert * self.experts
    }

    /// What one token reads.
    pub fn active(&self) -> u64 {
        self.dense_part() + self.per_expert * self.experts_per_token
    }

    /// Everything but the routed experts.
    pub fn dense_part(&self) -> u64 {
        self.attention
            + self.indexer
            + self.norms
            + self.dense_mlp
            + self.shared_experts
            + self.router
    }
}

/// A model's parameters: per layer, plus embeddings, final norm and `lm_head`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamCount {
    /// One entry per decoder layer.
    pub layers: Vec<LayerParams>,
    /// `embed_tokens` (`vocab × hidden`).
    pub embedding: u64,
    /// `lm_head` (0 when tied to the embedding).
    pub lm_head: u64,
    /// The final RMSNorm.
    pub final_norm: u64,
}

impl ParamCount {
    /// Every parameter of the main model.
    pub fn total(&self) -> u64 {
        self.outer() + self.layers.iter().map(LayerParams::total).sum::<u64>()
    }

    /// Parameters one token reads.
    pub fn active(&self) -> u64 {
        self.outer() + self.layers.iter().map(LayerParams::active).sum::<u64>()
    }

    /// [`ParamCount::active`] without the input embedding, which a token only looks one row of
    /// up (the convention of OpenAI's and DeepSeek-V2's published active counts). A tied
    /// embedding is also the `lm_head`, which every token reads whole: it stays.
    pub fn active_without_input_embedding(&self) -> u64 {
        match self.lm_head {
            0 => self.active(),
            _ => self.active() - self.embedding,
        }
    }

    /// Parameters in routed experts (the part MXFP4 or expert parallelism applies to).
    pub fn routed_experts(&self) -> u64 {
        self.layers.iter().map(|l| l.per_expert * l.experts).sum()
    }

    fn outer(&self) -> u64 {
        self.embedding + self.lm_head + self.final_norm
    }
}

/// Counts the parameters `cfg` describes. Layer kinds day0 does not know count as zero (the
/// coverage inventory reports them).
pub fn count(cfg: &ModelConfig) -> ParamCount {
    let h = cfg.hidden_size as u64;
    let layers = cfg
        .layers
        .iter()
        .map(|spec| {
            let mut p = LayerParams {
                norms: 2 * h,
                attention: attention(cfg, &spec.attention),
                indexer: indexer(cfg, &spec.attention),
                ..Default::default()
            };
            match (&spec.ffn, &cfg.dense_mlp, &cfg.moe) {
                (FfnKind::Dense, Some(d), _) => p.dense_mlp = 3 * h * d.intermediate_size as u64,
                (FfnKind::Moe, _, Some(m)) => {
                    let e = m.experts as u64;
                    // gate, up and down; with biases (gpt-oss) 2·I + H more.
                    p.per_expert = 3 * h * m.intermediate_size as u64
                        + if m.biases {
                            2 * m.intermediate_size as u64 + h
                        } else {
                            0
                        };
                    p.experts = e;
                    p.experts_per_token = m.experts_per_token as u64;
                    p.shared_experts = 3 * h * m.shared_intermediate_size as u64
                        + if m.shared_expert_gate { h } else { 0 };
                    // The gate `[E, H]` and DeepSeek's `e_score_correction_bias` `[E]`.
                    let bias = matches!(
                        m.router,
                        crate::config::RouterKind::SigmoidGroupTopk
                            | crate::config::RouterKind::SoftmaxBiasTopk
                    );
                    p.router = e * h + if bias || m.biases { e } else { 0 };
                }
                _ => {}
            }
            p
        })
        .collect();
    let embedding = cfg.vocab_size as u64 * h;
    ParamCount {
        layers,
        embedding,
        lm_head: if cfg.tie_word_embeddings {
            0
        } else {
            embedding
        },
        final_norm: h,
    }
}

/// One layer's DSA indexer parameters (0 for other attention kinds).
fn indexer(cfg: &ModelConfig, kind: &AttentionKind) -> u64 {
    let h = cfg.hidden_size as u64;
    match (kind, &cfg.indexer, &cfg.mla) {
        (AttentionKind::SparseMla, Some(ix), Some(m)) => {
            let (ih, id) = (ix.heads as u64, ix.head_dim as u64);
            let q_in = m.q_lora_rank.map(|r| r as u64).unwrap_or(h);
            // wq_b, wk, k_norm (weight and bias), weights_proj.
            ih * id * q_in + id * h + 2 * id + ih * h
        }
        _ => 0,
    }
}

/// One layer's attention parameters, without a DSA indexer's.
fn attention(cfg: &ModelConfig, kind: &AttentionKind) -> u64 {
    let h = cfg.hidden_size as u64;
    match kind {
        AttentionKind::Mla | AttentionKind::SparseMla => {
            let Some(m) = &cfg.mla else { return 0 };
            let heads = m.heads as u64;
            let qk = m.qk_head_dim() as u64;
            let rkv = m.kv_lora_rank as u64;
            let q = match m.q_lora_rank {
                // q_a_proj, q_a_layernorm, q_b_proj.
                Some(r) => r as u64 * h + r as u64 + heads * qk * r as u64,
                None => heads * qk * h,
            };
            // kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj.
            let kv = (rkv + m.qk_rope_head_dim as u64) * h
                + rkv
                + heads * (m.qk_nope_head_dim + m.v_head_dim) as u64 * rkv;
            let o = h * heads * m.v_head_dim as u64;
            q + kv + o
        }
        AttentionKind::Gqa
        | AttentionKind::SlidingGqa
        | AttentionKind::ChunkedGqa
        | AttentionKind::NopeGqa => {
            let Some(g) = &cfg.gqa else { return 0 };
            let d = g.head_dim as u64;
            let q_rows = g.heads as u64 * d * if g.output_gate { 2 } else { 1 };
            let kv_rows = 2 * g.kv_heads as u64 * d;
            let norms = match (g.qk_norm, g.qk_norm_across_heads) {
                (false, _) => 0,
                (true, false) => 2 * d,
                (true, true) => (g.heads + g.kv_heads) as u64 * d,
            };
            let biases =
                if g.qkv_bias { q_rows + kv_rows } else { 0 } + if g.o_bias { h } else { 0 };
            let sinks = if g.sinks { g.heads as u64 } else { 0 };
            (q_rows + kv_rows) * h + h * g.heads as u64 * d + norms + biases + sinks
        }
        AttentionKind::LinearAttention => {
            let Some(l) = &cfg.linear_attention else {
                return 0;
            };
            let key = (l.key_heads * l.key_head_dim) as u64;
            let value = (l.value_heads * l.value_head_dim) as u64;
            let conv = (2 * key + value) * l.conv_kernel as u64;
            let (dk, dv) = (l.key_head_dim as u64, l.value_head_dim as u64);
            match l.decay {
                // in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias, norm, out_proj.
                Decay::Scalar => {
                    let vh = l.value_heads as u64;
                    (2 * key + 2 * value) * h + 2 * vh * h + conv + 2 * vh + dv + h * value
                }
                // q/k/v projections, their convs, f_a/f_b, dt_bias, A_log, b_proj, g_a/g_b,
                // o_norm, o_proj.
                Decay::PerChannel => {
                    let heads = l.key_heads as u64;
                    (2 * key + value) * h
                        + conv
                        + dk * h
                        + key * dk
                        + key
                        + heads
                        + heads * h
                        + dv * h
                        + value * dv
                        + dv
                        + h * value
                }
            }
        }
        AttentionKind::Unknown(_) => 0,
    }
}
