//! Hand-tuned kernels: written against accel-sim's lower-level API ([`accel_sim::manual`]), not
//! the tile DSL. Each places its own SRAM buffers, issues its own DMA descriptors on the core's
//! queues, and synchronises its queues with explicit events; the synchronisation is checked as it
//! is issued. Each is registered beside its DSL prototype (`kind` `hand-tuned`), shares the
//! operator's f64 reference, and is compared with it by `day0 compare`.

pub mod expert_gemm_mxfp4;
pub mod gemm;
pub mod paged_decode;

use dsl_core::KernelMeta;

/// FNV-1a of a kernel's source file, so `day0 tune`'s cache never serves an edited hand-tuned
/// kernel's results (what `#[kernel]` computes for a DSL kernel's tokens).
pub const fn source_hash(source: &str) -> u64 {
    let bytes = source.as_bytes();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    h
}

/// The metadata a hand-tuned kernel registers with (the registry and `day0 tune` read kernels by
/// it): no DSL source lines (profiles name the source file's lines instead).
pub const fn meta(
    name: &'static str,
    params: &'static [&'static str],
    tunables: &'static [(&'static str, &'static [i64])],
    file: &'static str,
    source: &'static str,
) -> KernelMeta {
    KernelMeta {
        name,
        params,
        tunables,
        points: &[],
        constraints: &[],
        lines: &[],
        file,
        source_hash: source_hash(source),
    }
}

/// The tiles and load-ring depth a hand-tuned kernel reads from its resolved configuration
/// (`BM`, `BN`, `BK`, `STAGES`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub stages: usize,
}

impl Ring {
    /// The ring of `cfg` (resolved: every tunable set).
    pub(crate) fn of(cfg: &dsl_core::Config) -> Ring {
        let tile = |name: &str| cfg.get(name).unwrap_or(1).max(1) as usize;
        Ring {
            bm: tile("BM"),
            bn: tile("BN"),
            bk: tile("BK"),
            stages: tile("STAGES"),
        }
    }
}

/// Places a program's buffers back to back from byte 0 of the core's SRAM.
#[derive(Debug, Default)]
pub(crate) struct Placer {
    at: u64,
}

impl Placer {
    /// Places the next buffer, attributed to `line` of the kernel.
    pub(crate) fn place(
        &mut self,
        p: &mut accel_sim::manual::ManualProgram,
        line: u32,
        name: &'static str,
        rows: usize,
        cols: usize,
        dtype: accel_sim::DType,
    ) -> accel_sim::manual::Buffer {
        let buf = p.at(line).place(name, self.at, rows, cols, dtype);
        self.at += buf.bytes();
        buf
    }
}
