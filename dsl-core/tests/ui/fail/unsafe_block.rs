use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), 16),))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 16;
    let t = load::<16, 64>(x, r, 0);
    let t2: Tile<f32, 16, 64> = unsafe { std::mem::transmute_copy(&t) };
    store(y, r, 0, &t2);
}

fn main() {}
