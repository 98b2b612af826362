//! Tile-shape sweeps: run every configuration of a kernel's tunable space cost-only and rank them.
//!
//! A configuration whose tiles do not fit in SRAM (or that the device cannot run) is kept in the
//! result with its error, counted as infinitely slow rather than failing the sweep.
//!
//! [`sweep`] is the plain loop `day0 kernel gemm --sweep` uses; [`tune()`] is `day0 tune`: a kernel
//! family's implementations × tunable spaces at a [`Shape`], evaluated in parallel and ranked
//! stably (the same table at any thread count), each configuration's bound read off its report,
//! the problem's [`Roofline`] lower bound from the preset, the winner explained ([`explain`]) and
//! spot-checked functionally at [`Shape::reduced`], the result cached as JSON ([`cache_key`]).

use accel_sim::{Report, SimError};
use dsl_core::{Backend, Config, KernelMeta, Launcher, Tensor};
use kernels::attention::prefill::{run_prefill_with, PrefillCase, PrefillKernel};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use kernels::hand_tuned::paged_decode::DecodeShape;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One point of a sweep.
#[derive(Debug)]
pub struct SweepPoint {
    /// The tunable values.
    pub config: Config,
    /// The report, or why the configuration cannot run.
    pub outcome: Result<Report, SimError>,
}

/// Runs `launch` for every configuration and sorts: fitting ones by cycles (ties by config order),
/// then the ones that failed.
pub fn sweep(
    space: Vec<Config>,
    mut launch: impl FnMut(&Config) -> Result<Report, SimError>,
) -> Vec<SweepPoint> {
    let mut points: Vec<SweepPoint> = space
        .into_iter()
        .map(|config| {
            let outcome = launch(&config);
            SweepPoint { config, outcome }
        })
        .collect();
    points.sort_by_key(|p| match &p.outcome {
        Ok(r) => (0, r.cycles),
        Err(_) => (1, 0),
    });
    points
}

/// The fastest configuration that runs, if any.
pub fn best(points: &[SweepPoint]) -> Option<&SweepPoint> {
    points.iter().find(|p| p.outcome.is_ok())
}

// -------------------------------------------------------------------------------------------------
// `day0 tune`: a kernel's whole tunable space at a real shape, ranked, explained, cached.
// -------------------------------------------------------------------------------------------------

/// Version of the cache file layout and of what a row holds; bump it when either changes so old
/// files are not read as new ones.
const CACHE_SCHEMA: u32 = 1;

/// Seed of the spot check's random inputs (fixed: a tuning result must not depend on it).
const SPOT_SEED: u64 = 7;

/// How many of the fastest configurations the functional spot check runs.
const SPOT_CHECKS: usize = 3;

/// A utilisation at or above this fraction names the resource that bounds a configuration; when
/// none reaches it, nothing is saturated and the time goes to latency (DMA round trips,
/// dependencies, the tail of the last wave).
const SATURATED: f64 = 0.5;

/// The kernels `day0 tune` knows how to launch on a shape: each family shares a shape and a
/// runner, and holds one or more registered implementations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `C[M×N] = A[M×K]·B[K×N]`: `gemm`, `gemm_db`, `gemm_pipelined`, `gemm_persistent`.
    Gemm,
    /// Causal flash-attention prefill: `flash_prefill`, `flash_prefill_pipelined`.
    Prefill,
    /// DSA sparse latent attention over each query's top-k rows: `sparse_mla`.
    SparseMla,
    /// Split-KV paged decode (flash-decoding) and its combine: `paged_decode_split` and its
    /// hand-tuned swap `paged_decode_hand`.
    Decode,
    /// Per-expert GEMM with MXFP4 weights dequantized on chip: `expert_gemm_mxfp4` and its
    /// hand-tuned swap `expert_gemm_mxfp4_hand`.
    ExpertMxfp4,
}

/// Every family, in the order names are looked up and listed.
const FAMILIES: [Family; 5] = [
    Family::Gemm,
    Family::Prefill,
    Family::SparseMla,
    Family::Decode,
    Family::ExpertMxfp4,
];

impl Family {
    /// The implementations of this family, in registry order.
    pub fn implementations(self) -> Vec<&'static KernelMeta> {
        use kernels::attention::prefill::{flash_prefill, flash_prefill_pipelined};
        use kernels::gemm::{gemm, gemm_db, gemm_persistent, gemm_pipelined};
        match self {
            Family::Gemm => vec![
                &gemm::META,
                &gemm_db::META,
                &gemm_pipelined::META,
                &gemm_persistent::META,
                &kernels::hand_tuned::gemm::META,
            ],
            Family::Prefill => vec![&flash_prefill::META, &flash_prefill_pipelined::META],
            Family::SparseMla => vec![&kernels::attention::sparse::sparse_mla::META],
            Family::Decode => vec![
                &kernels::attention::decode::paged_decode_split::META,
                &kernels::hand_tuned::paged_decode::META,
            ],
            Family::ExpertMxfp4 => vec![
                &kernels::moe::expert_gemm::expert_gemm_mxfp4::META,
                &kernels::hand_tuned::expert_gemm_mxfp4::META,
            ],
        }
    }

    /// The registry operator of this family.
    pub fn op(self) -> &'static str {
        match self {
            Family::Gemm => "gemm",
            Family::Prefill => "attention_prefill",
            Family::SparseMla => "sparse_mla",
            Family::Decode => "attention_decode",
            Family::ExpertMxfp4 => "expert_gemm_mxfp4",
        }
    }

    /// The `--shape` grammar of this family, for help and error messages.
    pub fn shape_help(self) -> &'static str {
        match self {
            Family::Gemm => "MxNxK (e.g. 4096x4096x4096) or m=4096,n=4096,k=4096",
            Family::Prefill => {
                "seq=S,heads=H[,kv_heads=HKV][,head_dim=128][,v_head_dim=D][,ctx=S] \
                 (e.g. seq=4096,heads=32,head_dim=128)"
            }
            Family::SparseMla => {
                "ctx=C[,seq=1][,heads=128][,topk=2048][,kv_lora=512][,rope=64][,page=64] \
                 (e.g. seq=1,ctx=65536: one DeepSeek-V3.2 decode step)"
            }
            Family::Decode => {
                "ctx=C,heads=H[,kv_heads=H][,head_dim=128][,v_head_dim=D][,page=64][,splits=4] \
                 (e.g. ctx=8192,heads=32,kv_heads=8)"
            }
            Family::ExpertMxfp4 => {
                "experts=E,tokens=T,n=N,k=K (K a multiple of 32; tokens per expert) \
                 (e.g. experts=8,tokens=16,n=2048,k=7168)"
            }
        }
    }

    /// The element type tuned when `--dtype` is not given: bf16 for GEMM and prefill, f32 for
    /// sparse MLA (the model keeps its latent cache in f32, as `kernels::attention::sparse` runs).
    pub fn default_dtype(self) -> GemmDtype {
        match self {
            Family::SparseMla => GemmDtype::F32,
            _ => GemmDtype::Bf16,
        }
    }
}

/// What `day0 tune <kernel>` resolved to: the family and the implementations to sweep.
#[derive(Debug, Clone)]
pub struct Target {
    /// The family (shape grammar and runner).
    pub family: Family,
    /// The implementations swept, in registry order.
    pub impls: Vec<&'static KernelMeta>,
}

/// Resolves a kernel name: a registry operator (`gemm`, `attention_prefill`, `sparse_mla`) tunes
/// every implementation of it; an implementation name (`gemm_db`, `flash_prefill`) tunes that
/// one. `only`, when not empty, restricts an operator to the named implementations.
pub fn resolve(kernel: &str, only: &[String]) -> Result<Target, String> {
    let families = FAMILIES;
    let (family, mut impls) = if let Some(f) = families.iter().find(|f| f.op() == kernel) {
        (*f, f.implementations())
    } else if let Some((f, m)) = families.iter().find_map(|f| {
        f.implementations()
            .into_iter()
            .find(|m| m.name == kernel)
            .map(|m| (*f, m))
    }) {
        (f, vec![m])
    } else {
        let mut names: Vec<&str> = Vec::new();
        for f in families {
            names.push(f.op());
            names.extend(f.implementations().iter().map(|m| m.name));
        }
        names.dedup();
        return Err(format!(
            "`{kernel}`: no tunable kernel of that name; `day0 tune` and `day0 compare` know \
             {} (`day0 kernels` lists every registered implementation)",
            names.join(", ")
        ));
    };
    if !only.is_empty() {
        let known: Vec<&str> = impls.iter().map(|m| m.name).collect();
        for name in only {
            if !known.contains(&name.as_str()) {
                return Err(format!(
                    "--impl {name}: not an implementation of `{kernel}` (choose from {})",
                    known.join(", ")
                ));
            }
        }
        impls.retain(|m| only.iter().any(|o| o == m.name));
    }
    Ok(Target { family, impls })
}

/// A problem shape of one family. Field names are the `--shape` keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "family", rename_all = "snake_case")]
pub enum Shape {
    /// GEMM `M×N×K`.
    Gemm {
        /// Rows of A and C.
        m: usize,
        /// Columns of B and C.
        n: usize,
        /// Reduction depth.
        k: usize,
    },
    /// Causal prefill: the last `seq` positions of a context of `ctx` tokens.
    Prefill {
        /// Query tokens.
        seq: usize,
        /// Context length (≥ seq).
        ctx: usize,
        /// Query heads.
        heads: usize,
        /// Key/value heads (divides `heads`).
        kv_heads: usize,
        /// Query/key head dimension.
        head_dim: usize,
        /// Value head dimension.
        v_head_dim: usize,
    },
    /// Sparse latent MQA: `seq` query tokens, each attending `min(topk, position + 1)` rows of
    /// a paged latent cache of `ctx` tokens.
    SparseMla {
        /// Query tokens (1 for decode).
        seq: usize,
        /// Context length (≥ seq).
        ctx: usize,
        /// Attention heads.
        heads: usize,
        /// `index_topk`: rows each query attends.
        topk: usize,
        /// `kv_lora_rank`: the value columns of a latent row.
        kv_lora: usize,
        /// `qk_rope_head_dim`: the rest of a latent row.
        rope: usize,
        /// Tokens per cache page.
        page: usize,
    },
    /// Expert GEMM: `experts` experts, each `tokens × k` activations times its `n × k` MXFP4
    /// weight transposed.
    Expert {
        /// Experts.
        experts: usize,
        /// Tokens per expert.
        tokens: usize,
        /// Output columns.
        n: usize,
        /// Reduction depth (a multiple of 32).
        k: usize,
    },
    /// One decode token over a paged cache of `ctx` tokens, split over `splits` context ranges
    /// (flash-decoding), then combined.
    Decode(DecodeShape),
}

/// Parses `key=value,...` into a map, every value a positive integer.
fn parse_pairs(text: &str, keys: &[&str]) -> Result<BTreeMap<String, usize>, String> {
    let mut out = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not key=value"))?;
        let k = k.trim().to_ascii_lowercase();
        if !keys.contains(&k.as_str()) {
            return Err(format!("unknown key `{k}` (keys: {})", keys.join(", ")));
        }
        let v: usize = v
            .trim()
            .parse()
            .map_err(|_| format!("{k} = `{}` is not a positive integer", v.trim()))?;
        if v == 0 {
            return Err(format!("{k} must be at least 1"));
        }
        if out.insert(k.clone(), v).is_some() {
            return Err(format!("{k} is given twice"));
        }
    }
    Ok(out)
}

impl Shape {
    /// Parses `--shape` for `family` (grammar: [`Family::shape_help`]). Errors name the flag, what
    /// is wrong and the grammar.
    pub fn parse(family: Family, text: &str) -> Result<Shape, String> {
        Shape::parse_inner(family, text).map_err(|e| {
            format!(
                "--shape `{text}`: {e}; {} takes {}",
                family.op(),
                family.shape_help()
            )
        })
    }

    fn parse_inner(family: Family, text: &str) -> Result<Shape, String> {
        let need = |m: &BTreeMap<String, usize>, k: &str| {
            m.get(k).copied().ok_or_else(|| format!("{k} is required"))
        };
        let shape = match family {
            Family::Gemm => {
                let dims: Vec<&str> = text.split(['x', 'X']).collect();
                if !text.contains('=') && dims.len() == 3 {
                    let n: Result<Vec<usize>, _> = dims.iter().map(|d| d.trim().parse()).collect();
                    match n {
                        Ok(v) if v.iter().all(|d| *d > 0) => Shape::Gemm {
                            m: v[0],
                            n: v[1],
                            k: v[2],
                        },
                        _ => return Err("M, N and K must be positive integers".into()),
                    }
                } else {
                    let m = parse_pairs(text, &["m", "n", "k"])?;
                    Shape::Gemm {
                        m: need(&m, "m")?,
                        n: need(&m, "n")?,
                        k: need(&m, "k")?,
                    }
                }
            }
            Family::Prefill => {
                let keys = ["seq", "ctx", "heads", "kv_heads", "head_dim", "v_head_dim"];
                let m = parse_pairs(text, &keys)?;
                let seq = need(&m, "seq")?;
                let heads = need(&m, "heads")?;
                let head_dim = m.get("head_dim").copied().unwrap_or(128);
                Shape::Prefill {
                    seq,
                    ctx: m.get("ctx").copied().unwrap_or(seq),
                    heads,
                    kv_heads: m.get("kv_heads").copied().unwrap_or(heads),
                    head_dim,
                    v_head_dim: m.get("v_head_dim").copied().unwrap_or(head_dim),
                }
            }
            Family::SparseMla => {
                let keys = ["seq", "ctx", "heads", "topk", "kv_lora", "rope", "page"];
                let m = parse_pairs(text, &keys)?;
                let get = |k: &str, d: usize| m.get(k).copied().unwrap_or(d);
                Shape::SparseMla {
                    seq: get("seq", 1),
                    ctx: need(&m, "ctx")?,
                    heads: get("heads", 128),
                    topk: get("topk", 2048),
                    kv_lora: get("kv_lora", 512),
                    rope: get("rope", 64),
                    page: get("page", 64),
                }
            }
            Family::Decode => {
                let keys = [
                    "ctx",
                    "heads",
                    "kv_heads",
                    "head_dim",
                    "v_head_dim",
                    "page",
                    "splits",
                ];
                let m = parse_pairs(text, &keys)?;
                let heads = need(&m, "heads")?;
                let head_dim = m.get("head_dim").copied().unwrap_or(128);
                Shape::Decode(DecodeShape {
                    ctx: need(&m, "ctx")?,
                    heads,
                    kv_heads: m.get("kv_heads").copied().unwrap_or(heads),
                    head_dim,
                    v_head_dim: m.get("v_head_dim").copied().unwrap_or(head_dim),
                    page: m.get("page").copied().unwrap_or(64),
                    splits: m.get("splits").copied().unwrap_or(4),
                })
            }
            Family::ExpertMxfp4 => {
                let m = parse_pairs(text, &["experts", "tokens", "n", "k"])?;
                Shape::Expert {
                    experts: need(&m, "experts")?,
                    tokens: need(&m, "tokens")?,
                    n: need(&m, "n")?,
                    k: need(&m, "k")?,
                }
            }
        };
        shape.validate()?;
        Ok(shape)
    }

    /// Checks the relations between dimensions that a single value cannot break.
    fn validate(&self) -> Result<(), String> {
        match *self {
            Shape::Gemm { .. } => Ok(()),
            Shape::Expert { k, .. } if k % 32 != 0 => {
                Err(format!("k = {k} is not a multiple of 32 (the MXFP4 block)"))
            }
            Shape::Expert { .. } => Ok(()),
            Shape::Prefill {
                seq,
                ctx,
                heads,
                kv_heads,
                ..
            } => {
                if heads % kv_heads != 0 {
                    return Err(format!(
                        "heads = {heads} is not a multiple of kv_heads = {kv_heads}"
                    ));
                }
                if seq > ctx {
                    return Err(format!(
                        "seq = {seq} > ctx = {ctx} (the queries are the last seq positions)"
                    ));
                }
                Ok(())
            }
            Shape::Decode(DecodeShape {
                heads, kv_heads, ..
            }) => {
                if heads % kv_heads != 0 {
                    return Err(format!(
                        "heads = {heads} is not a multiple of kv_heads = {kv_heads}"
                    ));
                }
                Ok(())
            }
            Shape::SparseMla { seq, ctx, .. } => {
                if seq > ctx {
                    return Err(format!(
                        "seq = {seq} > ctx = {ctx} (the queries are the last seq positions)"
                    ));
                }
                Ok(())
            }
        }
    }

    /// The shape as `--shape` would spell it (canonical: every key, fixed order), for the cache
    /// key and the report.
    pub fn canonical(&self) -> String {
        match *self {
            Shape::Gemm { m, n, k } => format!("{m}x{n}x{k}"),
            Shape::Expert {
                experts,
                tokens,
                n,
                k,
            } => format!("experts={experts},tokens={tokens},n={n},k={k}"),
            Shape::Prefill {
                seq,
                ctx,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
            } => format!(
                "seq={seq},ctx={ctx},heads={heads},kv_heads={kv_heads},head_dim={head_dim},v_head_dim={v_head_dim}"
            ),
            Shape::SparseMla {
                seq,
                ctx,
                heads,
                topk,
                kv_lora,
                rope,
                page,
            } => format!(
                "seq={seq},ctx={ctx},heads={heads},topk={topk},kv_lora={kv_lora},rope={rope},page={page}"
            ),
            Shape::Decode(DecodeShape {
                ctx,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
                page,
                splits,
            }) => format!(
                "ctx={ctx},heads={heads},kv_heads={kv_heads},head_dim={head_dim},v_head_dim={v_head_dim},page={page},splits={splits}"
            ),
        }
    }

    /// Values a functional run of this shape holds (inputs, outputs and, for attention, one
    /// head's score matrix in the reference), for the host-memory check.
    pub fn functional_elements(&self) -> u128 {
        let u = |x: usize| x as u128;
        match *self {
            Shape::Gemm { m, n, k } => u(m) * u(k) + u(k) * u(n) + u(m) * u(n),
            Shape::Expert {
                experts,
                tokens,
                n,
                k,
            } => u(experts) * (u(tokens) * u(k) + u(n) * u(k) + u(tokens) * u(n)),
            Shape::Prefill {
                seq,
                ctx,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
            } => {
                let w = u(head_dim) + u(v_head_dim);
                u(seq) * u(heads) * w + u(ctx) * u(kv_heads) * w + u(seq) * u(ctx) / 2
            }
            Shape::SparseMla {
                seq,
                ctx,
                heads,
                topk,
                kv_lora,
                rope,
                ..
            } => {
                let d = u(kv_lora) + u(rope);
                u(ctx) * d + 2 * u(seq) * u(heads) * d + u(seq) * u(topk)
            }
            Shape::Decode(DecodeShape {
                ctx,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
                ..
            }) => {
                let w = u(head_dim) + u(v_head_dim);
                u(ctx) * u(kv_heads) * w + u(heads) * w
            }
        }
    }

    /// The shape of the functional spot check: small enough to compute on the host with the f64
    /// reference in about a second, large enough to cross tile edges (sizes that are not
    /// multiples of the tiles exercise the masked ragged edges), with the same head geometry.
    pub fn reduced(&self) -> Shape {
        match *self {
            Shape::Gemm { m, n, k } => Shape::Gemm {
                m: m.min(300),
                n: n.min(284),
                k: k.min(272),
            },
            Shape::Expert {
                experts,
                tokens,
                n,
                k,
            } => Shape::Expert {
                experts: experts.min(2),
                tokens: tokens.min(40),
                n: n.min(200),
                k: k.min(288),
            },
            Shape::Prefill {
                seq,
                ctx,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
            } => {
                let group = heads / kv_heads;
                let kv = kv_heads.min(if group >= 4 { 1 } else { 2 });
                let s = seq.min(200);
                Shape::Prefill {
                    seq: s,
                    ctx: s + (ctx - seq).min(56),
                    heads: kv * group,
                    kv_heads: kv,
                    head_dim,
                    v_head_dim,
                }
            }
            Shape::SparseMla {
                seq,
                ctx,
                heads,
                topk,
                kv_lora,
                rope,
                page,
            } => {
                let s = seq.min(3);
                Shape::SparseMla {
                    seq: s,
                    ctx: s.max(ctx.min(300)),
                    heads: heads.min(20),
                    topk: topk.min(150),
                    kv_lora,
                    rope,
                    page,
                }
            }
            Shape::Decode(d) => {
                let group = d.heads / d.kv_heads;
                let kv = d.kv_heads.min(2);
                Shape::Decode(DecodeShape {
                    ctx: d.ctx.min(700),
                    heads: kv * group,
                    kv_heads: kv,
                    ..d
                })
            }
        }
    }

    /// The problem's useful matrix FLOP and the fewest HBM bytes any kernel must move (every
    /// input read once, every output written once), for the roofline lower bound.
    fn work(&self, elem: u64) -> (f64, f64) {
        match *self {
            Shape::Gemm { m, n, k } => {
                let (m, n, k) = (m as f64, n as f64, k as f64);
                // A and B in the input dtype, C in f32 (the kernels accumulate and store f32).
                (2.0 * m * n * k, (m * k + k * n) * elem as f64 + m * n * 4.0)
            }
            Shape::Expert {
                experts,
                tokens,
                n,
                k,
            } => {
                let (e, t, n, k) = (experts as f64, tokens as f64, n as f64, k as f64);
                // Activations in the input dtype, weights packed (4.25 bits), output f32.
                let weights = e * n * (k / 2.0 + k / 32.0);
                (
                    2.0 * e * t * n * k,
                    e * t * k * elem as f64 + weights + e * t * n * 4.0,
                )
            }
            Shape::Prefill {
                seq,
                ctx,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
            } => {
                // Causal: query i (position ctx − seq + i) attends ctx − seq + i + 1 keys.
                let keys: f64 = (0..seq).map(|i| (ctx - seq + i + 1) as f64).sum();
                let flop = 2.0 * heads as f64 * keys * (head_dim + v_head_dim) as f64;
                let elems = seq * heads * (head_dim + v_head_dim)
                    + ctx * kv_heads * (head_dim + v_head_dim);
                (flop, (elems as u64 * elem) as f64)
            }
            Shape::SparseMla {
                seq,
                ctx,
                heads,
                topk,
                kv_lora,
                rope,
                ..
            } => {
                let d = kv_lora + rope;
                let rows: f64 = (0..seq).map(|t| topk.min(ctx - seq + t + 1) as f64).sum();
                let flop = 2.0 * heads as f64 * rows * (d + kv_lora) as f64;
                // q and o, the selections (i32), and at least the rows of the widest selection.
                let distinct = topk.min(ctx) as u64;
                let bytes = (seq * heads * (d + kv_lora)) as u64 * elem
                    + (seq * topk) as u64 * 4
                    + distinct * d as u64 * elem;
                (flop, bytes as f64)
            }
            Shape::Decode(DecodeShape {
                ctx,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
                ..
            }) => {
                let flop = 2.0 * heads as f64 * ctx as f64 * (head_dim + v_head_dim) as f64;
                // The query and output once, every cached key and value once.
                let elems =
                    heads * (head_dim + v_head_dim) + ctx * kv_heads * (head_dim + v_head_dim);
                (flop, (elems as u64 * elem) as f64)
            }
        }
    }
}

fn elem_bytes(dtype: GemmDtype) -> u64 {
    match dtype {
        GemmDtype::Bf16 => 2,
        GemmDtype::F32 => 4,
    }
}

fn dtype_name(dtype: GemmDtype) -> &'static str {
    match dtype {
        GemmDtype::Bf16 => "bf16",
        GemmDtype::F32 => "f32",
    }
}

/// Parses `--dtype`.
pub fn parse_dtype(text: &str) -> Result<GemmDtype, String> {
    match text {
        "bf16" => Ok(GemmDtype::Bf16),
        "f32" => Ok(GemmDtype::F32),
        other => Err(format!("--dtype {other}: choose bf16 or f32")),
    }
}

/// The kernel family's stated tolerance on the max relative error against the f64 reference
/// (the same as `day0 kernel`): bf16 1e-2, f32 1e-5.
pub fn tolerance(dtype: GemmDtype) -> f64 {
    match dtype {
        GemmDtype::Bf16 => 1e-2,
        GemmDtype::F32 => 1e-5,
    }
}

/// The roofline lower bound of a problem on a device: no kernel can take less than the time its
/// useful matrix FLOP take at the matrix unit's peak on every core, nor less than reading each
/// input and writing each output once at the HBM bandwidth.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Roofline {
    /// Useful matrix FLOP of the problem.
    pub flop: f64,
    /// Fewest HBM bytes: inputs read once, outputs written once.
    pub min_hbm_bytes: f64,
    /// Matrix time in cycles: `flop / (flop_per_cycle[dtype] · cores)`.
    pub compute_cycles: f64,
    /// HBM time in cycles: `min_hbm_bytes / HBM bytes per cycle`.
    pub memory_cycles: f64,
    /// The larger of the two, rounded up.
    pub cycles: u64,
    /// `cycles` in microseconds at the preset clock.
    pub time_us: f64,
    /// `compute` or `memory`: which term is larger.
    pub bound: String,
}

impl Roofline {
    /// The bound of `shape` in `dtype` on `preset` (figures from the preset: matrix rate at the
    /// dtype, cores, HBM bandwidth, clock).
    pub fn of(
        shape: &Shape,
        dtype: GemmDtype,
        preset: &accel_sim::DevicePreset,
    ) -> Result<Roofline, String> {
        let rate =
            preset
                .matrix
                .flop_per_cycle
                .get(dtype_name(dtype))
                .copied()
                .ok_or_else(|| {
                    format!(
                    "device `{}` has no {} matrix rate ([matrix.flop_per_cycle]); try --dtype {}",
                    preset.name,
                    dtype_name(dtype),
                    if dtype == GemmDtype::Bf16 { "f32" } else { "bf16" }
                )
                })?;
        let (flop, bytes) = shape.work(elem_bytes(dtype));
        let compute = flop / (rate * preset.cores as f64);
        let memory = bytes / preset.hbm_bytes_per_cycle();
        let cycles = compute.max(memory).ceil() as u64;
        Ok(Roofline {
            flop,
            min_hbm_bytes: bytes,
            compute_cycles: compute,
            memory_cycles: memory,
            cycles,
            time_us: preset.cycles_to_us(cycles),
            bound: if compute >= memory {
                "compute"
            } else {
                "memory"
            }
            .into(),
        })
    }
}

/// Whether a configuration ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// It ran; its row has cycles.
    Ok,
    /// Its live tiles need more SRAM than a core has.
    SramOverflow,
    /// The launch refused it (a tile that does not cover a dimension of the shape, or another
    /// launch error: the row's `error` says which).
    Refused,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::SramOverflow => "SRAM overflow",
            Status::Refused => "refused",
        }
    }
}

/// One configuration of the sweep (one `configs` entry of `--json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    /// Implementation (kernel) name.
    pub implementation: String,
    /// Tunable values.
    pub config: BTreeMap<String, i64>,
    /// Ran, overflowed SRAM, or refused.
    pub status: Status,
    /// Simulated cycles (runs only).
    pub cycles: Option<u64>,
    /// Time in µs at the preset clock.
    pub time_us: Option<f64>,
    /// What limits it: `matrix`, `vector`, `hbm`, `l2` (that resource at least half busy over the
    /// launch; the busiest) or `latency` (none is: DMA round trips, dependencies, the last wave's
    /// tail).
    pub bound: Option<String>,
    /// Busy fraction over the launch of each engine (`matrix`, `vector`, `dma_in`, `dma_out`,
    /// averaged over cores) and of each memory level (`hbm`, `l2`: bytes moved over what the
    /// bandwidth allows in the same time).
    pub utilisation: BTreeMap<String, f64>,
    /// Peak live SRAM on one core.
    pub sram_bytes: Option<u64>,
    /// HBM bytes moved.
    pub hbm_bytes: Option<u64>,
    /// Matrix FLOP issued (padding of ragged tiles included).
    pub matrix_flop: Option<u64>,
    /// DMA-in cycles not hidden by compute on the core that finishes last.
    pub exposed_dma_cycles: Option<u64>,
    /// Programs launched.
    pub programs: Option<u64>,
    /// Waves of programs over the cores.
    pub waves: Option<u64>,
    /// `cycles` over the roofline lower bound (1.0 = at the bound).
    pub over_roofline: Option<f64>,
    /// Why it did not run.
    pub error: Option<String>,
}

impl Row {
    fn config_text(&self) -> String {
        dsl_core::Config(self.config.clone()).to_string()
    }

    fn label(&self) -> String {
        format!("{} {}", self.implementation, self.config_text())
    }

    fn from_outcome(
        meta: &KernelMeta,
        config: &dsl_core::Config,
        outcome: Result<accel_sim::Report, accel_sim::SimError>,
        preset: &accel_sim::DevicePreset,
        roof: &Roofline,
    ) -> Row {
        let mut row = Row {
            implementation: meta.name.to_string(),
            config: config.0.clone(),
            status: Status::Ok,
            cycles: None,
            time_us: None,
            bound: None,
            utilisation: BTreeMap::new(),
            sram_bytes: None,
            hbm_bytes: None,
            matrix_flop: None,
            exposed_dma_cycles: None,
            programs: None,
            waves: None,
            over_roofline: None,
            error: None,
        };
        match outcome {
            Ok(r) => {
                let (bound, util) = bound_of(&r, preset);
                row.cycles = Some(r.cycles);
                row.time_us = Some(r.time_us);
                row.bound = Some(bound);
                row.utilisation = util;
                row.sram_bytes = Some(r.sram_peak_bytes);
                row.hbm_bytes = Some(r.hbm_bytes);
                row.matrix_flop = Some(r.matrix_flop);
                row.exposed_dma_cycles = Some(r.exposed_dma_cycles);
                row.programs = Some(r.programs);
                row.waves = Some(r.waves);
                row.over_roofline = Some(r.cycles as f64 / roof.cycles.max(1) as f64);
            }
            Err(e) => {
                row.status = match e {
                    accel_sim::SimError::SramOverflow { .. } => Status::SramOverflow,
                    _ => Status::Refused,
                };
                row.error = Some(e.to_string());
            }
        }
        row
    }
}

/// What limits a launch, and the utilisations that say so: each engine's busy fraction from the
/// report, and each memory level's traffic over its bandwidth for the launch's duration.
fn bound_of(r: &accel_sim::Report, p: &accel_sim::DevicePreset) -> (String, BTreeMap<String, f64>) {
    let cycles = r.cycles.max(1) as f64;
    let mut util: BTreeMap<String, f64> = r
        .engine_utilization
        .iter()
        .map(|(k, v)| (k.to_string(), *v))
        .collect();
    util.insert(
        "hbm".into(),
        r.hbm_bytes as f64 / p.hbm_bytes_per_cycle() / cycles,
    );
    util.insert(
        "l2".into(),
        (r.l2_bytes + r.hbm_read_bytes) as f64 / p.l2_bytes_per_cycle() / cycles,
    );
    let busiest = ["matrix", "vector", "hbm", "l2"]
        .iter()
        .map(|k| (*k, util.get(*k).copied().unwrap_or(0.0)))
        .fold(("latency", 0.0), |a, b| if b.1 > a.1 { b } else { a });
    let bound = if busiest.1 >= SATURATED {
        busiest.0
    } else {
        "latency"
    };
    (bound.to_string(), util)
}

/// The functional check of one configuration at the reduced shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SpotCheck {
    /// Implementation.
    pub implementation: String,
    /// Tunable values.
    pub config: BTreeMap<String, i64>,
    /// The reduced shape it ran at (canonical `--shape` text).
    pub shape: String,
    /// Max relative error against the f64 reference (`None` when the run failed).
    pub max_rel_error: Option<f64>,
    /// The tolerance it is held to.
    pub tolerance: f64,
    /// Within tolerance.
    pub ok: bool,
    /// Why the run failed, when it did.
    pub error: Option<String>,
}

/// The result of `day0 tune` (the `--json` object; also the cache file).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TuneResult {
    /// What was asked for (`gemm`, `flash_prefill`...).
    pub kernel: String,
    /// The family's registry operator.
    pub op: String,
    /// The shape, canonical.
    pub shape: Shape,
    /// The shape as `--shape` text.
    pub shape_text: String,
    /// Element dtype of the inputs.
    pub dtype: String,
    /// Device preset name.
    pub device: String,
    /// Preset clock (time_us = cycles / clock).
    pub clock_ghz: f64,
    /// The roofline lower bound of the problem.
    pub roofline: Roofline,
    /// Configurations evaluated.
    pub evaluated: usize,
    /// Configurations that ran.
    pub ran: usize,
    /// The fastest configuration that ran (`None` when none did).
    pub best: Option<Row>,
    /// One line on why the best wins, from the reports.
    pub why: String,
    /// Functional checks of the fastest configurations at a reduced shape.
    pub spot_checks: Vec<SpotCheck>,
    /// Every configuration: those that ran by cycles (ties in enumeration order), then SRAM
    /// overflows, then refusals.
    pub configs: Vec<Row>,
    /// Served from the cache (set when printed; `false` in the file).
    pub cached: bool,
    /// The cache key (hex).
    pub cache_key: String,
}

impl TuneResult {
    /// Whether every spot check passed (and there was something to check).
    pub fn verified(&self) -> bool {
        !self.spot_checks.is_empty() && self.spot_checks.iter().all(|s| s.ok)
    }
}

/// Everything a tuning run needs besides the target.
#[derive(Debug, Clone)]
pub struct TuneRequest {
    /// The name as the user gave it (reported back).
    pub kernel: String,
    /// Family and implementations.
    pub target: Target,
    /// The shape.
    pub shape: Shape,
    /// Input dtype.
    pub dtype: GemmDtype,
    /// The device.
    pub preset: accel_sim::DevicePreset,
    /// Host threads for the sweep (`None`: rayon's default). Results do not depend on it.
    pub threads: Option<usize>,
}

/// Launches one configuration of `meta` at `shape` on `launcher` (cost-only or functional); the
/// report has `max_rel_error` set in functional runs.
pub fn evaluate(
    launcher: &Launcher,
    meta: &KernelMeta,
    config: &dsl_core::Config,
    shape: &Shape,
    dtype: GemmDtype,
) -> Result<accel_sim::Report, accel_sim::SimError> {
    evaluate_traced(launcher, meta, config, shape, dtype).map(|(report, _)| report)
}

/// [`evaluate`], with the launch's timeline when the launcher records one (`with_trace`) and the
/// kernel runs as one launch (the paged decode chains its combine: no timeline).
pub fn evaluate_traced(
    launcher: &Launcher,
    meta: &KernelMeta,
    config: &dsl_core::Config,
    shape: &Shape,
    dtype: GemmDtype,
) -> Result<(accel_sim::Report, Option<accel_sim::trace::ChromeTrace>), accel_sim::SimError> {
    let refuse = |message: String| accel_sim::SimError::Launch {
        kernel: meta.name.to_string(),
        message,
    };
    match *shape {
        Shape::Gemm { m, n, k } => {
            let variant = [
                GemmVariant::Naive,
                GemmVariant::DoubleBuffered,
                GemmVariant::Pipelined,
                GemmVariant::Persistent,
                GemmVariant::HandTuned,
            ]
            .into_iter()
            .find(|v| v.meta().name == meta.name)
            .ok_or_else(|| refuse("not a GEMM implementation".into()))?;
            let case = GemmCase {
                m,
                n,
                k,
                dtype,
                variant,
                config: config.clone(),
                seed: SPOT_SEED,
            };
            let l = run_gemm(launcher, &case)?.launch;
            Ok((l.report, l.trace))
        }
        Shape::Prefill {
            seq,
            ctx,
            heads,
            kv_heads,
            head_dim,
            v_head_dim,
        } => {
            let kernel = [PrefillKernel::Flash, PrefillKernel::Pipelined]
                .into_iter()
                .find(|k| k.meta().name == meta.name)
                .ok_or_else(|| refuse("not a prefill implementation".into()))?;
            let case = PrefillCase {
                window: 0,
                sinks: false,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
                sq: seq,
                skv: ctx,
                dtype,
                config: config.clone(),
                seed: SPOT_SEED,
            };
            let l = run_prefill_with(launcher, &case, kernel)?.launch;
            Ok((l.report, l.trace))
        }
        Shape::SparseMla { .. } => match dtype {
            GemmDtype::F32 => run_sparse_mla::<f32>(launcher, config, shape),
            GemmDtype::Bf16 => run_sparse_mla::<half::bf16>(launcher, config, shape),
        },
        Shape::Decode(shape) => {
            use kernels::hand_tuned::paged_decode::run_case;
            let hand_tuned = meta.name == kernels::hand_tuned::paged_decode::META.name;
            match dtype {
                GemmDtype::F32 => run_case::<f32>(launcher, hand_tuned, &shape, config, SPOT_SEED),
                GemmDtype::Bf16 => {
                    run_case::<half::bf16>(launcher, hand_tuned, &shape, config, SPOT_SEED)
                }
            }
        }
        .map(|r| (r, None)),
        Shape::Expert {
            experts,
            tokens,
            n,
            k,
        } => {
            use kernels::hand_tuned::expert_gemm_mxfp4 as hand;
            if dtype != GemmDtype::Bf16 {
                return Err(refuse(
                    "the MXFP4 expert GEMMs take bf16 activations: use --dtype bf16".into(),
                ));
            }
            let hand_tuned = meta.name == hand::META.name;
            hand::run_case(
                launcher,
                hand_tuned,
                [experts, tokens, n, k],
                config,
                SPOT_SEED,
            )
            .map(|r| (r, None))
        }
    }
}

/// `sparse_mla` alone on one shape: random queries and latent cache in a scrambled paged pool,
/// each query's selection `min(topk, position + 1)` distinct causal rows drawn at random (the
/// indexer and top-k are not what is tuned here), checked against
/// [`kernels::attention::reference::mqa_sparse`] in functional runs.
fn run_sparse_mla<T: dsl_core::Float>(
    launcher: &Launcher,
    config: &dsl_core::Config,
    shape: &Shape,
) -> Result<(accel_sim::Report, Option<accel_sim::trace::ChromeTrace>), accel_sim::SimError> {
    use kernels::attention::reference::{gather_pages, mqa_sparse, MqaShape};
    use kernels::attention::sparse::sparse_mla;
    let Shape::SparseMla {
        seq,
        ctx,
        heads,
        topk,
        kv_lora,
        rope,
        page,
    } = *shape
    else {
        unreachable!("called with a sparse MLA shape only")
    };
    let fail = |message: String| accel_sim::SimError::Launch {
        kernel: "sparse_mla".into(),
        message,
    };
    let d = kv_lora + rope;
    let n_pages = ctx.div_ceil(page);
    let pool_pages = n_pages + 2;
    let functional = launcher.backend == Backend::Functional;
    let mut rng = kernels::testdata::Rng::new(SPOT_SEED);
    let mut table: Vec<usize> = (0..pool_pages).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    table.truncate(n_pages);
    let mut t = kernels::testdata::CaseTensors::new(launcher, SPOT_SEED ^ 0x5a, "sparse_mla");
    let q = t.input::<T>(&[seq, heads, d], 0.0, 1.0)?;
    let kv_pool = t.input::<T>(&[pool_pages, page, d], 0.0, 1.0)?;
    let o = t.output::<T>(&[seq, heads, kv_lora]);
    // Each query's selection: distinct causal rows in random order (a partial shuffle).
    let picks: Vec<Vec<usize>> = if functional {
        (0..seq)
            .map(|i| {
                let pos = ctx - seq + i;
                let mut all: Vec<usize> = (0..=pos).collect();
                let count = topk.min(pos + 1);
                for j in 0..count {
                    let r = j + (rng.next_u64() % (all.len() - j) as u64) as usize;
                    all.swap(j, r);
                }
                all.truncate(count);
                all
            })
            .collect()
    } else {
        Vec::new()
    };
    let (block_table, selected) = if functional {
        let idx: Vec<i32> = table.iter().map(|p| *p as i32).collect();
        let mut sel = vec![0i32; seq * topk];
        for (i, p) in picks.iter().enumerate() {
            for (j, v) in p.iter().enumerate() {
                sel[i * topk + j] = *v as i32;
            }
        }
        (
            Tensor::from_indices(&[n_pages], &idx).map_err(fail)?,
            Tensor::from_indices(&[seq, topk], &sel).map_err(fail)?,
        )
    } else {
        (
            Tensor::shape_only(&[n_pages]),
            Tensor::shape_only(&[seq, topk]),
        )
    };
    let sm_scale = 1.0 / (d as f32).sqrt();
    let launch = sparse_mla::launch(
        launcher,
        config,
        &q,
        &kv_pool,
        &block_table,
        &selected,
        &o,
        ctx,
        topk,
        sm_scale,
    )?;
    let (mut report, trace) = (launch.report, launch.trace);
    if let (Some(out), Some(qv), Some(kvp)) = (o.to_vec(), q.to_vec(), kv_pool.to_vec()) {
        let rows = gather_pages(&kvp, d, page, &table, ctx).map_err(|e| fail(e.to_string()))?;
        let ms = MqaShape {
            sq: seq,
            skv: ctx,
            heads,
            dk: d,
            dv: kv_lora,
        };
        let want =
            mqa_sparse(&qv, &rows, &picks, ms, sm_scale as f64).map_err(|e| fail(e.to_string()))?;
        report.max_rel_error = Some(kernels::reference::rel_error(&out, &want));
    }
    Ok((report, trace))
}

/// A 64-bit FNV-1a hash: stable across Rust versions and platforms (std's hasher is not
/// promised to be), so cache keys survive a toolchain update.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ *b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The cache key of a request: each implementation's source hash (`KernelMeta::source_hash`,
/// which `#[kernel]` computes from the kernel's text), name, file, instruction lines, tunable
/// space and constraints; the preset; the shape and dtype. The key adds the build of this
/// executable (its size and modification time), so an edit the source hash does not see (a
/// helper's body, the simulator's timing) never reads an old result either.
pub fn cache_key(req: &TuneRequest) -> String {
    let metas: Vec<serde_json::Value> = req
        .target
        .impls
        .iter()
        .map(|m| {
            serde_json::json!({
                "source_hash": format!("{:016x}", m.source_hash),
                "name": m.name, "file": m.file, "lines": m.lines, "tunables": m.tunables,
                "points": m.points, "constraints": m.constraints,
            })
        })
        .collect();
    let build = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|md| {
            let mtime = md
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{}:{mtime}", md.len())
        })
        .unwrap_or_default();
    let material = serde_json::json!({
        "schema": CACHE_SCHEMA,
        "day0": env!("CARGO_PKG_VERSION"),
        "build": build,
        "kernels": metas,
        "preset": req.preset,
        "shape": req.shape.canonical(),
        "dtype": dtype_name(req.dtype),
    });
    format!("{:016x}", fnv1a(material.to_string().as_bytes()))
}

/// The cache directory: `$XDG_CACHE_HOME/day0`, else `$HOME/.cache/day0`.
pub fn cache_dir() -> Option<std::path::PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("day0"))
}

fn cache_path(req: &TuneRequest, key: &str) -> Option<std::path::PathBuf> {
    cache_dir().map(|d| d.join(format!("tune-{}-{key}.json", req.kernel)))
}

/// Reads a cached result (`cached` set), if there is a readable one for this key.
pub fn load_cached(req: &TuneRequest) -> Option<TuneResult> {
    let key = cache_key(req);
    let text = std::fs::read_to_string(cache_path(req, &key)?).ok()?;
    let mut r: TuneResult = serde_json::from_str(&text).ok()?;
    (r.cache_key == key).then(|| {
        r.cached = true;
        r
    })
}

/// Writes a result to the cache. Written to a temporary file and renamed, so a reader never sees
/// half a file.
pub fn store_cached(req: &TuneRequest, result: &TuneResult) -> Result<std::path::PathBuf, String> {
    let path = cache_path(req, &result.cache_key)
        .ok_or("no cache directory: set XDG_CACHE_HOME or HOME (or pass --no-cache)")?;
    let text = serde_json::to_string(result).map_err(|e| e.to_string())?;
    write_atomic(&path, &text)?;
    Ok(path)
}

/// Writes `text` to `path` (creating its directory) through a temporary file and a rename, so a
/// reader never sees half a file.
pub fn write_atomic(path: &std::path::Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the directory {}: {e}", dir.display()))?;
    }
    let tmp = path.with_extension(format!("json.{}", std::process::id()));
    std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Sweeps the request's tunable space cost-only (in parallel; `on_done` is called once per
/// configuration, from any thread), ranks it, explains the winner and spot-checks the fastest
/// configurations functionally at the reduced shape.
pub fn tune(req: &TuneRequest, on_done: &(dyn Fn() + Sync)) -> Result<TuneResult, String> {
    let roof = Roofline::of(&req.shape, req.dtype, &req.preset)?;
    let cost = Launcher::new(req.preset.clone()).with_backend(Backend::CostOnly);
    let jobs: Vec<(&'static KernelMeta, dsl_core::Config)> = req
        .target
        .impls
        .iter()
        .flat_map(|m| m.space().into_iter().map(move |c| (*m, c)))
        .collect();
    let run_all = || -> Vec<Row> {
        jobs.par_iter()
            .map(|(meta, config)| {
                let outcome = evaluate(&cost, meta, config, &req.shape, req.dtype);
                on_done();
                Row::from_outcome(meta, config, outcome, &req.preset, &roof)
            })
            .collect()
    };
    let mut rows = match req.threads {
        Some(n) => rayon::ThreadPoolBuilder::new()
            .num_threads(n.max(1))
            .build()
            .map_err(|e| format!("--threads {n}: cannot start the thread pool: {e}"))?
            .install(run_all),
        None => run_all(),
    };
    // Stable: equal keys keep enumeration order, so the ranking is the same at any thread count.
    rows.sort_by_key(|r| match r.status {
        Status::Ok => (0, r.cycles.unwrap_or(u64::MAX)),
        Status::SramOverflow => (1, 0),
        Status::Refused => (2, 0),
    });
    let ran = rows.iter().filter(|r| r.status == Status::Ok).count();
    let best = rows.first().filter(|r| r.status == Status::Ok).cloned();
    let why = explain(&rows, &roof);
    let spot_checks = spot_check(req, &rows);
    let mut result = TuneResult {
        kernel: req.kernel.clone(),
        op: req.target.family.op().to_string(),
        shape: req.shape,
        shape_text: req.shape.canonical(),
        dtype: dtype_name(req.dtype).to_string(),
        device: req.preset.name.clone(),
        clock_ghz: req.preset.clock_ghz,
        roofline: roof,
        evaluated: rows.len(),
        ran,
        best,
        why,
        spot_checks,
        configs: rows,
        cached: false,
        cache_key: String::new(),
    };
    result.cache_key = cache_key(req);
    // serde_json (without its `float_roundtrip` feature, which would rebuild the whole workspace)
    // may parse a printed f64 one ulp away, so a result read back from the cache could print other
    // digits than the fresh one. Handing out the result as the cache will read it back makes a
    // fresh run and a cached run print the same numbers.
    let text = serde_json::to_string(&result).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("tune result does not read back: {e}"))
}

/// Runs the fastest [`SPOT_CHECKS`] configurations functionally at the reduced shape.
fn spot_check(req: &TuneRequest, rows: &[Row]) -> Vec<SpotCheck> {
    let small = req.shape.reduced();
    let functional = Launcher::new(req.preset.clone());
    let tol = tolerance(req.dtype);
    rows.iter()
        .filter(|r| r.status == Status::Ok)
        .take(SPOT_CHECKS)
        .map(|r| {
            let meta = req
                .target
                .impls
                .iter()
                .find(|m| m.name == r.implementation)
                .copied();
            let config = dsl_core::Config(r.config.clone());
            let outcome = match meta {
                Some(m) => evaluate(&functional, m, &config, &small, req.dtype),
                None => Err(accel_sim::SimError::Launch {
                    kernel: r.implementation.clone(),
                    message: "not among the tuned implementations".into(),
                }),
            };
            let (err, error) = match outcome {
                Ok(rep) => (rep.max_rel_error, None),
                Err(e) => (None, Some(e.to_string())),
            };
            SpotCheck {
                implementation: r.implementation.clone(),
                config: r.config.clone(),
                shape: small.canonical(),
                max_rel_error: err,
                tolerance: tol,
                ok: err.is_some_and(|e| e <= tol),
                error,
            }
        })
        .collect()
}

fn waves(n: u64) -> String {
    format!("{n} wave{}", if n == 1 { "" } else { "s" })
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// One line on why the winner wins, from the reports: the cycles it saves over the runner-up and
/// the two largest differences that explain them (HBM traffic, matrix utilisation, padded matrix
/// work, exposed DMA, how the programs fill the cores), then how close it is to the roofline.
pub fn explain(rows: &[Row], roof: &Roofline) -> String {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.status == Status::Ok).collect();
    let Some(best) = ok.first() else {
        return "no configuration runs at this shape on this device".into();
    };
    let b_cycles = best.cycles.unwrap_or(0);
    let at_roof = format!(
        "{}-bound at {:.2}× the roofline lower bound ({} cycles, {})",
        best.bound.as_deref().unwrap_or("?"),
        b_cycles as f64 / roof.cycles.max(1) as f64,
        roof.cycles,
        roof.bound
    );
    let Some(next) = ok.get(1) else {
        return format!(
            "{} is the only configuration that runs; {at_roof}",
            best.label()
        );
    };
    let n_cycles = next.cycles.unwrap_or(0);
    let saved = 1.0 - b_cycles as f64 / n_cycles.max(1) as f64;
    let u = |r: &Row, k: &str| r.utilisation.get(k).copied().unwrap_or(0.0);
    let mut reasons: Vec<(f64, String)> = Vec::new();
    let (bh, nh) = (best.hbm_bytes.unwrap_or(0), next.hbm_bytes.unwrap_or(0));
    if nh > 0 && (bh as f64) < 0.95 * nh as f64 {
        reasons.push((
            1.0 - bh as f64 / nh as f64,
            format!(
                "{:.0}% fewer HBM bytes ({} vs {})",
                100.0 * (1.0 - bh as f64 / nh as f64),
                mb(bh),
                mb(nh)
            ),
        ));
    }
    let (bm, nm) = (u(best, "matrix"), u(next, "matrix"));
    if bm > nm + 0.02 {
        reasons.push((
            bm - nm,
            format!(
                "higher matrix utilisation ({:.0}% vs {:.0}%)",
                100.0 * bm,
                100.0 * nm
            ),
        ));
    }
    let (bf, nf) = (best.matrix_flop.unwrap_or(0), next.matrix_flop.unwrap_or(0));
    if nf > 0 && (bf as f64) < 0.98 * nf as f64 {
        reasons.push((
            1.0 - bf as f64 / nf as f64,
            format!(
                "{:.0}% less padded matrix work",
                100.0 * (1.0 - bf as f64 / nf as f64)
            ),
        ));
    }
    let (be, ne) = (
        best.exposed_dma_cycles.unwrap_or(0),
        next.exposed_dma_cycles.unwrap_or(0),
    );
    if ne > be && (ne - be) as f64 > 0.02 * n_cycles as f64 {
        reasons.push((
            (ne - be) as f64 / n_cycles.max(1) as f64,
            format!("less exposed DMA ({be} vs {ne} cycles)"),
        ));
    }
    if best.waves != next.waves || best.programs != next.programs {
        reasons.push((
            0.01,
            format!(
                "{} programs in {} vs {} in {}",
                best.programs.unwrap_or(0),
                waves(best.waves.unwrap_or(0)),
                next.programs.unwrap_or(0),
                waves(next.waves.unwrap_or(0))
            ),
        ));
    }
    reasons.sort_by(|a, b| b.0.total_cmp(&a.0));
    let because = if reasons.is_empty() {
        "same traffic, utilisation and waves: the schedule overlaps better".to_string()
    } else {
        reasons
            .iter()
            .take(2)
            .map(|r| r.1.clone())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{} wins: {:.1}% fewer cycles than the runner-up {} ({b_cycles} vs {n_cycles}): {because}; {at_roof}",
        best.label(),
        100.0 * saved,
        next.label(),
    )
}

/// The table `day0 tune` prints: one row per configuration, best first.
pub fn table(r: &TuneResult) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "day0 tune {} on {} ({} {}): {} configurations, {} run{}",
        r.kernel,
        r.device,
        r.shape_text,
        r.dtype,
        r.evaluated,
        r.ran,
        if r.cached { " (cached)" } else { "" }
    );
    let _ = writeln!(
        out,
        "roofline lower bound: {} cycles ({:.1} µs, {}-bound: {:.3e} FLOP, {} HBM at least)",
        r.roofline.cycles,
        r.roofline.time_us,
        r.roofline.bound,
        r.roofline.flop,
        mb(r.roofline.min_hbm_bytes as u64)
    );
    let multi = r
        .configs
        .iter()
        .any(|c| c.implementation != r.configs[0].implementation);
    let iw = if multi {
        r.configs
            .iter()
            .map(|c| c.implementation.len())
            .max()
            .unwrap_or(0)
            .max(14)
    } else {
        0
    };
    let cw = r
        .configs
        .iter()
        .map(|c| c.config_text().len())
        .max()
        .unwrap_or(6)
        .max(6);
    let _ = writeln!(
        out,
        "{:>4} {:<iw$}{}{:<cw$} {:>12} {:>10} {:>7} {:>8} {:>7} {:>7} {:>7} {:>9}  status",
        "rank",
        if multi { "implementation" } else { "" },
        if multi { " " } else { "" },
        "config",
        "cycles",
        "time µs",
        "×roof",
        "bound",
        "matrix",
        "vector",
        "hbm",
        "SRAM KiB"
    );
    for (i, c) in r.configs.iter().enumerate() {
        let imp = if multi {
            format!("{:<iw$} ", c.implementation)
        } else {
            String::new()
        };
        let pct = |k: &str| {
            c.utilisation
                .get(k)
                .map_or("-".to_string(), |v| format!("{:.1}%", 100.0 * v))
        };
        match c.status {
            Status::Ok => {
                let _ = writeln!(
                    out,
                    "{:>4} {imp}{:<cw$} {:>12} {:>10.1} {:>7.2} {:>8} {:>7} {:>7} {:>7} {:>9.0}  ok",
                    i + 1,
                    c.config_text(),
                    c.cycles.unwrap_or(0),
                    c.time_us.unwrap_or(0.0),
                    c.over_roofline.unwrap_or(0.0),
                    c.bound.as_deref().unwrap_or("-"),
                    pct("matrix"),
                    pct("vector"),
                    pct("hbm"),
                    c.sram_bytes.unwrap_or(0) as f64 / 1024.0
                );
            }
            s => {
                let _ = writeln!(
                    out,
                    "{:>4} {imp}{:<cw$} {:>12} {:>10} {:>7} {:>8} {:>7} {:>7} {:>7} {:>9}  {}",
                    "-",
                    c.config_text(),
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    "-",
                    s.label()
                );
            }
        }
    }
    let _ = writeln!(out, "why: {}", r.why);
    for s in &r.spot_checks {
        let _ = writeln!(
            out,
            "spot check {} {} at {}: {}",
            s.implementation,
            dsl_core::Config(s.config.clone()),
            s.shape,
            match (&s.max_rel_error, &s.error) {
                (Some(e), _) => format!(
                    "max rel err {e:.2e} (tolerance {:.0e}) {}",
                    s.tolerance,
                    if s.ok { "ok" } else { "FAILED" }
                ),
                (None, Some(e)) => format!("FAILED: {e}"),
                (None, None) => "FAILED: no error measured".into(),
            }
        );
    }
    out
}

/// A heat map of the best implementation's cycles over its first two tunables (e.g. BM × BN),
/// the other tunables held at the best configuration's values (e.g. the best BK): each cell's
/// colour from the fastest (green) to the slowest (red) configuration shown, SRAM overflows and
/// refusals grey with a mark. `None` when nothing ran or the kernel has fewer than two tunables.
pub fn heatmap_svg(r: &TuneResult) -> Option<String> {
    use std::fmt::Write as _;
    let best = r.best.as_ref()?;
    let keys: Vec<&String> = best.config.keys().collect();
    // The axes: the implementation's tunables in declaration order when known, else key order.
    let meta = FAMILIES
        .iter()
        .flat_map(|f| f.implementations())
        .find(|m| m.name == best.implementation);
    let order: Vec<String> = match meta {
        Some(m) => m.tunables.iter().map(|(n, _)| n.to_string()).collect(),
        None => keys.iter().map(|k| k.to_string()).collect(),
    };
    if order.len() < 2 {
        return None;
    }
    let (xk, yk) = (&order[1], &order[0]);
    let fixed: Vec<(&String, i64)> = order[2..]
        .iter()
        .map(|k| (k, best.config.get(k).copied().unwrap_or(0)))
        .collect();
    let cells: Vec<&Row> = r
        .configs
        .iter()
        .filter(|c| {
            c.implementation == best.implementation
                && fixed.iter().all(|(k, v)| c.config.get(*k) == Some(v))
        })
        .collect();
    let axis = |k: &String| {
        let mut v: Vec<i64> = cells
            .iter()
            .filter_map(|c| c.config.get(k).copied())
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let (xs, ys) = (axis(xk), axis(yk));
    let cyc: Vec<u64> = cells.iter().filter_map(|c| c.cycles).collect();
    let (lo, hi) = (*cyc.iter().min()? as f64, *cyc.iter().max()? as f64);
    let (cell_w, cell_h, left, top) = (96.0, 40.0, 80.0, 70.0);
    let w = left + cell_w * xs.len() as f64 + 30.0;
    let h = top + cell_h * ys.len() as f64 + 70.0;
    let fixed_text: Vec<String> = fixed.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" font-size=\"14\">{} {} on {}: cycles, {} × {}{}{}</text>\n",
        best.implementation,
        r.shape_text,
        r.device,
        yk,
        xk,
        if fixed_text.is_empty() { "" } else { " at " },
        fixed_text.join(" ")
    );
    let _ = writeln!(
        out,
        "<text x=\"10\" y=\"42\" fill=\"#555\">green = fastest ({lo:.0}), red = slowest ({hi:.0}); grey = does not run; ★ = best</text>"
    );
    for (i, x) in xs.iter().enumerate() {
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{xk}={x}</text>",
            left + cell_w * (i as f64 + 0.5),
            top - 6.0
        );
    }
    for (j, y) in ys.iter().enumerate() {
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{yk}={y}</text>",
            left - 6.0,
            top + cell_h * (j as f64 + 0.6)
        );
        for (i, x) in xs.iter().enumerate() {
            let (cx, cy) = (left + cell_w * i as f64, top + cell_h * j as f64);
            let cell = cells
                .iter()
                .find(|c| c.config.get(xk) == Some(x) && c.config.get(yk) == Some(y));
            let (fill, label) = match cell {
                Some(c) if c.status == Status::Ok => {
                    let v = c.cycles.unwrap_or(0) as f64;
                    let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.0 };
                    // Green (fast) to red (slow) through yellow.
                    let (rr, gg) = if t < 0.5 {
                        (510.0 * t, 200.0)
                    } else {
                        (255.0, 200.0 * (2.0 - 2.0 * t))
                    };
                    let star = if c.config == best.config { "★ " } else { "" };
                    (
                        format!("rgb({:.0},{:.0},90)", rr.min(255.0), gg),
                        format!("{star}{:.0}k", v / 1e3),
                    )
                }
                Some(c) => (
                    "#cccccc".to_string(),
                    if c.status == Status::SramOverflow {
                        "SRAM ×".to_string()
                    } else {
                        "refused".to_string()
                    },
                ),
                None => ("#eeeeee".to_string(), String::new()),
            };
            let _ = writeln!(
                out,
                "<rect x=\"{cx}\" y=\"{cy}\" width=\"{cell_w}\" height=\"{cell_h}\" fill=\"{fill}\" stroke=\"white\"/><text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{label}</text>",
                cx + cell_w / 2.0,
                cy + cell_h * 0.6
            );
        }
    }
    out.push_str("</svg>\n");
    Some(out)
}
