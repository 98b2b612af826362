//! A program's recorded instruction stream: what a front end hands the timing model.

use crate::isa::Op;

/// Program-local id of an on-chip buffer (one per tile value).
pub type BufId = u32;

/// One issued instruction with its operands.
#[derive(Debug, Clone, PartialEq)]
pub struct Instr {
    /// What it does (shapes, bytes, dtype).
    pub op: Op,
    /// Kernel source line that issued it.
    pub line: u32,
    /// Buffers read (at most 4).
    pub reads: [BufId; 4],
    /// How many of `reads` are used.
    pub n_reads: u8,
    /// Buffer written, if any.
    pub write: Option<BufId>,
    /// Whether the issuing program waits for completion (synchronous load) before issuing more.
    pub blocking: bool,
}

impl Instr {
    /// A non-blocking instruction reading `reads` and writing `write`.
    pub fn new(op: Op, line: u32, reads: &[BufId], write: Option<BufId>) -> Instr {
        assert!(reads.len() <= 4, "an instruction reads at most 4 buffers");
        let mut r = [0; 4];
        r[..reads.len()].copy_from_slice(reads);
        Instr {
            op,
            line,
            reads: r,
            n_reads: reads.len() as u8,
            write,
            blocking: false,
        }
    }

    /// Marks the instruction as blocking the issue stream until it completes.
    pub fn blocking(mut self) -> Instr {
        self.blocking = true;
        self
    }

    /// The buffers read.
    pub fn reads(&self) -> &[BufId] {
        &self.reads[..self.n_reads as usize]
    }
}

/// An event of a program, in issue order.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A tile of `bytes` comes into existence in SRAM (created by `line`).
    Alloc {
        /// The new buffer.
        buf: BufId,
        /// Its size in bytes.
        bytes: u64,
        /// Source line that created it.
        line: u32,
    },
    /// An instruction is issued.
    Exec(Instr),
}

/// Everything one program issued, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProgramTrace {
    /// Events in issue order.
    pub events: Vec<Event>,
    /// Number of buffers allocated (ids are `0..n_bufs`).
    pub n_bufs: u32,
}
