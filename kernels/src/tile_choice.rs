//! Picking tile sizes from a kernel's declared tunable space, for host wrappers that launch a
//! kernel on whatever shape a model hands them (so callers need not know the space).

use dsl_core::{Config, KernelMeta, SimError};

/// The declared values of tunable `name` of `meta`, ascending (empty if there is no such tunable).
pub fn declared(meta: &KernelMeta, name: &str) -> Vec<i64> {
    let mut v: Vec<i64> = meta
        .tunables
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.to_vec())
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// The smallest declared value of `name` that is ≥ `size`, among those ≤ `cap`; when none covers
/// `size`, the largest one ≤ `cap` (the kernel then loops or tiles over the rest). `None` when no
/// declared value is ≤ `cap`.
pub fn covering(meta: &KernelMeta, name: &str, size: usize, cap: i64) -> Option<i64> {
    let vals: Vec<i64> = declared(meta, name)
        .into_iter()
        .filter(|v| *v <= cap)
        .collect();
    vals.iter()
        .copied()
        .find(|v| *v as usize >= size)
        .or(vals.last().copied())
}

/// A configuration with, for each `(name, size, cap)`, the [`covering`] value of `name` (or `cap`
/// when no declared value is ≤ `cap`), on top of `base`.
pub fn covering_config(meta: &KernelMeta, base: Config, dims: &[(&str, usize, i64)]) -> Config {
    dims.iter().fold(base, |config, (name, size, cap)| {
        config.with(name, covering(meta, name, *size, *cap).unwrap_or(*cap))
    })
}

/// The largest declared value of `name` that still splits `size` into at least `programs` tiles
/// (rows handed out so every core gets one), or the smallest declared value when none does:
/// for kernels whose programs walk their tile's rows one after another, where a wide tile would
/// leave cores idle while a few programs work through their rows in series.
pub fn filling(meta: &KernelMeta, name: &str, size: usize, programs: usize) -> Option<i64> {
    let vals = declared(meta, name);
    vals.iter()
        .rev()
        .find(|v| size.div_ceil(**v as usize) >= programs)
        .or(vals.first())
        .copied()
}

/// The smallest declared value of `name` that is ≥ `size`, or `None` when every one is smaller
/// (for kernels that must hold the whole dimension in one tile).
pub fn at_least(meta: &KernelMeta, name: &str, size: usize) -> Option<i64> {
    declared(meta, name)
        .into_iter()
        .find(|v| *v as usize >= size)
}

/// The declared values of `name` that are ≤ `size`, largest first (the tiles to try in turn
/// when the largest may not fit on chip, e.g. key tiles within a page).
pub fn up_to(meta: &KernelMeta, name: &str, size: usize) -> Vec<i64> {
    let mut v: Vec<i64> = declared(meta, name)
        .into_iter()
        .filter(|b| *b as usize <= size)
        .collect();
    v.reverse();
    v
}

/// Whether `value` is one of the declared values of `name` (for tunables that must equal a shape
/// exactly, such as a head dimension).
pub fn is_declared(meta: &KernelMeta, name: &str, value: usize) -> bool {
    declared(meta, name).contains(&(value as i64))
}

/// Whether `d` (≥ 1) divides `n`, for shape checks. Written without `%` so clippy's
/// `is_multiple_of` hint (Rust 1.87) does not apply: the workspace declares rust-version 1.85.
pub fn divides(d: usize, n: usize) -> bool {
    n / d * d == n
}

/// The configuration whose tiles cover run-time problem dimensions: for each `(tunable, size,
/// what)` the tile must be at least `size`. Among the instantiated points of `meta`'s space that
/// agree with the tunables `base` sets, the one with the least padding (smallest sum of the
/// covering tiles) wins, ties going to the earlier point in declaration order (the kernel's
/// preferred defaults come first). Errors when no point covers the dimensions, naming each
/// dimension (`what`) and the largest tile.
pub fn cover(
    meta: &KernelMeta,
    base: &Config,
    dims: &[(&str, usize, &str)],
) -> Result<Config, SimError> {
    let agrees = |c: &Config| base.0.iter().all(|(n, v)| c.get(n).is_none_or(|x| x == *v));
    let covers = |c: &Config| {
        dims.iter()
            .all(|(n, size, _)| c.get(n).is_some_and(|t| t as usize >= *size))
    };
    let padding = |c: &Config| -> i64 { dims.iter().filter_map(|(n, _, _)| c.get(n)).sum() };
    let best = meta
        .space()
        .into_iter()
        .filter(|c| agrees(c) && covers(c))
        .min_by_key(padding);
    best.ok_or_else(|| {
        let wanted: Vec<String> = dims
            .iter()
            .map(|(n, size, what)| {
                let largest = declared(meta, n).last().copied().unwrap_or(0);
                format!("{what} = {size} (tile {n}, largest {largest})")
            })
            .collect();
        let fixed = if base.0.is_empty() {
            String::new()
        } else {
            format!(" with {base}")
        };
        SimError::Launch {
            kernel: meta.name.to_string(),
            message: format!(
                "no tile configuration{fixed} covers {}; a dimension above the largest tile needs a \
                 kernel that loops over it",
                wanted.join(", ")
            ),
        }
    })
}
