use dsl_core::prelude::*;

#[kernel(grid = 1)]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let mut r = 0;
    loop {
        if r >= x.rows() {
            break;
        }
        let t = load::<16, 64>(x, r, 0);
        store(y, r, 0, &t);
        r += 16;
    }
}

fn main() {}
