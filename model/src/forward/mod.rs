//! The numeric forward pass on the simulator: a checkpoint directory (config.json + safetensors)
//! in, logits out, every operator a DSL kernel launch ([`ops`]) — embedding, norms, projections,
//! RoPE, attention, router, expert dispatch/GEMMs/combine, lm_head — with the simulated cycles of
//! each booked per operator ([`OpStats`]).
//!
//! A [`Runner`] serves sequences: [`Runner::forward`] appends tokens (a prompt, then one token per
//! decode step) to sequence 0's caches and returns their logits, [`Runner::forward_batch`] steps
//! several sequences at once; every sequence's caches and states live in the runner's paged pools
//! and state slots ([`sequences`]). [`Runner::generate`] is greedy generation on top. Everything runs in f32 so results can be compared with transformers' f32
//! forward to 1e-4.

pub mod cache_format;
mod cards;
mod ffn;
mod gated_attention;
mod kda;
mod linear_attention;
mod mla;
pub mod multimodal;
pub mod ops;
mod params;
pub mod routing;
mod sequences;
pub mod validate;
pub mod vision;

pub use cache_format::CacheFormat;
pub use cards::{greedy_steps, run_on_cards, CardRun};
pub use multimodal::PromptImages;
pub use ops::{OpStats, Traffic};
pub use sequences::PoolUsage;

use crate::config::{load_config, AttentionKind, FfnKind, ModelConfig, ModelError, RopeScaling};
use crate::weights::{Checkpoint, WeightError};
use dsl_core::{Launcher, SimError, Tensor};
use ops::{MoeParts, Ops, RopeTables};
use params::{AttnWeights, FfnWeights, ModelWeights};
use sequences::{LayerStore, SequenceStore};
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

/// Why a forward pass could not run.
#[derive(Debug)]
pub enum ForwardError {
    /// config.json could not be read or is invalid.
    Config(ModelError),
    /// A tensor is missing, misshapen or unreadable.
    Weights(WeightError),
    /// A kernel launch failed.
    Kernel {
        /// The operator (`mla.q_b_proj`, `moe.router`...).
        op: String,
        /// The layer, if inside one.
        layer: Option<usize>,
        /// The simulator's error.
        source: SimError,
    },
    /// The model needs something the numeric forward does not run yet.
    Unsupported {
        /// What, in words.
        what: String,
    },
    /// A token id outside the vocabulary.
    Token {
        /// Position in the input.
        position: usize,
        /// The id.
        id: i64,
        /// Vocabulary size.
        vocab: usize,
    },
    /// More tokens than the runner's cache holds.
    Capacity {
        /// Tokens the call needs in total.
        needed: usize,
        /// Tokens the caches were sized for.
        capacity: usize,
    },
    /// A workload the run cannot take (a replay that does not fit the run, a bad routing spec):
    /// the flag to change and why.
    Workload {
        /// The command-line flag (or option) at fault.
        flag: String,
        /// What is wrong and what would fix it.
        message: String,
    },
    /// An internal shape/view inconsistency (a bug in day0, reported instead of a panic).
    Internal {
        /// What was being built.
        what: String,
        /// The view error.
        message: String,
    },
}

impl fmt::Display for ForwardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForwardError::Config(e) => write!(f, "{e}"),
            ForwardError::Weights(e) => write!(f, "{e}"),
            ForwardError::Kernel { op, layer, source } => match layer {
                Some(l) => write!(f, "layer {l}, operator {op}: {source}"),
                None => write!(f, "operator {op}: {source}"),
            },
            ForwardError::Unsupported { what } => write!(
                f,
                "not supported by the numeric forward yet: {what} (day0 coverage --config lists what each operator needs)"
            ),
            ForwardError::Token { position, id, vocab } => write!(
                f,
                "token {id} at position {position} is outside the vocabulary (0..{vocab})"
            ),
            ForwardError::Capacity { needed, capacity } => write!(
                f,
                "the sequence needs {needed} cache slots but the runner holds {capacity}; create it with a larger capacity"
            ),
            ForwardError::Workload { flag, message } => write!(f, "{flag}: {message}"),
            ForwardError::Internal { what, message } => {
                write!(f, "internal error building {what}: {message}")
            }
        }
    }
}

impl std::error::Error for ForwardError {}

impl From<ModelError> for ForwardError {
    fn from(e: ModelError) -> Self {
        ForwardError::Config(e)
    }
}

impl From<WeightError> for ForwardError {
    fn from(e: WeightError) -> Self {
        ForwardError::Weights(e)
    }
}

/// The logits of one [`Runner::forward`] call.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// `[tokens, vocab]`, row-major.
    pub logits: Vec<f32>,
    /// Rows.
    pub tokens: usize,
    /// Columns.
    pub vocab: usize,
    /// With [`Runner::capture_hidden`]: `hidden_states[0]` is the embedding output and
    /// `hidden_states[l + 1]` the output of decoder layer `l` (before the final norm), each
    /// `[tokens, hidden]` — what transformers' `output_hidden_states` returns before its last
    /// entry (which has the final norm applied).
    pub hidden_states: Vec<Vec<f32>>,
}

impl StepOutput {
    /// Row `t` of the logits.
    pub fn row(&self, t: usize) -> &[f32] {
        &self.logits[t * self.vocab..(t + 1) * self.vocab]
    }
}

/// Greedy generation's results.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The prompt's logits.
    pub prompt: StepOutput,
    /// The generated token ids.
    pub tokens: Vec<i32>,
    /// The logits each generated token was chosen from (`[vocab]` each; the first is the prompt's
    /// last row).
    pub step_logits: Vec<Vec<f32>>,
    /// Simulated cost of the prompt (prefill).
    pub prefill: OpStats,
    /// Simulated cost of all decode steps.
    pub decode: OpStats,
}

/// The simulated cost of one sequence's prefill and decode ([`Runner::cost_run`]).
#[derive(Debug, Clone)]
pub struct CostRun {
    /// The prompt, up to the first output token (time to first token).
    pub prefill: OpStats,
    /// Every decode step after it.
    pub decode: OpStats,
    /// How many decode steps `decode` holds.
    pub decode_steps: usize,
    /// `prefill` by layer kind (`"<attention>+<ffn>"`, e.g. `mla+moe`), plus `head` for what runs
    /// outside the decoder layers (embedding, final norm, `lm_head`).
    pub prefill_by_kind: BTreeMap<String, OpStats>,
    /// `decode` by layer kind, as `prefill_by_kind`.
    pub decode_by_kind: BTreeMap<String, OpStats>,
}

/// Index of the largest value; the first one on ties (as `torch.argmax`).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

fn internal(what: &str) -> ForwardError {
    ForwardError::Internal {
        what: what.to_string(),
        message: "inconsistent with the config".into(),
    }
}

/// The precision a forward holds its projection weights in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// Every weight in f32 (the reference path the transformers goldens check at 1e-4).
    #[default]
    F32,
    /// The checkpoint's own formats: block-FP8 or bf16 projections and FP8/MXFP4/bf16 routed
    /// experts, each read by the kernel for its format (W8A8 FP8 GEMMs where the matrix unit
    /// has an FP8 mode). Activations are held in bf16 between kernels ([`Precision::activations`])
    /// and computed on in f32, rounded to the weight's compute type on chip. Functional runs of
    /// float checkpoints hold the weights in bf16.
    Native,
}

impl Precision {
    /// The format activations are held in between kernels: f32 on the reference path, bf16 at
    /// native precision (as a bf16 deployment holds them; kernels load them and compute in f32).
    pub fn activations(self) -> dsl_core::accel_sim::DType {
        match self {
            Precision::F32 => dsl_core::accel_sim::DType::F32,
            Precision::Native => dsl_core::accel_sim::DType::Bf16,
        }
    }

    /// The format its KV pools hold: f32 on the reference path, bf16 at native precision
    /// ([`cache_format`]).
    pub fn cache_format(self) -> CacheFormat {
        match self {
            Precision::F32 => CacheFormat::F32,
            Precision::Native => CacheFormat::Bf16,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Precision, String> {
        match s {
            "f32" => Ok(Precision::F32),
            "native" => Ok(Precision::Native),
            other => Err(format!(
                "unknown precision `{other}`: expected `f32` or `native`"
            )),
        }
    }
}

/// One model on the simulator, serving one sequence (sequence 0, [`Runner::forward`]) or several
/// in one step ([`Runner::add_sequence`], [`Runner::forward_batch`]), their caches and states in
/// shared pools ([`sequences`]): sequences come and go ([`Runner::release_sequence`]) within the
/// pools' fixed size ([`Runner::serve`]).
pub struct Runner {
    cfg: ModelConfig,
    weights: ModelWeights,
    ops: Ops,
    /// Every layer's paged pool or state slots, and who owns what.
    store: SequenceStore,
    /// Tokens one sequence may hold (the positions its rotary tables cover).
    capacity: usize,
    inv_freq: Vec<f64>,
    attention_factor: f64,
    interleaved: bool,
    capture: bool,
    memoise: bool,
    blocks: Blocks,
    last_layers: Vec<LayerCost>,
    /// The vision encoder of a multimodal checkpoint that holds one.
    vision_weights: Option<multimodal::VisionBank>,
    /// Images the next step places ([`Runner::forward_with_images`]).
    step_images: Option<multimodal::StepImages>,
    /// Per sequence, the offset of its rotary positions after a prompt with images.
    rope_deltas: BTreeMap<usize, i64>,
}

/// One sequence's part of a batched step: which sequence, where its tokens start, how many, and
/// its first row in the step's rows.
#[derive(Debug, Clone, Copy)]
struct Part {
    seq: usize,
    pos0: usize,
    tokens: usize,
    row0: usize,
}

/// MLA's softmax scale: `qk_head_dim^-1/2`, times YaRN's mscale² when the rope scaling says so.
fn mla_scale(cfg: &ModelConfig, m: &crate::config::MlaDims) -> f64 {
    cfg.rope
        .as_ref()
        .map(|r| r.mla_softmax_scale(m.qk_head_dim()))
        .unwrap_or((m.qk_head_dim() as f64).powf(-0.5))
}

/// Which blocks of each decoder layer a cost-only step runs. The cluster planner prices attention
/// and routed experts at different token counts (a card's own batch, and the tokens expert
/// parallelism routes to it), so it runs each block alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Blocks {
    /// The input norm and the attention block.
    pub attention: bool,
    /// The post-attention norm, the dense MLP or the MoE block's router and shared experts, and
    /// the residual adds.
    pub ffn: bool,
    /// Within a MoE block, the routed experts (dispatch, expert GEMMs, combine). With `ffn` and
    /// without these, a MoE block runs its router and shared experts only; without `ffn` and
    /// with these, only the routed experts run, on the layer's input rows (the planner prices
    /// them at the rows expert parallelism sends a card, where the rest would be wasted work),
    /// and a shape-only run skips the embedding, final norm and `lm_head` too, returning empty
    /// logits ([`Blocks::routed_only`]).
    pub routed_experts: bool,
}

impl Blocks {
    /// Every block (every functional run).
    pub const ALL: Blocks = Blocks {
        attention: true,
        ffn: true,
        routed_experts: true,
    };

    /// Only the routed experts: a planner's expert-parallel card role, whose embedding, final
    /// norm and `lm_head` nobody reads (the main role's are the card's), so a shape-only run
    /// skips them.
    pub fn routed_only(self) -> bool {
        self.routed_experts && !self.attention && !self.ffn
    }
}

/// The cost of one decoder layer in the last step, by block.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerCost {
    /// The input norm and the attention block.
    pub attention: OpStats,
    /// The post-attention norm, the feed-forward block and the residual adds.
    pub ffn: OpStats,
}

fn rope_params(cfg: &ModelConfig) -> Result<kernels::rope::RopeScalingParams, ForwardError> {
    use kernels::rope::RopeScalingParams as P;
    let Some(r) = &cfg.rope else {
        return Ok(P::None);
    };
    Ok(match &r.scaling {
        RopeScaling::None => P::None,
        RopeScaling::Linear { factor } => P::Linear { factor: *factor },
        RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            truncate,
        } => P::Yarn {
            factor: *factor,
            original_max_position_embeddings: *original_max_position_embeddings,
            beta_fast: *beta_fast,
            beta_slow: *beta_slow,
            mscale: *mscale,
            mscale_all_dim: *mscale_all_dim,
            truncate: *truncate,
        },
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => P::Llama3 {
            factor: *factor,
            low_freq_factor: *low_freq_factor,
            high_freq_factor: *high_freq_factor,
            original_max_position_embeddings: *original_max_position_embeddings,
        },
        other => {
            return Err(ForwardError::Unsupported {
                what: format!("rope scaling {other:?}"),
            })
        }
    })
}

impl Runner {
    /// Opens `dir` (config.json + safetensors), binds the weights and sizes the caches for
    /// `capacity` tokens.
    pub fn load(dir: &Path, launcher: Launcher, capacity: usize) -> Result<Runner, ForwardError> {
        Runner::load_at(dir, launcher, capacity, Precision::F32)
    }

    /// [`Runner::load`] with the weights held at `precision`.
    pub fn load_at(
        dir: &Path,
        launcher: Launcher,
        capacity: usize,
        precision: Precision,
    ) -> Result<Runner, ForwardError> {
        let cfg = load_config(&dir.join("config.json"))?;
        let ckpt = Checkpoint::open(dir)?;
        Runner::with_precision(cfg, &ckpt, launcher, capacity, precision)
    }

    /// A runner for an already parsed config and opened checkpoint.
    pub fn new(
        cfg: ModelConfig,
        ckpt: &Checkpoint,
        launcher: Launcher,
        capacity: usize,
    ) -> Result<Runner, ForwardError> {
        Runner::with_precision(cfg, ckpt, launcher, capacity, Precision::F32)
    }

    /// [`Runner::new`] with the weights held at `precision`.
    pub fn with_precision(
        cfg: ModelConfig,
        ckpt: &Checkpoint,
        launcher: Launcher,
        capacity: usize,
        precision: Precision,
    ) -> Result<Runner, ForwardError> {
        let weights = ModelWeights::load(&cfg, Some(ckpt), precision)?;
        // A multimodal checkpoint's encoder, when it holds one (a language-only extraction runs
        // text; images then say what is missing).
        let vision_weights = match &cfg.vision {
            Some(v)
                if ckpt.contains(&format!("{}patch_embed.proj.weight", vision::WEIGHT_PREFIX)) =>
            {
                Some(multimodal::VisionBank::load(ckpt, v, precision)?)
            }
            _ => None,
        };
        let mut runner = Runner::with_weights(cfg, weights, launcher, capacity, precision)?;
        runner.vision_weights = vision_weights;
        Ok(runner)
    }

    /// A cost-only runner from the configuration alone: shape-only weights and caches, every
    /// launch cost-only — the same forward code at sizes that could not be materialised (a
    /// trillion-parameter model on one simulated device). Logits and hidden states come back
    /// empty; token ids are only counted.
    ///
    /// Weights are in the checkpoint's formats ([`Precision::Native`]), what a deployment reads;
    /// [`Runner::cost_only_at`] takes another precision.
    pub fn cost_only(
        cfg: ModelConfig,
        launcher: Launcher,
        capacity: usize,
    ) -> Result<Runner, ForwardError> {
        Runner::cost_only_at(cfg, launcher, capacity, Precision::Native)
    }

    /// [`Runner::cost_only`] with the weights held at `precision`.
    pub fn cost_only_at(
        cfg: ModelConfig,
        launcher: Launcher,
        capacity: usize,
        precision: Precision,
    ) -> Result<Runner, ForwardError> {
        let launcher = launcher.with_backend(dsl_core::Backend::CostOnly);
        // A launch memo times each distinct launch once, across layers and steps; a launcher that
        // brings its own (shared by an estimator's runners) keeps it.
        let launcher = match launcher.memo {
            Some(_) => launcher,
            None => launcher.with_memo(true),
        };
        let weights = ModelWeights::load(&cfg, None, precision)?;
        Runner::with_weights(cfg, weights, launcher, capacity, precision)
    }

    fn with_weights(
        cfg: ModelConfig,
        weights: ModelWeights,
        launcher: Launcher,
        capacity: usize,
        precision: Precision,
    ) -> Result<Runner, ForwardError> {
        let mem = ops::Mem::new(&launcher, precision.cache_format(), precision.activations());
        // One sequence (sequence 0) of `capacity` tokens until `serve` sizes the pools for more.
        let mut store = SequenceStore::new(&cfg, mem, &launcher, 1, capacity)?;
        store.admit(&launcher)?;
        let theta = cfg.rope.as_ref().map(|r| r.theta).unwrap_or(10000.0);
        // DeepSeek rotates the qk_rope_head_dim part of each head (pairs interleaved when
        // configured); Qwen3-Next the first partial_rotary_factor of each head, half-split.
        let (rot_dim, interleaved) = match (&cfg.mla, &cfg.gqa) {
            (Some(m), _) => (m.qk_rope_head_dim, m.rope_interleave),
            (None, Some(g)) => {
                let f = cfg
                    .rope
                    .as_ref()
                    .map(|r| r.partial_rotary_factor)
                    .unwrap_or(1.0);
                ((g.head_dim as f64 * f) as usize, g.rope_interleaved)
            }
            (None, None) => (0, false),
        };
        let scaling = rope_params(&cfg)?;
        let inv_freq = kernels::rope::inv_freq(rot_dim, theta, &scaling);
        let attention_factor = kernels::rope::attention_factor(&scaling);
        Ok(Runner {
            cfg,
            weights,
            ops: Ops::new(launcher, mem),
            store,
            capacity,
            inv_freq,
            attention_factor,
            interleaved,
            capture: false,
            memoise: true,
            blocks: Blocks::ALL,
            last_layers: Vec::new(),
            vision_weights: None,
            step_images: None,
            rope_deltas: BTreeMap::new(),
        })
    }

    /// The parsed config.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// The element format of its KV pools: f32 on the reference path, bf16 at native precision,
    /// or what [`Runner::set_kv_cache`] chose.
    pub fn cache_format(&self) -> CacheFormat {
        self.ops.mem.cache
    }

    /// Holds the KV pools in `format` from now on (`--kv-dtype`): [`CacheFormat::Fp8`] stores
    /// every pool (the MLA latent, dense or sparse, DSA indexer keys, GQA keys and values) as
    /// E4M3 codes with a scale per token and cached row (see [`cache_format`]). The pools
    /// are made afresh at their current sizes, so no sequence may hold a token yet.
    pub fn set_kv_cache(&mut self, format: CacheFormat) -> Result<(), ForwardError> {
        if format == self.ops.mem.cache {
            return Ok(());
        }
        self.require_empty_pools(
            "--kv-dtype",
            "choose the cache format before any token is run",
        )?;
        self.ops.mem.cache = format;
        let (sequences, tokens) = self.store.sizes();
        self.serve(sequences, tokens)
    }

    /// An error naming `flag` (with `fix`) when any sequence holds a token: the pools can only be
    /// remade empty.
    fn require_empty_pools(&self, flag: &str, fix: &str) -> Result<(), ForwardError> {
        let usage = self.store.usage();
        if usage.tokens > 0 {
            return Err(ForwardError::Workload {
                flag: flag.into(),
                message: format!(
                    "the pools hold {} tokens of {} sequences; {fix}",
                    usage.tokens, usage.sequences
                ),
            });
        }
        Ok(())
    }

    /// The device the kernels run on.
    pub fn device(&self) -> &dsl_core::DevicePreset {
        &self.ops.launcher.preset
    }

    /// Cycles and launches booked so far.
    pub fn stats(&self) -> &OpStats {
        &self.ops.stats
    }

    /// Tokens in sequence 0's caches (0 once it is released).
    pub fn position(&self) -> usize {
        self.store.len(0).unwrap_or(0)
    }

    /// Sizes the pools for up to `max_sequences` live sequences sharing `pool_tokens` tokens of
    /// cache pages in every attention layer (each sequence still holds at most the runner's
    /// capacity). Allowed while no sequence holds a token; sequence 0 is admitted again, empty,
    /// and later ids continue from 1.
    pub fn serve(&mut self, max_sequences: usize, pool_tokens: usize) -> Result<(), ForwardError> {
        self.require_empty_pools(
            "serve",
            "resize them before any token is run, or release every sequence first",
        )?;
        if max_sequences == 0 {
            return Err(ForwardError::Workload {
                flag: "serve".into(),
                message: "a runner serves at least one sequence".into(),
            });
        }
        let mut store = SequenceStore::new(
            &self.cfg,
            self.ops.mem,
            &self.ops.launcher,
            max_sequences,
            pool_tokens,
        )?;
        store.admit(&self.ops.launcher)?;
        self.store = store;
        self.rope_deltas.clear();
        Ok(())
    }

    /// Admits a new, empty sequence (a state slot, zeroed on the device, and an empty block
    /// table) and returns its id, for [`Runner::forward_batch`]. Sequence 0 is the runner's own;
    /// ids are never reused. Fails when every slot is taken.
    pub fn add_sequence(&mut self) -> Result<usize, ForwardError> {
        let (id, reports) = self.store.admit(&self.ops.launcher)?;
        for report in reports {
            self.ops.book_report("state_slots.zero", Ok(report))?;
        }
        Ok(id)
    }

    /// Ends sequence `seq`: its cache pages and its state slot return to the pools.
    pub fn release_sequence(&mut self, seq: usize) -> Result<(), ForwardError> {
        self.rope_deltas.remove(&seq);
        self.store.release(seq)
    }

    /// Tokens in sequence `seq`'s caches (`None` for a sequence that is not live).
    pub fn sequence_position(&self, seq: usize) -> Option<usize> {
        self.store.len(seq)
    }

    /// How full the pools are: live sequences, tokens, pages and state slots in use.
    pub fn pool_usage(&self) -> PoolUsage {
        self.store.usage()
    }

    /// Checks the pools' bookkeeping (every page and slot free or owned by exactly one live
    /// sequence, both allocators agreeing on who is live); `Err` names what is broken.
    pub fn audit_pools(&self) -> Result<(), String> {
        self.store.audit()
    }

    /// Whether a cost-only runner times one layer of each kind per step and books its cost for the
    /// others (on by default; the totals are the same, which a test checks).
    pub fn memoise_layers(&mut self, on: bool) {
        self.memoise = on;
    }

    /// Whether cost-only launches go through a launch memo (on by default for cost-only runners:
    /// a launch that cannot be told apart from one already simulated books that one's report; see
    /// `dsl_core::memo`). Off simulates every launch; a test checks the reports are identical.
    pub fn memoise_launches(&mut self, on: bool) {
        let launcher = self.ops.launcher.clone();
        self.ops.launcher = launcher.with_memo(on);
    }

    /// How cost-only steps choose experts and DSA selections (see [`routing::RoutingModel`]). A
    /// replay must come from this model, and the run's steps must be the recorded ones; it turns
    /// the layer memo off (each layer replays its own choices).
    pub fn set_routing(&mut self, model: routing::RoutingModel) -> Result<(), ForwardError> {
        if let Some(rec) = model.record() {
            let here = routing::RecordedModel::of(&self.cfg);
            if rec.model != here {
                return Err(ForwardError::Workload {
                    flag: "--routing replay:FILE".into(),
                    message: format!(
                        "the recording is of another model ({:?}), not this one ({here:?}); record it with this config's checkpoint",
                        rec.model
                    ),
                });
            }
        }
        self.ops.routing.model = model;
        Ok(())
    }

    /// Starts recording, step by step, the router's choices and the DSA indexer's selections of
    /// a functional run ([`Runner::take_recording`] returns them).
    pub fn record_routing(&mut self) {
        self.ops.routing.recording = Some(routing::RoutingRecord {
            model: routing::RecordedModel::of(&self.cfg),
            steps: Vec::new(),
        });
    }

    /// The recording started by [`Runner::record_routing`], with every step run since.
    pub fn take_recording(&mut self) -> Option<routing::RoutingRecord> {
        self.ops.routing.recording.take()
    }

    /// Cost-only runners: the expert load of every MoE layer run so far: (step, load). Layers the
    /// layer memo booked without running are not listed (they repeat one that is). Functional
    /// runners keep none (a serving runner would otherwise grow with every step).
    pub fn expert_loads(&self) -> &[(usize, routing::ExpertLoad)] {
        &self.ops.routing.loads
    }

    /// Steps run so far.
    pub fn steps(&self) -> usize {
        self.ops.routing.step
    }

    /// (launches answered from the launch memo, launches simulated into it).
    pub fn memo_counts(&self) -> (u64, u64) {
        self.ops.launcher.memo_counts()
    }

    /// Cost-only runners: the next step's tokens sit at `position` (a chunk of a longer prompt,
    /// or a decode step deep in a context) without running the tokens before it. A shape-only
    /// cache holds nothing a step could read, so its cost is that of the real step.
    pub fn seek(&mut self, position: usize) -> Result<(), ForwardError> {
        if !self.ops.mem.shape_only {
            return Err(ForwardError::Unsupported {
                what: "seeking a runner that holds data (only cost-only runners can skip tokens)"
                    .into(),
            });
        }
        if position > self.capacity {
            return Err(ForwardError::Capacity {
                needed: position,
                capacity: self.capacity,
            });
        }
        // Sequence 0's pages cover the skipped tokens (bookkeeping only: nothing is stored).
        let len = self.store.len(0).ok_or_else(|| ForwardError::Workload {
            flag: "seek".into(),
            message: "sequence 0 was released".into(),
        })?;
        if position < len {
            self.store.truncate(0, position);
            Ok(())
        } else {
            self.store.extend(0, position - len)
        }
    }

    /// Cost-only runners: run only some blocks of each layer (see [`Blocks`]).
    pub fn run_blocks(&mut self, blocks: Blocks) -> Result<(), ForwardError> {
        if !self.ops.mem.shape_only && blocks != Blocks::ALL {
            return Err(ForwardError::Unsupported {
                what: "skipping blocks on a runner that holds data".into(),
            });
        }
        self.blocks = blocks;
        Ok(())
    }

    /// Pins the implementation of operator `op` (a registry operator the forward can swap, see
    /// [`ops::SWAPPABLE`]) to `implementation`, e.g. `attention_decode_batch` →
    /// `paged_decode_hand`: the one-line swap of a DSL prototype for its hand-tuned kernel, or
    /// back. Unpinned, each launch runs the fastest verified implementation at its shapes
    /// ([`Runner::implementation_picks`] counts which ran). Anything else is an error naming
    /// `--impl`.
    pub fn set_implementation(
        &mut self,
        op: &str,
        implementation: &str,
    ) -> Result<(), ForwardError> {
        let name = ops::swap_choice(op, implementation)?;
        self.ops.impls.insert(op.to_string(), name);
        Ok(())
    }

    /// Launches so far per (swappable operator, implementation that ran); a cost-only run's
    /// memoised layers book their first layer's launches without choosing again, uncounted.
    pub fn implementation_picks(&self) -> &BTreeMap<(&'static str, &'static str), u64> {
        &self.ops.picks
    }

    /// Cost-only runners: each later step of `t` tokens is `t` sequences decoding one token each
    /// at the runner's position (a decode batch of equal contexts), not a `t`-token chunk of one
    /// sequence. MLA and GQA attention, the linear-attention recurrences (GDN, KDA) and their
    /// short convolutions then run the whole batch in one launch (each sequence's cache pages and
    /// state in its own block, as a batched kernel lays them out); the other per-sequence
    /// operators still run as one chunk and are booked per-sequence ([`OpStats::per_sequence`]),
    /// for the planner to price once per sequence.
    pub fn batch_decode(&mut self, on: bool) -> Result<(), ForwardError> {
        if on && !self.ops.mem.shape_only {
            return Err(ForwardError::Unsupported {
                what: "a batched decode on a runner that holds data (cost-only runners only)"
                    .into(),
            });
        }
        self.ops.batched_decode = on;
        Ok(())
    }

    /// Per decoder layer, the cost of the last step by block.
    pub fn last_layers(&self) -> &[LayerCost] {
        &self.last_layers
    }

    /// Whether [`Runner::forward`] returns the per-layer hidden states.
    pub fn capture_hidden(&mut self, on: bool) {
        self.capture = on;
    }

    /// Runs `tokens` (at positions `position() ..`) through the model, appending to the caches, and
    /// returns their logits.
    pub fn forward(&mut self, tokens: &[i64]) -> Result<StepOutput, ForwardError> {
        let mut out = self.forward_batch(&[(0, tokens)])?;
        out.pop().ok_or_else(|| internal("a step's output"))
    }

    /// One step of several sequences at once, as continuous batching runs them: each entry is a
    /// sequence id (0, or one from [`Runner::add_sequence`]) and its new tokens, a prefill chunk
    /// or one decode token, at that sequence's own position. Norms, projections of the
    /// feed-forward block and the experts run once over every sequence's rows; attention runs
    /// each sequence over its own cache or state. Returns each sequence's logits, in order
    /// (hidden states are captured for a one-sequence step only).
    pub fn forward_batch(
        &mut self,
        batch: &[(usize, &[i64])],
    ) -> Result<Vec<StepOutput>, ForwardError> {
        let vocab = self.cfg.vocab_size;
        let mut ids = Vec::new();
        let mut parts = Vec::with_capacity(batch.len());
        for (i, (seq, tokens)) in batch.iter().enumerate() {
            let pos0 = self
                .sequence_position(*seq)
                .ok_or_else(|| ForwardError::Workload {
                    flag: "batch".into(),
                    message: format!(
                        "entry {i} names sequence {seq}, which is not live (admit one with \
                     add_sequence)"
                    ),
                })?;
            if batch[..i].iter().any(|(s, _)| s == seq) {
                return Err(ForwardError::Workload {
                    flag: "batch".into(),
                    message: format!("sequence {seq} appears twice in one step"),
                });
            }
            for (position, &id) in tokens.iter().enumerate() {
                if id < 0 || id as usize >= vocab {
                    return Err(ForwardError::Token {
                        position,
                        id,
                        vocab,
                    });
                }
                ids.push(id as i32);
            }
            let t = tokens.len();
            if t == 0 {
                return Err(ForwardError::Unsupported {
                    what: "an empty token list".into(),
                });
            }
            if pos0 + t > self.capacity {
                return Err(ForwardError::Capacity {
                    needed: pos0 + t,
                    capacity: self.capacity,
                });
            }
            let row0 = parts.last().map_or(0, |p: &Part| p.row0 + p.tokens);
            parts.push(Part {
                seq: *seq,
                pos0,
                tokens: t,
                row0,
            });
        }
        if parts.is_empty() {
            return Err(ForwardError::Unsupported {
                what: "an empty batch".into(),
            });
        }
        let (t, pos0) = (ids.len(), parts[0].pos0);
        // A cost-only replay embeds the recorded ids (its own are placeholders).
        if let Some(step) = self.ops.routing.replayed_step(pos0, t)? {
            if self.ops.mem.shape_only && step.ids.len() == t {
                ids.clone_from(&step.ids);
            }
        }
        if let Some(rec) = &mut self.ops.routing.recording {
            rec.steps.push(routing::RecordedStep {
                position: pos0,
                tokens: t,
                ids: ids.clone(),
                layers: Vec::new(),
            });
        }
        // Pages for every sequence's new tokens, all or nothing; a step that fails gives them
        // back (its rows in the pools are garbage that later tokens overwrite).
        for (i, p) in parts.iter().enumerate() {
            if let Err(e) = self.store.extend(p.seq, p.tokens) {
                for q in &parts[..i] {
                    self.store.truncate(q.seq, q.pos0);
                }
                return Err(e);
            }
        }
        let out = self.forward_step(&ids, &parts);
        if out.is_err() {
            for p in &parts {
                self.store.truncate(p.seq, p.pos0);
            }
        }
        self.ops.routing.step += 1;
        out
    }

    fn forward_step(
        &mut self,
        ids: &[i32],
        parts: &[Part],
    ) -> Result<Vec<StepOutput>, ForwardError> {
        let (t, vocab) = (ids.len(), self.cfg.vocab_size);
        let eps = self.cfg.rms_norm_eps;
        // Each sequence's rotary tables at its own positions; the DSA indexer rotates half-split
        // whatever the MLA layout is.
        let mut ropes = Vec::with_capacity(parts.len());
        let images = self.step_images.take();
        let section = self.cfg.rope.as_ref().and_then(|r| r.mrope_section);
        for p in parts {
            let positions: Vec<usize> = (p.pos0..p.pos0 + p.tokens)
                .map(|i| self.rope_position(p.seq, i))
                .collect();
            let rope = match (&images, section) {
                // A prompt with images: its tokens' own multi-axis positions.
                (Some(im), Some(section)) => RopeTables::multi_axis(
                    &im.positions,
                    &self.inv_freq,
                    section,
                    self.attention_factor,
                )?,
                _ => self.rope_tables(&positions, self.interleaved)?,
            };
            let half = self.rope_tables(&positions, false)?;
            ropes.push((rope, half));
        }
        let single = parts.len() == 1;
        let capture = self.capture && single;
        let pages = parts
            .iter()
            .map(|p| self.store.seq_pages(p.seq))
            .collect::<Result<Vec<_>, _>>()?;
        let mut hidden_states = Vec::new();

        self.ops.layer = None;
        let skip_ends = self.ops.mem.shape_only && self.blocks.routed_only();
        let mut h = if skip_ends {
            self.ops.mem.act(t, self.cfg.hidden_size)
        } else {
            self.ops.embedding(ids, &self.weights.embed)?
        };
        if let Some(im) = &images {
            self.ops
                .scatter_rows("vision.image_tokens", &im.tokens, &im.rows, &h, false)?;
        }
        if capture {
            hidden_states.push(h.to_vec().unwrap_or_default());
        }
        // Cost-only memo: layers of the same kinds launch the same kernels on the same shapes, so
        // one is timed and the others book its cost (a shape-only run carries no data that could
        // tell them apart).
        let mut memo: std::collections::BTreeMap<(AttentionKind, FfnKind), LayerCost> =
            Default::default();
        // A replay gives each layer its own choices, so no layer stands for another.
        let memoise =
            self.ops.mem.shape_only && self.memoise && self.ops.routing.model.record().is_none();
        let blocks = self.blocks;
        self.ops.sequence_scope = false;
        self.ops.moe_parts = match (blocks.ffn, blocks.routed_experts) {
            (true, false) => MoeParts::OwnTokens,
            (false, true) => MoeParts::RoutedOnly,
            _ => MoeParts::All,
        };
        self.last_layers.clear();
        for (l, lw) in self.weights.layers.iter().enumerate() {
            self.ops.layer = Some(l);
            let spec = &self.cfg.layers[l];
            let kinds = (spec.attention.clone(), spec.ffn.clone());
            if memoise {
                if let Some(cost) = memo.get(&kinds) {
                    self.ops.stats.add(&cost.attention);
                    self.ops.stats.add(&cost.ffn);
                    self.last_layers.push(cost.clone());
                    continue;
                }
            }
            let layer_start = self.ops.stats.clone();
            let n = if blocks.attention {
                self.ops
                    .rmsnorm("input_layernorm", &h, &lw.input_norm, eps)?
            } else {
                h.clone()
            };
            // Attention: each sequence over its own cache or state, on its own rows.
            let a = if !blocks.attention {
                n
            } else {
                let mut outs: Vec<Option<Tensor<f32>>> = vec![None; parts.len()];
                // MLA (dense and sparse) and GQA: the step's single-token decodes attend in one
                // launch per kernel.
                let batchable = matches!(lw.attn, AttnWeights::Mla(_) | AttnWeights::Gqa(_));
                let decodes: Vec<usize> =
                    (0..parts.len()).filter(|&i| parts[i].tokens == 1).collect();
                if batchable && decodes.len() > 1 {
                    let rows: Vec<i32> = decodes.iter().map(|&i| parts[i].row0 as i32).collect();
                    let x = if rows.windows(2).all(|w| w[1] == w[0] + 1) {
                        ops::view(n.row_range(rows[0] as usize, rows.len()), "decode rows")?
                    } else {
                        self.ops.gather_rows("attention.batch_rows", &n, &rows)?
                    };
                    let positions: Vec<usize> = decodes
                        .iter()
                        .map(|&i| self.rope_position(parts[i].seq, parts[i].pos0))
                        .collect();
                    let rope = self.rope_tables(&positions, self.interleaved)?;
                    let seqs: Vec<sequences::SeqRows> = decodes
                        .iter()
                        .enumerate()
                        .map(|(j, &i)| sequences::SeqRows {
                            row0: j,
                            rows: 1,
                            pos0: parts[i].pos0,
                            pages: &pages[i],
                        })
                        .collect();
                    let o = match (&lw.attn, &self.store.layers[l]) {
                        (AttnWeights::Mla(w), LayerStore::Latent(pool)) => {
                            let m = self.cfg.mla.as_ref().ok_or_else(|| internal("MLA dims"))?;
                            let scale = mla_scale(&self.cfg, m);
                            match (&spec.attention, &self.cfg.indexer) {
                                (AttentionKind::SparseMla, Some(ix)) => {
                                    // The indexer rotates half-split whatever the MLA layout is.
                                    let rope_half = self.rope_tables(&positions, false)?;
                                    mla::forward_sparse_decodes(
                                        &mut self.ops,
                                        m,
                                        ix,
                                        w,
                                        &x,
                                        &seqs,
                                        pool,
                                        &rope,
                                        &rope_half,
                                        scale,
                                    )?
                                }
                                _ => mla::forward(
                                    &mut self.ops,
                                    m,
                                    w,
                                    &x,
                                    &seqs,
                                    pool,
                                    &rope,
                                    scale,
                                )?,
                            }
                        }
                        (AttnWeights::Gqa(w), LayerStore::Kv(pool)) => {
                            let g = self.cfg.gqa.as_ref().ok_or_else(|| internal("GQA dims"))?;
                            gated_attention::forward(
                                &mut self.ops,
                                g,
                                w,
                                &x,
                                &seqs,
                                pool,
                                &rope,
                                eps,
                                &self.cfg.layers[l].attention,
                            )?
                        }
                        _ => {
                            return Err(internal("a layer's weights and cache of different kinds"))
                        }
                    };
                    for (j, &i) in decodes.iter().enumerate() {
                        outs[i] = Some(ops::view(o.row_range(j, 1), "a decode row")?);
                    }
                }
                for (((p, (rope, rope_half)), pages), out) in
                    parts.iter().zip(&ropes).zip(&pages).zip(outs.iter_mut())
                {
                    if out.is_some() {
                        continue;
                    }
                    let n_p = if single {
                        n.clone()
                    } else {
                        ops::view(n.row_range(p.row0, p.tokens), "a sequence's rows")?
                    };
                    let pos0 = p.pos0;
                    // This sequence's rows, for the layers that also take several sequences.
                    let one = [sequences::SeqRows {
                        row0: 0,
                        rows: p.tokens,
                        pos0,
                        pages,
                    }];
                    let a_p = match (&lw.attn, &self.store.layers[l]) {
                        (AttnWeights::Gqa(w), LayerStore::Kv(pool)) => {
                            let g = self
                                .cfg
                                .gqa
                                .as_ref()
                                .ok_or_else(|| internal("attention dims"))?;
                            gated_attention::forward(
                                &mut self.ops,
                                g,
                                w,
                                &n_p,
                                &one,
                                pool,
                                rope,
                                eps,
                                &self.cfg.layers[l].attention,
                            )?
                        }
                        (AttnWeights::Linear(w), LayerStore::Linear(li)) => {
                            let la = self
                                .cfg
                                .linear_attention
                                .as_ref()
                                .ok_or_else(|| internal("linear-attention dims"))?;
                            let st = linear_attention::LinearState::of_slot(
                                self.store.state(p.seq, *li)?,
                            );
                            linear_attention::forward(&mut self.ops, la, w, &n_p, &st, eps)?
                        }
                        (AttnWeights::Kda(w), LayerStore::Linear(li)) => {
                            let la = self
                                .cfg
                                .linear_attention
                                .as_ref()
                                .ok_or_else(|| internal("linear-attention dims"))?;
                            let st = linear_attention::LinearState::of_slot(
                                self.store.state(p.seq, *li)?,
                            );
                            kda::forward(&mut self.ops, la, w, &n_p, &st, eps)?
                        }
                        (AttnWeights::Mla(w), LayerStore::Latent(pool)) => {
                            let m =
                                self.cfg
                                    .mla
                                    .as_ref()
                                    .ok_or_else(|| ForwardError::Internal {
                                        what: "MLA layer".into(),
                                        message: "no MLA dims".into(),
                                    })?;
                            let scale = mla_scale(&self.cfg, m);
                            match (&self.cfg.layers[l].attention, &self.cfg.indexer) {
                                (AttentionKind::SparseMla, Some(ix)) => mla::forward_sparse(
                                    &mut self.ops,
                                    m,
                                    ix,
                                    w,
                                    &n_p,
                                    pos0,
                                    pool,
                                    pages,
                                    rope,
                                    rope_half,
                                    scale,
                                )?,
                                _ => mla::forward(
                                    &mut self.ops,
                                    m,
                                    w,
                                    &n_p,
                                    &one,
                                    pool,
                                    rope,
                                    scale,
                                )?,
                            }
                        }
                        _ => {
                            return Err(internal("a layer's weights and cache of different kinds"))
                        }
                    };
                    *out = Some(a_p);
                }
                let outs = outs
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| internal("a sequence's attention output"))?;
                if single {
                    outs.into_iter()
                        .next()
                        .ok_or_else(|| internal("the attention output"))?
                } else {
                    // The sequences' rows back in one tensor, for the batched blocks after.
                    let all = self.ops.mem.act(t, outs[0].cols());
                    for (p, a_p) in parts.iter().zip(&outs) {
                        let rows = ops::view(all.row_range(p.row0, p.tokens), "a sequence's rows")?;
                        self.ops.copy("attention.batch_rows", a_p, &rows)?;
                    }
                    all
                }
            };
            // A tensor-parallel card holds its heads' share of the output projection: the
            // replica's cards sum their partial outputs.
            let a = if blocks.attention {
                self.ops.tp_all_reduce("attention.all_reduce", a)?
            } else {
                a
            };
            let attention_done = self.ops.stats.clone();
            if !blocks.ffn && blocks.routed_experts {
                if let (FfnWeights::Moe(w), Some(m)) = (&lw.ffn, self.cfg.moe.as_ref()) {
                    ffn::moe(&mut self.ops, m, w, &a)?;
                }
            }
            if !blocks.ffn {
                self.last_layers.push(LayerCost {
                    attention: attention_done.since(&layer_start),
                    ffn: self.ops.stats.since(&attention_done),
                });
                if memoise {
                    memo.insert(kinds, self.last_layers[l].clone());
                }
                continue;
            }
            let (h1, n2) = self.ops.add_rmsnorm(
                "post_attention_layernorm",
                &a,
                &h,
                &lw.post_attn_norm,
                eps,
            )?;
            let f = match &lw.ffn {
                FfnWeights::Dense(w) => ffn::mlp(&mut self.ops, "mlp", w, &n2)?,
                FfnWeights::Moe(w) => {
                    let m = self
                        .cfg
                        .moe
                        .as_ref()
                        .ok_or_else(|| ForwardError::Internal {
                            what: "MoE layer".into(),
                            message: "no MoE dims".into(),
                        })?;
                    ffn::moe(&mut self.ops, m, w, &n2)?
                }
            };
            let f = self.ops.tp_all_reduce("ffn.all_reduce", f)?;
            h = self.ops.add("residual_add", &h1, &f)?;
            if capture {
                hidden_states.push(h.to_vec().unwrap_or_default());
            }
            let cost = LayerCost {
                attention: attention_done.since(&layer_start),
                ffn: self.ops.stats.since(&attention_done),
            };
            if memoise {
                memo.insert(kinds, cost.clone());
            }
            self.last_layers.push(cost);
            // DeepStack: the features of encoder block `deepstack_visual_indexes[l]` join the
            // image rows after language layer `l` (the layer's own output, captured above, is
            // what transformers reports for it; the add is booked apart from the layer's blocks).
            if let Some(im) = &images {
                if let Some(feature) = im.deepstack.get(l) {
                    self.ops
                        .scatter_rows("vision.deepstack", feature, &im.rows, &h, true)?;
                }
            }
        }
        self.ops.layer = None;
        // A routed-experts role's head is nobody's: it books no launch and has no logits (nor
        // has any shape-only run).
        let logits = if skip_ends {
            Vec::new()
        } else {
            let n = self
                .ops
                .rmsnorm("final_norm", &h, &self.weights.final_norm, eps)?;
            // A cost-only run of one sequence prices what serving computes: the next token's
            // logits only (the goldens of functional runs need every row; a batch computes every
            // row).
            let last_only = self.ops.mem.shape_only && single;
            let n = if last_only {
                ops::view(n.row_range(t - 1, 1), "last row")?
            } else {
                n
            };
            let logits = self.ops.linear("lm_head", &n, &self.weights.lm_head)?;
            logits.to_vec().unwrap_or_default()
        };
        if single {
            return Ok(vec![StepOutput {
                logits,
                tokens: t,
                vocab,
                hidden_states,
            }]);
        }
        Ok(parts
            .iter()
            .map(|p| StepOutput {
                logits: logits
                    .get(p.row0 * vocab..(p.row0 + p.tokens) * vocab)
                    .map(<[f32]>::to_vec)
                    .unwrap_or_default(),
                tokens: p.tokens,
                vocab,
                hidden_states: Vec::new(),
            })
            .collect())
    }

    /// The simulated cost of serving one sequence on a cost-only runner ([`Runner::cost_only`]): a
    /// prompt of `prompt_len` tokens (the prefill, up to the first output token), then
    /// `output_len − 1` decode steps, each one token at the next position. Token ids do not change
    /// the cost of a shape-only run; they are all 0.
    pub fn cost_run(
        &mut self,
        prompt_len: usize,
        output_len: usize,
    ) -> Result<CostRun, ForwardError> {
        if !self.ops.mem.shape_only {
            return Err(ForwardError::Unsupported {
                what: "a cost run on a runner that holds weights (use Runner::cost_only)".into(),
            });
        }
        let before = self.ops.stats.clone();
        self.forward(&vec![0; prompt_len])?;
        let prefill = self.ops.stats.since(&before);
        let prefill_by_kind = self.by_layer_kind(&prefill);
        let after_prefill = self.ops.stats.clone();
        let steps = output_len.saturating_sub(1);
        let mut decode_by_kind: BTreeMap<String, OpStats> = BTreeMap::new();
        for _ in 0..steps {
            let step_start = self.ops.stats.clone();
            self.forward(&[0])?;
            let step = self.ops.stats.since(&step_start);
            for (k, s) in self.by_layer_kind(&step) {
                decode_by_kind.entry(k).or_default().add(&s);
            }
        }
        Ok(CostRun {
            prefill,
            decode: self.ops.stats.since(&after_prefill),
            decode_steps: steps,
            prefill_by_kind,
            decode_by_kind,
        })
    }

    /// The last step's cost (`step`) split by layer kind: each decoder layer's blocks under its
    /// `"<attention>+<ffn>"` kind, and the rest of the step under `head`.
    fn by_layer_kind(&self, step: &OpStats) -> BTreeMap<String, OpStats> {
        let mut out: BTreeMap<String, OpStats> = BTreeMap::new();
        let mut layers = OpStats::default();
        for (spec, cost) in self.cfg.layers.iter().zip(&self.last_layers) {
            let e = out.entry(spec.kind()).or_default();
            e.add(&cost.attention);
            e.add(&cost.ffn);
            layers.add(&cost.attention);
            layers.add(&cost.ffn);
        }
        out.insert("head".into(), step.since(&layers));
        out
    }

    /// Greedy generation: runs the prompt, then `n` tokens, each the argmax of the previous logits.
    pub fn generate(&mut self, prompt: &[i64], n: usize) -> Result<Generation, ForwardError> {
        let before = self.ops.stats.clone();
        let out = self.forward(prompt)?;
        let prefill = self.ops.stats.since(&before);
        self.decode_greedy(out, prefill, n)
    }

    /// `n` greedy tokens after a prompt whose logits are `out` and cost `prefill`.
    fn decode_greedy(
        &mut self,
        out: StepOutput,
        prefill: OpStats,
        n: usize,
    ) -> Result<Generation, ForwardError> {
        let mut step_logits = vec![out.row(out.tokens - 1).to_vec()];
        let mut tokens = Vec::with_capacity(n);
        let after_prefill = self.ops.stats.clone();
        while tokens.len() < n {
            let last = step_logits.last().map(|l| argmax(l)).unwrap_or(0) as i32;
            tokens.push(last);
            if tokens.len() == n {
                break;
            }
            let step = self.forward(&[last as i64])?;
            step_logits.push(step.row(0).to_vec());
        }
        Ok(Generation {
            prompt: out,
            tokens,
            step_logits,
            prefill,
            decode: self.ops.stats.since(&after_prefill),
        })
    }
}
