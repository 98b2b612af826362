//! Learned position embeddings interpolated to an image's patch grid.
//!
//! Qwen3-VL's vision tower learns `G × G` position embeddings (`num_position_embeddings = G²`) and
//! resizes them to each image's `h × w` patch grid by bilinear interpolation
//! (`fast_pos_embed_interpolate`): every patch's embedding is a weighted sum of four table rows.
//! The host computes the four row indices and weights per patch from the grid alone
//! ([`bilinear_taps`]); [`pos_embed_bilinear()`] gathers and sums them on the device, in the
//! order torch sums them (tap 0 + tap 1 + tap 2 + tap 3).

use dsl_core::prelude::*;
use dsl_core::SimError;

/// Taps per patch: the four corners of the interpolation cell.
pub const TAPS: usize = 4;

/// `out[t, :] = Σ_j weights[t, j] · table[idx[t, j], :]` over the four taps `j`: one program per
/// `BT` patches × `BH` columns.
#[kernel(
    grid = (cdiv(out.rows(), BT), cdiv(out.cols(), BH)),
    tunable(BT = [8, 1, 32], BH = [256, 32, 64, 128, 512, 1024])
)]
pub fn pos_embed_bilinear(
    table: &Tensor<f32>,
    idx: &Tensor<i32>,
    weights: &Tensor<f32>,
    out: &Tensor<f32>,
) {
    let (t0, c) = (program_id(0) * BT, program_id(1) * BH);
    for t in t0..usize::min(t0 + BT, out.rows()) {
        let mut acc = zeros::<f32, 1, BH>();
        for j in 0..4 {
            // Cost-only runs without indices: any row costs the same.
            let row = load_index(
                idx,
                t * 4 + j,
                usize::min(t, table.rows().saturating_sub(1)),
            );
            let w = load::<1, 1>(weights, t, j);
            acc = add(&acc, &mul_col(&load::<1, BH>(table, row, c), &w));
        }
        store(out, t, c, &acc);
    }
}

fn bad(message: String) -> SimError {
    SimError::Launch {
        kernel: pos_embed_bilinear::META.name.to_string(),
        message,
    }
}

/// Runs [`pos_embed_bilinear()`] over `table [G², H]` with per-patch taps (`idx`, `weights`, four
/// per patch, row-major `[N, 4]`) into `out [N, H]`. An index outside the table or mismatched
/// shapes are a `SimError::Launch` naming them.
pub fn run_pos_embed_bilinear(
    launcher: &Launcher,
    table: &Tensor<f32>,
    idx: &[i32],
    weights: &[f32],
    out: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let n = out.rows();
    if idx.len() != n * TAPS || weights.len() != n * TAPS || table.cols() != out.cols() {
        return Err(bad(format!(
            "out {out:?} must be [N, H] with H = the table's width ({table:?}) and four indices and \
             weights per row ({} and {} given for N = {n})",
            idx.len(),
            weights.len()
        )));
    }
    if let Some((i, v)) = idx
        .iter()
        .enumerate()
        .find(|(_, v)| usize::try_from(**v).map_or(true, |v| v >= table.rows()))
    {
        return Err(bad(format!(
            "tap {i} indexes row {v} of a {}-row table",
            table.rows()
        )));
    }
    let idx = Tensor::<i32>::from_indices(&[idx.len()], idx).map_err(bad)?;
    let weights = Tensor::<f32>::from_f32(&[n, TAPS], weights).map_err(bad)?;
    let config = crate::tile_choice::covering_config(
        &pos_embed_bilinear::META,
        Config::new(),
        &[("BT", n, 8), ("BH", out.cols(), 1024)],
    );
    pos_embed_bilinear::launch(launcher, &config, table, &idx, &weights, out)
}

/// `torch.linspace(0, end, n)` in f32 (the first half stepped up from 0, the second half down from
/// `end`, as torch computes it).
fn linspace(end: f32, n: usize) -> Vec<f32> {
    if n <= 1 {
        return vec![0.0; n];
    }
    let step = end / (n - 1) as f32;
    (0..n)
        .map(|i| {
            if i < n / 2 {
                step * i as f32
            } else {
                end - step * (n - 1 - i) as f32
            }
        })
        .collect()
}

/// The four taps (table rows and weights, row-major `[N, 4]`) of every patch of images with patch
/// grids `grids` (`[t, h, w]` each) over a `side × side` table, as Qwen3-VL's
/// `fast_pos_embed_interpolate` computes them: bilinear with aligned corners (`linspace(0, side −
/// 1, h)` rows and likewise columns, f32), taps `[(r₀,c₀), (r₀,c₁), (r₁,c₀), (r₁,c₁)]` with weights
/// `[(1−dh)(1−dw), (1−dh)dw, dh(1−dw), dh·dw]`, repeated per frame, in the vision tower's patch
/// order ([`super::rotary::vision_positions`]: `merge × merge` blocks).
pub fn bilinear_taps(grids: &[[usize; 3]], side: usize, merge: usize) -> (Vec<i32>, Vec<f32>) {
    let last = side.saturating_sub(1);
    let (mut idx, mut wts) = (Vec::new(), Vec::new());
    for &[t, h, w] in grids {
        let (hs, ws) = (linspace(last as f32, h), linspace(last as f32, w));
        let tap = |r: usize, c: usize| {
            let (hf, wf) = (hs[r] as usize, ws[c] as usize);
            let (hc, wc) = ((hf + 1).min(last), (wf + 1).min(last));
            let (dh, dw) = (hs[r] - hf as f32, ws[c] - wf as f32);
            (
                [
                    hf * side + wf,
                    hf * side + wc,
                    hc * side + wf,
                    hc * side + wc,
                ]
                .map(|i| i as i32),
                [
                    (1.0 - dh) * (1.0 - dw),
                    (1.0 - dh) * dw,
                    dh * (1.0 - dw),
                    dh * dw,
                ],
            )
        };
        for p in super::rotary::vision_positions(&[[t, h, w]], merge) {
            let (i, v) = tap(p[1], p[2]);
            idx.extend(i);
            wts.extend(v);
        }
    }
    (idx, wts)
}
