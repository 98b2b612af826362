//! The MoE family: routers (DeepSeek-V3 sigmoid group-limited top-k, Qwen3-Next softmax top-k),
//! token dispatch and combine, the grouped expert GEMM over dispatched rows and the routed SwiGLU
//! FFN built on it; expert GEMMs over MXFP4 (online dequantization), FP8 block-scaled and bf16
//! weights; and their f64 references.

pub mod dispatch;
pub mod expert_gemm;
pub mod grouped;
pub mod reference;
pub mod router;
