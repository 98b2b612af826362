//! Linear-attention state slots: bookkeeping (allocate, release, reuse, errors leave the pool
//! unchanged), prefill of N tokens then M decode steps == one pass over N + M tokens (DSL kernels,
//! state carried in the slot, checked against a second slot and against the f64 references), and
//! the memory report: the state is constant in the context length while the KV cache grows.

use dsl_core::prelude::*;
use kernels::linear_attention::reference::{
    recurrent_gated_delta, short_conv, widen, Decay, DeltaInputs, DeltaShape,
};
use kernels::reference::rel_error;
use kernels::testdata::Rng;
use model::kv_cache::{KvDtype, KvGeometry, LayerKvGeometry, SeqId};
use model::state_slots::*;

fn launcher() -> Launcher {
    Launcher::for_device("npu-910b").unwrap()
}

fn gdn() -> LinearLayerGeometry {
    LinearLayerGeometry {
        decay: Decay::Scalar,
        k_heads: 1,
        v_heads: 2,
        dk: 32,
        dv: 16,
        conv_kernel: CONV_KERNEL,
    }
}

fn kda() -> LinearLayerGeometry {
    LinearLayerGeometry {
        decay: Decay::PerChannel,
        k_heads: 2,
        v_heads: 2,
        dk: 16,
        dv: 16,
        conv_kernel: CONV_KERNEL,
    }
}

/// One sequence's inputs to one layer, `total` tokens.
struct SeqInputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    w: [Vec<f32>; 3],
}

impl SeqInputs {
    fn new(geo: &LinearLayerGeometry, total: usize, seed: u64) -> SeqInputs {
        let mut rng = Rng::new(seed);
        let [cq, ck, cv] = geo.conv_channels();
        let gw = if geo.decay == Decay::Scalar {
            1
        } else {
            geo.dk
        };
        SeqInputs {
            q: rng.vec(total * cq, 1.0),
            k: rng.vec(total * ck, 1.0),
            v: rng.vec(total * cv, 1.0),
            g: rng
                .vec(total * geo.v_heads * gw, 0.15)
                .iter()
                .map(|x| x - 0.15)
                .collect(),
            beta: rng
                .vec(total * geo.v_heads, 0.5)
                .iter()
                .map(|x| x + 0.5)
                .collect(),
            w: [
                rng.vec(4 * cq, 0.5),
                rng.vec(4 * ck, 0.5),
                rng.vec(4 * cv, 0.5),
            ],
        }
    }

    /// Runs tokens `a..b` of this sequence through `layer` of `slots` for `seq`; returns `o`.
    fn step(&self, slots: &StateSlots, seq: SeqId, layer: usize, a: usize, b: usize) -> Vec<f32> {
        let geo = slots.geometry()[layer];
        let [cq, ck, cv] = geo.conv_channels();
        let gw = self.g.len() / (self.beta.len() / geo.v_heads);
        let t =
            |x: &[f32], w: usize| Tensor::<f32>::from_f32(&[b - a, w], &x[a * w..b * w]).unwrap();
        let w = |i: usize, c: usize| Tensor::<f32>::from_f32(&[4, c], &self.w[i]).unwrap();
        let (wq, wk, wv) = (w(0, cq), w(1, ck), w(2, cv));
        let (q, k, v) = (t(&self.q, cq), t(&self.k, ck), t(&self.v, cv));
        let (g, beta) = (t(&self.g, gw), t(&self.beta, geo.v_heads));
        let o = Tensor::<f32>::poisoned(&[b - a, geo.v_heads * geo.dv]);
        let x = StepInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            conv_weights: [&wq, &wk, &wv],
            o: &o,
        };
        let reports = slots
            .layer_step(&launcher(), seq, layer, &Config::new().with("C", 16), &x)
            .unwrap();
        assert_eq!(reports.len(), 4);
        o.to_vec().unwrap()
    }

    /// The f64 references over tokens `0..total` from a zero state: conv of q, k, v, then the
    /// recurrence. Returns `(o, final delta state)`.
    fn reference(&self, geo: &LinearLayerGeometry, total: usize) -> (Vec<f64>, Vec<f64>) {
        let [cq, ck, cv] = geo.conv_channels();
        let conv = |x: &[f32], w: &[f32], c: usize| {
            // The reference takes the checkpoint's [channels, 4] weight.
            let wt = kernels::reference::transpose(w, 4, c);
            short_conv(&widen(&x[..total * c]), &widen(&wt), &vec![0.0; 3 * c], c)
                .unwrap()
                .0
        };
        let (q, k, v) = (
            conv(&self.q, &self.w[0], cq),
            conv(&self.k, &self.w[1], ck),
            conv(&self.v, &self.w[2], cv),
        );
        let gw = self.g.len() / (self.beta.len() / geo.v_heads);
        let (g, beta) = (
            widen(&self.g[..total * gw]),
            widen(&self.beta[..total * geo.v_heads]),
        );
        let s = DeltaShape {
            seq: total,
            k_heads: geo.k_heads,
            v_heads: geo.v_heads,
            dk: geo.dk,
            dv: geo.dv,
            decay: geo.decay,
            qk_l2norm: true,
        };
        let out = recurrent_gated_delta(
            &s,
            &DeltaInputs {
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
                state: None,
            },
        )
        .unwrap();
        (out.o, out.state)
    }
}

#[test]
fn prefill_then_decode_continues_as_one_pass() {
    let geo = [gdn(), kda()];
    let mut slots = StateSlots::new(&launcher(), &geo, 3).unwrap();
    let l = launcher();
    let (a, b, c) = (SeqId(1), SeqId(2), SeqId(3));
    for s in [a, b, c] {
        slots.allocate(&l, s).unwrap();
    }
    for (n, m) in [(37usize, 6usize), (48, 3)] {
        for (layer, g) in geo.iter().enumerate() {
            let x = SeqInputs::new(g, n + m, (n * 10 + layer) as u64);
            // Sequence `a`: prefill N (chunked; N not a multiple of C = 16 in the first round),
            // then M decode steps, with an unrelated sequence `c` using its own slot in between.
            let mut split = x.step(&slots, a, layer, 0, n);
            let noise = SeqInputs::new(g, 5, 999);
            for t in n..n + m {
                noise.step(&slots, c, layer, t % 5, t % 5 + 1);
                split.extend(x.step(&slots, a, layer, t, t + 1));
            }
            // Sequence `b`: one pass over the N + M tokens.
            let whole = x.step(&slots, b, layer, 0, n + m);
            let (want_o, want_s) = x.reference(g, n + m);
            let split_s = slots
                .layer_state(a, layer)
                .unwrap()
                .recurrent
                .to_vec()
                .unwrap();
            let whole_s = slots
                .layer_state(b, layer)
                .unwrap()
                .recurrent
                .to_vec()
                .unwrap();
            let e_split = rel_error(&split, &want_o).max(rel_error(&split_s, &want_s));
            let e_whole = rel_error(&whole, &want_o).max(rel_error(&whole_s, &want_s));
            let e_pair = rel_error(&split, &widen(&whole));
            assert!(
                e_split <= 1e-5 && e_whole <= 1e-5 && e_pair <= 1e-5,
                "{g:?} N {n} M {m}: split {e_split}, whole {e_whole}, split vs whole {e_pair}"
            );
            // The conv histories agree too: both hold the last 3 inputs.
            let (ca, cb) = (
                slots.layer_state(a, layer).unwrap(),
                slots.layer_state(b, layer).unwrap(),
            );
            for i in 0..3 {
                assert_eq!(ca.conv[i].to_vec(), cb.conv[i].to_vec());
            }
        }
        // Start the next round from fresh state: release and re-allocate (zeroed on the device).
        for s in [a, b] {
            slots.release(s).unwrap();
            slots.allocate(&l, s).unwrap();
        }
        for layer in 0..2 {
            let st = slots.layer_state(a, layer).unwrap();
            assert!(st.recurrent.to_vec().unwrap().iter().all(|v| *v == 0.0));
            assert!(st
                .conv
                .iter()
                .all(|c| c.to_vec().unwrap().iter().all(|v| *v == 0.0)));
        }
    }
    slots.audit().unwrap();
}

#[test]
fn allocation_bookkeeping_and_errors() {
    let l = launcher();
    let mut slots = StateSlots::new(&l, &[gdn()], 2).unwrap();
    assert_eq!(
        (slots.capacity(), slots.free_slots(), slots.slots_in_use()),
        (2, 2, 0)
    );
    let reports = slots.allocate(&l, SeqId(7)).unwrap();
    assert_eq!(
        reports.len(),
        2,
        "one memset per state tensor: recurrent + the q|k|v conv history"
    );
    assert_eq!(slots.slot(SeqId(7)).unwrap(), 0);
    assert_eq!(
        slots.allocate(&l, SeqId(7)),
        Err(StateSlotError::DuplicateSequence { seq: SeqId(7) })
    );
    slots.allocate(&l, SeqId(8)).unwrap();
    let err = slots.allocate(&l, SeqId(9)).unwrap_err();
    assert_eq!(
        err,
        StateSlotError::OutOfSlots {
            seq: SeqId(9),
            capacity: 2
        }
    );
    assert!(err.to_string().contains("all 2 are in use"));
    assert_eq!((slots.free_slots(), slots.slots_in_use()), (0, 2));
    slots.release(SeqId(7)).unwrap();
    assert_eq!(
        slots.release(SeqId(7)),
        Err(StateSlotError::UnknownSequence { seq: SeqId(7) })
    );
    slots.allocate(&l, SeqId(9)).unwrap();
    assert_eq!(
        slots.slot(SeqId(9)).unwrap(),
        0,
        "the released slot is reused"
    );
    assert!(matches!(
        slots.layer_state(SeqId(9), 1),
        Err(StateSlotError::LayerOutOfRange {
            layer: 1,
            layers: 1
        })
    ));
    assert!(slots.layer_state(SeqId(7), 0).is_err());
    slots.audit().unwrap();
    // A bad geometry is an error, not a panic.
    let bad = LinearLayerGeometry {
        v_heads: 3,
        k_heads: 2,
        ..gdn()
    };
    assert!(StateSlots::new(&l, &[bad], 1).is_err());
    // A step with mis-shaped inputs is an error too.
    let q = Tensor::<f32>::from_f32(&[2, 5], &[0.0; 10]).unwrap();
    let x = StepInputs {
        q: &q,
        k: &q,
        v: &q,
        g: &q,
        beta: &q,
        conv_weights: [&q, &q, &q],
        o: &q,
    };
    let e = slots
        .layer_step(&l, SeqId(9), 0, &Config::new(), &x)
        .unwrap_err();
    assert!(e.to_string().contains("`q`"), "{e}");
}

#[test]
fn cost_only_slots_and_steps() {
    // Qwen3-Next-sized GDN layer (16 key heads, 32 value heads, dims 128), cost-only: no memory is
    // materialised, the step still costs cycles.
    let l = launcher().with_backend(Backend::CostOnly);
    let geo = LinearLayerGeometry {
        decay: Decay::Scalar,
        k_heads: 16,
        v_heads: 32,
        dk: 128,
        dv: 128,
        conv_kernel: CONV_KERNEL,
    };
    let mut slots = StateSlots::new(&l, &[geo], 64).unwrap();
    slots.allocate(&l, SeqId(1)).unwrap();
    let [cq, ck, cv] = geo.conv_channels();
    for tokens in [1usize, 256] {
        let t = |c: usize| Tensor::<f32>::shape_only(&[tokens, c]);
        let w = |c: usize| Tensor::<f32>::shape_only(&[4, c]);
        let (q, k, v, g, beta, o) = (t(cq), t(ck), t(cv), t(32), t(32), t(32 * 128));
        let (wq, wk, wv) = (w(cq), w(ck), w(cv));
        let x = StepInputs {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            beta: &beta,
            conv_weights: [&wq, &wk, &wv],
            o: &o,
        };
        let reports = slots
            .layer_step(&l, SeqId(1), 0, &Config::new().with("C", 64), &x)
            .unwrap();
        assert!(reports.iter().all(|r| r.cycles > 0));
        let kernel = &reports[3].kernel;
        assert_eq!(
            kernel,
            if tokens == 1 {
                "recurrent_delta"
            } else {
                "chunked_delta"
            }
        );
    }
}

#[test]
fn state_is_constant_in_context_while_the_kv_cache_grows() {
    // Qwen3-Next-80B-A3B: 48 layers, every 4th full attention (2 KV heads × 256, bf16), the other
    // 36 Gated DeltaNet (16 key heads, 32 value heads, dk = dv = 128), conv kernel 4.
    let linear = vec![
        LinearLayerGeometry {
            decay: Decay::Scalar,
            k_heads: 16,
            v_heads: 32,
            dk: 128,
            dv: 128,
            conv_kernel: CONV_KERNEL,
        };
        36
    ];
    let kv = KvGeometry::uniform(
        LayerKvGeometry::mha(2, 256, 256, KvDtype::Bf16).unwrap(),
        12,
    )
    .unwrap();
    let contexts = [1usize, 1024, 32 * 1024, 256 * 1024, 1 << 20];
    let rows = context_memory(&linear, &kv, &contexts).unwrap();
    let per_layer = 4 * (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) as u64;
    assert_eq!(linear[0].bytes_per_sequence(), per_layer);
    for r in &rows {
        assert_eq!(
            r.state_bytes,
            36 * per_layer,
            "the linear state does not depend on the context"
        );
        assert_eq!(r.kv_bytes, r.context as u64 * 12 * 2 * 2 * 256 * 2);
    }
    assert!(rows.windows(2).all(|w| w[1].kv_bytes > w[0].kv_bytes));
    let table = format_context_memory(&rows);
    println!("{table}");
    assert_eq!(table.lines().count(), contexts.len() + 1);

    // The pool itself: bytes in use follow the number of sequences, not their lengths.
    let l = launcher().with_backend(Backend::CostOnly);
    let mut slots = StateSlots::new(&l, &linear, 8).unwrap();
    assert_eq!(slots.pool_bytes(), 8 * 36 * per_layer);
    slots.allocate(&l, SeqId(1)).unwrap();
    slots.allocate(&l, SeqId(2)).unwrap();
    assert_eq!(slots.bytes_in_use(), 2 * slots.bytes_per_sequence());
}
