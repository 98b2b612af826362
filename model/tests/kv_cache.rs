//! Paged KV cache: allocator properties, error values, geometry bytes.
//!
//! The property test drives the cache with random allocate/append/free sequences against a shadow
//! model (sequence → length) and checks after every step, through the public API only, that no page
//! is leaked or used twice, and that freeing everything returns the pool to full.

use model::kv_cache::{
    CachePart, KvCacheError, KvDtype, KvGeometry, LayerKvGeometry, PagedKvCache, SeqId, Slot,
};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Clone)]
enum Op {
    Allocate(u64, usize),
    Append(u64, usize),
    Truncate(u64, usize),
    Free(u64),
}

fn op() -> impl Strategy<Value = Op> {
    // Few ids, so operations often hit live sequences, duplicates and unknown ids alike.
    prop_oneof![
        (0u64..6, 0usize..40).prop_map(|(s, t)| Op::Allocate(s, t)),
        (0u64..6, 0usize..40).prop_map(|(s, t)| Op::Append(s, t)),
        (0u64..6, 0usize..40).prop_map(|(s, t)| Op::Truncate(s, t)),
        (0u64..6).prop_map(Op::Free),
    ]
}

/// Checks the cache against the shadow model through the public API.
fn check_state(cache: &PagedKvCache, shadow: &BTreeMap<u64, usize>) -> Result<(), TestCaseError> {
    let ps = cache.page_size();
    prop_assert_eq!(cache.audit(), Ok(()));
    prop_assert_eq!(cache.num_sequences(), shadow.len());
    let mut owned: BTreeSet<usize> = BTreeSet::new();
    let mut slots: BTreeSet<Slot> = BTreeSet::new();
    let mut expected_pages = 0usize;
    for (&id, &len) in shadow {
        let seq = SeqId(id);
        prop_assert_eq!(cache.len(seq), Ok(len));
        let table = cache.block_table(seq).unwrap();
        prop_assert_eq!(
            table.len(),
            len.div_ceil(ps),
            "{} pages for {} tokens",
            table.len(),
            len
        );
        expected_pages += len.div_ceil(ps);
        for &page in table {
            prop_assert!(
                page < cache.capacity_pages(),
                "page {page} outside the pool"
            );
            prop_assert!(owned.insert(page), "page {page} owned by two sequences");
            prop_assert_eq!(cache.page_owner(page), Some(seq));
        }
        for t in 0..len {
            let s = cache.locate(seq, t).unwrap();
            prop_assert!(s.slot < ps);
            prop_assert_eq!(s.page, table[t / ps]);
            prop_assert!(slots.insert(s), "slot {s:?} holds two tokens");
        }
        let past_end = matches!(
            cache.locate(seq, len),
            Err(KvCacheError::TokenOutOfRange { .. })
        );
        prop_assert!(
            past_end,
            "token {} of a {}-token sequence was located",
            len,
            len
        );
    }
    prop_assert_eq!(cache.pages_in_use(), expected_pages);
    prop_assert_eq!(cache.free_pages(), cache.capacity_pages() - expected_pages);
    prop_assert_eq!(cache.tokens_in_use(), shadow.values().sum::<usize>());
    for page in 0..cache.capacity_pages() {
        if !owned.contains(&page) {
            prop_assert_eq!(
                cache.page_owner(page),
                None,
                "free page {} has an owner",
                page
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn allocator_never_leaks_or_double_uses(
        page_size in 1usize..9,
        capacity in 0usize..24,
        ops in prop::collection::vec(op(), 0..60),
    ) {
        let mut cache = PagedKvCache::new(page_size, capacity).unwrap();
        let mut shadow: BTreeMap<u64, usize> = BTreeMap::new();
        for op in &ops {
            let free_before = cache.free_pages();
            match *op {
                Op::Allocate(id, tokens) => {
                    let r = cache.allocate(SeqId(id), tokens);
                    let live = shadow.contains_key(&id);
                    if live {
                        prop_assert_eq!(r, Err(KvCacheError::DuplicateSequence { seq: SeqId(id) }));
                    } else if tokens.div_ceil(page_size) > free_before {
                        prop_assert_eq!(r, Err(KvCacheError::OutOfPages {
                            seq: SeqId(id), tokens,
                            pages_needed: tokens.div_ceil(page_size), free_pages: free_before,
                        }));
                        prop_assert!(!cache.contains(SeqId(id)), "failed allocate left a sequence");
                    } else {
                        prop_assert_eq!(r, Ok(()));
                        shadow.insert(id, tokens);
                    }
                }
                Op::Append(id, tokens) => {
                    let r = cache.append(SeqId(id), tokens);
                    match shadow.get(&id).copied() {
                        None => prop_assert_eq!(r, Err(KvCacheError::UnknownSequence { seq: SeqId(id) })),
                        Some(len) => {
                            let need = (len + tokens).div_ceil(page_size) - len.div_ceil(page_size);
                            if need > free_before {
                                prop_assert_eq!(r, Err(KvCacheError::OutOfPages {
                                    seq: SeqId(id), tokens, pages_needed: need, free_pages: free_before,
                                }));
                            } else {
                                prop_assert_eq!(r, Ok(len + tokens));
                                shadow.insert(id, len + tokens);
                            }
                        }
                    }
                }
                Op::Truncate(id, tokens) => {
                    let r = cache.truncate(SeqId(id), tokens);
                    match shadow.get(&id).copied() {
                        None => prop_assert_eq!(r, Err(KvCacheError::UnknownSequence { seq: SeqId(id) })),
                        Some(len) if tokens > len => prop_assert_eq!(r, Err(KvCacheError::TokenOutOfRange {
                            seq: SeqId(id), token: tokens, len,
                        })),
                        Some(len) => {
                            prop_assert_eq!(r, Ok(len.div_ceil(page_size) - tokens.div_ceil(page_size)));
                            shadow.insert(id, tokens);
                        }
                    }
                }
                Op::Free(id) => {
                    let r = cache.free(SeqId(id));
                    match shadow.remove(&id) {
                        None => prop_assert_eq!(r, Err(KvCacheError::UnknownSequence { seq: SeqId(id) })),
                        Some(len) => prop_assert_eq!(r, Ok(len.div_ceil(page_size))),
                    }
                }
            }
            check_state(&cache, &shadow)?;
        }
        // Free everything: the pool is full again, and all of it can be handed out at once.
        let live: Vec<u64> = shadow.keys().copied().collect();
        for id in live {
            cache.free(SeqId(id)).unwrap();
        }
        shadow.clear();
        check_state(&cache, &shadow)?;
        prop_assert_eq!(cache.free_pages(), capacity);
        prop_assert_eq!(cache.pages_in_use(), 0);
        prop_assert!(cache.is_empty());
        cache.allocate(SeqId(99), capacity * page_size).unwrap();
        prop_assert_eq!(cache.free_pages(), 0);
        let table: BTreeSet<usize> = cache.block_table(SeqId(99)).unwrap().iter().copied().collect();
        prop_assert_eq!(table, (0..capacity).collect::<BTreeSet<usize>>());
    }
}

#[test]
fn fresh_pool_hands_out_pages_in_order_and_locates_tokens() {
    let mut c = PagedKvCache::new(4, 8).unwrap();
    c.allocate(SeqId(1), 5).unwrap();
    c.allocate(SeqId(2), 3).unwrap();
    assert_eq!(c.block_table(SeqId(1)).unwrap(), &[0, 1]);
    assert_eq!(c.block_table(SeqId(2)).unwrap(), &[2]);
    // Sequence 1's last page has 3 free slots: appending 3 needs no page, a 4th token does.
    assert_eq!(c.append(SeqId(1), 3), Ok(8));
    assert_eq!(c.pages_in_use(), 3);
    assert_eq!(c.append(SeqId(1), 1), Ok(9));
    assert_eq!(c.block_table(SeqId(1)).unwrap(), &[0, 1, 3]);
    assert_eq!(c.locate(SeqId(1), 8), Ok(Slot { page: 3, slot: 0 }));
    assert_eq!(c.locate(SeqId(1), 6), Ok(Slot { page: 1, slot: 2 }));
    assert_eq!(c.locate(SeqId(1), 6).unwrap().flat(4), 6);
    assert_eq!(c.locate(SeqId(2), 2).unwrap().flat(4), 10);
    // Freed pages are reused, the freed sequence's first page first.
    assert_eq!(c.free(SeqId(1)), Ok(3));
    c.allocate(SeqId(3), 9).unwrap();
    assert_eq!(c.block_table(SeqId(3)).unwrap(), &[0, 1, 3]);
    assert_eq!(c.audit(), Ok(()));
}

#[test]
fn out_of_pages_is_a_value_naming_sequence_tokens_and_free_pages() {
    let mut c = PagedKvCache::new(16, 4).unwrap();
    c.allocate(SeqId(7), 40).unwrap(); // 3 pages, 8 free slots in the last
    let err = c.append(SeqId(7), 30).unwrap_err(); // needs 70 tokens = 5 pages: 2 more, 1 free
    assert_eq!(
        err,
        KvCacheError::OutOfPages {
            seq: SeqId(7),
            tokens: 30,
            pages_needed: 2,
            free_pages: 1
        }
    );
    let msg = err.to_string();
    for needle in ["sequence 7", "30 more token", "2 new page", "only 1 page"] {
        assert!(msg.contains(needle), "`{msg}` lacks `{needle}`");
    }
    // All or nothing: the sequence is unchanged.
    assert_eq!(c.len(SeqId(7)), Ok(40));
    assert_eq!(c.block_table(SeqId(7)).unwrap().len(), 3);
    assert_eq!(c.free_pages(), 1);
    // An allocation that does not fit creates nothing.
    assert!(matches!(
        c.allocate(SeqId(8), 17),
        Err(KvCacheError::OutOfPages {
            pages_needed: 2,
            free_pages: 1,
            ..
        })
    ));
    assert!(!c.contains(SeqId(8)));
}

#[test]
fn misuse_is_reported_not_panicked() {
    assert_eq!(
        PagedKvCache::new(0, 4).unwrap_err(),
        KvCacheError::ZeroPageSize
    );
    let mut c = PagedKvCache::new(2, 2).unwrap();
    let unknown = KvCacheError::UnknownSequence { seq: SeqId(5) };
    assert_eq!(c.append(SeqId(5), 1), Err(unknown.clone()));
    assert_eq!(c.free(SeqId(5)), Err(unknown.clone()));
    assert_eq!(c.len(SeqId(5)), Err(unknown.clone()));
    assert_eq!(c.block_table(SeqId(5)).unwrap_err(), unknown.clone());
    assert_eq!(c.locate(SeqId(5), 0), Err(unknown));
    c.allocate(SeqId(1), 0).unwrap();
    assert_eq!(c.pages_in_use(), 0, "an empty sequence holds no page");
    assert_eq!(
        c.allocate(SeqId(1), 1),
        Err(KvCacheError::DuplicateSequence { seq: SeqId(1) })
    );
    assert_eq!(
        c.locate(SeqId(1), 0),
        Err(KvCacheError::TokenOutOfRange {
            seq: SeqId(1),
            token: 0,
            len: 0
        })
    );
    c.append(SeqId(1), 1).unwrap();
    assert!(matches!(
        c.append(SeqId(1), usize::MAX),
        Err(KvCacheError::Overflow { .. })
    ));
    assert_eq!(c.page_owner(1000), None);
    // Zero-capacity pools are legal and refuse every page.
    let mut z = PagedKvCache::new(8, 0).unwrap();
    z.allocate(SeqId(0), 0).unwrap();
    assert!(matches!(
        z.append(SeqId(0), 1),
        Err(KvCacheError::OutOfPages { free_pages: 0, .. })
    ));
}

#[test]
fn deepseek_geometry_bytes() {
    // DeepSeek-V3 MLA cache in bf16 (inference/model.py: kv_cache 512 + pe_cache 64 per token).
    let v3 = LayerKvGeometry::mla(512, 64, KvDtype::Bf16, KvDtype::Bf16).unwrap();
    assert_eq!(v3.bytes_per_token(), 1152);
    // V3.2 with FlashMLA's FP8 latent (512 B values + 4 f32 scales + 64 bf16 rope = 656 B) and the
    // indexer's FP8 key (128 B + one f32 scale = 132 B).
    let fp8 = KvDtype::Fp8 { scale_group: 128 };
    let v32 = LayerKvGeometry::mla(512, 64, fp8, KvDtype::Bf16)
        .unwrap()
        .with_indexer_keys(128, fp8)
        .unwrap();
    let names: Vec<&str> = v32.parts().iter().map(|p| p.name()).collect();
    assert_eq!(names, ["latent", "rope", "indexer_key"]);
    assert_eq!(
        v32.parts()[0].bytes_per_token() + v32.parts()[1].bytes_per_token(),
        656
    );
    assert_eq!(v32.parts()[2].bytes_per_token(), 132);
    assert_eq!(v32.bytes_per_token(), 788);
    let model = KvGeometry::uniform(v32, 61).unwrap();
    assert_eq!(model.bytes_per_token(), 61 * 788);
    assert_eq!(model.bytes_per_page(64).unwrap(), 61 * 788 * 64);
    // A 10 GiB budget holds this many 64-token pages.
    let budget = 10u64 << 30;
    assert_eq!(
        model.pages_fitting(budget, 64).unwrap(),
        budget / (61 * 788 * 64)
    );
    // GQA: 8 KV heads of 128 in bf16 = 2 · 8 · 128 · 2 bytes.
    let gqa = LayerKvGeometry::mha(8, 128, 128, KvDtype::Bf16).unwrap();
    assert_eq!(gqa.bytes_per_token(), 4096);
    // A scale group that does not divide the values still pays for the partial group.
    let odd = CachePart::new("x", 130, fp8).unwrap();
    assert_eq!(odd.bytes_per_token(), 130 + 2 * 4);
}

#[test]
fn geometry_errors_are_values() {
    assert!(matches!(
        CachePart::new("latent", 0, KvDtype::Bf16),
        Err(KvCacheError::InvalidGeometry { .. })
    ));
    let e = CachePart::new("latent", 512, KvDtype::Fp8 { scale_group: 0 }).unwrap_err();
    assert!(e.to_string().contains("scale group is 0"), "{e}");
    assert!(matches!(
        CachePart::new("huge", usize::MAX, KvDtype::F32),
        Err(KvCacheError::Overflow { .. })
    ));
    assert!(LayerKvGeometry::from_parts(vec![]).is_err());
    assert!(KvGeometry::from_layers(vec![]).is_err());
    let l = LayerKvGeometry::mha(1, 1, 1, KvDtype::F32).unwrap();
    let g = KvGeometry::uniform(l, 1).unwrap();
    assert_eq!(g.pages_fitting(1 << 20, 0), Err(KvCacheError::ZeroPageSize));
    assert!(matches!(
        g.bytes_per_page(usize::MAX),
        Err(KvCacheError::Overflow { .. })
    ));
}

#[test]
fn memory_report_counts_pool_pages_tokens_and_slack() {
    let layer = LayerKvGeometry::mla(512, 64, KvDtype::Bf16, KvDtype::Bf16).unwrap();
    let geom = KvGeometry::uniform(layer, 2).unwrap(); // 2304 B/token
    let mut c = PagedKvCache::new(16, 10).unwrap();
    c.allocate(SeqId(0), 20).unwrap(); // 2 pages, 12 slack slots
    c.allocate(SeqId(1), 16).unwrap(); // 1 page, full
    let r = c.memory_report(&geom).unwrap();
    assert_eq!(r.bytes_per_token, 2304);
    assert_eq!(r.bytes_per_page, 2304 * 16);
    assert_eq!(r.pool_bytes, 2304 * 16 * 10);
    assert_eq!(r.pages_in_use, 3);
    assert_eq!(r.used_bytes, 2304 * 16 * 3);
    assert_eq!(r.tokens, 36);
    assert_eq!(r.token_bytes, 2304 * 36);
    assert_eq!(r.slack_bytes, 2304 * 12);
    assert_eq!(r.sequences, 2);
    let text = r.to_string();
    assert!(text.contains("3 / 10 pages of 16 tokens"), "{text}");
}
