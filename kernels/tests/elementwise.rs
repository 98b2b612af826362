//! Element-wise kernels (`add`, `add_bias`, `sigmoid_mul`, `sigmoid_mul_col`, `mul_col`) against the f64
//! reference.
//!
//! Tolerance: f32 ≤ 1e-5 max relative error (reference RMS as the floor; one or two f32
//! operations per element, plus the sigmoid's exp). Inputs are fresh random values, shapes ragged
//! (not multiples of any tile), outputs poisoned with NaN beforehand.

use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::elementwise::{
    add_bias, run_add, run_add_bias, run_mul_col, run_sigmoid_mul, run_sigmoid_mul_col,
    sigmoid_mul, tiles_for,
};
use kernels::reference::{self, rel_error};
use kernels::testdata::Rng;
use proptest::prelude::*;

const TOL: f64 = 1e-5;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

fn tensor(shape: &[usize], v: &[f32]) -> Tensor<f32> {
    Tensor::from_f32(shape, v).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn add_matches_reference(rows in 1usize..80, cols in 1usize..700, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (av, bv) = (rng.vec(rows * cols, 1.0), rng.vec(rows * cols, 1.0));
        let out = Tensor::<f32>::poisoned(&[rows, cols]);
        run_add(&launcher(), &tensor(&[rows, cols], &av), &tensor(&[rows, cols], &bv), &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::add(&av, &bv));
        prop_assert!(err <= TOL, "{rows}x{cols}: max rel error {err}");
    }

    #[test]
    fn add_bias_matches_reference(rows in 1usize..80, cols in 1usize..700, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (xv, bv) = (rng.vec(rows * cols, 1.0), rng.vec(cols, 1.0));
        let out = Tensor::<f32>::poisoned(&[rows, cols]);
        run_add_bias(&launcher(), &tensor(&[rows, cols], &xv), &tensor(&[1, cols], &bv), &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::add_bias(&xv, &bv));
        prop_assert!(err <= TOL, "{rows}x{cols}: max rel error {err}");
    }

    /// Every declared tile, in place (`out` is `x`, as the attention adds its biases).
    #[test]
    fn add_bias_in_place_any_tiles(config in prop::sample::select(add_bias::META.space()), seed in any::<u64>()) {
        let (rows, cols) = (19, 133);
        let mut rng = Rng::new(seed);
        let (xv, bv) = (rng.vec(rows * cols, 1.0), rng.vec(cols, 1.0));
        let x = tensor(&[rows, cols], &xv);
        add_bias::launch(&launcher(), &config, &x, &tensor(&[1, cols], &bv), &x).unwrap();
        let err = rel_error(&x.to_vec().unwrap(), &reference::add_bias(&xv, &bv));
        prop_assert!(err <= TOL, "{config}: max rel error {err}");
    }

    #[test]
    fn sigmoid_mul_matches_reference(rows in 1usize..80, cols in 1usize..700, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (gv, xv) = (rng.vec(rows * cols, 6.0), rng.vec(rows * cols, 1.0));
        let out = Tensor::<f32>::poisoned(&[rows, cols]);
        run_sigmoid_mul(&launcher(), &tensor(&[rows, cols], &gv), &tensor(&[rows, cols], &xv), &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::sigmoid_mul(&gv, &xv));
        prop_assert!(err <= TOL, "{rows}x{cols}: max rel error {err}");
    }

    #[test]
    fn sigmoid_mul_col_matches_reference(rows in 1usize..80, cols in 1usize..700, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (gv, xv) = (rng.vec(rows, 6.0), rng.vec(rows * cols, 1.0));
        let out = Tensor::<f32>::poisoned(&[rows, cols]);
        run_sigmoid_mul_col(&launcher(), &tensor(&[rows, 1], &gv), &tensor(&[rows, cols], &xv), &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::sigmoid_mul_col(&gv, &xv, cols));
        prop_assert!(err <= TOL, "{rows}x{cols}: max rel error {err}");
    }

    #[test]
    fn mul_col_matches_reference(rows in 1usize..80, cols in 1usize..700, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (sv, xv) = (rng.vec(rows, 2.0), rng.vec(rows * cols, 1.0));
        let out = Tensor::<f32>::poisoned(&[rows, cols]);
        run_mul_col(&launcher(), &tensor(&[rows, 1], &sv), &tensor(&[rows, cols], &xv), &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::mul_col(&sv, &xv, cols));
        prop_assert!(err <= TOL, "{rows}x{cols}: max rel error {err}");
    }

    /// Every declared tile shape, launched directly, on a ragged shape.
    #[test]
    fn any_declared_tiles(config in prop::sample::select(sigmoid_mul::META.space()), seed in any::<u64>()) {
        let (rows, cols) = (23, 301);
        let mut rng = Rng::new(seed);
        let (gv, xv) = (rng.vec(rows * cols, 6.0), rng.vec(rows * cols, 1.0));
        let out = Tensor::<f32>::poisoned(&[rows, cols]);
        sigmoid_mul::launch(&launcher(), &config, &tensor(&[rows, cols], &gv), &tensor(&[rows, cols], &xv), &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::sigmoid_mul(&gv, &xv));
        prop_assert!(err <= TOL, "{config}: max rel error {err}");
    }
}

#[test]
fn tiles_cover_small_shapes_and_fit_the_core() {
    const NPU: u64 = 512 * 1024;
    let c = tiles_for(1, 64, NPU);
    assert_eq!((c.get("BR"), c.get("BC")), (Some(1), Some(64)));
    let c = tiles_for(5, 96, NPU);
    assert_eq!((c.get("BR"), c.get("BC")), (Some(16), Some(128)));
    let c = tiles_for(1000, 7168, NPU);
    assert_eq!((c.get("BR"), c.get("BC")), (Some(64), Some(512)));
    // An H100-class SM (228 KB) cannot hold three 64×512 f32 tiles: 16 rows.
    let c = tiles_for(1000, 7168, 233_472);
    assert_eq!((c.get("BR"), c.get("BC")), (Some(16), Some(512)));
    for p in accel_sim::DevicePreset::builtin_names() {
        let sram = accel_sim::DevicePreset::load(p)
            .unwrap()
            .sram
            .bytes_per_core;
        let c = tiles_for(4096, 7168, sram);
        let bytes = 3 * c.get("BR").unwrap() as u64 * c.get("BC").unwrap() as u64 * 4;
        assert!(bytes <= sram, "{p}: {bytes} > {sram}");
    }
}

#[test]
fn mismatched_shapes_are_launch_errors() {
    let l = launcher();
    let a = Tensor::<f32>::poisoned(&[4, 8]);
    let b = Tensor::<f32>::poisoned(&[4, 9]);
    let out = Tensor::<f32>::poisoned(&[4, 8]);
    match run_add(&l, &a, &b, &out) {
        Err(SimError::Launch { message, .. }) => {
            assert!(message.starts_with("b is"), "{message}")
        }
        other => panic!("expected a launch error, got {other:?}"),
    }
    assert!(matches!(
        run_sigmoid_mul(&l, &b, &a, &out),
        Err(SimError::Launch { .. })
    ));
    // A per-row gate must be [T, 1].
    match run_sigmoid_mul_col(&l, &a, &a, &out) {
        Err(SimError::Launch { message, .. }) => {
            assert!(message.contains("one value per row"), "{message}")
        }
        other => panic!("expected a launch error, got {other:?}"),
    }
    assert!(matches!(
        run_mul_col(&l, &a, &a, &out),
        Err(SimError::Launch { .. })
    ));
}

#[test]
fn registered() {
    for op in [
        "add",
        "add_bias",
        "sigmoid_mul",
        "sigmoid_mul_col",
        "mul_col",
    ] {
        let imps = kernels::registry::implementations(op);
        assert_eq!(imps.len(), 1, "{op}");
        assert_eq!(imps[0].meta.name, op);
    }
}
