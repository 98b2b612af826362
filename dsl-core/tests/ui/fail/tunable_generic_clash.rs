use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), 16),), tunable(T = [16, 32]))]
fn k<T: Float>(x: &Tensor<T>, y: &Tensor<T>) {
    let r = program_id(0) * 16;
    let t = load::<16, 64>(x, r, 0);
    store(y, r, 0, &t);
}

fn main() {}
