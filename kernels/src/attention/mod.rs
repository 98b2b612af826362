//! # Attention family
//!
//! Prefill and decode attention (grouped-query / multi-query heads, causal), DeepSeek-V3
//! multi-head latent attention (MLA, naive and weight-absorbed forms), attention over an FP8 E4M3
//! KV cache ([`fp8_kv`]: GQA and MLA decode, DSA indexer and sparse attention) and DeepSeek-V3.2
//! indexed sparse attention (DSA, decode and prefill:
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

use dsl_core::{Backend, Launcher, SimError, Tensor};

/// The `sinks [heads, 1]` argument of the grouped-query attention kernels (gpt-oss's attention
/// sinks: one logit per query head in every softmax's denominator, see
/// [`reference::attention_prefill_sinks`]): `values` when given, else −∞ for every head (a model
/// without sinks). Shape-only where `launcher` runs cost-only.
pub fn sinks_tensor(
    launcher: &Launcher,
    kernel: &str,
    heads: usize,
    values: Option<&[f32]>,
) -> Result<Tensor<f32>, SimError> {
    if launcher.backend != Backend::Functional {
        return Ok(Tensor::shape_only(&[heads, 1]));
    }
    let none = vec![f32::NEG_INFINITY; heads];
    let v = values.unwrap_or(&none);
    if v.len() != heads {
        return Err(SimError::Launch {
            kernel: kernel.into(),
            message: format!(
                "attention sinks: one logit per query head ({heads}), got {}",
                v.len()
            ),
        });
    }
    Tensor::from_f32(&[heads, 1], v).map_err(|message| SimError::Launch {
        kernel: kernel.into(),
        message,
    })
}
