//! The operator the way users run it: the image `hack/image.sh` builds from the repository's
//! Dockerfile, installed by `helm install` with the chart's defaults (only the image and the node
//! placement in `tests/real-node/values.yaml`) on the dev control plane's real kubelet node
//! (`hack/controlplane.sh up --real-node`: containerd, runc and a kubelet built from the control
//! plane's own Kubernetes module). Pods here really run (busybox), the kubelet sends the signals
//! and kills the containers, and the operator runs in its container under its ServiceAccount.
//!
//! The installed operator watches every namespace, so one release exists at a time: each test
//! holds [`LOCK`] and installs and uninstalls its own. What must never happen is counted over the
//! whole test: every Pod a watch saw (one per attempt), every phase a watch saw (never
//! FailedController).
//!
//! Needs root, the real node and the image; without them a test records a skip, except under
//! `CI=true`, where it fails (hack/test.sh brings both up first).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::{Client, ResourceExt as _};
use managed_jobs::api::{JobPhase, ManagedJob, ManagedJobStatus};
use serde_json::{Value, json};

/// One installed operator at a time (it is cluster-wide).
static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const RELEASE: &str = "mj";
const NAMESPACE: &str = "mj-system";
/// The StatefulSet's Pod and its state volume's claim (release `mj`: full name `mj-managed-jobs`).
const OPERATOR_POD: &str = "mj-managed-jobs-0";
const CLAIM: &str = "state-mj-managed-jobs-0";
/// The real node (hack/realnode.sh).
const NODE: &str = support::REAL_NODE;
/// The image `hack/image.sh` builds: tagged with this release's version, the chart's appVersion
/// (the default tag the chart installs).
const IMAGE: &str = concat!("docker.io/library/managed-jobs:", env!("CARGO_PKG_VERSION"));
/// The host folder behind the state volume: under the real node's data dir, which
/// `hack/controlplane.sh down` removes.
const VOLUME_DIR: &str = "/var/lib/mj-realnode/volumes/mj-state";
const PV: &str = "mj-real-node-state";
/// Long enough for a Pod of a few seconds plus image start on a loaded 2-core machine.
const T: Duration = Duration::from_secs(300);

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("running a command");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn helm(cp: &support::ControlPlane, args: &[&str]) -> (bool, String) {
    let out = Command::new(support::root().join("hack/controlplane.sh"))
        .args(["bin-dir", "helm"])
        .output()
        .expect("hack/controlplane.sh bin-dir helm");
    let bin = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("helm");
    run(Command::new(bin)
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(args)
        .current_dir(support::root()))
}

fn kubectl(cp: &support::ControlPlane, args: &[&str]) -> (bool, String) {
    support::kubectl(cp, args)
}

/// `ctr` against the real node's containerd, namespace k8s.io (the kubelet's).
fn ctr(args: &[&str]) -> (bool, String) {
    support::real_node_ctr(args)
}

/// Is the real node Ready with the operator image imported? If not: a skip, or under CI a failure.
fn real_node_ready(cp: &support::ControlPlane) -> bool {
    support::real_node_ready(cp, IMAGE, "`hack/image.sh --load`")
}

/// The control plane, the lock and a client, or a skip (see [`real_node_ready`]).
macro_rules! real_node_or_skip {
    () => {{
        let cp = control_plane_or_skip!();
        let guard = LOCK.lock().await;
        if !real_node_ready(cp) {
            return;
        }
        (cp, guard, support::client(cp).await)
    }};
}

/// One `helm install` of the chart in [`NAMESPACE`], uninstalled (with its volume) when dropped.
struct Release {
    cp: &'static support::ControlPlane,
    /// The chart installed: this checkout's `charts/managed-jobs`, or a previous release's.
    chart: PathBuf,
    sets: Vec<String>,
}

impl Release {
    /// Installs the chart with the test values and `sets`, waits until it is Ready.
    fn install(cp: &'static support::ControlPlane, sets: &[&str]) -> Release {
        Release::install_chart(cp, &support::root().join("charts/managed-jobs"), sets)
    }

    /// [`Release::install`] of the chart at `chart` (a previous release's).
    fn install_chart(cp: &'static support::ControlPlane, chart: &Path, sets: &[&str]) -> Release {
        clean_up(cp);
        adopt_cluster_objects(cp);
        let release = Release {
            cp,
            chart: chart.to_path_buf(),
            sets: sets.iter().map(|s| s.to_string()).collect(),
        };
        if !sets.contains(&"persistence.enabled=false") {
            create_state_volume(cp);
        }
        release.helm_install_or_upgrade("install", &[]);
        release
    }

    fn helm_install_or_upgrade(&self, verb: &str, more: &[&str]) {
        let values = support::root().join("tests/real-node/values.yaml");
        let chart = self.chart.to_string_lossy().into_owned();
        let mut args = vec![
            verb,
            RELEASE,
            chart.as_str(),
            "-n",
            NAMESPACE,
            "-f",
            values.to_str().unwrap(),
            "--wait",
            "--timeout",
            "180s",
        ];
        if verb == "install" {
            args.push("--create-namespace");
        }
        for s in self
            .sets
            .iter()
            .map(String::as_str)
            .chain(more.iter().copied())
        {
            args.extend(["--set", s]);
        }
        let start = Instant::now();
        let (ok, out) = helm(self.cp, &args);
        assert!(
            ok,
            "helm {verb} failed after {:?}: {out}\n{}",
            start.elapsed(),
            self.diagnostics()
        );
        eprintln!(
            "helm {verb}: Ready after {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }

    /// `helm upgrade` with `more` values on top of the install's: rolls the operator Pod when
    /// its template changes. Returns once the new Pod is Ready.
    fn upgrade(&self, more: &[&str]) {
        self.helm_install_or_upgrade("upgrade", more);
    }

    /// `helm upgrade` to this checkout's chart (a version change: its appVersion is the default
    /// image tag) with `sets` instead of the install's. Returns once the new Pod is Ready.
    fn upgrade_to_this_release(&mut self, sets: &[&str]) {
        self.chart = support::root().join("charts/managed-jobs");
        self.sets = sets.iter().map(|s| s.to_string()).collect();
        self.helm_install_or_upgrade("upgrade", &[]);
    }

    fn operator_pod(&self) -> Option<Value> {
        let (ok, out) = kubectl(
            self.cp,
            &["-n", NAMESPACE, "get", "pod", OPERATOR_POD, "-o", "json"],
        );
        ok.then(|| serde_json::from_str(&out).ok()).flatten()
    }

    /// Waits until the operator Pod is Ready and passes `pred`; returns it.
    fn wait_operator(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(pod) = self.operator_pod()
                && is_ready(&pod)
                && pred(&pod)
            {
                return pod;
            }
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "the operator Pod never became Ready ({what})\n{}",
                self.diagnostics()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The operator container's log (`kubectl logs`: the API server reaches the kubelet with its
    /// client certificate).
    fn logs(&self, previous: bool) -> String {
        let mut args = vec!["-n", NAMESPACE, "logs", OPERATOR_POD];
        if previous {
            args.push("--previous");
        }
        kubectl(self.cp, &args).1
    }

    fn diagnostics(&self) -> String {
        let describe = kubectl(self.cp, &["-n", NAMESPACE, "describe", "pod", OPERATOR_POD]).1;
        let logs = self.logs(false);
        let tail: Vec<&str> = logs.lines().rev().take(40).collect();
        format!(
            "--- kubectl describe pod {OPERATOR_POD}:\n{describe}\n--- its log (last 40 lines):\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    fn uninstall(&self) {
        let (ok, out) = helm(
            self.cp,
            &[
                "uninstall",
                RELEASE,
                "-n",
                NAMESPACE,
                "--wait",
                "--timeout",
                "120s",
            ],
        );
        assert!(ok, "helm uninstall: {out}");
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.diagnostics());
        }
        clean_up(self.cp);
    }
}

fn is_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

/// Removes any release, its claim, the volume and its folder: each test starts from nothing.
fn clean_up(cp: &support::ControlPlane) {
    let (_, list) = helm(cp, &["list", "-n", NAMESPACE, "-q"]);
    if list.lines().any(|l| l.trim() == RELEASE) {
        let _ = helm(
            cp,
            &[
                "uninstall",
                RELEASE,
                "-n",
                NAMESPACE,
                "--wait",
                "--timeout",
                "120s",
            ],
        );
    }
    kubectl(
        cp,
        &[
            "-n",
            NAMESPACE,
            "delete",
            "pvc",
            CLAIM,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ],
    );
    kubectl(
        cp,
        &[
            "delete",
            "pv",
            PV,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ],
    );
    let _ = std::fs::remove_dir_all(VOLUME_DIR);
}

/// The cluster-scoped objects of `crds/` (the CRD and the admission policies) were applied by
/// `kubectl apply -f crds/` for the other tests; `helm install` adopts them only when they carry
/// its ownership metadata, as a user who installed them by hand first must also add. The users'
/// roles of `crds/` are not adopted: the chart renders them under its release's names, beside
/// the by-hand ones.
fn adopt_cluster_objects(cp: &support::ControlPlane) {
    // Every object of crds/ the chart renders under the same name (the CRD and each policy
    // with its binding), by kind and name.
    let mut objects = Vec::new();
    for file in std::fs::read_dir(support::root().join("crds")).unwrap() {
        let text = std::fs::read_to_string(file.unwrap().path()).unwrap();
        for doc in text.split("\n---") {
            let Ok(v) = serde_norway::from_str::<Value>(doc) else {
                continue;
            };
            if let (Some(kind), Some(name)) = (v["kind"].as_str(), v["metadata"]["name"].as_str())
                && !kind.starts_with("ClusterRole")
            {
                objects.push(format!("{}/{name}", kind.to_lowercase()));
            }
        }
    }
    assert!(objects.len() >= 3, "crds/ holds {objects:?}");
    for object in &objects {
        let object = object.as_str();
        if !kubectl(cp, &["get", object]).0 {
            continue;
        }
        let (ok, out) = kubectl(
            cp,
            &[
                "annotate",
                "--overwrite",
                object,
                &format!("meta.helm.sh/release-name={RELEASE}"),
                &format!("meta.helm.sh/release-namespace={NAMESPACE}"),
            ],
        );
        assert!(ok, "annotating {object}: {out}");
        let (ok, out) = kubectl(
            cp,
            &[
                "label",
                "--overwrite",
                object,
                "app.kubernetes.io/managed-by=Helm",
            ],
        );
        assert!(ok, "labelling {object}: {out}");
    }
}

/// A hostPath PersistentVolume on the real node, bound ahead to the StatefulSet's claim (the dev
/// control plane has no provisioner), its folder owned by the container's user.
fn create_state_volume(cp: &support::ControlPlane) {
    std::fs::create_dir_all(VOLUME_DIR).unwrap();
    std::os::unix::fs::chown(VOLUME_DIR, Some(65532), Some(65532))
        .expect("chown of the volume folder (the real-node tests run as root)");
    let pv = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": PV},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": VOLUME_DIR, "type": "Directory"},
            "claimRef": {"namespace": NAMESPACE, "name": CLAIM},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE]}
            ]}]}}
        }
    });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), pv.to_string()).unwrap();
    let (ok, out) = kubectl(cp, &["apply", "-f", file.path().to_str().unwrap()]);
    assert!(ok, "creating the state volume: {out}");
}

async fn create(client: &Client, ns: &str, yaml: &str) {
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .create(&Default::default(), &support::on_real_node(yaml))
        .await
        .expect("creating the ManagedJob");
}

/// A pod job whose busybox container sleeps `seconds`, then exits 0.
fn sleeper(name: &str, seconds: u32) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  template:\n    spec:\n      terminationGracePeriodSeconds: 2\n      containers:\n        - name: main\n          image: busybox:1.36\n          command: [\"sh\", \"-c\", \"sleep {seconds}; echo done\"]\n          resources:\n            requests: {{cpu: 10m, memory: 16Mi}}\n"
    )
}

/// A pipeline of three busybox tasks of `seconds` each.
fn pipeline(name: &str, seconds: u32) -> String {
    let task = |t: &str| {
        format!(
            "    - name: {t}\n      template:\n        spec:\n          terminationGracePeriodSeconds: 2\n          containers:\n            - name: main\n              image: busybox:1.36\n              command: [\"sh\", \"-c\", \"sleep {seconds}; echo {t}\"]\n              resources:\n                requests: {{cpu: 10m, memory: 16Mi}}\n"
        )
    };
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  tasks:\n{}{}{}",
        task("fetch"),
        task("train"),
        task("publish")
    )
}

/// Every Pod a watch saw in `ns`, by name, with its job's name (label `managedjobs.dev/job-name`).
type PodsSeen = Arc<Mutex<BTreeMap<String, String>>>;

fn watch_pods(client: &Client, ns: &str) -> (tokio::task::JoinHandle<()>, PodsSeen) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let seen: PodsSeen = Arc::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p),
            ) = ev
            {
                let job = p
                    .labels()
                    .get("managedjobs.dev/job-name")
                    .cloned()
                    .unwrap_or_default();
                out.lock().unwrap().insert(p.name_any(), job);
            }
        }
    });
    (task, seen)
}

/// Every phase a watch saw each ManagedJob in `ns` take, in order.
type PhasesSeen = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

fn watch_phases(client: &Client, ns: &str) -> (tokio::task::JoinHandle<()>, PhasesSeen) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let api = Api::<ManagedJob>::namespaced(client.clone(), ns);
    let seen: PhasesSeen = Arc::default();
    let out = seen.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) = ev
                && let Some(phase) = j.status.as_ref().and_then(|s| s.phase)
            {
                let mut seen = out.lock().unwrap();
                let phases = seen.entry(j.name_any()).or_default();
                if phases.last().map(String::as_str) != Some(phase.as_str()) {
                    phases.push(phase.as_str().to_string());
                }
            }
        }
    });
    (task, seen)
}

async fn finished(client: &Client, ns: &str, name: &str) -> ManagedJobStatus {
    support::wait_status(client, ns, name, T, "a terminal phase", |s| {
        s.phase.is_some_and(JobPhase::is_terminal)
    })
    .await
    .status
    .unwrap()
}

async fn running(client: &Client, ns: &str, name: &str) -> ManagedJobStatus {
    support::wait_status(
        client,
        ns,
        name,
        T,
        "Running",
        support::phase_is(JobPhase::Running),
    )
    .await
    .status
    .unwrap()
}

/// Asserts that the job ended Succeeded on its first attempt of each task, no restart, no
/// recovery, and that it had exactly `pods` Pods over the whole test.
fn assert_clean_success(name: &str, s: &ManagedJobStatus, pods: &PodsSeen, expected_pods: usize) {
    assert_eq!(
        s.phase,
        Some(JobPhase::Succeeded),
        "{name}: {:?} {:?}",
        s.failure_reason,
        s.message
    );
    assert_eq!(
        (s.restart_count, s.recovery_count),
        (0, 0),
        "{name}: restarts and recoveries: {s:#?}"
    );
    let seen: Vec<String> = pods
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, job)| *job == name)
        .map(|(pod, _)| pod.clone())
        .collect();
    assert_eq!(
        seen.len(),
        expected_pods,
        "{name}: exactly one Pod per attempt, over the whole test; saw {seen:?}"
    );
}

fn assert_never(phases: &PhasesSeen, bad: &[&str]) {
    for (job, seen) in phases.lock().unwrap().iter() {
        for phase in seen {
            assert!(
                !bad.contains(&phase.as_str()),
                "{job} was seen {phase}: {seen:?}"
            );
        }
    }
}

/// The host pid of a running container of the operator Pod (its containerd task).
fn container_pid(pod: &Value) -> (String, i32) {
    let id = pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|id| id.strip_prefix("containerd://"))
        .expect("the operator container's id")
        .to_string();
    let (ok, tasks) = ctr(&["tasks", "ls"]);
    assert!(ok, "{tasks}");
    let pid = tasks
        .lines()
        .find_map(|l| {
            let mut cols = l.split_whitespace();
            (cols.next() == Some(id.as_str())).then(|| cols.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("no containerd task {id}: {tasks}"));
    (id, pid)
}

/// The default install becomes Ready and `helm test` passes; the container runs as 65532 on a
/// read-only root filesystem, writes its state only to the volume, and derives its caps from
/// the chart's default limits (2 CPUs, 2Gi).
#[tokio::test]
async fn the_default_install_becomes_ready_and_passes_helm_test() {
    let (cp, _guard, _client) = real_node_or_skip!();
    let release = Release::install(cp, &[]);
    let pod = release.wait_operator("after install", |_| true);

    let (ok, out) = helm(
        cp,
        &[
            "test",
            RELEASE,
            "-n",
            NAMESPACE,
            "--timeout",
            "240s",
            "--logs",
        ],
    );
    assert!(ok, "helm test failed: {out}\n{}", release.diagnostics());
    assert!(out.contains("smoke test passed"), "{out}");
    assert!(out.contains("phase Succeeded"), "{out}");

    // The process as the kernel sees it.
    let (_, pid) = container_pid(&pod);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uids = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert_eq!(
        uids.split_whitespace().skip(1).collect::<Vec<_>>(),
        ["65532"; 4],
        "{uids}"
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let mut writable = BTreeSet::new();
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (point, options) = (fields[4], fields[5]);
        if point == "/" {
            assert!(
                options.split(',').any(|o| o == "ro"),
                "root filesystem: {line}"
            );
        }
        if options.split(',').any(|o| o == "rw")
            && !point.starts_with("/proc")
            && !point.starts_with("/sys")
            && !point.starts_with("/dev")
        {
            writable.insert(point.to_string());
        }
    }
    // What the container may write: its state dir, /tmp, and the files the kubelet manages.
    let allowed = [
        "/var/lib/managed-jobs",
        "/tmp",
        "/etc/hosts",
        "/etc/hostname",
        "/etc/resolv.conf",
    ];
    for point in &writable {
        assert!(
            allowed.contains(&point.as_str()),
            "writable mount {point} (all: {writable:?})"
        );
    }
    // Its state is on the volume.
    let files: BTreeSet<String> = std::fs::read_dir(VOLUME_DIR)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_string()))
        .collect();
    assert!(
        files
            .iter()
            .any(|f| f.ends_with(".db") || f.ends_with(".sqlite")),
        "no store on the volume: {files:?}"
    );

    // The caps from the container's cgroup: 4 x 2 CPUs, (2048 - 512) / 16 MiB.
    let logs = release.logs(false);
    assert!(
        logs.contains("launch cap 8 (derived 8 = 4 x 2 CPUs), run cap 96 (derived 96 = (2048 MiB - 512 MiB reserved) / 16 MiB per job)"),
        "caps line: {}",
        logs.lines().find(|l| l.contains("caps in force")).unwrap_or("(none)")
    );
}

/// The kubelet of the real node is not open to whoever reaches it: an anonymous request is
/// refused, while the API server (its client certificate) reads logs through it (the other tests).
#[tokio::test]
async fn the_real_nodes_kubelet_refuses_anonymous_requests() {
    let cp = control_plane_or_skip!();
    let _guard = LOCK.lock().await;
    if !real_node_ready(cp) {
        return;
    }
    let (ok, node) = kubectl(cp, &["get", "node", NODE, "-o", "json"]);
    assert!(ok, "{node}");
    let node: Value = serde_json::from_str(&node).unwrap();
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap();
    let ip = node["status"]["addresses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .unwrap()["address"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, code) = run(Command::new("curl").args([
        "-sk",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("https://{ip}:{port}/pods"),
    ]));
    assert_eq!(code.trim(), "401", "an anonymous GET /pods of the kubelet");
}

/// The examples' pod jobs, applied as they are (placed on the real node), end as their comments
/// say, through the installed operator, with real containers.
#[tokio::test]
async fn the_examples_pod_jobs_run_through_the_installed_operator() {
    let (cp, _guard, client) = real_node_or_skip!();
    let _release = Release::install(cp, &[]);
    let ns = support::TestNamespace::new(&client, cp, "real-examples").await;
    let (pods_task, pods) = watch_pods(&client, &ns.name);
    for example in ["pod-hello", "pod-pipeline", "pod-failing", "pod-long"] {
        let yaml =
            std::fs::read_to_string(support::root().join(format!("examples/{example}.yaml")))
                .unwrap();
        create(&client, &ns.name, &yaml).await;
    }
    let hello = finished(&client, &ns.name, "pod-hello").await;
    assert_clean_success("pod-hello", &hello, &pods, 1);
    let hello_pod = hello.workload.clone().unwrap_or_default();
    let hello_pod = hello_pod.strip_prefix("pod/").unwrap_or(&hello_pod);
    let (_, log) = kubectl(cp, &["-n", &ns.name, "logs", hello_pod]);
    assert!(
        log.contains("hello from a pod"),
        "the container's own output: {log}"
    );

    let pipeline = finished(&client, &ns.name, "pod-pipeline").await;
    assert_clean_success("pod-pipeline", &pipeline, &pods, 3);
    let tasks: Vec<_> = pipeline.tasks.iter().map(|t| t.phase).collect();
    assert!(
        tasks
            .iter()
            .all(|p| *p == managed_jobs::api::TaskPhase::Succeeded),
        "{tasks:?}"
    );

    let failing = finished(&client, &ns.name, "pod-failing").await;
    assert_eq!(
        (failing.phase, failing.exit_code, failing.restart_count),
        (Some(JobPhase::Failed), Some(3), 1),
        "{failing:#?}"
    );

    running(&client, &ns.name, "pod-long").await;
    support::cancel(&client, &ns.name, "pod-long").await;
    let long = finished(&client, &ns.name, "pod-long").await;
    assert_eq!(long.phase, Some(JobPhase::Cancelled), "{long:#?}");
    let left = Api::<Pod>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| {
            p.labels()
                .get("managedjobs.dev/job-name")
                .map(String::as_str)
                == Some("pod-long")
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .count();
    assert_eq!(left, 0, "the cancelled job's Pod is gone");
    pods_task.abort();
}

/// Three `helm upgrade`s roll the operator Pod (the kubelet sends SIGTERM and kills the
/// container with its job controllers) while a pod job of 120 s and a pipeline run: both succeed
/// with one Pod per attempt, no restart, no recovery, never FailedController.
#[tokio::test]
async fn three_rollouts_while_a_pod_job_and_a_pipeline_run() {
    let (cp, _guard, client) = real_node_or_skip!();
    let release = Release::install(cp, &[]);
    let ns = support::TestNamespace::new(&client, cp, "real-rollouts").await;
    let (pods_task, pods) = watch_pods(&client, &ns.name);
    let (phases_task, phases) = watch_phases(&client, &ns.name);
    create(&client, &ns.name, &sleeper("long", 120)).await;
    create(&client, &ns.name, &pipeline("steps", 20)).await;
    running(&client, &ns.name, "long").await;
    running(&client, &ns.name, "steps").await;
    let mut uid = release.operator_pod().unwrap()["metadata"]["uid"].clone();
    for i in 1..=3 {
        let start = Instant::now();
        release.upgrade(&[&format!("podAnnotations.rollout=r{i}")]);
        let pod = release.wait_operator("after a rollout", |p| p["metadata"]["uid"] != uid);
        uid = pod["metadata"]["uid"].clone();
        eprintln!(
            "rollout {i}: new operator Ready after {:.1} s",
            start.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    let long = finished(&client, &ns.name, "long").await;
    let steps = finished(&client, &ns.name, "steps").await;
    pods_task.abort();
    phases_task.abort();
    assert_clean_success("long", &long, &pods, 1);
    assert_clean_success("steps", &steps, &pods, 3);
    assert_eq!(long.attempt, 1);
    assert_never(&phases, &["FailedController", "Recovering", "Failed"]);
}

/// The runtime kills the operator's container (SIGKILL through containerd, as an OOM kill
/// does): the kubelet restarts it and the jobs still succeed, one Pod per attempt.
#[tokio::test]
async fn the_runtime_killing_the_operator_container_loses_no_job() {
    let (cp, _guard, client) = real_node_or_skip!();
    let release = Release::install(cp, &[]);
    let ns = support::TestNamespace::new(&client, cp, "real-sigkill").await;
    let (pods_task, pods) = watch_pods(&client, &ns.name);
    let (phases_task, phases) = watch_phases(&client, &ns.name);
    create(&client, &ns.name, &sleeper("sturdy", 45)).await;
    create(&client, &ns.name, &pipeline("chain", 12)).await;
    running(&client, &ns.name, "sturdy").await;
    running(&client, &ns.name, "chain").await;
    let pod = release.operator_pod().unwrap();
    let (id, _) = container_pid(&pod);
    let (ok, out) = ctr(&["tasks", "kill", "-s", "SIGKILL", &id]);
    assert!(ok, "ctr tasks kill: {out}");
    let pod = release.wait_operator("after the kill", |p| {
        p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1)
    });
    let last = &pod["status"]["containerStatuses"][0]["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 137, "killed by SIGKILL: {last}");
    let sturdy = finished(&client, &ns.name, "sturdy").await;
    let chain = finished(&client, &ns.name, "chain").await;
    pods_task.abort();
    phases_task.abort();
    assert_clean_success("sturdy", &sturdy, &pods, 1);
    assert_clean_success("chain", &chain, &pods, 3);
    assert_never(&phases, &["FailedController", "Recovering", "Failed"]);
}

/// With `persistence.enabled=false` the state dir is an emptyDir: the operator Pod deleted
/// mid-run comes back empty, rebuilds the job from its status and adopts its running Pod.
#[tokio::test]
async fn an_operator_on_an_empty_dir_rebuilds_from_status_after_its_pod_is_deleted() {
    let (cp, _guard, client) = real_node_or_skip!();
    let release = Release::install(cp, &["persistence.enabled=false"]);
    let ns = support::TestNamespace::new(&client, cp, "real-emptydir").await;
    let (pods_task, pods) = watch_pods(&client, &ns.name);
    create(&client, &ns.name, &sleeper("kept", 45)).await;
    let before = running(&client, &ns.name, "kept").await;
    let uid = release.operator_pod().unwrap()["metadata"]["uid"].clone();
    let (ok, out) = kubectl(
        cp,
        &[
            "-n",
            NAMESPACE,
            "delete",
            "pod",
            OPERATOR_POD,
            "--wait=true",
        ],
    );
    assert!(ok, "{out}");
    release.wait_operator("after the deletion", |p| p["metadata"]["uid"] != uid);
    let logs = release.logs(false);
    assert!(
        logs.contains("rebuilt from the ManagedJobs' status"),
        "the new operator rebuilt its store: {logs}"
    );
    let after = finished(&client, &ns.name, "kept").await;
    pods_task.abort();
    assert_clean_success("kept", &after, &pods, 1);
    assert_eq!(after.job_id, before.job_id, "the job id is kept");
}

/// `resources.limits` of 1 CPU and 512Mi: the caps the installed operator logs follow the
/// container's limits by the formula of docs/reference/flags.md (launch = 4 x CPUs; run =
/// (memory - reserved) / per-job budget, at least 1; a run cap of 1 is warned about), and `managed-jobs queue`
/// (kubectl exec) shows them. Installed with `watchNamespace` (not the release namespace),
/// `helm test --logs` passes.
#[tokio::test]
async fn the_caps_follow_the_containers_limits() {
    let (cp, _guard, client) = real_node_or_skip!();
    // Scoped to one namespace other than the release's, which `helm test` must handle too.
    let ns = support::TestNamespace::new(&client, cp, "real-scoped").await;
    let watch = format!("watchNamespace={}", ns.name);
    let release = Release::install(
        cp,
        &[
            "resources.limits.cpu=1",
            "resources.limits.memory=512Mi",
            "resources.requests.cpu=100m",
            "resources.requests.memory=256Mi",
            &watch,
        ],
    );
    let logs = release.logs(false);
    let line = logs
        .lines()
        .find(|l| l.contains("caps in force"))
        .unwrap_or("(none)");
    assert!(
        line.contains("launch cap 4 (derived 4 = 4 x 1 CPUs), run cap 1 (derived 1 = (512 MiB - 512 MiB reserved) / 16 MiB per job)"),
        "caps line: {line}"
    );
    let (ok, queue) = kubectl(
        cp,
        &[
            "-n",
            NAMESPACE,
            "exec",
            OPERATOR_POD,
            "--",
            "/managed-jobs",
            "queue",
            "--state-dir",
            "/var/lib/managed-jobs",
        ],
    );
    assert!(ok, "kubectl exec queue: {queue}");
    assert!(queue.contains("caps: launch=4,run=1"), "{queue}");
    assert!(
        logs.contains("the run cap is 1 job at a time"),
        "a run cap of 1 is warned about: {logs}"
    );
    // The job goes to the watched namespace, the test Pod (and its log) stays in the release's.
    let (ok, out) = helm(
        cp,
        &[
            "test",
            RELEASE,
            "-n",
            NAMESPACE,
            "--timeout",
            "240s",
            "--logs",
        ],
    );
    assert!(ok, "helm test --logs with watchNamespace: {out}");
    assert!(
        out.contains(&format!("created managedjob {}/", ns.name)),
        "{out}"
    );
}

/// `helm uninstall` with jobs running, then `helm install` again: the jobs' Pods run on without
/// an operator, and every job ends as it would have without the pause (README of the chart).
#[tokio::test]
async fn uninstall_then_install_again_ends_every_job_as_without_the_pause() {
    let (cp, _guard, client) = real_node_or_skip!();
    let release = Release::install(cp, &[]);
    let ns = support::TestNamespace::new(&client, cp, "real-reinstall").await;
    let (pods_task, pods) = watch_pods(&client, &ns.name);
    let (phases_task, phases) = watch_phases(&client, &ns.name);
    create(&client, &ns.name, &sleeper("paused", 40)).await;
    create(&client, &ns.name, &pipeline("relay", 10)).await;
    running(&client, &ns.name, "paused").await;
    running(&client, &ns.name, "relay").await;
    release.uninstall();
    // The StatefulSet's Pod goes with it (the garbage collector deletes it a moment later).
    let start = Instant::now();
    while release.operator_pod().is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the operator Pod outlived its StatefulSet"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // A while without an operator: the Pods run on (the pipeline's first task ends meanwhile).
    tokio::time::sleep(Duration::from_secs(20)).await;
    release.helm_install_or_upgrade("install", &[]);
    let paused = finished(&client, &ns.name, "paused").await;
    let relay = finished(&client, &ns.name, "relay").await;
    pods_task.abort();
    phases_task.abort();
    assert_clean_success("paused", &paused, &pods, 1);
    assert_clean_success("relay", &relay, &pods, 3);
    assert_never(&phases, &["FailedController", "Recovering", "Failed"]);
}

/// A pod job whose Pod someone else deletes while it runs: the kubelet stops its container
/// (SIGTERM, then SIGKILL after the grace) and reports the exit that caused, 143, or 0 from a
/// workload that traps SIGTERM to save its work. Neither is the workload's own result: the
/// attempt is lost and recovered in a new Pod (recoveryCount 1), never Failed, never Succeeded.
/// kwok never reports an exit after a deletion, so only a real kubelet shows this.
#[tokio::test]
async fn a_pod_deleted_by_someone_else_is_recovered_whatever_it_exits_with() {
    let (cp, _guard, client) = real_node_or_skip!();
    let _release = Release::install(cp, &[]);
    let ns = support::TestNamespace::new(&client, cp, "real-deleted").await;
    let (pods_task, pods) = watch_pods(&client, &ns.name);
    let (phases_task, phases) = watch_phases(&client, &ns.name);
    let job = |name: &str, script: &str| {
        format!(
            "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  recovery:\n    maxRecoveries: 3\n  template:\n    spec:\n      terminationGracePeriodSeconds: 5\n      containers:\n        - name: main\n          image: busybox:1.36\n          command: [\"sh\", \"-c\", {script:?}]\n          resources:\n            requests: {{cpu: 10m, memory: 16Mi}}\n"
        )
    };
    create(&client, &ns.name, &job("killed", "sleep 3600")).await;
    create(
        &client,
        &ns.name,
        &job("saver", "trap 'echo saved; exit 0' TERM; sleep 3600 & wait"),
    )
    .await;
    for name in ["killed", "saver"] {
        let first = running(&client, &ns.name, name).await;
        let pod = first.workload.clone().unwrap_or_default();
        let pod = pod.strip_prefix("pod/").unwrap_or(&pod).to_string();
        let (ok, out) = kubectl(cp, &["-n", &ns.name, "delete", "pod", &pod, "--wait=false"]);
        assert!(ok, "{out}");
        let again = support::wait_status(&client, &ns.name, name, T, "Running again", |s| {
            s.phase == Some(JobPhase::Running) && s.recovery_count == 1
        })
        .await
        .status
        .unwrap();
        assert_eq!(
            (again.attempt, again.restart_count),
            (2, 0),
            "{name}: {again:#?}"
        );
    }
    for name in ["killed", "saver"] {
        support::cancel(&client, &ns.name, name).await;
        let end = finished(&client, &ns.name, name).await;
        assert_eq!(end.phase, Some(JobPhase::Cancelled), "{name}: {end:#?}");
    }
    pods_task.abort();
    phases_task.abort();
    assert_never(&phases, &["Failed", "Succeeded", "FailedController"]);
    for name in ["killed", "saver"] {
        let n = pods.lock().unwrap().values().filter(|j| *j == name).count();
        assert_eq!(n, 2, "{name}: one Pod per attempt, two attempts");
    }
}

/// A pod job on the kwok nodes (the operator runs on the real node; its workloads need not):
/// kwok completes its Pod `complete_after` after it runs, exiting `exit_code`, or never while
/// `complete_after` is `None` (the test then annotates the Pod: hack/stages/pod-complete.yaml).
fn kwok_job(name: &str, complete_after: Option<&str>, exit_code: i32, extra: &str) -> String {
    let annotations = match complete_after {
        Some(d) => format!(
            r#"{{"managedjobs.dev/complete-after": "{d}", "managedjobs.dev/exit-code": "{exit_code}"}}"#
        ),
        None => "{}".into(),
    };
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n{extra}  template:\n    metadata:\n      annotations: {annotations}\n    spec:\n      containers:\n        - name: main\n          image: busybox:1.36\n          resources:\n            requests: {{cpu: 10m, memory: 16Mi}}\n"
    )
}

/// The backward-compatibility test, chart form (docs/upgrades.md; the host-process form is
/// tests/upgrade.rs): the previous release installed by its own chart with its own image
/// (hack/previous-release.sh), jobs in every state, then `helm upgrade` to this checkout's
/// chart, whose appVersion brings this build's image. Every job ends as it would have without
/// the upgrade, one Pod per attempt over the whole test, no recovery, no crash counted (the
/// store on the state volume), the restart back-off honoured across the upgrade, and the status
/// of the job that finished before it byte-identical.
///
/// The previous release's chart is installed with leader election off: 0.1.0's Role lacks the
/// Lease `patch` verb, so its default install never became Ready (fixed in 0.2.0; CHANGELOG.md).
#[tokio::test]
async fn a_helm_upgrade_from_the_previous_release_loses_repeats_and_fails_no_job() {
    let (cp, _guard, client) = real_node_or_skip!();
    let Some(previous) = support::previous_release("tests/real_node.rs upgrade") else {
        return;
    };
    let old_image = format!("docker.io/library/managed-jobs:{}", previous.version);
    let images = ctr(&["images", "ls", "-q"]).1;
    if !images.lines().any(|l| l.trim() == old_image) {
        let why = format!(
            "the previous release's image {old_image} is not on the real node: \
             hack/previous-release.sh image, then hack/controlplane.sh load-image $(hack/previous-release.sh dir)/image.tar"
        );
        assert!(
            std::env::var("CI").unwrap_or_default().is_empty(),
            "CI is set but {why}"
        );
        support::record_skip(&why);
        return;
    }
    let backoff = 20;
    let lifecycle = [
        "caps.runCap=3".to_string(),
        format!("lifecycle.restartBackoffSeconds={backoff}"),
        "lifecycle.maxControllerCrashes=1".to_string(),
    ];
    let mut old_sets: Vec<&str> = lifecycle.iter().map(String::as_str).collect();
    old_sets.push("leaderElection.enabled=false");
    let mut release =
        Release::install_chart(cp, &previous.src().join("charts/managed-jobs"), &old_sets);
    let pod = release.wait_operator("the previous release", |_| true);
    assert_eq!(
        pod["spec"]["containers"][0]["image"].as_str(),
        Some(format!("managed-jobs:{}", previous.version).as_str())
    );
    let ns = support::TestNamespace::new(&client, cp, "real-upgrade").await;
    let (pods_task, pods) = watch_pods(&client, &ns.name);
    let (phases_task, phases) = watch_phases(&client, &ns.name);
    let jobs = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    let apply = |yaml: String| {
        let jobs = jobs.clone();
        async move {
            let mj: ManagedJob = serde_norway::from_str(&yaml).expect("ManagedJob YAML");
            jobs.create(&Default::default(), &mj).await.expect("create");
        }
    };

    // Finished before the upgrade.
    apply(kwok_job("done", Some("1s"), 0, "")).await;
    let done = finished(&client, &ns.name, "done").await;
    assert_eq!(done.phase, Some(JobPhase::Succeeded), "{done:#?}");
    let done_before = serde_json::to_string(&jobs.get("done").await.unwrap().status).unwrap();
    // Running and in a back-off: three take the run cap of 3.
    apply(kwok_job("running", None, 0, "")).await;
    let pipeline = "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: steps\nspec:\n  tasks:\n    - name: first\n      template:\n        metadata: {annotations: {}}\n        spec:\n          containers: [{name: main, image: busybox:1.36}]\n    - name: second\n      template:\n        metadata: {annotations: {\"managedjobs.dev/complete-after\": \"0s\"}}\n        spec:\n          containers: [{name: main, image: busybox:1.36}]\n";
    apply(pipeline.to_string()).await;
    apply(kwok_job(
        "backoff",
        Some("0s"),
        3,
        "  recovery: {maxRestartsOnErrors: 1}\n",
    ))
    .await;
    running(&client, &ns.name, "running").await;
    running(&client, &ns.name, "steps").await;
    // In its restart's back-off: Recovering (from 0.2.0 on, the status counts the restart only
    // once its attempt launched, and that attempt ends at once, freeing its slot).
    support::wait_status(
        &client,
        &ns.name,
        "backoff",
        T,
        "a restart's back-off",
        |s| s.phase == Some(JobPhase::Recovering),
    )
    .await;
    // Queued behind them (created once those hold the slots: the watch need not deliver
    // objects created in one second in their order).
    apply(kwok_job("queued-1", Some("1s"), 0, "")).await;
    apply(kwok_job("queued-2", Some("1s"), 0, "")).await;
    for name in ["queued-1", "queued-2"] {
        support::wait_status(
            &client,
            &ns.name,
            name,
            T,
            "Pending",
            support::phase_is(JobPhase::Pending),
        )
        .await;
    }

    // The upgrade: this checkout's chart and, through its appVersion, this build's image.
    let old_uid = release.operator_pod().unwrap()["metadata"]["uid"].clone();
    let start = Instant::now();
    let sets: Vec<&str> = lifecycle.iter().map(String::as_str).collect();
    release.upgrade_to_this_release(&sets);
    let pod = release.wait_operator("this release", |p| p["metadata"]["uid"] != old_uid);
    assert_eq!(
        pod["spec"]["containers"][0]["image"].as_str(),
        Some(format!("managed-jobs:{}", env!("CARGO_PKG_VERSION")).as_str())
    );
    eprintln!(
        "helm upgrade {} -> {}: this release's operator Ready {:.1} s after the upgrade began",
        previous.version,
        env!("CARGO_PKG_VERSION"),
        start.elapsed().as_secs_f64()
    );
    // Nothing ends on its own meanwhile.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["running", "steps"] {
        let s = jobs.get(name).await.unwrap().status.unwrap();
        assert_eq!(s.phase, Some(JobPhase::Running), "{name}: {s:#?}");
    }
    // Let the running Pods end: whatever names they have (the previous release's had no uid tag).
    let pod_api = Api::<Pod>::namespaced(client.clone(), &ns.name);
    let seen: Vec<(String, String)> = pods
        .lock()
        .unwrap()
        .iter()
        .map(|(p, j)| (p.clone(), j.clone()))
        .collect();
    for (pod, job) in &seen {
        if job == "running" || job == "steps" {
            pod_api
                .patch(
                    pod,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({
                        "metadata": {"annotations": {"managedjobs.dev/complete-after": "0s"}}
                    })),
                )
                .await
                .expect("annotating a running Pod");
        }
    }
    let mut ended = BTreeMap::new();
    for name in [
        "done", "running", "steps", "backoff", "queued-1", "queued-2",
    ] {
        ended.insert(name, finished(&client, &ns.name, name).await);
    }
    pods_task.abort();
    phases_task.abort();
    assert_clean_success("running", &ended["running"], &pods, 1);
    assert_clean_success("steps", &ended["steps"], &pods, 2);
    assert_clean_success("queued-1", &ended["queued-1"], &pods, 1);
    assert_clean_success("queued-2", &ended["queued-2"], &pods, 1);
    let backoff_status = &ended["backoff"];
    assert_eq!(
        backoff_status.phase,
        Some(JobPhase::Failed),
        "{backoff_status:#?}"
    );
    assert_eq!(
        (backoff_status.restart_count, backoff_status.recovery_count),
        (1, 0),
        "{backoff_status:#?}"
    );
    // Two Pods for its two attempts, the second made no sooner than the back-off allows.
    let backoff_pods: Vec<String> = pods
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, j)| *j == "backoff")
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(backoff_pods.len(), 2, "{backoff_pods:?}");
    let mut created = Vec::new();
    for name in &backoff_pods {
        let p = pod_api.get(name).await.expect("a finished Pod is kept");
        created.push(
            p.metadata
                .creation_timestamp
                .expect("created")
                .0
                .as_second(),
        );
    }
    created.sort();
    assert!(
        created[1] - created[0] >= backoff - 1,
        "the restart's Pod came {} s after the first, before its back-off of {backoff} s",
        created[1] - created[0]
    );
    // A restart's back-off reads Recovering (the job's restart is its own): only the others
    // must never have been seen so; no job may have been seen FailedController.
    assert_never(&phases, &["FailedController"]);
    phases.lock().unwrap().remove("backoff");
    assert_never(&phases, &["Recovering"]);
    assert_eq!(
        serde_json::to_string(&jobs.get("done").await.unwrap().status).unwrap(),
        done_before,
        "the finished job's status changed across the upgrade"
    );
    // No crash counted, in the store on the state volume.
    let store = managed_jobs::store::Store::open_current(
        &managed_jobs::state_dir::StateDir::new(VOLUME_DIR).store(),
        1024,
    )
    .expect("the store on the state volume");
    for row in store.all().unwrap() {
        assert_eq!(
            row.controller_crashes, 0,
            "{}: a crash was counted",
            row.name
        );
        if row.name == "backoff" {
            assert_eq!(row.restart_count, 1);
        }
    }
    let log = release.logs(false);
    assert!(
        !log.contains("exited early"),
        "this release's operator counted a crash:\n{log}"
    );
}

/// Issue 30, class 1, in the deployed form: two releases of the chart watching one namespace
/// (each its own release namespace, ServiceAccount, Role and leader-election Lease; before, both
/// ran every job). One owns the namespace's jobs (it holds the Lease `managed-jobs-owner` there,
/// every status names it), the other says it leaves them alone; each job has one Pod. The
/// owner's release is uninstalled: the other takes the jobs over within the claim's 15 s (the
/// time is printed), adopts their Pods, and every job Succeeds without a restart or a recovery.
#[tokio::test]
async fn two_releases_watching_one_namespace_run_each_job_once_and_hand_over() {
    let (cp, _guard, client) = real_node_or_skip!();
    let watched = support::TestNamespace::new(&client, cp, "tworel").await;
    let w = watched.name.clone();
    let first = Release::install(
        cp,
        &[&format!("watchNamespace={w}"), "persistence.enabled=false"],
    );
    first.wait_operator("after install", |_| true);
    // The second release: its own namespace; the cluster-scoped objects stay the first's.
    const SECOND: &str = "mj-b";
    const SECOND_NS: &str = "mj-b-system";
    let values = support::root().join("tests/real-node/values.yaml");
    let chart = support::root().join("charts/managed-jobs");
    let watch_ns = format!("watchNamespace={w}");
    let mut args = vec![
        "install",
        SECOND,
        chart.to_str().unwrap(),
        "-n",
        SECOND_NS,
        "--create-namespace",
        "-f",
        values.to_str().unwrap(),
        "--wait",
        "--timeout",
        "180s",
    ];
    for set in [
        watch_ns.as_str(),
        "persistence.enabled=false",
        "crds.enabled=false",
        "shardPolicy.enabled=false",
        "gitopsPolicy.enabled=false",
        "finalizerPolicy.enabled=false",
        "helmTest.enabled=false",
        // One APIService per cluster: the first release's fronts the visibility API.
        "visibility.apiService.enabled=false",
    ] {
        args.extend(["--set", set]);
    }
    struct Second(&'static support::ControlPlane);
    impl Drop for Second {
        fn drop(&mut self) {
            let _ = helm(
                self.0,
                &[
                    "uninstall",
                    SECOND,
                    "-n",
                    SECOND_NS,
                    "--wait",
                    "--timeout",
                    "120s",
                ],
            );
            kubectl(self.0, &["delete", "namespace", SECOND_NS, "--wait=false"]);
        }
    }
    let (ok, out) = helm(cp, &args);
    assert!(ok, "helm install {SECOND}: {out}");
    let _second = Second(cp);
    let second_logs = || {
        kubectl(
            cp,
            &["-n", SECOND_NS, "logs", &format!("{SECOND}-managed-jobs-0")],
        )
        .1
    };

    let (pods_task, pods) = watch_pods(&client, &w);
    let (phases_task, phases) = watch_phases(&client, &w);
    for name in ["one", "two"] {
        create(&client, &w, &sleeper(name, 40)).await;
    }
    for name in ["one", "two"] {
        running(&client, &w, name).await;
    }
    let owner_of = |s: &ManagedJobStatus| s.owner.clone().unwrap_or_default();
    let holder = || {
        kubectl(
            cp,
            &[
                "-n",
                &w,
                "get",
                "lease",
                "managed-jobs-owner",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        )
        .1
        .trim()
        .to_string()
    };
    let owner = holder();
    assert!(
        owner.starts_with(OPERATOR_POD),
        "the first release owns them: {owner}"
    );
    for name in ["one", "two"] {
        assert_eq!(owner_of(&running(&client, &w, name).await), owner, "{name}");
    }
    let start = Instant::now();
    while !second_logs().contains("this operator leaves them alone") {
        assert!(
            start.elapsed() < T,
            "the second release never said so:\n{}",
            second_logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // The owner goes (its Pods run on): the second release takes the jobs over.
    first.uninstall();
    let gone = Instant::now();
    let taken = loop {
        let h = holder();
        if !h.is_empty() && h != owner {
            break h;
        }
        assert!(gone.elapsed() < T, "nobody took the jobs over");
        std::thread::sleep(Duration::from_millis(200));
    };
    println!(
        "two releases on one namespace: the second release owned the jobs {:.1} s after the first was uninstalled",
        gone.elapsed().as_secs_f64()
    );
    assert!(
        taken.starts_with(&format!("{SECOND}-managed-jobs-0")),
        "{taken}"
    );
    for name in ["one", "two"] {
        let s = finished(&client, &w, name).await;
        assert_clean_success(name, &s, &pods, 1);
        assert_eq!(owner_of(&s), taken, "{name}: the new owner wrote its end");
    }
    assert_never(&phases, &["FailedController", "Recovering"]);
    pods_task.abort();
    phases_task.abort();
}

/// A 2-rank job on the real node, through the installed operator: the ranks reach each other
/// by the addresses the job gave them (rank 1 connects to `MASTER_ADDR:MASTER_PORT`, a name of
/// the job's headless Service resolved by the node's cluster DNS; rank 0 hears it), so a
/// training framework's rendezvous works unwrapped. `examples/distributed-training.yaml` as
/// it is.
#[tokio::test]
async fn a_two_rank_job_reaches_its_ranks_by_the_addresses_it_was_given() {
    let (cp, _guard, client) = real_node_or_skip!();
    let _release = Release::install(cp, &[]);
    let ns = support::TestNamespace::new(&client, cp, "real-gang").await;
    let yaml = std::fs::read_to_string(support::root().join("examples/distributed-training.yaml"))
        .unwrap();
    create(&client, &ns.name, &yaml).await;
    let s = finished(&client, &ns.name, "distributed-training").await;
    let pods = Api::<Pod>::namespaced(client.clone(), &ns.name)
        .list(&Default::default())
        .await
        .unwrap()
        .items;
    let mut logs = BTreeMap::new();
    for p in &pods {
        let rank = p
            .labels()
            .get("managedjobs.dev/rank")
            .cloned()
            .unwrap_or_default();
        let (_, log) = kubectl(cp, &["-n", &ns.name, "logs", &p.name_any()]);
        logs.insert(rank, log);
    }
    assert_eq!(
        (s.phase, s.attempt, s.restart_count),
        (Some(JobPhase::Succeeded), 1, 0),
        "{s:#?}\nlogs: {logs:#?}"
    );
    let addrs = logs["0"]
        .lines()
        .find_map(|l| l.split("nodes ").nth(1))
        .unwrap_or_default()
        .to_string();
    assert!(
        addrs.contains("distributed-training-0.") && addrs.contains("distributed-training-1."),
        "{logs:#?}"
    );
    assert!(logs["0"].contains("rank 0 heard: rank 1 of 2"), "{logs:#?}");
    assert!(logs["0"].contains("all 2 ranks reported in"), "{logs:#?}");
    assert!(logs["1"].contains("reported to rank 0"), "{logs:#?}");
    assert!(
        logs["1"].contains(&format!("nodes {addrs}")),
        "both ranks got the same address list: {logs:#?}"
    );
}

/// The visibility API as the chart installs it (issue 33): its certificate and APIService, the
/// operator's TokenReview/SubjectAccessReview permissions, and the roles it aggregates into
/// `view`. A user granted `view` in one namespace sees that namespace's queue (in admission
/// order, with reasons) through the API server with `managed-jobs queue` and `kubectl get
/// --raw`, a finished job's log after its Pod is gone with `managed-jobs logs`, and the
/// dashboard through `kubectl proxy` in Chromium; a user of another namespace sees none of it.
/// The chart as users meet it, with nothing but what it and the built-in roles give them: an
/// `edit` user runs the README's quick start (its user-facing commands: the chart replaces
/// `kubectl apply -f crds/` and `managed-jobs run`, and each example runs as a pod job on the
/// real node); then users with only `edit` or only `view` in one namespace get, through the API
/// server, `managed-jobs queue` (their namespace, `-n`, `-A`), the dashboard and the history
/// (in their namespace and every namespace) and `logs`, each every-namespace form listing only
/// their namespace; a user of another namespace sees none of it, and one with no role at all
/// gets empty answers.
#[tokio::test]
async fn the_charts_views_serve_users_with_only_view_or_edit_and_its_quick_start_works() {
    use support::visibility::{self as vis, PREFIX, User};
    let (cp, _guard, client) = real_node_or_skip!();
    let _release = Release::install(cp, &["caps.runCap=1"]);
    let start = Instant::now();
    loop {
        let (_, available) = kubectl(
            cp,
            &[
                "get",
                "apiservice",
                vis::API_SERVICE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ],
        );
        if available.trim() == "True" {
            break;
        }
        assert!(
            start.elapsed() < T,
            "the chart's APIService never became Available: {available}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Only the chart's roles: the by-hand ones of crds/ (which the other tests' `kubectl apply
    // -f crds/` put there) are removed while this test runs.
    let _by_hand = ByHandRolesAway::remove(cp);
    let ns = support::TestNamespace::new(&client, cp, "real-vis").await;
    let other = support::TestNamespace::new(&client, cp, "real-vis-other").await;
    let editor = User::new(cp, &ns.name, "editor");
    vis::grant(cp, "edit", &ns.name, &editor);
    let viewer = User::new(cp, &ns.name, "viewer");
    vis::grant(cp, "view", &ns.name, &viewer);
    let outsider = User::new(cp, &other.name, "outsider");
    vis::grant(cp, "view", &other.name, &outsider);
    let nobody = User::new(cp, &other.name, "nobody");

    // The README's quick start, as the edit user (their kubeconfig's context is their namespace).
    let shell = vis::Shell::new(&editor.kubeconfig);
    vis::run_quick_start(&shell, &client, &ns.name, vis::Form::Chart).await;

    // One job prints and ends; then one holds the only run slot and two wait.
    let echo = "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: echo\nspec:\n  template:\n    spec:\n      terminationGracePeriodSeconds: 2\n      containers:\n        - name: main\n          image: busybox:1.36\n          command: [\"sh\", \"-c\", \"echo kept after the Pod is gone\"]\n          resources:\n            requests: {cpu: 10m, memory: 16Mi}\n";
    create(&client, &ns.name, echo).await;
    assert_eq!(
        finished(&client, &ns.name, "echo").await.phase,
        Some(JobPhase::Succeeded)
    );
    let (ok, out) = kubectl(
        cp,
        &[
            "-n",
            &ns.name,
            "delete",
            "pods",
            "-l",
            "managedjobs.dev/job-name=echo",
            "--wait=true",
        ],
    );
    assert!(ok, "{out}");
    create(&client, &ns.name, &sleeper("hold", 300)).await;
    running(&client, &ns.name, "hold").await;
    create(&client, &ns.name, &sleeper("later", 5)).await;
    let high =
        sleeper("sooner", 5).replace("spec:\n  template:", "spec:\n  priority: 10\n  template:");
    create(&client, &ns.name, &high).await;

    // Through the API server, as the view user.
    let path = format!("{PREFIX}/namespaces/{}/queue", ns.name);
    let as_viewer = viewer.client().await;
    let start = Instant::now();
    let q = loop {
        match vis::get(&as_viewer, &path).await {
            Ok(q) if q["waitingTotal"] == 2 => break q,
            last => assert!(start.elapsed() < T, "{path} as the view user: {last:?}"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let names: Vec<&str> = q["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sooner", "later"], "{q:#}");
    assert_eq!(q["waiting"][0]["reason"], "RunCapReached", "{q:#}");
    let e = vis::get(&outsider.client().await, &path).await.unwrap_err();
    assert_eq!(vis::code(&e), 403, "the other namespace's user: {e}");
    let cli = |user: &User, args: &[&str]| {
        let out = Command::new(support::binary())
            .args(args)
            .env("KUBECONFIG", &user.kubeconfig)
            .env_remove("MJ_STATE_DIR")
            .output()
            .unwrap();
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    // Namespaces a JobQueue answer (-o json) names anywhere.
    let namespaces_in = |out: &str| -> BTreeSet<String> {
        let q: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
        ["waiting", "live", "inactive", "counts"]
            .iter()
            .flat_map(|k| q[*k].as_array().cloned().unwrap_or_default())
            .map(|j| j["namespace"].as_str().unwrap().to_string())
            .collect()
    };
    let mine = BTreeSet::from([ns.name.clone()]);
    for (who, user) in [("edit", &editor), ("view", &viewer)] {
        let (ok, out) = cli(user, &["queue"]);
        assert!(
            ok && out.contains("sooner") && out.contains("hold"),
            "managed-jobs queue ({who}): {out}"
        );
        let (ok, out) = cli(user, &["queue", "-n", &ns.name]);
        assert!(ok && out.contains("sooner"), "queue -n ({who}): {out}");
        let (ok, out) = cli(user, &["queue", "-A"]);
        assert!(ok && out.contains("sooner"), "queue -A ({who}): {out}");
        let (ok, out) = cli(user, &["queue", "-A", "-o", "json"]);
        assert!(ok, "queue -A -o json ({who}): {out}");
        assert_eq!(
            namespaces_in(&out),
            mine,
            "queue -A ({who}) lists only {}",
            ns.name
        );
        let (ok, out) = cli(user, &["logs", "echo"]);
        assert!(
            ok && out.contains("kept after the Pod is gone"),
            "managed-jobs logs echo ({who}): {out}"
        );
        let api = user.client().await;
        let all = vis::get(&api, &format!("{PREFIX}/queue")).await.unwrap();
        assert_eq!(namespaces_in(&all.to_string()), mine, "{who}: {all:#}");
        for path in [
            format!("{PREFIX}/history"),
            format!("{PREFIX}/namespaces/{}/history", ns.name),
        ] {
            let h = vis::get(&api, &path)
                .await
                .unwrap_or_else(|e| panic!("{path} ({who}): {e}"));
            assert!(h["samples"].is_array(), "{path} ({who}): {h:#}");
        }
        for path in [
            format!("{PREFIX}/dashboard"),
            format!("{PREFIX}/namespaces/{}/dashboard", ns.name),
        ] {
            let page = vis::get_text(&api, &path)
                .await
                .unwrap_or_else(|e| panic!("{path} ({who}): {e}"));
            assert!(page.contains("<html"), "{path} ({who})");
        }
    }
    let (ok, out) = cli(&outsider, &["queue", "-n", &ns.name]);
    assert!(!ok && !out.contains("sooner"), "the outsider's CLI: {out}");
    let (ok, out) = cli(&outsider, &["queue", "-A", "-o", "json"]);
    assert!(ok, "the outsider's every-namespace queue: {out}");
    assert!(namespaces_in(&out).is_empty(), "the outsider's -A: {out}");
    // A user with no role anywhere: empty answers, not 403, and nothing of anyone's.
    let as_nobody = nobody.client().await;
    let q = vis::get(&as_nobody, &format!("{PREFIX}/queue"))
        .await
        .unwrap();
    assert!(
        namespaces_in(&q.to_string()).is_empty() && q.get("caps").is_none(),
        "{q:#}"
    );
    let h = vis::get(&as_nobody, &format!("{PREFIX}/history"))
        .await
        .unwrap();
    assert_eq!(h["samples"], json!([]), "{h:#}");
    let (ok, out) = cli(&nobody, &["queue", "-A"]);
    assert!(
        ok && out.contains("no job waits or runs") && !out.contains("sooner"),
        "{out}"
    );
    // view reads, never writes.
    let (ok, out) = support::kubectl(
        &viewer.control_plane(),
        &["delete", "mj", "later", "--wait=false"],
    );
    assert!(
        !ok && out.contains("Forbidden"),
        "view deletes nothing: {out}"
    );

    // The dashboard, through kubectl proxy, in Chromium: the view user's namespace, and the
    // edit user's every-namespace page.
    let Some(browser) = support::browser::Browser::launch(1400, 1000) else {
        assert!(
            std::env::var("CI").unwrap_or_default().is_empty(),
            "CI is set but Chromium is not installed"
        );
        support::record_skip("real-node dashboard: Chromium is not installed");
        return;
    };
    let rows_js = "[...document.querySelectorAll('#waiting tbody tr')].map(r => r.dataset.job)";
    let waiting = json!([format!("{}/sooner", ns.name), format!("{}/later", ns.name)]);
    let proxy = vis::Proxy::start(&viewer.kubeconfig);
    let page = browser.open(&proxy.url(&format!("{PREFIX}/namespaces/{}/dashboard", ns.name)));
    page.wait_for("document.body.dataset.ready === 'true'", T);
    assert_eq!(page.eval(rows_js), waiting, "the view user's dashboard");
    let proxy = vis::Proxy::start(&editor.kubeconfig);
    page.navigate(&proxy.url(&format!("{PREFIX}/dashboard")));
    page.wait_for("document.body.dataset.ready === 'true'", T);
    assert_eq!(
        page.eval(rows_js),
        waiting,
        "the edit user's every-namespace dashboard"
    );
}

/// The users' roles of `crds/` (`kubectl apply -f crds/`, the by-hand install), removed so that
/// only the chart's grant anything; applied again when dropped.
struct ByHandRolesAway(&'static support::ControlPlane);

/// The files of `crds/` that hold users' roles.
const USER_ROLE_FILES: [&str; 2] = [
    "managedjobs.dev_user-roles.yaml",
    "managedjobs.dev_visibility-access.yaml",
];

impl ByHandRolesAway {
    fn remove(cp: &'static support::ControlPlane) -> ByHandRolesAway {
        for file in USER_ROLE_FILES {
            let path = support::root().join("crds").join(file);
            let (ok, out) = kubectl(
                cp,
                &[
                    "delete",
                    "-f",
                    path.to_str().unwrap(),
                    "--ignore-not-found",
                    "--wait=true",
                ],
            );
            assert!(ok, "removing the by-hand roles of {file}: {out}");
        }
        ByHandRolesAway(cp)
    }
}

impl Drop for ByHandRolesAway {
    fn drop(&mut self) {
        for file in USER_ROLE_FILES {
            let path = support::root().join("crds").join(file);
            kubectl(self.0, &["apply", "-f", path.to_str().unwrap()]);
        }
    }
}
