use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), 16),), grid = (cdiv(x.rows(), 16), 1))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 16;
    let t = load::<16, 64>(x, r, 0);
    store(y, r, 0, &t);
}

fn main() {}
