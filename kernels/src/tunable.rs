//! The launch sites whose tiles a tuning table may choose ([`dsl_core::tuning`]): the model's
//! linear layers and expert GEMMs in their stored formats. Every declared configuration of these
//! kernels computes the same numbers up to f32 accumulation order (partial tiles are masked), so
//! swapping the heuristic tiles for measured ones is safe; `day0 tune --model` still checks each
//! choice against the heuristic's output before it writes it.
//!
//! A launch key names what a launch's cost depends on: `m=…,n=…,k=…` for a linear layer,
//! `rows=…,experts=…,n=…,k=…` for an expert GEMM over all experts' rows.

use crate::testdata::CaseTensors;
use crate::weight::bad;
use accel_sim::Report;
use dsl_core::{bf16, fp8e4m3, Config, KernelMeta, Launcher, SimError, Tensor};
use std::collections::BTreeMap;

/// The launch key of a linear layer `y [m, n] = x [m, k] · wᵀ`.
pub fn linear_key(m: usize, n: usize, k: usize) -> String {
    format!("m={m},n={n},k={k}")
}

/// The launch key of an expert GEMM over `rows` rows of `experts` experts' `[n, k]` weights.
pub fn grouped_key(rows: usize, experts: usize, n: usize, k: usize) -> String {
    format!("rows={rows},experts={experts},n={n},k={k}")
}

/// Every kernel whose tiles a tuning table may set.
pub fn metas() -> Vec<&'static KernelMeta> {
    use crate::linear::{linear_cast, linear_fp8, linear_fp8w};
    use crate::moe::grouped::{
        grouped_linear_cast, grouped_linear_fp8, grouped_linear_fp8w, grouped_linear_mxfp4,
    };
    vec![
        &linear_cast::META,
        &linear_fp8::META,
        &linear_fp8w::META,
        &grouped_linear_cast::META,
        &grouped_linear_fp8::META,
        &grouped_linear_fp8w::META,
        &grouped_linear_mxfp4::META,
    ]
}

/// The tunable kernel called `name`.
pub fn meta(name: &str) -> Option<&'static KernelMeta> {
    metas().into_iter().find(|m| m.name == name)
}

/// A launch key's sizes, checked against the keys `kernel` takes.
pub fn parse_key(kernel: &str, key: &str) -> Result<BTreeMap<String, usize>, String> {
    let want: &[&str] = if kernel.starts_with("grouped_") {
        &["rows", "experts", "n", "k"]
    } else {
        &["m", "n", "k"]
    };
    let mut sizes = BTreeMap::new();
    for part in key.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not name=size"))?;
        let v: usize = v
            .parse()
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| format!("`{part}`: the size must be a positive integer"))?;
        sizes.insert(k.to_string(), v);
    }
    let got: Vec<&str> = sizes.keys().map(String::as_str).collect();
    let mut sorted = want.to_vec();
    sorted.sort_unstable();
    if got != sorted {
        return Err(format!(
            "`{key}`: {kernel} takes the sizes {}",
            want.join(", ")
        ));
    }
    Ok(sizes)
}

/// The key of a functional spot check of `key`: rows cut to at most 150 (per expert, and two
/// experts) and output columns to 300, so every declared tile still has a partial edge; the depth
/// cut to 2048 plus its remainder modulo 256, so K-tile edges fall as at the full shape.
pub fn reduced_key(kernel: &str, key: &str) -> Result<String, String> {
    let s = parse_key(kernel, key)?;
    let k = s["k"];
    let k = if k > 2048 { 2048 + k % 256 } else { k };
    let n = s["n"].min(300);
    Ok(if kernel.starts_with("grouped_") {
        let e = s["experts"];
        let per = s["rows"].div_ceil(e).min(150);
        let e = e.min(2);
        grouped_key(per * e, e, n, k)
    } else {
        linear_key(s["m"].min(150), n, k)
    })
}

/// Runs `kernel` alone at `key` with `config`, on inputs drawn from `seed` (shape-only on a
/// cost-only launcher; experts share the rows evenly): its report and, functional, its output.
/// FP8 activations are quantized first, with the heuristic tiles; only the GEMM is reported.
pub fn run_at(
    launcher: &Launcher,
    kernel: &str,
    key: &str,
    config: &Config,
    seed: u64,
) -> Result<(Report, Option<Vec<f32>>), SimError> {
    use crate::linear::{linear_cast, linear_fp8, linear_fp8w, run_act_quant_fp8};
    use crate::moe::grouped::{
        grouped_linear_cast, grouped_linear_fp8, grouped_linear_fp8w, grouped_linear_mxfp4,
    };
    let meta = meta(kernel).ok_or_else(|| bad(kernel, "not a tunable launch site".into()))?;
    let s = parse_key(kernel, key).map_err(|m| bad(kernel, m))?;
    let mut t = CaseTensors::new(launcher, seed, meta.name);
    let (n, k) = (s["n"], s["k"]);
    let grouped = kernel.starts_with("grouped_");
    let (rows, e) = if grouped {
        (s["rows"], s["experts"])
    } else {
        (s["m"], 1)
    };
    let lead: &[usize] = if grouped { &[e] } else { &[] };
    let wshape = |tail: [usize; 2]| [lead, &tail[..]].concat();
    let x: Tensor<f32> = t.input(&[rows, k], 0.0, 1.0)?;
    let y: Tensor<f32> = t.output(&[rows, n]);
    let fp8 = |t: &mut CaseTensors| -> Result<(Tensor<fp8e4m3>, Tensor<f32>), SimError> {
        Ok((
            t.input(&wshape([n, k]), 0.0, 0.5)?,
            t.input(&wshape([n.div_ceil(128), k.div_ceil(128)]), 0.02, 0.01)?,
        ))
    };
    let offsets = Tensor::from_indices(
        &[e + 1],
        &(0..=e).map(|i| (i * rows / e) as i32).collect::<Vec<_>>(),
    )
    .map_err(|m| bad(kernel, m))?;
    let report = match kernel {
        "linear_cast" => {
            let w: Tensor<bf16> = t.input(&[n, k], 0.0, 0.1)?;
            linear_cast::launch(launcher, config, &x, &w, &y)?.report
        }
        "linear_fp8" | "grouped_linear_fp8" => {
            let (w, sw) = fp8(&mut t)?;
            let (q, _) = run_act_quant_fp8(launcher, &x)?;
            if grouped {
                grouped_linear_fp8::launch(
                    launcher, config, &q.codes, &q.scales, &w, &sw, &offsets, &y,
                )?
                .report
            } else {
                linear_fp8::launch(launcher, config, &q.codes, &q.scales, &w, &sw, &y)?.report
            }
        }
        "linear_fp8w" => {
            let (w, sw) = fp8(&mut t)?;
            linear_fp8w::launch::<bf16>(launcher, config, &x, &w, &sw, &y)?.report
        }
        "grouped_linear_fp8w" => {
            let (w, sw) = fp8(&mut t)?;
            grouped_linear_fp8w::launch::<bf16>(launcher, config, &x, &w, &sw, &offsets, &y)?.report
        }
        "grouped_linear_cast" => {
            let w: Tensor<bf16> = t.input(&wshape([n, k]), 0.0, 0.1)?;
            grouped_linear_cast::launch(launcher, config, &x, &w, &offsets, &y)?.report
        }
        "grouped_linear_mxfp4" => {
            if !k.is_multiple_of(32) {
                return Err(bad(kernel, format!("k = {k} is not a multiple of 32")));
            }
            // Any byte is two valid E2M1 codes; scales 2^-3..2^3 around E8M0's bias 127.
            let blocks: Tensor<u8> = t.input(&wshape([n, k / 2]), 127.5, 127.0)?;
            let scales: Tensor<u8> = t.input(&wshape([n, k / 32]), 127.0, 3.0)?;
            grouped_linear_mxfp4::launch::<bf16>(
                launcher, config, &x, &blocks, &scales, &offsets, &y,
            )?
            .report
        }
        other => return Err(bad(other, "no standalone run for this kernel".into())),
    };
    Ok((report, y.to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsl_core::Backend;

    #[test]
    fn keys_round_trip_and_reduce_with_their_edges() {
        let s = parse_key("linear_fp8", &linear_key(8192, 7168, 2112)).unwrap();
        assert_eq!((s["m"], s["n"], s["k"]), (8192, 7168, 2112));
        assert_eq!(
            reduced_key("linear_fp8", "m=8192,n=7168,k=7168").unwrap(),
            "m=150,n=300,k=2048"
        );
        assert_eq!(
            reduced_key("grouped_linear_mxfp4", &grouped_key(4096, 384, 4096, 2880)).unwrap(),
            grouped_key(22, 2, 300, 2048 + 2880 % 256)
        );
        assert!(parse_key("linear_fp8", "rows=1,experts=1,n=1,k=1").is_err());
        assert!(parse_key("grouped_linear_fp8", "rows=1,experts=0,n=1,k=1").is_err());
    }

    #[test]
    fn every_declared_tile_of_every_site_computes_the_heuristics_numbers() {
        // Fresh random inputs per site; each declared configuration must write every element and
        // agree with the first one within f32 accumulation-order rounding.
        // h200 multiplies E4M3 natively, so the W8A8 kernels run too.
        let l = Launcher::for_device("h200").unwrap();
        for meta in metas() {
            let key = if meta.name.starts_with("grouped_") {
                grouped_key(70, 2, 150, 320)
            } else {
                linear_key(70, 150, 320)
            };
            let mut first: Option<Vec<f32>> = None;
            let mut ran = 0;
            for cfg in meta.space() {
                let (report, out) = match run_at(&l, meta.name, &key, &cfg, 11) {
                    Ok(r) => r,
                    Err(SimError::SramOverflow { .. }) => continue,
                    Err(e) => panic!("{} {cfg}: {e}", meta.name),
                };
                assert!(report.cycles > 0);
                ran += 1;
                let out = out.expect("functional output");
                assert!(out.iter().all(|v| v.is_finite()), "{} {cfg}", meta.name);
                match &first {
                    None => first = Some(out),
                    Some(f) => {
                        let worst = f
                            .iter()
                            .zip(&out)
                            .map(|(a, b)| (a - b).abs() / a.abs().max(1e-3))
                            .fold(0.0f32, f32::max);
                        assert!(worst < 1e-4, "{} {cfg}: {worst:e}", meta.name);
                    }
                }
            }
            // Several tiles fit a core for each kernel (not only the heuristic's).
            assert!(ran >= 4, "{}: {ran} configurations ran", meta.name);
            eprintln!(
                "{}: {ran} of {} configurations ran",
                meta.name,
                meta.space().len()
            );
        }
        // Cost-only runs give a report and no output.
        let c = l.clone().with_backend(Backend::CostOnly);
        let (r, out) = run_at(
            &c,
            "linear_fp8",
            "m=8192,n=7168,k=2048",
            &Config::new()
                .with("BM", 128)
                .with("BN", 128)
                .with("BK", 128),
            1,
        )
        .unwrap();
        assert!(r.cycles > 0 && out.is_none());
    }
}
