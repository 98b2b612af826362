//! The memory system below SRAM: a shared L2 in front of HBM, with bandwidth shared among cores.

use crate::isa::Region;
use crate::preset::DevicePreset;
use std::collections::{HashMap, VecDeque};

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
    resident: HashMap<Region, u64>,
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

/// Per-core share of the memory system while `active` cores run at once.
#[derive(Debug, Clone, Copy)]
pub struct BandwidthShare {
    /// Bytes per cycle one core gets from HBM.
    pub hbm_per_core: f64,
    /// Bytes per cycle one core gets from L2.
    pub l2_per_core: f64,
    /// HBM latency in cycles.
    pub hbm_latency: u64,
    /// L2 hit latency in cycles.
    pub l2_latency: u64,
}

impl BandwidthShare {
    /// The share each of `active` concurrently running cores gets (capped by the core's DMA width).
    pub fn new(p: &DevicePreset, active: u64) -> BandwidthShare {
        let active = active.max(1) as f64;
        let core = p.dma.bytes_per_cycle_per_core;
        BandwidthShare {
            hbm_per_core: core.min(p.hbm_bytes_per_cycle() / active),
            l2_per_core: core.min(p.l2_bytes_per_cycle() / active),
            hbm_latency: p.hbm_latency_cycles(),
            l2_latency: p.l2_latency_cycles(),
        }
    }

    /// Cycles for one core to read `bytes` from `level` (latency + transfer, no DMA overhead).
    pub fn read_cycles(&self, bytes: u64, level: Level) -> u64 {
        if bytes == 0 {
            // A window entirely outside the tensor moves nothing (masked prefetch past the end).
            return 0;
        }
        let (bw, lat) = match level {
            Level::L2 => (self.l2_per_core, self.l2_latency),
            Level::Hbm => (self.hbm_per_core, self.hbm_latency),
        };
        lat + (bytes as f64 / bw).ceil() as u64
    }

    /// Cycles for one core to write `bytes` to HBM (write-back; latency hidden by posted writes).
    pub fn write_cycles(&self, bytes: u64) -> u64 {
        (bytes as f64 / self.hbm_per_core).ceil() as u64
    }
}
