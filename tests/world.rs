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

fn local_job_yaml(name: &str, run: &str) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  run: {run:?}\n"
    )
}

/// The pid of a local job's workload, from its status (`pid/N`).
async fn workload_pid(client: &kube::Client, ns: &str, name: &str) -> i32 {
    let mj = support::wait_status(client, ns, name, T, "Running", |s| {
        s.phase == Some(JobPhase::Running)
    })
    .await;
    mj.status
        .unwrap()
        .workload
        .unwrap()
        .trim_start_matches("pid/")
        .parse()
        .unwrap()
}

/// True while process `pid` exists (and is no zombie).
fn alive(pid: i32) -> bool {
    managed_jobs::process::start_time(pid).is_some()
}

/// Waits up to `timeout` for `pred`, polling every 200 ms; panics naming `what`.
async fn eventually(timeout: Duration, what: &str, mut pred: impl FnMut() -> bool) {
    let start = Instant::now();
    while !pred() {
        assert!(start.elapsed() < timeout, "never: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Class 1, a ManagedJob that disappears without the operator seeing its deletion keeps its
/// workload: with the operator stopped, a running local job and a running pod job lose their
/// finalizer by hand and are deleted. The operator, started again, cancels both as deletions
/// at once: the local workload is stopped, no Pod is ever created again for the vanished pod
/// job (the garbage collector took its Pod), both run slots go to the job queued behind them,
/// and the rows are forgotten. Another restart changes nothing: the local workload started once
/// over the whole test.
#[tokio::test]
async fn jobs_deleted_while_no_operator_watched_are_stopped_and_release_their_slots() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "vanished").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &["--run-cap", "2"]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let out = tempfile::tempdir().unwrap();
    let starts = out.path().join("starts");
    let run = format!("echo started >> {}; sleep 300", starts.display());
    support::create_yaml(&client, &ns.name, &local_job_yaml("gone-local", &run)).await;
    support::create_yaml(&client, &ns.name, &pod_job_yaml("gone-pod", "600s", "")).await;
    let pid = workload_pid(&client, &ns.name, "gone-local").await;
    support::wait_status(
        &client,
        &ns.name,
        "gone-pod",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let first_pod = support::pod_name(&client, &ns.name, "gone-pod", 1).await;
    let uids: Vec<String> = {
        let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
        let mut uids = Vec::new();
        for name in ["gone-local", "gone-pod"] {
            uids.push(api.get(name).await.unwrap().uid().unwrap());
        }
        uids
    };
    // Queued behind them: both run slots are held.
    support::create_yaml(&client, &ns.name, &local_job_yaml("next", "true")).await;
    support::wait_status(&client, &ns.name, "next", T, "Pending", |s| {
        s.phase == Some(JobPhase::Pending)
    })
    .await;
    op.terminate();
    for name in ["gone-local", "gone-pod"] {
        let (ok, out) = support::kubectl(
            cp,
            &[
                "-n",
                &ns.name,
                "patch",
                "managedjob",
                name,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ],
        );
        assert!(ok, "{out}");
        support::delete(&client, &ns.name, name).await;
        support::wait_gone(&client, &ns.name, name, T).await;
    }
    // The garbage collector removes the orphaned Pod meanwhile.
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name);
    let start = Instant::now();
    while pods.get_opt(&first_pod).await.unwrap().is_some() {
        assert!(
            start.elapsed() < T,
            "the garbage collector kept {first_pod}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    op.start_again();
    eventually(T, "the vanished job's workload stopped", || !alive(pid)).await;
    let next = support::wait_status(&client, &ns.name, "next", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    assert_eq!(next.status.unwrap().phase, Some(JobPhase::Succeeded));
    // Forgotten: no row keeps either job (within a world check period).
    let store_path = managed_jobs::state_dir::StateDir::new(op.state_path()).store();
    eventually(
        Duration::from_secs(60),
        "the vanished jobs forgotten",
        || {
            let store = managed_jobs::store::Store::open(&store_path, 256).unwrap();
            uids.iter().all(|u| store.find_by_uid(u).unwrap().is_none())
        },
    )
    .await;
    op.restart();
    tokio::time::sleep(Duration::from_secs(5)).await;
    watch.abort();
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), "started\n");
    let seen = names.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([first_pod]),
        "no Pod for a vanished job"
    );
}

/// Class 2, a job in a terminal phase keeps its Pod: a pod job whose job controller is killed
/// `--max-controller-crashes` (2) times ends FailedController, and its running Pod is deleted
/// at once (not left running until the object is deleted); an operator restart creates none.
#[tokio::test]
async fn a_pod_job_given_up_for_its_controller_keeps_no_running_pod() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "givenup").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &["--max-controller-crashes", "2"]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &pod_job_yaml("crashy", "600s", "")).await;
    support::wait_status(
        &client,
        &ns.name,
        "crashy",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let pod = support::pod_name(&client, &ns.name, "crashy", 1).await;
    let mut killed = Vec::new();
    for _ in 0..2 {
        let start = Instant::now();
        let pid = loop {
            let found = op
                .job_controllers()
                .into_iter()
                .map(|(_, pid)| pid)
                .find(|pid| !killed.contains(pid));
            if let Some(pid) = found {
                break pid;
            }
            assert!(start.elapsed() < T, "no job controller to kill");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        killed.push(pid);
    }
    let failed = support::wait_status(&client, &ns.name, "crashy", T, "a final phase", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await
    .status
    .unwrap();
    assert_eq!(
        failed.phase,
        Some(JobPhase::FailedController),
        "{:?}",
        failed.message
    );
    let given_up = Instant::now();
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name);
    while pods.get_opt(&pod).await.unwrap().is_some() {
        assert!(
            given_up.elapsed() < Duration::from_secs(30),
            "{pod} still exists {:?} after the job failed",
            given_up.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = given_up.elapsed();
    op.restart();
    tokio::time::sleep(Duration::from_secs(5)).await;
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(seen, BTreeSet::from([pod]), "one Pod ever");
    println!("the Pod was gone {took:?} after the job failed");
}

/// CPU time (user + system, clock ticks) of process `pid` so far.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Class 3, after a lost store the old store's job controllers live on: the operator is
/// killed (its job controllers live on), its state dir deleted, and it starts again on an empty
/// one. The store is rebuilt from the objects' status and the running workloads are adopted;
/// the old store's job controllers exit without touching them (fencing), so each job has one
/// job controller. A cancel stops its job; nothing spins; the other job succeeds on its first
/// attempt, and each workload started once over the whole test.
#[tokio::test]
async fn a_lost_stores_job_controllers_exit_and_leave_their_workloads_to_the_new_store() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "fencing").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let out = tempfile::tempdir().unwrap();
    let starts = |job: &str| out.path().join(format!("{job}.starts"));
    for (job, secs) in [("finisher", 25), ("cancelled", 300)] {
        let run = format!("echo started >> {}; sleep {secs}", starts(job).display());
        support::create_yaml(&client, &ns.name, &local_job_yaml(job, &run)).await;
    }
    let pids = [
        workload_pid(&client, &ns.name, "finisher").await,
        workload_pid(&client, &ns.name, "cancelled").await,
    ];
    // Let the Running statuses (the rebuild's source) be written.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old: Vec<i32> = op.job_controllers().into_iter().map(|(_, p)| p).collect();
    assert_eq!(old.len(), 2, "{old:?}");
    op.kill();
    std::fs::remove_dir_all(op.state_path()).unwrap();
    std::fs::create_dir_all(op.state_path()).unwrap();
    op.start_again();
    let restarted = Instant::now();
    eventually(
        Duration::from_secs(45),
        "the old store's job controllers exited",
        || old.iter().all(|&p| !alive(p)),
    )
    .await;
    let fenced_after = restarted.elapsed();
    eventually(T, "one job controller per job", || {
        let now = op.job_controllers();
        let mut ids: Vec<i64> = now.iter().map(|(id, _)| *id).collect();
        ids.sort();
        ids.dedup();
        now.len() == 2 && ids.len() == 2
    })
    .await;
    assert!(
        pids.iter().all(|&p| alive(p)),
        "the workloads were left alone"
    );
    support::cancel(&client, &ns.name, "cancelled").await;
    support::wait_status(
        &client,
        &ns.name,
        "cancelled",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    assert!(!alive(pids[1]), "the cancelled workload is stopped");
    // Nothing spins: every job controller left idles over 2 s.
    let controllers: Vec<i32> = op.job_controllers().into_iter().map(|(_, p)| p).collect();
    let before: Vec<Option<u64>> = controllers.iter().map(|&p| cpu_ticks(p)).collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (pid, before) in controllers.iter().zip(before) {
        if let (Some(b), Some(a)) = (before, cpu_ticks(*pid)) {
            assert!(
                a - b < 50,
                "job controller {pid} used {} ticks in 2 s",
                a - b
            );
        }
    }
    let done = support::wait_status(&client, &ns.name, "finisher", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await
    .status
    .unwrap();
    assert_eq!(done.phase, Some(JobPhase::Succeeded), "{:?}", done.message);
    assert_eq!((done.attempt, done.recovery_count), (1, 0));
    for job in ["finisher", "cancelled"] {
        assert_eq!(
            std::fs::read_to_string(starts(job)).unwrap(),
            "started\n",
            "{job} ran once"
        );
    }
    println!("the old store's job controllers exited {fenced_after:?} after the restart");
}

/// Class 7, jobs that cannot run starve jobs that can: run cap 5; 10 pod jobs request more CPU
/// than any node has (launchTimeoutSeconds 5), then one that fits, all at one priority. A Pod
/// no node takes gives its run slot back after its launch timeout while other jobs wait (its
/// job goes to the back of the queue, a Requeued Event says so), so the fitting job runs
/// within a bounded time; while it waits, its message names the run slot (never a launch slot,
/// none of which is in use).
#[tokio::test]
async fn jobs_whose_pods_no_node_takes_do_not_starve_a_job_that_fits() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "starve").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--run-cap", "5"]);
    let unfit = |name: &str| {
        pod_job_yaml(name, "600s", "  launchTimeoutSeconds: 5\n")
            .replace("cpu: 100m", "cpu: \"64\"")
    };
    for i in 0..10 {
        support::create_yaml(&client, &ns.name, &unfit(&format!("big-{i}"))).await;
    }
    // Created one second later: behind every unfit job in FIFO order.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let created = Instant::now();
    support::create_yaml(&client, &ns.name, &pod_job_yaml("fits", "1s", "")).await;
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    let mut messages: Vec<String> = Vec::new();
    let done = loop {
        let s = api.get("fits").await.unwrap().status.unwrap_or_default();
        if s.phase == Some(JobPhase::Pending)
            && let Some(m) = &s.message
            && messages.last() != Some(m)
        {
            messages.push(m.clone());
        }
        if s.phase.is_some_and(|p| p.is_terminal()) {
            break s;
        }
        assert!(
            created.elapsed() < T,
            "the job that fits never ran; its messages: {messages:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = created.elapsed();
    assert_eq!(done.phase, Some(JobPhase::Succeeded), "{:?}", done.message);
    assert!(
        messages
            .iter()
            .any(|m| m.contains("waiting for a run slot")),
        "{messages:#?}"
    );
    assert!(
        !messages.iter().any(|m| m.contains("launch slot")),
        "no launch slot was missing: {messages:#?}"
    );
    let e = support::wait_event(&client, &ns.name, "big-0", "Requeued", T).await;
    let note = e.message.clone().unwrap_or_default();
    assert!(note.contains("run slot given back"), "{note}");
    println!("the job that fits ran {took:?} after its creation; its messages: {messages:#?}");
}

/// Class 9, the smaller ones (Events): 100 jobs with `ttlSecondsAfterFinished: 0` created at
/// once, by an operator whose `POD_NAME` has 200 characters (longer than the 128 an Event's
/// `reportingInstance` may have). Every job is deleted at once when it finishes, and every one
/// got its Launched and Succeeded Events first (before, 41 of 100 got none, and a long
/// `POD_NAME` lost them all).
#[tokio::test]
async fn every_job_deleted_at_its_end_gets_its_events_whatever_the_pod_name() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "ttlevents").await;
    let pod_name = "p".repeat(200);
    let _op = support::OperatorProcess::start_with_env(
        cp,
        &ns.name,
        &[],
        &[("POD_NAME", pod_name.as_str())],
    );
    const JOBS: usize = 100;
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    let names: Vec<String> = (0..JOBS).map(|i| format!("quick-{i}")).collect();
    futures::future::join_all(names.iter().map(|name| {
        let yaml = format!(
            "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  run: \"true\"\n  ttlSecondsAfterFinished: 0\n"
        );
        let api = api.clone();
        async move {
            let mj: ManagedJob = serde_norway::from_str(&yaml).unwrap();
            api.create(&PostParams::default(), &mj).await.unwrap();
        }
    }))
    .await;
    let start = Instant::now();
    loop {
        let left = api
            .list_metadata(&Default::default())
            .await
            .unwrap()
            .items
            .len();
        if left == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "{left} jobs never deleted"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut missing = Vec::new();
    for name in &names {
        let reasons: BTreeSet<String> = events
            .iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name.as_str()))
            .filter_map(|e| e.reason.clone())
            .collect();
        if !(reasons.contains("Launched") && reasons.contains("Succeeded")) {
            missing.push((name.clone(), reasons));
        }
    }
    assert!(missing.is_empty(), "jobs without their Events: {missing:?}");
    let instance = events
        .iter()
        .find_map(|e| e.reporting_instance.clone())
        .unwrap_or_default();
    assert!(
        instance.len() <= 128 && instance.starts_with("ppp"),
        "{instance}"
    );
}

/// Class 9, the smaller ones (namespace deletion is a cancel): a pod job's namespace is deleted
/// while the job's Pod create fails (a failing webhook) and no operator runs; the job
/// controller's next create is refused because the namespace is being deleted, which cancels
/// the job. Started again, the operator writes its final status before letting the object go:
/// the phases seen over the whole test end Cancelled and never show FailedPrecheck.
#[tokio::test]
async fn a_job_in_a_namespace_being_deleted_is_cancelled_not_failed() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "nsdelete").await;
    let _hook = FailingWebhook::install(&client, cp, &ns.name).await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(&client, &ns.name, &pod_job_yaml("doomed", "1s", "")).await;
    support::wait_status(&client, &ns.name, "doomed", T, "a failing create", |s| {
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("failed, trying again"))
    })
    .await;
    op.kill();
    let (ok, out) = support::kubectl(cp, &["delete", "namespace", &ns.name, "--wait=false"]);
    assert!(ok, "{out}");
    // The job controller alone meets the refusal and cancels the job in the store (no
    // operator runs to see the deletion).
    let store_path = managed_jobs::state_dir::StateDir::new(op.state_path()).store();
    let mut in_store = None;
    eventually(
        Duration::from_secs(30),
        "the job cancelled in the store",
        || {
            let store = managed_jobs::store::Store::open(&store_path, 256).unwrap();
            let row = store.find_by_name(&ns.name, "doomed").unwrap().pop();
            let done = row
                .as_ref()
                .is_some_and(|r| r.schedule_state == managed_jobs::api::ScheduleState::Done);
            in_store = row;
            done
        },
    )
    .await;
    let row = in_store.unwrap();
    assert_eq!(row.phase, JobPhase::Cancelled, "{}", row.message);
    op.start_again();
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    let mut phases: Vec<JobPhase> = Vec::new();
    let start = Instant::now();
    while let Some(mj) = api.get_opt("doomed").await.unwrap() {
        if let Some(p) = mj.status.and_then(|s| s.phase)
            && phases.last() != Some(&p)
        {
            phases.push(p);
        }
        assert!(start.elapsed() < T, "never deleted; phases {phases:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!phases.contains(&JobPhase::FailedPrecheck), "{phases:?}");
    assert_eq!(phases.last(), Some(&JobPhase::Cancelled), "{phases:?}");
}
