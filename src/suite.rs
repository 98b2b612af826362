//! The built-in kernel suite: one representative launch per registered operator, run functionally
//! on random data and checked against the f64 reference. `day0 suite` prints one line per kernel
//! (`day0 run` checks the model's own layer kinds instead: [`crate::layer_checks`]).

use accel_sim::{Report, SimError};
use dsl_core::{Config, Launcher};
use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
use kernels::norm::{run_rmsnorm_residual, RmsNormCase};
use kernels::softmax::{run_softmax, SoftmaxCase};

/// One suite entry: a name and how to run it.
pub struct SuiteEntry {
    /// Display name (kernel and shape).
    pub name: String,
    /// Largest max relative error against the f64 reference that passes (bf16 inputs and
    /// outputs round at 2^-8; f32 runs differ from f64 only by accumulation order).
    pub tolerance: f64,
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
        tolerance: tolerance(dtype),
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
            tolerance: tolerance(GemmDtype::F32),
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
            tolerance: tolerance(GemmDtype::Bf16),
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

/// The suite's tolerance for a dtype.
fn tolerance(dtype: GemmDtype) -> f64 {
    match dtype {
        GemmDtype::Bf16 => 1e-2,
        _ => 1e-4,
    }
}

/// Runs every entry of the built-in suite functionally and checks its error against its
/// tolerance (see [`check_entries`]).
pub fn check_all(launcher: &Launcher) -> (usize, Vec<String>) {
    check_entries(launcher, entries())
}

/// Runs `entries` functionally and checks each error against its tolerance: the number that
/// passed, and one line per failure (a launch error, a missing error figure, or an error over
/// the tolerance).
pub fn check_entries(launcher: &Launcher, entries: Vec<SuiteEntry>) -> (usize, Vec<String>) {
    let mut passed = 0;
    let mut failures = Vec::new();
    for e in entries {
        match (e.run)(launcher) {
            Ok(r) => match r.max_rel_error {
                Some(err) if err <= e.tolerance => passed += 1,
                Some(err) => failures.push(format!(
                    "{}: max rel err {err:.3e} over the tolerance {:.0e}",
                    e.name, e.tolerance
                )),
                None => failures.push(format!(
                    "{}: no error figure (was it run cost-only?)",
                    e.name
                )),
            },
            Err(err) => failures.push(format!("{}: {err}", e.name)),
        }
    }
    (passed, failures)
}
