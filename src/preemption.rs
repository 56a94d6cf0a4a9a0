//! Preemption (`docs/concepts/queues-and-preemption.md`, "Stopping without failing"): which
//! running jobs a scheduling pass stops so that a queue gets its weighted share of the run cap,
//! or a higher priority of a queue gets a slot ([`plan`]); pure, over counts and short lists.
//!
//! - **Shares** ([`shares`]): the run cap divided among the queues that want slots (holding or
//!   waiting) in proportion to their weights, by water-filling: a queue that wants less than its
//!   part gets what it wants and the rest is divided among the others (max-min fairness, as
//!   Kueue's fair sharing divides a cohort's lendable quota). Exact within `1e-9`.
//! - **Reclaim** (`reclaimShare: Any`): while the run cap is full, a queue holding fewer run slots
//!   than its share (counting slots already coming to it from victims still stopping) with
//!   admissible waiting jobs takes slots, one at a time, up to `floor(share) - held` and its
//!   waiting jobs. Victims come only from queues above their share and never push one below it
//!   (`held - 1 >= share`): the lowest priority first, then the most recently started (the least
//!   work lost), then the higher id.
//! - **Within a queue** (`withinQueue: LowerPriority`): while the run cap is full, each waiting
//!   job (in admission order) not already served by a victim stopping for its queue takes the
//!   slot of the queue's running job of the lowest priority below its own (then the most
//!   recently started).
//! - **Bounded churn**: a job is taken only once it has run `minRunSeconds` of the taking queue
//!   since its attempt started (so a job just started, or just requeued by a preemption and
//!   started again, is not taken); a job already stopping is never taken again; a queue causes at
//!   most `maxPerMinute` preemptions in any [`RATE_WINDOW_MS`].
//!
//! The shortfall bound: a queue never gets more victims than its waiting jobs, nor more than its
//! share lacks (reclaim); so no pass stops more jobs than the queues below their share can use.

use crate::queues::Preemption;

/// The window of `maxPerMinute` (ms).
pub const RATE_WINDOW_MS: i64 = 60_000;

/// How many node-first victim orders [`reclaim`] tries for one claimant beside the plain one
/// (bounds a pass's cost: each is one walk over the candidates).
pub const NODE_ORDERS: usize = 8;

/// Slack of the share comparisons (shares are fractions of slots).
const EPS: f64 = 1e-9;

/// A running job as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Running {
    /// Store id.
    pub id: i64,
    /// Its priority.
    pub priority: i32,
    /// When its current attempt began to run (ms since epoch); None: not running yet
    /// (launching, in a back-off): never taken.
    pub running_since_ms: Option<i64>,
    /// It is stopping already as a victim of this queue (its preemption is under way).
    pub leaving_for: Option<String>,
}

/// One queue as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueState {
    /// Its name.
    pub name: String,
    /// Its weight (at least 1).
    pub weight: u32,
    /// Its `maxRunning`, if any.
    pub max_running: Option<usize>,
    /// Its preemption policy.
    pub policy: Preemption,
    /// Run slots its jobs hold now (victims still stopping included).
    pub held: usize,
    /// The priorities of its admissible waiting jobs, in admission order (a prefix: at most the
    /// run cap's worth is needed).
    pub waiting: Vec<i32>,
    /// Its jobs holding a run slot.
    pub running: Vec<Running>,
    /// Preemptions it caused within the last [`RATE_WINDOW_MS`].
    pub recent: usize,
}

/// A job to stop, and for whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Victim {
    /// Store id of the job to stop.
    pub id: i64,
    /// The queue that takes its run slot.
    pub by: String,
    /// True when `by` is the victim's own queue (a higher priority took it).
    pub within: bool,
}

/// Each queue's share of `run_cap` slots, by water-filling over `(weight, demand)` (slots it
/// holds or waits for): a queue never gets more than its demand, and what it leaves is divided
/// among the others by weight. Queues without demand get 0. Sum: `min(run_cap, total demand)`.
pub fn shares(run_cap: usize, wants: &[(u32, usize)]) -> Vec<f64> {
    let mut share = vec![0.0; wants.len()];
    let mut open: Vec<usize> = (0..wants.len()).filter(|&i| wants[i].1 > 0).collect();
    let mut left = run_cap as f64;
    while !open.is_empty() && left > EPS {
        let weight: f64 = open.iter().map(|&i| f64::from(wants[i].0.max(1))).sum();
        let part = |i: usize| left * f64::from(wants[i].0.max(1)) / weight;
        // Queues that want less than their part get what they want; the rest is divided again.
        let sated: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| (wants[i].1 as f64) <= part(i) + EPS)
            .collect();
        if sated.is_empty() {
            for &i in &open {
                share[i] = part(i);
            }
            break;
        }
        for &i in &sated {
            share[i] = wants[i].1 as f64;
            left -= wants[i].1 as f64;
        }
        open.retain(|i| !sated.contains(i));
    }
    share
}

/// Which of two running jobs is taken first (Less: `a`): the lower priority, then the more
/// recently started (the least work lost), then the higher id.
fn victim_order(a: &Running, b: &Running) -> std::cmp::Ordering {
    a.priority
        .cmp(&b.priority)
        .then(b.running_since_ms.cmp(&a.running_since_ms))
        .then(b.id.cmp(&a.id))
}

/// The victims to stop now (see the module's rules). `run_full`: every run slot is held (no
/// free slot the normal pass could give instead); `now_ms`: ms since epoch. Cost: O(queues x
/// running jobs) per victim, with victims bounded by the queues' shortfall.
pub fn plan(queues: &[QueueState], run_cap: usize, run_full: bool, now_ms: i64) -> Vec<Victim> {
    if !run_full || queues.iter().all(|q| !q.policy.enabled()) {
        return Vec::new();
    }
    let n = queues.len();
    let index = |name: &str| queues.iter().position(|q| q.name == name);
    // Slots leaving each queue, and coming to each (victims stopping for it).
    let mut leaving = vec![0usize; n];
    let mut incoming = vec![0usize; n];
    for (i, q) in queues.iter().enumerate() {
        for r in &q.running {
            if let Some(by) = &r.leaving_for {
                leaving[i] += 1;
                if let Some(j) = index(by) {
                    incoming[j] += 1;
                }
            }
        }
    }
    let held: Vec<usize> = (0..n)
        .map(|i| queues[i].held.saturating_sub(leaving[i]))
        .collect();
    let wants: Vec<(u32, usize)> = (0..n)
        .map(|i| {
            let q = &queues[i];
            let demand = held[i] + q.waiting.len().saturating_sub(incoming[i]);
            (q.weight, q.max_running.map_or(demand, |m| demand.min(m)))
        })
        .collect();
    let share = shares(run_cap, &wants);
    let mut taken: Vec<bool> = Vec::new();
    let mut ids: Vec<(usize, usize)> = Vec::new();
    for (i, q) in queues.iter().enumerate() {
        for k in 0..q.running.len() {
            ids.push((i, k));
            taken.push(q.running[k].leaving_for.is_some());
        }
    }
    let mut given = vec![0usize; n];
    let mut got = incoming.clone();
    let mut rate: Vec<usize> = queues
        .iter()
        .map(|q| q.policy.max_per_minute.saturating_sub(q.recent))
        .collect();
    let mut out = Vec::new();
    let ran_enough = |r: &Running, policy: &Preemption| {
        r.running_since_ms
            .is_some_and(|since| now_ms - since >= policy.min_run_ms)
    };
    // Reclaim: one victim at a time to the claimant furthest below its share.
    loop {
        let need = |j: usize| -> usize {
            let q = &queues[j];
            if !q.policy.reclaim_share || rate[j] == 0 {
                return 0;
            }
            let target = (share[j] + EPS).floor() as usize;
            let have = held[j] + got[j];
            let room = q.max_running.map_or(usize::MAX, |m| m.saturating_sub(have));
            target
                .saturating_sub(have)
                .min(q.waiting.len().saturating_sub(got[j]))
                .min(room)
        };
        let claimant = (0..n).filter(|&j| need(j) > 0).min_by(|&a, &b| {
            let ha = (held[a] + got[a]) as u128 * u128::from(queues[b].weight.max(1));
            let hb = (held[b] + got[b]) as u128 * u128::from(queues[a].weight.max(1));
            ha.cmp(&hb).then(queues[a].name.cmp(&queues[b].name))
        });
        let Some(j) = claimant else { break };
        let policy = queues[j].policy;
        let victim = ids
            .iter()
            .enumerate()
            .filter(|&(v, &(i, k))| {
                i != j
                    && !taken[v]
                    && (held[i] - given[i]) as f64 - 1.0 >= share[i] - EPS
                    && ran_enough(&queues[i].running[k], &policy)
            })
            .min_by(|&(_, &(ia, ka)), &(_, &(ib, kb))| {
                victim_order(&queues[ia].running[ka], &queues[ib].running[kb])
            })
            .map(|(v, &(i, k))| (v, i, k));
        let Some((v, i, k)) = victim else {
            // Nothing this claimant may take: it asks no more this pass.
            rate[j] = 0;
            continue;
        };
        taken[v] = true;
        given[i] += 1;
        got[j] += 1;
        rate[j] -= 1;
        out.push(Victim {
            id: queues[i].running[k].id,
            by: queues[j].name.clone(),
            within: false,
        });
    }
    // Within a queue: each waiting job not yet served takes a lower priority's slot.
    for (j, q) in queues.iter().enumerate() {
        if !q.policy.within_queue {
            continue;
        }
        let mut budget = q
            .policy
            .max_per_minute
            .saturating_sub(q.recent + (got[j] - incoming[j]));
        for &priority in q.waiting.iter().skip(got[j]) {
            if budget == 0 {
                break;
            }
            let victim = ids
                .iter()
                .enumerate()
                .filter(|&(v, &(i, k))| {
                    i == j
                        && !taken[v]
                        && q.running[k].priority < priority
                        && ran_enough(&q.running[k], &q.policy)
                })
                .min_by(|&(_, &(_, ka)), &(_, &(_, kb))| {
                    victim_order(&q.running[ka], &q.running[kb])
                })
                .map(|(v, &(_, k))| (v, k));
            let Some((v, k)) = victim else { break };
            taken[v] = true;
            budget -= 1;
            out.push(Victim {
                id: q.running[k].id,
                by: q.name.clone(),
                within: true,
            });
        }
    }
    out
}

/// A running job holding quota on a pool, as [`reclaim`] sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Holder {
    /// Store id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its priority.
    pub priority: i32,
    /// When its current attempt began to run (ms since epoch); None: never taken.
    pub running_since_ms: Option<i64>,
    /// The pool its quota is held on.
    pub pool: String,
    /// What it holds there (its current attempt's demand).
    pub demand: crate::resources::Demand,
    /// The nodes its members run on (indexes into the pass's [`Nodes`]; one per bound member).
    pub nodes: Vec<usize>,
    /// It is stopping already as a victim for this queue.
    pub leaving_for: Option<String>,
}

/// A waiting job that may take back its queue's lent quota ([`reclaim`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Claimant {
    /// Store id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// What it needs.
    pub demand: crate::resources::Demand,
}

/// Reclaim in resources (`reclaimWithinCohort: Any`, docs/concepts/quotas-pools-and-fit.md):
/// the jobs to stop so that each claimant (a head of a queue that may reclaim, in admission
/// order) can be admitted within its queue's **nominal** quota on one of its pools.
///
/// - Only a claimant whose whole demand stays within its queue's nominal quota on the pool
///   takes anything back; victims come only from other queues of its cohort that borrow one of
///   the resources it needs on that pool (use more than their nominal quota), whole jobs
///   (gangs whole), the lowest priority first, then the most recently started (least work
///   lost), each having run the claimant's queue's `minRunSeconds`, within its `maxPerMinute`.
/// - Victims are taken one by one until the claimant fits the quota and the nodes; then any
///   victim no longer needed is given back: no victim beyond what the claimant needs (and none
///   at all when even every candidate would not make it fit). Besides that order, the same
///   with the victims on one node first, for the [`NODE_ORDERS`] nodes where the most of what
///   the claimant needs can be freed; the plan with the fewest victims is taken.
/// - Jobs already stopping for a queue count as freed (a pass does not take more for the same
///   need while they stop).
///
/// No cycle: a reclaim moves quota from a queue above its nominal quota to one that stays at or
/// below it, so a queue at or below its nominal quota is never a victim of a reclaim, and the
/// cohort's borrowed quota falls with each (`tests/resource_props.rs` checks it).
#[allow(clippy::too_many_arguments)]
pub fn reclaim(
    claimants: &[Claimant],
    holders: &[Holder],
    queues: &crate::queues::Queues,
    ledger: &crate::resources::quota::Ledger,
    nodes: &crate::resources::fit::Nodes,
    recent: &std::collections::BTreeMap<String, usize>,
    now_ms: i64,
) -> Vec<Victim> {
    let mut ledger = ledger.clone();
    let mut nodes = nodes.clone();
    let mut taken = vec![false; holders.len()];
    let free = |h: &Holder,
                ledger: &mut crate::resources::quota::Ledger,
                nodes: &mut crate::resources::fit::Nodes| {
        ledger.give(&h.queue, &h.pool, &h.demand.total());
        for &n in &h.nodes {
            nodes.release(n, &h.demand.per_member);
        }
    };
    // What is already leaving is freed.
    for (i, h) in holders.iter().enumerate() {
        if h.leaving_for.is_some() {
            taken[i] = true;
            free(h, &mut ledger, &mut nodes);
        }
    }
    let mut rate: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    let mut out = Vec::new();
    for c in claimants {
        let Some(policy) = queues.get(&c.queue) else {
            continue;
        };
        if !policy.preemption.reclaim_within_cohort {
            continue;
        }
        let left = rate.entry(c.queue.as_str()).or_insert_with(|| {
            policy
                .preemption
                .max_per_minute
                .saturating_sub(recent.get(&c.queue).copied().unwrap_or(0))
        });
        if *left == 0 {
            continue;
        }
        let total = c.demand.total();
        let fits = |ledger: &crate::resources::quota::Ledger,
                    nodes: &crate::resources::fit::Nodes,
                    pool: &str| {
            let Some(placement) = queues.pool(pool) else {
                return false;
            };
            ledger.admits(&c.queue, pool, &total).is_ok()
                && (c.demand.local
                    || c.demand
                        .constraints(&placement)
                        .is_some_and(|k| nodes.fits(&c.demand.per_member, c.demand.members, &k)))
        };
        let cohort = policy.quotas.cohort.clone();
        for (pool, _) in &policy.quotas.pools {
            if !ledger.within_nominal(&c.queue, pool, &total) {
                continue;
            }
            if fits(&ledger, &nodes, pool) {
                // Admissible as things are (or will be once what is leaving left): it takes its
                // share of the plan, so the next claimants see it taken.
                ledger.take(&c.queue, pool, &total);
                if let Some(k) = queues.pool(pool).and_then(|p| c.demand.constraints(&p))
                    && !c.demand.local
                {
                    nodes.place(&c.demand.per_member, c.demand.members, &k);
                }
                break;
            }
            let needed: Vec<&str> = total
                .iter()
                .filter(|(_, a)| *a > 0)
                .map(|(r, _)| r)
                .collect();
            let mut order: Vec<usize> = (0..holders.len())
                .filter(|&i| {
                    let h = &holders[i];
                    !taken[i]
                        && h.pool == *pool
                        && h.queue != c.queue
                        && cohort.is_some()
                        && queues.get(&h.queue).and_then(|p| p.quotas.cohort.clone()) == cohort
                        && h.running_since_ms
                            .is_some_and(|since| now_ms - since >= policy.preemption.min_run_ms)
                })
                .collect();
            order.sort_by(|&a, &b| {
                let (x, y) = (&holders[a], &holders[b]);
                x.priority
                    .cmp(&y.priority)
                    .then(y.running_since_ms.cmp(&x.running_since_ms))
                    .then(y.id.cmp(&x.id))
            });
            // Victims in `order`, one by one until the claimant fits; then any no longer
            // needed given back, latest first. None when even all of them would not do.
            let attempt = |order: &[usize]| {
                let (mut l, mut n) = (ledger.clone(), nodes.clone());
                let mut chosen: Vec<usize> = Vec::new();
                for &i in order {
                    if chosen.len() >= *left {
                        break;
                    }
                    let h = &holders[i];
                    // Only from a queue that still borrows what the claimant needs.
                    if !needed.iter().any(|r| l.borrowed(&h.queue, pool, r) > 0) {
                        continue;
                    }
                    free(h, &mut l, &mut n);
                    chosen.push(i);
                    if fits(&l, &n, pool) {
                        break;
                    }
                }
                if chosen.is_empty() || !fits(&l, &n, pool) {
                    return None;
                }
                for k in (0..chosen.len()).rev() {
                    let h = &holders[chosen[k]];
                    let (mut l2, mut n2) = (l.clone(), n.clone());
                    l2.take(&h.queue, pool, &h.demand.total());
                    for &node in &h.nodes {
                        n2.take_on(node, &h.demand.per_member);
                    }
                    if fits(&l2, &n2, pool) {
                        l = l2;
                        n = n2;
                        chosen.remove(k);
                    }
                }
                Some((chosen, l, n))
            };
            let mut best = attempt(&order);
            // A claimant that needs room on particular nodes (a large Pod, a gang) may need
            // victims gathered on them rather than the latest started anywhere: the same order
            // with the victims on one node first, for the nodes where the most can be freed
            // (at most NODE_ORDERS of them); the plan with the fewest victims wins, the plain
            // order on a tie.
            if !c.demand.local && best.as_ref().is_none_or(|b| b.0.len() > 1) {
                let mut freeable: std::collections::BTreeMap<usize, i64> =
                    std::collections::BTreeMap::new();
                for &i in &order {
                    for &node in &holders[i].nodes {
                        *freeable.entry(node).or_default() += needed
                            .iter()
                            .map(|r| holders[i].demand.per_member.get(r))
                            .sum::<i64>();
                    }
                }
                let mut ranked: Vec<(usize, i64)> = freeable.into_iter().collect();
                ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
                for (node, _) in ranked.into_iter().take(NODE_ORDERS) {
                    let (mut first, rest): (Vec<usize>, Vec<usize>) = order
                        .iter()
                        .partition(|&&i| holders[i].nodes.contains(&node));
                    first.extend(rest);
                    if let Some(plan) = attempt(&first)
                        && best.as_ref().is_none_or(|b| plan.0.len() < b.0.len())
                    {
                        best = Some(plan);
                    }
                }
            }
            let Some((chosen, mut l, n)) = best else {
                continue;
            };
            // The claimant takes what it needs in the plan; its victims leave.
            l.take(&c.queue, pool, &total);
            ledger = l;
            nodes = n;
            for &i in &chosen {
                taken[i] = true;
                *left -= 1;
                out.push(Victim {
                    id: holders[i].id,
                    by: c.queue.clone(),
                    within: false,
                });
            }
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(reclaim: bool, within: bool) -> Preemption {
        Preemption {
            reclaim_within_cohort: false,
            reclaim_share: reclaim,
            within_queue: within,
            min_run_ms: 1_000,
            max_per_minute: 100,
        }
    }

    fn running(ids: std::ops::Range<i64>, since: i64) -> Vec<Running> {
        ids.map(|id| Running {
            id,
            priority: 0,
            running_since_ms: Some(since + id),
            leaving_for: None,
        })
        .collect()
    }

    fn queue(name: &str, weight: u32, running: Vec<Running>, waiting: usize) -> QueueState {
        QueueState {
            name: name.into(),
            weight,
            max_running: None,
            policy: policy(true, false),
            held: running.len(),
            waiting: vec![0; waiting],
            running,
            recent: 0,
        }
    }

    #[test]
    fn shares_follow_the_weights_and_lend_what_a_queue_does_not_want() {
        assert_eq!(shares(8, &[(1, 8), (3, 8)]), vec![2.0, 6.0]);
        // B wants only 1: A gets the rest.
        assert_eq!(shares(8, &[(1, 8), (3, 1)]), vec![7.0, 1.0]);
        assert_eq!(shares(8, &[(1, 0), (3, 8)]), vec![0.0, 8.0]);
    }

    /// The case: A (weight 1) holds all 8, B (weight 3) arrives with 8: B takes 6, the
    /// most recently started of A.
    #[test]
    fn a_late_queue_takes_its_share_from_the_most_recently_started() {
        let a = queue("a", 1, running(1..9, 0), 0);
        let b = queue("b", 3, vec![], 8);
        let v = plan(&[a, b], 8, true, 100_000);
        let ids: Vec<i64> = v.iter().map(|v| v.id).collect();
        assert_eq!(ids, vec![8, 7, 6, 5, 4, 3]);
        assert!(v.iter().all(|v| v.by == "b" && !v.within));
    }

    #[test]
    fn nothing_is_taken_while_a_run_slot_is_free_or_preemption_is_off() {
        let a = queue("a", 1, running(1..8, 0), 0);
        let b = queue("b", 3, vec![], 8);
        assert!(plan(&[a.clone(), b.clone()], 8, false, 100_000).is_empty());
        let mut b = b;
        b.policy = Preemption::OFF;
        assert!(plan(&[a, b], 8, true, 100_000).is_empty());
    }

    #[test]
    fn a_job_that_just_started_or_is_stopping_is_not_taken_and_counts_for_its_claimant() {
        let mut a = queue("a", 1, running(1..9, 0), 0);
        // 1..=5 ran long enough; 6..=8 started 500 ms ago.
        for r in &mut a.running[5..] {
            r.running_since_ms = Some(99_500);
        }
        a.running[0].leaving_for = Some("b".into());
        let b = queue("b", 3, vec![], 8);
        let v = plan(&[a, b], 8, true, 100_000);
        let ids: Vec<i64> = v.iter().map(|v| v.id).collect();
        // One already stopping for b: 5 more, from those that ran long enough (2..=5), so 4.
        assert_eq!(ids, vec![5, 4, 3, 2]);
    }

    #[test]
    fn the_rate_limit_bounds_a_queue_s_preemptions() {
        let a = queue("a", 1, running(1..9, 0), 0);
        let mut b = queue("b", 3, vec![], 8);
        b.policy.max_per_minute = 3;
        b.recent = 1;
        assert_eq!(plan(&[a, b], 8, true, 100_000).len(), 2);
    }

    #[test]
    fn within_a_queue_a_higher_priority_takes_the_lowest() {
        let mut a = queue("a", 1, running(1..5, 0), 0);
        a.policy = policy(false, true);
        a.running[1].priority = -5;
        a.running[2].priority = 10;
        a.waiting = vec![5, 0];
        let v = plan(&[a], 4, true, 100_000);
        assert_eq!(
            v,
            vec![Victim {
                id: 2,
                by: "a".into(),
                within: true
            }]
        );
    }

    mod reclaim {
        use super::super::*;
        use crate::api::QueueingStrategy;
        use crate::queues::{Admits, QueuePolicy, Queues};
        use crate::resources::amount::{ONE, PODS};
        use crate::resources::fit::{NodeInfo, Nodes};
        use crate::resources::quota::{Ledger, QueueQuotas, Quota};
        use crate::resources::{Demand, Placement, Resources};
        use std::collections::{BTreeMap, BTreeSet};

        fn gpus(n: i64) -> Demand {
            let mut r = Resources::new();
            r.set("nvidia.com/gpu", n * ONE);
            r.set(PODS, ONE);
            Demand {
                members: 1,
                per_member: r,
                ..Default::default()
            }
        }

        fn team(nominal: i64, reclaims: bool) -> QueuePolicy {
            QueuePolicy {
                quotas: QueueQuotas {
                    cohort: Some("c".into()),
                    weight: 1,
                    pools: vec![(
                        "gpu".into(),
                        [(
                            "nvidia.com/gpu".to_string(),
                            Quota {
                                nominal: nominal * ONE,
                                ..Default::default()
                            },
                        )]
                        .into(),
                    )],
                },
                strategy: QueueingStrategy::BestEffortFIFO,
                weight: 1,
                max_running: None,
                max_launching: None,
                admits: Admits::All,
                preemption: Preemption {
                    reclaim_within_cohort: reclaims,
                    min_run_ms: 5_000,
                    ..Preemption::OFF
                },
            }
        }

        fn world(a: &QueuePolicy, b: &QueuePolicy) -> Queues {
            Queues::new(
                [
                    ("team-a".to_string(), a.clone()),
                    ("team-b".to_string(), b.clone()),
                ]
                .into(),
            )
            .with_pools(
                [(
                    "gpu".to_string(),
                    Placement {
                        pool: "gpu".into(),
                        ..Default::default()
                    },
                )]
                .into(),
            )
        }

        fn nodes(n: usize) -> Nodes {
            Nodes::new(
                (0..n)
                    .map(|i| {
                        let mut allocatable = Resources::new();
                        allocatable.set("nvidia.com/gpu", 8 * ONE);
                        allocatable.set(PODS, 110 * ONE);
                        NodeInfo {
                            name: format!("n{i}"),
                            allocatable,
                            ready: true,
                            ..Default::default()
                        }
                    })
                    .collect(),
            )
        }

        /// Holders of team-a placed on `nodes`, each `size` GPUs, started at `since + id`.
        fn holders(n: i64, size: i64, nodes: &mut Nodes) -> Vec<Holder> {
            (0..n)
                .map(|id| {
                    let d = gpus(size);
                    let placed = nodes
                        .place(&d.per_member, 1, &Default::default())
                        .expect("room for the holders");
                    holder(id, d, placed)
                })
                .collect()
        }

        /// Team-a's job `id` of demand `d` on `nodes`, started at `id`.
        fn holder(id: i64, d: Demand, nodes: Vec<usize>) -> Holder {
            Holder {
                id,
                queue: "team-a".into(),
                priority: 0,
                running_since_ms: Some(id),
                pool: "gpu".into(),
                demand: d,
                nodes,
                leaving_for: None,
            }
        }

        fn ledger(q: &Queues, holders: &[Holder]) -> Ledger {
            let mut l = Ledger::new(
                ["team-a", "team-b"]
                    .into_iter()
                    .map(|n| (n.to_string(), q.get(n).unwrap().quotas.clone()))
                    .collect(),
                BTreeMap::new(),
            );
            for h in holders {
                l.take(&h.queue, &h.pool, &h.demand.total());
            }
            l
        }

        /// Team-a's 16 1-GPU jobs alternate between the two nodes (as kube-scheduler spreads
        /// them); team-b wants one 8-GPU Pod: the 8 latest started free 4 GPUs on each node,
        /// which is no fit, so the victims are gathered on one node: exactly its 8 jobs.
        #[test]
        fn a_large_pod_takes_back_a_whole_node_not_the_latest_jobs_everywhere() {
            let (a, b) = (team(8, false), team(8, true));
            let q = world(&a, &b);
            let mut n = nodes(2);
            let h: Vec<Holder> = (0..16)
                .map(|id| {
                    let d = gpus(1);
                    let node = (id % 2) as usize;
                    n.take_on(node, &d.per_member);
                    holder(id, d, vec![node])
                })
                .collect();
            let l = ledger(&q, &h);
            let claimant = Claimant {
                id: 100,
                queue: "team-b".into(),
                demand: gpus(8),
            };
            let v = reclaim(&[claimant], &h, &q, &l, &n, &BTreeMap::new(), 1_000_000);
            let mut ids: Vec<i64> = v.iter().map(|v| v.id).collect();
            ids.sort();
            assert_eq!(ids.len(), 8, "{ids:?}");
            let on: BTreeSet<i64> = ids.iter().map(|id| id % 2).collect();
            assert_eq!(on.len(), 1, "victims on both nodes: {ids:?}");
        }

        /// Team-a (nominal 8) fills 16 GPUs with 1-GPU jobs, borrowing team-b's 8; team-b
        /// (nominal 8) wants 8 jobs of 1 GPU: exactly 8 victims, the most recently started
        /// first, all for team-b.
        #[test]
        fn a_queue_below_nominal_takes_back_exactly_what_it_needs() {
            let (a, b) = (team(8, false), team(8, true));
            let q = world(&a, &b);
            let mut n = nodes(2);
            let h = holders(16, 1, &mut n);
            let l = ledger(&q, &h);
            let claimants: Vec<Claimant> = (100..108)
                .map(|id| Claimant {
                    id,
                    queue: "team-b".into(),
                    demand: gpus(1),
                })
                .collect();
            let v = reclaim(&claimants, &h, &q, &l, &n, &BTreeMap::new(), 1_000_000);
            let ids: Vec<i64> = v.iter().map(|v| v.id).collect();
            assert_eq!(ids, vec![15, 14, 13, 12, 11, 10, 9, 8]);
            assert!(v.iter().all(|v| v.by == "team-b" && !v.within));
            // Not before minRunSeconds, not without the policy.
            assert!(reclaim(&claimants, &h, &q, &l, &n, &BTreeMap::new(), 10).is_empty());
            let q2 = world(&a, &team(8, false));
            assert!(reclaim(&claimants, &h, &q2, &l, &n, &BTreeMap::new(), 1_000_000).is_empty());
            // Once they are stopping, a later pass takes no more for the same need.
            let mut leaving = h.clone();
            for x in leaving.iter_mut().filter(|x| x.id >= 8) {
                x.leaving_for = Some("team-b".into());
            }
            assert!(
                reclaim(
                    &claimants,
                    &leaving,
                    &q,
                    &l,
                    &n,
                    &BTreeMap::new(),
                    1_000_000
                )
                .is_empty()
            );
        }

        /// With gangs of 8 GPUs as the holders, one 1-GPU claimant costs one whole gang, no more.
        #[test]
        fn victims_are_whole_and_no_more_than_needed() {
            let (a, b) = (team(8, false), team(8, true));
            let q = world(&a, &b);
            let mut n = nodes(2);
            let h = holders(2, 8, &mut n);
            let l = ledger(&q, &h);
            let c = [Claimant {
                id: 100,
                queue: "team-b".into(),
                demand: gpus(1),
            }];
            let v = reclaim(&c, &h, &q, &l, &n, &BTreeMap::new(), 1_000_000);
            assert_eq!(v.len(), 1);
            // Above its nominal quota, a claimant takes nothing back.
            let big = [Claimant {
                id: 101,
                queue: "team-b".into(),
                demand: gpus(9),
            }];
            assert!(reclaim(&big, &h, &q, &l, &n, &BTreeMap::new(), 1_000_000).is_empty());
            // A queue at or below its nominal quota is never a victim.
            let (a2, b2) = (team(16, false), team(8, true));
            let q2 = world(&a2, &b2);
            let l2 = ledger(&q2, &h);
            assert!(reclaim(&c, &h, &q2, &l2, &n, &BTreeMap::new(), 1_000_000).is_empty());
        }
    }
}
