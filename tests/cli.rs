//! The `day0` command as a user runs it.

use std::process::Command;

fn day0(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_day0"))
        .args(args)
        .env("XDG_CACHE_HOME", empty_cache())
        .output()
        .expect("day0 runs")
}

/// An empty cache directory, so no run sees a tuning file `day0 tune --model` left in the user's.
fn empty_cache() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-empty-cache")
}

/// `day0 args…`, which must succeed, and its JSON output.
fn day0_json(args: &[&str]) -> serde_json::Value {
    let out = day0(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[test]
fn gemm_json_has_the_stable_fields() {
    let out = day0(&[
        "kernel", "gemm", "--m", "256", "--n", "192", "--k", "160", "--device", "npu-910b",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for f in [
        "cycles",
        "time_us",
        "flop",
        "hbm_bytes",
        "achieved_tflops",
        "peak_tflops",
        "bound",
        "roofline_cycles",
        "engine_utilization",
        "sram_peak_bytes",
        "max_rel_error",
        "lines",
    ] {
        assert!(v.get(f).is_some(), "missing field {f}");
    }
    assert!(v["cycles"].as_u64().unwrap() >= v["roofline_cycles"].as_u64().unwrap());
    assert!(v["max_rel_error"].as_f64().unwrap() <= 1e-5);
    assert!(v["lines"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["code"].as_str().unwrap().contains("mma")));
}

#[test]
fn sram_overflow_exits_nonzero_with_the_error_not_a_panic() {
    let out = day0(&[
        "kernel",
        "gemm",
        "--m",
        "1024",
        "--n",
        "1024",
        "--k",
        "1024",
        "--device",
        "npu-910b",
        "--tile",
        "512x512x512",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SRAM overflow") && err.contains("524288") && err.contains("line"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for args in [
        vec!["kernel", "gemm", "--m", "0", "--n", "4", "--k", "4"],
        vec![
            "kernel", "gemm", "--m", "4", "--n", "4", "--k", "4", "--tile", "12x",
        ],
        vec![
            "kernel", "gemm", "--m", "4", "--n", "4", "--k", "4", "--device", "tpu-v9",
        ],
        vec![
            "kernel",
            "gemm",
            "--m",
            "4",
            "--n",
            "4",
            "--k",
            "4",
            "--device",
            "/nonexistent.toml",
        ],
    ] {
        let out = day0(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.starts_with("error:") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn trace_file_is_chrome_trace_json() {
    let path = std::env::temp_dir().join(format!("day0-test-{}.trace.json", std::process::id()));
    let p = path.to_str().unwrap();
    let out = day0(&[
        "kernel", "gemm", "--m", "128", "--n", "128", "--k", "128", "--tile", "64x64x64",
        "--trace", p,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["ph"] == "X" && e["name"] == "mma"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["args"]["name"] == "dma_in"));
    let _ = std::fs::remove_file(path);
}

fn tiny(name: &str) -> String {
    format!("{}/model/testdata/tiny/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `day0 forward` writes the prompt logits as a safetensors file that matches transformers' (the
/// golden file) within 1e-4, and reports the greedy continuation and simulated cycles.
#[test]
fn forward_writes_logits_matching_transformers() {
    let dir = tiny("deepseek_v3");
    let golden =
        model::weights::read_all_f32(std::path::Path::new(&format!("{dir}/golden.safetensors")))
            .unwrap();
    let get = |n: &str| golden.iter().find(|(k, _, _)| k == n).unwrap().clone();
    let ids: Vec<String> = get("input_ids")
        .2
        .iter()
        .map(|v| (*v as i64).to_string())
        .collect();
    let out_file =
        std::env::temp_dir().join(format!("day0-logits-{}.safetensors", std::process::id()));
    let v = day0_json(&[
        "forward",
        "--model-dir",
        &dir,
        "--tokens",
        &ids.join(","),
        "--generate",
        "4",
        "--logits-out",
        out_file.to_str().unwrap(),
        "--json",
    ]);
    let want_tokens: Vec<i64> = get("generated")
        .2
        .iter()
        .take(4)
        .map(|v| *v as i64)
        .collect();
    assert_eq!(generated(&v), want_tokens);
    assert!(v["prefill_cycles"].as_u64().unwrap() > 0);
    let (_, want_shape, want) = get("logits");
    logits_file_matches(&out_file, &want_shape, &want);
}

/// The `generated` token ids of `day0 forward --json`.
fn generated(v: &serde_json::Value) -> Vec<i64> {
    v["generated"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect()
}

/// The `--logits-out` file (removed after reading) holds one `logits` tensor of `shape` within
/// 1e-4 of `want` (transformers').
fn logits_file_matches(path: &std::path::Path, shape: &[usize], want: &[f32]) {
    let written = model::weights::read_all_f32(path).unwrap();
    std::fs::remove_file(path).ok();
    assert_eq!(written.len(), 1);
    let (name, got_shape, logits) = &written[0];
    assert_eq!((name.as_str(), got_shape.as_slice()), ("logits", shape));
    let want64: Vec<f64> = want.iter().map(|x| *x as f64).collect();
    let err = kernels::reference::rel_error(logits, &want64);
    assert!(err <= 1e-4, "logits differ from transformers by {err:.3e}");
}

/// `day0 forward --image` on the tiny Qwen3-VL-MoE checkpoint: the two test images processed as
/// its preprocessor config says, one placeholder per image in `--tokens`, give transformers'
/// prompt logits and 16 greedy tokens (`golden_image.safetensors`); `day0 validate` on that
/// reference lists the vision encoder's outputs; a bad image or a placeholder count that does
/// not match is an error naming what to fix.
#[test]
fn forward_with_images_matches_transformers() {
    let dir = tiny("qwen3_vl_moe");
    let images = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("model/testdata/vision/qwen3_vl_moe_tiny")
        .display()
        .to_string();
    let (a, b) = (
        format!("{images}/image_a.png"),
        format!("{images}/image_b.png"),
    );
    let golden = std::path::Path::new(&dir).join("golden_image.safetensors");
    let golden_tensors = model::weights::read_all_f32(&golden).unwrap();
    let get = |n: &str| -> Vec<i64> {
        let t = golden_tensors.iter().find(|(k, _, _)| k == n).unwrap();
        t.2.iter().map(|v| *v as i64).collect()
    };
    let prompt: Vec<String> = get("prompt_tokens").iter().map(i64::to_string).collect();
    let out_file = std::env::temp_dir().join(format!(
        "day0-image-logits-{}.safetensors",
        std::process::id()
    ));
    let v = day0_json(&[
        "forward",
        "--model-dir",
        &dir,
        "--image",
        &a,
        "--image",
        &b,
        "--tokens",
        &prompt.join(","),
        "--generate",
        "16",
        "--logits-out",
        out_file.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(generated(&v), get("generated"));
    assert_eq!(v["tokens"].as_u64(), Some(get("input_ids").len() as u64));
    assert_eq!(
        v["image_grids"],
        serde_json::json!([[1, 10, 14], [1, 8, 12]])
    );
    assert!(v["vision_us"].as_f64().unwrap() > 0.0);
    // 15 decode steps × 2 GQA layers, each on the implementation that priced faster.
    let picks = v["implementations"]["attention_decode_batch"]
        .as_object()
        .unwrap();
    assert_eq!(picks.values().map(|n| n.as_u64().unwrap()).sum::<u64>(), 30);
    let (_, shape, want) = golden_tensors
        .iter()
        .find(|(k, _, _)| k == "logits")
        .unwrap();
    logits_file_matches(&out_file, shape, want);

    let ok = day0(&[
        "validate",
        "--model-dir",
        &dir,
        "--reference",
        golden.to_str().unwrap(),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let table = String::from_utf8_lossy(&ok.stdout);
    for row in [
        "vision.hidden_states.2",
        "vision.tokens",
        "vision.deepstack.1",
        "layer 1",
        "logits",
    ] {
        assert!(table.contains(row), "{row} missing from\n{table}");
    }

    // One image for two placeholders; a file that is not an image.
    let bad = day0(&[
        "forward",
        "--model-dir",
        &dir,
        "--image",
        &a,
        "--tokens",
        &prompt.join(","),
    ]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("than the 1 image(s) given"),
        "{err}"
    );
    // Image tokens without --image.
    let bad = day0(&["forward", "--model-dir", &dir, "--tokens", "1,251,2"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("no --image"), "{err}");
    let cfg = format!("{dir}/config.json");
    let bad = day0(&[
        "forward",
        "--model-dir",
        &dir,
        "--image",
        &cfg,
        "--tokens",
        "1,251,2",
    ]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("config.json"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// `day0 validate` passes on a model's own reference activations and fails (non-zero exit,
/// naming the first diverging tensor) on another model's.
#[test]
fn validate_flags_a_mismatched_reference() {
    let dir = tiny("qwen3_next");
    let ok = day0(&[
        "validate",
        "--model-dir",
        &dir,
        "--reference",
        &format!("{dir}/golden.safetensors"),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let table = String::from_utf8_lossy(&ok.stdout);
    assert!(table.contains("layer 3") && table.contains("logits") && table.contains("tail"));

    let bad = day0(&[
        "validate",
        "--model-dir",
        &dir,
        "--reference",
        &format!("{}/golden.safetensors", tiny("deepseek_v3")),
    ]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("diverges from the reference"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A checkpoint directory without weights, or with a malformed config, is an error naming the
/// file, not a panic.
#[test]
fn forward_on_a_broken_checkpoint_is_an_error() {
    let tmp = std::env::temp_dir().join(format!("day0-broken-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(
        format!("{}/config.json", tiny("deepseek_v3")),
        tmp.join("config.json"),
    )
    .unwrap();
    let out = day0(&[
        "forward",
        "--model-dir",
        tmp.to_str().unwrap(),
        "--tokens",
        "1,2",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("safetensors"), "{err}");
    std::fs::write(
        tmp.join("config.json"),
        "{ \"model_type\": \"deepseek_v3\", ",
    )
    .unwrap();
    let out = day0(&[
        "forward",
        "--model-dir",
        tmp.to_str().unwrap(),
        "--tokens",
        "1,2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    std::fs::remove_dir_all(&tmp).ok();
    assert!(!out.status.success());
    assert!(
        err.contains("config.json") && !err.contains("panicked"),
        "{err}"
    );
}

/// `forward --config --cost-only` from config.json alone: the JSON fields, and bad workloads as
/// errors naming the flag (never a panic).
#[test]
fn cost_only_forward_from_a_config() {
    let cfg = format!("{}/config.json", tiny("kimi_linear"));
    let out = forward_cost_only_json(&cfg, 70, 3);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "ttft_us",
        "tpot_us",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
    ] {
        assert!(j[k].as_f64().is_some_and(|v| v > 0.0), "{k}: {j}");
    }
    assert!(j["prefill_ops"]["kda.delta_chunked"]["launches"].as_u64() == Some(3));
    let bad: [(&[&str], &str); 4] = [
        (&["--config", &cfg], "--cost-only"),
        (
            &["--config", &cfg, "--cost-only", "--prompt-len", "0"],
            "--prompt-len",
        ),
        (
            &["--config", &cfg, "--cost-only", "--output-len", "0"],
            "--output-len",
        ),
        (
            &["--config", &cfg, "--cost-only", "--prompt-len", "256"],
            "max_position_embeddings",
        ),
    ];
    for (args, needle) in bad {
        let mut a = vec!["forward"];
        a.extend_from_slice(args);
        let out = day0(&a);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(!out.status.success(), "{args:?}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// `day0 args` exits non-zero with an error naming `flag`, not a panic.
fn fails_naming(args: &[&str], flag: &str) {
    let out = day0(args);
    let err = stderr(&out);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        err.contains(flag) && !err.contains("panicked"),
        "{args:?}: {err}"
    );
}

#[test]
fn models_and_clusters_list_the_presets() {
    let out = day0(&["models", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = v.as_array().expect("a list");
    let k2 = rows
        .iter()
        .find(|r| r["name"] == "kimi-k2")
        .expect("kimi-k2");
    let total = k2["total_params"].as_u64().unwrap() as f64;
    assert!((total / 1.03e12 - 1.0).abs() < 0.01, "{total}");
    // Beside what the model card publishes (Kimi-K2's "1T total, 32B active").
    assert_eq!(k2["published_total_params"].as_f64(), Some(1e12));
    assert_eq!(k2["published_active_params"].as_f64(), Some(32e9));
    assert!(rows.iter().any(|r| r["name"] == "hybrid-3t"));
    let out = day0(&["clusters", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for name in ["h200-node", "h800", "npu-910b"] {
        assert!(
            v.as_array().unwrap().iter().any(|r| r["name"] == name),
            "{name}"
        );
    }
}

/// `day0 run` of DeepSeek-V3 on 32 h800 cards with a fixed plan, a small prompt and batch 64
/// (a fraction of a second).
#[rustfmt::skip]
const SMALL_PLANNED_RUN: &[&str] = &[
    "run", "--model", "deepseek-v3", "--cluster", "h800", "--cards", "32",
    "--plan", "tp=8,dp=4,ep=32", "--prompt-len", "256", "--output-len", "32",
    "--batch", "64", "--no-check",
];

/// A model whose every layer is windowed (Mistral-7B-v0.1's style, here on Mixtral's sizes) has no
/// per-token KV cache: the report says so (JSON `null`), never an internal "unbounded" number.
#[test]
fn a_fully_windowed_model_reports_no_per_token_kv_capacity() {
    let mut cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("model/testdata/mixtral_8x22b_config.json"),
        )
        .unwrap(),
    )
    .unwrap();
    cfg["sliding_window"] = serde_json::json!(4096);
    let path = std::env::temp_dir().join(format!("day0-windowed-{}.json", std::process::id()));
    std::fs::write(&path, cfg.to_string()).unwrap();
    let model = path.to_str().unwrap();
    let args = [
        "run",
        "--model",
        model,
        "--cards",
        "8",
        "--plan",
        "tp=8",
        "--prompt-len",
        "256",
        "--output-len",
        "16",
        "--batch",
        "8",
        "--no-check",
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let v = day0_json(&json_args);
    assert!(
        v["memory"]["kv_tokens_capacity"].is_null(),
        "{}",
        v["memory"]
    );
    let out = day0(&args);
    std::fs::remove_file(&path).ok();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("no per-token KV cache") && !text.contains(&u64::MAX.to_string()),
        "{text}"
    );
}

/// A fixed plan on a small prompt: the report's fields, the decode step at least as long as its
/// HBM bytes allow, memory per card.
#[test]
fn run_with_a_plan_reports_prefill_decode_and_memory() {
    let plots = tempfile::tempdir().expect("a temporary directory");
    let plot_dir = plots.path().join("charts");
    let mut args = SMALL_PLANNED_RUN.to_vec();
    args.extend(["--plot", plot_dir.to_str().unwrap(), "--json"]);
    let out = day0(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for f in [
        "ttft_ms",
        "tokens_per_s",
        "tokens_per_s_per_card",
        "mfu",
        "comm_exposed_share",
        "breakdown",
    ] {
        assert!(!v["prefill"][f].is_null(), "prefill.{f}");
    }
    for f in [
        "tpot_ms",
        "tokens_per_s",
        "batch_per_card",
        "hbm_utilization",
        "comm_exposed_share",
    ] {
        assert!(!v["decode"][f].is_null(), "decode.{f}");
    }
    for f in [
        "weights_gb",
        "kv_gb",
        "activations_gb",
        "workspace_gb",
        "reserve_gb",
        "capacity_gb",
        "kv_tokens_capacity",
    ] {
        assert!(!v["memory"][f].is_null(), "memory.{f}");
    }
    assert_eq!(v["decode"]["plan"], "tp=8,dp=4,pp=1,ep=32");
    assert_eq!(v["decode"]["batch_per_replica"], 16);
    // The cache the memory plan sized is the one the simulated steps read: no caveat.
    assert_eq!(v["kv_cache"]["planned_dtype"], "bf16");
    assert_eq!(v["kv_cache"]["simulated_dtype"], "bf16");
    let svg =
        std::fs::read_to_string(plot_dir.join("breakdown.svg")).expect("--plot wrote the chart");
    assert!(svg.starts_with("<svg") && svg.contains("decode tp=8,dp=4,pp=1,ep=32"));
    let util = v["decode"]["hbm_utilization"].as_f64().unwrap();
    assert!(util > 0.0 && util <= 1.0, "{util}");
}

/// Prefill and decode deployed disaggregated on different card counts (DeepSeek serves prefill
/// on 4 nodes and decode on 18): each phase's plan brings its own cards, the cluster grows to the
/// larger, and a phase's card flag that contradicts its plan is an error naming the plan.
#[test]
fn prefill_and_decode_deploy_on_their_own_card_counts() {
    #[rustfmt::skip]
    let v = day0_json(&[
        "run", "--model", "deepseek-v3", "--cluster", "h800",
        "--prefill-plan", "tp=1,dp=32,pp=1,ep=32", "--decode-plan", "tp=1,dp=64,pp=1,ep=64",
        "--prompt-len", "256", "--output-len", "32", "--batch", "128", "--no-check", "--json",
    ]);
    assert_eq!(v["prefill"]["cards"], 32);
    assert_eq!(v["decode"]["cards"], 64);
    assert_eq!(
        (v["prefill_cards"].clone(), v["decode_cards"].clone()),
        (32.into(), 64.into())
    );
    assert_eq!(v["decode"]["batch_per_card"], 2.0);
    #[rustfmt::skip]
    let cases: [(&[&str], &str); 2] = [
        (&["run", "--model", "deepseek-v3", "--prefill-cards", "0", "--no-check"], "--prefill-cards"),
        (
            &["run", "--model", "deepseek-v3", "--decode-cards", "16",
              "--decode-plan", "tp=1,dp=32,ep=32", "--no-check"],
            "--decode-plan",
        ),
    ];
    for (args, flag) in cases {
        fails_naming(args, flag);
    }
}

/// `--kv-dtype fp8` sizes the memory plan at one byte per cached value (plus a scale per token
/// and cached row), and the simulated steps read every pool in FP8: the MLA latent
/// (DeepSeek-V3), the sparse latent and indexer keys (DeepSeek-V3.2), GQA keys and values
/// (Qwen3-Next's full-attention layers). The report says so and each decode step changes.
#[test]
fn an_fp8_kv_plan_is_simulated_in_fp8_for_every_pool_kind() {
    let run = |model: &str, kv: &str| {
        let mut args = SMALL_PLANNED_RUN.to_vec();
        args[2] = model;
        args.extend(["--kv-dtype", kv, "--json"]);
        let out = day0(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let (bf16, fp8) = (run("deepseek-v3", "bf16"), run("deepseek-v3", "fp8"));
    assert_eq!(bf16["kv_cache"]["simulated_dtype"], "bf16");
    assert_eq!(fp8["kv_cache"]["planned_dtype"], "fp8");
    assert_eq!(fp8["kv_cache"]["simulated_dtype"], "fp8");
    // The plan holds about twice the tokens, and the simulated step reads the FP8 cache.
    let tokens = |v: &serde_json::Value| v["memory"]["kv_tokens_capacity"].as_f64().unwrap();
    assert!(
        tokens(&fp8) > 1.9 * tokens(&bf16),
        "{} vs {}",
        tokens(&fp8),
        tokens(&bf16)
    );
    assert_ne!(fp8["decode"]["tpot_ms"], bf16["decode"]["tpot_ms"]);
    let v32 = run("deepseek-v3.2", "fp8");
    assert_eq!(v32["kv_cache"]["simulated_dtype"], "fp8");
    let v32_bf16 = run("deepseek-v3.2", "bf16");
    assert_ne!(v32["decode"]["tpot_ms"], v32_bf16["decode"]["tpot_ms"]);
    let qwen = run("qwen3-next-80b", "fp8");
    assert_eq!(qwen["kv_cache"]["simulated_dtype"], "fp8");
    let qwen_bf16 = run("qwen3-next-80b", "bf16");
    let tpot = |v: &serde_json::Value| v["decode"]["tpot_ms"].as_f64().expect("tpot_ms");
    assert!(
        tpot(&qwen) < tpot(&qwen_bf16),
        "qwen3-next fp8 {} vs bf16 {} ms per token",
        qwen["decode"]["tpot_ms"],
        qwen_bf16["decode"]["tpot_ms"]
    );
}

#[test]
fn impossible_deployments_and_bad_plans_name_the_problem() {
    // 2.9T parameters do not fit 8 cards: the memory plan's error, not a panic.
    let out = day0(&["run", "--model", "hybrid-3t", "--cards", "8", "--no-check"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("weights need") && !err.contains("panicked"),
        "{err}"
    );
    // ... and it names a deployment that fits (the lower bound alone, 24 cards' worth, does not).
    assert!(
        err.contains("the fewest cards that fit: 32 (tp=1,dp=16,pp=2,ep=16)"),
        "{err}"
    );
    // A given plan that does not fit names one of the same cards that does.
    let out = day0(&[
        "run",
        "--model",
        "kimi-k2",
        "--cards",
        "16",
        "--plan",
        "tp=8,dp=2,pp=1,ep=2",
        "--no-check",
    ]);
    let err = stderr(&out);
    assert!(
        !out.status.success() && err.contains("on these 16 cards tp=4,dp=1,pp=4,ep=4 fits"),
        "{err}"
    );
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "run",
                "--model",
                "kimi-k2",
                "--cards",
                "24",
                "--plan",
                "tp=3",
                "--no-check",
            ],
            "tp",
        ),
        (
            &[
                "run",
                "--model",
                "deepseek-v3",
                "--cards",
                "512",
                "--plan",
                "tp=1,ep=512",
                "--no-check",
            ],
            "ep",
        ),
        (
            &[
                "run",
                "--model",
                "deepseek-v3",
                "--cluster",
                "h800",
                "--cards",
                "16",
                "--plan",
                "tp=8,dp=4",
                "--no-check",
            ],
            "--plan",
        ),
        (
            &[
                "run",
                "--model",
                "deepseek-v3",
                "--routing",
                "zipf",
                "--no-check",
            ],
            "--routing",
        ),
        (
            &["run", "--model", "no-such-model", "--no-check"],
            "--model",
        ),
    ];
    for (args, flag) in cases {
        fails_naming(args, flag);
    }
}

/// Issue #13's workload flags: one batched decode step from config.json alone, memory-bound, at
/// least its HBM bytes over the peak bandwidth and within 2× of that.
#[test]
fn cost_only_decode_step_of_a_batch_is_memory_bound() {
    let out = day0(&[
        "forward",
        "--config",
        "model/testdata/kimi_k2_config.json",
        "--cost-only",
        "--batch",
        "64",
        "--context",
        "4096",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let tpot = v["tpot_ms"].as_f64().unwrap();
    let floor = v["hbm_floor_ms"].as_f64().unwrap();
    assert!(
        tpot >= floor && tpot <= 2.0 * floor,
        "TPOT {tpot} ms vs HBM floor {floor} ms"
    );
    // The operators: each one's launches, cycles and share, also by layer kind. Kimi-K2 has one
    // dense layer and 60 MoE layers; the shares add up to the whole step.
    let ops = v["ops"].as_object().expect("ops");
    assert_eq!(ops["moe.experts.gate_up_proj"]["launches"], 60.0);
    let share: f64 = ops.values().map(|o| o["share"].as_f64().unwrap()).sum();
    assert!((share - 1.0).abs() < 1e-9, "{share}");
    let kinds = v["ops_by_layer_kind"]
        .as_object()
        .expect("ops_by_layer_kind");
    for k in ["mla+dense", "mla+moe", "head"] {
        assert!(kinds.contains_key(k), "{k} missing: {:?}", kinds.keys());
    }
    let cycles = |m: &serde_json::Map<String, serde_json::Value>| -> f64 {
        m.values().map(|o| o["cycles"].as_f64().unwrap()).sum()
    };
    assert!((cycles(ops) - cycles(kinds)).abs() <= 1e-6 * cycles(ops));
    for (args, flag) in [
        (vec!["--batch", "0"], "--batch"),
        (vec!["--batch", "4", "--context", "100000000"], "--context"),
        (vec!["--batch", "4", "--routing", "hot"], "--routing"),
    ] {
        let mut a = vec![
            "forward",
            "--config",
            "model/testdata/kimi_k2_config.json",
            "--cost-only",
        ];
        a.extend(args.iter());
        let out = day0(&a);
        let err = stderr(&out);
        assert!(
            !out.status.success() && err.contains(flag) && !err.contains("panicked"),
            "{err}"
        );
    }
}

/// `--precision`: native reads Kimi-K2's FP8 weights (about a quarter of the f32 bytes) and is
/// the cost-only default; an unknown precision is an error naming the accepted values.
#[test]
fn precision_changes_the_bytes_a_decode_step_reads() {
    let step = |extra: &[&str]| {
        let mut args = vec![
            "forward",
            "--config",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/model/testdata/kimi_k2_config.json"
            ),
            "--cost-only",
            "--batch",
            "2",
            "--context",
            "256",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = day0(&args);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v["hbm_bytes"].as_f64().unwrap()
    };
    let (default, native, f32) = (
        step(&[]),
        step(&["--precision", "native"]),
        step(&["--precision", "f32"]),
    );
    assert_eq!(default, native);
    assert!(
        f32 > 3.0 * native && f32 < 4.5 * native,
        "f32 {f32} vs native {native}"
    );
    let out = day0(&[
        "forward",
        "--config",
        "x.json",
        "--cost-only",
        "--precision",
        "fp4",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("`f32` or `native`"),
        "{}",
        stderr(&out)
    );
}

/// `--record-routing` on a numeric run, then `--routing replay:FILE` on a cost-only run of the
/// same config: the replay takes the recorded lengths and prices each decode step at exactly the
/// functional run's cycles (the prefill differs only in the head: the functional run computes
/// every prompt row's logits). Bad workloads name their flag.
#[test]
fn a_recorded_routing_replays_in_a_cost_only_run() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/model/testdata/tiny/deepseek_v3"
    );
    let rec = std::env::temp_dir().join(format!("day0-cli-routing-{}.json", std::process::id()));
    let rec_s = rec.to_str().unwrap();
    let out = day0(&[
        "forward",
        "--model-dir",
        dir,
        "--tokens",
        "5,17,99,3,41,7,7,120",
        "--generate",
        "3",
        "--record-routing",
        rec_s,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let f: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let replay = format!("replay:{rec_s}");
    let out = day0(&[
        "forward",
        "--model-dir",
        dir,
        "--cost-only",
        "--precision",
        "f32",
        "--routing",
        &replay,
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(c["prompt_len"], 8);
    assert_eq!(c["output_len"], 3);
    assert_eq!(c["decode_cycles"], f["decode_cycles"]);
    let load = &c["prefill_expert_load"];
    assert!(
        load["max_tokens_per_expert"].as_u64().unwrap() as f64
            >= load["mean_tokens_per_expert"].as_f64().unwrap()
    );
    for (args, flag) in [
        (
            vec!["--routing", &replay, "--prompt-len", "9"],
            "--routing replay:FILE",
        ),
        (vec!["--routing", "zipf:-2"], "--routing"),
        (
            vec!["--routing", &replay, "--batch", "4"],
            "--routing replay:FILE",
        ),
        (vec!["--batch", "0"], "--batch"),
        (vec!["--record-routing", rec_s], "--record-routing"),
    ] {
        let mut a = vec!["forward", "--model-dir", dir, "--cost-only"];
        a.extend(args.iter());
        let out = day0(&a);
        assert!(!out.status.success(), "{args:?}");
        let err = stderr(&out);
        assert!(
            err.contains(flag) && !err.contains("cannot be used multiple times"),
            "{args:?}: {err}"
        );
    }
    let _ = std::fs::remove_file(&rec);
}

/// The cost-only forward's JSON carries the fields issue #13 item 3 names, in both workloads (one
/// sequence's prefill and decode; one batched decode step), and peak memory counts the weights.
#[test]
fn cost_only_forward_json_has_the_workload_fields() {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/model/testdata/deepseek_v32_config.json"
    );
    let out = day0(&[
        "forward",
        "--config",
        config,
        "--cost-only",
        "--prompt-len",
        "64",
        "--output-len",
        "3",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for f in [
        "ttft_us",
        "tpot_us",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "hbm_bytes",
        "peak_device_bytes",
        "prefill_ops",
        "decode_ops",
        "prefill_expert_load",
        "launch_memo",
    ] {
        assert!(!v[f].is_null(), "missing {f}: {v}");
    }
    // 671B parameters at about a byte each (FP8) are most of the peak.
    let peak = v["peak_device_bytes"].as_f64().unwrap();
    assert!(peak > 6.5e11 && peak < 8e11, "{peak}");
    assert!(v["launch_memo"]["hits"].as_u64().unwrap() > 0);
    let out = day0(&[
        "forward",
        "--config",
        config,
        "--cost-only",
        "--batch",
        "4",
        "--context",
        "512",
        "--prompt-len",
        "64",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(b["peak_device_bytes"].as_f64().unwrap() > b["memory"]["weights"].as_f64().unwrap());
    for f in [
        "ttft_us",
        "tpot_us",
        "prefill_tokens_per_s",
        "decode_tokens_per_s",
        "hbm_bytes",
    ] {
        assert!(
            b[f].as_f64().is_some_and(|x| x > 0.0),
            "batch JSON {f}: {b}"
        );
    }
    // The one-request prefill prices what the single-sequence run prices (the last row's logits
    // included), so the two agree closely.
    let ratio = b["ttft_us"].as_f64().unwrap() / v["ttft_us"].as_f64().unwrap();
    assert!(
        (ratio - 1.0).abs() < 0.05,
        "batch TTFT / single TTFT = {ratio}"
    );
}

/// `kernel expert-ffn --json` has one shape whatever the weight paths: an array of reports, one
/// per path.
#[test]
fn expert_ffn_json_is_always_an_array() {
    let run = |extra: &[&str]| {
        let mut a = vec![
            "kernel",
            "expert-ffn",
            "--experts",
            "4",
            "--tokens",
            "8",
            "--hidden",
            "256",
            "--inter",
            "128",
            "--cost-only",
            "--json",
        ];
        a.extend_from_slice(extra);
        let out = day0(&a);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v.as_array().expect("an array").len()
    };
    assert_eq!(run(&["--weights", "bf16"]), 1);
    assert!(run(&[]) > 1);
}

/// `--trace` is written by the commands that run one launch and refused by the others, never
/// silently dropped.
#[test]
fn trace_is_written_or_refused() {
    let path = std::env::temp_dir().join(format!("day0-trace-{}.json", std::process::id()));
    let p = path.to_str().unwrap();
    let out = day0(&[
        "kernel", "gemm", "--m", "64", "--n", "64", "--k", "64", "--trace", p,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(std::fs::metadata(&path).is_ok_and(|m| m.len() > 0));
    let _ = std::fs::remove_file(&path);
    for args in [
        vec![
            "kernel",
            "linear-attention",
            "--kind",
            "gdn",
            "--seq",
            "64",
            "--cost-only",
        ],
        vec![
            "kernel",
            "expert-ffn",
            "--experts",
            "2",
            "--tokens",
            "4",
            "--hidden",
            "64",
            "--inter",
            "64",
        ],
        vec![
            "kernel",
            "attention",
            "--kind",
            "decode",
            "--seq",
            "1",
            "--ctx",
            "64",
        ],
    ] {
        let mut a = args.clone();
        a.extend(["--trace", p]);
        let out = day0(&a);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            stderr(&out).contains("--trace"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert!(std::fs::metadata(&path).is_err(), "{args:?} wrote a trace");
    }
}

/// A functional run whose values would not fit in host memory is refused up front, naming
/// `--cost-only`; the same shape cost-only runs. (`DAY0_HOST_MEMORY_BYTES` stands in for a small
/// machine.)
#[test]
fn functional_runs_beyond_host_memory_are_refused_up_front() {
    let small = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_day0"))
            .args(args)
            .env("DAY0_HOST_MEMORY_BYTES", "100000")
            .env("XDG_CACHE_HOME", empty_cache())
            .output()
            .expect("day0 runs")
    };
    let gemm = ["kernel", "gemm", "--m", "512", "--n", "512", "--k", "512"];
    let out = small(&gemm);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("host memory") && err.contains("--cost-only"),
        "{err}"
    );
    let out = small(&[&gemm[..], &["--cost-only"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every kernel command that runs numbers checks too.
    for cmd in [
        &[
            "kernel",
            "attention",
            "--kind",
            "prefill",
            "--seq",
            "512",
            "--heads",
            "8",
        ][..],
        &[
            "kernel",
            "attention",
            "--kind",
            "mla-decode",
            "--seq",
            "1",
            "--heads",
            "16",
            "--ctx",
            "4096",
        ],
        &[
            "kernel",
            "linear-attention",
            "--kind",
            "gdn",
            "--seq",
            "1024",
            "--heads",
            "4",
        ],
        &[
            "kernel",
            "expert-ffn",
            "--experts",
            "8",
            "--tokens",
            "64",
            "--hidden",
            "256",
            "--inter",
            "128",
        ],
    ] {
        let out = small(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(
            err.contains("host memory") && err.contains("--cost-only"),
            "{cmd:?}: {err}"
        );
        let out = small(&[cmd, &["--cost-only"]].concat());
        assert!(
            out.status.success(),
            "{cmd:?} --cost-only: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/model/testdata/tiny/deepseek_v3"
    );
    let out = small(&["forward", "--model-dir", dir, "--tokens", "1,2,3"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("host memory") && err.contains("--cost-only"),
        "{err}"
    );
}

#[test]
fn cards_splits_a_checkpoint_and_matches_one_card() {
    let dir = tiny("deepseek_v3");
    let out = day0(&[
        "cards",
        "--model-dir",
        &dir,
        "--plan",
        "tp=2,dp=2,ep=2",
        "--steps",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["pass"], true);
    let cards = v["cards"].as_array().unwrap();
    assert_eq!(cards.len(), 4);
    for c in cards {
        assert_eq!(c["tokens_match"], true, "{c}");
        assert!(c["max_rel_diff"].as_f64().unwrap() <= 1e-4, "{c}");
        assert!(
            c["comm_us"]["attention.all_reduce"].as_f64().unwrap() > 0.0,
            "{c}"
        );
        assert!(
            c["comm_us"]["moe.ep_dispatch"].as_f64().unwrap() > 0.0,
            "{c}"
        );
    }
    // A plan the model cannot split names the flag and exits non-zero.
    let out = day0(&["cards", "--model-dir", &dir, "--plan", "tp=3"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--plan tp"), "{err}");
}

/// `DAY0_LAUNCH_LOG=1` prints one line per simulated launch (where a command's host time goes),
/// and nothing without it.
#[test]
fn the_launch_log_names_each_simulated_launch() {
    let args = [
        "kernel", "gemm", "--m", "256", "--n", "192", "--k", "160", "--device", "npu-910b",
    ];
    let run = |log: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_day0"))
            .args(args)
            .env("DAY0_LAUNCH_LOG", log)
            .env("XDG_CACHE_HOME", empty_cache())
            .output()
            .expect("day0 runs");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let on = run("1");
    let line = on
        .lines()
        .find(|l| l.starts_with("day0 launch: gemm"))
        .unwrap_or_else(|| panic!("no launch line in {on}"));
    for part in ["grid [", "programs timed", "cycles", "s host"] {
        assert!(line.contains(part), "`{part}` missing from {line}");
    }
    // The checked run itself is functional (tile searches before it run cost-only).
    assert!(on
        .lines()
        .any(|l| l.starts_with("day0 launch: gemm") && l.contains(" functional:")));
    assert!(!run("0").contains("day0 launch:"));
}

/// `day0 vision`: the vision encoder of the Qwen3-VL-235B configuration, cost-only, for a
/// 1024×1024 image (4,096 patches, 1,024 language tokens), with its operators in the JSON; bad
/// image sizes are errors naming the flag and the limit.
#[test]
fn vision_costs_the_encoder_of_a_multimodal_config() {
    let config = "model/testdata/qwen3_vl_235b_a22b_config.json";
    let out = day0(&[
        "vision",
        "--config",
        config,
        "--image-size",
        "1024x1024",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["patches"], 4096);
    assert_eq!(v["tokens"], 1024);
    assert!(v["vision_us"].as_f64().unwrap() > 0.0);
    let ops: Vec<&str> = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["op"].as_str().unwrap())
        .collect();
    for op in [
        "vision.patch_embed",
        "vision.attention",
        "vision.rope",
        "vision.merger.fc2",
    ] {
        assert!(ops.contains(&op), "{op} missing from {ops:?}");
    }
    for (size, says) in [
        ("0x640", "no pixels"),
        ("10x4000", "aspect ratio"),
        ("1024", "WIDTHxHEIGHT"),
    ] {
        let out = day0(&["vision", "--config", config, "--image-size", size]);
        assert!(!out.status.success(), "{size} accepted");
        let e = stderr(&out);
        assert!(
            e.contains("--image-size") && e.contains(says),
            "{size}: {e}"
        );
        assert!(!e.contains("panicked"), "{e}");
    }
    // Image files go through the checkpoint's processor: the tiny encoder's 56x40 test image is
    // 14x10 patches of 4 pixels.
    let tiny = "model/testdata/vision/qwen3_vl_moe_tiny";
    let image = format!("{tiny}/image_a.png");
    let out = day0(&["vision", "--config", tiny, "--image", &image, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["grids"][0], serde_json::json!([1, 10, 14]));
    let bad = format!("{tiny}/config.json");
    let out = day0(&["vision", "--config", tiny, "--image", &bad]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("config.json"), "{}", stderr(&out));
    let out = day0(&["vision", "--config", "model/testdata/kimi_k2_config.json"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("vision_config"), "{}", stderr(&out));
}

/// The cost-only forward of the Qwen3-VL-235B configuration with a 1024×1024 image: TTFT is the
/// vision encoder plus the language prefill (whose prompt includes the image's 1,024 tokens), both
/// reported, and the prefill's operator breakdown lists the vision kernels.
#[test]
fn cost_only_forward_with_an_image_reports_the_vision_encoder_apart() {
    let config = "model/testdata/qwen3_vl_235b_a22b_config.json";
    let args = [
        "forward",
        "--config",
        config,
        "--cost-only",
        "--prompt-len",
        "64",
        "--output-len",
        "2",
        "--image-size",
        "1024x1024",
        "--json",
    ];
    let out = day0(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (ttft, vision, language) = (
        v["ttft_us"].as_f64().unwrap(),
        v["vision_us"].as_f64().unwrap(),
        v["language_prefill_us"].as_f64().unwrap(),
    );
    assert!(vision > 0.0 && language > 0.0);
    assert!(
        (ttft - vision - language).abs() <= 1e-6 * ttft,
        "{ttft} != {vision} + {language}"
    );
    assert_eq!(v["image_tokens"], 1024);
    assert_eq!(v["prompt_len"], 64 + 1024);
    for op in [
        "vision.attention",
        "vision.patch_embed",
        "vision.merger.fc2",
    ] {
        assert!(v["prefill_ops"][op]["cycles"].as_u64().unwrap() > 0, "{op}");
    }
    assert!(
        v["prefill_ops_by_layer_kind"]["vision"]["cycles"]
            .as_u64()
            .unwrap()
            > 0
    );
    // Without an image the vision fields are null; a text-only config refuses --image-size.
    let out = day0(&[
        "forward",
        "--config",
        config,
        "--cost-only",
        "--prompt-len",
        "64",
        "--output-len",
        "1",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["vision_us"].is_null());
    let out = day0(&[
        "forward",
        "--config",
        "model/testdata/kimi_k2_config.json",
        "--cost-only",
        "--prompt-len",
        "8",
        "--output-len",
        "1",
        "--image-size",
        "64x64",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("vision_config"), "{}", stderr(&out));
}

/// A release that reuses an architecture under a new `model_type` runs on release day: `day0
/// coverage` reads DeepSeek-V3.2's file renamed `glm_moe_dsa` as `deepseek_v32` (every operator
/// covered, the guess first among the warnings), `forward` and `run` say it too, and a file is
/// still refused when nothing in it names an architecture.
#[test]
fn an_unknown_model_type_is_read_as_its_architecture_and_said_so() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/model/testdata/deepseek_v32_config.json"
    ))
    .expect("testdata");
    let renamed = text.replacen("\"deepseek_v32\"", "\"glm_moe_dsa\"", 1);
    assert_ne!(renamed, text);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("config.json");
    std::fs::write(&path, renamed).unwrap();
    let v = day0_json(&["coverage", "--config", path.to_str().unwrap(), "--json"]);
    assert_eq!(v["missing"].as_array().map(Vec::len), Some(0), "{v}");
    let first = v["warnings"][0].as_str().unwrap_or_default();
    assert!(
        first.contains("glm_moe_dsa") && first.contains("read as `deepseek_v32`"),
        "{v}"
    );
    // The forward says it on stderr (its JSON unchanged), the pipeline in its report.
    let tiny = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/model/testdata/tiny/deepseek_v32/config.json"
    ))
    .expect("testdata");
    let tiny_path = dir.path().join("tiny.json");
    std::fs::write(
        &tiny_path,
        tiny.replacen("\"deepseek_v32\"", "\"glm_moe_dsa\"", 1),
    )
    .unwrap();
    let tiny_path = tiny_path.to_str().unwrap();
    let out = forward_cost_only_json(tiny_path, 16, 2);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("read as `deepseek_v32`"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert!(v["ttft_us"].as_f64().is_some_and(|t| t > 0.0), "{v}");
    let v = day0_json(&[
        "run",
        "--model",
        tiny_path,
        "--no-check",
        "--json",
        "--prompt-len",
        "64",
        "--output-len",
        "4",
    ]);
    let shown = v["config_warnings"][0].as_str().unwrap_or_default();
    assert!(shown.contains("read as `deepseek_v32`"), "{v}");
    // So does the scaling sweep, on stderr beside its JSON.
    let out = day0(&[
        "scale",
        "--model",
        tiny_path,
        "--cards",
        "1,2",
        "--prompt-len",
        "64",
        "--output-len",
        "4",
        "--json",
    ]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("read as `deepseek_v32`"), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(v.as_array().map(Vec::len), Some(2), "{v}");
    std::fs::write(&path, r#"{"model_type": "glm_moe_dsa", "hidden_size": 8}"#).unwrap();
    let out = day0(&["coverage", "--config", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("glm_moe_dsa") && err.contains("name no known architecture"),
        "{err}"
    );
}

/// `day0 forward --config CFG --cost-only --prompt-len P --output-len O --json`, which must
/// succeed (its output, stderr included).
fn forward_cost_only_json(cfg: &str, prompt: usize, output: usize) -> std::process::Output {
    let (p, o) = (prompt.to_string(), output.to_string());
    let out = day0(&[
        "forward",
        "--config",
        cfg,
        "--cost-only",
        "--prompt-len",
        &p,
        "--output-len",
        &o,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}
