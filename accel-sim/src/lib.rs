//! # accel-sim — the machine
//!
//! A cycle-approximate tile accelerator. It owns:
//! - [`preset`]: devices as data (TOML files with sourced figures);
//! - [`dtype`]: element types;
//! - [`formats`]: low-precision number formats (FP8, FP4, E8M0, MX blocks, checkpoint packings), exact;
//! - [`isa`]: the tile instruction set and each instruction's timing semantics;
//! - [`functional`]: each instruction's functional semantics, on the host with SIMD (`wide`);
//! - [`program`]: a program's recorded instruction stream;
//! - [`manual`]: hand-written programs: explicit SRAM placement, DMA queues, events and barriers;
//! - [`timing`]: one program on one core (engine queues, dependencies, SRAM buffer reuse);
//! - [`memory`]: L2 and HBM, bandwidth shared among cores;
//! - [`schedule`]: programs onto cores in waves, producing a [`report::Report`];
//! - [`trace`]: Chrome/Perfetto trace output;
//! - [`systolic`]: systolic-array dataflows (OS/WS/IS) timed exactly as SCALE-Sim times them;
//! - [`calibration`]: published measurements of real chips, error statistics and factor fitting;
//! - [`cluster`]: multi-card clusters as data (nodes, cards per node, intra/inter links, topology);
//! - [`collective`]: α–β costs of collectives (ring/tree/hierarchical all-reduce, all-gather,
//!   reduce-scatter, all-to-all, send/recv) on a cluster, and compute/comm overlap;
//! - [`fabric`]: collectives that carry data between the cards of a functional multi-card run,
//!   priced by [`collective`].

pub mod calibration;
pub mod cluster;
pub mod collective;
pub mod dtype;
pub mod error;
pub mod fabric;
pub mod formats;
pub mod functional;
pub mod isa;
pub mod manual;
pub mod memory;
pub mod preset;
pub mod program;
pub mod report;
pub mod schedule;
pub mod systolic;
pub mod timing;
pub mod trace;

pub use cluster::ClusterPreset;
pub use dtype::DType;
pub use error::SimError;
pub use preset::DevicePreset;
pub use report::Report;
