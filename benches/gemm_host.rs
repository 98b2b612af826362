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
//!   (default: `128x128x64,256x128x128`); each one becomes its own criterion case;
//! - `GEMM_HOST_ROUNDS=10` — interleaved rounds of the summary table.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsl_core::accel_sim::functional::mma_f32;
use dsl_core::{Config, Launcher, Tensor};
use kernels::gemm::gemm_db;
use kernels::testdata::Rng;
use std::hint::black_box;
use std::time::{Duration, Instant};

const DEVICE: &str = "npu-910b";

/// DSL tile configurations measured by default: the kernel's default tiles, and the fastest on the
/// host among those that fit the 910B's 512 KiB SRAM with double buffering (see BENCHMARKS.md).
const DEFAULT_CONFIGS: &str = "128x128x64,256x128x128";

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
    let s = std::env::var("GEMM_HOST_CONFIGS").unwrap_or_else(|_| DEFAULT_CONFIGS.into());
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

fn rounds() -> usize {
    std::env::var("GEMM_HOST_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
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

/// Seconds per call of each of `cases`, measured in interleaved rounds (one batch of each case per
/// round, batches of about 50 ms) and keeping each case's best batch: on a shared machine the best
/// batch is the one least disturbed by other load, and interleaving gives every case the same
/// chances.
fn best_times(cases: &mut [&mut dyn FnMut()], rounds: usize) -> Vec<f64> {
    let iters: Vec<usize> = cases
        .iter_mut()
        .map(|f| {
            f();
            let t = Instant::now();
            f();
            let once = t.elapsed().as_secs_f64().max(1e-7);
            ((0.05 / once).ceil() as usize).max(1)
        })
        .collect();
    let mut best = vec![f64::INFINITY; cases.len()];
    for _ in 0..rounds {
        for (i, f) in cases.iter_mut().enumerate() {
            let t = Instant::now();
            for _ in 0..iters[i] {
                f();
            }
            best[i] = best[i].min(t.elapsed().as_secs_f64() / iters[i] as f64);
        }
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

        group.bench_function("matrixmultiply_1t", |bch| {
            bch.iter(|| mm_sgemm(black_box(&av), black_box(&bv), &mut cm, n))
        });
        let cfgs = configs();
        for &cfg in &cfgs {
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
        }
        group.finish();

        // Summary: interleaved best-of-rounds, matrixmultiply first, then each DSL configuration.
        let mut mm = || mm_sgemm(&av, &bv, &mut cm, n);
        let mut dsl: Vec<Box<dyn FnMut()>> = cfgs
            .iter()
            .map(|&cfg| {
                let (launcher, config, a, b, ct) = (&launcher, config_of(cfg), &a, &b, &ct);
                Box::new(move || drop(gemm_db::launch(launcher, &config, a, b, ct).unwrap()))
                    as Box<dyn FnMut()>
            })
            .collect();
        // The launch's matrix-unit work alone: the same number of `mma_f32` calls on one hot
        // BM×BK · BK×BN tile pair (no tile loads, stores or simulation).
        let mut mma_only: Vec<Box<dyn FnMut()>> = cfgs
            .iter()
            .map(|&(bm, bn, bk)| {
                let calls = n.div_ceil(bm) * n.div_ceil(bn) * n.div_ceil(bk);
                let ta: Vec<f32> = av[..bm * bk].to_vec();
                let tb: Vec<f32> = bv[..bk * bn].to_vec();
                let mut tc = vec![0.0f32; bm * bn];
                Box::new(move || {
                    for _ in 0..calls {
                        mma_f32(&mut tc, black_box(&ta), black_box(&tb), bm, bn, bk);
                    }
                    black_box(&tc);
                }) as Box<dyn FnMut()>
            })
            .collect();
        let mut cases: Vec<&mut dyn FnMut()> = vec![&mut mm];
        cases.extend(dsl.iter_mut().map(|f| &mut **f as &mut dyn FnMut()));
        cases.extend(mma_only.iter_mut().map(|f| &mut **f as &mut dyn FnMut()));
        let t = best_times(&mut cases, rounds());
        let nc = cfgs.len();
        let mm_g = flops / t[0] / 1e9;
        for (i, cfg) in cfgs.iter().enumerate() {
            let g = flops / t[1 + i] / 1e9;
            let g_mma = flops / t[1 + nc + i] / 1e9;
            summary.push(format!(
                "| {n} | {}x{}x{} | {g:.1} | {mm_g:.1} | {:.2} | {g_mma:.1} | {:.0}% |",
                cfg.0,
                cfg.1,
                cfg.2,
                g / mm_g,
                100.0 * t[1 + nc + i] / t[1 + i]
            ));
        }
    }
    println!(
        "\nSummary (GFLOP/s, 1 thread each; best ~50 ms batch of {} interleaved rounds):",
        rounds()
    );
    println!("| n | DSL tile BMxBNxBK | DSL gemm_db | matrixmultiply | ratio | mma_f32 only | mma share of launch |");
    println!("|---|---|---|---|---|---|---|");
    for l in summary {
        println!("{l}");
    }

    // Fixed cost of one launch: a 32×32 GEMM (one program, one K-step) with the smallest tiles.
    let (av, bv) = inputs(32, 1);
    let a = Tensor::<f32>::from_f32(&[32, 32], &av).unwrap();
    let b = Tensor::<f32>::from_f32(&[32, 32], &bv).unwrap();
    let ct = Tensor::<f32>::poisoned(&[32, 32]);
    let config = config_of((32, 32, 32));
    let mut tiny = || drop(gemm_db::launch(&launcher, &config, &a, &b, &ct).unwrap());
    let t = best_times(&mut [&mut tiny], rounds());
    println!(
        "\nFixed launch cost (32x32 GEMM, BM=BN=BK=32, one program, with_threads(1)): {:.1} us",
        t[0] * 1e6
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
