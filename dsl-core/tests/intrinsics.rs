//! Every intrinsic of `dsl_core::intrinsics` tested on its own, outside any kernel: each is called
//! on a standalone program context ([`Ctx::standalone`]) and checked for
//! - its values: against a plain f64 (or exact) model, on random non-zero inputs (proptest), on
//!   ragged edges and at the exact boundaries of masks, with outputs poisoned (NaN) beforehand;
//! - the instruction it records: engine, bytes moved, blocking or not, vector class, FLOP.
//!
//! Tolerances: data movement, masks, selections and fills are exact; f32 arithmetic is compared
//! with f64 to 1e-6 relative (+1e-6 absolute), transcendental functions to 1e-5, matrix products
//! to 1e-5 of the sum of |terms|.

// Tables of (intrinsic, f64 model) pairs read best as tuples, and the element loops compare
// several buffers at one index.
#![allow(clippy::type_complexity, clippy::needless_range_loop)]

use dsl_core::accel_sim::isa::{Engine, Op, VectorClass};
use dsl_core::accel_sim::program::{Event, Instr};
use dsl_core::intrinsics::*;
use dsl_core::{bf16, Ctx, SimError, Tensor, Tile};
use proptest::prelude::*;

/// A functional program context with hazard checks (bounds, unwritten tiles).
fn ctx() -> Ctx {
    Ctx::standalone("intrinsic_test", true, false)
}

/// The instructions a context recorded (allocations left out).
fn instrs(c: Ctx) -> Vec<Instr> {
    c.finish()
        .expect("no error")
        .events()
        .filter_map(|e| match e {
            Event::Exec(i) => Some(i),
            Event::Alloc { .. } => None,
        })
        .collect()
}

/// Random values in ±[0.25, 1.25): never zero, so a missing term or a zero fill shows.
fn nonzero(n: usize) -> impl Strategy<Value = Vec<f32>> {
    prop::collection::vec((0.25f32..1.25, any::<bool>()), n)
        .prop_map(|v| v.into_iter().map(|(x, s)| if s { -x } else { x }).collect())
}

fn tensor(rows: usize, cols: usize, v: &[f32]) -> Tensor<f32> {
    Tensor::from_f32(&[rows, cols], v).unwrap()
}

/// A tile holding `v` (row-major `R×C`), loaded from a tensor of exactly its shape.
fn tile<const R: usize, const C: usize>(c: &mut Ctx, v: &[f32]) -> Tile<f32, R, C> {
    load::<R, C, f32>(c, &tensor(R, C, v), 0, 0)
}

fn close(got: f32, want: f64, rel: f64) -> bool {
    (got as f64 - want).abs() <= rel * want.abs() + 1e-6
}

fn vector_of(i: &Instr) -> (u64, VectorClass, u64) {
    match &i.op {
        Op::Vector {
            elems,
            class,
            useful,
            ..
        } => (*elems, *class, *useful),
        other => panic!("expected a vector instruction, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// program_id, num_programs, require, cdiv

#[test]
fn grid_queries_and_require_refuse_bad_axes_with_the_line() {
    let mut c = ctx();
    assert_eq!(program_id(&mut c, 0), 0);
    assert_eq!(num_programs(&mut c, 2), 1);
    assert!(c.error().is_none());
    c.at(41);
    assert_eq!(program_id(&mut c, 3), 0);
    let Err(SimError::Kernel { line, message, .. }) = c.finish() else {
        panic!("axis 3 must fail");
    };
    assert_eq!(line, 41);
    assert!(message.contains("axis 3"), "{message}");
    let mut c = ctx();
    assert_eq!(num_programs(c.at(7), 5), 1);
    assert!(c.error().is_some());
    let mut c = ctx();
    require(c.at(3), true, "fine");
    assert!(c.error().is_none());
    require(c.at(9), false, "d <= BD");
    let Err(SimError::Kernel { line, message, .. }) = c.finish() else {
        panic!("require(false) must fail");
    };
    assert_eq!(line, 9);
    assert!(message.contains("d <= BD"), "{message}");
    assert_eq!(
        (cdiv(0, 8), cdiv(1, 8), cdiv(8, 8), cdiv(9, 8)),
        (0, 1, 1, 2)
    );
}

// ---------------------------------------------------------------------------------------------
// Loads

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `load`/`load_async`/`load_or`/`load_async_or` of an 8×8 window anywhere around a ragged
    /// tensor: in-bounds elements copied, the rest the fill, bytes = in-bounds elements × 4,
    /// DMA-in, blocking only for the plain forms, the window recorded for the cache model.
    #[test]
    fn loads_copy_the_in_bounds_window_and_fill_the_rest(
        (rows, cols, v) in (1usize..20, 1usize..20).prop_flat_map(|(r, c)| (Just(r), Just(c), nonzero(r * c))),
        row in 0usize..24,
        col in 0usize..24,
        fill in -3.0f32..3.0,
    ) {
        let t = tensor(rows, cols, &v);
        let mut c = ctx();
        let tiles = [
            load::<8, 8, f32>(&mut c, &t, row, col),
            load_async::<8, 8, f32>(&mut c, &t, row, col),
            load_or::<8, 8, f32>(&mut c, &t, row, col, fill),
            load_async_or::<8, 8, f32>(&mut c, &t, row, col, fill),
        ];
        let fills = [0.0, 0.0, fill, fill];
        for (tile, f) in tiles.iter().zip(fills) {
            let got = tile.values().unwrap();
            for r in 0..8 {
                for k in 0..8 {
                    let want = if row + r < rows && col + k < cols { v[(row + r) * cols + col + k] } else { f };
                    prop_assert_eq!(got[r * 8 + k], want, "element [{}, {}]", r, k);
                }
            }
        }
        let (vr, vc) = (rows.saturating_sub(row).min(8), cols.saturating_sub(col).min(8));
        let ins = instrs(c);
        prop_assert_eq!(ins.len(), 4);
        for (i, blocking) in ins.iter().zip([true, false, true, false]) {
            prop_assert_eq!(i.op.engine(), Some(Engine::DmaIn));
            prop_assert_eq!(i.blocking, blocking);
            prop_assert_eq!(i.n_reads, 0);
            prop_assert!(i.write.is_some());
            let Op::Load { bytes, region } = &i.op else { panic!("not a load") };
            prop_assert_eq!(*bytes, 4 * (vr * vc) as u64);
            prop_assert_eq!((region.tensor, region.rows, region.cols), (t.id(), vr as u64, vc as u64));
            prop_assert_eq!(region.offset, (row * cols + col) as u64);
        }
    }

    /// Loads through views read only the view: a column window (`cols_clipped`) of a wider
    /// tensor zero-fills past its last column instead of reading the next head; a row window
    /// (`rows_clipped`) stops at its last row; `at` picks one matrix of a stack.
    #[test]
    fn loads_through_views_stay_inside_the_view(
        v in nonzero(6 * 10),
        start in 0usize..10,
        width in 0usize..10,
        r0 in 0usize..6,
        r1 in 0usize..6,
    ) {
        let t = tensor(6, 10, &v);
        let mut c = ctx();
        let head = t.cols_clipped(start, width);
        let w = width.min(10 - start);
        let got = load::<8, 8, f32>(&mut c, &head, 0, 0);
        for r in 0..8 {
            for k in 0..8 {
                let want = if r < 6 && k < w { v[r * 10 + start + k] } else { 0.0 };
                prop_assert_eq!(got.values().unwrap()[r * 8 + k], want);
            }
        }
        let rows = t.rows_clipped(r0, r1);
        let n = r1.clamp(r0, 6) - r0;
        let got = load::<8, 16, f32>(&mut c, &rows, 0, 0);
        for r in 0..8 {
            for k in 0..16 {
                let want = if r < n && k < 10 { v[(r0 + r) * 10 + k] } else { 0.0 };
                prop_assert_eq!(got.values().unwrap()[r * 16 + k], want);
            }
        }
        let stack = Tensor::<f32>::from_f32(&[3, 2, 10], &v).unwrap();
        let got = load::<2, 10, f32>(&mut c, &stack.at(r0 % 3), 0, 0);
        prop_assert_eq!(got.values().unwrap(), &v[(r0 % 3) * 20..(r0 % 3) * 20 + 20]);
        prop_assert!(c.finish().is_ok());
    }
}

#[test]
fn loads_round_to_the_element_type() {
    let v = [1.0f32 + 1.0 / 512.0, -3.0 + 1.0 / 64.0];
    let t = Tensor::<bf16>::from_f32(&[1, 2], &v).unwrap();
    let mut c = ctx();
    let got = load::<1, 2, bf16>(&mut c, &t, 0, 0);
    let want: Vec<f32> = v
        .iter()
        .map(|x| half::bf16::from_f32(*x).to_f32())
        .collect();
    assert_eq!(got.values().unwrap(), &want[..]);
    let ins = instrs(c);
    let Op::Load { bytes, .. } = ins[0].op else {
        panic!()
    };
    assert_eq!(bytes, 4, "two bf16 elements are 4 bytes");
}

#[test]
fn load_into_replaces_an_existing_tile_and_writes_its_buffer() {
    let a: Vec<f32> = (0..16).map(|i| i as f32 + 0.5).collect();
    let t = tensor(4, 4, &a);
    let mut c = ctx();
    let mut tl = empty::<f32, 4, 4>(&mut c);
    assert!(tl.values().unwrap().iter().all(|x| x.is_nan()));
    load_into(&mut c, &mut tl, &t, 2, 1);
    let v = tl.values().unwrap();
    assert_eq!(&v[0..4], &[9.5, 10.5, 11.5, 0.0]);
    assert_eq!(&v[8..16], &[0.0; 8]);
    let ins = instrs(c);
    assert_eq!(ins.len(), 1, "`empty` issues nothing, `load_into` one load");
    assert!(ins[0].blocking);
    assert_eq!(
        ins[0].write,
        Some(0),
        "the load writes the empty tile's own buffer"
    );
    let Op::Load { bytes, .. } = ins[0].op else {
        panic!()
    };
    assert_eq!(bytes, 4 * 2 * 3);
}

#[test]
fn empty_tiles_are_hazards_when_read_before_written() {
    let mut c = ctx();
    let a = tile::<2, 2>(&mut c, &[1.0, 2.0, 3.0, 4.0]);
    let e = empty::<f32, 2, 2>(c.at(10));
    let _ = add(c.at(12), &a, &e);
    let Err(SimError::Kernel { line, message, .. }) = c.finish() else {
        panic!("reading an empty tile must fail");
    };
    assert_eq!(line, 12);
    assert!(message.contains("`empty` at line 10"), "{message}");
}

// ---------------------------------------------------------------------------------------------
// Stores

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `store` writes exactly the in-bounds part of its window into a poisoned tensor, and
    /// nothing else; DMA-out, non-blocking, bytes = in-bounds elements × 4.
    #[test]
    fn stores_write_exactly_the_in_bounds_window(
        (rows, cols) in (1usize..20, 1usize..20),
        v in nonzero(64),
        row_frac in 0.0f64..1.0,
        col_frac in 0.0f64..1.0,
    ) {
        let (row, col) = ((row_frac * rows as f64) as usize, (col_frac * cols as f64) as usize);
        let dst = Tensor::<f32>::poisoned(&[rows, cols]);
        let mut c = ctx();
        let t = tile::<8, 8>(&mut c, &v);
        store(&mut c, &dst, row, col, &t);
        let out = dst.to_vec().unwrap();
        for r in 0..rows {
            for k in 0..cols {
                let inside = r >= row && r < row + 8 && k >= col && k < col + 8;
                let got = out[r * cols + k];
                if inside {
                    prop_assert_eq!(got, v[(r - row) * 8 + k - col]);
                } else {
                    prop_assert!(got.is_nan(), "[{}, {}] written outside the window", r, k);
                }
            }
        }
        let ins = instrs(c);
        let st = &ins[1];
        prop_assert_eq!(st.op.engine(), Some(Engine::DmaOut));
        prop_assert!(!st.blocking);
        prop_assert_eq!(st.reads(), &[ins[0].write.unwrap()][..]);
        let (vr, vc) = ((rows - row).min(8), (cols - col).min(8));
        prop_assert_eq!(&st.op, &Op::Store { bytes: 4 * (vr * vc) as u64 });
    }
}

#[test]
fn a_store_through_a_column_view_leaves_the_neighbouring_columns_alone() {
    let dst = Tensor::<f32>::poisoned(&[3, 12]);
    let mut c = ctx();
    let t = tile::<4, 8>(&mut c, &[2.5; 32]);
    store(&mut c, &dst.cols_clipped(4, 5), 0, 0, &t);
    let out = dst.to_vec().unwrap();
    for r in 0..3 {
        for k in 0..12 {
            assert_eq!(out[r * 12 + k].is_nan(), !(4..9).contains(&k), "[{r}, {k}]");
        }
    }
    assert!(c.finish().is_ok());
}

#[test]
fn a_store_starting_outside_a_tensor_is_a_hazard_but_not_outside_a_clipped_view() {
    let dst = Tensor::<f32>::poisoned(&[4, 4]);
    let mut c = ctx();
    let t = tile::<2, 2>(&mut c, &[1.0; 4]);
    store(c.at(5), &dst.rows_clipped(4, 4), 0, 0, &t);
    assert!(c.error().is_none(), "an empty clipped view is by design");
    store(c.at(6), &dst, 0, 4, &t);
    let Err(SimError::Kernel { line, message, .. }) = c.finish() else {
        panic!("a store past the last column must fail");
    };
    assert_eq!(line, 6);
    assert!(message.contains("[0, 4]"), "{message}");
    assert!(dst.to_vec().unwrap().iter().all(|x| x.is_nan()));
}

#[test]
fn check_finite_stores_name_the_first_non_finite_element() {
    let dst = Tensor::<f32>::poisoned(&[2, 4]);
    let mut c = Ctx::standalone("finite", true, true);
    let t = tile::<2, 4>(
        &mut c,
        &[1.0, 2.0, 3.0, 4.0, 5.0, f32::INFINITY, f32::NAN, 8.0],
    );
    store(c.at(3), &dst, 0, 0, &t);
    let Err(SimError::Kernel { line, message, .. }) = c.finish() else {
        panic!("an infinite store must fail with check_finite");
    };
    assert_eq!(line, 3);
    assert!(
        message.contains("[1, 1]") && message.contains("inf"),
        "{message}"
    );
}

// ---------------------------------------------------------------------------------------------
// Fills

#[test]
fn fills_hold_their_value_rounded_and_compute_nothing() {
    let mut c = ctx();
    let z = zeros::<f32, 3, 5>(&mut c);
    let f = full::<bf16, 2, 2>(&mut c, 1.0 + 1.0 / 512.0);
    let i = eye::<f32, 3>(&mut c);
    assert_eq!(z.values().unwrap(), &[0.0; 15]);
    assert_eq!(f.values().unwrap(), &[1.0; 4], "rounded to bf16");
    assert_eq!(
        i.values().unwrap(),
        &[1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    );
    let ins = instrs(c);
    assert_eq!(ins.len(), 3);
    for (k, elems) in ins.iter().zip([15, 4, 9]) {
        assert_eq!(k.op.engine(), Some(Engine::Vector));
        assert!(!k.blocking);
        let (e, class, _) = vector_of(k);
        assert_eq!((e, class), (elems, VectorClass::Simple));
    }
    assert_eq!(vector_of(&ins[0]).2, 0, "a zero fill is no useful work");
    assert_eq!(vector_of(&ins[1]).2, 0);
}

// ---------------------------------------------------------------------------------------------
// Matrix products

fn matmul_ref(
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
    a_t: bool,
    b_t: bool,
) -> Vec<(f64, f64)> {
    let at = |i: usize, p: usize| if a_t { a[p * m + i] } else { a[i * k + p] } as f64;
    let bt = |p: usize, j: usize| if b_t { b[j * k + p] } else { b[p * n + j] } as f64;
    let mut out = Vec::new();
    for i in 0..m {
        for j in 0..n {
            let terms: Vec<f64> = (0..k).map(|p| at(i, p) * bt(p, j)).collect();
            out.push((terms.iter().sum(), terms.iter().map(|t| t.abs()).sum()));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// `mma`, `mma_bt` and `mma_at` accumulate onto what the accumulator holds; the instruction is
    /// on the matrix unit with the tile shapes and the useful FLOP of the operands' valid data.
    #[test]
    fn matrix_products_accumulate_and_count_useful_flop(
        a in nonzero(4 * 8),
        b in nonzero(8 * 6),
        init in nonzero(4 * 6),
        rows in 1usize..=4,
    ) {
        let mut c = ctx();
        let ta = tile::<4, 8>(&mut c, &a);
        let tb = tile::<8, 6>(&mut c, &b);
        let tbt = tile::<6, 8>(&mut c, &{
            let mut t = vec![0.0; 48];
            for p in 0..8 { for j in 0..6 { t[j * 8 + p] = b[p * 6 + j]; } }
            t
        });
        let tat = tile::<8, 4>(&mut c, &{
            let mut t = vec![0.0; 32];
            for i in 0..4 { for p in 0..8 { t[p * 4 + i] = a[i * 8 + p]; } }
            t
        });
        let want = matmul_ref(&a, &b, 4, 6, 8, false, false);
        let mut accs = [tile::<4, 6>(&mut c, &init), tile::<4, 6>(&mut c, &init), tile::<4, 6>(&mut c, &init)];
        mma(&mut c, &mut accs[0], &ta, &tb);
        mma_bt(&mut c, &mut accs[1], &ta, &tbt);
        mma_at(&mut c, &mut accs[2], &tat, &tb);
        for acc in &accs {
            for (i, (s, mag)) in want.iter().enumerate() {
                let w = s + init[i] as f64;
                prop_assert!((acc.values().unwrap()[i] as f64 - w).abs() <= 1e-5 * (mag + init[i].abs() as f64) + 1e-6);
            }
        }
        // A ragged A (only `rows` rows inside the tensor): useful FLOP counts them only.
        let ragged = load::<4, 8, f32>(&mut c, &tensor(rows, 8, &a[..rows * 8]), 0, 0);
        let mut z = zeros::<f32, 4, 6>(&mut c);
        mma(&mut c, &mut z, &ragged, &tb);
        let ins = instrs(c);
        let mmas: Vec<&Instr> = ins.iter().filter(|i| i.op.engine() == Some(Engine::Matrix)).collect();
        prop_assert_eq!(mmas.len(), 4);
        for m in &mmas {
            prop_assert!(!m.blocking);
            prop_assert_eq!(m.reads().len(), 3, "A, B and the accumulator");
            prop_assert_eq!(Some(m.reads()[2]), m.write);
        }
        let Op::Mma { m, n, k, useful, .. } = mmas[0].op else { panic!() };
        prop_assert_eq!((m, n, k, useful), (4, 6, 8, 2 * 4 * 6 * 8));
        let Op::Mma { useful, .. } = mmas[3].op else { panic!() };
        prop_assert_eq!(useful, 2 * rows as u64 * 6 * 8);
    }
}

// ---------------------------------------------------------------------------------------------
// Element-wise

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Unary functions against f64, each one vector pass over the tile of the right class.
    #[test]
    fn unary_functions_match_f64(v in nonzero(2 * 8)) {
        type U = fn(&mut Ctx, &Tile<f32, 2, 8>) -> Tile<f32, 2, 8>;
        let cases: [(U, fn(f64) -> f64, bool, f64); 12] = [
            (exp, f64::exp, true, 1e-5),
            (ln, |x| x.ln(), true, 1e-5),
            (sqrt, |x| x.sqrt(), true, 1e-5),
            (rsqrt, |x| 1.0 / x.sqrt(), true, 1e-5),
            (recip, |x| 1.0 / x, true, 1e-6),
            (neg, |x| -x, false, 0.0),
            (abs, f64::abs, false, 0.0),
            (square, |x| x * x, false, 1e-6),
            (relu, |x| x.max(0.0), false, 0.0),
            (sigmoid, |x| 1.0 / (1.0 + (-x).exp()), true, 1e-5),
            (silu, |x| x / (1.0 + (-x).exp()), true, 1e-5),
            (softplus, |x| (1.0 + x.exp()).ln(), true, 1e-5),
        ];
        for (k, (f, reference, transcendental, tol)) in cases.iter().enumerate() {
            let mut c = ctx();
            // ln, sqrt and rsqrt take the magnitudes (their domain).
            let input: Vec<f32> = if (1..=3).contains(&k) { v.iter().map(|x| x.abs()).collect() } else { v.clone() };
            let t = tile::<2, 8>(&mut c, &input);
            let out = f(&mut c, &t);
            for (x, y) in input.iter().zip(out.values().unwrap()) {
                prop_assert!(close(*y, reference(*x as f64), *tol), "case {}: f({}) = {}", k, x, y);
            }
            let ins = instrs(c);
            let (elems, class, useful) = vector_of(&ins[1]);
            let want = if *transcendental { VectorClass::Transcendental } else { VectorClass::Simple };
            prop_assert_eq!((elems, class, useful), (16, want, 16), "case {}", k);
            prop_assert_eq!(ins[1].reads(), &[ins[0].write.unwrap()][..]);
        }
    }

    /// Binary, scalar and broadcast operations against f64.
    #[test]
    fn binary_scalar_and_broadcast_operations_match_f64(
        a in nonzero(3 * 4),
        b in nonzero(3 * 4),
        col in nonzero(3),
        row in nonzero(4),
        s in 0.25f32..4.0,
    ) {
        let mut c = ctx();
        let (ta, tb) = (tile::<3, 4>(&mut c, &a), tile::<3, 4>(&mut c, &b));
        let tc = tile::<3, 1>(&mut c, &col);
        let tr = tile::<1, 4>(&mut c, &row);
        type B = fn(&mut Ctx, &Tile<f32, 3, 4>, &Tile<f32, 3, 4>) -> Tile<f32, 3, 4>;
        let bins: [(B, fn(f64, f64) -> f64); 6] = [
            (add, |x, y| x + y), (sub, |x, y| x - y), (mul, |x, y| x * y),
            (div, |x, y| x / y), (maximum, f64::max), (minimum, f64::min),
        ];
        for (f, r) in bins {
            let out = f(&mut c, &ta, &tb);
            for i in 0..12 {
                prop_assert!(close(out.values().unwrap()[i], r(a[i] as f64, b[i] as f64), 1e-6));
            }
        }
        let sc = scale(&mut c, &ta, s);
        let ad = add_scalar(&mut c, &ta, s);
        for i in 0..12 {
            prop_assert!(close(sc.values().unwrap()[i], a[i] as f64 * s as f64, 1e-6));
            prop_assert!(close(ad.values().unwrap()[i], a[i] as f64 + s as f64, 1e-6));
        }
        type Cb = fn(&mut Ctx, &Tile<f32, 3, 4>, &Tile<f32, 3, 1>) -> Tile<f32, 3, 4>;
        type Rb = fn(&mut Ctx, &Tile<f32, 3, 4>, &Tile<f32, 1, 4>) -> Tile<f32, 3, 4>;
        let ops: [fn(f64, f64) -> f64; 4] = [|x, y| x + y, |x, y| x - y, |x, y| x * y, |x, y| x / y];
        let cols: [Cb; 4] = [add_col, sub_col, mul_col, div_col];
        let rows: [Rb; 4] = [add_row, sub_row, mul_row, div_row];
        for k in 0..4 {
            let oc = cols[k](&mut c, &ta, &tc);
            let or = rows[k](&mut c, &ta, &tr);
            for i in 0..12 {
                let (r, j) = (i / 4, i % 4);
                prop_assert!(close(oc.values().unwrap()[i], ops[k](a[i] as f64, col[r] as f64), 1e-6), "col op {}", k);
                prop_assert!(close(or.values().unwrap()[i], ops[k](a[i] as f64, row[j] as f64), 1e-6), "row op {}", k);
            }
        }
        let ins = instrs(c);
        // 4 loads, 6 binary, 2 scalar, 8 broadcast: all simple vector passes over 12 elements.
        prop_assert_eq!(ins.len(), 4 + 6 + 2 + 8);
        for i in &ins[4..] {
            prop_assert_eq!(vector_of(i).0, 12);
            prop_assert_eq!(vector_of(i).1, VectorClass::Simple);
        }
    }

    /// Row and column reductions against f64; one reduction-class pass over the tile.
    #[test]
    fn reductions_match_f64(v in nonzero(3 * 5)) {
        let mut c = ctx();
        let t = tile::<3, 5>(&mut c, &v);
        let (rs, rm) = (row_sum(&mut c, &t), row_max(&mut c, &t));
        let (cs, cm) = (col_sum(&mut c, &t), col_max(&mut c, &t));
        for r in 0..3 {
            let row = &v[r * 5..r * 5 + 5];
            prop_assert!(close(rs.values().unwrap()[r], row.iter().map(|x| *x as f64).sum(), 1e-6));
            prop_assert_eq!(rm.values().unwrap()[r], row.iter().copied().fold(f32::MIN, f32::max));
        }
        for k in 0..5 {
            let col: Vec<f32> = (0..3).map(|r| v[r * 5 + k]).collect();
            prop_assert!(close(cs.values().unwrap()[k], col.iter().map(|x| *x as f64).sum(), 1e-6));
            prop_assert_eq!(cm.values().unwrap()[k], col.iter().copied().fold(f32::MIN, f32::max));
        }
        for i in &instrs(c)[1..] {
            prop_assert_eq!((vector_of(i).0, vector_of(i).1), (15, VectorClass::Reduction));
        }
    }
}

#[test]
fn cast_rounds_to_nearest_even_and_costs_the_wider_type() {
    let v = [
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
        -2.0 - 1.0 / 128.0,
        1.0e-3,
    ];
    let mut c = ctx();
    let t = tile::<1, 4>(&mut c, &v);
    let h = cast::<bf16, f32, 1, 4>(&mut c, &t);
    let want: Vec<f32> = v
        .iter()
        .map(|x| half::bf16::from_f32(*x).to_f32())
        .collect();
    assert_eq!(h.values().unwrap(), &want[..]);
    assert_eq!(want[0], 1.0, "ties go to even");
    let back = cast::<f32, bf16, 1, 4>(&mut c, &h);
    assert_eq!(back.values().unwrap(), &want[..]);
    let ins = instrs(c);
    for i in &ins[1..] {
        let Op::Vector { elems, dtype, .. } = i.op else {
            panic!()
        };
        assert_eq!((elems, dtype), (4, dsl_core::accel_sim::DType::F32));
    }
}

// ---------------------------------------------------------------------------------------------
// Masks

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `mask_keys` masks exactly the keys at or past `kv_len` and, when causal, exactly the keys
    /// after the query: an off-by-one at either boundary fails here.
    #[test]
    fn mask_keys_masks_exactly_the_keys_past_the_context_and_after_the_query(
        v in nonzero(4 * 8),
        q_pos in 0usize..24,
        k_pos in 0usize..24,
        kv_len in 0usize..32,
        causal in any::<bool>(),
    ) {
        let mut c = ctx();
        let s = tile::<4, 8>(&mut c, &v);
        let out = mask_keys(&mut c, &s, q_pos, k_pos, kv_len, causal);
        for r in 0..4 {
            for k in 0..8 {
                let key = k_pos + k;
                let masked = key >= kv_len || (causal && key > q_pos + r);
                let got = out.values().unwrap()[r * 8 + k];
                if masked {
                    prop_assert_eq!(got, f32::NEG_INFINITY, "[{}, {}] key {} query {}", r, k, key, q_pos + r);
                } else {
                    prop_assert_eq!(got, v[r * 8 + k], "[{}, {}] key {} query {}", r, k, key, q_pos + r);
                }
            }
        }
        let ins = instrs(c);
        prop_assert_eq!((vector_of(&ins[1]).0, vector_of(&ins[1]).1), (32, VectorClass::Simple));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// `mask_window` masks exactly the keys `window` or more positions before their query (and
    /// nothing with `window` 0).
    #[test]
    fn mask_window_masks_exactly_the_keys_older_than_the_window(
        v in nonzero(4 * 8),
        q_pos in 0usize..24,
        k_pos in 0usize..24,
        window in 0usize..12,
    ) {
        let mut c = ctx();
        let s = tile::<4, 8>(&mut c, &v);
        let out = mask_window(&mut c, &s, q_pos, k_pos, window);
        for r in 0..4 {
            for k in 0..8 {
                let (key, query) = (k_pos + k, q_pos + r);
                let masked = window > 0 && key + window <= query;
                let got = out.values().unwrap()[r * 8 + k];
                if masked {
                    prop_assert_eq!(got, f32::NEG_INFINITY, "[{}, {}] key {} query {}", r, k, key, query);
                } else {
                    prop_assert_eq!(got, v[r * 8 + k], "[{}, {}] key {} query {}", r, k, key, query);
                }
            }
        }
        let ins = instrs(c);
        prop_assert_eq!((vector_of(&ins[1]).0, vector_of(&ins[1]).1), (32, VectorClass::Simple));
    }
}

#[test]
fn mask_before_masks_the_same_keys_in_every_row() {
    let mut c = ctx();
    let s = tile::<2, 4>(&mut c, &[1.0; 8]);
    let i = f32::NEG_INFINITY;
    // Keys 10..14, first kept key 12.
    let out = mask_before(&mut c, &s, 10, 12);
    assert_eq!(out.values().unwrap(), &[i, i, 1.0, 1.0, i, i, 1.0, 1.0]);
    // Nothing before the tile, everything past it.
    assert_eq!(mask_before(&mut c, &s, 10, 3).values().unwrap(), &[1.0; 8]);
    assert_eq!(mask_before(&mut c, &s, 10, 20).values().unwrap(), &[i; 8]);
}

#[test]
fn mask_window_boundaries_by_hand() {
    let mut c = ctx();
    let s = tile::<2, 4>(&mut c, &[1.0; 8]);
    // Keys 10..14, queries 12 and 13, window 2: query 12 sees keys 11 and 12, query 13 keys 12, 13.
    let out = mask_window(&mut c, &s, 12, 10, 2);
    let i = f32::NEG_INFINITY;
    assert_eq!(out.values().unwrap(), &[i, 1.0, 1.0, 1.0, i, i, 1.0, 1.0]);
}

#[test]
fn mask_keys_boundaries_by_hand() {
    let mut c = ctx();
    let s = tile::<2, 4>(&mut c, &[1.0; 8]);
    // Keys 10..14, queries 11 and 12, context 13: causal keeps keys ≤ query and < 13.
    let out = mask_keys(&mut c, &s, 11, 10, 13, true);
    let i = f32::NEG_INFINITY;
    assert_eq!(out.values().unwrap(), &[1.0, 1.0, i, i, 1.0, 1.0, 1.0, i]);
    let out = mask_keys(&mut c, &s, 11, 10, 13, false);
    assert_eq!(out.values().unwrap(), &[1.0, 1.0, 1.0, i, 1.0, 1.0, 1.0, i]);
}

#[test]
fn tril_keeps_the_diagonal_unless_strict() {
    let mut c = ctx();
    let t = tile::<3, 3>(&mut c, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    let l = tril(&mut c, &t, false);
    let s = tril(&mut c, &t, true);
    assert_eq!(
        l.values().unwrap(),
        &[1.0, 0.0, 0.0, 4.0, 5.0, 0.0, 7.0, 8.0, 9.0]
    );
    assert_eq!(
        s.values().unwrap(),
        &[0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 7.0, 8.0, 0.0]
    );
    assert_eq!(vector_of(&instrs(c)[2]).0, 9);
}

// ---------------------------------------------------------------------------------------------
// Layout

#[test]
fn transpose_broadcast_and_pair_shuffles_move_data_exactly() {
    let mut c = ctx();
    let v: Vec<f32> = (0..8).map(|i| i as f32 + 0.5).collect();
    let t = tile::<2, 4>(&mut c, &v);
    let tt = transpose(&mut c, &t);
    assert_eq!(
        tt.values().unwrap(),
        &[0.5, 4.5, 1.5, 5.5, 2.5, 6.5, 3.5, 7.5]
    );
    let one = tile::<1, 1>(&mut c, &[3.25]);
    let b = broadcast::<f32, 2, 3>(&mut c, &one);
    assert_eq!(b.values().unwrap(), &[3.25; 6]);
    let (e, o): (Tile<f32, 2, 2>, Tile<f32, 2, 2>) = deinterleave(&mut c, &t);
    assert_eq!(e.values().unwrap(), &[0.5, 2.5, 4.5, 6.5]);
    assert_eq!(o.values().unwrap(), &[1.5, 3.5, 5.5, 7.5]);
    let back: Tile<f32, 2, 4> = interleave(&mut c, &e, &o);
    assert_eq!(back.values().unwrap(), &v[..]);
    let elems: Vec<u64> = instrs(c)
        .iter()
        .filter(|i| i.op.engine() == Some(Engine::Vector))
        .map(|i| vector_of(i).0)
        .collect();
    // transpose 8, broadcast 6, deinterleave 4 + 4, interleave 8.
    assert_eq!(elems, [8, 6, 4, 4, 8]);
}

#[test]
fn pair_shuffles_refuse_mismatched_halves() {
    let mut c = ctx();
    let t = tile::<1, 4>(&mut c, &[1.0; 4]);
    let _: (Tile<f32, 1, 3>, Tile<f32, 1, 3>) = deinterleave(c.at(4), &t);
    assert!(c.error().is_some());
}

// ---------------------------------------------------------------------------------------------
// Indices, selection, gathers, formats

#[test]
fn load_index_reads_one_entry_blocking_and_refuses_bad_entries() {
    let idx = Tensor::<i32>::from_indices(&[2, 3], &[4, 0, 7, 1, -2, 5]).unwrap();
    let mut c = ctx();
    assert_eq!(load_index(&mut c, &idx, 2, 99), 7);
    // Through a column window: logical entry 1 of rows [..][1..3] is memory entry 2.
    assert_eq!(load_index(&mut c, &idx.cols_clipped(1, 2), 1, 99), 7);
    let ins = instrs(c);
    assert_eq!(ins.len(), 2);
    assert!(ins[0].blocking);
    assert_eq!(ins[0].write, None);
    let Op::Load { bytes, .. } = ins[0].op else {
        panic!()
    };
    assert_eq!(bytes, 4);
    let mut c = ctx();
    load_index(c.at(5), &idx, 4, 0);
    assert!(
        matches!(c.finish(), Err(SimError::Kernel { line: 5, message, .. }) if message.contains("-2"))
    );
    let mut c = ctx();
    load_index(c.at(6), &idx, 6, 0);
    assert!(
        matches!(c.finish(), Err(SimError::Kernel { line: 6, message, .. }) if message.contains("outside"))
    );
    let mut c = Ctx::standalone("cost", false, false);
    assert_eq!(load_index(&mut c, &Tensor::shape_only(&[6]), 2, 99), 99);
}

#[test]
fn index_at_reads_a_tile_entry_and_blocks() {
    let idx = Tensor::<i32>::from_indices(&[1, 4], &[3, 1, 4, 1]).unwrap();
    let mut c = ctx();
    let t = load::<1, 4, i32>(&mut c, &idx, 0, 0);
    assert_eq!(index_at(&mut c, &t, 2, 0), 4);
    let ins = instrs(c);
    assert!(ins[1].blocking);
    assert_eq!(ins[1].op.engine(), Some(Engine::Vector));
    assert_eq!(vector_of(&ins[1]), (1, VectorClass::Simple, 0));
}

/// A cost-only run reads the indices an index tensor holds (a replayed routing): an `i32` tile
/// loaded from it carries them (ragged edge filled with 0), a float tile and a shape-only index
/// tensor's tile carry nothing, so `index_at` falls back.
#[test]
fn cost_only_index_tiles_carry_their_tensors_indices() {
    let idx = Tensor::<i32>::from_indices(&[3, 1], &[7, 2, 5]).unwrap();
    let mut c = Ctx::standalone("cost", false, false);
    let t = load::<4, 1, i32>(&mut c, &idx, 1, 0);
    assert_eq!(t.values().unwrap(), &[2.0, 5.0, 0.0, 0.0][..]);
    assert_eq!(index_at(&mut c, &t, 1, 99), 5);
    let none = load::<4, 1, i32>(&mut c, &Tensor::shape_only(&[3, 1]), 0, 0);
    assert!(none.values().is_none());
    assert_eq!(index_at(&mut c, &none, 1, 99), 99);
    let f = load::<1, 4, f32>(&mut c, &tensor(1, 4, &[1.0, 2.0, 3.0, 4.0]), 0, 0);
    assert!(f.values().is_none());
    assert!(c.finish().is_ok());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `shift_rows(prev, cur, s)`: the bottom `s` rows of `prev` on top of `cur`'s first `R − s`
    /// rows, exactly, for every shift 0..=R; one simple vector pass over the tile reading both.
    #[test]
    fn shift_rows_slides_a_window_over_two_tiles(
        p in nonzero(12), q in nonzero(12), s in 0usize..=4,
    ) {
        let mut c = ctx();
        let prev = tile::<4, 3>(&mut c, &p);
        let cur = tile::<4, 3>(&mut c, &q);
        let out = shift_rows(&mut c, &prev, &cur, s);
        let got = out.values().unwrap().to_vec();
        for r in 0..4 {
            for col in 0..3 {
                let want = if r < s { p[(4 - s + r) * 3 + col] } else { q[(r - s) * 3 + col] };
                prop_assert_eq!(got[r * 3 + col], want, "row {} col {} shift {}", r, col, s);
            }
        }
        let ins = instrs(c);
        let last = ins.last().unwrap();
        prop_assert_eq!(vector_of(last), (12, VectorClass::Simple, 12));
        prop_assert_eq!(last.n_reads, 2);
    }
}

#[test]
fn shift_rows_refuses_a_shift_past_the_tile() {
    let mut c = ctx();
    let a = tile::<2, 2>(&mut c, &[1.0, 2.0, 3.0, 4.0]);
    let b = tile::<2, 2>(&mut c, &[5.0, 6.0, 7.0, 8.0]);
    shift_rows(c.at(9), &a, &b, 3);
    assert!(
        matches!(c.finish(), Err(SimError::Kernel { line: 9, message, .. }) if message.contains("at most 2"))
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `topk_update` over a row's tiles selects the row's top-k: higher first, ties by lower index.
    #[test]
    fn topk_update_selects_the_top_k_with_ties_by_index(
        v in prop::collection::vec(prop::sample::select(vec![-2.0f32, -0.5, 0.25, 0.5, 1.5]), 16),
    ) {
        let mut c = ctx();
        let mut best = full::<f32, 1, 4>(&mut c, f32::NEG_INFINITY);
        let mut idx = full::<i32, 1, 4>(&mut c, -1.0);
        for part in 0..2 {
            let cand = tile::<1, 8>(&mut c, &v[part * 8..part * 8 + 8]);
            topk_update(&mut c, &mut best, &mut idx, &cand, part * 8);
        }
        let mut order: Vec<usize> = (0..16).collect();
        order.sort_by(|&i, &j| v[j].partial_cmp(&v[i]).unwrap().then(i.cmp(&j)));
        for k in 0..4 {
            prop_assert_eq!(idx.values().unwrap()[k], order[k] as f32);
            prop_assert_eq!(best.values().unwrap()[k], v[order[k]]);
        }
    }
}

#[test]
fn gather_rows_reads_the_pages_of_the_listed_tokens() {
    // Pool of 3 pages × 2 tokens × 4 columns; the sequence's pages are [2, 0].
    let pool_v: Vec<f32> = (0..24).map(|i| i as f32 + 0.5).collect();
    let pool = Tensor::<f32>::from_f32(&[3, 2, 4], &pool_v).unwrap();
    let bt = Tensor::<i32>::from_indices(&[2], &[2, 0]).unwrap();
    let idx = Tensor::<i32>::from_indices(&[3], &[3, 0, 2]).unwrap();
    let mut c = ctx();
    let g = gather_rows::<4, 4, f32>(&mut c, &pool, &bt, &idx, 0, 3, 1);
    // Token 3 → page bt[1] = 0, slot 1 → pool row 1; token 0 → page 2 slot 0 → row 4;
    // token 2 → page 0 slot 0 → row 0. Columns 1..4, then the fill.
    let row = |r: usize| [pool_v[r * 4 + 1], pool_v[r * 4 + 2], pool_v[r * 4 + 3], 0.0];
    let want: Vec<f32> = [row(1), row(4), row(0), [0.0; 4]].concat();
    assert_eq!(g.values().unwrap(), &want[..]);
    let ins = instrs(c);
    assert_eq!(ins[0].op.engine(), Some(Engine::DmaIn));
    assert!(!ins[0].blocking);
    let bad = Tensor::<i32>::from_indices(&[1], &[9]).unwrap();
    let mut c = ctx();
    gather_rows::<4, 4, f32>(c.at(8), &pool, &bt, &bad, 0, 1, 0);
    assert!(matches!(c.finish(), Err(SimError::Kernel { line: 8, .. })));
}

#[test]
fn dequant_mxfp4_decodes_nibbles_low_first_times_the_block_scale() {
    // Row of 32 elements: 16 packed bytes, one E8M0 scale (2^(128−127) = 2).
    let mut blocks = vec![0u8; 16];
    blocks[0] = 0x21; // element 0: code 1 (0.5), element 1: code 2 (1.0)
    blocks[1] = 0xF7; // element 2: code 7 (6.0), element 3: code 15 (−6.0)
    let b = Tensor::<u8>::from_bytes(&[1, 16], &blocks).unwrap();
    let s = Tensor::<u8>::from_bytes(&[1, 1], &[128]).unwrap();
    let mut c = ctx();
    let tb = load::<1, 16, u8>(&mut c, &b, 0, 0);
    let ts = load::<1, 1, u8>(&mut c, &s, 0, 0);
    let out: Tile<f32, 1, 32> = dequant_mxfp4::<f32, 1, 32, 16, 1>(&mut c, &tb, &ts);
    let v = out.values().unwrap();
    assert_eq!(&v[..4], &[1.0, 2.0, 12.0, -12.0]);
    assert!(v[4..].iter().all(|x| *x == 0.0));
    assert_eq!(instrs(c)[2].op.engine(), Some(Engine::Vector));
}
