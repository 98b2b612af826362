//! The built-in kernel suite: one representative launch per registered operator, run functionally
//! on random data and checked against the f64 reference. `day0 run` prints one line per kernel.

use accel_sim::{Report, SimError};
use dsl_core::{Config, Launcher};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use kernels::norm::{run_rmsnorm_residual, RmsNormCase};
use kernels::softmax::{run_softmax, SoftmaxCase};

/// One suite entry: a name and how to run it.
pub struct SuiteEntry {
    /// Display name (kernel and shape).
    pub name: String,
    /// Runs the entry on a launcher.
    pub run: RunEntry,
}

/// How a suite entry runs: on the launcher it is given.
pub type RunEntry = Box<dyn Fn(&Launcher) -> Result<Report, SimError>>;

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
        gemm_entry(GemmVariant::Pipelined, GemmDtype::Bf16, 1024, 1024, 1024),
        gemm_entry(GemmVariant::Persistent, GemmDtype::Bf16, 1024, 1024, 1024),
        gemm_entry(GemmVariant::DoubleBuffered, GemmDtype::F32, 1000, 500, 300),
        SuiteEntry {
            name: "softmax[f32] 512x4000".into(),
            run: Box::new(|l| {
                let case = SoftmaxCase {
                    rows: 512,
                    cols: 4000,
                    dtype: GemmDtype::F32,
                    config: Config::new(),
                    seed: 7,
                };
                Ok(run_softmax(l, &case)?.launch.report)
            }),
        },
        SuiteEntry {
            name: "rmsnorm_residual[bf16] 256x7168".into(),
            run: Box::new(|l| {
                let case = RmsNormCase {
                    rows: 256,
                    hidden: 7168,
                    dtype: GemmDtype::Bf16,
                    config: Config::new(),
                    eps: 1e-6,
                    seed: 7,
                };
                Ok(run_rmsnorm_residual(l, &case)?.launch.report)
            }),
        },
    ]
}
