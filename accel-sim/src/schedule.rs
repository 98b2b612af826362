//! Launch-level simulation: programs onto cores, transfers through the shared memory system, and
//! the report.
//!
//! An event-driven simulation. Every core starts a program at cycle 0 and takes the next one (in
//! program-id order) the cycle it frees; cores that free at the same cycle take programs in core
//! order. The L2 model classifies a program's loads as hits or misses when it is assigned (program
//! order, so deterministic). Each program is walked by its [`CoreRun`], which hands every DMA
//! transfer to the launch; the transfers of all cores flow through one [`Fluid`] that shares HBM
//! and L2 bandwidth among whatever is in flight at each instant, so the tail of one wave overlaps
//! the head of the next and no level ever moves more than its bandwidth. Events are taken in time
//! order (transfer completions, then arrivals, then cores freeing, at equal times); a run blocked
//! on a transfer resumes when it completes.
//!
//! Cores that take programs at the same cycle, in the same state, and whose programs the timing
//! model cannot tell apart (same events, same L2/HBM level for every load) run in lockstep as one
//! run of multiplicity `k`: each of its transfers counts `k` times in the fluid. The heads of one
//! layer cost one walk per wave, as the tiles of a GEMM without L2 hits do. Everything is a pure
//! function of the traces, so the numbers do not depend on host threads or on how the front end
//! batches its pushes.

use crate::error::SimError;
use crate::memory::{Fluid, L2Cache, Level};
use crate::preset::DevicePreset;
use crate::program::ProgramTrace;
use crate::report::{Report, ReportInput, Totals};
use crate::timing::{CoreRun, Step, TimingContext, TransferId, Transfers};
use crate::trace::ChromeTrace;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;

/// How many runs formed at the same cycle a program is compared with before it gets its own.
const MAX_REUSE_CANDIDATES: usize = 4;

/// Static facts about a launch.
pub struct LaunchInfo<'a> {
    /// Kernel name.
    pub kernel: &'a str,
    /// Tunable values.
    pub config: BTreeMap<String, i64>,
    /// Grid.
    pub grid: [u64; 3],
    /// Source text per line (line, code).
    pub lines: &'a [(u32, &'a str)],
    /// Cost-only run.
    pub cost_only: bool,
    /// Keep a Chrome trace.
    pub want_trace: bool,
}

/// A program being timed on one or more cores in lockstep.
struct Run {
    timing: CoreRun,
    /// (core, program id) per core of the run.
    cores: Vec<(usize, u64)>,
}

/// Cores that free at one cycle, with the state of their DMA-out queue.
struct FreeCores {
    cores: Vec<usize>,
    /// The DMA-out queue is free at this cycle, or once this store completes.
    out_free: u64,
    out_pending: Option<TransferId>,
}

/// End of a waiter list.
const NO_RUN: u32 = u32::MAX;

/// A transfer as the launch tracks it.
struct XferState {
    /// Run owning it.
    owner: u32,
    /// What it moves (read when it arrives).
    class: crate::memory::Class,
    bytes: u64,
    mult: u64,
    /// First and last run blocked on it, in the order they blocked ([`NO_RUN`]: none).
    wait_head: u32,
    wait_tail: u32,
}

/// Incremental launch simulator: push program traces in program-id order, then finish.
pub struct LaunchSim<'a> {
    preset: &'a DevicePreset,
    info: LaunchInfo<'a>,
    l2: L2Cache,
    queue: VecDeque<ProgramTrace>,
    next_program: u64,
    /// Programs the next batch of freeing cores needs before the simulation can go on.
    needed: usize,
    fluid: Fluid,
    transfers: Transfers,
    /// Per transfer (ids are dense, in request order): the run owning it (its statistics), what
    /// it moves, and the runs blocked on it.
    xfers: Vec<XferState>,
    /// Next run in the same waiter list, per run slot ([`NO_RUN`] ends a list).
    wait_next: Vec<u32>,
    /// (arrival cycle, transfer) not yet in the fluid.
    arrivals: BinaryHeap<Reverse<(u64, TransferId)>>,
    /// (cycle, sequence) of cores freeing, and who they are (indexed by sequence, taken once).
    frees: BinaryHeap<Reverse<(u64, u64)>>,
    free_sets: Vec<Option<FreeCores>>,
    free_seq: u64,
    runs: Vec<Option<Run>>,
    spare: Vec<usize>,
    core_end: Vec<u64>,
    core_exposed: Vec<u64>,
    totals: Totals,
    trace: Option<ChromeTrace>,
    done_buf: Vec<u32>,
}

impl<'a> LaunchSim<'a> {
    /// Starts simulating a launch of `info.grid` programs on `preset`.
    pub fn new(preset: &'a DevicePreset, info: LaunchInfo<'a>) -> LaunchSim<'a> {
        let trace = info.want_trace.then(ChromeTrace::default);
        let cores = preset.cores as usize;
        let mut sim = LaunchSim {
            preset,
            l2: L2Cache::new(preset.l2.capacity_bytes),
            queue: VecDeque::new(),
            next_program: 0,
            needed: 0,
            fluid: Fluid::new(preset),
            transfers: Transfers::default(),
            xfers: Vec::new(),
            wait_next: Vec::new(),
            arrivals: BinaryHeap::new(),
            frees: BinaryHeap::new(),
            free_sets: Vec::new(),
            free_seq: 0,
            runs: Vec::new(),
            spare: Vec::new(),
            core_end: vec![0; cores],
            core_exposed: vec![0; cores],
            totals: Totals::default(),
            trace,
            done_buf: Vec::new(),
            info,
        };
        sim.add_free(
            0,
            FreeCores {
                cores: (0..cores).collect(),
                out_free: 0,
                out_pending: None,
            },
        );
        sim
    }

    fn add_free(&mut self, at: u64, f: FreeCores) {
        self.frees.push(Reverse((at, self.free_seq)));
        debug_assert_eq!(self.free_sets.len() as u64, self.free_seq);
        self.free_sets.push(Some(f));
        self.free_seq += 1;
    }

    /// Adds the next program (in program-id order); the simulation runs as far as it can.
    pub fn push(&mut self, prog: ProgramTrace) -> Result<(), SimError> {
        self.queue.push_back(prog);
        if self.queue.len() >= self.needed {
            self.simulate(false)?;
        }
        Ok(())
    }

    /// Runs events until the simulation needs programs not pushed yet (or, when `last`, to the end).
    fn simulate(&mut self, last: bool) -> Result<(), SimError> {
        loop {
            let tc = self.fluid.next_completion();
            let ta = self.arrivals.peek().map(|Reverse((t, _))| *t as f64);
            let tf = self.frees.peek().map(|Reverse((t, _))| *t as f64);
            // Completions first, then arrivals, then cores freeing, at equal times.
            let min = [tc, ta, tf]
                .into_iter()
                .flatten()
                .fold(f64::INFINITY, f64::min);
            if min == f64::INFINITY {
                return Ok(());
            }
            if tc == Some(min) {
                self.complete()?;
            } else if ta == Some(min) {
                let Reverse((t, id)) = self.arrivals.pop().expect("peeked");
                self.fluid.advance_to(t as f64);
                let x = &self.xfers[id as usize];
                self.fluid.add(id, x.class, x.bytes, x.mult);
            } else if !self.assign(last)? {
                return Ok(());
            }
        }
    }

    /// The next transfer completions: engines free, data arrives, blocked runs resume.
    fn complete(&mut self) -> Result<(), SimError> {
        let mut done = std::mem::take(&mut self.done_buf);
        done.clear();
        let t = self
            .fluid
            .complete_next(&mut done)
            .expect("a completion is due");
        // The DMA engine is busy until the cycle its last byte lands.
        let busy_end = (t - 1e-6).ceil().max(0.0) as u64;
        for &id in &done {
            self.transfers.complete(id, busy_end);
        }
        for &id in &done {
            let r = self.xfers[id as usize].owner as usize;
            let record = self.trace.is_some();
            let finished = match self.runs[r].as_mut() {
                Some(run) => {
                    run.timing.transfer_done(id, &self.transfers, record);
                    run.timing.finished()
                }
                None => false,
            };
            if finished {
                self.retire(r);
            }
        }
        for &id in &done {
            let x = &mut self.xfers[id as usize];
            let mut r = std::mem::replace(&mut x.wait_head, NO_RUN);
            x.wait_tail = NO_RUN;
            while r != NO_RUN {
                let next = std::mem::replace(&mut self.wait_next[r as usize], NO_RUN);
                self.step(r as usize, busy_end)?;
                r = next;
            }
        }
        self.done_buf = done;
        Ok(())
    }

    /// Walks run `r` as far as it goes at cycle `now`.
    fn step(&mut self, r: usize, now: u64) -> Result<(), SimError> {
        let lines = self.info.lines;
        let code = |l: u32| code_of(lines, l);
        let cx = TimingContext {
            preset: self.preset,
            kernel: self.info.kernel,
            line_code: &code,
            record_intervals: self.trace.is_some(),
        };
        let Some(run) = self.runs[r].as_mut() else {
            return Ok(());
        };
        let was_done = run.timing.walked();
        let step = run.timing.advance(&cx, &mut self.transfers, now)?;
        for req in self.transfers.requests.drain(..) {
            debug_assert_eq!(self.xfers.len(), req.id as usize);
            self.xfers.push(XferState {
                owner: r as u32,
                class: req.class,
                bytes: req.bytes,
                mult: req.mult,
                wait_head: NO_RUN,
                wait_tail: NO_RUN,
            });
            self.arrivals.push(Reverse((req.arrival, req.id)));
        }
        match step {
            Step::Blocked(id) => {
                // Appended, so that runs blocked on one transfer resume in the order they blocked.
                if self.wait_next.len() <= r {
                    self.wait_next.resize(r + 1, NO_RUN);
                }
                let x = &mut self.xfers[id as usize];
                match x.wait_tail {
                    NO_RUN => x.wait_head = r as u32,
                    t => self.wait_next[t as usize] = r as u32,
                }
                x.wait_tail = r as u32;
            }
            Step::Done { occupancy } if !was_done => {
                let run = self.runs[r].as_ref().expect("present");
                let out_pending = run.timing.out_in_flight();
                let f = FreeCores {
                    cores: run.cores.iter().map(|(c, _)| *c).collect(),
                    out_free: run.timing.t.dma_out_end,
                    out_pending,
                };
                let finished = run.timing.finished();
                self.add_free(occupancy, f);
                if finished {
                    self.retire(r);
                }
            }
            Step::Done { .. } => {}
        }
        Ok(())
    }

    /// Books a finished run into the totals (once per core it ran on) and drops it.
    fn retire(&mut self, r: usize) {
        let Some(run) = self.runs[r].take() else {
            return;
        };
        self.spare.push(r);
        let t = &run.timing.t;
        let k = run.cores.len() as u64;
        for &(core, pid) in &run.cores {
            self.core_end[core] = self.core_end[core].max(t.cycles);
            self.core_exposed[core] += t.exposed_dma;
            if let Some(tr) = &mut self.trace {
                tr.add_program(
                    core as u64,
                    pid,
                    run.timing.start,
                    self.preset.clock_ghz,
                    &t.intervals,
                );
            }
        }
        let tot = &mut self.totals;
        for e in 0..4 {
            tot.busy[e] += k * t.busy[e];
        }
        tot.matrix_flop += k * t.matrix_flop;
        tot.useful_flop += k * t.useful_flop;
        tot.vector_ops += k * t.vector_ops;
        tot.matrix_ideal += k as f64 * t.matrix_ideal;
        tot.vector_ideal += k as f64 * t.vector_ideal;
        tot.hbm_read += k * t.hbm_read;
        tot.hbm_write += k * t.hbm_write;
        tot.l2_read += k * t.l2_read;
        tot.sram_peak = tot.sram_peak.max(t.sram_peak);
        tot.sram_reserved_peak = tot.sram_reserved_peak.max(t.sram_reserved_peak);
        for (d, f) in &t.matrix_dtypes {
            *tot.matrix_dtypes.entry(d).or_default() += k * f;
        }
        for (l, s) in &t.lines {
            let e = tot.lines.entry(*l).or_default();
            for _ in 0..k {
                e.merge(s);
            }
        }
    }

    /// The L2 level of every load of programs that start on the same cycle, classified in the
    /// order their loads reach the L2. Programs that start together run side by side, so their
    /// `j`-th loads happen at about the same time: the loads are taken round-robin over the
    /// programs (first loads of all programs, then second loads, ...), not one program's whole
    /// stream after another's. Classifying program by program would let a long program (a
    /// persistent GEMM streaming hundreds of megabytes) evict every window before the program
    /// beside it, which reads the same windows at the same time, is classified: no hit between
    /// concurrent programs at all, where a real L2 serves the second reader of a panel. A lone
    /// program (cores freeing one at a time) is classified as before.
    fn batch_levels<C>(&mut self, progs: &[(C, ProgramTrace)]) -> Vec<Vec<Level>> {
        let mut levels: Vec<Vec<Level>> = progs
            .iter()
            .map(|(_, p)| Vec::with_capacity(p.loads().len()))
            .collect();
        let longest = progs
            .iter()
            .map(|(_, p)| p.loads().len())
            .max()
            .unwrap_or(0);
        for j in 0..longest {
            for (i, (_, p)) in progs.iter().enumerate() {
                if let Some((bytes, region)) = p.loads().get(j) {
                    levels[i].push(self.l2.read(*region, *bytes));
                }
            }
        }
        levels
    }

    /// Cores free at the earliest free cycle take the next programs. Returns false (and changes
    /// nothing) when programs they need are not pushed yet.
    fn assign(&mut self, last: bool) -> Result<bool, SimError> {
        let Some(&Reverse((at, _))) = self.frees.peek() else {
            return Ok(false);
        };
        let mut batch = Vec::new();
        while let Some(&Reverse((t, seq))) = self.frees.peek() {
            if t != at {
                break;
            }
            self.frees.pop();
            batch.push(seq);
        }
        let n: usize = batch
            .iter()
            .map(|s| {
                self.free_sets[*s as usize]
                    .as_ref()
                    .expect("listed")
                    .cores
                    .len()
            })
            .sum();
        if self.queue.len() < n && !last {
            for seq in batch {
                self.frees.push(Reverse((at, seq)));
            }
            self.needed = n;
            return Ok(false);
        }
        self.needed = 0;
        self.fluid.advance_to(at as f64);
        // (core, its DMA-out state), in core order.
        let mut cores: Vec<(usize, u64, Option<TransferId>)> = Vec::with_capacity(n);
        for seq in batch {
            let f = self.free_sets[seq as usize].take().expect("listed");
            let pending = f.out_pending.filter(|id| self.transfers.get(*id).is_none());
            for c in f.cores {
                cores.push((c, f.out_free, pending));
            }
        }
        cores.sort_unstable_by_key(|c| c.0);
        // Runs formed now: (run, out state, levels).
        let mut formed: Vec<(usize, u64, Option<TransferId>)> = Vec::new();
        let mut levels_of: Vec<Vec<Level>> = Vec::new();
        let taken: Vec<_> = cores
            .into_iter()
            .map_while(|c| self.queue.pop_front().map(|prog| (c, prog)))
            .collect();
        let mut batch_levels = self.batch_levels(&taken);
        for (((core, out_free, out_pending), prog), levels) in
            taken.into_iter().zip(batch_levels.drain(..))
        {
            let pid = self.next_program;
            self.next_program += 1;
            // Programs the timing model cannot tell apart, on cores in the same state, run in
            // lockstep: the timing reads nothing else (load windows only decide the levels).
            let same = formed
                .iter()
                .zip(&levels_of)
                .rev()
                .take(MAX_REUSE_CANDIDATES)
                .find(|((r, of, op), lv)| {
                    *of == out_free
                        && *op == out_pending
                        && **lv == levels
                        && self.runs[*r]
                            .as_ref()
                            .is_some_and(|run| run.timing.same_program(&prog))
                })
                .map(|((r, _, _), _)| *r);
            match same {
                Some(r) => {
                    let run = self.runs[r].as_mut().expect("formed now");
                    run.cores.push((core, pid));
                    run.timing.mult += 1;
                }
                None => {
                    let run = Run {
                        timing: CoreRun::new(
                            Arc::new(prog),
                            levels.clone(),
                            at,
                            1,
                            out_free,
                            out_pending,
                        ),
                        cores: vec![(core, pid)],
                    };
                    let r = match self.spare.pop() {
                        Some(r) => {
                            self.runs[r] = Some(run);
                            r
                        }
                        None => {
                            self.runs.push(Some(run));
                            self.runs.len() - 1
                        }
                    };
                    formed.push((r, out_free, out_pending));
                    levels_of.push(levels);
                }
            }
        }
        for (r, _, _) in formed {
            self.step(r, at)?;
        }
        Ok(true)
    }

    /// Finishes the launch: the report and, if requested, the Chrome trace.
    pub fn finish(mut self) -> Result<(Report, Option<ChromeTrace>), SimError> {
        self.simulate(true)?;
        let (crit, cycles) = self
            .core_end
            .iter()
            .enumerate()
            .max_by_key(|(c, f)| (**f, std::cmp::Reverse(*c)))
            .map(|(c, f)| (c, *f))
            .unwrap_or((0, 0));
        let lines = self.info.lines;
        let code = |l: u32| code_of(lines, l);
        let report = Report::build(
            self.preset,
            ReportInput {
                kernel: self.info.kernel,
                config: self.info.config.clone(),
                grid: self.info.grid,
                cycles,
                exposed_dma: self.core_exposed[crit],
                line_code: &code,
                cost_only: self.info.cost_only,
            },
            &self.totals,
        );
        Ok((report, self.trace))
    }
}

fn code_of(lines: &[(u32, &str)], line: u32) -> String {
    lines
        .iter()
        .find(|(l, _)| *l == line)
        .map(|(_, c)| c.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::{Op, Region};
    use crate::program::{Instr, Recorder};

    /// A program that streams `steps` windows of `bytes` from tensor `tensor` and stores each,
    /// double-buffered: the next window is loaded before the current one is stored.
    fn streaming(tensor: u64, first: u64, steps: u64, bytes: u64) -> ProgramTrace {
        let mut r = Recorder::new();
        let load = |r: &mut Recorder, s: u64| {
            let buf = r.alloc(bytes, 1);
            let region = Region {
                tensor,
                offset: (first + s) * bytes,
                rows: 1,
                cols: bytes,
            };
            r.exec(&Instr::new(Op::Load { bytes, region }, 2, &[], Some(buf)));
            buf
        };
        let mut cur = load(&mut r, 0);
        for s in 0..steps {
            let next = (s + 1 < steps).then(|| load(&mut r, s + 1));
            r.exec(&Instr::new(Op::Store { bytes }, 3, &[cur], None));
            if let Some(n) = next {
                cur = n;
            }
        }
        r.finish()
    }

    fn launch(p: &DevicePreset, progs: Vec<ProgramTrace>) -> Report {
        let info = LaunchInfo {
            kernel: "stream",
            config: BTreeMap::new(),
            grid: [progs.len() as u64, 1, 1],
            lines: &[],
            cost_only: true,
            want_trace: false,
        };
        let mut sim = LaunchSim::new(p, info);
        for prog in progs {
            sim.push(prog).unwrap();
        }
        sim.finish().unwrap().0
    }

    #[test]
    fn bandwidth_is_shared_across_waves_and_never_exceeded() {
        let p = DevicePreset::load("npu-910b").unwrap();
        let cores = p.cores;
        // 2.5 waves of HBM-only streaming programs: HBM is the bottleneck throughout, the half
        // wave included, because it overlaps the tail of the one before.
        let progs: Vec<_> = (0..cores * 5 / 2)
            .map(|i| streaming(1, i * 16, 16, 32 * 1024))
            .collect();
        let r = launch(&p, progs);
        assert!(r.check_physics(&p).is_empty(), "{:?}", r.check_physics(&p));
        assert_eq!(r.bound_unit, "hbm");
        // Near the roofline (latency and overheads only): a per-wave split would leave the last
        // half wave at half the HBM bandwidth.
        assert!(
            r.roofline_fraction > 0.9,
            "{} of the roofline ({} cycles)",
            r.roofline_fraction,
            r.cycles
        );
    }

    #[test]
    fn lockstep_programs_keep_physics_and_determinism() {
        // Programs reading different tensors cannot be told apart by the timing model: they run
        // as one run of multiplicity `cores`, whose transfers count `cores` times in the fluid.
        let p = DevicePreset::load("h200").unwrap();
        let same: Vec<_> = (0..p.cores)
            .map(|i| streaming(i, 0, 4, 32 * 1024))
            .collect();
        let r = launch(&p, same);
        assert!(r.check_physics(&p).is_empty());
        let twice = launch(
            &p,
            (0..p.cores)
                .map(|i| streaming(i, 0, 4, 32 * 1024))
                .collect(),
        );
        assert_eq!(r, twice, "deterministic");
    }
}
