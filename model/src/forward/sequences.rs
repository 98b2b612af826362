//! Where a runner keeps the sequences it serves, as a serving engine does: every attention layer
//! owns one paged pool of cache rows (MLA latents and DSA indexer keys, or GQA keys and values),
//! indexed by page numbers from one shared allocator ([`PagedKvCache`]: a sequence's block table
//! serves every layer), and every linear-attention layer one state slot per live sequence
//! ([`StateSlots`]: a slot number names a sequence's state in every layer). A sequence takes a
//! slot when admitted, pages as its tokens arrive, and gives both back when released, so a runner
//! serves any number of sequences over its life within fixed device memory.

use super::ops::{view, Mem};
use super::{gated_attention, mla, ForwardError};
use crate::config::{AttentionKind, ModelConfig};
use crate::kv_cache::{PagedKvCache, SeqId};
use crate::state_slots::{LayerState, LinearLayerGeometry, StateSlots};
use dsl_core::{Launcher, Report, Tensor};
use kernels::attention::kv_append;

/// Tokens per page of every paged pool (a declared page size of the DSA and decode kernels).
pub(crate) const PAGE: usize = 64;

/// One decoder layer's storage.
pub(crate) enum LayerStore {
    /// An MLA layer's latent (and indexer-key) pool.
    Latent(mla::LatentPool),
    /// A GQA layer's key and value pools.
    Kv(gated_attention::KvPool),
    /// A linear-attention layer: its index among the linear layers of the state slots.
    Linear(usize),
}

/// How full a runner's pools are ([`super::Runner::pool_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolUsage {
    /// Live sequences.
    pub sequences: usize,
    /// Sequences the pools can hold at once (state slots).
    pub max_sequences: usize,
    /// Tokens held by the live sequences.
    pub tokens: usize,
    /// Pages owned by live sequences.
    pub pages_in_use: usize,
    /// Pages in the pool.
    pub pages: usize,
    /// State slots owned by live sequences.
    pub slots_in_use: usize,
}

/// One sequence's pages for a step: its block table on the host and on the device.
pub(crate) struct SeqPages {
    /// Entry `i`: the pool page of tokens `i·PAGE ..`.
    pub table: Vec<usize>,
    /// The same, `[pages]`, for the kernels.
    pub table_t: Tensor<i32>,
}

impl SeqPages {
    /// Pool rows of the sequence's tokens `0 .. ctx` (for a gather).
    pub fn rows(&self, ctx: usize) -> Vec<i32> {
        (0..ctx)
            .map(|p| (self.table[p / PAGE] * PAGE + p % PAGE) as i32)
            .collect()
    }
}

/// One sequence's rows in a step's input: its first row, how many, the position of the first, and
/// its pages.
pub(crate) struct SeqRows<'a> {
    pub row0: usize,
    pub rows: usize,
    pub pos0: usize,
    pub pages: &'a SeqPages,
}

impl SeqRows<'_> {
    /// Pool rows (slots) of the step's new rows (row `row0 + i` of a sequence is its position
    /// `pos0 + i`): a step's cache append in one launch. A table that does not cover a sequence's
    /// new positions, or a row no sequence owns, is an internal error (the store allocates pages
    /// before a step).
    pub fn append_slots(seqs: &[SeqRows]) -> Result<Vec<usize>, ForwardError> {
        let bad = |message: String| ForwardError::Internal {
            what: "KV cache append".into(),
            message,
        };
        let n = seqs.iter().map(|sq| sq.row0 + sq.rows).max().unwrap_or(0);
        let mut slots = vec![usize::MAX; n];
        for sq in seqs {
            let own = kv_append::append_slots(&sq.pages.table, sq.pos0, sq.rows, PAGE);
            if own.len() < sq.rows {
                return Err(bad(format!(
                    "position {} lies past the sequence's {} pages",
                    sq.pos0 + own.len(),
                    sq.pages.table.len()
                )));
            }
            slots[sq.row0..sq.row0 + sq.rows].copy_from_slice(&own);
        }
        if let Some(row) = slots.iter().position(|s| *s == usize::MAX) {
            return Err(bad(format!("row {row} of the step belongs to no sequence")));
        }
        Ok(slots)
    }

    /// Block tables `[S, T]` (rows padded with page 0: entries past a sequence's length are
    /// never read) and context lengths `[S]` of one decode token per sequence, and the longest
    /// context, for a batched decode kernel.
    pub fn decode_tables(
        seqs: &[SeqRows],
    ) -> Result<(Tensor<i32>, Tensor<i32>, usize), ForwardError> {
        let n = seqs.len();
        let width = seqs
            .iter()
            .map(|sq| sq.pages.table.len())
            .max()
            .unwrap_or(1);
        let mut tables = vec![0i32; n * width];
        for (i, sq) in seqs.iter().enumerate() {
            for (j, p) in sq.pages.table.iter().enumerate() {
                tables[i * width + j] = *p as i32;
            }
        }
        let lens: Vec<i32> = seqs.iter().map(|sq| (sq.pos0 + 1) as i32).collect();
        let max_ctx = seqs.iter().map(|sq| sq.pos0 + 1).max().unwrap_or(1);
        Ok((
            view(Tensor::from_indices(&[n, width], &tables), "block tables")?,
            view(Tensor::from_indices(&[n], &lens), "context lengths")?,
            max_ctx,
        ))
    }
}

/// Every layer's pool and the bookkeeping of which sequence owns what.
pub(crate) struct SequenceStore {
    /// Page allocator: one block table per live sequence, shared by every attention layer.
    pub pages: PagedKvCache,
    /// Per decoder layer, its storage.
    pub layers: Vec<LayerStore>,
    /// One slot per live sequence (in every linear layer; bookkeeping only without them).
    pub slots: StateSlots,
    /// The next sequence id to hand out (ids are never reused).
    next_id: usize,
    /// The sizes it was made for: live sequences, pool tokens.
    sizes: (usize, usize),
}

fn unsupported(what: &str) -> ForwardError {
    ForwardError::Unsupported { what: what.into() }
}

impl SequenceStore {
    /// Pools for `max_sequences` live sequences sharing `pool_tokens` tokens of pages (rounded up
    /// to whole pages) in every attention layer, allocated by `mem` (the launcher's backend and the
    /// pools' format).
    pub fn new(
        cfg: &ModelConfig,
        mem: Mem,
        launcher: &Launcher,
        max_sequences: usize,
        pool_tokens: usize,
    ) -> Result<SequenceStore, ForwardError> {
        let pool_pages = pool_tokens.div_ceil(PAGE).max(1);
        let pool_err = |e: String| ForwardError::Workload {
            flag: "pool".into(),
            message: e,
        };
        let pages = PagedKvCache::new(PAGE, pool_pages).map_err(|e| pool_err(e.to_string()))?;
        let mut layers = Vec::with_capacity(cfg.layers.len());
        let mut linear = Vec::new();
        for spec in &cfg.layers {
            layers.push(match &spec.attention {
                AttentionKind::Mla | AttentionKind::SparseMla => {
                    let m = cfg
                        .mla
                        .as_ref()
                        .ok_or_else(|| unsupported("MLA layers without MLA dimensions"))?;
                    let index_dim = match (&spec.attention, &cfg.indexer) {
                        (AttentionKind::SparseMla, Some(ix)) => Some(ix.head_dim),
                        (AttentionKind::SparseMla, None) => {
                            return Err(unsupported("sparse MLA layers without indexer dimensions"))
                        }
                        _ => None,
                    };
                    LayerStore::Latent(mla::LatentPool::new(m, index_dim, pool_pages, mem)?)
                }
                AttentionKind::Gqa
                | AttentionKind::SlidingGqa
                | AttentionKind::ChunkedGqa
                | AttentionKind::NopeGqa => {
                    let g = cfg.gqa.as_ref().ok_or_else(|| {
                        unsupported("attention layers without attention dimensions")
                    })?;
                    LayerStore::Kv(gated_attention::KvPool::new(g, pool_pages, mem)?)
                }
                AttentionKind::LinearAttention => {
                    let l = cfg.linear_attention.as_ref().ok_or_else(|| {
                        unsupported("linear-attention layers without their dimensions")
                    })?;
                    linear.push(LinearLayerGeometry::of(l));
                    LayerStore::Linear(linear.len() - 1)
                }
                AttentionKind::Unknown(k) => return Err(unsupported(&format!("`{k}` attention"))),
            });
        }
        let slots = StateSlots::new(launcher, &linear, max_sequences)
            .map_err(|e| pool_err(e.to_string()))?;
        Ok(SequenceStore {
            pages,
            layers,
            slots,
            next_id: 0,
            sizes: (max_sequences, pool_tokens),
        })
    }

    /// The live sequences and pool tokens it was made for.
    pub fn sizes(&self) -> (usize, usize) {
        self.sizes
    }

    /// Admits a new sequence with no tokens: a state slot (zeroed on the device: the memset
    /// launches' reports are returned) and an empty block table. Returns its id.
    pub fn admit(&mut self, launcher: &Launcher) -> Result<(usize, Vec<Report>), ForwardError> {
        let id = self.next_id;
        let seq = SeqId(id as u64);
        let reports = self
            .slots
            .allocate(launcher, seq)
            .map_err(|e| ForwardError::Workload {
                flag: "sequences".into(),
                message: format!(
                    "cannot admit another sequence: {e} (release a finished one, or size the \
                     runner for more with Runner::serve)"
                ),
            })?;
        if let Err(e) = self.pages.allocate(seq, 0) {
            // All or nothing: the slot goes back.
            let _ = self.slots.release(seq);
            return Err(ForwardError::Internal {
                what: "page allocator".into(),
                message: e.to_string(),
            });
        }
        self.next_id += 1;
        Ok((id, reports))
    }

    /// Releases sequence `id`: its pages and its state slot return to the pools.
    pub fn release(&mut self, id: usize) -> Result<(), ForwardError> {
        let seq = SeqId(id as u64);
        if !self.pages.contains(seq) {
            return Err(ForwardError::Workload {
                flag: "sequence".into(),
                message: format!("sequence {id} is not live (never admitted, or released)"),
            });
        }
        self.pages
            .free(seq)
            .map_err(|e| internal_pool(e.to_string()))?;
        self.slots
            .release(seq)
            .map_err(|e| internal_pool(e.to_string()))
    }

    /// Tokens sequence `id` holds (`None` if it is not live).
    pub fn len(&self, id: usize) -> Option<usize> {
        self.pages.len(SeqId(id as u64)).ok()
    }

    /// Extends sequence `id` by `tokens` tokens, taking pages as needed (all or nothing).
    pub fn extend(&mut self, id: usize, tokens: usize) -> Result<(), ForwardError> {
        let seq = SeqId(id as u64);
        self.pages
            .append(seq, tokens)
            .map(|_| ())
            .map_err(|e| ForwardError::Workload {
                flag: "pool".into(),
                message: format!(
                    "{e} (release finished sequences, or give the runner a larger pool with \
                     Runner::serve)"
                ),
            })
    }

    /// Shortens sequence `id` back to `tokens` (undoing a step that failed).
    pub fn truncate(&mut self, id: usize, tokens: usize) {
        let _ = self.pages.truncate(SeqId(id as u64), tokens);
    }

    /// Sequence `id`'s pages, host and device.
    pub fn seq_pages(&self, id: usize) -> Result<SeqPages, ForwardError> {
        let table = self
            .pages
            .block_table(SeqId(id as u64))
            .map_err(|e| internal_pool(e.to_string()))?
            .to_vec();
        let ids: Vec<i32> = table.iter().map(|p| *p as i32).collect();
        let table_t = view(Tensor::from_indices(&[ids.len()], &ids), "block table")?;
        Ok(SeqPages { table, table_t })
    }

    /// Sequence `id`'s state in linear layer `linear` (views into its slot).
    pub fn state(&self, id: usize, linear: usize) -> Result<LayerState, ForwardError> {
        self.slots
            .layer_state(SeqId(id as u64), linear)
            .map_err(|e| internal_pool(e.to_string()))
    }

    /// How full the pools are.
    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            sequences: self.pages.num_sequences(),
            max_sequences: self.slots.capacity(),
            tokens: self.pages.tokens_in_use(),
            pages_in_use: self.pages.pages_in_use(),
            pages: self.pages.capacity_pages(),
            slots_in_use: self.slots.slots_in_use(),
        }
    }

    /// Checks the allocators' invariants and that both agree on the live sequences.
    pub fn audit(&self) -> Result<(), String> {
        self.pages.audit()?;
        self.slots.audit()?;
        for (seq, _) in self.pages.sequences() {
            if !self.slots.contains(seq) {
                return Err(format!("{seq} holds pages but no state slot"));
            }
        }
        if self.pages.num_sequences() != self.slots.slots_in_use() {
            return Err(format!(
                "{} sequences hold pages but {} hold state slots",
                self.pages.num_sequences(),
                self.slots.slots_in_use()
            ));
        }
        Ok(())
    }
}

fn internal_pool(message: String) -> ForwardError {
    ForwardError::Internal {
        what: "sequence pools".into(),
        message,
    }
}
