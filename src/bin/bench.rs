//! Scale benchmark: `cargo run --release --bin bench -- --scenario local --jobs 1000`.
//!
//! Starts (or reuses) the dev control plane, runs the release operator binary against it, creates
//! N ManagedJobs as fast as the API accepts them, watches them to the end, and prints a table and
//! JSON (BENCHMARKS.md explains every figure):
//! - end-to-end jobs/s (first create to last terminal status seen through a watch), time to admit
//!   all (last Submitted status);
//! - peak alive / launching seen from the API versus the caps;
//! - status latency: store transition time to the watch seeing it (p50/p99);
//! - API requests per job by verb, from the API server's own `apiserver_request_total`;
//! - operator RSS and CPU seconds; job controller memory (RSS, USS, PSS from smaps_rollup,
//!   median and p99, sampled while jobs run);
//! - a scheduling pass over 10,000 waiting jobs (a separate store; median of 200 passes).
//!
//! Scenarios: `local` (trivial `true` workloads), `pod` (Pods on kwok nodes, 10 s runtime),
//! `priorities` (mixed priorities under a launch cap of 1: admission order is checked),
//! `pipeline` (3-task pipelines of `true`: status writes per task against the transitions a
//! user can see), `density` (N jobs of `sleep --hold-seconds` alive at once: time to admit them
//! all, operator memory and CPU, job controllers' USS and the PSS sum at the peak, the pass time
//! with them alive), `schedpass` (only the scheduling-pass measurement, then a change of every
//! waiting job's reason: the pass that tells them all and the statuses it leaves to write), `preemption` (a late
//! team's time to its share, with and without preemption) and `visibility` (issue 33: the
//! visibility API's latency for a namespace of 10,000 waiting jobs beside 1,000 alive, the
//! dashboard's rendering in Chromium and admissions with and without API clients; its own
//! module doc, `src/bin/bench/visibility.rs`, says how each is measured) and `versus` (issue 34:
//! `--jobs` pod jobs of `--pod-seconds` as batch/v1 Jobs, as ManagedJobs no operator watches and
//! as ManagedJobs with the operator at its defaults, each applied with `kubectl apply`: apply
//! time, time to all done, CPU per job of every process, API requests per job;
//! `src/bin/bench/versus.rs`) and `reasons` (issue 43: how stale a waiting job's reason gets
//! in the store and in its status at `--jobs` waiting jobs, and the status writes it costs;
//! `src/bin/bench/reasons.rs`) and `shares` (issue 44: GPU shares of two teams side by side with
//! Kueue v0.17 on the load; `src/bin/bench/shares.rs`) and `poolpass` (issue 44: the
//! scheduling pass in resources over 1,000 nodes, 100 queues and `--jobs` waiting jobs, in
//! process; `src/bin/bench/poolpass.rs`).
//!
//! Queues for teams: `--queues N` (N >= 1) creates N ManagedJobQueues of weight 1 (deleted at the
//! end) and puts the i-th job in the (i mod N)-th; with `--scenario schedpass` it spreads the
//! 10,000 waiting jobs over N queues (each job's namespace admitted by its queue's selector).
//! Compare `--queues 10` with `--queues 1`: what fairness costs.
//!
//! Every run fails on a watch error or a job the watch never saw finish. Latency is reported for
//! every status a user sees (Submitted, Starting, Running, terminal: the store's transition to
//! the watch seeing it), and from the create call to the first status; `--rate N` creates at a
//! steady N per second instead of as fast as the API takes them; "drain lag" is the last create
//! to the last terminal status.

// The report is one json! literal with many fields.
#![recursion_limit = "256"]

// The tests' Chromium driver (DevTools over a pipe), for the dashboard of `--scenario visibility`.
#[path = "../../tests/support/browser.rs"]
mod browser;
#[path = "bench/poolpass.rs"]
mod poolpass;
#[path = "bench/reasons.rs"]
mod reasons;
#[path = "bench/shares.rs"]
mod shares;
#[path = "bench/versus.rs"]
mod versus;
#[path = "bench/visibility.rs"]
mod visibility;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use managed_jobs::api::{JobPhase, ManagedJob, ScheduleState};
use managed_jobs::capacity::Caps;
use managed_jobs::lifecycle;
use managed_jobs::state_dir::StateDir;
use managed_jobs::store::Store;
use serde_json::json;

#[derive(Debug, Parser)]
struct Args {
    /// local, pod, priorities, pipeline, density, schedpass, poolpass, preemption, visibility,
    /// versus, reasons or shares.
    #[arg(long, default_value = "local")]
    scenario: String,
    /// Number of ManagedJobs.
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    /// Launch cap given to the operator (default: derived).
    #[arg(long)]
    launch_cap: Option<usize>,
    /// Run cap given to the operator (default: derived).
    #[arg(long)]
    run_cap: Option<usize>,
    /// API QPS of the operator.
    #[arg(long, default_value_t = 1000)]
    api_qps: u32,
    /// API burst of the operator.
    #[arg(long, default_value_t = 2000)]
    api_burst: u32,
    /// Extra flag for the operator (repeatable), e.g. `--operator-arg=--events=false`.
    #[arg(long, allow_hyphen_values = true)]
    operator_arg: Vec<String>,
    /// Write the JSON report here too.
    #[arg(long)]
    json: Option<PathBuf>,
    /// `versus`: which rows to run, of `jobs`, `unwatched` and `managed` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "jobs,unwatched,managed")]
    versus_systems: Vec<String>,
    /// `versus`: one more ManagedJob row, `NAME=ARGS` (ARGS: operator flags separated by spaces,
    /// added to `--operator-arg`), run after the `managed` row in the same run (repeatable): a
    /// change measured before and after on one machine in one run.
    #[arg(long)]
    variant: Vec<String>,
    /// `versus`: measure the ManagedJob rows over the apply only (not waiting for the jobs).
    #[arg(long)]
    apply_only: bool,
    /// `shares`: which rows to run, of `ours`, `ours-nopreempt`, `kueue` and `kueue-preempt`
    /// (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ours,kueue,ours-nopreempt,kueue-preempt"
    )]
    shares_systems: Vec<String>,
    /// ManagedJobQueues to spread the jobs over (0: none, one pool as before queues existed).
    #[arg(long, default_value_t = 0)]
    queues: usize,
    /// Finished jobs beside the 10,000 waiting ones in the `schedpass` scenario.
    #[arg(long, default_value_t = 10_000)]
    finished: usize,
    /// Creates per second (0: as fast as the API takes them, 32 in flight).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// How long each `density` job sleeps, seconds (long enough for all to be alive at once;
    /// default 240); in `visibility`, each job (default 7200: none ends during the run); in
    /// `shares`, each GPU Pod (default 120).
    #[arg(long)]
    hold_seconds: Option<u64>,
    /// How long each `pod` scenario Pod runs, seconds (kwok completes it then). Pods longer than
    /// the pod GC's 40 s quarantine are lost when their node stays away longer than that.
    #[arg(long, default_value_t = 10)]
    pod_seconds: u64,
    /// Node churn: every this many seconds one kwok node (in turn) is deleted, and put back
    /// `--churn-outage-seconds` later. 0: no churn.
    #[arg(long, default_value_t = 0)]
    churn_seconds: u64,
    /// How long a churned node stays away. The pod GC deletes the Pods of a node that is gone
    /// after a 40 s quarantine, so a shorter outage loses nothing; a longer one loses its Pods,
    /// whose jobs are recovered.
    #[arg(long, default_value_t = 60)]
    churn_outage_seconds: u64,
    /// How many nodes to churn in all (0: one every `--churn-seconds` until the run ends).
    #[arg(long, default_value_t = 0)]
    churn_count: usize,
    /// Nodes of each `pod` scenario job (a multi-node job, `spec.nodes`): the report adds the
    /// time from each job's admission to all its members running, and API writes per member Pod.
    #[arg(long)]
    nodes: Option<i32>,
    /// `visibility`: jobs waiting beside the `--run-cap` (default 1,000) alive ones.
    #[arg(long, default_value_t = 10_000)]
    waiting: usize,
    /// `visibility`: concurrent API clients (each back to back).
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// `visibility`: requests per latency measurement.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// `visibility`: admission rounds with, and as many without, API clients.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// `visibility`: jobs released (cancelled) per admission round, as many admitted.
    #[arg(long, default_value_t = 100)]
    release: usize,
    /// `visibility`: dashboard loads measured in Chromium.
    #[arg(long, default_value_t = 5)]
    page_loads: usize,
    /// `visibility`: save a 1400x1000 screenshot of the dashboard here (a PNG).
    #[arg(long)]
    screenshot: Option<PathBuf>,
    /// `visibility`: the clients of the loaded admission rounds run in this process at its
    /// priority, rather than in a process of their own at the lowest priority (standing for
    /// users on other machines).
    #[arg(long)]
    load_in_process: bool,
    /// Internal (`--scenario load-client`): the visibility API's port.
    #[arg(long, hide = true)]
    load_port: Option<u16>,
    /// Internal (`--scenario load-client`): the path the clients poll.
    #[arg(long, hide = true)]
    load_path: Option<String>,
}

/// Deletes the `k`-th node (by name order) and creates it again `outage` later, as a node that
/// leaves the cluster and comes back; returns the node's name.
async fn churn_one(client: &kube::Client, k: usize, outage: Duration) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut list = nodes.list(&Default::default()).await?.items;
    list.sort_by_key(|n| n.metadata.name.clone());
    anyhow::ensure!(!list.is_empty(), "no node to churn");
    let mut node = list[k % list.len()].clone();
    let name = node.metadata.name.clone().unwrap_or_default();
    nodes.delete(&name, &Default::default()).await?;
    tokio::time::sleep(outage).await;
    node.metadata.resource_version = None;
    node.metadata.uid = None;
    node.metadata.creation_timestamp = None;
    node.metadata.managed_fields = None;
    // Its status goes back with it (capacity, allocatable): a node created without them would
    // take Pods of any size.
    nodes.create(&PostParams::default(), &node).await?;
    Ok(name)
}

/// The dev control plane, started or reused by `hack/controlplane.sh up`.
struct DevControlPlane {
    script: PathBuf,
    /// Its admin kubeconfig's path.
    kubeconfig: String,
}

impl DevControlPlane {
    /// Starts (or reuses) it. Errors: `up` failed.
    fn up() -> anyhow::Result<DevControlPlane> {
        let script = root().join("hack/controlplane.sh");
        let out = Command::new(&script)
            .arg("up")
            .stderr(Stdio::inherit())
            .output()?;
        anyhow::ensure!(out.status.success(), "hack/controlplane.sh up failed");
        let kubeconfig = String::from_utf8(out.stdout)?.trim().to_string();
        Ok(DevControlPlane { script, kubeconfig })
    }

    /// Runs its kubectl with `args`.
    fn kubectl(&self, args: &[&str]) -> std::io::Result<std::process::Output> {
        Command::new(&self.script)
            .arg("kubectl")
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v
}

/// Ends an admitted job at once (a legal Launching or Alive -> Done), as the scheduling-pass
/// scenarios do to make room.
fn end_job(store: &mut Store, row: &lifecycle::JobRow) -> anyhow::Result<()> {
    let end = lifecycle::fail(
        row,
        JobPhase::FailedPrecheck,
        lifecycle::FailureReason::InvalidSpec,
        "bench".into(),
    );
    store.transition(row.id, &end)?;
    Ok(())
}

/// (RSS, USS, PSS) in KiB from /proc/PID/smaps_rollup.
fn memory_kib(pid: i32) -> Option<(u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some((
        field("Rss:"),
        field("Private_Clean:") + field("Private_Dirty:"),
        field("Pss:"),
    ))
}

/// (own, reaped children's) CPU seconds of a process: utime + stime, and cutime + cstime, which
/// for the operator is every job controller it reaped and the workloads they reaped.
fn cpu_seconds(pid: i32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rfind(')').map(|i| &stat[i + 2..]).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> f64 { f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0.0) };
    // SAFETY: sysconf has no preconditions; -1 (unknown) falls back to Linux's USER_HZ.
    let hz = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        n if n > 0 => n as f64,
        _ => 100.0,
    };
    ((ticks(11) + ticks(12)) / hz, (ticks(13) + ticks(14)) / hz)
}

/// The control plane's processes on this machine, by component (the name of the process's
/// executable: kube-apiserver, etcd, kube-controller-manager, kube-scheduler, kwok): their own
/// CPU seconds summed. Shows where the shared cores went during a run.
fn control_plane_cpu() -> BTreeMap<String, f64> {
    const COMPONENTS: [&str; 5] = [
        "kube-apiserver",
        "etcd",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    ];
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let comm = comm.trim();
        // comm is cut to 15 bytes: kube-controller-manager shows as "kube-controller".
        if let Some(c) = COMPONENTS
            .iter()
            .find(|c| c.starts_with(comm) && !comm.is_empty())
        {
            *out.entry(c.to_string()).or_insert(0.0) += cpu_seconds(pid).0;
        }
    }
    out
}

/// The operator's `managedjobs_terminal_status_lag_seconds` histogram: (p50, p99) upper bounds in
/// ms, read from its cumulative buckets (a quantile is at most the first bucket bound reaching it).
fn operator_lag_quantiles(port: u16) -> Option<(f64, f64)> {
    histogram_quantiles(port, "managedjobs_terminal_status_lag_seconds")
}

/// (p50, p99) upper bounds in ms of one of the operator's histograms, from its buckets.
fn histogram_quantiles(port: u16, metric: &str) -> Option<(f64, f64)> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(metric)?.strip_prefix("_bucket{le=\"")?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    let quantile = |q: f64| {
        buckets
            .iter()
            .find(|(_, c)| *c >= q * total)
            .map(|(le, _)| le * 1000.0)
            .unwrap_or(f64::NAN)
    };
    (total > 0.0).then(|| (quantile(0.5), quantile(0.99)))
}

/// `apiserver_request_total` summed by (verb, resource) for our resources.
async fn apiserver_requests(
    client: &kube::Client,
) -> anyhow::Result<HashMap<(String, String), f64>> {
    const OURS: [&str; 6] = [
        "managedjobs",
        "managedjobqueues",
        "pods",
        "events",
        "podgroups",
        "services",
    ];
    apiserver_requests_of(client, |resource| OURS.contains(&resource)).await
}

/// `apiserver_request_total` summed by (verb, resource[/subresource]) for every resource
/// `keep` accepts (given the resource without its subresource).
async fn apiserver_requests_of(
    client: &kube::Client,
    keep: impl Fn(&str) -> bool,
) -> anyhow::Result<HashMap<(String, String), f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    let mut out = HashMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').unwrap_or((line, "0"));
        let get = |k: &str| {
            labels
                .split(&format!("{k}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let resource = get("resource");
        let sub = get("subresource");
        if resource.is_empty() || !keep(&resource) {
            continue;
        }
        let resource = if sub.is_empty() {
            resource
        } else {
            format!("{resource}/{sub}")
        };
        *out.entry((get("verb"), resource)).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    Ok(out)
}

/// The `i`-th job of `scenario`; `hold`: seconds a `density` job sleeps or a `pod` job's Pod
/// runs.
fn job_yaml(scenario: &str, i: usize, hold: u64) -> serde_json::Value {
    job_in_queue(scenario, i, hold, None)
}

/// [`job_yaml`] in `queue` (None: the default queue).
fn job_in_queue(scenario: &str, i: usize, hold: u64, queue: Option<&str>) -> serde_json::Value {
    let name = format!("bench-{i:05}");
    let mut spec = match scenario {
        "pod" => json!({
            "template": {
                "metadata": { "annotations": { "managedjobs.dev/complete-after": format!("{hold}s") } },
                "spec": { "containers": [{ "name": "main", "image": "busybox",
                    "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } } }] }
            }
        }),
        "density" => json!({ "run": format!("sleep {hold}") }),
        "pipeline" => json!({ "tasks": [
            { "name": "prepare", "run": "true" },
            { "name": "train", "run": "true" },
            { "name": "evaluate", "run": "true" },
        ] }),
        _ => json!({ "run": "true" }),
    };
    if scenario == "priorities" {
        spec["priority"] = json!([0, 10, -10, 100][i % 4]);
        spec["run"] = json!("sleep 0.05");
    }
    if let Some(q) = queue {
        spec["queue"] = json!(q);
    }
    json!({
        "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
        "metadata": { "name": name }, "spec": spec,
    })
}

/// Median and p99 time (ms) of a scheduling pass over `waiting` queued jobs beside `finished`
/// ones, with 8 free launch slots (each admitted job is ended and replaced each round). With
/// `queues` >= 1 the waiting jobs are spread over that many ManagedJobQueues (weights 1 to 4,
/// each admitting one namespace of its own through its selector), and the pass is
/// [`managed_jobs::scheduler::pass_queues`] under them, remembering what it told each queue's
/// head between passes as the engine does.
fn scheduling_pass(waiting: usize, finished: usize, queues: usize) -> anyhow::Result<(f64, f64)> {
    use managed_jobs::queues::{Admits, QueuePolicy, Queues};
    let policies = if queues == 0 {
        Queues::single_pool()
    } else {
        Queues::new(
            (0..queues)
                .map(|q| {
                    let policy = QueuePolicy {
                        quotas: Default::default(),
                        strategy: Default::default(),
                        weight: (q % 4) as u32 + 1,
                        max_running: None,
                        max_launching: None,
                        admits: Admits::Only([format!("team-{q}")].into()),
                        preemption: managed_jobs::queues::Preemption::OFF,
                    };
                    (format!("queue-{q}"), policy)
                })
                .collect(),
        )
    };
    let placed = |i: usize| -> (String, Option<String>) {
        if queues == 0 {
            ("bench".into(), None)
        } else {
            let q = i % queues;
            (format!("team-{q}"), Some(format!("queue-{q}")))
        }
    };
    let dir = tempfile::tempdir()?;
    let mut store = Store::open(&dir.path().join("bench.db"), 8 * 1024)?;
    let spec = managed_jobs::api::ManagedJobSpec {
        run: Some("true".into()),
        ..Default::default()
    };
    for i in 0..waiting {
        let mut s = spec.clone();
        s.priority = (i % 7) as i32 - 3;
        let (ns, queue) = placed(i);
        s.queue = queue;
        store.upsert(&format!("u{i}"), &ns, &format!("j{i}"), 1, &s)?;
    }
    // Plus finished jobs: a pass must not get slower with history.
    for i in 0..finished {
        let (ns, queue) = placed(i);
        let mut s = spec.clone();
        s.queue = queue;
        let row = store
            .upsert(&format!("done{i}"), &ns, &format!("d{i}"), 1, &s)?
            .row;
        store.transition(row.id, &lifecycle::cancel_queued(&row))?;
    }
    let caps = Caps {
        launch: 8,
        run: 1000,
    };
    let mut times = Vec::new();
    let mut refills = 0usize;
    for _ in 0..200 {
        let start = Instant::now();
        let result = managed_jobs::scheduler::pass_queues(&mut store, caps, &policies)?;
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        // Keep the queue as long: each admitted job ends (a legal Launching -> Done) and a new
        // one of the same priority joins the queue.
        for row in result.started {
            end_job(&mut store, &row)?;
            let mut s = spec.clone();
            s.priority = row.priority;
            s.queue = row.spec.queue.clone();
            let n = refills;
            refills += 1;
            store.upsert(&format!("r{n}"), &row.namespace, &format!("r{n}"), 1, &s)?;
        }
    }
    let t = sorted(times);
    // Issue 43: a change of every waiting job's reason (the queues' maxRunning set to what they
    // hold: QueueMaxRunning), with every status written before it: the pass that tells them
    // all, then one that finds nothing to tell.
    for row in store.all()? {
        store.mark_synced(row.id, row.status_version)?;
    }
    let held = Queues::new(
        policies
            .names()
            .into_iter()
            .map(|name| {
                let mut p = policies.get(name).cloned().expect("a queue in force");
                p.max_running = Some(0);
                (name.to_string(), p)
            })
            .collect(),
    );
    let start = Instant::now();
    let told = managed_jobs::scheduler::pass_queues(&mut store, caps, &held)?.messages;
    let change_ms = start.elapsed().as_secs_f64() * 1000.0;
    let start = Instant::now();
    let again = managed_jobs::scheduler::pass_queues(&mut store, caps, &held)?.messages;
    let steady_ms = start.elapsed().as_secs_f64() * 1000.0;
    let unwritten = store.unsynced_brief(usize::MAX)?.len();
    println!(
        "a change of every waiting job's reason: the pass that tells them {change_ms:.1} ms ({told} jobs told, {unwritten} statuses to write: {:.0} s at the default {} writes/s), the next {steady_ms:.2} ms ({again} told)",
        unwritten as f64 / f64::from(managed_jobs::defaults::API_QPS),
        managed_jobs::defaults::API_QPS
    );
    Ok((percentile(&t, 0.5), percentile(&t, 0.99)))
}

/// Waits until the finalizer policy adds the finalizer to a new job of `ns` (a dry-run create).
/// It takes effect a moment after it is installed: until it does, every job costs one more write
/// (the operator adds the finalizer), which would skew the figures.
async fn wait_for_finalizer_policy(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let probe: ManagedJob = serde_json::from_value(job_yaml("local", 99_999, 0))?;
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let policy_wait = Instant::now();
    loop {
        let api: Api<ManagedJob> = Api::namespaced(client.clone(), ns);
        let mutated = api.create(&dry_run, &probe).await.is_ok_and(|mj| {
            mj.metadata
                .finalizers
                .is_some_and(|f| f.iter().any(|f| f == managed_jobs::api::FINALIZER))
        });
        if mutated {
            return Ok(());
        }
        anyhow::ensure!(
            policy_wait.elapsed() < Duration::from_secs(60),
            "the finalizer policy (crds/managedjobs.dev_finalizer-policy.yaml) never took effect"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[derive(Default)]
struct Seen {
    submitted_at: Option<Instant>,
    seen_ms: Option<i64>,
    phase: Option<JobPhase>,
    schedule: Option<ScheduleState>,
    /// When its create call was made.
    created: Option<Instant>,
    /// When the watch first saw a status of it.
    first_status: Option<Instant>,
    /// When the watch first saw each phase (ms since epoch).
    phase_seen_ms: BTreeMap<&'static str, i64>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.scenario == "schedpass" {
        let (p50, p99) = scheduling_pass(10_000, args.finished, args.queues)?;
        let over = match args.queues {
            0 => String::new(),
            n => format!(" over {n} queues"),
        };
        println!(
            "scheduling pass over 10,000 waiting{over} (+{} finished) jobs: p50 {p50:.3} ms, p99 {p99:.3} ms",
            args.finished
        );
        return Ok(());
    }
    if args.scenario == "preemption" {
        return preemption_scenario(&args).await;
    }
    if args.scenario == "reasons" {
        return reasons::scenario(&args).await;
    }
    if args.scenario == "visibility" {
        return visibility::scenario(&args).await;
    }
    if args.scenario == "versus" {
        return versus::scenario(&args).await;
    }
    if args.scenario == "poolpass" {
        return poolpass::scenario(&args);
    }
    if args.scenario == "shares" {
        return shares::scenario(&args).await;
    }
    if args.scenario == "load-client" {
        return visibility::load_client(&args).await;
    }
    if !["local", "pod", "priorities", "pipeline", "density"].contains(&args.scenario.as_str()) {
        bail!("unknown scenario {}", args.scenario);
    }
    let cp = DevControlPlane::up()?;
    let kubeconfig = cp.kubeconfig.clone();
    let kubectl = |a: &[&str]| cp.kubectl(a);
    kubectl(&["apply", "-f", root().join("crds").to_str().unwrap()])?;
    kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/managedjobs.managedjobs.dev",
        "crd/managedjobqueues.managedjobs.dev",
    ])?;
    // SAFETY: single-threaded at this point; set before any client reads it.
    unsafe { std::env::set_var("KUBECONFIG", &kubeconfig) };
    let client = kube::Client::try_default().await?;
    let ns = format!("bench-{}", std::process::id());
    kubectl(&["create", "namespace", &ns])?;
    // `--queues N`: N queues of weight 1 admitting the bench's namespace.
    let queue_names: Vec<String> = (0..args.queues).map(|q| format!("{ns}-q{q}")).collect();
    {
        let api: Api<managed_jobs::api::ManagedJobQueue> = Api::all(client.clone());
        for name in &queue_names {
            let q = serde_json::from_value(json!({
                "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobQueue",
                "metadata": { "name": name },
                "spec": { "weight": 1, "namespaceSelector": { "matchLabels": {
                    "kubernetes.io/metadata.name": ns } } },
            }))?;
            api.create(&PostParams::default(), &q).await?;
        }
    }
    wait_for_finalizer_policy(&client, &ns).await?;

    let binary = std::env::current_exe()?.with_file_name("managed-jobs");
    anyhow::ensure!(
        binary.exists(),
        "build the operator first: cargo build --release"
    );
    let state = tempfile::tempdir()?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut cmd = Command::new(&binary);
    cmd.arg("run")
        .arg("--state-dir")
        .arg(state.path())
        .args(["--namespace", &ns, "--executors", "local,pod"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args([
            "--api-qps",
            &args.api_qps.to_string(),
            "--api-burst",
            &args.api_burst.to_string(),
        ])
        .args(&args.operator_arg)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(state.path().join("operator.log"))?);
    let launch_cap = if args.scenario == "priorities" {
        Some(1)
    } else {
        args.launch_cap
    };
    let run_cap = if args.scenario == "priorities" {
        Some(1)
    } else if args.scenario == "density" {
        Some(args.run_cap.unwrap_or(args.jobs))
    } else {
        args.run_cap
    };
    if let Some(c) = launch_cap {
        cmd.args(["--launch-cap", &c.to_string()]);
    }
    if let Some(c) = run_cap {
        cmd.args(["--run-cap", &c.to_string()]);
    }
    let mut operator = cmd.spawn().context("starting the operator")?;
    let op_pid = operator.id() as i32;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let caps_line = std::fs::read_to_string(state.path().join("operator.log")).unwrap_or_default();

    let before = apiserver_requests(&client).await?;
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::default();
    let peaks: Arc<Mutex<(usize, usize)>> = Arc::default();
    let total = args.jobs;

    // One watch from before the first create sees every status the API serves.
    let watcher_task = {
        let api: Api<ManagedJob> = Api::namespaced(client.clone(), &ns);
        let (seen, peaks) = (seen.clone(), peaks.clone());
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed();
            let mut done = 0usize;
            loop {
                let mj = match stream.try_next().await {
                    Ok(Some(mj)) => mj,
                    Ok(None) => bail!("the watch ended before every job finished"),
                    // A gap in what the watch saw would flatter every figure: fail the run.
                    Err(e) => bail!("watch error: {e}"),
                };
                let now = Instant::now();
                let name = mj.metadata.name.clone().unwrap_or_default();
                let status = mj.status.unwrap_or_default();
                let mut map = seen.lock().unwrap();
                let entry = map.entry(name).or_default();
                if entry.first_status.is_none() && status.phase.is_some() {
                    entry.first_status = Some(now);
                }
                if let Some(p) = status.phase {
                    entry
                        .phase_seen_ms
                        .entry(p.as_str())
                        .or_insert_with(managed_jobs::lifecycle::now_ms);
                }
                if entry.submitted_at.is_none()
                    && status.phase.is_some_and(|p| p != JobPhase::Pending)
                {
                    entry.submitted_at = Some(now);
                }
                if entry.seen_ms.is_none() && status.phase.is_some_and(|p| p.is_terminal()) {
                    entry.seen_ms = Some(managed_jobs::lifecycle::now_ms());
                    done += 1;
                }
                entry.phase = status.phase;
                entry.schedule = status.schedule_state;
                let alive = map
                    .values()
                    .filter(|s| s.schedule.is_some_and(|s| s.holds_run_slot()))
                    .count();
                let launching = map
                    .values()
                    .filter(|s| s.schedule == Some(ScheduleState::Launching))
                    .count();
                drop(map);
                let mut p = peaks.lock().unwrap();
                p.0 = p.0.max(alive);
                p.1 = p.1.max(launching);
                drop(p);
                if done >= total {
                    return Ok(());
                }
            }
        })
    };

    // Sample job controller memory while jobs run.
    let samples: Arc<Mutex<Vec<(u64, u64, u64)>>> = Arc::default();
    // The round that saw the most job controllers: (their number, their PSS sum in KiB, the
    // operator's RSS in KiB then); and the operator's highest RSS.
    let peak: Arc<Mutex<(usize, u64, u64, u64)>> = Arc::default();
    let sampler = {
        let dir = state.path().to_string_lossy().into_owned();
        let (samples, peak) = (samples.clone(), peak.clone());
        tokio::spawn(async move {
            loop {
                let (mut n, mut pss) = (0usize, 0u64);
                for pid in managed_jobs::process::find_by_arguments(&["job-controller", &dir]) {
                    if let Some(m) = memory_kib(pid).filter(|m| m.0 > 0) {
                        samples.lock().unwrap().push(m);
                        n += 1;
                        pss += m.2;
                    }
                }
                let op_rss = memory_kib(op_pid).map(|m| m.0).unwrap_or(0);
                {
                    let mut p = peak.lock().unwrap();
                    if n > p.0 {
                        *p = (n, pss, op_rss, p.3);
                    }
                    p.3 = p.3.max(op_rss);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let churned: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop_churn = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churner = (args.churn_seconds > 0).then(|| {
        let (client, churned, every) = (client.clone(), churned.clone(), args.churn_seconds);
        let outage = Duration::from_secs(args.churn_outage_seconds);
        let churn_count = args.churn_count;
        let stop = stop_churn.clone();
        tokio::spawn(async move {
            let count = if churn_count == 0 {
                usize::MAX
            } else {
                churn_count
            };
            for k in 0..count {
                tokio::time::sleep(Duration::from_secs(every)).await;
                // Never stopped between a delete and its create: a node is always put back.
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                match churn_one(&client, k, outage).await {
                    Ok(name) => churned.lock().unwrap().push(name),
                    Err(e) => eprintln!("node churn: {e}"),
                }
            }
        })
    });
    let cpu_before = cpu_seconds(op_pid);
    let control_plane_before = control_plane_cpu();
    let start = Instant::now();
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), &ns);
    let hold = if args.scenario == "pod" {
        args.pod_seconds
    } else {
        args.hold_seconds.unwrap_or(240)
    };
    let rate = args.rate;
    // A steady rate: the i-th create starts at i / rate, whatever the earlier ones take.
    let in_flight = if rate > 0.0 { 4096 } else { 32 };
    futures::stream::iter(0..args.jobs)
        .map(|i| {
            let api = api.clone();
            let scenario = args.scenario.clone();
            let nodes = args.nodes;
            let seen = seen.clone();
            let queue =
                (!queue_names.is_empty()).then(|| queue_names[i % queue_names.len()].clone());
            async move {
                if rate > 0.0 {
                    let at = start + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(at.into()).await;
                }
                let mut mj: ManagedJob =
                    serde_json::from_value(job_in_queue(&scenario, i, hold, queue.as_deref()))
                        .unwrap();
                if scenario == "pod" {
                    mj.spec.nodes = nodes;
                }
                let name = mj.metadata.name.clone().unwrap();
                seen.lock()
                    .unwrap()
                    .entry(name.clone())
                    .or_default()
                    .created
                    .get_or_insert_with(Instant::now);
                loop {
                    match api.create(&PostParams::default(), &mj).await {
                        Ok(_) => break,
                        Err(e) => {
                            eprintln!("create {name}: {e}; retrying");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }
        })
        .buffer_unordered(in_flight)
        .collect::<Vec<()>>()
        .await;
    let created = start.elapsed();
    let deadline = Duration::from_secs(1800 + hold);
    match tokio::time::timeout(deadline, watcher_task).await {
        Err(_) => {
            let never = seen
                .lock()
                .unwrap()
                .values()
                .filter(|s| s.seen_ms.is_none())
                .count();
            bail!("{never} jobs were never seen finishing within {deadline:?}");
        }
        Ok(Err(e)) => bail!("the watch task failed: {e}"),
        Ok(Ok(Err(e))) => bail!("{e}"),
        Ok(Ok(Ok(()))) => {}
    }
    let elapsed = start.elapsed();
    if let Some(c) = churner {
        stop_churn.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = c.await;
    }
    let pass_quantiles = histogram_quantiles(port, "managedjobs_scheduling_pass_seconds");
    let cpu_after = cpu_seconds(op_pid);
    let control_plane_cpu_s: BTreeMap<String, f64> = control_plane_cpu()
        .into_iter()
        .map(|(k, v)| {
            let before = control_plane_before.get(&k).copied().unwrap_or(0.0);
            (k, ((v - before) * 10.0).round() / 10.0)
        })
        .collect();
    let operator_lag = operator_lag_quantiles(port);
    let (cpu, children_cpu) = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
    let op_mem = memory_kib(op_pid).unwrap_or_default();
    // Job controllers of trivial jobs live for milliseconds: sample a few that stay alive (the
    // workload sleeps) to measure a settled job controller.
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), &ns);
    if args.scenario != "pod" {
        for i in 0..20 {
            let mut mj: ManagedJob = serde_json::from_value(job_yaml("local", i, hold)).unwrap();
            mj.metadata.name = Some(format!("memory-{i:02}"));
            mj.spec.run = Some("sleep 4".into());
            api.create(&PostParams::default(), &mj).await?;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    sampler.abort();
    let samples = samples.lock().unwrap().clone();
    let after = apiserver_requests(&client).await?;

    let map = seen.lock().unwrap();
    let failed = map
        .values()
        .filter(|s| s.phase != Some(JobPhase::Succeeded))
        .count();
    let admitted = map
        .values()
        .filter_map(|s| s.submitted_at)
        .max()
        .map(|t| t - start);
    // status.finishedAt has one-second resolution: take the transition time from the store.
    let store = Store::open(&StateDir::new(state.path()).store(), 1024)?;
    // Every row and its history, read once for all the figures below.
    let all = store.all()?;
    let histories: HashMap<i64, Vec<managed_jobs::lifecycle::HistoryEntry>> = all
        .iter()
        .map(|r| (r.id, store.history(r.id).unwrap_or_default()))
        .collect();
    let history = |id: i64| histories.get(&id).map(Vec::as_slice).unwrap_or_default();
    let bench_jobs: Vec<&managed_jobs::lifecycle::JobRow> = all
        .iter()
        .filter(|r| r.name.starts_with("bench-"))
        .collect();
    let finished: HashMap<&str, i64> = all
        .iter()
        .filter_map(|r| Some((r.name.as_str(), r.finished_at_ms?)))
        .collect();
    let latencies = sorted(
        map.iter()
            .filter_map(|(name, s)| Some((s.seen_ms? - finished.get(name.as_str())?) as f64))
            .collect(),
    );
    // Each status a user sees: the store's first transition into the phase to the watch seeing
    // it (a phase the status writer coalesced away is not counted).
    let ids: HashMap<&str, i64> = bench_jobs.iter().map(|r| (r.name.as_str(), r.id)).collect();
    let mut per_phase: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    for (name, s) in map.iter() {
        let Some(&id) = ids.get(name.as_str()) else {
            continue;
        };
        let history = history(id);
        for (phase, seen_ms) in &s.phase_seen_ms {
            let label = match *phase {
                "Submitted" | "Starting" | "Running" => *phase,
                p if JobPhase::parse(p).is_some_and(|p| p.is_terminal()) => "terminal",
                _ => continue,
            };
            if let Some(t) = history.iter().find(|t| t.to_phase.as_str() == *phase) {
                per_phase
                    .entry(label)
                    .or_default()
                    .push((seen_ms - t.at_ms).max(0) as f64);
            }
        }
    }
    let per_phase: BTreeMap<&str, serde_json::Value> = per_phase
        .into_iter()
        .map(|(p, v)| {
            let v = sorted(v);
            (
                p,
                json!({ "count": v.len(), "p50_ms": percentile(&v, 0.5), "p99_ms": percentile(&v, 0.99) }),
            )
        })
        .collect();
    let to_first_status = sorted(
        map.values()
            .filter_map(|s| Some(s.first_status?.duration_since(s.created?).as_secs_f64() * 1000.0))
            .collect(),
    );
    let last_create = map.values().filter_map(|s| s.created).max();
    let last_terminal = map.values().filter_map(|s| s.seen_ms).max().unwrap_or(0);
    let drain_lag_s = last_create.map(|c| {
        let c_ms = managed_jobs::lifecycle::now_ms() - c.elapsed().as_millis() as i64;
        (last_terminal - c_ms) as f64 / 1000.0
    });
    let (peak_alive, peak_launching) = *peaks.lock().unwrap();
    let mut per_job: BTreeMap<String, f64> = BTreeMap::new();
    for ((verb, resource), v) in &after {
        let d = v - before
            .get(&(verb.clone(), resource.clone()))
            .copied()
            .unwrap_or(0.0);
        if d > 0.0 {
            per_job.insert(format!("{verb} {resource}"), d / args.jobs as f64);
        }
    }
    // A multi-node job: from its admission (Launching) to every member running (Running).
    let to_all_running = sorted(
        bench_jobs
            .iter()
            .filter_map(|r| {
                let h = history(r.id);
                let admitted = h
                    .iter()
                    .find(|t| t.to_schedule == ScheduleState::Launching)?;
                let running = h
                    .iter()
                    .find(|t| t.reason == managed_jobs::lifecycle::Reason::Running)?;
                Some((running.at_ms - admitted.at_ms) as f64)
            })
            .collect(),
    );
    let members = (args.jobs as f64) * f64::from(args.nodes.unwrap_or(1).max(1));
    let writes_per_member: f64 = per_job
        .iter()
        .filter(|(k, _)| !k.starts_with("GET") && !k.starts_with("LIST") && !k.starts_with("WATCH"))
        .map(|(_, v)| v * args.jobs as f64)
        .sum::<f64>()
        / members;
    let uss = sorted(samples.iter().map(|s| s.1 as f64 / 1024.0).collect());
    let pss = sorted(samples.iter().map(|s| s.2 as f64 / 1024.0).collect());
    let rss = sorted(samples.iter().map(|s| s.0 as f64 / 1024.0).collect());
    // Priority order: an inversion is a job admitted while another job that should go first
    // (higher priority, or equal priority and earlier in FIFO order) was already known and queued.
    let inversions = if args.scenario == "priorities" {
        let rows = &all;
        let scheduled: HashMap<i64, i64> = rows
            .iter()
            .filter_map(|r| {
                let at = history(r.id)
                    .iter()
                    .find(|t| t.reason == lifecycle::Reason::Scheduled)?
                    .at_ms;
                Some((r.id, at))
            })
            .collect();
        let key = |r: &managed_jobs::lifecycle::JobRow| (-r.priority, r.queued_at_ms, r.id);
        let mut count = 0;
        for a in rows {
            for b in rows {
                let (Some(sa), Some(sb)) = (scheduled.get(&a.id), scheduled.get(&b.id)) else {
                    continue;
                };
                if sa < sb && b.submitted_at_ms < *sa && key(b) < key(a) {
                    count += 1;
                }
            }
        }
        Some(count)
    } else {
        None
    };
    // The write budget of a pipeline: every change a user can see (the job's phase, or a task's
    // phase in status.tasks) against the status writes the API server counted.
    let visible: usize = bench_jobs
        .iter()
        .map(|r| {
            let phases = history(r.id)
                .iter()
                .filter(|t| t.from_phase.is_some_and(|f| f != t.to_phase))
                .count();
            // A launch intent moves a pipeline's task Pending -> Starting without a job phase
            // change (the job is already Starting between tasks).
            let task_starts = r.spec.tasks.len().saturating_sub(1);
            phases + task_starts
        })
        .sum();
    let tasks_per_job = if args.scenario == "pipeline" { 3 } else { 1 };
    let recoveries: i64 = bench_jobs
        .iter()
        .map(|r| managed_jobs::lifecycle::tasks::totals(r).1 as i64)
        .sum();
    // The slowest job, submit to finish, with its history: what a long tail waited for.
    let slowest = bench_jobs
        .iter()
        .filter_map(|r| Some((r.finished_at_ms? - r.submitted_at_ms, r)))
        .max_by_key(|(d, _)| *d)
        .map(|(d, r)| {
            let history: Vec<String> = history(r.id)
                .iter()
                .map(|h| {
                    format!(
                        "+{:.1}s {} {}: {}",
                        (h.at_ms - r.submitted_at_ms) as f64 / 1000.0,
                        h.to_phase,
                        h.reason.as_str(),
                        h.message
                    )
                })
                .collect();
            json!({ "name": r.name, "seconds": d as f64 / 1000.0, "history": history })
        });
    let status_writes = per_job
        .get("PATCH managedjobs/status")
        .copied()
        .unwrap_or(0.0);
    let (sp50, sp99) = scheduling_pass(10_000, 10_000, args.queues)?;
    // Each queue's status writes (server-side apply, or a patch) per minute of the run (counted
    // until the figures are read, seconds after the last job ended: an upper bound).
    let queue_writes_per_minute = (args.queues > 0).then(|| {
        ["APPLY", "PATCH"]
            .iter()
            .filter_map(|verb| per_job.get(&format!("{verb} managedjobqueues/status")))
            .sum::<f64>()
            * args.jobs as f64
            / args.queues as f64
            / (elapsed.as_secs_f64() / 60.0)
    });
    let report = json!({
        "scenario": args.scenario,
        "jobs": args.jobs,
        "queues": args.queues,
        "commit": git_commit(),
        "operator_args": args.operator_arg,
        "caps_log": caps_line.lines().find(|l| l.contains("caps in force")).unwrap_or(""),
        "create_seconds": created.as_secs_f64(),
        "end_to_end_seconds": elapsed.as_secs_f64(),
        "jobs_per_second": args.jobs as f64 / elapsed.as_secs_f64(),
        "time_to_admit_all_seconds": admitted.map(|d| d.as_secs_f64()),
        "not_succeeded": failed,
        "peak_alive_seen": peak_alive,
        "peak_launching_seen": peak_launching,
        "create_rate_per_second": if args.rate > 0.0 { json!(args.rate) } else { json!("max") },
        "api_qps_burst": format!("{}/{}", args.api_qps, args.api_burst),
        "drain_lag_seconds": drain_lag_s,
        "create_to_first_status_ms_p50": percentile(&to_first_status, 0.5),
        "create_to_first_status_ms_p99": percentile(&to_first_status, 0.99),
        "status_latency_by_phase": per_phase,
        "scheduling_pass_ms_p50_in_run_at_most": pass_quantiles.map(|q| q.0),
        "scheduling_pass_ms_p99_in_run_at_most": pass_quantiles.map(|q| q.1),
        "peak_job_controllers_sampled": peak.lock().unwrap().0,
        "peak_job_controllers_pss_sum_mib": peak.lock().unwrap().1 as f64 / 1024.0,
        "operator_rss_mib_at_peak": peak.lock().unwrap().2 as f64 / 1024.0,
        "operator_rss_mib_max": peak.lock().unwrap().3 as f64 / 1024.0,
        "status_latency_ms_p50": percentile(&latencies, 0.5),
        "status_latency_ms_p99": percentile(&latencies, 0.99),
        "operator_terminal_status_lag_ms_p50_at_most": operator_lag.map(|l| l.0),
        "operator_terminal_status_lag_ms_p99_at_most": operator_lag.map(|l| l.1),
        "api_requests_per_job": per_job,
        "nodes_per_job": args.nodes,
        "admission_to_all_running_ms_p50": percentile(&to_all_running, 0.5),
        "admission_to_all_running_ms_p99": percentile(&to_all_running, 0.99),
        "api_writes_per_member_pod": writes_per_member,
        "operator_rss_mib": op_mem.0 as f64 / 1024.0,
        "operator_cpu_seconds": cpu,
        "control_plane_cpu_seconds": control_plane_cpu_s,
        "job_controller_cpu_ms_per_job": children_cpu * 1000.0 / args.jobs as f64,
        "job_controller_samples": samples.len(),
        "job_controller_rss_mib_p50": percentile(&rss, 0.5),
        "job_controller_uss_mib_p50": percentile(&uss, 0.5),
        "job_controller_uss_mib_p99": percentile(&uss, 0.99),
        "job_controller_pss_mib_p50": percentile(&pss, 0.5),
        "job_controller_pss_mib_p99": percentile(&pss, 0.99),
        "scheduling_pass_ms_p50_10000_waiting": sp50,
        "scheduling_pass_ms_p99_10000_waiting": sp99,
        "priority_order_inversions": inversions,
        "tasks_per_job": tasks_per_job,
        "nodes_churned": churned.lock().unwrap().clone(),
        "recoveries": recoveries,
        "slowest_job": slowest,
        "visible_changes_per_job": visible as f64 / args.jobs as f64,
        "status_writes_per_job": status_writes,
        "status_writes_per_task": status_writes / tasks_per_job as f64,
        "queue_status_writes_per_queue_per_minute": queue_writes_per_minute,
    });
    print_table(&report);
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    // Delete while the operator runs, so it releases the finalizers; then stop it.
    kubectl(&["delete", "namespace", &ns, "--timeout=300s"])?;
    for name in &queue_names {
        kubectl(&["delete", "managedjobqueue", name, "--wait=false"])?;
    }
    let _ = operator.kill();
    let _ = operator.wait();
    Ok(())
}

fn git_commit() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(root())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn print_table(r: &serde_json::Value) {
    println!("\n{:<44} value", "figure");
    for (k, v) in r.as_object().unwrap() {
        if k == "api_requests_per_job" || k == "control_plane_cpu_seconds" {
            for (verb, n) in v.as_object().unwrap() {
                println!(
                    "{:<44} {:.2}",
                    format!("{}: {verb}", k.replace('_', " ")),
                    n.as_f64().unwrap_or(0.0)
                );
            }
            continue;
        }
        let text = match v {
            serde_json::Value::Number(n) if n.is_f64() => format!("{:.3}", n.as_f64().unwrap()),
            other => other.to_string(),
        };
        println!("{k:<44} {text}");
    }
}

/// `--scenario preemption` (issue 32): the two-team load of `tests/preemption.rs`, with and
/// without `spec.preemption`. Run cap 8; queue A (weight 1) holds all 8 run slots with jobs of
/// `--hold-seconds` (default 240; started one a second, so their start times differ); then
/// queue B (weight 3) applies 8 such jobs. Reports B's time to its share (6 of its jobs Running,
/// from its first create), the preemptions (A's jobs seen going Running -> Pending) and the work
/// each victim lost (seconds it had run), once with `reclaimShare: Any` (minRunSeconds 5) and
/// once without preemption (bounded by the hold: B waits for A's jobs to end).
async fn preemption_scenario(args: &Args) -> anyhow::Result<()> {
    let cp = DevControlPlane::up()?;
    let kubeconfig = cp.kubeconfig.clone();
    let kubectl = |a: &[&str]| cp.kubectl(a);
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        root().join("crds").to_str().unwrap(),
    ])?;
    // SAFETY: set before any client reads it, before any other thread runs.
    unsafe { std::env::set_var("KUBECONFIG", &kubeconfig) };
    let client = kube::Client::try_default().await?;
    let binary = std::env::current_exe()?.with_file_name("managed-jobs");
    anyhow::ensure!(
        binary.exists(),
        "build the operator first: cargo build --release"
    );
    let hold = args.hold_seconds.unwrap_or(240);
    let mut report = Vec::new();
    for reclaim in [true, false] {
        let tag = format!(
            "bp{}-{}",
            std::process::id(),
            if reclaim { "on" } else { "off" }
        );
        let (a, b) = (format!("{tag}-a"), format!("{tag}-b"));
        for ns in [&a, &b] {
            kubectl(&["create", "namespace", ns])?;
        }
        let queues: Api<managed_jobs::api::ManagedJobQueue> = Api::all(client.clone());
        for (name, weight) in [(&a, 1), (&b, 3)] {
            let mut spec = json!({ "weight": weight, "namespaceSelector": { "matchLabels": {
                "kubernetes.io/metadata.name": name } } });
            if reclaim {
                spec["preemption"] = json!({ "reclaimShare": "Any", "minRunSeconds": 5 });
            }
            let q = serde_json::from_value(json!({
                "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobQueue",
                "metadata": { "name": name }, "spec": spec,
            }))?;
            queues.create(&PostParams::default(), &q).await?;
        }
        let state = tempfile::tempdir()?;
        let mut operator = Command::new(&binary)
            .arg("run")
            .arg("--state-dir")
            .arg(state.path())
            .args(["--shard", &tag, "--launch-cap", "8", "--run-cap", "8"])
            .args(["--cancel-grace-seconds", "5"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(state.path().join("operator.log"))?)
            .spawn()
            .context("starting the operator")?;
        let create = |ns: String, i: usize| {
            let client = client.clone();
            async move {
                let mj: ManagedJob = serde_json::from_value(json!({
                    "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
                    "metadata": { "name": format!("j{i}"),
                        "labels": { managed_jobs::api::LABEL_SHARD: tag_of(&ns) } },
                    "spec": { "queue": ns, "run": format!("trap 'exit 0' TERM; sleep {hold} & wait") },
                }))?;
                Api::<ManagedJob>::namespaced(client, &ns)
                    .create(&PostParams::default(), &mj)
                    .await?;
                anyhow::Ok(())
            }
        };
        fn tag_of(ns: &str) -> String {
            ns.rsplit_once('-').map_or(ns, |(t, _)| t).to_string()
        }
        let statuses = |ns: String| {
            let client = client.clone();
            async move {
                let list = Api::<ManagedJob>::namespaced(client, &ns)
                    .list(&Default::default())
                    .await?;
                anyhow::Ok(
                    list.items
                        .into_iter()
                        .map(|mj| {
                            (
                                mj.metadata.name.unwrap_or_default(),
                                mj.status.unwrap_or_default(),
                            )
                        })
                        .collect::<BTreeMap<String, managed_jobs::api::ManagedJobStatus>>(),
                )
            }
        };
        let running = |all: &BTreeMap<String, managed_jobs::api::ManagedJobStatus>| {
            all.values()
                .filter(|s| s.phase == Some(JobPhase::Running))
                .count()
        };
        for i in 0..8 {
            create(a.clone(), i).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while running(&statuses(a.clone()).await?) < 8 {
            anyhow::ensure!(Instant::now() < deadline, "queue A's 8 jobs never all ran");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let started = Instant::now();
        for i in 0..8 {
            create(b.clone(), i).await?;
        }
        // When each of A's jobs last started to run (its startedAt while Running).
        let mut since: BTreeMap<String, jiff::Timestamp> = BTreeMap::new();
        let limit = Duration::from_secs(hold + 60);
        let share_at = loop {
            for (name, s) in statuses(a.clone()).await? {
                if s.phase == Some(JobPhase::Running)
                    && let Some(t) = s.started_at
                {
                    since.insert(name, t.0);
                }
            }
            if running(&statuses(b.clone()).await?) >= 6 {
                break Some(started.elapsed().as_secs_f64());
            }
            if started.elapsed() > limit {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        // The victims: A's jobs whose attempts record a preemption; the work each lost is its
        // run from its start to the preemption's end.
        let mut lost: Vec<f64> = Vec::new();
        for (name, s) in statuses(a.clone()).await? {
            for record in s.attempts.iter().filter(|r| r.action == "Preempted") {
                if let (Some(from), Some(to)) = (since.get(&name), record.finished_at.as_ref()) {
                    lost.push(to.0.duration_since(*from).as_secs_f64());
                }
            }
        }
        lost.sort_by(f64::total_cmp);
        let _ = operator.kill();
        let _ = operator.wait();
        for ns in [&a, &b] {
            kubectl(&["delete", "namespace", ns, "--wait=false"])?;
            kubectl(&["delete", "managedjobqueue", ns, "--wait=false"])?;
        }
        let mean = if lost.is_empty() {
            0.0
        } else {
            lost.iter().sum::<f64>() / lost.len() as f64
        };
        let line = format!(
            "preemption {}: B's time to its share (6 of 8 run slots): {}; preemptions {}; work lost per victim: mean {mean:.1} s (run seconds since start: {})",
            if reclaim {
                "on (reclaimShare: Any, minRunSeconds 5)"
            } else {
                "off"
            },
            share_at.map_or(format!("not within {} s", limit.as_secs()), |s| format!(
                "{s:.1} s"
            )),
            lost.len(),
            lost.iter()
                .map(|l| format!("{l:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        println!("{line}");
        report.push(line);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}
