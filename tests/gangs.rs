//! Multi-node jobs (`spec.nodes`) on the dev control plane: gangs of Pods scheduled by the real
//! kube-scheduler onto kwok nodes, with its gang scheduling (a PodGroup per attempt, feature gate
//! `GenericWorkload`; `hack/controlplane.sh up --gang-scheduling`, as `hack/test.sh` starts it)
//! and without it (`--gang-scheduling off`: the operator places them one by one and removes a
//! partly placed gang after its launch timeout).
//!
//! What must never happen is counted over the whole test by a watch on every Pod
//! ([`support::kwok::PodLog`]): two attempts' members alive at once, a Pod that is no attempt's member, two
//! gangs both partly placed.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use managed_jobs::api::{JobPhase, ManagedJob};
use support::kwok::{Pool, watch_pods};

const T: Duration = Duration::from_secs(90);

/// A gang of `nodes` Pods; `annotations` on the template (kwok's fates), `spec_extra` lines
/// under `spec:`, `pod_extra` lines under the template's `spec:`, `cpu` each container's request.
fn gang(
    name: &str,
    nodes: u32,
    annotations: &str,
    spec_extra: &str,
    pod_extra: &str,
    cpu: &str,
) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  nodes: {nodes}
{spec_extra}  template:
    metadata:
      annotations: {{{annotations}}}
    spec:
{pod_extra}      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: {cpu}
              memory: 64Mi
"#
    )
}

async fn status(client: &Client, ns: &str, name: &str) -> managed_jobs::api::ManagedJobStatus {
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn running(client: &Client, ns: &str, name: &str, attempt: i32) -> ManagedJob {
    support::wait_status(
        client,
        ns,
        name,
        T,
        &format!("Running attempt {attempt}"),
        |s| s.phase == Some(JobPhase::Running) && s.attempt == attempt,
    )
    .await
}

async fn finished(client: &Client, ns: &str, name: &str) -> managed_jobs::api::ManagedJobStatus {
    support::wait_status(client, ns, name, T, "a terminal phase", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await
    .status
    .unwrap()
}

/// The job's member Pods of `attempt` that exist, by rank.
async fn members(client: &Client, ns: &str, job: &str, attempt: i32) -> BTreeMap<u32, Pod> {
    let lp = ListParams::default().labels(&format!(
        "managedjobs.dev/job-name={job},managedjobs.dev/attempt={attempt}"
    ));
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let rank = p.labels()["managedjobs.dev/rank"].parse().unwrap();
            (rank, p)
        })
        .collect()
}

/// The deterministic name of member `rank` of `attempt`.
async fn member_name(client: &Client, ns: &str, job: &str, attempt: i32, rank: u32) -> String {
    let mj = support::wait_status(client, ns, job, T, "a job id", |s| s.job_id.is_some()).await;
    let row = row_of(&mj);
    managed_jobs::executor::pod::member_pod_name(&row, attempt, rank)
}

/// Enough of a job's record to compute its names.
fn row_of(mj: &ManagedJob) -> managed_jobs::lifecycle::JobRow {
    let object = managed_jobs::lifecycle::Object {
        uid: mj.metadata.uid.as_deref().unwrap(),
        namespace: mj.metadata.namespace.as_deref().unwrap(),
        name: mj.metadata.name.as_deref().unwrap(),
        generation: 1,
        spec: &mj.spec,
        created_at_ms: 0,
        resource_version: "",
    };
    managed_jobs::lifecycle::JobRow {
        id: mj.status.as_ref().and_then(|s| s.job_id).unwrap(),
        ..managed_jobs::lifecycle::JobRow::new(&object, 0)
    }
}

fn env_of(pod: &Pod, name: &str) -> String {
    pod.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .and_then(|v| v.value.clone())
        .unwrap_or_default()
}

/// Patches `pod`'s status as a kubelet would report its container exiting `code` on its own.
async fn exit_on_its_own(client: &Client, ns: &str, pod: &str, code: i32) {
    let now = jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "reason": "Error", "startedAt": now, "finishedAt": now}},
        }],
    }});
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patching the Pod's status");
}

/// A 4-node job Succeeds: 4 Pods, one per rank, each with its own rank and the same address
/// list, hostname and subdomain; one headless Service owned by the job; the attempt's PodGroup
/// asked for all 4; every Pod name a watch saw is one of the attempt's members.
#[tokio::test]
async fn a_four_node_job_succeeds_with_a_pod_per_rank_and_one_service() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "gang4").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    let yaml = std::fs::read_to_string(support::root().join("examples/pod-gang.yaml")).unwrap();
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = running(&client, &ns.name, "pod-gang", 1).await;
    let s = mj.status.clone().unwrap();
    assert_eq!(s.ready_nodes.as_deref(), Some("4/4"), "{s:#?}");
    let pods = members(&client, &ns.name, "pod-gang", 1).await;
    assert_eq!(pods.keys().copied().collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    let row = row_of(&mj);
    let service = managed_jobs::executor::pod::service_name("pod-gang", &row.uid);
    let addrs: Vec<String> = (0..4).map(|r| format!("pod-gang-{r}.{service}")).collect();
    for (rank, pod) in &pods {
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(env_of(pod, "RANK"), rank.to_string());
        assert_eq!(env_of(pod, "MANAGEDJOB_NODE_RANK"), rank.to_string());
        assert_eq!(env_of(pod, "WORLD_SIZE"), "4");
        assert_eq!(env_of(pod, "MANAGEDJOB_NUM_NODES"), "4");
        assert_eq!(env_of(pod, "MANAGEDJOB_NODE_ADDRS"), addrs.join(","));
        assert_eq!(env_of(pod, "MASTER_ADDR"), addrs[0]);
        assert_eq!(env_of(pod, "MASTER_PORT"), "29500");
        assert_eq!(
            spec.hostname.as_deref(),
            Some(format!("pod-gang-{rank}").as_str())
        );
        assert_eq!(spec.subdomain.as_deref(), Some(service.as_str()));
    }
    let services = Api::<Service>::namespaced(client.clone(), &ns.name)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(services.len(), 1, "one Service: {services:?}");
    let svc = &services[0];
    assert_eq!(svc.name_any(), service);
    assert_eq!(
        svc.spec.as_ref().unwrap().cluster_ip.as_deref(),
        Some("None"),
        "headless"
    );
    assert!(
        svc.owner_references()
            .iter()
            .any(|o| o.uid == row.uid && o.controller == Some(true)),
        "owned by the job"
    );
    // The attempt's PodGroup (gang scheduling is on in this control plane), asking for all 4.
    let groups: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &managed_jobs::executor::pod::gang::pod_group_resource(),
    );
    let pg = groups
        .get(&managed_jobs::executor::pod::pod_group_name(&row, 1))
        .await
        .expect("the attempt's PodGroup");
    assert_eq!(pg.data["spec"]["schedulingPolicy"]["gang"]["minCount"], 4);
    let s = finished(&client, &ns.name, "pod-gang").await;
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{s:#?}");
    assert_eq!((s.attempt, s.restart_count, s.recovery_count), (1, 0, 0));
    // `managed-jobs logs NS/NAME --rank K` names rank K's Pod; a rank it lacks is an error.
    let logs = |rank: &str| {
        std::process::Command::new(support::binary())
            .args(["logs", &format!("{}/pod-gang", ns.name), "--rank", rank])
            .arg("--state-dir")
            .arg(op.state_path())
            .output()
            .unwrap()
    };
    let out = logs("2");
    let rank2 = member_name(&client, &ns.name, "pod-gang", 1, 2).await;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains(&rank2),
        "{out:?}"
    );
    let out = logs("4");
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("ranks 0..3"),
        "{out:?}"
    );
    watch.abort();
    let mut expected = BTreeSet::new();
    for rank in 0..4 {
        expected.insert(member_name(&client, &ns.name, "pod-gang", 1, rank).await);
    }
    let log = log.lock().unwrap();
    assert_eq!(log.names_of("pod-gang"), BTreeMap::from([(1, expected)]));
    assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
}

/// Rank 2 exits 3 on its own: the other three are stopped (deleted with the job's grace), the
/// job restarts per its budget as one gang and the attempt's record names rank 2; with a
/// FailJob rule on 3 the job fails after that one attempt, naming rank 2.
#[tokio::test]
async fn a_failing_rank_stops_the_others_and_the_rules_decide_for_the_gang() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "gangfail").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    let extra = "  recovery: {maxRestartsOnErrors: 1}\n  terminationGracePeriodSeconds: 7\n";
    support::create_yaml(
        &client,
        &ns.name,
        &gang("restarts", 4, "", extra, "", "100m"),
    )
    .await;
    let rule = "  terminationGracePeriodSeconds: 7\n  failurePolicy:\n    rules:\n      - {name: three, action: FailJob, onExitCodes: {operator: In, values: [3]}}\n";
    support::create_yaml(&client, &ns.name, &gang("fails", 4, "", rule, "", "100m")).await;
    for job in ["restarts", "fails"] {
        running(&client, &ns.name, job, 1).await;
        let rank2 = member_name(&client, &ns.name, job, 1, 2).await;
        exit_on_its_own(&client, &ns.name, &rank2, 3).await;
    }
    // restarts: the whole gang again, as attempt 2.
    let mj = running(&client, &ns.name, "restarts", 2).await;
    let s = mj.status.unwrap();
    assert_eq!(s.restart_count, 1, "{s:#?}");
    let record = &s.attempts[0];
    assert_eq!(
        (
            record.attempt,
            record.rank,
            record.exit_code,
            record.action.as_str()
        ),
        (1, Some(2), Some(3), "Restart"),
        "{record:#?}"
    );
    assert_eq!(members(&client, &ns.name, "restarts", 2).await.len(), 4);
    // fails: one attempt, failed by its rule, naming rank 2.
    let s = finished(&client, &ns.name, "fails").await;
    assert_eq!(s.phase, Some(JobPhase::Failed), "{s:#?}");
    assert_eq!(s.failure_reason.as_deref(), Some("FailureRule"));
    assert_eq!(s.attempt, 1);
    assert_eq!(s.attempts[0].rank, Some(2), "{s:#?}");
    assert!(
        s.message.as_deref().unwrap_or("").contains("rank 2"),
        "{s:#?}"
    );
    let events = support::events_about(&client, &ns.name, "fails").await;
    let notes: Vec<String> = events.iter().filter_map(|e| e.message.clone()).collect();
    assert!(
        notes.iter().any(|m| m.contains("rank 2")),
        "an Event names the rank: {notes:?}"
    );
    // The others were stopped with the job's grace; the failed member is kept for its logs.
    let left = members(&client, &ns.name, "fails", 1).await;
    assert_eq!(
        left.keys().copied().collect::<Vec<_>>(),
        vec![2],
        "{left:?}"
    );
    watch.abort();
    let log = log.lock().unwrap();
    assert!(
        log.overlaps.is_empty(),
        "two attempts' members at once: {:?}",
        log.overlaps
    );
}

/// Rank 1 evicted mid-run: one recovery, the whole gang relaunched as attempt 2, never two
/// attempts' members alive at once over the whole run.
#[tokio::test]
async fn an_evicted_rank_relaunches_the_whole_gang_as_one_recovery() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "gangevict").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(
        &client,
        &ns.name,
        &gang(
            "evicted",
            4,
            "",
            "  terminationGracePeriodSeconds: 3\n",
            "",
            "100m",
        ),
    )
    .await;
    running(&client, &ns.name, "evicted", 1).await;
    let rank1 = member_name(&client, &ns.name, "evicted", 1, 1).await;
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .evict(&rank1, &kube::api::EvictParams::default())
        .await
        .expect("eviction accepted");
    let mj = running(&client, &ns.name, "evicted", 2).await;
    let s = mj.status.unwrap();
    assert_eq!((s.recovery_count, s.restart_count), (1, 0), "{s:#?}");
    assert_eq!(s.attempts[0].rank, Some(1), "{s:#?}");
    assert_eq!(s.attempts[0].action, "Recover");
    assert_eq!(members(&client, &ns.name, "evicted", 2).await.len(), 4);
    // It stays one recovery.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = status(&client, &ns.name, "evicted").await;
    assert_eq!((s.attempt, s.recovery_count), (2, 1), "{s:#?}");
    watch.abort();
    let log = log.lock().unwrap();
    assert!(
        log.overlaps.is_empty(),
        "two attempts' members at once: {:?}",
        log.overlaps
    );
    let names = log.names_of("evicted");
    assert_eq!(
        names.keys().copied().collect::<Vec<_>>(),
        vec![1, 2],
        "{names:?}"
    );
    assert!(names.values().all(|n| n.len() == 4), "{names:?}");
}

/// Capacity for 3 of a 4-node gang: with kube-scheduler's gang scheduling no Pod of it ever
/// binds while a 1-node job that fits runs; without it (`--gang-scheduling off`) 3 bind, and
/// all 4 are removed after the launch timeout, the run slot given back.
#[tokio::test]
async fn a_gang_that_does_not_fit_is_placed_all_or_nothing() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "gangfit").await;
    let pool = ns.name.clone();
    let _nodes = Pool::new(cp, &client, &pool, 3, "1").await;
    let place = Pool::placement(&pool);
    let (watch, log) = watch_pods(&client, &ns.name);

    // With a PodGroup.
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(
        &client,
        &ns.name,
        &gang("toobig", 4, "", "  launchTimeoutSeconds: 5\n", &place, "1"),
    )
    .await;
    let one = "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: small\nspec:\n  template:\n    metadata:\n      annotations: {managedjobs.dev/complete-after: 2s}\n    spec:\n      containers: [{name: main, image: busybox}]\n";
    support::create_yaml(&client, &ns.name, one).await;
    support::wait_status(&client, &ns.name, "toobig", T, "waiting for nodes", |s| {
        s.message
            .as_deref()
            .unwrap_or("")
            .contains("waiting for a node")
    })
    .await;
    let small = finished(&client, &ns.name, "small").await;
    assert_eq!(small.phase, Some(JobPhase::Succeeded), "{small:#?}");
    // Past its launch timeout, still nothing bound.
    tokio::time::sleep(Duration::from_secs(8)).await;
    {
        let log = log.lock().unwrap();
        assert!(
            !log.bound.contains_key("toobig"),
            "a Pod of the gang was bound: {:?}",
            log.bound
        );
        assert_eq!(
            log.names_of("toobig")
                .values()
                .map(|n| n.len())
                .sum::<usize>(),
            4
        );
    }
    support::cancel(&client, &ns.name, "toobig").await;
    finished(&client, &ns.name, "toobig").await;
    drop(op);

    // Without: placed one by one, then all removed after the launch timeout.
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--gang-scheduling", "off"]);
    support::create_yaml(
        &client,
        &ns.name,
        &gang(
            "onebyone",
            4,
            "",
            "  launchTimeoutSeconds: 5\n",
            &place,
            "1",
        ),
    )
    .await;
    let s = support::wait_status(&client, &ns.name, "onebyone", T, "its Pods removed", |s| {
        s.attempts.is_empty() && s.attempt >= 2
    })
    .await
    .status
    .unwrap();
    assert_eq!((s.restart_count, s.recovery_count), (0, 0), "{s:#?}");
    // It gave its run slot back and queued again (Requeued), the attempt counted as neither.
    let events = support::events_about(&client, &ns.name, "onebyone").await;
    let reasons: Vec<String> = events.iter().filter_map(|e| e.reason.clone()).collect();
    assert!(
        reasons.iter().any(|r| r == "Requeued"),
        "a Requeued Event: {reasons:?}"
    );
    let start = Instant::now();
    while !members(&client, &ns.name, "onebyone", 1).await.is_empty() {
        assert!(start.elapsed() < T, "attempt 1's Pods were left behind");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    {
        let log = log.lock().unwrap();
        assert_eq!(
            log.bound.get("onebyone").map(BTreeSet::len),
            Some(3),
            "3 of 4 were placed: {:?}",
            log.bound
        );
        assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
    }
    support::cancel(&client, &ns.name, "onebyone").await;
    finished(&client, &ns.name, "onebyone").await;
    watch.abort();
}

/// Two 3-node gangs on capacity for 4 members: with gang scheduling one runs to its end, then
/// the other; never both partly placed.
#[tokio::test]
async fn two_gangs_that_fit_one_at_a_time_run_one_after_the_other() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "gangtwo").await;
    let pool = ns.name.clone();
    let _nodes = Pool::new(cp, &client, &pool, 4, "1").await;
    let place = Pool::placement(&pool);
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    for name in ["first", "second"] {
        support::create_yaml(
            &client,
            &ns.name,
            &gang(
                name,
                3,
                "managedjobs.dev/complete-after: 4s",
                "",
                &place,
                "1",
            ),
        )
        .await;
    }
    for name in ["first", "second"] {
        let s = finished(&client, &ns.name, name).await;
        assert_eq!(s.phase, Some(JobPhase::Succeeded), "{name}: {s:#?}");
    }
    watch.abort();
    let log = log.lock().unwrap();
    assert!(
        log.both_partly_placed.is_empty(),
        "both gangs partly placed: {:?}",
        log.both_partly_placed
    );
    assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
}

/// A pipeline whose second task runs on 2 nodes: the first task one Pod, the second a gang of
/// two with its own rank names.
#[tokio::test]
async fn a_pipelines_second_task_runs_as_a_gang_of_two() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "gangpipe").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    let yaml = r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: pipe
spec:
  tasks:
    - name: prepare
      template:
        metadata: {annotations: {managedjobs.dev/complete-after: 1s}}
        spec: {containers: [{name: main, image: busybox}]}
    - name: train
      nodes: 2
      template:
        metadata: {annotations: {managedjobs.dev/complete-after: 2s}}
        spec: {containers: [{name: main, image: busybox}]}
"#;
    support::create_yaml(&client, &ns.name, yaml).await;
    let s = finished(&client, &ns.name, "pipe").await;
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{s:#?}");
    watch.abort();
    let log = log.lock().unwrap();
    let names = log.names_of("pipe");
    assert_eq!(names.get(&1).map(BTreeSet::len), Some(1), "{names:?}");
    assert_eq!(names.get(&2).map(BTreeSet::len), Some(2), "{names:?}");
    let ranks: BTreeSet<u32> = log
        .pods
        .values()
        .filter(|p| p.job == "pipe" && p.attempt == 2)
        .map(|p| p.rank)
        .collect();
    assert_eq!(ranks, BTreeSet::from([0, 1]));
}

/// An operator restart, then a lost store, during a 4-node attempt: the running gang is adopted
/// both times (the same 4 Pods, one per rank; no recovery, no new attempt).
#[tokio::test]
async fn a_running_gang_survives_an_operator_restart_and_a_lost_store() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "gangsurv").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &gang("survivor", 4, "", "", "", "100m")).await;
    running(&client, &ns.name, "survivor", 1).await;
    op.restart();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = running(&client, &ns.name, "survivor", 1)
        .await
        .status
        .unwrap();
    assert_eq!(
        (s.attempt, s.recovery_count, s.restart_count),
        (1, 0, 0),
        "{s:#?}"
    );
    // Lose the store while the operator is down.
    op.kill_with_job_controllers();
    std::fs::remove_dir_all(op.state_path()).unwrap();
    std::fs::create_dir_all(op.state_path()).unwrap();
    op.start_again();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = running(&client, &ns.name, "survivor", 1)
        .await
        .status
        .unwrap();
    assert_eq!(
        (s.attempt, s.recovery_count, s.restart_count),
        (1, 0, 0),
        "{s:#?}"
    );
    assert!(
        op.log().contains("pods_adopted=4"),
        "the rebuild adopted 4 Pods"
    );
    // Still the gang: a member lost now is recovered as one.
    let rank3 = member_name(&client, &ns.name, "survivor", 1, 3).await;
    exit_on_its_own(&client, &ns.name, &rank3, 0).await;
    support::cancel(&client, &ns.name, "survivor").await;
    let s = finished(&client, &ns.name, "survivor").await;
    assert_eq!(s.phase, Some(JobPhase::Cancelled), "{s:#?}");
    watch.abort();
    let log = log.lock().unwrap();
    let names = log.names_of("survivor");
    assert_eq!(
        names.keys().copied().collect::<Vec<_>>(),
        vec![1],
        "{names:?}"
    );
    assert_eq!(names[&1].len(), 4, "one Pod per rank: {names:?}");
    assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
}
