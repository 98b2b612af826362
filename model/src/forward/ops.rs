//! One method per operator the forward pass launches: each allocates its output poisoned (so an
//! element a kernel forgets to write shows up as NaN in the logits), launches the DSL kernel on the
//! simulator and books the launch's cycles under the operator's name.
//!
//! This is the only file that knows kernel signatures and tile choices; the layer code reads as
//! the model's math.

use super::cache_format::{on_cache, on_cache_pair, CacheFormat, CacheTensor};
use super::ForwardError;
use crate::config::{IndexerDims, MoeDims};
use dsl_core::accel_sim::DType;
use dsl_core::prelude::*;
use dsl_core::{Report, SimError};
use kernels::attention::fp8_kv::{self, Fp8Tensors};
use kernels::attention::prefill::flash_prefill;
use kernels::attention::sparse;
use kernels::weight::Weight;
use std::collections::{BTreeMap, BTreeSet};

/// The operator every FP8 projection's activation quantization is booked under.
pub const ACT_QUANT_OP: &str = "act_quant_fp8";

/// Cycles and launches booked per operator name over a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpStats {
    /// Operator name → (launches, simulated cycles).
    pub per_op: BTreeMap<String, (u64, u64)>,
    /// The operators that work on one sequence's own cache or state (attention over the context,
    /// the linear-attention recurrence): a batch of sequences runs them once per sequence, while
    /// the others (projections, norms, experts) run once on all the batch's rows. The cluster
    /// planner prices a decode batch from this split.
    pub per_sequence: BTreeSet<String>,
    /// Operator name → HBM bytes moved and useful FLOP, summed over its launches.
    pub traffic: BTreeMap<String, Traffic>,
}

/// HBM bytes and useful FLOP of an operator's launches.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes read from and written to HBM.
    pub hbm_bytes: u64,
    /// The problem's useful floating-point operations.
    pub flop: u64,
}

impl OpStats {
    /// Total simulated cycles of every launch booked.
    pub fn total_cycles(&self) -> u64 {
        self.per_op.values().map(|(_, c)| c).sum()
    }

    /// Total launches.
    pub fn launches(&self) -> u64 {
        self.per_op.values().map(|(n, _)| n).sum()
    }

    /// Adds `other`'s launches and cycles, operator by operator.
    pub fn add(&mut self, other: &OpStats) {
        for (k, (n, c)) in &other.per_op {
            let e = self.per_op.entry(k.clone()).or_insert((0, 0));
            e.0 += n;
            e.1 += c;
        }
        self.per_sequence.extend(other.per_sequence.iter().cloned());
        for (k, t) in &other.traffic {
            let e = self.traffic.entry(k.clone()).or_default();
            e.hbm_bytes += t.hbm_bytes;
            e.flop += t.flop;
        }
    }

    /// HBM bytes and FLOP of every launch booked.
    pub fn total_traffic(&self) -> Traffic {
        self.traffic
            .values()
            .fold(Traffic::default(), |a, t| Traffic {
                hbm_bytes: a.hbm_bytes + t.hbm_bytes,
                flop: a.flop + t.flop,
            })
    }

    /// Cycles of the per-sequence operators ([`OpStats::per_sequence`]).
    pub fn sequence_cycles(&self) -> u64 {
        self.per_op
            .iter()
            .filter(|(k, _)| self.per_sequence.contains(*k))
            .map(|(_, (_, c))| c)
            .sum()
    }

    /// `self − earlier`, operator by operator (the cost of one step).
    pub fn since(&self, earlier: &OpStats) -> OpStats {
        let mut per_op = BTreeMap::new();
        for (k, (n, c)) in &self.per_op {
            let (n0, c0) = earlier.per_op.get(k).copied().unwrap_or((0, 0));
            if *n > n0 {
                per_op.insert(k.clone(), (n - n0, c - c0));
            }
        }
        let per_sequence = self
            .per_sequence
            .iter()
            .filter(|k| per_op.contains_key(*k))
            .cloned()
            .collect();
        let traffic = self
            .traffic
            .iter()
            .filter(|(k, _)| per_op.contains_key(*k))
            .map(|(k, t)| {
                let t0 = earlier.traffic.get(k).copied().unwrap_or_default();
                let d = Traffic {
                    hbm_bytes: t.hbm_bytes - t0.hbm_bytes,
                    flop: t.flop - t0.flop,
                };
                (k.clone(), d)
            })
            .collect();
        OpStats {
            per_op,
            per_sequence,
            traffic,
        }
    }
}

/// Which parts of a MoE block a step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MoeParts {
    /// Router, shared experts and routed experts (every functional run).
    All,
    /// Router and shared experts: the work on the card's own tokens.
    OwnTokens,
    /// Routed experts alone (dispatch, expert GEMMs, combine onto a zero base).
    RoutedOnly,
}

/// The launcher plus the bookkeeping; `layer` names the layer being run, for error context.
pub(crate) struct Ops {
    pub launcher: Launcher,
    pub stats: OpStats,
    pub layer: Option<usize>,
    pub mem: Mem,
    /// While set, launches book as per-sequence operators ([`OpStats::per_sequence`]).
    pub sequence_scope: bool,
    /// Which parts of a MoE block run (cost-only planning runs split them; see
    /// `forward::Blocks`).
    pub moe_parts: MoeParts,
    /// Cost-only planning runs: a step of `t` tokens is `t` sequences decoding one token each
    /// (see `Runner::batch_decode`).
    pub batched_decode: bool,
    /// How cost-only steps choose experts and DSA selections, and what a functional run records.
    pub routing: super::routing::RoutingState,
    /// The card's place in a multi-card run ([`super::cards`]); `None` on a single card.
    pub cards: Option<super::cards::CardLink>,
    /// The implementation chosen for each swappable operator ([`SWAPPABLE`]); an operator not
    /// named runs the fastest of its implementations at each launch.
    pub impls: BTreeMap<String, &'static str>,
    /// Launches per (swappable operator, implementation that ran).
    pub picks: BTreeMap<(&'static str, &'static str), u64>,
}

/// The GQA paged decode over a batch of sequences.
pub const DECODE_BATCH_OP: &str = "attention_decode_batch";

/// The grouped expert GEMM over MXFP4 expert weights.
pub const MXFP4_GROUPED_OP: &str = "moe_grouped_linear_mxfp4";

/// The operators whose implementation the forward can swap, each with the implementations its
/// call site launches, DSL prototype first: `Runner::set_implementation`,
/// `day0 forward --impl op=name`. Without a choice each launch runs the fastest of them at its
/// shapes ([`Ops::run_implementation`]).
pub const SWAPPABLE: &[(&str, &[&str])] = &[
    (
        DECODE_BATCH_OP,
        &["paged_decode_gqa_batch", "paged_decode_hand"],
    ),
    (
        MXFP4_GROUPED_OP,
        &["grouped_linear_mxfp4", "grouped_linear_mxfp4_hand"],
    ),
];

/// Checks that the forward can run `implementation` for operator `op` ([`SWAPPABLE`]) and
/// returns its registered name; anything else is an error naming `--impl` that lists the choices.
pub fn swap_choice(op: &str, implementation: &str) -> Result<&'static str, ForwardError> {
    let bad = |message: String| ForwardError::Workload {
        flag: "--impl".into(),
        message,
    };
    let Some((_, names)) = SWAPPABLE.iter().find(|(o, _)| *o == op) else {
        let listed: Vec<String> = SWAPPABLE
            .iter()
            .map(|(o, names)| format!("{o}={}", names.join("|")))
            .collect();
        return Err(bad(format!(
            "`{op}`: the forward cannot swap that operator; it can swap {}",
            listed.join(", ")
        )));
    };
    names
        .iter()
        .find(|n| **n == implementation)
        .copied()
        .ok_or_else(|| {
            bad(format!(
                "`{implementation}` is not an implementation of `{op}` the forward runs; choose {}",
                names.join(" or ")
            ))
        })
}

/// How the forward allocates device tensors: with data (functional runs: poisoned with NaN, so an
/// element a kernel forgets to write shows up in the logits) or as shapes only (cost-only runs of
/// production sizes, where nothing is materialised). The same layer code runs either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mem {
    /// Shapes only, no data.
    pub shape_only: bool,
    /// The format of the KV pools.
    pub cache: CacheFormat,
    /// The format activations are held in between kernels: bf16 at native precision (what a bf16
    /// deployment stores and moves), f32 on the reference path. Kernels compute in f32 either way.
    pub activations: DType,
}

impl Mem {
    /// For a launcher: shape-only exactly when its launches are cost-only; KV pools in `cache`,
    /// activations in `activations`.
    pub fn new(l: &Launcher, cache: CacheFormat, activations: DType) -> Mem {
        Mem {
            shape_only: l.backend == dsl_core::Backend::CostOnly,
            cache,
            activations,
        }
    }

    /// A fresh `[rows, cols]` activation (NaN-poisoned, or shape only), held in
    /// [`Mem::activations`].
    pub fn act(self, rows: usize, cols: usize) -> Tensor<f32> {
        self.act_shaped(&[rows, cols])
    }

    /// [`Mem::act`] of any shape (a per-head `[T, H, D]` attention output).
    pub fn act_shaped(self, shape: &[usize]) -> Tensor<f32> {
        self.poisoned(shape)
            .stored_as(self.activations)
            .expect("a fresh f32 tensor can be held in any float format of 16 bits or more")
    }

    /// A fresh `[rows, cols]` activation held in f32 whatever the precision: what a deployment
    /// keeps in f32 too (router logits, top-k scores), since a selection read from bf16 ties.
    pub fn act_f32(self, rows: usize, cols: usize) -> Tensor<f32> {
        self.poisoned(&[rows, cols])
    }

    /// A fresh tensor of any element type and shape (NaN-poisoned, or shape only).
    pub fn poisoned<T: Elem>(self, shape: &[usize]) -> Tensor<T> {
        if self.shape_only {
            Tensor::shape_only(shape)
        } else {
            Tensor::poisoned(shape)
        }
    }

    /// A zero `[rows, cols]` activation held in [`Mem::activations`] (an absent shared expert's
    /// output), or its shape.
    pub fn act_zeros(
        self,
        rows: usize,
        cols: usize,
        what: &str,
    ) -> Result<Tensor<f32>, ForwardError> {
        view(
            self.zeros(&[rows, cols], what)?.stored_as(self.activations),
            what,
        )
    }

    /// A zero tensor (a new sequence's state, an absent bias), or its shape.
    pub fn zeros(self, shape: &[usize], what: &str) -> Result<Tensor<f32>, ForwardError> {
        self.filled(shape, 0.0, what)
    }

    /// A tensor of `value` everywhere (shape-only in cost-only runs).
    pub fn filled(
        self,
        shape: &[usize],
        value: f32,
        what: &str,
    ) -> Result<Tensor<f32>, ForwardError> {
        if self.shape_only {
            return Ok(Tensor::shape_only(shape));
        }
        view(
            Tensor::from_f32(shape, &vec![value; shape.iter().product()]),
            what,
        )
    }
}

/// [`first_fitting`] for a launch that updates a tensor in place (a sequence's state slot): an
/// overflow found while a functional launch runs may already have written part of the state, so
/// each choice is first tried on a cost-only copy of the launcher, which writes nothing, and only
/// the first that fits runs on the data.
pub(crate) fn first_fitting_in_place<C: Copy, T>(
    launcher: &Launcher,
    tiles: impl IntoIterator<Item = C>,
    mut launch: impl FnMut(&Launcher, C) -> Result<T, SimError>,
) -> Result<T, SimError> {
    if launcher.backend == dsl_core::Backend::CostOnly {
        return first_fitting(tiles, |c| launch(launcher, c));
    }
    let probe = launcher.clone().with_backend(dsl_core::Backend::CostOnly);
    let choice = first_fitting(tiles, |c| launch(&probe, c).map(|_| c))?;
    launch(launcher, choice)
}

/// Launches with the fastest of `tiles` that fit the core, each priced cost-only first (an
/// on-chip overflow is passed over): for small launches whose best tile depends on how many
/// programs fill the cores. A cost-only launcher returns the priced launch itself; a functional
/// one then runs the winner.
pub(crate) fn fastest_fitting<C: Copy>(
    launcher: &Launcher,
    tiles: impl IntoIterator<Item = C>,
    mut launch: impl FnMut(&Launcher, C) -> Result<Launch, SimError>,
) -> Result<Launch, SimError> {
    let cost_only = launcher.backend == dsl_core::Backend::CostOnly;
    let probe = launcher.clone().with_backend(dsl_core::Backend::CostOnly);
    let mut best: Option<(C, Launch)> = None;
    let mut overflow = None;
    for c in tiles {
        match launch(&probe, c) {
            Ok(l) => {
                if best
                    .as_ref()
                    .is_none_or(|(_, b)| l.report.cycles < b.report.cycles)
                {
                    best = Some((c, l));
                }
            }
            Err(e @ SimError::SramOverflow { .. }) => overflow = Some(e),
            Err(e) => return Err(e),
        }
    }
    match best {
        Some((_, l)) if cost_only => Ok(l),
        Some((c, _)) => launch(launcher, c),
        None => Err(overflow.unwrap_or_else(|| SimError::Launch {
            kernel: "(no tile choice)".into(),
            message: "no tile configuration was offered".into(),
        })),
    }
}

/// A paged kernel's declared key tiles `BK` that stay within one page, largest first.
fn page_tiles(meta: &dsl_core::KernelMeta, page: usize) -> Vec<i64> {
    kernels::tile_choice::up_to(meta, "BK", page)
}

/// A view error (a programming error in the layer code, reported, not panicked).
pub(crate) fn view<T>(r: Result<T, String>, what: &str) -> Result<T, ForwardError> {
    r.map_err(|message| ForwardError::Internal {
        what: what.to_string(),
        message,
    })
}

/// Launches with the first of `tiles` whose tiles fit the core: an on-chip overflow moves on to
/// the next choice, any other result (success or error) is returned. Tile choices are listed
/// largest first, so a 512 KB NPU core keeps its big tiles and an H100-class SM's 228 KB gets the
/// next ones that fit. Only for launches that may be repeated: they must not read what they
/// write (the overflow is found while the programs run).
pub(crate) fn first_fitting<C, T>(
    tiles: impl IntoIterator<Item = C>,
    mut launch: impl FnMut(C) -> Result<T, SimError>,
) -> Result<T, SimError> {
    let mut last = None;
    for c in tiles {
        match launch(c) {
            Err(e @ SimError::SramOverflow { .. }) => last = Some(e),
            other => return other,
        }
    }
    Err(last.unwrap_or_else(|| SimError::Launch {
        kernel: "(no tile choice)".into(),
        message: "no tile configuration was offered".into(),
    }))
}

impl Ops {
    /// Bookkeeping for `launcher` with nothing booked yet: one sequence's numeric forward, every
    /// MoE part, the DSL kernel of every operator.
    pub fn new(launcher: Launcher, mem: Mem) -> Ops {
        Ops {
            launcher,
            stats: OpStats::default(),
            layer: None,
            mem,
            sequence_scope: false,
            moe_parts: MoeParts::All,
            batched_decode: false,
            routing: super::routing::RoutingState::new(),
            cards: None,
            impls: BTreeMap::new(),
            picks: BTreeMap::new(),
        }
    }

    /// Books a launch's cycles under `op`, or turns its failure into an error naming `op` and the
    /// layer.
    pub fn book(&mut self, op: &str, r: Result<Launch, SimError>) -> Result<(), ForwardError> {
        self.book_report(op, r.map(|l| l.report))
    }

    /// Books a launch over one sequence's own cache or state ([`OpStats::per_sequence`]).
    pub fn book_sequence(
        &mut self,
        op: &str,
        r: Result<Launch, SimError>,
    ) -> Result<(), ForwardError> {
        let outer = std::mem::replace(&mut self.sequence_scope, true);
        let booked = self.book(op, r);
        self.sequence_scope = outer;
        booked
    }

    /// Books a launch that returns only its report (the MoE runners).
    pub(crate) fn book_report(
        &mut self,
        op: &str,
        r: Result<Report, SimError>,
    ) -> Result<(), ForwardError> {
        match r {
            Ok(report) => {
                let e = self.stats.per_op.entry(op.to_string()).or_default();
                e.0 += 1;
                e.1 += report.cycles;
                let t = self.stats.traffic.entry(op.to_string()).or_default();
                t.hbm_bytes += report.hbm_bytes;
                t.flop += report.flop;
                if self.sequence_scope {
                    self.stats.per_sequence.insert(op.to_string());
                }
                Ok(())
            }
            Err(source) => Err(ForwardError::Kernel {
                op: op.to_string(),
                layer: self.layer,
                source,
            }),
        }
    }

    /// `y = x · wᵀ` (Hugging Face `[out, in]` weight) into a new activation.
    pub fn linear(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Weight,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = self.mem.act(x.rows(), w.out_features());
        self.linear_into(op, x, w, &y)?;
        Ok(y)
    }

    /// [`Ops::linear`] into a new f32 tensor at any precision ([`Mem::act_f32`]): router logits
    /// and the DSA indexer's head weights, which decide selections.
    pub fn linear_f32(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Weight,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = self.mem.act_f32(x.rows(), w.out_features());
        self.linear_into(op, x, w, &y)?;
        Ok(y)
    }

    /// `y = x · wᵀ` into an existing tensor or view, by the kernel for the weight's stored
    /// format. An FP8 weight's activation quantization is booked as [`ACT_QUANT_OP`].
    pub fn linear_into(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Weight,
        y: &Tensor<f32>,
    ) -> Result<(), ForwardError> {
        match kernels::linear::run_linear_weight(&self.launcher, x, w, y) {
            Ok(launches) => {
                for (kernel, l) in launches {
                    self.book(&Self::op_of(op, kernel, false), Ok(l))?;
                }
                Ok(())
            }
            Err(e) => self.book(op, Err(e)),
        }
    }

    /// Per-head maps `y[:, h] = x[:, h] · w[h]ᵀ` of `heads` heads in one launch: head `h` reads
    /// `K` columns of `x` from `h·x_stride`, the weight's rows `h·N ..` and writes `N` columns of
    /// `y` from `h·y_stride` ([`kernels::linear::linear_heads`]).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_heads_into(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Weight,
        y: &Tensor<f32>,
        heads: usize,
        x_stride: usize,
        y_stride: usize,
    ) -> Result<(), ForwardError> {
        let r =
            kernels::linear::run_linear_heads(&self.launcher, x, w, y, heads, x_stride, y_stride);
        self.book(op, r)
    }

    /// The operator a launch of `kernel` within `op` is booked under: the activation
    /// quantization of an FP8 GEMM apart, under one name for every projection, or with
    /// `routed` (the routed experts' grouped GEMMs) as `{op}.act_quant`, routed-expert work the
    /// planner prices at the rows expert parallelism sends a card.
    fn op_of<'a>(op: &'a str, kernel: &str, routed: bool) -> std::borrow::Cow<'a, str> {
        if kernel != kernels::linear::act_quant_fp8::META.name {
            op.into()
        } else if routed {
            format!("{op}.act_quant").into()
        } else {
            ACT_QUANT_OP.into()
        }
    }

    /// RMSNorm of each row of `x` (`y = x · rsqrt(mean(x²) + eps) · w`) into `y`.
    pub fn rmsnorm_into(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Tensor<f32>,
        eps: f64,
        y: &Tensor<f32>,
    ) -> Result<(), ForwardError> {
        let r = kernels::norm::run_rmsnorm(&self.launcher, x, w, y, eps as f32);
        self.book(op, r)
    }

    /// RMSNorm into a new tensor.
    pub fn rmsnorm(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Tensor<f32>,
        eps: f64,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = self.mem.act(x.rows(), x.cols());
        self.rmsnorm_into(op, x, w, eps, &y)?;
        Ok(y)
    }

    /// LayerNorm of each row (`(x − mean)/sqrt(var + eps) · w + b`) into a new tensor.
    pub fn layernorm(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Tensor<f32>,
        b: &Tensor<f32>,
        eps: f64,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = self.mem.act(x.rows(), x.cols());
        let r = kernels::norm::run_layernorm(&self.launcher, x, w, b, &y, eps as f32);
        self.book(op, r)?;
        Ok(y)
    }

    /// `y = x · wᵀ + bias` into a new tensor (a projection with a bias: the vision encoder's).
    pub fn linear_bias<T: Float>(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Tensor<T>,
        bias: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = self.mem.act(x.rows(), w.rows());
        let r = kernels::linear::run_linear_bias(&self.launcher, x, w, bias, &y);
        self.book(op, r)?;
        Ok(y)
    }

    /// GELU of every element into a new tensor (`tanh`: the tanh form).
    pub fn gelu(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        tanh: bool,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = self.mem.act(x.rows(), x.cols());
        let r = kernels::elementwise::run_gelu(&self.launcher, x, &y, tanh);
        self.book(op, r)?;
        Ok(y)
    }

    /// Bidirectional attention within each segment of packed `q`, `k`, `v [T, heads·head_dim]`
    /// (segment bounds `cu_seqlens`: one image each) into a new tensor.
    pub fn varlen_attention(
        &mut self,
        op: &str,
        q: &Tensor<f32>,
        k: &Tensor<f32>,
        v: &Tensor<f32>,
        cu_seqlens: &[i32],
        head_dim: usize,
    ) -> Result<Tensor<f32>, ForwardError> {
        let o = self.mem.act(q.rows(), q.cols());
        let r = kernels::attention::varlen::run_varlen_attention(
            &self.launcher,
            q,
            k,
            v,
            &o,
            cu_seqlens,
            head_dim,
        );
        self.book(op, r)?;
        Ok(o)
    }

    /// Learned position embeddings of `table` interpolated to the patches: four taps per patch
    /// (`idx`, `weights`), into a new `[N, H]` tensor.
    pub fn pos_embed_bilinear(
        &mut self,
        op: &str,
        table: &Tensor<f32>,
        idx: &[i32],
        weights: &[f32],
    ) -> Result<Tensor<f32>, ForwardError> {
        let out = self
            .mem
            .act(idx.len() / kernels::vision::pos_embed::TAPS, table.cols());
        let r = kernels::vision::pos_embed::run_pos_embed_bilinear(
            &self.launcher,
            table,
            idx,
            weights,
            &out,
        );
        self.book(op, r)?;
        Ok(out)
    }

    /// The pre-norm block's residual step: `h = x + residual` and `y = rmsnorm(h) · w`, fused.
    pub fn add_rmsnorm(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        residual: &Tensor<f32>,
        w: &Tensor<f32>,
        eps: f64,
    ) -> Result<(Tensor<f32>, Tensor<f32>), ForwardError> {
        let (h, y) = (
            self.mem.act(x.rows(), x.cols()),
            self.mem.act(x.rows(), x.cols()),
        );
        let r = kernels::norm::launch_rmsnorm_residual(
            &self.launcher,
            x,
            residual,
            w,
            &h,
            &y,
            eps as f32,
        );
        self.book(op, r)?;
        Ok((h, y))
    }

    /// A two-input element-wise kernel into a new tensor shaped like `like`.
    fn binary(
        &mut self,
        op: &str,
        a: &Tensor<f32>,
        b: &Tensor<f32>,
        like: &Tensor<f32>,
        run: impl Fn(&Launcher, &Tensor<f32>, &Tensor<f32>, &Tensor<f32>) -> Result<Launch, SimError>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let out = self.mem.act(like.rows(), like.cols());
        let r = run(&self.launcher, a, b, &out);
        self.book(op, r)?;
        Ok(out)
    }

    /// `a + b` into a new tensor.
    pub fn add(
        &mut self,
        op: &str,
        a: &Tensor<f32>,
        b: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        self.binary(op, a, b, a, kernels::elementwise::run_add)
    }

    /// `x · σ(gate)` elementwise into a new tensor.
    pub fn sigmoid_mul(
        &mut self,
        op: &str,
        gate: &Tensor<f32>,
        x: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        self.binary(op, gate, x, x, kernels::elementwise::run_sigmoid_mul)
    }

    /// The attention kernels' `sinks [heads, 1]` argument: the layer's sinks, or for a layer
    /// without them −∞ for every head (no logit added to any softmax).
    fn sinks_or_none(
        &self,
        op: &str,
        heads: usize,
        sinks: Option<&Tensor<f32>>,
    ) -> Result<Tensor<f32>, ForwardError> {
        match sinks {
            Some(s) => Ok(s.clone()),
            None => self.mem.filled(
                &[heads, 1],
                f32::NEG_INFINITY,
                &format!("{op}: no attention sinks"),
            ),
        }
    }

    /// `x += b` in place, one bias row `b [1, N]` for every row of `x [T, N]`.
    pub fn add_bias(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        b: &Tensor<f32>,
    ) -> Result<(), ForwardError> {
        let r = kernels::elementwise::run_add_bias(&self.launcher, x, b, x);
        self.book(op, r)
    }

    /// `x · σ(gate)` with one gate per row (`gate [T, 1]`) into a new tensor.
    pub fn sigmoid_mul_col(
        &mut self,
        op: &str,
        gate: &Tensor<f32>,
        x: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        self.binary(op, gate, x, x, kernels::elementwise::run_sigmoid_mul_col)
    }

    /// `x[t, :] · s[t]` (`s [T, 1]`) into a new tensor.
    pub fn mul_col(
        &mut self,
        op: &str,
        s: &Tensor<f32>,
        x: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        self.binary(op, s, x, x, kernels::elementwise::run_mul_col)
    }

    /// gpt-oss's clamped SwiGLU `(clamp(u, ±limit) + 1) · g′ · σ(alpha · g′)`, `g′ = min(g,
    /// limit)`, into a new tensor.
    pub fn swiglu_clamped(
        &mut self,
        op: &str,
        g: &Tensor<f32>,
        u: &Tensor<f32>,
        alpha: f64,
        limit: f64,
    ) -> Result<Tensor<f32>, ForwardError> {
        self.binary(op, g, u, g, |l, g, u, h| {
            let cfg = Config::new().with("BR", 16).with("BC", 128);
            kernels::moe::expert_gemm::swiglu_clamped::launch(
                l,
                &cfg,
                g,
                u,
                h,
                alpha as f32,
                limit as f32,
            )
        })
    }

    /// Per-expert bias rows `b [E, N]` added in place to the expert-grouped rows of `y [rows, N]`
    /// (`offsets [E + 1]`).
    pub fn grouped_add_bias(
        &mut self,
        op: &str,
        y: &Tensor<f32>,
        b: &Tensor<f32>,
        offsets: &Tensor<i32>,
    ) -> Result<(), ForwardError> {
        let r = kernels::moe::grouped::run_grouped_add_bias(&self.launcher, y, b, offsets);
        self.book(op, r)
    }

    /// `silu(g) · u` into a new tensor.
    pub fn swiglu(
        &mut self,
        op: &str,
        g: &Tensor<f32>,
        u: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        self.binary(op, g, u, g, |l, g, u, h| {
            let cfg = Config::new().with("BR", 16).with("BC", 128);
            kernels::moe::expert_gemm::swiglu::launch(l, &cfg, g, u, h)
        })
    }

    /// `dst = src` between views.
    pub fn copy(
        &mut self,
        op: &str,
        src: &Tensor<f32>,
        dst: &Tensor<f32>,
    ) -> Result<(), ForwardError> {
        let r = kernels::layout::run_copy(&self.launcher, src, dst);
        self.book(op, r)
    }

    /// Rotary embedding of dims `rot_offset .. rot_offset + rot_dim` of every `head_dim`-wide head
    /// of `x`, written to `out` (which may be `x` itself).
    #[allow(clippy::too_many_arguments)]
    pub fn rope_into(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        tables: &RopeTables,
        head_dim: usize,
        rot_offset: usize,
        out: &Tensor<f32>,
    ) -> Result<(), ForwardError> {
        let r = kernels::rope::run_rope(
            &self.launcher,
            x,
            &tables.cos,
            &tables.sin,
            out,
            head_dim,
            rot_offset,
            tables.rot_dim,
            tables.interleaved,
        );
        self.book(op, r)
    }

    /// One decode token's attention over a paged latent pool (MLA absorbed) for `S` sequences in
    /// one launch: `q [S, H, D]` against `pool [pages, page, D]`, sequence `s` through row `s` of
    /// `block_tables [S, T]` for `ctx_lens[s]` tokens (at most `max_ctx`), values the first
    /// `v_dim` columns of each latent row, each row read once ([`paged_decode_latent`]). Split-KV
    /// over up to 8 page ranges, then the combine. Returns `[S·H, v_dim]`.
    ///
    /// [`paged_decode_latent`]: kernels::attention::decode::paged_decode_latent
    #[allow(clippy::too_many_arguments)]
    pub fn latent_decode(
        &mut self,
        q: &Tensor<f32>,
        pool: &CacheTensor,
        block_tables: &Tensor<i32>,
        ctx_lens: &Tensor<i32>,
        max_ctx: usize,
        v_dim: usize,
        scale: f64,
    ) -> Result<Tensor<f32>, ForwardError> {
        use kernels::attention::decode::{decode_latent_config, paged_decode_latent};
        use kernels::attention::fp8_kv::paged_decode_latent_fp8;
        let (seqs, heads, d, page) = (q.shape()[0], q.shape()[1], q.shape()[2], pool.shape()[1]);
        let splits = self.decode_splits(seqs * heads.div_ceil(64), max_ctx.div_ceil(page));
        let o_part = self.mem.poisoned::<f32>(&[splits, seqs, heads, v_dim]);
        let lse_part = self.mem.poisoned::<f32>(&[splits, seqs, heads, 1]);
        let o = self.mem.act(seqs * heads, v_dim);
        // The largest key tile up to the page that fits the core next to the one in flight: a
        // 64-row page of 576-wide latent rows fits a 512 KB NPU core, an H100-class SM's 228 KB
        // in smaller tiles; then the same with 16-head query tiles. The launch reads `q` and the
        // pool and writes only the partials, so a retry after an overflow is safe.
        let mut bks = page_tiles(&paged_decode_latent::META, page);
        if bks.is_empty() {
            bks.push(0);
        }
        let tries: Vec<(i64, Option<i64>)> = bks
            .iter()
            .map(|b| (*b, None))
            .chain(bks.iter().map(|b| (*b, Some(16))))
            .collect();
        let r = first_fitting(tries, |(bk, bh)| {
            let mut base = if bk > 0 {
                Config::new().with("BK", bk)
            } else {
                Config::new()
            };
            if let Some(bh) = bh {
                base = base.with("BH", bh);
            }
            decode_latent_config(&base, d, page, heads).and_then(|cfg| match pool {
                // Codes convert to bf16 on chip (exact), the compute type of a bf16 cache.
                CacheTensor::Fp8(p8) => paged_decode_latent_fp8::launch::<f32, bf16>(
                    &self.launcher,
                    &cfg,
                    q,
                    &p8.codes,
                    &p8.scales,
                    block_tables,
                    ctx_lens,
                    &o_part,
                    &lse_part,
                    max_ctx,
                    scale as f32,
                ),
                _ => on_cache!(pool, pool => paged_decode_latent::launch(
                    &self.launcher,
                    &cfg,
                    q,
                    pool,
                    block_tables,
                    ctx_lens,
                    &o_part,
                    &lse_part,
                    max_ctx,
                    scale as f32,
                )),
            })
        });
        self.book_decode("mla.decode", seqs, r, &o_part, &lse_part, &o)?;
        Ok(o)
    }

    /// Context splits of a split-KV decode whose every split has `programs` programs (sequences ×
    /// head blocks) over contexts of up to `pages` pages: as many as fill one wave of the device's
    /// cores (FlashMLA sizes its splits from the SM count the same way), at most 8 and at most
    /// one per page. A large batch fills the cores by itself, and each split beyond that only
    /// adds partial outputs to write and combine.
    fn decode_splits(&self, programs: usize, pages: usize) -> usize {
        let cores = self.launcher.preset.cores as usize;
        cores.div_ceil(programs.max(1)).min(pages).clamp(1, 8)
    }

    /// Books a split-KV decode launch of `seqs` sequences as `{op}_split`, then runs and books the
    /// combine of its partials into `o` as `{op}_combine`. One sequence's launches are
    /// per-sequence work; a batched launch already covers the batch.
    fn book_decode(
        &mut self,
        op: &str,
        seqs: usize,
        split: Result<Launch, SimError>,
        o_part: &Tensor<f32>,
        lse_part: &Tensor<f32>,
        o: &Tensor<f32>,
    ) -> Result<(), ForwardError> {
        use kernels::attention::decode::{combine_config, decode_combine};
        let book = |ops: &mut Ops, op: &str, r| {
            if seqs > 1 {
                ops.book(op, r)
            } else {
                ops.book_sequence(op, r)
            }
        };
        book(self, &format!("{op}_split"), split)?;
        let v_dim = o.cols();
        let r = combine_config(v_dim)
            .and_then(|cfg| decode_combine::launch(&self.launcher, &cfg, o_part, lse_part, o));
        book(self, &format!("{op}_combine"), r)
    }

    /// Causal attention of `q [Sq, H·D]` over `k [Skv, Hkv·D]`, `v [Skv, Hkv·DV]`: the queries are
    /// the last `Sq` of the `Skv` positions, each over its last `window` keys (0: all of them),
    /// with the heads' attention sinks (`[H, 1]`) when given.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        op: &str,
        q: &Tensor<f32>,
        k: &Tensor<f32>,
        v: &Tensor<f32>,
        head_dim: usize,
        v_head_dim: usize,
        scale: f64,
        window: usize,
        sinks: Option<&Tensor<f32>>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let o = self.mem.act(q.rows(), q.cols() / head_dim * v_head_dim);
        self.attention_into(op, q, k, v, &o, head_dim, v_head_dim, scale, window, sinks)?;
        Ok(o)
    }

    /// [`Ops::attention`] into `o [Sq, H·DV]` (a view of a larger output: one chunk's queries of
    /// a chunked-attention layer).
    #[allow(clippy::too_many_arguments)]
    pub fn attention_into(
        &mut self,
        op: &str,
        q: &Tensor<f32>,
        k: &Tensor<f32>,
        v: &Tensor<f32>,
        o: &Tensor<f32>,
        head_dim: usize,
        v_head_dim: usize,
        scale: f64,
        window: usize,
        sinks: Option<&Tensor<f32>>,
    ) -> Result<(), ForwardError> {
        let heads = q.cols() / head_dim;
        let sinks = &self.sinks_or_none(op, heads, sinks)?;
        let tile = |n: usize| {
            if n <= 16 {
                16
            } else if n <= 32 {
                32
            } else {
                64
            }
        };
        // Wide heads (Qwen3-Next's 256) overflow an H100-class SM at 64-row tiles: halve the key
        // tile, then the query tile.
        let (bq, bk) = (tile(q.rows()), tile(k.rows()));
        let tiles = [
            (bq, bk),
            (bq, 32.min(bk)),
            (32.min(bq), 32.min(bk)),
            (16, 16),
        ];
        let r = first_fitting(tiles, |(bq, bk)| {
            let base = Config::new().with("BQ", bq).with("BK", bk);
            kernels::attention::prefill::prefill_config(&base, head_dim, v_head_dim).and_then(
                |cfg| {
                    flash_prefill::launch(
                        &self.launcher,
                        &cfg,
                        q,
                        k,
                        v,
                        o,
                        head_dim,
                        v_head_dim,
                        scale as f32,
                        true,
                        window,
                        sinks,
                    )
                },
            )
        });
        self.book_sequence(op, r)
    }

    /// Writes row `i` of `new [n, W]` to row `slots[i]` of the paged `pool [pages·page, W]`: the
    /// new tokens of one sequence or of a whole batch in one launch
    /// ([`kernels::attention::kv_append`]), booked as one sequence's work when `per_sequence`.
    pub fn kv_append(
        &mut self,
        op: &str,
        new: &Tensor<f32>,
        slots: &[usize],
        pool: &CacheTensor,
        per_sequence: bool,
    ) -> Result<(), ForwardError> {
        let r = match pool {
            // Quantised per token as it is written.
            CacheTensor::Fp8(p8) => kernels::attention::fp8_kv::run_kv_cache_append_fp8_slots(
                &self.launcher,
                new,
                slots,
                p8,
            ),
            _ => on_cache!(pool, pool => kernels::attention::kv_append::run_kv_cache_append_slots(
                &self.launcher,
                new,
                slots,
                pool,
            )),
        };
        if per_sequence {
            self.book_sequence(op, r)
        } else {
            self.book(op, r)
        }
    }

    /// Writes the rows of `src` into the rows `rows` of `out` in place, or adds them with
    /// `accumulate` ([`kernels::vision::scatter`]: image tokens into their placeholders'
    /// rows, DeepStack features onto them).
    pub fn scatter_rows(
        &mut self,
        op: &str,
        src: &Tensor<f32>,
        rows: &[i32],
        out: &Tensor<f32>,
        accumulate: bool,
    ) -> Result<(), ForwardError> {
        let r =
            kernels::vision::scatter::run_scatter_rows(&self.launcher, src, rows, out, accumulate);
        self.book(op, r)
    }

    /// Rows `rows` of `table` gathered into a new f32 `[rows.len(), W]` tensor (a sequence's
    /// rows out of a step's activations).
    pub fn gather_rows<T: Float>(
        &mut self,
        op: &str,
        table: &Tensor<T>,
        rows: &[i32],
    ) -> Result<Tensor<f32>, ForwardError> {
        let out = self.mem.act(rows.len(), table.cols());
        let r = kernels::embedding::run_embedding(&self.launcher, rows, table, &out);
        self.book_sequence(op, r)?;
        Ok(out)
    }

    /// [`Self::gather_rows`] out of a paged pool (a sequence's context, for a kernel that reads
    /// it contiguously): the rows convert to f32 as they are gathered (FP8: codes × scale).
    pub fn gather_cache_rows(
        &mut self,
        op: &str,
        pool: &CacheTensor,
        rows: &[i32],
    ) -> Result<Tensor<f32>, ForwardError> {
        match pool {
            CacheTensor::F32(t) => self.gather_rows(op, t, rows),
            CacheTensor::Bf16(t) => self.gather_rows(op, t, rows),
            CacheTensor::Fp8(p8) => {
                let out = self.mem.act(rows.len(), pool.cols());
                let idx: Vec<usize> = rows
                    .iter()
                    .map(|r| {
                        usize::try_from(*r).map_err(|_| ForwardError::Internal {
                            what: op.into(),
                            message: format!("negative pool row {r} in a context gather"),
                        })
                    })
                    .collect::<Result<_, _>>()?;
                let r = kernels::attention::fp8_kv::run_gather_dequant_fp8(
                    &self.launcher,
                    p8,
                    &idx,
                    &out,
                );
                self.book_sequence(op, r)?;
                Ok(out)
            }
        }
    }

    /// One decode token of each of `S` sequences, grouped-query attention over their pages of
    /// one shared paged cache, in one launch: `q [S, H·D]` against `k_pool [pages, page, Hkv·D]`
    /// and `v_pool [pages, page, Hkv·DV]`, sequence `s` through row `s` of `block_tables [S, T]`
    /// for `ctx_lens[s]` tokens (at most `max_ctx`), split-KV over up to 8 page ranges, then the
    /// combine ([`paged_decode_gqa_batch`], or [`paged_decode_gqa_batch_fp8`] over FP8 pools). Returns
    /// `[S, H·DV]`. A pinned implementation (`--impl attention_decode_batch=NAME`) runs where it
    /// can: FP8 pools have their FP8 kernel only, and a sliding window or sinks the DSL kernel.
    ///
    /// [`paged_decode_gqa_batch`]: kernels::attention::decode::paged_decode_gqa_batch
    /// [`paged_decode_gqa_batch_fp8`]: kernels::attention::fp8_kv::paged_decode_gqa_batch_fp8
    #[allow(clippy::too_many_arguments)]
    pub fn gqa_decode(
        &mut self,
        op: &str,
        q: &Tensor<f32>,
        k_pool: &CacheTensor,
        v_pool: &CacheTensor,
        block_tables: &Tensor<i32>,
        ctx_lens: &Tensor<i32>,
        max_ctx: usize,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        scale: f64,
        window: usize,
        sinks: Option<&Tensor<f32>>,
    ) -> Result<Tensor<f32>, ForwardError> {
        use kernels::attention::decode::{decode_config, paged_decode_gqa_batch};
        use kernels::attention::fp8_kv::paged_decode_gqa_batch_fp8;
        use kernels::hand_tuned::paged_decode as hand;
        let seqs = q.rows();
        let heads = q.cols() / head_dim.max(1);
        let group = heads / kv_heads.max(1);
        let page = k_pool.shape().get(1).copied().unwrap_or(1);
        let splits = self.decode_splits(seqs * kv_heads, max_ctx.div_ceil(page.max(1)));
        let q3 = view(
            q.reshaped(&[seqs * kv_heads, group, head_dim]),
            "decode queries",
        )?;
        let o_part = self
            .mem
            .poisoned::<f32>(&[splits, seqs * kv_heads, group, v_head_dim]);
        let lse_part = self
            .mem
            .poisoned::<f32>(&[splits, seqs * kv_heads, group, 1]);
        let o = self.mem.act(seqs * heads, v_head_dim);
        let has_sinks = sinks.is_some();
        let sinks = &self.sinks_or_none(op, heads, sinks)?;
        // The largest key tile within a page that fits the core (wide heads overflow an
        // H100-class SM at 64 keys). The launch writes only the partials: a retry is safe.
        let tiled = |meta: &dsl_core::KernelMeta,
                     launch: &dyn Fn(&Config) -> Result<Launch, SimError>| {
            first_fitting(page_tiles(meta, page), |bk| {
                let base = Config::new().with("BK", bk);
                decode_config(meta, &base, head_dim, v_head_dim, page, group)
                    .and_then(|cfg| launch(&cfg))
            })
        };
        let meta = &paged_decode_gqa_batch::META;
        let dsl = |launcher: &Launcher| {
            tiled(meta, &|cfg| {
                on_cache_pair!(k_pool, v_pool, meta.name, (k, v) => {
                    paged_decode_gqa_batch::launch(
                        launcher,
                        cfg,
                        &q3,
                        k,
                        v,
                        block_tables,
                        ctx_lens,
                        &o_part,
                        &lse_part,
                        max_ctx,
                        scale as f32,
                        window,
                        sinks,
                    )
                })
            })
        };
        let hand_tuned = |launcher: &Launcher| {
            gqa_decode_hand(
                launcher,
                &q3,
                k_pool,
                v_pool,
                block_tables,
                ctx_lens,
                max_ctx,
                &o_part,
                &lse_part,
                group,
                scale,
            )
        };
        // FP8 pools: codes converted on chip, scales on the score and probability columns.
        let meta8 = &paged_decode_gqa_batch_fp8::META;
        let dsl_fp8 = |launcher: &Launcher| match (k_pool, v_pool) {
            (CacheTensor::Fp8(k8), CacheTensor::Fp8(v8)) => {
                // The scale rows are read per key/value head: pools of other heads or widths
                // would read clipped (zero) scales, not fail.
                let fits = |p: &Fp8Tensors, dim: usize| p.heads() == kv_heads && p.dim() == dim;
                if !fits(k8, head_dim) || !fits(v8, v_head_dim) {
                    return Err(SimError::Launch {
                        kernel: meta8.name.into(),
                        message: format!(
                            "FP8 pools of {}×{} keys and {}×{} values per token, but the layer \
                             has {kv_heads} key/value heads of {head_dim} and {v_head_dim}",
                            k8.heads(),
                            k8.dim(),
                            v8.heads(),
                            v8.dim()
                        ),
                    });
                }
                tiled(meta8, &|cfg| {
                    paged_decode_gqa_batch_fp8::launch::<f32, bf16>(
                        launcher,
                        cfg,
                        &q3,
                        &k8.codes,
                        &v8.codes,
                        &k8.scales,
                        &v8.scales,
                        block_tables,
                        ctx_lens,
                        &o_part,
                        &lse_part,
                        max_ctx,
                        scale as f32,
                        window,
                        sinks,
                    )
                })
            }
            _ => Err(super::cache_format::fp8_unsupported()),
        };
        // The hand-tuned kernel reads whole bf16 or f32 contexts and has no sinks: a sliding
        // window or sinks have the DSL kernel only, FP8 pools its FP8 form only.
        let choices: &[Implementation<'_>] = if k_pool.format() == CacheFormat::Fp8 {
            &[(meta8.name, &dsl_fp8)]
        } else if window > 0 || has_sinks {
            &[(meta.name, &dsl)]
        } else {
            &[(meta.name, &dsl), (hand::META.name, &hand_tuned)]
        };
        let (name, r) = self.run_implementation(DECODE_BATCH_OP, choices);
        *self.picks.entry((DECODE_BATCH_OP, name)).or_default() += 1;
        self.book_decode(op, seqs, r, &o_part, &lse_part, &o)?;
        view(o.reshaped(&[seqs, heads * v_head_dim]), "decode output")
    }
}

/// One implementation of a swappable operator: its registered name and how to launch it on a
/// launcher (the real one, or a cost-only copy that prices it).
type Implementation<'a> = (
    &'static str,
    &'a dyn Fn(&Launcher) -> Result<Launch, SimError>,
);

impl Ops {
    /// Launches operator `op` on the implementation the user chose ([`Ops::impls`]) or, by
    /// default, on the fastest of `choices` at this launch's shapes: each is priced cost-only
    /// (a functional launch then runs the winner on the data; a cost-only one keeps the winner's
    /// launch) and the fewest cycles win, the first listed on a tie. Every implementation listed
    /// is verified against the operator's reference by the kernel tests (`day0 compare`); one
    /// that cannot run at this shape (its tiles overflow the core) is passed over. Returns the
    /// name of the implementation that ran.
    fn run_implementation(
        &self,
        op: &str,
        choices: &[Implementation<'_>],
    ) -> (&'static str, Result<Launch, SimError>) {
        if let Some(&(name, launch)) = self
            .impls
            .get(op)
            .and_then(|chosen| choices.iter().find(|(n, _)| n == chosen))
        {
            return (name, launch(&self.launcher));
        }
        let cost_only = self.launcher.backend == dsl_core::Backend::CostOnly;
        let probe = if cost_only {
            self.launcher.clone()
        } else {
            self.launcher
                .clone()
                .with_backend(dsl_core::Backend::CostOnly)
        };
        let mut best: Option<(usize, Launch)> = None;
        let mut first_error = None;
        for (i, (_, launch)) in choices.iter().enumerate() {
            match launch(&probe) {
                Ok(l) => {
                    if best
                        .as_ref()
                        .is_none_or(|(_, b)| l.report.cycles < b.report.cycles)
                    {
                        best = Some((i, l));
                    }
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match best {
            Some((i, l)) if cost_only => (choices[i].0, Ok(l)),
            Some((i, _)) => (choices[i].0, (choices[i].1)(&self.launcher)),
            None => (
                choices[0].0,
                Err(first_error.unwrap_or_else(|| SimError::Launch {
                    kernel: op.to_string(),
                    message: "no implementation offered".into(),
                })),
            ),
        }
    }
}

/// [`Ops::gqa_decode`]'s split launch on the hand-tuned kernel
/// ([`kernels::hand_tuned::paged_decode`]): the smallest query-row tile that holds a group, the
/// largest key tile within a page, a three-deep ring, moving to smaller tiles and a shallower ring
/// while they overflow the core.
#[allow(clippy::too_many_arguments)]
fn gqa_decode_hand(
    launcher: &Launcher,
    q3: &Tensor<f32>,
    k_pool: &CacheTensor,
    v_pool: &CacheTensor,
    block_tables: &Tensor<i32>,
    ctx_lens: &Tensor<i32>,
    max_ctx: usize,
    o_part: &Tensor<f32>,
    lse_part: &Tensor<f32>,
    group: usize,
    scale: f64,
) -> Result<Launch, SimError> {
    use kernels::hand_tuned::paged_decode::{launch, DecodeTensors, META};
    let page = k_pool.shape().get(1).copied().unwrap_or(1);
    let bh = [16i64, 32, 64, 128]
        .into_iter()
        .find(|b| *b as usize >= group)
        .unwrap_or(128);
    let configs: Vec<Config> = page_tiles(&META, page)
        .into_iter()
        .flat_map(|bk| {
            [3i64, 2].map(|stages| {
                Config::new()
                    .with("BH", bh)
                    .with("BK", bk)
                    .with("STAGES", stages)
            })
        })
        .collect();
    first_fitting(configs, |cfg| {
        on_cache_pair!(k_pool, v_pool, META.name, (k, v) => {
            let tensors = DecodeTensors {
                q: q3,
                k_pool: k,
                v_pool: v,
                block_table: block_tables,
                ctx_lens: Some(ctx_lens),
                o_part,
                lse_part,
            };
            launch(launcher, &cfg, &tensors, max_ctx, scale as f32)
        })
    })
}

impl Ops {
    /// DeepSeek-V3 router: sigmoid scores, bias for selection only, group-limited top-k.
    pub fn router_sigmoid_group_topk(
        &mut self,
        logits: &Tensor<f32>,
        bias: &Tensor<f32>,
        idx: &Tensor<i32>,
        weights: &Tensor<f32>,
        m: &MoeDims,
    ) -> Result<(), ForwardError> {
        let r = kernels::moe::router::run_router_sigmoid_group_topk(
            &self.launcher,
            logits,
            bias,
            idx,
            weights,
            m.n_group,
            m.topk_group,
            m.norm_topk_prob,
            m.routed_scaling_factor as f32,
        );
        self.book_report("moe.router", r)
    }

    /// Softmax top-k router picking on probability plus a correction bias (ERNIE-4.5).
    pub fn router_softmax_bias_topk(
        &mut self,
        logits: &Tensor<f32>,
        bias: &Tensor<f32>,
        idx: &Tensor<i32>,
        weights: &Tensor<f32>,
    ) -> Result<(), ForwardError> {
        let r = kernels::moe::router::run_router_softmax_bias_topk(
            &self.launcher,
            logits,
            bias,
            idx,
            weights,
        );
        self.book_report("moe.router", r)
    }

    /// Softmax top-k router (Qwen, Mixtral; grouped and scaled: DeepSeek-V2).
    pub fn router_softmax_topk(
        &mut self,
        logits: &Tensor<f32>,
        idx: &Tensor<i32>,
        weights: &Tensor<f32>,
        m: &MoeDims,
    ) -> Result<(), ForwardError> {
        let r = kernels::moe::router::run_router_softmax_group_topk(
            &self.launcher,
            logits,
            idx,
            weights,
            kernels::moe::router::SoftmaxRouterParams {
                n_group: m.n_group,
                topk_group: m.topk_group,
                norm_topk_prob: m.norm_topk_prob,
                routed_scaling_factor: m.routed_scaling_factor as f32,
            },
        );
        self.book_report("moe.router", r)
    }

    /// Gathers the rows of `x` each expert needs, grouped by expert.
    pub fn moe_dispatch(
        &mut self,
        x: &Tensor<f32>,
        rows: &Tensor<i32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let xe = self.mem.act(rows.rows(), x.cols());
        let r = kernels::moe::dispatch::run_moe_dispatch(&self.launcher, x, rows, &xe);
        self.book_report("moe.dispatch", r)?;
        Ok(xe)
    }

    /// Per-expert `y = x · w[e]ᵀ` over the dispatched rows.
    pub fn grouped_linear(
        &mut self,
        op: &str,
        x: &Tensor<f32>,
        w: &Weight,
        offsets: &Tensor<i32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = self.mem.act(x.rows(), w.out_features());
        if let Weight::Mxfp4 { .. } = w {
            // A swappable operator: the DSL prototype or the hand-tuned kernel, one launch each.
            use kernels::moe::grouped as g;
            let dsl = |l: &Launcher| {
                let mut launches = g::run_grouped_linear_weight(l, x, w, offsets, &y)?;
                let (_, report) = launches.pop().expect("one MXFP4 launch");
                Ok(Launch {
                    report,
                    trace: None,
                })
            };
            let hand = |l: &Launcher| g::run_grouped_linear_mxfp4_hand(l, x, w, offsets, &y);
            let (name, r) = self.run_implementation(
                MXFP4_GROUPED_OP,
                &[
                    (g::grouped_linear_mxfp4::META.name, &dsl),
                    (
                        kernels::hand_tuned::expert_gemm_mxfp4::GROUPED_META.name,
                        &hand,
                    ),
                ],
            );
            *self.picks.entry((MXFP4_GROUPED_OP, name)).or_default() += 1;
            self.book_report(op, r.map(|l| l.report))?;
            return Ok(y);
        }
        match kernels::moe::grouped::run_grouped_linear_weight(&self.launcher, x, w, offsets, &y) {
            Ok(launches) => {
                for (kernel, r) in launches {
                    self.book_report(&Self::op_of(op, kernel, true), Ok(r))?;
                }
            }
            Err(e) => self.book_report(op, Err(e))?,
        }
        Ok(y)
    }

    /// `out[t] = base[t] + Σ_j weights[t, j] · ye[slot_of[t, j]]`.
    pub fn moe_combine(
        &mut self,
        ye: &Tensor<f32>,
        slot_of: &Tensor<i32>,
        weights: &Tensor<f32>,
        base: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let out = self.mem.act(base.rows(), base.cols());
        let r = kernels::moe::dispatch::run_moe_combine(
            &self.launcher,
            ye,
            slot_of,
            weights,
            base,
            &out,
        );
        self.book_report("moe.combine", r)?;
        Ok(out)
    }

    /// Token embedding lookup.
    pub fn embedding(
        &mut self,
        ids: &[i32],
        table: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let out = self.mem.act(ids.len(), table.cols());
        let r = kernels::embedding::run_embedding(&self.launcher, ids, table, &out);
        self.book("embedding", r)?;
        Ok(out)
    }
}

impl Ops {
    /// DSA lightning-indexer scores `[T, pages·P]` of the `T` newest tokens over a context of
    /// `ctx` tokens (`−∞` after each token's position).
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_scores(
        &mut self,
        q_idx: &Tensor<f32>,
        head_w: &Tensor<f32>,
        key_pool: &CacheTensor,
        block_table: &Tensor<i32>,
        ctx: usize,
        ix: &IndexerDims,
    ) -> Result<Tensor<f32>, ForwardError> {
        let page = key_pool.shape().get(1).copied().unwrap_or(1);
        let scores = self.mem.act_f32(q_idx.rows(), ctx.div_ceil(page) * page);
        // The tiles of the kernel that reads this pool's format.
        let meta = match key_pool {
            CacheTensor::Fp8(_) => &fp8_kv::indexer_prefill_fp8::META,
            _ => &sparse::indexer_prefill::META,
        };
        let r = kernels::tile_choice::cover(
            meta,
            // Query blocks as tall as the step (up to 64): each key tile loaded serves them all.
            &Config::new()
                .with(
                    "BQ",
                    kernels::tile_choice::covering(meta, "BQ", q_idx.rows(), 64).unwrap_or(16),
                )
                .with(
                    "BK",
                    kernels::tile_choice::covering(meta, "BK", page, page as i64).unwrap_or(16),
                ),
            &[("DI", ix.head_dim, "index_head_dim")],
        )
        .and_then(|cfg| match key_pool {
            CacheTensor::Fp8(k8) => fp8_kv::indexer_prefill_fp8::launch::<f32, bf16>(
                &self.launcher,
                &cfg,
                q_idx,
                head_w,
                &k8.codes,
                &k8.scales,
                block_table,
                &scores,
                ctx,
                (ix.head_dim as f32).powf(-0.5),
            ),
            _ => on_cache!(key_pool, key_pool => sparse::indexer_prefill::launch(
                &self.launcher,
                &cfg,
                q_idx,
                head_w,
                key_pool,
                block_table,
                &scores,
                ctx,
                (ix.head_dim as f32).powf(-0.5),
            )),
        });
        self.book_sequence("indexer.scores", r)?;
        Ok(scores)
    }

    /// The `topk` best causal keys of each score row, best first (`[T, K]`, `K ≥ topk` the
    /// kernel's smallest declared width that holds them).
    pub fn topk_select(
        &mut self,
        scores: &Tensor<f32>,
        ctx: usize,
        topk: usize,
    ) -> Result<Tensor<i32>, ForwardError> {
        let k = self.topk_width(&sparse::topk_select::META, topk)?;
        let selected = self.mem.poisoned::<i32>(&[scores.rows(), k as usize]);
        let cfg = Config::new().with("K", k).with("C", 256);
        let r = sparse::topk_select::launch(&self.launcher, &cfg, scores, &selected, ctx);
        self.book_sequence("indexer.topk", r)?;
        self.record_or_replay_selection(selected)
    }

    /// The top-k kernel's selection width: its smallest declared `K` that holds `topk`.
    fn topk_width(&self, meta: &dsl_core::KernelMeta, topk: usize) -> Result<i64, ForwardError> {
        meta.smallest_fitting("K", topk, "index_topk")
            .map_err(|source| ForwardError::Kernel {
                op: "indexer.topk".into(),
                layer: self.layer,
                source,
            })
    }

    /// Records a DSA selection for the layer (functional runs that record routing), or hands back
    /// the one a replay recorded instead of `selected`.
    fn record_or_replay_selection(
        &mut self,
        selected: Tensor<i32>,
    ) -> Result<Tensor<i32>, ForwardError> {
        let layer = self.layer.unwrap_or(usize::MAX);
        if let (Some(v), Some(l)) = (selected.to_vec(), self.routing.recorded_layer(layer)) {
            l.selected = Some(v.iter().map(|x| *x as i32).collect());
        }
        // A replay hands the sparse attention the selection the functional run made.
        if let Some(v) = self
            .routing
            .replayed_layer(layer)
            .and_then(|l| l.selected.as_ref())
        {
            return Tensor::from_indices(selected.shape(), v).map_err(|message| {
                ForwardError::Workload {
                    flag: "--routing replay:FILE".into(),
                    message: format!(
                        "layer {layer}, step {}: the recorded selection does not fit the indexer's output {:?} ({message})",
                        self.routing.step,
                        selected.shape()
                    ),
                }
            });
        }
        Ok(selected)
    }

    /// Absorbed sparse MLA: queries `[T, H, R + rd]` over the selected rows of the latent pool;
    /// returns `[T, H, R]`.
    #[allow(clippy::too_many_arguments)]
    pub fn sparse_mla(
        &mut self,
        q: &Tensor<f32>,
        pool: &CacheTensor,
        block_table: &Tensor<i32>,
        selected: &Tensor<i32>,
        ctx: usize,
        topk: usize,
        latent_dim: usize,
        scale: f64,
    ) -> Result<Tensor<f32>, ForwardError> {
        let (t, heads, d) = (q.shape()[0], q.shape()[1], q.shape()[2]);
        let o = self.mem.act_shaped(&[t, heads, latent_dim]);
        let meta = match pool {
            CacheTensor::Fp8(_) => &fp8_kv::sparse_mla_fp8::META,
            _ => &sparse::sparse_mla::META,
        };
        let r = first_fitting_in_place(&self.launcher, sparse_tiles(heads), |launcher, tiles| {
            let cfg = sparse_attention_config(meta, tiles, d, latent_dim)?;
            match pool {
                CacheTensor::Fp8(p8) => fp8_kv::sparse_mla_fp8::launch::<f32, bf16>(
                    launcher,
                    &cfg,
                    q,
                    &p8.codes,
                    &token_scales(p8)?,
                    block_table,
                    selected,
                    &o,
                    ctx,
                    topk,
                    scale as f32,
                ),
                _ => on_cache!(pool, pool => sparse::sparse_mla::launch(
                    launcher,
                    &cfg,
                    q,
                    pool,
                    block_table,
                    selected,
                    &o,
                    ctx,
                    topk,
                    scale as f32,
                )),
            }
        });
        self.book_sequence("mla.sparse_attention", r)?;
        Ok(o)
    }

    /// Indexer scores of one decode token of each of `S` sequences in one launch
    /// ([`sparse::indexer_decode_batch`]): `q_idx [S, Hi, Di]`, `head_w [S, Hi, 1]`, block
    /// tables `[S, T]`, lengths `[S]`; returns `[S, T·page]` (`−∞` past each length).
    #[allow(clippy::too_many_arguments)]
    pub fn indexer_scores_batch(
        &mut self,
        q_idx: &Tensor<f32>,
        head_w: &Tensor<f32>,
        key_pool: &CacheTensor,
        block_tables: &Tensor<i32>,
        ctx_lens: &Tensor<i32>,
        max_ctx: usize,
        ix: &IndexerDims,
    ) -> Result<Tensor<f32>, ForwardError> {
        let meta = match key_pool {
            CacheTensor::Fp8(_) => &fp8_kv::indexer_decode_batch_fp8::META,
            _ => &sparse::indexer_decode_batch::META,
        };
        let page = key_pool.shape().get(1).copied().unwrap_or(1);
        let scores = self
            .mem
            .poisoned::<f32>(&[q_idx.shape()[0], block_tables.cols() * page]);
        let bk = kernels::tile_choice::covering(meta, "BK", page, page as i64).unwrap_or(16);
        let r = kernels::tile_choice::cover(
            meta,
            &Config::new().with("BK", bk),
            &[
                ("HI", ix.heads, "index_n_heads"),
                ("DI", ix.head_dim, "index_head_dim"),
            ],
        )
        .and_then(|cfg| match key_pool {
            CacheTensor::Fp8(k8) => fp8_kv::indexer_decode_batch_fp8::launch::<f32, bf16>(
                &self.launcher,
                &cfg,
                q_idx,
                head_w,
                &k8.codes,
                &k8.scales,
                block_tables,
                ctx_lens,
                &scores,
                max_ctx,
                (ix.head_dim as f32).powf(-0.5),
            ),
            _ => on_cache!(key_pool, key_pool => sparse::indexer_decode_batch::launch(
                &self.launcher,
                &cfg,
                q_idx,
                head_w,
                key_pool,
                block_tables,
                ctx_lens,
                &scores,
                max_ctx,
                (ix.head_dim as f32).powf(-0.5),
            )),
        });
        self.book("indexer.scores", r)?;
        Ok(scores)
    }

    /// The `topk` best keys of each sequence's score row within its length (`[S, K]`), one
    /// launch ([`sparse::topk_select_batch`]); recorded and replayed as [`Self::topk_select`].
    pub fn topk_select_batch(
        &mut self,
        scores: &Tensor<f32>,
        ctx_lens: &Tensor<i32>,
        max_ctx: usize,
        topk: usize,
    ) -> Result<Tensor<i32>, ForwardError> {
        let k = self.topk_width(&sparse::topk_select_batch::META, topk)?;
        let selected = self.mem.poisoned::<i32>(&[scores.rows(), k as usize]);
        let cfg = Config::new().with("K", k).with("C", 256);
        let r = sparse::topk_select_batch::launch(
            &self.launcher,
            &cfg,
            scores,
            &selected,
            ctx_lens,
            max_ctx,
        );
        self.book("indexer.topk", r)?;
        self.record_or_replay_selection(selected)
    }

    /// Absorbed sparse MLA for one decode token of each of `S` sequences in one launch
    /// ([`sparse::sparse_mla_batch`]): queries `[S, H, R + rd]`; returns `[S, H, R]`.
    #[allow(clippy::too_many_arguments)]
    pub fn sparse_mla_batch(
        &mut self,
        q: &Tensor<f32>,
        pool: &CacheTensor,
        block_tables: &Tensor<i32>,
        ctx_lens: &Tensor<i32>,
        selected: &Tensor<i32>,
        max_ctx: usize,
        topk: usize,
        latent_dim: usize,
        scale: f64,
    ) -> Result<Tensor<f32>, ForwardError> {
        let (s, heads, d) = (q.shape()[0], q.shape()[1], q.shape()[2]);
        let o = self.mem.act_shaped(&[s, heads, latent_dim]);
        let meta = match pool {
            CacheTensor::Fp8(_) => &fp8_kv::sparse_mla_batch_fp8::META,
            _ => &sparse::sparse_mla_batch::META,
        };
        // A small batch fills the cores only in 16-head blocks: the faster of those that fit.
        let r = fastest_fitting(&self.launcher, sparse_tiles(heads), |launcher, tiles| {
            let cfg = sparse_attention_config(meta, tiles, d, latent_dim)?;
            match pool {
                CacheTensor::Fp8(p8) => fp8_kv::sparse_mla_batch_fp8::launch::<f32, bf16>(
                    launcher,
                    &cfg,
                    q,
                    &p8.codes,
                    &token_scales(p8)?,
                    block_tables,
                    ctx_lens,
                    selected,
                    &o,
                    max_ctx,
                    topk,
                    scale as f32,
                ),
                _ => on_cache!(pool, pool => sparse::sparse_mla_batch::launch(
                    launcher,
                    &cfg,
                    q,
                    pool,
                    block_tables,
                    ctx_lens,
                    selected,
                    &o,
                    max_ctx,
                    topk,
                    scale as f32,
                )),
            }
        });
        self.book("mla.sparse_attention", r)?;
        Ok(o)
    }
}

/// An FP8 latent pool's scales as one row per token (`[pages, P, 1]`), as the sparse FP8 kernels
/// gather them.
fn token_scales(p8: &Fp8Tensors) -> Result<Tensor<f32>, SimError> {
    p8.token_scales().map_err(|message| SimError::Launch {
        kernel: "latent pool".into(),
        message,
    })
}

/// The sparse attention's (query heads `BH`, gathered rows `BK`) in the order the forward tries
/// them: 64-head blocks first, the matrix unit's full fragment height on H100-class cores (a
/// 16-head block fills a quarter of it, and every block of a token gathers the token's rows
/// again), as FlashMLA's sparse kernels take 64 heads per warpgroup; smaller ones where a core's
/// on-chip memory does not hold them.
const SPARSE_TILES: [(i64, i64); 4] = [(64, 64), (64, 32), (16, 64), (16, 32)];

/// [`SPARSE_TILES`] for `heads` query heads: 64-head blocks only where more than 16 heads fill
/// them (a tensor-parallel shard of 16 heads or fewer would pad them).
fn sparse_tiles(heads: usize) -> Vec<(i64, i64)> {
    SPARSE_TILES
        .into_iter()
        .filter(|(bh, _)| *bh <= 16 || heads > 16)
        .collect()
}

/// The sparse attention's configuration: `(BH, BK)` from [`SPARSE_TILES`], `BD`/`BDV` covering the
/// latent row and its value part.
fn sparse_attention_config(
    meta: &dsl_core::KernelMeta,
    (bh, bk): (i64, i64),
    d: usize,
    latent_dim: usize,
) -> Result<Config, dsl_core::SimError> {
    kernels::tile_choice::cover(
        meta,
        &Config::new().with("BH", bh).with("BK", bk),
        &[
            ("BD", d, "kv_lora_rank + qk_rope_head_dim"),
            ("BDV", latent_dim, "kv_lora_rank"),
        ],
    )
}

/// cos/sin tables for a block of positions (`[T, rot_dim/2]` each) and how to apply them.
pub(crate) struct RopeTables {
    pub cos: Tensor<f32>,
    pub sin: Tensor<f32>,
    pub rot_dim: usize,
    pub interleaved: bool,
}

impl RopeTables {
    /// Tables for `positions` from precomputed inverse frequencies; shape-only in `mem`'s
    /// cost-only runs (an 8K-token prefill's tables cost more host time than some launches).
    pub fn new(
        mem: Mem,
        positions: &[usize],
        inv_freq: &[f64],
        attention_factor: f64,
        interleaved: bool,
    ) -> Result<RopeTables, ForwardError> {
        if mem.shape_only {
            let shape = [positions.len(), inv_freq.len()];
            return Ok(RopeTables {
                cos: Tensor::shape_only(&shape),
                sin: Tensor::shape_only(&shape),
                rot_dim: 2 * shape[1],
                interleaved,
            });
        }
        let (c, s) = kernels::rope::cos_sin(positions, inv_freq, attention_factor);
        RopeTables::from_cos_sin(positions.len(), inv_freq.len(), &c, &s, interleaved)
    }

    /// Tables from `cos` and `sin` values of `tokens` rows of `pairs` rotated pairs each
    /// (row-major): the one constructor the 1D, multi-axis and vision tables share.
    pub fn from_cos_sin(
        tokens: usize,
        pairs: usize,
        cos: &[f32],
        sin: &[f32],
        interleaved: bool,
    ) -> Result<RopeTables, ForwardError> {
        let shape = [tokens, pairs];
        Ok(RopeTables {
            cos: view(Tensor::from_f32(&shape, cos), "rope cos table")?,
            sin: view(Tensor::from_f32(&shape, sin), "rope sin table")?,
            rot_dim: 2 * shape[1],
            interleaved,
        })
    }
}
