//! Properties of the preemption planner (`managed_jobs::preemption::plan`, issue 32) over random
//! queues, weights, priorities, start times and policies:
//!
//! - no victim from a queue at or below its share, and no queue pushed below its share;
//! - never more victims for a queue than its shortfall (its share not held, its waiting jobs);
//! - no victim that ran less than the taking queue's `minRunSeconds`, none already stopping,
//!   none twice; each queue within its rate limit;
//! - with preemption off, or a free run slot, nothing is stopped;
//! - repeated passes (victims requeued with their budgets, freed slots given in share order by the
//!   scheduler's own `plan_queues`) converge: every queue that reclaims and has waiting jobs ends
//!   holding at least `floor(share)` unless every other queue is at its share, within one round
//!   per victim's grace (rounds bounded by the victims).

use managed_jobs::capacity::{Caps, SlotUsage};
use managed_jobs::preemption::{QueueState, Running, Victim, plan, shares};
use managed_jobs::queues::{Admits, Preemption, QueueLoad, QueuePolicy};
use managed_jobs::scheduler::{Candidate, QueueView, plan_queues};
use proptest::prelude::*;

const EPS: f64 = 1e-9;

fn policy(reclaim: bool, within: bool, min_run_ms: i64, max_per_minute: usize) -> Preemption {
    Preemption {
        reclaim_within_cohort: false,
        reclaim_share: reclaim,
        within_queue: within,
        min_run_ms,
        max_per_minute,
    }
}

prop_compose! {
    fn arb_queue(i: usize)(
        weight in 1u32..5,
        running in prop::collection::vec((-2i32..3, 0i64..100_000, any::<bool>()), 0..8),
        waiting in prop::collection::vec(-2i32..3, 0..8),
        reclaim in any::<bool>(),
        within in any::<bool>(),
        min_run in prop::sample::select(vec![0i64, 1_000, 30_000]),
        rate in 1usize..12,
        recent in 0usize..4,
    ) -> QueueState {
        let mut waiting = waiting;
        waiting.sort_by(|a, b| b.cmp(a));
        QueueState {
            name: format!("q{i}"),
            weight,
            max_running: None,
            policy: policy(reclaim, within, min_run, rate),
            held: running.len(),
            waiting,
            running: running
                .into_iter()
                .enumerate()
                .map(|(k, (priority, since, started))| Running {
                    id: (i * 100 + k) as i64,
                    priority,
                    running_since_ms: started.then_some(since),
                    leaving_for: None,
                })
                .collect(),
            recent,
        }
    }
}

fn arb_queues() -> impl Strategy<Value = Vec<QueueState>> {
    (arb_queue(0), arb_queue(1), arb_queue(2)).prop_map(|(a, b, c)| vec![a, b, c])
}

const NOW: i64 = 100_000;

fn held(q: &QueueState) -> usize {
    q.held - q.running.iter().filter(|r| r.leaving_for.is_some()).count()
}

fn queue_shares(queues: &[QueueState], cap: usize) -> Vec<f64> {
    let wants: Vec<(u32, usize)> = queues
        .iter()
        .map(|q| (q.weight, held(q) + q.waiting.len()))
        .collect();
    shares(cap, &wants)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn victims_follow_the_rules(queues in arb_queues()) {
        let cap: usize = queues.iter().map(|q| q.held).sum();
        prop_assume!(cap > 0);
        let share = queue_shares(&queues, cap);
        let victims = plan(&queues, cap, true, NOW);
        let find = |v: &Victim| {
            queues.iter().enumerate().find_map(|(i, q)| {
                q.running.iter().find(|r| r.id == v.id).map(|r| (i, r))
            })
        };
        let mut seen = std::collections::BTreeSet::new();
        let mut lost = vec![0usize; queues.len()];
        let mut gained = vec![0usize; queues.len()];
        let mut caused = vec![0usize; queues.len()];
        for v in &victims {
            prop_assert!(seen.insert(v.id), "{} taken twice", v.id);
            let (i, r) = find(v).expect("a victim is a running job");
            let j = queues.iter().position(|q| q.name == v.by).unwrap();
            let taker = &queues[j];
            prop_assert!(r.leaving_for.is_none());
            let ran = r.running_since_ms.map(|s| NOW - s);
            prop_assert!(ran.is_some_and(|ran| ran >= taker.policy.min_run_ms),
                "victim {} ran {ran:?}, less than {} ms", v.id, taker.policy.min_run_ms);
            caused[j] += 1;
            if v.within {
                prop_assert_eq!(i, j);
                prop_assert!(taker.policy.within_queue);
                // A higher priority waits in its queue.
                prop_assert!(taker.waiting.iter().any(|&p| p > r.priority));
            } else {
                prop_assert!(i != j);
                prop_assert!(taker.policy.reclaim_share);
                prop_assert!(held(&queues[i]) as f64 > share[i] + EPS,
                    "victim from {} at or below its share {}", queues[i].name, share[i]);
                lost[i] += 1;
                gained[j] += 1;
            }
        }
        for (i, q) in queues.iter().enumerate() {
            prop_assert!(lost[i] == 0 || held(q) as f64 - lost[i] as f64 >= share[i] - EPS,
                "{} pushed below its share", q.name);
            let shortfall = ((share[i] + EPS).floor() as usize).saturating_sub(held(q));
            prop_assert!(gained[i] <= shortfall.min(q.waiting.len()),
                "{} got {} victims for a shortfall of {shortfall}", q.name, gained[i]);
            prop_assert!(caused[i] + q.recent <= q.policy.max_per_minute.max(q.recent));
        }
        // With a free slot, or every queue's preemption off, nothing.
        prop_assert!(plan(&queues, cap + 1, false, NOW).is_empty());
        let off: Vec<QueueState> = queues
            .iter()
            .cloned()
            .map(|mut q| { q.policy = Preemption::OFF; q })
            .collect();
        prop_assert!(plan(&off, cap, true, NOW).is_empty());
    }

    /// Passes repeated until quiet: victims go back to their queue's waiting jobs (their budgets
    /// are the lifecycle's, unit-tested), freed slots go out in share order, time moves past
    /// every minRunSeconds between rounds. Every queue that reclaims and waits ends with at
    /// least floor(share), unless no other queue is above its share.
    #[test]
    fn shares_converge_to_the_weights(
        weights in prop::collection::vec(1u32..5, 2..4),
        first in 0usize..3,
        cap in 2usize..12,
    ) {
        let n = weights.len();
        let first = first % n;
        // `first` holds every slot; every queue has plenty waiting.
        let mut running: Vec<Vec<Running>> = vec![Vec::new(); n];
        let mut next_id = 0i64;
        for k in 0..cap {
            running[first].push(Running { id: next_id, priority: 0, running_since_ms: Some(k as i64), leaving_for: None });
            next_id += 1;
        }
        let waiting = cap * 2;
        let mut now = 1_000_000i64;
        let mut rounds = 0;
        let mut preemptions = 0;
        loop {
            let queues: Vec<QueueState> = (0..n)
                .map(|i| QueueState {
                    name: format!("q{i}"),
                    weight: weights[i],
                    max_running: None,
                    policy: policy(true, false, 1_000, 1_000),
                    held: running[i].len(),
                    waiting: vec![0; waiting],
                    running: running[i].clone(),
                    recent: 0,
                })
                .collect();
            let victims = plan(&queues, cap, true, now);
            if victims.is_empty() {
                let share = queue_shares(&queues, cap);
                for i in 0..n {
                    let others_above = (0..n).any(|d| d != i && running[d].len() as f64 - 1.0 >= share[d] - EPS);
                    prop_assert!(
                        running[i].len() >= (share[i] + EPS).floor() as usize || !others_above,
                        "q{i} holds {} of its share {} after {rounds} rounds ({preemptions} preemptions)",
                        running[i].len(), share[i]
                    );
                }
                break;
            }
            rounds += 1;
            preemptions += victims.len();
            prop_assert!(preemptions <= cap, "{preemptions} preemptions for a run cap of {cap}");
            // The victims stop (one grace) and their slots are freed.
            for v in &victims {
                for r in running.iter_mut() {
                    r.retain(|j| j.id != v.id);
                }
            }
            now += 2_000;
            // The scheduler's pass gives the freed slots in share order.
            let alive: usize = running.iter().map(Vec::len).sum();
            let views: Vec<QueueView> = (0..n)
                .map(|i| QueueView {
                    name: format!("q{i}"),
                    policy: Some(QueuePolicy {
 quotas: Default::default(),
 strategy: Default::default(),
                        weight: weights[i],
                        max_running: None,
                        max_launching: None,
                        admits: Admits::All,
                        preemption: policy(true, false, 1_000, 1_000),
                    }),
                    load: QueueLoad { launching: 0, alive: running[i].len() },
                    relaunches: vec![],
                    new_jobs: (0..waiting).map(|k| Candidate::new(10_000 + (i * 1000 + k) as i64, 0)).collect(),
                })
                .collect();
            let usage = SlotUsage { launching: 0, alive, ..Default::default() };
            for a in plan_queues(usage, Caps { launch: cap, run: cap }, &views) {
                let i = ((a.id - 10_000) / 1000) as usize;
                running[i].push(Running { id: next_id, priority: 0, running_since_ms: Some(now), leaving_for: None });
                next_id += 1;
            }
            now += 2_000;
            prop_assert!(rounds <= cap + 1);
        }
    }
}
