// Helpers: `#[kernel(helper)]` functions (taking the kernel's constants as const generics) called
// from a kernel that lists them in `helpers(...)`, one of them calling another. Everything a helper
// issues is attributed to the kernel line that called it.
use dsl_core::prelude::*;

/// `a · b + b`, element-wise.
#[kernel(helper)]
fn mul_add<const R: usize, const C: usize>(
    a: &Tile<f32, R, C>,
    b: &Tile<f32, R, C>,
) -> Tile<f32, R, C> {
    add(&mul(a, b), b)
}

/// `a · a + a`, through the other helper.
#[kernel(helper, helpers(mul_add))]
fn square_plus<const R: usize, const C: usize>(a: &Tile<f32, R, C>) -> Tile<f32, R, C> {
    mul_add::<R, C>(a, a)
}

#[kernel(grid = (cdiv(x.rows(), BR),), tunable(BR = [8, 16]), helpers(mul_add, square_plus))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>, z: &Tensor<f32>) {
    let r = program_id(0) * BR;
    let tx = load::<BR, 32>(x, r, 0);
    let ty = load::<BR, 32>(y, r, 0);
    let s = mul_add(&tx, &ty);
    store(z, r, 0, &add(&s, &square_plus::<BR, 32>(&tx)));
}

fn main() {
    let (rows, cols) = (20, 32);
    let xs: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 * 0.5).collect();
    let ys: Vec<f32> = (0..rows * cols).map(|i| (i % 5) as f32 - 2.0).collect();
    let x = Tensor::<f32>::from_f32(&[rows, cols], &xs).unwrap();
    let y = Tensor::<f32>::from_f32(&[rows, cols], &ys).unwrap();
    let launcher = Launcher::for_device("npu-910b").unwrap();
    for br in [8, 16] {
        let z = Tensor::<f32>::poisoned(&[rows, cols]);
        let run = k::launch(&launcher, &Config::new().with("BR", br), &x, &y, &z).unwrap();
        let got = z.to_vec().unwrap();
        for i in 0..rows * cols {
            let (a, b) = (xs[i], ys[i]);
            let want = a * b + b + a * a + a;
            assert!(
                got[i] == want,
                "BR={br} element {i}: got {}, want {want}",
                got[i]
            );
        }
        // Every cycle lands on a line of the kernel (helper lines are not kernel lines).
        assert!(!run.report.lines.is_empty());
        for l in &run.report.lines {
            assert!(
                k::META.lines.iter().any(|(n, _)| *n == l.line),
                "line {} ({:?}) is not a kernel line: {:?}",
                l.line,
                l.code,
                k::META.lines
            );
        }
        // The `mul_add` call issues a multiply and an add per program.
        let call = k::META
            .lines
            .iter()
            .find(|(_, c)| c.contains("mul_add("))
            .expect("call line recorded");
        let stat = run
            .report
            .lines
            .iter()
            .find(|l| l.line == call.0)
            .expect("call line costed");
        assert_eq!(stat.count, 2 * run.report.programs, "{stat:?}");
    }
}
