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
    /// Written against accel-sim's lower-level API ([`accel_sim::manual`], in
    /// [`crate::hand_tuned`]): explicit SRAM placement, DMA queues, events and barriers.
    HandTuned,
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
            op: "gemm",
            kind: ImplKind::HandTuned,
            meta: &crate::hand_tuned::gemm::META,
            summary: "persistent GEMM on accel-sim's manual API: placed STAGES-deep load ring, explicit events, overwrite-mode first K-step (no zero fill), two accumulators so each store overlaps the next tile",
        },
        Implementation {
            op: "gemm_fp8",
            kind: ImplKind::DslTuned,
            meta: &crate::gemm_fp8::gemm_fp8::META,
            summary: "block-scaled FP8 GEMM (DeepGEMM layout, bf16 out): 2 or 4 pipeline stages, BN down to 16 to fill the cores on decode shapes, tiles in L2-friendly bands",
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
            op: "rmsnorm_residual",
            kind: ImplKind::Dsl,
            meta: &crate::norm::rmsnorm_residual_looped::META,
            summary: "residual add + RMSNorm for rows of any width: two passes over BH-wide column tiles",
        },
        Implementation {
            op: "rmsnorm",
            kind: ImplKind::Dsl,
            meta: &crate::norm::rmsnorm::META,
            summary: "RMSNorm without residual, whole row in one tile (BH >= H); per-head on a [T*H, D] view",
        },
        Implementation {
            op: "rmsnorm",
            kind: ImplKind::Dsl,
            meta: &crate::norm::rmsnorm_looped::META,
            summary: "RMSNorm for rows of any width: two passes over BH-wide column tiles",
        },
        Implementation {
            op: "layernorm",
            kind: ImplKind::Dsl,
            meta: &crate::norm::layernorm::META,
            summary: "LayerNorm (biased variance, weight and bias), whole row in one tile (BH >= H)",
        },
        Implementation {
            op: "layernorm",
            kind: ImplKind::Dsl,
            meta: &crate::norm::layernorm_looped::META,
            summary: "LayerNorm for rows of any width: three passes over BH-wide column tiles",
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
            op: "gelu",
            kind: ImplKind::Dsl,
            meta: &crate::elementwise::gelu::META,
            summary: "element-wise GELU, exact (erf) or tanh form (vision MLPs, patch merger)",
        },
        Implementation {
            op: "linear_bias",
            kind: ImplKind::Dsl,
            meta: &crate::linear::linear_bias::META,
            summary: "y = x * w^T + bias (vision projections, patch embedding): bias added on chip before the store",
        },
        Implementation {
            op: "attention_varlen",
            kind: ImplKind::Dsl,
            meta: &crate::attention::varlen::varlen_attention::META,
            summary: "bidirectional attention over packed segments of different lengths (cu_seqlens: one image each)",
        },
        Implementation {
            op: "scatter_rows",
            kind: ImplKind::Dsl,
            meta: &crate::vision::scatter::scatter_rows::META,
            summary: "rows written or added at indexed positions (image embeddings into the prompt, DeepStack injection)",
        },
        Implementation {
            op: "pos_embed_bilinear",
            kind: ImplKind::Dsl,
            meta: &crate::vision::pos_embed::pos_embed_bilinear::META,
            summary: "learned position embeddings bilinearly interpolated to a patch grid (four weighted table rows per patch)",
        },
        Implementation {
            op: "add",
            kind: ImplKind::Dsl,
            meta: &crate::elementwise::add::META,
            summary: "element-wise a + b (residual adds), f32 tiles",
        },
        Implementation {
            op: "add_bias",
            kind: ImplKind::Dsl,
            meta: &crate::elementwise::add_bias::META,
            summary: "x + b with one bias row (attention q/k/v projection biases), f32 tiles",
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
            op: "mul_col",
            kind: ImplKind::Dsl,
            meta: &crate::elementwise::mul_col::META,
            summary: "x * s with one scale per row (Llama-4's router score on an expert's input, a NoPE layer's attention temperature)",
        },
        Implementation {
            op: "kv_cache_append",
            kind: ImplKind::Dsl,
            meta: &crate::attention::kv_append::kv_cache_append::META,
            summary: "write new K/V (or latent) rows into a paged pool through a slot mapping (a pool row per new row, any number of sequences)",
        },
        Implementation {
            op: "kv_cache_append_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::kv_cache_append_fp8::META,
            summary: "quantise new K/V rows into an FP8 E4M3 paged pool, one scale per token and head",
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
            op: "moe_router_softmax_bias_topk",
            kind: ImplKind::Dsl,
            meta: &crate::moe::router::router_softmax_bias_topk::META,
            summary: "ERNIE-4.5 router, one token per program: row softmax, top-k on probability \
                      plus a correction bias, unbiased weights renormalised",
        },
        Implementation {
            op: "moe_dispatch",
            kind: ImplKind::Dsl,
            meta: &crate::moe::dispatch::moe_dispatch::META,
            summary: "gathers token rows into expert order (a tile of row indices per program, rows four at a time)",
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
        Implementation {
            op: "attention_prefill",
            kind: ImplKind::Dsl,
            meta: &crate::attention::prefill::flash_prefill::META,
            summary: "flash attention prefill: causal, GQA, online softmax; run-time head dims in covering BD/BDV tiles",
        },
        Implementation {
            op: "attention_prefill",
            kind: ImplKind::DslTuned,
            meta: &crate::attention::prefill::flash_prefill_pipelined::META,
            summary: "flash attention prefill, software-pipelined as FlashAttention-3: the next key block's scores overlap this block's softmax; K/V prefetched",
        },
        Implementation {
            op: "attention_decode",
            kind: ImplKind::Dsl,
            meta: &crate::attention::decode::paged_decode_split::META,
            summary: "split-KV paged decode (flash-decoding): BK keys of a page at a time, run-time head dims and page size",
        },
        Implementation {
            op: "attention_decode",
            kind: ImplKind::HandTuned,
            meta: &crate::hand_tuned::paged_decode::META,
            summary: "split-KV paged decode on accel-sim's manual API: the split's block table in one load, a STAGES-deep key/value ring across pages, scores one block ahead of the softmax, scale folded into the queries, only partial blocks masked",
        },
        Implementation {
            op: "attention_decode_batch",
            kind: ImplKind::Dsl,
            meta: &crate::attention::decode::paged_decode_gqa_batch::META,
            summary: "batched GQA split-KV paged decode: S sequences, their own block tables and lengths, one launch over a shared pool",
        },
        Implementation {
            op: "attention_decode_batch",
            kind: ImplKind::HandTuned,
            meta: &crate::hand_tuned::paged_decode::META,
            summary: "the hand-tuned split-KV paged decode over S sequences (each its block-table row and length): the model's swap for paged_decode_gqa_batch (`--impl attention_decode_batch=paged_decode_hand`)",
        },
        Implementation {
            op: "attention_decode_latent",
            kind: ImplKind::DslTuned,
            meta: &crate::attention::decode::paged_decode_latent::META,
            summary: "MLA latent split-KV decode reading each latent row once (values = the keys' first dv columns, as FlashMLA); next block prefetched",
        },
        Implementation {
            op: "attention_decode_combine",
            kind: ImplKind::Dsl,
            meta: &crate::attention::decode::decode_combine::META,
            summary: "merges split-KV partials by their log-sum-exp",
        },
        Implementation {
            op: "attention_decode_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::paged_decode_split_fp8::META,
            summary: "split-KV paged decode over an FP8 E4M3 cache with per-token scales",
        },
        Implementation {
            op: "attention_decode_batch_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::paged_decode_gqa_batch_fp8::META,
            summary: "batched GQA split-KV paged decode over FP8 E4M3 key and value pools (one scale per token and key/value head): S sequences, their own block tables and lengths, windows and sinks, one launch",
        },
        Implementation {
            op: "attention_decode_latent_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::paged_decode_latent_fp8::META,
            summary: "MLA latent split-KV decode over an FP8 E4M3 latent cache (one scale per token): codes converted on chip, scales on the score and probability columns; pipelined as attention_decode_latent",
        },
        Implementation {
            op: "kv_cache_gather_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::gather_dequant_fp8::META,
            summary: "gathers rows of an FP8 paged pool, dequantised to f32 (a prefill chunk's cached context)",
        },
        Implementation {
            op: "dsa_indexer_decode",
            kind: ImplKind::Dsl,
            meta: &crate::attention::sparse::indexer_decode::META,
            summary: "DSA lightning indexer for one query token, one program per page",
        },
        Implementation {
            op: "dsa_indexer_decode_batch",
            kind: ImplKind::Dsl,
            meta: &crate::attention::sparse::indexer_decode_batch::META,
            summary: "DSA lightning indexer for one query token of each of S sequences: own block tables and lengths, pages past a length written -inf unread",
        },
        Implementation {
            op: "dsa_indexer_prefill",
            kind: ImplKind::Dsl,
            meta: &crate::attention::sparse::indexer_prefill::META,
            summary: "DSA lightning indexer for a block of query tokens, future pages skipped",
        },
        Implementation {
            op: "dsa_topk",
            kind: ImplKind::Dsl,
            meta: &crate::attention::sparse::topk_select::META,
            summary: "per-query top-k over the causal candidates, deterministic ties",
        },
        Implementation {
            op: "dsa_topk_batch",
            kind: ImplKind::Dsl,
            meta: &crate::attention::sparse::topk_select_batch::META,
            summary: "top-k of one decode row per sequence over its own context length",
        },
        Implementation {
            op: "sparse_mla",
            kind: ImplKind::Dsl,
            meta: &crate::attention::sparse::sparse_mla::META,
            summary: "absorbed latent MQA over each query's gathered top-k rows",
        },
        Implementation {
            op: "sparse_mla_batch",
            kind: ImplKind::Dsl,
            meta: &crate::attention::sparse::sparse_mla_batch::META,
            summary: "batched DSA decode attention: one token of each of S sequences over its own selection, table and length",
        },
        Implementation {
            op: "dsa_indexer_decode_batch_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::indexer_decode_batch_fp8::META,
            summary: "dsa_indexer_decode_batch over FP8 E4M3 keys (one scale per token): codes converted on chip, each key's scale on its finished score",
        },
        Implementation {
            op: "dsa_indexer_prefill_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::indexer_prefill_fp8::META,
            summary: "dsa_indexer_prefill over FP8 E4M3 keys: a key tile converted once for every index head, the scales on the summed scores' columns",
        },
        Implementation {
            op: "sparse_mla_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::sparse_mla_fp8::META,
            summary: "sparse_mla over an FP8 E4M3 latent cache (one scale per token): codes and scales gathered together, codes converted on chip, scales on the score and probability columns",
        },
        Implementation {
            op: "sparse_mla_batch_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::attention::fp8_kv::sparse_mla_batch_fp8::META,
            summary: "sparse_mla_batch over an FP8 E4M3 latent cache, read as sparse_mla_fp8",
        },
        Implementation {
            op: "gdn_gates",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::gates::gdn_gates::META,
            summary: "Gated DeltaNet gates: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)",
        },
        Implementation {
            op: "gated_rmsnorm_silu",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::gates::gated_rmsnorm_silu::META,
            summary: "Qwen3-Next gated output norm RMSNorm(o) w SiLU(z) per value head",
        },
        Implementation {
            op: "kda_gates",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::gates::kda_gates::META,
            summary: "KDA gates: g = -exp(A_log[h]) softplus(f + dt_bias) per key channel, beta = sigmoid(b)",
        },
        Implementation {
            op: "gated_rmsnorm_sigmoid",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::gates::gated_rmsnorm_sigmoid::META,
            summary: "Kimi Linear gated output norm RMSNorm(o) w sigmoid(z) per head",
        },
        Implementation {
            op: "short_conv",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::conv::short_conv4::META,
            summary: "causal depthwise convolution (4 taps) with SiLU and a rolling state",
        },
        Implementation {
            op: "short_conv",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::conv::short_conv::META,
            summary: "causal depthwise convolution with any tap count, inputs read from [state; x]",
        },
        Implementation {
            op: "short_conv",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::conv::short_conv_chunked::META,
            summary: "causal depthwise convolution of a prompt: token blocks loaded once, taps as row shifts",
        },
        Implementation {
            op: "short_conv_decode",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::conv::short_conv_decode::META,
            summary: "one token per sequence of a batch, each sequence's conv state in its own slot",
        },
        Implementation {
            op: "zero_state",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::conv::zero_state::META,
            summary: "device memset of a new sequence's recurrent and conv state",
        },
        Implementation {
            op: "delta_rule_recurrent",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::recurrent::recurrent_delta::META,
            summary: "gated delta rule token by token (GDN decode), state in SRAM",
        },
        Implementation {
            op: "delta_rule_recurrent_kda",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::recurrent::recurrent_delta_kda::META,
            summary: "gated delta rule with per-channel decay (KDA decode)",
        },
        Implementation {
            op: "delta_rule_chunked",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::chunked::chunked_delta::META,
            summary: "gated delta rule in chunks (GDN prefill), matrix-unit work per chunk",
        },
        Implementation {
            op: "delta_rule_chunked_kda",
            kind: ImplKind::Dsl,
            meta: &crate::linear_attention::chunked::chunked_delta_kda::META,
            summary: "chunked gated delta rule with per-channel decay (KDA prefill)",
        },
        Implementation {
            op: "copy",
            kind: ImplKind::Dsl,
            meta: &crate::layout::copy::META,
            summary: "strided 2-D copy (layout changes between views)",
        },
        Implementation {
            op: "expert_gemm",
            kind: ImplKind::Dsl,
            meta: &crate::moe::expert_gemm::expert_gemm::META,
            summary: "per-expert GEMM over bf16/f32 expert weights",
        },
        Implementation {
            op: "expert_gemm_mxfp4",
            kind: ImplKind::Dsl,
            meta: &crate::moe::expert_gemm::expert_gemm_mxfp4::META,
            summary: "per-expert GEMM with MXFP4 weights dequantized on chip",
        },
        Implementation {
            op: "expert_gemm_mxfp4",
            kind: ImplKind::HandTuned,
            meta: &crate::hand_tuned::expert_gemm_mxfp4::META,
            summary: "MXFP4 expert GEMM on accel-sim's manual API: two placed dequantization buffers so the vector unit dequantizes step j+1 while the matrix unit multiplies step j, STAGES-deep load ring, overwrite-mode first K-step",
        },
        Implementation {
            op: "expert_gemm_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::moe::expert_gemm::expert_gemm_fp8::META,
            summary: "per-expert GEMM with FP8 E4M3 block-scaled weights",
        },
        Implementation {
            op: "dequant_mxfp4",
            kind: ImplKind::Dsl,
            meta: &crate::moe::expert_gemm::dequant_mxfp4_experts::META,
            summary: "offline MXFP4 to bf16 conversion of expert weights",
        },
        Implementation {
            op: "linear_bf16",
            kind: ImplKind::DslTuned,
            meta: &crate::linear::linear_cast::META,
            summary: "linear layer over a bf16 weight, f32 activations rounded to bf16 on chip",
        },
        Implementation {
            op: "linear_heads",
            kind: ImplKind::Dsl,
            meta: &crate::linear::linear_heads::META,
            summary: "per-head linear maps in one launch (MLA's absorbed projections through kv_b_proj's head slices)",
        },
        Implementation {
            op: "act_quant_fp8",
            kind: ImplKind::Dsl,
            meta: &crate::linear::act_quant_fp8::META,
            summary: "per-token, per-128-column E4M3 quantization of activations (W8A8 input)",
        },
        Implementation {
            op: "linear_fp8",
            kind: ImplKind::DslTuned,
            meta: &crate::linear::linear_fp8::META,
            summary: "W8A8 linear layer over a 128x128 block-FP8 weight, FP8 matrix rate",
        },
        Implementation {
            op: "linear_fp8",
            kind: ImplKind::DslTuned,
            meta: &crate::linear::linear_fp8w::META,
            summary: "W8A16 linear layer over a block-FP8 weight for matrix units without FP8",
        },
        Implementation {
            op: "linear",
            kind: ImplKind::DslTuned,
            meta: &crate::split_k::linear_split_k::META,
            summary: "split-K linear layer for decode shapes: K shared over the cores the output tiles leave idle, partials summed by split_k_reduce",
        },
        Implementation {
            op: "linear_bf16",
            kind: ImplKind::DslTuned,
            meta: &crate::split_k::linear_cast_split_k::META,
            summary: "split-K linear layer over a bf16 weight (decode shapes)",
        },
        Implementation {
            op: "linear_fp8",
            kind: ImplKind::DslTuned,
            meta: &crate::split_k::linear_fp8_split_k::META,
            summary: "split-K W8A8 linear layer over a block-FP8 weight (decode shapes)",
        },
        Implementation {
            op: "linear_fp8",
            kind: ImplKind::DslTuned,
            meta: &crate::split_k::linear_fp8w_split_k::META,
            summary: "split-K W8A16 linear layer over a block-FP8 weight (decode shapes, no FP8 matrix mode)",
        },
        Implementation {
            op: "split_k_reduce",
            kind: ImplKind::Dsl,
            meta: &crate::split_k::split_k_reduce::META,
            summary: "sums a split-K product's partial rows (one tile per output row)",
        },
        Implementation {
            op: "moe_grouped_linear_bf16",
            kind: ImplKind::DslTuned,
            meta: &crate::moe::grouped::grouped_linear_cast::META,
            summary: "grouped expert GEMM over bf16 weights, f32 rows rounded on chip",
        },
        Implementation {
            op: "moe_grouped_linear_fp8",
            kind: ImplKind::DslTuned,
            meta: &crate::moe::grouped::grouped_linear_fp8::META,
            summary: "W8A8 grouped expert GEMM over block-FP8 weights",
        },
        Implementation {
            op: "moe_grouped_linear_fp8",
            kind: ImplKind::DslTuned,
            meta: &crate::moe::grouped::grouped_linear_fp8w::META,
            summary: "W8A16 grouped expert GEMM over block-FP8 weights (no FP8 matrix mode)",
        },
        Implementation {
            op: "moe_grouped_linear_int4",
            kind: ImplKind::Dsl,
            meta: &crate::moe::grouped::grouped_linear_int4::META,
            summary: "W4A16 grouped expert GEMM over packed group-scaled INT4 weights (compressed-tensors pack-quantized), dequantized tile by tile in SRAM",
        },
        Implementation {
            op: "moe_grouped_linear_mxfp4",
            kind: ImplKind::DslTuned,
            meta: &crate::moe::grouped::grouped_linear_mxfp4::META,
            summary: "grouped expert GEMM over packed MXFP4 weights, dequantized tile by tile in SRAM",
        },
        Implementation {
            op: "moe_grouped_linear_mxfp4",
            kind: ImplKind::HandTuned,
            meta: &crate::hand_tuned::expert_gemm_mxfp4::GROUPED_META,
            summary: "grouped MXFP4 expert GEMM on accel-sim's manual API (the model's layout, run-time row ranges read on chip): two placed dequantization and two activation-cast buffers so the vector unit prepares step j+1 while the matrix unit multiplies step j, STAGES-deep load ring, overwrite-mode first K-step",
        },
        Implementation {
            op: "swiglu",
            kind: ImplKind::Dsl,
            meta: &crate::moe::expert_gemm::swiglu::META,
            summary: "SiLU(gate) * up of a fused gate/up output",
        },
        Implementation {
            op: "swiglu_clamped",
            kind: ImplKind::Dsl,
            meta: &crate::moe::expert_gemm::swiglu_clamped::META,
            summary: "gpt-oss's clamped SwiGLU: (clamp(up, ±limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit)",
        },
        Implementation {
            op: "moe_grouped_bias",
            kind: ImplKind::Dsl,
            meta: &crate::moe::grouped::grouped_add_bias::META,
            summary: "per-expert bias rows added in place to expert-grouped rows (gpt-oss's expert biases)",
        },
    ]
}

/// Implementations of `op`.
pub fn implementations(op: &str) -> Vec<Implementation> {
    all().into_iter().filter(|i| i.op == op).collect()
}
