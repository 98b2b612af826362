//! With the dispatch stagger on, the timing model's answer does not hinge on a single cycle of
//! any latency: a physically negligible change (one more cycle of DMA overhead, ~0.05% of a
//! transfer) moves a launch by about that much. Without it (`dispatch.stagger_cycles = 0`, what
//! the shipped presets still say: CALIBRATION.md, "Dispatch"), 132 cores start identical programs
//! in lockstep and stay so for the whole launch, and this rope launch (248 latency-bound waves)
//! takes 647395, 643951, 636656, 685777 cycles at 14..17 cycles of overhead (+7.7% for one).

use dsl_core::launch::{Backend, Launcher};
use dsl_core::tensor::Tensor;

/// Cycles of a bf16 partial-RoPE launch over 8192 tokens x 64 heads of 192 (the MLA query
/// layout: the last 64 values of each head rotated) on H800, cost-only, every program timed, with
/// the DMA overhead set to `overhead` and the first wave staggered by 15 cycles a core.
fn rope_cycles(overhead: u64) -> u64 {
    let mut p = accel_sim::DevicePreset::load("h800").unwrap();
    p.dma.overhead_cycles = overhead;
    p.dispatch.stagger_cycles = 15;
    let l = Launcher::new(p)
        .with_backend(Backend::CostOnly)
        .with_sampling(false);
    let x = Tensor::<f32>::shape_only(&[8192, 64 * 192])
        .stored_as(accel_sim::DType::Bf16)
        .unwrap();
    let cos = Tensor::<f32>::shape_only(&[8192, 32]);
    let sin = Tensor::<f32>::shape_only(&[8192, 32]);
    let launch = kernels::rope::run_rope(&l, &x, &cos, &sin, &x, 192, 128, 64, true).unwrap();
    launch.report.cycles
}

#[test]
fn one_cycle_of_dma_overhead_moves_a_long_launch_by_less_than_one_percent() {
    let cycles: Vec<u64> = (15..=18).map(rope_cycles).collect();
    for w in cycles.windows(2) {
        let rel = (w[1] as f64 - w[0] as f64).abs() / w[0] as f64;
        assert!(
            rel < 0.01,
            "{cycles:?}: a one-cycle change moved the launch {:.2}%",
            100.0 * rel
        );
    }
}
