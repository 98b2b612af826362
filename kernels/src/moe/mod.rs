//! The MoE family: expert GEMMs over MXFP4 (online dequantization), FP8 block-scaled and bf16
//! weights, and the SwiGLU expert FFN built on them.

pub mod expert_gemm;
