//! Issue #13 item 4: data-dependent work in cost-only runs. A functional run records its router
//! choices and DSA selections; a cost-only run that replays them launches exactly what the
//! functional run launched, so every operator's launches, cycles and traffic are the functional
//! run's. Bad replays are errors naming the flag.

use dsl_core::Launcher;
use model::config::load_config;
use model::forward::routing::{RoutingModel, RoutingRecord};
use model::forward::{OpStats, Precision, Runner};
use std::path::PathBuf;
use std::sync::Arc;

fn testdata(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(rel)
}

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

const CAPACITY: usize = 40;

/// A functional run of `tiny/<name>` (prompt, then `decode` greedy steps), recorded.
fn recorded_run(
    name: &str,
    prompt_len: usize,
    decode: usize,
) -> ((OpStats, OpStats), RoutingRecord) {
    let dir = testdata(&format!("tiny/{name}"));
    let mut f = Runner::load_at(&dir, launcher(), CAPACITY, Precision::F32).unwrap();
    f.record_routing();
    let prompt: Vec<i64> = (0..prompt_len).map(|i| (i * 37 % 250) as i64).collect();
    let g = f.generate(&prompt, decode).unwrap();
    assert_eq!(g.tokens.len(), decode);
    ((g.prefill, g.decode), f.take_recording().unwrap())
}

fn cost_runner(name: &str) -> Runner {
    let cfg = load_config(&testdata(&format!("tiny/{name}/config.json"))).unwrap();
    Runner::cost_only_at(cfg, launcher(), CAPACITY, Precision::F32).unwrap()
}

#[test]
fn replayed_routing_gives_the_functional_runs_cycles_for_moe_and_dsa() {
    for (name, data_ops) in [
        (
            "deepseek_v3",
            &["moe.experts.gate_up_proj", "moe.experts.down_proj"][..],
        ),
        (
            "deepseek_v32",
            &[
                "moe.experts.gate_up_proj",
                "moe.experts.down_proj",
                "mla.sparse_attention",
            ][..],
        ),
    ] {
        let (prompt_len, decode) = (21, 4);
        let (functional, rec) = recorded_run(name, prompt_len, decode);
        // generate runs the prompt, then a step for every token but the last.
        assert_eq!(rec.workload(), (prompt_len, decode));
        assert!(
            rec.steps[0].layers.iter().any(|l| l.experts.is_some()),
            "{name}"
        );
        if name == "deepseek_v32" {
            assert!(rec.steps[1].layers.iter().any(|l| l.selected.is_some()));
        }
        // The recording survives a round trip through its file.
        let path = std::env::temp_dir().join(format!("day0-replay-{name}.json"));
        rec.write(&path).unwrap();
        let rec = RoutingRecord::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);

        let mut replay = cost_runner(name);
        replay
            .set_routing(RoutingModel::Replay(Arc::new(rec.clone())))
            .unwrap();
        let run = replay.cost_run(prompt_len, decode).unwrap();
        assert_eq!(
            functional.1.per_op, run.decode.per_op,
            "{name}: every decode operator's launches and cycles"
        );
        assert_eq!(
            functional.1.traffic, run.decode.traffic,
            "{name}: decode bytes and FLOP"
        );
        // The prefill's head is the one deliberate difference: the functional run computes every
        // prompt row's logits (the goldens check them all), serving only the last row's.
        let (mut fp, mut cp) = (functional.0.clone(), run.prefill.clone());
        for s in [&mut fp, &mut cp] {
            s.per_op.remove("lm_head");
            s.traffic.remove("lm_head");
        }
        assert_eq!(fp.per_op, cp.per_op, "{name}: every prefill operator");
        assert_eq!(fp.traffic, cp.traffic, "{name}: prefill bytes and FLOP");

        // Uniform routing differs from the real one exactly in the data-dependent operators.
        let mut uniform = cost_runner(name);
        uniform.memoise_layers(false);
        let u = uniform.cost_run(prompt_len, decode).unwrap();
        let differs = |op: &&str| {
            u.prefill.per_op[*op] != functional.0.per_op[*op]
                || u.decode.per_op[*op] != functional.1.per_op[*op]
                || u.prefill.traffic[*op] != functional.0.traffic[*op]
                || u.decode.traffic[*op] != functional.1.traffic[*op]
        };
        assert!(
            data_ops.iter().any(differs),
            "{name}: uniform routing priced like the recorded one; the replay test would prove nothing"
        );
    }
}

#[test]
fn replays_that_do_not_fit_the_run_are_errors_naming_the_flag() {
    let (_, rec) = recorded_run("deepseek_v3", 9, 2);
    let rec = Arc::new(rec);
    // Another model.
    let mut other = cost_runner("deepseek_v32");
    let e = other
        .set_routing(RoutingModel::Replay(rec.clone()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--routing replay:FILE") && e.contains("another model"),
        "{e}"
    );
    // Another prompt length.
    let mut r = cost_runner("deepseek_v3");
    r.set_routing(RoutingModel::Replay(rec.clone())).unwrap();
    let e = r.cost_run(10, 2).unwrap_err().to_string();
    assert!(
        e.contains("--routing replay:FILE") && e.contains("(9 and 2)"),
        "{e}"
    );
    // More steps than recorded.
    let mut r = cost_runner("deepseek_v3");
    r.set_routing(RoutingModel::Replay(rec)).unwrap();
    let e = r.cost_run(9, 5).unwrap_err().to_string();
    assert!(e.contains("more steps than the recording"), "{e}");
    // A file that is not a recording.
    let path = std::env::temp_dir().join("day0-not-a-recording.json");
    std::fs::write(&path, "{\"steps\": 3}").unwrap();
    let e = RoutingModel::parse(&format!("replay:{}", path.display()))
        .unwrap_err()
        .to_string();
    let _ = std::fs::remove_file(&path);
    assert!(e.contains("not a routing recording"), "{e}");
}

#[test]
fn zipf_routing_loads_the_hottest_expert_more_than_uniform() {
    let cfg = load_config(&testdata("kimi_k2_config.json")).unwrap();
    let run = |model: RoutingModel| {
        let mut r = Runner::cost_only(cfg.clone(), launcher(), 512).unwrap();
        r.set_routing(model).unwrap();
        r.cost_run(512, 1).unwrap();
        let load = r.expert_loads()[0].1;
        let experts = r.stats().per_op["moe.experts.gate_up_proj"].1;
        (load, experts)
    };
    let (flat, flat_cycles) = run(RoutingModel::Uniform);
    let (skew, skew_cycles) = run(RoutingModel::Zipf(1.2));
    // 512 tokens × 8 choices over 384 experts.
    assert!((flat.mean_tokens - 512.0 * 8.0 / 384.0).abs() < 1e-9);
    assert_eq!(skew.mean_tokens, flat.mean_tokens);
    assert!(flat.imbalance() < 1.1, "{flat:?}");
    assert!(skew.imbalance() > 5.0, "{skew:?}");
    assert_ne!(skew_cycles, flat_cycles);
}
