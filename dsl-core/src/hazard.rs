//! Hazard checks of functional launches: a kernel that addresses outside a tensor, reads on-chip
//! data nothing wrote, races with another program of its launch, leaves part of an output
//! unwritten, or produces non-finite values is told so, with the kernel, the source line, the
//! tensor and the index.
//!
//! Checks run in functional launches only (a cost-only launch has no data to race on). They are
//! on by default (`DAY0_HAZARDS=0` or [`crate::Launcher::with_hazards`] turns them off for speed);
//! coverage and non-finite checks are opt-in ([`Hazards::coverage`], [`Hazards::check_finite`]).
//!
//! # The rules
//!
//! - **Out of bounds.** Every load and store in the DSL is masked by the tensor it addresses:
//!   elements of the window outside it read as the fill value and are not written (a ragged
//!   edge). A window that *starts* outside the tensor (first row ≥ rows or first column ≥ columns)
//!   has no element inside it, so no ragged edge explains it. That is by design on a view the
//!   kernel clipped itself (`at`, `rows_clipped`, `cols_clipped`: an expert with no rows, a head
//!   past the end), and an error on any other tensor (a kernel argument, or a host-side
//!   `row_range`/`col_range`/`reshaped` view):
//!   - a **store** there is an error at its line;
//!   - a **load** there is an error at its line as soon as the tile is *read* (its contents are
//!     the fill value, not data). A load that is never consumed is harmless: a double-buffered
//!     loop's prefetch past the last step moves no bytes and is never used.
//! - **Uninitialised on-chip data.** A tile from [`crate::intrinsics::empty`] holds nothing until
//!   an intrinsic writes it wholly ([`crate::intrinsics::load_into`]); an instruction that reads
//!   it before (including `mma`, which reads its accumulator) is an error at the reading line.
//! - **Races.** Each program's loads and stores are recorded as windows of device memory (the
//!   tensor, its first element and row pitch, rows × columns). After the launch, every element a
//!   store wrote is given its writer; a second program writing the same element is a write/write
//!   race, and a program reading an element another program of the launch writes is a read/write
//!   race (the order of programs is not defined, as on hardware). A program reading and writing
//!   its own elements (an in-place update) is not a race.
//! - **Coverage** (opt-in). Every element of every tensor argument the launch stores into is
//!   written by some program.
//! - **Non-finite values** (opt-in). A store of NaN or ±∞ into a tensor is an error at the store's
//!   line, naming the first such element. Launches run in order, so the first error a run returns
//!   names the first launch and line that produced one.

use accel_sim::SimError;
use std::collections::{BTreeMap, BTreeSet};

/// Which hazard checks a functional launch runs (see the module documentation for the rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hazards {
    /// Out-of-bounds accesses, reads of unwritten tiles and races between programs: cheap (a few
    /// percent of a launch), on by default.
    pub enabled: bool,
    /// Every element of every tensor argument the launch stores into must be written. Off by
    /// default: a kernel may write an output in several launches.
    pub coverage: bool,
    /// Stores of NaN or ±∞ are errors. Off by default: some kernels store −∞ on purpose (the
    /// running maximum of an empty split).
    pub check_finite: bool,
}

impl Default for Hazards {
    /// Checks on unless the environment says `DAY0_HAZARDS=0`; coverage off; finite checks on only
    /// with `DAY0_CHECK_FINITE=1`.
    fn default() -> Hazards {
        Hazards::from_env()
    }
}

impl Hazards {
    /// No checks at all (the fastest functional launch).
    pub const OFF: Hazards = Hazards {
        enabled: false,
        coverage: false,
        check_finite: false,
    };

    /// The default checks, as the environment sets them: `DAY0_HAZARDS=0` turns the checks off,
    /// `DAY0_CHECK_FINITE=1` turns the non-finite check on.
    pub fn from_env() -> Hazards {
        let flag = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string());
        let off = |v: &Option<String>| matches!(v.as_deref(), Some("0" | "false" | "off" | "no"));
        let on = |v: &Option<String>| matches!(v.as_deref(), Some("1" | "true" | "on" | "yes"));
        Hazards {
            enabled: !off(&flag("DAY0_HAZARDS")),
            coverage: false,
            check_finite: on(&flag("DAY0_CHECK_FINITE")),
        }
    }

    /// Whether any check records accesses during a launch.
    pub(crate) fn any(&self) -> bool {
        self.enabled || self.coverage || self.check_finite
    }

    /// Whether the launch records each program's windows (races, coverage).
    pub(crate) fn records(&self) -> bool {
        self.enabled || self.coverage
    }
}

/// A tensor argument of a launch as the checks see it: its parameter name and where its view lies
/// in device memory, so an element of memory can be named in the argument's own coordinates.
#[derive(Debug, Clone)]
pub(crate) struct ArgView {
    /// Parameter name.
    pub name: &'static str,
    /// Memory identity (the tensor id, shared by its views).
    pub mem: u64,
    /// First element of the view in memory.
    pub offset: usize,
    /// Rows and columns of the view as a matrix.
    pub rows: usize,
    pub cols: usize,
    /// Row pitch in memory.
    pub stride: usize,
}

impl ArgView {
    /// (row, column) of memory element `e` in this view, if the view holds it.
    fn coords(&self, e: usize) -> Option<(usize, usize)> {
        let rel = e.checked_sub(self.offset)?;
        let (r, c) = (rel / self.stride.max(1), rel % self.stride.max(1));
        (r < self.rows && c < self.cols).then_some((r, c))
    }
}

/// Names memory element `e` of tensor `mem`: `` `y`[3, 5] `` in the coordinates of the first
/// argument whose view holds it, or the memory index when none does (a workspace shared by
/// views).
pub(crate) fn name_element(args: &[ArgView], mem: u64, e: usize) -> String {
    for a in args.iter().filter(|a| a.mem == mem) {
        if let Some((r, c)) = a.coords(e) {
            return format!("`{}`[{r}, {c}]", a.name);
        }
    }
    match args.iter().find(|a| a.mem == mem) {
        Some(a) => format!("`{}` (memory element {e}, outside its view)", a.name),
        None => format!("tensor #{mem} (memory element {e})"),
    }
}

/// Names tensor `mem` by its parameter, for messages about a whole window.
pub(crate) fn name_tensor(args: &[ArgView], mem: u64, fallback: &dyn Fn() -> String) -> String {
    match args.iter().find(|a| a.mem == mem) {
        Some(a) => format!("`{}`", a.name),
        None => fallback(),
    }
}

/// One load or store: a window of device memory.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access {
    /// Memory identity (tensor id).
    pub mem: u64,
    /// Memory index of the window's first element.
    pub start: usize,
    /// Row pitch.
    pub stride: usize,
    pub rows: usize,
    pub cols: usize,
    /// Source line of the intrinsic.
    pub line: u32,
}

impl Access {
    /// One past the last memory element of the window.
    fn end(&self) -> usize {
        self.start + (self.rows - 1) * self.stride + self.cols
    }

    /// Memory index of the first element of each row.
    fn row_starts(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.rows).map(move |r| self.start + r * self.stride)
    }
}

/// What one program read and wrote.
#[derive(Debug, Default)]
pub(crate) struct ProgramLog {
    pub reads: Vec<Access>,
    pub writes: Vec<Access>,
}

/// Why a tile may not be read (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) enum Taint {
    /// Made by `empty` at this line and not written since.
    Empty { line: u32 },
    /// Loaded at `line` from a window wholly outside a tensor: `what` describes it.
    Outside { line: u32, what: String },
}

/// A program's hazard state, kept in its context while it runs.
#[derive(Debug, Default)]
pub(crate) struct ProgramHazards {
    /// Recorded windows (only when races or coverage are checked).
    pub log: Option<ProgramLog>,
    /// Tiles that must not be read yet, by buffer id.
    pub taints: Vec<(u32, Taint)>,
    /// Whether bounds and unwritten-tile checks run.
    pub enabled: bool,
    /// Whether stores of non-finite values are errors.
    pub check_finite: bool,
}

impl ProgramHazards {
    /// The state a program of a launch with `hazards` starts with.
    pub(crate) fn new(hazards: &Hazards) -> ProgramHazards {
        ProgramHazards {
            log: hazards.records().then(ProgramLog::default),
            taints: Vec::new(),
            enabled: hazards.enabled,
            check_finite: hazards.check_finite,
        }
    }
}

/// Which program of the grid a linear program index is.
fn pid_of(i: usize, grid: [usize; 3]) -> [usize; 3] {
    [
        i % grid[0],
        (i / grid[0]) % grid[1],
        i / (grid[0] * grid[1]),
    ]
}

/// Who wrote each element of one memory's written span.
struct Shadow {
    /// Memory index of `owner[0]`.
    base: usize,
    /// Writer of each element: 0 for none, program index + 1.
    owner: Vec<u32>,
}

thread_local! {
    /// Owner vectors of finished checks, kept for the next launch's: a fresh multi-megabyte
    /// allocation per launch cost page faults on every page (a few percent of a GEMM launch).
    static SHADOW_FREE: std::cell::RefCell<Vec<Vec<u32>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Shadow {
    /// A shadow of `len` elements from memory index `base`, nobody the writer yet.
    fn new(base: usize, len: usize) -> Shadow {
        let mut owner = SHADOW_FREE
            .with(|f| f.borrow_mut().pop())
            .unwrap_or_default();
        owner.clear();
        owner.resize(len, 0);
        Shadow { base, owner }
    }
}

/// Owner elements kept per thread, all vectors together: 64 MiB of `u32`.
const SHADOW_KEPT_ELEMS: usize = 1 << 24;

impl Drop for Shadow {
    fn drop(&mut self) {
        let owner = std::mem::take(&mut self.owner);
        // Keep a few (one per memory a launch writes, typically one or two) within the budget.
        let _ = SHADOW_FREE.try_with(|f| {
            if let Ok(mut f) = f.try_borrow_mut() {
                let kept: usize = f.iter().map(Vec::capacity).sum();
                if f.len() < 4 && kept + owner.capacity() <= SHADOW_KEPT_ELEMS {
                    f.push(owner);
                }
            }
        });
    }
}

/// The after-launch checks: write/write and read/write races between programs, and (with
/// `coverage`) elements of written arguments that no program wrote. `logs[i]` is program `i`'s.
/// Deterministic: programs are visited in index order, so the error is the same at any thread
/// count.
pub(crate) fn check_launch(
    kernel: &str,
    grid: [usize; 3],
    logs: &[ProgramLog],
    args: &[ArgView],
    races: bool,
    coverage: bool,
) -> Result<(), SimError> {
    // The written span of every memory stored into.
    let mut spans: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
    for w in logs.iter().flat_map(|l| &l.writes) {
        let s = spans.entry(w.mem).or_insert((usize::MAX, 0));
        s.0 = s.0.min(w.start);
        s.1 = s.1.max(w.end());
    }
    if !coverage {
        // A memory whose stores are provably disjoint windows, and that no program of the launch
        // reads, has no race: skip its per-element shadow (the usual output of a tiled kernel).
        let read: BTreeSet<u64> = logs.iter().flat_map(|l| &l.reads).map(|r| r.mem).collect();
        spans.retain(|m, _| {
            read.contains(m)
                || !disjoint_windows(logs.iter().flat_map(|l| &l.writes).filter(|w| w.mem == *m))
        });
    }
    if spans.is_empty() {
        return Ok(());
    }
    let mut shadows: BTreeMap<u64, Shadow> = spans
        .iter()
        .map(|(m, (lo, hi))| (*m, Shadow::new(*lo, hi - lo)))
        .collect();
    let fail = |line: u32, message: String| SimError::Kernel {
        kernel: kernel.to_string(),
        line,
        message,
    };
    // Writes, in program order: the first writer of an element owns it.
    for (p, log) in logs.iter().enumerate() {
        let me = p as u32 + 1;
        for w in &log.writes {
            // Memories proved race-free above have no shadow.
            let Some(sh) = shadows.get_mut(&w.mem) else {
                continue;
            };
            for row in w.row_starts() {
                let cells = &mut sh.owner[row - sh.base..row - sh.base + w.cols];
                // The usual case, a row nobody else wrote, in two passes the compiler vectorises.
                if cells.iter().all(|o| *o == 0 || *o == me) {
                    cells.fill(me);
                    continue;
                }
                for (c, o) in cells.iter_mut().enumerate() {
                    if *o == 0 || *o == me {
                        *o = me;
                    } else if races {
                        let e = row + c;
                        let other = *o as usize - 1;
                        return Err(fail(
                            w.line,
                            format!(
                                "hazard: write/write race on {}: programs {:?} (line {}) and {:?} (this line) both store it in one launch; give each output element one writer",
                                name_element(args, w.mem, e),
                                pid_of(other, grid),
                                first_line(&logs[other].writes, w.mem, e).unwrap_or(0),
                                pid_of(p, grid),
                            ),
                        ));
                    }
                }
            }
        }
    }
    if races {
        for (p, log) in logs.iter().enumerate() {
            let me = p as u32 + 1;
            for r in &log.reads {
                let Some(sh) = shadows.get(&r.mem) else {
                    continue;
                };
                let hi = sh.base + sh.owner.len();
                for row in r.row_starts() {
                    let lo_e = row.max(sh.base);
                    let hi_e = (row + r.cols).min(hi);
                    if lo_e >= hi_e {
                        continue;
                    }
                    let cells = &sh.owner[lo_e - sh.base..hi_e - sh.base];
                    if let Some(c) = cells.iter().position(|o| *o != 0 && *o != me) {
                        let e = lo_e + c;
                        let other = cells[c] as usize - 1;
                        return Err(fail(
                            r.line,
                            format!(
                                "hazard: read/write race on {}: program {:?} reads it here while program {:?} stores it (line {}) in the same launch; split the launch or read only what this program writes",
                                name_element(args, r.mem, e),
                                pid_of(p, grid),
                                pid_of(other, grid),
                                first_line(&logs[other].writes, r.mem, e).unwrap_or(0),
                            ),
                        ));
                    }
                }
            }
        }
    }
    if coverage {
        for a in args {
            let Some(sh) = shadows.get(&a.mem) else {
                continue;
            };
            let hi = sh.base + sh.owner.len();
            let written = |e: usize| e >= sh.base && e < hi && sh.owner[e - sh.base] != 0;
            let mut first = None;
            let mut missing = 0usize;
            for r in 0..a.rows {
                for c in 0..a.cols {
                    let e = a.offset + r * a.stride + c;
                    if !written(e) {
                        missing += 1;
                        first.get_or_insert((r, c));
                    }
                }
            }
            if let Some((r, c)) = first {
                let line = logs
                    .iter()
                    .flat_map(|l| &l.writes)
                    .find(|w| w.mem == a.mem)
                    .map_or(0, |w| w.line);
                return Err(fail(
                    line,
                    format!(
                        "hazard: incomplete output: no program wrote `{}`[{r}, {c}] ({missing} of {} elements of `{}` unwritten; this line stores into it); cover the whole output with the grid",
                        a.name,
                        a.rows * a.cols,
                        a.name,
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Whether `windows` (all of one memory) provably touch no element twice. Windows of one row
/// pitch are rectangles of that pitch's matrix; a sweep down the rows keeps the live ones by
/// first column, so each window is checked against its neighbours in O(log n). `false` means
/// "not proved" (two windows overlap, even of one program, or the pitches differ): the exact
/// per-element check decides then.
fn disjoint_windows<'a>(windows: impl Iterator<Item = &'a Access>) -> bool {
    let mut rects: Vec<(usize, usize, usize, usize)> = Vec::new();
    let mut pitch = None;
    for w in windows {
        if w.rows == 0 || w.cols == 0 {
            continue;
        }
        let s = *pitch.get_or_insert(w.stride);
        if s == 0 || (w.rows > 1 && w.stride != s) || w.start % s + w.cols > s {
            return false;
        }
        let (r0, c0) = (w.start / s, w.start % s);
        rects.push((r0, c0, r0 + w.rows, c0 + w.cols));
    }
    rects.sort_unstable();
    // Live windows (first column → (end column, end row)); pairwise disjoint while this runs.
    let mut live: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
    for &(r0, c0, r1, c1) in &rects {
        // The window starting at or left of `c0`, then those starting inside `c0..c1`; windows
        // ending above row `r0` are gone and are dropped as they are met.
        while let Some((&k, &(kc1, kr1))) = live.range(..=c0).next_back() {
            if kr1 > r0 {
                if kc1 > c0 {
                    return false;
                }
                break;
            }
            live.remove(&k);
        }
        while let Some((&k, &(_, kr1))) = live.range(c0..c1).next() {
            if kr1 > r0 {
                return false;
            }
            live.remove(&k);
        }
        live.insert(c0, (c1, r1));
    }
    true
}

/// The line of the first of `writes` that stores memory element `e` of `mem`.
fn first_line(writes: &[Access], mem: u64, e: usize) -> Option<u32> {
    writes
        .iter()
        .find(|w| w.mem == mem && w.row_starts().any(|row| e >= row && e < row + w.cols))
        .map(|w| w.line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn window(start: usize, stride: usize, rows: usize, cols: usize) -> Access {
        Access {
            mem: 1,
            start,
            stride,
            rows,
            cols,
            line: 0,
        }
    }

    /// Whether some memory element lies in two of `ws`, element by element.
    fn overlap_by_elements(ws: &[Access]) -> bool {
        let mut seen = std::collections::HashSet::new();
        ws.iter()
            .flat_map(|w| w.row_starts().flat_map(move |r| r..r + w.cols))
            .any(|e| !seen.insert(e))
    }

    proptest! {
        /// The rectangle sweep agrees with an element-by-element check on windows of one pitch
        /// that do not wrap, and never calls overlapping windows disjoint.
        #[test]
        fn rectangle_sweep_agrees_with_elements(
            raw in proptest::collection::vec((0usize..12, 0usize..10, 1usize..5, 1usize..6), 0..12),
            stride in 8usize..12,
        ) {
            let ws: Vec<Access> = raw
                .iter()
                .map(|&(r, c, rows, cols)| window(r * stride + c, stride, rows, cols))
                .collect();
            let wraps = ws.iter().any(|w| w.start % stride + w.cols > stride);
            let exact = !overlap_by_elements(&ws);
            let swept = disjoint_windows(ws.iter());
            if wraps {
                prop_assert!(!swept, "a wrapping window is left to the exact check");
            } else {
                prop_assert_eq!(swept, exact);
            }
        }
    }

    #[test]
    fn windows_of_two_pitches_are_left_to_the_exact_check() {
        let ws = [window(0, 8, 2, 4), window(100, 16, 2, 4)];
        assert!(!disjoint_windows(ws.iter()));
        // A one-row window has no pitch to disagree with.
        let ws = [window(0, 8, 2, 4), window(100, 16, 1, 4)];
        assert!(disjoint_windows(ws.iter()));
    }
}
