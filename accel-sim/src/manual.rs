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
use crate::functional::{self as f, mma_f32, mma_f32_bt, round_to, Binary, Reduce, Unary};
use crate::isa::{mma_flop, Engine, Op, Region, VectorClass};
use crate::program::{BufId, Instr, ProgramTrace, Recorder, References};

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
    /// data. Following `reference` (traces of the same kernel) only makes recording cheaper.
    pub fn new(
        kernel: &'static str,
        functional: bool,
        sram_bytes: u64,
        reference: Option<&References>,
    ) -> ManualProgram {
        ManualProgram {
            kernel,
            functional,
            capacity: sram_bytes,
            line: 0,
            trace: reference.map_or_else(Recorder::new, Recorder::following_any),
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
        // A cost-only run still reads the indices an index tensor holds (a block table), as the
        // DSL's `load` does; other buffers stay shape-only.
        let index_data = !self.functional && dst.dtype == DType::I32 && src.has_data();
        if !self.functional && !index_data {
            self.placed[dst.index as usize].data = None;
        }
        if self.functional || index_data {
            if self.functional && !src.has_data() {
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

    /// Vector queue: fills `dst` with `value` once the `wait` events complete (the DSL's `full`;
    /// a pass that computes nothing useful).
    pub fn fill(&mut self, dst: Buffer, value: f32, wait: &[Event]) -> Event {
        if self.functional {
            let d = self.placed[dst.index as usize]
                .data
                .get_or_insert_with(Vec::new);
            d.clear();
            d.resize(dst.rows * dst.cols, value);
            round_to(d, dst.dtype);
        }
        self.placed[dst.index as usize].valid = [dst.rows, dst.cols];
        let elems = (dst.rows * dst.cols) as u64;
        self.vector(&[], dst, VectorClass::Simple, elems, dst.dtype, 0, wait)
    }

    /// Vector queue: `dst = op(src)` element-wise (`dst` may be `src`), rounded to `dst`'s type:
    /// the DSL's `exp`, `ln`, … (a transcendental op costs the transcendental passes).
    pub fn unary(&mut self, src: Buffer, dst: Buffer, op: Unary, wait: &[Event]) -> Event {
        self.same_shape("unary", &[src], dst);
        self.compute(&[src], dst, |out, x| f::unary(out, x[0], op));
        self.placed[dst.index as usize].valid = self.placed[src.index as usize].valid;
        let class = if op.is_transcendental() {
            VectorClass::Transcendental
        } else {
            VectorClass::Simple
        };
        let elems = (dst.rows * dst.cols) as u64;
        self.vector(&[src], dst, class, elems, src.dtype, elems, wait)
    }

    /// Vector queue: `dst = op(src, s)` with a scalar right operand (`dst` may be `src`): the
    /// DSL's `scale` with `Binary::Mul`.
    pub fn scalar(
        &mut self,
        src: Buffer,
        s: f32,
        dst: Buffer,
        op: Binary,
        wait: &[Event],
    ) -> Event {
        self.same_shape("scalar", &[src], dst);
        self.compute(&[src], dst, |out, x| f::binary_scalar(out, x[0], s, op));
        self.placed[dst.index as usize].valid = self.placed[src.index as usize].valid;
        let elems = (dst.rows * dst.cols) as u64;
        self.vector(
            &[src],
            dst,
            VectorClass::Simple,
            elems,
            src.dtype,
            elems,
            wait,
        )
    }

    /// Vector queue: `dst = op(a, b)` element-wise (`dst` may be either input): the DSL's `add`,
    /// `sub`, `mul`, `div`, `maximum`, `minimum`.
    pub fn binary(
        &mut self,
        a: Buffer,
        b: Buffer,
        dst: Buffer,
        op: Binary,
        wait: &[Event],
    ) -> Event {
        self.same_shape("binary", &[a, b], dst);
        self.compute(&[a, b], dst, |out, x| f::binary(out, x[0], x[1], op));
        let (va, vb) = (
            self.placed[a.index as usize].valid,
            self.placed[b.index as usize].valid,
        );
        self.placed[dst.index as usize].valid = [va[0].max(vb[0]), va[1].max(vb[1])];
        let elems = (dst.rows * dst.cols) as u64;
        self.vector(
            &[a, b],
            dst,
            VectorClass::Simple,
            elems,
            a.dtype,
            elems,
            wait,
        )
    }

    /// Vector queue: `dst[r][c] = op(a[r][c], v[r])`, a column `v` (`rows × 1`) broadcast across
    /// the columns (`dst` may be `a`): the DSL's `sub_col`, `mul_col`, `div_col`.
    pub fn col_bcast(
        &mut self,
        a: Buffer,
        v: Buffer,
        dst: Buffer,
        op: Binary,
        wait: &[Event],
    ) -> Event {
        self.same_shape("col_bcast", &[a], dst);
        if (v.rows, v.cols) != (a.rows, 1) {
            self.fail(format!(
                "col_bcast broadcasts a [{}, 1] column across a [{}, {}] buffer; got [{}, {}]",
                a.rows, a.rows, a.cols, v.rows, v.cols
            ));
        }
        let cols = a.cols;
        self.compute(&[a, v], dst, |out, x| {
            f::binary_col_bcast(out, x[0], x[1], cols, op)
        });
        self.placed[dst.index as usize].valid = self.placed[a.index as usize].valid;
        let elems = (dst.rows * dst.cols) as u64;
        self.vector(
            &[a, v],
            dst,
            VectorClass::Simple,
            elems,
            a.dtype,
            elems,
            wait,
        )
    }

    /// Vector queue: reduces each row of `src` into `dst` (`rows × 1`, f32): the DSL's `row_max`,
    /// `row_sum`.
    pub fn reduce_rows(&mut self, src: Buffer, dst: Buffer, op: Reduce, wait: &[Event]) -> Event {
        if (dst.rows, dst.cols, dst.dtype) != (src.rows, 1, DType::F32) {
            self.fail(format!(
                "reduce_rows of a [{}, {}] buffer writes an f32 [{}, 1] column; got {} [{}, {}]",
                src.rows, src.cols, src.rows, dst.dtype, dst.rows, dst.cols
            ));
        }
        let cols = src.cols;
        self.compute(&[src], dst, |out, x| f::reduce_rows(out, x[0], cols, op));
        self.placed[dst.index as usize].valid = [self.placed[src.index as usize].valid[0], 1];
        let elems = (src.rows * src.cols) as u64;
        self.vector(
            &[src],
            dst,
            VectorClass::Reduction,
            elems,
            src.dtype,
            elems,
            wait,
        )
    }

    /// Vector queue: sets the columns of `buf` from `from` on to −∞ in place (keys past the
    /// context, before a softmax): the DSL's `mask_keys` without causality.
    pub fn mask_cols(&mut self, buf: Buffer, from: usize, wait: &[Event]) -> Event {
        let cols = buf.cols;
        self.compute(&[buf], buf, |out, x| {
            out.copy_from_slice(x[0]);
            for row in out.chunks_exact_mut(cols) {
                for v in row.iter_mut().skip(from) {
                    *v = f32::NEG_INFINITY;
                }
            }
        });
        let elems = (buf.rows * buf.cols) as u64;
        self.vector(
            &[buf],
            buf,
            VectorClass::Simple,
            elems,
            buf.dtype,
            elems,
            wait,
        )
    }

    /// Reads entry `i` (row-major) of an index buffer (i32) into the program as a scalar, so
    /// later addresses can depend on it (a page of a block table): a one-element vector move the
    /// program waits for, as the DSL's `index_at`. `wait` must hold the event that loaded it.
    /// A cost-only run reads the data of a buffer loaded from an index tensor that holds some
    /// ([`Self::dma_in`]), else gets `fallback`; a negative or out-of-range entry is an error.
    pub fn index_at(&mut self, buf: Buffer, i: usize, fallback: usize, wait: &[Event]) -> usize {
        let n = buf.rows * buf.cols;
        let value = match &self.placed[buf.index as usize].data {
            Some(d) => match d.get(i) {
                Some(v) if v.is_finite() && *v >= 0.0 => *v as usize,
                Some(v) => {
                    let v = *v;
                    self.fail(format!(
                        "index buffer `{}` holds {v} at {i}; indices must be non-negative",
                        self.placed[buf.index as usize].name
                    ));
                    0
                }
                None => {
                    self.fail(format!("index position {i} is outside a {n}-entry buffer"));
                    0
                }
            },
            _ => fallback,
        };
        if buf.dtype != DType::I32 {
            self.fail(format!("index_at reads an i32 buffer, not {}", buf.dtype));
        }
        let op = Op::Vector {
            elems: 1,
            dtype: DType::I32,
            class: VectorClass::Simple,
            useful: 0,
        };
        self.issue_with(Engine::Vector, op, &[buf], None, wait, true);
        value
    }

    /// Fails unless every input has `dst`'s shape.
    fn same_shape(&mut self, what: &str, inputs: &[Buffer], dst: Buffer) {
        if let Some(b) = inputs
            .iter()
            .find(|b| (b.rows, b.cols) != (dst.rows, dst.cols))
        {
            self.fail(format!(
                "{what} writes a [{}, {}] buffer from a [{}, {}] one: the shapes must match",
                dst.rows, dst.cols, b.rows, b.cols
            ));
        }
    }

    /// Functional runs: `dst = body(inputs' data)`, rounded to `dst`'s type (inputs never
    /// written read as NaN, so an unwritten element shows).
    fn compute(
        &mut self,
        inputs: &[Buffer],
        dst: Buffer,
        body: impl FnOnce(&mut [f32], &[&[f32]]),
    ) {
        if !self.functional {
            return;
        }
        let taken: Vec<Vec<f32>> = inputs
            .iter()
            .map(|b| {
                self.placed[b.index as usize]
                    .data
                    .clone()
                    .unwrap_or_else(|| vec![f32::NAN; b.rows * b.cols])
            })
            .collect();
        let views: Vec<&[f32]> = taken.iter().map(|v| v.as_slice()).collect();
        let mut out = vec![0.0f32; dst.rows * dst.cols];
        body(&mut out, &views);
        round_to(&mut out, dst.dtype);
        self.placed[dst.index as usize].data = Some(out);
    }

    /// Issues a vector pass of `elems` elements of `src`'s type reading `reads` and writing `dst`
    /// (`useful` of them the problem's work).
    #[allow(clippy::too_many_arguments)]
    fn vector(
        &mut self,
        reads: &[Buffer],
        dst: Buffer,
        class: VectorClass,
        elems: u64,
        dtype: DType,
        useful: u64,
        wait: &[Event],
    ) -> Event {
        let op = Op::Vector {
            elems,
            dtype,
            class,
            useful,
        };
        self.issue(Engine::Vector, op, reads, Some(dst), wait)
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
        self.issue_with(queue, op, reads, write, wait, false)
    }

    /// [`Self::issue`], `blocking` or not (a blocking operation stops the program's issue stream
    /// until it completes: its result decides what is issued next).
    fn issue_with(
        &mut self,
        queue: Engine,
        op: Op,
        reads: &[Buffer],
        write: Option<Buffer>,
        wait: &[Event],
        blocking: bool,
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
        let ins = Instr::new(op, line, &ids[..reads.len()], write_id);
        self.trace
            .exec(&if blocking { ins.blocking() } else { ins });
        Event { queue, seq }
    }
}
