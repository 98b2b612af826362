//! Step 2 of `day0 run`: a tiny-config numeric check of each layer kind the model has.
//!
//! Every kernel a layer kind launches on the card (MLA's flash prefill and latent decode, DSA's
//! indexer + sparse attention, GQA prefill and paged decode, the gated-delta recurrences and their
//! short convolution, the expert GEMM in the checkpoint's expert format, the dense projections in
//! theirs, the fused norm) runs functionally at the model's own head and state dimensions, on a
//! handful of tokens and fresh random inputs, and is compared with its f64 reference. The
//! dimensions that set the numerics (head sizes, the GQA ratio, DSA's `top_k`, the weight format)
//! are the model's; what only sets the cost (tokens, heads, experts) is cut so the whole check
//! takes a fraction of a second beside the simulated phases.
//!
//! f32 cases are held to 1e-4 (an f32 kernel differs from f64 only in accumulation order); cases
//! in a stored low-precision format to what that format allows (tolerances as in the kernels'
//! own tests).

use crate::suite::SuiteEntry;
use dsl_core::Tensor;
use kernels::attention::decode::{run_decode_gqa_batch_with, run_decode_latent, DecodeCase};
use kernels::attention::prefill::{run_prefill, PrefillCase};
use kernels::attention::sparse::{run_dsa_decode, DsaCase};
use kernels::gemm::GemmDtype;
use kernels::linear::{activations_as_multiplied, run_linear_weight};
use kernels::linear_attention::conv::{run_model_short_conv, ConvCase};
use kernels::linear_attention::runner::{run_delta, DeltaCase, DeltaMode};
use kernels::moe::expert_gemm::{prepare_weight, WeightPath};
use kernels::norm::{run_rmsnorm_residual, RmsNormCase};
use kernels::reference::{linear as linear_ref, rel_error};
use kernels::testdata::Rng;
use kernels::weight::Format;
use model::config::{AttentionKind, Decay, ExpertActivation, FfnKind, ModelConfig, WeightFormat};

/// Tolerance of an f32 case: accumulation order only.
const F32_TOL: f64 = 1e-4;
/// Tolerance of a case with bf16 inputs and outputs (rounding at 2^-8, as the kernel suite).
const BF16_TOL: f64 = 1e-2;
/// Seed of every case's inputs (fixed, so a failure reproduces with `day0 kernel`).
const SEED: u64 = 7;
/// Query tokens of a prefill check: more than one query tile edge, well under a second.
const PREFILL_TOKENS: usize = 48;
/// Context of a decode check: several pages, a partial last one.
const DECODE_CONTEXT: usize = 100;
/// Tokens per page of the decode checks' paged caches.
const PAGE: usize = 16;

/// The checks of `cfg`'s layer kinds, in model order: attention kinds first, then the FFN, the
/// dense projections and the norm. Empty only for a model with no layer day0 knows.
pub fn entries(cfg: &ModelConfig) -> Vec<SuiteEntry> {
    let has = |k: &AttentionKind| cfg.layers.iter().any(|l| &l.attention == k);
    let mut out = Vec::new();
    if let Some(m) = cfg.mla.clone() {
        if has(&AttentionKind::Mla) || has(&AttentionKind::SparseMla) {
            let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
            out.push(prefill_entry("mla", 2, 2, qk, m.v_head_dim, 0, false));
            let latent = m.kv_lora_rank + m.qk_rope_head_dim;
            let heads = m.heads.clamp(1, 16);
            out.push(entry(
                format!(
                    "mla: paged_decode_latent heads {heads} latent {latent} ctx {DECODE_CONTEXT}"
                ),
                F32_TOL,
                move |l| {
                    let case = decode_case(heads, 1, latent, m.kv_lora_rank, true);
                    Ok(run_decode_latent(l, &case)?.report)
                },
            ));
        }
        if let (Some(ix), true) = (cfg.indexer.clone(), has(&AttentionKind::SparseMla)) {
            let case = DsaCase {
                seq: 1,
                heads: m.heads.clamp(1, 8),
                ctx: 4 * ix.topk.clamp(1, 64),
                topk: ix.topk.clamp(1, 64),
                index_heads: ix.heads.clamp(1, 4),
                index_dim: ix.head_dim,
                head_dim: m.kv_lora_rank + m.qk_rope_head_dim,
                v_head_dim: m.kv_lora_rank,
                page_size: PAGE,
                seed: SEED,
            };
            out.push(entry(
                format!(
                    "dsa: lightning indexer + top-{} sparse MLA, ctx {}",
                    case.topk, case.ctx
                ),
                F32_TOL,
                move |l| Ok(run_dsa_decode(l, &case)?.total),
            ));
        }
    }
    if let Some(g) = cfg.gqa.clone() {
        // Whole-context and windowed layers, each at the model's group size (query heads per
        // key/value head) on at most two groups; the window capped so that the few tokens of the
        // check still cross it.
        let group = (g.heads / g.kv_heads.max(1)).clamp(1, 8);
        let kv = g.kv_heads.clamp(1, 2);
        let window = g.sliding_window.unwrap_or(0).clamp(1, PREFILL_TOKENS / 3);
        // A chunked layer's prefill is causal attention chunk by chunk; its decode token reads
        // its chunk so far (the chunk capped so that the check's context crosses a boundary).
        let chunk = g.attention_chunk.unwrap_or(1).clamp(1, DECODE_CONTEXT / 2);
        for (kind, label, window, decode_window) in [
            (AttentionKind::Gqa, "gqa", 0, 0),
            (AttentionKind::SlidingGqa, "sliding gqa", window, window),
            (
                AttentionKind::ChunkedGqa,
                "chunked gqa",
                0,
                (DECODE_CONTEXT - 1) % chunk + 1,
            ),
            (AttentionKind::NopeGqa, "nope gqa", 0, 0),
        ] {
            if !has(&kind) {
                continue;
            }
            let (heads, d, sinks) = (group * kv, g.head_dim, g.sinks);
            out.push(prefill_entry(label, heads, kv, d, d, window, sinks));
            out.push(entry(
                format!("{label}: paged_decode_gqa_batch heads {heads}/{kv} head_dim {d} ctx {DECODE_CONTEXT}{}{}",
                    if decode_window > 0 { format!(" window {decode_window}") } else { String::new() },
                    if sinks { " sinks" } else { "" }),
                F32_TOL,
                move |l| {
                    let case = decode_case(heads, kv, d, d, false);
                    Ok(run_decode_gqa_batch_with(l, &case, &[DECODE_CONTEXT], decode_window, sinks)?.report)
                },
            ));
        }
    }
    if let (Some(la), true) = (
        cfg.linear_attention.clone(),
        has(&AttentionKind::LinearAttention),
    ) {
        let decay = match la.decay {
            Decay::Scalar => kernels::linear_attention::reference::Decay::Scalar,
            Decay::PerChannel => kernels::linear_attention::reference::Decay::PerChannel,
        };
        let ratio = (la.value_heads / la.key_heads.max(1)).clamp(1, 2);
        let channels =
            (la.key_heads * la.key_head_dim * 2 + la.value_heads * la.value_head_dim).clamp(1, 512);
        // The prompt form the model runs (`launch_short_conv`), at the config's tap count.
        let taps = la.conv_kernel;
        out.push(entry(
            format!(
                "linear attention: short_conv {taps} taps channels {channels} seq {PREFILL_TOKENS}"
            ),
            F32_TOL,
            move |l| {
                let case = ConvCase {
                    seq: PREFILL_TOKENS,
                    channels,
                    dtype: GemmDtype::F32,
                    config: dsl_core::Config::new(),
                    seed: SEED,
                };
                Ok(run_model_short_conv(l, &case, taps)?.launch.report)
            },
        ));
        for (mode, seq) in [
            (DeltaMode::Chunked, PREFILL_TOKENS),
            (DeltaMode::Recurrent, 4),
        ] {
            let case = DeltaCase {
                decay,
                mode,
                seq,
                k_heads: 1,
                v_heads: ratio,
                dk: la.key_head_dim,
                dv: la.value_head_dim,
                dtype: GemmDtype::F32,
                config: dsl_core::Config::new(),
                seed: SEED,
            };
            out.push(entry(
                format!(
                    "linear attention: {} dk {} dv {} seq {seq}",
                    case.kernel_name(),
                    case.dk,
                    case.dv
                ),
                F32_TOL,
                move |l| run_delta_fitting(l, &case),
            ));
        }
    }
    if let (Some(moe), true) = (
        cfg.moe.clone(),
        cfg.layers.iter().any(|l| l.ffn == FfnKind::Moe),
    ) {
        // The forward's expert kernel: the grouped GEMM over run-time row ranges, in the
        // checkpoint's format (FP8 rows quantized per token on devices with an FP8 mode).
        let format = match moe.expert_format {
            WeightFormat::Mxfp4 => Format::Mxfp4,
            WeightFormat::Fp8Block { .. } => Format::Fp8Block,
            WeightFormat::Int4Group { group } => Format::Int4 { group },
            _ => Format::Bf16,
        };
        let what = match format {
            Format::Int4 { group } => format!("INT4 weights (scale per {group})"),
            f => format!("{} weights", f.name()),
        };
        out.push(entry(
            format!("moe: grouped expert GEMM, {what}, 4 experts (one empty) × 32 rows, 256→128"),
            // The reference multiplies the values the kernel holds: only f32 accumulation
            // order is left (measured 1e-7..5e-7 on every format and device).
            F32_TOL,
            move |l| run_grouped_experts(l, format, &[9, 0, 14, 9], 128, 256),
        ));
        let inter = moe.intermediate_size.clamp(1, 512);
        if let ExpertActivation::ClampedSwiglu { alpha, limit } = moe.activation {
            out.push(entry(
                format!("moe: clamped SwiGLU 16x{inter} (alpha {alpha}, limit {limit})"),
                F32_TOL,
                move |l| run_clamped_swiglu(l, 16, inter, alpha as f32, limit as f32),
            ));
        }
        if moe.biases {
            out.push(entry(
                format!("moe: per-expert biases, 4 experts (one empty) × {inter}"),
                F32_TOL,
                move |l| run_expert_biases(l, &[5, 0, 17, 3], inter),
            ));
        }
    }
    // The dense projections in the checkpoint's format, through the kernels the forward picks
    // for the device (FP8 runs W8A8 where the matrix unit has an FP8 mode, W8A16 where not).
    let format = match cfg.weight_format {
        WeightFormat::Fp8Block { .. } => Format::Fp8Block,
        _ => Format::Bf16,
    };
    out.push(entry(
        format!("projections: {} linear 32x256x512", format.name()),
        F32_TOL,
        move |l| run_projection(l, format, 32, 256, 512),
    ));
    let hidden = cfg.hidden_size.clamp(1, 2048);
    out.push(entry(
        format!("norms: rmsnorm_residual 16x{hidden} bf16"),
        BF16_TOL,
        move |l| {
            let case = RmsNormCase {
                rows: 16,
                hidden,
                dtype: GemmDtype::Bf16,
                config: dsl_core::Config::new(),
                eps: 1e-6,
                seed: SEED,
            };
            Ok(run_rmsnorm_residual(l, &case)?.launch.report)
        },
    ));
    out
}

/// [`run_delta`] with the largest chunk (up to 64) whose tiles fit the device's SRAM, as the
/// model's forward picks it; the recurrent form has no chunk.
fn run_delta_fitting(
    launcher: &dsl_core::Launcher,
    case: &DeltaCase,
) -> Result<accel_sim::Report, accel_sim::SimError> {
    if case.mode == DeltaMode::Recurrent {
        return Ok(run_delta(launcher, case)?.launch.report);
    }
    let meta = kernels::linear_attention::runner::delta_meta(case.mode, case.decay);
    let mut chunks = kernels::tile_choice::declared(meta, "C");
    chunks.retain(|c| *c <= 64);
    chunks.sort_unstable_by(|a, b| b.cmp(a));
    let mut last = None;
    for c in chunks {
        let mut at = case.clone();
        at.config = at.config.with("C", c);
        match run_delta(launcher, &at) {
            Err(e @ accel_sim::SimError::SramOverflow { .. }) => last = Some(e),
            r => return Ok(r?.launch.report),
        }
    }
    Err(last.unwrap_or_else(|| accel_sim::SimError::Launch {
        kernel: meta.name.into(),
        message: "the kernel declares no chunk size up to 64".into(),
    }))
}

/// How [`prepare_weight`] stores a random weight in `format` (floats as bf16).
fn weight_path(format: Format) -> WeightPath {
    match format {
        Format::Fp8Block => WeightPath::Fp8Block,
        Format::Mxfp4 => WeightPath::Mxfp4Online,
        _ => WeightPath::Bf16,
    }
}

/// One dense linear layer `y [m, n] = x [m, k] · wᵀ` with a random weight stored in `format`,
/// against the f64 product of the values the kernels hold (the stored-weights test's
/// comparison): its last launch's report carries the error.
fn run_projection(
    launcher: &dsl_core::Launcher,
    format: Format,
    m: usize,
    n: usize,
    k: usize,
) -> Result<accel_sim::Report, accel_sim::SimError> {
    let bad = |message: String| accel_sim::SimError::Launch {
        kernel: "linear".into(),
        message,
    };
    let path = weight_path(format);
    let mut rng = Rng::new(SEED);
    let p = prepare_weight(launcher, path, [1, n, k], &mut rng, "projection weight")?;
    let w = p.device.without_expert_axis().map_err(bad)?;
    let wv = p
        .values
        .ok_or_else(|| bad("a functional launcher gives the weight's values".into()))?;
    let xv = rng.vec(m * k, 1.0);
    let x = Tensor::<f32>::from_f32(&[m, k], &xv).map_err(bad)?;
    let y = Tensor::<f32>::poisoned(&[m, n]);
    let launches = run_linear_weight(launcher, &x, &w, &y)?;
    let want = linear_ref(
        &activations_as_multiplied(launcher, &xv, m, k, format),
        &wv,
        m,
        n,
        k,
    );
    let got = y
        .to_vec()
        .ok_or_else(|| bad("a functional launch holds its output".into()))?;
    let (_, last) = launches
        .into_iter()
        .last()
        .ok_or_else(|| bad("the linear layer launched nothing".into()))?;
    let mut report = last.report;
    report.max_rel_error = Some(rel_error(&got, &want));
    Ok(report)
}

/// The grouped expert GEMM in `format` (bf16, block FP8, MXFP4 or group-scaled INT4) on
/// `counts[e]` random rows per expert (one expert may get none), `k` inputs to `n` outputs,
/// against the f64 product of the weights' values as the kernel holds them and the rows as it
/// multiplies them ([`activations_as_multiplied`]); the output starts poisoned.
fn run_grouped_experts(
    launcher: &dsl_core::Launcher,
    format: Format,
    counts: &[usize],
    n: usize,
    k: usize,
) -> Result<accel_sim::Report, accel_sim::SimError> {
    let bad = |message: String| accel_sim::SimError::Launch {
        kernel: "moe_grouped_linear".into(),
        message,
    };
    let mut rng = Rng::new(SEED);
    let shape = [counts.len(), n, k];
    let (w, wv) = match format {
        Format::Int4 { group } => {
            kernels::testdata::int4_weight(shape, group, &mut rng).map_err(bad)?
        }
        f => {
            let p = prepare_weight(launcher, weight_path(f), shape, &mut rng, "expert weight")?;
            let values = p
                .values
                .ok_or_else(|| bad("a functional launcher gives the weight's values".into()))?;
            (p.device, values)
        }
    };
    let offsets = kernels::testdata::offsets_of(counts);
    let rows = offsets[counts.len()];
    let xv = rng.vec(rows * k, 1.0);
    let x = Tensor::<f32>::from_f32(&[rows, k], &xv).map_err(bad)?;
    let off_i32: Vec<i32> = offsets.iter().map(|o| *o as i32).collect();
    let off = Tensor::from_indices(&[counts.len() + 1, 1], &off_i32).map_err(bad)?;
    let y = Tensor::<f32>::poisoned(&[rows, n]);
    let launches = kernels::moe::grouped::run_grouped_linear_weight(launcher, &x, &w, &off, &y)?;
    let want = kernels::moe::reference::grouped_linear(
        &activations_as_multiplied(launcher, &xv, rows, k, format),
        &wv,
        &offsets,
        n,
        k,
    )
    .map_err(|e| bad(e.to_string()))?;
    let got = y
        .to_vec()
        .ok_or_else(|| bad("a functional launch holds its output".into()))?;
    let (_, mut report) = launches
        .into_iter()
        .last()
        .ok_or_else(|| bad("the grouped GEMM launched nothing".into()))?;
    report.max_rel_error = Some(rel_error(&got, &want));
    Ok(report)
}

/// gpt-oss's clamped SwiGLU on `rows × cols` random inputs wide enough (±2·limit) that both
/// clamps bite, against its f64 reference; the output starts poisoned.
fn run_clamped_swiglu(
    l: &dsl_core::Launcher,
    rows: usize,
    cols: usize,
    alpha: f32,
    limit: f32,
) -> Result<accel_sim::Report, accel_sim::SimError> {
    use kernels::moe::expert_gemm::swiglu_clamped;
    let bad = |message: String| accel_sim::SimError::Launch {
        kernel: swiglu_clamped::META.name.into(),
        message,
    };
    let mut rng = Rng::new(SEED);
    let (gv, uv) = (
        rng.vec(rows * cols, 2.0 * limit),
        rng.vec(rows * cols, 2.0 * limit),
    );
    let g = Tensor::<f32>::from_f32(&[rows, cols], &gv).map_err(bad)?;
    let u = Tensor::<f32>::from_f32(&[rows, cols], &uv).map_err(bad)?;
    let h = Tensor::<f32>::poisoned(&[rows, cols]);
    let cfg = dsl_core::Config::new().with("BR", 16).with("BC", 128);
    let mut report = swiglu_clamped::launch(l, &cfg, &g, &u, &h, alpha, limit)?.report;
    let want = kernels::moe::reference::swiglu_clamped(&gv, &uv, alpha as f64, limit as f64);
    let got = h
        .to_vec()
        .ok_or_else(|| bad("a functional launch holds its output".into()))?;
    report.max_rel_error = Some(rel_error(&got, &want));
    Ok(report)
}

/// Per-expert biases added to expert-grouped rows (`counts[e]` rows of expert `e`, `n` wide),
/// against the f64 reference.
fn run_expert_biases(
    l: &dsl_core::Launcher,
    counts: &[usize],
    n: usize,
) -> Result<accel_sim::Report, accel_sim::SimError> {
    let bad = |message: String| accel_sim::SimError::Launch {
        kernel: kernels::moe::grouped::grouped_add_bias::META.name.into(),
        message,
    };
    let offsets = kernels::testdata::offsets_of(counts);
    let (e, rows) = (counts.len(), offsets[counts.len()]);
    let mut rng = Rng::new(SEED);
    let (yv, bv) = (rng.vec(rows * n, 1.0), rng.vec(e * n, 1.0));
    let y = Tensor::<f32>::from_f32(&[rows, n], &yv).map_err(bad)?;
    let bias = Tensor::<f32>::from_f32(&[e, n], &bv).map_err(bad)?;
    let idx: Vec<i32> = offsets.iter().map(|o| *o as i32).collect();
    let off = Tensor::from_indices(&[e + 1], &idx).map_err(bad)?;
    let mut report = kernels::moe::grouped::run_grouped_add_bias(l, &y, &bias, &off)?.report;
    let want = kernels::moe::reference::grouped_bias(&yv, &bv, &offsets, n)
        .map_err(|e| bad(e.to_string()))?;
    let got = y
        .to_vec()
        .ok_or_else(|| bad("a functional launch holds its output".into()))?;
    report.max_rel_error = Some(rel_error(&got, &want));
    Ok(report)
}

/// A suite entry from a name, a tolerance and a run.
fn entry(
    name: String,
    tolerance: f64,
    run: impl Fn(&dsl_core::Launcher) -> Result<accel_sim::Report, accel_sim::SimError> + 'static,
) -> SuiteEntry {
    SuiteEntry {
        name,
        tolerance,
        run: Box::new(run),
    }
}

/// Causal flash prefill over [`PREFILL_TOKENS`] tokens at the layer kind's head dimensions, over
/// a sliding window of `window` keys (0: none), with attention sinks when the layer has them.
fn prefill_entry(
    kind: &str,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    v_head_dim: usize,
    window: usize,
    sinks: bool,
) -> SuiteEntry {
    let w = if window > 0 {
        format!(" window {window}")
    } else {
        String::new()
    } + if sinks { " sinks" } else { "" };
    entry(
        format!(
            "{kind}: flash_prefill heads {heads}/{kv_heads} head_dim {head_dim}/{v_head_dim} seq {PREFILL_TOKENS}{w}"
        ),
        F32_TOL,
        move |l| {
            let case = PrefillCase {
                window,
                sinks,
                heads,
                kv_heads,
                head_dim,
                v_head_dim,
                sq: PREFILL_TOKENS,
                skv: PREFILL_TOKENS,
                dtype: GemmDtype::F32,
                config: dsl_core::Config::new(),
                seed: SEED,
            };
            Ok(run_prefill(l, &case)?.launch.report)
        },
    )
}

/// A paged decode over [`DECODE_CONTEXT`] tokens in two splits, f32 cache.
fn decode_case(
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    v_head_dim: usize,
    shared_kv: bool,
) -> DecodeCase {
    DecodeCase {
        heads,
        kv_heads,
        head_dim,
        v_head_dim,
        shared_kv,
        ctx: DECODE_CONTEXT,
        page_size: PAGE,
        splits: 2,
        dtype: GemmDtype::F32,
        fp8_kv: false,
        seed: SEED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preset(name: &str) -> ModelConfig {
        model::plan::presets::load_model(name).expect("built-in preset")
    }

    #[test]
    fn every_layer_kind_of_the_presets_is_checked() {
        let names = |cfg: &ModelConfig| -> Vec<String> {
            entries(cfg).into_iter().map(|e| e.name).collect()
        };
        let hybrid = names(&preset("hybrid-3t"));
        for want in [
            "mla:",
            "dsa:",
            "linear attention:",
            "moe: grouped expert GEMM, mxfp4 weights",
        ] {
            assert!(
                hybrid.iter().any(|n| n.starts_with(want)),
                "{want} missing from {hybrid:?}"
            );
        }
        let v3 = names(&preset("deepseek-v3"));
        assert!(
            v3.iter()
                .any(|n| n.starts_with("moe: grouped expert GEMM, fp8 e4m3")),
            "{v3:?}"
        );
        assert!(
            v3.iter().any(|n| n.starts_with("projections: fp8")),
            "{v3:?}"
        );
        assert!(!v3.iter().any(|n| n.starts_with("dsa:")), "{v3:?}");
        let qwen = names(&preset("qwen3-235b-a22b"));
        assert!(qwen.iter().any(|n| n.starts_with("gqa:")), "{qwen:?}");
        // Experts are checked through the grouped kernel the forward runs, in the
        // checkpoint's format (INT4 too), not the library's fused expert GEMM.
        let qwen_next = names(&preset("qwen3-next-80b"));
        assert!(
            qwen_next
                .iter()
                .any(|n| n.starts_with("moe: grouped expert GEMM, bf16 weights")),
            "{qwen_next:?}"
        );
        let k2t = names(&preset("kimi-k2-thinking"));
        assert!(
            k2t.iter()
                .any(|n| n.starts_with("moe: grouped expert GEMM, INT4 weights (scale per 32)")),
            "{k2t:?}"
        );
        assert!(!k2t.iter().any(|n| n.contains("bf16 weights")), "{k2t:?}");
    }

    /// `day0 run --model M --cluster C` must not stop at step 2 for any built-in pair: a check
    /// whose tiles a device cannot hold is a bug in the check, not in the model.
    #[test]
    fn every_check_of_every_preset_passes_on_every_device() {
        for device in accel_sim::DevicePreset::builtin_names() {
            let launcher = dsl_core::Launcher::for_device(device).expect("built-in preset");
            for m in model::plan::presets::MODEL_PRESETS {
                let (passed, failures) =
                    crate::suite::check_entries(&launcher, entries(&preset(m.name)));
                assert!(failures.is_empty(), "{} on {device}: {failures:?}", m.name);
                assert!(passed >= 4, "{} on {device}: {passed}", m.name);
            }
        }
    }
}
