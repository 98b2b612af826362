//! A program's recorded instruction stream: what a front end hands the timing model.
//!
//! Kernels are loops, so a program issues the same few dozen instructions thousands of times,
//! differing only in which buffers they touch and which device window a load reads. The trace stores
//! each event once in a table of distinct *shapes* and the program as a stream of table indices,
//! with the load windows beside it. A shape is the event with its load window left out and each
//! buffer operand written as a back-reference — "the buffer in operand slot `s` of the event `d`
//! events ago", i.e. where this buffer was last touched — which is the same in every iteration of a
//! loop, both for values carried from the previous iteration and for tiles built before the loop.
//! Decoding gives back exactly the events that were recorded. A 1M-token chunked prefill issues
//! millions of events per program; this keeps them at 4 bytes each instead of ~90, and lets the
//! timing model work per distinct shape.

use crate::isa::{Op, Region};
use std::collections::HashMap;

/// Program-local id of an on-chip buffer (one per tile value).
pub type BufId = u32;

/// One issued instruction with its operands.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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

/// The load window stored in a shape: shapes leave it out, so loads of different windows share one.
const NO_REGION: Region = Region {
    tensor: 0,
    offset: 0,
    rows: 0,
    cols: 0,
};

/// "No shape" in the successor table.
const NONE: u32 = u32::MAX;

/// A shape packed into integers, so that recording compares and hashes a few words instead of an
/// enum: word 0 holds the kind (`TAG_*`), flags, dtype, vector class and line; words 1–3 the sizes
/// (bytes, or m/n/k, or elements); words 4–8 the buffer back-references. Distinct shapes pack distinctly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key([u64; 9]);

const TAG_ALLOC: u64 = 1;
const TAG_LOAD: u64 = 2;
const TAG_STORE: u64 = 3;
const TAG_MMA: u64 = 4;
const TAG_VECTOR: u64 = 5;
const TAG_BARRIER: u64 = 6;

/// Everything one program issued, in order (compactly: see the module docs).
#[derive(Debug, Clone)]
pub struct ProgramTrace {
    /// Distinct event shapes: load windows blank, buffer ids 0 (see `operands`).
    shapes: Vec<Event>,
    /// Buffer operands of each shape as back-references (`d | s << 32`: the buffer in slot `s` of
    /// the event `d` events earlier; `d = 0` is an earlier slot of the same event). Slots: the
    /// reads in order, then the write; an allocation's slot 0 is the new buffer.
    operands: Vec<[u64; 5]>,
    /// Where each buffer was last touched: (event index, slot). Recording only.
    last_touch: Vec<(u32, u8)>,
    /// The program: one shape index per event.
    stream: Vec<u32>,
    /// Bytes and window of every load, in issue order.
    loads: Vec<(u64, Region)>,
    /// Bytes of every store, summed.
    store_bytes: u64,
    /// Buffers allocated (ids are `0..n_bufs`).
    n_bufs: u32,
    /// Packed form of each shape (what recording compares and hashes).
    keys: Vec<Key>,
    /// Shape → index, for shapes not found by the successor guess.
    index: HashMap<Key, u32, foldhash::fast::FixedState>,
    /// The shape that followed each shape last time (a loop body repeats, so this is usually right
    /// and saves hashing).
    next_of: Vec<u32>,
    /// The previous event's shape.
    prev: u32,
}

impl Default for ProgramTrace {
    fn default() -> ProgramTrace {
        ProgramTrace::new()
    }
}

impl PartialEq for ProgramTrace {
    fn eq(&self, o: &ProgramTrace) -> bool {
        self.same_shapes(o) && self.loads == o.loads
    }
}

impl ProgramTrace {
    /// An empty trace.
    pub fn new() -> ProgramTrace {
        ProgramTrace {
            shapes: Vec::new(),
            operands: Vec::new(),
            last_touch: Vec::new(),
            stream: Vec::new(),
            loads: Vec::new(),
            store_bytes: 0,
            n_bufs: 0,
            keys: Vec::new(),
            index: HashMap::default(),
            next_of: Vec::new(),
            prev: NONE,
        }
    }

    /// Records that a tile of `bytes` comes into existence at `line`; returns its buffer id.
    pub fn alloc(&mut self, bytes: u64, line: u32) -> BufId {
        let buf = self.n_bufs;
        self.last_touch.push((self.stream.len() as u32, 0));
        let key = Key([TAG_ALLOC | (line as u64) << 32, bytes, 0, 0, 0, 0, 0, 0, 0]);
        self.record(key, [0; 5], || Event::Alloc {
            buf: 0,
            bytes,
            line,
        });
        self.n_bufs += 1;
        buf
    }

    /// Records an issued instruction.
    ///
    /// # Panics
    /// If it names a buffer that [`Self::alloc`] did not return (a front-end bug).
    pub fn exec(&mut self, ins: &Instr) {
        let here = self.stream.len() as u32;
        let mut ops = [0u64; 5];
        let mut refer = |slot: usize, b: BufId| {
            let last = self
                .last_touch
                .get_mut(b as usize)
                .expect("front end recorded a use of a buffer it never allocated");
            ops[slot] = (here - last.0) as u64 | (last.1 as u64) << 32;
            *last = (here, slot as u8);
        };
        let n = ins.n_reads as usize;
        for (k, r) in ins.reads().iter().enumerate() {
            refer(k, *r);
        }
        if let Some(w) = ins.write {
            refer(n, w);
        }
        let (tag, a, b, c, dtype, class) = match &ins.op {
            Op::Load { bytes, region } => {
                self.loads.push((*bytes, *region));
                (TAG_LOAD, *bytes, 0, 0, 0, 0)
            }
            Op::Store { bytes } => {
                self.store_bytes += *bytes;
                (TAG_STORE, *bytes, 0, 0, 0, 0)
            }
            Op::Mma { m, n, k, dtype } => (TAG_MMA, *m, *n, *k, *dtype as u64, 0),
            Op::Vector {
                elems,
                dtype,
                class,
            } => (TAG_VECTOR, *elems, 0, 0, *dtype as u64, *class as u64),
            Op::Barrier => (TAG_BARRIER, 0, 0, 0, 0, 0),
        };
        let head = tag
            | (ins.blocking as u64) << 8
            | (n as u64) << 9
            | (ins.write.is_some() as u64) << 12
            | dtype << 16
            | class << 24
            | (ins.line as u64) << 32;
        let key = Key([head, a, b, c, ops[0], ops[1], ops[2], ops[3], ops[4]]);
        self.record(key, ops, || {
            let mut shape = ins.clone();
            shape.reads = [0; 4];
            shape.write = shape.write.map(|_| 0);
            if let Op::Load { region, .. } = &mut shape.op {
                *region = NO_REGION;
            }
            Event::Exec(shape)
        });
    }

    /// Appends a shape to the stream, finding its index or adding it (built by `shape`).
    fn record(&mut self, key: Key, ops: [u64; 5], shape: impl FnOnce() -> Event) {
        let guess = match self.prev {
            NONE => NONE,
            p => self.next_of[p as usize],
        };
        let idx = if guess != NONE && self.keys[guess as usize] == key {
            guess
        } else {
            let idx = match self.index.get(&key) {
                Some(i) => *i,
                None => {
                    let i = self.shapes.len() as u32;
                    self.index.insert(key, i);
                    self.keys.push(key);
                    self.shapes.push(shape());
                    self.operands.push(ops);
                    self.next_of.push(NONE);
                    i
                }
            };
            if self.prev != NONE {
                self.next_of[self.prev as usize] = idx;
            }
            idx
        };
        self.stream.push(idx);
        self.prev = idx;
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.stream.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.stream.is_empty()
    }

    /// Number of buffers allocated (ids are `0..n_bufs`).
    pub fn n_bufs(&self) -> u32 {
        self.n_bufs
    }

    /// Number of distinct event shapes (see [`Self::indexed_events`]).
    pub fn n_shapes(&self) -> usize {
        self.shapes.len()
    }

    /// The distinct event shapes, indexed as in [`Self::indexed_events`] (buffer ids and load
    /// windows blank).
    pub fn shapes(&self) -> &[Event] {
        &self.shapes
    }

    /// Bytes and window of every load, in issue order (what the L2 model classifies).
    pub fn loads(&self) -> &[(u64, Region)] {
        &self.loads
    }

    /// Total bytes stored.
    pub fn store_bytes(&self) -> u64 {
        self.store_bytes
    }

    /// Whether the two programs issued the same events apart from the device windows they load:
    /// the timing model cannot tell them apart given the same memory levels and bandwidth.
    pub fn same_shapes(&self, o: &ProgramTrace) -> bool {
        self.n_bufs == o.n_bufs
            && self.store_bytes == o.store_bytes
            && self.stream == o.stream
            && self.shapes == o.shapes
            && self.operands == o.operands
            && self.loads.len() == o.loads.len()
    }

    /// The events in issue order.
    pub fn events(&self) -> impl Iterator<Item = Event> + '_ {
        self.indexed_events().map(|(_, e)| e)
    }

    /// The events in issue order, each with its shape index in `0..n_shapes()`: two events with
    /// the same index are the same instruction (or allocation) apart from buffer ids and load
    /// window, so anything that depends only on the shape can be computed once per index.
    pub fn indexed_events(&self) -> impl Iterator<Item = (u32, Event)> + '_ {
        let mut cursor: BufId = 0;
        let mut next_load = 0usize;
        // The buffers in each slot of every event so far, to resolve back-references.
        let mut slots: Vec<[BufId; 5]> = Vec::with_capacity(self.stream.len());
        self.stream.iter().map(move |&i| {
            let mut ev = self.shapes[i as usize].clone();
            let mut cur: [BufId; 5] = [0; 5];
            let ops = &self.operands[i as usize];
            let resolve = |cur: &[BufId; 5], slots: &[[BufId; 5]], op: u64| {
                let (d, s) = ((op & 0xffff_ffff) as usize, (op >> 32) as usize);
                if d == 0 {
                    cur[s]
                } else {
                    slots[slots.len() - d][s]
                }
            };
            match &mut ev {
                Event::Alloc { buf, .. } => {
                    *buf = cursor;
                    cur[0] = cursor;
                    cursor += 1;
                }
                Event::Exec(ins) => {
                    let n = ins.n_reads as usize;
                    for k in 0..n {
                        cur[k] = resolve(&cur, &slots, ops[k]);
                        ins.reads[k] = cur[k];
                    }
                    if ins.write.is_some() {
                        cur[n] = resolve(&cur, &slots, ops[n]);
                        ins.write = Some(cur[n]);
                    }
                    if let Op::Load { region, .. } = &mut ins.op {
                        *region = self.loads[next_load].1;
                        next_load += 1;
                    }
                }
            }
            slots.push(cur);
            (i, ev)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::isa::VectorClass;

    fn load(tensor: u64, offset: u64, bytes: u64, write: BufId) -> Instr {
        let region = Region {
            tensor,
            offset,
            rows: 4,
            cols: 4,
        };
        Instr::new(Op::Load { bytes, region }, 7, &[], Some(write))
    }

    /// A loop of `iters` bodies, each loading a window and updating a carried accumulator.
    fn looped(trace: &mut ProgramTrace, tensor: u64, iters: u64) -> Vec<Event> {
        let mut want = Vec::new();
        let alloc = |t: &mut ProgramTrace, want: &mut Vec<Event>, bytes: u64, line: u32| {
            let buf = t.alloc(bytes, line);
            want.push(Event::Alloc { buf, bytes, line });
            buf
        };
        let mut acc = alloc(trace, &mut want, 64, 1);
        // Built before the loop and read in every iteration (like an identity matrix).
        let inv = alloc(trace, &mut want, 64, 1);
        for i in 0..iters {
            let x = alloc(trace, &mut want, 64, 2);
            let ins = load(tensor, i * 16, 64 - (i == iters - 1) as u64 * 32, x);
            let ins = if i % 3 == 0 { ins.blocking() } else { ins };
            trace.exec(&ins);
            want.push(Event::Exec(ins));
            let y = alloc(trace, &mut want, 64, 3);
            let op = Op::Vector {
                elems: 16,
                dtype: DType::F32,
                class: VectorClass::Simple,
            };
            let ins = Instr::new(op, 3, &[x, acc, inv], Some(y));
            trace.exec(&ins);
            want.push(Event::Exec(ins));
            acc = y;
        }
        let ins = Instr::new(Op::Store { bytes: 64 }, 9, &[acc], None);
        trace.exec(&ins);
        want.push(Event::Exec(ins));
        want
    }

    #[test]
    fn decoding_gives_back_every_recorded_event() {
        let mut t = ProgramTrace::new();
        let want = looped(&mut t, 5, 50);
        assert_eq!(t.events().collect::<Vec<_>>(), want);
        assert_eq!(t.len(), want.len());
        assert_eq!(t.n_bufs(), 102);
        assert_eq!(t.loads().len(), 50);
        assert_eq!(t.store_bytes(), 64);
        // The loop body repeats, operands included (carried and loop-invariant buffers alike): a
        // handful of shapes serve 50 iterations.
        assert!(t.n_shapes() < 12, "{} shapes", t.n_shapes());
    }

    #[test]
    fn programs_differing_only_in_windows_have_the_same_shapes() {
        let (mut a, mut b, mut c) = (
            ProgramTrace::new(),
            ProgramTrace::new(),
            ProgramTrace::new(),
        );
        looped(&mut a, 1, 20);
        looped(&mut b, 2, 20);
        looped(&mut c, 1, 21);
        assert!(a.same_shapes(&b));
        assert_ne!(a, b);
        assert!(!a.same_shapes(&c));
    }
}
