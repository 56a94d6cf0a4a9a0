//! Test support for integration tests against the real dev control plane (hack/controlplane.sh):
//! kube-apiserver + etcd + kube-controller-manager + kube-scheduler + kwok, built from the official
//! Go modules.
//!
//! - [`control_plane`] starts it once per test binary (`hack/controlplane.sh up` reuses a healthy
//!   instance, so a whole `cargo test` run shares one), or uses the kubeconfig in
//!   `MJ_KUBECONFIG`. When the binaries were never built, tests print a loud SKIPPED line and
//!   return, except under `CI=true`, where that is a failure.
//! - [`TestNamespace`] gives each test its own namespace, deleted afterwards.
//! - The CRDs from `crds/` are installed once and waited for (Established, served, and a create
//!   accepted by admission).
//! - [`OperatorProcess`] runs the real `managed-jobs run` binary scoped to one namespace with its
//!   own state dir, and kills it and every process it started when dropped.
//! - [`real_node_ready`] and [`on_real_node`]: the control plane's real kubelet node
//!   (`hack/controlplane.sh up --real-node`), where Pods really run (and have logs).

#![allow(dead_code)]

pub mod browser;
pub mod kwok;
pub mod quota;
pub mod visibility;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use managed_jobs::api::{ManagedJob, ManagedJobStatus};

/// Repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script() -> PathBuf {
    root().join("hack/controlplane.sh")
}

/// A running control plane.
pub struct ControlPlane {
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
}

fn binaries_built() -> bool {
    let out = Command::new(script())
        .args(["bin-dir", "kubernetes"])
        .stderr(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let dir = String::from_utf8_lossy(&o.stdout).trim().to_string();
            Path::new(&dir).join("kube-apiserver").exists()
        }
        _ => false,
    }
}

/// The shared control plane, or `None` (after printing why) when tests must skip.
pub fn control_plane() -> Option<&'static ControlPlane> {
    static CP: OnceLock<Option<ControlPlane>> = OnceLock::new();
    CP.get_or_init(|| {
        if let Some(k) = std::env::var_os("MJ_KUBECONFIG") {
            let kubeconfig = PathBuf::from(k);
            install_crds(&kubeconfig);
            return Some(ControlPlane { kubeconfig });
        }
        // Any CI value (true, 1, yes...) means the run must test for real, never skip.
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty());
        if !binaries_built() {
            assert!(
                !ci,
                "CI is set but the control plane binaries are not built: run `hack/controlplane.sh build` first"
            );
            return None;
        }
        let out = Command::new(script())
            .arg("up")
            .stderr(Stdio::inherit())
            .output()
            .expect("running hack/controlplane.sh up");
        assert!(out.status.success(), "hack/controlplane.sh up failed");
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        install_crds(&kubeconfig);
        Some(ControlPlane { kubeconfig })
    })
    .as_ref()
}

/// A control plane of the calling test's own (`hack/controlplane.sh up` under a cache dir of its
/// own, the binaries shared), for fault tests that kill and restart its API server: nothing
/// else runs against it. Stopped (`down`) when dropped.
pub struct OwnControlPlane {
    /// Its kubeconfig, as [`ControlPlane`].
    pub cp: ControlPlane,
    cache: PathBuf,
}

impl OwnControlPlane {
    /// Starts (or reuses) instance `name` with `nodes` kwok nodes, its CRDs installed; None
    /// (after recording a skip) when the binaries were never built, outside CI.
    pub fn start(name: &str, nodes: u32) -> Option<OwnControlPlane> {
        let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty());
        if !binaries_built() {
            assert!(
                !ci,
                "CI is set but the control plane binaries are not built"
            );
            record_skip(name);
            return None;
        }
        let base = std::env::var_os("MJ_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/managed-jobs")
            });
        let bin = base.join("controlplane/bin");
        let cache = base.join("instances").join(name);
        std::fs::create_dir_all(cache.join("controlplane")).unwrap();
        let link = cache.join("controlplane/bin");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(std::fs::canonicalize(&bin).unwrap_or(bin), &link).unwrap();
        let out = Command::new(script())
            .args(["up", "--nodes", &nodes.to_string()])
            .env("MJ_CACHE_DIR", &cache)
            .stderr(Stdio::inherit())
            .output()
            .expect("running hack/controlplane.sh up");
        assert!(
            out.status.success(),
            "hack/controlplane.sh up ({name}) failed"
        );
        let kubeconfig = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        install_crds(&kubeconfig);
        Some(OwnControlPlane {
            cp: ControlPlane { kubeconfig },
            cache,
        })
    }

    fn run(&self, command: &str) {
        let out = Command::new(script())
            .arg(command)
            .env("MJ_CACHE_DIR", &self.cache)
            .output()
            .expect("running hack/controlplane.sh");
        assert!(
            out.status.success(),
            "hack/controlplane.sh {command}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// SIGKILLs its kube-apiserver (an API outage begins).
    pub fn kill_apiserver(&self) {
        self.run("kill-apiserver");
    }

    /// Starts its kube-apiserver again and waits until it is ready (the outage ends).
    pub fn start_apiserver(&self) {
        self.run("start-apiserver");
    }
}

impl Drop for OwnControlPlane {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .arg("down")
            .env("MJ_CACHE_DIR", &self.cache)
            .output();
    }
}

/// Runs the control plane's own kubectl with `args` against `cp` (its kubeconfig, whatever
/// instance `MJ_CACHE_DIR` names); returns (success, stdout+stderr).
pub fn kubectl(cp: &ControlPlane, args: &[&str]) -> (bool, String) {
    let out = Command::new(kubectl_binary())
        .arg("--kubeconfig")
        .arg(&cp.kubeconfig)
        .args(args)
        .output()
        .expect("running kubectl");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The control plane's own kubectl (of its Kubernetes version).
pub fn kubectl_binary() -> &'static Path {
    static KUBECTL: OnceLock<PathBuf> = OnceLock::new();
    KUBECTL.get_or_init(|| {
        let out = Command::new(script())
            .args(["bin-dir", "kubernetes"])
            .output()
            .expect("running hack/controlplane.sh bin-dir");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubectl")
    })
}

fn install_crds(kubeconfig: &Path) {
    let cp = ControlPlane {
        kubeconfig: kubeconfig.to_path_buf(),
    };
    apply_crds(&cp, &root().join("crds"));
}

/// Applies the CRDs and admission policies in `dir` (`kubectl apply -f DIR`: this checkout's
/// `crds/`, or a previous release's), then waits until the API serves ManagedJobs and accepts
/// a create of one (a server-side dry run of `examples/hello.yaml`).
pub fn apply_crds(cp: &ControlPlane, dir: &Path) {
    let (ok, out) = kubectl(cp, &["apply", "-f", dir.to_str().unwrap()]);
    assert!(ok, "installing CRDs from {}: {out}", dir.display());
    let queues = dir.join("managedjobs.dev_managedjobqueues.yaml").exists();
    let mut crds = vec!["crd/managedjobs.managedjobs.dev"];
    if queues {
        crds.push("crd/managedjobqueues.managedjobs.dev");
    }
    let mut args = vec!["wait", "--for=condition=Established"];
    args.extend(&crds);
    args.push("--timeout=60s");
    let (ok, out) = kubectl(cp, &args);
    assert!(ok, "CRD not established: {out}");
    // Discovery serves the new type a moment after Established.
    let start = Instant::now();
    while !kubectl(cp, &["get", "managedjobs", "-A"]).0
        || (queues && !kubectl(cp, &["get", "managedjobqueues"]).0)
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "CRD never served"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Served is not yet accepted: a create is refused (ServiceUnavailable) until the finalizer
    // policy (a MutatingAdmissionPolicy) can type the new kind. A server-side dry run passes
    // through admission like a create.
    let hello = root().join("examples/hello.yaml");
    let start = Instant::now();
    loop {
        let (ok, out) = kubectl(
            cp,
            &[
                "apply",
                "--dry-run=server",
                "-n",
                "default",
                "-f",
                hello.to_str().unwrap(),
            ],
        );
        if ok {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the API never accepted a ManagedJob create: {out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The shard policy (a ValidatingAdmissionPolicy) is in force a moment after it is
    // (re)created, e.g. after the real-node tests' `helm uninstall` deleted the chart's copy:
    // until a create with a label no operator could take is refused, a test that counts on the
    // refusal would see it accepted.
    if dir.join("managedjobs.dev_shard-policy.yaml").exists() {
        let probe =
            std::env::temp_dir().join(format!("mj-shard-probe-{}.yaml", std::process::id()));
        let text = std::fs::read_to_string(&hello).expect("examples/hello.yaml");
        let labelled = text.replacen(
            "metadata:\n",
            "metadata:\n  labels: {managedjobs.dev/shard: Not_A_Shard}\n",
            1,
        );
        std::fs::write(&probe, labelled).expect("writing the probe");
        let start = Instant::now();
        loop {
            let (ok, out) = kubectl(
                cp,
                &[
                    "apply",
                    "--dry-run=server",
                    "-n",
                    "default",
                    "-f",
                    probe.to_str().unwrap(),
                ],
            );
            if !ok && out.contains("is not a shard name") {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the shard policy never refused a bad shard label: {out}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = std::fs::remove_file(&probe);
    }
}

/// A client for the control plane.
pub async fn client(cp: &ControlPlane) -> Client {
    let kc = Kubeconfig::read_from(&cp.kubeconfig).expect("reading kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// A namespace of the test's own, deleted (without waiting) when dropped.
pub struct TestNamespace {
    /// Its name.
    pub name: String,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// Creates `mj-<prefix>-<random>`.
    pub async fn new(client: &Client, cp: &ControlPlane, prefix: &str) -> TestNamespace {
        let suffix: u32 = std::process::id()
            ^ (Instant::now().elapsed().subsec_nanos())
            ^ (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos());
        let name = format!("mj-{prefix}-{:x}", suffix % 0xffffff);
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name }
        }))
        .unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        TestNamespace {
            name,
            kubeconfig: cp.kubeconfig.clone(),
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let cp = ControlPlane {
            kubeconfig: self.kubeconfig.clone(),
        };
        // Finalizers of ManagedJobs whose operator is gone would hold the namespace: drop them.
        let (_, names) = kubectl(&cp, &["-n", &self.name, "get", "managedjobs", "-o", "name"]);
        let names: Vec<&str> = names
            .lines()
            .filter(|l| l.starts_with("managedjob"))
            .collect();
        // Sixteen at a time: a test with hundreds of jobs must not spend minutes here.
        let chunk = names.len().div_ceil(16).max(1);
        std::thread::scope(|scope| {
            for part in names.chunks(chunk) {
                let cp = &cp;
                let ns = &self.name;
                scope.spawn(move || {
                    for name in part {
                        kubectl(
                            cp,
                            &[
                                "-n",
                                ns,
                                "patch",
                                name,
                                "--type=merge",
                                "-p",
                                r#"{"metadata":{"finalizers":null}}"#,
                            ],
                        );
                    }
                });
            }
        });
        kubectl(&cp, &["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// A `managed-jobs run` process scoped to one namespace (or, started with the namespace `""`,
/// to every namespace: give it a `--shard` of its own), with its own state dir.
pub struct OperatorProcess {
    child: Option<std::process::Child>,
    /// The `managed-jobs` binary it runs ([`binary`] unless changed: [`OperatorProcess::use_binary`]).
    program: PathBuf,
    /// Its state dir.
    pub state_dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    namespace: String,
    extra: Vec<String>,
    shared_dir: Option<PathBuf>,
    /// (soft, hard) RLIMIT_NOFILE to start it with, as `ulimit -Sn`/`-Hn` would.
    open_files: Option<(u64, u64)>,
    /// Environment variables to start it with (e.g. `POD_NAME`).
    env: Vec<(String, String)>,
}

/// The `managed-jobs` binary under test.
pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_managed-jobs")
}

impl OperatorProcess {
    /// Starts the operator with the local executor and `extra` flags.
    pub fn start(cp: &ControlPlane, namespace: &str, extra: &[&str]) -> OperatorProcess {
        let mut op = OperatorProcess {
            child: None,
            program: PathBuf::from(binary()),
            state_dir: tempfile::tempdir().unwrap(),
            kubeconfig: cp.kubeconfig.clone(),
            namespace: namespace.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            shared_dir: None,
            open_files: None,
            env: Vec::new(),
        };
        op.spawn();
        op
    }

    /// [`OperatorProcess::start`] running `program` instead of this build (a previous
    /// release's binary).
    pub fn start_program(
        cp: &ControlPlane,
        program: &Path,
        namespace: &str,
        extra: &[&str],
    ) -> OperatorProcess {
        let mut op = OperatorProcess {
            child: None,
            program: program.to_path_buf(),
            state_dir: tempfile::tempdir().unwrap(),
            kubeconfig: cp.kubeconfig.clone(),
            namespace: namespace.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            shared_dir: None,
            open_files: None,
            env: Vec::new(),
        };
        op.spawn();
        op
    }

    /// [`OperatorProcess::start`] with environment variables `env` set.
    pub fn start_with_env(
        cp: &ControlPlane,
        namespace: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> OperatorProcess {
        let mut op = OperatorProcess {
            child: None,
            program: PathBuf::from(binary()),
            state_dir: tempfile::tempdir().unwrap(),
            kubeconfig: cp.kubeconfig.clone(),
            namespace: namespace.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            shared_dir: None,
            open_files: None,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        op.spawn();
        op
    }

    /// [`OperatorProcess::start`] under a (soft, hard) limit on open files.
    pub fn start_with_open_files(
        cp: &ControlPlane,
        namespace: &str,
        extra: &[&str],
        soft: u64,
        hard: u64,
    ) -> OperatorProcess {
        let mut op = OperatorProcess {
            child: None,
            program: PathBuf::from(binary()),
            state_dir: tempfile::tempdir().unwrap(),
            kubeconfig: cp.kubeconfig.clone(),
            namespace: namespace.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            shared_dir: None,
            open_files: Some((soft, hard)),
            env: Vec::new(),
        };
        op.spawn();
        op
    }

    /// Starts a second operator on `other`'s state dir (as a standby replica would mount it).
    pub fn start_sharing(
        cp: &ControlPlane,
        namespace: &str,
        extra: &[&str],
        other: &OperatorProcess,
    ) -> OperatorProcess {
        let mut op = OperatorProcess {
            child: None,
            program: PathBuf::from(binary()),
            state_dir: tempfile::tempdir().unwrap(),
            kubeconfig: cp.kubeconfig.clone(),
            namespace: namespace.to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            shared_dir: Some(other.state_path()),
            open_files: None,
            env: Vec::new(),
        };
        op.spawn();
        op
    }

    /// Runs `program` from its next start on (a version change: [`OperatorProcess::terminate`],
    /// then this, then [`OperatorProcess::start_again`]).
    pub fn use_binary(&mut self, program: &Path) {
        self.program = program.to_path_buf();
    }

    /// The state dir this operator runs on.
    pub fn state_path(&self) -> PathBuf {
        self.shared_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.path().to_path_buf())
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.state_dir.path().join("operator.log"))
            .unwrap();
        let mut cmd = Command::new(&self.program);
        if let Some((soft, hard)) = self.open_files {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: setrlimit is async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    nix::sys::resource::setrlimit(
                        nix::sys::resource::Resource::RLIMIT_NOFILE,
                        soft,
                        hard,
                    )
                    .map_err(std::io::Error::from)
                });
            }
        }
        cmd.arg("run").arg("--state-dir").arg(self.state_path());
        // An empty namespace: every namespace (the test gives it a shard of its own).
        if !self.namespace.is_empty() {
            cmd.arg("--namespace").arg(&self.namespace);
        }
        // The tests' defaults, each unless `extra` sets that flag itself.
        for (flag, value) in [
            ("--executors", "local,pod"),
            ("--cancel-grace-seconds", "2"),
            ("--restart-backoff-seconds", "0.2"),
            ("--metrics-addr", "none"),
        ] {
            if !self.extra.iter().any(|a| a == flag) {
                cmd.args([flag, value]);
            }
        }
        let child = cmd
            .args(&self.extra)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting managed-jobs run");
        self.child = Some(child);
    }

    /// SIGKILLs the operator alone (its job controllers and workloads keep running).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERMs the operator (a rollout) and waits for it to exit.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while c.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILLs the operator and every job controller of its state dir at once, as a container
    /// restart does (workloads in their own process groups stay).
    pub fn kill_with_job_controllers(&mut self) {
        self.kill();
        // Listed again until none is left: one the operator was spawning as it died shows up
        // only after the first listing.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let left = self.job_controllers();
            if left.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "job controllers outlived SIGKILL: {left:?}"
            );
            for (_, pid) in left {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// SIGKILLs the operator, every job controller and every workload process it started (all
    /// carry its state dir on their command line), as its container or node dying does.
    pub fn kill_everything(&mut self) {
        self.kill();
        kill_all_of(&self.state_path());
    }

    /// Starts it on the same state dir, without stopping anything first.
    pub fn start_again(&mut self) {
        self.spawn();
    }

    /// Starts it again (it must be stopped) with `extra` flags instead of those it had.
    pub fn start_again_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.spawn();
    }

    /// Starts it again on the same state dir.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Waits up to `timeout` for the operator to exit on its own; its exit status, if it did.
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The operator's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state_dir.path().join("operator.log")).unwrap_or_default()
    }

    /// Pids of the job controller processes of this state dir, by job id.
    pub fn job_controllers(&self) -> Vec<(i64, i32)> {
        let dir = self.state_path().to_string_lossy().into_owned();
        let mut out = Vec::new();
        for pid in managed_jobs::process::find_by_arguments(&["job-controller", &dir]) {
            let args = managed_jobs::process::cmdline(pid).unwrap_or_default();
            if let Some(id) = args.last().and_then(|a| a.parse().ok()) {
                out.push((id, pid));
            }
        }
        out
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "operator log of the failed test:\n{}",
                self.log()
                    .lines()
                    .rev()
                    .take(
                        std::env::var("MJ_LOG_LINES")
                            .ok()
                            .and_then(|n| n.parse().ok())
                            .unwrap_or(60),
                    )
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            // And each job controller's (the state dir's logs/<job id>.log), last lines.
            let logs = self.state_path().join("logs");
            let mut files: Vec<PathBuf> = std::fs::read_dir(&logs)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "log"))
                .collect();
            files.sort();
            for file in files.iter().take(20) {
                let text = std::fs::read_to_string(file).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                eprintln!(
                    "job controller log {}:\n{}",
                    file.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
        }
        kill_all_of(&self.state_path());
    }
}

/// SIGKILLs every process (and its process group) whose command line names `state_dir`:
/// everything an operator on it started.
pub fn kill_all_of(state_dir: &Path) {
    {
        // Everything this operator started carries its state dir on its command line.
        let dir = state_dir.to_string_lossy().into_owned();
        for pid in std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        {
            if managed_jobs::process::cmdline(pid)
                .is_some_and(|args| args.iter().any(|a| a.contains(&dir)))
            {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

/// Applies a ManagedJob from YAML text into `ns`.
pub async fn create_yaml(client: &Client, ns: &str, yaml: &str) -> ManagedJob {
    let mj: ManagedJob = serde_norway::from_str(yaml).expect("valid ManagedJob YAML");
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &mj)
        .await
        .expect("creating the ManagedJob")
}

/// Polls the object until `pred` holds on its status, or panics after `timeout` with the last
/// status seen.
pub async fn wait_status(
    client: &Client,
    ns: &str,
    name: &str,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&ManagedJobStatus) -> bool,
) -> ManagedJob {
    let api = Api::<ManagedJob>::namespaced(client.clone(), ns);
    let start = Instant::now();
    loop {
        if let Ok(mj) = api.get(name).await
            && mj.status.as_ref().is_some_and(&pred)
        {
            return mj;
        }
        if start.elapsed() > timeout {
            let last = api.get(name).await.ok().and_then(|m| m.status);
            panic!("{ns}/{name} never reached {what} within {timeout:?}; last status: {last:#?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the operator has given the job its id, and returns it.
pub async fn wait_job_id(client: &Client, ns: &str, name: &str, timeout: Duration) -> i64 {
    wait_status(client, ns, name, timeout, "a job id", |s| {
        s.job_id.is_some()
    })
    .await
    .status
    .and_then(|s| s.job_id)
    .expect("checked")
}

/// The Events about object `name` in `ns`.
pub async fn events_about(
    client: &Client,
    ns: &str,
    name: &str,
) -> Vec<k8s_openapi::api::core::v1::Event> {
    Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await
        .expect("listing Events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .collect()
}

/// Waits for an Event with `reason` about object `name`, and returns it; panics after
/// `timeout` naming the reasons seen.
pub async fn wait_event(
    client: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> k8s_openapi::api::core::v1::Event {
    let start = Instant::now();
    loop {
        let events = events_about(client, ns, name).await;
        let reasons: Vec<Option<String>> = events.iter().map(|e| e.reason.clone()).collect();
        if let Some(e) = events
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reason))
        {
            return e;
        }
        assert!(
            start.elapsed() < timeout,
            "{ns}/{name}: no {reason} Event within {timeout:?}; seen {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Cancels a job without deleting it (`spec.cancel: true`).
pub async fn cancel(client: &Client, ns: &str, name: &str) {
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"cancel": true}})),
        )
        .await
        .expect("cancel");
}

/// Waits until the object is gone.
pub async fn wait_gone(client: &Client, ns: &str, name: &str, timeout: Duration) {
    let api = Api::<ManagedJob>::namespaced(client.clone(), ns);
    let start = Instant::now();
    while api.get_opt(name).await.expect("get").is_some() {
        assert!(start.elapsed() < timeout, "{ns}/{name} was never deleted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Deletes the object (foreground is not needed: the finalizer holds it).
pub async fn delete(client: &Client, ns: &str, name: &str) {
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete");
}

/// The previous release, as `hack/previous-release.sh build` leaves it: what the
/// backward-compatibility tests upgrade from.
pub struct PreviousRelease {
    /// Its cache directory (`hack/previous-release.sh dir`).
    pub dir: PathBuf,
    /// Its version (Cargo.toml's).
    pub version: String,
}

impl PreviousRelease {
    /// Its `managed-jobs` binary.
    pub fn binary(&self) -> PathBuf {
        self.dir.join("managed-jobs")
    }

    /// Its sources (chart, CRDs, examples).
    pub fn src(&self) -> PathBuf {
        self.dir.join("src")
    }
}

/// The previous release if it was built (`hack/previous-release.sh build`), else `None` after
/// recording a skip; under `CI=true` a missing build is a failure.
pub fn previous_release(test: &str) -> Option<PreviousRelease> {
    let out = Command::new(root().join("hack/previous-release.sh"))
        .arg("dir")
        .output()
        .expect("running hack/previous-release.sh dir");
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let version = std::fs::read_to_string(dir.join("version")).unwrap_or_default();
    if out.status.success() && dir.join("managed-jobs").exists() && !version.trim().is_empty() {
        return Some(PreviousRelease {
            dir,
            version: version.trim().to_string(),
        });
    }
    let why = format!(
        "the previous release is not built at {} (run hack/previous-release.sh build): {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::env::var("CI").unwrap_or_default().is_empty(),
        "CI is set but {why}"
    );
    record_skip(&format!("{test}: {why}"));
    None
}

/// Records that the calling test skipped, so that the run's summary counts it: one line in the
/// file named by `MJ_SKIPPED_FILE` (set by hack/test.sh), and a note on stdout (shown with
/// `--nocapture`). A passing test hides its output, so the file is what makes a skip visible.
pub fn record_skip(test: &str) {
    println!(
        "SKIPPED {test}: integration tests need the dev control plane; build it once with \
         `hack/controlplane.sh build` (about 15 minutes) or set MJ_KUBECONFIG"
    );
    if let Some(path) = std::env::var_os("MJ_SKIPPED_FILE") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}");
        }
    }
}

/// Skips the test (returns, recording the skip) when no control plane is available.
#[macro_export]
macro_rules! control_plane_or_skip {
    () => {
        match support::control_plane() {
            Some(cp) => cp,
            None => {
                support::record_skip(&format!("{}:{}", file!(), line!()));
                return;
            }
        }
    };
}

/// A free loopback port (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` on 127.0.0.1:port; returns (status code, body). Retries while nothing listens yet.
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let start = Instant::now();
    let mut stream = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "nothing listens on {port}: {e}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}

/// A predicate on a status: its phase is `p` (for [`wait_status`]).
pub fn phase_is(
    p: managed_jobs::api::JobPhase,
) -> impl Fn(&managed_jobs::api::ManagedJobStatus) -> bool {
    move |s| s.phase == Some(p)
}

/// Every Pod name seen in namespace `ns` through a watch, from now until the task is aborted:
/// what must never happen is counted over the whole test, not only at the end.
pub fn watch_pod_names(
    client: &Client,
    ns: &str,
) -> (
    tokio::task::JoinHandle<()>,
    std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
) {
    use futures::StreamExt;
    use kube::ResourceExt as _;
    use kube::runtime::watcher;
    let api = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), ns);
    let names = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let seen = names.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            if let Ok(
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p),
            ) = ev
            {
                seen.lock().unwrap().insert(p.name_any());
            }
        }
    });
    (task, names)
}

/// The name of attempt `attempt`'s Pod of job `name` in `ns`, from the object's uid and job id
/// (waits for the id): `<name>-<id>-<attempt>-<uid tag>`.
pub async fn pod_name(client: &Client, ns: &str, name: &str, attempt: i32) -> String {
    let (uid, id) = uid_and_id(client, ns, name).await;
    managed_jobs::executor::pod::pod_name(name, &uid, id, attempt)
}

/// The name of attempt `task_attempt` (from 1) of task `task`'s Pod of pipeline `name` in `ns`.
pub async fn task_pod_name(
    client: &Client,
    ns: &str,
    name: &str,
    task: usize,
    task_attempt: i32,
) -> String {
    let (uid, id) = uid_and_id(client, ns, name).await;
    managed_jobs::executor::pod::pipeline_pod_name(name, &uid, id, task, task_attempt)
}

async fn uid_and_id(client: &Client, ns: &str, name: &str) -> (String, i64) {
    let mj = wait_status(client, ns, name, Duration::from_secs(90), "a job id", |s| {
        s.job_id.is_some()
    })
    .await;
    (
        mj.metadata.uid.clone().expect("an object has a uid"),
        mj.status.and_then(|s| s.job_id).expect("checked"),
    )
}

/// The dev control plane's real kubelet node (hack/realnode.sh): its name, the label and taint
/// it is registered with, and its containerd's socket.
pub const REAL_NODE: &str = "mj-real-node";
/// Label (value `"true"`) and taint (`NoSchedule`) of [`REAL_NODE`].
pub const REAL_NODE_MARK: &str = "managedjobs.dev/real-node";
/// The socket of [`REAL_NODE`]'s containerd.
pub const REAL_NODE_CONTAINERD: &str = "/run/mj-realnode/containerd/containerd.sock";
/// The image the real node's Pods run (imported by hack/realnode.sh: `imagePullPolicy: Never`
/// finds it).
pub const BUSYBOX: &str = "docker.io/library/busybox:1.36";

/// `ctr` against the real node's containerd, namespace k8s.io (the kubelet's); (success,
/// stdout+stderr).
pub fn real_node_ctr(args: &[&str]) -> (bool, String) {
    let out = Command::new("ctr")
        .args(["-a", REAL_NODE_CONTAINERD, "-n", "k8s.io"])
        .args(args)
        .output();
    match out {
        Ok(out) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            (out.status.success(), text)
        }
        Err(e) => (false, format!("running ctr: {e}")),
    }
}

/// Is the real node Ready with `image` imported? If not: a recorded skip, or under `CI` a
/// failure (a real-node test never skips silently there). `how` says what brings the image
/// (e.g. "`hack/image.sh --load`"); the node itself needs root and
/// `hack/controlplane.sh up --real-node`.
pub fn real_node_ready(cp: &ControlPlane, image: &str, how: &str) -> bool {
    let (_, ready) = kubectl(
        cp,
        &[
            "get",
            "node",
            REAL_NODE,
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
    );
    let images = real_node_ctr(&["images", "ls", "-q"]).1;
    let imported = images.lines().any(|l| l.trim() == image);
    if ready.trim() == "True" && imported {
        return true;
    }
    let why = format!(
        "the real node is {} and the image {image} is {}: run `hack/controlplane.sh up --real-node` \
         and {how} (as root)",
        if ready.trim() == "True" {
            "Ready"
        } else {
            "not Ready"
        },
        if imported { "imported" } else { "missing" }
    );
    assert!(
        std::env::var("CI").unwrap_or_default().is_empty(),
        "CI is set but {why}"
    );
    record_skip(&format!("real-node test: {why}"));
    false
}

/// `yaml` (a ManagedJob) with every Pod template placed on the real node: its label as node
/// selector, a toleration of its taint.
pub fn on_real_node(yaml: &str) -> ManagedJob {
    use serde_json::{Value, json};
    let mut job: Value = serde_norway::from_str(yaml).expect("ManagedJob YAML");
    let place = |template: &mut Value| {
        template["spec"]["nodeSelector"] = json!({ REAL_NODE_MARK: "true" });
        template["spec"]["tolerations"] = json!([
            {"key": REAL_NODE_MARK, "operator": "Exists", "effect": "NoSchedule"}
        ]);
    };
    if job["spec"]["template"].is_object() {
        place(&mut job["spec"]["template"]);
    }
    if let Some(tasks) = job["spec"].get_mut("tasks").and_then(Value::as_array_mut) {
        for task in tasks {
            if task["template"].is_object() {
                place(&mut task["template"]);
            }
        }
    }
    serde_json::from_value(job).expect("a ManagedJob")
}
