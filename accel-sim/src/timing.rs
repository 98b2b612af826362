//! Timing semantics of one program on one core (or on several cores that run the same program in
//! lockstep): in-order engine queues, data dependencies, SRAM buffer reuse, and the issue stream.
//!
//! Model, in brief:
//! - Each engine (DMA-in, DMA-out, matrix, vector) executes its instructions in issue order.
//! - An instruction starts when its engine is free, its inputs are written (read-after-write), and
//!   the buffer it writes is no longer being read (write-after-read).
//! - A tile occupies an SRAM region from its creation to its last use (liveness, as a compiler's
//!   buffer assignment would see it). A new tile takes a freed region of the same size if there is
//!   one, and then must wait until the region's previous occupant is no longer in use. This is why a
//!   kernel that loads the next tile only after the current one is consumed serialises DMA and
//!   compute, while one that prefetches into a second buffer overlaps them. A tile of a size with no
//!   free region gets a new one only when enough SRAM is free at that time: freed regions of other
//!   sizes are taken back, and the tile waits until their occupants are done. Reserved SRAM never
//!   exceeds the capacity at any instant.
//! - The issue stream advances one cycle per instruction; a blocking instruction (a synchronous
//!   `load`) stalls it until completion.
//! - A DMA transfer's duration is not the program's to decide: its bytes flow through the shared
//!   [`crate::memory::Fluid`] with every other transfer in flight on the device. So a program is
//!   walked *resumably* ([`CoreRun::advance`]): instructions whose inputs are known are timed at
//!   once (their start may lie ahead of the launch's clock), a transfer is handed to the launch
//!   with its arrival time, and the walk stops at the first instruction that needs the end of a
//!   transfer still in flight. The launch ([`crate::schedule`]) resumes it when that transfer
//!   completes. Times that wait on a transfer are kept symbolically ([`Lazy`]) until it does.
//!   A transfer too small to be slowed by sharing (a 4-byte scale: it moves within one cycle at
//!   the lowest share any transfer gets, [`DevicePreset::one_cycle_transfer_bytes`]) ends one
//!   cycle after it arrives, as the fluid would end it; it is booked at once, without a round
//!   trip through the launch (about a quarter of a long FP8 prefill's transfers).

use crate::error::SimError;
use crate::isa::{mma_cycles, vector_cycles, Engine, Op, VectorClass};
use crate::memory::{Class, Level};
use crate::preset::DevicePreset;
use crate::program::{
    Cursor, Event, ProgramTrace, WalkView, SLOT_ACC, SLOT_IN_PLACE, SLOT_MASK, SLOT_RELEASE,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Cycles and counts attributed to one kernel source line.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LineStat {
    /// Busy cycles per engine ([`Engine::index`]).
    pub busy: [u64; 4],
    /// Cycles the issue stream stalled waiting on this line's blocking instructions.
    pub stall: u64,
    /// Instructions issued.
    pub count: u64,
}

impl LineStat {
    /// Adds another line's numbers into this one.
    pub fn merge(&mut self, o: &LineStat) {
        for e in 0..4 {
            self.busy[e] += o.busy[e];
        }
        self.stall += o.stall;
        self.count += o.count;
    }
}

/// One executed instruction on the timeline (for traces).
#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    /// Engine that ran it.
    pub engine: Engine,
    /// Start cycle, relative to the program start.
    pub start: u64,
    /// End cycle, relative to the program start.
    pub end: u64,
    /// Mnemonic.
    pub name: &'static str,
    /// Kernel source line.
    pub line: u32,
}

/// The timing of one program (times are absolute cycles of the launch).
#[derive(Debug, Clone, Default)]
pub struct ProgramTiming {
    /// Cycle the last engine went idle.
    pub cycles: u64,
    /// Cycle the core could take its next program: everything but the tail of posted stores
    /// (the DMA-out queue drains while the next program starts).
    pub occupancy: u64,
    /// Cycle the DMA-out queue drained its last store (≥ `occupancy` when stores drain).
    pub dma_out_end: u64,
    /// Busy cycles per engine.
    pub busy: [u64; 4],
    /// DMA-in busy cycles during which neither the matrix nor the vector unit was busy.
    pub exposed_dma: u64,
    /// Per-line statistics.
    pub lines: BTreeMap<u32, LineStat>,
    /// Peak live SRAM bytes.
    pub sram_peak: u64,
    /// Peak SRAM reserved by regions (live tiles, and freed regions whose last occupant may still
    /// be in use): the occupancy at any instant is at most this.
    pub sram_reserved_peak: u64,
    /// Bytes read from HBM.
    pub hbm_read: u64,
    /// Bytes written to HBM.
    pub hbm_write: u64,
    /// Bytes read from L2 (hits).
    pub l2_read: u64,
    /// Matrix-unit FLOP issued (padding of ragged tiles included).
    pub matrix_flop: u64,
    /// The problem's useful FLOP: matrix FLOP over valid extents plus vector ops that compute.
    pub useful_flop: u64,
    /// Vector-unit element operations.
    pub vector_ops: u64,
    /// Matrix cycles at peak rate with no fragment padding or overhead (for the roofline).
    pub matrix_ideal: f64,
    /// Vector cycles at peak lanes with no overhead (for the roofline).
    pub vector_ideal: f64,
    /// Dtypes the matrix unit ran, with their FLOP.
    pub matrix_dtypes: BTreeMap<&'static str, u64>,
    /// Timeline, when requested.
    pub intervals: Vec<Interval>,
}

/// Id of a DMA transfer within a launch (index into [`Transfers`]).
pub type TransferId = u32;

/// `busy_end` of a transfer still in flight.
const PENDING: u64 = u64::MAX;

/// A DMA transfer handed to the launch: it joins the fluid at `arrival`.
#[derive(Debug, Clone, Copy)]
pub struct TransferReq {
    /// Its id.
    pub id: TransferId,
    /// Cycle its bytes start to flow (after the DMA's fixed overhead).
    pub arrival: u64,
    /// What it crosses.
    pub class: Class,
    /// Bytes to move.
    pub bytes: u64,
    /// Cores moving it in lockstep.
    pub mult: u64,
}

/// The transfers of a launch: when each one's bytes finished (`busy_end`, the DMA engine frees)
/// and when its data is usable (`end`, after the level's latency), or [`PENDING`].
#[derive(Debug, Default, Clone)]
pub struct Transfers {
    /// (busy_end, end, latency) per transfer id from `base` on.
    ends: IdVec<(u64, u64, u64)>,
    /// Requests made since the launch last drained them.
    pub requests: Vec<TransferReq>,
}

/// Items with dense ids in creation order, from `base` on: a launch drops the prefix nothing
/// refers to any more ([`IdVec::forget_before`]), so a copy of a long launch stays small.
#[derive(Debug, Clone)]
pub(crate) struct IdVec<T> {
    base: u64,
    items: Vec<T>,
}

impl<T> Default for IdVec<T> {
    fn default() -> Self {
        IdVec {
            base: 0,
            items: Vec::new(),
        }
    }
}

impl<T> IdVec<T> {
    /// The id the next item gets.
    pub fn next_id(&self) -> u64 {
        self.base + self.items.len() as u64
    }

    /// Appends an item; returns its id.
    pub fn push(&mut self, item: T) -> u64 {
        self.items.push(item);
        self.next_id() - 1
    }

    /// Drops the items with ids below `id` (ids at or above stay addressable).
    pub fn forget_before(&mut self, id: u64) {
        let n = (id.saturating_sub(self.base) as usize).min(self.items.len());
        self.items.drain(..n);
        self.base += n as u64;
    }
}

impl<T> std::ops::Index<u64> for IdVec<T> {
    type Output = T;
    fn index(&self, id: u64) -> &T {
        &self.items[(id - self.base) as usize]
    }
}

impl<T> std::ops::IndexMut<u64> for IdVec<T> {
    fn index_mut(&mut self, id: u64) -> &mut T {
        &mut self.items[(id - self.base) as usize]
    }
}

impl Transfers {
    /// A new pending transfer; the launch learns of it through `requests`.
    fn submit(
        &mut self,
        arrival: u64,
        class: Class,
        bytes: u64,
        latency: u64,
        mult: u64,
    ) -> TransferId {
        let id = TransferId::try_from(self.ends.push((PENDING, PENDING, latency)))
            .expect("fewer than 2^32 transfers per launch");
        self.requests.push(TransferReq {
            id,
            arrival,
            class,
            bytes,
            mult,
        });
        id
    }

    /// Records that transfer `id`'s bytes finished at `busy_end`; returns its `end`.
    pub fn complete(&mut self, id: TransferId, busy_end: u64) -> u64 {
        let e = &mut self.ends[id as u64];
        e.0 = busy_end;
        e.1 = busy_end + e.2;
        e.1
    }

    /// (busy_end, end) of `id`, `None` while in flight.
    pub fn get(&self, id: TransferId) -> Option<(u64, u64)> {
        let (b, e, _) = self.ends[id as u64];
        (b != PENDING).then_some((b, e))
    }

    /// The id the next transfer gets.
    pub fn next_id(&self) -> TransferId {
        self.ends.next_id() as TransferId
    }

    /// Forgets the transfers before `id` (nothing may ask about them again).
    pub fn forget_before(&mut self, id: TransferId) {
        self.ends.forget_before(id as u64);
    }
}

/// A time that may still wait on a transfer in flight: `max(at, end of wait[q])` for the DMA
/// queues `q` (0 in, 1 out) where `wait[q]` is 1 + a transfer id. A queue has at most one transfer
/// in flight whose end is unknown (the next one cannot start before it completes), so two slots
/// express any time a program computes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lazy {
    at: u64,
    wait: [u32; 2],
}

impl Lazy {
    fn known(at: u64) -> Lazy {
        Lazy { at, wait: [0, 0] }
    }

    fn after(q: usize, id: TransferId, at: u64) -> Lazy {
        let mut l = Lazy::known(at);
        l.wait[q] = id + 1;
        l
    }

    /// A lower bound known now (orders free regions).
    fn bound(&self) -> u64 {
        self.at
    }

    /// The value, or the transfer it still waits on.
    fn resolve(&mut self, tr: &Transfers) -> Result<u64, TransferId> {
        for q in 0..2 {
            let w = self.wait[q];
            if w != 0 {
                match tr.get(w - 1) {
                    Some((_, e)) => {
                        self.at = self.at.max(e);
                        self.wait[q] = 0;
                    }
                    None => return Err(w - 1),
                }
            }
        }
        Ok(self.at)
    }

    /// `max(self, o)`.
    fn max(self, o: Lazy, tr: &Transfers) -> Lazy {
        let mut r = Lazy::known(self.at.max(o.at));
        for q in 0..2 {
            let (a, b) = (self.wait[q], o.wait[q]);
            r.wait[q] = match (a, b) {
                (0, x) | (x, 0) => x,
                (a, b) if a == b => a,
                (a, b) => {
                    // Two transfers of one queue: the older one has completed (see the type docs).
                    let (old, new) = (a.min(b), a.max(b));
                    if let Some((_, e)) = tr.get(old - 1) {
                        r.at = r.at.max(e);
                    }
                    new
                }
            };
        }
        r
    }
}

/// The region of an accumulator tile on a device whose accumulators live apart from the
/// scratchpad (Hopper's register file, [`crate::preset::Accumulators`]): it takes no SRAM region
/// and counts against the accumulator capacity instead.
const ACC_REGION: usize = usize::MAX;

#[derive(Clone)]
struct BufState {
    bytes: u64,
    region: usize,
    ready: Lazy,
    last_access: Lazy,
}

#[derive(Clone)]
struct RegionState {
    /// When its last occupant is done with it.
    free_at: Lazy,
    /// Its size (0 once taken back for a region of another size).
    bytes: u64,
}

/// SRAM regions not in use, by size: a new tile takes the one of its size freed earliest (ties:
/// the lowest region), as a compiler's buffer assignment would reuse them.
#[derive(Default, Clone)]
struct FreeRegions {
    /// (bytes, free regions of that size).
    by_size: Vec<(u64, Vec<usize>)>,
}

impl FreeRegions {
    /// Takes the region of `bytes` that frees first, if any.
    fn take(&mut self, bytes: u64, regions: &[RegionState]) -> Option<usize> {
        let list = &mut self.by_size.iter_mut().find(|(b, _)| *b == bytes)?.1;
        let (pos, _) = list
            .iter()
            .enumerate()
            .min_by_key(|(_, ri)| (regions[**ri].free_at.bound(), **ri))?;
        Some(list.swap_remove(pos))
    }

    /// Takes the free region of any size that frees first (ties: the lowest), to reclaim its SRAM.
    fn take_any(&mut self, regions: &[RegionState]) -> Option<usize> {
        let (li, pos, _) = self
            .by_size
            .iter()
            .enumerate()
            .flat_map(|(li, (_, l))| l.iter().enumerate().map(move |(pos, ri)| (li, pos, *ri)))
            .min_by_key(|(_, _, ri)| (regions[*ri].free_at.bound(), *ri))?;
        Some(self.by_size[li].1.swap_remove(pos))
    }

    /// Returns region `ri` of `bytes` to the pool.
    fn give(&mut self, bytes: u64, ri: usize) {
        match self.by_size.iter_mut().find(|(b, _)| *b == bytes) {
            Some((_, list)) => list.push(ri),
            None => self.by_size.push((bytes, vec![ri])),
        }
    }
}

/// Intervals with non-decreasing starts, merged into their union as they arrive.
#[derive(Default, Clone)]
struct Union(Vec<(u64, u64)>);

impl Union {
    fn add(&mut self, s: u64, e: u64) {
        match self.0.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => self.0.push((s, e)),
        }
    }
}

/// Per-shape costs ([`ProgramTrace::indexed_events`]): an instruction's cost depends only on its
/// shape, so it is computed once per shape.
#[derive(Clone, Copy, Default)]
struct ShapeCost {
    /// (engine busy cycles, result latency) of a matrix or vector instruction.
    cost: Option<(u64, u64)>,
    /// Ideal vector cycles of one instance (vector instructions).
    vector_ideal: f64,
    /// Ideal matrix cycles of one instance (matrix instructions).
    matrix_ideal: f64,
}

/// Everything the timing pass needs to know about the launch besides the trace.
pub struct TimingContext<'a> {
    /// The device.
    pub preset: &'a DevicePreset,
    /// Kernel name (for errors).
    pub kernel: &'a str,
    /// Source text of a kernel line (for errors).
    pub line_code: &'a dyn Fn(u32) -> String,
    /// Whether to keep the timeline.
    pub record_intervals: bool,
    /// [`DevicePreset::one_cycle_transfer_bytes`], computed once per launch (not per resumption).
    pub one_cycle_bytes: u64,
}

/// A transfer of this program in flight on DMA queue `q`.
#[derive(Clone)]
struct InFlight {
    id: TransferId,
    start: u64,
    shape: u32,
    line: u32,
    name: &'static str,
    /// The issue stream's next slot when a blocking transfer stalled it (for stall statistics).
    stall_from: Option<u64>,
}

/// Where a walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// It needs the end of this transfer, still in flight.
    Blocked(TransferId),
    /// Every instruction is timed; the cores are free at `occupancy` (stores may still drain).
    Done {
        /// Cycle the cores can take their next programs.
        occupancy: u64,
    },
}

/// One program being timed on `mult` cores in lockstep, resumable (see the module docs).
#[derive(Clone)]
pub struct CoreRun {
    /// Shared, not copied (a copy would carry its load windows); `None` only while a walk or
    /// [`Self::finalize`] has moved it out to read it as it mutates the run.
    trace: Option<Arc<ProgramTrace>>,
    cursor: Cursor,
    /// Cycle the program started.
    pub start: u64,
    /// Cores running it in lockstep.
    pub mult: u64,
    levels: Vec<Level>,
    next_level: usize,
    /// Live buffers by slot ([`ProgramTrace::walker`]).
    bufs: Vec<Option<BufState>>,
    regions: Vec<RegionState>,
    free: FreeRegions,
    live: u64,
    reserved: u64,
    /// Live accumulator tiles held apart from the scratchpad (see [`ACC_REGION`]).
    live_acc: u64,
    engine_free: [u64; 4],
    in_flight: [Option<InFlight>; 2],
    /// A store of the cores' previous program still draining on DMA-out.
    inherited_out: Option<TransferId>,
    issue: Lazy,
    last_ready: Lazy,
    shape_cost: Vec<ShapeCost>,
    shape_stat: Vec<LineStat>,
    matrix_iv: Union,
    vector_iv: Union,
    dma_iv: Union,
    occupancy: Option<u64>,
    /// What the program cost (complete once [`Self::finished`]).
    pub t: ProgramTiming,
}

impl CoreRun {
    /// Starts `trace` at cycle `start` on `mult` cores whose loads are served by `levels`; the
    /// cores' DMA-out queue is free at `out_free`, or once `inherited_out` completes.
    pub fn new(
        trace: Arc<ProgramTrace>,
        levels: Vec<Level>,
        start: u64,
        mult: u64,
        out_free: u64,
        inherited_out: Option<TransferId>,
    ) -> CoreRun {
        let n = trace.n_slots() as usize;
        let shapes = trace.n_shapes();
        let mut engine_free = [start; 4];
        engine_free[Engine::DmaOut.index()] = out_free.max(start);
        CoreRun {
            cursor: Cursor::default(),
            start,
            mult,
            levels,
            next_level: 0,
            bufs: (0..n).map(|_| None).collect(),
            regions: Vec::new(),
            free: FreeRegions::default(),
            live: 0,
            reserved: 0,
            live_acc: 0,
            engine_free,
            in_flight: [None, None],
            inherited_out,
            issue: Lazy::known(start),
            last_ready: Lazy::known(start),
            shape_cost: vec![ShapeCost::default(); shapes],
            shape_stat: vec![LineStat::default(); shapes],
            matrix_iv: Union::default(),
            vector_iv: Union::default(),
            dma_iv: Union::default(),
            occupancy: None,
            t: ProgramTiming::default(),
            trace: Some(trace),
        }
    }

    /// The transfer in flight on DMA-out, if any (the next program on these cores waits for it).
    pub fn out_in_flight(&self) -> Option<TransferId> {
        self.in_flight[1]
            .as_ref()
            .map(|f| f.id)
            .or(self.inherited_out)
    }

    /// Whether `o` issues what this run's program issued (apart from load windows).
    pub fn same_program(&self, o: &ProgramTrace) -> bool {
        self.trace().same_shapes(o)
    }

    /// The program being timed.
    fn trace(&self) -> &ProgramTrace {
        self.trace.as_deref().expect("a run holds its trace")
    }

    /// Whether every instruction is timed (stores may still be in flight).
    pub fn walked(&self) -> bool {
        self.occupancy.is_some()
    }

    /// Whether everything is timed and no transfer of this program is in flight: `t` is final.
    pub fn finished(&self) -> bool {
        self.occupancy.is_some() && self.in_flight.iter().all(|f| f.is_none())
    }

    /// When the engine can start its next instruction, or the transfer it waits on.
    fn engine_ready(&mut self, e: Engine, tr: &Transfers) -> Result<u64, TransferId> {
        let q = match e {
            Engine::DmaIn => 0,
            Engine::DmaOut => 1,
            _ => return Ok(self.engine_free[e.index()]),
        };
        if let Some(f) = &self.in_flight[q] {
            return Err(f.id);
        }
        if q == 1 {
            if let Some(id) = self.inherited_out {
                let (busy_end, _) = tr.get(id).ok_or(id)?;
                let ef = &mut self.engine_free[e.index()];
                *ef = (*ef).max(busy_end);
                self.inherited_out = None;
            }
        }
        Ok(self.engine_free[e.index()])
    }

    /// Transfer `id` of this program completed: its engine frees, its statistics are booked.
    pub fn transfer_done(&mut self, id: TransferId, tr: &Transfers, record_intervals: bool) {
        let Some(q) = (0..2).find(|q| self.in_flight[*q].as_ref().is_some_and(|f| f.id == id))
        else {
            return;
        };
        let f = self.in_flight[q].take().expect("found above");
        let (busy_end, end) = tr.get(id).expect("completed");
        let e = if q == 0 {
            Engine::DmaIn
        } else {
            Engine::DmaOut
        };
        let dur = busy_end - f.start;
        self.engine_free[e.index()] = busy_end;
        self.t.busy[e.index()] += dur;
        let stat = &mut self.shape_stat[f.shape as usize];
        stat.busy[e.index()] += dur;
        if let Some(from) = f.stall_from {
            stat.stall += end.saturating_sub(from);
        }
        if q == 0 {
            self.dma_iv.add(f.start, end);
        } else {
            self.t.dma_out_end = self.t.dma_out_end.max(busy_end);
        }
        if record_intervals && dur > 0 {
            self.t.intervals.push(Interval {
                engine: e,
                start: f.start - self.start,
                end: busy_end - self.start,
                name: f.name,
                line: f.line,
            });
        }
        if self.finished() {
            self.finalize();
        }
    }

    /// Times instructions until one needs a transfer still in flight, or the program ends.
    /// New transfers are appended to `tr.requests`, arriving no earlier than `now`.
    pub fn advance(
        &mut self,
        cx: &TimingContext<'_>,
        tr: &mut Transfers,
        now: u64,
    ) -> Result<Step, SimError> {
        if let Some(occupancy) = self.occupancy {
            return Ok(Step::Done { occupancy });
        }
        // Moved out while the walk reads it and mutates the run (a clone cost two atomic
        // operations per resumption, 2.5% of a long prefill's host time).
        let trace = self.trace.take().expect("a run holds its trace");
        let step = self.walk(&trace, cx, tr, now);
        self.trace = Some(trace);
        if matches!(step, Ok(Step::Done { .. })) && self.finished() {
            self.finalize();
        }
        step
    }

    /// [`Self::advance`] over `trace` (the run's own, moved out).
    fn walk(
        &mut self,
        trace: &ProgramTrace,
        cx: &TimingContext<'_>,
        tr: &mut Transfers,
        now: u64,
    ) -> Result<Step, SimError> {
        let p = cx.preset;
        let cap = p.sram.bytes_per_core;
        let walker = trace.walker();
        let acc_cap = p.accumulators.as_ref().map(|a| a.bytes_per_core);
        let one_cycle_bytes = cx.one_cycle_bytes;
        // Accumulators live apart only on devices that say so.
        let acc_mask = if acc_cap.is_some() { SLOT_ACC } else { 0 };
        while let Some((si, ev, next)) = walker.at(&self.cursor) {
            match ev {
                WalkView::Alloc { slot, bytes, line } if slot & acc_mask != 0 => {
                    let limit = acc_cap.unwrap_or(cap);
                    self.live_acc += bytes;
                    // Updated in place from a tile the next event releases: the two never
                    // hold registers together.
                    let peak = if slot & SLOT_IN_PLACE != 0 {
                        self.live_acc - bytes
                    } else {
                        self.live_acc
                    };
                    if peak > limit {
                        return Err(SimError::SramOverflow {
                            kernel: cx.kernel.to_string(),
                            line,
                            code: (cx.line_code)(line),
                            needed: peak,
                            capacity: limit,
                        });
                    }
                    let ready = Lazy::known(self.start);
                    self.bufs[(slot & SLOT_MASK) as usize] = Some(BufState {
                        bytes,
                        region: ACC_REGION,
                        ready,
                        last_access: ready,
                    });
                }
                WalkView::Alloc { slot, bytes, line } => {
                    let (region, ready) = match self.free.take(bytes, &self.regions) {
                        Some(ri) => (ri, self.regions[ri].free_at),
                        None => {
                            // A new region: SRAM must be free for it now, so regions of other
                            // sizes are taken back (earliest free first) and the tile waits for
                            // their occupants.
                            let mut ready = Lazy::known(self.start);
                            while self.reserved + bytes > cap {
                                let Some(ri) = self.free.take_any(&self.regions) else {
                                    break;
                                };
                                let r = &mut self.regions[ri];
                                ready = ready.max(r.free_at, tr);
                                self.reserved -= r.bytes;
                                r.bytes = 0;
                            }
                            self.regions.push(RegionState {
                                free_at: ready,
                                bytes,
                            });
                            self.reserved += bytes;
                            (self.regions.len() - 1, ready)
                        }
                    };
                    self.live += bytes;
                    if self.live > cap || self.reserved > cap {
                        return Err(SimError::SramOverflow {
                            kernel: cx.kernel.to_string(),
                            line,
                            code: (cx.line_code)(line),
                            needed: self.live.max(self.reserved),
                            capacity: cap,
                        });
                    }
                    self.t.sram_peak = self.t.sram_peak.max(self.live);
                    self.t.sram_reserved_peak = self.t.sram_reserved_peak.max(self.reserved);
                    self.bufs[(slot & SLOT_MASK) as usize] = Some(BufState {
                        bytes,
                        region,
                        ready,
                        last_access: ready,
                    });
                }
                WalkView::Exec { ins, reads, write } => {
                    // Everything this instruction waits for, known or the transfer to wait on.
                    let mut deps = Lazy::known(0);
                    for b in reads {
                        deps = deps.max(buf(&self.bufs, *b).ready, tr);
                    }
                    if let Some(w) = write {
                        deps = deps.max(buf(&self.bufs, w).last_access, tr);
                    }
                    let deps = match deps.resolve(tr) {
                        Ok(d) => d,
                        Err(id) => return Ok(Step::Blocked(id)),
                    };
                    let issue = match self.issue.resolve(tr) {
                        Ok(v) => v,
                        Err(id) => return Ok(Step::Blocked(id)),
                    };
                    let engine = ins.op.engine();
                    let engine_at = match engine {
                        Some(e) => self.engine_ready(e, tr),
                        None => Engine::ALL
                            .iter()
                            .map(|e| self.engine_ready(*e, tr))
                            .try_fold(0, |a, r| r.map(|v| a.max(v))),
                    };
                    let engine_at = match engine_at {
                        Ok(v) => v,
                        Err(id) => return Ok(Step::Blocked(id)),
                    };
                    let start = issue.max(engine_at).max(deps);
                    let stat_i = si as usize;
                    self.shape_stat[stat_i].count += 1;
                    // The instruction's end: known, or when a transfer's data arrives.
                    let end: Lazy = match (&ins.op, engine) {
                        (Op::Load { bytes, .. }, Some(e)) | (Op::Store { bytes }, Some(e)) => {
                            let (class, latency, q) = match &ins.op {
                                Op::Load { .. } => {
                                    let level = self
                                        .levels
                                        .get(self.next_level)
                                        .copied()
                                        .unwrap_or(Level::Hbm);
                                    self.next_level += 1;
                                    match level {
                                        Level::L2 => {
                                            self.t.l2_read += bytes;
                                            (Class::L2Read, p.l2_latency_cycles(), 0)
                                        }
                                        Level::Hbm => {
                                            self.t.hbm_read += bytes;
                                            (Class::HbmRead, p.hbm_latency_cycles(), 0)
                                        }
                                    }
                                }
                                _ => {
                                    self.t.hbm_write += bytes;
                                    (Class::HbmWrite, 0, 1)
                                }
                            };
                            let ready_at = start + p.dma.overhead_cycles;
                            // Transfers whose end is known now: (DMA busy until, data usable).
                            let known = match *bytes {
                                // A window entirely outside the tensor moves nothing (masked
                                // prefetch past the end): the request's overhead only.
                                0 => Some((ready_at, ready_at)),
                                // Moves within its first cycle at any share of the bandwidth
                                // ([`DevicePreset::one_cycle_transfer_bytes`]): the shared memory
                                // system would end it one cycle after it arrives.
                                b if b <= one_cycle_bytes => {
                                    let busy_end = ready_at.max(now) + 1;
                                    Some((busy_end, busy_end + latency))
                                }
                                _ => None,
                            };
                            if let Some((busy_end, end)) = known {
                                self.known_exec(
                                    e,
                                    start,
                                    busy_end,
                                    cx,
                                    ins.op.mnemonic(),
                                    ins.line,
                                    stat_i,
                                );
                                if q == 0 {
                                    self.dma_iv.add(start, end);
                                }
                                Lazy::known(end)
                            } else {
                                let arrival = ready_at.max(now);
                                let id = tr.submit(arrival, class, *bytes, latency, self.mult);
                                self.in_flight[q] = Some(InFlight {
                                    id,
                                    start,
                                    shape: si,
                                    line: ins.line,
                                    name: ins.op.mnemonic(),
                                    stall_from: ins.blocking.then_some(issue + 1),
                                });
                                Lazy::after(q, id, arrival)
                            }
                        }
                        (Op::Barrier, _) | (_, None) => Lazy::known(start),
                        (op, Some(e)) => {
                            let (dur, latency) = self.compute_cost(cx, op, ins.line, stat_i)?;
                            let busy_end = start + dur;
                            self.known_exec(
                                e,
                                start,
                                busy_end,
                                cx,
                                op.mnemonic(),
                                ins.line,
                                stat_i,
                            );
                            match e {
                                Engine::Matrix => self.matrix_iv.add(start, busy_end),
                                Engine::Vector => self.vector_iv.add(start, busy_end),
                                _ => {}
                            }
                            Lazy::known(busy_end + latency)
                        }
                    };
                    let new_issue = if ins.blocking || engine.is_none() {
                        // A known end books the stall now (a transfer books it on completion).
                        if end.wait == [0, 0] {
                            self.shape_stat[stat_i].stall += end.at.saturating_sub(issue + 1);
                        }
                        end
                    } else {
                        Lazy::known(issue + 1)
                    };
                    self.issue = new_issue;
                    for b in reads {
                        let s = buf_mut(&mut self.bufs, *b);
                        s.last_access = s.last_access.max(end, tr);
                    }
                    if engine != Some(Engine::DmaOut) {
                        self.last_ready = self.last_ready.max(end, tr);
                    }
                    if let Some(w) = write {
                        let s = buf_mut(&mut self.bufs, w);
                        s.ready = end;
                        s.last_access = s.last_access.max(end, tr);
                    }
                }
            }
            // Release buffers whose last use was this event.
            let (new, reads, write) = match ev {
                WalkView::Alloc { slot, .. } => (Some(slot), &[][..], None),
                WalkView::Exec { reads, write, .. } => (None, reads, write),
            };
            for &b in new.iter().chain(reads).chain(write.iter()) {
                if b & SLOT_RELEASE != 0 {
                    let s = self.bufs[(b & SLOT_MASK) as usize]
                        .take()
                        .expect("a buffer is released once");
                    if s.region == ACC_REGION {
                        self.live_acc -= s.bytes;
                    } else {
                        self.regions[s.region].free_at = s.last_access;
                        self.free.give(s.bytes, s.region);
                        self.live -= s.bytes;
                    }
                }
            }
            self.cursor = next;
        }
        // The cores are free when everything but posted stores is done.
        let mut occ = self.issue.max(self.last_ready, tr);
        for e in [Engine::DmaIn, Engine::Matrix, Engine::Vector] {
            match self.engine_ready(e, tr) {
                Ok(v) => occ = occ.max(Lazy::known(v), tr),
                Err(id) => return Ok(Step::Blocked(id)),
            }
        }
        let occupancy = match occ.resolve(tr) {
            Ok(v) => v,
            Err(id) => return Ok(Step::Blocked(id)),
        };
        self.occupancy = Some(occupancy);
        self.t.occupancy = occupancy;
        // Stores already done (or none) end the DMA-out queue where it stands.
        if self.in_flight[1].is_none() {
            let out = self.engine_free[Engine::DmaOut.index()];
            self.t.dma_out_end = self.t.dma_out_end.max(out);
        }
        Ok(Step::Done { occupancy })
    }

    /// Books an instruction of known duration on engine `e`.
    #[allow(clippy::too_many_arguments)]
    fn known_exec(
        &mut self,
        e: Engine,
        start: u64,
        busy_end: u64,
        cx: &TimingContext<'_>,
        name: &'static str,
        line: u32,
        shape: usize,
    ) {
        let dur = busy_end - start;
        self.engine_free[e.index()] = busy_end;
        self.t.busy[e.index()] += dur;
        self.shape_stat[shape].busy[e.index()] += dur;
        if e == Engine::DmaOut {
            self.t.dma_out_end = self.t.dma_out_end.max(busy_end);
        }
        if cx.record_intervals && dur > 0 {
            self.t.intervals.push(Interval {
                engine: e,
                start: start - self.start,
                end: busy_end - self.start,
                name,
                line,
            });
        }
    }

    /// (busy cycles, latency) of a matrix or vector instruction, adding its work to `t`.
    fn compute_cost(
        &mut self,
        cx: &TimingContext<'_>,
        op: &Op,
        line: u32,
        shape: usize,
    ) -> Result<(u64, u64), SimError> {
        let p = cx.preset;
        let sc = &mut self.shape_cost[shape];
        let t = &mut self.t;
        Ok(match op {
            Op::Mma {
                m,
                n,
                k,
                dtype,
                useful,
            } => {
                let c = match sc.cost {
                    Some(c) => c,
                    None => {
                        let c = mma_cycles(p, *m, *n, *k, *dtype).map_err(|message| {
                            SimError::Kernel {
                                kernel: cx.kernel.to_string(),
                                line,
                                message,
                            }
                        })?;
                        // The roofline counts the useful work only.
                        sc.matrix_ideal =
                            *useful as f64 / p.matrix_flop_per_cycle(*dtype).unwrap_or(1.0);
                        sc.cost = Some((c, 0));
                        (c, 0)
                    }
                };
                t.matrix_flop += 2 * m * n * k;
                t.useful_flop += useful;
                t.matrix_ideal += sc.matrix_ideal;
                c
            }
            Op::Vector {
                elems,
                dtype,
                class,
                useful,
            } => {
                t.vector_ops += elems;
                t.useful_flop += useful;
                let c = match sc.cost {
                    Some(c) => c,
                    None => {
                        let lanes = crate::isa::vector_lanes(p, *dtype) as f64;
                        let factor = if *class == VectorClass::Transcendental {
                            p.vector.transcendental_factor as f64
                        } else {
                            1.0
                        };
                        sc.vector_ideal = *useful as f64 * factor / lanes;
                        let c = (vector_cycles(p, *elems, *dtype, *class), 0);
                        sc.cost = Some(c);
                        c
                    }
                };
                t.vector_ideal += sc.vector_ideal;
                c
            }
            _ => (0, 0),
        })
    }

    /// Folds per-shape statistics into per-line ones and computes the exposed DMA.
    fn finalize(&mut self) {
        let trace = self.trace.take().expect("a run holds its trace");
        for (si, ev) in trace.shapes().iter().enumerate() {
            if let Event::Exec(ins) = ev {
                let stat = &self.shape_stat[si];
                if stat.count == 0 {
                    continue;
                }
                self.t.lines.entry(ins.line).or_default().merge(stat);
                if let Op::Mma { m, n, k, dtype, .. } = &ins.op {
                    *self.t.matrix_dtypes.entry(dtype.name()).or_default() +=
                        2 * m * n * k * stat.count;
                }
            }
        }
        self.trace = Some(trace);
        self.t.dma_out_end = self.t.dma_out_end.max(self.start);
        self.t.cycles = self.t.occupancy.max(self.t.dma_out_end);
        let compute = merge_unions(&self.matrix_iv.0, &self.vector_iv.0);
        self.t.exposed_dma = exposed(&self.dma_iv.0, &compute);
        // Free what is no longer needed: the run may linger until the launch drops it.
        self.bufs = Vec::new();
        self.regions = Vec::new();
        self.shape_cost = Vec::new();
    }
}

/// The live buffer in slot `b` (flags ignored).
fn buf(bufs: &[Option<BufState>], b: u32) -> &BufState {
    bufs[(b & SLOT_MASK) as usize]
        .as_ref()
        .expect("front end recorded a use of a buffer after its last use")
}

/// The live buffer in slot `b` (flags ignored).
fn buf_mut(bufs: &mut [Option<BufState>], b: u32) -> &mut BufState {
    bufs[(b & SLOT_MASK) as usize]
        .as_mut()
        .expect("front end recorded a use of a buffer after its last use")
}

/// The union of two interval unions (each sorted and disjoint), sorted and disjoint.
fn merge_unions(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Union(Vec::with_capacity(a.len() + b.len()));
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        let take_a = j == b.len() || (i < a.len() && a[i] <= b[j]);
        let (s, e) = if take_a { a[i] } else { b[j] };
        if take_a {
            i += 1;
        } else {
            j += 1;
        }
        out.add(s, e);
    }
    out.0
}

/// Total length of `dma` not covered by `compute` (both sorted unions of disjoint intervals).
fn exposed(dma: &[(u64, u64)], compute: &[(u64, u64)]) -> u64 {
    let merged = compute;
    let dmerged = dma;
    let mut total = 0;
    let mut j = 0;
    for &(s, e) in dmerged {
        let mut cur = s;
        while j < merged.len() && merged[j].1 <= cur {
            j += 1;
        }
        let mut k = j;
        while cur < e {
            if k < merged.len() && merged[k].0 < e {
                let (cs, ce) = merged[k];
                if cs > cur {
                    total += cs - cur;
                }
                cur = cur.max(ce);
                k += 1;
            } else {
                total += e - cur;
                cur = e;
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_vec_keeps_ids_after_forgetting_its_prefix() {
        let mut v = IdVec::default();
        for i in 0..10u64 {
            assert_eq!(v.push(i * 10), i);
        }
        v.forget_before(4);
        assert_eq!((v[4], v[9]), (40, 90));
        v[5] += 1;
        assert_eq!(v[5], 51);
        assert_eq!(v.push(100), 10);
        v.forget_before(2); // already forgotten: nothing changes
        assert_eq!(v[4], 40);
        v.forget_before(99);
        assert_eq!(v.next_id(), 11);
        assert_eq!(v.push(7), 11);
        assert_eq!(v[11], 7);
    }

    #[test]
    fn exposed_counts_uncovered_dma() {
        let d = [(0, 10), (20, 30)];
        let c = merge_unions(&[(5, 8)], &[(6, 7), (25, 40)]);
        assert_eq!(c, vec![(5, 8), (25, 40)]);
        assert_eq!(exposed(&d, &c), 5 + 2 + 5);
        assert_eq!(exposed(&[(0, 10)], &[]), 10);
    }
}
