//! `day0 forward` and `day0 validate`: a released checkpoint run numerically on the simulator.

use clap::Args;
use day0::tune_model::ResolvedTuning;
use dsl_core::Launcher;
use model::forward::routing::{ExpertLoad, RoutingModel};
use model::forward::validate::validate;
use model::forward::{argmax, OpStats, Precision, Runner};
use model::plan::estimate::{ops_over_kinds, OpCost, OpTable};
use std::path::{Path, PathBuf};

/// Arguments of `day0 forward`.
#[derive(Args)]
pub struct ForwardArgs {
    /// Checkpoint directory: config.json + model.safetensors (or model.safetensors.index.json and
    /// its shards), as `save_pretrained` writes it.
    #[arg(long, required_unless_present = "config", conflicts_with = "config")]
    model_dir: Option<PathBuf>,
    /// A config.json alone (no weights): with `--cost-only`, the same forward code on shape-only
    /// weights at the model's real sizes.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Cost-only: shape-only tensors, simulated cycles without numbers (needs no weights).
    #[arg(long)]
    cost_only: bool,
    /// Cost-only runs: prompt tokens of the one sequence (the prefill, up to the first token).
    /// Default 1024, or the recording's with `--routing replay:FILE`.
    #[arg(long)]
    prompt_len: Option<usize>,
    /// Cost-only runs: output tokens (the first comes from the prefill, each other from one
    /// decode step). Default 16, or the recording's with `--routing replay:FILE`.
    #[arg(long)]
    output_len: Option<usize>,
    /// Cost-only runs: one decode step of this many sequences at once (with `--context`), priced
    /// as `day0 run` prices a card: batched MLA and Gated DeltaNet decode, the other per-sequence
    /// operators once per sequence. With `--prompt-len`, also one request's prefill (TTFT).
    #[arg(long)]
    batch: Option<usize>,
    /// Cost-only runs: the context each sequence of the `--batch` decode step attends to
    /// (default: --prompt-len).
    #[arg(long)]
    context: Option<usize>,
    /// Cost-only runs of a multimodal config (with a `vision_config`): an image of `WIDTHxHEIGHT`
    /// pixels in the prompt (repeatable). Its vision encoder runs before the language prefill and
    /// its tokens join the prompt (`--prompt-len` counts the text); TTFT reports the two apart.
    #[arg(long = "image-size")]
    pub image_size: Vec<String>,
    /// Cost-only runs: how tokens pick experts and DSA layers pick past tokens: `uniform`
    /// (balanced experts), `zipf:S` (expert e picked ∝ 1/(e+1)^S), or `replay:FILE` (what a
    /// functional run recorded with `--record-routing`: the cost-only run then launches exactly
    /// what it launched). `--batch` steps take `uniform` or `zipf:S` (the hottest expert-parallel
    /// rank sets the step).
    #[arg(long, default_value = "uniform")]
    routing: String,
    /// Numeric runs: record each step's token ids, router choices and DSA selections to this JSON
    /// file, for a cost-only `--routing replay:FILE`.
    #[arg(long)]
    record_routing: Option<PathBuf>,
    /// Prompt token ids, comma-separated (numeric runs of a checkpoint).
    #[arg(long, value_delimiter = ',')]
    tokens: Vec<i64>,
    /// Numeric runs of a multimodal checkpoint: an image file (PNG or JPEG; repeat for several,
    /// in prompt order), processed as the checkpoint's `preprocessor_config.json` says and encoded
    /// by its vision encoder. `--tokens` holds the config's `image_token_id` once where each image
    /// goes (widened to the image's token count) or exactly that many times.
    #[arg(long)]
    image: Vec<PathBuf>,
    /// Greedy-generate this many tokens after the prompt.
    #[arg(long, default_value_t = 0)]
    generate: usize,
    /// Write the prompt logits to this safetensors file (one f32 tensor `logits` [tokens, vocab]).
    #[arg(long)]
    logits_out: Option<PathBuf>,
    /// Weight precision: `f32` (the reference path the goldens check) or `native` (the
    /// checkpoint's formats: block-FP8, MXFP4 or bf16 weights, each read by its own kernel; a
    /// float checkpoint's numeric run holds its weights in bf16). Default: native for cost-only
    /// runs, f32 for numeric runs.
    #[arg(long)]
    precision: Option<Precision>,
    /// KV cache type: `bf16`, `fp8` (every pool, the MLA latent, dense or sparse, DSA indexer keys
    /// and GQA keys and values, as E4M3 codes plus an f32 scale per token and cached row) or
    /// `f32`. Default: the precision's own (f32 on the reference path, bf16 at native precision).
    #[arg(long)]
    kv_dtype: Option<model::forward::CacheFormat>,
    /// Device preset the kernels run on.
    #[arg(long, default_value = "npu-910b")]
    device: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Numeric runs: stop at the first launch that stores a NaN or ±∞, naming the kernel, its
    /// line, the tensor and the element.
    #[arg(long)]
    check_finite: bool,
    /// Pin an operator's implementation, `OP=NAME` (repeatable), e.g.
    /// `attention_decode_batch=paged_decode_gqa_batch` runs the GQA decode on its DSL prototype
    /// (`day0 kernels` lists the implementations; by default each launch runs the fastest
    /// verified implementation at its shapes).
    #[arg(long = "impl", value_name = "OP=NAME")]
    impls: Vec<String>,
    /// Tuned tiles (`day0 tune --model`): a tuning file, or `none` for the heuristic tiles.
    /// Cost-only runs default to the cached file for this model and device, when `day0 tune
    /// --model` wrote one; numeric runs use a file only when given.
    #[arg(long, value_name = "FILE")]
    tuning: Option<String>,
}

/// `--impl OP=NAME` flags as (operator, implementation) pairs.
pub(crate) fn parse_impls(impls: &[String]) -> Result<Vec<(&str, &str)>, String> {
    impls
        .iter()
        .map(|spec| {
            spec.split_once('=')
                .map(|(op, name)| (op.trim(), name.trim()))
                .ok_or_else(|| {
                    format!("--impl {spec}: expected OP=NAME, e.g. attention_decode_batch=paged_decode_hand")
                })
        })
        .collect()
}

/// Applies `--impl OP=NAME` swaps to a runner.
fn apply_impls(r: &mut Runner, impls: &[String]) -> Result<(), String> {
    for (op, name) in parse_impls(impls)? {
        r.set_implementation(op, name).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Arguments of `day0 validate`.
#[derive(Args)]
pub struct ValidateArgs {
    /// Checkpoint directory (see `day0 forward`).
    #[arg(long)]
    model_dir: PathBuf,
    /// Reference activations: a safetensors file with `input_ids` (the prompt), `hidden_states.{i}`
    /// (embedding output, then each decoder layer's output) and `logits`, as
    /// tests/reference/gen_models.py writes them. A multimodal reference also holds the images'
    /// patch rows (`pixel_values`, `image_grid_thw`) and the vision encoder's output
    /// (`vision.tokens`, `vision.deepstack.{j}`), compared too (tests/reference/gen_vision.py).
    #[arg(long)]
    reference: PathBuf,
    /// Flag tensors whose max relative error exceeds this.
    #[arg(long, default_value_t = 1e-4)]
    threshold: f64,
    /// Weight precision, as `day0 forward --precision` (native: bf16 weights for a float
    /// checkpoint; compare with a looser `--threshold`).
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Device preset the kernels run on.
    #[arg(long, default_value = "npu-910b")]
    device: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

fn runner(
    dir: &Path,
    device: &str,
    capacity: usize,
    precision: Precision,
    check_finite: bool,
    tuning: Option<std::sync::Arc<dsl_core::Tuning>>,
) -> Result<Runner, String> {
    let launcher = Launcher::for_device(device)
        .map_err(|e| e.to_string())?
        .with_check_finite(check_finite)
        .with_tuning(tuning);
    Runner::load_at(dir, launcher, capacity, precision).map_err(|e| e.to_string())
}

fn top_ops(stats: &OpStats, n: usize) -> Vec<(String, u64, u64)> {
    let mut v: Vec<(String, u64, u64)> = stats
        .per_op
        .iter()
        .map(|(k, (l, c))| (k.clone(), *l, *c))
        .collect();
    v.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

/// A step estimate's operators as JSON: `ops` (each operator's launches, cycles and share of the
/// step's operator cycles, over every layer kind) and `ops_by_layer_kind` (each kind's totals,
/// then its operators), the shapes the one-sequence report's `prefill_ops` and
/// `prefill_ops_by_layer_kind` have.
pub(crate) fn op_table_json(table: &OpTable) -> (serde_json::Value, serde_json::Value) {
    use serde_json::{json, Map};
    let total = table
        .values()
        .flat_map(|o| o.values())
        .map(|c| c.cycles)
        .sum::<f64>()
        .max(1.0);
    let entry =
        |c: &OpCost| json!({"launches": c.launches, "cycles": c.cycles, "share": c.cycles / total});
    let mut kinds = Map::new();
    for (kind, ops) in table {
        let mut sum = OpCost::default();
        let mut per_op = Map::new();
        for (op, c) in ops {
            sum.add(c);
            per_op.insert(op.clone(), entry(c));
        }
        let mut k = entry(&sum);
        k["ops"] = per_op.into();
        kinds.insert(kind.clone(), k);
    }
    let all: Map<_, _> = ops_over_kinds(table)
        .iter()
        .map(|(op, c)| (op.clone(), entry(c)))
        .collect();
    (all.into(), kinds.into())
}

/// The card's peak memory for a step of `tokens` tokens over `batch` sequences of `context`
/// tokens, from the memory plan of one card holding the whole model (weights in their stored
/// formats, the KV cache and per-sequence state of the batch, one step's activations and one
/// layer's workspace, which every layer reuses): (peak bytes, JSON breakdown).
fn peak_memory(
    cfg: &model::config::ModelConfig,
    device: &dsl_core::DevicePreset,
    tokens: usize,
    batch: usize,
    context: usize,
) -> (f64, serde_json::Value) {
    use model::plan::memory::{plan_memory, MemoryOptions};
    use model::plan::parallel::Plan;
    let one = Plan {
        tp: 1,
        dp: 1,
        pp: 1,
        ep: 1,
    };
    let capacity = device.hbm.capacity_bytes as f64;
    let m = plan_memory(
        cfg,
        &one,
        capacity,
        tokens,
        context,
        &MemoryOptions::default(),
    );
    let cache = m.kv_per_token * (context * batch) as f64 + m.state_per_sequence * batch as f64;
    let peak = m.weights.total() + cache + m.activations + m.workspace;
    let j = serde_json::json!({
        "weights": m.weights.total(),
        "kv_cache_and_state": cache,
        "activations": m.activations,
        "layer_workspace": m.workspace,
        "device_capacity": capacity,
        "fits": peak <= capacity,
    });
    (peak, j)
}

/// Says on stderr when the one-card memory plan (`peak` bytes) exceeds the card's `capacity`: the
/// times printed assume a card that held the model (the JSON's `memory.fits` says the same).
fn warn_if_unfit(peak: f64, capacity: f64) {
    if peak > capacity {
        eprintln!(
            "warning: the model needs {:.1} GB but one card holds {:.1} GB: these times are those of a card that held it; `day0 run --model ... --cards N` plans a split that fits",
            peak / 1e9,
            capacity / 1e9
        );
    }
}

/// `--prompt-len` when neither it nor a replay gives one.
const DEFAULT_PROMPT_LEN: usize = 1024;
/// `--output-len` when neither it nor a replay gives one.
const DEFAULT_OUTPUT_LEN: usize = 16;

/// `day0 forward --cost-only --batch B --context C`: one decode step of `B` sequences at context
/// `C` on one card, with the memory-bound closed form beside it.
fn decode_step(args: &ForwardArgs, config: &Path) -> Result<(), String> {
    use model::plan::estimate::{Estimator, Phase, Routing};
    use model::plan::parallel::Plan;
    if args.routing.starts_with("replay:") {
        return Err("--routing replay:FILE: a --batch step prices a card's batch from one sequence's run; replay a recording without --batch".into());
    }
    let batch = args.batch.unwrap_or(1);
    if batch == 0 {
        return Err("--batch: must be at least 1".into());
    }
    let context = args
        .context
        .or(args.prompt_len)
        .unwrap_or(DEFAULT_PROMPT_LEN);
    if context == 0 {
        return Err("--context: must be at least 1".into());
    }
    let cfg = load_config_noting(config)?;
    if let Some(max) = cfg.max_position_embeddings {
        if context >= max {
            return Err(format!(
                "--context {context}: a decode step at that context needs {} positions, beyond the config's max_position_embeddings {max}",
                context + 1
            ));
        }
    }
    let cluster = accel_sim::cluster::ClusterPreset::single_card(&args.device)
        .map_err(|e| format!("--device: {e}"))?;
    let routing = Routing::parse(&args.routing).map_err(|e| e.to_string())?;
    let mut est = Estimator::new(cfg, cluster, routing)
        .map_err(|e| e.to_string())?
        .with_precision(args.precision.unwrap_or(Precision::Native))
        .with_kv_cache(args.kv_dtype);
    let tuning =
        day0::tune_model::resolve_tuning(args.tuning.as_deref(), est.config(), &est.device().name)?;
    let tuning_path = tuning.as_ref().map(|t| t.path.display().to_string());
    for (op, name) in parse_impls(&ResolvedTuning::impls_then(tuning.as_ref(), &args.impls))? {
        est = est
            .with_implementation(op, name)
            .map_err(|e| e.to_string())?;
    }
    est = est.with_tuning(tuning.map(|t| t.table));
    let one = Plan {
        tp: 1,
        dp: 1,
        pp: 1,
        ep: 1,
    };
    let e = est
        .estimate(&one, Phase::Decode, batch, context)
        .map_err(|e| e.to_string())?;
    let peak = peak_memory(est.config(), est.device(), batch, batch, context + 1);
    // The time to first token of one request, when a prompt length is given (a long prefill is
    // the slow part of a cost-only run; the batched decode step alone answers in about a second).
    let prefill = match args.prompt_len {
        Some(p) => Some(
            est.estimate(&one, Phase::Prefill, 1, p)
                .map_err(|e| format!("--prompt-len {p}: {e}"))?,
        ),
        None => None,
    };
    let bw = est.device().hbm.bandwidth_gbps * 1e9;
    let floor_ms = e.hbm_bytes_per_card / bw * 1e3;
    let b = &e.breakdown;
    if args.json {
        let (ops, ops_by_kind) = op_table_json(&e.ops);
        let v = serde_json::json!({
            "model": config.display().to_string(),
            "device": est.device().name,
            "cost_only": true,
            "batch": batch,
            "context": context,
            "prompt_len": args.prompt_len,
            "ttft_us": prefill.as_ref().map(|p| p.step_s * 1e6),
            "prefill_tokens_per_s": prefill.as_ref().map(|p| p.tokens_per_s),
            "tpot_us": e.step_s * 1e6,
            "decode_tokens_per_s": e.tokens_per_s,
            "tpot_ms": e.step_s * 1e3,
            "tokens_per_s": e.tokens_per_s,
            "hbm_bytes": e.hbm_bytes_per_card,
            "hbm_floor_ms": floor_ms,
            "peak_device_bytes": peak.0,
            "memory": peak.1,
            "hbm_utilization": e.hbm_utilization,
            "mfu": e.mfu,
            "breakdown": {
                "attention_ms": b.attention_s * 1e3,
                "dense_ffn_ms": b.dense_ffn_s * 1e3,
                "experts_ms": b.experts_s * 1e3,
                "head_ms": b.head_s * 1e3,
            },
            "ops": ops,
            "ops_by_layer_kind": ops_by_kind,
            "prefill_ops": prefill.as_ref().map(|p| op_table_json(&p.ops).0),
            "tuning": tuning_path,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "{} cost-only on {}: one decode step of {batch} sequence(s) at context {context}",
        config.display(),
        est.device().name
    );
    if let Some(p) = &tuning_path {
        println!("  tiles: tuned, from {p}");
    }
    if let (Some(p), Some(len)) = (&prefill, args.prompt_len) {
        println!(
            "TTFT {:.3} ms for one {len}-token prompt ({:.0} prefill tokens/s)",
            p.step_s * 1e3,
            p.tokens_per_s
        );
    }
    println!(
        "TPOT {:.3} ms ({:.0} tokens/s); HBM {:.2} GB moved, {:.3} ms at peak bandwidth ({:.0}% utilised); MFU {:.1}%",
        e.step_s * 1e3,
        e.tokens_per_s,
        e.hbm_bytes_per_card / 1e9,
        floor_ms,
        e.hbm_utilization * 100.0,
        e.mfu * 100.0
    );
    println!(
        "  peak device memory {:.1} GB of {:.1} GB (weights {:.1} GB, KV cache and state {:.2} GB, activations and one layer's workspace {:.2} GB)",
        peak.0 / 1e9,
        peak.1["device_capacity"].as_f64().unwrap_or(0.0) / 1e9,
        peak.1["weights"].as_f64().unwrap_or(0.0) / 1e9,
        peak.1["kv_cache_and_state"].as_f64().unwrap_or(0.0) / 1e9,
        (peak.1["activations"].as_f64().unwrap_or(0.0) + peak.1["layer_workspace"].as_f64().unwrap_or(0.0)) / 1e9
    );
    warn_if_unfit(peak.0, peak.1["device_capacity"].as_f64().unwrap_or(0.0));
    println!(
        "  attention {:.3} ms, dense ffn {:.3} ms, routed experts {:.3} ms, embedding/lm_head {:.3} ms",
        b.attention_s * 1e3,
        b.dense_ffn_s * 1e3,
        b.experts_s * 1e3,
        b.head_s * 1e3
    );
    let mut ops: Vec<(String, OpCost)> = ops_over_kinds(&e.ops).into_iter().collect();
    let total = ops.iter().map(|(_, c)| c.cycles).sum::<f64>().max(1.0);
    ops.sort_by(|a, b| b.1.cycles.total_cmp(&a.1.cycles).then(a.0.cmp(&b.0)));
    println!(
        "  {:<32} {:>8} {:>14} {:>6}",
        "operator (decode step)", "launches", "cycles", "share"
    );
    for (op, c) in ops.iter().take(10) {
        println!(
            "  {op:<32} {:>8.0} {:>14.0} {:>5.1}%",
            c.launches,
            c.cycles,
            100.0 * c.cycles / total
        );
    }
    Ok(())
}

/// The vision encoder's cost for `--image-size` images (none: `None`), from the config's
/// `vision_config` and Qwen3-VL's processor limits.
fn images_cost(
    config: &Path,
    sizes: &[String],
    launcher: &Launcher,
) -> Result<Option<model::forward::vision::VisionCost>, String> {
    if sizes.is_empty() {
        return Ok(None);
    }
    let vcfg = model::vision::load_vision_config(config)
        .map_err(|e| format!("--image-size needs a multimodal config: {e}"))?;
    let grids = sizes
        .iter()
        .map(|s| {
            let (w, h) = crate::vision_cmd::parse_size(s)?;
            vcfg.image_grid(
                &format!("--image-size {s}"),
                h,
                w,
                model::vision::PixelLimits::QWEN3_VL,
            )
            .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, String>>()?;
    model::forward::vision::encode_cost(&vcfg, &grids, launcher)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// `day0 forward --cost-only`: one sequence's prefill and decode on shape-only weights.
fn forward_cost_only(args: &ForwardArgs, config: &Path) -> Result<(), String> {
    if args.batch.is_some() || args.context.is_some() {
        return decode_step(args, config);
    }
    let routing = RoutingModel::parse(&args.routing).map_err(|e| e.to_string())?;
    // A replay covers the recorded steps: its lengths are the defaults.
    let (rec_prompt, rec_output) = routing
        .record()
        .map_or((DEFAULT_PROMPT_LEN, DEFAULT_OUTPUT_LEN), |r| r.workload());
    let prompt_len = args.prompt_len.unwrap_or(rec_prompt);
    let output_len = args.output_len.unwrap_or(rec_output);
    if prompt_len == 0 {
        return Err("--prompt-len must be at least 1".into());
    }
    if output_len == 0 {
        return Err(
            "--output-len must be at least 1 (the first token comes from the prefill)".into(),
        );
    }
    let cfg = load_config_noting(config)?;
    let launcher = Launcher::for_device(&args.device).map_err(|e| e.to_string())?;
    let tuning =
        day0::tune_model::resolve_tuning(args.tuning.as_deref(), &cfg, &launcher.preset.name)?;
    let tuning_path = tuning.as_ref().map(|t| t.path.display().to_string());
    let impls = ResolvedTuning::impls_then(tuning.as_ref(), &args.impls);
    let launcher = launcher.with_tuning(tuning.map(|t| t.table));
    let vision = images_cost(config, &args.image_size, &launcher)?;
    let text_len = prompt_len;
    let prompt_len = prompt_len + vision.as_ref().map_or(0, |v| v.tokens);
    let context = prompt_len
        .checked_add(output_len - 1)
        .ok_or("--prompt-len + --output-len overflows")?;
    if let Some(max) = cfg.max_position_embeddings {
        if context > max {
            return Err(format!(
                "--prompt-len {prompt_len} + --output-len {output_len} needs {context} positions, beyond the config's max_position_embeddings {max}"
            ));
        }
    }
    let clock_ghz = launcher.preset.clock_ghz;
    let precision = args.precision.unwrap_or(Precision::Native);
    let mut r =
        Runner::cost_only_at(cfg, launcher, context, precision).map_err(|e| e.to_string())?;
    if let Some(kv) = args.kv_dtype {
        r.set_kv_cache(kv).map_err(|e| e.to_string())?;
    }
    apply_impls(&mut r, &impls)?;
    r.set_routing(routing).map_err(|e| e.to_string())?;
    let mut run = r
        .cost_run(prompt_len, output_len)
        .map_err(|e| e.to_string())?;
    let language_cycles = run.prefill.total_cycles();
    if let Some(v) = &vision {
        // The encoder runs before the language prefill, within TTFT: its operators join the
        // prefill's breakdown as a layer kind of their own.
        run.prefill.add(&v.stats);
        run.prefill_by_kind.insert("vision".into(), v.stats.clone());
    }
    let vision_cycles = vision.as_ref().map(|v| v.stats.total_cycles());
    let load = |decode: bool| {
        let loads: Vec<ExpertLoad> = r
            .expert_loads()
            .iter()
            .filter(|(step, _)| (*step > 0) == decode)
            .map(|(_, l)| *l)
            .collect();
        let max = loads.iter().map(|l| l.max_tokens).max()?;
        let mean = loads.iter().map(|l| l.mean_tokens).sum::<f64>() / loads.len() as f64;
        Some((max, mean))
    };
    let load_json = |decode: bool| {
        load(decode).map(|(max, mean)| {
            serde_json::json!({"max_tokens_per_expert": max, "mean_tokens_per_expert": mean, "imbalance": max as f64 / mean.max(1e-12)})
        })
    };
    let peak = peak_memory(r.config(), r.device(), prompt_len, 1, context);
    let us = |c: u64| c as f64 / (clock_ghz * 1e3);
    let ttft = us(run.prefill.total_cycles());
    let tpot =
        (run.decode_steps > 0).then(|| us(run.decode.total_cycles()) / run.decode_steps as f64);
    let ops_json = |s: &OpStats| {
        let total = s.total_cycles().max(1) as f64;
        s.per_op
            .iter()
            .map(|(k, (l, c))| {
                (
                    k.clone(),
                    serde_json::json!({"launches": l, "cycles": c, "share": *c as f64 / total}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
    };
    // Each layer kind's launches, cycles and share of the phase, then its operators.
    let by_kind_json = |kinds: &std::collections::BTreeMap<String, OpStats>, phase: &OpStats| {
        let total = phase.total_cycles().max(1) as f64;
        kinds
            .iter()
            .map(|(k, s)| {
                (
                    k.clone(),
                    serde_json::json!({
                        "launches": s.launches(),
                        "cycles": s.total_cycles(),
                        "share": s.total_cycles() as f64 / total,
                        "ops": ops_json(s),
                    }),
                )
            })
            .collect::<serde_json::Map<_, _>>()
    };
    if args.json {
        let j = serde_json::json!({
            "model": r.config().model_type,
            "device": args.device,
            "cost_only": true,
            "tuning": tuning_path,
            "prompt_len": prompt_len,
            "output_len": output_len,
            "routing": args.routing,
            "ttft_us": ttft,
            "vision_us": vision_cycles.map(us),
            "language_prefill_us": us(language_cycles),
            "text_tokens": text_len,
            "image_tokens": vision.as_ref().map(|v| v.tokens),
            "implementations": picks_json(&r),
            "image_grids": vision.as_ref().map(|v| v.grids.clone()),
            "tpot_us": tpot,
            "prefill_tokens_per_s": prompt_len as f64 / (ttft * 1e-6),
            "decode_tokens_per_s": tpot.map(|t| 1e6 / t),
            "prefill_cycles": run.prefill.total_cycles(),
            "decode_cycles": run.decode.total_cycles(),
            "prefill_hbm_bytes": run.prefill.total_traffic().hbm_bytes,
            "decode_hbm_bytes": run.decode.total_traffic().hbm_bytes,
            "hbm_bytes": run.prefill.total_traffic().hbm_bytes + run.decode.total_traffic().hbm_bytes,
            "prefill_expert_load": load_json(false),
            "decode_expert_load": load_json(true),
            "peak_device_bytes": peak.0,
            "memory": peak.1,
            "launch_memo": {"hits": r.memo_counts().0, "simulated": r.memo_counts().1},
            "prefill_ops": ops_json(&run.prefill),
            "decode_ops": ops_json(&run.decode),
            "prefill_ops_by_layer_kind": by_kind_json(&run.prefill_by_kind, &run.prefill),
            "decode_ops_by_layer_kind": by_kind_json(&run.decode_by_kind, &run.decode),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&j).map_err(|e| e.to_string())?
        );
        warn_if_unfit(peak.0, r.device().hbm.capacity_bytes as f64);
        return Ok(());
    }
    let cfg = r.config();
    println!(
        "{} ({}), {} layers [{}], cost-only on {}: one sequence, prompt {prompt_len} tokens, {output_len} output tokens, routing {}",
        cfg.model_type,
        config.display(),
        cfg.num_layers(),
        cfg.layer_summary(),
        args.device,
        args.routing
    );
    if let Some(p) = &tuning_path {
        println!("  tiles: tuned, from {p}");
    }
    println!(
        "TTFT {ttft:.1} us ({} launches, {} cycles; {:.0} prefill tokens/s)",
        run.prefill.launches(),
        run.prefill.total_cycles(),
        prompt_len as f64 / (ttft * 1e-6)
    );
    if let (Some(v), Some(c)) = (&vision, vision_cycles) {
        println!(
            "  = vision encoder {:.1} us ({} image(s), {} patches → {} tokens) + language prefill {:.1} us ({text_len} text + {} image tokens)",
            us(c),
            v.grids.len(),
            v.patches,
            v.tokens,
            us(language_cycles),
            v.tokens
        );
    }
    println!(
        "peak device memory {:.2} GB of {:.1} GB (the memory plan of one card: weights, KV cache, one step's activations and one layer's workspace)",
        peak.0 / 1e9,
        r.device().hbm.capacity_bytes as f64 / 1e9
    );
    warn_if_unfit(peak.0, r.device().hbm.capacity_bytes as f64);
    for (what, decode) in [("prefill", false), ("decode", true)] {
        if let Some((max, mean)) = load(decode) {
            println!(
                "  {what} expert load: at most {max} tokens per expert, {mean:.2} on average ({:.2}x)",
                max as f64 / mean.max(1e-12)
            );
        }
    }
    if let Some(t) = tpot {
        println!(
            "TPOT {t:.1} us per token over {} decode steps ({:.0} decode tokens/s for this one sequence)",
            run.decode_steps,
            1e6 / t
        );
    }
    for (what, stats) in [("prefill", &run.prefill), ("decode", &run.decode)] {
        if stats.launches() == 0 {
            continue;
        }
        let total = stats.total_cycles().max(1);
        let kinds = if what == "prefill" {
            &run.prefill_by_kind
        } else {
            &run.decode_by_kind
        };
        let parts: Vec<String> = kinds
            .iter()
            .map(|(k, s)| format!("{k} {:.1}%", 100.0 * s.total_cycles() as f64 / total as f64))
            .collect();
        println!("  {what} by layer kind: {}", parts.join(", "));
        println!(
            "  {what:<8} {:<32} {:>8} {:>14} {:>6}",
            "operator", "launches", "cycles", "share"
        );
        for (op, l, c) in top_ops(stats, 10) {
            println!(
                "           {op:<32} {l:>8} {c:>14} {:>5.1}%",
                100.0 * c as f64 / total as f64
            );
        }
    }
    Ok(())
}

/// `day0 forward`.
pub fn forward(args: ForwardArgs) -> Result<(), String> {
    if !args.image_size.is_empty()
        && (args.config.is_none() || args.batch.is_some() || args.context.is_some())
    {
        return Err("--image-size: images are costed in a one-sequence cost-only run of a multimodal config (--config FILE --cost-only, without --batch/--context); a numeric run takes image files (--model-dir DIR --image FILE)".into());
    }
    if !args.image.is_empty() && (args.cost_only || args.config.is_some()) {
        return Err("--image: image files run numerically through a checkpoint's encoder (--model-dir DIR without --cost-only); a cost-only run takes --image-size WIDTHxHEIGHT".into());
    }
    if args.record_routing.is_some() && args.cost_only {
        return Err("--record-routing: a cost-only run has no router output to record; record a numeric run (--model-dir with --tokens)".into());
    }
    if let Some(config) = &args.config {
        if !args.cost_only {
            return Err(format!(
                "--config {}: a config alone has no weights; add --cost-only, or give --model-dir for a numeric run",
                config.display()
            ));
        }
        return forward_cost_only(&args, config);
    }
    let Some(model_dir) = args.model_dir.clone() else {
        return Err("give --model-dir (a checkpoint) or --config with --cost-only".into());
    };
    if args.cost_only {
        return forward_cost_only(&args, &model_dir.join("config.json"));
    }
    if args.tokens.is_empty() {
        return Err("--tokens: give the prompt's token ids (comma-separated)".into());
    }
    // Every weight is held as f32 values on the host in a functional run.
    let cfg = load_config_noting(&model_dir.join("config.json"))?;
    day0::host_memory::check(
        model::plan::params::count(&cfg).total().saturating_mul(4),
        &format!("a functional forward of {}", model_dir.display()),
        "cost it with `--config DIR/config.json --cost-only` instead (cycles without numbers)",
    )?;
    let images = process_images(&model_dir, &cfg, &args.image)?;
    // The prompt as it runs: each image's placeholder widened to its tokens.
    let prompt = match &images {
        Some(images) => {
            let v = cfg.vision.as_ref().ok_or("--image: no vision_config")?;
            let grids: Vec<[usize; 3]> = images.iter().map(|i| i.grid).collect();
            model::vision::expand_image_tokens(
                &args.tokens,
                v.image_token_id,
                &grids,
                v.spatial_merge_size,
            )
            .map_err(|e| format!("--tokens: {e}"))?
            .0
        }
        None => {
            // Image tokens without an image would run the placeholder's own embedding: a prompt
            // copied from a multimodal chat without its --image.
            if let Some(v) = &cfg.vision {
                let n = args
                    .tokens
                    .iter()
                    .filter(|t| **t == v.image_token_id as i64)
                    .count();
                if n > 0 {
                    return Err(format!(
                        "--tokens holds the image token {} {n} time(s) but no --image is given: \
                         give the image(s) with --image FILE, or drop the image tokens",
                        v.image_token_id
                    ));
                }
            }
            args.tokens.clone()
        }
    };
    // Numeric runs take tuned tiles only from a file given: their numbers are the goldens'.
    let (tuning, pins) = match args.tuning.as_deref() {
        None | Some("none") => (None, Vec::new()),
        Some(path) => {
            let (file, table) = day0::tune_model::read_tuning(Path::new(path))?;
            let pins = file
                .implementations
                .iter()
                .map(|(op, name)| format!("{op}={name}"))
                .collect();
            (Some(std::sync::Arc::new(table)), pins)
        }
    };
    let mut r = runner(
        &model_dir,
        &args.device,
        prompt.len() + args.generate,
        args.precision.unwrap_or(Precision::F32),
        args.check_finite,
        tuning,
    )?;
    if let Some(kv) = args.kv_dtype {
        r.set_kv_cache(kv).map_err(|e| e.to_string())?;
    }
    apply_impls(&mut r, &[pins, args.impls.clone()].concat())?;
    let clock_ghz = r.device().clock_ghz;
    if args.record_routing.is_some() {
        r.record_routing();
    }
    let (gen, vision) = match &images {
        Some(images) => {
            let enc = r.encode_images(images).map_err(|e| e.to_string())?;
            let gen = r
                .generate_with_images(&prompt, &enc, args.generate)
                .map_err(|e| e.to_string())?
                .0;
            (gen, Some(enc))
        }
        None => (
            r.generate(&args.tokens, args.generate)
                .map_err(|e| e.to_string())?,
            None,
        ),
    };
    if let (Some(path), Some(rec)) = (&args.record_routing, r.take_recording()) {
        rec.write(path).map_err(|e| e.to_string())?;
    }
    let out = &gen.prompt;
    if let Some(path) = &args.logits_out {
        model::weights::write_f32(
            path,
            &[("logits", &[out.tokens, out.vocab], &out.logits)],
            &[("producer", "day0 forward")],
        )
        .map_err(|e| e.to_string())?;
    }
    let us = |c: u64| c as f64 / (clock_ghz * 1e3);
    let next = argmax(out.row(out.tokens - 1));
    if args.json {
        let j = serde_json::json!({
            "model": r.config().model_type,
            "tokens": out.tokens,
            "vocab": out.vocab,
            "next_token": next,
            "generated": gen.tokens,
            "prefill_cycles": gen.prefill.total_cycles(),
            "prefill_us": us(gen.prefill.total_cycles()),
            "prefill_launches": gen.prefill.launches(),
            "implementations": picks_json(&r),
            "image_grids": vision.as_ref().map(|v| v.grids.clone()),
            "image_tokens": vision.as_ref().map(|v| v.encoded.tokens.rows()),
            "vision_us": vision.as_ref().map(|v| us(v.stats.total_cycles())),
            "decode_cycles": gen.decode.total_cycles(),
            "decode_us_per_token": if gen.tokens.len() > 1 { us(gen.decode.total_cycles()) / (gen.tokens.len() - 1) as f64 } else { 0.0 },
            "ops": gen.prefill.per_op.iter().map(|(k, (l, c))| (k.clone(), serde_json::json!({"launches": l, "cycles": c}))).collect::<serde_json::Map<_, _>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&j).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    let cfg = r.config();
    println!(
        "{} ({}), {} layers [{}], on {}",
        cfg.model_type,
        model_dir.display(),
        cfg.num_layers(),
        cfg.layer_summary(),
        args.device
    );
    println!(
        "prefill {} tokens: {} kernel launches, {} cycles ({:.1} us simulated); next token {next}",
        out.tokens,
        gen.prefill.launches(),
        gen.prefill.total_cycles(),
        us(gen.prefill.total_cycles())
    );
    if let Some(v) = &vision {
        println!(
            "  of which vision encoder: {} image(s), grids {:?} → {} tokens, {:.1} us simulated",
            v.grids.len(),
            v.grids,
            v.encoded.tokens.rows(),
            us(v.stats.total_cycles())
        );
    }
    println!(
        "  {:<32} {:>8} {:>12} {:>6}",
        "operator", "launches", "cycles", "share"
    );
    let total = gen.prefill.total_cycles().max(1);
    for (op, l, c) in top_ops(&gen.prefill, 12) {
        println!(
            "  {op:<32} {l:>8} {c:>12} {:>5.1}%",
            100.0 * c as f64 / total as f64
        );
    }
    for ((op, name), n) in r.implementation_picks() {
        println!("  {op}: {name} ran {n} launch(es)");
    }
    if !gen.tokens.is_empty() {
        let steps = gen.tokens.len().saturating_sub(1).max(1);
        println!(
            "generated {}: {:?}; decode {:.1} us simulated per token",
            gen.tokens.len(),
            gen.tokens,
            us(gen.decode.total_cycles()) / steps as f64
        );
    }
    if let Some(path) = &args.logits_out {
        println!(
            "logits [{}, {}] written to {}",
            out.tokens,
            out.vocab,
            path.display()
        );
    }
    Ok(())
}

/// Which implementation of each swappable operator ran: per implementation, the launches that
/// chose it (a cost-only run's memoised layers reuse their first layer's choice uncounted).
fn picks_json(r: &Runner) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    for ((op, name), n) in r.implementation_picks() {
        let entry = out
            .entry(op.to_string())
            .or_insert_with(|| serde_json::json!({}));
        entry[*name] = serde_json::json!(n);
    }
    serde_json::Value::Object(out)
}

/// The `--image` files through the processor `model_dir`'s `preprocessor_config.json`
/// describes (`None` without images); errors name the file and the limit.
fn process_images(
    model_dir: &Path,
    cfg: &model::config::ModelConfig,
    files: &[PathBuf],
) -> Result<Option<Vec<model::vision::processor::ProcessedImage>>, String> {
    use model::vision::processor::{load_image, preprocess, ProcessorConfig};
    if files.is_empty() {
        return Ok(None);
    }
    let vcfg = cfg.vision.as_ref().ok_or_else(|| {
        format!(
            "--image: {} ({}) has no vision encoder (`vision_config`)",
            model_dir.display(),
            cfg.model_type
        )
    })?;
    let p = ProcessorConfig::load(model_dir, vcfg).map_err(|e| e.to_string())?;
    files
        .iter()
        .map(|f| {
            let (h, w, rgb) = load_image(f, p.limits).map_err(|e| e.to_string())?;
            preprocess(&f.display().to_string(), h, w, &rgb, &p).map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// `day0 validate`: exits non-zero when a tensor is over the threshold.
pub fn validate_cmd(args: ValidateArgs) -> Result<(), String> {
    let reference = model::weights::read_all_f32(&args.reference).map_err(|e| e.to_string())?;
    let ids: Vec<i64> = reference
        .iter()
        .find(|(n, _, _)| n == "input_ids")
        .map(|(_, _, d)| d.iter().map(|v| *v as i64).collect())
        .ok_or_else(|| {
            format!(
                "{}: no `input_ids` tensor (the prompt the reference activations were made from)",
                args.reference.display()
            )
        })?;
    let mut r = runner(
        &args.model_dir,
        &args.device,
        ids.len(),
        args.precision,
        false,
        None,
    )?;
    note_inferred(r.config());
    let v = validate(&mut r, &ids, &reference, args.threshold).map_err(|e| e.to_string())?;
    if args.json {
        let diffs: Vec<serde_json::Value> = v
            .diffs
            .iter()
            .map(|d| {
                serde_json::json!({
                    "name": d.name, "cosine": d.cosine, "max_abs": d.max_abs,
                    "max_rel": d.max_rel, "rel_l2": d.rel_l2, "worst_position": d.worst_position,
                    "flagged": d.flagged,
                })
            })
            .collect();
        let j = serde_json::json!({"tokens": v.tokens, "threshold": v.threshold,
            "tail_error": v.tail_error(), "tensors": diffs});
        println!(
            "{}",
            serde_json::to_string_pretty(&j).map_err(|e| e.to_string())?
        );
    } else {
        println!(
            "{:<22} {:>12} {:>12} {:>12} {:>12} {:>6}  (threshold {:e}, {} tokens)",
            "tensor", "cosine", "max abs", "max rel", "rel L2", "worst", v.threshold, v.tokens
        );
        for d in &v.diffs {
            println!(
                "{:<22} {:>12.9} {:>12.3e} {:>12.3e} {:>12.3e} {:>6}{}",
                d.name,
                d.cosine,
                d.max_abs,
                d.max_rel,
                d.rel_l2,
                d.worst_position,
                if d.flagged {
                    "  <-- over threshold"
                } else {
                    ""
                }
            );
        }
        println!("tail (max) relative error: {:.3e}", v.tail_error());
    }
    match v.first_flagged() {
        Some(d) => Err(format!(
            "{} diverges from the reference: max relative error {:.3e} > {:e} at position {}",
            d.name, d.max_rel, v.threshold, d.worst_position
        )),
        None => Ok(()),
    }
}

/// Arguments of `day0 cards`.
#[derive(Args)]
pub struct CardsArgs {
    /// Checkpoint directory (see `day0 forward`); its weights are split at f32.
    #[arg(long)]
    model_dir: PathBuf,
    /// The split: `tp=2,dp=2,ep=2` (tensor parallel × attention replicas, routed experts over
    /// `ep` cards; pp=1). Cards = tp·dp.
    #[arg(long)]
    plan: String,
    /// Cluster preset name or .toml file whose links price the collectives.
    #[arg(long, default_value = "h200-node")]
    cluster: String,
    /// Device preset of every card (default: the cluster's card).
    #[arg(long)]
    device: Option<String>,
    /// One replica's prompt token ids, comma-separated; give it once per replica (dp times).
    /// Default: built-in prompts of different lengths.
    #[arg(long)]
    tokens: Vec<String>,
    /// Greedy tokens decoded after each prompt.
    #[arg(long, default_value_t = 4)]
    steps: usize,
    /// Largest |Δlogit| against one card allowed, relative to the largest logit.
    #[arg(long, default_value_t = 1e-4)]
    tolerance: f32,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

/// `day0 cards`: the checkpoint split over simulated cards, with the collectives moving data,
/// against one card: every card's logits and greedy tokens, and what its collectives cost.
pub fn cards_cmd(a: CardsArgs) -> Result<(), String> {
    use accel_sim::ClusterPreset;
    use model::plan::parallel::Plan;
    let plan = Plan::parse(&a.plan, None, "--plan").map_err(|e| e.to_string())?;
    load_config_noting(&a.model_dir.join("config.json"))?;
    let mut cluster = ClusterPreset::load(&a.cluster).map_err(|e| format!("--cluster: {e}"))?;
    let nodes = plan.cards().div_ceil(cluster.cards_per_node);
    if nodes > cluster.nodes {
        cluster = cluster
            .with_nodes(nodes)
            .map_err(|e| format!("--plan: {e}"))?;
    }
    let device = a.device.clone().unwrap_or_else(|| cluster.device.clone());
    let prompts: Vec<Vec<i64>> = if a.tokens.is_empty() {
        (0..plan.dp)
            .map(|r| {
                (0..8 - r % 4)
                    .map(|i| ((r * 53 + i * 31 + 7) % 64) as i64)
                    .collect()
            })
            .collect()
    } else {
        a.tokens
            .iter()
            .map(|p| {
                p.split(',')
                    .map(|t| t.trim().parse::<i64>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--tokens `{p}`: {e} (comma-separated token ids)"))
            })
            .collect::<Result<_, _>>()?
    };
    if prompts.len() != plan.dp || prompts.iter().any(Vec::is_empty) {
        return Err(format!(
            "--tokens: dp={} replicas need {} non-empty prompts, {} given",
            plan.dp,
            plan.dp,
            prompts.len()
        ));
    }
    let runs =
        model::forward::run_on_cards(&a.model_dir, &device, &cluster, &plan, &prompts, a.steps)
            .map_err(|e| e.to_string())?;
    let clock = accel_sim::DevicePreset::load(&device)
        .map_err(|e| format!("--device: {e}"))?
        .clock_ghz
        * 1e9;
    let mut rows = Vec::new();
    let mut pass = true;
    for (d, prompt) in prompts.iter().enumerate() {
        let mut one = runner(
            &a.model_dir,
            &device,
            prompt.len() + a.steps,
            Precision::F32,
            false,
            None,
        )?;
        let (want, want_tokens) =
            model::forward::greedy_steps(&mut one, prompt, a.steps).map_err(|e| e.to_string())?;
        for run in runs.iter().filter(|r| r.replica == d) {
            let (mut worst, mut scale) = (0.0f32, 1.0f32);
            for (got, want) in run.steps.iter().zip(&want) {
                scale = want.logits.iter().fold(scale, |m, v| m.max(v.abs()));
                worst = got
                    .logits
                    .iter()
                    .zip(&want.logits)
                    .fold(worst, |m, (x, y)| m.max((x - y).abs()));
            }
            let ok = worst <= a.tolerance * scale && run.tokens == want_tokens;
            pass &= ok;
            let comm: serde_json::Map<String, serde_json::Value> = [
                "attention.all_reduce",
                "ffn.all_reduce",
                "moe.ep_dispatch",
                "moe.ep_combine",
            ]
            .iter()
            .filter_map(|op| {
                run.stats
                    .per_op
                    .get(*op)
                    .map(|(_, c)| (op.to_string(), serde_json::json!(*c as f64 / clock * 1e6)))
            })
            .collect();
            let cycles = run.stats.total_cycles() as f64;
            rows.push(serde_json::json!({
                "card": run.card, "replica": run.replica, "max_abs_diff": worst,
                "max_rel_diff": worst / scale, "tokens": run.tokens,
                "tokens_match": run.tokens == want_tokens, "ok": ok,
                "comm_us": comm, "total_us": cycles / clock * 1e6,
            }));
        }
    }
    if a.json {
        let j = serde_json::json!({"plan": plan.to_string(), "cluster": cluster.name,
            "device": device, "steps": a.steps, "tolerance": a.tolerance, "pass": pass,
            "cards": rows});
        println!(
            "{}",
            serde_json::to_string_pretty(&j).map_err(|e| e.to_string())?
        );
    } else {
        println!(
            "{} on {} cards of {} ({}), {} steps, against one card (tolerance {:e} of the largest logit):",
            a.model_dir.display(),
            plan.cards(),
            cluster.name,
            plan,
            a.steps + 1,
            a.tolerance
        );
        println!(
            "{:>4} {:>7} {:>12} {:>10} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11}",
            "card",
            "replica",
            "max|Δlogit|",
            "relative",
            "tokens",
            "attn AR µs",
            "ffn AR µs",
            "dispatch µs",
            "combine µs",
            "total µs"
        );
        for r in &rows {
            let us = |op: &str| r["comm_us"][op].as_f64().unwrap_or(0.0);
            println!(
                "{:>4} {:>7} {:>12.3e} {:>10.3e} {:>7} {:>11.2} {:>11.2} {:>11.2} {:>11.2} {:>11.2}",
                r["card"].as_u64().unwrap_or(0),
                r["replica"].as_u64().unwrap_or(0),
                r["max_abs_diff"].as_f64().unwrap_or(f64::NAN),
                r["max_rel_diff"].as_f64().unwrap_or(f64::NAN),
                if r["tokens_match"] == true { "same" } else { "DIFFER" },
                us("attention.all_reduce"),
                us("ffn.all_reduce"),
                us("moe.ep_dispatch"),
                us("moe.ep_combine"),
                r["total_us"].as_f64().unwrap_or(0.0),
            );
        }
        println!(
            "{}",
            if pass {
                "every card matches one card"
            } else {
                "MISMATCH: a card differs from one card beyond the tolerance"
            }
        );
    }
    if pass {
        Ok(())
    } else {
        Err("the multi-card run differs from one card".into())
    }
}

/// Loads a config.json; when its `model_type` was read as another family's, says so on stderr
/// (the JSON on stdout stays as it is), since every number below stands on that guess.
fn load_config_noting(path: &std::path::Path) -> Result<model::config::ModelConfig, String> {
    let cfg = model::config::load_config(path).map_err(|e| e.to_string())?;
    note_inferred(&cfg);
    Ok(cfg)
}

/// Says on stderr when `cfg`'s `model_type` was read as another family's (every number a
/// command reports stands on that guess); stdout, JSON included, stays as it is.
pub(crate) fn note_inferred(cfg: &model::config::ModelConfig) {
    if let Some(w) = cfg.inferred_family() {
        eprintln!("warning: {w}");
    }
}
