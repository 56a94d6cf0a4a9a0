//! Preemption between queues (`ManagedJobQueue.spec.preemption`, issue 32) on the real dev
//! control plane: two queues of weights 1 and 3, jobs naming them from two namespaces, one
//! operator that sees every namespace (with a `--shard` of the test's own, so it touches no
//! other test's jobs), and a watch that records every status the API showed, so that what must
//! never happen (a job preempted twice, a job of a queue at its share taken, more than the run
//! cap held) is counted over the whole test.
//!
//! - `reclaimShare: Any`: queue A holds all 8 run slots with long jobs started one by one; queue
//!   B (weight 3) applies 8 jobs and holds 6 within one grace period plus a bound (printed as
//!   "time to share"); exactly 6 preemptions, of A's 6 most recently started jobs, each once,
//!   each back to Pending/Waiting with its budgets untouched, its status and an Event naming
//!   B's queue; the work each lost (seconds it had run) is printed;
//! - `reclaimShare: Never` on B: nothing is stopped over 20 s (today's behaviour);
//! - a victim whose TERM handler saves a checkpoint and one without a handler are both resumed
//!   once B's jobs end, and Succeed; the checkpoint is written exactly once.

mod support;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use managed_jobs::api::{
    JobPhase, LABEL_SHARD, ManagedJob, ManagedJobQueue, ManagedJobStatus, ScheduleState,
};
use serde_json::json;

const T: Duration = Duration::from_secs(120);
/// The operator's `--cancel-grace-seconds` in these tests (tests/support's default): the grace
/// of a job that sets none.
const GRACE: Duration = Duration::from_secs(2);
/// What taking back a share may take beyond one grace period on this loaded 2-core machine:
/// the scheduling pass, the stops reported by the job controllers, the new jobs' launches and
/// every status write, as the API shows them.
const BOUND: Duration = Duration::from_secs(15);

/// A name unique to this test run: `<prefix>-<hex>`.
fn unique(prefix: &str) -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id();
    format!("{prefix}-{:x}", n % 0xffffff)
}

/// Queues created by a test, deleted when dropped.
struct Queues {
    api: Api<ManagedJobQueue>,
    names: Vec<String>,
    kubeconfig: std::path::PathBuf,
}

impl Queues {
    fn new(client: &Client, cp: &support::ControlPlane) -> Queues {
        Queues {
            api: Api::all(client.clone()),
            names: Vec::new(),
            kubeconfig: cp.kubeconfig.clone(),
        }
    }

    /// Creates queue `name` of `weight` admitting `namespaces`, with `spec.preemption`.
    async fn create(
        &mut self,
        name: &str,
        weight: u32,
        namespaces: &[&str],
        preemption: serde_json::Value,
    ) {
        let q: ManagedJobQueue = serde_json::from_value(json!({
            "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJobQueue",
            "metadata": { "name": name },
            "spec": {
                "weight": weight,
                "namespaceSelector": { "matchExpressions": [{
                    "key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces,
                }]},
                "preemption": preemption,
            },
        }))
        .unwrap();
        let created = self
            .api
            .create(&PostParams::default(), &q)
            .await
            .expect("creating a queue");
        // The API kept what was asked (no field pruned).
        assert_eq!(
            serde_json::to_value(&created.spec).unwrap()["preemption"]["reclaimShare"],
            preemption["reclaimShare"],
            "{created:?}"
        );
        self.names.push(name.to_string());
    }
}

impl Drop for Queues {
    fn drop(&mut self) {
        let cp = support::ControlPlane {
            kubeconfig: self.kubeconfig.clone(),
        };
        for name in &self.names {
            support::kubectl(&cp, &["delete", "managedjobqueue", name, "--wait=false"]);
        }
    }
}

/// A ManagedJob of `shard` in `queue` running `run` locally, with extra `spec` fields.
fn job(name: &str, shard: &str, queue: &str, run: &str, extra: serde_json::Value) -> ManagedJob {
    let mut spec = json!({ "run": run, "queue": queue });
    if let serde_json::Value::Object(fields) = extra {
        for (k, v) in fields {
            spec[k] = v;
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "managedjobs.dev/v1alpha1", "kind": "ManagedJob",
        "metadata": { "name": name, "labels": { LABEL_SHARD: shard } },
        "spec": spec,
    }))
    .unwrap()
}

async fn create(client: &Client, ns: &str, mj: &ManagedJob) {
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), mj)
        .await
        .expect("creating a job");
}

/// A cluster-wide operator for `shard` with launch and run caps `cap`.
fn operator(cp: &support::ControlPlane, shard: &str, cap: usize) -> support::OperatorProcess {
    let cap = cap.to_string();
    support::OperatorProcess::start(
        cp,
        "",
        &["--shard", shard, "--launch-cap", &cap, "--run-cap", &cap],
    )
}

/// One status the watch saw.
#[derive(Clone, Debug)]
struct Obs {
    at: Instant,
    /// `<namespace>/<name>`.
    key: String,
    status: ManagedJobStatus,
}

#[derive(Default)]
struct Seen {
    log: Vec<Obs>,
    /// The latest status of each job, and its queue.
    jobs: HashMap<String, (String, ManagedJobStatus)>,
    /// After each status seen: the run slots each queue's jobs held, as the API showed them.
    samples: Vec<(Instant, BTreeMap<String, usize>)>,
}

impl Seen {
    /// Run slots `queue` held in the latest sample.
    fn held(&self, queue: &str) -> usize {
        self.samples
            .last()
            .and_then(|(_, s)| s.get(queue).copied())
            .unwrap_or(0)
    }

    /// The first time the watch saw job `key` Running.
    fn first_running(&self, key: &str) -> Option<Instant> {
        self.log
            .iter()
            .find(|o| o.key == key && o.status.phase == Some(JobPhase::Running))
            .map(|o| o.at)
    }

    /// The preempted attempts of job `key` over every status seen (each attempt recorded with
    /// action `Preempted`), and when the first showed.
    fn preemptions(&self, key: &str) -> (BTreeSet<i32>, Option<Instant>) {
        let mut attempts = BTreeSet::new();
        let mut first = None;
        for o in self.log.iter().filter(|o| o.key == key) {
            let shown: Vec<i32> = o
                .status
                .attempts
                .iter()
                .filter(|a| a.action == "Preempted")
                .map(|a| a.attempt)
                .collect();
            let condition = o
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == "Preempted" && c.status == "True");
            if (!shown.is_empty() || condition) && first.is_none() {
                first = Some(o.at);
            }
            attempts.extend(shown);
        }
        (attempts, first)
    }

    /// Times the watch saw the Preempted condition of `key` become True (False or absent, then
    /// True).
    fn preempted_transitions(&self, key: &str) -> usize {
        let mut last = false;
        let mut n = 0;
        for o in self.log.iter().filter(|o| o.key == key) {
            let now = o
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == "Preempted" && c.status == "True");
            n += usize::from(now && !last);
            last = now;
        }
        n
    }
}

fn holds(s: &ManagedJobStatus) -> bool {
    s.schedule_state.is_some_and(ScheduleState::holds_run_slot)
}

/// Follows every job of `shard` in every namespace.
fn follow(client: &Client, shard: &str) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Seen>>) {
    let api: Api<ManagedJob> = Api::all(client.clone());
    let seen = Arc::new(Mutex::new(Seen::default()));
    let out = seen.clone();
    let selector = format!("{LABEL_SHARD}={shard}");
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default().labels(&selector))
            .applied_objects()
            .boxed();
        while let Ok(Some(mj)) = stream.try_next().await {
            let key = format!("{}/{}", mj.namespace().unwrap_or_default(), mj.name_any());
            let status = mj.status.clone().unwrap_or_default();
            let at = Instant::now();
            let mut s = out.lock().unwrap();
            s.log.push(Obs {
                at,
                key: key.clone(),
                status: status.clone(),
            });
            s.jobs
                .insert(key, (mj.spec.queue_name().to_string(), status));
            let mut sample = BTreeMap::new();
            for (queue, st) in s.jobs.values() {
                *sample.entry(queue.clone()).or_insert(0) += usize::from(holds(st));
            }
            s.samples.push((at, sample));
        }
    });
    (task, seen)
}

async fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what} not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Preemption Events (reason `Preempted`) about `name`, counted with their repeats, and their
/// messages.
async fn preempted_events(client: &Client, ns: &str, name: &str) -> (i32, Vec<String>) {
    let events: Vec<_> = support::events_about(client, ns, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Preempted"))
        .collect();
    (
        events.iter().map(|e| e.count.unwrap_or(1).max(1)).sum(),
        events.into_iter().filter_map(|e| e.message).collect(),
    )
}

/// Creates A's jobs one at a time, each once the previous one runs, so that their start times
/// differ; returns each one's first Running as the watch saw it.
async fn start_one_by_one(
    client: &Client,
    seen: &Arc<Mutex<Seen>>,
    ns: &str,
    jobs: Vec<ManagedJob>,
) -> Vec<(String, Instant)> {
    let mut started = Vec::new();
    for mj in jobs {
        let key = format!("{ns}/{}", mj.name_any());
        create(client, ns, &mj).await;
        wait_until(&format!("{key} to run"), T, || {
            seen.lock().unwrap().first_running(&key).is_some()
        })
        .await;
        let at = seen.lock().unwrap().first_running(&key).unwrap();
        started.push((mj.name_any(), at));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    started
}

#[tokio::test]
async fn a_queue_below_its_share_takes_six_slots_from_the_most_recently_started() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns_a = support::TestNamespace::new(&client, cp, "pra").await;
    let ns_b = support::TestNamespace::new(&client, cp, "prb").await;
    let shard = unique("pr");
    let (qa, qb) = (unique("light"), unique("heavy"));
    let on = json!({"reclaimShare": "Any", "minRunSeconds": 1});
    let mut queues = Queues::new(&client, cp);
    queues.create(&qa, 1, &[&ns_a.name], on.clone()).await;
    queues.create(&qb, 3, &[&ns_b.name], on).await;
    let (watch, seen) = follow(&client, &shard);
    let _op = operator(cp, &shard, 8);
    let a: Vec<_> = (0..8)
        .map(|i| job(&format!("a{i}"), &shard, &qa, "sleep 600", json!({})))
        .collect();
    let started = start_one_by_one(&client, &seen, &ns_a.name, a).await;
    // Every job of A past minRunSeconds before B arrives: each may be taken.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(seen.lock().unwrap().held(&qa), 8);
    let arrived = Instant::now();
    for i in 0..8 {
        create(
            &client,
            &ns_b.name,
            &job(&format!("b{i}"), &shard, &qb, "sleep 600", json!({})),
        )
        .await;
    }
    wait_until("B to hold 6 run slots", T, || {
        seen.lock().unwrap().held(&qb) >= 6
    })
    .await;
    let to_share = {
        let s = seen.lock().unwrap();
        s.samples
            .iter()
            .find(|(at, x)| *at >= arrived && x.get(&qb).copied().unwrap_or(0) >= 6)
            .map(|(at, _)| *at - arrived)
            .unwrap()
    };
    // And until six of B's jobs run (past their launch), for the record.
    wait_until("six of B's jobs to run", T, || {
        let s = seen.lock().unwrap();
        s.jobs
            .iter()
            .filter(|(k, (_, st))| {
                k.starts_with(&format!("{}/", ns_b.name)) && st.phase == Some(JobPhase::Running)
            })
            .count()
            >= 6
    })
    .await;
    let to_running = arrived.elapsed();
    eprintln!(
        "time to share: {:.1} s (queue B, weight 3 of 4, run cap 8: 6 run slots held as the API showed it; 6 of its jobs Running after {:.1} s; grace {} s)",
        to_share.as_secs_f64(),
        to_running.as_secs_f64(),
        GRACE.as_secs()
    );
    // Settled: no further preemption though every job is past minRunSeconds (A at its share
    // now, B at its own).
    tokio::time::sleep(Duration::from_secs(10)).await;
    watch.abort();
    let s = std::mem::take(&mut *seen.lock().unwrap());
    let over_cap = s
        .samples
        .iter()
        .filter(|(_, x)| x.values().sum::<usize>() > 8)
        .count();
    assert_eq!(over_cap, 0, "the API showed more than the run cap held");
    assert_eq!((s.held(&qa), s.held(&qb)), (2, 6), "the shares after it");
    // Who was taken, and how often.
    let mut victims = Vec::new();
    let mut lost = Vec::new();
    let mut total = 0;
    for (name, ran_at) in &started {
        let key = format!("{}/{name}", ns_a.name);
        let (attempts, at) = s.preemptions(&key);
        let transitions = s.preempted_transitions(&key);
        assert!(
            attempts.len() <= 1 && transitions <= 1,
            "{name} preempted more than once: attempts {attempts:?}, {transitions} times True"
        );
        total += attempts.len().max(transitions);
        if let Some(at) = at {
            victims.push(name.clone());
            lost.push((name.clone(), (at - *ran_at).as_secs_f64()));
        }
    }
    let expected: Vec<String> = started[2..].iter().map(|(n, _)| n.clone()).collect();
    eprintln!(
        "preemptions counted: {total}; victims {victims:?} (A's jobs in start order: {:?})",
        started.iter().map(|(n, _)| n).collect::<Vec<_>>()
    );
    eprintln!(
        "work lost per victim (s it had run when preempted, as the API showed it): {}; total {:.1} s",
        lost.iter()
            .map(|(n, l)| format!("{n} {l:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        lost.iter().map(|(_, l)| l).sum::<f64>()
    );
    assert_eq!(total, 6, "exactly the shortfall is preempted");
    assert_eq!(victims, expected, "the 6 most recently started are taken");
    assert!(
        to_share <= GRACE + BOUND,
        "B took {to_share:?} to hold its share"
    );
    // The two kept ran throughout.
    for (name, _) in &started[..2] {
        let key = format!("{}/{name}", ns_a.name);
        let phases: Vec<_> = s
            .log
            .iter()
            .filter(|o| o.key == key)
            .filter_map(|o| o.status.phase)
            .skip_while(|p| *p != JobPhase::Running)
            .collect();
        assert!(
            phases.iter().all(|p| *p == JobPhase::Running),
            "{name} was disturbed: {phases:?}"
        );
    }
    let finals: Vec<(String, ManagedJobStatus)> = victims
        .iter()
        .map(|n| (n.clone(), s.jobs[&format!("{}/{n}", ns_a.name)].1.clone()))
        .collect();
    for (name, st) in finals {
        assert_eq!(
            (st.phase, st.schedule_state),
            (Some(JobPhase::Pending), Some(ScheduleState::Waiting)),
            "{name}: {:?}",
            st.message
        );
        assert_eq!((st.restart_count, st.recovery_count), (0, 0), "{name}");
        assert!(
            st.attempts
                .iter()
                .any(|a| a.attempt == 1 && a.action == "Preempted"),
            "{name}: {:?}",
            st.attempts
        );
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Preempted")
            .unwrap_or_else(|| panic!("{name}: no Preempted condition: {:?}", st.conditions));
        assert_eq!(c.status, "True", "{name}: {c:?}");
        assert!(
            c.message.contains(&qb),
            "{name}: the condition does not name {qb}: {c:?}"
        );
        let _ = support::wait_event(&client, &ns_a.name, &name, "Preempted", T).await;
        let (n, messages) = preempted_events(&client, &ns_a.name, &name).await;
        assert_eq!(n, 1, "{name}: {messages:?}");
        assert!(
            messages.iter().all(|m| m.contains(&qb)),
            "{name}: the Event does not name {qb}: {messages:?}"
        );
    }
    for (name, _) in &started[..2] {
        let (n, messages) = preempted_events(&client, &ns_a.name, name).await;
        assert_eq!(n, 0, "{name}: {messages:?}");
    }
    drop(queues);
}

#[tokio::test]
async fn with_reclaim_share_never_nothing_is_stopped() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns_a = support::TestNamespace::new(&client, cp, "pna").await;
    let ns_b = support::TestNamespace::new(&client, cp, "pnb").await;
    let shard = unique("pn");
    let (qa, qb) = (unique("light"), unique("heavy"));
    let mut queues = Queues::new(&client, cp);
    // Only the queue below its share could take slots; A's own setting is not what decides.
    queues
        .create(
            &qa,
            1,
            &[&ns_a.name],
            json!({"reclaimShare": "Any", "minRunSeconds": 1}),
        )
        .await;
    queues
        .create(
            &qb,
            3,
            &[&ns_b.name],
            json!({"reclaimShare": "Never", "minRunSeconds": 1}),
        )
        .await;
    let (watch, seen) = follow(&client, &shard);
    let _op = operator(cp, &shard, 8);
    for i in 0..8 {
        create(
            &client,
            &ns_a.name,
            &job(&format!("a{i}"), &shard, &qa, "sleep 600", json!({})),
        )
        .await;
    }
    wait_until("A's 8 jobs to run", T, || {
        let s = seen.lock().unwrap();
        (0..8).all(|i| {
            s.jobs
                .get(&format!("{}/a{i}", ns_a.name))
                .is_some_and(|(_, st)| st.phase == Some(JobPhase::Running))
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let arrived = Instant::now();
    for i in 0..8 {
        create(
            &client,
            &ns_b.name,
            &job(&format!("b{i}"), &shard, &qb, "sleep 600", json!({})),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(20)).await;
    watch.abort();
    let s = std::mem::take(&mut *seen.lock().unwrap());
    let after: Vec<_> = s.samples.iter().filter(|(at, _)| *at >= arrived).collect();
    assert!(!after.is_empty());
    let a_min = after
        .iter()
        .map(|(_, x)| x.get(&qa).copied().unwrap_or(0))
        .min()
        .unwrap();
    let b_max = after
        .iter()
        .map(|(_, x)| x.get(&qb).copied().unwrap_or(0))
        .max()
        .unwrap();
    let stopped: Vec<&Obs> = s
        .log
        .iter()
        .filter(|o| o.at >= arrived && o.key.starts_with(&format!("{}/", ns_a.name)))
        .filter(|o| o.status.phase != Some(JobPhase::Running))
        .collect();
    let preempted: usize = (0..8)
        .map(|i| {
            let key = format!("{}/a{i}", ns_a.name);
            s.preemptions(&key).0.len() + s.preempted_transitions(&key)
        })
        .sum();
    eprintln!(
        "reclaimShare Never: over 20 s after B's 8 jobs arrived, A held at least {a_min} of 8, B at most {b_max}; {preempted} preemptions; time to share: not within 20 s"
    );
    assert_eq!(a_min, 8, "a job of A gave up its slot");
    assert_eq!(b_max, 0, "a job of B was admitted");
    assert!(
        stopped.is_empty(),
        "A's jobs left Running: {:?}",
        stopped
            .iter()
            .map(|o| (&o.key, o.status.phase, &o.status.message))
            .collect::<Vec<_>>()
    );
    assert_eq!(preempted, 0);
    for i in 0..8 {
        let (n, messages) = preempted_events(&client, &ns_a.name, &format!("a{i}")).await;
        assert_eq!(n, 0, "a{i}: {messages:?}");
    }
    drop(queues);
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn victims_with_and_without_a_term_handler_are_resumed_and_succeed() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns_a = support::TestNamespace::new(&client, cp, "pva").await;
    let ns_b = support::TestNamespace::new(&client, cp, "pvb").await;
    let shard = unique("pv");
    let (qa, qb) = (unique("light"), unique("heavy"));
    let on = json!({"reclaimShare": "Any", "minRunSeconds": 1});
    let mut queues = Queues::new(&client, cp);
    // Run cap 3: A's share 1, B's 2.
    queues.create(&qa, 1, &[&ns_a.name], on.clone()).await;
    queues.create(&qb, 2, &[&ns_b.name], on).await;
    let (watch, seen) = follow(&client, &shard);
    let _op = operator(cp, &shard, 3);
    let dir = tempfile::tempdir().unwrap();
    let (saver_starts, ckpt, plain_starts) = (
        dir.path().join("saver.starts"),
        dir.path().join("saver.ckpt"),
        dir.path().join("plain.starts"),
    );
    // Saves its state on TERM (a second), and with it there finishes in a second.
    let saver = format!(
        "if [ -e {ckpt} ]; then echo resumed >> {starts}; sleep 1; exit 0; fi; \
         trap 'sleep 1; echo saved >> {ckpt}; exit 143' TERM; \
         echo start >> {starts}; sleep 600 & wait $!",
        ckpt = ckpt.display(),
        starts = saver_starts.display()
    );
    // No handler: killed by TERM; the second time it runs a second.
    let plain = format!(
        "echo start >> {s}; if [ $(wc -l < {s}) -ge 2 ]; then sleep 1; exit 0; fi; sleep 600",
        s = plain_starts.display()
    );
    let a = vec![
        job("keeper", &shard, &qa, "sleep 600", json!({})),
        job(
            "saver",
            &shard,
            &qa,
            &saver,
            json!({"terminationGracePeriodSeconds": 10}),
        ),
        job("plain", &shard, &qa, &plain, json!({})),
    ];
    let started = start_one_by_one(&client, &seen, &ns_a.name, a).await;
    // The trap is set, and every job past minRunSeconds.
    wait_until("the saver's trap", T, || lines_of(&saver_starts).len() == 1).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let arrived = Instant::now();
    for i in 0..2 {
        create(
            &client,
            &ns_b.name,
            &job(&format!("b{i}"), &shard, &qb, "sleep 5", json!({})),
        )
        .await;
    }
    for name in ["saver", "plain"] {
        let mj = support::wait_status(&client, &ns_a.name, name, T, "finished", |s| {
            s.phase.is_some_and(|p| p.is_terminal())
        })
        .await;
        let st = mj.status.unwrap();
        assert_eq!(
            st.phase,
            Some(JobPhase::Succeeded),
            "{name}: {:?}",
            st.message
        );
        assert_eq!((st.restart_count, st.recovery_count), (0, 0), "{name}");
        assert!(
            st.attempts.iter().any(|a| a.action == "Preempted"),
            "{name}: {:?}",
            st.attempts
        );
    }
    for i in 0..2 {
        support::wait_status(&client, &ns_b.name, &format!("b{i}"), T, "Succeeded", |s| {
            s.phase == Some(JobPhase::Succeeded)
        })
        .await;
    }
    watch.abort();
    let s = std::mem::take(&mut *seen.lock().unwrap());
    let mut lost = Vec::new();
    for (name, ran_at) in &started {
        let key = format!("{}/{name}", ns_a.name);
        let (attempts, at) = s.preemptions(&key);
        let transitions = s.preempted_transitions(&key);
        if name == "keeper" {
            assert!(
                attempts.is_empty() && transitions == 0,
                "keeper (the earliest started, A at its share without it) was preempted"
            );
            continue;
        }
        assert_eq!(
            (attempts.len(), transitions),
            (1, 1),
            "{name}: preempted {attempts:?}"
        );
        let at = at.unwrap();
        assert!(at >= arrived);
        lost.push(format!("{name} {:.1}", (at - *ran_at).as_secs_f64()));
        // The first status that showed it preempted names B's queue.
        let first = s
            .log
            .iter()
            .find(|o| {
                o.key == key
                    && o.status
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Preempted" && c.status == "True")
            })
            .unwrap();
        let c = first
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Preempted")
            .unwrap();
        assert!(c.message.contains(&qb), "{name}: {c:?}");
    }
    eprintln!(
        "work lost per victim (s it had run when preempted): {}",
        lost.join(", ")
    );
    assert_eq!(
        lines_of(&ckpt),
        ["saved"],
        "the TERM handler's checkpoint written exactly once"
    );
    assert_eq!(lines_of(&saver_starts), ["start", "resumed"]);
    assert_eq!(lines_of(&plain_starts), ["start", "start"]);
    for name in ["saver", "plain"] {
        let (n, messages) = preempted_events(&client, &ns_a.name, name).await;
        assert_eq!(n, 1, "{name}: {messages:?}");
        assert!(messages.iter().all(|m| m.contains(&qb)), "{messages:?}");
    }
    drop(queues);
}
