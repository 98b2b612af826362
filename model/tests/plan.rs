//! The deployment planner: parameter counts against published totals and against the tensors a
//! checkpoint stores, plans that the model or cluster cannot take, memory plans that overflow,
//! and a decode estimate checked against its closed form.

use accel_sim::cluster::ClusterPreset;
use model::config::load_config;
use model::plan::estimate::{Estimator, Phase, Routing};
use model::plan::memory::{bytes_per_param, plan_memory, MemoryOptions};
use model::plan::parallel::Plan;
use model::plan::params::count;
use model::plan::presets::{load_model, MODEL_PRESETS};
use model::weights::checkpoint::Checkpoint;
use std::path::Path;

fn within(got: f64, want: f64, tol: f64) -> bool {
    ((got - want) / want).abs() <= tol
}

/// Acceptance of issue #14: the totals the configs imply (main model, no MTP head).
#[test]
fn parameter_counts_match_the_published_totals() {
    let k2 = count(&load_model("kimi-k2").unwrap());
    assert!(
        within(k2.total() as f64, 1.03e12, 0.01),
        "kimi-k2 total {}",
        k2.total()
    );
    assert!(
        within(k2.active() as f64, 32.7e9, 0.03),
        "kimi-k2 active {}",
        k2.active()
    );
    let v3 = count(&load_model("deepseek-v3").unwrap());
    assert!(
        within(v3.total() as f64, 671e9, 0.01),
        "deepseek-v3 total {}",
        v3.total()
    );
    assert!(
        within(v3.active() as f64, 37.4e9, 0.03),
        "deepseek-v3 active {}",
        v3.active()
    );
    // V3.2 adds the indexer (about 0.9B over 61 layers) to the same 671B.
    let v32 = count(&load_model("deepseek-v3.2").unwrap());
    assert!(v32.total() > v3.total() && within(v32.total() as f64, 671e9, 0.01));
    let qn = count(&load_model("qwen3-next-80b").unwrap());
    assert!(
        within(qn.total() as f64, 80e9, 0.01),
        "qwen3-next total {}",
        qn.total()
    );
    let h = count(&load_model("hybrid-3t").unwrap());
    assert!(
        (2.5e12..3.5e12).contains(&(h.total() as f64)),
        "hybrid-3t is about 3T: {}",
        h.total()
    );
    for p in MODEL_PRESETS {
        let c = count(&load_model(p.name).unwrap());
        let cfg = load_model(p.name).unwrap();
        assert!(
            (c.active() < c.total() && c.routed_experts() > 0) == cfg.moe.is_some(),
            "{}",
            p.name
        );
    }
}

/// The GQA families (Qwen3-MoE, Mixtral, Llama 3.1): the counts day0 derives from their published
/// `config.json` are within 1% (total) and 3% (active) of the totals their model cards state.
#[test]
fn gqa_presets_match_their_model_cards() {
    for (name, total, active) in [
        ("qwen3-235b-a22b", 235e9, 22e9),
        ("mixtral-8x22b", 141e9, 39e9),
        ("llama-3.1-405b", 405e9, 405e9),
    ] {
        let c = count(&load_model(name).unwrap());
        assert!(
            within(c.total() as f64, total, 0.01),
            "{name}: total {}",
            c.total()
        );
        assert!(
            within(c.active() as f64, active, 0.03),
            "{name}: active {}",
            c.active()
        );
    }
}

/// The formulas count exactly the tensors a released checkpoint stores (minus the MTP layer,
/// which is not part of the main model), for every architecture with a tiny checkpoint.
#[test]
fn parameter_counts_equal_the_checkpoint_tensors() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny");
    for name in [
        "deepseek_v2",
        "deepseek_v3",
        "deepseek_v32",
        "qwen3_next",
        "kimi_linear",
        "qwen3_moe",
        "llama",
        "mixtral",
        "mistral",
        "qwen2",
        "qwen2_moe",
        "glm4_moe",
    ] {
        let dir = root.join(name);
        let cfg = load_config(&dir.join("config.json")).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        let layers = cfg.num_layers();
        let stored: u64 = ckpt
            .names()
            .iter()
            .filter(|n| {
                // MTP layers sit past the last decoder layer.
                match n.strip_prefix("model.layers.") {
                    Some(rest) => rest
                        .split('.')
                        .next()
                        .and_then(|i| i.parse::<usize>().ok())
                        .is_some_and(|i| i < layers),
                    None => true,
                }
            })
            .map(|n| ckpt.shape(n).unwrap().iter().product::<usize>() as u64)
            .sum();
        assert_eq!(count(&cfg).total(), stored, "{name}");
    }
}

#[test]
fn bad_plans_name_the_flag() {
    let cfg = load_model("kimi-k2").unwrap();
    let e = Plan::parse("tp=3", Some(24), "--plan").and_then(|p| p.validate(&cfg, "--plan"));
    let e = e.unwrap_err();
    assert!(e.flag.contains("tp") && e.message.contains("64"), "{e}");
    let e = Plan::parse("tp=1,dp=512,ep=512", None, "--plan")
        .unwrap()
        .validate(&cfg, "--plan")
        .unwrap_err();
    assert!(e.flag.contains("ep") && e.message.contains("384"), "{e}");
    assert!(Plan::parse("tp=2,qq=3", Some(8), "--plan")
        .unwrap_err()
        .message
        .contains("qq"));
    assert!(Plan::parse("tp=0", Some(8), "--plan").is_err());
    assert!(Plan::parse("tp=8,dp=2", Some(8), "--plan")
        .unwrap_err()
        .message
        .contains("16"));
    // More cards than the cluster holds.
    let est = Estimator::new(cfg, ClusterPreset::load("h800").unwrap(), Routing::Uniform).unwrap();
    let too_many = Plan::parse("tp=8,dp=8", None, "--plan").unwrap();
    let e = est.estimate(&too_many, Phase::Decode, 1, 128).unwrap_err();
    assert!(e.to_string().contains("--cards"), "{e}");
}

#[test]
fn a_model_too_big_for_its_cards_names_the_overflowing_term() {
    let cfg = load_model("hybrid-3t").unwrap();
    let plan = Plan::parse("tp=8", Some(8), "--plan").unwrap();
    let m = plan_memory(&cfg, &plan, 80e9, 1, 8192, &MemoryOptions::default());
    let total = plan_memory(
        &cfg,
        &Plan {
            tp: 1,
            dp: 1,
            pp: 1,
            ep: 1,
        },
        80e9,
        1,
        1,
        &MemoryOptions::default(),
    )
    .weights
    .total();
    let e = m.check(1, 8192, &plan, total).unwrap_err();
    assert!(
        e.message.contains("weights need") && e.message.contains("cards"),
        "{e}"
    );
}

#[test]
fn memory_plan_counts_native_formats_and_cache_kinds() {
    // MXFP4 is 4.25 bits per value; FP8 block-scaled one byte plus a scale per 128×128 block.
    assert_eq!(
        bytes_per_param(&model::config::WeightFormat::Mxfp4),
        4.25 / 8.0
    );
    let v3 = load_model("deepseek-v3").unwrap();
    let plan = Plan::parse("tp=1,dp=32,ep=32", Some(32), "--plan").unwrap();
    let m = plan_memory(&v3, &plan, 80e9, 16, 4096, &MemoryOptions::default());
    // 61 MLA layers × one 576-wide bf16 latent row per token.
    assert_eq!(m.kv_per_token, 61.0 * 576.0 * 2.0);
    assert_eq!(m.state_per_sequence, 0.0);
    // 8 routed experts of 256 per card.
    let per_expert = 3.0 * 7168.0 * 2048.0 * bytes_per_param(&v3.weight_format);
    assert!(within(m.weights.experts, 58.0 * 8.0 * per_expert, 1e-9));
    assert!(m.kv_tokens_capacity().is_some_and(|t| t > 0) && m.max_batch(4096) > 0);
    // Linear-attention state is constant in the context.
    let qn = load_model("qwen3-next-80b").unwrap();
    let m = plan_memory(
        &qn,
        &Plan::parse("tp=2", Some(2), "--plan").unwrap(),
        80e9,
        1,
        1000,
        &MemoryOptions::default(),
    );
    assert!(m.state_per_sequence > 0.0);
}

#[test]
fn zipf_routing_loads_one_rank_more_than_uniform() {
    let u = Routing::Uniform.rank_shares(256, 32);
    assert!(u.iter().all(|s| within(*s, 1.0 / 32.0, 1e-12)));
    let z = Routing::Zipf(1.0).rank_shares(256, 32);
    assert!(within(z.iter().sum::<f64>(), 1.0, 1e-12));
    assert!(z.iter().cloned().fold(0.0, f64::max) > 1.5 / 32.0);
    assert!(Routing::parse("zipf:x").is_err() && Routing::parse("uniform").is_ok());
}

/// A memory-bound decode step: the simulated time is at least the bytes the card moves over its
/// HBM bandwidth, those bytes cover what the closed form says a step must read (the card's
/// weights in use and the KV cache), and utilisation never exceeds 1.
#[test]
fn decode_step_agrees_with_the_memory_bound_closed_form() {
    let cfg = load_model("deepseek-v3").unwrap();
    let cluster = ClusterPreset::load("h800").unwrap();
    let est = Estimator::new(cfg.clone(), cluster, Routing::Uniform).unwrap();
    let plan = Plan::parse("tp=8,dp=4,ep=32", Some(32), "--plan").unwrap();
    let (batch, ctx) = (8, 2048);
    let e = est.estimate(&plan, Phase::Decode, batch, ctx).unwrap();
    let bw = est.device().hbm.bandwidth_gbps * 1e9;
    assert!(e.hbm_utilization <= 1.0 && e.hbm_utilization > 0.3, "{e:?}");
    assert!(e.step_s >= e.hbm_bytes_per_card / bw, "{e:?}");
    let m = plan_memory(&cfg, &plan, 80e9, batch, ctx, &MemoryOptions::default());
    // The dense weights of the card and one KV read per sequence: a lower bound of the bytes.
    let closed = m.weights.dense + batch as f64 * ctx as f64 * m.kv_per_token;
    assert!(
        e.hbm_bytes_per_card >= closed,
        "{} < {closed}",
        e.hbm_bytes_per_card
    );
    // The operator table holds the breakdown's compute: the slowest stage's operators, for
    // every micro-batch it runs.
    let b = &e.breakdown;
    let compute = b.attention_s + b.dense_ffn_s + b.experts_s + b.head_s;
    let op_cycles: f64 = e
        .ops
        .values()
        .flat_map(|o| o.values())
        .map(|c| c.cycles)
        .sum();
    let clock = est.device().clock_ghz * 1e9;
    assert!(
        (op_cycles / clock - compute).abs() <= 1e-9 * compute,
        "{op_cycles} cycles vs {compute} s"
    );
    assert!(e.ops["mla+moe"]["moe.experts.gate_up_proj"].launches > 0.0);
    // Memoised runs: the same estimate again costs no new forward.
    let runs = est.runs();
    let again = est.estimate(&plan, Phase::Decode, batch, ctx).unwrap();
    assert_eq!(again, e);
    assert_eq!(est.runs(), runs);
    // Utilisation is measured against the FP8 rate the block-FP8 projections run at: a card
    // never does more than its peak, and a memory-bound decode uses little of it.
    let prefill = est.estimate(&plan, Phase::Prefill, 1, 1024).unwrap();
    for x in [&e, &prefill] {
        assert!(x.mfu > 0.0 && x.mfu <= 1.0, "{x:?}");
    }
    assert!(
        e.mfu < 0.1 && prefill.mfu > e.mfu,
        "{} {}",
        e.mfu,
        prefill.mfu
    );
    prefill_all_to_alls_match_their_closed_form(&est, &prefill, 1024 / 8);
}

/// The prefill's expert all-to-alls (DeepEP's normal kernels) on `ep=32` over 4 h800 nodes,
/// uniform routing of DeepSeek-V3 (256 experts, 8 per token, 8 per rank, 64 per node), `origin`
/// tokens per rank (the replica's prompt over `tp`): a token crosses IB once per other node
/// holding any of its experts and NVLink once per rank holding one (`1 − C(248, 8)/C(256, 8)`).
/// Node-limited routing picks the experts from 4 of the 8 expert groups, packed 2 per node, so a
/// node is reached with probability `1 − C(6, 4)/C(8, 4)` (free routing over 64 experts per node
/// would give `1 − C(192, 8)/C(256, 8)`, 0.902 against 0.786). Per rank, IB: 3 nodes' rows out,
/// and as a proxy 3 twins' rows in; NVLink: 7 ranks of its node directly plus 3 × 7 forwarded for
/// its remote twins, out and in. The larger level sets each exchange; FP8 rows out, bf16 back; 58
/// MoE layers.
fn prefill_all_to_alls_match_their_closed_form(
    est: &Estimator,
    prefill: &model::plan::estimate::StepEstimate,
    origin: usize,
) {
    let binom_ratio = |held: usize| -> f64 {
        // C(256 − held, 8) / C(256, 8)
        (0..8)
            .map(|i| (256 - held - i) as f64 / (256 - i) as f64)
            .product()
    };
    // C(6, 4) / C(8, 4) = 15 / 70.
    let (p_rank, p_node) = (1.0 - binom_ratio(8), 1.0 - 15.0 / 70.0);
    let c = est.cluster();
    let exchange = |bytes: f64| {
        let row = origin as f64 * 7168.0 * bytes;
        let inter = 3.0 * p_node * row / c.inter_card_bytes_per_s() + c.inter_latency_s();
        let intra = 28.0 * p_rank * row / c.intra_card_bytes_per_s() + c.intra_latency_s();
        inter.max(intra)
    };
    let want = 58.0 * (exchange(1.0) + exchange(2.0));
    let got = prefill.breakdown.ep_comm_s;
    assert!(
        within(got, want, 1e-9),
        "ep comm {got} s, closed form {want} s"
    );
    // Each token once per node: under half the IB time of a row per (token, expert) (2.36
    // against 6 rows per token: 24 of the 32 ranks are on other nodes; 1 + 2 bytes per value
    // out and back).
    let per_expert =
        58.0 * 3.0 * (origin as f64 * 7168.0 * 8.0 * 24.0 / 32.0) / c.inter_card_bytes_per_s();
    assert!(got < per_expert / 2.0, "{got} vs {per_expert}");
}

/// Node-limited routing's node count (DeepSeek-V3: 8 of 256 experts from 4 of 8 groups) against
/// its closed forms: 2 groups per node on 4 nodes `4·(1 − C(6,4)/C(8,4))`; one group per node on 8
/// nodes exactly the 4 chosen groups' nodes; a group over 2 of 16 nodes, its 2 experts (of 32)
/// reaching each half with `1 − (16/32)(15/31)`; never more nodes than free routing reaches.
/// Routing without group limits, and groups that do not pack evenly, have no cap.
#[test]
fn node_limited_routing_reaches_its_closed_form_node_count() {
    use model::plan::estimate::{hit_probability, node_limited_nodes};
    let mut m = load_model("deepseek-v3").unwrap().moe.unwrap();
    assert_eq!(
        (m.experts, m.experts_per_token, m.n_group, m.topk_group),
        (256, 8, 8, 4)
    );
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    let four = node_limited_nodes(&m, 4).unwrap();
    assert!(close(four, 4.0 * (1.0 - 15.0 / 70.0)), "{four}");
    assert!(close(node_limited_nodes(&m, 8).unwrap(), 4.0));
    let sixteen = node_limited_nodes(&m, 16).unwrap();
    assert!(
        close(sixteen, 8.0 * (1.0 - 16.0 / 32.0 * 15.0 / 31.0)),
        "{sixteen}"
    );
    for nodes in [2, 4, 8, 16, 32] {
        let free = nodes as f64 * hit_probability(1.0 / nodes as f64, 8, 256);
        let limited = node_limited_nodes(&m, nodes).unwrap();
        assert!(
            limited <= free + 1e-12,
            "{nodes} nodes: {limited} vs {free}"
        );
    }
    assert!(node_limited_nodes(&m, 3).is_none());
    m.topk_group = 8;
    assert!(node_limited_nodes(&m, 4).is_none());
    let kimi = load_model("kimi-k2").unwrap().moe.unwrap();
    assert!(node_limited_nodes(&kimi, 4).is_none());
}

/// The router scores every routed expert on the card's own tokens, whatever the expert
/// parallelism: its cost in the step does not shrink as `ep` spreads the experts (the routed
/// experts' own share does).
#[test]
fn the_router_scores_every_expert_whatever_ep() {
    let cfg = load_model("deepseek-v3").unwrap();
    let cluster = ClusterPreset::load("h800").unwrap();
    let est = Estimator::new(cfg, cluster, Routing::Uniform).unwrap();
    let step = |spec: &str| {
        let plan = Plan::parse(spec, Some(32), "--plan").unwrap();
        est.estimate(&plan, Phase::Decode, 8, 2048).unwrap()
    };
    let (wide, narrow) = (step("tp=1,dp=32,ep=32"), step("tp=1,dp=32,ep=8"));
    let op = |e: &model::plan::estimate::StepEstimate, name: &str| e.ops["mla+moe"][name];
    let (r_wide, r_narrow) = (
        op(&wide, "moe.router_logits"),
        op(&narrow, "moe.router_logits"),
    );
    assert_eq!(r_wide.cycles, r_narrow.cycles);
    assert_eq!(r_wide.launches, r_narrow.launches);
    // The routed experts' GEMM reads 4× fewer experts' weights per card at ep=32.
    let g = |e| op(e, "moe.experts.gate_up_proj").cycles;
    assert!(g(&wide) < g(&narrow), "{} vs {}", g(&wide), g(&narrow));
}

/// One cost-only decode step on an h800 of `tokens` tokens at context `ctx` over KV pools in
/// `cache`: one sequence's `tokens`-token chunk, or with `batched` a batch of `tokens` sequences
/// (`Runner::batch_decode`). Its operator statistics.
fn h800_decode(
    cfg: &model::config::ModelConfig,
    tokens: usize,
    ctx: usize,
    batched: bool,
    cache: model::forward::CacheFormat,
) -> model::forward::OpStats {
    let launcher = dsl_core::Launcher::new(accel_sim::DevicePreset::load("h800").unwrap())
        .with_backend(dsl_core::Backend::CostOnly);
    let mut r = model::forward::Runner::cost_only(cfg.clone(), launcher, ctx + tokens).unwrap();
    r.set_kv_cache(cache).unwrap();
    r.batch_decode(batched).unwrap();
    r.seek(ctx).unwrap();
    r.forward(&vec![0; tokens]).unwrap();
    r.stats().clone()
}

/// A batched cost-only decode reads every sequence's own cache (b times one sequence's bytes) in
/// one launch per attention layer, not one chunk over a single cache: MLA's latent cache
/// (DeepSeek-V3) and GQA's keys and values (Qwen3-Next's full-attention layers), in bf16 and in
/// FP8.
#[test]
fn a_batched_decode_reads_each_sequences_cache_in_one_launch() {
    use dsl_core::{Backend, Launcher};
    use model::config::AttentionKind;
    use model::forward::Runner;
    let launcher = || {
        Launcher::new(accel_sim::DevicePreset::load("h800").unwrap())
            .with_backend(Backend::CostOnly)
    };
    use model::forward::CacheFormat;
    let (b, ctx) = (8, 1000);
    for (name, split) in [
        ("deepseek-v3", "mla.decode_split"),
        ("qwen3-next-80b", "attn.decode_split"),
    ] {
        let cfg = load_model(name).unwrap();
        let decode =
            |tokens: usize, batched: bool, cache| h800_decode(&cfg, tokens, ctx, batched, cache);
        let bytes = |s: &model::forward::OpStats| s.traffic[split].hbm_bytes as f64;
        let attention_layers = cfg
            .layers
            .iter()
            .filter(|l| !matches!(l.attention, AttentionKind::LinearAttention))
            .count();
        // An FP8 batch reads each cached row's `d` codes and one 4-byte scale where bf16 reads
        // `2d` bytes, in as many launches: it saves `d − 4` bytes per row of every sequence's
        // `ctx + 1` tokens (one latent row per token; a key and a value row per key/value head).
        // Queries and partials are unchanged (MLA's 128 heads' partials outweigh its cache here).
        let fp8 = decode(b, true, CacheFormat::Fp8);
        let bf16 = decode(b, true, CacheFormat::Bf16);
        assert_eq!(fp8.per_op[split].0, bf16.per_op[split].0, "{name}");
        let (rows, d) = match (&cfg.mla, &cfg.gqa) {
            (Some(m), _) => (1, m.latent_dim()),
            (None, Some(g)) => (2 * g.kv_heads, g.head_dim),
            _ => unreachable!("{name} caches keys"),
        };
        let want = (attention_layers * b * (ctx + 1) * rows * (d - 4)) as f64;
        let saved = bytes(&bf16) - bytes(&fp8);
        assert!(
            (saved / want - 1.0).abs() < 0.05,
            "{name}: FP8 saves {saved} bytes, its rows {want}"
        );
        let one = decode(1, false, CacheFormat::Bf16);
        let batch = bf16;
        assert_eq!(batch.per_op[split].0, attention_layers as u64, "{name}");
        assert!(
            !batch.per_sequence.contains(split) && one.per_sequence.contains(split),
            "{name}"
        );
        assert!(
            bytes(&batch) >= 0.9 * b as f64 * bytes(&one),
            "{name}: {} vs {} × {}",
            bytes(&batch),
            b,
            bytes(&one)
        );
    }
    // A runner that holds data refuses it.
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/tiny/deepseek_v3");
    let mut r = Runner::load(&tiny, launcher().with_backend(Backend::Functional), 16).unwrap();
    assert!(r.batch_decode(true).is_err());
}

/// A TTFT target the screen's favourite misses once simulated: the planner simulates the plan
/// the screen deems fastest per step too, and picks the one that meets the target.
#[test]
fn a_ttft_target_picks_a_plan_that_meets_it() {
    use model::plan::search::{plan_phase, Workload, FINALISTS};
    let cfg = load_model("deepseek-v3").unwrap();
    let est = Estimator::new(cfg, ClusterPreset::load("h800").unwrap(), Routing::Uniform).unwrap();
    let mut w = Workload {
        prompt_len: 2048,
        output_len: 64,
        batch: None,
        context: None,
        tpot_target_s: None,
        ttft_target_s: None,
    };
    let mem = MemoryOptions::default();
    let free = plan_phase(&est, Phase::Prefill, 32, &w, &mem, None, FINALISTS).unwrap();
    // A target just under the unconstrained choice's TTFT.
    let t = free.best.estimate.step_s * 0.9;
    w.ttft_target_s = Some(t);
    let held = plan_phase(&est, Phase::Prefill, 32, &w, &mem, None, FINALISTS).unwrap();
    assert!(held.best.estimate.step_s <= t, "{:?}", held.best.estimate);
    assert_ne!(held.best.estimate.plan, free.best.estimate.plan);
    assert!(held.why.contains("target"), "{}", held.why);
}

/// The estimator prices a decode batch from a batched run plus, for the operators that run once
/// per sequence, a one-sequence run times the batch. That only adds up when both runs launch the
/// same per-sequence operators: one the batched run books per sequence but the one-sequence run
/// lacks would be priced at nothing, and so would one the one-sequence run has that the batched
/// run never launched (GQA attention was both until its batched decode: the batch ran it as a
/// prefill chunk, and neither form was priced; KDA's recurrence ran chunked). Every preset model,
/// and Kimi-Linear (KDA layers).
#[test]
fn a_batched_decode_and_a_one_sequence_run_launch_the_same_per_sequence_operators() {
    let (b, ctx) = (4, 3000);
    let kimi_linear =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/kimi_linear_config.json");
    let models = MODEL_PRESETS
        .iter()
        .map(|p| p.name.to_string())
        .chain([kimi_linear.to_string_lossy().into_owned()]);
    for name in models {
        let cfg = load_model(&name).unwrap();
        let decode = |tokens: usize, batched: bool| {
            h800_decode(
                &cfg,
                tokens,
                ctx,
                batched,
                model::forward::CacheFormat::Bf16,
            )
        };
        let one = decode(1, false);
        let batch = decode(b, true);
        for op in &batch.per_sequence {
            assert!(
                one.per_sequence.contains(op),
                "{name}: the batched decode runs {op} per sequence, the one-sequence run does not"
            );
        }
        for op in &one.per_sequence {
            assert!(
                batch.per_op.contains_key(op),
                "{name}: the one-sequence decode runs {op}, the batched decode never does"
            );
        }
    }
}

/// The planner prices routed experts in a run of their own at the rows expert parallelism sends
/// a card: that run launches the routed experts and nothing else (no embedding, norms, dense
/// MLPs, routers, shared experts or lm_head at those rows), at exactly the cost they have inside a
/// whole layer.
#[test]
fn a_routed_experts_run_launches_only_the_routed_experts() {
    use model::forward::{Blocks, Runner};
    use model::plan::estimate::is_routed_expert_op;
    let tokens = 96;
    for name in ["deepseek-v3", "qwen3-next-80b"] {
        let cfg = load_model(name).unwrap();
        let run = |blocks: Blocks| {
            let launcher = dsl_core::Launcher::new(accel_sim::DevicePreset::load("h800").unwrap())
                .with_backend(dsl_core::Backend::CostOnly);
            let mut r = Runner::cost_only(cfg.clone(), launcher, tokens).unwrap();
            r.run_blocks(blocks).unwrap();
            r.forward(&vec![0; tokens]).unwrap();
            (r.last_layers().to_vec(), r.stats().clone())
        };
        let (alone, alone_total) = run(Blocks {
            attention: false,
            ffn: false,
            routed_experts: true,
        });
        let (whole, whole_total) = run(Blocks::ALL);
        // Nobody reads a routed-experts run's embedding, final norm or lm_head: none launches.
        for op in ["embedding", "final_norm", "lm_head"] {
            assert!(whole_total.per_op.contains_key(op), "{name}: {op}");
            assert!(!alone_total.per_op.contains_key(op), "{name}: {op} ran");
        }
        let mut routed_layers = 0;
        for (l, (a, w)) in alone.iter().zip(&whole).enumerate() {
            assert!(a.attention.per_op.is_empty(), "{name} layer {l}");
            for op in a.ffn.per_op.keys() {
                assert!(is_routed_expert_op(op), "{name} layer {l}: `{op}` ran");
            }
            let routed = |s: &model::forward::OpStats| -> Vec<(String, u64)> {
                s.per_op
                    .iter()
                    .filter(|(op, _)| is_routed_expert_op(op))
                    .map(|(op, (_, c))| (op.clone(), *c))
                    .collect()
            };
            assert_eq!(routed(&a.ffn), routed(&w.ffn), "{name} layer {l}");
            routed_layers += usize::from(!a.ffn.per_op.is_empty());
        }
        assert!(routed_layers > 0, "{name}: no routed experts ran");
    }
}

/// A DSA indexer is replicated, not split, by tensor parallelism (DeepSeek-V3.2's reference
/// inference code builds its projections as plain `Linear`s with every index head on every rank,
/// and `forward::cards` holds it whole): a card role runs all its heads and the memory plan
/// counts all its weights on every card, while the attention heads are split.
#[test]
fn tensor_parallelism_keeps_the_dsa_indexer_whole() {
    let v32 = load_model("deepseek-v3.2").unwrap();
    let ix = v32.indexer.clone().unwrap();
    let tp4 = Plan::parse("tp=4", Some(4), "--plan").unwrap();
    let shard = tp4.shard(&v32);
    assert_eq!(shard.indexer.unwrap().heads, ix.heads);
    assert_eq!(
        shard.mla.unwrap().heads,
        v32.mla.as_ref().unwrap().heads / 4
    );
    let p = count(&v32);
    let indexer: u64 = p.layers.iter().map(|l| l.indexer).sum();
    let rest: u64 = p
        .layers
        .iter()
        .map(|l| l.attention + l.dense_mlp + l.shared_experts)
        .sum();
    assert!(indexer > 0 && p.layers.iter().all(|l| l.indexer > 0));
    let b = bytes_per_param(&v32.weight_format);
    let dense = |plan: &Plan| {
        plan_memory(&v32, plan, 80e9, 1, 4096, &MemoryOptions::default())
            .weights
            .dense
    };
    let tp1 = Plan::parse("tp=1", Some(1), "--plan").unwrap();
    assert!(within(dense(&tp1), (rest + indexer) as f64 * b, 1e-12));
    assert!(within(
        dense(&tp4),
        (rest as f64 / 4.0 + indexer as f64) * b,
        1e-12
    ));
    // The totals are unchanged by the split of the count.
    assert!(within(p.total() as f64, 671e9, 0.01));
}

/// With a TPOT target and the batch left open, the planner halves from the batch memory holds and
/// then bisects back up: it picks a batch size (a multiple of 8) that meets the target, and the
/// next size, 8 more sequences, misses it.
#[test]
fn a_tpot_target_gets_the_largest_batch_that_meets_it() {
    use model::plan::search::{plan_phase, Workload, FINALISTS};
    let cfg = load_model("deepseek-v3").unwrap();
    let est = Estimator::new(cfg, ClusterPreset::load("h800").unwrap(), Routing::Uniform).unwrap();
    let plan = Plan::parse("tp=1,dp=32,pp=1,ep=32", Some(32), "--plan").unwrap();
    let ctx = 4096;
    // A target between the steps of 40 and 48 sequences per card.
    let target = est.estimate(&plan, Phase::Decode, 44, ctx).unwrap().step_s;
    let w = Workload {
        prompt_len: 2048,
        output_len: 64,
        batch: None,
        context: Some(ctx),
        tpot_target_s: Some(target),
        ttft_target_s: None,
    };
    let mem = MemoryOptions::default();
    let got = plan_phase(&est, Phase::Decode, 32, &w, &mem, Some(plan), FINALISTS).unwrap();
    let e = &got.best.estimate;
    let b = e.batch_per_replica;
    assert!(e.step_s <= target, "{b}: {} s against {target} s", e.step_s);
    assert!(b.is_multiple_of(8) && b >= 8, "{b}");
    let next = est.estimate(&plan, Phase::Decode, b + 8, ctx).unwrap();
    assert!(
        next.step_s > target,
        "{} sequences also meet the target",
        b + 8
    );
}
