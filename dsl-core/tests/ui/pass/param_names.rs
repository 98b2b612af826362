// Kernel parameters may use any name, including the ones of the generated `launch` function's own
// parameters (`launcher`, `config`) and locals (`grid`). Intrinsic calls nest; each call is
// attributed to its own line, and a statement's code is shown on one line.
use dsl_core::prelude::*;

#[rustfmt::skip]
#[kernel(grid = (cdiv(grid.rows(), 8),))]
fn k(grid: &Tensor<f32>, config: &Tensor<f32>, launcher: &Tensor<f32>) {
    let r = program_id(0) * 8;
    let s = add(&load::<8, 16>(grid, r, 0), &load::<8, 16>(config, r, 0));
    store(launcher, r, 0,
          &add(&s,
               &scale(&load::<8, 16>(config, r, 0), 1.0)));
}

fn main() {
    let a = Tensor::<f32>::from_f32(&[12, 16], &vec![1.0; 12 * 16]).unwrap();
    let b = Tensor::<f32>::from_f32(&[12, 16], &vec![0.25; 12 * 16]).unwrap();
    let out = Tensor::<f32>::poisoned(&[12, 16]);
    let dev = Launcher::for_device("npu-910b").unwrap();
    let run = k::launch(&dev, &Config::new(), &a, &b, &out).unwrap();
    assert!(out.to_vec().unwrap().iter().all(|v| *v == 1.5));
    assert_eq!(run.report.grid, [2, 1, 1]);

    let lines = k::META.lines;
    let store = "store(launcher, r, 0, &add(&s, &scale(&load::<8, 16>(config, r, 0), 1.0)));";
    let want: [(u32, &str); 5] = [
        (9, "let r = program_id(0) * 8;"),
        (
            10,
            "let s = add(&load::<8, 16>(grid, r, 0), &load::<8, 16>(config, r, 0));",
        ),
        (11, store),
        (12, store),
        (13, store),
    ];
    assert_eq!(lines, want, "{lines:#?}");
}
