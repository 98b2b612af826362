//! `day0 tune` and `day0 kernels`: the command-line side of [`day0::tune`] and of the kernel
//! registry.

use clap::Args;
use day0::tune::{self, Shape, TuneRequest, TuneResult};
use std::io::IsTerminal;

/// `day0 tune`.
#[derive(Args)]
#[command(after_long_help = "\
KERNELS AND --shape:
  gemm (every GEMM implementation; or one of gemm_db, gemm_pipelined, gemm_persistent, gemm_hand; `--impl gemm`
  for the naive one)
      --shape MxNxK (e.g. 4096x4096x4096) or m=4096,n=4096,k=4096
  attention_prefill (both), flash_prefill, flash_prefill_pipelined (causal flash attention)
      --shape seq=S,heads=H[,kv_heads=HKV][,head_dim=128][,v_head_dim=D][,ctx=S]
      e.g. --shape seq=4096,heads=32,kv_heads=8,head_dim=128
  sparse_mla (DSA sparse latent attention over each query's top-k rows)
      --shape ctx=C[,seq=1][,heads=128][,topk=2048][,kv_lora=512][,rope=64][,page=64]
      e.g. --shape seq=1,ctx=65536 (a DeepSeek-V3.2 decode step)
  attention_decode (both), paged_decode_split, paged_decode_hand (split-KV paged decode;
      the combine is included)
      --shape ctx=C,heads=H[,kv_heads=H][,head_dim=128][,v_head_dim=D][,page=64][,splits=4]
      e.g. --shape ctx=8192,heads=32,kv_heads=8
  expert_gemm_mxfp4 (both), expert_gemm_mxfp4_hand (MXFP4 expert GEMM, dequantized on chip)
      --shape experts=E,tokens=T,n=N,k=K (K a multiple of 32)
      e.g. --shape experts=8,tokens=16,n=2048,k=7168

MODELS:
  --model CONFIG (a config.json or a preset from `day0 models`) tunes every launch of the model
  whose tiles a tuning table may set (linear layers and expert GEMMs) at a prefill of
  --prompt-len tokens and a decode step of --batch sequences at --context, and writes the tuning
  file to the cache (and --out FILE); `day0 forward` and `day0 run` use it (see --tuning there).

Every configuration of the declared tunable space runs cost-only; the three fastest then run
functionally at a reduced shape against the f64 reference (non-zero exit above tolerance).
Results are cached under $XDG_CACHE_HOME/day0 (default ~/.cache/day0), keyed by the kernels'
source lines and tunable space, the preset, the shape, the dtype and the day0 build.")]
pub struct TuneArgs {
    /// An operator (gemm, attention_prefill, sparse_mla, attention_decode, expert_gemm_mxfp4:
    /// every implementation of it) or one implementation (gemm_db, gemm_pipelined,
    /// gemm_persistent, gemm_hand, flash_prefill, flash_prefill_pipelined, paged_decode_split,
    /// paged_decode_hand, expert_gemm_mxfp4_hand). Not with --model.
    kernel: Option<String>,
    /// The problem shape; the syntax depends on the kernel (see below).
    #[arg(long)]
    shape: Option<String>,
    /// Tune every tunable launch of a model (a config.json path or a preset: `day0 models`) at
    /// its prefill and decode shapes, and write a tuning file that `day0 forward` and `day0 run`
    /// use (by default from the cache; `--tuning FILE` elsewhere).
    #[arg(long, value_name = "CONFIG")]
    model: Option<String>,
    /// With --model: prompt tokens of the prefill tuned at.
    #[arg(long, default_value_t = 4096)]
    prompt_len: usize,
    /// With --model: sequences of the decode step tuned at.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// With --model: context of the decode step tuned at.
    #[arg(long, default_value_t = 4096)]
    context: usize,
    /// With --model: write the tuning file here too (it always goes to the cache unless
    /// --no-cache).
    #[arg(long, value_name = "FILE")]
    out: Option<String>,
    /// Device preset name or path to a preset .toml file.
    #[arg(long, default_value = "npu-910b")]
    device: String,
    /// Restrict an operator to these implementations (repeatable), e.g. `--impl gemm_db`.
    #[arg(long = "impl", value_name = "NAME")]
    impls: Vec<String>,
    /// Input dtype: bf16 or f32 (default: bf16; f32 for sparse_mla, the dtype of its runner's
    /// cache).
    #[arg(long)]
    dtype: Option<String>,
    /// Print the result as one JSON object (`configs`: every configuration, best first).
    #[arg(long)]
    json: bool,
    /// Write a heat map of cycles over the first two tunables (e.g. BM × BN at the best BK).
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<String>,
    /// Neither read nor write the cache.
    #[arg(long)]
    no_cache: bool,
    /// Host threads for the sweep (the result does not depend on it).
    #[arg(long)]
    threads: Option<usize>,
}

/// Runs `day0 tune`: errors are returned with the flag at fault; a failed spot check, or no
/// configuration that runs, is an error after the result is printed.
pub fn tune_cmd(args: TuneArgs) -> Result<(), String> {
    if let Some(model) = &args.model {
        return tune_model_cmd(&args, model);
    }
    let kernel = args
        .kernel
        .clone()
        .ok_or("name a kernel to tune (`day0 tune gemm --shape 4096x4096x4096`), or a model with --model CONFIG")?;
    let shape_text = args.shape.as_deref().ok_or_else(|| {
        format!("--shape is required to tune `{kernel}` (see `day0 tune --help`)")
    })?;
    let target = tune::resolve(&kernel, &args.impls)?;
    let shape = Shape::parse(target.family, shape_text)?;
    let dtype = match &args.dtype {
        Some(d) => tune::parse_dtype(d)?,
        None => target.family.default_dtype(),
    };
    if args.threads == Some(0) {
        return Err("--threads must be at least 1".into());
    }
    let preset = accel_sim::DevicePreset::load(&args.device)
        .map_err(|e| format!("--device {}: {e}", args.device))?;
    let req = TuneRequest {
        kernel: kernel.clone(),
        target,
        shape,
        dtype,
        preset,
        threads: args.threads,
    };
    let cached = if args.no_cache {
        None
    } else {
        tune::load_cached(&req)
    };
    let result = match cached {
        Some(r) => r,
        None => {
            let r = run_with_progress(&req)?;
            if !args.no_cache {
                // A cache that cannot be written costs the next run time, not this one's answer.
                if let Err(e) = tune::store_cached(&req, &r) {
                    eprintln!("warning: {e}");
                }
            }
            r
        }
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", tune::table(&result));
    }
    if let Some(path) = &args.plot {
        let svg = tune::heatmap_svg(&result)
            .ok_or("--plot: nothing to draw (no configuration runs, or fewer than two tunables)")?;
        std::fs::write(path, svg).map_err(|e| format!("--plot {path}: cannot write: {e}"))?;
        if !args.json {
            println!("heat map written to {path}");
        }
    }
    check(&result)
}

/// `day0 tune --model`: discovers the model's tunable launches, sweeps each one's tiles, writes
/// the tuning file (cache, and `--out`), prints the table or the file. A second run with the
/// same request is served from the cached file.
fn tune_model_cmd(args: &TuneArgs, model: &str) -> Result<(), String> {
    use day0::tune_model::{self, ModelTuneRequest};
    if args.kernel.is_some() || args.shape.is_some() || !args.impls.is_empty() {
        return Err(
            "--model tunes every launch of the model: give no kernel, --shape or --impl".into(),
        );
    }
    for (flag, v) in [
        ("--prompt-len", args.prompt_len),
        ("--batch", args.batch),
        ("--context", args.context),
    ] {
        if v == 0 {
            return Err(format!("{flag}: must be at least 1"));
        }
    }
    let cfg = model::plan::presets::load_model(model).map_err(|e| format!("--model: {e}"))?;
    crate::model_cmd::note_inferred(&cfg);
    if let Some(max) = cfg.max_position_embeddings {
        let need = args.prompt_len.max(args.context + 1);
        if need > max {
            return Err(format!(
                "--prompt-len/--context: {need} positions, beyond the config's max_position_embeddings {max}"
            ));
        }
    }
    let preset = accel_sim::DevicePreset::load(&args.device)
        .map_err(|e| format!("--device {}: {e}", args.device))?;
    let req = ModelTuneRequest {
        cfg,
        model: model.to_string(),
        device: args.device.clone(),
        prompt_len: args.prompt_len,
        batch: args.batch,
        context: args.context,
    };
    let cache = (!args.no_cache)
        .then(|| tune_model::default_path(&req.cfg, &preset.name))
        .flatten();
    let cached = cache.as_ref().and_then(|p| {
        let (f, _) = tune_model::read_tuning(p).ok()?;
        (f.kernels_hash == tune_model::kernels_hash()
            && (f.prompt_len, f.batch, f.context) == (req.prompt_len, req.batch, req.context))
            .then_some(f)
    });
    let from_cache = cached.is_some();
    let file = match cached {
        Some(f) => f,
        None => {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(args.threads.unwrap_or(0))
                .build()
                .map_err(|e| format!("--threads: {e}"))?;
            let bar = progress_bar();
            bar.set_message(format!("tuning {model}"));
            let f = pool.install(|| {
                tune_model::tune_model(&req, &|n| bar.set_length(n as u64), &|| bar.inc(1))
            });
            bar.finish_and_clear();
            f?
        }
    };
    let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
    let mut written = Vec::new();
    if let (Some(p), false) = (&cache, from_cache) {
        match tune::write_atomic(p, &text) {
            Ok(()) => written.push(p.display().to_string()),
            // A cache that cannot be written costs the next run time, not this one's answer.
            Err(e) => eprintln!("warning: {e}"),
        }
    }
    if let Some(out) = &args.out {
        tune::write_atomic(std::path::Path::new(out), &text).map_err(|e| format!("--out: {e}"))?;
        written.push(out.clone());
    }
    if args.json {
        println!("{text}");
    } else {
        print!("{}", tune_model::table(&file));
        if from_cache {
            println!(
                "(from the cache: {})",
                cache
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string())
            );
        }
        for w in &written {
            println!("tuning file written to {w}");
        }
        println!(
            "`day0 forward` and `day0 run` on this model and device use the cached file; \
             elsewhere pass --tuning FILE (--tuning none: the heuristic tiles)"
        );
    }
    Ok(())
}

/// A progress bar on stderr when it is a terminal (hidden otherwise).
fn progress_bar() -> indicatif::ProgressBar {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bar = ProgressBar::with_draw_target(None, target);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} configs, {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar
}

/// `day0 compare`.
#[derive(Args)]
#[command(after_long_help = "\
Each implementation runs at its fastest tiles for the shape (from `day0 tune`'s sweep, cached),
then functionally on the same seeded random inputs; the exit status is non-zero when one is
outside its dtype's tolerance. --shape takes the syntax of `day0 tune` (see `day0 tune --help`);
without it a small shape of the operator runs.")]
pub struct CompareArgs {
    /// An operator (gemm, attention_prefill, sparse_mla, attention_decode, expert_gemm_mxfp4).
    op: String,
    /// Only these implementations (repeatable, at least two to compare), e.g. `--impl gemm_db`.
    #[arg(long = "impl", value_name = "NAME")]
    impls: Vec<String>,
    /// The problem shape (default: a small one that runs functionally in seconds).
    #[arg(long)]
    shape: Option<String>,
    /// Device preset name or path to a preset .toml file.
    #[arg(long, default_value = "npu-910b")]
    device: String,
    /// Input dtype: bf16 or f32 (default as `day0 tune`).
    #[arg(long)]
    dtype: Option<String>,
    /// Cycles only, no numbers (for shapes too large to run functionally).
    #[arg(long)]
    cost_only: bool,
    /// Print one JSON object (`implementations`: fastest first).
    #[arg(long)]
    json: bool,
}

/// Runs `day0 compare`.
pub fn compare_cmd(args: CompareArgs) -> Result<(), String> {
    let target = tune::resolve(&args.op, &args.impls)?;
    let shape = match &args.shape {
        Some(text) => Shape::parse(target.family, text)?,
        None => day0::compare::default_shape(&target)?,
    };
    let dtype = match &args.dtype {
        Some(d) => tune::parse_dtype(d)?,
        None => target.family.default_dtype(),
    };
    let preset = accel_sim::DevicePreset::load(&args.device)
        .map_err(|e| format!("--device {}: {e}", args.device))?;
    if !args.cost_only {
        let need = shape.functional_elements();
        day0::host_memory::check(
            day0::host_memory::functional_bytes(&[need]),
            &format!("a functional comparison at {}", shape.canonical()),
            "add --cost-only (cycles without numbers), or a smaller --shape",
        )?;
    }
    let req = TuneRequest {
        kernel: args.op.clone(),
        target,
        shape,
        dtype,
        preset,
        threads: None,
    };
    let c = day0::compare::compare(&req, args.cost_only)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&c).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", day0::compare::table(&c));
    }
    match c.implementations.iter().find(|e| !e.ok) {
        Some(e) => Err(format!(
            "{} is outside tolerance: max rel error {:.2e} > {:.0e}",
            e.implementation,
            e.max_rel_error.unwrap_or(f64::NAN),
            e.tolerance
        )),
        None => Ok(()),
    }
}

/// `day0 profile`.
#[derive(Args)]
#[command(after_long_help = "\
Every cycle of the launch's critical core (the one that finishes last) is charged to the line busy
on the most critical engine at that cycle (matrix, then vector, then DMA in, then DMA out); cycles
with no engine busy are `idle`. The lines' cycles and `idle` add up to the launch's cycles.
--shape takes the syntax of `day0 tune` (see `day0 tune --help`). The paged decode runs as two
launches (split and combine) and is not profiled as one.")]
pub struct ProfileArgs {
    /// One implementation (gemm, gemm_db, gemm_pipelined, gemm_persistent, flash_prefill,
    /// flash_prefill_pipelined, sparse_mla).
    kernel: String,
    /// The problem shape.
    #[arg(long)]
    shape: String,
    /// Tiles, e.g. `BM=128,BN=128,BK=64` (default: the fastest for the shape, from `day0 tune`).
    #[arg(long)]
    config: Option<String>,
    /// Device preset name or path to a preset .toml file.
    #[arg(long, default_value = "npu-910b")]
    device: String,
    /// Input dtype: bf16 or f32 (default as `day0 tune`).
    #[arg(long)]
    dtype: Option<String>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Parses `K=V,K=V` tiles.
fn parse_config(text: &str) -> Result<dsl_core::Config, String> {
    let mut cfg = dsl_core::Config::new();
    for part in text.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("--config {text}: `{part}` is not KEY=VALUE"))?;
        let v: i64 = v
            .trim()
            .parse()
            .map_err(|_| format!("--config {text}: `{v}` is not an integer"))?;
        cfg = cfg.with(k.trim(), v);
    }
    Ok(cfg)
}

/// Runs `day0 profile`.
pub fn profile_cmd(args: ProfileArgs) -> Result<(), String> {
    let mut target = tune::resolve(&args.kernel, &[])?;
    // `gemm` names both the operator and its naive implementation: profile the implementation.
    if target.impls.iter().any(|m| m.name == args.kernel) {
        target.impls.retain(|m| m.name == args.kernel);
    }
    let [meta] = target.impls[..] else {
        return Err(format!(
            "`{}` has {} implementations; profile one of them: {}",
            args.kernel,
            target.impls.len(),
            target
                .impls
                .iter()
                .map(|m| m.name)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let shape = Shape::parse(target.family, &args.shape)?;
    let dtype = match &args.dtype {
        Some(d) => tune::parse_dtype(d)?,
        None => target.family.default_dtype(),
    };
    let preset = accel_sim::DevicePreset::load(&args.device)
        .map_err(|e| format!("--device {}: {e}", args.device))?;
    let config = match &args.config {
        Some(text) => parse_config(text)?,
        None => {
            let req = TuneRequest {
                kernel: args.kernel.clone(),
                target: target.clone(),
                shape,
                dtype,
                preset: preset.clone(),
                threads: None,
            };
            dsl_core::Config(day0::compare::best_config(&req, meta)?.config)
        }
    };
    let launcher = dsl_core::Launcher::new(preset);
    let p = day0::profile::profile(&launcher, meta, &config, &shape, dtype)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&p).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", day0::profile::table(&p));
    }
    Ok(())
}

/// The exit status of a result: an error when nothing runs or a spot check failed.
fn check(r: &TuneResult) -> Result<(), String> {
    if r.best.is_none() {
        return Err(format!(
            "no configuration of {} runs at {} on {}",
            r.kernel, r.shape_text, r.device
        ));
    }
    if !r.verified() {
        let bad: Vec<String> = r
            .spot_checks
            .iter()
            .filter(|s| !s.ok)
            .map(|s| {
                format!(
                    "{} {}: {}",
                    s.implementation,
                    dsl_core::Config(s.config.clone()),
                    match (s.max_rel_error, &s.error) {
                        (Some(e), _) => format!("max rel err {e:.3e} > {:.0e}", s.tolerance),
                        (None, Some(e)) => e.clone(),
                        (None, None) => "no error measured".into(),
                    }
                )
            })
            .collect();
        return Err(format!(
            "spot check against the f64 reference failed: {}",
            bad.join("; ")
        ));
    }
    Ok(())
}

/// Tunes with a progress bar on stderr, drawn only when stderr is a terminal (so pipes, tests and
/// `--json` consumers see nothing of it).
fn run_with_progress(req: &TuneRequest) -> Result<TuneResult, String> {
    let total: usize = req.target.impls.iter().map(|m| m.space().len()).sum();
    let bar = progress_bar();
    bar.set_length(total as u64);
    bar.set_message(format!("tuning {}", req.kernel));
    let result = tune::tune(req, &|| bar.inc(1));
    bar.finish_and_clear();
    result
}

/// Runs `day0 kernels`: every registered implementation grouped by operator (in registry order),
/// with its kind and summary.
pub fn kernels_cmd(json: bool) -> Result<(), String> {
    use kernels::registry::all;
    let kind = day0::compare::kind_name;
    let mut ops: Vec<(&str, Vec<kernels::registry::Implementation>)> = Vec::new();
    for i in all() {
        match ops.iter_mut().find(|(op, _)| *op == i.op) {
            Some((_, v)) => v.push(i),
            None => ops.push((i.op, vec![i])),
        }
    }
    if json {
        let v: Vec<serde_json::Value> = ops
            .iter()
            .map(|(op, impls)| {
                serde_json::json!({
                    "op": op,
                    "implementations": impls.iter().map(|i| serde_json::json!({
                        "name": i.meta.name,
                        "kind": kind(i.kind),
                        "summary": i.summary,
                        "tunables": i.meta.tunables.iter().map(|(n, v)| (n.to_string(), v.to_vec()))
                            .collect::<std::collections::BTreeMap<_, _>>(),
                        "configs": i.meta.space().len(),
                        "file": i.meta.file,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    let width = ops
        .iter()
        .flat_map(|(_, v)| v.iter().map(|i| i.meta.name.len()))
        .max()
        .unwrap_or(0);
    for (op, impls) in &ops {
        println!("{op}");
        for i in impls {
            println!(
                "  {:<width$}  {:<10}  {:>4} configs  {}",
                i.meta.name,
                kind(i.kind),
                i.meta.space().len(),
                i.summary
            );
        }
    }
    Ok(())
}
