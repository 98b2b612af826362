//! The manual (hand-written program) API: explicit placement, queues and events, and the checks
//! that make its synchronisation trustworthy (races, waits the data does not need, overlapping
//! or overflowing placements, reads of unwritten buffers).

use accel_sim::manual::{Accumulate, DeviceTensor, ManualProgram};
use accel_sim::{DType, SimError};
use std::sync::Mutex;

/// A row-major f32 tensor in host memory.
struct HostTensor {
    id: u64,
    rows: usize,
    cols: usize,
    data: Mutex<Vec<f32>>,
}

impl HostTensor {
    fn new(id: u64, rows: usize, cols: usize, seed: u32) -> HostTensor {
        // Fresh, never-zero values.
        let data = (0..rows * cols)
            .map(|i| {
                ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 997.0
                    + 0.25
            })
            .collect();
        HostTensor {
            id,
            rows,
            cols,
            data: Mutex::new(data),
        }
    }
}

impl DeviceTensor for HostTensor {
    fn id(&self) -> u64 {
        self.id
    }
    fn dtype(&self) -> DType {
        DType::F32
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn row_stride(&self) -> usize {
        self.cols
    }
    fn offset(&self) -> usize {
        0
    }
    fn has_data(&self) -> bool {
        true
    }
    fn read_row(&self, row: usize, col: usize, dst: &mut [f32]) {
        let d = self.data.lock().unwrap();
        let at = row * self.cols + col;
        dst.copy_from_slice(&d[at..at + dst.len()]);
    }
    fn write_row(&self, row: usize, col: usize, src: &[f32]) {
        let mut d = self.data.lock().unwrap();
        let at = row * self.cols + col;
        d[at..at + src.len()].copy_from_slice(src);
    }
    fn describe(&self) -> String {
        format!("host tensor {}x{}", self.rows, self.cols)
    }
}

const SRAM: u64 = 1 << 20;

fn message(r: Result<accel_sim::program::ProgramTrace, SimError>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected an error"),
    }
}

/// A two-step K loop, double-buffered, with every wait the data needs: it computes A·B.
#[test]
fn a_correctly_synchronised_program_computes_the_product() {
    let (a, b) = (HostTensor::new(1, 16, 32, 3), HostTensor::new(2, 32, 16, 5));
    let c = HostTensor::new(3, 16, 16, 7);
    let mut p = ManualProgram::new("t", true, SRAM, None);
    let sa = [0, 1].map(|s| p.at(1).place("a", s * 1024, 16, 16, DType::F32));
    let sb = [0, 1].map(|s| p.at(2).place("b", 2048 + s * 1024, 16, 16, DType::F32));
    let acc = p.at(3).place("acc", 4096, 16, 16, DType::F32);
    let l0 = [
        p.at(4).dma_in(&a, 0, 0, sa[0], &[]),
        p.at(4).dma_in(&b, 0, 0, sb[0], &[]),
    ];
    let l1 = [
        p.at(5).dma_in(&a, 0, 16, sa[1], &[]),
        p.at(5).dma_in(&b, 16, 0, sb[1], &[]),
    ];
    p.at(6).mma(acc, sa[0], sb[0], Accumulate::Overwrite, &l0);
    let m1 = p.at(7).mma(acc, sa[1], sb[1], Accumulate::Add, &l1);
    p.at(8).dma_out(acc, &c, 0, 0, &[m1]);
    let trace = p.finish().expect("synchronised");
    assert!(!trace.is_empty());
    let (av, bv, cv) = (
        a.data.lock().unwrap().clone(),
        b.data.lock().unwrap().clone(),
        c.data.lock().unwrap().clone(),
    );
    for i in 0..16 {
        for j in 0..16 {
            let want: f64 = (0..32)
                .map(|k| av[i * 32 + k] as f64 * bv[k * 16 + j] as f64)
                .sum();
            let got = cv[i * 16 + j] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "[{i},{j}] {got} vs {want}"
            );
        }
    }
}

#[test]
fn a_multiply_that_does_not_wait_for_its_load_is_a_race() {
    let a = HostTensor::new(1, 16, 16, 1);
    let mut p = ManualProgram::new("t", false, SRAM, None);
    let x = p.at(1).place("x", 0, 16, 16, DType::F32);
    let acc = p.at(2).place("acc", 1024, 16, 16, DType::F32);
    p.at(10).dma_in(&a, 0, 0, x, &[]);
    p.at(11).mma(acc, x, x, Accumulate::Overwrite, &[]);
    let m = message(p.finish());
    assert!(
        m.contains("race") && m.contains("`x`") && m.contains("line 10"),
        "{m}"
    );
    assert!(
        m.contains("line 11"),
        "the error points at the multiply: {m}"
    );
}

#[test]
fn reloading_a_stage_before_its_multiply_is_done_is_a_race() {
    let a = HostTensor::new(1, 16, 32, 1);
    let mut p = ManualProgram::new("t", false, SRAM, None);
    let x = p.at(1).place("stage", 0, 16, 16, DType::F32);
    let acc = p.at(2).place("acc", 1024, 16, 16, DType::F32);
    let l = p.at(3).dma_in(&a, 0, 0, x, &[]);
    p.at(4).mma(acc, x, x, Accumulate::Overwrite, &[l]);
    // The next K-step's load must wait on the multiply that reads the stage.
    p.at(5).dma_in(&a, 0, 16, x, &[]);
    let m = message(p.finish());
    assert!(
        m.contains("race") && m.contains("reads") && m.contains("line 4"),
        "{m}"
    );
}

#[test]
fn a_wait_the_data_does_not_need_is_an_error() {
    let a = HostTensor::new(1, 16, 16, 1);
    let b = HostTensor::new(2, 16, 16, 2);
    let mut p = ManualProgram::new("t", false, SRAM, None);
    let x = p.at(1).place("x", 0, 16, 16, DType::F32);
    let y = p.at(1).place("y", 1024, 16, 16, DType::F32);
    let acc = p.at(2).place("acc", 2048, 16, 16, DType::F32);
    let lx = p.at(3).dma_in(&a, 0, 0, x, &[]);
    let m = p.at(4).mma(acc, x, x, Accumulate::Overwrite, &[lx]);
    // `y` is fresh: its load needs nothing from the matrix queue.
    p.at(5).dma_in(&b, 0, 0, y, &[m]);
    let msg = message(p.finish());
    assert!(
        msg.contains("remove the wait") && msg.contains("line 5"),
        "{msg}"
    );
}

#[test]
fn after_a_barrier_no_event_is_needed() {
    let a = HostTensor::new(1, 16, 32, 1);
    let mut p = ManualProgram::new("t", false, SRAM, None);
    let x = p.at(1).place("stage", 0, 16, 16, DType::F32);
    let acc = p.at(2).place("acc", 1024, 16, 16, DType::F32);
    let l = p.at(3).dma_in(&a, 0, 0, x, &[]);
    p.at(4).mma(acc, x, x, Accumulate::Overwrite, &[l]);
    p.at(5).barrier();
    p.at(6).dma_in(&a, 0, 16, x, &[]);
    p.finish()
        .expect("the barrier orders the reload after the multiply");
}

#[test]
fn placements_must_not_overlap_or_overflow() {
    let mut p = ManualProgram::new("t", false, SRAM, None);
    p.at(1).place("first", 0, 16, 16, DType::F32);
    p.at(2).place("second", 512, 16, 16, DType::F32);
    let m = message(p.finish());
    assert!(
        m.contains("`second`") && m.contains("overlaps `first`") && m.contains("1024"),
        "{m}"
    );

    let mut p = ManualProgram::new("t", false, SRAM, None);
    p.at(3).place("huge", SRAM - 16, 16, 16, DType::F32);
    assert!(matches!(
        p.finish(),
        Err(SimError::SramOverflow {
            line: 3,
            capacity: SRAM,
            ..
        })
    ));
}

#[test]
fn reading_a_buffer_nothing_wrote_is_an_error() {
    let mut p = ManualProgram::new("t", false, SRAM, None);
    let x = p.at(1).place("x", 0, 16, 16, DType::F32);
    let acc = p.at(2).place("acc", 1024, 16, 16, DType::F32);
    p.at(3).mma(acc, x, x, Accumulate::Add, &[]);
    let m = message(p.finish());
    assert!(
        m.contains("before any operation wrote it") && m.contains("line 3"),
        "{m}"
    );
}

/// The vector operations compute what the DSL's do: a row softmax (max, subtract, exp, sum,
/// divide) matches f64, masked columns get probability 0, and a vector op that reads a loaded
/// buffer without waiting on its load is a race.
#[test]
fn vector_ops_compute_a_masked_row_softmax() {
    use accel_sim::functional::{Binary, Reduce, Unary};
    let (r, c, keep) = (5, 24, 19);
    let x = HostTensor::new(1, r, c, 7);
    let y = HostTensor::new(2, r, c, 8);
    let mut p = ManualProgram::new("softmax", true, SRAM, None);
    let s = p.place("s", 0, r, c, DType::F32);
    let m = p.place("m", s.bytes(), r, 1, DType::F32);
    let l = p.place("l", s.bytes() + m.bytes(), r, 1, DType::F32);
    let e = p.dma_in(&x, 0, 0, s, &[]);
    p.scalar(s, 2.0, s, Binary::Mul, &[e]);
    p.mask_cols(s, keep, &[]);
    p.reduce_rows(s, m, Reduce::Max, &[]);
    p.col_bcast(s, m, s, Binary::Sub, &[]);
    p.unary(s, s, Unary::Exp, &[]);
    p.reduce_rows(s, l, Reduce::Sum, &[]);
    let done = p.col_bcast(s, l, s, Binary::Div, &[]);
    p.dma_out(s, &y, 0, 0, &[done]);
    p.finish().expect("a well-synchronised program");
    let (xv, yv) = (
        x.data.lock().unwrap().clone(),
        y.data.lock().unwrap().clone(),
    );
    for row in 0..r {
        let xs: Vec<f64> = (0..keep).map(|j| 2.0 * xv[row * c + j] as f64).collect();
        let mx = xs.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = xs.iter().map(|v| (v - mx).exp()).sum();
        for j in 0..c {
            let want = if j < keep {
                (xs[j] - mx).exp() / sum
            } else {
                0.0
            };
            let got = yv[row * c + j] as f64;
            assert!((got - want).abs() <= 1e-6, "({row}, {j}): {got} vs {want}");
        }
    }

    let mut p = ManualProgram::new("race", true, SRAM, None);
    let s = p.place("s", 0, r, c, DType::F32);
    p.dma_in(&x, 0, 0, s, &[]);
    p.unary(s, s, Unary::Exp, &[]);
    assert!(message(p.finish()).contains("race"));
}

/// `index_at` reads a loaded index buffer into the program; an entry past the buffer is an error.
#[test]
fn index_at_reads_loaded_entries() {
    let t = HostTensor::new(1, 1, 8, 3);
    let mut p = ManualProgram::new("index", true, SRAM, None);
    let b = p.place("idx", 0, 1, 8, DType::F32);
    let e = p.dma_in(&t, 0, 0, b, &[]);
    // An f32 buffer is not an index buffer.
    p.index_at(b, 0, 0, &[e]);
    assert!(message(p.finish()).contains("i32"));
}
