//! Failure rules users can state (issue 23, docs/design.md#failure-rules) on the dev control
//! plane: real kube-apiserver (CEL), kube-scheduler and kwok nodes for Pods, real processes
//! for local jobs. Each test counts what must never happen over its whole run: every Pod name a
//! watch saw, every process start written to a file.
//!
//! - (a) exit 2 with a fail rule: Failed after one attempt, the reason and message name the rule;
//! - (b) exit 75 with a recover rule and `maxRestartsOnErrors: 0`: relaunched 3 times, then
//!   Succeeded with restartCount 0 and recoveryCount 3; the metric counts them;
//! - (c) a pod job's sidecar exit code is ignored while main's decides;
//! - (d) a `DisruptionTarget` with a fail rule fails instead of recovering;
//! - (e) a local job that traps TERM saves its checkpoint on cancel (its whole tree), one that
//!   ignores TERM is killed after the grace; a Pod is deleted with the job's grace period and
//!   Cancelling says what it waits on;
//! - (f) a pipeline whose task 2 has its own rules;
//! - and the API refuses bad rules naming the field.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use managed_jobs::api::{JobPhase, ManagedJobStatus, TaskPhase};

const T: Duration = Duration::from_secs(60);

fn head(name: &str) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n"
    )
}

/// A pod job: `containers` (name, kwok annotations) and `spec_extra` lines under `spec:`.
fn pod_job(name: &str, annotations: &str, containers: &[&str], spec_extra: &str) -> String {
    let containers: String = containers
        .iter()
        .map(|c| format!("        - name: {c}\n          image: busybox\n"))
        .collect();
    format!(
        "{}{spec_extra}  template:\n    metadata:\n      annotations: {{{annotations}}}\n    spec:\n      containers:\n{containers}",
        head(name)
    )
}

fn terminal(s: &ManagedJobStatus) -> bool {
    s.phase.is_some_and(|p| p.is_terminal())
}

async fn wait_pod_running(client: &Client, ns: &str, name: &str) {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        if let Ok(p) = pods.get(name).await
            && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
        {
            return;
        }
        assert!(start.elapsed() < T, "Pod {name} never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Plays the kubelet: `pod` ends in `phase` with each container's (name, exit code).
async fn end_pod(client: &Client, ns: &str, pod: &str, phase: &str, exits: &[(&str, i32)]) {
    let now = jiff::Timestamp::now().to_string();
    let statuses: Vec<serde_json::Value> = exits
        .iter()
        .map(|(name, code)| {
            serde_json::json!({
                "name": name, "image": "busybox", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {
                    "exitCode": code, "reason": if *code == 0 { "Completed" } else { "Error" },
                    "startedAt": now, "finishedAt": now}}
            })
        })
        .collect();
    let patch = serde_json::json!({"status": {"phase": phase, "containerStatuses": statuses}});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("status patch");
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// (a) Exit 2 with a fail rule: Failed after one attempt (restarts were left), failureReason
/// `FailureRule`, the message, the attempt's record and the Failed Event naming the rule. A pod
/// job (kwok exits its container 2) and a local one; one Pod and one process start each.
#[tokio::test]
async fn a_fail_rule_fails_at_the_first_attempt_naming_the_rule() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rulefail").await;
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let rules = "  recovery:\n    maxRestartsOnErrors: 3\n  failurePolicy:\n    rules:\n      - name: config-error\n        action: FailJob\n        onExitCodes: {operator: In, values: [2]}\n";
    support::create_yaml(
        &client,
        &ns.name,
        &pod_job(
            "pod",
            r#""managedjobs.dev/complete-after": "1s", "managedjobs.dev/exit-code": "2""#,
            &["main"],
            rules,
        ),
    )
    .await;
    support::create_yaml(
        &client,
        &ns.name,
        &format!(
            "{}{rules}  env:\n    - name: STARTS\n      value: {}\n  run: |\n    echo start >> \"$STARTS\"\n    exit 2\n",
            head("local"),
            starts.display()
        ),
    )
    .await;
    for name in ["pod", "local"] {
        let s = support::wait_status(&client, &ns.name, name, T, "finished", terminal)
            .await
            .status
            .unwrap();
        assert_eq!(s.phase, Some(JobPhase::Failed), "{name}: {:?}", s.message);
        assert_eq!(s.attempt, 1, "{name}: no restart although 3 were allowed");
        assert_eq!((s.restart_count, s.exit_code), (0, Some(2)), "{name}");
        assert_eq!(s.failure_reason.as_deref(), Some("FailureRule"), "{name}");
        let message = s.message.unwrap_or_default();
        assert!(
            message.contains("rule config-error says FailJob"),
            "{name}: {message}"
        );
        assert_eq!(s.attempts.len(), 1, "{name}");
        let a = &s.attempts[0];
        assert_eq!(
            (a.attempt, a.rule.as_str(), a.action.as_str(), a.exit_code),
            (1, "config-error", "FailJob", Some(2)),
            "{name}"
        );
        let failed = support::wait_event(&client, &ns.name, name, "Failed", T).await;
        assert!(
            failed.message.unwrap_or_default().contains("config-error"),
            "{name}: the Event names the rule"
        );
    }
    assert_eq!(lines(&starts), 1, "the local job started once");
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([support::pod_name(&client, &ns.name, "pod", 1).await]),
        "one Pod ever"
    );
}

/// (b) Exit 75 marked Recover with `maxRestartsOnErrors: 0`: relaunched 3 times (recoveries,
/// not restarts, the later two after a back-off), then Succeeded: restartCount 0,
/// recoveryCount 3, four process starts, and `managedjobs_attempts_total` counts three
/// recoveries by the rule and one success.
#[tokio::test]
async fn an_exit_code_marked_recover_relaunches_without_spending_restarts() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rulerecover").await;
    let port = support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--metrics-addr", &addr]);
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let yaml = format!(
        "{}  recovery:\n    maxRestartsOnErrors: 0\n    maxRecoveries: 3\n  failurePolicy:\n    rules:\n      - name: gpu-fault\n        action: Recover\n        onExitCodes: {{operator: In, values: [75]}}\n  env:\n    - name: STARTS\n      value: {}\n  run: |\n    echo \"$MANAGEDJOB_ATTEMPT\" >> \"$STARTS\"\n    [ \"$MANAGEDJOB_ATTEMPT\" -le 3 ] && exit 75\n    exit 0\n",
        head("train"),
        starts.display()
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let s = support::wait_status(&client, &ns.name, "train", T, "finished", terminal)
        .await
        .status
        .unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!((s.restart_count, s.recovery_count, s.attempt), (0, 3, 4));
    assert_eq!(
        std::fs::read_to_string(&starts).unwrap(),
        "1\n2\n3\n4\n",
        "four starts, no more"
    );
    let decided: Vec<(i32, &str, &str)> = s
        .attempts
        .iter()
        .map(|a| (a.attempt, a.rule.as_str(), a.action.as_str()))
        .collect();
    assert_eq!(
        decided,
        [
            (1, "gpu-fault", "Recover"),
            (2, "gpu-fault", "Recover"),
            (3, "gpu-fault", "Recover"),
            (4, "default", "Succeeded")
        ]
    );
    let recovering = support::wait_event(&client, &ns.name, "train", "Recovering", T).await;
    assert!(
        recovering
            .message
            .unwrap_or_default()
            .contains("rule gpu-fault"),
        "the Event names the rule"
    );
    let (_, body) = support::http_get(port, "/metrics");
    for want in [
        r#"managedjobs_attempts_total{action="Recover",decided_by="rule"} 3"#,
        r#"managedjobs_attempts_total{action="Succeeded",decided_by="default"} 1"#,
    ] {
        assert!(body.contains(want), "no {want} in:\n{body}");
    }
}

/// (c) A pod with a sidecar: rules that name `main` decide on main's exit code; the sidecar's
/// exit 2 (which a rule on main would fail the job for) is not read. Attempt 1: sidecar 2,
/// main 75 -> recovered by `gpu-fault`; attempt 2 succeeds. Two Pods ever.
#[tokio::test]
async fn a_sidecars_exit_code_is_ignored_while_mains_decides() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rulesidecar").await;
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let rules = "  failurePolicy:\n    rules:\n      - name: main-config\n        action: FailJob\n        onExitCodes: {containerName: main, operator: In, values: [2]}\n      - name: gpu-fault\n        action: Recover\n        onExitCodes: {containerName: main, operator: In, values: [75]}\n";
    support::create_yaml(
        &client,
        &ns.name,
        &pod_job("sidecar", "", &["main", "sidecar"], rules),
    )
    .await;
    let first = support::pod_name(&client, &ns.name, "sidecar", 1).await;
    wait_pod_running(&client, &ns.name, &first).await;
    end_pod(
        &client,
        &ns.name,
        &first,
        "Failed",
        &[("main", 75), ("sidecar", 2)],
    )
    .await;
    let second = support::pod_name(&client, &ns.name, "sidecar", 2).await;
    wait_pod_running(&client, &ns.name, &second).await;
    let s = support::wait_status(&client, &ns.name, "sidecar", T, "attempt 2 running", |s| {
        s.attempt == 2 && s.phase == Some(JobPhase::Running)
    })
    .await
    .status
    .unwrap();
    assert_eq!((s.recovery_count, s.restart_count), (1, 0));
    let a = &s.attempts[0];
    assert_eq!(
        (a.rule.as_str(), a.action.as_str(), a.exit_code),
        ("gpu-fault", "Recover", Some(75)),
        "main's exit code decided, not the sidecar's"
    );
    end_pod(
        &client,
        &ns.name,
        &second,
        "Succeeded",
        &[("main", 0), ("sidecar", 0)],
    )
    .await;
    let s = support::wait_status(&client, &ns.name, "sidecar", T, "finished", terminal)
        .await
        .status
        .unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    watch.abort();
    assert_eq!(
        names.lock().unwrap().clone(),
        BTreeSet::from([first, second]),
        "two Pods ever"
    );
}

/// (d) An evicted Pod (the Eviction API sets `DisruptionTarget`, then deletes it) is a recovery
/// by default; with a FailJob rule on that condition the job fails instead, naming the rule
/// and the eviction, and no second Pod is ever created.
#[tokio::test]
async fn a_disruption_with_a_fail_rule_fails_instead_of_recovering() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "ruledisrupt").await;
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let rules = "  failurePolicy:\n    rules:\n      - name: no-preemption\n        action: FailJob\n        onPodConditions:\n          - type: DisruptionTarget\n";
    support::create_yaml(&client, &ns.name, &pod_job("evicted", "", &["main"], rules)).await;
    let first = support::pod_name(&client, &ns.name, "evicted", 1).await;
    wait_pod_running(&client, &ns.name, &first).await;
    support::wait_status(
        &client,
        &ns.name,
        "evicted",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .evict(&first, &kube::api::EvictParams::default())
        .await
        .expect("eviction accepted");
    let s = support::wait_status(&client, &ns.name, "evicted", T, "finished", terminal)
        .await
        .status
        .unwrap();
    assert_eq!(s.phase, Some(JobPhase::Failed), "{:?}", s.message);
    assert_eq!(s.failure_reason.as_deref(), Some("FailureRule"));
    assert_eq!(s.recovery_count, 0);
    let a = &s.attempts[0];
    assert_eq!(
        (a.rule.as_str(), a.action.as_str(), a.reason.as_str()),
        ("no-preemption", "FailJob", "EvictionByEvictionAPI")
    );
    // Give a wrong relaunch the time to show up before counting the Pods.
    tokio::time::sleep(Duration::from_secs(2)).await;
    watch.abort();
    assert_eq!(
        names.lock().unwrap().clone(),
        BTreeSet::from([first]),
        "never relaunched"
    );
}

/// A Node nobody runs (no kwok annotation): a Pod bound to it never confirms its deletion and
/// stays Terminating, so the test sees what a cancel waits on. Deleted when dropped.
struct SilentNode {
    cp: &'static support::ControlPlane,
    name: String,
}

impl SilentNode {
    async fn create(client: &Client, cp: &'static support::ControlPlane) -> SilentNode {
        use k8s_openapi::api::core::v1::Node;
        let name = format!("mj-silent-node-{}", std::process::id());
        let api = Api::<Node>::all(client.clone());
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"managedjobs.dev/test": "silent-node"}},
        }))
        .unwrap();
        let _ = api.delete(&name, &Default::default()).await;
        api.create(&Default::default(), &node).await.expect("node");
        SilentNode { cp, name }
    }
}

impl Drop for SilentNode {
    fn drop(&mut self) {
        let _ = support::kubectl(self.cp, &["delete", "node", &self.name, "--wait=false"]);
    }
}

/// (e) Stops that let work be saved. A local job whose script and detached child trap TERM
/// write their checkpoint markers on cancel; a third process that ignores TERM is killed once
/// the job's grace (`terminationGracePeriodSeconds: 3`) is over; Cancelling said so meanwhile.
/// A pod job is deleted with its own grace period (45 s, set on the Pod too), and while its
/// Pod terminates Cancelling names the Pod, its node and the grace.
#[tokio::test]
async fn a_cancel_lets_the_workload_save_its_work_within_the_jobs_grace() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rulegrace").await;
    let node = SilentNode::create(&client, cp).await;
    // The node never reports Ready: without a grace longer than the test, its Pod would be
    // lost to it (`tests/nodes.rs`) while the test plays its kubelet.
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--node-lost-grace-seconds", "600"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let run = format!(
        r#"trap 'echo saved > {d}/main.ckpt; exit 0' TERM
setsid sh -c 'trap "echo saved > {d}/child.ckpt; exit 0" TERM; while :; do sleep 0.1; done' &
sh -c 'trap "" TERM; echo $$ > {d}/stubborn.pid; while :; do sleep 0.1; done' &
touch {d}/started
while :; do sleep 0.1; done
"#
    );
    let local: managed_jobs::api::ManagedJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
        "metadata": {"name": "checkpoint"},
        "spec": {"terminationGracePeriodSeconds": 3, "run": run}
    }))
    .unwrap();
    Api::<managed_jobs::api::ManagedJob>::namespaced(client.clone(), &ns.name)
        .create(&Default::default(), &local)
        .await
        .expect("create");
    let pod_yaml = pod_job(
        "grace",
        "",
        &["main"],
        "  terminationGracePeriodSeconds: 45\n",
    )
    .replace(
        "    spec:\n      containers:",
        &format!(
            "    spec:\n      nodeName: {}\n      containers:",
            node.name
        ),
    );
    support::create_yaml(&client, &ns.name, &pod_yaml).await;
    // The local job runs; the Pod (nobody runs it) is made Running by hand.
    support::wait_status(
        &client,
        &ns.name,
        "checkpoint",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let start = Instant::now();
    while !(dir.path().join("started").exists() && dir.path().join("stubborn.pid").exists()) {
        assert!(start.elapsed() < T, "the script never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let pod = support::pod_name(&client, &ns.name, "grace", 1).await;
    let start = Instant::now();
    while pods.get_opt(&pod).await.unwrap().is_none() {
        assert!(start.elapsed() < T, "Pod {pod} never created");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = serde_json::json!({"status": {"phase": "Running", "containerStatuses": [{
        "name": "main", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
        "state": {"running": {"startedAt": jiff::Timestamp::now().to_string()}}}]}});
    pods.patch_status(&pod, &PatchParams::default(), &Patch::Merge(&running))
        .await
        .expect("status patch");
    support::wait_status(
        &client,
        &ns.name,
        "grace",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    assert_eq!(
        pods.get(&pod)
            .await
            .unwrap()
            .spec
            .unwrap()
            .termination_grace_period_seconds,
        Some(45),
        "the Pod carries the job's grace"
    );

    let cancelled_at = Instant::now();
    support::cancel(&client, &ns.name, "checkpoint").await;
    support::cancel(&client, &ns.name, "grace").await;
    let s = support::wait_status(&client, &ns.name, "checkpoint", T, "Cancelling", |s| {
        s.phase == Some(JobPhase::Cancelling) || terminal(s)
    })
    .await
    .status
    .unwrap();
    assert_eq!(s.phase, Some(JobPhase::Cancelling), "{:?}", s.message);
    let message = s.message.unwrap_or_default();
    assert!(
        message.contains("SIGTERM") && message.contains("SIGKILL after 3 s"),
        "Cancelling says what it waits on: {message}"
    );
    let s = support::wait_status(&client, &ns.name, "checkpoint", T, "finished", terminal)
        .await
        .status
        .unwrap();
    let waited = cancelled_at.elapsed();
    assert_eq!(s.phase, Some(JobPhase::Cancelled), "{:?}", s.message);
    for marker in ["main.ckpt", "child.ckpt"] {
        assert_eq!(
            std::fs::read_to_string(dir.path().join(marker))
                .ok()
                .as_deref(),
            Some("saved\n"),
            "{marker}: the process saved its work on SIGTERM"
        );
    }
    let stubborn: i32 = std::fs::read_to_string(dir.path().join("stubborn.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !std::path::Path::new(&format!("/proc/{stubborn}")).exists(),
        "the process that ignored SIGTERM was killed"
    );
    assert!(
        waited >= Duration::from_secs(3),
        "SIGKILL came only after the grace ({waited:?})"
    );

    // The Pod: deleted with the job's grace, and Cancelling names it while it terminates.
    let s = support::wait_status(&client, &ns.name, "grace", T, "waiting for the Pod", |s| {
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("to terminate (grace period 45 s)"))
    })
    .await
    .status
    .unwrap();
    assert_eq!(s.phase, Some(JobPhase::Cancelling));
    let message = s.message.unwrap_or_default();
    assert!(
        message.contains(&pod) && message.contains(&node.name),
        "{message}"
    );
    let terminating = pods.get(&pod).await.unwrap();
    assert_eq!(terminating.metadata.deletion_grace_period_seconds, Some(45));
    // Play the kubelet: the Pod exits and is gone.
    pods.delete(
        &pod,
        &kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .expect("force delete");
    let s = support::wait_status(&client, &ns.name, "grace", T, "finished", terminal)
        .await
        .status
        .unwrap();
    assert_eq!(s.phase, Some(JobPhase::Cancelled), "{:?}", s.message);
}

/// A deadline's stop lets work be saved too: a local job past its `activeDeadlineSeconds` gets
/// SIGTERM, its TERM trap writes the checkpoint marker, and the job fails `DeadlineExceeded`.
#[tokio::test]
async fn a_deadline_lets_the_workload_save_its_work() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "ruledeadline").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let run = format!(
        "trap 'echo saved > {d}/deadline.ckpt; exit 0' TERM\nwhile :; do sleep 0.1; done\n"
    );
    let job: managed_jobs::api::ManagedJob = serde_json::from_value(serde_json::json!({
        "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
        "metadata": {"name": "deadline"},
        "spec": {"activeDeadlineSeconds": 2, "terminationGracePeriodSeconds": 10, "run": run}
    }))
    .unwrap();
    Api::<managed_jobs::api::ManagedJob>::namespaced(client.clone(), &ns.name)
        .create(&Default::default(), &job)
        .await
        .expect("create");
    let s = support::wait_status(&client, &ns.name, "deadline", T, "finished", terminal)
        .await
        .status
        .unwrap();
    assert_eq!(
        s.failure_reason.as_deref(),
        Some("DeadlineExceeded"),
        "{:?}",
        s.message
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("deadline.ckpt"))
            .ok()
            .as_deref(),
        Some("saved\n"),
        "the script saved its work on SIGTERM"
    );
    assert!(
        s.attempts.is_empty(),
        "an end the operator caused is no rule's"
    );
}

/// (f) A pipeline whose task 2 has its own rules: task 1 uses the job's (exit 3 ignored:
/// relaunched, counted as neither), task 2 only its own (exit 3 recovered, then exit 2 fails
/// the job at once); task 3 is skipped. Four process starts.
#[tokio::test]
async fn a_pipelines_task_uses_its_own_rules() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "rulepipeline").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let dir = tempfile::tempdir().unwrap();
    let starts = dir.path().join("starts");
    let script = |first: i32, then: i32| {
        format!(
            "echo \"$MANAGEDJOB_TASK $MANAGEDJOB_ATTEMPT\" >> \"$STARTS\"\n        [ \"$MANAGEDJOB_ATTEMPT\" = 1 ] && exit {first}\n        exit {then}\n"
        )
    };
    let yaml = format!(
        "{}  recovery:\n    maxRestartsOnErrors: 2\n  failurePolicy:\n    rules:\n      - name: flaky\n        action: Ignore\n        onExitCodes: {{operator: In, values: [3]}}\n  env:\n    - name: STARTS\n      value: {}\n  tasks:\n    - name: prepare\n      run: |\n        {}    - name: train\n      failurePolicy:\n        rules:\n          - name: gpu-fault\n            action: Recover\n            onExitCodes: {{operator: In, values: [3]}}\n          - name: bad-config\n            action: FailJob\n            onExitCodes: {{operator: In, values: [2]}}\n      run: |\n        {}    - name: evaluate\n      run: \"true\"\n",
        head("pipeline"),
        starts.display(),
        script(3, 0),
        script(3, 2),
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let s = support::wait_status(&client, &ns.name, "pipeline", T, "finished", terminal)
        .await
        .status
        .unwrap();
    assert_eq!(s.phase, Some(JobPhase::Failed), "{:?}", s.message);
    assert_eq!(s.failure_reason.as_deref(), Some("FailureRule"));
    assert!(
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("task 2/3 train") && m.contains("bad-config")),
        "{:?}",
        s.message
    );
    let phases: Vec<TaskPhase> = s.tasks.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        [TaskPhase::Succeeded, TaskPhase::Failed, TaskPhase::Skipped]
    );
    let counts: Vec<(i32, i32, i32)> = s
        .tasks
        .iter()
        .map(|t| (t.restart_count, t.recovery_count, t.ignored_count))
        .collect();
    assert_eq!(counts, [(0, 0, 1), (0, 1, 0), (0, 0, 0)]);
    assert_eq!(
        (s.restart_count, s.recovery_count, s.ignored_count),
        (0, 1, 1)
    );
    let decided: Vec<(Option<&str>, &str, &str)> = s
        .attempts
        .iter()
        .map(|a| (a.task.as_deref(), a.rule.as_str(), a.action.as_str()))
        .collect();
    assert_eq!(
        decided,
        [
            (Some("prepare"), "flaky", "Ignore"),
            (Some("prepare"), "default", "Succeeded"),
            (Some("train"), "gpu-fault", "Recover"),
            (Some("train"), "bad-config", "FailJob"),
        ]
    );
    assert_eq!(
        std::fs::read_to_string(&starts).unwrap(),
        "prepare 1\nprepare 2\ntrain 1\ntrain 2\n"
    );
    let ignored = support::wait_event(&client, &ns.name, "pipeline", "Ignored", T).await;
    assert!(
        ignored.message.unwrap_or_default().contains("rule flaky"),
        "the Event names the rule"
    );
}

/// The API refuses bad rules with a message naming the field (CEL and the schema), accepts
/// the same code for two containers, keeps the rules immutable, and accepts the docs' worked
/// example and `examples/failure-rules.yaml`.
#[tokio::test]
async fn bad_failure_rules_are_refused_by_the_api_naming_the_field() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "ruleinvalid").await;
    let pod = |rules: &str| {
        format!(
            "  failurePolicy:\n    rules:\n{rules}  template:\n    spec:\n      containers:\n        - name: main\n          image: busybox\n"
        )
    };
    let cases = [
        (
            "two matchers",
            pod("      - action: FailJob\n        onExitCodes: {operator: In, values: [1]}\n        onReasons: [OOMKilled]\n"),
            "spec.failurePolicy.rules[0]",
            "exactly one of onExitCodes, onPodConditions and onReasons",
        ),
        (
            "no matcher",
            pod("      - action: Restart\n"),
            "spec.failurePolicy.rules[0]",
            "exactly one of",
        ),
        (
            "exit code 0 in a fail rule",
            pod("      - action: FailJob\n        onExitCodes: {operator: In, values: [0, 2]}\n"),
            "spec.failurePolicy.rules[0]",
            "exit code 0",
        ),
        (
            "a code listed by two rules",
            pod("      - action: FailJob\n        onExitCodes: {operator: In, values: [2, 3]}\n      - action: Recover\n        onExitCodes: {operator: In, values: [3]}\n"),
            "spec.failurePolicy.rules",
            "listed with operator In by two rules",
        ),
        (
            "an unknown action",
            pod("      - action: Retry\n        onExitCodes: {operator: In, values: [1]}\n"),
            "spec.failurePolicy.rules[0].action",
            "Unsupported value",
        ),
        (
            "the name default",
            pod("      - name: default\n        action: Restart\n        onReasons: [OOMKilled]\n"),
            "spec.failurePolicy.rules[0]",
            "`default`",
        ),
        (
            "an unknown condition status",
            pod("      - action: FailJob\n        onPodConditions: [{type: DisruptionTarget, status: Maybe}]\n"),
            "spec.failurePolicy.rules[0].onPodConditions[0].status",
            "Unsupported value",
        ),
        (
            "Pod conditions on a local job",
            "  run: \"true\"\n  failurePolicy:\n    rules:\n      - action: FailJob\n        onPodConditions: [{type: DisruptionTarget}]\n".to_string(),
            "spec.failurePolicy",
            "a local job (spec.run) has no Pod",
        ),
        (
            "a task's code listed twice",
            "  tasks:\n    - name: a\n      run: \"true\"\n      failurePolicy:\n        rules:\n          - action: FailJob\n            onExitCodes: {operator: In, values: [4]}\n          - action: Ignore\n            onExitCodes: {operator: In, values: [4]}\n".to_string(),
            "spec.tasks[0].failurePolicy.rules",
            "two rules",
        ),
        (
            "a containerName naming no container of the template",
            pod("      - action: FailJob\n        onExitCodes: {containerName: trainer, operator: In, values: [3]}\n"),
            "spec.failurePolicy",
            "spec.failurePolicy.rules[].onExitCodes.containerName names no container or initContainer of spec.template",
        ),
        (
            "a task's containerName naming no container of its template",
            "  tasks:\n    - name: a\n      template:\n        spec:\n          containers: [{name: main, image: busybox}]\n      failurePolicy:\n        rules:\n          - action: FailJob\n            onExitCodes: {containerName: trainer, operator: In, values: [3]}\n".to_string(),
            "spec.tasks[0].failurePolicy",
            "spec.tasks[].failurePolicy.rules[].onExitCodes.containerName names no container or initContainer of the task template",
        ),
        (
            "a pipeline's containerName naming no container of any task",
            "  failurePolicy:\n    rules:\n      - action: FailJob\n        onExitCodes: {containerName: trainer, operator: In, values: [3]}\n  tasks:\n    - name: a\n      template:\n        spec:\n          containers: [{name: main, image: busybox}]\n    - name: b\n      template:\n        spec:\n          containers: [{name: eval, image: busybox}]\n".to_string(),
            "spec.failurePolicy",
            "spec.failurePolicy.rules[].onExitCodes.containerName names no container or initContainer of any task template",
        ),
        (
            "a local job's containerName naming no script",
            "  run: \"true\"\n  failurePolicy:\n    rules:\n      - action: FailJob\n        onExitCodes: {containerName: trainer, operator: In, values: [3]}\n".to_string(),
            "spec.failurePolicy",
            "spec.failurePolicy.rules[].onExitCodes.containerName names no part of a local job (spec.run): a local workload has no containers; containerName is setup or run",
        ),
        (
            "a local task's containerName naming no script",
            "  tasks:\n    - name: a\n      run: \"true\"\n      failurePolicy:\n        rules:\n          - action: FailJob\n            onExitCodes: {containerName: trainer, operator: In, values: [3]}\n".to_string(),
            "spec.tasks[0].failurePolicy",
            "containerName names no part of a local task (run): a local workload has no containers; containerName is setup or run",
        ),
        (
            "a rule for one container after a rule for any listing the same code",
            "  failurePolicy:\n    rules:\n      - action: FailJob\n        onExitCodes: {operator: In, values: [4, 3]}\n      - action: Restart\n        onExitCodes: {containerName: main, operator: In, values: [3]}\n  template:\n    spec:\n      containers: [{name: main, image: busybox}]\n".to_string(),
            "spec.failurePolicy.rules",
            "an exit code listed with operator In by a rule without containerName (any container) is listed again by a later rule",
        ),
        (
            "a negative exit code",
            pod("      - action: FailJob\n        onExitCodes: {operator: In, values: [2, -1]}\n"),
            "spec.failurePolicy.rules[0].onExitCodes.values[1]",
            "greater than or equal to 0",
        ),
        (
            "an exit code above 255",
            pod("      - action: Restart\n        onExitCodes: {operator: NotIn, values: [256]}\n"),
            "spec.failurePolicy.rules[0].onExitCodes.values[0]",
            "less than or equal to 255",
        ),
        (
            "maxIgnored out of range",
            "  run: \"true\"\n  recovery:\n    maxIgnored: 5000\n".to_string(),
            "spec.recovery.maxIgnored",
            "1000",
        ),
        (
            "a negative grace",
            "  run: \"true\"\n  terminationGracePeriodSeconds: -1\n".to_string(),
            "spec.terminationGracePeriodSeconds",
            "0",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    for (what, body, field, says) in cases {
        std::fs::write(&path, format!("{}{body}", head("bad"))).unwrap();
        let (ok, out) =
            support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
        assert!(!ok, "{what} was accepted: {out}");
        assert!(
            out.contains(field) && out.contains(says),
            "{what}: the error does not name {field} ({says}): {out}"
        );
    }
    // Containers and init containers the templates name, in any order, are fine (a pipeline's
    // own rules may name a container of any one task); so are a local job's scripts.
    for (what, body) in [
        (
            "an init container and a container of the template",
            "  failurePolicy:\n    rules:\n      - action: FailJob\n        onExitCodes: {containerName: prepare, operator: In, values: [3, 255]}\n      - action: Restart\n        onExitCodes: {containerName: main, operator: In, values: [3]}\n      - action: Ignore\n        onExitCodes: {operator: In, values: [3]}\n  template:\n    spec:\n      initContainers: [{name: prepare, image: busybox}]\n      containers: [{name: main, image: busybox}]\n".to_string(),
        ),
        (
            "a pipeline's rule naming one task's container",
            "  failurePolicy:\n    rules:\n      - action: FailJob\n        onExitCodes: {containerName: eval, operator: In, values: [3]}\n  tasks:\n    - name: a\n      template:\n        spec:\n          containers: [{name: main, image: busybox}]\n    - name: b\n      template:\n        spec:\n          containers: [{name: eval, image: busybox}]\n".to_string(),
        ),
        (
            "a local job's scripts",
            "  run: \"true\"\n  setup: \"true\"\n  failurePolicy:\n    rules:\n      - action: FailJob\n        onExitCodes: {containerName: setup, operator: In, values: [3]}\n      - action: Restart\n        onExitCodes: {containerName: run, operator: In, values: [3]}\n".to_string(),
        ),
    ] {
        std::fs::write(&path, format!("{}{body}", head("fine"))).unwrap();
        let (ok, out) = support::kubectl(
            cp,
            &[
                "apply",
                "--dry-run=server",
                "-n",
                &ns.name,
                "-f",
                path.to_str().unwrap(),
            ],
        );
        assert!(ok, "{what} was refused: {out}");
    }
    // One code for two containers, and NotIn with 0, are fine; the rules are immutable.
    let good = format!(
        "{}{}",
        head("good"),
        pod(
            "      - action: FailJob\n        onExitCodes: {containerName: main, operator: In, values: [2]}\n      - action: Ignore\n        onExitCodes: {containerName: sidecar, operator: In, values: [2]}\n      - action: Restart\n        onExitCodes: {operator: NotIn, values: [0, 1]}\n"
        )
        .replace(
            "        - name: main\n",
            "        - name: sidecar\n          image: busybox\n        - name: main\n",
        )
    );
    std::fs::write(&path, &good).unwrap();
    let (ok, out) = support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
    assert!(ok, "{out}");
    std::fs::write(&path, good.replace("values: [0, 1]", "values: [0, 9]")).unwrap();
    let (ok, out) = support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
    assert!(
        !ok && out.contains("spec.failurePolicy") && out.contains("immutable"),
        "{out}"
    );
    // The worked example of docs/concepts/failure-rules.md is a valid ManagedJob.
    let doc =
        std::fs::read_to_string(support::root().join("docs/concepts/failure-rules.md")).unwrap();
    let section = doc
        .split_once("# Failure rules")
        .expect("docs/concepts/failure-rules.md has its title")
        .1;
    let example = section
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the section shows a YAML example")
        .0;
    assert!(example.contains("kind: ManagedJob"), "{example}");
    let file =
        std::fs::read_to_string(support::root().join("examples/failure-rules.yaml")).unwrap();
    for (what, yaml) in [
        ("the example of docs/concepts/failure-rules.md", example),
        ("examples/failure-rules.yaml", &file),
    ] {
        std::fs::write(&path, yaml).unwrap();
        let (ok, out) = support::kubectl(
            cp,
            &[
                "apply",
                "--dry-run=server",
                "-n",
                &ns.name,
                "-f",
                path.to_str().unwrap(),
            ],
        );
        assert!(ok, "{what}: {out}");
    }
}
