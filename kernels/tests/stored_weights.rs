//! Linear layers and grouped expert GEMMs over weights in their stored formats
//! ([`kernels::weight::Weight`]: f32, bf16, block-scaled FP8 with W8A8 activations, MXFP4,
//! group-scaled INT4) against the f64 reference.
//!
//! The reference multiplies exactly the values the kernels hold: the dequantized weights, and the
//! activations as the kernel rounds them (bf16 for bf16 and MXFP4 weights; for FP8, the codes and
//! scales of the per-token, per-128-column quantization, computed here with the kernel's own f32
//! arithmetic). What is left is f32 accumulation, so the tolerance is 1e-4 of the reference's RMS
//! floor for every format (`reference::rel_error`). Inputs are fresh random values, shapes ragged,
//! outputs poisoned with NaN so an unwritten element fails.

use dsl_core::prelude::*;
use kernels::linear::{activations_as_multiplied, run_act_quant_fp8, run_linear_weight};
use kernels::moe::expert_gemm::{prepare_weight, WeightPath};
use kernels::moe::grouped::run_grouped_linear_weight;
use kernels::moe::reference as mref;
use kernels::reference::{linear as linear_ref, rel_error};
use kernels::testdata::Rng;
use kernels::weight::{Format, Weight};
use proptest::prelude::*;

const TOL: f64 = 1e-4;

fn launcher(device: &str) -> Launcher {
    Launcher::for_device(device).unwrap()
}

/// A random `[e, n, k]` weight in `format` and the values the kernels read (dequantized).
fn weight(l: &Launcher, format: Format, shape: [usize; 3], seed: u64) -> (Weight, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let path = match format {
        Format::F32 => {
            let v = rng.vec(shape.iter().product(), 1.0);
            let t = Tensor::<f32>::from_f32(&shape, &v).unwrap();
            return (Weight::F32(t), v);
        }
        Format::Bf16 => WeightPath::Bf16,
        Format::Fp8Block => WeightPath::Fp8Block,
        Format::Mxfp4 => WeightPath::Mxfp4Online,
        Format::Int4 { group } => {
            return kernels::testdata::int4_weight(shape, group, &mut rng).unwrap()
        }
    };
    let p = prepare_weight(l, path, shape, &mut rng, "w").unwrap();
    (p.device, p.values.unwrap())
}

/// Whether a format is for expert weights only (a dense layer in it is an error).
fn expert_only(f: &Format) -> bool {
    matches!(f, Format::Mxfp4 | Format::Int4 { .. })
}

/// A device whose matrix unit has an FP8 mode (W8A8) and one without (W8A16).
fn devices() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec!["h800", "npu-910b"])
}

fn formats() -> impl Strategy<Value = Format> {
    prop::sample::select(vec![
        Format::F32,
        Format::Bf16,
        Format::Fp8Block,
        Format::Mxfp4,
        Format::Int4 { group: 32 },
        Format::Int4 { group: 64 },
        Format::Int4 { group: 128 },
    ])
}

/// Runs the dense linear layer and returns the max relative error.
fn dense(device: &str, format: Format, m: usize, n: usize, k: usize, seed: u64) -> f64 {
    dense_run(device, format, m, n, k, seed).0
}

/// Runs the dense linear layer: its max relative error and the kernels it launched.
fn dense_run(
    device: &str,
    format: Format,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
) -> (f64, Vec<&'static str>) {
    let l = launcher(device);
    let (w, wv) = weight(&l, format, [1, n, k], seed);
    let w = w.without_expert_axis().unwrap();
    let xv = Rng::new(seed ^ 7).vec(m * k, 1.0);
    let x = Tensor::<f32>::from_f32(&[m, k], &xv).unwrap();
    let y = Tensor::<f32>::poisoned(&[m, n]);
    let launches = run_linear_weight(&l, &x, &w, &y).unwrap();
    let want = linear_ref(
        &activations_as_multiplied(&l, &xv, m, k, format),
        &wv,
        m,
        n,
        k,
    );
    let kernels = launches.iter().map(|(name, _)| *name).collect();
    (rel_error(&y.to_vec().unwrap(), &want), kernels)
}

/// A decode shape (a few rows, a narrow output, a deep K) splits K over more cores on every
/// device and format, and the split product and its reduction still match the reference.
#[test]
fn decode_shapes_split_k_and_still_match_the_reference() {
    for device in ["h800", "npu-910b"] {
        for format in [Format::F32, Format::Bf16, Format::Fp8Block] {
            let (err, kernels) = dense_run(device, format, 8, 96, 4096 + 37, 5);
            assert!(err <= TOL, "{device} {format:?}: max rel error {err}");
            assert!(
                kernels.contains(&"split_k_reduce"),
                "{device} {format:?}: a 12-program grid on a many-core device should split K; ran {kernels:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn dense_linear_matches_reference_in_every_stored_format(
        format in formats().prop_filter("MXFP4 and INT4 are expert formats", |f| !expert_only(f)),
        device in devices(), m in 1usize..80, n in 1usize..300, k in 1usize..300,
        seed in any::<u64>(),
    ) {
        let err = dense(device, format, m, n, k, seed);
        prop_assert!(err <= TOL, "{format:?} {m}x{n}x{k}: max rel error {err}");
    }

    /// Deep-K decode shapes, where the launch may split K (ragged K, so the last split is short).
    #[test]
    fn split_k_linear_matches_reference_in_every_stored_format(
        format in formats().prop_filter("MXFP4 and INT4 are expert formats", |f| !expert_only(f)),
        device in devices(), m in 1usize..20, n in 1usize..200, k in 900usize..3000,
        seed in any::<u64>(),
    ) {
        let err = dense(device, format, m, n, k, seed);
        prop_assert!(err <= TOL, "{format:?} {m}x{n}x{k}: max rel error {err}");
    }

    #[test]
    fn grouped_linear_matches_reference_in_every_stored_format(
        format in formats(),
        counts in prop::collection::vec(0usize..40, 1..6), n_out in 1usize..200,
        k_blocks in 1usize..8, device in devices(), seed in any::<u64>(),
    ) {
        // MXFP4 packs K in 32-value blocks, INT4 in its groups; the other formats take it ragged.
        let k = match format {
            Format::Mxfp4 => 32 * k_blocks,
            Format::Int4 { group } => group * k_blocks,
            _ => 37 * k_blocks,
        };
        let mut counts = counts;
        if counts.iter().sum::<usize>() == 0 {
            counts[0] = 3;
        }
        let e = counts.len();
        let mut offsets = vec![0usize];
        for c in &counts {
            offsets.push(offsets.last().unwrap() + c);
        }
        let rows = offsets[e];
        let l = launcher(device);
        let (w, wv) = weight(&l, format, [e, n_out, k], seed);
        let xv = Rng::new(seed ^ 11).vec(rows * k, 1.0);
        let x = Tensor::<f32>::from_f32(&[rows, k], &xv).unwrap();
        let off = Tensor::from_indices(
            &[e + 1, 1],
            &offsets.iter().map(|o| *o as i32).collect::<Vec<_>>(),
        )
        .unwrap();
        let y = Tensor::<f32>::poisoned(&[rows, n_out]);
        run_grouped_linear_weight(&l, &x, &w, &off, &y).unwrap();
        let want = mref::grouped_linear(&activations_as_multiplied(&l, &xv, rows, k, format), &wv, &offsets, n_out, k)
            .unwrap();
        let err = rel_error(&y.to_vec().unwrap(), &want);
        prop_assert!(err <= TOL, "{format:?} {counts:?} n={n_out} k={k}: {err}");
    }

    /// The quantized activations dequantize to within E4M3's half-ulp (2^-4 relative) of the
    /// input, and every code is a finite E4M3 value.
    #[test]
    fn act_quant_keeps_every_value_within_half_an_fp8_ulp(
        m in 1usize..40, k in 1usize..400, seed in any::<u64>(),
    ) {
        let l = launcher("h800");
        let xv = Rng::new(seed).vec(m * k, 3.0);
        let x = Tensor::<f32>::from_f32(&[m, k], &xv).unwrap();
        let (q, _) = run_act_quant_fp8(&l, &x).unwrap();
        let (codes, scales) = (q.codes.to_vec().unwrap(), q.scales.to_vec().unwrap());
        let kb = k.div_ceil(128);
        for i in 0..m {
            for j in 0..k {
                let (c, s) = (codes[i * k + j], scales[i * kb + j / 128]);
                prop_assert!(c.is_finite() && c.abs() <= 448.0, "code {c}");
                let back = c * s;
                // Half an ulp of a 3-bit mantissa, or the subnormal step 2^-9 · s near zero.
                let tol = (xv[i * k + j].abs() / 16.0).max(s * (2f32).powi(-10));
                prop_assert!((back - xv[i * k + j]).abs() <= tol * 1.0001, "{i},{j}: {back} vs {}", xv[i * k + j]);
            }
        }
    }
}

/// Decode and prefill shapes on a card with 228 KB of shared memory, every format: the tiles the
/// runners pick fit, and cost-only cycles equal functional ones.
#[test]
fn production_tiles_fit_and_cost_only_equals_functional() {
    for format in [Format::Bf16, Format::Fp8Block] {
        for m in [1, 64, 300] {
            let (n, k) = (256, 512);
            let l = launcher("h800");
            let (w, _) = weight(&l, format, [1, n, k], 5);
            let w = w.without_expert_axis().unwrap();
            let x = Tensor::<f32>::from_f32(&[m, k], &Rng::new(9).vec(m * k, 1.0)).unwrap();
            let y = Tensor::<f32>::poisoned(&[m, n]);
            let func = run_linear_weight(&l, &x, &w, &y).unwrap();
            let cost_l = l.clone().with_backend(Backend::CostOnly);
            let ws = Weight::shape_only(format, &[n, k]).unwrap();
            let cost = run_linear_weight(
                &cost_l,
                &Tensor::shape_only(&[m, k]),
                &ws,
                &Tensor::shape_only(&[m, n]),
            )
            .unwrap();
            let cycles =
                |v: &[(&str, Launch)]| v.iter().map(|(_, l)| l.report.cycles).collect::<Vec<_>>();
            assert_eq!(cycles(&func), cycles(&cost), "{format:?} m={m}");
        }
    }
}

/// Stored bytes follow the format: FP8 is a quarter of f32 plus its block scales, MXFP4 4.25 bits.
#[test]
fn stored_bytes_follow_the_format() {
    let (n, k) = (256, 1024);
    let b = |f| Weight::shape_only(f, &[n, k]).unwrap().stored_bytes();
    assert_eq!(b(Format::F32), (n * k * 4) as u64);
    assert_eq!(b(Format::Bf16), (n * k * 2) as u64);
    assert_eq!(b(Format::Fp8Block), (n * k + 4 * 2 * 8) as u64);
    assert_eq!(b(Format::Mxfp4), (n * k / 2 + n * k / 32) as u64);
    assert!(Weight::shape_only(Format::Mxfp4, &[n, 33]).is_err());
    // INT4 with bf16 scales per group of 32: 4.5 bits a value.
    assert_eq!(
        b(Format::Int4 { group: 32 }),
        (n * k / 2 + 2 * n * k / 32) as u64
    );
    assert!(Weight::shape_only(Format::Int4 { group: 32 }, &[n, 48]).is_err());
    assert!(Weight::shape_only(Format::Int4 { group: 48 }, &[n, 96]).is_err());
}

/// A weight whose input size does not match the activations is an error naming both, and a dense
/// MXFP4 layer is refused with what to do instead.
#[test]
fn mismatches_and_dense_mxfp4_are_errors() {
    let l = launcher("npu-910b").with_backend(Backend::CostOnly);
    let x = Tensor::<f32>::shape_only(&[4, 64]);
    let y = Tensor::<f32>::shape_only(&[4, 32]);
    let w = Weight::shape_only(Format::Bf16, &[32, 96]).unwrap();
    let e = run_linear_weight(&l, &x, &w, &y).unwrap_err().to_string();
    assert!(e.contains("[N, 64]") && e.contains("bf16"), "{e}");
    for f in [Format::Mxfp4, Format::Int4 { group: 32 }] {
        let w = Weight::shape_only(f, &[32, 64]).unwrap();
        let e = run_linear_weight(&l, &x, &w, &y).unwrap_err().to_string();
        assert!(e.contains("bf16 or FP8") && e.contains(f.name()), "{e}");
    }
}
