//! The vision operators (GELU, linear with bias, bidirectional varlen attention, row scatter,
//! bilinear position embeddings, 2D and multi-axis rotary tables) against their f64 references.
//!
//! Tolerances (max relative error, reference RMS as the floor), f32 throughout:
//! - element-wise GELU 1e-5 (a few f32 operations and one exp; erf itself to ~1.2e-7);
//! - linear with bias and the bilinear gather 1e-5 (f32 sums of ≤ a few hundred products);
//! - varlen attention 1e-5 (as flash prefill: online softmax in f32);
//! - row scatter: exact (copies and one f32 add per element).
//!
//! Inputs are fresh random values; shapes are ragged; outputs are poisoned with NaN beforehand
//! (the scatter's output instead holds random rows, which the rows it does not own must keep).

use dsl_core::prelude::*;
use kernels::attention::reference::VarlenShape;
use kernels::attention::varlen::{self, run_varlen_attention, varlen_attention};
use kernels::elementwise::run_gelu;
use kernels::linear::run_linear_bias;
use kernels::reference::{self, rel_error};
use kernels::testdata::Rng;
use kernels::vision::pos_embed::{bilinear_taps, run_pos_embed_bilinear, TAPS};
use kernels::vision::reference as vref;
use kernels::vision::rotary::{axis_cos_sin, mrope_freqs, vision_freqs, vision_positions};
use kernels::vision::scatter::run_scatter_rows;
use proptest::prelude::*;

const TOL: f64 = 1e-5;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

fn tensor(shape: &[usize], v: &[f32]) -> Tensor<f32> {
    Tensor::from_f32(shape, v).unwrap()
}

/// A random permutation of `0..n` (Fisher–Yates on the test RNG).
fn permutation(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = (rng.vec(1, 1.0)[0].abs() * (i + 1) as f32) as usize % (i + 1);
        p.swap(i, j);
    }
    p
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    #[test]
    fn gelu_matches_reference(rows in 1usize..40, cols in 1usize..600, approximate in any::<bool>(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        // ±8 covers both tails (GELU(−8) ≈ −5e-15 relative to the floor).
        let xv = rng.vec(rows * cols, 8.0);
        let out = Tensor::<f32>::poisoned(&[rows, cols]);
        run_gelu(&launcher(), &tensor(&[rows, cols], &xv), &out, approximate).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::gelu(&xv, approximate));
        prop_assert!(err <= TOL, "{rows}x{cols} approximate={approximate}: max rel error {err}");
    }

    #[test]
    fn linear_bias_matches_reference(m in 1usize..70, n in 1usize..150, k in 1usize..200, seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let (xv, wv, bv) = (rng.vec(m * k, 1.0), rng.vec(n * k, 1.0), rng.vec(n, 1.0));
        let y = Tensor::<f32>::poisoned(&[m, n]);
        run_linear_bias(&launcher(), &tensor(&[m, k], &xv), &tensor(&[n, k], &wv), &tensor(&[1, n], &bv), &y).unwrap();
        let err = rel_error(&y.to_vec().unwrap(), &reference::linear_bias(&xv, &wv, &bv, m, n, k));
        prop_assert!(err <= TOL, "m={m} n={n} k={k}: max rel error {err}");
    }

    #[test]
    fn varlen_attention_matches_reference(
        lens in prop::collection::vec(1usize..90, 1..4),
        heads in 1usize..3,
        head_dim in prop::sample::select(vec![16usize, 40, 72]),
        seed in any::<u64>(),
    ) {
        let shape = VarlenShape { lens: lens.clone(), heads, head_dim };
        let (got, want) = varlen::run_case(&launcher(), &shape, None, seed).unwrap();
        let err = rel_error(&got, &want);
        prop_assert!(err <= TOL, "{shape:?}: max rel error {err}");
    }

    /// Every declared tile shape that covers the head, on ragged segments; a shape too big for
    /// the device's SRAM (BQ = BK = 128 with BD = 256) must say so, not compute.
    #[test]
    fn varlen_any_declared_tiles(config in prop::sample::select(varlen_attention::META.space()), seed in any::<u64>()) {
        let shape = VarlenShape { lens: vec![37, 5, 70], heads: 2, head_dim: 16 };
        let result = varlen::run_case(&launcher(), &shape, Some(&config), seed);
        prop_assume!(!matches!(result, Err(dsl_core::SimError::SramOverflow { .. })));
        let (got, want) = result.unwrap();
        let err = rel_error(&got, &want);
        prop_assert!(err <= TOL, "{config}: max rel error {err}");
    }

    #[test]
    fn scatter_rows_matches_reference(t in 1usize..60, h in 1usize..700, frac in 0.0f64..1.0, accumulate in any::<bool>(), seed in any::<u64>()) {
        let mut rng = Rng::new(seed);
        let n = ((t as f64 * frac) as usize).max(1);
        let positions: Vec<i32> = permutation(&mut rng, t)[..n].iter().map(|p| *p as i32).collect();
        let (sv, ov) = (rng.vec(n * h, 1.0), rng.vec(t * h, 1.0));
        let out = tensor(&[t, h], &ov);
        run_scatter_rows(&launcher(), &tensor(&[n, h], &sv), &positions, &out, accumulate).unwrap();
        let want = vref::scatter_rows(&sv, &positions, &ov, h, accumulate);
        let err = rel_error(&out.to_vec().unwrap(), &want);
        prop_assert!(err <= 1e-7, "t={t} h={h} n={n}: max rel error {err}");
    }

    #[test]
    fn pos_embed_bilinear_matches_reference(
        bh in 1usize..8, bw in 1usize..8, frames in 1usize..3, side in 2usize..10, h in 1usize..300, seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let grids = [[frames, 2 * bh, 2 * bw], [1, 2, 4]];
        let (idx, wts) = bilinear_taps(&grids, side, 2);
        let n = idx.len() / TAPS;
        prop_assert_eq!(n, frames * 4 * bh * bw + 8);
        let table = rng.vec(side * side * h, 1.0);
        let out = Tensor::<f32>::poisoned(&[n, h]);
        run_pos_embed_bilinear(&launcher(), &tensor(&[side * side, h], &table), &idx, &wts, &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &vref::pos_embed_bilinear(&table, &idx, &wts, h));
        prop_assert!(err <= TOL, "grids {grids:?} side {side}: max rel error {err}");
    }

    /// 2D vision RoPE is the rope kernel on [`vision_freqs`] tables: checked against the f64
    /// rotation with angles computed from each patch's row and column.
    #[test]
    fn vision_rope_rotates_rows_then_columns(bh in 1usize..5, bw in 1usize..5, heads in 1usize..3, seed in any::<u64>()) {
        let head_dim = 72;
        let pos = vision_positions(&[[1, 2 * bh, 2 * bw]], 2);
        let freqs = vision_freqs(head_dim, 10000.0);
        prop_assert_eq!(freqs.len(), head_dim / 2);
        let (cos, sin) = axis_cos_sin(&pos, &freqs);
        let n = pos.len();
        let mut rng = Rng::new(seed);
        let xv = rng.vec(n * heads * head_dim, 1.0);
        let out = Tensor::<f32>::poisoned(&[n, heads * head_dim]);
        let half = head_dim / 2;
        kernels::rope::run_rope(
            &launcher(), &tensor(&[n, heads * head_dim], &xv), &tensor(&[n, half], &cos),
            &tensor(&[n, half], &sin), &out, head_dim, 0, head_dim, false,
        ).unwrap();
        // f64 angles: frequency j < 18 on the patch's row, j ≥ 18 on its column.
        let inv = kernels::rope::inv_freq(half, 10000.0, &kernels::rope::RopeScalingParams::None);
        let (mut c64, mut s64) = (Vec::new(), Vec::new());
        for p in &pos {
            for j in 0..half {
                let (axis, f) = if j < half / 2 { (p[1], inv[j]) } else { (p[2], inv[j - half / 2]) };
                let a = (f as f32 * axis as f32) as f64;
                c64.push(a.cos() as f32);
                s64.push(a.sin() as f32);
            }
        }
        let want = reference::rope(&xv, &c64, &s64, n, head_dim, 0, head_dim, false);
        let err = rel_error(&out.to_vec().unwrap(), &want);
        prop_assert!(err <= TOL, "{bh}x{bw} blocks: max rel error {err}");
    }
}

#[test]
fn erf_reference_matches_known_values() {
    // erf(0.5), erf(1), erf(2), erf(3.5) to 15 digits (Abramowitz & Stegun table 7.1 / mpmath).
    for (x, want) in [
        (0.5, 0.520_499_877_813_046_5),
        (1.0, 0.842_700_792_949_714_9),
        (2.0, 0.995_322_265_018_952_7),
        (3.5, 0.999_999_256_901_627_7),
    ] {
        assert!((reference::erf(x) - want).abs() < 1e-14, "erf({x})");
        assert!((reference::erf(-x) + want).abs() < 1e-14, "erf(-{x})");
    }
}

#[test]
fn vision_patches_come_in_merge_blocks() {
    // A 1×4×4 grid with 2×2 merging: block (0,0) first, its four patches row by row.
    let pos = vision_positions(&[[1, 4, 4]], 2);
    let hw: Vec<(usize, usize)> = pos.iter().map(|p| (p[1], p[2])).collect();
    assert_eq!(
        &hw[..8],
        &[
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
            (0, 2),
            (0, 3),
            (1, 2),
            (1, 3)
        ]
    );
    assert_eq!(pos.len(), 16);
}

#[test]
fn bilinear_taps_hit_the_corners_and_sum_to_one() {
    // A 2×2 patch grid over a 48×48 table: aligned corners read the table's four corners exactly.
    let (idx, wts) = bilinear_taps(&[[1, 2, 2]], 48, 2);
    let corner = |p: usize| {
        let (i, w) = (&idx[p * 4..][..4], &wts[p * 4..][..4]);
        let k = w
            .iter()
            .position(|v| *v == 1.0)
            .expect("one tap of weight 1");
        i[k]
    };
    assert_eq!(
        [corner(0), corner(1), corner(2), corner(3)],
        [0, 47, 47 * 48, 48 * 48 - 1]
    );
    let (_, wts) = bilinear_taps(&[[2, 6, 10]], 48, 2);
    for w in wts.chunks(4) {
        assert!((w.iter().sum::<f32>() - 1.0).abs() < 1e-6, "{w:?}");
    }
}

#[test]
fn interleaved_mrope_assigns_24_20_20_frequencies() {
    let inv = vec![1.0; 64];
    let freqs = mrope_freqs(&inv, [24, 20, 20]);
    let count = |a: usize| freqs.iter().filter(|(x, _)| *x == a).count();
    assert_eq!((count(0), count(1), count(2)), (24, 20, 20));
    // T H W T H W ... then T T T T past 3·20.
    assert_eq!(
        freqs[..6].iter().map(|f| f.0).collect::<Vec<_>>(),
        [0, 1, 2, 0, 1, 2]
    );
    assert!(freqs[60..].iter().all(|f| f.0 == 0));
    // A text token (t = h = w) gets the plain 1D table.
    let inv = kernels::rope::inv_freq(128, 5e6, &kernels::rope::RopeScalingParams::None);
    let (c3, s3) = axis_cos_sin(&[[17, 17, 17]], &mrope_freqs(&inv, [24, 20, 20]));
    let (c1, s1) = kernels::rope::cos_sin(&[17], &inv, 1.0);
    assert_eq!((c3, s3), (c1, s1));
}

#[test]
fn bad_vision_inputs_are_launch_errors() {
    let l = launcher();
    let src = Tensor::<f32>::poisoned(&[2, 8]);
    let out = tensor(&[4, 8], &[0.5; 32]);
    for (positions, says) in [
        (&[0, 4][..], "outside"),
        (&[1, 1][..], "twice"),
        (&[-1, 0][..], "outside"),
    ] {
        match run_scatter_rows(&l, &src, positions, &out, true) {
            Err(dsl_core::SimError::Launch { message, .. }) => {
                assert!(message.contains(says), "{message}")
            }
            other => panic!("expected a launch error, got {other:?}"),
        }
    }
    let q = Tensor::<f32>::poisoned(&[10, 32]);
    for cu in [&[0, 4][..], &[0, 6, 4, 10][..], &[1, 10][..], &[0][..]] {
        assert!(
            run_varlen_attention(&l, &q, &q, &q, &q, cu, 16).is_err(),
            "{cu:?}"
        );
    }
    assert!(run_varlen_attention(&l, &q, &q, &q, &q, &[0, 10], 12).is_err());
    let table = Tensor::<f32>::poisoned(&[4, 8]);
    let o = Tensor::<f32>::poisoned(&[1, 8]);
    assert!(run_pos_embed_bilinear(&l, &table, &[0, 1, 2, 4], &[0.25; 4], &o).is_err());
}
