//! `day0 vision`: what a multimodal model's vision encoder costs on a device for images of given
//! sizes, cost-only at the configuration's released sizes — the part of TTFT that runs before the
//! language model's prefill.

use clap::Args;
use dsl_core::Launcher;
use model::forward::vision::encode_cost;
use model::vision::load_vision_config;
use model::vision::processor::{load_image, preprocess, ProcessorConfig};
use serde_json::json;
use std::path::PathBuf;

/// Arguments of `day0 vision`.
#[derive(Args)]
pub struct VisionArgs {
    /// A multimodal config.json (with a `vision_config`), or a directory holding one.
    #[arg(long)]
    config: PathBuf,
    /// Image size `WIDTHxHEIGHT` in pixels, resized as the processor does; repeat for several
    /// images in one batch.
    #[arg(long = "image-size")]
    image_size: Vec<String>,
    /// An image file (PNG or JPEG), decoded, resized and cut into patches as the checkpoint's
    /// processor does (`preprocessor_config.json` next to the config, else Qwen3-VL's); repeat
    /// for several. Without --image or --image-size: one 1024x1024 image.
    #[arg(long)]
    image: Vec<PathBuf>,
    /// Device preset.
    #[arg(long, default_value = "npu-910b")]
    device: String,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

/// Parses `WIDTHxHEIGHT`.
pub(crate) fn parse_size(s: &str) -> Result<(usize, usize), String> {
    let (w, h) = s
        .split_once(['x', 'X', '×'])
        .ok_or_else(|| format!("--image-size `{s}`: expected WIDTHxHEIGHT, e.g. 1024x768"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|e| format!("--image-size `{s}`: {e} (WIDTHxHEIGHT in pixels)"))
    };
    Ok((num(w)?, num(h)?))
}

/// Runs `day0 vision`.
pub fn vision_cmd(a: VisionArgs) -> Result<(), String> {
    let cfg = load_vision_config(&a.config).map_err(|e| e.to_string())?;
    let launcher = Launcher::for_device(&a.device).map_err(|e| e.to_string())?;
    let dir = if a.config.is_dir() {
        a.config.clone()
    } else {
        a.config.parent().map(PathBuf::from).unwrap_or_default()
    };
    let processor = ProcessorConfig::load(&dir, &cfg).map_err(|e| e.to_string())?;
    let mut labels = Vec::new();
    let mut grids = Vec::new();
    for path in &a.image {
        let (h, w, rgb) = load_image(path, processor.limits).map_err(|e| e.to_string())?;
        let img = preprocess(&path.display().to_string(), h, w, &rgb, &processor)
            .map_err(|e| e.to_string())?;
        labels.push(format!("{} ({w}x{h})", path.display()));
        grids.push(img.grid);
    }
    let sizes = match (a.image.is_empty(), a.image_size.is_empty()) {
        (true, true) => vec!["1024x1024".to_string()],
        _ => a.image_size.clone(),
    };
    for s in &sizes {
        let (w, h) = parse_size(s)?;
        labels.push(s.clone());
        grids.push(
            cfg.image_grid(&format!("--image-size {s}"), h, w, processor.limits)
                .map_err(|e| e.to_string())?,
        );
    }
    let cost = encode_cost(&cfg, &grids, &launcher).map_err(|e| e.to_string())?;
    let us = |cycles: u64| launcher.preset.cycles_to_us(cycles);
    let total = cost.stats.total_cycles();
    if a.json {
        let ops: Vec<_> = cost
            .stats
            .per_op
            .iter()
            .map(|(op, (n, c))| {
                json!({"op": op, "launches": n, "cycles": c, "us": us(*c),
                       "share": *c as f64 / total.max(1) as f64})
            })
            .collect();
        let out = json!({
            "device": a.device,
            "grids": cost.grids,
            "patches": cost.patches,
            "tokens": cost.tokens,
            "encoder_params": cfg.params(),
            "vision_us": us(total),
            "cycles": total,
            "ops": ops,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?
        );
        return Ok(());
    }
    println!(
        "vision encoder on {}: {} blocks, hidden {}, {} heads of {}, {:.2} B parameters",
        a.device,
        cfg.depth,
        cfg.hidden_size,
        cfg.num_heads,
        cfg.head_dim(),
        cfg.params() as f64 / 1e9
    );
    for (s, g) in labels.iter().zip(&cost.grids) {
        println!(
            "  image {s}: patch grid {}×{} → {} patches, {} language tokens",
            g[1],
            g[2],
            g.iter().product::<usize>(),
            g.iter().product::<usize>() / (cfg.spatial_merge_size * cfg.spatial_merge_size)
        );
    }
    println!(
        "{:<34} {:>8} {:>14} {:>11} {:>7}",
        "operator", "launches", "cycles", "ms", "share"
    );
    let mut rows: Vec<_> = cost.stats.per_op.iter().collect();
    rows.sort_by_key(|(_, (_, c))| std::cmp::Reverse(*c));
    for (op, (n, c)) in rows {
        println!(
            "{op:<34} {n:>8} {c:>14} {:>11.3} {:>6.1}%",
            us(*c) / 1e3,
            100.0 * *c as f64 / total.max(1) as f64
        );
    }
    println!(
        "vision encoder time: {:.3} ms ({} patches, {} tokens to the language model)",
        us(total) / 1e3,
        cost.patches,
        cost.tokens
    );
    Ok(())
}
