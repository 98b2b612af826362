//! Flash attention for prefill: tiles over queries and keys with an online softmax, causal mask,
//! grouped-query heads (GQA/MQA), any lengths (ragged last tiles).
//!
//! Token-major layout, as checkpoints' reference code holds activations (see
//! [`super::reference`]): `q`, `o` are `[Sq, Hq·D]`, `k`, `v` are `[Skv, Hkv·D]`; query head `h`
//! reads key/value head `h / (Hq / Hkv)`. The `Sq` queries are the *last* `Sq` positions of a
//! context of `Skv` tokens (`q_pos = Skv − Sq + i`), so chunked prefill against a growing cache and
//! one-shot prefill are the same kernel.

use super::reference::{attention_prefill_sinks, AttnShape};
use crate::gemm::GemmDtype;
use crate::testdata::CaseTensors;
use dsl_core::prelude::*;
use dsl_core::SimError;

/// The online softmax's starting state for `R` rows whose attention sinks are `sink` (gpt-oss's
/// per-head logit in every softmax's denominator; −∞ for none): the running max `m` and
/// denominator `l` as if the sink were a score already seen, with no value: `m = max(sink,
/// floor)`, `l = e^(sink − m)`. The floor is finite because a row may see no key in its first
/// blocks (a sliding window), and a max still at −∞ would make e^(−∞ − (−∞)) = NaN; no score
/// reaches it, so the first real block rescales the start by e^(floor − m) = 0 as −∞ would, and
/// a model without sinks gets the same numbers as from an empty start.
#[kernel(helper)]
pub fn softmax_start<const R: usize>(sink: &Tile<f32, R, 1>) -> (Tile<f32, R, 1>, Tile<f32, R, 1>) {
    let m = maximum(sink, &full::<f32, R, 1>(-1e30));
    let l = exp(&sub(sink, &m));
    (m, l)
}

/// One program per (query tile, query head). `head_dim` is the query/key head dimension and
/// `v_head_dim` the value/output head dimension (MLA's naive prefill: 192 and 128), both run-time
/// values: each head is a column view (`cols_clipped`) loaded into `BD`/`BDV`-wide tiles that cover
/// it, zero-filled past the head (zeros add nothing to `q·kᵀ` and produce output columns that the
/// store drops). `BQ`, `BK`, `BD` and `BDV` are tile sizes; the constraint keeps the `BD`/`BDV`
/// pairs worth compiling (within 2× of each other: a value tile much narrower or wider than the
/// key tile is never the best cover).
#[kernel(
    grid = (cdiv(q.rows(), BQ), q.cols() / head_dim),
    tunable(
        BQ = [64, 16, 32, 128],
        BK = [64, 16, 32, 128],
        BD = [128, 16, 32, 64, 192, 256, 576],
        BDV = [128, 16, 32, 64, 256, 512]
    ),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(softmax_start)
)]
#[allow(clippy::too_many_arguments)]
pub fn flash_prefill<T: Float>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    o: &Tensor<T>,
    head_dim: usize,
    v_head_dim: usize,
    sm_scale: f32,
    causal: bool,
    window: usize,
    sinks: &Tensor<f32>,
) {
    require(
        head_dim <= BD && v_head_dim <= BDV,
        "the BD/BDV tiles must cover head_dim/v_head_dim (prefill_config picks covering tiles)",
    );
    let h = program_id(1);
    let q0 = program_id(0) * BQ;
    let (sq, skv) = (q.rows(), k.rows());
    let kv_head = h / ((q.cols() / head_dim) / (k.cols() / head_dim));
    let q_pos = skv.saturating_sub(sq) + q0;
    let qh = q.cols_clipped(h * head_dim, head_dim);
    let kh = k.cols_clipped(kv_head * head_dim, head_dim);
    let vh = v.cols_clipped(kv_head * v_head_dim, v_head_dim);
    // Causal: no key after this tile's last query is needed.
    let k_end = if causal {
        usize::min(skv, q_pos + BQ)
    } else {
        skv
    };
    // A sliding window starts at the block holding the first query's oldest key.
    let k_start = if window > 0 {
        (q_pos + 1).saturating_sub(window) / BK * BK
    } else {
        0
    };
    let tq = load::<BQ, BD>(&qh, q0, 0);
    // The head's sink (`sinks [Hq, 1]`) as the softmax's first score.
    let sink = broadcast::<f32, BQ, 1>(&load_async::<1, 1>(sinks, h, 0));
    let (mut m, mut l) = softmax_start(&sink);
    let mut acc = zeros::<f32, BQ, BDV>();
    for kb in (k_start..k_end).step_by(BK) {
        let tk = load_async::<BK, BD>(&kh, kb, 0);
        let tv = load_async::<BK, BDV>(&vh, kb, 0);
        let mut s = zeros::<f32, BQ, BK>();
        mma_bt(&mut s, &tq, &tk);
        let s = mask_keys(&scale(&s, sm_scale), q_pos, kb, skv, causal);
        let s = if window > 0 {
            mask_window(&s, q_pos, kb, window)
        } else {
            s
        };
        // Online softmax: rescale what was accumulated under the old running max.
        let m_new = maximum(&m, &row_max(&s));
        let p = exp(&sub_col(&s, &m_new));
        let alpha = exp(&sub(&m, &m_new));
        l = add(&mul(&l, &alpha), &row_sum(&p));
        acc = mul_col(&acc, &alpha);
        mma(&mut acc, &cast::<T>(&p), &tv);
        m = m_new;
    }
    store(
        &o.cols_clipped(h * v_head_dim, v_head_dim),
        q0,
        0,
        &cast::<T>(&div_col(&acc, &l)),
    );
}

/// [`flash_prefill()`] software-pipelined as FlashAttention-3 schedules it: the scores of key block
/// `j + 1` are issued to the matrix unit before the softmax of block `j` runs on the vector unit,
/// so the two units overlap instead of taking turns (FA3's intra-warpgroup pipelining, section
/// 3.2 of the paper), and keys and values are prefetched a block ahead (keys two blocks: block
/// `j + 1`'s scores are computed during iteration `j`). Same numbers as [`flash_prefill()`]
/// (same products and the same online-softmax order); each program issues one key block past its
/// last, whose window lies outside the (clipped) keys: it moves no bytes and adds no useful FLOP,
/// and its issued matrix work is one block in `⌈k_end / BK⌉`.
#[kernel(
    grid = (cdiv(q.rows(), BQ), q.cols() / head_dim),
    tunable(
        BQ = [64, 128, 16],
        BK = [64, 128, 16],
        BD = [128, 16, 32, 64, 256],
        BDV = [128, 16, 32, 64, 256]
    ),
    constraint(BDV <= BD && BD <= 2 * BDV),
    helpers(softmax_start)
)]
#[allow(clippy::too_many_arguments)]
pub fn flash_prefill_pipelined<T: Float>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    o: &Tensor<T>,
    head_dim: usize,
    v_head_dim: usize,
    sm_scale: f32,
    causal: bool,
    window: usize,
    sinks: &Tensor<f32>,
) {
    require(
        head_dim <= BD && v_head_dim <= BDV,
        "the BD/BDV tiles must cover head_dim/v_head_dim (prefill_config picks covering tiles)",
    );
    let h = program_id(1);
    let q0 = program_id(0) * BQ;
    let (sq, skv) = (q.rows(), k.rows());
    let kv_head = h / ((q.cols() / head_dim) / (k.cols() / head_dim));
    let q_pos = skv.saturating_sub(sq) + q0;
    // Causal: no key after this tile's last query is needed; loads past it move nothing.
    let k_end = if causal {
        usize::min(skv, q_pos + BQ)
    } else {
        skv
    };
    let qh = q.cols_clipped(h * head_dim, head_dim);
    let kh = k
        .cols_clipped(kv_head * head_dim, head_dim)
        .rows_clipped(0, k_end);
    let vh = v
        .cols_clipped(kv_head * v_head_dim, v_head_dim)
        .rows_clipped(0, k_end);
    // A sliding window starts at the block holding the first query's oldest key.
    let k_start = if window > 0 {
        (q_pos + 1).saturating_sub(window) / BK * BK
    } else {
        0
    };
    let tq = load::<BQ, BD>(&qh, q0, 0);
    // The head's sink (`sinks [Hq, 1]`) as the softmax's first score.
    let sink = broadcast::<f32, BQ, 1>(&load_async::<1, 1>(sinks, h, 0));
    let (mut m, mut l) = softmax_start(&sink);
    let mut acc = zeros::<f32, BQ, BDV>();
    // The first block's scores; the next block's keys and the first block's values in flight.
    let tk0 = load_async::<BK, BD>(&kh, k_start, 0);
    let mut tk = load_async::<BK, BD>(&kh, k_start + BK, 0);
    let mut tv = load_async::<BK, BDV>(&vh, k_start, 0);
    let mut s = zeros::<f32, BQ, BK>();
    mma_bt(&mut s, &tq, &tk0);
    let mut s_next = zeros::<f32, BQ, BK>();
    for kb in (k_start..k_end).step_by(BK) {
        // Block kb + BK's scores go to the matrix unit first: they run while this block's
        // softmax runs on the vector unit.
        mma_bt(&mut s_next, &tq, &tk);
        let next_k = load_async::<BK, BD>(&kh, kb + 2 * BK, 0);
        let next_v = load_async::<BK, BDV>(&vh, kb + BK, 0);
        let sc = mask_keys(&scale(&s, sm_scale), q_pos, kb, skv, causal);
        let sc = if window > 0 {
            mask_window(&sc, q_pos, kb, window)
        } else {
            sc
        };
        // Online softmax: rescale what was accumulated under the old running max.
        let m_new = maximum(&m, &row_max(&sc));
        let p = exp(&sub_col(&sc, &m_new));
        let alpha = exp(&sub(&m, &m_new));
        l = add(&mul(&l, &alpha), &row_sum(&p));
        acc = mul_col(&acc, &alpha);
        mma(&mut acc, &cast::<T>(&p), &tv);
        m = m_new;
        s = s_next;
        s_next = zeros::<f32, BQ, BK>();
        tk = next_k;
        tv = next_v;
    }
    store(
        &o.cols_clipped(h * v_head_dim, v_head_dim),
        q0,
        0,
        &cast::<T>(&div_col(&acc, &l)),
    );
}

/// Which prefill kernel [`run_prefill_with`] launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillKernel {
    /// [`flash_prefill()`]: scores, softmax and the value product in turn.
    Flash,
    /// [`flash_prefill_pipelined()`]: the next block's scores overlap this block's softmax.
    Pipelined,
}

impl PrefillKernel {
    /// The kernel's metadata.
    pub fn meta(self) -> &'static dsl_core::KernelMeta {
        match self {
            PrefillKernel::Flash => &flash_prefill::META,
            PrefillKernel::Pipelined => &flash_prefill_pipelined::META,
        }
    }
}

/// The tiles of `kernel` for a shape: `BD`, `BDV` the smallest instantiated pair covering the
/// head dims, `BQ`/`BK` from `base` when set (else the kernel's defaults).
pub fn prefill_config_for(
    kernel: PrefillKernel,
    base: &Config,
    head_dim: usize,
    v_head_dim: usize,
) -> Result<Config, SimError> {
    crate::tile_choice::cover(
        kernel.meta(),
        base,
        &[
            ("BD", head_dim, "head_dim"),
            ("BDV", v_head_dim, "v_head_dim"),
        ],
    )
}

/// The prefill tiles for a shape: `BD`, `BDV` the smallest instantiated pair covering the head
/// dims, `BQ`/`BK` from `base` when set (else the kernel's defaults). Errors when no pair covers
/// them (a head dim above the largest tile).
pub fn prefill_config(
    base: &Config,
    head_dim: usize,
    v_head_dim: usize,
) -> Result<Config, SimError> {
    crate::tile_choice::cover(
        &flash_prefill::META,
        base,
        &[
            ("BD", head_dim, "head_dim"),
            ("BDV", v_head_dim, "v_head_dim"),
        ],
    )
}

/// One prefill problem: heads, lengths, dtype, tile choice, seed.
#[derive(Debug, Clone)]
pub struct PrefillCase {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (divides `heads`).
    pub kv_heads: usize,
    /// Query/key head dimension (any; covered by a `BD` tile).
    pub head_dim: usize,
    /// Value head dimension (any; covered by a `BDV` tile).
    pub v_head_dim: usize,
    /// Queries (the last `sq` positions of the context).
    pub sq: usize,
    /// Context length.
    pub skv: usize,
    /// Sliding window: each query sees its last `window` keys (0: all, causal).
    pub window: usize,
    /// Attention sinks: one random logit per query head in every softmax's denominator (gpt-oss),
    /// or none.
    pub sinks: bool,
    /// Element dtype of q, k, v, o.
    pub dtype: GemmDtype,
    /// Tunable values (`BQ`, `BK`; `BD`/`BDV` are picked to cover the head dims unless set).
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// A prefill run: the report (with `max_rel_error` in functional runs) and the output.
#[derive(Debug)]
pub struct PrefillRun {
    /// The launch.
    pub launch: Launch,
    /// `o [sq, heads·v_head_dim]` (functional runs).
    pub output: Option<Vec<f32>>,
}

/// Runs causal prefill attention on random inputs (q, k, v uniform in ±1; output poisoned) and
/// checks it against the f64 reference of the rounded inputs. Shapes are validated first: bad
/// ones are errors, not panics.
pub fn run_prefill(launcher: &Launcher, case: &PrefillCase) -> Result<PrefillRun, SimError> {
    run_prefill_with(launcher, case, PrefillKernel::Flash)
}

/// [`run_prefill`] with the kernel chosen: the same inputs, reference and checks.
pub fn run_prefill_with(
    launcher: &Launcher,
    case: &PrefillCase,
    kernel: PrefillKernel,
) -> Result<PrefillRun, SimError> {
    let name = kernel.meta().name;
    let shape = AttnShape {
        sq: case.sq,
        skv: case.skv,
        heads: case.heads,
        kv_heads: case.kv_heads,
        head_dim: case.head_dim,
        v_head_dim: case.v_head_dim,
    };
    shape.validate().map_err(|e| SimError::Launch {
        kernel: name.into(),
        message: e.to_string(),
    })?;
    if case.sq == 0 {
        return Err(SimError::Launch {
            kernel: name.into(),
            message: "no queries (sq = 0)".into(),
        });
    }
    let config = prefill_config_for(kernel, &case.config, case.head_dim, case.v_head_dim)?;
    match case.dtype {
        GemmDtype::F32 => run_typed::<f32>(launcher, case, shape, &config, kernel),
        GemmDtype::Bf16 => run_typed::<bf16>(launcher, case, shape, &config, kernel),
    }
}

fn run_typed<T: Float>(
    launcher: &Launcher,
    case: &PrefillCase,
    shape: AttnShape,
    config: &Config,
    kernel: PrefillKernel,
) -> Result<PrefillRun, SimError> {
    let (hd, kvd) = (case.heads * case.head_dim, case.kv_heads * case.head_dim);
    let (hv, kvv) = (
        case.heads * case.v_head_dim,
        case.kv_heads * case.v_head_dim,
    );
    let mut t = CaseTensors::new(launcher, case.seed, kernel.meta().name);
    let q = t.input::<T>(&[case.sq, hd], 0.0, 1.0)?;
    let k = t.input::<T>(&[case.skv, kvd], 0.0, 1.0)?;
    let v = t.input::<T>(&[case.skv, kvv], 0.0, 1.0)?;
    let o = t.output::<T>(&[case.sq, hv]);
    let sinks = if case.sinks {
        t.input::<f32>(&[case.heads, 1], 0.0, 2.0)?
    } else {
        super::sinks_tensor(launcher, kernel.meta().name, case.heads, None)?
    };
    let sm_scale = 1.0 / (case.head_dim as f32).sqrt();
    let launch_kernel = match kernel {
        PrefillKernel::Flash => flash_prefill::launch,
        PrefillKernel::Pipelined => flash_prefill_pipelined::launch,
    };
    let mut launch = launch_kernel(
        launcher,
        config,
        &q,
        &k,
        &v,
        &o,
        case.head_dim,
        case.v_head_dim,
        sm_scale,
        true,
        case.window,
        &sinks,
    )?;
    let output = o.to_vec();
    if let (Some(out), Some(qv), Some(kv), Some(vv)) = (&output, q.to_vec(), k.to_vec(), v.to_vec())
    {
        let sink_values = if case.sinks {
            sinks.to_vec().unwrap_or_default()
        } else {
            Vec::new()
        };
        let want = attention_prefill_sinks(
            &qv,
            &kv,
            &vv,
            shape,
            sm_scale as f64,
            case.window,
            &sink_values,
        )
        .map_err(|e| SimError::Launch {
            kernel: kernel.meta().name.into(),
            message: e.to_string(),
        })?;
        // Attention output rows are weighted averages of value rows, and may cancel to near zero;
        // their rounding error scales with the values averaged, so the floor of the relative
        // error is the larger of the output's and the values' RMS.
        let values: Vec<f64> = vv.iter().map(|x| *x as f64).collect();
        let floor = crate::reference::rms_floor(&want).max(crate::reference::rms_floor(&values));
        launch.report.max_rel_error = Some(crate::reference::max_rel_error(out, &want, floor));
    }
    Ok(PrefillRun { launch, output })
}
