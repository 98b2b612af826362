//! # Linear attention with a recurrent state
//!
//! Gated DeltaNet (Qwen3-Next) and KDA (Kimi Linear): attention whose memory is a fixed-size
//! matrix per value head, `S [dk, dv]`, updated token by token with the gated delta rule — so a
//! sequence's state does not grow with its length, unlike a KV cache.
//!
//! - [`reference`](mod@reference): the float64 semantics (recurrent and chunked forms, short
//!   convolution, gates, gated output norm) every kernel here is checked against, itself checked
//!   against golden data from transformers (`tests/reference/gen_linear_attention.py`);
//! - [`recurrent`]: the decode kernels (one token at a time, state in SRAM);
//! - [`chunked`]: the prefill kernels (chunks of `C` tokens, UT transform on the matrix unit);
//! - [`conv`]: the short causal convolution with its rolling state, and the state zero fill;
//! - [`gates`]: the Gated DeltaNet gates and the gated output norm;
//! - [`runner`]: random-input runs checked against the reference, cost-only runs, chunk sweeps.

pub mod chunked;
pub mod conv;
pub mod gates;
pub mod recurrent;
pub mod reference;
pub mod runner;
