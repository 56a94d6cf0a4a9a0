//! The world check's I/O (`docs/design.md`, "The store is checked against the world"): gathers what exists (the ManagedJobs, the Pods
//! with our marks, the processes of the state dir), lets [`world::check`] decide
//! against the store, and carries the decision out. At start, before anything is admitted or
//! resumed, the store is checked against a list of the objects; then continuously: every
//! [`WORLD_CHECK_PERIOD`], soon after a job is given up while its workload may run on, and soon
//! after a ManagedJob is deleted (rows against objects only).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, ResourceExt};

use super::nodes::NodeView;
use super::pod_watch::PodCache;
use super::shared::Operator;
use crate::api::ManagedJob;
use crate::lifecycle::world::{self, Fix, World};
use crate::state_dir::StateDir;
use crate::store::Store;

/// Period of the full world check (objects, Pods, processes against the store). Its cost: a
/// read of each process's command line on the node, the live rows and two columns of each
/// finished row, and the operator's caches of objects and Pods (no API request).
pub const WORLD_CHECK_PERIOD: Duration = Duration::from_secs(30);
/// How long a poke (a deletion, a job given up) waits for others before the check runs, and
/// the shortest time between two checks so poked.
pub const WORLD_CHECK_DEBOUNCE: Duration = Duration::from_millis(500);

/// At start, before the engine adopts or resumes anything: the store's live jobs against a
/// list of this operator's ManagedJobs. A job whose object is gone (deleted while no operator
/// watched, its finalizer removed by hand) gets a persisted cancel (the engine finishes it at
/// start: no workload is relaunched for it); a finished one whose object is gone is forgotten.
///
/// Only the rows of `owned` namespaces are checked (None: every namespace): another
/// operator's jobs are its own (`docs/design.md#one-owner-per-job`).
///
/// Errors: the API or the store failed (the operator then exits and is restarted).
pub async fn check_objects_at_start(
    client: &Client,
    dir: &StateDir,
    namespace: Option<&str>,
    shard: Option<&str>,
    owned: Option<&HashSet<String>>,
) -> anyhow::Result<()> {
    let mut store = Store::open(&dir.store(), 1024)?;
    // The rows first, then the objects (see lifecycle::world).
    let mut jobs: Vec<world::Job> = store
        .live_jobs()?
        .iter()
        .map(|r| world::Job::live(r, crate::executor::member_names(r)))
        .collect();
    jobs.extend(
        store
            .pending_jobs_brief()?
            .into_iter()
            .map(world::Job::queued),
    );
    jobs.extend(store.done_jobs_brief()?.into_iter().map(world::Job::done));
    let objects = list_object_uids(client, namespace, shard).await?;
    let fixes = world::check(
        &jobs,
        &World {
            objects: Some(objects),
            objects_namespace: namespace.map(str::to_string),
            cells: owned.cloned(),
            ..Default::default()
        },
    );
    for fix in fixes {
        match fix {
            Fix::CancelVanished { job_id } => {
                tracing::warn!(
                    job_id,
                    "the job's object is gone (deleted while no operator watched, or without its finalizer): cancelling it as a deletion"
                );
                store.request_cancel(job_id, true)?;
            }
            Fix::Forget { job_id, attempts } => {
                tracing::info!(
                    job_id,
                    "the finished job's object is gone: forgetting the job"
                );
                store.delete(job_id)?;
                dir.forget_job(job_id, attempts);
            }
            _ => {}
        }
    }
    Ok(())
}

/// The uids of this operator's ManagedJobs (its namespace, its shard), listed.
async fn list_object_uids(
    client: &Client,
    namespace: Option<&str>,
    shard: Option<&str>,
) -> anyhow::Result<HashSet<String>> {
    let api: Api<ManagedJob> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let selector = crate::api::shard_selector(shard);
    let list = api
        .list_metadata(&ListParams::default().labels(&selector))
        .await?;
    Ok(list.items.iter().filter_map(|o| o.uid()).collect())
}

/// The nodes the world check decides on (`nodes`, the Node watch's view) and the grace of a
/// node that is not Ready (`--node-lost-grace-seconds`).
pub(super) struct NodeCheck {
    /// The Node watch's view.
    pub view: Arc<NodeView>,
    /// How long a node may stay not Ready before its members are lost.
    pub grace: Duration,
}

/// The continuous world check: once the caches of objects (`reader`) and Pods (`pods`, None
/// when the pod executor is off) hold a full list, every [`WORLD_CHECK_PERIOD`], soon after
/// a poke (the engine's `world_changed`: a full check; `objects_deleted`: rows against objects
/// only), and when a node that is not Ready reaches the end of its grace (`nodes`: a live
/// attempt's Pods are checked against them once the Node watch listed them all).
pub(super) async fn world_loop(
    op: Arc<Operator>,
    reader: kube::runtime::reflector::Store<ManagedJob>,
    pods: Option<Arc<PodCache>>,
    nodes: NodeCheck,
    objects_deleted: Arc<tokio::sync::Notify>,
    objects_listed: Arc<std::sync::atomic::AtomicBool>,
) {
    while !objects_listed.load(std::sync::atomic::Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if let Some(cache) = &pods {
        while cache.snapshot().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tracing::info!(
        period = ?WORLD_CHECK_PERIOD,
        "checking the store against the world (objects, Pods, processes)"
    );
    let mut full = true;
    loop {
        let objects =
            || -> HashSet<String> { reader.state().iter().filter_map(|o| o.uid()).collect() };
        // The Pods and processes first, then the rows, then the objects (lifecycle::world).
        let pods_seen = if full {
            pods.as_ref().and_then(|c| c.snapshot())
        } else {
            None
        };
        // The nodes after the Pods: a Pod bound to a node the watch had not seen yet would
        // read as lost to a deleted node.
        let all_nodes = nodes.view.nodes(nodes.grace, crate::lifecycle::now_ms());
        let next_loss = all_nodes.as_ref().and_then(|n| {
            crate::lifecycle::nodes::next_loss_at(n.seen.values(), n.grace, n.now_ms)
        });
        let nodes_seen = all_nodes.filter(|_| pods_seen.is_some());
        match op.engine.observe_world() {
            Ok(crate::engine::LocalWorld {
                jobs,
                processes,
                controllers,
            }) => {
                let world = World {
                    objects: Some(objects()),
                    objects_namespace: op.engine.config().namespace.clone(),
                    // Only the namespaces this operator owns now: nothing of another's is
                    // cancelled, forgotten or deleted.
                    cells: Some(op.claims.held()),
                    pods: pods_seen,
                    processes: if full { processes } else { Vec::new() },
                    controllers: if full { controllers } else { Vec::new() },
                    nodes: nodes_seen,
                };
                let fixes = world::check(&jobs, &world);
                tracing::debug!(jobs = jobs.len(), fixes = fixes.len(), full, "world check");
                let fixes = op.confirm_node_losses(fixes, nodes.grace).await;
                for fix in op.engine.apply_fixes(fixes) {
                    if let Fix::DeletePod {
                        namespace,
                        name,
                        uid,
                        why,
                    } = fix
                    {
                        op.delete_orphan_pod(&namespace, &name, &uid, &why).await;
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "reading the store for the world check failed"),
        }
        // A node not Ready loses its members when its grace ends: looked at then, not up to a
        // period later.
        let until_loss = next_loss.map_or(WORLD_CHECK_PERIOD, |at| {
            Duration::from_millis((at - crate::lifecycle::now_ms()).max(0) as u64)
        });
        tokio::select! {
            _ = tokio::time::sleep(WORLD_CHECK_PERIOD.min(until_loss)) => full = true,
            _ = op.engine.world_changed.notified() => full = true,
            _ = objects_deleted.notified() => full = false,
        }
        tokio::time::sleep(WORLD_CHECK_DEBOUNCE).await;
    }
}

impl Operator {
    /// The world check's [`Fix::MemberLost`] decisions, each confirmed against the Node as the
    /// API holds it now (one GET per node): the Node watch may lag behind the Pod watch (a
    /// Pod bound to a node created a moment ago) or have missed its return while it could not
    /// watch, and a loss costs the attempt. The rule is asked again on what the API answers
    /// (a 404 is a deleted node); a loss it no longer finds, or a node that cannot be read,
    /// is left to the next check. Other fixes pass unchanged.
    async fn confirm_node_losses(&self, fixes: Vec<Fix>, grace: Duration) -> Vec<Fix> {
        use crate::lifecycle::nodes::{NodeSeen, member_lost};
        use k8s_openapi::api::core::v1::Node;
        let api: Api<Node> = Api::all(self.client.clone());
        let mut fresh: std::collections::HashMap<String, Option<NodeSeen>> = Default::default();
        let mut out = Vec::with_capacity(fixes.len());
        for fix in fixes {
            let Fix::MemberLost {
                job_id,
                attempt,
                pod,
                node,
                ..
            } = fix
            else {
                out.push(fix);
                continue;
            };
            if !fresh.contains_key(&node) {
                let now = crate::lifecycle::now_ms();
                self.engine.metrics.api_request("get");
                let seen = match api.get_opt(&node).await {
                    Ok(Some(n)) => Some(NodeSeen::of(&n, now)),
                    Ok(None) => Some(NodeSeen::Absent),
                    Err(e) => {
                        tracing::warn!(node = %node, error = %e, "reading a node its Pods seem lost to failed; the next world check looks again");
                        None
                    }
                };
                fresh.insert(node.clone(), seen);
            }
            let Some(seen) = fresh.get(&node).cloned().flatten() else {
                continue;
            };
            match member_lost(&node, &seen, grace, crate::lifecycle::now_ms()) {
                Some(loss) => out.push(Fix::MemberLost {
                    job_id,
                    attempt,
                    pod,
                    node,
                    loss,
                }),
                None => {
                    tracing::info!(node = %node, pod = %pod, "the Node watch saw the node lost, the API does not: nothing done")
                }
            }
        }
        out
    }

    /// Deletes a Pod with our marks that no live attempt owns (its own grace period), only if
    /// it is still the Pod that was seen (uid precondition).
    async fn delete_orphan_pod(&self, namespace: &str, name: &str, uid: &str, why: &str) {
        tracing::warn!(
            namespace,
            pod = name,
            "deleting a Pod that no live attempt owns: {why}"
        );
        let api: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(self.client.clone(), namespace);
        let params = DeleteParams {
            preconditions: (!uid.is_empty()).then(|| Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        self.engine.metrics.api_request("delete");
        match api.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                tracing::warn!(namespace, pod = name, error = %e, "deleting an orphaned Pod failed; the next world check tries again")
            }
        }
    }
}
