// `deinterleave` returns a pair of tiles and `interleave` one tile whose widths Rust infers from
// their use or, as here, from typed `let`s (half and full width): both expand and run.
use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), BR),), tunable(BR = [4, 2], C = [8, 16]), derived(CH = C / 2))]
fn rotate_pairs(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * BR;
    let (re, im): (Tile<f32, BR, CH>, Tile<f32, BR, CH>) = deinterleave(&load::<BR, C>(x, r, 0));
    // (re, im) → (−im, re): multiplication by i.
    let out: Tile<f32, BR, C> = interleave(&neg(&im), &re);
    store(y, r, 0, &out);
}

fn main() {
    let launcher = Launcher::for_device("npu-910b").unwrap();
    for config in rotate_pairs::META.space() {
        let c = config.get("C").unwrap() as usize;
        let x: Vec<f32> = (0..5 * c).map(|i| i as f32).collect();
        let xt = Tensor::<f32>::from_f32(&[5, c], &x).unwrap();
        let y = Tensor::<f32>::poisoned(&[5, c]);
        rotate_pairs::launch(&launcher, &config, &xt, &y).unwrap();
        let want: Vec<f32> = x.chunks_exact(2).flat_map(|p| [-p[1], p[0]]).collect();
        assert_eq!(y.to_vec().unwrap(), want, "{config}");
    }
}
