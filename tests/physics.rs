//! The simulator never beats physics: for every registered kernel, on every built-in preset, on
//! random shapes and on the production shapes the README uses, a report keeps the invariants of
//! [`Report::check_physics`]: cycles ≥ the roofline, bandwidth ≤ peak at HBM and L2, engine
//! utilisation ≤ 1, SRAM (live and reserved at any instant) ≤ capacity.
//!
//! Everything runs cost-only (shapes only, no data): cost-only cycles equal functional ones
//! (`kernels/tests/cost_only.rs`), and production shapes could not be materialised anyway.

use accel_sim::{DevicePreset, Report, SimError};
use dsl_core::{bf16, fp8e4m3, Backend, Config, Launcher, Tensor};
use kernels::attention::decode::{
    combine_config, decode_combine, decode_config, paged_decode_split, run_decode,
    run_decode_gqa_batch_with, run_decode_latent, DecodeCase,
};
use kernels::attention::fp8_kv::paged_decode_split_fp8;
use kernels::attention::fp8_kv::{run_gather_dequant_fp8, run_kv_cache_append_fp8, Fp8Tensors};
use kernels::attention::kv_append::run_kv_cache_append;
use kernels::attention::prefill::{run_prefill_with, PrefillCase, PrefillKernel};
use kernels::attention::sparse::{
    run_dsa_decode, run_dsa_decode_batch, run_dsa_decode_batch_fp8, run_dsa_prefill,
    run_dsa_prefill_fp8, DsaCase,
};
use kernels::embedding::run_embedding;
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use kernels::layout::run_copy;
use kernels::linear::run_linear_weight;
use kernels::linear_attention::conv::{launch_short_conv, launch_short_conv_decode, zero_state};
use kernels::linear_attention::gates;
use kernels::linear_attention::reference::Decay;
use kernels::linear_attention::runner::{run_delta, DeltaCase, DeltaMode};
use kernels::moe::dispatch::{run_moe_combine, run_moe_dispatch, RoutingPlan};
use kernels::moe::expert_gemm::{expert_matmul, prepare_weight, swiglu, WeightPath};
use kernels::moe::grouped::{run_grouped_linear, run_grouped_linear_weight};
use kernels::moe::router::{
    run_router_sigmoid_group_topk, run_router_softmax_bias_topk, run_router_softmax_group_topk,
    SoftmaxRouterParams,
};
use kernels::norm::{run_layernorm, run_rmsnorm, run_rmsnorm_residual, RmsNormCase};
use kernels::rope::run_rope;
use kernels::softmax::{run_softmax, SoftmaxCase};
use kernels::split_k::split_k_reduce;
use kernels::testdata::Rng;
use kernels::tile_choice::{cover, divides};
use kernels::weight::{Format, Weight};
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
/// registry so a new operator cannot skip these checks silently, and
/// `every_checked_operator_has_a_runner` with the runners below.
const CHECKED: &[&str] = &[
    "split_k_reduce",
    "gemm",
    "gemm_fp8",
    "softmax",
    "rmsnorm_residual",
    "rmsnorm",
    "layernorm",
    "linear",
    "add",
    "add_bias",
    "sigmoid_mul",
    "sigmoid_mul_col",
    "mul_col",
    "gelu",
    "linear_bias",
    "linear_heads",
    "attention_varlen",
    "scatter_rows",
    "pos_embed_bilinear",
    "embedding",
    "rope",
    "kv_cache_append",
    "kv_cache_append_fp8",
    "moe_router_sigmoid_group_topk",
    "moe_router_softmax_topk",
    "moe_router_softmax_bias_topk",
    "moe_dispatch",
    "moe_combine",
    "moe_grouped_linear",
    "attention_prefill",
    "attention_decode",
    "attention_decode_combine",
    "attention_decode_fp8",
    "attention_decode_latent",
    "attention_decode_latent_fp8",
    "kv_cache_gather_fp8",
    "attention_decode_batch",
    "attention_decode_batch_fp8",
    "dsa_indexer_decode",
    "dsa_indexer_decode_batch",
    "dsa_indexer_prefill",
    "dsa_topk",
    "dsa_topk_batch",
    "sparse_mla",
    "sparse_mla_batch",
    "sparse_mla_fp8",
    "sparse_mla_batch_fp8",
    "dsa_indexer_prefill_fp8",
    "dsa_indexer_decode_batch_fp8",
    "gdn_gates",
    "gated_rmsnorm_silu",
    "kda_gates",
    "gated_rmsnorm_sigmoid",
    "short_conv",
    "short_conv_decode",
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
    "linear_bf16",
    "act_quant_fp8",
    "linear_fp8",
    "moe_grouped_linear_bf16",
    "moe_grouped_linear_fp8",
    "moe_grouped_linear_mxfp4",
    "moe_grouped_linear_int4",
    "swiglu_clamped",
    "moe_grouped_bias",
];

/// Operators of the registry not checked here yet, each with the reason (see the report of issue
/// #12). None left: every registered operator has a runner below.
const NOT_YET: &[&str] = &[];

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

#[test]
fn every_checked_operator_has_a_runner() {
    let ran: BTreeSet<&str> = RUNNERS
        .iter()
        .map(|op| match *op {
            "gemm_naive" | "gemm_db" | "gemm_pipelined" => "gemm",
            other => other,
        })
        .chain(
            MODEL_RUNNERS
                .iter()
                .flat_map(|(_, ops)| ops.iter().copied()),
        )
        .collect();
    let idle: Vec<_> = CHECKED.iter().filter(|op| !ran.contains(*op)).collect();
    assert!(
        idle.is_empty(),
        "checked operators no runner launches: {idle:?}"
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
        // The four-stage pipeline with 64-row tiles: the most SRAM and the most bytes in flight.
        "gemm_fp8" => kernels::gemm_fp8::run_gemm_fp8(
            &l,
            &kernels::gemm_fp8::Fp8GemmCase {
                m,
                n,
                k,
                config: Config::new()
                    .with("BM", 64)
                    .with("BN", 32)
                    .with("BK", 128)
                    .with("ST", 4),
                seed: 1,
            },
        )
        .map(|r| r.launch.report),
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
        "split_k_reduce" => {
            // A split-K product's partials, 2 to 16 splits per output row.
            let splits = 2 + k % 15;
            let sb = kernels::tile_choice::at_least(&split_k_reduce::META, "SB", splits)
                .expect("declared");
            let cfg = Config::new().with("SB", sb).with("BR", 8).with("BC", 128);
            split_k_reduce::launch(&l, &cfg, &shape(&[m * splits, n]), &shape(&[m, n]))
                .map(|r| r.report)
        }
        "add" => {
            kernels::elementwise::run_add(&l, &shape(&[m, n]), &shape(&[m, n]), &shape(&[m, n]))
                .map(|r| r.report)
        }
        "add_bias" => kernels::elementwise::run_add_bias(
            &l,
            &shape(&[m, n]),
            &shape(&[1, n]),
            &shape(&[m, n]),
        )
        .map(|r| r.report),
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
        "mul_col" => {
            kernels::elementwise::run_mul_col(&l, &shape(&[m, 1]), &shape(&[m, n]), &shape(&[m, n]))
                .map(|r| r.report)
        }
        "gelu" => kernels::elementwise::run_gelu(
            &l,
            &shape(&[m, n]),
            &shape(&[m, n]),
            m.is_multiple_of(2),
        )
        .map(|r| r.report),
        "linear_bias" => kernels::linear::run_linear_bias::<bf16>(
            &l,
            &shape(&[m, k]),
            &shape(&[n, k]),
            &shape(&[1, n]),
            &shape(&[m, n]),
        )
        .map(|r| r.report),
        // Four heads of k inputs every k + 16 columns into n outputs every n + 8 (MLA's layout:
        // a head's nope part, then its rope part the kernel skips).
        "linear_heads" => kernels::linear::run_linear_heads(
            &l,
            &shape(&[m, 4 * (k + 16)]),
            &kernels::weight::Weight::Bf16(shape(&[4 * n, k])),
            &shape(&[m, 4 * (n + 8)]),
            4,
            k + 16,
            n + 8,
        )
        .map(|r| r.report),
        // m rows scattered (added) over a [m + k, n] output, every k-th row left alone.
        "scatter_rows" => {
            let positions: Vec<i32> = (0..m as i32)
                .map(|i| i * (m + k) as i32 / m as i32)
                .collect();
            kernels::vision::scatter::run_scatter_rows(
                &l,
                &shape(&[m, n]),
                &positions,
                &shape(&[m + k, n]),
                true,
            )
            .map(|r| r.report)
        }
        // m patches of n channels from a k-row table.
        "pos_embed_bilinear" => {
            let idx: Vec<i32> = (0..4 * m).map(|i| (i * 7 % k) as i32).collect();
            kernels::vision::pos_embed::run_pos_embed_bilinear(
                &l,
                &shape(&[k, n]),
                &idx,
                &vec![0.25; 4 * m],
                &shape(&[m, n]),
            )
            .map(|r| r.report)
        }
        // m patches in three images of uneven sizes, 72-dim heads (Qwen3-VL's vision tower).
        "attention_varlen" => {
            let (heads, hd) = (1 + n % 4, 72);
            let cu = [0, m / 5, m / 2, m].map(|v| v as i32);
            let t = || shape::<bf16>(&[m, heads * hd]);
            kernels::attention::varlen::run_varlen_attention(&l, &t(), &t(), &t(), &t(), &cu, hd)
                .map(|r| r.report)
        }
        other => panic!("no runner for {other}"),
    }
}

const RUNNERS: &[&str] = &[
    "split_k_reduce",
    "gemm",
    "gemm_naive",
    "gemm_db",
    "gemm_pipelined",
    "gemm_fp8",
    "softmax",
    "rmsnorm_residual",
    "rmsnorm",
    "layernorm",
    "linear",
    "add",
    "add_bias",
    "sigmoid_mul",
    "sigmoid_mul_col",
    "mul_col",
    "gelu",
    "linear_bias",
    "linear_heads",
    "scatter_rows",
    "pos_embed_bilinear",
    "attention_varlen",
];

/// A value in `lo..=hi` from the raw draw `x`: a power of two in the range one time in four, any
/// value (ragged, awkward) otherwise.
fn dim(x: usize, lo: usize, hi: usize) -> usize {
    let pows: Vec<usize> = (0..usize::BITS)
        .map(|i| 1usize << i)
        .filter(|p| (lo..=hi).contains(p))
        .collect();
    if divides(4, x) && !pows.is_empty() {
        pows[(x / 4) % pows.len()]
    } else {
        pick(x / 4, lo, hi)
    }
}

/// Any value in `lo..=hi` from the raw draw `x`.
fn pick(x: usize, lo: usize, hi: usize) -> usize {
    lo + x % (hi - lo + 1)
}

/// The first `keep` entries of a random permutation of `0..pool`: a sequence's pages as an
/// allocator leaves them (scattered over a pool with spare pages).
fn scrambled_pages(seed: u64, pool: usize, keep: usize) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    let mut t: Vec<usize> = (0..pool).collect();
    for i in (1..t.len()).rev() {
        t.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    t.truncate(keep);
    t
}

fn indices(v: &[usize]) -> Tensor<i32> {
    let idx: Vec<i32> = v.iter().map(|p| *p as i32).collect();
    Tensor::from_indices(&[idx.len()], &idx).expect("index tensor")
}

/// A skewed routing of `tokens` tokens to `top_k` distinct experts each out of `experts` (low
/// experts are hot, some experts get no token), as a dispatch plan.
fn routing(seed: u64, tokens: usize, experts: usize, top_k: usize) -> RoutingPlan {
    let mut rng = Rng::new(seed);
    let mut idx = Vec::with_capacity(tokens * top_k);
    let mut pool: Vec<usize> = (0..experts).collect();
    for _ in 0..tokens {
        // A partial Fisher-Yates draw, biased to the front by squaring a uniform.
        for j in 0..top_k {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let pos = j + ((u * u) * (experts - j) as f64) as usize;
            pool.swap(j, pos.min(experts - 1));
            idx.push(pool[j] as i32);
        }
    }
    RoutingPlan::from_topk(&idx, tokens, top_k, experts).expect("a valid routing")
}

type Labelled = Vec<(String, Result<Report, SimError>)>;

fn one(what: String, r: Result<Report, SimError>) -> Labelled {
    vec![(what, r)]
}

/// Every report of a multi-launch runner, or its refusal.
fn parts(what: String, r: Result<Vec<Report>, SimError>) -> Labelled {
    match r {
        Ok(v) => v
            .into_iter()
            .map(|r| (format!("{what} [{}]", r.kernel), Ok(r)))
            .collect(),
        Err(e) => vec![(what, Err(e))],
    }
}

/// Paged split-KV decode, the split kernel (bf16 or FP8 cache) and the combine checked apart.
#[allow(clippy::too_many_arguments)]
fn decode(
    l: &Launcher,
    kv_heads: usize,
    group: usize,
    hd: usize,
    vhd: usize,
    shared: bool,
    ctx: usize,
    page: usize,
    splits: usize,
    fp8: bool,
    seed: u64,
) -> Result<Vec<Report>, SimError> {
    let meta = if fp8 {
        &paged_decode_split_fp8::META
    } else {
        &paged_decode_split::META
    };
    // Wide latent rows (MLA: 576/512) take 16 query rows per program, as `dsa_tiles` does.
    let base = if hd > 256 {
        Config::new().with("BH", 16)
    } else {
        Config::new()
    };
    let cfg = decode_config(meta, &base, hd, vhd, page, group)?;
    let n_pages = ctx.div_ceil(page);
    let splits = splits.clamp(1, n_pages);
    let pool_pages = n_pages + 3;
    let table = indices(&scrambled_pages(seed, pool_pages, n_pages));
    let q = shape::<bf16>(&[kv_heads, group, hd]);
    let o_part = shape::<f32>(&[splits, kv_heads, group, vhd]);
    let lse_part = shape::<f32>(&[splits, kv_heads, group, 1]);
    let o = shape::<bf16>(&[kv_heads * group, vhd]);
    let sm = 1.0 / (hd as f32).sqrt();
    let (krow, vrow) = (kv_heads * hd, kv_heads * vhd);
    let split = if fp8 {
        let k = shape::<fp8e4m3>(&[pool_pages, page, krow]);
        let ks = shape::<f32>(&[pool_pages, kv_heads, page]);
        let (v, vs) = if shared {
            (k.clone(), ks.clone())
        } else {
            (
                shape::<fp8e4m3>(&[pool_pages, page, vrow]),
                shape::<f32>(&[pool_pages, kv_heads, page]),
            )
        };
        paged_decode_split_fp8::launch(
            l, &cfg, &q, &k, &v, &ks, &vs, &table, &o_part, &lse_part, ctx, sm,
        )?
    } else {
        let k = shape::<bf16>(&[pool_pages, page, krow]);
        let v = if shared {
            k.clone()
        } else {
            shape::<bf16>(&[pool_pages, page, vrow])
        };
        paged_decode_split::launch(l, &cfg, &q, &k, &v, &table, &o_part, &lse_part, ctx, sm)?
    };
    let combine = decode_combine::launch(l, &combine_config(vhd)?, &o_part, &lse_part, &o)?.report;
    Ok(vec![split.report, combine])
}

/// The registered operators beyond [`run_op`]'s, each with its own dims drawn from `x` (raw
/// values, mapped onto heads, head dims, lengths, page sizes, experts...). Returns every launch's
/// report (or refusal) with a label that reproduces it.
fn run_model_op(device: &str, op: &str, x: &[usize; 8]) -> Labelled {
    let l = launcher(device);
    let seed = x[7] as u64;
    match op {
        "embedding" => {
            let (t, vocab, h) = (dim(x[0], 1, 700), dim(x[1], 1, 50000), dim(x[2], 1, 4096));
            let mut rng = Rng::new(seed);
            let ids: Vec<i32> = (0..t)
                .map(|_| (rng.next_u64() % vocab as u64) as i32)
                .collect();
            one(
                format!("{op} tokens {t} vocab {vocab} hidden {h}"),
                run_embedding(
                    &l,
                    &ids,
                    &shape::<bf16>(&[vocab, h]),
                    &shape::<f32>(&[t, h]),
                )
                .map(|r| r.report),
            )
        }
        "rope" => {
            let (t, heads, hd) = (dim(x[0], 1, 700), dim(x[1], 1, 64), dim(x[2], 2, 300));
            let rot = 2 * dim(x[3], 1, hd / 2);
            let off = pick(x[4], 0, hd - rot);
            let inter = x[5] % 2 == 1;
            let (a, out) = (shape(&[t, heads * hd]), shape(&[t, heads * hd]));
            let (cos, sin) = (shape(&[t, rot / 2]), shape(&[t, rot / 2]));
            one(
                format!(
                    "{op} tokens {t} heads {heads} head_dim {hd} rot {off}+{rot} interleaved {inter}"
                ),
                run_rope(&l, &a, &cos, &sin, &out, hd, off, rot, inter).map(|r| r.report),
            )
        }
        "kv_cache_append" => {
            let (n, start, w, page) = (
                dim(x[0], 1, 700),
                pick(x[1], 0, 8192),
                dim(x[2], 1, 4096),
                dim(x[3], 1, 300),
            );
            let needed = (start + n).div_ceil(page);
            let pool_pages = needed + pick(x[4], 0, 8);
            let table = scrambled_pages(seed, pool_pages, needed);
            one(
                format!("{op} rows {n} at {start} width {w} page {page} pool {pool_pages}"),
                run_kv_cache_append(
                    &l,
                    &shape::<bf16>(&[n, w]),
                    &table,
                    &shape::<f32>(&[pool_pages * page, w]),
                    start,
                    page,
                )
                .map(|r| r.report),
            )
        }
        "kv_cache_append_fp8" => {
            let (n, start, heads, d, page) = (
                dim(x[0], 1, 700),
                pick(x[1], 0, 8192),
                dim(x[2], 1, 16),
                dim(x[3], 1, 1024),
                dim(x[4], 1, 300),
            );
            let needed = (start + n).div_ceil(page);
            let pool_pages = needed + pick(x[5], 0, 8);
            let table = scrambled_pages(seed, pool_pages, needed);
            one(
                format!("{op} rows {n} at {start} heads {heads}×{d} page {page} pool {pool_pages}"),
                run_kv_cache_append_fp8(
                    &l,
                    &shape::<bf16>(&[n, heads * d]),
                    &table,
                    &Fp8Tensors::empty(pool_pages, page, heads, d, true),
                    start,
                )
                .map(|r| r.report),
            )
        }
        "moe_router_sigmoid_group_topk" => {
            let (t, groups, gs) = (dim(x[0], 1, 512), dim(x[1], 1, 32), dim(x[2], 2, 64));
            let kept = pick(x[3], 1, groups);
            let k = pick(x[4], 1, (kept * gs).min(64));
            let e = groups * gs;
            let norm = divides(2, x[5]);
            one(
                format!("{op} tokens {t} experts {e} groups {groups} kept {kept} top_k {k}"),
                run_router_sigmoid_group_topk(
                    &l,
                    &shape(&[t, e]),
                    &shape(&[1, e]),
                    &shape(&[t, k]),
                    &shape(&[t, k]),
                    groups,
                    kept,
                    norm,
                    2.5,
                ),
            )
        }
        "moe_router_softmax_topk" => {
            // Ungrouped (Qwen, Mixtral) or group-limited and scaled (DeepSeek-V2).
            let groups = [1, 1, 2, 4, 8][x[2] % 5];
            let (t, e) = (dim(x[0], 1, 512), groups * dim(x[1], 1, 512 / groups));
            let kept = pick(x[3], 1, groups);
            let k = pick(x[4], 1, (kept * e / groups).min(64));
            one(
                format!("{op} tokens {t} experts {e} groups {kept} of {groups} top_k {k}"),
                run_router_softmax_group_topk(
                    &l,
                    &shape(&[t, e]),
                    &shape(&[t, k]),
                    &shape(&[t, k]),
                    SoftmaxRouterParams {
                        n_group: groups,
                        topk_group: kept,
                        norm_topk_prob: divides(2, x[5]),
                        routed_scaling_factor: if groups > 1 { 16.0 } else { 1.0 },
                    },
                ),
            )
        }
        "moe_router_softmax_bias_topk" => {
            // ERNIE-4.5: top-k on probability plus a correction bias.
            let (t, e) = (dim(x[0], 1, 512), dim(x[1], 1, 512));
            let k = pick(x[4], 1, e.min(64));
            one(
                format!("{op} tokens {t} experts {e} top_k {k}"),
                run_router_softmax_bias_topk(
                    &l,
                    &shape(&[t, e]),
                    &shape(&[1, e]),
                    &shape(&[t, k]),
                    &shape(&[t, k]),
                ),
            )
        }
        "moe_dispatch" | "moe_combine" | "moe_grouped_linear" | "moe_grouped_bias" => {
            let (t, e) = (dim(x[0], 1, 512), dim(x[1], 1, 128));
            let k = pick(x[4], 1, e.min(16));
            let plan = routing(seed, t, e, k);
            let n = t * k;
            let what = format!("{op} tokens {t} experts {e} top_k {k} (skewed, seed {seed})");
            match op {
                "moe_dispatch" => {
                    let h = dim(x[2], 1, 7168);
                    let rows = plan.rows_tensor().expect("rows");
                    one(
                        format!("{what} hidden {h}"),
                        run_moe_dispatch(&l, &shape::<bf16>(&[t, h]), &rows, &shape(&[n, h])),
                    )
                }
                "moe_combine" => {
                    let h = dim(x[2], 1, 7168);
                    let slots = plan.slot_of_tensor(k).expect("slots");
                    let out = shape(&[t, h]);
                    one(
                        format!("{what} hidden {h}"),
                        run_moe_combine(
                            &l,
                            &shape(&[n, h]),
                            &slots,
                            &shape(&[t, k]),
                            &shape(&[t, h]),
                            &out,
                        ),
                    )
                }
                "moe_grouped_bias" => {
                    let nout = dim(x[3], 1, 7168);
                    let offsets = plan.offsets_tensor().expect("offsets");
                    one(
                        format!("{what} out {nout}"),
                        kernels::moe::grouped::run_grouped_add_bias(
                            &l,
                            &shape(&[n, nout]),
                            &shape(&[e, nout]),
                            &offsets,
                        )
                        .map(|l| l.report),
                    )
                }
                _ => {
                    let (kd, nout) = (dim(x[2], 1, 2048), dim(x[3], 1, 2048));
                    let offsets = plan.offsets_tensor().expect("offsets");
                    one(
                        format!("{what} in {kd} out {nout}"),
                        run_grouped_linear(
                            &l,
                            &shape::<bf16>(&[n, kd]),
                            &shape(&[e, nout, kd]),
                            &offsets,
                            &shape(&[n, nout]),
                        ),
                    )
                }
            }
        }
        "linear_stored" | "grouped_linear_stored" => {
            // Each stored weight format in turn: bf16, block FP8 (W8A8 or W8A16 by the matrix
            // unit's modes), MXFP4 and group-scaled INT4 (experts only).
            let int4 = Format::Int4 {
                group: [32, 64, 128][x[5] % 3],
            };
            let format = [Format::Bf16, Format::Fp8Block, Format::Mxfp4, int4][x[6] % 4];
            let unit = match format {
                Format::Int4 { group } => group,
                _ => 32,
            };
            let (kd, nout) = (unit * dim(x[2], 1, 7168 / unit), dim(x[3], 1, 7168));
            let w_shape = |lead: &[usize]| [lead, &[nout, kd][..]].concat();
            if op == "linear_stored" {
                let format = match format {
                    Format::Mxfp4 | Format::Int4 { .. } => Format::Bf16,
                    other => other,
                };
                let m = dim(x[0], 1, 4096);
                let w = Weight::shape_only(format, &w_shape(&[])).expect("weight");
                let r = run_linear_weight(&l, &shape(&[m, kd]), &w, &shape(&[m, nout]));
                return parts(
                    format!("{op} {} {m}x{nout}x{kd}", format.name()),
                    r.map(|v| v.into_iter().map(|(_, l)| l.report).collect()),
                );
            }
            let (t, e) = (dim(x[0], 1, 512), dim(x[1], 1, 128));
            let k = pick(x[4], 1, e.min(16));
            let plan = routing(seed, t, e, k);
            let n = t * k;
            let w = Weight::shape_only(format, &w_shape(&[e])).expect("weight");
            let offsets = plan.offsets_tensor().expect("offsets");
            let r =
                run_grouped_linear_weight(&l, &shape(&[n, kd]), &w, &offsets, &shape(&[n, nout]));
            parts(
                format!(
                    "{op} {} tokens {t} experts {e} top_k {k} in {kd} out {nout}",
                    format.name()
                ),
                r.map(|v| v.into_iter().map(|(_, r)| r).collect()),
            )
        }
        "attention_prefill" => {
            let (kv, group) = (dim(x[1], 1, 8), dim(x[5], 1, 8));
            let (hd, vhd) = (dim(x[2], 1, 300), dim(x[3], 1, 300));
            let sq = dim(x[0], 1, 300);
            let skv = sq + pick(x[4], 0, 1000);
            let case = PrefillCase {
                window: 0,
                sinks: seed % 2 == 1,
                heads: kv * group,
                kv_heads: kv,
                head_dim: hd,
                v_head_dim: vhd,
                sq,
                skv,
                dtype: GemmDtype::Bf16,
                config: Config::new(),
                seed,
            };
            // Both prefill kernels: the plain one and the software-pipelined one.
            [PrefillKernel::Flash, PrefillKernel::Pipelined]
                .into_iter()
                .flat_map(|kernel| {
                    one(
                        format!("{op} {kernel:?} {case:?}"),
                        run_prefill_with(&l, &case, kernel).map(|r| r.launch.report),
                    )
                })
                .collect()
        }
        "attention_decode" | "attention_decode_fp8" | "attention_decode_mla" => {
            let mla = op == "attention_decode_mla";
            let (kv, group, hd, vhd) = if mla {
                let hd = dim(x[2], 1, 576);
                (1, dim(x[5], 1, 128), hd, dim(x[3], 1, hd.min(512)))
            } else {
                (
                    dim(x[1], 1, 8),
                    dim(x[5], 1, 16),
                    dim(x[2], 1, 300),
                    dim(x[3], 1, 300),
                )
            };
            let (ctx, page, splits) = (dim(x[0], 1, 8192), dim(x[4], 1, 300), dim(x[6], 1, 16));
            let fp8 = op == "attention_decode_fp8" || (mla && x[6] % 2 == 1);
            parts(
                format!(
                    "{op} kv_heads {kv} group {group} head_dim {hd} v_head_dim {vhd} ctx {ctx} \
                     page {page} splits {splits} fp8 {fp8}"
                ),
                decode(&l, kv, group, hd, vhd, mla, ctx, page, splits, fp8, seed),
            )
        }
        "attention_decode_latent" | "attention_decode_latent_fp8" => {
            let hd = dim(x[2], 1, 576);
            let case = DecodeCase {
                heads: dim(x[5], 1, 128),
                kv_heads: 1,
                head_dim: hd,
                v_head_dim: dim(x[3], 1, hd.min(512)),
                shared_kv: true,
                ctx: dim(x[0], 1, 8192),
                page_size: dim(x[4], 1, 300),
                splits: dim(x[6], 1, 16),
                dtype: GemmDtype::Bf16,
                fp8_kv: op.ends_with("fp8"),
                seed,
            };
            one(
                format!("{op} {case:?}"),
                run_decode_latent(&l, &case).map(|r| r.report),
            )
        }
        "kv_cache_gather_fp8" => {
            let (n, heads, d, page) = (
                dim(x[0], 1, 4096),
                dim(x[2], 1, 16),
                dim(x[3], 1, 1024),
                dim(x[4], 1, 300),
            );
            let pool_pages = n.div_ceil(page) + pick(x[5], 0, 8);
            let rows: Vec<usize> = scrambled_pages(seed, pool_pages * page, n);
            one(
                format!("{op} rows {n} heads {heads}×{d} page {page} pool {pool_pages}"),
                run_gather_dequant_fp8(
                    &l,
                    &Fp8Tensors::empty(pool_pages, page, heads, d, true),
                    &rows,
                    &shape::<f32>(&[n, heads * d]),
                )
                .map(|r| r.report),
            )
        }
        "attention_decode_batch" | "attention_decode_batch_fp8" => {
            // Up to 4 sequences with their own contexts (drawn from the seed) in one launch, over
            // bf16 or FP8 pools.
            let (kv, group, hd) = (dim(x[1], 1, 8), dim(x[5], 1, 16), dim(x[2], 1, 300));
            let (seqs, longest) = (dim(x[6] / 7, 1, 4), dim(x[0], 1, 4096));
            let mut rng = Rng::new(seed);
            let contexts: Vec<usize> = (0..seqs)
                .map(|_| 1 + (rng.next_u64() % longest as u64) as usize)
                .collect();
            let case = DecodeCase {
                heads: kv * group,
                kv_heads: kv,
                head_dim: hd,
                v_head_dim: dim(x[3], 1, 300),
                shared_kv: false,
                ctx: 0,
                page_size: dim(x[4], 1, 300),
                splits: dim(x[6], 1, 16),
                dtype: GemmDtype::Bf16,
                fp8_kv: op.ends_with("fp8"),
                seed,
            };
            // A sliding window in a third of the draws.
            let window = if divides(3, x[7]) {
                dim(x[0] / 3, 1, 1024)
            } else {
                0
            };
            one(
                format!("{op} contexts {contexts:?} window {window} {case:?}"),
                run_decode_gqa_batch_with(&l, &case, &contexts, window, seed % 2 == 1)
                    .map(|r| r.report),
            )
        }
        "dsa_decode" | "dsa_prefill" | "dsa_prefill_fp8" => {
            let prefill = op != "dsa_decode";
            let ctx = dim(x[0], 1, if prefill { 1024 } else { 8192 });
            // Half the draws up to DeepSeek's 576-wide latent rows, half up to 256.
            let hd = dim(x[2], 1, if divides(3, x[2]) { 576 } else { 256 });
            let case = DsaCase {
                seq: if prefill {
                    dim(x[6], 1, ctx.min(256))
                } else {
                    1
                },
                heads: dim(x[1], 1, 128),
                ctx,
                topk: dim(x[3], 1, 2048),
                index_heads: dim(x[5], 1, if prefill { 32 } else { 64 }),
                index_dim: dim(x[6] / 7, 1, 256),
                head_dim: hd,
                v_head_dim: dim(x[7], 1, hd.min(512)),
                page_size: dim(x[4], 1, 128),
                seed,
            };
            let r = match op {
                "dsa_prefill" => run_dsa_prefill(&l, &case),
                "dsa_prefill_fp8" => run_dsa_prefill_fp8(&l, &case),
                _ => run_dsa_decode(&l, &case),
            };
            parts(
                format!("{op} {case:?}"),
                r.map(|r| vec![r.indexer, r.topk, r.attention]),
            )
        }
        "dsa_decode_batch" | "dsa_decode_batch_fp8" => {
            // Up to 4 sequences with their own contexts (drawn from the seed) in one launch each.
            let (seqs, longest) = (dim(x[6] / 7, 1, 4), dim(x[0], 1, 8192));
            let mut rng = Rng::new(seed);
            let contexts: Vec<usize> = (0..seqs)
                .map(|_| 1 + (rng.next_u64() % longest as u64) as usize)
                .collect();
            let hd = dim(x[2], 1, if divides(3, x[2]) { 576 } else { 256 });
            let case = DsaCase {
                seq: 1,
                heads: dim(x[1], 1, 128),
                ctx: 1,
                topk: dim(x[3], 1, 2048),
                index_heads: dim(x[5], 1, 64),
                index_dim: dim(x[6] / 3, 1, 256),
                head_dim: hd,
                v_head_dim: dim(x[7], 1, hd.min(512)),
                page_size: dim(x[4], 1, 128),
                seed,
            };
            parts(
                format!("{op} contexts {contexts:?} {case:?}"),
                if op == "dsa_decode_batch" {
                    run_dsa_decode_batch(&l, &case, &contexts)
                } else {
                    run_dsa_decode_batch_fp8(&l, &case, &contexts)
                }
                .map(|r| vec![r.indexer, r.topk, r.attention]),
            )
        }
        "gdn_gates" => {
            let (t, h) = (dim(x[0], 1, 4096), dim(x[1], 1, 128));
            let row = || shape::<f32>(&[t, h]);
            let (a, b, g, beta) = (row(), row(), row(), row());
            let (a_log, dt_bias) = (shape(&[1, h]), shape(&[1, h]));
            one(
                format!("{op} tokens {t} heads {h}"),
                gates::gdn_gates::launch(&l, &Config::new(), &a, &b, &a_log, &dt_bias, &g, &beta)
                    .map(|r| r.report),
            )
        }
        "kda_gates" => {
            let (t, h, dk) = (dim(x[0], 1, 4096), dim(x[1], 1, 64), dim(x[2], 1, 256));
            let (f, g) = (shape(&[t, h * dk]), shape(&[t, h * dk]));
            let (b, beta) = (shape(&[t, h]), shape(&[t, h]));
            one(
                format!("{op} tokens {t} heads {h} dk {dk}"),
                cover(
                    &gates::kda_gates::META,
                    &Config::new(),
                    &[("BDK", dk, "dk")],
                )
                .and_then(|cfg| {
                    gates::kda_gates::launch(
                        &l,
                        &cfg,
                        &f,
                        &b,
                        &shape(&[1, h]),
                        &shape(&[1, h * dk]),
                        &g,
                        &beta,
                    )
                    .map(|r| r.report)
                }),
            )
        }
        "gated_rmsnorm_silu" | "gated_rmsnorm_sigmoid" => {
            let (t, h, dv) = (dim(x[0], 1, 4096), dim(x[1], 1, 64), dim(x[2], 1, 512));
            let act = || shape::<bf16>(&[t, h * dv]);
            let (o, z, y) = (act(), act(), act());
            let w = shape(&[1, dv]);
            let silu = op == "gated_rmsnorm_silu";
            let meta = if silu {
                &gates::gated_rmsnorm_silu::META
            } else {
                &gates::gated_rmsnorm_sigmoid::META
            };
            one(
                format!("{op} tokens {t} heads {h} dv {dv}"),
                cover(meta, &Config::new(), &[("BDV", dv, "dv")]).and_then(|cfg| {
                    if silu {
                        gates::gated_rmsnorm_silu::launch(&l, &cfg, &o, &z, &w, &y, 1e-6)
                    } else {
                        gates::gated_rmsnorm_sigmoid::launch(&l, &cfg, &o, &z, &w, &y, 1e-6)
                    }
                    .map(|r| r.report)
                }),
            )
        }
        "short_conv" => {
            let (t, ch) = (dim(x[0], 1, 700), dim(x[2], 1, 8192));
            let taps = if divides(3, x[3]) {
                4
            } else {
                pick(x[4], 1, 8)
            };
            let state = || shape::<f32>(&[(taps - 1).max(1), ch]);
            let (a, y) = (shape::<bf16>(&[t, ch]), shape::<bf16>(&[t, ch]));
            one(
                format!("{op} tokens {t} channels {ch} taps {taps}"),
                launch_short_conv(&l, &a, &shape(&[taps, ch]), &state(), &state(), &y)
                    .map(|r| r.report),
            )
        }
        "short_conv_decode" => {
            let (seqs, ch) = (dim(x[0], 1, 512), dim(x[2], 1, 8192));
            let taps = pick(x[4], 2, 8);
            let (a, y) = (shape::<bf16>(&[seqs, ch]), shape::<bf16>(&[seqs, ch]));
            let states = shape::<f32>(&[seqs, taps - 1, ch]);
            one(
                format!("{op} sequences {seqs} channels {ch} taps {taps}"),
                launch_short_conv_decode(&l, &a, &shape(&[taps, ch]), &states, None, &y)
                    .map(|r| r.report),
            )
        }
        "zero_state" => {
            let (r, c) = (dim(x[0], 1, 4096), dim(x[2], 1, 4096));
            let extra = pick(x[3], 0, 300);
            let t = shape::<f32>(&[r, c + extra])
                .col_range(extra / 2, c)
                .expect("view");
            one(
                format!("{op} {r}x{c} in a row of {}", c + extra),
                zero_state::launch(&l, &Config::new(), &t).map(|r| r.report),
            )
        }
        "delta_rule_recurrent"
        | "delta_rule_recurrent_kda"
        | "delta_rule_chunked"
        | "delta_rule_chunked_kda" => {
            let chunked = op.starts_with("delta_rule_chunked");
            let k_heads = dim(x[1], 1, 16);
            // Head dims up to 256 one time in three (the largest tiles), else up to 128.
            let wide = if divides(3, x[6]) { 256 } else { 128 };
            let (dk, dv) = (dim(x[2], 1, wide), dim(x[3], 1, wide));
            // Head dims above 128 take 256-wide tiles: only the smallest chunk fits next to them.
            let c = if dk.max(dv) > 128 {
                16
            } else {
                [16, 32, 64][x[4] % 3]
            };
            let case = DeltaCase {
                decay: if op.ends_with("kda") {
                    Decay::PerChannel
                } else {
                    Decay::Scalar
                },
                mode: if chunked {
                    DeltaMode::Chunked
                } else {
                    DeltaMode::Recurrent
                },
                seq: if chunked {
                    dim(x[0], 1, 1024)
                } else {
                    dim(x[0], 1, 64)
                },
                k_heads,
                v_heads: k_heads * dim(x[5], 1, 4),
                dk,
                dv,
                dtype: GemmDtype::Bf16,
                config: Config::new().with("C", c),
                seed,
            };
            one(
                format!("{op} {case:?}"),
                run_delta(&l, &case).map(|r| r.launch.report),
            )
        }
        "copy" => {
            let (r, c) = (dim(x[0], 1, 4096), dim(x[2], 1, 4096));
            let extra = pick(x[3], 0, 300);
            let src = shape::<f32>(&[r, c + extra])
                .col_range(extra / 3, c)
                .expect("view");
            let what = format!("{op} {r}x{c} from a row of {}", c + extra);
            let res = match x[5] % 3 {
                0 => run_copy(&l, &src, &shape::<bf16>(&[r, c])),
                1 => run_copy(&l, &src, &shape::<f32>(&[r, c])),
                _ => run_copy(&l, &shape::<bf16>(&[r, c]), &src),
            };
            one(what, res.map(|r| r.report))
        }
        "expert_gemm" | "expert_gemm_mxfp4" | "expert_gemm_fp8" | "dequant_mxfp4" => {
            let path = match op {
                "expert_gemm" => WeightPath::Bf16,
                "expert_gemm_mxfp4" => WeightPath::Mxfp4Online,
                "expert_gemm_fp8" => WeightPath::Fp8Block,
                _ => WeightPath::Mxfp4Offline,
            };
            let (e, t, n) = (dim(x[1], 1, 32), dim(x[0], 1, 256), dim(x[3], 1, 2048));
            let mut k = dim(x[2], 1, 2048);
            if matches!(path, WeightPath::Mxfp4Online | WeightPath::Mxfp4Offline) {
                // MXFP4 packs K in 32-element blocks.
                k = k.div_ceil(32) * 32;
            }
            // The runner's default token tile for a prefill batch (BM = 128) overflows h200's
            // shared memory next to the FP8 path's f32 partial product: take 64 there.
            let config = if path == WeightPath::Fp8Block && t > 64 {
                Config::new().with("BM", 64)
            } else {
                Config::new()
            };
            let mut rng = Rng::new(seed);
            let r = prepare_weight(&l, path, [e, n, k], &mut rng, "w").and_then(|w| {
                let ws = shape::<bf16>(&[e * n * k]);
                expert_matmul(
                    &l,
                    path,
                    &config,
                    &shape(&[e, t, k]),
                    &w,
                    Some(&ws),
                    &shape(&[e, t, n]),
                )
            });
            parts(
                format!("{op} experts {e} tokens {t} K {k} N {n} ({path:?})"),
                r,
            )
        }
        "swiglu" => {
            let (r, c) = (dim(x[0], 1, 4096), dim(x[2], 1, 4096));
            let (g, u) = (shape::<f32>(&[r, c]), shape::<f32>(&[r, c]));
            one(
                format!("{op} {r}x{c}"),
                swiglu::launch(&l, &Config::new(), &g, &u, &shape::<bf16>(&[r, c]))
                    .map(|r| r.report),
            )
        }
        "swiglu_clamped" => {
            let (r, c) = (dim(x[0], 1, 4096), dim(x[2], 1, 4096));
            let (g, u) = (shape::<f32>(&[r, c]), shape::<f32>(&[r, c]));
            one(
                format!("{op} {r}x{c}"),
                kernels::moe::expert_gemm::swiglu_clamped::launch(
                    &l,
                    &Config::new(),
                    &g,
                    &u,
                    &shape::<bf16>(&[r, c]),
                    1.702,
                    7.0,
                )
                .map(|r| r.report),
            )
        }
        other => panic!("no runner for {other}"),
    }
}

/// [`run_model_op`]'s runners, each with the registered operators it launches.
const MODEL_RUNNERS: &[(&str, &[&str])] = &[
    ("embedding", &["embedding"]),
    ("rope", &["rope"]),
    ("kv_cache_append", &["kv_cache_append"]),
    ("kv_cache_append_fp8", &["kv_cache_append_fp8"]),
    ("kv_cache_gather_fp8", &["kv_cache_gather_fp8"]),
    (
        "moe_router_sigmoid_group_topk",
        &["moe_router_sigmoid_group_topk"],
    ),
    ("moe_router_softmax_topk", &["moe_router_softmax_topk"]),
    (
        "moe_router_softmax_bias_topk",
        &["moe_router_softmax_bias_topk"],
    ),
    ("moe_dispatch", &["moe_dispatch"]),
    ("moe_combine", &["moe_combine"]),
    ("moe_grouped_linear", &["moe_grouped_linear"]),
    ("attention_prefill", &["attention_prefill"]),
    (
        "attention_decode",
        &["attention_decode", "attention_decode_combine"],
    ),
    (
        "attention_decode_fp8",
        &["attention_decode_fp8", "attention_decode_combine"],
    ),
    // MLA's absorbed decode: one latent head shared by keys and values (bf16 or FP8).
    (
        "attention_decode_mla",
        &[
            "attention_decode",
            "attention_decode_fp8",
            "attention_decode_combine",
        ],
    ),
    // MLA's latent decode reading each latent row once (values = the keys' first columns).
    (
        "attention_decode_latent",
        &["attention_decode_latent", "attention_decode_combine"],
    ),
    // The same over an FP8 latent cache.
    (
        "attention_decode_latent_fp8",
        &["attention_decode_latent_fp8", "attention_decode_combine"],
    ),
    // GQA decodes of a batch of sequences in one launch over the shared pools.
    (
        "attention_decode_batch",
        &["attention_decode_batch", "attention_decode_combine"],
    ),
    (
        "attention_decode_batch_fp8",
        &["attention_decode_batch_fp8", "attention_decode_combine"],
    ),
    (
        "dsa_decode",
        &["dsa_indexer_decode", "dsa_topk", "sparse_mla"],
    ),
    (
        "dsa_prefill",
        &["dsa_indexer_prefill", "dsa_topk", "sparse_mla"],
    ),
    // DSA decodes of a batch of sequences, one launch per kernel.
    (
        "dsa_decode_batch",
        &[
            "dsa_indexer_decode_batch",
            "dsa_topk_batch",
            "sparse_mla_batch",
        ],
    ),
    // The same two over an FP8 latent cache.
    (
        "dsa_prefill_fp8",
        &["dsa_indexer_prefill_fp8", "dsa_topk", "sparse_mla_fp8"],
    ),
    (
        "dsa_decode_batch_fp8",
        &[
            "dsa_indexer_decode_batch_fp8",
            "dsa_topk_batch",
            "sparse_mla_batch_fp8",
        ],
    ),
    ("gdn_gates", &["gdn_gates"]),
    ("kda_gates", &["kda_gates"]),
    ("gated_rmsnorm_silu", &["gated_rmsnorm_silu"]),
    ("gated_rmsnorm_sigmoid", &["gated_rmsnorm_sigmoid"]),
    ("short_conv", &["short_conv"]),
    ("short_conv_decode", &["short_conv_decode"]),
    ("zero_state", &["zero_state"]),
    ("delta_rule_recurrent", &["delta_rule_recurrent"]),
    ("delta_rule_recurrent_kda", &["delta_rule_recurrent_kda"]),
    ("delta_rule_chunked", &["delta_rule_chunked"]),
    ("delta_rule_chunked_kda", &["delta_rule_chunked_kda"]),
    ("copy", &["copy"]),
    ("expert_gemm", &["expert_gemm"]),
    ("expert_gemm_mxfp4", &["expert_gemm_mxfp4"]),
    ("expert_gemm_fp8", &["expert_gemm_fp8"]),
    ("dequant_mxfp4", &["dequant_mxfp4", "expert_gemm"]),
    ("swiglu", &["swiglu"]),
    ("swiglu_clamped", &["swiglu_clamped"]),
    ("moe_grouped_bias", &["moe_grouped_bias"]),
    (
        "linear_stored",
        &[
            "linear_bf16",
            "act_quant_fp8",
            "linear_fp8",
            "split_k_reduce",
        ],
    ),
    (
        "grouped_linear_stored",
        &[
            "moe_grouped_linear_bf16",
            "moe_grouped_linear_fp8",
            "moe_grouped_linear_mxfp4",
            "moe_grouped_linear_int4",
        ],
    ),
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random shapes for every other registered operator, on every preset: the raw draws become
    /// each operator's own dims (heads, head dims, lengths, page sizes, experts, top-k, vocab...),
    /// a power of two one time in four and any value otherwise.
    #[test]
    fn random_shapes_keep_the_invariants_of_model_operators(
        x in prop::array::uniform8(0usize..1 << 24),
    ) {
        for device in DevicePreset::builtin_names() {
            for (op, _) in MODEL_RUNNERS {
                for (what, r) in run_model_op(device, op, &x) {
                    check(device, &what, r);
                }
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
            for op in ["gemm", "gemm_db", "gemm_fp8"] {
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
