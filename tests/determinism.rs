//! Issue #16 item 7: numbers and cycle counts are the same at any thread count and on every run,
//! for the kernels (the built-in suite: every kernel's outputs checked, its cycles and traffic)
//! and for the planned deployment (`day0 run`: the plan search, prefill and decode estimates).
//! Each command runs with `RAYON_NUM_THREADS` 1 and 3, and twice at 3; the JSON must agree
//! except for wall-clock time.

use std::process::Command;

/// The command's JSON with every wall-clock field removed.
fn json_at(threads: usize, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_day0"))
        .args(args)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .output()
        .expect("day0 runs");
    assert!(
        out.status.success(),
        "day0 {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON output");
    strip_wall(&mut v);
    v
}

fn strip_wall(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|k, _| !k.contains("wall"));
            m.values_mut().for_each(strip_wall);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_wall),
        _ => {}
    }
}

fn same_at_any_thread_count(args: &[&str]) {
    let one = json_at(1, args);
    let three = json_at(3, args);
    let again = json_at(3, args);
    assert_eq!(one, three, "day0 {args:?}: 1 vs 3 threads");
    assert_eq!(three, again, "day0 {args:?}: two runs");
}

#[test]
fn the_kernel_suite_is_identical_at_one_and_three_threads_and_on_every_run() {
    same_at_any_thread_count(&["suite", "--json"]);
}

#[test]
fn the_planned_deployment_is_identical_at_one_and_three_threads_and_on_every_run() {
    same_at_any_thread_count(&[
        "run",
        "--model",
        "qwen3-next-80b",
        "--cluster",
        "h200-node",
        "--prompt-len",
        "256",
        "--output-len",
        "8",
        "--no-check",
        "--json",
    ]);
}
