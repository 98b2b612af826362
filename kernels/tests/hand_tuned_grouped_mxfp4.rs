//! The hand-tuned grouped MXFP4 expert GEMM (`grouped_linear_mxfp4_hand`, accel-sim's manual API,
//! the model's layout: f32 rows of all experts, run-time row ranges) against the f64 product of
//! the bf16-rounded rows and the dequantized weights, beside its DSL prototype
//! (`grouped_linear_mxfp4`) on the same inputs.
//!
//! Tolerance: relative error ≤ 1e-5 (the reference's RMS as the floor, `reference::rel_error`):
//! both kernels round the activations to bf16 on chip (the reference does too) and MXFP4 values
//! are exact in bf16, so only f32 accumulation error remains. Inputs are fresh random values, the
//! weights quantized with the OCP rule, routings uneven with empty experts; outputs start
//! poisoned with NaN.

use dsl_core::{bf16, Backend, Config, Launcher, Report, Tensor};
use kernels::hand_tuned::expert_gemm_mxfp4 as hand;
use kernels::moe::expert_gemm::{prepare_weight, ExpertWeight, WeightPath};
use kernels::moe::grouped::grouped_linear_mxfp4;
use kernels::testdata::Rng;
use proptest::prelude::*;

/// Runs the hand-tuned kernel or the DSL prototype over `counts[e]` rows per expert: (report,
/// max relative error against the f64 reference in functional runs).
fn run(
    launcher: &Launcher,
    hand_tuned: bool,
    counts: &[usize],
    [n, k]: [usize; 2],
    config: &Config,
    seed: u64,
) -> (Report, Option<f64>) {
    let functional = launcher.backend == Backend::Functional;
    let (e, rows) = (counts.len(), counts.iter().sum::<usize>());
    let mut rng = Rng::new(seed);
    let xv = rng.vec(rows * k, 1.0);
    let x: Tensor<f32> = if functional {
        Tensor::from_f32(&[rows, k], &xv).unwrap()
    } else {
        Tensor::shape_only(&[rows, k])
    };
    let w = prepare_weight(launcher, WeightPath::Mxfp4Online, [e, n, k], &mut rng, "w").unwrap();
    let ExpertWeight::Mxfp4 { blocks, scales } = &w.device else {
        panic!("the MXFP4 path stores packed blocks and scales");
    };
    let mut offsets = vec![0usize];
    for c in counts {
        offsets.push(offsets.last().unwrap() + c);
    }
    let idx: Vec<i32> = offsets.iter().map(|o| *o as i32).collect();
    let off = Tensor::from_indices(&[e + 1], &idx).unwrap();
    let y: Tensor<f32> = if functional {
        Tensor::poisoned(&[rows, n])
    } else {
        Tensor::shape_only(&[rows, n])
    };
    let report = if hand_tuned {
        hand::launch_grouped(launcher, config, &x, blocks, scales, &off, &y)
    } else {
        // The prototype's tiles, without the ring depth it does not have.
        let mut tiles = config.clone();
        tiles.0.remove("STAGES");
        grouped_linear_mxfp4::launch::<bf16>(launcher, &tiles, &x, blocks, scales, &off, &y)
    }
    .unwrap()
    .report;
    let err = y.to_vec().zip(w.values.as_ref()).map(|(got, wv)| {
        let xb: Vec<f32> = xv
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_f32())
            .collect();
        let want = kernels::moe::reference::grouped_linear(&xb, wv, &offsets, n, k).unwrap();
        kernels::reference::rel_error(&got, &want)
    });
    (report, err)
}

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").expect("built-in preset")
}

fn tiles(bm: i64, bn: i64, bk: i64, stages: i64) -> Config {
    Config::new()
        .with("BM", bm)
        .with("BN", bn)
        .with("BK", bk)
        .with("STAGES", stages)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Uneven routings (experts with no rows, experts with more rows than their even share, so a
    /// program strides over several row tiles), ragged N and K, any tiles and ring depth.
    #[test]
    fn matches_f64_reference_and_the_prototype(
        counts in prop::collection::vec(0usize..40, 1..5), kb in 1usize..10, n in 1usize..300,
        bm in prop::sample::select(vec![16i64, 32]), bn in prop::sample::select(vec![64i64, 128]),
        bk in prop::sample::select(vec![64i64, 128]), stages in prop::sample::select(vec![2i64, 3, 4]),
        seed in any::<u64>(),
    ) {
        // Some experts may be empty, not all: a launch over no rows at all has no grid.
        let mut counts = counts;
        if counts.iter().sum::<usize>() == 0 {
            counts[0] = 3;
        }
        let config = tiles(bm, bn, bk, stages);
        let shape = [n, kb * 32];
        let (r, err) = run(&launcher(), true, &counts, shape, &config, seed);
        let err = err.unwrap();
        prop_assert!(err <= 1e-5, "{counts:?} {shape:?} {config}: {err}");
        let (_, dsl_err) = run(&launcher(), false, &counts, shape, &config, seed);
        prop_assert!(dsl_err.unwrap() <= 1e-5);
        prop_assert!(r.cycles > 0);
    }
}

#[test]
fn cost_only_cycles_equal_functional_cycles_on_an_even_routing() {
    // Cost-only launches have no offsets data and share the rows evenly: on an even routing the
    // two runs take the same row ranges.
    let config = tiles(16, 64, 128, 2);
    let counts = [20, 20, 20];
    let f = run(&launcher(), true, &counts, [150, 384], &config, 3).0;
    let o = run(
        &launcher().with_backend(Backend::CostOnly),
        true,
        &counts,
        [150, 384],
        &config,
        3,
    )
    .0;
    assert_eq!((f.cycles, f.hbm_bytes), (o.cycles, o.hbm_bytes));
}

/// On npu-910b, at the same tiles, the hand-tuned kernel beats its DSL prototype at a decode shape
/// (16 rows per expert) and at a prefill shape (512 rows per expert).
#[test]
fn beats_the_dsl_prototype_at_decode_and_prefill_shapes() {
    let l = launcher().with_backend(Backend::CostOnly);
    for (counts, bm) in [(vec![16; 8], 16), (vec![512; 4], 128)] {
        let config = tiles(bm, 128, 128, 2);
        let dsl = run(&l, false, &counts, [2048, 7168], &config, 1).0.cycles;
        let fast = run(&l, true, &counts, [2048, 7168], &config, 1).0.cycles;
        eprintln!("{counts:?} {config}: hand-tuned {fast} cycles, DSL {dsl}");
        assert!(
            fast < dsl,
            "{counts:?}: hand-tuned {fast} cycles, DSL {dsl}"
        );
    }
}
