//! The memory system below SRAM: a shared L2 in front of HBM, and the bandwidth of both shared
//! over time among every transfer in flight on any core ([`Fluid`]).

use crate::isa::Region;
use crate::preset::DevicePreset;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// The L2's index of resident windows (a fast non-cryptographic hash: the keys are not adversarial).
type RegionMap = HashMap<Region, u64, foldhash::fast::FixedState>;

/// Which level served a DMA read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Hit in the shared L2.
    L2,
    /// Missed to device memory.
    Hbm,
}

/// Window-granular model of the shared L2 cache.
///
/// A DMA read of a window that an earlier read already brought in is an L2 hit while the window is
/// still resident; capacity is enforced first-in first-out. Reads are presented in program order,
/// except that programs starting on the same cycle present theirs interleaved, load by load (see
/// `LaunchSim::batch_levels` in `schedule`); host threads never decide it, so the result is
/// deterministic.
#[derive(Debug, Default, Clone)]
pub struct L2Cache {
    capacity: u64,
    used: u64,
    /// Each window ever inserted, with the FIFO sequence number of its latest insertion: it is
    /// resident iff that is at least `head`. Eviction only moves `head`, so a read costs one hash
    /// probe; stale entries are purged in bulk when they outnumber the resident ones.
    seq_of: RegionMap,
    /// Bytes of the resident windows in insertion order; the front one has sequence `head`.
    fifo: VecDeque<u64>,
    /// Sequence number of the oldest resident window.
    head: u64,
}

/// Stale entries tolerated in [`L2Cache::seq_of`] beyond the resident ones before a purge.
const STALE_SLACK: usize = 4096;

impl L2Cache {
    /// An empty cache of `capacity` bytes (0 = no cache).
    pub fn new(capacity: u64) -> L2Cache {
        L2Cache {
            capacity,
            ..Default::default()
        }
    }

    /// Records a read of `region` (`bytes` long) and says which level served it.
    pub fn read(&mut self, region: Region, bytes: u64) -> Level {
        use std::collections::hash_map::Entry;
        let head = self.head;
        let entry = self.seq_of.entry(region);
        if let Entry::Occupied(e) = &entry {
            if *e.get() >= head {
                return Level::L2;
            }
        }
        if bytes > self.capacity {
            return Level::Hbm;
        }
        // Evict first in, first out until it fits (a window that missed is never among them).
        while self.used + bytes > self.capacity {
            let Some(b) = self.fifo.pop_front() else {
                break;
            };
            self.used -= b;
            self.head += 1;
        }
        let seq = self.head + self.fifo.len() as u64;
        match entry {
            Entry::Occupied(mut e) => *e.get_mut() = seq,
            Entry::Vacant(e) => {
                e.insert(seq);
            }
        }
        self.fifo.push_back(bytes);
        self.used += bytes;
        if self.seq_of.len() > 2 * self.fifo.len() + STALE_SLACK {
            let head = self.head;
            self.seq_of.retain(|_, s| *s >= head);
        }
        Level::Hbm
    }
}

/// What a DMA transfer moves through, which decides the bandwidth it competes for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A read that missed L2: it crosses HBM and the L2 (the roofline counts misses on both).
    HbmRead = 0,
    /// A store: posted to HBM.
    HbmWrite = 1,
    /// A read served by L2.
    L2Read = 2,
}

/// `f64` ordered by `total_cmp` (completion targets in the fluid's heaps).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Ord64(f64);

impl Eq for Ord64 {}

impl PartialOrd for Ord64 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Ord64 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

/// The transfers of one [`Class`] in flight. All of them move at the same rate at any instant
/// (equal caps, fair sharing), so each needs only the *virtual* amount `v` every one of them has
/// moved since the launch began: a transfer of `b` bytes that arrives when it is `v0` completes
/// when `v` reaches `v0 + b`. Arrivals and completions are then a heap push and pop.
#[derive(Debug, Default, Clone)]
struct ClassState {
    /// Transfers in flight, counted with their multiplicity (cores moving in lockstep).
    n: u64,
    /// Bytes each transfer of the class has moved since the launch began.
    v: f64,
    /// Bytes per cycle each transfer gets now.
    rate: f64,
    /// (target `v`, transfer id, multiplicity), smallest target first.
    heap: BinaryHeap<Reverse<(Ord64, u32, u64)>>,
}

/// HBM and L2 bandwidth shared over time among all transfers in flight, whatever program or wave
/// issued them (a fluid, processor-sharing model).
///
/// At each instant the rates are max-min fair (progressive filling): every transfer's rate rises
/// together until it reaches its core's DMA width, or a level it crosses runs out of bandwidth;
/// those stop and the others go on. Misses cross HBM and L2, stores HBM only, hits L2 only.
/// The rates change only when a transfer arrives or completes, so the fluid advances from one such
/// event to the next. Nothing depends on host threads or on the order programs were pushed in
/// beyond program order: the same transfers give the same completions.
#[derive(Debug, Clone)]
pub struct Fluid {
    hbm_bw: f64,
    l2_bw: f64,
    cap: f64,
    now: f64,
    cls: [ClassState; 3],
}

/// Slack when deciding that a transfer's remaining bytes are all moved (floating-point rounding).
const DONE_EPS: f64 = 1e-6;

impl Fluid {
    /// An idle memory system with `p`'s HBM and L2 bandwidth and per-core DMA width.
    pub fn new(p: &DevicePreset) -> Fluid {
        Fluid {
            hbm_bw: p.hbm_bytes_per_cycle(),
            l2_bw: p.l2_bytes_per_cycle(),
            cap: p.dma.bytes_per_cycle_per_core,
            now: 0.0,
            cls: Default::default(),
        }
    }

    /// The fluid's clock (cycles, fractional).
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Moves the clock to `t` (≥ now), every transfer moving at its current rate meanwhile.
    pub fn advance_to(&mut self, t: f64) {
        let dt = t - self.now;
        if dt > 0.0 {
            for c in &mut self.cls {
                if c.n > 0 {
                    c.v += c.rate * dt;
                }
            }
            self.now = t;
        }
    }

    /// Starts transfer `id` of `bytes` through `class` now, for `mult` cores at once.
    pub fn add(&mut self, id: u32, class: Class, bytes: u64, mult: u64) {
        let c = &mut self.cls[class as usize];
        c.heap.push(Reverse((Ord64(c.v + bytes as f64), id, mult)));
        c.n += mult;
        self.set_rates();
    }

    /// When the next transfer completes at the current rates (`None`: nothing in flight).
    pub fn next_completion(&self) -> Option<f64> {
        self.next().map(|(t, _)| t)
    }

    fn next(&self) -> Option<(f64, usize)> {
        let mut best: Option<(f64, usize)> = None;
        for (i, c) in self.cls.iter().enumerate() {
            if let Some(Reverse((Ord64(target), _, _))) = c.heap.peek() {
                let t = self.now + ((target - c.v).max(0.0) / c.rate);
                if best.is_none_or(|(b, _)| t < b) {
                    best = Some((t, i));
                }
            }
        }
        best
    }

    /// Advances to the next completion and returns its time with the ids of the transfers that
    /// completed then (at least one), in a fixed order: class, then target, then id.
    pub fn complete_next(&mut self, done: &mut Vec<u32>) -> Option<f64> {
        let (t, first) = self.next()?;
        self.advance_to(t);
        if let Some(Reverse((Ord64(target), _, _))) = self.cls[first].heap.peek().copied() {
            // The class that defined `t` has moved exactly its first transfer's bytes.
            let c = &mut self.cls[first];
            c.v = c.v.max(target);
        }
        for c in &mut self.cls {
            while let Some(Reverse((Ord64(target), id, mult))) = c.heap.peek().copied() {
                if target > c.v + DONE_EPS * target.max(1.0) {
                    break;
                }
                c.heap.pop();
                c.n -= mult;
                done.push(id);
            }
        }
        self.set_rates();
        Some(t)
    }

    /// Max-min fair rates by progressive filling: all classes rise together to `x`, the largest
    /// rate at which no level is over-subscribed and no transfer exceeds its DMA width; a class
    /// crossing only a level that is not yet full then rises further into that level's remainder.
    fn set_rates(&mut self) {
        let [h, w, l] = [0, 1, 2].map(|i| self.cls[i].n as f64);
        let cap = self.cap;
        let hbm_users = h + w;
        let l2_users = h + l;
        let hbm_fair = if hbm_users > 0.0 {
            self.hbm_bw / hbm_users
        } else {
            f64::INFINITY
        };
        let l2_fair = if l2_users > 0.0 {
            self.l2_bw / l2_users
        } else {
            f64::INFINITY
        };
        let x = cap.min(hbm_fair).min(l2_fair);
        let rw = if hbm_fair <= x || w == 0.0 {
            x
        } else {
            cap.min((self.hbm_bw - h * x) / w)
        };
        let rl = if l2_fair <= x || l == 0.0 {
            x
        } else {
            cap.min((self.l2_bw - h * x) / l)
        };
        self.cls[0].rate = x;
        self.cls[1].rate = rw;
        self.cls[2].rate = rl;
    }

    /// Bytes per cycle each transfer of `class` gets now (for tests).
    pub fn rate(&self, class: Class) -> f64 {
        self.cls[class as usize].rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fluid(hbm: f64, l2: f64, cap: f64) -> Fluid {
        Fluid {
            hbm_bw: hbm,
            l2_bw: l2,
            cap,
            now: 0.0,
            cls: Default::default(),
        }
    }

    /// A plain FIFO cache (what [`L2Cache`] was before its lazy eviction): the same reads must
    /// hit and miss alike.
    struct PlainL2 {
        capacity: u64,
        used: u64,
        resident: HashMap<Region, u64>,
        fifo: VecDeque<Region>,
    }

    impl PlainL2 {
        fn read(&mut self, region: Region, bytes: u64) -> Level {
            if self.resident.contains_key(&region) {
                return Level::L2;
            }
            if bytes <= self.capacity {
                while self.used + bytes > self.capacity {
                    let Some(old) = self.fifo.pop_front() else {
                        break;
                    };
                    if let Some(b) = self.resident.remove(&old) {
                        self.used -= b;
                    }
                }
                self.resident.insert(region, bytes);
                self.fifo.push_back(region);
                self.used += bytes;
            }
            Level::Hbm
        }
    }

    #[test]
    fn l2_matches_a_plain_fifo_cache() {
        // A small deterministic generator: windows from a few tensors, sizes around the capacity.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for capacity in [0, 1, 100, 1000, 100_000] {
            let mut fast = L2Cache::new(capacity);
            let mut plain = PlainL2 {
                capacity,
                used: 0,
                resident: HashMap::new(),
                fifo: VecDeque::new(),
            };
            for i in 0..60_000 {
                let r = next();
                let region = Region {
                    tensor: r % 3,
                    // Half the reads from a few hot windows (hits), half from many (purges).
                    offset: (r >> 8) % if r & 1 == 0 { 16 } else { 20_000 },
                    rows: 1,
                    cols: (r >> 20) % 2 + 1,
                };
                let bytes = match (r >> 30) % 8 {
                    0 => 0,
                    1 => capacity + 1,
                    _ => (r >> 40) % (capacity / 4 + 2),
                };
                assert_eq!(
                    fast.read(region, bytes),
                    plain.read(region, bytes),
                    "read {i}, capacity {capacity}"
                );
                assert_eq!(fast.used, plain.used);
            }
        }
    }

    #[test]
    fn equal_transfers_share_and_caps_bind() {
        let mut f = fluid(10.0, 100.0, 100.0);
        f.add(0, Class::HbmRead, 100, 1);
        f.add(1, Class::HbmRead, 100, 1);
        assert!((f.rate(Class::HbmRead) - 5.0).abs() < 1e-12);
        let mut done = vec![];
        assert_eq!(f.complete_next(&mut done), Some(20.0));
        assert_eq!(done, vec![0, 1]);
        // A lone transfer is capped by its core.
        let mut f = fluid(10.0, 100.0, 4.0);
        f.add(0, Class::HbmWrite, 40, 1);
        assert_eq!(f.complete_next(&mut done), Some(10.0));
    }

    #[test]
    fn a_finished_transfer_frees_its_share() {
        // 10 and 100 bytes on 10 B/cycle: both at 5 until the small one ends at 2, then the big
        // one alone at 10: 90 more bytes in 9 cycles, done at 11.
        let mut f = fluid(10.0, 100.0, 100.0);
        f.add(0, Class::HbmRead, 10, 1);
        f.add(1, Class::HbmRead, 100, 1);
        let mut done = vec![];
        assert_eq!(f.complete_next(&mut done), Some(2.0));
        done.clear();
        let t = f.complete_next(&mut done).unwrap();
        assert!((t - 11.0).abs() < 1e-9 && done == vec![1]);
    }

    #[test]
    fn multiplicity_counts_cores_and_levels_fill_in_turn() {
        let mut f = fluid(12.0, 100.0, 100.0);
        f.add(0, Class::HbmRead, 100, 4);
        assert!((f.rate(Class::HbmRead) - 3.0).abs() < 1e-12);
        // Misses hold HBM at 3 each (12 in all); hits take what L2 has left, up to the cap.
        let mut f = fluid(12.0, 20.0, 8.0);
        f.add(0, Class::HbmRead, 100, 4);
        f.add(1, Class::L2Read, 100, 2);
        assert!((f.rate(Class::HbmRead) - 3.0).abs() < 1e-12);
        assert!((f.rate(Class::L2Read) - 4.0).abs() < 1e-12);
        // L2 the bottleneck: misses and hits share it evenly; stores take HBM's remainder.
        let mut f = fluid(100.0, 10.0, 50.0);
        f.add(0, Class::HbmRead, 100, 1);
        f.add(1, Class::L2Read, 100, 1);
        f.add(2, Class::HbmWrite, 100, 1);
        assert!((f.rate(Class::HbmRead) - 5.0).abs() < 1e-12);
        assert!((f.rate(Class::L2Read) - 5.0).abs() < 1e-12);
        assert!((f.rate(Class::HbmWrite) - 50.0).abs() < 1e-12);
    }
}
