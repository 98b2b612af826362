//! The memory plan of one card: weights per dtype, KV cache per token by layer kind, constant
//! per-sequence state, activations and workspace, and a runtime reserve; from them, how many KV
//! tokens fit and the largest batch at a given context. A plan that does not fit is an error
//! naming the term that overflows, by how much, and what would fit.

use super::parallel::{Plan, PlanError};
use super::params::{count, LayerParams};
use crate::config::{AttentionKind, ModelConfig, WeightFormat};

/// Storage choices that are not in the configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryOptions {
    /// Bytes per cached KV value: 2 (bf16) or 1 (FP8 E4M3; its per-token scale is counted).
    pub kv_bytes: f64,
    /// Share of the card's memory kept free for the runtime (allocator slack, CUDA/CANN context,
    /// communication buffers): 0.15 by default.
    pub reserve: f64,
}

impl Default for MemoryOptions {
    fn default() -> MemoryOptions {
        MemoryOptions {
            kv_bytes: 2.0,
            reserve: 0.15,
        }
    }
}

/// Bytes per stored value of a weight format: FP8 counts its f32 scale per block, MXFP4 its
/// E8M0 scale per 32 values (4.25 bits), INT4 its bf16 scale per group (4.5 bits at groups of
/// 32), plain floats are bf16.
pub fn bytes_per_param(f: &WeightFormat) -> f64 {
    match f {
        WeightFormat::Float | WeightFormat::Other(_) => 2.0,
        WeightFormat::Fp8Block { block } => 1.0 + 4.0 / (block[0] * block[1]) as f64,
        WeightFormat::Mxfp4 => 4.25 / 8.0,
        WeightFormat::Int4Group { group } => 0.5 + 2.0 / (*group).max(1) as f64,
    }
}

/// Weight bytes one card holds, by part.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WeightBytes {
    /// Attention, dense MLP and shared experts (their `tp` shard; a DSA indexer whole), in the
    /// checkpoint's format.
    pub dense: f64,
    /// The card's routed experts (`experts / ep` per MoE layer), in the expert format.
    pub experts: f64,
    /// Embedding and `lm_head` shards (vocabulary split over `tp`), norms and routers, in bf16.
    pub other: f64,
}

impl WeightBytes {
    /// All weight bytes.
    pub fn total(&self) -> f64 {
        self.dense + self.experts + self.other
    }
}

/// One card's memory plan (the most loaded pipeline stage).
#[derive(Debug, Clone, PartialEq)]
pub struct MemoryPlan {
    /// The card's memory (bytes).
    pub capacity: f64,
    /// Weights.
    pub weights: WeightBytes,
    /// KV cache bytes per token of context (MLA latent rows, DSA indexer keys, GQA keys/values).
    pub kv_per_token: f64,
    /// Constant per-sequence state (linear-attention matrices and convolution windows).
    pub state_per_sequence: f64,
    /// Activations of one step at the planned token count.
    pub activations: f64,
    /// Workspace one layer needs beyond its activations, reused by every layer (expanded MLA
    /// keys/values in prefill, expert dispatch buffers).
    pub workspace: f64,
    /// The runtime reserve.
    pub reserve: f64,
}

impl MemoryPlan {
    /// Bytes left for the KV cache and per-sequence state.
    pub fn free_for_cache(&self) -> f64 {
        self.capacity - self.weights.total() - self.activations - self.workspace - self.reserve
    }

    /// KV tokens one card can hold (0 when nothing is left), or `None` when no layer's cache
    /// grows with the context (every layer windowed or recurrent: only the sequences count, see
    /// [`MemoryPlan::max_batch`]).
    pub fn kv_tokens_capacity(&self) -> Option<u64> {
        let free = self.free_for_cache().max(0.0);
        (self.kv_per_token > 0.0).then(|| (free / self.kv_per_token) as u64)
    }

    /// The most sequences of `context` tokens one card's cache holds.
    pub fn max_batch(&self, context: usize) -> u64 {
        let per_seq = context as f64 * self.kv_per_token + self.state_per_sequence;
        if per_seq <= 0.0 {
            return u64::MAX;
        }
        (self.free_for_cache().max(0.0) / per_seq) as u64
    }

    /// `Ok` when weights, activations, workspace and reserve fit with room for at least
    /// `sequences` sequences of `context` tokens; otherwise the error names the term that
    /// overflows and the cards that would fit.
    pub fn check(
        &self,
        sequences: u64,
        context: usize,
        plan: &Plan,
        total_weights: f64,
    ) -> Result<(), PlanError> {
        let gb = |b: f64| b / 1e9;
        let usable = self.capacity - self.reserve - self.activations - self.workspace;
        if self.weights.total() > usable {
            let need = (total_weights / usable.max(1.0)).ceil() as usize;
            return Err(PlanError {
                flag: "memory plan".into(),
                message: format!(
                    "weights need {:.1} GB per card under {plan} but only {:.1} GB of the card's {:.1} GB are left after the {:.1} GB reserve, {:.1} GB of activations and {:.1} GB of workspace (over by {:.1} GB); the model needs at least {need} cards' worth of memory: add cards (--cards) or raise ep/tp",
                    gb(self.weights.total()),
                    gb(usable),
                    gb(self.capacity),
                    gb(self.reserve),
                    gb(self.activations),
                    gb(self.workspace),
                    gb(self.weights.total() - usable)
                ),
            });
        }
        let cache =
            sequences as f64 * (context as f64 * self.kv_per_token + self.state_per_sequence);
        if cache > self.free_for_cache() {
            return Err(PlanError {
                flag: "memory plan".into(),
                message: format!(
                    "{sequences} sequence(s) of {context} tokens need {:.1} GB of KV cache and state per card, but {:.1} GB are free after weights (over by {:.1} GB); at most {} fit: lower --batch or --context, or add cards",
                    gb(cache),
                    gb(self.free_for_cache()),
                    gb(cache - self.free_for_cache()),
                    self.max_batch(context)
                ),
            });
        }
        Ok(())
    }
}

/// The memory plan of the most loaded card of `plan` on a card of `capacity` bytes, for a step of
/// `tokens` tokens per card whose attention reads `context` tokens.
pub fn plan_memory(
    cfg: &ModelConfig,
    plan: &Plan,
    capacity: f64,
    tokens: usize,
    context: usize,
    opts: &MemoryOptions,
) -> MemoryPlan {
    let p = count(cfg);
    let tp = plan.tp as f64;
    let dense_b = bytes_per_param(&cfg.weight_format);
    let expert_b = cfg
        .moe
        .as_ref()
        .map(|m| bytes_per_param(&m.expert_format))
        .unwrap_or(dense_b);
    let mut worst: Option<MemoryPlan> = None;
    // A plan always has a stage (a degree of 0 is refused by `Plan::validate`).
    for s in 0..plan.pp.max(1) {
        let layers = plan.stage_layers(cfg.num_layers(), s);
        let mut w = WeightBytes::default();
        let (mut kv, mut state) = (0.0, 0.0);
        for l in layers.clone() {
            let lp: &LayerParams = &p.layers[l];
            w.dense += (lp.attention + lp.dense_mlp + lp.shared_experts) as f64 / tp * dense_b
                + lp.indexer as f64 * dense_b;
            // Round-robin placement: the most loaded card holds ⌈E / ep⌉ experts.
            w.experts += (lp.per_expert * lp.experts.div_ceil(plan.ep as u64)) as f64 * expert_b;
            w.other += (lp.norms + lp.router) as f64 * 2.0;
            let (k, st) = cache_per_layer(cfg, &cfg.layers[l].attention, plan.tp, opts.kv_bytes);
            kv += k;
            state += st;
        }
        if s == 0 {
            w.other += p.embedding as f64 / tp * 2.0;
        }
        if s + 1 == plan.pp {
            w.other += (p.lm_head + p.final_norm) as f64 / tp * 2.0;
        }
        let (activations, workspace) = step_buffers(cfg, plan, tokens, context);
        let m = MemoryPlan {
            capacity,
            weights: w,
            kv_per_token: kv,
            state_per_sequence: state,
            activations,
            workspace,
            reserve: capacity * opts.reserve,
        };
        // The most loaded stage: weights plus one sequence's cache at this context.
        let load = |m: &MemoryPlan| {
            m.weights.total() + m.kv_per_token * context as f64 + m.state_per_sequence
        };
        if worst.as_ref().is_none_or(|b| load(&m) > load(b)) {
            worst = Some(m);
        }
    }
    worst.expect("a plan has at least one stage")
}

/// Per token and per sequence cache bytes of one layer on one card.
fn cache_per_layer(
    cfg: &ModelConfig,
    kind: &AttentionKind,
    tp: usize,
    kv_bytes: f64,
) -> (f64, f64) {
    // FP8 caches keep one f32 scale per token and cached row (a latent, an indexer key, a
    // key/value head of a GQA pool).
    let scale = if kv_bytes < 2.0 { 4.0 } else { 0.0 };
    match kind {
        AttentionKind::Mla | AttentionKind::SparseMla => {
            let Some(m) = &cfg.mla else { return (0.0, 0.0) };
            // One latent row per token, replicated on every tp rank (it has no head to split).
            let mut k = m.latent_dim() as f64 * kv_bytes + scale;
            if let (AttentionKind::SparseMla, Some(ix)) = (kind, &cfg.indexer) {
                k += ix.head_dim as f64 * kv_bytes + scale;
            }
            (k, 0.0)
        }
        AttentionKind::Gqa
        | AttentionKind::SlidingGqa
        | AttentionKind::ChunkedGqa
        | AttentionKind::NopeGqa => {
            let Some(g) = &cfg.gqa else { return (0.0, 0.0) };
            let kv_heads = (g.kv_heads / tp).max(1);
            let per_token = 2.0 * kv_heads as f64 * (g.head_dim as f64 * kv_bytes + scale);
            match (kind, g.sliding_window, g.attention_chunk) {
                // A windowed layer keeps its last `window` tokens whatever the context, a
                // chunked one at most a chunk (its keys before the chunk are never read again).
                (AttentionKind::SlidingGqa, Some(w), _)
                | (AttentionKind::ChunkedGqa, _, Some(w)) => (0.0, w as f64 * per_token),
                _ => (per_token, 0.0),
            }
        }
        AttentionKind::LinearAttention => {
            let Some(l) = &cfg.linear_attention else {
                return (0.0, 0.0);
            };
            // f32 state matrices per value head, bf16 convolution windows.
            let state = (l.value_heads / tp * l.key_head_dim * l.value_head_dim) as f64 * 4.0;
            let conv_dim =
                (2 * l.key_heads * l.key_head_dim + l.value_heads * l.value_head_dim) / tp;
            let conv = (conv_dim * l.conv_kernel.saturating_sub(1)) as f64 * 2.0;
            (0.0, state + conv)
        }
        AttentionKind::Unknown(_) => (0.0, 0.0),
    }
}

/// Activations and workspace of one step of `tokens` tokens per card (bf16 activations, f32
/// accumulators where the kernels keep them).
fn step_buffers(cfg: &ModelConfig, plan: &Plan, tokens: usize, context: usize) -> (f64, f64) {
    let t = tokens as f64;
    let h = cfg.hidden_size as f64;
    let tp = plan.tp as f64;
    // Residual stream, normed input, attention output and the feed-forward output.
    let mut widest = 0.0f64;
    let mut workspace = 0.0f64;
    if let Some(m) = &cfg.mla {
        let heads = m.heads as f64 / tp;
        widest = widest.max(heads * (m.qk_head_dim() + m.v_head_dim) as f64);
        // Prefill expands the context into per-head keys and values, one layer at a time.
        if tokens > 1 {
            workspace = workspace
                .max(context as f64 * heads * (m.qk_head_dim() + m.v_head_dim) as f64 * 2.0);
        }
    }
    if let Some(g) = &cfg.gqa {
        widest = widest.max((2 * g.heads + 2 * g.kv_heads) as f64 * g.head_dim as f64 / tp);
    }
    if let Some(l) = &cfg.linear_attention {
        widest = widest.max(
            (2 * l.key_heads * l.key_head_dim + 2 * l.value_heads * l.value_head_dim) as f64 / tp,
        );
    }
    if let Some(d) = &cfg.dense_mlp {
        widest = widest.max(2.0 * d.intermediate_size as f64 / tp);
    }
    if let Some(m) = &cfg.moe {
        // The rows routed to this card: experts_per_token per token of the stage, spread over ep.
        let routed = t * (plan.tp * plan.dp) as f64 * m.experts_per_token as f64 / plan.ep as f64;
        let inter = 2.0 * m.intermediate_size as f64;
        workspace = workspace.max(routed * (inter + 2.0 * h) * 2.0);
    }
    ((4.0 * h + widest) * t * 2.0, workspace)
}
