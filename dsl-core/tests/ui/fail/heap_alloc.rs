use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), 16),))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * 16;
    let mut tiles = Vec::new();
    let offsets = vec![0usize, 64];
    let boxed = Box::new(load::<16, 64>(x, r, 0));
    let more: std::vec::Vec<usize> = std::vec::Vec::with_capacity(4);
    tiles.push(load::<16, 64>(x, r, offsets[1]));
    store(y, r, 0, &boxed);
}

fn main() {}
