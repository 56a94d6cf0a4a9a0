//! Pipelines (`spec.tasks`, docs/design.md#pipelines) on the real dev control plane: tasks run in
//! order, each launched, restarted and recovered on its own; a failed task fails the job and
//! skips the rest; a cancel stops the running task and skips the rest; an operator SIGKILL or a
//! lost store resumes at the right task. What must never happen (a later task starting, an
//! earlier one running again, a second Pod of an attempt) is counted over the whole test: every
//! Pod name a watch saw, and a file each task's every attempt appends to.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use managed_jobs::api::{JobPhase, ManagedJobStatus, TaskPhase};

const T: Duration = Duration::from_secs(90);

/// A local pipeline: each task `(name, script)`, with extra spec lines (already indented).
fn local_pipeline(name: &str, tasks: &[(&str, &str)], extra: &str) -> String {
    let mut yaml = format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n{extra}  tasks:\n"
    );
    for (task, run) in tasks {
        yaml.push_str(&format!("    - name: {task}\n      run: {run:?}\n"));
    }
    yaml
}

/// A pod pipeline: each task `(name, completes after)` a kwok Pod that succeeds after that long.
fn pod_pipeline(name: &str, tasks: &[(&str, &str)]) -> String {
    let mut yaml = format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  tasks:\n"
    );
    for (task, after) in tasks {
        yaml.push_str(&format!(
            r#"    - name: {task}
      template:
        metadata:
          annotations: {{"managedjobs.dev/complete-after": "{after}"}}
        spec:
          containers:
            - name: main
              image: busybox
              resources:
                requests:
                  cpu: 100m
                  memory: 64Mi
"#
        ));
    }
    yaml
}

fn phases(s: &ManagedJobStatus) -> Vec<TaskPhase> {
    s.tasks.iter().map(|t| t.phase).collect()
}

fn terminal(s: &ManagedJobStatus) -> bool {
    s.phase.is_some_and(|p| p.is_terminal())
}

/// The lines of the job's `$HOME/<file>` (its work dir under the operator's state dir).
fn lines_of(op: &support::OperatorProcess, job_id: i64, file: &str) -> Vec<String> {
    let path = op
        .state_path()
        .join("work")
        .join(job_id.to_string())
        .join(file);
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn logs(op: &support::OperatorProcess, job: &str, extra: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(support::binary())
        .args(["logs", job, "--state-dir"])
        .arg(op.state_path())
        .args(extra)
        .output()
        .expect("running managed-jobs logs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[tokio::test]
async fn a_three_task_local_pipeline_runs_its_tasks_in_order() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipeorder").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    // Each task appends its name to a file in the job's $HOME and checks what ran before it;
    // `train` overrides the job's WHO.
    let yaml = local_pipeline(
        "etl",
        &[
            (
                "prepare",
                r#"test ! -e order && echo "prepare $MANAGEDJOB_TASK $WHO" && echo prepare >> order"#,
            ),
            (
                "train",
                r#"test "$(cat order)" = prepare && echo "train $MANAGEDJOB_TASK_INDEX $WHO" && echo train >> order"#,
            ),
            (
                "evaluate",
                r#"test "$(cat order | tr '\n' ' ')" = "prepare train " && echo "evaluate $WHO" && echo evaluate >> order"#,
            ),
        ],
        "  env:\n    - name: WHO\n      value: job\n",
    );
    let yaml = yaml.replace(
        "    - name: train\n",
        "    - name: train\n      env:\n        - name: WHO\n          value: task\n",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(&client, &ns.name, "etl", T, "finished", terminal).await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!(phases(&s), vec![TaskPhase::Succeeded; 3]);
    assert_eq!(s.current_task, Some(2));
    assert_eq!(s.task_progress.as_deref(), Some("3/3 evaluate"));
    assert!(
        s.tasks
            .iter()
            .all(|t| t.attempt == 1 && t.exit_code == Some(0))
    );
    for pair in s.tasks.windows(2) {
        assert!(
            pair[0].finished_at.as_ref().unwrap().0 <= pair[1].started_at.as_ref().unwrap().0,
            "{} started before {} finished",
            pair[1].name,
            pair[0].name
        );
    }
    let id = s.job_id.unwrap();
    assert_eq!(lines_of(&op, id, "order"), ["prepare", "train", "evaluate"]);
    let (ok, all) = logs(&op, &format!("{}/etl", ns.name), &[]);
    assert!(ok, "{all}");
    assert_eq!(
        all,
        "==> task 1/3 prepare <==\nprepare prepare job\n\
         ==> task 2/3 train <==\ntrain 1 task\n\
         ==> task 3/3 evaluate <==\nevaluate job\n"
    );
    let (ok, train) = logs(&op, &format!("{}/etl", ns.name), &["--task", "train"]);
    assert!(ok, "{train}");
    assert_eq!(train, "train 1 task\n");
    let (ok, out) = logs(&op, &format!("{}/etl", ns.name), &["--task", "deploy"]);
    assert!(!ok && out.contains("prepare, train, evaluate"), "{out}");
    // Events name the task.
    let notes: Vec<String> = support::events_about(&client, &ns.name, "etl")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("TaskSucceeded"))
        .filter_map(|e| e.message)
        .collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with("task 1/3 prepare: succeeded"),
        "{notes:?}"
    );
}

#[tokio::test]
async fn a_failed_task_fails_the_job_and_the_later_tasks_are_skipped() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipefail").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = local_pipeline(
        "broken",
        &[
            ("prepare", "echo prepare >> ran"),
            ("train", "echo train >> ran; exit 3"),
            ("evaluate", "echo evaluate >> ran"),
        ],
        "",
    );
    let yaml = yaml.replace(
        "    - name: train\n",
        "    - name: train\n      recovery:\n        maxRestartsOnErrors: 1\n",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(&client, &ns.name, "broken", T, "finished", terminal).await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Failed), "{:?}", s.message);
    let message = s.message.clone().unwrap();
    assert!(
        message.starts_with("task 2/3 train: attempt 2"),
        "{message}"
    );
    assert_eq!(s.failure_reason.as_deref(), Some("ExitCode"));
    assert_eq!(
        phases(&s),
        [TaskPhase::Succeeded, TaskPhase::Failed, TaskPhase::Skipped]
    );
    let train = &s.tasks[1];
    assert_eq!(
        (train.attempt, train.restart_count, train.exit_code),
        (2, 1, Some(3))
    );
    assert_eq!(s.restart_count, 1);
    assert_eq!(s.current_task, Some(1));
    let id = s.job_id.unwrap();
    assert_eq!(
        lines_of(&op, id, "ran"),
        ["prepare", "train", "train"],
        "exactly 2 attempts of train, evaluate never ran"
    );
}

#[tokio::test]
async fn a_cancel_during_task_two_stops_it_and_task_three_never_starts() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipecancel").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = local_pipeline(
        "stopped",
        &[
            ("prepare", "echo prepare >> ran"),
            ("train", "echo train >> ran; exec sleep 120"),
            ("evaluate", "echo evaluate >> ran"),
        ],
        "",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    support::wait_status(&client, &ns.name, "stopped", T, "train running", |s| {
        s.current_task == Some(1) && s.phase == Some(JobPhase::Running)
    })
    .await;
    support::cancel(&client, &ns.name, "stopped").await;
    let mj = support::wait_status(&client, &ns.name, "stopped", T, "finished", terminal).await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Cancelled), "{:?}", s.message);
    assert_eq!(
        phases(&s),
        [
            TaskPhase::Succeeded,
            TaskPhase::Cancelled,
            TaskPhase::Skipped
        ]
    );
    // Give a wrongly started task 3 the time to show itself.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lines_of(&op, s.job_id.unwrap(), "ran"),
        ["prepare", "train"]
    );
}

#[tokio::test]
async fn an_operator_sigkill_during_task_two_resumes_task_two() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipekill").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let yaml = local_pipeline(
        "resumed",
        &[
            ("prepare", "echo prepare >> ran"),
            ("train", "echo train >> ran; sleep 6; echo trained >> ran"),
            ("evaluate", "echo evaluate >> ran"),
        ],
        "",
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    support::wait_status(&client, &ns.name, "resumed", T, "train running", |s| {
        s.current_task == Some(1) && s.phase == Some(JobPhase::Running)
    })
    .await;
    // A container restart: the operator and every job controller at once; the workload stays.
    op.kill_with_job_controllers();
    op.start_again();
    let mj = support::wait_status(&client, &ns.name, "resumed", T, "finished", terminal).await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!(phases(&s), vec![TaskPhase::Succeeded; 3]);
    assert!(
        s.tasks
            .iter()
            .all(|t| t.attempt == 1 && t.restart_count == 0 && t.recovery_count == 0),
        "{:?}",
        s.tasks
    );
    assert_eq!(
        lines_of(&op, s.job_id.unwrap(), "ran"),
        ["prepare", "train", "trained", "evaluate"],
        "task 2 adopted, not run again; task 1 never re-run"
    );
}

#[tokio::test]
async fn an_eviction_of_task_twos_pod_recovers_task_two_only() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipeevict").await;
    let _op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let yaml = pod_pipeline(
        "podline",
        &[("fetch", "1s"), ("train", "8s"), ("report", "1s")],
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(&client, &ns.name, "podline", T, "train running", |s| {
        s.current_task == Some(1) && s.phase == Some(JobPhase::Running)
    })
    .await;
    let s = mj.status.unwrap();
    assert_eq!(s.task_progress.as_deref(), Some("2/3 train"));
    let pod = s.workload.unwrap().trim_start_matches("pod/").to_string();
    assert_eq!(
        pod,
        support::task_pod_name(&client, &ns.name, "podline", 1, 1).await
    );
    let labels = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name)
        .get(&pod)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap();
    assert_eq!(
        labels.get("managedjobs.dev/task").map(String::as_str),
        Some("train")
    );
    kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name)
        .evict(&pod, &kube::api::EvictParams::default())
        .await
        .expect("eviction accepted");
    let mj = support::wait_status(&client, &ns.name, "podline", T, "finished", terminal).await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!(phases(&s), vec![TaskPhase::Succeeded; 3]);
    let counts: Vec<(i32, i32)> = s
        .tasks
        .iter()
        .map(|t| (t.attempt, t.recovery_count))
        .collect();
    assert_eq!(counts, [(1, 0), (2, 1), (1, 0)]);
    assert_eq!(s.recovery_count, 1);
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([
            support::task_pod_name(&client, &ns.name, "podline", 0, 1).await,
            support::task_pod_name(&client, &ns.name, "podline", 1, 1).await,
            support::task_pod_name(&client, &ns.name, "podline", 1, 2).await,
            support::task_pod_name(&client, &ns.name, "podline", 2, 1).await,
        ]),
        "task 1 never re-run, one Pod per attempt"
    );
}

#[tokio::test]
async fn a_lost_store_during_task_two_resumes_task_two() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipelost").await;
    let mut op = support::OperatorProcess::start(cp, &ns.name, &[]);
    let (watch, names) = support::watch_pod_names(&client, &ns.name);
    let yaml = pod_pipeline(
        "keeper",
        &[("fetch", "1s"), ("train", "10s"), ("report", "1s")],
    );
    support::create_yaml(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(&client, &ns.name, "keeper", T, "train running", |s| {
        s.current_task == Some(1) && s.phase == Some(JobPhase::Running)
    })
    .await;
    let id = mj.status.unwrap().job_id.unwrap();
    op.kill_with_job_controllers();
    std::fs::remove_dir_all(op.state_path()).unwrap();
    std::fs::create_dir_all(op.state_path()).unwrap();
    op.start_again();
    let mj = support::wait_status(&client, &ns.name, "keeper", T, "finished", terminal).await;
    let s = mj.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_eq!(s.job_id, Some(id));
    assert_eq!(phases(&s), vec![TaskPhase::Succeeded; 3]);
    assert!(
        s.tasks
            .iter()
            .all(|t| t.attempt == 1 && t.recovery_count == 0),
        "{:?}",
        s.tasks
    );
    watch.abort();
    let seen = names.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([
            support::task_pod_name(&client, &ns.name, "keeper", 0, 1).await,
            support::task_pod_name(&client, &ns.name, "keeper", 1, 1).await,
            support::task_pod_name(&client, &ns.name, "keeper", 2, 1).await,
        ]),
        "one Pod per task: task 2's Pod adopted"
    );
}

#[tokio::test]
async fn invalid_pipelines_are_refused_naming_the_field() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipeinvalid").await;
    let head =
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: bad\nspec:\n";
    let many: String = (0..33)
        .map(|i| format!("    - name: t{i}\n      run: \"true\"\n"))
        .collect();
    let cases = [
        (
            "duplicate names",
            "  tasks:\n    - name: a\n      run: \"true\"\n    - name: a\n      run: \"true\"\n"
                .to_string(),
            "spec.tasks[1]",
        ),
        ("empty list", "  tasks: []\n".to_string(), "spec.tasks"),
        (
            "run and tasks",
            "  run: \"true\"\n  tasks:\n    - name: a\n      run: \"true\"\n".to_string(),
            "spec.tasks",
        ),
        ("33 tasks", format!("  tasks:\n{many}"), "spec.tasks"),
        (
            "a name that is not a DNS label",
            "  tasks:\n    - name: Train_1\n      run: \"true\"\n".to_string(),
            "spec.tasks[0].name",
        ),
        (
            "a task with neither run nor template",
            "  tasks:\n    - name: a\n".to_string(),
            "spec.tasks[0]",
        ),
        (
            "two executors",
            "  tasks:\n    - name: a\n      run: \"true\"\n    - name: b\n      template:\n        spec:\n          containers:\n            - name: main\n              image: busybox\n"
                .to_string(),
            "spec.tasks must all use one executor",
        ),
        (
            "setup on a template task",
            "  tasks:\n    - name: a\n      setup: \"true\"\n      template:\n        spec:\n          containers:\n            - name: main\n              image: busybox\n"
                .to_string(),
            "spec.tasks[].setup",
        ),
        (
            "setup beside tasks",
            "  setup: \"true\"\n  tasks:\n    - name: a\n      run: \"true\"\n".to_string(),
            "spec.setup",
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (what, body, field) in cases {
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, format!("{head}{body}")).unwrap();
        let (ok, out) =
            support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
        assert!(!ok, "{what} was accepted: {out}");
        assert!(
            out.contains(field),
            "{what}: the error does not name {field}: {out}"
        );
    }
    // The task list is immutable.
    let good = format!("{head}  tasks:\n    - name: a\n      run: \"true\"\n");
    let path = dir.path().join("good.yaml");
    std::fs::write(&path, &good).unwrap();
    let (ok, out) = support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
    assert!(ok, "{out}");
    std::fs::write(&path, good.replace("run: \"true\"", "run: \"false\"")).unwrap();
    let (ok, out) = support::kubectl(cp, &["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
    assert!(
        !ok && out.contains("spec.tasks") && out.contains("immutable"),
        "{out}"
    );
}

#[tokio::test]
async fn the_example_pipelines_succeed() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "pipeexamples").await;
    let op = support::OperatorProcess::start(cp, &ns.name, &[]);
    for file in ["pipeline.yaml", "pod-pipeline.yaml"] {
        let yaml = std::fs::read_to_string(support::root().join("examples").join(file)).unwrap();
        support::create_yaml(&client, &ns.name, &yaml).await;
    }
    for name in ["pipeline", "pod-pipeline"] {
        let mj = support::wait_status(&client, &ns.name, name, T, "finished", terminal).await;
        let s = mj.status.unwrap();
        assert_eq!(
            s.phase,
            Some(JobPhase::Succeeded),
            "{name}: {:?}",
            s.message
        );
        assert_eq!(phases(&s), vec![TaskPhase::Succeeded; 3], "{name}");
    }
    let (ok, out) = logs(
        &op,
        &format!("{}/pipeline", ns.name),
        &["--task", "evaluate"],
    );
    assert!(ok, "{out}");
    assert_eq!(out, "accuracy 0.93 on demo\n");
}
