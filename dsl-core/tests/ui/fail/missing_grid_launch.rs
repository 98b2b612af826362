use dsl_core::prelude::*;

// One mistake, one error: the kernel's `launch` still exists (as a stub) for its callers.
#[kernel(tunable(BM = [16, 32]))]
fn k(x: &Tensor<f32>, y: &Tensor<f32>) {
    let r = program_id(0) * BM;
    let t = load::<BM, 64>(x, r, 0);
    store(y, r, 0, &t);
}

fn main() {
    let x = Tensor::<f32>::shape_only(&[64, 64]);
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let _ = k::launch(&launcher, &Config::new(), &x, &x);
}
