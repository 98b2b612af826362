//! # model — the model layer
//!
//! Model configs, op graph, weights, parallel and memory plans, forward pass. So far it holds:
//! - [`config`] / [`arch`]: Hugging Face `config.json` (DeepSeek-V3, Kimi-K2, DeepSeek-V3.2,
//!   Qwen3-Next, Kimi Linear) and day0's own hybrid schema, parsed into one normalised
//!   [`config::ModelConfig`] (errors name the field and the file; unknown fields are warnings);
//! - [`graph`]: the model as prefill and decode lists of operator calls with shapes;
//! - [`coverage`]: the release-day inventory — each operator's status (hand-tuned, DSL kernel,
//!   composite, missing) against the real `kernels` crate ([`coverage::inventory`]);
//! - [`kv_cache`]: the paged KV cache: page pool, per-sequence block tables, and the per-layer
//!   cache geometry a memory plan sizes the pool from;
//! - [`weights`]: safetensors checkpoints (single or sharded, memory-mapped) read as f32, the
//!   Hugging Face tensor names each architecture needs, and [`weights::verify`];
//! - [`forward`]: the numeric forward pass on the simulator (every operator a DSL kernel launch),
//!   greedy generation, and layer-by-layer validation against reference activations.

pub mod arch;
pub mod config;
pub mod coverage;
pub mod forward;
pub mod graph;
pub mod kv_cache;
pub mod plan;
pub mod state_slots;
pub mod vision;
pub mod weights;
