//! The order a tiled matrix product walks its output tiles in. Programs run in id order, so the
//! grid decides which tiles share the L2 at a time. Row-major over `(row tiles, column tiles)`,
//! the programs of one column sweep every row tile: a product whose activations outgrow the L2
//! (a prefill's thousands of rows) streams them from HBM once per column tile. Grouped (Triton's
//! `GROUP_SIZE_M` ordering), a group of [`TILE_GROUP`] row tiles meets every column before the
//! next group starts: its rows stay in the L2 while the columns go by, and the weight is reread
//! once per group. The order is spelled in the grid ([`grouped_grid`]) rather than remapped inside
//! a kernel, so the simulator's steady-state sampling sees it too.

use dsl_core::prelude::*;

/// Row tiles walked together (Triton's `GROUP_SIZE_M`).
pub const TILE_GROUP: usize = 8;

/// The grid of a grouped walk over `rows` rows shared by `experts` experts (1 for a dense product),
/// in `bm`-row tiles and `col_tiles` output column tiles: `(row tiles of a group, column tiles,
/// groups × experts)`. A balanced share of rows (`⌈⌈rows / E⌉ / bm⌉` row tiles per expert) is
/// split into groups of [`TILE_GROUP`] row tiles, and program ids run along a group's row tiles
/// first, then its columns, then the next group, then the next expert. Each program repeats the
/// events of the program one group row before it, which is what the sampler compares.
pub fn grouped_grid(
    rows: usize,
    experts: usize,
    bm: usize,
    col_tiles: usize,
) -> (usize, usize, usize) {
    let share = rows.div_ceil(experts.max(1)).div_ceil(bm.max(1));
    (
        share.min(TILE_GROUP),
        col_tiles,
        experts * share.div_ceil(TILE_GROUP),
    )
}

/// This program's `(expert, row tile, column tile, row-tile stride)` in a [`grouped_grid`] launch
/// over `experts` experts. A program strides over its expert's row tiles by the balanced share
/// rounded up to whole groups: balanced routing gives each program at most one tile, a skewed
/// expert's extra tiles are shared out over the same programs, and every row tile has exactly one
/// program.
#[kernel(helper)]
pub fn grouped_tile(experts: usize) -> (usize, usize, usize, usize) {
    let groups = num_programs(2) / experts;
    let group = program_id(2) % groups;
    (
        program_id(2) / groups,
        group * num_programs(0) + program_id(0),
        program_id(1),
        groups * num_programs(0),
    )
}
