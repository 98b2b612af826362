//! The cards' interconnect carrying data: collectives of a functional multi-card run move real
//! rows from one card's memory to another's, and each call is priced by the same cost model the
//! cost-only planner uses ([`crate::collective`]).
//!
//! A [`Fabric`] joins the cards of one run, each driven by its own host thread. The forward is
//! SPMD: every card issues the same collectives in the same order (each within its own group),
//! so one call is one global round — every card posts its outgoing messages, all wait, each takes
//! what was addressed to it. Sums run in the group's card order, so every member ends with the
//! same bits and the result does not depend on thread timing. A card that fails aborts the fabric
//! and the others get an error instead of waiting forever.

use crate::cluster::ClusterPreset;
use crate::collective::{self, Algorithm, CommCost, Group};
use crate::error::SimError;
use std::sync::{Arc, Condvar, Mutex};

/// The mailboxes and the round barrier shared by the cards of one run.
#[derive(Debug)]
pub struct Fabric {
    cards: usize,
    state: Mutex<Round>,
    turn: Condvar,
}

#[derive(Debug)]
struct Round {
    /// `mail[src][dst]`: what `src` posted to `dst` this round.
    mail: Vec<Vec<Vec<f32>>>,
    /// Cards at the barrier.
    arrived: usize,
    /// Barriers passed (a waiting card leaves when it changes).
    generation: u64,
    /// Why the run was aborted, once a card failed.
    aborted: Option<String>,
}

fn fabric_err(op: &str, message: String) -> SimError {
    SimError::Collective {
        op: op.to_string(),
        message,
    }
}

impl Fabric {
    /// A fabric joining `cards` cards.
    pub fn new(cards: usize) -> Arc<Fabric> {
        Arc::new(Fabric {
            cards,
            state: Mutex::new(Round {
                mail: vec![vec![Vec::new(); cards]; cards],
                arrived: 0,
                generation: 0,
                aborted: None,
            }),
            turn: Condvar::new(),
        })
    }

    /// Cards joined.
    pub fn cards(&self) -> usize {
        self.cards
    }

    /// Stops the run: every card waiting in a collective, and every later call, gets an error
    /// naming `why` (a failed card must not leave the others waiting for it).
    pub fn abort(&self, why: &str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.aborted.get_or_insert_with(|| why.to_string());
        self.turn.notify_all();
    }

    /// Waits until every card has arrived.
    fn barrier(&self, op: &str) -> Result<(), SimError> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let gen = s.generation;
        s.arrived += 1;
        if s.arrived == self.cards {
            s.arrived = 0;
            s.generation += 1;
            self.turn.notify_all();
        } else {
            while s.generation == gen && s.aborted.is_none() {
                s = self.turn.wait(s).unwrap_or_else(|p| p.into_inner());
            }
        }
        match &s.aborted {
            Some(why) => Err(fabric_err(op, format!("the run was aborted: {why}"))),
            None => Ok(()),
        }
    }

    /// One round: card `me` posts `out[dst]` to each card `dst` (empty: nothing), waits for every
    /// card, and returns what each card posted to it, indexed by source card.
    pub fn exchange(
        &self,
        op: &str,
        me: usize,
        out: Vec<Vec<f32>>,
    ) -> Result<Vec<Vec<f32>>, SimError> {
        if me >= self.cards || out.len() != self.cards {
            return Err(fabric_err(
                op,
                format!(
                    "card {me} posted {} mailboxes on a fabric of {} cards",
                    out.len(),
                    self.cards
                ),
            ));
        }
        {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(why) = &s.aborted {
                return Err(fabric_err(op, format!("the run was aborted: {why}")));
            }
            s.mail[me] = out;
        }
        self.barrier(op)?;
        let got = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            (0..self.cards)
                .map(|src| std::mem::take(&mut s.mail[src][me]))
                .collect()
        };
        // Nobody posts the next round before every card has taken this one's mail.
        self.barrier(op)?;
        Ok(got)
    }
}

/// The communicator group of the cards `members` (ascending card ids) on `cluster`: ranks per
/// node from where the cards sit (`card / cards_per_node`), which must be even across nodes.
pub fn group_of_cards(
    cluster: &ClusterPreset,
    members: &[usize],
    op: &str,
) -> Result<Group, SimError> {
    let per = cluster.cards_per_node.max(1);
    let mut nodes: Vec<usize> = members.iter().map(|c| c / per).collect();
    nodes.dedup();
    let per_node = members.len() / nodes.len().max(1);
    if nodes.len() * per_node != members.len()
        || nodes
            .iter()
            .any(|n| members.iter().filter(|c| *c / per == *n).count() != per_node)
    {
        return Err(fabric_err(
            op,
            format!(
                "cards {members:?} sit unevenly on the {per}-card nodes; a group needs the same \
                 number of its cards on every node it spans"
            ),
        ));
    }
    let g = Group {
        size: members.len(),
        per_node: per_node.max(1),
    };
    g.validate(cluster, op)?;
    Ok(g)
}

/// Where one card stands in a collective: the fabric, the cluster that prices the call, the
/// group's cards (ascending) and this card.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    /// The run's fabric.
    pub fabric: &'a Fabric,
    /// The cluster the links come from.
    pub cluster: &'a ClusterPreset,
    /// The group's cards, ascending.
    pub group: &'a [usize],
    /// This card.
    pub me: usize,
}

impl Member<'_> {
    fn check(&self, op: &str) -> Result<Group, SimError> {
        if !self.group.contains(&self.me) || self.group.windows(2).any(|w| w[0] >= w[1]) {
            return Err(fabric_err(
                op,
                format!(
                    "card {} is not in the ascending group {:?}",
                    self.me, self.group
                ),
            ));
        }
        group_of_cards(self.cluster, self.group, op)
    }

    /// All-reduce (sum) of `data` over the group, in place: every member ends with the sum taken
    /// in the group's card order. Priced as [`collective::all_reduce`] of the buffer at
    /// `elem_bytes` per value (the wire format; the sum itself is kept in f32).
    pub fn all_reduce_sum(&self, data: &mut [f32], elem_bytes: f64) -> Result<CommCost, SimError> {
        const OP: &str = "all_reduce";
        let group = self.check(OP)?;
        let mut out = vec![Vec::new(); self.fabric.cards()];
        for &peer in self.group.iter().filter(|&&c| c != self.me) {
            out[peer] = data.to_vec();
        }
        let got = self.fabric.exchange(OP, self.me, out)?;
        let mut sum = vec![0.0f32; data.len()];
        for &card in self.group {
            let part: &[f32] = if card == self.me { data } else { &got[card] };
            if part.len() != sum.len() {
                return Err(fabric_err(
                    OP,
                    format!(
                        "card {card} reduced {} values, card {} {}: every member must pass the \
                         same buffer size",
                        part.len(),
                        self.me,
                        sum.len()
                    ),
                ));
            }
            sum.iter_mut().zip(part).for_each(|(s, v)| *s += v);
        }
        data.copy_from_slice(&sum);
        collective::all_reduce(
            self.cluster,
            &group,
            data.len() as f64 * elem_bytes,
            Algorithm::Auto,
        )
    }

    /// All-to-all of rows: `send[r]` goes to the group's `r`-th card (rows of `width` values).
    /// Returns what each member sent this card, by rank, and the cost of the call priced as
    /// [`collective::all_to_all`] of the whole group's per-destination volumes at `elem_bytes`
    /// per value (every member learns every volume, so all price the same call).
    pub fn all_to_all_rows(
        &self,
        send: Vec<Vec<f32>>,
        width: usize,
        elem_bytes: f64,
    ) -> Result<(Vec<Vec<f32>>, CommCost), SimError> {
        const OP: &str = "all_to_all";
        let group = self.check(OP)?;
        let n = self.group.len();
        if send.len() != n || send.iter().any(|s| width == 0 || s.len() % width != 0) {
            return Err(fabric_err(
                OP,
                format!(
                    "card {} sends {} buffers to a group of {n}, each a whole number of rows of \
                     {width} values",
                    self.me,
                    send.len()
                ),
            ));
        }
        // Each card's row counts per destination travel with its data, so every member prices
        // the same volume matrix.
        let counts: Vec<f32> = send.iter().map(|s| (s.len() / width) as f32).collect();
        let mut out = vec![Vec::new(); self.fabric.cards()];
        for (r, rows) in send.into_iter().enumerate() {
            let mut msg = counts.clone();
            msg.extend(rows);
            out[self.group[r]] = msg;
        }
        let got = self.fabric.exchange(OP, self.me, out)?;
        let mut volumes = vec![vec![0.0; n]; n];
        let mut recv = Vec::with_capacity(n);
        for (src, &card) in self.group.iter().enumerate() {
            let msg = &got[card];
            if msg.len() < n {
                return Err(fabric_err(
                    OP,
                    format!("card {card} posted no counts to card {}", self.me),
                ));
            }
            for (dst, c) in msg[..n].iter().enumerate() {
                volumes[src][dst] = if src == dst {
                    0.0
                } else {
                    *c as f64 * width as f64 * elem_bytes
                };
            }
            recv.push(msg[n..].to_vec());
        }
        let cost = collective::all_to_all(self.cluster, &group, &volumes)?;
        Ok((recv, cost))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> ClusterPreset {
        ClusterPreset::load("h200-node").unwrap()
    }

    fn member<'a>(
        fabric: &'a Fabric,
        cluster: &'a ClusterPreset,
        group: &'a [usize],
        me: usize,
    ) -> Member<'a> {
        Member {
            fabric,
            cluster,
            group,
            me,
        }
    }

    /// Runs `body(card)` on `cards` threads joined by one fabric.
    fn on_cards<T: Send>(cards: usize, body: impl Fn(&Fabric, usize) -> T + Sync) -> Vec<T> {
        let fabric = Fabric::new(cards);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..cards)
                .map(|c| {
                    let (f, b) = (&fabric, &body);
                    s.spawn(move || b(f, c))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sums_each_group_in_card_order_and_prices_the_ring() {
        let cluster = node();
        let out = on_cards(4, |f, me| {
            // Two groups of two: {0, 1} and {2, 3}.
            let group: Vec<usize> = if me < 2 { vec![0, 1] } else { vec![2, 3] };
            let m = member(f, &cluster, &group, me);
            let mut data: Vec<f32> = (0..5).map(|i| (me * 10 + i) as f32 + 0.25).collect();
            let cost = m.all_reduce_sum(&mut data, 2.0).unwrap();
            (data, cost)
        });
        for (me, (data, cost)) in out.iter().enumerate() {
            let base = if me < 2 { 0 } else { 20 };
            let want: Vec<f32> = (0..5)
                .map(|i| ((base + i) as f32 + 0.25) + ((base + 10 + i) as f32 + 0.25))
                .collect();
            assert_eq!(data, &want, "card {me}");
            let closed = collective::all_reduce(
                &cluster,
                &Group::packed(&cluster, 2),
                10.0,
                Algorithm::Auto,
            )
            .unwrap();
            assert_eq!(cost.seconds, closed.seconds);
            assert!(cost.seconds > 0.0);
        }
    }

    #[test]
    fn all_to_all_delivers_rows_by_rank_and_prices_the_uneven_volumes() {
        let cluster = node();
        let width = 3;
        let out = on_cards(3, |f, me| {
            let group = [0, 1, 2];
            let m = member(f, &cluster, &group, me);
            // Card `me` sends `dst + 1` rows to `dst`, each row filled with `100·me + dst`.
            let send: Vec<Vec<f32>> = (0..3)
                .map(|dst| vec![(100 * me + dst) as f32; (dst + 1) * width])
                .collect();
            m.all_to_all_rows(send, width, 2.0).unwrap()
        });
        let mut volumes = vec![vec![0.0; 3]; 3];
        for (src, row) in volumes.iter_mut().enumerate() {
            for (dst, v) in row.iter_mut().enumerate() {
                if src != dst {
                    *v = ((dst + 1) * width * 2) as f64;
                }
            }
        }
        let closed =
            collective::all_to_all(&cluster, &Group::packed(&cluster, 3), &volumes).unwrap();
        for (me, (recv, cost)) in out.iter().enumerate() {
            for (src, rows) in recv.iter().enumerate() {
                assert_eq!(rows, &vec![(100 * src + me) as f32; (me + 1) * width]);
            }
            assert_eq!(cost.seconds, closed.seconds, "card {me}");
        }
    }

    #[test]
    fn a_failed_card_aborts_the_others_instead_of_hanging_them() {
        let cluster = node();
        let out = on_cards(3, |f, me| {
            if me == 1 {
                f.abort("card 1 failed");
                return Err("aborted".to_string());
            }
            let group = [0, 1, 2];
            let m = member(f, &cluster, &group, me);
            let mut data = vec![1.0f32; 4];
            m.all_reduce_sum(&mut data, 4.0).map_err(|e| e.to_string())
        });
        for (me, r) in out.iter().enumerate() {
            let e = r.as_ref().unwrap_err();
            if me != 1 {
                assert!(e.contains("card 1 failed"), "{e}");
            }
        }
    }

    #[test]
    fn groups_must_sit_evenly_on_nodes() {
        let cluster = node().with_nodes(2).unwrap();
        assert_eq!(
            group_of_cards(&cluster, &[0, 8], "t").unwrap(),
            Group {
                size: 2,
                per_node: 1
            }
        );
        assert!(group_of_cards(&cluster, &[0, 1, 8], "t").is_err());
    }
}
