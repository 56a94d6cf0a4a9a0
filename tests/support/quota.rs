//! Quotas in resources as tests set them up: ManagedJobQueues and ManagedJobPools deleted
//! when dropped (cluster-scoped, they would outlive the test's namespace), and GPU jobs.

use kube::Client;
use kube::api::{Api, PostParams};
use managed_jobs::api::{LABEL_SHARD, ManagedJob, ManagedJobQueue};
use serde_json::json;

/// Queues created by a test, deleted when dropped (a queue left behind would make every later
/// operator of the cluster see queue objects).
pub struct Queues {
    pub api: Api<ManagedJobQueue>,
    names: Vec<String>,
    kubeconfig: std::path::PathBuf,
}

impl Queues {
    pub fn new(client: &Client, cp: &super::ControlPlane) -> Queues {
        Queues {
            api: Api::all(client.clone()),
            names: Vec::new(),
            kubeconfig: cp.kubeconfig.clone(),
        }
    }

    /// Creates queue `name` of `weight` admitting `namespaces`, with an optional `maxRunning`.
    pub async fn create(
        &mut self,
        name: &str,
        weight: u32,
        max_running: Option<u32>,
        namespaces: &[&str],
    ) {
        let mut spec = json!({
            "weight": weight,
            "namespaceSelector": { "matchExpressions": [{
                "key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces,
            }]},
        });
        if let Some(m) = max_running {
            spec["maxRunning"] = json!(m);
        }
        self.create_with(name, spec).await;
    }

    /// Applies queue `name` from `yaml` as a user would (`kubectl apply`: the CRD in force
    /// prunes what it does not know), to be deleted with the others.
    pub fn apply(&mut self, cp: &super::ControlPlane, name: &str, yaml: &str) {
        super::visibility::apply(cp, yaml);
        self.names.push(name.to_string());
    }

    /// Creates queue `name` with `spec` as given.
    pub async fn create_with(&mut self, name: &str, spec: serde_json::Value) {
        let q: ManagedJobQueue = serde_json::from_value(json!({
            "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobQueue",
            "metadata": { "name": name }, "spec": spec,
        }))
        .unwrap();
        self.api
            .create(&PostParams::default(), &q)
            .await
            .expect("creating a queue");
        self.names.push(name.to_string());
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        // kubectl, not the client: Drop cannot await the test's runtime.
        let cp = super::ControlPlane {
            kubeconfig: self.kubeconfig.clone(),
        };
        for name in &self.names {
            super::kubectl(&cp, &["delete", "managedjobqueue", name, "--wait=false"]);
        }
    }
}

/// A pod job of `shard` in `queue` whose one Pod asks for `gpus` `nvidia.com/gpu` and completes
/// after `seconds` (kwok's stage, `hack/stages`).
pub fn gpu_job(name: &str, shard: &str, queue: &str, gpus: u32, seconds: u32) -> ManagedJob {
    serde_json::from_value(json!({
        "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
        "metadata": { "name": name, "labels": { LABEL_SHARD: shard } },
        "spec": {
            "queue": queue,
            "template": {
                "metadata": {"annotations": {"managedjobs.dev/complete-after": format!("{seconds}s")}},
                "spec": {"containers": [{"name": "main", "image": "trainer",
                    "resources": {"requests": {"nvidia.com/gpu": gpus.to_string(), "cpu": "100m"},
                                  "limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
            },
        },
    }))
    .unwrap()
}

/// A ManagedJobPool made by a test (nodes labelled `gang-pool=<name>` and tainted so, as
/// [`super::kwok::Pool`] makes them), deleted when dropped.
pub struct PoolObject {
    name: String,
    kubeconfig: std::path::PathBuf,
}

impl PoolObject {
    pub async fn create(client: &Client, cp: &super::ControlPlane, name: &str) -> PoolObject {
        let pools: Api<managed_jobs::api::ManagedJobPool> = Api::all(client.clone());
        pools
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobPool",
                    "metadata": {"name": name},
                    "spec": {"nodeLabels": {"gang-pool": name},
                             "tolerations": [{"key": "gang-pool", "operator": "Equal", "value": name, "effect": "NoSchedule"}]},
                }))
                .unwrap(),
            )
            .await
            .expect("creating the pool");
        PoolObject {
            name: name.to_string(),
            kubeconfig: cp.kubeconfig.clone(),
        }
    }
}

impl Drop for PoolObject {
    fn drop(&mut self) {
        let cp = super::ControlPlane {
            kubeconfig: self.kubeconfig.clone(),
        };
        super::kubectl(
            &cp,
            &["delete", "managedjobpool", &self.name, "--wait=false"],
        );
    }
}

/// [`gpu_job`] as a gang of `nodes` Pods of `gpus` GPUs each that run until stopped.
pub fn gpu_gang(name: &str, shard: &str, queue: &str, gpus: u32, nodes: u32) -> ManagedJob {
    let mut job = gpu_job(name, shard, queue, gpus, 600);
    job.spec.nodes = Some(nodes as i32);
    job
}

/// `count` kwok nodes of 8 `nvidia.com/gpu` and 32 cpu (`<name>-<i>`, labelled and tainted
/// `gang-pool=<name>`) and the ManagedJobPool `name` of them; both deleted when dropped.
pub async fn gpu_pool(
    cp: &'static super::ControlPlane,
    client: &Client,
    name: &str,
    count: usize,
) -> (super::kwok::Pool, PoolObject) {
    let nodes = super::kwok::Pool::with_resources(
        cp,
        client,
        name,
        count,
        &[("cpu", "32"), ("nvidia.com/gpu", "8")],
    )
    .await;
    (nodes, PoolObject::create(client, cp, name).await)
}
