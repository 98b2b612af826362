//! The kernel registry: operator name → implementations.
//!
//! An operator can have several implementations (a DSL prototype, a double-buffered or hand-tuned
//! replacement). They share the operator's f64 reference, so swapping one for another is a one-line
//! change checked for equivalence and compared in cycles.

use dsl_core::KernelMeta;

/// How an implementation was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImplKind {
    /// A `#[kernel]` DSL prototype.
    Dsl,
    /// A DSL kernel tuned by hand (explicit prefetch, buffering).
    DslTuned,
}

/// One implementation of an operator.
#[derive(Debug, Clone, Copy)]
pub struct Implementation {
    /// Operator name (`gemm`, `softmax`, `rmsnorm_residual`, `linear`, `rope`, ...).
    pub op: &'static str,
    /// How it was written.
    pub kind: ImplKind,
    /// The kernel's metadata (name, tunables, lines).
    pub meta: &'static KernelMeta,
    /// One line on what distinguishes it.
    pub summary: &'static str,
}

/// Every registered implementation.
pub fn all() -> Vec<Implementation> {
    vec![
        Implementation {
            op: "gemm",
            kind: ImplKind::Dsl,
            meta: &crate::gemm::gemm::META,
            summary: "tiled GEMM, synchronous loads (DMA and matrix unit serialise)",
        },
        Implementation {
            op: "gemm",
            kind: ImplKind::DslTuned,
            meta: &crate::gemm::gemm_db::META,
            summary: "tiled GEMM, double-buffered K loop (DMA overlaps the matrix unit)",
        },
        Implementation {
            op: "gemm",
            kind: ImplKind::DslTuned,
            meta: &crate::gemm::gemm_pipelined::META,
            summary: "tiled GEMM, three K-steps in flight (hides DMA latency longer than one step)",
        },
        Implementation {
            op: "gemm",
            kind: ImplKind::DslTuned,
            meta: &crate::gemm::gemm_persistent::META,
            summary: "persistent tiled GEMM: one program per core streams its tiles' K-steps (three in flight), storing each tile while the next computes",
        },
        Implementation {
            op: "softmax",
            kind: ImplKind::Dsl,
            meta: &crate::softmax::softmax::META,
            summary:
                "row softmax, online max/sum pass then normalise pass over column tiles (f32 math)",
        },
        Implementation {
            op: "rmsnorm_residual",
            kind: ImplKind::Dsl,
            meta: &crate::norm::rmsnorm_residual::META,
            summary: "residual add + RMSNorm, whole row in one tile (BH >= H), stores h and y",
        },
        Implementation {
            op: "rmsnorm",
            kind: ImplKind::Dsl,
            meta: &crate::norm::rmsnorm::META,
            summary: "RMSNorm without residual, whole row in one tile (BH >= H); per-head on a [T*H, D] view",
        },
        Implementation {
            op: "layernorm",
            kind: ImplKind::Dsl,
            meta: &crate::norm::layernorm::META,
            summary: "LayerNorm (biased variance, weight and bias), whole row in one tile (BH >= H)",
        },
        Implementation {
            op: "linear",
            kind: ImplKind::DslTuned,
            meta: &crate::linear::linear::META,
            summary: "y = x * w^T (weight [out, in]), double-buffered K loop, tiles picked per shape",
        },
        Implementation {
            op: "embedding",
            kind: ImplKind::Dsl,
            meta: &crate::embedding::embedding::META,
            summary: "token embedding: load_index per token, table row copied in column tiles",
        },
        Implementation {
            op: "rope",
            kind: ImplKind::Dsl,
            meta: &crate::rope::rope::META,
            summary: "rotary embedding per head (half-split or interleaved, partial span at an offset)",
        },
        Implementation {
            op: "add",
            kind: ImplKind::Dsl,
            meta: &crate::elementwise::add::META,
            summary: "element-wise a + b (residual adds), f32 tiles",
        },
        Implementation {
            op: "sigmoid_mul",
            kind: ImplKind::Dsl,
            meta: &crate::elementwise::sigmoid_mul::META,
            summary: "x * sigmoid(gate), same shapes (gated attention output)",
        },
        Implementation {
            op: "sigmoid_mul_col",
            kind: ImplKind::Dsl,
            meta: &crate::elementwise::sigmoid_mul_col::META,
            summary: "x * sigmoid(gate) with one gate per row (shared-expert gate)",
        },
        Implementation {
            op: "kv_cache_append",
            kind: ImplKind::Dsl,
            meta: &crate::attention::kv_append::kv_cache_append::META,
            summary: "write new K/V (or latent) rows into a paged pool through the block table",
        },
        Implementation {
            op: "moe_router_sigmoid_group_topk",
            kind: ImplKind::Dsl,
            meta: &crate::moe::router::router_sigmoid_group_topk::META,
            summary:
                "DeepSeek-V3 router, one token per program: biased sigmoid scores, top-2 group \
                      scores, kept groups merged into a running top-k, unbiased weights",
        },
        Implementation {
            op: "moe_router_softmax_topk",
            kind: ImplKind::Dsl,
            meta: &crate::moe::router::router_softmax_topk::META,
            summary: "Qwen3-Next router, one token per program: row softmax, top-k, renormalise",
        },
        Implementation {
            op: "moe_dispatch",
            kind: ImplKind::Dsl,
            meta: &crate::moe::dispatch::moe_dispatch::META,
            summary: "gathers token rows into expert order (one index read and row copy per row)",
        },
        Implementation {
            op: "moe_combine",
            kind: ImplKind::Dsl,
            meta: &crate::moe::dispatch::moe_combine::META,
            summary:
                "per-token gather of its K expert rows, weighted f32 sum onto a base (no scatter)",
        },
        Implementation {
            op: "moe_grouped_linear",
            kind: ImplKind::DslTuned,
            meta: &crate::moe::grouped::grouped_linear::META,
            summary:
                "grouped expert GEMM over run-time expert row ranges, double-buffered K loop; \
                      experts without rows skip their weights",
        },
    ]
}

/// Implementations of `op`.
pub fn implementations(op: &str) -> Vec<Implementation> {
    all().into_iter().filter(|i| i.op == op).collect()
}
