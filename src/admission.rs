//! Admission, declared once and pure (docs/design.md#admission): which waiting jobs get a
//! launch slot now, and on which pool.
//!
//! A job's usage is a vector: a launch slot, a run slot, and its demand on the pool it was
//! admitted onto (per resource). Which schedule states hold what is declared here
//! ([`HOLDS_LAUNCH_SLOT`], [`HOLDS_RUN_SLOT`]: the run slot and the quota) and rendered into the
//! store's SQL ([`states_sql`]). A candidate is admitted when all of these hold:
//!
//! 1. **slots**: a free launch slot, and for a new job a free run slot, within the operator's
//!    caps and its queue's `maxLaunching` / `maxRunning`;
//! 2. **quota**: in a queue with pools, its whole demand fits its queue's quota on a pool
//!    (with what the cohort lends; [`crate::resources::quota::Ledger::admits`]);
//! 3. **fit**: on that same pool, every member can be placed now on Ready, schedulable nodes
//!    ([`crate::resources::fit::Nodes::fits`]); it takes the first pool, in its queue's order,
//!    where both hold.
//!
//! A queue without pools checks only slots: exactly the rules before quotas existed.
//!
//! Across queues, the next admission goes to the queue whose next admissible job has the lowest
//! key: (whether it makes its queue borrow, the queue's weighted dominant resource share after
//! it, its run slots held / weight, its weight (higher first), its name). With no quotas anywhere
//! the first two are equal for all and this is the slot share of before
//! ([`crate::queues::share_order`]). Relaunches (AliveWaiting) come first and need only a
//! launch slot (they hold their run slot and quota) and a fit; across queues by launching /
//! weight, as before.
//!
//! Within a queue: priority, then entry order. A job that does not fit its quota or the nodes
//! lets later jobs of its queue go first under `BestEffortFIFO` (among the candidates the pass
//! read), and holds them under `StrictFIFO`; a job blocked by slots blocks its queue either way.
//! Every candidate looked at and not admitted gets the reason why, in numbers ([`WhyNot`]).
//!
//! Cost: per admission, O(queues x (candidates looked at) x (pools) x nodes) for the fit
//! checks; the pass reads only each queue's head (`crate::scheduler`), so this stays bounded
//! whatever the backlog (BENCHMARKS.md, "Admission in resources").

use std::collections::HashMap;

use crate::api::{DEFAULT_QUEUE, LOCAL_POOL, QueueingStrategy, ScheduleState};
use crate::capacity::{Caps, SlotUsage};
use crate::queues::{self, QueueLoad, QueuePolicy, Queues};
use crate::resources::fit::{Nodes, Shortfall};
use crate::resources::quota::{Ledger, QuotaShortfall, Share};
use crate::resources::{Demand, Placement};

/// The schedule states that hold a launch slot.
pub const HOLDS_LAUNCH_SLOT: &[ScheduleState] = &[ScheduleState::Launching];

/// The schedule states that hold a run slot, and the quota of their demand on their pool.
pub const HOLDS_RUN_SLOT: &[ScheduleState] = &[
    ScheduleState::Launching,
    ScheduleState::Alive,
    ScheduleState::AliveWaiting,
];

/// `'A', 'B'` of `states`, for a SQL `IN (...)`.
pub fn states_sql(states: &[ScheduleState]) -> String {
    states
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A queued job as the planner sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidate {
    /// Store id.
    pub id: i64,
    /// Priority (-1000..1000).
    pub priority: i32,
    /// Its namespace: its queue must admit it.
    pub namespace: String,
    /// What its next attempt needs (its current task's); None: only slots.
    pub demand: Option<Demand>,
    /// A relaunch's pool (where its quota is held); None for a new job.
    pub pool: Option<String>,
}

impl Candidate {
    /// A candidate of namespace `default` that needs only slots.
    pub fn new(id: i64, priority: i32) -> Candidate {
        Candidate {
            id,
            priority,
            namespace: "default".into(),
            ..Default::default()
        }
    }
}

/// One queue as the planner sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueView {
    /// Its name.
    pub name: String,
    /// Its policy; None: no such queue (its jobs wait for it).
    pub policy: Option<QueuePolicy>,
    /// Slots its jobs hold before the pass.
    pub load: QueueLoad,
    /// Its AliveWaiting jobs, in admission order.
    pub relaunches: Vec<Candidate>,
    /// Its Waiting jobs (a prefix of them), in admission order.
    pub new_jobs: Vec<Candidate>,
}

/// One admission decided by the planner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Admission {
    /// Store id.
    pub id: i64,
    /// The state it leaves for Launching: Waiting (new job) or AliveWaiting (relaunch).
    pub from: ScheduleState,
}

/// Why a candidate the planner looked at was not admitted, beyond slots (those are the
/// queue's reasons, [`crate::queues::blocked`], and the caps').
#[derive(Clone, Debug, PartialEq)]
pub enum WhyNot {
    /// Its demand fits no pool's quota (with what may be borrowed): the first pool's numbers.
    Quota(Box<QuotaShortfall>),
    /// Its quota allows it on `pool`, whose nodes cannot take all its members now.
    Fit {
        /// The pool.
        pool: String,
        /// What it needs.
        demand: Box<Demand>,
        /// What the pool's nodes offer it.
        shortfall: Shortfall,
    },
    /// Its quota allows it, but the cluster's nodes are not known (the watches have not listed
    /// them yet, or the API refused them).
    ClusterUnknown,
    /// None of its queue's pools exists.
    PoolMissing(Vec<String>),
}

impl WhyNot {
    /// What the candidate needs and where, as its reason begins ("needs 8 nvidia.com/gpu on
    /// pool a100"), for the reasons that go on in numbers (quota, fit); None for the others.
    pub fn needs(&self) -> Option<String> {
        match self {
            WhyNot::Quota(short) => Some(short.needs()),
            WhyNot::Fit { pool, demand, .. } => {
                Some(format!("needs {} on pool {pool}", demand.shown()))
            }
            WhyNot::ClusterUnknown | WhyNot::PoolMissing(_) => None,
        }
    }

    /// The reason a waiting job's status gives ([`WhyNot::said`]'s first half).
    pub fn reason(&self) -> crate::api::WaitReason {
        use crate::api::WaitReason;
        match self {
            WhyNot::Quota(_) => WaitReason::InsufficientQuota,
            WhyNot::Fit { .. } | WhyNot::ClusterUnknown => WaitReason::InsufficientCapacity,
            WhyNot::PoolMissing(_) => WaitReason::PoolMissing,
        }
    }

    /// The reason and the sentence a waiting job's status shows, in numbers: e.g. "needs 8
    /// nvidia.com/gpu on pool a100: team-b uses 16 of 16, cohort has 0 to lend (team-a
    /// borrows 16)", or "needs 1 x {nvidia.com/gpu: 8, pods: 1} on pool gpu: its Ready nodes
    /// take none now (2 nodes; the most nvidia.com/gpu free on one node is 4)".
    pub fn said(&self, queue: &str) -> (crate::api::WaitReason, String) {
        use crate::resources::amount::show;
        match self {
            WhyNot::Quota(short) => (self.reason(), short.sentence(queue)),
            WhyNot::Fit {
                demand, shortfall, ..
            } => {
                let (name, free) = &shortfall.largest_free;
                let what = if shortfall.eligible == 0 {
                    "no Ready, schedulable node of it matches the job's node selector, affinity and tolerations".to_string()
                } else if shortfall.members_ever < i64::from(demand.members) {
                    format!(
                        "its {} Ready node{} could take only {} of {} member{} even with nothing else on them (the most {name} one node has is {}): it waits for larger or more nodes",
                        shortfall.eligible,
                        if shortfall.eligible == 1 { "" } else { "s" },
                        shortfall.members_ever,
                        demand.members,
                        if demand.members == 1 { "" } else { "s" },
                        show(name, shortfall.largest_allocatable),
                    )
                } else {
                    format!(
                        "its {} Ready node{} take{} {} of {} member{} now; the most {name} free on one node is {}",
                        shortfall.eligible,
                        if shortfall.eligible == 1 { "" } else { "s" },
                        if shortfall.eligible == 1 { "s" } else { "" },
                        shortfall.members_fit.min(i64::from(demand.members)),
                        demand.members,
                        if demand.members == 1 { "" } else { "s" },
                        show(name, *free),
                    )
                };
                let needs = self.needs().unwrap_or_default();
                (self.reason(), format!("{needs}: {what}"))
            }
            WhyNot::ClusterUnknown => (
                self.reason(),
                "waiting for the operator to list the cluster's nodes and Pods (is it allowed to \
                 watch them? docs/concepts/quotas-pools-and-fit.md)"
                    .into(),
            ),
            WhyNot::PoolMissing(pools) => (
                self.reason(),
                format!(
                    "none of queue {queue}'s pools exists: no ManagedJobPool named {}",
                    pools.join(", ")
                ),
            ),
        }
    }
}

/// What admission reads beyond slots: the pools, every queue's quota and usage, and the nodes.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Every queue's quotas and what it uses now.
    pub ledger: Ledger,
    /// The nodes with what is free on each (reservations of earlier admissions taken); None
    /// while not known.
    pub nodes: Option<Nodes>,
}

/// The planner's answer.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// The admissions, in the order decided.
    pub admissions: Vec<Admission>,
    /// The pool each admission (of a queue with pools) was admitted onto.
    pub placements: HashMap<i64, Placement>,
    /// Why each candidate looked at and not admitted waits, beyond slots.
    pub waits: HashMap<i64, WhyNot>,
}

/// Decides admissions in one pool of slots (no queue objects, no quotas): see [`plan_queues`].
pub fn plan(
    usage: SlotUsage,
    caps: Caps,
    relaunches: &[Candidate],
    new_jobs: &[Candidate],
) -> Vec<Admission> {
    let pool = QueueView {
        name: DEFAULT_QUEUE.into(),
        policy: Some(QueuePolicy::implicit_default()),
        load: QueueLoad {
            launching: usage.launching,
            alive: usage.alive,
        },
        relaunches: relaunches.to_vec(),
        new_jobs: new_jobs.to_vec(),
    };
    plan_queues(usage, caps, std::slice::from_ref(&pool))
}

/// Decides admissions across `queues` within the caps, on slots only (queues without pools, or
/// quotas ignored): [`plan_resources`] with nothing beyond slots.
pub fn plan_queues(usage: SlotUsage, caps: Caps, queues: &[QueueView]) -> Vec<Admission> {
    plan_resources(
        usage,
        caps,
        queues,
        &Queues::single_pool(),
        &mut Cluster::default(),
    )
    .admissions
}

/// Where one queue stands in a pass.
struct Cursor {
    load: QueueLoad,
    next_relaunch: usize,
    next_new: usize,
}

/// The next admissible candidate of a queue and where it would go.
struct Pick {
    /// Index into the queue's list.
    index: usize,
    /// The pool and the demand it takes there (None: slots only).
    on: Option<(Placement, Demand)>,
    /// It makes its queue borrow.
    borrows: bool,
    /// Its queue's share after it.
    share: Share,
}

/// Decides admissions across `queues` (each with its candidates in admission order) within the
/// caps (`usage`: the slots held now), their quotas and the nodes (`cluster`, updated with what
/// the admissions take). See the module's doc for the rules.
pub fn plan_resources(
    usage: SlotUsage,
    caps: Caps,
    queues: &[QueueView],
    pools: &Queues,
    cluster: &mut Cluster,
) -> Plan {
    let mut out = Plan::default();
    let mut launching = usage.launching;
    let mut alive = usage.alive;
    let mut cursors: Vec<Cursor> = queues
        .iter()
        .map(|q| Cursor {
            load: q.load,
            next_relaunch: 0,
            next_new: 0,
        })
        .collect();
    let below = |max: Option<usize>, held: usize| max.is_none_or(|m| held < m);

    // Relaunches: a launch slot each, within the queue's maxLaunching, and a fit.
    while launching < caps.launch {
        let mut best: Option<(usize, Pick)> = None;
        for (i, q) in queues.iter().enumerate() {
            let Some(p) = &q.policy else { continue };
            if !below(p.max_launching, cursors[i].load.launching) {
                continue;
            }
            let Some(pick) = next_pick(
                q,
                p,
                &q.relaunches,
                &mut cursors[i].next_relaunch,
                true,
                pools,
                cluster,
                &mut out.waits,
            ) else {
                continue;
            };
            let key = |j: usize| {
                (
                    cursors[j].load.launching,
                    weight(&queues[j]),
                    queues[j].name.as_str(),
                )
            };
            if best
                .as_ref()
                .is_none_or(|(b, _)| queues::share_order(key(i), key(*b)).is_lt())
            {
                best = Some((i, pick));
            }
        }
        let Some((i, pick)) = best else { break };
        let q = &queues[i];
        let c = &q.relaunches[pick.index];
        take(c, &pick, &q.name, true, cluster, &mut out);
        out.admissions.push(Admission {
            id: c.id,
            from: ScheduleState::AliveWaiting,
        });
        cursors[i].next_relaunch = pick.index + 1;
        launching += 1;
        cursors[i].load.launching += 1;
    }

    // New jobs: a launch slot and a run slot each, within the queue's limits, its quota and
    // the nodes.
    while launching < caps.launch && alive < caps.run {
        let mut best: Option<(usize, Pick)> = None;
        for (i, q) in queues.iter().enumerate() {
            let Some(p) = &q.policy else { continue };
            if !below(p.max_running, cursors[i].load.alive)
                || !below(p.max_launching, cursors[i].load.launching)
            {
                continue;
            }
            let Some(pick) = next_pick(
                q,
                p,
                &q.new_jobs,
                &mut cursors[i].next_new,
                false,
                pools,
                cluster,
                &mut out.waits,
            ) else {
                continue;
            };
            let better = match &best {
                None => true,
                Some((b, bp)) => {
                    let slots = |j: usize| {
                        (
                            cursors[j].load.alive,
                            weight(&queues[j]),
                            queues[j].name.as_str(),
                        )
                    };
                    (pick.borrows, pick.share)
                        .cmp(&(bp.borrows, bp.share))
                        .then_with(|| queues::share_order(slots(i), slots(*b)))
                        .is_lt()
                }
            };
            if better {
                best = Some((i, pick));
            }
        }
        let Some((i, pick)) = best else { break };
        let q = &queues[i];
        let c = &q.new_jobs[pick.index];
        take(c, &pick, &q.name, false, cluster, &mut out);
        out.admissions.push(Admission {
            id: c.id,
            from: ScheduleState::Waiting,
        });
        cursors[i].next_new = pick.index + 1;
        launching += 1;
        alive += 1;
        cursors[i].load.launching += 1;
        cursors[i].load.alive += 1;
    }
    out
}

fn weight(q: &QueueView) -> u32 {
    q.policy.as_ref().map_or(1, |p| p.weight)
}

/// Counts an admission's quota and places its members on the nodes.
fn take(
    c: &Candidate,
    pick: &Pick,
    queue: &str,
    relaunch: bool,
    cluster: &mut Cluster,
    out: &mut Plan,
) {
    out.waits.remove(&c.id);
    let Some((placement, demand)) = &pick.on else {
        return;
    };
    let total = demand.total();
    if relaunch {
        // Its quota is held where it ran: it moves to the pool it is admitted onto now.
        if let Some(old) = &c.pool {
            let held = c.demand.as_ref().map(Demand::total).unwrap_or_default();
            cluster.ledger.give(queue, old, &held);
        }
    }
    cluster.ledger.take(queue, &placement.pool, &total);
    if !demand.local
        && let (Some(nodes), Some(constraints)) =
            (cluster.nodes.as_mut(), demand.constraints(placement))
    {
        nodes.place(&demand.per_member, demand.members, &constraints);
    }
    out.placements.insert(c.id, placement.clone());
}

/// The next admissible candidate of `list` from `*next` on, and where it goes; candidates
/// passed over (a namespace the queue refuses; under BestEffortFIFO, one that does not fit
/// its quota or the nodes) move `*next` on; their reasons go to `waits`.
#[allow(clippy::too_many_arguments)]
fn next_pick(
    q: &QueueView,
    policy: &QueuePolicy,
    list: &[Candidate],
    next: &mut usize,
    relaunch: bool,
    pools: &Queues,
    cluster: &Cluster,
    waits: &mut HashMap<i64, WhyNot>,
) -> Option<Pick> {
    let mut i = *next;
    while let Some(c) = list.get(i) {
        if !policy.admits.admits(&c.namespace) {
            i += 1;
            if i > *next {
                *next = i;
            }
            continue;
        }
        match where_to(&q.name, policy, c, relaunch, pools, cluster) {
            Ok((on, borrows)) => {
                let share = match &on {
                    Some((placement, demand)) => {
                        let mut total = demand.total();
                        if relaunch && c.pool.as_deref() == Some(placement.pool.as_str()) {
                            total = Default::default();
                        }
                        cluster.ledger.share_with(&q.name, &placement.pool, &total)
                    }
                    None => Share::ZERO,
                };
                return Some(Pick {
                    index: i,
                    on,
                    borrows,
                    share,
                });
            }
            Err(why) => {
                waits.insert(c.id, why);
                if policy.strategy == QueueingStrategy::StrictFIFO {
                    return None;
                }
                i += 1;
            }
        }
    }
    None
}

/// Where candidate `c` of queue `queue` goes: its pool and demand (None: a queue of slots
/// only, or a local job its queue does not meter) and whether it borrows; or why it cannot go
/// anywhere now.
fn where_to(
    queue: &str,
    policy: &QueuePolicy,
    c: &Candidate,
    relaunch: bool,
    pools: &Queues,
    cluster: &Cluster,
) -> Result<(Option<(Placement, Demand)>, bool), WhyNot> {
    if policy.quotas.pools.is_empty() {
        return Ok((None, false));
    }
    let demand = c.demand.clone().unwrap_or_else(|| Demand {
        members: 1,
        ..Default::default()
    });
    let ledger = &cluster.ledger;
    // A relaunch's own held quota is free for it.
    let mut ledger_for_it;
    let ledger: &Ledger = match (relaunch, &c.pool) {
        (true, Some(old)) => {
            ledger_for_it = ledger.clone();
            let held = c.demand.as_ref().map(Demand::total).unwrap_or_default();
            ledger_for_it.give(queue, old, &held);
            &ledger_for_it
        }
        _ => ledger,
    };
    let total = demand.total();
    if demand.local {
        // A local job runs on the operator's node: metered by the pool `local` if its queue
        // lists one, no fit on the cluster.
        if policy.quotas.pool(LOCAL_POOL).is_none() {
            return Ok((None, false));
        }
        return match ledger.admits(queue, LOCAL_POOL, &total) {
            Ok(borrows) => Ok((
                Some((pools.pool(LOCAL_POOL).unwrap_or_default(), demand)),
                borrows,
            )),
            Err(short) => Err(WhyNot::Quota(short)),
        };
    }
    // A relaunch tries the pool it ran on first.
    let mut order: Vec<&str> = Vec::new();
    if relaunch && let Some(p) = c.pool.as_deref() {
        order.push(p);
    }
    for (p, _) in &policy.quotas.pools {
        if p != LOCAL_POOL && !order.contains(&p.as_str()) {
            order.push(p);
        }
    }
    let mut first_quota: Option<WhyNot> = None;
    let mut first_fit: Option<WhyNot> = None;
    let mut missing = Vec::new();
    for pool in order {
        let Some(placement) = pools.pool(pool) else {
            missing.push(pool.to_string());
            continue;
        };
        let borrows = match ledger.admits(queue, pool, &total) {
            Ok(b) => b,
            Err(short) => {
                first_quota.get_or_insert(WhyNot::Quota(short));
                continue;
            }
        };
        let Some(nodes) = &cluster.nodes else {
            first_fit.get_or_insert(WhyNot::ClusterUnknown);
            continue;
        };
        let constraints = demand.constraints(&placement);
        let fits = constraints
            .as_ref()
            .is_some_and(|c| nodes.fits(&demand.per_member, demand.members, c));
        if fits {
            return Ok((Some((placement, demand)), borrows));
        }
        first_fit.get_or_insert_with(|| WhyNot::Fit {
            pool: pool.to_string(),
            shortfall: constraints
                .map(|c| nodes.shortfall(&demand.per_member, &c))
                .unwrap_or_default(),
            demand: Box::new(demand.clone()),
        });
    }
    // A quota that allows it somewhere says more than a quota that does not.
    Err(first_fit
        .or(first_quota)
        .unwrap_or(WhyNot::PoolMissing(missing)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queues::{Admits, Preemption};
    use crate::resources::Resources;
    use crate::resources::amount::{ONE, PODS};
    use crate::resources::fit::NodeInfo;
    use crate::resources::quota::{QueueQuotas, Quota};
    use std::collections::BTreeMap;

    fn c(id: i64, priority: i32) -> Candidate {
        Candidate::new(id, priority)
    }

    #[test]
    fn relaunch_is_not_blocked_by_a_new_job_without_run_slot() {
        let usage = SlotUsage {
            launching: 0,
            alive: 3,
            ..Default::default()
        };
        let caps = Caps { launch: 2, run: 3 };
        let out = plan(usage, caps, &[c(9, 0)], &[c(1, 0)]);
        assert_eq!(
            out,
            vec![Admission {
                id: 9,
                from: ScheduleState::AliveWaiting
            }]
        );
    }

    #[test]
    fn new_jobs_need_both_slots() {
        let usage = SlotUsage {
            launching: 1,
            alive: 1,
            ..Default::default()
        };
        let out = plan(usage, Caps { launch: 2, run: 5 }, &[], &[c(1, 0), c(2, 0)]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].id, 1);
    }

    #[test]
    fn the_states_are_rendered_for_sql() {
        assert_eq!(states_sql(HOLDS_LAUNCH_SLOT), "'Launching'");
        assert_eq!(
            states_sql(HOLDS_RUN_SLOT),
            "'Launching', 'Alive', 'AliveWaiting'"
        );
    }

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

    fn gpu_node(name: &str) -> NodeInfo {
        let mut allocatable = Resources::new();
        allocatable.set("nvidia.com/gpu", 8 * ONE);
        allocatable.set(PODS, 110 * ONE);
        NodeInfo {
            name: name.into(),
            labels: [("pool".to_string(), "gpu".to_string())].into(),
            allocatable,
            ready: true,
            ..Default::default()
        }
    }

    fn team(nominal: i64) -> QueuePolicy {
        QueuePolicy {
            quotas: QueueQuotas {
                cohort: Some("gpus".into()),
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
            preemption: Preemption::OFF,
        }
    }

    fn gpu_pools() -> Queues {
        Queues::new(BTreeMap::new()).with_pools(
            [(
                "gpu".to_string(),
                Placement {
                    pool: "gpu".into(),
                    node_labels: [("pool".to_string(), "gpu".to_string())].into(),
                    tolerations: vec![],
                },
            )]
            .into(),
        )
    }

    fn cluster(nodes: usize, a: &QueuePolicy, b: &QueuePolicy) -> Cluster {
        Cluster {
            ledger: Ledger::new(
                [
                    ("team-a".to_string(), a.quotas.clone()),
                    ("team-b".to_string(), b.quotas.clone()),
                ]
                .into(),
                BTreeMap::new(),
            ),
            nodes: Some(Nodes::new(
                (0..nodes).map(|i| gpu_node(&format!("n{i}"))).collect(),
            )),
        }
    }

    fn view(name: &str, policy: &QueuePolicy, jobs: Vec<Candidate>) -> QueueView {
        QueueView {
            name: name.into(),
            policy: Some(policy.clone()),
            load: QueueLoad::default(),
            relaunches: vec![],
            new_jobs: jobs,
        }
    }

    fn held(plan: &Plan, queue_of: impl Fn(i64) -> char, d: impl Fn(i64) -> i64) -> (i64, i64) {
        let mut out = (0, 0);
        for a in &plan.admissions {
            if queue_of(a.id) == 'a' {
                out.0 += d(a.id);
            } else {
                out.1 += d(a.id);
            }
        }
        out
    }

    /// The table, one pass: 4 nodes of 8 GPUs, team-a's 8 jobs of 8 GPUs and team-b's
    /// 32 jobs of 1 GPU both waiting, 16 + 16 nominal in one cohort: 16 : 16, whatever the
    /// run cap lets through.
    #[test]
    fn two_teams_waiting_get_their_nominal_gpus() {
        let (a, b) = (team(16), team(16));
        let big: Vec<Candidate> = (0..8)
            .map(|i| Candidate {
                demand: Some(gpus(8)),
                ..c(i, 0)
            })
            .collect();
        let small: Vec<Candidate> = (100..132)
            .map(|i| Candidate {
                demand: Some(gpus(1)),
                ..c(i, 0)
            })
            .collect();
        // With 18 run slots or more, GPUs bind: 16 : 16. With 16, slots bind first: team-a's
        // two jobs within its nominal quota, then team-b's (team-a's third would borrow).
        for (run, want) in [(1000, (16, 16)), (18, (16, 16)), (16, (16, 14))] {
            let mut cl = cluster(4, &a, &b);
            let plan = plan_resources(
                SlotUsage::default(),
                Caps { launch: 100, run },
                &[
                    view("team-a", &a, big.clone()),
                    view("team-b", &b, small.clone()),
                ],
                &gpu_pools(),
                &mut cl,
            );
            let (ga, gb) = held(
                &plan,
                |id| if id < 100 { 'a' } else { 'b' },
                |id| if id < 100 { 8 } else { 1 },
            );
            assert_eq!((ga, gb), want, "run cap {run}");
            for adm in &plan.admissions {
                assert_eq!(plan.placements[&adm.id].pool, "gpu");
            }
            // team-a's third job waits: its queue's quota is used and team-b uses its own.
            let why = &plan.waits[&2];
            assert!(
                matches!(why, WhyNot::Quota(_) | WhyNot::Fit { .. }),
                "{why:?}"
            );
        }
    }

    /// The plan for one job of team-a (`a`, caps of 10) asking for `demand`, on `cl`.
    fn one_job_of_team_a(a: &QueuePolicy, demand: Demand, cl: &mut Cluster) -> Plan {
        plan_resources(
            SlotUsage::default(),
            Caps {
                launch: 10,
                run: 10,
            },
            &[view(
                "team-a",
                a,
                vec![Candidate {
                    demand: Some(demand),
                    ..c(1, 0)
                }],
            )],
            &gpu_pools(),
            cl,
        )
    }

    /// An 8-GPU Pod on 2 nodes of 4 free GPUs each: not admitted, the reason in numbers.
    #[test]
    fn a_pod_larger_than_any_node_is_not_admitted() {
        let a = team(64);
        let mut cl = cluster(2, &a, &a);
        if let Some(nodes) = cl.nodes.as_mut() {
            let half = gpus(4);
            for i in 0..2 {
                nodes.place(
                    &half.per_member,
                    1,
                    &crate::resources::fit::Constraints {
                        node_selector: [("pool".to_string(), "gpu".to_string())].into(),
                        ..Default::default()
                    },
                );
                let _ = i;
            }
        }
        let plan = one_job_of_team_a(&a, gpus(8), &mut cl);
        assert!(plan.admissions.is_empty());
        match &plan.waits[&1] {
            WhyNot::Fit {
                pool, shortfall, ..
            } => {
                assert_eq!(pool, "gpu");
                assert_eq!(shortfall.largest_free.1, 4 * ONE);
                assert_eq!(shortfall.members_fit, 0);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            plan.waits[&1].said("team-a").1,
            "needs {nvidia.com/gpu: 8, pods: 1} on pool gpu: its 2 Ready nodes take 0 of 1 member now; the most nvidia.com/gpu free on one node is 4"
        );
    }

    /// A 9-GPU Pod on nodes of 8: it waits, and says no node of the pool can ever take it.
    #[test]
    fn a_pod_larger_than_every_node_says_it_never_fits_as_they_are() {
        let a = team(64);
        let mut cl = cluster(2, &a, &a);
        let plan = one_job_of_team_a(&a, gpus(9), &mut cl);
        assert!(plan.admissions.is_empty());
        assert_eq!(
            plan.waits[&1].said("team-a").1,
            "needs {nvidia.com/gpu: 9, pods: 1} on pool gpu: its 2 Ready nodes could take only 0 of 1 member even with nothing else on them (the most nvidia.com/gpu one node has is 8): it waits for larger or more nodes"
        );
    }

    /// A queue without pools admits on slots alone, exactly as before.
    #[test]
    fn a_queue_without_pools_ignores_quotas_and_nodes() {
        let plain = QueuePolicy::implicit_default();
        let mut cl = Cluster::default();
        let plan = plan_resources(
            SlotUsage::default(),
            Caps { launch: 2, run: 2 },
            &[view(
                "default",
                &plain,
                vec![
                    Candidate {
                        demand: Some(gpus(100)),
                        ..c(1, 0)
                    },
                    c(2, 0),
                    c(3, 0),
                ],
            )],
            &Queues::single_pool(),
            &mut cl,
        );
        let ids: Vec<i64> = plan.admissions.iter().map(|a| a.id).collect();
        assert_eq!(ids, vec![1, 2]);
        assert!(plan.placements.is_empty());
    }

    /// StrictFIFO holds the queue behind a head that does not fit; BestEffortFIFO lets the
    /// next job go.
    #[test]
    fn strict_fifo_holds_and_best_effort_skips() {
        for (strategy, admitted) in [
            (QueueingStrategy::StrictFIFO, vec![]),
            (QueueingStrategy::BestEffortFIFO, vec![2]),
        ] {
            let mut a = team(64);
            a.strategy = strategy;
            let mut cl = cluster(1, &a, &a);
            let plan = plan_resources(
                SlotUsage::default(),
                Caps {
                    launch: 10,
                    run: 10,
                },
                &[view(
                    "team-a",
                    &a,
                    vec![
                        Candidate {
                            demand: Some(gpus(16)),
                            ..c(1, 0)
                        },
                        Candidate {
                            demand: Some(gpus(1)),
                            ..c(2, 0)
                        },
                    ],
                )],
                &gpu_pools(),
                &mut cl,
            );
            let ids: Vec<i64> = plan.admissions.iter().map(|a| a.id).collect();
            assert_eq!(ids, admitted, "{strategy:?}");
            assert!(plan.waits.contains_key(&1));
        }
    }
}
