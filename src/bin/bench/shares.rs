//! `--scenario shares` (issue 44): GPU shares side by side with Kueue v0.17 on the load.
//!
//! On the dev control plane, 4 kwok nodes of 8 `nvidia.com/gpu` labelled `pool: gpu` (32 GPUs,
//! nothing else fits a GPU Pod); team-a applies 8 jobs of one Pod with 8 GPUs, team-b 5 s later
//! 32 jobs of 1 GPU, every Pod running `--hold-seconds` (default 120; kwok completes it,
//! `hack/stages`). Each row is one system, run alone, one after another (`--shares-systems`):
//! - `ours`: `examples/gpu-teams.yaml` as shipped (its namespaces, pool and queues: 16 GPUs each
//!   in one cohort, `reclaimWithinCohort: Any`, `minRunSeconds: 5`) and the release operator at
//!   its defaults; `ours-nopreempt` the same queues without `preemption`;
//! - `kueue`: Kueue v0.17 (`hack/kueue.sh`: built from its Go module, its internal certificate
//!   management off, a self-signed certificate, webhooks unused) with a ResourceFlavor of the
//!   same nodes, ClusterQueues team-a and team-b of 16 GPUs each in one cohort, a LocalQueue in
//!   each namespace, the jobs batch/v1 Jobs created suspended with the queue label;
//!   `kueue-preempt` the same with `reclaimWithinCohort: Any`.
//!
//! Every second the Pods of both namespaces are listed. Reported per row: the GPUs each team
//! holds (Pods bound to a node, not finished, not being deleted) over time; team-b's first GPU
//! and its share (16 GPUs) after it applied; in how many samples, while both teams had jobs
//! waiting, each held 16 ± 1; the work lost to preemption (GPU-seconds a Pod ran before it went
//! away short of its `--hold-seconds`); Pods kube-scheduler found no room for
//! (`PodScheduled=False`, `Unschedulable`) and for how long; when all 40 jobs were done.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::discovery::ApiResource;
use managed_jobs::lifecycle::nodes::NodeSeen;
use serde_json::json;

use super::{Args, DevControlPlane, root};

const TEAMS: [&str; 2] = ["team-a", "team-b"];
/// The GPUs each team is promised (the example's `nominalQuota`).
const SHARE: i64 = 16;
const NODES: usize = 4;
/// team-a's jobs (8 GPUs each), then team-b's (1 GPU each), [`B_AFTER`] later.
const JOBS_A: usize = 8;
const JOBS_B: usize = 32;
const B_AFTER: Duration = Duration::from_secs(5);
const KUEUE_HEALTH: u16 = 18081;

/// One system's run.
struct Row {
    system: String,
    /// (seconds since team-a applied, GPUs of team-a, of team-b, jobs waiting of a, of b).
    samples: Vec<(f64, i64, i64, usize, usize)>,
    lost_gpu_seconds: f64,
    lost_pods: usize,
    unschedulable_pods: usize,
    unschedulable_pod_seconds: f64,
    done_at: Option<f64>,
}

impl Row {
    /// Seconds after team-b applied when it first held `gpus` GPUs.
    fn b_reached(&self, gpus: i64) -> Option<f64> {
        let b = B_AFTER.as_secs_f64();
        self.samples
            .iter()
            .find(|s| s.0 >= b && s.2 >= gpus)
            .map(|s| s.0 - b)
    }

    /// Samples since team-b applied while both teams had jobs waiting, and of them those where
    /// each team held its share ± 1.
    fn exact(&self) -> (usize, usize) {
        let both: Vec<_> = self
            .samples
            .iter()
            .filter(|s| s.0 >= B_AFTER.as_secs_f64() && s.3 > 0 && s.4 > 0)
            .collect();
        let exact = both
            .iter()
            .filter(|s| (s.1 - SHARE).abs() <= 1 && (s.2 - SHARE).abs() <= 1)
            .count();
        (exact, both.len())
    }

    /// The shares every 10 s, "a:b".
    fn timeline(&self) -> String {
        let mut next = 0.0;
        let mut out = Vec::new();
        for s in &self.samples {
            if s.0 >= next {
                out.push(format!("{}:{}", s.1, s.2));
                next += 10.0;
            }
        }
        out.join(" ")
    }

    fn json(&self) -> serde_json::Value {
        let (exact, both) = self.exact();
        json!({
            "system": self.system,
            "b_first_gpu_s": self.b_reached(1),
            "b_share_s": self.b_reached(SHARE),
            "samples_both_waiting": both,
            "samples_exact": exact,
            "lost_gpu_seconds": self.lost_gpu_seconds,
            "lost_pods": self.lost_pods,
            "unschedulable_pods": self.unschedulable_pods,
            "unschedulable_pod_seconds": self.unschedulable_pod_seconds,
            "done_at_s": self.done_at,
            "timeline_every_10s": self.timeline(),
            "samples": self.samples,
        })
    }
}

/// Runs the scenario: every system of `--shares-systems` in turn, then prints a table and JSON.
pub async fn scenario(args: &Args) -> anyhow::Result<()> {
    let cp = DevControlPlane::up()?;
    // SAFETY: set before any client reads it, before any other thread runs.
    unsafe { std::env::set_var("KUBECONFIG", &cp.kubeconfig) };
    let client = kube::Client::try_default().await?;
    let hold = args.hold_seconds.unwrap_or(120);
    kubectl_ok(
        &cp,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            root().join("crds").to_str().unwrap(),
        ],
    )?;
    let nodes = gpu_nodes(&client).await?;
    let mut rows = Vec::new();
    for system in &args.shares_systems {
        eprintln!("[shares] {system}");
        let row = match system.as_str() {
            "ours" => ours(&cp, &client, hold, true).await,
            "ours-nopreempt" => ours(&cp, &client, hold, false).await,
            "kueue" => kueue(&cp, &client, hold, false).await,
            "kueue-preempt" => kueue(&cp, &client, hold, true).await,
            other => Err(anyhow::anyhow!(
                "unknown system {other} (ours, ours-nopreempt, kueue, kueue-preempt)"
            )),
        };
        match row {
            Ok(row) => {
                print_row(&row);
                rows.push(row);
            }
            Err(e) => {
                delete_nodes(&client, &nodes).await;
                return Err(e.context(format!("the {system} row")));
            }
        }
    }
    delete_nodes(&client, &nodes).await;
    println!(
        "\n| system | team-b's first GPU | team-b's 16 | samples at 16±1 : 16±1 while both wait | work lost (GPU-s, Pods) | Pods unschedulable (Pods, Pod-s) | all done at |\n|---|---|---|---|---|---|---|"
    );
    let secs = |s: Option<f64>| s.map_or("never".to_string(), |s| format!("{s:.1} s"));
    for r in &rows {
        let (exact, both) = r.exact();
        println!(
            "| {} | {} | {} | {exact} of {both} | {:.0}, {} | {}, {:.0} | {} |",
            r.system,
            secs(r.b_reached(1)),
            secs(r.b_reached(SHARE)),
            r.lost_gpu_seconds,
            r.lost_pods,
            r.unschedulable_pods,
            r.unschedulable_pod_seconds,
            secs(r.done_at)
        );
    }
    let report = json!({
        "scenario": "shares", "hold_seconds": hold, "commit": super::git_commit(),
        "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
    });
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

fn print_row(r: &Row) {
    let (exact, both) = r.exact();
    eprintln!(
        "[shares] {}: team-b's first GPU {:?} s, its 16 {:?} s after it applied; 16±1 : 16±1 in {exact} of {both} samples while both waited; lost {:.0} GPU-s ({} Pods); unschedulable {} Pods; done at {:?} s\n[shares] a:b every 10 s: {}",
        r.system,
        r.b_reached(1),
        r.b_reached(SHARE),
        r.lost_gpu_seconds,
        r.lost_pods,
        r.unschedulable_pods,
        r.done_at,
        r.timeline()
    );
}

fn kubectl_ok(cp: &DevControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let out = cp.kubectl(args)?;
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Applies `objects` (JSON values) with `kubectl apply`, as a user would.
fn apply(cp: &DevControlPlane, objects: &[serde_json::Value]) -> anyhow::Result<()> {
    let file = tempfile::NamedTempFile::new()?;
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": objects });
    std::fs::write(file.path(), serde_json::to_vec(&list)?)?;
    kubectl_ok(cp, &["apply", "-f", file.path().to_str().unwrap()])?;
    Ok(())
}

/// The [`NODES`] kwok GPU nodes `bench-gpu-<i>` (8 GPUs, 32 CPUs, `pool: gpu`), Ready.
async fn gpu_nodes(client: &kube::Client) -> anyhow::Result<Vec<String>> {
    let api: Api<Node> = Api::all(client.clone());
    let alloc = json!({"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8"});
    let mut names = Vec::new();
    for i in 0..NODES {
        let name = format!("bench-gpu-{i}");
        let _ = api.delete(&name, &DeleteParams::default()).await;
        while api.get_opt(&name).await?.is_some() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"type": "kwok", "pool": "gpu", "kubernetes.io/hostname": name}},
            "status": {"allocatable": alloc, "capacity": alloc},
        }))?;
        api.create(&PostParams::default(), &node).await?;
        names.push(name);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    for name in &names {
        loop {
            let node = api.get(name).await?;
            let ready = NodeSeen::of(&node, 0) == NodeSeen::Ready;
            let tainted = node
                .spec
                .and_then(|s| s.taints)
                .is_some_and(|t| !t.is_empty());
            if ready && !tainted {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "node {name} not Ready in 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(names)
}

async fn delete_nodes(client: &kube::Client, names: &[String]) {
    let api: Api<Node> = Api::all(client.clone());
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Deletes the teams' namespaces and waits until they are gone (at most 5 minutes).
fn delete_namespaces(cp: &DevControlPlane) {
    let _ = cp.kubectl(&[
        "delete",
        "namespace",
        "team-a",
        "team-b",
        "--ignore-not-found",
    ]);
    let _ = cp.kubectl(&[
        "wait",
        "--for=delete",
        "namespace/team-a",
        "namespace/team-b",
        "--timeout=300s",
    ]);
}

/// The GPUs of `pod`'s containers (their limits, which an extended resource's request equals).
fn gpus(pod: &Pod) -> i64 {
    pod.spec
        .iter()
        .flat_map(|s| &s.containers)
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get("nvidia.com/gpu"))
        .filter_map(|q| q.0.parse::<i64>().ok())
        .sum()
}

/// Drives the load and samples it: `create(team, i, gpus)` creates one job; `unfinished(team)`
/// counts a team's jobs not done.
async fn drive<C, U>(
    client: &kube::Client,
    system: &str,
    hold: u64,
    create: C,
    unfinished: U,
) -> anyhow::Result<Row>
where
    C: AsyncFn(&str, usize, i64) -> anyhow::Result<()>,
    U: AsyncFn(&str) -> anyhow::Result<usize>,
{
    let start = Instant::now();
    for i in 0..JOBS_A {
        create("team-a", i, 8).await?;
    }
    let mut b_created = false;
    let mut row = Row {
        system: system.to_string(),
        samples: Vec::new(),
        lost_gpu_seconds: 0.0,
        lost_pods: 0,
        unschedulable_pods: 0,
        unschedulable_pod_seconds: 0.0,
        done_at: None,
    };
    // Per Pod uid: (first seen bound at, GPUs, ended).
    let mut bound: HashMap<String, (f64, i64, bool)> = HashMap::new();
    let mut unschedulable: BTreeMap<String, ()> = BTreeMap::new();
    let limit = Duration::from_secs(4 * hold + 300);
    let mut last = 0.0;
    loop {
        if !b_created && start.elapsed() >= B_AFTER {
            for i in 0..JOBS_B {
                create("team-b", i, 1).await?;
            }
            b_created = true;
        }
        let t = start.elapsed().as_secs_f64();
        let dt = t - last;
        last = t;
        let mut held = [0i64; 2];
        let mut running = [0usize; 2];
        let mut seen = std::collections::HashSet::new();
        for (k, team) in TEAMS.iter().enumerate() {
            let pods: Api<Pod> = Api::namespaced(client.clone(), team);
            for pod in pods.list(&ListParams::default()).await?.items {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
                let finished = matches!(phase.as_deref(), Some("Succeeded" | "Failed"));
                let deleting = pod.metadata.deletion_timestamp.is_some();
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let no_room = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    });
                if no_room && node.is_none() {
                    unschedulable.insert(uid.clone(), ());
                    row.unschedulable_pod_seconds += dt;
                }
                if node.is_some() && !finished && !deleting {
                    held[k] += gpus(&pod);
                    running[k] += 1;
                    seen.insert(uid.clone());
                    bound.entry(uid).or_insert((t, gpus(&pod), false));
                } else if let Some(entry) = bound.get_mut(&uid)
                    && !entry.2
                {
                    entry.2 = true;
                    if !(finished && phase.as_deref() == Some("Succeeded")) {
                        lost(&mut row, entry, t, hold);
                    }
                }
            }
        }
        // A Pod gone between two samples: lost if it had not run its whole hold.
        let gone: Vec<String> = bound
            .iter()
            .filter(|(uid, e)| !e.2 && !seen.contains(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            let entry = bound.get_mut(&uid).expect("listed");
            entry.2 = true;
            lost(&mut row, entry, t, hold);
        }
        let mut waiting = [0usize; 2];
        let mut left = 0;
        for (k, team) in TEAMS.iter().enumerate() {
            let n = unfinished(team).await?;
            left += n;
            waiting[k] = n.saturating_sub(running[k]);
        }
        row.samples
            .push((t, held[0], held[1], waiting[0], waiting[1]));
        if b_created && left == 0 {
            row.done_at = Some(t);
            break;
        }
        if start.elapsed() > limit {
            eprintln!("[shares] {system}: not done in {} s", limit.as_secs());
            break;
        }
        tokio::time::sleep(
            Duration::from_secs(1)
                .saturating_sub(Duration::from_secs_f64(start.elapsed().as_secs_f64() - t)),
        )
        .await;
    }
    row.unschedulable_pods = unschedulable.len();
    Ok(row)
}

/// A Pod seen bound from `entry.0` ended at `t`: lost when it ran short of `hold` (2 s of
/// sampling slack), counted in GPU-seconds.
fn lost(row: &mut Row, entry: &(f64, i64, bool), t: f64, hold: u64) {
    let ran = t - entry.0;
    if ran + 2.0 < hold as f64 {
        row.lost_gpu_seconds += ran * entry.1 as f64;
        row.lost_pods += 1;
    }
}

/// The container of every job: a Pod of `gpus` GPUs that kwok completes after `hold`.
fn pod_template(gpus: i64, hold: u64) -> serde_json::Value {
    json!({
        "metadata": {"annotations": {"managedjobs.dev/complete-after": format!("{hold}s")}},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "train", "image": "busybox",
            "command": ["sleep", hold.to_string()],
            "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
    })
}

/// The example's namespaces, pool and queues (its sample jobs left out: the load is the
/// bench's); without `preemption` when `reclaim` is false.
fn example_objects(reclaim: bool) -> anyhow::Result<Vec<serde_json::Value>> {
    let path = root().join("examples/gpu-teams.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let mut out = Vec::new();
    for doc in serde_norway::Deserializer::from_str(&text) {
        let mut v: serde_json::Value = serde::Deserialize::deserialize(doc)?;
        if v["kind"] == "ManagedJob" {
            continue;
        }
        if !reclaim && let Some(spec) = v["spec"].as_object_mut() {
            spec.remove("preemption");
        }
        out.push(v);
    }
    Ok(out)
}

async fn ours(
    cp: &DevControlPlane,
    client: &kube::Client,
    hold: u64,
    reclaim: bool,
) -> anyhow::Result<Row> {
    use managed_jobs::api::{JobPhase, ManagedJob};
    delete_namespaces(cp);
    let binary = std::env::current_exe()?.with_file_name("managed-jobs");
    anyhow::ensure!(
        binary.exists(),
        "build the operator first: cargo build --release"
    );
    apply(cp, &example_objects(reclaim)?)?;
    let state = tempfile::tempdir()?;
    let operator = Command::new(&binary)
        .arg("run")
        .arg("--state-dir")
        .arg(state.path())
        .args(["--executors", "pod"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(state.path().join("operator.log"))?)
        .spawn()
        .context("starting the operator")?;
    let create = async |team: &str, i: usize, gpus: i64| {
        let job: ManagedJob = serde_json::from_value(json!({
            "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
            "metadata": {"name": format!("j{i:02}"), "namespace": team},
            "spec": {"queue": team, "template": pod_template(gpus, hold)},
        }))?;
        Api::<ManagedJob>::namespaced(client.clone(), team)
            .create(&PostParams::default(), &job)
            .await?;
        anyhow::Ok(())
    };
    let unfinished = async |team: &str| {
        let list = Api::<ManagedJob>::namespaced(client.clone(), team)
            .list(&ListParams::default())
            .await?;
        anyhow::Ok(
            list.items
                .iter()
                .filter(|j| {
                    !j.status
                        .as_ref()
                        .and_then(|s| s.phase)
                        .is_some_and(JobPhase::is_terminal)
                })
                .count(),
        )
    };
    let system = if reclaim { "ours" } else { "ours-nopreempt" };
    let row = drive(client, system, hold, create, unfinished).await;
    // The namespaces go while the operator runs (it removes its finalizers).
    clean_up(
        cp,
        ("managedjobqueue", "managedjobpool"),
        operator,
        &state.path().join("operator.log"),
        row.is_err(),
    );
    row
}

/// After a row: deletes the teams' namespaces, then their queues and the pool (`kinds`: the
/// queue's kind and the pool's), while `manager` still runs; stops it; prints its log's tail
/// when the row failed.
fn clean_up(
    cp: &DevControlPlane,
    kinds: (&str, &str),
    mut manager: std::process::Child,
    log: &Path,
    failed: bool,
) {
    delete_namespaces(cp);
    let _ = cp.kubectl(&["delete", kinds.0, "team-a", "team-b", "--ignore-not-found"]);
    let _ = cp.kubectl(&["delete", kinds.1, "gpu", "--ignore-not-found"]);
    let _ = manager.kill();
    let _ = manager.wait();
    if failed {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        eprintln!("[shares] {} (tail):\n{}", log.display(), tail(&text, 40));
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A self-signed certificate for 127.0.0.1 in `dir` (`tls.crt`, `tls.key`), for Kueue's webhook
/// server, which must start though nothing calls it.
fn self_signed(dir: &Path) -> anyhow::Result<()> {
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(dir.join("tls.key"))
        .arg("-out")
        .arg(dir.join("tls.crt"))
        .output()
        .context("running openssl")?;
    anyhow::ensure!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

async fn kueue(
    cp: &DevControlPlane,
    client: &kube::Client,
    hold: u64,
    reclaim: bool,
) -> anyhow::Result<Row> {
    delete_namespaces(cp);
    let script = root().join("hack/kueue.sh");
    let run = |what: &str| -> anyhow::Result<String> {
        let out = Command::new(&script)
            .arg(what)
            .stderr(Stdio::inherit())
            .output()?;
        anyhow::ensure!(out.status.success(), "hack/kueue.sh {what} failed");
        Ok(String::from_utf8(out.stdout)?.trim().to_string())
    };
    let binary = run("build")?;
    let crds = run("crds")?;
    kubectl_ok(
        cp,
        &["apply", "--server-side", "--force-conflicts", "-f", &crds],
    )?;
    // Kueue exits at start when a kind of its CRDs is not served yet.
    kubectl_ok(
        cp,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &crds,
        ],
    )?;
    let _ = cp.kubectl(&["create", "namespace", "kueue-system"]);
    let dir = tempfile::tempdir()?;
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs)?;
    self_signed(&certs)?;
    // Kueue v0.17 with its certificate management off reads the metrics server's certificate
    // from this fixed path (cmd/kueue/main.go) even when metrics are off (`bindAddress: "0"`).
    let metrics_certs = Path::new("/etc/kueue/metrics/certs");
    std::fs::create_dir_all(metrics_certs)
        .with_context(|| format!("creating {} (Kueue reads it)", metrics_certs.display()))?;
    self_signed(metrics_certs)?;
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:{KUEUE_HEALTH}
metrics:
  bindAddress: \"0\"
webhook:
  port: 19443
  host: 127.0.0.1
  certDir: {}
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
integrations:
  frameworks: [\"batch/job\"]
",
            certs.display()
        ),
    )?;
    let mut manager = Command::new(&binary)
        .arg("--config")
        .arg(&config)
        // Its on-demand visibility server reads a certificate from a fixed `/visibility`; the
        // bench reads Pods, not Kueue's views.
        .args(["--feature-gates", "VisibilityOnDemand=false"])
        .env("KUBECONFIG", &cp.kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("kueue.log"))?)
        .spawn()
        .context("starting kueue")?;
    let result = async {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let ok = Command::new("curl")
                .args(["-sf", &format!("http://127.0.0.1:{KUEUE_HEALTH}/readyz")])
                .output()
                .is_ok_and(|o| o.status.success());
            if ok {
                break;
            }
            if let Some(status) = manager.try_wait()? {
                bail!("kueue exited: {status}");
            }
            anyhow::ensure!(Instant::now() < deadline, "kueue not ready in 120 s");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let mut objects = vec![json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": "gpu"}, "spec": {"nodeLabels": {"pool": "gpu"}},
        })];
        for team in TEAMS {
            objects.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team}}));
            let mut spec = json!({
                "cohortName": "gpu-teams",
                "namespaceSelector": {},
                "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                    {"name": "gpu", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": SHARE}]}]}],
            });
            if reclaim {
                spec["preemption"] =
                    json!({"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"});
            }
            objects.push(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": team}, "spec": spec,
            }));
            objects.push(json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
                "metadata": {"name": team, "namespace": team}, "spec": {"clusterQueue": team},
            }));
        }
        apply(cp, &objects)?;
        let jobs = ApiResource {
            group: "batch".into(),
            version: "v1".into(),
            api_version: "batch/v1".into(),
            kind: "Job".into(),
            plural: "jobs".into(),
        };
        let create = async |team: &str, i: usize, gpus: i64| {
            let job: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": format!("j{i:02}"), "namespace": team,
                    "labels": {"kueue.x-k8s.io/queue-name": team}},
                "spec": {"suspend": true, "backoffLimit": 0, "template": pod_template(gpus, hold)},
            }))?;
            Api::<DynamicObject>::namespaced_with(client.clone(), team, &jobs)
                .create(&PostParams::default(), &job)
                .await?;
            anyhow::Ok(())
        };
        let unfinished = async |team: &str| {
            let list = Api::<DynamicObject>::namespaced_with(client.clone(), team, &jobs)
                .list(&ListParams::default())
                .await?;
            anyhow::Ok(
                list.items
                    .iter()
                    .filter(|j| {
                        !j.data["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| {
                                (c["type"] == "Complete" || c["type"] == "Failed")
                                    && c["status"] == "True"
                            })
                    })
                    .count(),
            )
        };
        let system = if reclaim { "kueue-preempt" } else { "kueue" };
        drive(client, system, hold, create, unfinished).await
    }
    .await;
    clean_up(
        cp,
        ("clusterqueue", "resourceflavor"),
        manager,
        &dir.path().join("kueue.log"),
        result.is_err(),
    );
    result
}
