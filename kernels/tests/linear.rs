//! The linear layer (`y = x · wᵀ`, weight `[out, in]`) against the f64 reference.
//!
//! Tolerances (max relative error with the reference's RMS as the floor, see
//! `reference::max_rel_error`): f32 ≤ 1e-5 (K ≤ 300 here, a short reduction); bf16 inputs
//! ≤ 1e-2 against the f64 reference of the bf16-rounded inputs (accumulation is f32, the output
//! f32). Inputs are fresh random values (never zeros), sizes are drawn ragged (not multiples of
//! any tile), and the output starts poisoned with NaN, so an unwritten element fails.

use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::linear::{linear, run_linear, run_linear_heads, tiles_for};
use kernels::reference::{linear as linear_ref, rel_error};
use kernels::testdata::Rng;
use kernels::weight::Weight;
use proptest::prelude::*;

const TOL_F32: f64 = 1e-5;
const TOL_BF16: f64 = 1e-2;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

/// Runs `run_linear` on random `x [m, k]`, `w [n, k]` and returns the max relative error.
fn check<T: Float>(m: usize, n: usize, k: usize, seed: u64) -> f64 {
    let mut rng = Rng::new(seed);
    let x = Tensor::<T>::from_f32(&[m, k], &rng.vec(m * k, 1.0)).unwrap();
    let w = Tensor::<T>::from_f32(&[n, k], &rng.vec(n * k, 1.0)).unwrap();
    let y = Tensor::<f32>::poisoned(&[m, n]);
    run_linear(&launcher(), &x, &w, &y).unwrap();
    let want = linear_ref(&x.to_vec().unwrap(), &w.to_vec().unwrap(), m, n, k);
    rel_error(&y.to_vec().unwrap(), &want)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn f32_matches_reference(m in 1usize..150, n in 1usize..300, k in 1usize..300, seed in any::<u64>()) {
        let err = check::<f32>(m, n, k, seed);
        prop_assert!(err <= TOL_F32, "m={m} n={n} k={k}: max rel error {err}");
    }

    #[test]
    fn bf16_matches_reference(m in 1usize..70, n in 1usize..200, k in 1usize..200, seed in any::<u64>()) {
        let err = check::<bf16>(m, n, k, seed);
        prop_assert!(err <= TOL_BF16, "m={m} n={n} k={k}: max rel error {err}");
    }

    /// Every declared tile configuration gives the reference's numbers on a ragged shape.
    #[test]
    fn any_declared_tiles(config in prop::sample::select(linear::META.space()), seed in any::<u64>()) {
        let (m, n, k) = (37, 91, 75);
        let mut rng = Rng::new(seed);
        let (xv, wv) = (rng.vec(m * k, 1.0), rng.vec(n * k, 1.0));
        let x = Tensor::<f32>::from_f32(&[m, k], &xv).unwrap();
        let w = Tensor::<f32>::from_f32(&[n, k], &wv).unwrap();
        let y = Tensor::<f32>::poisoned(&[m, n]);
        linear::launch(&launcher(), &config, &x, &w, &y).unwrap();
        let err = rel_error(&y.to_vec().unwrap(), &linear_ref(&xv, &wv, m, n, k));
        prop_assert!(err <= TOL_F32, "{config}: max rel error {err}");
    }

    /// Rows spanning several groups of row tiles, the last one partial (`tile_order`): every
    /// output row is written once, by its tile's program, and the grid's padding programs write
    /// nothing.
    #[test]
    fn grouped_row_tiles_cover_every_row(m in 65usize..400, n in 1usize..40, seed in any::<u64>()) {
        let k = 24;
        let mut rng = Rng::new(seed);
        let (xv, wv) = (rng.vec(m * k, 1.0), rng.vec(n * k, 1.0));
        let x = Tensor::<f32>::from_f32(&[m, k], &xv).unwrap();
        let w = Tensor::<f32>::from_f32(&[n, k], &wv).unwrap();
        let y = Tensor::<f32>::poisoned(&[m, n]);
        let config = Config::new().with("BM", 8).with("BN", 16).with("BK", 16);
        let launch = linear::launch(&launcher(), &config, &x, &w, &y).unwrap();
        prop_assert!(launch.report.grid[2] >= 2, "{:?}", launch.report.grid);
        let err = rel_error(&y.to_vec().unwrap(), &linear_ref(&xv, &wv, m, n, k));
        prop_assert!(err <= TOL_F32, "m={m} n={n}: max rel error {err}");
    }
}

/// The tiny checkpoints' shapes (decode and prefill rows, hidden 64..96, vocab 256).
#[test]
fn model_shapes() {
    for (m, n, k) in [
        (1, 256, 96),
        (7, 64, 96),
        (13, 192, 64),
        (1, 3, 64),
        (5, 256, 72),
    ] {
        let err = check::<f32>(m, n, k, (m * n + k) as u64);
        assert!(err <= TOL_F32, "m={m} n={n} k={k}: max rel error {err}");
    }
}

#[test]
fn tile_choice_covers_small_and_caps_large() {
    let c = tiles_for(1, 3, 20);
    assert_eq!(
        (c.get("BM"), c.get("BN"), c.get("BK")),
        (Some(8), Some(16), Some(32))
    );
    let c = tiles_for(33, 100, 64);
    assert_eq!(
        (c.get("BM"), c.get("BN"), c.get("BK")),
        (Some(64), Some(128), Some(64))
    );
    let c = tiles_for(4096, 7168, 2048);
    assert_eq!(
        (c.get("BM"), c.get("BN"), c.get("BK")),
        (Some(64), Some(128), Some(64))
    );
}

#[test]
fn mismatched_shapes_are_launch_errors() {
    let x = Tensor::<f32>::from_f32(&[3, 10], &[0.5; 30]).unwrap();
    let w = Tensor::<f32>::from_f32(&[4, 11], &[0.5; 44]).unwrap();
    let y = Tensor::<f32>::poisoned(&[3, 4]);
    match run_linear(&launcher(), &x, &w, &y) {
        Err(SimError::Launch { message, .. }) => assert!(message.contains("[N, 10]"), "{message}"),
        other => panic!("expected a launch error, got {other:?}"),
    }
    let w = Tensor::<f32>::from_f32(&[4, 10], &[0.5; 40]).unwrap();
    let y = Tensor::<f32>::poisoned(&[3, 5]);
    assert!(matches!(
        run_linear(&launcher(), &x, &w, &y),
        Err(SimError::Launch { .. })
    ));
}

#[test]
fn cost_only_cycles_equal_functional() {
    let (m, n, k) = (9, 200, 96);
    let x = Tensor::<bf16>::from_f32(&[m, k], &Rng::new(1).vec(m * k, 1.0)).unwrap();
    let w = Tensor::<bf16>::from_f32(&[n, k], &Rng::new(2).vec(n * k, 1.0)).unwrap();
    let y = Tensor::<f32>::poisoned(&[m, n]);
    let f = run_linear(&launcher(), &x, &w, &y).unwrap();
    let c = run_linear(
        &launcher().with_backend(Backend::CostOnly),
        &Tensor::<bf16>::shape_only(&[m, k]),
        &Tensor::<bf16>::shape_only(&[n, k]),
        &Tensor::<f32>::shape_only(&[m, n]),
    )
    .unwrap();
    assert!(f.report.cycles > 0);
    assert_eq!(f.report.cycles, c.report.cycles);
}

#[test]
fn registered() {
    // The tiled kernel, and its split-K form for decode shapes that leave cores idle.
    let imps = kernels::registry::implementations("linear");
    let names: Vec<&str> = imps.iter().map(|i| i.meta.name).collect();
    assert_eq!(names, ["linear", "linear_split_k"]);
}

/// f64 reference of [`kernels::linear::linear_heads`]: head `h` of `y` (columns `h·ys ..`) is
/// `x[:, h·xs .. h·xs + k] · w[h·n .. (h+1)·n]ᵀ`.
#[allow(clippy::too_many_arguments)]
fn linear_heads_ref(
    x: &[f32],
    xc: usize,
    w: &[f32],
    m: usize,
    heads: usize,
    (n, k): (usize, usize),
    (xs, ys, yc): (usize, usize, usize),
) -> Vec<Option<f64>> {
    let mut y = vec![None; m * yc];
    for h in 0..heads {
        let xh: Vec<f32> = (0..m)
            .flat_map(|i| x[i * xc + h * xs..][..k].to_vec())
            .collect();
        let yh = linear_ref(&xh, &w[h * n * k..(h + 1) * n * k], m, n, k);
        for i in 0..m {
            for j in 0..n {
                y[i * yc + h * ys + j] = Some(yh[i * n + j]);
            }
        }
    }
    y
}

/// Runs `run_linear_heads` on random inputs laid out as MLA's absorbed projections lay them
/// (head windows `xs`/`ys` apart, possibly with gaps) and returns the max relative error over the
/// heads' outputs; elements outside every head must stay poisoned (NaN).
fn check_heads<T: Float>(
    m: usize,
    heads: usize,
    (n, k): (usize, usize),
    (x_gap, y_gap): (usize, usize),
    seed: u64,
    wrap: fn(Tensor<T>) -> Weight,
) -> f64 {
    let (xs, ys) = (k + x_gap, n + y_gap);
    let (xc, yc) = (heads * xs, heads * ys);
    let mut rng = Rng::new(seed);
    let x = Tensor::<f32>::from_f32(&[m, xc], &rng.vec(m * xc, 1.0)).unwrap();
    let wt = Tensor::<T>::from_f32(&[heads * n, k], &rng.vec(heads * n * k, 1.0)).unwrap();
    let w = wrap(wt.clone());
    let y = Tensor::<f32>::poisoned(&[m, yc]);
    run_linear_heads(&launcher(), &x, &w, &y, heads, xs, ys).unwrap();
    let want = linear_heads_ref(
        &x.to_vec().unwrap(),
        xc,
        &wt.to_vec().unwrap(),
        m,
        heads,
        (n, k),
        (xs, ys, yc),
    );
    let got = y.to_vec().unwrap();
    let (mut g, mut r) = (Vec::new(), Vec::new());
    for (v, want) in got.iter().zip(&want) {
        match want {
            Some(w) => {
                g.push(*v);
                r.push(*w);
            }
            None => assert!(v.is_nan(), "a column between heads was written: {v}"),
        }
    }
    rel_error(&g, &r)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn heads_f32_match_reference(
        m in 1usize..70, heads in 1usize..9, n in 1usize..150, k in 1usize..150,
        x_gap in 0usize..20, y_gap in 0usize..20, seed in any::<u64>(),
    ) {
        let err = check_heads::<f32>(m, heads, (n, k), (x_gap, y_gap), seed, Weight::F32);
        prop_assert!(err <= TOL_F32, "m={m} heads={heads} n={n} k={k}: max rel error {err}");
    }

    #[test]
    fn heads_bf16_match_reference(
        m in 1usize..40, heads in 1usize..9, n in 1usize..150, k in 1usize..150,
        x_gap in 0usize..20, y_gap in 0usize..20, seed in any::<u64>(),
    ) {
        let err = check_heads::<bf16>(m, heads, (n, k), (x_gap, y_gap), seed, Weight::Bf16);
        prop_assert!(err <= TOL_BF16, "m={m} heads={heads} n={n} k={k}: max rel error {err}");
    }
}

/// MLA's shapes: absorbed queries (128-wide nope parts every 192 columns into 512-wide latents
/// every 576) and the way back (512 → 128), at decode and prefill row counts.
#[test]
fn heads_mla_shapes() {
    for (m, heads, n, k, xg, yg) in [
        (1, 4, 512, 128, 64, 64),
        (3, 2, 128, 512, 0, 0),
        (70, 3, 64, 32, 16, 16),
    ] {
        let err = check_heads::<f32>(m, heads, (n, k), (xg, yg), (m + heads) as u64, Weight::F32);
        assert!(err <= TOL_F32, "m={m} heads={heads}: max rel error {err}");
    }
}

#[test]
fn heads_bad_layouts_are_launch_errors() {
    let x = Tensor::<f32>::from_f32(&[2, 20], &[0.5; 40]).unwrap();
    let w = Weight::F32(Tensor::<f32>::from_f32(&[6, 8], &[0.5; 48]).unwrap());
    let y = Tensor::<f32>::poisoned(&[2, 12]);
    let l = launcher();
    for (heads, xs, ys, what) in [
        (0, 8, 4, "do not split into 0 heads"),
        (4, 8, 4, "do not split into 4 heads"),
        (2, 13, 6, "lies outside"),
        (2, 8, 2, "overlap"),
    ] {
        match run_linear_heads(&l, &x, &w, &y, heads, xs, ys) {
            Err(SimError::Launch { message, .. }) => {
                assert!(message.contains(what), "{what}: {message}")
            }
            other => panic!("{what}: expected a launch error, got {other:?}"),
        }
    }
    let short = Tensor::<f32>::poisoned(&[3, 12]);
    match run_linear_heads(&l, &x, &w, &short, 2, 8, 6) {
        Err(SimError::Launch { message, .. }) => assert!(message.contains("rows"), "{message}"),
        other => panic!("expected a launch error, got {other:?}"),
    }
}
