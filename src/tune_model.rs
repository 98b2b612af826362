//! `day0 tune --model`: the tiles of every tunable launch a model makes at its prefill and decode
//! shapes, measured instead of guessed, and the tuning file `day0 forward` and `day0 run` read.
//!
//! The tuner runs the model's cost-only prefill and decode step once with a recording tuning
//! table ([`dsl_core::Tuning::recording`]): every launch site that lets a table choose its tiles
//! ([`kernels::tunable`]) reports its kernel, its launch key and its heuristic tiles. Each such
//! launch is then run alone, cost-only, at every configuration of the kernel's declared space (in
//! parallel); the fastest that beats the heuristic is spot-checked functionally against the
//! heuristic's output at a reduced shape, and written. A tuning file lists every launch with both
//! configurations and their cycles, so the gain is on record.

use crate::tune::fnv1a;
use dsl_core::{Backend, Config, Launcher, SimError, Tuning};
use kernels::tunable;
use model::config::ModelConfig;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Version of the tuning file's layout.
const SCHEMA: u32 = 1;

/// Seed of the spot check's random inputs.
const SPOT_SEED: u64 = 7;

/// Largest relative difference between the tuned and the heuristic configuration's outputs at the
/// spot check (the same products summed in another order).
pub const SPOT_TOLERANCE: f64 = 1e-4;

/// What to tune: a model on one device at a prefill and a decode shape.
#[derive(Debug, Clone)]
pub struct ModelTuneRequest {
    /// The model.
    pub cfg: ModelConfig,
    /// Its name in reports (the config path or preset name).
    pub model: String,
    /// Device preset name or `.toml` path.
    pub device: String,
    /// Prompt tokens of the prefill.
    pub prompt_len: usize,
    /// Sequences of the decode step.
    pub batch: usize,
    /// Context of the decode step.
    pub context: usize,
}

/// One tuned launch (an entry of the tuning file).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TunedLaunch {
    /// Kernel name.
    pub kernel: String,
    /// Launch key (`m=…,n=…,k=…` or `rows=…,experts=…,n=…,k=…`).
    pub key: String,
    /// The configuration the model launches with this file.
    pub config: BTreeMap<String, i64>,
    /// Its simulated cycles.
    pub cycles: u64,
    /// The heuristic configuration the forward would launch without a tuning file.
    pub heuristic: BTreeMap<String, i64>,
    /// Its simulated cycles.
    pub heuristic_cycles: u64,
    /// Configurations of the declared space that ran, overflowed on-chip memory, or were refused.
    pub configs_run: usize,
    /// Configurations whose tiles do not fit a core.
    pub configs_overflow: usize,
    /// Largest relative difference from the heuristic's output at the spot check's reduced
    /// shape (`None` when the heuristic is kept and nothing needed checking).
    pub spot_check_rel_diff: Option<f64>,
    /// Why the heuristic was kept, when a faster configuration was not taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A tuning file: what `day0 tune --model` measured, and what `--tuning FILE` applies.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TuningFile {
    /// Layout version.
    pub schema: u32,
    /// The model (config path or preset name).
    pub model: String,
    /// Hash of the parsed configuration (which model the shapes belong to).
    pub model_hash: String,
    /// Device preset.
    pub device: String,
    /// Prefill prompt tokens tuned at.
    pub prompt_len: usize,
    /// Decode batch tuned at.
    pub batch: usize,
    /// Decode context tuned at.
    pub context: usize,
    /// Hash of the tunable kernels' sources and spaces: a file from other kernels is stale.
    pub kernels_hash: String,
    /// Every tunable launch of the prefill and the decode step, by kernel and key.
    pub launches: Vec<TunedLaunch>,
    /// Implementations pinned for swappable operators (`op` → implementation, as `--impl
    /// OP=NAME`; an `--impl` flag for the same operator wins). Empty as the tuner writes it:
    /// each launch then runs the fastest verified implementation at its shapes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub implementations: BTreeMap<String, String>,
}

/// A tuning file in effect: its table, where it came from, and the implementations it pins as
/// `OP=NAME` (applied before the command's own `--impl` flags, which override them).
#[derive(Debug, Clone)]
pub struct ResolvedTuning {
    /// The tiles.
    pub table: Arc<Tuning>,
    /// The file.
    pub path: PathBuf,
    /// `OP=NAME` per pinned operator.
    pub impls: Vec<String>,
}

impl ResolvedTuning {
    /// The pins of `resolved` (none without a file) followed by the command's `--impl` flags.
    pub fn impls_then(resolved: Option<&ResolvedTuning>, flags: &[String]) -> Vec<String> {
        resolved
            .map_or(&[][..], |r| &r.impls[..])
            .iter()
            .chain(flags)
            .cloned()
            .collect()
    }
}

/// Hash of a parsed model configuration.
pub fn model_hash(cfg: &ModelConfig) -> String {
    format!("{:016x}", fnv1a(format!("{cfg:?}").as_bytes()))
}

/// Hash of the tunable kernels' sources, lines and declared spaces.
pub fn kernels_hash() -> String {
    let material: Vec<String> = tunable::metas()
        .iter()
        .map(|m| {
            format!(
                "{}:{:016x}:{:?}:{:?}:{:?}",
                m.name, m.source_hash, m.tunables, m.points, m.constraints
            )
        })
        .collect();
    format!("{:016x}", fnv1a(material.join("\n").as_bytes()))
}

/// Where `day0 tune --model` writes a model's tuning file for a device (`device`: the preset's
/// name) by default, and where `day0 forward` and `day0 run` look for one:
/// `$XDG_CACHE_HOME/day0/tuning-<model type>-<config hash>-<device>.json`.
pub fn default_path(cfg: &ModelConfig, device: &str) -> Option<PathBuf> {
    let device: String = device
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    crate::tune::cache_dir().map(|d| {
        d.join(format!(
            "tuning-{}-{}-{device}.json",
            cfg.model_type,
            model_hash(cfg)
        ))
    })
}

fn to_map(c: &Config) -> BTreeMap<String, i64> {
    c.0.clone()
}

/// The launches the model makes at the request's shapes whose tiles a table may choose: (kernel,
/// key, heuristic configuration), sorted.
pub fn discover(req: &ModelTuneRequest) -> Result<Vec<(String, String, Config)>, String> {
    use model::plan::estimate::{Estimator, Phase, Routing};
    use model::plan::parallel::Plan;
    let cluster = accel_sim::cluster::ClusterPreset::single_card(&req.device)
        .map_err(|e| format!("--device: {e}"))?;
    let recording = Arc::new(Tuning::recording());
    let est = Estimator::new(req.cfg.clone(), cluster, Routing::Uniform)
        .map_err(|e| e.to_string())?
        .with_tuning(Some(recording.clone()));
    let one = Plan {
        tp: 1,
        dp: 1,
        pp: 1,
        ep: 1,
    };
    est.estimate(&one, Phase::Prefill, 1, req.prompt_len)
        .map_err(|e| format!("--prompt-len {}: {e}", req.prompt_len))?;
    est.estimate(&one, Phase::Decode, req.batch, req.context)
        .map_err(|e| format!("--batch {} --context {}: {e}", req.batch, req.context))?;
    Ok(recording.asked())
}

/// What one configuration of one launch gave.
enum Outcome {
    Cycles(u64),
    Overflow,
    Refused(String),
}

fn cost(launcher: &Launcher, kernel: &str, key: &str, cfg: &Config) -> Outcome {
    match tunable::run_at(launcher, kernel, key, cfg, SPOT_SEED) {
        Ok((r, _)) => Outcome::Cycles(r.cycles),
        Err(SimError::SramOverflow { .. }) => Outcome::Overflow,
        Err(e) => Outcome::Refused(e.to_string()),
    }
}

/// Largest relative difference between `kernel`'s outputs under `a` and `b` at the reduced key
/// of `key`, on the same random inputs.
fn spot_check(
    preset: &accel_sim::DevicePreset,
    kernel: &str,
    key: &str,
    a: &Config,
    b: &Config,
) -> Result<f64, String> {
    let small = tunable::reduced_key(kernel, key)?;
    let l = Launcher::new(preset.clone());
    let out = |c: &Config| {
        tunable::run_at(&l, kernel, &small, c, SPOT_SEED)
            .map_err(|e| format!("{kernel} at {small} with {c}: {e}"))?
            .1
            .ok_or_else(|| format!("{kernel}: the functional run returned no output"))
    };
    let (x, y) = (out(a)?, out(b)?);
    Ok(x.iter()
        .zip(&y)
        .map(|(p, q)| {
            let (p, q) = (*p as f64, *q as f64);
            if p.is_finite() && q.is_finite() {
                (p - q).abs() / p.abs().max(1e-3)
            } else {
                f64::INFINITY
            }
        })
        .fold(0.0, f64::max))
}

/// Tunes every launch of the request ([`discover`]); `on_done` is called once per configuration
/// run (from any thread), `total` configurations in all (told first, through `on_total`).
pub fn tune_model(
    req: &ModelTuneRequest,
    on_total: &dyn Fn(usize),
    on_done: &(dyn Fn() + Sync),
) -> Result<TuningFile, String> {
    let preset = accel_sim::DevicePreset::load(&req.device)
        .map_err(|e| format!("--device {}: {e}", req.device))?;
    let launches = discover(req)?;
    let mut jobs: Vec<(usize, Option<Config>)> = Vec::new();
    for (i, (kernel, _, _)) in launches.iter().enumerate() {
        let meta = tunable::meta(kernel).ok_or_else(|| format!("{kernel}: not tunable"))?;
        jobs.push((i, None));
        jobs.extend(meta.space().into_iter().map(|c| (i, Some(c))));
    }
    on_total(jobs.len());
    let launcher = Launcher::new(preset.clone()).with_backend(Backend::CostOnly);
    let results: Vec<Outcome> = jobs
        .par_iter()
        .map(|(i, c)| {
            let (kernel, key, heuristic) = &launches[*i];
            let r = cost(&launcher, kernel, key, c.as_ref().unwrap_or(heuristic));
            on_done();
            r
        })
        .collect();
    let mut tuned = Vec::new();
    for (i, (kernel, key, heuristic)) in launches.iter().enumerate() {
        let mut heuristic_cycles = None;
        let (mut best, mut run, mut overflow) = (None::<(u64, Config)>, 0, 0);
        for ((j, c), r) in jobs.iter().zip(&results) {
            if *j != i {
                continue;
            }
            match (c, r) {
                (None, Outcome::Cycles(cy)) => heuristic_cycles = Some(*cy),
                (None, Outcome::Overflow) => {
                    return Err(format!(
                        "{kernel} at {key}: the heuristic tiles overflow a core"
                    ))
                }
                (None, Outcome::Refused(e)) => return Err(format!("{kernel} at {key}: {e}")),
                (Some(c), Outcome::Cycles(cy)) => {
                    run += 1;
                    if best.as_ref().is_none_or(|(b, _)| cy < b) {
                        best = Some((*cy, c.clone()));
                    }
                }
                (Some(_), Outcome::Overflow) => overflow += 1,
                (Some(_), Outcome::Refused(_)) => {}
            }
        }
        let heuristic_cycles = heuristic_cycles.expect("the heuristic ran");
        let mut entry = TunedLaunch {
            kernel: kernel.clone(),
            key: key.clone(),
            config: to_map(heuristic),
            cycles: heuristic_cycles,
            heuristic: to_map(heuristic),
            heuristic_cycles,
            configs_run: run,
            configs_overflow: overflow,
            spot_check_rel_diff: None,
            note: None,
        };
        if let Some((cycles, cfg)) = best.filter(|(c, _)| *c < heuristic_cycles) {
            let diff = spot_check(&preset, kernel, key, &cfg, heuristic)?;
            entry.spot_check_rel_diff = Some(diff);
            if diff <= SPOT_TOLERANCE {
                entry.config = to_map(&cfg);
                entry.cycles = cycles;
            } else {
                entry.note = Some(format!(
                    "{cfg} ran {cycles} cycles but differs from the heuristic's output by {diff:.2e} \
                     at the spot check (over {SPOT_TOLERANCE:e}): kept the heuristic"
                ));
            }
        }
        tuned.push(entry);
    }
    Ok(TuningFile {
        schema: SCHEMA,
        model: req.model.clone(),
        model_hash: model_hash(&req.cfg),
        device: preset.name.clone(),
        prompt_len: req.prompt_len,
        batch: req.batch,
        context: req.context,
        kernels_hash: kernels_hash(),
        launches: tuned,
        implementations: BTreeMap::new(),
    })
}

/// Reads and checks a tuning file: every entry names a tunable kernel, a key it takes and a
/// configuration of its declared space. Errors name the file and the entry.
pub fn read_tuning(path: &Path) -> Result<(TuningFile, Tuning), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--tuning {}: cannot read: {e}", path.display()))?;
    let file: TuningFile = serde_json::from_str(&text).map_err(|e| {
        format!(
            "--tuning {}: not a tuning file ({e}); write one with `day0 tune --model CONFIG`",
            path.display()
        )
    })?;
    if file.schema != SCHEMA {
        return Err(format!(
            "--tuning {}: schema {} (this day0 reads {SCHEMA}); tune again",
            path.display(),
            file.schema
        ));
    }
    let mut table = Tuning::new();
    for (i, t) in file.launches.iter().enumerate() {
        let at = || {
            format!(
                "--tuning {}: launch {i} ({} at {})",
                path.display(),
                t.kernel,
                t.key
            )
        };
        let meta = tunable::meta(&t.kernel)
            .ok_or_else(|| format!("{}: not a kernel whose tiles can be tuned", at()))?;
        tunable::parse_key(&t.kernel, &t.key).map_err(|e| format!("{}: {e}", at()))?;
        let cfg = Config(t.config.clone());
        // A partial configuration is the heuristic's own (kept); a full one must be declared.
        if cfg.0.len() == meta.tunables.len() && !meta.space().contains(&cfg) {
            return Err(format!(
                "{}: {cfg} is not in the kernel's declared tunable space",
                at()
            ));
        }
        table.insert(&t.kernel, &t.key, cfg);
    }
    for (op, name) in &file.implementations {
        model::forward::ops::swap_choice(op, name).map_err(|e| {
            format!(
                "--tuning {}: implementations: {op} = {name}: {e}",
                path.display()
            )
        })?;
    }
    Ok((file, table))
}

/// The tuning file a command runs with: `flag` `none` → none; a path → that file (its errors
/// are the command's); no flag → the default file for the model and device when there is one
/// from these kernels.
pub fn resolve_tuning(
    flag: Option<&str>,
    cfg: &ModelConfig,
    device: &str,
) -> Result<Option<ResolvedTuning>, String> {
    let resolved = |file: TuningFile, table: Tuning, path: PathBuf| ResolvedTuning {
        table: Arc::new(table),
        path,
        impls: file
            .implementations
            .iter()
            .map(|(op, name)| format!("{op}={name}"))
            .collect(),
    };
    match flag {
        Some("none") => Ok(None),
        Some(path) => {
            let p = PathBuf::from(path);
            let (file, table) = read_tuning(&p)?;
            if file.kernels_hash != kernels_hash() {
                eprintln!(
                    "warning: --tuning {path} was measured on other kernel sources; its tiles \
                     are valid but may no longer be the fastest (tune again)"
                );
            }
            if file.model_hash != model_hash(cfg) {
                eprintln!(
                    "warning: --tuning {path} was tuned for another model ({}); only launches \
                     with the same shapes use it",
                    file.model
                );
            }
            Ok(Some(resolved(file, table, p)))
        }
        None => {
            let Some(p) = default_path(cfg, device).filter(|p| p.exists()) else {
                return Ok(None);
            };
            match read_tuning(&p) {
                Ok((file, table)) if file.kernels_hash == kernels_hash() => {
                    Ok(Some(resolved(file, table, p)))
                }
                // A stale or unreadable cached file is not the user's input: it is skipped.
                _ => Ok(None),
            }
        }
    }
}

/// The tuning file as a table: each launch's heuristic and tuned tiles and cycles.
pub fn table(file: &TuningFile) -> String {
    use std::fmt::Write;
    let cfg = |m: &BTreeMap<String, i64>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "tuning {} on {}: prefill {} tokens, decode batch {} at context {}",
        file.model, file.device, file.prompt_len, file.batch, file.context
    );
    let _ = writeln!(
        s,
        "{:<22} {:<38} {:<22} {:>11} {:<22} {:>11} {:>7}",
        "kernel", "launch", "heuristic", "cycles", "tuned", "cycles", "gain"
    );
    let (mut before, mut after) = (0u64, 0u64);
    for t in &file.launches {
        before += t.heuristic_cycles;
        after += t.cycles;
        let _ = writeln!(
            s,
            "{:<22} {:<38} {:<22} {:>11} {:<22} {:>11} {:>6.2}x",
            t.kernel,
            t.key,
            cfg(&t.heuristic),
            t.heuristic_cycles,
            if t.config == t.heuristic {
                "(heuristic)".to_string()
            } else {
                cfg(&t.config)
            },
            t.cycles,
            t.heuristic_cycles as f64 / t.cycles.max(1) as f64
        );
        if let Some(n) = &t.note {
            let _ = writeln!(s, "    note: {n}");
        }
    }
    let _ = writeln!(
        s,
        "{} launches; one of each: {before} → {after} cycles ({:.2}x)",
        file.launches.len(),
        before as f64 / after.max(1) as f64
    );
    s
}
