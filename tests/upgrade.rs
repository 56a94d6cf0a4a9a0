//! The backward-compatibility test, host-process form (docs/upgrades.md): jobs started by the
//! previous release (`hack/previous-release`, built by `hack/previous-release.sh build`, as
//! SkyPilot's `tests/backward_compatibility_tests.sh` builds its own) end under this build as they
//! would have without the upgrade.
//!
//! The upgrade is the one a user of a host install makes (docs/tasks/upgrade.md): the old operator
//! is stopped with SIGTERM (its job controllers stay, as documented), this release's CRDs are
//! applied, and this build's operator is started on the same state dir. At that moment there are
//! jobs in every state: finished (local and pod), running (local, pod, a local pipeline in its
//! first task), in a restart back-off, and queued behind the run cap (in a ManagedJobQueue of
//! the previous release). Running workloads wait for a signal the test gives after the upgrade
//! (a file, a Pod annotation), so every one of them spans it whatever the machine's speed.
//!
//! Counted over the whole test: every start of a local workload (each script appends a line to a
//! file of its own) and every Pod name a watch saw. Asserted at the end: every job ends as it
//! would have (phase, restarts), one start or Pod per attempt, no recovery and no crash counted
//! (the status, the store's counters, the operator's log), the back-off honoured across the
//! upgrade, and the statuses of jobs that had finished before it byte-identical.
//!
//! The chart form (`helm upgrade` from the previous release's image on the real node) is
//! `a_helm_upgrade_from_the_previous_release_loses_repeats_and_fails_no_job` in
//! tests/real_node.rs.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use managed_jobs::api::{JobPhase, ManagedJob};
use managed_jobs::store::Store;

/// The restart back-off of both operators: the job in a back-off at the upgrade waits this long
/// between its two attempts, upgrade or not.
const BACKOFF_SECONDS: f64 = 20.0;
/// Long enough for the whole test on a loaded 2-core machine.
const T: Duration = Duration::from_secs(240);

/// A local job whose script records each start in `$MARKS/<name>` (seconds since the epoch),
/// then waits for `$MARKS/go` when `gated`, then exits `code`.
fn local_job(name: &str, marks: &Path, gated: bool, code: i32, extra: &str) -> String {
    let wait = if gated {
        "while [ ! -e \"$MARKS/go\" ]; do sleep 0.2; done; "
    } else {
        ""
    };
    format!(
        r#"
apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata: {{name: {name}}}
spec:
  env: [{{name: MARKS, value: "{marks}"}}]
  run: 'date +%s.%N >> "$MARKS/{name}"; {wait}exit {code}'
{extra}
"#,
        marks = marks.display()
    )
}

/// A pod job; kwok completes its Pod `complete_after` after it runs, or never while `None`
/// (the test then annotates the Pod: hack/stages/pod-complete.yaml).
fn pod_job(name: &str, complete_after: Option<&str>) -> String {
    let annotations = complete_after
        .map(|d| format!(r#"annotations: {{"managedjobs.dev/complete-after": "{d}"}}"#))
        .unwrap_or_else(|| "annotations: {}".into());
    format!(
        r#"
apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata: {{name: {name}}}
spec:
  template:
    metadata:
      {annotations}
    spec:
      containers:
        - name: main
          image: busybox:1.36
          resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}
"#
    )
}

/// A local pipeline of two tasks, each recording its start in `$MARKS/<name>-<task>`; the first
/// waits for `$MARKS/go`.
fn pipeline(name: &str, marks: &Path) -> String {
    format!(
        r#"
apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata: {{name: {name}}}
spec:
  env: [{{name: MARKS, value: "{marks}"}}]
  tasks:
    - name: first
      run: 'date +%s.%N >> "$MARKS/{name}-first"; while [ ! -e "$MARKS/go" ]; do sleep 0.2; done'
    - name: second
      run: 'date +%s.%N >> "$MARKS/{name}-second"'
"#,
        marks = marks.display()
    )
}

/// The start times (seconds since the epoch) recorded in `$MARKS/<file>`.
fn starts(marks: &Path, file: &str) -> Vec<f64> {
    std::fs::read_to_string(marks.join(file))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

async fn status_json(client: &Client, ns: &str, name: &str) -> String {
    let mj = Api::<ManagedJob>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get");
    serde_json::to_string(&mj.status).unwrap()
}

/// Applies this checkout's CRDs when dropped: the test installed the previous release's, which
/// every later test must not see, even when this one fails.
struct CurrentCrds(&'static support::ControlPlane);

impl Drop for CurrentCrds {
    fn drop(&mut self) {
        support::apply_crds(self.0, &support::root().join("crds"));
    }
}

/// The job controller processes of `state_dir` running `exe`.
fn controllers_running(state_dir: &Path, exe: &Path) -> usize {
    let want = managed_jobs::process::file_identity(exe);
    managed_jobs::engine::controller_processes(state_dir)
        .iter()
        .filter(|c| managed_jobs::process::executable_identity(c.pid) == want)
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_started_by_the_previous_release_end_under_this_one_as_without_the_upgrade() {
    let cp = control_plane_or_skip!();
    let Some(previous) = support::previous_release("tests/upgrade.rs") else {
        return;
    };
    let _restore = CurrentCrds(cp);
    support::apply_crds(cp, &previous.src().join("crds"));
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "upgrade").await;
    let marks = tempfile::tempdir().unwrap();
    let m = marks.path();
    let (watch, pod_names) = support::watch_pod_names(&client, &ns.name);
    let backoff = BACKOFF_SECONDS.to_string();
    let flags = [
        "--run-cap",
        "4",
        "--launch-cap",
        "4",
        "--restart-backoff-seconds",
        backoff.as_str(),
        "--max-controller-crashes",
        "1",
    ];
    let mut op = support::OperatorProcess::start_program(cp, &previous.binary(), &ns.name, &flags);
    let state = op.state_path();

    // Finished before the upgrade.
    support::create_yaml(&client, &ns.name, &local_job("done-local", m, false, 0, "")).await;
    support::create_yaml(&client, &ns.name, &pod_job("done-pod", Some("1s"))).await;
    let succeeded = support::phase_is(JobPhase::Succeeded);
    for name in ["done-local", "done-pod"] {
        support::wait_status(&client, &ns.name, name, T, "Succeeded", &succeeded).await;
    }
    // Running and in a back-off: four take the run cap of 4 (created, then admitted, before the
    // queued ones: the watch need not deliver objects created in one second in that order).
    let restart_once = "  recovery: {maxRestartsOnErrors: 1}";
    for yaml in [
        local_job("running-local", m, true, 0, ""),
        pod_job("running-pod", None),
        pipeline("pipeline", m),
        local_job("backoff-local", m, false, 3, restart_once),
    ] {
        support::create_yaml(&client, &ns.name, &yaml).await;
    }
    let running = support::phase_is(JobPhase::Running);
    for name in ["running-local", "running-pod", "pipeline"] {
        support::wait_status(&client, &ns.name, name, T, "Running", &running).await;
    }
    // In its restart's back-off: Recovering (the status counts the restart only once its
    // attempt launched, from 0.2.0 on).
    support::wait_status(
        &client,
        &ns.name,
        "backoff-local",
        T,
        "a restart's back-off",
        |s| s.phase == Some(JobPhase::Recovering),
    )
    .await;
    // Queued behind them, in a ManagedJobQueue of the previous release (its CRD, its fields).
    let team = format!("{}-team", ns.name);
    let mut queues = support::quota::Queues::new(&client, cp);
    queues.apply(
        cp,
        &team,
        &format!(
            "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJobQueue\nmetadata: {{name: {team}}}\n\
             spec:\n  weight: 2\n  maxRunning: 4\n  namespaceSelector:\n    matchLabels: {{kubernetes.io/metadata.name: {ns}}}\n",
            ns = ns.name
        ),
    );
    let in_team = format!("  queue: {team}");
    for name in ["queued-1", "queued-2"] {
        support::create_yaml(&client, &ns.name, &local_job(name, m, true, 0, &in_team)).await;
    }
    let pending = support::phase_is(JobPhase::Pending);
    for name in ["queued-1", "queued-2"] {
        let mj = support::wait_status(&client, &ns.name, name, T, "Pending", &pending).await;
        assert!(mj.status.unwrap().job_id.is_some(), "{name} has its job id");
    }
    let done_before: BTreeMap<&str, String> = {
        let mut m = BTreeMap::new();
        for name in ["done-local", "done-pod"] {
            m.insert(name, status_json(&client, &ns.name, name).await);
        }
        m
    };
    let old_controllers = controllers_running(&state, &previous.binary());
    assert_eq!(
        old_controllers, 4,
        "each live job has the previous release's job controller"
    );

    // The upgrade: SIGTERM to the operator alone, this release's CRDs, this build on the same
    // state dir.
    let upgrade_at = Instant::now();
    op.terminate();
    assert_eq!(
        controllers_running(&state, &previous.binary()),
        4,
        "a host operator's SIGTERM leaves its job controllers running"
    );
    support::apply_crds(cp, &support::root().join("crds"));
    op.use_binary(Path::new(support::binary()));
    op.start_again();
    let start = Instant::now();
    while controllers_running(&state, &previous.binary()) > 0
        || controllers_running(&state, Path::new(support::binary())) < 4
    {
        assert!(
            start.elapsed() < T,
            "the previous release's job controllers were never all replaced by this build's: {} old, {} new\n{}",
            controllers_running(&state, &previous.binary()),
            controllers_running(&state, Path::new(support::binary())),
            op.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "upgrade: this build's controllers drive the 4 live jobs {:.1} s after the SIGTERM",
        upgrade_at.elapsed().as_secs_f64()
    );

    // Nothing ends on its own meanwhile: each running job waits for the test.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["running-local", "running-pod", "pipeline"] {
        let s = Api::<ManagedJob>::namespaced(client.clone(), &ns.name)
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(
            s.phase,
            Some(JobPhase::Running),
            "{name} must run until the test lets it end: {s:#?}"
        );
    }
    // Let the running workloads end.
    std::fs::write(m.join("go"), "").unwrap();
    let pod = support::pod_name(&client, &ns.name, "running-pod", 1).await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let legacy = {
        let id = support::wait_job_id(&client, &ns.name, "running-pod", T).await;
        format!("running-pod-{id}-1")
    };
    // The previous release named Pods without the uid tag; whichever name it used is the Pod.
    let running_pod = if pods.get_opt(&legacy).await.unwrap().is_some() {
        legacy
    } else {
        pod
    };
    pods.patch(
        &running_pod,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({
            "metadata": {"annotations": {"managedjobs.dev/complete-after": "0s"}}
        })),
    )
    .await
    .expect("annotating the running Pod");

    let terminal =
        |s: &managed_jobs::api::ManagedJobStatus| s.phase.is_some_and(|p| p.is_terminal());
    let expected = [
        ("done-local", JobPhase::Succeeded),
        ("done-pod", JobPhase::Succeeded),
        ("running-local", JobPhase::Succeeded),
        ("running-pod", JobPhase::Succeeded),
        ("pipeline", JobPhase::Succeeded),
        ("backoff-local", JobPhase::Failed),
        ("queued-1", JobPhase::Succeeded),
        ("queued-2", JobPhase::Succeeded),
    ];
    for (name, phase) in expected {
        let mj = support::wait_status(&client, &ns.name, name, T, "a final phase", terminal).await;
        let s = mj.status.unwrap();
        assert_eq!(s.phase, Some(phase), "{name}: {s:#?}");
        assert_eq!(s.recovery_count, 0, "{name} recovered: {s:#?}");
        let restarts = if name == "backoff-local" { 1 } else { 0 };
        assert_eq!(s.restart_count, restarts, "{name}: {s:#?}");
        if name.starts_with("queued") {
            assert_eq!(s.queue.as_deref(), Some(team.as_str()), "{name}'s queue");
        }
    }
    // The new operator may rewrite nothing of a job that finished before it started.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (name, before) in &done_before {
        assert_eq!(
            &status_json(&client, &ns.name, name).await,
            before,
            "{name}'s final status changed across the upgrade"
        );
    }

    // One start per attempt, the back-off honoured across the upgrade.
    for file in [
        "done-local",
        "running-local",
        "queued-1",
        "queued-2",
        "pipeline-first",
        "pipeline-second",
    ] {
        assert_eq!(
            starts(m, file).len(),
            1,
            "{file} started {:?}",
            starts(m, file)
        );
    }
    let retried = starts(m, "backoff-local");
    assert_eq!(retried.len(), 2, "backoff-local: two attempts, {retried:?}");
    assert!(
        retried[1] - retried[0] >= BACKOFF_SECONDS - 0.5,
        "the restart came {:.1} s after the failure, before its back-off of {BACKOFF_SECONDS} s",
        retried[1] - retried[0]
    );
    // One Pod per pod job, whatever the watch saw meanwhile.
    watch.abort();
    let names = pod_names.lock().unwrap().clone();
    for job in ["done-pod", "running-pod"] {
        let of_job: Vec<&String> = names
            .iter()
            .filter(|n| n.starts_with(&format!("{job}-")))
            .collect();
        assert_eq!(of_job.len(), 1, "{job}: one Pod, the watch saw {of_job:?}");
    }

    // No crash counted: the store's counters and the new operator's own words.
    op.terminate();
    eprintln!("operator log:\n{}", op.log());
    let store = Store::open_current(
        &managed_jobs::state_dir::StateDir::new(&state).store(),
        1024,
    )
    .expect("the migrated store");
    for row in store.all().unwrap() {
        assert_eq!(
            row.controller_crashes, 0,
            "{}: a crash was counted for the upgrade",
            row.name
        );
    }
    // A downgrade: the previous release refuses the migrated store and leaves it as it is.
    let before: Vec<String> = store
        .all()
        .unwrap()
        .iter()
        .map(|r| format!("{r:?}"))
        .collect();
    let step = store.schema_step().unwrap();
    drop(store);
    let out = run_bounded(
        std::process::Command::new(previous.binary())
            .args(["run", "--namespace", &ns.name, "--metrics-addr", "none"])
            .arg("--state-dir")
            .arg(&state)
            .env("KUBECONFIG", &cp.kubeconfig),
    );
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        // 0.1.0 said rusqlite_migration's words; later releases name the newer release.
        !out.status.success()
            && (said.contains("migration number that is too high")
                || said.contains("written by a newer release")),
        "the previous release must refuse a store this one migrated: {said}"
    );
    let store = Store::open_current(
        &managed_jobs::state_dir::StateDir::new(&state).store(),
        1024,
    )
    .expect("the store after the refused downgrade");
    assert_eq!(store.schema_step().unwrap(), step);
    let after: Vec<String> = store
        .all()
        .unwrap()
        .iter()
        .map(|r| format!("{r:?}"))
        .collect();
    assert_eq!(after, before, "the refused downgrade changed the store");
    let log = op.log();
    let new_part = &log[log
        .rfind("caps in force")
        .expect("the new operator started")..];
    assert!(
        !new_part.contains("exited early"),
        "the new operator counted a job controller's exit as a crash:\n{new_part}"
    );
    assert_eq!(
        log.matches("stopping a job controller of another build")
            .count(),
        4,
        "each of the previous release's 4 job controllers was replaced once:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_store_of_a_newer_release_is_refused_and_left_as_it_was() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "downgrade").await;
    // A store this build made, then marked as a later release's.
    let dir = tempfile::tempdir().unwrap();
    let path = managed_jobs::state_dir::StateDir::new(dir.path()).store();
    std::fs::create_dir_all(dir.path()).unwrap();
    drop(Store::open(&path, 1024).unwrap());
    let later = managed_jobs::store::schema::CURRENT_STEP + 1;
    rusqlite_bump(&path, later);
    let before = std::fs::read(&path).unwrap();
    let out = run_bounded(
        std::process::Command::new(support::binary())
            .args(["run", "--namespace", &ns.name, "--metrics-addr", "none"])
            .arg("--state-dir")
            .arg(dir.path())
            .env("KUBECONFIG", &cp.kubeconfig),
    );
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "a newer store must be refused: {text}"
    );
    assert!(
        text.contains(&format!("schema step {later}"))
            && text.contains("newer release")
            && text.contains("docs/upgrades.md"),
        "the refusal names the step, the cause and the way back: {text}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the store was changed"
    );
    // The command line reads only a store of its own release, and says so.
    let out = std::process::Command::new(support::binary())
        .args(["queue", "--state-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && text.contains("another release"),
        "managed-jobs queue on a newer store: {text}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the store was changed"
    );
}

/// Sets the store's schema step (its `user_version`) as a later release's migration would.
fn rusqlite_bump(path: &Path, step: usize) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_update(None, "user_version", step as i64)
        .unwrap();
    // Checkpointed into the main file, so that a byte compare sees the whole store.
    conn.pragma_update(None, "journal_mode", "DELETE").unwrap();
}

/// Runs `cmd` to its end, or kills it after a minute: a `managed-jobs run` that should refuse
/// to start and does not must fail the test, not hang it.
fn run_bounded(cmd: &mut std::process::Command) -> std::process::Output {
    let file = tempfile::NamedTempFile::new().unwrap();
    let mut child = cmd
        .stdout(file.reopen().unwrap())
        .stderr(file.reopen().unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: std::fs::read(file.path()).unwrap(),
        stderr: Vec::new(),
    }
}
