//! # State slots: per-sequence recurrent and convolution state of linear-attention layers
//!
//! A linear-attention layer (Gated DeltaNet, KDA) remembers a sequence with a fixed-size state
//! instead of a KV cache that grows with every token: per value head the delta-rule state
//! `S [dk, dv]`, and the short convolution's last `kernel − 1` inputs. Serving therefore needs, per
//! live sequence and per linear layer, one **slot** of constant size, taken when the sequence is
//! admitted, carried across every prefill chunk and decode step, and handed back when it ends —
//! the same lifecycle as the KV cache's pages ([`crate::kv_cache`]), without the growth. (vLLM's
//! "mamba cache" and transformers' `cache.get_recurrent_state` / `get_conv_state` hold the same
//! two tensors per layer.)
//!
//! [`StateSlots`] keeps, for every linear layer, one device tensor per state part laid out
//! `[capacity, ...]`; slot `i` of every layer belongs to the same sequence, so one slot number
//! names a sequence's whole state (as a block table names its KV pages). The state is f32 (the
//! delta-rule recurrence is sensitive to rounding; the reference code keeps it in f32 too).
//! A slot is zeroed on the device when handed out (a new sequence starts from `S = 0` and a zero
//! conv history), so a released slot's old contents never leak into the next sequence.
//!
//! [`StateSlots::layer_step`] runs one layer's stateful part for one sequence — short convolution
//! of q, k and v, then the gated delta rule, chunked for several tokens and recurrent for one —
//! reading and updating the sequence's slot in place. Prefill of N tokens followed by M decode
//! steps therefore continues exactly as one pass over N + M tokens (`model/tests/state_slots.rs`).
//!
//! Errors are values ([`StateSlotError`]): running out of slots is an ordinary event a scheduler
//! reacts to, and a failed operation leaves the slots unchanged.

use crate::kv_cache::{KvGeometry, SeqId};
use dsl_core::prelude::*;
use dsl_core::{Report, SimError};
use kernels::linear_attention::conv::{launch_short_conv, zero_state};
use kernels::linear_attention::reference::Decay;
use kernels::linear_attention::runner::{launch_delta, DeltaMode, DeltaTensors};
use std::collections::BTreeMap;
use std::fmt;

/// Taps of the short convolution in Qwen3-Next (`linear_conv_kernel_dim`) and Kimi Linear
/// (`short_conv_kernel_size`): both 4. Other releases use 2 to 8 ([`LinearLayerGeometry::conv_kernel`]).
pub const CONV_KERNEL: usize = 4;

/// Bytes per state element (f32).
const STATE_BYTES: u64 = 4;

/// The shape of one linear-attention layer's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearLayerGeometry {
    /// GDN (one decay per head) or KDA (one per key channel); the state shape is the same.
    pub decay: Decay,
    /// Query/key heads.
    pub k_heads: usize,
    /// Value heads (a multiple of `k_heads`): one `dk × dv` state each.
    pub v_heads: usize,
    /// Key head dimension.
    pub dk: usize,
    /// Value head dimension.
    pub dv: usize,
    /// Taps of the short convolution; the state keeps the inputs of the previous
    /// `max(conv_kernel − 1, 1)` tokens.
    pub conv_kernel: usize,
}

impl LinearLayerGeometry {
    /// The geometry of a model's linear-attention layers.
    pub fn of(l: &crate::config::LinearAttnDims) -> LinearLayerGeometry {
        LinearLayerGeometry {
            decay: match l.decay {
                crate::config::Decay::Scalar => Decay::Scalar,
                crate::config::Decay::PerChannel => Decay::PerChannel,
            },
            k_heads: l.key_heads,
            v_heads: l.value_heads,
            dk: l.key_head_dim,
            dv: l.value_head_dim,
            conv_kernel: l.conv_kernel,
        }
    }

    /// Checks the geometry: everything ≥ 1, `k_heads` divides `v_heads`.
    pub fn validate(&self) -> Result<(), StateSlotError> {
        if self.k_heads == 0
            || self.v_heads == 0
            || self.dk == 0
            || self.dv == 0
            || self.conv_kernel == 0
        {
            return Err(StateSlotError::InvalidGeometry {
                message: format!("{self:?}: heads, head dims and conv taps must be ≥ 1"),
            });
        }
        if self.v_heads / self.k_heads * self.k_heads != self.v_heads {
            return Err(StateSlotError::InvalidGeometry {
                message: format!(
                    "k_heads {} must divide v_heads {} (each key head serves a group of value \
                     heads)",
                    self.k_heads, self.v_heads
                ),
            });
        }
        Ok(())
    }

    /// Delta-rule state elements: `v_heads · dk · dv`.
    pub fn recurrent_elements(&self) -> usize {
        self.v_heads * self.dk * self.dv
    }

    /// Channels of the short convolution: q and k (`k_heads · dk` each) and v (`v_heads · dv`).
    pub fn conv_channels(&self) -> [usize; 3] {
        let qk = self.k_heads * self.dk;
        [qk, qk, self.v_heads * self.dv]
    }

    /// Rows of the convolution state: the inputs of the previous `conv_kernel − 1` tokens (one
    /// row kept for a 1-tap convolution, whose kernels still take a state).
    pub fn conv_rows(&self) -> usize {
        self.conv_kernel.saturating_sub(1).max(1)
    }

    /// Convolution state elements: `conv_rows · (2 · k_heads · dk + v_heads · dv)`.
    pub fn conv_elements(&self) -> usize {
        self.conv_rows() * self.conv_channels().iter().sum::<usize>()
    }

    /// State bytes of one sequence in this layer (recurrent + conv, f32) — whatever its length.
    pub fn bytes_per_sequence(&self) -> u64 {
        STATE_BYTES * (self.recurrent_elements() + self.conv_elements()) as u64
    }
}

/// What went wrong in a state-slot operation. Every failed operation leaves the slots unchanged.
#[derive(Debug, Clone, PartialEq)]
pub enum StateSlotError {
    /// Every slot is taken.
    OutOfSlots {
        /// The sequence that asked.
        seq: SeqId,
        /// Slots in the pool (all in use).
        capacity: usize,
    },
    /// The sequence id is not live (never allocated, or already released).
    UnknownSequence {
        /// The id given.
        seq: SeqId,
    },
    /// `allocate` was called for an id that is already live.
    DuplicateSequence {
        /// The id given.
        seq: SeqId,
    },
    /// A layer index past the linear layers.
    LayerOutOfRange {
        /// The index given.
        layer: usize,
        /// Linear layers held.
        layers: usize,
    },
    /// A geometry or input that cannot describe a layer step.
    InvalidGeometry {
        /// What is wrong and what to change.
        message: String,
    },
    /// A kernel launch failed (tile choice, SRAM, ...).
    Launch(SimError),
}

impl fmt::Display for StateSlotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StateSlotError::OutOfSlots { seq, capacity } => write!(
                f,
                "out of linear-attention state slots: {seq} needs one, all {capacity} are in use"
            ),
            StateSlotError::UnknownSequence { seq } => write!(
                f,
                "{seq} has no state slot (never allocated, or already released)"
            ),
            StateSlotError::DuplicateSequence { seq } => write!(
                f,
                "{seq} already has a state slot; release it first or use a new id"
            ),
            StateSlotError::LayerOutOfRange { layer, layers } => write!(
                f,
                "linear layer {layer} does not exist: the slots hold {layers} linear layer(s)"
            ),
            StateSlotError::InvalidGeometry { message } => {
                write!(f, "invalid linear-attention state: {message}")
            }
            StateSlotError::Launch(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StateSlotError {}

impl From<SimError> for StateSlotError {
    fn from(e: SimError) -> StateSlotError {
        StateSlotError::Launch(e)
    }
}

/// One layer's device tensors, slot-major: slot `i` owns rows `i · rows ..` of each.
#[derive(Debug)]
struct LayerTensors {
    /// `[capacity · v_heads · dk, dv]`: per slot the delta-rule state, head `h` in rows `h · dk ..`.
    recurrent: Tensor<f32>,
    /// `[capacity · conv_rows, q | k | v channels]`: per slot the convolution history, oldest
    /// first (one tensor, so a model that convolves `[q | k | v]` together launches once).
    conv: Tensor<f32>,
}

/// One sequence's state in one layer: views into the slot tensors (writes go to the slot, and a
/// kernel may update them in place).
#[derive(Debug, Clone)]
pub struct LayerState {
    /// Delta-rule state `[v_heads · dk, dv]` (head `h` in rows `h · dk ..`).
    pub recurrent: Tensor<f32>,
    /// Convolution history of `[q | k | v]`, `[conv_rows, 2 · k_heads · dk + v_heads · dv]`,
    /// oldest first.
    pub conv_all: Tensor<f32>,
    /// The q, k and v columns of `conv_all`.
    pub conv: [Tensor<f32>; 3],
}

/// The inputs of one layer step for one sequence: the projections before the convolution, the
/// gates, the convolution weights, and where the output goes. All token-major.
#[derive(Debug)]
pub struct StepInputs<'a, T: Float> {
    /// Query projection `[tokens, k_heads · dk]`.
    pub q: &'a Tensor<T>,
    /// Key projection `[tokens, k_heads · dk]`.
    pub k: &'a Tensor<T>,
    /// Value projection `[tokens, v_heads · dv]`.
    pub v: &'a Tensor<T>,
    /// Log-decays `[tokens, v_heads]` (GDN) or `[tokens, v_heads · dk]` (KDA).
    pub g: &'a Tensor<f32>,
    /// `[tokens, v_heads]`.
    pub beta: &'a Tensor<f32>,
    /// Convolution weights of q, k, v, tap-major `[conv_kernel, channels]` each.
    pub conv_weights: [&'a Tensor<f32>; 3],
    /// Output `[tokens, v_heads · dv]` (before the gated norm).
    pub o: &'a Tensor<T>,
}

/// Per-sequence linear-attention state of every linear layer of a model, in device memory.
///
/// Invariants (checked by [`StateSlots::audit`]): every slot is free or owned by exactly one live
/// sequence; owned + free = capacity. Allocation is deterministic (slot 0 first, released slots
/// reused last-released-first), so the same operations give the same simulated addresses.
#[derive(Debug)]
pub struct StateSlots {
    geometry: Vec<LinearLayerGeometry>,
    capacity: usize,
    free: Vec<usize>,
    seqs: BTreeMap<SeqId, usize>,
    layers: Vec<LayerTensors>,
}

impl StateSlots {
    /// Slots for `capacity` sequences over the linear layers `geometry`, on `launcher`'s backend:
    /// functional launchers get real (zeroed) device memory, cost-only ones shape-only tensors.
    pub fn new(
        launcher: &Launcher,
        geometry: &[LinearLayerGeometry],
        capacity: usize,
    ) -> Result<StateSlots, StateSlotError> {
        let functional = launcher.backend == Backend::Functional;
        let mut layers = Vec::with_capacity(geometry.len());
        for g in geometry {
            g.validate()?;
            let tensor = |shape: &[usize]| -> Result<Tensor<f32>, StateSlotError> {
                let n = shape
                    .iter()
                    .try_fold(1usize, |a, d| a.checked_mul(*d))
                    .ok_or_else(|| StateSlotError::InvalidGeometry {
                        message: format!("state tensor {shape:?} overflows"),
                    })?;
                if functional {
                    Tensor::from_f32(shape, &vec![0.0; n])
                        .map_err(|message| StateSlotError::InvalidGeometry { message })
                } else {
                    Ok(Tensor::shape_only(shape))
                }
            };
            let rows = |per_slot: usize| {
                per_slot
                    .checked_mul(capacity)
                    .ok_or_else(|| StateSlotError::InvalidGeometry {
                        message: format!("{capacity} slots of {per_slot} rows overflow"),
                    })
            };
            let channels: usize = g.conv_channels().iter().sum();
            layers.push(LayerTensors {
                recurrent: tensor(&[rows(g.v_heads * g.dk)?, g.dv])?,
                conv: tensor(&[rows(g.conv_rows())?, channels])?,
            });
        }
        Ok(StateSlots {
            geometry: geometry.to_vec(),
            capacity,
            // Reversed so that `pop` hands out slot 0 first.
            free: (0..capacity).rev().collect(),
            seqs: BTreeMap::new(),
            layers,
        })
    }

    /// Sequences the pool can hold at once.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots owned by live sequences.
    pub fn slots_in_use(&self) -> usize {
        self.seqs.len()
    }

    /// Slots not owned by any sequence.
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// The linear layers' geometries, in order.
    pub fn geometry(&self) -> &[LinearLayerGeometry] {
        &self.geometry
    }

    /// Whether `seq` holds a slot.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// The slot of `seq`.
    pub fn slot(&self, seq: SeqId) -> Result<usize, StateSlotError> {
        self.seqs
            .get(&seq)
            .copied()
            .ok_or(StateSlotError::UnknownSequence { seq })
    }

    /// Gives `seq` a slot and zeroes its state in every layer on the device (one memset launch per
    /// state tensor); returns those launches' reports. All or nothing: with no free slot, or if a
    /// memset fails, nothing changes.
    pub fn allocate(
        &mut self,
        launcher: &Launcher,
        seq: SeqId,
    ) -> Result<Vec<Report>, StateSlotError> {
        if self.seqs.contains_key(&seq) {
            return Err(StateSlotError::DuplicateSequence { seq });
        }
        let Some(&slot) = self.free.last() else {
            return Err(StateSlotError::OutOfSlots {
                seq,
                capacity: self.capacity,
            });
        };
        let mut reports = Vec::new();
        for layer in 0..self.layers.len() {
            let st = self.state_at(slot, layer)?;
            for t in [&st.recurrent, &st.conv_all] {
                reports.push(zero_state::launch(launcher, &Config::new(), t)?.report);
            }
        }
        self.free.pop();
        self.seqs.insert(seq, slot);
        Ok(reports)
    }

    /// Hands `seq`'s slot back (its contents are zeroed when the slot is next allocated).
    pub fn release(&mut self, seq: SeqId) -> Result<(), StateSlotError> {
        let slot = self
            .seqs
            .remove(&seq)
            .ok_or(StateSlotError::UnknownSequence { seq })?;
        self.free.push(slot);
        Ok(())
    }

    /// `seq`'s state in linear layer `layer`: views into the slot tensors.
    pub fn layer_state(&self, seq: SeqId, layer: usize) -> Result<LayerState, StateSlotError> {
        self.state_at(self.slot(seq)?, layer)
    }

    /// Slot `slot`'s views in linear layer `layer` (host-side windows, so a kernel stepping
    /// outside them is reported as out of bounds).
    fn state_at(&self, slot: usize, layer: usize) -> Result<LayerState, StateSlotError> {
        let (l, g) = match (self.layers.get(layer), self.geometry.get(layer)) {
            (Some(l), Some(g)) => (l, g),
            _ => {
                return Err(StateSlotError::LayerOutOfRange {
                    layer,
                    layers: self.layers.len(),
                })
            }
        };
        let bad = |message: String| StateSlotError::InvalidGeometry { message };
        let rec_rows = g.v_heads * g.dk;
        let recurrent = l
            .recurrent
            .row_range(slot * rec_rows, rec_rows)
            .map_err(bad)?;
        let conv_all = l
            .conv
            .row_range(slot * g.conv_rows(), g.conv_rows())
            .map_err(bad)?;
        let [cq, ck, cv] = g.conv_channels();
        let conv = [
            conv_all.col_range(0, cq).map_err(bad)?,
            conv_all.col_range(cq, ck).map_err(bad)?,
            conv_all.col_range(cq + ck, cv).map_err(bad)?,
        ];
        Ok(LayerState {
            recurrent,
            conv_all,
            conv,
        })
    }

    /// Runs linear layer `layer`'s stateful part for `seq` on `x.q.rows()` new tokens: the short
    /// convolution of q, k and v from the slot's histories, then the gated delta rule from the
    /// slot's state — chunked (`config`'s `C`) for several tokens, recurrent for one — updating
    /// the slot in place. `config` holds the tunables (`C`; `DK`/`DV` are set from the geometry).
    /// Returns the launches' reports (three convolutions, one delta rule).
    pub fn layer_step<T: Float>(
        &self,
        launcher: &Launcher,
        seq: SeqId,
        layer: usize,
        config: &Config,
        x: &StepInputs<'_, T>,
    ) -> Result<Vec<Report>, StateSlotError> {
        let st = self.layer_state(seq, layer)?;
        let g = self.geometry[layer];
        let tokens = x.q.rows();
        let [cq, ck, cv] = g.conv_channels();
        let gw = match g.decay {
            Decay::Scalar => 1,
            Decay::PerChannel => g.dk,
        };
        let expect = [
            ("q", x.q.shape().to_vec(), vec![tokens, cq]),
            ("k", x.k.shape().to_vec(), vec![tokens, ck]),
            ("v", x.v.shape().to_vec(), vec![tokens, cv]),
            ("g", x.g.shape().to_vec(), vec![tokens, g.v_heads * gw]),
            ("beta", x.beta.shape().to_vec(), vec![tokens, g.v_heads]),
            ("o", x.o.shape().to_vec(), vec![tokens, g.v_heads * g.dv]),
        ];
        for (name, got, want) in &expect {
            if got != want {
                return Err(StateSlotError::InvalidGeometry {
                    message: format!("layer step input `{name}` is {got:?}, expected {want:?}"),
                });
            }
        }
        if tokens == 0 {
            return Err(StateSlotError::InvalidGeometry {
                message: "layer step with no tokens".into(),
            });
        }
        let functional = launcher.backend == Backend::Functional;
        let scratch = |cols: usize| -> Tensor<T> {
            if functional {
                Tensor::poisoned(&[tokens, cols])
            } else {
                Tensor::shape_only(&[tokens, cols])
            }
        };
        let mut reports = Vec::new();
        let mut convolved = Vec::with_capacity(3);
        for (i, (input, cols)) in [(x.q, cq), (x.k, ck), (x.v, cv)].into_iter().enumerate() {
            let y = scratch(cols);
            let s = &st.conv[i];
            // In place: each state row is read before a lower one is written.
            reports.push(launch_short_conv(launcher, input, x.conv_weights[i], s, s, &y)?.report);
            convolved.push(y);
        }
        let mode = if tokens == 1 {
            DeltaMode::Recurrent
        } else {
            DeltaMode::Chunked
        };
        let cfg = config.clone();
        let mut conv_out = convolved.into_iter();
        let (q, k, v) = (
            conv_out.next().expect("q"),
            conv_out.next().expect("k"),
            conv_out.next().expect("v"),
        );
        let tensors = DeltaTensors {
            q,
            k,
            v,
            g: x.g.clone(),
            beta: x.beta.clone(),
            state_in: st.recurrent.clone(),
            state_out: st.recurrent.clone(),
            o: x.o.clone(),
        };
        reports.push(launch_delta(launcher, g.decay, mode, &cfg, &tensors)?.report);
        Ok(reports)
    }

    /// State bytes one sequence holds across all linear layers — independent of its length.
    pub fn bytes_per_sequence(&self) -> u64 {
        self.geometry.iter().map(|g| g.bytes_per_sequence()).sum()
    }

    /// Device bytes reserved by the pool (`capacity` slots).
    pub fn pool_bytes(&self) -> u64 {
        self.bytes_per_sequence() * self.capacity as u64
    }

    /// Device bytes of the slots in use.
    pub fn bytes_in_use(&self) -> u64 {
        self.bytes_per_sequence() * self.seqs.len() as u64
    }

    /// Checks the invariants; returns what is broken.
    pub fn audit(&self) -> Result<(), String> {
        let mut seen = vec![false; self.capacity];
        for &s in self.free.iter().chain(self.seqs.values()) {
            if s >= self.capacity {
                return Err(format!(
                    "slot {s} out of range (capacity {})",
                    self.capacity
                ));
            }
            if std::mem::replace(&mut seen[s], true) {
                return Err(format!("slot {s} is free and owned, or owned twice"));
            }
        }
        if seen.iter().any(|s| !s) {
            return Err("a slot is neither free nor owned".into());
        }
        Ok(())
    }
}

/// One row of [`context_memory`]: a sequence's memory at one context length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextMemory {
    /// Tokens in the sequence.
    pub context: usize,
    /// Linear-attention state bytes (all linear layers): the same at every length.
    pub state_bytes: u64,
    /// KV-cache bytes of the full-attention layers: `context · bytes_per_token`.
    pub kv_bytes: u64,
}

/// One sequence's memory at each of `contexts` tokens in a hybrid model: the constant linear
/// state of the `linear` layers beside the KV cache of the full-attention layers (`kv`), which
/// grows with every token. `None` if a size overflows `u64`.
pub fn context_memory(
    linear: &[LinearLayerGeometry],
    kv: &KvGeometry,
    contexts: &[usize],
) -> Option<Vec<ContextMemory>> {
    let state: u64 = linear.iter().map(|g| g.bytes_per_sequence()).sum();
    contexts
        .iter()
        .map(|&c| {
            Some(ContextMemory {
                context: c,
                state_bytes: state,
                kv_bytes: kv.bytes_per_token().checked_mul(c as u64)?,
            })
        })
        .collect()
}

/// A table of [`context_memory`] rows (MiB), for reports.
pub fn format_context_memory(rows: &[ContextMemory]) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mut s = String::from("context  linear state (MiB)  KV cache (MiB)\n");
    for r in rows {
        s.push_str(&format!(
            "{:>7}  {:>18.2}  {:>14.2}\n",
            r.context,
            r.state_bytes as f64 / MIB,
            r.kv_bytes as f64 / MIB
        ));
    }
    s
}
