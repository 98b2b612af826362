//! Token dispatch and combine around the grouped expert GEMMs.
//!
//! A router chooses `K` experts per token (`idx [T, K]`). [`RoutingPlan::from_topk`] sorts the
//! `T·K` (token, choice) pairs by expert — a counting sort — into *dispatched rows*: expert `e`
//! owns rows `expert_offsets[e]..expert_offsets[e+1]`, holding its tokens in ascending order.
//! [`moe_dispatch()`] gathers the tokens' activations into that order; the grouped GEMMs run on
//! contiguous per-expert row ranges; [`moe_combine()`] gathers each token's `K` expert outputs
//! back in a fixed order and sums them with the routing weights (no scatter-add, so no races and
//! the same bits on every run).
//!
//! The plan is host-side bookkeeping (`O(T·K)` integer work). Real serving stacks run this
//! counting sort on the device as a histogram and a prefix scan; the DSL has no integer histogram
//! or scan intrinsic, and emulating one with per-program loops would time a serial loop that is
//! not how hardware does it, so the plan stays on the host and its three small index tensors are
//! uploaded (`(E + 1 + 2·T·K)·4` bytes).

use dsl_core::prelude::*;
use dsl_core::SimError;

/// Where every (token, choice) pair goes after sorting by expert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingPlan {
    /// `E + 1` entries: expert `e` owns dispatched rows `expert_offsets[e]..expert_offsets[e+1]`.
    pub expert_offsets: Vec<i32>,
    /// The token of each dispatched row (`T·K` rows), grouped by expert, tokens ascending.
    pub rows: Vec<i32>,
    /// `[T·K]`: the dispatched row of token `t`'s `j`-th choice, at `t·K + j`.
    pub slot_of: Vec<i32>,
}

fn plan_error(message: String) -> SimError {
    SimError::Launch {
        kernel: "moe_routing_plan".into(),
        message,
    }
}

impl RoutingPlan {
    /// Builds the plan from a router's `idx` (`[T, K]` row-major, values in `0..experts`) by a
    /// stable counting sort. Errors name the bad entry.
    pub fn from_topk(
        idx: &[i32],
        tokens: usize,
        top_k: usize,
        experts: usize,
    ) -> Result<RoutingPlan, SimError> {
        if tokens == 0 || top_k == 0 || experts == 0 {
            return Err(plan_error(format!(
                "tokens ({tokens}), top_k ({top_k}) and experts ({experts}) must be ≥ 1"
            )));
        }
        if idx.len() != tokens * top_k {
            return Err(plan_error(format!(
                "`idx` has {} entries, expected tokens · top_k = {tokens} · {top_k}",
                idx.len()
            )));
        }
        if tokens * top_k >= 1 << 24 {
            return Err(plan_error(format!(
                "{} dispatched rows exceed the 2^24 an index tensor holds exactly",
                tokens * top_k
            )));
        }
        let mut counts = vec![0i32; experts + 1];
        for (i, e) in idx.iter().enumerate() {
            if *e < 0 || *e as usize >= experts {
                return Err(plan_error(format!(
                    "`idx` of token {} choice {} is {e}, outside 0..{experts} (experts)",
                    i / top_k,
                    i % top_k
                )));
            }
            counts[*e as usize + 1] += 1;
        }
        for e in 0..experts {
            counts[e + 1] += counts[e];
        }
        let expert_offsets = counts;
        let mut next = expert_offsets.clone();
        let mut rows = vec![0i32; idx.len()];
        let mut slot_of = vec![0i32; idx.len()];
        // Pairs visited in token order, so each expert's rows come out with tokens ascending.
        for (i, e) in idx.iter().enumerate() {
            let slot = &mut next[*e as usize];
            rows[*slot as usize] = (i / top_k) as i32;
            slot_of[i] = *slot;
            *slot += 1;
        }
        Ok(RoutingPlan {
            expert_offsets,
            rows,
            slot_of,
        })
    }

    /// Experts in the plan.
    pub fn experts(&self) -> usize {
        self.expert_offsets.len().saturating_sub(1)
    }

    /// `expert_offsets` as the `[E + 1, 1]` index tensor [`super::grouped::grouped_linear()`] reads.
    pub fn offsets_tensor(&self) -> Result<Tensor<i32>, SimError> {
        Tensor::from_indices(&[self.expert_offsets.len(), 1], &self.expert_offsets)
            .map_err(plan_error)
    }

    /// `rows` as the `[T·K, 1]` index tensor [`moe_dispatch()`] reads.
    pub fn rows_tensor(&self) -> Result<Tensor<i32>, SimError> {
        Tensor::from_indices(&[self.rows.len(), 1], &self.rows).map_err(plan_error)
    }

    /// `slot_of` as the `[T, K]` index tensor [`moe_combine()`] reads.
    pub fn slot_of_tensor(&self, top_k: usize) -> Result<Tensor<i32>, SimError> {
        if top_k == 0 || !self.slot_of.len().is_multiple_of(top_k) {
            return Err(plan_error(format!(
                "top_k = {top_k} does not divide the plan's {} (token, choice) pairs",
                self.slot_of.len()
            )));
        }
        Tensor::from_indices(&[self.slot_of.len() / top_k, top_k], &self.slot_of)
            .map_err(plan_error)
    }
}

/// Gather: `xe[r] = x[rows[r]]` for `x [T, H]`, `rows [N]` (i32), `xe [N, H]`. One program per
/// `BR` dispatched rows × `BH` columns. A program reads its `BR` indices once, as a tile, and
/// requests its rows four at a time before storing them, so it waits for about `⌈BR / 4⌉` memory
/// latencies rather than two per row (a blocking index read, then the row).
#[kernel(
    grid = (cdiv(xe.rows(), BR), cdiv(xe.cols(), BH)),
    tunable(BR = [16, 1, 2, 4, 8, 32, 64], BH = [1024, 64, 128, 256, 512]),
    helpers(dispatch_row)
)]
pub fn moe_dispatch<T: Float>(x: &Tensor<T>, rows: &Tensor<i32>, xe: &Tensor<T>) {
    // `rows` is `[N, 1]` (run_moe_dispatch reshapes a vector).
    let (r0, c) = (program_id(0) * BR, program_id(1) * BH);
    let idx = load::<BR, 1>(rows, r0, 0);
    let end = usize::min(r0 + BR, xe.rows());
    for r in (r0..end).step_by(4) {
        let a = dispatch_row::<T, BR, BH>(x, &idx, r0, r, end, c);
        let b = dispatch_row::<T, BR, BH>(x, &idx, r0, r + 1, end, c);
        let d = dispatch_row::<T, BR, BH>(x, &idx, r0, r + 2, end, c);
        let e = dispatch_row::<T, BR, BH>(x, &idx, r0, r + 3, end, c);
        store(xe, r, c, &a);
        if r + 1 < end {
            store(xe, r + 1, c, &b);
        }
        if r + 2 < end {
            store(xe, r + 2, c, &d);
        }
        if r + 3 < end {
            store(xe, r + 3, c, &e);
        }
    }
}

/// Dispatched row `r` (entry `r − r0` of the program's index tile `idx`): its token's row of
/// columns `c..c + BH`, requested without waiting for it; past `end`, a zero tile and no request.
#[kernel(helper)]
pub fn dispatch_row<T: Float, const BR: usize, const BH: usize>(
    x: &Tensor<T>,
    idx: &Tile<i32, BR, 1>,
    r0: usize,
    r: usize,
    end: usize,
    c: usize,
) -> Tile<T, 1, BH> {
    if r < end {
        // A shape-only `rows` (no plan data: a standalone cost-only launch) reads tokens in order.
        let token = index_at(idx, r - r0, r % x.rows());
        load_async::<1, BH>(x, token, c)
    } else {
        zeros::<T, 1, BH>()
    }
}

/// Combine: `out[t] = base[t] + Σ_j weights[t, j] · ye[slot_of[t, j]]` for `ye [N, H]`,
/// `slot_of`/`weights [T, K]`, `base`/`out [T, H]` (`base`: the shared expert's output, or zeros).
/// Every token gathers its `K` rows in `j` order and sums in f32: deterministic, no scatter.
///
/// A program reads its tokens' slots once, as a `BR × KB` tile (`KB` covers `K` up to 64; later
/// choices read their slot one by one), and requests a token's rows four at a time before summing
/// them, so a token waits for about `⌈K / 4⌉` memory latencies rather than two per choice (a
/// blocking index read, then the row). A cost-only run reads the plan's slots when `slot_of`
/// holds them (the model always builds its plan with data; with replayed routing the replay test
/// checks the cycles equal the functional run's); a shape-only `slot_of` reads row `t·K + j` for
/// choice `j` of token `t`.
#[kernel(
    grid = (cdiv(out.rows(), BR), cdiv(out.cols(), BH)),
    tunable(
        BR = [16, 1, 2, 4, 8, 32, 64],
        BH = [1024, 64, 128, 256, 512],
        KB = [8, 16, 32, 64]
    ),
    helpers(combine_choice)
)]
pub fn moe_combine(
    ye: &Tensor<f32>,
    slot_of: &Tensor<i32>,
    weights: &Tensor<f32>,
    base: &Tensor<f32>,
    out: &Tensor<f32>,
) {
    let (r0, c) = (program_id(0) * BR, program_id(1) * BH);
    let k = weights.cols();
    let idx = load::<BR, KB>(slot_of, r0, 0);
    for t in r0..usize::min(r0 + BR, out.rows()) {
        let mut acc = load_async::<1, BH>(base, t, c);
        for j in (0..k).step_by(4) {
            let (y0, w0) =
                combine_choice::<BR, KB, BH>(ye, slot_of, weights, &idx, t - r0, t, j, c);
            let (y1, w1) =
                combine_choice::<BR, KB, BH>(ye, slot_of, weights, &idx, t - r0, t, j + 1, c);
            let (y2, w2) =
                combine_choice::<BR, KB, BH>(ye, slot_of, weights, &idx, t - r0, t, j + 2, c);
            let (y3, w3) =
                combine_choice::<BR, KB, BH>(ye, slot_of, weights, &idx, t - r0, t, j + 3, c);
            acc = add(&acc, &mul_col(&y0, &w0));
            if j + 1 < k {
                acc = add(&acc, &mul_col(&y1, &w1));
            }
            if j + 2 < k {
                acc = add(&acc, &mul_col(&y2, &w2));
            }
            if j + 3 < k {
                acc = add(&acc, &mul_col(&y3, &w3));
            }
        }
        store(out, t, c, &acc);
    }
}

/// Choice `j` of token `t` (row `i` of the program's slot tile `idx`): its expert-output row of
/// columns `c..c + BH` and its weight, requested without waiting for them; past the token's
/// choices, zero tiles and no request.
#[kernel(helper)]
#[allow(clippy::too_many_arguments)]
pub fn combine_choice<const BR: usize, const KB: usize, const BH: usize>(
    ye: &Tensor<f32>,
    slot_of: &Tensor<i32>,
    weights: &Tensor<f32>,
    idx: &Tile<i32, BR, KB>,
    i: usize,
    t: usize,
    j: usize,
    c: usize,
) -> (Tile<f32, 1, BH>, Tile<f32, 1, 1>) {
    let k = weights.cols();
    if j < k {
        // Past the tile, a slot read of its own (more than 64 choices per token).
        let slot = if j < KB {
            index_at(idx, i * KB + j, t * k + j)
        } else {
            load_index(slot_of, t * k + j, t * k + j)
        };
        (
            load_async::<1, BH>(ye, slot, c),
            load_async::<1, 1>(weights, t, j),
        )
    } else {
        (zeros::<f32, 1, BH>(), zeros::<f32, 1, 1>())
    }
}

/// Tiles for a row-gather launch over `rows × cols`: the widest column tile (fewer index reads per
/// row), and the largest row tile that still gives every core about four programs. A program's
/// rows wait on its index tile and go four at a time: small batches want more programs.
fn gather_config(launcher: &Launcher, rows: usize, cols: usize) -> Config {
    let col_tiles = cols.div_ceil(1024).max(1);
    let want = 4 * launcher.preset.cores as usize;
    let br = [16i64, 8, 4, 2, 1]
        .into_iter()
        .find(|br| rows.div_ceil(*br as usize) * col_tiles >= want)
        .unwrap_or(1);
    Config::new().with("BR", br).with("BH", 1024)
}

fn launch_error(kernel: &str, message: String) -> SimError {
    SimError::Launch {
        kernel: kernel.to_string(),
        message,
    }
}

/// Runs [`moe_dispatch()`] after checking shapes: `x [T, H]`, `rows [N]` or `[N, 1]`,
/// `xe [N, H]`, with tiles sized to the batch. Returns the launch report.
pub fn run_moe_dispatch<T: Float>(
    launcher: &Launcher,
    x: &Tensor<T>,
    rows: &Tensor<i32>,
    xe: &Tensor<T>,
) -> Result<dsl_core::Report, SimError> {
    let name = moe_dispatch::META.name;
    if x.shape().len() != 2 || x.rows() == 0 {
        return Err(launch_error(
            name,
            format!("`x` must be [T ≥ 1, H], got {x:?}"),
        ));
    }
    if xe.shape() != [rows.len(), x.cols()] {
        return Err(launch_error(
            name,
            format!(
                "`xe` must be [N, H] = [{}, {}] (one row per entry of `rows`), got {xe:?}",
                rows.len(),
                x.cols()
            ),
        ));
    }
    let config = gather_config(launcher, xe.rows(), xe.cols());
    let rows = rows
        .reshaped(&[rows.len(), 1])
        .map_err(|e| launch_error(name, e))?;
    Ok(moe_dispatch::launch(launcher, &config, x, &rows, xe)?.report)
}

/// Runs [`moe_combine()`] after checking shapes: `ye [N, H]`, `slot_of`/`weights [T, K]` with
/// `N = T·K`, `base`/`out [T, H]`, with tiles sized to the batch. Returns the launch report.
pub fn run_moe_combine(
    launcher: &Launcher,
    ye: &Tensor<f32>,
    slot_of: &Tensor<i32>,
    weights: &Tensor<f32>,
    base: &Tensor<f32>,
    out: &Tensor<f32>,
) -> Result<dsl_core::Report, SimError> {
    let name = moe_combine::META.name;
    let (t, k, h) = (weights.rows(), weights.cols(), ye.cols());
    if weights.shape() != [t, k] || t == 0 || k == 0 {
        return Err(launch_error(
            name,
            format!("`weights` must be [T, K] with T, K ≥ 1, got {weights:?}"),
        ));
    }
    if slot_of.shape() != [t, k] {
        return Err(launch_error(
            name,
            format!("`slot_of` must be [T, K] = [{t}, {k}] like `weights`, got {slot_of:?}"),
        ));
    }
    if ye.shape() != [t * k, h] {
        return Err(launch_error(
            name,
            format!("`ye` must be [T·K, H] = [{}, {h}], got {ye:?}", t * k),
        ));
    }
    for (what, tensor) in [("base", base), ("out", out)] {
        if tensor.shape() != [t, h] {
            return Err(launch_error(
                name,
                format!("`{what}` must be [T, H] = [{t}, {h}], got {tensor:?}"),
            ));
        }
    }
    let config = crate::tile_choice::covering_config(
        &moe_combine::META,
        gather_config(launcher, t, h),
        &[("KB", k, 64)],
    );
    Ok(moe_combine::launch(launcher, &config, ye, slot_of, weights, base, out)?.report)
}
