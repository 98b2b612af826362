//! The short causal depthwise convolution in front of the delta rule (kernel 4, no bias, SiLU),
//! continuing from a rolling state, and the zero fill that starts a new sequence's state.
//!
//! Layouts (token-major): `x`, `y` `[seq, channels]`; `w` `[4, channels]`, tap-major — the
//! transpose of the checkpoint's `conv1d.weight [channels, 1, 4]`, so a tap is one contiguous row;
//! `state_in`, `state_out` `[3, channels]`, the inputs of the previous 3 tokens, oldest first (the
//! reference code keeps the last 4 and reads 3). `y[t] = SiLU(w₀ x[t−3] + w₁ x[t−2] + w₂ x[t−1] +
//! w₃ x[t])`, with `x[−3..−1]` from the state; see [`super::reference::short_conv`].
//!
//! A depthwise convolution treats channels independently, so convolving q, k and v separately
//! (as flash-linear-attention's KDA layer does, and as the state slots launch [`launch_short_conv`])
//! is the same as the one convolution over the concatenated `[q | k | v]` channels of the
//! transformers code.

use dsl_core::prelude::*;

/// One program per block of `BC` channels walks the tokens in order, keeping the last three
/// inputs in registers (a rolling window): the single-token decode form ([`launch_short_conv`]
/// sends prompts to [`short_conv_chunked()`]).
#[kernel(grid = (cdiv(x.cols(), BC),), tunable(BC = [128, 32, 64, 256, 512]))]
pub fn short_conv4<T: Float>(
    x: &Tensor<T>,
    w: &Tensor<f32>,
    state_in: &Tensor<f32>,
    state_out: &Tensor<f32>,
    y: &Tensor<T>,
) {
    let c0 = program_id(0) * BC;
    let w0 = load_async::<1, BC>(w, 0, c0);
    let w1 = load_async::<1, BC>(w, 1, c0);
    let w2 = load_async::<1, BC>(w, 2, c0);
    let w3 = load_async::<1, BC>(w, 3, c0);
    let mut h1 = load_async::<1, BC>(state_in, 0, c0);
    let mut h2 = load_async::<1, BC>(state_in, 1, c0);
    let mut h3 = load_async::<1, BC>(state_in, 2, c0);
    for t in 0..x.rows() {
        let xt = cast::<f32>(&load_async::<1, BC>(x, t, c0));
        // Taps summed oldest first, as [`short_conv()`] and [`short_conv_chunked()`] do, so a
        // prompt and its continuation token by token give equal values.
        let acc = add(&add(&mul(&w0, &h1), &mul(&w1, &h2)), &mul(&w2, &h3));
        let acc = add(&acc, &mul(&w3, &xt));
        store(y, t, c0, &cast::<T>(&silu(&acc)));
        h1 = h2;
        h2 = h3;
        h3 = xt;
    }
    store(state_out, 0, c0, &h1);
    store(state_out, 1, c0, &h2);
    store(state_out, 2, c0, &h3);
}

/// The same convolution for any number of taps `K = w.rows()` (a run-time value: Qwen3-Next and
/// Kimi Linear use 4, other releases 2 to 8): `w [K, channels]`, states `[K − 1, channels]`. Each
/// output reads its `K` inputs from the concatenation `[state; x]` (rows past the state come from
/// `x`), so a tap count needs no rolling registers; [`short_conv4()`] is the 4-tap fast path that
/// keeps its window in registers. `state_out` may be `state_in` (each row of the new state is read
/// before a lower row is written).
#[kernel(
    grid = (cdiv(x.cols(), BC),),
    tunable(BC = [128, 32, 64, 256, 512]),
    helpers(store_new_state)
)]
pub fn short_conv<T: Float>(
    x: &Tensor<T>,
    w: &Tensor<f32>,
    state_in: &Tensor<f32>,
    state_out: &Tensor<f32>,
    y: &Tensor<T>,
) {
    let c0 = program_id(0) * BC;
    let taps = w.rows();
    let hist = taps - 1;
    for t in 0..x.rows() {
        let mut acc = zeros::<f32, 1, BC>();
        for j in 0..taps {
            let wj = load_async::<1, BC>(w, j, c0);
            let pos = t + j;
            let xin = if pos < hist {
                load_async::<1, BC>(state_in, pos, c0)
            } else {
                cast::<f32>(&load_async::<1, BC>(x, pos - hist, c0))
            };
            acc = add(&acc, &mul(&wj, &xin));
        }
        store(y, t, c0, &cast::<T>(&silu(&acc)));
    }
    store_new_state::<T, BC>(x, state_in, state_out, hist, c0);
}

/// The new conv state of a program's `BC` channels from `c0`: the last `hist` rows of
/// `[state_in; x]`, oldest first, into `state_out`. Each row is read before a lower one is
/// written, so `state_out` may be `state_in`.
#[kernel(helper)]
pub fn store_new_state<T: Float, const BC: usize>(
    x: &Tensor<T>,
    state_in: &Tensor<f32>,
    state_out: &Tensor<f32>,
    hist: usize,
    c0: usize,
) {
    for i in 0..hist {
        let pos = x.rows() + i;
        let row = if pos < hist {
            load::<1, BC>(state_in, pos, c0)
        } else {
            cast::<f32>(&load::<1, BC>(x, pos - hist, c0))
        };
        store(state_out, i, c0, &row);
    }
}

/// The prompt form: one program per block of `BC` channels streams the tokens `BT` at a time,
/// each token block loaded once (the next block's requested before this one's arithmetic). Tap
/// `j`'s inputs for the block are the block moved down by `K − 1 − j` rows with the previous
/// block's last rows on top ([`shift_rows`]), so overlapping windows are never reloaded, as
/// causal-conv1d keeps a chunk's halo on chip; before the first block the "previous block" holds
/// the state. [`short_conv4()`] and [`short_conv()`] walk every token with `1 × BC` loads, each
/// waiting for its memory latency: fine for one decode token, ~27× the memory bound for an
/// 8192-token prompt. Taps are summed oldest first in every form, so a prompt and its
/// continuation token by token give equal values (up to the sign of a zero). `state_out` may be
/// `state_in`: the new state is written last, by the program that read the old one.
/// `K − 1 ≤ BT`.
#[kernel(
    grid = (cdiv(x.cols(), BC),),
    tunable(BT = [128, 16, 32, 64, 256], BC = [32, 16, 64, 128, 256]),
    helpers(store_new_state)
)]
pub fn short_conv_chunked<T: Float>(
    x: &Tensor<T>,
    w: &Tensor<f32>,
    state_in: &Tensor<f32>,
    state_out: &Tensor<f32>,
    y: &Tensor<T>,
) {
    let c0 = program_id(0) * BC;
    let (taps, n) = (w.rows(), x.rows());
    let hist = taps - 1;
    require(
        hist <= BT,
        "the BT token tile must hold the taps' history (launch_short_conv picks it)",
    );
    // The state as the bottom `hist` rows of a block before the first (rows past it read 0).
    let st = load_async::<BT, BC>(&state_in.rows_clipped(0, hist), 0, c0);
    let mut prev = shift_rows(&zeros::<f32, BT, BC>(), &st, BT.saturating_sub(hist));
    let mut raw = load_async::<BT, BC>(x, 0, c0);
    for t0 in (0..n).step_by(BT) {
        // Past the last token this window moves nothing.
        let next = load_async::<BT, BC>(x, t0 + BT, c0);
        let cur = cast::<f32>(&raw);
        let mut acc = zeros::<f32, BT, BC>();
        for j in 0..taps {
            let wj = load_async::<1, BC>(w, j, c0);
            acc = add(&acc, &mul_row(&shift_rows(&prev, &cur, hist - j), &wj));
        }
        // Rows past the last token fall outside `y` and are not stored.
        store(y, t0, c0, &cast::<T>(&silu(&acc)));
        prev = cur;
        raw = next;
    }
    // The new state (read before written, so an aliased state reads its old rows).
    store_new_state::<T, BC>(x, state_in, state_out, hist, c0);
}

/// The decode form for a batch: sequence `s`'s one new token `x[s]` continues the state in slot
/// `slots[s]` of `states [slots, K − 1, channels]`, which it advances in place (the oldest row
/// drops out, `x[s]` becomes the newest), as vLLM's `causal_conv1d_update` takes a batch with a
/// state index per sequence. One program per (block of `BC` channels, sequence): the history
/// taps are one `BH × BC` product reduced over its rows (`BH` covers `K − 1`, at most 16).
#[kernel(
    grid = (cdiv(x.cols(), BC), x.rows()),
    tunable(BC = [512, 32, 64, 128, 256], BH = [8, 4, 16])
)]
pub fn short_conv_decode<T: Float>(
    x: &Tensor<T>,
    w: &Tensor<f32>,
    states: &Tensor<f32>,
    slots: &Tensor<i32>,
    y: &Tensor<T>,
) {
    let (c0, s) = (program_id(0) * BC, program_id(1));
    let hist = w.rows() - 1;
    require(
        hist <= BH,
        "the BH tile must cover the taps' history (launch_short_conv_decode picks a covering tile)",
    );
    // What does not depend on the slot is requested before the slot is read.
    let xr = load_async::<1, BC>(x, s, c0);
    let wh = load_async::<BH, BC>(&w.rows_clipped(0, hist), 0, c0);
    let wl = load_async::<1, BC>(w, hist, c0);
    let slot = load_index(slots, s, s);
    let st = states.at(slot);
    // Rows past the history read as zeros in both tiles and add nothing.
    let h = load_async::<BH, BC>(&st, 0, c0);
    let xt = cast::<f32>(&xr);
    let acc = add(&col_sum(&mul(&wh, &h)), &mul(&wl, &xt));
    store(y, s, c0, &cast::<T>(&silu(&acc)));
    // The state moves up one row (row r takes row r + 1, from the tile already on chip), then
    // the new token is its last row.
    let older = shift_rows(&h, &zeros::<f32, BH, BC>(), BH - 1);
    store(&st.rows_clipped(0, hist.saturating_sub(1)), 0, c0, &older);
    store(&st.rows_clipped(hist.saturating_sub(1), hist), 0, c0, &xt);
}

/// Tap counts [`launch_short_conv_decode`] takes: one tap has no state, and the history tile
/// (`BH`) holds at most 16 rows.
pub const DECODE_TAPS: std::ops::RangeInclusive<usize> = 2..=17;

/// Runs [`short_conv_decode()`]: one token per sequence, `x [S, channels]`, sequence `s` with
/// the state at slot `slots[s]` of `states [slots, K − 1, channels]` (none: slot `s`, for a
/// cost-only batch). Errors name what does not fit: taps, widths, a slot outside the states, two
/// sequences on one slot.
pub fn launch_short_conv_decode<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    w: &Tensor<f32>,
    states: &Tensor<f32>,
    slots: Option<&[usize]>,
    y: &Tensor<T>,
) -> Result<Launch, dsl_core::SimError> {
    let meta = &short_conv_decode::META;
    let bad = |message: String| dsl_core::SimError::Launch {
        kernel: meta.name.into(),
        message,
    };
    let (taps, ch, seqs) = (w.rows(), x.cols(), x.rows());
    let sh = states.shape();
    if !DECODE_TAPS.contains(&taps) || w.cols() != ch {
        return Err(bad(format!(
            "conv weights {w:?} must be [{} ≤ taps ≤ {}, {ch}] for x {x:?} (one tap has no \
             state; the history tile holds at most 16 rows)",
            DECODE_TAPS.start(),
            DECODE_TAPS.end()
        )));
    }
    if sh.len() != 3 || sh[1] != taps - 1 || sh[2] != ch {
        return Err(bad(format!(
            "states {sh:?} must be [slots, {}, {ch}] for {taps} taps",
            taps - 1
        )));
    }
    if y.rows() != seqs || y.cols() != ch {
        return Err(bad(format!("y is {y:?} but must have x's shape {x:?}")));
    }
    let slots: Vec<usize> = match slots {
        Some(slots) => slots.to_vec(),
        None => (0..seqs).collect(),
    };
    if slots.len() != seqs {
        return Err(bad(format!(
            "{} state slots for {seqs} sequences",
            slots.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (s, &slot) in slots.iter().enumerate() {
        if slot >= sh[0] {
            return Err(bad(format!(
                "sequence {s}'s state slot {slot} is outside the {} slots",
                sh[0]
            )));
        }
        if !seen.insert(slot) {
            return Err(bad(format!(
                "two sequences share state slot {slot}: each sequence needs its own"
            )));
        }
    }
    // Slots are i32 on the device (as `load_index` reads them).
    let idx: Vec<i32> = slots
        .iter()
        .map(|s| i32::try_from(*s))
        .collect::<Result<_, _>>()
        .map_err(|_| bad(format!("{} state slots are past an i32 index", sh[0])))?;
    let table = Tensor::<i32>::from_indices(&[seqs], &idx).map_err(bad)?;
    let config = crate::tile_choice::covering_config(
        meta,
        Config::new(),
        &[("BC", ch, 512), ("BH", taps - 1, 16)],
    );
    short_conv_decode::launch(launcher, &config, x, w, states, &table, y)
}

/// Launches the short convolution of `w [K, channels]`: for a prompt (more than one token)
/// [`short_conv_chunked()`]; for one token the 4-tap fast path ([`short_conv4()`]) or the general
/// [`short_conv()`], with `BC` covering up to 128 channels per program. Shapes are checked
/// first: `K ≥ 1`, states `[max(K − 1, 1), channels]`, `y` like `x`.
pub fn launch_short_conv<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    w: &Tensor<f32>,
    state_in: &Tensor<f32>,
    state_out: &Tensor<f32>,
    y: &Tensor<T>,
) -> Result<Launch, dsl_core::SimError> {
    let (taps, ch) = (w.rows(), x.cols());
    let state_rows = taps.saturating_sub(1).max(1);
    let bad = |message: String| dsl_core::SimError::Launch {
        kernel: short_conv::META.name.into(),
        message,
    };
    if taps == 0 || w.cols() != ch {
        return Err(bad(format!(
            "conv weights {w:?} must be [taps ≥ 1, {ch}] for x {x:?}"
        )));
    }
    for (what, s) in [("state_in", state_in), ("state_out", state_out)] {
        if s.rows() != state_rows || s.cols() != ch {
            return Err(bad(format!(
                "{what} is {s:?} but must be [{state_rows}, {ch}] for {taps} taps"
            )));
        }
    }
    if y.rows() != x.rows() || y.cols() != ch {
        return Err(bad(format!("y is {y:?} but must have x's shape {x:?}")));
    }
    if x.rows() > 1 && taps > 257 {
        return Err(bad(format!(
            "{taps} taps: the prompt form holds the taps' history in one token tile of at most \
             256 rows"
        )));
    }
    if x.rows() > 1 {
        // A prompt: one program per channel block, so the widest block that still gives every
        // core one (a program streams its block's whole sequence).
        let cores = launcher.preset.cores as usize;
        let bc = [128usize, 64]
            .into_iter()
            .find(|b| ch.div_ceil(*b) >= cores)
            .unwrap_or(32);
        // Token tiles of 16 KB of f32: seven live fit an H100-class SM's 228 KB.
        let bt = crate::tile_choice::covering(
            &short_conv_chunked::META,
            "BT",
            (4096 / bc).max(taps - 1),
            256,
        )
        .unwrap_or(256);
        let cfg = Config::new().with("BT", bt).with("BC", bc as i64);
        return short_conv_chunked::launch(launcher, &cfg, x, w, state_in, state_out, y);
    }
    let bc = if ch <= 32 {
        32
    } else if ch <= 64 {
        64
    } else {
        128
    };
    let cfg = Config::new().with("BC", bc);
    if taps == 4 {
        short_conv4::launch(launcher, &cfg, x, w, state_in, state_out, y)
    } else {
        short_conv::launch(launcher, &cfg, x, w, state_in, state_out, y)
    }
}

/// Writes zeros over a state tensor (a new sequence's recurrent and conv state): a device memset.
#[kernel(
    grid = (cdiv(t.rows(), BR), cdiv(t.cols(), BC)),
    tunable(BR = [64, 16, 32, 128], BC = [128, 16, 32, 64, 256])
)]
pub fn zero_state(t: &Tensor<f32>) {
    store(
        t,
        program_id(0) * BR,
        program_id(1) * BC,
        &zeros::<f32, BR, BC>(),
    );
}

/// One short-convolution problem: `seq` tokens of `channels` channels, from a random state.
#[derive(Debug, Clone)]
pub struct ConvCase {
    /// Tokens.
    pub seq: usize,
    /// Channels.
    pub channels: usize,
    /// Element dtype of `x` and `y` (weights and state are f32).
    pub dtype: crate::gemm::GemmDtype,
    /// Tunable values (`BC`).
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// A short-convolution run: the report (`max_rel_error` over output and new state in functional
/// runs), the output and the new state.
#[derive(Debug)]
pub struct ConvRun {
    /// The launch.
    pub launch: Launch,
    /// `y [seq, channels]` (functional runs).
    pub output: Option<Vec<f32>>,
    /// New state `[max(taps − 1, 1), channels]` (functional runs).
    pub state: Option<Vec<f32>>,
}

/// Runs [`short_conv4()`] on random inputs (x uniform in ±1, weights in ±0.5, a non-zero state;
/// output and new state NaN-poisoned) and checks both against [`super::reference::short_conv`].
pub fn run_short_conv(launcher: &Launcher, case: &ConvCase) -> Result<ConvRun, dsl_core::SimError> {
    run_conv_case(launcher, case, None)
}

/// Runs the convolution the model launches for `case.seq` tokens with `taps` taps
/// ([`launch_short_conv`]: the prompt form [`short_conv_chunked()`] for more than one token; its
/// own tiles, `case.config` unused) on random inputs, checked like [`run_short_conv`].
pub fn run_model_short_conv(
    launcher: &Launcher,
    case: &ConvCase,
    taps: usize,
) -> Result<ConvRun, dsl_core::SimError> {
    run_conv_case(launcher, case, Some(taps))
}

/// [`run_short_conv`] (`taps` = None: [`short_conv4()`] at `case.config`) or
/// [`run_model_short_conv`].
fn run_conv_case(
    launcher: &Launcher,
    case: &ConvCase,
    taps: Option<usize>,
) -> Result<ConvRun, dsl_core::SimError> {
    if case.seq == 0 || case.channels == 0 || taps == Some(0) {
        return Err(dsl_core::SimError::Launch {
            kernel: short_conv4::META.name.into(),
            message: format!(
                "empty convolution: {} token(s) of {} channel(s), {taps:?} taps",
                case.seq, case.channels
            ),
        });
    }
    match case.dtype {
        crate::gemm::GemmDtype::F32 => conv_typed::<f32>(launcher, case, taps),
        crate::gemm::GemmDtype::Bf16 => conv_typed::<bf16>(launcher, case, taps),
    }
}

fn conv_typed<T: Float>(
    launcher: &Launcher,
    case: &ConvCase,
    model_taps: Option<usize>,
) -> Result<ConvRun, dsl_core::SimError> {
    use super::reference::{short_conv, widen};
    let name = short_conv4::META.name;
    let ch = case.channels;
    let taps = model_taps.unwrap_or(4);
    // The kernels keep at least one state row; the reference takes exactly `taps − 1`.
    let (state_rows, hist) = ((taps - 1).max(1), taps - 1);
    let mut c = crate::testdata::CaseTensors::new(launcher, case.seed, name);
    let x = c.input::<T>(&[case.seq, ch], 0.0, 1.0)?;
    let w = c.input::<f32>(&[taps, ch], 0.0, 0.5)?;
    let s_in = c.input::<f32>(&[state_rows, ch], 0.0, 1.0)?;
    let s_out = c.output::<f32>(&[state_rows, ch]);
    let y = c.output::<T>(&[case.seq, ch]);
    let mut launch = match model_taps {
        None => short_conv4::launch(launcher, &case.config, &x, &w, &s_in, &s_out, &y)?,
        Some(_) => launch_short_conv(launcher, &x, &w, &s_in, &s_out, &y)?,
    };
    let (output, state) = (y.to_vec(), s_out.to_vec());
    if let (Some(out), Some(st), Some(xv), Some(wv), Some(sv)) =
        (&output, &state, x.to_vec(), w.to_vec(), s_in.to_vec())
    {
        // The reference takes the checkpoint's [channels, taps] weight.
        let wt = crate::reference::transpose(&wv, taps, ch);
        let state_in = widen(&sv[..hist * ch]);
        let (want_y, want_s) =
            short_conv(&widen(&xv), &widen(&wt), &state_in, ch).map_err(|e| {
                dsl_core::SimError::Launch {
                    kernel: name.into(),
                    message: e.to_string(),
                }
            })?;
        let err = crate::reference::rel_error(out, &want_y)
            .max(crate::reference::rel_error(&st[..hist * ch], &want_s));
        launch.report.max_rel_error = Some(err);
    }
    Ok(ConvRun {
        launch,
        output,
        state,
    })
}
