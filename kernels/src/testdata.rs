//! Deterministic random inputs for checks, benchmarks and the CLI (never zeros).

/// A small, fast, seedable generator (xorshift64*), so inputs are reproducible from a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Next raw 64 bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

use dsl_core::{Backend, Elem, Launcher, SimError, Tensor};

/// Builds a case's tensors for either backend: random inputs and NaN-poisoned outputs in
/// functional runs, shape-only tensors in cost-only runs (nothing allocated).
#[derive(Debug)]
pub struct CaseTensors {
    rng: Option<Rng>,
    kernel: &'static str,
}

impl CaseTensors {
    /// Tensors for a launch of `kernel` on `launcher`, inputs drawn from `seed`.
    pub fn new(launcher: &Launcher, seed: u64, kernel: &'static str) -> CaseTensors {
        let rng = (launcher.backend == Backend::Functional).then(|| Rng::new(seed));
        CaseTensors { rng, kernel }
    }

    /// An input uniform in [center − scale, center + scale) (drawn in row-major order).
    pub fn input<T: Elem>(
        &mut self,
        shape: &[usize],
        center: f32,
        scale: f32,
    ) -> Result<Tensor<T>, SimError> {
        match &mut self.rng {
            Some(rng) => {
                let n: usize = shape.iter().product();
                let values: Vec<f32> = rng.vec(n, scale).into_iter().map(|v| v + center).collect();
                Tensor::from_f32(shape, &values).map_err(|message| SimError::Launch {
                    kernel: self.kernel.to_string(),
                    message,
                })
            }
            None => Ok(Tensor::shape_only(shape)),
        }
    }

    /// An output: NaN-poisoned, so an element the kernel forgets to write fails its check.
    pub fn output<T: Elem>(&self, shape: &[usize]) -> Tensor<T> {
        match self.rng {
            Some(_) => Tensor::poisoned(shape),
            None => Tensor::shape_only(shape),
        }
    }
}

/// Expert-grouped row ranges for `counts[e]` rows of expert `e`: `offsets [E + 1]`, starting at
/// 0 (what a routing plan's `expert_offsets` holds).
pub fn offsets_of(counts: &[usize]) -> Vec<usize> {
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    offsets.push(0);
    for c in counts {
        offsets.push(offsets[offsets.len() - 1] + c);
    }
    offsets
}

/// A random `[e, n, k]` group-scaled INT4 weight (any byte is two valid codes; scales of either
/// sign, bf16) and its values as the matrix unit reads them: `(code − 8) · scale`, exact in f32,
/// rounded to bf16 (the dtype [`crate::moe::grouped::grouped_linear_int4`] dequantizes to). For
/// the checks of the INT4 expert GEMM; errors name a group that does not divide `k`.
pub fn int4_weight(
    shape: [usize; 3],
    group: usize,
    rng: &mut Rng,
) -> Result<(crate::weight::Weight, Vec<f32>), String> {
    let [e, n, k] = shape;
    crate::weight::check_int4_group(group, k, &shape)?;
    let bytes: Vec<u8> = (0..e * n * k / 2).map(|_| rng.next_u64() as u8).collect();
    let scales: Vec<f32> = rng
        .vec(e * n * k / group, 0.05)
        .into_iter()
        .map(|v| half::bf16::from_f32(v).to_f32())
        .collect();
    let values = (0..e * n * k)
        .map(|i| {
            let byte = bytes[i / 2];
            let code = if i % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            half::bf16::from_f32((i32::from(code) - 8) as f32 * scales[i / group]).to_f32()
        })
        .collect();
    let w = crate::weight::Weight::Int4 {
        packed: Tensor::<u8>::from_bytes(&[e, n, k / 2], &bytes)?,
        scales: Tensor::<half::bf16>::from_f32(&[e, n, k / group], &scales)?,
    };
    Ok((w, values))
}
