//! The status writer: every change of a job's row reaches its object's status subresource, in
//! an order that keeps the API's view within the caps, coalesced and within the API budget; and
//! the Events of each job's new history after its status write.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use super::shared::Operator;
use crate::api::{ManagedJob, ScheduleState};
use crate::engine::BACKSTOP;
use crate::lifecycle::JobRow;
use crate::lifecycle::now_ms;
use crate::store::UnsyncedBrief;

/// `kubectl apply`'s copy of the object, an annotation the operator's cache drops.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// An annotation of the operator's cached copy only (never written): the bytes its cache
/// dropped from the object (its managedFields and `kubectl apply`'s copy), which still count in
/// the object's size in etcd.
pub const TRIMMED_BYTES: &str = "managedjobs.dev/trimmed-bytes";

/// Status writes in flight at once (the API server serves them in parallel; the QPS budget
/// still bounds the rate).
pub const STATUS_WRITERS: usize = 64;

/// Status writes in flight while a burst is paced ([`crate::pacing`]): enough to keep the paced
/// budget (a few writes a second) busy.
pub const PACED_STATUS_WRITERS: usize = 4;

/// Status writes in flight at once that carry only a waiting job's new reason
/// ([`crate::store::jobs::REASON_ONLY`]): the other three quarters of the writers stay free
/// for statuses that show a job move (a reason change of 10,000 waiting jobs is 10,000
/// writes). Enough to keep the API budget busy when the API server is slow to answer (16 in
/// flight at 300 ms each is 53 writes/s; 4 left 109 reasons 14 s stale on the loaded dev
/// control plane).
pub const REASON_WRITERS: usize = 16;

/// How long a new job waits for its first status write (Pending, with its queue position): one
/// that is admitted and finishes sooner gets a single write, its final status.
pub const FIRST_STATUS_DELAY: Duration = Duration::from_millis(500);

/// How long the status writer waits after being told of a change before reading the store, so
/// that changes in quick succession (a trivial job's Starting, Running, Succeeded) become one
/// write.
pub const STATUS_COALESCE: Duration = Duration::from_millis(20);

/// First back-off after a job's status write failed; doubles per failure in a row up to
/// [`STATUS_RETRY_MAX`].
pub const STATUS_RETRY_BASE: Duration = Duration::from_secs(1);
/// Longest back-off between two status writes of one job.
pub const STATUS_RETRY_MAX: Duration = Duration::from_secs(300);
/// Failures in a row after which a job's status write is reported in a Warning Event (once).
pub const STATUS_FAILURES_REPORTED: u32 = 2;

/// How one status write went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteOutcome {
    /// Written (or there is nothing to write to any more).
    Done,
    /// Not written: this operator does not act on the job's namespace now (another owns it,
    /// or its claim is overdue; `docs/design.md#one-owner-per-job`). Tried again later, with no
    /// Warning Event: the job is left to its owner, or written once the claim is renewed.
    NotOwner,
    /// Failed; retry this job after its back-off. `error`: what the API said. `global`: the
    /// API could not be reached at all (every write would fail: pause them all briefly).
    Failed {
        /// The error, for the log and the Event.
        error: String,
        /// Not this job's fault.
        global: bool,
    },
}

/// Status write failures in a row per job, and when each may be retried.
#[derive(Debug, Default)]
pub struct RetrySchedule {
    failing: std::collections::HashMap<i64, (u32, i64)>,
}

impl RetrySchedule {
    /// Records a failure of `job_id`'s write at `now_ms`; returns the failures in a row and the
    /// back-off (STATUS_RETRY_BASE doubling per failure, at most STATUS_RETRY_MAX).
    pub fn failed(&mut self, job_id: i64, now_ms: i64) -> (u32, Duration) {
        let entry = self.failing.entry(job_id).or_insert((0, now_ms));
        entry.0 += 1;
        let wait =
            crate::lifecycle::backoff(STATUS_RETRY_BASE, entry.0 as i32).min(STATUS_RETRY_MAX);
        entry.1 = now_ms + wait.as_millis() as i64;
        (entry.0, wait)
    }

    /// A write of `job_id` succeeded: it is no longer failing.
    pub fn succeeded(&mut self, job_id: i64) {
        self.failing.remove(&job_id);
    }

    /// When `job_id` may be written again (ms since epoch), if it is backing off at `now_ms`.
    pub fn retry_at(&self, job_id: i64, now_ms: i64) -> Option<i64> {
        self.failing
            .get(&job_id)
            .map(|&(_, at)| at)
            .filter(|&at| at > now_ms)
    }
}

/// The slot a job's status shows it holding: 0 none, 1 a run slot, 2 a run and a launch slot.
pub fn slot_rank(row: &JobRow) -> usize {
    state_rank(row.schedule_state)
}

/// [`slot_rank`] of a job in schedule state `state`.
fn state_rank(state: ScheduleState) -> usize {
    match state {
        ScheduleState::Launching => 2,
        s if s.holds_run_slot() => 1,
        _ => 0,
    }
}

/// Writes changed statuses to the API, continuously, with up to [`STATUS_WRITERS`] writes in
/// flight and never two for one job at once, finished jobs first ([`Store::unsynced_brief`]'s
/// order).
///
/// A reader of the API must never see more jobs holding slots than the caps allow, so a status
/// that shows a job holding a slot waits while the release that may have made room for it is
/// unwritten ([`writable`]). Releases go at once, so nothing waits for long; the property test
/// in tests/scheduler_props.rs checks the API's view against the caps with writes landing in
/// any order. Changes within [`STATUS_COALESCE`] of each other are written together.
///
/// Each refill reads the backlog's order briefly ([`Store::unsynced_brief`], O(writers) by its
/// index) and whole rows only of the jobs it writes; after a completion it refills at once
/// when half the writers are free, otherwise within [`STATUS_COALESCE`], so that one read
/// starts many writes (a refill after every completion, each reading up to 128 whole rows of
/// a burst's backlog, was a seventh of the operator's CPU).
///
/// [`Store::unsynced_brief`]: crate::store::Store::unsynced_brief
pub(super) async fn status_loop(op: Arc<Operator>) {
    use futures::stream::FuturesUnordered;
    use tokio::time::Instant;
    let mut in_flight = FuturesUnordered::new();
    // Job id -> (rank, unsynced_since_seq) of the writes in flight.
    let mut flying: std::collections::HashMap<i64, (usize, i64)> = Default::default();
    // When to read the store next; after a failed write, not before a pause.
    let mut refill_at = Some(Instant::now());
    let mut paused_until = Instant::now();
    let mut retries = RetrySchedule::default();
    // The last write failed because the API could not be reached (said once per outage).
    let mut api_down = false;
    loop {
        let now = Instant::now();
        if refill_at.is_some_and(|t| t <= now) && paused_until <= now {
            refill_at = None;
            // While a burst is paced, writes go a few a second: more in flight would only be
            // read again and again from the store (a burst's every arrival wakes this loop).
            let writers = match op.engine.pacer.pace() {
                crate::pacing::Pace::Paced => PACED_STATUS_WRITERS,
                crate::pacing::Pace::Free => STATUS_WRITERS,
            };
            if flying.len() < writers {
                // The backlog's order briefly, then whole rows of only those written now.
                let read = {
                    let store = op.engine.store();
                    store
                        .unsynced_brief(writers + flying.len())
                        .map(|b| (store, b))
                };
                match read {
                    Ok((store, rows)) => {
                        let now_ms = now_ms();
                        let room = writers - flying.len();
                        // A job whose write keeps failing waits out its own back-off, and does
                        // not hold back anyone else's status meanwhile (its stale one may then
                        // show it holding a slot it gave back: the Warning Event says why).
                        let mut backing_off: Option<i64> = None;
                        let rows: Vec<UnsyncedBrief> = rows
                            .into_iter()
                            .filter(|r| match retries.retry_at(r.id, now_ms) {
                                Some(at) => {
                                    backing_off = crate::lifecycle::earliest(backing_off, Some(at));
                                    false
                                }
                                None => true,
                            })
                            .collect();
                        let (rows, later) = writable(rows, &flying, room, now_ms);
                        if let Some(at) = crate::lifecycle::earliest(later, backing_off) {
                            let at = now + Duration::from_millis((at - now_ms).max(0) as u64);
                            refill_at = Some(refill_at.map_or(at, |t| t.min(at)));
                        }
                        let ids: Vec<i64> = rows.iter().map(|b| b.id).collect();
                        let rows: Vec<JobRow> = match store.find_many(&ids) {
                            Ok(rows) => rows,
                            Err(e) => {
                                tracing::error!(error = %e, "reading unsynced rows failed");
                                paused_until = now + Duration::from_secs(1);
                                refill_at = Some(paused_until);
                                continue;
                            }
                        };
                        drop(store);
                        for row in rows {
                            flying.insert(row.id, (slot_rank(&row), row.unsynced_since_seq));
                            let op = op.clone();
                            in_flight.push(async move { (row.id, op.write_status(&row).await) });
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "reading unsynced rows failed");
                        paused_until = now + Duration::from_secs(1);
                        refill_at = Some(paused_until);
                    }
                }
            }
        }
        let wake_at = refill_at.map(|t| t.max(paused_until));
        tokio::select! {
            Some((id, outcome)) = in_flight.next(), if !in_flight.is_empty() => {
                flying.remove(&id);
                if outcome == WriteOutcome::Done && api_down {
                    tracing::info!("the API is reached again: status writes go on");
                    api_down = false;
                }
                match outcome {
                    WriteOutcome::Done => retries.succeeded(id),
                    WriteOutcome::NotOwner => {
                        // Not this job's fault, nor the API's: looked at again in a second (an
                        // in-memory check), never backed off, so that once the claim is renewed
                        // (after an API outage) every status goes out at once.
                        retries.succeeded(id);
                        let at = Instant::now() + STATUS_RETRY_BASE;
                        refill_at = Some(refill_at.map_or(at, |t| t.min(at)));
                        continue;
                    }
                    WriteOutcome::Failed { error, global: true } => {
                        // The API cannot be reached: every write would fail. Not this job's
                        // fault, so no back-off of its own (after a long outage its status
                        // would wait minutes more): all writes pause briefly and go out again
                        // within about a second of the API's return.
                        op.engine.metrics.status_write_failures_total.inc();
                        if !api_down {
                            tracing::warn!(job_id = id, %error, "the API cannot be reached: status writes pause and are tried again every {:?}", STATUS_RETRY_BASE);
                            api_down = true;
                        }
                        paused_until = Instant::now() + STATUS_RETRY_BASE;
                    }
                    WriteOutcome::Failed { error, global: false } => {
                        op.engine.metrics.status_write_failures_total.inc();
                        let (failures, wait) = retries.failed(id, now_ms());
                        tracing::warn!(job_id = id, failures, retry_in = ?wait, %error, "status write failed; retrying after a back-off");
                        if failures == STATUS_FAILURES_REPORTED {
                            let op = op.clone();
                            tokio::spawn(async move { op.report_status_failure(id, &error, wait).await });
                        }
                    }
                }
                // Refilled at once when half the writers are free, otherwise with the next
                // completions (within STATUS_COALESCE): one read starts many writes.
                let at = if flying.len() <= STATUS_WRITERS / 2 {
                    Instant::now()
                } else {
                    Instant::now() + STATUS_COALESCE
                };
                refill_at = Some(refill_at.map_or(at, |t| t.min(at)));
            }
            _ = op.engine.status_changed.notified() => {
                let at = Instant::now() + STATUS_COALESCE;
                refill_at = Some(refill_at.map_or(at, |t| t.min(at)));
            }
            _ = tokio::time::sleep_until(wake_at.unwrap_or(now)), if wake_at.is_some() => {}
            _ = tokio::time::sleep(BACKSTOP) => refill_at = Some(Instant::now()),
        }
    }
}

/// Of `rows` (unsynced, in [`crate::store::Store::unsynced_brief`]'s order), at most `room` that
/// may be written now (`now_ms`), given the writes in `flying` (job id -> [`slot_rank`] and
/// `unsynced_since_seq` of the row being written), and the time (ms since the epoch) to look
/// again for those held back by time:
/// - none of a job already in flight (two writes of one object could land out of order);
/// - none that shows a job holding a slot while a job of lower rank, whose status the API has
///   seen or is being sent, has an older unwritten change (possibly the release that made room
///   for it);
/// - a new job's first status (Pending) only after [`FIRST_STATUS_DELAY`]: a job admitted and
///   finished by then gets one write, not two;
/// - at most [`REASON_WRITERS`] in flight of statuses that wait only for their reason (their
///   `unsynced_since_seq` is [`crate::store::jobs::REASON_ONLY`]; they come last in the order
///   and release nothing).
pub fn writable(
    rows: Vec<UnsyncedBrief>,
    flying: &std::collections::HashMap<i64, (usize, i64)>,
    room: usize,
    now_ms: i64,
) -> (Vec<UnsyncedBrief>, Option<i64>) {
    // The oldest unwritten change per rank, in flight or pending (a job in flight that changed
    // again counts under both ranks: the API has seen neither yet). A job never written, and
    // with no write in flight, shows no slot in the API, so writing it releases none.
    let mut oldest = [i64::MAX; 3];
    for &(rank, since) in flying.values() {
        oldest[rank] = oldest[rank].min(since);
    }
    for row in rows
        .iter()
        .filter(|r| r.synced_version > 0 || flying.contains_key(&r.id))
    {
        let rank = state_rank(row.schedule_state);
        oldest[rank] = oldest[rank].min(row.unsynced_since_seq);
    }
    let first_delay = FIRST_STATUS_DELAY.as_millis() as i64;
    let mut later: Option<i64> = None;
    let reason_only = |since: i64| since == crate::store::jobs::REASON_ONLY;
    let mut reasons = flying.values().filter(|(_, s)| reason_only(*s)).count();
    let rows = rows
        .into_iter()
        .filter(|row| {
            if reason_only(row.unsynced_since_seq) {
                if reasons >= REASON_WRITERS || flying.contains_key(&row.id) {
                    return false;
                }
                reasons += 1;
                return true;
            }
            if row.synced_version == 0 && row.schedule_state == ScheduleState::Waiting {
                let at = row.submitted_at_ms + first_delay;
                if at > now_ms {
                    later = Some(later.map_or(at, |l| l.min(at)));
                    return false;
                }
            }
            !flying.contains_key(&row.id)
                && !oldest[..state_rank(row.schedule_state)]
                    .iter()
                    .any(|&o| o < row.changed_seq)
        })
        .take(room)
        .collect();
    (rows, later)
}

impl Operator {
    /// Publishes the Events (see [`crate::events`]) for the job's transitions since the last
    /// publish, then records them published. A restart between the two publishes them again
    /// under the same names: the API refuses each as existing, so none is shown twice and none
    /// is lost ([`Operator::publish_pending_events`] finds them after a restart).
    pub(super) async fn publish_events(&self, job_id: i64, reference: &ObjectReference) {
        let Some(publisher) = &self.events else {
            return;
        };
        // From the history, so a transition that status coalescing skipped still gets its Event.
        let history = self
            .engine
            .store()
            .history_after(job_id, 0)
            .unwrap_or_default();
        let Some(last) = history.last().map(|t| t.id) else {
            return;
        };
        let after = self.engine.store().events_published(job_id).unwrap_or(0);
        if after >= last {
            return;
        }
        for event in crate::events::events_for(&history, after) {
            self.budget.for_event().await;
            self.engine.metrics.api_request("create_event");
            match publisher.publish(reference, &event).await {
                Ok(crate::events::Published::Created) => {}
                Ok(crate::events::Published::Existed) => {
                    tracing::debug!(
                        job_id,
                        reason = event.reason,
                        "the Event was published before a restart"
                    );
                }
                Err(e) => {
                    self.engine.metrics.events_refused_total.inc();
                    tracing::warn!(job_id, reason = event.reason, error = %e, "the API refused an Event");
                }
            }
            // A failure is told to the Flux Kustomization that applied the job too: Flux's
            // health check names the job but never its message.
            let (Some(ns), Some(name)) = (&reference.namespace, &reference.name) else {
                continue;
            };
            let Some(told) = crate::events::for_kustomization(ns, name, &event) else {
                continue;
            };
            let key = kube::runtime::reflector::ObjectRef::new(name).within(ns);
            let Some(kustomization) = self
                .jobs
                .get(&key)
                .and_then(|mj| crate::events::flux_kustomization(mj.labels()))
            else {
                continue;
            };
            self.budget.for_event().await;
            self.engine.metrics.api_request("create_event");
            if let Err(e) = publisher
                .publish_related(&kustomization, Some(reference), &told)
                .await
            {
                self.engine.metrics.events_refused_total.inc();
                tracing::warn!(job_id, reason = told.reason, error = %e, "the API refused an Event about the job's Kustomization");
            }
        }
        // A refused Event is not tried again (the refusal says why in the log and metrics).
        if let Err(e) = self.engine.store().set_events_published(job_id, last) {
            tracing::warn!(job_id, error = %e, "recording published Events failed");
        }
    }

    /// Publishes the Events an operator stopped before publishing (between a job's status write
    /// and its Events: a rollout, a crash), for every job whose status is written but whose
    /// history has unpublished entries; run once at start, on the Event workers' queues.
    pub(super) async fn publish_pending_events(&self) {
        if self.events.is_none() {
            return;
        }
        let pending = {
            let store = self.engine.store();
            store
                .jobs_with_unpublished_events()
                .and_then(|ids| store.find_many(&ids))
        };
        let rows = match pending {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "reading the jobs with unpublished Events failed");
                return;
            }
        };
        if !rows.is_empty() {
            tracing::info!(
                jobs = rows.len(),
                "publishing the Events a stopped operator left"
            );
        }
        for row in rows {
            let work = (row.id, crate::events::job_reference(&row));
            if self.event_queue(row.id).send(work).await.is_err() {
                return;
            }
        }
    }

    /// Publishes a Warning Event `StatusWriteFailed` on job `job_id`'s object: its status cannot
    /// be written (e.g. the object is too big for etcd to store it with a status).
    async fn report_status_failure(&self, job_id: i64, error: &str, wait: Duration) {
        let Some(publisher) = &self.events else {
            return;
        };
        let Ok(Some(row)) = self.engine.store().find(job_id) else {
            return;
        };
        let reference = crate::events::job_reference(&row);
        let event = crate::events::JobEvent {
            type_: crate::events::EventType::Warning,
            reason: "StatusWriteFailed",
            note: crate::events::truncate(
                &format!(
                    "the API refused this job's status ({error}); the job is {} ({}); retrying with back-off, next in {} s",
                    row.phase,
                    row.message,
                    wait.as_secs()
                ),
                crate::events::MAX_NOTE_BYTES,
            ),
            at_ms: now_ms(),
            transition: None,
        };
        self.budget.for_event().await;
        self.engine.metrics.api_request("create_event");
        if let Err(e) = publisher.publish(&reference, &event).await {
            self.engine.metrics.events_refused_total.inc();
            tracing::warn!(job_id, error = %e, "the API refused a StatusWriteFailed Event");
        }
    }

    /// Publishes a Warning Event `StateDirFailing` on every live job's object: the state dir
    /// cannot be written (`problem` says why), so their progress is held until it can (their
    /// processes keep what they know: a finished workload's outcome is recorded then, never
    /// lost, never run again).
    pub(super) async fn report_state_dir_failing(&self, problem: &str) {
        let Some(publisher) = &self.events else {
            return;
        };
        let live = self.engine.store().live_jobs().unwrap_or_default();
        for row in live {
            let reference = crate::events::job_reference(&row);
            let event = crate::events::JobEvent {
                type_: crate::events::EventType::Warning,
                reason: "StateDirFailing",
                note: crate::events::truncate(
                    &format!(
                        "{problem}; this job's progress is held until it can be (a finished workload's outcome is kept and recorded then)"
                    ),
                    crate::events::MAX_NOTE_BYTES,
                ),
                at_ms: now_ms(),
                transition: None,
            };
            self.budget.for_event().await;
            self.engine.metrics.api_request("create_event");
            if let Err(e) = publisher.publish(&reference, &event).await {
                self.engine.metrics.events_refused_total.inc();
                tracing::warn!(job_id = row.id, error = %e, "the API refused a StateDirFailing Event");
            }
        }
    }

    /// Writes one row's status.
    /// The bytes the job's object takes in etcd without its status, as the cache has it (what
    /// the cache dropped included, [`TRIMMED_BYTES`]); 0 when it is not cached.
    fn object_bytes(&self, row: &JobRow) -> usize {
        let key = kube::runtime::reflector::ObjectRef::new(&row.name).within(&row.namespace);
        let Some(mj) = self.jobs.get(&key) else {
            return 0;
        };
        let trimmed = mj
            .annotations()
            .get(TRIMMED_BYTES)
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        let mut bare = (*mj).clone();
        bare.status = None;
        bare.annotations_mut().remove(TRIMMED_BYTES);
        serde_json::to_vec(&bare).map_or(0, |v| v.len()) + trimmed
    }

    /// Writes one row's status: the full one while the object has room for it, else its
    /// minimal form, else none (`crate::status::fit`; issue 30: an object too big for its
    /// status could neither show that it ended nor be deleted). Either way the job ends, and
    /// a Warning Event says why its status is short or missing.
    async fn write_status(&self, row: &JobRow) -> WriteOutcome {
        use crate::status::{Fit, fit, merge_patch, minimal_patch};
        // Only the owner writes, with its claim (the API refuses it under an older one).
        let Some(owner) = self.claims.owner(&row.namespace) else {
            return WriteOutcome::NotOwner;
        };
        let full = merge_patch(row, Some(&owner));
        let minimal = minimal_patch(row, Some(&owner));
        let len = |v: &serde_json::Value| serde_json::to_vec(&v["status"]).map_or(0, |b| b.len());
        let object = self.object_bytes(row);
        let mut level = fit(object, len(&full), len(&minimal));
        loop {
            let patch = match level {
                Fit::Full => &full,
                Fit::Minimal => &minimal,
                Fit::None => {
                    self.status_too_large(row, object, None).await;
                    return self.synced(row);
                }
            };
            match self.patch_status(row, patch).await {
                // Refused as too large after all (what the cache knows of the object was
                // short): the next smaller form, at once.
                WriteOutcome::Failed { error, .. } if too_large(&error) => {
                    level = match level {
                        Fit::Full => Fit::Minimal,
                        _ => Fit::None,
                    };
                }
                WriteOutcome::Done if level == Fit::Minimal => {
                    self.status_too_large(row, object, Some(len(&minimal)))
                        .await;
                    return WriteOutcome::Done;
                }
                outcome => return outcome,
            }
        }
    }

    /// Records `row`'s status as written (a status that cannot be written at all counts as
    /// written: the job goes on, its deletion is not held for it).
    fn synced(&self, row: &JobRow) -> WriteOutcome {
        if let Err(e) = self.engine.store().mark_synced(row.id, row.status_version) {
            tracing::error!(job_id = row.id, error = %e, "marking status synced failed");
        }
        WriteOutcome::Done
    }

    /// Says, once per job, that its object (of `object` bytes without status) has no room for
    /// its full status: a Warning Event `StatusTooLarge` naming the sizes and what was written
    /// (`minimal`: the minimal status's bytes; None: nothing).
    async fn status_too_large(&self, row: &JobRow, object: usize, minimal: Option<usize>) {
        let first = self
            .too_large
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(row.id);
        if !first {
            return;
        }
        let limit = crate::api::ETCD_OBJECT_BYTES;
        let what = match minimal {
            Some(bytes) => format!(
                "only its minimal status is written ({bytes} bytes: phase, counters, times, conditions; messages cut short, no task records or attempts)"
            ),
            None => "no status can be written at all".into(),
        };
        tracing::warn!(job_id = row.id, job = %row.key(), object_bytes = object, "the object has no room for its full status in etcd ({limit} bytes): {what}");
        let Some(publisher) = &self.events else {
            return;
        };
        let reference = crate::events::job_reference(row);
        let event = crate::events::JobEvent {
            type_: crate::events::EventType::Warning,
            reason: "StatusTooLarge",
            note: crate::events::truncate(
                &format!(
                    "this object takes about {object} bytes without its status, too close to etcd's {limit}-byte limit for its full status: {what}; the job runs and ends as usual and can be deleted (managed-jobs queue shows the rest)"
                ),
                crate::events::MAX_NOTE_BYTES,
            ),
            at_ms: now_ms(),
            transition: None,
        };
        self.budget.for_event().await;
        self.engine.metrics.api_request("create_event");
        if let Err(e) = publisher.publish(&reference, &event).await {
            self.engine.metrics.events_refused_total.inc();
            tracing::warn!(job_id = row.id, error = %e, "the API refused a StatusTooLarge Event");
        }
    }

    /// Sends one status patch of `row` and records it synced once accepted.
    async fn patch_status(&self, row: &JobRow, patch: &serde_json::Value) -> WriteOutcome {
        // A status that only says a waiting job's new reason yields to every other status
        // write, as an Event does: a reason change of every waiting job never holds back a
        // status that shows a job moving, nor the Events (`RequestBudget::for_reason`).
        if row.unsynced_since_seq == crate::store::jobs::REASON_ONLY {
            self.budget.for_reason().await;
        } else {
            self.budget.for_status().await;
        }
        let api: Api<ManagedJob> = Api::namespaced(self.client.clone(), &row.namespace);
        let result = api
            .patch_status(&row.name, &PatchParams::default(), &Patch::Merge(patch))
            .await;
        self.engine.metrics.api_request("patch");
        let done = match result {
            Ok(mj) => {
                // Events go out on their own task: they never delay the next status write.
                let done = row.schedule_state == ScheduleState::Done;
                if done && let Some(finished) = row.finished_at_ms {
                    let lag = (now_ms() - finished).max(0) as f64 / 1000.0;
                    self.engine.metrics.terminal_status_lag_seconds.observe(lag);
                }
                if self.events.is_some() {
                    let work = (row.id, mj.object_ref(&()));
                    // A full queue defers a live job's Events to its next status write (they
                    // come from the history); a finished job's wait for its deletion or the
                    // next start (publish_pending_events).
                    if self.event_queue(row.id).try_send(work).is_err() && done {
                        self.engine.metrics.events_dropped_total.inc();
                    }
                }
                WriteOutcome::Done
            }
            // Gone, or replaced by a new object of the same name: nothing to write to, once a
            // GET confirms it (a status subresource can answer 404 for a moment while its CRD
            // changes; a status is never dropped on a guess).
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                self.engine.metrics.api_request("get");
                match api.get_opt(&row.name).await {
                    Ok(None) => WriteOutcome::Done,
                    Ok(Some(mj)) if mj.metadata.uid.as_deref() != Some(row.uid.as_str()) => {
                        WriteOutcome::Done
                    }
                    Ok(Some(_)) => WriteOutcome::Failed {
                        error: format!("{} ({}) though the object exists", e.message, e.code),
                        global: false,
                    },
                    Err(e) => WriteOutcome::Failed {
                        error: format!("the object could not be read: {e}"),
                        global: !matches!(e, kube::Error::Api(_)),
                    },
                }
            }
            // Written under an older claim: another operator took the job's namespace over (the
            // claim's watch says so soon); never a Warning Event of ours.
            Err(kube::Error::Api(e))
                if e.code == 422
                    && e.message
                        .contains("only its current owner writes its status") =>
            {
                tracing::warn!(job_id = row.id, job = %row.key(), error = %e.message, "the API refused the status as written under an older claim: another operator owns the job");
                self.claims.nudge(&row.namespace);
                WriteOutcome::NotOwner
            }
            // The API server is not serving (starting, its etcd unreachable) or sheds load:
            // nobody's status would be written now, and none is to blame. (A 500 is the
            // object's: e.g. etcd's "request is too large".)
            Err(kube::Error::Api(e)) if matches!(e.code, 429 | 502 | 503 | 504) => {
                WriteOutcome::Failed {
                    error: format!("{} ({})", e.message, e.code),
                    global: true,
                }
            }
            Err(kube::Error::Api(e)) => WriteOutcome::Failed {
                error: format!("{} ({})", e.message, e.code),
                global: false,
            },
            Err(e) => WriteOutcome::Failed {
                error: e.to_string(),
                global: true,
            },
        };
        if done == WriteOutcome::Done
            && let Err(e) = self.engine.store().mark_synced(row.id, row.status_version)
        {
            tracing::error!(job_id = row.id, error = %e, "marking status synced failed");
        }
        done
    }
}

/// True when the API refused a write as too large for etcd (`etcdserver: request is too
/// large`) or for itself (413).
fn too_large(error: &str) -> bool {
    error.contains("too large") || error.contains("(413)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failing job's writes back off 1 s, 2 s, 4 s... up to 300 s, only for that job, and a
    /// success forgets its failures.
    #[test]
    fn a_failing_status_write_backs_off_per_job() {
        let mut r = RetrySchedule::default();
        assert_eq!(r.failed(1, 0), (1, Duration::from_secs(1)));
        assert_eq!(r.retry_at(1, 0), Some(1_000));
        assert_eq!(r.retry_at(2, 0), None, "other jobs are not held back");
        assert_eq!(r.failed(1, 1_000), (2, Duration::from_secs(2)));
        assert_eq!(r.failed(1, 3_000), (3, Duration::from_secs(4)));
        assert_eq!(r.retry_at(1, 7_000), None, "due");
        for _ in 0..20 {
            r.failed(1, 0);
        }
        assert_eq!(r.failed(1, 0).1, STATUS_RETRY_MAX);
        r.succeeded(1);
        assert_eq!(r.retry_at(1, 0), None);
        assert_eq!(r.failed(1, 0).0, 1);
    }

    /// Statuses that wait only for a waiting job's new reason release nothing: a job that took
    /// a slot since is written at once, and at most [`REASON_WRITERS`] of them fly at a time.
    #[test]
    fn reason_only_statuses_hold_nothing_back_and_fly_a_few_at_a_time() {
        use crate::store::jobs::REASON_ONLY;
        let brief = |id: i64, state: ScheduleState, since: i64, changed: i64| UnsyncedBrief {
            id,
            schedule_state: state,
            synced_version: 1,
            unsynced_since_seq: since,
            changed_seq: changed,
            submitted_at_ms: 0,
        };
        let mut rows = vec![brief(1, ScheduleState::Launching, 50, 50)];
        for id in 2..40 {
            rows.push(brief(id, ScheduleState::Waiting, REASON_ONLY, 10));
        }
        let flying = std::collections::HashMap::new();
        let (out, _) = writable(rows.clone(), &flying, 64, 0);
        let ids: Vec<i64> = out.iter().map(|b| b.id).collect();
        assert_eq!(
            ids,
            (1..=1 + REASON_WRITERS as i64).collect::<Vec<_>>(),
            "the taking first, then {REASON_WRITERS} reasons"
        );
        let flying: std::collections::HashMap<i64, (usize, i64)> =
            (2..4).map(|id| (id, (0, REASON_ONLY))).collect();
        let (out, _) = writable(rows, &flying, 64, 0);
        let ids: Vec<i64> = out.iter().map(|b| b.id).collect();
        assert_eq!(ids[0], 1);
        assert_eq!(ids.len(), 1 + REASON_WRITERS - 2, "two in flight already");
        assert_eq!(ids[1], 4);
    }
}
