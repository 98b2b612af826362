//! Picking tile sizes from a kernel's declared tunable space, for host wrappers that launch a
//! kernel on whatever shape a model hands them (so callers need not know the space).

use dsl_core::{Config, KernelMeta};

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

/// The smallest declared value of `name` that is ≥ `size`, or `None` when every one is smaller
/// (for kernels that must hold the whole dimension in one tile).
pub fn at_least(meta: &KernelMeta, name: &str, size: usize) -> Option<i64> {
    declared(meta, name)
        .into_iter()
        .find(|v| *v as usize >= size)
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
