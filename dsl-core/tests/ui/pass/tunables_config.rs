// A tiled GEMM launched with non-default tunables on the npu-910b preset: the result is exact
// (small integers), the report names the configuration, and values outside the space are refused.
use dsl_core::prelude::*;

#[kernel(
    grid = (cdiv(c.rows(), BM), cdiv(c.cols(), BN)),
    tunable(BM = [32, 16], BN = [32, 16], BK = [32, 8])
)]
fn mm(a: &Tensor<f32>, b: &Tensor<f32>, c: &Tensor<f32>) {
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    for k in (0..a.cols()).step_by(BK) {
        let ta = load::<BM, BK>(a, row, k);
        let tb = load::<BK, BN>(b, k, col);
        mma(&mut acc, &ta, &tb);
    }
    store(c, row, col, &acc);
}

fn main() {
    let (m, n, k) = (40, 24, 44);
    let av: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 5) as f32 - 2.0).collect();
    let bv: Vec<f32> = (0..k * n).map(|i| ((i * 3) % 4) as f32 - 1.0).collect();
    let a = Tensor::<f32>::from_f32(&[m, k], &av).unwrap();
    let b = Tensor::<f32>::from_f32(&[k, n], &bv).unwrap();
    let c = Tensor::<f32>::poisoned(&[m, n]);
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let config = Config::new().with("BM", 16).with("BK", 8);
    let run = mm::launch(&launcher, &config, &a, &b, &c).unwrap();

    let got = c.to_vec().unwrap();
    for i in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|p| av[i * k + p] * bv[p * n + j]).sum();
            assert!(
                got[i * n + j] == want,
                "c[{i}][{j}] = {}, want {want}",
                got[i * n + j]
            );
        }
    }
    let r = &run.report;
    let cfg: Vec<(&str, i64)> = r.config.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    assert_eq!(
        cfg,
        [("BK", 8), ("BM", 16), ("BN", 32)],
        "unset BN takes its first value"
    );
    assert_eq!(r.grid, [3, 1, 1]);
    assert_eq!(r.programs, 3);
    assert!(r.cycles > 0);
    assert_eq!(
        r.matrix_flop,
        (2 * 48 * 32 * 48) as u64,
        "padded tiles: 3 programs × 6 K-steps of 16×32×8"
    );

    let err = mm::launch(&launcher, &Config::new().with("BM", 64), &a, &b, &c).unwrap_err();
    assert!(
        err.to_string().contains("not in the declared values"),
        "{err}"
    );
    let err = mm::launch(&launcher, &Config::new().with("TILE", 64), &a, &b, &c).unwrap_err();
    assert!(err.to_string().contains("not a tunable"), "{err}");
}
