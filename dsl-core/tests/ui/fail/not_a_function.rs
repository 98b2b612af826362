use dsl_core::prelude::*;

#[kernel(grid = 1)]
struct Gemm {
    bm: usize,
}

fn main() {
    let g = Gemm { bm: 64 };
    assert_eq!(g.bm, 64);
}
