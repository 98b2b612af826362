//! Fused residual add + RMSNorm against the f64 reference.
//!
//! Tolerances (max relative error of both outputs, `h` and `y`, with each reference's RMS as the
//! floor for near-zero outputs — see `reference::max_rel_error`):
//! - f32: ≤ 1e-5;
//! - bf16: ≤ 1e-2, against the f64 reference of the bf16-rounded inputs (rounding each output to
//!   bf16 alone is up to 2⁻⁹ ≈ 3.9e-3 relative).
//!
//! Inputs are fresh random values (never all zeros); both outputs start poisoned with NaN, so an
//! element the kernel forgets to write makes the error infinite.

use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::gemm::GemmDtype;
use kernels::norm::{bh_for, rmsnorm_residual, run_rmsnorm_residual, RmsNormCase};
use proptest::prelude::*;

const DEVICE: &str = "npu-910b";
const TOL_F32: f64 = 1e-5;
const TOL_BF16: f64 = 1e-2;

fn launcher() -> Launcher {
    Launcher::for_device(DEVICE).unwrap()
}

fn check(case: &RmsNormCase, tol: f64) -> Result<(), TestCaseError> {
    let run =
        run_rmsnorm_residual(&launcher(), case).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let (eh, ey) = (run.h_rel_error.unwrap(), run.y_rel_error.unwrap());
    prop_assert!(eh <= tol, "{case:?}: h max rel error {eh} > {tol}");
    prop_assert!(ey <= tol, "{case:?}: y max rel error {ey} > {tol}");
    prop_assert_eq!(run.launch.report.max_rel_error, Some(eh.max(ey)));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// BH left unset: the runner picks the smallest declared BH ≥ H.
    #[test]
    fn f32_matches_reference(
        rows in 1usize..40,
        hidden in 1usize..3000,
        br in prop::sample::select(vec![1i64, 2, 4, 8]),
        eps in prop::sample::select(vec![1e-6f32, 1e-5, 1e-2]),
        seed in any::<u64>(),
    ) {
        let case = RmsNormCase { rows, hidden, dtype: GemmDtype::F32, config: Config::new().with("BR", br), eps, seed };
        check(&case, TOL_F32)?;
    }

    #[test]
    fn bf16_matches_reference(
        rows in 1usize..40,
        hidden in 1usize..3000,
        br in prop::sample::select(vec![1i64, 2, 4, 8]),
        seed in any::<u64>(),
    ) {
        let case = RmsNormCase { rows, hidden, dtype: GemmDtype::Bf16, config: Config::new().with("BR", br), eps: 1e-6, seed };
        check(&case, TOL_BF16)?;
    }

    /// An explicit BH wider than needed (more padding columns) gives the same numbers.
    #[test]
    fn explicit_wider_bh(
        rows in 1usize..20,
        hidden in 1usize..1024,
        bh in prop::sample::select(vec![1024i64, 2048, 4096, 8192]),
        seed in any::<u64>(),
    ) {
        let case = RmsNormCase { rows, hidden, dtype: GemmDtype::F32, config: Config::new().with("BH", bh).with("BR", 2), eps: 1e-5, seed };
        check(&case, TOL_F32)?;
    }
}

#[test]
fn largest_hidden_size_fits() {
    let case = RmsNormCase {
        rows: 3,
        hidden: 8192,
        dtype: GemmDtype::Bf16,
        config: Config::new(),
        eps: 1e-6,
        seed: 5,
    };
    check(&case, TOL_BF16).unwrap();
}

#[test]
fn bh_choice() {
    assert_eq!(bh_for(1).unwrap(), 256);
    assert_eq!(bh_for(256).unwrap(), 256);
    assert_eq!(bh_for(257).unwrap(), 512);
    assert_eq!(bh_for(4096).unwrap(), 4096);
    assert_eq!(bh_for(5000).unwrap(), 8192);
}

/// A row wider than the largest row tile runs the column-tile loop: both outputs match the
/// reference (functional), and the cost-only run prices the same kernel.
#[test]
fn wide_rows_run_the_loop() {
    for backend in [Backend::Functional, Backend::CostOnly] {
        let case = RmsNormCase {
            rows: 2,
            hidden: 16385,
            dtype: GemmDtype::F32,
            config: Config::new(),
            eps: 1e-6,
            seed: 1,
        };
        let run = run_rmsnorm_residual(&launcher().with_backend(backend), &case).unwrap();
        assert_eq!(
            run.launch.report.kernel,
            kernels::norm::rmsnorm_residual_looped::META.name
        );
        if backend == Backend::Functional {
            let (eh, ey) = (run.h_rel_error.unwrap(), run.y_rel_error.unwrap());
            assert!(eh <= 1e-6 && ey <= 1e-5, "h {eh}, y {ey}");
        }
    }
}

#[test]
fn explicit_narrow_bh_is_a_launch_error() {
    let case = RmsNormCase {
        rows: 2,
        hidden: 300,
        dtype: GemmDtype::F32,
        config: Config::new().with("BH", 256),
        eps: 1e-6,
        seed: 1,
    };
    match run_rmsnorm_residual(&launcher(), &case) {
        Err(SimError::Launch { message, .. }) => assert!(message.contains("300"), "{message}"),
        other => panic!("expected a launch error, got {other:?}"),
    }
}

/// Weight given as `[1, H]` instead of `[H]`, launched directly.
#[test]
fn weight_as_row_matrix() {
    let (rows, h) = (7, 100);
    let mut rng = kernels::testdata::Rng::new(21);
    let (xv, rv, wv) = (
        rng.vec(rows * h, 1.0),
        rng.vec(rows * h, 1.0),
        rng.vec(h, 2.0),
    );
    let x = Tensor::<f32>::from_f32(&[rows, h], &xv).unwrap();
    let res = Tensor::<f32>::from_f32(&[rows, h], &rv).unwrap();
    let w = Tensor::<f32>::from_f32(&[1, h], &wv).unwrap();
    let (ho, yo) = (
        Tensor::<f32>::poisoned(&[rows, h]),
        Tensor::<f32>::poisoned(&[rows, h]),
    );
    let cfg = Config::new().with("BH", 256).with("BR", 4);
    rmsnorm_residual::launch(&launcher(), &cfg, &x, &res, &w, &ho, &yo, 1e-5).unwrap();
    let (want_h, want_y) = kernels::reference::rmsnorm_residual(&xv, &rv, &wv, rows, h, 1e-5);
    for (got, want) in [
        (ho.to_vec().unwrap(), want_h),
        (yo.to_vec().unwrap(), want_y),
    ] {
        let err =
            kernels::reference::max_rel_error(&got, &want, kernels::reference::rms_floor(&want));
        assert!(err <= TOL_F32, "max rel error {err}");
    }
}

#[test]
fn cost_only_cycles_equal_functional() {
    for (dtype, rows, hidden, br) in [
        (GemmDtype::F32, 37, 1100, 1),
        (GemmDtype::Bf16, 64, 4096, 4),
        (GemmDtype::Bf16, 5, 7, 8),
    ] {
        let case = RmsNormCase {
            rows,
            hidden,
            dtype,
            config: Config::new().with("BR", br),
            eps: 1e-6,
            seed: 3,
        };
        let f = run_rmsnorm_residual(&launcher(), &case).unwrap();
        let c = run_rmsnorm_residual(&launcher().with_backend(Backend::CostOnly), &case).unwrap();
        assert!(c.h.is_none() && c.y.is_none());
        assert!(c.launch.report.max_rel_error.is_none());
        assert_eq!(f.launch.report.cycles, c.launch.report.cycles, "{case:?}");
        assert!(f.launch.report.cycles > 0);
    }
}

#[test]
fn deterministic_across_thread_counts() {
    let case = RmsNormCase {
        rows: 300,
        hidden: 2000,
        dtype: GemmDtype::Bf16,
        config: Config::new().with("BR", 2),
        eps: 1e-6,
        seed: 99,
    };
    let one = run_rmsnorm_residual(&launcher().with_threads(1), &case).unwrap();
    let two = run_rmsnorm_residual(&launcher().with_threads(2), &case).unwrap();
    assert_eq!(one.launch.report.cycles, two.launch.report.cycles);
    for (a, b) in [
        (one.h.unwrap(), two.h.unwrap()),
        (one.y.unwrap(), two.y.unwrap()),
    ] {
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "outputs differ bitwise"
        );
    }
}

#[test]
fn registered() {
    // The one-row-tile kernel and the column-tile loop for wider rows.
    let imps = kernels::registry::implementations("rmsnorm_residual");
    let names: Vec<&str> = imps.iter().map(|i| i.meta.name).collect();
    assert_eq!(names, ["rmsnorm_residual", "rmsnorm_residual_looped"]);
    for i in &imps {
        assert_eq!(i.kind, kernels::registry::ImplKind::Dsl);
        assert!(i.meta.params.contains(&"eps"));
    }
}
