//! The visibility API: a read-only HTTPS server in the operator that shows each caller the
//! queue as the scheduler sees it (positions, reasons, estimated starts, the caps in use), each
//! job's history and kept logs, a plot of the last hour, and a web dashboard over them, under
//! the caller's own Kubernetes permissions ([`auth`]). Nothing is written for it: positions
//! are computed on request from the store ([`view`]), never stored on the objects.
//!
//! Paths, under [`PREFIX`] (`/apis/visibility.managedjobs.dev/v1alpha1`), each also served
//! through the API server as the aggregated API of that group and version (the chart's
//! `APIService`), so that `kubectl get --raw`, `kubectl proxy` and `managed-jobs queue` reach
//! them with a user's own kubeconfig:
//! - `GET /apis`, `/apis/visibility.managedjobs.dev`, `PREFIX`: discovery (no data; served to
//!   anyone, as every API server serves discovery).
//! - `GET PREFIX/namespaces/{ns}/queue[?queue=Q&limit=N]`: that namespace's [`view::JobQueue`];
//!   403 unless the caller may list ManagedJobs there.
//! - `GET PREFIX/queue[?queue=Q&limit=N]`: the `JobQueue` of every namespace the caller may list
//!   ManagedJobs in (for a caller of every namespace: all, with the operator's usage); for a
//!   caller who may list them in none, an empty answer (no caps either), never a 403.
//! - `GET PREFIX/namespaces/{ns}/managedjobs/{name}`: a job's detail (`JobDetail`: its status
//!   as the operator renders it, its transitions and Events, its place in the queue, its kept
//!   logs); 404 when the operator has no such job.
//! - `GET PREFIX/namespaces/{ns}/managedjobs/{name}/log[?attempt=&task=&rank=&container=]`:
//!   a kept log (text); with `?controller=true`, the job controller's log instead; it also
//!   needs `get` on `pods/log` in `ns`.
//! - `GET PREFIX/namespaces/{ns}/history[?minutes=M]` and `PREFIX/history`: the counts of
//!   waiting, launching and running jobs sampled over the last `M` minutes (default 60).
//! - `GET PREFIX/namespaces/{ns}/dashboard` and `PREFIX/dashboard`: the web dashboard (one
//!   page, no data of its own; it reads the paths above as the caller).
//!
//! Reads go through a connection of their own to the store (WAL: never blocking the
//! scheduler's writes), on the blocking pool. The queue is computed at most once per
//! [`QUEUE_TTL`] whoever asks (one computation at a time; concurrent askers share it; past the
//! TTL the last one is still served, up to [`QUEUE_MAX_AGE`], while the next is computed in
//! the background), then cut down to what each caller may see; each cut is serialized once
//! and kept with the queue it was cut from (compressed with gzip for a caller that accepts
//! it), and cut again from the next one before it is served: a caller polling a queue of
//! 10,000 jobs costs a copy of its bytes per request. A
//! burst of requests costs the scheduler nothing and the API server one review per caller and
//! namespace per [`auth::CACHE_TTL`].

// A refusal is the answer itself (an axum `Response`, larger than clippy likes an error to
// be): each handler returns it as it is, once per request.
#![allow(clippy::result_large_err)]

mod answers;
pub mod auth;
pub mod logs;
pub mod tls;
pub mod view;

use answers::{Answer, Generation, Slice, accepts_gzip, ms};
pub use tls::{Options, Peer, TlsListener, tls_config};

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;

use crate::engine::Engine;
use crate::queues::Queues;
use crate::store::Store;
use auth::{Access, Caller, FrontProxy, Refused, Reviewer};

/// The API group of the visibility API.
pub const GROUP: &str = "visibility.managedjobs.dev";

/// The API version of the visibility API, within [`GROUP`].
pub const VERSION: &str = "v1alpha1";

/// The path prefix of every answer: `/apis/<group>/<version>`.
pub const PREFIX: &str = "/apis/visibility.managedjobs.dev/v1alpha1";

/// How long a computed queue is served before it is computed again (from one read
/// transaction of the store): answers are at most this old (`generatedAt` says when), or
/// [`QUEUE_MAX_AGE`] while a newer one is being computed.
pub const QUEUE_TTL: Duration = Duration::from_secs(1);

/// How old a computed queue may be and still be served while the next one is computed in the
/// background (stale while revalidating): a caller polling the queue never waits for a
/// computation; one asking after a pause does.
pub const QUEUE_MAX_AGE: Duration = Duration::from_secs(2);

/// How often the counts plotted by the dashboard are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);

/// The server's shared state.
pub struct Server {
    reviewer: Reviewer,
    front_proxy: Option<FrontProxy>,
    engine: Arc<OnceLock<Arc<Engine>>>,
    reader: Mutex<Option<Store>>,
    /// The last queue computed over every namespace ([`Server::generation`]).
    current: Mutex<Option<Arc<Generation>>>,
    /// Held while the queue is computed: one computation at a time.
    computing: Arc<tokio::sync::Mutex<()>>,
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
        self_signed = options.cert_file.is_none(),
        "serving the visibility API and dashboard"
    );
    let server = Arc::new(Server {
        reviewer: Reviewer::new(client),
        front_proxy,
        engine,
        reader: Mutex::new(None),
        current: Mutex::new(None),
        computing: Arc::default(),
    });
    axum::serve(
        listener,
        router(server).into_make_service_with_connect_info::<Peer>(),
    )
    .await
    .context("the visibility API server stopped")
}

/// The nice value of the server's threads (0 is the operator's own; 19 the lowest priority).
/// Linux gives a thread of nice 10 about a tenth of the CPU a thread of nice 0 gets when both
/// want it, and all of it when the other is idle. Where Linux groups processes by session
/// for the CPU (its autogroups: a desktop, or a host like the benchmark's, where each job
/// controller has a session of its own) it orders the operator's own threads only; in a
/// container (a cgroup of its own) it orders them against the job controllers too.
pub const SERVER_NICE: i32 = 10;

/// Serves the visibility API ([`serve`]) on a thread of its own with a tokio runtime of its
/// own (requests and TLS on that thread; store reads and cuts on at most 4 blocking threads),
/// all at a lower CPU priority ([`SERVER_NICE`]): however hard it is asked, the operator's
/// scheduling passes, watches and status writes, on the operator's runtime, come first for
/// the CPU. Errors: the thread or its runtime could not start.
pub fn spawn(
    options: Options,
    client: kube::Client,
    engine: Arc<OnceLock<Arc<Engine>>>,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("visibility-blocking")
        .on_thread_start(lower_priority)
        .max_blocking_threads(4)
        .build()?;
    std::thread::Builder::new()
        .name("visibility".into())
        .spawn(move || {
            lower_priority();
            let addr = options.addr;
            runtime.block_on(async move {
                if let Err(e) = serve(options, client, engine).await {
                    tracing::error!(error = %format!("{e:#}"), %addr, "the visibility API could not serve on {addr}");
                }
            });
        })?;
    Ok(())
}

/// Lowers the calling thread's CPU priority to [`SERVER_NICE`] (on Linux a thread's nice value
/// is its own). A refusal leaves it as it was.
fn lower_priority() {
    // SAFETY: gettid and setpriority take no pointers; a failure is an error code, ignored.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, SERVER_NICE);
    }
}

/// Samples the counts the dashboard plots every [`SAMPLE_INTERVAL`] until the process ends
/// (a failed sample is logged and skipped).
pub async fn sample_loop(engine: Arc<Engine>) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let e = engine.clone();
        let done = tokio::task::spawn_blocking(move || {
            e.store().record_samples(crate::lifecycle::now_ms())
        })
        .await;
        if let Ok(Err(err)) = done {
            tracing::warn!(error = %err, "sampling the queue's counts failed");
        }
    }
}

fn router(server: Arc<Server>) -> axum::Router {
    axum::Router::new()
        .route("/", get(root))
        .route("/apis", get(group_list))
        .route(&format!("/apis/{GROUP}"), get(group))
        .route(PREFIX, get(resources))
        .route(&format!("{PREFIX}/queue"), get(all_queues))
        .route(
            &format!("{PREFIX}/namespaces/{{ns}}/queue"),
            get(namespace_queue),
        )
        .route(&format!("{PREFIX}/history"), get(all_history))
        .route(
            &format!("{PREFIX}/namespaces/{{ns}}/history"),
            get(namespace_history),
        )
        .route(
            &format!("{PREFIX}/namespaces/{{ns}}/managedjobs/{{name}}"),
            get(job_detail),
        )
        .route(
            &format!("{PREFIX}/namespaces/{{ns}}/managedjobs/{{name}}/log"),
            get(job_log),
        )
        .route(&format!("{PREFIX}/dashboard"), get(dashboard))
        .route(
            &format!("{PREFIX}/namespaces/{{ns}}/dashboard"),
            get(dashboard),
        )
        .fallback(not_found)
        .with_state(server)
}

/// A refusal or failure as a Kubernetes `Status` object.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let mut r = (
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
        .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An answer as JSON, never cached by a browser or proxy (it is one caller's).
fn answer<T: serde::Serialize>(value: &T) -> Response {
    let mut r = axum::Json(value).into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An answer already serialized as JSON (compressed or not), as [`answer`] sends it.
fn json_answer(answer: Answer) -> Response {
    let mut r = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        answer.body,
    )
        .into_response();
    let h = r.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
    if answer.gzip {
        h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    r
}

impl From<Refused> for Response {
    fn from(r: Refused) -> Response {
        match r {
            Refused::Unauthenticated(m) => status(StatusCode::UNAUTHORIZED, "Unauthorized", m),
            Refused::Forbidden(m) => status(StatusCode::FORBIDDEN, "Forbidden", m),
            Refused::Unavailable(m) => {
                status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", m)
            }
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
                "no credential: send a bearer token (Authorization: Bearer ...), or go through the API server (kubectl get --raw, kubectl proxy)"
                    .into(),
            )),
        }
    }

    /// The caller, if it may do every one of `needs` in `ns`; else the refusal (401, 403, 503).
    async fn allowed(
        &self,
        peer: &Peer,
        headers: &HeaderMap,
        ns: &str,
        needs: &[Access],
    ) -> Result<Caller, Response> {
        let caller = self.caller(peer, headers).await?;
        for access in needs {
            if !self.reviewer.may(&caller, ns, *access).await? {
                return Err(Refused::Forbidden(format!(
                    "{} may not {} in namespace {ns}",
                    caller.username,
                    access.describe()
                ))
                .into());
            }
        }
        Ok(caller)
    }

    /// The namespaces a caller of every-namespace paths sees: None (all) when it may list
    /// ManagedJobs in every namespace, else those of `candidates` it may list them in (none:
    /// an empty set, and so an empty answer).
    async fn visible(
        self: &Arc<Self>,
        peer: &Peer,
        headers: &HeaderMap,
        candidates: impl FnOnce(&mut Store) -> anyhow::Result<Vec<String>> + Send + 'static,
    ) -> Result<Option<BTreeSet<String>>, Response> {
        let caller = self.caller(peer, headers).await?;
        if self
            .reviewer
            .may(&caller, "", Access::ListManagedJobs)
            .await?
        {
            return Ok(None);
        }
        let namespaces = self.read(move |_, store| candidates(store)).await?;
        self.visible_among(&caller, namespaces).await.map(Some)
    }

    /// Those of `namespaces` in which `caller` may list ManagedJobs; an empty set when none
    /// (an every-namespace path lists what the caller may see: for a caller who may see no
    /// namespace, nothing, never a refusal that would tell it apart from one who may).
    async fn visible_among(
        &self,
        caller: &Caller,
        namespaces: Vec<String>,
    ) -> Result<BTreeSet<String>, Response> {
        let answers: Vec<(String, Result<bool, Refused>)> =
            futures::stream::iter(namespaces.into_iter().map(|ns| {
                let reviewer = &self.reviewer;
                async move {
                    let allowed = reviewer.may(caller, &ns, Access::ListManagedJobs).await;
                    (ns, allowed)
                }
            }))
            .buffer_unordered(REVIEWS_AT_ONCE)
            .collect()
            .await;
        let mut visible = BTreeSet::new();
        for (ns, allowed) in answers {
            if allowed? {
                visible.insert(ns);
            }
        }
        Ok(visible)
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
                *held = Some(Store::open_current(
                    &engine.state_dir().store(),
                    READER_CACHE_KIB,
                )?);
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

    /// The computed queue to answer from: the last one while it is younger than
    /// [`QUEUE_TTL`]; older, but younger than [`QUEUE_MAX_AGE`], the last one too, with a new
    /// computation started in the background (unless one runs: callers polling the queue
    /// never wait for one); older still, or none yet, a new one (concurrent askers wait for the
    /// one under way).
    async fn generation(self: &Arc<Self>) -> Result<Arc<Generation>, Response> {
        let last = self.current();
        if let Some(g) = &last {
            let age = g.at.elapsed();
            if age < QUEUE_TTL {
                return Ok(g.clone());
            }
            if age < QUEUE_MAX_AGE {
                if let Ok(computing) = self.computing.clone().try_lock_owned() {
                    let (me, last) = (self.clone(), g.clone());
                    tokio::spawn(async move {
                        let _computing = computing;
                        // A failure is the next asker's to see.
                        let _ = me.compute(Some(last)).await;
                    });
                }
                return Ok(g.clone());
            }
        }
        let _computing = self.computing.lock().await;
        if let Some(g) = self.current()
            && g.at.elapsed() < QUEUE_TTL
        {
            return Ok(g);
        }
        self.compute(None).await
    }

    /// The last computed queue.
    fn current(&self) -> Option<Arc<Generation>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Computes the queue (the caller holds `computing`) and makes it the current one; with
    /// `last`, the answers kept with it are cut again from the new one first (off the
    /// server's thread), so that its callers find theirs ready.
    async fn compute(
        self: &Arc<Self>,
        last: Option<Arc<Generation>>,
    ) -> Result<Arc<Generation>, Response> {
        let started = Instant::now();
        let all = Arc::new(self.read(read_queue).await?);
        let generation = Arc::new(Generation {
            at: started,
            all,
            answers: Mutex::default(),
        });
        let slices: Vec<Slice> = last.map(|g| g.asked()).unwrap_or_default();
        let cut = slices.len();
        if !slices.is_empty() {
            let g = generation.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for slice in slices {
                    if let Ok(answer) = slice.answer(&g.all) {
                        g.keep(slice, &answer, false);
                    }
                }
            })
            .await;
        }
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(generation.clone());
        tracing::debug!(
            total_ms = ms(started),
            answers_cut = cut,
            waiting = generation.all.waiting.len(),
            "visibility API: queue computed"
        );
        Ok(generation)
    }
}

/// SubjectAccessReviews asked at once for one request over many namespaces.
const REVIEWS_AT_ONCE: usize = 16;

/// Page cache of the server's store connection, KiB: a queue of 10,000 jobs reads a few MiB of
/// rows through it once per [`QUEUE_TTL`].
const READER_CACHE_KIB: u32 = 8 * 1024;

use futures::StreamExt as _;

async fn root() -> Response {
    axum::response::Redirect::to(&format!("{PREFIX}/dashboard")).into_response()
}

async fn not_found() -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!(
            "no such path: the visibility API serves {PREFIX}/... (see its discovery at {PREFIX})"
        ),
    )
}

async fn group_list() -> Response {
    answer(&json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [group_json()],
    }))
}

async fn group() -> Response {
    answer(&group_json())
}

fn group_json() -> serde_json::Value {
    json!({
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": [{"groupVersion": view::API_VERSION, "version": "v1alpha1"}],
        "preferredVersion": {"groupVersion": view::API_VERSION, "version": "v1alpha1"},
    })
}

async fn resources() -> Response {
    answer(&json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": view::API_VERSION,
        "resources": [
            {"name": "queue", "singularName": "queue", "namespaced": true, "kind": "JobQueue", "verbs": ["list"]},
            {"name": "history", "singularName": "history", "namespaced": true, "kind": "QueueHistory", "verbs": ["list"]},
            {"name": "managedjobs", "singularName": "managedjob", "namespaced": true, "kind": "JobDetail", "verbs": ["get"]},
            {"name": "managedjobs/log", "singularName": "", "namespaced": true, "kind": "JobLog", "verbs": ["get"]},
            {"name": "dashboard", "singularName": "dashboard", "namespaced": true, "kind": "Dashboard", "verbs": ["list"]},
        ],
    }))
}

/// `?queue=` and `?limit=` of the queue paths.
#[derive(Debug, Default, Deserialize)]
struct QueueQuery {
    /// Only this ManagedJobQueue's jobs.
    queue: Option<String>,
    /// At most this many waiting jobs (the first in admission order).
    limit: Option<usize>,
}

async fn namespace_queue(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(ns): Path<String>,
    Query(q): Query<QueueQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = server
        .allowed(&peer, &headers, &ns, &[Access::ListManagedJobs])
        .await
    {
        return r;
    }
    let generation = match server.generation().await {
        Ok(g) => g,
        Err(r) => return r,
    };
    let slice = Slice {
        visible: Some([ns].into()),
        queue: q.queue,
        limit: q.limit,
        gzip: accepts_gzip(&headers),
    };
    queue_answer(&generation, slice).await
}

/// The `JobQueue` answer of `slice`: kept with `generation`, or cut from it now (off the
/// server's thread) and kept.
async fn queue_answer(generation: &Arc<Generation>, slice: Slice) -> Response {
    if let Some(answer) = generation.kept(&slice) {
        return json_answer(answer);
    }
    let g = generation.clone();
    let cut = tokio::task::spawn_blocking(move || {
        let answer = slice.answer(&g.all)?;
        g.keep(slice, &answer, true);
        std::io::Result::Ok(answer)
    })
    .await;
    match cut {
        Ok(Ok(answer)) => json_answer(answer),
        Ok(Err(e)) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("serializing the queue failed: {e}"),
        ),
        Err(e) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("serializing the queue failed: {e}"),
        ),
    }
}

async fn all_queues(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Query(q): Query<QueueQuery>,
    headers: HeaderMap,
) -> Response {
    let caller = match server.caller(&peer, &headers).await {
        Ok(c) => c,
        Err(r) => return r.into(),
    };
    let every = match server
        .reviewer
        .may(&caller, "", Access::ListManagedJobs)
        .await
    {
        Ok(every) => every,
        Err(r) => return r.into(),
    };
    let generation = match server.generation().await {
        Ok(g) => g,
        Err(r) => return r,
    };
    let visible = if every {
        None
    } else {
        // The namespaces with jobs not finished, as of the queue answered from.
        let candidates = generation
            .all
            .counts
            .iter()
            .map(|c| c.namespace.clone())
            .collect();
        match server.visible_among(&caller, candidates).await {
            Ok(v) => Some(v),
            Err(r) => return r,
        }
    };
    let slice = Slice {
        visible,
        queue: q.queue,
        limit: q.limit,
        gzip: accepts_gzip(&headers),
    };
    queue_answer(&generation, slice).await
}

/// `?minutes=` and `?queue=` of the history paths.
#[derive(Debug, Default, Deserialize)]
struct HistoryQuery {
    /// How far back, minutes (default 60, at most 120).
    minutes: Option<u32>,
    /// Only this ManagedJobQueue's jobs.
    queue: Option<String>,
}

/// The `QueueHistory` answer: the samples of `visible` (None: all namespaces).
async fn history_of(
    server: &Arc<Server>,
    visible: Option<BTreeSet<String>>,
    q: HistoryQuery,
) -> Response {
    let minutes = q.minutes.unwrap_or(60).clamp(1, 120);
    let now = crate::lifecycle::now_ms();
    let since = now - i64::from(minutes) * 60_000;
    let (shown, queue) = (visible.clone(), q.queue.clone());
    // A caller who may see no namespace gets an empty answer: not even when samples were taken.
    let sees_nothing = visible.as_ref().is_some_and(|v| v.is_empty());
    match server
        .read(move |_, store| {
            if sees_nothing {
                return Ok(Vec::new());
            }
            Ok(store.samples(since, shown.as_ref(), queue.as_deref())?)
        })
        .await
    {
        Ok(samples) => answer(&json!({
            "apiVersion": view::API_VERSION,
            "kind": "QueueHistory",
            "generatedAt": view::rfc3339(now),
            "namespaces": visible.map(|v| v.into_iter().collect::<Vec<_>>()).unwrap_or_default(),
            "queue": q.queue,
            "intervalSeconds": SAMPLE_INTERVAL.as_secs(),
            "samples": samples.iter().map(|s| json!({
                "at": view::rfc3339(s.at_ms),
                "waiting": s.waiting,
                "launching": s.launching,
                "running": s.running,
            })).collect::<Vec<_>>(),
        })),
        Err(r) => r,
    }
}

async fn namespace_history(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path(ns): Path<String>,
    Query(q): Query<HistoryQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = server
        .allowed(&peer, &headers, &ns, &[Access::ListManagedJobs])
        .await
    {
        return r;
    }
    history_of(&server, Some([ns].into()), q).await
}

async fn all_history(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Query(q): Query<HistoryQuery>,
    headers: HeaderMap,
) -> Response {
    let since = crate::lifecycle::now_ms() - 120 * 60_000;
    let visible = match server
        .visible(&peer, &headers, move |store| {
            let mut ns: BTreeSet<String> = store.open_namespaces()?.into_iter().collect();
            ns.extend(store.sampled_namespaces(since)?);
            Ok(ns.into_iter().collect())
        })
        .await
    {
        Ok(v) => v,
        Err(r) => return r,
    };
    history_of(&server, visible, q).await
}

/// The operator's newest job named `ns/name`, with its history.
fn find_job(
    store: &Store,
    ns: &str,
    name: &str,
) -> anyhow::Result<
    Option<(
        crate::lifecycle::JobRow,
        Vec<crate::lifecycle::record::HistoryEntry>,
    )>,
> {
    let Some(row) = store
        .find_by_name(ns, name)?
        .into_iter()
        .max_by_key(|r| r.id)
    else {
        return Ok(None);
    };
    let history = store.history(row.id)?;
    Ok(Some((row, history)))
}

async fn job_detail(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = server
        .allowed(&peer, &headers, &ns, &[Access::ListManagedJobs])
        .await
    {
        return r;
    }
    let (ns2, name2) = (ns.clone(), name.clone());
    let found = server
        .read(move |engine, store| {
            let Some((row, history)) = find_job(store, &ns2, &name2)? else {
                return Ok(None);
            };
            let logs = logs::listed(engine.state_dir(), &row);
            let pods = logs::live_pods(store, &row)?;
            Ok(Some((row, history, logs, pods)))
        })
        .await;
    let (row, history, logs, pods) = match found {
        Ok(Some(found)) => found,
        Ok(None) => {
            return status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("the operator has no job {ns}/{name}"),
            );
        }
        Err(r) => return r,
    };
    // Its place among its namespace's waiting jobs, as the queue path shows it.
    let waiting = match server.generation().await {
        Ok(g) => view::waiting_in_namespace(&g.all, &ns, row.id),
        Err(_) => None,
    };
    let events = crate::events::events_for(&history, 0);
    answer(&json!({
        "apiVersion": view::API_VERSION,
        "kind": "JobDetail",
        "metadata": {"namespace": ns, "name": name},
        "jobId": row.id,
        "queue": row.queue,
        "priority": row.spec.priority,
        "executor": row.executor.as_str(),
        "nodes": row.spec.nodes,
        "tasks": row.spec.tasks.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
        "status": crate::status::status(&row),
        "waiting": waiting,
        "transitions": history.iter().map(|h| json!({
            "at": view::rfc3339(h.at_ms),
            "fromPhase": h.from_phase.map(|p| p.as_str()),
            "phase": h.to_phase.as_str(),
            "fromScheduleState": h.from_schedule.map(|s| s.as_str()),
            "scheduleState": h.to_schedule.as_str(),
            "reason": h.reason.as_str(),
            "message": h.message,
        })).collect::<Vec<_>>(),
        "events": events.iter().map(|e| json!({
            "at": view::rfc3339(e.at_ms),
            "type": e.type_.as_str(),
            "reason": e.reason,
            "note": e.note,
        })).collect::<Vec<_>>(),
        "logs": logs,
        "pods": pods,
    }))
}

/// `?attempt=&task=&rank=&container=&limitBytes=&controller=` of the log path.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    /// A pod job's attempt (the job's count, from 1); default: the latest of each task.
    attempt: Option<i32>,
    /// A pipeline's task: its name, or its index from 0.
    task: Option<String>,
    /// A multi-node job's rank.
    rank: Option<u32>,
    /// One container's log only.
    container: Option<String>,
    /// At most the last this many bytes of each log (default and most: [`logs::MAX_BYTES`]).
    limit_bytes: Option<u64>,
    /// The job controller's log instead of the workload's.
    controller: Option<bool>,
}

async fn job_log(
    State(server): State<Arc<Server>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    Path((ns, name)): Path<(String, String)>,
    Query(q): Query<LogQuery>,
    headers: HeaderMap,
) -> Response {
    if let Err(r) = server
        .allowed(
            &peer,
            &headers,
            &ns,
            &[Access::ListManagedJobs, Access::ReadPodLogs],
        )
        .await
    {
        return r;
    }
    let (ns2, name2) = (ns.clone(), name.clone());
    let shown = server
        .read(move |engine, store| {
            let Some((row, _)) = find_job(store, &ns2, &name2)? else {
                return Ok(Err(logs::Missing::NotFound(format!(
                    "the operator has no job {ns2}/{name2}"
                ))));
            };
            let filter = logs::Filter {
                attempt: q.attempt,
                task: q.task.clone(),
                rank: q.rank,
                container: q.container.clone(),
                limit_bytes: q.limit_bytes,
                controller: q.controller.unwrap_or(false),
            };
            logs::read(store, engine.state_dir(), &row, &filter)
        })
        .await;
    match shown {
        Ok(Ok(text)) => {
            let mut r =
                ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response();
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            r
        }
        Ok(Err(logs::Missing::NotFound(why))) => status(StatusCode::NOT_FOUND, "NotFound", why),
        Ok(Err(logs::Missing::BadRequest(why))) => {
            status(StatusCode::BAD_REQUEST, "BadRequest", why)
        }
        Err(r) => r,
    }
}

async fn dashboard() -> Response {
    let mut r = axum::response::Html(DASHBOARD).into_response();
    let h = r.headers_mut();
    // One self-contained page: its script and style inline, data from this origin only.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        ),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    r
}

/// The dashboard: one page, its script and style inline, no external resource.
pub const DASHBOARD: &str = include_str!("dashboard.html");

/// The queue over every namespace, from one read transaction of the store, under the
/// engine's queues ([`queue_from_store`]).
pub fn read_queue(engine: &Engine, store: &mut Store) -> anyhow::Result<view::JobQueue> {
    let queues = engine
        .queues()
        .context("the operator has not listed the queues yet")?;
    queue_from_store(store, &queues)
}

/// The queue over every namespace under `queues`, from one read transaction of `store`: what
/// the scheduler would admit next and why each job waits ([`view::queue`]).
pub fn queue_from_store(store: &mut Store, queues: &Queues) -> anyhow::Result<view::JobQueue> {
    store.read_consistently(|store| {
        let start = Instant::now();
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
            let run_times_ms: Vec<i64> = store
                .recent_run_times(q, now_ms - view::RUN_TIME_WINDOW_MS, view::RUN_TIME_SAMPLES)?
                .into_iter()
                .map(|(ms, _)| ms)
                .collect();
            let ages_ms = live
                .iter()
                .filter(|j| j.queue == *q)
                .map(|j| j.running_since_ms.map_or(0, |t| (now_ms - t).max(0)))
                .collect();
            let p = view::Pace {
                queue: q.clone(),
                run_times_ms,
                ages_ms,
            };
            pace.insert(q.clone(), p);
        }
        let wait =
            crate::scheduler::wait_context(store, caps, queues, &loads, &waiting_queues, usage)?;
        let quotas = if queues.any_quotas() {
            view::quotas(queues, store.quota_usage()?)
        } else {
            Vec::new()
        };
        let snapshot = view::Snapshot {
            now_ms,
            caps,
            usage,
            queues,
            loads: &loads,
            waiting: &waiting,
            live: &live,
            inactive: &inactive,
            pace: &pace,
            wait: &wait,
            quotas: &quotas,
        };
        let reads_ms = ms(start);
        let computed = Instant::now();
        let q = view::queue(&snapshot);
        tracing::debug!(
            reads_ms,
            view_ms = ms(computed),
            waiting = q.waiting.len(),
            "visibility API: queue read and ordered"
        );
        Ok(q)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepting(values: &[&str]) -> bool {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(header::ACCEPT_ENCODING, HeaderValue::from_str(v).unwrap());
        }
        accepts_gzip(&headers)
    }

    #[test]
    fn gzip_only_for_a_caller_that_accepts_it() {
        assert!(accepting(&["gzip"]));
        assert!(accepting(&["gzip, deflate, br, zstd"]));
        assert!(accepting(&["br;q=1.0, GZIP;q=0.5"]));
        assert!(accepting(&["identity", "*"]));
        assert!(!accepting(&[]));
        assert!(!accepting(&["identity"]));
        assert!(!accepting(&["gzip;q=0"]));
        assert!(!accepting(&["deflate, gzip; q=0.000"]));
        assert!(!accepting(&["x-gzip"]));
    }
}
