//! The visibility API and dashboard (`src/visibility`), as users reach them: straight to the
//! operator with a bearer token, through the real API server as the aggregated API (an
//! APIService fronting a test's operator on this host), with `managed-jobs queue` and a user's
//! kubeconfig, and in a real headless Chromium through `kubectl proxy`. Users are
//! ServiceAccounts with real RBAC; every answer is checked for what it must leave out.
//!
//! Each test runs its own operator over every namespace with a shard of its own (only its
//! jobs); one APIService exists per cluster, so the tests that register it hold [`ONE_API`].

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use kube::Client;
use serde_json::Value;
use support::browser::Browser;
use support::visibility::{self as vis, ApiService, PREFIX, Proxy, Served, User};
use support::{OperatorProcess, TestNamespace};

/// One APIService at a time (it is cluster-wide).
static ONE_API: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const T: Duration = Duration::from_secs(120);

/// A name no other test uses (shards, cluster-scoped objects).
fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id();
    format!("{prefix}-{:x}", n % 0xffffff)
}

/// A local job of `shard` running `run` at `priority`.
fn job(name: &str, shard: &str, run: &str, priority: i32) -> String {
    format!(
        r#"
apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
  labels: {{managedjobs.dev/shard: {shard}}}
spec:
  run: "{run}"
  priority: {priority}
"#
    )
}

/// The operator of `shard` over every namespace, serving `served`, with `extra` flags.
fn operator(
    cp: &support::ControlPlane,
    shard: &str,
    served: &Served,
    extra: &[&str],
) -> OperatorProcess {
    let mut flags: Vec<String> = served.flags();
    flags.extend(["--shard".to_string(), shard.to_string()]);
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    OperatorProcess::start(cp, "", &flags)
}

/// The names of the waiting jobs of a `JobQueue` answer, in its order.
fn waiting(q: &Value) -> Vec<String> {
    q["waiting"]
        .as_array()
        .expect("waiting")
        .iter()
        .map(|j| {
            format!(
                "{}/{}",
                j["namespace"].as_str().unwrap(),
                j["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// Every namespace a `JobQueue` answer names anywhere (jobs and counts).
fn namespaces_in(q: &Value) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for list in ["waiting", "live", "inactive", "counts"] {
        for j in q[list].as_array().expect("list") {
            seen.insert(j["namespace"].as_str().unwrap().to_string());
        }
    }
    seen
}

/// Polls `path` through `client` until `pred` holds on the answer; panics after `timeout`
/// with the last answer.
async fn poll(
    client: &Client,
    path: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    loop {
        let last = vis::get(client, path).await;
        if let Ok(v) = &last
            && pred(v)
        {
            return v.clone();
        }
        assert!(
            start.elapsed() < timeout,
            "{path} never answered as expected within {timeout:?}; last: {last:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Chromium, or None after recording a skip; under CI its absence is a failure.
fn browser() -> Option<Browser> {
    match Browser::launch(1400, 1000) {
        Some(b) => Some(b),
        None => {
            assert!(
                std::env::var("CI").unwrap_or_default().is_empty(),
                "CI is set but Chromium is not installed ({}): `apt-get install chromium` (hack/test.sh installs it as root)",
                support::browser::CHROMIUM
            );
            support::record_skip("visibility dashboard: Chromium is not installed");
            None
        }
    }
}

/// Cluster-scoped objects of a test, deleted when dropped.
struct ClusterObjects {
    cp: support::ControlPlane,
    names: Vec<(String, String)>,
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        for (kind, name) in &self.names {
            support::kubectl(&self.cp, &["delete", kind, name, "--ignore-not-found"]);
        }
    }
}

/// Lets `users` through the API server to the aggregated API in every namespace (what the
/// chart's ClusterRole aggregated into `view` grants per namespace): what each then sees is
/// the operator's own check.
fn allow_aggregated(cp: &support::ControlPlane, name: &str, users: &[&User]) -> ClusterObjects {
    let subjects: Vec<String> = users
        .iter()
        .map(|u| format!("  - {{kind: User, name: \"{}\"}}", u.username))
        .collect();
    vis::apply(
        cp,
        &format!(
            r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {name}}}
rules:
  - apiGroups: [visibility.managedjobs.dev]
    resources: [queue, history, managedjobs, managedjobs/log, dashboard]
    verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {name}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {name}}}
subjects:
{}
"#,
            subjects.join("\n")
        ),
    );
    ClusterObjects {
        cp: support::ControlPlane {
            kubeconfig: cp.kubeconfig.clone(),
        },
        names: vec![
            ("clusterrolebinding".into(), name.into()),
            ("clusterrole".into(), name.into()),
        ],
    }
}

/// `managed-jobs queue ARGS` with `user`'s kubeconfig (no state dir): (success, output).
fn cli_queue(user: &User, args: &[&str]) -> (bool, String) {
    let out = Command::new(support::binary())
        .arg("queue")
        .args(args)
        .env("KUBECONFIG", &user.kubeconfig)
        .env_remove("MJ_STATE_DIR")
        .output()
        .expect("managed-jobs queue");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The `NS/NAME` of each row of the dashboard's waiting table, in order.
const DASHBOARD_ROWS: &str =
    "[...document.querySelectorAll('#waiting tbody tr')].map(r => r.dataset.job)";

#[tokio::test]
async fn two_users_each_see_only_their_own_namespace_through_the_api_the_cli_and_the_dashboard() {
    let cp = control_plane_or_skip!();
    let _one = ONE_API.lock().await;
    let client = support::client(cp).await;
    let a = TestNamespace::new(&client, cp, "vis-a").await;
    let b = TestNamespace::new(&client, cp, "vis-b").await;
    let shard = unique("vis");
    let served = Served::new("mj-visibility", &a.name);
    let _op = operator(
        cp,
        &shard,
        &served,
        &["--run-cap", "1", "--launch-cap", "2"],
    );

    // One job of A runs (the run cap is 1); the rest wait, in both namespaces.
    support::create_yaml(&client, &a.name, &job("a-run", &shard, "sleep 600", 100)).await;
    support::wait_status(
        &client,
        &a.name,
        "a-run",
        T,
        "Running",
        support::phase_is(managed_jobs::api::JobPhase::Running),
    )
    .await;
    for (ns, name, prio) in [
        (&a.name, "a-low", 0),
        (&a.name, "a-high", 50),
        (&b.name, "b-low", 0),
        (&b.name, "b-high", 60),
        (&b.name, "b-mid", 10),
    ] {
        support::create_yaml(&client, ns, &job(name, &shard, "true", prio)).await;
    }
    served.wait_up().await;

    let alice = User::new(cp, &a.name, "alice");
    vis::grant_reader(cp, "reader", &a.name, &alice);
    let bob = User::new(cp, &b.name, "bob");
    vis::grant_reader(cp, "reader", &b.name, &bob);
    let carol = User::new(cp, &a.name, "carol");
    let _aggregated = allow_aggregated(cp, &unique("mj-vis-test"), &[&alice, &bob, &carol]);

    // Straight to the operator, with bearer tokens.
    let (ns_a, ns_b) = (
        format!("{PREFIX}/namespaces/{}", a.name),
        format!("{PREFIX}/namespaces/{}", b.name),
    );
    let as_alice = served.client(Some(&alice.token));
    let q = poll(&as_alice, &format!("{ns_a}/queue"), T, |q| {
        q["waitingTotal"] == 2
    })
    .await;
    assert_eq!(
        waiting(&q),
        vec![format!("{}/a-high", a.name), format!("{}/a-low", a.name)],
        "alice's queue: {q:#}"
    );
    assert_eq!(namespaces_in(&q), BTreeSet::from([a.name.clone()]), "{q:#}");
    assert!(
        q.get("usage").is_none(),
        "the operator-wide usage counts other namespaces: {q:#}"
    );
    assert_eq!(q["caps"]["binding"], "RunCap", "{q:#}");
    for j in q["waiting"].as_array().unwrap() {
        assert_eq!(j["reason"], "RunCapReached", "{j:#}");
    }
    let all = vis::get(&as_alice, &format!("{PREFIX}/queue"))
        .await
        .expect("alice's every-namespace queue");
    assert_eq!(
        namespaces_in(&all),
        BTreeSet::from([a.name.clone()]),
        "alice sees only A: {all:#}"
    );
    assert_eq!(all["allNamespaces"], false);
    let e = vis::get(&as_alice, &format!("{ns_b}/queue"))
        .await
        .unwrap_err();
    assert_eq!(vis::code(&e), 403, "alice asks for B: {e}");
    let e = vis::get(&as_alice, &format!("{ns_b}/managedjobs/b-high"))
        .await
        .unwrap_err();
    assert_eq!(vis::code(&e), 403, "alice asks for a job of B: {e}");
    let e = vis::get(&as_alice, &format!("{ns_b}/history"))
        .await
        .unwrap_err();
    assert_eq!(vis::code(&e), 403, "alice asks for B's history: {e}");
    let detail = vis::get(&as_alice, &format!("{ns_a}/managedjobs/a-low"))
        .await
        .expect("a job of A");
    assert_eq!(detail["waiting"]["position"], 2, "{detail:#}");

    let as_bob = served.client(Some(&bob.token));
    let q = poll(&as_bob, &format!("{ns_b}/queue"), T, |q| {
        q["waitingTotal"] == 3
    })
    .await;
    assert_eq!(
        waiting(&q),
        vec![
            format!("{}/b-high", b.name),
            format!("{}/b-mid", b.name),
            format!("{}/b-low", b.name)
        ],
        "bob's queue: {q:#}"
    );
    let all = vis::get(&as_bob, &format!("{PREFIX}/queue"))
        .await
        .expect("bob's queue");
    assert_eq!(
        namespaces_in(&all),
        BTreeSet::from([b.name.clone()]),
        "{all:#}"
    );
    assert!(
        all["live"].as_array().unwrap().is_empty(),
        "A's running job is not bob's: {all:#}"
    );

    let as_carol = served.client(Some(&carol.token));
    for path in [
        format!("{ns_a}/queue"),
        format!("{PREFIX}/queue"),
        format!("{ns_a}/history"),
    ] {
        let e = vis::get(&as_carol, &path).await.unwrap_err();
        assert_eq!(vis::code(&e), 403, "carol (no access) asks {path}: {e}");
    }
    let e = vis::get(&served.client(None), &format!("{ns_a}/queue"))
        .await
        .unwrap_err();
    assert_eq!(vis::code(&e), 401, "no token: {e}");
    let e = vis::get(
        &served.client(Some("not-a-token")),
        &format!("{ns_a}/queue"),
    )
    .await
    .unwrap_err();
    assert_eq!(
        vis::code(&e),
        401,
        "a token the API server does not know: {e}"
    );

    // Through the API server, each with their own kubeconfig.
    let _api = ApiService::register(cp, &a.name, "mj-visibility", &served);
    let alice_api = alice.client().await;
    let q = vis::get(&alice_api, &format!("{ns_a}/queue"))
        .await
        .expect("alice through the API server");
    assert_eq!(namespaces_in(&q), BTreeSet::from([a.name.clone()]), "{q:#}");
    let all = vis::get(&alice_api, &format!("{PREFIX}/queue"))
        .await
        .expect("alice, every namespace");
    assert_eq!(
        namespaces_in(&all),
        BTreeSet::from([a.name.clone()]),
        "{all:#}"
    );
    let e = vis::get(&alice_api, &format!("{ns_b}/queue"))
        .await
        .unwrap_err();
    assert_eq!(vis::code(&e), 403, "{e}");
    assert!(
        e.to_string().contains("may not list managedjobs"),
        "the operator's refusal: {e}"
    );
    let e = vis::get(&carol.client().await, &format!("{ns_a}/queue"))
        .await
        .unwrap_err();
    assert_eq!(vis::code(&e), 403, "{e}");

    // The CLI, with each user's kubeconfig and no state dir.
    let (ok, out) = cli_queue(&alice, &[]);
    assert!(ok, "{out}");
    assert!(
        out.contains("a-high") && out.contains("a-low") && out.contains("a-run"),
        "{out}"
    );
    assert!(!out.contains("b-"), "alice's CLI shows B: {out}");
    let (ok, out) = cli_queue(&alice, &["-A"]);
    assert!(
        ok && !out.contains("b-high") && out.contains("a-high"),
        "{out}"
    );
    let (ok, out) = cli_queue(&alice, &["-n", &b.name]);
    assert!(!ok && out.contains("may not list managedjobs"), "{out}");
    let (ok, out) = cli_queue(&bob, &["-o", "json"]);
    assert!(ok, "{out}");
    let q: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(waiting(&q).len(), 3, "{q:#}");

    // The dashboard in a real browser, through `kubectl proxy` as each user.
    let Some(browser) = browser() else { return };
    let alice_proxy = Proxy::start(&alice.kubeconfig);
    let page = browser.open(&alice_proxy.url(&format!("{ns_a}/dashboard")));
    page.wait_for("document.body.dataset.ready === 'true'", T);
    let rows = page.eval(DASHBOARD_ROWS);
    assert_eq!(
        rows,
        serde_json::json!([format!("{}/a-high", a.name), format!("{}/a-low", a.name)]),
        "alice's dashboard lists A's waiting jobs in admission order"
    );
    let text = page
        .eval("document.body.innerText")
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains("RunCapReached") && text.contains("a-run"),
        "{text}"
    );
    assert!(
        !text.contains("b-high"),
        "alice's dashboard shows B: {text}"
    );
    page.navigate(&alice_proxy.url(&format!("{PREFIX}/dashboard")));
    page.wait_for("document.body.dataset.ready === 'true'", T);
    let text = page
        .eval("document.body.innerText")
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains("a-high") && !text.contains("b-"),
        "alice's every-namespace dashboard: {text}"
    );
    page.navigate(&alice_proxy.url(&format!("{ns_b}/dashboard")));
    page.wait_for("document.body.dataset.ready === 'error'", T);
    let text = page
        .eval("document.body.innerText")
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        text.contains("may not list managedjobs") && !text.contains("b-high"),
        "{text}"
    );
    let bob_proxy = Proxy::start(&bob.kubeconfig);
    page.navigate(&bob_proxy.url(&format!("{PREFIX}/dashboard")));
    page.wait_for("document.body.dataset.ready === 'true'", T);
    let rows = page.eval(DASHBOARD_ROWS);
    assert_eq!(
        rows,
        serde_json::json!([
            format!("{}/b-high", b.name),
            format!("{}/b-mid", b.name),
            format!("{}/b-low", b.name)
        ]),
        "bob's dashboard"
    );
    let text = page
        .eval("document.body.innerText")
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        !text.contains("a-high") && !text.contains("a-run"),
        "bob's dashboard shows A: {text}"
    );

    // Straight to the operator (a port-forward): the page asks for a token and shows what it
    // may see.
    browser.ignore_certificate_errors();
    page.navigate(&format!(
        "https://127.0.0.1:{}{ns_a}/dashboard",
        served.port
    ));
    page.wait_for(
        "document.body.dataset.ready === 'error' && !!document.querySelector('form.token')",
        T,
    );
    page.eval(&format!(
        "document.getElementById('token').value = {:?}; document.querySelector('form.token button').click(); true",
        alice.token
    ));
    page.wait_for(
        "document.body.dataset.ready === 'true' && document.body.dataset.page === 'queue'",
        T,
    );
    assert_eq!(
        page.eval(DASHBOARD_ROWS),
        serde_json::json!([format!("{}/a-high", a.name), format!("{}/a-low", a.name)]),
        "the dashboard with alice's token"
    );
}

/// A deterministic mix of priorities (a fixed linear congruential sequence).
fn priorities(n: usize) -> Vec<i32> {
    let levels = [-10, 0, 0, 5, 10, 50];
    let mut x: u64 = 20_261_203;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            levels[((x >> 33) % levels.len() as u64) as usize]
        })
        .collect()
}

/// When a job was admitted (its `Scheduled` transition), ms since the epoch.
fn admitted_at(detail: &Value) -> Option<i64> {
    detail["transitions"]
        .as_array()?
        .iter()
        .find(|t| t["reason"] == "Scheduled")
        .and_then(|t| t["at"].as_str()?.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_millisecond())
}

#[tokio::test]
async fn the_apis_order_is_the_order_in_which_the_jobs_are_then_admitted() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = TestNamespace::new(&client, cp, "vis-order").await;
    let shard = unique("vis-order");
    let served = Served::new("mj-visibility", &ns.name);
    let _op = operator(
        cp,
        &shard,
        &served,
        &["--run-cap", "1", "--launch-cap", "4"],
    );
    let reader = User::new(cp, &ns.name, "reader");
    vis::grant_reader(cp, "reader", &ns.name, &reader);

    // The caps are full: one job holds the only run slot.
    support::create_yaml(
        &client,
        &ns.name,
        &job("blocker", &shard, "sleep 600", 1000),
    )
    .await;
    support::wait_status(
        &client,
        &ns.name,
        "blocker",
        T,
        "Running",
        support::phase_is(managed_jobs::api::JobPhase::Running),
    )
    .await;
    let prios = priorities(50);
    let names: Vec<String> = (0..50).map(|i| format!("w{i:02}")).collect();
    for (name, p) in names.iter().zip(&prios) {
        support::create_yaml(&client, &ns.name, &job(name, &shard, "true", *p)).await;
    }
    served.wait_up().await;
    let api = served.client(Some(&reader.token));
    let path = format!("{PREFIX}/namespaces/{}/queue", ns.name);
    let q = poll(&api, &path, T, |q| q["waitingTotal"] == 50).await;
    let order = waiting(&q);
    for (i, j) in q["waiting"].as_array().unwrap().iter().enumerate() {
        assert_eq!(j["position"], i + 1);
        assert_eq!(j["reason"], "RunCapReached", "{j:#}");
    }
    // Not merely creation order: priorities first.
    let shown_prios: Vec<i64> = q["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["priority"].as_i64().unwrap())
        .collect();
    assert!(
        shown_prios.windows(2).all(|w| w[0] >= w[1]),
        "{shown_prios:?}"
    );
    assert_ne!(
        order,
        names
            .iter()
            .map(|n| format!("{}/{n}", ns.name))
            .collect::<Vec<_>>()
    );

    // Free the slot: the fifty run one by one.
    support::cancel(&client, &ns.name, "blocker").await;
    let start = Instant::now();
    let mut admitted: Vec<(i64, String)> = Vec::new();
    for name in &names {
        let detail = loop {
            let d = vis::get(
                &api,
                &format!("{PREFIX}/namespaces/{}/managedjobs/{name}", ns.name),
            )
            .await
            .expect("a job's detail");
            if d["status"]["phase"] == "Succeeded" {
                break d;
            }
            assert!(
                start.elapsed() < Duration::from_secs(600),
                "{name} never succeeded: {d:#}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        admitted.push((
            admitted_at(&detail).expect("a Scheduled transition"),
            format!("{}/{name}", ns.name),
        ));
    }
    admitted.sort();
    let admitted: Vec<String> = admitted.into_iter().map(|(_, n)| n).collect();
    assert_eq!(
        admitted, order,
        "the order the jobs were admitted in against the API's"
    );
}

#[tokio::test]
async fn the_estimated_start_of_the_40th_waiting_job_is_within_a_quarter_of_when_it_starts() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = TestNamespace::new(&client, cp, "vis-est").await;
    let shard = unique("vis-est");
    let served = Served::new("mj-visibility", &ns.name);
    let _op = operator(
        cp,
        &shard,
        &served,
        &["--run-cap", "4", "--launch-cap", "4"],
    );
    let reader = User::new(cp, &ns.name, "reader");
    vis::grant_reader(cp, "reader", &ns.name, &reader);

    // A steady load: jobs of 10 s, four at a time.
    for i in 0..60 {
        support::create_yaml(
            &client,
            &ns.name,
            &job(&format!("s{i:02}"), &shard, "sleep 10", 0),
        )
        .await;
    }
    served.wait_up().await;
    let api = served.client(Some(&reader.token));
    let path = format!("{PREFIX}/namespaces/{}/queue", ns.name);
    // Once the first jobs finished (the queue has a pace) and 40 or more still wait.
    let q = poll(&api, &path, Duration::from_secs(180), |q| {
        q["waitingTotal"].as_u64().unwrap_or(0) >= 40
            && q["waiting"][39]["estimatedStart"]["inSeconds"]
                .as_f64()
                .is_some_and(|s| s > 0.0)
    })
    .await;
    let asked = Instant::now();
    let fortieth = &q["waiting"][39];
    let name = fortieth["name"].as_str().unwrap().to_string();
    let estimate = fortieth["estimatedStart"]["inSeconds"].as_f64().unwrap();
    let basis = fortieth["estimatedStart"]["basis"]
        .as_str()
        .unwrap()
        .to_string();
    let generated = q["generatedAt"]
        .as_str()
        .unwrap()
        .parse::<jiff::Timestamp>()
        .unwrap()
        .as_millisecond();
    // When it really starts: its Running transition.
    let started = loop {
        let d = vis::get(
            &api,
            &format!("{PREFIX}/namespaces/{}/managedjobs/{name}", ns.name),
        )
        .await
        .expect("its detail");
        let running = d["transitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["phase"] == "Running");
        if let Some(t) = running {
            break t["at"]
                .as_str()
                .unwrap()
                .parse::<jiff::Timestamp>()
                .unwrap()
                .as_millisecond();
        }
        assert!(
            asked.elapsed() < Duration::from_secs(400),
            "{name} never started: {d:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let actual = (started - generated) as f64 / 1000.0;
    let error = (estimate - actual).abs() / actual;
    println!(
        "the 40th waiting job ({name}): estimated {estimate:.1} s, started after {actual:.1} s ({:.1}% off); basis: {basis}",
        error * 100.0
    );
    assert!(
        error <= 0.25,
        "estimated {estimate:.1} s, started after {actual:.1} s: {:.0}% off ({basis})",
        error * 100.0
    );
}

/// The dashboard as a user opens it after a failure: through `kubectl proxy`, the queue page
/// lists the waiting jobs in admission order with their reasons and plots the last hour (a
/// screenshot is taken; the plot's waiting area has height); a failed pod job's page shows its
/// attempt's log after its Pod was deleted; `managed-jobs logs` shows it too, through the API.
/// Needs the real kubelet node (kwok's nodes have no logs) and Chromium.
#[tokio::test]
async fn the_dashboard_shows_the_queue_its_plot_and_a_failed_attempts_log_after_its_pod_is_gone() {
    let cp = control_plane_or_skip!();
    if !support::real_node_ready(cp, support::BUSYBOX, "nothing more (it imports busybox)") {
        return;
    }
    let Some(browser) = browser() else { return };
    let _one = ONE_API.lock().await;
    let client = support::client(cp).await;
    let ns = TestNamespace::new(&client, cp, "vis-dash").await;
    let shard = unique("vis-dash");
    let served = Served::new("mj-visibility", &ns.name);
    let _op = operator(
        cp,
        &shard,
        &served,
        &[
            "--executors",
            "local,pod",
            "--run-cap",
            "1",
            "--launch-cap",
            "2",
        ],
    );
    let alice = User::new(cp, &ns.name, "alice");
    vis::grant_reader(cp, "reader", &ns.name, &alice);
    let _aggregated = allow_aggregated(cp, &unique("mj-vis-dash"), &[&alice]);

    // A pod job that prints and fails, on the real node; then its Pod is deleted.
    let crash = format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: crash
  labels: {{managedjobs.dev/shard: {shard}}}
spec:
  template:
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: main
          image: {image}
          imagePullPolicy: Never
          command: ["sh", "-c", "for i in 1 2 3; do echo step $i; done; echo out of memory in step 3 >&2; exit 3"]
          resources:
            requests: {{cpu: 10m, memory: 16Mi}}
"#,
        image = support::BUSYBOX
    );
    kube::Api::<managed_jobs::api::ManagedJob>::namespaced(client.clone(), &ns.name)
        .create(&Default::default(), &support::on_real_node(&crash))
        .await
        .expect("creating the pod job");
    support::wait_status(
        &client,
        &ns.name,
        "crash",
        Duration::from_secs(300),
        "Failed",
        support::phase_is(managed_jobs::api::JobPhase::Failed),
    )
    .await;
    let pods = kube::Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), &ns.name);
    let lp = kube::api::ListParams::default().labels("managedjobs.dev/job-name=crash");
    pods.delete_collection(&Default::default(), &lp)
        .await
        .expect("deleting its Pod");
    let start = Instant::now();
    while !pods.list(&lp).await.unwrap().items.is_empty() {
        assert!(start.elapsed() < T, "the Pod of crash was never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The run slot held, three jobs wait: the plot's waiting area grows over two samples.
    support::create_yaml(&client, &ns.name, &job("hold", &shard, "sleep 600", 100)).await;
    support::wait_status(
        &client,
        &ns.name,
        "hold",
        T,
        "Running",
        support::phase_is(managed_jobs::api::JobPhase::Running),
    )
    .await;
    for (name, prio) in [("next-low", 0), ("next-high", 20), ("next-mid", 10)] {
        support::create_yaml(&client, &ns.name, &job(name, &shard, "true", prio)).await;
    }
    served.wait_up().await;
    let as_alice = served.client(Some(&alice.token));
    let ns_path = format!("{PREFIX}/namespaces/{}", ns.name);
    poll(
        &as_alice,
        &format!("{ns_path}/history"),
        Duration::from_secs(60),
        |h| {
            h["samples"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["waiting"] == 3)
                .count()
                >= 2
        },
    )
    .await;

    // The log, through the API and the CLI (the API server, alice's kubeconfig).
    let log = vis::get_text(&as_alice, &format!("{ns_path}/managedjobs/crash/log"))
        .await
        .expect("the kept log");
    assert!(
        log.contains("step 1") && log.contains("out of memory in step 3"),
        "{log}"
    );
    let _api = ApiService::register(cp, &ns.name, "mj-visibility", &served);
    let out = Command::new(support::binary())
        .args(["logs", "crash"])
        .env("KUBECONFIG", &alice.kubeconfig)
        .env_remove("MJ_STATE_DIR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("out of memory in step 3"),
        "managed-jobs logs crash: {out:?}"
    );

    // The queue page, its order and reasons, and the plot.
    let proxy = Proxy::start(&alice.kubeconfig);
    let page = browser.open(&proxy.url(&format!("{ns_path}/dashboard")));
    page.wait_for("document.body.dataset.ready === 'true'", T);
    assert_eq!(
        page.eval(DASHBOARD_ROWS),
        serde_json::json!([
            format!("{}/next-high", ns.name),
            format!("{}/next-mid", ns.name),
            format!("{}/next-low", ns.name)
        ])
    );
    let reasons =
        page.eval("[...document.querySelectorAll('#waiting td.reason')].map(td => td.textContent)");
    assert_eq!(
        reasons,
        serde_json::json!(["RunCapReached", "RunCapReached", "RunCapReached"])
    );
    // The waiting area has height: some of its points lie above the plot's baseline.
    let heights = page.eval(
        "(() => { const p = document.querySelector('#plot-svg polygon.area-waiting'); if (!p) return null; \
         const ys = p.getAttribute('points').trim().split(' ').map(xy => Number(xy.split(',')[1])); \
         return Math.max(...ys) - Math.min(...ys); })()",
    );
    assert!(
        heights.as_f64().is_some_and(|h| h > 10.0),
        "the waiting area's height in the plot: {heights}"
    );
    let shot = tempfile::tempdir().unwrap();
    let png = shot.path().join("queue.png");
    let bytes = page.screenshot(&png);
    let head = std::fs::read(&png).unwrap();
    assert!(
        bytes > 20_000 && head.starts_with(b"\x89PNG"),
        "a screenshot of {bytes} bytes"
    );
    println!("dashboard screenshot: {bytes} bytes");

    // The failed job's page: its attempt and its log, its Pod long gone.
    page.navigate(&proxy.url(&format!("{ns_path}/dashboard#/job/{}/crash", ns.name)));
    page.wait_for(
        "document.body.dataset.page === 'job' && !document.getElementById('log-text').hidden",
        T,
    );
    let shown = page.eval("document.getElementById('log-text').textContent");
    assert!(
        shown
            .as_str()
            .is_some_and(|t| t.contains("out of memory in step 3")),
        "the page's log: {shown}"
    );
    let attempts = page.eval("document.querySelector('#attempts tbody').innerText");
    assert!(
        attempts.as_str().is_some_and(|t| t.contains('3')),
        "the attempts table: {attempts}"
    );
}
