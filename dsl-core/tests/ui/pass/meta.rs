// `META`: name, parameters, tunable space (cartesian product in declaration order), default
// configuration and the source lines that issue instructions.
use dsl_core::prelude::*;

#[kernel(grid = (cdiv(x.rows(), BR), cdiv(x.cols(), BC)), tunable(BR = [8, 16, 32], BC = [64, 128]))]
pub fn scale_rows<T: Float>(x: &Tensor<T>, y: &Tensor<T>, s: f32) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let t = cast::<f32>(&load::<BR, BC>(x, r, c));
    let scaled = scale(&t, s);
    store(y, r, c, &cast::<T>(&scaled));
}

fn main() {
    let meta = &scale_rows::META;
    assert_eq!(meta.name, "scale_rows");
    assert_eq!(meta.params, ["x", "y", "s"]);
    assert_eq!(meta.tunables.len(), 2);
    assert_eq!(meta.tunables[0], ("BR", &[8i64, 16, 32][..]));
    assert_eq!(meta.tunables[1], ("BC", &[64i64, 128][..]));

    let space = meta.space();
    assert_eq!(space.len(), 6);
    assert_eq!(space[0], meta.default_config());
    assert_eq!(space[0].to_string(), "BC=64 BR=8");
    assert_eq!(space[1].to_string(), "BC=128 BR=8");
    assert_eq!(space[5].to_string(), "BC=128 BR=32");

    // Lines: the three statements that issue instructions, in source order, with their code.
    let codes: Vec<&str> = meta.lines.iter().map(|(_, c)| *c).collect();
    assert_eq!(meta.lines.len(), 4, "{codes:?}");
    assert!(
        codes[0].starts_with("let (r, c) = (program_id(0)"),
        "{codes:?}"
    );
    assert!(codes[1].contains("load::<BR, BC>(x, r, c)"), "{codes:?}");
    assert!(codes[2].contains("scale(&t, s)"), "{codes:?}");
    assert!(codes[3].starts_with("store(y, r, c"), "{codes:?}");
    assert!(
        meta.lines.windows(2).all(|w| w[0].0 + 1 == w[1].0),
        "{:?}",
        meta.lines
    );
    assert!(meta.file.ends_with("meta.rs"), "{}", meta.file);

    // And the kernel runs, for any element type.
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let x = Tensor::<bf16>::from_f32(&[24, 100], &vec![1.5; 2400]).unwrap();
    let y = Tensor::<bf16>::poisoned(&[24, 100]);
    let run = scale_rows::launch(
        &launcher,
        &Config::new().with("BR", 16).with("BC", 128),
        &x,
        &y,
        2.0,
    )
    .unwrap();
    assert!(y.to_vec().unwrap().iter().all(|v| *v == 3.0));
    assert_eq!(run.report.grid, [2, 1, 1]);
}
