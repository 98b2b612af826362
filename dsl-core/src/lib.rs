//! # dsl-core — what a kernel author sees
//!
//! - [`Tile`]: an on-chip tile whose shape is in its type; [`Tensor`]: device memory.
//! - [`intrinsics`]: `program_id`, `load`/`load_async` (ragged edges masked), `store`, `mma`,
//!   `zeros`, element-wise math, row/column reductions, `cast`.
//! - [`launch`]: kernel metadata, tunable configurations, and the [`Launcher`] with its two
//!   backends — functional (real data, SIMD) and cost-only (shapes only, same cycles).
//! - [`memo`]: the launch memo, which times a cost-only launch once however often a model repeats
//!   it.
//!
//! Kernels are written with `#[kernel]` (re-exported here), which threads the [`Ctx`] through every
//! intrinsic call and records source lines:
//!
//! ```
//! use dsl_core::prelude::*;
//!
//! #[kernel(grid = (cdiv(x.rows(), BR),), tunable(BR = [8, 16]))]
//! fn double(x: &Tensor<f32>, y: &Tensor<f32>) {
//!     let r = program_id(0) * BR;
//!     let t = load::<BR, 64>(x, r, 0);
//!     let d = add(&t, &t);
//!     store(y, r, 0, &d);
//! }
//!
//! # fn main() {
//! let x = Tensor::<f32>::from_f32(&[20, 64], &vec![1.5; 20 * 64]).unwrap();
//! let y = Tensor::<f32>::poisoned(&[20, 64]);
//! let launcher = Launcher::for_device("npu-910b").unwrap();
//! let run = double::launch(&launcher, &Config::new().with("BR", 16), &x, &y).unwrap();
//! assert!(y.to_vec().unwrap().iter().all(|v| *v == 3.0));
//! assert!(run.report.cycles > 0);
//! # }
//! ```

pub mod ctx;
pub mod elem;
pub mod hazard;
pub mod intrinsics;
pub mod launch;
pub mod memo;
mod packed_operands;
pub mod tensor;
pub mod tile;
mod tile_buffers;
pub mod tuning;

pub use accel_sim::{self, DevicePreset, Report, SimError};
pub use ctx::Ctx;
pub use dsl_macros::kernel;
pub use elem::{bf16, f16, fp8e4m3, Elem, Float};
pub use hazard::Hazards;
pub use launch::{Backend, Config, IntoGrid, KernelMeta, Launch, Launcher};
pub use memo::{ArgKey, LaunchArg, LaunchMemo};
pub use tensor::Tensor;
pub use tile::Tile;
pub use tuning::Tuning;

/// Everything a kernel file needs: `use dsl_core::prelude::*;`.
pub mod prelude {
    pub use crate::elem::{bf16, f16, fp8e4m3, Elem, Float};
    pub use crate::hazard::Hazards;
    pub use crate::intrinsics::cdiv;
    pub use crate::launch::{Backend, Config, Launch, Launcher};
    pub use crate::tensor::Tensor;
    pub use crate::tile::Tile;
    pub use crate::{kernel, Ctx};
}
