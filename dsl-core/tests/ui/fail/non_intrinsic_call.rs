use dsl_core::prelude::*;

fn double(t: &Tile<f32, 16, 64>) -> Tile<f32, 16, 64> {
    let _ = t;
    unimplemented!()
}

#[kernel(grid = (cdiv(x.rows(), 16),))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 16;
    let t = load::<16, 64>(x, r, 0);
    store(y, r, 0, &double(&t));
}

fn main() {}
