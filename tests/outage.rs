//! Issue 30, class 4: the world seen again within seconds after an API outage. Alone in its
//! binary, on a control plane of its own (`support::OwnControlPlane`), whose kube-apiserver it
//! kills and starts again: nothing else runs against it.
//!
//! Before: the API server killed for about 50 s while pod and local jobs ran; the operator's
//! Pod watch saw Pod changes again 57 s and 65 s after the API was back (kube's watch back-off
//! grows to 30 s, and its per-job status back-off kept growing while nothing could be written),
//! Pod completions were noticed 8 to 10 s late afterwards, and one job's Running never reached
//! its status. Now every watch retries at most every 2 s, status writes pause for a second while
//! the API cannot be reached (no per-job back-off), the claim is renewed at once, and the store
//! is checked against the world as soon as the watches listed again.
//!
//! `MJ_OUTAGE_SECONDS` sets another outage than the 45 s of the issue's (e.g. for a quick
//! look); `MJ_LOG_LINES` how much of the operator's log a failure prints.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use managed_jobs::api::JobPhase;

const T: Duration = Duration::from_secs(120);
/// How long the API server stays down.
const OUTAGE: Duration = Duration::from_secs(45);
/// What "within a few seconds" of the API's return must mean for every figure below (each was
/// about a minute before): generous for a loaded 2-core machine; the figures are printed.
const BOUND: Duration = Duration::from_secs(20);

fn local_job(name: &str, runs: &std::path::Path, sleep: u32) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  run: 'echo "$MANAGEDJOB_NAME $MANAGEDJOB_ATTEMPT" >> {runs}; sleep {sleep}'
"#,
        runs = runs.display()
    )
}

fn pod_job(name: &str, complete_after: &str) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  template:
    metadata:
      annotations: {{"managedjobs.dev/complete-after": "{complete_after}"}}
    spec:
      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: 10m
              memory: 16Mi
"#
    )
}

/// Every Pod name seen in `ns` over the whole run, through a watch that retries quickly (it
/// outlives the outage).
fn watch_pods(
    client: &Client,
    ns: &str,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<BTreeSet<String>>>,
) {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let names = std::sync::Arc::new(std::sync::Mutex::new(BTreeSet::new()));
    let seen = names.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .backoff(managed_jobs::operator::watch_backoff())
            .boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p),
            ) = ev
            {
                seen.lock().unwrap().insert(p.name_any());
            }
        }
    });
    (task, names)
}

async fn phase_within(client: &Client, ns: &str, name: &str, phase: JobPhase) -> Duration {
    let start = Instant::now();
    support::wait_status(client, ns, name, T, &format!("{phase}"), |s| {
        s.phase == Some(phase)
    })
    .await;
    start.elapsed()
}

#[tokio::test]
async fn after_an_api_outage_every_watch_lists_again_and_the_store_agrees_within_seconds() {
    let Some(own) = support::OwnControlPlane::start("outage", 2) else {
        return;
    };
    let cp = &own.cp;
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "outage").await;
    let runs = tempfile::NamedTempFile::new().unwrap();
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, pods) = watch_pods(&client, &ns.name);
    // Through the outage: a local job that runs on (never stopped for it), one that ends
    // while the API is down, a Pod that runs on and one the test ends after the return.
    support::create_yaml(&client, &ns.name, &local_job("spans", runs.path(), 75)).await;
    support::create_yaml(&client, &ns.name, &local_job("ends-down", runs.path(), 15)).await;
    support::create_yaml(&client, &ns.name, &pod_job("pod-spans", "80s")).await;
    support::create_yaml(&client, &ns.name, &pod_job("pod-failed", "600s")).await;
    for name in ["spans", "ends-down", "pod-spans", "pod-failed"] {
        support::wait_status(&client, &ns.name, name, T, "Running", |s| {
            s.phase == Some(JobPhase::Running)
        })
        .await;
    }
    let pod_failed = support::pod_name(&client, &ns.name, "pod-failed", 1).await;

    own.kill_apiserver();
    let outage = std::env::var("MJ_OUTAGE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(OUTAGE, Duration::from_secs);
    tokio::time::sleep(outage).await;
    own.start_apiserver();
    let back = Instant::now();
    assert!(
        op.wait_exit(Duration::ZERO).is_none(),
        "the operator died during the outage:\n{}",
        op.log()
    );

    // (1) A ManagedJob created once the API is back: the ManagedJob watch, the claim and the
    // status writes all work again.
    support::create_yaml(&client, &ns.name, &local_job("after", runs.path(), 0)).await;
    let new_job =
        back.elapsed() + phase_within(&client, &ns.name, "after", JobPhase::Succeeded).await;
    // (2) What happened while the API was down reaches the status.
    let ended_down =
        back.elapsed() + phase_within(&client, &ns.name, "ends-down", JobPhase::Succeeded).await;
    // (3) A Pod change once the API is back: the Pod watch lists again and sees it.
    let failed = serde_json::json!({"status": {"phase": "Failed", "containerStatuses": [{
        "name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 3, "reason": "Error",
            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z"}}}]}});
    let patched = Instant::now();
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .patch_status(&pod_failed, &PatchParams::default(), &Patch::Merge(&failed))
        .await
        .expect("status patch");
    let pod_change = phase_within(&client, &ns.name, "pod-failed", JobPhase::Failed).await;
    let pod_seen = patched.duration_since(back) + pod_change;
    println!(
        "after a {} s API outage, measured from the API's return: a new job Succeeded after \
         {:.1} s, a job that ended during the outage showed it after {:.1} s, a Pod failed \
         after the return was seen (status Failed) {:.1} s after its change, {:.1} s after the \
         return",
        OUTAGE.as_secs(),
        new_job.as_secs_f64(),
        ended_down.as_secs_f64(),
        pod_change.as_secs_f64(),
        pod_seen.as_secs_f64()
    );
    for (what, took) in [
        ("a new job", new_job),
        ("a job that ended during the outage", ended_down),
        ("a Pod change", pod_seen),
    ] {
        assert!(
            took < BOUND,
            "{what} was seen {took:?} after the API returned"
        );
    }
    let log = op.log();
    for watch in ["ManagedJob", "Pod", "claim Lease"] {
        assert!(
            log.contains(&format!("the {watch} watch lists again")),
            "the {watch} watch never said it lists again:\n{log}"
        );
    }
    // Nothing doubled, nothing stopped for the outage.
    for name in ["spans", "pod-spans"] {
        let done = support::wait_status(&client, &ns.name, name, T, "a terminal phase", |s| {
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
        assert_eq!(
            (s.attempt, s.restart_count, s.recovery_count),
            (1, 0, 0),
            "{name}"
        );
    }
    let started: Vec<String> = std::fs::read_to_string(runs.path())
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        started.iter().cloned().collect::<BTreeSet<_>>(),
        BTreeSet::from(["after 1".into(), "ends-down 1".into(), "spans 1".into()]),
        "each local job ran once: {started:?}"
    );
    assert_eq!(started.len(), 3, "{started:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    watch.abort();
    let seen = pods.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([
            support::pod_name(&client, &ns.name, "pod-spans", 1).await,
            pod_failed.clone(),
        ]),
        "one Pod per pod job"
    );
    assert!(op.wait_exit(Duration::ZERO).is_none(), "the operator died");
}
