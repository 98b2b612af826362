//! The paged append kernel (`kernels::attention::kv_append`) driven by the model's page allocator
//! (`model::kv_cache::PagedKvCache`): two sequences interleave prefill and decode appends in one
//! shared pool, and every token's row must sit exactly where `PagedKvCache::locate` says, with
//! rows of the other sequence untouched. (An exact copy: any difference fails.)

use dsl_core::{Launcher, Tensor};
use kernels::attention::kv_append::run_kv_cache_append;
use kernels::testdata::Rng;
use model::kv_cache::{PagedKvCache, SeqId};

#[test]
fn appends_land_where_the_allocator_locates_them() {
    let (page_size, pages, width) = (4usize, 12usize, 37usize);
    let launcher = Launcher::for_device("npu-910b").unwrap();
    let mut cache = PagedKvCache::new(page_size, pages).unwrap();
    let pool = Tensor::<f32>::poisoned(&[pages * page_size, width]);
    let mut rng = Rng::new(17);
    // What each sequence's token t should hold, in order.
    let mut written: Vec<(SeqId, Vec<Vec<f32>>)> = vec![(SeqId(1), vec![]), (SeqId(2), vec![])];
    cache.allocate(SeqId(1), 0).unwrap();
    cache.allocate(SeqId(2), 0).unwrap();
    // Prefills of 7 and 5 tokens, then alternating decode steps and a second chunk.
    for (seq, n) in [(0, 7), (1, 5), (0, 1), (1, 1), (0, 6), (1, 1), (0, 1)] {
        let id = written[seq].0;
        let start = cache.len(id).unwrap();
        cache.append(id, n).unwrap();
        let rows: Vec<Vec<f32>> = (0..n).map(|_| rng.vec(width, 1.0)).collect();
        let flat: Vec<f32> = rows.concat();
        let new = Tensor::<f32>::from_f32(&[n, width], &flat).unwrap();
        let table = cache.block_table(id).unwrap().to_vec();
        run_kv_cache_append(&launcher, &new, &table, &pool, start, page_size).unwrap();
        written[seq].1.extend(rows);
    }
    let out = pool.to_vec().unwrap();
    let mut touched = vec![false; pages * page_size];
    for (id, rows) in &written {
        for (t, row) in rows.iter().enumerate() {
            let at = cache.locate(*id, t).unwrap().flat(page_size);
            assert_eq!(
                &out[at * width..(at + 1) * width],
                &row[..],
                "{id} token {t}"
            );
            touched[at] = true;
        }
    }
    // Every other row is still poisoned: nothing was written outside the tokens' slots.
    for (r, t) in touched.iter().enumerate() {
        if !t {
            assert!(
                out[r * width..(r + 1) * width].iter().all(|v| v.is_nan()),
                "row {r}"
            );
        }
    }
}
