//! The persistent GEMM (`gemm_persistent`: one program per core looping over its output tiles)
//! against the f64 reference, its grid, and its determinism.
//!
//! Tolerance: relative error ≤ 1e-5 (against the reference's RMS as the floor, see
//! `reference::rel_error`); the reference multiplies the *rounded* inputs in f64, so bf16 inputs
//! are held to the same bound (only f32 accumulation error remains, K < 400 here). Inputs are
//! fresh random values (never zeros), sizes are drawn ragged, and the output starts poisoned with
//! NaN, so an element no program wrote fails.

use dsl_core::{Backend, Config, Launcher, SimError};
use kernels::gemm::{persistent_programs, run_gemm, GemmCase, GemmDtype, GemmVariant};
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").expect("built-in preset")
}

/// The same device with `cores` cores, so small problems still give each program several tiles.
fn launcher_with_cores(cores: u64) -> Launcher {
    let mut l = launcher();
    l.preset.cores = cores;
    l
}

fn tile(bm: i64, bn: i64, bk: i64) -> Config {
    Config::new().with("BM", bm).with("BN", bn).with("BK", bk)
}

fn case(m: usize, n: usize, k: usize, dtype: GemmDtype, config: Config, seed: u64) -> GemmCase {
    GemmCase {
        m,
        n,
        k,
        dtype,
        variant: GemmVariant::Persistent,
        config,
        seed,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random ragged shapes, random declared tiles (176 included), 1 to 7 cores so programs walk
    /// several tiles and the K-step stream crosses tile boundaries.
    #[test]
    fn matches_f64_reference(
        m in 1usize..400, n in 1usize..400, k in 1usize..400,
        bm in prop::sample::select(vec![64i64, 128, 176]),
        bn in prop::sample::select(vec![64i64, 128, 176]),
        bk in prop::sample::select(vec![64i64, 128]),
        cores in 1u64..8,
        bf16 in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let dtype = if bf16 { GemmDtype::Bf16 } else { GemmDtype::F32 };
        let result = run_gemm(&launcher_with_cores(cores), &case(m, n, k, dtype, tile(bm, bn, bk), seed));
        // Large f32 tiles (176×176×128) do not fit in SRAM: that launch is refused, not wrong.
        prop_assume!(!matches!(result, Err(SimError::SramOverflow { .. })));
        let run = result.unwrap();
        let err = run.launch.report.max_rel_error.unwrap();
        prop_assert!(err <= 1e-5, "{m}x{n}x{k} tile {bm}x{bn}x{bk} on {cores} cores: max rel error {err}");
        prop_assert!(run.output.unwrap().iter().all(|v| v.is_finite()));
    }
}

#[test]
fn grid_is_one_program_per_core_or_per_tile() {
    assert_eq!(persistent_programs(1024, 1024, 176, 128, 24), 24);
    assert_eq!(persistent_programs(100, 100, 64, 64, 24), 4);
    assert_eq!(persistent_programs(1, 1, 128, 128, 24), 1);
    assert_eq!(persistent_programs(100, 100, 64, 64, 0), 1);
    let r = run_gemm(
        &launcher().with_backend(Backend::CostOnly),
        &case(1024, 1024, 1024, GemmDtype::Bf16, tile(128, 128, 128), 1),
    )
    .unwrap()
    .launch
    .report;
    assert_eq!((r.programs, r.waves), (24, 1));
    // 64 tiles on 24 programs (16 take three, 8 take two): every tile's K-steps run once.
    let mma = r.lines.iter().find(|l| l.code.contains("mma(")).unwrap();
    assert_eq!(mma.count, 64 * 8, "64 tiles x 8 K-steps of 128");
}

#[test]
fn one_and_two_threads_give_identical_cycles_and_bits() {
    let c = case(333, 257, 190, GemmDtype::Bf16, tile(64, 64, 64), 9);
    let one = run_gemm(&launcher_with_cores(5).with_threads(1), &c).unwrap();
    let two = run_gemm(&launcher_with_cores(5).with_threads(2), &c).unwrap();
    assert_eq!(one.launch.report, two.launch.report);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(one.output.as_ref().unwrap()),
        bits(two.output.as_ref().unwrap())
    );
}

#[test]
fn cost_only_reports_the_same_cycles_as_functional() {
    let c = case(300, 200, 260, GemmDtype::F32, tile(64, 128, 64), 3);
    let l = launcher_with_cores(4);
    let f = run_gemm(&l, &c).unwrap().launch.report;
    let co = run_gemm(&l.clone().with_backend(Backend::CostOnly), &c).unwrap();
    assert!(co.output.is_none());
    let co = co.launch.report;
    assert_eq!(
        (f.cycles, f.hbm_bytes, f.l2_bytes, f.flop, &f.lines),
        (co.cycles, co.hbm_bytes, co.l2_bytes, co.flop, &co.lines)
    );
}
