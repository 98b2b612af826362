//! gpt-oss's expert operators against their f64 references: the clamped SwiGLU
//! (`swiglu_clamped`) and the per-expert projection biases on expert-grouped rows
//! (`grouped_add_bias`).
//!
//! Tolerances: the clamped SwiGLU ≤ 1e-5 relative (f32 sigmoid and products against f64; the
//! output RMS as the floor, `reference::rel_error`); the bias add ≤ 1e-6 (one f32 addition per
//! element). Inputs are fresh random values wide enough (±12) that both clamps bite; the
//! SwiGLU's output starts poisoned with NaN, the bias add runs in place over every row.

use dsl_core::{Config, Launcher, Tensor};
use kernels::moe::expert_gemm::swiglu_clamped;
use kernels::moe::grouped::run_grouped_add_bias;
use kernels::moe::reference::{grouped_bias, swiglu_clamped as swiglu_clamped_ref};
use kernels::reference::rel_error;
use kernels::testdata::{offsets_of, Rng};
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").expect("built-in preset")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn clamped_swiglu_matches_reference(
        rows in 1usize..40, cols in 1usize..300,
        alpha in prop::sample::select(vec![1.702f32, 1.0]),
        limit in prop::sample::select(vec![7.0f32, 3.0]),
        br in prop::sample::select(vec![16i64, 32]), bc in prop::sample::select(vec![128i64, 256]),
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let (gv, uv) = (rng.vec(rows * cols, 12.0), rng.vec(rows * cols, 12.0));
        let g = Tensor::<f32>::from_f32(&[rows, cols], &gv).unwrap();
        let u = Tensor::<f32>::from_f32(&[rows, cols], &uv).unwrap();
        let h = Tensor::<f32>::poisoned(&[rows, cols]);
        let cfg = Config::new().with("BR", br).with("BC", bc);
        swiglu_clamped::launch(&launcher(), &cfg, &g, &u, &h, alpha, limit).unwrap();
        let want = swiglu_clamped_ref(&gv, &uv, alpha as f64, limit as f64);
        let err = rel_error(&h.to_vec().unwrap(), &want);
        prop_assert!(err <= 1e-5, "{rows}x{cols} alpha {alpha} limit {limit}: {err}");
    }

    /// Uneven routings (experts with no rows, experts striding over several row tiles).
    #[test]
    fn grouped_bias_matches_reference(
        counts in prop::collection::vec(0usize..40, 1..7), n_out in 1usize..300,
        seed in any::<u64>(),
    ) {
        // Some experts may be empty, not all: a launch over no rows has no grid.
        let mut counts = counts;
        if counts.iter().sum::<usize>() == 0 {
            counts[0] = 3;
        }
        let (e, offsets) = (counts.len(), offsets_of(&counts));
        let rows = offsets[e];
        let mut rng = Rng::new(seed);
        let (yv, bv) = (rng.vec(rows * n_out, 1.0), rng.vec(e * n_out, 1.0));
        let y = Tensor::<f32>::from_f32(&[rows, n_out], &yv).unwrap();
        let bias = Tensor::<f32>::from_f32(&[e, n_out], &bv).unwrap();
        let off = Tensor::from_indices(&[e + 1], &offsets.iter().map(|o| *o as i32).collect::<Vec<_>>())
            .unwrap();
        let r = run_grouped_add_bias(&launcher(), &y, &bias, &off).unwrap();
        prop_assert!(r.report.cycles > 0);
        let want = grouped_bias(&yv, &bv, &offsets, n_out).unwrap();
        let err = rel_error(&y.to_vec().unwrap(), &want);
        prop_assert!(err <= 1e-6, "{counts:?} x {n_out}: {err}");
    }
}

#[test]
fn grouped_bias_refuses_bad_shapes() {
    let y = Tensor::<f32>::from_f32(&[4, 8], &[0.5; 32]).unwrap();
    let off = Tensor::from_indices(&[3], &[0, 2, 4]).unwrap();
    let wide = Tensor::<f32>::from_f32(&[2, 9], &[0.5; 18]).unwrap();
    let e = run_grouped_add_bias(&launcher(), &y, &wide, &off).unwrap_err();
    assert!(e.to_string().contains("Nout = 8"), "{e}");
    let three = Tensor::<f32>::from_f32(&[3, 8], &[0.5; 24]).unwrap();
    let e = run_grouped_add_bias(&launcher(), &y, &three, &off).unwrap_err();
    assert!(e.to_string().contains("offsets"), "{e}");
}
