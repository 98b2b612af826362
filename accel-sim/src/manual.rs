//! Hand-written programs: the machine one level below the tile DSL.
//!
//! A `#[kernel]` names tiles and lets the front end decide where they live and when an engine may
//! touch them. A hand-tuned kernel (what Ascend C or CUTLASS is to a tile DSL) decides that itself:
//! - **explicit on-chip placement**: every SRAM buffer is placed once, at a byte offset the kernel
//!   chooses ([`ManualProgram::place`]); placements that overlap or run past the core's SRAM are
//!   errors naming both buffers, and nothing is allocated behind the kernel's back;
//! - **DMA descriptors on queues**: a transfer names its device window and its on-chip buffer
//!   and runs on the core's DMA-in or DMA-out queue ([`ManualProgram::dma_in`],
//!   [`ManualProgram::dma_out`]); compute runs on the matrix or vector queue. Each queue executes
//!   in issue order;
//! - **explicit events**: every operation returns an [`Event`], and an operation that must wait
//!   for another queue lists the events it waits on. Multi-buffering is the kernel's own: it
//!   cycles through the buffers it placed and waits on the events that free them;
//! - **barriers**: [`ManualProgram::barrier`] waits until every queue is idle.
//!
//! The synchronisation is checked as it is issued. An operation that reads a buffer another queue
//! writes (or overwrites one another queue reads or writes) without waiting, directly or through
//! the events it waits on, on the operation that touched it last is a race: an error naming both
//! source lines and the buffer. A wait the data does not need is an error as well: the timing model
//! orders operations by their buffers, so a program whose waits are exactly its data dependencies
//! is timed as written (a superfluous wait would cost cycles on hardware that the timing would not
//! charge). The result is an ordinary [`ProgramTrace`]: hand-written and DSL programs run through
//! the same timing model, so their cycles compare like for like.
//!
//! Functional runs compute the data as they go, through the same functional semantics as the DSL
//! ([`crate::functional`]); cost-only runs record the same trace without data.

use crate::dtype::DType;
use crate::error::SimError;
use crate::functional::{mma_f32, mma_f32_bt, round_to};
use crate::isa::{mma_flop, Engine, Op, Region, VectorClass};
use crate::program::{BufId, Instr, ProgramTrace, Recorder};

/// A tensor in device memory as a hand-written program reads and writes it: row-major windows of
/// a 2-D view. Implemented by the front end's tensor type.
pub trait DeviceTensor: Sync {
    /// Launch-unique id (the L2 model recognises re-reads by it).
    fn id(&self) -> u64;
    /// Element type.
    fn dtype(&self) -> DType;
    /// Rows of the 2-D view.
    fn rows(&self) -> usize;
    /// Columns of the 2-D view.
    fn cols(&self) -> usize;
    /// Elements between consecutive rows in memory.
    fn row_stride(&self) -> usize;
    /// Element offset of the view's first element in its memory.
    fn offset(&self) -> usize;
    /// Whether it holds data (a shape-only tensor costs but cannot be read).
    fn has_data(&self) -> bool;
    /// Reads `dst.len()` elements of row `row` from column `col` (in bounds).
    fn read_row(&self, row: usize, col: usize, dst: &mut [f32]);
    /// Writes `src` into row `row` from column `col` (in bounds).
    fn write_row(&self, row: usize, col: usize, src: &[f32]);
    /// How messages name it (type and shape).
    fn describe(&self) -> String;
}

/// An on-chip buffer the program placed: `rows × cols` elements of `dtype` at byte `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    index: u32,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Element type.
    pub dtype: DType,
    /// First byte in the core's SRAM.
    pub offset: u64,
}

impl Buffer {
    /// Bytes it takes.
    pub fn bytes(&self) -> u64 {
        self.dtype.bytes_for((self.rows * self.cols) as u64)
    }
}

/// The completion of one operation on one queue; operations on other queues wait on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    queue: Engine,
    /// 1-based position of the operation on its queue.
    seq: u32,
}

/// What the matrix unit does with the accumulator's old contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accumulate {
    /// `acc += a·b`.
    Add,
    /// `acc = a·b`: the first K-step of a tile, with no zero fill before it (the cube's
    /// initialise-on-first-step mode; the old contents are not read).
    Overwrite,
}

/// An operation that touched a buffer: its queue, position and source line.
#[derive(Debug, Clone, Copy)]
struct Touch {
    queue: Engine,
    seq: u32,
    line: u32,
}

/// What the program knows about each placed buffer.
#[derive(Debug, Clone)]
struct Placed {
    name: &'static str,
    buf: Buffer,
    id: BufId,
    /// Rows and columns that hold data (a ragged edge loads fewer), for the useful FLOP.
    valid: [usize; 2],
    last_write: Option<Touch>,
    /// Reads since the last write.
    reads: Vec<Touch>,
    data: Option<Vec<f32>>,
}

/// Completed-operation counts per queue (a vector clock): entry `q` says operations `1..=n` of
/// queue `q` are known complete.
type Clock = [u32; 4];

fn join(a: Clock, b: Clock) -> Clock {
    std::array::from_fn(|i| a[i].max(b[i]))
}

/// One hand-written program being issued: its placements, queues, events and recorded trace.
pub struct ManualProgram {
    kernel: &'static str,
    functional: bool,
    capacity: u64,
    line: u32,
    trace: Recorder,
    placed: Vec<Placed>,
    /// Per queue, the clock each of its operations completes with (index `seq - 1`).
    done: [Vec<Clock>; 4],
    /// Operations complete at the latest barrier.
    barrier_clock: Clock,
    error: Option<SimError>,
}

impl ManualProgram {
    /// Starts a program of `kernel` on a core with `sram_bytes` of SRAM; `functional` computes the
    /// data. Following `reference` (a trace of the same kernel) only makes recording cheaper.
    pub fn new(
        kernel: &'static str,
        functional: bool,
        sram_bytes: u64,
        reference: Option<&ProgramTrace>,
    ) -> ManualProgram {
        ManualProgram {
            kernel,
            functional,
            capacity: sram_bytes,
            line: 0,
            trace: reference.map_or_else(Recorder::new, Recorder::following),
            placed: Vec::new(),
            done: Default::default(),
            barrier_clock: [0; 4],
            error: None,
        }
    }

    /// Sets the source line the next operations are attributed to (`p.at(line!())`).
    pub fn at(&mut self, line: u32) -> &mut ManualProgram {
        self.line = line;
        self
    }

    /// Whether this run computes data.
    pub fn is_functional(&self) -> bool {
        self.functional
    }

    /// Records an error at the current line (the first one wins; the launch returns it).
    pub fn fail(&mut self, message: String) {
        if self.error.is_none() {
            self.error = Some(SimError::Kernel {
                kernel: self.kernel.to_string(),
                line: self.line,
                message,
            });
        }
    }

    /// The recorded trace, or the first error.
    pub fn finish(self) -> Result<ProgramTrace, SimError> {
        match self.error {
            Some(e) => Err(e),
            None => Ok(self.trace.finish()),
        }
    }

    /// Places a `rows × cols` buffer of `dtype` at byte `offset` of the core's SRAM, for the whole
    /// program. Overlapping another placement or running past the SRAM is an error.
    pub fn place(
        &mut self,
        name: &'static str,
        offset: u64,
        rows: usize,
        cols: usize,
        dtype: DType,
    ) -> Buffer {
        let buf = Buffer {
            index: self.placed.len() as u32,
            rows,
            cols,
            dtype,
            offset,
        };
        let end = offset + buf.bytes();
        if end > self.capacity && self.error.is_none() {
            self.error = Some(SimError::SramOverflow {
                kernel: self.kernel.to_string(),
                line: self.line,
                code: format!(
                    "buffer `{name}`: {rows}x{cols} {dtype} placed at byte {offset} (use smaller tiles or fewer stages)"
                ),
                needed: end,
                capacity: self.capacity,
            });
        }
        if let Some(o) = self
            .placed
            .iter()
            .find(|p| offset < p.buf.offset + p.buf.bytes() && p.buf.offset < end)
        {
            let (n, ob) = (o.name, o.buf);
            self.fail(format!(
                "buffer `{name}` (bytes {offset}..{end}) overlaps `{n}` (bytes {}..{}): place it past byte {}",
                ob.offset,
                ob.offset + ob.bytes(),
                ob.offset + ob.bytes()
            ));
        }
        let id = self.trace.alloc(buf.bytes(), self.line);
        self.placed.push(Placed {
            name,
            buf,
            id,
            valid: [0, 0],
            last_write: None,
            reads: Vec::new(),
            data: self.functional.then(|| vec![f32::NAN; rows * cols]),
        });
        buf
    }

    /// DMA-in queue: copies the `dst.rows × dst.cols` window at (`row`, `col`) of `src` into
    /// `dst` once the `wait` events complete. Elements outside `src` read as 0 (a ragged edge);
    /// only in-bounds bytes move.
    pub fn dma_in(
        &mut self,
        src: &dyn DeviceTensor,
        row: usize,
        col: usize,
        dst: Buffer,
        wait: &[Event],
    ) -> Event {
        if src.dtype() != dst.dtype {
            self.fail(format!(
                "dma_in copies {} into a {} buffer: DMA does not convert, place the buffer as {}",
                src.describe(),
                dst.dtype,
                src.dtype()
            ));
        }
        let vr = src.rows().saturating_sub(row).min(dst.rows);
        let vc = src.cols().saturating_sub(col).min(dst.cols);
        let vr_data = if vc == 0 { 0 } else { vr };
        if self.functional {
            if !src.has_data() {
                self.fail(format!(
                    "functional launch given a shape-only tensor {}",
                    src.describe()
                ));
            }
            let p = &mut self.placed[dst.index as usize];
            let d = p.data.get_or_insert_with(Vec::new);
            d.clear();
            d.resize(dst.rows * dst.cols, 0.0);
            if src.has_data() {
                for r in 0..vr_data {
                    src.read_row(row + r, col, &mut d[r * dst.cols..r * dst.cols + vc]);
                }
            }
        }
        self.placed[dst.index as usize].valid = if vc == 0 { [0, 0] } else { [vr, vc] };
        let region = Region {
            tensor: src.id(),
            offset: (src.offset() + row * src.row_stride() + col) as u64,
            rows: vr as u64,
            cols: vc as u64,
        };
        let bytes = dst.dtype.bytes_for((vr * vc) as u64);
        self.issue(
            Engine::DmaIn,
            Op::Load { bytes, region },
            &[],
            Some(dst),
            wait,
        )
    }

    /// DMA-out queue: stores the in-bounds part of `src` at (`row`, `col`) of `dst` once the
    /// `wait` events complete.
    pub fn dma_out(
        &mut self,
        src: Buffer,
        dst: &dyn DeviceTensor,
        row: usize,
        col: usize,
        wait: &[Event],
    ) -> Event {
        if src.dtype != dst.dtype() {
            self.fail(format!(
                "dma_out copies a {} buffer into {}: DMA does not convert",
                src.dtype,
                dst.describe()
            ));
        }
        let vr = dst.rows().saturating_sub(row).min(src.rows);
        let vc = dst.cols().saturating_sub(col).min(src.cols);
        if self.functional && vc > 0 {
            if !dst.has_data() {
                self.fail(format!(
                    "functional launch given a shape-only output tensor {}",
                    dst.describe()
                ));
            } else if let Some(d) = &self.placed[src.index as usize].data {
                for r in 0..vr {
                    dst.write_row(row + r, col, &d[r * src.cols..r * src.cols + vc]);
                }
            }
        }
        let bytes = src.dtype.bytes_for((vr * vc) as u64);
        self.issue(Engine::DmaOut, Op::Store { bytes }, &[src], None, wait)
    }

    /// Matrix queue: `acc (f32, m×n) (+)= a (m×k) · b (k×n)` once the `wait` events complete.
    pub fn mma(
        &mut self,
        acc: Buffer,
        a: Buffer,
        b: Buffer,
        mode: Accumulate,
        wait: &[Event],
    ) -> Event {
        self.matmul(acc, a, b, false, mode, wait)
    }

    /// Matrix queue: `acc (f32, m×n) (+)= a (m×k) · b (n×k)ᵀ` (weights stored output-major, keys)
    /// once the `wait` events complete.
    pub fn mma_bt(
        &mut self,
        acc: Buffer,
        a: Buffer,
        b: Buffer,
        mode: Accumulate,
        wait: &[Event],
    ) -> Event {
        self.matmul(acc, a, b, true, mode, wait)
    }

    /// [`Self::mma`] (`bt`: B given `n×k`, [`Self::mma_bt`]).
    fn matmul(
        &mut self,
        acc: Buffer,
        a: Buffer,
        b: Buffer,
        bt: bool,
        mode: Accumulate,
        wait: &[Event],
    ) -> Event {
        let (m, k) = (a.rows, a.cols);
        let (bk, n) = if bt {
            (b.cols, b.rows)
        } else {
            (b.rows, b.cols)
        };
        let shapes_ok = acc.dtype == DType::F32 && acc.rows == m && acc.cols == n && bk == k;
        if !shapes_ok {
            let want_b = if bt {
                format!("[{n}, {k}]")
            } else {
                format!("[{k}, {n}]")
            };
            self.fail(format!(
                "mma needs acc f32 [{m}, {n}] += a [{m}, {k}] · b {want_b}{}; got acc {} [{}, {}], b [{}, {}]",
                if bt { "ᵀ" } else { "" },
                acc.dtype, acc.rows, acc.cols, b.rows, b.cols
            ));
        }
        if a.dtype != b.dtype {
            self.fail(format!(
                "mma multiplies a {} by a {} buffer: the matrix unit takes one input type",
                a.dtype, b.dtype
            ));
        }
        let (va, vb) = (
            self.placed[a.index as usize].valid,
            self.placed[b.index as usize].valid,
        );
        let (vm, vn, vk) = if bt {
            (va[0], vb[0], va[1].min(vb[1]))
        } else {
            (va[0], vb[1], va[1].min(vb[0]))
        };
        if self.functional && shapes_ok {
            let x = self.placed[a.index as usize].data.take();
            let y = self.placed[b.index as usize].data.take();
            let c = self.placed[acc.index as usize]
                .data
                .get_or_insert_with(Vec::new);
            if mode == Accumulate::Overwrite {
                c.clear();
                c.resize(m * n, 0.0);
            }
            match (&x, &y) {
                (Some(x), Some(y)) if bt => mma_f32_bt(c, x, y, m, n, k),
                (Some(x), Some(y)) => mma_f32(c, x, y, m, n, k),
                _ => {}
            }
            self.placed[a.index as usize].data = x;
            self.placed[b.index as usize].data = y;
        }
        let p = &mut self.placed[acc.index as usize];
        p.valid = match mode {
            Accumulate::Overwrite => [vm, vn],
            Accumulate::Add => [p.valid[0].max(vm), p.valid[1].max(vn)],
        };
        let op = Op::Mma {
            m: m as u64,
            n: n as u64,
            k: k as u64,
            dtype: a.dtype,
            useful: mma_flop(vm as u64, vn as u64, vk as u64),
        };
        let reads: &[Buffer] = match mode {
            Accumulate::Add => &[a, b, acc],
            Accumulate::Overwrite => &[a, b],
        };
        self.issue(Engine::Matrix, op, reads, Some(acc), wait)
    }

    /// Vector queue: dequantizes MXFP4 into `dst` (`rows × cols` of a float type) from `blocks`
    /// (u8 `rows × cols/2`, two E2M1 codes per byte, low nibble first) and `scales` (u8 `rows ×
    /// cols/32`, E8M0) once the `wait` events complete: the DSL's `dequant_mxfp4`, same values and
    /// the same cost ([`crate::isa::mxfp4_dequant_elems`] element passes).
    pub fn dequant_mxfp4(
        &mut self,
        blocks: Buffer,
        scales: Buffer,
        dst: Buffer,
        wait: &[Event],
    ) -> Event {
        let (r, c) = (dst.rows, dst.cols);
        let ok = blocks.dtype == DType::U8
            && scales.dtype == DType::U8
            && c % 32 == 0
            && (blocks.rows, blocks.cols) == (r, c / 2)
            && (scales.rows, scales.cols) == (r, c / 32);
        if !ok {
            self.fail(format!(
                "dequant_mxfp4 to {r}x{c} needs u8 blocks {r}x{} and u8 scales {r}x{} (cols a multiple of 32); got {} {}x{} and {} {}x{}",
                c / 2,
                c / 32,
                blocks.dtype,
                blocks.rows,
                blocks.cols,
                scales.dtype,
                scales.rows,
                scales.cols
            ));
        }
        if self.functional && ok {
            let (b, s) = (
                &self.placed[blocks.index as usize].data,
                &self.placed[scales.index as usize].data,
            );
            if let (Some(b), Some(s)) = (b, s) {
                let out = crate::functional::dequant_mxfp4(b, s, r, c, dst.dtype);
                self.placed[dst.index as usize].data = Some(out);
            }
        }
        self.placed[dst.index as usize].valid = [r, c];
        let elems = crate::isa::mxfp4_dequant_elems(r as u64, c as u64);
        let op = Op::Vector {
            elems,
            dtype: dst.dtype,
            class: VectorClass::Simple,
            useful: elems,
        };
        self.issue(Engine::Vector, op, &[blocks, scales], Some(dst), wait)
    }

    /// Vector queue: converts `src` into `dst` (same shape, another element type; round to
    /// nearest even) once the `wait` events complete.
    pub fn cast(&mut self, src: Buffer, dst: Buffer, wait: &[Event]) -> Event {
        if (src.rows, src.cols) != (dst.rows, dst.cols) {
            self.fail(format!(
                "cast from [{}, {}] to [{}, {}]: the shapes must match",
                src.rows, src.cols, dst.rows, dst.cols
            ));
        }
        let elems = (src.rows * src.cols) as u64;
        if self.functional {
            let mut v = self.placed[src.index as usize]
                .data
                .clone()
                .unwrap_or_default();
            round_to(&mut v, dst.dtype);
            self.placed[dst.index as usize].data = Some(v);
        }
        self.placed[dst.index as usize].valid = self.placed[src.index as usize].valid;
        // Costed at the wider type's lanes, as the DSL's `cast`.
        let wider = if src.dtype.bits() >= dst.dtype.bits() {
            src.dtype
        } else {
            dst.dtype
        };
        let op = Op::Vector {
            elems,
            dtype: wider,
            class: VectorClass::Simple,
            useful: elems,
        };
        self.issue(Engine::Vector, op, &[src], Some(dst), wait)
    }

    /// Waits until every queue is idle: later operations need no event for anything before it.
    pub fn barrier(&mut self) {
        self.barrier_clock = std::array::from_fn(|q| self.done[q].len() as u32);
        self.trace
            .exec(&Instr::new(Op::Barrier, self.line, &[], None).blocking());
    }

    /// What an operation on `queue` knows complete before it starts, given its waits: everything
    /// before it on its own queue (queues run in order), everything before a barrier, and what
    /// each waited operation knew when it completed (all waits but the `skip`-th, if any).
    fn known(&self, queue: Engine, wait: &[Event], skip: Option<usize>) -> Clock {
        let own = self.done[queue.index()].last().copied().unwrap_or_default();
        wait.iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != skip)
            .filter_map(|(_, e)| self.done[e.queue.index()].get(e.seq as usize - 1))
            .fold(join(own, self.barrier_clock), |k, c| join(k, *c))
    }

    /// The first data dependency of an operation on `queue` that `known` does not cover: (the
    /// buffer, the operation it must wait for, what it does to the buffer).
    fn uncovered(
        &self,
        queue: Engine,
        reads: &[Buffer],
        write: Option<Buffer>,
        known: &Clock,
    ) -> Option<(&'static str, Touch, &'static str)> {
        let covered = |t: &Touch| t.queue == queue || known[t.queue.index()] >= t.seq;
        for b in reads {
            let p = &self.placed[b.index as usize];
            if let Some(t) = p.last_write.filter(|t| !covered(t)) {
                return Some((p.name, t, "writes"));
            }
        }
        if let Some(b) = write {
            let p = &self.placed[b.index as usize];
            if let Some(t) = p.last_write.filter(|t| !covered(t)) {
                return Some((p.name, t, "writes"));
            }
            if let Some(t) = p.reads.iter().find(|t| !covered(t)) {
                return Some((p.name, *t, "reads"));
            }
        }
        None
    }

    /// Checks an operation's synchronisation, records it, and returns its event.
    fn issue(
        &mut self,
        queue: Engine,
        op: Op,
        reads: &[Buffer],
        write: Option<Buffer>,
        wait: &[Event],
    ) -> Event {
        let name = op.mnemonic();
        if let Some(e) = wait
            .iter()
            .find(|e| e.seq == 0 || e.seq as usize > self.done[e.queue.index()].len())
        {
            self.fail(format!(
                "{name} waits on {e:?}, which no operation of this program signals"
            ));
            return Event { queue, seq: 0 };
        }
        if let Some(p) = reads
            .iter()
            .map(|b| &self.placed[b.index as usize])
            .find(|p| p.last_write.is_none())
        {
            let n = p.name;
            self.fail(format!(
                "{name} reads `{n}` before any operation wrote it (load it, or use `Accumulate::Overwrite` for a tile's first K-step)"
            ));
        }
        let known = self.known(queue, wait, None);
        if let Some((buf, t, what)) = self.uncovered(queue, reads, write, &known) {
            self.fail(format!(
                "race: {name} on the {} queue touches `{buf}`, which the {} at line {} {what}, without waiting on that operation's event (add it to `wait`)",
                queue.name(),
                t.queue.name(),
                t.line
            ));
        }
        // A wait the data does not need: the timing model would not charge it.
        for (i, e) in wait.iter().enumerate() {
            let without = self.known(queue, wait, Some(i));
            if without != known && self.uncovered(queue, reads, write, &without).is_none() {
                self.fail(format!(
                    "{name} on the {} queue waits on operation {} of the {} queue, which none of its buffers needs: remove the wait (the timing model orders operations by their data)",
                    queue.name(),
                    e.seq,
                    e.queue.name()
                ));
            }
        }
        let q = queue.index();
        let seq = self.done[q].len() as u32 + 1;
        let line = self.line;
        let touch = Touch { queue, seq, line };
        for b in reads {
            self.placed[b.index as usize].reads.push(touch);
        }
        if let Some(b) = write {
            let p = &mut self.placed[b.index as usize];
            p.last_write = Some(touch);
            p.reads.clear();
        }
        let mut done = known;
        done[q] = seq;
        self.done[q].push(done);
        // An instruction reads at most 4 buffers (`Instr::new` checks).
        let mut ids = [0 as BufId; 4];
        for (id, b) in ids.iter_mut().zip(reads) {
            *id = self.placed[b.index as usize].id;
        }
        let write_id = write.map(|b| self.placed[b.index as usize].id);
        self.trace
            .exec(&Instr::new(op, line, &ids[..reads.len()], write_id));
        Event { queue, seq }
    }
}
