//! Row softmax against the f64 reference.
//!
//! Tolerances (max relative error, with the reference's RMS as the floor for near-zero outputs —
//! see `reference::max_rel_error`):
//! - f32: ≤ 1e-5 (f32 math end to end: exp approximation, tile-order sums, one division);
//! - bf16: ≤ 1e-2, against the f64 reference of the bf16-rounded inputs (the output rounding to
//!   bf16 alone is up to 2⁻⁹ ≈ 3.9e-3 relative).
//!
//! Inputs are fresh random values (never all zeros); outputs start poisoned with NaN, so an element
//! the kernel forgets to write makes the error infinite.

use dsl_core::prelude::*;
use kernels::gemm::GemmDtype;
use kernels::softmax::{run_softmax, softmax, SoftmaxCase};
use proptest::prelude::*;

const DEVICE: &str = "npu-910b";
const TOL_F32: f64 = 1e-5;
const TOL_BF16: f64 = 1e-2;

fn launcher() -> Launcher {
    Launcher::for_device(DEVICE).unwrap()
}

fn config(br: i64, bc: i64) -> Config {
    Config::new().with("BR", br).with("BC", bc)
}

fn check(case: &SoftmaxCase, tol: f64) -> Result<(), TestCaseError> {
    let run = run_softmax(&launcher(), case).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let err = run
        .launch
        .report
        .max_rel_error
        .expect("functional run sets the error");
    prop_assert!(err <= tol, "{case:?}: max rel error {err} > {tol}");
    // Rows sum to 1 (no element left out, no padding counted).
    let out = run.output.unwrap();
    for row in out.chunks(case.cols) {
        let s: f64 = row.iter().map(|v| *v as f64).sum();
        prop_assert!(
            (s - 1.0).abs() <= tol * 10.0 + 1e-6 * case.cols as f64,
            "{case:?}: row sums to {s}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn f32_matches_reference(
        rows in 1usize..70,
        cols in 1usize..1500,
        br in prop::sample::select(vec![8i64, 16, 32, 1, 4]),
        bc in prop::sample::select(vec![256i64, 512, 1024, 64, 128]),
        seed in any::<u64>(),
    ) {
        let case = SoftmaxCase { rows, cols, dtype: GemmDtype::F32, config: config(br, bc), seed };
        check(&case, TOL_F32)?;
    }

    #[test]
    fn bf16_matches_reference(
        rows in 1usize..70,
        cols in 1usize..1500,
        br in prop::sample::select(vec![8i64, 16, 32, 1, 4]),
        bc in prop::sample::select(vec![256i64, 512, 1024, 64, 128]),
        seed in any::<u64>(),
    ) {
        let case = SoftmaxCase { rows, cols, dtype: GemmDtype::Bf16, config: config(br, bc), seed };
        check(&case, TOL_BF16)?;
    }
}

/// Many column tiles per row, the max in a late tile: the running sum must be rescaled correctly.
#[test]
fn many_tiles_late_max() {
    let (rows, cols) = (5, 1000);
    let mut rng = kernels::testdata::Rng::new(7);
    let mut xv = rng.vec(rows * cols, 1.0);
    for r in 0..rows {
        xv[r * cols + cols - 1 - 3 * r] = 6.0; // max in the last tiles
    }
    let x = Tensor::<f32>::from_f32(&[rows, cols], &xv).unwrap();
    let y = Tensor::<f32>::poisoned(&[rows, cols]);
    softmax::launch(&launcher(), &config(4, 64), &x, &y).unwrap();
    let want = kernels::reference::softmax_rows(&xv, rows, cols);
    let got = y.to_vec().unwrap();
    let err = kernels::reference::max_rel_error(&got, &want, kernels::reference::rms_floor(&want));
    assert!(err <= TOL_F32, "max rel error {err}");
}

/// Inputs far beyond exp's range (≈ 1000): the max subtraction keeps everything finite.
#[test]
fn large_inputs_are_stable() {
    let (rows, cols) = (9, 300);
    let mut rng = kernels::testdata::Rng::new(11);
    let xv: Vec<f32> = rng
        .vec(rows * cols, 4.0)
        .iter()
        .map(|v| v + 1000.0)
        .collect();
    let x = Tensor::<f32>::from_f32(&[rows, cols], &xv).unwrap();
    let y = Tensor::<f32>::poisoned(&[rows, cols]);
    softmax::launch(&launcher(), &config(8, 128), &x, &y).unwrap();
    let want = kernels::reference::softmax_rows(&xv, rows, cols);
    let got = y.to_vec().unwrap();
    assert!(got.iter().all(|v| v.is_finite()));
    let err = kernels::reference::max_rel_error(&got, &want, kernels::reference::rms_floor(&want));
    assert!(err <= TOL_F32, "max rel error {err}");
}

#[test]
fn cost_only_cycles_equal_functional() {
    for (dtype, rows, cols, br, bc) in [
        (GemmDtype::F32, 37, 1100, 8, 256),
        (GemmDtype::Bf16, 64, 300, 16, 64),
        (GemmDtype::F32, 3, 5, 1, 1024),
    ] {
        let case = SoftmaxCase {
            rows,
            cols,
            dtype,
            config: config(br, bc),
            seed: 3,
        };
        let f = run_softmax(&launcher(), &case).unwrap();
        let c = run_softmax(&launcher().with_backend(Backend::CostOnly), &case).unwrap();
        assert!(c.output.is_none());
        assert!(c.launch.report.max_rel_error.is_none());
        assert_eq!(f.launch.report.cycles, c.launch.report.cycles, "{case:?}");
        assert!(f.launch.report.cycles > 0);
    }
}

#[test]
fn deterministic_across_thread_counts() {
    let case = SoftmaxCase {
        rows: 300,
        cols: 700,
        dtype: GemmDtype::Bf16,
        config: config(4, 256),
        seed: 99,
    };
    let one = run_softmax(&launcher().with_threads(1), &case).unwrap();
    let two = run_softmax(&launcher().with_threads(2), &case).unwrap();
    assert_eq!(one.launch.report.cycles, two.launch.report.cycles);
    let (a, b) = (one.output.unwrap(), two.output.unwrap());
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "outputs differ bitwise"
    );
}

#[test]
fn registered() {
    let imps = kernels::registry::implementations("softmax");
    assert_eq!(imps.len(), 1);
    assert_eq!(imps[0].kind, kernels::registry::ImplKind::Dsl);
    assert_eq!(imps[0].meta.name, "softmax");
}
