//! Appending new tokens' cache rows to a paged KV pool: row `i` of `new [n, W]` is token position
//! `start + i` of a sequence whose pages are `block_table` (logical page → physical page), so it
//! lands on pool row `block_table[(start + i) / P] · P + (start + i) % P` of
//! `pool [pages·P, W]` (or `[pages, P, W]`: the same rows). `W` is whatever a token stores per
//! layer: `kv_heads·D` keys, the MLA latent plus its rope key, indexer keys.
//!
//! The block table comes from the model's allocator (`model::kv_cache::PagedKvCache`), which
//! owns page bookkeeping; this kernel only moves the bytes. A tile of new rows may straddle a page
//! boundary, so [`kv_cache_append()`] stores row by row, each through its own block-table entry.
//! [`run_kv_cache_append`] checks on the host that the table covers every position and that every
//! page lies in the pool (the kernel would otherwise write a wrong row silently, or nothing).

use dsl_core::prelude::*;
use dsl_core::{KernelMeta, SimError};

/// Paged append: one program per `BR` new rows × `BW` columns.
#[kernel(
    grid = (cdiv(new.rows(), BR), cdiv(new.cols(), BW)),
    tunable(BR = [16, 1, 4, 64], BW = [256, 32, 64, 128, 512, 1024])
)]
pub fn kv_cache_append<S: Float, T: Float>(
    new: &Tensor<S>,
    block_table: &Tensor<i32>,
    pool: &Tensor<T>,
    start: usize,
    page_size: usize,
) {
    let (r0, c) = (program_id(0) * BR, program_id(1) * BW);
    // (A zero page size is refused by the wrapper; here it must not divide by zero.)
    let p = usize::max(page_size, 1);
    for i in r0..usize::min(r0 + BR, new.rows()) {
        let pos = start + i;
        // Cost-only runs have no table: the identity page mapping costs the same.
        let page = load_index(block_table, pos / p, pos / p);
        let row = load_async::<1, BW>(new, i, c);
        // New rows in another format than the pool (f32 activations, a bf16 cache) convert
        // on chip, as serving engines' cache writes do.
        store(pool, page * p + pos % p, c, &cast::<T>(&row));
    }
}

/// Runs [`kv_cache_append()`]: writes `new [n, W]` to token positions `start..start + n` of the
/// sequence whose pages are `block_table`, in `pool` (`[pages·page_size, W]` or
/// `[pages, page_size, W]`). Errors (`SimError::Launch`) name what does not fit: a width that
/// differs from the pool's, a zero page size, a pool whose rows are not whole pages, a block table
/// too short for the last position, or a page number outside the pool.
pub fn run_kv_cache_append<S: Float, T: Float>(
    launcher: &Launcher,
    new: &Tensor<S>,
    block_table: &[usize],
    pool: &Tensor<T>,
    start: usize,
    page_size: usize,
) -> Result<Launch, SimError> {
    let bad = |message: String| SimError::Launch {
        kernel: kv_cache_append::META.name.to_string(),
        message,
    };
    if new.cols() != pool.cols() {
        return Err(bad(format!(
            "new rows {new:?} are {} wide but the pool {pool:?} stores {} per token",
            new.cols(),
            pool.cols()
        )));
    }
    let table = append_table(
        &kv_cache_append::META,
        new.rows(),
        pool,
        block_table,
        start,
        page_size,
    )?;
    let config = crate::tile_choice::covering_config(
        &kv_cache_append::META,
        Config::new(),
        &[("BR", new.rows(), 64), ("BW", new.cols(), 1024)],
    );
    kv_cache_append::launch(launcher, &config, new, &table, pool, start, page_size)
}

/// The device block table of an append of `new_rows` rows at `start` into a pool of `pool` rows
/// (`[pages·page_size, …]`), after checking on the host what the kernel cannot: a zero page size,
/// a pool whose rows are not whole pages, a table too short for the last position, or a page
/// outside the pool. Errors (`SimError::Launch`) name `kernel` and what would fix it.
pub(crate) fn append_table<T: Elem>(
    kernel: &KernelMeta,
    new_rows: usize,
    pool: &Tensor<T>,
    block_table: &[usize],
    start: usize,
    page_size: usize,
) -> Result<Tensor<i32>, SimError> {
    let bad = |message: String| SimError::Launch {
        kernel: kernel.name.to_string(),
        message,
    };
    let pool_rows = pool.rows();
    if page_size == 0 || !crate::tile_choice::divides(page_size, pool_rows) {
        return Err(bad(format!(
            "page size {page_size} does not divide the pool's {pool_rows} rows ({pool:?})"
        )));
    }
    let pool_pages = pool_rows / page_size;
    let end = start.saturating_add(new_rows);
    let needed = end.div_ceil(page_size);
    if block_table.len() < needed {
        return Err(bad(format!(
            "positions {start}..{end} need {needed} pages of {page_size} tokens but the block \
             table has {} (allocate the sequence's pages before appending)",
            block_table.len()
        )));
    }
    let first = start / page_size;
    if let Some((logical, page)) = block_table
        .iter()
        .enumerate()
        .take(needed)
        .skip(first)
        .find(|(_, p)| **p >= pool_pages)
    {
        return Err(bad(format!(
            "block table entry {logical} is page {page}, outside the pool's {pool_pages} pages"
        )));
    }
    // Entries past the last position are never read: only the checked ones go to the device.
    let idx: Vec<i32> = block_table[..needed].iter().map(|p| *p as i32).collect();
    Tensor::<i32>::from_indices(&[idx.len()], &idx).map_err(bad)
}
