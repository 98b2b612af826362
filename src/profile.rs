//! `day0 profile`: a kernel's source with, for each line, the cycles it took, the engine it
//! occupied and what it waited on — a line profiler of the simulated launch.
//!
//! The launch's wall time is its critical core's timeline (the core that finishes last). Every
//! cycle of that timeline is charged to one line: the line of the instruction busy on the most
//! critical engine at that cycle — matrix, then vector (compute), then DMA in, then DMA out — so
//! a cycle where only a load runs is that load's exposed DMA time ("waiting on DMA"), and a cycle
//! where the matrix unit runs while tiles stream in is the matrix line's (the load is hidden).
//! Cycles where no engine of the core is busy (dependencies, queue latency, the launch's start
//! and drain) are `idle`. The lines' cycles plus `idle` add up to the launch's cycles exactly.
//! Engine busy cycles over all cores and the issue-stream stalls come from the report's per-line
//! statistics, which the simulator keeps for every launch.

use crate::tune::{self, Shape};
use accel_sim::Report;
use dsl_core::{KernelMeta, Launcher};
use kernels::gemm::GemmDtype;
use serde::Serialize;
use std::collections::BTreeMap;

/// One source line of the profile.
#[derive(Debug, Clone, Serialize)]
pub struct LineProfile {
    /// Line number in the kernel's source file.
    pub line: u32,
    /// The line's code.
    pub code: String,
    /// Critical-path cycles charged to the line.
    pub cycles: u64,
    /// Of those, cycles on the matrix or vector unit.
    pub compute_cycles: u64,
    /// Of those, cycles where only this line's DMA ran: waiting on DMA.
    pub dma_wait_cycles: u64,
    /// The engine most of its charged cycles were on (`-` when none were charged).
    pub engine: String,
    /// Busy cycles per engine, summed over every program on every core.
    pub busy: BTreeMap<String, u64>,
    /// Issue-stream stall cycles on its blocking instructions, summed over every program.
    pub stall: u64,
    /// Instructions it issued, over every program.
    pub count: u64,
}

/// A line profile of one launch (the `--json` object).
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    /// Kernel name.
    pub kernel: String,
    /// Tiles it ran with.
    pub config: BTreeMap<String, i64>,
    /// The shape, canonical.
    pub shape: String,
    /// Device preset.
    pub device: String,
    /// The launch's cycles.
    pub cycles: u64,
    /// The core whose timeline is the launch's wall time.
    pub critical_core: u64,
    /// Critical-path cycles with no engine of that core busy.
    pub idle_cycles: u64,
    /// Every line of the kernel that issued or was charged, in source order.
    pub lines: Vec<LineProfile>,
}

/// One instruction on a core's timeline.
#[derive(Debug, Clone, Copy)]
struct Event {
    engine: usize,
    start: u64,
    end: u64,
    line: u32,
}

/// Engines in the order a cycle is charged: compute before DMA.
const PRIORITY: [usize; 4] = [
    accel_sim::isa::Engine::Matrix.index(),
    accel_sim::isa::Engine::Vector.index(),
    accel_sim::isa::Engine::DmaIn.index(),
    accel_sim::isa::Engine::DmaOut.index(),
];

/// The timeline events of every core, from the launch's Chrome trace.
fn events(trace_json: &str) -> Result<BTreeMap<u64, Vec<Event>>, String> {
    let v: serde_json::Value =
        serde_json::from_str(trace_json).map_err(|e| format!("the trace does not parse: {e}"))?;
    let mut cores: BTreeMap<u64, Vec<Event>> = BTreeMap::new();
    for e in v["traceEvents"].as_array().into_iter().flatten() {
        if e["ph"] != "X" {
            continue;
        }
        let num = |x: &serde_json::Value| x.as_u64().ok_or("a trace event without its numbers");
        let start = num(&e["args"]["start_cycle"])?;
        cores.entry(num(&e["pid"])?).or_default().push(Event {
            engine: num(&e["tid"])? as usize,
            start,
            end: start + num(&e["args"]["cycles"])?,
            line: num(&e["args"]["line"])? as u32,
        });
    }
    Ok(cores)
}

/// Charges every cycle of `0..total` of one core's timeline (see the module docs): per line
/// (cycles, compute cycles, DMA-wait cycles, cycles per engine), and the idle cycles.
fn attribute(events: &[Event], total: u64) -> (BTreeMap<u32, [u64; 7]>, u64) {
    let mut cuts: Vec<u64> = events
        .iter()
        .flat_map(|e| [e.start.min(total), e.end.min(total)])
        .chain([0, total])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut by_start: Vec<&Event> = events.iter().collect();
    by_start.sort_by_key(|e| e.start);
    let mut next = 0;
    let mut active: Vec<&Event> = Vec::new();
    let mut lines: BTreeMap<u32, [u64; 7]> = BTreeMap::new();
    let mut idle = 0;
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        while next < by_start.len() && by_start[next].start <= a {
            active.push(by_start[next]);
            next += 1;
        }
        active.retain(|e| e.end > a);
        let busy = PRIORITY
            .iter()
            .find_map(|&eng| active.iter().find(|e| e.engine == eng));
        match busy {
            Some(e) => {
                let s = lines.entry(e.line).or_default();
                s[0] += b - a;
                if e.engine == accel_sim::isa::Engine::Matrix.index()
                    || e.engine == accel_sim::isa::Engine::Vector.index()
                {
                    s[1] += b - a;
                } else {
                    s[2] += b - a;
                }
                s[3 + e.engine] += b - a;
            }
            None => idle += b - a,
        }
    }
    (lines, idle)
}

/// Profiles `meta` at `config` and `shape` on `launcher`'s device (cost-only: the timeline does
/// not depend on the values).
pub fn profile(
    launcher: &Launcher,
    meta: &'static KernelMeta,
    config: &dsl_core::Config,
    shape: &Shape,
    dtype: GemmDtype,
) -> Result<Profile, String> {
    let traced = launcher
        .clone()
        .with_backend(dsl_core::Backend::CostOnly)
        .with_memo(false)
        .with_trace(true);
    let (report, trace) = tune::evaluate_traced(&traced, meta, config, shape, dtype)
        .map_err(|e| format!("{}: {e}", meta.name))?;
    let trace = trace.ok_or_else(|| {
        format!(
            "{} runs as more than one launch here, so it has no single timeline to profile",
            meta.name
        )
    })?;
    if trace.dropped > 0 {
        return Err(format!(
            "the launch has more instructions than a trace keeps ({} dropped): profile a smaller \
             --shape",
            trace.dropped
        ));
    }
    from_timeline(meta, &report, &trace.to_json(), shape)
}

/// The profile of a launch from its report and its Chrome trace.
fn from_timeline(
    meta: &KernelMeta,
    report: &Report,
    trace_json: &str,
    shape: &Shape,
) -> Result<Profile, String> {
    let cores = events(trace_json)?;
    let (critical_core, evs) = cores
        .iter()
        .max_by_key(|(core, evs)| {
            (
                evs.iter().map(|e| e.end).max().unwrap_or(0),
                u64::MAX - **core,
            )
        })
        .map(|(c, e)| (*c, e.as_slice()))
        .unwrap_or((0, &[]));
    let (charged, idle) = attribute(evs, report.cycles);
    let mut lines: BTreeMap<u32, LineProfile> = BTreeMap::new();
    let code_of = |line: u32| {
        meta.lines
            .iter()
            .find(|(l, _)| *l == line)
            .map(|(_, c)| c.to_string())
            .unwrap_or_default()
    };
    let blank = |line: u32| LineProfile {
        line,
        code: code_of(line),
        cycles: 0,
        compute_cycles: 0,
        dma_wait_cycles: 0,
        engine: "-".into(),
        busy: BTreeMap::new(),
        stall: 0,
        count: 0,
    };
    for lr in &report.lines {
        let p = lines.entry(lr.line).or_insert_with(|| blank(lr.line));
        p.busy = lr
            .engines
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        p.stall = lr.stall;
        p.count = lr.count;
        if !lr.code.is_empty() {
            p.code = lr.code.clone();
        }
    }
    for (line, s) in charged {
        let p = lines.entry(line).or_insert_with(|| blank(line));
        p.cycles = s[0];
        p.compute_cycles = s[1];
        p.dma_wait_cycles = s[2];
        let top = (0..4).max_by_key(|&i| (s[3 + i], std::cmp::Reverse(i)));
        if let Some(i) = top.filter(|&i| s[3 + i] > 0) {
            p.engine = accel_sim::isa::Engine::ALL[i].name().to_string();
        }
    }
    Ok(Profile {
        kernel: meta.name.to_string(),
        config: report.config.clone(),
        shape: shape.canonical(),
        device: report.device.clone(),
        cycles: report.cycles,
        critical_core,
        idle_cycles: idle,
        lines: lines.into_values().collect(),
    })
}

/// The profile as annotated source: each line with its cycles, share, engine and waits.
pub fn table(p: &Profile) -> String {
    let cfg = dsl_core::Config(p.config.clone());
    let mut s = format!(
        "{} {} at {} on {}: {} cycles (critical path of core {})\n",
        p.kernel, cfg, p.shape, p.device, p.cycles, p.critical_core
    );
    s.push_str(&format!(
        "{:>5} {:>10} {:>6} {:<8} {:>10} {:>10} {:>10}  code\n",
        "line", "cycles", "share", "engine", "compute", "dma wait", "stall"
    ));
    let share = |c: u64| 100.0 * c as f64 / p.cycles.max(1) as f64;
    for l in &p.lines {
        s.push_str(&format!(
            "{:>5} {:>10} {:>5.1}% {:<8} {:>10} {:>10} {:>10}  {}\n",
            l.line,
            l.cycles,
            share(l.cycles),
            l.engine,
            l.compute_cycles,
            l.dma_wait_cycles,
            l.stall,
            l.code
        ));
    }
    s.push_str(&format!(
        "{:>5} {:>10} {:>5.1}% (no engine of the core busy: dependencies, latency, launch and \
         drain)\n",
        "idle",
        p.idle_cycles,
        share(p.idle_cycles)
    ));
    s.push_str(
        "cycles: the critical core's timeline charged to the line busy on the most critical \
         engine (matrix > vector > dma_in > dma_out); compute / dma wait split it; stall: \
         issue-stream stalls on the line's blocking instructions, all programs\n",
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_engines_charge_compute_first_and_idle_the_gaps() {
        let ev = |engine: accel_sim::isa::Engine, start, end, line| Event {
            engine: engine.index(),
            start,
            end,
            line,
        };
        use accel_sim::isa::Engine::*;
        // A load alone (exposed), then a matmul while the next load streams (hidden), a gap,
        // then a store.
        let events = [
            ev(DmaIn, 0, 10, 1),
            ev(Matrix, 10, 30, 2),
            ev(DmaIn, 12, 25, 1),
            ev(DmaOut, 35, 40, 3),
        ];
        let (lines, idle) = attribute(&events, 45);
        assert_eq!(lines[&1], [10, 0, 10, 10, 0, 0, 0]);
        assert_eq!(lines[&2], [20, 20, 0, 0, 0, 20, 0]);
        assert_eq!(lines[&3], [5, 0, 5, 0, 5, 0, 0]);
        assert_eq!(idle, 10, "30..35 and 40..45");
        let charged: u64 = lines.values().map(|s| s[0]).sum();
        assert_eq!(charged + idle, 45);
    }
}
