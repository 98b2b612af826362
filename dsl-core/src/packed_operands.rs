//! Matrix-unit B operands packed once per launch and host thread.
//!
//! The functional matrix multiply packs its B operand into panels before multiplying
//! ([`accel_sim::functional::PackedB`]). The programs of a GEMM-like launch load the same B
//! windows many times: consecutive program ids run down a column of output tiles, and every
//! program of a column walks the same column panel of B. BLAS packs such a panel once; a DSL
//! program cannot see its neighbours, so this cache does it for them: a B operand that is a
//! deferred load (a window read in place, see `crate::tile::Host::Deferred`) is packed on its
//! first use in the launch on this thread and reused by the thread's later programs of the
//! launch.
//!
//! Reuse is sound because nothing writes a loaded window during a launch: other programs do not
//! (the `crate::tensor::DeviceMem` invariant), and `store` drops the thread's packed windows of
//! the memory it writes ([`forget_memory`]). A new launch drops them all. The packed values
//! are those packing the window again would give, so results are the same bits at any thread
//! count and whether or not a window was found here.

use crate::tensor::DeviceMem;
use accel_sim::functional::PackedB;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};

/// Packed bytes kept per thread: a GEMM's column panel of B at 1024-deep K (512 KiB at 128
/// columns) with room to spare, well inside a core's L2 + L3 share.
const MAX_BYTES: usize = 4 << 20;

/// A window of device memory as a B operand: its memory, first element, row pitch, rows,
/// columns, and whether the product uses its transpose.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct WindowKey {
    /// The memory's address. Entries hold a `Weak` to it, so the address is not reused for
    /// another memory while they live.
    pub(crate) mem: usize,
    pub(crate) start: usize,
    pub(crate) stride: usize,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) transposed: bool,
}

/// One thread's packed windows of its current launch, oldest first for eviction.
#[derive(Default)]
struct Cache {
    launch: u64,
    map: HashMap<WindowKey, (Arc<PackedB>, Weak<DeviceMem>)>,
    order: VecDeque<WindowKey>,
    bytes: usize,
}

impl Cache {
    fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
        self.bytes = 0;
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// The packed window `key` of `mem` for launch `launch`: packed by an earlier program of the
/// launch on this thread, or by `pack` now (and kept, evicting the oldest beyond the budget).
pub(crate) fn get_or_pack(
    launch: u64,
    key: WindowKey,
    mem: Weak<DeviceMem>,
    pack: impl FnOnce() -> PackedB,
) -> Arc<PackedB> {
    CACHE.with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.launch != launch {
            cache.clear();
            cache.launch = launch;
        }
        if let Some((packed, _)) = cache.map.get(&key) {
            return Arc::clone(packed);
        }
        let packed = Arc::new(pack());
        let bytes = packed.bytes();
        if bytes > MAX_BYTES {
            // Too large to keep: used once, the cache left as it is.
            return packed;
        }
        while cache.bytes + bytes > MAX_BYTES {
            let Some(old) = cache.order.pop_front() else {
                break;
            };
            if let Some((p, _)) = cache.map.remove(&old) {
                cache.bytes -= p.bytes();
            }
        }
        cache.bytes += bytes;
        cache.order.push_back(key.clone());
        cache.map.insert(key, (Arc::clone(&packed), mem));
        packed
    })
}

/// Drops this thread's packed windows of the memory at address `mem` (a store is about to write
/// it).
pub(crate) fn forget_memory(mem: usize) {
    // `try_with`: a store while the thread's locals are torn down has nothing to forget.
    let _ = CACHE.try_with(|cell| {
        let mut cache = cell.borrow_mut();
        if cache.map.is_empty() {
            return;
        }
        let Cache {
            map, order, bytes, ..
        } = &mut *cache;
        order.retain(|k| {
            if k.mem != mem {
                return true;
            }
            if let Some((p, _)) = map.remove(k) {
                *bytes -= p.bytes();
            }
            false
        });
    });
}
