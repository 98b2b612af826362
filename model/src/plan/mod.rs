//! # Planning a deployment: models, parallel plans, memory plans, step times, plan search
//!
//! The numeric forward ([`crate::forward`]) runs one card. This module tree answers the questions
//! asked before a trillion-parameter model runs anywhere: how many parameters it has
//! ([`params`]), which split of the cluster serves it ([`parallel`]), whether its weights, KV
//! cache and activations fit each card ([`memory`]), how long a prefill and a decode step take
//! on each card role and over the collectives ([`estimate`]), and which plan wins ([`search`]).
//! Step times come from the cost-only forward itself, run at each card role's shard of the model;
//! collective costs come from `accel_sim::collective`.

pub mod estimate;
pub mod memory;
pub mod parallel;
pub mod params;
pub mod presets;
pub mod search;
