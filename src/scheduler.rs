//! Admission: which queued jobs get a launch slot now (docs/design.md#scheduling and #queues).
//!
//! [`plan_queues`] is a pure function over counts and queue heads; [`pass`] reads those from the
//! store, plans, and applies each admission as a compare-and-set. Rules, after SkyPilot's
//! `maybe_schedule_next_jobs` with its known faults fixed, and queues for teams:
//! - AliveWaiting jobs (recoveries and restarts) are admitted before new jobs and need only a
//!   launch slot: a recovery is never blocked behind a new job that lacks a run slot. Across
//!   queues the next launch slot goes to the relaunch of the queue with the fewest launching
//!   jobs per weight; each stays within its queue's `maxLaunching`. A relaunch already holds
//!   its run slot: it is inside its queue's share.
//! - New (Waiting) jobs need a launch slot and a run slot. Across queues the next one goes to
//!   the queue with the lowest run slots held / weight ([`crate::queues::share_order`]) among
//!   those that can admit a job now (the queue exists, admits the job's namespace, is below its
//!   `maxRunning` and `maxLaunching`): work-conserving, no slot stays idle while an admissible
//!   job waits, and a running job is never preempted.
//! - Within a queue: higher priority first, then earlier creation (`metadata.creationTimestamp`,
//!   one-second resolution), then lower job id: FIFO within a priority.
//! - A job whose queue refuses its namespace is never admitted, whatever its spec says.
//!
//! With no queue objects every job of the default queue is in one pool: exactly the rules
//! before queues existed ([`plan`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::admission::{Cluster, WhyNot};
use crate::api::{DEFAULT_QUEUE, ScheduleState, WaitReason};
use crate::capacity::{Caps, SlotUsage};
use crate::lifecycle;
use crate::lifecycle::JobRow;
use crate::queues::{self, QueueLoad, QueuePolicy, Queues};
use crate::resources::fit::{ClusterSnapshot, Nodes};
use crate::resources::quota::Ledger;
use crate::store::{Cas, Queued, Store, StoreError};

pub use crate::admission::{Admission, Candidate, QueueView, plan, plan_queues};

/// What one pass did.
#[derive(Debug, Default)]
pub struct PassResult {
    /// New jobs moved Waiting -> Launching: the caller must start their job controller process.
    pub started: Vec<JobRow>,
    /// Relaunches moved AliveWaiting -> Launching: the caller must wake their process.
    pub relaunched: Vec<JobRow>,
    /// Slot usage after the pass.
    pub usage: SlotUsage,
    /// Waiting jobs told anew what they wait for ([`Store::tell_waiting`]).
    pub messages: usize,
    /// Running jobs chosen as preemption victims ([`crate::preemption::plan`]): the caller must
    /// wake their process, which stops them.
    pub preempted: Vec<JobRow>,
}

/// What a pass knows when it says why a queue's jobs wait ([`why_waiting`]).
#[derive(Clone, Debug)]
pub struct WaitContext<'a> {
    /// The queues in force.
    pub queues: &'a Queues,
    /// Each queue's slots held, after the pass.
    pub loads: &'a BTreeMap<String, QueueLoad>,
    /// The slots held in all, after the pass.
    pub usage: SlotUsage,
    /// The caps.
    pub caps: Caps,
    /// Run slots held by Pods waiting for a node.
    pub node_waits: usize,
    /// Queues with jobs waiting that could admit one (they exist and are below their limits).
    pub backlogged: usize,
    /// The sum of their weights.
    pub backlogged_weight: u64,
}

/// Why a job of `namespace` (None: any namespace its queue admits) in `queue` waits, and the
/// sentence its status shows: its queue's own reasons first ([`queues::blocked`]), then, with
/// the run cap full, its queue's share ([`queues::share_used`]) or the run cap, then the launch
/// cap. The caps' sentences are those of one pool ([`lifecycle::queued_message`]; the job's
/// `status.queue` names its queue), so with no queue objects every message is as before queues
/// existed.
pub fn why_waiting(
    w: &WaitContext<'_>,
    queue: &str,
    namespace: Option<&str>,
) -> (WaitReason, String) {
    let load = w.loads.get(queue).copied().unwrap_or_default();
    if let Some(b) = queues::blocked(w.queues, queue, namespace, load) {
        return b;
    }
    let weight = w.queues.get(queue).map_or(1, |p| p.weight);
    let (u, c) = (w.usage, w.caps);
    let pool = lifecycle::queued_message(u.launching, c.launch, u.alive, c.run, w.node_waits);
    if u.alive >= c.run {
        if queues::share_used(load.alive, weight, c.run, w.backlogged, w.backlogged_weight) {
            return (
                WaitReason::ShareUsed,
                queues::share_used_message(queue, weight),
            );
        }
        (WaitReason::RunCapReached, pool)
    } else if u.launching >= c.launch {
        (WaitReason::LaunchCapReached, pool)
    } else {
        (WaitReason::Queued, pool)
    }
}

/// One scheduling pass in one pool (no queue objects); see [`pass_queues`].
pub fn pass(store: &mut Store, caps: Caps) -> Result<PassResult, StoreError> {
    pass_queues(store, caps, &Queues::single_pool())
}

/// One scheduling pass over the store under `queues`: plans ([`plan_queues`]) and applies
/// admissions as compare-and-sets, then tells every waiting job why it waits
/// ([`why_waiting`], [`Store::tell_waiting`]).
///
/// Reads: the slots held in all and per queue (over the live jobs' index), the relaunches, the
/// queues that have waiting jobs (one index seek each), and the heads of only those queues that
/// could get a slot this pass: with `f` new jobs admissible (free launch and run slots), the
/// planner admits only from the `f` queues of lowest share that have an admissible job, so the
/// pass reads heads in share order until it has found `f` of them. Then one index seek per
/// group of waiting jobs (queue and namespace) and an UPDATE of the groups whose reason
/// changed. Nothing it reads grows with finished jobs, nor with the jobs of a group whose reason
/// holds.
pub fn pass_queues(
    store: &mut Store,
    caps: Caps,
    queues: &Queues,
) -> Result<PassResult, StoreError> {
    pass_queues_paced(store, caps, queues, usize::MAX)
}

/// [`pass_queues`] admitting at most `max_new` new jobs ([`crate::pacing`]: while a burst of
/// jobs arrives); relaunches are never held back. Jobs the limit holds keep waiting with the
/// message a pass gives them (the pacing lasts seconds).
pub fn pass_queues_paced(
    store: &mut Store,
    caps: Caps,
    queues: &Queues,
    max_new: usize,
) -> Result<PassResult, StoreError> {
    pass_resources(store, caps, queues, max_new, None)
}

/// [`pass_queues_paced`] with admission in resources for the queues with pools
/// ([`crate::admission::plan_resources`]): `cluster` is the cluster as the operator's watches
/// see it (None while it is not known: no job of a queue with pools is admitted then, and each
/// says so). Every candidate looked at and not admitted for its quota or the nodes is told its
/// own reason, in numbers ([`WhyNot::said`]); the others of its queue, that the jobs ahead of
/// them wait for it.
pub fn pass_resources(
    store: &mut Store,
    caps: Caps,
    queues: &Queues,
    max_new: usize,
    cluster: Option<&ClusterSnapshot>,
) -> Result<PassResult, StoreError> {
    let now = lifecycle::now_ms();
    let mut loads = store.queue_usage()?;
    let usage = store.slot_usage()?;
    let waiting_queues = if usage.waiting > 0 {
        store.waiting_queues()?
    } else {
        Vec::new()
    };
    // New jobs take a run slot each and relaunches none: a run cap of `max_new` more than the
    // slots held admits at most `max_new` new jobs and every relaunch the launch cap allows.
    let admit_caps = Caps {
        run: caps.run.min(usage.alive.saturating_add(max_new)),
        ..caps
    };
    let (mut result, waits, seen) = admit(
        store,
        admit_caps,
        queues,
        usage,
        &mut loads,
        &waiting_queues,
        now,
        cluster,
    )?;
    if result.usage.waiting > 0 && result.usage.alive >= caps.run {
        result.preempted = preempt(store, caps, queues, &waiting_queues, now)?;
    }
    if let Some(cluster) = cluster {
        let reclaimed = reclaim(store, queues, cluster, &waits, now)?;
        result.preempted.extend(reclaimed);
    }
    if result.usage.waiting > 0 {
        let w = wait_context(store, caps, queues, &loads, &waiting_queues, result.usage)?;
        let told = told_apart(&waits, &seen.relaunches);
        result.messages = store.tell_jobs(now, &told, &seen.said)?;
        // The first job of each queue that waits for its quota or the nodes: the others of
        // the queue wait behind it, told what it needs (the numbers are in its own status).
        let mut first: BTreeMap<&str, (WaitReason, String)> = BTreeMap::new();
        for ((_, queue, why), (_, reason, message)) in waits.iter().zip(&told) {
            first.entry(queue.as_str()).or_insert_with(|| {
                let said = why.needs().map_or_else(
                    || message.clone(),
                    |needs| format!("{needs}: its status says why in numbers"),
                );
                (*reason, said)
            });
        }
        let skip: Vec<(i64, &str)> = waits.iter().map(|(id, q, _)| (*id, q.as_str())).collect();
        result.messages += store.tell_waiting_except(now, &skip, |queue, namespace| {
            let (reason, message) = why_waiting(&w, queue, Some(namespace));
            match first.get(queue) {
                Some((first, said)) if reason == WaitReason::Queued => (
                    *first,
                    format!("waiting behind earlier jobs of queue {queue}; the first {said}"),
                ),
                _ => (reason, message),
            }
        })?;
    }
    Ok(result)
}

/// What each candidate that waits for its quota or the nodes is told (`waits` in admission
/// order): the first new job of its queue that needs the same on the same pool, where the same
/// nodes admit it, for the same reason, gets the numbers ([`WhyNot::said`]); the others, that
/// they wait as it does, without them. A relaunch (`relaunches`) is always told its own
/// numbers: its quota is counted with what it holds given back.
///
/// The numbers (what a cohort lends, what is free on a node) change with every admission and
/// end in the cohort: said to every candidate, each change was a status write for each (600
/// a pass at 10,000 waiting, `bench --scenario poolpass`); said to one per queue and demand,
/// the others' messages hold while that first job stays first.
fn told_apart(waits: &Waits, relaunches: &HashSet<i64>) -> Vec<(i64, WaitReason, String)> {
    let mut firsts: HashSet<(&str, WaitReason, String, String)> = Default::default();
    waits
        .iter()
        .map(|(id, queue, why)| {
            let reason = why.reason();
            let follows = match why.needs() {
                Some(needs) if !relaunches.contains(id) => {
                    // Where its members may go is part of what it needs: two jobs of one size
                    // with other node selectors wait for other nodes.
                    let nodes = match why {
                        WhyNot::Fit { demand, .. } => format!(
                            "{:?}",
                            (&demand.node_selector, &demand.affinity, &demand.tolerations)
                        ),
                        _ => String::new(),
                    };
                    let first = (queue.as_str(), reason, needs, nodes);
                    match firsts.contains(&first) {
                        true => Some(first.2),
                        false => {
                            firsts.insert(first);
                            None
                        }
                    }
                }
                _ => None,
            };
            // Only a first job's sentence is made: the numbers cost a format each.
            match follows {
                Some(needs) => (
                    *id,
                    reason,
                    format!(
                        "{needs}: waits as an earlier job of queue {queue} that needs as much does; its status says why in numbers"
                    ),
                ),
                None => {
                    let (reason, message) = why.said(queue);
                    (*id, reason, message)
                }
            }
        })
        .collect()
}

/// Chooses and requests preemptions ([`crate::preemption::plan`]) once the run cap is full,
/// when a queue with waiting jobs may preempt: reads every job holding a run slot (the live
/// jobs' index), the admissible heads of the queues with waiting jobs (at most the run cap's
/// worth each) and the recent preemptions (their index); persists each victim's request as a
/// compare-and-set ([`lifecycle::preempt`]: a job that moved meanwhile is skipped).
fn preempt(
    store: &mut Store,
    caps: Caps,
    queues: &Queues,
    waiting_queues: &[String],
    now: i64,
) -> Result<Vec<JobRow>, StoreError> {
    let may = waiting_queues
        .iter()
        .any(|q| queues.get(q).is_some_and(|p| p.preemption.enabled()));
    if !may {
        return Ok(Vec::new());
    }
    let mut states: BTreeMap<String, crate::preemption::QueueState> = BTreeMap::new();
    let state = |name: &str, policy: &QueuePolicy| crate::preemption::QueueState {
        name: name.to_string(),
        weight: policy.weight,
        max_running: policy.max_running,
        policy: policy.preemption,
        held: 0,
        waiting: Vec::new(),
        running: Vec::new(),
        recent: 0,
    };
    for (queue, running) in store.live_for_preemption()? {
        let Some(policy) = queues.get(&queue) else {
            continue;
        };
        let s = states
            .entry(queue.clone())
            .or_insert_with(|| state(&queue, policy));
        s.held += 1;
        s.running.push(running);
    }
    for name in waiting_queues {
        let Some(policy) = queues.get(name) else {
            continue;
        };
        let heads = store.queue_candidates(name, policy.admits.only(), caps.run, now)?;
        if heads.is_empty() {
            continue;
        }
        states
            .entry(name.clone())
            .or_insert_with(|| state(name, policy))
            .waiting = heads.iter().map(|q| q.priority).collect();
    }
    for (queue, n) in store.recent_preemptions(now - crate::preemption::RATE_WINDOW_MS)? {
        if let Some(s) = states.get_mut(&queue) {
            s.recent = n;
        }
    }
    let states: Vec<_> = states.into_values().collect();
    let mut out = Vec::new();
    for v in crate::preemption::plan(&states, caps.run, true, now) {
        let Some(row) = store.find(v.id)? else {
            continue;
        };
        if let Cas::Applied(row) =
            store.transition(v.id, &lifecycle::preempt(&row, &v.by, v.within, now))?
        {
            tracing::info!(job_id = row.id, job = %row.key(), queue = %row.queue, by = %v.by, "preempting: its run slot goes to queue {}", v.by);
            out.push(*row);
        }
    }
    Ok(out)
}

/// Takes back lent quota ([`crate::preemption::reclaim`]): the candidates of queues with
/// `reclaimWithinCohort` that wait for their quota or the nodes (`waits`, in admission order)
/// claim what the other queues of their cohort borrow on the pool; each victim's request is
/// persisted as a compare-and-set ([`lifecycle::reclaim`]: a job that moved meanwhile is
/// skipped). Reads the pooled live jobs (their index) only when a claimant exists.
fn reclaim(
    store: &mut Store,
    queues: &Queues,
    cluster: &ClusterSnapshot,
    waits: &Waits,
    now: i64,
) -> Result<Vec<JobRow>, StoreError> {
    let claiming: Vec<i64> = waits
        .iter()
        .filter(|(_, queue, why)| {
            matches!(why, WhyNot::Quota(_) | WhyNot::Fit { .. })
                && queues
                    .get(queue)
                    .is_some_and(|p| p.preemption.reclaim_within_cohort)
        })
        .map(|(id, _, _)| *id)
        .collect();
    if claiming.is_empty() {
        return Ok(Vec::new());
    }
    let mut demands = store.demands_of(&claiming)?;
    let claimants: Vec<crate::preemption::Claimant> = waits
        .iter()
        .filter(|(id, _, _)| claiming.contains(id))
        .filter_map(|(id, queue, _)| {
            let demand = demands.remove(id)?.0?;
            Some(crate::preemption::Claimant {
                id: *id,
                queue: queue.clone(),
                demand,
            })
        })
        .collect();
    // One read of the pooled jobs serves the nodes' reservations and the holders.
    let pooled = store.pooled_jobs()?;
    let ledger = Ledger::new(queues.quotas(), crate::store::resources::usage_of(&pooled));
    let nodes = nodes_now(cluster, &pooled);
    let holders: Vec<crate::preemption::Holder> = pooled
        .into_iter()
        .map(|j| crate::preemption::Holder {
            nodes: cluster
                .bound
                .get(&(j.uid.clone(), j.attempt))
                .map(|names| names.iter().filter_map(|n| nodes.index(n)).collect())
                .unwrap_or_default(),
            id: j.id,
            queue: j.queue.clone(),
            priority: j.priority,
            running_since_ms: j.running_since_ms,
            pool: j.pool.clone(),
            demand: (*j.demand).clone(),
            leaving_for: j.leaving_for.clone(),
        })
        .collect();
    let recent = store.recent_preemptions(now - crate::preemption::RATE_WINDOW_MS)?;
    let victims =
        crate::preemption::reclaim(&claimants, &holders, queues, &ledger, &nodes, &recent, now);
    let mut out = Vec::new();
    for v in victims {
        let Some(row) = store.find(v.id)? else {
            continue;
        };
        if let Cas::Applied(row) = store.transition(v.id, &lifecycle::reclaim(&row, &v.by, now))? {
            tracing::info!(job_id = row.id, job = %row.key(), queue = %row.queue, by = %v.by, pool = ?row.pool, "preempting: queue {} takes back the quota it lent", v.by);
            out.push(*row);
        }
    }
    Ok(out)
}

fn policy_room(policy: &QueuePolicy, load: QueueLoad) -> usize {
    let run = policy
        .max_running
        .map_or(usize::MAX, |m| m.saturating_sub(load.alive));
    let launch = policy
        .max_launching
        .map_or(usize::MAX, |m| m.saturating_sub(load.launching));
    run.min(launch)
}

/// `q` as the planner sees it: with its demand and pool (a relaunch's) when its queue has
/// pools (`metered`), slots only otherwise.
fn candidate(q: &Queued, metered: bool) -> Candidate {
    Candidate {
        id: q.id,
        priority: q.priority,
        namespace: q.namespace.clone(),
        demand: q.demand.as_deref().filter(|_| metered).cloned(),
        pool: q.pool.clone().filter(|_| metered),
    }
}

/// How many waiting jobs past its free slots a pass reads of a queue with pools: under
/// `BestEffortFIFO` a job that does not fit its quota or the nodes lets the next go first, so
/// the pass looks this far down the queue (its cost is bounded whatever the backlog; a job
/// further down waits for a later pass).
pub const LOOKAHEAD: usize = 32;

/// What admission in resources reads beyond slots, for the queues with pools: every queue's
/// quotas with what it uses (from the store), and the nodes of the cluster with what is free on
/// each, less what admitted attempts reserved and have not bound yet (`cluster`; None while
/// the operator has not listed the cluster: nothing is admitted onto a pool then).
fn resources_now(
    store: &Store,
    queues: &Queues,
    cluster: Option<&ClusterSnapshot>,
) -> Result<Cluster, StoreError> {
    // With the cluster known, one read of the pooled jobs serves the quotas' usage and the
    // nodes' reservations.
    let (usage, nodes) = match cluster {
        None => (store.quota_usage()?, None),
        Some(snapshot) => {
            let pooled = store.pooled_jobs()?;
            let usage = crate::store::resources::usage_of(&pooled);
            (usage, Some(nodes_now(snapshot, &pooled)))
        }
    };
    let ledger = Ledger::new(queues.quotas(), usage);
    Ok(Cluster { ledger, nodes })
}

/// The nodes of `snapshot` with what is free on each, less what the members of `pooled` that
/// are not bound yet reserved by their admission.
fn nodes_now(snapshot: &ClusterSnapshot, pooled: &[Arc<crate::store::resources::Pooled>]) -> Nodes {
    let mut nodes = Nodes::new(snapshot.nodes.clone());
    for job in pooled {
        let (Some(placement), false) = (&job.placement, job.demand.local) else {
            continue;
        };
        let bound = snapshot
            .bound
            .get(&(job.uid.clone(), job.attempt))
            .map_or(0, Vec::len);
        let unbound = (job.demand.members as usize).saturating_sub(bound);
        if unbound == 0 {
            continue;
        }
        if let Some(constraints) = job.demand.constraints(placement) {
            let _ = nodes.place(&job.demand.per_member, unbound as u32, &constraints);
        }
    }
    nodes
}

/// What [`admit`] decided beyond its admissions: why the candidates it looked at wait (by job
/// id, with their queue), in admission order.
type Waits = Vec<(i64, String, WhyNot)>;

/// The candidates [`admit`] read.
#[derive(Default)]
struct Seen {
    /// The relaunches among them.
    relaunches: HashSet<i64>,
    /// Each one's digest of what it was last told ([`crate::store::Queued::reason_key`]).
    said: HashMap<i64, i64>,
}

#[allow(clippy::too_many_arguments)]
fn admit(
    store: &mut Store,
    caps: Caps,
    queues: &Queues,
    usage: SlotUsage,
    loads: &mut BTreeMap<String, QueueLoad>,
    waiting_queues: &[String],
    now: i64,
    cluster: Option<&ClusterSnapshot>,
) -> Result<(PassResult, Waits, Seen), StoreError> {
    let free_launch = caps.launch.saturating_sub(usage.launching);
    if free_launch == 0 {
        return Ok((
            PassResult {
                usage,
                ..Default::default()
            },
            Vec::new(),
            Seen::default(),
        ));
    }
    let metered = queues.any_quotas();
    let pooled = |policy: &QueuePolicy| !policy.quotas.pools.is_empty();
    let mut views: BTreeMap<String, QueueView> = BTreeMap::new();
    let view = |name: &str, loads: &BTreeMap<String, QueueLoad>| -> QueueView {
        QueueView {
            name: name.to_string(),
            policy: queues.get(name).cloned(),
            load: loads.get(name).copied().unwrap_or_default(),
            relaunches: Vec::new(),
            new_jobs: Vec::new(),
        }
    };
    let mut said = HashMap::new();
    if usage.alive_waiting > 0 {
        for r in store.relaunch_candidates(now)? {
            said.insert(r.id, r.reason_key);
            let with_pools = queues.get(&r.queue).is_some_and(pooled);
            views
                .entry(r.queue.clone())
                .or_insert_with(|| view(&r.queue, loads))
                .relaunches
                .push(candidate(&r, with_pools));
        }
    }
    // New jobs: only the queues that could get one of the `free` slots, in share order.
    let free = free_launch.min(caps.run.saturating_sub(usage.alive));
    if free > 0 {
        let mut open: Vec<(&str, &QueuePolicy, QueueLoad)> = waiting_queues
            .iter()
            .filter_map(|name| {
                let policy = queues.get(name)?;
                let load = loads.get(name).copied().unwrap_or_default();
                (policy_room(policy, load) > 0).then_some((name.as_str(), policy, load))
            })
            .collect();
        open.sort_by(|a, b| {
            queues::share_order((a.2.alive, a.1.weight, a.0), (b.2.alive, b.1.weight, b.0))
        });
        let mut found = 0;
        for (name, policy, load) in open {
            // A queue with pools may admit none of its heads (quota, fit): it is read whatever
            // was found before it, and further down.
            if found >= free && !pooled(policy) {
                continue;
            }
            let mut limit = free.min(policy_room(policy, load));
            if pooled(policy) && policy.strategy == crate::api::QueueingStrategy::BestEffortFIFO {
                limit = limit.saturating_add(LOOKAHEAD);
            }
            let heads = store.queue_candidates(name, policy.admits.only(), limit, now)?;
            if heads.is_empty() {
                continue;
            }
            if !pooled(policy) {
                found += 1;
            }
            said.extend(heads.iter().map(|q| (q.id, q.reason_key)));
            views
                .entry(name.to_string())
                .or_insert_with(|| view(name, loads))
                .new_jobs
                .extend(heads.iter().map(|q| candidate(q, pooled(policy))));
        }
    }
    let views: Vec<QueueView> = views.into_values().collect();
    let queue_of: HashMap<i64, &str> = views
        .iter()
        .flat_map(|v| {
            v.relaunches
                .iter()
                .chain(&v.new_jobs)
                .map(move |c| (c.id, v.name.as_str()))
        })
        .collect();
    let plan = if metered {
        let mut resources = resources_now(store, queues, cluster)?;
        crate::admission::plan_resources(usage, caps, &views, queues, &mut resources)
    } else {
        crate::admission::Plan {
            admissions: plan_queues(usage, caps, &views),
            ..Default::default()
        }
    };
    let mut result = PassResult::default();
    for a in &plan.admissions {
        // A failed CAS means someone else moved the job (e.g. a cancel): skip it.
        let Some(row) = store.find(a.id)? else {
            continue;
        };
        if row.schedule_state != a.from {
            continue;
        }
        let placement = plan.placements.get(&a.id).cloned();
        if let Cas::Applied(row) =
            store.transition(a.id, &lifecycle::admit_onto(&row, placement))?
        {
            let queue = queue_of.get(&a.id).copied().unwrap_or(DEFAULT_QUEUE);
            let load = loads.entry(queue.to_string()).or_default();
            load.launching += 1;
            match a.from {
                ScheduleState::Waiting => {
                    load.alive += 1;
                    result.started.push(*row)
                }
                _ => result.relaunched.push(*row),
            }
        }
    }
    result.usage = store.slot_usage()?;
    // In admission order (each queue's new jobs, then its relaunches), so that the first of a
    // queue, whose reason the jobs behind it are told, is the same in every pass that sees the
    // same jobs (the plan's map has no order: a pass that changed nothing told every job
    // behind the candidates of a queue a new "first", 1,600 status writes a pass at 10,000
    // waiting).
    let order: HashMap<i64, usize> = views
        .iter()
        .flat_map(|v| v.new_jobs.iter().chain(&v.relaunches))
        .enumerate()
        .map(|(k, c)| (c.id, k))
        .collect();
    let mut waits: Waits = plan
        .waits
        .into_iter()
        .map(|(id, why)| {
            let queue = queue_of.get(&id).copied().unwrap_or(DEFAULT_QUEUE);
            (id, queue.to_string(), why)
        })
        .collect();
    waits.sort_by_key(|(id, _, _)| order.get(id).copied().unwrap_or(usize::MAX));
    let relaunches = views
        .iter()
        .flat_map(|v| v.relaunches.iter().map(|c| c.id))
        .collect();
    Ok((result, waits, Seen { relaunches, said }))
}

/// What [`why_waiting`] needs, read from the store after a pass (or on a visibility request):
/// `loads` and `usage` the slots held, `waiting_queues` the queues with Waiting jobs. Reads the
/// node waits (one index scan of the live jobs) only when the run cap is full.
pub fn wait_context<'a>(
    store: &Store,
    caps: Caps,
    queues: &'a Queues,
    loads: &'a BTreeMap<String, QueueLoad>,
    waiting_queues: &[String],
    usage: SlotUsage,
) -> Result<WaitContext<'a>, StoreError> {
    let node_waits = if usage.alive >= caps.run {
        store.node_waits()?
    } else {
        0
    };
    let (mut backlogged, mut backlogged_weight) = (0, 0u64);
    for name in waiting_queues {
        let load = loads.get(name).copied().unwrap_or_default();
        if let Some(p) = queues.get(name)
            && queues::blocked(queues, name, None, load).is_none()
        {
            backlogged += 1;
            backlogged_weight += u64::from(p.weight);
        }
    }
    Ok(WaitContext {
        queues,
        loads,
        usage,
        caps,
        node_waits,
        backlogged,
        backlogged_weight,
    })
}
