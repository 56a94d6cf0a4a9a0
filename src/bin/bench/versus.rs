//! `--scenario versus` (issue 34): ManagedJobs side by side with batch/v1 Jobs on one dev
//! control plane (4 kwok nodes), `--jobs` pod jobs of `--pod-seconds` each (1,000 of 10 s by
//! default), each system at its defaults, applied as a user applies them: one file of all the
//! objects, `kubectl apply -f` (client-side apply: one request after another).
//!
//! Three runs, one after another, each in a namespace of its own:
//! 1. **batch/v1 Job**: the Jobs applied, then watched until every one is Complete (or Failed).
//! 2. **ManagedJob, no operator**: the same number of ManagedJobs applied into a namespace no
//!    operator watches (what the API server's own work on our objects costs: the CRD's schema
//!    and CEL rules, the finalizer policy); then their finalizers are removed and the namespace
//!    deleted (not measured).
//! 3. **ManagedJob**: the release operator (`target/release/managed-jobs run`, its default API
//!    budget and caps) on a fresh namespace, the ManagedJobs applied while it works on them,
//!    watched until every one is terminal; then one such row per `--variant NAME=ARGS` (the
//!    operator with more flags), so that a change is measured before and after in one run.
//!
//! `--versus-systems` picks the rows (`jobs,unwatched,managed` by default).
//!
//! For each: the apply's wall time; all done at (from the apply's start to the last completion
//! a watch saw); CPU milliseconds per job of every process involved, from `/proc` (`utime +
//! stime`) before and after: kube-apiserver, etcd, kube-controller-manager + kube-scheduler +
//! kwok, and our own: the operator, and every job controller it reaped (`cutime + cstime`); and
//! API requests per job, from the API server's `apiserver_request_total` (every resource, the
//! watch's and the bench's own requests included: a few per run).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use managed_jobs::api::ManagedJob;
use serde_json::json;

use super::{Args, DevControlPlane, control_plane_cpu, cpu_seconds, root};

/// Longest a run may take to finish its jobs.
const RUN_TIMEOUT: Duration = Duration::from_secs(1800);

/// What one system's run measured.
#[derive(Debug, Default)]
struct Run {
    system: String,
    /// Wall time of `kubectl apply -f` of all the objects.
    applied_in: Duration,
    /// From the apply's start to the last completion seen (None: not waited for).
    done_at: Option<Duration>,
    /// CPU seconds over the run by process group.
    cpu: BTreeMap<&'static str, f64>,
    /// API requests over the run, by "VERB resource[/subresource]".
    requests: BTreeMap<String, f64>,
}

/// Runs the three systems and prints their table (and JSON with `--json`).
pub async fn scenario(args: &Args) -> anyhow::Result<()> {
    let cp = DevControlPlane::up()?;
    cp.kubectl(&["apply", "-f", root().join("crds").to_str().unwrap()])?;
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/managedjobs.managedjobs.dev",
    ])?;
    // SAFETY: no other thread reads the environment yet.
    unsafe { std::env::set_var("KUBECONFIG", &cp.kubeconfig) };
    let client = kube::Client::try_default().await?;
    let binary = std::env::current_exe()?.with_file_name("managed-jobs");
    anyhow::ensure!(
        binary.exists(),
        "build the operator first: cargo build --release"
    );
    let n = args.jobs;
    let hold = args.pod_seconds;
    let apply_only = args.apply_only;
    let dir = tempfile::tempdir()?;
    let tag = std::process::id();
    let mut runs = Vec::new();

    let wants = |row: &str| args.versus_systems.iter().any(|s| s == row);
    let file = dir.path().join("managedjobs.yaml");
    write_list(&file, (0..n).map(|i| managed_job(i, hold)))?;

    // 1. batch/v1 Jobs.
    if wants("jobs") {
        let ns = format!("versus-jobs-{tag}");
        create_namespace(&cp, &ns)?;
        let file = dir.path().join("jobs.yaml");
        write_list(&file, (0..n).map(|i| batch_job(i, hold)))?;
        let watch = tokio::spawn(wait_jobs_done(client.clone(), ns.clone(), n));
        let run = measure(&client, "batch/v1 Job".into(), None, async {
            let start = Instant::now();
            apply(&cp, &ns, &file)?;
            let applied_in = start.elapsed();
            let done = watch.await??;
            Ok((applied_in, Some(done.duration_since(start))))
        })
        .await?;
        runs.push(run);
        delete_namespace(&cp, &ns);
    }

    // 2. ManagedJobs into a namespace no operator watches.
    if wants("unwatched") {
        let ns = format!("versus-unwatched-{tag}");
        create_namespace(&cp, &ns)?;
        super::wait_for_finalizer_policy(&client, &ns).await?;
        let run = measure(&client, "ManagedJob, no operator".into(), None, async {
            let start = Instant::now();
            apply(&cp, &ns, &file)?;
            Ok((start.elapsed(), None))
        })
        .await?;
        runs.push(run);
        remove_finalizers(&client, &ns).await?;
        delete_namespace(&cp, &ns);
    }

    // 3. ManagedJobs with the operator working on them as they arrive; then each variant.
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    if wants("managed") {
        rows.push(("ManagedJob".into(), args.operator_arg.clone()));
    }
    for v in &args.variant {
        let (name, extra) = v
            .split_once('=')
            .with_context(|| format!("--variant {v:?}: expected NAME=ARGS"))?;
        let mut op_args = args.operator_arg.clone();
        op_args.extend(extra.split_whitespace().map(String::from));
        rows.push((format!("ManagedJob, {name}"), op_args));
    }
    for (i, (system, op_args)) in rows.into_iter().enumerate() {
        let ns = format!("versus-managed-{tag}-{i}");
        create_namespace(&cp, &ns)?;
        super::wait_for_finalizer_policy(&client, &ns).await?;
        let state = tempfile::tempdir()?;
        let mut operator = Command::new(&binary)
            .arg("run")
            .arg("--state-dir")
            .arg(state.path())
            .args(["--namespace", &ns, "--executors", "local,pod"])
            .args(&op_args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(state.path().join("operator.log"))?)
            .spawn()
            .context("starting the operator")?;
        let op_pid = operator.id() as i32;
        // Let it start and claim its namespace before the clock starts.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let watch = tokio::spawn(wait_managed_jobs_done(client.clone(), ns.clone(), n));
        let label = system.clone();
        let run = measure(&client, system, Some(op_pid), async {
            let start = Instant::now();
            apply(&cp, &ns, &file)?;
            let applied_in = start.elapsed();
            eprintln!("{label}: applied in {:.1} s", applied_in.as_secs_f64());
            if apply_only {
                watch.abort();
                return Ok((applied_in, None));
            }
            let done = watch.await??;
            Ok((applied_in, Some(done.duration_since(start))))
        })
        .await;
        // Deleted while its operator runs: it removes the jobs' finalizers.
        delete_namespace(&cp, &ns);
        let _ = operator.kill();
        let _ = operator.wait();
        runs.push(run?);
    }

    print_table(&runs, n);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report(&runs, n, hold))?)?;
    }
    Ok(())
}

/// Measures `body` (which returns the apply's wall time and when all was done): CPU of the
/// control plane's processes and of `own` (with its reaped children), and API requests.
async fn measure(
    client: &kube::Client,
    system: String,
    own: Option<i32>,
    body: impl Future<Output = anyhow::Result<(Duration, Option<Duration>)>>,
) -> anyhow::Result<Run> {
    let cpu_before = cpu_groups(own);
    let requests_before = all_requests(client).await?;
    let (applied_in, done_at) = body.await?;
    let cpu_after = cpu_groups(own);
    let requests_after = all_requests(client).await?;
    let cpu = cpu_after
        .iter()
        .map(|(k, v)| (*k, v - cpu_before.get(k).copied().unwrap_or(0.0)))
        .collect();
    let requests = requests_after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v - requests_before.get(k).copied().unwrap_or(0.0),
            )
        })
        .filter(|(_, v)| *v > 0.0)
        .collect();
    Ok(Run {
        system,
        applied_in,
        done_at,
        cpu,
        requests,
    })
}

/// CPU seconds so far of the control plane's processes, grouped as the table shows them, and of
/// `own` (utime + stime + cutime + cstime) when given.
fn cpu_groups(own: Option<i32>) -> BTreeMap<&'static str, f64> {
    let cp = control_plane_cpu();
    let get = |k: &str| cp.get(k).copied().unwrap_or(0.0);
    let mut out = BTreeMap::from([
        ("API server", get("kube-apiserver")),
        ("etcd", get("etcd")),
        (
            "kcm + scheduler + kwok",
            get("kube-controller-manager") + get("kube-scheduler") + get("kwok"),
        ),
    ]);
    if let Some(pid) = own {
        let (own, children) = cpu_seconds(pid);
        out.insert("operator", own);
        out.insert("job controllers", children);
    }
    out
}

/// `apiserver_request_total` summed by "VERB resource[/subresource]", every resource.
async fn all_requests(client: &kube::Client) -> anyhow::Result<BTreeMap<String, f64>> {
    Ok(super::apiserver_requests_of(client, |_| true)
        .await?
        .into_iter()
        .map(|((verb, resource), n)| (format!("{verb} {resource}"), n))
        .collect())
}

/// The `i`-th batch/v1 Job: one Pod of `hold` seconds (kwok completes it, `hack/stages`), the
/// same container and requests as [`managed_job`]'s, every other field at its default.
fn batch_job(i: usize, hold: u64) -> serde_json::Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": { "name": format!("bench-{i:05}") },
        "spec": { "template": {
            "metadata": { "annotations": { "managedjobs.dev/complete-after": format!("{hold}s") } },
            "spec": { "restartPolicy": "Never", "containers": [{ "name": "main", "image": "busybox",
                "resources": { "requests": { "cpu": "10m", "memory": "16Mi" } } }] }
        } }
    })
}

/// The `i`-th ManagedJob: the `pod` scenario's job.
fn managed_job(i: usize, hold: u64) -> serde_json::Value {
    super::job_yaml("pod", i, hold)
}

/// Writes `items` to `path` as one `v1/List` (JSON, which kubectl reads as YAML).
fn write_list(path: &Path, items: impl Iterator<Item = serde_json::Value>) -> anyhow::Result<()> {
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": items.collect::<Vec<_>>() });
    std::fs::write(path, serde_json::to_vec(&list)?)?;
    Ok(())
}

/// `kubectl apply -f path` into `ns`. Errors: kubectl failed (its stderr).
fn apply(cp: &DevControlPlane, ns: &str, path: &Path) -> anyhow::Result<()> {
    let out = cp.kubectl(&["apply", "-n", ns, "-f", path.to_str().unwrap()])?;
    if !out.status.success() {
        bail!("kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn create_namespace(cp: &DevControlPlane, ns: &str) -> anyhow::Result<()> {
    let out = cp.kubectl(&["create", "namespace", ns])?;
    anyhow::ensure!(
        out.status.success(),
        "creating namespace {ns}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Deletes `ns` and waits until it is gone (at most 10 minutes), so that the next run's
/// figures do not carry its deletion (the namespace controller deleting its Pods and objects).
fn delete_namespace(cp: &DevControlPlane, ns: &str) {
    let _ = cp.kubectl(&["delete", "namespace", ns, "--timeout=600s"]);
}

/// Removes the finalizer of every ManagedJob in `ns` (no operator will), 32 at a time.
async fn remove_finalizers(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|mj| mj.metadata.name)
        .collect();
    let patch = json!({ "metadata": { "finalizers": null } });
    futures::stream::iter(names)
        .map(|name| {
            let (api, patch) = (api.clone(), patch.clone());
            async move {
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Waits until `n` Jobs of `ns` are Complete or Failed (one watch); returns when the last was
/// seen. Errors: a watch error, or [`RUN_TIMEOUT`].
async fn wait_jobs_done(client: kube::Client, ns: String, n: usize) -> anyhow::Result<Instant> {
    let api: Api<Job> = Api::namespaced(client, &ns);
    let finished = |job: &Job| {
        job.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            })
    };
    wait_done(api, n, finished).await
}

/// Waits until `n` ManagedJobs of `ns` are terminal; as [`wait_jobs_done`].
async fn wait_managed_jobs_done(
    client: kube::Client,
    ns: String,
    n: usize,
) -> anyhow::Result<Instant> {
    let api: Api<ManagedJob> = Api::namespaced(client, &ns);
    wait_done(api, n, |mj: &ManagedJob| {
        mj.status
            .as_ref()
            .and_then(|s| s.phase)
            .is_some_and(|p| p.is_terminal())
    })
    .await
}

async fn wait_done<K>(
    api: Api<K>,
    n: usize,
    finished: impl Fn(&K) -> bool,
) -> anyhow::Result<Instant>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut done = std::collections::BTreeSet::new();
    let mut stream = watcher(api, watcher::Config::default())
        .applied_objects()
        .boxed();
    let deadline = tokio::time::Instant::now() + RUN_TIMEOUT;
    while done.len() < n {
        let next = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .with_context(|| format!("{} of {n} finished in {RUN_TIMEOUT:?}", done.len()))?;
        match next {
            Ok(Some(obj)) if finished(&obj) => {
                done.insert(obj.meta().name.clone().unwrap_or_default());
            }
            Ok(Some(_)) => {}
            Ok(None) => bail!("the watch ended"),
            Err(e) => bail!("watch error: {e}"),
        }
    }
    Ok(Instant::now())
}

fn ms_per_job(seconds: f64, n: usize) -> f64 {
    seconds * 1000.0 / n as f64
}

fn print_table(runs: &[Run], n: usize) {
    println!(
        "\n{n} pod jobs side by side (CPU ms per job; requests per job)\n\n\
         | | applied in | all done at | API server | etcd | kcm+scheduler+kwok | operator | job controllers | CPU total | API requests |\n\
         |---|---|---|---|---|---|---|---|---|---|"
    );
    for r in runs {
        let cpu = |k: &str| ms_per_job(r.cpu.get(k).copied().unwrap_or(0.0), n);
        let total: f64 = r.cpu.values().map(|v| ms_per_job(*v, n)).sum();
        let requests: f64 = r.requests.values().sum::<f64>() / n as f64;
        let done = r
            .done_at
            .map(|d| format!("{:.0} s", d.as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        let own = if r.cpu.contains_key("operator") {
            format!("{:.1} | {:.1}", cpu("operator"), cpu("job controllers"))
        } else {
            "(in kcm) | -".into()
        };
        println!(
            "| {} | {:.1} s | {done} | {:.1} | {:.1} | {:.1} | {own} | {total:.1} | {requests:.1} |",
            r.system,
            r.applied_in.as_secs_f64(),
            cpu("API server"),
            cpu("etcd"),
            cpu("kcm + scheduler + kwok"),
        );
    }
    for r in runs {
        let mut top: Vec<(&String, &f64)> = r.requests.iter().collect();
        top.sort_by(|a, b| b.1.total_cmp(a.1));
        let list: Vec<String> = top
            .iter()
            .take(12)
            .map(|(k, v)| format!("{k} {:.2}", *v / n as f64))
            .collect();
        println!("\n{}: requests per job: {}", r.system, list.join(", "));
    }
}

fn report(runs: &[Run], n: usize, hold: u64) -> serde_json::Value {
    json!({
        "scenario": "versus", "jobs": n, "pod_seconds": hold, "commit": super::git_commit(),
        "runs": runs.iter().map(|r| json!({
            "system": r.system,
            "applied_in_s": r.applied_in.as_secs_f64(),
            "done_at_s": r.done_at.map(|d| d.as_secs_f64()),
            "cpu_ms_per_job": r.cpu.iter().map(|(k, v)| (k.to_string(), ms_per_job(*v, n))).collect::<BTreeMap<_, _>>(),
            "requests_per_job": r.requests.iter().map(|(k, v)| (k.clone(), v / n as f64)).collect::<BTreeMap<_, _>>(),
        })).collect::<Vec<_>>(),
    })
}
