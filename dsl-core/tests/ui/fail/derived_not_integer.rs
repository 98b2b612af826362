use dsl_core::prelude::*;

#[kernel(grid = (1,), tunable(BK = [32, 48]), derived(BKS = BK / 32))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let t = load::<1, BKS>(x, 0, 0);
    store(y, 0, 0, &t);
}

fn main() {}
