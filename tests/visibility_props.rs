//! Property tests of the visibility API's queue (`src/visibility/view.rs`), over a real
//! in-memory [`Store`] and the real scheduler ([`scheduler::pass_queues`]).
//!
//! # The model
//!
//! Each case draws one to three ManagedJobQueues (weights 1..4, an optional `maxRunning`,
//! admitting every namespace or only some of three), some jobs already holding run slots (so
//! the queues start unequal), and 1..40 waiting jobs of random namespaces, priorities and
//! queues (sometimes a queue that does not exist). Then:
//!
//! 1. **positions are the scheduler's order**: the API's order of the waiting jobs
//!    ([`visibility::queue_from_store`]) is the order in which the scheduler then admits them
//!    when run slots free one at a time (the run cap raised by one, a pass, the admitted job
//!    running, again, until a pass admits nothing): the jobs it leads with are admitted exactly in
//!    that order, and the jobs it puts after them (their queue missing, refusing their namespace,
//!    at its `maxRunning`) are never admitted;
//! 2. **nothing of another namespace**: the answer cut for a caller who may see a random subset
//!    of the namespaces ([`view::restrict`]) holds only their jobs, in the same relative order,
//!    numbered 1..n, with counts that are exactly the jobs shown, and no operator-wide usage;
//! 3. every waiting job the API shows carries a reason, and the admissible ones an estimate.
//!
//! The runner uses a fixed seed (override with `PROPTEST_RNG_SEED`) and persists nothing.

use std::collections::{BTreeMap, BTreeSet};

use managed_jobs::api::{ManagedJobSpec, ScheduleState};
use managed_jobs::capacity::Caps;
use managed_jobs::lifecycle::{self, Workload};
use managed_jobs::queues::{Admits, QueuePolicy, Queues};
use managed_jobs::scheduler;
use managed_jobs::store::{Cas, Store};
use managed_jobs::visibility::{self, view};
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestCaseError};

const SEED: u64 = 0x7669_7369_6269_6c65;
const NAMESPACES: [&str; 3] = ["ns0", "ns1", "ns2"];
/// A queue some jobs name that does not exist.
const MISSING: &str = "late";
/// A launch cap no case reaches: only the run cap decides here.
const LAUNCH: usize = 1_000;

fn config(cases: u32) -> ProptestConfig {
    let base = ProptestConfig::with_cases(cases);
    ProptestConfig {
        rng_seed: match base.rng_seed {
            RngSeed::Random => RngSeed::Fixed(SEED),
            fixed => fixed,
        },
        failure_persistence: None,
        ..base
    }
}

fn policy_strategy() -> impl Strategy<Value = QueuePolicy> {
    (
        1u32..=4,
        prop::option::weighted(0.3, 1usize..=5),
        prop::option::weighted(0.3, prop::collection::btree_set(0usize..3, 1..=2)),
    )
        .prop_map(|(weight, max_running, only)| QueuePolicy {
            quotas: Default::default(),
            strategy: Default::default(),
            preemption: managed_jobs::queues::Preemption::OFF,
            weight,
            max_running,
            max_launching: None,
            admits: match only {
                None => Admits::All,
                Some(set) => Admits::Only(set.into_iter().map(|i| NAMESPACES[i].into()).collect()),
            },
        })
}

/// (namespace, priority, queue index: past the queues, the missing one).
fn job_strategy() -> impl Strategy<Value = (usize, i32, usize)> {
    (
        0usize..3,
        prop::sample::select(vec![-5, 0, 0, 10, 50]),
        0usize..4,
    )
}

struct Case {
    store: Store,
    queues: Queues,
    names: Vec<String>,
    run: usize,
    submitted: usize,
}

impl Case {
    fn new(policies: Vec<QueuePolicy>) -> Case {
        let policies: BTreeMap<String, QueuePolicy> = policies
            .into_iter()
            .enumerate()
            .map(|(i, p)| (format!("q{i}"), p))
            .collect();
        let mut store = Store::in_memory().unwrap();
        let mut settings = store.settings().unwrap();
        settings.caps = Some(Caps {
            launch: LAUNCH,
            run: 0,
        });
        store.set_settings(&settings).unwrap();
        Case {
            store,
            names: policies.keys().cloned().collect(),
            queues: Queues::new(policies),
            run: 0,
            submitted: 0,
        }
    }

    fn submit(&mut self, (ns, priority, queue): (usize, i32, usize)) {
        let queue = self.names.get(queue).map_or(MISSING, String::as_str);
        let n = self.submitted;
        self.submitted += 1;
        let spec = ManagedJobSpec {
            run: Some("true".into()),
            priority,
            queue: Some(queue.to_string()),
            ..Default::default()
        };
        self.store
            .upsert(&format!("u{n}"), NAMESPACES[ns], &format!("j{n}"), 1, &spec)
            .unwrap();
    }

    /// Raises the run cap by one and runs one pass; the jobs it admitted run at once (their
    /// launch slot freed). Returns their ids.
    fn one_more_slot(&mut self) -> Vec<i64> {
        self.run += 1;
        let caps = Caps {
            launch: LAUNCH,
            run: self.run,
        };
        let result = scheduler::pass_queues(&mut self.store, caps, &self.queues).unwrap();
        let mut ids = Vec::new();
        for r in result.started.iter().chain(&result.relaunched) {
            let row = self.store.get(r.id).unwrap();
            let t = lifecycle::running(&row, row.current_attempt(), Workload::Process(1));
            assert!(matches!(
                self.store.transition(r.id, &t).unwrap(),
                Cas::Applied(_)
            ));
            ids.push(r.id);
        }
        let mut settings = self.store.settings().unwrap();
        settings.caps = Some(caps);
        self.store.set_settings(&settings).unwrap();
        ids
    }
}

fn ids_of(q: &view::JobQueue) -> Vec<i64> {
    q.waiting.iter().map(|j| j.job_id).collect()
}

fn check(
    policies: Vec<QueuePolicy>,
    running: Vec<(usize, i32, usize)>,
    waiting: Vec<(usize, i32, usize)>,
    visible: BTreeSet<usize>,
) -> Result<(), TestCaseError> {
    let mut case = Case::new(policies);
    // Jobs that hold run slots before the others arrive: admitted one slot at a time.
    for j in running {
        case.submit(j);
    }
    for _ in 0..case.submitted {
        case.one_more_slot();
    }
    // The caps full again: the run cap is what is held now.
    let held = case.store.slot_usage().unwrap().alive;
    case.run = held;
    for j in waiting {
        case.submit(j);
    }
    let mut settings = case.store.settings().unwrap();
    settings.caps = Some(Caps {
        launch: LAUNCH,
        run: held,
    });
    case.store.set_settings(&settings).unwrap();
    let all = visibility::queue_from_store(&mut case.store, &case.queues).unwrap();
    let order = ids_of(&all);
    let waiting_now: BTreeSet<i64> = case
        .store
        .all()
        .unwrap()
        .iter()
        .filter(|r| r.schedule_state == ScheduleState::Waiting)
        .map(|r| r.id)
        .collect();
    prop_assert_eq!(
        order.iter().copied().collect::<BTreeSet<_>>(),
        waiting_now.clone()
    );
    for (i, j) in all.waiting.iter().enumerate() {
        prop_assert_eq!(j.position, i + 1);
        prop_assert!(!j.reason.is_empty());
    }

    // 1. The scheduler admits them in that order, one slot at a time.
    let mut admitted = Vec::new();
    loop {
        let ids = case.one_more_slot();
        prop_assert!(ids.len() <= 1, "one slot, one admission: {:?}", ids);
        match ids.first() {
            Some(id) => admitted.push(*id),
            None => break,
        }
    }
    prop_assert_eq!(
        &admitted[..],
        &order[..admitted.len()],
        "admitted {:?}, the API said {:?}",
        admitted,
        order
    );
    for id in &order[admitted.len()..] {
        let j = all.waiting.iter().find(|j| j.job_id == *id).unwrap();
        prop_assert!(
            j.estimated_start.in_seconds.is_none(),
            "job {} is never admitted, yet has an estimate: {:?}",
            id,
            j
        );
    }

    // 2. A caller of some namespaces sees only theirs, in the same order, counted exactly.
    let shown: BTreeSet<String> = visible.iter().map(|i| NAMESPACES[*i].to_string()).collect();
    let cut = view::restrict(&all, Some(&shown), None, None);
    let expected: Vec<i64> = all
        .waiting
        .iter()
        .filter(|j| shown.contains(&j.namespace))
        .map(|j| j.job_id)
        .collect();
    prop_assert_eq!(ids_of(&cut), expected);
    prop_assert!(cut.usage.is_none());
    for (i, j) in cut.waiting.iter().enumerate() {
        prop_assert_eq!(j.position, i + 1);
    }
    for list_ns in cut
        .waiting
        .iter()
        .map(|j| &j.namespace)
        .chain(cut.live.iter().map(|j| &j.namespace))
        .chain(cut.counts.iter().map(|c| &c.namespace))
    {
        prop_assert!(shown.contains(list_ns), "{} is not the caller's", list_ns);
    }
    for c in &cut.counts {
        let waiting = cut
            .waiting
            .iter()
            .filter(|j| j.namespace == c.namespace)
            .count();
        let live = cut
            .live
            .iter()
            .filter(|j| j.namespace == c.namespace)
            .count();
        prop_assert_eq!((c.waiting, c.holding_run_slots), (waiting, live));
    }
    prop_assert_eq!(cut.waiting_total, cut.waiting.len());
    let limited = view::restrict(&all, Some(&shown), None, Some(2));
    prop_assert_eq!(limited.waiting_total, cut.waiting.len());
    prop_assert!(limited.waiting.len() <= 2);
    Ok(())
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn the_apis_order_is_the_schedulers_and_each_caller_sees_only_its_namespaces(
        policies in prop::collection::vec(policy_strategy(), 1..=3),
        running in prop::collection::vec(job_strategy(), 0..6),
        waiting in prop::collection::vec(job_strategy(), 1..40),
        visible in prop::collection::btree_set(0usize..3, 0..=3),
    ) {
        check(policies, running, waiting, visible)?;
    }
}
