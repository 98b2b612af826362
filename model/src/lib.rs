//! # model — the model layer
//!
//! Model configs, op graph, weights, parallel and memory plans, forward pass. So far it holds the
//! paged KV cache ([`kv_cache`]): page pool, per-sequence block tables, and the per-layer cache
//! geometry a memory plan sizes the pool from.

pub mod kv_cache;
