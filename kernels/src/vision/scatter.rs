//! Row scatter: `out[positions[i], :] = src[i, :]`, or `+=` with `accumulate`.
//!
//! A multimodal prompt holds one placeholder token per image feature; the image embeddings go to
//! those rows of the text embeddings (`inputs_embeds[image_mask] = image_embeds`), and Qwen3-VL's
//! DeepStack adds the features of intermediate vision layers to the hidden states of the first
//! language layers at the same rows (`hidden[visual_pos_masks] += deepstack_feature`). Both are
//! this kernel: each program reads its rows' positions with `load_index` (a small blocking DMA:
//! the row address depends on it) and copies or adds `BH`-wide column tiles. Positions must be
//! distinct (two programs would race on one row); [`run_scatter_rows`] checks them on the host.

use dsl_core::prelude::*;
use dsl_core::SimError;

/// One program per `BT` source rows × `BH` columns.
#[kernel(
    grid = (cdiv(src.rows(), BT), cdiv(src.cols(), BH)),
    tunable(BT = [8, 1, 32], BH = [256, 32, 64, 128, 512, 1024])
)]
pub fn scatter_rows(
    src: &Tensor<f32>,
    positions: &Tensor<i32>,
    out: &Tensor<f32>,
    accumulate: bool,
) {
    let (t0, c) = (program_id(0) * BT, program_id(1) * BH);
    for t in t0..usize::min(t0 + BT, src.rows()) {
        // Cost-only runs without positions: any row costs the same.
        let p = load_index(positions, t, usize::min(t, out.rows().saturating_sub(1)));
        let row = load::<1, BH>(src, t, c);
        if accumulate {
            let cur = load::<1, BH>(out, p, c);
            store(out, p, c, &add(&cur, &row));
        } else {
            store(out, p, c, &row);
        }
    }
}

fn bad(message: String) -> SimError {
    SimError::Launch {
        kernel: scatter_rows::META.name.to_string(),
        message,
    }
}

/// Runs [`scatter_rows()`]: `src [N, H]` into the rows `positions` (N distinct, each `< T`) of
/// `out [T, H]`, adding with `accumulate`. A position out of range or repeated, or mismatched
/// widths, is a `SimError::Launch` naming it.
pub fn run_scatter_rows(
    launcher: &Launcher,
    src: &Tensor<f32>,
    positions: &[i32],
    out: &Tensor<f32>,
    accumulate: bool,
) -> Result<Launch, SimError> {
    if src.cols() != out.cols() || positions.len() != src.rows() {
        return Err(bad(format!(
            "src {src:?} must be [N, H] with one position per row ({} given) and H = out's width \
             (out {out:?})",
            positions.len()
        )));
    }
    let mut seen = vec![false; out.rows()];
    for (i, &p) in positions.iter().enumerate() {
        let slot = usize::try_from(p).ok().and_then(|p| seen.get_mut(p));
        match slot {
            None => {
                return Err(bad(format!(
                    "position {p} (entry {i}) is outside out's {} rows",
                    out.rows()
                )))
            }
            Some(true) => {
                return Err(bad(format!(
                    "position {p} appears twice (entry {i}): each row is written by one source row"
                )))
            }
            Some(s) => *s = true,
        }
    }
    let idx = Tensor::<i32>::from_indices(&[positions.len()], positions).map_err(bad)?;
    let config = crate::tile_choice::covering_config(
        &scatter_rows::META,
        Config::new(),
        &[("BT", src.rows(), 8), ("BH", src.cols(), 1024)],
    );
    scatter_rows::launch(launcher, &config, src, &idx, out, accumulate)
}
