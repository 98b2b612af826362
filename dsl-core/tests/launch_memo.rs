//! The launch memo: a repeated cost-only launch is answered with the report of the first, and
//! anything a launch can observe (shapes, tiles, aliasing, relative offsets, index values,
//! scalars, the device) tells launches apart.

use dsl_core::prelude::*;

/// Streams `x` into `y` through `BR`-row tiles, every other row window twice when `twice`.
#[kernel(grid = (cdiv(y.rows(), BR),), tunable(BR = [8, 16]))]
fn stream(x: &Tensor<f32>, y: &Tensor<f32>, twice: bool) {
    let r = program_id(0) * BR;
    let t = load::<BR, 64>(x, r, 0);
    if twice {
        let u = load::<BR, 64>(x, r, 0);
        store(y, r, 0, &add(&t, &u));
    } else {
        store(y, r, 0, &t);
    }
}

/// Copies the rows of `x` that `idx` lists: which rows are read depends on the index values.
#[kernel(grid = (idx.len(),))]
fn gather(x: &Tensor<f32>, idx: &Tensor<i32>, y: &Tensor<f32>) {
    let i = program_id(0);
    let row = load_index(idx, i, i);
    store(y, i, 0, &load::<1, 64>(x, row, 0));
}

fn cost_only(device: &str) -> Launcher {
    Launcher::for_device(device)
        .unwrap()
        .with_backend(Backend::CostOnly)
}

fn shapes(rows: usize) -> (Tensor<f32>, Tensor<f32>) {
    (
        Tensor::shape_only(&[rows, 64]),
        Tensor::shape_only(&[rows, 64]),
    )
}

#[test]
fn a_repeated_launch_is_answered_from_the_memo_with_the_same_report() {
    let plain = cost_only("npu-910b");
    let memo = plain.clone().with_memo(true);
    let cfg = Config::new().with("BR", 8);
    let (x, y) = shapes(1000);
    let want = stream::launch(&plain, &cfg, &x, &y, true).unwrap().report;
    let first = stream::launch(&memo, &cfg, &x, &y, true).unwrap().report;
    // Other tensors of the same shapes: a different layer's weights.
    let (x2, y2) = shapes(1000);
    let again = stream::launch(&memo, &cfg, &x2, &y2, true).unwrap().report;
    assert_eq!(first, want);
    assert_eq!(again, want);
    assert_eq!(memo.memo_counts(), (1, 1));
    // Clones share the memo; a launcher without one never uses it.
    let clone = memo.clone();
    stream::launch(&clone, &cfg, &x, &y, true).unwrap();
    assert_eq!(memo.memo_counts(), (2, 1));
    assert_eq!(plain.memo_counts(), (0, 0));
}

#[test]
fn what_a_launch_can_observe_tells_launches_apart() {
    let memo = cost_only("npu-910b").with_memo(true);
    let cfg = Config::new().with("BR", 8);
    let (x, y) = shapes(1000);
    let base = stream::launch(&memo, &cfg, &x, &y, true).unwrap().report;
    // A scalar, a tile choice, a shape: each is a new launch.
    let once = stream::launch(&memo, &cfg, &x, &y, false).unwrap().report;
    let tiles = stream::launch(&memo, &Config::new().with("BR", 16), &x, &y, true)
        .unwrap()
        .report;
    let (xl, yl) = shapes(1001);
    let longer = stream::launch(&memo, &cfg, &xl, &yl, true).unwrap().report;
    assert_eq!(memo.memo_counts(), (0, 4));
    assert_ne!(once.cycles, base.cycles);
    assert_ne!(tiles.config, base.config);
    assert_ne!(longer.grid, base.grid);
    // Aliasing: reading and writing the same memory is another launch than two tensors.
    let inplace = stream::launch(&memo, &cfg, &x, &x, true).unwrap().report;
    assert_eq!(memo.memo_counts(), (0, 5));
    let (z, _) = shapes(1000);
    let inplace_again = stream::launch(&memo, &cfg, &z, &z, true).unwrap().report;
    assert_eq!(inplace_again, inplace);
    assert_eq!(memo.memo_counts(), (1, 5));
    // Only relative offsets matter: two windows of one tensor at the same distance are the same
    // launch, wherever they start.
    let big = Tensor::<f32>::shape_only(&[4000, 64]);
    let (a0, b0) = (
        big.row_range(0, 1000).unwrap(),
        big.row_range(1000, 1000).unwrap(),
    );
    let (a1, b1) = (
        big.row_range(2000, 1000).unwrap(),
        big.row_range(3000, 1000).unwrap(),
    );
    let w0 = stream::launch(&memo, &cfg, &a0, &b0, true).unwrap().report;
    let w1 = stream::launch(&memo, &cfg, &a1, &b1, true).unwrap().report;
    assert_eq!(w0, w1);
    assert_eq!(memo.memo_counts(), (2, 6));
    // Another device is another memo's business: the launcher bypasses a memo made for another
    // preset.
    let mut other = memo.clone();
    other.preset = dsl_core::DevicePreset::load("h800").unwrap();
    let h800 = stream::launch(&other, &cfg, &x, &y, true).unwrap().report;
    assert_eq!(memo.memo_counts(), (2, 6));
    assert_ne!(h800.cycles, base.cycles);
}

#[test]
fn index_values_a_cost_only_launch_reads_are_part_of_the_key() {
    let plain = cost_only("npu-910b");
    let memo = plain.clone().with_memo(true);
    let x = Tensor::<f32>::shape_only(&[4096, 64]);
    let y = Tensor::<f32>::shape_only(&[64, 64]);
    // The same row 64 times hits in L2; 64 rows far apart do not.
    let same = Tensor::from_indices(&[64], &[7; 64]).unwrap();
    let spread: Vec<i32> = (0..64).map(|i| i * 61).collect();
    let spread = Tensor::from_indices(&[64], &spread).unwrap();
    let cfg = Config::new();
    let a = gather::launch(&memo, &cfg, &x, &same, &y).unwrap().report;
    let b = gather::launch(&memo, &cfg, &x, &spread, &y).unwrap().report;
    assert_eq!(memo.memo_counts(), (0, 2));
    assert_eq!(
        a,
        gather::launch(&plain, &cfg, &x, &same, &y).unwrap().report
    );
    assert_eq!(
        b,
        gather::launch(&plain, &cfg, &x, &spread, &y)
            .unwrap()
            .report
    );
    assert_ne!(a.hbm_bytes, b.hbm_bytes);
    // Same values in another tensor: answered from the memo.
    let same2 = Tensor::from_indices(&[64], &[7; 64]).unwrap();
    assert_eq!(
        gather::launch(&memo, &cfg, &x, &same2, &y).unwrap().report,
        a
    );
    assert_eq!(memo.memo_counts(), (1, 2));
}

#[test]
fn functional_and_traced_launches_are_never_memoised() {
    let f = Launcher::for_device("npu-910b").unwrap().with_memo(true);
    let x = Tensor::<f32>::from_f32(&[16, 64], &vec![1.25; 16 * 64]).unwrap();
    let y = Tensor::<f32>::poisoned(&[16, 64]);
    let cfg = Config::new().with("BR", 8);
    stream::launch(&f, &cfg, &x, &y, true).unwrap();
    stream::launch(&f, &cfg, &x, &y, true).unwrap();
    assert!(y.to_vec().unwrap().iter().all(|v| *v == 2.5));
    assert_eq!(f.memo_counts(), (0, 0));
    let traced = cost_only("npu-910b").with_memo(true).with_trace(true);
    let (xs, ys) = shapes(64);
    let r = stream::launch(&traced, &cfg, &xs, &ys, true).unwrap();
    assert!(r.trace.is_some());
    stream::launch(&traced, &cfg, &xs, &ys, true).unwrap();
    assert_eq!(traced.memo_counts(), (0, 0));
}
