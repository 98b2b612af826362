//! Runs the linear-attention kernels on random inputs (or cost-only on shapes), checked against
//! the f64 reference: what the tests, the suite and the `day0 kernel linear-attention` CLI call.

use super::chunked::{chunked_delta, chunked_delta_kda};
use super::recurrent::{recurrent_delta, recurrent_delta_kda};
use super::reference::{recurrent_gated_delta, widen, Decay, DeltaInputs, DeltaShape};
use crate::gemm::GemmDtype;
use crate::testdata::CaseTensors;
use dsl_core::prelude::*;
use dsl_core::SimError;

/// Which form of the gated delta rule a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaMode {
    /// Token by token ([`recurrent_delta()`] / [`recurrent_delta_kda()`]): decode.
    Recurrent,
    /// In chunks of `C` tokens ([`chunked_delta()`] / [`chunked_delta_kda()`]): prefill.
    Chunked,
}

/// One linear-attention problem (one sequence, one layer).
#[derive(Debug, Clone)]
pub struct DeltaCase {
    /// GDN (`Decay::Scalar`) or KDA (`Decay::PerChannel`).
    pub decay: Decay,
    /// Recurrent or chunked kernel.
    pub mode: DeltaMode,
    /// Tokens.
    pub seq: usize,
    /// Query/key heads.
    pub k_heads: usize,
    /// Value heads (a multiple of `k_heads`).
    pub v_heads: usize,
    /// Key head dimension (any; covered by a `BDK` tile).
    pub dk: usize,
    /// Value head dimension (any; covered by a `BDV` tile).
    pub dv: usize,
    /// Element dtype of q, k, v and o (state, gates and β are f32).
    pub dtype: GemmDtype,
    /// Tunables (the chunked kernels' `C`; `BDK`/`BDV` are picked to cover the head dims unless
    /// set).
    pub config: Config,
    /// Seed of the random inputs.
    pub seed: u64,
}

impl DeltaCase {
    /// The reference shape of this case (q, k normalised in the kernel, as both models do).
    pub fn shape(&self) -> DeltaShape {
        DeltaShape {
            seq: self.seq,
            k_heads: self.k_heads,
            v_heads: self.v_heads,
            dk: self.dk,
            dv: self.dv,
            decay: self.decay,
            qk_l2norm: true,
        }
    }

    /// The kernel this case launches.
    pub fn kernel_name(&self) -> &'static str {
        match (self.mode, self.decay) {
            (DeltaMode::Recurrent, Decay::Scalar) => recurrent_delta::META.name,
            (DeltaMode::Recurrent, Decay::PerChannel) => recurrent_delta_kda::META.name,
            (DeltaMode::Chunked, Decay::Scalar) => chunked_delta::META.name,
            (DeltaMode::Chunked, Decay::PerChannel) => chunked_delta_kda::META.name,
        }
    }
}

/// A linear-attention run: the report (with `max_rel_error` over the output and the final state
/// in functional runs), the output and the final state.
#[derive(Debug)]
pub struct DeltaRun {
    /// The launch.
    pub launch: Launch,
    /// `o [seq, v_heads·dv]` (functional runs).
    pub output: Option<Vec<f32>>,
    /// Final state `[v_heads·dk, dv]` (functional runs).
    pub state: Option<Vec<f32>>,
}

/// The device tensors of one gated-delta-rule launch (see [`super::recurrent`] for the layouts).
#[derive(Debug)]
pub struct DeltaTensors<T: Float> {
    /// `[seq, k_heads·dk]`.
    pub q: Tensor<T>,
    /// `[seq, k_heads·dk]`.
    pub k: Tensor<T>,
    /// `[seq, v_heads·dv]`.
    pub v: Tensor<T>,
    /// Log-decays `[seq, v_heads]` (GDN) or `[seq, v_heads·dk]` (KDA).
    pub g: Tensor<f32>,
    /// `[seq, v_heads]`.
    pub beta: Tensor<f32>,
    /// Initial state `[v_heads·dk, dv]`.
    pub state_in: Tensor<f32>,
    /// Final state `[v_heads·dk, dv]` (may be `state_in`'s slot in a serving loop).
    pub state_out: Tensor<f32>,
    /// `[seq, v_heads·dv]`.
    pub o: Tensor<T>,
}

/// The kernel for `decay` × `mode`.
pub fn delta_meta(mode: DeltaMode, decay: Decay) -> &'static dsl_core::KernelMeta {
    match (mode, decay) {
        (DeltaMode::Recurrent, Decay::Scalar) => &recurrent_delta::META,
        (DeltaMode::Recurrent, Decay::PerChannel) => &recurrent_delta_kda::META,
        (DeltaMode::Chunked, Decay::Scalar) => &chunked_delta::META,
        (DeltaMode::Chunked, Decay::PerChannel) => &chunked_delta_kda::META,
    }
}

/// The tiles of the `decay` × `mode` kernel for head dims `dk`, `dv`: `base` (a `C` is dropped for
/// the recurrent form) plus the smallest `BDK`/`BDV` covering the dims, unless set.
pub fn delta_config(
    mode: DeltaMode,
    decay: Decay,
    base: &Config,
    dk: usize,
    dv: usize,
) -> Result<Config, SimError> {
    let mut base = base.clone();
    if mode == DeltaMode::Recurrent {
        base.0.remove("C");
    }
    crate::tile_choice::cover(
        delta_meta(mode, decay),
        &base,
        &[("BDK", dk, "key head dim"), ("BDV", dv, "value head dim")],
    )
}

/// Launches the kernel for `decay` × `mode` on `t` (`config` may hold `C` for the chunked form; a
/// `C` given to the recurrent form is ignored, so one configuration serves a prefill and the decode
/// steps after it; `BDK`/`BDV` unless set are the smallest tiles covering the head dims, read from
/// the state's shape). The building block of runners and of the model's state slots.
pub fn launch_delta<T: Float>(
    launcher: &Launcher,
    decay: Decay,
    mode: DeltaMode,
    config: &Config,
    t: &DeltaTensors<T>,
) -> Result<Launch, SimError> {
    let mut config = config.clone();
    if mode == DeltaMode::Recurrent {
        config.0.remove("C");
    }
    let v_heads = t.beta.cols().max(1);
    let (dk, dv) = (t.state_in.rows() / v_heads, t.state_in.cols());
    if dk == 0 || dv == 0 || t.q.cols() < dk {
        return Err(SimError::Launch {
            kernel: delta_meta(mode, decay).name.into(),
            message: format!(
                "state {:?} for {v_heads} value heads gives head dims dk = {dk}, dv = {dv}; both must be ≥ 1 and q ({:?}) must hold at least one key head",
                t.state_in, t.q
            ),
        });
    }
    let config = &delta_config(mode, decay, &config, dk, dv)?;
    let args = (
        &t.q,
        &t.k,
        &t.v,
        &t.g,
        &t.beta,
        &t.state_in,
        &t.state_out,
        &t.o,
    );
    match (mode, decay) {
        (DeltaMode::Recurrent, Decay::Scalar) => recurrent_delta::launch(
            launcher, config, args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7,
        ),
        (DeltaMode::Recurrent, Decay::PerChannel) => recurrent_delta_kda::launch(
            launcher, config, args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7,
        ),
        (DeltaMode::Chunked, Decay::Scalar) => chunked_delta::launch(
            launcher, config, args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7,
        ),
        (DeltaMode::Chunked, Decay::PerChannel) => chunked_delta_kda::launch(
            launcher, config, args.0, args.1, args.2, args.3, args.4, args.5, args.6, args.7,
        ),
    }
}

/// Runs one gated-delta-rule kernel on random inputs — q, k, v uniform in ±1, log-decays `g` in
/// (−0.3, 0) (per head or per channel), β in (0, 1), a non-zero initial state in ±0.5; output and
/// final state NaN-poisoned — and checks output and final state against the f64 recurrence of the
/// rounded inputs. Cost-only launchers get shape-only tensors (nothing allocated, no check).
/// Shapes are validated first: bad ones are errors, not panics.
pub fn run_delta(launcher: &Launcher, case: &DeltaCase) -> Result<DeltaRun, SimError> {
    let name = case.kernel_name();
    let bad = |message: String| SimError::Launch {
        kernel: name.into(),
        message,
    };
    case.shape().validate().map_err(|e| bad(e.to_string()))?;
    if case.seq == 0 {
        return Err(bad("no tokens (seq = 0)".into()));
    }
    let config = case.config.clone();
    match case.dtype {
        GemmDtype::F32 => run_typed::<f32>(launcher, case, &config),
        GemmDtype::Bf16 => run_typed::<bf16>(launcher, case, &config),
    }
}

fn run_typed<T: Float>(
    launcher: &Launcher,
    case: &DeltaCase,
    config: &Config,
) -> Result<DeltaRun, SimError> {
    let s = case.shape();
    let name = case.kernel_name();
    let mut c = CaseTensors::new(launcher, case.seed, name);
    let t = DeltaTensors::<T> {
        q: c.input(&[s.seq, s.k_heads * s.dk], 0.0, 1.0)?,
        k: c.input(&[s.seq, s.k_heads * s.dk], 0.0, 1.0)?,
        v: c.input(&[s.seq, s.v_heads * s.dv], 0.0, 1.0)?,
        g: c.input(&[s.seq, s.v_heads * s.g_width()], -0.15, 0.15)?,
        beta: c.input(&[s.seq, s.v_heads], 0.5, 0.5)?,
        state_in: c.input(&[s.v_heads * s.dk, s.dv], 0.0, 0.5)?,
        state_out: c.output(&[s.v_heads * s.dk, s.dv]),
        o: c.output(&[s.seq, s.v_heads * s.dv]),
    };
    let mut launch = launch_delta(launcher, case.decay, case.mode, config, &t)?;
    let (output, state) = (t.o.to_vec(), t.state_out.to_vec());
    if let (Some(out), Some(st)) = (&output, &state) {
        let want = reference_of(&s, &t).map_err(|message| SimError::Launch {
            kernel: name.into(),
            message,
        })?;
        let eo = crate::reference::rel_error(out, &want.o);
        let es = crate::reference::rel_error(st, &want.state);
        launch.report.max_rel_error = Some(eo.max(es));
    }
    Ok(DeltaRun {
        launch,
        output,
        state,
    })
}

/// The f64 recurrence of what `t` holds (functional tensors only).
fn reference_of<T: Float>(
    s: &DeltaShape,
    t: &DeltaTensors<T>,
) -> Result<super::reference::DeltaOutput, String> {
    let get = |x: Option<Vec<f32>>| x.map(|v| widen(&v)).ok_or("shape-only tensor".to_string());
    let (q, k, v) = (get(t.q.to_vec())?, get(t.k.to_vec())?, get(t.v.to_vec())?);
    let (g, beta, st) = (
        get(t.g.to_vec())?,
        get(t.beta.to_vec())?,
        get(t.state_in.to_vec())?,
    );
    let x = DeltaInputs {
        q: &q,
        k: &k,
        v: &v,
        g: &g,
        beta: &beta,
        state: Some(&st),
    };
    recurrent_gated_delta(s, &x).map_err(|e| e.to_string())
}

/// One point of a chunk-size sweep.
#[derive(Debug)]
pub struct ChunkPoint {
    /// The chunk size `C`.
    pub chunk: usize,
    /// Its run, or why it could not run (e.g. the tiles do not fit in SRAM).
    pub result: Result<DeltaRun, SimError>,
}

/// Runs the chunked kernel of `case` for every chunk size the kernel offers (smallest first):
/// larger chunks move more of the work to the matrix unit (`C×C` products, the `O(C³)` inverse)
/// and cut the sequential state updates (`seq / C` of them); the reports show where that
/// trade-off lands on the device.
pub fn chunk_sweep(launcher: &Launcher, case: &DeltaCase) -> Vec<ChunkPoint> {
    let meta = match case.decay {
        Decay::Scalar => &chunked_delta::META,
        Decay::PerChannel => &chunked_delta_kda::META,
    };
    let mut sizes: Vec<i64> = meta
        .tunables
        .iter()
        .find(|(n, _)| *n == "C")
        .map(|(_, v)| v.to_vec())
        .unwrap_or_default();
    sizes.sort_unstable();
    sizes
        .into_iter()
        .map(|c| {
            let mut case = case.clone();
            case.mode = DeltaMode::Chunked;
            case.config = case.config.clone().with("C", c);
            ChunkPoint {
                chunk: c as usize,
                result: run_delta(launcher, &case),
            }
        })
        .collect()
}
