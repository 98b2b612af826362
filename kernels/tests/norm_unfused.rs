//! Plain RMSNorm and LayerNorm (no residual) against the f64 reference, including the per-head
//! RMSNorm of Qwen3-Next (`q_norm`/`k_norm` over `head_dim`) run on a `[T·H, D]` reshaped view.
//!
//! Tolerances (max relative error, reference RMS as the floor): f32 ≤ 1e-5; bf16 ≤ 1e-2 against
//! the f64 reference of the bf16-rounded inputs. Inputs are fresh random values (LayerNorm's
//! offset from zero, so the mean matters), widths ragged, outputs poisoned with NaN.

use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::norm::{layernorm, run_layernorm, run_rmsnorm};
use kernels::reference::{self, rel_error};
use kernels::testdata::Rng;
use proptest::prelude::*;

const TOL_F32: f64 = 1e-5;
const TOL_BF16: f64 = 1e-2;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

/// A `T` tensor of `n` values uniform in `center ± scale`, and its values after rounding to `T`.
fn input<T: Float>(
    rng: &mut Rng,
    shape: &[usize],
    center: f32,
    scale: f32,
) -> (Tensor<T>, Vec<f32>) {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = rng.vec(n, scale).into_iter().map(|x| x + center).collect();
    let t = Tensor::<T>::from_f32(shape, &v).unwrap();
    let rounded = t.to_vec().unwrap();
    (t, rounded)
}

fn rms_err<T: Float>(rows: usize, h: usize, eps: f32, seed: u64) -> f64 {
    let mut rng = Rng::new(seed);
    let (x, xv) = input::<T>(&mut rng, &[rows, h], 0.0, 1.0);
    let (w, wv) = input::<T>(&mut rng, &[h], 1.0, 0.5);
    let y = Tensor::<T>::poisoned(&[rows, h]);
    run_rmsnorm(&launcher(), &x, &w, &y, eps).unwrap();
    rel_error(
        &y.to_vec().unwrap(),
        &reference::rmsnorm(&xv, &wv, rows, h, eps),
    )
}

fn ln_err<T: Float>(rows: usize, h: usize, eps: f32, seed: u64) -> f64 {
    let mut rng = Rng::new(seed);
    let (x, xv) = input::<T>(&mut rng, &[rows, h], 0.7, 1.0);
    let (w, wv) = input::<T>(&mut rng, &[h], 1.0, 0.5);
    let (b, bv) = input::<T>(&mut rng, &[h], 0.0, 0.5);
    let y = Tensor::<T>::poisoned(&[rows, h]);
    run_layernorm(&launcher(), &x, &w, &b, &y, eps).unwrap();
    rel_error(
        &y.to_vec().unwrap(),
        &reference::layernorm(&xv, &wv, &bv, rows, h, eps),
    )
}

/// The declared configurations whose row tile holds at most 16 Ki elements (with the kernel's
/// temporaries, larger ones can exceed the 512 KiB on-chip buffer, which the launch refuses).
fn small_tiles() -> Vec<Config> {
    layernorm::META
        .space()
        .into_iter()
        .filter(|c| c.get("BH").unwrap() * c.get("BR").unwrap() <= 16384)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn rmsnorm_f32(rows in 1usize..40, h in 1usize..3000, eps in prop::sample::select(vec![1e-6f32, 1e-5, 1e-2]), seed in any::<u64>()) {
        let err = rms_err::<f32>(rows, h, eps, seed);
        prop_assert!(err <= TOL_F32, "{rows}x{h}: max rel error {err}");
    }

    #[test]
    fn rmsnorm_bf16(rows in 1usize..40, h in 1usize..3000, seed in any::<u64>()) {
        let err = rms_err::<bf16>(rows, h, 1e-6, seed);
        prop_assert!(err <= TOL_BF16, "{rows}x{h}: max rel error {err}");
    }

    #[test]
    fn layernorm_f32(rows in 1usize..40, h in 1usize..3000, eps in prop::sample::select(vec![1e-6f32, 1e-5]), seed in any::<u64>()) {
        let err = ln_err::<f32>(rows, h, eps, seed);
        prop_assert!(err <= TOL_F32, "{rows}x{h}: max rel error {err}");
    }

    #[test]
    fn layernorm_bf16(rows in 1usize..40, h in 1usize..3000, seed in any::<u64>()) {
        let err = ln_err::<bf16>(rows, h, 1e-6, seed);
        prop_assert!(err <= TOL_BF16, "{rows}x{h}: max rel error {err}");
    }

    /// Qwen3-Next's per-head q/k norm: `[T, H·D]` activations normalised over each head's `D`
    /// values, as `rmsnorm` on the `[T·H, D]` view of the same memory.
    #[test]
    fn per_head_rmsnorm_on_reshaped_view(tokens in 1usize..20, heads in 1usize..6, d in prop::sample::select(vec![16usize, 32, 24, 256]), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (x, xv) = input::<f32>(&mut rng, &[tokens, heads * d], 0.0, 1.0);
        let (w, wv) = input::<f32>(&mut rng, &[d], 1.0, 0.5);
        let y = Tensor::<f32>::poisoned(&[tokens, heads * d]);
        let (xh, yh) = (x.reshaped(&[tokens * heads, d]).unwrap(), y.reshaped(&[tokens * heads, d]).unwrap());
        run_rmsnorm(&launcher(), &xh, &w, &yh, 1e-6).unwrap();
        // The reference normalises each head separately: rows of D values.
        let want = reference::rmsnorm(&xv, &wv, tokens * heads, d, 1e-6);
        let err = rel_error(&y.to_vec().unwrap(), &want);
        prop_assert!(err <= TOL_F32, "{tokens}x{heads}x{d}: max rel error {err}");
    }

    /// Every declared (BH ≥ H, BR) configuration, launched directly.
    #[test]
    fn layernorm_any_declared_tiles(config in prop::sample::select(small_tiles()), seed in any::<u64>()) {
        let h = 13usize;
        let rows = 19;
        let mut rng = Rng::new(seed);
        let (x, xv) = input::<f32>(&mut rng, &[rows, h], -0.4, 1.0);
        let (w, wv) = input::<f32>(&mut rng, &[h], 1.0, 0.5);
        let (b, bv) = input::<f32>(&mut rng, &[h], 0.0, 0.5);
        let y = Tensor::<f32>::poisoned(&[rows, h]);
        layernorm::launch(&launcher(), &config, &x, &w, &b, &y, 1e-5).unwrap();
        let err = rel_error(&y.to_vec().unwrap(), &reference::layernorm(&xv, &wv, &bv, rows, h, 1e-5));
        prop_assert!(err <= TOL_F32, "{config}: max rel error {err}");
    }
}

/// Rows wider than the largest row tile run the column-tile loops (`rmsnorm_looped`,
/// `layernorm_looped`) and match the
/// reference, including a ragged last tile; shapes the loop cannot take are still launch errors.
#[test]
fn wide_rows_run_the_loop_and_mismatched_are_launch_errors() {
    for (h, seed) in [(16385, 3u64), (20480 + 77, 4)] {
        let err = rms_err::<f32>(3, h, 1e-6, seed);
        assert!(err <= TOL_F32, "RMSNorm H={h}: max rel error {err}");
        let err = ln_err::<f32>(3, h, 1e-5, seed);
        assert!(err <= TOL_F32, "LayerNorm H={h}: max rel error {err}");
    }
    let l = launcher();
    let x = Tensor::<f32>::poisoned(&[2, 16385]);
    let short = Tensor::<f32>::poisoned(&[16384]);
    match run_rmsnorm(&l, &x, &short, &x.clone(), 1e-6) {
        Err(SimError::Launch { kernel, message }) => {
            assert_eq!(kernel, kernels::norm::rmsnorm_looped::META.name);
            assert!(message.contains("weight"), "{message}");
        }
        other => panic!("expected a launch error, got {other:?}"),
    }
    let x = Tensor::<f32>::poisoned(&[2, 10]);
    let w = Tensor::<f32>::poisoned(&[10]);
    let short = Tensor::<f32>::poisoned(&[9]);
    match run_layernorm(&l, &x, &w, &short, &x.clone(), 1e-6) {
        Err(SimError::Launch { message, .. }) => assert!(message.starts_with("bias"), "{message}"),
        other => panic!("expected a launch error, got {other:?}"),
    }
    let y = Tensor::<f32>::poisoned(&[3, 10]);
    assert!(matches!(
        run_rmsnorm(&l, &x, &w, &y, 1e-6),
        Err(SimError::Launch { .. })
    ));
}

#[test]
fn cost_only_cycles_equal_functional() {
    let (rows, h) = (11, 96);
    let mut rng = Rng::new(4);
    let (x, _) = input::<bf16>(&mut rng, &[rows, h], 0.0, 1.0);
    let (w, _) = input::<bf16>(&mut rng, &[h], 1.0, 0.5);
    let (b, _) = input::<bf16>(&mut rng, &[h], 0.0, 0.5);
    let y = Tensor::<bf16>::poisoned(&[rows, h]);
    let f = run_layernorm(&launcher(), &x, &w, &b, &y, 1e-6).unwrap();
    let (sx, sw, sb, sy) = (
        Tensor::<bf16>::shape_only(&[rows, h]),
        Tensor::<bf16>::shape_only(&[h]),
        Tensor::<bf16>::shape_only(&[h]),
        Tensor::<bf16>::shape_only(&[rows, h]),
    );
    let c = run_layernorm(
        &launcher().with_backend(Backend::CostOnly),
        &sx,
        &sw,
        &sb,
        &sy,
        1e-6,
    )
    .unwrap();
    assert!(f.report.cycles > 0);
    assert_eq!(f.report.cycles, c.report.cycles);
}

#[test]
fn registered() {
    // Each: the one-row-tile kernel and the column-tile loop for wider rows.
    for op in ["rmsnorm", "layernorm"] {
        let imps = kernels::registry::implementations(op);
        let names: Vec<&str> = imps.iter().map(|i| i.meta.name).collect();
        assert_eq!(names, [op.to_string(), format!("{op}_looped")], "{op}");
        assert!(imps.iter().all(|i| i.meta.params.contains(&"eps")));
    }
}
