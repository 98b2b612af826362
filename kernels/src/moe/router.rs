//! MoE routers: from router logits `[T, E]` to each token's chosen experts `idx [T, K]` (i32) and
//! routing weights `weights [T, K]` (f32), best first.
//!
//! - [`router_sigmoid_group_topk()`]: DeepSeek-V3 / Kimi-K2 (`DeepseekV3TopkRouter`): sigmoid
//!   scores, `e_score_correction_bias` for selection only, group-limited top-k.
//! - [`router_softmax_topk()`]: Qwen3-Next (`Qwen3NextTopKRouter`): softmax, top-k, renormalise.
//! - [`router_softmax_bias_topk()`]: ERNIE-4.5: softmax, top-k on probability plus a correction
//!   bias, the unbiased probabilities renormalised.
//!
//! One program per token: a token's selection is a chain of small row operations (the row of one
//! token is at most a few hundred experts), so tokens are the parallel axis. Ties are broken by
//! lower expert index (and lower group index), deterministically; `torch.topk` promises no order.
//! The semantics are [`super::reference::router_sigmoid_group_topk`] and
//! [`super::reference::router_softmax_topk`].

use super::reference::SigmoidRouterParams;
use dsl_core::prelude::*;
use dsl_core::{Report, SimError};

/// Selection scores `σ(logit) + bias` of the experts `c0 .. c0 + width` of token `t` (a block of
/// one group), in a `1×GS` tile whose columns past `width` are −∞ (never chosen).
#[kernel(helper)]
pub fn group_choice_scores<const GS: usize>(
    logits: &Tensor<f32>,
    bias: &Tensor<f32>,
    t: usize,
    c0: usize,
    width: usize,
) -> Tile<f32, 1, GS> {
    let x = load_async_or::<1, GS>(logits, t, c0, f32::NEG_INFINITY);
    let b = load_async::<1, GS>(bias, 0, c0);
    mask_keys(&add(&sigmoid(&x), &b), 0, 0, width, false)
}

/// The running max `m` and sum `l = Σ exp(x − m)` of token `t`'s logits, read `EB` at a time
/// (online softmax): each probability is then `exp(x − m) / l`.
#[kernel(helper)]
pub fn softmax_stats<const EB: usize>(
    logits: &Tensor<f32>,
    t: usize,
) -> (Tile<f32, 1, 1>, Tile<f32, 1, 1>) {
    let mut m = full::<f32, 1, 1>(f32::NEG_INFINITY);
    let mut l = zeros::<f32, 1, 1>();
    for c0 in (0..logits.cols()).step_by(EB) {
        let x = load_async_or::<1, EB>(logits, t, c0, f32::NEG_INFINITY);
        let m_new = maximum(&m, &row_max(&x));
        l = add(
            &mul(&l, &exp(&sub(&m, &m_new))),
            &row_sum(&exp(&sub_col(&x, &m_new))),
        );
        m = m_new;
    }
    (m, l)
}

/// DeepSeek-V3 routing of one token per program: group scores (sum of each group's top-2
/// selection scores) ranked into `GB` slots, the experts of the `topk_group` best groups merged
/// into a running top-`KB`, then the chosen experts' unbiased sigmoid scores normalised
/// (`/ (Σ + 1e-20)`) and scaled. Expert counts and group sizes are run-time values: a group is
/// read `GS` experts at a time (any group size), `GB` covers `n_group` and `KB` covers `K`.
#[kernel(
    grid = (logits.rows(),),
    tunable(GS = [32, 8, 16, 64, 128, 256, 512], GB = [8, 16, 32, 64, 128], KB = [8, 16, 32, 64]),
    helpers(group_choice_scores)
)]
#[allow(clippy::too_many_arguments)]
pub fn router_sigmoid_group_topk(
    logits: &Tensor<f32>,
    bias: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    n_group: usize,
    topk_group: usize,
    norm_topk_prob: bool,
    routed_scaling_factor: f32,
) {
    require(
        n_group <= GB && idx.cols() <= KB,
        "the GB/KB tiles must cover n_group and the experts per token",
    );
    let t = program_id(0);
    let gs = logits.cols() / n_group;
    let mut group_best = full::<f32, 1, GB>(f32::NEG_INFINITY);
    let mut group_idx = full::<i32, 1, GB>(-1.0);
    for g in 0..n_group {
        let mut top2 = full::<f32, 1, 2>(f32::NEG_INFINITY);
        let mut top2_idx = full::<i32, 1, 2>(-1.0);
        for b in (0..gs).step_by(GS) {
            let sb = group_choice_scores::<GS>(logits, bias, t, g * gs + b, gs - b);
            topk_update(&mut top2, &mut top2_idx, &sb, b);
        }
        topk_update(&mut group_best, &mut group_idx, &row_sum(&top2), g);
    }
    // Only the kept groups' experts enter the selection (the others are −∞ in HF). Their scores
    // are recomputed: a tile cannot be indexed by a run-time group, and the reload hits L2.
    let mut best = full::<f32, 1, KB>(f32::NEG_INFINITY);
    let mut best_idx = full::<i32, 1, KB>(-1.0);
    for i in 0..topk_group {
        let g = index_at(&group_idx, i, i);
        for b in (0..gs).step_by(GS) {
            let sb = group_choice_scores::<GS>(logits, bias, t, g * gs + b, gs - b);
            topk_update(&mut best, &mut best_idx, &sb, g * gs + b);
        }
    }
    store(idx, t, 0, &best_idx);
    // Weights are the unbiased scores σ(logit) of the chosen experts.
    let k = idx.cols();
    let mut den = full::<f32, 1, 1>(1.0);
    if norm_topk_prob {
        let mut sum = zeros::<f32, 1, 1>();
        for j in 0..k {
            let e = index_at(&best_idx, j, j);
            sum = add(&sum, &sigmoid(&load_async::<1, 1>(logits, t, e)));
        }
        den = add_scalar(&sum, 1e-20);
    }
    for j in 0..k {
        let e = index_at(&best_idx, j, j);
        let w = div(&sigmoid(&load_async::<1, 1>(logits, t, e)), &den);
        store(weights, t, j, &scale(&w, routed_scaling_factor));
    }
}

/// Softmax routing of one token per program (Qwen3-Next, Mixtral, DeepSeek-V2): softmax over
/// the experts (f32), the top-`K` probabilities (`KB` ≥ `K`), divided by their sum when
/// `norm_topk_prob`, times `routed_scaling_factor`. With `n_group > 1` (DeepSeek-V2's
/// `group_limited_greedy`) only the experts of the `topk_group` groups with the highest best
/// probability are eligible; a group's best probability ranks as its largest logit (softmax is
/// monotonic), so the groups are ranked on the logits, at most [`MAX_SOFTMAX_GROUPS`] of them.
/// The expert count is a run-time value: the experts are read `EB` at a time, once for the
/// running max and sum (online softmax) and once to merge each block's probabilities into the
/// running top-k (per kept group when grouped).
#[kernel(
    grid = (logits.rows(),),
    tunable(EB = [64, 8, 16, 32, 128, 256, 512], KB = [8, 16, 32, 64]),
    helpers(softmax_stats)
)]
#[allow(clippy::too_many_arguments)]
pub fn router_softmax_topk(
    logits: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    n_group: usize,
    topk_group: usize,
    norm_topk_prob: bool,
    routed_scaling_factor: f32,
) {
    require(
        idx.cols() <= KB,
        "the KB tile must cover the experts per token",
    );
    require(
        n_group <= 64,
        "at most 64 expert groups (MAX_SOFTMAX_GROUPS)",
    );
    let t = program_id(0);
    let e = logits.cols();
    let (m, l) = softmax_stats::<EB>(logits, t);
    let mut best = full::<f32, 1, KB>(f32::NEG_INFINITY);
    let mut best_idx = full::<i32, 1, KB>(-1.0);
    if n_group <= 1 {
        for c0 in (0..e).step_by(EB) {
            let x = load_async_or::<1, EB>(logits, t, c0, f32::NEG_INFINITY);
            let prob = div_col(&exp(&sub_col(&x, &m)), &l);
            topk_update(&mut best, &mut best_idx, &prob, c0);
        }
    } else {
        let gs = e / n_group;
        let mut group_best = full::<f32, 1, 64>(f32::NEG_INFINITY);
        let mut group_idx = full::<i32, 1, 64>(-1.0);
        for g in 0..n_group {
            let mut gmax = full::<f32, 1, 1>(f32::NEG_INFINITY);
            for b in (0..gs).step_by(EB) {
                let x = load_async_or::<1, EB>(logits, t, g * gs + b, f32::NEG_INFINITY);
                gmax = maximum(&gmax, &row_max(&mask_keys(&x, 0, 0, gs - b, false)));
            }
            topk_update(&mut group_best, &mut group_idx, &gmax, g);
        }
        // The kept groups' blocks are read again (a tile cannot be indexed by a run-time group;
        // the reload hits L2).
        for i in 0..topk_group {
            let g = index_at(&group_idx, i, i);
            for b in (0..gs).step_by(EB) {
                let x = load_async_or::<1, EB>(logits, t, g * gs + b, f32::NEG_INFINITY);
                let x = mask_keys(&x, 0, 0, gs - b, false);
                let prob = div_col(&exp(&sub_col(&x, &m)), &l);
                topk_update(&mut best, &mut best_idx, &prob, g * gs + b);
            }
        }
    }
    // Probabilities are ≥ 0: masking the slots past K to −∞ and taking ReLU zeroes them, so the
    // renormalising sum sees the K chosen ones only.
    let top = relu(&mask_keys(&best, 0, 0, idx.cols(), false));
    store(idx, t, 0, &best_idx);
    let w = if norm_topk_prob {
        div_col(&top, &row_sum(&top))
    } else {
        top
    };
    if routed_scaling_factor == 1.0 {
        store(weights, t, 0, &w);
    } else {
        store(weights, t, 0, &scale(&w, routed_scaling_factor));
    }
}

/// ERNIE-4.5's routing of one token per program: softmax over the experts (f32, online, `EB` at
/// a time), the top-`K` picked on probability plus `e_score_correction_bias` (`bias [1, E]`;
/// columns past `E` are −∞, never chosen), the chosen experts' unbiased probabilities divided by
/// their sum floored at `norm_min` (`moe_norm_min`). Semantics:
/// [`super::reference::router_softmax_bias_topk`].
#[kernel(
    grid = (logits.rows(),),
    tunable(EB = [64, 8, 16, 32, 128, 256, 512], KB = [8, 16, 32, 64]),
    helpers(softmax_stats)
)]
pub fn router_softmax_bias_topk(
    logits: &Tensor<f32>,
    bias: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    norm_min: f32,
) {
    require(
        idx.cols() <= KB,
        "the KB tile must cover the experts per token",
    );
    let t = program_id(0);
    let e = logits.cols();
    let (m, l) = softmax_stats::<EB>(logits, t);
    let mut best = full::<f32, 1, KB>(f32::NEG_INFINITY);
    let mut best_idx = full::<i32, 1, KB>(-1.0);
    for c0 in (0..e).step_by(EB) {
        let x = load_async_or::<1, EB>(logits, t, c0, f32::NEG_INFINITY);
        let b = load_async::<1, EB>(bias, 0, c0);
        let prob = div_col(&exp(&sub_col(&x, &m)), &l);
        let choice = mask_keys(&add(&prob, &b), 0, 0, e - c0, false);
        topk_update(&mut best, &mut best_idx, &choice, c0);
    }
    store(idx, t, 0, &best_idx);
    // The weights are the chosen experts' probabilities, without the bias.
    let k = idx.cols();
    let mut sum = zeros::<f32, 1, 1>();
    for j in 0..k {
        let ex = index_at(&best_idx, j, j);
        let p = div(&exp(&sub(&load_async::<1, 1>(logits, t, ex), &m)), &l);
        sum = add(&sum, &p);
    }
    let den = maximum(&sum, &full::<f32, 1, 1>(norm_min));
    for j in 0..k {
        let ex = index_at(&best_idx, j, j);
        let p = div(&exp(&sub(&load_async::<1, 1>(logits, t, ex), &m)), &l);
        store(weights, t, j, &div(&p, &den));
    }
}

/// Runs [`router_softmax_bias_topk()`] after checking its parameters: `logits [T, E]`,
/// `bias [1, E]`, `idx`/`weights [T, K]` with `K ≤ E`. Tiles are chosen to fit.
pub fn run_router_softmax_bias_topk(
    launcher: &Launcher,
    logits: &Tensor<f32>,
    bias: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
) -> Result<Report, SimError> {
    let meta = &router_softmax_bias_topk::META;
    let (_, e, k) = routing_shapes(meta.name, logits, idx, weights)?;
    if bias.shape() != [1, e] {
        return Err(bad(
            meta.name,
            format!("`bias` must be [1, E] = [1, {e}], got {bias:?}"),
        ));
    }
    if k > e {
        return Err(bad(
            meta.name,
            format!("top_k = {k} (the columns of `idx`) exceeds the {e} experts"),
        ));
    }
    let config = crate::tile_choice::cover(
        meta,
        &Config::new().with(
            "EB",
            crate::tile_choice::covering(meta, "EB", e, 512).unwrap_or(64),
        ),
        &[("KB", k, "num_experts_per_tok")],
    )?;
    Ok(router_softmax_bias_topk::launch(
        launcher,
        &config,
        logits,
        bias,
        idx,
        weights,
        super::reference::SOFTMAX_BIAS_NORM_MIN as f32,
    )?
    .report)
}

/// Most expert groups [`router_softmax_topk()`] ranks (its group tile's width).
pub const MAX_SOFTMAX_GROUPS: usize = 64;

fn bad(kernel: &str, message: String) -> SimError {
    SimError::Launch {
        kernel: kernel.to_string(),
        message,
    }
}

/// Checks that `idx` and `weights` are `[T, K]` for `logits [T, E]`; returns `(T, E, K)`.
fn routing_shapes(
    kernel: &str,
    logits: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
) -> Result<(usize, usize, usize), SimError> {
    let (t, e, k) = (logits.rows(), logits.cols(), idx.cols());
    if logits.shape().len() != 2 || t == 0 || e == 0 {
        return Err(bad(
            kernel,
            format!("`logits` must be [T, E] with T, E ≥ 1, got {logits:?}"),
        ));
    }
    if idx.shape() != [t, k] || k == 0 {
        return Err(bad(
            kernel,
            format!("`idx` must be [T = {t}, K ≥ 1], got {idx:?}"),
        ));
    }
    if weights.shape() != [t, k] {
        return Err(bad(
            kernel,
            format!("`weights` must be [T, K] = [{t}, {k}] like `idx`, got {weights:?}"),
        ));
    }
    Ok((t, e, k))
}

/// Runs [`router_sigmoid_group_topk()`] after checking its parameters: `logits [T, E]`,
/// `bias [1, E]`, `idx`/`weights [T, K]`; `n_group` divides `E` into groups of ≥ 2 experts,
/// `1 ≤ topk_group ≤ n_group`, `K ≤ topk_group · E / n_group`. Tiles are chosen to fit.
#[allow(clippy::too_many_arguments)]
pub fn run_router_sigmoid_group_topk(
    launcher: &Launcher,
    logits: &Tensor<f32>,
    bias: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    n_group: usize,
    topk_group: usize,
    norm_topk_prob: bool,
    routed_scaling_factor: f32,
) -> Result<Report, SimError> {
    let meta = &router_sigmoid_group_topk::META;
    let (_, e, k) = routing_shapes(meta.name, logits, idx, weights)?;
    if bias.shape() != [1, e] {
        return Err(bad(
            meta.name,
            format!("`bias` (e_score_correction_bias) must be [1, E] = [1, {e}], got {bias:?}"),
        ));
    }
    let params = SigmoidRouterParams {
        experts: e,
        top_k: k,
        n_group,
        topk_group,
        norm_topk_prob,
        routed_scaling_factor,
    };
    params
        .validate()
        .map_err(|er| bad(meta.name, er.0.clone()))?;
    let group = e / n_group;
    let config = crate::tile_choice::cover(
        meta,
        &Config::new().with(
            "GS",
            crate::tile_choice::covering(meta, "GS", group, 512).unwrap_or(32),
        ),
        &[("GB", n_group, "n_group"), ("KB", k, "num_experts_per_tok")],
    )?;
    Ok(router_sigmoid_group_topk::launch(
        launcher,
        &config,
        logits,
        bias,
        idx,
        weights,
        n_group,
        topk_group,
        norm_topk_prob,
        routed_scaling_factor,
    )?
    .report)
}

/// Runs [`router_softmax_topk()`] after checking its parameters: `logits [T, E]`,
/// `idx`/`weights [T, K]` with `K ≤ E`; ungrouped, unscaled (Qwen, Mixtral). Tiles are chosen
/// to fit.
pub fn run_router_softmax_topk(
    launcher: &Launcher,
    logits: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    norm_topk_prob: bool,
) -> Result<Report, SimError> {
    run_router_softmax_group_topk(
        launcher,
        logits,
        idx,
        weights,
        SoftmaxRouterParams {
            n_group: 1,
            topk_group: 1,
            norm_topk_prob,
            routed_scaling_factor: 1.0,
        },
    )
}

/// The parameters of a softmax router beyond its shapes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SoftmaxRouterParams {
    /// Expert groups (`n_group`; 1 = ungrouped).
    pub n_group: usize,
    /// Groups whose experts are eligible (`topk_group`).
    pub topk_group: usize,
    /// Divide the chosen probabilities by their sum.
    pub norm_topk_prob: bool,
    /// Multiplies the weights (DeepSeek-V2's `routed_scaling_factor`).
    pub routed_scaling_factor: f32,
}

/// Runs [`router_softmax_topk()`] after checking its parameters: `logits [T, E]`,
/// `idx`/`weights [T, K]`; `n_group` (≤ [`MAX_SOFTMAX_GROUPS`]) divides `E`,
/// `1 ≤ topk_group ≤ n_group`, and `K ≤ topk_group · E / n_group`. Tiles are chosen to fit.
pub fn run_router_softmax_group_topk(
    launcher: &Launcher,
    logits: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    p: SoftmaxRouterParams,
) -> Result<Report, SimError> {
    let meta = &router_softmax_topk::META;
    let (_, e, k) = routing_shapes(meta.name, logits, idx, weights)?;
    let groups = p.n_group.max(1);
    if groups > MAX_SOFTMAX_GROUPS || !e.is_multiple_of(groups) {
        return Err(bad(
            meta.name,
            format!(
                "n_group = {} must divide the {e} experts and be at most {MAX_SOFTMAX_GROUPS}",
                p.n_group
            ),
        ));
    }
    let kept = if groups == 1 { 1 } else { p.topk_group };
    if kept == 0 || kept > groups {
        return Err(bad(
            meta.name,
            format!(
                "topk_group = {} must be in 1..={groups} (n_group)",
                p.topk_group
            ),
        ));
    }
    if k > kept * (e / groups) {
        return Err(bad(
            meta.name,
            format!(
                "top_k = {k} (the columns of `idx`) exceeds the {} experts of the {kept} kept group(s)",
                kept * (e / groups)
            ),
        ));
    }
    if !p.routed_scaling_factor.is_finite() {
        return Err(bad(
            meta.name,
            format!(
                "routed_scaling_factor = {} must be finite",
                p.routed_scaling_factor
            ),
        ));
    }
    let config = crate::tile_choice::cover(
        meta,
        &Config::new().with(
            "EB",
            crate::tile_choice::covering(meta, "EB", e / groups, 512).unwrap_or(64),
        ),
        &[("KB", k, "num_experts_per_tok")],
    )?;
    Ok(router_softmax_topk::launch(
        launcher,
        &config,
        logits,
        idx,
        weights,
        groups,
        kept,
        p.norm_topk_prob,
        p.routed_scaling_factor,
    )?
    .report)
}
