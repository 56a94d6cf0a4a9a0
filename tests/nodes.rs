//! Lost nodes (issue 43, item 4) on the dev control plane: kwok Nodes of each test's own
//! ([`support::kwok::Pool`], deleted even when the test fails), Pods placed on them by the
//! real kube-scheduler, and the operator's Node watch.
//!
//! - A member's Node deleted ends its attempt as lost within [`LOST_WITHIN`] of the delete
//!   call (before: only once kube-controller-manager's pod GC deleted the orphaned Pod, 55 s
//!   for a gang), one recovery, the whole gang relaunched as one; a job of one Pod the same.
//! - A Node not Ready past `--node-lost-grace-seconds` ends it the same way; back to Ready
//!   within the grace, nothing changes (the same Pod, no recovery).
//! - A pipeline's pod task the same; a Node deleted while the operator was down, at its start.
//!
//! Every Pod name is counted over the whole test by a watch ([`support::kwok::PodLog`]): no
//! attempt's members alive beside another's, no Pod beyond each attempt's own.
//!
//! kwok keeps its Nodes Ready (its Lease and heartbeat), so a node is held not Ready by taking
//! it out of kwok's hands first ([`support::kwok::Pool::hold_not_ready`]: its annotation
//! removed, its `Ready` condition set `False` as a kubelet would report it) and given back
//! after ([`support::kwok::Pool::release`]).

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use managed_jobs::api::{JobPhase, ManagedJobStatus};
use support::kwok::{Pool, job_on_pool, watch_pods};

const T: Duration = Duration::from_secs(90);

/// The bound: a lost node ends its member's attempt within this of the deletion.
const LOST_WITHIN: Duration = Duration::from_secs(5);

/// The node `pod` of `ns` is bound to.
async fn node_of(client: &kube::Client, ns: &str, pod: &str) -> String {
    Api::<Pod>::namespaced(client.clone(), ns)
        .get(pod)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.node_name)
        .expect("a running Pod is bound")
}

/// The job's Pod of `attempt` (rank `rank` of a gang), as the watch saw it.
fn pod_of(log: &support::kwok::PodLog, job: &str, attempt: i32, rank: u32) -> String {
    log.pods
        .iter()
        .find(|(_, s)| s.job == job && s.attempt == attempt && s.rank == rank)
        .map(|(name, _)| name.clone())
        .unwrap_or_else(|| panic!("no Pod of {job} attempt {attempt} rank {rank} seen"))
}

/// Waits until the job's attempt `attempt` shows as ended in its status (`status.attempts`),
/// polling every 50 ms; returns the status and when it was first seen.
async fn ended(
    client: &kube::Client,
    ns: &str,
    job: &str,
    attempt: i32,
) -> (ManagedJobStatus, Instant) {
    let api = Api::<managed_jobs::api::ManagedJob>::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        let s = api.get(job).await.unwrap().status.unwrap_or_default();
        if s.attempts.iter().any(|a| a.attempt == attempt) {
            return (s, Instant::now());
        }
        assert!(
            start.elapsed() < T,
            "attempt {attempt} of {job} never ended: {s:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn running(client: &kube::Client, ns: &str, job: &str, attempt: i32) -> ManagedJobStatus {
    support::wait_status(
        client,
        ns,
        job,
        T,
        &format!("Running attempt {attempt}"),
        |s| s.phase == Some(JobPhase::Running) && s.attempt == attempt,
    )
    .await
    .status
    .unwrap()
}

/// Issue 43, item 4, as filed: a running `nodes: 4` gang whose rank-1 Node is deleted. The
/// attempt ends lost (reason `NodeLost`, decided by rank 1, action `Recover`) within 5 s of
/// the delete call, one recovery, and the gang is relaunched as one on the nodes left: 4 Pods
/// of attempt 1, 4 of attempt 2, never two attempts' members alive at once.
#[tokio::test]
async fn a_gang_whose_rank_1_node_is_deleted_ends_its_attempt_within_seconds() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nodegone").await;
    // 4 nodes for the gang and one more for its relaunch.
    let pool = Pool::new(cp, &client, &ns.name, 5, "1").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &job_on_pool("gang", &ns.name, Some(4))).await;
    let s = running(&client, &ns.name, "gang", 1).await;
    assert_eq!(s.ready_nodes.as_deref(), Some("4/4"), "{s:#?}");
    let rank1 = pod_of(&log.lock().unwrap(), "gang", 1, 1);
    let node = node_of(&client, &ns.name, &rank1).await;

    let deleted = pool.delete(&client, &node).await;
    let (s, seen) = ended(&client, &ns.name, "gang", 1).await;
    let took = seen - deleted;
    eprintln!("MEASURED: the gang's attempt ended lost {took:?} after its rank-1 node was deleted");
    let a = &s.attempts[0];
    assert_eq!(
        (a.attempt, a.rank, a.reason.as_str(), a.action.as_str()),
        (1, Some(1), "NodeLost", "Recover"),
        "{s:#?}"
    );
    assert!(
        took <= LOST_WITHIN,
        "the attempt ended {took:?} after the deletion"
    );
    // The Event says which node, and that its Pod was removed without its grace period.
    let e = support::wait_event(&client, &ns.name, "gang", "Recovering", T).await;
    let note = e.message.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("its node {node} was deleted")) && note.contains("rank 1"),
        "{note}"
    );
    let s = running(&client, &ns.name, "gang", 2).await;
    eprintln!(
        "MEASURED: the gang ran again (attempt 2, 4/4) {:?} after the deletion",
        deleted.elapsed()
    );
    assert_eq!(
        (s.recovery_count, s.restart_count, s.ready_nodes.as_deref()),
        (1, 0, Some("4/4")),
        "{s:#?}"
    );
    // It stays one recovery.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = running(&client, &ns.name, "gang", 2).await;
    assert_eq!((s.attempt, s.recovery_count), (2, 1), "{s:#?}");
    support::cancel(&client, &ns.name, "gang").await;
    support::wait_status(
        &client,
        &ns.name,
        "gang",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    watch.abort();
    if std::env::var_os("MJ_SHOW_OPERATOR_LOG").is_some() {
        eprintln!("{}", op.log());
    }
    let log = log.lock().unwrap();
    assert!(
        log.overlaps.is_empty(),
        "two attempts' members at once: {:?}",
        log.overlaps
    );
    let names = log.names_of("gang");
    assert_eq!(
        names.keys().copied().collect::<Vec<_>>(),
        [1, 2],
        "{names:?}"
    );
    assert!(names.values().all(|n| n.len() == 4), "{names:?}");
    // Attempt 2 ran on the nodes left.
    assert!(
        log.pods
            .values()
            .filter(|p| p.attempt == 2)
            .all(|p| p.node.as_deref() != Some(node.as_str())),
        "attempt 2 on the deleted node"
    );
}

/// A job of one Pod whose Node is deleted: the same, within 5 s, its Pod relaunched on the
/// other node; two Pods over the whole test.
#[tokio::test]
async fn a_single_pod_job_whose_node_is_deleted_ends_its_attempt_within_seconds() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nodegone1").await;
    let pool = Pool::new(cp, &client, &ns.name, 2, "1").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &job_on_pool("single", &ns.name, None)).await;
    running(&client, &ns.name, "single", 1).await;
    let first = pod_of(&log.lock().unwrap(), "single", 1, 0);
    let node = node_of(&client, &ns.name, &first).await;

    let deleted = pool.delete(&client, &node).await;
    let (s, seen) = ended(&client, &ns.name, "single", 1).await;
    let took = seen - deleted;
    eprintln!("MEASURED: the Pod's attempt ended lost {took:?} after its node was deleted");
    let a = &s.attempts[0];
    assert_eq!(
        (a.attempt, a.rank, a.reason.as_str(), a.action.as_str()),
        (1, None, "NodeLost", "Recover"),
        "{s:#?}"
    );
    assert!(
        took <= LOST_WITHIN,
        "the attempt ended {took:?} after the deletion"
    );
    let s = running(&client, &ns.name, "single", 2).await;
    assert_eq!((s.recovery_count, s.restart_count), (1, 0), "{s:#?}");
    let second = pod_of(&log.lock().unwrap(), "single", 2, 0);
    assert_ne!(node_of(&client, &ns.name, &second).await, node);
    // The lost Pod was removed before the relaunch (nobody would ever have confirmed it).
    assert!(
        Api::<Pod>::namespaced(client.clone(), &ns.name)
            .get_opt(&first)
            .await
            .unwrap()
            .is_none(),
        "{first} is left on the deleted node"
    );
    support::cancel(&client, &ns.name, "single").await;
    support::wait_status(
        &client,
        &ns.name,
        "single",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    watch.abort();
    let log = log.lock().unwrap();
    assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
    assert_eq!(
        log.names_of("single")
            .values()
            .map(BTreeSet::len)
            .sum::<usize>(),
        2,
        "{:?}",
        log.names_of("single")
    );
}

/// A Node deleted while the operator was down (killed with its job controllers, as a container
/// restart does): the operator's first look at the world after its start finds the Pod's node
/// gone and ends the attempt as lost (`NodeLost`, not the pod GC's `DeletionByPodGC`, which
/// comes 40-60 s after the deletion), within seconds of its start.
#[tokio::test]
async fn a_node_deleted_while_the_operator_was_down_is_seen_at_its_start() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nodeoffline").await;
    let pool = Pool::new(cp, &client, &ns.name, 2, "1").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &job_on_pool("offline", &ns.name, None)).await;
    running(&client, &ns.name, "offline", 1).await;
    let first = pod_of(&log.lock().unwrap(), "offline", 1, 0);
    let node = node_of(&client, &ns.name, &first).await;

    op.kill_with_job_controllers();
    let deleted = pool.delete(&client, &node).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    op.start_again();
    let (s, seen) = ended(&client, &ns.name, "offline", 1).await;
    eprintln!(
        "MEASURED: the attempt ended lost {:?} after the operator started again ({:?} after the deletion)",
        seen - started,
        seen - deleted
    );
    let a = &s.attempts[0];
    assert_eq!(
        (a.reason.as_str(), a.action.as_str()),
        ("NodeLost", "Recover"),
        "{s:#?}"
    );
    assert!(
        seen - started <= Duration::from_secs(15),
        "{:?} after the start",
        seen - started
    );
    let s = running(&client, &ns.name, "offline", 2).await;
    assert_eq!(s.recovery_count, 1, "{s:#?}");
    support::cancel(&client, &ns.name, "offline").await;
    support::wait_status(
        &client,
        &ns.name,
        "offline",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    watch.abort();
    let log = log.lock().unwrap();
    assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
    assert_eq!(
        log.names_of("offline")
            .values()
            .map(BTreeSet::len)
            .sum::<usize>(),
        2
    );
}

/// A pipeline's pod task (a gang of 2) whose rank-0 Node is deleted: the task's attempt ends
/// lost within 5 s, one recovery of that task, which runs again as a gang of 2 while the next
/// task waits; 2 Pods per attempt of the task, never two attempts' alive at once.
#[tokio::test]
async fn a_pipeline_task_whose_node_is_deleted_is_recovered_as_one() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nodepipe").await;
    let pool = Pool::new(cp, &client, &ns.name, 3, "1").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(
        &client,
        &ns.name,
        &support::kwok::pipeline_on_pool("pipe", &ns.name, 2),
    )
    .await;
    running(&client, &ns.name, "pipe", 1).await;
    let rank0 = pod_of(&log.lock().unwrap(), "pipe", 1, 0);
    let node = node_of(&client, &ns.name, &rank0).await;

    let deleted = pool.delete(&client, &node).await;
    let (s, seen) = ended(&client, &ns.name, "pipe", 1).await;
    let took = seen - deleted;
    eprintln!(
        "MEASURED: the pipeline task's attempt ended lost {took:?} after its node was deleted"
    );
    let a = &s.attempts[0];
    assert_eq!(
        (
            a.task.as_deref(),
            a.rank,
            a.reason.as_str(),
            a.action.as_str()
        ),
        (Some("train"), Some(0), "NodeLost", "Recover"),
        "{s:#?}"
    );
    assert!(
        took <= LOST_WITHIN,
        "the attempt ended {took:?} after the deletion"
    );
    let s = running(&client, &ns.name, "pipe", 2).await;
    assert_eq!(s.current_task, Some(0), "{s:#?}");
    assert_eq!(
        (
            s.tasks[0].recovery_count,
            s.tasks[0].restart_count,
            s.ready_nodes.as_deref()
        ),
        (1, 0, Some("2/2")),
        "{s:#?}"
    );
    support::cancel(&client, &ns.name, "pipe").await;
    support::wait_status(
        &client,
        &ns.name,
        "pipe",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    watch.abort();
    let log = log.lock().unwrap();
    assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
    let names = log.names_of("pipe");
    assert_eq!(
        names.keys().copied().collect::<Vec<_>>(),
        [1, 2],
        "{names:?}"
    );
    assert!(names.values().all(|n| n.len() == 2), "{names:?}");
}

/// A gang of 2, one member's Node not Ready for 8 s and back, under a grace of 30 s: nothing
/// changes, through the end of the grace it would have had and beyond (both Pods running, no
/// attempt ended, two Pods over the whole test).
#[tokio::test]
async fn a_node_not_ready_and_back_within_the_grace_changes_nothing() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nodeflap").await;
    let pool = Pool::new(cp, &client, &ns.name, 2, "1").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--node-lost-grace-seconds", "30"]);
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &job_on_pool("flap", &ns.name, Some(2))).await;
    running(&client, &ns.name, "flap", 1).await;
    let rank1 = pod_of(&log.lock().unwrap(), "flap", 1, 1);
    let node = node_of(&client, &ns.name, &rank1).await;

    let since = pool.hold_not_ready(&client, &node).await;
    tokio::time::sleep(Duration::from_secs(8).saturating_sub(since.elapsed())).await;
    pool.release(&client, &node).await;
    let held = since.elapsed();
    assert!(
        held < Duration::from_secs(25),
        "held not Ready for {held:?}"
    );
    // Past the end of the grace the node would have had, and a world check period more.
    tokio::time::sleep(Duration::from_secs(40).saturating_sub(since.elapsed())).await;
    let s = running(&client, &ns.name, "flap", 1).await;
    assert!(s.attempts.is_empty(), "{s:#?}");
    assert_eq!(
        (s.recovery_count, s.restart_count, s.ready_nodes.as_deref()),
        (0, 0, Some("2/2")),
        "{s:#?}"
    );
    watch.abort();
    let log = log.lock().unwrap();
    let names = log.names_of("flap");
    assert_eq!(
        names.values().map(BTreeSet::len).sum::<usize>(),
        2,
        "{names:?}"
    );
    assert_eq!(
        log.present
            .values()
            .filter(|p| p.job == "flap" && p.alive)
            .count(),
        2,
        "both Pods still run"
    );
}

/// A Node not Ready past the grace (5 s here): its member is lost (reason `NodeNotReady`) once
/// the grace ends, within 5 s more; the Pod, which its node could not stop, is removed, and
/// the job runs again on the other node.
#[tokio::test]
async fn a_node_not_ready_past_the_grace_ends_its_attempt() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nodedown").await;
    let pool = Pool::new(cp, &client, &ns.name, 2, "1").await;
    let grace = Duration::from_secs(5);
    let _op = support::OperatorProcess::start(
        cp,
        &ns.name,
        &["--node-lost-grace-seconds", &grace.as_secs().to_string()],
    );
    let (watch, log) = watch_pods(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &job_on_pool("down", &ns.name, None)).await;
    running(&client, &ns.name, "down", 1).await;
    let first = pod_of(&log.lock().unwrap(), "down", 1, 0);
    let node = node_of(&client, &ns.name, &first).await;

    let since = pool.hold_not_ready(&client, &node).await;
    let (s, seen) = ended(&client, &ns.name, "down", 1).await;
    // From the condition's lastTransitionTime, which the API keeps in whole seconds: up to 1 s
    // before `since`.
    let took = seen - since + Duration::from_secs(1);
    eprintln!(
        "MEASURED: the Pod's attempt ended lost at most {took:?} after its node stopped being Ready (grace {grace:?})"
    );
    let a = &s.attempts[0];
    assert_eq!(
        (a.reason.as_str(), a.action.as_str()),
        ("NodeNotReady", "Recover"),
        "{s:#?}"
    );
    assert!(took >= grace, "lost {took:?} after, within the grace");
    assert!(took <= grace + LOST_WITHIN, "lost {took:?} after");
    let s = running(&client, &ns.name, "down", 2).await;
    assert_eq!(s.recovery_count, 1, "{s:#?}");
    let second = pod_of(&log.lock().unwrap(), "down", 2, 0);
    assert_ne!(node_of(&client, &ns.name, &second).await, node);
    support::cancel(&client, &ns.name, "down").await;
    support::wait_status(
        &client,
        &ns.name,
        "down",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    watch.abort();
    let log = log.lock().unwrap();
    assert!(log.overlaps.is_empty(), "{:?}", log.overlaps);
    assert_eq!(
        log.names_of("down")
            .values()
            .map(BTreeSet::len)
            .sum::<usize>(),
        2
    );
}
