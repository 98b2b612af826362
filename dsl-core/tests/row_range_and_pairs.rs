//! `Tensor::row_range` views (bounded windows of consecutive rows) and the `deinterleave` /
//! `interleave` intrinsics, through real launches.

use dsl_core::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

/// Copies `x` into `y` in 8×8 tiles (ragged edges masked).
#[kernel(grid = (cdiv(y.rows(), 8), cdiv(y.cols(), 8)))]
fn copy(x: &Tensor<f32>, y: &Tensor<f32>) {
    let (r, c) = (program_id(0) * 8, program_id(1) * 8);
    store(y, r, c, &load::<8, 8>(x, r, c));
}

/// Swaps each column pair (2j, 2j+1) of a row of 8 values via deinterleave + interleave.
#[kernel(grid = (cdiv(x.rows(), 4),))]
fn swap_pairs(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 4;
    let (even, odd): (Tile<f32, 4, 4>, Tile<f32, 4, 4>) = deinterleave(&load::<4, 8>(x, r, 0));
    let swapped: Tile<f32, 4, 8> = interleave(&odd, &even);
    store(y, r, 0, &swapped);
}

fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32 + 0.5).collect()
}

#[test]
fn row_range_reads_and_writes_only_its_window() {
    // A [3, 5, 6] tensor is 15 rows of 6; take rows 4..11 (they cross the first dimension).
    let src = Tensor::<f32>::from_f32(&[3, 5, 6], &iota(90)).unwrap();
    let view = src.row_range(4, 7).unwrap();
    assert_eq!(view.shape(), &[7, 6]);
    assert_eq!(view.to_vec().unwrap(), iota(90)[24..66].to_vec());
    // Writing through a window of a poisoned tensor touches exactly those rows.
    let dst = Tensor::<f32>::poisoned(&[15, 6]);
    copy::launch(
        &launcher(),
        &Config::new(),
        &view,
        &dst.row_range(8, 7).unwrap(),
    )
    .unwrap();
    let out = dst.to_vec().unwrap();
    assert!(
        out[..48].iter().all(|v| v.is_nan()),
        "rows before the window"
    );
    assert_eq!(out[48..90].to_vec(), iota(90)[24..66].to_vec());
    // A view of a view composes offsets.
    let inner = view.row_range(2, 3).unwrap();
    assert_eq!(inner.to_vec().unwrap(), iota(90)[36..54].to_vec());
}

#[test]
fn row_range_outside_is_an_error_naming_the_rows() {
    let t = Tensor::<f32>::poisoned(&[4, 3]);
    let e = t.row_range(3, 2).unwrap_err();
    assert!(e.contains("3..5") && e.contains("4 rows"), "{e}");
    assert!(t.row_range(usize::MAX, 2).is_err());
    assert_eq!(t.row_range(4, 0).unwrap().shape(), &[0, 3]);
}

#[test]
fn deinterleave_then_interleave_swaps_pairs() {
    let rows = 6; // ragged against the 4-row tile
    let x = Tensor::<f32>::from_f32(&[rows, 8], &iota(rows * 8)).unwrap();
    let y = Tensor::<f32>::poisoned(&[rows, 8]);
    swap_pairs::launch(&launcher(), &Config::new(), &x, &y).unwrap();
    let want: Vec<f32> = iota(rows * 8)
        .chunks_exact(2)
        .flat_map(|p| [p[1], p[0]])
        .collect();
    assert_eq!(y.to_vec().unwrap(), want);
}
