//! The operator (`managed-jobs run`): the Kubernetes side around the [`Engine`].
//!
//! - the reconcile loop (kube's `Controller` + `finalizer`): mirror each ManagedJob into the
//!   store (submitting it), cancel on `spec.cancel`, cancel and clean up on delete, delete after
//!   `ttlSecondsAfterFinished`;
//! - the status writer (`status_loop`, ordering by [`writable`]): for rows whose
//!   `status_version` moved, one merge patch of the status subresource each, coalesced (a burst
//!   of changes is one write), ordered so the API never shows more jobs holding slots than the
//!   caps, and within the API budget (`--api-qps`/`--api-burst`, a token bucket);
//! - Events ([`crate::events`]) from the store's history, after each status write, best effort.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource, ResourceExt};

use std::collections::HashSet;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};

use crate::api::{
    ExecutorKind, FINALIZER, JobPhase, LABEL_JOB_ID, ManagedJob, ScheduleState, validate_spec,
};
use crate::engine::{BACKSTOP, Config, Engine};
use crate::events::EventPublisher;
use crate::executor::pod;
use crate::store::{Cas, Change, Expect, JobRow, StoreError, now_ms};

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

/// Tasks publishing Events, each with its own queue; a job always goes to the same one.
pub const EVENT_WORKERS: usize = 8;

/// Jobs waiting for their Events per worker; beyond this, Events are dropped and counted
/// (`managedjobs_events_dropped_total`), as client-go's recorder drops beyond 1,000. Events are
/// best effort; the status and the store's history keep every transition.
pub const EVENT_QUEUE: usize = 1024;

/// One job whose new history may need Events: its id, whether it is Done (its bookkeeping can
/// go), and a reference to the object.
type EventWork = (i64, bool, ObjectReference);

/// API budget of the operator's own requests.
#[derive(Clone, Copy, Debug)]
pub struct ApiBudget {
    /// Sustained requests per second.
    pub qps: u32,
    /// Burst above the sustained rate.
    pub burst: u32,
}

/// Leader election on a Lease (kube-lease-manager): only the holder runs the engine.
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This instance's identity (the Pod name in a cluster).
    pub identity: String,
    /// Lease duration, seconds: a dead leader is replaced within this.
    pub duration_seconds: u64,
}

/// Kubernetes-side options of the operator.
#[derive(Clone, Debug)]
pub struct Options {
    /// Rate limit of the operator's writes.
    pub budget: ApiBudget,
    /// Serve `/metrics`, `/healthz`, `/readyz` here.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Wait for (and keep) a Lease before acting.
    pub leader_election: Option<LeaderElection>,
    /// Publish Kubernetes Events (events.k8s.io) on the transitions a user cares about.
    pub events: bool,
}

/// Errors of a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The API failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The finalizer helper failed.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// A deleted job's workload is still being stopped; the finalizer stays until it is Done.
    #[error("waiting for job {0} to stop before releasing the finalizer")]
    CleanupPending(i64),
    /// The object lacks a field the API server always sets.
    #[error("object has no {0}")]
    MissingField(&'static str),
}

/// Shared state of the reconcile loop and the status writer.
pub struct Operator {
    client: Client,
    engine: Arc<Engine>,
    limiter: DefaultDirectRateLimiter,
    events: Option<EventPublisher>,
    /// Jobs whose status was written and whose new history may need Events, sharded by job id
    /// over [`EVENT_WORKERS`] bounded queues (one job's Events stay in order).
    events_tx: Vec<tokio::sync::mpsc::Sender<EventWork>>,
    /// Per live job, the last history entry whose Events were published.
    published: std::sync::Mutex<std::collections::HashMap<i64, i64>>,
}

/// Runs the operator until SIGTERM/SIGINT. Job controller processes keep running after it
/// stops; the next start adopts them.
pub async fn run(client: Client, cfg: Config, options: Options) -> anyhow::Result<()> {
    let namespace = cfg.namespace.clone();
    // One HTTP server from the start: a standby (waiting for the Lease) answers /healthz, and
    // /readyz only once it leads and watches.
    let started: Arc<std::sync::OnceLock<Arc<Engine>>> = Arc::default();
    if let Some(addr) = options.metrics_addr {
        let (for_render, for_ready) = (started.clone(), started.clone());
        let render: crate::metrics::Render = Arc::new(move || {
            for_render
                .get()
                .map(|e| e.metrics.render(&e.store()))
                .unwrap_or_default()
        });
        let ready: crate::metrics::Ready =
            Arc::new(move || for_ready.get().is_some_and(|e| e.metrics.is_ready()));
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(addr, ready, render).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
    }
    if let Some(le) = &options.leader_election {
        acquire_lease(client.clone(), le).await?;
    }
    let engine = Engine::start(cfg)?;
    let _ = started.set(engine.clone());
    let budget = options.budget;
    let quota = Quota::per_second(NonZeroU32::new(budget.qps.max(1)).expect("max(1) > 0"))
        .allow_burst(NonZeroU32::new(budget.burst.max(1)).expect("max(1) > 0"));
    let events = options.events.then(|| {
        EventPublisher::new(
            client.clone(),
            "managed-jobs",
            std::env::var("POD_NAME").ok(),
        )
    });
    let (events_tx, events_rx): (Vec<_>, Vec<_>) = (0..EVENT_WORKERS)
        .map(|_| tokio::sync::mpsc::channel::<EventWork>(EVENT_QUEUE))
        .unzip();
    let op = Arc::new(Operator {
        client: client.clone(),
        engine,
        limiter: RateLimiter::direct(quota),
        events,
        events_tx,
        published: Default::default(),
    });
    for mut rx in events_rx {
        let op = op.clone();
        tokio::spawn(async move {
            while let Some((job_id, done, reference)) = rx.recv().await {
                op.publish_events(job_id, done, &reference).await;
            }
        });
    }
    tokio::spawn(status_loop(op.clone()));
    if op.engine.config().executors.contains(&ExecutorKind::Pod) {
        let pods: Api<Pod> = match &namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        tokio::spawn(pod_watch(op.clone(), pods));
    }
    let jobs: Api<ManagedJob> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    tracing::info!("operator started; watching ManagedJobs");
    op.engine.metrics.set_ready();
    // The controller's cache holds every ManagedJob: drop what reconciles never read (managed
    // fields, the client-side-apply annotation), which is most of a small object's size.
    let (reader, writer) = kube::runtime::reflector::store();
    let stream = watcher(jobs, watcher::Config::default().any_semantic())
        .default_backoff()
        .modify(|mj: &mut ManagedJob| {
            mj.managed_fields_mut().clear();
            mj.annotations_mut()
                .remove("kubectl.kubernetes.io/last-applied-configuration");
        })
        .reflect(writer)
        .touched_objects();
    Controller::for_stream(stream, reader)
        .shutdown_on_signal()
        .run(reconcile, error_policy, op)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile failed");
            }
        })
        .await;
    tracing::info!(
        "operator stopped; job controller processes keep running and are adopted at the next start"
    );
    Ok(())
}

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
async fn status_loop(op: Arc<Operator>) {
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

/// The one shared watch on Pods carrying our job-id label: every change becomes a
/// [`crate::store::PodObservation`] in the store and wakes the job's controller.
async fn pod_watch(op: Arc<Operator>, pods: Api<Pod>) {
    use watcher::Event;
    let cfg = watcher::Config::default().labels(LABEL_JOB_ID);
    let mut stream = watcher(pods, cfg).default_backoff().boxed();
    let mut listed: HashSet<(i64, i32)> = HashSet::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(p)) => {
                if let Some(key) = op.observe_pod(&p, false) {
                    listed.insert(key);
                }
            }
            Ok(Event::InitDone) => op.mark_vanished_pods(&listed),
            Ok(Event::Apply(p)) => {
                op.observe_pod(&p, false);
            }
            Ok(Event::Delete(p)) => {
                op.observe_pod(&p, true);
            }
            Err(e) => tracing::warn!(error = %e, "Pod watch error; retrying"),
        }
    }
}

async fn reconcile(mj: Arc<ManagedJob>, op: Arc<Operator>) -> Result<Action, Error> {
    let ns = mj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let api: Api<ManagedJob> = Api::namespaced(op.client.clone(), &ns);
    finalizer(&api, FINALIZER, mj, |event| async {
        match event {
            Finalizer::Apply(mj) => op.apply(&mj).await,
            Finalizer::Cleanup(mj) => op.cleanup(&mj).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

fn error_policy(mj: Arc<ManagedJob>, error: &Error, op: Arc<Operator>) -> Action {
    use kube::runtime::finalizer::Error as F;
    if let Error::Finalizer(e) = error
        && let F::CleanupFailed(Error::CleanupPending(_)) = e.as_ref()
    {
        // Not a failure: the status write of the final phase re-triggers us; this is a backstop.
        return Action::requeue(Duration::from_secs(1));
    }
    op.engine.metrics.reconcile_errors_total.inc();
    tracing::warn!(job = %mj.name_any(), error = %error, "reconcile failed; retrying in 5 s");
    Action::requeue(Duration::from_secs(5))
}

impl Operator {
    /// Mirror, submit, cancel on request, delete after the TTL.
    async fn apply(&self, mj: &ManagedJob) -> Result<Action, Error> {
        let uid = mj.uid().ok_or(Error::MissingField("metadata.uid"))?;
        let ns = mj
            .namespace()
            .ok_or(Error::MissingField("metadata.namespace"))?;
        let name = mj.name_any();
        let generation = mj.metadata.generation.unwrap_or(0);
        let created_at_ms = mj
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_millisecond())
            .unwrap_or_else(now_ms);
        let up = self.engine.store().upsert_created(
            &uid,
            &ns,
            &name,
            generation,
            &mj.spec,
            created_at_ms,
            mj.status.as_ref(),
        )?;
        let mut row = up.row;
        if up.inserted {
            tracing::info!(job_id = row.id, job = %row.key(), executor = %row.executor, "job submitted");
            if let Err(why) = validate_spec(&mj.spec) {
                let change = Change {
                    phase: Some(JobPhase::FailedPrecheck),
                    schedule: Some(ScheduleState::Done),
                    failure_reason: Some(Some("InvalidSpec".into())),
                    message: Some(why),
                    reason: "Failed",
                    ..Default::default()
                };
                if let Cas::Applied(r) =
                    self.engine
                        .store()
                        .transition(row.id, &Expect::default(), &change)?
                {
                    row = *r;
                }
            }
        }
        if mj.spec.cancel && (up.inserted || !row.cancel_requested) {
            row = self.engine.cancel(row, false)?;
        }
        self.engine.wake_all();
        if row.schedule_state == ScheduleState::Done
            && let (Some(ttl), Some(finished)) =
                (mj.spec.ttl_seconds_after_finished, row.finished_at_ms)
        {
            let due = finished + i64::from(ttl) * 1000;
            let left = due - now_ms();
            if left > 0 {
                return Ok(Action::requeue(Duration::from_millis(left as u64)));
            }
            tracing::info!(job_id = row.id, job = %row.key(), "deleting: ttlSecondsAfterFinished passed");
            let api: Api<ManagedJob> = Api::namespaced(self.client.clone(), &ns);
            self.engine.metrics.api_request("delete");
            api.delete(&name, &DeleteParams::default()).await?;
        }
        Ok(Action::await_change())
    }

    /// Deletion: cancel, wait until Done, forget the job; the finalizer helper then lets go.
    async fn cleanup(&self, mj: &ManagedJob) -> Result<Action, Error> {
        let uid = mj.uid().ok_or(Error::MissingField("metadata.uid"))?;
        let Some(row) = self.engine.store().find_by_uid(&uid)? else {
            return Ok(Action::await_change());
        };
        if row.schedule_state == ScheduleState::Done {
            tracing::info!(job_id = row.id, job = %row.key(), "deleted; forgetting the job");
            self.engine.store().delete(row.id)?;
            let work = self
                .engine
                .config()
                .state_dir
                .join("work")
                .join(row.id.to_string());
            let _ = std::fs::remove_dir_all(work);
            return Ok(Action::await_change());
        }
        let id = row.id;
        if !row.deleting {
            self.engine.cancel(row, true)?;
        }
        // kube's finalizer helper releases the finalizer on Ok: hold it with an error until the
        // job is Done (the status write of the final phase triggers the next reconcile).
        Err(Error::CleanupPending(id))
    }

    /// Records what a labelled Pod shows, if it belongs to one of our jobs (its owner is the
    /// job's object), and wakes that job's controller when something changed.
    fn observe_pod(&self, pod: &Pod, deleted: bool) -> Option<(i64, i32)> {
        let (id, attempt) = pod::pod_key(pod)?;
        let row = self.engine.store().find(id).ok()??;
        let owned = pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.uid == row.uid);
        if !owned {
            return None;
        }
        let observation = pod::observe(pod, id, attempt, deleted);
        let changed = self.engine.store().record_pod(&observation);
        match changed {
            Ok(true) => {
                tracing::debug!(job_id = id, attempt, state = %observation.state, "pod observed");
                self.engine.wake_controller(&row);
                self.engine.wake_all();
            }
            Ok(false) => {}
            Err(e) => {
                tracing::error!(job_id = id, error = %e, "recording a Pod observation failed")
            }
        }
        Some((id, attempt))
    }

    /// After a (re)list: Pods we had seen that are no longer there were deleted while we were
    /// not watching.
    fn mark_vanished_pods(&self, listed: &HashSet<(i64, i32)>) {
        let live = self.engine.store().live_jobs().unwrap_or_default();
        for row in live.iter().filter(|r| r.executor == ExecutorKind::Pod) {
            let key = (row.id, row.attempt);
            if listed.contains(&key) {
                continue;
            }
            let seen = self.engine.store().pod_observation(row.id, row.attempt);
            if let Ok(Some(mut o)) = seen
                && !o.deleted
            {
                o.deleted = true;
                if !matches!(o.state.as_str(), "succeeded" | "failed" | "setup-failed") {
                    o.state = "lost".into();
                    o.reason = "PodDeleted".into();
                    o.message = "the Pod was deleted while the operator was not watching".into();
                }
                let _ = self.engine.store().record_pod(&o);
                self.engine.wake_controller(row);
            }
        }
        self.engine.wake_all();
    }

    /// Publishes the Events (see [`crate::events`]) for the job's transitions since the last
    /// publish; `done` forgets the job afterwards.
    async fn publish_events(&self, job_id: i64, done: bool, reference: &ObjectReference) {
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
        let after = {
            let mut map = self.published.lock().unwrap_or_else(|e| e.into_inner());
            let after = map.get(&job_id).copied().unwrap_or(0);
            if done {
                map.remove(&job_id);
            } else {
                map.insert(job_id, last);
            }
            after
        };
        for event in crate::events::events_for(&history, after) {
            self.limiter.until_ready().await;
            self.engine.metrics.api_request("create_event");
            if let Err(e) = publisher.publish(reference, &event).await {
                tracing::debug!(job_id, error = %e, "publishing an event failed");
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
                        let mut map = self.published.lock().unwrap_or_else(|e| e.into_inner());
                        map.remove(&row.id);
                    }
                }
                true
            }
            // Gone, or replaced by a new object of the same name: nothing to write to.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => true,
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

/// Waits until this instance holds the Lease, then watches it: losing it ends the process (a
/// restarted instance stands by again), so two operators never act at once.
async fn acquire_lease(client: Client, le: &LeaderElection) -> anyhow::Result<()> {
    use kube_lease_manager::LeaseManagerBuilder;
    let manager = LeaseManagerBuilder::new(client, &le.lease_name)
        .with_namespace(&le.namespace)
        .with_identity(&le.identity)
        .with_duration(le.duration_seconds)
        .with_grace(le.duration_seconds.div_ceil(3).max(1))
        .build()
        .await?;
    let (mut leading, _task) = manager.watch().await;
    tracing::info!(lease = %le.lease_name, namespace = %le.namespace, identity = %le.identity, "waiting to lead");
    while !*leading.borrow_and_update() {
        leading.changed().await?;
    }
    tracing::info!(identity = %le.identity, "leading");
    tokio::spawn(async move {
        loop {
            if leading.changed().await.is_err() || !*leading.borrow_and_update() {
                tracing::error!("lost the lease; exiting so that only one operator acts");
                std::process::exit(1);
            }
        }
    });
    Ok(())
}
