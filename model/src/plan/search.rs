//! The auto-planner: enumerates the parallel plans a card count allows, drops those the model
//! cannot split or the cards cannot hold, estimates the rest with the card roles' cost-only
//! forwards, and picks — separately for prefill and decode, deployed disaggregated as DeepSeek
//! does — the plan with the highest throughput that fits memory and meets the TPOT target.

use super::estimate::{EstimateError, Estimator, Phase, StepEstimate};
use super::memory::{plan_memory, MemoryOptions, MemoryPlan};
use super::parallel::{Plan, PlanError};

/// What the deployment must serve.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Prompt tokens per request.
    pub prompt_len: usize,
    /// Generated tokens per request.
    pub output_len: usize,
    /// Concurrent decoding sequences over the whole decode deployment; `None` lets the planner
    /// pick the largest batch that fits memory and meets the TPOT target.
    pub batch: Option<usize>,
    /// Context a decode step attends to; `None` means the mean over a request's decode
    /// (`prompt_len + output_len / 2`).
    pub context: Option<usize>,
    /// The slowest acceptable decode step (seconds); `None` means no target.
    pub tpot_target_s: Option<f64>,
    /// The longest acceptable time to first token (seconds); `None` means no target.
    pub ttft_target_s: Option<f64>,
}

impl Workload {
    /// The decode context.
    pub fn decode_context(&self) -> usize {
        self.context
            .unwrap_or(self.prompt_len + self.output_len / 2)
            .max(1)
    }
}

/// A plan the search evaluated, with its estimate and memory plan.
#[derive(Debug, Clone)]
pub struct Candidate {
    /// The estimate.
    pub estimate: StepEstimate,
    /// The memory plan of its most loaded card.
    pub memory: MemoryPlan,
}

/// The outcome of planning one phase.
#[derive(Debug, Clone)]
pub struct PhaseChoice {
    /// The winner.
    pub best: Candidate,
    /// The other feasible plans, best first.
    pub alternatives: Vec<Candidate>,
    /// Plans dropped before estimating, with the reason.
    pub rejected: Vec<(Plan, String)>,
    /// One line on why the winner wins.
    pub why: String,
}

/// Every plan of `cards` cards worth trying: tp within a node, pp over the layers, dp filling the
/// rest, ep the largest degree that divides the stage's cards and is at most the expert count.
pub fn candidate_plans(est: &Estimator, cards: usize) -> Vec<Plan> {
    let cfg = est.config();
    let per_node = est.cluster().cards_per_node;
    let experts = cfg.moe.as_ref().map(|m| m.experts).unwrap_or(1);
    let mut plans = Vec::new();
    for tp in (0..=6)
        .map(|i| 1usize << i)
        .filter(|t| *t <= per_node && cards.is_multiple_of(*t))
    {
        for pp in (0..=5)
            .map(|i| 1usize << i)
            .filter(|p| (cards / tp).is_multiple_of(*p) && *p <= cfg.num_layers())
        {
            let dp = cards / (tp * pp);
            let stage = tp * dp;
            let ep = (1..=stage.min(experts))
                .rev()
                .find(|e| stage.is_multiple_of(*e))
                .unwrap_or(1);
            plans.push(Plan { tp, dp, pp, ep });
        }
    }
    plans
}

/// Plans the search simulates in full after the closed-form screen ([`screen`]), by default.
pub const FINALISTS: usize = 1;

/// A closed-form roofline of one phase under `plan` on the most loaded card: the step time from
/// the bytes it must read (weights, the experts its routed rows touch, the KV cache) and the FLOP
/// it must do (two per parameter per token), whichever binds, plus the tensor-parallel
/// all-reduces and the pipeline's rounds. It ranks plans so that only the finalists pay for a
/// simulated forward; every figure the report prints comes from the simulation.
pub fn screen(
    est: &Estimator,
    plan: &Plan,
    phase: Phase,
    batch: usize,
    context: usize,
    memory: &MemoryPlan,
) -> Screened {
    let cfg = est.config();
    let dev = est.device();
    let p = super::params::count(cfg);
    let clock = dev.clock_ghz * 1e9;
    let per_core = dev
        .matrix
        .flop_per_cycle
        .get("bf16")
        .copied()
        .unwrap_or(1.0);
    let peak = per_core * dev.cores as f64 * clock;
    let bw = dev.hbm.bandwidth_gbps * 1e9;
    let tp = plan.tp as f64;
    let tokens = match phase {
        Phase::Prefill => context as f64,
        Phase::Decode => batch as f64,
    };
    let stage_layers =
        plan.stage_layers(cfg.num_layers(), 0).len() as f64 / cfg.num_layers() as f64;
    // Parameters one token of this card touches outside the routed experts, and the routed rows
    // the card computes (`tokens·k/tp`, see `estimate`).
    let dense: f64 = p
        .layers
        .iter()
        .map(|l| (l.attention + l.dense_mlp + l.shared_experts) as f64 / tp + l.indexer as f64)
        .sum::<f64>()
        * stage_layers;
    let routed_rows = tokens
        * p.layers
            .iter()
            .map(|l| l.experts_per_token)
            .max()
            .unwrap_or(0) as f64
        / tp;
    let moe_layers = p.layers.iter().filter(|l| l.experts > 0).count() as f64 * stage_layers;
    let per_expert = p.layers.iter().map(|l| l.per_expert).max().unwrap_or(0) as f64;
    let flop = 2.0 * tokens * dense + 2.0 * routed_rows * per_expert * moe_layers;
    let local_experts = cfg
        .moe
        .as_ref()
        .map(|m| m.experts.div_ceil(plan.ep))
        .unwrap_or(0) as f64;
    let touched = if local_experts > 0.0 {
        local_experts * (1.0 - (1.0 - 1.0 / local_experts).powf(routed_rows))
    } else {
        0.0
    };
    let expert_bytes = if local_experts > 0.0 {
        memory.weights.experts * touched / local_experts
    } else {
        0.0
    };
    let cache = match phase {
        Phase::Prefill => 0.0,
        Phase::Decode => {
            tokens * (context as f64 * memory.kv_per_token + memory.state_per_sequence)
        }
    };
    let bytes = memory.weights.dense + memory.weights.other + expert_bytes + cache;
    let compute = (flop / peak).max(bytes / bw);
    let tp_comm = if plan.tp > 1 {
        let g = super::estimate::group_of(est.cluster(), plan.tp);
        accel_sim::collective::all_reduce(
            est.cluster(),
            &g,
            tokens / plan.pp as f64 * cfg.hidden_size as f64 * 2.0,
            accel_sim::collective::Algorithm::Auto,
        )
        .map(|c| c.seconds)
        .unwrap_or(f64::INFINITY)
            * 2.0
            * cfg.num_layers() as f64
            * stage_layers
    } else {
        0.0
    };
    // A prompt crosses every stage; a decode step runs its pp micro-batches through each.
    let step = (compute + tp_comm) * plan.pp as f64;
    let units = match phase {
        Phase::Prefill => (plan.dp * plan.pp * context) as f64,
        Phase::Decode => (plan.dp * batch) as f64,
    };
    Screened {
        tokens_per_s: units / step,
        step_s: step,
    }
}

/// A plan's closed-form throughput and step time ([`screen`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Screened {
    /// Tokens per second over the deployment.
    pub tokens_per_s: f64,
    /// TTFT (prefill) or TPOT (decode), seconds.
    pub step_s: f64,
}

/// Plans one phase on `cards` cards. `fixed` skips the search and estimates that plan only.
pub fn plan_phase(
    est: &Estimator,
    phase: Phase,
    cards: usize,
    workload: &Workload,
    mem: &MemoryOptions,
    fixed: Option<Plan>,
    finalists: usize,
) -> Result<PhaseChoice, EstimateError> {
    let capacity = est.device().hbm.capacity_bytes as f64;
    let plans = match fixed {
        Some(p) => vec![p],
        None => candidate_plans(est, cards),
    };
    let mut rejected = Vec::new();
    let mut feasible = Vec::new();
    let mut last_err: Option<EstimateError> = None;
    // Screen: every plan that splits the model and fits memory gets a closed-form throughput.
    // Pipeline stages add latency to every token, so plans with pp > 1 are tried only when no
    // plan without them fits.
    let mut screened: Vec<(Screened, Plan, usize, MemoryPlan)> = Vec::new();
    let mut deferred: Vec<Plan> = Vec::new();
    let mut queue: Vec<Plan> = plans;
    for round in 0..2 {
        for plan in std::mem::take(&mut queue) {
            if round == 0 && plan.pp > 1 && fixed.is_none() {
                deferred.push(plan);
                continue;
            }
            if let Err(e) = plan.validate(est.config(), "--plan") {
                if fixed.is_some() {
                    return Err(e.into());
                }
                rejected.push((plan, e.message));
                continue;
            }
            match fit(est, phase, &plan, workload, mem, capacity) {
                Ok((batch, memory)) => {
                    let ctx = match phase {
                        Phase::Prefill => workload.prompt_len,
                        Phase::Decode => workload.decode_context(),
                    };
                    let sc = screen(est, &plan, phase, batch, ctx, &memory);
                    screened.push((sc, plan, batch, memory));
                }
                Err(e) if fixed.is_none() => {
                    rejected.push((plan, e.message.clone()));
                    last_err = Some(EstimateError::Plan(e));
                }
                Err(e) => {
                    return Err(EstimateError::Plan(what_fits(
                        est, phase, cards, workload, mem, capacity, e,
                    )))
                }
            }
        }
        if !screened.is_empty() {
            for plan in &deferred {
                rejected.push((
                    *plan,
                    "pipeline parallelism not needed: a plan without it fits".into(),
                ));
            }
            break;
        }
        queue = std::mem::take(&mut deferred);
    }
    let best_screened = screened
        .iter()
        .map(|s| s.0.tokens_per_s)
        .fold(0.0, f64::max);
    match phase {
        // Decode: the highest throughput.
        Phase::Decode => screened.sort_by(|a, b| {
            b.0.tokens_per_s
                .total_cmp(&a.0.tokens_per_s)
                .then(a.1.cmp(&b.1))
        }),
        // Prefill with a TTFT target: the highest throughput among the plans that meet it (by
        // the screen), then the others by TTFT.
        Phase::Prefill if workload.ttft_target_s.is_some() => {
            let target = workload.ttft_target_s.unwrap_or(f64::INFINITY);
            screened.sort_by(|a, b| {
                let meets = |s: &Screened| s.step_s <= target;
                meets(&b.0)
                    .cmp(&meets(&a.0))
                    .then(if meets(&a.0) {
                        b.0.tokens_per_s.total_cmp(&a.0.tokens_per_s)
                    } else {
                        a.0.step_s.total_cmp(&b.0.step_s)
                    })
                    .then(a.1.cmp(&b.1))
            })
        }
        // Prefill without one: the lowest TTFT among plans within 15% of the best throughput (a
        // user waits for the first token; splitting a prompt over tensor-parallel cards costs a
        // little throughput in all-reduces and saves most of the wait).
        Phase::Prefill => screened.sort_by(|a, b| {
            let near = |s: &Screened| s.tokens_per_s >= 0.85 * best_screened;
            near(&b.0)
                .cmp(&near(&a.0))
                .then(a.0.step_s.total_cmp(&b.0.step_s))
                .then(a.1.cmp(&b.1))
        }),
    }
    let target = match phase {
        Phase::Prefill => workload.ttft_target_s,
        Phase::Decode => workload.tpot_target_s,
    };
    // With a target, the screen only ranks: if the simulated finalists miss it, the plan the
    // screen deems fastest per step is simulated too (the closed form leaves out attention FLOP
    // and kernel efficiency, so its absolute times are optimistic).
    let fastest = screened
        .iter()
        .enumerate()
        .min_by(|a, b| a.1 .0.step_s.total_cmp(&b.1 .0.step_s))
        .map(|(i, _)| i);
    let mut extra: Option<(Plan, usize, MemoryPlan)> = None;
    let screened_out = screened.len().saturating_sub(finalists.max(1));
    for (i, (sc, plan, batch, memory)) in screened.into_iter().enumerate() {
        if i >= finalists.max(1) && target.is_some() && Some(i) == fastest {
            extra = Some((plan, batch, memory));
            continue;
        }
        if i >= finalists.max(1) {
            rejected.push((
                plan,
                format!(
                    "screened out: the closed-form roofline ranks it below the finalists ({:.0} tokens/s, step {:.1} ms)",
                    sc.tokens_per_s,
                    sc.step_s * 1e3
                ),
            ));
            continue;
        }
        match evaluate(est, phase, &plan, workload, mem, capacity, batch, memory) {
            Ok(c) => feasible.push(c),
            // A searched plan that cannot be costed drops out with its reason; a given one fails.
            Err(e) if fixed.is_none() => {
                rejected.push((plan, e.to_string()));
                last_err = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    let missed = |c: &Candidate| target.is_some_and(|t| c.estimate.step_s > t);
    if let Some((plan, batch, memory)) = extra {
        if feasible.iter().all(missed) {
            match evaluate(est, phase, &plan, workload, mem, capacity, batch, memory) {
                Ok(c) => feasible.push(c),
                Err(e) => rejected.push((plan, e.to_string())),
            }
        } else {
            rejected.push((
                plan,
                "screened out: a finalist already meets the target".into(),
            ));
        }
    }
    if feasible.is_empty() {
        // When no plan fit memory, say which deployment would (other errors pass unchanged).
        last_err = match last_err.take() {
            Some(EstimateError::Plan(e)) => Some(EstimateError::Plan(what_fits(
                est, phase, cards, workload, mem, capacity, e,
            ))),
            other => other,
        };
        return Err(last_err.unwrap_or_else(|| {
            EstimateError::Plan(PlanError {
                flag: "--cards".into(),
                message: format!("no plan of {cards} cards splits this model evenly"),
            })
        }));
    }
    // Plans that meet the target first, by throughput; then the others, fastest step first.
    feasible.sort_by(|a, b| {
        missed(a).cmp(&missed(b)).then(if missed(a) {
            a.estimate.step_s.total_cmp(&b.estimate.step_s)
        } else {
            b.estimate
                .tokens_per_s
                .total_cmp(&a.estimate.tokens_per_s)
                .then(a.estimate.step_s.total_cmp(&b.estimate.step_s))
        })
    });
    let best = feasible.remove(0);
    let why = match (target, feasible.first()) {
        (Some(t), Some(r)) if !missed(&best) && missed(r) => format!(
            "{} meets the {:.1} ms target ({:.1} ms) where the runner-up {} takes {:.1} ms, at {:.0} tokens/s",
            best.estimate.plan,
            t * 1e3,
            best.estimate.step_s * 1e3,
            r.estimate.plan,
            r.estimate.step_s * 1e3,
            best.estimate.tokens_per_s
        ),
        _ => explain(&best, feasible.first(), phase, screened_out),
    };
    Ok(PhaseChoice {
        best,
        alternatives: feasible,
        rejected,
        why,
    })
}

/// A memory-plan error `e` on `cards` cards, completed with a deployment that fits: another plan
/// of the same cards, else the fewest cards (whole nodes up to twice `cards`, then doublings up
/// to 64 times) on which some plan fits, by the same closed-form memory plan. The lower bound
/// `e` gives (the weights over one card's room) ignores what every card replicates.
fn what_fits(
    est: &Estimator,
    phase: Phase,
    cards: usize,
    w: &Workload,
    mem: &MemoryOptions,
    capacity: f64,
    e: PlanError,
) -> PlanError {
    if e.flag != "memory plan" {
        return e;
    }
    let fits = |n: usize| {
        candidate_plans(est, n).into_iter().find(|p| {
            p.validate(est.config(), "--cards").is_ok()
                && fit(est, phase, p, w, mem, capacity).is_ok()
        })
    };
    let node = est.cluster().cards_per_node.max(1);
    let more = (cards / node + 1..=2 * cards.max(1) / node)
        .map(|k| k * node)
        .chain((2..=6).map(|k| cards.max(1) << k));
    let hint = match fits(cards) {
        Some(p) => format!("; on these {cards} cards {p} fits"),
        None => match more.into_iter().find_map(|n| fits(n).map(|p| (n, p))) {
            Some((n, p)) => format!("; the fewest cards that fit: {n} ({p})"),
            None => format!("; no plan fits on up to {} cards", cards.max(1) << 6),
        },
    };
    PlanError {
        flag: e.flag,
        message: format!("{}{hint}", e.message),
    }
}

/// The batch per replica a plan runs and its memory plan, or the error saying what does not fit.
fn fit(
    est: &Estimator,
    phase: Phase,
    plan: &Plan,
    w: &Workload,
    mem: &MemoryOptions,
    capacity: f64,
) -> Result<(usize, MemoryPlan), PlanError> {
    let total_weights = plan_memory(
        est.config(),
        &Plan {
            tp: 1,
            dp: 1,
            pp: 1,
            ep: 1,
        },
        capacity,
        1,
        1,
        mem,
    )
    .weights
    .total();
    match phase {
        Phase::Prefill => {
            let memory = plan_memory(
                est.config(),
                plan,
                capacity,
                w.prompt_len,
                w.prompt_len,
                mem,
            );
            memory.check(1, w.prompt_len, plan, total_weights)?;
            Ok((1, memory))
        }
        Phase::Decode => {
            let ctx = w.decode_context();
            let batch = match w.batch {
                Some(b) => b.div_ceil(plan.dp),
                None => {
                    let probe = plan_memory(est.config(), plan, capacity, 256, ctx, mem);
                    let fit = probe.max_batch(ctx).min(256) as usize;
                    if fit == 0 {
                        probe.check(1, ctx, plan, total_weights)?;
                    }
                    // The largest multiple of 8 that fits (a serving engine's batch sizes, as
                    // vLLM captures its CUDA graphs at), or what fits below 8.
                    round_batch(fit.max(1))
                }
            };
            let memory = plan_memory(est.config(), plan, capacity, batch, ctx, mem);
            memory.check(batch as u64, ctx, plan, total_weights)?;
            Ok((batch, memory))
        }
    }
}

/// Most bisection steps between a decode batch that meets the TPOT target and twice it, which does
/// not: enough to narrow 256 sequences to [`round_batch`]'s step of 8.
const BISECTIONS: usize = 6;

/// A decode batch size: a multiple of 8 from 8 up (a serving engine's captured batch sizes), any
/// size below.
fn round_batch(b: usize) -> usize {
    if b >= 8 {
        b / 8 * 8
    } else {
        b
    }
}

/// Simulates one plan for one phase at `batch` sequences per replica (decode), halving the batch
/// until the TPOT target holds when the workload leaves the batch open, then bisecting up to the
/// largest of [`round_batch`]'s sizes that still meets it. `memory` is the plan's
/// memory at `batch` ([`fit`]); a smaller batch gets its own.
#[allow(clippy::too_many_arguments)]
fn evaluate(
    est: &Estimator,
    phase: Phase,
    plan: &Plan,
    w: &Workload,
    mem: &MemoryOptions,
    capacity: f64,
    batch: usize,
    memory: MemoryPlan,
) -> Result<Candidate, EstimateError> {
    match phase {
        Phase::Prefill => {
            let estimate = est.estimate(plan, phase, 1, w.prompt_len)?;
            Ok(Candidate { estimate, memory })
        }
        Phase::Decode => {
            let ctx = w.decode_context();
            let meets = |e: &StepEstimate| w.tpot_target_s.is_none_or(|t| e.step_s <= t);
            let (mut b, mut missed) = (batch, None);
            let mut estimate = est.estimate(plan, phase, b, ctx)?;
            // Halve until the target holds, then bisect between the batch that meets it and the
            // one that missed, on the batch sizes of `round_batch`.
            while !meets(&estimate) && b > 1 && w.batch.is_none() {
                missed = Some(b);
                b = round_batch(b / 2);
                estimate = est.estimate(plan, phase, b, ctx)?;
            }
            if let Some(mut hi) = missed.filter(|_| meets(&estimate)) {
                for _ in 0..BISECTIONS {
                    let mid = round_batch((b + hi) / 2);
                    if mid <= b || mid >= hi {
                        break;
                    }
                    let e = est.estimate(plan, phase, mid, ctx)?;
                    if meets(&e) {
                        (b, estimate) = (mid, e);
                    } else {
                        hi = mid;
                    }
                }
            }
            let memory = if b == batch {
                memory
            } else {
                plan_memory(est.config(), plan, capacity, b, ctx, mem)
            };
            Ok(Candidate { estimate, memory })
        }
    }
}

fn explain(
    best: &Candidate,
    runner_up: Option<&Candidate>,
    phase: Phase,
    screened_out: usize,
) -> String {
    let e = &best.estimate;
    let b = &e.breakdown;
    let parts = [
        ("attention", b.attention_s),
        ("dense FFN", b.dense_ffn_s),
        ("routed experts", b.experts_s),
        ("lm_head/embedding", b.head_s),
        ("tp all-reduce", b.tp_comm_s),
    ];
    let (what, t) = parts
        .iter()
        .cloned()
        .fold(("", 0.0), |a, p| if p.1 > a.1 { p } else { a });
    let unit = match phase {
        Phase::Prefill => "prompt tokens/s",
        Phase::Decode => "tokens/s",
    };
    match runner_up {
        Some(r) => format!(
            "{} gives {:.0} {unit} against {:.0} for the runner-up {} ({:+.0}%); its step is {:.0}% {what} ({:.2} ms), HBM {:.0}% busy, {:.0}% of the step in exposed communication",
            e.plan,
            e.tokens_per_s,
            r.estimate.tokens_per_s,
            r.estimate.plan,
            (e.tokens_per_s / r.estimate.tokens_per_s - 1.0) * 100.0,
            t / e.step_s * 100.0,
            t * 1e3,
            e.hbm_utilization * 100.0,
            e.comm_exposed_share * 100.0
        ),
        None if screened_out > 0 => format!(
            "{} leads the closed-form screen of {} plans that fit ({}); simulated, {:.0}% of its step is {what} ({:.2} ms), HBM {:.0}% busy",
            e.plan,
            screened_out + 1,
            match phase {
                Phase::Prefill => "the prefill rule: highest throughput meeting --ttft-ms, or without a target the lowest TTFT within 15% of the best throughput",
                Phase::Decode => "highest throughput",
            },
            t / e.step_s * 100.0,
            t * 1e3,
            e.hbm_utilization * 100.0
        ),
        None => format!(
            "{} is the only plan that splits the model and fits memory; {:.0}% of its step is {what}",
            e.plan,
            t / e.step_s * 100.0
        ),
    }
}
