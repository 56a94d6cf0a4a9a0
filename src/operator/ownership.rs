//! One owner per job (`docs/design.md#one-owner-per-job`), the operator's side: which
//! namespaces it claims, what it does with its rows when a claim is acquired or lost, and how
//! it says that it leaves a namespace's jobs to another operator.
//!
//! At start ([`claim_at_start`]), before the store is rebuilt or anything is adopted, resumed
//! or admitted: every namespace it may act in is claimed (a namespaced operator's one, a
//! cluster-wide operator's every namespace holding a job of its shard or a row of its store),
//! and the rows of a namespace another operator owns, or whose jobs another operator drove
//! after this store did, are left to it ([`crate::engine::leave_jobs`]). While it runs
//! ([`handle`]): a claim acquired makes the same check and reconciles the namespace's jobs
//! (those its store lacks are restored from their status, their Pods adopted); a claim lost
//! leaves its rows; a claim another operator holds is said once (a log line and an Event
//! regarding the Lease).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use tokio::sync::mpsc::UnboundedReceiver;

use super::claims::{CellState, ClaimConfig, ClaimEvent, Claims};
use super::shared::Operator;
use crate::api::ManagedJob;
use crate::lifecycle::JobRow;
use crate::lifecycle::claim::{self, Timing};
use crate::state_dir::StateDir;
use crate::store::Store;

/// How long the start waits for every claim it wants to be decided (held, or seen held by
/// another operator).
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a cluster-wide operator recomputes the namespaces it wants to claim.
pub const WANTED_PERIOD: Duration = Duration::from_secs(5);

/// The first part of this instance's holder identity: `$POD_NAME` in a cluster, else the host
/// name.
pub fn instance_name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "managed-jobs".into())
        })
}

/// The owner and epoch each object's status was written under, by uid.
type Written = HashMap<String, (Option<String>, Option<i64>)>;

fn written(objects: &[Arc<ManagedJob>]) -> Written {
    objects
        .iter()
        .filter_map(|mj| {
            let status = mj.status.as_ref();
            Some((
                mj.uid()?,
                (
                    status.and_then(|s| s.owner.clone()),
                    status.and_then(|s| s.owner_epoch),
                ),
            ))
        })
        .collect()
}

/// Of `rows`, those another operator drove after this store did ([`claim::row_is_stale`]).
fn stale(rows: Vec<JobRow>, written: &Written, me: &str, previous: Option<i64>) -> Vec<JobRow> {
    rows.into_iter()
        .filter(|row| {
            let (owner, epoch) = written.get(&row.uid).cloned().unwrap_or_default();
            claim::row_is_stale(epoch, owner.as_deref(), me, previous)
        })
        .collect()
}

/// At start, before the store is rebuilt or the engine starts: claims every namespace this
/// operator may act in and waits until each is decided, then leaves the rows of namespaces
/// another operator owns, and the rows another operator drove after this store did, to them.
/// Returns the claims (and their later events, for [`handle`]).
///
/// Errors: the store, the API, or a claim that cannot be read or taken within
/// [`SETTLE_TIMEOUT`] (e.g. no permission on Leases: the message says which).
pub async fn claim_at_start(
    client: &Client,
    dir: &StateDir,
    namespace: Option<&str>,
    shard: Option<&str>,
    timing: Timing,
    cancel_grace: Duration,
) -> anyhow::Result<(Arc<Claims>, UnboundedReceiver<ClaimEvent>)> {
    let mut store = Store::open(&dir.store(), 1024)?;
    crate::engine::claim_for_shard(&mut store, dir.root(), shard)?;
    let name = claim::instance_name(&instance_name(), &dir.root().to_string_lossy());
    if store.job_count()? == 0 && store.claims()?.is_empty() {
        // A fresh or lost store: the claims its predecessor here held are its own.
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> = match namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let listed = leases
            .list(&ListParams::default().labels(&format!("{}=true", claim::LEASE_LABEL)))
            .await?;
        let lease_name = claim::lease_name(shard);
        let holders: Vec<String> = listed
            .items
            .into_iter()
            .filter(|l| l.metadata.name.as_deref() == Some(lease_name.as_str()))
            .filter_map(|l| l.spec?.holder_identity)
            .collect();
        if let Some(id) = claim::successor_store(&name, holders.iter().map(String::as_str)) {
            tracing::info!(store = %id, "this store is new here: it succeeds the claims its predecessor at this host and state dir held");
            store.set_instance_id(&id)?;
        }
    }
    let identity = claim::identity(&name, &store.instance_id()?);
    let (claims, mut events) = Claims::start(
        client.clone(),
        ClaimConfig {
            identity: identity.clone(),
            shard: shard.map(str::to_string),
            namespace: namespace.map(str::to_string),
            timing,
        },
        &dir.store(),
    )?;
    let api: Api<ManagedJob> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let objects: Vec<Arc<ManagedJob>> = api
        .list(&ListParams::default().labels(&crate::api::shard_selector(shard)))
        .await?
        .items
        .into_iter()
        .map(Arc::new)
        .collect();
    let mut wanted: HashSet<String> = match namespace {
        Some(ns) => HashSet::from([ns.to_string()]),
        None => objects.iter().filter_map(|o| o.namespace()).collect(),
    };
    if namespace.is_none() {
        wanted.extend(store.namespaces()?);
    }
    for mj in &objects {
        if let (Some(ns), Some(epoch)) = (
            mj.namespace(),
            mj.status.as_ref().and_then(|s| s.owner_epoch),
        ) {
            claims.raise_floor(&ns, epoch);
        }
    }
    for ns in &wanted {
        claims.want(ns);
    }
    tracing::info!(
        identity = %identity,
        namespaces = wanted.len(),
        lease = %claims.lease_name(),
        "claiming the namespaces this operator may act in (one owner per job)"
    );
    claims.settle(SETTLE_TIMEOUT).await?;
    let written = written(&objects);
    while let Ok(event) = events.try_recv() {
        match event {
            ClaimEvent::Acquired {
                namespace,
                epoch,
                previous,
            } => {
                let rows = store.in_namespace(&namespace)?;
                let stale = stale(rows, &written, &identity, previous);
                if !stale.is_empty() {
                    crate::engine::leave_jobs(
                        dir,
                        &mut store,
                        stale,
                        cancel_grace,
                        "another operator drove it after this store did (its status was written under a later claim); it is rebuilt from its status",
                    );
                }
                claims.prepared(&namespace, epoch);
            }
            ClaimEvent::HeldElsewhere { namespace, holder }
            | ClaimEvent::Lost {
                namespace,
                holder: Some(holder),
            } => {
                say_elsewhere(&namespace, &holder, claims.lease_name());
                let rows = store.in_namespace(&namespace)?;
                if !rows.is_empty() {
                    crate::engine::leave_jobs(
                        dir,
                        &mut store,
                        rows,
                        cancel_grace,
                        &format!("operator {holder} owns the jobs of namespace {namespace}"),
                    );
                }
            }
            ClaimEvent::Lost { .. } | ClaimEvent::Resumed { .. } => {}
        }
    }
    Ok((claims, events))
}

fn say_elsewhere(namespace: &str, holder: &str, lease: &str) {
    tracing::warn!(
        namespace,
        owner = holder,
        lease = %format!("{namespace}/{lease}"),
        "operator {holder} owns the jobs of namespace {namespace} (it holds the Lease {namespace}/{lease}): this operator leaves them alone, and takes them over if that claim lapses"
    );
}

/// Carries out the claim events while the operator runs (see the module documentation), and
/// keeps a cluster-wide operator's wanted namespaces up to date. `reconcile_all` asks for a
/// reconcile of every object (a namespace's jobs to act on again).
pub(super) async fn handle(
    op: Arc<Operator>,
    mut events: UnboundedReceiver<ClaimEvent>,
    reconcile_all: futures::channel::mpsc::UnboundedSender<()>,
    objects_listed: Arc<std::sync::atomic::AtomicBool>,
) {
    // The claims found held elsewhere at start were logged then; their Events go out now.
    for (namespace, holder) in op.claims.elsewhere() {
        op.event_left_to_owner(&namespace, &holder).await;
    }
    let mut wanted_tick = tokio::time::interval(WANTED_PERIOD);
    loop {
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { return };
                on_event(&op, event, &reconcile_all).await;
            }
            _ = wanted_tick.tick() => {
                if op.engine.config().namespace.is_none()
                    && objects_listed.load(std::sync::atomic::Ordering::SeqCst)
                {
                    let mut wanted: HashSet<String> =
                        op.jobs.state().iter().filter_map(|o| o.namespace()).collect();
                    wanted.extend(op.engine.store().namespaces().unwrap_or_default());
                    op.claims.set_wanted(&wanted);
                }
                op.count_claims();
            }
        }
    }
}

async fn on_event(
    op: &Arc<Operator>,
    event: ClaimEvent,
    reconcile_all: &futures::channel::mpsc::UnboundedSender<()>,
) {
    match event {
        ClaimEvent::Acquired {
            namespace,
            epoch,
            previous,
        } => {
            let rows = op
                .engine
                .store()
                .in_namespace(&namespace)
                .unwrap_or_default();
            let stale = stale(
                rows,
                &written(&op.jobs.state()),
                op.claims.identity(),
                previous,
            );
            if !stale.is_empty() {
                op.engine.leave(
                    stale,
                    "another operator drove it after this store did (its status was written under a later claim); it is rebuilt from its status",
                );
            }
            op.claims.prepared(&namespace, epoch);
            tracing::info!(namespace = %namespace, epoch, "acting on the jobs of namespace {namespace}: those this store lacks are taken over from their status");
            let _ = reconcile_all.unbounded_send(());
            op.engine.wake_all();
        }
        ClaimEvent::Resumed { .. } => {
            let _ = reconcile_all.unbounded_send(());
            op.engine.wake_all();
        }
        ClaimEvent::Lost { namespace, holder } => {
            let who = holder
                .clone()
                .unwrap_or_else(|| "nobody (the Lease was deleted)".into());
            let n = op.engine.leave_namespace(
                &namespace,
                &format!("this operator lost its claim on namespace {namespace} to {who}"),
            );
            tracing::warn!(namespace = %namespace, owner = %who, jobs = n, "lost the claim on namespace {namespace} to {who}: its {n} jobs are left to it");
            if let Some(holder) = holder {
                op.say_elsewhere(&namespace, &holder).await;
            }
        }
        ClaimEvent::HeldElsewhere { namespace, holder } => {
            let n = op.engine.leave_namespace(
                &namespace,
                &format!("operator {holder} owns the jobs of namespace {namespace}"),
            );
            if n > 0 {
                tracing::warn!(namespace = %namespace, owner = %holder, jobs = n, "left {n} jobs of namespace {namespace} to {holder}");
            }
            op.say_elsewhere(&namespace, &holder).await;
        }
    }
}

impl Operator {
    /// Says that `holder` owns the jobs of `namespace` and this operator leaves them alone: a
    /// log line and a Normal Event `LeftToOwner` regarding the claim's Lease.
    async fn say_elsewhere(&self, namespace: &str, holder: &str) {
        say_elsewhere(namespace, holder, self.claims.lease_name());
        self.event_left_to_owner(namespace, holder).await;
    }

    /// The Normal Event `LeftToOwner` regarding the claim's Lease of `namespace`.
    async fn event_left_to_owner(&self, namespace: &str, holder: &str) {
        let Some(publisher) = &self.events else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            name: Some(self.claims.lease_name().to_string()),
            namespace: Some(namespace.to_string()),
            ..Default::default()
        };
        let event = crate::events::JobEvent {
            type_: crate::events::EventType::Normal,
            reason: "LeftToOwner",
            note: crate::events::truncate(
                &format!(
                    "operator {} leaves the jobs of this namespace to {holder}, which holds this Lease; it takes them over if the claim lapses ({} s without renewal)",
                    self.claims.identity(),
                    self.claims.timing().duration.as_secs()
                ),
                crate::events::MAX_NOTE_BYTES,
            ),
            at_ms: crate::lifecycle::now_ms(),
            transition: None,
        };
        self.budget.for_event().await;
        self.engine.metrics.api_request("create_event");
        if let Err(e) = publisher.publish(&reference, &event).await {
            self.engine.metrics.events_refused_total.inc();
            tracing::debug!(namespace, error = %e, "the API refused a LeftToOwner Event");
        }
    }

    /// Refreshes `managedjobs_claims{state}`.
    fn count_claims(&self) {
        let held = self.claims.held().len() as i64;
        let elsewhere = self.claims.elsewhere().len() as i64;
        let paused = self.claims.paused().len() as i64;
        for (state, n) in [("held", held), ("elsewhere", elsewhere), ("paused", paused)] {
            self.engine
                .metrics
                .claims
                .get_or_create(&crate::metrics::StateLabel {
                    state: state.into(),
                })
                .set(n);
        }
    }

    /// Whether this operator acts on the jobs of `namespace` now (it holds their claim, renewed
    /// lately); a cluster-wide operator seeing a namespace for the first time wants its claim.
    pub(super) fn acts_on(&self, namespace: &str) -> bool {
        match self.claims.state(namespace) {
            CellState::Held(_) => true,
            CellState::Unknown => {
                self.claims.want(namespace);
                false
            }
            CellState::Paused | CellState::Elsewhere(_) => false,
        }
    }

    /// True when another operator holds `namespace`'s claim: its jobs are not this one's to
    /// record (nor to wait for).
    pub(super) fn claimed_elsewhere(&self, namespace: &str) -> bool {
        matches!(self.claims.state(namespace), CellState::Elsewhere(_))
    }
}
