//! `day0 run` (the release-day pipeline), `day0 models`, `day0 clusters` and `day0 scale`: a model
//! on a cluster, planned and costed from the same kernels that compute the numbers.

use accel_sim::cluster::ClusterPreset;
use clap::Args;
use model::plan::estimate::{Estimator, Phase, Routing, StepEstimate};
use model::plan::memory::{MemoryOptions, MemoryPlan};
use model::plan::parallel::Plan;
use model::plan::params::count;
use model::plan::presets::{load_model, MODEL_PRESETS};
use model::plan::search::{plan_phase, Candidate, PhaseChoice, Workload, FINALISTS};
use serde_json::{json, Value};
use std::time::Instant;

/// Options shared by `run` and `scale`: the model, the cluster and the workload.
#[derive(Args, Debug, Clone)]
pub struct DeployArgs {
    /// Model preset (`day0 models`) or a config.json path.
    #[arg(long, default_value = "hybrid-3t")]
    pub model: String,
    /// Cluster preset (`day0 clusters`) or a cluster .toml path.
    #[arg(long, default_value = "h800")]
    pub cluster: String,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 8192)]
    pub prompt_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 1024)]
    pub output_len: usize,
    /// Concurrent decoding sequences over the decode deployment (default: the largest batch that
    /// fits memory, up to 256 per attention replica, and meets --tpot-ms).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Context a decode step attends to (default: prompt + output/2).
    #[arg(long)]
    pub context: Option<usize>,
    /// Slowest acceptable decode step in milliseconds.
    #[arg(long)]
    pub tpot_ms: Option<f64>,
    /// Longest acceptable time to first token in milliseconds.
    #[arg(long)]
    pub ttft_ms: Option<f64>,
    /// MoE routing in the cost-only runs: `uniform` or `zipf:S`.
    #[arg(long, default_value = "uniform")]
    pub routing: String,
    /// KV cache element type: bf16, or fp8 (1 byte per value plus an f32 scale per token and
    /// cached row). At fp8 the simulated steps read every pool as FP8: the MLA latent
    /// (DeepSeek-V3, Kimi-K2, the sparse MLA of DeepSeek-V3.2 and hybrid-3t, with their DSA
    /// indexer keys) and GQA keys and values (Qwen3-Next's full-attention layers).
    #[arg(long, default_value = "bf16")]
    pub kv_dtype: String,
    /// Weight precision of the simulated cards: `native` (the checkpoint's formats: block FP8,
    /// MXFP4, bf16) or `f32` (every weight in f32, the numeric reference path).
    #[arg(long, default_value = "native")]
    pub precision: model::forward::Precision,
    /// Share of each card's memory kept free for the runtime.
    #[arg(long, default_value_t = 0.15)]
    pub reserve: f64,
    /// Pin an operator's implementation in every card's forward, `OP=NAME` (repeatable), e.g.
    /// `attention_decode_batch=paged_decode_gqa_batch`; by default each launch runs the fastest
    /// verified implementation at its shapes.
    #[arg(long = "impl", value_name = "OP=NAME")]
    pub impls: Vec<String>,
    /// Tuned tiles (`day0 tune --model`): a tuning file, or `none` for the heuristic tiles. By
    /// default the cached file for this model and card, when `day0 tune --model` wrote one.
    #[arg(long, value_name = "FILE")]
    pub tuning: Option<String>,
}

/// `day0 run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub deploy: DeployArgs,
    /// Cards to deploy on, for each of prefill and decode (default: the whole cluster; the
    /// cluster grows to hold them).
    #[arg(long)]
    pub cards: Option<usize>,
    /// Cards of the prefill deployment when it differs from the decode one (disaggregated, as
    /// DeepSeek serves: prefill on 4 nodes, decode on 18). Default: `--cards`, else the count of
    /// `--prefill-plan` (or `--plan`) when it names `dp`, else the whole cluster.
    #[arg(long)]
    pub prefill_cards: Option<usize>,
    /// Cards of the decode deployment (see `--prefill-cards`). Default: `--cards`, else the count
    /// of `--decode-plan` (or `--plan`) when it names `dp`, else the whole cluster.
    #[arg(long)]
    pub decode_cards: Option<usize>,
    /// One plan for both phases, e.g. `tp=1,ep=32,dp=32` (skips the search).
    #[arg(long)]
    pub plan: Option<String>,
    /// The prefill plan (skips the prefill search).
    #[arg(long)]
    pub prefill_plan: Option<String>,
    /// The decode plan (skips the decode search).
    #[arg(long)]
    pub decode_plan: Option<String>,
    /// Plans simulated in full after the closed-form screen, per phase.
    #[arg(long, default_value_t = model::plan::search::FINALISTS)]
    pub finalists: usize,
    /// Skip the kernel suite step (numeric checks of the operators against their f64 references).
    #[arg(long)]
    pub no_check: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write SVG charts into this directory: `breakdown.svg` (where each phase's step goes).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

/// `day0 scale`.
#[derive(Args, Debug)]
pub struct ScaleArgs {
    #[command(flatten)]
    pub deploy: DeployArgs,
    /// Card counts, comma-separated.
    #[arg(long, default_value = "16,32,64,128,256")]
    pub cards: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Write `scaling.svg` (decode tokens/s against cards, with the scaling efficiency) into this
    /// directory.
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
}

fn gb(b: f64) -> f64 {
    b / 1e9
}

/// A parameter count as model cards round it: `1T`, `671B`, `5.1B`.
fn card_count(n: f64) -> String {
    match n >= 1e12 {
        true => format!("{}T", n / 1e12),
        false => format!("{}B", n / 1e9),
    }
}

/// `day0 models`: name, total and active parameters of each built-in model (computed from its
/// config), beside the figures its model card publishes.
pub fn models(json_out: bool) -> Result<(), String> {
    let mut rows = Vec::new();
    for p in MODEL_PRESETS {
        let cfg = load_model(p.name).map_err(|e| e.to_string())?;
        let c = count(&cfg);
        rows.push(json!({
            "name": p.name,
            "total_params": c.total(),
            "active_params": c.active(),
            "active_params_without_input_embedding": c.active_without_input_embedding(),
            "published_total_params": p.published.map(|(t, _)| t),
            "published_active_params": p.published.map(|(_, a)| a),
            "layers": cfg.num_layers(),
            "description": p.description,
            "config": p.file,
        }));
    }
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "{:<16} {:>10} {:>10} {:>10} {:>11} {:>7}  description",
        "name", "total", "active", "w/o embed", "card says", "layers"
    );
    for (r, p) in rows.iter().zip(MODEL_PRESETS) {
        let b = |k: &str| r[k].as_u64().unwrap_or(0) as f64 / 1e9;
        let card = p.published.map_or("-".to_string(), |(t, a)| {
            format!("{}/{}", card_count(t), card_count(a))
        });
        println!(
            "{:<16} {:>9.1}B {:>9.2}B {:>9.2}B {:>11} {:>7}  {}",
            r["name"].as_str().unwrap_or(""),
            b("total_params"),
            b("active_params"),
            b("active_params_without_input_embedding"),
            card,
            r["layers"].as_u64().unwrap_or(0),
            r["description"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// `day0 clusters`: the built-in cluster presets.
pub fn clusters(json_out: bool) -> Result<(), String> {
    let mut rows = Vec::new();
    for name in ClusterPreset::names() {
        let c = ClusterPreset::load(name).map_err(|e| e.to_string())?;
        rows.push(json!({
            "name": c.name,
            "device": c.device,
            "nodes": c.nodes,
            "cards_per_node": c.cards_per_node,
            "intra_topology": c.intra.topology.name(),
            "intra_gbps": c.intra.bandwidth_gbps,
            "inter_gbps": c.inter.bandwidth_gbps,
            "description": c.description,
        }));
    }
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    for r in &rows {
        println!(
            "{:<10} {:>2} x {} x {:<9} intra {:>5} GB/s {:<9} inter {:>4} GB/s  {}",
            r["name"].as_str().unwrap_or(""),
            r["nodes"],
            r["cards_per_node"],
            r["device"].as_str().unwrap_or(""),
            r["intra_gbps"],
            r["intra_topology"].as_str().unwrap_or(""),
            r["inter_gbps"],
            r["description"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// The model, cluster (grown to `cards`), estimator, workload and memory options of a command.
struct Setup {
    est: Estimator,
    /// The tuning file the cards' launches take their tiles from, if any.
    tuning: Option<std::path::PathBuf>,
    workload: Workload,
    mem: MemoryOptions,
}

fn setup(a: &DeployArgs, cards: Option<usize>) -> Result<Setup, String> {
    let cfg = load_model(&a.model).map_err(|e| format!("--model: {e}"))?;
    let mut cluster = ClusterPreset::load(&a.cluster).map_err(|e| format!("--cluster: {e}"))?;
    // The cluster grows to hold the cards asked for.
    match cards {
        Some(0) => return Err("--cards: must be at least 1".into()),
        Some(n) if n.div_ceil(cluster.cards_per_node) > cluster.nodes => {
            cluster = cluster
                .with_nodes(n.div_ceil(cluster.cards_per_node))
                .map_err(|e| format!("--cards: {e}"))?;
        }
        _ => {}
    }
    let routing = Routing::parse(&a.routing).map_err(|e| e.to_string())?;
    let (kv_bytes, kv_format) = match a.kv_dtype.as_str() {
        "bf16" => (2.0, model::forward::CacheFormat::Bf16),
        "fp8" => (1.0, model::forward::CacheFormat::Fp8),
        other => return Err(format!("--kv-dtype: `{other}` is not bf16 or fp8")),
    };
    if !(0.0..0.9).contains(&a.reserve) {
        return Err(format!(
            "--reserve: {} is not a share in [0, 0.9)",
            a.reserve
        ));
    }
    if a.prompt_len == 0 || a.output_len == 0 {
        return Err("--prompt-len and --output-len must be at least 1".into());
    }
    if a.batch == Some(0) {
        return Err("--batch: must be at least 1".into());
    }
    for (flag, v) in [("--tpot-ms", a.tpot_ms), ("--ttft-ms", a.ttft_ms)] {
        if v.is_some_and(|t| !(t.is_finite() && t > 0.0)) {
            return Err(format!("{flag}: must be a positive number of milliseconds"));
        }
    }
    let workload = Workload {
        prompt_len: a.prompt_len,
        output_len: a.output_len,
        batch: a.batch,
        context: a.context,
        tpot_target_s: a.tpot_ms.map(|t| t / 1e3),
        ttft_target_s: a.ttft_ms.map(|t| t / 1e3),
    };
    let max_pos = cfg.max_position_embeddings;
    let need = workload.decode_context().max(a.prompt_len + a.output_len);
    if let Some(m) = max_pos {
        if need > m {
            return Err(format!(
                "--prompt-len/--output-len/--context: {need} tokens exceed the model's max_position_embeddings {m}"
            ));
        }
    }
    let mut est = Estimator::new(cfg, cluster, routing)
        .map_err(|e| e.to_string())?
        .with_precision(a.precision)
        .with_kv_cache(Some(kv_format));
    let device = est.device().name.clone();
    let tuning = day0::tune_model::resolve_tuning(a.tuning.as_deref(), est.config(), &device)?;
    let tuning_path = tuning.as_ref().map(|t| t.path.clone());
    let impls = day0::tune_model::ResolvedTuning::impls_then(tuning.as_ref(), &a.impls);
    for (op, name) in crate::model_cmd::parse_impls(&impls)? {
        est = est
            .with_implementation(op, name)
            .map_err(|e| e.to_string())?;
    }
    est = est.with_tuning(tuning.map(|t| t.table));
    Ok(Setup {
        est,
        tuning: tuning_path,
        workload,
        mem: MemoryOptions {
            kv_bytes,
            reserve: a.reserve,
        },
    })
}

fn estimate_json(e: &StepEstimate) -> Value {
    let b = &e.breakdown;
    let (ops, ops_by_kind) = crate::model_cmd::op_table_json(&e.ops);
    json!({
        "plan": e.plan.to_string(),
        "cards": e.plan.cards(),
        "step_ms": e.step_s * 1e3,
        "tokens_per_s": e.tokens_per_s,
        "tokens_per_s_per_card": e.tokens_per_s_per_card,
        "mfu": e.mfu,
        "hbm_utilization": e.hbm_utilization,
        "comm_exposed_share": e.comm_exposed_share,
        "breakdown": {
            "attention_ms": b.attention_s * 1e3,
            "dense_ffn_ms": b.dense_ffn_s * 1e3,
            "experts_ms": b.experts_s * 1e3,
            "head_ms": b.head_s * 1e3,
            "tp_comm_ms": b.tp_comm_s * 1e3,
            "ep_comm_ms": b.ep_comm_s * 1e3,
            "pp_comm_ms": b.pp_comm_s * 1e3,
        },
        "ops": ops,
        "ops_by_layer_kind": ops_by_kind,
    })
}

fn memory_json(m: &MemoryPlan) -> Value {
    json!({
        "capacity_gb": gb(m.capacity),
        "weights_gb": gb(m.weights.total()),
        "weights_dense_gb": gb(m.weights.dense),
        "weights_experts_gb": gb(m.weights.experts),
        "weights_other_gb": gb(m.weights.other),
        "kv_gb": gb(m.free_for_cache().max(0.0)),
        "kv_bytes_per_token": m.kv_per_token,
        "state_bytes_per_sequence": m.state_per_sequence,
        "activations_gb": gb(m.activations),
        "workspace_gb": gb(m.workspace),
        "reserve_gb": gb(m.reserve),
        "kv_tokens_capacity": m.kv_tokens_capacity(),
    })
}

fn phase_json(c: &PhaseChoice, phase: Phase, target_s: Option<f64>) -> Value {
    let mut v = estimate_json(&c.best.estimate);
    let e = &c.best.estimate;
    v["target_ms"] = json!(target_s.map(|t| t * 1e3));
    v["meets_target"] = json!(target_s.is_none_or(|t| e.step_s <= t));
    match phase {
        Phase::Prefill => {
            v["ttft_ms"] = json!(e.step_s * 1e3);
            v["prompt_len"] = json!(e.context);
        }
        Phase::Decode => {
            v["tpot_ms"] = json!(e.step_s * 1e3);
            v["context"] = json!(e.context);
            v["batch_per_replica"] = json!(e.batch_per_replica);
            v["batch_per_card"] =
                json!((e.batch_per_replica * e.plan.dp) as f64 / e.plan.cards() as f64);
        }
    }
    v["why"] = json!(c.why);
    v["memory"] = memory_json(&c.best.memory);
    v["alternatives"] = json!(c
        .alternatives
        .iter()
        .take(4)
        .map(|a| json!({"plan": a.estimate.plan.to_string(), "step_ms": a.estimate.step_s * 1e3, "tokens_per_s": a.estimate.tokens_per_s}))
        .collect::<Vec<_>>());
    v["rejected"] = json!(c
        .rejected
        .iter()
        .map(|(p, why)| json!({"plan": p.to_string(), "why": why}))
        .collect::<Vec<_>>());
    v
}

/// Writes `name` into the `--plot` directory (created if needed).
fn write_chart(dir: &std::path::Path, name: &str, svg: &str) -> Result<std::path::PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("--plot {}: {e}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, svg).map_err(|e| format!("--plot {}: {e}", path.display()))?;
    Ok(path)
}

fn breakdown_parts(e: &StepEstimate) -> Vec<(String, f64)> {
    let b = &e.breakdown;
    // Exposed EP communication: what the overlap left on the critical path.
    let compute = b.attention_s + b.dense_ffn_s + b.experts_s + b.head_s;
    let ep_exposed = (e.step_s - compute - b.tp_comm_s - b.pp_comm_s).max(0.0);
    [
        ("attention", b.attention_s),
        ("dense FFN", b.dense_ffn_s),
        ("routed experts", b.experts_s),
        ("embedding/lm_head", b.head_s),
        ("tp all-reduce", b.tp_comm_s),
        ("ep all-to-all (exposed)", ep_exposed),
        ("pp send/recv", b.pp_comm_s),
    ]
    .iter()
    .map(|(n, s)| (n.to_string(), s * 1e3))
    .collect()
}

/// The cards one phase deploys on, when something names them: its own flag (`own`, named
/// `flag`), else `--cards`, else its plan's own count (`tp·dp·pp`) when the plan names `dp`.
/// `None` leaves the phase the whole cluster.
fn phase_cards(
    own: Option<usize>,
    flag: &str,
    cards: Option<usize>,
    plan: Option<&String>,
) -> Result<Option<usize>, String> {
    if own == Some(0) {
        return Err(format!("{flag}: must be at least 1"));
    }
    if cards == Some(0) {
        return Err("--cards: must be at least 1".into());
    }
    Ok(own.or(cards).or_else(|| {
        plan.filter(|spec| spec.split(',').any(|p| p.trim().starts_with("dp")))
            .and_then(|spec| Plan::parse(spec, None, flag).ok())
            .map(|p| p.cards())
    }))
}

fn fixed_plan(spec: Option<&String>, cards: usize, flag: &str) -> Result<Option<Plan>, String> {
    spec.map(|s| Plan::parse(s, Some(cards), flag).map_err(|e| e.to_string()))
        .transpose()
}

/// `day0 run`: coverage, numeric checks, planning, simulated prefill and decode, report.
pub fn run(a: RunArgs) -> Result<(), String> {
    let t0 = Instant::now();
    let prefill_spec = a.prefill_plan.as_ref().or(a.plan.as_ref());
    let decode_spec = a.decode_plan.as_ref().or(a.plan.as_ref());
    let prefill_cards = phase_cards(a.prefill_cards, "--prefill-cards", a.cards, prefill_spec)?;
    let decode_cards = phase_cards(a.decode_cards, "--decode-cards", a.cards, decode_spec)?;
    // The cluster grows to hold the larger deployment.
    let most = prefill_cards.max(decode_cards).or(a.cards);
    let s = setup(&a.deploy, most)?;
    let whole = s.est.cluster().cards();
    let (prefill_cards, decode_cards) = (
        prefill_cards.unwrap_or(whole),
        decode_cards.unwrap_or(whole),
    );
    let cfg = s.est.config().clone();
    let say = |msg: String| {
        if !a.json {
            println!("{msg}");
        }
    };
    let c = count(&cfg);
    let on_cards = if prefill_cards == decode_cards {
        format!("{decode_cards} cards")
    } else {
        format!("{prefill_cards} prefill and {decode_cards} decode cards")
    };
    say(format!(
        "day0 run — {} ({:.1}B parameters, {:.1}B active, {} layers) on {on_cards} of {} ({})",
        a.deploy.model,
        c.total() as f64 / 1e9,
        c.active() as f64 / 1e9,
        cfg.num_layers(),
        s.est.cluster().name,
        s.est.device().name
    ));
    if let Some(p) = &s.tuning {
        say(format!("      tiles: tuned, from {}", p.display()));
    }
    // A model_type day0 does not know was read as the family its fields match: every number
    // below stands on that guess, so it leads the report.
    let inferred: Vec<String> = cfg
        .inferred_family()
        .map(|w| w.to_string())
        .into_iter()
        .collect();
    for w in &inferred {
        say(format!("      warning: {w}"));
    }
    // 1. Coverage.
    let cov = model::coverage::Coverage::of_config(&cfg);
    say(format!(
        "[1/5] coverage: {} operator(s), {} missing{}",
        cov.rows.len(),
        cov.missing().len(),
        if cov.is_complete() {
            String::new()
        } else {
            format!(" ({})", cov.missing().join(", "))
        }
    ));
    if !cov.is_complete() {
        return Err(format!(
            "the model needs operators day0 lacks: {} (prototype them in the DSL, then rerun)",
            cov.missing().join(", ")
        ));
    }
    // 2-4. Numeric checks of the operators on the card, and the plans and simulated phases:
    // independent, so the checks and the two phases run on threads of their own (the numbers do
    // not depend on it: every estimate is a pure function of its plan).
    let prefill_fixed = match &a.prefill_plan {
        Some(p) => fixed_plan(Some(p), prefill_cards, "--prefill-plan")?,
        None => fixed_plan(a.plan.as_ref(), prefill_cards, "--plan")?,
    };
    let decode_fixed = match &a.decode_plan {
        Some(p) => fixed_plan(Some(p), decode_cards, "--decode-plan")?,
        None => fixed_plan(a.plan.as_ref(), decode_cards, "--plan")?,
    };
    let progress = |msg: &str| {
        if !a.json {
            eprintln!("      … {msg} ({:.1} s)", t0.elapsed().as_secs_f64());
        }
    };
    progress("checking the kernels, planning prefill and decode");
    let plan = |phase: Phase, fixed: Option<Plan>| {
        plan_phase(
            &s.est,
            phase,
            match phase {
                Phase::Prefill => prefill_cards,
                Phase::Decode => decode_cards,
            },
            &s.workload,
            &s.mem,
            fixed,
            a.finalists,
        )
    };
    let (checked, prefill, decode) = std::thread::scope(|scope| {
        let checks = (!a.no_check).then(|| {
            scope.spawn(|| {
                let launcher = dsl_core::Launcher::new(s.est.device().clone());
                day0::suite::check_entries(&launcher, day0::layer_checks::entries(&cfg))
            })
        });
        let decode = scope.spawn(|| plan(Phase::Decode, decode_fixed));
        let prefill = plan(Phase::Prefill, prefill_fixed);
        let panicked = |what: &str| format!("{what}: its thread panicked");
        (
            checks.map(|h| h.join().map_err(|_| panicked("numeric checks"))),
            prefill,
            decode.join().map_err(|_| panicked("decode planning")),
        )
    });
    let checked_names: Vec<String> = day0::layer_checks::entries(&cfg)
        .into_iter()
        .map(|e| e.name)
        .collect();
    let mut checked_kinds: Vec<&str> = Vec::new();
    for n in &checked_names {
        let kind = n.split(':').next().unwrap_or(n);
        if !checked_kinds.contains(&kind) {
            checked_kinds.push(kind);
        }
    }
    let checks = match checked.transpose()? {
        None => {
            say("[2/5] numeric checks: skipped (--no-check)".into());
            json!({"skipped": true})
        }
        Some((passed, failures)) => {
            say(format!(
                "[2/5] numeric checks: {passed} kernel(s) of the model's layer kinds ({}) match their f64 references at tiny sizes on {}{}",
                checked_kinds.join(", "),
                s.est.device().name,
                if failures.is_empty() {
                    String::new()
                } else {
                    format!("; FAILED: {}", failures.join("; "))
                }
            ));
            if !failures.is_empty() {
                return Err(format!("numeric checks failed: {}", failures.join("; ")));
            }
            json!({"skipped": false, "passed": passed, "failed": failures, "kernels": checked_names})
        }
    };
    let prefill = prefill.map_err(|e| format!("prefill: {e}"))?;
    let decode = decode?.map_err(|e| format!("decode: {e}"))?;
    say(format!(
        "[3/5] planned: prefill {} ({} plans considered), decode {} ({} considered); {} distinct card-role forwards simulated",
        prefill.best.estimate.plan,
        1 + prefill.alternatives.len() + prefill.rejected.len(),
        decode.best.estimate.plan,
        1 + decode.alternatives.len() + decode.rejected.len(),
        s.est.runs()
    ));
    say(format!(
        "[4/5] simulated: prefill of {} tokens, decode at context {}",
        s.workload.prompt_len,
        s.workload.decode_context()
    ));
    if let Some(dir) = &a.plot {
        let rows = vec![
            (
                format!("prefill {}", prefill.best.estimate.plan),
                breakdown_parts(&prefill.best.estimate),
            ),
            (
                format!("decode {}", decode.best.estimate.plan),
                breakdown_parts(&decode.best.estimate),
            ),
        ];
        let title = format!(
            "{} on {on_cards} x {}: where a step goes",
            a.deploy.model,
            s.est.device().name
        );
        let path = write_chart(
            dir,
            "breakdown.svg",
            &day0::charts::breakdown(&title, &rows),
        )?;
        say(format!("      chart: {}", path.display()));
    }
    let wall = t0.elapsed().as_secs_f64();
    if a.json {
        let report = json!({
            "model": a.deploy.model,
            "cluster": s.est.cluster().name,
            "device": s.est.device().name,
            "cards": prefill_cards.max(decode_cards),
            "prefill_cards": prefill_cards,
            "decode_cards": decode_cards,
            "total_params": c.total(),
            "active_params": c.active(),
            "active_params_without_input_embedding": c.active_without_input_embedding(),
            "coverage": {"operators": cov.rows.len(), "missing": cov.missing()},
            "config_warnings": inferred,
            "checks": checks,
            "prefill": phase_json(&prefill, Phase::Prefill, s.workload.ttft_target_s),
            "decode": phase_json(&decode, Phase::Decode, s.workload.tpot_target_s),
            "memory": memory_json(&decode.best.memory),
            "kv_cache": kv_cache_json(&a.deploy.kv_dtype),
            "tuning": s.tuning.as_ref().map(|p| p.display().to_string()),
            "wall_s": wall,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!("[5/5] report");
    print_phase(
        "prefill",
        &prefill,
        Phase::Prefill,
        s.workload.ttft_target_s,
    );
    print_phase("decode", &decode, Phase::Decode, s.workload.tpot_target_s);
    print_memory(&decode.best);
    println!("  ({wall:.1} s wall)");
    Ok(())
}

fn print_phase(name: &str, c: &PhaseChoice, phase: Phase, target_s: Option<f64>) {
    let e = &c.best.estimate;
    if let Some(t) = target_s.filter(|t| e.step_s > *t) {
        println!(
            "  {name:<7} target NOT met: {:.1} ms against {:.1} ms (no plan of these cards meets it; add cards or relax the target)",
            e.step_s * 1e3,
            t * 1e3
        );
    }
    let b = &e.breakdown;
    let head = match phase {
        Phase::Prefill => format!("TTFT {:.1} ms for {} tokens", e.step_s * 1e3, e.context),
        Phase::Decode => format!(
            "TPOT {:.2} ms at batch {} per replica, context {}",
            e.step_s * 1e3,
            e.batch_per_replica,
            e.context
        ),
    };
    println!(
        "  {name:<7} {}: {head}; {:.0} tokens/s ({:.1} per card); MFU {:.1}%, HBM {:.0}%, exposed comm {:.0}%",
        e.plan,
        e.tokens_per_s,
        e.tokens_per_s_per_card,
        e.mfu * 100.0,
        e.hbm_utilization * 100.0,
        e.comm_exposed_share * 100.0
    );
    println!(
        "          breakdown (ms): attention {:.2}, dense ffn {:.2}, experts {:.2}, head {:.2}, tp comm {:.2}, ep comm {:.2} (before overlap), pp comm {:.2}",
        b.attention_s * 1e3,
        b.dense_ffn_s * 1e3,
        b.experts_s * 1e3,
        b.head_s * 1e3,
        b.tp_comm_s * 1e3,
        b.ep_comm_s * 1e3,
        b.pp_comm_s * 1e3
    );
    println!("          why: {}", c.why);
    for alt in c.alternatives.iter().take(3) {
        println!(
            "          alternative {}: {:.2} ms, {:.0} tokens/s",
            alt.estimate.plan,
            alt.estimate.step_s * 1e3,
            alt.estimate.tokens_per_s
        );
    }
}

/// The `kv_cache` field of a `day0 run --json` report: the cache format the memory plan sized
/// and the one the simulated steps read, the same since every pool kind (MLA latents, DSA
/// indexer keys, GQA keys and values) has FP8 kernels.
fn kv_cache_json(planned: &str) -> serde_json::Value {
    json!({
        "planned_dtype": planned,
        "simulated_dtype": planned,
    })
}

fn print_memory(c: &Candidate) {
    let m = &c.memory;
    println!(
        "  memory per card (decode plan): weights {:.1} GB (dense {:.1}, experts {:.1}, other {:.1}), activations {:.2} GB, workspace {:.2} GB, reserve {:.1} GB, KV/state {:.1} GB free of {:.1} GB → {}",
        gb(m.weights.total()),
        gb(m.weights.dense),
        gb(m.weights.experts),
        gb(m.weights.other),
        gb(m.activations),
        gb(m.workspace),
        gb(m.reserve),
        gb(m.free_for_cache().max(0.0)),
        gb(m.capacity),
        match m.kv_tokens_capacity() {
            Some(t) => format!("{t} KV tokens"),
            // Windowed or recurrent layers only: the cache is per sequence, not per token.
            None => "no per-token KV cache (every layer's cache is bounded per sequence)".into(),
        }
    );
}

/// `day0 scale`: the best decode plan and its throughput at each card count.
pub fn scale(a: ScaleArgs) -> Result<(), String> {
    let counts: Vec<usize> = a
        .cards
        .split(',')
        .map(|s| s.trim().parse::<usize>().ok().filter(|n| *n > 0))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| {
            format!(
                "--cards: `{}` is not a comma-separated list of card counts",
                a.cards
            )
        })?;
    let mut rows = Vec::new();
    let mut base: Option<(usize, f64)> = None;
    // One estimator on a cluster grown to the largest count: card counts that share a shard
    // share its simulated runs.
    let s = setup(&a.deploy, counts.iter().copied().max())?;
    crate::model_cmd::note_inferred(s.est.config());
    for n in counts {
        let row = match plan_phase(
            &s.est,
            Phase::Decode,
            n,
            &s.workload,
            &s.mem,
            None,
            FINALISTS,
        ) {
            Ok(c) => {
                let e = &c.best.estimate;
                let per_card = e.tokens_per_s_per_card;
                let (n0, pc0) = *base.get_or_insert((n, per_card));
                json!({"cards": n, "plan": e.plan.to_string(), "tpot_ms": e.step_s * 1e3,
                       "tokens_per_s": e.tokens_per_s, "tokens_per_s_per_card": per_card,
                       "scaling_efficiency": per_card / pc0, "relative_to_cards": n0})
            }
            Err(e) => json!({"cards": n, "error": e.to_string()}),
        };
        rows.push(row);
    }
    if let Some(dir) = &a.plot {
        let points: Vec<(f64, f64, String)> = rows
            .iter()
            .filter(|r| r.get("error").is_none())
            .map(|r| {
                (
                    r["cards"].as_u64().unwrap_or(0) as f64,
                    r["tokens_per_s"].as_f64().unwrap_or(0.0),
                    format!(
                        "{:.0}%",
                        r["scaling_efficiency"].as_f64().unwrap_or(0.0) * 100.0
                    ),
                )
            })
            .collect();
        let title = format!(
            "{}: decode throughput and scaling efficiency",
            a.deploy.model
        );
        let svg = day0::charts::line(&title, "cards", "tokens/s", &points);
        let path = write_chart(dir, "scaling.svg", &svg)?;
        if !a.json {
            println!("chart: {}", path.display());
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "{:>6}  {:<28} {:>10} {:>12} {:>10} {:>8}",
        "cards", "decode plan", "TPOT ms", "tokens/s", "per card", "scaling"
    );
    for r in &rows {
        if let Some(err) = r.get("error") {
            println!(
                "{:>6}  does not fit: {}",
                r["cards"].as_u64().unwrap_or(0),
                err.as_str().unwrap_or("")
            );
            continue;
        }
        println!(
            "{:>6}  {:<28} {:>10.2} {:>12.0} {:>10.1} {:>7.0}%",
            r["cards"].as_u64().unwrap_or(0),
            r["plan"].as_str().unwrap_or(""),
            r["tpot_ms"].as_f64().unwrap_or(0.0),
            r["tokens_per_s"].as_f64().unwrap_or(0.0),
            r["tokens_per_s_per_card"].as_f64().unwrap_or(0.0),
            r["scaling_efficiency"].as_f64().unwrap_or(0.0) * 100.0
        );
    }
    Ok(())
}
