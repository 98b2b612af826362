//! `day0 compare`: the implementations of one operator side by side on the same inputs. Each runs
//! at its own best tiles for the shape (from `day0 tune`'s sweep, cached), functionally on the same
//! seeded random inputs, and reports its max relative error against the f64 reference and its
//! simulated cycles — the check a user makes before swapping one implementation for another.

use crate::tune::{self, Row, Shape, Status, Target, TuneRequest};
use dsl_core::{Backend, Launcher};
use kernels::gemm::GemmDtype;
use serde::Serialize;
use std::collections::BTreeMap;

/// One implementation's line of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// Kernel name.
    pub implementation: String,
    /// How it was written, from the registry: `dsl` (a `#[kernel]` prototype) or `dsl-tuned` (a
    /// DSL kernel with explicit prefetch or buffering).
    pub kind: String,
    /// The tiles it ran with (its fastest configuration at this shape).
    pub config: BTreeMap<String, i64>,
    /// Simulated cycles.
    pub cycles: u64,
    /// Time in µs at the preset clock.
    pub time_us: f64,
    /// Max relative error against the f64 reference (`None` in cost-only comparisons).
    pub max_rel_error: Option<f64>,
    /// The dtype's tolerance.
    pub tolerance: f64,
    /// Within tolerance (always true cost-only, where nothing is computed).
    pub ok: bool,
    /// Cycles of the slowest implementation over this one's (1.0 for the slowest).
    pub speedup: f64,
}

/// A comparison (the `--json` object).
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The operator.
    pub op: String,
    /// The shape, canonical.
    pub shape: String,
    /// Input dtype.
    pub dtype: String,
    /// Device preset.
    pub device: String,
    /// Whether numbers were computed (false with `--cost-only`).
    pub functional: bool,
    /// One entry per implementation, fastest first.
    pub implementations: Vec<Entry>,
}

/// The registry's word for how an implementation was written.
pub fn kind_name(kind: kernels::registry::ImplKind) -> &'static str {
    match kind {
        kernels::registry::ImplKind::Dsl => "dsl",
        kernels::registry::ImplKind::DslTuned => "dsl-tuned",
        kernels::registry::ImplKind::HandTuned => "hand-tuned",
    }
}

/// How the registry says `meta` was written (`dsl` when it is not registered).
fn kind_of(meta: &dsl_core::KernelMeta) -> &'static str {
    kernels::registry::all()
        .into_iter()
        .find(|i| i.meta.name == meta.name)
        .map_or("dsl", |i| kind_name(i.kind))
}

/// A shape small enough to run functionally in seconds, per family, when `--shape` is not given.
pub fn default_shape(target: &Target) -> Result<Shape, String> {
    let text = match target.family {
        tune::Family::Gemm => "512x512x512",
        tune::Family::Prefill => "seq=256,heads=8,kv_heads=2,head_dim=128",
        tune::Family::SparseMla => "seq=1,ctx=4096,heads=16,topk=512",
        tune::Family::Decode => "ctx=2048,heads=16,kv_heads=4",
        tune::Family::ExpertMxfp4 => "experts=4,tokens=32,n=512,k=1024",
    };
    Shape::parse(target.family, text)
}

/// The fastest configuration of `meta` at the request's shape: from the tune cache when present,
/// else a cost-only sweep of its space (cached for next time).
pub fn best_config(req: &TuneRequest, meta: &'static dsl_core::KernelMeta) -> Result<Row, String> {
    let one = TuneRequest {
        kernel: meta.name.to_string(),
        target: Target {
            family: req.target.family,
            impls: vec![meta],
        },
        ..req.clone()
    };
    let result = match tune::load_cached(&one) {
        Some(r) => r,
        None => {
            let r = tune::tune(&one, &|| {})?;
            // A cache that cannot be written costs the next run time, not this answer.
            let _ = tune::store_cached(&one, &r);
            r
        }
    };
    result
        .configs
        .into_iter()
        .find(|r| r.status == Status::Ok)
        .ok_or_else(|| {
            format!(
                "{}: no configuration of its tunable space runs at {} on {}",
                meta.name,
                req.shape.canonical(),
                req.preset.name
            )
        })
}

/// Compares every implementation of `req.target` at `req.shape`: functionally on the same seeded
/// inputs unless `cost_only`.
pub fn compare(req: &TuneRequest, cost_only: bool) -> Result<Comparison, String> {
    let launcher = Launcher::new(req.preset.clone());
    let launcher = if cost_only {
        launcher.with_backend(Backend::CostOnly)
    } else {
        launcher
    };
    let tol = tune::tolerance(req.dtype);
    let mut entries = Vec::new();
    for meta in &req.target.impls {
        let best = best_config(req, meta)?;
        let config = dsl_core::Config(best.config.clone());
        let report = tune::evaluate(&launcher, meta, &config, &req.shape, req.dtype)
            .map_err(|e| format!("{}: {e}", meta.name))?;
        let err = report.max_rel_error;
        entries.push(Entry {
            implementation: meta.name.to_string(),
            kind: kind_of(meta).into(),
            config: best.config,
            cycles: report.cycles,
            time_us: report.cycles as f64 / (req.preset.clock_ghz * 1e3),
            max_rel_error: err,
            tolerance: tol,
            ok: cost_only || err.is_some_and(|e| e <= tol),
            speedup: 1.0,
        });
    }
    let slowest = entries.iter().map(|e| e.cycles).max().unwrap_or(1).max(1);
    for e in &mut entries {
        e.speedup = slowest as f64 / e.cycles.max(1) as f64;
    }
    // Stable: ties keep registry order.
    entries.sort_by_key(|e| e.cycles);
    Ok(Comparison {
        op: req.target.family.op().to_string(),
        shape: req.shape.canonical(),
        dtype: match req.dtype {
            GemmDtype::F32 => "f32".into(),
            GemmDtype::Bf16 => "bf16".into(),
        },
        device: req.preset.name.clone(),
        functional: !cost_only,
        implementations: entries,
    })
}

/// The comparison as a table.
pub fn table(c: &Comparison) -> String {
    let mut s = format!(
        "{} at {} ({}) on {}{}\n",
        c.op,
        c.shape,
        c.dtype,
        c.device,
        if c.functional {
            ", same random inputs, f64 reference"
        } else {
            " (cost-only: cycles without numbers)"
        }
    );
    s.push_str(&format!(
        "{:<26} {:<10} {:>12} {:>10} {:>8}  {:>12}  config\n",
        "implementation", "kind", "cycles", "µs", "speedup", "max rel err"
    ));
    for e in &c.implementations {
        let err = match e.max_rel_error {
            Some(v) => format!("{v:.2e}{}", if e.ok { "" } else { " FAIL" }),
            None => "-".into(),
        };
        s.push_str(&format!(
            "{:<26} {:<10} {:>12} {:>10.1} {:>7.2}x  {:>12}  {}\n",
            e.implementation,
            e.kind,
            e.cycles,
            e.time_us,
            e.speedup,
            err,
            dsl_core::Config(e.config.clone())
        ));
    }
    if c.functional {
        s.push_str(&format!(
            "reference: f64 on the host (tolerance {:.0e} for {})\n",
            c.implementations.first().map_or(0.0, |e| e.tolerance),
            c.dtype
        ));
    }
    s
}
