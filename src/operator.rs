//! The operator (`managed-jobs run`): the Kubernetes side around the [`Engine`].
//!
//! - the reconcile loop (kube's `Controller` + `finalizer`): mirror each ManagedJob into the
//!   store (submitting it), cancel on `spec.cancel`, cancel and clean up on delete, delete after
//!   `ttlSecondsAfterFinished`;
//! - the status writer: for rows whose `status_version` moved, one merge patch of the status
//!   subresource each, coalesced (a burst of changes is one write) and within the API budget
//!   (`--api-qps`/`--api-burst`, a token bucket).

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
    /// Jobs whose status was written and whose new history may need Events: the job id, whether
    /// it is Done (its bookkeeping can go), and a reference to the object.
    events_tx: tokio::sync::mpsc::UnboundedSender<(i64, bool, ObjectReference)>,
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
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let op = Arc::new(Operator {
        client: client.clone(),
        engine,
        limiter: RateLimiter::direct(quota),
        events,
        events_tx,
        published: Default::default(),
    });
    {
        let op = op.clone();
        tokio::spawn(async move {
            while let Some((job_id, done, reference)) = events_rx.recv().await {
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

async fn status_loop(op: Arc<Operator>) {
    loop {
        tokio::select! {
            _ = op.engine.status_changed.notified() => {}
            _ = tokio::time::sleep(BACKSTOP) => {}
        }
        // Coalesce a burst of changes into one write per job.
        tokio::time::sleep(Duration::from_millis(20)).await;
        loop {
            let rows = match op.engine.store().unsynced(256) {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::error!(error = %e, "reading unsynced rows failed");
                    break;
                }
            };
            if rows.is_empty() {
                break;
            }
            // Write the rows that gave up a slot before those that took one, so that a reader
            // of the API never sees more jobs alive, or launching, than the caps allow.
            let rank = |r: &JobRow| match r.schedule_state {
                ScheduleState::Launching => 2,
                ScheduleState::Alive | ScheduleState::AliveWaiting => 1,
                _ => 0,
            };
            let mut groups: [Vec<JobRow>; 3] = Default::default();
            for row in rows {
                groups[rank(&row)].push(row);
            }
            let mut failures = 0;
            for group in groups {
                failures += futures::stream::iter(group)
                    .map(|row| {
                        let op = op.clone();
                        async move { op.write_status(&row).await }
                    })
                    .buffer_unordered(STATUS_WRITERS)
                    .filter(|ok| futures::future::ready(!ok))
                    .count()
                    .await;
            }
            if failures > 0 {
                break; // retried at the next wake-up or backstop
            }
        }
    }
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
                if self.events.is_some() {
                    let done = row.schedule_state == ScheduleState::Done;
                    let _ = self.events_tx.send((row.id, done, mj.object_ref(&())));
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
