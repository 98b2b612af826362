//! The simulator never beats physics: for every registered kernel, on every built-in preset, on
//! random shapes and on the production shapes the README uses, a report keeps the invariants of
//! [`Report::check_physics`]: cycles ≥ the roofline, bandwidth ≤ peak at HBM and L2, engine
//! utilisation ≤ 1, SRAM (live and reserved at any instant) ≤ capacity.
//!
//! Everything runs cost-only (shapes only, no data): cost-only cycles equal functional ones
//! (`kernels/tests/cost_only.rs`), and production shapes could not be materialised anyway.

use accel_sim::{DevicePreset, Report, SimError};
use dsl_core::{Backend, Config, Launcher, Tensor};
use kernels::attention::decode::{run_decode, DecodeCase};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use kernels::linear_attention::reference::Decay;
use kernels::linear_attention::runner::{run_delta, DeltaCase, DeltaMode};
use kernels::norm::{run_layernorm, run_rmsnorm, run_rmsnorm_residual, RmsNormCase};
use kernels::softmax::{run_softmax, SoftmaxCase};
use proptest::prelude::*;
use std::collections::BTreeSet;

fn launcher(device: &str) -> Launcher {
    Launcher::for_device(device)
        .expect("built-in preset")
        .with_backend(Backend::CostOnly)
}

/// Fails with every violation of `r` on `device`. A kernel that does not fit a preset (SRAM
/// overflow, a tile the device cannot run) is refused by the launch, which is allowed.
fn check(device: &str, what: &str, r: Result<Report, SimError>) {
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{what} on {device}: refused ({e})");
            return;
        }
    };
    let p = DevicePreset::load(device).unwrap();
    let v = r.check_physics(&p);
    assert!(v.is_empty(), "{what} on {device}:\n  {}", v.join("\n  "));
}

fn shape<T: dsl_core::Elem>(s: &[usize]) -> Tensor<T> {
    Tensor::shape_only(s)
}

/// The operators this file runs; `every_registered_operator_is_checked` compares it with the
/// registry so a new operator cannot skip these checks silently.
const CHECKED: &[&str] = &[
    "gemm",
    "softmax",
    "rmsnorm_residual",
    "rmsnorm",
    "layernorm",
    "linear",
    "add",
    "sigmoid_mul",
    "sigmoid_mul_col",
];

/// Operators of the registry not checked here yet, with the reason (see the report of issue #12).
const NOT_YET: &[&str] = &[
    "embedding",
    "rope",
    "kv_cache_append",
    "moe_router_sigmoid_group_topk",
    "moe_router_softmax_topk",
    "moe_dispatch",
    "moe_combine",
    "moe_grouped_linear",
    // Registered in the run-time-dims change: the suite and the issue shapes below run decode
    // attention and the chunked GDN, but none of these is drawn on random shapes yet.
    "attention_prefill",
    "attention_decode",
    "attention_decode_combine",
    "attention_decode_fp8",
    "dsa_indexer_decode",
    "dsa_indexer_prefill",
    "dsa_topk",
    "sparse_mla",
    "gdn_gates",
    "gated_rmsnorm_silu",
    // Kimi Linear's KDA gates and sigmoid-gated norm (issue #11 item 3).
    "kda_gates",
    "gated_rmsnorm_sigmoid",
    "short_conv",
    "zero_state",
    "delta_rule_recurrent",
    "delta_rule_recurrent_kda",
    "delta_rule_chunked",
    "delta_rule_chunked_kda",
    "copy",
    "expert_gemm",
    "expert_gemm_mxfp4",
    "expert_gemm_fp8",
    "dequant_mxfp4",
    "swiglu",
];

#[test]
fn every_registered_operator_is_checked() {
    let ops: BTreeSet<&str> = kernels::registry::all().iter().map(|i| i.op).collect();
    let known: BTreeSet<&str> = CHECKED.iter().chain(NOT_YET).copied().collect();
    let missing: Vec<_> = ops.difference(&known).collect();
    assert!(
        missing.is_empty(),
        "operators without a physics check: {missing:?}"
    );
}

/// One launch of `op` on `device` at a (rows, cols, depth) problem size.
fn run_op(device: &str, op: &str, m: usize, n: usize, k: usize) -> Result<Report, SimError> {
    let l = launcher(device);
    let gemm = |variant| {
        // The default tiles of the persistent kernel (128³, three K-steps in flight) do not fit
        // h200's shared memory; 128×128×64 fits every preset.
        let config = match variant {
            GemmVariant::Persistent => Config::new().with("BM", 128).with("BN", 128).with("BK", 64),
            _ => Config::new(),
        };
        let case = GemmCase {
            m,
            n,
            k,
            dtype: GemmDtype::Bf16,
            variant,
            config,
            seed: 1,
        };
        run_gemm(&l, &case).map(|r| r.launch.report)
    };
    match op {
        "gemm" => gemm(GemmVariant::Persistent),
        "gemm_naive" => gemm(GemmVariant::Naive),
        "gemm_db" => gemm(GemmVariant::DoubleBuffered),
        "gemm_pipelined" => gemm(GemmVariant::Pipelined),
        "softmax" => run_softmax(
            &l,
            &SoftmaxCase {
                rows: m,
                cols: n,
                dtype: GemmDtype::F32,
                config: Config::new(),
                seed: 1,
            },
        )
        .map(|r| r.launch.report),
        "rmsnorm_residual" => run_rmsnorm_residual(
            &l,
            &RmsNormCase {
                rows: m,
                hidden: n,
                dtype: GemmDtype::Bf16,
                config: Config::new(),
                eps: 1e-6,
                seed: 1,
            },
        )
        .map(|r| r.launch.report),
        "rmsnorm" => run_rmsnorm::<f32>(&l, &shape(&[m, n]), &shape(&[n]), &shape(&[m, n]), 1e-6)
            .map(|r| r.report),
        "layernorm" => run_layernorm::<f32>(
            &l,
            &shape(&[m, n]),
            &shape(&[n]),
            &shape(&[n]),
            &shape(&[m, n]),
            1e-6,
        )
        .map(|r| r.report),
        "linear" => kernels::linear::run_linear::<f32>(
            &l,
            &shape(&[m, k]),
            &shape(&[n, k]),
            &shape(&[m, n]),
        )
        .map(|r| r.report),
        "add" => {
            kernels::elementwise::run_add(&l, &shape(&[m, n]), &shape(&[m, n]), &shape(&[m, n]))
                .map(|r| r.report)
        }
        "sigmoid_mul" => kernels::elementwise::run_sigmoid_mul(
            &l,
            &shape(&[m, n]),
            &shape(&[m, n]),
            &shape(&[m, n]),
        )
        .map(|r| r.report),
        "sigmoid_mul_col" => kernels::elementwise::run_sigmoid_mul_col(
            &l,
            &shape(&[m, 1]),
            &shape(&[m, n]),
            &shape(&[m, n]),
        )
        .map(|r| r.report),
        other => panic!("no runner for {other}"),
    }
}

const RUNNERS: &[&str] = &[
    "gemm",
    "gemm_naive",
    "gemm_db",
    "gemm_pipelined",
    "softmax",
    "rmsnorm_residual",
    "rmsnorm",
    "layernorm",
    "linear",
    "add",
    "sigmoid_mul",
    "sigmoid_mul_col",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    /// Random shapes, mostly ragged, every operator on every preset.
    #[test]
    fn random_shapes_keep_the_invariants(
        m in 1usize..700, n in 1usize..1500, k in 1usize..700,
    ) {
        for device in DevicePreset::builtin_names() {
            for op in RUNNERS {
                check(device, &format!("{op} {m}x{n}x{k}"), run_op(device, op, m, n, k));
            }
        }
    }
}

/// The suite `day0 run` executes (functional there; cost-only here: the same cycles).
#[test]
fn the_suite_keeps_the_invariants() {
    for device in DevicePreset::builtin_names() {
        let l = launcher(device);
        for e in day0::suite::entries() {
            check(device, &e.name, (e.run)(&l));
        }
    }
}

/// The production shapes of the README and issue #12 (skinny decode GEMMs, square ones).
#[test]
fn production_shapes_keep_the_invariants() {
    let gemms = [
        (64, 7168, 16384),
        (4096, 7168, 16384),
        (8192, 8192, 8192),
        (7168, 2048, 7168),
        (1024, 1024, 1024),
    ];
    for device in DevicePreset::builtin_names() {
        for (m, n, k) in gemms {
            for op in ["gemm", "gemm_db"] {
                check(
                    device,
                    &format!("{op} {m}x{n}x{k}"),
                    run_op(device, op, m, n, k),
                );
            }
        }
        let l = launcher(device);
        let decode = DecodeCase {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            v_head_dim: 128,
            shared_kv: false,
            ctx: 8192,
            page_size: 64,
            splits: 8,
            dtype: GemmDtype::Bf16,
            fp8_kv: false,
            seed: 1,
        };
        check(
            device,
            "decode ctx 8192",
            run_decode(&l, &decode).map(|r| r.report),
        );
        let gdn = DeltaCase {
            decay: Decay::Scalar,
            mode: DeltaMode::Chunked,
            seq: 8192,
            k_heads: 16,
            v_heads: 32,
            dk: 128,
            dv: 128,
            dtype: GemmDtype::Bf16,
            config: Config::new().with("C", 64),
            seed: 1,
        };
        check(
            device,
            "gdn prefill 8192",
            run_delta(&l, &gdn).map(|r| r.launch.report),
        );
        for (rows, cols) in [(512, 4000), (4096, 7168)] {
            check(device, "softmax", run_op(device, "softmax", rows, cols, 1));
            check(
                device,
                "rmsnorm_residual",
                run_op(device, "rmsnorm_residual", rows, cols, 1),
            );
        }
    }
}
