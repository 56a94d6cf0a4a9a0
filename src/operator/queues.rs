//! Queues for teams, the Kubernetes side (`docs/design.md#queues`): watches the
//! ManagedJobQueues and the Namespaces, hands the engine the queues in force
//! ([`crate::queues::Queues::resolve`]; nothing is admitted before both lists arrived), and
//! writes each queue's status at a bounded rate ([`QUEUE_STATUS_PERIOD`]).
//!
//! A queue's status is applied with server-side apply: the default instance (no `--shard`, every
//! namespace) owns the top-level counts, and every instance owns its own entry of
//! `status.shards[]` (a list map keyed by `shard`), so shards never overwrite each other.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, reflector, watcher};
use serde_json::json;

use super::shared::Operator;
use crate::api::{ManagedJobPool, ManagedJobQueue, ManagedJobQueueStatus, QueueShardStatus};
use crate::capacity::Caps;
use crate::defaults::QUEUE_STATUS_PERIOD;
use crate::queues::Queues;
use crate::store::QueueCounts;

/// The name of the queue CRD, as `kubectl get crd` names it.
pub const QUEUE_CRD_NAME: &str = "managedjobqueues.managedjobs.dev";

/// What the operator knows of the queues: the watched objects and namespaces.
#[derive(Clone)]
pub struct QueueWatch {
    queues: reflector::Store<ManagedJobQueue>,
    namespaces: reflector::Store<Namespace>,
    /// The ManagedJobPools the queues' `pools` name (none while their API is not served).
    pools: reflector::Store<ManagedJobPool>,
    /// The queue API is not served (its CRD is not installed): no queue objects.
    queue_api_missing: Arc<AtomicBool>,
}

impl QueueWatch {
    /// The queue objects now (none while their API is not served).
    pub fn objects(&self) -> Vec<Arc<ManagedJobQueue>> {
        if self.queue_api_missing.load(Ordering::SeqCst) {
            return Vec::new();
        }
        self.queues.state()
    }

    /// The queues in force now.
    pub fn resolve(&self) -> Queues {
        let namespaces: BTreeMap<String, BTreeMap<String, String>> = self
            .namespaces
            .state()
            .iter()
            .map(|ns| (ns.name_any(), ns.labels().clone()))
            .collect();
        let objects: Vec<ManagedJobQueue> = self.objects().iter().map(|q| (**q).clone()).collect();
        let pools: Vec<ManagedJobPool> = self.pools.state().iter().map(|p| (**p).clone()).collect();
        Queues::resolve(&objects, &namespaces, &pools)
    }
}

/// Starts the two watches (the queues; the namespaces, only `namespace` when the operator is
/// scoped to one) and the task that hands the engine the queues in force after every change,
/// once both were listed. Returns what they see.
pub fn start(op: Arc<Operator>, namespace: Option<String>) -> QueueWatch {
    let (queue_reader, queue_writer) = reflector::store::<ManagedJobQueue>();
    let (ns_reader, ns_writer) = reflector::store::<Namespace>();
    let (pool_reader, pool_writer) = reflector::store::<ManagedJobPool>();
    let watch = QueueWatch {
        queues: queue_reader,
        namespaces: ns_reader,
        pools: pool_reader,
        queue_api_missing: Arc::default(),
    };
    let changed = Arc::new(tokio::sync::Notify::new());
    let queues_listed = Arc::new(AtomicBool::new(false));
    let namespaces_listed = Arc::new(AtomicBool::new(false));

    let api: Api<ManagedJobQueue> = Api::all(op.client.clone());
    let (listed, missing, notify, metrics) = (
        queues_listed.clone(),
        watch.queue_api_missing.clone(),
        changed.clone(),
        op.engine.metrics.clone(),
    );
    let mut queue_health = super::retry::WatchHealth::new("ManagedJobQueue");
    tokio::spawn(
        super::retry::relisting_watch(api, watcher::Config::default().any_semantic())
            .modify(|q: &mut ManagedJobQueue| q.managed_fields_mut().clear())
            .reflect(queue_writer)
            .for_each(move |event| {
                match &event {
                    Ok(watcher::Event::InitDone) => {
                        missing.store(false, Ordering::SeqCst);
                        listed.store(true, Ordering::SeqCst);
                        metrics.set_problem("queues", None);
                        queue_health.listed(Some(&metrics));
                    }
                    Ok(_) => {}
                    Err(e) if watch_not_found(e) => {
                        // No queue CRD: no queue objects (one pool), as before queues existed.
                        if !missing.swap(true, Ordering::SeqCst) {
                            tracing::warn!(
                                "the ManagedJobQueue API is not served (CRD {QUEUE_CRD_NAME} not installed): no queues, every job in one pool; install it with `kubectl apply -f crds/`"
                            );
                        }
                        listed.store(true, Ordering::SeqCst);
                    }
                    Err(e) => {
                        queue_health.failed(e);
                        if !listed.load(Ordering::SeqCst) {
                            metrics.set_problem(
                                "queues",
                                Some(format!("the ManagedJobQueues cannot be listed ({e}): no job is admitted until they are")),
                            );
                        }
                    }
                }
                notify.notify_one();
                async {}
            }),
    );

    let namespaces: Api<Namespace> = Api::all(op.client.clone());
    let config = match &namespace {
        Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
        None => watcher::Config::default(),
    };
    let (listed, notify) = (namespaces_listed.clone(), changed.clone());
    let mut ns_health = super::retry::WatchHealth::new("Namespace");
    let ns_metrics = op.engine.metrics.clone();
    tokio::spawn(
        super::retry::relisting_watch(namespaces, config.any_semantic())
            .modify(|ns: &mut Namespace| {
                ns.managed_fields_mut().clear();
                ns.annotations_mut().clear();
                ns.spec = None;
                ns.status = None;
            })
            .reflect(ns_writer)
            .for_each(move |event| {
                match &event {
                    Ok(watcher::Event::InitDone) => {
                        listed.store(true, Ordering::SeqCst);
                        ns_health.listed(Some(&ns_metrics));
                    }
                    Ok(_) => {}
                    Err(e) => ns_health.failed(e),
                }
                notify.notify_one();
                async {}
            }),
    );

    // The pools: a queue naming one that does not exist (or whose API is not served) admits
    // nothing onto it, and its jobs say so; the queues are not held back for them.
    let pools: Api<ManagedJobPool> = Api::all(op.client.clone());
    let notify = changed.clone();
    let mut pool_health = super::retry::WatchHealth::new("ManagedJobPool");
    let mut pool_api_missing = false;
    tokio::spawn(
        super::retry::relisting_watch(pools, watcher::Config::default().any_semantic())
            .modify(|p: &mut ManagedJobPool| p.managed_fields_mut().clear())
            .reflect(pool_writer)
            .for_each(move |event| {
                match &event {
                    Ok(watcher::Event::InitDone) => {
                        pool_health.listed(None);
                    }
                    Ok(_) => {}
                    Err(e) if watch_not_found(e) => {
                        if !std::mem::replace(&mut pool_api_missing, true) {
                            tracing::info!(
                                "the ManagedJobPool API is not served: no pools (a queue naming one admits nothing onto it); install its CRD with `kubectl apply -f crds/`"
                            );
                        }
                    }
                    Err(e) => pool_health.failed(e),
                }
                notify.notify_one();
                async {}
            }),
    );

    let resolver = watch.clone();
    tokio::spawn(async move {
        loop {
            changed.notified().await;
            if queues_listed.load(Ordering::SeqCst) && namespaces_listed.load(Ordering::SeqCst) {
                op.engine.set_queues(resolver.resolve());
            }
        }
    });
    watch
}

fn watch_not_found(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => matches!(e, kube::Error::Api(r) if r.code == 404),
        watcher::Error::WatchError(r) => r.code == 404,
        _ => false,
    }
}

/// `75%`: `held` run slots of `run_cap`, as a percentage rounded down.
pub fn share(held: usize, run_cap: usize) -> String {
    format!("{}%", held * 100 / run_cap.max(1))
}

/// The status this instance shows of a queue: its own entry of `status.shards[]` (`instance`
/// names it), and for the default instance (`owns_top`) the top-level counts too.
pub fn queue_status(
    counts: QueueCounts,
    caps: Caps,
    instance: &str,
    owns_top: bool,
    generation: Option<i64>,
) -> ManagedJobQueueStatus {
    let entry = QueueShardStatus {
        shard: instance.to_string(),
        waiting: counts.waiting as i64,
        launching: counts.load.launching as i64,
        running: counts.load.alive as i64,
        share: Some(share(counts.load.alive, caps.run)),
        pools: Vec::new(),
    };
    if owns_top {
        ManagedJobQueueStatus {
            waiting: entry.waiting,
            launching: entry.launching,
            running: entry.running,
            share: entry.share.clone(),
            observed_generation: generation,
            shards: vec![entry],
            pools: Vec::new(),
        }
    } else {
        ManagedJobQueueStatus {
            shards: vec![entry],
            ..Default::default()
        }
    }
}

/// The server-side apply body of `status` (only the fields this instance owns).
fn apply_body(status: &ManagedJobQueueStatus, owns_top: bool) -> serde_json::Value {
    let shards = serde_json::to_value(&status.shards).expect("serializes");
    let body = if owns_top {
        json!({
            "waiting": status.waiting,
            "launching": status.launching,
            "running": status.running,
            "share": status.share,
            "observedGeneration": status.observed_generation,
            "shards": shards,
            "pools": status.pools,
        })
    } else {
        json!({ "shards": shards })
    };
    json!({
        "apiVersion": "managedjobs.dev/v1alpha1",
        "kind": "ManagedJobQueue",
        "status": body,
    })
}

/// Writes each queue's status every [`QUEUE_STATUS_PERIOD`], when it changed: at most one API
/// write per queue per period, with what the API budget leaves after the jobs' status writes.
pub async fn status_loop(op: Arc<Operator>, watch: QueueWatch) {
    let cfg = op.engine.config();
    let instance = match (&cfg.shard, &cfg.namespace) {
        (None, None) => "default".to_string(),
        (Some(s), None) => s.clone(),
        (None, Some(ns)) => format!("default@{ns}"),
        (Some(s), Some(ns)) => format!("{s}@{ns}"),
    };
    let owns_top = cfg.shard.is_none() && cfg.namespace.is_none();
    let manager = format!("managed-jobs-{instance}").replace('@', "-");
    let caps = cfg.capacity.caps;
    let api: Api<ManagedJobQueue> = Api::all(op.client.clone());
    let mut written: HashMap<String, ManagedJobQueueStatus> = HashMap::new();
    let mut written_pools: HashMap<String, crate::api::ManagedJobPoolStatus> = HashMap::new();
    loop {
        tokio::time::sleep(QUEUE_STATUS_PERIOD).await;
        let objects = watch.objects();
        if objects.is_empty() {
            continue;
        }
        let counts = match op.engine.store().queue_counts() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "reading the queues' counts failed");
                continue;
            }
        };
        // The queues' quotas with what this instance's jobs use.
        let ledger = match op.engine.queues() {
            Some(queues) if queues.any_quotas() => match op.engine.store().quota_usage() {
                Ok(usage) => Some(crate::resources::quota::Ledger::new(queues.quotas(), usage)),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the queues' quota usage failed");
                    None
                }
            },
            _ => None,
        };
        for q in objects {
            let name = q.name_any();
            let c = counts.get(&name).copied().unwrap_or_default();
            let mut status = queue_status(c, caps, &instance, owns_top, q.metadata.generation);
            if let Some(ledger) = &ledger {
                let pools = ledger.pool_usage(&name);
                if owns_top {
                    status.pools = pools;
                } else if let Some(entry) = status.shards.first_mut() {
                    entry.pools = pools;
                }
            }
            // Already shown (by us, or still there from before a restart).
            let shown = q.status.as_ref().is_some_and(|s| {
                s.shards.iter().any(|e| Some(e) == status.shards.first())
                    && (!owns_top
                        || (
                            s.waiting,
                            s.launching,
                            s.running,
                            &s.share,
                            s.observed_generation,
                            &s.pools,
                        ) == (
                            status.waiting,
                            status.launching,
                            status.running,
                            &status.share,
                            status.observed_generation,
                            &status.pools,
                        ))
            });
            if written.get(&name) == Some(&status) || shown {
                continue;
            }
            op.budget.for_event().await;
            op.engine.metrics.api_request("patch");
            let params = PatchParams::apply(&manager).force();
            match api
                .patch_status(&name, &params, &Patch::Apply(apply_body(&status, owns_top)))
                .await
            {
                Ok(_) => {
                    written.insert(name, status);
                }
                Err(e) => {
                    tracing::debug!(queue = %name, error = %e, "writing a queue's status failed")
                }
            }
        }
        written.retain(|name, _| watch.queues.state().iter().any(|q| q.name_any() == *name));
        write_pools(&op, &watch, &manager, &mut written_pools).await;
    }
}

/// Writes each ManagedJobPool's status (its Ready, schedulable nodes, their allocatable and
/// free resources: [`crate::resources::fit::pool_status`]) from the cluster the operator
/// watches, when it changed; nothing while the cluster is not known (no queue has pools).
async fn write_pools(
    op: &Operator,
    watch: &QueueWatch,
    manager: &str,
    written: &mut HashMap<String, crate::api::ManagedJobPoolStatus>,
) {
    let Some(snapshot) = op.engine.cluster_snapshot() else {
        return;
    };
    let api: Api<ManagedJobPool> = Api::all(op.client.clone());
    let pools = watch.pools.state();
    for p in &pools {
        let name = p.name_any();
        let status = crate::resources::fit::pool_status(&p.spec.node_labels, &snapshot.nodes);
        if written.get(&name) == Some(&status) || p.status.as_ref() == Some(&status) {
            continue;
        }
        op.budget.for_event().await;
        op.engine.metrics.api_request("patch");
        let body = serde_json::json!({
            "apiVersion": "managedjobs.dev/v1alpha1",
            "kind": "ManagedJobPool",
            "status": status,
        });
        let params = PatchParams::apply(manager).force();
        match api.patch_status(&name, &params, &Patch::Apply(body)).await {
            Ok(_) => {
                written.insert(name, status);
            }
            Err(e) => tracing::debug!(pool = %name, error = %e, "writing a pool's status failed"),
        }
    }
    written.retain(|name, _| pools.iter().any(|p| p.name_any() == *name));
}
