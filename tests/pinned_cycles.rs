//! Golden cycle counts: a handful of launches whose exact cycles are pinned, one per regime the
//! timing model must get right — L2-bound, HBM-bound (h200), vector-bound, and a latency-bound
//! decode. Loose ratios elsewhere let a timing change pass unnoticed; these do not.
//!
//! **A change to the timing model that moves one of these numbers must update it here
//! deliberately, and the commit message must say why the new number is the right one.**
//!
//! Beside the pins, sensitivity checks: the L2 and HBM bandwidth figures of the preset must each
//! move the launch they bound (a model in which a figure never matters cannot be calibrated).

use accel_sim::{DevicePreset, Report};
use dsl_core::{Backend, Config, Launcher};
use kernels::attention::decode::{run_decode, DecodeCase};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use kernels::linear_attention::reference::Decay;
use kernels::linear_attention::runner::{run_delta, DeltaCase, DeltaMode};

fn launcher(p: DevicePreset) -> Launcher {
    Launcher::new(p).with_backend(Backend::CostOnly)
}

fn gemm(
    p: DevicePreset,
    variant: GemmVariant,
    m: usize,
    n: usize,
    k: usize,
    tile: Option<(i64, i64, i64)>,
) -> Report {
    let config = match tile {
        Some((bm, bn, bk)) => Config::new().with("BM", bm).with("BN", bn).with("BK", bk),
        None => Config::new(),
    };
    let case = GemmCase {
        m,
        n,
        k,
        dtype: GemmDtype::Bf16,
        variant,
        config,
        seed: 1,
    };
    run_gemm(&launcher(p), &case).unwrap().launch.report
}

/// L2-bound: a double-buffered GEMM on h200 whose A and B tiles are mostly L2 hits; 132 SMs ask
/// far more than the L2's bandwidth.
fn l2_bound(p: DevicePreset) -> Report {
    gemm(
        p,
        GemmVariant::DoubleBuffered,
        2048,
        2048,
        2048,
        Some((64, 64, 64)),
    )
}

/// HBM-bound: the skinny decode-shaped GEMM of issue #12 on h200 (weights streamed once), with
/// the tile the CLI picks for it.
fn hbm_bound(p: DevicePreset) -> Report {
    gemm(
        p,
        GemmVariant::Persistent,
        64,
        7168,
        16384,
        Some((64, 176, 128)),
    )
}

/// Vector-bound (by its roofline: the vector unit is the resource with the largest minimum time):
/// a gated-delta-rule decode (token-by-token recurrence) on npu-910b. Its state update is vector
/// work; the token chain keeps it far from that roofline, which the pin holds as well.
fn vector_bound() -> Report {
    let case = DeltaCase {
        decay: Decay::Scalar,
        mode: DeltaMode::Recurrent,
        seq: 256,
        k_heads: 4,
        v_heads: 4,
        dk: 128,
        dv: 128,
        dtype: GemmDtype::Bf16,
        config: Config::new(),
        seed: 1,
    };
    run_delta(&launcher(DevicePreset::load("npu-910b").unwrap()), &case)
        .unwrap()
        .launch
        .report
}

/// Latency-bound: a short-context paged decode step on npu-910b (every load waits its HBM
/// latency; little data per program).
fn latency_bound() -> Report {
    let case = DecodeCase {
        heads: 32,
        kv_heads: 8,
        head_dim: 128,
        v_head_dim: 128,
        shared_kv: false,
        ctx: 512,
        page_size: 64,
        splits: 4,
        dtype: GemmDtype::Bf16,
        fp8_kv: false,
        seed: 1,
    };
    run_decode(&launcher(DevicePreset::load("npu-910b").unwrap()), &case)
        .unwrap()
        .report
}

fn h200() -> DevicePreset {
    DevicePreset::load("h200").unwrap()
}

#[test]
fn pinned_cycles() {
    let l2 = l2_bound(h200());
    let hbm = hbm_bound(h200());
    let vec = vector_bound();
    let lat = latency_bound();
    let got = [
        ("l2-bound gemm_db 2048^3 h200", l2.cycles, l2.bound_unit),
        (
            "hbm-bound gemm 64x7168x16384 h200",
            hbm.cycles,
            hbm.bound_unit,
        ),
        (
            "vector-bound gdn recurrent 256 tokens npu-910b",
            vec.cycles,
            vec.bound_unit,
        ),
        (
            "latency-bound decode ctx 512 npu-910b",
            lat.cycles,
            lat.bound_unit,
        ),
    ];
    let want = [
        ("l2-bound gemm_db 2048^3 h200", PIN_L2, "l2"),
        ("hbm-bound gemm 64x7168x16384 h200", PIN_HBM, "hbm"),
        (
            "vector-bound gdn recurrent 256 tokens npu-910b",
            PIN_VEC,
            "vector",
        ),
        ("latency-bound decode ctx 512 npu-910b", PIN_LAT, LAT_BOUND),
    ];
    assert_eq!(got, want);
    // Latency-bound: far from its roofline, whatever resource that names.
    assert!(
        lat.roofline_fraction < 0.5,
        "decode at {} of its roofline",
        lat.roofline_fraction
    );
}

const PIN_L2: u64 = 117_451;
const PIN_HBM: u64 = 111_917;
const PIN_VEC: u64 = 516_638;
const PIN_LAT: u64 = 15_347;
const LAT_BOUND: &str = "hbm";

#[test]
fn the_l2_bandwidth_figure_moves_the_l2_bound_launch() {
    let base = l2_bound(h200());
    let mut p = h200();
    p.l2.bandwidth_gbps /= 2.0;
    let slow = l2_bound(p);
    assert!(
        slow.cycles as f64 > 1.3 * base.cycles as f64,
        "halving L2 bandwidth: {} -> {} cycles",
        base.cycles,
        slow.cycles
    );
}

#[test]
fn the_hbm_bandwidth_figure_moves_the_hbm_bound_launch() {
    let base = hbm_bound(h200());
    let mut p = h200();
    p.hbm.bandwidth_gbps *= 2.0;
    let fast = hbm_bound(p);
    assert!(
        // Not 2x: 41 tiles of 64x176 use 41 of the 132 SMs, whose DMA widths (41 x 128 B/cycle)
        // then bind just above the doubled HBM.
        (fast.cycles as f64) < 0.9 * base.cycles as f64,
        "doubling HBM bandwidth: {} -> {} cycles",
        base.cycles,
        fast.cycles
    );
}
