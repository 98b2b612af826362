//! Qwen3-Next's Gated DeltaNet layer: the fused input projections (held part-major, so q, k, v,
//! z and b, a are column ranges of their outputs), the short causal convolution over
//! `[q | k | v]` with its rolling state, the gates, the delta rule (chunked for prompts,
//! recurrent for single tokens) carrying the per-head `dk × dv` state, the gated RMSNorm and the
//! output projection.

use super::ops::{first_fitting_in_place, view, Ops};
use super::params::LinearAttnWeights;
use super::ForwardError;
use crate::config::LinearAttnDims;
use crate::state_slots::LayerState;
use dsl_core::prelude::*;
use kernels::linear_attention::reference::Decay;
use kernels::linear_attention::runner::{launch_delta, DeltaMode, DeltaTensors};
use kernels::linear_attention::{chunked, conv, gates};

/// A sequence's state in one linear-attention layer: views into its state slot
/// ([`crate::state_slots`]), updated in place by the convolution and the delta rule.
pub(crate) struct LinearState {
    /// Recurrent state `[Nv·dk, dv]`.
    pub state: Tensor<f32>,
    /// Conv inputs of the last `K − 1` tokens `[K − 1, conv_dim]` (`[q | k | v]` channels).
    pub conv: Tensor<f32>,
}

impl LinearState {
    /// The views of a state slot.
    pub fn of_slot(slot: LayerState) -> LinearState {
        LinearState {
            state: slot.recurrent,
            conv: slot.conv_all,
        }
    }

    /// The short causal convolution (with SiLU) of `mixed [T, conv_dim]` continuing from the
    /// rolling conv state, which it advances in place; booked as `op`. GDN and KDA both run it.
    /// In a batched cost-only decode (`Runner::batch_decode`) the `T` rows are `T` sequences'
    /// tokens, each continuing its own state: one launch of the batched decode form, booked once
    /// for the batch.
    pub fn short_conv(
        &self,
        ops: &mut Ops,
        op: &str,
        mixed: &Tensor<f32>,
        taps: &Tensor<f32>,
    ) -> Result<Tensor<f32>, ForwardError> {
        let y = ops.mem.act(mixed.rows(), mixed.cols());
        // (Tap counts the batched form does not cover run as one chunk, booked per sequence.)
        if ops.batched_decode
            && mixed.rows() > 1
            && kernels::linear_attention::conv::DECODE_TAPS.contains(&taps.rows())
        {
            let states = ops
                .mem
                .poisoned::<f32>(&[mixed.rows(), taps.rows() - 1, mixed.cols()]);
            let launch =
                conv::launch_short_conv_decode(&ops.launcher, mixed, taps, &states, None, &y);
            ops.book(op, launch)?;
            return Ok(y);
        }
        let launch =
            conv::launch_short_conv(&ops.launcher, mixed, taps, &self.conv, &self.conv, &y);
        ops.book_sequence(op, launch)?;
        Ok(y)
    }

    /// The delta rule over `tensors` (whose state is this one, in place): recurrent for one
    /// token, chunked for several with the largest chunk whose tiles fit the card's on-chip
    /// memory (C = 64 on most cards; a smaller SRAM, an H800's 228 KB, takes C = 32). The
    /// chunked form's result does not depend on C beyond rounding; each C is tried cost-only
    /// first, so an overflow never leaves the state half-written.
    pub fn delta(
        &self,
        ops: &mut Ops,
        decay: Decay,
        ops_names: (&str, &str),
        tensors: &DeltaTensors<f32>,
    ) -> Result<(), ForwardError> {
        let t = tensors.q.rows();
        let (op, mode) = if t == 1 {
            (ops_names.0, DeltaMode::Recurrent)
        } else {
            (ops_names.1, DeltaMode::Chunked)
        };
        let chunks: Vec<i64> = if t == 1 {
            vec![64]
        } else {
            let mut c = kernels::tile_choice::declared(&chunked::chunked_delta::META, "C");
            c.retain(|v| *v <= 64);
            c.sort_unstable_by(|a, b| b.cmp(a));
            c
        };
        let launch = first_fitting_in_place(&ops.launcher, chunks, |launcher, c| {
            let config = Config::new().with("C", c);
            launch_delta(launcher, decay, mode, &config, tensors)
        });
        ops.book_sequence(op, launch)
    }
}

/// Gated DeltaNet over `x [T, H]` (already normed), advancing `st`.
pub(crate) fn forward(
    ops: &mut Ops,
    l: &LinearAttnDims,
    w: &LinearAttnWeights,
    x: &Tensor<f32>,
    st: &LinearState,
    eps: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let t = x.rows();
    let (nk, nv, dk, dv) = (l.key_heads, l.value_heads, l.key_head_dim, l.value_head_dim);
    let (qk_w, v_w) = (nk * dk, nv * dv);
    let conv_dim = 2 * qk_w + v_w;
    let p = ops.linear("linear_attn.in_proj_qkvz", x, &w.in_proj_qkvz)?;
    let ba = ops.linear("linear_attn.in_proj_ba", x, &w.in_proj_ba)?;
    // The projections are held part-major (`params::part_major`): `[q | k | v]` (the
    // convolution's channels) then z, and b then a, as views of their outputs.
    let mixed = view(p.col_range(0, conv_dim), "q/k/v")?;
    let z = view(p.col_range(conv_dim, v_w), "z")?;
    let (b, a) = (
        view(ba.col_range(0, nv), "b")?,
        view(ba.col_range(nv, nv), "a")?,
    );

    let y = st.short_conv(ops, "linear_attn.conv", &mixed, &w.conv_taps)?;

    let (g, beta) = (ops.mem.act_f32(t, nv), ops.mem.act_f32(t, nv));
    let launch = gates::gdn_gates::launch(
        &ops.launcher,
        &Config::new().with("BR", 16).with("BH", 8),
        &a,
        &b,
        &w.a_log,
        &w.dt_bias,
        &g,
        &beta,
    );
    ops.book("linear_attn.gates", launch)?;

    let o = ops.mem.act(t, v_w);
    if ops.batched_decode && t > 1 {
        // A batched cost-only decode: the t sequences' recurrences in one launch over t·Nv
        // heads, each sequence with its own state (shape only: nothing is stored).
        // Queries, keys, values and outputs in the activations' format, gates f32, as the
        // per-sequence path holds them.
        let row = |c: usize| ops.mem.act(1, t * c);
        let gate = |c: usize| ops.mem.act_f32(1, t * c);
        let tensors = DeltaTensors {
            q: row(qk_w),
            k: row(qk_w),
            v: row(v_w),
            g: gate(nv),
            beta: gate(nv),
            state_in: ops.mem.poisoned(&[t * nv * dk, dv]),
            state_out: ops.mem.poisoned(&[t * nv * dk, dv]),
            o: row(v_w),
        };
        let launch = launch_delta(
            &ops.launcher,
            Decay::Scalar,
            DeltaMode::Recurrent,
            &Config::new(),
            &tensors,
        );
        ops.book("linear_attn.delta_recurrent", launch)?;
    } else {
        let tensors = DeltaTensors {
            q: view(y.col_range(0, qk_w), "conv q")?,
            k: view(y.col_range(qk_w, qk_w), "conv k")?,
            v: view(y.col_range(2 * qk_w, v_w), "conv v")?,
            g: g.clone(),
            beta: beta.clone(),
            state_in: st.state.clone(),
            state_out: st.state.clone(),
            o: o.clone(),
        };
        st.delta(
            ops,
            Decay::Scalar,
            ("linear_attn.delta_recurrent", "linear_attn.delta_chunked"),
            &tensors,
        )?;
    }

    let normed = ops.mem.act(t, v_w);
    let launch = kernels::tile_choice::cover(
        &gates::gated_rmsnorm_silu::META,
        &Config::new().with("BR", 16),
        &[("BDV", dv, "linear_value_head_dim")],
    )
    .and_then(|cfg| {
        gates::gated_rmsnorm_silu::launch(&ops.launcher, &cfg, &o, &z, &w.norm, &normed, eps as f32)
    });
    ops.book("linear_attn.gated_norm", launch)?;
    ops.linear("linear_attn.out_proj", &normed, &w.out_proj)
}
