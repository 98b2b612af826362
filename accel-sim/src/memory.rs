//! The memory system below SRAM: a shared L2 in front of HBM, with bandwidth shared among cores.

use crate::isa::Region;
use crate::preset::DevicePreset;
use std::collections::{HashMap, VecDeque};

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
/// A DMA read of a window that an earlier program (in program order) already read is an L2 hit while
/// the window is still resident; capacity is enforced first-in first-out. Program order, not host
/// thread order, drives it, so the result is deterministic.
#[derive(Debug, Default)]
pub struct L2Cache {
    capacity: u64,
    used: u64,
    resident: RegionMap,
    fifo: VecDeque<Region>,
}

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

/// The bandwidth one program gets from each level, and the latencies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProgramRates {
    /// Bytes per cycle this program gets from HBM.
    pub hbm: f64,
    /// Bytes per cycle this program gets from L2.
    pub l2: f64,
    /// HBM latency in cycles.
    pub hbm_latency: u64,
    /// L2 hit latency in cycles.
    pub l2_latency: u64,
}

/// What a program asks of the memory system: bytes from HBM (misses and writes) and from L2 (hits).
#[derive(Debug, Clone, Copy, Default)]
pub struct Demand {
    /// HBM bytes (read misses + writes).
    pub hbm: u64,
    /// L2 hit bytes.
    pub l2: u64,
}

/// Shares HBM and L2 bandwidth among the programs of one wave (programs running at once).
///
/// Processor sharing with a per-core cap (water-filling): while programs still have bytes to move,
/// the level's bandwidth is split among them, no one exceeding its core's DMA width; a program that
/// finishes early frees its share for the others. A program's effective rate is its bytes over its
/// finishing time. A program whose reads go partly to L2 and partly to HBM is on each level only
/// part of the time, so it counts on a level in proportion to the share of its bytes served there:
/// 24 GEMM programs that each take 15% of their reads from HBM load HBM like 3.6 programs reading
/// only from it, not like 24. A wave where only one core misses gives that core the whole HBM (up
/// to its DMA width), and a wave where all read only from HBM splits it evenly.
pub fn share_wave(p: &DevicePreset, demands: &[Demand]) -> Vec<ProgramRates> {
    let cap = p.dma.bytes_per_cycle_per_core;
    let hbm: Vec<u64> = demands.iter().map(|d| d.hbm).collect();
    let l2: Vec<u64> = demands.iter().map(|d| d.l2).collect();
    let share = |own: u64, d: &Demand| own as f64 / (d.hbm + d.l2).max(1) as f64;
    let hbm_w: Vec<f64> = demands.iter().map(|d| share(d.hbm, d)).collect();
    let l2_w: Vec<f64> = demands.iter().map(|d| share(d.l2, d)).collect();
    let hbm_rates = water_fill(&hbm, &hbm_w, p.hbm_bytes_per_cycle(), cap);
    let l2_rates = water_fill(&l2, &l2_w, p.l2_bytes_per_cycle(), cap);
    hbm_rates
        .into_iter()
        .zip(l2_rates)
        .map(|(h, l)| ProgramRates {
            hbm: h,
            l2: l,
            hbm_latency: p.hbm_latency_cycles(),
            l2_latency: p.l2_latency_cycles(),
        })
        .collect()
}

/// Effective rate of each demand under capped processor sharing of `total` bytes/cycle, a
/// demand counting `weight` (its share of the time it spends on this level, in `(0, 1]`) towards
/// the number of programs sharing it. No program gets more than `cap` or than `total`.
fn water_fill(demand: &[u64], weight: &[f64], total: f64, cap: f64) -> Vec<f64> {
    let n = demand.len();
    let mut rate = vec![cap.min(total); n];
    let mut order: Vec<usize> = (0..n).filter(|i| demand[*i] > 0).collect();
    order.sort_by_key(|i| (demand[*i], *i));
    let mut t = 0.0f64;
    let mut moved = 0.0f64; // bytes every still-active program has moved so far
                            // Summed in a fixed order (demand, then index), so the rates do not depend on anything else.
    let mut sharing: f64 = order.iter().map(|i| weight[*i]).sum();
    for &i in &order {
        // (`max`: the running sum must not round below the last program's own weight.)
        let r = cap.min(total).min(total / sharing.max(weight[i]));
        let remaining = demand[i] as f64 - moved;
        t += remaining / r;
        moved = demand[i] as f64;
        rate[i] = demand[i] as f64 / t;
        sharing -= weight[i];
    }
    rate
}

impl ProgramRates {
    /// (transfer cycles, latency cycles) for this program to read `bytes` from `level` (no DMA
    /// overhead). The transfer occupies the DMA engine; the latency only delays the data.
    pub fn read_cycles(&self, bytes: u64, level: Level) -> (u64, u64) {
        if bytes == 0 {
            // A window entirely outside the tensor moves nothing (masked prefetch past the end).
            return (0, 0);
        }
        let (bw, lat) = match level {
            Level::L2 => (self.l2, self.l2_latency),
            Level::Hbm => (self.hbm, self.hbm_latency),
        };
        ((bytes as f64 / bw).ceil() as u64, lat)
    }

    /// Cycles for this program to write `bytes` to HBM (posted writes: no latency on the engine).
    pub fn write_cycles(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.hbm).ceil() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_fill_shares_and_caps() {
        let full = [1.0, 1.0];
        // Two equal demands share the total equally.
        let r = water_fill(&[100, 100], &full, 10.0, 100.0);
        assert!((r[0] - 5.0).abs() < 1e-9 && (r[1] - 5.0).abs() < 1e-9);
        // A lone demand is capped by the core.
        let r = water_fill(&[100, 0], &full, 10.0, 4.0);
        assert!((r[0] - 4.0).abs() < 1e-9);
        // Small demand finishes first at the shared rate; the big one then speeds up.
        let r = water_fill(&[10, 100], &full, 10.0, 100.0);
        assert!((r[0] - 5.0).abs() < 1e-9);
        // big: 10 bytes in 2 cycles, then 90 bytes at 10/cycle = 9 cycles → 100/11.
        assert!((r[1] - 100.0 / 11.0).abs() < 1e-9);
    }

    #[test]
    fn programs_count_by_their_share_of_a_level() {
        // Two programs on this level a quarter of the time each: together they load it like half
        // a program, so each gets what it would get alone (never more than the level itself).
        let r = water_fill(&[100, 100], &[0.25, 0.25], 10.0, 100.0);
        assert!((r[0] - 10.0).abs() < 1e-9 && (r[1] - 10.0).abs() < 1e-9);
        // Four at half time share like two.
        let r = water_fill(&[100; 4], &[0.5; 4], 12.0, 100.0);
        assert!(r.iter().all(|x| (x - 6.0).abs() < 1e-9), "{r:?}");
        // Through the wave: 24 programs reading 15% from HBM get their DMA width from HBM, 24
        // reading only from HBM split it.
        let p = DevicePreset::load("npu-910b").unwrap();
        let cap = p.dma.bytes_per_cycle_per_core;
        let mixed = share_wave(&p, &[Demand { hbm: 15, l2: 85 }; 24]);
        assert!(mixed.iter().all(|r| (r.hbm - cap).abs() < 1e-9));
        let pure = share_wave(&p, &[Demand { hbm: 100, l2: 0 }; 24]);
        let even = p.hbm_bytes_per_cycle() / 24.0;
        assert!(pure.iter().all(|r| (r.hbm - even).abs() < 1e-9));
    }
}
