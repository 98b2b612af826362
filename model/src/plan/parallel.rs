//! Parallel plans: how one phase (prefill or decode) of a model is split over a cluster's cards,
//! what each card holds, and the shard of the configuration each card role runs.
//!
//! A plan is `tp × dp × pp` cards:
//! - **tp** (tensor parallel) splits attention heads, the dense MLP and the shared experts
//!   column/row-wise; each layer's attention and dense MLP end in an all-reduce over the tp group;
//! - **dp** (attention data parallel) replicates the attention weights; each replica serves its own
//!   sequences;
//! - **pp** (pipeline parallel) splits the layers into consecutive stages;
//! - **ep** (expert parallel) splits the routed experts of each stage over `ep` of its `tp·dp`
//!   cards, round-robin (a card holds ⌈E / ep⌉ when ep does not divide E); tokens reach their
//!   experts through a dispatch all-to-all and return through a combine all-to-all. `ep` divides
//!   `tp·dp` (default: all of them) and is at most the expert count.

use crate::config::{AttentionKind, FfnKind, ModelConfig};
use std::fmt;

/// One phase's split of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Plan {
    /// Tensor-parallel degree.
    pub tp: usize,
    /// Attention data-parallel replicas.
    pub dp: usize,
    /// Pipeline stages.
    pub pp: usize,
    /// Expert-parallel degree (divides `tp·dp`).
    pub ep: usize,
}

/// A plan or workload the model or cluster cannot take: names the flag and what would fix it.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanError {
    /// The flag or field at fault (`--plan tp`, `--cards`, …).
    pub flag: String,
    /// What is wrong and what would fix it.
    pub message: String,
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.flag, self.message)
    }
}

impl std::error::Error for PlanError {}

fn err(flag: &str, message: String) -> PlanError {
    PlanError {
        flag: flag.to_string(),
        message,
    }
}

impl Plan {
    /// Cards the plan occupies.
    pub fn cards(&self) -> usize {
        self.tp * self.dp * self.pp
    }

    /// Parses `tp=1,ep=32,dp=32[,pp=1]`. Missing degrees default to 1, except `dp`, which fills
    /// `cards` when given, and `ep`, which defaults to `tp·dp`. `flag` names the option in errors.
    pub fn parse(spec: &str, cards: Option<usize>, flag: &str) -> Result<Plan, PlanError> {
        let (mut tp, mut dp, mut pp, mut ep) = (None, None, None, None);
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                err(
                    flag,
                    format!("`{part}` is not `name=value` (e.g. `tp=8,dp=4,ep=32`)"),
                )
            })?;
            let n: usize = v.trim().parse().ok().filter(|n| *n > 0).ok_or_else(|| {
                err(
                    flag,
                    format!("`{part}`: the degree must be a positive integer"),
                )
            })?;
            let slot = match k.trim() {
                "tp" => &mut tp,
                "dp" => &mut dp,
                "pp" => &mut pp,
                "ep" => &mut ep,
                other => {
                    return Err(err(
                        flag,
                        format!("unknown degree `{other}` (known: tp, dp, pp, ep)"),
                    ))
                }
            };
            *slot = Some(n);
        }
        let (tp, pp) = (tp.unwrap_or(1), pp.unwrap_or(1));
        let dp = match (dp, cards) {
            (Some(d), _) => d,
            (None, Some(c)) if c % (tp * pp) == 0 => c / (tp * pp),
            (None, Some(c)) => {
                return Err(err(
                    flag,
                    format!("tp·pp = {} does not divide the {c} cards", tp * pp),
                ))
            }
            (None, None) => 1,
        };
        let plan = Plan {
            tp,
            dp,
            pp,
            ep: ep.unwrap_or(tp * dp),
        };
        if let Some(c) = cards {
            if plan.cards() != c {
                return Err(err(
                    flag,
                    format!(
                        "tp·dp·pp = {}·{}·{} = {} cards, but {c} are deployed (--cards, --prefill-cards or --decode-cards)",
                        plan.tp,
                        plan.dp,
                        plan.pp,
                        plan.cards()
                    ),
                ));
            }
        }
        Ok(plan)
    }

    /// Checks the plan against the model: every degree must split what it splits evenly.
    pub fn validate(&self, cfg: &ModelConfig, flag: &str) -> Result<(), PlanError> {
        for (name, d) in [
            ("tp", self.tp),
            ("dp", self.dp),
            ("pp", self.pp),
            ("ep", self.ep),
        ] {
            if d == 0 {
                return Err(err(
                    &format!("{flag} {name}"),
                    format!("{name}=0: every degree is at least 1"),
                ));
            }
        }
        let tp = self.tp;
        let divides = |what: &str, n: usize| -> Result<(), PlanError> {
            if !n.is_multiple_of(tp) {
                return Err(err(
                    &format!("{flag} tp"),
                    format!("tp={tp} does not divide the {n} {what}; use a tp that divides {n}"),
                ));
            }
            Ok(())
        };
        let uses = |k: &dyn Fn(&AttentionKind) -> bool| cfg.layers.iter().any(|l| k(&l.attention));
        if let Some(m) = &cfg.mla {
            if uses(&|k| matches!(k, AttentionKind::Mla | AttentionKind::SparseMla)) {
                divides("MLA attention heads", m.heads)?;
            }
        }
        if let Some(g) = &cfg.gqa {
            if uses(&|k| k.is_gqa()) {
                divides("attention heads", g.heads)?;
                if g.kv_heads % tp != 0 && !tp.is_multiple_of(g.kv_heads) {
                    return Err(err(
                        &format!("{flag} tp"),
                        format!(
                            "tp={tp} neither divides nor is a multiple of the {} key/value heads",
                            g.kv_heads
                        ),
                    ));
                }
            }
        }
        if let Some(l) = &cfg.linear_attention {
            if uses(&|k| *k == AttentionKind::LinearAttention) {
                divides("linear-attention key heads", l.key_heads)?;
                divides("linear-attention value heads", l.value_heads)?;
            }
        }
        if let Some(d) = &cfg.dense_mlp {
            if cfg.layers.iter().any(|l| l.ffn == FfnKind::Dense) {
                divides("dense MLP intermediate columns", d.intermediate_size)?;
            }
        }
        if let Some(m) = &cfg.moe {
            if m.shared_intermediate_size > 0 {
                divides(
                    "shared-expert intermediate columns",
                    m.shared_intermediate_size,
                )?;
            }
            if self.ep > m.experts {
                return Err(err(
                    &format!("{flag} ep"),
                    format!(
                        "ep={} is more ranks than the {} routed experts; use ep ≤ {}",
                        self.ep, m.experts, m.experts
                    ),
                ));
            }
        }
        if !(self.tp * self.dp).is_multiple_of(self.ep) {
            return Err(err(
                &format!("{flag} ep"),
                format!(
                    "ep={} must divide the tp·dp = {} cards of a pipeline stage",
                    self.ep,
                    self.tp * self.dp
                ),
            ));
        }
        if self.pp > cfg.num_layers() {
            return Err(err(
                &format!("{flag} pp"),
                format!(
                    "pp={} is more stages than the model's {} layers",
                    self.pp,
                    cfg.num_layers()
                ),
            ));
        }
        Ok(())
    }

    /// The layers of pipeline stage `s` (contiguous; the first `layers % pp` stages take one more).
    pub fn stage_layers(&self, layers: usize, s: usize) -> std::ops::Range<usize> {
        let pp = self.pp.max(1);
        let (base, extra) = (layers / pp, layers % pp);
        let start = s * base + s.min(extra);
        start..start + base + usize::from(s < extra)
    }

    /// The configuration one card of this plan runs: heads, intermediate columns and shared
    /// experts divided by `tp` (a DSA indexer whole on every card, as DeepSeek-V3.2's reference
    /// code and `forward::cards` hold it), routed experts by `ep` (the most loaded card's
    /// ⌈E / ep⌉; routed with group limits off: a card sees only its own experts, which the
    /// planner feeds at the routed token count).
    pub fn shard(&self, cfg: &ModelConfig) -> ModelConfig {
        let mut c = tensor_parallel_shard(cfg, self.tp);
        if let Some(m) = &mut c.moe {
            // Experts are placed round-robin: the most loaded card holds ⌈E / ep⌉.
            m.experts = m.experts.div_ceil(self.ep);
            m.experts_per_token = m.experts_per_token.min(m.experts);
            m.n_group = 1;
            m.topk_group = 1;
        }
        c
    }
}

/// `cfg` with what tensor parallelism over `tp` cards splits divided: attention heads (MLA, GQA
/// query heads and key/value heads down to one, linear-attention key and value heads), the dense
/// MLP's and the shared experts' intermediate columns. Routed experts and a DSA indexer are left
/// whole (the caller decides how they are placed).
pub fn tensor_parallel_shard(cfg: &ModelConfig, tp: usize) -> ModelConfig {
    let mut c = cfg.clone();
    if let Some(m) = &mut c.mla {
        m.heads /= tp;
    }
    if let Some(g) = &mut c.gqa {
        g.heads /= tp;
        g.kv_heads = (g.kv_heads / tp).max(1);
    }
    if let Some(l) = &mut c.linear_attention {
        l.key_heads /= tp;
        l.value_heads /= tp;
    }
    if let Some(d) = &mut c.dense_mlp {
        d.intermediate_size /= tp;
    }
    if let Some(m) = &mut c.moe {
        m.shared_intermediate_size /= tp;
    }
    c
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tp={},dp={},pp={},ep={}",
            self.tp, self.dp, self.pp, self.ep
        )
    }
}
