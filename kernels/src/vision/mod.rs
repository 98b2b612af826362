//! # Vision family: the operators a vision encoder adds to a multimodal model
//!
//! Qwen2/3-VL-style vision transformers and their hand-off to the language model. Most of a vision
//! block runs on kernels of other families (LayerNorm in [`crate::norm`], projections with bias in
//! [`crate::linear::linear_bias()`], GELU in [`crate::elementwise::gelu()`], 2D rotary positions
//! through [`crate::rope::rope()`] with the tables of [`rotary`], bidirectional attention over
//! images of different sizes in [`crate::attention::varlen`]); this module holds the rest:
//!
//! - [`scatter`]: rows written (or added) at positions given by an index list — image embeddings
//!   placed at the prompt's image placeholders, and DeepStack's injection of intermediate vision
//!   features into the early language layers' hidden states at those positions;
//! - [`pos_embed`]: learned position embeddings of a fixed grid, bilinearly interpolated to an
//!   image's patch grid (a gather of four table rows per patch, weighted);
//! - [`rotary`]: the cos/sin tables of the vision tower's 2D rotary embedding (row and column
//!   positions of each patch) and of the text model's multi-axis (temporal, height, width) RoPE.
//!
//! [`reference`](mod@reference) holds their float64 semantics.

pub mod pos_embed;
pub mod reference;
pub mod rotary;
pub mod scatter;
