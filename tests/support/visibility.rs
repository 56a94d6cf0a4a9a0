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

/// Grants `user` in `namespace` what a team member who reads its jobs has: list and watch
/// ManagedJobs and read Pod logs there (a Role and its RoleBinding, named `name`).
pub fn grant_reader(cp: &ControlPlane, name: &str, namespace: &str, user: &User) {
    apply(
        cp,
        &format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}, namespace: {namespace}}}
rules:
  - apiGroups: [managedjobs.dev]
    resources: [managedjobs]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [pods, pods/log]
    verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{kind: User, name: "{user}"}}]
"#,
            user = user.username
        ),
    );
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
