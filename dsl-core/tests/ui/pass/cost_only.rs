// The cost-only backend (shape-only tensors, no data) reports the same cycles as a functional launch.
use dsl_core::prelude::*;

#[kernel(
    grid = (cdiv(c.rows(), BM), cdiv(c.cols(), BN)),
    tunable(BM = [64, 32], BN = [64, 32], BK = [32, 64])
)]
fn mm<T: Float>(a: &Tensor<T>, b: &Tensor<T>, c: &Tensor<f32>) {
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    let mut ta = load_async::<BM, BK>(a, row, 0);
    let mut tb = load_async::<BK, BN>(b, 0, col);
    for k in (BK..a.cols() + BK).step_by(BK) {
        let next_a = load_async::<BM, BK>(a, row, k);
        let next_b = load_async::<BK, BN>(b, k, col);
        mma(&mut acc, &ta, &tb);
        ta = next_a;
        tb = next_b;
    }
    store(c, row, col, &acc);
}

fn main() {
    let (m, n, k) = (130, 96, 200);
    let functional = Launcher::for_device("npu-910b").unwrap();
    let cost_only = functional.clone().with_backend(Backend::CostOnly);
    let a = Tensor::<bf16>::from_f32(&[m, k], &vec![0.5; m * k]).unwrap();
    let b = Tensor::<bf16>::from_f32(&[k, n], &vec![0.25; k * n]).unwrap();
    for config in mm::META.space() {
        let c = Tensor::<f32>::poisoned(&[m, n]);
        let f = mm::launch(&functional, &config, &a, &b, &c).unwrap();
        assert!(
            c.to_vec().unwrap().iter().all(|v| *v == 0.125 * k as f32),
            "{config}"
        );

        let (sa, sb) = (
            Tensor::<bf16>::shape_only(&[m, k]),
            Tensor::<bf16>::shape_only(&[k, n]),
        );
        let sc = Tensor::<f32>::shape_only(&[m, n]);
        let s = mm::launch(&cost_only, &config, &sa, &sb, &sc).unwrap();
        assert!(sc.to_vec().is_none(), "cost-only launches compute nothing");
        assert!(s.report.cost_only && !f.report.cost_only);
        assert!(f.report.cycles > 0);
        assert_eq!(s.report.cycles, f.report.cycles, "{config}");
        assert_eq!(s.report.hbm_bytes, f.report.hbm_bytes, "{config}");
        assert_eq!(s.report.matrix_flop, f.report.matrix_flop, "{config}");
    }
}
