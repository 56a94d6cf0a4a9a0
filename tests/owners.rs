//! Issue 30, class 1: one owner per job, whatever runs beside it, on the real dev control plane.
//! Two operators (or more) whose scopes overlap: two namespaced ones on one namespace, a
//! cluster-wide one beside a namespaced one, a stale `--shard` flag, leader election outside a
//! Pod. Each test counts what must never happen over the whole run: every local workload start
//! (each run appends a line to a file) and every Pod name a watch saw.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use managed_jobs::api::{JobPhase, LABEL_SHARD, ManagedJob};

const T: Duration = Duration::from_secs(180);

fn local_job(name: &str, runs: &Path, sleep: f64) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  run: 'echo "$MANAGEDJOB_NAMESPACE/$MANAGEDJOB_NAME $MANAGEDJOB_ATTEMPT" >> {runs}; sleep {sleep}'
"#,
        runs = runs.display()
    )
}

fn pod_job(name: &str, complete_after: &str) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  template:
    metadata:
      annotations: {{"managedjobs.dev/complete-after": "{complete_after}"}}
    spec:
      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: 10m
              memory: 16Mi
"#
    )
}

/// Creates a ManagedJob from YAML, with the shard label `shard` when given.
async fn create(client: &Client, ns: &str, yaml: &str, shard: Option<&str>) {
    let mut mj: ManagedJob = serde_norway::from_str(yaml).expect("valid YAML");
    if let Some(shard) = shard {
        mj.labels_mut().insert(LABEL_SHARD.into(), shard.into());
    }
    Api::<ManagedJob>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &mj)
        .await
        .expect("creating the ManagedJob");
}

/// Starts of each local job (`namespace/name` -> number of starts), from the runs file.
fn starts(runs: &Path) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in std::fs::read_to_string(runs).unwrap_or_default().lines() {
        if let Some(name) = line.split_whitespace().next() {
            *out.entry(name.to_string()).or_default() += 1;
        }
    }
    out
}

/// The holder of the claim Lease `name` in `ns`, if any.
async fn holder(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec?.holder_identity)
        .filter(|h| !h.is_empty())
}

/// Waits until every job in `names` is Succeeded; returns their statuses by name.
async fn all_succeed(
    client: &Client,
    ns: &str,
    names: &[String],
) -> BTreeMap<String, managed_jobs::api::ManagedJobStatus> {
    let mut out = BTreeMap::new();
    for name in names {
        let mj = support::wait_status(client, ns, name, T, "a terminal phase", |s| {
            s.phase.is_some_and(|p| p.is_terminal())
        })
        .await;
        let s = mj.status.expect("a status");
        assert_eq!(
            s.phase,
            Some(JobPhase::Succeeded),
            "{name}: {:?}",
            s.message
        );
        out.insert(name.clone(), s);
    }
    out
}

/// The issue's input: two `managed-jobs run --namespace NS` on two state dirs (no shard,
/// leader election off, as by default outside the chart), 30 local and 10 pod jobs. Before,
/// all 30 local jobs ran twice and 3 to 4 pod jobs got two Pods, and neither operator said a
/// word. Now one operator owns the namespace's jobs (every status names it), each local job
/// starts once, each pod job has one Pod, and the other says it leaves them alone: in its log
/// and in an Event regarding the claim's Lease.
#[tokio::test]
async fn two_operators_on_one_namespace_run_every_job_once() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "owners2").await;
    let runs = tempfile::NamedTempFile::new().unwrap();
    let (watch, pods) = support::watch_pod_names(&client, &ns.name);
    let caps = ["--launch-cap", "8", "--run-cap", "40"];
    let a = support::OperatorProcess::start(cp, &ns.name, &caps);
    let b = support::OperatorProcess::start(cp, &ns.name, &caps);
    let mut names = Vec::new();
    for i in 0..30 {
        let name = format!("local-{i}");
        create(&client, &ns.name, &local_job(&name, runs.path(), 0.5), None).await;
        names.push(name);
    }
    for i in 0..10 {
        let name = format!("pod-{i}");
        create(&client, &ns.name, &pod_job(&name, "2s"), None).await;
        names.push(name);
    }
    let statuses = all_succeed(&client, &ns.name, &names).await;
    // One owner, for every job: the holder of the namespace's claim.
    let owner = holder(&client, &ns.name, "managed-jobs-owner")
        .await
        .expect("the namespace's claim is held");
    for (name, s) in &statuses {
        assert_eq!(s.owner.as_deref(), Some(owner.as_str()), "{name}");
        assert_eq!(
            (s.attempt, s.restart_count, s.recovery_count),
            (1, 0, 0),
            "{name}"
        );
    }
    // Every local job started once, over the whole run.
    let started = starts(runs.path());
    for i in 0..30 {
        let key = format!("{}/local-{i}", ns.name);
        assert_eq!(started.get(&key), Some(&1), "{started:?}");
    }
    assert_eq!(started.len(), 30, "{started:?}");
    // One Pod per pod job, ever.
    tokio::time::sleep(Duration::from_secs(1)).await;
    watch.abort();
    let seen = pods.lock().unwrap().clone();
    let mut expected = BTreeSet::new();
    for i in 0..10 {
        expected.insert(support::pod_name(&client, &ns.name, &format!("pod-{i}"), 1).await);
    }
    assert_eq!(seen, expected, "one Pod per pod job");
    // The other one said it leaves them alone.
    let (owner_op, other) = if a.log().contains("this operator owns them now") {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(
        owner_op.log().contains("this operator owns them now"),
        "neither claimed the namespace"
    );
    assert!(
        !other.log().contains("this operator owns them now"),
        "both claimed it"
    );
    assert!(
        other.log().contains("this operator leaves them alone"),
        "the standby never said so:\n{}",
        other.log()
    );
    support::wait_event(
        &client,
        &ns.name,
        "managed-jobs-owner",
        "LeftToOwner",
        Duration::from_secs(30),
    )
    .await;
}

/// The owner dies (its operator, job controllers and workloads all SIGKILLed, as when its
/// container or node goes) while another operator of the same scope stands by with a claim
/// duration of 15 s (the default). The standby holds the claim within the duration plus its
/// retry, adopts the running Pod (no second Pod, attempt 1), relaunches the local job once it
/// is sure the former attempt was stopped (attempt 2, counted in no budget), and both Succeed
/// with every later status written by it. Prints the time to one owner.
#[tokio::test]
async fn the_owner_that_dies_hands_its_jobs_over_within_the_claims_duration() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "handover").await;
    let runs = tempfile::NamedTempFile::new().unwrap();
    let (watch, pods) = support::watch_pod_names(&client, &ns.name);
    let mut a = support::OperatorProcess::start(cp, &ns.name, &[]);
    create(
        &client,
        &ns.name,
        &local_job("local", runs.path(), 20.0),
        None,
    )
    .await;
    create(&client, &ns.name, &pod_job("pod", "45s"), None).await;
    for name in ["local", "pod"] {
        support::wait_status(&client, &ns.name, name, T, "Running", |s| {
            s.phase == Some(JobPhase::Running)
        })
        .await;
    }
    let first = holder(&client, &ns.name, "managed-jobs-owner")
        .await
        .expect("held");
    let b = support::OperatorProcess::start(cp, &ns.name, &[]);
    // The standby says it leaves the jobs alone and changes nothing.
    let start = Instant::now();
    while !b.log().contains("this operator leaves them alone") {
        assert!(
            start.elapsed() < T,
            "the standby never said so:\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        holder(&client, &ns.name, "managed-jobs-owner").await,
        Some(first.clone())
    );
    // The owner dies with everything it started.
    a.kill_everything();
    let died = Instant::now();
    let second = loop {
        if let Some(h) = holder(&client, &ns.name, "managed-jobs-owner").await
            && h != first
        {
            break h;
        }
        assert!(died.elapsed() < T, "nobody took the claim over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let to_one_owner = died.elapsed();
    // The first status the new owner writes.
    let api = Api::<ManagedJob>::namespaced(client.clone(), &ns.name);
    loop {
        let owners: Vec<Option<String>> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|mj| mj.status.and_then(|s| s.owner))
            .collect();
        if owners.iter().all(|o| o.as_deref() == Some(second.as_str())) {
            break;
        }
        assert!(
            died.elapsed() < T,
            "statuses never named the new owner: {owners:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let to_statuses = died.elapsed();
    println!(
        "time to one owner after the owner died: {:.1} s (claim duration 15 s); every status \
         names the new owner after {:.1} s",
        to_one_owner.as_secs_f64(),
        to_statuses.as_secs_f64()
    );
    assert!(
        to_one_owner < Duration::from_secs(15 * 3),
        "the hand-over took {to_one_owner:?}, far beyond the claim's 15 s"
    );
    let statuses = all_succeed(&client, &ns.name, &["local".into(), "pod".into()]).await;
    let local = &statuses["local"];
    assert_eq!(
        (local.attempt, local.restart_count, local.recovery_count),
        (2, 0, 0),
        "the local job relaunched once, counted in no budget: {:?}",
        local.message
    );
    let pod = &statuses["pod"];
    assert_eq!(
        (pod.attempt, pod.restart_count, pod.recovery_count),
        (1, 0, 0),
        "the Pod was adopted: {:?}",
        pod.message
    );
    assert_eq!(
        starts(runs.path()).get(&format!("{}/local", ns.name)),
        Some(&2),
        "two starts of the local job"
    );
    watch.abort();
    let seen = pods.lock().unwrap().clone();
    assert_eq!(
        seen,
        BTreeSet::from([support::pod_name(&client, &ns.name, "pod", 1).await]),
        "one Pod, adopted"
    );
    drop(b);
}

/// A cluster-wide operator beside a namespaced one, and a third started with a stale `--shard`
/// flag: all three of shard `s`. The namespaced one, first, owns its namespace; the
/// cluster-wide one owns the other namespace and leaves the first alone (it says so); the
/// stale one owns nothing. Every job runs once, each under one owner.
#[tokio::test]
async fn a_cluster_wide_operator_and_a_stale_shard_flag_leave_owned_namespaces_alone() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let one = support::TestNamespace::new(&client, cp, "scope1").await;
    let two = support::TestNamespace::new(&client, cp, "scope2").await;
    let shard = format!("s{}", &one.name[one.name.len() - 6..]);
    let runs = tempfile::NamedTempFile::new().unwrap();
    let namespaced = support::OperatorProcess::start(cp, &one.name, &["--shard", &shard]);
    let start = Instant::now();
    while holder(&client, &one.name, &format!("managed-jobs-owner-{shard}"))
        .await
        .is_none()
    {
        assert!(start.elapsed() < T, "the namespaced operator never claimed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wide = support::OperatorProcess::start(cp, "", &["--shard", &shard]);
    let stale = support::OperatorProcess::start(cp, &one.name, &["--shard", &shard]);
    let mut names = Vec::new();
    for (ns, n) in [(&one.name, 6), (&two.name, 6)] {
        for i in 0..n {
            let name = format!("job-{i}");
            create(
                &client,
                ns,
                &local_job(&name, runs.path(), 0.3),
                Some(&shard),
            )
            .await;
            names.push((ns.clone(), name));
        }
    }
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (ns, name) in &names {
        let s = all_succeed(&client, ns, std::slice::from_ref(name)).await;
        owners
            .entry(ns.clone())
            .or_default()
            .insert(s[name].owner.clone().unwrap_or_default());
    }
    let lease = format!("managed-jobs-owner-{shard}");
    let holder_one = holder(&client, &one.name, &lease).await.unwrap();
    let holder_two = holder(&client, &two.name, &lease).await.unwrap();
    assert_eq!(owners[&one.name], BTreeSet::from([holder_one.clone()]));
    assert_eq!(owners[&two.name], BTreeSet::from([holder_two.clone()]));
    assert_ne!(
        holder_one, holder_two,
        "the first namespace stays its first owner's"
    );
    assert!(
        namespaced.log().contains("this operator owns them now")
            && !stale.log().contains("this operator owns them now"),
        "the stale instance claimed something"
    );
    for op in [&wide, &stale] {
        assert!(
            op.log()
                .contains(&format!("owns the jobs of namespace {}", one.name)),
            "it never said it leaves {} alone:\n{}",
            one.name,
            op.log()
        );
    }
    // Each job ran once.
    let started = starts(runs.path());
    assert_eq!(started.len(), names.len(), "{started:?}");
    assert!(started.values().all(|n| *n == 1), "{started:?}");
}

/// `--leader-election` outside a Pod takes its Lease in the namespace it watches (before, it
/// took `default/managed-jobs` whatever `--namespace` was, so an operator of another
/// namespace stood by for nothing): two operators of two namespaces both lead and run their
/// jobs.
#[tokio::test]
async fn leader_election_outside_a_pod_follows_the_watched_namespace() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let one = support::TestNamespace::new(&client, cp, "le1").await;
    let two = support::TestNamespace::new(&client, cp, "le2").await;
    let runs = tempfile::NamedTempFile::new().unwrap();
    let _a = support::OperatorProcess::start(cp, &one.name, &["--leader-election"]);
    let _b = support::OperatorProcess::start(cp, &two.name, &["--leader-election"]);
    for ns in [&one.name, &two.name] {
        create(&client, ns, &local_job("hello", runs.path(), 0.1), None).await;
    }
    for ns in [&one.name, &two.name] {
        all_succeed(&client, ns, &["hello".to_string()]).await;
        assert!(
            holder(&client, ns, "managed-jobs").await.is_some(),
            "no leader-election Lease in {ns}"
        );
    }
}

/// The owner's operator dies alone (SIGKILL; outside a cluster its job controllers outlive it)
/// while a local job runs and another operator stands by. Its job controller stops the local
/// workload once the claim lapsed (the new owner could not adopt it: it is this state dir's),
/// and the new owner relaunches it only after that stop's grace: the two runs never overlap.
#[tokio::test]
async fn a_local_workload_of_an_owner_killed_alone_stops_before_its_relaunch() {
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "alone").await;
    let runs = tempfile::NamedTempFile::new().unwrap();
    let script = format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: alone
spec:
  run: 'echo "start $(date +%s%N)" >> {runs}; trap "echo stop $(date +%s%N) >> {runs}; exit 143" TERM; sleep 40 & wait'
"#,
        runs = runs.path().display()
    );
    let mut a = support::OperatorProcess::start(cp, &ns.name, &[]);
    support::create_yaml(&client, &ns.name, &script).await;
    support::wait_status(&client, &ns.name, "alone", T, "Running", |s| {
        s.phase == Some(JobPhase::Running)
    })
    .await;
    let first = holder(&client, &ns.name, "managed-jobs-owner")
        .await
        .unwrap();
    let b = support::OperatorProcess::start(cp, &ns.name, &[]);
    a.kill();
    let done = support::wait_status(&client, &ns.name, "alone", T, "Succeeded", |s| {
        s.phase.is_some_and(|p| p.is_terminal())
    })
    .await;
    let s = done.status.unwrap();
    assert_eq!(s.phase, Some(JobPhase::Succeeded), "{:?}", s.message);
    assert_ne!(
        s.owner.as_deref(),
        Some(first.as_str()),
        "the new owner ended it"
    );
    assert_eq!((s.attempt, s.restart_count, s.recovery_count), (2, 0, 0));
    // start, stop (the former owner's job controller), start (the new owner's), in that order.
    let lines: Vec<(String, u128)> = std::fs::read_to_string(runs.path())
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (what, at) = l.split_once(' ')?;
            Some((what.to_string(), at.trim().parse().ok()?))
        })
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|(w, _)| w.as_str()).collect();
    assert_eq!(kinds, ["start", "stop", "start"], "{lines:?}");
    assert!(
        lines[1].1 < lines[2].1,
        "the relaunch began before the stop: {lines:?}"
    );
    // The former owner's job controller said why it stopped it.
    let logs = std::fs::read_dir(a.state_path().join("logs"))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .collect::<String>();
    assert!(logs.contains("ClaimLapsed"), "{logs}");
    assert!(
        b.log().contains("took the job over from its status"),
        "{}",
        b.log()
    );
    drop(b);
}

/// A namespace deleted after its owner left (an operator uninstalled, or stopped, before the
/// namespace finished deleting): its Lease went with it and nobody can create one there any
/// more. The next operator whose scope it is finishes its jobs (their finalizers released), so
/// the namespace goes; before, that operator could not take the claim and exited after 30 s,
/// again and again (the chart's Pod crash-looped on the real node), and the namespace stayed
/// Terminating for good.
#[tokio::test]
async fn a_namespace_deleted_after_its_owner_left_is_finished_by_the_next_operator() {
    use k8s_openapi::api::core::v1::Namespace;
    let cp = control_plane_or_skip!();
    let client = support::client(cp).await;
    let ns = support::TestNamespace::new(&client, cp, "orphaned").await;
    let runs = tempfile::NamedTempFile::new().unwrap();
    let mut first = support::OperatorProcess::start(cp, &ns.name, &[]);
    for name in ["local", "pod"] {
        let yaml = if name == "local" {
            local_job(name, runs.path(), 0.1)
        } else {
            pod_job(name, "1s")
        };
        create(&client, &ns.name, &yaml, None).await;
    }
    all_succeed(&client, &ns.name, &["local".into(), "pod".into()]).await;
    first.terminate();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(&ns.name, &Default::default())
        .await
        .expect("deleting the namespace");
    // Terminating, held by the jobs' finalizers, its Lease gone.
    let start = Instant::now();
    while holder(&client, &ns.name, "managed-jobs-owner")
        .await
        .is_some()
    {
        assert!(
            start.elapsed() < T,
            "the claim's Lease outlived the deletion"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut second = support::OperatorProcess::start(cp, &ns.name, &[]);
    let start = Instant::now();
    while namespaces.get_opt(&ns.name).await.unwrap().is_some() {
        assert!(
            second.wait_exit(Duration::ZERO).is_none(),
            "the operator exited:\n{}",
            second.log()
        );
        assert!(
            start.elapsed() < T,
            "the namespace is still there:\n{}",
            second.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!(
        "a deleted namespace whose owner had left: gone {:.1} s after the next operator started",
        start.elapsed().as_secs_f64()
    );
    assert!(
        second.log().contains("nobody holds its claim"),
        "{}",
        second.log()
    );
    assert_eq!(
        starts(runs.path()).get(&format!("{}/local", ns.name)),
        Some(&1),
        "the finished job never ran again"
    );
}
