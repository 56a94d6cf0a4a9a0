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

/// Asserts that `client`'s user, who may list ManagedJobs in no namespace, gets empty answers
/// from the every-namespace paths (no job, no count, no caps, no sample) and the dashboard's
/// page, never a 403 that would tell it apart from a user of an empty namespace.
async fn assert_sees_nothing(client: &Client, who: &str) {
    let q = vis::get(client, &format!("{PREFIX}/queue"))
        .await
        .unwrap_or_else(|e| panic!("{who}: {PREFIX}/queue: {e}"));
    assert!(namespaces_in(&q).is_empty(), "{who}: {q:#}");
    assert_eq!(q["waitingTotal"], 0, "{who}: {q:#}");
    assert!(
        q.get("caps").is_none() && q.get("usage").is_none(),
        "{who}: {q:#}"
    );
    assert_eq!(q["allNamespaces"], false, "{who}: {q:#}");
    let h = vis::get(client, &format!("{PREFIX}/history"))
        .await
        .unwrap_or_else(|e| panic!("{who}: {PREFIX}/history: {e}"));
    assert_eq!(h["samples"], serde_json::json!([]), "{who}: {h:#}");
    let page = vis::get_text(client, &format!("{PREFIX}/dashboard"))
        .await
        .unwrap_or_else(|e| panic!("{who}: {PREFIX}/dashboard: {e}"));
    assert!(page.contains("<html"), "{who}: the dashboard's page");
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

    // Each user has only a built-in role in one namespace (carol none at all): what the
    // chart and crds/ give the roles is all they get.
    let alice = User::new(cp, &a.name, "alice");
    vis::grant(cp, "view", &a.name, &alice);
    let bob = User::new(cp, &b.name, "bob");
    vis::grant(cp, "edit", &b.name, &bob);
    let carol = User::new(cp, &a.name, "carol");

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
    for path in [format!("{ns_a}/queue"), format!("{ns_a}/history")] {
        let e = vis::get(&as_carol, &path).await.unwrap_err();
        assert_eq!(vis::code(&e), 403, "carol (no access) asks {path}: {e}");
    }
    // The every-namespace paths list what she may see: nothing, not even the caps.
    assert_sees_nothing(&as_carol, "carol, straight to the operator").await;
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
    let carol_api = carol.client().await;
    let e = vis::get(&carol_api, &format!("{ns_a}/queue"))
        .await
        .unwrap_err();
    assert_eq!(vis::code(&e), 403, "{e}");
    assert_sees_nothing(&carol_api, "carol, through the API server").await;
    // Bob (edit in B), every namespace through the API server: B only.
    let bob_api = bob.client().await;
    let all = vis::get(&bob_api, &format!("{PREFIX}/queue"))
        .await
        .expect("bob, every namespace, through the API server");
    assert_eq!(
        namespaces_in(&all),
        BTreeSet::from([b.name.clone()]),
        "{all:#}"
    );
    for path in [
        format!("{PREFIX}/history"),
        format!("{PREFIX}/dashboard"),
        format!("{ns_b}/history"),
        format!("{ns_b}/dashboard"),
    ] {
        vis::get_text(&bob_api, &path)
            .await
            .unwrap_or_else(|e| panic!("bob, {path}, through the API server: {e}"));
    }

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
    let (ok, out) = cli_queue(&carol, &["-A"]);
    assert!(
        ok && out.contains("no job waits or runs") && !out.contains("caps"),
        "carol's every-namespace queue: {out}"
    );

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
    vis::grant(cp, "view", &ns.name, &reader);

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
    vis::grant(cp, "view", &ns.name, &reader);

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
    vis::grant(cp, "view", &ns.name, &alice);

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

/// The README's quick start, as written, by hand: the commands of its `sh` block (parsed from
/// README.md, so this breaks when the README changes), run one after another by `bash` with
/// `managed-jobs` (this build) and the control plane's `kubectl` on PATH, a kubeconfig whose
/// context names the test's namespace, and a default state dir of the test's own
/// ([`vis::run_quick_start`]). The operator runs as the README says (`managed-jobs run
/// --executors local,pod`, default state dir, in the background) and no APIService of the
/// visibility API exists (this is the form without the chart; [`ONE_API`] is held): `queue`
/// and `logs` read its store, saying so. Over the whole run: hello ran once, and nothing of the
/// cancelled job is left running.
#[tokio::test]
async fn the_readmes_quick_start_works_as_written_by_hand() {
    let cp = control_plane_or_skip!();
    let _one = ONE_API.lock().await;
    let (found, out) = support::kubectl(cp, &["get", "apiservice", vis::API_SERVICE]);
    assert!(
        !found,
        "an APIService of the visibility API is registered, so this is not the form without the chart: {out}"
    );
    let client = support::client(cp).await;
    let ns = TestNamespace::new(&client, cp, "quick-start").await;
    let mut config: Value =
        serde_norway::from_str(&std::fs::read_to_string(&cp.kubeconfig).unwrap()).unwrap();
    config["contexts"][0]["context"]["namespace"] = serde_json::json!(ns.name);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, serde_norway::to_string(&config).unwrap()).unwrap();
    let shell = vis::Shell::new(&kubeconfig);
    let store = shell.default_state_dir();
    vis::run_quick_start(&shell, &client, &ns.name, vis::Form::ByHand).await;

    // Nothing of the cancelled job runs any more: no job controller, no workload process.
    let mark = format!("MANAGEDJOB_NAMESPACE={}", ns.name);
    let start = Instant::now();
    loop {
        let controllers = managed_jobs::process::find_by_arguments(&[
            "job-controller",
            &store.display().to_string(),
        ]);
        let workloads = with_environment(&mark);
        if controllers.is_empty() && workloads.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < T,
            "left running after the delete: job controllers {controllers:?}, workload processes {workloads:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The processes whose environment holds `entry` (`NAME=value`).
fn with_environment(entry: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// FIFO to the finest grain the API gives (issue 43: 10,000 jobs applied in chunks were admitted
/// with 1,117 inversions against creation order, and `q-02` before `q-01`): 300 jobs applied with
/// one `kubectl apply` of one file (on the 2-core dev machine about 45 a second, so dozens share
/// each `creationTimestamp`), wait behind a job holding the only run slot. Every job's status keeps the resourceVersion its watch saw it created at, the
/// visibility API lists them in the order the API server accepted them (a watch of the test's
/// own, started before the apply, sees the creates in that order), positions 1..300 unique;
/// then, the operator restarted with room for 8 at a time and the slot freed, the store admits
/// them in exactly that order.
#[tokio::test]
async fn jobs_applied_in_one_second_are_admitted_in_the_order_the_api_accepted_them() {
    use futures::{StreamExt as _, TryStreamExt as _};
    use kube::runtime::{WatchStreamExt as _, watcher};
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = TestNamespace::new(&client, cp, "vis-fifo").await;
    let shard = unique("vis-fifo");
    let served = Served::new("mj-visibility", &ns.name);
    let flags = |launch: &str, run: &str| -> Vec<String> {
        let mut f = served.flags();
        f.extend(["--shard", &shard, "--launch-cap", launch, "--run-cap", run].map(String::from));
        f
    };
    let first: Vec<String> = flags("1", "1");
    let mut op = OperatorProcess::start(
        cp,
        "",
        &first.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let reader = User::new(cp, &ns.name, "reader");
    vis::grant(cp, "view", &ns.name, &reader);
    support::create_yaml(&client, &ns.name, &job("blocker", &shard, "sleep 600", 0)).await;
    support::wait_status(
        &client,
        &ns.name,
        "blocker",
        T,
        "Running",
        support::phase_is(managed_jobs::api::JobPhase::Running),
    )
    .await;

    // The order the API server accepted them: each create's resourceVersion, in watch order.
    let jobs: kube::Api<managed_jobs::api::ManagedJob> =
        kube::Api::namespaced(client.clone(), &ns.name);
    let created = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, String)>::new()));
    let seen = created.clone();
    let watch = tokio::spawn(async move {
        let mut stream = watcher(jobs, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Ok(Some(mj)) = stream.try_next().await {
            let name = kube::ResourceExt::name_any(&mj);
            let mut s = seen.lock().unwrap();
            if !s.iter().any(|(n, _)| *n == name) {
                s.push((
                    name,
                    mj.metadata.resource_version.clone().unwrap_or_default(),
                ));
            }
        }
    });
    let start = Instant::now();
    while created.lock().unwrap().is_empty() {
        assert!(start.elapsed() < T, "the test's watch never listed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let n = 300;
    let names: Vec<String> = (0..n).map(|i| format!("f{i:03}")).collect();
    let file = tempfile::NamedTempFile::new().unwrap();
    let docs: Vec<String> = names
        .iter()
        .map(|name| job(name, &shard, "true", 0))
        .collect();
    std::fs::write(file.path(), docs.join("\n---\n")).unwrap();
    let applying = Instant::now();
    let (ok, out) = support::kubectl(
        cp,
        &[
            "apply",
            "-n",
            &ns.name,
            "-f",
            &file.path().display().to_string(),
        ],
    );
    assert!(ok, "kubectl apply: {out}");
    let took = applying.elapsed();
    let start = Instant::now();
    while created.lock().unwrap().len() < n + 1 {
        assert!(
            start.elapsed() < T,
            "the watch saw {} creates",
            created.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.abort();
    let order: Vec<(String, String)> = created.lock().unwrap()[1..].to_vec();
    let accepted: Vec<String> = order.iter().map(|(name, _)| name.clone()).collect();
    // Every job shows the version it was created at.
    let list_params = kube::api::ListParams::default();
    let api: kube::Api<managed_jobs::api::ManagedJob> =
        kube::Api::namespaced(client.clone(), &ns.name);
    let start = Instant::now();
    let objects = loop {
        let list = api.list(&list_params).await.unwrap().items;
        if list
            .iter()
            .filter(|mj| {
                mj.status
                    .as_ref()
                    .and_then(|s| s.queue_entry.as_ref())
                    .is_some()
            })
            .count()
            == n + 1
        {
            break list;
        }
        assert!(start.elapsed() < T, "not every job's status was written");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let seconds: BTreeSet<i64> = objects
        .iter()
        .filter_map(|mj| {
            mj.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
        })
        .collect();
    println!(
        "kubectl apply of {n} jobs took {:.1} s; their creationTimestamps span {} distinct seconds",
        took.as_secs_f64(),
        seconds.len()
    );
    for (name, rv) in &order {
        let mj = objects
            .iter()
            .find(|mj| kube::ResourceExt::name_any(*mj) == *name)
            .unwrap();
        let status = mj.status.as_ref().unwrap();
        assert_eq!(
            status
                .queue_entry
                .as_ref()
                .and_then(|e| e.resource_version.as_deref()),
            Some(rv.as_str()),
            "{name}: its status keeps the version it was created at"
        );
        assert_eq!(
            status.queue_position, None,
            "{name}: no stale position written"
        );
    }
    // The visibility API: that order, positions unique.
    served.wait_up().await;
    let vis_api = served.client(Some(&reader.token));
    let path = format!("{PREFIX}/namespaces/{}/queue", ns.name);
    let q = poll(&vis_api, &path, T, |q| q["waitingTotal"] == n).await;
    let positions: Vec<u64> = q["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, (1..=n as u64).collect::<Vec<_>>());
    let listed: Vec<String> = waiting(&q)
        .into_iter()
        .map(|k| k.rsplit('/').next().unwrap().to_string())
        .collect();
    assert_eq!(
        listed, accepted,
        "the visibility API's order against the API server's"
    );

    // Restarted with room for 8 (the order is the store's, across the restart), the slot freed.
    op.terminate();
    let more = flags("4", "8");
    op.start_again_with(&more.iter().map(String::as_str).collect::<Vec<_>>());
    support::cancel(&client, &ns.name, "blocker").await;
    let start = Instant::now();
    loop {
        let list = api.list(&list_params).await.unwrap().items;
        let done = list
            .iter()
            .filter(|mj| {
                mj.status.as_ref().and_then(|s| s.phase)
                    == Some(managed_jobs::api::JobPhase::Succeeded)
            })
            .count();
        if done == n {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(400),
            "{done} of {n} succeeded"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let store = managed_jobs::store::Store::open(
        &managed_jobs::state_dir::StateDir::new(op.state_path()).store(),
        1024,
    )
    .unwrap();
    let mut admitted: Vec<(i64, String)> = store
        .all()
        .unwrap()
        .into_iter()
        .filter(|r| r.namespace == ns.name && r.name != "blocker")
        .map(|r| {
            let scheduled = store
                .history(r.id)
                .unwrap()
                .into_iter()
                .find(|h| h.reason == managed_jobs::lifecycle::Reason::Scheduled)
                .expect("a Scheduled transition")
                .id;
            (scheduled, r.name)
        })
        .collect();
    admitted.sort();
    let admitted: Vec<String> = admitted.into_iter().map(|(_, name)| name).collect();
    let inversions = admitted
        .windows(2)
        .filter(|w| {
            let at = |x: &String| accepted.iter().position(|a| a == x).unwrap();
            at(&w[0]) > at(&w[1])
        })
        .count();
    println!(
        "{n} jobs admitted with {inversions} adjacent inversions against the API server's order"
    );
    assert_eq!(
        admitted, accepted,
        "the order of admission against the API server's"
    );
}

/// Issue 44, the quota where users look: alice has `view` in her namespace only. Of two queues
/// with 4 GPUs each on a pool (one admits her namespace, one another), she sees through the API
/// server, with `managed-jobs queue` and in the dashboard, only her queue's quota, its use by
/// her running 3-GPU job, as numbers and as a bar.
#[tokio::test]
async fn a_namespace_user_sees_the_quota_of_the_queues_that_admit_their_namespace() {
    let cp = control_plane_or_skip!();
    let Some(browser) = browser() else { return };
    let _one = ONE_API.lock().await;
    let client = support::client(cp).await;
    let ns = TestNamespace::new(&client, cp, "vis-quota").await;
    let other = TestNamespace::new(&client, cp, "vis-quota-b").await;
    let shard = unique("vis-quota");
    let pool_name = unique("vq");
    let (_nodes, _pool) = support::quota::gpu_pool(cp, &client, &pool_name, 1).await;
    let mut queues = support::quota::Queues::new(&client, cp);
    let (mine, theirs) = (format!("{shard}-mine"), format!("{shard}-theirs"));
    for (queue, namespace) in [(&mine, &ns.name), (&theirs, &other.name)] {
        queues
            .create_with(
                queue,
                serde_json::json!({
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "pools": [{"name": pool_name, "resources": [
                        {"name": "nvidia.com/gpu", "nominalQuota": "4"}]}],
                }),
            )
            .await;
    }
    let served = Served::new("mj-visibility", &ns.name);
    let _op = operator(cp, &shard, &served, &["--executors", "local,pod"]);
    let alice = User::new(cp, &ns.name, "alice");
    vis::grant(cp, "view", &ns.name, &alice);
    kube::Api::<managed_jobs::api::ManagedJob>::namespaced(client.clone(), &ns.name)
        .create(
            &Default::default(),
            &support::quota::gpu_job("train", &shard, &mine, 3, 600),
        )
        .await
        .expect("creating the job");
    support::wait_status(
        &client,
        &ns.name,
        "train",
        T,
        "Running",
        support::phase_is(managed_jobs::api::JobPhase::Running),
    )
    .await;
    served.wait_up().await;
    let _api = ApiService::register(cp, &ns.name, "mj-visibility", &served);

    // `managed-jobs queue` as alice, through the API server.
    let out = Command::new(support::binary())
        .args(["queue"])
        .env("KUBECONFIG", &alice.kubeconfig)
        .env_remove("MJ_STATE_DIR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "managed-jobs queue: {out:?}");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        // Of this test's queues (a queue of another test admitting every namespace aside).
        .filter(|t| t.len() == 7 && t[2] == "nvidia.com/gpu" && t[0].starts_with(&shard))
        .collect();
    assert_eq!(
        rows,
        vec![vec![
            mine.as_str(),
            pool_name.as_str(),
            "nvidia.com/gpu",
            "4",
            "3",
            "0",
            "0"
        ]],
        "{stdout}"
    );

    // The dashboard as alice, through `kubectl proxy`.
    let proxy = Proxy::start(&alice.kubeconfig);
    let page = browser.open(&proxy.url(&format!("{PREFIX}/namespaces/{}/dashboard", ns.name)));
    page.wait_for("document.body.dataset.ready === 'true'", T);
    let shown = page.eval(&format!(
        "[...document.querySelectorAll('#quotas tbody tr')].filter(tr => tr.dataset.queue.startsWith('{shard}')).map(tr => [tr.dataset.queue, \
         tr.dataset.resource, tr.querySelector('td.used').textContent, \
         tr.querySelector('td.nominal').textContent, tr.querySelector('i.own').style.width])",
    ));
    assert_eq!(
        shown,
        serde_json::json!([[mine, "nvidia.com/gpu", "3", "4", "75%"]])
    );
}
