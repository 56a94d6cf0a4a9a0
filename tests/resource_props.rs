//! Property model of admission in resources (`admission::plan_resources`,
//! `preemption::reclaim`; docs/concepts/quotas-pools-and-fit.md), pure: random queues with
//! quotas in cohorts, a pool of random nodes, random jobs (gangs too), random ends; a pass after
//! every step. Fixed seed.
//!
//! Invariants, checked after every pass:
//! 1. no queue uses more than its nominal quota plus its borrowing limit (without a cohort, more
//!    than its nominal quota) on any pool and resource;
//! 2. no cohort lends more than it has: what its queues draw beyond what they never lend is at
//!    most the sum of what they may lend;
//! 3. no admitted job fails the fit it was admitted on: every member placed, no node's free
//!    amount below zero;
//! 4. no preemption cycle: every reclaim victim's queue borrowed before it, every claimant's
//!    queue stays within its nominal quota, and the cohort's borrowed quota falls;
//! 5. shares converge: two queues of equal weight and nominal quota, both backlogged with jobs
//!    of one shape, hold within one job of each other once the borrowed jobs are gone.
//!
//! Mutations the model must catch (run by hand, each failing an invariant): admitting without
//! the quota check (1, 2), placing without the fit (3), taking victims from a queue at its
//! nominal quota (4).

use std::collections::BTreeMap;

use managed_jobs::admission::{Candidate, Cluster, QueueView, plan_resources};
use managed_jobs::api::QueueingStrategy;
use managed_jobs::capacity::{Caps, SlotUsage};
use managed_jobs::preemption::{Claimant, Holder, reclaim};
use managed_jobs::queues::{Admits, Preemption, QueueLoad, QueuePolicy, Queues};
use managed_jobs::resources::amount::{ONE, PODS};
use managed_jobs::resources::fit::{Constraints, NodeInfo, Nodes};
use managed_jobs::resources::quota::{Ledger, QueueQuotas, Quota};
use managed_jobs::resources::{Demand, Placement, Resources};
use proptest::prelude::*;

const GPU: &str = "nvidia.com/gpu";

fn gpus(n: i64, members: u32) -> Demand {
    let mut r = Resources::new();
    r.set(GPU, n * ONE);
    r.set(PODS, ONE);
    Demand {
        members,
        per_member: r,
        ..Default::default()
    }
}

#[derive(Clone, Debug)]
struct QueueSpec {
    nominal: i64,
    borrowing: Option<i64>,
    lending: Option<i64>,
    cohort: bool,
    reclaims: bool,
}

#[derive(Clone, Debug)]
enum Step {
    Submit {
        queue: usize,
        size: i64,
        members: u32,
    },
    End {
        pick: usize,
    },
}

#[derive(Clone, Debug)]
struct Job {
    id: i64,
    queue: usize,
    demand: Demand,
    /// Nodes its members run on once admitted.
    placed: Option<Vec<usize>>,
    started: i64,
}

fn policy(q: &QueueSpec) -> QueuePolicy {
    QueuePolicy {
        quotas: QueueQuotas {
            cohort: q.cohort.then(|| "c".to_string()),
            weight: 1,
            pools: vec![(
                "gpu".into(),
                [(
                    GPU.to_string(),
                    Quota {
                        nominal: q.nominal * ONE,
                        borrowing_limit: q.borrowing.filter(|_| q.cohort).map(|b| b * ONE),
                        lending_limit: q
                            .lending
                            .filter(|_| q.cohort)
                            .map(|l| l.min(q.nominal) * ONE),
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
            reclaim_within_cohort: q.reclaims,
            min_run_ms: 0,
            max_per_minute: 1000,
            ..Preemption::OFF
        },
    }
}

fn queue_name(i: usize) -> String {
    format!("q{i}")
}

struct Model {
    specs: Vec<QueueSpec>,
    queues: Queues,
    node_gpus: Vec<i64>,
    jobs: Vec<Job>,
    next_id: i64,
    now: i64,
}

impl Model {
    fn new(specs: Vec<QueueSpec>, node_gpus: Vec<i64>) -> Model {
        let objects = specs
            .iter()
            .enumerate()
            .map(|(i, q)| (queue_name(i), policy(q)))
            .collect();
        let queues = Queues::new(objects).with_pools(
            [(
                "gpu".to_string(),
                Placement {
                    pool: "gpu".into(),
                    ..Default::default()
                },
            )]
            .into(),
        );
        Model {
            specs,
            queues,
            node_gpus,
            jobs: Vec::new(),
            next_id: 1,
            now: 0,
        }
    }

    fn ledger(&self) -> Ledger {
        let mut l = Ledger::new(
            (0..self.specs.len())
                .map(|i| {
                    (
                        queue_name(i),
                        self.queues.get(&queue_name(i)).unwrap().quotas.clone(),
                    )
                })
                .collect(),
            BTreeMap::new(),
        );
        for j in self.jobs.iter().filter(|j| j.placed.is_some()) {
            l.take(&queue_name(j.queue), "gpu", &j.demand.total());
        }
        l
    }

    fn nodes(&self) -> Nodes {
        let mut infos: Vec<NodeInfo> = self
            .node_gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let mut allocatable = Resources::new();
                allocatable.set(GPU, g * ONE);
                allocatable.set(PODS, 110 * ONE);
                NodeInfo {
                    name: format!("n{i}"),
                    allocatable,
                    ready: true,
                    ..Default::default()
                }
            })
            .collect();
        for j in &self.jobs {
            for &n in j.placed.iter().flatten() {
                infos[n].requested.add(&j.demand.per_member);
            }
        }
        Nodes::new(infos)
    }

    /// One pass: reclaim, then admission; returns the victims with their queues' borrowing
    /// before, for invariant 4.
    fn pass(&mut self) -> Result<(), TestCaseError> {
        self.now += 1_000;
        let ledger = self.ledger();
        let nodes = self.nodes();
        // Reclaim for the waiting heads of queues that may.
        let claimants: Vec<Claimant> = self
            .jobs
            .iter()
            .filter(|j| j.placed.is_none())
            .map(|j| Claimant {
                id: j.id,
                queue: queue_name(j.queue),
                demand: j.demand.clone(),
            })
            .collect();
        let holders: Vec<Holder> = self
            .jobs
            .iter()
            .filter_map(|j| {
                Some(Holder {
                    id: j.id,
                    queue: queue_name(j.queue),
                    priority: 0,
                    running_since_ms: Some(j.started),
                    pool: "gpu".into(),
                    demand: j.demand.clone(),
                    nodes: j.placed.clone()?,
                    leaving_for: None,
                })
            })
            .collect();
        let borrowed_before: i64 = (0..self.specs.len())
            .map(|q| ledger.borrowed(&queue_name(q), "gpu", GPU))
            .sum();
        let victims = reclaim(
            &claimants,
            &holders,
            &self.queues,
            &ledger,
            &nodes,
            &BTreeMap::new(),
            self.now,
        );
        for v in &victims {
            let job = self.jobs.iter().find(|j| j.id == v.id).unwrap();
            // 4: only from a queue that borrowed.
            prop_assert!(
                ledger.borrowed(&queue_name(job.queue), "gpu", GPU) > 0,
                "victim {} of {} which borrowed nothing",
                v.id,
                job.queue
            );
            prop_assert_ne!(queue_name(job.queue), v.by.clone());
        }
        // Victims stop (at once, in the model): requeued at the back.
        for v in &victims {
            if let Some(j) = self.jobs.iter_mut().find(|j| j.id == v.id) {
                j.placed = None;
            }
        }
        if !victims.is_empty() {
            let after = self.ledger();
            let borrowed_after: i64 = (0..self.specs.len())
                .map(|q| after.borrowed(&queue_name(q), "gpu", GPU))
                .sum();
            prop_assert!(
                borrowed_after < borrowed_before,
                "a reclaim did not lower the borrowed quota: {borrowed_before} -> {borrowed_after}"
            );
        }
        // Admission.
        let mut cluster = Cluster {
            ledger: self.ledger(),
            nodes: Some(self.nodes()),
        };
        let views: Vec<QueueView> = (0..self.specs.len())
            .map(|q| QueueView {
                name: queue_name(q),
                policy: self.queues.get(&queue_name(q)).cloned(),
                load: QueueLoad {
                    launching: 0,
                    alive: self
                        .jobs
                        .iter()
                        .filter(|j| j.queue == q && j.placed.is_some())
                        .count(),
                },
                relaunches: vec![],
                new_jobs: self
                    .jobs
                    .iter()
                    .filter(|j| j.queue == q && j.placed.is_none())
                    .map(|j| Candidate {
                        id: j.id,
                        priority: 0,
                        namespace: "default".into(),
                        demand: Some(j.demand.clone()),
                        pool: None,
                    })
                    .collect(),
            })
            .collect();
        let plan = plan_resources(
            SlotUsage::default(),
            Caps {
                launch: 10_000,
                run: 10_000,
            },
            &views,
            &self.queues,
            &mut cluster,
        );
        // Place each admission as the planner said it fits: 3.
        let mut nodes = self.nodes();
        for a in &plan.admissions {
            let placement = plan.placements.get(&a.id).cloned().unwrap();
            prop_assert_eq!(&placement.pool, "gpu");
            let job = self.jobs.iter_mut().find(|j| j.id == a.id).unwrap();
            let placed = nodes
                .place(
                    &job.demand.per_member,
                    job.demand.members,
                    &Constraints::default(),
                )
                .ok_or_else(|| {
                    TestCaseError::fail(format!("job {} admitted without a fit", a.id))
                })?;
            job.placed = Some(placed);
            job.started = self.now;
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let ledger = self.ledger();
        // 1.
        for (i, q) in self.specs.iter().enumerate() {
            let used = ledger.used(&queue_name(i), "gpu", GPU);
            let limit = if q.cohort {
                q.borrowing.map_or(i64::MAX, |b| (q.nominal + b) * ONE)
            } else {
                q.nominal * ONE
            };
            prop_assert!(
                used <= limit,
                "{} uses {used} of a limit {limit}",
                queue_name(i)
            );
        }
        // 2.
        let (mut lendable, mut drawn) = (0, 0);
        for (i, q) in self.specs.iter().enumerate().filter(|(_, q)| q.cohort) {
            let l = q.lending.map_or(q.nominal, |l| l.min(q.nominal)) * ONE;
            let g = q.nominal * ONE - l;
            lendable += l;
            drawn += (ledger.used(&queue_name(i), "gpu", GPU) - g).max(0);
        }
        prop_assert!(drawn <= lendable, "the cohort lends {drawn} of {lendable}");
        // 3.
        let nodes = self.nodes();
        for i in 0..self.node_gpus.len() {
            prop_assert!(nodes.free(i).get(GPU) >= 0, "node {i} overcommitted");
        }
        Ok(())
    }

    fn apply(&mut self, step: &Step) -> Result<(), TestCaseError> {
        match *step {
            Step::Submit {
                queue,
                size,
                members,
            } => {
                let queue = queue % self.specs.len();
                self.jobs.push(Job {
                    id: self.next_id,
                    queue,
                    demand: gpus(size, members),
                    placed: None,
                    started: 0,
                });
                self.next_id += 1;
            }
            Step::End { pick } => {
                let running: Vec<usize> = (0..self.jobs.len())
                    .filter(|&i| self.jobs[i].placed.is_some())
                    .collect();
                if !running.is_empty() {
                    self.jobs.remove(running[pick % running.len()]);
                }
            }
        }
        self.pass()
    }
}

fn queue_spec() -> impl Strategy<Value = QueueSpec> {
    (
        0i64..24,
        prop::option::of(0i64..16),
        prop::option::of(0i64..16),
        prop::bool::weighted(0.8),
        any::<bool>(),
    )
        .prop_map(
            |(nominal, borrowing, lending, cohort, reclaims)| QueueSpec {
                nominal,
                borrowing,
                lending,
                cohort,
                reclaims,
            },
        )
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0usize..4, prop::sample::select(vec![1i64, 1, 2, 4, 8]), prop::sample::select(vec![1u32, 1, 1, 2, 4]))
            .prop_map(|(queue, size, members)| Step::Submit { queue, size, members }),
        1 => any::<usize>().prop_map(|pick| Step::End { pick }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        rng_seed: proptest::test_runner::RngSeed::Fixed(44),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Invariants 1 to 4 over random queues, nodes, jobs and ends.
    #[test]
    fn quotas_cohorts_fit_and_reclaim_hold(
        specs in prop::collection::vec(queue_spec(), 2..5),
        node_gpus in prop::collection::vec(prop::sample::select(vec![4i64, 8, 8, 16]), 1..6),
        steps in prop::collection::vec(step(), 1..60),
    ) {
        let mut m = Model::new(specs, node_gpus);
        for s in &steps {
            m.apply(s)?;
        }
    }
}

/// 5: two teams of weight 1, 16 + 16 GPUs nominal in one cohort on 4 nodes of 8; team-a's 8
/// jobs of 8 GPUs first (it borrows the idle 16), then team-b's 32 jobs of 1 GPU; as team-a's
/// borrowed jobs end, team-b gets its 16, and from then on both hold 16 at every step.
#[test]
fn two_backlogged_teams_converge_to_their_nominal_quota() {
    for reclaims in [false, true] {
        let spec = QueueSpec {
            nominal: 16,
            borrowing: None,
            lending: None,
            cohort: true,
            reclaims,
        };
        let mut m = Model::new(vec![spec.clone(), spec], vec![8, 8, 8, 8]);
        for _ in 0..8 {
            m.apply(&Step::Submit {
                queue: 0,
                size: 8,
                members: 1,
            })
            .unwrap();
        }
        let held = |m: &Model, q: usize| -> i64 {
            m.jobs
                .iter()
                .filter(|j| j.queue == q && j.placed.is_some())
                .map(|j| j.demand.total().get(GPU) / ONE)
                .sum()
        };
        assert_eq!(
            (held(&m, 0), held(&m, 1)),
            (32, 0),
            "team-a borrows the idle 16"
        );
        for _ in 0..32 {
            m.apply(&Step::Submit {
                queue: 1,
                size: 1,
                members: 1,
            })
            .unwrap();
        }
        if reclaims {
            // With reclaim, team-b takes its 16 back at once.
            assert_eq!((held(&m, 0), held(&m, 1)), (16, 16));
        } else {
            assert_eq!((held(&m, 0), held(&m, 1)), (32, 0));
        }
        // Jobs end one at a time, team-a's oldest first, and are replaced by new ones of the
        // same team: from the moment team-b holds its 16, both hold 16 at every step.
        let mut balanced = reclaims;
        for round in 0..40 {
            let q = round % 2;
            let oldest = m
                .jobs
                .iter()
                .position(|j| j.queue == q && j.placed.is_some());
            if let Some(i) = oldest {
                m.jobs.remove(i);
            }
            m.apply(&Step::Submit {
                queue: q,
                size: if q == 0 { 8 } else { 1 },
                members: 1,
            })
            .unwrap();
            let (a, b) = (held(&m, 0), held(&m, 1));
            if b == 16 {
                balanced = true;
            }
            if balanced {
                assert!(
                    (a - 16).abs() <= 8 && (b - 16).abs() <= 1,
                    "round {round}: {a} : {b}"
                );
            }
        }
        assert!(balanced, "team-b never got its 16");
    }
}

/// A node view of `nodes` as they are now in `view` (what is free on each), with nothing
/// remembered: the reference for what `view` answers.
fn fresh(view: &Nodes) -> Nodes {
    Nodes::new(
        view.nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut requested = n.allocatable.clone();
                requested.sub(view.free(i));
                NodeInfo {
                    requested,
                    ..n.clone()
                }
            })
            .collect(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        rng_seed: proptest::test_runner::RngSeed::Fixed(44),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// The node view remembers its answers (the nodes each constraint admits, how many members
    /// of a shape fit, the shortfall) and keeps them through placements, undos, releases and
    /// takes: every answer, after every step, is the one a view of the same nodes with nothing
    /// remembered gives.
    #[test]
    fn the_node_views_remembered_answers_are_a_scans(
        nodes in prop::collection::vec((prop::sample::select(vec![4i64, 8, 16]), 0usize..3, 0i64..=8), 1..10),
        steps in prop::collection::vec((0usize..4, 0usize..4, 1u32..=4, 0usize..4, 0usize..10), 1..40),
    ) {
        let infos: Vec<NodeInfo> = nodes
            .iter()
            .enumerate()
            .map(|(i, &(gpus, pool, used))| {
                let mut allocatable = Resources::new();
                allocatable.set(GPU, gpus * ONE);
                allocatable.set(PODS, 110 * ONE);
                let mut requested = Resources::new();
                requested.set(GPU, used.min(gpus) * ONE);
                NodeInfo {
                    name: format!("n{i}"),
                    labels: [("pool".to_string(), format!("p{pool}"))].into(),
                    allocatable,
                    requested,
                    ready: true,
                    ..Default::default()
                }
            })
            .collect();
        let constraints: Vec<Constraints> = std::iter::once(Constraints::default())
            .chain((0..3).map(|p| Constraints {
                node_selector: [("pool".to_string(), format!("p{p}"))].into(),
                ..Default::default()
            }))
            .collect();
        let shapes: Vec<Resources> = [1, 2, 4, 8]
            .iter()
            .map(|&g| gpus(g, 1).per_member)
            .collect();
        let mut view = Nodes::new(infos);
        let mut placed: Vec<(Resources, Vec<usize>)> = Vec::new();
        for &(op, shape, count, c, node) in &steps {
            let member = &shapes[shape];
            let node = node % view.nodes().len();
            match op {
                0 => {
                    if let Some(p) = view.place(member, count, &constraints[c]) {
                        prop_assert_eq!(p.len(), count as usize);
                        placed.push((member.clone(), p));
                    }
                }
                1 => {
                    if let Some((m, p)) = placed.pop() {
                        view.unplace(&m, &p);
                    }
                }
                2 => view.release(node, member),
                _ => view.take_on(node, member),
            }
            let reference = fresh(&view);
            for c in &constraints {
                prop_assert_eq!(view.eligible(c), reference.eligible(c));
                for m in &shapes {
                    prop_assert_eq!(view.members_fit(m, c), reference.members_fit(m, c));
                    prop_assert_eq!(view.shortfall(m, c), reference.shortfall(m, c));
                }
            }
        }
    }
}
