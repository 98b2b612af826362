//! # kernels — the operator library
//!
//! Operators grouped by family, each with a float64 reference ([`mod@reference`]) and one or more DSL
//! implementations; [`registry`] maps operator names to their implementations so one can be
//! swapped for another with an equivalence check and a cycle comparison.

pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod gemm;
pub mod gemm_fp8;
pub mod hand_tuned;
pub mod layout;
pub mod linear;
pub mod linear_attention;
pub mod moe;
pub mod norm;
pub mod reference;
pub mod registry;
pub mod rope;
pub mod softmax;
pub mod split_k;
pub mod testdata;
pub mod tile_choice;
pub mod tile_order;
pub mod tunable;
pub mod vision;
pub mod weight;
