//! Token embedding: `out[t, :] = table[ids[t], :]` (`ids [T, 1]` i32, `table [V, H]`, `out [T, H]`),
//! the first operator of a forward pass.
//!
//! [`embedding()`] reads each token's id with `load_index` (a small blocking DMA: the row address
//! depends on it) and copies that table row in `BH`-wide column tiles. The kernel cannot refuse an
//! id: one past the table would read zeros. [`run_embedding`] therefore checks every id on the
//! host first and names the position and the id of the first bad one.

use dsl_core::prelude::*;
use dsl_core::SimError;

/// Embedding lookup: one program per `BT` tokens × `BH` columns.
#[kernel(
    grid = (cdiv(out.rows(), BT), cdiv(out.cols(), BH)),
    tunable(BT = [8, 1, 32], BH = [256, 32, 64, 128, 512, 1024])
)]
pub fn embedding<S: Float, D: Float>(ids: &Tensor<i32>, table: &Tensor<S>, out: &Tensor<D>) {
    let (t0, c) = (program_id(0) * BT, program_id(1) * BH);
    for t in t0..usize::min(t0 + BT, out.rows()) {
        // Cost-only runs have no ids: any row costs the same.
        let id = load_index(ids, t, usize::min(t, table.rows().saturating_sub(1)));
        // A table in another format than the output (a bf16 cache gathered into f32 rows)
        // converts on chip.
        store(out, t, c, &cast::<D>(&load::<1, BH>(table, id, c)));
    }
}

/// Runs [`embedding()`] for `ids` (one per token) over `table [V, H]` into `out [ids.len(), H]`.
/// An id outside `0..V` is a `SimError::Launch` naming its position and value; mismatched shapes
/// are one naming both tensors.
pub fn run_embedding<S: Float, D: Float>(
    launcher: &Launcher,
    ids: &[i32],
    table: &Tensor<S>,
    out: &Tensor<D>,
) -> Result<Launch, SimError> {
    let bad = |message: String| SimError::Launch {
        kernel: embedding::META.name.to_string(),
        message,
    };
    let (vocab, hidden) = (table.rows(), table.cols());
    if out.rows() != ids.len() || out.cols() != hidden {
        return Err(bad(format!(
            "out is {out:?} but must be [{}, {hidden}]: one row per id, as wide as the table {table:?}",
            ids.len()
        )));
    }
    if let Some((pos, id)) = ids
        .iter()
        .enumerate()
        .find(|(_, id)| **id < 0 || **id as usize >= vocab)
    {
        return Err(bad(format!(
            "token id {id} at position {pos} is outside the vocabulary 0..{vocab} of the table {table:?}"
        )));
    }
    let ids_t = Tensor::<i32>::from_indices(&[ids.len(), 1], ids).map_err(bad)?;
    let config = crate::tile_choice::covering_config(
        &embedding::META,
        Config::new(),
        &[("BT", ids.len(), 32), ("BH", hidden, 1024)],
    );
    embedding::launch(launcher, &config, &ids_t, table, out)
}
