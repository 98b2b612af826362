//! Float64 semantics of the vision operators (see the module docs of [`super`]).

/// `out` with `src`'s rows written (or, with `accumulate`, added) at `positions`: `out [T, h]`,
/// `src [N, h]`, one distinct position per source row.
pub fn scatter_rows(
    src: &[f32],
    positions: &[i32],
    out: &[f32],
    h: usize,
    accumulate: bool,
) -> Vec<f64> {
    let mut y: Vec<f64> = out.iter().map(|v| *v as f64).collect();
    for (row, p) in src.chunks_exact(h.max(1)).zip(positions) {
        let dst = &mut y[*p as usize * h..][..h];
        for (d, s) in dst.iter_mut().zip(row) {
            *d = if accumulate {
                *d + *s as f64
            } else {
                *s as f64
            };
        }
    }
    y
}

/// `out[t, :] = Σ_j weights[t·4 + j] · table[idx[t·4 + j], :]` (four taps per row), `table [·, h]`.
pub fn pos_embed_bilinear(table: &[f32], idx: &[i32], weights: &[f32], h: usize) -> Vec<f64> {
    idx.chunks_exact(super::pos_embed::TAPS)
        .zip(weights.chunks_exact(super::pos_embed::TAPS))
        .flat_map(|(ix, ws)| {
            (0..h).map(move |c| {
                ix.iter()
                    .zip(ws)
                    .map(|(i, w)| *w as f64 * table[*i as usize * h + c] as f64)
                    .sum::<f64>()
            })
        })
        .collect()
}
