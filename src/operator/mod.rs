//! The operator (`managed-jobs run`): the Kubernetes side around the [`Engine`].
//!
//! - the reconcile loop (kube's `Controller` + `finalizer`): mirror each ManagedJob into the
//!   store (submitting it), cancel on `spec.cancel`, cancel and clean up on delete, delete after
//!   `ttlSecondsAfterFinished`;
//! - the status writer (`status_loop`, ordering by [`writable`]): for rows whose
//!   `status_version` moved, one merge patch of the status subresource each, coalesced (a burst
//!   of changes is one write), ordered so the API never shows more jobs holding slots than the
//!   caps, and within the API budget (`--api-qps`/`--api-burst`, a token bucket);
//! - Events ([`crate::events`]) from the store's history, after each status write, best effort
//!   (a failure also regarding the Flux Kustomization that applied the job).
//!
//! Submodules: [`status_writer`] (status writes and Events), [`lease`] (leader election),
//! [`claims`] and [`ownership`] (one owner per job: the claims on namespaces),
//! [`pod_watch`] (the one shared Pod watch), [`nodes`] (the one shared Node watch: lost nodes),
//! [`rebuild`] (a lost store), [`world`] (the world check's observations and fixes), [`budget`] (the API budget), [`queues`] (the queues and
//! namespaces watched, the queues' status).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Resource as _, ResourceExt};

use k8s_openapi::api::core::v1::Pod;

use crate::api::{FINALIZER, ManagedJob, ScheduleState, WaitReason};
use crate::engine::{Config, Engine};
use crate::events::EventPublisher;
use crate::lifecycle::{Object, now_ms};
use crate::store::StoreError;
use shared::EventWork;

pub mod budget;
pub mod claims;
pub mod cluster;
pub mod lease;
pub mod nodes;
pub mod ownership;
pub mod pod_watch;
pub mod queues;
pub mod rebuild;
pub mod retry;
pub mod shared;
pub mod status_writer;
pub mod world;

pub use budget::RequestBudget;
pub use lease::LeaderElection;
pub use retry::{WATCH_RETRY_FIRST, WATCH_RETRY_MAX, WatchBackoff, watch_backoff};
pub use shared::{EVENT_QUEUE, EVENT_WORKERS, Operator};
pub use status_writer::{FIRST_STATUS_DELAY, STATUS_COALESCE, STATUS_WRITERS, slot_rank, writable};

/// First delay before retrying a failed reconcile of one object; doubles per consecutive
/// failure of that object up to [`MAX_RETRY_DELAY`] (client-go's per-item exponential back-off).
pub const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
/// Longest delay before retrying a failed reconcile.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(300);

/// API budget of the operator's own requests.
#[derive(Clone, Copy, Debug)]
pub struct ApiBudget {
    /// Sustained requests per second.
    pub qps: u32,
    /// Burst above the sustained rate.
    pub burst: u32,
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
    /// Publish Kubernetes Events on the transitions a user cares about.
    pub events: bool,
    /// The duration of the claims on namespaces (`--lease-duration-seconds`): an owner that
    /// dies hands its jobs over within about this.
    pub claim_duration: Duration,
    /// Serve the visibility API and dashboard ([`crate::visibility`]).
    pub visibility: Option<crate::visibility::Options>,
    /// How long a node may stay not Ready before the members of live attempts bound to it
    /// are lost (`--node-lost-grace-seconds`; a deleted node loses them at once).
    pub node_lost_grace: Duration,
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
                .map(|e| e.metrics.render(&e.store(), e.queues().as_deref()))
                .unwrap_or_default()
        });
        let ready: crate::metrics::Ready = Arc::new(move || match for_ready.get() {
            Some(e) => e.metrics.readiness(),
            None => Err("starting".into()),
        });
        tokio::spawn(async move {
            if let Err(e) = crate::metrics::serve(addr, ready, render).await {
                let hint = if addr.port() < 1024 {
                    "; a port below 1024 needs privileges a non-root container does not have"
                } else {
                    ""
                };
                tracing::error!(error = %e, %addr, "the metrics server (/metrics, /healthz, /readyz) could not serve on {addr}{hint}");
            }
        });
    }
    // The visibility API answers 503 until this operator leads and its engine runs. It runs on
    // a thread and runtime of its own, at a lower CPU priority than the operator's.
    if let Some(visibility) = options.visibility.clone() {
        crate::visibility::spawn(visibility, client.clone(), started.clone())
            .map_err(|e| anyhow::anyhow!("starting the visibility API's thread: {e}"))?;
    }
    if let Some(le) = &options.leader_election {
        lease::acquire_lease(client.clone(), le).await?;
    }
    // The state dir is ours alone from here; a lost store is rebuilt from the API before
    // anything is admitted.
    let dir = crate::state_dir::StateDir::new(&cfg.state_dir);
    let lock = crate::engine::lock_state_dir(&dir)?;
    // Before the store is opened (and migrated): a newer release's store is refused, and the
    // job controllers of another build (a version change) are stopped, their jobs handed over.
    crate::engine::take_over(&dir, &cfg.self_exe)?;
    ensure_crd_served(&client, namespace.as_deref()).await?;
    // One owner per job: the namespaces this operator may act in are claimed, and the rows of
    // those another operator owns are left to it, before anything is rebuilt, adopted or
    // resumed.
    let timing = crate::lifecycle::claim::Timing::new(options.claim_duration);
    let (claims, claim_events) = ownership::claim_at_start(
        &client,
        &dir,
        namespace.as_deref(),
        cfg.shard.as_deref(),
        timing,
        cfg.cancel_grace,
    )
    .await?;
    let owned = claims.held();
    let rebuilt = rebuild::rebuild_if_empty(
        &client,
        &dir,
        namespace.as_deref(),
        cfg.shard.as_deref(),
        Some(&owned),
    )
    .await?;
    if rebuilt.jobs > 0 {
        tracing::info!(
            jobs = rebuilt.jobs,
            pods_adopted = rebuilt.pods_adopted,
            pods_missing = rebuilt.pods_missing,
            "the store was empty: rebuilt from the ManagedJobs' status"
        );
    }
    // Before anything is adopted, resumed or admitted: jobs whose object vanished meanwhile.
    world::check_objects_at_start(
        &client,
        &dir,
        namespace.as_deref(),
        cfg.shard.as_deref(),
        Some(&owned),
    )
    .await?;
    let engine = Engine::start_locked(cfg, lock)?;
    let _ = started.set(engine.clone());
    // The counts the dashboard plots, sampled whether or not it is served (a restart of the
    // server then still shows the last hour).
    tokio::spawn(crate::visibility::sample_loop(engine.clone()));
    let budget = options.budget;
    let events = options.events.then(|| {
        EventPublisher::new(
            client.clone(),
            "managed-jobs",
            std::env::var("POD_NAME").ok(),
        )
    });
    // The controller's cache holds every ManagedJob: drop what reconciles never read (managed
    // fields, the client-side-apply annotation), which is most of a small object's size.
    let (reader, writer) = kube::runtime::reflector::store();
    let (events_tx, events_rx): (Vec<_>, Vec<_>) = (0..EVENT_WORKERS)
        .map(|_| tokio::sync::mpsc::channel::<EventWork>(EVENT_QUEUE))
        .unzip();
    let pacer = engine.pacer.clone();
    let op = Arc::new(Operator {
        client: client.clone(),
        engine,
        budget: RequestBudget::paced(budget.qps, budget.burst, pacer),
        events,
        events_tx,
        failures: Default::default(),
        jobs: reader.clone(),
        claims,
        too_large: Default::default(),
    });
    for mut rx in events_rx {
        let op = op.clone();
        tokio::spawn(async move {
            while let Some((job_id, reference)) = rx.recv().await {
                op.publish_events(job_id, &reference).await;
            }
        });
    }
    tokio::spawn(status_writer::status_loop(op.clone()));
    // The queues in force: the engine admits nothing until they were listed.
    let queue_watch = queues::start(op.clone(), namespace.clone());
    tokio::spawn(queues::status_loop(op.clone(), queue_watch));
    let reporter = op.clone();
    tokio::spawn(async move {
        loop {
            reporter.engine.state_dir_changed.notified().await;
            if let Some(problem) = reporter.engine.state_dir_problem() {
                reporter.report_state_dir_failing(&problem).await;
            }
        }
    });
    let pod_cache = op
        .engine
        .config()
        .executors
        .iter()
        .any(|k| k.facts().api_objects)
        .then(|| Arc::new(pod_watch::PodCache::default()));
    if let Some(cache) = &pod_cache {
        let pods: Api<Pod> = match &namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        tokio::spawn(pod_watch::run(op.engine.clone(), pods, cache.clone()));
    }
    // The nodes the Pods run on (cluster-scoped, whatever the operator's namespace): a lost
    // node ends its members' attempts (`docs/design.md#failures`).
    let (node_view, node_writer) = nodes::NodeView::new();
    if pod_cache.is_some() {
        tokio::spawn(nodes::run(
            op.engine.clone(),
            Api::all(client.clone()),
            node_view.clone(),
            node_writer,
        ));
    }
    // The cluster's Pods on those nodes, for the queues with pools (admission in resources:
    // `operator::cluster`); watched once a queue has pools.
    if pod_cache.is_some() {
        let (engine, client, view) = (op.engine.clone(), client.clone(), node_view.clone());
        tokio::spawn(async move {
            while !engine.queues().is_some_and(|q| q.any_quotas()) {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            tracing::info!("a queue has pools: watching the cluster's Pods to admit what fits");
            let watch = cluster::ClusterWatch::start(engine.clone(), client, view);
            engine.set_cluster_view(watch);
        });
    }
    let jobs: Api<ManagedJob> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    tracing::info!(
        owner = %crate::engine::shard_name(op.engine.config().shard.as_deref()),
        "operator started; watching ManagedJobs"
    );
    op.engine.metrics.set_ready();
    let objects_deleted = Arc::new(tokio::sync::Notify::new());
    // Set once the watch listed every object (the reader holds them all from then on).
    let objects_listed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Once the cache holds every object (a failure's Event to its Flux Kustomization reads the
    // job's labels there), the Events a stopped operator left unpublished. Told by the watch
    // itself, not `Store::wait_until_ready`: kube's ready signal is a oneshot that wakes only
    // the last of concurrent waiters, and the controller waits on it too (this sweep was seen
    // never to run).
    let first_listed = Arc::new(tokio::sync::Notify::new());
    let pending = op.clone();
    let listed = first_listed.clone();
    tokio::spawn(async move {
        listed.notified().await;
        pending.publish_pending_events().await;
    });
    tokio::spawn(world::world_loop(
        op.clone(),
        reader.clone(),
        pod_cache,
        world::NodeCheck {
            view: node_view,
            grace: options.node_lost_grace,
        },
        objects_deleted.clone(),
        objects_listed.clone(),
    ));
    // A namespace's jobs to act on again (a claim acquired or renewed again): all reconciled.
    let (reconcile_all, reconcile_all_rx) = futures::channel::mpsc::unbounded::<()>();
    tokio::spawn(ownership::handle(
        op.clone(),
        claim_events,
        reconcile_all,
        objects_listed.clone(),
    ));
    // This shard's jobs only (the default instance: the jobs without a shard label).
    let selector = crate::api::shard_selector(op.engine.config().shard.as_deref());
    let watched = op.clone();
    let mut health = retry::WatchHealth::new("ManagedJob");
    let first_seen = reader.clone();
    let stream = retry::relisting_watch(
        jobs,
        watcher::Config::default().any_semantic().labels(&selector),
    )
    .modify(move |mj: &mut ManagedJob| {
        // The version the watch first saw the object at, kept across its later versions (the
        // cache still holds the one before this event, also while the watch lists again).
        let first = first_seen
            .get(&kube::runtime::reflector::ObjectRef::from_obj(mj))
            .filter(|old| old.uid() == mj.uid())
            .and_then(|old| old.annotations().get(FIRST_SEEN_VERSION).cloned())
            .or_else(|| mj.resource_version());
        // What is dropped still counts in the object's size (`status_writer`: a status that
        // would not fit is written minimal): its length is kept in an annotation of this
        // copy, never written back.
        let dropped = serde_json::to_vec(&mj.metadata.managed_fields).map_or(0, |v| v.len())
            + mj.annotations()
                .get(status_writer::LAST_APPLIED)
                .map_or(0, |a| a.len() + status_writer::LAST_APPLIED.len());
        // Who set spec.suspend is read from the managed fields before they go, kept the same way.
        mj.annotations_mut().remove(SUSPEND_MANAGER);
        if mj.spec.suspend
            && let Some(manager) = suspend_manager(mj)
        {
            mj.annotations_mut().insert(SUSPEND_MANAGER.into(), manager);
        }
        mj.managed_fields_mut().clear();
        mj.annotations_mut().remove(status_writer::LAST_APPLIED);
        mj.annotations_mut()
            .insert(status_writer::TRIMMED_BYTES.into(), dropped.to_string());
        if let Some(first) = first {
            mj.annotations_mut()
                .insert(FIRST_SEEN_VERSION.into(), first);
        }
    })
    .reflect(writer)
    .inspect(move |event| {
        match event {
            // A deletion the finalizer did not hold (removed by hand): the world check cancels
            // the job soon, before its workload is relaunched.
            Ok(watcher::Event::Delete(mj)) => {
                watched.forget_arrival(mj);
                objects_deleted.notify_one()
            }
            // A job not recorded yet holds back the jobs after it in its queue until it is.
            Ok(watcher::Event::Apply(mj) | watcher::Event::InitApply(mj)) => {
                watched.note_arrival(mj)
            }
            Ok(watcher::Event::InitDone) => {
                objects_listed.store(true, std::sync::atomic::Ordering::SeqCst);
                first_listed.notify_one();
                // Back after a failure (an API outage): objects deleted meanwhile are found
                // by the world check at once.
                if health.listed(Some(&watched.engine.metrics)).is_some() {
                    watched.engine.world_changed.notify_one();
                }
            }
            Err(e) => {
                if !watched.watch_failed(e) {
                    health.failed(e);
                }
            }
            Ok(_) => {}
        }
        if event.is_ok() {
            watched.watch_works();
        }
    })
    .touched_objects();
    // The watch runs on its own task and hands the controller only objects: its failures and
    // retries never wait on (or are held up by) the controller's queue, so after an API outage
    // it lists again within its back-off (`retry::relisting_watch`).
    let (objects_tx, objects_rx) = futures::channel::mpsc::unbounded::<ManagedJob>();
    tokio::spawn(async move {
        let mut stream = stream.boxed();
        while let Some(item) = stream.next().await {
            if let Ok(mj) = item
                && objects_tx.unbounded_send(mj).is_err()
            {
                return;
            }
        }
    });
    Controller::for_stream(objects_rx.map(Ok::<_, watcher::Error>), reader)
        .reconcile_all_on(reconcile_all_rx)
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

/// The ManagedJob CRD, as `kubectl get crd` names it.
pub const CRD_NAME: &str = "managedjobs.managedjobs.dev";
/// How to install the CRD, as errors and logs say it.
pub const CRD_HINT: &str =
    "install it with `kubectl apply -f crds/` (or `managed-jobs crd | kubectl apply -f -`)";

/// True when `e` is the API's 404 for a resource it does not serve (a CRD not installed).
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(r) if r.code == 404)
}

/// What the operator says when the ManagedJob API is not served.
pub fn crd_missing_message() -> String {
    format!(
        "the ManagedJob API (managedjobs.dev/v1alpha1) is not served: the CRD {CRD_NAME} is not installed; {CRD_HINT}"
    )
}

/// At start: the ManagedJob API is served (in `namespace`, or cluster-wide). Errors: it is not
/// (the message names the CRD and how to install it), or the API failed.
async fn ensure_crd_served(client: &Client, namespace: Option<&str>) -> anyhow::Result<()> {
    let api: Api<ManagedJob> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    match api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => {
            anyhow::bail!("{}; then start the operator again", crd_missing_message())
        }
        Err(e) => Err(anyhow::Error::new(e).context("listing ManagedJobs")),
    }
}

/// How often a job this operator may not act on now (its namespace's claim is another's, or
/// overdue) is looked at again, besides the reconcile of every job when a claim is taken or
/// renewed again.
pub const NOT_ACTING_RECHECK: Duration = Duration::from_secs(60);

async fn reconcile(mj: Arc<ManagedJob>, op: Arc<Operator>) -> Result<Action, Error> {
    let ns = mj
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    // Another operator's job (it holds the claim on the namespace), or one this operator may
    // not act on now (its claim overdue): left alone, reconciled again once it may
    // (`ownership::handle`). No finalizer is added, no status written, nothing submitted.
    // Looked at again after [`NOT_ACTING_RECHECK`] too: a job must never depend on one event
    // to be picked up (each look is a read of the claim in memory, no API request).
    if !op.acts_on(&ns) {
        // Not yet this operator's (its claim not acquired yet), it stays noted as arriving.
        if op.claimed_elsewhere(&ns) {
            op.forget_arrival(&mj);
        }
        return Ok(Action::requeue(NOT_ACTING_RECHECK));
    }
    let uid = mj.uid();
    let api: Api<ManagedJob> = Api::namespaced(op.client.clone(), &ns);
    let result = finalizer(&api, FINALIZER, mj, |event| async {
        match event {
            Finalizer::Apply(mj) => op.apply(&mj).await,
            Finalizer::Cleanup(mj) => op.cleanup(&mj).await,
        }
    })
    .await
    .or_else(|e| match finalizer_race(&e) {
        // The object is gone: nothing failed.
        Some(action) => Ok(action),
        None => Err(Error::Finalizer(Box::new(e))),
    });
    if result.is_ok()
        && let Some(uid) = uid
    {
        op.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&uid);
    }
    result
}

/// A finalizer add or removal, or an apply or cleanup, that found the object gone (404), which
/// is no failure: a second reconcile of a deletion whose first one already released the
/// finalizer (the controller's copy still had it), a `ttlSecondsAfterFinished` delete of an
/// object deleted meanwhile. Deleting 10,000 jobs logged 4,388 such "failures" and counted
/// 4,801 reconcile errors (issue 43). None for anything else, which is retried as an error
/// (a 422 is not taken for a race: an admission policy refuses with it too).
fn finalizer_race(e: &kube::runtime::finalizer::Error<Error>) -> Option<Action> {
    use kube::runtime::finalizer::Error as F;
    let gone = match e {
        F::AddFinalizer(e)
        | F::RemoveFinalizer(e)
        | F::ApplyFailed(Error::Kube(e))
        | F::CleanupFailed(Error::Kube(e)) => is_not_found(e),
        _ => false,
    };
    gone.then(Action::await_change)
}

/// Delay before retrying an object's reconcile after its `failures`-th consecutive failure:
/// [`FIRST_RETRY_DELAY`] doubled per failure, capped at [`MAX_RETRY_DELAY`].
pub fn retry_delay(failures: u32) -> Duration {
    let factor = 1u32 << failures.clamp(1, 16).saturating_sub(1);
    FIRST_RETRY_DELAY
        .saturating_mul(factor)
        .min(MAX_RETRY_DELAY)
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
    let failures = {
        let mut map = op.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(mj.uid().unwrap_or_default()).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let delay = retry_delay(failures);
    tracing::warn!(job = %mj.name_any(), error = %error, failures, "reconcile failed; retrying in {delay:?}");
    Action::requeue(delay)
}

impl Operator {
    /// The ManagedJob watch failed: a 404 means the CRD is gone (deleted while the operator
    /// runs), which makes the operator not ready and is logged once as an error (returns
    /// true); anything else is retried with the watch's back-off ([`watch_backoff`]).
    fn watch_failed(&self, e: &watcher::Error) -> bool {
        let not_found = match e {
            watcher::Error::InitialListFailed(e)
            | watcher::Error::WatchStartFailed(e)
            | watcher::Error::WatchFailed(e) => is_not_found(e),
            watcher::Error::WatchError(r) => r.code == 404,
            _ => false,
        };
        if not_found
            && self
                .engine
                .metrics
                .set_problem("crd", Some(crd_missing_message()))
        {
            tracing::error!("{}; not ready until it is", crd_missing_message());
        }
        not_found
    }

    /// The ManagedJob watch works (again).
    fn watch_works(&self) {
        if self.engine.metrics.set_problem("crd", None) {
            tracing::info!("the ManagedJob API is served again; ready");
        }
    }

    /// Notes `mj` as arriving when it is not recorded yet (and not being deleted, nor another
    /// operator's): the jobs after it in its queue are not admitted until it is, for at most
    /// [`crate::store::ARRIVAL_HOLD_MS`] (`Store::arriving`). The operator records jobs in the
    /// order its reconciles finish, not the order the API server accepted them (a list at
    /// start comes in name order); without this, a pass could admit a later job first.
    fn note_arrival(&self, mj: &ManagedJob) {
        if mj.metadata.deletion_timestamp.is_some() {
            return;
        }
        let (Some(uid), Some(ns)) = (mj.uid(), mj.namespace()) else {
            return;
        };
        if self.claimed_elsewhere(&ns) {
            return;
        }
        let now = now_ms();
        let version = crate::lifecycle::entry::version_key(&first_seen_version(mj));
        let arriving = self.engine.store().arriving(
            &uid,
            mj.spec.queue_name(),
            mj.spec.priority,
            rebuild::created_ms(mj, now),
            version.as_deref().unwrap_or_default(),
            now,
        );
        if let Err(e) = arriving {
            tracing::warn!(job = %mj.name_any(), error = %e, "noting an arriving job failed: the jobs after it may be admitted first");
        }
    }

    /// Forgets `mj`'s arrival ([`Operator::note_arrival`]): recorded, deleted, or another
    /// operator's to record.
    fn forget_arrival(&self, mj: &ManagedJob) {
        if let Some(uid) = mj.uid()
            && let Err(e) = self.engine.store().arrived(&uid, now_ms())
        {
            tracing::warn!(job = %mj.name_any(), error = %e, "forgetting an arriving job failed");
        }
    }

    /// Mirror, submit, cancel on request, delete after the TTL.
    async fn apply(&self, mj: &ManagedJob) -> Result<Action, Error> {
        let uid = mj.uid().ok_or(Error::MissingField("metadata.uid"))?;
        let ns = mj
            .namespace()
            .ok_or(Error::MissingField("metadata.namespace"))?;
        let name = mj.name_any();
        let generation = mj.metadata.generation.unwrap_or(0);
        let created_at_ms = rebuild::created_ms(mj, now_ms());
        let version = first_seen_version(mj);
        let object = Object {
            uid: &uid,
            namespace: &ns,
            name: &name,
            generation,
            spec: &mj.spec,
            created_at_ms,
            resource_version: &version,
        };
        // A job this store lacks whose status names a job: another operator (or a lost store)
        // drove it. Taken over from its status, its Pod adopted; never run again as new.
        if mj.status.as_ref().and_then(|s| s.job_id).is_some()
            && self.engine.store().find_by_uid(&uid)?.is_none()
        {
            match rebuild::restore_one(&self.client, &self.engine, mj, self.claims.identity()).await
            {
                Ok(Some(row)) => {
                    self.forget_arrival(mj);
                    let from = mj
                        .status
                        .as_ref()
                        .and_then(|s| s.owner.clone())
                        .unwrap_or_else(|| "a store that is gone".into());
                    tracing::info!(job_id = row.id, job = %row.key(), phase = %row.phase, attempt = row.attempt, from = %from, "took the job over from its status");
                    // Its status may say Suspended while its spec no longer asks for it (or the
                    // reverse): routed as any change of spec.suspend.
                    let row = self.engine.suspend_or_resume(row)?;
                    self.engine.resume_restored(&row);
                    return Ok(Action::await_change());
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(job = %name, error = %e, "taking a job over from its status failed; retrying");
                    return Ok(Action::requeue(FIRST_RETRY_DELAY));
                }
            }
        }
        let up = self.engine.store().submit(&object, mj.status.as_ref())?;
        self.forget_arrival(mj);
        let mut row = up.row;
        if up.inserted {
            self.engine.pacer.arrive(created_at_ms);
            tracing::info!(job_id = row.id, job = %row.key(), executor = %row.executor, phase = %row.phase, "job submitted");
        }
        if mj.spec.cancel && (up.inserted || !row.cancel_requested) {
            row = self.engine.cancel(row, false)?;
        }
        // spec.suspend: who set it (the status names them), then held or resumed as it asks.
        if !row.cancel_requested && row.schedule_state != ScheduleState::Done {
            if mj.spec.suspend
                && let Some(who) = mj.annotations().get(SUSPEND_MANAGER)
                && row.suspended_by.as_ref() != Some(who)
            {
                self.engine.store().note_suspended_by(row.id, Some(who))?;
                row.suspended_by = Some(who.clone());
            }
            row = self.engine.suspend_or_resume(row)?;
        }
        // A new job its queue cannot take (no such queue, its namespace refused) says so in its
        // first status; the scheduling passes keep the head of each queue told.
        if up.inserted
            && row.schedule_state == ScheduleState::Waiting
            && let Some(queues) = self.engine.queues()
            && let Some((
                reason @ (WaitReason::QueueMissing | WaitReason::NamespaceNotAdmitted),
                message,
            )) = crate::queues::blocked(
                &queues,
                &row.queue,
                Some(&row.namespace),
                Default::default(),
            )
            && let Some(r) = self
                .engine
                .store()
                .transition(row.id, &crate::lifecycle::queued(reason, message))?
                .applied()
        {
            row = r;
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
            // Its final status reaches the object before the object goes (a GitOps tool, a
            // `kubectl wait`, a namespace being deleted: each sees how it ended), and its Events
            // before its history does (a job deleted at once by ttlSecondsAfterFinished: 0).
            if row.status_version > row.synced_version {
                self.engine.status_changed.notify_one();
                return Err(Error::CleanupPending(row.id));
            }
            if self.events.is_some() {
                self.publish_events(row.id, &mj.object_ref(&())).await;
            }
            tracing::info!(job_id = row.id, job = %row.key(), "deleted; forgetting the job");
            self.engine.store().delete(row.id)?;
            self.engine.state_dir().forget_job(row.id, row.attempts());
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
}

/// The annotation of the operator's own copy of a ManagedJob (never written back) that keeps
/// who set `spec.suspend` ([`suspend_manager`]) once its managed fields are dropped.
const SUSPEND_MANAGER: &str = "managedjobs.dev/suspend-manager";

/// The annotation of the operator's own copy of a ManagedJob (never written back) that keeps
/// the `metadata.resourceVersion` its watch first saw the object at, across the object's later
/// versions: its creation's when the watch saw it created (its job's place in its queue,
/// `lifecycle::entry`; the operator's own first write, the finalizer, would otherwise give
/// every job the version of a write made in whatever order the reconciles ran).
const FIRST_SEEN_VERSION: &str = "managedjobs.dev/first-seen-resource-version";

/// The resourceVersion at which the watch first saw `mj` ([`FIRST_SEEN_VERSION`]), else its
/// own; `""` when it has none.
fn first_seen_version(mj: &ManagedJob) -> String {
    mj.annotations()
        .get(FIRST_SEEN_VERSION)
        .cloned()
        .or_else(|| mj.resource_version())
        .unwrap_or_default()
}

/// The field manager that set `spec.suspend` (the latest `managedFields` entry owning
/// `f:spec.f:suspend`, e.g. `kubectl-patch`, `kustomize-controller`), if any says so.
fn suspend_manager(mj: &ManagedJob) -> Option<String> {
    mj.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| {
            f.fields_v1
                .as_ref()
                .is_some_and(|v| v.0.get("f:spec").and_then(|s| s.get("f:suspend")).is_some())
        })
        .max_by_key(|f| f.time.as_ref().map(|t| t.0))
        .and_then(|f| f.manager.clone())
}
