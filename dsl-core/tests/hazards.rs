//! Hazard checks of functional launches (`dsl_core::hazard`): one kernel per hazard class that
//! trips it, with the error naming the kernel, the source line, the tensor and the index; and the
//! patterns that look alike but are by design (ragged edges, a prefetch past the end that is never
//! read, an empty clipped view, an in-place update) that must not trip it.

use dsl_core::prelude::*;
use dsl_core::SimError;

/// The line of this file holding `marker` (a comment on a kernel line), as `#[kernel]` records it.
fn line_of(marker: &str) -> u32 {
    let src = include_str!("hazards.rs");
    let hits: Vec<usize> = src
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(marker) && !l.contains("line_of("))
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(hits.len(), 1, "marker {marker} must be on exactly one line");
    hits[0] as u32
}

fn launcher() -> Launcher {
    // Explicitly on, whatever DAY0_HAZARDS says in the environment of the test run.
    Launcher::for_device("npu-910b").unwrap().with_hazards(true)
}

/// Random non-zero values (a fixed LCG: no dependency), so a check never passes on zeros.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 40) as f32) / (1u64 << 24) as f32; // [0, 1)
            0.25 + u
        })
        .collect()
}

fn input(rows: usize, cols: usize, seed: u64) -> Tensor<f32> {
    Tensor::from_f32(&[rows, cols], &values(rows * cols, seed)).unwrap()
}

/// The kernel error's (kernel, line, message), or a panic naming what came instead.
fn kernel_error<T: std::fmt::Debug>(r: Result<T, SimError>) -> (String, u32, String) {
    match r {
        Err(SimError::Kernel {
            kernel,
            line,
            message,
        }) => (kernel, line, message),
        other => panic!("expected a kernel error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Out of bounds

/// One program too many: the last stores a window that starts past the last row of `y`.
#[kernel(grid = (cdiv(y.rows(), 8) + 1,))]
fn store_past_end(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 8;
    let t = load::<8, 8>(x, 0, 0);
    store(y, r, 0, &t); // @oob-store
}

#[test]
fn a_store_wholly_outside_a_tensor_names_the_line_tensor_and_window() {
    let (x, y) = (input(16, 8, 1), Tensor::<f32>::poisoned(&[16, 8]));
    let (kernel, line, msg) =
        kernel_error(store_past_end::launch(&launcher(), &Config::new(), &x, &y));
    assert_eq!(kernel, "store_past_end");
    assert_eq!(line, line_of("@oob-store"));
    assert!(msg.contains("out-of-bounds store"), "{msg}");
    assert!(msg.contains("`y`"), "{msg}");
    assert!(msg.contains("[16, 0]"), "{msg}");
    assert!(msg.contains("16 rows and 8 columns"), "{msg}");
}

/// Reads a column window that starts at the end of `x` and uses it.
#[kernel(grid = (1,))]
fn load_past_end(x: &Tensor<f32>, y: &Tensor<f32>) {
    let a = load::<8, 8>(x, 0, 0);
    let b = load::<8, 8>(x, 0, x.cols()); // @oob-load
    store(y, 0, 0, &add(&a, &b)); // @oob-use
}

#[test]
fn a_load_wholly_outside_a_tensor_is_an_error_at_its_line_when_read() {
    let (x, y) = (input(8, 8, 2), Tensor::<f32>::poisoned(&[8, 8]));
    let (kernel, line, msg) =
        kernel_error(load_past_end::launch(&launcher(), &Config::new(), &x, &y));
    assert_eq!(kernel, "load_past_end");
    assert_eq!(line, line_of("@oob-load"));
    assert!(msg.contains("out-of-bounds load"), "{msg}");
    assert!(msg.contains("`x`"), "{msg}");
    assert!(msg.contains("[0, 8]"), "{msg}");
    assert!(
        msg.contains(&format!("line {} reads the tile", line_of("@oob-use"))),
        "{msg}"
    );
}

/// Double-buffered copy: the last step prefetches the window past the end and never reads it,
/// as `kernels::gemm::gemm_db` does. Not a hazard: nothing uses the fill.
#[kernel(grid = (1,))]
fn prefetch_past_end(x: &Tensor<f32>, y: &Tensor<f32>) {
    let mut cur = load_async::<8, 8>(x, 0, 0);
    for c in (8..x.cols() + 8).step_by(8) {
        let next = load_async::<8, 8>(x, 0, c);
        store(y, 0, c - 8, &cur);
        cur = next;
    }
}

/// A ragged edge (a window that starts inside and runs past the end), and an empty view the
/// kernel clipped itself (an expert with no rows) read wholly outside: both by design.
#[kernel(grid = (cdiv(y.rows(), 8),))]
fn ragged_and_clipped(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 8;
    let t = load::<8, 8>(x, r, 0);
    let none = x.rows_clipped(5, 3);
    let z = load::<8, 8>(&none, 0, 0);
    store(y, r, 0, &add(&t, &z));
    let past = y.rows_clipped(y.rows(), y.rows());
    store(&past, 0, 0, &t);
}

#[test]
fn ragged_edges_unread_prefetches_and_clipped_empty_views_are_not_hazards() {
    let x = input(8, 24, 3);
    let y = Tensor::<f32>::poisoned(&[8, 24]);
    prefetch_past_end::launch(&launcher().with_coverage(true), &Config::new(), &x, &y).unwrap();
    assert_eq!(y.to_vec(), x.to_vec());
    let x = input(13, 8, 4);
    let y = Tensor::<f32>::poisoned(&[13, 8]);
    ragged_and_clipped::launch(&launcher().with_coverage(true), &Config::new(), &x, &y).unwrap();
    assert_eq!(y.to_vec(), x.to_vec());
}

// ---------------------------------------------------------------------------------------------
// On-chip data never written

/// Accumulates into an `empty` tile: `mma` reads its accumulator, which nothing wrote.
#[kernel(grid = (1,))]
fn mma_into_empty(a: &Tensor<f32>, y: &Tensor<f32>) {
    let t = load::<8, 8>(a, 0, 0);
    let mut acc = empty::<f32, 8, 8>(); // @made-empty
    mma(&mut acc, &t, &t); // @empty-read
    store(y, 0, 0, &acc);
}

/// Fills an `empty` tile with `load_into` before using it: fine.
#[kernel(grid = (1,))]
fn empty_then_load_into(a: &Tensor<f32>, y: &Tensor<f32>) {
    let mut t = empty::<f32, 8, 8>();
    load_into(&mut t, a, 0, 0);
    store(y, 0, 0, &scale(&t, 2.0));
}

#[test]
fn reading_an_unwritten_tile_names_the_reading_line_and_where_it_was_made() {
    let (a, y) = (input(8, 8, 5), Tensor::<f32>::poisoned(&[8, 8]));
    let (kernel, line, msg) =
        kernel_error(mma_into_empty::launch(&launcher(), &Config::new(), &a, &y));
    assert_eq!(kernel, "mma_into_empty");
    assert_eq!(line, line_of("@empty-read"));
    assert!(msg.contains("never written"), "{msg}");
    assert!(
        msg.contains(&format!("`empty` at line {}", line_of("@made-empty"))),
        "{msg}"
    );
    empty_then_load_into::launch(&launcher(), &Config::new(), &a, &y).unwrap();
    let want: Vec<f32> = a.to_vec().unwrap().iter().map(|v| v * 2.0).collect();
    assert_eq!(y.to_vec().unwrap(), want);
}

// ---------------------------------------------------------------------------------------------
// Races between programs

/// Every program stores the same 8×8 window of `y`.
#[kernel(grid = (3,))]
fn all_store_row_zero(x: &Tensor<f32>, y: &Tensor<f32>) {
    let t = load::<8, 8>(x, 0, 0);
    store(y, 0, 0, &t); // @ww
}

#[test]
fn two_programs_writing_one_element_is_a_race_naming_both_and_the_element() {
    let (x, y) = (input(8, 8, 6), Tensor::<f32>::poisoned(&[8, 8]));
    let (kernel, line, msg) = kernel_error(all_store_row_zero::launch(
        &launcher(),
        &Config::new(),
        &x,
        &y,
    ));
    assert_eq!(kernel, "all_store_row_zero");
    assert_eq!(line, line_of("@ww"));
    assert!(msg.contains("write/write race"), "{msg}");
    assert!(msg.contains("`y`[0, 0]"), "{msg}");
    assert!(
        msg.contains("[0, 0, 0]") && msg.contains("[1, 0, 0]"),
        "{msg}"
    );
}

/// Program 0 writes rows 0..8 of `y`; program 1 reads them (and writes rows 8..16).
#[kernel(grid = (2,))]
fn reads_neighbours_output(x: &Tensor<f32>, y: &Tensor<f32>) {
    let p = program_id(0);
    let t = load::<8, 8>(x, p * 8, 0);
    store(y, p * 8, 0, &t); // @rw-store
    if p == 1 {
        let other = load::<8, 8>(y, 3, 2); // @rw-load
        store(y, 8, 0, &add(&t, &other));
    }
}

/// Each program updates its own rows of `y` in place: reading what it writes itself is fine.
#[kernel(grid = (cdiv(y.rows(), 8),))]
fn in_place_double(y: &Tensor<f32>) {
    let r = program_id(0) * 8;
    let t = load::<8, 8>(y, r, 0);
    store(y, r, 0, &add(&t, &t));
}

#[test]
fn reading_what_another_program_writes_is_a_race_and_in_place_updates_are_not() {
    let (x, y) = (input(16, 8, 7), Tensor::<f32>::poisoned(&[16, 8]));
    let (kernel, line, msg) = kernel_error(reads_neighbours_output::launch(
        &launcher(),
        &Config::new(),
        &x,
        &y,
    ));
    assert_eq!(kernel, "reads_neighbours_output");
    assert_eq!(line, line_of("@rw-load"));
    assert!(msg.contains("read/write race"), "{msg}");
    assert!(msg.contains("`y`[3, 2]"), "{msg}");
    assert!(
        msg.contains(&format!("(line {})", line_of("@rw-store"))),
        "{msg}"
    );
    let y = input(20, 8, 8);
    let want: Vec<f32> = y.to_vec().unwrap().iter().map(|v| v * 2.0).collect();
    in_place_double::launch(&launcher(), &Config::new(), &y).unwrap();
    assert_eq!(y.to_vec().unwrap(), want);
}

#[test]
fn races_are_reported_the_same_at_any_thread_count_and_not_at_all_when_off() {
    let (x, y) = (input(8, 8, 9), Tensor::<f32>::poisoned(&[8, 8]));
    let one = all_store_row_zero::launch(&launcher().with_threads(1), &Config::new(), &x, &y);
    let four = all_store_row_zero::launch(&launcher().with_threads(4), &Config::new(), &x, &y);
    assert_eq!(one.unwrap_err(), four.unwrap_err());
    let off = launcher().with_hazards(false);
    assert!(!off.hazards.enabled);
    all_store_row_zero::launch(&off, &Config::new(), &x, &y).unwrap();
    store_past_end::launch(
        &off,
        &Config::new(),
        &input(16, 8, 1),
        &Tensor::poisoned(&[16, 8]),
    )
    .unwrap();
}

// ---------------------------------------------------------------------------------------------
// Coverage

/// A grid that covers only the first half of `y`'s rows.
#[kernel(grid = (cdiv(y.rows(), 16),))]
fn half_grid(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 8;
    store(y, r, 0, &load::<8, 8>(x, r, 0)); // @cover
}

#[test]
fn an_output_element_no_program_wrote_is_an_error_when_coverage_is_asked_for() {
    let (x, y) = (input(16, 8, 10), Tensor::<f32>::poisoned(&[16, 8]));
    // Off by default: a kernel may fill an output over several launches.
    half_grid::launch(&launcher(), &Config::new(), &x, &y).unwrap();
    let (kernel, line, msg) = kernel_error(half_grid::launch(
        &launcher().with_coverage(true),
        &Config::new(),
        &x,
        &y,
    ));
    assert_eq!(kernel, "half_grid");
    assert_eq!(line, line_of("@cover"));
    assert!(msg.contains("incomplete output"), "{msg}");
    assert!(msg.contains("`y`[8, 0]"), "{msg}");
    assert!(msg.contains("64 of 128 elements"), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Non-finite values

/// `ln` of the input: NaN where it is negative.
#[kernel(grid = (1,))]
fn log_of(x: &Tensor<f32>, y: &Tensor<f32>) {
    let t = load::<4, 8>(x, 0, 0);
    store(y, 0, 0, &ln(&t)); // @finite
}

#[test]
fn a_non_finite_store_names_the_line_tensor_and_element_when_asked() {
    let mut v = values(32, 11);
    v[2 * 8 + 5] = -1.0;
    let x = Tensor::<f32>::from_f32(&[4, 8], &v).unwrap();
    let y = Tensor::<f32>::poisoned(&[4, 8]);
    log_of::launch(&launcher().with_check_finite(false), &Config::new(), &x, &y).unwrap();
    assert!(y.to_vec().unwrap()[21].is_nan());
    let (kernel, line, msg) = kernel_error(log_of::launch(
        &launcher().with_check_finite(true),
        &Config::new(),
        &x,
        &y,
    ));
    assert_eq!(kernel, "log_of");
    assert_eq!(line, line_of("@finite"));
    assert!(msg.contains("non-finite"), "{msg}");
    assert!(msg.contains("`y`[2, 5]"), "{msg}");
}

#[test]
fn hazards_default_from_the_environment() {
    // The test run's environment decides the default; whatever it is, `from_env` agrees with a
    // fresh launcher and the opt-in checks start off unless asked for.
    let h = Hazards::from_env();
    assert_eq!(Launcher::for_device("npu-910b").unwrap().hazards, h);
    assert!(!h.coverage);
    let off = std::env::var("DAY0_HAZARDS")
        .is_ok_and(|v| matches!(v.trim(), "0" | "false" | "off" | "no"));
    assert_eq!(h.enabled, !off);
    assert_eq!(
        Hazards::OFF,
        Hazards {
            enabled: false,
            coverage: false,
            check_finite: false
        }
    );
}
