//! Data-dependent work in cost-only runs: which experts each token's router picks and which past
//! tokens a DSA indexer selects.
//!
//! A functional run computes both; a cost-only run has shape-only router and indexer outputs, so
//! it needs a model of them ([`RoutingModel`]): uniform (balanced experts, the usual serving
//! assumption), Zipf-skewed experts, or a replay of what a functional run recorded
//! ([`RoutingRecord`], `day0 forward --record-routing FILE`). With a replay, the cost-only run
//! launches exactly what the functional run launched, so its cycles equal the functional run's.

use super::ForwardError;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// Which model a recording belongs to: a replay into another model is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedModel {
    /// `model_type` of the config.
    pub model_type: String,
    /// Decoder layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Routed experts (0 without MoE).
    pub experts: usize,
    /// Experts per token (0 without MoE).
    pub experts_per_token: usize,
    /// DSA `index_topk` (0 without an indexer).
    pub index_topk: usize,
}

impl RecordedModel {
    /// The fingerprint of `cfg`.
    pub fn of(cfg: &crate::config::ModelConfig) -> RecordedModel {
        RecordedModel {
            model_type: cfg.model_type.clone(),
            layers: cfg.num_layers(),
            hidden_size: cfg.hidden_size,
            experts: cfg.moe.as_ref().map_or(0, |m| m.experts),
            experts_per_token: cfg.moe.as_ref().map_or(0, |m| m.experts_per_token),
            index_topk: cfg.indexer.as_ref().map_or(0, |i| i.topk),
        }
    }
}

/// What one layer's data-dependent operators chose in one step.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedLayer {
    /// The decoder layer.
    pub layer: usize,
    /// Router choices, `[tokens, experts_per_token]` row-major (MoE layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experts: Option<Vec<i32>>,
    /// The indexer's selection as the top-k kernel wrote it, `[tokens, K]` row-major with `K` the
    /// kernel's width (DSA layers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected: Option<Vec<i32>>,
}

/// One forward step: its tokens, where they start, and what each layer chose.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedStep {
    /// Position of the step's first token.
    pub position: usize,
    /// Tokens in the step.
    pub tokens: usize,
    /// The token ids (the embedding gather reads them: repeated ids hit in L2).
    #[serde(default)]
    pub ids: Vec<i32>,
    /// The layers with data-dependent choices, in layer order.
    pub layers: Vec<RecordedLayer>,
}

/// Routing and selection recorded from a functional run, step by step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingRecord {
    /// The model it was recorded on.
    pub model: RecordedModel,
    /// The steps, in order: the prefill, then one per decode step.
    pub steps: Vec<RecordedStep>,
}

impl RoutingRecord {
    /// Reads a recording written by [`RoutingRecord::write`].
    pub fn read(path: &Path) -> Result<RoutingRecord, ForwardError> {
        let bad = |message: String| ForwardError::Workload {
            flag: "--routing replay:FILE".into(),
            message: format!("{}: {message}", path.display()),
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "not a routing recording ({e}); write one with `day0 forward --record-routing FILE`"
            ))
        })
    }

    /// Writes the recording as JSON.
    pub fn write(&self, path: &Path) -> Result<(), ForwardError> {
        let bad = |message: String| ForwardError::Workload {
            flag: "--record-routing".into(),
            message: format!("{}: {message}", path.display()),
        };
        let text = serde_json::to_string(self).map_err(|e| bad(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| bad(format!("cannot write: {e}")))
    }

    /// The prompt length (the first step's tokens) and output length (1 + the decode steps) the
    /// recording covers.
    pub fn workload(&self) -> (usize, usize) {
        (self.steps.first().map_or(0, |s| s.tokens), self.steps.len())
    }
}

/// How a cost-only run decides the data-dependent choices.
#[derive(Debug, Clone, PartialEq)]
pub enum RoutingModel {
    /// Token `t`'s `j`-th choice is expert `(t·k + j) mod E`: every expert gets `t·k/E` rows,
    /// rounded. The indexer's selection is the kernel's shape-only fallback.
    Uniform,
    /// Expert `e` is picked with probability ∝ `1/(e+1)^s` (expert 0 the most popular), by a
    /// deterministic low-discrepancy draw without repeats within a token.
    Zipf(f64),
    /// The choices a functional run recorded, step by step and layer by layer.
    Replay(Arc<RoutingRecord>),
}

impl RoutingModel {
    /// Parses `uniform`, `zipf:S` or `replay:FILE` (which reads the file).
    pub fn parse(spec: &str) -> Result<RoutingModel, ForwardError> {
        let bad = || {
            ForwardError::Workload {
            flag: "--routing".into(),
            message: format!(
                "`{spec}` is not `uniform`, `zipf:S` (S ≥ 0, e.g. zipf:1.0) or `replay:FILE` (a recording from `day0 forward --record-routing FILE`)"
            ),
        }
        };
        if let Some(file) = spec.strip_prefix("replay:") {
            if file.is_empty() {
                return Err(bad());
            }
            return Ok(RoutingModel::Replay(Arc::new(RoutingRecord::read(
                Path::new(file),
            )?)));
        }
        // The synthetic models are the planner's (one parser for both).
        use crate::plan::estimate::Routing;
        match Routing::parse(spec) {
            Ok(Routing::Uniform) => Ok(RoutingModel::Uniform),
            Ok(Routing::Zipf(s)) => Ok(RoutingModel::Zipf(s)),
            Err(_) => Err(bad()),
        }
    }

    /// The recording, when replaying.
    pub fn record(&self) -> Option<&RoutingRecord> {
        match self {
            RoutingModel::Replay(r) => Some(r),
            _ => None,
        }
    }
}

/// Router choices of `t` tokens over `e` experts, `k` each, under a synthetic model.
pub(crate) fn synthetic_choices(model: &RoutingModel, t: usize, k: usize, e: usize) -> Vec<i32> {
    match model {
        RoutingModel::Zipf(s) => zipf_choices(*s, t, k, e),
        _ => (0..t * k).map(|i| (i % e) as i32).collect(),
    }
}

/// Zipf-skewed choices: draw `u` from a golden-ratio sequence, invert the popularity CDF, and move
/// to the next unpicked expert on a repeat. Deterministic, so runs are reproducible.
fn zipf_choices(s: f64, t: usize, k: usize, e: usize) -> Vec<i32> {
    let weights: Vec<f64> = (0..e).map(|i| 1.0 / ((i + 1) as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut cdf = Vec::with_capacity(e);
    let mut acc = 0.0;
    for w in &weights {
        acc += w / total;
        cdf.push(acc);
    }
    const PHI: f64 = 0.618_033_988_749_894_9;
    let mut out = Vec::with_capacity(t * k);
    let mut picked = vec![false; e];
    for tok in 0..t {
        let start = out.len();
        for j in 0..k {
            let u = ((tok * k + j) as f64 * PHI + 0.5).fract();
            let mut x = cdf.partition_point(|c| *c < u).min(e - 1);
            while picked[x] {
                x = (x + 1) % e;
            }
            picked[x] = true;
            out.push(x as i32);
        }
        for &x in &out[start..] {
            picked[x as usize] = false;
        }
    }
    out
}

/// Tokens routed to each expert in one MoE layer of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertLoad {
    /// The most tokens any expert received.
    pub max_tokens: usize,
    /// Tokens per expert on average (`tokens · k / E`).
    pub mean_tokens: f64,
}

impl ExpertLoad {
    /// The load of router choices `sel` over `e` experts.
    pub fn of(sel: &[i32], e: usize) -> ExpertLoad {
        let mut counts = vec![0usize; e.max(1)];
        for &x in sel {
            if let Some(c) = counts.get_mut(x.max(0) as usize) {
                *c += 1;
            }
        }
        ExpertLoad {
            max_tokens: counts.iter().copied().max().unwrap_or(0),
            mean_tokens: sel.len() as f64 / e.max(1) as f64,
        }
    }

    /// `max / mean`: 1 for a perfectly balanced layer.
    pub fn imbalance(&self) -> f64 {
        if self.mean_tokens > 0.0 {
            self.max_tokens as f64 / self.mean_tokens
        } else {
            1.0
        }
    }
}

/// The routing state of a runner: the model it follows, what it records, and where it is.
#[derive(Debug, Clone)]
pub(crate) struct RoutingState {
    /// How cost-only steps choose.
    pub model: RoutingModel,
    /// The recording being written (functional runs with `--record-routing`).
    pub recording: Option<RoutingRecord>,
    /// Steps run so far (the index of the current step once it started).
    pub step: usize,
    /// Per MoE layer run, the step and the load it saw.
    pub loads: Vec<(usize, ExpertLoad)>,
}

impl RoutingState {
    /// Uniform routing, nothing recorded.
    pub fn new() -> RoutingState {
        RoutingState {
            model: RoutingModel::Uniform,
            recording: None,
            step: 0,
            loads: Vec::new(),
        }
    }

    /// The replayed step `step`, checked against the step being run.
    pub fn replayed_step(
        &self,
        position: usize,
        tokens: usize,
    ) -> Result<Option<&RecordedStep>, ForwardError> {
        let Some(rec) = self.model.record() else {
            return Ok(None);
        };
        let s = rec.steps.get(self.step).ok_or_else(|| ForwardError::Workload {
            flag: "--routing replay:FILE".into(),
            message: format!(
                "the run has more steps than the recording's {} (a prompt of {} tokens and {} output tokens); run with those lengths or record a longer run",
                rec.steps.len(),
                rec.workload().0,
                rec.workload().1
            ),
        })?;
        if s.position != position || s.tokens != tokens {
            return Err(ForwardError::Workload {
                flag: "--routing replay:FILE".into(),
                message: format!(
                    "step {} runs {tokens} token(s) at position {position}, but the recording's step ran {} at position {}: replay with the recorded prompt and output lengths ({} and {})",
                    self.step,
                    s.tokens,
                    s.position,
                    rec.workload().0,
                    rec.workload().1
                ),
            });
        }
        Ok(Some(s))
    }

    /// The recorded layer `layer` of the current step, when replaying.
    pub fn replayed_layer(&self, layer: usize) -> Option<&RecordedLayer> {
        self.model
            .record()?
            .steps
            .get(self.step)?
            .layers
            .iter()
            .find(|l| l.layer == layer)
    }

    /// The current step's entry for `layer` in the recording being written.
    pub fn recorded_layer(&mut self, layer: usize) -> Option<&mut RecordedLayer> {
        let rec = self.recording.as_mut()?;
        let step = rec.steps.last_mut()?;
        if step.layers.last().is_none_or(|l| l.layer != layer) {
            step.layers.push(RecordedLayer {
                layer,
                ..Default::default()
            });
        }
        step.layers.last_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_choices_are_distinct_per_token_and_skewed() {
        let (t, k, e) = (512, 8, 64);
        let sel = zipf_choices(1.0, t, k, e);
        for tok in sel.chunks(k) {
            let mut v = tok.to_vec();
            v.sort();
            v.dedup();
            assert_eq!(v.len(), k);
        }
        let load = ExpertLoad::of(&sel, e);
        assert!(load.imbalance() > 2.0, "{load:?}");
        let flat = ExpertLoad::of(&synthetic_choices(&RoutingModel::Uniform, t, k, e), e);
        assert_eq!(flat.max_tokens, t * k / e);
        assert_eq!(zipf_choices(1.0, t, k, e), sel);
        // s = 0 is uniform popularity: close to balanced.
        assert!(ExpertLoad::of(&zipf_choices(0.0, t, k, e), e).imbalance() < 1.3);
    }

    #[test]
    fn bad_specs_name_the_flag() {
        for s in ["", "zipf", "zipf:-1", "zipf:x", "replay:", "skewed"] {
            let e = RoutingModel::parse(s).unwrap_err().to_string();
            assert!(e.contains("--routing"), "{s}: {e}");
        }
        let e = RoutingModel::parse("replay:/no/such/file.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--routing replay:FILE") && e.contains("cannot read"),
            "{e}"
        );
    }
}
