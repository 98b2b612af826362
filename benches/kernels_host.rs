//! Host throughput of the pieces a release-day session spends its time in, beside the GEMM of
//! `gemm_host`:
//! - **attention**: the DSL flash prefill (`flash_prefill`, causal, functional, one host thread)
//!   at 1024 and 2048 tokens, 8 heads of 128; throughput in FLOP (`2·S²·H·(D + DV)/2` for the
//!   causal half, counted as elements, so `Gelem/s` reads as GFLOP/s);
//! - **MXFP4 dequantization**: `accel_sim::formats::mx::dequantize_block` over a 4M-value tensor
//!   of packed E2M1 codes with E8M0 block scales (what `Weight::values` and the on-chip dequant
//!   compute), in values per second;
//! - **simulator, cost-only**: one cost-only launch of the double-buffered GEMM at 4096³ and
//!   8192×8192×4096 on `npu-910b` (no data), throughput in simulated instructions (the launch
//!   report's per-line instruction counts summed), i.e. simulated instructions per host second.
//!
//! Run: `cargo bench --bench kernels_host`. Inputs are random and non-zero; outputs are checked
//! once before timing (attention against the f64 reference, dequantization against a scalar
//! decode).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dsl_core::accel_sim::formats::fp4::decode_e2m1;
use dsl_core::accel_sim::formats::mx::{dequantize_block, quantize_block, MxElem};
use dsl_core::{Backend, Config, Launcher, Tensor};
use kernels::attention::prefill::{flash_prefill, prefill_config, run_prefill, PrefillCase};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use kernels::testdata::Rng;
use std::hint::black_box;
use std::time::Duration;

const DEVICE: &str = "npu-910b";
const HEADS: usize = 8;
const D: usize = 128;

fn attention(c: &mut Criterion) {
    let mut g = c.benchmark_group("attention_flash_prefill");
    g.sample_size(10).measurement_time(Duration::from_secs(4));
    let launcher = Launcher::for_device(DEVICE)
        .expect("preset")
        .with_threads(1);
    for s in [1024usize, 2048] {
        let config = prefill_config(&Config::new(), D, D).expect("tiles");
        // Check the kernel once at this shape (the runner compares with the f64 reference).
        let checked = run_prefill(
            &launcher,
            &PrefillCase {
                window: 0,
                sinks: false,
                heads: HEADS,
                kv_heads: HEADS,
                head_dim: D,
                v_head_dim: D,
                sq: s,
                skv: s,
                dtype: GemmDtype::F32,
                config: config.clone(),
                seed: 3,
            },
        )
        .expect("prefill");
        let err = checked.launch.report.max_rel_error.expect("functional");
        assert!(err < 1e-4, "flash prefill at {s}: max rel error {err}");
        let mut rng = Rng::new(s as u64);
        let mut t = |salt: f32| {
            let v: Vec<f32> = rng
                .vec(s * HEADS * D, 1.0)
                .into_iter()
                .map(|x| if x == 0.0 { salt } else { x })
                .collect();
            Tensor::<f32>::from_f32(&[s, HEADS * D], &v).expect("shape")
        };
        let (q, k, v) = (t(0.5), t(0.25), t(0.125));
        let o = Tensor::<f32>::poisoned(&[s, HEADS * D]);
        let sinks = kernels::attention::sinks_tensor(&launcher, "flash_prefill", HEADS, None)
            .expect("sinks");
        let flop = (2 * s * s * HEADS * 2 * D / 2) as u64;
        g.throughput(Throughput::Elements(flop));
        g.bench_with_input(BenchmarkId::new("dsl_causal", s), &s, |b, _| {
            b.iter(|| {
                flash_prefill::launch(
                    &launcher,
                    &config,
                    &q,
                    &k,
                    &v,
                    &o,
                    D,
                    D,
                    1.0 / (D as f32).sqrt(),
                    true,
                    0,
                    &sinks,
                )
                .expect("launch")
            })
        });
    }
    g.finish();
}

fn mxfp4_dequant(c: &mut Criterion) {
    const N: usize = 1 << 22;
    let mut g = c.benchmark_group("mxfp4_dequant");
    g.sample_size(20);
    let mut rng = Rng::new(11);
    let x = rng.vec(N, 4.0);
    let elem = MxElem::Fp4E2M1;
    let per_block = elem.bytes_per_block();
    let mut codes = vec![0u8; N / 32 * per_block];
    let mut scales = vec![0u8; N / 32];
    let mut block = [0u8; 32];
    for (b, chunk) in x.chunks(32).enumerate() {
        scales[b] = quantize_block(chunk, elem, &mut block);
        // Two E2M1 codes per byte, the first in the low nibble (the OCP MX packing).
        for (j, pair) in block.chunks(2).enumerate() {
            codes[b * per_block + j] = pair[0] | (pair[1] << 4);
        }
    }
    let mut out = vec![f32::NAN; N];
    let run = |out: &mut [f32]| {
        for (b, dst) in out.chunks_mut(32).enumerate() {
            dequantize_block(
                elem,
                &codes[b * per_block..(b + 1) * per_block],
                scales[b],
                dst,
            );
        }
    };
    // Check against a scalar decode: value = E2M1(code) · 2^(scale − 127), low nibble first.
    run(&mut out);
    for i in (0..N).step_by(4099) {
        let (b, j) = (i / 32, i % 32);
        let byte = codes[b * per_block + j / 2];
        let code = if j % 2 == 0 { byte & 0xf } else { byte >> 4 };
        let want = decode_e2m1(code) * 2f32.powi(scales[b] as i32 - 127);
        assert_eq!(out[i], want, "value {i}");
    }
    g.throughput(Throughput::Elements(N as u64));
    g.bench_function("dequantize_block_4M", |b| {
        b.iter(|| {
            run(&mut out);
            black_box(out[N - 1])
        })
    });
    g.finish();
}

fn simulator_cost_only(c: &mut Criterion) {
    let mut g = c.benchmark_group("simulator_cost_only");
    g.sample_size(10).measurement_time(Duration::from_secs(6));
    let launcher = Launcher::for_device(DEVICE)
        .expect("preset")
        .with_backend(Backend::CostOnly);
    for (m, n, k) in [(4096usize, 4096usize, 4096usize), (8192, 8192, 4096)] {
        let case = GemmCase {
            m,
            n,
            k,
            dtype: GemmDtype::Bf16,
            variant: GemmVariant::DoubleBuffered,
            config: Config::new(),
            seed: 1,
        };
        let report = run_gemm(&launcher, &case).expect("gemm").launch.report;
        let instructions: u64 = report.lines.iter().map(|l| l.count).sum();
        assert!(instructions > 0 && report.cycles > 0);
        g.throughput(Throughput::Elements(instructions));
        g.bench_with_input(
            BenchmarkId::new("gemm_db_bf16", format!("{m}x{n}x{k}")),
            &case,
            |b, case| {
                b.iter(|| {
                    run_gemm(&launcher, case)
                        .expect("gemm")
                        .launch
                        .report
                        .cycles
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, attention, mxfp4_dequant, simulator_cost_only);
criterion_main!(benches);
