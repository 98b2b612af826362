//! `day0 calibrate`: day0's predictions against published measurements of real chips.
//!
//! Each row of `accel-sim/calibration/measurements.toml` names a workload and a shape; this
//! module maps it to a kernel of the library, runs it cost-only on the row's preset with the
//! preset's efficiency factors applied ([`DevicePreset::derated`]), and turns the simulated time
//! into the published metric using the publisher's own FLOP or byte formula. The statistics
//! and the factor search are in [`accel_sim::calibration`].
//!
//! Re-fitting after a timing-model change is one command (it rewrites the `[efficiency]`
//! section of each fitted preset; rebuild afterwards, since presets are embedded):
//!
//! ```text
//! cargo run --release -- calibrate --fit --write && cargo test --release --test calibration
//! ```

use accel_sim::calibration::{self, Measurement, Prediction, Split, Table};
use accel_sim::preset::{DevicePreset, Efficiency};
use dsl_core::{Backend, Config, Launcher, Tensor};
use half::bf16;
use std::collections::BTreeMap;

/// Reads a dimension of a row's shape, or says which is missing.
fn dim(m: &Measurement, name: &str) -> Result<u64, String> {
    m.shape.get(name).copied().ok_or_else(|| {
        format!(
            "measurement `{}` ({}): shape needs `{name}`",
            m.id, m.workload
        )
    })
}

/// The fastest of `configs` for a launch (a tuner's pick, as the published kernels are tuned):
/// returns the smallest cycle count and the device clock, or the last error if none fits.
fn best_cycles(
    configs: &[Config],
    mut run: impl FnMut(&Config) -> Result<u64, String>,
) -> Result<u64, String> {
    let mut best: Option<u64> = None;
    let mut last_err = String::from("no configuration to try");
    for c in configs {
        match run(c) {
            Ok(cy) => best = Some(best.map_or(cy, |b| b.min(cy))),
            Err(e) => last_err = e,
        }
    }
    best.ok_or(last_err)
}

fn tiles(bms: &[i64], bns: &[i64], bks: &[i64]) -> Vec<Config> {
    let mut v = Vec::new();
    for &bm in bms {
        for &bn in bns {
            for &bk in bks {
                v.push(Config::new().with("BM", bm).with("BN", bn).with("BK", bk));
            }
        }
    }
    v
}

/// Predicts one measurement's workload on `launcher` (cost-only, derated preset).
///
/// Workloads and the publisher's formulas:
/// - `gemm` (bf16 in, f32 accumulate; m, n, k): the persistent GEMM and the three-stage
///   pipelined one (one program per output tile), best of their 128×256, 256×128 and 128²
///   tiles; FLOP `2mnk`, bytes `2(mk + kn + mn)`.
/// - `gemm-fp8` (m, n, k): [`kernels::gemm_fp8`], best tile and pipeline depth; FLOP `2mnk`, bytes
///   `mk + nk + 2mn` (DeepGEMM's README: FP8 inputs, bf16 output).
/// - `attention-prefill` (batch, heads, seq, head_dim, causal 0/1): flash prefill (plain or
///   software-pipelined as FlashAttention-3), bf16, the
///   batch folded into heads (same work per head); FLOP `4·b·h·s²·d`, halved when causal
///   (FlashAttention-3 paper, section 4.1).
/// - `mla-decode` (batch, seq_q, heads, ctx; d = 576, dv = 512): paged latent decode, bf16 (the
///   latent kernel reading each row once, as FlashMLA, or the split kernel), the
///   batch's contexts laid end to end as one context of `batch·ctx` tokens and the query tokens
///   folded into heads (the same KV bytes and FLOP), the combine timed as the batch runs it
///   (each sequence's few splits, all sequences in parallel: see `combine_correction`); FLOP `2·s_q·b·ctx·h·(d + dv)`, bytes
///   `2·(b·ctx·d + b·s_q·h·(d + dv))` (FlashMLA's `tests/test_flash_mla.py`).
pub fn predict(launcher: &Launcher, m: &Measurement) -> Result<Prediction, String> {
    let clock_hz = launcher.preset.clock_ghz * 1e9;
    let err = |e: dsl_core::SimError| e.to_string();
    match m.workload.as_str() {
        "gemm" => {
            use kernels::gemm::{run_gemm, GemmCase, GemmDtype, GemmVariant};
            let (mm, n, k) = (dim(m, "m")?, dim(m, "n")?, dim(m, "k")?);
            // Both bf16 kernels a tuned library would choose between: one program per tile
            // (three stages) and the persistent one (tiles in L2-friendly bands); cuBLAS's
            // 128×256 / 256×128 tiles and the square 128² beside them.
            let mut configs = Vec::new();
            for variant in [GemmVariant::Persistent, GemmVariant::Pipelined] {
                for (bm, bn) in [(128, 256), (256, 128), (128, 128)] {
                    configs.push((variant, tiles(&[bm], &[bn], &[64]).remove(0)));
                }
            }
            let mut best: Option<u64> = None;
            let mut last_err = String::from("no configuration to try");
            for (variant, cfg) in configs {
                let r = run_gemm(
                    launcher,
                    &GemmCase {
                        m: mm as usize,
                        n: n as usize,
                        k: k as usize,
                        dtype: GemmDtype::Bf16,
                        variant,
                        config: cfg,
                        seed: 0,
                    },
                );
                match r {
                    Ok(r) => {
                        let cy = r.launch.report.cycles;
                        best = Some(best.map_or(cy, |b| b.min(cy)));
                    }
                    Err(e) => last_err = err(e),
                }
            }
            let cycles = best.ok_or(last_err)?;
            let (mf, nf, kf) = (mm as f64, n as f64, k as f64);
            Ok(Prediction {
                time_s: cycles as f64 / clock_hz,
                flop: 2.0 * mf * nf * kf,
                bytes: 2.0 * (mf * kf + kf * nf + mf * nf),
            })
        }
        "gemm-fp8" => {
            use kernels::gemm_fp8::{run_gemm_fp8, Fp8GemmCase};
            let (mm, n, k) = (dim(m, "m")?, dim(m, "n")?, dim(m, "k")?);
            // DeepGEMM's choices: 64- or 128-row tiles, BN down to 16 so a decode shape's
            // tiles cover the SMs, two or four pipeline stages.
            let mut configs = Vec::new();
            for st in [2, 4] {
                for c in tiles(&[128, 64], &[128, 64, 32, 16], &[128]) {
                    configs.push(c.with("ST", st));
                }
            }
            let cycles = best_cycles(&configs, |cfg| {
                run_gemm_fp8(
                    launcher,
                    &Fp8GemmCase {
                        m: mm as usize,
                        n: n as usize,
                        k: k as usize,
                        config: cfg.clone(),
                        seed: 0,
                    },
                )
                .map(|r| r.launch.report.cycles)
                .map_err(err)
            })?;
            let (mf, nf, kf) = (mm as f64, n as f64, k as f64);
            Ok(Prediction {
                time_s: cycles as f64 / clock_hz,
                flop: 2.0 * mf * nf * kf,
                bytes: mf * kf + nf * kf + 2.0 * mf * nf,
            })
        }
        "attention-prefill" => {
            use kernels::attention::prefill::flash_prefill;
            let (b, h, s, d) = (
                dim(m, "batch")?,
                dim(m, "heads")?,
                dim(m, "seq")?,
                dim(m, "head_dim")?,
            );
            let causal = m.shape.get("causal").copied().unwrap_or(0) != 0;
            let heads = (b * h) as usize;
            let (s, d) = (s as usize, d as usize);
            let q = Tensor::<bf16>::shape_only(&[s, heads * d]);
            let kv = Tensor::<bf16>::shape_only(&[s, heads * d]);
            let o = Tensor::<bf16>::shape_only(&[s, heads * d]);
            use kernels::attention::prefill::{
                flash_prefill_pipelined, prefill_config_for, PrefillKernel,
            };
            // Both prefill kernels, 64/128 query and key tiles: the plain one and the one
            // software-pipelined as FlashAttention-3 schedules it.
            let scale = 1.0 / (d as f32).sqrt();
            let sinks = kernels::attention::sinks_tensor(launcher, "flash_prefill", heads, None)
                .map_err(err)?;
            let mut best: Option<u64> = None;
            let mut last_err = String::from("no configuration to try");
            for kernel in [PrefillKernel::Flash, PrefillKernel::Pipelined] {
                for bq in [128i64, 64] {
                    for bk in [128i64, 64] {
                        let base = Config::new().with("BQ", bq).with("BK", bk);
                        let cfg = prefill_config_for(kernel, &base, d, d).map_err(err)?;
                        let launch = match kernel {
                            PrefillKernel::Flash => flash_prefill::launch,
                            PrefillKernel::Pipelined => flash_prefill_pipelined::launch,
                        };
                        match launch(
                            launcher, &cfg, &q, &kv, &kv, &o, d, d, scale, causal, 0, &sinks,
                        ) {
                            Ok(l) => {
                                let cy = l.report.cycles;
                                best = Some(best.map_or(cy, |b| b.min(cy)));
                            }
                            Err(e) => last_err = err(e),
                        }
                    }
                }
            }
            let cycles = best.ok_or(last_err)?;
            let full = 4.0 * (b * h) as f64 * (s as f64).powi(2) * d as f64;
            Ok(Prediction {
                time_s: cycles as f64 / clock_hz,
                flop: if causal { full / 2.0 } else { full },
                bytes: 2.0 * 4.0 * (b * h) as f64 * s as f64 * d as f64,
            })
        }
        "mla-decode" => {
            use kernels::attention::decode::{run_decode, run_decode_latent, DecodeCase};
            use kernels::gemm::GemmDtype;
            let (b, sq, h, ctx) = (
                dim(m, "batch")?,
                dim(m, "seq_q")?,
                dim(m, "heads")?,
                dim(m, "ctx")?,
            );
            let (d, dv) = (576u64, 512u64);
            let cores = launcher.preset.cores as usize;
            // FlashMLA pages are 64 tokens; where 64-token key tiles do not fit beside 256
            // query rows, the kernel takes 16-token steps over the same pages.
            let cycles = best_cycles(
                &[Config::new().with("P", 64), Config::new().with("P", 16)],
                |cfg| {
                    let page_size = cfg.get("P").unwrap_or(64) as usize;
                    let mut best: Option<u64> = None;
                    let mut last_err = String::new();
                    for (splits, latent) in [
                        (cores, false),
                        (2 * cores, false),
                        (cores, true),
                        (2 * cores, true),
                    ] {
                        // The latent kernel reads each latent row once, as FlashMLA does; the
                        // split kernel reads it as keys and again as values.
                        let run = if latent {
                            run_decode_latent
                        } else {
                            run_decode
                        };
                        let r = run(
                            launcher,
                            &DecodeCase {
                                heads: (sq * h) as usize,
                                kv_heads: 1,
                                head_dim: d as usize,
                                v_head_dim: dv as usize,
                                shared_kv: true,
                                ctx: (b * ctx) as usize,
                                page_size,
                                splits,
                                dtype: GemmDtype::Bf16,
                                fp8_kv: false,
                                seed: 0,
                            },
                        );
                        // The folded context's combine merges every split in one program, one
                        // split after another; the batch's real combine merges each sequence's
                        // few splits, all sequences in parallel. Its cost is replaced by that.
                        let combine =
                            combine_correction(launcher, splits, (sq * h) as usize, b).map_err(err);
                        match (r, combine) {
                            (Ok(r), Ok((folded, batched))) => {
                                let cy = (r.report.cycles + batched).saturating_sub(folded);
                                best = Some(best.map_or(cy, |b| b.min(cy)));
                            }
                            (Err(e), _) => last_err = err(e),
                            (_, Err(e)) => last_err = e,
                        }
                    }
                    best.ok_or(last_err)
                },
            )?;
            let (bf, sqf, hf, cf) = (b as f64, sq as f64, h as f64, ctx as f64);
            Ok(Prediction {
                time_s: cycles as f64 / clock_hz,
                flop: 2.0 * sqf * bf * cf * hf * (d + dv) as f64,
                bytes: 2.0 * (bf * cf * d as f64 + bf * sqf * hf * (d + dv) as f64),
            })
        }
        other => Err(format!(
            "measurement `{}`: unknown workload `{other}`; use gemm, gemm-fp8, \
             attention-prefill or mla-decode",
            m.id
        )),
    }
}

/// The combine of split-KV MLA decode, folded and as the batch runs it: (cycles of the combine
/// over `splits` splits of one context of `rows` query rows, cycles of the combine over the
/// splits one of `batch` sequences gets (`⌈splits / batch⌉ + 1`: a sequence's blocks may straddle
/// two SMs' shares) for `batch · rows` rows, the sequences' rows side by side). `mla-decode`
/// lays the batch's contexts end to end as one context, which gives the split kernel the same
/// work and bytes, but makes its combine one program looping over every split; FlashMLA
/// combines per sequence and head, in parallel (its scheduler splits the batch's blocks evenly
/// over the SMs).
fn combine_correction(
    launcher: &Launcher,
    splits: usize,
    rows: usize,
    batch: u64,
) -> Result<(u64, u64), dsl_core::SimError> {
    use kernels::attention::decode::{combine_config, decode_combine};
    let dv = 512;
    let cfg = combine_config(dv)?;
    let run = |s: usize, r: usize| -> Result<u64, dsl_core::SimError> {
        let o_part = Tensor::<f32>::shape_only(&[s, 1, r, dv]);
        let lse = Tensor::<f32>::shape_only(&[s, 1, r, 1]);
        let o = Tensor::<bf16>::shape_only(&[r, dv]);
        Ok(decode_combine::launch(launcher, &cfg, &o_part, &lse, &o)?
            .report
            .cycles)
    };
    let batch = batch.max(1) as usize;
    Ok((
        run(splits, rows)?,
        run(splits.div_ceil(batch) + 1, batch * rows)?,
    ))
}

/// A cost-only launcher on `device` with `factors` applied (the preset's own when `None`).
fn launcher(device: &str, factors: Option<&Efficiency>) -> Result<Launcher, String> {
    let mut p = DevicePreset::load(device).map_err(|e| e.to_string())?;
    if let Some(f) = factors {
        p.efficiency = Some(f.clone());
    }
    Ok(Launcher::new(p.derated()).with_backend(Backend::CostOnly))
}

/// The committed measurements.
pub fn measurements() -> Result<Vec<Measurement>, String> {
    calibration::parse(
        "accel-sim/calibration/measurements.toml",
        calibration::MEASUREMENTS,
    )
    .map_err(|e| e.to_string())
}

/// The factors a table is computed with: each device's preset factors, overridden by `with`.
fn factors_for(
    rows: &[Measurement],
    with: &BTreeMap<String, Efficiency>,
) -> Result<BTreeMap<String, Efficiency>, String> {
    let mut out = BTreeMap::new();
    for m in rows {
        if out.contains_key(&m.device) {
            continue;
        }
        let e = match with.get(&m.device) {
            Some(e) => e.clone(),
            None => DevicePreset::load(&m.device)
                .map_err(|e| e.to_string())?
                .efficiency
                .unwrap_or(Efficiency {
                    matrix: 1.0,
                    hbm: 1.0,
                }),
        };
        out.insert(m.device.clone(), e);
    }
    Ok(out)
}

/// Predicts `rows` with the given per-device factors: per row, the prediction or why day0
/// cannot run it (a bad preset name is an error for the whole table).
fn predict_all(
    rows: &[Measurement],
    factors: &BTreeMap<String, Efficiency>,
) -> Result<Vec<Result<Prediction, String>>, String> {
    let mut launchers: BTreeMap<String, Launcher> = BTreeMap::new();
    let mut out = Vec::with_capacity(rows.len());
    for m in rows {
        if !launchers.contains_key(&m.device) {
            launchers.insert(
                m.device.clone(),
                launcher(&m.device, factors.get(&m.device))?,
            );
        }
        out.push(predict(&launchers[&m.device], m));
    }
    Ok(out)
}

/// The calibration table, and the measurements day0 cannot run (with the reason), which are
/// listed as gaps and left out of the statistics.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Calibration {
    /// Rows day0 predicts, with their errors and the statistics.
    pub table: Table,
    /// Rows whose workload day0 cannot run, and why.
    pub not_modelled: Vec<(Measurement, String)>,
}

impl Calibration {
    /// The table as Markdown, the gaps after it.
    pub fn markdown(&self) -> String {
        let mut s = self.table.markdown();
        for (m, why) in &self.not_modelled {
            s.push_str(&format!(
                "Not modelled: `{}` ({:.0} {}, {}): {why}\n",
                m.id,
                m.measured,
                m.metric.unit(),
                m.source
            ));
        }
        s
    }
}

/// The calibration table with the presets' committed factors (overridden per device by
/// `with`).
pub fn table(with: &BTreeMap<String, Efficiency>) -> Result<Calibration, String> {
    let rows = measurements()?;
    let factors = factors_for(&rows, with)?;
    let preds = predict_all(&rows, &factors)?;
    let (mut ok_rows, mut ok_preds, mut not_modelled) = (Vec::new(), Vec::new(), Vec::new());
    for (m, p) in rows.into_iter().zip(preds) {
        match p {
            Ok(p) => {
                ok_rows.push(m);
                ok_preds.push(p);
            }
            Err(e) => not_modelled.push((m, e)),
        }
    }
    Ok(Calibration {
        table: Table::new(&ok_rows, &ok_preds, factors),
        not_modelled,
    })
}

/// Fits each device's factors on its `fit` rows (held-out rows are never run during the fit).
/// Returns the fitted factors per device; devices without fit rows keep theirs.
pub fn fit() -> Result<BTreeMap<String, Efficiency>, String> {
    let rows = measurements()?;
    let mut fitted = factors_for(&rows, &BTreeMap::new())?;
    let devices: Vec<String> = fitted.keys().cloned().collect();
    for device in devices {
        let fit_rows: Vec<Measurement> = rows
            .iter()
            .filter(|m| m.device == device && m.split == Split::Fit)
            .cloned()
            .collect();
        if fit_rows.is_empty() {
            continue;
        }
        let mut failure: Option<String> = None;
        let start = fitted[&device].clone();
        let e = calibration::fit_factors(
            |f| {
                let l = match launcher(&device, Some(f)) {
                    Ok(l) => l,
                    Err(e) => {
                        failure = Some(e);
                        return f64::INFINITY;
                    }
                };
                let mut sum = 0.0;
                for m in &fit_rows {
                    match predict(&l, m) {
                        Ok(p) => sum += ((p.value(m.metric) - m.measured) / m.measured).abs(),
                        Err(e) => {
                            failure = Some(e);
                            return f64::INFINITY;
                        }
                    }
                }
                sum / fit_rows.len() as f64
            },
            start,
        );
        if let Some(e) = failure {
            return Err(e);
        }
        fitted.insert(device, e);
    }
    Ok(fitted)
}

/// Rewrites the `matrix = …` and `hbm = …` lines of the `[efficiency]` section of the preset
/// file `path`, keeping everything else (comments included).
pub fn write_factors(path: &std::path::Path, e: &Efficiency) -> Result<(), String> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    let mut out = String::new();
    let (mut in_section, mut found) = (false, 0);
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            in_section = t.starts_with("[efficiency]");
        }
        let key = t.split('=').next().unwrap_or("").trim();
        if in_section && (key == "matrix" || key == "hbm") {
            let v = if key == "matrix" { e.matrix } else { e.hbm };
            let comment = line.find('#').map(|i| &line[i..]).unwrap_or("");
            let head = format!("{key} = {v:.3}");
            out.push_str(&format!("{head:<27}{comment}\n"));
            found += 1;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if found != 2 {
        return Err(format!(
            "{}: expected `matrix = …` and `hbm = …` in an [efficiency] section",
            path.display()
        ));
    }
    std::fs::write(path, out).map_err(|err| format!("cannot write {}: {err}", path.display()))
}

/// The preset file of a built-in device in this source tree (for `--write`).
pub fn preset_path(device: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("accel-sim/presets")
        .join(format!("{device}.toml"))
}
