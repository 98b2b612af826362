//! Host speed of the functional backend: the DSL GEMM (`gemm_db`, functional launch on one host
//! thread) against `matrixmultiply::sgemm` (single-threaded: the crate's `threading` feature is
//! off), square f32 GEMMs of 256, 512 and 1024.
//!
//! Run: `cargo bench --bench gemm_host`. Criterion prints each case's time and throughput in
//! elements/s where one element is one flop (`2·n³` per GEMM), i.e. the `thrpt` line reads as
//! GFLOP/s (`Gelem/s`). A summary table (best of a few runs per case, GFLOP/s and ratio) is printed
//! at the end.
//!
//! Environment knobs (optional):
//! - `GEMM_HOST_SIZES=256,512` — sizes to run;
//! - `GEMM_HOST_CONFIGS=128x128x64,256x128x64` — `BMxBNxBK` tile configurations of the DSL GEMM
//!   (default: `128x128x64`); each one becomes its own criterion case.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsl_core::{Config, Launcher, Tensor};
use kernels::gemm::gemm_db;
use kernels::testdata::Rng;
use std::hint::black_box;
use std::time::{Duration, Instant};

const DEVICE: &str = "npu-910b";

fn sizes() -> Vec<usize> {
    match std::env::var("GEMM_HOST_SIZES") {
        Ok(s) => s
            .split(',')
            .map(|x| x.trim().parse().expect("GEMM_HOST_SIZES: integers"))
            .collect(),
        Err(_) => vec![256, 512, 1024],
    }
}

fn configs() -> Vec<(usize, usize, usize)> {
    let s = std::env::var("GEMM_HOST_CONFIGS").unwrap_or_else(|_| "128x128x64".into());
    s.split(',')
        .map(|c| {
            let v: Vec<usize> = c
                .trim()
                .split('x')
                .map(|x| x.parse().expect("BMxBNxBK"))
                .collect();
            assert_eq!(v.len(), 3, "config `{c}`: expected BMxBNxBK");
            (v[0], v[1], v[2])
        })
        .collect()
}

fn config_of((bm, bn, bk): (usize, usize, usize)) -> Config {
    Config::new()
        .with("BM", bm as i64)
        .with("BN", bn as i64)
        .with("BK", bk as i64)
}

/// Random non-zero inputs (uniform in [-1, 1), zero replaced) for an `n×n` GEMM.
fn inputs(n: usize, seed: u64) -> (Vec<f32>, Vec<f32>) {
    let mut rng = Rng::new(seed);
    let mut nz = |len: usize| -> Vec<f32> {
        rng.vec(len, 1.0)
            .into_iter()
            .map(|x| if x == 0.0 { 0.5 } else { x })
            .collect()
    };
    let a = nz(n * n);
    let b = nz(n * n);
    (a, b)
}

fn mm_sgemm(a: &[f32], b: &[f32], c: &mut [f32], n: usize) {
    // SAFETY: a, b and c are n×n row-major buffers (row stride n, column stride 1), c disjoint
    // from a and b.
    unsafe {
        matrixmultiply::sgemm(
            n,
            n,
            n,
            1.0,
            a.as_ptr(),
            n as isize,
            1,
            b.as_ptr(),
            n as isize,
            1,
            0.0,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// Seconds per call: best of `reps` timed batches, each at least ~0.2 s.
fn best_time(mut f: impl FnMut(), reps: usize) -> f64 {
    f();
    let t = Instant::now();
    f();
    let once = t.elapsed().as_secs_f64().max(1e-6);
    let iters = ((0.2 / once).ceil() as usize).max(1);
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

fn bench(c: &mut Criterion) {
    let launcher = Launcher::for_device(DEVICE)
        .expect("preset")
        .with_threads(1);
    let mut summary: Vec<String> = Vec::new();
    for n in sizes() {
        let flops = 2.0 * (n as f64).powi(3);
        let (av, bv) = inputs(n, 0xDA70 + n as u64);
        let a = Tensor::<f32>::from_f32(&[n, n], &av).unwrap();
        let b = Tensor::<f32>::from_f32(&[n, n], &bv).unwrap();
        let ct = Tensor::<f32>::poisoned(&[n, n]);
        let mut cm = vec![0.0f32; n * n];
        mm_sgemm(&av, &bv, &mut cm, n);

        let mut group = c.benchmark_group(format!("gemm_host/{n}"));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_millis(500))
            .measurement_time(Duration::from_secs(if n >= 1024 { 5 } else { 3 }))
            .throughput(Throughput::Elements(2 * (n as u64).pow(3)));

        let mut mm_best = 0.0f64;
        group.bench_function("matrixmultiply_1t", |bch| {
            bch.iter(|| mm_sgemm(black_box(&av), black_box(&bv), &mut cm, n))
        });
        let t = best_time(|| mm_sgemm(&av, &bv, &mut cm, n), 3);
        mm_best = mm_best.max(flops / t / 1e9);

        for cfg in configs() {
            let config = config_of(cfg);
            // Correctness guard: the DSL result matches matrixmultiply.
            gemm_db::launch(&launcher, &config, &a, &b, &ct).expect("launch");
            let got = ct.to_vec().unwrap();
            let err = got
                .iter()
                .zip(&cm)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(
                err <= 1e-3 * (n as f32).sqrt(),
                "n={n} {config}: max abs diff {err}"
            );

            let id = BenchmarkId::new("dsl_gemm_db_1t", format!("{}x{}x{}", cfg.0, cfg.1, cfg.2));
            group.bench_function(id, |bch| {
                bch.iter(|| {
                    gemm_db::launch(&launcher, &config, black_box(&a), black_box(&b), &ct).unwrap()
                })
            });
            let t = best_time(
                || drop(gemm_db::launch(&launcher, &config, &a, &b, &ct).unwrap()),
                3,
            );
            let g = flops / t / 1e9;
            summary.push(format!(
                "| {n} | {}x{}x{} | {g:.1} | {mm_best:.1} | {:.2} |",
                cfg.0,
                cfg.1,
                cfg.2,
                g / mm_best
            ));
        }
        group.finish();
    }
    println!("\nSummary (best of 3 batches, GFLOP/s, 1 thread each):");
    println!("| n | DSL tile BMxBNxBK | DSL gemm_db | matrixmultiply | ratio |");
    println!("|---|---|---|---|---|");
    for l in summary {
        println!("{l}");
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
