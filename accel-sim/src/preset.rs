//! Device presets: the hardware as data.
//!
//! Every figure the timing model uses comes from a TOML preset file (`accel-sim/presets/*.toml`),
//! each figure commented with its public source. Built-in presets are embedded in the binary;
//! `--device path/to/file.toml` loads any other.

use crate::dtype::DType;
use crate::error::SimError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Matrix (cube / tensor-core / systolic) unit of one core.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MatrixUnit {
    /// Rows of the fragment the unit processes per step.
    pub frag_m: u64,
    /// Columns of the fragment per step.
    pub frag_n: u64,
    /// Reduction depth of the fragment per step.
    pub frag_k: u64,
    /// Fixed cycles per instruction (issue, pipeline fill/drain).
    pub overhead_cycles: u64,
    /// Dense FLOP per cycle per core, keyed by input dtype name (`bf16`, `f16`, `f32`, `fp8e4m3`...).
    /// A dtype absent here is not supported by the matrix unit.
    pub flop_per_cycle: BTreeMap<String, f64>,
}

/// Vector (SIMD) unit of one core.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VectorUnit {
    /// f32 element operations per cycle per core (16-bit types go twice as fast).
    pub f32_lanes: u64,
    /// Fixed cycles per instruction.
    pub overhead_cycles: u64,
    /// Cost multiplier of transcendental ops (exp, log, rsqrt, sigmoid) over a plain add.
    pub transcendental_factor: u64,
}

/// On-chip scratchpad of one core.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Sram {
    /// Bytes a kernel's live tiles may occupy on one core.
    pub bytes_per_core: u64,
}

/// Off-chip device memory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Hbm {
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Aggregate bandwidth in GB/s (10^9 bytes per second).
    pub bandwidth_gbps: f64,
    /// Load-to-use latency in nanoseconds.
    pub latency_ns: f64,
}

/// Last-level on-chip cache shared by all cores.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct L2 {
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// Aggregate bandwidth in GB/s.
    pub bandwidth_gbps: f64,
    /// Hit latency in nanoseconds.
    pub latency_ns: f64,
}

/// The DMA engines of one core.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Dma {
    /// Peak bytes per cycle one core's DMA can move.
    pub bytes_per_cycle_per_core: f64,
    /// Fixed cycles per DMA instruction (descriptor setup).
    pub overhead_cycles: u64,
}

/// How the device starts a launch's programs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Dispatch {
    /// Cycles between the first programs' starts on consecutive cores: the block dispatcher
    /// fills the cores one after another, so core `c` starts its first program at
    /// `c * stagger_cycles`. Real cores never run in exact lockstep; without the stagger,
    /// identical programs started in the same cycle would share every transfer's bandwidth to
    /// the same last cycle and stay in lockstep for the whole launch, which makes latency-bound
    /// launches up to 40% slow and sensitive to a single cycle of any latency. The shipped
    /// presets still say 0 (CALIBRATION.md, "Dispatch": the fitted efficiencies must come
    /// with it).
    pub stagger_cycles: u64,
}

/// Card-to-card interconnect (used by cluster models).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Per-direction bandwidth of one card's links in GB/s.
    pub bandwidth_gbps: f64,
    /// Per-message latency in microseconds.
    pub latency_us: f64,
}

/// One accelerator, described by published figures.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DevicePreset {
    /// Short name (`npu-910b`).
    pub name: String,
    /// One line saying what this device is.
    pub description: String,
    /// Core clock in GHz (cycles are counted at this clock).
    pub clock_ghz: f64,
    /// Compute cores (AI cores / SMs / arrays) that run programs.
    pub cores: u64,
    /// Matrix unit.
    pub matrix: MatrixUnit,
    /// Vector unit.
    pub vector: VectorUnit,
    /// Per-core scratchpad.
    pub sram: Sram,
    /// Shared cache.
    pub l2: L2,
    /// Device memory.
    pub hbm: Hbm,
    /// DMA engines.
    pub dma: Dma,
    /// Program dispatch.
    pub dispatch: Dispatch,
    /// Interconnect.
    pub link: Link,
    /// Systolic array shape, for devices whose matrix unit is one (timed per dataflow by
    /// [`crate::systolic`]); absent on other devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub systolic: Option<crate::systolic::SystolicArray>,
    /// Accumulator storage apart from the scratchpad (e.g. tensor-core accumulators in the
    /// register file); absent where accumulators live in `sram`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accumulators: Option<Accumulators>,
    /// Fitted efficiency factors (see [`crate::calibration`]); absent means ideal (1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<Efficiency>,
}

/// Storage for matrix-unit accumulator tiles that is not the scratchpad.
///
/// On Hopper, `wgmma` accumulates into registers: an output tile's f32 accumulator counts
/// against the register file, its input tiles against shared memory. A kernel fits only if
/// both do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Accumulators {
    /// Bytes of accumulator tiles one core can hold at once.
    pub bytes_per_core: u64,
}

/// Efficiency factors: the share of a peak figure real kernels reach, fitted against published
/// measurements by `day0 calibrate --fit` (each one is an estimate, not a datasheet figure).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Share of the matrix unit's peak FLOP/s a tuned kernel sustains (clock throttling under
    /// load, issue overheads the tile model does not see).
    pub matrix: f64,
    /// Share of the HBM peak bandwidth streaming kernels sustain (refresh, page misses).
    pub hbm: f64,
}

/// Built-in presets: (name, TOML text).
const BUILTIN: &[(&str, &str)] = &[
    ("npu-910b", include_str!("../presets/npu-910b.toml")),
    ("h200", include_str!("../presets/h200.toml")),
    ("systolic-128", include_str!("../presets/systolic-128.toml")),
    ("h800", include_str!("../presets/h800.toml")),
];

impl DevicePreset {
    /// Names of the presets compiled into day0.
    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN.iter().map(|(n, _)| *n).collect()
    }

    /// Loads a built-in preset by name, or a TOML file if `name_or_path` ends in `.toml`.
    pub fn load(name_or_path: &str) -> Result<DevicePreset, SimError> {
        if name_or_path.ends_with(".toml") {
            let text =
                std::fs::read_to_string(Path::new(name_or_path)).map_err(|e| SimError::Preset {
                    source: name_or_path.to_string(),
                    field: None,
                    message: format!("cannot read file: {e}"),
                })?;
            return Self::from_toml(name_or_path, &text);
        }
        match BUILTIN.iter().find(|(n, _)| *n == name_or_path) {
            Some((n, text)) => Self::from_toml(n, text),
            None => Err(SimError::Preset {
                source: name_or_path.to_string(),
                field: None,
                message: format!(
                    "no such preset; built-in presets are {} (or pass a path to a .toml file)",
                    Self::builtin_names().join(", ")
                ),
            }),
        }
    }

    /// Parses and validates a preset from TOML text; `source` names it in errors.
    pub fn from_toml(source: &str, text: &str) -> Result<DevicePreset, SimError> {
        let preset: DevicePreset = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            SimError::Preset {
                source: source.to_string(),
                field: field_of_toml_error(&msg),
                message: msg,
            }
        })?;
        preset.validate(source)?;
        Ok(preset)
    }

    fn validate(&self, source: &str) -> Result<(), SimError> {
        let bad = |field: &str, message: &str| SimError::Preset {
            source: source.to_string(),
            field: Some(field.to_string()),
            message: message.to_string(),
        };
        // Upper bounds far beyond any real chip: a figure past one is a typo or a wrong unit,
        // and would overflow the timing model's arithmetic (a clock of 1e300 GHz did).
        let positive_f = [
            ("clock_ghz", self.clock_ghz, 100.0),
            ("hbm.bandwidth_gbps", self.hbm.bandwidth_gbps, 1e6),
            ("l2.bandwidth_gbps", self.l2.bandwidth_gbps, 1e6),
            (
                "dma.bytes_per_cycle_per_core",
                self.dma.bytes_per_cycle_per_core,
                1e6,
            ),
            ("link.bandwidth_gbps", self.link.bandwidth_gbps, 1e6),
        ];
        for (f, v, max) in positive_f {
            if !(v.is_finite() && v > 0.0) {
                return Err(bad(f, &format!("must be a positive number, got {v}")));
            }
            if v > max {
                return Err(bad(f, &too_large(v, max)));
            }
        }
        for (f, v, max) in [
            ("hbm.latency_ns", self.hbm.latency_ns, 1e9),
            ("link.latency_us", self.link.latency_us, 1e6),
            ("l2.latency_ns", self.l2.latency_ns, 1e9),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(bad(f, &format!("must be a non-negative number, got {v}")));
            }
            if v > max {
                return Err(bad(f, &too_large(v, max)));
            }
        }
        let positive_u = [
            ("cores", self.cores, 1 << 20),
            ("matrix.frag_m", self.matrix.frag_m, 1 << 16),
            ("matrix.frag_n", self.matrix.frag_n, 1 << 16),
            ("matrix.frag_k", self.matrix.frag_k, 1 << 16),
            ("vector.f32_lanes", self.vector.f32_lanes, 1 << 20),
            (
                "vector.transcendental_factor",
                self.vector.transcendental_factor,
                1 << 16,
            ),
            ("sram.bytes_per_core", self.sram.bytes_per_core, 1 << 40),
            ("hbm.capacity_bytes", self.hbm.capacity_bytes, 1 << 56),
        ];
        for (f, v, max) in positive_u {
            if v == 0 {
                return Err(bad(f, "must be greater than zero"));
            }
            if v > max {
                return Err(bad(f, &too_large(v as f64, max as f64)));
            }
        }
        if self.dispatch.stagger_cycles > 1 << 20 {
            return Err(bad(
                "dispatch.stagger_cycles",
                &too_large(self.dispatch.stagger_cycles as f64, (1u64 << 20) as f64),
            ));
        }
        if self.l2.capacity_bytes > 1 << 48 {
            return Err(bad(
                "l2.capacity_bytes",
                &too_large(self.l2.capacity_bytes as f64, (1u64 << 48) as f64),
            ));
        }
        if self.matrix.flop_per_cycle.is_empty() {
            return Err(bad(
                "matrix.flop_per_cycle",
                "must list at least one dtype, e.g. `bf16 = 8192`",
            ));
        }
        for (k, v) in &self.matrix.flop_per_cycle {
            if DType::parse(k).is_none() {
                return Err(bad(
                    &format!("matrix.flop_per_cycle.{k}"),
                    "unknown dtype; use one of f32, bf16, f16, fp8e4m3, fp8e5m2, fp4e2m1",
                ));
            }
            if !(v.is_finite() && *v > 0.0) {
                return Err(bad(
                    &format!("matrix.flop_per_cycle.{k}"),
                    "must be a positive number",
                ));
            }
            if *v > 1e9 {
                return Err(bad(
                    &format!("matrix.flop_per_cycle.{k}"),
                    &too_large(*v, 1e9),
                ));
            }
        }
        if let Some(a) = &self.systolic {
            if a.rows == 0 || a.cols == 0 {
                return Err(bad("systolic", "rows and cols must be greater than zero"));
            }
            if a.rows > 1 << 16 || a.cols > 1 << 16 {
                return Err(bad("systolic", "rows and cols must be at most 65536"));
            }
        }
        if let Some(a) = &self.accumulators {
            if a.bytes_per_core == 0 {
                return Err(bad(
                    "accumulators.bytes_per_core",
                    "must be greater than zero",
                ));
            }
            if a.bytes_per_core > 1 << 40 {
                return Err(bad(
                    "accumulators.bytes_per_core",
                    &too_large(a.bytes_per_core as f64, (1u64 << 40) as f64),
                ));
            }
        }
        if let Some(e) = &self.efficiency {
            for (f, v) in [("efficiency.matrix", e.matrix), ("efficiency.hbm", e.hbm)] {
                if !(v.is_finite() && v > 0.0 && v <= 1.0) {
                    return Err(bad(f, &format!("must be in (0, 1], got {v}")));
                }
            }
        }
        Ok(())
    }

    /// This preset with its efficiency factors applied to the peak figures they scale (matrix
    /// FLOP per cycle, HBM bandwidth): the device as tuned kernels see it. Without factors, a
    /// plain copy.
    pub fn derated(&self) -> DevicePreset {
        let mut p = self.clone();
        if let Some(e) = &self.efficiency {
            for v in p.matrix.flop_per_cycle.values_mut() {
                *v *= e.matrix;
            }
            p.hbm.bandwidth_gbps *= e.hbm;
        }
        p
    }

    /// Matrix-unit FLOP per cycle per core for inputs of `dtype`, or `None` if unsupported.
    pub fn matrix_flop_per_cycle(&self, dtype: DType) -> Option<f64> {
        self.matrix.flop_per_cycle.get(dtype.name()).copied()
    }

    /// HBM bytes per core-clock cycle, whole device.
    pub fn hbm_bytes_per_cycle(&self) -> f64 {
        self.hbm.bandwidth_gbps / self.clock_ghz
    }

    /// L2 bytes per core-clock cycle, whole device.
    pub fn l2_bytes_per_cycle(&self) -> f64 {
        self.l2.bandwidth_gbps / self.clock_ghz
    }

    /// Largest DMA transfer whose bytes always move within one cycle: the lowest rate the shared
    /// memory system ever gives a transfer is its bandwidth split over every core with a transfer
    /// in flight on both DMA queues (or the core's DMA width, if lower). Such a transfer (a GEMM's
    /// per-block FP8 scale, 4 bytes) finishes one cycle after it arrives whatever else is in
    /// flight, so the timing model books it without the bandwidth-sharing simulation.
    pub fn one_cycle_transfer_bytes(&self) -> u64 {
        let users = 2.0 * self.cores.max(1) as f64;
        self.dma
            .bytes_per_cycle_per_core
            .min(self.hbm_bytes_per_cycle() / users)
            .min(self.l2_bytes_per_cycle() / users)
            .floor()
            .max(0.0) as u64
    }

    /// HBM latency in cycles.
    pub fn hbm_latency_cycles(&self) -> u64 {
        (self.hbm.latency_ns * self.clock_ghz).round() as u64
    }

    /// L2 hit latency in cycles.
    pub fn l2_latency_cycles(&self) -> u64 {
        (self.l2.latency_ns * self.clock_ghz).round() as u64
    }

    /// Converts cycles to microseconds at the preset clock.
    pub fn cycles_to_us(&self, cycles: u64) -> f64 {
        cycles as f64 / (self.clock_ghz * 1e3)
    }
}

/// Pulls the field name out of serde/toml messages such as "missing field `clock_ghz`".
fn field_of_toml_error(msg: &str) -> Option<String> {
    let start = msg.find('`')? + 1;
    let end = start + msg[start..].find('`')?;
    Some(msg[start..end].to_string())
}

/// The refusal of a preset figure beyond any real chip.
fn too_large(v: f64, max: f64) -> String {
    format!("{v} is above {max}, beyond any real chip (a typo, or a wrong unit?)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_presets_load_and_validate() {
        for name in DevicePreset::builtin_names() {
            let p = DevicePreset::load(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(p.name, name);
        }
    }

    #[test]
    fn missing_field_is_named() {
        let text = BUILTIN[0].1.replace("clock_ghz", "clock_ghz_typo");
        let err = DevicePreset::from_toml("edited", &text).unwrap_err();
        let s = err.to_string();
        assert!(s.contains("clock_ghz"), "{s}");
    }

    #[test]
    fn invalid_value_is_named() {
        let text = BUILTIN[0].1.replacen("cores = ", "cores = 0 #", 1);
        let err = DevicePreset::from_toml("edited", &text).unwrap_err();
        match err {
            SimError::Preset { field: Some(f), .. } => assert_eq!(f, "cores"),
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn unknown_preset_lists_builtins() {
        let s = DevicePreset::load("tpu-v9").unwrap_err().to_string();
        assert!(s.contains("npu-910b") && s.contains("h200"), "{s}");
    }
}
