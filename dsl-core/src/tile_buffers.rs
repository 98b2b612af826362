//! Host buffers of functional tiles, recycled per thread.
//!
//! A functional tile holds its `R·C` values in a host `Vec<f32>`. A K-loop makes and drops the
//! same few tile shapes every step (two operand tiles per step of a GEMM), so a dropped tile's
//! buffer goes on a small per-thread free list and the next tile of that size takes it: no
//! allocation, and no fill of values the tile's producer overwrites anyway (a load that covers
//! the whole tile copies every element; a fill writes every element once).
//!
//! A recycled buffer's contents are unspecified (old values of another tile): every producer
//! writes all `R·C` elements. The results are therefore the same whichever buffer a tile gets,
//! and the same at any thread count.

use std::cell::RefCell;

/// Buffers kept per thread: a program rarely has more tiles alive at once than this; the rest
/// go back to the allocator.
const MAX_KEPT: usize = 32;

/// Elements kept per thread, all buffers together: 16 MiB of f32, so a thread that once made a
/// few large tiles does not pin their memory.
const MAX_KEPT_ELEMS: usize = 1 << 22;

/// A thread's kept buffers and their total capacity.
struct FreeList {
    bufs: Vec<Vec<f32>>,
    elems: usize,
}

thread_local! {
    static FREE: RefCell<FreeList> = const {
        RefCell::new(FreeList {
            bufs: Vec::new(),
            elems: 0,
        })
    };
}

/// A buffer of exactly `len` elements whose contents are unspecified (the caller writes every
/// element): a recycled one when this thread has one large enough, else a new zeroed one.
pub(crate) fn take(len: usize) -> Vec<f32> {
    let found = FREE.with(|free| {
        let mut free = free.borrow_mut();
        // The smallest that fits (the most recent of equals: a K-loop drops and remakes the
        // same sizes), so a small tile does not take the buffer a large one needs next.
        let i = (0..free.bufs.len())
            .rev()
            .filter(|&i| free.bufs[i].capacity() >= len)
            .min_by_key(|&i| free.bufs[i].capacity())?;
        let v = free.bufs.swap_remove(i);
        free.elems -= v.capacity();
        Some(v)
    });
    match found {
        Some(mut v) => {
            if v.len() >= len {
                v.truncate(len);
            } else {
                v.resize(len, 0.0);
            }
            v
        }
        None => vec![0.0; len],
    }
}

/// Gives a dropped tile's buffer back to this thread's free list (or to the allocator when the
/// list is full).
pub(crate) fn give(v: Vec<f32>) {
    if v.capacity() == 0 {
        return;
    }
    // `try_with`: a tile dropped while the thread's locals are being destroyed just frees.
    let _ = FREE.try_with(|free| {
        if let Ok(mut free) = free.try_borrow_mut() {
            if free.bufs.len() < MAX_KEPT && free.elems + v.capacity() <= MAX_KEPT_ELEMS {
                free.elems += v.capacity();
                free.bufs.push(v);
            }
        }
    });
}

/// A buffer of `len` copies of `value` (a recycled one when there is one).
pub(crate) fn filled(len: usize, value: f32) -> Vec<f32> {
    let mut v = take(len);
    v.fill(value);
    v
}

/// A copy of `src` in a recycled buffer (when there is one).
pub(crate) fn copied(src: &[f32]) -> Vec<f32> {
    let mut v = take(src.len());
    v.copy_from_slice(src);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recycled_buffer_has_the_asked_length_and_is_reused() {
        let mut v = take(300);
        assert_eq!(v.len(), 300);
        v.fill(7.0);
        let p = v.as_ptr();
        give(v);
        let w = take(200);
        assert_eq!(
            (w.len(), w.as_ptr()),
            (200, p),
            "the same allocation, shortened"
        );
        give(w);
        let x = filled(300, -1.5);
        assert!(x.len() == 300 && x.iter().all(|e| *e == -1.5));
        // Larger than anything kept: a new buffer.
        let y = take(1000);
        assert_eq!(y.len(), 1000);
        // Beyond the budget: not kept.
        give(vec![1.0; MAX_KEPT_ELEMS + 1]);
        assert!(FREE.with(|f| f.borrow().elems) <= MAX_KEPT_ELEMS);
    }
}
