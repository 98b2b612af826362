//! The execution context of one program: where it is in the grid and what it has issued.
//!
//! Kernel authors never write it: `#[kernel]` threads it through every intrinsic call and records
//! the calling line, so every simulated cycle is attributed to a line of the kernel.

use crate::elem::Elem;
use crate::hazard::{Access, ArgView, ProgramHazards, Taint};
use crate::tensor::DeviceMem;
use crate::tile::{DeferredLoad, Host, Tile};
use accel_sim::program::{BufId, Instr, ProgramTrace, Recorder, References};
use accel_sim::SimError;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};

/// One program's context: grid position, backend, current line and recorded instructions.
pub struct Ctx {
    pub(crate) pid: [usize; 3],
    pub(crate) grid: [usize; 3],
    pub(crate) functional: bool,
    pub(crate) line: u32,
    pub(crate) kernel: &'static str,
    pub(crate) trace: Recorder,
    pub(crate) error: Option<SimError>,
    /// Hazard state of a checked functional launch (`None`: unchecked, or cost-only).
    pub(crate) hz: Option<Box<ProgramHazards>>,
    /// The launch's tensor arguments, for naming tensors in hazard messages.
    pub(crate) args: Arc<[ArgView]>,
    /// This program's loads not copied yet (see [`crate::tile::Host::Deferred`]), for `store` to
    /// copy the ones whose window it is about to overwrite; dropped tiles' entries are pruned.
    pub(crate) deferred: Vec<Weak<DeferredLoad>>,
    /// Whether loads may be deferred: in launches, whose tiles never outlive the launch (a
    /// standalone context's tiles might see a later launch's writes).
    pub(crate) defer_loads: bool,
    /// The launch this program belongs to (unique per launch; 0 outside one), which scopes the
    /// host's packed matrix operands (`crate::packed_operands`).
    pub(crate) launch: u64,
}

impl Ctx {
    pub(crate) fn new(
        kernel: &'static str,
        pid: [usize; 3],
        grid: [usize; 3],
        functional: bool,
        reference: Option<&References>,
    ) -> Ctx {
        Ctx {
            pid,
            grid,
            functional,
            line: 0,
            kernel,
            trace: reference.map_or_else(Recorder::new, Recorder::following_any),
            error: None,
            hz: None,
            args: Arc::from(Vec::new()),
            deferred: Vec::new(),
            defer_loads: true,
            launch: 0,
        }
    }

    /// A context for one program outside any launch (program 0 of a one-program grid), whose
    /// recorded instructions [`Ctx::finish`] returns: for testing intrinsics one by one, and for
    /// tools that want an intrinsic's instruction without a launch. Hazard checks of single
    /// programs (bounds, unwritten tiles, with `check_finite` non-finite stores) are on; races
    /// need a launch.
    pub fn standalone(kernel: &'static str, functional: bool, check_finite: bool) -> Ctx {
        let mut ctx = Ctx::new(kernel, [0; 3], [1; 3], functional, None);
        ctx.defer_loads = false;
        if functional {
            ctx.hz = Some(Box::new(ProgramHazards::new(&crate::hazard::Hazards {
                enabled: true,
                coverage: false,
                check_finite,
            })));
        }
        ctx
    }

    /// The program's recorded instructions, or the first error it hit (a kernel error or a
    /// hazard), as a launch would return it.
    pub fn finish(self) -> Result<ProgramTrace, SimError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.trace.finish()),
        }
    }

    /// The first error recorded so far, if any (it does not stop the program: intrinsics keep
    /// going so a launch records a whole trace; the launch returns the error).
    pub fn error(&self) -> Option<&SimError> {
        self.error.as_ref()
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

    /// Remembers a deferred load of this program, so a store over its window copies it first.
    pub(crate) fn defer(&mut self, load: &Arc<DeferredLoad>) {
        // Pruned at 16, 32, 64... entries: amortised constant even when many stay alive.
        let n = self.deferred.len();
        if n >= 16 && n.is_power_of_two() {
            self.deferred.retain(|w| w.strong_count() > 0);
        }
        self.deferred.push(Arc::downgrade(load));
    }

    /// Before a store writes memory indices `[lo, hi)` of `mem`: copies this program's deferred
    /// loads that read any of them, so they keep the values they were loaded with.
    pub(crate) fn settle_deferred(&mut self, mem: &Arc<DeviceMem>, lo: usize, hi: usize) {
        self.deferred.retain(|w| match w.upgrade() {
            Some(d) => {
                d.settle_if_overlapping(mem, lo, hi);
                true
            }
            None => false,
        });
    }

    /// At the end of the program: copies any deferred load still alive (a tile the kernel kept
    /// somewhere past its program), so no tile reads device memory after its launch. Nothing to
    /// do when every tile was dropped, as in any ordinary kernel.
    pub(crate) fn settle_all_deferred(&mut self) {
        for w in self.deferred.drain(..) {
            if let Some(d) = w.upgrade() {
                d.values();
            }
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
            host: Host::from(data),
            _t: PhantomData,
            valid: [R, C],
            fill: false,
        }
    }

    /// Records an instruction at the current line. In a checked launch, an instruction that reads
    /// a tainted tile (made by `empty` and not written, or loaded from outside a tensor) is a
    /// hazard; one that writes a tile wholly clears its taint.
    #[inline]
    pub(crate) fn issue(&mut self, ins: Instr) {
        if let Some(h) = self.hz.as_deref_mut() {
            if !h.taints.is_empty() {
                self.check_taints(&ins);
            }
        }
        self.trace.exec(&ins);
    }

    /// Clears the taint of a tile an intrinsic has just written wholly.
    pub(crate) fn untaint(&mut self, buf: BufId) {
        if let Some(h) = self.hz.as_deref_mut() {
            h.taints.retain(|(b, _)| *b != buf);
        }
    }

    /// Marks a tile as not readable until written (see [`Taint`]).
    pub(crate) fn taint(&mut self, buf: BufId, taint: Taint) {
        if let Some(h) = self.hz.as_deref_mut() {
            h.taints.push((buf, taint));
        }
    }

    #[cold]
    fn check_taints(&mut self, ins: &Instr) {
        let Some(h) = self.hz.as_deref() else {
            return;
        };
        let hit = ins.reads().iter().find_map(|r| {
            h.taints
                .iter()
                .find(|(b, _)| b == r)
                .map(|(_, t)| t.clone())
        });
        match hit {
            Some(Taint::Empty { line }) => self.fail(format!(
                "hazard: reads on-chip data never written: the tile made by `empty` at line {line} is read here before any intrinsic wrote it (`mma` reads its accumulator: start it with `zeros`, or write the tile with `load_into` first)"
            )),
            Some(Taint::Outside { line, what }) => {
                let here = self.line;
                self.line = line;
                self.fail(format!(
                    "hazard: out-of-bounds load: {what}, and line {here} reads the tile; no element of the window is inside the tensor, so it is not a ragged edge (clip the view with `rows_clipped`/`cols_clipped`/`at` if empty windows are intended)"
                ));
                self.line = here;
            }
            None => {}
        }
        if let Some(w) = ins.write {
            if !ins.reads().contains(&w) {
                self.untaint(w);
            }
        }
    }

    /// Notes a load's window (checked launches that look for races or coverage).
    #[inline]
    pub(crate) fn note_read(
        &mut self,
        mem: u64,
        start: usize,
        stride: usize,
        rows: usize,
        cols: usize,
    ) {
        self.note(false, mem, start, stride, rows, cols);
    }

    /// Notes a store's window (checked launches that look for races or coverage).
    #[inline]
    pub(crate) fn note_write(
        &mut self,
        mem: u64,
        start: usize,
        stride: usize,
        rows: usize,
        cols: usize,
    ) {
        self.note(true, mem, start, stride, rows, cols);
    }

    #[inline]
    fn note(
        &mut self,
        write: bool,
        mem: u64,
        start: usize,
        stride: usize,
        rows: usize,
        cols: usize,
    ) {
        if rows == 0 || cols == 0 {
            return;
        }
        let line = self.line;
        if let Some(log) = self.hz.as_deref_mut().and_then(|h| h.log.as_mut()) {
            let a = Access {
                mem,
                start,
                stride,
                rows,
                cols,
                line,
            };
            if write {
                log.writes.push(a);
            } else {
                log.reads.push(a);
            }
        }
    }

    /// Whether this program runs bounds and taint checks.
    #[inline]
    pub(crate) fn checked(&self) -> bool {
        self.hz.as_deref().is_some_and(|h| h.enabled)
    }

    /// Whether stores of non-finite values are errors.
    #[inline]
    pub(crate) fn check_finite(&self) -> bool {
        self.hz.as_deref().is_some_and(|h| h.check_finite)
    }

    /// Names a tensor by its launch parameter when it is one (`` `x` ``), else by its type and
    /// shape.
    pub(crate) fn tensor_name<T: Elem>(&self, t: &crate::tensor::Tensor<T>) -> String {
        crate::hazard::name_tensor(&self.args, t.id(), &|| format!("{t:?}"))
    }
}
