//! The status writer: every change of a job's row reaches its object's status subresource, in
//! an order that keeps the API's view within the caps, coalesced and within the API budget; and
//! the Events of each job's new history after its status write.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};

use super::{EVENT_WORKERS, Operator};
use crate::api::{ManagedJob, ScheduleState};
use crate::engine::BACKSTOP;
use crate::lifecycle::now_ms;
use crate::store::JobRow;

/// Status writes in flight at once (the API server serves them in parallel; the QPS budget
/// still bounds the rate).
pub const STATUS_WRITERS: usize = 64;

/// How long a new job waits for its first status write (Pending, with its queue position): one
/// that is admitted and finishes sooner gets a single write, its final status.
pub const FIRST_STATUS_DELAY: Duration = Duration::from_millis(500);

/// How long the status writer waits after being told of a change before reading the store, so
/// that changes in quick succession (a trivial job's Starting, Running, Succeeded) become one
/// write.
pub const STATUS_COALESCE: Duration = Duration::from_millis(20);

/// The slot a job's status shows it holding: 0 none, 1 a run slot, 2 a run and a launch slot.
pub fn slot_rank(row: &JobRow) -> usize {
    match row.schedule_state {
        ScheduleState::Launching => 2,
        s if s.holds_run_slot() => 1,
        _ => 0,
    }
}

/// Writes changed statuses to the API, continuously, with up to [`STATUS_WRITERS`] writes in
/// flight and never two for one job at once, finished jobs first ([`Store::unsynced`]'s
/// order).
///
/// A reader of the API must never see more jobs holding slots than the caps allow, so a status
/// that shows a job holding a slot waits while the release that may have made room for it is
/// unwritten ([`writable`]). Releases go at once, so nothing waits for long; the property test
/// in tests/scheduler_props.rs checks the API's view against the caps with writes landing in
/// any order. Changes within [`STATUS_COALESCE`] of each other are written together.
///
/// [`Store::unsynced`]: crate::store::Store::unsynced
pub(super) async fn status_loop(op: Arc<Operator>) {
    use futures::stream::FuturesUnordered;
    use tokio::time::Instant;
    let mut in_flight = FuturesUnordered::new();
    // Job id -> (rank, unsynced_since_seq) of the writes in flight.
    let mut flying: std::collections::HashMap<i64, (usize, i64)> = Default::default();
    // When to read the store next; after a failed write, not before a pause.
    let mut refill_at = Some(Instant::now());
    let mut paused_until = Instant::now();
    loop {
        let now = Instant::now();
        if refill_at.is_some_and(|t| t <= now) && paused_until <= now {
            refill_at = None;
            if flying.len() < STATUS_WRITERS {
                match op.engine.store().unsynced(STATUS_WRITERS + flying.len()) {
                    Ok(rows) => {
                        let now_ms = now_ms();
                        let room = STATUS_WRITERS - flying.len();
                        let (rows, later) = writable(rows, &flying, room, now_ms);
                        if let Some(at) = later {
                            let at = now + Duration::from_millis((at - now_ms).max(0) as u64);
                            refill_at = Some(refill_at.map_or(at, |t| t.min(at)));
                        }
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
            Some((id, ok)) = in_flight.next(), if !in_flight.is_empty() => {
                flying.remove(&id);
                if !ok {
                    // Retried after a pause, not in a tight loop against a failing API.
                    paused_until = Instant::now() + Duration::from_secs(1);
                }
                refill_at = Some(Instant::now());
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

/// Of `rows` (unsynced, in [`crate::store::Store::unsynced`]'s order), at most `room` that
/// may be written now (`now_ms`), given the writes in `flying` (job id -> [`slot_rank`] and
/// `unsynced_since_seq` of the row being written), and the time (ms since the epoch) to look
/// again for those held back by time:
/// - none of a job already in flight (two writes of one object could land out of order);
/// - none that shows a job holding a slot while a job of lower rank, whose status the API has
///   seen or is being sent, has an older unwritten change (possibly the release that made room
///   for it);
/// - a new job's first status (Pending, its queue position) only after [`FIRST_STATUS_DELAY`]:
///   a job admitted and finished by then gets one write, not two.
pub fn writable(
    rows: Vec<JobRow>,
    flying: &std::collections::HashMap<i64, (usize, i64)>,
    room: usize,
    now_ms: i64,
) -> (Vec<JobRow>, Option<i64>) {
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
        let rank = slot_rank(row);
        oldest[rank] = oldest[rank].min(row.unsynced_since_seq);
    }
    let first_delay = FIRST_STATUS_DELAY.as_millis() as i64;
    let mut later: Option<i64> = None;
    let rows = rows
        .into_iter()
        .filter(|row| {
            if row.synced_version == 0 && row.schedule_state == ScheduleState::Waiting {
                let at = row.submitted_at_ms + first_delay;
                if at > now_ms {
                    later = Some(later.map_or(at, |l| l.min(at)));
                    return false;
                }
            }
            !flying.contains_key(&row.id)
                && !oldest[..slot_rank(row)]
                    .iter()
                    .any(|&o| o < row.changed_seq)
        })
        .take(room)
        .collect();
    (rows, later)
}

impl Operator {
    /// Publishes the Events (see [`crate::events`]) for the job's transitions since the last
    /// publish; `done` forgets the job afterwards.
    pub(super) async fn publish_events(
        &self,
        job_id: i64,
        done: bool,
        reference: &ObjectReference,
    ) {
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
        // Recorded before publishing (one worker per job, so never twice at once), in the store,
        // so an operator restart never publishes an Event twice.
        let after = {
            let mut store = self.engine.store();
            let after = store.events_published(job_id).unwrap_or(0);
            if let Err(e) = store.set_events_published(job_id, last) {
                tracing::warn!(job_id, error = %e, "recording published Events failed");
            }
            after
        };
        let _ = done;
        for event in crate::events::events_for(&history, after) {
            self.limiter.until_ready().await;
            self.engine.metrics.api_request("create_event");
            if let Err(e) = publisher.publish(reference, &event).await {
                self.engine.metrics.events_refused_total.inc();
                tracing::warn!(job_id, reason = event.reason, error = %e, "the API refused an Event");
            }
        }
    }

    /// Writes one row's status; true when the row needs no retry.
    async fn write_status(&self, row: &JobRow) -> bool {
        self.limiter.until_ready().await;
        let api: Api<ManagedJob> = Api::namespaced(self.client.clone(), &row.namespace);
        let patch = crate::status::merge_patch(row);
        let result = api
            .patch_status(&row.name, &PatchParams::default(), &Patch::Merge(&patch))
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
                    let worker = row.id.rem_euclid(EVENT_WORKERS as i64) as usize;
                    let work = (row.id, done, mj.object_ref(&()));
                    // A full queue defers a live job's Events to its next status write (they
                    // come from the history); only a finished job's are lost.
                    if self.events_tx[worker].try_send(work).is_err() && done {
                        self.engine.metrics.events_dropped_total.inc();
                    }
                }
                true
            }
            // Gone, or replaced by a new object of the same name: nothing to write to, once a
            // GET confirms it (a status subresource can answer 404 for a moment while its CRD
            // changes; a status is never dropped on a guess).
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {
                self.engine.metrics.api_request("get");
                match api.get_opt(&row.name).await {
                    Ok(None) => true,
                    Ok(Some(mj)) if mj.metadata.uid.as_deref() != Some(row.uid.as_str()) => true,
                    Ok(Some(_)) => {
                        tracing::warn!(job_id = row.id, job = %row.key(), code = e.code, "status write refused though the object exists; retrying");
                        false
                    }
                    Err(e) => {
                        tracing::warn!(job_id = row.id, job = %row.key(), error = %e, "status write failed and the object could not be read; retrying");
                        false
                    }
                }
            }
            Err(e) => {
                tracing::warn!(job_id = row.id, job = %row.key(), error = %e, "status write failed");
                false
            }
        };
        if done && let Err(e) = self.engine.store().mark_synced(row.id, row.status_version) {
            tracing::error!(job_id = row.id, error = %e, "marking status synced failed");
        }
        done
    }
}
