//! The built-in kernel suite: one representative launch per registered operator, run functionally
//! on random data and checked against the f64 reference. `day0 run` prints one line per kernel.

use accel_sim::{Report, SimError};
use dsl_core::{Config, Launcher};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};

/// One suite entry: a name and how to run it.
pub struct SuiteEntry {
    /// Display name (kernel and shape).
    pub name: String,
    /// Runs the entry on a launcher.
    pub run: Box<dyn Fn(&Launcher) -> Result<Report, SimError>>,
}

fn gemm_entry(variant: GemmVariant, dtype: GemmDtype, m: usize, n: usize, k: usize) -> SuiteEntry {
    let name = format!(
        "{}[{}] {m}x{n}x{k}",
        variant.meta().name,
        if dtype == GemmDtype::Bf16 {
            "bf16"
        } else {
            "f32"
        }
    );
    SuiteEntry {
        name,
        run: Box::new(move |l| {
            let case = GemmCase {
                m,
                n,
                k,
                dtype,
                variant,
                config: Config::new(),
                seed: 7,
            };
            Ok(run_gemm(l, &case)?.launch.report)
        }),
    }
}

/// The suite, in display order.
pub fn entries() -> Vec<SuiteEntry> {
    vec![
        gemm_entry(GemmVariant::Naive, GemmDtype::Bf16, 1024, 1024, 1024),
        gemm_entry(
            GemmVariant::DoubleBuffered,
            GemmDtype::Bf16,
            1024,
            1024,
            1024,
        ),
        gemm_entry(GemmVariant::DoubleBuffered, GemmDtype::F32, 1000, 500, 300),
    ]
}
