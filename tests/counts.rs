//! Issue 30, class 3: counts that include what never happened, on the real dev control plane.
//! A job's status counts only attempts that started (the decision lives in
//! `lifecycle::tasks::shown`), and a Pod ended by its own `activeDeadlineSeconds` is named as
//! such (`lifecycle::pod::pod_deadline`). Every workload start is counted over the whole run
//! (local runs append to a file; every Pod name a watch saw).

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use managed_jobs::api::JobPhase;

const T: Duration = Duration::from_secs(90);

/// The issue's input: `run: 'exit 1'`, `maxRestartsOnErrors: 10`, `activeDeadlineSeconds: 5`.
/// Before, three attempts ran and the status said `attempt: 4, restartCount: 3`: the attempt
/// decided during the back-off never started. Now the job fails DeadlineExceeded and its
/// status counts the attempts that ran (every run counted in a file), each ended attempt
/// recorded once.
#[tokio::test]
async fn a_job_ended_by_its_deadline_during_a_back_off_counts_the_attempts_that_ran() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "counts").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let runs = tempfile::NamedTempFile::new().unwrap();
    let yaml = format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: exit1
spec:
  run: 'echo run >> {}; exit 1'
  recovery:
    maxRestartsOnErrors: 10
  activeDeadlineSeconds: 5
"#,
        runs.path().display()
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let done = support::wait_status(&client, &ns.name, "exit1", T, "a terminal phase", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Failed), "{:?}", s.message);
    assert_eq!(s.failure_reason.as_deref(), Some("DeadlineExceeded"));
    let ran = std::fs::read_to_string(runs.path())
        .unwrap()
        .lines()
        .count() as i32;
    assert!(
        ran >= 2,
        "the job restarted before its deadline ({ran} runs)"
    );
    assert_eq!(
        (s.attempt, s.restart_count),
        (ran, ran - 1),
        "the status counts the {ran} attempts that ran: {:?}",
        s.message
    );
    assert_eq!(s.attempts.len() as i32, ran, "{:?}", s.attempts);
    assert!(
        s.attempts.iter().all(|a| a.attempt <= ran),
        "an attempt that never ran is recorded: {:?}",
        s.attempts
    );
}

fn pod_job(name: &str) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  template:
    metadata:
      annotations: {{"managedjobs.dev/complete-after": "120s"}}
    spec:
      activeDeadlineSeconds: 30
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

/// A Pod ended by its own `activeDeadlineSeconds` (phase Failed, reason DeadlineExceeded), as
/// a kubelet leaves it, played on the dev control plane: without a container status, and with
/// its container terminated 137. Before, the first read "attempt 1 was refused by its node" and
/// the second's failure reason was `Error`, the deadline never mentioned. Now both fail
/// DeadlineExceeded (no restart allowed), the message naming the Pod's deadline; one Pod each.
#[tokio::test]
async fn a_pod_ended_by_its_own_deadline_is_named_as_such() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "poddeadline").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let message = "Pod was active on the node longer than the specified deadline";
    for (job, containers) in [
        ("bare", serde_json::Value::Null),
        (
            "killed",
            serde_json::json!([{
                "name": "main", "image": "busybox", "imageID": "", "ready": false,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 137, "reason": "Error",
                    "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:30Z"}}
            }]),
        ),
    ] {
        support::create_yaml(&client, &ns.name, &pod_job(job)).await;
        let name = support::pod_name(&client, &ns.name, job, 1).await;
        support::wait_status(&client, &ns.name, job, T, "Running", |s| {
            s.phase == Some(JobPhase::Running)
        })
        .await;
        let past = serde_json::json!({"status": {"phase": "Failed", "reason": "DeadlineExceeded",
            "message": message, "containerStatuses": containers}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Merge(&past))
            .await
            .expect("status patch");
    }
    for (job, code) in [("bare", None), ("killed", Some(137))] {
        let done = support::wait_status(&client, &ns.name, job, T, "a terminal phase", |s| {
            s.phase.is_some_and(|p| p.is_terminal())
        })
        .await;
        let s = done.status.unwrap();
        let said = s.message.clone().unwrap_or_default();
        assert_eq!(s.phase, Some(JobPhase::Failed), "{job}: {said}");
        assert_eq!(
            s.failure_reason.as_deref(),
            Some("DeadlineExceeded"),
            "{job}"
        );
        assert_eq!(s.exit_code, code, "{job}");
        assert!(
            said.contains("ran past its spec.activeDeadlineSeconds (30 s)")
                && !said.contains("refused"),
            "{job}: {said}"
        );
        assert_eq!((s.attempt, s.restart_count), (1, 0), "{job}");
        let attempt = s.attempts.first().expect("the attempt's record");
        assert_eq!(attempt.reason, "DeadlineExceeded", "{job}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    watch.abort();
    let seen = names.lock().unwrap().clone();
    let mut expected = BTreeSet::new();
    for job in ["bare", "killed"] {
        expected.insert(support::pod_name(&client, &ns.name, job, 1).await);
    }
    assert_eq!(seen, expected, "one Pod per job");
}
