//! The tile instruction set: what a program issues, and the timing semantics of each instruction.
//!
//! The functional semantics live in [`crate::functional`]; a front end (dsl-core) computes the data
//! and records one [`crate::program::Instr`] per operation. The timing model ([`crate::timing`]) turns a program's
//! recorded instructions into a schedule on the core's engines.

use crate::dtype::DType;
use crate::error::SimError;
use crate::preset::DevicePreset;
use serde::Serialize;

/// An engine of a core. Each has an in-order queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// Device memory → on-chip SRAM.
    DmaIn,
    /// On-chip SRAM → device memory.
    DmaOut,
    /// Matrix multiply-accumulate unit.
    Matrix,
    /// Vector (SIMD) unit: element-wise, reductions, casts.
    Vector,
}

impl Engine {
    /// All engines, in report order.
    pub const ALL: [Engine; 4] = [
        Engine::DmaIn,
        Engine::DmaOut,
        Engine::Matrix,
        Engine::Vector,
    ];

    /// Index into per-engine arrays.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Name used in reports and traces.
    pub const fn name(self) -> &'static str {
        match self {
            Engine::DmaIn => "dma_in",
            Engine::DmaOut => "dma_out",
            Engine::Matrix => "matrix",
            Engine::Vector => "vector",
        }
    }
}

/// Identifies a rectangle of a device tensor, so the cache model can recognise re-reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Region {
    /// Launch-unique tensor id.
    pub tensor: u64,
    /// First element offset of the window (flattened).
    pub offset: u64,
    /// Window rows.
    pub rows: u64,
    /// Window columns.
    pub cols: u64,
}

/// Class of a vector instruction, for its cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VectorClass {
    /// add, mul, max, select, copy: one pass.
    Simple,
    /// exp, ln, rsqrt, sigmoid: `transcendental_factor` passes.
    Transcendental,
    /// A reduction along rows or columns: one pass plus a log-depth combine.
    Reduction,
}

/// One tile instruction with the shapes its cost depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// DMA device memory → SRAM of `bytes` (only the in-bounds part of the window moves).
    Load {
        /// Bytes moved.
        bytes: u64,
        /// The window read (for cache reuse).
        region: Region,
    },
    /// DMA SRAM → device memory of `bytes`.
    Store {
        /// Bytes moved.
        bytes: u64,
    },
    /// `C[m×n] += A[m×k]·B[k×n]` on the matrix unit with inputs of `dtype`.
    Mma {
        /// Rows of A and C.
        m: u64,
        /// Columns of B and C.
        n: u64,
        /// Reduction depth.
        k: u64,
        /// Input dtype (selects the unit's rate).
        dtype: DType,
        /// The problem's useful FLOP in it: 2·m'·n'·k' over the operands' valid extents (rows
        /// and columns that hold data, not padding of a ragged tile).
        useful: u64,
    },
    /// A vector-unit pass over `elems` elements of `dtype`.
    Vector {
        /// Elements processed.
        elems: u64,
        /// Element dtype (16-bit types run at twice the f32 lane count).
        dtype: DType,
        /// Cost class.
        class: VectorClass,
        /// Useful element operations in it (0 for a constant fill such as `zeros`: it computes
        /// nothing of the problem).
        useful: u64,
    },
    /// Wait until every engine of the core is idle.
    Barrier,
}

impl Op {
    /// The engine that executes this instruction (`None` for a barrier).
    pub fn engine(&self) -> Option<Engine> {
        match self {
            Op::Load { .. } => Some(Engine::DmaIn),
            Op::Store { .. } => Some(Engine::DmaOut),
            Op::Mma { .. } => Some(Engine::Matrix),
            Op::Vector { .. } => Some(Engine::Vector),
            Op::Barrier => None,
        }
    }

    /// Useful floating-point operations (see the `useful` fields).
    pub fn flop(&self) -> u64 {
        match self {
            Op::Mma { useful, .. } | Op::Vector { useful, .. } => *useful,
            _ => 0,
        }
    }

    /// Floating-point operations issued, padding included (2·m·n·k for an MMA, one per element
    /// for vector ops).
    pub fn issued_flop(&self) -> u64 {
        match self {
            Op::Mma { m, n, k, .. } => mma_flop(*m, *n, *k),
            Op::Vector { elems, .. } => *elems,
            _ => 0,
        }
    }

    /// Short mnemonic for traces.
    pub fn mnemonic(&self) -> &'static str {
        match self {
            Op::Load { .. } => "load",
            Op::Store { .. } => "store",
            Op::Mma { .. } => "mma",
            Op::Vector {
                class: VectorClass::Reduction,
                ..
            } => "reduce",
            Op::Vector {
                class: VectorClass::Transcendental,
                ..
            } => "vec.transc",
            Op::Vector { .. } => "vec",
            Op::Barrier => "barrier",
        }
    }
}

/// FLOP of an `m×k · k×n` multiply-accumulate: one multiply and one add per term.
pub const fn mma_flop(m: u64, n: u64, k: u64) -> u64 {
    2 * m * n * k
}

/// Vector element passes of a top-k merge of `c` candidates into a running top-`k`: a bitonic
/// merge of the `n = k + c` values, `n` elements per stage over `bit_length(n)` (⌊log2 n⌋ + 1)
/// stages.
pub const fn topk_merge_elems(k: u64, c: u64) -> u64 {
    let n = k + c;
    n * (64 - n.leading_zeros() as u64)
}

/// Vector element passes of dequantizing an MXFP4 tile of `rows×cols` values: two passes, a table
/// decode of the nibbles and then the multiply by the block scale.
pub const fn mxfp4_dequant_elems(rows: u64, cols: u64) -> u64 {
    2 * rows * cols
}

/// Vector element passes of dequantizing a group-scaled INT4 tile of `rows×cols` values: two
/// passes, as MXFP4's, an unpack of the nibbles to signed integers and then the multiply by the
/// group's scale.
pub const fn int4_dequant_elems(rows: u64, cols: u64) -> u64 {
    2 * rows * cols
}

/// Bytes a paged gather of `rows` rows moves besides the rows' own `data_bytes`: each row also
/// reads its token index and its block-table entry (an i32 each).
pub const fn gather_bytes(data_bytes: u64, rows: u64) -> u64 {
    data_bytes + 8 * rows
}

/// Cycles of a matrix-unit instruction: the fragment-padded work at the dtype's rate plus overhead.
pub fn mma_cycles(p: &DevicePreset, m: u64, n: u64, k: u64, dtype: DType) -> Result<u64, String> {
    let rate = p.matrix_flop_per_cycle(dtype).ok_or_else(|| {
        format!(
            "the matrix unit of `{}` has no {dtype} mode (supported: {}); cast the tiles first",
            p.name,
            p.matrix
                .flop_per_cycle
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let mm = &p.matrix;
    let padded = m.div_ceil(mm.frag_m)
        * mm.frag_m
        * n.div_ceil(mm.frag_n)
        * mm.frag_n
        * k.div_ceil(mm.frag_k)
        * mm.frag_k;
    Ok(mm.overhead_cycles + ((2 * padded) as f64 / rate).ceil() as u64)
}

/// Effective vector lanes for `dtype` (16-bit and narrower types pack two per 32-bit lane).
pub fn vector_lanes(p: &DevicePreset, dtype: DType) -> u64 {
    if dtype.bits() <= 16 {
        p.vector.f32_lanes * 2
    } else {
        p.vector.f32_lanes
    }
}

/// Cycles of a vector-unit instruction.
pub fn vector_cycles(p: &DevicePreset, elems: u64, dtype: DType, class: VectorClass) -> u64 {
    let lanes = vector_lanes(p, dtype);
    let passes = elems.div_ceil(lanes);
    let body = match class {
        VectorClass::Simple => passes,
        VectorClass::Transcendental => passes * p.vector.transcendental_factor,
        VectorClass::Reduction => passes + 64 - lanes.leading_zeros() as u64,
    };
    p.vector.overhead_cycles + body
}

/// Validates an instruction against the device before timing (e.g. unsupported matrix dtype).
pub fn check(p: &DevicePreset, op: &Op, kernel: &str, line: u32) -> Result<(), SimError> {
    if let Op::Mma { m, n, k, dtype, .. } = op {
        mma_cycles(p, *m, *n, *k, *dtype).map_err(|message| SimError::Kernel {
            kernel: kernel.to_string(),
            line,
            message,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The work formulas dsl-core records, pinned to the values they had when they were inline
    /// there (moving them must not move any cycle count).
    #[test]
    fn work_formulas() {
        assert_eq!(mma_flop(64, 32, 16), 65536);
        // n = 8 + 64 = 72 has bit length 7.
        assert_eq!(topk_merge_elems(8, 64), 72 * 7);
        assert_eq!(topk_merge_elems(1, 1), 2 * 2);
        assert_eq!(mxfp4_dequant_elems(16, 64), 2048);
        assert_eq!(gather_bytes(1024, 16), 1024 + 128);
    }
}
