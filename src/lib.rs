//! # day0 — the Day-0 adaptation workbench
//!
//! Facade over the workspace crates, plus what the `day0` command drives:
//! - [`accel_sim`]: the simulated machine (presets, ISA, timing, reports);
//! - [`dsl_core`]: tiles, tensors, intrinsics, `#[kernel]`, launch;
//! - [`kernels`]: the operator library and its registry;
//! - [`model`]: model configs and forward passes;
//! - [`calibrate`]: `day0 calibrate`, predictions against published measurements of real chips;
//! - [`charts`]: the SVG charts of `day0 run --plot` and `day0 scale --plot`;
//! - [`compare`]: `day0 compare`, an operator's implementations side by side on the same inputs;
//! - [`host_memory`]: functional runs that would not fit in host memory are refused up front;
//! - [`layer_checks`]: step 2 of `day0 run`, a tiny-config numeric check of each layer kind;
//! - [`profile`]: `day0 profile`, a kernel's source annotated with each line's cycles and waits;
//! - [`suite`]: the built-in kernel suite (`day0 suite`);
//! - [`tune`]: tile-shape sweeps over a kernel's tunable space, and `day0 tune` (ranked, explained,
//!   spot-checked, cached).

pub use accel_sim;
pub use dsl_core;
pub use kernels;
pub use model;

pub mod calibrate;
pub mod charts;
pub mod compare;
pub mod host_memory;
pub mod layer_checks;
pub mod profile;
pub mod suite;
pub mod tune;
pub mod tune_model;
