//! Paged KV-cache append against a host model of the paging (`reference::kv_cache_append`): an
//! exact copy, so tolerance 0 — the whole pool must match, including every row the append must
//! not touch (the pool starts with random contents, which those rows keep).
//!
//! Block tables are scrambled permutations of the pool's pages, as an allocator leaves them;
//! appends start anywhere in a page and straddle page boundaries; widths are ragged.

use accel_sim::formats::fp8::decode_e4m3;
use dsl_core::prelude::*;
use dsl_core::SimError;
use kernels::attention::fp8_kv::{
    quantize_per_token, run_gather_dequant_fp8, run_kv_cache_append_fp8,
    run_kv_cache_append_fp8_slots, Fp8Tensors, E4M3_SUBNORMAL_HALF_STEP, E4M3_UNIT_ROUNDOFF,
};
use kernels::attention::kv_append::{
    append_slots, kv_cache_append, run_kv_cache_append, run_kv_cache_append_slots,
};
use kernels::reference::{self, rel_error};
use kernels::testdata::Rng;
use proptest::prelude::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

/// A random pool of `pages` pages and a scrambled block table over all of them.
fn setup(pages: usize, page_size: usize, width: usize, rng: &mut Rng) -> (Vec<f32>, Vec<usize>) {
    let pool = rng.vec(pages * page_size * width, 1.0);
    let mut table: Vec<usize> = (0..pages).collect();
    for i in (1..pages).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    (pool, table)
}

/// New rows in `S` appended to a pool in `T` (rows in another format convert as they are
/// written: the host model rounds them to `T` once).
fn check<S: Float, T: Float>(
    pages: usize,
    page_size: usize,
    width: usize,
    start: usize,
    n: usize,
    seed: u64,
) -> f64 {
    let mut rng = Rng::new(seed);
    let (pool_v, table) = setup(pages, page_size, width, &mut rng);
    let new_v = rng.vec(n * width, 1.0);
    let pool = Tensor::<T>::from_f32(&[pages, page_size, width], &pool_v).unwrap();
    let new = Tensor::<S>::from_f32(&[n, width], &new_v).unwrap();
    let pool_r = pool.to_vec().unwrap();
    let new_r = Tensor::<T>::from_f32(&[n, width], &new.to_vec().unwrap())
        .unwrap()
        .to_vec()
        .unwrap();
    run_kv_cache_append(&launcher(), &new, &table, &pool, start, page_size).unwrap();
    let want = reference::kv_cache_append(&pool_r, &new_r, width, &table, start, page_size);
    rel_error(&pool.to_vec().unwrap(), &want)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn f32_matches_host_paging(
        page_size in prop::sample::select(vec![1usize, 3, 16, 64]),
        width in 1usize..600,
        pages in 1usize..9,
        a in any::<u64>(),
        b in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let tokens = pages * page_size;
        let start = (a % tokens as u64) as usize;
        let n = 1 + (b % (tokens - start) as u64) as usize;
        let err = check::<f32, f32>(pages, page_size, width, start, n, seed);
        prop_assert!(err == 0.0, "P={page_size} W={width} pages={pages} start={start} n={n}: {err}");
    }

    #[test]
    fn bf16_matches_host_paging(width in 1usize..300, start in 0usize..40, n in 1usize..25, seed in any::<u64>()) {
        let err = check::<bf16, bf16>(5, 16, width, start, n, seed);
        prop_assert!(err == 0.0, "W={width} start={start} n={n}: {err}");
    }

    /// f32 rows into a bf16 pool (native precision's cache): each value rounded to bf16 once,
    /// as the host rounds it.
    #[test]
    fn f32_rows_into_a_bf16_pool_round_once(width in 1usize..300, start in 0usize..40, n in 1usize..25, seed in any::<u64>()) {
        let err = check::<f32, bf16>(5, 16, width, start, n, seed);
        prop_assert!(err == 0.0, "W={width} start={start} n={n}: {err}");
    }

    /// Every declared tile shape, launched directly (decode: one new row; prefill: many).
    #[test]
    fn any_declared_tiles(config in prop::sample::select(kv_cache_append::META.space()), n in prop::sample::select(vec![1usize, 37]), seed in any::<u64>()) {
        let (pages, page_size, width, start) = (6usize, 8usize, 70usize, 5usize);
        let mut rng = Rng::new(seed);
        let (pool_v, table) = setup(pages, page_size, width, &mut rng);
        let new_v = rng.vec(n * width, 1.0);
        let pool = Tensor::<f32>::from_f32(&[pages * page_size, width], &pool_v).unwrap();
        let new = Tensor::<f32>::from_f32(&[n, width], &new_v).unwrap();
        let idx: Vec<i32> = append_slots(&table, start, n, page_size).iter().map(|s| *s as i32).collect();
        let slots = Tensor::<i32>::from_indices(&[n], &idx).unwrap();
        kv_cache_append::launch(&launcher(), &config, &new, &slots, &pool).unwrap();
        let want = reference::kv_cache_append(&pool_v, &new_v, width, &table, start, page_size);
        let err = rel_error(&pool.to_vec().unwrap(), &want);
        prop_assert!(err == 0.0, "{config} n={n}: {err}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A batch's new rows in one launch (a decode step's one row per sequence, or prefill chunks
    /// of several rows), each sequence through its own scrambled pages of one shared pool: the
    /// same pool as appending the sequences one by one on the host.
    #[test]
    fn a_batch_in_one_launch_matches_host_paging(
        seqs in 1usize..6,
        width in 1usize..200,
        rows in prop::collection::vec(1usize..12, 1..6),
        starts in prop::collection::vec(0usize..20, 1..6),
        seed in any::<u64>(),
    ) {
        let (page_size, pages_per_seq) = (8usize, 4usize);
        let mut rng = Rng::new(seed);
        let (pool_v, table) = setup(seqs * pages_per_seq, page_size, width, &mut rng);
        let pool = Tensor::<f32>::from_f32(&[seqs * pages_per_seq * page_size, width], &pool_v).unwrap();
        let mut want: Vec<f64> = pool_v.iter().map(|v| *v as f64).collect();
        let (mut slots, mut new_v) = (Vec::new(), Vec::new());
        for s in 0..seqs {
            let n = rows[s % rows.len()];
            let start = starts[s % starts.len()];
            let pages = &table[s * pages_per_seq..(s + 1) * pages_per_seq];
            let rows_v = rng.vec(n * width, 1.0);
            let cur: Vec<f32> = want.iter().map(|v| *v as f32).collect();
            want = reference::kv_cache_append(&cur, &rows_v, width, pages, start, page_size);
            slots.extend(append_slots(pages, start, n, page_size));
            new_v.extend(rows_v);
        }
        let new = Tensor::<f32>::from_f32(&[slots.len(), width], &new_v).unwrap();
        run_kv_cache_append_slots(&launcher(), &new, &slots, &pool).unwrap();
        let err = rel_error(&pool.to_vec().unwrap(), &want);
        prop_assert!(err == 0.0, "seqs={seqs} W={width}: {err}");
    }
}

#[test]
fn slot_refusals_name_what_does_not_fit() {
    let l = launcher();
    let pool = Tensor::<f32>::poisoned(&[4, 8, 10]);
    let new = Tensor::<f32>::poisoned(&[3, 10]);
    for (slots, words) in [
        (vec![0, 1], "2 slots for 3 new rows"),
        (vec![0, 1, 32], "slot 32 of new row 2 is outside"),
        (vec![5, 1, 5], "two new rows go to pool row 5"),
    ] {
        match run_kv_cache_append_slots(&l, &new, &slots, &pool) {
            Err(SimError::Launch { message, .. }) => assert!(message.contains(words), "{message}"),
            other => panic!("{words}: expected a launch error, got {other:?}"),
        }
    }
}

#[test]
fn refusals_name_what_does_not_fit() {
    let l = launcher();
    let pool = Tensor::<f32>::poisoned(&[4, 8, 10]);
    let new = Tensor::<f32>::poisoned(&[5, 10]);
    // (block table, start, page size, words the message must hold)
    let cases: Vec<(Vec<usize>, usize, usize, &str)> = vec![
        (vec![0, 1], 12, 8, "need 3 pages"),
        (vec![0, 1, 7], 12, 8, "entry 2 is page 7"),
        (vec![0, 1, 2], 12, 0, "page size 0"),
        (vec![0, 1, 2], 12, 5, "page size 5"),
    ];
    for (table, start, page, words) in cases {
        match run_kv_cache_append(&l, &new, &table, &pool, start, page) {
            Err(SimError::Launch { message, .. }) => assert!(message.contains(words), "{message}"),
            other => panic!("{words}: expected a launch error, got {other:?}"),
        }
    }
    let wide = Tensor::<f32>::poisoned(&[5, 11]);
    match run_kv_cache_append(&l, &wide, &[0, 1, 2], &pool, 0, 8) {
        Err(SimError::Launch { message, .. }) => assert!(message.contains("11 wide"), "{message}"),
        other => panic!("expected a launch error, got {other:?}"),
    }
}

#[test]
fn cost_only_cycles_equal_functional() {
    let (pages, page_size, width) = (4usize, 16usize, 96usize);
    let mut rng = Rng::new(8);
    let (pool_v, table) = setup(pages, page_size, width, &mut rng);
    let pool = Tensor::<f32>::from_f32(&[pages * page_size, width], &pool_v).unwrap();
    let new = Tensor::<f32>::from_f32(&[20, width], &rng.vec(20 * width, 1.0)).unwrap();
    let f = run_kv_cache_append(&launcher(), &new, &table, &pool, 9, page_size).unwrap();
    let c = run_kv_cache_append(
        &launcher().with_backend(Backend::CostOnly),
        &Tensor::<f32>::shape_only(&[20, width]),
        &table,
        &Tensor::<f32>::shape_only(&[pages * page_size, width]),
        9,
        page_size,
    )
    .unwrap();
    assert!(f.report.cycles > 0);
    assert_eq!(f.report.cycles, c.report.cycles);
}

#[test]
fn registered() {
    let imps = kernels::registry::implementations("kv_cache_append");
    assert_eq!(imps.len(), 1);
    assert_eq!(imps[0].meta.name, "kv_cache_append");
}

/// Appends `n` rows (magnitudes spread over `2^log_range`, one head of one row all zero) at
/// `start` into a poisoned FP8 pool and checks, per appended (token, head): the codes and the
/// scale equal the host quantiser's on that row (the same f32 arithmetic, so exactly); the
/// dequantised values are within E4M3's bound of the f64 inputs. Every code and scale the append
/// must not touch still reads NaN.
#[allow(clippy::too_many_arguments)]
fn check_fp8<S: Float>(
    pages: usize,
    page_size: usize,
    heads: usize,
    dim: usize,
    start: usize,
    n: usize,
    log_range: f32,
    seed: u64,
) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let (_, table) = setup(pages, page_size, 1, &mut rng);
    let width = heads * dim;
    let mut vals: Vec<f32> = (0..n * width)
        .map(|_| rng.uniform().signum() * (-log_range * rng.uniform().abs()).exp2())
        .collect();
    vals[..dim].iter_mut().for_each(|v| *v = 0.0);
    let new = Tensor::<S>::from_f32(&[n, width], &vals).unwrap();
    let rounded = new.to_vec().unwrap();
    let pool = Fp8Tensors::empty(pages, page_size, heads, dim, false);
    run_kv_cache_append_fp8(&launcher(), &new, &table, &pool, start).map_err(|e| e.to_string())?;
    let (codes, scales) = (pool.codes.to_vec().unwrap(), pool.scales.to_vec().unwrap());
    let mut written = vec![false; pages * page_size];
    for (i, row) in rounded.chunks_exact(width).enumerate() {
        let pos = start + i;
        let (page, slot) = (table[pos / page_size], pos % page_size);
        written[page * page_size + slot] = true;
        let want = quantize_per_token(row, 1, heads, dim)?;
        for h in 0..heads {
            let got_scale = scales[(page * heads + h) * page_size + slot];
            if got_scale.to_bits() != want.scales[h].to_bits() {
                return Err(format!(
                    "token {pos} head {h}: scale {got_scale} != {}",
                    want.scales[h]
                ));
            }
            for d in 0..dim {
                let got = codes[(page * page_size + slot) * width + h * dim + d];
                let code = decode_e4m3(want.codes[h * dim + d]);
                if got.to_bits() != code.to_bits() {
                    return Err(format!(
                        "token {pos} head {h} value {d}: code {got} != {code}"
                    ));
                }
                let x = row[h * dim + d] as f64;
                let bound =
                    E4M3_UNIT_ROUNDOFF * x.abs() + E4M3_SUBNORMAL_HALF_STEP * got_scale as f64;
                let deq = got as f64 * got_scale as f64;
                if (deq - x).abs() > bound * (1.0 + 1e-6) {
                    return Err(format!(
                        "token {pos} head {h} value {d}: {x} -> {deq} (bound {bound})"
                    ));
                }
            }
        }
    }
    for (r, w) in written.iter().enumerate() {
        let (page, slot) = (r / page_size, r % page_size);
        let untouched = codes[r * width..][..width].iter().all(|c| c.is_nan())
            && (0..heads).all(|h| scales[(page * heads + h) * page_size + slot].is_nan());
        if !*w && !untouched {
            return Err(format!(
                "pool row {r} (page {page}, slot {slot}) was not appended but changed"
            ));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// The FP8 cache's writer (`kv_cache_append_fp8`) quantises as the host quantiser the FP8
    /// decode tests use, straddling pages of a scrambled block table.
    #[test]
    fn fp8_append_quantises_per_token_and_head(
        page_size in prop::sample::select(vec![1usize, 4, 16]),
        heads in 1usize..4,
        dim in prop::sample::select(vec![7usize, 64, 576]),
        pages in 1usize..6,
        a in any::<u64>(),
        b in any::<u64>(),
        log_range in 0.0f32..12.0,
        seed in any::<u64>(),
    ) {
        let tokens = pages * page_size;
        let start = (a % tokens as u64) as usize;
        let n = 1 + (b % (tokens - start) as u64) as usize;
        let r = check_fp8::<f32>(pages, page_size, heads, dim, start, n, log_range, seed);
        prop_assert!(r.is_ok(), "P={page_size} heads={heads} dim={dim} start={start} n={n}: {r:?}");
        let r = check_fp8::<bf16>(pages, page_size, heads, dim, start, n, log_range, seed);
        prop_assert!(r.is_ok(), "bf16 rows: {r:?}");
    }
}

#[test]
fn fp8_append_misuse_is_an_error() {
    let pool = Fp8Tensors::empty(2, 4, 2, 8, false);
    let wide = Tensor::<f32>::from_f32(&[1, 17], &[1.0; 17]).unwrap();
    let err = run_kv_cache_append_fp8(&launcher(), &wide, &[0, 1], &pool, 0).unwrap_err();
    assert!(err.to_string().contains("17 wide"), "{err}");
    let rows = Tensor::<f32>::from_f32(&[3, 16], &[1.0; 48]).unwrap();
    let err = run_kv_cache_append_fp8(&launcher(), &rows, &[0], &pool, 2).unwrap_err();
    assert!(err.to_string().contains("block table"), "{err}");
    let err = run_kv_cache_append_fp8(&launcher(), &rows, &[0, 5], &pool, 2).unwrap_err();
    assert!(err.to_string().contains("outside the pool"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// A batch's rows appended to an FP8 pool through their slots (the pool viewed `[pages·P,
    /// W]`, as the model keeps it): each slot holds its row quantised as the host quantiser does;
    /// then gathered back in another order with `gather_dequant_fp8`: each gathered row is
    /// exactly the host's dequantisation of its slot (codes × scale in f32), every output element written, and the gather costs the
    /// same cycles cost-only.
    #[test]
    fn fp8_slot_append_then_gather_dequantises_each_row(
        page_size in prop::sample::select(vec![1usize, 4, 16]),
        heads in 1usize..3,
        dim in prop::sample::select(vec![7usize, 64, 576]),
        pages in 1usize..6,
        seed in any::<u64>(),
    ) {
        let mut rng = Rng::new(seed);
        let width = heads * dim;
        let total = pages * page_size;
        // A scrambled set of slots: some of the pool's rows, in random order.
        let mut slots: Vec<usize> = (0..total).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        slots.truncate(1 + (rng.next_u64() % total as u64) as usize);
        let vals: Vec<f32> = (0..slots.len() * width).map(|_| 3.0 * rng.uniform()).collect();
        let new = Tensor::<f32>::from_f32(&[slots.len(), width], &vals).unwrap();
        let pool = Fp8Tensors::empty(pages, page_size, heads, dim, false)
            .reshaped(&[total, width])
            .unwrap();
        run_kv_cache_append_fp8_slots(&launcher(), &new, &slots, &pool).unwrap();
        let deq = pool.dequantized();
        // Each slot holds its own row, quantised as the host quantiser does.
        for (i, slot) in slots.iter().enumerate() {
            let q = quantize_per_token(&vals[i * width..(i + 1) * width], 1, heads, dim).unwrap();
            for c in 0..width {
                let want = decode_e4m3(q.codes[c]) * q.scales[c / dim];
                let got = deq[slot * width + c];
                prop_assert!(got.to_bits() == want.to_bits(), "slot {slot} col {c}: {got} != {want}");
            }
        }
        let mut back = slots.clone();
        back.reverse();
        let out = Tensor::<f32>::poisoned(&[back.len(), width]);
        let run = run_gather_dequant_fp8(&launcher(), &pool, &back, &out).unwrap();
        let got = out.to_vec().unwrap();
        prop_assert!(got.iter().all(|v| v.is_finite()), "an output element was not written");
        for (i, slot) in back.iter().enumerate() {
            for c in 0..width {
                let (g, w) = (got[i * width + c], deq[slot * width + c]);
                prop_assert!(g.to_bits() == w.to_bits(), "row {i} (slot {slot}) col {c}: {g} != {w}");
            }
        }
        let cost_out = Tensor::<f32>::shape_only(&[back.len(), width]);
        let cost_pool = Fp8Tensors::empty(pages, page_size, heads, dim, true);
        let cost = run_gather_dequant_fp8(
            &launcher().with_backend(Backend::CostOnly), &cost_pool, &back, &cost_out,
        ).unwrap();
        prop_assert_eq!(cost.report.cycles, run.report.cycles);
    }
}

#[test]
fn fp8_gather_misuse_is_an_error() {
    let pool = Fp8Tensors::empty(2, 4, 1, 8, false);
    let out = Tensor::<f32>::poisoned(&[2, 8]);
    let err = run_gather_dequant_fp8(&launcher(), &pool, &[0, 8], &out).unwrap_err();
    assert!(err.to_string().contains("outside the pool"), "{err}");
    let err = run_gather_dequant_fp8(&launcher(), &pool, &[0], &out).unwrap_err();
    assert!(err.to_string().contains("must be [1 rows"), "{err}");
    let rows = Tensor::<f32>::from_f32(&[1, 8], &[1.0; 8]).unwrap();
    let err = run_kv_cache_append_fp8_slots(&launcher(), &rows, &[3, 3], &pool).unwrap_err();
    assert!(err.to_string().contains("2 slots for 1 new rows"), "{err}");
}
