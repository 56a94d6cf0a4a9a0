//! One owner per job (`docs/design.md#one-owner-per-job`): the operator's claims on the
//! namespaces it acts in, each a Lease in that namespace (`lifecycle::claim` decides when to
//! take, renew or leave one; this module reads and writes them).
//!
//! [`Claims`] watches the claim Leases of its scope (label [`claim::LEASE_LABEL`]), and every
//! [`Timing::retry`] (or at once when a Lease changes) carries out [`claim::next_step`] for
//! each namespace it wants: a create, a take or a renewal, each a compare-and-set on the
//! Lease's `resourceVersion`, so that of two instances at most one succeeds. What changed goes
//! to the operator as [`ClaimEvent`]s: a claim acquired (its rows are checked, the namespace's
//! jobs reconciled), lost (its rows are forgotten, its local workloads stopped), held by
//! another instance (it leaves those jobs alone and says so). Each renewal is recorded in the
//! store ([`crate::store::ClaimRow`]), where the job controllers read whether they may launch.
//!
//! Cost: one write per held namespace per [`Timing::renew_every`] (5 s at the default 15 s),
//! one watch of the claim Leases, no polling.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher;
use tokio::sync::{Notify, mpsc};

use crate::lifecycle::claim::{self, Held, LeaseRecord, Seen, Step, Timing};
use crate::lifecycle::now_ms;
use crate::status::Owner;
use crate::store::{ClaimRow, Store};

/// How long a namespace of a cluster-wide operator may go without any job of its shard (no
/// object, no row) before its claim is released (so that its renewals stop).
pub const RELEASE_AFTER: Duration = Duration::from_secs(60);

/// How the operator claims namespaces.
#[derive(Clone, Debug)]
pub struct ClaimConfig {
    /// Its holder identity ([`claim::identity`]: `<pod or host name>/<store id>`).
    pub identity: String,
    /// Its shard (`--shard`; None: the default instance): the Lease's name says it.
    pub shard: Option<String>,
    /// The one namespace it watches (`--namespace`); None: every namespace.
    pub namespace: Option<String>,
    /// The claims' timing (`--lease-duration-seconds`).
    pub timing: Timing,
}

/// What changed about a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimEvent {
    /// This operator now holds the claim on `namespace`, at `epoch`; `previous` is the epoch
    /// its store last held there (None: never). The namespace's jobs are not acted on until
    /// the operator calls [`Claims::prepared`].
    Acquired {
        /// The namespace.
        namespace: String,
        /// The epoch now held.
        epoch: i64,
        /// The epoch the store last held there.
        previous: Option<i64>,
    },
    /// This operator no longer holds the claim on `namespace`: `holder` does (None: nobody, the
    /// Lease was deleted or released).
    Lost {
        /// The namespace.
        namespace: String,
        /// Who holds it now.
        holder: Option<String>,
    },
    /// Another instance, `holder`, holds the claim on `namespace`, which this operator wants:
    /// it leaves those jobs alone (told once per holder).
    HeldElsewhere {
        /// The namespace.
        namespace: String,
        /// The holder.
        holder: String,
    },
    /// The claim on `namespace`, held but not renewed within its renew deadline, was renewed
    /// again: its jobs are acted on again.
    Resumed {
        /// The namespace.
        namespace: String,
    },
}

/// Where this operator stands with a namespace's claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CellState {
    /// It holds the claim and may act on the namespace's jobs, as `Owner`.
    Held(Owner),
    /// It holds the claim but its renewal is overdue (past the renew deadline): it acts on
    /// nothing there until the claim is renewed or seen lost.
    Paused,
    /// Another instance holds the claim.
    Elsewhere(String),
    /// Not known yet (not wanted, not listed, or being taken).
    Unknown,
}

#[derive(Debug)]
struct Cell {
    wanted: bool,
    /// Since when it is not wanted (ms since the epoch).
    unwanted_since_ms: Option<i64>,
    lease: Option<LeaseRecord>,
    acquired: Option<MicroTime>,
    seen: Seen,
    reads_failed: bool,
    held: Option<Held>,
    /// The operator has made the namespace ready for this holding (stale rows forgotten).
    prepared: Option<i64>,
    /// Renewals are overdue (told once).
    paused: bool,
    /// The namespace is being deleted and its Lease went with it: nobody can create one there
    /// any more, so nobody else can own its jobs; the last holder finishes them (cancels them
    /// as the deletion asks, releases their finalizers) without a Lease.
    terminating: bool,
    /// The epoch the store last held, and the highest epoch known.
    previous: Option<i64>,
    floor: i64,
    /// The other holder already told about.
    told: Option<String>,
    busy: bool,
    last_error: Option<String>,
}

impl Cell {
    fn new(previous: Option<i64>, now_ms: i64) -> Cell {
        Cell {
            wanted: false,
            unwanted_since_ms: None,
            lease: None,
            acquired: None,
            seen: claim::unseen(now_ms),
            reads_failed: true,
            held: None,
            prepared: None,
            paused: false,
            terminating: false,
            previous,
            floor: previous.unwrap_or(0),
            told: None,
            busy: false,
            last_error: None,
        }
    }
}

/// The operator's claims. See the module documentation.
pub struct Claims {
    cfg: ClaimConfig,
    lease_name: String,
    client: Client,
    cells: Mutex<HashMap<String, Cell>>,
    /// Every claim Lease of the scope the watch holds, by namespace (a namespace wanted later
    /// starts from what was seen).
    leases: Mutex<HashMap<String, LeaseRecord>>,
    listed: AtomicBool,
    wake: Notify,
    events: mpsc::UnboundedSender<ClaimEvent>,
    store: Mutex<Store>,
    me: std::sync::Weak<Claims>,
}

impl Claims {
    /// Starts the claims of the operator whose store is at `store_path`: the Lease watch and
    /// the loop that takes and renews claims. Nothing is wanted yet ([`Claims::want`]).
    ///
    /// Errors: the store cannot be opened.
    pub fn start(
        client: Client,
        cfg: ClaimConfig,
        store_path: &std::path::Path,
    ) -> anyhow::Result<(Arc<Claims>, mpsc::UnboundedReceiver<ClaimEvent>)> {
        let store = Store::open(store_path, 256)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let claims = Arc::new_cyclic(|me| Claims {
            me: me.clone(),
            lease_name: claim::lease_name(cfg.shard.as_deref()),
            cfg,
            client,
            cells: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
            listed: AtomicBool::new(false),
            wake: Notify::new(),
            events: tx,
            store: Mutex::new(store),
        });
        tokio::spawn(watch(claims.clone()));
        tokio::spawn(run(claims.clone()));
        Ok((claims, rx))
    }

    /// The holder identity.
    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    /// The claims' timing.
    pub fn timing(&self) -> Timing {
        self.cfg.timing
    }

    /// The Lease name of the claims (`managed-jobs-owner[-<shard>]`).
    pub fn lease_name(&self) -> &str {
        &self.lease_name
    }

    fn self_ref(&self) -> std::sync::Weak<Claims> {
        self.me.clone()
    }

    fn cells(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cell>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn cell_for<'a>(&self, cells: &'a mut HashMap<String, Cell>, namespace: &str) -> &'a mut Cell {
        cells.entry(namespace.to_string()).or_insert_with(|| {
            let previous = self
                .store()
                .claim(namespace)
                .ok()
                .flatten()
                .map(|c| c.epoch);
            let mut cell = Cell::new(previous, now_ms());
            if self.listed.load(Ordering::SeqCst) {
                cell.lease = self
                    .leases
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(namespace)
                    .cloned();
                cell.seen = claim::observe(
                    &cell.seen,
                    cell.lease.as_ref().map(|l| l.version.as_str()),
                    true,
                    now_ms(),
                );
                cell.reads_failed = false;
            }
            cell
        })
    }

    /// Wants the claim on `namespace` (idempotent): it is taken when free, renewed while held,
    /// watched while another holds it.
    pub fn want(&self, namespace: &str) {
        let mut cells = self.cells();
        let cell = self.cell_for(&mut cells, namespace);
        let new = !cell.wanted;
        cell.wanted = true;
        cell.unwanted_since_ms = None;
        if new && self.listed.load(Ordering::SeqCst) && !cell.busy {
            // Says at once when another instance holds it.
            let lease = cell.lease.clone();
            self.update(cell, namespace, lease);
        }
        drop(cells);
        if new {
            self.wake.notify_one();
        }
    }

    /// Wants exactly `namespaces` (a cluster-wide operator: the namespaces holding a job of
    /// its shard); a claim no longer wanted is released after [`RELEASE_AFTER`]. The watched
    /// namespace of a namespaced operator is always wanted.
    pub fn set_wanted(&self, namespaces: &HashSet<String>) {
        for ns in namespaces {
            self.want(ns);
        }
        let now = now_ms();
        let mut cells = self.cells();
        for (ns, cell) in cells.iter_mut() {
            if namespaces.contains(ns) || self.cfg.namespace.as_deref() == Some(ns.as_str()) {
                continue;
            }
            if cell.wanted && cell.unwanted_since_ms.is_none() {
                cell.unwanted_since_ms = Some(now);
            }
        }
    }

    /// Raises the highest epoch known for `namespace` (a job's `status.ownerEpoch` seen there):
    /// a claim taken or created there gets an epoch above it.
    pub fn raise_floor(&self, namespace: &str, epoch: i64) {
        let mut cells = self.cells();
        let cell = self.cell_for(&mut cells, namespace);
        cell.floor = cell.floor.max(epoch);
    }

    /// Where this operator stands with `namespace`'s claim at this moment.
    pub fn state(&self, namespace: &str) -> CellState {
        let now = now_ms();
        let cells = self.cells();
        let Some(cell) = cells.get(namespace) else {
            return CellState::Unknown;
        };
        match &cell.held {
            Some(h) if cell.prepared == Some(h.epoch) => {
                if cell.terminating || now < claim::valid_until(h.renewed_ms, &self.cfg.timing) {
                    CellState::Held(Owner {
                        identity: self.cfg.identity.clone(),
                        epoch: h.epoch,
                    })
                } else {
                    CellState::Paused
                }
            }
            Some(_) => CellState::Unknown,
            None => match cell.lease.as_ref().and_then(|l| l.holder()) {
                Some(holder) if !claim::same_holder(holder, &self.cfg.identity) => {
                    CellState::Elsewhere(holder.to_string())
                }
                _ => CellState::Unknown,
            },
        }
    }

    /// The owner to write in the status of a job of `namespace`, while this operator may act
    /// there (None: it may not: another owns the job, or its claim is overdue or unknown).
    pub fn owner(&self, namespace: &str) -> Option<Owner> {
        match self.state(namespace) {
            CellState::Held(owner) => Some(owner),
            _ => None,
        }
    }

    /// The namespaces this operator may act in now.
    pub fn held(&self) -> HashSet<String> {
        let names: Vec<String> = self.cells().keys().cloned().collect();
        names
            .into_iter()
            .filter(|ns| matches!(self.state(ns), CellState::Held(_)))
            .collect()
    }

    /// The namespaces whose claim this operator holds but could not renew in time.
    pub fn paused(&self) -> Vec<String> {
        let names: Vec<String> = self.cells().keys().cloned().collect();
        names
            .into_iter()
            .filter(|ns| self.state(ns) == CellState::Paused)
            .collect()
    }

    /// The namespaces whose claim another instance holds, with their holders.
    pub fn elsewhere(&self) -> Vec<(String, String)> {
        let names: Vec<String> = self.cells().keys().cloned().collect();
        names
            .into_iter()
            .filter_map(|ns| match self.state(&ns) {
                CellState::Elsewhere(holder) => Some((ns, holder)),
                _ => None,
            })
            .collect()
    }

    /// The operator made `namespace` ready for its holding at `epoch` (rows another owner wrote
    /// after it forgotten): its jobs are acted on from now.
    pub fn prepared(&self, namespace: &str, epoch: i64) {
        let mut cells = self.cells();
        if let Some(cell) = cells.get_mut(namespace)
            && cell.held.as_ref().is_some_and(|h| h.epoch == epoch)
        {
            cell.prepared = Some(epoch);
        }
    }

    /// Something suggests the claim on `namespace` changed (the API refused a status as
    /// written under an older claim): it is read again at once.
    pub fn nudge(&self, namespace: &str) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let name = self.lease_name.clone();
        let namespace = namespace.to_string();
        let claims = self.self_ref();
        tokio::spawn(async move {
            let Some(claims) = claims.upgrade() else {
                return;
            };
            if let Ok(lease) = api.get_opt(&name).await {
                let record = lease.as_ref().and_then(|l| claims.record(l)).map(|r| r.1);
                let mut cells = claims.cells();
                if let Some(cell) = cells.get_mut(&namespace)
                    && !cell.busy
                {
                    claims.update(cell, &namespace, record);
                }
            }
            claims.wake.notify_one();
        });
    }

    /// Waits until every wanted claim is decided (held, or seen held by another instance), at
    /// most `timeout`. Errors: some is not, with the last error each met (e.g. no permission on
    /// Leases in its namespace).
    pub async fn settle(&self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let undecided: Vec<String> = {
                let cells = self.cells();
                cells
                    .iter()
                    .filter(|(_, c)| c.wanted)
                    .filter(|(_, c)| {
                        let elsewhere = c
                            .lease
                            .as_ref()
                            .and_then(|l| l.holder())
                            .is_some_and(|h| !claim::same_holder(h, &self.cfg.identity));
                        !self.listed.load(Ordering::SeqCst) || (c.held.is_none() && !elsewhere)
                    })
                    .map(|(ns, c)| match &c.last_error {
                        Some(e) => format!("{ns} ({e})"),
                        None => ns.clone(),
                    })
                    .collect()
            };
            if undecided.is_empty() {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "the claims on these namespaces could not be read or taken within {timeout:?}: {}; \
                     the operator needs get, list, watch, create and update on leases \
                     (coordination.k8s.io) in every namespace it watches",
                    undecided.join(", ")
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn emit(&self, event: ClaimEvent) {
        let _ = self.events.send(event);
    }

    /// What a Lease object says, for a claim: None when it is not one of ours.
    fn record(&self, lease: &Lease) -> Option<(String, LeaseRecord, Option<MicroTime>)> {
        if lease.metadata.name.as_deref() != Some(self.lease_name.as_str()) {
            return None;
        }
        let ns = lease.metadata.namespace.clone()?;
        let spec = lease.spec.clone().unwrap_or_default();
        Some((
            ns,
            LeaseRecord {
                holder: spec.holder_identity,
                epoch: i64::from(spec.lease_transitions.unwrap_or(0)),
                version: lease.metadata.resource_version.clone().unwrap_or_default(),
            },
            spec.acquire_time,
        ))
    }

    /// A cell's Lease as now known (a watch event, a write's response, a read): updates what
    /// was seen, and finds a loss.
    fn update(&self, cell: &mut Cell, namespace: &str, lease: Option<LeaseRecord>) {
        let now = now_ms();
        cell.seen = claim::observe(
            &cell.seen,
            lease.as_ref().map(|l| l.version.as_str()),
            cell.reads_failed,
            now,
        );
        cell.reads_failed = false;
        if let Some(l) = &lease {
            cell.floor = cell.floor.max(l.epoch);
        }
        let ours = lease
            .as_ref()
            .and_then(|l| l.holder())
            .is_some_and(|h| claim::same_holder(h, &self.cfg.identity));
        // A Lease deleted while held is no loss yet: it is created again at once (if another
        // instance creates it first, that is seen then), or, in a namespace being deleted,
        // cannot be created by anyone (see `terminating`).
        if cell.held.is_some() && !ours && !cell.busy && lease.is_some() {
            let holder = lease.as_ref().and_then(|l| l.holder()).map(str::to_string);
            cell.held = None;
            cell.prepared = None;
            cell.paused = false;
            self.record_in_store(namespace, cell, None);
            self.emit(ClaimEvent::Lost {
                namespace: namespace.to_string(),
                holder,
            });
        }
        cell.lease = lease;
        if cell.wanted
            && cell.held.is_none()
            && let Some(holder) = cell.lease.as_ref().and_then(|l| l.holder())
            && !claim::same_holder(holder, &self.cfg.identity)
            && cell.told.as_deref() != Some(holder)
        {
            cell.told = Some(holder.to_string());
            self.emit(ClaimEvent::HeldElsewhere {
                namespace: namespace.to_string(),
                holder: holder.to_string(),
            });
        }
    }

    fn record_in_store(&self, namespace: &str, cell: &Cell, renewed_at_ms: Option<i64>) {
        let Some(epoch) = cell.held.as_ref().map(|h| h.epoch).or(cell.previous) else {
            return;
        };
        let row = ClaimRow {
            namespace: namespace.to_string(),
            holder: self.cfg.identity.clone(),
            epoch,
            renewed_at_ms,
            duration_ms: self.cfg.timing.duration.as_millis() as i64,
        };
        if let Err(e) = self.store().set_claim(&row) {
            tracing::error!(namespace, error = %e, "recording the claim in the store failed; its job controllers launch nothing meanwhile");
        }
    }

    fn lease_object(
        &self,
        namespace: &str,
        epoch: i64,
        version: Option<String>,
        acquired: MicroTime,
        now: MicroTime,
    ) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(self.lease_name.clone()),
                namespace: Some(namespace.to_string()),
                resource_version: version,
                labels: Some(
                    [
                        (claim::LEASE_LABEL.to_string(), "true".to_string()),
                        (
                            "app.kubernetes.io/managed-by".to_string(),
                            "managed-jobs".to_string(),
                        ),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.cfg.identity.clone()),
                lease_duration_seconds: Some(self.cfg.timing.duration.as_secs().max(1) as i32),
                acquire_time: Some(acquired),
                renew_time: Some(now),
                lease_transitions: Some(epoch.clamp(0, i64::from(i32::MAX)) as i32),
                ..Default::default()
            }),
        }
    }

    /// Carries out `step` for `namespace`.
    async fn execute(&self, namespace: String, step: Step) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &namespace);
        let started = now_ms();
        // A request the API has not answered within a renewal period is abandoned and tried
        // again: one hung request must not hold up every namespace's renewal (the renew loop
        // waits for all of them) until the renew deadline passes.
        let limit = self.cfg.timing.renew_every;
        let now = MicroTime(jiff::Timestamp::now());
        let (epoch, result) = match &step {
            Step::Create { epoch } => (
                *epoch,
                bounded(
                    limit,
                    api.create(
                        &PostParams::default(),
                        &self.lease_object(&namespace, *epoch, None, now.clone(), now.clone()),
                    ),
                )
                .await,
            ),
            Step::Take { epoch, version } => (
                *epoch,
                bounded(
                    limit,
                    api.replace(
                        &self.lease_name,
                        &PostParams::default(),
                        &self.lease_object(
                            &namespace,
                            *epoch,
                            Some(version.clone()),
                            now.clone(),
                            now.clone(),
                        ),
                    ),
                )
                .await,
            ),
            Step::Renew { epoch, version } => {
                let acquired = self
                    .cells()
                    .get(&namespace)
                    .and_then(|c| c.acquired.clone())
                    .unwrap_or_else(|| now.clone());
                (
                    *epoch,
                    bounded(
                        limit,
                        api.replace(
                            &self.lease_name,
                            &PostParams::default(),
                            &self.lease_object(
                                &namespace,
                                *epoch,
                                Some(version.clone()),
                                acquired,
                                now.clone(),
                            ),
                        ),
                    )
                    .await,
                )
            }
            Step::Wait { .. } => return,
        };
        let fresh = match &result {
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                // Someone else wrote it first (or it is gone): read what it holds now.
                Some(api.get_opt(&self.lease_name).await)
            }
            _ => None,
        };
        let mut cells = self.cells();
        let Some(cell) = cells.get_mut(&namespace) else {
            return;
        };
        cell.busy = false;
        match result {
            Ok(lease) => {
                let Some((_, record, acquired)) = self.record(&lease) else {
                    return;
                };
                let newly = cell.held.as_ref().is_none_or(|h| h.epoch != epoch);
                // Past its renew deadline the claim read as paused ([`Claims::state`]: jobs
                // reconciled meanwhile were left for later) even when this pass's tick had not
                // flagged it yet: a renewal that comes after the deadline resumes it either way,
                // or a job created in that gap would wait for a change that never comes.
                let lapsed = cell.held.as_ref().is_some_and(|h| {
                    !cell.terminating
                        && now_ms() >= claim::valid_until(h.renewed_ms, &self.cfg.timing)
                });
                cell.held = Some(Held {
                    epoch,
                    renewed_ms: started,
                });
                cell.acquired = acquired;
                cell.last_error = None;
                cell.told = None;
                self.update(cell, &namespace, Some(record));
                self.record_in_store(&namespace, cell, Some(started));
                if newly {
                    tracing::info!(
                        namespace = %namespace,
                        epoch,
                        lease = %self.lease_name,
                        "claimed the jobs of namespace {namespace}: this operator owns them now"
                    );
                    self.announce_acquired(cell, &namespace, epoch);
                } else if cell.paused || lapsed {
                    cell.paused = false;
                    tracing::info!(namespace = %namespace, "the claim on namespace {namespace} is renewed again: acting on its jobs again");
                    self.emit(ClaimEvent::Resumed {
                        namespace: namespace.clone(),
                    });
                }
            }
            Err(kube::Error::Api(r))
                if matches!(step, Step::Create { .. })
                    && r.code == 403
                    && r.message.contains("being terminated") =>
            {
                // Create is tried only where no Lease is seen: nobody holds the claim, and
                // nobody can make one any more. The last owner finishes the namespace's jobs
                // (cancels them as the deletion asks, releases their finalizers); when it is
                // gone (an operator uninstalled before its namespace finished deleting), the
                // operator that finds it so does, or the namespace would never go.
                if cell.held.is_none() {
                    tracing::info!(namespace = %namespace, "namespace {namespace} is being deleted and nobody holds its claim (nobody can any more): this operator finishes its jobs");
                    cell.held = Some(Held {
                        epoch,
                        renewed_ms: started,
                    });
                    cell.last_error = None;
                    self.announce_acquired(cell, &namespace, epoch);
                } else if !cell.terminating {
                    tracing::info!(namespace = %namespace, "namespace {namespace} is being deleted and its claim's Lease with it: nobody can claim it any more, so this operator, its last owner, finishes its jobs");
                }
                cell.terminating = true;
                self.record_in_store(&namespace, cell, Some(started));
            }
            Err(e) => {
                let message = match &e {
                    kube::Error::Api(r) => format!("{} ({})", r.message, r.code),
                    e => e.to_string(),
                };
                if cell.last_error.as_deref() != Some(message.as_str()) {
                    tracing::warn!(namespace = %namespace, error = %message, step = ?step, "a claim's Lease could not be written; trying again");
                }
                cell.last_error = Some(message);
                match fresh {
                    Some(Ok(lease)) => {
                        let record = lease.as_ref().and_then(|l| self.record(l)).map(|r| r.1);
                        cell.reads_failed = true;
                        self.update(cell, &namespace, record);
                    }
                    Some(Err(_)) | None => cell.reads_failed = true,
                }
            }
        }
    }

    /// One pass over the wanted claims: the steps due are carried out at once (concurrently);
    /// returns when the next one is due (ms since the epoch).
    async fn tick(self: &Arc<Self>) -> i64 {
        let t = self.cfg.timing;
        let now = now_ms();
        let mut next = now + t.retry.as_millis() as i64;
        if !self.listed.load(Ordering::SeqCst) {
            return next;
        }
        let mut todo = Vec::new();
        let mut releases = Vec::new();
        {
            let mut cells = self.cells();
            for (ns, cell) in cells.iter_mut() {
                if cell.busy {
                    continue;
                }
                if cell.terminating {
                    // No Lease can be made there: the last holder goes on acting on its own
                    // word, and its job controllers on its store's.
                    if let Some(h) = cell.held.as_mut() {
                        h.renewed_ms = now;
                    }
                    self.record_in_store(ns, cell, Some(now));
                    continue;
                }
                if let Some(h) = &cell.held
                    && !cell.paused
                    && now >= claim::valid_until(h.renewed_ms, &t)
                {
                    cell.paused = true;
                    tracing::warn!(namespace = %ns, "the claim on namespace {ns} could not be renewed for {:?}: acting on none of its jobs until it is (its job controllers launch nothing; its local workloads are stopped once it lapses)", t.renew_deadline);
                }
                if cell
                    .unwanted_since_ms
                    .is_some_and(|since| now - since >= RELEASE_AFTER.as_millis() as i64)
                {
                    cell.wanted = false;
                    if cell.held.is_some()
                        && let Some(l) = &cell.lease
                    {
                        releases.push((ns.clone(), l.version.clone(), l.epoch));
                    }
                    continue;
                }
                if !cell.wanted {
                    continue;
                }
                match claim::next_step(
                    cell.lease.as_ref(),
                    &cell.seen,
                    cell.held.as_ref(),
                    &self.cfg.identity,
                    cell.floor,
                    now,
                    &t,
                ) {
                    Step::Wait { until_ms } => next = next.min(until_ms.max(now + 50)),
                    step => {
                        cell.busy = true;
                        todo.push((ns.clone(), step));
                    }
                }
            }
        }
        let runs = todo.into_iter().map(|(ns, step)| self.execute(ns, step));
        futures::future::join_all(runs).await;
        for (ns, version, epoch) in releases {
            self.release(&ns, version, epoch).await;
        }
        next
    }

    /// The claim on `namespace` is this operator's now, at `epoch`: remembered as the store's
    /// latest, and told ([`ClaimEvent::Acquired`], with the epoch held before) so that the
    /// namespace's jobs are reconciled.
    fn announce_acquired(&self, cell: &mut Cell, namespace: &str, epoch: i64) {
        let previous = cell.previous.replace(epoch);
        self.emit(ClaimEvent::Acquired {
            namespace: namespace.to_string(),
            epoch,
            previous,
        });
    }

    /// Releases the claim on `namespace` (no job of the shard there any more): nobody holds it,
    /// so another instance may take it at once.
    async fn release(&self, namespace: &str, version: String, epoch: i64) {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), namespace);
        let now = MicroTime(jiff::Timestamp::now());
        let mut lease = self.lease_object(namespace, epoch, Some(version), now.clone(), now);
        if let Some(spec) = &mut lease.spec {
            spec.holder_identity = None;
            spec.acquire_time = None;
            spec.renew_time = None;
        }
        let result = api
            .replace(&self.lease_name, &PostParams::default(), &lease)
            .await;
        let mut cells = self.cells();
        if let Some(cell) = cells.get_mut(namespace) {
            cell.held = None;
            cell.prepared = None;
            self.record_in_store(namespace, cell, None);
        }
        cells.remove(namespace);
        match result {
            Ok(_) => tracing::info!(
                namespace,
                "released the claim on namespace {namespace}: no job of this shard is there any more"
            ),
            Err(e) => {
                tracing::debug!(namespace, error = %e, "releasing a claim failed; it lapses on its own")
            }
        }
    }
}

/// `request`, abandoned after `limit` (a failed try, as client-go's leader election bounds each
/// try by its renew deadline): an abandoned write may still have been applied, which the next
/// try's compare-and-set finds (409, then the Lease is read again).
async fn bounded<T>(
    limit: Duration,
    request: impl std::future::Future<Output = kube::Result<T>>,
) -> kube::Result<T> {
    match tokio::time::timeout(limit, request).await {
        Ok(result) => result,
        Err(_) => Err(kube::Error::Service(
            format!("the API did not answer within {:.1} s", limit.as_secs_f64()).into(),
        )),
    }
}

/// The loop that takes and renews claims.
async fn run(claims: Arc<Claims>) {
    loop {
        let next = claims.tick().await;
        let wait = Duration::from_millis((next - now_ms()).max(10) as u64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = claims.wake.notified() => {}
        }
    }
}

/// The watch of the claim Leases of the scope: every change updates what was seen; a failure
/// makes every claim's clock start again at the next list (a claim is never taken on the
/// strength of time its taker could not see).
async fn watch(claims: Arc<Claims>) {
    use watcher::Event;
    let api: Api<Lease> = match &claims.cfg.namespace {
        Some(ns) => Api::namespaced(claims.client.clone(), ns),
        None => Api::all(claims.client.clone()),
    };
    let cfg = watcher::Config::default().labels(&format!("{}=true", claim::LEASE_LABEL));
    let mut stream = super::retry::relisting_watch(api, cfg);
    let mut relisted: HashMap<String, LeaseRecord> = HashMap::new();
    let mut health = super::retry::WatchHealth::new("claim Lease");
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => relisted.clear(),
            Ok(Event::InitApply(lease)) => {
                if let Some((ns, record, _)) = claims.record(&lease) {
                    relisted.insert(ns, record);
                }
            }
            Ok(Event::InitDone) => {
                *claims.leases.lock().unwrap_or_else(|e| e.into_inner()) = relisted.clone();
                {
                    let mut cells = claims.cells();
                    let names: Vec<String> = cells.keys().cloned().collect();
                    for ns in names {
                        let cell = cells.get_mut(&ns).expect("listed");
                        cell.reads_failed = true;
                        claims.update(cell, &ns, relisted.get(&ns).cloned());
                    }
                }
                claims.listed.store(true, Ordering::SeqCst);
                claims.wake.notify_one();
                health.listed(None);
            }
            Ok(Event::Apply(lease)) => {
                if let Some((ns, record, acquired)) = claims.record(&lease) {
                    claims
                        .leases
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(ns.clone(), record.clone());
                    let mut cells = claims.cells();
                    if let Some(cell) = cells.get_mut(&ns) {
                        if cell.held.is_some() {
                            cell.acquired = acquired.or(cell.acquired.clone());
                        }
                        claims.update(cell, &ns, Some(record));
                    }
                    drop(cells);
                    claims.wake.notify_one();
                }
            }
            Ok(Event::Delete(lease)) => {
                if let Some((ns, _, _)) = claims.record(&lease) {
                    claims
                        .leases
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&ns);
                    let mut cells = claims.cells();
                    if let Some(cell) = cells.get_mut(&ns) {
                        claims.update(cell, &ns, None);
                    }
                    drop(cells);
                    claims.wake.notify_one();
                }
            }
            Err(e) => {
                health.failed(&e);
                for cell in claims.cells().values_mut() {
                    cell.reads_failed = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request the API never answers is a failed try after `limit`, saying so; one that
    /// answers in time is its answer.
    #[tokio::test]
    async fn a_hung_request_is_a_failed_try_after_its_limit() {
        let limit = Duration::from_millis(100);
        let started = std::time::Instant::now();
        let hung = bounded(limit, std::future::pending::<kube::Result<()>>()).await;
        assert!(started.elapsed() >= limit);
        let err = hung.expect_err("abandoned");
        assert!(
            err.to_string().contains("did not answer within 0.1 s"),
            "{err}"
        );
        assert_eq!(bounded(limit, async { Ok(7) }).await.unwrap(), 7);
    }
}
