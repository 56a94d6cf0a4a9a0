//! The cluster as admission in resources sees it (issue 44, `docs/concepts/quotas-pools-and-fit.md`):
//! every Node ([`super::nodes::NodeView`], the operator's one Node watch) with what every bound,
//! unfinished Pod of the cluster requests of it, ours and everyone else's, from one cluster-wide
//! Pod watch of trimmed Pods ([`trim`]); and where the members of our attempts are bound.
//! [`ClusterWatch`] is the engine's [`ClusterView`]: a scheduling pass takes a
//! [`ClusterSnapshot`], rebuilt only when a watch saw a change since the last one.
//!
//! Started only when a queue has pools (nothing of it is read otherwise). It needs `list` and
//! `watch` on Pods in every namespace (the chart's ClusterRole `<name>-nodes`); refused, the
//! snapshot is None and the queues with pools admit nothing, each waiting job saying why
//! ([`crate::admission::WhyNot::ClusterUnknown`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, PodStatus};
use kube::Api;
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt as _, watcher};

use super::nodes::NodeView;
use crate::engine::Engine;
use crate::resources::Resources;
use crate::resources::fit::{ClusterSnapshot, ClusterView, NodeInfo, Taint};

/// The cluster's Nodes and unfinished Pods, as the watches last saw them.
pub struct ClusterWatch {
    nodes: Arc<NodeView>,
    pods: reflector::Store<Pod>,
    pods_listed: AtomicBool,
    /// Grows with every Pod event (Node events are read through the view's own state).
    version: AtomicU64,
    last: Mutex<Option<(u64, usize, Arc<ClusterSnapshot>)>>,
}

impl ClusterWatch {
    /// Starts the cluster-wide Pod watch beside the operator's Node view; the engine is poked
    /// (a scheduling pass) after every change, so that a job waiting for room is admitted once
    /// a Pod ends or a node comes.
    pub fn start(engine: Arc<Engine>, client: kube::Client, nodes: Arc<NodeView>) -> Arc<Self> {
        let (pods, writer) = reflector::store::<Pod>();
        let watch = Arc::new(ClusterWatch {
            nodes,
            pods,
            pods_listed: AtomicBool::new(false),
            version: AtomicU64::new(0),
            last: Mutex::new(None),
        });
        let api: Api<Pod> = Api::all(client);
        // Finished Pods request nothing of their node.
        let config = watcher::Config::default()
            .fields("status.phase!=Succeeded,status.phase!=Failed")
            .any_semantic();
        let me = watch.clone();
        let mut health = super::retry::WatchHealth::new("Pod (cluster-wide, for admission)");
        tokio::spawn(
            super::retry::relisting_watch(api, config)
                .modify(trim)
                .reflect(writer)
                .for_each(move |event| {
                    match &event {
                        Ok(watcher::Event::InitDone) => {
                            me.pods_listed.store(true, Ordering::SeqCst);
                            health.listed(Some(&engine.metrics));
                        }
                        Ok(_) => {}
                        Err(e) => health.failed(e),
                    }
                    me.version.fetch_add(1, Ordering::SeqCst);
                    engine.schedule_soon();
                    async {}
                }),
        );
        watch
    }
}

impl ClusterView for ClusterWatch {
    fn snapshot(&self) -> Option<Arc<ClusterSnapshot>> {
        if !self.pods_listed.load(Ordering::SeqCst) || !self.nodes.complete() {
            return None;
        }
        let nodes = self.nodes.all();
        // Node events do not bump the Pod version: the node list's size and their resource
        // versions are part of the key.
        let version = self.version.load(Ordering::SeqCst);
        let node_key = nodes
            .iter()
            .map(|n| {
                n.metadata
                    .resource_version
                    .as_deref()
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0)
            })
            .fold(nodes.len(), |a, v| a.wrapping_mul(31).wrapping_add(v));
        if let Some((v, k, snap)) = self.last.lock().expect("poisoned").as_ref()
            && *v == version
            && *k == node_key
        {
            return Some(snap.clone());
        }
        let snap = Arc::new(build(&nodes, &self.pods.state(), version));
        *self.last.lock().expect("poisoned") = Some((version, node_key, snap.clone()));
        Some(snap)
    }
}

/// The snapshot of `nodes` with `pods` bound to them: each node's allocatable, labels, taints,
/// readiness and what its unfinished Pods request; and where each of our attempts' members
/// are bound (by the ManagedJob's uid, from the Pod's owner, and the attempt label).
pub fn build(nodes: &[Arc<Node>], pods: &[Arc<Pod>], version: u64) -> ClusterSnapshot {
    let mut requested: HashMap<&str, Resources> = HashMap::new();
    let mut bound: HashMap<(String, i32), Vec<String>> = HashMap::new();
    for pod in pods {
        let Some(spec) = &pod.spec else { continue };
        let Some(node) = spec.node_name.as_deref() else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        // A quantity that cannot be read (never in a Pod the API accepted) counts as nothing.
        let mut reqs = crate::resources::demand::pod_requests(spec, "spec").unwrap_or_default();
        reqs.set(
            crate::resources::amount::PODS,
            crate::resources::amount::ONE,
        );
        requested.entry(node).or_default().add(&reqs);
        if let Some((uid, attempt)) = ours(pod) {
            bound
                .entry((uid, attempt))
                .or_default()
                .push(node.to_string());
        }
    }
    let nodes = nodes
        .iter()
        .filter_map(|n| {
            let name = n.metadata.name.clone()?;
            let allocatable = n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .map(|a| Resources::from_quantities(a).unwrap_or_default())
                .unwrap_or_default();
            let spec = n.spec.as_ref();
            Some(NodeInfo {
                requested: requested.get(name.as_str()).cloned().unwrap_or_default(),
                labels: n.metadata.labels.clone().unwrap_or_default(),
                taints: spec
                    .and_then(|s| s.taints.as_ref())
                    .map(|ts| {
                        ts.iter()
                            .map(|t| Taint {
                                key: t.key.clone(),
                                value: t.value.clone().unwrap_or_default(),
                                effect: t.effect.clone(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                ready: matches!(
                    crate::lifecycle::nodes::NodeSeen::of(n, 0),
                    crate::lifecycle::nodes::NodeSeen::Ready
                ),
                unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
                allocatable,
                name,
            })
        })
        .collect();
    ClusterSnapshot {
        nodes,
        bound,
        version,
    }
}

/// The ManagedJob uid and attempt of one of our Pods (its controller owner of kind ManagedJob,
/// its attempt label).
fn ours(pod: &Pod) -> Option<(String, i32)> {
    let attempt = pod
        .metadata
        .labels
        .as_ref()?
        .get(crate::api::LABEL_ATTEMPT)?
        .parse()
        .ok()?;
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "ManagedJob")?;
    Some((owner.uid.clone(), attempt))
}

/// What the operator keeps of a Pod of the cluster: its name, namespace, labels and owners, its
/// node, its containers' and init containers' resources (and an init container's restart
/// policy: a sidecar's requests add up), its overhead and Pod-level resources, and its phase.
/// The rest (most of a Pod's size: env, volumes, commands, status details) goes.
pub fn trim(pod: &mut Pod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    meta.finalizers = None;
    let keep = |c: &Container| Container {
        name: c.name.clone(),
        resources: c.resources.clone(),
        restart_policy: c.restart_policy.clone(),
        ..Default::default()
    };
    pod.spec = pod.spec.take().map(|s| PodSpec {
        node_name: s.node_name,
        containers: s.containers.iter().map(keep).collect(),
        init_containers: s.init_containers.map(|cs| cs.iter().map(keep).collect()),
        overhead: s.overhead,
        resources: s.resources,
        ..Default::default()
    });
    pod.status = pod.status.take().map(|s| PodStatus {
        phase: s.phase,
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, gpus: &str) -> Arc<Node> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {"pool": "gpu"}, "resourceVersion": "1"},
                "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
                "status": {
                    "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": gpus},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }))
            .unwrap(),
        )
    }

    fn pod(node: Option<&str>, gpus: &str, phase: &str, owner: Option<&str>) -> Arc<Pod> {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n",
                "labels": {crate::api::LABEL_ATTEMPT: "2"}},
            "spec": {"containers": [{"name": "main", "image": "x", "env": [{"name": "A", "value": "b"}],
                "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": gpus},
                              "limits": {"nvidia.com/gpu": gpus}}}]},
            "status": {"phase": phase},
        }))
        .unwrap();
        p.spec.as_mut().unwrap().node_name = node.map(String::from);
        if let Some(uid) = owner {
            p.metadata.owner_references = Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "managedjobs.dev/v1alpha1".into(),
                    kind: "ManagedJob".into(),
                    name: "j".into(),
                    uid: uid.into(),
                    ..Default::default()
                },
            ]);
        }
        trim(&mut p);
        Arc::new(p)
    }

    #[test]
    fn every_unfinished_bound_pod_counts_on_its_node_and_ours_say_where_they_are() {
        let nodes = [node("n0", "8"), node("n1", "8")];
        let pods = [
            pod(Some("n0"), "4", "Running", None),
            pod(Some("n0"), "2", "Pending", Some("uid-a")),
            pod(Some("n0"), "2", "Succeeded", None),
            pod(None, "8", "Pending", Some("uid-b")),
        ];
        let snap = build(&nodes, &pods, 7);
        let n0 = snap.nodes.iter().find(|n| n.name == "n0").unwrap();
        assert_eq!(
            n0.requested.get("nvidia.com/gpu"),
            6 * crate::resources::amount::ONE
        );
        assert_eq!(n0.requested.get("pods"), 2 * crate::resources::amount::ONE);
        assert_eq!(
            n0.free().get("nvidia.com/gpu"),
            2 * crate::resources::amount::ONE
        );
        assert!(n0.ready && !n0.unschedulable);
        assert_eq!(n0.taints.len(), 1);
        let n1 = snap.nodes.iter().find(|n| n.name == "n1").unwrap();
        assert!(n1.requested.is_empty());
        assert_eq!(snap.bound.len(), 1);
        assert_eq!(
            snap.bound[&("uid-a".to_string(), 2)],
            vec!["n0".to_string()]
        );
        assert_eq!(snap.version, 7);
    }

    #[test]
    fn a_trimmed_pod_keeps_what_admission_reads_only() {
        let p = pod(Some("n0"), "1", "Running", Some("u"));
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert!(c.env.is_none() && c.image.is_none());
        assert!(c.resources.is_some());
        assert_eq!(p.spec.as_ref().unwrap().node_name.as_deref(), Some("n0"));
    }
}
