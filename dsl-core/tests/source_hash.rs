//! `KernelMeta::source_hash`: `#[kernel]` hashes each kernel's source as written, so a cache
//! keyed by it (`day0 tune`'s) tells an edited kernel from the one it tuned.

use dsl_core::prelude::*;

/// Copies `x` into `y`, `BR` rows at a time.
#[kernel(grid = (cdiv(y.rows(), BR),), tunable(BR = [8, 16]))]
fn copy_rows(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * BR;
    store(y, r, 0, &load::<BR, 64>(x, r, 0));
}

/// The same kernel with one edit in its body (a scale).
#[kernel(grid = (cdiv(y.rows(), BR),), tunable(BR = [8, 16]))]
fn copy_rows_scaled(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * BR;
    store(y, r, 0, &scale(&load::<BR, 64>(x, r, 0), 2.0));
}

/// The first kernel's text under another name.
#[kernel(grid = (cdiv(y.rows(), BR),), tunable(BR = [8, 16]))]
fn copy_rows_renamed(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * BR;
    store(y, r, 0, &load::<BR, 64>(x, r, 0));
}

#[test]
fn each_kernel_source_has_its_own_hash() {
    let hashes = [
        copy_rows::META.source_hash,
        copy_rows_scaled::META.source_hash,
        copy_rows_renamed::META.source_hash,
    ];
    // They are kernels like any other (and the edited one issues more work).
    let l = Launcher::for_device("h800")
        .unwrap()
        .with_backend(Backend::CostOnly);
    let (x, y) = (Tensor::shape_only(&[64, 64]), Tensor::shape_only(&[64, 64]));
    let c = Config::new().with("BR", 8);
    let plain = copy_rows::launch(&l, &c, &x, &y).unwrap().report;
    let scaled = copy_rows_scaled::launch(&l, &c, &x, &y).unwrap().report;
    let renamed = copy_rows_renamed::launch(&l, &c, &x, &y).unwrap().report;
    assert!(scaled.vector_ops > plain.vector_ops);
    assert_eq!(plain.cycles, renamed.cycles);
    for (i, a) in hashes.iter().enumerate() {
        assert_ne!(*a, 0);
        for b in &hashes[i + 1..] {
            assert_ne!(a, b, "{hashes:x?}");
        }
    }
}
