//! DeepSeek-V3.2 indexed sparse attention (DSA) for decode: the lightning indexer scores every
//! past token, a top-k kernel selects `index_topk` of them, and MLA's absorbed attention runs over
//! the selected latent rows only (MQA, gathered from the paged cache).
//!
//! Layouts (one sequence, the newest token):
//! - indexer: `q_idx [HI, DI]`, `w [HI, 1]` (f32, `index_n_heads^-1/2` folded in), key cache
//!   `k_idx_pool [pages, P, DI]`;
//! - latent cache `kv_pool [pages, P, D]` (`D = kv_lora + rope`), values = its first `DV` columns;
//!   `q [H, D]` (absorbed queries);
//! - `block_table [n]` (i32) shared by both caches (the indexer key cache is part of the paged cache).

use super::reference::{indexer_scores, mqa_sparse, select_topk, IndexerShape, MqaShape};
use dsl_core::prelude::*;
use dsl_core::SimError;

/// Lightning indexer, one program per page: `I(s) = Σ_j w_j · ReLU(scale · q_j·k_s)`, `−∞` past
/// the context; scores written in logical token order to `scores [1, n·P]`.
#[kernel(grid = (cdiv(ctx_len, P),), tunable(HI = [64, 16, 32, 128], DI = [128, 64], P = [64, 16, 128]))]
pub fn indexer_decode<T: Float>(
    q_idx: &Tensor<T>,
    w: &Tensor<f32>,
    k_idx_pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    scores: &Tensor<f32>,
    ctx_len: usize,
    idx_scale: f32,
) {
    let p = program_id(0);
    let page = load_index(block_table, p, p);
    let tq = load_async::<HI, DI>(q_idx, 0, 0);
    let tw = load_async::<HI, 1>(w, 0, 0);
    let tk = load_async::<P, DI>(&k_idx_pool.at(page), 0, 0);
    let mut s = zeros::<f32, HI, P>();
    mma_bt(&mut s, &tq, &tk);
    let act = relu(&scale(&s, idx_scale));
    let mut score = zeros::<f32, 1, P>();
    mma_at(&mut score, &tw, &act);
    store(
        scores,
        0,
        p * P,
        &mask_keys(&score, 0, p * P, ctx_len, false),
    );
}

/// Top-`K` selection over `scores [1, L]`, best first, deterministic ties (see
/// `dsl_core::intrinsics::topk_update`); writes the token indices to `selected [1, K]`.
#[kernel(grid = (1,), tunable(K = [2048, 16, 64, 256, 512, 1024], C = [1024, 256]))]
pub fn topk_select(scores: &Tensor<f32>, selected: &Tensor<i32>) {
    let mut best = full::<f32, 1, K>(f32::NEG_INFINITY);
    let mut best_idx = full::<i32, 1, K>(-1.0);
    for c0 in (0..scores.cols()).step_by(C) {
        let cand = load_async_or::<1, C>(scores, 0, c0, f32::NEG_INFINITY);
        topk_update(&mut best, &mut best_idx, &cand, c0);
    }
    store(selected, 0, 0, &best_idx);
}

/// Sparse MLA decode: MQA over the `count` selected latent rows, `BK` gathered rows at a time.
#[kernel(grid = (cdiv(q.rows(), BH),), tunable(BH = [64, 16, 128], BK = [64, 32], D = [576, 128], DV = [512, 128]))]
pub fn sparse_mla_decode<T: Float>(
    q: &Tensor<T>,
    kv_pool: &Tensor<T>,
    block_table: &Tensor<i32>,
    selected: &Tensor<i32>,
    o: &Tensor<T>,
    count: usize,
    sm_scale: f32,
) {
    let r = program_id(0) * BH;
    let tq = load::<BH, D>(q, r, 0);
    let mut m = full::<f32, BH, 1>(f32::NEG_INFINITY);
    let mut l = zeros::<f32, BH, 1>();
    let mut acc = zeros::<f32, BH, DV>();
    for i0 in (0..count).step_by(BK) {
        let tk = gather_rows::<BK, D>(kv_pool, block_table, selected, i0, count, 0);
        let tv = gather_rows::<BK, DV>(kv_pool, block_table, selected, i0, count, 0);
        let mut s = zeros::<f32, BH, BK>();
        mma_bt(&mut s, &tq, &tk);
        let s = mask_keys(&scale(&s, sm_scale), 0, i0, count, false);
        let m_new = maximum(&m, &row_max(&s));
        let pr = exp(&sub_col(&s, &m_new));
        let alpha = exp(&sub(&m, &m_new));
        l = add(&mul(&l, &alpha), &row_sum(&pr));
        acc = mul_col(&acc, &alpha);
        mma(&mut acc, &cast::<T>(&pr), &tv);
        m = m_new;
    }
    store(o, r, 0, &cast::<T>(&div_col(&acc, &l)));
}

/// One DSA decode problem.
#[derive(Debug, Clone)]
pub struct DsaDecodeCase {
    /// Attention heads.
    pub heads: usize,
    /// Context length (the newest token included).
    pub ctx: usize,
    /// `index_topk`.
    pub topk: usize,
    /// Index heads.
    pub index_heads: usize,
    /// Index head dimension.
    pub index_dim: usize,
    /// Latent row: `kv_lora + rope`.
    pub head_dim: usize,
    /// `kv_lora` (values are the first `kv_lora` latent values).
    pub v_head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Seed.
    pub seed: u64,
}

/// The three launches of a DSA decode step, their reports, and the checks made in functional runs.
#[derive(Debug)]
pub struct DsaDecodeRun {
    /// Indexer (grows with the context).
    pub indexer: dsl_core::Report,
    /// Top-k selection (grows with the context).
    pub topk: dsl_core::Report,
    /// Sparse attention (grows with `index_topk`).
    pub attention: dsl_core::Report,
    /// All three chained.
    pub total: dsl_core::Report,
    /// Indexer scores vs the f64 reference (functional runs).
    pub indexer_error: Option<f64>,
    /// Whether the kernel's selection equals the reference top-k of the kernel's own scores.
    pub selection_matches: Option<bool>,
    /// Sparse attention vs the f64 reference over the kernel's selection.
    pub attention_error: Option<f64>,
}

fn tune_value(meta: &dsl_core::KernelMeta, name: &str, want: usize) -> Result<i64, SimError> {
    meta.smallest_fitting(name, want, name)
}

fn exact(meta: &dsl_core::KernelMeta, name: &str, want: usize) -> Result<i64, SimError> {
    let v = tune_value(meta, name, want)?;
    if v as usize != want {
        return Err(SimError::Launch {
            kernel: meta.name.into(),
            message: format!("{name} = {want} is not one of the kernel's sizes"),
        });
    }
    Ok(v)
}

/// Runs a DSA decode step (f32) on random data with a scrambled block table.
pub fn run_dsa_decode(launcher: &Launcher, case: &DsaDecodeCase) -> Result<DsaDecodeRun, SimError> {
    let fail = |message: String| SimError::Launch {
        kernel: "dsa_decode".into(),
        message,
    };
    if case.ctx == 0 || case.topk == 0 || case.heads == 0 || case.page_size == 0 {
        return Err(fail(format!("empty problem: {case:?}")));
    }
    let icfg = Config::new()
        .with(
            "HI",
            tune_value(&indexer_decode::META, "HI", case.index_heads)?,
        )
        .with("DI", exact(&indexer_decode::META, "DI", case.index_dim)?)
        .with("P", exact(&indexer_decode::META, "P", case.page_size)?);
    let kcfg = Config::new().with("K", tune_value(&topk_select::META, "K", case.topk)?);
    let acfg = Config::new()
        // Wide latent rows (576 f32 values) leave SRAM for 16 query rows at a time.
        .with(
            "BH",
            tune_value(
                &sparse_mla_decode::META,
                "BH",
                case.heads.min(if case.head_dim > 256 { 16 } else { 64 }),
            )?,
        )
        .with("D", exact(&sparse_mla_decode::META, "D", case.head_dim)?)
        .with(
            "DV",
            exact(&sparse_mla_decode::META, "DV", case.v_head_dim)?,
        );
    let n_pages = case.ctx.div_ceil(case.page_size);
    let pool_pages = n_pages + 2;
    let mut rng = crate::testdata::Rng::new(case.seed);
    let mut table: Vec<usize> = (0..pool_pages).collect();
    for i in (1..table.len()).rev() {
        table.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    table.truncate(n_pages);
    let functional = launcher.backend == Backend::Functional;
    let mut t = crate::testdata::CaseTensors::new(launcher, case.seed ^ 0xd5a, "dsa_decode");
    let q_idx = t.input::<f32>(&[case.index_heads, case.index_dim], 0.0, 1.0)?;
    let w = t.input::<f32>(
        &[case.index_heads, 1],
        0.0,
        1.0 / (case.index_heads as f32).sqrt(),
    )?;
    let k_idx_pool = t.input::<f32>(&[pool_pages, case.page_size, case.index_dim], 0.0, 1.0)?;
    let q = t.input::<f32>(&[case.heads, case.head_dim], 0.0, 1.0)?;
    let kv_pool = t.input::<f32>(&[pool_pages, case.page_size, case.head_dim], 0.0, 1.0)?;
    let idx: Vec<i32> = table.iter().map(|p| *p as i32).collect();
    let block_table = if functional {
        Tensor::from_indices(&[n_pages], &idx).map_err(fail)?
    } else {
        Tensor::shape_only(&[n_pages])
    };
    let scores = t.output::<f32>(&[1, n_pages * case.page_size]);
    let k_sel = kcfg.get("K").unwrap_or(0) as usize;
    let selected = t.output::<i32>(&[1, k_sel]);
    let o = t.output::<f32>(&[case.heads, case.v_head_dim]);
    let idx_scale = 1.0 / (case.index_dim as f32).sqrt();
    let sm_scale = 1.0 / (case.head_dim as f32).sqrt();
    let count = case.topk.min(case.ctx);
    let indexer = indexer_decode::launch(
        launcher,
        &icfg,
        &q_idx,
        &w,
        &k_idx_pool,
        &block_table,
        &scores,
        case.ctx,
        idx_scale,
    )?
    .report;
    let topk = topk_select::launch(launcher, &kcfg, &scores, &selected)?.report;
    let attention = sparse_mla_decode::launch(
        launcher,
        &acfg,
        &q,
        &kv_pool,
        &block_table,
        &selected,
        &o,
        count,
        sm_scale,
    )?
    .report;
    let total = dsl_core::Report::chain(
        "dsa_decode",
        &[indexer.clone(), topk.clone(), attention.clone()],
    )
    .expect("three launches");
    let mut run = DsaDecodeRun {
        indexer,
        topk,
        attention,
        total,
        indexer_error: None,
        selection_matches: None,
        attention_error: None,
    };
    if let (Some(sc), Some(sel), Some(out), Some(qi), Some(wv), Some(kp), Some(qv), Some(kvp)) = (
        scores.to_vec(),
        selected.to_vec(),
        o.to_vec(),
        q_idx.to_vec(),
        w.to_vec(),
        k_idx_pool.to_vec(),
        q.to_vec(),
        kv_pool.to_vec(),
    ) {
        let err = |e: super::reference::AttnRefError| fail(e.to_string());
        let k_rows =
            super::reference::gather_pages(&kp, case.index_dim, case.page_size, &table, case.ctx)
                .map_err(err)?;
        let ishape = IndexerShape {
            sq: 1,
            skv: case.ctx,
            index_heads: case.index_heads,
            index_head_dim: case.index_dim,
        };
        let want = indexer_scores(&qi, &k_rows, &wv, ishape, idx_scale as f64).map_err(err)?;
        run.indexer_error = Some(crate::reference::rel_error(&sc[..case.ctx], &want));
        let own: Vec<f64> = sc[..case.ctx].iter().map(|v| *v as f64).collect();
        let want_sel = select_topk(&own, 1, case.ctx, case.topk).map_err(err)?;
        let got: Vec<usize> = sel[..count].iter().map(|v| *v as usize).collect();
        run.selection_matches = Some(got == want_sel[0]);
        let rows =
            super::reference::gather_pages(&kvp, case.head_dim, case.page_size, &table, case.ctx)
                .map_err(err)?;
        let ms = MqaShape {
            sq: 1,
            skv: case.ctx,
            heads: case.heads,
            dk: case.head_dim,
            dv: case.v_head_dim,
        };
        let want_o = mqa_sparse(&qv, &rows, &[got], ms, sm_scale as f64).map_err(err)?;
        run.attention_error = Some(crate::reference::rel_error(&out, &want_o));
        run.total.max_rel_error = run
            .indexer_error
            .zip(run.attention_error)
            .map(|(a, b)| a.max(b));
    }
    Ok(run)
}
