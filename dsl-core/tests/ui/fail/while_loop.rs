use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), 16),))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let mut r = program_id(0) * 16;
    while r < x.rows() {
        let t = load::<16, 64>(x, r, 0);
        store(y, r, 0, &t);
        r += 16 * num_programs(0);
    }
}

fn main() {}
