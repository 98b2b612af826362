use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), BM),), tunable(BM = [16, 0]))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * BM;
    let t = load::<BM, 64>(x, r, 0);
    store(y, r, 0, &t);
}

fn main() {}
