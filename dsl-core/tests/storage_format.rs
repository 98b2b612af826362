//! An f32 tensor held in device memory as bf16 or f16 (`Tensor::stored_as`), as a bf16
//! deployment holds its activations: a store rounds to the storage format, a load moves its bytes
//! (half an f32's), kernels still compute on f32 tiles, and the launch memo tells the two apart.

use dsl_core::accel_sim::DType;
use dsl_core::prelude::*;
use proptest::prelude::*;

const R: usize = 8;
const C: usize = 32;

/// `y = 2x`, tile by tile: one load and one store per program.
#[kernel(grid = (cdiv(x.rows(), R), cdiv(x.cols(), C)))]
fn double(x: &Tensor<f32>, y: &Tensor<f32>) {
    let (r, c) = (program_id(0) * R, program_id(1) * C);
    let t = load::<R, C>(x, r, c);
    store(y, r, c, &add(&t, &t));
}

/// Random non-zero values of mixed signs and magnitudes (most are not bf16-representable).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let m = (s >> 40) as f32 / (1u64 << 24) as f32 + 0.5;
            let e = ((s >> 8) % 16) as i32 - 8;
            let sign = if s & 1 == 0 { 1.0 } else { -1.0 };
            sign * m * 2f32.powi(e)
        })
        .collect()
}

fn round(v: &[f32], d: DType) -> Vec<f32> {
    let mut v = v.to_vec();
    dsl_core::accel_sim::functional::round_to(&mut v, d);
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Stores round to the storage format (exactly the format's rounding of the f32 result) and
    /// every element is written; an f32 tensor stays exact.
    #[test]
    fn stores_round_to_the_storage_format(
        rows in 1usize..40,
        cols in 1usize..100,
        seed in any::<u64>(),
        narrow in prop::sample::select(vec![DType::Bf16, DType::F16]),
    ) {
        let x_vals = values(rows * cols, seed);
        let x = Tensor::<f32>::from_f32(&[rows, cols], &x_vals).unwrap();
        let launcher = Launcher::for_device("npu-910b").unwrap();
        let doubled: Vec<f32> = x_vals.iter().map(|v| 2.0 * v).collect();
        for d in [DType::F32, narrow] {
            // Poisoned: an element the kernel does not write stays NaN and fails below.
            let y = Tensor::<f32>::poisoned(&[rows, cols]).stored_as(d).unwrap();
            double::launch(&launcher, &Config::new(), &x, &y).unwrap();
            let got = y.to_vec().unwrap();
            let want = round(&doubled, d);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                prop_assert!(g == w, "{d:?} element {i}: {g} vs {w}");
            }
        }
    }
}

/// A load from a bf16-held tensor and a store into one move half the bytes of f32 ones, cost-only
/// and functional alike; the memo keys the two apart.
#[test]
fn narrow_storage_moves_half_the_bytes() {
    let (rows, cols) = (256, 512);
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let cost = launcher
        .clone()
        .with_backend(Backend::CostOnly)
        .with_memo(true);
    let run = |l: &Launcher, d: DType, data: bool| {
        let (x, y) = if data {
            let x = Tensor::<f32>::from_f32(&[rows, cols], &values(rows * cols, 7)).unwrap();
            (x, Tensor::<f32>::poisoned(&[rows, cols]))
        } else {
            (
                Tensor::<f32>::shape_only(&[rows, cols]),
                Tensor::<f32>::shape_only(&[rows, cols]),
            )
        };
        let (x, y) = (x.stored_as(d).unwrap(), y.stored_as(d).unwrap());
        let r = double::launch(l, &Config::new(), &x, &y).unwrap().report;
        (r.hbm_read_bytes + r.l2_bytes, r.hbm_write_bytes, r.cycles)
    };
    let f32_cost = run(&cost, DType::F32, false);
    let bf16_cost = run(&cost, DType::Bf16, false);
    let elems = (rows * cols) as u64;
    assert_eq!(f32_cost.0, 4 * elems);
    assert_eq!(f32_cost.1, 4 * elems);
    assert_eq!(
        bf16_cost.0,
        2 * elems,
        "a bf16-held input reads 2 bytes per element"
    );
    assert_eq!(
        bf16_cost.1,
        2 * elems,
        "a bf16-held output writes 2 bytes per element"
    );
    assert!(bf16_cost.2 < f32_cost.2, "{bf16_cost:?} vs {f32_cost:?}");
    // Functional launches time the same traffic.
    assert_eq!(run(&launcher, DType::Bf16, true), bf16_cost);
}

/// Only an f32 tensor can be held narrower, and only in a 16-bit float: an error, not a panic.
#[test]
fn storage_formats_are_checked() {
    let t = Tensor::<f32>::shape_only(&[4, 4]);
    assert!(t.clone().stored_as(DType::Fp8e4m3).is_err());
    assert!(Tensor::<bf16>::shape_only(&[4, 4])
        .stored_as(DType::F16)
        .is_err());
    let held = t.stored_as(DType::Bf16).unwrap();
    assert_eq!(held.storage(), DType::Bf16);
    // Views keep the storage format.
    assert_eq!(held.rows_clipped(1, 3).storage(), DType::Bf16);
    assert!(format!("{held:?}").contains("stored bf16"));
    // The format belongs to the whole tensor: a view of part of a memory cannot narrow it.
    let whole = Tensor::<f32>::from_f32(&[4, 4], &[0.5; 16]).unwrap();
    assert!(whole.rows_clipped(1, 3).stored_as(DType::Bf16).is_err());
    // Existing data is rounded when the format narrows.
    let x = Tensor::<f32>::from_f32(&[1, 2], &[1.0 + 1.0 / 512.0, 3.0])
        .unwrap()
        .stored_as(DType::Bf16)
        .unwrap();
    assert_eq!(x.to_vec().unwrap(), vec![1.0, 3.0]);
}
