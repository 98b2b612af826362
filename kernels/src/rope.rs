//! Rotary position embedding (RoPE) on token-major activations, and the host-side tables it reads.
//!
//! ## The kernel
//! [`rope()`] rotates `x [T, H·D]` into `out [T, H·D]` head by head. Within each head of `D` values,
//! dims `rot_offset .. rot_offset + rot_dim` rotate by the angles whose cosines and sines are
//! `cos`, `sin [T, rot_dim/2]` (row `t` = token `t`'s position); the other dims are copied unchanged
//! (DeepSeek's MLA query heads rotate their last 64 of 192 dims, Qwen3-Next's its first quarter).
//! Pair `i` of the span rotates by frequency `i`:
//!
//! - `interleaved = false` (half-split, Llama/Qwen `rotate_half`): the pair is `(i, i + rot_dim/2)`;
//! - `interleaved = true` (DeepSeek `rope_interleave`): the pair is `(2i, 2i + 1)`, and the
//!   result is written back in place, interleaved. Hugging Face instead de-interleaves q and k
//!   (`apply_rotary_pos_emb_interleave`: the same permutation for both) and then rotates half-split,
//!   so its rotated span is a permutation of this one. Attention scores are dot products over whole
//!   heads, invariant under one permutation applied to both q and k: the scores (and the outputs)
//!   are identical. Only the rotated keys in a cache are laid out differently.
//!
//! The head dimension, the span's offset and width are run-time arguments; the tiles (`BT` tokens,
//! `BD` dims of the copy, `BH` pairs of the rotation) loop over them, so any released shape runs.
//! [`run_rope`] checks every shape and picks the tiles. The kernel copies the whole head first
//! and then overwrites the rotated span. `out` may be `x` itself (in place): each
//! program reads its rows of a head before it writes them.
//!
//! ## The tables
//! [`inv_freq`], [`attention_factor`] and [`cos_sin`] follow transformers 5.24
//! (`modeling_rope_utils._compute_yarn_parameters`, `_compute_linear_scaling_rope_parameters`, the
//! models' `compute_default_rope_parameters` and their rotary modules' `forward`), including its
//! float32 arithmetic: the frequencies are computed with f32 operations as torch does, and an angle
//! is the f32 product `inv_freq · position`. The golden test (`tests/reference/gen_rope.py`) holds
//! them to torch's values.

use dsl_core::prelude::*;
use dsl_core::SimError;

/// RoPE over the heads of token-major activations: one program per `BT` tokens × one head.
///
/// Every dimension is a run-time value: the head (`head_dim`) is copied in `BD`-wide column tiles
/// and the rotated span in `BH`-wide chunks of pairs (`BH` pairs per step), each through a column
/// view of its head (`cols_clipped`), so a ragged last tile reads zeros past the head and writes
/// nothing there. `BT`, `BD` and `BH` are tile sizes: any value gives the same result.
#[kernel(
    grid = (cdiv(x.rows(), BT), x.cols() / head_dim),
    tunable(BT = [16, 1, 4], BD = [64, 16, 32, 128, 256], BH = [32, 8, 16, 64]),
    derived(BP = BH * 2)
)]
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &Tensor<f32>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    out: &Tensor<f32>,
    head_dim: usize,
    rot_offset: usize,
    rot_dim: usize,
    interleaved: bool,
) {
    let r = program_id(0) * BT;
    let c0 = program_id(1) * head_dim;
    let xh = x.cols_clipped(c0, head_dim);
    let oh = out.cols_clipped(c0, head_dim);
    // Dims outside the rotated span pass through: copy the head, then overwrite the span.
    for c in (0..head_dim).step_by(BD) {
        store(&oh, r, c, &load_async::<BT, BD>(&xh, r, c));
    }
    let half = rot_dim / 2;
    for j in (0..half).step_by(BH) {
        let cs = load_async::<BT, BH>(cos, r, j);
        let sn = load_async::<BT, BH>(sin, r, j);
        if interleaved {
            // Pairs (2i, 2i + 1) of the span: chunk j holds pairs j .. j + BH.
            let xs = xh.cols_clipped(rot_offset, rot_dim);
            let os = oh.cols_clipped(rot_offset, rot_dim);
            let (x1, x2) = deinterleave(&load::<BT, BP>(&xs, r, 2 * j));
            let o1 = sub(&mul(&x1, &cs), &mul(&x2, &sn));
            let o2 = add(&mul(&x2, &cs), &mul(&x1, &sn));
            let rotated: Tile<f32, BT, BP> = interleave(&o1, &o2);
            store(&os, r, 2 * j, &rotated);
        } else {
            // Pairs (i, i + half): the two halves are separate column views.
            let x1v = xh.cols_clipped(rot_offset, half);
            let x2v = xh.cols_clipped(rot_offset + half, half);
            let x1 = load::<BT, BH>(&x1v, r, j);
            let x2 = load::<BT, BH>(&x2v, r, j);
            store(
                &oh.cols_clipped(rot_offset, half),
                r,
                j,
                &sub(&mul(&x1, &cs), &mul(&x2, &sn)),
            );
            store(
                &oh.cols_clipped(rot_offset + half, half),
                r,
                j,
                &add(&mul(&x2, &cs), &mul(&x1, &sn)),
            );
        }
    }
}

/// Runs [`rope()`] on `x`, `out [T, H·head_dim]` with `cos`, `sin [T, rot_dim/2]`, choosing the
/// tiles. Every shape is checked first: a zero head dimension, a span outside the head, an odd
/// `rot_dim`, or mismatched tensors are a `SimError::Launch` saying which.
#[allow(clippy::too_many_arguments)]
pub fn run_rope(
    launcher: &Launcher,
    x: &Tensor<f32>,
    cos: &Tensor<f32>,
    sin: &Tensor<f32>,
    out: &Tensor<f32>,
    head_dim: usize,
    rot_offset: usize,
    rot_dim: usize,
    interleaved: bool,
) -> Result<Launch, SimError> {
    let meta = &rope::META;
    let bad = |message: String| SimError::Launch {
        kernel: meta.name.to_string(),
        message,
    };
    if head_dim == 0 {
        return Err(bad("head dimension 0: a head needs at least one dim".into()));
    }
    if rot_dim == 0 || !crate::tile_choice::divides(2, rot_dim) || rot_offset + rot_dim > head_dim {
        return Err(bad(format!(
            "rotated span {rot_offset}..{} (rot_dim {rot_dim}) must be non-empty, of even width and \
             inside the head of {head_dim}",
            rot_offset + rot_dim
        )));
    }
    let tokens = x.rows();
    if !crate::tile_choice::divides(head_dim, x.cols()) {
        return Err(bad(format!(
            "x {x:?} has {} columns, not a whole number of heads of {head_dim}",
            x.cols()
        )));
    }
    if out.rows() != tokens || out.cols() != x.cols() {
        return Err(bad(format!("out is {out:?} but must have x's shape {x:?}")));
    }
    for (what, t) in [("cos", cos), ("sin", sin)] {
        if t.rows() != tokens || t.cols() != rot_dim / 2 {
            return Err(bad(format!(
                "{what} is {t:?} but must be [{tokens}, {}]: one row per token of x, rot_dim/2 \
                 angles (see `rope::cos_sin`)",
                rot_dim / 2
            )));
        }
    }
    let config = crate::tile_choice::covering_config(
        meta,
        Config::new(),
        &[
            ("BT", tokens, 16),
            ("BD", head_dim, 128),
            ("BH", rot_dim / 2, 32),
        ],
    );
    rope::launch(
        launcher,
        &config,
        x,
        cos,
        sin,
        out,
        head_dim,
        rot_offset,
        rot_dim,
        interleaved,
    )
}

/// How a checkpoint scales its RoPE frequencies (`rope_scaling` / `rope_parameters` in
/// config.json), with transformers' field names.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScalingParams {
    /// Plain RoPE (`rope_type` `default`).
    None,
    /// Position interpolation: every frequency divided by `factor` (`rope_type` `linear`).
    Linear {
        /// The interpolation factor.
        factor: f64,
    },
    /// YaRN (`rope_type` `yarn`; DeepSeek-V3, Kimi-K2).
    Yarn {
        /// Context extension factor.
        factor: f64,
        /// The pre-training context length the correction range is computed from.
        original_max_position_embeddings: usize,
        /// Rotations above which dims keep their original frequency (transformers' default 32;
        /// a 0 in the config also means 32, as transformers' `or 32` reads it).
        beta_fast: f64,
        /// Rotations below which dims are fully interpolated (default 1; 0 also means 1).
        beta_slow: f64,
        /// `mscale` of the attention factor; 0 when the config has none.
        mscale: f64,
        /// `mscale_all_dim` of the attention factor; 0 when the config has none.
        mscale_all_dim: f64,
        /// Whether the correction range is rounded outwards to whole dims (transformers' default
        /// `true`).
        truncate: bool,
    },
    /// Llama 3.1's frequency-dependent interpolation (`rope_type` `llama3`).
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept; the band between blends.
        high_freq_factor: f64,
        /// The pre-training context length.
        original_max_position_embeddings: usize,
    },
}

/// The `rot_dim/2` inverse frequencies of a rotary span of `rot_dim` dims with base `theta`, scaled
/// as configured; as transformers computes them, in f32 (returned widened to f64).
pub fn inv_freq(rot_dim: usize, theta: f64, scaling: &RopeScalingParams) -> Vec<f64> {
    let dim = rot_dim as f32;
    let base = theta as f32;
    // `base ** (arange(0, dim, 2) / dim)`, all f32.
    let pos_freqs: Vec<f32> = (0..rot_dim)
        .step_by(2)
        .map(|i| base.powf(i as f32 / dim))
        .collect();
    let inv: Vec<f32> = match scaling {
        RopeScalingParams::None => pos_freqs.iter().map(|p| 1.0 / p).collect(),
        RopeScalingParams::Linear { factor } => pos_freqs
            .iter()
            .map(|p| (1.0 / p) / *factor as f32)
            .collect(),
        RopeScalingParams::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => llama3_inv_freq(
            &pos_freqs,
            *factor,
            *low_freq_factor,
            *high_freq_factor,
            *original_max_position_embeddings,
        ),
        RopeScalingParams::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate,
            ..
        } => {
            let beta_fast = if *beta_fast == 0.0 { 32.0 } else { *beta_fast };
            let beta_slow = if *beta_slow == 0.0 { 1.0 } else { *beta_slow };
            let max_pos = *original_max_position_embeddings as f64;
            // Inverse dimension formula: the dim whose wavelength fits `rotations` times into the
            // original context (f64, as Python's math module computes it).
            let correction_dim = |rotations: f64| {
                rot_dim as f64 * (max_pos / (rotations * 2.0 * std::f64::consts::PI)).ln()
                    / (2.0 * theta.ln())
            };
            let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
            if *truncate {
                low = low.floor();
                high = high.ceil();
            }
            let low = low.max(0.0);
            let mut high = high.min(rot_dim as f64 - 1.0);
            if low == high {
                high += 0.001; // transformers' guard against a zero-width ramp
            }
            let (low32, span32) = (low as f32, (high - low) as f32);
            let f = *factor as f32;
            pos_freqs
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let ramp = ((i as f32 - low32) / span32).clamp(0.0, 1.0);
                    let extrapolation = 1.0 - ramp;
                    let (extra, inter) = (1.0 / p, 1.0 / (f * p));
                    inter * (1.0 - extrapolation) + extra * extrapolation
                })
                .collect()
        }
    };
    inv.into_iter().map(f64::from).collect()
}

/// transformers' `_compute_llama3_parameters` on f32 inverse frequencies, in f32 as torch computes
/// it (Python scalars taken to f32, operations in the order written there).
fn llama3_inv_freq(
    pos_freqs: &[f32],
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original: usize,
) -> Vec<f32> {
    let old = original as f64;
    let (low_wavelen, high_wavelen) = (
        (old / low_freq_factor) as f32,
        (old / high_freq_factor) as f32,
    );
    let (factor, low) = (factor as f32, low_freq_factor as f32);
    let band = (high_freq_factor - low_freq_factor) as f32;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    pos_freqs
        .iter()
        .map(|p| {
            let inv = 1.0 / p;
            let wavelen = two_pi / inv;
            let scaled = if wavelen > low_wavelen {
                inv / factor
            } else {
                inv
            };
            let smooth = (old as f32 / wavelen - low) / band;
            let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
            // transformers' `~(wavelen < high) * ~(wavelen > low)`; wavelengths are finite.
            // Equal low and high factors leave no band (transformers would divide 0 by 0 at
            // the one wavelength on its edge): that wavelength keeps its frequency.
            let medium = wavelen >= high_wavelen && wavelen <= low_wavelen && band > 0.0;
            if medium {
                smoothed
            } else {
                scaled
            }
        })
        .collect()
}

/// transformers' YaRN `get_mscale`: `0.1 · mscale · ln(scale) + 1` above scale 1, else 1.
fn yarn_mscale(scale: f64, mscale: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * mscale * scale.ln() + 1.0
    }
}

/// The factor transformers multiplies cos and sin by (`attention_scaling`): 1 except for YaRN,
/// where it is `get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)` when both are
/// given (non-zero), else `get_mscale(factor)`.
pub fn attention_factor(scaling: &RopeScalingParams) -> f64 {
    match scaling {
        RopeScalingParams::Yarn {
            factor,
            mscale,
            mscale_all_dim,
            ..
        } => {
            if *mscale != 0.0 && *mscale_all_dim != 0.0 {
                yarn_mscale(*factor, *mscale) / yarn_mscale(*factor, *mscale_all_dim)
            } else {
                yarn_mscale(*factor, 1.0)
            }
        }
        RopeScalingParams::None
        | RopeScalingParams::Linear { .. }
        | RopeScalingParams::Llama3 { .. } => 1.0,
    }
}

/// The `cos` and `sin` tables [`rope()`] reads, row-major `[positions.len(), inv_freq.len()]`:
/// angle `(t, i)` is the f32 product `inv_freq[i] · positions[t]`, and both tables are multiplied
/// (in f32) by `attention_factor`, as transformers' rotary `forward` does.
pub fn cos_sin(
    positions: &[usize],
    inv_freq: &[f64],
    attention_factor: f64,
) -> (Vec<f32>, Vec<f32>) {
    let af = attention_factor as f32;
    let n = positions.len() * inv_freq.len();
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for &p in positions {
        for &f in inv_freq {
            let angle = (f as f32 * p as f32) as f64;
            cos.push(angle.cos() as f32 * af);
            sin.push(angle.sin() as f32 * af);
        }
    }
    (cos, sin)
}
