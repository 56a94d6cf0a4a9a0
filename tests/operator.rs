//! The operator end to end on the real dev control plane: `managed-jobs run` (the real binary)
//! scoped to a namespace of the test's own, ManagedJobs created through the API, status read back
//! from the API.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::watcher;
use managed_jobs::api::{JobPhase, ManagedJob, ScheduleState};

const T: Duration = Duration::from_secs(60);

fn job(name: &str, body: &str) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n{body}"
    )
}

fn condition(mj: &ManagedJob, type_: &str) -> Option<String> {
    mj.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

#[tokio::test]
async fn hello_succeeds_and_status_follows() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "hello").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = std::fs::read_to_string(support::root().join("examples/hello.yaml")).unwrap();
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(&client, &ns.name, "hello", T, "Succeeded", |s| {
        s.phase == Some(JobPhase::Succeeded)
    })
    .await;
    let s = mj.status.clone().unwrap();
    assert_eq!(s.exit_code, Some(0));
    assert_eq!(s.schedule_state, Some(ScheduleState::Done));
    assert_eq!(s.attempt, 1);
    assert!(s.job_id.is_some() && s.submitted_at.is_some() && s.finished_at.is_some());
    assert_eq!(s.observed_generation, mj.metadata.generation);
    assert_eq!(condition(&mj, "Complete").as_deref(), Some("True"));
    assert_eq!(condition(&mj, "Ready").as_deref(), Some("True"));
    assert_eq!(condition(&mj, "Reconciling").as_deref(), Some("False"));
    assert!(
        mj.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"managedjobs.dev/cleanup".into())
    );
    // `kubectl wait` works on it, as on a batch/v1 Job.
    let (ok, out) = support::kubectl(
        cp,
        &[
            "-n",
            &ns.name,
            "wait",
            "--for=condition=Complete",
            "mj/hello",
            "--timeout=10s",
        ],
    );
    assert!(ok, "{out}");
    // `managed-jobs logs` prints the workload's output.
    let out = std::process::Command::new(support::binary())
        .args(["logs", &format!("{}/hello", ns.name), "--state-dir"])
        .arg(op.state_dir.path())
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("hello from managed-jobs"));
}

#[tokio::test]
async fn failing_job_is_restarted_then_fails_with_its_exit_code() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "fail").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let body = "  run: echo attempt $MANAGEDJOB_ATTEMPT; exit 3\n  recovery:\n    maxRestartsOnErrors: 2\n";
    support::create_yaml(&client, &ns.name, &job("flaky", body)).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "flaky",
        T,
        "Failed",
        support::phase_is(JobPhase::Failed),
    )
    .await;
    let s = mj.status.clone().unwrap();
    assert_eq!(s.exit_code, Some(3));
    assert_eq!(s.restart_count, 2);
    assert_eq!(s.attempt, 3, "exactly 1 + maxRestartsOnErrors attempts");
    assert_eq!(s.failure_reason.as_deref(), Some("ExitCode"));
    assert_eq!(condition(&mj, "Failed").as_deref(), Some("True"));
    assert_eq!(condition(&mj, "Stalled").as_deref(), Some("True"));
}

#[tokio::test]
async fn twenty_jobs_never_exceed_the_caps_seen_from_the_api() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "caps").await;
    let _op =
        support::OperatorProcess::start(cp, &ns.name, &["--launch-cap", "2", "--run-cap", "3"]);
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    // Watch every status the API serves, from before the first create.
    let watch = tokio::spawn({
        let api = api.clone();
        async move {
            let mut states: BTreeMap<String, (Option<ScheduleState>, Option<JobPhase>)> =
                BTreeMap::new();
            let mut max_alive = 0usize;
            let mut max_launching = 0usize;
            let stream = watcher(api, watcher::Config::default()).boxed();
            let mut stream = stream;
            while let Some(event) = stream.next().await {
                let objs = match event {
                    Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => vec![o],
                    _ => continue,
                };
                for o in objs {
                    let s = o.status.clone().unwrap_or_default();
                    states.insert(
                        o.metadata.name.clone().unwrap(),
                        (s.schedule_state, s.phase),
                    );
                }
                let alive = states
                    .values()
                    .filter(|(s, _)| s.is_some_and(|s| s.holds_run_slot()))
                    .count();
                let launching = states
                    .values()
                    .filter(|(s, _)| *s == Some(ScheduleState::Launching))
                    .count();
                max_alive = max_alive.max(alive);
                max_launching = max_launching.max(launching);
                let done = states
                    .values()
                    .filter(|(_, p)| *p == Some(JobPhase::Succeeded))
                    .count();
                if done == 20 {
                    return (max_alive, max_launching);
                }
            }
            (max_alive, max_launching)
        }
    });
    for i in 0..20 {
        support::create_yaml(
            &client,
            &ns.name,
            &job(&format!("batch-{i:02}"), "  run: sleep 1\n"),
        )
        .await;
    }
    let (max_alive, max_launching) = tokio::time::timeout(Duration::from_secs(120), watch)
        .await
        .expect("all 20 jobs succeed within 120 s")
        .unwrap();
    assert!(
        max_alive <= 3,
        "the API showed {max_alive} jobs alive (run cap 3)"
    );
    assert!(
        max_launching <= 2,
        "the API showed {max_launching} launching (launch cap 2)"
    );
    assert!(
        max_alive >= 2,
        "queueing should still use the slots (saw {max_alive})"
    );
}

#[tokio::test]
async fn cancel_while_pending_never_starts_a_process() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "cpend").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &["--run-cap", "1"]);
    support::create_yaml(&client, &ns.name, &job("blocker", "  run: sleep 60\n")).await;
    support::wait_status(
        &client,
        &ns.name,
        "blocker",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    support::create_yaml(
        &client,
        &ns.name,
        &job("queued", "  run: touch never-ran; sleep 60\n"),
    )
    .await;
    let mj = support::wait_status(&client, &ns.name, "queued", T, "queued", |s| {
        s.schedule_state == Some(ScheduleState::Waiting)
    })
    .await;
    let status = mj.status.unwrap();
    // No position is written (it would be stale at the next admission); its place is kept.
    assert_eq!(status.queue_position, None);
    assert!(
        status
            .queue_entry
            .is_some_and(|e| e.resource_version.is_some())
    );
    support::cancel(&client, &ns.name, "queued").await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "queued",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.attempt, 0);
    assert!(s.workload.is_none());
    let id = s.job_id.unwrap();
    assert!(
        !op.state_dir.path().join(format!("logs/{id}.log")).exists(),
        "a job controller ran"
    );
    assert!(
        !op.state_dir
            .path()
            .join(format!("work/{id}/never-ran"))
            .exists()
    );
    // The cancelled object keeps its final status; a blocker cancel frees the slot.
    support::cancel(&client, &ns.name, "blocker").await;
    support::wait_status(
        &client,
        &ns.name,
        "blocker",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
}

#[tokio::test]
async fn cancel_while_running_stops_the_workload_process_group() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "crun").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(
        &client,
        &ns.name,
        &job("long", "  run: sleep 300 & sleep 300; wait\n"),
    )
    .await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "long",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let pgid: i32 = mj
        .status
        .unwrap()
        .workload
        .unwrap()
        .trim_start_matches("pid/")
        .parse()
        .unwrap();
    assert!(managed_jobs::process::group_exists(pgid));
    support::cancel(&client, &ns.name, "long").await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "long",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    assert!(
        !managed_jobs::process::group_exists(pgid),
        "the workload's process group survived"
    );
    // Cancelled as its spec asks: in the state the spec asks for (kstatus Current), not Stalled;
    // batch/v1's Failed says it did not complete.
    assert_eq!(condition(&mj, "Ready").as_deref(), Some("True"));
    assert_eq!(condition(&mj, "Stalled").as_deref(), Some("False"));
    assert_eq!(condition(&mj, "Failed").as_deref(), Some("True"));
}

#[tokio::test]
async fn delete_cleans_up_and_removes_the_finalizer() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "del").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(&client, &ns.name, &job("doomed", "  run: sleep 300\n")).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "doomed",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let pgid: i32 = mj
        .status
        .unwrap()
        .workload
        .unwrap()
        .trim_start_matches("pid/")
        .parse()
        .unwrap();
    support::delete(&client, &ns.name, "doomed").await;
    support::wait_gone(&client, &ns.name, "doomed", T).await;
    assert!(
        !managed_jobs::process::group_exists(pgid),
        "the workload survived its ManagedJob"
    );
    let out = std::process::Command::new(support::binary())
        .args(["queue", "--all", "--state-dir"])
        .arg(op.state_dir.path())
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("doomed"),
        "the store still has it"
    );
}

/// The finalizer comes from the MutatingAdmissionPolicy in crds/ (no API write by the operator);
/// where it is missing (an older cluster, the policy not installed, or removed by hand) the
/// operator adds it back, so a delete still waits for the cleanup.
#[tokio::test]
async fn finalizer_is_set_at_create_and_restored_when_removed() {
    use kube::api::{Patch, PatchParams};
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "fin").await;
    let created = support::create_yaml(&client, &ns.name, &job("held", "  run: sleep 300\n")).await;
    assert_eq!(
        created.metadata.finalizers.as_deref(),
        Some(&[managed_jobs::api::FINALIZER.to_string()][..]),
        "the admission policy did not add the finalizer at create"
    );
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::wait_status(
        &client,
        &ns.name,
        "held",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), &ns.name);
    let unheld = api
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(unheld.metadata.finalizers.is_none());
    let deadline = std::time::Instant::now() + T;
    loop {
        let mj = api.get("held").await.unwrap();
        if mj.metadata.finalizers.as_deref()
            == Some(&[managed_jobs::api::FINALIZER.to_string()][..])
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the operator never restored its finalizer"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    support::delete(&client, &ns.name, "held").await;
    support::wait_gone(&client, &ns.name, "held", T).await;
}

#[tokio::test]
async fn killed_job_controller_is_resumed_and_the_job_succeeds() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "jckill").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(
        &client,
        &ns.name,
        &job("sturdy", "  run: echo run >> runs.txt; sleep 2\n"),
    )
    .await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "sturdy",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let id = mj.status.unwrap().job_id.unwrap();
    let (_, pid) = op
        .job_controllers()
        .into_iter()
        .find(|(j, _)| *j == id)
        .expect("its job controller");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mj = support::wait_status(
        &client,
        &ns.name,
        "sturdy",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    assert_eq!(
        mj.status.unwrap().attempt,
        1,
        "the running workload was adopted, not relaunched"
    );
    let runs =
        std::fs::read_to_string(op.state_dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "run\n");
}

/// Jobs created while no operator runs start in the order the API server accepted them, not
/// in the order the operator records them (its first list comes in name order, and its
/// reconciles finish in any order): 12 jobs created last name first, one run slot, and they
/// run first created first.
#[tokio::test]
async fn jobs_created_before_the_operator_started_run_in_the_order_they_were_created() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "fifostart").await;
    let runs = tempfile::tempdir().unwrap();
    let runs_file = runs.path().join("runs.txt");
    let names: Vec<String> = (0..12).rev().map(|i| format!("job-{i:02}")).collect();
    let body = format!("  run: echo $MANAGEDJOB_NAME >> {}\n", runs_file.display());
    for name in &names {
        support::create_yaml(&client, &ns.name, &job(name, &body)).await;
    }
    let _op =
        support::OperatorProcess::start(cp, &ns.name, &["--launch-cap", "1", "--run-cap", "1"]);
    for name in &names {
        support::wait_status(
            &client,
            &ns.name,
            name,
            T,
            "Succeeded",
            support::phase_is(JobPhase::Succeeded),
        )
        .await;
    }
    let text = std::fs::read_to_string(&runs_file).unwrap();
    let ran: Vec<&str> = text.lines().collect();
    assert_eq!(
        ran, names,
        "the jobs ran in another order than they were created"
    );
}

#[tokio::test]
async fn killed_operator_restarts_without_running_any_job_twice() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "opkill").await;
    let mut op =
        support::OperatorProcess::start(cp, &ns.name, &["--launch-cap", "2", "--run-cap", "3"]);
    let runs = tempfile::tempdir().unwrap();
    let runs_file = runs.path().join("runs.txt");
    for i in 0..8 {
        let body = format!(
            "  run: echo $MANAGEDJOB_NAME >> {}; sleep 1\n",
            runs_file.display()
        );
        support::create_yaml(&client, &ns.name, &job(&format!("job-{i}"), &body)).await;
    }
    support::wait_status(
        &client,
        &ns.name,
        "job-0",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    op.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    op.restart();
    for i in 0..8 {
        support::wait_status(
            &client,
            &ns.name,
            &format!("job-{i}"),
            T,
            "Succeeded",
            support::phase_is(JobPhase::Succeeded),
        )
        .await;
    }
    let text = std::fs::read_to_string(&runs_file).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    let expected: Vec<String> = (0..8).map(|i| format!("job-{i}")).collect();
    assert_eq!(lines, expected, "every job ran exactly once");
}

#[tokio::test]
async fn invalid_specs_are_refused_by_the_api_naming_the_field() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "invalid").await;
    let dir = support::root().join("tests/cases/invalid");
    let expected_field = [
        ("01-run-and-template.yaml", "spec.run"),
        ("02-neither.yaml", "spec.run"),
        ("03-priority-out-of-range.yaml", "spec.priority"),
        (
            "04-negative-restarts.yaml",
            "spec.recovery.maxRestartsOnErrors",
        ),
        ("05-empty-run.yaml", "spec.run"),
        ("06-unknown-field.yaml", "spec.runn"),
        ("07-env-without-name.yaml", "spec.env[0].name"),
        ("08-bad-env-name.yaml", "spec.env[0].name"),
        ("09-nonpositive-deadline.yaml", "spec.activeDeadlineSeconds"),
        ("10-priority-string.yaml", "spec.priority"),
        (
            "11-template-without-containers.yaml",
            "spec.template.spec.containers",
        ),
    ];
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("tests/cases/invalid") {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let (ok, out) =
            support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
        assert!(!ok, "{file} was accepted: {out}");
        if let Some((_, field)) = expected_field.iter().find(|(f, _)| *f == file) {
            assert!(
                out.contains(field),
                "{file}: the error does not name {field}: {out}"
            );
        }
        seen += 1;
    }
    assert!(seen >= expected_field.len());
    let (_, out) = support::kubectl(cp, &["get", "mj", "-n", &ns.name, "-o", "name"]);
    assert!(
        out.trim().is_empty() || out.contains("No resources"),
        "something was stored: {out}"
    );
}

#[tokio::test]
async fn valid_cases_behave_as_their_comments_say() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "valid").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let dir = support::root().join("tests/cases/valid");
    let apply = |file: &str| {
        let path = dir.join(file);
        support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()])
    };
    // Immutability: run may not change, priority may.
    assert!(apply("immutable-base.yaml").0);
    let (ok, out) = apply("immutable-changed-run.yaml");
    assert!(
        !ok && out.contains("spec.run") && out.contains("immutable"),
        "{out}"
    );
    let (ok, out) = apply("immutable-changed-priority.yaml");
    assert!(ok, "{out}");
    // Created already cancelled: Cancelled without a job controller process.
    assert!(apply("cancel-at-birth.yaml").0);
    let mj = support::wait_status(
        &client,
        &ns.name,
        "cancel-at-birth",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    let id = mj.status.unwrap().job_id.unwrap();
    assert!(!op.state_dir.path().join(format!("logs/{id}.log")).exists());
    // Quoting: the log holds the lines exactly as the script wrote them.
    assert!(apply("quoting.yaml").0);
    let mj = support::wait_status(
        &client,
        &ns.name,
        "quoting",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    let id = mj.status.unwrap().job_id.unwrap();
    let log = std::fs::read_to_string(op.state_dir.path().join(format!("logs/{id}.workload.log")))
        .unwrap();
    assert_eq!(log, "hello, wörld; rm -rf / #\nliteral $HOME `id`\n");
}

#[tokio::test]
async fn metrics_health_and_events_are_published() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "obs").await;
    let port = support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let _op = support::OperatorProcess::start(cp, &ns.name, &["--metrics-addr", &addr]);
    support::create_yaml(&client, &ns.name, &job("observed", "  run: true\n")).await;
    let body = "  run: exit 2\n  recovery:\n    maxRestartsOnErrors: 1\n";
    support::create_yaml(&client, &ns.name, &job("observed-fail", body)).await;
    support::wait_status(
        &client,
        &ns.name,
        "observed",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    support::wait_status(
        &client,
        &ns.name,
        "observed-fail",
        T,
        "Failed",
        support::phase_is(JobPhase::Failed),
    )
    .await;

    let (code, _) = tokio::task::spawn_blocking(move || support::http_get(port, "/healthz"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let (code, _) = tokio::task::spawn_blocking(move || support::http_get(port, "/readyz"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    let (code, text) = tokio::task::spawn_blocking(move || support::http_get(port, "/metrics"))
        .await
        .unwrap();
    assert_eq!(code, 200);
    for needle in [
        "managedjobs_jobs{phase=\"Succeeded\"} 1",
        "managedjobs_jobs{phase=\"Failed\"} 1",
        "managedjobs_jobs_by_schedule_state{state=\"Done\"} 2",
        "managedjobs_run_slots_in_use 0",
        "managedjobs_launch_cap ",
        "managedjobs_run_cap ",
        "managedjobs_scheduling_pass_seconds_count",
        "managedjobs_submit_to_launch_seconds_count 2",
        "managedjobs_job_controller_exits_total{reason=\"done\"} 2",
        "managedjobs_api_requests_total{verb=\"patch\"}",
        "managedjobs_reconcile_errors_total",
    ] {
        assert!(text.contains(needle), "/metrics lacks {needle:?}:\n{text}");
    }
    assert!(
        !text.contains("observed"),
        "a metric carries a per-job label"
    );

    // Events on the objects (as events.k8s.io serves them), as `kubectl describe` shows them.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns.name);
    let start = std::time::Instant::now();
    loop {
        let list = events.list(&Default::default()).await.unwrap();
        let reasons = |name: &str| -> Vec<String> {
            list.items
                .iter()
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
                .filter_map(|e| e.reason.clone())
                .collect()
        };
        let mut ok = reasons("observed");
        let mut failed = reasons("observed-fail");
        ok.sort();
        failed.sort();
        // Two Events for a straight-through job (the admission is in the Launched note); one per
        // launch, one per restart, one for the end: nothing else, so the API write budget holds.
        if ok == ["Launched", "Succeeded"]
            && failed == ["Failed", "Launched", "Launched", "Restarting"]
        {
            let launched = list
                .items
                .iter()
                .find(|e| e.reason.as_deref() == Some("Launched"))
                .unwrap();
            assert!(
                launched
                    .note
                    .as_deref()
                    .unwrap_or("")
                    .contains("in the queue"),
                "{launched:?}"
            );
            assert_eq!(
                launched.reporting_controller.as_deref(),
                Some("managed-jobs")
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            start.elapsed() < T,
            "events missing: observed {ok:?}, observed-fail {failed:?}"
        );
    }
    // What kubectl reads (core/v1): lastTimestamp, firstTimestamp and count, so `kubectl get
    // events --sort-by=.lastTimestamp` orders them by when each transition happened.
    let core = support::events_about(&client, &ns.name, "observed-fail").await;
    assert_eq!(core.len(), 4, "{core:#?}");
    for e in &core {
        let at = e.event_time.as_ref().map(|t| t.0.as_second());
        assert_eq!(
            e.last_timestamp.as_ref().map(|t| t.0.as_second()),
            at,
            "lastTimestamp of {e:?}"
        );
        assert_eq!(e.first_timestamp, e.last_timestamp, "{e:?}");
        assert_eq!(e.count, Some(1), "{e:?}");
    }
    let (ok, out) = support::kubectl(
        cp,
        &[
            "get",
            "events",
            "-n",
            &ns.name,
            "--field-selector",
            "involvedObject.name=observed-fail",
            "--sort-by=.lastTimestamp",
            "-o",
            "jsonpath={range .items[*]}{.lastTimestamp} {.reason}{\"\\n\"}{end}",
        ],
    );
    assert!(ok, "{out}");
    let times: Vec<&str> = out.lines().filter_map(|l| l.split(' ').next()).collect();
    assert_eq!(
        times.len(),
        4,
        "kubectl get events sorted by lastTimestamp: {out}"
    );
    assert!(
        times.iter().all(|t| !t.is_empty()) && times.is_sorted(),
        "kubectl get events sorted by lastTimestamp: {out}"
    );
}

#[tokio::test]
async fn a_standby_takes_over_within_the_lease_and_runs_nothing_twice() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "lease").await;
    let (p1, p2) = (support::free_port(), support::free_port());
    let le = |port: u16| {
        vec![
            "--leader-election".to_string(),
            "--leader-election-namespace".to_string(),
            ns.name.clone(),
            "--lease-duration-seconds".to_string(),
            "4".to_string(),
            "--metrics-addr".to_string(),
            format!("127.0.0.1:{port}"),
        ]
    };
    let args1 = le(p1);
    let args1: Vec<&str> = args1.iter().map(|s| s.as_str()).collect();
    let mut leader = support::OperatorProcess::start(cp, &ns.name, &args1);
    let (code, _) = tokio::task::spawn_blocking(move || {
        let start = std::time::Instant::now();
        loop {
            let r = support::http_get(p1, "/readyz");
            if r.0 == 200 || start.elapsed() > Duration::from_secs(30) {
                return r;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 200, "the first operator never led");
    let args2 = le(p2);
    let args2: Vec<&str> = args2.iter().map(|s| s.as_str()).collect();
    let standby = support::OperatorProcess::start_sharing(cp, &ns.name, &args2, &leader);
    let runs = tempfile::tempdir().unwrap();
    let runs_file = runs.path().join("runs.txt");
    let body = format!(
        "  run: echo $MANAGEDJOB_NAME >> {}; sleep 3\n",
        runs_file.display()
    );
    support::create_yaml(&client, &ns.name, &job("before", &body)).await;
    support::wait_status(
        &client,
        &ns.name,
        "before",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    let (code, _) = tokio::task::spawn_blocking(move || support::http_get(p2, "/readyz"))
        .await
        .unwrap();
    assert_eq!(
        code, 503,
        "the standby must not be ready while the leader holds the lease"
    );
    leader.kill();
    let killed = std::time::Instant::now();
    support::create_yaml(&client, &ns.name, &job("after", &body)).await;
    support::wait_status(&client, &ns.name, "after", T, "Running", |s| {
        matches!(s.phase, Some(JobPhase::Running | JobPhase::Succeeded))
    })
    .await;
    let handover = killed.elapsed();
    assert!(
        handover < Duration::from_secs(15),
        "handover took {handover:?} (lease 4 s)"
    );
    for name in ["before", "after"] {
        support::wait_status(
            &client,
            &ns.name,
            name,
            T,
            "Succeeded",
            support::phase_is(JobPhase::Succeeded),
        )
        .await;
    }
    let text = std::fs::read_to_string(&runs_file).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(lines, vec!["after", "before"], "each job ran exactly once");
    drop(standby);
}

#[tokio::test]
async fn a_lost_store_keeps_final_statuses_and_reruns_nothing() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "lost").await;
    let runs = tempfile::tempdir().unwrap();
    let runs_file = runs.path().join("runs.txt");
    let body = format!("  run: echo once >> {}; exit 4\n", runs_file.display());
    {
        let _first = support::OperatorProcess::start(cp, &ns.name, &[]);
        support::create_yaml(&client, &ns.name, &job("finished", &body)).await;
        support::wait_status(
            &client,
            &ns.name,
            "finished",
            T,
            "Failed",
            support::phase_is(JobPhase::Failed),
        )
        .await;
    }
    // A new operator with an empty state dir: the job keeps its final status.
    let _second = support::OperatorProcess::start(cp, &ns.name, &[]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "finished",
        T,
        "Failed",
        support::phase_is(JobPhase::Failed),
    )
    .await;
    assert_eq!(mj.status.unwrap().exit_code, Some(4));
    assert_eq!(std::fs::read_to_string(&runs_file).unwrap(), "once\n");
}

/// Deleting many jobs at once is no failure (issue 43: deleting 10,000 logged 4,388 WARN
/// "failed to remove finalizer: NotFound" and counted 4,801 reconcile errors, for objects
/// already gone): 1,000 waiting jobs deleted with one `kubectl delete --all` all go, and the
/// operator counts no reconcile error and logs no failed reconcile over the whole test.
#[tokio::test]
async fn a_thousand_jobs_deleted_at_once_count_no_error() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "del1k").await;
    let port = support::free_port();
    let addr = format!("127.0.0.1:{port}");
    let op = support::OperatorProcess::start(
        cp,
        &ns.name,
        &[
            "--metrics-addr",
            &addr,
            "--run-cap",
            "1",
            "--launch-cap",
            "1",
        ],
    );
    // One job holds the only run slot, so the thousand wait: each deletion is a cancel of a
    // queued job, its final status, then the finalizer's release.
    support::create_yaml(&client, &ns.name, &job("holder", "  run: sleep 600\n")).await;
    let metric = |text: &str, name: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    let metrics = move || support::http_get(port, "/metrics").1;
    // The holder runs before the thousand exist: created while the operator starts, it could
    // otherwise be listed with some of them and submitted after one, which a pass then admits.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let text = tokio::task::spawn_blocking(metrics).await.unwrap();
        let alive = metric(&text, "managedjobs_jobs_by_schedule_state{state=\"Alive\"}");
        if alive == Some(1.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the holder never ran (Alive: {alive:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.yaml");
    let docs: Vec<String> = (0..1000)
        .map(|i| job(&format!("j-{i:04}"), "  run: \"true\"\n"))
        .collect();
    std::fs::write(&file, docs.join("---\n")).unwrap();
    let (ok, out) = support::kubectl(cp, &["apply", "-n", &ns.name, "-f", file.to_str().unwrap()]);
    assert!(ok, "kubectl apply: {out}");
    // Every job in the store (waiting) before the delete.
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    loop {
        let text = tokio::task::spawn_blocking(metrics).await.unwrap();
        let waiting = metric(
            &text,
            "managedjobs_jobs_by_schedule_state{state=\"Waiting\"}",
        );
        if waiting == Some(1000.0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the store never held the 1,000 jobs waiting (last: {waiting:?}); by state and phase:\n{}",
            text.lines()
                .filter(|l| l.starts_with("managedjobs_jobs"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (ok, out) = support::kubectl(
        cp,
        &["delete", "mj", "--all", "-n", &ns.name, "--wait=false"],
    );
    assert!(ok, "kubectl delete: {out}");
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), &ns.name);
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
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
            std::time::Instant::now() < deadline,
            "{left} jobs still there 300 s after the delete"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let text = tokio::task::spawn_blocking(metrics).await.unwrap();
    let log = op.log();
    assert_eq!(
        metric(&text, "managedjobs_reconcile_errors_total"),
        Some(0.0),
        "reconcile errors counted for deleted jobs; the operator's log says:\n{}",
        log.lines()
            .filter(|l| l.contains("ERROR") || l.contains("WARN"))
            .filter(|l| !l.contains("client error (Connect)"))
            .take(40)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("reconcile failed") || l.contains("NotFound"))
        .take(5)
        .collect();
    assert!(
        failed.is_empty(),
        "the operator logged failures: {failed:#?}"
    );
}
