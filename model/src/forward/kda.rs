//! Kimi Linear's KDA layer (`KimiLinearDeltaAttention`): separate q/k/v projections, the short
//! causal convolution over `[q | k | v]` with its rolling state, the per-key-channel forget gate
//! (low-rank `f_a`/`f_b` projection) and `β = σ(b)`, the gated delta rule with per-channel decay
//! (chunked for prompts, recurrent for single tokens), the sigmoid-gated output norm (low-rank
//! `g_a`/`g_b` gate) and the output projection. The state layout is Gated DeltaNet's
//! ([`LinearState`]).

use super::linear_attention::LinearState;
use super::ops::{first_fitting_in_place, view, Ops};
use super::params::KdaWeights;
use super::ForwardError;
use crate::config::LinearAttnDims;
use dsl_core::prelude::*;
use kernels::linear_attention::gates;
use kernels::linear_attention::reference::Decay;
use kernels::linear_attention::runner::{launch_delta, DeltaMode, DeltaTensors};

/// The chunk sizes the chunked KDA kernel declares, largest first.
const CHUNKS: [usize; 3] = [64, 32, 16];

/// The largest in-chunk decay magnitude the chunked KDA kernel keeps finite in f32: it folds
/// `Γ = e^(G_i − G_j)` into its operands as `e^G` and `e^(−G)`, so `C · max|g|` must stay below
/// about 80 (see `kernels::linear_attention::chunked`).
const CHUNK_DECAY_LIMIT: f64 = 80.0;

/// The chunked form's chunk sizes for log-decays `g`, largest first: the declared `C`s whose
/// worst in-chunk cumulative decay stays inside [`CHUNK_DECAY_LIMIT`]; none when even the smallest
/// would overflow (the layer then runs the recurrent form, exact at any decay). A cost-only run
/// has no values and may take any. Which of them runs is the largest whose tiles fit the core.
fn chunks_for(g: &Tensor<f32>) -> Vec<usize> {
    let Some(values) = g.to_vec() else {
        return CHUNKS.to_vec();
    };
    let worst = values.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
    CHUNKS
        .into_iter()
        .filter(|&c| c as f64 * worst < CHUNK_DECAY_LIMIT)
        .collect()
}

/// KDA over `x [T, H]` (already normed), advancing `st`.
pub(crate) fn forward(
    ops: &mut Ops,
    l: &LinearAttnDims,
    w: &KdaWeights,
    x: &Tensor<f32>,
    st: &LinearState,
    eps: f64,
) -> Result<Tensor<f32>, ForwardError> {
    let t = x.rows();
    let (heads, dk, dv) = (l.key_heads, l.key_head_dim, l.value_head_dim);
    let (key, value) = (heads * dk, l.value_heads * dv);
    let mixed = ops.mem.act(t, 2 * key + value);
    for (op, proj, col, width) in [
        ("kda.q_proj", &w.q_proj, 0, key),
        ("kda.k_proj", &w.k_proj, key, key),
        ("kda.v_proj", &w.v_proj, 2 * key, value),
    ] {
        ops.linear_into(op, x, proj, &view(mixed.col_range(col, width), "q/k/v")?)?;
    }
    let y = st.short_conv(ops, "kda.conv", &mixed, &w.conv_taps)?;

    let f = ops.linear("kda.f_a_proj", x, &w.f_a)?;
    let f = ops.linear("kda.f_b_proj", &f, &w.f_b)?;
    let b = ops.linear("kda.b_proj", x, &w.b_proj)?;
    let (g, beta) = (ops.mem.act_f32(t, key), ops.mem.act_f32(t, heads));
    let launch = kernels::tile_choice::cover(
        &gates::kda_gates::META,
        &Config::new().with("BR", 16),
        &[("BDK", dk, "linear_attn_config.head_dim")],
    )
    .and_then(|cfg| {
        gates::kda_gates::launch(&ops.launcher, &cfg, &f, &b, &w.a_log, &w.dt_bias, &g, &beta)
    });
    ops.book("kda.gates", launch)?;

    let o = ops.mem.act(t, value);
    if ops.batched_decode && t > 1 {
        // A batched cost-only decode (`Runner::batch_decode`): the t sequences' recurrences in
        // one launch over t·H heads, each sequence with its own state (shape only), as the Gated
        // DeltaNet layer runs it.
        let mem = ops.mem;
        // Queries, keys, values and outputs in the activations' format, gates f32, as the
        // per-sequence path holds them.
        let row = |c: usize| mem.act(1, t * c);
        let gate = |c: usize| mem.act_f32(1, t * c);
        let state = || mem.poisoned::<f32>(&[t * st.state.rows(), st.state.cols()]);
        let tensors = DeltaTensors {
            q: row(key),
            k: row(key),
            v: row(value),
            g: gate(key),
            beta: gate(heads),
            state_in: state(),
            state_out: state(),
            o: row(value),
        };
        ops.book("kda.delta_recurrent", recurrent(ops, &tensors))?;
        return output(ops, w, x, &o, eps);
    }
    let chunks = if t == 1 { Vec::new() } else { chunks_for(&g) };
    let tensors = DeltaTensors {
        q: view(y.col_range(0, key), "conv q")?,
        k: view(y.col_range(key, key), "conv k")?,
        v: view(y.col_range(2 * key, value), "conv v")?,
        g,
        beta,
        state_in: st.state.clone(),
        state_out: st.state.clone(),
        o: o.clone(),
    };
    // In place: each chunk size is probed cost-only first, so an SRAM overflow (an H800's
    // 228 KB takes a smaller C than a 910B's 512 KB) never leaves the state half-written.
    let (op, launch) = if chunks.is_empty() {
        ("kda.delta_recurrent", recurrent(ops, &tensors))
    } else {
        let launch = first_fitting_in_place(&ops.launcher, chunks, |launcher, c| {
            let config = Config::new().with("C", c as i64);
            launch_delta(
                launcher,
                Decay::PerChannel,
                DeltaMode::Chunked,
                &config,
                &tensors,
            )
        });
        ("kda.delta_chunked", launch)
    };
    ops.book_sequence(op, launch)?;
    output(ops, w, x, &o, eps)
}

/// The per-channel delta rule's recurrent form over `tensors` (one token per head row).
fn recurrent(
    ops: &Ops,
    tensors: &DeltaTensors<f32>,
) -> Result<dsl_core::Launch, dsl_core::SimError> {
    launch_delta(
        &ops.launcher,
        Decay::PerChannel,
        DeltaMode::Recurrent,
        &Config::new(),
        tensors,
    )
}

/// The output gate (`g_a`/`g_b` low-rank projections), the gated RMSNorm with its sigmoid and
/// `o_proj`, over the recurrence's output `o [T, Hv·dv]`.
fn output(
    ops: &mut Ops,
    w: &KdaWeights,
    x: &Tensor<f32>,
    o: &Tensor<f32>,
    eps: f64,
) -> Result<Tensor<f32>, ForwardError> {
    // The norm's weight spans one value head.
    let dv = w.o_norm.cols();
    let gate = ops.linear("kda.g_a_proj", x, &w.g_a)?;
    let gate = ops.linear("kda.g_b_proj", &gate, &w.g_b)?;
    let normed = ops.mem.act(o.rows(), o.cols());
    let launch = kernels::tile_choice::cover(
        &gates::gated_rmsnorm_sigmoid::META,
        &Config::new().with("BR", 16),
        &[("BDV", dv, "linear_attn_config.head_dim")],
    )
    .and_then(|cfg| {
        gates::gated_rmsnorm_sigmoid::launch(
            &ops.launcher,
            &cfg,
            o,
            &gate,
            &w.o_norm,
            &normed,
            eps as f32,
        )
    });
    ops.book("kda.gated_norm", launch)?;
    ops.linear("kda.o_proj", &normed, &w.o_proj)
}
