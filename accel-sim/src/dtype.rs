//! Element types the machine stores and computes with.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A storage / compute element type. Sizes are in bits so that 4-bit formats are exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE binary16.
    F16,
    /// OCP FP8 E4M3 ("fn": no infinity).
    Fp8e4m3,
    /// OCP FP8 E5M2.
    Fp8e5m2,
    /// OCP FP4 E2M1.
    Fp4e2m1,
    /// Raw bytes (packed blocks, E8M0 scales).
    U8,
    /// 32-bit signed integers (indices).
    I32,
}

impl DType {
    /// Bits per element.
    #[inline]
    pub const fn bits(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 32,
            DType::Bf16 | DType::F16 => 16,
            DType::Fp8e4m3 | DType::Fp8e5m2 | DType::U8 => 8,
            DType::Fp4e2m1 => 4,
        }
    }

    /// Bytes occupied by `n` elements (rounded up to whole bytes).
    #[inline]
    pub const fn bytes_for(self, n: u64) -> u64 {
        (n * self.bits()).div_ceil(8)
    }

    /// The name used in presets, reports and the CLI.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::Fp8e4m3 => "fp8e4m3",
            DType::Fp8e5m2 => "fp8e5m2",
            DType::Fp4e2m1 => "fp4e2m1",
            DType::U8 => "u8",
            DType::I32 => "i32",
        }
    }

    /// Parses a name as written by [`DType::name`] (also accepts `fp8` for E4M3).
    pub fn parse(s: &str) -> Option<DType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" => DType::F32,
            "bf16" | "bfloat16" => DType::Bf16,
            "f16" | "fp16" | "float16" => DType::F16,
            "fp8" | "fp8e4m3" | "e4m3" => DType::Fp8e4m3,
            "fp8e5m2" | "e5m2" => DType::Fp8e5m2,
            "fp4" | "fp4e2m1" | "e2m1" => DType::Fp4e2m1,
            "u8" => DType::U8,
            "i32" => DType::I32,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
