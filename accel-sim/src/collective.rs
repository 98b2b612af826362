//! Collective-communication costs on a [`ClusterPreset`]: closed-form α–β models.
//!
//! Every cost is `latency terms + bytes / bandwidth`, where bandwidth is a link's nominal
//! figure times its `efficiency` (achieved / nominal) and α is the link's per-step latency.
//! Units: bytes, seconds; GB/s = 10^9 bytes/s.
//!
//! # Where the bandwidth comes from
//! - **Intra-node**, by topology ([`crate::cluster::Topology`]): on `switch` any pair talks at
//!   the card's full bandwidth `B`; on `full_mesh` with `k = cards_per_node − 1` peers, one peer
//!   link carries `B/k`, so a ring or tree step (one peer at a time) gets `B/k` while "direct"
//!   algorithms that talk to all peers at once get the whole `B`; on `ring` a ring algorithm
//!   gets the full `B` to its neighbour (as two counter-rotating rings over both neighbour
//!   links, like NCCL) and an all-to-all pays the average hop count.
//! - **Inter-node**: each card has its own NIC on a non-blocking fabric, so any card reaches
//!   any card of another node at `B_inter`.
//! - A flat algorithm whose ranks span nodes is set by the slowest link it uses: bandwidth
//!   `min(intra pair, inter)` and α `max(intra, inter)`.
//!
//! # Closed forms (S bytes, n ranks, B bandwidth × efficiency, α latency)
//! - ring all-reduce: `2(n−1)/n · S/B + 2(n−1)·α`;
//! - ring all-gather / reduce-scatter (S = the full gathered / reduced buffer):
//!   `(n−1)/n · S/B + (n−1)·α`;
//! - tree all-reduce (NCCL's double binary tree, pipelined): `2·S/B + 2·⌈log2 n⌉·α`;
//! - direct reduce-scatter / all-gather on a full mesh of p ranks: every rank exchanges `S/p`
//!   with each peer on its own link at once: `(S/p)/(B/k) + α` (= `(p−1)/p · S/B + α` for a
//!   whole node); direct all-reduce = direct reduce-scatter + direct all-gather;
//! - hierarchical all-reduce over `m` nodes × `p` ranks: intra reduce-scatter of S over p +
//!   inter-node ring all-reduce of `S/p` among the m nodes + intra all-gather of S;
//! - all-to-all: see [`all_to_all`];
//! - a group of one rank, or zero bytes, costs 0 seconds (nothing is sent, nothing launched).

use crate::cluster::{ClusterPreset, Topology};
use crate::error::SimError;

/// Which link level set a collective's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Links inside a node (NVLink, HCCS).
    Intra,
    /// The network between nodes (InfiniBand, RoCE).
    Inter,
}

/// The algorithm a collective should use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// A flat ring over all ranks.
    Ring,
    /// A double binary tree (all-reduce) or a binary tree (broadcast).
    Tree,
    /// Intra-node phase, inter-node phase among the nodes, intra-node phase.
    Hierarchical,
    /// Every rank talks to all peers at once, each over its own link: only on a single
    /// `full_mesh` node (reduce-scatter, all-gather, all-reduce).
    Direct,
    /// The cheapest algorithm this collective offers here; `CommCost::algorithm` says which won.
    Auto,
}

/// A communicator group: `size` ranks packed onto nodes, `per_node` ranks on each of
/// `size / per_node` nodes (rank r lives on node `r / per_node`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    /// Ranks in the group.
    pub size: usize,
    /// Ranks of the group on each node it occupies.
    pub per_node: usize,
}

impl Group {
    /// A group of `size` ranks packed as densely as `cluster` allows (`per_node` =
    /// `min(size, cards_per_node)`); validity is still checked when a collective runs.
    pub fn packed(cluster: &ClusterPreset, size: usize) -> Group {
        Group {
            size,
            per_node: size.min(cluster.cards_per_node).max(1),
        }
    }

    /// Nodes the group spans (`size / per_node`; 0 when `per_node` is 0).
    pub fn nodes(&self) -> usize {
        self.size.checked_div(self.per_node).unwrap_or(0)
    }

    /// Checks the group fits `cluster`: `size ≥ 1`, `1 ≤ per_node ≤ cards_per_node`,
    /// `per_node` divides `size`, and the nodes it spans exist.
    pub fn validate(&self, cluster: &ClusterPreset, op: &str) -> Result<(), SimError> {
        let err = |message: String| {
            Err(SimError::Collective {
                op: op.to_string(),
                message,
            })
        };
        if self.size == 0 {
            return err("a group needs at least 1 rank (size = 0)".into());
        }
        if self.per_node == 0 || self.per_node > cluster.cards_per_node {
            return err(format!(
                "per_node = {} must be between 1 and the {} cards per node of cluster `{}`",
                self.per_node, cluster.cards_per_node, cluster.name
            ));
        }
        // Written without `%` so clippy's `is_multiple_of` hint (Rust 1.87) does not apply: the
        // workspace's rust-version is 1.85.
        if self.nodes() * self.per_node != self.size {
            return err(format!(
                "size = {} is not a multiple of per_node = {}: ranks are packed per_node to a \
                 node, so choose a size that is a multiple or a per_node that divides it",
                self.size, self.per_node
            ));
        }
        if self.nodes() > cluster.nodes {
            return err(format!(
                "the group spans {} nodes ({} ranks, {} per node) but cluster `{}` has {}; \
                 use ClusterPreset::with_nodes({}) or a smaller group",
                self.nodes(),
                self.size,
                self.per_node,
                cluster.name,
                cluster.nodes,
                self.nodes()
            ));
        }
        Ok(())
    }
}

/// The cost of one collective call.
#[derive(Debug, Clone, PartialEq)]
pub struct CommCost {
    /// Wall time in seconds.
    pub seconds: f64,
    /// The algorithm costed ("ring", "tree", "hierarchical ring", "direct", "p2p", "none").
    pub algorithm: String,
    /// Bytes one rank sends (the busiest rank for uneven all-to-all), as the model charges them.
    pub bytes_sent_per_rank: f64,
    /// The link level that set the time.
    pub bottleneck: Level,
}

impl CommCost {
    fn zero(algorithm: &str) -> CommCost {
        CommCost {
            seconds: 0.0,
            algorithm: algorithm.to_string(),
            bytes_sent_per_rank: 0.0,
            bottleneck: Level::Intra,
        }
    }
}

/// Bandwidth (bytes/s), α (s) and level of a flat algorithm step over `group`: intra-node
/// pair figures when the group sits in one node, else the slowest of intra and inter links.
fn flat_link(cluster: &ClusterPreset, group: &Group) -> (f64, f64, Level) {
    let intra = cluster.intra_pair_bytes_per_s();
    if group.nodes() <= 1 {
        return (intra, cluster.intra_latency_s(), Level::Intra);
    }
    let inter = cluster.inter_card_bytes_per_s();
    // Why: a ring crossing nodes moves every chunk over every edge in lock-step, so its
    // slowest edge (and the larger per-step latency) paces all of it.
    let alpha = cluster.intra_latency_s().max(cluster.inter_latency_s());
    if inter <= intra {
        (inter, alpha, Level::Inter)
    } else {
        (intra, alpha, Level::Intra)
    }
}

fn check_bytes(op: &str, what: &str, bytes: f64) -> Result<(), SimError> {
    if bytes.is_finite() && bytes >= 0.0 {
        Ok(())
    } else {
        Err(SimError::Collective {
            op: op.to_string(),
            message: format!("{what} must be a finite, non-negative number of bytes, got {bytes}"),
        })
    }
}

/// ⌈log2 n⌉ for n ≥ 1.
fn ceil_log2(n: usize) -> u32 {
    usize::BITS - n.saturating_sub(1).leading_zeros()
}

/// Ring reduce-scatter or all-gather of a full buffer `s` over `n` ranks at (`b`, `alpha`).
fn ring_half(n: usize, s: f64, b: f64, alpha: f64) -> f64 {
    let nf = n as f64;
    (nf - 1.0) / nf * s / b + (nf - 1.0) * alpha
}

/// Direct reduce-scatter or all-gather of `s` over `p` ranks of one full-mesh node: each rank
/// sends `s/p` to every peer at once, one peer link (`B/k`) each, in one step.
fn direct_half(cluster: &ClusterPreset, p: usize, s: f64) -> f64 {
    if p <= 1 {
        return 0.0;
    }
    let link = cluster.intra_card_bytes_per_s() / cluster.mesh_peers() as f64;
    (s / p as f64) / link + cluster.intra_latency_s()
}

/// The intra-node reduce-scatter / all-gather phase of a hierarchical collective: direct on a
/// full mesh (it uses all peer links), ring otherwise. Returns (seconds, bytes sent per rank).
fn intra_half(cluster: &ClusterPreset, p: usize, s: f64) -> (f64, f64) {
    if p <= 1 {
        return (0.0, 0.0);
    }
    let sent = (p as f64 - 1.0) / p as f64 * s;
    let t = match cluster.intra.topology {
        Topology::FullMesh => direct_half(cluster, p, s),
        Topology::Switch | Topology::Ring => ring_half(
            p,
            s,
            cluster.intra_pair_bytes_per_s(),
            cluster.intra_latency_s(),
        ),
    };
    (t, sent)
}

fn single_full_mesh(cluster: &ClusterPreset, group: &Group) -> bool {
    cluster.intra.topology == Topology::FullMesh && group.nodes() == 1
}

fn direct_unavailable(op: &str, cluster: &ClusterPreset) -> SimError {
    SimError::Collective {
        op: op.to_string(),
        message: format!(
            "the direct algorithm needs all ranks on one full_mesh node (cluster `{}` is {}, or \
             the group spans nodes); use ring, hierarchical or auto",
            cluster.name,
            cluster.intra.topology.name()
        ),
    }
}

/// Picks the cheapest of `candidates`; ties go to the earlier (simpler) one.
fn cheapest(candidates: Vec<CommCost>) -> CommCost {
    let mut best: Option<CommCost> = None;
    for c in candidates {
        if best.as_ref().is_none_or(|b| c.seconds < b.seconds) {
            best = Some(c);
        }
    }
    // Callers always pass at least the ring.
    best.unwrap_or_else(|| CommCost::zero("none"))
}

/// The level whose phases took more time (ties go to intra).
fn dominant(intra_s: f64, inter_s: f64) -> Level {
    if inter_s > intra_s {
        Level::Inter
    } else {
        Level::Intra
    }
}

/// Cost of an all-reduce of `bytes` (each rank's buffer) over `group`.
///
/// `Ring`: `2(n−1)/n · S/B + 2(n−1)·α`. `Tree`: NCCL's double binary tree, pipelined: each of
/// the two trees carries half the buffer and every rank is interior in at most one, so the
/// reduce (up) and broadcast (down) phases each stream S through a rank's link once:
/// `2·S/B + 2·⌈log2 n⌉·α` (depth ⌈log2 n⌉ up, then down). `Hierarchical`: intra
/// reduce-scatter over `p = per_node` + inter ring all-reduce of `S/p` over the `m` nodes +
/// intra all-gather. `Direct`: direct reduce-scatter + direct all-gather on one full-mesh node.
/// `Auto`: the cheapest of those that apply (hierarchical only when the group spans nodes with
/// more than one rank on each; direct only on a single full-mesh node).
pub fn all_reduce(
    cluster: &ClusterPreset,
    group: &Group,
    bytes: f64,
    algorithm: Algorithm,
) -> Result<CommCost, SimError> {
    const OP: &str = "all_reduce";
    if let Some(free) = trivial(cluster, group, bytes, algorithm, OP)? {
        return Ok(free);
    }
    let n = group.size;
    let s = bytes;
    let nf = n as f64;
    let ring = || {
        let (b, alpha, level) = flat_link(cluster, group);
        CommCost {
            seconds: 2.0 * (nf - 1.0) / nf * s / b + 2.0 * (nf - 1.0) * alpha,
            algorithm: "ring".into(),
            bytes_sent_per_rank: 2.0 * (nf - 1.0) / nf * s,
            bottleneck: level,
        }
    };
    let tree = || {
        let (b, alpha, level) = flat_link(cluster, group);
        CommCost {
            seconds: 2.0 * s / b + 2.0 * ceil_log2(n) as f64 * alpha,
            algorithm: "tree".into(),
            bytes_sent_per_rank: 2.0 * s,
            bottleneck: level,
        }
    };
    let hierarchical = || {
        let p = group.per_node;
        let m = group.nodes();
        let (intra_t, intra_sent) = intra_half(cluster, p, s);
        let (inter_t, inter_sent) = if m > 1 {
            let mf = m as f64;
            let shard = s / p as f64;
            (
                2.0 * (mf - 1.0) / mf * shard / cluster.inter_card_bytes_per_s()
                    + 2.0 * (mf - 1.0) * cluster.inter_latency_s(),
                2.0 * (mf - 1.0) / mf * shard,
            )
        } else {
            (0.0, 0.0)
        };
        CommCost {
            seconds: 2.0 * intra_t + inter_t,
            algorithm: "hierarchical ring".into(),
            bytes_sent_per_rank: 2.0 * intra_sent + inter_sent,
            bottleneck: dominant(2.0 * intra_t, inter_t),
        }
    };
    let direct = || CommCost {
        seconds: 2.0 * direct_half(cluster, n, s),
        algorithm: "direct".into(),
        bytes_sent_per_rank: 2.0 * (nf - 1.0) / nf * s,
        bottleneck: Level::Intra,
    };
    Ok(match algorithm {
        Algorithm::Ring => ring(),
        Algorithm::Tree => tree(),
        Algorithm::Hierarchical => hierarchical(),
        Algorithm::Direct => {
            if !single_full_mesh(cluster, group) {
                return Err(direct_unavailable(OP, cluster));
            }
            direct()
        }
        Algorithm::Auto => {
            let mut c = vec![ring()];
            if single_full_mesh(cluster, group) {
                c.push(direct());
            }
            c.push(tree());
            if group.nodes() > 1 && group.per_node > 1 {
                c.push(hierarchical());
            }
            cheapest(c)
        }
    })
}

fn name(a: Algorithm) -> &'static str {
    match a {
        Algorithm::Ring => "ring",
        Algorithm::Tree => "tree",
        Algorithm::Hierarchical => "hierarchical ring",
        Algorithm::Direct => "direct",
        Algorithm::Auto => "none",
    }
}

/// Checks a collective's group and size; a group of one rank, or nothing to move, costs nothing
/// (`Some(zero)`), otherwise `None` and the collective computes its cost.
fn trivial(
    cluster: &ClusterPreset,
    group: &Group,
    bytes: f64,
    algorithm: Algorithm,
    op: &str,
) -> Result<Option<CommCost>, SimError> {
    group.validate(cluster, op)?;
    check_bytes(op, "bytes", bytes)?;
    if group.size == 1 {
        return Ok(Some(CommCost::zero("none")));
    }
    Ok((bytes == 0.0).then(|| CommCost::zero(name(algorithm))))
}

/// Shared body of all-gather and reduce-scatter: the two move the same bytes in mirror order.
fn gather_or_scatter(
    op: &str,
    cluster: &ClusterPreset,
    group: &Group,
    bytes: f64,
    algorithm: Algorithm,
) -> Result<CommCost, SimError> {
    if let Some(free) = trivial(cluster, group, bytes, algorithm, op)? {
        return Ok(free);
    }
    let n = group.size;
    let s = bytes;
    let nf = n as f64;
    let ring = || {
        let (b, alpha, level) = flat_link(cluster, group);
        CommCost {
            seconds: ring_half(n, s, b, alpha),
            algorithm: "ring".into(),
            bytes_sent_per_rank: (nf - 1.0) / nf * s,
            bottleneck: level,
        }
    };
    // All-gather: inter-node all-gather of the node's share S/p among same-local-rank peers,
    // then intra all-gather of S. Reduce-scatter runs the same phases in reverse order.
    let hierarchical = || {
        let p = group.per_node;
        let m = group.nodes();
        let (intra_t, intra_sent) = intra_half(cluster, p, s);
        let (inter_t, inter_sent) = if m > 1 {
            let mf = m as f64;
            let shard = s / p as f64;
            (
                ring_half(
                    m,
                    shard,
                    cluster.inter_card_bytes_per_s(),
                    cluster.inter_latency_s(),
                ),
                (mf - 1.0) / mf * shard,
            )
        } else {
            (0.0, 0.0)
        };
        CommCost {
            seconds: intra_t + inter_t,
            algorithm: "hierarchical ring".into(),
            bytes_sent_per_rank: intra_sent + inter_sent,
            bottleneck: dominant(intra_t, inter_t),
        }
    };
    let direct = || CommCost {
        seconds: direct_half(cluster, n, s),
        algorithm: "direct".into(),
        bytes_sent_per_rank: (nf - 1.0) / nf * s,
        bottleneck: Level::Intra,
    };
    Ok(match algorithm {
        Algorithm::Ring => ring(),
        Algorithm::Hierarchical => hierarchical(),
        Algorithm::Direct => {
            if !single_full_mesh(cluster, group) {
                return Err(direct_unavailable(op, cluster));
            }
            direct()
        }
        Algorithm::Tree => {
            return Err(SimError::Collective {
                op: op.to_string(),
                message: "tree is an all-reduce / broadcast algorithm; use ring, hierarchical, \
                          direct (full_mesh node) or auto"
                    .into(),
            })
        }
        Algorithm::Auto => {
            let mut c = vec![ring()];
            if single_full_mesh(cluster, group) {
                c.push(direct());
            }
            if group.nodes() > 1 && group.per_node > 1 {
                c.push(hierarchical());
            }
            cheapest(c)
        }
    })
}

/// Cost of an all-gather whose gathered output is `bytes_out_total` bytes on every rank (each
/// rank contributes `bytes_out_total / n`). Ring: `(n−1)/n · S/B + (n−1)·α`; hierarchical:
/// inter-node ring all-gather of `S/p` among the nodes + intra all-gather of S; direct (one
/// full-mesh node): `(S/n)/(B/k) + α`. `Tree` is an error (no tree all-gather).
pub fn all_gather(
    cluster: &ClusterPreset,
    group: &Group,
    bytes_out_total: f64,
    algorithm: Algorithm,
) -> Result<CommCost, SimError> {
    gather_or_scatter("all_gather", cluster, group, bytes_out_total, algorithm)
}

/// Cost of a reduce-scatter of a `bytes_in_total`-byte buffer on every rank (each rank ends
/// with `bytes_in_total / n` reduced bytes). Same forms as [`all_gather`], phases reversed:
/// intra reduce-scatter of S, then inter-node ring reduce-scatter of `S/p`.
pub fn reduce_scatter(
    cluster: &ClusterPreset,
    group: &Group,
    bytes_in_total: f64,
    algorithm: Algorithm,
) -> Result<CommCost, SimError> {
    gather_or_scatter("reduce_scatter", cluster, group, bytes_in_total, algorithm)
}

/// Cost of one point-to-point transfer of `bytes` (pipeline-parallel activations, KV
/// migration): `S/B + α` over one intra-node pair link when `same_node` (the whole card on a
/// switch, one peer link on a full mesh, a neighbour on a ring), else over the network port.
pub fn send_recv(
    cluster: &ClusterPreset,
    bytes: f64,
    same_node: bool,
) -> Result<CommCost, SimError> {
    check_bytes("send_recv", "bytes", bytes)?;
    if bytes == 0.0 {
        return Ok(CommCost::zero("p2p"));
    }
    let (b, alpha, level) = if same_node {
        (
            cluster.intra_pair_bytes_per_s(),
            cluster.intra_latency_s(),
            Level::Intra,
        )
    } else {
        (
            cluster.inter_card_bytes_per_s(),
            cluster.inter_latency_s(),
            Level::Inter,
        )
    };
    Ok(CommCost {
        seconds: bytes / b + alpha,
        algorithm: "p2p".into(),
        bytes_sent_per_rank: bytes,
        bottleneck: level,
    })
}

/// Cost of a broadcast of `bytes` from one rank to the group. `Ring`: a pipelined chain,
/// `S/B + (n−1)·α`. `Tree`: a pipelined binary tree; an interior rank sends each chunk to two
/// children through its one egress, `2·S/B + ⌈log2 n⌉·α`. `Auto`: the cheaper. Other
/// algorithms are errors.
pub fn broadcast(
    cluster: &ClusterPreset,
    group: &Group,
    bytes: f64,
    algorithm: Algorithm,
) -> Result<CommCost, SimError> {
    const OP: &str = "broadcast";
    if let Some(free) = trivial(cluster, group, bytes, algorithm, OP)? {
        return Ok(free);
    }
    let n = group.size;
    let (b, alpha, level) = flat_link(cluster, group);
    let ring = CommCost {
        seconds: bytes / b + (n as f64 - 1.0) * alpha,
        algorithm: "ring".into(),
        bytes_sent_per_rank: bytes,
        bottleneck: level,
    };
    let tree = CommCost {
        seconds: 2.0 * bytes / b + ceil_log2(n) as f64 * alpha,
        algorithm: "tree".into(),
        bytes_sent_per_rank: 2.0 * bytes,
        bottleneck: level,
    };
    match algorithm {
        Algorithm::Ring => Ok(ring),
        Algorithm::Tree => Ok(tree),
        Algorithm::Auto => Ok(cheapest(vec![ring, tree])),
        Algorithm::Hierarchical | Algorithm::Direct => Err(SimError::Collective {
            op: OP.into(),
            message: "broadcast offers ring, tree or auto".into(),
        }),
    }
}

/// Average hops between two distinct cards on a bidirectional ring of `c` cards (shortest
/// way round): `Σ_{d=1}^{c−1} min(d, c−d) / (c−1)`; 1 for c ≤ 2.
fn ring_average_hops(c: usize) -> f64 {
    if c <= 2 {
        return 1.0;
    }
    let total: usize = (1..c).map(|d| d.min(c - d)).sum();
    total as f64 / (c - 1) as f64
}

/// Checks that `m` is a `rows × cols` matrix of byte counts (`what` names it in errors).
fn check_matrix(
    op: &str,
    what: &str,
    m: &[Vec<f64>],
    rows: usize,
    cols: usize,
) -> Result<(), SimError> {
    if m.len() != rows {
        return Err(SimError::Collective {
            op: op.into(),
            message: format!(
                "{what} has {} rows but the group has {rows} ranks; pass {rows} rows of {cols} \
                 byte counts",
                m.len()
            ),
        });
    }
    for (src, row) in m.iter().enumerate() {
        if row.len() != cols {
            return Err(SimError::Collective {
                op: op.into(),
                message: format!("{what}[{src}] has {} entries but needs {cols}", row.len()),
            });
        }
        for (dst, v) in row.iter().enumerate() {
            check_bytes(op, &format!("{what}[{src}][{dst}]"), *v)?;
        }
    }
    Ok(())
}

/// Bytes each rank sends and receives on one link level of an exchange.
struct LevelLoad {
    send: Vec<f64>,
    recv: Vec<f64>,
    /// Ranks per node.
    per_node: usize,
    /// Bytes per (sender, receiver's index on its node): for the intra-node level, where both
    /// share a node, one entry per link of a full mesh.
    pair: Vec<f64>,
}

impl LevelLoad {
    fn new(n: usize, per_node: usize) -> LevelLoad {
        LevelLoad {
            send: vec![0.0; n],
            recv: vec![0.0; n],
            per_node,
            pair: vec![0.0; n * per_node],
        }
    }

    fn add(&mut self, src: usize, dst: usize, bytes: f64) {
        self.send[src] += bytes;
        self.recv[dst] += bytes;
        self.pair[src * self.per_node + dst % self.per_node] += bytes;
    }

    /// The busiest rank's send or receive.
    fn busiest(&self) -> f64 {
        self.send
            .iter()
            .chain(&self.recv)
            .fold(0.0_f64, |m, &x| m.max(x))
    }

    /// Time of the intra-node level on the node's topology (see [`all_to_all`]).
    fn intra_seconds(&self, cluster: &ClusterPreset) -> f64 {
        let load = self.busiest();
        if load <= 0.0 {
            return 0.0;
        }
        let card = cluster.intra_card_bytes_per_s();
        let transfer = match cluster.intra.topology {
            Topology::Switch => load / card,
            Topology::FullMesh => {
                let max_pair = self.pair.iter().fold(0.0_f64, |m, &x| m.max(x));
                max_pair / (card / cluster.mesh_peers() as f64)
            }
            Topology::Ring => load * ring_average_hops(cluster.cards_per_node) / card,
        };
        transfer + cluster.intra_latency_s()
    }

    /// Time of the inter-node level: one NIC per card on a non-blocking fabric.
    fn inter_seconds(&self, cluster: &ClusterPreset) -> f64 {
        let load = self.busiest();
        if load <= 0.0 {
            return 0.0;
        }
        load / cluster.inter_card_bytes_per_s() + cluster.inter_latency_s()
    }
}

/// The cost of an exchange whose two link levels run at once (separate hardware).
fn two_level_cost(
    cluster: &ClusterPreset,
    intra: &LevelLoad,
    inter: &LevelLoad,
    algorithm: &str,
) -> CommCost {
    let (intra_t, inter_t) = (intra.intra_seconds(cluster), inter.inter_seconds(cluster));
    let sent = (0..intra.send.len())
        .map(|r| intra.send[r] + inter.send[r])
        .fold(0.0_f64, f64::max);
    CommCost {
        seconds: intra_t.max(inter_t),
        algorithm: algorithm.into(),
        bytes_sent_per_rank: sent,
        bottleneck: dominant(intra_t, inter_t),
    }
}

/// Cost of an all-to-all where `volumes[src][dst]` bytes go from rank `src` to rank `dst`
/// (`group.size × group.size`; the diagonal stays local and is free). Uneven loads (MoE
/// expert dispatch) cost what they cost.
///
/// Assumptions, per link level:
/// - Intra and inter traffic use separate hardware (NVLink/HCCS vs the NIC) and run at once,
///   so the time is the larger of the two levels, not their sum.
/// - Inter-node: each card has its own port on a non-blocking fabric; the level's time is the
///   most loaded rank's inter-node send or receive over `B_inter`, plus `α_inter`.
/// - Intra-node on `switch`: the most loaded rank's intra-node send or receive over the card's
///   `B`, plus `α_intra` — uniform `v` per pair over a whole node of n ranks gives
///   `(n−1)·v/B + α`.
/// - Intra-node on `full_mesh`: every pair has its own link of `B/k`, so the busiest single
///   pair sets the time, `max v[src][dst] / (B/k) + α` (uniform whole node: again
///   `(n−1)·v/B + α`).
/// - Intra-node on `ring`: forwarded bytes cross `h` links on average (shortest way round the
///   node's ring), so the busiest rank's load is multiplied by `h`.
///
/// Inter-node bytes go straight to their rank; [`all_to_all_via_nodes`] is the form that sends
/// each token once per node and forwards inside the node (DeepEP). One α per level: the
/// pairwise exchanges are issued together.
pub fn all_to_all(
    cluster: &ClusterPreset,
    group: &Group,
    volumes: &[Vec<f64>],
) -> Result<CommCost, SimError> {
    const OP: &str = "all_to_all";
    group.validate(cluster, OP)?;
    let n = group.size;
    check_matrix(OP, "volumes", volumes, n, n)?;
    if n == 1 {
        return Ok(CommCost::zero("none"));
    }
    let p = group.per_node;
    let (mut intra, mut inter) = (LevelLoad::new(n, p), LevelLoad::new(n, p));
    for (src, row) in volumes.iter().enumerate() {
        for (dst, &v) in row.iter().enumerate() {
            if src == dst {
                continue;
            }
            if src / p == dst / p {
                intra.add(src, dst, v);
            } else {
                inter.add(src, dst, v);
            }
        }
    }
    Ok(two_level_cost(cluster, &intra, &inter, "direct"))
}

/// Cost of an MoE dispatch that crosses the network once per node, as DeepEP's normal
/// (prefill) kernels do: a token goes over the network once to each other node holding any of
/// its experts, arriving at the rank with the sender's local index there (its *proxy*), which
/// forwards it over the intra-node links to each rank of that node holding one of its experts;
/// on the sender's own node it goes straight to those ranks. The combine is the same exchange
/// reversed (reduced inside the node, then once over the network), and costs the same: each
/// level's time is its busiest rank's send *or* receive.
///
/// - `to_rank[src][dst]` (`n × n`): bytes of `src`'s tokens that rank `dst` needs, each token
///   counted once per rank however many of its experts the rank holds; the diagonal is local.
/// - `to_node[src][m]` (`n × nodes`): bytes `src` sends over the network to node `m`, each token
///   once per node; entries for `src`'s own node are ignored (nothing crosses the network).
///
/// Both levels run at once (forwarding is pipelined with the network transfers), priced as in
/// [`all_to_all`]. A group on one node is [`all_to_all`] of `to_rank`.
pub fn all_to_all_via_nodes(
    cluster: &ClusterPreset,
    group: &Group,
    to_rank: &[Vec<f64>],
    to_node: &[Vec<f64>],
) -> Result<CommCost, SimError> {
    const OP: &str = "all_to_all_via_nodes";
    group.validate(cluster, OP)?;
    let (n, p) = (group.size, group.per_node);
    let nodes = group.nodes();
    check_matrix(OP, "to_rank", to_rank, n, n)?;
    check_matrix(OP, "to_node", to_node, n, nodes)?;
    if n == 1 {
        return Ok(CommCost::zero("none"));
    }
    let (mut intra, mut inter) = (LevelLoad::new(n, p), LevelLoad::new(n, p));
    for src in 0..n {
        let (home, local) = (src / p, src % p);
        for (m, &v) in to_node[src].iter().enumerate() {
            if m != home {
                inter.add(src, m * p + local, v);
            }
        }
        for (dst, &v) in to_rank[src].iter().enumerate() {
            // Same node: straight there; another node: from the proxy that received it.
            let from = if dst / p == home {
                src
            } else {
                (dst / p) * p + local
            };
            if from != dst {
                intra.add(from, dst, v);
            }
        }
    }
    Ok(two_level_cost(cluster, &intra, &inter, "via_nodes"))
}

/// Step time and exposed communication when a step's communication overlaps its compute by
/// splitting the batch into `micro_batches` (DeepSeek-V3's dual micro-batch overlap: one
/// micro-batch's all-to-all runs under the other's compute). With `m ≥ 2`:
/// `step = max(compute, comm) + min(compute, comm) / m` — the longer stream runs end to end
/// and only the first (or last) micro-batch's share of the shorter one cannot hide. With
/// `m ≤ 1` nothing overlaps: `step = compute + comm`. Returns `(step_s, exposed_comm_s)` with
/// `exposed = step − compute`. Negative or NaN inputs count as 0.
pub fn overlap(compute_s: f64, comm_s: f64, micro_batches: usize) -> (f64, f64) {
    let c = compute_s.max(0.0);
    let k = comm_s.max(0.0);
    let step = if micro_batches >= 2 {
        c.max(k) + c.min(k) / micro_batches as f64
    } else {
        c + k
    };
    (step, step - c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64) {
        let rel = ((got - want) / want).abs();
        assert!(
            rel <= 1e-12,
            "got {got:e}, want {want:e} (relative error {rel:e})"
        );
    }

    fn h200() -> ClusterPreset {
        ClusterPreset::load("h200-node").unwrap()
    }
    fn h800() -> ClusterPreset {
        ClusterPreset::load("h800").unwrap()
    }
    fn npu() -> ClusterPreset {
        ClusterPreset::load("npu-910b").unwrap()
    }

    // Achieved figures of the built-in presets (nominal × efficiency), bytes/s and seconds.
    const H200_B: f64 = 450e9 * 0.8;
    const H800_B: f64 = 200e9 * 0.8;
    const IB_B: f64 = 50e9 * 0.8;
    const NV_A: f64 = 1.5e-6;
    const IB_A: f64 = 5e-6;
    const NPU_CARD: f64 = 196e9 * 0.8;
    const NPU_LINK: f64 = NPU_CARD / 7.0;
    const NPU_A: f64 = 2e-6;
    const ROCE_B: f64 = 25e9 * 0.8;
    const ROCE_A: f64 = 8e-6;

    const ONE_NODE: Group = Group {
        size: 8,
        per_node: 8,
    };

    #[test]
    fn collective_all_to_all_via_nodes_crosses_the_network_once_per_node() {
        let v = 4e6;
        // One node: the direct all-to-all of the per-rank volumes.
        let uniform = vec![vec![v; 8]; 8];
        let one = all_to_all_via_nodes(&h200(), &ONE_NODE, &uniform, &vec![vec![0.0]; 8]).unwrap();
        close(
            one.seconds,
            all_to_all(&h200(), &ONE_NODE, &uniform).unwrap().seconds,
        );
        // Two H800 nodes: each rank sends u once over IB to its proxy on the other node (which
        // hears from that one sender: u), and on NVLink sends 7v to its node and forwards 7v
        // for its remote twin (14v), receiving as much.
        let g = Group {
            size: 16,
            per_node: 8,
        };
        let u = 2.5 * v;
        // The own node's entry is ignored (9e9 bytes would dominate otherwise).
        let to_node: Vec<Vec<f64>> = (0..16)
            .map(|src| if src < 8 { vec![9e9, u] } else { vec![u, 9e9] })
            .collect();
        let to_rank = vec![vec![v; 16]; 16];
        let t = all_to_all_via_nodes(&h800(), &g, &to_rank, &to_node).unwrap();
        let (intra, inter) = (14.0 * v / H800_B + NV_A, u / IB_B + IB_A);
        close(t.seconds, intra.max(inter));
        assert_eq!(t.algorithm, "via_nodes");
        // Against the direct form, where every token crosses IB once per remote rank (8v).
        let direct = all_to_all(&h800(), &g, &to_rank).unwrap();
        close(direct.seconds, 8.0 * v / IB_B + IB_A);
        assert!(t.seconds < direct.seconds);
        // A hot rank: everyone's tokens reach rank 3, 7 senders of its node directly, 7 of the
        // other node through its proxies (the eighth is its twin, whose proxy is rank 3).
        let mut hot = to_rank.clone();
        for row in hot.iter_mut() {
            row[3] += 1e8;
        }
        let t = all_to_all_via_nodes(&h800(), &g, &hot, &to_node).unwrap();
        close(t.seconds, 14.0 * (v + 1e8) / H800_B + NV_A);
        // Shapes are checked.
        let err = all_to_all_via_nodes(&h800(), &g, &to_rank, &vec![vec![u]; 16]).unwrap_err();
        assert!(
            err.to_string()
                .contains("to_node[0] has 1 entries but needs 2"),
            "{err}"
        );
        assert!(all_to_all_via_nodes(&h800(), &g, &to_rank[..3], &to_node).is_err());
    }

    #[test]
    fn collective_ring_closed_forms_one_node() {
        let c = h200();
        let s = 1e9;
        let n = 8.0;
        let ar = all_reduce(&c, &ONE_NODE, s, Algorithm::Ring).unwrap();
        close(
            ar.seconds,
            2.0 * (n - 1.0) / n * s / H200_B + 2.0 * (n - 1.0) * NV_A,
        );
        assert_eq!(ar.algorithm, "ring");
        assert_eq!(ar.bottleneck, Level::Intra);
        close(ar.bytes_sent_per_rank, 2.0 * 7.0 / 8.0 * s);
        let half = (n - 1.0) / n * s / H200_B + (n - 1.0) * NV_A;
        close(
            all_gather(&c, &ONE_NODE, s, Algorithm::Ring)
                .unwrap()
                .seconds,
            half,
        );
        close(
            reduce_scatter(&c, &ONE_NODE, s, Algorithm::Ring)
                .unwrap()
                .seconds,
            half,
        );
        // A 4-rank group inside the node.
        let g = Group {
            size: 4,
            per_node: 4,
        };
        close(
            all_reduce(&c, &g, s, Algorithm::Ring).unwrap().seconds,
            2.0 * 3.0 / 4.0 * s / H200_B + 6.0 * NV_A,
        );
    }

    #[test]
    fn collective_tree_closed_form() {
        let c = h200();
        let s = 3e6;
        let t = all_reduce(&c, &ONE_NODE, s, Algorithm::Tree).unwrap();
        close(t.seconds, 2.0 * s / H200_B + 2.0 * 3.0 * NV_A);
        assert_eq!(t.algorithm, "tree");
        // ⌈log2 5⌉ = 3, ⌈log2 2⌉ = 1.
        let g5 = Group {
            size: 5,
            per_node: 5,
        };
        close(
            all_reduce(&c, &g5, s, Algorithm::Tree).unwrap().seconds,
            2.0 * s / H200_B + 2.0 * 3.0 * NV_A,
        );
        let g2 = Group {
            size: 2,
            per_node: 2,
        };
        close(
            all_reduce(&c, &g2, s, Algorithm::Tree).unwrap().seconds,
            2.0 * s / H200_B + 2.0 * NV_A,
        );
        // Across 4 H800 nodes: the slowest link (IB) and the larger α; ⌈log2 32⌉ = 5.
        let g = Group {
            size: 32,
            per_node: 8,
        };
        let t = all_reduce(&h800(), &g, s, Algorithm::Tree).unwrap();
        close(t.seconds, 2.0 * s / IB_B + 2.0 * 5.0 * IB_A);
        assert_eq!(t.bottleneck, Level::Inter);
    }

    #[test]
    fn collective_ring_across_nodes_is_paced_by_the_network() {
        let c = h800();
        let g = Group {
            size: 32,
            per_node: 8,
        };
        let s = 2e9;
        let n = 32.0;
        let r = all_reduce(&c, &g, s, Algorithm::Ring).unwrap();
        close(
            r.seconds,
            2.0 * (n - 1.0) / n * s / IB_B + 2.0 * (n - 1.0) * IB_A,
        );
        assert_eq!(r.bottleneck, Level::Inter);
        let ag = all_gather(&c, &g, s, Algorithm::Ring).unwrap();
        close(ag.seconds, (n - 1.0) / n * s / IB_B + (n - 1.0) * IB_A);
        assert_eq!(ag.bottleneck, Level::Inter);
    }

    #[test]
    fn collective_hierarchical_closed_form_and_beats_flat_ring() {
        let c = h800();
        let g = Group {
            size: 32,
            per_node: 8,
        };
        let s = 1e9;
        let (p, m) = (8.0, 4.0);
        let intra = (p - 1.0) / p * s / H800_B + (p - 1.0) * NV_A;
        let inter = 2.0 * (m - 1.0) / m * (s / p) / IB_B + 2.0 * (m - 1.0) * IB_A;
        let h = all_reduce(&c, &g, s, Algorithm::Hierarchical).unwrap();
        close(h.seconds, intra + inter + intra);
        assert_eq!(h.algorithm, "hierarchical ring");
        close(
            h.bytes_sent_per_rank,
            2.0 * (p - 1.0) / p * s + 2.0 * (m - 1.0) / m * s / p,
        );
        let ring = all_reduce(&c, &g, s, Algorithm::Ring).unwrap();
        assert!(h.seconds < ring.seconds, "{h:?} vs {ring:?}");
        let auto = all_reduce(&c, &g, s, Algorithm::Auto).unwrap();
        assert_eq!(auto.algorithm, "hierarchical ring");
        close(auto.seconds, h.seconds);
        // Hierarchical all-gather / reduce-scatter: inter ring over S/p, intra ring over S.
        let half = (p - 1.0) / p * s / H800_B
            + (p - 1.0) * NV_A
            + (m - 1.0) / m * (s / p) / IB_B
            + (m - 1.0) * IB_A;
        close(
            all_gather(&c, &g, s, Algorithm::Hierarchical)
                .unwrap()
                .seconds,
            half,
        );
        close(
            reduce_scatter(&c, &g, s, Algorithm::Hierarchical)
                .unwrap()
                .seconds,
            half,
        );
        // On a full mesh the intra phases are direct (all 7 peer links at once).
        let c = npu();
        let direct_half = (s / p) / NPU_LINK + NPU_A;
        let inter = 2.0 * (m - 1.0) / m * (s / p) / ROCE_B + 2.0 * (m - 1.0) * ROCE_A;
        close(
            all_reduce(&c, &g, s, Algorithm::Hierarchical)
                .unwrap()
                .seconds,
            2.0 * direct_half + inter,
        );
    }

    #[test]
    fn collective_full_mesh_ring_uses_one_link_direct_uses_all() {
        let c = npu();
        let s = 1e9;
        let n = 8.0;
        // A ring step goes over one of the 7 peer links: B/7.
        let r = all_reduce(&c, &ONE_NODE, s, Algorithm::Ring).unwrap();
        close(
            r.seconds,
            2.0 * (n - 1.0) / n * s / NPU_LINK + 2.0 * (n - 1.0) * NPU_A,
        );
        // Direct: the whole card, one step.
        let d = all_gather(&c, &ONE_NODE, s, Algorithm::Direct).unwrap();
        close(d.seconds, (n - 1.0) / n * s / NPU_CARD + NPU_A);
        assert_eq!(d.algorithm, "direct");
        let d = reduce_scatter(&c, &ONE_NODE, s, Algorithm::Direct).unwrap();
        close(d.seconds, (n - 1.0) / n * s / NPU_CARD + NPU_A);
        let d = all_reduce(&c, &ONE_NODE, s, Algorithm::Direct).unwrap();
        close(d.seconds, 2.0 * ((n - 1.0) / n * s / NPU_CARD + NPU_A));
        assert_eq!(
            all_reduce(&c, &ONE_NODE, s, Algorithm::Auto)
                .unwrap()
                .algorithm,
            "direct"
        );
        assert_eq!(
            all_gather(&c, &ONE_NODE, s, Algorithm::Auto)
                .unwrap()
                .algorithm,
            "direct"
        );
        // A 4-rank group uses 3 of the 7 links: (S/4) / (B/7).
        let g4 = Group {
            size: 4,
            per_node: 4,
        };
        close(
            all_gather(&c, &g4, s, Algorithm::Direct).unwrap().seconds,
            (s / 4.0) / NPU_LINK + NPU_A,
        );
        // Direct needs one full-mesh node.
        assert!(all_gather(&h200(), &ONE_NODE, s, Algorithm::Direct).is_err());
        let g = Group {
            size: 16,
            per_node: 8,
        };
        assert!(all_reduce(&c, &g, s, Algorithm::Direct).is_err());
    }

    #[test]
    fn collective_one_rank_costs_nothing() {
        let g = Group {
            size: 1,
            per_node: 1,
        };
        for c in [h200(), h800(), npu()] {
            for a in [
                Algorithm::Ring,
                Algorithm::Tree,
                Algorithm::Hierarchical,
                Algorithm::Direct,
                Algorithm::Auto,
            ] {
                assert_eq!(all_reduce(&c, &g, 1e9, a).unwrap().seconds, 0.0);
                assert_eq!(broadcast(&c, &g, 1e9, a).unwrap().seconds, 0.0);
                assert_eq!(all_gather(&c, &g, 1e9, a).unwrap().seconds, 0.0);
                assert_eq!(reduce_scatter(&c, &g, 1e9, a).unwrap().seconds, 0.0);
            }
            let t = all_to_all(&c, &g, &[vec![5e8]]).unwrap();
            assert_eq!((t.seconds, t.bytes_sent_per_rank), (0.0, 0.0));
        }
        // Zero bytes: nothing is launched either.
        assert_eq!(
            all_reduce(&h200(), &ONE_NODE, 0.0, Algorithm::Ring)
                .unwrap()
                .seconds,
            0.0
        );
    }

    #[test]
    fn collective_auto_picks_tree_small_ring_big() {
        // Small message over many ranks: latency dominates, the tree's log depth wins.
        let big = h800().with_nodes(16).unwrap();
        let g = Group {
            size: 128,
            per_node: 8,
        };
        let a = all_reduce(&big, &g, 1024.0, Algorithm::Auto).unwrap();
        assert_eq!(a.algorithm, "tree");
        close(
            a.seconds,
            all_reduce(&big, &g, 1024.0, Algorithm::Tree)
                .unwrap()
                .seconds,
        );
        let a = all_reduce(&h200(), &ONE_NODE, 1024.0, Algorithm::Auto).unwrap();
        assert_eq!(a.algorithm, "tree");
        // Big message in one node: the ring's (n−1)/n bandwidth term wins.
        let a = all_reduce(&h200(), &ONE_NODE, 1e9, Algorithm::Auto).unwrap();
        assert_eq!(a.algorithm, "ring");
        close(
            a.seconds,
            all_reduce(&h200(), &ONE_NODE, 1e9, Algorithm::Ring)
                .unwrap()
                .seconds,
        );
    }

    #[test]
    fn collective_send_recv_and_broadcast() {
        let s = 1e8;
        close(
            send_recv(&h200(), s, true).unwrap().seconds,
            s / H200_B + NV_A,
        );
        let x = send_recv(&h200(), s, false).unwrap();
        close(x.seconds, s / IB_B + IB_A);
        assert_eq!(x.bottleneck, Level::Inter);
        close(
            send_recv(&npu(), s, true).unwrap().seconds,
            s / NPU_LINK + NPU_A,
        );
        let b = broadcast(&h200(), &ONE_NODE, s, Algorithm::Ring).unwrap();
        close(b.seconds, s / H200_B + 7.0 * NV_A);
        let b = broadcast(&h200(), &ONE_NODE, s, Algorithm::Tree).unwrap();
        close(b.seconds, 2.0 * s / H200_B + 3.0 * NV_A);
        assert_eq!(
            broadcast(&h200(), &ONE_NODE, s, Algorithm::Auto)
                .unwrap()
                .algorithm,
            "ring"
        );
        assert!(send_recv(&h200(), -1.0, true).is_err());
    }

    #[test]
    fn collective_all_to_all_uniform_and_uneven() {
        let c = h200();
        let v = 4e6;
        let uniform = vec![vec![v; 8]; 8];
        let t = all_to_all(&c, &ONE_NODE, &uniform).unwrap();
        close(t.seconds, 7.0 * v / H200_B + NV_A);
        close(t.bytes_sent_per_rank, 7.0 * v);
        assert_eq!(t.bottleneck, Level::Intra);
        // One hot destination: everyone sends an extra h to rank 0, whose receive sets the time.
        let h = 3e7;
        let mut hot = uniform.clone();
        for (src, row) in hot.iter_mut().enumerate().skip(1) {
            row[0] += h;
            assert_ne!(src, 0);
        }
        let t = all_to_all(&c, &ONE_NODE, &hot).unwrap();
        close(t.seconds, 7.0 * (v + h) / H200_B + NV_A);
        close(t.bytes_sent_per_rank, 7.0 * v + h);
        // Same total bytes spread evenly would be much cheaper.
        let even_v = v + h / 7.0;
        let even = all_to_all(&c, &ONE_NODE, &vec![vec![even_v; 8]; 8]).unwrap();
        assert!(even.seconds < t.seconds / 3.0);
        // Full mesh: uniform whole node = (n−1)v/B; one hot pair is limited by its own link.
        let m = npu();
        close(
            all_to_all(&m, &ONE_NODE, &uniform).unwrap().seconds,
            7.0 * v / NPU_CARD + NPU_A,
        );
        let mut pair = uniform.clone();
        pair[1][0] = 5e7;
        close(
            all_to_all(&m, &ONE_NODE, &pair).unwrap().seconds,
            5e7 / NPU_LINK + NPU_A,
        );
        // Ring topology: the average hop count, (1+2+3+4+3+2+1)/7 = 16/7 on 8 cards.
        let mut r = h200();
        r.intra.topology = Topology::Ring;
        close(
            all_to_all(&r, &ONE_NODE, &uniform).unwrap().seconds,
            7.0 * v * (16.0 / 7.0) / H200_B + NV_A,
        );
        // Two H800 nodes: intra (7v over NVLink) and inter (8v over IB) overlap; IB sets it.
        let g = Group {
            size: 16,
            per_node: 8,
        };
        let t = all_to_all(&h800(), &g, &vec![vec![v; 16]; 16]).unwrap();
        close(t.seconds, 8.0 * v / IB_B + IB_A);
        assert_eq!(t.bottleneck, Level::Inter);
        close(t.bytes_sent_per_rank, 15.0 * v);
    }

    #[test]
    fn collective_bad_input_is_an_error() {
        let c = h800();
        let bad = |g: Group| {
            all_reduce(&c, &g, 1e6, Algorithm::Ring)
                .unwrap_err()
                .to_string()
        };
        let s = bad(Group {
            size: 12,
            per_node: 8,
        });
        assert!(s.contains("multiple"), "{s}");
        let s = bad(Group {
            size: 16,
            per_node: 16,
        });
        assert!(s.contains("per_node"), "{s}");
        let s = bad(Group {
            size: 64,
            per_node: 8,
        });
        assert!(s.contains("with_nodes(8)"), "{s}");
        assert!(bad(Group {
            size: 0,
            per_node: 1
        })
        .contains("size"));
        assert!(bad(Group {
            size: 4,
            per_node: 0
        })
        .contains("per_node"));
        assert!(all_reduce(&c, &ONE_NODE, f64::NAN, Algorithm::Ring).is_err());
        assert!(all_gather(&c, &ONE_NODE, 1e6, Algorithm::Tree).is_err());
        assert!(broadcast(&c, &ONE_NODE, 1e6, Algorithm::Hierarchical).is_err());
        assert!(all_to_all(&c, &ONE_NODE, &[vec![1.0; 8]]).is_err());
        let mut v = vec![vec![1.0; 8]; 8];
        v[3].pop();
        assert!(all_to_all(&c, &ONE_NODE, &v).is_err());
        v[3].push(-2.0);
        let s = all_to_all(&c, &ONE_NODE, &v).unwrap_err().to_string();
        assert!(s.contains("volumes[3][7]"), "{s}");
    }

    #[test]
    fn collective_overlap_two_micro_batches() {
        // Compute-bound: the comm hides except one micro-batch's share.
        let (step, exposed) = overlap(10.0, 4.0, 2);
        close(step, 10.0 + 4.0 / 2.0);
        close(exposed, 2.0);
        // Comm-bound: compute hides except one micro-batch's share.
        let (step, exposed) = overlap(4.0, 10.0, 2);
        close(step, 10.0 + 4.0 / 2.0);
        close(exposed, 8.0);
        close(overlap(6.0, 6.0, 4).0, 6.0 + 6.0 / 4.0);
        // One micro-batch: nothing overlaps.
        assert_eq!(overlap(10.0, 4.0, 1), (14.0, 4.0));
        assert_eq!(overlap(10.0, 4.0, 0), (14.0, 4.0));
        assert_eq!(overlap(10.0, 0.0, 2), (10.0, 0.0));
    }
}
