use dsl_core::prelude::*;

#[kernel(grid = (cdiv(c.rows(), BM), cdiv(c.cols(), BN)), tunable(BM = [32], BN = [32], BK = [64]))]
fn k(a: &Tensor<f32>, b: &Tensor<f32>, c: &Tensor<f32>) {
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    for k in (0..a.cols()).step_by(BK) {
        let ta = load::<BM, BK>(a, row, k);
        let tb = load::<BN, BK>(b, col, k);
        mma(&mut acc, &ta, &tb);
    }
    store(c, row, col, &acc);
}

fn main() {}
