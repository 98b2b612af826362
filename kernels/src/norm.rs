//! RMSNorm fused with the residual add (the pre-norm transformer block's
//! `h = x + residual; y = rmsnorm(h) · weight`):
//!
//! - `h = x + residual`, stored to `h_out` (the new residual stream);
//! - `y = h · rsqrt(mean(h²) + eps) · weight`, with the mean over the true hidden size `H`.
//!
//! [`rmsnorm_residual()`] holds a whole row in one tile of width `BH ≥ H` (ragged columns load as 0
//! and add nothing to the sum of squares). `h` is computed in f32; `y` is normalised from that f32
//! `h` (not from its `T`-rounded copy in `h_out`), then cast to `T`.
//!
//! The kernel requires `BH ≥ H`: with a narrower tile it would normalise only the first `BH`
//! columns and leave the rest unwritten. Rows wider than the largest `BH` run
//! [`rmsnorm_residual_looped()`] instead: two passes over `BH`-wide column tiles (sum of squares,
//! then normalise, recomputing `h` in f32 so both kernels give the same numbers), one more read of
//! `x` and `residual` than the one-tile form. [`launch_rmsnorm_residual`] and
//! [`run_rmsnorm_residual`] pick between them; direct callers of `rmsnorm_residual::launch` must
//! keep `BH ≥ H` (see [`bh_for`]).
//!
//! Two unfused norms follow the same one-row-per-tile rule (`BH ≥ H`), with host wrappers that
//! check the shapes and pick `BH` and `BR`:
//! - [`rmsnorm()`] / [`run_rmsnorm`]: `y = x · rsqrt(mean(x²) + eps) · weight` (rows wider than
//!   the largest `BH`: [`rmsnorm_looped()`], the same two-pass loop).
//!   ([`layernorm_looped()`] is LayerNorm's: three passes, mean, variance, normalise.) A per-head norm
//!   (Qwen3-Next's `q_norm`/`k_norm` over `head_dim`) is this on the `[T·H, D]` reshaped view of
//!   the `[T, H·D]` activations. Qwen3-Next's `(1 + w)` norms take `1 + w` as the weight.
//! - [`layernorm()`] / [`run_layernorm`]: `y = (x − mean) · rsqrt(var + eps) · weight + bias`,
//!   biased variance (`torch.nn.LayerNorm`; DeepSeek-V3.2's indexer `k_norm` is one, eps 1e-6).

use crate::gemm::GemmDtype;
use dsl_core::prelude::*;
use dsl_core::{KernelMeta, SimError};

/// Fused residual add + RMSNorm: one program per `BR` rows, the whole row (`H ≤ BH`) in one tile.
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BH = [1024, 2048, 4096, 8192, 256, 512, 16384], BR = [1, 2, 4, 8])
)]
pub fn rmsnorm_residual<T: Float>(
    x: &Tensor<T>,
    residual: &Tensor<T>,
    weight: &Tensor<T>,
    h_out: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) {
    require(x.cols() <= BH, "the BH tile must hold a whole row");
    let r = program_id(0) * BR;
    let xt = cast::<f32>(&load::<BR, BH>(x, r, 0));
    let rt = cast::<f32>(&load::<BR, BH>(residual, r, 0));
    let h = add(&xt, &rt);
    store(h_out, r, 0, &cast::<T>(&h));
    // mean(h²) over the true width: padding columns are 0 and add nothing.
    let ms = scale(&row_sum(&square(&h)), (1.0f64 / x.cols() as f64) as f32);
    let inv = rsqrt(&add_scalar(&ms, eps));
    let w = cast::<f32>(&load::<1, BH>(weight, 0, 0));
    let yn = mul_row(&mul_col(&h, &inv), &w);
    store(y, r, 0, &cast::<T>(&yn));
}

/// Fused residual add + RMSNorm for rows of any width: one program per `BR` rows, looping twice
/// over `BH`-wide column tiles (the ragged last tile loads zeros and stores only its columns).
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BH = [4096, 1024, 2048, 8192], BR = [1, 2, 4])
)]
pub fn rmsnorm_residual_looped<T: Float>(
    x: &Tensor<T>,
    residual: &Tensor<T>,
    weight: &Tensor<T>,
    h_out: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) {
    let r = program_id(0) * BR;
    let width = x.cols();
    let mut ss = zeros::<f32, BR, 1>();
    for c in (0..width).step_by(BH) {
        let h = add(
            &cast::<f32>(&load::<BR, BH>(x, r, c)),
            &cast::<f32>(&load::<BR, BH>(residual, r, c)),
        );
        store(h_out, r, c, &cast::<T>(&h));
        ss = add(&ss, &row_sum(&square(&h)));
    }
    let inv = rsqrt(&add_scalar(
        &scale(&ss, (1.0f64 / width as f64) as f32),
        eps,
    ));
    for c in (0..width).step_by(BH) {
        let h = add(
            &cast::<f32>(&load::<BR, BH>(x, r, c)),
            &cast::<f32>(&load::<BR, BH>(residual, r, c)),
        );
        let w = cast::<f32>(&load::<1, BH>(weight, 0, c));
        store(y, r, c, &cast::<T>(&mul_row(&mul_col(&h, &inv), &w)));
    }
}

/// Launches the fused residual add + RMSNorm on `x [rows, H]`: one row tile
/// ([`rmsnorm_residual()`], the smallest `BH ≥ H`, one row per program) when `H` fits the largest
/// `BH`, the column-tile loop ([`rmsnorm_residual_looped()`]) above.
#[allow(clippy::too_many_arguments)]
pub fn launch_rmsnorm_residual<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    residual: &Tensor<T>,
    weight: &Tensor<T>,
    h_out: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) -> Result<Launch, SimError> {
    match bh_for(x.cols()) {
        Ok(bh) => rmsnorm_residual::launch(
            launcher,
            &Config::new().with("BH", bh).with("BR", 1),
            x,
            residual,
            weight,
            h_out,
            y,
            eps,
        ),
        Err(_) => rmsnorm_residual_looped::launch(
            launcher,
            &Config::new().with("BR", 1),
            x,
            residual,
            weight,
            h_out,
            y,
            eps,
        ),
    }
}

/// The smallest declared `BH` that holds a row of `h` elements, or a `SimError::Launch` naming `h`
/// and the largest `BH` when none does.
pub fn bh_for(h: usize) -> Result<i64, SimError> {
    row_tile_for(&rmsnorm_residual::META, h)
}

/// [`bh_for`] for any of this module's kernels (each declares its own `BH` values).
fn row_tile_for(meta: &KernelMeta, h: usize) -> Result<i64, SimError> {
    crate::tile_choice::at_least(meta, "BH", h).ok_or_else(|| SimError::Launch {
        kernel: meta.name.to_string(),
        message: format!(
            "hidden size H={h} does not fit one row tile: the largest BH is {}; \
             {} keeps a whole row on chip (add a wider BH or split the row)",
            crate::tile_choice::declared(meta, "BH")
                .last()
                .copied()
                .unwrap_or(0),
            meta.name
        ),
    })
}

/// One fused residual-add + RMSNorm problem.
#[derive(Debug, Clone)]
pub struct RmsNormCase {
    /// Rows (tokens).
    pub rows: usize,
    /// Hidden size `H` (columns).
    pub hidden: usize,
    /// Element dtype of every tensor.
    pub dtype: GemmDtype,
    /// Tunable values (`BH`, `BR`); an unset `BH` becomes the smallest declared value ≥ `H`.
    pub config: Config,
    /// The epsilon inside the square root.
    pub eps: f32,
    /// Seed of the random inputs.
    pub seed: u64,
}

/// The outcome of a case: the report (with `max_rel_error` = the worse of `h` and `y` in
/// functional runs) and both outputs (functional runs only).
#[derive(Debug)]
pub struct RmsNormRun {
    /// The launch.
    pub launch: Launch,
    /// `h = x + residual`, row-major (functional runs).
    pub h: Option<Vec<f32>>,
    /// `y`, row-major (functional runs).
    pub y: Option<Vec<f32>>,
    /// Max relative error of `h` (functional runs).
    pub h_rel_error: Option<f64>,
    /// Max relative error of `y` (functional runs).
    pub y_rel_error: Option<f64>,
}

/// Runs a case: x and residual uniform in [-1, 1), weight uniform in [0.5, 1.5), outputs poisoned
/// with NaN, launch, and — in functional runs — comparison of both outputs with the f64 reference
/// of the rounded inputs. Picks `BH` when the config leaves it unset; refuses `H` wider than the
/// chosen (or largest) `BH` with a `SimError::Launch`.
pub fn run_rmsnorm_residual(
    launcher: &Launcher,
    case: &RmsNormCase,
) -> Result<RmsNormRun, SimError> {
    match case.dtype {
        GemmDtype::F32 => run_typed::<f32>(launcher, case),
        GemmDtype::Bf16 => run_typed::<bf16>(launcher, case),
    }
}

fn run_typed<T: Float>(launcher: &Launcher, case: &RmsNormCase) -> Result<RmsNormRun, SimError> {
    let (rows, hid) = (case.rows, case.hidden);
    let name = rmsnorm_residual::META.name;
    let bad = |e: String| SimError::Launch {
        kernel: name.to_string(),
        message: e,
    };
    let config = match case.config.get("BH") {
        Some(bh) if (bh as usize) < hid => {
            return Err(bad(format!(
                "BH={bh} is narrower than the hidden size H={hid}; rmsnorm_residual needs BH ≥ H \
                 (leave BH unset to pick the smallest that fits)"
            )))
        }
        Some(_) => case.config.clone(),
        None => match bh_for(hid) {
            Ok(bh) => case.config.clone().with("BH", bh),
            // Wider than any row tile: the column-tile loop (its own BH choices).
            Err(_) => case.config.clone(),
        },
    };
    let looped = config.get("BH").is_none();
    let shape = [rows, hid];
    let mut t = crate::testdata::CaseTensors::new(launcher, case.seed, name);
    let x = t.input::<T>(&shape, 0.0, 1.0)?;
    let res = t.input::<T>(&shape, 0.0, 1.0)?;
    let w = t.input::<T>(&[hid], 1.0, 0.5)?;
    let (h, y) = (t.output::<T>(&shape), t.output::<T>(&shape));
    let mut launch = if looped {
        rmsnorm_residual_looped::launch(launcher, &config, &x, &res, &w, &h, &y, case.eps)?
    } else {
        rmsnorm_residual::launch(launcher, &config, &x, &res, &w, &h, &y, case.eps)?
    };
    let (hv, yv) = (h.to_vec(), y.to_vec());
    let (mut h_rel_error, mut y_rel_error) = (None, None);
    if let (Some(ho), Some(yo), Some(xv), Some(rv), Some(wv)) =
        (&hv, &yv, x.to_vec(), res.to_vec(), w.to_vec())
    {
        let (want_h, want_y) =
            crate::reference::rmsnorm_residual(&xv, &rv, &wv, rows, hid, case.eps);
        let eh = crate::reference::rel_error(ho, &want_h);
        let ey = crate::reference::rel_error(yo, &want_y);
        h_rel_error = Some(eh);
        y_rel_error = Some(ey);
        launch.report.max_rel_error = Some(eh.max(ey));
    }
    Ok(RmsNormRun {
        launch,
        h: hv,
        y: yv,
        h_rel_error,
        y_rel_error,
    })
}

/// RMSNorm without the residual add: one program per `BR` rows, the whole row (`H ≤ BH`) in one
/// tile; mean over the true width `H` (padding columns load as 0 and add nothing).
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BH = [256, 16, 32, 64, 128, 512, 1024, 2048, 4096, 8192, 16384], BR = [4, 1, 8, 16])
)]
pub fn rmsnorm<T: Float>(x: &Tensor<T>, weight: &Tensor<T>, y: &Tensor<T>, eps: f32) {
    require(x.cols() <= BH, "the BH tile must hold a whole row");
    let r = program_id(0) * BR;
    let xt = cast::<f32>(&load::<BR, BH>(x, r, 0));
    let ms = scale(&row_sum(&square(&xt)), (1.0f64 / x.cols() as f64) as f32);
    let inv = rsqrt(&add_scalar(&ms, eps));
    let w = cast::<f32>(&load::<1, BH>(weight, 0, 0));
    store(y, r, 0, &cast::<T>(&mul_row(&mul_col(&xt, &inv), &w)));
}

/// RMSNorm for rows of any width: one program per `BR` rows, two passes over `BH`-wide column
/// tiles (sum of squares, then normalise).
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BH = [4096, 1024, 2048, 8192], BR = [1, 2, 4])
)]
pub fn rmsnorm_looped<T: Float>(x: &Tensor<T>, weight: &Tensor<T>, y: &Tensor<T>, eps: f32) {
    let r = program_id(0) * BR;
    let width = x.cols();
    let mut ss = zeros::<f32, BR, 1>();
    for c in (0..width).step_by(BH) {
        ss = add(
            &ss,
            &row_sum(&square(&cast::<f32>(&load::<BR, BH>(x, r, c)))),
        );
    }
    let inv = rsqrt(&add_scalar(
        &scale(&ss, (1.0f64 / width as f64) as f32),
        eps,
    ));
    for c in (0..width).step_by(BH) {
        let xt = cast::<f32>(&load::<BR, BH>(x, r, c));
        let w = cast::<f32>(&load::<1, BH>(weight, 0, c));
        store(y, r, c, &cast::<T>(&mul_row(&mul_col(&xt, &inv), &w)));
    }
}

/// LayerNorm (biased variance, affine): one program per `BR` rows, the whole row (`H ≤ BH`) in one
/// tile, statistics over the true width `H`.
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BH = [256, 16, 32, 64, 128, 512, 1024, 2048, 4096, 8192, 16384], BR = [4, 1, 8, 16])
)]
pub fn layernorm<T: Float>(
    x: &Tensor<T>,
    weight: &Tensor<T>,
    bias: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) {
    require(x.cols() <= BH, "the BH tile must hold a whole row");
    let r = program_id(0) * BR;
    let inv_h = (1.0f64 / x.cols() as f64) as f32;
    let xt = cast::<f32>(&load::<BR, BH>(x, r, 0));
    let mean = scale(&row_sum(&xt), inv_h);
    // Padding columns would be 0 − mean after centering: a 0/1 column mask (exp of 0 or −∞ from
    // `mask_keys` past the true width) zeroes them, so they add nothing to the variance.
    let valid = exp(&mask_keys(&zeros::<f32, 1, BH>(), 0, 0, x.cols(), false));
    let xc = mul_row(&sub_col(&xt, &mean), &valid);
    let ss = row_sum(&square(&xc));
    let inv = rsqrt(&add_scalar(&scale(&ss, inv_h), eps));
    let w = cast::<f32>(&load::<1, BH>(weight, 0, 0));
    let b = cast::<f32>(&load::<1, BH>(bias, 0, 0));
    store(
        y,
        r,
        0,
        &cast::<T>(&add_row(&mul_row(&mul_col(&xc, &inv), &w), &b)),
    );
}

/// LayerNorm for rows of any width: one program per `BR` rows, three passes over `BH`-wide column
/// tiles (mean; variance of the centred values, padding columns masked out; normalise).
#[kernel(
    grid = (cdiv(x.rows(), BR),),
    tunable(BH = [4096, 1024, 2048, 8192], BR = [1, 2, 4])
)]
pub fn layernorm_looped<T: Float>(
    x: &Tensor<T>,
    weight: &Tensor<T>,
    bias: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) {
    let r = program_id(0) * BR;
    let width = x.cols();
    let inv_h = (1.0f64 / width as f64) as f32;
    let mut sum = zeros::<f32, BR, 1>();
    for c in (0..width).step_by(BH) {
        sum = add(&sum, &row_sum(&cast::<f32>(&load::<BR, BH>(x, r, c))));
    }
    let mean = scale(&sum, inv_h);
    let mut ss = zeros::<f32, BR, 1>();
    for c in (0..width).step_by(BH) {
        // Columns past the row's end would be 0 − mean after centring: the 0/1 mask drops them.
        let valid = exp(&mask_keys(&zeros::<f32, 1, BH>(), 0, c, width, false));
        let xc = mul_row(
            &sub_col(&cast::<f32>(&load::<BR, BH>(x, r, c)), &mean),
            &valid,
        );
        ss = add(&ss, &row_sum(&square(&xc)));
    }
    let inv = rsqrt(&add_scalar(&scale(&ss, inv_h), eps));
    for c in (0..width).step_by(BH) {
        let xc = sub_col(&cast::<f32>(&load::<BR, BH>(x, r, c)), &mean);
        let w = cast::<f32>(&load::<1, BH>(weight, 0, c));
        let b = cast::<f32>(&load::<1, BH>(bias, 0, c));
        store(
            y,
            r,
            c,
            &cast::<T>(&add_row(&mul_row(&mul_col(&xc, &inv), &w), &b)),
        );
    }
}

/// Most elements of a norm's `BR×BH` f32 row tile the wrappers allow (32 KiB): wide rows get fewer
/// rows per program, so the tiles fit on chip.
const ROW_TILE_ELEMS: usize = 8192;

/// `BH` (the smallest declared ≥ `H`) and `BR` (rows per program, covering `rows` within
/// [`ROW_TILE_ELEMS`]) for `meta` on `x`, after checking that `weight` (and `bias`) hold `H`
/// values and `y` has `x`'s shape.
fn norm_config<T: Elem>(
    meta: &KernelMeta,
    x: &Tensor<T>,
    params: &[(&str, &Tensor<T>)],
    y: &Tensor<T>,
) -> Result<Config, SimError> {
    let (rows, h) = (x.rows(), x.cols());
    check_wide_shapes(meta, x, params, y)?;
    let bh = row_tile_for(meta, h)?;
    let cap = (ROW_TILE_ELEMS / bh as usize).max(1) as i64;
    let br = crate::tile_choice::covering(meta, "BR", rows, cap).unwrap_or(1);
    Ok(Config::new().with("BH", bh).with("BR", br))
}

/// Checks that each of `params` (weight, bias) holds `x`'s row width and `y` has `x`'s shape, as a
/// `SimError::Launch` of `meta` naming the tensor.
fn check_wide_shapes<T: Elem>(
    meta: &KernelMeta,
    x: &Tensor<T>,
    params: &[(&str, &Tensor<T>)],
    y: &Tensor<T>,
) -> Result<(), SimError> {
    let (rows, h) = (x.rows(), x.cols());
    let bad = |message: String| SimError::Launch {
        kernel: meta.name.to_string(),
        message,
    };
    for (what, t) in params {
        if t.len() != h {
            return Err(bad(format!(
                "{what} is {t:?} but must hold the row width H={h} of x {x:?}"
            )));
        }
    }
    if y.rows() != rows || y.cols() != h {
        return Err(bad(format!("y is {y:?} but must have x's shape {x:?}")));
    }
    Ok(())
}

/// Runs [`rmsnorm()`] on `x [rows, H]` with `weight [H]` into `y [rows, H]`, picking `BH` and
/// `BR`; `H` wider than the largest `BH` runs [`rmsnorm_looped()`]. Mismatched shapes are a
/// `SimError::Launch`.
pub fn run_rmsnorm<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    weight: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) -> Result<Launch, SimError> {
    if row_tile_for(&rmsnorm::META, x.cols()).is_err() {
        check_wide_shapes(&rmsnorm_looped::META, x, &[("weight", weight)], y)?;
        return rmsnorm_looped::launch(launcher, &Config::new().with("BR", 1), x, weight, y, eps);
    }
    let config = norm_config(&rmsnorm::META, x, &[("weight", weight)], y)?;
    rmsnorm::launch(launcher, &config, x, weight, y, eps)
}

/// Runs [`layernorm()`] on `x [rows, H]` with `weight`, `bias [H]` into `y [rows, H]`, picking
/// `BH` and `BR`; `H` wider than the largest `BH` runs [`layernorm_looped()`]. Mismatched shapes
/// are a `SimError::Launch`.
pub fn run_layernorm<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    weight: &Tensor<T>,
    bias: &Tensor<T>,
    y: &Tensor<T>,
    eps: f32,
) -> Result<Launch, SimError> {
    if row_tile_for(&layernorm::META, x.cols()).is_err() {
        check_wide_shapes(
            &layernorm_looped::META,
            x,
            &[("weight", weight), ("bias", bias)],
            y,
        )?;
        return layernorm_looped::launch(
            launcher,
            &Config::new().with("BR", 1),
            x,
            weight,
            bias,
            y,
            eps,
        );
    }
    let config = norm_config(
        &layernorm::META,
        x,
        &[("weight", weight), ("bias", bias)],
        y,
    )?;
    layernorm::launch(launcher, &config, x, weight, bias, y, eps)
}
