//! Launch-level simulation: programs onto cores, in waves, and the report.
//!
//! Programs are timed in program-id order (which also drives the L2 model) and placed greedily on
//! the core that frees first (ties: lowest core), which yields waves of `cores` programs for uniform
//! kernels. All cores that run at once share HBM and L2 bandwidth equally. Everything is a pure
//! function of the traces, so the numbers do not depend on host threads.

use crate::error::SimError;
use crate::memory::{BandwidthShare, L2Cache};
use crate::preset::DevicePreset;
use crate::program::ProgramTrace;
use crate::report::{Report, ReportInput, Totals};
use crate::timing::{time_program, TimingContext};
use crate::trace::ChromeTrace;
use std::collections::BTreeMap;

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
    share: BandwidthShare,
    l2: L2Cache,
    core_free: Vec<u64>,
    core_exposed: Vec<u64>,
    totals: Totals,
    trace: Option<ChromeTrace>,
    next_program: u64,
}

impl<'a> LaunchSim<'a> {
    /// Starts simulating a launch of `info.grid` programs on `preset`.
    pub fn new(preset: &'a DevicePreset, info: LaunchInfo<'a>) -> LaunchSim<'a> {
        let programs: u64 = info.grid.iter().product();
        let active = preset.cores.min(programs.max(1));
        let trace = info.want_trace.then(ChromeTrace::default);
        LaunchSim {
            preset,
            share: BandwidthShare::new(preset, active),
            l2: L2Cache::new(preset.l2.capacity_bytes),
            core_free: vec![0; preset.cores as usize],
            core_exposed: vec![0; preset.cores as usize],
            totals: Totals::default(),
            trace,
            next_program: 0,
            info,
        }
    }

    /// Times the next program (in program-id order) and places it on a core.
    pub fn push(&mut self, prog: &ProgramTrace) -> Result<(), SimError> {
        let lines = self.info.lines;
        let code = |l: u32| code_of(lines, l);
        let cx = TimingContext {
            preset: self.preset,
            share: self.share,
            kernel: self.info.kernel,
            line_code: &code,
            record_intervals: self.trace.is_some(),
        };
        let t = time_program(&cx, prog, &mut self.l2)?;
        let core = (0..self.core_free.len())
            .min_by_key(|c| (self.core_free[*c], *c))
            .expect("at least one core");
        let start = self.core_free[core];
        self.core_free[core] = start + t.cycles;
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
        Ok(())
    }

    /// Finishes the launch: the report and, if requested, the Chrome trace.
    pub fn finish(self) -> (Report, Option<ChromeTrace>) {
        let (crit, cycles) = self
            .core_free
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
        (report, self.trace)
    }
}

fn code_of(lines: &[(u32, &str)], line: u32) -> String {
    lines
        .iter()
        .find(|(l, _)| *l == line)
        .map(|(_, c)| c.to_string())
        .unwrap_or_default()
}
