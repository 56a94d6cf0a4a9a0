//! The pod executor on the dev control plane: Pods scheduled by the real kube-scheduler onto kwok
//! nodes, completed by our kwok Stages, evicted through the Eviction API, lost with their node.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use managed_jobs::api::JobPhase;
use managed_jobs::store::Store;

const T: Duration = Duration::from_secs(60);

fn pod_job(name: &str, annotations: &str, extra_spec: &str, pod_spec_extra: &str) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
{extra_spec}  template:
    metadata:
      annotations: {{{annotations}}}
    spec:
{pod_spec_extra}      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: 100m
              memory: 64Mi
"#
    )
}

async fn pods_of(client: &Client, ns: &str, job: &str) -> Vec<Pod> {
    let lp = ListParams::default().labels(&format!("managedjobs.dev/job-name={job}"));
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
}

async fn wait_no_pods(client: &Client, ns: &str, job: &str) {
    let start = Instant::now();
    while !pods_of(client, ns, job).await.is_empty() {
        assert!(start.elapsed() < T, "Pods of {job} were left behind");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn evict(client: &Client, ns: &str, pod: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .evict(pod, &kube::api::EvictParams::default())
        .await
        .expect("eviction accepted");
}

async fn running_pod_name(client: &Client, ns: &str, job: &str) -> String {
    let mj = support::wait_status(
        client,
        ns,
        job,
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    mj.status
        .unwrap()
        .workload
        .unwrap()
        .trim_start_matches("pod/")
        .to_string()
}

/// Every Pod name that ever existed for `job`, seen through a watch from now on.
fn watch_pod_names(
    client: &Client,
    ns: &str,
    job: &str,
) -> tokio::task::JoinHandle<BTreeSet<String>> {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let cfg = watcher::Config::default().labels(&format!("managedjobs.dev/job-name={job}"));
    tokio::spawn(async move {
        let mut names = BTreeSet::new();
        let mut stream = watcher(api, cfg).boxed();
        let deadline = tokio::time::sleep(Duration::from_secs(90));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                ev = stream.next() => match ev {
                    Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p))) => {
                        names.insert(p.name_any());
                    }
                    Some(_) => {}
                    None => break,
                },
            }
        }
        names
    })
}

#[tokio::test]
async fn pod_job_succeeds_with_an_owned_labelled_pod_and_is_garbage_collected() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podok").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = std::fs::read_to_string(support::root().join("examples/pod-hello.yaml")).unwrap();
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "pod-hello",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    let s = mj.status.clone().unwrap();
    assert_eq!(s.exit_code, Some(0));
    let id = s.job_id.unwrap();
    let pods = pods_of(&client, &ns.name, "pod-hello").await;
    assert_eq!(pods.len(), 1);
    let pod = &pods[0];
    assert_eq!(
        pod.name_any(),
        support::pod_name(&client, &ns.name, "pod-hello", 1).await
    );
    assert_eq!(pod.labels()["managedjobs.dev/job-id"], id.to_string());
    assert_eq!(pod.labels()["managedjobs.dev/attempt"], "1");
    assert_eq!(pod.owner_references()[0].uid, mj.uid().unwrap());
    assert_eq!(
        pod.spec.as_ref().unwrap().restart_policy.as_deref(),
        Some("Never")
    );
    let store = Store::open(
        &managed_jobs::state_dir::StateDir::new(op.state_dir.path()).store(),
        256,
    )
    .unwrap();
    let phases: Vec<String> = store
        .history(id)
        .unwrap()
        .into_iter()
        .map(|t| t.to_phase.to_string())
        .collect();
    let mut expected = vec!["Pending", "Submitted", "Starting", "Running", "Succeeded"]
        .into_iter()
        .peekable();
    for p in &phases {
        if expected.peek() == Some(&p.as_str()) {
            expected.next();
        }
    }
    assert!(expected.peek().is_none(), "phases went {phases:?}");
    support::delete(&client, &ns.name, "pod-hello").await;
    support::wait_gone(&client, &ns.name, "pod-hello", T).await;
    wait_no_pods(&client, &ns.name, "pod-hello").await;
}

#[tokio::test]
async fn failing_pod_is_restarted_in_a_new_pod_then_fails() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podfail").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = std::fs::read_to_string(support::root().join("examples/pod-failing.yaml")).unwrap();
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "pod-failing",
        T,
        "Failed",
        support::phase_is(JobPhase::Failed),
    )
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.exit_code, Some(3));
    assert_eq!(s.restart_count, 1);
    assert_eq!(
        pods_of(&client, &ns.name, "pod-failing").await.len(),
        2,
        "exactly 2 Pods"
    );
}

#[tokio::test]
async fn evicted_pod_is_recovered_in_a_new_pod() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podevict").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = pod_job(
        "evicted",
        r#""managedjobs.dev/complete-after": "8s""#,
        "",
        "",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let first = running_pod_name(&client, &ns.name, "evicted").await;
    evict(&client, &ns.name, &first).await;
    support::wait_status(
        &client,
        &ns.name,
        "evicted",
        T,
        "Recovering or relaunched",
        |s| s.recovery_count == 1,
    )
    .await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "evicted",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.recovery_count, 1);
    assert_eq!(s.attempt, 2);
    assert_ne!(s.workload.unwrap(), format!("pod/{first}"));
}

#[tokio::test]
async fn eviction_with_no_recovery_budget_fails_the_job() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podbudget").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = pod_job("nobudget", "", "  recovery:\n    maxRecoveries: 0\n", "");
    support::create_yaml(&client, &ns.name, &yaml).await;
    let first = running_pod_name(&client, &ns.name, "nobudget").await;
    evict(&client, &ns.name, &first).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "nobudget",
        T,
        "Failed",
        support::phase_is(JobPhase::Failed),
    )
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.failure_reason.as_deref(), Some("RecoveryBudgetSpent"));
    let message = s.message.unwrap();
    assert!(message.contains("recovery budget is spent"), "{message}");
    // The message names the last cause, and the attempt's record its reason.
    assert!(
        message.contains("last cause: EvictionByEvictionAPI"),
        "{message}"
    );
    assert_eq!(
        s.attempts
            .iter()
            .map(|a| (a.reason.as_str(), a.rule.as_str(), a.action.as_str()))
            .collect::<Vec<_>>(),
        [("EvictionByEvictionAPI", "default", "Recover")]
    );
}

#[tokio::test]
async fn unschedulable_pod_releases_its_launch_slot_and_shows_why() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podbig").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--launch-cap", "1"]);
    let big = r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: too-big
spec:
  template:
    spec:
      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: "1000"
"#;
    support::create_yaml(&client, &ns.name, big).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "too-big",
        T,
        "unschedulable message",
        |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("nodes are available"))
        },
    )
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Starting));
    assert!(
        s.message
            .unwrap()
            .to_lowercase()
            .contains("insufficient cpu")
    );
    // With a launch cap of 1, a job submitted after it still starts.
    let yaml = pod_job(
        "after-big",
        r#""managedjobs.dev/complete-after": "1s""#,
        "",
        "",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    support::wait_status(
        &client,
        &ns.name,
        "after-big",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    // Cancel while Starting: no Pod left.
    support::cancel(&client, &ns.name, "too-big").await;
    support::wait_status(
        &client,
        &ns.name,
        "too-big",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    wait_no_pods(&client, &ns.name, "too-big").await;
}

#[tokio::test]
async fn cancel_while_running_and_recovering_leaves_no_pod() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podcancel").await;
    // Run cap 1 with a blocker keeps the evicted job Recovering (waiting for a launch slot? no:
    // recoveries need only a launch slot), so hold the launch slot with an unschedulable... use a
    // plain running job instead and cancel it in each phase.
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(&client, &ns.name, &pod_job("runner", "", "", "")).await;
    running_pod_name(&client, &ns.name, "runner").await;
    support::cancel(&client, &ns.name, "runner").await;
    support::wait_status(
        &client,
        &ns.name,
        "runner",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    wait_no_pods(&client, &ns.name, "runner").await;

    // Recovering: evict, then cancel at once (the relaunch may or may not have happened).
    support::create_yaml(&client, &ns.name, &pod_job("recoverer", "", "", "")).await;
    let first = running_pod_name(&client, &ns.name, "recoverer").await;
    evict(&client, &ns.name, &first).await;
    support::wait_status(&client, &ns.name, "recoverer", T, "Recovering", |s| {
        s.recovery_count == 1
    })
    .await;
    support::cancel(&client, &ns.name, "recoverer").await;
    support::wait_status(
        &client,
        &ns.name,
        "recoverer",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    wait_no_pods(&client, &ns.name, "recoverer").await;
}

#[tokio::test]
async fn killing_the_operator_and_job_controller_never_duplicates_a_pod() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podkill").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let names = watch_pod_names(&client, &ns.name, "sturdy-pod");
    let yaml = pod_job(
        "sturdy-pod",
        r#""managedjobs.dev/complete-after": "6s""#,
        "",
        "",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(&client, &ns.name, "sturdy-pod", T, "Starting", |s| {
        matches!(s.phase, Some(JobPhase::Starting | JobPhase::Running))
    })
    .await;
    let id = mj.status.unwrap().job_id.unwrap();
    // Kill the operator, then the job controller, while the Pod starts or runs.
    op.kill();
    for (job, pid) in op.job_controllers() {
        if job == id {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    op.restart();
    let mj = support::wait_status(
        &client,
        &ns.name,
        "sturdy-pod",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    assert_eq!(mj.status.unwrap().attempt, 1);
    names.abort();
    let pods = pods_of(&client, &ns.name, "sturdy-pod").await;
    let names: BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();
    assert_eq!(
        names,
        BTreeSet::from([support::pod_name(&client, &ns.name, "sturdy-pod", 1).await]),
        "exactly one Pod per attempt"
    );
}

#[tokio::test]
async fn zero_pod_quota_is_failed_precheck_naming_the_quota() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "podquota").await;
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "no-pods" },
        "spec": { "hard": { "pods": "0" } },
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
    // The quota controller must have computed usage before it admits anything.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(&client, &ns.name, &pod_job("quota", "", "", "")).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "quota",
        T,
        "FailedPrecheck",
        support::phase_is(JobPhase::FailedPrecheck),
    )
    .await;
    let message = mj.status.unwrap().message.unwrap();
    assert!(message.contains("no-pods"), "{message}");
}
