//! Token embedding against the f64 reference (an exact copy: tolerance 0, any difference fails),
//! and the host checks of `run_embedding`.
//!
//! Tables are fresh random values, ids drawn over the whole vocabulary (repeats included), widths
//! ragged, outputs poisoned with NaN beforehand.

use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::embedding::{embedding, run_embedding};
use kernels::reference::{self, rel_error};
use kernels::testdata::Rng;
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

fn run<T: Float>(ids: &[i32], vocab: usize, hidden: usize, seed: u64) -> f64 {
    let table =
        Tensor::<T>::from_f32(&[vocab, hidden], &Rng::new(seed).vec(vocab * hidden, 1.0)).unwrap();
    let out = Tensor::<T>::poisoned(&[ids.len(), hidden]);
    run_embedding(&launcher(), ids, &table, &out).unwrap();
    let want = reference::embedding(ids, &table.to_vec().unwrap(), hidden);
    rel_error(&out.to_vec().unwrap(), &want)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn f32_copies_rows(vocab in 1usize..300, hidden in 1usize..1500, tokens in 1usize..70, seed in any::<u64>()) {
        let mut rng = Rng::new(seed ^ 1);
        let ids: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % vocab as u64) as i32).collect();
        let err = run::<f32>(&ids, vocab, hidden, seed);
        prop_assert!(err == 0.0, "ids {ids:?}: max rel error {err}");
    }

    #[test]
    fn bf16_copies_rows(vocab in 1usize..300, hidden in 1usize..700, tokens in 1usize..40, seed in any::<u64>()) {
        let mut rng = Rng::new(seed ^ 2);
        let ids: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % vocab as u64) as i32).collect();
        let err = run::<bf16>(&ids, vocab, hidden, seed);
        prop_assert!(err == 0.0, "ids {ids:?}: max rel error {err}");
    }

    /// Every declared tile shape, launched directly.
    #[test]
    fn any_declared_tiles(config in prop::sample::select(embedding::META.space()), seed in any::<u64>()) {
        let (vocab, hidden, tokens) = (256usize, 77usize, 19usize);
        let mut rng = Rng::new(seed);
        let ids: Vec<i32> = (0..tokens).map(|_| (rng.next_u64() % vocab as u64) as i32).collect();
        let tv = rng.vec(vocab * hidden, 1.0);
        let table = Tensor::<f32>::from_f32(&[vocab, hidden], &tv).unwrap();
        let idt = Tensor::<i32>::from_indices(&[tokens, 1], &ids).unwrap();
        let out = Tensor::<f32>::poisoned(&[tokens, hidden]);
        embedding::launch(&launcher(), &config, &idt, &table, &out).unwrap();
        let err = rel_error(&out.to_vec().unwrap(), &reference::embedding(&ids, &tv, hidden));
        prop_assert!(err == 0.0, "{config}: max rel error {err}");
    }
}

#[test]
fn out_of_vocabulary_ids_are_refused_with_position_and_id() {
    let table = Tensor::<f32>::from_f32(&[10, 4], &[0.5; 40]).unwrap();
    let out = Tensor::<f32>::poisoned(&[4, 4]);
    for (ids, pos, id) in [([1, 2, 10, 3], 2, 10), ([0, -1, 11, 3], 1, -1)] {
        match run_embedding(&launcher(), &ids, &table, &out) {
            Err(SimError::Launch { message, .. }) => {
                assert!(
                    message.contains(&format!("token id {id} at position {pos}"))
                        && message.contains("0..10"),
                    "{message}"
                );
            }
            other => panic!("expected a launch error, got {other:?}"),
        }
    }
    // Nothing was written.
    assert!(out.to_vec().unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn mismatched_output_is_a_launch_error() {
    let table = Tensor::<f32>::from_f32(&[10, 4], &[0.5; 40]).unwrap();
    for shape in [[3usize, 4], [4, 5]] {
        let out = Tensor::<f32>::poisoned(&shape);
        assert!(matches!(
            run_embedding(&launcher(), &[1, 2, 3, 4], &table, &out),
            Err(SimError::Launch { .. })
        ));
    }
}

#[test]
fn registered() {
    let imps = kernels::registry::implementations("embedding");
    assert_eq!(imps.len(), 1);
    assert_eq!(imps[0].meta.name, "embedding");
}
