//! Test support for the visibility API (`src/visibility`): its TLS files, users with tokens of
//! their own (ServiceAccounts) and their permissions, a client straight to the operator (a
//! bearer token), the aggregated API through the real API server ([`ApiService`]), and
//! `kubectl proxy` as a user ([`Proxy`], what a browser of the dashboard goes through).

#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::Value;

use super::ControlPlane;

/// The visibility API's path prefix.
pub const PREFIX: &str = managed_jobs::visibility::PREFIX;

/// This machine's address that the API server (on loopback) can dial and that an EndpointSlice
/// may hold (not loopback): the source address of its default route.
pub fn host_ip() -> String {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").expect("a UDP socket");
    // No packet is sent: connect only picks the route and so the source address.
    s.connect("192.0.2.1:9").expect("a route off this host");
    s.local_addr().expect("local address").ip().to_string()
}

/// The visibility API's TLS files (a CA of the test's own and a certificate it signed for the
/// names the API server and the tests dial) and the port it serves on.
pub struct Served {
    /// The port, on every address.
    pub port: u16,
    /// The CA's certificate (PEM).
    pub ca_pem: String,
    dir: tempfile::TempDir,
}

impl Served {
    /// New files for a server that the Service `service` in `namespace` fronts.
    pub fn new(service: &str, namespace: &str) -> Served {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca.distinguished_name
            .push(DnType::CommonName, "managed-jobs test visibility CA");
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let names = vec![
            format!("{service}.{namespace}.svc"),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            host_ip(),
        ];
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
        Served {
            port: listen_port(),
            ca_pem: ca.pem(),
            dir,
        }
    }

    /// The operator's flags that serve it.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--visibility-addr".into(),
            format!("0.0.0.0:{}", self.port),
            "--visibility-tls-cert-file".into(),
            self.dir.path().join("tls.crt").display().to_string(),
            "--visibility-tls-key-file".into(),
            self.dir.path().join("tls.key").display().to_string(),
        ]
    }

    /// A client straight to the operator, presenting `token` (None: no credential).
    pub fn client(&self, token: Option<&str>) -> Client {
        let mut config =
            kube::Config::new(format!("https://127.0.0.1:{}", self.port).parse().unwrap());
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject as _;
        config.root_cert = Some(
            CertificateDer::pem_slice_iter(self.ca_pem.as_bytes())
                .map(|c| c.unwrap().to_vec())
                .collect(),
        );
        if let Some(t) = token {
            config.auth_info.token = Some(t.to_string().into());
        }
        config.read_timeout = Some(Duration::from_secs(60));
        Client::try_from(config).expect("a client for the visibility API")
    }

    /// Waits until the server answers anything at all (it starts with the operator).
    pub async fn wait_up(&self) {
        let start = Instant::now();
        let client = self.client(None);
        loop {
            if get(&client, PREFIX).await.is_ok() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the visibility API never answered on port {}",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A free port on every address (bound, then released).
fn listen_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET path` through `client` as JSON.
pub async fn get(client: &Client, path: &str) -> Result<Value, kube::Error> {
    client
        .request::<Value>(http::Request::get(path).body(Vec::new()).unwrap())
        .await
}

/// `GET path` through `client` as text.
pub async fn get_text(client: &Client, path: &str) -> Result<String, kube::Error> {
    client
        .request_text(http::Request::get(path).body(Vec::new()).unwrap())
        .await
}

/// The HTTP status of a failed request (kube's error for a Status answer).
pub fn code(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        other => panic!("not an API answer: {other}"),
    }
}

/// A user of the cluster: a ServiceAccount with a token, and a kubeconfig of its own.
pub struct User {
    /// `system:serviceaccount:NS:NAME`.
    pub username: String,
    /// Its bearer token.
    pub token: String,
    /// Its kubeconfig (the admin's cluster, this user's token).
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl User {
    /// Creates ServiceAccount `name` in `namespace` and a token for it (an hour).
    pub fn new(cp: &ControlPlane, namespace: &str, name: &str) -> User {
        let (ok, out) = super::kubectl(cp, &["create", "serviceaccount", name, "-n", namespace]);
        assert!(ok, "{out}");
        let (ok, token) = super::kubectl(
            cp,
            &["create", "token", name, "-n", namespace, "--duration", "1h"],
        );
        assert!(ok, "{token}");
        let token = token.trim().to_string();
        let admin: Value =
            serde_norway::from_str(&std::fs::read_to_string(&cp.kubeconfig).unwrap()).unwrap();
        let mut config = admin.clone();
        config["users"] = serde_json::json!([{ "name": name, "user": { "token": token } }]);
        config["contexts"][0]["context"]["user"] = serde_json::json!(name);
        config["contexts"][0]["context"]["namespace"] = serde_json::json!(namespace);
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, serde_norway::to_string(&config).unwrap()).unwrap();
        User {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            token,
            kubeconfig,
            _dir: dir,
        }
    }

    /// A client with this user's kubeconfig (through the API server).
    pub async fn client(&self) -> Client {
        super::client(&self.control_plane()).await
    }

    /// This user's kubeconfig as a [`ControlPlane`] (for `support::kubectl` and friends).
    pub fn control_plane(&self) -> ControlPlane {
        ControlPlane {
            kubeconfig: self.kubeconfig.clone(),
        }
    }
}

/// Applies `yaml` (cluster-scoped objects or ones naming their namespace) as the admin.
pub fn apply(cp: &ControlPlane, yaml: &str) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("objects.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (ok, out) = super::kubectl(cp, &["apply", "-f", &file.display().to_string()]);
    assert!(ok, "kubectl apply:\n{yaml}\n{out}");
}

/// Binds `user` to the built-in ClusterRole `role` (`view`, `edit` or `admin`) in `namespace`
/// with a RoleBinding named `role`: what a team member of a shared cluster has, and all a test
/// gives a user. The ManagedJobs and the visibility API reach those roles through the
/// ClusterRoles aggregated into them (`crds/managedjobs.dev_user-roles.yaml`, applied with
/// `crds/` as the docs say, or the chart's), and the every-namespace paths through
/// `crds/managedjobs.dev_visibility-access.yaml`. Returns once the API server authorizes the
/// user to list ManagedJobs there (the aggregation controller fills the built-in roles a
/// moment after a ClusterRole appears).
pub fn grant(cp: &ControlPlane, role: &str, namespace: &str, user: &User) {
    apply(
        cp,
        &format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {role}, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects: [{{kind: User, apiGroup: rbac.authorization.k8s.io, name: "{user}"}}]
"#,
            user = user.username
        ),
    );
    let start = Instant::now();
    loop {
        let (_, answer) = super::kubectl(
            cp,
            &[
                "auth",
                "can-i",
                "list",
                "managedjobs.managedjobs.dev",
                "-n",
                namespace,
                "--as",
                &user.username,
            ],
        );
        if answer.trim() == "yes" {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{role} in {namespace} never let {} list ManagedJobs: {answer} (is crds/managedjobs.dev_user-roles.yaml applied?)",
            user.username
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The aggregated API `v1alpha1.visibility.managedjobs.dev` served by a test's operator on this
/// host: a Service without selector and an EndpointSlice naming this host's address in
/// `namespace`, and the APIService trusting the test's CA. One per cluster at a time: callers
/// hold a lock. Removed when dropped (an APIService left unavailable would stall every
/// namespace deletion in the cluster).
pub struct ApiService {
    cp: ControlPlane,
}

/// The APIService's name.
pub const API_SERVICE: &str = "v1alpha1.visibility.managedjobs.dev";

impl ApiService {
    /// Registers it and waits until the API server reports it Available.
    pub fn register(
        cp: &ControlPlane,
        namespace: &str,
        service: &str,
        served: &Served,
    ) -> ApiService {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&served.ca_pem);
        apply(
            cp,
            &format!(
                r#"
apiVersion: v1
kind: Service
metadata: {{name: {service}, namespace: {namespace}}}
spec:
  ports: [{{name: https, port: 443, targetPort: {port}, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {service}-host
  namespace: {namespace}
  labels: {{kubernetes.io/service-name: {service}}}
addressType: IPv4
ports: [{{name: https, port: {port}, protocol: TCP}}]
endpoints: [{{addresses: ["{ip}"], conditions: {{ready: true}}}}]
---
apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {API_SERVICE}}}
spec:
  group: visibility.managedjobs.dev
  version: v1alpha1
  groupPriorityMinimum: 1000
  versionPriority: 100
  caBundle: {ca}
  service: {{name: {service}, namespace: {namespace}, port: 443}}
"#,
                port = served.port,
                ip = host_ip(),
            ),
        );
        let registered = ApiService {
            cp: ControlPlane {
                kubeconfig: cp.kubeconfig.clone(),
            },
        };
        let start = Instant::now();
        loop {
            let (_, available) = super::kubectl(
                cp,
                &[
                    "get",
                    "apiservice",
                    API_SERVICE,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Available\")].status} {.status.conditions[?(@.type==\"Available\")].message}",
                ],
            );
            if available.starts_with("True") {
                return registered;
            }
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "the APIService never became Available: {available}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for ApiService {
    fn drop(&mut self) {
        super::kubectl(
            &self.cp,
            &["delete", "apiservice", API_SERVICE, "--wait=true"],
        );
    }
}

/// `kubectl proxy` with a user's kubeconfig on a free loopback port: what a user runs to open
/// the dashboard in a browser (the proxy adds their credentials). Stopped when dropped.
pub struct Proxy {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Proxy {
    /// Starts it for the user of `kubeconfig`, and waits until it serves.
    pub fn start(kubeconfig: &Path) -> Proxy {
        let out = Command::new(super::root().join("hack/controlplane.sh"))
            .args(["bin-dir", "kubernetes"])
            .output()
            .expect("hack/controlplane.sh bin-dir kubernetes");
        let kubectl = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubectl");
        let mut child = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["proxy", "--port=0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("kubectl proxy");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "Starting to serve on 127.0.0.1:PORT"
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("kubectl proxy said: {line}"));
        Proxy { child, port }
    }

    /// The URL of `path` through this proxy.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The commands of the README's quick start (the first `sh` block under `## Quick start`), one
/// per line as a user types them; comment lines dropped, each line's own comment kept (the
/// shell drops it). Panics, naming what it missed, when the README no longer has that block.
pub fn quick_start() -> Vec<String> {
    let readme = std::fs::read_to_string(super::root().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## Quick start\n")
        .nth(1)
        .expect("README.md has no `## Quick start` section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .expect("README.md's quick start has no ```sh block")
        .split("\n```")
        .next()
        .unwrap();
    block
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The words of a command line before its comment (`kubectl apply -f crds/   # ...` ->
/// `["kubectl", "apply", "-f", "crds/"]`); quotes are not interpreted (the quick start's
/// quoted argument has no space).
pub fn words(line: &str) -> Vec<String> {
    line.split_whitespace()
        .take_while(|w| !w.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// A user's shell: `bash -c LINE` in the repository's root (the docs' paths are relative to
/// it) with `managed-jobs` (the binary under test) and `kubectl` (the control plane's) first
/// on `PATH`, `KUBECONFIG` set to `kubeconfig`, `XDG_STATE_HOME` to a folder of its own (so
/// `managed-jobs`'s default state dir is this user's alone on a shared machine), and none of
/// the `MJ_*` variables a test run may carry.
pub struct Shell {
    /// The `KUBECONFIG` it runs with.
    pub kubeconfig: PathBuf,
    dir: tempfile::TempDir,
}

/// What one command printed.
#[derive(Debug)]
pub struct Ran {
    /// It exited 0.
    pub ok: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Shell {
    /// A shell for the user of `kubeconfig`.
    pub fn new(kubeconfig: &Path) -> Shell {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(super::binary(), bin.join("managed-jobs")).unwrap();
        std::os::unix::fs::symlink(super::kubectl_binary(), bin.join("kubectl")).unwrap();
        std::fs::create_dir_all(dir.path().join("state")).unwrap();
        Shell {
            kubeconfig: kubeconfig.to_path_buf(),
            dir,
        }
    }

    /// `managed-jobs`'s default state dir for this shell's user
    /// (`$XDG_STATE_HOME/managed-jobs`).
    pub fn default_state_dir(&self) -> PathBuf {
        self.dir.path().join("state/managed-jobs")
    }

    fn command(&self, line: &str) -> Command {
        let mut cmd = Command::new("bash");
        cmd.arg("-c").arg(line).current_dir(super::root());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("MJ_") {
                cmd.env_remove(k);
            }
        }
        let path = format!(
            "{}:{}",
            self.dir.path().join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.env("PATH", path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("XDG_STATE_HOME", self.dir.path().join("state"))
            .env_remove("RUST_BACKTRACE");
        cmd
    }

    /// Runs `line` to its end.
    pub fn run(&self, line: &str) -> Ran {
        let out = self.command(line).output().expect("bash");
        Ran {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Runs `line` until it succeeds and `pred` holds on what it printed (a user running it
    /// again: the README says to for an apply right after the CRDs); panics after `timeout`
    /// with the last run.
    pub fn run_until(&self, line: &str, timeout: Duration, pred: impl Fn(&Ran) -> bool) -> Ran {
        let start = Instant::now();
        loop {
            let ran = self.run(line);
            if ran.ok && pred(&ran) {
                return ran;
            }
            assert!(
                start.elapsed() < timeout,
                "`{line}` never did what the docs say within {timeout:?}; last: {ran:#?}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Starts `line` in the background (a terminal of its own), its output in `log`; killed,
    /// with everything it started, when the returned guard is dropped.
    pub fn spawn(&self, line: &str, log: &Path) -> Background {
        let out = std::fs::File::create(log).unwrap();
        let child = self
            .command(&format!("exec {line}"))
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("bash");
        Background {
            child,
            state_dir: self.default_state_dir(),
        }
    }
}

/// A process a [`Shell`] started in the background.
pub struct Background {
    child: Child,
    state_dir: PathBuf,
}

impl Background {
    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Its job controllers and workloads carry the state dir on their command lines.
        super::kill_all_of(&self.state_dir);
    }
}

/// The form of an install the README's quick start runs against ([`run_quick_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// By hand: every command as written, the operator started by `managed-jobs run`;
    /// `queue` and `logs` read its store, and say so.
    ByHand,
    /// The chart (installed by the caller, on the real node): `kubectl apply -f crds/` and
    /// `managed-jobs run` are the chart's to do (the README says to install it instead); each
    /// `kubectl apply -f examples/X.yaml` applies the same job as a pod job on the real node
    /// (the local executor is off in a cluster: its `run` script in busybox); every other
    /// command as written. `queue` and `logs` go through the visibility API.
    Chart,
}

/// Runs the README's quick start ([`quick_start`]) with `shell` against the jobs of namespace
/// `ns` (its kubeconfig's context), checking each command for what the docs say it does; a
/// user re-runs a command (the README says to for an apply right after the CRDs), so each is
/// retried within a bound. Panics, naming the command, on the first that does not; and when
/// the README no longer does what this checks. At its end hello ran once and long-running is
/// gone.
pub async fn run_quick_start(shell: &Shell, client: &Client, ns: &str, form: Form) {
    use managed_jobs::api::{JobPhase, ManagedJob};
    const T: Duration = Duration::from_secs(300);
    let note = format!(
        "reading the store of the operator run by hand on this machine, {}",
        shell.default_state_dir().display()
    );
    // Through the API, no note; by hand, the note naming the store.
    let noted = |ran: &Ran| match form {
        Form::ByHand => ran.stderr.contains(&note),
        Form::Chart => !ran.stderr.contains("reading the store"),
    };
    let commands = quick_start();
    let files = tempfile::tempdir().unwrap();
    let mut done: Vec<&str> = Vec::new();
    let mut operator = None;
    for line in &commands {
        let words = words(line);
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        println!("$ {line}");
        match (form, words.as_slice()) {
            (Form::Chart, ["kubectl", "apply", "-f", "crds/"]) => done.push("install the CRDs"),
            (Form::Chart, ["managed-jobs", "run", ..]) => done.push("run the operator"),
            (Form::ByHand, ["managed-jobs", "run", ..]) => {
                operator = Some(shell.spawn(line, &files.path().join("operator.log")));
                done.push("run the operator");
            }
            (_, ["kubectl", "apply", "-f", "crds/"]) => {
                shell.run_until(line, T, |_| true);
                done.push("install the CRDs");
            }
            (_, ["kubectl", "apply", "-f", file]) => {
                let text = std::fs::read_to_string(super::root().join(file)).unwrap();
                let job: Value = serde_norway::from_str(&text).unwrap();
                let name = job["metadata"]["name"].as_str().unwrap().to_string();
                let line = match form {
                    Form::ByHand => line.clone(),
                    Form::Chart => {
                        let path = files.path().join(format!("{name}.yaml"));
                        let pod = super::on_real_node(&as_pod_job(&text));
                        std::fs::write(&path, serde_json::to_string(&pod).unwrap()).unwrap();
                        format!("kubectl apply -f {}", path.display())
                    }
                };
                shell.run_until(&line, T, |r| r.stdout.contains(&name));
                done.push(if name == "hello" {
                    "apply hello"
                } else {
                    "apply long-running"
                });
            }
            (_, ["kubectl", "get", "mj", ..]) => {
                shell.run_until(line, T, |r| r.stdout.contains("hello"));
                done.push("list the jobs");
            }
            (_, ["kubectl", "wait", ..]) => {
                shell.run_until(line, T, |r| r.stdout.contains("condition met"));
                done.push("wait for hello");
            }
            (_, ["managed-jobs", "logs", ..]) => {
                let ran = shell.run_until(line, T, |r| {
                    r.stdout.contains("hello from managed-jobs (job ")
                });
                assert!(noted(&ran), "`{line}`: {ran:#?}");
                done.push("print hello's output");
            }
            (_, ["managed-jobs", "queue", ..]) => {
                let ran = shell.run_until(line, T, |r| {
                    r.stdout.contains(&format!("{ns}/long-running"))
                });
                assert!(
                    noted(&ran) && ran.stdout.starts_with("caps: launch="),
                    "`{line}`: {ran:#?}"
                );
                done.push("see the queue");
            }
            (_, ["kubectl", "patch", "mj", name, ..]) => {
                shell.run_until(line, T, |_| true);
                super::wait_status(
                    client,
                    ns,
                    name,
                    T,
                    "Cancelled",
                    super::phase_is(JobPhase::Cancelled),
                )
                .await;
                done.push("cancel");
            }
            (_, ["kubectl", "delete", "mj", name, ..]) => {
                shell.run_until(line, T, |_| true);
                super::wait_gone(client, ns, name, T).await;
                done.push("delete");
            }
            _ => {
                shell.run_until(line, T, |_| true);
            }
        }
        if let Some(op) = operator.as_mut() {
            let op: &mut Background = op;
            assert!(
                op.running(),
                "the operator exited: {}",
                std::fs::read_to_string(files.path().join("operator.log")).unwrap_or_default()
            );
        }
    }
    assert_eq!(
        done,
        [
            "install the CRDs",
            "run the operator",
            "apply hello",
            "list the jobs",
            "wait for hello",
            "print hello's output",
            "apply long-running",
            "see the queue",
            "cancel",
            "delete",
        ],
        "the README's quick start no longer does what this test checks: {commands:#?}"
    );
    let hello = kube::Api::<ManagedJob>::namespaced(client.clone(), ns)
        .get("hello")
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    assert_eq!(
        (hello.phase, hello.attempt, hello.restart_count),
        (Some(JobPhase::Succeeded), 1, 0),
        "hello ran once: {hello:#?}"
    );
}

/// The local job `yaml` (`spec.run`) as a pod job running the same script with `sh -c` in
/// busybox ([`super::BUSYBOX`], which the real node has), everything else of its spec kept.
pub fn as_pod_job(yaml: &str) -> String {
    let mut job: Value = serde_norway::from_str(yaml).expect("a ManagedJob");
    let spec = job["spec"].as_object_mut().expect("spec");
    let run = spec.remove("run").expect("a local job (spec.run)");
    spec.insert(
        "template".into(),
        serde_json::json!({"spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": super::BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", run],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            }],
        }}),
    );
    serde_norway::to_string(&job).unwrap()
}
