//! `--scenario visibility` (issue 33): the visibility API and dashboard under load.
//!
//! One namespace (`ml-research-PID`), two ManagedJobQueues admitting it (`training-PID`,
//! weight 3, and `evaluation-PID`, weight 1; a quarter of the jobs in the second), priorities
//! mixed (100, 10, 0, -10). The
//! operator runs the local executor with a run cap of `--run-cap` (default 1,000) and serves
//! the visibility API (its self-signed certificate). `--run-cap` jobs of `sleep --hold-seconds`
//! (default 7200: none ends during the run) are created and all reach Alive, then `--waiting`
//! (default 10,000) more, which wait. A ServiceAccount with a Role to list ManagedJobs in the
//! namespace is the API's caller (its token). Then:
//!
//! 1. **API latency**: `GET .../namespaces/NS/queue` (the whole answer: every waiting and
//!    live job) with 1 client, then `--clients` (default 4) concurrent clients back to back,
//!    `--requests` (default 200) requests in all, then the same asking for gzip (as browsers
//!    and kubectl do; the time includes decompressing); the every-namespace `/queue`; a
//!    waiting job's detail; `?limit=100`. Each request is timed from its send to the last byte of the answer,
//!    on keep-alive connections (a TLS handshake per client, not per request). p50, p99, max,
//!    the answer's size, answers per second, the operator's CPU per answer; and the server's
//!    own phases, from its debug log: store reads, `view::queue`, each caller's `restrict` and
//!    serialization.
//! 2. **Admissions with and without API load**, from the store's transitions. Each round
//!    cancels `--release` (default 100) Alive jobs at once (burst: the first slot freed to
//!    the last job admitted, and to the last admitted job Alive; the launch cap paces it, so
//!    this is the admission and launch throughput), then 20 more one at a time, 300 ms apart
//!    (trickle: each slot freed to the next admission, the scheduler's reaction with a launch
//!    slot free, and each admission to its job Alive). Rounds alternate without and with
//!    `--clients` clients polling the namespace's queue back to back (`--rounds` each, after
//!    one warm-up round). Those clients ask for gzip, and run in a process of their own, in a session of its own
//!    at nice 19 (its scheduling group too): they stand for users on other machines, whose
//!    decryption and reading of 5 MB answers would not share this machine's two cores (the
//!    operator's side of each request stays on them at its own priority); with
//!    `--load-in-process` they run in the benchmark's process at its priority instead; the cancelled jobs are replaced by new waiting ones between rounds,
//!    so every round starts from 1,000 alive and 10,000 waiting. The spread between rounds of
//!    one condition is the run-to-run noise the difference is compared with.
//! 3. **The dashboard** in headless Chromium (`/usr/bin/chromium`, the tests' driver
//!    `tests/support/browser.rs`), straight to the operator (the token set in the page's
//!    `sessionStorage`, as its sign-in form does), after the rounds (their cancelled jobs give
//!    each queue a pace: the page shows estimates): `--page-loads` loads of the namespace's
//!    queue page, each reporting what the page measures itself: the fetch (the answer received
//!    and parsed), the rendering (the rows' HTML built and parsed, style and layout), and the
//!    time to the frame that shows it. `--screenshot FILE` saves the page at 1400x1000.
//!
//! The namespace and the queues are deleted at the end (the operator cancels every job and
//! releases the finalizers before it is stopped).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use managed_jobs::api::ManagedJob;
use managed_jobs::state_dir::StateDir;
use serde_json::{Value, json};

use super::{
    Args, DevControlPlane, browser, control_plane_cpu, cpu_seconds, git_commit, percentile, root,
    sorted, wait_for_finalizer_policy,
};

/// The visibility API's path prefix.
const PREFIX: &str = managed_jobs::visibility::PREFIX;

/// Requests in flight while creating or patching jobs.
const IN_FLIGHT: usize = 32;

/// Runs the scenario (module doc) and prints its table and JSON.
pub async fn scenario(args: &Args) -> anyhow::Result<()> {
    let run_cap = args.run_cap.unwrap_or(1000);
    let hold = args.hold_seconds.unwrap_or(7200);
    let cp = DevControlPlane::up()?;
    let kubeconfig = cp.kubeconfig.clone();
    let kubectl = |a: &[&str]| -> anyhow::Result<String> {
        let out = cp.kubectl(a)?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {}: {}",
            a.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        root().join("crds").to_str().unwrap(),
    ])?;
    kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/managedjobs.managedjobs.dev",
        "crd/managedjobqueues.managedjobs.dev",
    ])?;
    // SAFETY: set before any client reads it, before any other thread of ours runs.
    unsafe { std::env::set_var("KUBECONFIG", &kubeconfig) };
    let client = kube::Client::try_default().await?;
    // Names as a team's (the dashboard's screenshot shows them), unique per run.
    let pid = std::process::id();
    let ns = format!("ml-research-{pid}");
    kubectl(&["create", "namespace", &ns])?;
    let queues = [
        (format!("training-{pid}"), 3),
        (format!("evaluation-{pid}"), 1),
    ];
    let queue_api: Api<managed_jobs::api::ManagedJobQueue> = Api::all(client.clone());
    for (name, weight) in &queues {
        let q = serde_json::from_value(json!({
            "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobQueue",
            "metadata": { "name": name },
            "spec": { "weight": weight, "namespaceSelector": { "matchLabels": {
                "kubernetes.io/metadata.name": ns } } },
        }))?;
        queue_api.create(&PostParams::default(), &q).await?;
    }
    let outcome = run(args, &kubectl, &client, &ns, &queues, run_cap, hold).await;
    // Delete while the operator runs (it cancels every job and releases the finalizers).
    println!("cleaning up: namespace {ns} and its queues");
    let _ = kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    for (name, _) in &queues {
        let _ = kubectl(&["delete", "managedjobqueue", name, "--wait=false"]);
    }
    let gone = Instant::now();
    while kubectl(&["get", "namespace", &ns]).is_ok() && gone.elapsed() < Duration::from_secs(1800)
    {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    println!(
        "namespace {ns} deleted in {:.0} s",
        gone.elapsed().as_secs_f64()
    );
    let (mut operator, state) = match outcome {
        Ok(Running {
            operator, state, ..
        }) => (operator, state),
        Err(e) => return Err(e),
    };
    let _ = operator.kill();
    let _ = operator.wait();
    // Job controllers outlive their operator by design: none should be left once the
    // namespace is gone; stop any that is (ours only: they name our state dir).
    let dir = state.path().to_string_lossy().into_owned();
    for pid in managed_jobs::process::find_by_arguments(&["job-controller", &dir]) {
        eprintln!("a job controller (pid {pid}) outlived the namespace: stopped");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    Ok(())
}

/// What is left to clean up after [`run`].
struct Running {
    operator: std::process::Child,
    state: tempfile::TempDir,
}

/// Everything between the namespace's creation and its deletion; returns the operator to stop
/// once the namespace is gone.
async fn run(
    args: &Args,
    kubectl: &dyn Fn(&[&str]) -> anyhow::Result<String>,
    client: &kube::Client,
    ns: &str,
    queues: &[(String, u32)],
    run_cap: usize,
    hold: u64,
) -> anyhow::Result<Running> {
    wait_for_finalizer_policy(client, ns).await?;
    // The caller: a ServiceAccount that may list ManagedJobs in the namespace, nothing more.
    kubectl(&["create", "serviceaccount", "viewer", "-n", ns])?;
    kubectl(&[
        "create",
        "role",
        "viewer",
        "-n",
        ns,
        "--verb=get,list,watch",
        "--resource=managedjobs.managedjobs.dev",
    ])?;
    kubectl(&[
        "create",
        "rolebinding",
        "viewer",
        "-n",
        ns,
        "--role=viewer",
        &format!("--serviceaccount={ns}:viewer"),
    ])?;
    let token = kubectl(&["create", "token", "viewer", "-n", ns, "--duration=4h"])?
        .trim()
        .to_string();

    let binary = std::env::current_exe()?.with_file_name("managed-jobs");
    anyhow::ensure!(
        binary.exists(),
        "build the operator first: cargo build --release --bin managed-jobs --bin bench"
    );
    let state = tempfile::tempdir()?;
    let free_port = || -> anyhow::Result<u16> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    };
    let (api_port, metrics_port) = (free_port()?, free_port()?);
    let log_path = state.path().join("operator.log");
    let mut cmd = Command::new(&binary);
    cmd.args(["--log-format", "json", "run"])
        .arg("--state-dir")
        .arg(state.path())
        .args(["--namespace", ns, "--executors", "local"])
        .args(["--run-cap", &run_cap.to_string()])
        .args(["--metrics-addr", &format!("127.0.0.1:{metrics_port}")])
        .args(["--visibility-addr", &format!("127.0.0.1:{api_port}")])
        .args([
            "--api-qps",
            &args.api_qps.to_string(),
            "--api-burst",
            &args.api_burst.to_string(),
        ])
        .args(&args.operator_arg)
        // The server's phases are logged at debug level (read back below).
        .env("RUST_LOG", "warn,managed_jobs::visibility=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path)?);
    if let Some(c) = args.launch_cap {
        cmd.args(["--launch-cap", &c.to_string()]);
    }
    let operator = cmd.spawn().context("starting the operator")?;
    let op_pid = operator.id() as i32;
    let running = Running { operator, state };
    let state_path = running.state.path().to_path_buf();
    let result = measure(
        args,
        client,
        ns,
        queues,
        run_cap,
        hold,
        &token,
        api_port,
        op_pid,
        &state_path,
    )
    .await;
    match result {
        Ok(report) => {
            print_report(&report);
            println!("{}", serde_json::to_string_pretty(&report)?);
            if let Some(path) = &args.json {
                std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
            }
            Ok(running)
        }
        Err(e) => {
            eprintln!(
                "the run failed: {e:#}; the operator's log: {}",
                log_path.display()
            );
            // Keep the log for a look; the namespace is deleted by the caller.
            let kept = std::env::temp_dir().join(format!("bench-vis-operator-{op_pid}.log"));
            let _ = std::fs::copy(&log_path, &kept);
            eprintln!("(copied to {})", kept.display());
            let mut running = running;
            let _ = kubectl(&["delete", "namespace", ns, "--wait=false"]);
            let gone = Instant::now();
            while kubectl(&["get", "namespace", ns]).is_ok()
                && gone.elapsed() < Duration::from_secs(1800)
            {
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            let _ = running.operator.kill();
            let _ = running.operator.wait();
            Err(e)
        }
    }
}

/// The `i`-th job: its name, queue and priority (a quarter in the eval queue; priorities
/// 100, 10, 0 and -10 in the proportions 1:2:6:1).
fn job(i: usize, queues: &[(String, u32)], hold: u64) -> anyhow::Result<ManagedJob> {
    let (short, queue) = if i % 4 == 3 {
        ("eval", &queues[1].0)
    } else {
        ("train", &queues[0].0)
    };
    let priority = [0, 10, 0, 100, 0, -10, 0, 10, 0, 0][i % 10];
    Ok(serde_json::from_value(json!({
        "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
        "metadata": { "name": format!("{short}-{i:05}") },
        "spec": { "run": format!("sleep {hold}"), "priority": priority, "queue": queue },
    }))?)
}

/// Creates jobs `range` ([`job`]), [`IN_FLIGHT`] at a time, retrying refusals; returns how
/// long it took.
async fn create(
    api: &Api<ManagedJob>,
    range: std::ops::Range<usize>,
    queues: &[(String, u32)],
    hold: u64,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let jobs: Vec<ManagedJob> = range
        .map(|i| job(i, queues, hold))
        .collect::<anyhow::Result<_>>()?;
    futures::stream::iter(jobs)
        .map(|mj| async move {
            loop {
                match api.create(&PostParams::default(), &mj).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(e)) if e.code == 409 => return,
                    Err(e) => {
                        eprintln!("create {:?}: {e}; retrying", mj.metadata.name);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    Ok(start.elapsed())
}

/// The operator's store, read beside it (WAL: its writes are not blocked).
struct Db(rusqlite::Connection);

impl Db {
    /// Opens the store of the state dir `state` once the operator created it.
    async fn open(state: &Path) -> anyhow::Result<Db> {
        let path = StateDir::new(state).store();
        let start = Instant::now();
        loop {
            if path.exists() {
                let conn = rusqlite::Connection::open_with_flags(
                    &path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE
                        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                conn.busy_timeout(Duration::from_secs(10))?;
                // The operator creates the schema just after the file.
                if conn
                    .query_row("SELECT count(*) FROM jobs", [], |r| r.get::<_, i64>(0))
                    .is_ok()
                {
                    return Ok(Db(conn));
                }
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(120),
                "the operator never created its store {}",
                path.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn count(&self, sql: &str) -> anyhow::Result<usize> {
        Ok(self.0.query_row(sql, [], |r| r.get::<_, i64>(0))? as usize)
    }

    /// Jobs in `state` (a schedule state).
    fn in_state(&self, state: &str) -> anyhow::Result<usize> {
        Ok(self.0.query_row(
            "SELECT count(*) FROM jobs WHERE schedule_state = ?1",
            [state],
            |r| r.get::<_, i64>(0),
        )? as usize)
    }

    /// Jobs whose status the operator has not written yet.
    fn unsynced(&self) -> anyhow::Result<usize> {
        self.count("SELECT count(*) FROM jobs WHERE status_version > synced_version")
    }

    /// Waits until `alive` jobs are Alive, `waiting` Waiting and every status is written.
    async fn settle(&self, alive: usize, waiting: usize, limit: Duration) -> anyhow::Result<()> {
        let start = Instant::now();
        loop {
            let (a, w, u) = (
                self.in_state("Alive")?,
                self.in_state("Waiting")?,
                self.unsynced()?,
            );
            if a == alive && w == waiting && u == 0 {
                return Ok(());
            }
            anyhow::ensure!(
                start.elapsed() < limit,
                "not settled within {limit:?}: {a} alive (want {alive}), {w} waiting (want {waiting}), {u} statuses unwritten"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A client of the visibility API at `port` presenting `token` (the operator's self-signed
/// certificate accepted: this is a benchmark).
fn api_client(port: u16, token: &str) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse()?);
    config.auth_info.token = Some(token.to_string().into());
    config.accept_invalid_certs = true;
    config.read_timeout = Some(Duration::from_secs(120));
    Ok(kube::Client::try_from(config)?)
}

/// One GET: (ms from the send to the whole answer, its bytes). Errors: a refusal.
/// One GET, asking for gzip with `gzip` (as browsers and kubectl do): ms from the send to the
/// whole answer read (and decompressed), its bytes of JSON and its bytes as sent. Errors: a
/// refusal.
async fn timed_get(
    client: &kube::Client,
    path: &str,
    gzip: bool,
) -> anyhow::Result<(f64, usize, usize)> {
    use std::io::Read as _;
    let start = Instant::now();
    let mut request = http::Request::get(path);
    if gzip {
        request = request.header(http::header::ACCEPT_ENCODING, "gzip");
    }
    let answer = client
        .send(request.body(Vec::new().into())?)
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = answer.status();
    let compressed = answer
        .headers()
        .get(http::header::CONTENT_ENCODING)
        .is_some_and(|v| v == "gzip");
    let sent = answer.into_body().collect_bytes().await?;
    anyhow::ensure!(
        status.is_success(),
        "GET {path}: {status}: {}",
        String::from_utf8_lossy(&sent[..sent.len().min(300)])
    );
    let json = if compressed {
        let mut out = Vec::with_capacity(sent.len() * 16);
        flate2::read::GzDecoder::new(&sent[..]).read_to_end(&mut out)?;
        out.len()
    } else {
        sent.len()
    };
    Ok((start.elapsed().as_secs_f64() * 1000.0, json, sent.len()))
}

/// `total` GETs of `path` by `clients` at once, each back to back: the latencies and the
/// operator's CPU per answer.
async fn latency(
    clients: &[kube::Client],
    path: &str,
    gzip: bool,
    total: usize,
    op_pid: i32,
) -> anyhow::Result<Value> {
    let next = Arc::new(AtomicUsize::new(0));
    let cpu_before = cpu_seconds(op_pid).0;
    let start = Instant::now();
    let tasks: Vec<_> = clients
        .iter()
        .map(|c| {
            let (c, next, path) = (c.clone(), next.clone(), path.to_string());
            tokio::spawn(async move {
                let mut out = Vec::new();
                let mut bytes = (0, 0);
                while next.fetch_add(1, Ordering::SeqCst) < total {
                    let (ms, json, sent) = timed_get(&c, &path, gzip).await?;
                    out.push(ms);
                    bytes = (json, sent);
                }
                anyhow::Ok((out, bytes))
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut bytes = (0, 0);
    for t in tasks {
        let (ms, b) = t.await??;
        all.extend(ms);
        bytes = bytes.max(b);
    }
    let wall = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds(op_pid).0 - cpu_before;
    let all = sorted(all);
    Ok(json!({
        "path": path.strip_prefix(PREFIX).unwrap_or(path),
        "gzip": gzip,
        "clients": clients.len(),
        "requests": all.len(),
        "p50_ms": percentile(&all, 0.5),
        "p99_ms": percentile(&all, 0.99),
        "max_ms": all.last().copied().unwrap_or(f64::NAN),
        "mean_ms": all.iter().sum::<f64>() / all.len().max(1) as f64,
        "answer_bytes": bytes.0,
        "sent_bytes": bytes.1,
        "answers_per_second": all.len() as f64 / wall,
        "operator_cpu_ms_per_answer": cpu * 1000.0 / all.len().max(1) as f64,
    }))
}

/// Where and how clients poll the API during the loaded admission rounds.
struct LoadSpec<'a> {
    /// In this process's runtime (with the benchmark's own priority): these clients.
    clients: &'a [kube::Client],
    /// The path they poll.
    path: &'a str,
    /// The API's port and the caller's token, for clients in a process of their own.
    port: u16,
    token: &'a str,
    /// In a process of their own at the lowest priority ([`Load::start`]), or in this one.
    remote: bool,
}

/// Clients polling a path back to back until stopped.
enum Load {
    /// Tasks of this process.
    Here {
        stop: Arc<AtomicBool>,
        tasks: Vec<tokio::task::JoinHandle<anyhow::Result<Vec<f64>>>>,
    },
    /// `bench --scenario load-client` ([`load_client`]), stopped by closing its stdin.
    Process(std::process::Child),
}

impl Load {
    /// Starts `spec.clients.len()` clients. `spec.remote`: in a process of their own, in a
    /// session of its own (its own scheduling autogroup on Linux) at nice 19, the group too:
    /// they stand for users on other machines, whose decryption and reading of 5 MB answers
    /// would not share this machine's two cores; the operator's side of every request (its
    /// TLS encryption included) stays on them at its own priority.
    fn start(spec: &LoadSpec<'_>) -> anyhow::Result<Load> {
        if !spec.remote {
            let stop = Arc::new(AtomicBool::new(false));
            let tasks = spec
                .clients
                .iter()
                .map(|c| {
                    let (c, stop, path) = (c.clone(), stop.clone(), spec.path.to_string());
                    tokio::spawn(async move {
                        let mut out = Vec::new();
                        while !stop.load(Ordering::SeqCst) {
                            out.push(timed_get(&c, &path, true).await?.0);
                        }
                        anyhow::Ok(out)
                    })
                })
                .collect();
            return Ok(Load::Here { stop, tasks });
        }
        use std::os::unix::process::CommandExt as _;
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["--scenario", "load-client", "--load-path", spec.path])
            .args(["--load-port", &spec.port.to_string()])
            .args(["--clients", &spec.clients.len().to_string()])
            .env(TOKEN_ENV, spec.token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        // SAFETY: only async-signal-safe calls between fork and exec (setsid, setpriority,
        // open, write, close), on a static path; their failures leave the priority as it was.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                libc::setpriority(libc::PRIO_PROCESS, 0, 19);
                let fd = libc::open(c"/proc/self/autogroup".as_ptr(), libc::O_WRONLY);
                if fd >= 0 {
                    libc::write(fd, b"19".as_ptr().cast(), 2);
                    libc::close(fd);
                }
                Ok(())
            });
        }
        Ok(Load::Process(
            cmd.spawn().context("starting the load clients")?,
        ))
    }

    /// Stops the clients (each after its answer under way); their latencies, ms.
    async fn stop(self) -> anyhow::Result<Vec<f64>> {
        match self {
            Load::Here { stop, tasks } => {
                stop.store(true, Ordering::SeqCst);
                let mut all = Vec::new();
                for t in tasks {
                    all.extend(t.await??);
                }
                Ok(sorted(all))
            }
            Load::Process(mut child) => {
                drop(child.stdin.take());
                let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
                anyhow::ensure!(out.status.success(), "the load clients failed");
                Ok(sorted(serde_json::from_slice(&out.stdout)?))
            }
        }
    }
}

/// The environment variable that hands the load clients their token (not on a command line).
const TOKEN_ENV: &str = "MJ_BENCH_TOKEN";

/// `bench --scenario load-client --load-port P --load-path PATH --clients K` (started by
/// [`Load::start`]): K clients polling PATH back to back until its stdin ends, then their
/// latencies (ms) on stdout as a JSON array.
pub async fn load_client(args: &Args) -> anyhow::Result<()> {
    let token = std::env::var(TOKEN_ENV).with_context(|| format!("{TOKEN_ENV} is not set"))?;
    let port = args.load_port.context("--load-port")?;
    let path = args.load_path.clone().context("--load-path")?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::Read as _;
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::SeqCst);
        });
    }
    let tasks: Vec<_> = (0..args.clients.max(1))
        .map(|_| {
            let client = api_client(port, &token)?;
            let (stop, path) = (stop.clone(), path.clone());
            Ok(tokio::spawn(async move {
                let mut out = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    out.push(timed_get(&client, &path, true).await?.0);
                }
                anyhow::Ok(out)
            }))
        })
        .collect::<anyhow::Result<_>>()?;
    let mut all: Vec<f64> = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    println!("{}", serde_json::to_string(&all)?);
    Ok(())
}

/// Jobs cancelled one at a time in the trickle part of an admission round.
const TRICKLE: usize = 20;

/// The spacing of those cancels: longer than an admission takes, so that each freed slot is
/// refilled before the next frees (the launch cap never binds).
const TRICKLE_EVERY: Duration = Duration::from_millis(300);

/// What the store's transitions show of slots freed and refilled ([`follow`]).
#[derive(Default)]
struct Refill {
    /// When each victim reached Done (its slot freed), ms since the epoch, ascending.
    freed: Vec<i64>,
    /// When each admitted job went Waiting -> Launching, ascending.
    admitted: Vec<i64>,
    /// For each admitted job, its admission to Alive, ms.
    to_alive: Vec<f64>,
    /// The last admitted job's Alive, ms since the epoch.
    last_alive: i64,
}

/// The `n` Alive jobs of `ns` with the lowest ids: (id, name).
fn alive_jobs(db: &Db, ns: &str, n: usize) -> anyhow::Result<Vec<(i64, String)>> {
    let mut stmt = db.0.prepare(
        "SELECT id, name FROM jobs WHERE namespace = ?1 AND schedule_state = 'Alive'
         ORDER BY id LIMIT ?2",
    )?;
    let jobs: Vec<(i64, String)> = stmt
        .query_map(rusqlite::params![ns, n as i64], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    anyhow::ensure!(jobs.len() == n, "fewer than {n} jobs Alive");
    Ok(jobs)
}

/// The last transition's id: what [`follow`] reads after.
fn last_transition(db: &Db) -> anyhow::Result<i64> {
    Ok(db
        .0
        .query_row("SELECT coalesce(max(id), 0) FROM transitions", [], |r| {
            r.get(0)
        })?)
}

/// Sets `spec.cancel` on `name`.
async fn cancel(api: &Api<ManagedJob>, name: &str) -> anyhow::Result<()> {
    let patch = json!({ "spec": { "cancel": true } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("cancelling {name}"))?;
    Ok(())
}

/// Follows the store's transitions after `cursor` until every one of `victims` is Done and as
/// many waiting jobs were admitted and are Alive.
async fn follow(db: &Db, mut cursor: i64, victims: &BTreeSet<i64>) -> anyhow::Result<Refill> {
    let mut freed: Vec<i64> = Vec::new();
    let mut admitted: BTreeMap<i64, i64> = BTreeMap::new();
    let mut alive: BTreeMap<i64, i64> = BTreeMap::new();
    let start = Instant::now();
    while freed.len() < victims.len() || alive.len() < victims.len() {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(600),
            "the round did not end: {} slots freed, {} admitted, {} alive",
            freed.len(),
            admitted.len(),
            alive.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut stmt = db.0.prepare_cached(
            "SELECT id, job_id, at_ms, coalesce(from_schedule, ''), to_schedule
             FROM transitions WHERE id > ?1 ORDER BY id",
        )?;
        let rows: Vec<(i64, i64, i64, String, String)> = stmt
            .query_map([cursor], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        for (id, job, at, from, to) in rows {
            cursor = id;
            if to == "Done" && from != "Done" && victims.contains(&job) {
                freed.push(at);
            } else if from == "Waiting" && to == "Launching" {
                admitted.insert(job, at);
            } else if to == "Alive" && admitted.contains_key(&job) {
                alive.entry(job).or_insert(at);
            }
        }
    }
    freed.sort_unstable();
    let mut refill = Refill {
        freed,
        last_alive: alive.values().copied().max().unwrap_or(0),
        ..Default::default()
    };
    for (job, at) in &admitted {
        refill.admitted.push(*at);
        if let Some(a) = alive.get(job) {
            refill.to_alive.push((a - at) as f64);
        }
    }
    refill.admitted.sort_unstable();
    refill.to_alive = sorted(refill.to_alive);
    Ok(refill)
}

/// One admission round, with `load` (clients polling a path back to back meanwhile) or
/// without:
/// - burst: cancels `release` Alive jobs at once and times the first slot freed to the last
///   job admitted, and to the last admitted job Alive (the launch cap paces it: what is
///   timed is the admission and launch throughput);
/// - trickle: cancels [`TRICKLE`] more one at a time, [`TRICKLE_EVERY`] apart, and times each
///   slot freed to the next admission (the scheduler's reaction, with a launch slot free) and
///   each admission to its job Alive.
async fn admission_round(
    db: &Db,
    api: &Api<ManagedJob>,
    ns: &str,
    release: usize,
    load: Option<&LoadSpec<'_>>,
) -> anyhow::Result<Value> {
    let load = load.map(Load::start).transpose()?;
    if load.is_some() {
        // The clients at their pace before the slots free.
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Burst.
    let victims = alive_jobs(db, ns, release)?;
    let cursor = last_transition(db)?;
    futures::stream::iter(victims.iter().map(|(_, name)| name.clone()))
        .map(|name| async move { cancel(api, &name).await })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let ids: BTreeSet<i64> = victims.iter().map(|v| v.0).collect();
    let burst = follow(db, cursor, &ids).await?;
    // Trickle.
    let victims = alive_jobs(db, ns, TRICKLE)?;
    let cursor = last_transition(db)?;
    let ids: BTreeSet<i64> = victims.iter().map(|v| v.0).collect();
    let cancels = async {
        for (_, name) in &victims {
            cancel(api, name).await?;
            tokio::time::sleep(TRICKLE_EVERY).await;
        }
        anyhow::Ok(())
    };
    let (cancelled, trickle) = tokio::join!(cancels, follow(db, cursor, &ids));
    cancelled?;
    let trickle = trickle?;
    let latencies = match load {
        Some(l) => Some(l.stop().await?),
        None => None,
    };
    // The i-th admission after the i-th slot freed.
    let lags = sorted(
        trickle
            .freed
            .iter()
            .zip(&trickle.admitted)
            .map(|(f, a)| (a - f) as f64)
            .collect(),
    );
    let first = burst.freed[0];
    Ok(json!({
        "load": latencies.is_some(),
        "burst_admitted": burst.admitted.len(),
        "burst_first_slot_to_last_admitted_s":
            (burst.admitted.last().copied().unwrap_or(first) - first) as f64 / 1000.0,
        "burst_first_slot_to_last_alive_s": (burst.last_alive - first) as f64 / 1000.0,
        "trickle_slot_to_admission_ms_p50": percentile(&lags, 0.5),
        "trickle_slot_to_admission_ms_max": lags.last().copied(),
        "trickle_admission_to_alive_ms_p50": percentile(&trickle.to_alive, 0.5),
        "trickle_admission_to_alive_ms_max": trickle.to_alive.last().copied(),
        "trickle_slot_to_admission_ms": lags,
        "api_requests_during": latencies.as_ref().map(Vec::len),
        "api_ms_p50_during": latencies.as_ref().map(|l| percentile(l, 0.5)),
        "api_ms_p99_during": latencies.as_ref().map(|l| percentile(l, 0.99)),
    }))
}

/// Mean, standard deviation, min and max of `key` over `rounds`.
fn spread(rounds: &[&Value], key: &str) -> Value {
    let v: Vec<f64> = rounds.iter().filter_map(|r| r[key].as_f64()).collect();
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let sd = (v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    json!({
        "mean": mean,
        "sd": sd,
        "min": v.iter().copied().fold(f64::INFINITY, f64::min),
        "max": v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        "values": v,
    })
}

/// The server's phases from its debug log lines (`visibility API: queue ...`): for each
/// message and field, (p50, p99, count) over the lines whose `waiting` is at least
/// `min_waiting`.
fn server_phases(log: &Path, min_waiting: u64) -> Value {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in text.lines().filter(|l| l.contains("visibility API: queue")) {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["waiting"].as_u64().unwrap_or(0) < min_waiting {
            continue;
        }
        for key in [
            "reads_ms",
            "view_ms",
            "total_ms",
            "restrict_ms",
            "serialize_ms",
        ] {
            if let Some(x) = v[key].as_f64() {
                by.entry(key.to_string()).or_default().push(x);
            }
        }
    }
    let mut out = serde_json::Map::new();
    for (k, v) in by {
        let v = sorted(v);
        out.insert(
            k,
            json!({ "p50": percentile(&v, 0.5), "p99": percentile(&v, 0.99), "n": v.len() }),
        );
    }
    Value::Object(out)
}

/// Loads the dashboard at `url` `loads` times in Chromium with `token` (set as its sign-in
/// form does), each load's own timings; a screenshot at the end when asked.
fn dashboard(url: &str, token: &str, loads: usize, screenshot: Option<&Path>) -> Value {
    let Some(b) = browser::Browser::launch_with(1400, 1000, &["--ignore-certificate-errors"])
    else {
        return json!({ "skipped": format!("Chromium is not installed ({})", browser::CHROMIUM) });
    };
    let page = b.open(url);
    page.set_viewport(1400, 1000);
    // Without a token the page asks for one.
    page.wait_for(
        "document.body.dataset.ready === 'error'",
        Duration::from_secs(60),
    );
    page.eval(&format!(
        "sessionStorage.setItem('mj-token', {}); true",
        serde_json::to_string(token).unwrap()
    ));
    let mut runs = Vec::new();
    for _ in 0..loads {
        let start = Instant::now();
        page.navigate(url);
        page.wait_for(
            "document.body.dataset.paintMs !== undefined",
            Duration::from_secs(120),
        );
        let wall = start.elapsed().as_secs_f64() * 1000.0;
        let d = page.eval("JSON.stringify(document.body.dataset)");
        let d: Value = serde_json::from_str(d.as_str().unwrap_or("{}")).unwrap_or_default();
        let num = |k: &str| d[k].as_str().and_then(|v| v.parse::<f64>().ok());
        runs.push(json!({
            "fetch_ms": num("fetchMs"),
            "render_ms": num("renderMs"),
            "to_frame_ms": num("paintMs"),
            "rows": num("rows"),
            "navigation_to_frame_ms": wall,
        }));
    }
    if let Some(path) = screenshot {
        // The queue page as it is first shown: caps, plot, the head of the waiting list.
        page.eval("window.scrollTo(0, 0); true");
        std::thread::sleep(Duration::from_millis(500));
        let bytes = page.screenshot(path);
        println!("dashboard screenshot: {} ({bytes} bytes)", path.display());
    }
    let col = |k: &str| -> Value {
        let v = sorted(runs.iter().filter_map(|r| r[k].as_f64()).collect());
        json!({ "p50": percentile(&v, 0.5), "max": v.last().copied() })
    };
    json!({
        "loads": runs.len(),
        "fetch_ms": col("fetch_ms"),
        "render_ms": col("render_ms"),
        "to_frame_ms": col("to_frame_ms"),
        "navigation_to_frame_ms": col("navigation_to_frame_ms"),
        "rows": runs.first().map(|r| r["rows"].clone()),
        "each": runs,
    })
}

/// The measurements, once the namespace exists and the operator was started.
#[allow(clippy::too_many_arguments)]
async fn measure(
    args: &Args,
    client: &kube::Client,
    ns: &str,
    queues: &[(String, u32)],
    run_cap: usize,
    hold: u64,
    token: &str,
    api_port: u16,
    op_pid: i32,
    state: &Path,
) -> anyhow::Result<Value> {
    let db = Db::open(state).await?;
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), ns);
    let cp_before = control_plane_cpu();
    // The alive ones first (admitted as they come), then the waiting ones.
    let t = create(&api, 0..run_cap, queues, hold).await?;
    println!(
        "created {run_cap} jobs in {:.1} s; waiting for all to be Alive",
        t.as_secs_f64()
    );
    db.settle(run_cap, 0, Duration::from_secs(900)).await?;
    let total = run_cap + args.waiting;
    let t = create(&api, run_cap..total, queues, hold).await?;
    let create_waiting_s = t.as_secs_f64();
    println!(
        "created {} waiting jobs in {create_waiting_s:.1} s; waiting for their statuses",
        args.waiting
    );
    db.settle(run_cap, args.waiting, Duration::from_secs(1800))
        .await?;
    let mut next = total;
    // The plot's samples are every 10 s: let it show the queue as it is now.
    tokio::time::sleep(Duration::from_secs(12)).await;

    // 1. API latency.
    let clients: Vec<kube::Client> = (0..args.clients.max(1))
        .map(|_| api_client(api_port, token))
        .collect::<anyhow::Result<_>>()?;
    let ns_queue = format!("{PREFIX}/namespaces/{ns}/queue");
    // Warm-up: connections, the reviews' cache.
    let answer: Value = serde_json::from_str(
        &clients[0]
            .request_text(http::Request::get(&ns_queue).body(Vec::new())?)
            .await?,
    )?;
    anyhow::ensure!(
        answer["waitingTotal"].as_u64() == Some(args.waiting as u64)
            && answer["live"].as_array().map(Vec::len) == Some(run_cap),
        "the API shows {} waiting and {} live, not {} and {run_cap}",
        answer["waitingTotal"],
        answer["live"].as_array().map_or(0, Vec::len),
        args.waiting
    );
    // A job in the middle of the waiting list, for its detail.
    let middle = answer["waiting"][args.waiting / 2]["name"]
        .as_str()
        .context("no waiting job")?
        .to_string();
    drop(answer);
    for c in &clients {
        timed_get(c, &ns_queue, false).await?;
    }
    let log = state.join("operator.log");
    let log_mark = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let mut api_figures = Vec::new();
    println!("API latency: {ns_queue}");
    api_figures.push(latency(&clients[..1], &ns_queue, false, 50, op_pid).await?);
    api_figures.push(latency(&clients, &ns_queue, false, args.requests, op_pid).await?);
    // As browsers and kubectl ask: compressed.
    api_figures.push(latency(&clients, &ns_queue, true, args.requests, op_pid).await?);
    // The server's phases for the namespace's answers so far.
    let phases = {
        let text = std::fs::read(&log).unwrap_or_default();
        let tail = state.join("operator-latency.log");
        std::fs::write(&tail, &text[log_mark as usize..])?;
        server_phases(&tail, args.waiting as u64)
    };
    // Every namespace's queue, a job's detail, the namespace's first 100.
    for path in [
        format!("{PREFIX}/queue"),
        format!("{PREFIX}/namespaces/{ns}/managedjobs/{middle}"),
        format!("{ns_queue}?limit=100"),
    ] {
        api_figures.push(latency(&clients, &path, false, args.requests, op_pid).await?);
    }

    // 2. Admissions without and with API load.
    let mut rounds = Vec::new();
    let mut pooled: BTreeMap<bool, Vec<f64>> = BTreeMap::new();
    let schedule: Vec<Option<bool>> = std::iter::once(None)
        .chain((0..args.rounds).flat_map(|_| [Some(false), Some(true)]))
        .collect();
    for (k, load) in schedule.iter().enumerate() {
        println!(
            "admission round {k}: {}",
            match load {
                None => "warm-up".to_string(),
                Some(false) => "no API client".to_string(),
                Some(true) => format!("{} API clients", clients.len()),
            }
        );
        let spec = LoadSpec {
            clients: &clients,
            path: &ns_queue,
            port: api_port,
            token,
            remote: !args.load_in_process,
        };
        let with = load.unwrap_or(false).then_some(&spec);
        let mut r = admission_round(&db, &api, ns, args.release, with).await?;
        println!("  {r}");
        // Replaced by as many new waiting jobs: every round starts alike.
        let replaced = args.release + TRICKLE;
        create(&api, next..next + replaced, queues, hold).await?;
        next += replaced;
        // The trickle's lags, pooled by condition, in the report.
        if let Some(load) = load
            && let Some(l) = r
                .as_object_mut()
                .and_then(|o| o.remove("trickle_slot_to_admission_ms"))
        {
            pooled
                .entry(*load)
                .or_default()
                .extend(l.as_array().into_iter().flatten().filter_map(Value::as_f64));
        }
        db.settle(run_cap, args.waiting, Duration::from_secs(600))
            .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        if load.is_some() {
            r["round"] = json!(k);
            rounds.push(r);
        }
    }
    // 3. The dashboard (after the rounds: their cancelled jobs give the queues a pace, so
    // the page shows estimates).
    println!("dashboard: {} loads in Chromium", args.page_loads);
    let url = format!("https://127.0.0.1:{api_port}{PREFIX}/namespaces/{ns}/dashboard");
    let (tok, shot, loads) = (
        token.to_string(),
        args.screenshot.clone(),
        args.page_loads.max(1),
    );
    let dash =
        tokio::task::spawn_blocking(move || dashboard(&url, &tok, loads, shot.as_deref())).await?;

    let without: Vec<&Value> = rounds.iter().filter(|r| r["load"] == false).collect();
    let with: Vec<&Value> = rounds.iter().filter(|r| r["load"] == true).collect();
    let mut admissions = serde_json::Map::new();
    for key in [
        "burst_first_slot_to_last_alive_s",
        "burst_first_slot_to_last_admitted_s",
        "trickle_slot_to_admission_ms_p50",
        "trickle_slot_to_admission_ms_max",
        "trickle_admission_to_alive_ms_p50",
    ] {
        let (a, b) = (spread(&without, key), spread(&with, key));
        let diff = b["mean"].as_f64().unwrap_or(0.0) - a["mean"].as_f64().unwrap_or(0.0);
        admissions.insert(
            key.to_string(),
            json!({
                "without_api_clients": a,
                "with_api_clients": b,
                "difference_of_means": diff,
                "difference_percent": 100.0 * diff / a["mean"].as_f64().unwrap_or(f64::NAN),
            }),
        );
    }
    let pooled_figures = |load: bool| {
        let v = sorted(pooled.get(&load).cloned().unwrap_or_default());
        json!({ "p50": percentile(&v, 0.5), "p90": percentile(&v, 0.9),
            "max": v.last().copied(), "n": v.len() })
    };
    admissions.insert(
        "trickle_slot_to_admission_ms_pooled".into(),
        json!({
            "without_api_clients": pooled_figures(false),
            "with_api_clients": pooled_figures(true),
        }),
    );
    let cp_cpu: BTreeMap<String, f64> = control_plane_cpu()
        .into_iter()
        .map(|(k, v)| {
            let before = cp_before.get(&k).copied().unwrap_or(0.0);
            (k, v - before)
        })
        .collect();
    let load_avg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    Ok(json!({
        "scenario": "visibility",
        "commit": git_commit(),
        "alive": run_cap,
        "waiting": args.waiting,
        "queues": queues.iter().map(|q| format!("{} (weight {})", q.0, q.1)).collect::<Vec<_>>(),
        "create_waiting_seconds": create_waiting_s,
        "api": api_figures,
        "server_phases_namespace_queue_ms": phases,
        "dashboard": dash,
        "admission_rounds": rounds,
        "admissions": admissions,
        "release_per_round": args.release,
        "api_clients": clients.len(),
        "load_clients": if args.load_in_process {
            "in the benchmark's process, at its priority"
        } else {
            "a process of their own in a session of their own, nice 19 (standing for remote users)"
        },
        "operator_cpu_seconds": cpu_seconds(op_pid).0,
        "control_plane_cpu_seconds": cp_cpu,
        "load_average_at_end": load_avg.trim(),
    }))
}

/// The table: one line per figure.
fn print_report(r: &Value) {
    println!("\n{:<58} value", "figure");
    let line = |k: String, v: String| println!("{k:<58} {v}");
    let f = |v: &Value| match v.as_f64() {
        Some(x) => format!("{x:.1}"),
        None => v.to_string(),
    };
    line(
        "jobs alive / waiting".into(),
        format!("{} / {}", r["alive"], r["waiting"]),
    );
    for a in r["api"].as_array().into_iter().flatten() {
        line(
            format!(
                "GET {} ({} clients{})",
                a["path"].as_str().unwrap_or(""),
                a["clients"],
                if a["gzip"] == true { ", gzip" } else { "" }
            ),
            format!(
                "p50 {} ms, p99 {} ms, max {} ms; {} bytes ({} sent); {} answers/s; operator CPU {} ms/answer",
                f(&a["p50_ms"]),
                f(&a["p99_ms"]),
                f(&a["max_ms"]),
                a["answer_bytes"],
                a["sent_bytes"],
                f(&a["answers_per_second"]),
                f(&a["operator_cpu_ms_per_answer"])
            ),
        );
    }
    for (k, v) in r["server_phases_namespace_queue_ms"]
        .as_object()
        .into_iter()
        .flatten()
    {
        line(
            format!("server phase {k}"),
            format!(
                "p50 {} ms, p99 {} ms (n {})",
                f(&v["p50"]),
                f(&v["p99"]),
                v["n"]
            ),
        );
    }
    let d = &r["dashboard"];
    if d.get("skipped").is_some() {
        line("dashboard".into(), d["skipped"].to_string());
    } else {
        for k in [
            "fetch_ms",
            "render_ms",
            "to_frame_ms",
            "navigation_to_frame_ms",
        ] {
            line(
                format!("dashboard {k} ({} loads, {} rows)", d["loads"], d["rows"]),
                format!("p50 {}, max {}", f(&d[k]["p50"]), f(&d[k]["max"])),
            );
        }
    }
    for (k, v) in r["admissions"].as_object().into_iter().flatten() {
        let (a, b) = (&v["without_api_clients"], &v["with_api_clients"]);
        if a.get("p50").is_some() {
            line(
                format!("admissions {k}"),
                format!(
                    "without p50 {} p90 {} max {} (n {}); with p50 {} p90 {} max {} (n {})",
                    f(&a["p50"]),
                    f(&a["p90"]),
                    f(&a["max"]),
                    a["n"],
                    f(&b["p50"]),
                    f(&b["p90"]),
                    f(&b["max"]),
                    b["n"]
                ),
            );
            continue;
        }
        line(
            format!("admissions {k}"),
            format!(
                "without {} ± {} (min {}, max {}); with {} ± {} (min {}, max {}); difference {} ({}%)",
                f(&a["mean"]),
                f(&a["sd"]),
                f(&a["min"]),
                f(&a["max"]),
                f(&b["mean"]),
                f(&b["sd"]),
                f(&b["min"]),
                f(&b["max"]),
                f(&v["difference_of_means"]),
                f(&v["difference_percent"])
            ),
        );
    }
    line(
        "operator CPU over the run (s)".into(),
        f(&r["operator_cpu_seconds"]),
    );
    line(
        "load average at the end".into(),
        r["load_average_at_end"].to_string(),
    );
}
