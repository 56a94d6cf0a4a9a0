//! kwok Nodes of a test's own and what happens to them, and a log of every Pod event.
//!
//! - [`Pool`]: kwok Nodes made for one test (deleted when dropped, even when the test fails:
//!   cluster-scoped objects outlive its namespace), Pods placed on them only
//!   ([`Pool::placement`]); a node held not Ready ([`Pool::hold_not_ready`]) and given back
//!   ([`Pool::release`]).
//! - [`PodLog`] ([`watch_pods`]): every Pod event of a namespace, checked at each event for
//!   what must never happen (two attempts' members alive at once, two gangs partly placed).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use managed_jobs::lifecycle::nodes::NodeSeen;

/// How long a pool's nodes may take to become Ready.
const READY_WITHIN: Duration = Duration::from_secs(90);

/// kwok manages the Nodes that carry this annotation (`hack/controlplane.sh`,
/// `--manage-nodes-with-annotation-selector`): it keeps them Ready and plays their Pods.
pub const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// kwok Nodes made for one test (`cpu` each, labelled `gang-pool=<pool>`), deleted when dropped.
pub struct Pool {
    cp: &'static super::ControlPlane,
    /// Its nodes' names, `<pool>-<i>`.
    pub names: Vec<String>,
    pool: String,
    /// Each node's capacity and allocatable beside memory and Pods.
    resources: Vec<(String, String)>,
}

impl Pool {
    /// `count` kwok Nodes `<pool>-0`... with `cpu` each, labelled `gang-pool=<pool>` and tainted
    /// so that only Pods placed with [`Pool::placement`] go there; returns once all are Ready.
    pub async fn new(
        cp: &'static super::ControlPlane,
        client: &Client,
        pool: &str,
        count: usize,
        cpu: &str,
    ) -> Pool {
        Pool::with_resources(cp, client, pool, count, &[("cpu", cpu)]).await
    }

    /// [`Pool::new`] with nodes whose capacity and allocatable are `resources` (e.g. `cpu` and
    /// `nvidia.com/gpu`), beside 32Gi of memory and 110 Pods.
    pub async fn with_resources(
        cp: &'static super::ControlPlane,
        client: &Client,
        pool: &str,
        count: usize,
        resources: &[(&str, &str)],
    ) -> Pool {
        let mut made = Pool {
            cp,
            names: Vec::new(),
            pool: pool.to_string(),
            resources: resources
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        };
        made.grow(client, count).await;
        made
    }

    /// Adds `count` nodes like the others (`<pool>-<i>` on from the last); returns once all
    /// are Ready and untainted, when the instant they were seen so.
    pub async fn grow(&mut self, client: &Client, count: usize) -> Instant {
        let mut allocatable = serde_json::json!({"memory": "32Gi", "pods": "110"});
        for (name, value) in &self.resources {
            allocatable[name.as_str()] = serde_json::json!(value);
        }
        let api = Api::<Node>::all(client.clone());
        let pool = self.pool.clone();
        let mut names = Vec::new();
        for i in self.names.len()..self.names.len() + count {
            let name = format!("{pool}-{i}");
            let node: Node = serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"type": "kwok", "gang-pool": pool, "kubernetes.io/hostname": name}},
                "spec": {"taints": [{"key": "gang-pool", "value": pool, "effect": "NoSchedule"}]},
                "status": {"allocatable": allocatable, "capacity": allocatable},
            }))
            .unwrap();
            api.create(&PostParams::default(), &node)
                .await
                .expect("creating a kwok Node");
            names.push(name.clone());
            self.names.push(name);
        }
        // Ready (kwok's Stage) and untainted by the node lifecycle controller.
        let start = Instant::now();
        loop {
            let mut ready = 0;
            for n in &names {
                let node = api.get(n).await.unwrap();
                let is_ready = NodeSeen::of(&node, 0) == NodeSeen::Ready;
                let tainted = node
                    .spec
                    .and_then(|s| s.taints)
                    .into_iter()
                    .flatten()
                    .any(|t| t.key.starts_with("node.kubernetes.io/"));
                if is_ready && !tainted {
                    ready += 1;
                }
            }
            if ready == names.len() {
                return Instant::now();
            }
            assert!(
                start.elapsed() < READY_WITHIN,
                "the pool's nodes never became Ready"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Template lines placing a Pod on this pool only.
    pub fn placement(pool: &str) -> String {
        format!(
            "      nodeSelector: {{gang-pool: {pool}}}\n      tolerations: [{{key: gang-pool, operator: Equal, value: {pool}, effect: NoSchedule}}]\n"
        )
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let cp = self.cp;
        let names = std::mem::take(&mut self.names);
        // Cluster-scoped objects outlive the namespace: remove them even when the test failed.
        // A client of its own: the test's runtime is blocked on this thread meanwhile.
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let api = Api::<Node>::all(super::client(cp).await);
                    for n in names {
                        let _ = api.delete(&n, &DeleteParams::default()).await;
                    }
                })
        })
        .join();
    }
}

/// True when `node` has a Ready condition `True`.
pub fn node_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

impl Pool {
    /// Holds node `name` not Ready until [`Pool::release`]: kwok stops managing it (its
    /// annotation removed: no heartbeat, no Lease renewal, its Pods left as they are), then its
    /// `Ready` condition is set `False` (`KubeletNotReady`, since now) as a kubelet that lost
    /// its runtime reports it, and checked to stay so (kwok would set it back while it still
    /// managed the node). kube-controller-manager leaves it alone for its
    /// node-monitor-grace-period (40-50 s) since kwok's last Lease renewal, then marks it
    /// `Unknown`: either way it is not Ready. Returns when it was made not Ready.
    pub async fn hold_not_ready(&self, client: &Client, name: &str) -> Instant {
        assert!(
            self.names.iter().any(|n| n == name),
            "{name} is not in the pool"
        );
        let api = Api::<Node>::all(client.clone());
        let release = serde_json::json!({"metadata": {"annotations": {KWOK_ANNOTATION: null}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&release))
            .await
            .expect("taking the node out of kwok's hands");
        let start = Instant::now();
        loop {
            let now = jiff::Timestamp::now().to_string();
            let not_ready = serde_json::json!({"status": {"conditions": [{
                "type": "Ready", "status": "False", "reason": "KubeletNotReady",
                "message": "the test holds the node not Ready", "lastHeartbeatTime": now,
                "lastTransitionTime": now}]}});
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&not_ready))
                .await
                .expect("marking the node not Ready");
            let at = Instant::now();
            // kwok lets go of it at once; a condition it sets back would show within this.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            if !node_ready(&api.get(name).await.unwrap()) {
                return at;
            }
            assert!(
                start.elapsed() < READY_WITHIN,
                "node {name} would not stay not Ready"
            );
        }
    }

    /// Gives node `name` back to kwok (its annotation again), which marks it Ready; returns once
    /// it is.
    pub async fn release(&self, client: &Client, name: &str) {
        let api = Api::<Node>::all(client.clone());
        let manage = serde_json::json!({"metadata": {"annotations": {KWOK_ANNOTATION: "fake"}}});
        api.patch(name, &PatchParams::default(), &Patch::Merge(&manage))
            .await
            .expect("giving the node back to kwok");
        let start = Instant::now();
        while !node_ready(&api.get(name).await.unwrap()) {
            assert!(
                start.elapsed() < READY_WITHIN,
                "node {name} never became Ready again"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes node `name` (as a spot node's cloud controller does) and returns when the
    /// delete was called.
    pub async fn delete(&self, client: &Client, name: &str) -> Instant {
        assert!(
            self.names.iter().any(|n| n == name),
            "{name} is not in the pool"
        );
        let at = Instant::now();
        Api::<Node>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await
            .expect("deleting the node");
        at
    }
}

/// One Pod as a watch event showed it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub job: String,
    pub attempt: i32,
    pub rank: u32,
    pub node: Option<String>,
    /// Not finished (phase neither Succeeded nor Failed) and not being deleted.
    pub alive: bool,
}

/// Every Pod event of a namespace from now on, with the violations checked at each event.
#[derive(Default)]
pub struct PodLog {
    /// Every Pod name ever seen, with its last state.
    pub pods: BTreeMap<String, Seen>,
    /// Pods that exist now (not yet deleted).
    pub present: BTreeMap<String, Seen>,
    /// Moments where one job had alive members of two attempts: (job, attempts).
    pub overlaps: Vec<(String, BTreeSet<i32>)>,
    /// Moments where two jobs were both partly placed (some member bound, some not, both
    /// alive): the pair.
    pub both_partly_placed: Vec<(String, String)>,
    /// Nodes any gang Pod was ever bound to, by job.
    pub bound: BTreeMap<String, BTreeSet<String>>,
}

impl PodLog {
    pub fn observe(&mut self, pod: &Pod, deleted: bool) {
        let labels = pod.labels();
        let Some(job) = labels.get("managedjobs.dev/job-name").cloned() else {
            return;
        };
        let attempt = labels
            .get("managedjobs.dev/attempt")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        let rank = labels
            .get("managedjobs.dev/rank")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        let seen = Seen {
            job: job.clone(),
            attempt,
            rank,
            node: node.clone(),
            alive: !deleted
                && pod.metadata.deletion_timestamp.is_none()
                && !matches!(phase.as_deref(), Some("Succeeded" | "Failed")),
        };
        if let Some(n) = node {
            self.bound.entry(job.clone()).or_default().insert(n);
        }
        let name = pod.name_any();
        self.pods.insert(name.clone(), seen.clone());
        if deleted {
            self.present.remove(&name);
        } else {
            self.present.insert(name, seen);
        }
        // Never two attempts' members of one job alive at once.
        let mut by_job: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
        for s in self.present.values().filter(|s| s.alive) {
            by_job.entry(&s.job).or_default().insert(s.attempt);
        }
        for (job, attempts) in by_job {
            if attempts.len() > 1 {
                self.overlaps.push((job.to_string(), attempts));
            }
        }
        // Never two gangs both partly placed.
        let mut partly: Vec<String> = Vec::new();
        let jobs: BTreeSet<&str> = self.present.values().map(|s| s.job.as_str()).collect();
        for job in jobs {
            let alive: Vec<&Seen> = self
                .present
                .values()
                .filter(|s| s.job == job && s.alive)
                .collect();
            let bound = alive.iter().filter(|s| s.node.is_some()).count();
            if bound > 0 && bound < alive.len() {
                partly.push(job.to_string());
            }
        }
        if partly.len() > 1 {
            self.both_partly_placed
                .push((partly[0].clone(), partly[1].clone()));
        }
    }

    /// Pod names seen of `job`, by attempt.
    pub fn names_of(&self, job: &str) -> BTreeMap<i32, BTreeSet<String>> {
        let mut out: BTreeMap<i32, BTreeSet<String>> = BTreeMap::new();
        for (name, s) in &self.pods {
            if s.job == job {
                out.entry(s.attempt).or_default().insert(name.clone());
            }
        }
        out
    }
}

/// Starts a watch of every Pod of `ns`, logging each event in a [`PodLog`] (abort the handle to
/// stop it).
pub fn watch_pods(client: &Client, ns: &str) -> (tokio::task::JoinHandle<()>, Arc<Mutex<PodLog>>) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let log = Arc::new(Mutex::new(PodLog::default()));
    let seen = log.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                    seen.lock().unwrap().observe(&p, false)
                }
                Ok(watcher::Event::Delete(p)) => seen.lock().unwrap().observe(&p, true),
                _ => {}
            }
        }
    });
    (task, log)
}

/// A pod job named `name` whose Pods run until stopped (no kwok fate), each on a node of the
/// pool `pool` of its own (a Pod asks for the whole `cpu: "1"` of a [`Pool`] node made with
/// `cpu` 1), with a grace period of 1 s; a gang of `nodes` Pods when set.
pub fn job_on_pool(name: &str, pool: &str, nodes: Option<u32>) -> String {
    let nodes = nodes.map_or(String::new(), |n| format!("  nodes: {n}\n"));
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
{nodes}  terminationGracePeriodSeconds: 1
  template:
    spec:
{placement}      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: "1"
              memory: 64Mi
"#,
        placement = Pool::placement(pool)
    )
}

/// A pipeline named `name` of two pod tasks: `train`, a gang of `nodes` Pods on the pool `pool`
/// (one per node, as [`job_on_pool`]) that runs until stopped, then `eval`, one Pod anywhere
/// that succeeds after a second.
pub fn pipeline_on_pool(name: &str, pool: &str, nodes: u32) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  tasks:
    - name: train
      nodes: {nodes}
      template:
        spec:
{placement}          containers:
            - name: main
              image: busybox
              resources:
                requests:
                  cpu: "1"
                  memory: 64Mi
    - name: eval
      template:
        metadata:
          annotations: {{"managedjobs.dev/complete-after": "1s"}}
        spec:
          containers:
            - name: main
              image: busybox
"#,
        placement = Pool::placement(pool)
            .lines()
            .map(|l| format!("    {l}\n"))
            .collect::<String>()
    )
}
