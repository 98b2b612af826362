//! The execution context of one program: where it is in the grid and what it has issued.
//!
//! Kernel authors never write it: `#[kernel]` threads it through every intrinsic call and records
//! the calling line, so every simulated cycle is attributed to a line of the kernel.

use crate::elem::Elem;
use crate::tile::Tile;
use accel_sim::program::{BufId, Instr, ProgramTrace, Recorder};
use accel_sim::SimError;
use std::marker::PhantomData;

/// One program's context: grid position, backend, current line and recorded instructions.
pub struct Ctx {
    pub(crate) pid: [usize; 3],
    pub(crate) grid: [usize; 3],
    pub(crate) functional: bool,
    pub(crate) line: u32,
    pub(crate) kernel: &'static str,
    pub(crate) trace: Recorder,
    pub(crate) error: Option<SimError>,
}

impl Ctx {
    pub(crate) fn new(
        kernel: &'static str,
        pid: [usize; 3],
        grid: [usize; 3],
        functional: bool,
        reference: Option<&ProgramTrace>,
    ) -> Ctx {
        Ctx {
            pid,
            grid,
            functional,
            line: 0,
            kernel,
            trace: reference.map_or_else(Recorder::new, Recorder::following),
            error: None,
        }
    }

    /// Sets the source line of the next intrinsic (inserted by `#[kernel]`).
    #[doc(hidden)]
    #[inline]
    pub fn at(&mut self, line: u32) -> &mut Ctx {
        self.line = line;
        self
    }

    /// Whether this run computes data (functional backend) or only costs (cost-only backend).
    pub fn is_functional(&self) -> bool {
        self.functional
    }

    /// Records a kernel error at the current line (first one wins); the launch returns it.
    pub(crate) fn fail(&mut self, message: String) {
        if self.error.is_none() {
            self.error = Some(SimError::Kernel {
                kernel: self.kernel.to_string(),
                line: self.line,
                message,
            });
        }
    }

    /// A new tile buffer of `T`, `R×C`, with `data` (functional runs).
    pub(crate) fn new_tile<T: Elem, const R: usize, const C: usize>(
        &mut self,
        data: Option<Vec<f32>>,
    ) -> Tile<T, R, C> {
        let bytes = T::DTYPE.bytes_for((R * C) as u64);
        let buf: BufId = self.trace.alloc(bytes, self.line);
        Tile {
            buf,
            data,
            _t: PhantomData,
            valid: [R, C],
            fill: false,
        }
    }

    /// Records an instruction at the current line.
    pub(crate) fn issue(&mut self, ins: Instr) {
        self.trace.exec(&ins);
    }
}
