//! Element-wise operators of a forward pass, in f32 over token-major `[T, N]` activations:
//!
//! - [`add()`]: `out = a + b` (the residual adds between blocks);
//! - [`sigmoid_mul()`]: `out = x · σ(gate)`, same shapes (Qwen3-Next's gated attention output:
//!   `attn_output * torch.sigmoid(gate)`);
//! - [`sigmoid_mul_col()`]: `out[t, :] = x[t, :] · σ(gate[t])` with `gate [T, 1]` (Qwen3-Next's
//!   shared-expert gate, one scalar per token);
//! - [`mul_col()`]: `out[t, :] = x[t, :] · s[t]` with `s [T, 1]` (Llama-4: a routed expert's
//!   input times its router score, the query of a NoPE layer times its attention temperature);
//! - [`add_bias()`]: `out[t, :] = x[t, :] + b` with `b [1, N]` (the q/k/v projection biases of
//!   Qwen2 and GLM-4.5's attention);
//! - [`gelu()`]: `out = GELU(x)`, exact (`nn.GELU()`, erf) or tanh-approximated
//!   (`gelu_pytorch_tanh`), the activation of vision transformers' MLPs and of Qwen3-VL's patch
//!   merger.
//!
//! One program per `BR×BC` tile; ragged rows and columns are masked by the loads and the store.
//! The `run_*` wrappers check the shapes and pick the tiles ([`tiles_for`]).

use dsl_core::prelude::*;
use dsl_core::SimError;

/// `out = a + b`: one program per `BR×BC` tile.
#[kernel(
    grid = (cdiv(out.rows(), BR), cdiv(out.cols(), BC)),
    tunable(BR = [16, 1, 4, 64], BC = [256, 32, 64, 128, 512])
)]
pub fn add(a: &Tensor<f32>, b: &Tensor<f32>, out: &Tensor<f32>) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let ta = load_async::<BR, BC>(a, r, c);
    let tb = load_async::<BR, BC>(b, r, c);
    store(out, r, c, &add(&ta, &tb));
}

/// `out[t, :] = x[t, :] + b` with one bias row `b [1, N]`: one program per `BR×BC` tile.
#[kernel(
    grid = (cdiv(out.rows(), BR), cdiv(out.cols(), BC)),
    tunable(BR = [16, 1, 4, 64], BC = [256, 32, 64, 128, 512])
)]
pub fn add_bias(x: &Tensor<f32>, b: &Tensor<f32>, out: &Tensor<f32>) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let tb = load_async::<1, BC>(b, 0, c);
    let tx = load_async::<BR, BC>(x, r, c);
    store(out, r, c, &add_row(&tx, &tb));
}

/// `out = x · σ(gate)`: one program per `BR×BC` tile.
#[kernel(
    grid = (cdiv(out.rows(), BR), cdiv(out.cols(), BC)),
    tunable(BR = [16, 1, 4, 64], BC = [256, 32, 64, 128, 512])
)]
pub fn sigmoid_mul(gate: &Tensor<f32>, x: &Tensor<f32>, out: &Tensor<f32>) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let tg = load_async::<BR, BC>(gate, r, c);
    let tx = load_async::<BR, BC>(x, r, c);
    store(out, r, c, &mul(&tx, &sigmoid(&tg)));
}

/// `out[t, :] = x[t, :] · σ(gate[t])` with one gate per row: one program per `BR×BC` tile.
#[kernel(
    grid = (cdiv(out.rows(), BR), cdiv(out.cols(), BC)),
    tunable(BR = [16, 1, 4, 64], BC = [256, 32, 64, 128, 512])
)]
pub fn sigmoid_mul_col(gate: &Tensor<f32>, x: &Tensor<f32>, out: &Tensor<f32>) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let tg = load_async::<BR, 1>(gate, r, 0);
    let tx = load_async::<BR, BC>(x, r, c);
    store(out, r, c, &mul_col(&tx, &sigmoid(&tg)));
}

/// `out[t, :] = x[t, :] · s[t]` with one scale per row: one program per `BR×BC` tile.
#[kernel(
    grid = (cdiv(out.rows(), BR), cdiv(out.cols(), BC)),
    tunable(BR = [16, 1, 4, 64], BC = [256, 32, 64, 128, 512])
)]
pub fn mul_col(s: &Tensor<f32>, x: &Tensor<f32>, out: &Tensor<f32>) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let ts = load_async::<BR, 1>(s, r, 0);
    let tx = load_async::<BR, BC>(x, r, c);
    store(out, r, c, &mul_col(&tx, &ts));
}

/// `out = GELU(x)`: one program per `BR×BC` tile; `approximate` picks the tanh form.
#[kernel(
    grid = (cdiv(out.rows(), BR), cdiv(out.cols(), BC)),
    tunable(BR = [16, 1, 4, 64], BC = [256, 32, 64, 128, 512])
)]
pub fn gelu(x: &Tensor<f32>, out: &Tensor<f32>, approximate: bool) {
    let (r, c) = (program_id(0) * BR, program_id(1) * BC);
    let tx = load::<BR, BC>(x, r, c);
    if approximate {
        store(out, r, c, &gelu_tanh(&tx));
    } else {
        store(out, r, c, &gelu(&tx));
    }
}

/// The tiles the `run_*` wrappers use for a `[rows, cols]` output on a core of `sram_bytes`: the
/// smallest declared `BR` and `BC` covering it, at most 512 columns and at most 64 rows, fewer
/// when three f32 tiles (two operands and the result) would not fit the core's on-chip memory
/// (an H100-class SM's 228 KB holds 3 × 16 × 512 × 4 bytes, not 3 × 64 × 512 × 4).
pub fn tiles_for(rows: usize, cols: usize, sram_bytes: u64) -> Config {
    // The three kernels declare the same tiles.
    let bc = crate::tile_choice::covering(&add::META, "BC", cols, 512).unwrap_or(512);
    let mut cap = 64;
    while cap > 1 && 3 * cap as u64 * bc as u64 * 4 > sram_bytes {
        cap /= 4;
    }
    crate::tile_choice::covering_config(
        &add::META,
        Config::new(),
        &[("BR", rows, cap), ("BC", cols, 512)],
    )
}

/// A `SimError::Launch` for `kernel` when `got`'s shape is not `want` (`what` names the operand).
fn check_shape(
    kernel: &str,
    what: &str,
    got: &Tensor<f32>,
    want: [usize; 2],
) -> Result<(), SimError> {
    if got.rows() == want[0] && got.cols() == want[1] {
        return Ok(());
    }
    Err(SimError::Launch {
        kernel: kernel.to_string(),
        message: format!(
            "{what} is {got:?} but must be [{}, {}] (the output's rows{})",
            want[0],
            want[1],
            if want[1] == 1 {
                ", one value per row"
            } else {
                " and columns"
            }
        ),
    })
}

/// Runs [`add()`]: `out = a + b`, all three `[T, N]` (checked).
pub fn run_add(
    launcher: &Launcher,
    a: &Tensor<f32>,
    b: &Tensor<f32>,
    out: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let shape = [out.rows(), out.cols()];
    check_shape(add::META.name, "a", a, shape)?;
    check_shape(add::META.name, "b", b, shape)?;
    add::launch(
        launcher,
        &tiles_for(shape[0], shape[1], launcher.preset.sram.bytes_per_core),
        a,
        b,
        out,
    )
}

/// Runs [`add_bias()`]: `out[t, :] = x[t, :] + b`, `x` and `out [T, N]`, `b [1, N]` (checked;
/// `out` may be `x`).
pub fn run_add_bias(
    launcher: &Launcher,
    x: &Tensor<f32>,
    b: &Tensor<f32>,
    out: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let (rows, cols) = (out.rows(), out.cols());
    check_shape(add_bias::META.name, "x", x, [rows, cols])?;
    check_shape(add_bias::META.name, "b", b, [1, cols])?;
    add_bias::launch(
        launcher,
        &tiles_for(rows, cols, launcher.preset.sram.bytes_per_core),
        x,
        b,
        out,
    )
}

/// Runs [`sigmoid_mul()`]: `out = x · σ(gate)`, all three `[T, N]` (checked).
pub fn run_sigmoid_mul(
    launcher: &Launcher,
    gate: &Tensor<f32>,
    x: &Tensor<f32>,
    out: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let shape = [out.rows(), out.cols()];
    check_shape(sigmoid_mul::META.name, "gate", gate, shape)?;
    check_shape(sigmoid_mul::META.name, "x", x, shape)?;
    sigmoid_mul::launch(
        launcher,
        &tiles_for(shape[0], shape[1], launcher.preset.sram.bytes_per_core),
        gate,
        x,
        out,
    )
}

/// Runs [`sigmoid_mul_col()`]: `out = x · σ(gate)` per row, `gate [T, 1]`, `x`, `out [T, N]`
/// (checked).
pub fn run_sigmoid_mul_col(
    launcher: &Launcher,
    gate: &Tensor<f32>,
    x: &Tensor<f32>,
    out: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let (rows, cols) = (out.rows(), out.cols());
    check_shape(sigmoid_mul_col::META.name, "gate", gate, [rows, 1])?;
    check_shape(sigmoid_mul_col::META.name, "x", x, [rows, cols])?;
    sigmoid_mul_col::launch(
        launcher,
        &tiles_for(rows, cols, launcher.preset.sram.bytes_per_core),
        gate,
        x,
        out,
    )
}

/// Runs [`mul_col()`]: `out = x · s` per row, `s [T, 1]`, `x`, `out [T, N]` (checked; `out` may
/// be `x`).
pub fn run_mul_col(
    launcher: &Launcher,
    s: &Tensor<f32>,
    x: &Tensor<f32>,
    out: &Tensor<f32>,
) -> Result<Launch, SimError> {
    let (rows, cols) = (out.rows(), out.cols());
    check_shape(mul_col::META.name, "s", s, [rows, 1])?;
    check_shape(mul_col::META.name, "x", x, [rows, cols])?;
    mul_col::launch(
        launcher,
        &tiles_for(rows, cols, launcher.preset.sram.bytes_per_core),
        s,
        x,
        out,
    )
}

/// Runs [`gelu()`]: `out = GELU(x)` (tanh form when `approximate`), both `[T, N]` (checked).
pub fn run_gelu(
    launcher: &Launcher,
    x: &Tensor<f32>,
    out: &Tensor<f32>,
    approximate: bool,
) -> Result<Launch, SimError> {
    let (rows, cols) = (out.rows(), out.cols());
    check_shape(gelu::META.name, "x", x, [rows, cols])?;
    gelu::launch(
        launcher,
        &tiles_for(rows, cols, launcher.preset.sram.bytes_per_core),
        x,
        out,
        approximate,
    )
}
