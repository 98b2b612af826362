//! The `day0` command.

use clap::{Args, Parser, Subcommand, ValueEnum};
use day0::tune;
use dsl_core::{Backend, Config, Launcher};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use std::process::ExitCode;

mod deploy_cmd;
mod model_cmd;
mod tune_cmd;
mod vision_cmd;

#[derive(Parser)]
#[command(
    name = "day0",
    version,
    about = "Day-0 adaptation workbench: tile DSL kernels on a cycle-approximate accelerator simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The release-day pipeline: a model on a cluster — coverage, numeric checks, auto-planning,
    /// simulated prefill and decode, and the report (TTFT, TPOT, tokens/s, memory per card).
    Run(deploy_cmd::RunArgs),
    /// List the built-in models with their total and active parameters.
    Models {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the built-in cluster presets.
    Clusters {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Decode throughput and scaling efficiency of a model over several card counts.
    Scale(deploy_cmd::ScaleArgs),
    /// Run the built-in kernel suite on a device and print one report line per kernel.
    Suite {
        /// Device preset name or path to a preset .toml file.
        #[arg(long, default_value = "npu-910b")]
        device: String,
        /// Print the reports as JSON (one array).
        #[arg(long)]
        json: bool,
    },
    /// Tune a kernel: every configuration of its tunable space at a shape, cost-only and in
    /// parallel, ranked by cycles, the winner explained and spot-checked against the f64 reference.
    Tune(tune_cmd::TuneArgs),
    /// Compare an operator's implementations on the same random inputs: each at its best tiles
    /// for the shape, its max relative error against the f64 reference and its cycles.
    Compare(tune_cmd::CompareArgs),
    /// Profile a kernel by source line: each line's critical-path cycles, the engine it
    /// occupied, and its DMA waits and stalls.
    Profile(tune_cmd::ProfileArgs),
    /// List every registered kernel implementation, grouped by operator.
    Kernels {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run one kernel and print its report.
    #[command(subcommand)]
    Kernel(KernelCommand),
    /// Run a checkpoint (config.json + safetensors) numerically on the simulator: logits, greedy
    /// tokens, simulated cycles per operator.
    Forward(model_cmd::ForwardArgs),
    /// Compare a checkpoint's forward pass layer by layer with reference activations.
    Validate(model_cmd::ValidateArgs),
    /// Run a checkpoint split over simulated cards (tensor-parallel attention and MLPs,
    /// expert-parallel routed experts; the collectives move real rows between the cards) and
    /// compare every card's logits and greedy tokens with one card's.
    Cards(model_cmd::CardsArgs),
    /// List the built-in device presets.
    Devices,
    /// day0's predictions against published measurements of real chips: one row per figure
    /// (accel-sim/calibration/measurements.toml), its error, and the statistics.
    Calibrate {
        /// Print the table as JSON.
        #[arg(long)]
        json: bool,
        /// Fit each device's efficiency factors on its `fit` rows (golden-section search,
        /// cost-only) and print the table with the fitted factors.
        #[arg(long)]
        fit: bool,
        /// With --fit: write the fitted factors into the presets' [efficiency] sections
        /// (rebuild afterwards: presets are embedded in the binary).
        #[arg(long, requires = "fit")]
        write: bool,
    },
    /// A multimodal model's vision encoder, cost-only at its released sizes: time per operator
    /// for images of given sizes (the part of TTFT before the language prefill).
    Vision(vision_cmd::VisionArgs),
    /// Release-day triage: every operator a model (config.json) needs, and which kernel covers it.
    /// Exits non-zero when an operator is missing.
    Coverage {
        /// config.json, or a directory holding one.
        #[arg(long)]
        config: String,
        /// Print JSON instead of the table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum KernelCommand {
    /// C[M×N] = A[M×K]·B[K×N] (f32 accumulation).
    Gemm(GemmArgs),
    /// SwiGLU expert FFN over MXFP4 or bf16 weights: what online conversion costs.
    ExpertFfn(ExpertFfnArgs),
    /// Attention kernels: flash prefill, paged decode, MLA decode, DSA sparse decode.
    Attention(AttentionArgs),
    /// Gated delta rule (Gated DeltaNet / KDA): chunked prefill or recurrent decode, with a
    /// chunk-size sweep.
    LinearAttention(LinearAttentionArgs),
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum LinearKind {
    Gdn,
    Kda,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum LinearMode {
    Chunk,
    Recurrent,
}

#[derive(Args)]
struct LinearAttentionArgs {
    /// Gated DeltaNet (scalar decay per head) or KDA (decay per key channel).
    #[arg(long, value_enum)]
    kind: LinearKind,
    /// Chunked (prefill) or token-by-token (decode).
    #[arg(long, value_enum, default_value = "chunk")]
    mode: LinearMode,
    /// Tokens.
    #[arg(long)]
    seq: usize,
    /// Key heads (and value heads unless --v-heads).
    #[arg(long)]
    heads: usize,
    /// Value heads (a multiple of --heads).
    #[arg(long)]
    v_heads: Option<usize>,
    /// Key head dim.
    #[arg(long, default_value_t = 128)]
    dk: usize,
    /// Value head dim.
    #[arg(long, default_value_t = 128)]
    dv: usize,
    /// Chunk size C (chunk mode); without it, every chunk size is swept.
    #[arg(long)]
    chunk: Option<usize>,
    /// Input dtype.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: DtypeArg,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum WeightsArg {
    Mxfp4,
    Fp8,
    Bf16,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum ModeArg {
    /// Dequantize tile by tile in SRAM.
    Online,
    /// Convert to bf16 in device memory first.
    Offline,
}

#[derive(Args)]
struct ExpertFfnArgs {
    /// Experts in the layer.
    #[arg(long)]
    experts: usize,
    /// Tokens routed to each expert.
    #[arg(long)]
    tokens: usize,
    /// Hidden size.
    #[arg(long)]
    hidden: usize,
    /// Expert intermediate size.
    #[arg(long)]
    inter: usize,
    /// Weight format (default: compare every available choice).
    #[arg(long, value_enum)]
    weights: Option<WeightsArg>,
    /// Conversion mode for MXFP4 weights (default: both).
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum AttentionKind {
    Prefill,
    Decode,
    MlaDecode,
    DsaDecode,
    DsaPrefill,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum KvDtypeArg {
    /// FP8 E4M3, one f32 scale per token and key/value head (queries stay in --dtype).
    Fp8,
    /// bf16 (queries too).
    Bf16,
    /// f32 (queries too).
    F32,
}

#[derive(Args)]
struct AttentionArgs {
    /// Which attention kernel.
    #[arg(long, value_enum)]
    kind: AttentionKind,
    /// Query tokens (prefill chunk length).
    #[arg(long)]
    seq: usize,
    /// Context length (defaults to --seq).
    #[arg(long)]
    ctx: Option<usize>,
    /// Query heads.
    #[arg(long)]
    heads: usize,
    /// Key/value heads (default: --heads).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Head dimension (queries and keys).
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Value head dimension for prefill (default: --head-dim; MLA naive prefill: 128 with --head-dim 192).
    #[arg(long)]
    v_head_dim: Option<usize>,
    /// Input dtype (prefill, decode, mla-decode; dsa-decode and dsa-prefill run f32).
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: DtypeArg,
    /// Tokens per KV-cache page (decode kinds).
    #[arg(long, default_value_t = 64)]
    page_size: usize,
    /// Context splits for flash-decoding (decode kinds).
    #[arg(long, default_value_t = 4)]
    splits: usize,
    /// KV-cache dtype for decode, mla-decode, dsa-decode and dsa-prefill (default: --dtype); fp8
    /// reports the error against the unquantised cache (and, for decode and mla-decode, the cache
    /// bytes saved). DSA at fp8 quantises the indexer keys and the latent rows; its decode runs
    /// the batched kernels the model's decode steps run.
    #[arg(long, value_enum)]
    kv_dtype: Option<KvDtypeArg>,
    /// index_topk (dsa-decode, dsa-prefill).
    #[arg(long, default_value_t = 2048)]
    topk: usize,
    /// MLA kv_lora_rank (mla-decode, dsa-decode, dsa-prefill).
    #[arg(long, default_value_t = 512)]
    kv_lora: usize,
    /// MLA qk_rope_head_dim (mla-decode, dsa-decode, dsa-prefill).
    #[arg(long, default_value_t = 64)]
    rope_dim: usize,
    /// Indexer heads (dsa-decode, dsa-prefill).
    #[arg(long, default_value_t = 64)]
    index_heads: usize,
    /// Indexer head dim (dsa-decode, dsa-prefill).
    #[arg(long, default_value_t = 128)]
    index_dim: usize,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum DtypeArg {
    Bf16,
    F32,
}

/// Input dtype of `day0 kernel gemm`.
#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum GemmDtypeArg {
    Bf16,
    F32,
    /// FP8 E4M3 inputs with block scales (1×128 per activation row, 128×128 per weight block),
    /// f32 accumulation, bf16 output: the DeepGEMM / DeepSeek-V3 recipe (B is `[N, K]`).
    Fp8,
}

#[derive(Clone, Copy, ValueEnum)]
enum VariantArg {
    /// Double-buffered K loop, one program per output tile (DMA overlaps compute).
    Db,
    /// Synchronous loads (no overlap).
    Naive,
    /// Three-stage pipeline (hides DMA latency longer than one step).
    Pipelined,
    /// Persistent: one program per core streams its output tiles' K-steps through a
    /// three-stage pipeline, storing each tile while the next one computes.
    Persistent,
}

#[derive(Args)]
struct CommonArgs {
    /// Device preset name or path to a preset .toml file.
    #[arg(long, default_value = "npu-910b")]
    device: String,
    /// Print the report as JSON (stable field names).
    #[arg(long)]
    json: bool,
    /// Write a Chrome trace-event file (open in Perfetto / chrome://tracing). Commands that run one
    /// launch write it (`kernel gemm`, `kernel attention --kind prefill`); the others refuse it.
    #[arg(long, value_name = "FILE")]
    trace: Option<String>,
    /// Shapes only: no data is allocated or computed (for production shapes); same cycles.
    #[arg(long)]
    cost_only: bool,
    /// Host threads for the functional run (results and cycles do not depend on it).
    #[arg(long)]
    threads: Option<usize>,
    /// Functional runs: stop at the first launch that stores a NaN or ±∞, naming the kernel, its
    /// line, the tensor and the element.
    #[arg(long)]
    check_finite: bool,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

#[derive(Args)]
struct GemmArgs {
    #[arg(long)]
    m: usize,
    #[arg(long)]
    n: usize,
    #[arg(long)]
    k: usize,
    /// Input dtype.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: GemmDtypeArg,
    /// Systolic-array dataflow (devices with a `[systolic]` section, e.g. systolic-128):
    /// os (output stationary), ws (weight stationary) or is (input stationary). Adds the
    /// array's `compute_cycles` as SCALE-Sim counts them beside the total with memory.
    #[arg(long, default_value = "os", value_parser = parse_dataflow)]
    dataflow: accel_sim::systolic::Dataflow,
    /// Tile shape BMxBNxBK, or `auto` to pick the fastest fitting tile by a cost-only sweep.
    #[arg(long, default_value = "auto")]
    tile: String,
    /// Implementation.
    #[arg(long, value_enum, default_value = "persistent")]
    variant: VariantArg,
    /// Sweep every tile shape (cost-only) and print the ranking instead of one run.
    #[arg(long)]
    sweep: bool,
    #[command(flatten)]
    common: CommonArgs,
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, so a closed pipe (`day0 ... | head`) makes `println!` panic; a command
    // line tool should end quietly there instead, as the default action does.
    #[cfg(unix)]
    // SAFETY: called once at start-up, before any other thread exists; SIG_DFL is a valid action.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Run(args) => deploy_cmd::run(args),
        Command::Models { json } => deploy_cmd::models(json),
        Command::Clusters { json } => deploy_cmd::clusters(json),
        Command::Scale(args) => deploy_cmd::scale(args),
        Command::Suite { device, json } => run_suite(&device, json),
        Command::Devices => {
            for name in accel_sim::DevicePreset::builtin_names() {
                let p = accel_sim::DevicePreset::load(name).map_err(|e| e.to_string())?;
                println!("{:<14} {}", p.name, p.description);
            }
            Ok(())
        }
        Command::Coverage { config, json } => coverage(&config, json),
        Command::Vision(args) => vision_cmd::vision_cmd(args),
        Command::Calibrate { json, fit, write } => calibrate(json, fit, write),
        Command::Forward(args) => model_cmd::forward(args),
        Command::Validate(args) => model_cmd::validate_cmd(args),
        Command::Cards(args) => model_cmd::cards_cmd(args),
        Command::Tune(args) => tune_cmd::tune_cmd(args),
        Command::Kernels { json } => tune_cmd::kernels_cmd(json),
        Command::Compare(args) => tune_cmd::compare_cmd(args),
        Command::Profile(args) => tune_cmd::profile_cmd(args),
        Command::Kernel(KernelCommand::Gemm(args)) => kernel_gemm(args),
        Command::Kernel(KernelCommand::ExpertFfn(args)) => kernel_expert_ffn(args),
        Command::Kernel(KernelCommand::Attention(args)) => kernel_attention(args),
        Command::Kernel(KernelCommand::LinearAttention(args)) => kernel_linear_attention(args),
    }
}

fn run_suite(device: &str, json: bool) -> Result<(), String> {
    let launcher = Launcher::for_device(device).map_err(|e| e.to_string())?;
    let mut reports = Vec::new();
    let mut failed = 0;
    if !json {
        println!(
            "day0 kernel suite on {} — {}",
            launcher.preset.name, launcher.preset.description
        );
    }
    for entry in day0::suite::entries() {
        match (entry.run)(&launcher) {
            Ok(r) => {
                if !json {
                    println!("{:<34} {}", entry.name, r.summary_line());
                }
                // A number over its tolerance fails the run, as a launch error does.
                match r.max_rel_error {
                    Some(err) if err <= entry.tolerance => {}
                    other => {
                        failed += 1;
                        eprintln!(
                            "{:<34} FAILED: max rel err {other:?} against the tolerance {:.0e}",
                            entry.name, entry.tolerance
                        );
                    }
                }
                reports.push(r);
            }
            Err(e) => {
                failed += 1;
                eprintln!("{:<34} FAILED: {e}", entry.name);
            }
        }
    }
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).map_err(|e| e.to_string())?
        );
    }
    if failed > 0 {
        return Err(format!("{failed} suite entries failed"));
    }
    Ok(())
}

fn launcher_for(c: &CommonArgs) -> Result<Launcher, String> {
    let mut l = Launcher::for_device(&c.device).map_err(|e| e.to_string())?;
    if c.cost_only {
        l = l.with_backend(Backend::CostOnly);
    }
    if let Some(t) = c.threads {
        l = l.with_threads(t);
    }
    Ok(l.with_trace(c.trace.is_some())
        .with_check_finite(c.check_finite))
}

/// Parses `BMxBNxBK`.
fn parse_tile(s: &str) -> Result<Config, String> {
    let parts: Vec<&str> = s.split(['x', 'X']).collect();
    let nums: Result<Vec<i64>, _> = parts.iter().map(|p| p.trim().parse::<i64>()).collect();
    match nums {
        Ok(v) if v.len() == 3 => Ok(Config::new()
            .with("BM", v[0])
            .with("BN", v[1])
            .with("BK", v[2])),
        _ => Err(format!(
            "--tile `{s}`: expected BMxBNxBK (e.g. 128x128x64) or `auto`"
        )),
    }
}

fn kernel_gemm(args: GemmArgs) -> Result<(), String> {
    if args.m == 0 || args.n == 0 || args.k == 0 {
        return Err(format!(
            "--m, --n and --k must be positive (got {}x{}x{})",
            args.m, args.n, args.k
        ));
    }
    let c = &args.common;
    if !c.cost_only {
        // A, B and C as f32 values, the f64 reference's copies of all three, and slack.
        let (m, n, k) = (args.m as u128, args.n as u128, args.k as u128);
        day0::host_memory::check(
            day0::host_memory::functional_bytes(&[m * k, k * n, m * n]),
            &format!("a functional {}x{}x{} GEMM", args.m, args.n, args.k),
            "add --cost-only (cycles without numbers), or smaller --m/--n/--k",
        )?;
    }
    let launcher = launcher_for(c)?;
    let variant = match args.variant {
        VariantArg::Db => GemmVariant::DoubleBuffered,
        VariantArg::Naive => GemmVariant::Naive,
        VariantArg::Pipelined => GemmVariant::Pipelined,
        VariantArg::Persistent => GemmVariant::Persistent,
    };
    let dtype = match args.dtype {
        GemmDtypeArg::Bf16 => GemmDtype::Bf16,
        GemmDtypeArg::F32 => GemmDtype::F32,
        GemmDtypeArg::Fp8 => return kernel_gemm_fp8(&args, &launcher),
    };
    let systolic = systolic_json(&launcher.preset, &args, dtype)?;
    let case = |config: Config| GemmCase {
        m: args.m,
        n: args.n,
        k: args.k,
        dtype,
        variant,
        config,
        seed: c.seed,
    };
    if args.sweep || args.tile == "auto" {
        let cost = launcher
            .clone()
            .with_backend(Backend::CostOnly)
            .with_trace(false);
        let points = tune::sweep(variant.meta().space(), |cfg| {
            Ok(run_gemm(&cost, &case(cfg.clone()))?.launch.report)
        });
        if args.sweep {
            print_sweep(&points, c.json)?;
            return Ok(());
        }
        let best = tune::best(&points).ok_or("no tile shape fits this device")?;
        let run = run_gemm(&launcher, &case(best.config.clone())).map_err(|e| e.to_string())?;
        return print_gemm(&run, c, systolic, tolerance(dtype));
    }
    let config = parse_tile(&args.tile)?;
    let run = run_gemm(&launcher, &case(config)).map_err(|e| e.to_string())?;
    print_gemm(&run, c, systolic, tolerance(dtype))
}

fn parse_dataflow(s: &str) -> Result<accel_sim::systolic::Dataflow, String> {
    s.parse()
}

/// On a device with a systolic array: the dataflow timing (SCALE-Sim's compute cycles and
/// day0's total with memory) as JSON fields to add to the report. `None` elsewhere.
fn systolic_json(
    preset: &accel_sim::DevicePreset,
    args: &GemmArgs,
    dtype: GemmDtype,
) -> Result<Option<serde_json::Value>, String> {
    if preset.systolic.is_none() {
        return Ok(None);
    }
    let bytes = match dtype {
        GemmDtype::Bf16 => 2,
        GemmDtype::F32 => 4,
    };
    let start = std::time::Instant::now();
    let t = accel_sim::systolic::gemm_timing(
        preset,
        args.m as u64,
        args.n as u64,
        args.k as u64,
        bytes,
        args.dataflow,
    )
    .map_err(|e| e.to_string())?;
    let wall = start.elapsed().as_secs_f64();
    let mut v = serde_json::to_value(&t).map_err(|e| e.to_string())?;
    v["model_wall_s"] = wall.into();
    Ok(Some(v))
}

/// `day0 kernel gemm --dtype fp8`: the block-scaled FP8 GEMM ([`kernels::gemm_fp8`]).
fn kernel_gemm_fp8(args: &GemmArgs, launcher: &Launcher) -> Result<(), String> {
    use kernels::gemm_fp8::{gemm_fp8, run_gemm_fp8, Fp8GemmCase};
    let c = &args.common;
    let case = |config: Config| Fp8GemmCase {
        m: args.m,
        n: args.n,
        k: args.k,
        config,
        seed: c.seed,
    };
    let config = if args.sweep || args.tile == "auto" {
        let cost = launcher
            .clone()
            .with_backend(Backend::CostOnly)
            .with_trace(false);
        let points = tune::sweep(gemm_fp8::META.space(), |cfg| {
            Ok(run_gemm_fp8(&cost, &case(cfg.clone()))?.launch.report)
        });
        if args.sweep {
            return print_sweep(&points, c.json);
        }
        tune::best(&points)
            .ok_or("no tile shape fits this device")?
            .config
            .clone()
    } else {
        parse_tile(&args.tile)?
    };
    let run = run_gemm_fp8(launcher, &case(config)).map_err(|e| e.to_string())?;
    // The output is bf16: the kernel must match the dequantized product to bf16 precision.
    print_gemm(&run, c, None, 1e-2)
}

/// Prints a GEMM run (table or JSON, with the systolic fields when given), writes its trace,
/// and checks its error against `tol`.
fn print_gemm(
    run: &kernels::gemm::GemmRun,
    c: &CommonArgs,
    systolic: Option<serde_json::Value>,
    tol: f64,
) -> Result<(), String> {
    let report = &run.launch.report;
    if c.json {
        let mut v = serde_json::to_value(report).map_err(|e| e.to_string())?;
        if let Some(s) = systolic {
            // SCALE-Sim's figure at the top level, the rest of the dataflow model beside it.
            v["compute_cycles"] = s["compute_cycles"].clone();
            v["total_cycles_with_memory"] = s["total_cycles"].clone();
            v["dataflow"] = s["dataflow"].clone();
            v["systolic"] = s;
        }
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report.table());
        if let Some(s) = systolic {
            println!(
                "systolic {}x{} {}: compute {} cycles (SCALE-Sim), with memory {} cycles \
                 ({} folds of {} cycles, mapping efficiency {:.1}%)",
                s["rows"],
                s["cols"],
                s["dataflow"].as_str().unwrap_or("?"),
                s["compute_cycles"],
                s["total_cycles"],
                s["row_folds"].as_u64().unwrap_or(0) * s["col_folds"].as_u64().unwrap_or(0),
                s["cycles_per_fold"],
                100.0 * s["mapping_efficiency"].as_f64().unwrap_or(0.0)
            );
        }
    }
    if let (Some(path), Some(trace)) = (&c.trace, &run.launch.trace) {
        std::fs::write(path, trace.to_json())
            .map_err(|e| format!("cannot write trace {path}: {e}"))?;
        if !c.json {
            println!("trace written to {path} (open in https://ui.perfetto.dev)");
        }
    }
    check_reference(report.max_rel_error, tol)
}

/// `day0 calibrate`: the table of predictions against published measurements.
fn calibrate(json: bool, fit: bool, write: bool) -> Result<(), String> {
    use std::collections::BTreeMap;
    let with = if fit {
        let f = day0::calibrate::fit()?;
        if write {
            for (device, e) in &f {
                let path = day0::calibrate::preset_path(device);
                day0::calibrate::write_factors(&path, e)?;
                eprintln!(
                    "wrote {} (matrix {:.3}, hbm {:.3}); rebuild to use it",
                    path.display(),
                    e.matrix,
                    e.hbm
                );
            }
        }
        f
    } else {
        BTreeMap::new()
    };
    let table = day0::calibrate::table(&with)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&table).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", table.markdown());
    }
    Ok(())
}

fn print_sweep(points: &[tune::SweepPoint], json: bool) -> Result<(), String> {
    if json {
        let rows: Vec<serde_json::Value> = points
            .iter()
            .map(|p| match &p.outcome {
                Ok(r) => serde_json::json!({"config": p.config.0, "fits": true, "cycles": r.cycles, "roofline_cycles": r.roofline_cycles,
                    "bound": r.bound, "sram_peak_bytes": r.sram_peak_bytes, "exposed_dma_cycles": r.exposed_dma_cycles,
                    "engine_utilization": r.engine_utilization}),
                Err(e) => serde_json::json!({"config": p.config.0, "fits": false, "error": e.to_string()}),
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "{:<24} {:>12} {:>9} {:>10} {:>8} {:>8} {:>12}  verdict",
        "tile", "cycles", "roofline", "SRAM peak", "matrix", "dma_in", "exposed DMA"
    );
    for p in points {
        match &p.outcome {
            Ok(r) => println!(
                "{:<24} {:>12} {:>8.1}% {:>10} {:>7.1}% {:>7.1}% {:>12}  {} bound",
                p.config.to_string(),
                r.cycles,
                100.0 * r.roofline_fraction,
                r.sram_peak_bytes,
                100.0 * r.engine_utilization["matrix"],
                100.0 * r.engine_utilization["dma_in"],
                r.exposed_dma_cycles,
                r.bound
            ),
            Err(e) => println!(
                "{:<24} {:>12}  does not fit: {e}",
                p.config.to_string(),
                "-"
            ),
        }
    }
    Ok(())
}

/// `--trace` on a command that runs several launches (or chains them into one report) has no one
/// timeline to write: refuse it rather than drop it.
fn refuse_trace(c: &CommonArgs, what: &str) -> Result<(), String> {
    match &c.trace {
        Some(path) => Err(format!(
            "--trace {path}: `{what}` runs several launches and writes no trace; trace one launch with `kernel gemm` or `kernel attention --kind prefill`"
        )),
        None => Ok(()),
    }
}

fn kernel_expert_ffn(args: ExpertFfnArgs) -> Result<(), String> {
    use kernels::moe::expert_gemm::{run_expert_ffn, ExpertFfnCase, WeightPath};
    let c = &args.common;
    refuse_trace(c, "kernel expert-ffn")?;
    if !c.cost_only {
        // Every expert's three projections (dequantised for the reference), the tokens, and the
        // intermediate activations of each routed token.
        let (e, t, h, i) = (
            args.experts as u128,
            args.tokens as u128,
            args.hidden as u128,
            args.inter as u128,
        );
        day0::host_memory::check(
            day0::host_memory::functional_bytes(&[
                e.saturating_mul(3).saturating_mul(h).saturating_mul(i),
                2 * t * h,
                3 * t * i,
            ]),
            &format!(
                "a functional expert FFN ({} experts, {} tokens, hidden {}, intermediate {})",
                args.experts, args.tokens, args.hidden, args.inter
            ),
            "add --cost-only (cycles without numbers), or fewer --experts/--tokens or smaller \
             --hidden/--inter",
        )?;
    }
    let launcher = launcher_for(c)?;
    let mut paths = Vec::new();
    if args.weights.is_none() || args.weights == Some(WeightsArg::Mxfp4) {
        if args.mode != Some(ModeArg::Offline) {
            paths.push(("mxfp4", "online", WeightPath::Mxfp4Online));
        }
        if args.mode != Some(ModeArg::Online) {
            paths.push(("mxfp4", "offline", WeightPath::Mxfp4Offline));
        }
    }
    if args.weights.is_none() || args.weights == Some(WeightsArg::Fp8) {
        paths.push(("fp8", "online", WeightPath::Fp8Block));
    }
    if args.weights.is_none() || args.weights == Some(WeightsArg::Bf16) {
        paths.push(("bf16", "-", WeightPath::Bf16));
    }
    let mut rows = Vec::new();
    for (weights, mode, path) in paths {
        let case = ExpertFfnCase {
            experts: args.experts,
            tokens: args.tokens,
            hidden: args.hidden,
            inter: args.inter,
            path,
            config: Config::new(),
            seed: c.seed,
        };
        let run = run_expert_ffn(&launcher, &case).map_err(|e| e.to_string())?;
        // The FFN rounds its activation to bf16 between the projections (see kernels/tests/moe.rs).
        check_reference(run.report.max_rel_error, 1e-3)
            .map_err(|e| format!("{weights}/{mode}: {e}"))?;
        rows.push((weights, mode, run));
    }
    if c.json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(w, m, r)| {
                let mut v = serde_json::to_value(&r.report).expect("report serialises");
                v["weights"] = (*w).into();
                v["mode"] = (*m).into();
                v["peak_device_bytes"] = r.peak_device_bytes.into();
                v["weight_bytes"] = r.weight_bytes.into();
                v
            })
            .collect();
        // Always an array, one object per weight path, however many `--weights`/`--mode` keep:
        // one stable shape for scripts.
        println!(
            "{}",
            serde_json::to_string_pretty(&list).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "expert FFN: {} experts x {} tokens, hidden {}, inter {} on {}{}",
        args.experts,
        args.tokens,
        args.hidden,
        args.inter,
        launcher.preset.name,
        if c.cost_only { " (cost-only)" } else { "" }
    );
    println!(
        "{:<7} {:<8} {:>12} {:>10} {:>14} {:>14} {:>16} {:>8} {:>10}",
        "weights",
        "mode",
        "cycles",
        "time us",
        "HBM read B",
        "weight B",
        "peak device B",
        "bound",
        "max err"
    );
    for (w, m, r) in &rows {
        println!(
            "{:<7} {:<8} {:>12} {:>10.2} {:>14} {:>14} {:>16} {:>8} {:>10}",
            w,
            m,
            r.report.cycles,
            r.report.time_us,
            r.report.hbm_read_bytes,
            r.weight_bytes,
            r.peak_device_bytes,
            r.report.bound,
            r.report
                .max_rel_error
                .map_or("-".to_string(), |e| format!("{e:.1e}"))
        );
    }
    Ok(())
}

fn kernel_attention(args: AttentionArgs) -> Result<(), String> {
    use kernels::attention::decode::{run_decode, DecodeCase};
    use kernels::attention::prefill::{run_prefill, PrefillCase};
    use kernels::attention::sparse::{
        run_dsa_decode, run_dsa_decode_batch_fp8, run_dsa_prefill, run_dsa_prefill_fp8, DsaCase,
    };
    let c = &args.common;
    let dtype = match args.dtype {
        DtypeArg::Bf16 => GemmDtype::Bf16,
        DtypeArg::F32 => GemmDtype::F32,
    };
    let ctx = args.ctx.unwrap_or(args.seq);
    let tol = tolerance(dtype);
    if args.kind != AttentionKind::Prefill {
        refuse_trace(c, "kernel attention (other kinds than prefill)")?;
    }
    if !c.cost_only {
        // Queries and outputs per query token, keys and values (or MLA latents, indexer keys)
        // per context token, and one head's f64 score matrix in the reference.
        let (s, x) = (args.seq as u128, ctx as u128);
        let heads = args.heads as u128;
        let (mla, dsa) = match args.kind {
            AttentionKind::Prefill | AttentionKind::Decode => (false, false),
            AttentionKind::MlaDecode => (true, false),
            AttentionKind::DsaDecode | AttentionKind::DsaPrefill => (true, true),
        };
        // MLA caches one latent row per token (kv heads 1, values inside the keys).
        let (kvh, hd, vhd) = if mla {
            (1, (args.kv_lora + args.rope_dim) as u128, 0)
        } else {
            (
                args.kv_heads.unwrap_or(args.heads) as u128,
                args.head_dim as u128,
                args.v_head_dim.unwrap_or(args.head_dim) as u128,
            )
        };
        let (ih, id) = if dsa {
            (args.index_heads as u128, args.index_dim as u128)
        } else {
            (0, 0)
        };
        day0::host_memory::check(
            day0::host_memory::functional_bytes(&[
                s * heads * (hd + vhd.max(args.kv_lora as u128)),
                x.saturating_mul(kvh * (hd + vhd) + id),
                s * ih * id,
                s.saturating_mul(x) / 2,
            ]),
            &format!(
                "a functional attention of {} queries over {ctx} tokens ({} heads)",
                args.seq, args.heads
            ),
            "add --cost-only (cycles without numbers), or a shorter --seq/--ctx or fewer \
             --heads",
        )?;
    }
    match args.kind {
        AttentionKind::Prefill => {}
        AttentionKind::Decode | AttentionKind::MlaDecode => {
            let launcher = launcher_for(c)?;
            let mla = args.kind == AttentionKind::MlaDecode;
            // An unquantised cache shares the queries' dtype; FP8 keeps the queries in --dtype.
            let (dtype, fp8_kv) = match args.kv_dtype {
                Some(KvDtypeArg::Fp8) => (dtype, true),
                Some(KvDtypeArg::Bf16) => (GemmDtype::Bf16, false),
                Some(KvDtypeArg::F32) => (GemmDtype::F32, false),
                None => (dtype, false),
            };
            let case = DecodeCase {
                heads: args.heads,
                kv_heads: if mla {
                    1
                } else {
                    args.kv_heads.unwrap_or(args.heads)
                },
                head_dim: if mla {
                    args.kv_lora + args.rope_dim
                } else {
                    args.head_dim
                },
                v_head_dim: if mla { args.kv_lora } else { args.head_dim },
                shared_kv: mla,
                ctx,
                page_size: args.page_size,
                splits: args.splits,
                dtype,
                fp8_kv,
                seed: c.seed,
            };
            let run = run_decode(&launcher, &case).map_err(|e| e.to_string())?;
            if c.json {
                let mut v = serde_json::to_value(&run.report).map_err(|e| e.to_string())?;
                v["kv_cache_bytes"] = run.kv_cache_bytes.into();
                v["kv_cache_bytes_bf16"] = run.kv_cache_bytes_bf16.into();
                v["fp8_kv"] = fp8_kv.into();
                v["dequantized_error"] = run.dequantized_error.into();
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
                );
            } else {
                print!("{}", run.report.table());
                println!(
                    "kv cache: {} B for {ctx} tokens ({:.2}x of bf16, {} B saved)",
                    run.kv_cache_bytes,
                    run.kv_cache_bytes as f64 / run.kv_cache_bytes_bf16 as f64,
                    run.kv_cache_bytes_bf16 as i64 - run.kv_cache_bytes as i64
                );
            }
            if fp8_kv {
                // The kernel must be exact on the dequantised cache; the FP8 cost is reported.
                // JSON output stays one document: the figures are in it already.
                if let (Some(err), false) = (run.dequantized_error, c.json) {
                    println!(
                        "fp8 kv: max_rel_error vs the unquantised cache {}, kernel vs the \
                         dequantised cache {err:.1e}",
                        run.report
                            .max_rel_error
                            .map_or("-".to_string(), |e| format!("{e:.2e}"))
                    );
                }
                return check_reference(run.dequantized_error, tol);
            }
            return check_reference(run.report.max_rel_error, tolerance(dtype));
        }
        AttentionKind::DsaDecode | AttentionKind::DsaPrefill => {
            let launcher = launcher_for(c)?;
            let prefill = args.kind == AttentionKind::DsaPrefill;
            let case = DsaCase {
                seq: args.seq,
                heads: args.heads,
                ctx,
                topk: args.topk,
                index_heads: args.index_heads,
                index_dim: args.index_dim,
                head_dim: args.kv_lora + args.rope_dim,
                v_head_dim: args.kv_lora,
                page_size: args.page_size,
                seed: c.seed,
            };
            // FP8 pools (indexer keys and latent, one scale per token): the prefill kernels, or
            // for a decode the batched kernels the model's decode steps run.
            let fp8 = args.kv_dtype == Some(KvDtypeArg::Fp8);
            let run = match (prefill, fp8) {
                (true, false) => run_dsa_prefill(&launcher, &case).map(DsaSummary::of),
                (false, false) => run_dsa_decode(&launcher, &case).map(DsaSummary::of),
                (true, true) => run_dsa_prefill_fp8(&launcher, &case).map(DsaSummary::of),
                (false, true) => {
                    run_dsa_decode_batch_fp8(&launcher, &case, &[ctx]).map(DsaSummary::of_batch)
                }
            }
            .map_err(|e| e.to_string())?;
            if c.json {
                let v = serde_json::json!({"total": run.total, "indexer": run.indexer, "topk": run.topk, "attention": run.attention, "fp8_kv": fp8, "quantized_error": run.quantized_error});
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
                );
            } else {
                for (name, r) in [
                    ("indexer", &run.indexer),
                    ("top-k", &run.topk),
                    ("sparse attention", &run.attention),
                ] {
                    println!("{name:<17} {}", r.summary_line());
                }
                print!("{}", run.total.table());
            }
            if run.selection_matches == Some(false) {
                return Err(
                    "top-k selection differs from the reference selection of the same scores"
                        .into(),
                );
            }
            return check_reference(run.total.max_rel_error, 1e-5);
        }
    }
    let launcher = launcher_for(c)?;
    let case = PrefillCase {
        window: 0,
        sinks: false,
        heads: args.heads,
        kv_heads: args.kv_heads.unwrap_or(args.heads),
        head_dim: args.head_dim,
        v_head_dim: args.v_head_dim.unwrap_or(args.head_dim),
        sq: args.seq,
        skv: args.ctx.unwrap_or(args.seq),
        dtype: match args.dtype {
            DtypeArg::Bf16 => GemmDtype::Bf16,
            DtypeArg::F32 => GemmDtype::F32,
        },
        config: Config::new(),
        seed: c.seed,
    };
    let run = run_prefill(&launcher, &case).map_err(|e| e.to_string())?;
    let report = &run.launch.report;
    if c.json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report.table());
    }
    if let (Some(path), Some(trace)) = (&c.trace, &run.launch.trace) {
        std::fs::write(path, trace.to_json())
            .map_err(|e| format!("cannot write trace {path}: {e}"))?;
    }
    check_reference(report.max_rel_error, tolerance(case.dtype))
}

fn coverage(path: &str, json: bool) -> Result<(), String> {
    let cov = model::coverage::inventory(std::path::Path::new(path)).map_err(|e| e.to_string())?;
    if json {
        println!("{}", cov.to_json_string());
    } else {
        print!("{}", cov.table());
    }
    if cov.is_complete() {
        Ok(())
    } else {
        Err(format!(
            "{} operator(s) missing: {}",
            cov.missing().len(),
            cov.missing().join(", ")
        ))
    }
}

fn kernel_linear_attention(args: LinearAttentionArgs) -> Result<(), String> {
    use kernels::linear_attention::reference::Decay;
    use kernels::linear_attention::runner::{chunk_sweep, run_delta, DeltaCase, DeltaMode};
    let c = &args.common;
    refuse_trace(c, "kernel linear-attention")?;
    if !c.cost_only {
        // q, k (heads·dk per token), v and o (value heads·dv), per-channel gates, and the state
        // in and out.
        let (t, h, dk, dv) = (
            args.seq as u128,
            args.heads as u128,
            args.dk as u128,
            args.dv as u128,
        );
        let vh = args.v_heads.unwrap_or(args.heads) as u128;
        day0::host_memory::check(
            day0::host_memory::functional_bytes(&[
                2 * t * h * dk,
                2 * t * vh * dv,
                t * vh * dk,
                2 * vh * dk * dv,
            ]),
            &format!(
                "a functional linear attention of {} tokens ({} heads, dk {}, dv {})",
                args.seq, args.heads, args.dk, args.dv
            ),
            "add --cost-only (cycles without numbers), or a shorter --seq or fewer --heads",
        )?;
    }
    let launcher = launcher_for(c)?;
    let dtype = match args.dtype {
        DtypeArg::Bf16 => GemmDtype::Bf16,
        DtypeArg::F32 => GemmDtype::F32,
    };
    let tol = tolerance(dtype);
    let mut case = DeltaCase {
        decay: if args.kind == LinearKind::Gdn {
            Decay::Scalar
        } else {
            Decay::PerChannel
        },
        mode: if args.mode == LinearMode::Chunk {
            DeltaMode::Chunked
        } else {
            DeltaMode::Recurrent
        },
        seq: args.seq,
        k_heads: args.heads,
        v_heads: args.v_heads.unwrap_or(args.heads),
        dk: args.dk,
        dv: args.dv,
        dtype,
        config: Config::new(),
        seed: c.seed,
    };
    if args.mode == LinearMode::Chunk && args.chunk.is_none() {
        let points = chunk_sweep(&launcher, &case);
        if c.json {
            let rows: Vec<serde_json::Value> = points
                .iter()
                .map(|p| match &p.result {
                    Ok(r) => serde_json::json!({"chunk": p.chunk, "report": r.launch.report}),
                    Err(e) => serde_json::json!({"chunk": p.chunk, "error": e.to_string()}),
                })
                .collect();
            println!(
                "{}",
                serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
            );
        } else {
            println!(
                "chunk-size sweep ({} tokens, {} v-heads, dk {} dv {}):",
                case.seq, case.v_heads, case.dk, case.dv
            );
            for p in &points {
                match &p.result {
                    Ok(r) => println!("  C={:<4} {}", p.chunk, r.launch.report.summary_line()),
                    Err(e) => println!("  C={:<4} does not run: {e}", p.chunk),
                }
            }
        }
        for p in &points {
            if let Ok(r) = &p.result {
                check_reference(r.launch.report.max_rel_error, tol)
                    .map_err(|e| format!("C={}: {e}", p.chunk))?;
            }
        }
        return Ok(());
    }
    if let Some(ch) = args.chunk {
        case.config = Config::new().with("C", ch as i64);
    }
    let run = run_delta(&launcher, &case).map_err(|e| e.to_string())?;
    let report = &run.launch.report;
    if c.json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).map_err(|e| e.to_string())?
        );
    } else {
        print!("{}", report.table());
    }
    check_reference(report.max_rel_error, tol)
}

/// The check every functional run must pass: relative error to the f64 reference (inputs rounded
/// to the dtype) within the kernel family's stated tolerance — bf16: 1e-2, f32: 1e-5.
fn tolerance(dtype: GemmDtype) -> f64 {
    if dtype == GemmDtype::Bf16 {
        1e-2
    } else {
        1e-5
    }
}

/// Fails (non-zero exit) when a run's error exceeds `tol`; NaN never passes.
fn check_reference(err: Option<f64>, tol: f64) -> Result<(), String> {
    match err {
        Some(e) if e.is_nan() || e > tol => Err(format!(
            "result does not match the f64 reference: max relative error {e:.3e} > {tol:.0e}"
        )),
        _ => Ok(()),
    }
}

/// The parts of a DSA run (`day0 kernel attention --kind dsa-decode|dsa-prefill`) the command
/// prints, from a one-sequence or a batched run.
struct DsaSummary {
    total: dsl_core::Report,
    indexer: dsl_core::Report,
    topk: dsl_core::Report,
    attention: dsl_core::Report,
    selection_matches: Option<bool>,
    quantized_error: Option<f64>,
}

impl DsaSummary {
    fn of(r: kernels::attention::sparse::DsaRun) -> DsaSummary {
        DsaSummary {
            total: r.total,
            indexer: r.indexer,
            topk: r.topk,
            attention: r.attention,
            selection_matches: r.selection_matches,
            quantized_error: r.quantized_error,
        }
    }

    fn of_batch(r: kernels::attention::sparse::DsaBatchRun) -> DsaSummary {
        DsaSummary {
            total: r.total,
            indexer: r.indexer,
            topk: r.topk,
            attention: r.attention,
            selection_matches: r.selection_matches,
            quantized_error: r.quantized_error,
        }
    }
}
