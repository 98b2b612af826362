//! Loads read in place and B operands packed once per launch (`dsl_core::tile::Host::Deferred`,
//! the packed-operand cache): a functional launch gives what copying every load at once gives,
//! whatever the program stores afterwards, whichever launch ran before, at any thread count.

use dsl_core::prelude::*;
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

const T: usize = 16;

/// Loads `x`'s window, overwrites that window with `y`'s, then stores what it loaded to `out`
/// and `x·w` to `prod`: the loaded tile keeps the values it was loaded with.
#[kernel(grid = (1,))]
fn load_then_overwrite(
    x: &Tensor<f32>,
    y: &Tensor<f32>,
    w: &Tensor<f32>,
    out: &Tensor<f32>,
    prod: &Tensor<f32>,
) {
    let tx = load::<T, T>(x, 0, 0);
    let tw = load::<T, T>(w, 0, 0);
    store(x, 0, 0, &load::<T, T>(y, 0, 0));
    let mut acc = zeros::<f32, T, T>();
    mma(&mut acc, &tx, &tw);
    store(prod, 0, 0, &acc);
    store(out, 0, 0, &tx);
}

/// `p1 = a·b`; then overwrites `b` with `b2` and loads it again: `p2 = a·b2`, not the packed
/// `b` of the first product.
#[kernel(grid = (1,))]
fn reload_rewritten_b(
    a: &Tensor<f32>,
    b: &Tensor<f32>,
    b2: &Tensor<f32>,
    p1: &Tensor<f32>,
    p2: &Tensor<f32>,
) {
    let ta = load::<T, T>(a, 0, 0);
    let mut acc = zeros::<f32, T, T>();
    mma(&mut acc, &ta, &load::<T, T>(b, 0, 0));
    store(p1, 0, 0, &acc);
    store(b, 0, 0, &load::<T, T>(b2, 0, 0));
    let mut again = zeros::<f32, T, T>();
    mma(&mut again, &ta, &load::<T, T>(b, 0, 0));
    store(p2, 0, 0, &again);
}

/// `c = a·b`, one program per row block: every program multiplies by the same B windows (the
/// case the packed-operand cache serves), and `c = a·bᵀ` for `mma_bt`.
#[kernel(grid = (cdiv(c.rows(), T),))]
fn row_block_gemm(a: &Tensor<f32>, b: &Tensor<f32>, c: &Tensor<f32>) {
    let r = program_id(0) * T;
    let mut acc = zeros::<f32, T, T>();
    for k in (0..a.cols()).step_by(T) {
        mma(&mut acc, &load::<T, T>(a, r, k), &load::<T, T>(b, k, 0));
    }
    store(c, r, 0, &acc);
}

#[kernel(grid = (cdiv(c.rows(), T),))]
fn row_block_gemm_bt(a: &Tensor<f32>, b: &Tensor<f32>, c: &Tensor<f32>) {
    let r = program_id(0) * T;
    let mut acc = zeros::<f32, T, T>();
    for k in (0..a.cols()).step_by(T) {
        mma_bt(&mut acc, &load::<T, T>(a, r, k), &load::<T, T>(b, 0, k));
    }
    store(c, r, 0, &acc);
}

/// Copies `x` into `y` in T×T tiles.
#[kernel(grid = (cdiv(y.rows(), T), cdiv(y.cols(), T)))]
fn copy(x: &Tensor<f32>, y: &Tensor<f32>) {
    let (r, c) = (program_id(0) * T, program_id(1) * T);
    store(y, r, c, &load::<T, T>(x, r, c));
}

/// `len` values in [-1, 1) from `seed` and `salt` (different salts give unrelated streams).
fn random(len: usize, seed: u64, salt: u64) -> Vec<f32> {
    let mut s =
        (seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// `a·b` (`a` m×k, `b` k×n, or n×k when `bt`) in f64.
fn matmul_f64(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, bt: bool) -> Vec<f64> {
    let mut c = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k)
                .map(|p| {
                    let bv = if bt { b[j * k + p] } else { b[p * n + j] };
                    a[i * k + p] as f64 * bv as f64
                })
                .sum();
        }
    }
    c
}

/// Largest error of `got` against `want` relative to the largest magnitude of `want`.
fn max_rel(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs() / scale)
        .fold(0.0, f64::max)
}

/// f32 products of depth ≤ 64 with inputs in [-1, 1], against f64.
const TOL: f64 = 1e-5;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn a_load_keeps_its_values_when_its_program_overwrites_the_window(seed in any::<u64>()) {
        let (xv, yv, wv) = (random(T * T, seed, 0), random(T * T, seed, 1), random(T * T, seed, 2));
        let x = Tensor::<f32>::from_f32(&[T, T], &xv).unwrap();
        let y = Tensor::<f32>::from_f32(&[T, T], &yv).unwrap();
        let w = Tensor::<f32>::from_f32(&[T, T], &wv).unwrap();
        let (out, prod) = (Tensor::<f32>::poisoned(&[T, T]), Tensor::<f32>::poisoned(&[T, T]));
        load_then_overwrite::launch(&launcher(), &Config::new(), &x, &y, &w, &out, &prod).unwrap();
        prop_assert_eq!(out.to_vec().unwrap(), xv.clone());
        prop_assert_eq!(x.to_vec().unwrap(), yv);
        let e = max_rel(&prod.to_vec().unwrap(), &matmul_f64(&xv, &wv, T, T, T, false));
        prop_assert!(e <= TOL, "x·w off by {e}");
    }

    #[test]
    fn a_b_window_rewritten_by_its_program_is_multiplied_with_its_new_values(seed in any::<u64>()) {
        let (av, bv, b2v) = (random(T * T, seed, 0), random(T * T, seed, 3), random(T * T, seed, 4));
        let a = Tensor::<f32>::from_f32(&[T, T], &av).unwrap();
        let b = Tensor::<f32>::from_f32(&[T, T], &bv).unwrap();
        let b2 = Tensor::<f32>::from_f32(&[T, T], &b2v).unwrap();
        let (p1, p2) = (Tensor::<f32>::poisoned(&[T, T]), Tensor::<f32>::poisoned(&[T, T]));
        reload_rewritten_b::launch(&launcher(), &Config::new(), &a, &b, &b2, &p1, &p2).unwrap();
        let e1 = max_rel(&p1.to_vec().unwrap(), &matmul_f64(&av, &bv, T, T, T, false));
        let e2 = max_rel(&p2.to_vec().unwrap(), &matmul_f64(&av, &b2v, T, T, T, false));
        prop_assert!(e1 <= TOL && e2 <= TOL, "a·b off by {e1}, a·b2 by {e2}");
    }

    #[test]
    fn a_launch_after_one_that_rewrote_b_multiplies_the_new_b(seed in any::<u64>(), blocks in 2usize..6, depth in 1usize..4) {
        let (m, k) = (blocks * T, depth * T);
        let av = random(m * k, seed, 0);
        let (bv, b2v) = (random(k * T, seed, 5), random(k * T, seed, 6));
        let a = Tensor::<f32>::from_f32(&[m, k], &av).unwrap();
        let b = Tensor::<f32>::from_f32(&[k, T], &bv).unwrap();
        let b2 = Tensor::<f32>::from_f32(&[k, T], &b2v).unwrap();
        let c = Tensor::<f32>::poisoned(&[m, T]);
        // One host thread: every program, of both GEMM launches, on the thread that packed B.
        let one = launcher().with_threads(1);
        row_block_gemm::launch(&one, &Config::new(), &a, &b, &c).unwrap();
        let e = max_rel(&c.to_vec().unwrap(), &matmul_f64(&av, &bv, m, k, T, false));
        prop_assert!(e <= TOL, "a·b off by {e}");
        copy::launch(&one, &Config::new(), &b2, &b).unwrap();
        row_block_gemm::launch(&one, &Config::new(), &a, &b, &c).unwrap();
        let e = max_rel(&c.to_vec().unwrap(), &matmul_f64(&av, &b2v, m, k, T, false));
        prop_assert!(e <= TOL, "a·b2 off by {e}");
    }

    #[test]
    fn shared_b_windows_give_the_same_bits_at_any_thread_count(seed in any::<u64>(), blocks in 2usize..8, depth in 1usize..4, bt in any::<bool>()) {
        let (m, k) = (blocks * T, depth * T);
        let av = random(m * k, seed, 0);
        let bv = random(k * T, seed, 7);
        let a = Tensor::<f32>::from_f32(&[m, k], &av).unwrap();
        let shape = if bt { [T, k] } else { [k, T] };
        let b = Tensor::<f32>::from_f32(&shape, &bv).unwrap();
        let run = |threads: usize| {
            let c = Tensor::<f32>::poisoned(&[m, T]);
            let l = launcher().with_threads(threads);
            if bt {
                row_block_gemm_bt::launch(&l, &Config::new(), &a, &b, &c).unwrap();
            } else {
                row_block_gemm::launch(&l, &Config::new(), &a, &b, &c).unwrap();
            }
            c.to_vec().unwrap()
        };
        let one = run(1);
        let e = max_rel(&one, &matmul_f64(&av, &bv, m, k, T, bt));
        prop_assert!(e <= TOL, "off by {e}");
        let two = run(2);
        prop_assert!(one.iter().zip(&two).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
