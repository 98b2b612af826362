use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), 16),))]
fn k(x: &Tensor<f32>) -> Tile<f32, 16, 64> {
    let r = program_id(0) * 16;
    load::<16, 64>(x, r, 0)
}

fn main() {}
