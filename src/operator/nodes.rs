//! The operator's one shared watch on Nodes (`docs/design.md#failures`, issue 43): a reflector
//! of trimmed Nodes ([`NodeView`]) that says how each node stands and since when
//! ([`NodeView::seen`], `lifecycle::nodes::NodeSeen`), so that a member whose node is deleted,
//! or stays not Ready past `--node-lost-grace-seconds`, ends its attempt as lost within
//! seconds (the world check decides, `lifecycle::world`; this module only observes and pokes
//! it). Before, a lost node was seen only once the pod GC deleted its Pods (55 s for a gang).
//!
//! Nodes are cluster-scoped: the operator needs `get`, `list` and `watch` on them (the chart's
//! ClusterRole `<release namespace>-<fullname>-nodes`, for namespaced installs too). Without
//! them it says so once, loudly, and goes on as before (a lost node is then seen only when
//! Kubernetes deletes its Pods), asking again every [`FORBIDDEN_RETRY`]: it never exits or
//! crash-loops for it.
//!
//! What a Node keeps here ([`trim`]): its name, uid, labels, creation time, spec (taints,
//! `unschedulable`), its `Ready` condition and its allocatable resources, a few hundred bytes
//! per node: what the admission of a job's demand on nodes (issue 44) will read, from the same
//! store, without a second watch.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt as _, watcher};

use crate::engine::Engine;
use crate::lifecycle::nodes::{NodeSeen, Nodes};

/// How often the operator asks again for Nodes after the API refused it (403): a permission
/// granted later is used within this, without a restart, and a refused watch costs one
/// request per period instead of one per watch retry.
pub const FORBIDDEN_RETRY: Duration = Duration::from_secs(300);

/// Where the Node watch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Listing {
    /// Not listed yet (or listing again after a failure, with the last list kept).
    NotYet,
    /// Every Node was listed; the store follows the watch.
    Listed,
    /// The API refused to list or watch Nodes (403).
    Forbidden,
}

/// Every Node as the operator's watch last saw it ([`trim`]med), and whether it is complete.
pub struct NodeView {
    reader: reflector::Store<Node>,
    listing: Mutex<Listing>,
}

impl NodeView {
    /// An empty view, and the writer its watch ([`run`]) fills it with.
    pub fn new() -> (Arc<NodeView>, reflector::store::Writer<Node>) {
        let (reader, writer) = reflector::store();
        (
            Arc::new(NodeView {
                reader,
                listing: Mutex::new(Listing::NotYet),
            }),
            writer,
        )
    }

    fn listing(&self) -> Listing {
        *self.listing.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_listing(&self, to: Listing) -> Listing {
        std::mem::replace(
            &mut *self.listing.lock().unwrap_or_else(|e| e.into_inner()),
            to,
        )
    }

    /// True once every Node was listed, as long as the watch is allowed.
    pub fn complete(&self) -> bool {
        self.listing() == Listing::Listed
    }

    /// The Node `name` as last seen (trimmed), if it exists.
    pub fn get(&self, name: &str) -> Option<Arc<Node>> {
        self.reader.get(&ObjectRef::new(name))
    }

    /// How node `name` stands at `now_ms` (absent, Ready, or not Ready since when); None while
    /// the view is not complete (nothing is known for sure).
    pub fn seen(&self, name: &str, now_ms: i64) -> Option<NodeSeen> {
        self.complete().then(|| {
            self.get(name)
                .map_or(NodeSeen::Absent, |n| NodeSeen::of(&n, now_ms))
        })
    }

    /// Every Node as last seen ([`trim`]med).
    pub fn all(&self) -> Vec<Arc<Node>> {
        self.reader.state()
    }

    /// Every node, with `grace` and `now_ms`, for the world check; None while the view is not
    /// complete.
    pub fn nodes(&self, grace: Duration, now_ms: i64) -> Option<Nodes> {
        self.complete().then(|| Nodes {
            seen: self
                .reader
                .state()
                .iter()
                .filter_map(|n| Some((n.metadata.name.clone()?, NodeSeen::of(n, now_ms))))
                .collect(),
            grace,
            now_ms,
        })
    }
}

/// What the operator keeps of a Node: its name, uid, labels, resource version and creation
/// time, its spec (taints, `unschedulable`), its `Ready` condition and its allocatable
/// resources. Its images, other conditions, addresses, node info and volumes go (most of a
/// Node's size).
pub fn trim(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.node_info = None;
        status.addresses = None;
        status.daemon_endpoints = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.config = None;
        status.capacity = None;
        status.runtime_handlers = None;
        status.features = None;
        if let Some(conditions) = status.conditions.as_mut() {
            conditions.retain(|c| c.type_ == "Ready");
        }
    }
}

/// True when `e` is the API refusing this identity the Nodes (403).
fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// True when what admission in resources reads of a node (`resources::fit`) differs between
/// `old` (None: the node is new) and `new`: readiness, allocatable, labels, taints,
/// `unschedulable`. A heartbeat changes none of them.
fn admission_changed(old: Option<&Node>, new: &Node) -> bool {
    let Some(old) = old else { return true };
    let allocatable = |n: &Node| n.status.as_ref().and_then(|s| s.allocatable.clone());
    let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone());
    let unschedulable = |n: &Node| n.spec.as_ref().and_then(|s| s.unschedulable);
    not_ready(old) != not_ready(new)
        || old.metadata.labels != new.metadata.labels
        || allocatable(old) != allocatable(new)
        || taints(old) != taints(new)
        || unschedulable(old) != unschedulable(new)
}

/// True when `node` is not Ready (its `Ready` condition is not `True`).
fn not_ready(node: &Node) -> bool {
    !matches!(NodeSeen::of(node, 0), NodeSeen::Ready)
}

/// Runs the watch until the process ends, filling `view` through `writer`. Pokes the world
/// check (`engine.world_changed`) when it matters: once every Node is listed (again), when a
/// Node is deleted, and when one stops being Ready (the world check then looks again when its
/// grace ends). Errors are retried as every watch of the operator's (`retry`), a refusal
/// (403) every [`FORBIDDEN_RETRY`].
pub async fn run(
    engine: Arc<Engine>,
    api: Api<Node>,
    view: Arc<NodeView>,
    mut writer: reflector::store::Writer<Node>,
) {
    use watcher::Event;
    let mut health = super::retry::WatchHealth::new("Node");
    // Nodes seen not Ready, so that only a change of readiness pokes the world check.
    let mut unready: HashSet<String> = HashSet::new();
    loop {
        let mut stream =
            super::retry::relisting_watch(api.clone(), watcher::Config::default()).modify(trim);
        let mut refused = false;
        while let Some(event) = stream.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) if forbidden(&e) => {
                    refused = true;
                    break;
                }
                Err(e) => {
                    // Until it lists again, what it holds may be stale (a node back to Ready
                    // unseen): nothing is decided on it meanwhile.
                    if view.listing() == Listing::Listed {
                        view.set_listing(Listing::NotYet);
                    }
                    health.failed(&e);
                    continue;
                }
            };
            // What admission reads of a node changing (a node added, Ready again, given more
            // allocatable): a job waiting for room may fit now, so a scheduling pass is asked
            // for at once rather than at the engine's backstop.
            if let Event::Apply(node) = &event
                && admission_changed(
                    node.metadata
                        .name
                        .as_deref()
                        .and_then(|n| view.get(n))
                        .as_deref(),
                    node,
                )
            {
                engine.schedule_soon();
            }
            writer.apply_watcher_event(&event);
            match &event {
                Event::InitDone => {
                    engine.schedule_soon();
                    if view.set_listing(Listing::Listed) == Listing::Forbidden {
                        tracing::info!(
                            "the Node watch is allowed again: lost nodes end their attempts within seconds again"
                        );
                    }
                    health.listed(Some(&engine.metrics));
                    unready = view
                        .reader
                        .state()
                        .iter()
                        .filter(|n| not_ready(n))
                        .filter_map(|n| n.metadata.name.clone())
                        .collect();
                    engine.world_changed.notify_one();
                }
                Event::Delete(node) => {
                    if let Some(name) = &node.metadata.name {
                        unready.remove(name);
                        tracing::info!(node = %name, "a Node was deleted");
                    }
                    engine.world_changed.notify_one();
                    engine.schedule_soon();
                }
                Event::Apply(node) => {
                    let Some(name) = node.metadata.name.clone() else {
                        continue;
                    };
                    if not_ready(node) {
                        if unready.insert(name.clone()) {
                            tracing::info!(node = %name, "a Node is not Ready");
                            engine.world_changed.notify_one();
                        }
                    } else if unready.remove(&name) {
                        tracing::info!(node = %name, "a Node is Ready again");
                    }
                }
                Event::Init | Event::InitApply(_) => {}
            }
        }
        if !refused {
            // The stream only ends with the process; start again if it ever does.
            continue;
        }
        if view.set_listing(Listing::Forbidden) != Listing::Forbidden {
            tracing::error!(
                retry_every = ?FORBIDDEN_RETRY,
                "the operator may not list and watch Nodes (403 Forbidden): a job whose Pod's node is \
                 deleted or stops being Ready is seen lost only when Kubernetes deletes the Pod (the \
                 pod GC 40-60 s after a node is deleted, taint-based eviction 300 s after it stops \
                 being Ready), as before issue 43. Grant get, list and watch on nodes (the chart's \
                 ClusterRole <release namespace>-<fullname>-nodes does); asking again every {} s",
                FORBIDDEN_RETRY.as_secs()
            );
        }
        tokio::time::sleep(FORBIDDEN_RETRY).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What is kept of a Node: what says whether it holds its Pods, and what issue 44's fit
    /// will read (labels, taints, unschedulable, allocatable); not its images or node info.
    #[test]
    fn a_trimmed_node_keeps_its_readiness_labels_taints_and_allocatable() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n1", "uid": "u1", "labels": {"pool": "gpu"},
                "annotations": {"big": "x"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"unschedulable": true, "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"cpu": "8", "nvidia.com/gpu": "8"},
                "capacity": {"cpu": "8"},
                "conditions": [
                    {"type": "MemoryPressure", "status": "False"},
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}
                ],
                "images": [{"names": ["busybox"], "sizeBytes": 1}],
                "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
                    "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "",
                    "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""}
            }
        }))
        .unwrap();
        let before = NodeSeen::of(&node, i64::MAX);
        trim(&mut node);
        assert_eq!(NodeSeen::of(&node, i64::MAX), before);
        assert!(not_ready(&node));
        let status = node.status.as_ref().unwrap();
        assert!(status.images.is_none() && status.node_info.is_none());
        assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
        assert!(
            status
                .allocatable
                .as_ref()
                .unwrap()
                .contains_key("nvidia.com/gpu")
        );
        assert_eq!(node.metadata.labels.as_ref().unwrap()["pool"], "gpu");
        assert!(node.metadata.annotations.is_none() && node.metadata.managed_fields.is_none());
        let spec = node.spec.as_ref().unwrap();
        assert_eq!(spec.unschedulable, Some(true));
        assert_eq!(spec.taints.as_ref().unwrap().len(), 1);
    }

    /// Until every Node was listed, nothing is known: no node reads as absent.
    #[test]
    fn an_incomplete_view_knows_nothing() {
        let (view, _writer) = NodeView::new();
        assert_eq!(view.seen("n1", 0), None);
        assert_eq!(view.nodes(Duration::from_secs(60), 0), None);
        view.set_listing(Listing::Listed);
        assert_eq!(view.seen("n1", 0), Some(NodeSeen::Absent));
        assert_eq!(
            view.nodes(Duration::from_secs(60), 7),
            Some(Nodes {
                seen: Default::default(),
                grace: Duration::from_secs(60),
                now_ms: 7
            })
        );
        view.set_listing(Listing::Forbidden);
        assert_eq!(view.seen("n1", 0), None);
    }

    /// A scheduling pass is asked for when a node is new or what fit reads of it changed;
    /// a heartbeat (a new resource version, a new heartbeat time) asks for nothing.
    #[test]
    fn only_what_fit_reads_asks_for_a_pass() {
        let node = |ready: &str, gpus: &str, beat: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n1", "resourceVersion": beat, "labels": {"pool": "gpu"}},
                "spec": {},
                "status": {
                    "allocatable": {"nvidia.com/gpu": gpus},
                    "conditions": [{"type": "Ready", "status": ready,
                        "lastHeartbeatTime": format!("2026-01-01T00:00:{beat:0>2}Z")}]
                }
            }))
            .unwrap()
        };
        let base = node("True", "8", "1");
        assert!(admission_changed(None, &base));
        assert!(!admission_changed(Some(&base), &node("True", "8", "2")));
        assert!(admission_changed(Some(&node("False", "8", "1")), &base));
        assert!(admission_changed(Some(&base), &node("True", "4", "2")));
        let mut cordoned = base.clone();
        cordoned.spec.as_mut().unwrap().unschedulable = Some(true);
        assert!(admission_changed(Some(&base), &cordoned));
        let mut relabelled = base.clone();
        relabelled.metadata.labels = None;
        assert!(admission_changed(Some(&base), &relabelled));
        let mut tainted = base.clone();
        tainted.spec.as_mut().unwrap().taints = Some(vec![k8s_openapi::api::core::v1::Taint {
            key: "gpu".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]);
        assert!(admission_changed(Some(&base), &tainted));
    }
}
