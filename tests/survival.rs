//! Jobs outlive their operator (docs/design.md#processes-crashes-and-resumption), on the real dev control plane: restarts
//! are hand-overs (SIGTERM as in a rollout, SIGKILL of the operator with its job controllers as
//! in a container restart), a lost store is rebuilt from the objects' status and the labelled
//! Pods, and only a job's own Pods feed its status. Every Pod name a watch saw over the whole
//! test is counted, not only what is left at the end.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use managed_jobs::api::{JobPhase, ManagedJob, ManagedJobStatus};

const T: Duration = Duration::from_secs(90);

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
              cpu: 100m
              memory: 64Mi
"#
    )
}

fn local_job(name: &str, run: &str) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  run: {run:?}\n"
    )
}

async fn pod_names_so_far(client: &Client, ns: &str) -> BTreeSet<String> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect()
}

async fn status_of(client: &Client, ns: &str, name: &str) -> ManagedJobStatus {
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .unwrap()
        .status
        .unwrap_or_default()
}

async fn event_reasons(client: &Client, ns: &str, name: &str) -> Vec<String> {
    support::events_about(client, ns, name)
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect()
}

async fn events_about(client: &Client, ns: &str, name: &str) -> usize {
    support::events_about(client, ns, name).await.len()
}

#[tokio::test]
async fn five_operator_restarts_are_hand_overs() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "handover").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let runs = tempfile::tempdir().unwrap();
    let runs_file = runs.path().join("runs.txt");
    support::create_yaml(&client, &ns.name, &pod_job("long-pod", "45s")).await;
    let run = format!("echo started >> {}; sleep 35", runs_file.display());
    support::create_yaml(&client, &ns.name, &local_job("long-local", &run)).await;
    for job in ["long-pod", "long-local"] {
        support::wait_status(
            &client,
            &ns.name,
            job,
            T,
            "Running",
            support::phase_is(JobPhase::Running),
        )
        .await;
    }
    // Twice a rollout (SIGTERM), three times a container restart (SIGKILL of all).
    for round in 0..5 {
        if round < 2 {
            op.terminate();
        } else {
            op.kill_with_job_controllers();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        op.start_again();
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    for job in ["long-pod", "long-local"] {
        let mj = support::wait_status(&client, &ns.name, job, T, "Succeeded", |s| {
            s.phase.is_some_and(|p| p.is_terminal())
        })
        .await;
        let s = mj.status.unwrap();
        assert_eq!(s.phase, Some(JobPhase::Succeeded), "{job}: {:?}", s.message);
        assert_eq!((s.restart_count, s.recovery_count), (0, 0), "{job}");
        assert_eq!(s.attempt, 1, "{job}");
    }
    watch.abort();
    let mut seen = pod_names_so_far(&client, &ns.name).await;
    seen.extend(names.lock().unwrap().iter().cloned());
    assert_eq!(
        seen,
        BTreeSet::from([support::pod_name(&client, &ns.name, "long-pod", 1).await]),
        "exactly one Pod ever"
    );
    let runs = std::fs::read_to_string(&runs_file).unwrap();
    assert_eq!(runs, "started\n", "the local workload ran once");
    // No restart publishes an Event twice: one Launched per job.
    for job in ["long-pod", "long-local"] {
        let start = std::time::Instant::now();
        loop {
            let reasons = event_reasons(&client, &ns.name, job).await;
            let launched = reasons.iter().filter(|r| *r == "Launched").count();
            assert!(launched <= 1, "{job}: Events published twice: {reasons:?}");
            if reasons.iter().any(|r| r == "Succeeded") {
                assert_eq!(launched, 1, "{job}: {reasons:?}");
                break;
            }
            assert!(
                start.elapsed() < T,
                "{job}: no Succeeded Event: {reasons:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The Events of a job's transitions, in the order the API lists them, with a count per name.
async fn event_reasons_and_names(client: &Client, ns: &str, name: &str) -> (Vec<String>, usize) {
    let events = support::events_about(client, ns, name).await;
    let names: BTreeSet<String> = events.iter().map(|e| e.name_any()).collect();
    let mut reasons: Vec<String> = events.into_iter().filter_map(|e| e.reason).collect();
    reasons.sort();
    (reasons, names.len())
}

/// An operator stopped between a job's status write and its Events (a rollout, a crash) leaves
/// them to the next one, which publishes each once; one stopped between an Event's create and
/// its record publishes it again under the same name, which the API refuses: none lost, none
/// shown twice. (The window is a few milliseconds; here it is held open: the first operator
/// publishes no Events, the last finds them unrecorded.)
#[tokio::test]
async fn events_a_stopped_operator_left_are_published_once_by_the_next() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "leftevents").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &["--events", "false"]);
    support::create_yaml(&client, &ns.name, &local_job("quick", "true")).await;
    support::wait_status(
        &client,
        &ns.name,
        "quick",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(events_about(&client, &ns.name, "quick").await, 0);
    op.kill();
    op.start_again_with(&[]);
    let expected = vec!["Launched".to_string(), "Succeeded".to_string()];
    let start = std::time::Instant::now();
    loop {
        let (reasons, _) = event_reasons_and_names(&client, &ns.name, "quick").await;
        if reasons == expected {
            break;
        }
        assert!(
            start.elapsed() < T && reasons.len() < 2,
            "the Events left behind: {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Stopped after the creates and before their record: the next operator publishes again.
    let db = managed_jobs::state_dir::StateDir::new(op.state_path()).store();
    // The operator may hold the store's lock a moment (recovering its log after a kill).
    let open = || {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn
    };
    let recorded = || -> i64 {
        open()
            .query_row("SELECT count(*) FROM events_published", [], |r| r.get(0))
            .unwrap()
    };
    let start = std::time::Instant::now();
    while recorded() == 0 {
        assert!(
            start.elapsed() < T,
            "the Events were never recorded published"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    op.kill();
    open().execute("DELETE FROM events_published", []).unwrap();
    op.start_again();
    let start = std::time::Instant::now();
    while recorded() == 0 {
        if start.elapsed() > T {
            let row: (i64, i64, i64) = open()
                .query_row(
                    "SELECT status_version, synced_version,
                        (SELECT max(id) FROM transitions) FROM jobs",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .unwrap();
            panic!("the Events were never published again; (status, synced, last history) {row:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (reasons, names) = event_reasons_and_names(&client, &ns.name, "quick").await;
    assert_eq!((reasons, names), (expected, 2), "each Event once");
    // Both later operators found what was left (the log holds every run's lines).
    let log = op.log();
    let sweeps = log
        .matches("publishing the Events a stopped operator left")
        .count();
    assert_eq!(sweeps, 2, "{log}");
}

#[tokio::test]
async fn a_lost_store_is_rebuilt_from_status_and_pods() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "loststore").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &local_job("finished", "echo done")).await;
    support::create_yaml(&client, &ns.name, &pod_job("survivor", "30s")).await;
    let finished = support::wait_status(
        &client,
        &ns.name,
        "finished",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    let running = support::wait_status(
        &client,
        &ns.name,
        "survivor",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let pod_id = running.status.unwrap().job_id.unwrap();
    // Let the finished job's Events go out, then take its whole status.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = serde_json::to_value(status_of(&client, &ns.name, "finished").await).unwrap();
    let events_before = events_about(&client, &ns.name, "finished").await;
    let old_ids = [finished.status.unwrap().job_id.unwrap(), pod_id];
    // Lose the store while the operator is down.
    op.kill_with_job_controllers();
    std::fs::remove_dir_all(op.state_path()).unwrap();
    std::fs::create_dir_all(op.state_path()).unwrap();
    op.start_again();
    let mj = support::wait_status(&client, &ns.name, "survivor", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!(s.job_id, Some(pod_id), "the job keeps its id");
    assert_eq!((s.attempt, s.restart_count, s.recovery_count), (1, 0, 0));
    let after = serde_json::to_value(status_of(&client, &ns.name, "finished").await).unwrap();
    assert_eq!(
        after, before,
        "a finished job's status is kept byte for byte"
    );
    assert_eq!(
        events_about(&client, &ns.name, "finished").await,
        events_before,
        "no new Events for a finished job"
    );
    // A job created now gets an id above every old one.
    support::create_yaml(&client, &ns.name, &local_job("newcomer", "true")).await;
    let new = support::wait_status(
        &client,
        &ns.name,
        "newcomer",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    let new_id = new.status.unwrap().job_id.unwrap();
    assert!(
        old_ids.iter().all(|&old| new_id > old),
        "{new_id} vs {old_ids:?}"
    );
    watch.abort();
    let mut seen = pod_names_so_far(&client, &ns.name).await;
    seen.extend(names.lock().unwrap().iter().cloned());
    assert_eq!(
        seen,
        BTreeSet::from([support::pod_name(&client, &ns.name, "survivor", 1).await]),
        "one Pod ever"
    );
}

/// A Pod that carries a job's labels and owner but is not the attempt's Pod by name (a copy, a
/// relabelled Pod) never feeds the job's status. (Another namespace is the same check,
/// `executor::pod::is_attempt_pod`, unit-tested; a namespaced test operator cannot watch it.)
#[tokio::test]
async fn a_pod_with_a_jobs_labels_and_owner_but_not_its_name_changes_nothing() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "fence").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(&client, &ns.name, &pod_job("fenced", "12s")).await;
    let running = support::wait_status(
        &client,
        &ns.name,
        "fenced",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let _ = running;
    let real: Pod = Api::<Pod>::namespaced(client.clone(), &ns.name)
        .get(&support::pod_name(&client, &ns.name, "fenced", 1).await)
        .await
        .unwrap();
    // A copy beside it: same labels and owner, another name, failing at once with code 7.
    let mut fake = Pod {
        metadata: real.metadata.clone(),
        spec: real.spec.clone(),
        status: None,
    };
    fake.metadata.name = Some(format!(
        "{}-copy",
        support::pod_name(&client, &ns.name, "fenced", 1).await
    ));
    fake.metadata.resource_version = None;
    fake.metadata.uid = None;
    fake.metadata.creation_timestamp = None;
    fake.metadata.managed_fields = None;
    let annotations = fake.metadata.annotations.get_or_insert_default();
    annotations.insert("managedjobs.dev/complete-after".into(), "1s".into());
    annotations.insert("managedjobs.dev/exit-code".into(), "7".into());
    if let Some(spec) = fake.spec.as_mut() {
        spec.node_name = None;
    }
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &fake)
        .await
        .expect("the copy is created");
    let mj = support::wait_status(&client, &ns.name, "fenced", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!(
        (s.exit_code, s.restart_count, s.recovery_count),
        (Some(0), 0, 0)
    );
    assert_eq!(s.failure_reason, None);
}

/// A container's arguments and its plain (name, value) environment.
type Command = (Vec<String>, Vec<(String, String)>);

/// The arguments and plain environment of the operator container that the chart renders with
/// `values` (`helm template`), by `hack/controlplane.sh helm`.
fn chart_command(values: &[&str]) -> Option<Command> {
    let mut args = vec!["helm", "template", "mj", "charts/managed-jobs"];
    for v in values {
        args.extend(["--set", v]);
    }
    let out = std::process::Command::new(support::root().join("hack/controlplane.sh"))
        .args(&args)
        .current_dir(support::root())
        .output()
        .ok()?;
    if !out.status.success() {
        assert!(
            std::env::var("CI").unwrap_or_default().is_empty(),
            "helm template failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for doc in text.split("\n---") {
        let Ok(v) = serde_norway::from_str::<serde_json::Value>(doc) else {
            continue;
        };
        if v["kind"] != "StatefulSet" {
            continue;
        }
        let c = &v["spec"]["template"]["spec"]["containers"][0];
        let args = c["args"]
            .as_array()?
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect();
        let env = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_string(),
                    e["value"].as_str()?.to_string(),
                ))
            })
            .collect();
        return Some((args, env));
    }
    None
}

/// Prints the operator's log when the test fails (a wait that gives up says what the API
/// showed, not why the operator did not act).
struct DumpOnPanic(std::path::PathBuf);

impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- the operator's log ({}):\n{}",
                self.0.display(),
                std::fs::read_to_string(&self.0).unwrap_or_default()
            );
        }
    }
}

/// The chart as a user installs it with `persistence.enabled=false` (an emptyDir: each restart
/// of the operator's pod starts on an empty state dir), run as the container would run it: the
/// binary with exactly the rendered flags and environment, the pod's downward-API values, and a
/// fresh state dir at each start. Three times, the "pod" is deleted (operator and job
/// controllers SIGKILLed, the emptyDir gone) during a pod job: the job succeeds, one Pod ever.
#[tokio::test]
async fn a_chart_installed_operator_on_an_empty_dir_survives_three_pod_deletions() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "chartrestart").await;
    let Some((args, env)) = chart_command(&[
        "persistence.enabled=false",
        &format!("watchNamespace={}", ns.name),
    ]) else {
        support::record_skip(
            "a_chart_installed_operator_on_an_empty_dir_survives_three_pod_deletions: helm",
        );
        return;
    };
    assert_eq!(args.first().map(String::as_str), Some("run"), "{args:?}");
    let port = support::free_port();
    let pod_namespace = ns.name.clone();
    let start = |state: &std::path::Path, log: &std::path::Path| -> std::process::Child {
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if a.starts_with("--state-dir=") {
                    format!("--state-dir={}", state.display())
                } else if a.starts_with("--metrics-addr=") {
                    format!("--metrics-addr=127.0.0.1:{port}")
                } else {
                    a.replace("$(POD_NAMESPACE)", &pod_namespace)
                }
            })
            .collect();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        std::process::Command::new(support::binary())
            .args(&args)
            .envs(env.iter().map(|(k, v)| (k.clone(), v.clone())))
            .env("POD_NAME", "mj-managed-jobs-0")
            .env("POD_NAMESPACE", &pod_namespace)
            .env("KUBECONFIG", &cp.kubeconfig)
            .env("TMPDIR", std::env::temp_dir())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting the operator with the chart's flags")
    };
    let root = tempfile::tempdir().unwrap();
    let log = root.path().join("operator.log");
    let _dump = DumpOnPanic(log.clone());
    let state = root.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mut op = start(&state, &log);
    // The kubelet restarts a container whose process exits (restartPolicy Always; the emptyDir
    // stays): so does this test, or an operator that exits at start on an API error the loaded
    // machine caused would leave the job unseen.
    let wait = async |op: &mut std::process::Child,
                      what: &str,
                      done: &dyn Fn(&ManagedJobStatus) -> bool| {
        let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
        let begun = std::time::Instant::now();
        loop {
            if let Ok(mj) = api.get("sturdy").await
                && mj.status.as_ref().is_some_and(done)
            {
                return mj;
            }
            if let Ok(Some(exit)) = op.try_wait() {
                eprintln!("the operator exited ({exit}); restarted as the kubelet would");
                *op = start(&state, &log);
            }
            assert!(
                begun.elapsed() < T,
                "sturdy never reached {what} within {T:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    support::create_yaml(&client, &ns.name, &pod_job("sturdy", "30s")).await;
    let running = wait(&mut op, "Running", &support::phase_is(JobPhase::Running)).await;
    let id = running.status.unwrap().job_id.unwrap();
    let kill_all = |op: &mut std::process::Child| {
        let _ = op.kill();
        let _ = op.wait();
        let dir = state.to_string_lossy().into_owned();
        for pid in managed_jobs::process::find_by_arguments(&["job-controller", &dir]) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    };
    for _ in 0..3 {
        kill_all(&mut op);
        // The pod is gone and with it its emptyDir.
        std::fs::remove_dir_all(&state).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        op = start(&state, &log);
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    let done = wait(&mut op, "a terminal phase", &|s: &ManagedJobStatus| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    kill_all(&mut op);
    let s = done.status.unwrap();
    assert_eq!(
        s.phase,
        Some(JobPhase::Succeeded),
        "{:?}\n{}",
        s.message,
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(
        (s.job_id, s.attempt, s.recovery_count, s.restart_count),
        (Some(id), 1, 0, 0)
    );
    watch.abort();
    let mut seen = pod_names_so_far(&client, &ns.name).await;
    seen.extend(names.lock().unwrap().iter().cloned());
    assert_eq!(
        seen,
        BTreeSet::from([support::pod_name(&client, &ns.name, "sturdy", 1).await]),
        "one Pod ever"
    );
}
