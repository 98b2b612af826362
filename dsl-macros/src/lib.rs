//! # dsl-macros — `#[kernel]`
//!
//! Turns a plain-looking Rust function into a day0 tile kernel. The macro only parses, validates and
//! expands; the runtime (tiles, intrinsics, launch) lives in `dsl-core`.
//!
//! - `parse/`: the attribute (`grid = ...`, `tunable(NAME = [..])`, `helper`, `helpers(..)`) and the
//!   body validation (the DSL subset, with spanned errors that say what is allowed);
//! - `intrinsics`: the intrinsic table, read from dsl-core's `src/intrinsics.rs` (each `pub fn`
//!   there is an intrinsic), so adding one to dsl-core is the whole change;
//! - `generate/`: the rewritten function (execution context threaded, source lines recorded) and the
//!   companion module with the kernel's metadata and its `launch` function.

mod generate;
mod intrinsics;
mod parse;

use proc_macro::TokenStream;

/// Marks a function as a day0 tile kernel (or, with `helper`, a function kernels may call).
///
/// ```text
/// #[kernel(grid = (cdiv(c.rows(), BM), cdiv(c.cols(), BN)),
///          tunable(BM = [64, 128], BN = [64, 128], BK = [32, 64]))]
/// pub fn gemm<T: Float>(a: &Tensor<T>, b: &Tensor<T>, c: &Tensor<f32>) { ... }
/// ```
///
/// Generates the kernel function (with the tunables as const generics and the execution context as
/// a hidden first parameter) and a module of the same name holding `META` (name, parameters,
/// tunable space, source lines) and `launch(launcher, config, args...)`.
///
/// Helpers factor code out of kernels. A `#[kernel(helper)]` function gets the context as a hidden
/// first parameter too, takes the kernel's constants as const generics and may return a value; a
/// kernel (or another helper) lists the helpers it calls in `helpers(...)`:
///
/// ```text
/// #[kernel(helper)]
/// fn mul_add<const R: usize, const C: usize>(a: &Tile<f32, R, C>, b: &Tile<f32, R, C>) -> Tile<f32, R, C> {
///     add(&mul(a, b), b)
/// }
///
/// #[kernel(grid = (cdiv(x.rows(), BR),), tunable(BR = [8, 16]), helpers(mul_add))]
/// fn k(x: &Tensor<f32>, y: &Tensor<f32>) { ... mul_add(&tx, &ty) ... }
/// ```
///
/// What a helper issues is attributed to the kernel line that called it.
///
/// Mistakes are compile errors that point at the offending code and say what is allowed; the
/// cases are pinned in `dsl-core/tests/ui/`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    generate::expand(attr.into(), item.into()).into()
}
