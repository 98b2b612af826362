//! The `day0` command as a user runs it.

use std::process::Command;

fn day0(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_day0"))
        .args(args)
        .output()
        .expect("day0 runs")
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
