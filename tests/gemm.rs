//! GEMM kernels against the f64 reference, and the foundation's acceptance properties: timing
//! overlap, SRAM errors, determinism across thread counts, cost-only = functional cycles.
//!
//! Tolerance: relative error ≤ 1e-5 (measured against the reference's RMS, so accidental
//! near-zero outputs do not blow up the ratio). The reference multiplies the *rounded* inputs in
//! f64, so bf16 inputs are held to the same bound: only f32 accumulation error remains.

use accel_sim::SimError;
use dsl_core::{Backend, Config, Launcher};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use proptest::prelude::*;

const VARIANTS: [GemmVariant; 3] = [
    GemmVariant::Naive,
    GemmVariant::DoubleBuffered,
    GemmVariant::Pipelined,
];

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").expect("built-in preset")
}

fn tile(bm: i64, bn: i64, bk: i64) -> Config {
    Config::new().with("BM", bm).with("BN", bn).with("BK", bk)
}

/// The acceptance shape: 1024³, bf16 inputs.
fn case_1024(variant: GemmVariant, config: Config) -> GemmCase {
    GemmCase {
        m: 1024,
        n: 1024,
        k: 1024,
        dtype: GemmDtype::Bf16,
        variant,
        config,
        seed: 1,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random shapes (mostly not multiples of the tile), random tiles, fresh random inputs; the
    /// output starts as NaN, so an unwritten element fails.
    #[test]
    fn gemm_matches_f64_reference(
        m in 1usize..300, n in 1usize..300, k in 1usize..300,
        bm in prop::sample::select(vec![32i64, 64, 128]),
        bn in prop::sample::select(vec![32i64, 64, 128]),
        bk in prop::sample::select(vec![32i64, 64, 128]),
        variant in prop::sample::select(VARIANTS.to_vec()),
        bf16 in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dtype = if bf16 { GemmDtype::Bf16 } else { GemmDtype::F32 };
        let case = GemmCase { m, n, k, dtype, variant, config: tile(bm, bn, bk), seed };
        let run = run_gemm(&launcher(), &case).unwrap();
        let err = run.launch.report.max_rel_error.unwrap();
        prop_assert!(err <= 1e-5, "{variant:?} {m}x{n}x{k} tile {bm}x{bn}x{bk}: max rel error {err}");
        prop_assert!(run.output.unwrap().iter().all(|v| v.is_finite()));
    }
}

#[test]
fn double_buffering_hides_dma_and_the_difference_is_the_exposed_dma() {
    let l = launcher().with_backend(Backend::CostOnly);
    for (bm, bn, bk) in [(128, 128, 64), (128, 128, 128), (256, 128, 128)] {
        let run = |variant| {
            run_gemm(&l, &case_1024(variant, tile(bm, bn, bk)))
                .unwrap()
                .launch
                .report
        };
        let naive = run(GemmVariant::Naive);
        let db = run(GemmVariant::DoubleBuffered);
        assert!(naive.cycles >= naive.roofline_cycles && db.cycles >= db.roofline_cycles);
        assert!(
            naive.cycles as f64 > 1.3 * db.cycles as f64,
            "naive {} vs db {}",
            naive.cycles,
            db.cycles
        );
        let saved = (naive.cycles - db.cycles) as f64;
        let exposed = naive.exposed_dma_cycles as f64 - db.exposed_dma_cycles as f64;
        assert!(
            (saved - exposed).abs() <= 0.05 * saved,
            "saved {saved} cycles but exposed DMA fell by {exposed}"
        );
    }
}

/// Issue #2's acceptance: at 1024³ bf16 on `npu-910b` the double-buffered GEMM with the best
/// tile (the CLI's default, the persistent variant, picked by the same cost-only sweep) is within
/// 1.5× of `roofline_cycles`, and faster than one program per tile. `roofline_cycles` counts the
/// problem's useful work (issue #12), so it is the problem's own minimum, 2·M·N·K at the peak rate
/// of every core, which no tile choice moves (1.465× today under the event-driven memory model;
/// 1.32× under the per-wave bandwidth split, which was optimistic: see BENCHMARKS.md). `flop` is
/// exactly 2·M·N·K whatever the tile; the padded work is `issued_flop`.
#[test]
fn persistent_gemm_with_the_best_tile_is_near_the_roofline() {
    let l = launcher().with_backend(Backend::CostOnly);
    let best = |variant: GemmVariant| {
        let points = day0::tune::sweep(variant.meta().space(), |cfg| {
            Ok(run_gemm(&l, &case_1024(variant, cfg.clone()))?
                .launch
                .report)
        });
        day0::tune::best(&points)
            .unwrap()
            .outcome
            .as_ref()
            .unwrap()
            .clone()
    };
    let persistent = best(GemmVariant::Persistent);
    let per_tile = best(GemmVariant::DoubleBuffered);
    let ideal = (2u64 << 30) as f64 / (8192.0 * 24.0);
    assert!(persistent.cycles >= persistent.roofline_cycles);
    assert_eq!(persistent.flop, 2 * 1024 * 1024 * 1024);
    assert!(persistent.issued_flop >= persistent.flop);
    assert!(
        persistent.cycles as f64 <= 1.5 * persistent.roofline_cycles as f64,
        "{} cycles vs roofline {}",
        persistent.cycles,
        persistent.roofline_cycles
    );
    assert!(
        persistent.cycles as f64 <= 1.5 * ideal,
        "{} cycles vs the problem's minimum {ideal}",
        persistent.cycles
    );
    assert!(
        (persistent.cycles as f64) < 0.9 * per_tile.cycles as f64,
        "persistent {} vs one program per tile {}",
        persistent.cycles,
        per_tile.cycles
    );
}

#[test]
fn tiles_that_overflow_sram_are_an_error_naming_line_bytes_and_capacity() {
    let case = case_1024(GemmVariant::DoubleBuffered, tile(512, 512, 512));
    match run_gemm(&launcher(), &case) {
        Err(SimError::SramOverflow {
            kernel,
            line,
            needed,
            capacity,
            ..
        }) => {
            assert_eq!(kernel, "gemm_db");
            assert!(line > 0);
            assert_eq!(capacity, 512 * 1024);
            assert!(needed > capacity);
        }
        other => panic!("expected an SRAM overflow, got {other:?}"),
    }
}

#[test]
fn unlisted_tunable_value_is_a_launch_error() {
    let case = GemmCase {
        m: 64,
        n: 64,
        k: 64,
        dtype: GemmDtype::F32,
        variant: GemmVariant::Naive,
        config: tile(100, 64, 64),
        seed: 1,
    };
    let err = run_gemm(&launcher(), &case).unwrap_err().to_string();
    assert!(
        err.contains("BM=100") && err.contains("declared values"),
        "{err}"
    );
}

#[test]
fn one_and_two_threads_give_identical_cycles_and_bits() {
    for variant in VARIANTS {
        let case = GemmCase {
            m: 333,
            n: 257,
            k: 190,
            dtype: GemmDtype::Bf16,
            variant,
            config: tile(64, 64, 32),
            seed: 9,
        };
        let one = run_gemm(&launcher().with_threads(1), &case).unwrap();
        let two = run_gemm(&launcher().with_threads(2), &case).unwrap();
        assert_eq!(one.launch.report, two.launch.report);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(one.output.as_ref().unwrap()),
            bits(two.output.as_ref().unwrap())
        );
    }
}

#[test]
fn cost_only_reports_the_same_cycles_as_functional() {
    for variant in VARIANTS {
        let case = GemmCase {
            m: 300,
            n: 200,
            k: 260,
            dtype: GemmDtype::F32,
            variant,
            config: tile(64, 128, 64),
            seed: 3,
        };
        let f = run_gemm(&launcher(), &case).unwrap().launch.report;
        let c = run_gemm(&launcher().with_backend(Backend::CostOnly), &case).unwrap();
        assert!(c.output.is_none());
        let c = c.launch.report;
        assert_eq!(
            (f.cycles, f.hbm_bytes, f.l2_bytes, f.flop, &f.lines),
            (c.cycles, c.hbm_bytes, c.l2_bytes, c.flop, &c.lines)
        );
    }
}

#[test]
fn production_shape_runs_cost_only() {
    let case = GemmCase {
        m: 7168,
        n: 2048,
        k: 7168,
        dtype: GemmDtype::Bf16,
        variant: GemmVariant::DoubleBuffered,
        config: tile(128, 128, 128),
        seed: 0,
    };
    let r = run_gemm(&launcher().with_backend(Backend::CostOnly), &case)
        .unwrap()
        .launch
        .report;
    assert_eq!(r.matrix_flop, 2 * 7168 * 2048 * 7168);
    assert!(r.cycles >= r.roofline_cycles && r.max_rel_error.is_none());
}

#[test]
fn every_engine_cycle_is_attributed_to_a_kernel_line() {
    let case = GemmCase {
        m: 256,
        n: 256,
        k: 256,
        dtype: GemmDtype::Bf16,
        variant: GemmVariant::DoubleBuffered,
        config: tile(128, 128, 64),
        seed: 3,
    };
    let r = run_gemm(&launcher(), &case).unwrap().launch.report;
    let mma = r
        .lines
        .iter()
        .find(|l| l.code.contains("mma("))
        .expect("the mma line is reported");
    assert_eq!(mma.count, 4 * 4, "4 programs x 4 K-steps");
    assert!(mma.engines.contains_key("matrix"));
    let src = include_str!("../kernels/src/gemm.rs");
    for l in &r.lines {
        let text = src.lines().nth(l.line as usize - 1).unwrap_or("");
        assert!(
            !text.trim().is_empty(),
            "line {} ({}) is not a source line",
            l.line,
            l.code
        );
    }
}
