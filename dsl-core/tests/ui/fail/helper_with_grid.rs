use dsl_core::prelude::*;

#[kernel(helper, grid = 1, tunable(R = [16]))]
fn twice<const R: usize>(t: &Tile<f32, R, 64>) -> Tile<f32, R, 64> {
    add(t, t)
}

fn main() {}
