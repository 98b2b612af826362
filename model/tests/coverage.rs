//! Operator graph and coverage inventory against the real kernels crate.
//!
//! The expectations for DeepSeek-V3.2 and Kimi-K2 are written from what the `kernels` crate has
//! today: every operator of both is covered (the numeric forward pass runs them all on the tiny
//! checkpoints, model/tests/forward_golden.rs).

use model::config::load_config;
use model::coverage::{inventory, Coverage, Status};
use model::graph::{self, GraphShape, OpKind, Phase};
use std::path::{Path, PathBuf};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

/// `(op, status)` of every row, in table order.
fn statuses(c: &Coverage) -> Vec<(String, Status)> {
    c.rows.iter().map(|r| (r.op.clone(), r.status)).collect()
}

fn row_kernels(c: &Coverage, op: &str) -> Vec<String> {
    c.row(op)
        .unwrap_or_else(|| panic!("no row {op}"))
        .kernels
        .clone()
}

#[test]
fn deepseek_v32_inventory() {
    let c = inventory(&testdata("deepseek_v32_config.json")).expect("inventory");
    use Status::*;
    let want: Vec<(&str, Status)> = vec![
        ("embedding", Dsl),
        ("rmsnorm", Dsl),
        ("rmsnorm_residual", Dsl),
        ("layernorm", Dsl),
        ("linear", Dsl),
        ("rope", Dsl),
        ("kv_cache_append", Dsl),
        ("mla_absorb", Dsl),
        ("dsa_indexer.prefill", Dsl),
        ("dsa_indexer.decode", Dsl),
        ("dsa_topk.prefill", Dsl),
        ("dsa_topk.decode", Dsl),
        ("sparse_mla_attention.prefill", Dsl),
        ("sparse_mla_attention.decode", Dsl),
        ("moe_router.sigmoid_group_topk", Dsl),
        ("moe_dispatch", Dsl),
        ("expert_ffn.fp8", Dsl),
        ("moe_combine", Dsl),
        ("shared_expert", Composite),
        ("dense_mlp", Composite),
        ("lm_head", Dsl),
    ];
    let want: Vec<(String, Status)> = want.into_iter().map(|(o, s)| (o.to_string(), s)).collect();
    assert_eq!(statuses(&c), want, "\n{}", c.table());
    assert!(c.missing().is_empty(), "{:?}", c.missing());
    assert!(c.is_complete());
    // Layer counts: every layer is DSA; 3 dense MLP layers, 58 MoE.
    assert_eq!(c.row("sparse_mla_attention.decode").unwrap().layers, 61);
    assert_eq!(c.row("dense_mlp").unwrap().layers, 3);
    assert_eq!(c.row("expert_ffn.fp8").unwrap().layers, 58);
    assert_eq!(c.row("embedding").unwrap().layers, 0);
    // The kernels named are the kernels crate's.
    assert_eq!(row_kernels(&c, "dsa_indexer.decode"), ["indexer_decode"]);
    assert_eq!(row_kernels(&c, "dsa_topk.decode"), ["topk_select"]);
    assert_eq!(row_kernels(&c, "dsa_indexer.prefill"), ["indexer_prefill"]);
    assert_eq!(
        row_kernels(&c, "sparse_mla_attention.decode"),
        ["sparse_mla"]
    );
    // The forward's expert path: rows quantized per token, the grouped FP8 GEMM (W8A8, or
    // W8A16 on a device without an FP8 matrix mode), SwiGLU.
    assert_eq!(
        row_kernels(&c, "expert_ffn.fp8"),
        [
            "act_quant_fp8",
            "grouped_linear_fp8",
            "grouped_linear_fp8w",
            "swiglu"
        ]
    );
    // What the model's projections run (hand-tuned GEMMs are not swapped into them yet): the
    // tiled kernel, split over K at decode shapes that leave cores idle.
    assert_eq!(row_kernels(&c, "linear"), ["linear", "linear_split_k"]);
    assert_eq!(
        row_kernels(&c, "rmsnorm_residual"),
        ["rmsnorm_residual", "rmsnorm_residual_looped"]
    );
    // The table: one line per operator kind, then the summary naming what is missing.
    let t = c.table();
    assert!(t.contains("61 layers"), "{t}");
    assert!(t.contains("0 missing") && !t.contains("MISSING"), "{t}");
    assert!(t
        .lines()
        .any(|l| l.starts_with("sparse_mla_attention.decode")
            && l.contains("61")
            && l.contains("dsl")));
    assert!(t.contains("FP8 E4M3"), "the weight format is noted: {t}");
}

#[test]
fn kimi_k2_inventory() {
    let c = inventory(&testdata("kimi_k2_config.json")).expect("inventory");
    use Status::*;
    let want: Vec<(String, Status)> = [
        ("embedding", Dsl),
        ("rmsnorm", Dsl),
        ("rmsnorm_residual", Dsl),
        ("linear", Dsl),
        ("rope", Dsl),
        ("kv_cache_append", Dsl),
        ("mla_absorb", Dsl),
        ("mla_attention.prefill", Composite),
        ("mla_attention.decode", Dsl),
        ("moe_router.sigmoid_group_topk", Dsl),
        ("moe_dispatch", Dsl),
        ("expert_ffn.fp8", Dsl),
        ("moe_combine", Dsl),
        ("shared_expert", Composite),
        ("dense_mlp", Composite),
        ("lm_head", Dsl),
    ]
    .into_iter()
    .map(|(o, s)| (o.to_string(), s))
    .collect();
    assert_eq!(statuses(&c), want, "\n{}", c.table());
    assert!(c.missing().is_empty(), "{:?}", c.missing());
    assert_eq!(
        row_kernels(&c, "mla_attention.decode"),
        ["paged_decode_latent", "decode_combine"]
    );
    assert_eq!(c.row("dense_mlp").unwrap().layers, 1);
    assert_eq!(c.row("moe_dispatch").unwrap().layers, 60);
    // No DSA in K2.
    assert!(c.rows.iter().all(|r| !r.op.starts_with("dsa")));
}

#[test]
fn unknown_layer_kind_is_reported_missing_by_name() {
    let c = inventory(&testdata("unknown_layer_kind_config.json")).expect("inventory");
    let missing = c.missing();
    assert!(
        missing.iter().any(|m| m.contains("mamba2")),
        "missing() names the unknown kind: {missing:?}"
    );
    let row = c.rows.iter().find(|r| r.op.contains("mamba2")).unwrap();
    assert_eq!(row.status, Status::Missing);
    assert_eq!(row.layers, 2);
    assert!(c.table().contains("mamba2"));
    assert!(!c.is_complete());
    let j = c.to_json();
    assert_eq!(j["complete"], false);
    assert!(j["missing"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m.as_str().unwrap().contains("mamba2")));
    // The unknown field is carried into the inventory's warnings.
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("sliding_window_pattern")));
}

#[test]
fn only_real_size_limits_make_an_operator_missing() {
    // Qwen3-Next's full attention with an awkward head_dim (80) is covered: head dims are run-time
    // values held in covering tiles, and the notes name the tiles.
    let text = std::fs::read_to_string(testdata("qwen3_next_config.json")).unwrap();
    assert!(text.contains("\"head_dim\": 256"));
    let cfg = model::config::parse_config(
        &text.replace("\"head_dim\": 256", "\"head_dim\": 80"),
        "qwen3_next (head_dim 80)",
    )
    .unwrap();
    let c = Coverage::of_config(&cfg);
    let d = c.row("gqa_attention.decode").unwrap();
    assert_eq!(d.status, Status::Dsl);
    assert!(
        d.details
            .iter()
            .any(|t| t.contains("paged_decode_gqa_batch BD=128 BDV=128")),
        "{:?}",
        d.details
    );
    assert!(c.is_complete(), "{:?}", c.missing());
    // A head dim above the largest tile (no kernel loops over head dims) is missing, and says why.
    let cfg = model::config::parse_config(
        &text.replace("\"head_dim\": 256", "\"head_dim\": 1000"),
        "qwen3_next (head_dim 1000)",
    )
    .unwrap();
    let c = Coverage::of_config(&cfg);
    let d = c.row("gqa_attention.decode").unwrap();
    assert_eq!(d.status, Status::Missing);
    assert!(d.how.contains("D = 1000"), "{}", d.how);
    assert_eq!(d.layers, 12);
    assert!(!c.is_complete());

    // The released config (head_dim 256) is covered, and its linear-attention operators run on
    // the DSL kernels.
    let c = inventory(&testdata("qwen3_next_config.json")).expect("inventory");
    assert!(c.is_complete(), "{:?}", c.missing());
    assert_eq!(c.row("gqa_attention.decode").unwrap().status, Status::Dsl);
    assert_eq!(
        c.row("gated_delta_rule.prefill").unwrap().status,
        Status::Dsl
    );
    assert_eq!(
        row_kernels(&c, "gated_delta_rule.decode"),
        ["recurrent_delta"]
    );
    assert_eq!(c.row("short_conv").unwrap().layers, 36);
    assert_eq!(
        c.row("shared_expert_gate").unwrap().status,
        Status::Composite
    );
    assert!(c.row("moe_router.softmax_topk").is_some());
    // Kimi Linear: the KDA gates and the sigmoid-gated output norm have their kernels, at the
    // released head dim (128).
    let k = inventory(&testdata("kimi_linear_config.json")).expect("inventory");
    assert!(k.missing().is_empty(), "{:?}", k.missing());
    assert_eq!(row_kernels(&k, "delta_gates.kda"), ["kda_gates"]);
    assert_eq!(
        row_kernels(&k, "gated_rmsnorm.kda"),
        ["gated_rmsnorm_sigmoid"]
    );
}

#[test]
fn hybrid_inventory_uses_mxfp4_experts_and_both_attention_families() {
    let c = inventory(&testdata("day0_hybrid_config.json")).expect("inventory");
    let e = c.row("expert_ffn.mxfp4").unwrap();
    // What the forward launches: the grouped GEMM, the DSL prototype or its hand-tuned swap
    // (whichever is faster at the launch's shape), then SwiGLU.
    assert_eq!(e.status, Status::HandTuned);
    assert_eq!(
        e.kernels,
        [
            "grouped_linear_mxfp4",
            "grouped_linear_mxfp4_hand",
            "swiglu"
        ]
    );
    assert_eq!(e.layers, 11);
    assert_eq!(c.row("mla_attention.decode").unwrap().layers, 1);
    assert_eq!(c.row("sparse_mla_attention.decode").unwrap().layers, 3);
    assert_eq!(c.row("gated_delta_rule.decode").unwrap().layers, 8);
    let k = load_config(&testdata("kimi_linear_config.json")).unwrap();
    let kc = Coverage::of_config(&k);
    assert_eq!(
        row_kernels(&kc, "kda_delta_rule.prefill"),
        ["chunked_delta_kda"]
    );
    assert!(kc.row("rope").is_none(), "Kimi Linear's MLA uses no RoPE");
}

#[test]
fn json_matches_the_table() {
    let c = inventory(&testdata("deepseek_v32_config.json")).unwrap();
    let j = c.to_json();
    assert_eq!(j["model_type"], "deepseek_v32");
    assert_eq!(j["layers"], 61);
    let ops = j["operators"].as_array().unwrap();
    assert_eq!(ops.len(), c.rows.len());
    for (o, r) in ops.iter().zip(&c.rows) {
        assert_eq!(o["op"], r.op.as_str());
        assert_eq!(o["status"], r.status.name());
        assert_eq!(o["layers"], r.layers);
    }
    let missing: Vec<String> = j["missing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    assert_eq!(missing, c.missing());
    assert_eq!(j["counts"]["missing"], 0);
    assert_eq!(j["complete"], true);
    // Round-trips through text.
    let parsed: serde_json::Value = serde_json::from_str(&c.to_json_string()).unwrap();
    assert_eq!(parsed, j);
}

#[test]
fn graph_shapes_follow_the_config() {
    let cfg = load_config(&testdata("deepseek_v32_config.json")).unwrap();
    let shape = GraphShape {
        prefill_tokens: 100,
        decode_batch: 4,
        context: 3000,
    };
    let g = graph::build(&cfg, &shape);
    assert_eq!(
        (g.prefill.phase, g.decode.phase),
        (Phase::Prefill, Phase::Decode)
    );
    assert_eq!((g.decode.tokens, g.decode.context), (4, 3000));
    // Model-level calls bracket the layers.
    let first = &g.decode.ops[0];
    assert_eq!(first.kind, OpKind::Embedding);
    assert_eq!(first.outputs[0].dims, [4, 7168]);
    let last = g.decode.ops.last().unwrap();
    assert_eq!(last.kind, OpKind::LmHead);
    assert_eq!(last.outputs[0].dims, [4, 129280]);
    // Layer 5, decode: absorbed query [4, 128, 576] over the 3000-token latent cache, top-2048.
    let attn = g
        .decode
        .ops
        .iter()
        .find(|c| c.layer == Some(5) && c.kind == OpKind::SparseMlaAttention(Phase::Decode))
        .unwrap();
    assert_eq!(attn.name, "layers.5.self_attn.attention");
    assert_eq!(attn.inputs[0].dims, [4, 128, 576]);
    assert_eq!(attn.inputs[1].dims, [3000, 576]);
    assert_eq!(attn.inputs[2].dims, [4, 2048]);
    assert_eq!((attn.param("D"), attn.param("DV")), (Some(576), Some(512)));
    // Prefill shorter than index_topk selects every key.
    let topk = g
        .prefill
        .ops
        .iter()
        .find(|c| c.kind == OpKind::DsaTopk(Phase::Prefill))
        .unwrap();
    assert_eq!(topk.outputs[0].dims, [100, 100]);
    // q_a_proj of layer 0: [100, 7168] · [1536, 7168]ᵀ.
    let qa = g
        .prefill
        .ops
        .iter()
        .find(|c| c.name == "layers.0.self_attn.q_a_proj")
        .unwrap();
    assert_eq!(qa.kind, OpKind::Linear);
    assert_eq!(qa.signature(), "x[100,7168] w[1536,7168] -> y[100,1536]");
    // MoE layers route 8 of 256 experts; dense layers do not route.
    let routers = g
        .decode
        .ops
        .iter()
        .filter(|c| matches!(c.kind, OpKind::MoeRouter(_)))
        .count();
    assert_eq!(routers, 58);
    // Every layer is present in both graphs, in order.
    let layers: Vec<usize> = g.decode.ops.iter().filter_map(|c| c.layer).collect();
    assert!(layers.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(layers.last(), Some(&60));
}

#[test]
fn coverage_counts_add_up() {
    for f in [
        "deepseek_v32_config.json",
        "kimi_k2_config.json",
        "qwen3_next_config.json",
        "kimi_linear_config.json",
        "day0_hybrid_config.json",
        "unknown_layer_kind_config.json",
    ] {
        let c = inventory(&testdata(f)).unwrap();
        let total: usize = c.counts().iter().map(|(_, n)| n).sum();
        assert_eq!(total, c.rows.len(), "{f}");
        // Every kernel-backed row names at least one kernel.
        for r in &c.rows {
            if r.status != Status::Missing {
                assert!(!r.kernels.is_empty(), "{f}: {} has no kernel", r.op);
            }
        }
        // One line per row in the table, plus header and summary lines.
        assert!(c.table().lines().count() >= c.rows.len() + 4, "{f}");
    }
}

#[test]
fn malformed_config_is_an_error_not_a_panic() {
    let e = inventory(&testdata("malformed_config.json")).unwrap_err();
    assert!(e.to_string().contains("malformed_config.json"), "{e}");
}
