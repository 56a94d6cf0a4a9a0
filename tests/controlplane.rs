//! The dev control plane's parts are real: kube-scheduler places a Pod onto a kwok node, kwok
//! runs it (and completes it with the annotated exit code), kube-controller-manager's garbage
//! collector deletes it with its owner, and the Eviction API sets DisruptionTarget.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};

async fn wait_pod(
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    pred: impl Fn(Option<&Pod>) -> bool,
) -> Option<Pod> {
    let start = Instant::now();
    loop {
        let pod = pods.get_opt(name).await.expect("get pod");
        if pred(pod.as_ref()) {
            return pod;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "pod {name} never reached {what}: {pod:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn phase(p: Option<&Pod>) -> Option<String> {
    p?.status.as_ref()?.phase.clone()
}

fn pod(name: &str, annotations: serde_json::Value, owner: Option<&ConfigMap>) -> Pod {
    let owners = owner.map(|o| {
        serde_json::json!([{
            "apiVersion": "v1", "kind": "ConfigMap", "name": o.name_any(),
            "uid": o.uid().unwrap(), "blockOwnerDeletion": true,
        }])
    });
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "annotations": annotations, "ownerReferences": owners },
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{ "key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule" }],
            "containers": [{ "name": "main", "image": "busybox",
                "resources": { "requests": { "cpu": "100m", "memory": "64Mi" } } }],
        },
    }))
    .unwrap()
}

async fn setup() -> Option<(Client, support::TestNamespace)> {
    let Some(cp) = support::control_plane() else {
        support::record_skip("tests/controlplane.rs");
        return None;
    };
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "cp").await;
    Some((client, ns))
}

#[tokio::test]
async fn kwok_nodes_are_ready() {
    let Some((client, _ns)) = setup().await else {
        return;
    };
    let nodes = Api::<Node>::all(client)
        .list(&ListParams::default())
        .await
        .unwrap();
    let kwok: Vec<&Node> = nodes
        .items
        .iter()
        .filter(|n| n.name_any().starts_with("kwok-node-"))
        .collect();
    assert!(
        kwok.len() >= 4,
        "expected 4 kwok nodes, found {}",
        kwok.len()
    );
    for n in kwok {
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        assert!(ready, "node {} is not Ready", n.name_any());
    }
}

#[tokio::test]
async fn pod_is_scheduled_runs_and_exits_with_the_annotated_code() {
    let Some((client, ns)) = setup().await else {
        return;
    };
    let pods = Api::<Pod>::namespaced(client, &ns.name);
    let annotations = serde_json::json!({
        "managedjobs.dev/complete-after": "1s", "managedjobs.dev/exit-code": "3"
    });
    pods.create(&PostParams::default(), &pod("exits-3", annotations, None))
        .await
        .unwrap();
    let running = wait_pod(&pods, "exits-3", "Running on a kwok node", |p| {
        phase(p).as_deref() == Some("Running")
    })
    .await
    .unwrap();
    let node = running.spec.unwrap().node_name.unwrap();
    assert!(node.starts_with("kwok-node-"), "scheduled onto {node}");
    let failed = wait_pod(&pods, "exits-3", "Failed", |p| {
        phase(p).as_deref() == Some("Failed")
    })
    .await
    .unwrap();
    let code = failed.status.unwrap().container_statuses.unwrap()[0]
        .state
        .as_ref()
        .unwrap()
        .terminated
        .as_ref()
        .unwrap()
        .exit_code;
    assert_eq!(code, 3);

    let ok = serde_json::json!({ "managedjobs.dev/complete-after": "500ms" });
    pods.create(&PostParams::default(), &pod("exits-0", ok, None))
        .await
        .unwrap();
    wait_pod(&pods, "exits-0", "Succeeded", |p| {
        phase(p).as_deref() == Some("Succeeded")
    })
    .await;
}

#[tokio::test]
async fn deleting_the_owner_garbage_collects_the_pod() {
    let Some((client, ns)) = setup().await else {
        return;
    };
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns.name);
    let owner: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "owner"}})).unwrap();
    let owner = cms.create(&PostParams::default(), &owner).await.unwrap();
    let pods = Api::<Pod>::namespaced(client, &ns.name);
    pods.create(
        &PostParams::default(),
        &pod("owned", serde_json::json!({}), Some(&owner)),
    )
    .await
    .unwrap();
    wait_pod(&pods, "owned", "Running", |p| {
        phase(p).as_deref() == Some("Running")
    })
    .await;
    cms.delete("owner", &DeleteParams::default()).await.unwrap();
    wait_pod(&pods, "owned", "garbage-collected", |p| p.is_none()).await;
}

#[tokio::test]
async fn eviction_sets_disruption_target() {
    let Some((client, ns)) = setup().await else {
        return;
    };
    let pods = Api::<Pod>::namespaced(client, &ns.name);
    pods.create(
        &PostParams::default(),
        &pod("evictee", serde_json::json!({}), None),
    )
    .await
    .unwrap();
    wait_pod(&pods, "evictee", "Running", |p| {
        phase(p).as_deref() == Some("Running")
    })
    .await;
    // Watch every version of the Pod from before the eviction: kwok deletes it right after the
    // API server sets the condition.
    let watch = {
        let pods = pods.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::watcher;
            let cfg = watcher::Config::default().fields("metadata.name=evictee");
            let mut stream = watcher(pods, cfg).boxed();
            let mut reason = None;
            while let Some(Ok(event)) = stream.next().await {
                match event {
                    watcher::Event::Apply(p)
                    | watcher::Event::InitApply(p)
                    | watcher::Event::Delete(p) => {
                        let gone = p.metadata.deletion_timestamp.is_some();
                        let conds = p.status.and_then(|s| s.conditions).unwrap_or_default();
                        if let Some(c) = conds
                            .iter()
                            .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")
                        {
                            reason = c.reason.clone();
                        }
                        if reason.is_some() && gone {
                            break;
                        }
                    }
                    watcher::Event::InitDone => {}
                    watcher::Event::Init => {}
                }
            }
            reason
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    pods.evict("evictee", &kube::api::EvictParams::default())
        .await
        .expect("the Eviction API accepts");
    let reason = tokio::time::timeout(Duration::from_secs(60), watch)
        .await
        .expect("the evicted Pod is deleted")
        .unwrap();
    assert_eq!(reason.as_deref(), Some("EvictionByEvictionAPI"));
    wait_pod(&pods, "evictee", "deleted", |p| p.is_none()).await;
}
