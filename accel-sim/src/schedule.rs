//! Launch-level simulation: programs onto cores, in waves, and the report.
//!
//! Programs are taken in program-id order in waves of `cores` (the programs that run at once). For
//! each wave the L2 model classifies every load as hit or miss (in program order), the wave's HBM and
//! L2 bandwidth is shared among its programs by demand (capped processor sharing, see
//! [`crate::memory::share_wave`]), then each program is timed and placed on the core that frees first
//! (ties: lowest core). Everything is a pure function of the traces, so the numbers do not depend on
//! host threads.

use crate::error::SimError;
use crate::memory::{share_wave, Demand, L2Cache, Level, ProgramRates};
use crate::preset::DevicePreset;
use crate::program::ProgramTrace;
use crate::report::{Report, ReportInput, Totals};
use crate::timing::{time_program, ProgramTiming, TimingContext};
use crate::trace::ChromeTrace;
use std::collections::BTreeMap;

/// How many earlier programs of a wave a program is compared with before it is timed in full.
const MAX_REUSE_CANDIDATES: usize = 4;

/// A program of the current wave that was timed in full, with what its timing depended on.
struct Timed {
    /// Its index in the wave.
    prog: usize,
    rates: ProgramRates,
    dma_out_busy_until: u64,
    timing: ProgramTiming,
}

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

/// Incremental launch simulator: push program traces in program-id order, then finish.
pub struct LaunchSim<'a> {
    preset: &'a DevicePreset,
    info: LaunchInfo<'a>,
    l2: L2Cache,
    pending: Vec<ProgramTrace>,
    core_free: Vec<u64>,
    core_exposed: Vec<u64>,
    core_drain: Vec<u64>,
    totals: Totals,
    trace: Option<ChromeTrace>,
    next_program: u64,
}

impl<'a> LaunchSim<'a> {
    /// Starts simulating a launch of `info.grid` programs on `preset`.
    pub fn new(preset: &'a DevicePreset, info: LaunchInfo<'a>) -> LaunchSim<'a> {
        let trace = info.want_trace.then(ChromeTrace::default);
        LaunchSim {
            preset,
            pending: Vec::new(),
            l2: L2Cache::new(preset.l2.capacity_bytes),
            core_free: vec![0; preset.cores as usize],
            core_exposed: vec![0; preset.cores as usize],
            core_drain: vec![0; preset.cores as usize],
            totals: Totals::default(),
            trace,
            next_program: 0,
            info,
        }
    }

    /// Adds the next program (in program-id order); programs are timed a wave at a time.
    pub fn push(&mut self, prog: ProgramTrace) -> Result<(), SimError> {
        self.pending.push(prog);
        if self.pending.len() as u64 >= self.preset.cores {
            self.flush_wave()?;
        }
        Ok(())
    }

    fn flush_wave(&mut self) -> Result<(), SimError> {
        let wave = std::mem::take(&mut self.pending);
        let mut levels: Vec<Vec<Level>> = Vec::with_capacity(wave.len());
        let mut demands: Vec<Demand> = Vec::with_capacity(wave.len());
        for prog in &wave {
            let mut lv = Vec::with_capacity(prog.loads().len());
            let mut d = Demand {
                hbm: prog.store_bytes(),
                l2: 0,
            };
            for (bytes, region) in prog.loads() {
                let level = self.l2.read(*region, *bytes);
                match level {
                    Level::L2 => d.l2 += bytes,
                    Level::Hbm => d.hbm += bytes,
                }
                lv.push(level);
            }
            levels.push(lv);
            demands.push(d);
        }
        let rates = share_wave(self.preset, &demands);
        let mut timed: Vec<Timed> = Vec::new();
        for (i, prog) in wave.iter().enumerate() {
            let (core, start, busy_until) = self.next_core();
            // Programs that issued the same instructions, served by the same levels at the same
            // rates, on a core in the same state, have the same timing: `time_program` reads
            // nothing else (load windows only decide the levels). The heads of one layer, or the
            // tiles of a GEMM without L2 hits, are timed once per wave.
            let same = timed.iter().rev().take(MAX_REUSE_CANDIDATES).find(|t| {
                t.dma_out_busy_until == busy_until
                    && t.rates == rates[i]
                    && levels[t.prog] == levels[i]
                    && wave[t.prog].same_shapes(prog)
            });
            match same {
                Some(t) => {
                    let t = t.timing.clone();
                    self.place(core, start, &t);
                }
                None => {
                    let t = self.time_one(prog, rates[i], &levels[i], busy_until)?;
                    self.place(core, start, &t);
                    timed.push(Timed {
                        prog: i,
                        rates: rates[i],
                        dma_out_busy_until: busy_until,
                        timing: t,
                    });
                }
            }
        }
        Ok(())
    }

    /// The core that frees first (ties: lowest), when it frees, and until when (relative to then)
    /// its DMA-out queue still drains earlier stores.
    fn next_core(&self) -> (usize, u64, u64) {
        let core = (0..self.core_free.len())
            .min_by_key(|c| (self.core_free[*c], *c))
            .expect("at least one core");
        let start = self.core_free[core];
        (core, start, self.core_drain[core].saturating_sub(start))
    }

    fn time_one(
        &self,
        prog: &ProgramTrace,
        rates: crate::memory::ProgramRates,
        levels: &[Level],
        dma_out_busy_until: u64,
    ) -> Result<ProgramTiming, SimError> {
        let lines = self.info.lines;
        let code = |l: u32| code_of(lines, l);
        let cx = TimingContext {
            preset: self.preset,
            rates,
            levels,
            kernel: self.info.kernel,
            line_code: &code,
            record_intervals: self.trace.is_some(),
            dma_out_busy_until,
        };
        time_program(&cx, prog)
    }

    /// Places a timed program on `core` at `start` and adds it to the totals.
    fn place(&mut self, core: usize, start: u64, t: &ProgramTiming) {
        // The core takes its next program when this one's work is done; its stores drain meanwhile.
        self.core_free[core] = start + t.occupancy;
        self.core_drain[core] = start + t.dma_out_end;
        self.core_exposed[core] += t.exposed_dma;
        if let Some(tr) = &mut self.trace {
            tr.add_program(
                core as u64,
                self.next_program,
                start,
                self.preset.clock_ghz,
                &t.intervals,
            );
        }
        let tot = &mut self.totals;
        for e in 0..4 {
            tot.busy[e] += t.busy[e];
        }
        tot.matrix_flop += t.matrix_flop;
        tot.vector_ops += t.vector_ops;
        tot.matrix_ideal += t.matrix_ideal;
        tot.vector_ideal += t.vector_ideal;
        tot.hbm_read += t.hbm_read;
        tot.hbm_write += t.hbm_write;
        tot.l2_read += t.l2_read;
        tot.sram_peak = tot.sram_peak.max(t.sram_peak);
        for (d, f) in &t.matrix_dtypes {
            *tot.matrix_dtypes.entry(d).or_default() += f;
        }
        for (l, s) in &t.lines {
            tot.lines.entry(*l).or_default().merge(s);
        }
        self.next_program += 1;
    }

    /// Finishes the launch: the report and, if requested, the Chrome trace.
    pub fn finish(mut self) -> Result<(Report, Option<ChromeTrace>), SimError> {
        if !self.pending.is_empty() {
            self.flush_wave()?;
        }
        let ends: Vec<u64> = self
            .core_free
            .iter()
            .zip(&self.core_drain)
            .map(|(f, d)| (*f).max(*d))
            .collect();
        let (crit, cycles) = ends
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
