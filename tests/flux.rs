//! ManagedJobs under real Flux (issue 24): source-controller and kustomize-controller v1.9.6,
//! built from their Go modules and started by `hack/flux.sh up` beside the dev control plane,
//! sync ManagedJobs from a git repository served on localhost (`git http-backend`) into a test
//! namespace, through a Kustomization with `wait: true` and `prune: true`; a real operator runs
//! the jobs.
//!
//! Each test commits to its own bare repository and asks Flux for a reconcile when it wants one
//! (the intervals are long). A watch on the test's ManagedJobs and one on its Kustomization
//! record every version from the start, so what must never happen is counted over the whole
//! test: the Kustomization Ready before every job Succeeded, a job seen with a second uid or
//! attempt, a job controller started twice.
//!
//! Needs the Flux binaries (`hack/flux.sh build`, run by hack/test.sh): without them the tests
//! skip, or fail under `CI`.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use managed_jobs::api::{JobPhase, ManagedJob};

/// How long any one step may take before the test gives up (Flux polls health every 5 s).
const T: Duration = Duration::from_secs(120);

/// The Flux instance `hack/flux.sh up` started: where its git server serves from.
struct Flux {
    git_root: PathBuf,
    git_url: String,
}

fn flux_script() -> PathBuf {
    support::root().join("hack/flux.sh")
}

fn flux_built() -> bool {
    let out = Command::new(flux_script())
        .args(["bin-dir", "kustomize-controller"])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
            Path::new(&dir).join("kustomize-controller").exists()
        }
        _ => false,
    }
}

/// Flux against the shared control plane, started once per test binary; None (the test skips)
/// when its binaries were never built, except under `CI`, where that fails.
fn flux(cp: &support::ControlPlane) -> Option<&'static Flux> {
    static FLUX: OnceLock<Option<Flux>> = OnceLock::new();
    FLUX.get_or_init(|| {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty());
        if !flux_built() {
            assert!(
                !ci,
                "CI is set but the Flux binaries are not built: run `hack/flux.sh build` first"
            );
            return None;
        }
        let out = Command::new(flux_script())
            .arg("up")
            .env("KUBECONFIG", &cp.kubeconfig)
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("running hack/flux.sh up");
        assert!(out.status.success(), "hack/flux.sh up failed");
        let env_file = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        let env: BTreeMap<String, String> = std::fs::read_to_string(&env_file)
            .expect("Flux's env file")
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Some(Flux {
            git_root: PathBuf::from(&env["FLUX_GIT_ROOT"]),
            git_url: env["FLUX_GIT_URL"].clone(),
        })
    })
    .as_ref()
}

macro_rules! flux_or_skip {
    ($cp:expr) => {
        match flux($cp) {
            Some(f) => f,
            None => {
                support::record_skip(&format!("{}:{} (no Flux binaries)", file!(), line!()));
                return;
            }
        }
    };
}

/// A git repository of the test's own: a bare repository the git server serves, and a work
/// tree the test commits in and pushes from.
struct Repo {
    bare: PathBuf,
    work: tempfile::TempDir,
    url: String,
}

impl Repo {
    fn new(flux: &Flux, name: &str) -> Repo {
        let bare = flux.git_root.join(format!("{name}.git"));
        let _ = std::fs::remove_dir_all(&bare);
        git(
            &flux.git_root,
            &["init", "-q", "--bare", "-b", "main", &format!("{name}.git")],
        );
        let work = tempfile::tempdir().unwrap();
        git(work.path(), &["init", "-q", "-b", "main"]);
        Repo {
            url: format!("{}/{name}.git", flux.git_url),
            bare,
            work,
        }
    }

    /// Writes `files` (path -> content; None removes it) under `jobs/`, commits and pushes;
    /// returns the commit's sha.
    fn commit(&self, files: &[(&str, Option<&str>)], message: &str) -> String {
        let dir = self.work.path().join("jobs");
        std::fs::create_dir_all(&dir).unwrap();
        for (path, content) in files {
            match content {
                Some(text) => std::fs::write(dir.join(path), text).unwrap(),
                None => std::fs::remove_file(dir.join(path)).unwrap(),
            }
        }
        let w = self.work.path();
        git(w, &["add", "-A"]);
        git(w, &["commit", "-q", "--allow-empty", "-m", message]);
        git(w, &["push", "-q", self.bare.to_str().unwrap(), "HEAD:main"]);
        git_out(w, &["rev-parse", "HEAD"])
    }
}

impl Drop for Repo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.bare);
    }
}

fn git_out(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn git(dir: &Path, args: &[&str]) {
    git_out(dir, args);
}

fn kustomization_resource() -> ApiResource {
    ApiResource {
        group: "kustomize.toolkit.fluxcd.io".into(),
        version: "v1".into(),
        api_version: "kustomize.toolkit.fluxcd.io/v1".into(),
        kind: "Kustomization".into(),
        plural: "kustomizations".into(),
    }
}

fn git_repository_resource() -> ApiResource {
    ApiResource {
        group: "source.toolkit.fluxcd.io".into(),
        version: "v1".into(),
        api_version: "source.toolkit.fluxcd.io/v1".into(),
        kind: "GitRepository".into(),
        plural: "gitrepositories".into(),
    }
}

/// One version of a job or of the Kustomization, as a watch delivered it.
#[derive(Clone, Debug)]
enum Seen {
    Job {
        at: Instant,
        name: String,
        uid: String,
        phase: Option<JobPhase>,
        attempt: i32,
        workload: Option<String>,
    },
    Kustomization {
        at: Instant,
        ready: String,
        applied: String,
    },
}

/// A test's namespace with its operator, its repository and the Flux objects syncing one into
/// the other, and the watches recording every version.
struct Sync {
    client: Client,
    ns: support::TestNamespace,
    op: support::OperatorProcess,
    repo: Repo,
    seen: Arc<Mutex<Vec<Seen>>>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Sync {
    fn drop(&mut self) {
        for w in &self.watches {
            w.abort();
        }
    }
}

const KUSTOMIZATION: &str = "jobs";

impl Sync {
    /// Creates the namespace, starts an operator for it, commits `files` and creates the
    /// GitRepository and the Kustomization (`wait: true`, `prune: true`, `timeout`).
    async fn start(
        cp: &'static support::ControlPlane,
        flux: &Flux,
        prefix: &str,
        timeout: &str,
        files: &[(&str, Option<&str>)],
    ) -> (Sync, String) {
        let client = support::client(cp).await;
        let ns = support::TestNamespace::new(&client, cp, prefix).await;
        let op = support::OperatorProcess::start(cp, &ns.name, &[]);
        let repo = Repo::new(flux, &ns.name);
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let watches = vec![
            watch_jobs(&client, &ns.name, seen.clone()).await,
            watch_kustomization(&client, &ns.name, seen.clone()).await,
        ];
        let sha = repo.commit(files, "first");
        // The recipe of docs/tasks/gitops.md, with this test's names, repository, intervals and
        // timeout: the intervals are long so that reconciles happen when the test asks for them.
        let recipe =
            std::fs::read_to_string(support::root().join("examples/gitops/flux/jobs.yaml"))
                .expect("examples/gitops/flux/jobs.yaml");
        let mut objects = String::new();
        for doc in serde_norway::Deserializer::from_str(&recipe) {
            use serde::Deserialize as _;
            let mut o = serde_json::Value::deserialize(doc).expect("the recipe parses");
            o["metadata"]["namespace"] = ns.name.clone().into();
            match o["kind"].as_str() {
                Some("GitRepository") => {
                    o["spec"]["url"] = repo.url.clone().into();
                    o["spec"]["interval"] = "10m".into();
                }
                Some("Kustomization") => {
                    o["metadata"]["name"] = KUSTOMIZATION.into();
                    o["spec"]["targetNamespace"] = ns.name.clone().into();
                    o["spec"]["interval"] = "10m".into();
                    o["spec"]["retryInterval"] = "10m".into();
                    o["spec"]["timeout"] = timeout.into();
                    assert_eq!(o["spec"]["wait"], true);
                    assert_eq!(o["spec"]["prune"], true);
                }
                other => panic!("unexpected kind {other:?} in the recipe"),
            }
            objects.push_str("---\n");
            objects.push_str(&serde_json::to_string(&o).unwrap());
            objects.push('\n');
        }
        let path = repo.work.path().join("flux.yaml");
        std::fs::write(&path, objects).unwrap();
        let (ok, out) = support::kubectl(cp, &["apply", "-f", path.to_str().unwrap()]);
        assert!(
            ok,
            "creating the GitRepository and the Kustomization: {out}"
        );
        (
            Sync {
                client,
                ns,
                op,
                repo,
                seen,
                watches,
            },
            sha,
        )
    }

    /// Commits and pushes `files`, and asks source-controller to fetch at once; returns the
    /// commit's sha.
    async fn push(&self, files: &[(&str, Option<&str>)], message: &str) -> String {
        let sha = self.repo.commit(files, message);
        self.request_reconcile(&git_repository_resource(), "jobs")
            .await;
        sha
    }

    /// `reconcile.fluxcd.io/requestedAt` on a Flux object: reconcile it now.
    async fn request_reconcile(&self, ar: &ApiResource, name: &str) {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.ns.name, ar);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            .to_string();
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {"reconcile.fluxcd.io/requestedAt": now}}
            })),
        )
        .await
        .expect("annotating a Flux object");
    }

    /// Waits until the Kustomization's last attempt is `sha` and its Ready condition satisfies
    /// `pred` (status, reason, message); returns that (status, reason, message).
    async fn wait_kustomization(
        &self,
        sha: &str,
        what: &str,
        pred: impl Fn(&str, &str, &str) -> bool,
    ) -> (String, String, String) {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.ns.name,
            &kustomization_resource(),
        );
        let start = Instant::now();
        loop {
            let k = api.get(KUSTOMIZATION).await.expect("get the Kustomization");
            let (ready, reason, message, attempted, _) = kustomization_state(&k);
            if attempted.ends_with(sha) && pred(&ready, &reason, &message) {
                return (ready, reason, message);
            }
            assert!(
                start.elapsed() < T,
                "Kustomization never reached {what} for {sha}: Ready={ready} {reason}: {message} (last attempted {attempted})\n{}",
                self.flux_log_tail()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn flux_log_tail(&self) -> String {
        let cache = std::env::var("MJ_CACHE_DIR").unwrap_or_else(|_| {
            format!(
                "{}/.cache/managed-jobs",
                std::env::var("HOME").unwrap_or_default()
            )
        });
        format!("Flux's logs: {cache}/controlplane/run/flux/logs")
    }

    fn jobs(&self) -> Api<ManagedJob> {
        Api::namespaced(self.client.clone(), &self.ns.name)
    }

    async fn wait_phase(&self, name: &str, phase: JobPhase) -> ManagedJob {
        support::wait_status(
            &self.client,
            &self.ns.name,
            name,
            T,
            phase.as_str(),
            support::phase_is(phase),
        )
        .await
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Every uid and every attempt the watch saw of job `name`.
    fn uids_and_attempts(&self, name: &str) -> (Vec<String>, Vec<i32>) {
        let mut uids = Vec::new();
        let mut attempts = Vec::new();
        for s in self.seen() {
            if let Seen::Job {
                name: n,
                uid,
                attempt,
                ..
            } = s
                && n == name
            {
                if !uids.contains(&uid) {
                    uids.push(uid);
                }
                if attempt > 0 && !attempts.contains(&attempt) {
                    attempts.push(attempt);
                }
            }
        }
        (uids, attempts)
    }

    /// How many times the operator started a job controller for store id `job_id`.
    fn controller_starts(&self, job_id: i64) -> usize {
        self.op
            .log()
            .matches(&format!("job controller process started job_id={job_id} "))
            .count()
    }

    /// The Kustomization versions with Ready True whose applied revision is `sha`, with when
    /// each arrived.
    fn ready_at(&self, sha: &str) -> Option<Instant> {
        self.seen().into_iter().find_map(|s| match s {
            Seen::Kustomization {
                at, ready, applied, ..
            } if ready == "True" && applied.ends_with(sha) => Some(at),
            _ => None,
        })
    }

    /// When the watch first saw job `name` Succeeded.
    fn succeeded_at(&self, name: &str) -> Option<Instant> {
        self.seen().into_iter().find_map(|s| match s {
            Seen::Job {
                at,
                name: n,
                phase: Some(JobPhase::Succeeded),
                ..
            } if n == name => Some(at),
            _ => None,
        })
    }
}

fn kustomization_state(k: &DynamicObject) -> (String, String, String, String, String) {
    let status = &k.data["status"];
    let ready = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready");
    let field = |v: Option<&serde_json::Value>, f: &str| {
        v.and_then(|c| c[f].as_str())
            .unwrap_or_default()
            .to_string()
    };
    (
        field(ready, "status"),
        field(ready, "reason"),
        field(ready, "message"),
        status["lastAttemptedRevision"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        status["lastAppliedRevision"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

async fn watch_jobs(
    client: &Client,
    ns: &str,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), ns);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(mj) | watcher::Event::InitApply(mj)) => {
                    let s = mj.status.clone().unwrap_or_default();
                    seen.lock().unwrap().push(Seen::Job {
                        at: Instant::now(),
                        name: mj.name_any(),
                        uid: mj.uid().unwrap_or_default(),
                        phase: s.phase,
                        attempt: s.attempt,
                        workload: s.workload,
                    });
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    });
    rx.await.expect("the job watch starts");
    task
}

async fn watch_kustomization(
    client: &Client,
    ns: &str,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> tokio::task::JoinHandle<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &kustomization_resource());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut tx = Some(tx);
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Apply(k) | watcher::Event::InitApply(k)) => {
                    let (ready, _, _, _, applied) = kustomization_state(&k);
                    seen.lock().unwrap().push(Seen::Kustomization {
                        at: Instant::now(),
                        ready,
                        applied,
                    });
                }
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                _ => {}
            }
        }
    });
    rx.await.expect("the Kustomization watch starts");
    task
}

fn job(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

/// `wait: true` means the jobs finished: three new jobs (a quick one, one that runs a few
/// seconds, a three-task pipeline) are applied; the Kustomization turns Ready only after the
/// watch saw every one of them Succeeded, and never before (counted over every version the
/// watch saw). Each job ran once: one uid, one attempt, one job controller start.
#[tokio::test]
async fn flux_is_ready_only_after_every_job_succeeded() {
    let cp = control_plane_or_skip!();
    let flux = flux_or_skip!(cp);
    let quick = job("quick", "  run: echo quick\n");
    let slow = job("slow", "  run: sleep 4; echo slow\n");
    let pipeline = job(
        "pipeline",
        "  tasks:\n    - {name: prepare, run: 'sleep 2'}\n    - {name: train, run: 'sleep 2'}\n    - {name: evaluate, run: 'echo done'}\n",
    );
    let (sync, sha) = Sync::start(
        cp,
        flux,
        "flux-wait",
        "2m",
        &[
            ("quick.yaml", Some(&quick)),
            ("slow.yaml", Some(&slow)),
            ("pipeline.yaml", Some(&pipeline)),
        ],
    )
    .await;
    let start = Instant::now();
    let (_, _, message) = sync
        .wait_kustomization(&sha, "Ready", |ready, _, _| ready == "True")
        .await;
    println!(
        "Kustomization Ready after {:.1} s: {message}",
        start.elapsed().as_secs_f64()
    );
    // The GET above may see Ready before the watch delivers that version: wait for the watch.
    let mut ready = sync.ready_at(&sha);
    let caught_up = Instant::now();
    while ready.is_none() && caught_up.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        ready = sync.ready_at(&sha);
    }
    let ready = ready.expect("the watch saw Ready");
    for name in ["quick", "slow", "pipeline"] {
        let done = sync
            .succeeded_at(name)
            .unwrap_or_else(|| panic!("{name} never Succeeded"));
        assert!(
            done < ready,
            "the Kustomization was Ready before {name} Succeeded"
        );
        let (uids, attempts) = sync.uids_and_attempts(name);
        assert_eq!(uids.len(), 1, "{name}: uids {uids:?}");
        let id = sync
            .jobs()
            .get(name)
            .await
            .unwrap()
            .status
            .and_then(|s| s.job_id)
            .unwrap();
        assert_eq!(sync.controller_starts(id), 1, "{name}");
        if name != "pipeline" {
            assert_eq!(attempts, vec![1], "{name}: attempts");
        }
    }
    // What must never happen, over the whole test: a Ready Kustomization while a job it
    // applied had not Succeeded.
    let mut phase: BTreeMap<String, Option<JobPhase>> = BTreeMap::new();
    for s in sync.seen() {
        match s {
            Seen::Job { name, phase: p, .. } => {
                phase.insert(name, p);
            }
            Seen::Kustomization { ready, applied, .. } if ready == "True" => {
                for name in ["quick", "slow", "pipeline"] {
                    assert_eq!(
                        phase.get(name).copied().flatten(),
                        Some(JobPhase::Succeeded),
                        "Ready (revision {applied}) while {name} was {:?}",
                        phase.get(name)
                    );
                }
            }
            _ => {}
        }
    }
}

/// A failing job fails the Kustomization at once (Flux's fail-fast on a Stalled object, not
/// its timeout), naming the job; the job's own message (its exit code, the restarts spent) is
/// on its Stalled and Ready conditions, in its Failed Event, and in a Warning Event
/// `ManagedJobFailed` the operator publishes regarding the Kustomization. Flux v1.9.6 itself
/// prints only the object and its kstatus status in its condition: fluxcd/pkg/ssa's
/// WaitForSet never prints the message kstatus computed.
#[tokio::test]
async fn a_failing_job_fails_the_kustomization() {
    let cp = control_plane_or_skip!();
    let flux = flux_or_skip!(cp);
    let failing = job(
        "failing",
        "  run: echo 'loss is NaN' >&2; exit 3\n  recovery: {maxRestartsOnErrors: 1}\n",
    );
    let quick = job("quick", "  run: echo quick\n");
    let (sync, sha) = Sync::start(
        cp,
        flux,
        "flux-fail",
        "5m",
        &[
            ("failing.yaml", Some(&failing)),
            ("quick.yaml", Some(&quick)),
        ],
    )
    .await;
    let (_, reason, message) = sync
        .wait_kustomization(&sha, "HealthCheckFailed", |ready, reason, _| {
            ready == "False" && reason == "HealthCheckFailed"
        })
        .await;
    println!("Kustomization: {reason}: {message}");
    let ns = &sync.ns.name;
    assert!(
        message.contains("failed early due to stalled resources")
            && message.contains(&format!("ManagedJob/{ns}/failing status: 'Failed'")),
        "{message}"
    );
    assert!(
        !message.contains("quick"),
        "only the failed job is named: {message}"
    );
    let mj = sync.wait_phase("failing", JobPhase::Failed).await;
    let status = mj.status.unwrap();
    assert_eq!(status.restart_count, 1);
    for type_ in ["Stalled", "Ready", "Failed"] {
        let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
        assert!(
            c.message.contains("exited with code 3") && c.message.contains("restarts exhausted"),
            "{type_}: {c:?}"
        );
    }
    let event = support::wait_event(&sync.client, ns, "failing", "Failed", T).await;
    assert!(
        event
            .message
            .unwrap_or_default()
            .contains("exited with code 3"),
        "the Failed Event carries the message"
    );
    // And the operator tells the Kustomization (`kubectl describe kustomization`, `flux
    // events`): a Warning Event regarding it, beside Flux's own HealthCheckFailed.
    let told = support::wait_event(&sync.client, ns, KUSTOMIZATION, "ManagedJobFailed", T).await;
    let note = told.message.unwrap_or_default();
    assert_eq!(told.type_.as_deref(), Some("Warning"));
    assert_eq!(told.involved_object.kind.as_deref(), Some("Kustomization"));
    assert!(
        note.starts_with(&format!("ManagedJob {ns}/failing failed: "))
            && note.contains("exited with code 3")
            && note.contains("restarts exhausted"),
        "{note}"
    );
    let events = support::events_about(&sync.client, ns, KUSTOMIZATION).await;
    let told: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("ManagedJobFailed"))
        .collect();
    assert_eq!(told.len(), 1, "only the failed job is told: {told:#?}");
}

/// Re-sync and prune: a running job is left alone by further reconciles (the same revision
/// again, and a new revision that adds a job): same uid, attempt and process, one job
/// controller start. While it runs the Kustomization cannot be Ready (its health check times
/// out, InProgress). Removing it from git prunes it: the delete cancels it, its workload's
/// process group is gone, the object goes, and the Kustomization is Ready again.
#[tokio::test]
async fn reconciles_leave_running_jobs_alone_and_prune_cancels_them() {
    let cp = control_plane_or_skip!();
    let flux = flux_or_skip!(cp);
    let long = job("long", "  run: sleep 600\n");
    let (sync, sha1) =
        Sync::start(cp, flux, "flux-prune", "15s", &[("long.yaml", Some(&long))]).await;
    let running = sync.wait_phase("long", JobPhase::Running).await;
    let uid = running.uid().unwrap();
    let status = running.status.unwrap();
    let (id, workload) = (status.job_id.unwrap(), status.workload.clone().unwrap());
    let pgid: i32 = workload.trim_start_matches("pid/").parse().unwrap();
    let generation = running.metadata.generation;
    // The health check cannot pass while the job runs: it times out naming it InProgress.
    let (_, _, message) = sync
        .wait_kustomization(&sha1, "a health check timeout", |ready, reason, _| {
            ready == "False" && reason == "HealthCheckFailed"
        })
        .await;
    assert!(
        message.contains(&format!(
            "ManagedJob/{}/long status: 'InProgress'",
            sync.ns.name
        )),
        "{message}"
    );

    // The same revision again, then a new one with one more job.
    sync.request_reconcile(&kustomization_resource(), KUSTOMIZATION)
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let quick = job("quick", "  run: echo quick\n");
    let sha2 = sync
        .push(&[("quick.yaml", Some(&quick))], "add quick")
        .await;
    sync.wait_phase("quick", JobPhase::Succeeded).await;
    sync.wait_kustomization(&sha2, "the second revision applied", |_, reason, _| {
        reason == "HealthCheckFailed"
    })
    .await;
    let after = sync.jobs().get("long").await.unwrap();
    let s = after.status.clone().unwrap();
    assert_eq!(after.uid().as_deref(), Some(uid.as_str()));
    assert_eq!(
        after.metadata.generation, generation,
        "the spec was not changed"
    );
    assert_eq!(
        (s.phase, s.attempt, s.workload.as_deref()),
        (Some(JobPhase::Running), 1, Some(workload.as_str()))
    );
    assert!(managed_jobs::process::group_exists(pgid));

    // Prune: remove it from git.
    let sha3 = sync.push(&[("long.yaml", None)], "remove long").await;
    support::wait_gone(&sync.client, &sync.ns.name, "long", T).await;
    assert!(
        !managed_jobs::process::group_exists(pgid),
        "the pruned job's workload survived"
    );
    let (_, _, message) = sync
        .wait_kustomization(&sha3, "Ready", |ready, _, _| ready == "True")
        .await;
    println!("after the prune: {message}");
    support::wait_event(&sync.client, &sync.ns.name, "long", "Cancelled", T).await;

    // Over the whole test: one uid, one attempt, one process.
    let (uids, attempts) = sync.uids_and_attempts("long");
    assert_eq!(uids, vec![uid.clone()]);
    assert_eq!(attempts, vec![1]);
    assert_eq!(sync.controller_starts(id), 1);
    let workloads: Vec<String> = sync
        .seen()
        .into_iter()
        .filter_map(|s| match s {
            Seen::Job {
                name,
                workload: Some(w),
                ..
            } if name == "long" => Some(w),
            _ => None,
        })
        .collect();
    assert!(workloads.iter().all(|w| *w == workload), "{workloads:?}");
}

/// A cancel in git, then reverted in git together with another change: the cancel stops the
/// job and the Kustomization is Ready (the job is Cancelled as its spec asks); the revert is
/// accepted (the API takes `cancel: false` back on a finished job) and the other change goes
/// through with it (a new job is created and runs); the cancelled job stays Cancelled, never
/// runs again, and the Kustomization says it failed, naming it.
#[tokio::test]
async fn a_reverted_cancel_does_not_block_other_changes() {
    let cp = control_plane_or_skip!();
    let flux = flux_or_skip!(cp);
    let long = job("long", "  run: sleep 600\n");
    let (sync, _) = Sync::start(
        cp,
        flux,
        "flux-revert",
        "20s",
        &[("long.yaml", Some(&long))],
    )
    .await;
    let running = sync.wait_phase("long", JobPhase::Running).await;
    let uid = running.uid().unwrap();
    let id = running.status.and_then(|s| s.job_id).unwrap();

    let cancelled = job("long", "  run: sleep 600\n  cancel: true\n");
    let sha2 = sync
        .push(&[("long.yaml", Some(&cancelled))], "cancel long")
        .await;
    sync.wait_phase("long", JobPhase::Cancelled).await;
    sync.wait_kustomization(&sha2, "Ready with the job cancelled", |ready, _, _| {
        ready == "True"
    })
    .await;

    let next = job("next", "  run: echo next\n");
    let sha3 = sync
        .push(
            &[("long.yaml", Some(&long)), ("next.yaml", Some(&next))],
            "revert the cancel, add next",
        )
        .await;
    let (_, reason, message) = sync
        .wait_kustomization(&sha3, "the revert applied", |ready, reason, _| {
            ready == "False" && reason == "HealthCheckFailed"
        })
        .await;
    println!("after the revert: {reason}: {message}");
    assert!(
        message.contains(&format!(
            "ManagedJob/{}/long status: 'Failed'",
            sync.ns.name
        )),
        "{message}"
    );
    sync.wait_phase("next", JobPhase::Succeeded).await;
    let long_now = sync.jobs().get("long").await.unwrap();
    assert!(!long_now.spec.cancel, "the revert was applied");
    let s = long_now.status.unwrap();
    assert_eq!(s.observed_generation, long_now.metadata.generation);
    assert_eq!((s.phase, s.attempt), (Some(JobPhase::Cancelled), 1));
    let stalled = s.conditions.iter().find(|c| c.type_ == "Stalled").unwrap();
    assert_eq!(stalled.status, "True");
    assert!(stalled.message.contains("set back to false"), "{stalled:?}");
    let (uids, attempts) = sync.uids_and_attempts("long");
    assert_eq!((uids, attempts), (vec![uid], vec![1]));
    assert_eq!(sync.controller_starts(id), 1);
}

/// `ttlSecondsAfterFinished` in git: refused at the API (the GitOps policy), so Flux applies
/// nothing and its Ready condition quotes the refusal; no ManagedJob is ever created. Without
/// the TTL the job runs once and stays, across reconciles. Deleting it by hand is how a job in
/// git runs again: Flux creates it anew (a new uid) at its next reconcile, and it runs once more.
#[tokio::test]
async fn ttl_in_git_is_refused_and_a_job_runs_again_only_when_deleted() {
    let cp = control_plane_or_skip!();
    let flux = flux_or_skip!(cp);
    let with_ttl = job(
        "report",
        "  run: echo report\n  ttlSecondsAfterFinished: 5\n",
    );
    let (sync, sha1) = Sync::start(
        cp,
        flux,
        "flux-ttl",
        "1m",
        &[("report.yaml", Some(&with_ttl))],
    )
    .await;
    let (_, reason, message) = sync
        .wait_kustomization(&sha1, "the refusal", |ready, _, _| ready == "False")
        .await;
    println!("with a TTL: {reason}: {message}");
    assert!(
        message.contains("spec.ttlSecondsAfterFinished cannot be set on a ManagedJob that Flux"),
        "{message}"
    );
    assert!(
        sync.jobs().get_opt("report").await.unwrap().is_none(),
        "nothing was applied"
    );

    let without = job("report", "  run: echo report\n");
    let sha2 = sync
        .push(&[("report.yaml", Some(&without))], "drop the TTL")
        .await;
    sync.wait_kustomization(&sha2, "Ready", |ready, _, _| ready == "True")
        .await;
    let first = sync.wait_phase("report", JobPhase::Succeeded).await;
    let first_uid = first.uid().unwrap();
    // More reconciles: the finished job stays, and does not run again.
    for _ in 0..2 {
        sync.request_reconcile(&kustomization_resource(), KUSTOMIZATION)
            .await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let (uids, _) = sync.uids_and_attempts("report");
    assert_eq!(
        uids,
        vec![first_uid.clone()],
        "no job was seen before the TTL was dropped"
    );

    // Deleted by hand: Flux creates it again at its next reconcile, and it runs again.
    support::delete(&sync.client, &sync.ns.name, "report").await;
    support::wait_gone(&sync.client, &sync.ns.name, "report", T).await;
    sync.request_reconcile(&kustomization_resource(), KUSTOMIZATION)
        .await;
    let start = Instant::now();
    let second = loop {
        if let Some(mj) = sync.jobs().get_opt("report").await.unwrap()
            && mj.uid().as_deref() != Some(first_uid.as_str())
        {
            break mj;
        }
        assert!(
            start.elapsed() < T,
            "Flux never created the deleted job again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let done = sync.wait_phase("report", JobPhase::Succeeded).await;
    assert_eq!(done.uid(), second.uid());
    let (uids, _) = sync.uids_and_attempts("report");
    assert_eq!(uids.len(), 2, "{uids:?}");
}

/// A job that no operator owns (its shard label names no running instance) never passes a
/// health check: it reads InProgress (the CRD's default status) until the timeout, where the
/// Kustomization names it; before the status default kstatus read it as Current and the
/// Kustomization turned Ready at once.
#[tokio::test]
async fn a_job_no_operator_owns_never_passes_the_health_check() {
    let cp = control_plane_or_skip!();
    let flux = flux_or_skip!(cp);
    let unowned = job("unowned", "  run: echo never\n").replace(
        "  name: unowned\n",
        "  name: unowned\n  labels: {managedjobs.dev/shard: nobody}\n",
    );
    let (sync, sha) = Sync::start(
        cp,
        flux,
        "flux-unowned",
        "10s",
        &[("unowned.yaml", Some(&unowned))],
    )
    .await;
    let (_, _, message) = sync
        .wait_kustomization(&sha, "a health check timeout", |ready, reason, _| {
            ready == "False" && reason == "HealthCheckFailed"
        })
        .await;
    println!("{message}");
    assert!(
        message.contains("timeout waiting for")
            && message.contains(&format!(
                "ManagedJob/{}/unowned status: 'InProgress'",
                sync.ns.name
            )),
        "{message}"
    );
    assert!(sync.ready_at(&sha).is_none(), "the Kustomization was Ready");
}
