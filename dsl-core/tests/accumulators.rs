//! Register-resident accumulators (devices with an `[accumulators]` section, e.g. h800): flash
//! attention's `acc = acc · α; acc += P V` rescale updates the registers in place, so the old and
//! the new accumulator never hold the register file together, and the zero-filled first `acc`
//! is an accumulator too; the scores' element-wise chain (scale, exp) stays in the registers of the
//! accumulator it comes from. A copy that stays live is still counted twice.

use dsl_core::prelude::*;
use dsl_core::SimError;

/// 128×320 f32 = 160 KiB: one fits h800's 256 KiB register file, two do not.
const R: usize = 128;
const C: usize = 320;

/// `acc = (acc ⊙ α) + A_s B_s` over `a.rows() / R` steps, the online-softmax accumulator pattern.
#[kernel(grid = (1,))]
fn rescaled(a: &Tensor<f32>, b: &Tensor<f32>, alpha: &Tensor<f32>, o: &Tensor<f32>) {
    let mut acc = zeros::<f32, R, C>();
    for s in 0..a.rows() / R {
        let ta = load::<R, 16>(a, s * R, 0);
        let tb = load::<16, C>(b, s * 16, 0);
        let al = load::<R, 1>(alpha, s * R, 0);
        acc = mul_col(&acc, &al);
        mma(&mut acc, &ta, &tb);
    }
    store(o, 0, 0, &acc);
}

/// As [`rescaled`], but the pre-rescale accumulator is read again afterwards: both copies live.
#[kernel(grid = (1,))]
fn rescaled_kept(a: &Tensor<f32>, b: &Tensor<f32>, alpha: &Tensor<f32>, o: &Tensor<f32>) {
    let mut acc = zeros::<f32, R, C>();
    for s in 0..a.rows() / R {
        let ta = load::<R, 16>(a, s * R, 0);
        let tb = load::<16, C>(b, s * 16, 0);
        let al = load::<R, 1>(alpha, s * R, 0);
        let mut next = mul_col(&acc, &al);
        mma(&mut next, &ta, &tb);
        acc = add(&next, &acc);
        mma(&mut acc, &ta, &tb);
    }
    store(o, 0, 0, &acc);
}

/// `exp(s · 0.5)` of the scores `s = A Bᵀ`, as attention's softmax numerator: every element-wise
/// result takes over its dying source's registers (on shared memory, the scaled and the
/// exponentiated 160 KiB tiles would need 320 KiB at once).
#[kernel(grid = (1,))]
fn score_chain(a: &Tensor<f32>, b: &Tensor<f32>, o: &Tensor<f32>) {
    let ta = load::<R, 16>(a, 0, 0);
    let tb = load::<C, 16>(b, 0, 0);
    let mut s = zeros::<f32, R, C>();
    mma_bt(&mut s, &ta, &tb);
    store(o, 0, 0, &exp(&scale(&s, 0.5)));
}

/// A loaded tile scaled into an accumulator: the accumulator is register-resident, the loaded
/// tile stays in shared memory, where the DMA put it.
#[kernel(grid = (1,))]
fn loaded_into_accumulator(
    x: &Tensor<f32>,
    alpha: &Tensor<f32>,
    a: &Tensor<f32>,
    b: &Tensor<f32>,
    o: &Tensor<f32>,
) {
    let t = load::<R, C>(x, 0, 0);
    let mut acc = mul_col(&t, &load::<R, 1>(alpha, 0, 0));
    mma(&mut acc, &load::<R, 16>(a, 0, 0), &load::<16, C>(b, 0, 0));
    store(o, 0, 0, &acc);
}

fn inputs(steps: usize) -> (Tensor<f32>, Tensor<f32>, Tensor<f32>) {
    // Deterministic, non-zero, varied values.
    let val = |i: usize, k: u32| {
        ((i as u32).wrapping_mul(2654435761).wrapping_add(k) % 1000) as f32 / 500.0 - 1.0
    };
    let a: Vec<f32> = (0..steps * R * 16).map(|i| val(i, 1)).collect();
    let b: Vec<f32> = (0..steps * 16 * C).map(|i| val(i, 2)).collect();
    let al: Vec<f32> = (0..steps * R).map(|i| 0.5 + val(i, 3).abs()).collect();
    (
        Tensor::from_f32(&[steps * R, 16], &a).unwrap(),
        Tensor::from_f32(&[steps * 16, C], &b).unwrap(),
        Tensor::from_f32(&[steps * R, 1], &al).unwrap(),
    )
}

#[test]
fn an_in_place_rescale_fits_the_register_file_and_computes_the_recurrence() {
    let steps = 3;
    let (a, b, al) = inputs(steps);
    let o = Tensor::poisoned(&[R, C]);
    let launcher = Launcher::for_device("h800").unwrap();
    let r = rescaled::launch(&launcher, &Config::new(), &a, &b, &al, &o)
        .expect("one 160 KiB accumulator fits the 256 KiB register file");
    assert!(r.report.cycles > 0);
    // f64 reference of the same recurrence.
    let [av, bv, alv, ov] = [&a, &b, &al, &o].map(|t| t.to_vec().unwrap());
    let mut acc = vec![0f64; R * C];
    for s in 0..steps {
        for i in 0..R {
            let f = alv[s * R + i] as f64;
            for j in 0..C {
                let mut x = acc[i * C + j] * f;
                for k in 0..16 {
                    x += av[(s * R + i) * 16 + k] as f64 * bv[(s * 16 + k) * C + j] as f64;
                }
                acc[i * C + j] = x;
            }
        }
    }
    for (i, (got, want)) in ov.iter().zip(&acc).enumerate() {
        assert!(
            (*got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
            "element {i}: {got} vs {want}"
        );
    }
}

#[test]
fn a_rescaled_copy_that_stays_live_counts_twice() {
    let (a, b, al) = inputs(2);
    let o = Tensor::shape_only(&[R, C]);
    let launcher = Launcher::for_device("h800")
        .unwrap()
        .with_backend(Backend::CostOnly);
    let Err(err) = rescaled_kept::launch(&launcher, &Config::new(), &a, &b, &al, &o) else {
        panic!("two live 160 KiB accumulators overflow the register file");
    };
    assert!(matches!(err, SimError::SramOverflow { .. }), "{err}");
    // The in-place form of the same sizes fits.
    rescaled::launch(&launcher, &Config::new(), &a, &b, &al, &o).unwrap();
}

#[test]
fn the_scores_element_wise_chain_stays_in_registers() {
    let (a, _, _) = inputs(1);
    let bt = Tensor::shape_only(&[C, 16]);
    let o = Tensor::shape_only(&[R, C]);
    let launcher = Launcher::for_device("h800")
        .unwrap()
        .with_backend(Backend::CostOnly);
    let r = score_chain::launch(&launcher, &Config::new(), &a, &bt, &o).unwrap();
    assert!(r.report.cycles > 0);
}

#[test]
fn a_loaded_tile_stays_in_shared_memory() {
    let (a, b, al) = inputs(1);
    let (x, o) = (Tensor::shape_only(&[R, C]), Tensor::shape_only(&[R, C]));
    let launcher = Launcher::for_device("h800")
        .unwrap()
        .with_backend(Backend::CostOnly);
    let r =
        loaded_into_accumulator::launch(&launcher, &Config::new(), &x, &al, &a, &b, &o).unwrap();
    assert!(
        r.report.sram_peak_bytes >= (R * C * 4) as u64,
        "{}",
        r.report.sram_peak_bytes
    );
}
