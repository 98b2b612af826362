//! `day0 tune` and `day0 kernels` as a user runs them: every test with its own empty cache
//! directory (`XDG_CACHE_HOME`), so runs do not see each other's results or the user's.

use std::process::{Command, Output};

fn day0(cache: &std::path::Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_day0"))
        .args(args)
        .env("XDG_CACHE_HOME", cache)
        .output()
        .expect("day0 runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON on stdout")
}

/// A GEMM shape whose sweep takes a few seconds, large enough that 512-wide tiles overflow SRAM.
const GEMM: [&str; 7] = [
    "tune",
    "gemm",
    "--shape",
    "1024x1024x1024",
    "--device",
    "npu-910b",
    "--json",
];

#[test]
fn gemm_tune_ranks_marks_overflows_and_serves_the_second_run_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let first = json(&day0(dir.path(), &GEMM));
    let configs = first["configs"].as_array().expect("configs is a list");
    assert!(configs.len() >= 20, "{} configs", configs.len());
    assert_eq!(first["cached"], false);
    // Best first: the runs by cycles, then everything that does not run.
    let statuses: Vec<&str> = configs
        .iter()
        .map(|c| c["status"].as_str().unwrap())
        .collect();
    let ran = statuses.iter().take_while(|s| **s == "ok").count();
    assert!(ran >= 20, "{ran} configurations ran");
    assert!(
        statuses[ran..].iter().all(|s| *s != "ok"),
        "a configuration that runs is ranked after one that does not: {statuses:?}"
    );
    assert!(
        statuses.contains(&"sram_overflow"),
        "512-wide tiles overflow 512 KiB of SRAM"
    );
    let cycles: Vec<u64> = configs[..ran]
        .iter()
        .map(|c| c["cycles"].as_u64().unwrap())
        .collect();
    assert!(cycles.windows(2).all(|w| w[0] <= w[1]), "not sorted");
    for c in &configs[..ran] {
        for f in [
            "config",
            "cycles",
            "time_us",
            "bound",
            "utilisation",
            "sram_bytes",
            "status",
        ] {
            assert!(!c[f].is_null(), "missing {f} in {c}");
        }
    }
    for c in &configs[ran..] {
        assert!(c["cycles"].is_null() && c["error"].is_string(), "{c}");
    }
    assert_eq!(first["best"], configs[0]);
    assert!(first["roofline"]["cycles"].as_u64().unwrap() > 0);
    assert!(cycles[0] >= first["roofline"]["cycles"].as_u64().unwrap());
    assert!(first["why"].as_str().unwrap().contains("wins"));
    let spots = first["spot_checks"].as_array().unwrap();
    assert!(!spots.is_empty() && spots.iter().all(|s| s["ok"] == true));
    // Several implementations were tuned: the variant is in every row.
    let impls: std::collections::BTreeSet<&str> = configs
        .iter()
        .map(|c| c["implementation"].as_str().unwrap())
        .collect();
    assert_eq!(impls.len(), 5, "{impls:?}");

    let second = json(&day0(dir.path(), &GEMM));
    assert_eq!(second["cached"], true);
    assert_eq!(second["configs"], first["configs"]);
    assert_eq!(second["cache_key"], first["cache_key"]);
}

#[test]
fn the_ranking_does_not_depend_on_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let run = |threads: &str| {
        json(&day0(
            dir.path(),
            &[
                "tune",
                "gemm_db",
                "--shape",
                "m=512,n=384,k=256",
                "--json",
                "--no-cache",
                "--threads",
                threads,
            ],
        ))
    };
    let (one, two) = (run("1"), run("2"));
    assert_eq!(one["configs"], two["configs"]);
    assert_eq!(one["why"], two["why"]);
    // --no-cache wrote nothing.
    assert!(!dir.path().join("day0").exists());
}

#[test]
fn attention_kernels_tune_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    for (kernel, shape) in [
        ("flash_prefill", "seq=256,heads=4,kv_heads=2,head_dim=128"),
        ("sparse_mla", "seq=2,ctx=1024,heads=16,topk=256"),
        ("attention_decode", "ctx=1000,heads=8,kv_heads=2,page=64"),
    ] {
        let v = json(&day0(
            dir.path(),
            &["tune", kernel, "--shape", shape, "--json"],
        ));
        let configs = v["configs"].as_array().unwrap();
        assert!(v["best"].is_object(), "{kernel}: nothing ran");
        // Tiles that do not cover the head dims are kept, marked, last.
        let last = configs.last().unwrap();
        assert_eq!(last["status"], "refused", "{kernel}");
        assert!(
            v["spot_checks"][0]["ok"] == true,
            "{kernel}: {}",
            v["spot_checks"]
        );
    }
}

#[test]
fn the_plot_is_an_svg_heat_map() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("heat.svg");
    let out = day0(
        dir.path(),
        &[
            "tune",
            "gemm_persistent",
            "--shape",
            "512x512x512",
            "--plot",
            svg.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("why:") && text.contains("spot check"),
        "{text}"
    );
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("BM=") && svg.contains("BN="));
}

#[test]
fn bad_input_is_a_clear_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    for (args, says) in [
        (
            vec!["tune", "gemmm", "--shape", "64x64x64"],
            "no tunable kernel",
        ),
        (vec!["tune", "gemm", "--shape", "64x64"], "--shape"),
        (vec!["tune", "gemm", "--shape", "0x64x64"], "--shape"),
        (
            vec!["tune", "gemm", "--shape", "m=4,n=4,q=4"],
            "unknown key `q`",
        ),
        (
            vec!["tune", "flash_prefill", "--shape", "seq=64"],
            "heads is required",
        ),
        (
            vec![
                "tune",
                "flash_prefill",
                "--shape",
                "seq=64,heads=6,kv_heads=4",
            ],
            "not a multiple",
        ),
        (
            vec!["tune", "sparse_mla", "--shape", "seq=4,ctx=2"],
            "seq = 4 > ctx = 2",
        ),
        (
            vec![
                "tune",
                "gemm",
                "--shape",
                "64x64x64",
                "--impl",
                "flash_prefill",
            ],
            "--impl flash_prefill",
        ),
        (
            vec!["tune", "gemm", "--shape", "64x64x64", "--dtype", "fp4"],
            "--dtype",
        ),
        (
            vec!["tune", "gemm", "--shape", "64x64x64", "--device", "nope"],
            "--device",
        ),
        (vec!["tune"], "--model CONFIG"),
        (vec!["tune", "gemm"], "--shape is required"),
        (vec!["tune", "--model", "nope.json"], "--model"),
        (vec!["tune", "gemm", "--model", TINY_V3], "give no kernel"),
        (vec!["tune", "--model", TINY_V3, "--batch", "0"], "--batch"),
    ] {
        let out = day0(dir.path(), &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn kernels_lists_the_registry_by_operator() {
    let dir = tempfile::tempdir().unwrap();
    let v = json(&day0(dir.path(), &["kernels", "--json"]));
    let ops = v.as_array().unwrap();
    let gemm = ops.iter().find(|o| o["op"] == "gemm").expect("gemm listed");
    let names: Vec<&str> = gemm["implementations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(
        names.len() >= 4 && names.contains(&"gemm_persistent"),
        "{names:?}"
    );
    assert!(gemm["implementations"][0]["kind"].is_string());
    let text = day0(dir.path(), &["kernels"]);
    assert!(text.status.success());
    assert!(String::from_utf8_lossy(&text.stdout).contains("sparse_mla"));
}

/// `day0 compare`: every implementation of an operator on the same inputs, each at its own best
/// tiles, with its error against the f64 reference and its cycles, fastest first.
#[test]
fn compare_runs_each_implementation_on_the_same_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let c = json(&day0(
        dir.path(),
        &["compare", "gemm", "--shape", "192x160x256", "--json"],
    ));
    assert_eq!(c["functional"], true);
    let impls = c["implementations"].as_array().expect("a list");
    let names: Vec<&str> = impls
        .iter()
        .map(|e| e["implementation"].as_str().unwrap())
        .collect();
    for want in [
        "gemm",
        "gemm_db",
        "gemm_pipelined",
        "gemm_persistent",
        "gemm_hand",
    ] {
        assert!(names.contains(&want), "{names:?}");
    }
    // The hand-tuned kernel (accel-sim's manual API) is the only one registered as such.
    for e in impls {
        let hand = e["implementation"] == "gemm_hand";
        assert_eq!(e["kind"] == "hand-tuned", hand, "{e}");
    }
    let cycles: Vec<u64> = impls
        .iter()
        .map(|e| e["cycles"].as_u64().unwrap())
        .collect();
    assert!(
        cycles.windows(2).all(|w| w[0] <= w[1]),
        "fastest first: {cycles:?}"
    );
    for e in impls {
        let err = e["max_rel_error"].as_f64().expect("a functional error");
        assert!(err > 0.0 && err <= e["tolerance"].as_f64().unwrap(), "{e}");
        assert_eq!(e["ok"], true);
        assert!(e["speedup"].as_f64().unwrap() >= 1.0);
    }
    assert_eq!(impls.last().unwrap()["speedup"].as_f64(), Some(1.0));
    // Restricted to two, and the table form.
    let out = day0(
        dir.path(),
        &[
            "compare",
            "attention_prefill",
            "--impl",
            "flash_prefill",
            "--impl",
            "flash_prefill_pipelined",
            "--shape",
            "seq=96,heads=4,kv_heads=2,head_dim=64",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("flash_prefill_pipelined") && text.contains("f64 reference"),
        "{text}"
    );
    // An unknown operator is an error naming the known ones.
    let out = day0(dir.path(), &["compare", "conv2d"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("gemm"));
}

/// `day0 compare`: each hand-tuned kernel beside its DSL prototype on the same inputs
/// (functional, both within the dtype's tolerance), and faster than it at a decode shape and at a
/// heavier shape (cost-only), each at its own best tiles: the MXFP4 expert GEMM at 16 and 512
/// tokens per expert, the paged decode at a GQA step and at MLA's absorbed shape.
#[test]
fn compare_shows_each_hand_tuned_kernel_equivalent_and_faster() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "expert_gemm_mxfp4",
            ["expert_gemm_mxfp4_hand", "expert_gemm_mxfp4"],
            1e-5,
            [
                "experts=2,tokens=24,n=160,k=320",
                "experts=8,tokens=16,n=2048,k=7168",
                "experts=4,tokens=512,n=2048,k=7168",
            ],
        ),
        (
            "attention_decode",
            ["paged_decode_hand", "paged_decode_split"],
            1e-2,
            [
                "ctx=1000,heads=12,kv_heads=3,head_dim=64,page=16,splits=3",
                "ctx=8192,heads=32,kv_heads=8",
                "ctx=4096,heads=128,kv_heads=1,head_dim=576,v_head_dim=512,splits=8",
            ],
        ),
    ];
    for (op, want, tol, shapes) in cases {
        for (i, shape) in shapes.into_iter().enumerate() {
            let functional = i == 0;
            let mut args = vec!["compare", op, "--shape", shape, "--json"];
            if !functional {
                args.push("--cost-only");
            }
            let c = json(&day0(dir.path(), &args));
            let impls = c["implementations"].as_array().expect("a list");
            let names: Vec<&str> = impls
                .iter()
                .map(|e| e["implementation"].as_str().unwrap())
                .collect();
            assert_eq!(names, want, "{op} {shape}");
            assert_eq!(impls[0]["kind"], "hand-tuned");
            assert_eq!(impls[1]["kind"], "dsl");
            assert!(
                impls[0]["cycles"].as_u64() < impls[1]["cycles"].as_u64(),
                "{op} {shape}: {impls:?}"
            );
            for e in impls {
                assert_eq!(e["ok"], true, "{e}");
                if functional {
                    assert!(e["max_rel_error"].as_f64().unwrap() <= tol, "{e}");
                }
            }
        }
    }
}

/// `day0 profile`: every cycle of the launch is charged to a source line or to `idle`, so the
/// per-line cycles add up to the kernel's total; the matrix line of a GEMM is on the matrix unit
/// and its loads wait on DMA.
#[test]
fn a_profile_charges_every_cycle_to_a_line() {
    let dir = tempfile::tempdir().unwrap();
    for (kernel, shape, config) in [
        ("gemm_db", "256x192x320", Some("BM=64,BN=64,BK=64")),
        ("gemm", "128x128x128", None),
        ("gemm_persistent", "300x200x256", None),
        (
            "flash_prefill",
            "seq=96,heads=4,kv_heads=2,head_dim=64",
            None,
        ),
        ("sparse_mla", "seq=2,ctx=512,heads=16,topk=128", None),
    ] {
        let mut args = vec!["profile", kernel, "--shape", shape, "--json"];
        if let Some(c) = config {
            args.extend(["--config", c]);
        }
        let p = json(&day0(dir.path(), &args));
        let lines = p["lines"].as_array().expect("lines");
        let charged: u64 = lines.iter().map(|l| l["cycles"].as_u64().unwrap()).sum();
        let idle = p["idle_cycles"].as_u64().unwrap();
        let total = p["cycles"].as_u64().unwrap();
        assert!(total > 0, "{kernel}");
        assert_eq!(charged + idle, total, "{kernel}: lines + idle = the launch");
        for l in lines {
            let c = l["cycles"].as_u64().unwrap();
            let split =
                l["compute_cycles"].as_u64().unwrap() + l["dma_wait_cycles"].as_u64().unwrap();
            assert_eq!(split, c, "{kernel} line {}", l["line"]);
            assert!(!l["code"].as_str().unwrap().is_empty(), "{kernel}: {l}");
        }
        let on = |engine: &str| {
            lines
                .iter()
                .filter(|l| l["engine"] == engine)
                .map(|l| l["cycles"].as_u64().unwrap())
                .sum::<u64>()
        };
        assert!(on("matrix") > 0 && on("dma_in") > 0, "{kernel}: {p}");
        if let Some(c) = config {
            let cfg = &p["config"];
            assert_eq!(cfg["BM"], 64, "{c}: the given tiles ran");
        }
    }
    // An operator with several implementations, a chained launch, a bad config: errors.
    for args in [
        &["profile", "attention_prefill", "--shape", "seq=64,heads=4"][..],
        &[
            "profile",
            "paged_decode_split",
            "--shape",
            "ctx=256,heads=4",
        ],
        &[
            "profile",
            "gemm_db",
            "--shape",
            "128x128x128",
            "--config",
            "BM",
        ],
    ] {
        let out = day0(dir.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}

/// A tiny DeepSeek-V3 (bf16 weights): its model tuning runs in well under a second.
const TINY_V3: &str = "model/testdata/tiny/deepseek_v3/config.json";

/// `day0 tune --model` at a small prefill and decode on h200, the file also written to `out`.
fn tune_model_args(out: &str) -> Vec<&str> {
    let mut args = tune_model_base();
    args.extend(["--out", out, "--json"]);
    args
}

/// `day0 tune --model` at a small prefill and decode on h200.
fn tune_model_base() -> Vec<&'static str> {
    vec![
        "tune",
        "--model",
        TINY_V3,
        "--device",
        "h200",
        "--prompt-len",
        "200",
        "--batch",
        "4",
        "--context",
        "100",
    ]
}

/// `day0 forward` cost-only at the tuned workload, with `--tuning` when given.
fn forward_tuned(cache: &std::path::Path, tuning: Option<&str>) -> serde_json::Value {
    // The tuned workload: everything after `tune --model TINY_V3`.
    let mut args = vec!["forward", "--config", TINY_V3, "--cost-only", "--json"];
    args.extend(&tune_model_base()[3..]);
    if let Some(t) = tuning {
        args.extend(["--tuning", t]);
    }
    json(&day0(cache, &args))
}

#[test]
fn model_tuning_measures_each_launch_and_forward_runs_the_tuned_tiles() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    let file = file.to_str().unwrap();
    let first = json(&day0(dir.path(), &tune_model_args(file)));
    let launches = first["launches"].as_array().expect("launches");
    assert!(launches.len() >= 10, "{} launches", launches.len());
    let mut improved = 0;
    for l in launches {
        let (c, h) = (
            l["cycles"].as_u64().unwrap(),
            l["heuristic_cycles"].as_u64().unwrap(),
        );
        assert!(c <= h, "{l}");
        assert!(l["configs_run"].as_u64().unwrap() >= 1, "{l}");
        if l["config"] != l["heuristic"] {
            improved += 1;
            assert!(c < h, "{l}");
            // A tuned launch computes the heuristic's numbers (up to summation order).
            assert!(l["spot_check_rel_diff"].as_f64().unwrap() <= 1e-4, "{l}");
        }
    }
    assert!(improved > 0, "no launch found a faster configuration");
    // The file written is the report, and a second run is served from the cache unchanged.
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert_eq!(written, first);
    let t = std::time::Instant::now();
    let out = day0(dir.path(), &tune_model_base());
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("from the cache"));
    assert!(t.elapsed().as_secs_f64() < 1.0);

    // The forward takes the cached file by default, a file given, or none.
    let by_default = forward_tuned(dir.path(), None);
    let given = forward_tuned(dir.path(), Some(file));
    let none = forward_tuned(dir.path(), Some("none"));
    assert!(by_default["tuning"]
        .as_str()
        .unwrap()
        .contains("tuning-deepseek_v3"));
    assert_eq!(given["tuning"], file);
    assert!(none["tuning"].is_null());
    for key in ["ttft_us", "tpot_us"] {
        let (t, h) = (given[key].as_f64().unwrap(), none[key].as_f64().unwrap());
        assert_eq!(by_default[key], given[key]);
        // Every tuned launch runs fewer cycles than its heuristic, and no other launch moves.
        assert!(t < h, "{key}: tuned {t} vs heuristic {h}");
    }
    // `day0 run` on one card applies it too.
    let run = |tuning: &str| {
        json(&day0(
            dir.path(),
            &[
                "run",
                "--model",
                TINY_V3,
                "--cluster",
                "h200-node",
                "--cards",
                "1",
                "--plan",
                "tp=1,dp=1,pp=1,ep=1",
                "--no-check",
                "--prompt-len",
                "200",
                "--output-len",
                "4",
                "--tuning",
                tuning,
                "--json",
            ],
        ))
    };
    let (tuned, plain) = (run(file), run("none"));
    assert_eq!(tuned["tuning"], file);
    assert!(plain["tuning"].is_null());
    let ttft = |v: &serde_json::Value| v["prefill"]["ttft_ms"].as_f64().unwrap();
    assert!(ttft(&tuned) < ttft(&plain));
}

#[test]
fn a_bad_tuning_file_is_an_error_naming_the_flag_and_the_entry() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    let file = file.to_str().unwrap();
    let mut tuned = json(&day0(dir.path(), &tune_model_args(file)));
    tuned["launches"][0]["config"]["BM"] = serde_json::json!(48);
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, tuned.to_string()).unwrap();
    let mut pinned = json(&day0(dir.path(), &tune_model_args(file)));
    pinned["implementations"] = serde_json::json!({"moe_grouped_linear_mxfp4": "gemm_hand"});
    let bad_pin = dir.path().join("bad_pin.json");
    std::fs::write(&bad_pin, pinned.to_string()).unwrap();
    for (path, says) in [
        (
            bad.to_str().unwrap(),
            "not in the kernel's declared tunable space",
        ),
        (
            bad_pin.to_str().unwrap(),
            "implementations: moe_grouped_linear_mxfp4",
        ),
        ("/nonexistent/tuning.json", "cannot read"),
        (TINY_V3, "not a tuning file"),
    ] {
        let out = day0(
            dir.path(),
            &[
                "forward",
                "--config",
                TINY_V3,
                "--cost-only",
                "--tuning",
                path,
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{path}");
        assert!(
            err.contains("--tuning") && err.contains(says),
            "{path}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// A tuning file may pin a swappable operator's implementation, as `--impl OP=NAME` does; the
/// command's own `--impl` wins.
#[test]
fn a_tuning_file_pins_implementations_and_impl_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tuning.json");
    let file = file.to_str().unwrap();
    let mut tuned = json(&day0(dir.path(), &tune_model_args(file)));
    tuned["implementations"] =
        serde_json::json!({"moe_grouped_linear_mxfp4": "grouped_linear_mxfp4"});
    std::fs::write(file, tuned.to_string()).unwrap();
    let hybrid = "model/testdata/day0_hybrid_config.json";
    let fwd = |extra: &[&str]| {
        let mut args = vec![
            "forward",
            "--config",
            hybrid,
            "--cost-only",
            "--prompt-len",
            "64",
            "--output-len",
            "2",
            "--json",
            "--tuning",
            file,
        ];
        args.extend(extra);
        json(&day0(dir.path(), &args))["implementations"]["moe_grouped_linear_mxfp4"].clone()
    };
    let pinned = fwd(&[]);
    assert!(
        pinned["grouped_linear_mxfp4"].as_u64().unwrap() > 0,
        "{pinned}"
    );
    assert!(
        pinned.get("grouped_linear_mxfp4_hand").is_none(),
        "{pinned}"
    );
    let overridden = fwd(&[
        "--impl",
        "moe_grouped_linear_mxfp4=grouped_linear_mxfp4_hand",
    ]);
    assert!(
        overridden.get("grouped_linear_mxfp4").is_none(),
        "{overridden}"
    );
    assert!(overridden["grouped_linear_mxfp4_hand"].as_u64().unwrap() > 0);
}
