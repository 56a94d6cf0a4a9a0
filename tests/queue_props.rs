//! Property tests of queues for teams (docs/design.md#queues): the scheduler model of
//! `tests/scheduler_props.rs` with several `ManagedJobQueue`s, driven through the real
//! [`scheduler::pass_queues`] over an in-memory [`Store`] (its indexed queue queries included).
//!
//! # The model
//!
//! Each case draws caps (`launch` 1..4, `run` 1..8), one to four queues (random weights 1..5,
//! optional `maxRunning` and `maxLaunching`, admitting every namespace or only some of three),
//! and a random sequence of operations: `Submit` (a job of a random namespace, priority and
//! queue, sometimes a queue that does not exist), `LaunchDone` (a Launching job runs), `Finish`
//! (a running job ends), `Preempt` (a running job's workload is lost: it relaunches inside its
//! queue), `ApplyMissing` (the missing queue is applied, as GitOps may after its jobs). After
//! every operation one pass runs, and these invariants are asserted:
//!
//! 1. caps: `count(Launching) <= launch`, `count(holding a run slot) <= run`; per queue:
//!    holding a run slot `<= maxRunning`, Launching `<= maxLaunching`;
//! 2. never admitted: a job whose queue does not exist, or does not admit its namespace, is never
//!    admitted (over the whole run); after every pass every waiting job, however many wait
//!    (issue 43: only the first 8 of a queue were told), is told the reason that holds now:
//!    its queue's own first (missing, namespace refused, at `maxRunning`, at `maxLaunching`),
//!    then the run cap (`RunCapReached`, or `ShareUsed` for its share) or the launch cap; and
//!    all the waiting jobs of one queue and namespace are told the same sentence;
//! 3. FIFO within a priority within a queue: every job a pass admitted ranks (priority desc, id
//!    asc) before every admissible job of the same queue it left waiting;
//! 4. work conservation: an admissible job (its queue exists, admits its namespace, and is
//!    below its `maxRunning` and `maxLaunching`) is left waiting only when the launch or the
//!    run cap is reached; a relaunch only when no launch slot is free or its queue is at its
//!    `maxLaunching`;
//! 5. liveness: draining (every running job finishes, passes keep running) admits every
//!    admissible job; the others are still waiting.
//!
//! And [`two_backlogged_queues_converge_to_their_weights_within_one_slot`]: two queues of random
//! weights (1 and 3 among them), the first alone filling the run cap, then both backlogged,
//! jobs ending in random order: once every job that was running when the second queue arrived
//! has ended, every time the run cap is full each queue holds its weighted share of the run cap
//! within one slot (`|held - run * weight / weights| < 1`).
//!
//! The runner uses a fixed seed (override with `PROPTEST_RNG_SEED`) and persists nothing.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use managed_jobs::api::{JobPhase, ManagedJobSpec, ScheduleState, WaitReason};
use managed_jobs::capacity::Caps;
use managed_jobs::lifecycle::{self, FailureReason, JobRow, Outcome, Workload};
use managed_jobs::queues::{Admits, QueuePolicy, Queues};
use managed_jobs::scheduler;
use managed_jobs::store::{Cas, Store};
use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestCaseError};

type TestResult = Result<(), TestCaseError>;

const SEED: u64 = 0x7175_6575_6573_2121;

/// The namespaces jobs come from.
const NAMESPACES: [&str; 3] = ["ns0", "ns1", "ns2"];

/// The queue some jobs name before it exists.
const MISSING: &str = "late";

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

fn spec(priority: i32, queue: &str) -> ManagedJobSpec {
    ManagedJobSpec {
        run: Some("true".into()),
        priority,
        queue: Some(queue.to_string()),
        ..Default::default()
    }
}

fn holds_run_slot(s: ScheduleState) -> bool {
    matches!(
        s,
        ScheduleState::Launching | ScheduleState::Alive | ScheduleState::AliveWaiting
    )
}

fn policy_strategy() -> impl Strategy<Value = QueuePolicy> {
    (
        1u32..=5,
        prop::option::weighted(0.4, 1usize..=4),
        prop::option::weighted(0.3, 1usize..=3),
        prop::option::weighted(0.4, prop::collection::btree_set(0usize..3, 0..=2)),
    )
        .prop_map(|(weight, max_running, max_launching, only)| QueuePolicy {
            quotas: Default::default(),
            strategy: Default::default(),
            preemption: managed_jobs::queues::Preemption::OFF,
            weight,
            max_running,
            max_launching,
            admits: match only {
                None => Admits::All,
                Some(set) => Admits::Only(set.into_iter().map(|i| NAMESPACES[i].into()).collect()),
            },
        })
}

#[derive(Clone, Debug)]
enum Op {
    /// A job of namespace `ns`, `priority`, in queue `queue` (an index; past the queues: the
    /// missing one).
    Submit {
        ns: usize,
        priority: i32,
        queue: usize,
    },
    LaunchDone(usize),
    Finish(usize),
    Preempt(usize),
    ApplyMissing,
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..3, -1i32..=1, 0usize..5)
            .prop_map(|(ns, priority, queue)| Op::Submit { ns, priority, queue }),
        4 => any::<usize>().prop_map(Op::LaunchDone),
        4 => any::<usize>().prop_map(Op::Finish),
        1 => any::<usize>().prop_map(Op::Preempt),
        1 => Just(Op::ApplyMissing),
    ]
}

struct Model {
    store: Store,
    caps: Caps,
    queues: Queues,
    /// The queue objects (the missing one joins them on `ApplyMissing`).
    policies: BTreeMap<String, QueuePolicy>,
    names: Vec<String>,
    /// Every job ever admitted.
    admitted: HashSet<i64>,
    submitted: usize,
}

impl Model {
    fn new(caps: Caps, policies: Vec<QueuePolicy>) -> Model {
        let policies: BTreeMap<String, QueuePolicy> = policies
            .into_iter()
            .enumerate()
            .map(|(i, p)| (format!("q{i}"), p))
            .collect();
        let names = policies.keys().cloned().collect();
        Model {
            store: Store::in_memory().unwrap(),
            caps,
            queues: Queues::new(policies.clone()),
            policies,
            names,
            admitted: HashSet::new(),
            submitted: 0,
        }
    }

    fn rows(&self) -> Vec<JobRow> {
        self.store.all().unwrap()
    }

    /// The `k`-th (mod their number) live job (holding a run slot) matching `f`.
    fn pick(&self, k: usize, f: impl Fn(&JobRow) -> bool) -> Option<JobRow> {
        let rows: Vec<JobRow> = self
            .store
            .live_jobs()
            .unwrap()
            .into_iter()
            .filter(|r| f(r))
            .collect();
        (!rows.is_empty()).then(|| rows[k % rows.len()].clone())
    }

    fn cas(&mut self, id: i64, t: &lifecycle::Transition) -> TestResult {
        let applied = matches!(self.store.transition(id, t).unwrap(), Cas::Applied(_));
        prop_assert!(applied, "job {}: transition refused", id);
        Ok(())
    }

    /// Admissible now: its queue exists and admits its namespace.
    fn admissible(&self, r: &JobRow) -> bool {
        self.queues
            .get(&r.queue)
            .is_some_and(|p| p.admits.admits(&r.namespace))
    }

    fn apply(&mut self, op: &Op) -> TestResult {
        match *op {
            Op::Submit {
                ns,
                priority,
                queue,
            } => {
                let queue = self.names.get(queue).map_or(MISSING, String::as_str);
                let n = self.submitted;
                self.submitted += 1;
                self.store
                    .upsert(
                        &format!("u{n}"),
                        NAMESPACES[ns],
                        &format!("j{n}"),
                        1,
                        &spec(priority, queue),
                    )
                    .unwrap();
            }
            Op::LaunchDone(k) => {
                if let Some(r) = self.pick(k, |r| r.schedule_state == ScheduleState::Launching) {
                    let t = lifecycle::running(
                        &r,
                        r.current_attempt(),
                        Workload::Process(10_000 + r.id as i32),
                    );
                    self.cas(r.id, &t)?;
                }
            }
            Op::Finish(k) => {
                if let Some(r) = self.pick(k, |r| r.schedule_state == ScheduleState::Alive) {
                    let t = lifecycle::after_outcome(
                        &r,
                        r.current_attempt(),
                        &Outcome::Succeeded,
                        lifecycle::now_ms(),
                        Duration::ZERO,
                    );
                    self.cas(r.id, &t)?;
                    prop_assert_eq!(self.store.get(r.id).unwrap().phase, JobPhase::Succeeded);
                }
            }
            Op::Preempt(k) => {
                if let Some(r) = self.pick(k, |r| {
                    r.schedule_state == ScheduleState::Alive && r.recovery_count == 0
                }) {
                    let lost = Outcome::lost("preempted", "Evicted");
                    let t = lifecycle::after_outcome(
                        &r,
                        r.current_attempt(),
                        &lost,
                        lifecycle::now_ms(),
                        Duration::ZERO,
                    );
                    self.cas(r.id, &t)?;
                }
            }
            Op::ApplyMissing => {
                self.policies
                    .entry(MISSING.to_string())
                    .or_insert_with(QueuePolicy::implicit_default);
                self.queues = Queues::new(self.policies.clone());
            }
        }
        Ok(())
    }

    /// One pass, no invariant checked (the convergence property checks its own).
    fn pass_only(&mut self) {
        scheduler::pass_queues(&mut self.store, self.caps, &self.queues).unwrap();
    }

    /// One pass, then invariants 1 to 4.
    fn pass(&mut self) -> TestResult {
        let before = self.rows();
        let result = scheduler::pass_queues(&mut self.store, self.caps, &self.queues).unwrap();
        let admitted: BTreeSet<i64> = result
            .started
            .iter()
            .chain(&result.relaunched)
            .map(|r| r.id)
            .collect();
        let rows = self.rows();
        // 1. Caps, and each queue's limits.
        let launching = rows
            .iter()
            .filter(|r| r.schedule_state == ScheduleState::Launching)
            .count();
        let alive = rows
            .iter()
            .filter(|r| holds_run_slot(r.schedule_state))
            .count();
        prop_assert!(launching <= self.caps.launch, "launch cap");
        prop_assert!(alive <= self.caps.run, "run cap");
        let mut per_queue: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
        for r in &rows {
            let e = per_queue.entry(r.queue.as_str()).or_default();
            e.0 += usize::from(r.schedule_state == ScheduleState::Launching);
            e.1 += usize::from(holds_run_slot(r.schedule_state));
        }
        for (q, (l, a)) in &per_queue {
            if let Some(p) = self.queues.get(q) {
                // A relaunch holds its run slot already: only new admissions are bounded by
                // maxRunning, so a queue can exceed it only if it did before the pass.
                if let Some(m) = p.max_running {
                    let was = before
                        .iter()
                        .filter(|r| r.queue == *q && holds_run_slot(r.schedule_state))
                        .count();
                    prop_assert!(
                        *a <= m.max(was),
                        "queue {} holds {} run slots, maxRunning {}",
                        q,
                        a,
                        m
                    );
                }
                if let Some(m) = p.max_launching {
                    prop_assert!(*l <= m, "queue {} has {} launching, max {}", q, l, m);
                }
            }
        }
        // 2. Never admitted without an admitting queue; the reason told names it.
        for r in &rows {
            if admitted.contains(&r.id) {
                prop_assert!(self.admissible(r), "job {} admitted in {}", r.id, r.queue);
                self.admitted.insert(r.id);
            }
            if r.schedule_state == ScheduleState::Waiting && !self.admissible(r) {
                prop_assert!(!self.admitted.contains(&r.id));
                let expected = if self.queues.get(&r.queue).is_none() {
                    WaitReason::QueueMissing
                } else {
                    WaitReason::NamespaceNotAdmitted
                };
                prop_assert_eq!(r.wait_reason, Some(expected), "job {}: {}", r.id, r.message);
            }
        }
        // 2b. Every waiting job told the reason that holds now, the same within its group.
        let mut said: BTreeMap<(&str, &str), &str> = BTreeMap::new();
        for r in rows
            .iter()
            .filter(|r| r.schedule_state == ScheduleState::Waiting && self.admissible(r))
        {
            let p = self.queues.get(&r.queue).unwrap();
            let (l, a) = per_queue.get(r.queue.as_str()).copied().unwrap_or_default();
            let told = r.wait_reason;
            let ok = if p.max_running.is_some_and(|m| a >= m) {
                told == Some(WaitReason::QueueMaxRunning)
            } else if p.max_launching.is_some_and(|m| l >= m) {
                told == Some(WaitReason::QueueMaxLaunching)
            } else if alive >= self.caps.run {
                matches!(
                    told,
                    Some(WaitReason::RunCapReached | WaitReason::ShareUsed)
                )
            } else {
                told == Some(WaitReason::LaunchCapReached)
            };
            prop_assert!(
                ok,
                "job {} of queue {} told {:?} ({}); queue holds {} launching, {} run slots",
                r.id,
                r.queue,
                told,
                r.message,
                l,
                a
            );
            let group = said
                .entry((r.queue.as_str(), r.namespace.as_str()))
                .or_insert(r.message.as_str());
            prop_assert_eq!(*group, r.message.as_str(), "job {} of its group", r.id);
        }
        // 3. FIFO within a priority within a queue.
        let rank = |r: &JobRow| (-r.priority, r.id);
        for a in rows.iter().filter(|r| {
            admitted.contains(&r.id)
                && before
                    .iter()
                    .any(|b| b.id == r.id && b.schedule_state == ScheduleState::Waiting)
        }) {
            for w in rows.iter().filter(|r| {
                r.schedule_state == ScheduleState::Waiting
                    && r.queue == a.queue
                    && self.admissible(r)
            }) {
                prop_assert!(
                    rank(a) < rank(w),
                    "queue {}: job {} (priority {}) admitted before job {} (priority {})",
                    a.queue,
                    a.id,
                    a.priority,
                    w.id,
                    w.priority
                );
            }
        }
        // 4. Work conservation.
        let room = |q: &str, relaunch: bool| {
            let p = self.queues.get(q).unwrap();
            let (l, a) = per_queue.get(q).copied().unwrap_or_default();
            p.max_launching.is_none_or(|m| l < m)
                && (relaunch || p.max_running.is_none_or(|m| a < m))
        };
        for r in &rows {
            if r.schedule_state == ScheduleState::Waiting
                && self.admissible(r)
                && room(&r.queue, false)
            {
                prop_assert!(
                    launching >= self.caps.launch || alive >= self.caps.run,
                    "job {} of queue {} waits with slots free ({} launching, {} alive, caps {:?})",
                    r.id,
                    r.queue,
                    launching,
                    alive,
                    self.caps
                );
            }
            if r.schedule_state == ScheduleState::AliveWaiting
                && r.backoff_until_ms.is_none_or(|t| t <= lifecycle::now_ms())
                && room(&r.queue, true)
            {
                prop_assert!(
                    launching >= self.caps.launch,
                    "relaunch {} waits with a launch slot free",
                    r.id
                );
            }
        }
        Ok(())
    }

    /// 5. Every running job finishes, passes keep running: every admissible job is admitted.
    fn drain(&mut self) -> TestResult {
        for _ in 0..10_000 {
            let live: Vec<JobRow> = self
                .rows()
                .into_iter()
                .filter(|r| holds_run_slot(r.schedule_state))
                .collect();
            if live.is_empty() {
                break;
            }
            for r in live {
                match r.schedule_state {
                    ScheduleState::Launching => {
                        let t = lifecycle::running(
                            &r,
                            r.current_attempt(),
                            Workload::Process(10_000 + r.id as i32),
                        );
                        self.cas(r.id, &t)?;
                    }
                    ScheduleState::Alive => {
                        let t = lifecycle::after_outcome(
                            &r,
                            r.current_attempt(),
                            &Outcome::Succeeded,
                            lifecycle::now_ms(),
                            Duration::ZERO,
                        );
                        self.cas(r.id, &t)?;
                    }
                    _ => {}
                }
            }
            self.pass()?;
        }
        for r in self.rows() {
            if self.admissible(&r) {
                prop_assert!(
                    r.schedule_state == ScheduleState::Done,
                    "admissible job {} of queue {} never admitted: {:?}",
                    r.id,
                    r.queue,
                    r.schedule_state
                );
            } else {
                prop_assert_eq!(r.schedule_state, ScheduleState::Waiting);
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn queues_keep_their_limits_fifo_and_work_conservation(
        launch in 1usize..=4,
        run in 1usize..=8,
        policies in prop::collection::vec(policy_strategy(), 1..=4),
        ops in prop::collection::vec(op_strategy(), 1..120),
    ) {
        let mut m = Model::new(Caps { launch, run }, policies);
        for op in &ops {
            m.apply(op)?;
            m.pass()?;
        }
        m.drain()?;
    }
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn two_backlogged_queues_converge_to_their_weights_within_one_slot(
        weights in prop_oneof![Just((1u32, 3u32)), (1u32..=5, 1u32..=5)],
        run in 2usize..=12,
        launch_less in 0usize..3,
        picks in prop::collection::vec(any::<usize>(), 100),
    ) {
        let (w1, w2) = weights;
        let launch = run.saturating_sub(launch_less).max(1);
        let policy = |weight| QueuePolicy { weight, ..QueuePolicy::implicit_default() };
        let mut m = Model::new(Caps { launch, run }, vec![policy(w1), policy(w2)]);
        let submit = |m: &mut Model, queue: usize, n: usize| {
            for _ in 0..n {
                m.apply(&Op::Submit { ns: 0, priority: 0, queue }).unwrap();
            }
        };
        // The first queue alone takes every run slot (its share is every slot while alone).
        submit(&mut m, 0, 120);
        for _ in 0..=run {
            m.pass_only();
            m.apply(&Op::LaunchDone(0))?;
            for k in 0..run {
                m.apply(&Op::LaunchDone(k))?;
            }
        }
        m.pass_only();
        let held = |m: &Model| {
            let mut h = [0usize; 2];
            for r in m.store.live_jobs().unwrap() {
                h[usize::from(r.queue == "q1")] += 1;
            }
            h
        };
        prop_assert_eq!(held(&m), [run, 0]);
        // The second team arrives: nothing is preempted; each freed slot goes to the lowest
        // held / weight.
        submit(&mut m, 1, 120);
        m.pass_only();
        let mut before: HashSet<i64> = m.store.live_jobs().unwrap().iter().map(|r| r.id).collect();
        let total = u64::from(w1 + w2);
        let mut checked = 0;
        for k in picks {
            // Every launch completes, then one running job (a random one) ends.
            while m.pick(0, |r| r.schedule_state == ScheduleState::Launching).is_some() {
                m.apply(&Op::LaunchDone(0))?;
            }
            if m.pick(0, |r| r.schedule_state == ScheduleState::Alive).is_none() {
                break;
            }
            m.apply(&Op::Finish(k))?;
            m.pass_only();
            before.retain(|id| holds_run_slot(m.store.get(*id).unwrap().schedule_state));
            let h = held(&m);
            if !before.is_empty() || h[0] + h[1] < run {
                continue;
            }
            // Both still backlogged, the run cap full: within one slot of the weighted shares.
            for (i, w) in [(0, w1), (1, w2)] {
                let ideal = run as u64 * u64::from(w);
                let got = h[i] as u64 * total;
                prop_assert!(
                    got.abs_diff(ideal) < total,
                    "weights {}:{} run cap {}: held {:?}",
                    w1,
                    w2,
                    run,
                    h
                );
            }
            checked += 1;
        }
        prop_assert!(checked > 0, "never converged: held {:?}", held(&m));
    }
}

/// A queue that admits only `ns0`: its other jobs wait, told why, while its `ns0` jobs run; a
/// launch the executor refuses ([`lifecycle::fail`]) frees its slots like any end.
#[test]
fn a_refused_namespace_waits_forever_while_its_queue_runs_others() {
    let only_a = QueuePolicy {
        quotas: Default::default(),
        strategy: Default::default(),
        weight: 1,
        max_running: None,
        max_launching: None,
        admits: Admits::Only(["ns0".to_string()].into()),
        preemption: managed_jobs::queues::Preemption::OFF,
    };
    let mut m = Model::new(Caps { launch: 4, run: 4 }, vec![only_a]);
    for ns in [1, 0, 1, 0] {
        m.apply(&Op::Submit {
            ns,
            priority: 0,
            queue: 0,
        })
        .unwrap();
    }
    m.pass().unwrap();
    let rows = m.rows();
    let states: Vec<(&str, ScheduleState, Option<WaitReason>)> = rows
        .iter()
        .map(|r| {
            let told = (r.schedule_state == ScheduleState::Waiting)
                .then_some(r.wait_reason)
                .flatten();
            (r.namespace.as_str(), r.schedule_state, told)
        })
        .collect();
    assert_eq!(
        states,
        vec![
            (
                "ns1",
                ScheduleState::Waiting,
                Some(WaitReason::NamespaceNotAdmitted)
            ),
            ("ns0", ScheduleState::Launching, None),
            (
                "ns1",
                ScheduleState::Waiting,
                Some(WaitReason::NamespaceNotAdmitted)
            ),
            ("ns0", ScheduleState::Launching, None),
        ]
    );
    // Ending a launch the executor refused frees its slots like any end.
    let r = rows[1].clone();
    let t = lifecycle::fail(
        &r,
        JobPhase::FailedPrecheck,
        FailureReason::PodRejected,
        "refused".into(),
    );
    m.cas(r.id, &t).unwrap();
    m.drain().unwrap();
}
