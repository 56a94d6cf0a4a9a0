//! The visibility API's answers, computed purely from what the store holds
//! ([`crate::store::visibility`]): the waiting jobs in the order the scheduler will admit them,
//! each with the reason it waits and an estimated start, and the jobs holding slots. Nothing
//! here is written back: positions are computed per request, never stored on the objects (that
//! would cost a write per job per admission).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::api::{ScheduleState, WaitReason};
use crate::capacity::{Caps, SlotUsage};
use crate::queues::{QueueLoad, Queues};
use crate::scheduler::{self, Candidate, QueueView, WaitContext};
use crate::store::visibility::BriefJob;

/// The API group and version of the visibility API.
pub const API_VERSION: &str = "visibility.managedjobs.dev/v1alpha1";

/// Finished jobs per queue whose run times give its pace ([`Pace`]).
pub const RUN_TIME_SAMPLES: usize = 50;

/// How far back those finished jobs may lie, ms: a queue idle for longer has no estimate.
pub const RUN_TIME_WINDOW_MS: i64 = 3_600_000;

/// Finished jobs of a queue below which its run times give no estimate: their median is the
/// run time used, and the median of three is the first that one job unlike the others (a
/// quick test, a run of another kind in the same queue) cannot set. Issue 43: a figure from
/// one unrelated job said 300 s against a true 100 s.
pub const MIN_RUN_SAMPLES: usize = 3;

/// What a queue's waiting jobs' starts are estimated from: its recent run times and how long
/// each of its jobs holding a run slot has run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pace {
    /// The queue's name (for the basis' sentence).
    pub queue: String,
    /// The run times (first start to finish, ms) of its last [`RUN_TIME_SAMPLES`] jobs that
    /// finished in the last [`RUN_TIME_WINDOW_MS`].
    pub run_times_ms: Vec<i64>,
    /// For each run slot its jobs hold now, how long the job in it has run its current
    /// attempt (ms; 0 while it launches or waits to relaunch).
    pub ages_ms: Vec<i64>,
}

impl Pace {
    /// The median of the recent run times (ms), when there are at least [`MIN_RUN_SAMPLES`].
    pub fn run_ms(&self) -> Option<i64> {
        if self.run_times_ms.len() < MIN_RUN_SAMPLES {
            return None;
        }
        let mut t: Vec<i64> = self.run_times_ms.iter().map(|t| (*t).max(0)).collect();
        t.sort_unstable();
        let n = t.len();
        Some(if n % 2 == 1 {
            t[n / 2]
        } else {
            (t[n / 2 - 1] + t[n / 2]) / 2
        })
    }
}

/// When a waiting job may start, and on what that rests: never a promise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Estimate {
    /// Seconds from the answer's time; None when there is no basis for a figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_seconds: Option<f64>,
    /// The start as an RFC 3339 time, when there is a figure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// What the figure rests on, or why there is none ("unknown: ...").
    pub basis: String,
}

impl Estimate {
    fn unknown(why: String) -> Estimate {
        Estimate {
            in_seconds: None,
            at: None,
            basis: format!("unknown: {why}"),
        }
    }
}

/// The estimated start of a waiting job that needs `k` (1-based) more of its queue's run slots
/// to free before it is admitted (it is the `k`-th of its queue's jobs that wait for one): each
/// slot its queue holds frees when its job has run the queue's median run time ([`Pace`]), then
/// again one median later, and so on; the `k`-th slot to free is its. With `k` = 0 a free slot
/// takes it at the next pass. No figure (`unknown`, with why) when fewer than
/// [`MIN_RUN_SAMPLES`] of its queue's jobs finished in the last hour, or when its queue holds
/// no run slot (it starts when a slot frees elsewhere, which its queue's pace cannot tell).
/// Jobs held by their queue's `maxRunning` are estimated the same way: only their queue's own
/// slots free for them.
pub fn estimate(k: usize, pace: &Pace) -> Estimate {
    if k == 0 {
        return Estimate {
            in_seconds: Some(0.0),
            at: None,
            basis: "slots are free: admitted at the next scheduling pass".into(),
        };
    }
    let Some(run_ms) = pace.run_ms() else {
        let n = pace.run_times_ms.len();
        return Estimate::unknown(format!(
            "{n} job{} of queue {} finished in the last hour; an estimate needs the run times of at least {MIN_RUN_SAMPLES}",
            if n == 1 { "" } else { "s" },
            pace.queue
        ));
    };
    let slots = pace.ages_ms.len();
    if slots == 0 {
        return Estimate::unknown(format!(
            "no job of queue {} holds a run slot now: it starts once a slot frees elsewhere",
            pace.queue
        ));
    }
    let mut free_at: Vec<i64> = pace
        .ages_ms
        .iter()
        .map(|age| (run_ms - age).max(0))
        .collect();
    free_at.sort_unstable();
    let rounds = ((k - 1) / slots) as i64;
    let ms = free_at[(k - 1) % slots] + rounds * run_ms;
    Estimate {
        in_seconds: Some((ms as f64 / 100.0).round() / 10.0),
        at: None,
        basis: format!(
            "{k} of queue {}'s {slots} run slot{} to free first, each after the queue's median run time ({:.1} s over its last {} finished jobs) less what its job has run; an estimate, not a promise",
            pace.queue,
            if slots == 1 { "" } else { "s" },
            run_ms as f64 / 1000.0,
            pace.run_times_ms.len()
        ),
    }
}

/// The order in which the scheduler would admit `waiting` (each queue's Waiting jobs in its
/// admission order, as [`crate::store::Store::waiting_brief`] returns them) if slots freed one
/// by one from the `loads` each queue holds now: [`scheduler::plan_queues`] itself, with caps
/// that never bind and no `maxLaunching` (each admission is one more run slot of its queue, so
/// the shares move as they will). Jobs it would not admit now (in a back-off, being cancelled,
/// their queue missing, refusing their namespace or at its `maxRunning`) come after, in their
/// queue's order. Returns the job ids in that order, and how many of them lead it (admissible).
pub fn admission_order(
    queues: &Queues,
    loads: &BTreeMap<String, QueueLoad>,
    waiting: &[BriefJob],
    now_ms: i64,
) -> (Vec<i64>, usize) {
    let mut views: BTreeMap<&str, QueueView> = BTreeMap::new();
    for j in waiting {
        let view = views.entry(j.queue.as_str()).or_insert_with(|| QueueView {
            name: j.queue.clone(),
            policy: queues.get(&j.queue).cloned().map(|mut p| {
                p.max_launching = None;
                p
            }),
            load: QueueLoad {
                launching: 0,
                alive: loads.get(&j.queue).map_or(0, |l| l.alive),
            },
            relaunches: Vec::new(),
            new_jobs: Vec::new(),
        });
        if admissible_now(j, now_ms) {
            view.new_jobs.push(Candidate {
                id: j.id,
                priority: j.priority,
                namespace: j.namespace.clone(),
                ..Default::default()
            });
        }
    }
    let views: Vec<QueueView> = views.into_values().collect();
    let unbounded = Caps {
        launch: usize::MAX,
        run: usize::MAX,
    };
    let usage = SlotUsage::default();
    let mut order: Vec<i64> = scheduler::plan_queues(usage, unbounded, &views)
        .into_iter()
        .map(|a| a.id)
        .collect();
    let lead = order.len();
    let placed: BTreeSet<i64> = order.iter().copied().collect();
    order.extend(
        waiting
            .iter()
            .map(|j| j.id)
            .filter(|id| !placed.contains(id)),
    );
    (order, lead)
}

/// True when a pass could admit `j` at `now_ms` as far as the job itself goes: not being
/// cancelled, not suspended, not in a back-off.
fn admissible_now(j: &BriefJob, now_ms: i64) -> bool {
    !j.cancel_requested && !j.suspended && j.backoff_until_ms.is_none_or(|t| t <= now_ms)
}

/// Which limit holds new jobs back now: `RunCap` (every run slot held), `LaunchCap` (every
/// launch slot held), or None (a new job can be admitted).
pub fn binding_limit(usage: SlotUsage, caps: Caps) -> Option<&'static str> {
    if usage.alive >= caps.run {
        Some("RunCap")
    } else if usage.launching >= caps.launch {
        Some("LaunchCap")
    } else {
        None
    }
}

/// New jobs that could be admitted at once: free launch slots and free run slots, the fewer.
pub fn room(usage: SlotUsage, caps: Caps) -> usize {
    caps.launch
        .saturating_sub(usage.launching)
        .min(caps.run.saturating_sub(usage.alive))
}

/// A waiting job in the answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitingJob {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `status.jobId`.
    pub job_id: i64,
    /// Its queue.
    pub queue: String,
    /// `spec.priority`.
    pub priority: i32,
    /// 1-based, among the waiting jobs of this answer, in the order they will be admitted
    /// (as slots free); jobs that cannot be admitted now (see `reason`) come last.
    pub position: usize,
    /// Why it waits: a `WaitReason` (`RunCapReached`, `ShareUsed`, `QueueMaxRunning`, ...),
    /// `BackOff` (retrying after a failure), or `Cancelling`.
    pub reason: String,
    /// The sentence its status shows (or would, for jobs past a queue's head).
    pub message: String,
    /// When it entered its queue (RFC 3339).
    pub waiting_since: String,
    /// When it may start.
    pub estimated_start: Estimate,
}

/// A job holding slots (Launching, Alive, AliveWaiting) in the answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LiveJob {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `status.jobId`.
    pub job_id: i64,
    /// Its queue.
    pub queue: String,
    /// Its phase.
    pub phase: String,
    /// Its schedule state.
    pub schedule_state: String,
    /// Its current attempt (1-based).
    pub attempt: i32,
    /// A pipeline's current task (0-based).
    pub task: i32,
    /// Its workload (Pod name, process), once launched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// When it first started (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// Its status message.
    pub message: String,
}

/// A job neither waiting nor holding a slot and not finished (suspended).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InactiveJob {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// `status.jobId`.
    pub job_id: i64,
    /// Its queue.
    pub queue: String,
    /// Its phase (`Suspended`, or `Pending` before it is queued).
    pub phase: String,
    /// Its status message.
    pub message: String,
}

/// Counts of one namespace's jobs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceCounts {
    /// The namespace.
    pub namespace: String,
    /// Jobs waiting for a slot.
    pub waiting: usize,
    /// Jobs holding a launch slot.
    pub launching: usize,
    /// Jobs holding a run slot (launching, running, waiting to relaunch).
    pub holding_run_slots: usize,
    /// Jobs suspended (or not yet queued).
    pub inactive: usize,
}

/// The caps and which one binds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CapsView {
    /// The launch cap (jobs launching at once).
    pub launch: usize,
    /// The run cap (jobs holding a run slot at once).
    pub run: usize,
    /// `RunCap`, `LaunchCap`, or absent: which holds new jobs back now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<String>,
}

/// Slots in use across the operator: shown only to a caller who may list ManagedJobs in every
/// namespace (the counts include every namespace's jobs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageView {
    /// Jobs holding a launch slot.
    pub launching: usize,
    /// Jobs holding a run slot.
    pub holding_run_slots: usize,
    /// Jobs waiting.
    pub waiting: usize,
}

/// A queue's quota in the answer: per pool and resource its nominal quota, use, borrowing and
/// lending (as its `status.pools`), for the queues with pools that admit a namespace shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueQuota {
    /// The ManagedJobQueue.
    pub queue: String,
    /// Per pool, in the queue's order.
    pub pools: Vec<crate::api::PoolUsage>,
    /// The namespaces it admits (None: every namespace); decides who is shown it, never sent.
    #[serde(skip)]
    pub admits: Option<BTreeSet<String>>,
}

/// The quotas of every queue with pools in `queues`, with what `usage` says their jobs use
/// ([`crate::store::Store::quota_usage`]).
pub fn quotas(
    queues: &Queues,
    usage: BTreeMap<String, BTreeMap<crate::resources::quota::Dim, crate::resources::Amount>>,
) -> Vec<QueueQuota> {
    if !queues.any_quotas() {
        return Vec::new();
    }
    let ledger = crate::resources::quota::Ledger::new(queues.quotas(), usage);
    ledger
        .quotas()
        .keys()
        .map(|name| QueueQuota {
            queue: name.clone(),
            pools: ledger.pool_usage(name),
            admits: queues.get(name).and_then(|p| p.admits.only().cloned()),
        })
        .collect()
}

/// The answer of `GET .../queue`: kind `JobQueue`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobQueue {
    /// [`API_VERSION`].
    pub api_version: String,
    /// `JobQueue`.
    pub kind: String,
    /// When it was computed (RFC 3339).
    pub generated_at: String,
    /// The namespaces it covers (those the caller may list ManagedJobs in); empty with
    /// `allNamespaces`.
    pub namespaces: Vec<String>,
    /// The caller may list ManagedJobs in every namespace: nothing was left out.
    pub all_namespaces: bool,
    /// The one queue (ManagedJobQueue) shown, when the request named one (`?queue=`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// The operator's caps; absent from an answer that shows no namespace (a caller of the
    /// every-namespace paths who may see none learns nothing but an empty answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caps: Option<CapsView>,
    /// The slots in use in all, for a caller of every namespace only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageView>,
    /// Per namespace shown, its counts.
    pub counts: Vec<NamespaceCounts>,
    /// How many jobs wait in all (of those shown): `waiting` holds the first `?limit=` of them.
    pub waiting_total: usize,
    /// The waiting jobs, in admission order.
    pub waiting: Vec<WaitingJob>,
    /// The jobs holding slots, by job id.
    pub live: Vec<LiveJob>,
    /// The suspended jobs, by job id.
    pub inactive: Vec<InactiveJob>,
    /// The quotas of the queues with pools that admit a namespace shown (of the one queue
    /// asked for, when one was).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<QueueQuota>,
}

/// What [`queue`] needs, read from the store at one moment.
pub struct Snapshot<'a> {
    /// Now, ms since epoch.
    pub now_ms: i64,
    /// The caps in force.
    pub caps: Caps,
    /// The slots held in all.
    pub usage: SlotUsage,
    /// The queues in force.
    pub queues: &'a Queues,
    /// Each queue's slots held.
    pub loads: &'a BTreeMap<String, QueueLoad>,
    /// Every Waiting job, per queue in admission order.
    pub waiting: &'a [BriefJob],
    /// Every job holding a run slot.
    pub live: &'a [BriefJob],
    /// Every Inactive job not finished.
    pub inactive: &'a [BriefJob],
    /// Each queue's pace, for those with waiting jobs.
    pub pace: &'a BTreeMap<String, Pace>,
    /// The context of each queue's reason ([`scheduler::why_waiting`]).
    pub wait: &'a WaitContext<'a>,
    /// The queues' quotas ([`quotas`]).
    pub quotas: &'a [QueueQuota],
}

/// The counts of `ns`, added when missing.
fn counted<'a>(
    counts: &'a mut BTreeMap<String, NamespaceCounts>,
    ns: &str,
) -> &'a mut NamespaceCounts {
    counts
        .entry(ns.to_string())
        .or_insert_with(|| NamespaceCounts {
            namespace: ns.to_string(),
            ..Default::default()
        })
}

/// Formats ms since epoch as RFC 3339 (UTC, ms).
pub fn rfc3339(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
        .unwrap_or_default()
}

/// What a waiting job of a queue with pools was told of its quota or the nodes by the last
/// pass (its own reason in numbers, or that it waits behind such a job of its queue): only a
/// pass knows the cluster, so the answer shows what it said rather than a reason of slots.
fn told_in_resources(queues: &Queues, j: &BriefJob) -> Option<(String, String)> {
    let pooled = queues
        .get(&j.queue)
        .is_some_and(|p| !p.quotas.pools.is_empty());
    let reason = j.wait_reason.as_deref()?;
    let resources = [
        WaitReason::InsufficientQuota,
        WaitReason::InsufficientCapacity,
        WaitReason::PoolMissing,
    ]
    .iter()
    .any(|r| r.as_str() == reason);
    let behind = reason == WaitReason::Queued.as_str()
        && j.message
            .starts_with("waiting behind earlier jobs of queue");
    (pooled && (resources || behind)).then(|| (reason.to_string(), j.message.clone()))
}

/// The `JobQueue` answer over every namespace: the waiting jobs in the order the scheduler
/// will admit them (positions across all namespaces), each with its reason and estimated
/// start, the jobs holding slots and the suspended ones, and the counts. A caller's answer is
/// this, [`restrict`]ed to what it may see.
pub fn queue(s: &Snapshot<'_>) -> JobQueue {
    let (order, lead) = admission_order(s.queues, s.loads, s.waiting, s.now_ms);
    let by_id: BTreeMap<i64, &BriefJob> = s.waiting.iter().map(|j| (j.id, j)).collect();
    let room = room(s.usage, s.caps);
    // Per queue: its admissible jobs so far, and how many of them free slots take now.
    let mut place_in_queue: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    let mut waiting = Vec::with_capacity(order.len());
    // The reason a queue's admissible jobs wait is the same for all of them: asked once.
    let mut why: BTreeMap<(&str, &str), (String, String)> = BTreeMap::new();
    for (i, id) in order.iter().enumerate() {
        let j = by_id[id];
        let lead = i < lead;
        let (reason, message) = if j.cancel_requested {
            ("Cancelling".to_string(), j.message.clone())
        } else if let Some(until) = j.backoff_until_ms.filter(|t| *t > s.now_ms) {
            (
                "BackOff".to_string(),
                format!("retrying after a failure, not before {}", rfc3339(until)),
            )
        } else if let Some(told) = told_in_resources(s.queues, j) {
            told
        } else {
            why.entry((j.queue.as_str(), j.namespace.as_str()))
                .or_insert_with(|| {
                    let (r, m) = scheduler::why_waiting(s.wait, &j.queue, Some(&j.namespace));
                    (r.as_str().to_string(), m)
                })
                .clone()
        };
        // Waiting for its queue's own slots: admissible as far as it goes, or held by its
        // queue's maxRunning (its place then counts after the queue's admissible jobs).
        let held = !lead && reason == WaitReason::QueueMaxRunning.as_str();
        let mut estimated_start = if lead || held {
            let (place, in_room) = place_in_queue.entry(j.queue.as_str()).or_default();
            *place += 1;
            if lead && i < room {
                *in_room += 1;
            }
            let none;
            let pace = match s.pace.get(&j.queue) {
                Some(p) => p,
                None => {
                    none = Pace {
                        queue: j.queue.clone(),
                        ..Pace::default()
                    };
                    &none
                }
            };
            estimate(*place - *in_room, pace)
        } else {
            Estimate::unknown("it cannot be admitted now (see its reason)".into())
        };
        if let Some(secs) = estimated_start.in_seconds {
            estimated_start.at = Some(rfc3339(s.now_ms + (secs * 1000.0) as i64));
        }
        waiting.push(WaitingJob {
            namespace: j.namespace.clone(),
            name: j.name.clone(),
            job_id: j.id,
            queue: j.queue.clone(),
            priority: j.priority,
            position: waiting.len() + 1,
            reason,
            message,
            waiting_since: rfc3339(j.queued_at_ms),
            estimated_start,
        });
    }
    let live = s
        .live
        .iter()
        .map(|j| LiveJob {
            namespace: j.namespace.clone(),
            name: j.name.clone(),
            job_id: j.id,
            queue: j.queue.clone(),
            phase: j.phase.as_str().into(),
            schedule_state: j.schedule_state.as_str().into(),
            attempt: j.attempt,
            task: j.task_index,
            workload: j.workload.clone(),
            started_at: j.started_at_ms.map(rfc3339),
            message: j.message.clone(),
        })
        .collect();
    let inactive = s
        .inactive
        .iter()
        .map(|j| InactiveJob {
            namespace: j.namespace.clone(),
            name: j.name.clone(),
            job_id: j.id,
            queue: j.queue.clone(),
            phase: j.phase.as_str().into(),
            message: j.message.clone(),
        })
        .collect();
    let mut all = JobQueue {
        api_version: API_VERSION.into(),
        kind: "JobQueue".into(),
        generated_at: rfc3339(s.now_ms),
        namespaces: Vec::new(),
        all_namespaces: true,
        queue: None,
        caps: Some(CapsView {
            launch: s.caps.launch,
            run: s.caps.run,
            binding: binding_limit(s.usage, s.caps).map(str::to_string),
        }),
        usage: Some(UsageView {
            launching: s.usage.launching,
            holding_run_slots: s.usage.alive,
            waiting: s.usage.waiting,
        }),
        counts: Vec::new(),
        waiting_total: 0,
        waiting,
        live,
        inactive,
        quotas: s.quotas.to_vec(),
    };
    all.waiting_total = all.waiting.len();
    all.counts = count(&all, None);
    all
}

/// Per namespace of `q` (and each of `visible`, even without jobs), its counts.
fn count(q: &JobQueue, visible: Option<&BTreeSet<String>>) -> Vec<NamespaceCounts> {
    let mut counts: BTreeMap<String, NamespaceCounts> = BTreeMap::new();
    for ns in visible.into_iter().flatten() {
        counted(&mut counts, ns);
    }
    for j in &q.waiting {
        counted(&mut counts, &j.namespace).waiting += 1;
    }
    for j in &q.live {
        let c = counted(&mut counts, &j.namespace);
        c.holding_run_slots += 1;
        if j.schedule_state == ScheduleState::Launching.as_str() {
            c.launching += 1;
        }
    }
    for j in &q.inactive {
        counted(&mut counts, &j.namespace).inactive += 1;
    }
    counts.into_values().collect()
}

/// What a caller who may see `visible` (None: every namespace) is shown of `all` (from
/// [`queue`]), of `queue` only when given, with at most `limit` waiting jobs (the first in
/// admission order; `waitingTotal` counts them all). Jobs of other namespaces are left out
/// and counted nowhere: positions are renumbered among the jobs shown, and the operator-wide
/// usage is shown only to a caller of every namespace asking for every queue. What still
/// reflects other namespaces' jobs: the estimates and which cap binds (documented).
pub fn restrict(
    all: &JobQueue,
    visible: Option<&BTreeSet<String>>,
    queue: Option<&str>,
    limit: Option<usize>,
) -> JobQueue {
    let shows = |ns: &str, q: &str| {
        visible.is_none_or(|v| v.contains(ns)) && queue.is_none_or(|want| want == q)
    };
    let mut waiting: Vec<WaitingJob> = all
        .waiting
        .iter()
        .filter(|j| shows(&j.namespace, &j.queue))
        .cloned()
        .collect();
    for (i, j) in waiting.iter_mut().enumerate() {
        j.position = i + 1;
    }
    let mut out = JobQueue {
        api_version: API_VERSION.into(),
        kind: "JobQueue".into(),
        generated_at: all.generated_at.clone(),
        namespaces: visible
            .map(|v| v.iter().cloned().collect())
            .unwrap_or_default(),
        all_namespaces: visible.is_none(),
        queue: queue.map(str::to_string),
        caps: if visible.is_some_and(|v| v.is_empty()) {
            None
        } else {
            all.caps.clone()
        },
        usage: if visible.is_none() && queue.is_none() {
            all.usage.clone()
        } else {
            None
        },
        counts: Vec::new(),
        waiting_total: waiting.len(),
        waiting,
        live: all
            .live
            .iter()
            .filter(|j| shows(&j.namespace, &j.queue))
            .cloned()
            .collect(),
        inactive: all
            .inactive
            .iter()
            .filter(|j| shows(&j.namespace, &j.queue))
            .cloned()
            .collect(),
        quotas: all
            .quotas
            .iter()
            .filter(|q| {
                queue.is_none_or(|want| want == q.queue)
                    && match (visible, &q.admits) {
                        (None, _) => true,
                        (Some(v), None) => !v.is_empty(),
                        (Some(v), Some(admits)) => v.iter().any(|ns| admits.contains(ns)),
                    }
            })
            .cloned()
            .collect(),
    };
    out.counts = count(&out, visible);
    if let Some(limit) = limit {
        out.waiting.truncate(limit);
    }
    out
}

/// The waiting job `job_id` of `all` as [`restrict`] to its `namespace` shows it (its position
/// among that namespace's waiting jobs), without cutting the whole answer: a job's detail.
pub fn waiting_in_namespace(all: &JobQueue, namespace: &str, job_id: i64) -> Option<WaitingJob> {
    all.waiting
        .iter()
        .filter(|j| j.namespace == namespace)
        .enumerate()
        .find(|(_, j)| j.job_id == job_id)
        .map(|(i, j)| WaitingJob {
            position: i + 1,
            ..j.clone()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(namespace: &str, job_id: i64) -> WaitingJob {
        WaitingJob {
            namespace: namespace.into(),
            name: format!("j{job_id}"),
            job_id,
            queue: "default".into(),
            priority: 0,
            position: 0,
            reason: "RunCapReached".into(),
            message: String::new(),
            waiting_since: rfc3339(0),
            estimated_start: Estimate {
                in_seconds: None,
                at: None,
                basis: String::new(),
            },
        }
    }

    fn queue_of(mut jobs: Vec<WaitingJob>) -> JobQueue {
        for (i, j) in jobs.iter_mut().enumerate() {
            j.position = i + 1;
        }
        let mut q = JobQueue {
            api_version: API_VERSION.into(),
            kind: "JobQueue".into(),
            generated_at: rfc3339(0),
            namespaces: Vec::new(),
            all_namespaces: true,
            queue: None,
            caps: Some(CapsView {
                launch: 1,
                run: 1,
                binding: None,
            }),
            usage: None,
            counts: Vec::new(),
            waiting_total: jobs.len(),
            waiting: jobs,
            live: Vec::new(),
            inactive: Vec::new(),
            quotas: Vec::new(),
        };
        q.counts = count(&q, None);
        q
    }

    #[test]
    fn a_caller_sees_the_quotas_of_the_queues_that_admit_its_namespaces() {
        let quota = |queue: &str, admits: Option<&[&str]>| QueueQuota {
            queue: queue.into(),
            pools: vec![crate::api::PoolUsage {
                name: "gpu".into(),
                resources: Vec::new(),
            }],
            admits: admits.map(|a| a.iter().map(|s| s.to_string()).collect()),
        };
        let mut all = queue_of(Vec::new());
        all.quotas = vec![
            quota("team-a", Some(&["a"])),
            quota("team-b", Some(&["b"])),
            quota("shared", None),
        ];
        let shown = |visible: Option<&[&str]>, queue: Option<&str>| -> Vec<String> {
            let v: Option<BTreeSet<String>> =
                visible.map(|v| v.iter().map(|s| s.to_string()).collect());
            restrict(&all, v.as_ref(), queue, None)
                .quotas
                .into_iter()
                .map(|q| q.queue)
                .collect()
        };
        assert_eq!(shown(None, None), ["team-a", "team-b", "shared"]);
        assert_eq!(shown(Some(&["a"]), None), ["team-a", "shared"]);
        assert_eq!(
            shown(Some(&["a", "b"]), None),
            ["team-a", "team-b", "shared"]
        );
        assert_eq!(shown(Some(&["c"]), None), ["shared"]);
        assert!(shown(Some(&[]), None).is_empty(), "no namespace, no quota");
        assert_eq!(shown(Some(&["a"]), Some("team-b")), Vec::<String>::new());
        assert_eq!(shown(None, Some("team-b")), ["team-b"]);
        // Who is admitted is never sent.
        let json = serde_json::to_value(&all.quotas[0]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"queue": "team-a", "pools": [{"name": "gpu", "resources": []}]})
        );
    }

    #[test]
    fn a_jobs_place_in_its_namespace_is_the_one_its_namespaces_answer_shows() {
        let all = queue_of(
            [("a", 1), ("b", 2), ("a", 3), ("b", 4), ("a", 5)]
                .into_iter()
                .map(|(ns, id)| waiting(ns, id))
                .collect(),
        );
        for ns in ["a", "b"] {
            let cut = restrict(&all, Some(&[ns.to_string()].into()), None, None);
            assert!(!cut.waiting.is_empty());
            for j in &cut.waiting {
                assert_eq!(waiting_in_namespace(&all, ns, j.job_id).as_ref(), Some(j));
            }
        }
        assert_eq!(waiting_in_namespace(&all, "a", 2), None);
        assert_eq!(waiting_in_namespace(&all, "a", 99), None);
    }

    #[test]
    fn a_caller_who_sees_no_namespace_gets_an_empty_answer_without_caps() {
        let all = queue_of(vec![waiting("a", 1), waiting("b", 2)]);
        let none = restrict(&all, Some(&BTreeSet::new()), None, None);
        assert_eq!(none.caps, None);
        assert_eq!(none.usage, None);
        assert!(none.waiting.is_empty() && none.live.is_empty() && none.inactive.is_empty());
        assert!(none.counts.is_empty() && none.namespaces.is_empty());
        assert_eq!((none.waiting_total, none.all_namespaces), (0, false));
        let json = serde_json::to_value(&none).unwrap();
        assert!(json.get("caps").is_none(), "{json}");
        // A namespace of its own, even without jobs, shows the caps; so does every namespace.
        let empty = restrict(&all, Some(&["c".to_string()].into()), None, None);
        assert_eq!(empty.caps, all.caps);
        assert_eq!(restrict(&all, None, None, None).caps, all.caps);
    }

    fn pace(run_s: &[i64], ages_s: &[i64]) -> Pace {
        Pace {
            queue: "q".into(),
            run_times_ms: run_s.iter().map(|t| t * 1000).collect(),
            ages_ms: ages_s.iter().map(|t| t * 1000).collect(),
        }
    }

    /// No figure without a basis, and never one from a single job: fewer than three recent
    /// run times say "unknown" with why; one job unlike the others does not move the median
    /// (issue 43: 300 s said against a true 100 s).
    #[test]
    fn an_estimate_rests_on_three_run_times_at_least() {
        for runs in [&[][..], &[300], &[300, 100]] {
            let e = estimate(5, &pace(runs, &[0]));
            assert_eq!(e.in_seconds, None);
            assert!(e.basis.starts_with("unknown: "), "{}", e.basis);
            assert!(
                e.basis.contains(&format!("{} job", runs.len())),
                "{}",
                e.basis
            );
        }
        let e = estimate(1, &pace(&[300, 100, 100], &[0]));
        assert_eq!(e.in_seconds, Some(100.0), "{}", e.basis);
        let e = estimate(1, &pace(&[100, 100, 100], &[]));
        assert_eq!(e.in_seconds, None);
        assert!(e.basis.contains("holds a run slot"), "{}", e.basis);
        assert_eq!(estimate(0, &pace(&[], &[])).in_seconds, Some(0.0));
    }

    /// Each slot frees when its job has run the median, then once per median: the k-th to free
    /// is the job's.
    #[test]
    fn slots_free_in_turn_from_what_their_jobs_have_run() {
        let p = pace(&[100, 100, 100], &[90, 50, 0]);
        let at = |k| estimate(k, &p).in_seconds.unwrap();
        assert_eq!(
            [at(1), at(2), at(3), at(4), at(7)],
            [10.0, 50.0, 100.0, 110.0, 210.0]
        );
        // A job past the median frees its slot at once, as far as the estimate knows.
        assert_eq!(
            estimate(1, &pace(&[100, 100, 100], &[250])).in_seconds,
            Some(0.0)
        );
    }

    /// Jobs held by their queue's maxRunning get an estimate from their queue's own slots;
    /// jobs that cannot be admitted (their queue refuses their namespace) get none.
    #[test]
    fn jobs_held_by_max_running_are_estimated_from_their_queues_slots() {
        use crate::queues::{Admits, Preemption, QueuePolicy};
        use crate::store::visibility::BriefJob;
        let policy = |max_running| QueuePolicy {
            weight: 1,
            max_running,
            max_launching: None,
            admits: Admits::Only(["a".to_string()].into()),
            preemption: Preemption::OFF,
            quotas: Default::default(),
            strategy: Default::default(),
        };
        let queues = Queues::new(
            [
                ("q".to_string(), policy(Some(1))),
                ("r".to_string(), policy(None)),
            ]
            .into(),
        );
        let brief = |id: i64, ns: &str, queue: &str, state: ScheduleState| BriefJob {
            id,
            namespace: ns.into(),
            name: format!("j{id}"),
            queue: queue.into(),
            priority: 0,
            phase: crate::api::JobPhase::Pending,
            schedule_state: state,
            message: String::new(),
            queued_at_ms: id,
            cancel_requested: false,
            backoff_until_ms: None,
            attempt: 0,
            task_index: 0,
            workload: None,
            started_at_ms: None,
            running_since_ms: Some(0),
            suspended: false,
            wait_reason: None,
        };
        let live = vec![brief(1, "a", "q", ScheduleState::Alive)];
        let waiting = vec![
            brief(2, "a", "q", ScheduleState::Waiting),
            brief(3, "a", "q", ScheduleState::Waiting),
            brief(4, "b", "r", ScheduleState::Waiting),
        ];
        let loads: BTreeMap<String, QueueLoad> = [(
            "q".to_string(),
            QueueLoad {
                launching: 0,
                alive: 1,
            },
        )]
        .into();
        let caps = Caps { launch: 4, run: 4 };
        let usage = SlotUsage {
            alive: 1,
            waiting: 3,
            ..Default::default()
        };
        let wait = WaitContext {
            queues: &queues,
            loads: &loads,
            usage,
            caps,
            node_waits: 0,
            backlogged: 0,
            backlogged_weight: 0,
        };
        let p: BTreeMap<String, Pace> = [(
            "q".to_string(),
            Pace {
                queue: "q".into(),
                run_times_ms: vec![60_000; 3],
                ages_ms: vec![20_000],
            },
        )]
        .into();
        let snapshot = Snapshot {
            now_ms: 0,
            caps,
            usage,
            queues: &queues,
            loads: &loads,
            waiting: &waiting,
            live: &live,
            inactive: &[],
            pace: &p,
            wait: &wait,
            quotas: &[],
        };
        let q = queue(&snapshot);
        let by_id = |id| q.waiting.iter().find(|j| j.job_id == id).unwrap();
        assert_eq!(by_id(2).reason, "QueueMaxRunning");
        assert_eq!(by_id(2).estimated_start.in_seconds, Some(40.0));
        assert_eq!(by_id(3).estimated_start.in_seconds, Some(100.0));
        assert_eq!(by_id(4).reason, "NamespaceNotAdmitted");
        assert_eq!(by_id(4).estimated_start.in_seconds, None);
        let positions: Vec<usize> = q.waiting.iter().map(|j| j.position).collect();
        assert_eq!(positions, [1, 2, 3], "unique, in order");
    }
}
