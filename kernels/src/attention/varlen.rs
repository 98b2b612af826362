//! Bidirectional attention over variable-length segments packed in one batch (`cu_seqlens`, as
//! flash-attention's `varlen` entry and vision transformers call it): the patches of several
//! images of different sizes lie back to back in `q`, `k`, `v [T, H·D]`, segment `b` owning rows
//! `cu_seqlens[b] .. cu_seqlens[b + 1]`, and every query attends to every key of its own segment
//! and to no other (Qwen2/3-VL's vision blocks, one segment per image or frame).
//!
//! [`varlen_attention()`] is [`super::prefill::flash_prefill()`]'s online softmax without the
//! causal mask, on views bounded to one segment (`rows_clipped`): a ragged query or key tile reads
//! zeros past the segment, its scores are masked to −∞, and its stores are dropped, so no tile
//! ever touches a neighbouring image. The segment bounds come from device memory at run time
//! (`load_index`), as the grouped expert GEMM's offsets do; a cost-only run given the real
//! `cu_seqlens` (the host knows the images' sizes) costs every segment at its true length.

use super::decode::online_softmax_step;
use super::reference::{attention_varlen, VarlenShape};
use crate::testdata::Rng;
use dsl_core::prelude::*;
use dsl_core::SimError;

/// One program per (query tile of a segment, head, segment). The grid's first axis covers the
/// longest segment (`max_len`); shorter segments' extra tiles find no rows and do nothing.
#[kernel(
    grid = (cdiv(max_len, BQ), q.cols() / head_dim, cu_seqlens.len().saturating_sub(1)),
    tunable(BQ = [64, 16, 32, 128], BK = [64, 16, 32, 128], BD = [128, 16, 32, 64, 256]),
    helpers(online_softmax_step)
)]
#[allow(clippy::too_many_arguments)]
pub fn varlen_attention<T: Float>(
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    o: &Tensor<T>,
    cu_seqlens: &Tensor<i32>,
    max_len: usize,
    head_dim: usize,
    sm_scale: f32,
) {
    require(
        head_dim <= BD,
        "the BD tile must cover head_dim (varlen_config picks one)",
    );
    let (h, b) = (program_id(1), program_id(2));
    let segments = num_programs(2);
    // Cost-only runs without bounds assume equal segments.
    let start = load_index(cu_seqlens, b, b * q.rows() / segments);
    let end = load_index(cu_seqlens, b + 1, (b + 1) * q.rows() / segments);
    let cols = h * head_dim;
    let qs = q.rows_clipped(start, end).cols_clipped(cols, head_dim);
    let ks = k.rows_clipped(start, end).cols_clipped(cols, head_dim);
    let vs = v.rows_clipped(start, end).cols_clipped(cols, head_dim);
    let os = o.rows_clipped(start, end).cols_clipped(cols, head_dim);
    let len = qs.rows();
    for q0 in (program_id(0) * BQ..len).step_by(num_programs(0) * BQ) {
        let tq = load::<BQ, BD>(&qs, q0, 0);
        let mut m = full::<f32, BQ, 1>(f32::NEG_INFINITY);
        let mut l = zeros::<f32, BQ, 1>();
        let mut acc = zeros::<f32, BQ, BD>();
        for kb in (0..len).step_by(BK) {
            let tk = load_async::<BK, BD>(&ks, kb, 0);
            let tv = load_async::<BK, BD>(&vs, kb, 0);
            let mut s = zeros::<f32, BQ, BK>();
            mma_bt(&mut s, &tq, &tk);
            // Keys past the segment's end are −∞; no causal mask.
            let s = mask_keys(&scale(&s, sm_scale), 0, kb, len, false);
            let p = online_softmax_step::<BQ, BK, BD>(&s, &mut m, &mut l, &mut acc);
            mma(&mut acc, &cast::<T>(&p), &tv);
        }
        store(&os, q0, 0, &cast::<T>(&div_col(&acc, &l)));
    }
}

fn bad(message: String) -> SimError {
    SimError::Launch {
        kernel: varlen_attention::META.name.to_string(),
        message,
    }
}

/// The tiles [`run_varlen_attention`] uses: the smallest declared `BD` covering `head_dim`, and
/// query/key tiles no longer than the longest segment needs (64 at most).
pub fn varlen_config(head_dim: usize, max_len: usize) -> Result<Config, SimError> {
    let m = &varlen_attention::META;
    let bd = crate::tile_choice::at_least(m, "BD", head_dim).ok_or_else(|| {
        bad(format!(
            "head_dim {head_dim} is wider than the largest BD tile of {}",
            m.name
        ))
    })?;
    Ok(crate::tile_choice::covering_config(
        m,
        Config::new().with("BD", bd),
        &[("BQ", max_len, 64), ("BK", max_len, 64)],
    ))
}

/// Checks `cu_seqlens` (host copy) against the `rows` of the packed activations: it starts at
/// 0, never decreases, ends at `rows`, and holds at least one segment. Returns the longest
/// segment.
pub fn check_cu_seqlens(cu_seqlens: &[i32], rows: usize) -> Result<usize, SimError> {
    let ok = cu_seqlens.len() >= 2
        && cu_seqlens[0] == 0
        && cu_seqlens.last() == Some(&(rows as i32))
        && cu_seqlens.windows(2).all(|p| p[0] <= p[1]);
    if !ok {
        return Err(bad(format!(
            "`cu_seqlens` {cu_seqlens:?} must start at 0, never decrease and end at the {rows} \
             packed rows (one entry per segment boundary)"
        )));
    }
    Ok(cu_seqlens
        .windows(2)
        .map(|p| (p[1] - p[0]) as usize)
        .max()
        .unwrap_or(0))
}

/// Runs [`varlen_attention()`] on packed `q`, `k`, `v`, `o [T, heads·head_dim]` with segment
/// bounds `cu_seqlens` (checked on the host, then handed to the kernel as a device index tensor),
/// scale `1/√head_dim`.
#[allow(clippy::too_many_arguments)]
pub fn run_varlen_attention<T: Float>(
    launcher: &Launcher,
    q: &Tensor<T>,
    k: &Tensor<T>,
    v: &Tensor<T>,
    o: &Tensor<T>,
    cu_seqlens: &[i32],
    head_dim: usize,
) -> Result<Launch, SimError> {
    let rows = q.rows();
    if head_dim == 0 || !q.cols().is_multiple_of(head_dim) {
        return Err(bad(format!(
            "q {q:?} must hold whole heads of head_dim {head_dim}"
        )));
    }
    for (name, t) in [("k", k), ("v", v), ("o", o)] {
        if t.shape() != q.shape() {
            return Err(bad(format!(
                "{name} {t:?} must have q's shape {:?} (bidirectional self-attention: one key and \
                 value per query, as many heads)",
                q.shape()
            )));
        }
    }
    let max_len = check_cu_seqlens(cu_seqlens, rows)?;
    let bounds = Tensor::<i32>::from_indices(&[cu_seqlens.len()], cu_seqlens).map_err(bad)?;
    let config = varlen_config(head_dim, max_len)?;
    varlen_attention::launch(
        launcher,
        &config,
        q,
        k,
        v,
        o,
        &bounds,
        max_len,
        head_dim,
        (1.0 / (head_dim as f64).sqrt()) as f32,
    )
}

/// A varlen case on random inputs (q, k, v uniform in ±1, output poisoned): runs the kernel with
/// `config` (or [`varlen_config`]'s) and returns the output and the f64 reference.
pub fn run_case(
    launcher: &Launcher,
    shape: &VarlenShape,
    config: Option<&Config>,
    seed: u64,
) -> Result<(Vec<f32>, Vec<f64>), SimError> {
    let rows = shape.rows();
    let width = shape.heads * shape.head_dim;
    let mut rng = Rng::new(seed);
    let (qv, kv, vv) = (
        rng.vec(rows * width, 1.0),
        rng.vec(rows * width, 1.0),
        rng.vec(rows * width, 1.0),
    );
    let t = |v: &[f32]| Tensor::<f32>::from_f32(&[rows, width], v).map_err(bad);
    let (q, k, v) = (t(&qv)?, t(&kv)?, t(&vv)?);
    let o = Tensor::<f32>::poisoned(&[rows, width]);
    let cu = shape.cu_seqlens();
    match config {
        None => {
            run_varlen_attention(launcher, &q, &k, &v, &o, &cu, shape.head_dim)?;
        }
        Some(c) => {
            let max_len = check_cu_seqlens(&cu, rows)?;
            let bounds = Tensor::<i32>::from_indices(&[cu.len()], &cu).map_err(bad)?;
            varlen_attention::launch(
                launcher,
                c,
                &q,
                &k,
                &v,
                &o,
                &bounds,
                max_len,
                shape.head_dim,
                (1.0 / (shape.head_dim as f64).sqrt()) as f32,
            )?;
        }
    }
    let scale = 1.0 / (shape.head_dim as f64).sqrt();
    let want = attention_varlen(&qv, &kv, &vv, shape, scale).map_err(|e| bad(e.0))?;
    Ok((o.to_vec().unwrap_or_default(), want))
}
