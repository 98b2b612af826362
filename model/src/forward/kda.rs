//! Kimi Linear's KDA layer (`KimiLinearDeltaAttention`): separate q/k/v projections, the short
//! causal convolution over `[q | k | v]` with its rolling state, the per-key-channel forget gate
//! (low-rank `f_a`/`f_b` projection) and `β = σ(b)`, the gated delta rule with per-channel decay
//! (chunked for prompts, recurrent for single tokens), the sigmoid-gated output norm (low-rank
//! `g_a`/`g_b` gate) and the output projection. The state layout is Gated DeltaNet's
//! ([`LinearState`]).

use super::linear_attention::LinearState;
use super::ops::{view, Ops};
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

/// The chunked form's chunk size for log-decays `g`: the largest declared `C` whose worst in-chunk
/// cumulative decay stays inside [`CHUNK_DECAY_LIMIT`], or `None` when even the smallest would
/// overflow (the layer then runs the recurrent form, exact at any decay). A cost-only run has no
/// values and takes the largest `C`.
fn chunk_for(g: &Tensor<f32>) -> Option<usize> {
    let Some(values) = g.to_vec() else {
        return Some(CHUNKS[0]);
    };
    let worst = values.iter().fold(0.0f64, |m, v| m.max(f64::from(v.abs())));
    CHUNKS
        .into_iter()
        .find(|&c| c as f64 * worst < CHUNK_DECAY_LIMIT)
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
    let (g, beta) = (ops.mem.act(t, key), ops.mem.act(t, heads));
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
    let (op, mode, config) = match (t, chunk_for(&g)) {
        (1, _) => ("kda.delta_recurrent", DeltaMode::Recurrent, Config::new()),
        (_, Some(c)) => (
            "kda.delta_chunked",
            DeltaMode::Chunked,
            Config::new().with("C", c as i64),
        ),
        (_, None) => ("kda.delta_recurrent", DeltaMode::Recurrent, Config::new()),
    };
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
    let launch = launch_delta(&ops.launcher, Decay::PerChannel, mode, &config, &tensors);
    // In place (one launch, no tile retry that could find the state half-written).
    ops.book_sequence(op, launch)?;

    let gate = ops.linear("kda.g_a_proj", x, &w.g_a)?;
    let gate = ops.linear("kda.g_b_proj", &gate, &w.g_b)?;
    let normed = ops.mem.act(t, value);
    let launch = kernels::tile_choice::cover(
        &gates::gated_rmsnorm_sigmoid::META,
        &Config::new().with("BR", 16),
        &[("BDV", dv, "linear_attn_config.head_dim")],
    )
    .and_then(|cfg| {
        gates::gated_rmsnorm_sigmoid::launch(
            &ops.launcher,
            &cfg,
            &o,
            &gate,
            &w.o_norm,
            &normed,
            eps as f32,
        )
    });
    ops.book("kda.gated_norm", launch)?;
    ops.linear("kda.o_proj", &normed, &w.o_proj)
}
