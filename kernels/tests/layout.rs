//! Strided views (`Tensor::col_range`, `Tensor::row_range`) through real kernels: the copy kernel
//! and the GEMM read and write column windows and row ranges exactly where a host model of the
//! same strided addressing says, and nothing else (the rest of the destination keeps its poison).
//! Copies are exact, so the tolerance is 0; the GEMM on views is compared with the GEMM of the
//! materialised views (same kernel, same tiles: bit-identical).

use dsl_core::prelude::*;
use kernels::layout::run_copy;
use kernels::testdata::Rng;
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Copy a column window of one matrix into a column window of another.
    #[test]
    fn copy_between_column_windows(
        rows in 1usize..70,
        src_cols in 1usize..90,
        dst_cols in 1usize..90,
        a in 0usize..90, b in 0usize..90, w in 1usize..90,
        seed in any::<u64>(),
    ) {
        let w = w.min(src_cols).min(dst_cols);
        let (s0, d0) = (a % (src_cols - w + 1), b % (dst_cols - w + 1));
        let mut rng = Rng::new(seed);
        let sv = rng.vec(rows * src_cols, 1.0);
        let src = Tensor::<f32>::from_f32(&[rows, src_cols], &sv).unwrap();
        let dst = Tensor::<f32>::poisoned(&[rows, dst_cols]);
        let sview = src.col_range(s0, w).unwrap();
        let dview = dst.col_range(d0, w).unwrap();
        prop_assert_eq!(sview.to_vec().unwrap().len(), rows * w);
        run_copy(&launcher(), &sview, &dview).unwrap();
        let out = dst.to_vec().unwrap();
        for r in 0..rows {
            for c in 0..dst_cols {
                let got = out[r * dst_cols + c];
                if (d0..d0 + w).contains(&c) {
                    prop_assert_eq!(got, sv[r * src_cols + s0 + c - d0], "row {} col {}", r, c);
                } else {
                    prop_assert!(got.is_nan(), "row {} col {} outside the window was written", r, c);
                }
            }
        }
    }

    /// A GEMM whose A is a column window, B a row range of a stacked weight and C a column window
    /// of a wider output equals the GEMM of the materialised operands.
    #[test]
    fn gemm_on_views_equals_gemm_on_copies(
        m in 1usize..40, k in 1usize..40, n in 1usize..40,
        extra in 1usize..20, heads in 1usize..4, seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let wide_a = Tensor::<f32>::from_f32(&[m, k + extra], &rng.vec(m * (k + extra), 1.0)).unwrap();
        let stacked_b = Tensor::<f32>::from_f32(&[heads * k, n], &rng.vec(heads * k * n, 1.0)).unwrap();
        let h = heads - 1;
        let a = wide_a.col_range(extra, k).unwrap();
        let b = stacked_b.row_range(h * k, k).unwrap();
        let c_wide = Tensor::<f32>::poisoned(&[m, n + extra]);
        let c = c_wide.col_range(extra, n).unwrap();
        let cfg = Config::new().with("BM", 32).with("BN", 32).with("BK", 32);
        kernels::gemm::gemm_db::launch(&launcher(), &cfg, &a, &b, &c).unwrap();

        let a2 = Tensor::<f32>::from_f32(&[m, k], &a.to_vec().unwrap()).unwrap();
        let b2 = Tensor::<f32>::from_f32(&[k, n], &b.to_vec().unwrap()).unwrap();
        let c2 = Tensor::<f32>::poisoned(&[m, n]);
        kernels::gemm::gemm_db::launch(&launcher(), &cfg, &a2, &b2, &c2).unwrap();
        prop_assert_eq!(c.to_vec().unwrap(), c2.to_vec().unwrap());
        let wide = c_wide.to_vec().unwrap();
        prop_assert!(wide.chunks(n + extra).all(|row| row[..extra].iter().all(|v| v.is_nan())));
    }
}

/// Views refuse ranges past the end, and a column window cannot be reshaped (its rows are not
/// contiguous).
#[test]
fn view_errors_name_the_range() {
    let t = Tensor::<f32>::poisoned(&[4, 10]);
    let e = t.col_range(8, 3).unwrap_err();
    assert!(e.contains("8..11"), "{e}");
    let e = t.row_range(3, 2).unwrap_err();
    assert!(e.contains("3..5"), "{e}");
    let e = t.col_range(2, 3).unwrap().reshaped(&[12]).unwrap_err();
    assert!(e.contains("column window"), "{e}");
    assert!(run_copy(&launcher(), &t, &Tensor::<f32>::poisoned(&[4, 9])).is_err());
}
