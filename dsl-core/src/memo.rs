//! The launch memo: a cost-only launch that cannot be told apart from one already simulated is not
//! simulated again.
//!
//! A model's layers launch the same kernels on the same shapes dozens of times per step (61 MoE
//! layers of Kimi-K2 differ only in which weights they read). A cost-only launch's report is a pure
//! function of the kernel, its tiles, its grid, the device and what the kernel can observe of its
//! arguments, so the memo keys on exactly those:
//! - each tensor's element type, shape and row stride;
//! - which arguments share memory, and where each view starts relative to the others of its
//!   memory (the cache model matches windows of the same tensor by position, so only relative
//!   offsets matter; a new launch's L2 starts empty);
//! - the values of the tensors that hold data (block tables, expert offsets: a cost-only launch
//!   reads them to decide what it loads);
//! - every scalar argument.
//!
//! Functional launches and launches that record a trace are never memoised.

use crate::elem::Elem;
use crate::launch::Config;
use crate::tensor::Tensor;
use accel_sim::{DevicePreset, Report, SimError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// A kernel argument as the launch memo sees it: [`LaunchArg::describe`] writes everything about it
/// that a cost-only launch can observe. `#[kernel]` calls it for every parameter.
pub trait LaunchArg {
    /// Appends what a cost-only launch can observe of this argument to `key`.
    fn describe(&self, key: &mut ArgKey);
}

impl<A: LaunchArg + ?Sized> LaunchArg for &A {
    fn describe(&self, key: &mut ArgKey) {
        (**self).describe(key)
    }
}

impl<A: LaunchArg + ?Sized> LaunchArg for &mut A {
    fn describe(&self, key: &mut ArgKey) {
        (**self).describe(key)
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $tag:expr, |$v:ident| $bits:expr;)*) => {$(
        impl LaunchArg for $t {
            fn describe(&self, key: &mut ArgKey) {
                let $v = *self;
                key.args += 1;
                key.words.push($tag);
                key.words.push($bits);
            }
        }
    )*};
}

scalar_arg! {
    usize => 1, |v| v as u64;
    u64 => 2, |v| v;
    u32 => 3, |v| v as u64;
    i64 => 4, |v| v as u64;
    i32 => 5, |v| v as i64 as u64;
    f32 => 6, |v| v.to_bits() as u64;
    f64 => 7, |v| v.to_bits();
    bool => 8, |v| v as u64;
}

impl<T: Elem> LaunchArg for Tensor<T> {
    fn describe(&self, key: &mut ArgKey) {
        key.words.push(16);
        key.words.push(T::DTYPE as u64);
        key.words.push(self.storage() as u64);
        key.words.push(self.shape().len() as u64);
        key.words.extend(self.shape().iter().map(|d| *d as u64));
        key.words.push(self.row_stride() as u64);
        key.tensor(self.id(), self.offset());
        key.args += 1;
        if let Some(names) = &mut key.views {
            // A hazard-checked functional launch wants only where the argument lies.
            let at = key.args - 1;
            names.push((
                at,
                self.id(),
                self.offset(),
                self.rows(),
                self.cols(),
                self.row_stride(),
            ));
            return;
        }
        if !self.has_data() {
            key.words.push(0);
            return;
        }
        let n = self.span();
        let value = |i: usize| self.span_get(i).unwrap_or(f32::NAN).to_bits();
        key.words.push(1);
        key.words.push(n as u64);
        if n <= INLINE_VALUES {
            key.words.extend((0..n).map(|i| value(i) as u64));
        } else {
            // A large tensor with data (a real weight in a cost-only run of a checkpoint)
            // is keyed by a 128-bit digest rather than copied into the memo.
            key.words
                .extend([digest(n, &value, 0), digest(n, &value, 1)]);
        }
    }
}

/// Tensors with at most this many values are keyed by their values, larger ones by a digest.
const INLINE_VALUES: usize = 4096;

/// A 64-bit digest of the `n` values' bits `value(i)` (SipHash with fixed keys, so the same on
/// every run), salted.
fn digest(n: usize, value: &dyn Fn(usize) -> u32, salt: u64) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    salt.hash(&mut h);
    for i in 0..n {
        value(i).hash(&mut h);
    }
    h.finish()
}

/// Where a tensor argument lies: (argument index, memory, offset, rows, columns, row pitch).
pub(crate) type ViewNote = (usize, u64, usize, usize, usize, usize);

/// The arguments of one launch, written by [`LaunchArg::describe`]: a flat list of words, with
/// tensor identities replaced by their aliasing class and offsets made relative to the class.
#[derive(Debug, Default)]
pub struct ArgKey {
    words: Vec<u64>,
    /// Distinct tensor memories seen so far, in order: the index is the aliasing class.
    memories: Vec<u64>,
    /// (word index of the offset, class, absolute offset), filled in by [`ArgKey::finish`].
    offsets: Vec<(usize, usize, usize)>,
    /// Arguments described so far (every top-level `describe` counts one).
    args: usize,
    /// When set, tensors only note where they lie (argument index, memory, offset, rows, columns,
    /// row pitch), for naming them in hazard messages; no words are written.
    views: Option<Vec<ViewNote>>,
}

impl ArgKey {
    /// A key that only collects where each tensor argument lies (see [`ArgKey::views`]).
    pub(crate) fn views_only() -> ArgKey {
        ArgKey {
            views: Some(Vec::new()),
            ..ArgKey::default()
        }
    }

    /// The tensor arguments noted by a [`ArgKey::views_only`] key: (argument index, memory,
    /// offset, rows, columns, row pitch).
    pub(crate) fn into_views(self) -> Vec<ViewNote> {
        self.views.unwrap_or_default()
    }

    fn tensor(&mut self, id: u64, offset: usize) {
        let class = match self.memories.iter().position(|m| *m == id) {
            Some(c) => c,
            None => {
                self.memories.push(id);
                self.memories.len() - 1
            }
        };
        self.words.push(class as u64);
        self.offsets.push((self.words.len(), class, offset));
        self.words.push(0);
    }

    /// The words, with each offset relative to the smallest offset of its aliasing class.
    fn finish(mut self) -> Vec<u64> {
        let mut base = vec![usize::MAX; self.memories.len()];
        for &(_, class, off) in &self.offsets {
            base[class] = base[class].min(off);
        }
        for &(at, class, off) in &self.offsets {
            self.words[at] = (off - base[class]) as u64;
        }
        self.words
    }
}

/// Everything a cost-only launch's report depends on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct MemoKey {
    kernel: &'static str,
    file: &'static str,
    config: Config,
    grid: [usize; 3],
    args: Vec<u64>,
}

/// Reports of cost-only launches already simulated on one device, shared by the clones of a
/// [`crate::Launcher`] made with [`crate::Launcher::with_memo`].
pub struct LaunchMemo {
    /// The device the reports were simulated on: a launcher on another preset bypasses the memo.
    preset: DevicePreset,
    reports: Mutex<HashMap<MemoKey, Result<Report, SimError>>>,
    hits: AtomicU64,
    misses: AtomicU64,
}

impl std::fmt::Debug for LaunchMemo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (hits, misses) = self.counts();
        write!(
            f,
            "LaunchMemo {{ device: {}, hits: {hits}, misses: {misses} }}",
            self.preset.name
        )
    }
}

impl LaunchMemo {
    /// An empty memo for launches on `preset`.
    pub fn new(preset: &DevicePreset) -> LaunchMemo {
        LaunchMemo {
            preset: preset.clone(),
            reports: Mutex::new(HashMap::new()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// (launches answered from the memo, launches simulated and remembered).
    pub fn counts(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Whether the memo's reports hold for launches on `preset`.
    pub(crate) fn serves(&self, preset: &DevicePreset) -> bool {
        self.preset == *preset
    }

    /// The remembered result of the launch `args` describes, or `run`'s, remembered. Only results
    /// that follow from the inputs are kept: a report, or a kernel's or the tile allocator's error
    /// (not a host failure such as a thread pool that would not start).
    pub(crate) fn get_or_run(
        &self,
        kernel: &'static str,
        file: &'static str,
        config: &Config,
        grid: [usize; 3],
        args: ArgKey,
        run: impl FnOnce() -> Result<Report, SimError>,
    ) -> Result<Report, SimError> {
        let key = MemoKey {
            kernel,
            file,
            config: config.clone(),
            grid,
            args: args.finish(),
        };
        if let Some(r) = self.lock().get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return r.clone();
        }
        let r = run();
        let keep = match &r {
            Ok(_) => true,
            Err(SimError::SramOverflow { .. } | SimError::Kernel { .. }) => true,
            Err(_) => false,
        };
        if keep {
            self.misses.fetch_add(1, Ordering::Relaxed);
            self.lock().insert(key, r.clone());
        }
        r
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<MemoKey, Result<Report, SimError>>> {
        // A poisoned lock only means another thread panicked mid-insert; the map is still valid.
        self.reports.lock().unwrap_or_else(|e| e.into_inner())
    }
}
