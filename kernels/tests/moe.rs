//! MXFP4 expert path: fused online dequantization GEMM, offline conversion, bf16, the SwiGLU expert
//! FFN, and the trade report's numbers against a hand calculation.
//!
//! Tolerances: every GEMM path is compared with the f64 product of the *dequantized* weights and
//! the bf16-rounded activations, so only f32 accumulation error remains: ≤ 1e-5 relative (to the
//! output RMS). The FFN rounds its SwiGLU activation to bf16 before the down projection; the
//! reference rounds too, but may land on the other side of a bf16 rounding boundary for a few
//! elements: ≤ 1e-3.

use dsl_core::prelude::*;
use kernels::moe::expert_gemm::{
    run_expert_ffn, run_expert_gemm, ExpertFfnCase, ExpertGemmCase, WeightPath,
};
use proptest::prelude::*;

const PATHS: [WeightPath; 4] = [
    WeightPath::Mxfp4Online,
    WeightPath::Mxfp4Offline,
    WeightPath::Bf16,
    WeightPath::Fp8Block,
];

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn expert_gemm_matches_reference_on_every_path(
        experts in 1usize..4, tokens in 1usize..40, kb in 1usize..12, n in 1usize..300,
        path in prop::sample::select(PATHS.to_vec()),
        bm in prop::sample::select(vec![16i64, 32]), bn in prop::sample::select(vec![64i64, 128]),
        bk in prop::sample::select(vec![64i64, 128]), seed in any::<u64>(),
    ) {
        let case = ExpertGemmCase {
            experts, tokens, k: kb * 32, n, path,
            config: Config::new().with("BM", bm).with("BN", bn).with("BK", bk), seed,
        };
        let run = run_expert_gemm(&launcher(), &case).unwrap();
        let err = run.report.max_rel_error.unwrap();
        prop_assert!(err <= 1e-5, "{case:?}: {err}");
        prop_assert!(run.report.cycles >= run.report.roofline_cycles);
    }
}

#[test]
fn expert_ffn_matches_reference_on_every_path() {
    for path in PATHS {
        let case = ExpertFfnCase {
            experts: 3,
            tokens: 9,
            hidden: 96,
            inter: 160,
            path,
            config: Config::new(),
            seed: 4,
        };
        let run = run_expert_ffn(&launcher(), &case).unwrap();
        let err = run.report.max_rel_error.unwrap();
        assert!(err <= 1e-3, "{path:?}: {err}");
    }
}

/// Decode-sized batches on npu-910b: online MXFP4 reads ≈ 4× fewer weight bytes than bf16 and is
/// faster; the bytes agree exactly with a hand calculation, the cycles lie above the roofline.
#[test]
fn decode_trade_matches_hand_calculation() {
    let cost = launcher().with_backend(Backend::CostOnly);
    let (e, t, k, n) = (8usize, 16usize, 7168usize, 2048usize);
    let run = |path| {
        let case = ExpertGemmCase {
            experts: e,
            tokens: t,
            k,
            n,
            path,
            config: Config::new(),
            seed: 0,
        };
        run_expert_gemm(&cost, &case).unwrap()
    };
    let online = run(WeightPath::Mxfp4Online);
    let bf16 = run(WeightPath::Bf16);
    let offline = run(WeightPath::Mxfp4Offline);
    // Hand calculation: activations (bf16) read once, every weight byte read once from HBM (one
    // token tile per expert: T ≤ BM), f32 outputs written once.
    let x_bytes = (e * t * k * 2) as u64;
    let mx_weight = (e * n * (k / 2 + k / 32)) as u64;
    let bf16_weight = (e * n * k * 2) as u64;
    let y_bytes = (e * t * n * 4) as u64;
    assert_eq!(online.weight_bytes, mx_weight);
    assert_eq!(online.report.hbm_read_bytes, x_bytes + mx_weight);
    assert_eq!(bf16.report.hbm_read_bytes, x_bytes + bf16_weight);
    assert_eq!(online.report.hbm_write_bytes, y_bytes);
    let ratio = bf16_weight as f64 / mx_weight as f64;
    assert!((3.7..=4.0).contains(&ratio), "weight bytes ratio {ratio}");
    // Cycles: never below the model's own roofline; HBM-bound bf16 at least its bytes' time.
    for r in [&online, &bf16, &offline] {
        assert!(r.report.cycles >= r.report.roofline_cycles);
    }
    let hbm_bpc = 1600.0 / 1.8; // npu-910b preset: 1600 GB/s at 1.8 GHz
    assert!(bf16.report.cycles as f64 >= (x_bytes + bf16_weight + y_bytes) as f64 / hbm_bpc);
    assert!(
        online.report.cycles < bf16.report.cycles,
        "online {} vs bf16 {}",
        online.report.cycles,
        bf16.report.cycles
    );
    // Offline conversion writes a bf16 copy and reads it back: more traffic, more memory, slower.
    assert_eq!(
        offline.peak_device_bytes,
        online.peak_device_bytes + bf16_weight
    );
    assert!(offline.report.hbm_bytes > bf16.report.hbm_bytes);
    assert!(offline.report.cycles > online.report.cycles);
}

#[test]
fn mxfp4_needs_k_in_whole_blocks() {
    let case = ExpertGemmCase {
        experts: 1,
        tokens: 4,
        k: 100,
        n: 64,
        path: WeightPath::Mxfp4Online,
        config: Config::new(),
        seed: 0,
    };
    let err = run_expert_gemm(&launcher(), &case).unwrap_err().to_string();
    assert!(err.contains("multiple of the 32-element block"), "{err}");
}

#[test]
fn fp8_block_path_reads_half_the_bf16_weight_bytes() {
    let cost = launcher().with_backend(Backend::CostOnly);
    let (e, t, k, n) = (4usize, 8usize, 7168usize, 2048usize);
    let run = |path| {
        let case = ExpertGemmCase {
            experts: e,
            tokens: t,
            k,
            n,
            path,
            config: Config::new(),
            seed: 0,
        };
        run_expert_gemm(&cost, &case).unwrap()
    };
    let fp8 = run(WeightPath::Fp8Block);
    let scale_bytes = (4 * e * n.div_ceil(128) * k.div_ceil(128)) as u64;
    assert_eq!(fp8.weight_bytes, (e * n * k) as u64 + scale_bytes);
    assert_eq!(
        fp8.report.hbm_read_bytes,
        (e * t * k * 2) as u64 + fp8.weight_bytes
    );
    assert!(fp8.report.cycles < run(WeightPath::Bf16).report.cycles);
}

#[test]
fn fp8_matrix_unit_is_refused_where_the_device_has_none() {
    // The 910B-class cube has no FP8 mode: an FP8 mma is an error naming the kernel line.
    let a = Tensor::<fp8e4m3>::from_f32(&[32, 32], &vec![0.5; 1024]).unwrap();
    let c = Tensor::<f32>::poisoned(&[32, 32]);
    let err = fp8_mma::launch(&launcher(), &Config::new(), &a, &c)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no fp8e4m3 mode"), "{err}");
    let h200 = Launcher::for_device("h200").unwrap();
    fp8_mma::launch(&h200, &Config::new(), &a, &c).unwrap();
    assert!(
        c.to_vec().unwrap().iter().all(|v| *v == 8.0),
        "32 · 0.5 · 0.5"
    );
}

#[kernel(grid = (1,), tunable(N = [32]))]
fn fp8_mma(a: &Tensor<fp8e4m3>, c: &Tensor<f32>) {
    let t = load::<N, N>(a, 0, 0);
    let mut acc = zeros::<f32, N, N>();
    mma(&mut acc, &t, &t);
    store(c, 0, 0, &acc);
}

/// `dequant_mxfp4` to FP8 tiles: on a device that multiplies FP8, MXFP4 weights can be fed to the
/// matrix unit as FP8 (values beyond ±448 saturate).
#[kernel(grid = (1,), tunable(C = [64]), derived(CB = C / 2, CS = C / 32))]
fn mxfp4_to_fp8(blocks: &Tensor<u8>, scales: &Tensor<u8>, out: &Tensor<fp8e4m3>) {
    let tb = load::<4, CB>(blocks, 0, 0);
    let ts = load::<4, CS>(scales, 0, 0);
    store(out, 0, 0, &dequant_mxfp4::<fp8e4m3, 4, C>(&tb, &ts));
}

#[test]
fn mxfp4_dequantizes_to_fp8_tiles() {
    use accel_sim::formats::mx::{MxElem, MxTensor};
    let mut rng = kernels::testdata::Rng::new(3);
    let w = rng.vec(4 * 64, 8.0);
    let mx = MxTensor::quantize("w", &w, &[4, 64], MxElem::Fp4E2M1).unwrap();
    let blocks = Tensor::<u8>::from_bytes(&[4, 32], &mx.data).unwrap();
    let scales = Tensor::<u8>::from_bytes(&[4, 2], &mx.scales).unwrap();
    let out = Tensor::<fp8e4m3>::poisoned(&[4, 64]);
    mxfp4_to_fp8::launch(&launcher(), &Config::new(), &blocks, &scales, &out).unwrap();
    let mut want = mx.dequantize();
    accel_sim::functional::round_to(&mut want, accel_sim::DType::Fp8e4m3);
    let got = out.to_vec().unwrap();
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
}
