//! The launch report: cycles, time, work, traffic, roofline, utilisation, SRAM and per-line costs.

use crate::isa::Engine;
use crate::preset::DevicePreset;
use crate::timing::LineStat;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Cycles attributed to one kernel source line, summed over all programs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LineReport {
    /// Line number in the kernel's source file.
    pub line: u32,
    /// The line's code (as tokens).
    pub code: String,
    /// Instructions issued by this line.
    pub count: u64,
    /// Busy engine cycles of this line's instructions (all engines).
    pub cycles: u64,
    /// Busy cycles per engine.
    pub engines: BTreeMap<&'static str, u64>,
    /// Issue-stream stall cycles on this line's blocking instructions.
    pub stall: u64,
}

/// What one kernel launch cost on the simulated device. Field names are stable (JSON output).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Kernel name.
    pub kernel: String,
    /// Device preset name.
    pub device: String,
    /// Tunable values of this launch.
    pub config: BTreeMap<String, i64>,
    /// Grid (programs per axis).
    pub grid: [u64; 3],
    /// Programs launched.
    pub programs: u64,
    /// Cores of the device.
    pub cores: u64,
    /// Waves: ⌈programs / cores⌉.
    pub waves: u64,
    /// Total cycles at the preset clock.
    pub cycles: u64,
    /// Time in microseconds.
    pub time_us: f64,
    /// The problem's useful FLOP: matrix 2·m·n·k over the valid (not padded) extents of the
    /// operands, plus vector element ops that compute (constant fills excluded). 2·M·N·K for a GEMM.
    pub flop: u64,
    /// FLOP issued: every matrix and vector op, padding of ragged tiles and fills included.
    pub issued_flop: u64,
    /// Matrix-unit FLOP issued (padding included).
    pub matrix_flop: u64,
    /// Vector-unit element operations issued.
    pub vector_ops: u64,
    /// Bytes moved to and from HBM.
    pub hbm_bytes: u64,
    /// Bytes read from HBM.
    pub hbm_read_bytes: u64,
    /// Bytes written to HBM.
    pub hbm_write_bytes: u64,
    /// Bytes read from L2 (hits).
    pub l2_bytes: u64,
    /// Achieved TFLOP/s.
    pub achieved_tflops: f64,
    /// Peak TFLOP/s of the unit that does the work (matrix unit at the dominant dtype).
    pub peak_tflops: f64,
    /// Achieved HBM GB/s.
    pub achieved_hbm_gbps: f64,
    /// Peak HBM GB/s.
    pub peak_hbm_gbps: f64,
    /// FLOP per HBM byte.
    pub arithmetic_intensity: f64,
    /// `compute` or `memory`: which roofline term is largest.
    pub bound: &'static str,
    /// Which resource bounds the roofline: `matrix`, `vector`, `hbm` or `l2`.
    pub bound_unit: &'static str,
    /// Roofline lower bound in cycles: max of the per-resource minimum times.
    pub roofline_cycles: u64,
    /// roofline_cycles / cycles (1.0 = at the roofline).
    pub roofline_fraction: f64,
    /// Busy fraction of each engine over all cores for the whole launch.
    pub engine_utilization: BTreeMap<&'static str, f64>,
    /// DMA-in cycles not overlapped by compute, on the core that finishes last.
    pub exposed_dma_cycles: u64,
    /// Peak live SRAM bytes on one core.
    pub sram_peak_bytes: u64,
    /// Peak SRAM reserved on one core at any instant: live tiles plus regions whose last occupant
    /// may still be in use (≥ `sram_peak_bytes`, never above the capacity).
    pub sram_reserved_peak_bytes: u64,
    /// SRAM bytes per core.
    pub sram_capacity_bytes: u64,
    /// Max relative error against the reference (set by the caller that checked; null in cost-only runs).
    pub max_rel_error: Option<f64>,
    /// Whether this report came from a cost-only run (no data).
    pub cost_only: bool,
    /// Programs timed in full; fewer than `programs` when a long steady launch was sampled and
    /// windows of it were skipped at their measured cost (see [`crate::schedule`]).
    pub simulated_programs: u64,
    /// Cycles per kernel source line.
    pub lines: Vec<LineReport>,
}

/// Totals over all programs that the report is built from.
#[derive(Debug, Default, Clone)]
pub struct Totals {
    /// Busy cycles per engine.
    pub busy: [u64; 4],
    /// Matrix FLOP issued.
    pub matrix_flop: u64,
    /// Useful FLOP (see [`Report::flop`]).
    pub useful_flop: u64,
    /// Vector element ops.
    pub vector_ops: u64,
    /// Ideal matrix cycles (summed over programs).
    pub matrix_ideal: f64,
    /// Ideal vector cycles (summed over programs).
    pub vector_ideal: f64,
    /// HBM bytes read.
    pub hbm_read: u64,
    /// HBM bytes written.
    pub hbm_write: u64,
    /// L2 bytes read.
    pub l2_read: u64,
    /// Peak SRAM over programs.
    pub sram_peak: u64,
    /// Peak SRAM reserved by regions over programs (occupancy bound at any instant).
    pub sram_reserved_peak: u64,
    /// FLOP per matrix dtype.
    pub matrix_dtypes: BTreeMap<&'static str, u64>,
    /// Per-line stats.
    pub lines: BTreeMap<u32, LineStat>,
}

impl Totals {
    /// Field by field: `count` on counts and bytes, `ideal` on ideal cycles (keys missing on one
    /// side count as zero); SRAM peaks are the larger of the two.
    pub fn combine(
        &self,
        o: &Totals,
        count: impl Fn(u64, u64) -> u64,
        ideal: impl Fn(f64, f64) -> f64,
    ) -> Totals {
        let mut lines = self.lines.clone();
        for l in o.lines.keys() {
            lines.entry(*l).or_default();
        }
        for (l, s) in lines.iter_mut() {
            let b = o.lines.get(l).cloned().unwrap_or_default();
            for e in 0..4 {
                s.busy[e] = count(s.busy[e], b.busy[e]);
            }
            s.stall = count(s.stall, b.stall);
            s.count = count(s.count, b.count);
        }
        let mut matrix_dtypes = self.matrix_dtypes.clone();
        for d in o.matrix_dtypes.keys() {
            matrix_dtypes.entry(d).or_insert(0);
        }
        for (d, f) in matrix_dtypes.iter_mut() {
            *f = count(*f, o.matrix_dtypes.get(d).copied().unwrap_or(0));
        }
        Totals {
            busy: std::array::from_fn(|e| count(self.busy[e], o.busy[e])),
            matrix_flop: count(self.matrix_flop, o.matrix_flop),
            useful_flop: count(self.useful_flop, o.useful_flop),
            vector_ops: count(self.vector_ops, o.vector_ops),
            matrix_ideal: ideal(self.matrix_ideal, o.matrix_ideal),
            vector_ideal: ideal(self.vector_ideal, o.vector_ideal),
            hbm_read: count(self.hbm_read, o.hbm_read),
            hbm_write: count(self.hbm_write, o.hbm_write),
            l2_read: count(self.l2_read, o.l2_read),
            sram_peak: self.sram_peak.max(o.sram_peak),
            sram_reserved_peak: self.sram_reserved_peak.max(o.sram_reserved_peak),
            matrix_dtypes,
            lines,
        }
    }
}

/// Inputs of [`Report::build`] that are not totals.
pub struct ReportInput<'a> {
    /// Kernel name.
    pub kernel: &'a str,
    /// Tunable values.
    pub config: BTreeMap<String, i64>,
    /// Grid.
    pub grid: [u64; 3],
    /// Makespan in cycles.
    pub cycles: u64,
    /// Exposed DMA on the critical core.
    pub exposed_dma: u64,
    /// Line → code text.
    pub line_code: &'a dyn Fn(u32) -> String,
    /// Cost-only run.
    pub cost_only: bool,
    /// Programs timed in full (the others skipped at a measured window's cost).
    pub simulated_programs: u64,
}

impl Report {
    /// Assembles a report from scheduled totals.
    pub fn build(p: &DevicePreset, inp: ReportInput<'_>, tot: &Totals) -> Report {
        let programs = inp.grid.iter().product::<u64>();
        let cores = p.cores;
        let cycles = inp.cycles.max(1);
        let time_us = p.cycles_to_us(cycles);
        let hbm_bytes = tot.hbm_read + tot.hbm_write;
        let flop = tot.useful_flop;
        let issued_flop = tot.matrix_flop + tot.vector_ops;
        let terms = [
            ("matrix", tot.matrix_ideal / cores as f64),
            ("vector", tot.vector_ideal / cores as f64),
            ("hbm", hbm_bytes as f64 / p.hbm_bytes_per_cycle()),
            (
                "l2",
                (tot.l2_read + tot.hbm_read) as f64 / p.l2_bytes_per_cycle(),
            ),
        ];
        let (bound_unit, roof) =
            terms.iter().copied().fold(
                ("matrix", 0.0f64),
                |acc, (n, v)| if v > acc.1 { (n, v) } else { acc },
            );
        let roofline_cycles = roof.ceil() as u64;
        let bound = if matches!(bound_unit, "matrix" | "vector") {
            "compute"
        } else {
            "memory"
        };
        let dominant = tot
            .matrix_dtypes
            .iter()
            .max_by_key(|(_, f)| **f)
            .map(|(d, _)| *d);
        let peak_tflops = match dominant.and_then(|d| p.matrix.flop_per_cycle.get(d)) {
            Some(rate) => rate * cores as f64 * p.clock_ghz / 1e3,
            None => p.vector.f32_lanes as f64 * cores as f64 * p.clock_ghz / 1e3,
        };
        let secs = time_us * 1e-6;
        let engine_utilization = Engine::ALL
            .iter()
            .map(|e| {
                (
                    e.name(),
                    tot.busy[e.index()] as f64 / (cycles as f64 * cores as f64),
                )
            })
            .collect();
        let lines = tot
            .lines
            .iter()
            .map(|(line, s)| LineReport {
                line: *line,
                code: (inp.line_code)(*line),
                count: s.count,
                cycles: s.busy.iter().sum(),
                engines: Engine::ALL
                    .iter()
                    .filter(|e| s.busy[e.index()] > 0)
                    .map(|e| (e.name(), s.busy[e.index()]))
                    .collect(),
                stall: s.stall,
            })
            .collect();
        Report {
            kernel: inp.kernel.to_string(),
            device: p.name.clone(),
            config: inp.config,
            grid: inp.grid,
            programs,
            cores,
            waves: programs.div_ceil(cores),
            cycles,
            time_us,
            flop,
            issued_flop,
            matrix_flop: tot.matrix_flop,
            vector_ops: tot.vector_ops,
            hbm_bytes,
            hbm_read_bytes: tot.hbm_read,
            hbm_write_bytes: tot.hbm_write,
            l2_bytes: tot.l2_read,
            achieved_tflops: flop as f64 / secs / 1e12,
            peak_tflops,
            achieved_hbm_gbps: hbm_bytes as f64 / secs / 1e9,
            peak_hbm_gbps: p.hbm.bandwidth_gbps,
            arithmetic_intensity: if hbm_bytes > 0 {
                flop as f64 / hbm_bytes as f64
            } else {
                f64::INFINITY
            },
            bound,
            bound_unit,
            roofline_cycles,
            roofline_fraction: roofline_cycles as f64 / cycles as f64,
            engine_utilization,
            exposed_dma_cycles: inp.exposed_dma,
            sram_peak_bytes: tot.sram_peak,
            sram_reserved_peak_bytes: tot.sram_reserved_peak,
            sram_capacity_bytes: p.sram.bytes_per_core,
            max_rel_error: None,
            cost_only: inp.cost_only,
            simulated_programs: inp.simulated_programs,
            lines,
        }
    }

    /// The report of launches run one after another (an operator made of several kernels):
    /// cycles, time, work, traffic and roofline add up; utilisation is weighted by cycles; the
    /// bound is that of the part with the largest roofline time; lines are prefixed by their kernel.
    pub fn chain(name: &str, parts: &[Report]) -> Option<Report> {
        let first = parts.first()?;
        let mut r = first.clone();
        r.kernel = name.to_string();
        let sum = |f: fn(&Report) -> u64| parts.iter().map(f).sum::<u64>();
        r.cycles = sum(|p| p.cycles);
        r.time_us = parts.iter().map(|p| p.time_us).sum();
        r.flop = sum(|p| p.flop);
        r.issued_flop = sum(|p| p.issued_flop);
        r.matrix_flop = sum(|p| p.matrix_flop);
        r.vector_ops = sum(|p| p.vector_ops);
        r.hbm_read_bytes = sum(|p| p.hbm_read_bytes);
        r.hbm_write_bytes = sum(|p| p.hbm_write_bytes);
        r.hbm_bytes = r.hbm_read_bytes + r.hbm_write_bytes;
        r.l2_bytes = sum(|p| p.l2_bytes);
        r.roofline_cycles = sum(|p| p.roofline_cycles);
        r.exposed_dma_cycles = sum(|p| p.exposed_dma_cycles);
        r.programs = sum(|p| p.programs);
        r.simulated_programs = sum(|p| p.simulated_programs);
        r.waves = sum(|p| p.waves);
        r.sram_peak_bytes = parts.iter().map(|p| p.sram_peak_bytes).max().unwrap_or(0);
        r.sram_reserved_peak_bytes = parts
            .iter()
            .map(|p| p.sram_reserved_peak_bytes)
            .max()
            .unwrap_or(0);
        r.peak_tflops = parts.iter().map(|p| p.peak_tflops).fold(0.0, f64::max);
        let secs = r.time_us * 1e-6;
        r.achieved_tflops = r.flop as f64 / secs / 1e12;
        r.achieved_hbm_gbps = r.hbm_bytes as f64 / secs / 1e9;
        r.arithmetic_intensity = if r.hbm_bytes > 0 {
            r.flop as f64 / r.hbm_bytes as f64
        } else {
            f64::INFINITY
        };
        r.roofline_fraction = r.roofline_cycles as f64 / r.cycles.max(1) as f64;
        let dominant = parts
            .iter()
            .max_by_key(|p| p.roofline_cycles)
            .unwrap_or(first);
        r.bound = dominant.bound;
        r.bound_unit = dominant.bound_unit;
        for (k, v) in r.engine_utilization.iter_mut() {
            *v = parts
                .iter()
                .map(|p| p.engine_utilization.get(k).copied().unwrap_or(0.0) * p.cycles as f64)
                .sum::<f64>()
                / r.cycles.max(1) as f64;
        }
        r.config = parts
            .iter()
            .flat_map(|p| {
                p.config
                    .iter()
                    .map(move |(k, v)| (format!("{}.{k}", p.kernel), *v))
            })
            .collect();
        r.grid = [r.programs, 1, 1];
        r.max_rel_error = parts
            .iter()
            .filter_map(|p| p.max_rel_error)
            .reduce(f64::max);
        r.cost_only = parts.iter().any(|p| p.cost_only);
        r.lines = parts
            .iter()
            .flat_map(|p| {
                p.lines.iter().map(move |l| LineReport {
                    code: format!("{}: {}", p.kernel, l.code),
                    ..l.clone()
                })
            })
            .collect();
        Some(r)
    }

    /// The physical invariants this report must keep on device `p`, as a list of violations
    /// (empty: none). A simulator that beats physics is wrong, not fast:
    /// - cycles ≥ the roofline;
    /// - HBM moved no more than its bandwidth allows in `cycles`, nor L2 (hits and misses cross it);
    /// - no engine busy more than all of the time;
    /// - SRAM, live and reserved, within the capacity of a core at every instant;
    /// - useful work within the work issued.
    pub fn check_physics(&self, p: &DevicePreset) -> Vec<String> {
        let mut v = Vec::new();
        let cycles = self.cycles as f64;
        // Slack for the roofline's and the rates' rounding to whole cycles.
        let slack = |x: f64| x * (1.0 + 1e-9) + 1.0;
        if self.cycles < self.roofline_cycles {
            v.push(format!(
                "{}: {} cycles under the roofline's {} ({})",
                self.kernel, self.cycles, self.roofline_cycles, self.bound_unit
            ));
        }
        let hbm_max = slack(p.hbm_bytes_per_cycle() * cycles);
        if self.hbm_bytes as f64 > hbm_max {
            v.push(format!(
                "{}: {} HBM bytes in {} cycles: {:.1} GB/s over the peak {:.1}",
                self.kernel,
                self.hbm_bytes,
                self.cycles,
                self.achieved_hbm_gbps,
                self.peak_hbm_gbps
            ));
        }
        let l2 = (self.l2_bytes + self.hbm_read_bytes) as f64;
        if l2 > slack(p.l2_bytes_per_cycle() * cycles) {
            v.push(format!(
                "{}: {l2} bytes through L2 in {} cycles: over its {:.1} bytes/cycle",
                self.kernel,
                self.cycles,
                p.l2_bytes_per_cycle()
            ));
        }
        for (e, u) in &self.engine_utilization {
            if *u > 1.0 + 1e-9 {
                v.push(format!("{}: {e} utilisation {u} > 1", self.kernel));
            }
        }
        for (what, b) in [
            ("live", self.sram_peak_bytes),
            ("reserved", self.sram_reserved_peak_bytes),
        ] {
            if b > self.sram_capacity_bytes {
                v.push(format!(
                    "{}: {what} SRAM {b} bytes over the capacity {}",
                    self.kernel, self.sram_capacity_bytes
                ));
            }
        }
        if self.sram_peak_bytes > self.sram_reserved_peak_bytes {
            v.push(format!(
                "{}: live SRAM {} above the reserved peak {}",
                self.kernel, self.sram_peak_bytes, self.sram_reserved_peak_bytes
            ));
        }
        if self.flop > self.issued_flop {
            v.push(format!(
                "{}: useful FLOP {} above the FLOP issued {}",
                self.kernel, self.flop, self.issued_flop
            ));
        }
        if self.roofline_fraction > 1.0 + 1e-9 {
            v.push(format!(
                "{}: roofline fraction {}",
                self.kernel, self.roofline_fraction
            ));
        }
        v
    }

    /// One line for suite listings: name, cycles, time, bound, roofline fraction.
    pub fn summary_line(&self) -> String {
        format!(
            "{:<22} {:>12} cycles {:>10.2} us  {:>7.2} TFLOP/s  {:>8.1} GB/s  {:<7} ({:<6}) {:>5.1}% of roofline  SRAM {:>7} B{}",
            self.kernel,
            self.cycles,
            self.time_us,
            self.achieved_tflops,
            self.achieved_hbm_gbps,
            self.bound,
            self.bound_unit,
            100.0 * self.roofline_fraction,
            self.sram_peak_bytes,
            match self.max_rel_error {
                Some(e) => format!("  max rel err {e:.2e}"),
                None => String::new(),
            }
        )
    }

    /// A readable multi-line table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let cfg: Vec<String> = self
            .config
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            s,
            "kernel {}  on {}  [{}]{}",
            self.kernel,
            self.device,
            cfg.join(" "),
            if self.cost_only { "  (cost-only)" } else { "" }
        );
        let _ = writeln!(
            s,
            "  grid {}x{}x{} = {} programs on {} cores ({} waves)",
            self.grid[0], self.grid[1], self.grid[2], self.programs, self.cores, self.waves
        );
        let _ = writeln!(
            s,
            "  cycles            {:>14}   ({:.2} us)",
            self.cycles, self.time_us
        );
        let _ = writeln!(
            s,
            "  roofline          {:>14}   {} bound ({}), {:.1}% of roofline",
            self.roofline_cycles,
            self.bound,
            self.bound_unit,
            100.0 * self.roofline_fraction
        );
        let _ = writeln!(
            s,
            "  FLOP              {:>14}   {:.2} / {:.2} TFLOP/s achieved / peak",
            self.flop, self.achieved_tflops, self.peak_tflops
        );
        let _ = writeln!(
            s,
            "  HBM bytes         {:>14}   read {} write {}; {:.1} / {:.1} GB/s",
            self.hbm_bytes,
            self.hbm_read_bytes,
            self.hbm_write_bytes,
            self.achieved_hbm_gbps,
            self.peak_hbm_gbps
        );
        let _ = writeln!(s, "  L2 hit bytes      {:>14}", self.l2_bytes);
        let _ = writeln!(
            s,
            "  exposed DMA       {:>14}   cycles on the critical core",
            self.exposed_dma_cycles
        );
        let _ = writeln!(
            s,
            "  SRAM peak/core    {:>14}   of {} bytes",
            self.sram_peak_bytes, self.sram_capacity_bytes
        );
        let util: Vec<String> = self
            .engine_utilization
            .iter()
            .map(|(k, v)| format!("{k} {:.1}%", 100.0 * v))
            .collect();
        let _ = writeln!(s, "  utilisation       {}", util.join(", "));
        if let Some(e) = self.max_rel_error {
            let _ = writeln!(s, "  max rel error     {e:>14.3e}   vs f64 reference");
        }
        let _ = writeln!(s, "  per line (busy engine cycles, all programs):");
        for l in &self.lines {
            let eng: Vec<String> = l.engines.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(
                s,
                "    {:>4} | {:<60} | {:>12} cyc x{:<7} {}{}",
                l.line,
                truncate(&l.code, 60),
                l.cycles,
                l.count,
                eng.join(" "),
                if l.stall > 0 {
                    format!(" stall={}", l.stall)
                } else {
                    String::new()
                }
            );
        }
        s
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}
