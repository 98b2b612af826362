//! # Attention family
//!
//! Prefill and decode attention (grouped-query / multi-query heads, causal), DeepSeek-V3
//! multi-head latent attention (MLA, naive and weight-absorbed forms), decode over an FP8 E4M3
//! KV cache ([`fp8_kv`]) and DeepSeek-V3.2 indexed sparse attention (DSA, decode and prefill:
//! lightning indexer, top-k selection, sparse gather attention over the latent cache), and
//! bidirectional attention over packed variable-length segments ([`varlen`]: vision patches). [`reference`](mod@reference) holds the float64 semantics every attention kernel
//! is checked against; the DSL kernels ([`prefill`], ...) build on it.

pub mod decode;
pub mod fp8_kv;
pub mod kv_append;
pub mod prefill;
pub mod reference;
pub mod sparse;
pub mod varlen;
