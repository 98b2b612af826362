//! A program's recorded instruction stream: what a front end hands the timing model.
//!
//! Kernels are loops, so a program issues the same few dozen instructions thousands of times,
//! differing only in which buffers they touch and which device window a load reads. The trace stores
//! each event once in a table of distinct *shapes* (the event with its buffer ids and load window
//! left out), the program as a stream of table indices, and beside it the buffer operands and the
//! load windows. Decoding gives back exactly the events that were recorded.
//!
//! The programs of a launch mostly issue the same events and differ only in the windows they load
//! (the heads of a layer, the tiles of a GEMM). So the first program is recorded in full and the
//! others *follow* it ([`Recorder::following`]): each event is only compared with the reference's
//! event at the same position, and only the load windows are kept. A follower that issues something
//! else diverges there: before recording in full it looks among a few other recently recorded
//! programs ([`References`]) for one that issued the same events so far and this one next, and
//! follows that instead (a GEMM's tail tiles, an expert's partial tile); only when none matches
//! does it take a copy of the reference's prefix and go on recording in full.
//! Either way the finished [`ProgramTrace`] is the same as a full recording; followers share the
//! reference's body, so comparing them is a pointer check. A 1M-token chunked prefill issues
//! millions of events per program; this keeps one copy of them per launch instead of one per head.

use crate::isa::{Op, Region};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

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
    #[inline]
    pub fn new(op: Op, line: u32, reads: &[BufId], write: Option<BufId>) -> Instr {
        assert!(reads.len() <= 4, "an instruction reads at most 4 buffers");
        // Element by element, not `copy_from_slice`: a memcpy into a stack array that is then
        // read whole stalls on store forwarding, and this runs once per recorded event.
        let at = |i: usize| reads.get(i).copied().unwrap_or(0);
        Instr {
            op,
            line,
            reads: [at(0), at(1), at(2), at(3)],
            n_reads: reads.len() as u8,
            write,
            blocking: false,
        }
    }

    /// Marks the instruction as blocking the issue stream until it completes.
    #[inline]
    pub fn blocking(mut self) -> Instr {
        self.blocking = true;
        self
    }

    /// The buffers read.
    #[inline]
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
/// (bytes, or m/n/k, or elements). Distinct shapes pack distinctly.
#[derive(Debug, Clone, Copy, Eq)]
struct Key([u64; 4]);

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.0.hash(h);
    }
}

impl PartialEq for Key {
    /// Word by word: a key is usually just built from scalars, and a vector compare would have to
    /// reload it whole from the stack (a store-forwarding stall that cost a third of recording).
    #[inline(always)]
    fn eq(&self, o: &Key) -> bool {
        let (a, b) = (&self.0, &o.0);
        a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3]
    }
}

const TAG_ALLOC: u64 = 1;
const TAG_LOAD: u64 = 2;
const TAG_STORE: u64 = 3;
const TAG_MMA: u64 = 4;
const TAG_VECTOR: u64 = 5;
const TAG_BARRIER: u64 = 6;

impl Key {
    #[inline(always)]
    fn alloc(bytes: u64, line: u32) -> Key {
        Key([TAG_ALLOC | (line as u64) << 32, bytes, 0, 0])
    }

    #[inline(always)]
    fn exec(ins: &Instr) -> Key {
        let (tag, a, b, c, dtype, class) = match &ins.op {
            Op::Load { bytes, .. } => (TAG_LOAD, *bytes, 0, 0, 0, 0),
            Op::Store { bytes } => (TAG_STORE, *bytes, 0, 0, 0, 0),
            Op::Mma {
                m,
                n,
                k,
                dtype,
                useful,
            } => {
                // Tile sides are compile-time and small: three fit one word, leaving one for
                // the useful FLOP.
                debug_assert!(*m < 1 << 21 && *n < 1 << 21 && *k < 1 << 21);
                (TAG_MMA, m | n << 21 | k << 42, *useful, 0, *dtype as u64, 0)
            }
            Op::Vector {
                elems,
                dtype,
                class,
                useful,
            } => (TAG_VECTOR, *elems, *useful, 0, *dtype as u64, *class as u64),
            Op::Barrier => (TAG_BARRIER, 0, 0, 0, 0, 0),
        };
        let head = tag
            | (ins.blocking as u64) << 8
            | (ins.n_reads as u64) << 9
            | (ins.write.is_some() as u64) << 12
            | dtype << 16
            | class << 24
            | (ins.line as u64) << 32;
        Key([head, a, b, c])
    }
}

/// What a program issued apart from its load windows; programs that issued the same share one.
#[derive(Debug, Clone, Default)]
struct Body {
    /// Distinct event shapes: buffer ids 0, load windows blank.
    shapes: Vec<Event>,
    /// Packed form of each shape.
    keys: Vec<Key>,
    /// The program: one shape index per event.
    stream: Vec<u32>,
    /// Buffer operands of every instruction in issue order, each in slot order (reads, then the
    /// write); allocations take the next id and store none.
    ids: Vec<BufId>,
    /// Buffers allocated (ids are `0..n_bufs`).
    n_bufs: u32,
    /// Bytes of every store, summed.
    store_bytes: u64,
    /// Number of loads.
    n_loads: usize,
    /// Liveness, computed once per body (see [`ProgramTrace::last_uses`]).
    last_uses: OnceLock<Vec<u32>>,
    /// The operands as the timing model walks them, computed once per body (see [`Walk`]).
    walk: OnceLock<Walk>,
}

/// Set in a [`Walk`] slot when the buffer's last use is this event (its first mention in it).
pub(crate) const SLOT_RELEASE: u32 = 1 << 31;
/// Set in a [`Walk`] allocation slot when a matrix instruction accumulates into the buffer.
pub(crate) const SLOT_ACC: u32 = 1 << 30;
/// Set in a [`Walk`] accumulator allocation slot when the next event is an element-wise op that
/// writes it from a register-resident tile at least as large whose last use that event is
/// (flash attention's `acc = acc · α` rescale, the softmax of the scores): registers are updated
/// in place, so the old and the new tile never hold accumulator storage together.
pub(crate) const SLOT_IN_PLACE: u32 = 1 << 29;
/// The slot number in a [`Walk`] slot.
pub(crate) const SLOT_MASK: u32 = SLOT_IN_PLACE - 1;

/// A body's buffers renamed to *slots* for the timing model: a slot is reused once its buffer's
/// last use is past, so the timing model's per-buffer state is as small as the most buffers
/// live at once (a long program allocates millions of tiles, a few dozen live), and whether an
/// event ends a buffer's life is a flag instead of a lookup.
#[derive(Debug, Clone)]
struct Walk {
    /// Per buffer (allocation order): its slot, [`SLOT_ACC`], and [`SLOT_RELEASE`] when nothing
    /// uses it after its allocation.
    alloc: Vec<u32>,
    /// Per entry of [`Body::ids`]: the buffer's slot, and [`SLOT_RELEASE`] at its last use.
    ops: Vec<u32>,
    /// Slots used (the most buffers live at once).
    n_slots: u32,
}

/// One event as the timing walk reads it ([`ProgramTrace::walk_at`]): buffers as [`Walk`] slots.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WalkView<'a> {
    /// A tile comes into existence in `slot` (with the [`SLOT_ACC`] and [`SLOT_RELEASE`] flags).
    Alloc { slot: u32, bytes: u64, line: u32 },
    /// An instruction: its shape and its operands' slots (with [`SLOT_RELEASE`] flags).
    Exec {
        ins: &'a Instr,
        reads: &'a [u32],
        write: Option<u32>,
    },
}

impl PartialEq for Body {
    /// The same events in the same order with the same operands, however each body numbered its
    /// shapes (a follower that diverged numbers them as its reference did).
    fn eq(&self, o: &Body) -> bool {
        self.n_bufs == o.n_bufs
            && self.store_bytes == o.store_bytes
            && self.n_loads == o.n_loads
            && self.stream.len() == o.stream.len()
            && self.ids == o.ids
            && if self.keys == o.keys {
                self.stream == o.stream
            } else {
                self.stream
                    .iter()
                    .zip(&o.stream)
                    .all(|(a, b)| self.keys[*a as usize] == o.keys[*b as usize])
            }
    }
}

/// One event as the timing model reads it: the shape by reference, with its buffers.
#[derive(Debug, Clone, Copy)]
pub enum EventView<'a> {
    /// A tile of `bytes` comes into existence (see [`Event::Alloc`]).
    Alloc {
        /// The new buffer.
        buf: BufId,
        /// Its size in bytes.
        bytes: u64,
        /// Source line that created it.
        line: u32,
    },
    /// An instruction is issued: its shape (buffer ids and load window blank) and its buffers.
    Exec {
        /// The instruction's shape.
        ins: &'a Instr,
        /// The buffers it reads.
        reads: &'a [BufId],
        /// The buffer it writes.
        write: Option<BufId>,
    },
}

/// A position in a program's event stream (see [`ProgramTrace::view_at`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cursor {
    /// Index of the next event.
    pub pos: usize,
    next_buf: BufId,
    next_id: usize,
}

/// Whether two recorded bodies hold the same events: one pointer check when they are shared.
fn same_body(a: &Arc<Body>, b: &Arc<Body>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// The events of a program without its load windows ([`ProgramTrace::shapes_handle`]).
#[derive(Debug, Clone)]
pub struct ShapesHandle(Arc<Body>);

impl ShapesHandle {
    /// Whether `trace` shares this recorded body (a pointer check; equal bodies recorded apart
    /// do not count).
    pub fn is_body_of(&self, trace: &ProgramTrace) -> bool {
        Arc::ptr_eq(&self.0, &trace.body)
    }
}

/// Most bodies a [`References`] holds: a launch's programs issue a few distinct streams (full and
/// tail tiles, an expert's partial tile, the first and last blocks of an attention row).
pub const MAX_REFERENCES: usize = 8;

/// What followers compare their events with ([`Recorder::following_any`]): the program most of
/// them repeat, then other recently recorded programs a follower switches to when it diverges
/// from the first. Which one is followed changes no trace, only how cheaply it is recorded.
#[derive(Debug, Clone)]
pub struct References {
    /// Distinct bodies, the main reference first.
    bodies: Arc<[Arc<Body>]>,
}

impl References {
    /// `main`, then the distinct bodies of `others` not already held, up to [`MAX_REFERENCES`].
    pub fn new<'t>(
        main: &ProgramTrace,
        others: impl IntoIterator<Item = &'t ShapesHandle>,
    ) -> References {
        let mut bodies: Vec<Arc<Body>> = vec![Arc::clone(&main.body)];
        for h in others {
            if bodies.len() == MAX_REFERENCES {
                break;
            }
            if !bodies.iter().any(|b| Arc::ptr_eq(b, &h.0)) {
                bodies.push(Arc::clone(&h.0));
            }
        }
        References {
            bodies: bodies.into(),
        }
    }

    /// Whether `trace` shares one of these bodies (it followed one of them to its end).
    pub fn holds(&self, trace: &ProgramTrace) -> bool {
        self.bodies.iter().any(|b| Arc::ptr_eq(b, &trace.body))
    }
}

/// Everything one program issued, in order (compactly: see the module docs).
#[derive(Debug, Clone)]
pub struct ProgramTrace {
    body: Arc<Body>,
    /// Bytes and window of every load, in issue order.
    loads: Vec<(u64, Region)>,
}

impl PartialEq for ProgramTrace {
    fn eq(&self, o: &ProgramTrace) -> bool {
        self.same_shapes(o) && self.loads == o.loads
    }
}

impl ProgramTrace {
    /// Number of events.
    pub fn len(&self) -> usize {
        self.body.stream.len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.body.stream.is_empty()
    }

    /// Number of buffers allocated (ids are `0..n_bufs`).
    pub fn n_bufs(&self) -> u32 {
        self.body.n_bufs
    }

    /// Number of distinct event shapes (see [`Self::indexed_events`]).
    pub fn n_shapes(&self) -> usize {
        self.body.shapes.len()
    }

    /// The distinct event shapes, indexed as in [`Self::indexed_events`] (buffer ids and load
    /// windows blank). A program that diverged from the one it followed keeps that one's shapes
    /// too, so a shape may occur in no event.
    pub fn shapes(&self) -> &[Event] {
        &self.body.shapes
    }

    /// Bytes and window of every load, in issue order (what the L2 model classifies).
    pub fn loads(&self) -> &[(u64, Region)] {
        &self.loads
    }

    /// Total bytes stored.
    pub fn store_bytes(&self) -> u64 {
        self.body.store_bytes
    }

    /// Whether the two programs issued the same events apart from the device windows they load:
    /// the timing model cannot tell them apart given the same memory levels and bandwidth.
    pub fn same_shapes(&self, o: &ProgramTrace) -> bool {
        same_body(&self.body, &o.body)
    }

    /// A handle on this program's events (not its load windows): what [`Self::has_shapes_of`]
    /// compares later programs with, without keeping this one's windows alive.
    pub fn shapes_handle(&self) -> ShapesHandle {
        ShapesHandle(Arc::clone(&self.body))
    }

    /// [`Self::same_shapes`] against a program known by its [`ShapesHandle`].
    pub fn has_shapes_of(&self, h: &ShapesHandle) -> bool {
        same_body(&self.body, &h.0)
    }

    /// Whether the two traces share one recorded body (a follower that never diverged shares its
    /// reference's): what makes [`Self::same_shapes`] a pointer check.
    pub fn shares_body(&self, o: &ProgramTrace) -> bool {
        Arc::ptr_eq(&self.body, &o.body)
    }

    /// The events in issue order.
    pub fn events(&self) -> impl Iterator<Item = Event> + '_ {
        self.indexed_events().map(|(_, e)| e)
    }

    /// The events in issue order, each with its shape index in `0..n_shapes()`: two events with
    /// the same index are the same instruction (or allocation) apart from buffer ids and load
    /// window, so anything that depends only on the shape can be computed once per index.
    pub fn indexed_events(&self) -> impl Iterator<Item = (u32, Event)> + '_ {
        let mut loads = self.loads.iter();
        self.views().map(move |(i, view)| {
            let ev = match view {
                EventView::Alloc { buf, bytes, line } => Event::Alloc { buf, bytes, line },
                EventView::Exec {
                    ins: shape,
                    reads,
                    write,
                } => {
                    let mut ins = Instr::new(shape.op.clone(), shape.line, reads, write);
                    ins.blocking = shape.blocking;
                    if let Op::Load { region, .. } = &mut ins.op {
                        *region = loads.next().expect("one window per recorded load").1;
                    }
                    Event::Exec(ins)
                }
            };
            (i, ev)
        })
    }

    /// The events in issue order without copying them, each with its shape index (see
    /// [`Self::indexed_events`]); what the timing model walks.
    pub fn views(&self) -> impl Iterator<Item = (u32, EventView<'_>)> + '_ {
        let body = &*self.body;
        let mut next_buf: BufId = 0;
        let mut next_id = 0usize;
        body.stream.iter().map(move |&i| {
            let view = match &body.shapes[i as usize] {
                Event::Alloc { bytes, line, .. } => {
                    next_buf += 1;
                    EventView::Alloc {
                        buf: next_buf - 1,
                        bytes: *bytes,
                        line: *line,
                    }
                }
                Event::Exec(ins) => {
                    let n = ins.n_reads as usize;
                    let reads = &body.ids[next_id..next_id + n];
                    next_id += n;
                    let write = ins.write.map(|_| {
                        next_id += 1;
                        body.ids[next_id - 1]
                    });
                    EventView::Exec { ins, reads, write }
                }
            };
            (i, view)
        })
    }

    /// The event at `c` and the cursor after it (`None` at the end), without moving `c`: the
    /// timing model walks a program resumably, stopping at an event whose inputs are not known
    /// yet (a transfer still in flight) and taking it again later.
    pub fn view_at(&self, c: &Cursor) -> Option<(u32, EventView<'_>, Cursor)> {
        let body = &*self.body;
        let &i = body.stream.get(c.pos)?;
        let mut next = Cursor {
            pos: c.pos + 1,
            ..*c
        };
        let view = match &body.shapes[i as usize] {
            Event::Alloc { bytes, line, .. } => {
                next.next_buf += 1;
                EventView::Alloc {
                    buf: c.next_buf,
                    bytes: *bytes,
                    line: *line,
                }
            }
            Event::Exec(ins) => {
                let n = ins.n_reads as usize;
                let reads = &body.ids[c.next_id..c.next_id + n];
                next.next_id += n;
                let write = ins.write.map(|_| {
                    next.next_id += 1;
                    body.ids[next.next_id - 1]
                });
                EventView::Exec { ins, reads, write }
            }
        };
        Some((i, view, next))
    }

    /// Slots for the timing walk ([`Walk`]); computed once per body.
    fn walk(&self) -> &Walk {
        self.body.walk.get_or_init(|| {
            let n = self.body.n_bufs as usize;
            let mut last = vec![0u32; n];
            let mut acc = vec![false; n];
            let mut bytes_of = vec![0u64; n];
            // Per buffer written by an element-wise op right after its allocation: that event and
            // its reads (in-place candidates, decided once every last use is known).
            let mut from: Vec<Option<(u32, [BufId; 4], u8)>> = vec![None; n];
            let mut just_allocated: Option<BufId> = None;
            for (i, (_, ev)) in self.views().enumerate() {
                match ev {
                    EventView::Alloc { buf, bytes, .. } => {
                        last[buf as usize] = i as u32;
                        bytes_of[buf as usize] = bytes;
                        just_allocated = Some(buf);
                        continue;
                    }
                    EventView::Exec { ins, reads, write } => {
                        for b in reads.iter().chain(write.iter()) {
                            last[*b as usize] = i as u32;
                        }
                        if let (Op::Mma { .. }, Some(w)) = (&ins.op, write) {
                            acc[w as usize] = true;
                        }
                        if let (Op::Vector { .. }, Some(w)) = (&ins.op, write) {
                            if just_allocated == Some(w) && reads.len() <= 4 {
                                let mut r = [0; 4];
                                r[..reads.len()].copy_from_slice(reads);
                                from[w as usize] = Some((i as u32, r, reads.len() as u8));
                            }
                        }
                    }
                }
                just_allocated = None;
            }
            // The read an element-wise result can take the registers of: one at least as large
            // whose last use is this op.
            let source = |w: usize, ok: &dyn Fn(usize) -> bool| {
                let (at, reads, n_reads) = from[w]?;
                reads[..n_reads as usize].iter().copied().find(|&r| {
                    r as usize != w
                        && last[r as usize] == at
                        && bytes_of[r as usize] >= bytes_of[w]
                        && ok(r as usize)
                })
            };
            // Register-resident tiles (devices whose accumulators live apart, e.g. Hopper's
            // register file): an element-wise op updates registers in place, as flash attention
            // does. Backwards, latest buffer first: a tile updated in place into an accumulator
            // is one (the zero-filled `acc`, rescaled, then accumulated into). Then forwards: a
            // dying accumulator's element-wise result stays in its registers (the scores, their
            // softmax and its bf16 cast).
            // Only tiles the vector unit made can be register-resident this way: a DMA lands
            // in the scratchpad.
            let mut in_place = vec![false; n];
            for w in (0..n).rev() {
                if acc[w] {
                    if let Some(r) = source(w, &|r| from[r].is_some()) {
                        in_place[w] = true;
                        acc[r as usize] = true;
                    }
                }
            }
            for w in 0..n {
                if !acc[w] && source(w, &|r| acc[r]).is_some() {
                    in_place[w] = true;
                    acc[w] = true;
                }
            }
            let mut slot_of = vec![0u32; n];
            let mut free: Vec<u32> = Vec::new();
            let mut n_slots = 0u32;
            let mut alloc = Vec::with_capacity(n);
            let mut ops = Vec::with_capacity(self.body.ids.len());
            let mut released: Vec<u32> = Vec::new();
            for (i, (_, ev)) in self.views().enumerate() {
                let i = i as u32;
                match ev {
                    EventView::Alloc { buf, .. } => {
                        let slot = free.pop().unwrap_or_else(|| {
                            n_slots += 1;
                            n_slots - 1
                        });
                        assert!(slot <= SLOT_MASK, "fewer than 2^29 buffers live at once");
                        slot_of[buf as usize] = slot;
                        let mut a = slot;
                        if acc[buf as usize] {
                            a |= SLOT_ACC;
                        }
                        if in_place[buf as usize] {
                            a |= SLOT_IN_PLACE;
                        }
                        if last[buf as usize] == i {
                            a |= SLOT_RELEASE;
                            free.push(slot);
                        }
                        alloc.push(a);
                    }
                    EventView::Exec { reads, write, .. } => {
                        let mut seen = [0 as BufId; 5];
                        for (k, b) in reads.iter().chain(write.iter()).copied().enumerate() {
                            let slot = slot_of[b as usize];
                            // A buffer named twice is released once, at its first mention.
                            let first = !seen[..k].contains(&b);
                            seen[k] = b;
                            if first && last[b as usize] == i {
                                ops.push(slot | SLOT_RELEASE);
                                released.push(slot);
                            } else {
                                ops.push(slot);
                            }
                        }
                        // Reusable by later allocations only: the event still reads them.
                        free.append(&mut released);
                    }
                }
            }
            Walk {
                alloc,
                ops,
                n_slots,
            }
        })
    }

    /// Number of slots the timing walk's buffers take ([`Walker`]).
    pub(crate) fn n_slots(&self) -> u32 {
        self.walk().n_slots
    }

    /// The program as the timing walk reads it: buffers renamed to slots.
    pub(crate) fn walker(&self) -> Walker<'_> {
        Walker {
            body: &self.body,
            walk: self.walk(),
        }
    }

    /// For each buffer, the index of the last event that touches it (its allocation if nothing
    /// does): when its SRAM can be reused. Computed once per recorded body.
    pub fn last_uses(&self) -> &[u32] {
        self.body.last_uses.get_or_init(|| {
            let mut last = vec![0u32; self.body.n_bufs as usize];
            for (i, (_, ev)) in self.views().enumerate() {
                match ev {
                    EventView::Alloc { buf, .. } => last[buf as usize] = i as u32,
                    EventView::Exec { reads, write, .. } => {
                        for b in reads.iter().chain(write.iter()) {
                            last[*b as usize] = i as u32;
                        }
                    }
                }
            }
            last
        })
    }

    /// For each buffer, whether it is a matrix accumulator: a matrix instruction accumulates
    /// into it, or it is updated in place into one (see [`SLOT_IN_PLACE`]). On devices whose
    /// accumulators live apart from the scratchpad (registers, see
    /// [`crate::preset::Accumulators`]) such tiles count against that capacity instead.
    pub fn accumulators(&self) -> Vec<bool> {
        self.walk()
            .alloc
            .iter()
            .map(|a| a & SLOT_ACC != 0)
            .collect()
    }
}

/// A program's events as the timing walk reads them ([`ProgramTrace::walker`]).
#[derive(Clone, Copy)]
pub(crate) struct Walker<'a> {
    body: &'a Body,
    walk: &'a Walk,
}

impl<'a> Walker<'a> {
    /// The event at `c` with its buffers as slots, and the cursor after it (`None` at the end):
    /// what [`ProgramTrace::view_at`] gives, for the timing walk.
    #[inline]
    pub(crate) fn at(&self, c: &Cursor) -> Option<(u32, WalkView<'a>, Cursor)> {
        let (body, walk) = (self.body, self.walk);
        let &i = body.stream.get(c.pos)?;
        let mut next = Cursor {
            pos: c.pos + 1,
            ..*c
        };
        let view = match &body.shapes[i as usize] {
            Event::Alloc { bytes, line, .. } => {
                next.next_buf += 1;
                WalkView::Alloc {
                    slot: walk.alloc[c.next_buf as usize],
                    bytes: *bytes,
                    line: *line,
                }
            }
            Event::Exec(ins) => {
                let n = ins.n_reads as usize;
                let reads = &walk.ops[c.next_id..c.next_id + n];
                next.next_id += n;
                let write = ins.write.map(|_| {
                    next.next_id += 1;
                    walk.ops[next.next_id - 1]
                });
                WalkView::Exec { ins, reads, write }
            }
        };
        Some((i, view, next))
    }
}

/// Records one program's events into a [`ProgramTrace`]: in full, or following a reference
/// program (see the module docs).
#[derive(Debug)]
pub struct Recorder {
    state: State,
    /// Bytes and window of every load so far.
    loads: Vec<(u64, Region)>,
}

#[derive(Debug)]
enum State {
    /// Boxed: a follower, the common case, stays small.
    Full(Box<Full>),
    Follow(Follow),
}

/// Full recording: the body being built and the shape lookup.
#[derive(Debug, Default)]
struct Full {
    body: Body,
    /// Shape → index, for shapes not found by the successor guess.
    index: HashMap<Key, u32, foldhash::fast::FixedState>,
    /// The shape that followed each shape last time (a loop body repeats, so this is usually right
    /// and saves hashing).
    next_of: Vec<u32>,
    /// The previous event's shape.
    prev: u32,
}

/// Following a reference: how far this program has matched it.
#[derive(Debug)]
struct Follow {
    reference: Arc<Body>,
    /// Other bodies to switch to on a mismatch ([`Follow::switch`]), or none.
    others: Option<Arc<[Arc<Body>]>>,
    /// Events matched.
    pos: usize,
    /// Buffer operands matched.
    id_pos: usize,
    /// Buffers allocated.
    n_bufs: u32,
    /// The key of the reference's event at `pos` ([`END`] past its end), looked up ahead so that
    /// matching the next event does not wait on two dependent loads.
    expect: Key,
}

/// What a follower expects past the end of its reference: no event packs to it (tag 0).
const END: Key = Key([0; 4]);

impl Follow {
    fn new(reference: Arc<Body>, others: Option<Arc<[Arc<Body>]>>) -> Follow {
        let mut f = Follow {
            reference,
            others,
            pos: 0,
            id_pos: 0,
            n_bufs: 0,
            expect: END,
        };
        f.advance_by(0, 0);
        f
    }

    /// Whether the reference's event at `pos` has these buffer operands.
    #[inline]
    fn same_operands(&self, reads: &[BufId], write: Option<BufId>) -> bool {
        operands_at(&self.reference, self.id_pos, reads, write)
    }

    /// After a mismatch at `pos`: switches to another body that issued what this program has
    /// issued so far and issues `key` with these operands next, and says whether it found one.
    #[cold]
    #[inline(never)]
    fn switch(&mut self, key: Key, reads: &[BufId], write: Option<BufId>) -> bool {
        let Some(others) = &self.others else {
            return false;
        };
        let cur = &*self.reference;
        let (pos, id_pos) = (self.pos, self.id_pos);
        let found = others.iter().find(|b| {
            !Arc::ptr_eq(b, &self.reference)
                && b.stream
                    .get(pos)
                    .is_some_and(|&s| b.keys[s as usize] == key)
                && operands_at(b, id_pos, reads, write)
                && b.ids.get(..id_pos) == cur.ids.get(..id_pos)
                && (0..pos)
                    .all(|j| b.keys[b.stream[j] as usize] == cur.keys[cur.stream[j] as usize])
        });
        match found {
            Some(b) => {
                self.reference = Arc::clone(b);
                self.advance_by(0, 0);
                true
            }
            None => false,
        }
    }

    /// Moves past a matched event with `n_ops` buffer operands.
    #[inline]
    fn advance(&mut self, n_ops: usize) {
        self.advance_by(1, n_ops);
    }

    #[inline]
    fn advance_by(&mut self, events: usize, n_ops: usize) {
        self.pos += events;
        self.id_pos += n_ops;
        let r = &*self.reference;
        self.expect = r.stream.get(self.pos).map_or(END, |&s| r.keys[s as usize]);
    }
}

/// Whether `body`'s instruction whose operands start at `id_pos` reads `reads` and writes `write`.
#[inline]
fn operands_at(body: &Body, id_pos: usize, reads: &[BufId], write: Option<BufId>) -> bool {
    let ids = &body.ids;
    let n = reads.len();
    let end = id_pos + n + write.is_some() as usize;
    end <= ids.len()
        && reads.iter().zip(&ids[id_pos..]).all(|(a, b)| a == b)
        && write.is_none_or(|w| ids[id_pos + n] == w)
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder::new()
    }
}

impl Recorder {
    /// Records a program in full.
    pub fn new() -> Recorder {
        Recorder {
            state: State::Full(Box::new(Full {
                prev: NONE,
                ..Full::default()
            })),
            loads: Vec::new(),
        }
    }

    /// Records a program expected to issue what `reference` issued, apart from load windows. The
    /// result is the same as [`Self::new`] would give; it is cheaper while the guess holds.
    pub fn following(reference: &ProgramTrace) -> Recorder {
        Recorder {
            state: State::Follow(Follow::new(Arc::clone(&reference.body), None)),
            // Sized once: a follower usually loads as often as its reference.
            loads: Vec::with_capacity(reference.body.n_loads),
        }
    }

    /// Records a program expected to issue what the main reference issued, or on a divergence
    /// what one of the others did (see [`References`]). The result is the same as [`Self::new`]
    /// would give.
    pub fn following_any(references: &References) -> Recorder {
        let main = &references.bodies[0];
        let others = (references.bodies.len() > 1).then(|| Arc::clone(&references.bodies));
        Recorder {
            state: State::Follow(Follow::new(Arc::clone(main), others)),
            loads: Vec::with_capacity(main.n_loads),
        }
    }

    /// Whether this recorder is still following its reference (it has issued nothing else).
    pub fn is_following(&self) -> bool {
        matches!(self.state, State::Follow(_))
    }

    /// Records that a tile of `bytes` comes into existence at `line`; returns its buffer id.
    #[inline(always)]
    pub fn alloc(&mut self, bytes: u64, line: u32) -> BufId {
        let key = Key::alloc(bytes, line);
        if let State::Follow(f) = &mut self.state {
            if f.expect == key || f.switch(key, &[], None) {
                // Same allocations so far, so the same ids.
                f.advance(0);
                f.n_bufs += 1;
                return f.n_bufs - 1;
            }
        }
        self.alloc_full(key, bytes, line)
    }

    /// [`Self::alloc`] past the follower's fast path: out of line, so that the fast path inlines
    /// into every intrinsic without the full recorder's code around it.
    #[inline(never)]
    fn alloc_full(&mut self, key: Key, bytes: u64, line: u32) -> BufId {
        let full = self.state.full();
        let buf = full.body.n_bufs;
        full.record(key, || Event::Alloc {
            buf: 0,
            bytes,
            line,
        });
        full.body.n_bufs += 1;
        buf
    }

    /// Records an issued instruction.
    ///
    /// # Panics
    /// If it names a buffer that [`Self::alloc`] did not return (a front-end bug).
    #[inline(always)]
    pub fn exec(&mut self, ins: &Instr) {
        let key = Key::exec(ins);
        let reads = ins.reads();
        if let State::Follow(f) = &mut self.state {
            if (f.expect == key && f.same_operands(reads, ins.write))
                || f.switch(key, reads, ins.write)
            {
                f.advance(reads.len() + ins.write.is_some() as usize);
                if let Op::Load { bytes, region } = &ins.op {
                    self.loads.push((*bytes, *region));
                }
                return;
            }
        }
        self.exec_full(key, ins);
    }

    /// [`Self::exec`] past the follower's fast path (out of line, as [`Self::alloc_full`]).
    #[inline(never)]
    fn exec_full(&mut self, key: Key, ins: &Instr) {
        let reads = ins.reads();
        let full = self.state.full();
        let n_bufs = full.body.n_bufs;
        assert!(
            reads.iter().chain(ins.write.iter()).all(|b| *b < n_bufs),
            "front end recorded a use of a buffer it never allocated"
        );
        full.body.ids.extend_from_slice(reads);
        full.body.ids.extend(ins.write);
        match &ins.op {
            Op::Load { bytes, region } => {
                full.body.n_loads += 1;
                self.loads.push((*bytes, *region));
            }
            Op::Store { bytes } => full.body.store_bytes += *bytes,
            _ => {}
        }
        full.record(key, || {
            let mut shape = ins.clone();
            shape.reads = [0; 4];
            shape.write = shape.write.map(|_| 0);
            if let Op::Load { region, .. } = &mut shape.op {
                *region = NO_REGION;
            }
            Event::Exec(shape)
        });
    }

    /// The finished trace.
    pub fn finish(mut self) -> ProgramTrace {
        if let State::Follow(f) = &self.state {
            if f.pos == f.reference.stream.len() {
                return ProgramTrace {
                    body: Arc::clone(&f.reference),
                    loads: self.loads,
                };
            }
        }
        // A follower that stopped early diverged at its end.
        let full = std::mem::take(self.state.full());
        ProgramTrace {
            body: Arc::new(full.body),
            loads: self.loads,
        }
    }
}

impl State {
    /// The full recorder, first turning a follower into one: it takes the reference's events up
    /// to where it diverged (the ones it matched) and goes on from there.
    #[inline]
    fn full(&mut self) -> &mut Full {
        if let State::Follow(f) = self {
            *self = State::Full(Box::new(Full::diverged(f)));
        }
        match self {
            State::Full(full) => full,
            State::Follow(_) => unreachable!("just converted"),
        }
    }
}

impl Full {
    /// A full recorder holding what `f` matched of its reference.
    fn diverged(f: &Follow) -> Full {
        let r = &*f.reference;
        let stream = r.stream[..f.pos].to_vec();
        let mut store_bytes = 0;
        let mut n_loads = 0;
        for &s in &stream {
            match &r.shapes[s as usize] {
                Event::Exec(Instr {
                    op: Op::Store { bytes },
                    ..
                }) => store_bytes += bytes,
                Event::Exec(Instr {
                    op: Op::Load { .. },
                    ..
                }) => n_loads += 1,
                _ => {}
            }
        }
        let index = r
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| (*k, i as u32))
            .collect();
        Full {
            prev: stream.last().copied().unwrap_or(NONE),
            body: Body {
                shapes: r.shapes.clone(),
                keys: r.keys.clone(),
                stream,
                ids: r.ids[..f.id_pos].to_vec(),
                n_bufs: f.n_bufs,
                store_bytes,
                n_loads,
                last_uses: OnceLock::new(),
                walk: OnceLock::new(),
            },
            index,
            next_of: vec![NONE; r.keys.len()],
        }
    }

    /// Appends a shape to the stream, finding its index or adding it (built by `shape`).
    #[inline]
    fn record(&mut self, key: Key, shape: impl FnOnce() -> Event) {
        let body = &mut self.body;
        let guess = match self.prev {
            NONE => NONE,
            p => self.next_of[p as usize],
        };
        let idx = if guess != NONE && body.keys[guess as usize] == key {
            guess
        } else {
            let idx = match self.index.get(&key) {
                Some(i) => *i,
                None => {
                    let i = body.shapes.len() as u32;
                    self.index.insert(key, i);
                    body.keys.push(key);
                    body.shapes.push(shape());
                    self.next_of.push(NONE);
                    i
                }
            };
            if self.prev != NONE {
                self.next_of[self.prev as usize] = idx;
            }
            idx
        };
        body.stream.push(idx);
        self.prev = idx;
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

    /// A loop of `iters` bodies, each loading a window and updating a carried accumulator; the
    /// last iteration loads a short (ragged) window.
    fn looped(rec: &mut Recorder, tensor: u64, iters: u64) -> Vec<Event> {
        let mut want = Vec::new();
        let alloc = |r: &mut Recorder, want: &mut Vec<Event>, bytes: u64, line: u32| {
            let buf = r.alloc(bytes, line);
            want.push(Event::Alloc { buf, bytes, line });
            buf
        };
        let mut acc = alloc(rec, &mut want, 64, 1);
        // Built before the loop and read in every iteration (like an identity matrix).
        let inv = alloc(rec, &mut want, 64, 1);
        for i in 0..iters {
            let x = alloc(rec, &mut want, 64, 2);
            let ins = load(tensor, i * 16, 64 - (i == iters - 1) as u64 * 32, x);
            let ins = if i % 3 == 0 { ins.blocking() } else { ins };
            rec.exec(&ins);
            want.push(Event::Exec(ins));
            let y = alloc(rec, &mut want, 64, 3);
            let op = Op::Vector {
                elems: 16,
                dtype: DType::F32,
                class: VectorClass::Simple,
                useful: 16,
            };
            let ins = Instr::new(op, 3, &[x, acc, inv], Some(y));
            rec.exec(&ins);
            want.push(Event::Exec(ins));
            acc = y;
        }
        let ins = Instr::new(Op::Store { bytes: 64 }, 9, &[acc], None);
        rec.exec(&ins);
        want.push(Event::Exec(ins));
        want
    }

    fn record(
        tensor: u64,
        iters: u64,
        reference: Option<&ProgramTrace>,
    ) -> (ProgramTrace, Vec<Event>) {
        let mut rec = reference.map_or_else(Recorder::new, Recorder::following);
        let want = looped(&mut rec, tensor, iters);
        (rec.finish(), want)
    }

    #[test]
    fn decoding_gives_back_every_recorded_event() {
        let (t, want) = record(5, 50, None);
        assert_eq!(t.events().collect::<Vec<_>>(), want);
        assert_eq!(t.len(), want.len());
        assert_eq!(t.n_bufs(), 102);
        assert_eq!(t.loads().len(), 50);
        assert_eq!(t.store_bytes(), 64);
        // The loop body repeats: a handful of shapes serve 50 iterations.
        assert!(t.n_shapes() <= 8, "{} shapes", t.n_shapes());
        // The timing model's view is the same events, and liveness is each buffer's last touch.
        let mut last = vec![0u32; t.n_bufs() as usize];
        for (i, ((si, ev), (vi, view))) in t.indexed_events().zip(t.views()).enumerate() {
            assert_eq!(si, vi);
            match (ev, view) {
                (
                    Event::Alloc { buf, bytes, line },
                    EventView::Alloc {
                        buf: b,
                        bytes: n,
                        line: l,
                    },
                ) => {
                    assert_eq!((buf, bytes, line), (b, n, l));
                    last[buf as usize] = i as u32;
                }
                (
                    Event::Exec(ins),
                    EventView::Exec {
                        ins: shape,
                        reads,
                        write,
                    },
                ) => {
                    assert_eq!((ins.reads(), ins.write), (reads, write));
                    let what = |i: &Instr| (i.line, i.blocking, i.op.mnemonic(), i.op.flop());
                    assert_eq!(what(&ins), what(shape));
                    for b in reads.iter().chain(write.iter()) {
                        last[*b as usize] = i as u32;
                    }
                }
                (e, v) => panic!("event {i}: {e:?} decoded as {v:?}"),
            }
        }
        assert_eq!(t.last_uses(), &last[..]);
    }

    #[test]
    fn the_walk_renames_buffers_to_reused_slots() {
        let (t, _) = record(5, 50, None);
        let last = t.last_uses().to_vec();
        let walker = t.walker();
        let mut c = Cursor::default();
        // Slot of each live buffer, replayed from the views: the walk must agree with them.
        let mut slot_of = vec![u32::MAX; t.n_bufs() as usize];
        let mut live = vec![None; t.n_slots() as usize];
        for (i, (si, view)) in t.views().enumerate() {
            let (wi, walk, next) = walker.at(&c).expect("as many events");
            assert_eq!(si, wi);
            let (bufs, slots): (Vec<BufId>, Vec<u32>) = match (view, walk) {
                (EventView::Alloc { buf, .. }, WalkView::Alloc { slot, .. }) => {
                    let s = (slot & SLOT_MASK) as usize;
                    assert_eq!(live[s], None, "slot {s} reused while live");
                    live[s] = Some(buf);
                    slot_of[buf as usize] = s as u32;
                    (vec![buf], vec![slot])
                }
                (
                    EventView::Exec { reads, write, .. },
                    WalkView::Exec {
                        reads: r, write: w, ..
                    },
                ) => (
                    reads.iter().chain(write.iter()).copied().collect(),
                    r.iter().chain(w.iter()).copied().collect(),
                ),
                (v, w) => panic!("event {i}: {v:?} walked as {w:?}"),
            };
            for (k, (b, s)) in bufs.iter().zip(&slots).enumerate() {
                assert_eq!(s & SLOT_MASK, slot_of[*b as usize]);
                let first = !bufs[..k].contains(b);
                assert_eq!(
                    s & SLOT_RELEASE != 0,
                    first && last[*b as usize] == i as u32
                );
            }
            for s in &slots {
                if s & SLOT_RELEASE != 0 {
                    live[(s & SLOT_MASK) as usize] = None;
                }
            }
            c = next;
        }
        assert!(walker.at(&c).is_none());
        // A carried accumulator and one input live across iterations: a handful of slots.
        assert!(t.n_slots() <= 6, "{} slots", t.n_slots());
    }

    #[test]
    fn programs_differing_only_in_windows_have_the_same_shapes() {
        let (a, _) = record(1, 20, None);
        let (b, _) = record(2, 20, None);
        let (c, _) = record(1, 21, None);
        assert!(a.same_shapes(&b));
        assert!(!a.shares_body(&b));
        assert_ne!(a, b);
        assert!(!a.same_shapes(&c));
    }

    #[test]
    fn a_follower_that_matches_shares_the_reference_body() {
        let (a, _) = record(1, 20, None);
        let (b, want) = record(2, 20, Some(&a));
        assert!(b.shares_body(&a));
        assert_eq!(b.events().collect::<Vec<_>>(), want);
        assert_eq!(b, record(2, 20, None).0);
    }

    #[test]
    fn a_follower_that_diverges_records_the_same_as_a_full_recording() {
        let (a, _) = record(1, 20, None);
        // Diverges in the middle (the ragged load comes early), runs past the end, stops early.
        for iters in [7, 25, 1] {
            let (b, want) = record(2, iters, Some(&a));
            assert!(!b.shares_body(&a));
            assert_eq!(b.events().collect::<Vec<_>>(), want, "{iters} iterations");
            let full = record(2, iters, None).0;
            assert_eq!(b.loads(), full.loads());
            assert_eq!(
                (b.len(), b.n_bufs(), b.store_bytes()),
                (full.len(), full.n_bufs(), full.store_bytes())
            );
        }
        // A follower that diverges in a buffer operand, not a shape.
        let mut rec = Recorder::following(&a);
        let x = rec.alloc(64, 1);
        let y = rec.alloc(64, 1);
        let z = rec.alloc(64, 2);
        rec.exec(&load(1, 0, 64, y));
        assert!(!rec.is_following());
        let t = rec.finish();
        assert_eq!((t.len(), t.n_bufs()), (4, 3));
        assert_eq!(t.events().last(), Some(Event::Exec(load(1, 0, 64, y))));
        let _ = (x, z);
    }

    #[test]
    fn a_diverging_follower_switches_to_another_reference_that_matches() {
        let (main, _) = record(1, 20, None);
        let (tail, _) = record(1, 7, Some(&main));
        assert!(!tail.shares_body(&main));
        let refs = References::new(&main, [&tail.shapes_handle()]);
        for (iters, shares_tail) in [(20, false), (7, true), (9, false)] {
            let mut rec = Recorder::following_any(&refs);
            let want = looped(&mut rec, 3, iters);
            let t = rec.finish();
            // The same trace as a full recording, sharing whichever body it matched to the end.
            assert_eq!(t.events().collect::<Vec<_>>(), want, "{iters} iterations");
            assert_eq!(t, record(3, iters, None).0, "{iters} iterations");
            assert_eq!(t.shares_body(&tail), shares_tail, "{iters} iterations");
            assert_eq!(refs.holds(&t), iters != 9, "{iters} iterations");
        }
    }

    #[test]
    fn bodies_with_the_same_events_are_equal_however_their_shapes_are_numbered() {
        // Recorded in full, the 7-iteration program numbers its shapes as it meets them; as a
        // follower of a 20-iteration program it diverged from, it numbers them as that one did.
        let (main, _) = record(1, 20, None);
        let (full, _) = record(2, 7, None);
        let (diverged, _) = record(2, 7, Some(&main));
        assert!(full.same_shapes(&diverged));
        assert_eq!(full, diverged);
        assert!(!full.same_shapes(&main));
    }
}
