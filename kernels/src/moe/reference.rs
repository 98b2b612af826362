//! Float64 references of MoE routing: the two routers (DeepSeek-V3's sigmoid group-limited top-k,
//! Qwen3-Next's softmax top-k), dispatch/combine, the grouped expert GEMM, and a whole DeepSeek-V3
//! MoE block (router, routed SwiGLU experts, shared expert), as transformers 5.x computes them
//! (`DeepseekV3TopkRouter`, `DeepseekV3MoE`, `Qwen3NextTopKRouter`).
//!
//! Selection ties are broken by **lower expert index** (lower group index for groups), as
//! [`crate::attention::reference::topk`] does; `torch.topk` promises no order among ties.

use crate::attention::reference::topk;

/// A malformed reference call: which argument and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeRefError(pub String);

impl std::fmt::Display for MoeRefError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MoE reference: {}", self.0)
    }
}

impl std::error::Error for MoeRefError {}

fn fail<T>(message: String) -> Result<T, MoeRefError> {
    Err(MoeRefError(message))
}

fn expect_len(name: &str, got: usize, want: usize, layout: &str) -> Result<(), MoeRefError> {
    if got == want {
        Ok(())
    } else {
        fail(format!(
            "`{name}` has {got} values, expected {want} ({layout})"
        ))
    }
}

/// A router's decision for every token.
#[derive(Debug, Clone, PartialEq)]
pub struct RouterRef {
    /// Chosen experts `[T, K]`, best first (by the score used for selection).
    pub idx: Vec<usize>,
    /// Routing weights `[T, K]`, aligned with `idx`.
    pub weights: Vec<f64>,
    /// Smallest relative gap between adjacent scores at any ranking that decides the selection or its order
    /// (group scores up to the `topk_group + 1`-th, expert scores up to the `K + 1`-th). An f32
    /// kernel is guaranteed the same selection only when this is well above f32 rounding.
    pub margin: f64,
}

impl RouterRef {
    /// No decision yet, room for `choices` (`T·K`); the margin starts unbounded.
    fn empty(choices: usize) -> RouterRef {
        RouterRef {
            idx: Vec::with_capacity(choices),
            weights: Vec::with_capacity(choices),
            margin: f64::INFINITY,
        }
    }
}

/// Smallest relative gap `|a − b| / max(|a|, |b|)` between adjacent entries of a best-first
/// ranking, over its first `upto` entries (relative, as f32 rounding is; −∞ entries, which only
/// stand for dropped experts, give an infinite gap).
fn ranking_margin(sorted: &[f64], upto: usize) -> f64 {
    sorted
        .windows(2)
        .take(upto.saturating_sub(1))
        .map(|w| {
            let gap = (w[0] - w[1]).abs() / w[0].abs().max(w[1].abs()).max(f64::MIN_POSITIVE);
            if gap.is_nan() {
                f64::INFINITY
            } else {
                gap
            }
        })
        .fold(f64::INFINITY, f64::min)
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Parameters of DeepSeek-V3's router (`DeepseekV3TopkRouter`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SigmoidRouterParams {
    /// Routed experts `E`.
    pub experts: usize,
    /// `num_experts_per_tok` (`K`).
    pub top_k: usize,
    /// `n_group`: experts split into this many contiguous groups.
    pub n_group: usize,
    /// `topk_group`: groups kept per token.
    pub topk_group: usize,
    /// `norm_topk_prob`: divide the chosen weights by their sum (+ 1e-20).
    pub norm_topk_prob: bool,
    /// `routed_scaling_factor`, applied after the normalisation.
    pub routed_scaling_factor: f32,
}

impl SigmoidRouterParams {
    /// Checks the parameters against each other, naming the one to fix.
    pub fn validate(&self) -> Result<(), MoeRefError> {
        let p = self;
        if p.experts == 0 || p.top_k == 0 {
            return fail(format!(
                "experts ({}) and top_k ({}) must be ≥ 1",
                p.experts, p.top_k
            ));
        }
        if p.n_group == 0 || !p.experts.is_multiple_of(p.n_group) {
            return fail(format!(
                "n_group = {} must divide the {} experts",
                p.n_group, p.experts
            ));
        }
        if p.experts / p.n_group < 2 {
            return fail(format!(
                "n_group = {} leaves {} expert per group; the group score sums each group's top 2",
                p.n_group,
                p.experts / p.n_group
            ));
        }
        if p.topk_group == 0 || p.topk_group > p.n_group {
            return fail(format!(
                "topk_group = {} must be in 1..={} (n_group)",
                p.topk_group, p.n_group
            ));
        }
        let kept = p.topk_group * (p.experts / p.n_group);
        if p.top_k > kept {
            return fail(format!(
                "top_k = {} exceeds the {kept} experts in the {} kept groups",
                p.top_k, p.topk_group
            ));
        }
        Ok(())
    }
}

/// DeepSeek-V3 routing of `logits [T, E]` with `bias [E]` (`e_score_correction_bias`):
/// `s = σ(logits)`; selection scores `s + bias`; each group's score is the sum of its top-2
/// selection scores; the `topk_group` best groups are kept; the top-`K` selection scores among
/// the kept experts are chosen; weights are the chosen experts' **unbiased** `s`, divided by
/// `Σ + 1e-20` when `norm_topk_prob`, then times `routed_scaling_factor`.
pub fn router_sigmoid_group_topk(
    logits: &[f32],
    bias: &[f32],
    tokens: usize,
    p: SigmoidRouterParams,
) -> Result<RouterRef, MoeRefError> {
    p.validate()?;
    let (e, k) = (p.experts, p.top_k);
    expect_len("logits", logits.len(), tokens * e, "[T, E]")?;
    expect_len("bias", bias.len(), e, "[E]")?;
    let gs = e / p.n_group;
    let mut out = RouterRef::empty(tokens * k);
    for row in logits.chunks_exact(e) {
        let s: Vec<f64> = row.iter().map(|v| sigmoid(*v as f64)).collect();
        let choice: Vec<f64> = s.iter().zip(bias).map(|(a, b)| a + *b as f64).collect();
        let group_scores: Vec<f64> = choice
            .chunks_exact(gs)
            .map(|g| topk(g, 2).iter().map(|i| g[*i]).sum())
            .collect();
        let groups = topk(&group_scores, p.n_group);
        let sorted_groups: Vec<f64> = groups.iter().map(|g| group_scores[*g]).collect();
        out.margin = out
            .margin
            .min(ranking_margin(&sorted_groups, p.topk_group + 1));
        // Experts of dropped groups are −∞ (HF: `masked_fill(~mask, -inf)`).
        let mut masked = vec![f64::NEG_INFINITY; e];
        for g in &groups[..p.topk_group] {
            masked[g * gs..(g + 1) * gs].copy_from_slice(&choice[g * gs..(g + 1) * gs]);
        }
        let kept = p.topk_group * gs;
        let ranked = topk(&masked, kept);
        let sorted: Vec<f64> = ranked.iter().map(|i| masked[*i]).collect();
        out.margin = out.margin.min(ranking_margin(&sorted, k + 1));
        let chosen = &ranked[..k];
        let w: Vec<f64> = chosen.iter().map(|i| s[*i]).collect();
        let den = if p.norm_topk_prob {
            w.iter().sum::<f64>() + 1e-20
        } else {
            1.0
        };
        out.idx.extend_from_slice(chosen);
        out.weights
            .extend(w.iter().map(|v| v / den * p.routed_scaling_factor as f64));
    }
    Ok(out)
}

/// Softmax top-k routing, ungrouped and unscaled (Qwen, Mixtral): see
/// [`router_softmax_group_topk`].
pub fn router_softmax_topk(
    logits: &[f32],
    tokens: usize,
    experts: usize,
    top_k: usize,
    norm_topk_prob: bool,
) -> Result<RouterRef, MoeRefError> {
    router_softmax_group_topk(logits, tokens, experts, top_k, (1, 1), norm_topk_prob, 1.0)
}

/// Softmax top-k routing as transformers computes it: `softmax(logits)` per token; with
/// `groups = (n_group, topk_group)`, `n_group > 1` (DeepSeek-V2's `group_limited_greedy`), each
/// group scores its largest probability, the experts outside the `topk_group` best groups score 0
/// (`masked_fill(~mask, 0.0)`), and the top-`K` are taken from what is left; the chosen
/// probabilities are divided by their sum when `norm_topk_prob`, then multiplied by `scale`
/// (`routed_scaling_factor`). The margin covers both the group and the expert ranking.
pub fn router_softmax_group_topk(
    logits: &[f32],
    tokens: usize,
    experts: usize,
    top_k: usize,
    groups: (usize, usize),
    norm_topk_prob: bool,
    scale: f64,
) -> Result<RouterRef, MoeRefError> {
    let (n_group, topk_group) = groups;
    if experts == 0 || top_k == 0 || top_k > experts {
        return fail(format!(
            "top_k = {top_k} must be in 1..={experts} (experts)"
        ));
    }
    if n_group == 0 || !experts.is_multiple_of(n_group) || topk_group == 0 || topk_group > n_group {
        return fail(format!(
            "n_group = {n_group} must divide the {experts} experts and topk_group = {topk_group} be in 1..=n_group"
        ));
    }
    let gs = experts / n_group;
    if top_k > topk_group * gs {
        return fail(format!(
            "top_k = {top_k} exceeds the {} experts of the kept groups",
            topk_group * gs
        ));
    }
    expect_len("logits", logits.len(), tokens * experts, "[T, E]")?;
    let probs = crate::reference::softmax_rows(logits, tokens, experts);
    let mut out = RouterRef::empty(tokens * top_k);
    for row in probs.chunks_exact(experts) {
        let mut eligible = row.to_vec();
        if n_group > 1 {
            let group_scores: Vec<f64> = row
                .chunks_exact(gs)
                .map(|g| g.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
                .collect();
            let ranked_groups = topk(&group_scores, n_group);
            let sorted: Vec<f64> = ranked_groups.iter().map(|g| group_scores[*g]).collect();
            out.margin = out.margin.min(ranking_margin(&sorted, topk_group + 1));
            for g in &ranked_groups[topk_group..] {
                eligible[g * gs..(g + 1) * gs].fill(0.0);
            }
        }
        let ranked = topk(&eligible, experts);
        let sorted: Vec<f64> = ranked.iter().map(|i| eligible[*i]).collect();
        out.margin = out.margin.min(ranking_margin(&sorted, top_k + 1));
        let w = &sorted[..top_k];
        let den = if norm_topk_prob {
            w.iter().sum::<f64>()
        } else {
            1.0
        };
        out.idx.extend_from_slice(&ranked[..top_k]);
        out.weights.extend(w.iter().map(|v| v / den * scale));
    }
    Ok(out)
}

/// ERNIE-4.5's routing as transformers computes it (`Ernie4_5_MoeSparseMoeBlock`):
/// `p = softmax(logits)` per token, the top-`K` experts picked on `p + bias`
/// (`moe_statics.e_score_correction_bias`), their unbiased `p` divided by
/// `max(Σ p, `[`SOFTMAX_BIAS_NORM_MIN`]`)`. The margin covers the biased ranking.
pub fn router_softmax_bias_topk(
    logits: &[f32],
    bias: &[f32],
    tokens: usize,
    experts: usize,
    top_k: usize,
) -> Result<RouterRef, MoeRefError> {
    if experts == 0 || top_k == 0 || top_k > experts {
        return fail(format!(
            "top_k = {top_k} must be in 1..={experts} (experts)"
        ));
    }
    expect_len("logits", logits.len(), tokens * experts, "[T, E]")?;
    expect_len("bias", bias.len(), experts, "[E]")?;
    let probs = crate::reference::softmax_rows(logits, tokens, experts);
    let mut out = RouterRef::empty(tokens * top_k);
    for row in probs.chunks_exact(experts) {
        let choice: Vec<f64> = row.iter().zip(bias).map(|(p, b)| p + *b as f64).collect();
        let ranked = topk(&choice, experts);
        let sorted: Vec<f64> = ranked.iter().map(|i| choice[*i]).collect();
        out.margin = out.margin.min(ranking_margin(&sorted, top_k + 1));
        let w: Vec<f64> = ranked[..top_k].iter().map(|i| row[*i]).collect();
        let den = w.iter().sum::<f64>().max(SOFTMAX_BIAS_NORM_MIN);
        out.idx.extend_from_slice(&ranked[..top_k]);
        out.weights.extend(w.iter().map(|v| v / den));
    }
    Ok(out)
}

/// The floor of [`router_softmax_bias_topk`]'s normalising sum (ERNIE-4.5's `moe_norm_min`).
pub const SOFTMAX_BIAS_NORM_MIN: f64 = 1e-12;

/// `out[t] = base[t] + Σ_j weights[t, j] · y[t, j]` where `y [T·K, H]` holds the expert output of
/// token `t`'s `j`-th choice at row `t·K + j` (token-major, before any permutation).
pub fn combine(
    y: &[f64],
    weights: &[f32],
    base: &[f32],
    tokens: usize,
    top_k: usize,
    hidden: usize,
) -> Result<Vec<f64>, MoeRefError> {
    expect_len("y", y.len(), tokens * top_k * hidden, "[T·K, H]")?;
    expect_len("weights", weights.len(), tokens * top_k, "[T, K]")?;
    expect_len("base", base.len(), tokens * hidden, "[T, H]")?;
    let mut out: Vec<f64> = base.iter().map(|v| *v as f64).collect();
    for t in 0..tokens {
        for j in 0..top_k {
            let w = weights[t * top_k + j] as f64;
            let src = &y[(t * top_k + j) * hidden..][..hidden];
            for (o, v) in out[t * hidden..][..hidden].iter_mut().zip(src) {
                *o += w * v;
            }
        }
    }
    Ok(out)
}

/// (experts, rows) of expert-grouped row ranges `offsets [E + 1]`, which must start at 0 and
/// never decrease.
fn expert_rows(offsets: &[usize]) -> Result<(usize, usize), MoeRefError> {
    if offsets.first() != Some(&0) || offsets.windows(2).any(|p| p[0] > p[1]) {
        return fail(format!(
            "offsets {offsets:?} must start at 0 and never decrease"
        ));
    }
    Ok((offsets.len() - 1, offsets[offsets.len() - 1]))
}

/// `y[r] = x[r] · w[e]ᵀ` for the rows `offsets[e]..offsets[e+1]` of `x [N, K]`, with
/// `w [E, Nout, K]` (per-expert `[out, in]`, as checkpoints store `nn.Linear` weights).
pub fn grouped_linear(
    x: &[f32],
    w: &[f32],
    offsets: &[usize],
    n_out: usize,
    k: usize,
) -> Result<Vec<f64>, MoeRefError> {
    let (experts, rows) = expert_rows(offsets)?;
    expect_len("x", x.len(), rows * k, "[N, K], N = offsets[E]")?;
    expect_len("w", w.len(), experts * n_out * k, "[E, Nout, K]")?;
    let mut y = vec![0.0f64; rows * n_out];
    for e in 0..experts {
        let (r0, r1) = (offsets[e], offsets[e + 1]);
        let wt = crate::reference::transpose(&w[e * n_out * k..][..n_out * k], n_out, k);
        let part = crate::reference::gemm(&x[r0 * k..r1 * k], &wt, r1 - r0, n_out, k);
        y[r0 * n_out..r1 * n_out].copy_from_slice(&part);
    }
    Ok(y)
}

/// `y[r] + bias[e]` for the rows `offsets[e]..offsets[e+1]` of `y [N, Nout]`, `bias [E, Nout]`
/// (gpt-oss's per-expert projection biases).
pub fn grouped_bias(
    y: &[f32],
    bias: &[f32],
    offsets: &[usize],
    n_out: usize,
) -> Result<Vec<f64>, MoeRefError> {
    let (experts, rows) = expert_rows(offsets)?;
    expect_len("y", y.len(), rows * n_out, "[N, Nout], N = offsets[E]")?;
    expect_len("bias", bias.len(), experts * n_out, "[E, Nout]")?;
    let mut out: Vec<f64> = y.iter().map(|v| *v as f64).collect();
    for e in 0..experts {
        for r in offsets[e]..offsets[e + 1] {
            for (o, b) in out[r * n_out..][..n_out]
                .iter_mut()
                .zip(&bias[e * n_out..][..n_out])
            {
                *o += *b as f64;
            }
        }
    }
    Ok(out)
}

/// gpt-oss's clamped SwiGLU, elementwise: `(clamp(u, −limit, limit) + 1) · g′ · σ(alpha · g′)`
/// with `g′ = min(g, limit)` (transformers' `GptOssExperts._apply_gate`).
pub fn swiglu_clamped(g: &[f32], u: &[f32], alpha: f64, limit: f64) -> Vec<f64> {
    g.iter()
        .zip(u)
        .map(|(g, u)| {
            let g = (*g as f64).min(limit);
            let u = (*u as f64).clamp(-limit, limit);
            (u + 1.0) * g * sigmoid(alpha * g)
        })
        .collect()
}

/// `down(SiLU(x·gateᵀ) ⊙ (x·upᵀ))` of one dense SwiGLU MLP in f64: `x [T, H]`, `gate, up [I, H]`,
/// `down [H, I]` (DeepseekV3MLP, also the shared expert).
pub fn swiglu_mlp(
    x: &[f64],
    gate: &[f32],
    up: &[f32],
    down: &[f32],
    hidden: usize,
    inter: usize,
) -> Vec<f64> {
    let tokens = x.len() / hidden.max(1);
    let mut y = vec![0.0f64; tokens * hidden];
    let dot = |a: &[f64], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * *q as f64).sum::<f64>();
    for t in 0..tokens {
        let xt = &x[t * hidden..][..hidden];
        let h: Vec<f64> = (0..inter)
            .map(|i| {
                let g = dot(xt, &gate[i * hidden..][..hidden]);
                g * sigmoid(g) * dot(xt, &up[i * hidden..][..hidden])
            })
            .collect();
        for (o, yo) in y[t * hidden..][..hidden].iter_mut().enumerate() {
            *yo = dot(&h, &down[o * inter..][..inter]);
        }
    }
    y
}

/// Weights of one DeepSeek-V3 MoE block (f32, row-major, HF layouts with gate and up split).
#[derive(Debug, Clone)]
pub struct MoeBlockWeights<'a> {
    /// Router `[E, H]` (`mlp.gate.weight`).
    pub router: &'a [f32],
    /// `e_score_correction_bias` `[E]`.
    pub bias: &'a [f32],
    /// Routed experts' gate projections `[E, I, H]`.
    pub gate: &'a [f32],
    /// Routed experts' up projections `[E, I, H]`.
    pub up: &'a [f32],
    /// Routed experts' down projections `[E, H, I]`.
    pub down: &'a [f32],
    /// Shared expert gate `[Is, H]`.
    pub shared_gate: &'a [f32],
    /// Shared expert up `[Is, H]`.
    pub shared_up: &'a [f32],
    /// Shared expert down `[H, Is]`.
    pub shared_down: &'a [f32],
}

/// A whole DeepSeek-V3 MoE block (`DeepseekV3MoE.forward`) on `x [T, H]` in f64: router logits,
/// [`router_sigmoid_group_topk`], every token through its experts' SwiGLU, weighted sum, plus the
/// shared expert. Returns the output `[T, H]` and the routing (its `margin` says how safe the
/// selection is from f32 rounding).
pub fn deepseek_moe_block(
    x: &[f32],
    w: &MoeBlockWeights<'_>,
    p: SigmoidRouterParams,
    hidden: usize,
    inter: usize,
    shared_inter: usize,
) -> Result<(Vec<f64>, RouterRef), MoeRefError> {
    p.validate()?;
    let e = p.experts;
    let tokens = x.len() / hidden.max(1);
    expect_len("x", x.len(), tokens * hidden, "[T, H]")?;
    expect_len("router", w.router.len(), e * hidden, "[E, H]")?;
    expect_len("gate", w.gate.len(), e * inter * hidden, "[E, I, H]")?;
    expect_len("up", w.up.len(), e * inter * hidden, "[E, I, H]")?;
    expect_len("down", w.down.len(), e * hidden * inter, "[E, H, I]")?;
    expect_len(
        "shared_gate",
        w.shared_gate.len(),
        shared_inter * hidden,
        "[Is, H]",
    )?;
    expect_len(
        "shared_up",
        w.shared_up.len(),
        shared_inter * hidden,
        "[Is, H]",
    )?;
    expect_len(
        "shared_down",
        w.shared_down.len(),
        hidden * shared_inter,
        "[H, Is]",
    )?;
    let logits64 = crate::reference::gemm(
        x,
        &crate::reference::transpose(w.router, e, hidden),
        tokens,
        e,
        hidden,
    );
    // The router reference takes f32 logits (as the kernel does); the margin absorbs the rounding.
    let logits: Vec<f32> = logits64.iter().map(|v| *v as f32).collect();
    let routing = router_sigmoid_group_topk(&logits, w.bias, tokens, p)?;
    let x64: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    let mut out = swiglu_mlp(
        &x64,
        w.shared_gate,
        w.shared_up,
        w.shared_down,
        hidden,
        shared_inter,
    );
    let (ei, eh) = (inter * hidden, hidden * inter);
    for t in 0..tokens {
        let xt = &x64[t * hidden..][..hidden];
        for j in 0..p.top_k {
            let ex = routing.idx[t * p.top_k + j];
            let y = swiglu_mlp(
                xt,
                &w.gate[ex * ei..][..ei],
                &w.up[ex * ei..][..ei],
                &w.down[ex * eh..][..eh],
                hidden,
                inter,
            );
            let wt = routing.weights[t * p.top_k + j];
            for (o, v) in out[t * hidden..][..hidden].iter_mut().zip(&y) {
                *o += wt * v;
            }
        }
    }
    Ok((out, routing))
}
