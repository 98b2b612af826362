//! Hand-tuned MXFP4 expert GEMM `y[e] = x[e] · W[e]ᵀ` with `W` packed (`blocks [E, N, K/2]`,
//! `scales [E, N, K/32]`) and dequantized on chip, written against [`accel_sim::manual`]: the
//! swap target of [`crate::moe::expert_gemm::expert_gemm_mxfp4`] (same grid, same inputs).
//!
//! The DSL prototype dequantizes each K-step's weight tile into a new tile, which takes the SRAM
//! region the previous step's dequantized tile is leaving: the dequantization of step `j + 1` waits
//! for the multiply of step `j`, so the vector unit and the matrix unit take turns. Here:
//! - **two placed dequantization buffers**: step `j` dequantizes into `w[j mod 2]`, waiting only on
//!   its own loads and on the multiply of step `j − 2` that read the buffer, so the vector unit
//!   dequantizes step `j + 1` while the matrix unit multiplies step `j`;
//! - **a `STAGES`-deep load ring** for the activations, packed blocks and scales: a stage's packed
//!   weights are reloaded as soon as their dequantization is done (not their multiply);
//! - **no zero fill**: the first K-step multiplies in overwrite mode.
//!
//! [`launch_grouped`] is the same kernel over the model's layout, the swap target of
//! [`crate::moe::grouped::grouped_linear_mxfp4`]: rows of all experts in one tensor, expert
//! `e`'s rows `offsets[e]..offsets[e + 1]` (read on chip at run time); rows held in f32 (the
//! reference path) have each K-step's activations rounded to bf16 on the vector unit into two
//! placed buffers as the weights are, rows held in bf16 (native precision) are loaded as they are,
//! and an output held in bf16 leaves through a bf16 buffer the accumulator is cast into.

use super::{Placer, Ring};
use accel_sim::manual::{Accumulate, Buffer, DeviceTensor, Event, ManualProgram};
use accel_sim::DType;
use dsl_core::{bf16, Config, KernelMeta, Launch, Launcher, SimError, Tensor};
use std::collections::VecDeque;

const SOURCE: &str = include_str!("expert_gemm_mxfp4.rs");

/// Registry and tuning metadata of [`launch`]: token tile `BM`, output tile `BN`, K-step `BK` (a
/// multiple of the 32-value MX block) and the load ring's depth `STAGES`.
pub static META: KernelMeta = super::meta(
    "expert_gemm_mxfp4_hand",
    &["x", "w_blocks", "w_scales", "y"],
    &[
        ("BM", &[16, 32, 64, 128]),
        ("BN", &[128, 64, 256]),
        ("BK", &[128, 64, 256]),
        ("STAGES", &[3, 2, 4]),
    ],
    file!(),
    SOURCE,
);

/// Registry and tuning metadata of [`launch_grouped`] (the tunables of [`META`]; a shallower ring
/// first, since f32 activation stages are twice as wide as bf16 ones).
pub static GROUPED_META: KernelMeta = super::meta(
    "grouped_linear_mxfp4_hand",
    &["x", "blocks", "scales", "offsets", "y"],
    &[
        ("BM", &[16, 32, 64, 128]),
        ("BN", &[128, 64, 256]),
        ("BK", &[128, 64, 256]),
        ("STAGES", &[2, 3, 4]),
    ],
    file!(),
    SOURCE,
);

/// Runs the hand-tuned MXFP4 expert GEMM over run-time expert row ranges: `x [R, K]` (f32,
/// held in f32 or bf16), `blocks [E, N, K/2]`, `scales [E, N, K/32]` (u8), `offsets [E + 1]`
/// (expert `e` owns rows `offsets[e]..offsets[e + 1]`), `y [R, N]` (f32, held in f32 or bf16). The grid is the DSL prototype's
/// ([`crate::tile_order::grouped_grid`]: an even share's row tiles in groups of
/// [`crate::tile_order::TILE_GROUP`], `N / BN`, groups × `E`), each program striding over its
/// expert's row tiles, so the swap walks the tiles in the same order. Cost-only launches (no
/// offsets data) share the rows evenly, as the prototype does.
pub fn launch_grouped(
    launcher: &Launcher,
    config: &Config,
    x: &Tensor<f32>,
    blocks: &Tensor<u8>,
    scales: &Tensor<u8>,
    offsets: &Tensor<i32>,
    y: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let cfg = GROUPED_META.resolve(config)?;
    let bad = |message: String| crate::weight::bad(GROUPED_META.name, message);
    let (rows, k) = (x.rows(), x.cols());
    let (e, n) = match blocks.shape() {
        [e, n, _] => (*e, *n),
        s => return Err(bad(format!("`blocks` must be [E, N, K/2], got {s:?}"))),
    };
    if e == 0
        || k % 32 != 0
        || blocks.shape() != [e, n, k / 2]
        || scales.shape() != [e, n, k / 32]
        || offsets.shape().iter().product::<usize>() != e + 1
        || y.shape() != [rows, n]
    {
        return Err(bad(format!(
            "shapes do not chain: x {x:?}, blocks {blocks:?}, scales {scales:?}, offsets {offsets:?}, y {y:?} (need x [R, K] with K a multiple of 32, blocks [E, N, K/2], scales [E, N, K/32], offsets [E + 1], y [R, N])"
        )));
    }
    // One row of E + 1 entries, so a program reads its expert's two with one transfer.
    let offsets = &offsets.reshaped(&[1, e + 1]).map_err(bad)?;
    let t = Ring::of(&cfg);
    let (gx, gy, gz) = crate::tile_order::grouped_grid(rows, e, t.bm, n.div_ceil(t.bn));
    // An even share of no rows still launches one (empty) program per expert and column tile.
    let grid = [gx.max(1), gy, gz.max(e)];
    let groups = grid[2] / e;
    let describe = |key: &mut dsl_core::ArgKey| {
        use dsl_core::LaunchArg;
        LaunchArg::describe(x, key);
        LaunchArg::describe(blocks, key);
        LaunchArg::describe(scales, key);
        LaunchArg::describe(offsets, key);
        LaunchArg::describe(y, key);
    };
    launcher.run_manual_keyed(&GROUPED_META, SOURCE, &cfg, grid, &describe, &|pid, p| {
        let ex = pid[2] / groups;
        let tile_row = pid[2] % groups * grid[0] + pid[0];
        let mut sram = Placer::default();
        // The expert's row range, read on chip; the program's row tiles depend on it.
        let range = sram.place(p, line!(), "offsets", 1, 2, DType::I32);
        let loaded = p.at(line!()).dma_in(offsets, 0, ex, range, &[]);
        let start = p.at(line!()).index_at(range, 0, ex * rows / e, &[loaded]);
        let end = p
            .at(line!())
            .index_at(range, 1, (ex + 1) * rows / e, &[loaded]);
        let (xe, ye) = (x.rows_clipped(start, end), y.rows_clipped(start, end));
        let (be, se) = (blocks.at(ex), scales.at(ex));
        let col = pid[1] * t.bn;
        let tiles: Vec<(usize, usize)> = (tile_row * t.bm..xe.rows())
            .step_by(groups * grid[0] * t.bm)
            .map(|row| (row, col))
            .collect();
        program(p, sram, &tiles, &xe, &be, &se, &ye, t)
    })
}

/// Runs the hand-tuned MXFP4 expert GEMM: `x [E, T, K]` (bf16), `w_blocks [E, N, K/2]` and
/// `w_scales [E, N, K/32]` (u8), `y [E, T, N]` (f32); one program per (token tile, output tile,
/// expert), as the DSL prototype.
pub fn launch(
    launcher: &Launcher,
    config: &Config,
    x: &Tensor<bf16>,
    w_blocks: &Tensor<u8>,
    w_scales: &Tensor<u8>,
    y: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let cfg = META.resolve(config)?;
    let (e, t, k) = match x.shape() {
        [e, t, k] => (*e, *t, *k),
        s => return Err(bad(format!("`x` must be [E, T, K], got {s:?}"))),
    };
    let n = w_blocks.shape().get(1).copied().unwrap_or(0);
    if k % 32 != 0
        || w_blocks.shape() != [e, n, k / 2]
        || w_scales.shape() != [e, n, k / 32]
        || y.shape() != [e, t, n]
    {
        return Err(bad(format!(
            "shapes do not chain: x {x:?}, w_blocks {w_blocks:?}, w_scales {w_scales:?}, y {y:?} (need K a multiple of 32, blocks [E, N, K/2], scales [E, N, K/32], y [E, T, N])"
        )));
    }
    let tiles = Ring::of(&cfg);
    let grid = [t.div_ceil(tiles.bm), n.div_ceil(tiles.bn), e];
    launcher.run_manual(META.name, SOURCE, &cfg, grid, &|pid, p| {
        let ex = pid[2];
        let (xe, be, se, ye) = (x.at(ex), w_blocks.at(ex), w_scales.at(ex), y.at(ex));
        let tile = [(pid[0] * tiles.bm, pid[1] * tiles.bn)];
        program(p, Placer::default(), &tile, &xe, &be, &se, &ye, tiles)
    })
}

/// Runs the hand-tuned kernel (`hand_tuned`) or its DSL prototype on `experts × tokens` bf16
/// activations and a random `[experts, n, k]` weight quantized to MXFP4 with the OCP rule, output
/// poisoned; in functional runs the report's `max_rel_error` is against the f64 product of the
/// dequantized weights. What `day0 compare expert_gemm_mxfp4` and the tests run.
pub fn run_case(
    launcher: &Launcher,
    hand_tuned: bool,
    [experts, tokens, n, k]: [usize; 4],
    config: &Config,
    seed: u64,
) -> Result<dsl_core::Report, SimError> {
    use crate::moe::expert_gemm::{expert_gemm_mxfp4, prepare_weight, ExpertWeight, WeightPath};
    let functional = launcher.backend == dsl_core::Backend::Functional;
    let mut rng = crate::testdata::Rng::new(seed);
    let x: Tensor<bf16> = if functional {
        Tensor::from_f32(&[experts, tokens, k], &rng.vec(experts * tokens * k, 1.0)).map_err(bad)?
    } else {
        Tensor::shape_only(&[experts, tokens, k])
    };
    let w = prepare_weight(
        launcher,
        WeightPath::Mxfp4Online,
        [experts, n, k],
        &mut rng,
        "w",
    )?;
    let ExpertWeight::Mxfp4 { blocks, scales } = &w.device else {
        return Err(bad("the MXFP4 path stores packed blocks and scales".into()));
    };
    let y: Tensor<f32> = if functional {
        Tensor::poisoned(&[experts, tokens, n])
    } else {
        Tensor::shape_only(&[experts, tokens, n])
    };
    let mut report = if hand_tuned {
        launch(launcher, config, &x, blocks, scales, &y)?.report
    } else {
        expert_gemm_mxfp4::launch(launcher, config, &x, blocks, scales, &y)?.report
    };
    if let (Some(out), Some(xv), Some(wv)) = (y.to_vec(), x.to_vec(), &w.values) {
        let mut want = vec![0.0f64; experts * tokens * n];
        for (i, o) in want.iter_mut().enumerate() {
            let (row, j) = (i / n, i % n);
            let ex = row / tokens;
            let (xr, wr) = (
                &xv[row * k..(row + 1) * k],
                &wv[(ex * n + j) * k..(ex * n + j + 1) * k],
            );
            *o = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
        }
        report.max_rel_error = Some(crate::reference::rel_error(&out, &want));
    }
    Ok(report)
}

fn bad(message: String) -> SimError {
    SimError::Launch {
        kernel: META.name.to_string(),
        message,
    }
}

/// Output tiles (`row`, `col`) of one expert, one after another: each a K loop through the load
/// ring and the two dequantization buffers. Activations that are not held in bf16 (the reference
/// path's f32 rows) are rounded to bf16 on the vector unit, into two more placed buffers, as the
/// weights are dequantized; an output held in bf16 is cast into one more. `sram` places the buffers after whatever the caller placed.
#[allow(clippy::too_many_arguments)]
fn program(
    p: &mut ManualProgram,
    mut sram: Placer,
    tiles: &[(usize, usize)],
    x: &dyn DeviceTensor,
    blocks: &Tensor<u8>,
    scales: &Tensor<u8>,
    y: &Tensor<f32>,
    t: Ring,
) {
    if tiles.is_empty() {
        return;
    }
    let steps = x.cols().div_ceil(t.bk).max(1);
    let cast = x.dtype() != DType::Bf16;
    let mut place = |p: &mut ManualProgram, name, rows, cols, dtype: DType| {
        sram.place(p, line!(), name, rows, cols, dtype)
    };
    // Per stage: activations, packed blocks, scales.
    let stage: Vec<(Buffer, Buffer, Buffer)> = (0..t.stages)
        .map(|_| {
            (
                place(p, "x_stage", t.bm, t.bk, x.dtype()),
                place(p, "blocks_stage", t.bn, t.bk / 2, DType::U8),
                place(p, "scales_stage", t.bn, t.bk / 32, DType::U8),
            )
        })
        .collect();
    let w = [
        place(p, "w0", t.bn, t.bk, DType::Bf16),
        place(p, "w1", t.bn, t.bk, DType::Bf16),
    ];
    let xb = cast.then(|| {
        [
            place(p, "x_bf16_0", t.bm, t.bk, DType::Bf16),
            place(p, "x_bf16_1", t.bm, t.bk, DType::Bf16),
        ]
    });
    let acc = place(p, "acc", t.bm, t.bn, DType::F32);
    // An output held narrower than f32 (bf16 activations at native precision) leaves through a
    // buffer of its format: DMA does not convert.
    let out = (DeviceTensor::dtype(y) != DType::F32)
        .then(|| place(p, "out", t.bm, t.bn, DeviceTensor::dtype(y)));
    let mut out_stored: Option<Event> = None;
    // Step `j`'s loads (step `j` of tile `j / steps`): the packed weights wait on the
    // dequantization that read their stage, the activations on what read theirs (the cast, or
    // the multiply), in that order on the DMA-in queue.
    let load = |p: &mut ManualProgram, j: usize, dequantized: &[Event], read_x: &[Event]| {
        let (sx, sb, ss) = stage[j % t.stages];
        let (row, col) = tiles[j / steps];
        let k = (j % steps) * t.bk;
        let eb = p.at(line!()).dma_in(blocks, col, k / 2, sb, dequantized);
        let es = p.at(line!()).dma_in(scales, col, k / 32, ss, &[]);
        let ex = p.at(line!()).dma_in(x, row, k, sx, read_x);
        (eb, es, ex)
    };
    let total = steps * tiles.len();
    let mut loads: VecDeque<(Event, Event, Event)> = (0..t.stages.min(total))
        .map(|j| load(p, j, &[], &[]))
        .collect();
    // The multiply of each of the last two steps (it frees `w[j mod 2]` and `xb[j mod 2]`), and
    // the store of the last tile (it frees the accumulator).
    let mut multiplied: [Option<Event>; 2] = [None, None];
    let mut stored = None;
    for j in 0..total {
        let Some((eb, es, ex)) = loads.pop_front() else {
            break;
        };
        let (sx, sb, ss) = stage[j % t.stages];
        let mut wait = vec![eb, es];
        wait.extend(multiplied[j % 2]);
        let deq = p.at(line!()).dequant_mxfp4(sb, ss, w[j % 2], &wait);
        let (a, read_x) = match xb {
            Some(xb) => {
                let mut wait = vec![ex];
                wait.extend(multiplied[j % 2]);
                let c = p.at(line!()).cast(sx, xb[j % 2], &wait);
                (xb[j % 2], c)
            }
            None => (sx, ex),
        };
        let first = j % steps == 0;
        let mut wait = vec![read_x, deq];
        if first {
            // The accumulator's previous tile must have left for device memory.
            wait.extend(stored.take());
        }
        let mode = if first {
            Accumulate::Overwrite
        } else {
            Accumulate::Add
        };
        let mm = p.at(line!()).mma_bt(acc, a, w[j % 2], mode, &wait);
        multiplied[j % 2] = Some(mm);
        if j + t.stages < total {
            let x_free = if cast { read_x } else { mm };
            loads.push_back(load(p, j + t.stages, &[deq], &[x_free]));
        }
        if (j + 1) % steps == 0 {
            let (row, col) = tiles[j / steps];
            // `stored` frees the accumulator for the next tile: its store, or its cast.
            stored = Some(match out {
                Some(out) => {
                    let mut wait = vec![mm];
                    wait.extend(out_stored.take());
                    let c = p.at(line!()).cast(acc, out, &wait);
                    out_stored = Some(p.at(line!()).dma_out(out, y, row, col, &[c]));
                    c
                }
                None => p.at(line!()).dma_out(acc, y, row, col, &[mm]),
            });
        }
    }
}
