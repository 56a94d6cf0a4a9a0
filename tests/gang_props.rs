//! Property model of the gang rules (docs/design.md#multi-node-jobs): a multi-node job driven
//! by the real decisions ([`lifecycle::next_action`], which reads the attempt through
//! [`lifecycle::view`]) over random fates of its members.
//!
//! # The model
//!
//! Each case draws a gang of 2..5 members, its budgets, and a random sequence of events. The
//! model keeps the world: every member Pod that exists, by (attempt, rank), with its state and
//! when it ended. A step is either a job controller turn or a fate:
//!
//! - a turn observes the current attempt's members as the pod executor would (a member that
//!   does not exist is not found), asks `next_action`, and carries out what it says:
//!   `Launch` creates every member of the attempt that does not exist (Pending), `StopThen`
//!   and `RemoveThen` delete every member that is alive and then apply the transition, `Apply`
//!   applies it; the scheduler's admission (a launch slot) is granted at once;
//! - a fate changes one member: bound (Pending to Running), unschedulable, exits on its own
//!   with a code, is lost (evicted, deleted), is lost with its node (issue 43: its Pod stays on
//!   the lost node, where nobody will ever confirm its end, until the operator removes it),
//!   starts terminating, or succeeds.
//!
//! After every step these invariants are asserted:
//!
//! 1. all or nothing: the job is recorded Running only from an observation in which every
//!    member runs (or has succeeded), and its `readyNodes` then says N/N;
//! 2. fail fast: once a member of the current attempt ended badly while another is alive, the
//!    decision stops them (`StopThen`/`RemoveThen`) before anything else is written;
//! 3. recover as one: an attempt decided by a lost member (the first to end badly) is recorded
//!    `Recover`, and every launch creates all N members of its attempt;
//! 4. no overlapping attempts: when an attempt's members are created, no member of another
//!    attempt is alive;
//! 5. the decider: every ended attempt's record names the rank of the first member that ended
//!    badly (by time, then one that failed on its own before one that was lost, then by rank);
//! 6. no Pod left on a lost node: once an attempt's end is written, none of its members' Pods
//!    remains on a lost node (a member lost with its node is removed before, a job of one's
//!    too), so no attempt starts beside one.
//!
//! A [`Mutation`] alters what `next_action` returns the way a bug would (no fail-fast stop, a
//! gang Running once one member runs, a stop that leaves members behind, an end written while
//! a member's Pod is left on its lost node), and
//! `the_model_catches_each_mutation` checks that some case then breaks an invariant.
//!
//! Fixed seed (override with `PROPTEST_RNG_SEED`), nothing persisted: a run is deterministic.

use std::collections::BTreeMap;
use std::time::Duration;

use managed_jobs::api::{JobPhase, ManagedJobSpec, ScheduleState};
use managed_jobs::lifecycle::{
    self, Action, Context, Evidence, JobRow, Member, MemberState, Object, Observed, Outcome,
    Reason, Transition, Workload,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use proptest::test_runner::{Config as ProptestConfig, RngSeed, TestRunner};

const SEED: u64 = 0x6a6e_6731_2026;

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

/// What happens to one member.
#[derive(Clone, Copy, Debug)]
enum Fate {
    Bound,
    Unschedulable,
    Exits(i32),
    Lost,
    NodeLost,
    Terminating,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Turn,
    Fate { rank: usize, fate: Fate },
    Tick(u16),
}

/// A bug the model must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutation {
    None,
    /// An attempt's end is recorded without stopping the members still alive.
    NoFailFast,
    /// The gang is Running once rank 0 runs.
    RunningOnOne,
    /// A stop deletes only the first alive member.
    StopLeavesMembers,
    /// An attempt whose only member left is lost with its node is ended without removing it.
    LeavesLostNodePods,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct SimMember {
    state: MemberState,
    ended_at_ms: Option<i64>,
    /// Lost with its node, and its Pod still there: only the operator's removal ends it.
    on_lost_node: bool,
}

impl SimMember {
    fn alive(&self) -> bool {
        matches!(
            self.state,
            MemberState::Pending { .. }
                | MemberState::Unschedulable { .. }
                | MemberState::Running
                | MemberState::Terminating { .. }
        )
    }
}

struct Model {
    row: JobRow,
    size: usize,
    now: i64,
    world: BTreeMap<(i32, usize), SimMember>,
    mutation: Mutation,
}

fn spec(nodes: usize, restarts: i32) -> ManagedJobSpec {
    let mut spec: ManagedJobSpec = serde_json::from_value(serde_json::json!({
        "template": {"spec": {"containers": [{"name": "main", "image": "busybox"}]}},
    }))
    .unwrap();
    spec.nodes = Some(nodes as i32);
    spec.recovery.max_restarts_on_errors = restarts;
    spec
}

fn failed(code: i32) -> Outcome {
    Outcome::Failed {
        code,
        reason: "Error".into(),
        detail: Some(format!("container main exited with code {code}")),
        evidence: Evidence::exit("main", false, code, "Error"),
    }
}

impl Model {
    fn new(size: usize, restarts: i32, mutation: Mutation) -> Model {
        let spec = spec(size, restarts);
        let object = Object {
            uid: "uid-1",
            namespace: "ns",
            name: "gang",
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        let row = JobRow {
            id: 1,
            ..lifecycle::submission(&object, None, 0)
                .expect("a submission")
                .record
        };
        Model {
            row,
            size,
            now: 1_000,
            world: BTreeMap::new(),
            mutation,
        }
    }

    fn cx(&self) -> Context {
        Context {
            now_ms: self.now,
            executor_enabled: true,
            create_is_idempotent: true,
            backoff_base: Duration::from_millis(10),
            stop_after_exit: false,
            launch_timeout: Duration::from_secs(600),
            max_launch_timeouts: 3,
            run_slot_wanted: false,
            stop_grace: Duration::from_secs(1),
            claim: lifecycle::claim::Gate::OPEN,
            operator_alive: true,
        }
    }

    fn apply(&mut self, t: &Transition) -> bool {
        match lifecycle::apply(&self.row, &t.change, self.now) {
            Ok(after) => {
                self.row = after;
                true
            }
            Err(_) => false,
        }
    }

    fn observe(&self) -> Observed {
        let attempt = self.row.current_attempt();
        let members = (0..self.size)
            .map(|rank| {
                let m = self.world.get(&(attempt, rank));
                Member {
                    rank: rank as u32,
                    workload: Some(Workload::Pod(format!("gang-{attempt}-{rank}"))),
                    state: m.map_or(MemberState::NotFound, |m| m.state.clone()),
                    ended_at_ms: m.and_then(|m| m.ended_at_ms),
                }
            })
            .collect();
        Observed {
            members,
            placed_together: true,
        }
    }

    /// The scheduler's part: a queued or relaunching job gets its launch slot and a controller.
    fn admit(&mut self) {
        if matches!(
            self.row.schedule_state,
            ScheduleState::Waiting | ScheduleState::AliveWaiting
        ) {
            let t = lifecycle::admit(&self.row);
            self.apply(&t);
            let t = lifecycle::controller_started(&self.row, 10, 1);
            self.apply(&t);
        }
    }

    fn alive_others(&self, attempt: i32) -> Vec<(i32, usize)> {
        self.world
            .iter()
            .filter(|((a, _), m)| *a != attempt && (m.alive() || m.on_lost_node))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Invariant 6, after a transition was written: no member of an attempt that is over (an
    /// earlier one, or the current one of a Done job) has its Pod left on a lost node.
    fn check_no_pod_on_lost_node(&self) -> Result<(), TestCaseError> {
        let current = self.row.current_attempt();
        let done = self.row.schedule_state == ScheduleState::Done;
        let left: Vec<(i32, usize)> = self
            .world
            .iter()
            .filter(|((a, _), m)| m.on_lost_node && (*a < current || done))
            .map(|(k, _)| *k)
            .collect();
        prop_assert!(
            left.is_empty(),
            "invariant 6: an attempt ended with Pods left on a lost node: {left:?}"
        );
        Ok(())
    }

    /// The first member of the current attempt to end badly (invariant 5's order).
    fn expected_decider(&self) -> Option<usize> {
        let attempt = self.row.current_attempt();
        self.world
            .iter()
            .filter(|((a, _), _)| *a == attempt)
            .filter(|(_, m)| match &m.state {
                MemberState::Ended(o) => *o != Outcome::Succeeded,
                MemberState::Terminating { .. } => true,
                _ => false,
            })
            .min_by_key(|((_, rank), m)| {
                let lost = matches!(
                    m.state,
                    MemberState::Ended(Outcome::Lost { .. }) | MemberState::Terminating { .. }
                );
                (m.ended_at_ms.unwrap_or(i64::MAX), lost, *rank)
            })
            .map(|((_, rank), _)| *rank)
    }

    fn turn(&mut self) -> Result<(), TestCaseError> {
        self.admit();
        if self.row.schedule_state == ScheduleState::Done {
            return Ok(());
        }
        let observed = lifecycle::observes(&self.row).then(|| self.observe());
        let mut action = lifecycle::next_action(&self.row, observed.as_ref(), &self.cx());
        let attempt = self.row.current_attempt();
        let bad_and_alive = observed.as_ref().is_some_and(|o| {
            let bad = o.members.iter().any(|m| match &m.state {
                MemberState::Ended(out) => *out != Outcome::Succeeded,
                MemberState::Terminating { .. } => true,
                _ => false,
            });
            bad && o
                .members
                .iter()
                .filter(|m| !matches!(m.state, MemberState::Ended(_)))
                .count()
                > 0
        });
        // Mutations: what a bug would return instead.
        match (self.mutation, &action) {
            (Mutation::NoFailFast, Action::StopThen(t)) if !self.row.cancel_requested => {
                action = Action::Apply(t.clone());
            }
            (Mutation::LeavesLostNodePods, Action::StopThen(t))
                if !self.row.cancel_requested
                    && observed.as_ref().is_some_and(|o| {
                        !o.members.iter().any(|m| {
                            matches!(
                                m.state,
                                MemberState::Running
                                    | MemberState::Pending { .. }
                                    | MemberState::Unschedulable { .. }
                                    | MemberState::Terminating { .. }
                            )
                        })
                    }) =>
            {
                action = Action::Apply(t.clone());
            }
            (Mutation::RunningOnOne, _)
                if observed.as_ref().is_some_and(|o| {
                    o.members[0].state == MemberState::Running
                        && self.row.phase != JobPhase::Running
                        && self.row.schedule_state.holds_run_slot()
                }) =>
            {
                action = Action::Apply(lifecycle::running(
                    &self.row,
                    attempt,
                    Workload::Pod("gang-0".into()),
                ));
            }
            _ => {}
        }
        // 2. fail fast.
        if bad_and_alive
            && self.row.schedule_state.holds_run_slot()
            && !matches!(action, Action::StopThen(_) | Action::RemoveThen(_))
        {
            let alive = self
                .observe()
                .members
                .iter()
                .filter(|m| {
                    matches!(
                        m.state,
                        MemberState::Running
                            | MemberState::Pending { .. }
                            | MemberState::Unschedulable { .. }
                    )
                })
                .count();
            prop_assert!(
                alive == 0,
                "invariant 2: a member ended badly and {alive} are alive, yet {action:?}"
            );
        }
        match action {
            Action::Exit | Action::Wait { .. } => {}
            Action::Apply(t) => {
                let running = t.change.reason() == Reason::Running;
                let expected = self.expected_decider();
                if self.apply(&t) {
                    self.check_written(running, observed.as_ref(), expected)?;
                    self.check_no_pod_on_lost_node()?;
                }
            }
            Action::Launch { attempt, intent } => {
                if let Some(intent) = intent
                    && !self.apply(&intent)
                {
                    return Ok(());
                }
                // 4. no overlapping attempts.
                let others = self.alive_others(attempt);
                prop_assert!(
                    others.is_empty(),
                    "invariant 4: attempt {attempt} created while {others:?} are alive"
                );
                // 3. every member of the attempt, at once.
                for rank in 0..self.size {
                    self.world.entry((attempt, rank)).or_insert(SimMember {
                        state: MemberState::Pending {
                            reason: String::new(),
                            message: String::new(),
                        },
                        ended_at_ms: None,
                        on_lost_node: false,
                    });
                }
            }
            Action::StopThen(t) | Action::RemoveThen(t) => {
                let expected = self.expected_decider();
                // The pod executor's stop: every member alive, and every Pod of a member lost
                // with its node (removed at once).
                let lost_node: Vec<(i32, usize)> = self
                    .world
                    .iter()
                    .filter(|(_, m)| m.on_lost_node)
                    .map(|(k, _)| *k)
                    .collect();
                for key in &lost_node {
                    if let Some(m) = self.world.get_mut(key) {
                        m.on_lost_node = false;
                    }
                }
                let alive: Vec<(i32, usize)> = self
                    .world
                    .iter()
                    .filter(|(_, m)| m.alive())
                    .map(|(k, _)| *k)
                    .collect();
                let take = if self.mutation == Mutation::StopLeavesMembers {
                    alive.len().min(1)
                } else {
                    alive.len()
                };
                for key in &alive[..take] {
                    self.world.remove(key);
                }
                if self.apply(&t) {
                    self.check_written(false, observed.as_ref(), expected)?;
                    self.check_no_pod_on_lost_node()?;
                }
            }
        }
        Ok(())
    }

    /// Invariants 1, 3 and 5 on a transition just written.
    fn check_written(
        &self,
        running: bool,
        observed: Option<&Observed>,
        expected: Option<usize>,
    ) -> Result<(), TestCaseError> {
        if running {
            let all = observed.is_some_and(|o| {
                o.members.iter().all(|m| {
                    matches!(
                        m.state,
                        MemberState::Running | MemberState::Ended(Outcome::Succeeded)
                    )
                })
            });
            prop_assert!(all, "invariant 1: Running from {observed:?}");
            let n = self.size;
            prop_assert_eq!(self.row.ready_nodes.clone(), Some(format!("{n}/{n}")));
        }
        if let Some(record) = self.row.attempts.last()
            && record.attempt == self.row.attempts.last().map_or(0, |r| r.attempt)
            && record.finished_at.is_some()
            && observed.is_some()
            && record.action != "Succeeded"
            && expected.is_some()
        {
            // 5. the decider, and 3. a lost decider recovers.
            prop_assert_eq!(
                record.rank,
                expected.map(|r| r as i32),
                "invariant 5: {:?}",
                record
            );
            let lost = matches!(
                self.world
                    .get(&(record.attempt, expected.unwrap_or(0)))
                    .map(|m| &m.state),
                Some(MemberState::Ended(Outcome::Lost { .. }))
            );
            if lost {
                prop_assert_eq!(record.action.as_str(), "Recover", "invariant 3");
            }
        }
        Ok(())
    }

    fn fate(&mut self, rank: usize, fate: Fate) {
        let attempt = self.row.current_attempt();
        let now = self.now;
        let Some(m) = self.world.get_mut(&(attempt, rank)) else {
            return;
        };
        if !m.alive() {
            return;
        }
        match fate {
            Fate::Bound => {
                if !matches!(m.state, MemberState::Terminating { .. }) {
                    m.state = MemberState::Running;
                }
            }
            Fate::Unschedulable => {
                if matches!(m.state, MemberState::Pending { .. }) {
                    m.state = MemberState::Unschedulable {
                        message: "0/4 nodes are available".into(),
                    };
                }
            }
            Fate::Exits(0) => {
                if m.state == MemberState::Running {
                    m.state = MemberState::Ended(Outcome::Succeeded);
                    m.ended_at_ms = Some(now);
                }
            }
            Fate::Exits(code) => {
                if m.state == MemberState::Running {
                    m.state = MemberState::Ended(failed(code));
                    m.ended_at_ms = Some(now);
                }
            }
            Fate::Lost => {
                m.state = MemberState::Ended(Outcome::lost(
                    format!("Pod gang-{attempt}-{rank}: EvictionByEvictionAPI"),
                    "EvictionByEvictionAPI",
                ));
                m.ended_at_ms = Some(now);
            }
            Fate::NodeLost => {
                m.state = MemberState::Ended(Outcome::lost(
                    format!("Pod gang-{attempt}-{rank}: NodeLost (its node n{rank} was deleted)"),
                    "NodeLost",
                ));
                m.ended_at_ms = Some(now);
                m.on_lost_node = true;
            }
            Fate::Terminating => {
                m.state = MemberState::Terminating {
                    message: format!("Pod gang-{attempt}-{rank} is terminating"),
                    force_at_ms: None,
                    node_ready: None,
                };
                m.ended_at_ms = Some(now);
            }
        }
    }
}

fn fate() -> impl Strategy<Value = Fate> {
    prop_oneof![
        12 => Just(Fate::Bound),
        2 => Just(Fate::Unschedulable),
        4 => prop_oneof![Just(0), Just(1), Just(3), Just(137)].prop_map(Fate::Exits),
        2 => Just(Fate::Lost),
        1 => Just(Fate::NodeLost),
        2 => Just(Fate::Terminating),
    ]
}

fn step(size: usize) -> impl Strategy<Value = Step> {
    prop_oneof![
        5 => Just(Step::Turn),
        4 => (0..size, fate()).prop_map(|(rank, fate)| Step::Fate { rank, fate }),
        1 => (1u16..500).prop_map(Step::Tick),
    ]
}

fn case() -> impl Strategy<Value = (usize, i32, Vec<Step>)> {
    (2usize..=5, 0i32..3).prop_flat_map(|(size, restarts)| {
        (
            Just(size),
            Just(restarts),
            prop::collection::vec(step(size), 10..200),
        )
    })
}

fn run(
    size: usize,
    restarts: i32,
    steps: &[Step],
    mutation: Mutation,
) -> Result<(), TestCaseError> {
    let mut m = Model::new(size, restarts, mutation);
    for s in steps {
        match *s {
            Step::Turn => m.turn()?,
            Step::Fate { rank, fate } => m.fate(rank, fate),
            Step::Tick(ms) => m.now += i64::from(ms),
        }
        m.now += 1;
    }
    // Drain: turns alone settle the job's decisions (no new fates).
    for _ in 0..20 {
        m.turn()?;
        m.now += 1_000;
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(300))]

    /// The six invariants over random member fates.
    #[test]
    fn gang_rules_hold_over_random_member_fates((size, restarts, steps) in case()) {
        run(size, restarts, &steps, Mutation::None)?;
    }
}

/// Each mutation breaks an invariant in some case of the same generator: the model sees the
/// bugs it is there for.
#[test]
fn the_model_catches_each_mutation() {
    for mutation in [
        Mutation::NoFailFast,
        Mutation::RunningOnOne,
        Mutation::StopLeavesMembers,
        Mutation::LeavesLostNodePods,
    ] {
        let mut runner = TestRunner::new(config(300));
        let found = runner.run(&case(), |(size, restarts, steps)| {
            run(size, restarts, &steps, mutation)
        });
        assert!(found.is_err(), "{mutation:?} went unnoticed");
    }
}

/// The generator reaches the situations the invariants are about: fail-fast stops with
/// members alive, recoveries, restarts and successes.
#[test]
fn the_generator_reaches_the_gang_situations() {
    let mut runner = TestRunner::new(config(200));
    let mut seen = BTreeMap::<&str, usize>::new();
    for _ in 0..200 {
        let (size, restarts, steps) = case().new_tree(&mut runner).unwrap().current();
        let mut m = Model::new(size, restarts, Mutation::None);
        for s in &steps {
            match *s {
                Step::Turn => {
                    let before = m.row.attempts.len();
                    m.turn().unwrap();
                    if let Some(r) = m.row.attempts.last()
                        && m.row.attempts.len() > before
                    {
                        *seen
                            .entry(match r.action.as_str() {
                                "Recover" => "recover",
                                "Restart" => "restart",
                                "Succeeded" => "success",
                                _ => "other",
                            })
                            .or_default() += 1;
                    }
                }
                Step::Fate { rank, fate } => m.fate(rank, fate),
                Step::Tick(ms) => m.now += i64::from(ms),
            }
            m.now += 1;
        }
        if m.row.phase == JobPhase::Succeeded {
            *seen.entry("succeeded").or_default() += 1;
        }
    }
    for what in ["recover", "restart", "succeeded"] {
        assert!(
            seen.get(what).copied().unwrap_or(0) > 0,
            "{what} never reached: {seen:?}"
        );
    }
}
