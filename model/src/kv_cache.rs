//! # Paged KV cache: page pool, block tables, cache geometry
//!
//! Serving many sequences of unknown final length out of one fixed slab of device memory needs the
//! cache cut into fixed-size **pages** (`page_size` tokens each), handed to sequences on demand and
//! taken back when a sequence ends — otherwise each sequence would have to reserve its maximum
//! length up front. Each sequence keeps a **block table**: entry `i` is the physical page holding
//! its tokens `i·page_size .. (i+1)·page_size`. Token `t` of a sequence therefore lives at
//! (`block_table[t / page_size]`, slot `t % page_size`), which is exactly what a paged decode kernel
//! computes to gather its keys and values.
//!
//! This module is the bookkeeping only ([`PagedKvCache`]): it allocates page *numbers*. The bytes
//! behind a page are described as data by [`KvGeometry`] (per layer: which parts a token stores,
//! how many values, in which element format), so a memory report ([`MemoryReport`]) can say how many
//! bytes the pool, the pages in use and the live tokens take. One block table serves every layer:
//! each layer owns its own physical pool indexed by the same page numbers, as in vLLM's paged
//! attention and FlashMLA (`flash_mla_with_kvcache(q, kvcache, block_table, cache_seqlens, ...)`).
//!
//! Cache contents follow the reference code:
//! - **MLA** (DeepSeek-V3 `inference/model.py`, class `MLA`, buffers `kv_cache` and `pe_cache`):
//!   per token and layer, the normalised latent `c_KV` (`kv_lora_rank` values) and the rotated
//!   shared key `k_R` (`qk_rope_head_dim` values), shared by all heads — not per-head keys/values.
//! - **DSA indexer keys** (DeepSeek-V3.2-Exp `inference/model.py`, class `Indexer`, buffers
//!   `k_cache` (FP8 E4M3, `index_head_dim` values) and `k_scale_cache` (one f32 per 128 values));
//!   transformers `models/deepseek_v32/modeling_deepseek_v32.py` keeps them with the layer's cache
//!   (`past_key_values.update_indexer`). So the indexer key is one more part of a token's entry.
//! - **FP8 latent**: FlashMLA's FP8 sparse-decode layout stores 512 E4M3 latent values, 4 f32
//!   scales (one per 128 values) and 64 bf16 rope values: 656 bytes per token per layer.
//!   [`KvDtype::Fp8`] models "1 byte per value plus one f32 scale per `scale_group` values".
//!
//! Errors are values ([`KvCacheError`]), never panics: running out of pages is an ordinary event a
//! scheduler reacts to (preempt, swap, or wait), so it must be reported with what was asked and
//! what was left, and it must leave the cache unchanged.

use std::collections::BTreeMap;
use std::fmt;

/// Identifier of a sequence (a request) in the cache, chosen by the caller (e.g. a request id), so
/// the scheduler and the cache name sequences the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}

/// Physical location of one token: page number in the pool and slot within the page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot {
    /// Physical page number, `0 .. capacity_pages`.
    pub page: usize,
    /// Position within the page, `0 .. page_size`.
    pub slot: usize,
}

impl Slot {
    /// Row index of this token in a pool laid out as `[pages, page_size, ...]` (what a kernel
    /// indexes when the whole pool is one tensor): `page · page_size + slot`.
    pub fn flat(&self, page_size: usize) -> usize {
        self.page * page_size + self.slot
    }
}

/// What went wrong in a cache operation. Every failed operation leaves the cache unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheError {
    /// `page_size` was 0: a page must hold at least one token.
    ZeroPageSize,
    /// Not enough free pages to hold the requested tokens; nothing was allocated.
    OutOfPages {
        /// The sequence that asked.
        seq: SeqId,
        /// Tokens it asked to add (for `allocate`, its initial length).
        tokens: usize,
        /// Pages those tokens need beyond what the sequence already holds.
        pages_needed: usize,
        /// Pages free in the pool.
        free_pages: usize,
    },
    /// The sequence id is not live (never allocated, or already freed).
    UnknownSequence {
        /// The id given.
        seq: SeqId,
    },
    /// `allocate` was called for an id that is already live.
    DuplicateSequence {
        /// The id given.
        seq: SeqId,
    },
    /// A token index at or past the sequence's length.
    TokenOutOfRange {
        /// The sequence.
        seq: SeqId,
        /// The token index asked for.
        token: usize,
        /// The sequence's length in tokens.
        len: usize,
    },
    /// A geometry that cannot describe a cache (zero-sized part, zero FP8 scale group, ...).
    InvalidGeometry {
        /// What is wrong and what to change.
        message: String,
    },
    /// A size does not fit the integer type (absurd token counts or byte sizes).
    Overflow {
        /// Which quantity overflowed.
        what: String,
    },
}

impl fmt::Display for KvCacheError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KvCacheError::ZeroPageSize => {
                write!(
                    f,
                    "page size is 0 tokens; a page must hold at least one token"
                )
            }
            KvCacheError::OutOfPages {
                seq,
                tokens,
                pages_needed,
                free_pages,
            } => write!(
                f,
                "out of KV-cache pages: {seq} asked for {tokens} more token(s), which need \
                 {pages_needed} new page(s), but only {free_pages} page(s) are free"
            ),
            KvCacheError::UnknownSequence { seq } => {
                write!(
                    f,
                    "{seq} is not in the KV cache (never allocated, or already freed)"
                )
            }
            KvCacheError::DuplicateSequence { seq } => {
                write!(
                    f,
                    "{seq} is already allocated in the KV cache; free it first or use a new id"
                )
            }
            KvCacheError::TokenOutOfRange { seq, token, len } => write!(
                f,
                "token {token} of {seq} is out of range: the sequence holds {len} token(s)"
            ),
            KvCacheError::InvalidGeometry { message } => {
                write!(f, "invalid KV-cache geometry: {message}")
            }
            KvCacheError::Overflow { what } => write!(f, "KV-cache size overflow: {what}"),
        }
    }
}

impl std::error::Error for KvCacheError {}

/// One live sequence: its length and the pages holding it, in logical order.
#[derive(Debug, Clone, Default)]
struct SeqState {
    len: usize,
    pages: Vec<usize>,
}

/// A pool of `capacity_pages` pages of `page_size` tokens, and the block table of every live
/// sequence.
///
/// Invariants (checked by [`PagedKvCache::audit`]): every page is either free or owned by exactly
/// one live sequence; a sequence of `len` tokens owns exactly `ceil(len / page_size)` pages; pages
/// in use + free pages = capacity.
///
/// Allocation is deterministic: a fresh pool hands out pages 0, 1, 2, ... in order, and freed pages
/// are reused last-freed-first, so the same operations give the same block tables (and the same
/// simulated memory addresses) on every run.
#[derive(Debug, Clone)]
pub struct PagedKvCache {
    page_size: usize,
    capacity: usize,
    /// Free page numbers, used as a stack (pop = next page handed out).
    free: Vec<usize>,
    /// Owner of each page; `None` = free. Kept alongside `free` so ownership questions are O(1)
    /// and the audit can cross-check the two.
    owner: Vec<Option<SeqId>>,
    seqs: BTreeMap<SeqId, SeqState>,
}

impl PagedKvCache {
    /// An empty pool of `capacity_pages` pages of `page_size` tokens. A capacity of 0 is allowed
    /// (every allocation that needs a page then fails with [`KvCacheError::OutOfPages`]).
    pub fn new(page_size: usize, capacity_pages: usize) -> Result<PagedKvCache, KvCacheError> {
        if page_size == 0 {
            return Err(KvCacheError::ZeroPageSize);
        }
        Ok(PagedKvCache {
            page_size,
            capacity: capacity_pages,
            // Reversed so that `pop` hands out page 0 first.
            free: (0..capacity_pages).rev().collect(),
            owner: vec![None; capacity_pages],
            seqs: BTreeMap::new(),
        })
    }

    /// Tokens per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Pages in the pool.
    pub fn capacity_pages(&self) -> usize {
        self.capacity
    }

    /// Pages owned by live sequences.
    pub fn pages_in_use(&self) -> usize {
        self.capacity - self.free.len()
    }

    /// Pages not owned by any sequence.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }

    /// Pages needed to hold `tokens` tokens: `ceil(tokens / page_size)`.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size)
    }

    /// Number of live sequences.
    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }

    /// Whether `seq` is live.
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Live sequences and their lengths, in id order.
    pub fn sequences(&self) -> impl Iterator<Item = (SeqId, usize)> + '_ {
        self.seqs.iter().map(|(id, s)| (*id, s.len))
    }

    /// Tokens held by all live sequences together.
    pub fn tokens_in_use(&self) -> usize {
        self.seqs.values().map(|s| s.len).sum()
    }

    /// Creates sequence `seq` holding `tokens` tokens (0 is allowed: pages come with the first
    /// append). All or nothing: if the pool cannot hold them, the sequence is not created — a
    /// scheduler admitting a prompt wants exactly that.
    pub fn allocate(&mut self, seq: SeqId, tokens: usize) -> Result<(), KvCacheError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvCacheError::DuplicateSequence { seq });
        }
        let pages_needed = self.pages_for(tokens);
        if pages_needed > self.free.len() {
            return Err(KvCacheError::OutOfPages {
                seq,
                tokens,
                pages_needed,
                free_pages: self.free.len(),
            });
        }
        let pages = self.take_pages(seq, pages_needed);
        self.seqs.insert(seq, SeqState { len: tokens, pages });
        Ok(())
    }

    /// Adds `tokens` tokens at the end of `seq`, taking new pages only when its last page is full.
    /// All or nothing: on [`KvCacheError::OutOfPages`] the sequence keeps its length and pages.
    /// Returns the sequence's new length.
    pub fn append(&mut self, seq: SeqId, tokens: usize) -> Result<usize, KvCacheError> {
        let free_pages = self.free.len();
        let state = self
            .seqs
            .get(&seq)
            .ok_or(KvCacheError::UnknownSequence { seq })?;
        let new_len = state
            .len
            .checked_add(tokens)
            .ok_or_else(|| KvCacheError::Overflow {
                what: format!("{seq} would hold {} + {tokens} tokens", state.len),
            })?;
        let pages_needed = self.pages_for(new_len) - state.pages.len();
        if pages_needed > free_pages {
            return Err(KvCacheError::OutOfPages {
                seq,
                tokens,
                pages_needed,
                free_pages,
            });
        }
        let new_pages = self.take_pages(seq, pages_needed);
        let state = self.seqs.get_mut(&seq).expect("checked above");
        state.pages.extend(new_pages);
        state.len = new_len;
        Ok(new_len)
    }

    /// Shortens `seq` to `tokens` tokens (no longer than it is), returning the pages past them to
    /// the pool: undoing an append whose step failed, or dropping rejected speculative tokens.
    /// Returns how many pages were released.
    pub fn truncate(&mut self, seq: SeqId, tokens: usize) -> Result<usize, KvCacheError> {
        let keep = self.pages_for(tokens);
        let state = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvCacheError::UnknownSequence { seq })?;
        if tokens > state.len {
            return Err(KvCacheError::TokenOutOfRange {
                seq,
                token: tokens,
                len: state.len,
            });
        }
        let dropped = state.pages.split_off(keep);
        state.len = tokens;
        // Pushed in reverse so the first dropped page is the next one handed out again.
        for &page in dropped.iter().rev() {
            self.owner[page] = None;
            self.free.push(page);
        }
        Ok(dropped.len())
    }

    /// Ends `seq`: its pages return to the pool. Returns how many pages were released.
    pub fn free(&mut self, seq: SeqId) -> Result<usize, KvCacheError> {
        let state = self
            .seqs
            .remove(&seq)
            .ok_or(KvCacheError::UnknownSequence { seq })?;
        // Pushed in reverse so the sequence's first page is the next one handed out again.
        for &page in state.pages.iter().rev() {
            self.owner[page] = None;
            self.free.push(page);
        }
        Ok(state.pages.len())
    }

    /// Length of `seq` in tokens.
    pub fn len(&self, seq: SeqId) -> Result<usize, KvCacheError> {
        self.state(seq).map(|s| s.len)
    }

    /// Whether the pool holds no live sequence.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Block table of `seq`: entry `i` is the physical page of its tokens
    /// `i·page_size .. (i+1)·page_size`.
    pub fn block_table(&self, seq: SeqId) -> Result<&[usize], KvCacheError> {
        self.state(seq).map(|s| s.pages.as_slice())
    }

    /// Physical location of token `token` of `seq`: page `block_table[token / page_size]`, slot
    /// `token % page_size`.
    pub fn locate(&self, seq: SeqId, token: usize) -> Result<Slot, KvCacheError> {
        let state = self.state(seq)?;
        if token >= state.len {
            return Err(KvCacheError::TokenOutOfRange {
                seq,
                token,
                len: state.len,
            });
        }
        Ok(Slot {
            page: state.pages[token / self.page_size],
            slot: token % self.page_size,
        })
    }

    /// The sequence owning physical page `page`, or `None` if the page is free or not in the pool.
    pub fn page_owner(&self, page: usize) -> Option<SeqId> {
        self.owner.get(page).copied().flatten()
    }

    /// Checks every invariant of the pool from scratch (each page free or owned by exactly one
    /// sequence, owner table and block tables agree, page counts match lengths). `Err` names the
    /// first broken invariant; it can only happen through a bug in this module, so tests call it
    /// after every operation.
    pub fn audit(&self) -> Result<(), String> {
        let mut seen: Vec<Option<SeqId>> = vec![None; self.capacity];
        for &page in &self.free {
            if page >= self.capacity {
                return Err(format!("free list holds page {page} outside the pool"));
            }
            if self.owner[page].is_some() {
                return Err(format!("page {page} is on the free list but has an owner"));
            }
            if seen[page].is_some() {
                return Err(format!("page {page} is on the free list twice"));
            }
            seen[page] = Some(SeqId(u64::MAX));
        }
        let mut used = 0usize;
        for (&seq, state) in &self.seqs {
            if state.pages.len() != self.pages_for(state.len) {
                return Err(format!(
                    "{seq} holds {} tokens in {} pages; expected {}",
                    state.len,
                    state.pages.len(),
                    self.pages_for(state.len)
                ));
            }
            for &page in &state.pages {
                if page >= self.capacity {
                    return Err(format!("{seq} owns page {page} outside the pool"));
                }
                if seen[page].is_some() {
                    return Err(format!(
                        "page {page} of {seq} is also free or owned elsewhere"
                    ));
                }
                if self.owner[page] != Some(seq) {
                    return Err(format!(
                        "page {page} of {seq} has owner {:?}",
                        self.owner[page]
                    ));
                }
                seen[page] = Some(seq);
            }
            used += state.pages.len();
        }
        if used + self.free.len() != self.capacity {
            return Err(format!(
                "{used} pages in use + {} free != capacity {}",
                self.free.len(),
                self.capacity
            ));
        }
        Ok(())
    }

    /// Bytes of this pool under `geometry`: the whole pool, the pages in use, the live tokens, and
    /// the slack (allocated but unfilled slots in partly filled last pages).
    pub fn memory_report(&self, geometry: &KvGeometry) -> Result<MemoryReport, KvCacheError> {
        let bytes_per_token = geometry.bytes_per_token();
        let bytes_per_page = geometry.bytes_per_page(self.page_size)?;
        let mul = |a: u64, b: usize, what: &str| {
            a.checked_mul(b as u64)
                .ok_or_else(|| KvCacheError::Overflow {
                    what: what.to_string(),
                })
        };
        let tokens = self.tokens_in_use();
        let pool_bytes = mul(bytes_per_page, self.capacity, "pool bytes")?;
        let used_bytes = mul(bytes_per_page, self.pages_in_use(), "bytes in use")?;
        let token_bytes = mul(bytes_per_token, tokens, "token bytes")?;
        Ok(MemoryReport {
            page_size: self.page_size,
            capacity_pages: self.capacity,
            pages_in_use: self.pages_in_use(),
            sequences: self.seqs.len(),
            tokens,
            bytes_per_token,
            bytes_per_page,
            pool_bytes,
            used_bytes,
            token_bytes,
            slack_bytes: used_bytes - token_bytes,
        })
    }

    fn state(&self, seq: SeqId) -> Result<&SeqState, KvCacheError> {
        self.seqs
            .get(&seq)
            .ok_or(KvCacheError::UnknownSequence { seq })
    }

    /// Pops `n` pages for `seq`. Callers check `n <= free.len()` first.
    fn take_pages(&mut self, seq: SeqId, n: usize) -> Vec<usize> {
        let at = self.free.len() - n;
        let mut pages = self.free.split_off(at);
        pages.reverse(); // pop order: the top of the stack comes first
        for &page in &pages {
            self.owner[page] = Some(seq);
        }
        pages
    }
}

/// Element format of one cache part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvDtype {
    /// 4-byte IEEE float.
    F32,
    /// 2-byte IEEE half.
    F16,
    /// 2-byte bfloat16 (the reference code's default cache type).
    Bf16,
    /// 1-byte FP8 (E4M3 or E5M2) plus one f32 scale per `scale_group` values, the layout of the
    /// DeepSeek-V3.2 indexer key cache (group 128) and FlashMLA's FP8 latent (group 128).
    Fp8 {
        /// Values sharing one f32 scale (must be ≥ 1).
        scale_group: usize,
    },
}

impl KvDtype {
    /// Bytes of one value, scales excluded.
    pub fn element_bytes(&self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8 { .. } => 1,
        }
    }

    /// Short name for reports.
    pub fn name(&self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 { .. } => "fp8",
        }
    }
}

/// Bytes of one f32 quantisation scale.
const SCALE_BYTES: u64 = 4;

/// One part of a token's cache entry in one layer (e.g. the MLA latent, the rope key, the indexer
/// key), with its size precomputed so reports cannot overflow later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachePart {
    name: String,
    elements: usize,
    dtype: KvDtype,
    bytes_per_token: u64,
}

impl CachePart {
    /// A part of `elements` values per token in format `dtype`. Errors on 0 elements, an FP8
    /// scale group of 0, or a byte size that overflows `u64`.
    pub fn new(name: &str, elements: usize, dtype: KvDtype) -> Result<CachePart, KvCacheError> {
        if elements == 0 {
            return Err(KvCacheError::InvalidGeometry {
                message: format!("cache part `{name}` has 0 values per token"),
            });
        }
        let overflow = || KvCacheError::Overflow {
            what: format!("bytes per token of cache part `{name}`"),
        };
        let values = (elements as u64)
            .checked_mul(dtype.element_bytes())
            .ok_or_else(overflow)?;
        let scales = match dtype {
            KvDtype::Fp8 { scale_group: 0 } => {
                return Err(KvCacheError::InvalidGeometry {
                    message: format!(
                        "cache part `{name}`: FP8 scale group is 0; use the number of values \
                         sharing one scale (DeepSeek uses 128)"
                    ),
                })
            }
            KvDtype::Fp8 { scale_group } => (elements.div_ceil(scale_group) as u64)
                .checked_mul(SCALE_BYTES)
                .ok_or_else(overflow)?,
            _ => 0,
        };
        let bytes_per_token = values.checked_add(scales).ok_or_else(overflow)?;
        Ok(CachePart {
            name: name.to_string(),
            elements,
            dtype,
            bytes_per_token,
        })
    }

    /// Name of the part (`"latent"`, `"rope"`, `"indexer_key"`, `"k"`, `"v"`, ...).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Values per token.
    pub fn elements(&self) -> usize {
        self.elements
    }

    /// Element format.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes per token, quantisation scales included.
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }
}

/// What one layer stores per token: a list of parts. Data, not code, so a new attention variant's
/// cache is described without touching the allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerKvGeometry {
    parts: Vec<CachePart>,
    bytes_per_token: u64,
}

impl LayerKvGeometry {
    /// A layer storing `parts` (at least one).
    pub fn from_parts(parts: Vec<CachePart>) -> Result<LayerKvGeometry, KvCacheError> {
        if parts.is_empty() {
            return Err(KvCacheError::InvalidGeometry {
                message: "a layer's cache entry has no parts".to_string(),
            });
        }
        let mut bytes_per_token = 0u64;
        for p in &parts {
            bytes_per_token = bytes_per_token
                .checked_add(p.bytes_per_token)
                .ok_or_else(|| KvCacheError::Overflow {
                    what: "bytes per token of a layer".to_string(),
                })?;
        }
        Ok(LayerKvGeometry {
            parts,
            bytes_per_token,
        })
    }

    /// Multi-head / grouped-query attention: per token, `kv_heads · head_dim` key values (`"k"`)
    /// and `kv_heads · v_head_dim` value values (`"v"`).
    pub fn mha(
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        dtype: KvDtype,
    ) -> Result<LayerKvGeometry, KvCacheError> {
        let n = |d: usize, what: &str| {
            kv_heads
                .checked_mul(d)
                .ok_or_else(|| KvCacheError::Overflow {
                    what: format!("{what} values per token"),
                })
        };
        LayerKvGeometry::from_parts(vec![
            CachePart::new("k", n(head_dim, "key")?, dtype)?,
            CachePart::new("v", n(v_head_dim, "value")?, dtype)?,
        ])
    }

    /// DeepSeek-V3 multi-head latent attention: per token, the latent `c_KV` (`"latent"`,
    /// `kv_lora_rank` values) and the shared rotated key `k_R` (`"rope"`, `qk_rope_head_dim`
    /// values) — the `kv_cache` and `pe_cache` buffers of DeepSeek's `inference/model.py`.
    pub fn mla(
        kv_lora_rank: usize,
        qk_rope_head_dim: usize,
        latent: KvDtype,
        rope: KvDtype,
    ) -> Result<LayerKvGeometry, KvCacheError> {
        LayerKvGeometry::from_parts(vec![
            CachePart::new("latent", kv_lora_rank, latent)?,
            CachePart::new("rope", qk_rope_head_dim, rope)?,
        ])
    }

    /// This layer plus the DSA lightning-indexer key (`"indexer_key"`, `index_head_dim` values,
    /// one head), as DeepSeek-V3.2 caches it next to the MLA latent.
    pub fn with_indexer_keys(
        self,
        index_head_dim: usize,
        dtype: KvDtype,
    ) -> Result<LayerKvGeometry, KvCacheError> {
        let mut parts = self.parts;
        parts.push(CachePart::new("indexer_key", index_head_dim, dtype)?);
        LayerKvGeometry::from_parts(parts)
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[CachePart] {
        &self.parts
    }

    /// Bytes per token in this layer, all parts and scales.
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }
}

/// The cache geometry of a whole model: one [`LayerKvGeometry`] per layer that keeps a KV cache
/// (layers may differ, e.g. hybrid models whose linear-attention layers keep no KV cache at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGeometry {
    layers: Vec<LayerKvGeometry>,
    bytes_per_token: u64,
}

impl KvGeometry {
    /// A model whose cached layers are `layers` (at least one).
    pub fn from_layers(layers: Vec<LayerKvGeometry>) -> Result<KvGeometry, KvCacheError> {
        if layers.is_empty() {
            return Err(KvCacheError::InvalidGeometry {
                message: "a model cache geometry has no layers".to_string(),
            });
        }
        let mut bytes_per_token = 0u64;
        for l in &layers {
            bytes_per_token = bytes_per_token
                .checked_add(l.bytes_per_token)
                .ok_or_else(|| KvCacheError::Overflow {
                    what: "bytes per token of the model".to_string(),
                })?;
        }
        Ok(KvGeometry {
            layers,
            bytes_per_token,
        })
    }

    /// `n_layers` identical layers.
    pub fn uniform(layer: LayerKvGeometry, n_layers: usize) -> Result<KvGeometry, KvCacheError> {
        KvGeometry::from_layers(vec![layer; n_layers])
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[LayerKvGeometry] {
        &self.layers
    }

    /// Bytes one token takes across all layers.
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token
    }

    /// Bytes one page takes across all layers (`page_size` tokens).
    pub fn bytes_per_page(&self, page_size: usize) -> Result<u64, KvCacheError> {
        self.bytes_per_token
            .checked_mul(page_size as u64)
            .ok_or_else(|| KvCacheError::Overflow {
                what: format!("bytes of a {page_size}-token page"),
            })
    }

    /// How many whole pages of `page_size` tokens fit in `budget_bytes` (a memory plan's cache
    /// budget), so a pool can be sized from the device memory left after weights.
    pub fn pages_fitting(&self, budget_bytes: u64, page_size: usize) -> Result<u64, KvCacheError> {
        if page_size == 0 {
            return Err(KvCacheError::ZeroPageSize);
        }
        Ok(budget_bytes / self.bytes_per_page(page_size)?)
    }
}

/// Bytes used by a [`PagedKvCache`] under a [`KvGeometry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryReport {
    /// Tokens per page.
    pub page_size: usize,
    /// Pages in the pool.
    pub capacity_pages: usize,
    /// Pages owned by live sequences.
    pub pages_in_use: usize,
    /// Live sequences.
    pub sequences: usize,
    /// Tokens held by live sequences.
    pub tokens: usize,
    /// Bytes per token, all layers.
    pub bytes_per_token: u64,
    /// Bytes per page, all layers.
    pub bytes_per_page: u64,
    /// Bytes of the whole pool (what is reserved on the device).
    pub pool_bytes: u64,
    /// Bytes of the pages in use.
    pub used_bytes: u64,
    /// Bytes of the live tokens themselves.
    pub token_bytes: u64,
    /// `used_bytes − token_bytes`: slots allocated but not yet filled (internal fragmentation,
    /// at most one partly filled page per sequence).
    pub slack_bytes: u64,
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MIB: f64 = 1024.0 * 1024.0;
        write!(
            f,
            "KV cache: {} / {} pages of {} tokens in use by {} sequence(s), {} tokens; \
             {} B/token, {} B/page; pool {:.1} MiB, in use {:.1} MiB, tokens {:.1} MiB, \
             slack {:.1} MiB",
            self.pages_in_use,
            self.capacity_pages,
            self.page_size,
            self.sequences,
            self.tokens,
            self.bytes_per_token,
            self.bytes_per_page,
            self.pool_bytes as f64 / MIB,
            self.used_bytes as f64 / MIB,
            self.token_bytes as f64 / MIB,
            self.slack_bytes as f64 / MIB,
        )
    }
}
