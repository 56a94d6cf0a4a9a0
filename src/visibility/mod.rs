//! The visibility API: a read-only HTTPS server in the operator that shows each caller the
//! queue as the scheduler sees it (positions, reasons, estimated starts, the caps in use) and
//! each job's history, under the caller's own Kubernetes permissions ([`auth`]).
//!
//! Paths (JSON), each also served through the API server as the aggregated API
//! `visibility.managedjobs.dev/v1alpha1` (the chart's `APIService`), so that
//! `kubectl get --raw /apis/visibility.managedjobs.dev/v1alpha1/namespaces/NS/queue` and
//! `managed-jobs queue -n NS` work with a user's kubeconfig:
//! - `GET /apis/visibility.managedjobs.dev/v1alpha1`: discovery (`APIResourceList`).
//! - `GET .../namespaces/{ns}/queue`: that namespace's [`view::JobQueue`]; 403 unless the
//!   caller may list ManagedJobs there.
//! - `GET .../queue`: the `JobQueue` of every namespace the caller may list ManagedJobs in
//!   (all, with the operator's total usage, for a caller of every namespace); 403 when none.
//! - `GET .../namespaces/{ns}/managedjobs/{name}`: a job's status as the operator renders it
//!   and its history (`JobHistory`); 404 when the store has no such job.
//!
//! Reads go through a connection of their own to the store (WAL: never blocking the
//! scheduler's writes), on the blocking pool.

pub mod auth;
pub mod view;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context as _;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use crate::engine::Engine;
use crate::store::Store;
use auth::{Caller, FrontProxy, Refused, Reviewer};

/// Where and how the visibility API serves.
#[derive(Clone, Debug)]
pub struct Options {
    /// The address to listen on (`--visibility-addr`).
    pub addr: SocketAddr,
    /// The server's certificate chain (PEM, `--visibility-tls-cert-file`).
    pub cert_file: PathBuf,
    /// Its private key (PEM, `--visibility-tls-key-file`).
    pub key_file: PathBuf,
}

/// The connection a request came over: its peer, and whether that peer presented a client
/// certificate of the cluster's front proxy (only then are `X-Remote-*` headers believed).
#[derive(Clone, Debug)]
pub struct Peer {
    /// The remote address.
    pub addr: SocketAddr,
    /// The front proxy's certificate was verified on this connection.
    pub front_proxy: bool,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Peer {
        stream.remote_addr().clone()
    }
}

/// Accepts TCP connections and completes their TLS handshakes off the accept loop (a slow
/// client delays only itself), handing each finished one to the server.
pub struct TlsListener {
    local: SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, Peer)>,
}

/// Handshakes under way at most; more wait in the kernel's backlog.
const HANDSHAKES: usize = 64;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl TlsListener {
    /// Listens on `addr` with `config`; front-proxy certificates are those
    /// [`FrontProxy::allows`].
    pub async fn bind(
        addr: SocketAddr,
        config: Arc<rustls::ServerConfig>,
        front_proxy: Option<FrontProxy>,
    ) -> std::io::Result<TlsListener> {
        let tcp = tokio::net::TcpListener::bind(addr).await?;
        let local = tcp.local_addr()?;
        let (tx, ready) = tokio::sync::mpsc::channel(HANDSHAKES);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let limit = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES));
        tokio::spawn(async move {
            loop {
                let (stream, remote) = match tcp.accept().await {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "visibility API: accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Ok(permit) = limit.clone().acquire_owned().await else {
                    return;
                };
                let (acceptor, tx, front_proxy) =
                    (acceptor.clone(), tx.clone(), front_proxy.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let tls =
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                        {
                            Ok(Ok(tls)) => tls,
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, %remote, "visibility API: TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                    let front = front_proxy.as_ref().is_some_and(|fp| {
                        tls.get_ref()
                            .1
                            .peer_certificates()
                            .and_then(|c| c.first())
                            .and_then(|der| common_name(der.as_ref()))
                            .is_some_and(|cn| fp.allows(&cn))
                    });
                    let _ = tx
                        .send((
                            tls,
                            Peer {
                                addr: remote,
                                front_proxy: front,
                            },
                        ))
                        .await;
                });
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop ended (it never does while the process runs): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Peer> {
        Ok(Peer {
            addr: self.local,
            front_proxy: false,
        })
    }
}

/// The subject common name of a DER certificate.
fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// The TLS settings: the server's certificate and key from `options`, and, with `front_proxy`,
/// client certificates of its CA accepted (not required: a bearer token needs none).
///
/// Errors: unreadable or invalid PEM files, a key that does not match.
pub fn tls_config(
    options: &Options,
    front_proxy: Option<&FrontProxy>,
) -> anyhow::Result<Arc<rustls::ServerConfig>> {
    use rustls_pki_types::pem::PemObject as _;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&options.cert_file)
        .with_context(|| format!("--visibility-tls-cert-file {}", options.cert_file.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("--visibility-tls-cert-file {}", options.cert_file.display()))?;
    anyhow::ensure!(
        !certs.is_empty(),
        "--visibility-tls-cert-file {} holds no certificate",
        options.cert_file.display()
    );
    let key = PrivateKeyDer::from_pem_file(&options.key_file)
        .with_context(|| format!("--visibility-tls-key-file {}", options.key_file.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?;
    let builder = match front_proxy {
        Some(fp) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(fp.client_ca_pem.as_bytes()) {
                roots
                    .add(ca.context("the request-header CA of extension-apiserver-authentication")?)
                    .context("the request-header CA of extension-apiserver-authentication")?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .allow_unauthenticated()
                    .build()
                    .context("the front proxy's client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the visibility API's certificate and key do not match")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server's shared state.
pub struct Server {
    reviewer: Reviewer,
    front_proxy: Option<FrontProxy>,
    engine: Arc<OnceLock<Arc<Engine>>>,
    reader: Mutex<Option<Store>>,
}

/// Serves the visibility API on `options.addr` until the process ends; `engine` is set once
/// the operator leads (before: 503). Errors: the TLS files, the address taken.
pub async fn serve(
    options: Options,
    client: kube::Client,
    engine: Arc<OnceLock<Arc<Engine>>>,
) -> anyhow::Result<()> {
    let front_proxy = FrontProxy::discover(&client).await;
    let config = tls_config(&options, front_proxy.as_ref())?;
    let listener = TlsListener::bind(options.addr, config, front_proxy.clone())
        .await
        .with_context(|| format!("--visibility-addr {}", options.addr))?;
    tracing::info!(
        addr = %options.addr,
        through_api_server = front_proxy.is_some(),
        "serving the visibility API"
    );
    let server = Arc::new(Server {
        reviewer: Reviewer::new(client),
        front_proxy,
        engine,
        reader: Mutex::new(None),
    });
    axum::serve(
        listener,
        router(server).into_make_service_with_connect_info::<Peer>(),
    )
    .await
    .context("the visibility API server stopped")
}

const PREFIX: &str = "/apis/visibility.managedjobs.dev/v1alpha1";

fn router(server: Arc<Server>) -> axum::Router {
    axum::Router::new()
        .route(PREFIX, get(discovery))
        .route(&format!("{PREFIX}/queue"), get(all_queues))
        .route(&format!("{PREFIX}/namespaces/{{ns}}/queue"), get(namespace_queue))
        .route(
            &format!("{PREFIX}/namespaces/{{ns}}/managedjobs/{{name}}"),
            get(job_history),
        )
        .with_state(server)
}

/// A refusal or failure as a Kubernetes `Status` object.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    (
        code,
        axum::Json(json!({
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "reason": reason,
            "message": message,
            "code": code.as_u16(),
        })),
    )
        .into_response()
}

impl From<Refused> for Response {
    fn from(r: Refused) -> Response {
        match r {
            Refused::Unauthenticated(m) => status(StatusCode::UNAUTHORIZED, "Unauthorized", m),
            Refused::Forbidden(m) => status(StatusCode::FORBIDDEN, "Forbidden", m),
            Refused::Unavailable(m) => status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", m),
        }
    }
}

impl Server {
    /// The caller of a request over `peer` with `headers` ([`auth`]).
    async fn caller(&self, peer: &Peer, headers: &HeaderMap) -> Result<Caller, Refused> {
        if peer.front_proxy
            && let Some(fp) = &self.front_proxy
            && let Some(caller) = fp.caller(headers)
        {
            return Ok(caller);
        }
        match auth::bearer(headers) {
            Some(token) => self.reviewer.token(token).await,
            None => Err(Refused::Unauthenticated(
                "no credential: send a bearer token (Authorization: Bearer ...), or go through the API server"
                    .into(),
            )),
        }
    }

    fn engine(&self) -> Result<Arc<Engine>, Response> {
        self.engine.get().cloned().ok_or_else(|| {
            status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the operator is starting (or standing by for its Lease)".into(),
            )
        })
    }

    /// Runs `f` on the server's own store connection, on the blocking pool.
    async fn read<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&Engine, &mut Store) -> anyhow::Result<T> + Send + 'static,
    ) -> Result<T, Response> {
        let engine = self.engine()?;
        let me = self.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let mut held = me.reader.lock().unwrap_or_else(|e| e.into_inner());
            if held.is_none() {
                *held = Some(Store::open_current(&engine.state_dir().store(), 8 * 1024)?);
            }
            f(&engine, held.as_mut().expect("opened"))
        })
        .await;
        match joined {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                tracing::warn!(error = %format!("{e:#}"), "visibility API: reading the store failed");
                Err(status(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "InternalError",
                    format!("reading the store failed: {e:#}"),
                ))
            }
            Err(e) => Err(status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("reading the store failed: {e}"),
            )),
        }
    }
}

async fn discovery() -> Response {
    axum::Json(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": view::API_VERSION,
        "resources": [
            {"name": "queue", "singularName": "queue", "namespaced": true, "kind": "JobQueue", "verbs": ["get", "list"]},
            {"name": "managedjobs", "singularName": "managedjob", "namespaced": true, "kind": "JobHistory", "verbs": ["get"]},
        ],
    }))
    .into_response()
}

async fn namespace_queue(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(ns): Path<String>,
    headers: HeaderMap,
) -> Response {
    let caller = match server.caller(&peer, &headers).await {
        Ok(c) => c,
        Err(r) => return r.into(),
    };
    match server.reviewer.may_list(&caller, &ns).await {
        Ok(true) => {}
        Ok(false) => {
            return Refused::Forbidden(format!(
                "{} may not list managedjobs.managedjobs.dev in namespace {ns}",
                caller.username
            ))
            .into();
        }
        Err(r) => return r.into(),
    }
    let visible: BTreeSet<String> = [ns].into();
    match server
        .read(move |engine, store| read_queue(engine, store, Some(&visible)))
        .await
    {
        Ok(q) => axum::Json(q).into_response(),
        Err(r) => r,
    }
}

async fn all_queues(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    headers: HeaderMap,
) -> Response {
    let caller = match server.caller(&peer, &headers).await {
        Ok(c) => c,
        Err(r) => return r.into(),
    };
    let everywhere = match server.reviewer.may_list(&caller, "").await {
        Ok(v) => v,
        Err(r) => return r.into(),
    };
    let visible = if everywhere {
        None
    } else {
        let namespaces = match server.read(|_, store| Ok(store.open_namespaces()?)).await {
            Ok(n) => n,
            Err(r) => return r,
        };
        let mut visible = BTreeSet::new();
        for ns in namespaces {
            match server.reviewer.may_list(&caller, &ns).await {
                Ok(true) => {
                    visible.insert(ns);
                }
                Ok(false) => {}
                Err(r) => return r.into(),
            }
        }
        if visible.is_empty() {
            return Refused::Forbidden(format!(
                "{} may not list managedjobs.managedjobs.dev in any namespace that has jobs",
                caller.username
            ))
            .into();
        }
        Some(visible)
    };
    match server
        .read(move |engine, store| read_queue(engine, store, visible.as_ref()))
        .await
    {
        Ok(q) => axum::Json(q).into_response(),
        Err(r) => r,
    }
}

async fn job_history(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let caller = match server.caller(&peer, &headers).await {
        Ok(c) => c,
        Err(r) => return r.into(),
    };
    match server.reviewer.may_list(&caller, &ns).await {
        Ok(true) => {}
        Ok(false) => {
            return Refused::Forbidden(format!(
                "{} may not list managedjobs.managedjobs.dev in namespace {ns}",
                caller.username
            ))
            .into();
        }
        Err(r) => return r.into(),
    }
    let (ns2, name2) = (ns.clone(), name.clone());
    let found = server
        .read(move |_, store| {
            let Some(row) = store.find_by_name(&ns2, &name2)?.into_iter().max_by_key(|r| r.id)
            else {
                return Ok(None);
            };
            let history = store.history(row.id)?;
            Ok(Some((row, history)))
        })
        .await;
    match found {
        Ok(Some((row, history))) => axum::Json(json!({
            "apiVersion": view::API_VERSION,
            "kind": "JobHistory",
            "metadata": {"namespace": ns, "name": name},
            "status": crate::status::status(&row),
            "history": history.iter().map(|h| json!({
                "at": view::rfc3339(h.at_ms),
                "fromPhase": h.from_phase.map(|p| p.as_str()),
                "phase": h.to_phase.as_str(),
                "fromScheduleState": h.from_schedule.map(|s| s.as_str()),
                "scheduleState": h.to_schedule.as_str(),
                "reason": h.reason.as_str(),
                "message": h.message,
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
        Ok(None) => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the operator has no job {ns}/{name}"),
        ),
        Err(r) => r,
    }
}

/// The `JobQueue` for `visible` (None: every namespace), from one read transaction.
pub fn read_queue(
    engine: &Engine,
    store: &mut Store,
    visible: Option<&BTreeSet<String>>,
) -> anyhow::Result<view::JobQueue> {
    let queues = engine
        .queues()
        .context("the operator has not listed the queues yet")?;
    store.read_consistently(|store| {
        let now_ms = crate::lifecycle::now_ms();
        let caps = store
            .settings()?
            .caps
            .context("the operator has not written its caps yet")?;
        let usage = store.slot_usage()?;
        let loads = store.queue_usage()?;
        let waiting = store.waiting_brief()?;
        let live = store.live_brief()?;
        let inactive = store.inactive_brief()?;
        let waiting_queues: Vec<String> = waiting
            .iter()
            .map(|j| j.queue.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut pace = std::collections::BTreeMap::new();
        for q in &waiting_queues {
            let runs: Vec<i64> = store
                .recent_run_times(q, now_ms - view::RUN_TIME_WINDOW_MS, view::RUN_TIME_SAMPLES)?
                .into_iter()
                .map(|(ms, _)| ms)
                .collect();
            let running = loads.get(q).map_or(0, |l| l.alive);
            if let Some(t) = view::Throughput::of(running, &runs) {
                pace.insert(q.clone(), t);
            }
        }
        let wait =
            crate::scheduler::wait_context(store, caps, &queues, &loads, &waiting_queues, usage)?;
        let snapshot = view::Snapshot {
            now_ms,
            caps,
            usage,
            queues: &queues,
            loads: &loads,
            waiting: &waiting,
            live: &live,
            inactive: &inactive,
            pace: &pace,
            wait: &wait,
        };
        Ok(view::queue(&snapshot, visible))
    })
}
