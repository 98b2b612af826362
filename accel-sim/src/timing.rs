//! Timing semantics of one program on one core: in-order engine queues, data dependencies, SRAM
//! buffer reuse, and the issue stream.
//!
//! Model, in brief:
//! - Each engine (DMA-in, DMA-out, matrix, vector) executes its instructions in issue order.
//! - An instruction starts when its engine is free, its inputs are written (read-after-write), and
//!   the buffer it writes is no longer being read (write-after-read).
//! - A tile occupies an SRAM region from its creation to its last use (liveness, as a compiler's
//!   buffer assignment would see it). A new tile takes a freed region of the same size if there is
//!   one, and then must wait until the region's previous occupant is no longer in use. This is why a
//!   kernel that loads the next tile only after the current one is consumed serialises DMA and
//!   compute, while one that prefetches into a second buffer overlaps them.
//! - The issue stream advances one cycle per instruction; a blocking instruction (a synchronous
//!   `load`) stalls it until completion.

use crate::error::SimError;
use crate::isa::{mma_cycles, vector_cycles, Engine, Op, VectorClass};
use crate::memory::{Level, ProgramRates};
use crate::preset::DevicePreset;
use crate::program::{Event, EventView, ProgramTrace};
use std::collections::BTreeMap;

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

/// The timing of one program.
#[derive(Debug, Clone, Default)]
pub struct ProgramTiming {
    /// Cycles from start to the last engine going idle.
    pub cycles: u64,
    /// Cycles until the core can take its next program: everything but the tail of posted stores
    /// (the DMA-out queue drains while the next program starts).
    pub occupancy: u64,
    /// End of the DMA-out queue, relative to the program start (≥ `occupancy` when stores drain).
    pub dma_out_end: u64,
    /// Busy cycles per engine.
    pub busy: [u64; 4],
    /// DMA-in busy cycles during which neither the matrix nor the vector unit was busy.
    pub exposed_dma: u64,
    /// Per-line statistics.
    pub lines: BTreeMap<u32, LineStat>,
    /// Peak live SRAM bytes.
    pub sram_peak: u64,
    /// Bytes read from HBM.
    pub hbm_read: u64,
    /// Bytes written to HBM.
    pub hbm_write: u64,
    /// Bytes read from L2 (hits).
    pub l2_read: u64,
    /// Matrix-unit FLOP.
    pub matrix_flop: u64,
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

struct BufState {
    bytes: u64,
    region: usize,
    ready: u64,
    last_access: u64,
    last_use: u32,
}

struct RegionState {
    free_at: u64,
}

/// SRAM regions not in use, by size: a new tile takes the one of its size freed earliest (ties:
/// the lowest region), as a compiler's buffer assignment would reuse them.
#[derive(Default)]
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
            .min_by_key(|(_, ri)| (regions[**ri].free_at, **ri))?;
        Some(list.swap_remove(pos))
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
#[derive(Default)]
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
/// shape (and, for loads, the level that serves it), so it is computed once per shape and level.
#[derive(Clone, Copy, Default)]
struct ShapeCost {
    /// (engine busy cycles, result latency) for level `[L2, HBM]` (only `[1]` for non-loads).
    cost: [Option<(u64, u64)>; 2],
    /// Ideal vector cycles of one instance (vector instructions).
    vector_ideal: f64,
    /// Ideal matrix cycles of one instance (matrix instructions).
    matrix_ideal: f64,
}

/// Everything the timing pass needs to know about the launch besides the trace.
pub struct TimingContext<'a> {
    /// The device.
    pub preset: &'a DevicePreset,
    /// Bandwidth this program gets from each memory level.
    pub rates: ProgramRates,
    /// Level that serves each load of the program, in issue order (from the cache model).
    pub levels: &'a [Level],
    /// Kernel name (for errors).
    pub kernel: &'a str,
    /// Source text of a kernel line (for errors).
    pub line_code: &'a dyn Fn(u32) -> String,
    /// Whether to keep the timeline.
    pub record_intervals: bool,
    /// Cycle (relative to this program's start) until which the core's DMA-out queue is still
    /// draining the previous program's stores.
    pub dma_out_busy_until: u64,
}

/// Runs the timing model over one program's trace.
pub fn time_program(
    cx: &TimingContext<'_>,
    trace: &ProgramTrace,
) -> Result<ProgramTiming, SimError> {
    let p = cx.preset;
    let mut next_level = 0usize;
    let n = trace.n_bufs() as usize;
    let last_use = trace.last_uses();
    let mut bufs: Vec<Option<BufState>> = (0..n).map(|_| None).collect();
    let mut regions: Vec<RegionState> = Vec::new();
    let mut free = FreeRegions::default();
    let mut live = 0u64;
    let mut t = ProgramTiming::default();
    let mut engine_free = [0u64; 4];
    engine_free[Engine::DmaOut.index()] = cx.dma_out_busy_until;
    let mut issue = 0u64;
    let mut last_ready = 0u64;
    // Unions of busy intervals: each engine starts its instructions in order, so they arrive sorted.
    let (mut matrix_iv, mut vector_iv, mut dma_iv) =
        (Union::default(), Union::default(), Union::default());
    let cap = p.sram.bytes_per_core;
    // Accumulator tiles held apart from the scratchpad (Hopper: the register file) count against
    // their own capacity; elsewhere they are scratchpad tiles like any other.
    let acc_cap = p.accumulators.as_ref().map(|a| a.bytes_per_core);
    let is_acc: &[bool] = if acc_cap.is_some() {
        trace.accumulators()
    } else {
        &[]
    };
    let mut live_acc = 0u64;
    let mut shape_cost = vec![ShapeCost::default(); trace.n_shapes()];
    // Per-shape statistics, folded into per-line ones at the end.
    let mut shape_stat = vec![LineStat::default(); trace.n_shapes()];

    for (i, (si, ev)) in trace.views().enumerate() {
        let i = i as u32;
        match ev {
            EventView::Alloc { buf, bytes, line } => {
                let region = match free.take(bytes, &regions) {
                    Some(ri) => ri,
                    None => {
                        regions.push(RegionState { free_at: 0 });
                        regions.len() - 1
                    }
                };
                let (used, limit) = match (is_acc.get(buf as usize), acc_cap) {
                    (Some(true), Some(c)) => {
                        live_acc += bytes;
                        (live_acc, c)
                    }
                    _ => {
                        live += bytes;
                        (live, cap)
                    }
                };
                if used > limit {
                    return Err(SimError::SramOverflow {
                        kernel: cx.kernel.to_string(),
                        line,
                        code: (cx.line_code)(line),
                        needed: used,
                        capacity: limit,
                    });
                }
                t.sram_peak = t.sram_peak.max(live);
                let free_at = regions[region].free_at;
                bufs[buf as usize] = Some(BufState {
                    bytes,
                    region,
                    ready: free_at,
                    last_access: free_at,
                    last_use: last_use[buf as usize],
                });
            }
            EventView::Exec { ins, reads, write } => {
                let mut deps = 0u64;
                for b in reads {
                    deps = deps.max(buf(&bufs, *b).ready);
                }
                if let Some(w) = write {
                    deps = deps.max(buf(&bufs, w).last_access);
                }
                let sc = &mut shape_cost[si as usize];
                let (engine, (dur, latency)) = match &ins.op {
                    Op::Barrier => (None, (0, 0)),
                    op => {
                        let e = op.engine().expect("non-barrier ops have an engine");
                        (
                            Some(e),
                            cost(cx, op, ins.line, &mut next_level, &mut t, sc)?,
                        )
                    }
                };
                let start = match engine {
                    Some(e) => issue.max(engine_free[e.index()]).max(deps),
                    None => issue
                        .max(engine_free.iter().copied().max().unwrap_or(0))
                        .max(deps),
                };
                // The engine is busy for `dur`; the result is ready `latency` later (DMA requests are
                // pipelined: the next transfer starts while this one's data is still in flight).
                let busy_end = start + dur;
                let end = busy_end + latency;
                let stat = &mut shape_stat[si as usize];
                stat.count += 1;
                if let Some(e) = engine {
                    engine_free[e.index()] = busy_end;
                    t.busy[e.index()] += dur;
                    stat.busy[e.index()] += dur;
                    match e {
                        Engine::Matrix => matrix_iv.add(start, busy_end),
                        Engine::Vector => vector_iv.add(start, busy_end),
                        Engine::DmaIn => dma_iv.add(start, end),
                        Engine::DmaOut => {}
                    }
                    if cx.record_intervals && dur > 0 {
                        t.intervals.push(Interval {
                            engine: e,
                            start,
                            end: busy_end,
                            name: ins.op.mnemonic(),
                            line: ins.line,
                        });
                    }
                }
                let new_issue = if ins.blocking || engine.is_none() {
                    end
                } else {
                    issue + 1
                };
                stat.stall += new_issue.saturating_sub(issue + 1);
                issue = new_issue;
                for b in reads {
                    let s = buf_mut(&mut bufs, *b);
                    s.last_access = s.last_access.max(end);
                }
                if engine != Some(Engine::DmaOut) {
                    last_ready = last_ready.max(end);
                }
                if let Some(w) = write {
                    let s = buf_mut(&mut bufs, w);
                    s.ready = end;
                    s.last_access = s.last_access.max(end);
                }
            }
        }
        // Release buffers whose last use was this event.
        let (new, reads, write) = match ev {
            EventView::Alloc { buf, .. } => (Some(buf), &[][..], None),
            EventView::Exec { reads, write, .. } => (None, reads, write),
        };
        for &b in new.iter().chain(reads).chain(write.iter()) {
            if let Some(s) = &bufs[b as usize] {
                if s.last_use == i {
                    let (region, bytes, at) = (s.region, s.bytes, s.last_access);
                    regions[region].free_at = at;
                    free.give(bytes, region);
                    if is_acc.get(b as usize) == Some(&true) {
                        live_acc -= bytes;
                    } else {
                        live -= bytes;
                    }
                    bufs[b as usize] = None;
                }
            }
        }
    }
    for (si, ev) in trace.shapes().iter().enumerate() {
        if let Event::Exec(ins) = ev {
            let stat = &shape_stat[si];
            t.lines.entry(ins.line).or_default().merge(stat);
            if let Op::Mma { m, n, k, dtype, .. } = &ins.op {
                *t.matrix_dtypes.entry(dtype.name()).or_default() += 2 * m * n * k * stat.count;
            }
        }
    }
    t.cycles = engine_free
        .iter()
        .copied()
        .max()
        .unwrap_or(0)
        .max(issue)
        .max(last_ready);
    // (`last_ready` excludes stores: they are posted and drain on the DMA-out queue.)
    t.dma_out_end = engine_free[Engine::DmaOut.index()];
    t.occupancy = Engine::ALL
        .iter()
        .filter(|e| **e != Engine::DmaOut)
        .map(|e| engine_free[e.index()])
        .max()
        .unwrap_or(0)
        .max(issue)
        .max(last_ready);
    let compute = merge_unions(&matrix_iv.0, &vector_iv.0);
    t.exposed_dma = exposed(&dma_iv.0, &compute);
    Ok(t)
}

fn buf(bufs: &[Option<BufState>], b: u32) -> &BufState {
    bufs[b as usize]
        .as_ref()
        .expect("front end recorded a use of a buffer after its last use")
}

fn buf_mut(bufs: &mut [Option<BufState>], b: u32) -> &mut BufState {
    bufs[b as usize]
        .as_mut()
        .expect("front end recorded a use of a buffer after its last use")
}

/// (busy cycles, latency) of one instruction, adding its traffic and work to `t`; `sc` caches
/// what depends only on the instruction's shape.
fn cost(
    cx: &TimingContext<'_>,
    op: &Op,
    line: u32,
    next_level: &mut usize,
    t: &mut ProgramTiming,
    sc: &mut ShapeCost,
) -> Result<(u64, u64), SimError> {
    let p = cx.preset;
    Ok(match op {
        Op::Load { bytes, .. } => {
            let level = cx.levels.get(*next_level).copied().unwrap_or(Level::Hbm);
            *next_level += 1;
            let slot = match level {
                Level::L2 => {
                    t.l2_read += bytes;
                    0
                }
                Level::Hbm => {
                    t.hbm_read += bytes;
                    1
                }
            };
            *sc.cost[slot].get_or_insert_with(|| {
                let (transfer, latency) = cx.rates.read_cycles(*bytes, level);
                (p.dma.overhead_cycles + transfer, latency)
            })
        }
        Op::Store { bytes } => {
            t.hbm_write += bytes;
            *sc.cost[1]
                .get_or_insert_with(|| (p.dma.overhead_cycles + cx.rates.write_cycles(*bytes), 0))
        }
        Op::Mma { m, n, k, dtype } => {
            let c = match sc.cost[1] {
                Some(c) => c,
                None => {
                    let c =
                        mma_cycles(p, *m, *n, *k, *dtype).map_err(|message| SimError::Kernel {
                            kernel: cx.kernel.to_string(),
                            line,
                            message,
                        })?;
                    let flop = 2 * m * n * k;
                    sc.matrix_ideal = flop as f64 / p.matrix_flop_per_cycle(*dtype).unwrap_or(1.0);
                    sc.cost[1] = Some((c, 0));
                    (c, 0)
                }
            };
            t.matrix_flop += 2 * m * n * k;
            t.matrix_ideal += sc.matrix_ideal;
            c
        }
        Op::Vector {
            elems,
            dtype,
            class,
        } => {
            t.vector_ops += elems;
            let c = match sc.cost[1] {
                Some(c) => c,
                None => {
                    let lanes = crate::isa::vector_lanes(p, *dtype) as f64;
                    let factor = if *class == VectorClass::Transcendental {
                        p.vector.transcendental_factor as f64
                    } else {
                        1.0
                    };
                    sc.vector_ideal = *elems as f64 * factor / lanes;
                    let c = (vector_cycles(p, *elems, *dtype, *class), 0);
                    sc.cost[1] = Some(c);
                    c
                }
            };
            t.vector_ideal += sc.vector_ideal;
            c
        }
        Op::Barrier => (0, 0),
    })
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
    fn exposed_counts_uncovered_dma() {
        let d = [(0, 10), (20, 30)];
        let c = merge_unions(&[(5, 8)], &[(6, 7), (25, 40)]);
        assert_eq!(c, vec![(5, 8), (25, 40)]);
        assert_eq!(exposed(&d, &c), 5 + 2 + 5);
        assert_eq!(exposed(&[(0, 10)], &[]), 10);
    }
}
