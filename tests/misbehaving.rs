//! Workloads that misbehave, on the real dev control plane (see the shared `pod-fates.md` for
//! how each fate is produced): a Pod the node refuses, a Pod whose labels are edited, an object
//! whose name is as long as the API allows. Every Pod name a watch saw is counted.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
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
    let id = support::wait_status(&client, &ns.name, "refused", T, "a job id", |s| {
        s.job_id.is_some()
    })
    .await
    .status
    .unwrap()
    .job_id
    .unwrap();
    let api = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let refuse = serde_json::json!({"status": {"phase": "Failed", "reason": "OutOfcpu",
        "message": "Pod was rejected: Node didn't have enough resource: cpu", "containerStatuses": null}});
    for attempt in 1..=2 {
        let name = format!("refused-{id}-{attempt}");
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
        BTreeSet::from([format!("refused-{id}-1"), format!("refused-{id}-2")]),
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
    let pod = format!("relabel-{id}-1");
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
    let api = Api::<Event>::namespaced(client.clone(), &ns.name);
    let start = std::time::Instant::now();
    loop {
        let events = api.list(&ListParams::default()).await.unwrap().items;
        let reasons: BTreeSet<String> = events
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name.as_str()))
            .filter_map(|e| e.reason.clone())
            .collect();
        if reasons.contains("Succeeded") {
            break;
        }
        assert!(
            start.elapsed() < T,
            "no Succeeded Event for the long name: {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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
    let id = running.status.unwrap().job_id.unwrap();
    let now = "2026-01-01T00:00:00Z";
    let patch = serde_json::json!({"status": {"phase": "Succeeded", "containerStatuses": [{
        "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 0, "reason": "OOMKilled", "startedAt": now, "finishedAt": now}}
    }]}});
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .patch_status(
            &format!("oom-{id}-1"),
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
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    // Bound to a node nobody runs: the test plays its kubelet.
    let yaml = pod_job("unstartable", "60s", 2).replace(
        "      containers:",
        "      nodeName: no-such-node\n      containers:",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let id = support::wait_status(&client, &ns.name, "unstartable", T, "a job id", |s| {
        s.job_id.is_some()
    })
    .await
    .status
    .unwrap()
    .job_id
    .unwrap();
    let pod = format!("unstartable-{id}-1");
    wait_pod(&client, &ns.name, &pod).await;
    let patch = serde_json::json!({"status": {"phase": "Pending", "containerStatuses": [{
        "name": "main", "image": "BAD!", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "InvalidImageName",
            "message": "Failed to apply default image tag \"BAD!\": couldn't parse image name"}}
    }]}});
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .patch_status(&pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("status patch");
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
