// Derived constants: `derived(HALF = BC / 2)` gives the kernel a second tile width computed from a
// tunable (stable Rust has no arithmetic on const generics), for every point of the space. Here a
// row of u8 values is read as two halves, summed pairwise and written out as f32.
use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), BR),), tunable(BR = [4, 8], BC = [16, 64]), derived(HALF = BC / 2))]
fn fold_halves(x: &Tensor<u8>, y: &Tensor<f32>) {
    let r = program_id(0) * BR;
    let lo = cast::<f32>(&load::<BR, HALF>(x, r, 0));
    let hi = cast::<f32>(&load::<BR, HALF>(x, r, HALF));
    store(y, r, 0, &add(&lo, &hi));
}

fn main() {
    let (rows, cols) = (10, 64);
    let bytes: Vec<u8> = (0..rows * cols).map(|i| (i * 7 % 251) as u8).collect();
    let x = Tensor::<u8>::from_bytes(&[rows, cols], &bytes).unwrap();
    let y = Tensor::<f32>::poisoned(&[rows, cols / 2]);
    let launcher = Launcher::for_device("npu-910b").unwrap();
    fold_halves::launch(&launcher, &Config::new().with("BR", 8).with("BC", 64), &x, &y).unwrap();
    let out = y.to_vec().unwrap();
    for r in 0..rows {
        for c in 0..cols / 2 {
            let want = bytes[r * cols + c] as f32 + bytes[r * cols + c + cols / 2] as f32;
            assert_eq!(out[r * (cols / 2) + c], want, "row {r} col {c}");
        }
    }
}
