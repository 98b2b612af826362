//! Expert GEMMs: `y[e] = x[e] · W[e]ᵀ` for every expert `e`, with `x[e]` the tokens routed to that
//! expert (`[E, T, K]`) and `W[e]` the expert's weight stored output-major (`[E, N, K]`, as
//! checkpoints store `nn.Linear` weights).
//!
//! - [`expert_gemm_mxfp4()`]: weights stay packed in device memory (MXFP4: `blocks [E, N, K/2]`,
//!   `scales [E, N, K/32]`); each tile is dequantized in SRAM and fed to the matrix unit, so a
//!   dequantized copy never touches device memory (online conversion).
//! - [`expert_gemm()`]: weights already in a float format (bf16, or the offline-converted copy).
//! - [`dequant_mxfp4_experts()`]: the offline conversion itself (packed → bf16 in device memory).
//!
//! All three double-buffer their K loop.

use dsl_core::prelude::*;

/// Fused MXFP4 expert GEMM: one program per (token tile, output tile, expert).
#[kernel(
    grid = (cdiv(x.shape()[1], BM), cdiv(w_blocks.shape()[1], BN), x.shape()[0]),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64, 256], BK = [128, 64, 256]),
    derived(BKB = BK / 2, BKS = BK / 32)
)]
pub fn expert_gemm_mxfp4<T: Float>(
    x: &Tensor<T>,
    w_blocks: &Tensor<u8>,
    w_scales: &Tensor<u8>,
    y: &Tensor<f32>,
) {
    let e = program_id(2);
    let (xe, be, se, ye) = (x.at(e), w_blocks.at(e), w_scales.at(e), y.at(e));
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(&xe, row, 0);
    let mut tb = load_async::<BN, BKB>(&be, col, 0);
    let mut ts = load_async::<BN, BKS>(&se, col, 0);
    for k in (BK..xe.cols() + BK).step_by(BK) {
        // Past the end of K these windows are outside the tensors: no bytes move.
        let next_x = load_async::<BM, BK>(&xe, row, k);
        let next_b = load_async::<BN, BKB>(&be, col, k / 2);
        let next_s = load_async::<BN, BKS>(&se, col, k / 32);
        let w = dequant_mxfp4::<T, BN, BK>(&tb, &ts);
        mma_bt(&mut acc, &tx, &w);
        tx = next_x;
        tb = next_b;
        ts = next_s;
    }
    store(&ye, row, col, &acc);
}

/// One output tile `x[row..+BM] · w[col..+BN]ᵀ` over the whole K of `x` (`w` output-major), with
/// a double-buffered K loop: the next step's tiles load while the matrix unit multiplies.
#[kernel(helper)]
pub fn matmul_bt_tile<T: Float, const BM: usize, const BN: usize, const BK: usize>(
    x: &Tensor<T>,
    w: &Tensor<T>,
    row: usize,
    col: usize,
) -> Tile<f32, BM, BN> {
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(x, row, 0);
    let mut tw = load_async::<BN, BK>(w, col, 0);
    for k in (BK..x.cols() + BK).step_by(BK) {
        let next_x = load_async::<BM, BK>(x, row, k);
        let next_w = load_async::<BN, BK>(w, col, k);
        mma_bt(&mut acc, &tx, &tw);
        tx = next_x;
        tw = next_w;
    }
    acc
}

/// Expert GEMM over float weights `w [E, N, K]`.
#[kernel(
    grid = (cdiv(x.shape()[1], BM), cdiv(w.shape()[1], BN), x.shape()[0]),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64, 256], BK = [128, 64, 256]),
    helpers(matmul_bt_tile)
)]
pub fn expert_gemm<T: Float>(x: &Tensor<T>, w: &Tensor<T>, y: &Tensor<f32>) {
    let e = program_id(2);
    let (row, col) = (program_id(0) * BM, program_id(1) * BN);
    let acc = matmul_bt_tile::<T, BM, BN, BK>(&x.at(e), &w.at(e), row, col);
    store(&y.at(e), row, col, &acc);
}

/// Offline conversion: MXFP4 expert weights → `T` in device memory (`w [E, N, K]`).
#[kernel(
    grid = (cdiv(w.shape()[1], BN), cdiv(w.shape()[2], BK), w.shape()[0]),
    tunable(BN = [64, 32, 128], BK = [256, 128, 512]),
    derived(BKB = BK / 2, BKS = BK / 32)
)]
pub fn dequant_mxfp4_experts<T: Float>(
    w_blocks: &Tensor<u8>,
    w_scales: &Tensor<u8>,
    w: &Tensor<T>,
) {
    let e = program_id(2);
    let row = program_id(0) * BN;
    let k = program_id(1) * BK;
    let tb = load_async::<BN, BKB>(&w_blocks.at(e), row, k / 2);
    let ts = load_async::<BN, BKS>(&w_scales.at(e), row, k / 32);
    store(&w.at(e), row, k, &dequant_mxfp4::<T, BN, BK>(&tb, &ts));
}

/// Block-scaled FP8 expert GEMM (DeepSeek-V3 weights): `w [E, N, K]` E4M3 with one f32
/// `scale_inv` per 128×128 block (`s [E, ⌈N/128⌉, ⌈K/128⌉]`); each 128-deep partial product of
/// the raw codes is scaled in f32 and accumulated. `BK` is the 128-wide scale
/// block, and `BN` divides it, so every tile lies in one scale block.
#[kernel(
    grid = (cdiv(x.shape()[1], BM), cdiv(w.shape()[1], BN), x.shape()[0]),
    tunable(BM = [16, 32, 64, 128], BN = [128, 64], BK = [128])
)]
pub fn expert_gemm_fp8<T: Float>(
    x: &Tensor<T>,
    w: &Tensor<fp8e4m3>,
    s: &Tensor<f32>,
    y: &Tensor<f32>,
) {
    let e = program_id(2);
    let (xe, we, se, ye) = (x.at(e), w.at(e), s.at(e), y.at(e));
    let row = program_id(0) * BM;
    let col = program_id(1) * BN;
    let mut acc = zeros::<f32, BM, BN>();
    let mut tx = load_async::<BM, BK>(&xe, row, 0);
    let mut tw = load_async::<BN, BK>(&we, col, 0);
    let mut ts = load_async::<1, 1>(&se, col / 128, 0);
    for k in (BK..xe.cols() + BK).step_by(BK) {
        let next_x = load_async::<BM, BK>(&xe, row, k);
        let next_w = load_async::<BN, BK>(&we, col, k);
        let next_s = load_async::<1, 1>(&se, col / 128, k / 128);
        // E4M3 codes are exact in T; the block scale is applied to the f32 partial product, as
        // DeepSeek's FP8 GEMM promotes each 128-deep partial sum: no rounding of scaled weights.
        let mut part = zeros::<f32, BM, BN>();
        mma_bt(&mut part, &tx, &cast::<T>(&tw));
        acc = add(&acc, &mul(&part, &broadcast::<f32, BM, BN>(&ts)));
        tx = next_x;
        tw = next_w;
        ts = next_s;
    }
    store(&ye, row, col, &acc);
}

/// SwiGLU activation of an expert FFN: `h = SiLU(g) ⊙ u`, rounded to `T` for the down projection.
#[kernel(grid = (cdiv(g.rows(), BR), cdiv(g.cols(), BC)), tunable(BR = [16, 32, 64], BC = [256, 128, 512]))]
pub fn swiglu<T: Float>(g: &Tensor<f32>, u: &Tensor<f32>, h: &Tensor<T>) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let tg = load_async::<BR, BC>(g, r, c);
    let tu = load_async::<BR, BC>(u, r, c);
    store(h, r, c, &cast::<T>(&mul(&silu(&tg), &tu)));
}

/// gpt-oss's clamped SwiGLU of an expert FFN: `h = (clamp(u, −limit, limit) + 1) ⊙ g′ ⊙ σ(alpha ·
/// g′)` with `g′ = min(g, limit)` (transformers' `GptOssExperts._apply_gate`, `alpha` =
/// `swiglu_alpha`, `limit` = `swiglu_limit`), rounded to `T` for the down projection.
#[kernel(grid = (cdiv(g.rows(), BR), cdiv(g.cols(), BC)), tunable(BR = [16, 32, 64], BC = [256, 128, 512]))]
pub fn swiglu_clamped<T: Float>(
    g: &Tensor<f32>,
    u: &Tensor<f32>,
    h: &Tensor<T>,
    alpha: f32,
    limit: f32,
) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let tg = minimum(&load_async::<BR, BC>(g, r, c), &full::<f32, BR, BC>(limit));
    let tu = maximum(
        &minimum(&load_async::<BR, BC>(u, r, c), &full::<f32, BR, BC>(limit)),
        &full::<f32, BR, BC>(-limit),
    );
    let glu = mul(&tg, &sigmoid(&scale(&tg, alpha)));
    store(h, r, c, &cast::<T>(&mul(&add_scalar(&tu, 1.0), &glu)));
}

/// How the expert weights are stored and converted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightPath {
    /// MXFP4 in device memory, dequantized tile by tile in SRAM ([`expert_gemm_mxfp4()`]).
    Mxfp4Online,
    /// MXFP4 in device memory, converted to bf16 in a device workspace first
    /// ([`dequant_mxfp4_experts()`]), then a bf16 GEMM ([`expert_gemm()`]). One workspace serves every
    /// weight matrix in turn, so peak memory holds one converted matrix at most.
    Mxfp4Offline,
    /// bf16 weights in device memory ([`expert_gemm()`]).
    Bf16,
    /// DeepSeek-style FP8 E4M3 weights with 128×128 block scales, scaled on chip
    /// ([`expert_gemm_fp8()`]): partial products scaled in f32.
    Fp8Block,
}

impl WeightPath {
    /// Bytes one `[E, N, K]` weight occupies in device memory in this path's stored format.
    pub fn stored_bytes(self, e: usize, n: usize, k: usize) -> u64 {
        match self {
            WeightPath::Bf16 => (e * n * k * 2) as u64,
            WeightPath::Fp8Block => (e * n * k + 4 * e * n.div_ceil(128) * k.div_ceil(128)) as u64,
            WeightPath::Mxfp4Online | WeightPath::Mxfp4Offline => {
                (e * n * (k / 2 + k.div_ceil(32))) as u64
            }
        }
    }
}

/// One expert weight `[E, N, K]` in device memory, as its path stores it.
pub use crate::weight::Weight as ExpertWeight;

/// A weight prepared for a run: device tensors plus the dequantized values the reference uses.
pub struct PreparedWeight {
    /// What the kernels read.
    pub device: ExpertWeight,
    /// Dequantized values `[E, N, K]` (functional runs).
    pub values: Option<Vec<f32>>,
    /// Shape `[E, N, K]`.
    pub shape: [usize; 3],
}

/// Draws a random `[E, N, K]` weight, quantizes it to MXFP4 with the OCP rule and stores it as
/// `path` requires (the bf16 path stores the dequantized values, so every path computes the same
/// product). Cost-only launchers get shape-only tensors.
pub fn prepare_weight(
    launcher: &Launcher,
    path: WeightPath,
    shape: [usize; 3],
    rng: &mut crate::testdata::Rng,
    name: &str,
) -> Result<PreparedWeight, dsl_core::SimError> {
    use accel_sim::formats::mx::{MxElem, MxTensor};
    let [e, n, k] = shape;
    let fail = |message: String| dsl_core::SimError::Launch {
        kernel: name.to_string(),
        message,
    };
    if path == WeightPath::Fp8Block {
        return prepare_fp8_block(launcher, shape, rng, name);
    }
    if path != WeightPath::Bf16 && k % 32 != 0 {
        return Err(fail(format!(
            "MXFP4 weight `{name}` needs K a multiple of the 32-element block, got K = {k}"
        )));
    }
    let functional = launcher.backend == Backend::Functional;
    let packed = if functional {
        let w = rng.vec(e * n * k, 1.0);
        Some(
            MxTensor::quantize(name, &w, &shape, MxElem::Fp4E2M1)
                .map_err(|er| fail(er.to_string()))?,
        )
    } else {
        None
    };
    let values = packed.as_ref().map(MxTensor::dequantize);
    let device = match path {
        WeightPath::Bf16 => ExpertWeight::Bf16(match &values {
            Some(v) => Tensor::from_f32(&shape, v).map_err(fail)?,
            None => Tensor::shape_only(&shape),
        }),
        _ => {
            let (bs, ss) = ([e, n, k / 2], [e, n, k / 32]);
            match &packed {
                Some(mx) => ExpertWeight::Mxfp4 {
                    blocks: Tensor::from_bytes(&bs, &mx.data).map_err(fail)?,
                    scales: Tensor::from_bytes(&ss, &mx.scales).map_err(fail)?,
                },
                None => ExpertWeight::Mxfp4 {
                    blocks: Tensor::shape_only(&bs),
                    scales: Tensor::shape_only(&ss),
                },
            }
        }
    };
    Ok(PreparedWeight {
        device,
        values,
        shape,
    })
}

/// FP8 block-scaled weights: random values quantized per expert with DeepSeek's rule
/// (`scale_inv = amax / 448` per 128×128 block).
fn prepare_fp8_block(
    launcher: &Launcher,
    shape: [usize; 3],
    rng: &mut crate::testdata::Rng,
    name: &str,
) -> Result<PreparedWeight, dsl_core::SimError> {
    use accel_sim::formats::packing::{fp8_block_dequant, fp8_block_quant};
    let [e, n, k] = shape;
    let fail = |message: String| dsl_core::SimError::Launch {
        kernel: name.to_string(),
        message,
    };
    let sshape = [e, n.div_ceil(128), k.div_ceil(128)];
    if launcher.backend != Backend::Functional {
        let device = ExpertWeight::Fp8Block {
            weight: Tensor::shape_only(&shape),
            scale_inv: Tensor::shape_only(&sshape),
        };
        return Ok(PreparedWeight {
            device,
            values: None,
            shape,
        });
    }
    let (mut codes, mut scales, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..e {
        let w = rng.vec(n * k, 1.0);
        let q = fp8_block_quant(name, &w, &[n, k], 128).map_err(|er| fail(er.to_string()))?;
        values.extend(
            fp8_block_dequant(name, &q.weight, &[n, k], &q.scale_inv, &q.scale_shape, 128)
                .map_err(|er| fail(er.to_string()))?,
        );
        codes.extend(q.weight);
        scales.extend(q.scale_inv);
    }
    let weight = Tensor::from_e4m3_codes(&shape, &codes).map_err(fail)?;
    let scale_inv = Tensor::from_f32(&sshape, &scales).map_err(fail)?;
    Ok(PreparedWeight {
        device: ExpertWeight::Fp8Block { weight, scale_inv },
        values: Some(values),
        shape,
    })
}

/// `y[e] = x[e] · W[e]ᵀ` along `path`; `workspace` (bf16, at least `[E, N, K]` elements) is
/// required by the offline path and reused by every call. Returns the launch reports in order.
pub fn expert_matmul(
    launcher: &Launcher,
    path: WeightPath,
    config: &Config,
    x: &Tensor<bf16>,
    w: &PreparedWeight,
    workspace: Option<&Tensor<bf16>>,
    y: &Tensor<f32>,
) -> Result<Vec<dsl_core::Report>, dsl_core::SimError> {
    // Unset BM: the smallest token tile that covers the batch (decode: 16; prefill: 128), so weights
    // are streamed as few times as possible.
    let tokens = x.shape().get(1).copied().unwrap_or(1);
    let tuned;
    let config = if config.get("BM").is_none() {
        let bm = [16i64, 32, 64, 128]
            .into_iter()
            .find(|b| *b as usize >= tokens)
            .unwrap_or(128);
        tuned = config.clone().with("BM", bm);
        &tuned
    } else {
        config
    };
    match (&w.device, path) {
        (ExpertWeight::Bf16(wt), WeightPath::Bf16) => Ok(vec![
            expert_gemm::launch(launcher, config, x, wt, y)?.report,
        ]),
        (ExpertWeight::Fp8Block { weight, scale_inv }, WeightPath::Fp8Block) => {
            // Tiles must sit inside one 128×128 scale block: BK = 128, BN ∈ {64, 128}.
            let bn = if config.get("BN") == Some(64) {
                64
            } else {
                128
            };
            let cfg = config.clone().with("BK", 128).with("BN", bn);
            Ok(vec![
                expert_gemm_fp8::launch(launcher, &cfg, x, weight, scale_inv, y)?.report,
            ])
        }
        (ExpertWeight::Mxfp4 { blocks, scales }, WeightPath::Mxfp4Online) => Ok(vec![
            expert_gemm_mxfp4::launch(launcher, config, x, blocks, scales, y)?.report,
        ]),
        (ExpertWeight::Mxfp4 { blocks, scales }, WeightPath::Mxfp4Offline) => {
            let ws = workspace.ok_or_else(|| dsl_core::SimError::Launch {
                kernel: dequant_mxfp4_experts::META.name.into(),
                message: "the offline path needs a bf16 workspace".into(),
            })?;
            // View the shared workspace as this weight's [E, N, K].
            let wv = ws
                .reshaped(&w.shape)
                .map_err(|message| dsl_core::SimError::Launch {
                    kernel: dequant_mxfp4_experts::META.name.into(),
                    message,
                })?;
            let convert =
                dequant_mxfp4_experts::launch(launcher, &Config::new(), blocks, scales, &wv)?
                    .report;
            let gemm = expert_gemm::launch(launcher, config, x, &wv, y)?.report;
            Ok(vec![convert, gemm])
        }
        _ => Err(dsl_core::SimError::Launch {
            kernel: expert_gemm::META.name.into(),
            message: format!("weights prepared for another path than {path:?}"),
        }),
    }
}

/// One expert-GEMM problem: `y[e] = x[e] · W[e]ᵀ`, `x [E, T, K]`, `W [E, N, K]`.
#[derive(Debug, Clone)]
pub struct ExpertGemmCase {
    /// Experts.
    pub experts: usize,
    /// Tokens routed to each expert.
    pub tokens: usize,
    /// Reduction size `K` (input features; a multiple of 32 for MXFP4).
    pub k: usize,
    /// Output features `N`.
    pub n: usize,
    /// Weight format and conversion.
    pub path: WeightPath,
    /// Tunable values of the GEMM kernel.
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// The outcome of an expert GEMM or FFN: the report (parts chained), peak device memory, output.
#[derive(Debug)]
pub struct ExpertRun {
    /// Cycles, bytes, roofline... of the whole path (conversion included).
    pub report: dsl_core::Report,
    /// Device bytes live at the peak: activations, stored weights, outputs and any workspace.
    pub peak_device_bytes: u64,
    /// Bytes of the stored weights (packed blocks + scales, or bf16).
    pub weight_bytes: u64,
    /// The output (functional runs).
    pub output: Option<Vec<f32>>,
}

fn bad(kernel: &str, message: String) -> dsl_core::SimError {
    dsl_core::SimError::Launch {
        kernel: kernel.to_string(),
        message,
    }
}

fn activation<T: Float>(
    launcher: &Launcher,
    rng: &mut crate::testdata::Rng,
    shape: &[usize],
) -> Result<Tensor<T>, dsl_core::SimError> {
    if launcher.backend == Backend::Functional {
        let n: usize = shape.iter().product();
        Tensor::from_f32(shape, &rng.vec(n, 1.0)).map_err(|m| bad("expert activations", m))
    } else {
        Ok(Tensor::shape_only(shape))
    }
}

fn output<T: Float>(launcher: &Launcher, shape: &[usize]) -> Tensor<T> {
    if launcher.backend == Backend::Functional {
        Tensor::poisoned(shape)
    } else {
        Tensor::shape_only(shape)
    }
}

fn workspace(launcher: &Launcher, path: WeightPath, elems: usize) -> Option<Tensor<bf16>> {
    (path == WeightPath::Mxfp4Offline).then(|| output::<bf16>(launcher, &[elems]))
}

/// `[E, T, N]` = per-expert `x · Wᵀ` in f64.
fn reference_matmul(x: &[f32], w: &[f32], e: usize, t: usize, n: usize, k: usize) -> Vec<f64> {
    let mut want = vec![0.0f64; e * t * n];
    for ex in 0..e {
        let wt = crate::reference::transpose(&w[ex * n * k..(ex + 1) * n * k], n, k);
        let part = crate::reference::gemm(&x[ex * t * k..(ex + 1) * t * k], &wt, t, n, k);
        want[ex * t * n..(ex + 1) * t * n].copy_from_slice(&part);
    }
    want
}

/// Runs an expert GEMM on random data (bf16 activations, MXFP4-quantized weights stored as `path`
/// requires, output poisoned) and checks it against the f64 product of the dequantized weights.
pub fn run_expert_gemm(
    launcher: &Launcher,
    case: &ExpertGemmCase,
) -> Result<ExpertRun, dsl_core::SimError> {
    let (e, t, k, n) = (case.experts, case.tokens, case.k, case.n);
    if e == 0 || t == 0 || k == 0 || n == 0 {
        return Err(bad(
            "expert_gemm",
            format!("empty problem: experts {e}, tokens {t}, K {k}, N {n}"),
        ));
    }
    let mut rng = crate::testdata::Rng::new(case.seed);
    let x = activation::<bf16>(launcher, &mut rng, &[e, t, k])?;
    let w = prepare_weight(launcher, case.path, [e, n, k], &mut rng, "expert weight")?;
    let y = output::<f32>(launcher, &[e, t, n]);
    let ws = workspace(launcher, case.path, e * n * k);
    let parts = expert_matmul(launcher, case.path, &case.config, &x, &w, ws.as_ref(), &y)?;
    let mut report = dsl_core::Report::chain(parts[parts.len() - 1].kernel.as_str(), &parts)
        .expect("at least one launch");
    let out = y.to_vec();
    if let (Some(o), Some(xv), Some(wv)) = (&out, x.to_vec(), &w.values) {
        report.max_rel_error = Some(crate::reference::rel_error(
            o,
            &reference_matmul(&xv, wv, e, t, n, k),
        ));
    }
    let weight_bytes = case.path.stored_bytes(e, n, k);
    let act = (e * t * k * 2 + e * t * n * 4) as u64;
    let ws_bytes = ws.map_or(0, |w| 2 * w.len() as u64);
    Ok(ExpertRun {
        report,
        peak_device_bytes: act + weight_bytes + ws_bytes,
        weight_bytes,
        output: out,
    })
}

/// One SwiGLU expert FFN: `y[e] = (SiLU(x Wgᵀ) ⊙ (x Wuᵀ)) Wdᵀ` with `x [E, T, H]`,
/// `Wg, Wu [E, I, H]`, `Wd [E, H, I]`.
#[derive(Debug, Clone)]
pub struct ExpertFfnCase {
    /// Experts.
    pub experts: usize,
    /// Tokens routed to each expert.
    pub tokens: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Expert intermediate size `I`.
    pub inter: usize,
    /// Weight format and conversion.
    pub path: WeightPath,
    /// Tunable values of the GEMM kernel.
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// Runs the SwiGLU expert FFN: gate, up, activation, down — four (online) or seven (offline:
/// three conversions through one shared workspace) launches, chained in one report; checked
/// against the f64 FFN of the dequantized weights and the bf16-rounded activation.
pub fn run_expert_ffn(
    launcher: &Launcher,
    case: &ExpertFfnCase,
) -> Result<ExpertRun, dsl_core::SimError> {
    let (e, t, h, i) = (case.experts, case.tokens, case.hidden, case.inter);
    if e == 0 || t == 0 || h == 0 || i == 0 {
        return Err(bad(
            "expert_ffn",
            format!("empty problem: experts {e}, tokens {t}, hidden {h}, inter {i}"),
        ));
    }
    let mut rng = crate::testdata::Rng::new(case.seed);
    let x = activation::<bf16>(launcher, &mut rng, &[e, t, h])?;
    let wg = prepare_weight(launcher, case.path, [e, i, h], &mut rng, "gate_proj")?;
    let wu = prepare_weight(launcher, case.path, [e, i, h], &mut rng, "up_proj")?;
    let wd = prepare_weight(launcher, case.path, [e, h, i], &mut rng, "down_proj")?;
    let (g, u) = (
        output::<f32>(launcher, &[e, t, i]),
        output::<f32>(launcher, &[e, t, i]),
    );
    let act = output::<bf16>(launcher, &[e, t, i]);
    let y = output::<f32>(launcher, &[e, t, h]);
    let ws = workspace(launcher, case.path, e * i * h);
    let mut parts = expert_matmul(launcher, case.path, &case.config, &x, &wg, ws.as_ref(), &g)?;
    parts.extend(expert_matmul(
        launcher,
        case.path,
        &case.config,
        &x,
        &wu,
        ws.as_ref(),
        &u,
    )?);
    parts.push(swiglu::launch(launcher, &Config::new(), &g, &u, &act)?.report);
    parts.extend(expert_matmul(
        launcher,
        case.path,
        &case.config,
        &act,
        &wd,
        ws.as_ref(),
        &y,
    )?);
    let mut report = dsl_core::Report::chain("expert_ffn", &parts).expect("launches");
    let out = y.to_vec();
    if let (Some(o), Some(xv), Some(gv), Some(uv), Some(dv)) =
        (&out, x.to_vec(), &wg.values, &wu.values, &wd.values)
    {
        let gate = reference_matmul(&xv, gv, e, t, i, h);
        let up = reference_matmul(&xv, uv, e, t, i, h);
        // The kernel rounds the activation to bf16 before the down projection; so does the reference.
        let mut hid: Vec<f32> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| (g / (1.0 + (-g).exp()) * u) as f32)
            .collect();
        accel_sim::functional::round_to(&mut hid, accel_sim::DType::Bf16);
        let want = reference_matmul(&hid, dv, e, t, h, i);
        report.max_rel_error = Some(crate::reference::rel_error(o, &want));
    }
    let weight_bytes = 2 * case.path.stored_bytes(e, i, h) + case.path.stored_bytes(e, h, i);
    let acts = (e * t * h * 2 + 2 * e * t * i * 4 + e * t * i * 2 + e * t * h * 4) as u64;
    let ws_bytes = ws.map_or(0, |w| 2 * w.len() as u64);
    Ok(ExpertRun {
        report,
        peak_device_bytes: acts + weight_bytes + ws_bytes,
        weight_bytes,
        output: out,
    })
}
