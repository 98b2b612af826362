//! Rotary tables over several position axes: the vision tower's 2D RoPE and the text model's
//! multi-axis RoPE (M-RoPE), both applied by the ordinary [`crate::rope::rope()`] kernel
//! (half-split pairs over the whole head) once the host has built their cos/sin tables.
//!
//! A token has a position per axis (`[t, h, w]`; text tokens have the same value on all three) and
//! each rotary frequency reads one axis:
//!
//! - **2D vision RoPE** (Qwen2/3-VL `VisionRotaryEmbedding(head_dim / 2)` and `rot_pos_emb`): the
//!   `head_dim / 4` inverse frequencies of a `head_dim / 2`-dim rotary, first all on the patch's row
//!   `h`, then all again on its column `w` (`rotary_pos_emb_full[pos_ids].flatten(1)`), so a head
//!   holds `head_dim / 2` angles ([`vision_freqs`]).
//! - **Interleaved M-RoPE** (Qwen3-VL `apply_interleaved_mrope`): the text head's `head_dim / 2`
//!   frequencies read `t`, except frequency `i` reads `h` when `i % 3 == 1` and `i < 3·section[1]`,
//!   and `w` when `i % 3 == 2` and `i < 3·section[2]` ([`mrope_freqs`]).
//!
//! The angle is the f32 product of the f32 frequency and the position, as torch computes it.

/// One rotary frequency: the position axis it reads (0 = t, 1 = h, 2 = w) and its inverse
/// frequency.
pub type AxisFreq = (usize, f64);

/// The 2D vision rotary's frequencies for heads of `head_dim` (a multiple of 4) with base
/// `theta`: `head_dim / 4` inverse frequencies on the row axis, then the same on the column axis.
pub fn vision_freqs(head_dim: usize, theta: f64) -> Vec<AxisFreq> {
    let inv = crate::rope::inv_freq(head_dim / 2, theta, &crate::rope::RopeScalingParams::None);
    let on = |axis: usize| inv.iter().map(move |f| (axis, *f));
    on(1).chain(on(2)).collect()
}

/// The text model's interleaved M-RoPE frequencies: `inv_freq` (one per pair of the head) with
/// frequency `i` moved to the h axis when `i % 3 == 1 && i < 3·section[1]`, to the w axis when
/// `i % 3 == 2 && i < 3·section[2]`, else on t.
pub fn mrope_freqs(inv_freq: &[f64], section: [usize; 3]) -> Vec<AxisFreq> {
    inv_freq
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let axis = match i % 3 {
                1 if i < 3 * section[1] => 1,
                2 if i < 3 * section[2] => 2,
                _ => 0,
            };
            (axis, *f)
        })
        .collect()
}

/// The `cos`, `sin [positions.len(), freqs.len()]` tables [`crate::rope::rope()`] reads: angle
/// `(n, i)` = f32(`freqs[i].1`) · f32(`positions[n][freqs[i].0]`), then cos and sin.
pub fn axis_cos_sin(positions: &[[usize; 3]], freqs: &[AxisFreq]) -> (Vec<f32>, Vec<f32>) {
    let n = positions.len() * freqs.len();
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for p in positions {
        for (axis, f) in freqs {
            let angle = (*f as f32 * p[*axis] as f32) as f64;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// Each patch's `[t, h, w]` position in the order the vision tower holds patches: per image of
/// `grid = [t, h, w]` patches, frame by frame, the `merge × merge` blocks row by row and within a
/// block its patches row by row (the processor's order, which keeps every block that the patch
/// merger fuses contiguous). `h` and `w` must be multiples of `merge`.
pub fn vision_positions(grids: &[[usize; 3]], merge: usize) -> Vec<[usize; 3]> {
    let m = merge.max(1);
    let mut out = Vec::new();
    for &[t, h, w] in grids {
        for ft in 0..t {
            for bh in 0..h / m {
                for bw in 0..w / m {
                    for ih in 0..m {
                        for iw in 0..m {
                            out.push([ft, bh * m + ih, bw * m + iw]);
                        }
                    }
                }
            }
        }
    }
    out
}
