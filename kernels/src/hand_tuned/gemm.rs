//! Hand-tuned GEMM `C[M×N] = A[M×K] · B[K×N]` (f32 accumulation), written against
//! [`accel_sim::manual`]: the swap target of the DSL prototypes in [`crate::gemm`].
//!
//! What it does that the DSL versions leave to the front end:
//! - **placement**: `STAGES` A/B buffer pairs and two accumulators are placed once, back to back
//!   from byte 0 of the core's SRAM; nothing else is allocated, so no tile waits for a region to
//!   free;
//! - **a `STAGES`-deep ring**: K-step `j` loads into stage `j mod STAGES`, and the load of step
//!   `j + STAGES` waits only on the event of the multiply of step `j` that read the stage, so up to
//!   `STAGES` steps are in flight (the DSL pipelines hold two or three);
//! - **no zero fill**: a tile's first K-step multiplies in overwrite mode, so the accumulator is
//!   never cleared on the vector unit;
//! - **two accumulators**: tile `u` accumulates into `acc[u mod 2]` while tile `u − 1` is stored
//!   from the other; the first multiply of tile `u` waits on the store of tile `u − 2` only;
//! - **persistent, banded order**: one program per core walks its tiles as one stream of K-steps,
//!   the next tile's loads issued during the current tile's last steps, tiles in the L2-friendly
//!   bands of [`crate::gemm::tile_group`].

use super::{Placer, Ring};
use crate::gemm::{persistent_programs, tile_group};
use accel_sim::manual::{Accumulate, Buffer, DeviceTensor, Event, ManualProgram};
use accel_sim::DType;
use dsl_core::{Config, Float, KernelMeta, Launch, Launcher, SimError, Tensor};
use std::collections::VecDeque;

const SOURCE: &str = include_str!("gemm.rs");

/// Registry and tuning metadata of [`launch`]: tile sides (`BM`, `BN`, `BK`, multiples of the
/// cube fragment; 176 = 11 fragments cuts 1024 into 6 tiles, as for [`crate::gemm::gemm_persistent`])
/// and the depth of the load ring (`STAGES`).
pub static META: KernelMeta = super::meta(
    "gemm_hand",
    &["a", "b", "c"],
    &[
        ("BM", &[128, 64, 176, 256, 32, 16]),
        ("BN", &[128, 64, 176, 256, 512]),
        ("BK", &[128, 64, 256]),
        ("STAGES", &[4, 3, 2]),
    ],
    file!(),
    SOURCE,
);

/// Tile sides and ring depth of one launch, and how its tiles are spread.
#[derive(Debug, Clone, Copy)]
struct Tiles {
    ring: Ring,
    /// Band width of the tile order (see [`crate::gemm::grouped_tile`]).
    group: usize,
    /// Programs (one per core, or one per tile when there are fewer tiles).
    programs: usize,
}

/// Runs the hand-tuned GEMM with `config` (unset tunables take their first value): `a [M, K]`,
/// `b [K, N]`, `c [M, N]`.
pub fn launch<T: Float>(
    launcher: &Launcher,
    config: &Config,
    a: &Tensor<T>,
    b: &Tensor<T>,
    c: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let cfg = META.resolve(config)?;
    let (m, k) = (a.rows(), a.cols());
    let n = b.cols();
    if b.rows() != k || c.shape() != [m, n] {
        return Err(SimError::Launch {
            kernel: META.name.to_string(),
            message: format!(
                "shapes do not chain: a {a:?}, b {b:?}, c {c:?} (need a [M, K], b [K, N], c [M, N])"
            ),
        });
    }
    let ring = Ring::of(&cfg);
    let (bm, bn) = (ring.bm, ring.bn);
    let cores = launcher.preset.cores as usize;
    let t = Tiles {
        ring,
        group: tile_group(m, n, bm, bn, cores),
        programs: persistent_programs(m, n, bm, bn, cores).max(1),
    };
    launcher.run_manual(META.name, SOURCE, &cfg, [t.programs, 1, 1], &|pid, p| {
        program(p, pid[0], a, b, c, t)
    })
}

/// Tile `t`'s (row, column) in the banded order of [`crate::gemm::grouped_tile`] (the DSL helper
/// computes the same numbering inside a kernel).
fn band_tile(tiles_m: usize, tiles_n: usize, group: usize, t: usize) -> (usize, usize) {
    let (g, tm) = (group.max(1), tiles_m.max(1));
    let band = t / (g * tm);
    let width = g.min(tiles_n.saturating_sub(band * g)).max(1);
    let u = t - band * g * tm;
    (u / width, band * g + u % width)
}

/// Program `id`: its tiles `id, id + P, ...` as one stream of K-steps through the load ring.
fn program<T: Float>(
    p: &mut ManualProgram,
    id: usize,
    a: &Tensor<T>,
    b: &Tensor<T>,
    c: &Tensor<f32>,
    t: Tiles,
) {
    let (m, n, depth) = (c.rows(), c.cols(), a.cols());
    let r = t.ring;
    let (tiles_m, tiles_n) = (m.div_ceil(r.bm), n.div_ceil(r.bn));
    let ksteps = depth.div_ceil(r.bk).max(1);
    let steps = (tiles_m * tiles_n).saturating_sub(id).div_ceil(t.programs) * ksteps;
    let dt = T::DTYPE;
    // Placement: the ring's stages, then the two accumulators, from byte 0.
    let mut sram = Placer::default();
    let mut place = |p: &mut ManualProgram, name, rows, cols, dtype: DType| {
        sram.place(p, line!(), name, rows, cols, dtype)
    };
    let stage: Vec<(Buffer, Buffer)> = (0..r.stages)
        .map(|_| {
            (
                place(p, "a_stage", r.bm, r.bk, dt),
                place(p, "b_stage", r.bk, r.bn, dt),
            )
        })
        .collect();
    let acc = [
        place(p, "acc0", r.bm, r.bn, DType::F32),
        place(p, "acc1", r.bm, r.bn, DType::F32),
    ];
    // Output tile origin and K offset of step `j`.
    let origin = |j: usize| {
        let tile = id + (j / ksteps) * t.programs;
        let (tr, tc) = band_tile(tiles_m, tiles_n, t.group, tile);
        (tr * r.bm, tc * r.bn, (j % ksteps) * r.bk)
    };
    let load = |p: &mut ManualProgram, j: usize, wait: &[Event]| {
        let (row, col, k) = origin(j);
        let (sa, sb) = stage[j % r.stages];
        let ea = p
            .at(line!())
            .dma_in(a as &dyn DeviceTensor, row, k, sa, wait);
        let eb = p
            .at(line!())
            .dma_in(b as &dyn DeviceTensor, k, col, sb, wait);
        (ea, eb)
    };
    let mut in_flight: VecDeque<(Event, Event)> =
        (0..r.stages.min(steps)).map(|j| load(p, j, &[])).collect();
    let mut stored: [Option<Event>; 2] = [None, None];
    for j in 0..steps {
        let Some((ea, eb)) = in_flight.pop_front() else {
            break;
        };
        let slot = (j / ksteps) % 2;
        let mut wait = vec![ea, eb];
        let mode = if j % ksteps == 0 {
            // The accumulator's previous tile must have left for device memory.
            wait.extend(stored[slot].take());
            Accumulate::Overwrite
        } else {
            Accumulate::Add
        };
        let (sa, sb) = stage[j % r.stages];
        let done = p.at(line!()).mma(acc[slot], sa, sb, mode, &wait);
        if j + r.stages < steps {
            in_flight.push_back(load(p, j + r.stages, &[done]));
        }
        if (j + 1) % ksteps == 0 {
            let (row, col, _) = origin(j);
            stored[slot] = Some(p.at(line!()).dma_out(acc[slot], c, row, col, &[done]));
        }
    }
}
