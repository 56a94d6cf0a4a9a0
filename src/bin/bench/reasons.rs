//! `--scenario reasons` (issue 43): how stale a waiting job's reason can be at `--jobs` (default
//! 10,000) waiting jobs, in the store and in the objects' status, and the status writes a
//! change of it costs.
//!
//! One namespace, one ManagedJobQueue admitting it, the operator at its default API budget
//! (`--api-qps 50 --api-burst 100` unless given) with a run cap of 1: one job of the queue
//! (`sleep`) holds the slot, then `--jobs` jobs of the queue are created (32 requests in
//! flight) and wait. Once every one shows its first reason (`RunCapReached`), the queue's
//! `maxRunning` is set to 1: every waiting job's reason becomes `QueueMaxRunning`. Measured
//! from that patch:
//!
//! - **the store**: the store is read (its file, read-only, every 100 ms) until every waiting
//!   row says `QueueMaxRunning`: when the first and the last did;
//! - **the status**: a watch from before the first create sees each job's status change: the
//!   median and the last of those times;
//! - **the writes**: the API server's `PATCH managedjobs/status` count over the change (its
//!   `apiserver_request_total`), against the jobs told.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use managed_jobs::api::{ManagedJob, ManagedJobQueue};
use serde_json::json;

use super::{Args, DevControlPlane, apiserver_requests, percentile, root, sorted};

/// The `Admitted` condition's reason of a status.
fn reason(mj: &ManagedJob) -> Option<String> {
    mj.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Admitted")
        .map(|c| c.reason.clone())
}

pub async fn scenario(args: &Args) -> anyhow::Result<()> {
    let n = args.jobs;
    let cp = DevControlPlane::up()?;
    let kubectl = |a: &[&str]| cp.kubectl(a);
    kubectl(&["apply", "-f", root().join("crds").to_str().unwrap()])?;
    // SAFETY: single-threaded at this point; set before any client reads it.
    unsafe { std::env::set_var("KUBECONFIG", &cp.kubeconfig) };
    let client = kube::Client::try_default().await?;
    let ns = format!("bench-why-{}", std::process::id());
    kubectl(&["create", "namespace", &ns])?;
    let queue = ns.clone();
    let queues: Api<ManagedJobQueue> = Api::all(client.clone());
    queues
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobQueue",
                "metadata": { "name": queue },
                "spec": { "weight": 1, "namespaceSelector": { "matchLabels": {
                    "kubernetes.io/metadata.name": ns } } },
            }))?,
        )
        .await?;
    super::wait_for_finalizer_policy(&client, &ns).await?;
    let binary = std::env::current_exe()?.with_file_name("managed-jobs");
    anyhow::ensure!(
        binary.exists(),
        "build the operator first: cargo build --release"
    );
    let state = tempfile::tempdir()?;
    let qps = if args.api_qps == 1000 {
        50
    } else {
        args.api_qps
    };
    let burst = if args.api_burst == 2000 {
        100
    } else {
        args.api_burst
    };
    let mut operator = Command::new(&binary)
        .arg("run")
        .arg("--state-dir")
        .arg(state.path())
        .args(["--namespace", &ns, "--executors", "local"])
        .args(["--launch-cap", "4", "--run-cap", "1"])
        .args([
            "--api-qps",
            &qps.to_string(),
            "--api-burst",
            &burst.to_string(),
        ])
        .args(&args.operator_arg)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(state.path().join("operator.log"))?)
        .spawn()
        .context("starting the operator")?;

    // Every job's latest reason, and when its status first said `QueueMaxRunning`.
    let reasons: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let told_at: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let watch = {
        let api: Api<ManagedJob> = Api::namespaced(client.clone(), &ns);
        let (reasons, told_at) = (reasons.clone(), told_at.clone());
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed();
            while let Ok(Some(mj)) = stream.try_next().await {
                let name = mj.metadata.name.clone().unwrap_or_default();
                let Some(r) = reason(&mj) else { continue };
                if r == "QueueMaxRunning" {
                    told_at
                        .lock()
                        .unwrap()
                        .entry(name.clone())
                        .or_insert_with(Instant::now);
                }
                reasons.lock().unwrap().insert(name, r);
            }
        })
    };
    let job = |name: &str, run: &str| -> anyhow::Result<ManagedJob> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
            "metadata": { "name": name },
            "spec": { "run": run, "queue": queue },
        }))?)
    };
    let jobs: Api<ManagedJob> = Api::namespaced(client.clone(), &ns);
    jobs.create(&PostParams::default(), &job("hold", "sleep 7200")?)
        .await?;
    let created = Instant::now();
    let names: Vec<String> = (0..n).map(|i| format!("w{i:05}")).collect();
    futures::stream::iter(names.iter().map(|name| {
        let (jobs, mj) = (jobs.clone(), job(name, "true"));
        async move {
            jobs.create(&PostParams::default(), &mj?)
                .await
                .map(|_| ())
                .map_err(anyhow::Error::from)
        }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<()>>()
    .await?;
    println!(
        "created {n} waiting jobs in {:.1} s",
        created.elapsed().as_secs_f64()
    );
    let all_say = |want: &str| {
        let r = reasons.lock().unwrap();
        names
            .iter()
            .filter(|n| r.get(*n).is_some_and(|x| x == want))
            .count()
    };
    let start = Instant::now();
    while all_say("RunCapReached") < n {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(1800),
            "only {} of {n} statuses say RunCapReached",
            all_say("RunCapReached")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "every first status written {:.1} s after the creates began",
        created.elapsed().as_secs_f64()
    );

    // The change: the queue's maxRunning lowered to the one it holds.
    let before = apiserver_requests(&client).await?;
    let changed = Instant::now();
    queues
        .patch(
            &queue,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "maxRunning": 1 } })),
        )
        .await?;
    // The store: read-only, every 100 ms, until every waiting row says it.
    let store_path = managed_jobs::state_dir::StateDir::new(state.path()).store();
    let (mut store_first, mut store_last) = (None, None);
    while store_last.is_none() {
        let conn = rusqlite::Connection::open_with_flags(
            &store_path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
        )?;
        let (told, waiting): (i64, i64) = conn.query_row(
            "SELECT sum(wait_reason = 'QueueMaxRunning'), count(*) FROM jobs
             WHERE schedule_state = 'Waiting'",
            [],
            |r| Ok((r.get::<_, Option<i64>>(0)?.unwrap_or(0), r.get(1)?)),
        )?;
        if told > 0 && store_first.is_none() {
            store_first = Some(changed.elapsed());
        }
        if told == waiting && waiting as usize == n {
            store_last = Some(changed.elapsed());
        }
        anyhow::ensure!(
            changed.elapsed() < Duration::from_secs(600),
            "the store never told them all"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while all_say("QueueMaxRunning") < n {
        anyhow::ensure!(
            changed.elapsed() < Duration::from_secs(3600),
            "only {} of {n} statuses say QueueMaxRunning",
            all_say("QueueMaxRunning")
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let status_times = sorted(
        told_at
            .lock()
            .unwrap()
            .values()
            .map(|t| t.duration_since(changed).as_secs_f64())
            .collect(),
    );
    // A moment for any write that should not happen.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = apiserver_requests(&client).await?;
    let patches = after
        .get(&("PATCH".to_string(), "managedjobs/status".to_string()))
        .copied()
        .unwrap_or(0.0)
        - before
            .get(&("PATCH".to_string(), "managedjobs/status".to_string()))
            .copied()
            .unwrap_or(0.0);
    watch.abort();
    let _ = operator.kill();
    let _ = operator.wait();
    let _ = kubectl(&["delete", "managedjobqueue", &queue, "--wait=false"]);
    let _ = kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    let report = json!({
        "scenario": "reasons",
        "waiting": n,
        "api_qps": qps,
        "store_first_s": store_first.map(|d| d.as_secs_f64()),
        "store_all_s": store_last.map(|d| d.as_secs_f64()),
        "status_p50_s": percentile(&status_times, 0.5),
        "status_all_s": status_times.last().copied(),
        "status_writes": patches,
    });
    println!(
        "{n} waiting jobs, their reason changed (maxRunning lowered), API budget {qps}/s:\n  \
         store: first row told after {:.2} s, all after {:.2} s\n  \
         status: p50 {:.1} s, all after {:.1} s\n  \
         status writes: {patches} ({:.2} per waiting job)",
        store_first.unwrap_or_default().as_secs_f64(),
        store_last.unwrap_or_default().as_secs_f64(),
        percentile(&status_times, 0.5),
        status_times.last().copied().unwrap_or(0.0),
        patches / n as f64
    );
    println!("{report}");
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}
