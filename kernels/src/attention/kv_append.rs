//! Appending new tokens' cache rows to a paged KV pool: row `i` of `new [n, W]` goes to pool row
//! `slots[i]` of `pool [pages·P, W]` (or `[pages, P, W]`: the same rows), vLLM's `slot_mapping`.
//! For a sequence whose pages are `block_table` (logical page → physical page), token position
//! `pos` is slot `block_table[pos / P] · P + pos % P`; one launch may append the new rows of a
//! whole batch of sequences (a decode step's one token each, or prefill chunks), each row through
//! its own slot. `W` is whatever a token stores per layer: `kv_heads·D` keys, the MLA latent plus
//! its rope key, indexer keys.
//!
//! The block tables come from the model's allocator (`model::kv_cache::PagedKvCache`), which owns
//! page bookkeeping; this kernel only moves the bytes. [`run_kv_cache_append`] (one sequence) and
//! [`run_kv_cache_append_slots`] (any rows) check on the host what the kernel cannot: that the
//! table covers every position, that every page and slot lies in the pool, and that no two rows
//! share a slot (the kernel would otherwise write a wrong row silently, or race).

use dsl_core::prelude::*;
use dsl_core::{KernelMeta, SimError};

/// Paged append: one program per `BR` new rows × `BW` columns, each row stored at its slot.
#[kernel(
    grid = (cdiv(new.rows(), BR), cdiv(new.cols(), BW)),
    tunable(BR = [16, 1, 4, 64], BW = [256, 32, 64, 128, 512, 1024])
)]
pub fn kv_cache_append<S: Float, T: Float>(new: &Tensor<S>, slots: &Tensor<i32>, pool: &Tensor<T>) {
    let (r0, c) = (program_id(0) * BR, program_id(1) * BW);
    for i in r0..usize::min(r0 + BR, new.rows()) {
        // Cost-only runs have no slot table: the identity mapping costs the same.
        let slot = load_index(slots, i, i);
        let row = load_async::<1, BW>(new, i, c);
        // New rows in another format than the pool (f32 activations, a bf16 cache) convert
        // on chip, as serving engines' cache writes do.
        store(pool, slot, c, &cast::<T>(&row));
    }
}

/// Runs [`kv_cache_append()`] for one sequence: writes `new [n, W]` to token positions
/// `start..start + n` of the sequence whose pages are `block_table`, in `pool`
/// (`[pages·page_size, W]` or `[pages, page_size, W]`). Errors (`SimError::Launch`) name what
/// does not fit: a width that differs from the pool's, a zero page size, a pool whose rows are not
/// whole pages, a block table too short for the last position, or a page number outside the pool.
pub fn run_kv_cache_append<S: Float, T: Float>(
    launcher: &Launcher,
    new: &Tensor<S>,
    block_table: &[usize],
    pool: &Tensor<T>,
    start: usize,
    page_size: usize,
) -> Result<Launch, SimError> {
    check_append(
        &kv_cache_append::META,
        new.rows(),
        pool,
        block_table,
        start,
        page_size,
    )?;
    let slots = append_slots(block_table, start, new.rows(), page_size);
    run_kv_cache_append_slots(launcher, new, &slots, pool)
}

/// Pool rows of token positions `start..start + n` of a sequence whose pages are `block_table`
/// (pages of `page_size` tokens). Positions past the table, or a zero page size, give no slot:
/// the result is then shorter than `n`, which [`run_kv_cache_append_slots`] refuses
/// ([`run_kv_cache_append`] checks the table first and names what is missing).
pub fn append_slots(block_table: &[usize], start: usize, n: usize, page_size: usize) -> Vec<usize> {
    if page_size == 0 {
        return Vec::new();
    }
    (start..start.saturating_add(n))
        .map_while(|pos| {
            let page = block_table.get(pos / page_size)?;
            page.checked_mul(page_size)?.checked_add(pos % page_size)
        })
        .collect()
}

/// Runs [`kv_cache_append()`] with row `i` of `new [n, W]` stored at pool row `slots[i]`: the new
/// rows of any number of sequences in one launch. Errors (`SimError::Launch`) name what does not
/// fit: a width that differs from the pool's, a slot count that differs from the rows, a slot
/// outside the pool, or two rows sent to one slot.
pub fn run_kv_cache_append_slots<S: Float, T: Float>(
    launcher: &Launcher,
    new: &Tensor<S>,
    slots: &[usize],
    pool: &Tensor<T>,
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
    let slots = device_slots(&kv_cache_append::META, new.rows(), slots, pool.rows())?;
    let config = crate::tile_choice::covering_config(
        &kv_cache_append::META,
        append_rows_config(launcher, &kv_cache_append::META, new.rows(), 1),
        &[("BW", new.cols(), 1024)],
    );
    kv_cache_append::launch(launcher, &config, new, &slots, pool)
}

/// The rows per program (`BR`) of an append of `rows` rows over `column_blocks` programs per row
/// block: as many rows as still give every core of the device a program. A program writes its
/// rows one after another (each waits for its slot), so a decode step's few rows spread one per
/// core rather than queue up in two programs.
pub(crate) fn append_rows_config(
    launcher: &Launcher,
    meta: &KernelMeta,
    rows: usize,
    column_blocks: usize,
) -> Config {
    let cores = launcher.preset.cores as usize;
    let wanted = cores.div_ceil(column_blocks.max(1));
    match crate::tile_choice::filling(meta, "BR", rows, wanted) {
        Some(br) => Config::new().with("BR", br),
        None => Config::new(),
    }
}

/// The device slot table of an append of `new_rows` rows into a pool of `pool_rows` rows, after
/// checking on the host what the kernel cannot: one slot per row, every slot inside the pool, no
/// two rows in one slot. Errors (`SimError::Launch`) name `kernel` and the offending slot.
pub(crate) fn device_slots(
    kernel: &KernelMeta,
    new_rows: usize,
    slots: &[usize],
    pool_rows: usize,
) -> Result<Tensor<i32>, SimError> {
    let bad = |message: String| SimError::Launch {
        kernel: kernel.name.to_string(),
        message,
    };
    if slots.len() != new_rows {
        return Err(bad(format!(
            "{} slots for {new_rows} new rows: give one pool row per new row",
            slots.len()
        )));
    }
    let table = device_rows(kernel, slots, pool_rows, "slot", |i, s| {
        format!("slot {s} of new row {i} is outside the pool's {pool_rows} rows")
    })?;
    let mut sorted = slots.to_vec();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(bad(format!(
            "two new rows go to pool row {}: each row needs its own slot",
            w[0]
        )));
    }
    Ok(table)
}

/// Pool row numbers as the device's i32 table (as `load_index` reads them), after checking each
/// is inside the pool's `pool_rows` rows: `outside(i, row)` words the error for entry `i`, `what`
/// names the index in the error of a pool past i32. Errors (`SimError::Launch`) name `kernel`.
pub(crate) fn device_rows(
    kernel: &KernelMeta,
    rows: &[usize],
    pool_rows: usize,
    what: &str,
    outside: impl Fn(usize, usize) -> String,
) -> Result<Tensor<i32>, SimError> {
    let bad = |message: String| SimError::Launch {
        kernel: kernel.name.to_string(),
        message,
    };
    if let Some((i, r)) = rows.iter().enumerate().find(|(_, r)| **r >= pool_rows) {
        return Err(bad(outside(i, *r)));
    }
    let idx: Vec<i32> = rows
        .iter()
        .map(|r| i32::try_from(*r))
        .collect::<Result<_, _>>()
        .map_err(|_| {
            bad(format!(
                "the pool's {pool_rows} rows are past an i32 {what} index"
            ))
        })?;
    Tensor::<i32>::from_indices(&[idx.len()], &idx).map_err(bad)
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
    let needed = check_append(kernel, new_rows, pool, block_table, start, page_size)?;
    // Entries past the last position are never read: only the checked ones go to the device.
    let idx: Vec<i32> = block_table[..needed].iter().map(|p| *p as i32).collect();
    Tensor::<i32>::from_indices(&[idx.len()], &idx).map_err(|message| SimError::Launch {
        kernel: kernel.name.to_string(),
        message,
    })
}

/// The host checks of an append of `new_rows` rows at `start` through `block_table` (see
/// [`append_table`]); returns the number of table entries the append reads.
fn check_append<T: Elem>(
    kernel: &KernelMeta,
    new_rows: usize,
    pool: &Tensor<T>,
    block_table: &[usize],
    start: usize,
    page_size: usize,
) -> Result<usize, SimError> {
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
    Ok(needed)
}
