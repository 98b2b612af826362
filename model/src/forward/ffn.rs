//! Feed-forward blocks: the dense SwiGLU MLP and the mixture of experts (router → dispatch →
//! grouped expert SwiGLU → weighted combine, plus the shared expert).

use super::ops::{view, MoeParts, Ops};
use super::params::{MlpWeights, MoeWeights};
use super::routing;
use super::ForwardError;
use crate::config::{ExpertActivation, MoeDims, RouterKind};
use dsl_core::Tensor;
use kernels::moe::dispatch::RoutingPlan;

/// `down(silu(gate(x)) · up(x))`.
pub(crate) fn mlp(
    ops: &mut Ops,
    name: &str,
    w: &MlpWeights,
    x: &Tensor<f32>,
) -> Result<Tensor<f32>, ForwardError> {
    let g = ops.linear(&format!("{name}.gate_proj"), x, &w.gate)?;
    let u = ops.linear(&format!("{name}.up_proj"), x, &w.up)?;
    let a = ops.swiglu(&format!("{name}.swiglu"), &g, &u)?;
    ops.linear(&format!("{name}.down_proj"), &a, &w.down)
}

/// The MoE block on `x [T, H]`.
pub(crate) fn moe(
    ops: &mut Ops,
    m: &MoeDims,
    w: &MoeWeights,
    x: &Tensor<f32>,
) -> Result<Tensor<f32>, ForwardError> {
    let (t, e, k, i) = (
        x.rows(),
        m.experts,
        m.experts_per_token,
        m.intermediate_size,
    );
    let parts = ops.moe_parts;
    let shared = |ops: &mut Ops| -> Result<Tensor<f32>, ForwardError> {
        match &w.shared {
            Some(s) if parts != MoeParts::RoutedOnly => {
                let y = mlp(ops, "moe.shared_expert", s, x)?;
                match &w.shared_gate {
                    Some(g) => {
                        let gate = ops.linear("moe.shared_expert_gate", x, g)?;
                        ops.sigmoid_mul_col("moe.shared_expert_gate", &gate, &y)
                    }
                    None => Ok(y),
                }
            }
            _ => ops.mem.act_zeros(t, x.cols(), "zero base"),
        }
    };
    let idx = ops.mem.poisoned::<i32>(&[t, k]);
    let weights = ops.mem.poisoned::<f32>(&[t, k]);
    if parts != MoeParts::RoutedOnly {
        // (Routed experts alone run shape-only: the choices come from the routing model below,
        // and the router is priced in the run of the card's own tokens.)
        route(ops, m, w, x, &idx, &weights)?;
    }
    if parts == MoeParts::OwnTokens {
        // A planning run prices the routed experts at the rows expert parallelism sends to the
        // card, in a run of its own; this one keeps the router and the shared experts.
        return shared(ops);
    }
    // The routing plan is index bookkeeping on the host, as the expert-parallel runtime does. A
    // cost-only run has no router output: it follows the runner's routing model (uniform by
    // default: balanced load, the usual assumption of serving estimates; Zipf-skewed; or the
    // choices a functional run recorded).
    let layer = ops.layer;
    let l = layer.unwrap_or(usize::MAX);
    let replayed = ops
        .routing
        .replayed_layer(l)
        .and_then(|r| r.experts.clone());
    let sel: Vec<i32> = match (idx.to_vec(), replayed) {
        (Some(v), _) => v.iter().map(|v| *v as i32).collect(),
        (None, Some(v)) if v.len() == t * k => v,
        (None, Some(v)) => {
            return Err(ForwardError::Workload {
                flag: "--routing replay:FILE".into(),
                message: format!(
                    "layer {l}, step {}: the recording routes {} choices, the step needs {t} tokens × {k}",
                    ops.routing.step,
                    v.len()
                ),
            })
        }
        (None, None) => routing::synthetic_choices(&ops.routing.model, t, k, e),
    };
    if let Some(r) = ops.routing.recorded_layer(l) {
        r.experts = Some(sel.clone());
    }
    // Cost-only runs report the loads; a functional runner serving for hours keeps no history.
    if ops.mem.shape_only {
        let step = ops.routing.step;
        ops.routing
            .loads
            .push((step, routing::ExpertLoad::of(&sel, e)));
    }
    let scaled_input = m.router == RouterKind::SigmoidTopkScaledInput;
    if ops.cards.is_some() && scaled_input {
        return Err(ForwardError::Unsupported {
            what: "a router that scales the experts' input (Llama 4) across simulated cards".into(),
        });
    }
    if ops.cards.is_some() {
        // Expert parallelism: the chosen rows travel to the cards holding their experts.
        let base = shared(ops)?;
        return ops.routed_on_cards(w, x, &sel, &weights, i, &base);
    }
    let plan_err = |source| ForwardError::Kernel {
        op: "moe.routing_plan".into(),
        layer,
        source,
    };
    let plan = RoutingPlan::from_topk(&sel, t, k, e).map_err(plan_err)?;
    let rows = plan.rows_tensor().map_err(plan_err)?;
    let offsets = plan.offsets_tensor().map_err(plan_err)?;
    let slot_of = plan.slot_of_tensor(k).map_err(plan_err)?;

    if !scaled_input {
        let ye = expert_swiglu(ops, w, x, &rows, &offsets, i, None)?;
        let base = shared(ops)?;
        return ops.moe_combine(&ye, &slot_of, &weights, &base);
    }
    // Llama 4: each routed row enters its expert times its score, and the outputs are summed.
    let n = plan.rows.len();
    let scale = match weights.to_vec() {
        Some(wv) => {
            let mut sorted = vec![0.0f32; n];
            for (pair, &slot) in plan.slot_of.iter().enumerate() {
                sorted[slot as usize] = wv[pair];
            }
            view(Tensor::from_f32(&[n, 1], &sorted), "routed rows' scores")?
        }
        None => Tensor::shape_only(&[n, 1]),
    };
    let ye = expert_swiglu(ops, w, x, &rows, &offsets, i, Some(&scale))?;
    let base = shared(ops)?;
    let ones = ops.mem.filled(&[t, k], 1.0, "unit combine weights")?;
    ops.moe_combine(&ye, &slot_of, &ones, &base)
}

/// The router: each row of `x`'s top-k experts (`idx`) and their weights (`weights`).
fn route(
    ops: &mut Ops,
    m: &MoeDims,
    w: &MoeWeights,
    x: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
) -> Result<(), ForwardError> {
    let logits = ops.linear_f32("moe.router_logits", x, &w.router)?;
    if let Some(b) = &w.router_bias {
        ops.add_bias("moe.router_bias", &logits, b)?;
    }
    // The correction bias the biased routers pick with (zeros where the checkpoint has none).
    let bias = |ops: &mut Ops| match &w.bias {
        Some(b) => Ok(b.clone()),
        None => ops.mem.zeros(&[1, m.experts], "zero router bias"),
    };
    match &m.router {
        RouterKind::SigmoidGroupTopk => {
            let bias = bias(ops)?;
            ops.router_sigmoid_group_topk(&logits, &bias, idx, weights, m)
        }
        RouterKind::SoftmaxTopk => ops.router_softmax_topk(&logits, idx, weights, m),
        // Top-k of the logits weighted by their sigmoids: the same experts and weights as the
        // sigmoid router with no correction bias, one group and no renormalisation (the parser
        // sets those).
        RouterKind::SigmoidTopkScaledInput => {
            let zero = ops.mem.zeros(&[1, m.experts], "zero router bias")?;
            ops.router_sigmoid_group_topk(&logits, &zero, idx, weights, m)
        }
        RouterKind::SoftmaxBiasTopk => {
            let bias = bias(ops)?;
            ops.router_softmax_bias_topk(&logits, &bias, idx, weights)
        }
        RouterKind::Unknown(r) => Err(ForwardError::Unsupported {
            what: format!("router `{r}`"),
        }),
    }
}

/// The routed experts' SwiGLU on the rows of `x` a routing plan sends them: gathered by expert
/// (`rows`), then per expert (`offsets`) `down(silu(gate(x)) · up(x))` with intermediate size
/// `inter` (gpt-oss: the clamped SwiGLU, and each expert's biases after its projections), each
/// gathered row first scaled by its entry of `input_scale` `[rows, 1]` when given (Llama 4).
/// Returns `[rows, H]` in the plan's (expert-grouped) order.
pub(crate) fn expert_swiglu(
    ops: &mut Ops,
    w: &MoeWeights,
    x: &Tensor<f32>,
    rows: &Tensor<i32>,
    offsets: &Tensor<i32>,
    inter: usize,
    input_scale: Option<&Tensor<f32>>,
) -> Result<Tensor<f32>, ForwardError> {
    let xe = ops.moe_dispatch(x, rows)?;
    let xe = match input_scale {
        Some(s) => ops.mul_col("moe.experts.input_scale", s, &xe)?,
        None => xe,
    };
    let gu = ops.grouped_linear("moe.experts.gate_up_proj", &xe, &w.gate_up, offsets)?;
    if let Some((b, _)) = &w.expert_biases {
        ops.grouped_add_bias("moe.experts.gate_up_proj_bias", &gu, b, offsets)?;
    }
    let (gate, up) = (
        view(gu.col_range(0, inter), "expert gate half")?,
        view(gu.col_range(inter, inter), "expert up half")?,
    );
    let act = match w.activation {
        ExpertActivation::Swiglu => ops.swiglu("moe.experts.swiglu", &gate, &up)?,
        ExpertActivation::ClampedSwiglu { alpha, limit } => {
            ops.swiglu_clamped("moe.experts.swiglu", &gate, &up, alpha, limit)?
        }
    };
    let y = ops.grouped_linear("moe.experts.down_proj", &act, &w.down, offsets)?;
    if let Some((_, b)) = &w.expert_biases {
        ops.grouped_add_bias("moe.experts.down_proj_bias", &y, b, offsets)?;
    }
    Ok(y)
}
