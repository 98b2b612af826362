//! The forward split over several simulated cards, with data: each card holds its shard of the
//! weights (a [`Plan`]'s tensor- and expert-parallel split), runs the same layer code on its own
//! host thread, and the collectives the plan implies move real rows between the cards through an
//! [`accel_sim::fabric::Fabric`], priced by the cost model the planner uses.
//!
//! Placement (pipeline parallelism aside, `pp = 1`): card `c = d·tp + t` is tensor-parallel rank
//! `t` of attention replica `d`, and serves replica `d`'s sequences.
//! - **TP**: attention heads (MLA, with a DSA indexer whole on every card; gated GQA, whose
//!   key/value heads split with the query heads or are shared when fewer than the cards; Gated
//!   DeltaNet and KDA, with their convolution channels, gates and recurrent state), the dense
//!   MLP's and shared experts' intermediate columns are split column-wise going in and row-wise
//!   going out (`o_proj`, `out_proj`, `down_proj`), so each card's attention and feed-forward
//!   outputs are partial sums, all-reduced over the replica's `tp` cards before the residual add.
//! - **EP**: the `tp·dp` cards form `tp·dp / ep` expert groups of `ep` cards (card `c` is rank
//!   `c / (tp·dp/ep)` of group `c mod (tp·dp/ep)`); rank `r` holds the routed experts
//!   `e ≡ r (mod ep)`. Every card routes its replica's rows (the router is replicated); tensor rank
//!   `t` dispatches the choices of the tokens `≡ t (mod tp)` to the experts' cards (all-to-all),
//!   those run their experts on what arrives and send the rows back (all-to-all), and the weighted
//!   combine adds them onto the shared expert's partial sum, so the feed-forward all-reduce
//!   completes both.
//!
//! Functional runs at f32 weights only: the shards are cut from the f32 tensors.

use super::ops::{view, Ops};
use super::params::{
    AttnWeights, FfnWeights, GqaWeights, KdaWeights, LayerWeights, LinearAttnWeights, MlaWeights,
    MlpWeights, ModelWeights, MoeWeights,
};
use super::{ForwardError, Precision, Runner, StepOutput};
use crate::config::{load_config, ModelConfig};
use crate::plan::parallel::Plan;
use crate::weights::Checkpoint;
use accel_sim::collective::CommCost;
use accel_sim::fabric::{Fabric, Member};
use accel_sim::ClusterPreset;
use dsl_core::{Launcher, Tensor};
use kernels::moe::dispatch::RoutingPlan;
use kernels::weight::Weight;
use std::path::Path;
use std::sync::Arc;

/// Where one card sits in a plan, and the fabric it talks over.
#[derive(Debug, Clone)]
pub(crate) struct CardLink {
    /// The run's fabric.
    pub fabric: Arc<Fabric>,
    /// The cluster pricing the collectives.
    pub cluster: ClusterPreset,
    /// This card.
    pub card: usize,
    /// The replica's tensor-parallel cards, ascending.
    pub tp_group: Vec<usize>,
    /// This card's rank in `tp_group`.
    pub tp_rank: usize,
    /// The expert group's cards, ascending (rank `r` holds experts `≡ r mod ep`).
    pub ep_group: Vec<usize>,
    /// This card's rank in `ep_group`.
    pub ep_rank: usize,
}

/// Bytes per activation value on the wire: the multi-card numeric path runs at the reference
/// precision (`Precision::F32`), whose activations are f32 in device memory.
const WIRE_BYTES: f64 = 4.0;

impl CardLink {
    /// Card `card`'s place in `plan` (which must have `pp = 1`).
    pub fn place(
        plan: &Plan,
        card: usize,
        fabric: Arc<Fabric>,
        cluster: ClusterPreset,
    ) -> CardLink {
        let (tp, cards) = (plan.tp, plan.tp * plan.dp);
        let d = card / tp;
        let stride = cards / plan.ep;
        CardLink {
            fabric,
            cluster,
            card,
            tp_group: (d * tp..(d + 1) * tp).collect(),
            tp_rank: card % tp,
            ep_group: (0..plan.ep).map(|r| card % stride + r * stride).collect(),
            ep_rank: card / stride,
        }
    }

    fn member<'a>(&'a self, group: &'a [usize]) -> Member<'a> {
        Member {
            fabric: &self.fabric,
            cluster: &self.cluster,
            group,
            me: self.card,
        }
    }
}

impl Ops {
    /// Books a collective's time (at the device clock) under `op`.
    fn book_comm(&mut self, op: &str, cost: &CommCost) {
        let cycles = cost.seconds * self.launcher.preset.clock_ghz * 1e9;
        let e = self.stats.per_op.entry(op.to_string()).or_default();
        e.0 += 1;
        e.1 += cycles.round() as u64;
    }

    fn comm_err(&self, op: &str, source: dsl_core::SimError) -> ForwardError {
        ForwardError::Kernel {
            op: op.to_string(),
            layer: self.layer,
            source,
        }
    }

    /// The sum of `t` over the card's tensor-parallel group (the partial outputs of row-split
    /// projections); `t` itself on a single card or a group of one.
    pub(crate) fn tp_all_reduce(
        &mut self,
        op: &str,
        t: Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let Some(link) = self.cards.clone() else {
            return Ok(t);
        };
        if link.tp_group.len() == 1 {
            return Ok(t);
        }
        let mut data = data_of(&t, op)?;
        let cost = link
            .member(&link.tp_group)
            .all_reduce_sum(&mut data, WIRE_BYTES)
            .map_err(|e| self.comm_err(op, e))?;
        self.book_comm(op, &cost);
        view(Tensor::from_f32(t.shape(), &data), op)
    }

    /// The routed experts over the expert group (see the module doc): `x [T, H]` the replica's
    /// rows, `sel` the global expert of each of the `T·K` choices, `weights [T, K]` their
    /// combine weights, `base [T, H]` what the routed rows add onto (the shared expert's partial
    /// sum). Returns `base` plus this tensor rank's tokens' routed rows.
    pub(crate) fn routed_on_cards(
        &mut self,
        w: &MoeWeights,
        x: &Tensor<f32>,
        sel: &[i32],
        weights: &Tensor<f32>,
        inter: usize,
        base: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let link = self
            .cards
            .clone()
            .ok_or_else(|| super::internal("expert parallelism without cards"))?;
        let (t, h) = (x.rows(), x.cols());
        let k = sel.len() / t.max(1);
        let (tp, ep) = (link.tp_group.len(), link.ep_group.len());
        let xs = data_of(x, "moe.ep_dispatch")?;
        // Each dispatched row carries its expert's index on the receiving card, then the token.
        let width = h + 1;
        let mut send = vec![Vec::new(); ep];
        let mut sent: Vec<Vec<usize>> = vec![Vec::new(); ep];
        for tok in (link.tp_rank..t).step_by(tp) {
            for j in 0..k {
                let e = sel[tok * k + j] as usize;
                let (dst, local) = (e % ep, e / ep);
                send[dst].push(local as f32);
                send[dst].extend_from_slice(&xs[tok * h..(tok + 1) * h]);
                sent[dst].push(tok * k + j);
            }
        }
        let (recv, cost) = link
            .member(&link.ep_group)
            .all_to_all_rows(send, width, WIRE_BYTES)
            .map_err(|e| self.comm_err("moe.ep_dispatch", e))?;
        self.book_comm("moe.ep_dispatch", &cost);

        let mut ids = Vec::new();
        let mut rows = Vec::new();
        for msg in &recv {
            for row in msg.chunks(width) {
                ids.push(row[0] as i32);
                rows.extend_from_slice(&row[1..]);
            }
        }
        let n = ids.len();
        let replies = if n == 0 {
            Vec::new()
        } else {
            self.local_experts(w, &ids, &rows, h, inter)?
        };
        let mut back = Vec::with_capacity(ep);
        let mut at = 0;
        for msg in &recv {
            let count = msg.len() / width;
            back.push(replies[at * h..(at + count) * h].to_vec());
            at += count;
        }
        let (returned, cost) = link
            .member(&link.ep_group)
            .all_to_all_rows(back, h, WIRE_BYTES)
            .map_err(|e| self.comm_err("moe.ep_combine", e))?;
        self.book_comm("moe.ep_combine", &cost);

        // The returned rows at their choices' slots; the choices another tensor rank combines
        // stay zero rows.
        let mut ye = vec![0.0f32; t * k * h];
        for (dst, choices) in sent.iter().enumerate() {
            if returned[dst].len() != choices.len() * h {
                return Err(super::internal("the rows an expert card sent back"));
            }
            for (q, &choice) in choices.iter().enumerate() {
                ye[choice * h..(choice + 1) * h]
                    .copy_from_slice(&returned[dst][q * h..(q + 1) * h]);
            }
        }
        let slot_of: Vec<f32> = (0..t * k).map(|c| c as f32).collect();
        let ye = view(Tensor::from_f32(&[t * k, h], &ye), "moe.ep_combine")?;
        let slot_of = view(Tensor::from_f32(&[t, k], &slot_of), "moe.ep_combine")?;
        self.moe_combine(&ye, &slot_of, weights, base)
    }

    /// This card's experts on the rows dispatched to it (`ids`: the local expert of each row):
    /// the grouped SwiGLU, answered in arrival order.
    fn local_experts(
        &mut self,
        w: &MoeWeights,
        ids: &[i32],
        rows: &[f32],
        h: usize,
        inter: usize,
    ) -> Result<Vec<f32>, ForwardError> {
        let n = ids.len();
        let held = w.gate_up.shape()[0];
        let plan_err = |source| ForwardError::Kernel {
            op: "moe.routing_plan".into(),
            layer: self.layer,
            source,
        };
        let plan = RoutingPlan::from_topk(ids, n, 1, held).map_err(plan_err)?;
        let order = plan.rows_tensor().map_err(plan_err)?;
        let offsets = plan.offsets_tensor().map_err(plan_err)?;
        let xr = view(Tensor::from_f32(&[n, h], rows), "moe.ep_rows")?;
        let ye = super::ffn::expert_swiglu(self, w, &xr, &order, &offsets, inter, None)?;
        let ye = data_of(&ye, "moe.experts.down_proj")?;
        let mut out = Vec::with_capacity(n * h);
        for &slot in &plan.slot_of {
            let s = slot as usize;
            out.extend_from_slice(&ye[s * h..(s + 1) * h]);
        }
        Ok(out)
    }
}

/// A functional tensor's values (a shape-only run has none to move).
fn data_of(t: &Tensor<f32>, op: &str) -> Result<Vec<f32>, ForwardError> {
    t.to_vec().ok_or_else(|| ForwardError::Unsupported {
        what: format!("{op} on shape-only tensors: multi-card runs with data are functional"),
    })
}

/// The f32 values of a weight (shards are cut from f32 weights).
fn values(w: &Weight, what: &str) -> Result<(Vec<usize>, Vec<f32>), ForwardError> {
    match w {
        Weight::F32(t) => Ok((t.shape().to_vec(), data_of(t, what)?)),
        other => Err(ForwardError::Unsupported {
            what: format!(
                "{what} held as {}: a multi-card functional run cuts its shards from f32 weights \
                 (--precision f32)",
                other.format().name()
            ),
        }),
    }
}

fn f32_weight(what: &str, shape: &[usize], data: &[f32]) -> Result<Weight, ForwardError> {
    Ok(Weight::F32(view(Tensor::from_f32(shape, data), what)?))
}

/// Rows `start..start + len` of a `[N, K]` weight.
fn rows(w: Weight, start: usize, len: usize, what: &str) -> Result<Weight, ForwardError> {
    row_ranges(w, &[(start, len)], what)
}

/// The row ranges `(start, len)` of a `[N, K]` weight, one after another.
fn row_ranges(w: Weight, ranges: &[(usize, usize)], what: &str) -> Result<Weight, ForwardError> {
    let (shape, data) = values(&w, what)?;
    let k = shape[shape.len() - 1];
    let out: Vec<f32> = ranges
        .iter()
        .flat_map(|(start, len)| data[start * k..(start + len) * k].iter().copied())
        .collect();
    let n = ranges.iter().map(|(_, len)| len).sum::<usize>();
    f32_weight(what, &[n, k], &out)
}

/// Columns `start..start + len` of a `[N, K]` weight.
fn cols(w: Weight, start: usize, len: usize, what: &str) -> Result<Weight, ForwardError> {
    let (shape, data) = values(&w, what)?;
    let k = shape[shape.len() - 1];
    let out: Vec<f32> = data
        .chunks(k)
        .flat_map(|r| r[start..start + len].iter().copied())
        .collect();
    f32_weight(what, &[shape[0], len], &out)
}

/// The experts `ids` of an `[E, N, K]` bank.
fn experts(w: Weight, ids: &[usize], what: &str) -> Result<Weight, ForwardError> {
    let (shape, data) = values(&w, what)?;
    let out = gather_experts(&data, shape[1] * shape[2], ids);
    f32_weight(what, &[ids.len(), shape[1], shape[2]], &out)
}

/// Rows `ids` of a per-expert `[E, N]` tensor (the experts a card holds).
fn expert_rows(t: Tensor<f32>, ids: &[usize], what: &str) -> Result<Tensor<f32>, ForwardError> {
    let out = gather_experts(&data_of(&t, what)?, t.cols(), ids);
    view(Tensor::from_f32(&[ids.len(), t.cols()], &out), what)
}

/// Experts `ids` of per-expert data laid out expert after expert, `per` values each.
fn gather_experts(data: &[f32], per: usize, ids: &[usize]) -> Vec<f32> {
    ids.iter()
        .flat_map(|&e| data[e * per..(e + 1) * per].iter().copied())
        .collect()
}

/// A column/row split of a SwiGLU MLP: intermediate columns `start..start + len`.
fn mlp_shard(w: MlpWeights, start: usize, len: usize) -> Result<MlpWeights, ForwardError> {
    Ok(MlpWeights {
        gate: rows(w.gate, start, len, "mlp.gate_proj")?,
        up: rows(w.up, start, len, "mlp.up_proj")?,
        down: cols(w.down, start, len, "mlp.down_proj")?,
    })
}

fn mla_shard(
    w: MlaWeights,
    m: &crate::config::MlaDims,
    tp: usize,
    rank: usize,
) -> Result<MlaWeights, ForwardError> {
    let heads = m.heads / tp;
    let h0 = rank * heads;
    let qk = m.qk_head_dim();
    let (nope, vd, r) = (m.qk_nope_head_dim, m.v_head_dim, m.kv_lora_rank);
    Ok(MlaWeights {
        q_lora: match w.q_lora {
            Some((a, norm, b)) => Some((a, norm, rows(b, h0 * qk, heads * qk, "q_b_proj")?)),
            None => None,
        },
        q_proj: match w.q_proj {
            Some(q) => Some(rows(q, h0 * qk, heads * qk, "q_proj")?),
            None => None,
        },
        kv_a: w.kv_a,
        kv_a_norm: w.kv_a_norm,
        kv_b: rows(w.kv_b, h0 * (nope + vd), heads * (nope + vd), "kv_b_proj")?,
        o_proj: cols(w.o_proj, h0 * vd, heads * vd, "o_proj")?,
        w_uk_t: rows(w.w_uk_t, h0 * r, heads * r, "W_UK")?,
        w_uv: rows(w.w_uv, h0 * vd, heads * vd, "W_UV")?,
        // The DSA indexer is small and reads only replicated inputs (the q_a latent, the hidden
        // state): every card keeps it whole and picks the same tokens for its heads.
        indexer: w.indexer,
    })
}

/// Rows `start..start + len` of a `[N, C]` tensor.
fn tensor_rows(
    t: Tensor<f32>,
    start: usize,
    len: usize,
    what: &str,
) -> Result<Tensor<f32>, ForwardError> {
    let c = t.cols();
    let data = data_of(&t, what)?;
    view(
        Tensor::from_f32(&[len, c], &data[start * c..(start + len) * c]),
        what,
    )
}

/// Columns `ranges` (start, length) of a 2-D f32 tensor, side by side (conv taps per channel,
/// per-head gate parameters).
fn tensor_cols(
    t: Tensor<f32>,
    ranges: &[(usize, usize)],
    what: &str,
) -> Result<Tensor<f32>, ForwardError> {
    let data = data_of(&t, what)?;
    let c = t.cols();
    let width: usize = ranges.iter().map(|r| r.1).sum();
    let mut out = Vec::with_capacity(t.rows() * width);
    for row in data.chunks(c) {
        for &(start, len) in ranges {
            out.extend_from_slice(&row[start..start + len]);
        }
    }
    view(Tensor::from_f32(&[t.rows(), width], &out), what)
}

/// Gated full attention split by query heads; key/value heads split with them, or the one a
/// card's query heads share when there are fewer key/value heads than cards.
fn gqa_shard(
    w: GqaWeights,
    g: &crate::config::GqaDims,
    tp: usize,
    rank: usize,
) -> Result<GqaWeights, ForwardError> {
    if g.qk_norm_across_heads && tp > 1 {
        // Its statistics span every card's heads: an all-reduce inside the norm, not modelled
        // numerically yet.
        return Err(ForwardError::Unsupported {
            what: format!("a q/k norm across all heads (MiniMax-M2) split over tp={tp} cards"),
        });
    }
    let (d, hq) = (g.head_dim, g.heads / tp);
    let q_rows = d * if g.output_gate { 2 } else { 1 };
    let (kv0, kv) = if g.kv_heads >= tp {
        let kv = g.kv_heads / tp;
        (rank * kv, kv)
    } else {
        (rank * hq / (g.heads / g.kv_heads), 1)
    };
    Ok(GqaWeights {
        q_proj: rows(w.q_proj, rank * hq * q_rows, hq * q_rows, "q_proj")?,
        k_proj: rows(w.k_proj, kv0 * d, kv * d, "k_proj")?,
        v_proj: rows(w.v_proj, kv0 * d, kv * d, "v_proj")?,
        o_proj: cols(w.o_proj, rank * hq * d, hq * d, "o_proj")?,
        q_norm: w.q_norm,
        k_norm: w.k_norm,
        qkv_bias: match w.qkv_bias {
            Some([q, k, v]) => Some([
                tensor_cols(q, &[(rank * hq * q_rows, hq * q_rows)], "q_proj.bias")?,
                tensor_cols(k, &[(kv0 * d, kv * d)], "k_proj.bias")?,
                tensor_cols(v, &[(kv0 * d, kv * d)], "v_proj.bias")?,
            ]),
            None => None,
        },
        // o_proj is split by its input columns: each card's product is a partial sum, so the
        // bias is added once, by the first card, before the all-reduce.
        o_bias: if rank == 0 { w.o_bias } else { None },
        // One sink per query head, `[Hq, 1]`: the card's heads' rows.
        sinks: match w.sinks {
            Some(s) => Some(tensor_rows(s, rank * hq, hq, "sinks")?),
            None => None,
        },
    })
}

/// Gated DeltaNet split by key heads (each with its `Nv/Nk` value heads): the projections are
/// held part-major (`[q | k | v | z]`, `[b | a]`, see `params::part_major`), so a rank takes its
/// heads' rows of each part; the convolution's channels are `[q | k | v]`.
fn gdn_shard(
    w: LinearAttnWeights,
    l: &crate::config::LinearAttnDims,
    tp: usize,
    rank: usize,
) -> Result<LinearAttnWeights, ForwardError> {
    let (nk, nv, dk, dv) = (
        l.key_heads / tp,
        l.value_heads / tp,
        l.key_head_dim,
        l.value_head_dim,
    );
    let (qk_w, v_w) = (l.key_heads * dk, l.value_heads * dv);
    let channels = [
        (rank * nk * dk, nk * dk),
        (qk_w + rank * nk * dk, nk * dk),
        (2 * qk_w + rank * nv * dv, nv * dv),
    ];
    let z = [(2 * qk_w + v_w + rank * nv * dv, nv * dv)];
    let ba = [(rank * nv, nv), (l.value_heads + rank * nv, nv)];
    Ok(LinearAttnWeights {
        in_proj_qkvz: row_ranges(
            w.in_proj_qkvz,
            &[channels.as_slice(), z.as_slice()].concat(),
            "in_proj_qkvz",
        )?,
        in_proj_ba: row_ranges(w.in_proj_ba, &ba, "in_proj_ba")?,
        conv_taps: tensor_cols(w.conv_taps, &channels, "conv taps")?,
        a_log: tensor_cols(w.a_log, &[(rank * nv, nv)], "A_log")?,
        dt_bias: tensor_cols(w.dt_bias, &[(rank * nv, nv)], "dt_bias")?,
        norm: w.norm,
        out_proj: cols(w.out_proj, rank * nv * dv, nv * dv, "out_proj")?,
    })
}

/// Kimi Delta Attention split by heads: per-head projections and gates, the low-rank inputs
/// (`f_a`, `g_a`) whole.
fn kda_shard(
    w: KdaWeights,
    l: &crate::config::LinearAttnDims,
    tp: usize,
    rank: usize,
) -> Result<KdaWeights, ForwardError> {
    let heads = l.key_heads / tp;
    let (key, value) = (
        heads * l.key_head_dim,
        (l.value_heads / tp) * l.value_head_dim,
    );
    let (all_key, k0, v0) = (l.key_heads * l.key_head_dim, rank * key, rank * value);
    let channels = [(k0, key), (all_key + k0, key), (2 * all_key + v0, value)];
    Ok(KdaWeights {
        q_proj: rows(w.q_proj, k0, key, "q_proj")?,
        k_proj: rows(w.k_proj, k0, key, "k_proj")?,
        v_proj: rows(w.v_proj, v0, value, "v_proj")?,
        conv_taps: tensor_cols(w.conv_taps, &channels, "conv taps")?,
        f_a: w.f_a,
        f_b: rows(w.f_b, k0, key, "f_b_proj")?,
        dt_bias: tensor_cols(w.dt_bias, &[(k0, key)], "dt_bias")?,
        a_log: tensor_cols(w.a_log, &[(rank * heads, heads)], "A_log")?,
        b_proj: rows(w.b_proj, rank * heads, heads, "b_proj")?,
        g_a: w.g_a,
        g_b: rows(w.g_b, v0, value, "g_b_proj")?,
        o_norm: w.o_norm,
        o_proj: cols(w.o_proj, v0, value, "o_proj")?,
    })
}

/// Card `link`'s shard of the full model's weights.
fn shard_weights(
    full: ModelWeights,
    cfg: &ModelConfig,
    link: &CardLink,
) -> Result<ModelWeights, ForwardError> {
    let (tp, t) = (link.tp_group.len(), link.tp_rank);
    let ep = link.ep_group.len();
    let mut layers = Vec::with_capacity(full.layers.len());
    for lw in full.layers {
        let attn = match lw.attn {
            AttnWeights::Mla(w) => {
                let m = cfg
                    .mla
                    .as_ref()
                    .ok_or_else(|| super::internal("MLA dims"))?;
                AttnWeights::Mla(mla_shard(w, m, tp, t)?)
            }
            AttnWeights::Gqa(w) => {
                let g = cfg
                    .gqa
                    .as_ref()
                    .ok_or_else(|| super::internal("GQA dims"))?;
                AttnWeights::Gqa(gqa_shard(w, g, tp, t)?)
            }
            AttnWeights::Linear(w) => {
                let l = cfg
                    .linear_attention
                    .as_ref()
                    .ok_or_else(|| super::internal("linear-attention dims"))?;
                AttnWeights::Linear(gdn_shard(w, l, tp, t)?)
            }
            AttnWeights::Kda(w) => {
                let l = cfg
                    .linear_attention
                    .as_ref()
                    .ok_or_else(|| super::internal("linear-attention dims"))?;
                AttnWeights::Kda(kda_shard(w, l, tp, t)?)
            }
        };
        let ffn = match lw.ffn {
            FfnWeights::Dense(w) => {
                let i = w.gate.out_features() / tp;
                FfnWeights::Dense(mlp_shard(w, t * i, i)?)
            }
            FfnWeights::Moe(w) => {
                let e = w.gate_up.shape()[0];
                let held: Vec<usize> = (link.ep_rank..e).step_by(ep).collect();
                let shared = match w.shared {
                    Some(s) => {
                        let i = s.gate.out_features() / tp;
                        Some(mlp_shard(s, t * i, i)?)
                    }
                    None => None,
                };
                FfnWeights::Moe(MoeWeights {
                    router: w.router,
                    bias: w.bias,
                    router_bias: w.router_bias,
                    gate_up: experts(w.gate_up, &held, "experts.gate_up_proj")?,
                    down: experts(w.down, &held, "experts.down_proj")?,
                    expert_biases: match w.expert_biases {
                        Some((gu, d)) => Some((
                            expert_rows(gu, &held, "experts.gate_up_proj_bias")?,
                            expert_rows(d, &held, "experts.down_proj_bias")?,
                        )),
                        None => None,
                    },
                    activation: w.activation,
                    shared,
                    shared_gate: w.shared_gate,
                })
            }
        };
        layers.push(LayerWeights {
            input_norm: lw.input_norm,
            post_attn_norm: lw.post_attn_norm,
            attn,
            ffn,
        });
    }
    Ok(ModelWeights {
        embed: full.embed,
        layers,
        final_norm: full.final_norm,
        lm_head: full.lm_head,
    })
}

/// What one card of a multi-card run produced.
#[derive(Debug, Clone)]
pub struct CardRun {
    /// The card.
    pub card: usize,
    /// The attention replica it served.
    pub replica: usize,
    /// Each step's logits (the prompt's step first, then one per generated token).
    pub steps: Vec<StepOutput>,
    /// The greedy tokens generated.
    pub tokens: Vec<i64>,
    /// Launches and cycles per operator, the collectives included.
    pub stats: super::OpStats,
}

/// Runs `prompt` then `steps` greedy tokens (each the argmax of the previous step's last row):
/// each step's output and the tokens chosen.
pub fn greedy_steps(
    runner: &mut Runner,
    prompt: &[i64],
    steps: usize,
) -> Result<(Vec<StepOutput>, Vec<i64>), ForwardError> {
    let mut out = runner.forward(prompt)?;
    let (mut outputs, mut tokens) = (Vec::with_capacity(steps + 1), Vec::with_capacity(steps));
    for _ in 0..steps {
        let next = super::argmax(out.row(out.tokens - 1)) as i64;
        outputs.push(out);
        tokens.push(next);
        out = runner.forward(&[next])?;
    }
    outputs.push(out);
    Ok((outputs, tokens))
}

/// Runs the checkpoint in `dir` on `plan.cards()` simulated cards of `cluster` (each a
/// `device`), functionally at f32: replica `d` prefills `prompts[d]` and then decodes `steps`
/// greedy tokens. Every card's logits come back (the cards of one replica compute the same ones).
pub fn run_on_cards(
    dir: &Path,
    device: &str,
    cluster: &ClusterPreset,
    plan: &Plan,
    prompts: &[Vec<i64>],
    steps: usize,
) -> Result<Vec<CardRun>, ForwardError> {
    let cfg = load_config(&dir.join("config.json"))?;
    let flag = |m: String| ForwardError::Workload {
        flag: "--plan".into(),
        message: m,
    };
    plan.validate(&cfg, "--plan")
        .map_err(|e| ForwardError::Workload {
            flag: e.flag,
            message: e.message,
        })?;
    if plan.pp != 1 {
        return Err(flag(format!(
            "pp={}: a multi-card functional run splits layers by tp/dp/ep only (pp=1)",
            plan.pp
        )));
    }
    if plan.cards() > cluster.cards() {
        return Err(ForwardError::Workload {
            flag: "--cards".into(),
            message: format!(
                "the plan needs {} cards but cluster `{}` holds {}",
                plan.cards(),
                cluster.name,
                cluster.cards()
            ),
        });
    }
    if prompts.len() != plan.dp {
        return Err(flag(format!(
            "dp={} replicas need {} prompts, {} were given",
            plan.dp,
            plan.dp,
            prompts.len()
        )));
    }
    let launcher = Launcher::for_device(device).map_err(|source| ForwardError::Kernel {
        op: "device".into(),
        layer: None,
        source,
    })?;
    let ckpt = Checkpoint::open(dir)?;
    let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + steps;
    let fabric = Fabric::new(plan.cards());
    // The router still sees every expert; the indexer stays whole.
    let card_cfg = crate::plan::parallel::tensor_parallel_shard(&cfg, plan.tp);
    let one_card = |card: usize| -> Result<CardRun, ForwardError> {
        let link = CardLink::place(plan, card, fabric.clone(), cluster.clone());
        let full = ModelWeights::load(&cfg, Some(&ckpt), Precision::F32)?;
        let weights = shard_weights(full, &cfg, &link)?;
        let mut runner = Runner::with_weights(
            card_cfg.clone(),
            weights,
            launcher.clone(),
            capacity.max(1),
            Precision::F32,
        )?;
        runner.ops.cards = Some(link);
        let replica = card / plan.tp;
        let (outputs, tokens) = greedy_steps(&mut runner, &prompts[replica], steps)?;
        Ok(CardRun {
            card,
            replica,
            steps: outputs,
            tokens,
            stats: runner.stats().clone(),
        })
    };
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..plan.cards())
            .map(|card| {
                let (f, fabric) = (&one_card, &fabric);
                s.spawn(move || {
                    // A card that fails or panics releases the others from their collectives.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(card)))
                        .unwrap_or_else(|_| Err(super::internal("a card's thread (it panicked)")));
                    if let Err(e) = &r {
                        fabric.abort(&format!("card {card}: {e}"));
                    }
                    r
                })
            })
            .collect();
        let mut runs = Vec::with_capacity(handles.len());
        let mut first_err = None;
        for h in handles {
            match h.join() {
                Ok(Ok(r)) => runs.push(r),
                Ok(Err(e)) => {
                    // The card that failed first names the cause; the others report the abort.
                    let aborted = e.to_string().contains("the run was aborted");
                    if first_err.as_ref().is_none_or(|(a, _)| *a && !aborted) {
                        first_err = Some((aborted, e));
                    }
                }
                Err(_) => {
                    first_err.get_or_insert((false, super::internal("a card's thread")));
                }
            }
        }
        match first_err {
            Some((_, e)) => Err(e),
            None => Ok(runs),
        }
    })
}
