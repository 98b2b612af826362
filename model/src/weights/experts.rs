//! Routed-expert banks: one MoE layer's experts, the layouts checkpoints store them in, and
//! reading any of them as per-expert f32 matrices.
//!
//! | layout | tensors | who writes it |
//! |---|---|---|
//! | [`ExpertLayout::PerExpert`] | `<bank>.{e}.{gate,up,down}_proj.weight` (`[I, H]`, `[I, H]`, `[H, I]`; Kimi Linear `w1`/`w3`/`w2`) | the Hub's DeepSeek-V3/Kimi-K2/V3.2/Qwen3-Next checkpoints, transformers 5.24 `save_pretrained` |
//! | [`ExpertLayout::Fused`] | `<bank>.gate_up_proj [E, 2I, H]` (gate rows, then up rows: transformers `chunk(2)`), `<bank>.down_proj [E, H, I]` | transformers' in-memory parameters (`state_dict()`) |
//! | [`ExpertLayout::FusedInOut`] | `<bank>.gate_up_proj [E, H, 2I]` (gate columns, then up columns), `<bank>.down_proj [E, I, H]` | transformers ≤ 4.57's Qwen3-VL-MoE parameters (`x @ W`): the released Qwen3-VL-MoE checkpoints (transformers 5 transposes them on load) |
//! | [`ExpertLayout::Mxfp4`] | `<bank>.gate_up_proj_{blocks,scales}` (`[E, 2I, H/32, 16]`, `[E, 2I, H/32]`), `<bank>.down_proj_{blocks,scales}` (`[E, H, I/32, 16]`, `[E, H, I/32]`) | day0_hybrid's MXFP4 experts, in gpt-oss's packing |
//!
//! For MXFP4 the packing (nibble order, E8M0 scales, transformers' transpose on dequantisation) is
//! gpt-oss's, but the row order of `gate_up_proj` is day0's: gate rows then up rows, as in the
//! fused layout — gpt-oss itself interleaves them (and adds biases and a clamped SwiGLU), which no
//! model day0 reads uses.

use super::checkpoint::Checkpoint;
use super::convert::MXFP4_BLOCKS_SUFFIX;
use super::error::WeightError;
use super::names::{ExpectedTensor, Storage};

/// How a layer's routed experts are laid out in a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertLayout {
    /// `<bank>.{e}.<gate|up|down>.weight`, `[I, H]`, `[I, H]`, `[H, I]` (Hub checkpoints,
    /// transformers' `save_pretrained`).
    PerExpert,
    /// `<bank>.gate_up_proj [E, 2I, H]` and `<bank>.down_proj [E, H, I]` (transformers'
    /// in-memory parameters).
    Fused,
    /// `<bank>.gate_up_proj [E, H, 2I]` and `<bank>.down_proj [E, I, H]`: the fused matrices
    /// stored input-major (transformers ≤ 4.57's Qwen3-VL-MoE, the released checkpoints).
    FusedInOut,
    /// gpt-oss MXFP4 `<bank>.gate_up_proj_{blocks,scales}` and `<bank>.down_proj_{blocks,scales}`,
    /// dequantised shapes `[E, H, 2I]` and `[E, I, H]`.
    Mxfp4,
}

/// One MoE layer's routed experts: where they live and their sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpertBank {
    /// The layer.
    pub layer: usize,
    /// The name prefix, e.g. `model.layers.3.mlp.experts`.
    pub prefix: String,
    /// Routed experts `E`.
    pub experts: usize,
    /// Hidden size `H`.
    pub hidden: usize,
    /// Expert intermediate size `I`.
    pub intermediate: usize,
    /// Per-expert projection names: gate, up, down (`gate_proj`/`up_proj`/`down_proj`, Kimi
    /// Linear `w1`/`w3`/`w2`).
    pub projections: [&'static str; 3],
    /// The fused `gate_up` matrices interleave gate and up columns (`gate_up[..., ::2]` gate,
    /// `[..., 1::2]` up: gpt-oss, in every stored layout) instead of holding all gate columns
    /// first.
    pub interleaved: bool,
}

impl ExpertBank {
    /// The bank's tensors in `layout`.
    pub fn tensors(&self, layout: ExpertLayout) -> Vec<ExpectedTensor> {
        let (p, e, h, i) = (&self.prefix, self.experts, self.hidden, self.intermediate);
        match layout {
            ExpertLayout::PerExpert => {
                let [gate, up, down] = self.projections;
                (0..e)
                    .flat_map(|x| {
                        [
                            ExpectedTensor::float(format!("{p}.{x}.{gate}.weight"), vec![i, h]),
                            ExpectedTensor::float(format!("{p}.{x}.{up}.weight"), vec![i, h]),
                            ExpectedTensor::float(format!("{p}.{x}.{down}.weight"), vec![h, i]),
                        ]
                    })
                    .collect()
            }
            ExpertLayout::Fused => vec![
                ExpectedTensor::float(format!("{p}.gate_up_proj"), vec![e, 2 * i, h]),
                ExpectedTensor::float(format!("{p}.down_proj"), vec![e, h, i]),
            ],
            ExpertLayout::FusedInOut => vec![
                ExpectedTensor::float(format!("{p}.gate_up_proj"), vec![e, h, 2 * i]),
                ExpectedTensor::float(format!("{p}.down_proj"), vec![e, i, h]),
            ],
            ExpertLayout::Mxfp4 => vec![
                ExpectedTensor {
                    name: format!("{p}.gate_up_proj"),
                    shape: vec![e, h, 2 * i],
                    required: true,
                    storage: Storage::Mxfp4,
                },
                ExpectedTensor {
                    name: format!("{p}.down_proj"),
                    shape: vec![e, i, h],
                    required: true,
                    storage: Storage::Mxfp4,
                },
            ],
        }
    }

    /// The layout `ckpt` stores this bank in, judged by a marker tensor of each layout (and,
    /// for the fused matrices, by which way round they are: `gate_up_proj`'s shape, or
    /// `down_proj`'s when `H = 2I` makes the first square); `None` when it holds none of them.
    pub fn detect(&self, ckpt: &Checkpoint) -> Option<ExpertLayout> {
        let p = &self.prefix;
        let (e, h, i) = (self.experts, self.hidden, self.intermediate);
        if ckpt.contains(&format!("{p}.gate_up_proj{MXFP4_BLOCKS_SUFFIX}")) {
            Some(ExpertLayout::Mxfp4)
        } else if let Some(gate_up) = ckpt.shape(&format!("{p}.gate_up_proj")) {
            let in_out = if h != 2 * i {
                gate_up == [e, h, 2 * i]
            } else {
                ckpt.shape(&format!("{p}.down_proj")) == Some(&[e, i, h][..])
            };
            Some(if in_out {
                ExpertLayout::FusedInOut
            } else {
                ExpertLayout::Fused
            })
        } else if ckpt.contains(&format!("{p}.0.{}.weight", self.projections[0])) {
            Some(ExpertLayout::PerExpert)
        } else {
            None
        }
    }
}

/// One MoE layer's routed experts as f32, whatever the layout they were stored in: per expert,
/// PyTorch `nn.Linear` layout (`[out, in]`), experts outermost.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertWeights {
    /// The layout they were read from.
    pub layout: ExpertLayout,
    /// Gate projections `[E, I, H]`.
    pub gate: Vec<f32>,
    /// Up projections `[E, I, H]`.
    pub up: Vec<f32>,
    /// Down projections `[E, H, I]`.
    pub down: Vec<f32>,
}

impl ExpertBank {
    /// Reads the bank in the layout `ckpt` stores it in ([`ExpertBank::detect`]) as per-expert
    /// f32 matrices. Shapes are checked against the bank's sizes; an absent bank is a
    /// [`WeightError::MissingTensor`] for its first per-expert tensor.
    pub fn load_f32(&self, ckpt: &Checkpoint) -> Result<ExpertWeights, WeightError> {
        let (e, h, i) = (self.experts, self.hidden, self.intermediate);
        let layout = self.detect(ckpt).unwrap_or(ExpertLayout::PerExpert);
        let t = self.tensors(layout);
        let (gate, up, down) = match layout {
            ExpertLayout::PerExpert => {
                let mut parts = [Vec::new(), Vec::new(), Vec::new()];
                for (k, x) in t.iter().enumerate() {
                    parts[k % 3].extend(ckpt.f32(&x.name, &x.shape)?);
                }
                let [gate, up, down] = parts;
                (gate, up, down)
            }
            ExpertLayout::Fused => {
                let gate_up = ckpt.f32(&t[0].name, &t[0].shape)?;
                let down = ckpt.f32(&t[1].name, &t[1].shape)?;
                // [E, 2I, H]: per expert, I gate rows then I up rows.
                let mut gate = Vec::with_capacity(e * i * h);
                let mut up = Vec::with_capacity(e * i * h);
                for x in gate_up.chunks_exact(2 * i * h) {
                    gate.extend_from_slice(&x[..i * h]);
                    up.extend_from_slice(&x[i * h..]);
                }
                (gate, up, down)
            }
            ExpertLayout::FusedInOut => {
                let gate_up = ckpt.f32(&t[0].name, &t[0].shape)?;
                let down_t = ckpt.f32(&t[1].name, &t[1].shape)?;
                out_in(&gate_up, &down_t, e, h, i, self.interleaved)
            }
            ExpertLayout::Mxfp4 => {
                // Dequantised shapes are input-major: gate_up [E, H, 2I], down [E, I, H].
                let gate_up = ckpt.mxfp4_f32(&t[0].name, &t[0].shape)?;
                let down_t = ckpt.mxfp4_f32(&t[1].name, &t[1].shape)?;
                out_in(&gate_up, &down_t, e, h, i, self.interleaved)
            }
        };
        Ok(ExpertWeights {
            layout,
            gate,
            up,
            down,
        })
    }
}

/// Input-major fused experts (`gate_up [E, H, 2I]`, gate columns first, or gate and up columns
/// alternating when `interleaved`; `down [E, I, H]`) as per-expert `[out, in]` gate, up and down
/// matrices.
fn out_in(
    gate_up: &[f32],
    down_t: &[f32],
    e: usize,
    h: usize,
    i: usize,
    interleaved: bool,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (gate_col, up_col) = gate_up_columns(i, interleaved);
    let mut gate = vec![0.0; e * i * h];
    let mut up = vec![0.0; e * i * h];
    let mut down = vec![0.0; e * h * i];
    for x in 0..e {
        for c in 0..h {
            for r in 0..i {
                let src = (x * h + c) * 2 * i;
                gate[(x * i + r) * h + c] = gate_up[src + gate_col(r)];
                up[(x * i + r) * h + c] = gate_up[src + up_col(r)];
            }
        }
        for r in 0..i {
            for c in 0..h {
                down[(x * h + c) * i + r] = down_t[(x * i + r) * h + c];
            }
        }
    }
    (gate, up, down)
}

/// Where gate row `r` and up row `r` sit among a fused `gate_up`'s `2I` columns: `r` and `I + r`
/// (gate first), or `2r` and `2r + 1` (`interleaved`, gpt-oss).
pub fn gate_up_columns(
    i: usize,
    interleaved: bool,
) -> (impl Fn(usize) -> usize, impl Fn(usize) -> usize) {
    (
        move |r: usize| if interleaved { 2 * r } else { r },
        move |r: usize| if interleaved { 2 * r + 1 } else { i + r },
    )
}
