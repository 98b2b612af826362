//! Step times of a parallel plan: each card role runs the cost-only forward at its own shard of
//! the model and its own token counts, and the collectives between them are costed on the
//! cluster's links.
//!
//! One step of one pipeline stage, per micro-batch of `mb` tokens on each attention replica:
//! - **attention and dense parts** run at `mb` tokens on the tp shard: projections, norms, router,
//!   shared experts and dense MLPs once on all rows; MLA attention (dense, and DSA's indexer,
//!   top-k and sparse attention), GQA attention and the Gated DeltaNet and KDA recurrences and
//!   their short convolutions over the whole decode batch in one launch
//!   (`Runner::batch_decode`); per-sequence operators without a batched form (a convolution of
//!   more than 17 taps) once per sequence, priced from a one-token run at the same context;
//! - **routed experts** run on the rows expert parallelism sends to the card: `mb·k/tp` rows per
//!   card whatever `ep` is (the stage's `dp·mb` tokens, `k` experts each, over its `tp·dp` cards),
//!   times the hottest rank's share under the routing model — the slowest EP rank sets the step;
//! - **collectives**: an all-reduce over tp after attention and after the dense part, the
//!   dispatch (FP8) and combine (bf16) all-to-alls over ep, overlapped with compute by two
//!   micro-batches as DeepSeek-V3 does, and a send/recv between pipeline stages. The prefill's
//!   all-to-alls send a token over the network once per node holding any of its experts and
//!   forward it inside the node (DeepEP's normal kernels,
//!   [`collective::all_to_all_via_nodes`]); the decode's send one row per (token, expert) pair
//!   straight to its rank (DeepEP's low-latency kernels). Node-limited routing (`topk_group` of
//!   `n_group` expert groups per token, DeepSeek-V3) caps the nodes a prefill token crosses to:
//!   the groups are packed onto the nodes evenly, as DeepSeek's load balancer places them for
//!   prefill ([`node_limited_nodes`]); the per-rank loads keep the routing model's shares.
//!
//! The forward runs are cached by (shard, tokens, position, blocks): plans that share a shard
//! share its runs, so a plan search simulates each distinct launch shape once.

use super::parallel::{Plan, PlanError};
use crate::config::{ModelConfig, MoeDims};
use crate::forward::{Blocks, CacheFormat, ForwardError, LayerCost, OpStats, Precision, Runner};
use accel_sim::cluster::ClusterPreset;
use accel_sim::collective::{self, Algorithm, Group};
use accel_sim::{DevicePreset, SimError};
use dsl_core::Launcher;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Why a plan could not be estimated.
#[derive(Debug)]
pub enum EstimateError {
    /// The plan or workload does not fit the model or cluster.
    Plan(PlanError),
    /// A card role's cost-only forward failed.
    Forward(ForwardError),
    /// A collective could not be costed (a group that does not fit the cluster).
    Comm(SimError),
}

impl fmt::Display for EstimateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EstimateError::Plan(e) => write!(f, "{e}"),
            EstimateError::Forward(e) => write!(f, "cost-only forward of a card role: {e}"),
            EstimateError::Comm(e) => write!(f, "collective: {e}"),
        }
    }
}

impl std::error::Error for EstimateError {}

impl From<PlanError> for EstimateError {
    fn from(e: PlanError) -> Self {
        EstimateError::Plan(e)
    }
}
impl From<ForwardError> for EstimateError {
    fn from(e: ForwardError) -> Self {
        EstimateError::Forward(e)
    }
}
impl From<SimError> for EstimateError {
    fn from(e: SimError) -> Self {
        EstimateError::Comm(e)
    }
}

/// How tokens pick experts in a cost-only run (a shape-only run has no router scores).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Routing {
    /// Every expert receives the same number of rows.
    Uniform,
    /// Expert `e` (in popularity order) receives a share ∝ `1/(e+1)^s`; experts are placed on
    /// ranks round-robin, so rank loads differ and the hottest rank sets the step time.
    Zipf(f64),
}

impl Routing {
    /// Parses `uniform` or `zipf:S`.
    pub fn parse(s: &str) -> Result<Routing, PlanError> {
        let bad = || PlanError {
            flag: "--routing".into(),
            message: format!("`{s}` is not `uniform` or `zipf:S` (S ≥ 0, e.g. zipf:1.0)"),
        };
        match s.split_once(':') {
            None if s == "uniform" => Ok(Routing::Uniform),
            Some(("zipf", v)) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map(Routing::Zipf)
                .ok_or_else(bad),
            _ => Err(bad()),
        }
    }

    /// Each EP rank's share of the routed rows (sums to 1).
    pub fn rank_shares(&self, experts: usize, ep: usize) -> Vec<f64> {
        let mut shares = vec![0.0; ep];
        let weight = |e: usize| match self {
            Routing::Uniform => 1.0,
            Routing::Zipf(s) => 1.0 / ((e + 1) as f64).powf(*s),
        };
        let total: f64 = (0..experts).map(weight).sum();
        for e in 0..experts {
            shares[e % ep] += weight(e) / total;
        }
        shares
    }
}

/// Which phase a step belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The prompt, up to the first token.
    Prefill,
    /// One generated token per sequence.
    Decode,
}

/// Where a step's time goes, per card (seconds, summed over the slowest stage's layers and the
/// pipeline).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Breakdown {
    /// Attention blocks (projections and attention over the context).
    pub attention_s: f64,
    /// Dense MLPs, shared experts, routers, norms and residuals.
    pub dense_ffn_s: f64,
    /// Routed experts on the hottest EP rank.
    pub experts_s: f64,
    /// Embedding and `lm_head`.
    pub head_s: f64,
    /// Tensor-parallel all-reduces (not overlapped).
    pub tp_comm_s: f64,
    /// Expert-parallel dispatch and combine, before overlap.
    pub ep_comm_s: f64,
    /// Pipeline send/recv.
    pub pp_comm_s: f64,
}

/// The estimate of one phase under one plan.
#[derive(Debug, Clone, PartialEq)]
pub struct StepEstimate {
    /// The plan.
    pub plan: Plan,
    /// Prefill or decode.
    pub phase: Phase,
    /// Sequences each attention replica serves at once (decode), or 1 (prefill).
    pub batch_per_replica: usize,
    /// Prompt length (prefill) or context (decode).
    pub context: usize,
    /// TTFT (prefill) or TPOT (decode), seconds.
    pub step_s: f64,
    /// Tokens per second over the whole deployment (prompt tokens for prefill).
    pub tokens_per_s: f64,
    /// `tokens_per_s` per card.
    pub tokens_per_s_per_card: f64,
    /// Model FLOP utilisation of a card: useful FLOP over the step time at the card's peak
    /// matrix rate for the format its projections run in (FP8 for a block-FP8 checkpoint at
    /// native precision, else bf16; f32 on the reference path).
    pub mfu: f64,
    /// HBM bytes one card moves per step over the step time at the card's peak bandwidth.
    pub hbm_utilization: f64,
    /// HBM bytes one card moves per step.
    pub hbm_bytes_per_card: f64,
    /// Share of the step spent in communication that compute did not hide.
    pub comm_exposed_share: f64,
    /// Where the time goes.
    pub breakdown: Breakdown,
    /// The card's operators per step, by layer kind (`"<attention>+<ffn>"` as
    /// [`crate::config::LayerSpec::kind`], and `head` for the embedding, final norm and
    /// `lm_head`), then by operator name: the same work as [`StepEstimate::breakdown`]'s compute
    /// terms (a prefill's over every stage, a decode step's on the slowest stage for every
    /// micro-batch it runs). Communication is not an operator here.
    pub ops: OpTable,
}

/// One operator's launches and simulated cycles in a step on one card. Launches can be
/// fractional: a pipeline splits the embedding and `lm_head` between its first and last stage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpCost {
    /// Kernel launches.
    pub launches: f64,
    /// Simulated cycles.
    pub cycles: f64,
}

impl OpCost {
    /// Adds `o`'s launches and cycles to this one.
    pub fn add(&mut self, o: &OpCost) {
        self.launches += o.launches;
        self.cycles += o.cycles;
    }
}

/// A step's operators: layer kind → operator name → cost.
pub type OpTable = BTreeMap<String, BTreeMap<String, OpCost>>;

/// Each operator's cost summed over every layer kind of `table`.
pub fn ops_over_kinds(table: &OpTable) -> BTreeMap<String, OpCost> {
    let mut all: BTreeMap<String, OpCost> = BTreeMap::new();
    for (op, c) in table.values().flatten() {
        all.entry(op.clone()).or_default().add(c);
    }
    all
}

/// Adds `ops` under `kind` into `table`.
fn add_ops(table: &mut OpTable, kind: &str, ops: &BTreeMap<String, OpCost>) {
    let t = table.entry(kind.to_string()).or_default();
    for (op, c) in ops {
        t.entry(op.clone()).or_default().add(c);
    }
}

/// The cost of one cached cost-only forward: per-layer costs and the whole step.
#[derive(Debug)]
struct RunCost {
    layers: Vec<LayerCost>,
    total: OpStats,
}

impl RunCost {
    /// The operators outside the decoder layers (embedding, final norm, `lm_head`).
    fn head(&self) -> OpStats {
        let mut layers = OpStats::default();
        for l in &self.layers {
            layers.add(&l.attention);
            layers.add(&l.ffn);
        }
        self.total.since(&layers)
    }
}

/// Cycles and traffic of a part of a step.
#[derive(Debug, Clone, Copy, Default)]
struct Work {
    cycles: f64,
    hbm_bytes: f64,
    flop: f64,
}

impl Work {
    /// The work of `s`'s operators that `keep` selects, `times` over; each one's launches and
    /// cycles are also booked into `ops`.
    fn of(
        s: &OpStats,
        keep: impl Fn(&str) -> bool,
        times: f64,
        ops: &mut BTreeMap<String, OpCost>,
    ) -> Work {
        let mut w = Work::default();
        for (op, (n, c)) in &s.per_op {
            if keep(op) {
                let t = s.traffic.get(op).copied().unwrap_or_default();
                w.cycles += *c as f64 * times;
                w.hbm_bytes += t.hbm_bytes as f64 * times;
                w.flop += t.flop as f64 * times;
                let e = ops.entry(op.clone()).or_default();
                e.launches += *n as f64 * times;
                e.cycles += *c as f64 * times;
            }
        }
        w
    }

    fn add(&mut self, o: Work) {
        self.cycles += o.cycles;
        self.hbm_bytes += o.hbm_bytes;
        self.flop += o.flop;
    }
}

/// The communicator of `size` consecutive cards: as many per node as evenly divides both the
/// group and a node (12 ranks on 8-card nodes sit 4 per node on 3 nodes), so every card count a
/// plan allows has a group the collectives can cost.
pub fn group_of(cluster: &ClusterPreset, size: usize) -> Group {
    let per_node = (1..=cluster.cards_per_node.min(size).max(1))
        .rev()
        .find(|p| size.is_multiple_of(*p))
        .unwrap_or(1);
    Group { size, per_node }
}

/// Probability that a token's `k` distinct routed experts include at least one of a set that
/// holds a share `sigma` of the routing weight among `experts` experts: the picks are made
/// without replacement, `P(miss) = Π_{i<k} (1 − σ·E/(E − i))`, which is exact for uniform
/// routing (a set of `e` experts, σ = e/E: `C(E − e, k) / C(E, k)`).
pub fn hit_probability(sigma: f64, k: usize, experts: usize) -> f64 {
    // A set with no weight is never picked (a NaN share counts as none); once `k` reaches the
    // expert count every expert is picked.
    if sigma.is_nan() || sigma <= 0.0 {
        return 0.0;
    }
    if k >= experts {
        return 1.0;
    }
    let e = experts as f64;
    let miss: f64 = (0..k)
        .map(|i| (1.0 - sigma * e / (e - i as f64)).max(0.0))
        .product();
    1.0 - miss
}

/// An EP all-to-all's volumes when every (token, expert) pair is its own row, as DeepEP's
/// low-latency (decode) kernels send them over RDMA: `row` bytes per token, `k · share[dst]`
/// rows to each other rank.
fn per_expert_volumes(shares: &[f64], moe: &MoeDims, row: f64) -> Vec<Vec<f64>> {
    let k = moe.experts_per_token as f64;
    (0..shares.len())
        .map(|src| {
            (0..shares.len())
                .map(|dst| {
                    if src == dst {
                        0.0
                    } else {
                        row * k * shares[dst]
                    }
                })
                .collect()
        })
        .collect()
}

/// An EP all-to-all's volumes when each token crosses the network once per node and the
/// intra-node links once per rank holding any of its experts, as DeepEP's normal (prefill)
/// kernels send them: `(to_rank, to_node)` for [`collective::all_to_all_via_nodes`]. A rank or
/// node is reached with [`hit_probability`] of its share of the routing weight.
pub fn node_forwarded_volumes(
    shares: &[f64],
    group: &Group,
    moe: &MoeDims,
    row: f64,
) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let (k, e) = (moe.experts_per_token, moe.experts);
    let p = group.per_node.max(1);
    let rank_hit: Vec<f64> = shares.iter().map(|s| hit_probability(*s, k, e)).collect();
    let mut node_hit: Vec<f64> = shares
        .chunks(p)
        .map(|node| hit_probability(node.iter().sum(), k, e))
        .collect();
    // Group-limited routing reaches fewer nodes than free routing would: scale every node's hit
    // down to the expected count, keeping the routing model's skew between nodes.
    let reached: f64 = node_hit.iter().sum();
    if let Some(cap) = node_limited_nodes(moe, node_hit.len()) {
        if reached > cap {
            node_hit.iter_mut().for_each(|h| *h *= cap / reached);
        }
    }
    let to_rank = (0..shares.len())
        .map(|src| {
            (0..shares.len())
                .map(|dst| if src == dst { 0.0 } else { row * rank_hit[dst] })
                .collect()
        })
        .collect();
    let to_node = (0..shares.len())
        .map(|src| {
            (0..node_hit.len())
                .map(|m| if m == src / p { 0.0 } else { row * node_hit[m] })
                .collect()
        })
        .collect();
    (to_rank, to_node)
}

/// Expected number of the `nodes` nodes of an EP group that hold at least one of a token's
/// experts under node-limited routing (each token's experts come from `topk_group` of the
/// `n_group` expert groups), with the groups packed onto the nodes evenly, as DeepSeek's expert
/// load balancer places them for prefill ("hierarchical" balancing: whole groups per node when the
/// node count divides the group count; here also each group spread over the same number of nodes
/// when the group count divides the node count). Uniform over the groups: with `g` groups per
/// node a node is reached with probability `1 − C(n_group − g, topk_group) / C(n_group,
/// topk_group)`; with a group over `r` nodes, a chosen group's `⌈k / topk_group⌉` experts reach
/// each of its nodes with [`hit_probability`] of a share `1 / r`. `None` where routing is not
/// group-limited (`topk_group ≥ n_group`, one group) or the groups do not pack evenly.
pub fn node_limited_nodes(moe: &MoeDims, nodes: usize) -> Option<f64> {
    let (groups, chosen) = (moe.n_group, moe.topk_group);
    if groups <= 1 || chosen == 0 || chosen >= groups || nodes == 0 {
        return None;
    }
    if groups.is_multiple_of(nodes) {
        let per_node = groups / nodes;
        // C(G − g, t) / C(G, t); 0 once the other nodes hold fewer than `t` groups.
        let miss: f64 = (0..chosen)
            .map(|i| groups.saturating_sub(per_node + i) as f64 / (groups - i) as f64)
            .product();
        Some(nodes as f64 * (1.0 - miss))
    } else if nodes.is_multiple_of(groups) {
        let span = nodes / groups;
        let per_group = moe.experts_per_token.div_ceil(chosen);
        let hit = hit_probability(1.0 / span as f64, per_group, moe.experts / groups);
        Some((chosen * span) as f64 * hit)
    } else {
        None
    }
}

/// Whether an operator works on the rows expert parallelism routes (the expert GEMMs and the
/// permutations around them) rather than on the card's own tokens.
pub fn is_routed_expert_op(op: &str) -> bool {
    op.starts_with("moe.experts") || op == "moe.dispatch" || op == "moe.combine"
}

type RunKey = (usize, usize, usize, usize, Blocks, bool);

/// One cached run: filled by the first thread that needs it while the others wait on its lock,
/// so concurrent estimates never simulate the same run twice.
type RunSlot = Arc<Mutex<Option<Arc<RunCost>>>>;

/// Locks `m`, also after another thread panicked holding it (a slot is then just empty).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Estimates plans of one model on one cluster, caching the card roles' cost-only runs. It is
/// shared between threads: estimates of different plans and phases can run concurrently, and
/// their numbers do not depend on it (each run is a pure function of its key).
pub struct Estimator {
    cfg: ModelConfig,
    cluster: ClusterPreset,
    device: DevicePreset,
    launcher: Launcher,
    routing: Routing,
    precision: Precision,
    /// The KV pools' format when not the precision's own (`--kv-dtype fp8`).
    kv_cache: Option<CacheFormat>,
    /// Implementation swaps every card role's forward runs with (`Runner::set_implementation`).
    impls: Vec<(String, &'static str)>,
    cache: Mutex<HashMap<RunKey, RunSlot>>,
}

impl Estimator {
    /// An estimator for `cfg` on `cluster`'s cards.
    pub fn new(
        cfg: ModelConfig,
        cluster: ClusterPreset,
        routing: Routing,
    ) -> Result<Estimator, EstimateError> {
        let device = cluster.device_preset()?;
        // One launch memo for every cost-only forward the estimator runs: shards at different
        // token counts and plans share most launches.
        let launcher = Launcher::new(device.clone())
            .with_backend(dsl_core::Backend::CostOnly)
            .with_memo(true);
        Ok(Estimator {
            cfg,
            cluster,
            device,
            launcher,
            routing,
            precision: Precision::Native,
            kv_cache: None,
            impls: Vec::new(),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// The estimator with its launches' tiles taken from `tuning` where it holds them (`day0
    /// tune --model`; see [`dsl_core::tuning`]); `None` keeps the heuristic tiles.
    pub fn with_tuning(mut self, tuning: Option<Arc<dsl_core::Tuning>>) -> Estimator {
        self.launcher = self.launcher.with_tuning(tuning);
        lock(&self.cache).clear();
        self
    }

    /// The estimator with the cards' weights held at `precision` (default
    /// [`Precision::Native`], what a deployment reads).
    pub fn with_precision(mut self, precision: Precision) -> Estimator {
        self.precision = precision;
        lock(&self.cache).clear();
        self
    }

    /// The estimator with every card's KV pools in `format` (`day0 run --kv-dtype`; `None`: the
    /// precision's own, bf16 at native precision). See [`Runner::set_kv_cache`].
    pub fn with_kv_cache(mut self, format: Option<CacheFormat>) -> Estimator {
        self.kv_cache = format;
        lock(&self.cache).clear();
        self
    }

    /// The format the cards' KV pools are simulated in.
    pub fn kv_cache(&self) -> CacheFormat {
        self.kv_cache.unwrap_or(self.precision.cache_format())
    }

    /// The estimator with operator `op` run by `implementation` in every card role's forward
    /// (`day0 run --impl OP=NAME`); an operator the forward cannot swap is an error naming
    /// `--impl`.
    pub fn with_implementation(
        mut self,
        op: &str,
        implementation: &str,
    ) -> Result<Estimator, EstimateError> {
        let name = crate::forward::ops::swap_choice(op, implementation).map_err(|e| match e {
            ForwardError::Workload { flag, message } => {
                EstimateError::Plan(PlanError { flag, message })
            }
            other => other.into(),
        })?;
        self.impls.retain(|(o, _)| o != op);
        self.impls.push((op.to_string(), name));
        lock(&self.cache).clear();
        Ok(self)
    }

    /// The model.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The cluster.
    pub fn cluster(&self) -> &ClusterPreset {
        &self.cluster
    }

    /// The card.
    pub fn device(&self) -> &DevicePreset {
        &self.device
    }

    /// Distinct cost-only forwards run so far.
    pub fn runs(&self) -> usize {
        lock(&self.cache)
            .values()
            .filter(|slot| lock(slot).is_some())
            .count()
    }

    /// One card role's cost-only forward: the `(tp, ep)` shard, `tokens` tokens at `position`.
    fn run(
        &self,
        plan: &Plan,
        tokens: usize,
        position: usize,
        blocks: Blocks,
        batched_decode: bool,
    ) -> Result<Arc<RunCost>, EstimateError> {
        let key = (plan.tp, plan.ep, tokens, position, blocks, batched_decode);
        let slot = lock(&self.cache).entry(key).or_default().clone();
        let mut slot = lock(&slot);
        if let Some(r) = slot.as_ref() {
            return Ok(r.clone());
        }
        let mut shard = plan.shard(&self.cfg);
        if !blocks.routed_experts {
            // The router scores every expert (on the card's own tokens, before the dispatch,
            // with the config's group limits): only the routed-experts run holds the card's
            // share of the experts.
            if let (Some(m), Some(full)) = (&mut shard.moe, &self.cfg.moe) {
                m.experts = full.experts;
                m.experts_per_token = full.experts_per_token;
                m.n_group = full.n_group;
                m.topk_group = full.topk_group;
            }
        }
        let mut runner = Runner::cost_only_at(
            shard,
            self.launcher.clone(),
            position + tokens,
            self.precision,
        )?;
        if let Some(format) = self.kv_cache {
            runner.set_kv_cache(format)?;
        }
        for (op, name) in &self.impls {
            runner.set_implementation(op, name)?;
        }
        runner.run_blocks(blocks)?;
        runner.batch_decode(batched_decode)?;
        runner.seek(position)?;
        runner.forward(&vec![0; tokens])?;
        let cost = Arc::new(RunCost {
            layers: runner.last_layers().to_vec(),
            total: runner.stats().clone(),
        });
        *slot = Some(cost.clone());
        Ok(cost)
    }

    /// Estimates one phase: a prefill of `context` prompt tokens per replica, or a decode step of
    /// `batch_per_replica` sequences at `context` tokens each.
    pub fn estimate(
        &self,
        plan: &Plan,
        phase: Phase,
        batch_per_replica: usize,
        context: usize,
    ) -> Result<StepEstimate, EstimateError> {
        plan.validate(&self.cfg, "--plan")?;
        if plan.cards() > self.cluster.cards() {
            return Err(PlanError {
                flag: "--cards".into(),
                message: format!(
                    "the plan needs {} cards but cluster `{}` holds {} ({} nodes × {}); add nodes",
                    plan.cards(),
                    self.cluster.name,
                    self.cluster.cards(),
                    self.cluster.nodes,
                    self.cluster.cards_per_node
                ),
            }
            .into());
        }
        let (tokens, position, batch) = match phase {
            Phase::Prefill => (context, 0, 1),
            Phase::Decode => (batch_per_replica.max(1), context, batch_per_replica.max(1)),
        };
        // Micro-batches: pipeline stages keep one each in flight; a stage splits its own into two
        // for the compute/all-to-all overlap when it has rows to split.
        let mb = match phase {
            Phase::Prefill => tokens,
            Phase::Decode => tokens.div_ceil(plan.pp),
        };
        // Routed rows on the hottest EP rank.
        let moe = self.cfg.moe.as_ref();
        let shares = moe
            .map(|m| self.routing.rank_shares(m.experts, plan.ep))
            .unwrap_or_else(|| vec![1.0]);
        let hot = shares.iter().cloned().fold(0.0, f64::max) * plan.ep as f64;
        let moe_tokens = moe.map(|m| {
            let local_k = m.experts_per_token.min(m.experts.div_ceil(plan.ep)).max(1);
            let rows = (mb * m.experts_per_token) as f64 / plan.tp as f64 * hot;
            ((rows / local_k as f64).ceil() as usize).max(1)
        });
        // The role's three runs are independent: the routed experts and the one-sequence
        // attention run on threads of their own beside the main run.
        let (main, per_seq, experts_run) = std::thread::scope(|scope| {
            let experts = moe_tokens.map(|t_moe| {
                scope.spawn(move || {
                    self.run(
                        plan,
                        t_moe,
                        0,
                        Blocks {
                            attention: false,
                            ffn: false,
                            routed_experts: true,
                        },
                        false,
                    )
                })
            });
            let per_seq = (phase == Phase::Decode).then(|| {
                scope.spawn(move || {
                    self.run(
                        plan,
                        1,
                        position,
                        Blocks {
                            attention: true,
                            ffn: false,
                            routed_experts: false,
                        },
                        false,
                    )
                })
            });
            // Decode: the micro-batch's sequences as one batched step (MLA and GQA attention
            // and the linear-attention recurrences in one launch each; see
            // `Runner::batch_decode`).
            let main = self.run(
                plan,
                mb,
                position,
                Blocks {
                    routed_experts: false,
                    ..Blocks::ALL
                },
                phase == Phase::Decode,
            );
            let join =
                |h: std::thread::ScopedJoinHandle<'_, Result<Arc<RunCost>, EstimateError>>| {
                    h.join().unwrap_or_else(|_| {
                        Err(EstimateError::Forward(ForwardError::Internal {
                            what: "a card role's cost-only run".into(),
                            message: "its thread panicked".into(),
                        }))
                    })
                };
            (main, per_seq.map(join), experts.map(join))
        });
        let main = main?;
        let per_seq = per_seq.transpose()?;
        let experts_run = experts_run.transpose()?;

        let clock = self.device.clock_ghz * 1e9;
        let h = self.cfg.hidden_size as f64;
        let tp_group = group_of(&self.cluster, plan.tp);
        let tp_allreduce = collective::all_reduce(
            &self.cluster,
            &tp_group,
            mb as f64 * h * 2.0,
            Algorithm::Auto,
        )?
        .seconds;
        // A q/k RMSNorm across all heads (MiniMax-M2) sees only a card's heads under tensor
        // parallelism: the squares' sums (one f32 each for q and k per token) are all-reduced.
        let across_heads_norm = match self.cfg.gqa.as_ref() {
            Some(g) if g.qk_norm_across_heads && plan.tp > 1 => {
                collective::all_reduce(&self.cluster, &tp_group, mb as f64 * 8.0, Algorithm::Auto)?
                    .seconds
            }
            _ => 0.0,
        };
        let (dispatch, combine) = match moe {
            Some(m) if plan.ep > 1 => {
                let origin = mb as f64 / plan.tp as f64;
                let group = group_of(&self.cluster, plan.ep);
                let cost = |bytes: f64| -> Result<f64, EstimateError> {
                    let row = origin * h * bytes;
                    Ok(match phase {
                        Phase::Prefill => {
                            let (to_rank, to_node) =
                                node_forwarded_volumes(&shares, &group, m, row);
                            collective::all_to_all_via_nodes(
                                &self.cluster,
                                &group,
                                &to_rank,
                                &to_node,
                            )?
                            .seconds
                        }
                        Phase::Decode => {
                            let volumes = per_expert_volumes(&shares, m, row);
                            collective::all_to_all(&self.cluster, &group, &volumes)?.seconds
                        }
                    })
                };
                // FP8 rows out, bf16 rows back.
                (cost(1.0)?, cost(2.0)?)
            }
            _ => (0.0, 0.0),
        };
        let p2p = if plan.pp > 1 {
            let same_node = plan.tp * plan.dp < self.cluster.cards_per_node;
            collective::send_recv(&self.cluster, mb as f64 * h * 2.0, same_node)?.seconds
        } else {
            0.0
        };

        let head_stats = main.head();
        let mut stage_times = Vec::with_capacity(plan.pp);
        let mut bd = Breakdown::default();
        let mut work = Work::default();
        let mut ops = OpTable::new();
        let mut exposed_total = 0.0;
        for s in 0..plan.pp {
            let (mut att, mut dense, mut exp) = (Work::default(), Work::default(), Work::default());
            let (mut tp_s, mut ep_s) = (0.0, 0.0);
            let mut stage_ops = OpTable::new();
            for l in plan.stage_layers(self.cfg.num_layers(), s) {
                let lc = &main.layers[l];
                let mut layer_ops = BTreeMap::new();
                let lo = &mut layer_ops;
                match &per_seq {
                    Some(ps) => {
                        let seq = &lc.attention.per_sequence;
                        att.add(Work::of(&lc.attention, |op| !seq.contains(op), 1.0, lo));
                        // Only what the batched step still ran per sequence: attention and the
                        // linear-attention recurrences already covered the whole batch there.
                        let one = &ps.layers[l].attention;
                        att.add(Work::of(
                            one,
                            |op| one.per_sequence.contains(op) && seq.contains(op),
                            mb as f64,
                            lo,
                        ));
                    }
                    None => att.add(Work::of(&lc.attention, |_| true, 1.0, lo)),
                }
                dense.add(Work::of(&lc.ffn, |op| !is_routed_expert_op(op), 1.0, lo));
                if let Some(er) = &experts_run {
                    exp.add(Work::of(&er.layers[l].ffn, is_routed_expert_op, 1.0, lo));
                }
                add_ops(&mut stage_ops, &self.cfg.layers[l].kind(), &layer_ops);
                if plan.tp > 1 {
                    tp_s += 2.0 * tp_allreduce;
                }
                if self.cfg.layers[l].attention.is_gqa() {
                    tp_s += across_heads_norm;
                }
                if self.cfg.layers[l].ffn == crate::config::FfnKind::Moe {
                    ep_s += dispatch + combine;
                }
            }
            let mut head = Work::default();
            if s == 0 || s + 1 == plan.pp {
                // Embedding on the first stage, lm_head on the last: split evenly for the bound.
                let share = if plan.pp == 1 { 1.0 } else { 0.5 };
                let mut head_ops = BTreeMap::new();
                head = Work::of(&head_stats, |_| true, share, &mut head_ops);
                add_ops(&mut stage_ops, "head", &head_ops);
            }
            let compute = (att.cycles + dense.cycles + exp.cycles + head.cycles) / clock;
            let split = if mb >= 2 { 2 } else { 1 };
            let (step, exposed) = collective::overlap(compute, ep_s, split);
            let stage = step + tp_s;
            let slowest_so_far = stage_times.iter().all(|t: &f64| stage > *t);
            if phase == Phase::Prefill {
                // A prompt crosses every stage: its breakdown is the sum over stages.
                bd.attention_s += att.cycles / clock;
                bd.dense_ffn_s += dense.cycles / clock;
                bd.experts_s += exp.cycles / clock;
                bd.head_s += head.cycles / clock;
                bd.tp_comm_s += tp_s;
                bd.ep_comm_s += ep_s;
                exposed_total += exposed + tp_s;
                for (kind, o) in &stage_ops {
                    add_ops(&mut ops, kind, o);
                }
            }
            if slowest_so_far {
                if phase == Phase::Prefill {
                    work = Work::default();
                    for w in [att, dense, exp, head] {
                        work.add(w);
                    }
                    stage_times.push(stage);
                    continue;
                }
                bd = Breakdown {
                    attention_s: att.cycles / clock,
                    dense_ffn_s: dense.cycles / clock,
                    experts_s: exp.cycles / clock,
                    head_s: head.cycles / clock,
                    tp_comm_s: tp_s,
                    ep_comm_s: ep_s,
                    pp_comm_s: 0.0,
                };
                exposed_total = exposed + tp_s;
                ops = stage_ops;
                work = Work::default();
                for w in [att, dense, exp, head] {
                    work.add(w);
                }
            }
            stage_times.push(stage);
        }
        let slowest = stage_times.iter().cloned().fold(0.0, f64::max);
        let pp_comm = (plan.pp - 1) as f64 * p2p;
        // Per-card work per step: the slowest stage's, for every micro-batch it runs.
        let rounds = match phase {
            Phase::Prefill => 1.0,
            Phase::Decode => plan.pp.min(batch) as f64,
        };
        for t in [
            &mut bd.attention_s,
            &mut bd.dense_ffn_s,
            &mut bd.experts_s,
            &mut bd.head_s,
            &mut bd.tp_comm_s,
            &mut bd.ep_comm_s,
        ] {
            *t *= rounds;
        }
        bd.pp_comm_s = pp_comm;
        for o in ops.values_mut().flat_map(|o| o.values_mut()) {
            o.launches *= rounds;
            o.cycles *= rounds;
        }
        let (step_s, busy_s, tokens_per_s) = match phase {
            Phase::Prefill => {
                let ttft: f64 = stage_times.iter().sum::<f64>() + pp_comm;
                (ttft, slowest, (plan.dp * context) as f64 / slowest)
            }
            Phase::Decode => {
                let tpot = rounds * slowest + pp_comm;
                (tpot, tpot, (plan.dp * batch) as f64 / tpot)
            }
        };
        // Utilisation against the matrix rate of the format the projections run in: FP8 for a
        // block-FP8 checkpoint at native precision (W8A8 where the card has an FP8 mode), f32 on
        // the reference path, else bf16; a card without that mode falls back to bf16, then f32.
        let rate = match (self.precision, &self.cfg.weight_format) {
            (Precision::F32, _) => "f32",
            (Precision::Native, crate::config::WeightFormat::Fp8Block { .. }) => "fp8e4m3",
            (Precision::Native, _) => "bf16",
        };
        let rates = &self.device.matrix.flop_per_cycle;
        let per_core = [rate, "bf16", "f32"]
            .iter()
            .find_map(|r| rates.get(*r))
            .copied()
            .unwrap_or(1.0);
        let peak_flops = per_core * self.device.cores as f64 * clock;
        let peak_bw = self.device.hbm.bandwidth_gbps * 1e9;
        Ok(StepEstimate {
            plan: *plan,
            phase,
            batch_per_replica: batch,
            context,
            step_s,
            tokens_per_s,
            tokens_per_s_per_card: tokens_per_s / plan.cards() as f64,
            mfu: work.flop * rounds / (busy_s * peak_flops),
            hbm_utilization: work.hbm_bytes * rounds / (busy_s * peak_bw),
            hbm_bytes_per_card: work.hbm_bytes * rounds,
            comm_exposed_share: ((exposed_total * rounds + pp_comm) / step_s).min(1.0),
            breakdown: bd,
            ops,
        })
    }
}
