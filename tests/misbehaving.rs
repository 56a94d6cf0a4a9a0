//! Workloads that misbehave, on the real dev control plane (see the shared `pod-fates.md` for
//! how each fate is produced): a Pod the node refuses, a Pod whose labels are edited, an object
//! whose name is as long as the API allows. Every Pod name a watch saw is counted.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use managed_jobs::api::JobPhase;

const T: Duration = Duration::from_secs(90);

fn pod_job(name: &str, complete_after: &str, restarts: i32) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  recovery:
    maxRestartsOnErrors: {restarts}
  template:
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

/// Plays the kubelet: Pod `pod`'s container `main` waits with `reason` and `message`.
async fn play_waiting(client: &Client, ns: &str, pod: &str, reason: &str, message: &str) {
    let patch = serde_json::json!({"status": {"phase": "Pending", "containerStatuses": [{
        "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": message}}
    }]}});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("status patch");
}

async fn wait_pod(client: &Client, ns: &str, name: &str) -> Pod {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let start = std::time::Instant::now();
    loop {
        if let Ok(Some(p)) = api.get_opt(name).await {
            return p;
        }
        assert!(start.elapsed() < T, "Pod {name} never appeared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The node refuses the Pod at admission (`OutOfcpu`, no container ever ran): a workload error
/// that uses maxRestartsOnErrors and backs off, never a tight relaunch loop. With one restart
/// allowed: two Pods, then Failed naming the node's reason and message.
#[tokio::test]
async fn a_pod_the_node_refuses_is_a_failure_not_a_relaunch_loop() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "refused").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let mj = support::create_yaml(&client, &ns.name, &pod_job("refused", "60s", 1)).await;
    let _ = mj;
    let _id = support::wait_job_id(&client, &ns.name, "refused", T).await;
    let api = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let refuse = serde_json::json!({"status": {"phase": "Failed", "reason": "OutOfcpu",
        "message": "Pod was rejected: Node didn't have enough resource: cpu", "containerStatuses": null}});
    for attempt in 1..=2 {
        let name = support::pod_name(&client, &ns.name, "refused", attempt).await;
        wait_pod(&client, &ns.name, &name).await;
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&refuse))
            .await
            .expect("status patch");
    }
    let done = support::wait_status(&client, &ns.name, "refused", T, "Failed", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Failed), "{:?}", s.message);
    assert_eq!(s.failure_reason.as_deref(), Some("OutOfcpu"));
    let message = s.message.unwrap_or_default();
    assert!(
        message.contains("refused by its node") && message.contains("enough resource"),
        "{message}"
    );
    assert_eq!((s.restart_count, s.recovery_count, s.attempt), (1, 0, 2));
    tokio::time::sleep(Duration::from_secs(1)).await;
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([
            support::pod_name(&client, &ns.name, "refused", 1).await,
            support::pod_name(&client, &ns.name, "refused", 2).await,
        ]),
        "one Pod per allowed attempt, no relaunch loop"
    );
}

/// Removing a Pod's job-id label makes the label-filtered watch report it deleted; it must not
/// be taken as lost (no second Pod), and the job ends normally once the label is back.
#[tokio::test]
async fn a_relabelled_pod_is_not_taken_as_deleted() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "relabel").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &pod_job("relabel", "15s", 0)).await;
    let running = support::wait_status(
        &client,
        &ns.name,
        "relabel",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let id = running.status.unwrap().job_id.unwrap();
    let pod = support::pod_name(&client, &ns.name, "relabel", 1).await;
    let (ok, out) = support::kubectl(
        cp,
        &[
            "label",
            "-n",
            &ns.name,
            "pod",
            &pod,
            "managedjobs.dev/job-id-",
        ],
    );
    assert!(ok, "{out}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // An operator restart meanwhile: its first list misses the unlabelled Pod.
    op.terminate();
    op.start_again();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (ok, out) = support::kubectl(
        cp,
        &[
            "label",
            "-n",
            &ns.name,
            "pod",
            &pod,
            &format!("managedjobs.dev/job-id={id}"),
        ],
    );
    assert!(ok, "{out}");
    let done = support::wait_status(&client, &ns.name, "relabel", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!((s.recovery_count, s.attempt), (0, 1));
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(seen, BTreeSet::from([pod]), "no second Pod");
}

/// A ManagedJob whose name is as long as the API allows (253 characters) still gets its Events:
/// their names are cut to fit.
#[tokio::test]
async fn a_job_with_the_longest_name_gets_its_events() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "longname").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let name = format!("{}.{}", "a".repeat(126), "b".repeat(126));
    assert_eq!(name.len(), 253);
    let yaml = format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  run: \"true\"\n"
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    support::wait_status(
        &client,
        &ns.name,
        &name,
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    support::wait_event(&client, &ns.name, &name, "Succeeded", T).await;
}

/// A container the kernel OOM-killed fails the attempt whatever its exit code, even in a Pod
/// that ends Succeeded; the message names the container.
#[tokio::test]
async fn an_oom_killed_container_fails_the_attempt_whatever_its_exit_code() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "oom").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(&client, &ns.name, &pod_job("oom", "60s", 0)).await;
    let running = support::wait_status(
        &client,
        &ns.name,
        "oom",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let _id = running.status.unwrap().job_id.unwrap();
    let now = "2026-01-01T00:00:00Z";
    let patch = serde_json::json!({"status": {"phase": "Succeeded", "containerStatuses": [{
        "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "OOMKilled", "startedAt": now, "finishedAt": now}}
    }]}});
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .patch_status(
            &support::pod_name(&client, &ns.name, "oom", 1).await,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("status patch");
    let done = support::wait_status(&client, &ns.name, "oom", T, "Failed", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Failed), "{:?}", s.message);
    assert_eq!(s.failure_reason.as_deref(), Some("OOMKilled"));
    assert_eq!(s.exit_code, Some(0));
    let message = s.message.unwrap_or_default();
    assert!(
        message.contains("container main was OOM-killed"),
        "{message}"
    );
}

/// A NUL byte in a script or an env value is refused by the API, naming the field.
#[tokio::test]
async fn nul_bytes_are_refused_at_the_api_naming_the_field() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nul").await;
    let api: Api<managed_jobs::api::ManagedJob> = Api::namespaced(client.clone(), &ns.name);
    let cases = [
        ("nul-run", "spec.run", "echo a\u{0}b", None),
        ("nul-env", "spec.env[0].value", "true", Some("x\u{0}y")),
    ];
    for (name, field, run, env) in cases {
        let mut spec = managed_jobs::api::ManagedJobSpec {
            run: Some(run.into()),
            ..Default::default()
        };
        if let Some(value) = env {
            spec.env = vec![managed_jobs::api::EnvVar {
                name: "VAR".into(),
                value: value.into(),
            }];
        }
        let mj = managed_jobs::api::ManagedJob::new(name, spec);
        let err = api
            .create(&kube::api::PostParams::default(), &mj)
            .await
            .expect_err("a NUL byte must be refused");
        let text = err.to_string();
        assert!(
            text.contains(field),
            "{name}: the error does not name {field}: {text}"
        );
    }
}

/// A Pod the kubelet can never start (an invalid image name) fails the job at once with
/// FailedPrecheck and the kubelet's message, and the Pod is removed: no retry can help.
#[tokio::test]
async fn a_pod_that_can_never_start_fails_its_precheck_at_once() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "unstartable").await;
    // Bound to a node nobody runs: the test plays its kubelet. (A Node that does not exist
    // would lose the Pod at once, `docs/reference/pod-fates.md`; this one is not Ready, and
    // the grace keeps it from losing the Pod while the test runs.)
    let node = DeadNode::create(&client, cp, "mj-unstartable-node").await;
    let _op = support::OperatorProcess::start(
        cp,
        &ns.name,
        &["--node-lost-grace-seconds", DEAD_NODE_GRACE],
    );
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let yaml = pod_job("unstartable", "60s", 2).replace(
        "      containers:",
        &format!("      nodeName: {}\n      containers:", node.name),
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let _id = support::wait_job_id(&client, &ns.name, "unstartable", T).await;
    let pod = support::pod_name(&client, &ns.name, "unstartable", 1).await;
    wait_pod(&client, &ns.name, &pod).await;
    play_waiting(
        &client,
        &ns.name,
        &pod,
        "InvalidImageName",
        "Failed to apply default image tag \"BAD!\": couldn't parse image name",
    )
    .await;
    let done = support::wait_status(&client, &ns.name, "unstartable", T, "FailedPrecheck", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::FailedPrecheck), "{:?}", s.message);
    assert_eq!(s.failure_reason.as_deref(), Some("InvalidImageName"));
    let message = s.message.unwrap_or_default();
    assert!(
        message.contains("container main") && message.contains("couldn't parse"),
        "{message}"
    );
    assert_eq!((s.restart_count, s.attempt), (0, 1), "no retry");
    let api = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let start = std::time::Instant::now();
    while api.get_opt(&pod).await.unwrap().is_some() {
        assert!(start.elapsed() < T, "the Pod was left behind");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.abort();
    assert_eq!(
        names.lock().unwrap().clone(),
        BTreeSet::from([pod]),
        "one Pod"
    );
}

/// A Pod bound to a node that never starts it (here a node that does not exist, then an image
/// that cannot be pulled) holds its launch slot only until its launch deadline: with a launch cap
/// of 1, another job launches meanwhile; the stuck attempt's Pod is removed and the job requeued
/// with back-off, and the second timeout in a row (`--max-launch-timeouts 2`) ends it
/// FailedNoResource naming what it waited on. Neither a restart nor a recovery is counted.
#[tokio::test]
async fn a_pod_that_never_starts_gives_its_launch_slot_back_then_fails_no_resource() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "neverstarts").await;
    // Bound to a node that never starts it (not Ready; within the grace, not lost).
    let node = DeadNode::create(&client, cp, "mj-neverstarts-node").await;
    let _op = support::OperatorProcess::start(
        cp,
        &ns.name,
        // A back-off the scheduler's pass after the timeout cannot miss, even on a loaded
        // machine: the other job is admitted during it (the back-off counts from the stuck
        // Pod's removal).
        &[
            "--launch-cap",
            "1",
            "--max-launch-timeouts",
            "2",
            "--restart-backoff-seconds",
            "2",
            "--node-lost-grace-seconds",
            DEAD_NODE_GRACE,
        ],
    );
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let stuck = pod_job("stuck", "60s", 3)
        .replace(
            "spec:\n  recovery:",
            "spec:\n  launchTimeoutSeconds: 6\n  recovery:",
        )
        .replace(
            "      containers:",
            &format!("      nodeName: {}\n      containers:", node.name),
        );
    support::create_yaml(&client, &ns.name, &stuck).await;
    let _id = support::wait_status(&client, &ns.name, "stuck", T, "Starting", |s| {
        s.phase == Some(JobPhase::Starting)
    })
    .await
    .status
    .unwrap()
    .job_id
    .unwrap();
    // The only launch slot is held by the stuck job; this one must still get it.
    support::create_yaml(&client, &ns.name, &pod_job("quick", "1s", 0)).await;
    // The second attempt's Pod plays a kubelet that cannot pull the image.
    let second = support::pod_name(&client, &ns.name, "stuck", 2).await;
    wait_pod(&client, &ns.name, &second).await;
    play_waiting(
        &client,
        &ns.name,
        &second,
        "ImagePullBackOff",
        "Back-off pulling image \"busybox\"",
    )
    .await;
    let done = support::wait_status(&client, &ns.name, "stuck", T, "FailedNoResource", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::FailedNoResource), "{:?}", s.message);
    assert_eq!(s.failure_reason.as_deref(), Some("ImagePullBackOff"));
    let message = s.message.clone().unwrap_or_default();
    assert!(
        message.contains("did not start within 6 s")
            && message.contains("Back-off pulling image")
            && message.contains("2 launch timeouts in a row"),
        "{message}"
    );
    assert_eq!((s.attempt, s.restart_count, s.recovery_count), (2, 0, 0));
    let quick = support::wait_status(
        &client,
        &ns.name,
        "quick",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await
    .status
    .unwrap();
    assert!(
        quick.started_at.unwrap().0 < s.finished_at.unwrap().0,
        "the other job launched while the stuck one waited"
    );
    // Both stuck Pods are removed; each attempt had one Pod.
    let api = Api::<Pod>::namespaced(client.clone(), &ns.name);
    for pod in [
        support::pod_name(&client, &ns.name, "stuck", 1).await,
        second.clone(),
    ] {
        let start = std::time::Instant::now();
        while api.get_opt(&pod).await.unwrap().is_some() {
            assert!(start.elapsed() < T, "{pod} was left behind");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // A Warning Event says why the first attempt was abandoned.
    let e = support::wait_event(&client, &ns.name, "stuck", "LaunchTimedOut", T).await;
    let note = e.message.clone().unwrap_or_default();
    assert!(note.contains(&node.name), "{note}");
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    watch.abort();
    let seen: BTreeSet<String> = names
        .lock()
        .unwrap()
        .iter()
        .filter(|n| n.starts_with("stuck-"))
        .cloned()
        .collect();
    assert_eq!(
        seen,
        BTreeSet::from([
            support::pod_name(&client, &ns.name, "stuck", 1).await,
            second
        ])
    );
}

/// `--node-lost-grace-seconds` of the tests that play a [`DeadNode`]'s kubelet: longer than
/// they run, so that the node's Pods are never lost to it meanwhile (`tests/nodes.rs` tests
/// that).
const DEAD_NODE_GRACE: &str = "600";

/// A Node nobody runs (no kwok annotation), marked NotReady: Pods bound to it never start and,
/// once deleted, stay Terminating (pod-fates.md). Deleted when dropped, even if the test fails.
/// An operator lets its Pods be lost to it after `--node-lost-grace-seconds`: tests that play
/// its kubelet give [`DEAD_NODE_GRACE`].
struct DeadNode {
    cp: &'static support::ControlPlane,
    name: String,
}

impl DeadNode {
    async fn create(client: &Client, cp: &'static support::ControlPlane, prefix: &str) -> DeadNode {
        use k8s_openapi::api::core::v1::Node;
        let name = format!("{prefix}-{}", std::process::id());
        let api = Api::<Node>::all(client.clone());
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"managedjobs.dev/test": "dead-node"}},
        }))
        .unwrap();
        let _ = api.delete(&name, &Default::default()).await;
        api.create(&Default::default(), &node).await.expect("node");
        let now = jiff::Timestamp::now().to_string();
        let not_ready = serde_json::json!({"status": {"conditions": [{
            "type": "Ready", "status": "False", "reason": "KubeletStopped",
            "message": "the test plays a dead kubelet", "lastHeartbeatTime": now,
            "lastTransitionTime": now}]}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&not_ready))
            .await
            .expect("node status");
        DeadNode { cp, name }
    }
}

impl Drop for DeadNode {
    fn drop(&mut self) {
        let _ = support::kubectl(self.cp, &["delete", "node", &self.name, "--wait=false"]);
    }
}

/// A Pod deleted on a node that never confirms (NotReady) stays Terminating. It no longer
/// counts as running: the job shows Recovering naming the Pod and its node, and once the Pod
/// outlives its grace period plus the margin it is force-deleted and the job recovers (one new
/// Pod). Cancel and delete finish the same way instead of waiting forever, and the Events say so.
#[tokio::test]
async fn a_pod_stuck_terminating_is_not_running_and_never_hangs_cancel_or_delete() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "terminating").await;
    let node = DeadNode::create(&client, cp, "mj-dead-node").await;
    let _op = support::OperatorProcess::start(
        cp,
        &ns.name,
        &["--node-lost-grace-seconds", DEAD_NODE_GRACE],
    );
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let on_dead_node = |name: &str| {
        pod_job(name, "600s", 0).replace(
            "      containers:",
            &format!(
                "      nodeName: {}\n      terminationGracePeriodSeconds: 1\n      containers:",
                node.name
            ),
        )
    };
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let mut ids = Vec::new();
    for name in ["evicted", "cancelled"] {
        support::create_yaml(&client, &ns.name, &on_dead_node(name)).await;
        let id = support::wait_job_id(&client, &ns.name, name, T).await;
        // Play the kubelet once: the Pod runs.
        let pod = support::pod_name(&client, &ns.name, name, 1).await;
        wait_pod(&client, &ns.name, &pod).await;
        let running = serde_json::json!({"status": {"phase": "Running", "containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
            "state": {"running": {"startedAt": jiff::Timestamp::now().to_string()}}}]}});
        pods.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&running))
            .await
            .expect("status patch");
        support::wait_status(
            &client,
            &ns.name,
            name,
            T,
            "Running",
            support::phase_is(JobPhase::Running),
        )
        .await;
        ids.push(id);
    }
    let _ = (ids[0], ids[1]);

    // Someone else deletes the running Pod: nobody confirms, it stays Terminating.
    let first = support::pod_name(&client, &ns.name, "evicted", 1).await;
    pods.delete(&first, &Default::default())
        .await
        .expect("delete");
    support::cancel(&client, &ns.name, "cancelled").await;
    let shown = support::wait_status(&client, &ns.name, "evicted", T, "Recovering", |s| {
        s.phase == Some(JobPhase::Recovering)
    })
    .await
    .status
    .unwrap();
    let message = shown.message.unwrap_or_default();
    assert!(
        message.contains(&first) && message.contains(&node.name) && message.contains("terminating"),
        "{message}"
    );
    let cancelling = support::wait_status(&client, &ns.name, "cancelled", T, "Cancelling", |s| {
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("to terminate"))
    })
    .await
    .status
    .unwrap();
    assert_eq!(cancelling.phase, Some(JobPhase::Cancelling));
    assert!(
        cancelling.message.unwrap().contains(&node.name),
        "the message names the node"
    );

    // Past grace + margin on a node that is not Ready: forced, then recovered with one new Pod.
    let second = support::pod_name(&client, &ns.name, "evicted", 2).await;
    wait_pod(&client, &ns.name, &second).await;
    let s = support::wait_status(&client, &ns.name, "evicted", T, "recovery 1", |s| {
        s.recovery_count == 1
    })
    .await
    .status
    .unwrap();
    assert_eq!(s.attempt, 2);
    assert!(
        pods.get_opt(&first).await.unwrap().is_none(),
        "{first} was forced"
    );
    let done = support::wait_status(
        &client,
        &ns.name,
        "cancelled",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await
    .status
    .unwrap();
    assert!(
        done.message.unwrap_or_default().contains("force-deleted"),
        "the final message says the Pod was forced"
    );

    // Deleting the object ends the same way: its new Pod (never started) is removed too.
    support::delete(&client, &ns.name, "evicted").await;
    support::wait_gone(&client, &ns.name, "evicted", T).await;

    let start = std::time::Instant::now();
    loop {
        let evicted = support::events_about(&client, &ns.name, "evicted").await;
        let cancelled = support::events_about(&client, &ns.name, "cancelled").await;
        let note = |events: &[Event], reason: &str| {
            events
                .iter()
                .filter(|e| e.reason.as_deref() == Some(reason))
                .filter_map(|e| e.message.clone())
                .collect::<Vec<_>>()
                .join(" | ")
        };
        let terminating = note(&evicted, "PodTerminating");
        let recovered = note(&evicted, "Recovering");
        let cancel = note(&cancelled, "Cancelled");
        if terminating.contains(&first)
            && recovered.contains("force-deleted")
            && cancel.contains("force-deleted")
        {
            break;
        }
        assert!(
            start.elapsed() < T,
            "Events: PodTerminating {terminating:?}, Recovering {recovered:?}, Cancelled {cancel:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([
            first,
            second,
            support::pod_name(&client, &ns.name, "cancelled", 1).await
        ]),
        "one Pod per attempt"
    );
}

/// An object too big to hold its status is refused at `kubectl apply`, naming the field: the
/// env's names and values are bounded in all (256 KiB), not only one by one.
#[tokio::test]
async fn an_object_too_big_for_its_status_is_refused_at_the_api() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "toobig").await;
    let api = Api::<managed_jobs::api::ManagedJob>::namespaced(client.clone(), &ns.name);
    let job = |name: &str, vars: usize| {
        let spec = managed_jobs::api::ManagedJobSpec {
            run: Some("true".into()),
            env: (0..vars)
                .map(|i| managed_jobs::api::EnvVar {
                    name: format!("V{i}"),
                    value: "x".repeat(32_000),
                })
                .collect(),
            ..Default::default()
        };
        managed_jobs::api::ManagedJob::new(name, spec)
    };
    let err = api
        .create(&Default::default(), &job("big", 9))
        .await
        .expect_err("288 KB of env must be refused");
    let text = err.to_string();
    assert!(
        text.contains("spec.env") && text.contains("262144"),
        "{text}"
    );
    api.create(&Default::default(), &job("fits", 8))
        .await
        .expect("256 KB of env fits");
    // Bounds are in bytes (what the kernel and etcd count), not characters.
    let refused = |mut mj: managed_jobs::api::ManagedJob, field: &'static str| {
        let api = api.clone();
        async move {
            mj.metadata.name = Some(format!("u{}", field.len()));
            let err = api
                .create(&Default::default(), &mj)
                .await
                .expect_err("must be refused");
            let text = err.to_string();
            assert!(text.contains(field), "{field}: {text}");
        }
    };
    let mut wide = job("wide", 0);
    wide.spec.env = (0..9)
        .map(|i| managed_jobs::api::EnvVar {
            name: format!("V{i}"),
            value: "é".repeat(16_000),
        })
        .collect();
    refused(wide, "262144").await;
    let mut one = job("one", 0);
    one.spec.env = vec![managed_jobs::api::EnvVar {
        name: "E".into(),
        value: "😀".repeat(32_768),
    }];
    refused(one, "spec.env[].value").await;
    let mut script = job("script", 0);
    script.spec.run = Some("é".repeat(40_000));
    refused(script, "spec.run").await;
}

/// A ValidatingAdmissionPolicy that refuses one object's status writes (cluster-scoped: deleted
/// when dropped, even if the test fails).
struct RefuseStatus {
    cp: &'static support::ControlPlane,
    name: String,
}

impl RefuseStatus {
    fn create(cp: &'static support::ControlPlane, ns: &str, object: &str) -> RefuseStatus {
        let name = format!("mj-test-refuse-status-{ns}");
        let yaml = format!(
            r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {name}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["managedjobs.dev"]
        apiVersions: ["*"]
        operations: ["UPDATE"]
        resources: ["managedjobs/status"]
  validations:
    - expression: "object.metadata.name != '{object}'"
      message: "this test refuses the status of {object}"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {name}
spec:
  policyName: {name}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {ns}
"#
        );
        let path = std::env::temp_dir().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let (ok, out) = support::kubectl(cp, &["apply", "-f", path.to_str().unwrap()]);
        assert!(ok, "{out}");
        RefuseStatus {
            cp,
            name: name.clone(),
        }
    }
}

impl Drop for RefuseStatus {
    fn drop(&mut self) {
        for kind in [
            "validatingadmissionpolicybinding",
            "validatingadmissionpolicy",
        ] {
            let _ = support::kubectl(self.cp, &["delete", kind, &self.name, "--wait=false"]);
        }
    }
}

fn metric(port: u16, name: &str) -> f64 {
    let (_, body) = support::http_get(port, "/metrics");
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A status the API keeps refusing is retried with a per-job back-off (never faster), says so
/// in a Warning Event, and holds back no other job's status.
#[tokio::test]
async fn a_status_the_api_refuses_backs_off_and_says_so() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "refusestatus").await;
    let _policy = RefuseStatus::create(cp, &ns.name, "refused");
    // Admission policies take a moment to load.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let port = support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--metrics-addr", &addr]);
    let local = |name: &str| {
        format!(
            "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  run: \"sleep 1\"\n"
        )
    };
    support::create_yaml(&client, &ns.name, &local("refused")).await;
    support::create_yaml(&client, &ns.name, &local("fine")).await;
    support::wait_status(
        &client,
        &ns.name,
        "fine",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    let e = support::wait_event(&client, &ns.name, "refused", "StatusWriteFailed", T).await;
    let note = e.message.clone().unwrap_or_default();
    assert!(note.contains("this test refuses"), "{note}");
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    // Back-off 1, 2, 4, 8... s: at most 5 more tries in 16 s (a fixed 1.3 s retry made 12).
    let before = metric(port, "managedjobs_status_write_failures_total");
    tokio::time::sleep(Duration::from_secs(16)).await;
    let tries = metric(port, "managedjobs_status_write_failures_total") - before;
    assert!(tries <= 5.0, "{tries} status writes in 16 s");
    let s = Api::<managed_jobs::api::ManagedJob>::namespaced(client.clone(), &ns.name)
        .get("refused")
        .await
        .unwrap()
        .status;
    assert!(
        s.and_then(|s| s.phase).is_none_or(|p| !p.is_terminal()),
        "the refused status was never written"
    );
}
