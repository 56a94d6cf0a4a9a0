//! Logs that outlive Pods (issue 33), on the dev control plane's real kubelet node (kwok's fake
//! nodes have no logs): a host-process operator with the pod executor places each job's Pods
//! there (busybox, really run by containerd); its job controllers keep the end of each
//! container's log in the state dir when an attempt ends or before they stop it; once the Pods
//! are deleted, `managed-jobs logs` prints what was kept.
//!
//! Needs root, the real node and its busybox image (`hack/controlplane.sh up --real-node`);
//! without them each test records a skip, except under `CI=true`, where it fails.

mod support;

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use managed_jobs::api::{JobPhase, ManagedJob};
use managed_jobs::state_dir::{KeptLogFilter, StateDir};

/// Long enough for a few Pods on a loaded 2-core machine.
const T: Duration = Duration::from_secs(300);
/// `--kept-log-bytes` of these tests' operator: far less than the logs printed.
const BOUND: u64 = 4096;

/// The control plane and a client, or a skip: no control plane, or no real node.
macro_rules! real_node_or_skip {
    () => {{
        let cp = control_plane_or_skip!();
        if !support::real_node_ready(cp, support::BUSYBOX, "nothing more (it imports busybox)") {
            return;
        }
        (cp, support::client(cp).await)
    }};
}

/// The operator for `ns`: the pod executor only, logs kept up to [`BOUND`] bytes.
fn operator(cp: &support::ControlPlane, ns: &str) -> support::OperatorProcess {
    support::OperatorProcess::start(
        cp,
        ns,
        &[
            "--executors",
            "pod",
            "--kept-log-bytes",
            &BOUND.to_string(),
            "--restart-backoff-seconds",
            "0.5",
        ],
    )
}

async fn create(client: &Client, ns: &str, yaml: &str) {
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .create(&Default::default(), &support::on_real_node(yaml))
        .await
        .expect("creating the ManagedJob");
}

/// `managed-jobs logs NS/NAME ARGS...` against the operator's state dir.
fn logs(op: &support::OperatorProcess, ns: &str, name: &str, args: &[&str]) -> Output {
    std::process::Command::new(support::binary())
        .args(["logs", &format!("{ns}/{name}"), "--state-dir"])
        .arg(op.state_path())
        .args(args)
        .output()
        .expect("running managed-jobs logs")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

/// Deletes every Pod of job `name` (as a user, or the garbage collector, would) and waits
/// until they are gone.
async fn delete_pods(client: &Client, ns: &str, name: &str) {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("managedjobs.dev/job-name={name}"));
    let pods = api.list(&lp).await.expect("listing Pods").items;
    assert!(!pods.is_empty(), "job {name} left no Pod to delete");
    api.delete_collection(&DeleteParams::default(), &lp)
        .await
        .expect("deleting the Pods");
    let start = Instant::now();
    while !api.list(&lp).await.expect("listing Pods").items.is_empty() {
        assert!(start.elapsed() < T, "the Pods of {name} were never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the job controller of `job_id` logged of each keep: (attempt, containers, bytes, ms).
fn keeps(state_dir: &Path, job_id: i64) -> Vec<(i64, i64, i64, i64)> {
    let log = std::fs::read_to_string(StateDir::new(state_dir).controller_log(job_id))
        .unwrap_or_default();
    let field = |line: &str, name: &str| -> i64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1)
    };
    log.lines()
        .filter(|l| l.contains("kept the end of the attempt's logs"))
        .map(|l| {
            (
                field(l, "attempt"),
                field(l, "containers"),
                field(l, "bytes"),
                field(l, "took_ms"),
            )
        })
        .collect()
}

/// A pod job whose container prints 20,000 numbered lines (some 500 KB, far more than the
/// bound) then exits 3, with one restart: both attempts fail. It waits a second before it
/// exits: the real node's containerd (1.6) drops output its shim has not copied when the
/// container's process exits (2 of 3 such Pods lost their last lines, in `kubectl logs` too),
/// and what is kept is what the runtime logged. Once its Pods are deleted,
/// `managed-jobs logs` prints the last attempt's end (its last line, not its first, at most
/// the bound), `--attempt 1` the first attempt's; with the kept files gone it fails, naming
/// why, instead of printing a command that would fail.
#[tokio::test]
async fn a_failed_pod_jobs_log_outlives_its_pods() {
    let (cp, client) = real_node_or_skip!();
    let ns = support::TestNamespace::new(&client, cp, "kept").await;
    let op = operator(cp, &ns.name);
    let yaml = format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: counter
spec:
  recovery:
    maxRestartsOnErrors: 1
  template:
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: main
          image: {image}
          imagePullPolicy: Never
          command: ["sh", "-c", "seq 1 20000 | sed \"s/^/attempt $ATTEMPT line /\"; sleep 1; exit 3"]
          env:
            - name: ATTEMPT
              valueFrom:
                fieldRef:
                  fieldPath: "metadata.labels['managedjobs.dev/attempt']"
          resources:
            requests: {{cpu: 10m, memory: 16Mi}}
"#,
        image = support::BUSYBOX
    );
    create(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "counter",
        T,
        "Failed",
        support::phase_is(JobPhase::Failed),
    )
    .await;
    let s = mj.status.unwrap();
    assert_eq!(
        (s.attempt, s.restart_count, s.exit_code),
        (2, 1, Some(3)),
        "{s:#?}"
    );
    let job_id = s.job_id.expect("a job id");
    delete_pods(&client, &ns.name, "counter").await;

    // The last attempt's end.
    let out = logs(&op, &ns.name, "counter", &[]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stdout.ends_with("attempt 2 line 20000\n"),
        "the last line: {:?}",
        &stdout[stdout.len().saturating_sub(200)..]
    );
    assert!(stdout.len() as u64 <= BOUND, "{} bytes", stdout.len());
    assert!(stdout.len() as u64 > BOUND / 2, "{} bytes", stdout.len());
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        !lines.contains(&"attempt 2 line 1"),
        "its start is not kept"
    );
    assert!(!stdout.contains("attempt 1 "), "only attempt 2");
    assert!(
        text(&out.stderr).contains("only the last 4096 bytes were kept"),
        "{out:?}"
    );
    // The first attempt's, asked for.
    let out = logs(&op, &ns.name, "counter", &["--attempt", "1"]);
    let first = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(first.ends_with("attempt 1 line 20000\n"), "{out:?}");
    assert!(first.len() as u64 <= BOUND && !first.contains("attempt 2 "));
    assert!(!first.lines().any(|l| l == "attempt 1 line 1"));
    // What the state dir holds: one cut log per attempt, at the bound.
    let dir = StateDir::new(op.state_path());
    let kept = dir.kept_logs(job_id, &KeptLogFilter::default());
    let summary: Vec<_> = kept
        .iter()
        .map(|l| {
            (
                l.key.attempt,
                l.key.container.as_str(),
                l.bytes,
                l.truncated,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [(1, "main", BOUND, true), (2, "main", BOUND, true)],
        "{kept:?}"
    );
    let keeps = keeps(&op.state_path(), job_id);
    println!("keeps of job {job_id} (attempt, containers, bytes, ms): {keeps:?}");
    assert_eq!(
        keeps.iter().map(|k| (k.0, k.1, k.2)).collect::<Vec<_>>(),
        [(1, 1, BOUND as i64), (2, 1, BOUND as i64)],
        "each attempt kept once, as it ended"
    );
    // Nothing kept and no Pod left: a failure that says why, never a command.
    std::fs::remove_dir_all(dir.kept_logs_dir(job_id)).unwrap();
    let out = logs(&op, &ns.name, "counter", &[]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(
        stderr.contains("attempt 2: nothing kept, and its Pod") && stderr.contains("is gone"),
        "{stderr}"
    );
    assert!(!text(&out.stdout).contains("kubectl logs"), "{out:?}");
}

/// A multi-node job of two ranks, each with an init container: a log per rank and container,
/// kept when the attempt ended; `--rank 1` shows rank 1's only.
#[tokio::test]
async fn a_multi_node_job_keeps_a_log_per_rank() {
    let (cp, client) = real_node_or_skip!();
    let ns = support::TestNamespace::new(&client, cp, "kept-gang").await;
    let op = operator(cp, &ns.name);
    let yaml = format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: pair
spec:
  nodes: 2
  template:
    spec:
      terminationGracePeriodSeconds: 2
      initContainers:
        - name: prepare
          image: {image}
          imagePullPolicy: Never
          command: ["sh", "-c", "echo preparing rank $MANAGEDJOB_NODE_RANK"]
          resources:
            requests: {{cpu: 10m, memory: 16Mi}}
      containers:
        - name: main
          image: {image}
          imagePullPolicy: Never
          command: ["sh", "-c", "echo rank $MANAGEDJOB_NODE_RANK of $MANAGEDJOB_NUM_NODES done"]
          resources:
            requests: {{cpu: 10m, memory: 16Mi}}
"#,
        image = support::BUSYBOX
    );
    create(&client, &ns.name, &yaml).await;
    let mj = support::wait_status(
        &client,
        &ns.name,
        "pair",
        T,
        "Succeeded",
        support::phase_is(JobPhase::Succeeded),
    )
    .await;
    let job_id = mj.status.and_then(|s| s.job_id).expect("a job id");
    delete_pods(&client, &ns.name, "pair").await;
    let out = logs(&op, &ns.name, "pair", &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        text(&out.stdout),
        "==> attempt 1, rank 0, container prepare <==\npreparing rank 0\n\
         ==> attempt 1, rank 0, container main <==\nrank 0 of 2 done\n\
         ==> attempt 1, rank 1, container prepare <==\npreparing rank 1\n\
         ==> attempt 1, rank 1, container main <==\nrank 1 of 2 done\n"
    );
    let out = logs(&op, &ns.name, "pair", &["--rank", "1"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        text(&out.stdout),
        "==> attempt 1, rank 1, container prepare <==\npreparing rank 1\n\
         ==> attempt 1, rank 1, container main <==\nrank 1 of 2 done\n"
    );
    let keeps = keeps(&op.state_path(), job_id);
    println!("keeps of job {job_id} (attempt, containers, bytes, ms): {keeps:?}");
    assert_eq!(
        keeps.iter().map(|k| (k.0, k.1)).collect::<Vec<_>>(),
        [(1, 4)]
    );
}

/// A cancel keeps the running attempt's log before it stops its Pod (which goes with the
/// stop): `managed-jobs logs` prints it once the job is Cancelled.
#[tokio::test]
async fn a_cancelled_jobs_log_is_kept_before_its_pod_is_stopped() {
    let (cp, client) = real_node_or_skip!();
    let ns = support::TestNamespace::new(&client, cp, "kept-cancel").await;
    let op = operator(cp, &ns.name);
    let yaml = format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: sleeper
spec:
  template:
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: main
          image: {image}
          imagePullPolicy: Never
          command: ["sh", "-c", "echo started; touch /tmp/started; exec sleep 600"]
          readinessProbe:
            exec: {{command: ["test", "-e", "/tmp/started"]}}
            periodSeconds: 1
          resources:
            requests: {{cpu: 10m, memory: 16Mi}}
"#,
        image = support::BUSYBOX
    );
    create(&client, &ns.name, &yaml).await;
    support::wait_status(
        &client,
        &ns.name,
        "sleeper",
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await;
    // Its output is written once the Pod is ready.
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let lp = ListParams::default().labels("managedjobs.dev/job-name=sleeper");
    let start = Instant::now();
    loop {
        let ready = pods.list(&lp).await.unwrap().items.iter().any(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|c| c.iter().all(|c| c.ready))
        });
        if ready {
            break;
        }
        assert!(start.elapsed() < T, "the Pod never became ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    support::cancel(&client, &ns.name, "sleeper").await;
    support::wait_status(
        &client,
        &ns.name,
        "sleeper",
        T,
        "Cancelled",
        support::phase_is(JobPhase::Cancelled),
    )
    .await;
    let out = logs(&op, &ns.name, "sleeper", &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out.stdout), "started\n");
}
