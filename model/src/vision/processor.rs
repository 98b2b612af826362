//! The image processor: an image file to the vision encoder's patch rows, as the checkpoint's own
//! processor makes them (transformers `Qwen2VLImageProcessor`, which Qwen3-VL uses, configured by
//! the checkpoint's `preprocessor_config.json`).
//!
//! 1. decode (PNG or JPEG, the `image` crate) and convert to RGB;
//! 2. resize to [`smart_resize`]'s size with torchvision's antialiased bicubic on uint8 (what the
//!    default, torchvision-backed processor runs: cubic a = −0.5, support widened when shrinking,
//!    int16 fixed-point weights, horizontal pass then vertical, uint8 in between), skipped when the
//!    size is already right;
//! 3. normalise each channel: `(x − 255·mean) / (255·std)` in f32 (transformers fuses its 1/255
//!    rescale into the normalisation the same way);
//! 4. repeat the still image to `temporal_patch_size` frames and cut it into patches, rows in the
//!    order `(frame group, block row, block column, row in block, column in block)` and each row's
//!    values in the order `(channel, frame, y, x)` — the `reshape`/`permute` of the processor.
//!
//! `model/tests/vision.rs` holds the output to transformers' within 1e-6 on committed images, one
//! kept at its size and one resized (narrower and taller).

use super::{smart_resize, PixelLimits, VisionConfig, VisionError};
use serde_json::Value;
use std::path::Path;

/// What the processor needs from `preprocessor_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessorConfig {
    /// Side of a patch, in pixels.
    pub patch_size: usize,
    /// Side of a merged block, in patches.
    pub merge_size: usize,
    /// Frames per patch.
    pub temporal_patch_size: usize,
    /// The pixel budget.
    pub limits: PixelLimits,
    /// Per-channel mean, on the 0..1 scale.
    pub mean: [f64; 3],
    /// Per-channel standard deviation, on the 0..1 scale.
    pub std: [f64; 3],
}

impl ProcessorConfig {
    /// Qwen3-VL's processor for an encoder `cfg`: its pixel limits, mean and std 0.5, and the
    /// encoder's patch, merge and frame sizes.
    pub fn qwen3_vl(cfg: &VisionConfig) -> ProcessorConfig {
        ProcessorConfig {
            patch_size: cfg.patch_size,
            merge_size: cfg.spatial_merge_size,
            temporal_patch_size: cfg.temporal_patch_size,
            limits: PixelLimits::QWEN3_VL,
            mean: [0.5; 3],
            std: [0.5; 3],
        }
    }

    /// The checkpoint's `preprocessor_config.json` in `dir`, fields absent taking
    /// [`ProcessorConfig::qwen3_vl`]'s values; no file at all gives those values.
    pub fn load(dir: &Path, cfg: &VisionConfig) -> Result<ProcessorConfig, VisionError> {
        let mut p = ProcessorConfig::qwen3_vl(cfg);
        let file = dir.join("preprocessor_config.json");
        let Ok(text) = std::fs::read_to_string(&file) else {
            return Ok(p);
        };
        let name = file.display().to_string();
        let bad = |message: String| VisionError::Image {
            what: name.clone(),
            message,
        };
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let size = |v: &Value, key: &str| v.get(key).and_then(Value::as_u64);
        let triple = |key: &str| -> Result<Option<[f64; 3]>, VisionError> {
            match v.get(key) {
                None => Ok(None),
                Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                    Ok(Some([0, 1, 2].map(|i| a[i].as_f64().unwrap_or(0.0))))
                }
                Some(other) => Err(bad(format!("`{key}` must be three numbers, got {other}"))),
            }
        };
        if let Some(x) = size(&v, "patch_size") {
            p.patch_size = x as usize;
        }
        if let Some(x) = size(&v, "merge_size") {
            p.merge_size = x as usize;
        }
        if let Some(x) = size(&v, "temporal_patch_size") {
            p.temporal_patch_size = x as usize;
        }
        if let Some(s) = v.get("size") {
            if let Some(x) = size(s, "shortest_edge") {
                p.limits.min_pixels = x;
            }
            if let Some(x) = size(s, "longest_edge") {
                p.limits.max_pixels = x;
            }
        }
        if let Some(x) = size(&v, "min_pixels") {
            p.limits.min_pixels = x;
        }
        if let Some(x) = size(&v, "max_pixels") {
            p.limits.max_pixels = x;
        }
        if let Some(m) = triple("image_mean")? {
            p.mean = m;
        }
        if let Some(s) = triple("image_std")? {
            if s.iter().any(|x| *x <= 0.0) {
                return Err(bad(format!("`image_std` {s:?} must be positive")));
            }
            p.std = s;
        }
        if (p.patch_size, p.merge_size, p.temporal_patch_size)
            != (
                cfg.patch_size,
                cfg.spatial_merge_size,
                cfg.temporal_patch_size,
            )
        {
            return Err(bad(format!(
                "patch {} / merge {} / frames {} disagree with the vision_config's {} / {} / {}",
                p.patch_size,
                p.merge_size,
                p.temporal_patch_size,
                cfg.patch_size,
                cfg.spatial_merge_size,
                cfg.temporal_patch_size
            )));
        }
        Ok(p)
    }
}

/// An image ready for the encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessedImage {
    /// Patch rows `[t·h·w, 3·T·P·P]`, row-major.
    pub pixels: Vec<f32>,
    /// Patch grid `[t, h, w]`.
    pub grid: [usize; 3],
    /// Size after the resize, `(height, width)` in pixels.
    pub resized: (usize, usize),
}

/// Decodes an image file to RGB: `(height, width, bytes [h·w·3])`. Not an image, an empty image, or
/// one above the processor's `max_pixels` (refused before any resize work; transformers would
/// shrink it) is an error naming the file and the limit.
pub fn load_image(
    path: &Path,
    limits: PixelLimits,
) -> Result<(usize, usize, Vec<u8>), VisionError> {
    let what = path.display().to_string();
    let bad = |message: String| VisionError::Image {
        what: what.clone(),
        message,
    };
    let reader = image::ImageReader::open(path)
        .map_err(|e| bad(e.to_string()))?
        .with_guessed_format()
        .map_err(|e| bad(e.to_string()))?;
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| bad(format!("not a PNG or JPEG image day0 can read ({e})")))?;
    if w == 0 || h == 0 {
        return Err(bad(format!("a {w}×{h} image has no pixels")));
    }
    if w as u64 * h as u64 > limits.max_pixels {
        return Err(bad(format!(
            "{w}×{h} = {} pixels is above the processor's max_pixels {}",
            w as u64 * h as u64,
            limits.max_pixels
        )));
    }
    let img = image::ImageReader::open(path)
        .map_err(|e| bad(e.to_string()))?
        .with_guessed_format()
        .map_err(|e| bad(e.to_string()))?
        .decode()
        .map_err(|e| bad(format!("not a PNG or JPEG image day0 can read ({e})")))?
        .to_rgb8();
    Ok((h as usize, w as usize, img.into_raw()))
}

/// Cubic convolution kernel with a = −0.5 (PIL's and torchvision's bicubic), support 2.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// One axis of an antialiased resize from `size` to `out` samples, as torchvision computes it
/// for uint8 (`_compute_indices_min_size_weights_aa`, then int16 weights at the highest precision
/// that keeps the largest weight below 2¹⁵): per output sample, the first input sample, the
/// weights, and the shared precision in bits.
fn axis_weights(size: usize, out: usize) -> (Vec<(usize, Vec<i32>)>, u32) {
    let scale = size as f64 / out as f64;
    let (support, inv) = if scale >= 1.0 {
        (2.0 * scale, 1.0 / scale)
    } else {
        (2.0, 1.0)
    };
    let taps: Vec<(usize, Vec<f64>)> = (0..out)
        .map(|i| {
            let center = scale * (i as f64 + 0.5);
            let lo = ((center - support + 0.5) as i64).max(0) as usize;
            let hi = ((center + support + 0.5) as i64).min(size as i64) as usize;
            let mut w: Vec<f64> = (lo..hi)
                .map(|j| bicubic((j as f64 - center + 0.5) * inv))
                .collect();
            let total: f64 = w.iter().sum();
            if total != 0.0 {
                w.iter_mut().for_each(|v| *v /= total);
            }
            (lo, w)
        })
        .collect();
    let w_max = taps
        .iter()
        .flat_map(|(_, w)| w.iter())
        .fold(0.0f64, |m, v| m.max(*v));
    let mut precision = 0;
    while precision < 22 && ((0.5 + w_max * (1u64 << (precision + 1)) as f64) as i64) < (1 << 15) {
        precision += 1;
    }
    let q = |v: f64| {
        let v = v * (1u64 << precision) as f64;
        if v < 0.0 {
            (-0.5 + v) as i32
        } else {
            (0.5 + v) as i32
        }
    };
    let taps = taps
        .into_iter()
        .map(|(lo, w)| (lo, w.into_iter().map(q).collect()))
        .collect();
    (taps, precision)
}

/// Resamples `lines` lines of `len` samples (stride `step` between samples, `pitch` between lines)
/// along one axis with `taps`, rounding to uint8 (fixed point, as torchvision's uint8 kernels).
fn resample_axis(
    src: &[u8],
    (taps, precision): &(Vec<(usize, Vec<i32>)>, u32),
    lines: usize,
    at: impl Fn(usize, usize) -> usize,
    out_at: impl Fn(usize, usize) -> usize,
    dst: &mut [u8],
) {
    let half = if *precision > 0 {
        1i64 << (precision - 1)
    } else {
        0
    };
    for line in 0..lines {
        for (o, (lo, w)) in taps.iter().enumerate() {
            for c in 0..3 {
                let sum = w.iter().enumerate().fold(half, |acc, (k, wk)| {
                    acc + src[at(line, lo + k) + c] as i64 * *wk as i64
                });
                dst[out_at(line, o) + c] = (sum >> precision).clamp(0, 255) as u8;
            }
        }
    }
}

/// Bicubic resize with antialiasing of RGB bytes `[h·w·3]` to `oh × ow`: torchvision's uint8
/// algorithm (horizontal pass, then vertical, uint8 in between; each pass skipped when its size
/// does not change).
fn resize_bicubic_aa(rgb: &[u8], h: usize, w: usize, oh: usize, ow: usize) -> Vec<u8> {
    let mut cur = rgb.to_vec();
    let mut cw = w;
    if ow != w {
        let mut out = vec![0u8; h * ow * 3];
        resample_axis(
            &cur,
            &axis_weights(w, ow),
            h,
            |y, x| (y * w + x) * 3,
            |y, x| (y * ow + x) * 3,
            &mut out,
        );
        cur = out;
        cw = ow;
    }
    if oh != h {
        let mut out = vec![0u8; oh * cw * 3];
        resample_axis(
            &cur,
            &axis_weights(h, oh),
            cw,
            |x, y| (y * cw + x) * 3,
            |x, y| (y * cw + x) * 3,
            &mut out,
        );
        cur = out;
    }
    cur
}

/// The processor on decoded RGB bytes `[height·width·3]` (`what` names the image in errors).
pub fn preprocess(
    what: &str,
    height: usize,
    width: usize,
    rgb: &[u8],
    p: &ProcessorConfig,
) -> Result<ProcessedImage, VisionError> {
    if rgb.len() != height * width * 3 {
        return Err(VisionError::Image {
            what: what.to_string(),
            message: format!("{} bytes for a {height}×{width} RGB image", rgb.len()),
        });
    }
    let (rh, rw) = smart_resize(what, height, width, p.patch_size * p.merge_size, p.limits)?;
    let resized;
    let px: &[u8] = if (rh, rw) == (height, width) {
        rgb
    } else {
        resized = resize_bicubic_aa(rgb, height, width, rh, rw);
        &resized
    };
    let mean = p.mean.map(|m| (m * 255.0) as f32);
    let std = p.std.map(|s| (s * 255.0) as f32);
    let (ps, m, tp) = (p.patch_size, p.merge_size, p.temporal_patch_size);
    let (gh, gw) = (rh / ps, rw / ps);
    let row = 3 * tp * ps * ps;
    let mut pixels = Vec::with_capacity(gh * gw * row);
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for ih in 0..m {
                for iw in 0..m {
                    let (y0, x0) = ((bh * m + ih) * ps, (bw * m + iw) * ps);
                    for c in 0..3 {
                        // Every frame of a still image is the image.
                        for _ in 0..tp {
                            for y in y0..y0 + ps {
                                for x in x0..x0 + ps {
                                    let v = px[(y * rw + x) * 3 + c] as f32;
                                    pixels.push((v - mean[c]) / std[c]);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(ProcessedImage {
        pixels,
        grid: [1, gh, gw],
        resized: (rh, rw),
    })
}
