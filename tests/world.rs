//! Issue 21, "no workload without its job, no job without an end", on the real dev control
//! plane: faults at the edges of the named scenarios (restarts, lost stores, refused and stuck
//! Pods). Each test is one small input of a class of faults and counts what must never happen
//! over the whole run (every Pod name a watch saw, every process start in a file), not only
//! what is left at the end.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, PostParams};
use managed_jobs::api::{JobPhase, LABEL_SHARD, ManagedJob};

const T: Duration = Duration::from_secs(90);

fn pod_job_yaml(name: &str, complete_after: &str, extra_spec: &str) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
{extra_spec}  template:
    metadata:
      annotations: {{"managedjobs.dev/complete-after": "{complete_after}"}}
    spec:
      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: 100m
              memory: 64Mi
"#
    )
}

/// Class 6, two jobs can want one Pod name: two shards share a namespace; their jobs' names
/// share their first 59 characters and each shard gives its job id 1. Both run, each in a Pod
/// of its own (a name of at most 63 characters), and no other Pod is ever seen.
#[tokio::test]
async fn two_shards_jobs_with_one_name_prefix_and_one_id_get_a_pod_each() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podnames").await;
    let _a = support::OperatorProcess::start(cp, &ns.name, &["--shard", "a"]);
    let _b = support::OperatorProcess::start(cp, &ns.name, &["--shard", "b"]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let prefix = "n".repeat(59);
    let jobs = [(format!("{prefix}-a"), "a"), (format!("{prefix}-b"), "b")];
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    for (name, shard) in &jobs {
        let mut mj: ManagedJob = serde_norway::from_str(&pod_job_yaml(name, "2s", "")).unwrap();
        mj.labels_mut()
            .insert(LABEL_SHARD.into(), shard.to_string());
        api.create(&PostParams::default(), &mj).await.unwrap();
    }
    let started = Instant::now();
    let mut expected = BTreeSet::new();
    for (name, _) in &jobs {
        let done = support::wait_status(&client, &ns.name, name, T, "Succeeded", |s| {
            s.phase.is_some_and(|p| p.is_terminal())
        })
        .await;
        let s = done.status.unwrap();
        assert_eq!(
            s.phase,
            Some(JobPhase::Succeeded),
            "{name}: {:?}",
            s.message
        );
        assert_eq!((s.job_id, s.attempt), (Some(1), 1), "{name}");
        expected.insert(support::pod_name(&client, &ns.name, name, 1).await);
    }
    let took = started.elapsed();
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(seen, expected, "one Pod per job, never shared");
    assert!(seen.iter().all(|n| n.len() <= 63), "{seen:?}");
    println!("both jobs succeeded {took:?} after their creation");
}

/// A ValidatingWebhookConfiguration that fails every Pod create in one namespace with HTTP 500
/// (its endpoint does not answer; failurePolicy Fail), deleted when dropped.
struct FailingWebhook {
    cp: &'static support::ControlPlane,
    name: String,
}

impl FailingWebhook {
    async fn install(client: &kube::Client, cp: &'static support::ControlPlane, ns: &str) -> Self {
        let name = format!("{ns}.fail.managedjobs.test");
        let yaml = format!(
            r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: {name}
webhooks:
  - name: {name}
    clientConfig:
      url: https://127.0.0.1:9/refuse
    rules:
      - apiGroups: [""]
        apiVersions: ["v1"]
        operations: ["CREATE"]
        resources: ["pods"]
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {ns}
    failurePolicy: Fail
    sideEffects: None
    admissionReviewVersions: ["v1"]
    timeoutSeconds: 1
"#
        );
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), yaml).unwrap();
        let (ok, out) = support::kubectl(cp, &["apply", "-f", file.path().to_str().unwrap()]);
        assert!(ok, "installing the webhook: {out}");
        let hook = FailingWebhook { cp, name };
        // In force once a probe Pod is refused with 500.
        let start = Instant::now();
        while probe_pod(client, ns).await != Some(500) {
            assert!(start.elapsed() < T, "the webhook never took effect");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        hook
    }

    /// Removes it and waits until Pods can be created again.
    async fn remove(self, client: &kube::Client, ns: &str) {
        let (ok, out) = support::kubectl(
            self.cp,
            &["delete", "validatingwebhookconfiguration", &self.name],
        );
        assert!(ok, "{out}");
        let start = Instant::now();
        while probe_pod(client, ns).await.is_some() {
            assert!(start.elapsed() < T, "Pods were never accepted again");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for FailingWebhook {
    fn drop(&mut self) {
        support::kubectl(
            self.cp,
            &[
                "delete",
                "validatingwebhookconfiguration",
                &self.name,
                "--ignore-not-found",
            ],
        );
    }
}

/// Name of the probe Pods [`probe_pod`] creates.
const PROBE: &str = "probe";

/// Tries to create (then deletes) a Pod `probe` in `ns`: None when it was accepted, else the
/// API's error code.
async fn probe_pod(client: &kube::Client, ns: &str) -> Option<u16> {
    let api = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns);
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": PROBE},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], "nodeName": "no-such-node"}
    }))
    .unwrap();
    match api.create(&PostParams::default(), &pod).await {
        Ok(_) => {
            let _ = api
                .delete(
                    PROBE,
                    &kube::api::DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                )
                .await;
            None
        }
        Err(kube::Error::Api(e)) => Some(e.code),
        Err(_) => Some(0),
    }
}

/// Class 5, a launch that keeps failing: the API answers every Pod create with HTTP 500 (a
/// failing admission webhook). The retries count against the launch deadline
/// (`launchTimeoutSeconds: 3`: requeued once, then FailedNoResource naming CreateFailed), and
/// stop at once on a cancel and on a delete. Once the API accepts Pods again, none is ever
/// created for the cancelled or the deleted job: no job Pod is seen over the whole test.
#[tokio::test]
async fn a_create_the_api_keeps_failing_is_bounded_and_cancellable() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "createfails").await;
    let hook = FailingWebhook::install(&client, cp, &ns.name).await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--max-launch-timeouts", "2"]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    support::create_yaml(
        &client,
        &ns.name,
        &pod_job_yaml("bounded", "1s", "  launchTimeoutSeconds: 3\n"),
    )
    .await;
    for name in ["cancelled", "deleted"] {
        support::create_yaml(&client, &ns.name, &pod_job_yaml(name, "1s", "")).await;
    }
    // Each says why it waits.
    for name in ["bounded", "cancelled", "deleted"] {
        support::wait_status(&client, &ns.name, name, T, "a failing create", |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("failed, trying again") && m.contains("500"))
        })
        .await;
    }
    let asked = Instant::now();
    support::cancel(&client, &ns.name, "cancelled").await;
    support::delete(&client, &ns.name, "deleted").await;
    support::wait_status(
        &client,
        &ns.name,
        "cancelled",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    support::wait_gone(&client, &ns.name, "deleted", T).await;
    let stopped = asked.elapsed();
    let bounded = support::wait_status(&client, &ns.name, "bounded", T, "a final phase", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await
    .status
    .unwrap();
    assert_eq!(
        bounded.phase,
        Some(JobPhase::FailedNoResource),
        "{:?}",
        bounded.message
    );
    assert_eq!(bounded.failure_reason.as_deref(), Some("CreateFailed"));
    let message = bounded.message.unwrap_or_default();
    assert!(
        message.contains("did not start within 3 s") && message.contains("500"),
        "{message}"
    );
    assert_eq!(bounded.attempt, 2, "one requeue, then the end");
    // The API accepts Pods again: nothing is created for the cancelled or deleted job.
    hook.remove(&client, &ns.name).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    watch.abort();
    let seen: BTreeSet<String> = names
        .lock()
        .unwrap()
        .iter()
        .filter(|n| *n != PROBE)
        .cloned()
        .collect();
    assert!(seen.is_empty(), "Pods created: {seen:?}");
    assert!(
        stopped < Duration::from_secs(20),
        "the cancel and the delete took {stopped:?}"
    );
    println!("cancel and delete done {stopped:?} after they were asked");
}
