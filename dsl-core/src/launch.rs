//! Launching a kernel: kernel metadata, tunable configurations, backends and the launcher.

use crate::ctx::Ctx;
use crate::hazard::{self, ArgView, Hazards, ProgramHazards, ProgramLog};
use crate::memo::{ArgKey, LaunchMemo};
use crate::tuning::Tuning;
use accel_sim::manual::ManualProgram;
use accel_sim::program::{ProgramTrace, References, ShapesHandle, MAX_REFERENCES};
use accel_sim::schedule::{LaunchInfo, LaunchSim};
use accel_sim::trace::ChromeTrace;
use accel_sim::{DevicePreset, Report, SimError};
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What `#[kernel]` knows about a kernel, available at run time.
#[derive(Debug, Clone, Copy)]
pub struct KernelMeta {
    /// Kernel name (the function's name).
    pub name: &'static str,
    /// Parameter names, in order.
    pub params: &'static [&'static str],
    /// Tunable parameters and their allowed values, as declared in `tunable(...)`.
    pub tunables: &'static [(&'static str, &'static [i64])],
    /// The points of the tunable space the kernel is instantiated for, each the tunables' values
    /// in declaration order, when `constraint(...)` prunes the space; empty when every point of the
    /// product is.
    pub points: &'static [&'static [i64]],
    /// The text of each `constraint(...)` condition (empty when there are none).
    pub constraints: &'static [&'static str],
    /// Source text of each line that issues instructions: (line, code).
    pub lines: &'static [(u32, &'static str)],
    /// Source file of the kernel.
    pub file: &'static str,
    /// A hash (64-bit FNV-1a) of the kernel's source as written: its signature, attributes and
    /// body, so caches keyed by it (`day0 tune`'s) never serve an edited kernel's results. The
    /// helpers it calls are items of their own and not included.
    pub source_hash: u64,
}

/// One choice of tunable values, e.g. `BM=128 BN=128 BK=64`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Config(pub BTreeMap<String, i64>);

impl Config {
    /// An empty configuration.
    pub fn new() -> Config {
        Config::default()
    }

    /// Sets `name` to `value`.
    pub fn with(mut self, name: &str, value: i64) -> Config {
        self.0.insert(name.to_string(), value);
        self
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<i64> {
        self.0.get(name).copied()
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(" "))
    }
}

impl KernelMeta {
    /// Every configuration of the tunable space (the cartesian product in declaration order, less
    /// the points the constraints exclude).
    pub fn space(&self) -> Vec<Config> {
        if !self.points.is_empty() {
            return self.points.iter().map(|p| self.config_of(p)).collect();
        }
        let mut out = vec![Config::new()];
        for (name, values) in self.tunables {
            out = out
                .into_iter()
                .flat_map(|c| values.iter().map(move |v| c.clone().with(name, *v)))
                .collect();
        }
        out
    }

    /// The smallest listed value of `tunable` that is at least `want` (a tile that covers a
    /// problem dimension); the error names `what` the dimension is and the largest tile.
    pub fn smallest_fitting(
        &self,
        tunable: &str,
        want: usize,
        what: &str,
    ) -> Result<i64, SimError> {
        let values = self
            .tunables
            .iter()
            .find(|(n, _)| *n == tunable)
            .map(|(_, v)| *v)
            .unwrap_or(&[]);
        values
            .iter()
            .copied()
            .filter(|v| *v as usize >= want)
            .min()
            .ok_or_else(|| SimError::Launch {
                kernel: self.name.to_string(),
                message: format!(
                    "{what} = {want} exceeds the kernel's largest {tunable} ({:?})",
                    values.iter().max()
                ),
            })
    }

    /// The first listed value of every tunable (the first point of a constrained space).
    pub fn default_config(&self) -> Config {
        match self.points.first() {
            Some(p) => self.config_of(p),
            None => self
                .tunables
                .iter()
                .fold(Config::new(), |c, (n, v)| c.with(n, v[0])),
        }
    }

    /// The configuration of one point (tunable values in declaration order).
    fn config_of(&self, point: &[i64]) -> Config {
        self.tunables
            .iter()
            .zip(point)
            .fold(Config::new(), |c, ((n, _), v)| c.with(n, *v))
    }

    /// Whether `config` (fully resolved) is a point the kernel is instantiated for.
    pub fn contains(&self, config: &Config) -> bool {
        let values_ok = self
            .tunables
            .iter()
            .all(|(n, v)| config.get(n).is_some_and(|x| v.contains(&x)));
        values_ok
            && (self.points.is_empty()
                || self.points.iter().any(|p| {
                    self.tunables
                        .iter()
                        .zip(p.iter())
                        .all(|((n, _), v)| config.get(n) == Some(*v))
                }))
    }

    /// Resolves `config` against the declared space: fills unset tunables with their first value and
    /// rejects unknown names and unlisted values, naming what is allowed.
    pub fn resolve(&self, config: &Config) -> Result<Config, SimError> {
        let mut out = Config::new();
        for k in config.0.keys() {
            if !self.tunables.iter().any(|(n, _)| n == k) {
                let names: Vec<&str> = self.tunables.iter().map(|(n, _)| *n).collect();
                return Err(SimError::Launch {
                    kernel: self.name.to_string(),
                    message: format!(
                        "`{k}` is not a tunable of this kernel (tunables: {})",
                        if names.is_empty() {
                            "none".into()
                        } else {
                            names.join(", ")
                        }
                    ),
                });
            }
        }
        // In a constrained space, unset tunables take their values from the first point that
        // agrees with the set ones.
        let base = self
            .points
            .iter()
            .find(|p| {
                self.tunables
                    .iter()
                    .zip(p.iter())
                    .all(|((n, _), v)| config.get(n).is_none_or(|x| x == *v))
            })
            .map(|p| self.config_of(p));
        for (name, values) in self.tunables {
            let v = config
                .get(name)
                .or_else(|| base.as_ref().and_then(|b| b.get(name)))
                .unwrap_or(values[0]);
            if !values.contains(&v) {
                return Err(SimError::Launch {
                    kernel: self.name.to_string(),
                    message: format!("tunable {name}={v} is not in the declared values {values:?}; pick one of them or add it to `tunable(...)`"),
                });
            }
            out = out.with(name, v);
        }
        if !self.contains(&out) {
            return Err(SimError::Launch {
                kernel: self.name.to_string(),
                message: format!(
                    "tiles {out} are excluded by the kernel's constraints ({}); pick a combination that meets them",
                    self.constraints.join(", ")
                ),
            });
        }
        Ok(out)
    }
}

/// A grid of programs: 1 to 3 axes.
pub trait IntoGrid {
    /// The grid as three axes (missing axes are 1).
    fn into_grid(self) -> [usize; 3];
}

impl IntoGrid for usize {
    fn into_grid(self) -> [usize; 3] {
        [self, 1, 1]
    }
}
impl IntoGrid for (usize,) {
    fn into_grid(self) -> [usize; 3] {
        [self.0, 1, 1]
    }
}
impl IntoGrid for (usize, usize) {
    fn into_grid(self) -> [usize; 3] {
        [self.0, self.1, 1]
    }
}
impl IntoGrid for (usize, usize, usize) {
    fn into_grid(self) -> [usize; 3] {
        [self.0, self.1, self.2]
    }
}

/// Which semantics a launch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Real data through the functional (SIMD) semantics, plus timing.
    Functional,
    /// Shapes only: no tensor data is allocated or computed; timing is identical to functional.
    CostOnly,
}

/// The result of a launch: the report and, if requested, the Chrome trace.
#[derive(Debug)]
pub struct Launch {
    /// What the launch cost.
    pub report: Report,
    /// Timeline, when the launcher was asked for one.
    pub trace: Option<ChromeTrace>,
}

/// Runs kernels on a device preset.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The device.
    pub preset: DevicePreset,
    /// Functional or cost-only.
    pub backend: Backend,
    /// Host threads for functional execution (`None` = rayon's global pool). Results and cycles do
    /// not depend on it.
    pub threads: Option<usize>,
    /// Record a Chrome trace.
    pub trace: bool,
    /// Reports of cost-only launches already simulated, shared by this launcher's clones (see
    /// [`crate::memo`]); `None` simulates every launch.
    pub memo: Option<Arc<LaunchMemo>>,
    /// Hazard checks of functional launches (see [`crate::hazard`]): on by default unless
    /// `DAY0_HAZARDS=0`; coverage and non-finite checks opt-in.
    pub hazards: Hazards,
    /// Sample long steady launches and skip windows of like programs (see
    /// [`accel_sim::schedule`]): on unless `DAY0_SAMPLING=0` (every program timed). It moves
    /// single launches by up to ~0.5% and the release-day TTFT by ~0.1%, for 1.5–3× less host
    /// time on long prefills (BENCHMARKS.md, session 15). Functional and cost-only launches
    /// sample alike, so their cycles stay equal.
    pub sampling: bool,
    /// Print one line per simulated launch to stderr (kernel, grid, tiles, programs timed,
    /// cycles, host seconds): on when `DAY0_LAUNCH_LOG=1`, to see where a command's host time
    /// goes. Launches answered from the memo are not simulated and not printed.
    pub log: bool,
    /// Tuned tile configurations that override the heuristic tiles of the call sites that ask
    /// [`Launcher::tiles`] (see [`crate::tuning`]); `None` keeps every heuristic.
    pub tuning: Option<Arc<Tuning>>,
}

impl Launcher {
    /// A functional launcher on `preset`.
    pub fn new(preset: DevicePreset) -> Launcher {
        Launcher {
            preset,
            backend: Backend::Functional,
            threads: None,
            trace: false,
            memo: None,
            hazards: Hazards::from_env(),
            sampling: !std::env::var("DAY0_SAMPLING").is_ok_and(|v| v.trim() == "0"),
            log: std::env::var("DAY0_LAUNCH_LOG").is_ok_and(|v| v.trim() == "1"),
            tuning: None,
        }
    }

    /// Same launcher, launching `tuning`'s configurations where it holds the launch (see
    /// [`Launcher::tiles`]); the launcher's clones share the table.
    pub fn with_tuning(mut self, tuning: Option<Arc<Tuning>>) -> Launcher {
        self.tuning = tuning;
        self
    }

    /// The tiles of `meta`'s launch at `key` (the shapes the launch depends on, e.g.
    /// `m=8192,n=7168,k=2048`): the tuning table's when it holds that launch, else `heuristic`.
    /// Only call sites whose every declared configuration computes the same numbers ask.
    pub fn tiles(&self, meta: &KernelMeta, key: &str, heuristic: Config) -> Config {
        match &self.tuning {
            Some(t) => t.choose(meta.name, key, heuristic),
            None => heuristic,
        }
    }

    /// Same launcher, sampling long steady launches (`on`) or timing every program (see
    /// [`accel_sim::schedule`]). A memo, if any, is started afresh: its reports were timed
    /// the other way.
    pub fn with_sampling(mut self, on: bool) -> Launcher {
        self.sampling = on;
        if self.memo.is_some() {
            self.memo = Some(Arc::new(LaunchMemo::new(&self.preset)));
        }
        self
    }

    /// Same launcher with hazard checks on or off (bounds, unwritten tiles, races between
    /// programs; see [`crate::hazard`]). Off is the fastest functional launch; the opt-in checks
    /// keep their settings.
    pub fn with_hazards(mut self, on: bool) -> Launcher {
        self.hazards.enabled = on;
        self
    }

    /// Same launcher, checking (`on`) that every element of every tensor argument a launch stores
    /// into is written by some program (a grid that misses part of an output).
    pub fn with_coverage(mut self, on: bool) -> Launcher {
        self.hazards.coverage = on;
        self
    }

    /// Same launcher, making (`on`) a store of NaN or ±∞ an error naming the line, the tensor and
    /// the element: the first launch and line that produce a non-finite value (what the CLI's
    /// `--check-finite` asks for).
    pub fn with_check_finite(mut self, on: bool) -> Launcher {
        self.hazards.check_finite = on;
        self
    }

    /// Loads a preset by name (or `.toml` path) and makes a functional launcher.
    pub fn for_device(name: &str) -> Result<Launcher, SimError> {
        Ok(Launcher::new(DevicePreset::load(name)?))
    }

    /// Same launcher with another backend.
    pub fn with_backend(mut self, backend: Backend) -> Launcher {
        self.backend = backend;
        self
    }

    /// Same launcher with a fixed host thread count: its launches run on a pool of that many
    /// workers, built once per count and shared by every launcher asking for it (launches from
    /// several host threads at once queue on it).
    pub fn with_threads(mut self, threads: usize) -> Launcher {
        self.threads = Some(threads);
        self
    }

    /// Same launcher, recording a trace.
    pub fn with_trace(mut self, on: bool) -> Launcher {
        self.trace = on;
        self
    }

    /// Same launcher with a fresh launch memo (`on`) or none: cost-only launches that cannot be
    /// told apart from one already simulated return its report (see [`crate::memo`]). The
    /// launcher's clones share the memo.
    pub fn with_memo(mut self, on: bool) -> Launcher {
        self.memo = on.then(|| Arc::new(LaunchMemo::new(&self.preset)));
        self
    }

    /// (launches answered from the memo, launches simulated into it); (0, 0) without a memo.
    pub fn memo_counts(&self) -> (u64, u64) {
        self.memo.as_ref().map_or((0, 0), |m| m.counts())
    }

    /// [`Launcher::run`], answered from the launch memo when the launcher has one, the launch is
    /// cost-only, no trace is asked for, and `describe` (which writes every argument's
    /// [`crate::memo::LaunchArg`] description) matches a launch already simulated. Called by the
    /// code `#[kernel]` generates.
    pub fn run_keyed(
        &self,
        meta: &KernelMeta,
        config: &Config,
        grid: [usize; 3],
        describe: &dyn Fn(&mut ArgKey),
        body: &(dyn Fn(&mut Ctx) + Sync),
    ) -> Result<Launch, SimError> {
        if let Some(l) = self.memoised(meta, config, grid, describe, &|| {
            self.run(meta, config, grid, body).map(|l| l.report)
        }) {
            return l;
        }
        if self.backend != Backend::Functional || !self.hazards.any() {
            return self.run(meta, config, grid, body);
        }
        // Name the tensor arguments in hazard messages.
        let mut key = ArgKey::views_only();
        describe(&mut key);
        let args: Vec<ArgView> = key
            .into_views()
            .into_iter()
            .map(|(i, mem, offset, rows, cols, stride)| ArgView {
                name: meta.params.get(i).copied().unwrap_or("?"),
                mem,
                offset,
                rows,
                cols,
                stride,
            })
            .collect();
        self.run_with(meta, config, grid, Arc::from(args), body)
    }

    /// Runs `body` once per program of `grid` and simulates the launch. Called by the code
    /// `#[kernel]` generates; `config` must already be resolved.
    ///
    /// The body is a trait object so the launch machinery (rayon, timing) is compiled once, not
    /// once per kernel instantiation of the tunable space.
    pub fn run(
        &self,
        meta: &KernelMeta,
        config: &Config,
        grid: [usize; 3],
        body: &(dyn Fn(&mut Ctx) + Sync),
    ) -> Result<Launch, SimError> {
        self.run_with(meta, config, grid, Arc::from(Vec::new()), body)
    }

    /// [`Launcher::run`] with the launch's tensor arguments, which hazard messages name.
    fn run_with(
        &self,
        meta: &KernelMeta,
        config: &Config,
        grid: [usize; 3],
        args: Arc<[ArgView]>,
        body: &(dyn Fn(&mut Ctx) + Sync),
    ) -> Result<Launch, SimError> {
        self.logged(meta.name, config, grid, &|| {
            self.run_inner(meta, config, grid, &args, body)
        })
    }

    /// Runs a hand-written kernel ([`accel_sim::manual`]): `body` issues program `pid`'s
    /// operations, and the launch is timed as a `#[kernel]`'s is (same sampling; memo-free, see
    /// [`Launcher::run_manual_keyed`]).
    /// `source` is the kernel's source file, whose lines name the profile's rows.
    pub fn run_manual(
        &self,
        kernel: &'static str,
        source: &'static str,
        config: &Config,
        grid: [usize; 3],
        body: &(dyn Fn([usize; 3], &mut ManualProgram) + Sync),
    ) -> Result<Launch, SimError> {
        let lines: Vec<(u32, &str)> = source
            .lines()
            .enumerate()
            .map(|(i, l)| (i as u32 + 1, l.trim()))
            .collect();
        let functional = self.backend == Backend::Functional;
        let sram = self.preset.sram.bytes_per_core;
        self.logged(kernel, config, grid, &|| {
            let run_one = |i: usize, reference: Option<&References>| {
                let mut p = ManualProgram::new(kernel, functional, sram, reference);
                body(pid_of(grid, i), &mut p);
                (p.finish(), None)
            };
            let (sim, _) = self.time_programs(kernel, &lines, config, grid, false, &run_one)?;
            let (report, trace) = sim.finish()?;
            Ok(Launch { report, trace })
        })
    }

    /// [`Launcher::run_manual`], answered from the launch memo as [`Launcher::run_keyed`] is:
    /// `describe` writes every tensor argument's description (a cost-only launch of a
    /// hand-written kernel is a pure function of its kernel, configuration, grid and arguments'
    /// shapes, as a DSL kernel's is).
    pub fn run_manual_keyed(
        &self,
        meta: &KernelMeta,
        source: &'static str,
        config: &Config,
        grid: [usize; 3],
        describe: &dyn Fn(&mut ArgKey),
        body: &(dyn Fn([usize; 3], &mut ManualProgram) + Sync),
    ) -> Result<Launch, SimError> {
        self.memoised(meta, config, grid, describe, &|| {
            self.run_manual(meta.name, source, config, grid, body)
                .map(|l| l.report)
        })
        .unwrap_or_else(|| self.run_manual(meta.name, source, config, grid, body))
    }

    /// The launch answered from (or simulated into) the memo, when the launcher has one, the
    /// launch is cost-only and no trace is asked for; `None` otherwise.
    fn memoised(
        &self,
        meta: &KernelMeta,
        config: &Config,
        grid: [usize; 3],
        describe: &dyn Fn(&mut ArgKey),
        run: &dyn Fn() -> Result<Report, SimError>,
    ) -> Option<Result<Launch, SimError>> {
        let memo = self.memo.as_ref().filter(|m| {
            self.backend == Backend::CostOnly && !self.trace && m.serves(&self.preset)
        })?;
        let mut args = ArgKey::default();
        describe(&mut args);
        Some(
            memo.get_or_run(meta.name, meta.file, config, grid, args, run)
                .map(|report| Launch {
                    report,
                    trace: None,
                }),
        )
    }

    /// Checks the grid, runs `launch` on the launcher's threads, and logs it when asked.
    fn logged(
        &self,
        kernel: &str,
        config: &Config,
        grid: [usize; 3],
        launch: &(dyn Fn() -> Result<Launch, SimError> + Sync),
    ) -> Result<Launch, SimError> {
        if grid.contains(&0) {
            return Err(SimError::Launch {
                kernel: kernel.to_string(),
                message: format!("empty grid {grid:?}: every axis needs at least one program (are the tensors empty?)"),
            });
        }
        let start = self.log.then(std::time::Instant::now);
        let work = || {
            let launch = launch();
            if let (Some(t0), Ok(l)) = (start, &launch) {
                let r = &l.report;
                eprintln!(
                    "day0 launch: {} grid {grid:?} {} {}: {} of {} programs timed, {} cycles, {:.3} s host",
                    kernel,
                    config,
                    if r.cost_only { "cost-only" } else { "functional" },
                    r.simulated_programs,
                    r.programs,
                    r.cycles,
                    t0.elapsed().as_secs_f64()
                );
            }
            launch
        };
        match self.threads {
            Some(n) => thread_pool(n)
                .map_err(|e| SimError::Launch {
                    kernel: kernel.to_string(),
                    message: format!("cannot start {n} threads: {e}"),
                })?
                .install(work),
            None => work(),
        }
    }

    fn run_inner(
        &self,
        meta: &KernelMeta,
        config: &Config,
        grid: [usize; 3],
        args: &Arc<[ArgView]>,
        body: &(dyn Fn(&mut Ctx) + Sync),
    ) -> Result<Launch, SimError> {
        let functional = self.backend == Backend::Functional;
        let checked = functional && self.hazards.any();
        let launch = NEXT_LAUNCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Each program's trace, and in a checked launch the windows it read and wrote.
        let run_one = |i: usize, reference: Option<&References>| {
            let mut ctx = Ctx::new(meta.name, pid_of(grid, i), grid, functional, reference);
            ctx.launch = launch;
            if checked {
                ctx.hz = Some(Box::new(ProgramHazards::new(&self.hazards)));
                ctx.args = Arc::clone(args);
            }
            body(&mut ctx);
            ctx.settle_all_deferred();
            let log = ctx.hz.take().and_then(|h| h.log);
            match ctx.error {
                Some(e) => (Err(e), log),
                None => (Ok(ctx.trace.finish()), log),
            }
        };
        let (sim, logs) =
            self.time_programs(meta.name, meta.lines, config, grid, checked, &run_one)?;
        if checked && self.hazards.records() {
            hazard::check_launch(
                meta.name,
                grid,
                &logs,
                args,
                self.hazards.enabled,
                self.hazards.coverage,
            )?;
        }
        let (report, trace) = sim.finish()?;
        Ok(Launch { report, trace })
    }

    /// Records every program of `grid` (`run_one(i, reference)` gives program `i`'s trace and, in
    /// a checked launch (`keep_logs`), its log) and times them: the launch simulator, ready to
    /// finish, and the logs in program order.
    fn time_programs<'s>(
        &'s self,
        kernel: &'s str,
        lines: &'s [(u32, &'s str)],
        config: &Config,
        grid: [usize; 3],
        keep_logs: bool,
        run_one: &(dyn Fn(usize, Option<&References>) -> ProgramOutcome + Sync),
    ) -> Result<(LaunchSim<'s>, Vec<ProgramLog>), SimError> {
        let functional = self.backend == Backend::Functional;
        let info = LaunchInfo {
            kernel,
            config: config.0.clone(),
            grid: grid.map(|g| g as u64),
            lines,
            cost_only: !functional,
            want_trace: self.trace,
        };
        let mut sim = LaunchSim::new(&self.preset, info).with_sampling(self.sampling);
        let total: usize = grid.iter().product();
        // Cost-only: program 0 is recorded in full and the others follow it: programs that issue
        // the same events (the usual case) share its recording and keep only their load windows,
        // which is what makes a million-token cost-only launch cheap. A program that diverges
        // switches to another stream recorded lately (`recent`, newest first: tail tiles, an
        // expert's partial tile) before it records in full. Functional runs are dominated by the
        // data, so all their programs start at once.
        let mut start = 0;
        let mut recent: Vec<ShapesHandle> = Vec::new();
        let mut reference = if functional {
            None
        } else {
            let first = run_one(0, None).0?;
            sim.push(first.clone())?;
            start = 1;
            Some(first)
        };
        let mut references = reference.as_ref().map(|r| References::new(r, []));
        // Per position along a grid row (rows up to MAX_ROW_REFERENCES long), the references of
        // the last program recorded there that diverged from `references` (that program first,
        // then the launch's main reference and the recent streams): the programs at that
        // position a row on follow them instead of `references`. Causal attention's rows differ
        // along the row (each query block attends its own number of key blocks) but repeat per
        // head, so no launch-wide reference fits them and each of their programs recorded in
        // full.
        let row = grid[0];
        let mut row_refs: Vec<Option<References>> = match reference {
            Some(_) if row > 1 && row <= MAX_ROW_REFERENCES => vec![None; row],
            _ => Vec::new(),
        };
        // Programs run in parallel a wave at a time, and each wave is timed while the next one
        // runs. Traces are timed in program-id order, so the numbers and cycles are the same for
        // any thread count.
        // Cost-only programs are recorded many waves at a time: each batch is one fork-join of the
        // host threads, and a launch of tens of thousands of tiny programs paid more in joins
        // than in recording. Which programs share a batch changes no trace and no cycle.
        let waves = if functional {
            1
        } else {
            COST_ONLY_WAVES_PER_BATCH
        };
        let wave = (self.preset.cores as usize).max(1);
        // The first batch is one wave: the row references it leaves let the later programs
        // follow (a causal attention's first batch of 16 waves recorded every program in full).
        let mut batch = wave;
        let mut recorded: Vec<Result<ProgramTrace, SimError>> = Vec::new();
        let mut logs: Vec<ProgramLog> = Vec::new();
        while start < total {
            let end = (start + batch).min(total);
            // The pool records while this thread times: a card role's own thread keeps its
            // simulation (the serial part) off the pool, so one role's long launch never queues
            // another role's behind it (a 5 ms launch waited 0.25 s for a worker).
            let mut batch_out = None;
            let timed = rayon::in_place_scope(|scope| {
                scope.spawn(|_| {
                    let (traces, wave_logs): (Vec<_>, Vec<_>) = (start..end)
                        .into_par_iter()
                        .map(|i| {
                            let own = row_refs.get(i % row).and_then(Option::as_ref);
                            run_one(i, own.or(references.as_ref()))
                        })
                        .unzip();
                    batch_out = Some((traces, wave_logs));
                });
                push_all(&mut sim, std::mem::take(&mut recorded))
            });
            let (next, wave_logs) = batch_out.expect("the scope waited for the batch");
            if keep_logs {
                // One log per program, in program order (a program without one logged nothing).
                logs.extend(wave_logs.into_iter().map(Option::unwrap_or_default));
            }
            timed?;
            if let Some(r) = &mut reference {
                if let Some(new) = next_reference(r, &next) {
                    *r = new;
                }
                remember_streams(&mut recent, &next);
                let refs = References::new(r, &recent);
                if !row_refs.is_empty() {
                    let main = r.shapes_handle();
                    for (i, t) in (start..end).zip(&next) {
                        if let Ok(t) = t {
                            let slot = &mut row_refs[i % row];
                            if refs.holds(t) {
                                *slot = None;
                            } else if !slot.as_ref().is_some_and(|o| o.holds(t)) {
                                *slot =
                                    Some(References::new(t, std::iter::once(&main).chain(&recent)));
                            }
                        }
                    }
                }
                references = Some(refs);
            }
            recorded = next;
            start = end;
            batch = wave * waves;
        }
        push_all(&mut sim, recorded)?;
        Ok((sim, logs))
    }
}

/// The next launch's id (see `Ctx::launch`); 0 is no launch.
static NEXT_LAUNCH: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Waves of programs a cost-only launch records per batch (see [`Launcher::time_programs`]).
const COST_ONLY_WAVES_PER_BATCH: usize = 16;

/// Longest grid row whose positions keep references of their own (see
/// [`Launcher::time_programs`]): each holds a recorded program's body (its events, not its load
/// windows) until the launch ends, so a causal row of this many query blocks keeps at most this
/// many bodies alive.
const MAX_ROW_REFERENCES: usize = 4096;

/// A recorded program: its trace (or the error it hit) and, in a checked launch, its log.
type ProgramOutcome = (Result<ProgramTrace, SimError>, Option<ProgramLog>);

/// Program `i`'s position in `grid` (program ids run along the first axis fastest).
fn pid_of(grid: [usize; 3], i: usize) -> [usize; 3] {
    [
        i % grid[0],
        (i / grid[0]) % grid[1],
        i / (grid[0] * grid[1]),
    ]
}

/// A better reference for the programs after `wave`, when most of it diverged from `current`: its
/// last program that did. Program 0 is often unlike the rest (the first query of a causal
/// attention attends one key), and a follower that diverges records in full. Which program is
/// followed changes no trace, only how cheaply it is recorded.
fn next_reference(
    current: &ProgramTrace,
    wave: &[Result<ProgramTrace, SimError>],
) -> Option<ProgramTrace> {
    let diverged =
        |t: &&Result<ProgramTrace, SimError>| matches!(t, Ok(t) if !t.shares_body(current));
    if 2 * wave.iter().filter(diverged).count() <= wave.len() {
        return None;
    }
    wave.iter()
        .rev()
        .find(diverged)
        .and_then(|t| t.as_ref().ok().cloned())
}

/// Keeps in `recent` (newest first, at most [`MAX_REFERENCES`]) one program of each distinct
/// stream `wave` recorded: the streams later programs may switch to when they diverge.
fn remember_streams(recent: &mut Vec<ShapesHandle>, wave: &[Result<ProgramTrace, SimError>]) {
    for t in wave.iter().flatten() {
        match recent.iter().position(|r| r.is_body_of(t)) {
            Some(0) => {}
            Some(i) => recent[..=i].rotate_right(1),
            None => {
                recent.insert(0, t.shapes_handle());
                recent.truncate(MAX_REFERENCES);
            }
        }
    }
}

/// Hands recorded programs to the launch simulator in order; the first error (a kernel's, or the
/// simulator's, e.g. an SRAM overflow) ends the launch.
fn push_all(
    sim: &mut LaunchSim<'_>,
    recorded: Vec<Result<ProgramTrace, SimError>>,
) -> Result<(), SimError> {
    for trace in recorded {
        sim.push(trace?)?;
    }
    Ok(())
}

/// The pool of `n` worker threads launches with [`Launcher::with_threads`]`(n)` run on, built on
/// first use and kept: building one per launch cost more than a small launch itself, and kept
/// workers keep their recycled tile buffers. Determinism does not depend on it (results and
/// cycles are the same at any thread count).
fn thread_pool(n: usize) -> Result<Arc<rayon::ThreadPool>, rayon::ThreadPoolBuildError> {
    static POOLS: Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>> = Mutex::new(Vec::new());
    let n = n.max(1);
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = pools.iter().find(|(k, _)| *k == n) {
        return Ok(Arc::clone(p));
    }
    let p = Arc::new(rayon::ThreadPoolBuilder::new().num_threads(n).build()?);
    pools.push((n, Arc::clone(&p)));
    Ok(p)
}
