//! MoE routing: the two routers, the routing plan, dispatch, the grouped expert GEMM, combine, and
//! a whole DeepSeek-V3 MoE block composed from them, against `kernels::moe::reference` (f64).
//!
//! Tolerances (relative to the reference's RMS, see `kernels::reference::rel_error`):
//! - router selection equals the reference **exactly**; cases whose reference margin (the smallest
//!   relative gap between adjacent scores that decide the selection or its order) is below 1e-5
//!   are discarded, since f32 rounding (≈ 1e-7 relative) could then legitimately reorder them;
//! - router weights ≤ 1e-5 (an f32 sigmoid or softmax and a sum of ≤ 8 terms);
//! - dispatch is a copy: bit-exact;
//! - grouped linear, combine, the routed SwiGLU FFN and the whole block: ≤ 1e-5 (f32 accumulation
//!   over ≤ 300-term dot products).

use dsl_core::prelude::*;
use kernels::moe::dispatch::{moe_dispatch, run_moe_combine, run_moe_dispatch, RoutingPlan};
use kernels::moe::grouped::{grouped_linear, run_expert_swiglu_grouped, run_grouped_linear};
use kernels::moe::reference::{self as mref, MoeBlockWeights, SigmoidRouterParams};
use kernels::moe::router::{
    run_router_sigmoid_group_topk, run_router_softmax_bias_topk, run_router_softmax_group_topk,
    run_router_softmax_topk, SoftmaxRouterParams,
};
use kernels::reference::rel_error;
use kernels::testdata::Rng;
use proptest::prelude::*;

const TOL: f64 = 1e-5;
/// Reference margins below this could be reordered by f32 rounding: such cases are discarded.
const MIN_MARGIN: f64 = 1e-5;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

fn tensor<T: Elem>(shape: &[usize], values: &[f32]) -> Tensor<T> {
    Tensor::from_f32(shape, values).unwrap()
}

fn indices(shape: &[usize], values: &[i32]) -> Tensor<i32> {
    Tensor::from_indices(shape, values).unwrap()
}

fn as_usize(v: &[f32]) -> Vec<usize> {
    v.iter().map(|x| *x as usize).collect()
}

/// NaN-poisoned router outputs `idx` and `weights`, both `[tokens, k]`.
fn routing_outputs(tokens: usize, k: usize) -> (Tensor<i32>, Tensor<f32>) {
    (
        Tensor::<i32>::poisoned(&[tokens, k]),
        Tensor::<f32>::poisoned(&[tokens, k]),
    )
}

/// A router's outputs against the reference: the same experts in the same order, weights ≤ TOL.
fn check_routing(
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    want: &mref::RouterRef,
) -> Result<(), String> {
    let got = as_usize(&idx.to_vec().unwrap());
    if got != want.idx {
        return Err(format!("selection {got:?}, reference {:?}", want.idx));
    }
    let err = rel_error(&weights.to_vec().unwrap(), &want.weights);
    if err > TOL {
        return Err(format!("weights error {err}"));
    }
    Ok(())
}

/// `K` distinct experts per token, uniformly.
fn random_topk(rng: &mut Rng, tokens: usize, top_k: usize, experts: usize) -> Vec<i32> {
    let mut idx = Vec::with_capacity(tokens * top_k);
    for _ in 0..tokens {
        let mut all: Vec<i32> = (0..experts as i32).collect();
        for j in 0..top_k {
            let pick = j + (rng.next_u64() % (experts - j) as u64) as usize;
            all.swap(j, pick);
        }
        idx.extend_from_slice(&all[..top_k]);
    }
    idx
}

/// Router parameters from raw draws: `n_group` groups of `gs ≥ 2` experts, a valid `topk_group`
/// and `K`.
fn sigmoid_params(
    n_group: usize,
    gs: usize,
    tg: usize,
    k: usize,
    norm: bool,
) -> SigmoidRouterParams {
    let topk_group = 1 + tg % n_group;
    SigmoidRouterParams {
        experts: n_group * gs,
        top_k: 1 + k % (topk_group * gs).min(8),
        n_group,
        topk_group,
        norm_topk_prob: norm,
        routed_scaling_factor: 2.5,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn sigmoid_group_router_matches_reference(
        tokens in 1usize..40, n_group in 1usize..9, gs in 2usize..13, tg in 0usize..8,
        k in 0usize..8, norm in any::<bool>(), seed in any::<u64>(),
    ) {
        let p = sigmoid_params(n_group, gs, tg, k, norm);
        let (e, kk) = (p.experts, p.top_k);
        let mut rng = Rng::new(seed);
        let logits = rng.vec(tokens * e, 4.0);
        let bias = rng.vec(e, 0.5);
        let want = mref::router_sigmoid_group_topk(&logits, &bias, tokens, p).unwrap();
        prop_assume!(want.margin > MIN_MARGIN);
        let (idx, weights) = routing_outputs(tokens, kk);
        run_router_sigmoid_group_topk(
            &launcher(), &tensor(&[tokens, e], &logits), &tensor(&[1, e], &bias), &idx, &weights,
            p.n_group, p.topk_group, p.norm_topk_prob, p.routed_scaling_factor,
        ).unwrap();
        prop_assert_eq!(check_routing(&idx, &weights, &want), Ok(()), "{:?}", p);
    }

    #[test]
    fn softmax_router_matches_reference(
        tokens in 1usize..40, experts in 1usize..70, k in 0usize..8, norm in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let kk = 1 + k % experts.min(8);
        let mut rng = Rng::new(seed);
        let logits = rng.vec(tokens * experts, 3.0);
        let want = mref::router_softmax_topk(&logits, tokens, experts, kk, norm).unwrap();
        prop_assume!(want.margin > MIN_MARGIN);
        let (idx, weights) = routing_outputs(tokens, kk);
        run_router_softmax_topk(&launcher(), &tensor(&[tokens, experts], &logits), &idx, &weights, norm)
            .unwrap();
        prop_assert_eq!(check_routing(&idx, &weights, &want), Ok(()));
    }

    /// ERNIE-4.5: top-k picked on softmax probability plus a correction bias (large enough to
    /// reorder the probabilities), the unbiased probabilities renormalised; expert counts that
    /// are not a multiple of the tile (the padded columns are never chosen).
    #[test]
    fn softmax_bias_router_matches_reference(
        tokens in 1usize..40, experts in 1usize..140, k in 0usize..8, seed in any::<u64>(),
    ) {
        let kk = 1 + k % experts.min(8);
        let mut rng = Rng::new(seed);
        let logits = rng.vec(tokens * experts, 3.0);
        let bias = rng.vec(experts, 0.2);
        let want = mref::router_softmax_bias_topk(&logits, &bias, tokens, experts, kk).unwrap();
        prop_assume!(want.margin > MIN_MARGIN);
        let (idx, weights) = routing_outputs(tokens, kk);
        run_router_softmax_bias_topk(
            &launcher(), &tensor(&[tokens, experts], &logits), &tensor(&[1, experts], &bias),
            &idx, &weights,
        ).unwrap();
        prop_assert_eq!(check_routing(&idx, &weights, &want), Ok(()));
    }

    /// DeepSeek-V2's `group_limited_greedy`: groups ranked by their best probability, experts of
    /// the dropped groups ineligible, weights scaled by `routed_scaling_factor`.
    #[test]
    fn grouped_softmax_router_matches_reference(
        tokens in 1usize..24, n_group in 2usize..9, per_group in 1usize..12, kept in 0usize..8,
        k in 0usize..8, norm in any::<bool>(), scale in prop::sample::select(vec![1.0f32, 16.0, 2.5]),
        seed in any::<u64>(),
    ) {
        let experts = n_group * per_group;
        let topk_group = 1 + kept % n_group;
        let kk = 1 + k % (topk_group * per_group).min(8);
        let mut rng = Rng::new(seed);
        let logits = rng.vec(tokens * experts, 3.0);
        let want = mref::router_softmax_group_topk(
            &logits, tokens, experts, kk, (n_group, topk_group), norm, scale as f64,
        ).unwrap();
        prop_assume!(want.margin > MIN_MARGIN);
        let (idx, weights) = routing_outputs(tokens, kk);
        let p = SoftmaxRouterParams {
            n_group, topk_group, norm_topk_prob: norm, routed_scaling_factor: scale,
        };
        run_router_softmax_group_topk(
            &launcher(), &tensor(&[tokens, experts], &logits), &idx, &weights, p,
        ).unwrap();
        prop_assert_eq!(check_routing(&idx, &weights, &want), Ok(()), "{:?}", p);
    }

    #[test]
    fn plan_dispatch_and_combine_match_reference(
        tokens in 1usize..40, experts in 1usize..12, k in 0usize..4, hidden in 1usize..300,
        br in prop::sample::select(vec![1i64, 2, 4, 16]), bh in prop::sample::select(vec![64i64, 256]),
        seed in any::<u64>(),
    ) {
        let kk = 1 + k % experts;
        let mut rng = Rng::new(seed);
        let idx = random_topk(&mut rng, tokens, kk, experts);
        let plan = RoutingPlan::from_topk(&idx, tokens, kk, experts).unwrap();
        // The plan: expert e's rows hold exactly its tokens, ascending; slot_of points back.
        for e in 0..experts {
            let (a, b) = (plan.expert_offsets[e] as usize, plan.expert_offsets[e + 1] as usize);
            let want: Vec<i32> = (0..tokens as i32)
                .filter(|t| idx[*t as usize * kk..][..kk].contains(&(e as i32)))
                .collect();
            prop_assert_eq!(&plan.rows[a..b], &want[..]);
        }
        for (i, slot) in plan.slot_of.iter().enumerate() {
            prop_assert_eq!(plan.rows[*slot as usize] as usize, i / kk);
        }
        let n = tokens * kk;
        let xv = rng.vec(tokens * hidden, 1.0);
        let x = tensor::<f32>(&[tokens, hidden], &xv);
        let xe = Tensor::<f32>::poisoned(&[n, hidden]);
        let cfg = Config::new().with("BR", br).with("BH", bh);
        moe_dispatch::launch(&launcher(), &cfg, &x, &plan.rows_tensor().unwrap(), &xe).unwrap();
        let got = xe.to_vec().unwrap();
        for (r, token) in plan.rows.iter().enumerate() {
            let src = &xv[*token as usize * hidden..][..hidden];
            prop_assert!(got[r * hidden..][..hidden].iter().zip(src).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
        // Combine: expert outputs in dispatched order, gathered back per token.
        let yev = rng.vec(n * hidden, 1.0);
        let wv = rng.vec(n, 1.0);
        let basev = rng.vec(tokens * hidden, 1.0);
        let out = Tensor::<f32>::poisoned(&[tokens, hidden]);
        run_moe_combine(
            &launcher(), &tensor(&[n, hidden], &yev), &plan.slot_of_tensor(kk).unwrap(),
            &tensor(&[tokens, kk], &wv), &tensor(&[tokens, hidden], &basev), &out,
        ).unwrap();
        let token_major: Vec<f64> = plan
            .slot_of
            .iter()
            .flat_map(|s| yev[*s as usize * hidden..][..hidden].iter().map(|v| *v as f64))
            .collect();
        let want = mref::combine(&token_major, &wv, &basev, tokens, kk, hidden).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &want);
        prop_assert!(err <= TOL, "combine error {err}");
    }

    #[test]
    fn grouped_linear_matches_reference(
        counts in prop::collection::vec(0usize..40, 1..7), k in 1usize..300, n_out in 1usize..300,
        bf16_inputs in any::<bool>(),
        bm in prop::sample::select(vec![16i64, 32]), bn in prop::sample::select(vec![64i64, 128]),
        bk in prop::sample::select(vec![64i64, 128]), seed in any::<u64>(),
    ) {
        let mut counts = counts;
        if counts.iter().sum::<usize>() == 0 {
            counts[0] = 3;
        }
        let e = counts.len();
        let mut offsets = vec![0usize];
        for c in &counts {
            offsets.push(offsets.last().unwrap() + c);
        }
        let rows = offsets[e];
        let mut rng = Rng::new(seed);
        let (xv, wv) = (rng.vec(rows * k, 1.0), rng.vec(e * n_out * k, 1.0));
        let off = indices(&[e + 1, 1], &offsets.iter().map(|o| *o as i32).collect::<Vec<_>>());
        let y = Tensor::<f32>::poisoned(&[rows, n_out]);
        let cfg = Config::new().with("BM", bm).with("BN", bn).with("BK", bk);
        // The reference multiplies the values the kernel actually holds (bf16-rounded or not).
        let (xr, wr) = if bf16_inputs {
            let (x, w) = (tensor::<bf16>(&[rows, k], &xv), tensor::<bf16>(&[e, n_out, k], &wv));
            grouped_linear::launch(&launcher(), &cfg, &x, &w, &off, &y).unwrap();
            (x.to_vec().unwrap(), w.to_vec().unwrap())
        } else {
            let (x, w) = (tensor::<f32>(&[rows, k], &xv), tensor::<f32>(&[e, n_out, k], &wv));
            grouped_linear::launch(&launcher(), &cfg, &x, &w, &off, &y).unwrap();
            (xv, wv)
        };
        let want = mref::grouped_linear(&xr, &wr, &offsets, n_out, k).unwrap();
        let err = rel_error(&y.to_vec().unwrap(), &want);
        prop_assert!(err <= TOL, "{counts:?}: {err}");
    }
}

/// Random weights for a DeepSeek-V3 MoE block, scaled so activations stay O(1).
struct BlockWeights {
    router: Vec<f32>,
    bias: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    shared: [Vec<f32>; 3],
}

impl BlockWeights {
    fn draw(rng: &mut Rng, e: usize, h: usize, i: usize, is: usize) -> BlockWeights {
        let (sh, si) = (1.0 / (h as f32).sqrt(), 1.0 / (i as f32).sqrt());
        BlockWeights {
            router: rng.vec(e * h, 2.0 * sh),
            bias: rng.vec(e, 0.3),
            gate: rng.vec(e * i * h, sh),
            up: rng.vec(e * i * h, sh),
            down: rng.vec(e * h * i, si),
            shared: [
                rng.vec(is * h, sh),
                rng.vec(is * h, sh),
                rng.vec(h * is, 1.0 / (is as f32).sqrt()),
            ],
        }
    }

    fn reference(&self) -> MoeBlockWeights<'_> {
        MoeBlockWeights {
            router: &self.router,
            bias: &self.bias,
            gate: &self.gate,
            up: &self.up,
            down: &self.down,
            shared_gate: &self.shared[0],
            shared_up: &self.shared[1],
            shared_down: &self.shared[2],
        }
    }
}

/// Everything `run_deepseek_block` produced.
struct BlockRun {
    idx: Vec<usize>,
    out: Vec<f32>,
    reports: Vec<dsl_core::Report>,
}

/// The DeepSeek-V3 MoE block from the kernels: router logits (a one-expert grouped GEMM),
/// router, plan, dispatch, routed SwiGLU experts, shared expert (a one-expert SwiGLU), combine.
fn run_deepseek_block(
    xv: &[f32],
    w: &BlockWeights,
    p: SigmoidRouterParams,
    (h, i, is): (usize, usize, usize),
) -> BlockRun {
    let l = launcher();
    let (t, e, k) = (xv.len() / h, p.experts, p.top_k);
    let x = tensor::<f32>(&[t, h], xv);
    let all_rows = indices(&[2, 1], &[0, t as i32]);
    let logits = Tensor::<f32>::poisoned(&[t, e]);
    let mut reports =
        vec![
            run_grouped_linear(&l, &x, &tensor(&[1, e, h], &w.router), &all_rows, &logits).unwrap(),
        ];
    let (idx, weights) = routing_outputs(t, k);
    reports.push(
        run_router_sigmoid_group_topk(
            &l,
            &logits,
            &tensor(&[1, e], &w.bias),
            &idx,
            &weights,
            p.n_group,
            p.topk_group,
            p.norm_topk_prob,
            p.routed_scaling_factor,
        )
        .unwrap(),
    );
    let chosen: Vec<i32> = idx.to_vec().unwrap().iter().map(|v| *v as i32).collect();
    let plan = RoutingPlan::from_topk(&chosen, t, k, e).unwrap();
    let offsets = plan.offsets_tensor().unwrap();
    let xe = Tensor::<f32>::poisoned(&[t * k, h]);
    reports.push(run_moe_dispatch(&l, &x, &plan.rows_tensor().unwrap(), &xe).unwrap());
    let ye = Tensor::<f32>::poisoned(&[t * k, h]);
    let (gate, up, down) = (
        tensor::<f32>(&[e, i, h], &w.gate),
        tensor::<f32>(&[e, i, h], &w.up),
        tensor::<f32>(&[e, h, i], &w.down),
    );
    reports.push(run_expert_swiglu_grouped(&l, &xe, &gate, &up, &down, &offsets, &ye).unwrap());
    let base = Tensor::<f32>::poisoned(&[t, h]);
    let [sg, su, sd] = &w.shared;
    reports.push(
        run_expert_swiglu_grouped(
            &l,
            &x,
            &tensor(&[1, is, h], sg),
            &tensor(&[1, is, h], su),
            &tensor(&[1, h, is], sd),
            &all_rows,
            &base,
        )
        .unwrap(),
    );
    let out = Tensor::<f32>::poisoned(&[t, h]);
    reports.push(
        run_moe_combine(
            &l,
            &ye,
            &plan.slot_of_tensor(k).unwrap(),
            &weights,
            &base,
            &out,
        )
        .unwrap(),
    );
    BlockRun {
        idx: as_usize(&idx.to_vec().unwrap()),
        out: out.to_vec().unwrap(),
        reports,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(10))]

    /// Router → plan → dispatch → grouped SwiGLU → combine (+ shared expert through `base`)
    /// equals the f64 DeepSeek-V3 MoE block.
    #[test]
    fn deepseek_moe_block_matches_reference(
        tokens in 1usize..40, n_group in 1usize..5, gs in 2usize..5, tg in 0usize..4, k in 0usize..3,
        hidden in 64usize..97, inter in 8usize..50, shared_inter in 8usize..70, seed in any::<u64>(),
    ) {
        let p = sigmoid_params(n_group, gs, tg, k, true);
        let mut rng = Rng::new(seed);
        let w = BlockWeights::draw(&mut rng, p.experts, hidden, inter, shared_inter);
        let xv = rng.vec(tokens * hidden, 1.0);
        let (want, routing) =
            mref::deepseek_moe_block(&xv, &w.reference(), p, hidden, inter, shared_inter).unwrap();
        // The kernels' logits are f32 sums; the reference rounds f64 ones: allow for that.
        prop_assume!(routing.margin > 10.0 * MIN_MARGIN);
        let run = run_deepseek_block(&xv, &w, p, (hidden, inter, shared_inter));
        prop_assert_eq!(run.idx, routing.idx, "{:?}", p);
        let err = rel_error(&run.out, &want);
        prop_assert!(err <= TOL, "{p:?}: block error {err}");
        prop_assert!(run.reports.iter().all(|r| r.cycles >= r.roofline_cycles));
    }
}

/// An expert with no rows moves none of its weight bytes: with every row routed to expert 1 of 4,
/// the grouped GEMM reads the activations, expert 1's weight and the offsets — nothing else.
#[test]
fn experts_without_rows_read_no_weights() {
    let (e, n, k, n_out) = (4usize, 24usize, 256usize, 128usize);
    let mut rng = Rng::new(5);
    let x = tensor::<f32>(&[n, k], &rng.vec(n * k, 1.0));
    let w = tensor::<f32>(&[e, n_out, k], &rng.vec(e * n_out * k, 1.0));
    let off = indices(&[e + 1, 1], &[0, 0, n as i32, n as i32, n as i32]);
    let y = Tensor::<f32>::poisoned(&[n, n_out]);
    let cfg = Config::new().with("BM", 32).with("BN", 128).with("BK", 128);
    let report = grouped_linear::launch(&launcher(), &cfg, &x, &w, &off, &y)
        .unwrap()
        .report;
    assert!(y.to_vec().unwrap().iter().all(|v| v.is_finite()));
    let (x_bytes, w_expert) = ((n * k * 4) as u64, (n_out * k * 4) as u64);
    // One row-tile slot and one output tile per expert: 4 programs, each reading 2 offsets.
    let offsets_bytes = (e * 2 * 4) as u64;
    assert!(report.hbm_read_bytes >= x_bytes + w_expert);
    assert!(
        report.hbm_read_bytes <= x_bytes + w_expert + offsets_bytes,
        "read {} bytes, expected at most {}",
        report.hbm_read_bytes,
        x_bytes + w_expert + offsets_bytes
    );
}

/// A cost-only [`run_grouped_linear`] of `x [n, k]` through `w [e, n_out, k]` (balanced routing).
fn grouped_cost_only<T: Float>(n: usize, e: usize, n_out: usize, k: usize) -> dsl_core::Report {
    run_grouped_linear(
        &launcher().with_backend(Backend::CostOnly),
        &Tensor::<T>::shape_only(&[n, k]),
        &Tensor::<T>::shape_only(&[e, n_out, k]),
        &Tensor::<i32>::shape_only(&[e + 1, 1]),
        &Tensor::<f32>::shape_only(&[n, n_out]),
    )
    .unwrap()
}

/// Cost-only launches (shape-only tensors, no indices) run with balanced-routing fallbacks and
/// report the same cycles as functional runs of balanced routing.
#[test]
fn cost_only_matches_functional_for_balanced_routing() {
    let (t, e, k, h) = (32usize, 8usize, 2usize, 128usize);
    let cost = launcher().with_backend(Backend::CostOnly);
    let n = t * k;
    // Balanced: expert e owns rows e·N/E..(e+1)·N/E, the cost-only fallback.
    let offs: Vec<i32> = (0..=e).map(|i| (i * n / e) as i32).collect();
    let mut rng = Rng::new(9);
    let functional = {
        let x = tensor::<f32>(&[n, h], &rng.vec(n * h, 1.0));
        let w = tensor::<f32>(&[e, h, h], &rng.vec(e * h * h, 1.0));
        let y = Tensor::<f32>::poisoned(&[n, h]);
        run_grouped_linear(&launcher(), &x, &w, &indices(&[e + 1, 1], &offs), &y).unwrap()
    };
    let shape_only = grouped_cost_only::<f32>(n, e, h, h);
    assert_eq!(shape_only.cycles, functional.cycles);
    assert_eq!(shape_only.hbm_bytes, functional.hbm_bytes);
    let logits = Tensor::<f32>::shape_only(&[t, e]);
    let (idx, wts) = (
        Tensor::<i32>::shape_only(&[t, k]),
        Tensor::<f32>::shape_only(&[t, k]),
    );
    let r = run_router_sigmoid_group_topk(
        &cost,
        &logits,
        &Tensor::shape_only(&[1, e]),
        &idx,
        &wts,
        4,
        2,
        true,
        1.0,
    )
    .unwrap();
    assert!(r.cycles > 0 && r.cost_only);
    let r = run_router_softmax_topk(&cost, &logits, &idx, &wts, true).unwrap();
    assert!(r.cycles > 0 && r.cost_only);
}

#[test]
fn router_parameters_are_checked_and_named() {
    let l = launcher();
    let (t, e) = (3usize, 8usize);
    let logits = tensor::<f32>(&[t, e], &Rng::new(1).vec(t * e, 1.0));
    let bias = tensor::<f32>(&[1, e], &[0.1; 8]);
    let out = |k: usize| routing_outputs(t, k);
    let sigmoid = |k: usize, n_group: usize, topk_group: usize| {
        let (idx, w) = out(k);
        run_router_sigmoid_group_topk(&l, &logits, &bias, &idx, &w, n_group, topk_group, true, 1.0)
            .unwrap_err()
            .to_string()
    };
    for (k, ng, tg, needle) in [
        (2, 3, 1, "n_group = 3 must divide"),
        (2, 0, 1, "n_group = 0"),
        (2, 8, 1, "1 expert per group"),
        (2, 4, 5, "topk_group = 5"),
        (2, 4, 0, "topk_group = 0"),
        (5, 4, 2, "top_k = 5 exceeds the 4 experts"),
    ] {
        let err = sigmoid(k, ng, tg);
        assert!(err.contains(needle), "{err}");
    }
    let (idx, w) = out(2);
    let err = run_router_sigmoid_group_topk(
        &l,
        &logits,
        &tensor(&[1, 4], &[0.0; 4]),
        &idx,
        &w,
        2,
        1,
        true,
        1.0,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`bias`"), "{err}");
    let (idx, w) = out(9);
    let err = run_router_softmax_topk(&l, &logits, &idx, &w, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("top_k = 9"), "{err}");
    // Any expert count runs (the row is read in blocks); a top-k above the widest slot tile is
    // refused, naming the config field.
    let wide = tensor::<f32>(&[1, 600], &[0.5; 600]);
    let (idx, w) = routing_outputs(1, 2);
    run_router_softmax_topk(&l, &wide, &idx, &w, true).unwrap();
    let (idx, w) = routing_outputs(1, 70);
    let err = run_router_softmax_topk(&l, &wide, &idx, &w, true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("num_experts_per_tok = 70"), "{err}");
    // Groups must divide the experts, keep 1..=n_group of them and hold the top-k.
    let (idx, w) = routing_outputs(1, 2);
    let grouped = |n_group, topk_group| SoftmaxRouterParams {
        n_group,
        topk_group,
        norm_topk_prob: false,
        routed_scaling_factor: 16.0,
    };
    for (p, want) in [
        (grouped(7, 2), "n_group = 7"),
        (grouped(4, 0), "topk_group = 0"),
        (grouped(4, 5), "topk_group = 5"),
    ] {
        let err = run_router_softmax_group_topk(&l, &wide, &idx, &w, p)
            .unwrap_err()
            .to_string();
        assert!(err.contains(want), "{err}");
    }
    let (idx, w) = routing_outputs(1, 8);
    let narrow = tensor::<f32>(&[1, 8], &[0.5; 8]);
    let err = run_router_softmax_group_topk(&l, &narrow, &idx, &w, grouped(4, 1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("top_k = 8"), "{err}");
}

#[test]
fn plan_and_grouped_inputs_are_checked() {
    let err = RoutingPlan::from_topk(&[0, 1, 2, 7], 2, 2, 4)
        .unwrap_err()
        .to_string();
    assert!(err.contains("token 1 choice 1 is 7"), "{err}");
    let err = RoutingPlan::from_topk(&[0, 1, 2], 2, 2, 4)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`idx` has 3 entries"), "{err}");
    let l = launcher();
    let x = tensor::<f32>(&[5, 8], &[0.5; 40]);
    let w = tensor::<f32>(&[2, 4, 8], &[0.5; 64]);
    let y = Tensor::<f32>::poisoned(&[5, 4]);
    for (offs, needle) in [
        (vec![0, 2], "E + 1 = 3 entries"),
        (vec![0, 3, 4], "end at the 5 dispatched rows"),
        (vec![0, 4, 3], "never decrease"),
    ] {
        let off = indices(&[offs.len(), 1], &offs);
        let err = run_grouped_linear(&l, &x, &w, &off, &y)
            .unwrap_err()
            .to_string();
        assert!(err.contains(needle), "{offs:?}: {err}");
    }
    let off = indices(&[3, 1], &[0, 2, 5]);
    let err = run_grouped_linear(&l, &tensor::<f32>(&[5, 7], &[0.5; 35]), &w, &off, &y)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`x` must be [N, K] with K = 8"), "{err}");
    let (gate, down) = (
        tensor::<f32>(&[2, 4, 8], &[0.5; 64]),
        tensor::<f32>(&[2, 4, 8], &[0.5; 64]),
    );
    let out = Tensor::<f32>::poisoned(&[5, 8]);
    let err = run_expert_swiglu_grouped(&l, &x, &gate, &gate, &down, &off, &out)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`w_down` must be [E, H, I] = [2, 8, 4]"),
        "{err}"
    );
}

#[test]
fn registered() {
    for (op, kernel) in [
        ("moe_router_sigmoid_group_topk", "router_sigmoid_group_topk"),
        ("moe_router_softmax_topk", "router_softmax_topk"),
        ("moe_dispatch", "moe_dispatch"),
        ("moe_combine", "moe_combine"),
        ("moe_grouped_linear", "grouped_linear"),
    ] {
        let imps = kernels::registry::implementations(op);
        assert_eq!(imps.len(), 1, "{op}");
        assert_eq!(imps[0].meta.name, kernel);
    }
}

/// The routers at the released models' sizes: DeepSeek-V3 (256 experts, 8 groups, keep 4, top 8,
/// ×2.5), Kimi-K2 (384 experts, one group, top 8, ×2.827) and Qwen3-Next (512 experts, top 10).
#[test]
fn routers_at_released_model_sizes() {
    let l = launcher();
    let tokens = 7;
    for (e, n_group, topk_group, k, scale) in [(256, 8, 4, 8, 2.5f32), (384, 1, 1, 8, 2.827)] {
        let mut rng = Rng::new(e as u64);
        let logits = rng.vec(tokens * e, 4.0);
        let bias = rng.vec(e, 0.5);
        let p = SigmoidRouterParams {
            experts: e,
            top_k: k,
            n_group,
            topk_group,
            norm_topk_prob: true,
            routed_scaling_factor: scale,
        };
        let want = mref::router_sigmoid_group_topk(&logits, &bias, tokens, p).unwrap();
        assert!(
            want.margin > MIN_MARGIN,
            "pick another seed: {}",
            want.margin
        );
        let (idx, w) = routing_outputs(tokens, k);
        let (lt, bt) = (tensor(&[tokens, e], &logits), tensor(&[1, e], &bias));
        run_router_sigmoid_group_topk(&l, &lt, &bt, &idx, &w, n_group, topk_group, true, scale)
            .unwrap();
        assert_eq!(check_routing(&idx, &w, &want), Ok(()), "{p:?}");
    }
    let (e, k) = (512, 10);
    let logits = Rng::new(512).vec(tokens * e, 4.0);
    let want = mref::router_softmax_topk(&logits, tokens, e, k, true).unwrap();
    assert!(
        want.margin > MIN_MARGIN,
        "pick another seed: {}",
        want.margin
    );
    let (idx, w) = routing_outputs(tokens, k);
    run_router_softmax_topk(&l, &tensor(&[tokens, e], &logits), &idx, &w, true).unwrap();
    assert_eq!(check_routing(&idx, &w, &want), Ok(()));
}

/// DeepSeek-V3 decode (16 tokens × top 8 = 128 dispatched rows over 256 experts, bf16 gate
/// projection 2048×7168), cost-only with the balanced fallback: 128 experts own one row, 128 own
/// none, so exactly half the experts' weights are read.
#[test]
fn grouped_gemm_reads_only_routed_experts_at_deepseek_decode_size() {
    let (t, k, e, h, i) = (16usize, 8usize, 256usize, 7168usize, 2048usize);
    let n = t * k;
    let r = grouped_cost_only::<bf16>(n, e, i, h);
    let (x_bytes, w_expert) = ((n * h * 2) as u64, (i * h * 2) as u64);
    let routed = (e / 2) as u64;
    // Offsets: every program reads two 4-byte entries (at most; repeats may hit L2).
    let programs = (n.div_ceil(e).div_ceil(16) * i.div_ceil(128) * e) as u64;
    let weights_read = r.hbm_read_bytes - x_bytes.min(r.hbm_read_bytes);
    assert!(weights_read >= routed * w_expert, "{}", r.hbm_read_bytes);
    assert!(
        r.hbm_read_bytes <= x_bytes + routed * w_expert + programs * 8,
        "{}",
        r.hbm_read_bytes
    );
    // Not asserted: cycles ≥ roofline. Here half the programs of every wave are empty, and the
    // scheduler shares HBM bandwidth within a wave only, so overlapping waves exceed the peak
    // (accel-sim limitation, reported; see the printed achieved bandwidth).
    eprintln!(
        "grouped_linear DeepSeek-V3 decode gate proj: {} cycles, {:.1} us, HBM read {} B, \
         roofline {} cycles, achieved {:.0} of {:.0} GB/s",
        r.cycles,
        r.time_us,
        r.hbm_read_bytes,
        r.roofline_cycles,
        r.achieved_hbm_gbps,
        r.peak_hbm_gbps
    );
}
