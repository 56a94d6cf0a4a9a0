//! Suspend and resume (`spec.suspend`, issue 32) on the real dev control plane: the real
//! `managed-jobs run` binary scoped to a namespace of the test's own, with its own state dir, a
//! run cap of 1 so that admission order can be read, and a watch that records every status the
//! API showed (and, for pod jobs, every Pod), so that what must never happen is counted over the
//! whole test, not only at its end.
//!
//! - a waiting job suspended is never admitted while suspended (its process never starts) and,
//!   resumed, is admitted ahead of a job created after it;
//! - a running local job whose script traps SIGTERM writes its checkpoint exactly once, is
//!   stopped (its process group gone), gives its run slot back, records the attempt as
//!   `Suspended`, and, resumed ahead of a later job, reads its checkpoint and Succeeds;
//! - a running pod job: its Pod is deleted with the job's grace, no Pod exists while it is
//!   suspended, and the resumed attempt runs in a new Pod (two Pod names over the whole test);
//! - a local pipeline suspended in its second task resumes at that task (the first task never
//!   runs again);
//! - suspended jobs stay suspended across an operator SIGKILL and a SIGTERM, and across a lost
//!   store (no process start, no Pod), then resume and Succeed;
//! - in every case `restartCount` and `recoveryCount` stay 0 and the job ends Succeeded.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, ResourceExt};
use managed_jobs::api::{JobPhase, ManagedJob, ManagedJobStatus, ScheduleState, TaskPhase};

const T: Duration = Duration::from_secs(90);
/// The field manager the tests suspend and resume with: the Suspended condition names it.
const MANAGER: &str = "suspend-test";
/// What a stop may take beyond the job's grace on this loaded 2-core machine (the stop, the
/// job controller's report, the status write, the watch).
const SLACK: Duration = Duration::from_secs(15);

/// One status the watch saw.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    name: String,
    suspend: bool,
    status: ManagedJobStatus,
}

/// Every status of every ManagedJob in `ns` the API showed, from now on.
fn follow(client: &Client, ns: &str) -> (tokio::task::JoinHandle<()>, Arc<Mutex<Vec<Seen>>>) {
    let api: Api<ManagedJob> = Api::namespaced(client.clone(), ns);
    let log = Arc::new(Mutex::new(Vec::new()));
    let out = log.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Ok(Some(mj)) = stream.try_next().await {
            out.lock().unwrap().push(Seen {
                at: Instant::now(),
                name: mj.name_any(),
                suspend: mj.spec.suspend,
                status: mj.status.unwrap_or_default(),
            });
        }
    });
    (task, log)
}

/// What a watch saw of one Pod.
#[derive(Clone, Debug, Default)]
struct PodSeen {
    /// The longest `metadata.deletionGracePeriodSeconds` it showed (the grace it was deleted
    /// with; kwok then deletes it at once, with 0).
    deletion_grace: Option<i64>,
    deleted: bool,
}

/// Every Pod of `ns` a watch saw, from now on.
fn watch_pods(
    client: &Client,
    ns: &str,
) -> (
    tokio::task::JoinHandle<()>,
    Arc<Mutex<BTreeMap<String, PodSeen>>>,
) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = Arc::new(Mutex::new(BTreeMap::new()));
    let out = pods.clone();
    let task = tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default()).boxed();
        while let Some(ev) = stream.next().await {
            let (pod, deleted) = match ev {
                Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => (p, false),
                Ok(watcher::Event::Delete(p)) => (p, true),
                _ => continue,
            };
            let mut pods = out.lock().unwrap();
            let seen: &mut PodSeen = pods.entry(pod.name_any()).or_default();
            if let Some(g) = pod.metadata.deletion_grace_period_seconds {
                seen.deletion_grace = Some(seen.deletion_grace.map_or(g, |s: i64| s.max(g)));
            }
            seen.deleted |= deleted;
        }
    });
    (task, pods)
}

/// One test's namespace, watch and files.
struct Case {
    client: Client,
    ns: String,
    /// Deleted when the case is dropped (after the operator, declared later).
    _namespace: support::TestNamespace,
    log: Arc<Mutex<Vec<Seen>>>,
    /// Files the workloads append to (absolute paths, outside the operator's state dir).
    dir: tempfile::TempDir,
}

impl Case {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The lines of file `name` (none when it does not exist).
    fn lines(&self, name: &str) -> Vec<String> {
        lines_of(&self.file(name))
    }

    async fn create(&self, yaml: &str) {
        support::create_yaml(&self.client, &self.ns, yaml).await;
    }

    /// Creates from YAML with [`MANAGER`] as field manager (so that a `suspend: true` set at
    /// creation is [`MANAGER`]'s).
    async fn create_as_manager(&self, yaml: &str) {
        let mj: ManagedJob = serde_norway::from_str(yaml).expect("valid ManagedJob YAML");
        let pp = PostParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        Api::<ManagedJob>::namespaced(self.client.clone(), &self.ns)
            .create(&pp, &mj)
            .await
            .expect("creating the ManagedJob");
    }

    async fn wait(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&ManagedJobStatus) -> bool,
    ) -> ManagedJobStatus {
        support::wait_status(&self.client, &self.ns, name, T, what, pred)
            .await
            .status
            .unwrap()
    }

    async fn wait_phase(&self, name: &str, phase: JobPhase) -> ManagedJobStatus {
        self.wait(name, phase.as_str(), support::phase_is(phase))
            .await
    }

    /// Waits for the end, and checks it is Succeeded.
    async fn wait_succeeded(&self, name: &str) -> ManagedJobStatus {
        let s = self
            .wait(name, "finished", |s| {
                s.phase.is_some_and(|p| p.is_terminal())
            })
            .await;
        assert_eq!(
            s.phase,
            Some(JobPhase::Succeeded),
            "{name} ended {:?}: {:?}",
            s.phase,
            s.message
        );
        s
    }

    /// Sets `spec.suspend` as [`MANAGER`].
    async fn set_suspend(&self, name: &str, suspend: bool) {
        let pp = PatchParams {
            field_manager: Some(MANAGER.into()),
            ..Default::default()
        };
        Api::<ManagedJob>::namespaced(self.client.clone(), &self.ns)
            .patch(
                name,
                &pp,
                &Patch::Merge(serde_json::json!({"spec": {"suspend": suspend}})),
            )
            .await
            .expect("patching spec.suspend");
    }

    /// Suspends `name` and waits until the API shows it Suspended; checks the status and the
    /// Event (the attempt recorded as `Suspended` when `launched`); returns the status and how
    /// long the suspension took.
    async fn suspend(&self, name: &str, launched: bool) -> (ManagedJobStatus, Duration) {
        let asked = Instant::now();
        let since = jiff::Timestamp::now().as_second();
        self.set_suspend(name, true).await;
        let s = self
            .wait(name, "Suspended and Inactive", |s| {
                s.phase == Some(JobPhase::Suspended)
                    && s.schedule_state == Some(ScheduleState::Inactive)
            })
            .await;
        let took = asked.elapsed();
        check_suspended(name, &s, launched, since);
        support::wait_event(&self.client, &self.ns, name, "Suspended", T).await;
        (s, took)
    }

    /// Resumes `name`: the API shows it no longer Suspended (when the run slot is `held` by
    /// another job: Pending and Waiting again), with its budgets unchanged from `before`, a
    /// `Resumed` Event, and the Suspended condition no longer True. (With a free slot it may be
    /// admitted before a poll sees it waiting.)
    async fn resume(&self, name: &str, before: &ManagedJobStatus, held: bool) -> ManagedJobStatus {
        self.set_suspend(name, false).await;
        let mut s = self
            .wait(name, "resumed", |s| s.phase != Some(JobPhase::Suspended))
            .await;
        if held {
            assert_eq!(
                (s.phase, s.schedule_state),
                (Some(JobPhase::Pending), Some(ScheduleState::Waiting)),
                "{name}: resumed while the run slot is held: {:?}",
                s.message
            );
        } else {
            s = self.wait(name, "", |_| true).await;
        }
        assert_eq!(
            (s.restart_count, s.recovery_count),
            (before.restart_count, before.recovery_count),
            "{name}: budgets changed by the resume"
        );
        assert_ne!(
            condition(&s, "Suspended").map(|c| c.0),
            Some("True".to_string()),
            "{name}: still Suspended True after the resume: {:?}",
            s.conditions
        );
        support::wait_event(&self.client, &self.ns, name, "Resumed", T).await;
        s
    }

    /// With the run slot held by the job `hold` (`sleep 600`, created now unless
    /// `hold_running`), creates the job `later`, resumes `name` (suspended), then frees the slot
    /// (cancels `hold`): the watch must show `name` admitted before `later`, each Succeeded.
    /// Returns `name`'s final status.
    async fn resume_ahead_of_a_later_job(
        &self,
        name: &str,
        suspended: &ManagedJobStatus,
        hold_running: bool,
    ) -> ManagedJobStatus {
        if !hold_running {
            // The suspended job gave its slot back: a new job takes it.
            self.create(&local_job("hold", "sleep 600")).await;
        }
        self.wait_phase("hold", JobPhase::Running).await;
        let later = format!("echo start >> {}; sleep 1", self.file("later").display());
        self.create(&local_job("later", &later)).await;
        self.wait("later", "queued", |s| {
            s.schedule_state == Some(ScheduleState::Waiting)
        })
        .await;
        let resumed = Instant::now();
        self.resume(name, suspended, true).await;
        let released = Instant::now();
        support::cancel(&self.client, &self.ns, "hold").await;
        let done = self.wait_succeeded(name).await;
        self.wait_succeeded("later").await;
        // Admission order, as the API showed it.
        let log = self.log.lock().unwrap();
        let first_holding = |job: &str| {
            log.iter()
                .find(|x| x.name == job && x.at >= resumed && holds(&x.status))
                .map(|x| x.at)
        };
        let (a, b) = (first_holding(name), first_holding("later"));
        let (a, b) = (
            a.expect("the resumed job admitted"),
            b.expect("later admitted"),
        );
        eprintln!(
            "{name}: admitted {:.1} s after the slot was freed, `later` {:.1} s after",
            (a - released).as_secs_f64(),
            (b - released).as_secs_f64()
        );
        assert!(
            a < b,
            "{name} was admitted after a job created after it (later)"
        );
        // And nothing of `later` held a slot before the resumed job finished (run cap 1).
        let finished = log
            .iter()
            .find(|x| {
                x.name == name && x.at >= resumed && x.status.phase == Some(JobPhase::Succeeded)
            })
            .map(|x| x.at)
            .unwrap();
        assert!(
            !log.iter()
                .any(|x| x.name == "later" && holds(&x.status) && x.at < finished),
            "later held a run slot before {name} finished"
        );
        assert_eq!(self.lines("later").len(), 1);
        done
    }

    /// Over every status seen of `name` from the first that showed it Suspended after `asked`
    /// (before its suspension was asked for) to `to`: none held a run slot, none showed a phase
    /// other than Suspended (nor spec.suspend false).
    fn stayed_suspended(&self, name: &str, asked: Instant, to: Instant) {
        let log = self.log.lock().unwrap();
        let seen: Vec<&Seen> = log
            .iter()
            .filter(|x| x.name == name && x.at >= asked && x.at <= to)
            .skip_while(|x| x.status.phase != Some(JobPhase::Suspended))
            .collect();
        assert!(!seen.is_empty(), "{name}: never seen Suspended");
        for x in &seen {
            assert!(
                x.suspend && x.status.phase == Some(JobPhase::Suspended) && !holds(&x.status),
                "{name} left Suspended while suspended: {:?} {:?} ({:?})",
                x.status.phase,
                x.status.schedule_state,
                x.status.message
            );
        }
        eprintln!(
            "{name}: {} statuses seen while suspended, every one Suspended",
            seen.len()
        );
    }
}

async fn case(cp: &support::ControlPlane, prefix: &str) -> (Case, tokio::task::JoinHandle<()>) {
    let client = support::client(cp).await;
    let namespace = support::TestNamespace::new(&client, cp, prefix).await;
    let (watch, log) = follow(&client, &namespace.name);
    (
        Case {
            client,
            ns: namespace.name.clone(),
            _namespace: namespace,
            log,
            dir: tempfile::tempdir().unwrap(),
        },
        watch,
    )
}

fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn holds(s: &ManagedJobStatus) -> bool {
    s.schedule_state.is_some_and(ScheduleState::holds_run_slot)
}

/// (status, reason, message) of condition `type_`.
fn condition(s: &ManagedJobStatus, type_: &str) -> Option<(String, String, String)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// The status of a job just suspended: condition Suspended True naming [`MANAGER`], set no
/// earlier than `since` (seconds since the epoch); the stopped attempt recorded as `Suspended`
/// if it had `launched`, else no attempt recorded at all.
fn check_suspended(name: &str, s: &ManagedJobStatus, launched: bool, since: i64) {
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == "Suspended")
        .unwrap_or_else(|| panic!("{name}: no Suspended condition: {:?}", s.conditions));
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "Suspended"),
        "{name}: {c:?}"
    );
    assert!(
        c.message.contains(MANAGER),
        "{name}: the Suspended condition does not say who suspended it: {:?}",
        c.message
    );
    assert!(
        c.last_transition_time.0.as_second() >= since - 1,
        "{name}: Suspended since {:?}, before it was asked",
        c.last_transition_time
    );
    let suspended: Vec<_> = s
        .attempts
        .iter()
        .filter(|a| a.action == "Suspended")
        .collect();
    if launched {
        assert!(
            suspended.iter().any(|a| a.attempt == s.attempt),
            "{name}: attempt {} not recorded as Suspended: {:?}",
            s.attempt,
            s.attempts
        );
    } else {
        assert!(
            s.attempts.is_empty(),
            "{name}: attempts recorded for a job that never launched: {:?}",
            s.attempts
        );
    }
    assert!(
        s.attempts
            .iter()
            .all(|a| a.action == "Suspended" || a.action == "Succeeded"),
        "{name}: an attempt recorded as failed or lost: {:?}",
        s.attempts
    );
    eprintln!(
        "{name}: Suspended: {:?}; message {:?}",
        c.message, s.message
    );
}

fn local_job(name: &str, run: &str) -> String {
    format!(
        "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: {name}\nspec:\n  run: {run:?}\n"
    )
}

/// A local job with extra spec lines (indented by two spaces).
fn local_job_with(name: &str, run: &str, extra: &str) -> String {
    format!("{}{extra}", local_job(name, run))
}

/// A script that traps SIGTERM and writes one line to `marker` (its checkpoint), appending a
/// line to `starts` at each start once the trap is set; started again with the checkpoint
/// there, it finishes in a second.
fn checkpointing(starts: &Path, marker: &Path) -> String {
    let (starts, marker) = (starts.display(), marker.display());
    format!(
        "if [ -e {marker} ]; then echo resumed >> {starts}; sleep 1; exit 0; fi; \
         trap 'echo saved >> {marker}; exit 143' TERM; \
         echo start >> {starts}; \
         sleep 600 & wait $!"
    )
}

fn pod_job(name: &str, complete_after: &str, grace: i64) -> String {
    format!(
        r#"apiVersion: managedjobs.dev/v1alpha1
kind: ManagedJob
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: {grace}
  template:
    metadata:
      annotations: {{"managedjobs.dev/complete-after": "{complete_after}"}}
    spec:
      containers:
        - name: main
          image: busybox
          resources:
            requests:
              cpu: 100m
              memory: 64Mi
"#
    )
}

async fn wait_lines(case: &Case, file: &str, n: usize) {
    let start = Instant::now();
    while case.lines(file).len() < n {
        assert!(
            start.elapsed() < T,
            "{file}: {:?}, wanted {n} lines",
            case.lines(file)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_waiting_job_suspended_is_never_admitted_and_keeps_its_place() {
    let cp = control_plane_or_skip!();
    let (case, watch) = case(cp, "susp-wait").await;
    let _op = support::OperatorProcess::start(cp, &case.ns, &["--run-cap", "1"]);
    case.create(&local_job("hold", "sleep 600")).await;
    case.wait_phase("hold", JobPhase::Running).await;
    let run = format!("echo start >> {}; sleep 1", case.file("waiter").display());
    case.create(&local_job("waiter", &run)).await;
    let queued = case
        .wait("waiter", "queued", |s| {
            s.schedule_state == Some(ScheduleState::Waiting)
        })
        .await;
    let entry = queued.queue_entry.clone().expect("its place in its queue");
    let from = Instant::now();
    let (suspended, took) = case.suspend("waiter", false).await;
    eprintln!("waiting job suspended in {:.2} s", took.as_secs_f64());
    assert_eq!(suspended.attempt, 0);
    // Long enough for a scheduling pass or two; the run slot is held, so this proves only that
    // the suspension sticks. The order check below proves it kept its place.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let to = Instant::now();
    case.stayed_suspended("waiter", from, to);
    assert_eq!(
        suspended.queue_entry.as_ref(),
        Some(&entry),
        "its place is kept while suspended"
    );
    let done = case
        .resume_ahead_of_a_later_job("waiter", &suspended, true)
        .await;
    assert_eq!(
        (done.attempt, done.restart_count, done.recovery_count),
        (1, 0, 0)
    );
    assert_eq!(case.lines("waiter"), ["start"], "the workload started once");
    watch.abort();
}

#[tokio::test]
async fn a_running_local_job_is_stopped_with_its_checkpoint_and_resumes() {
    let cp = control_plane_or_skip!();
    let (case, watch) = case(cp, "susp-local").await;
    let _op = support::OperatorProcess::start(cp, &case.ns, &["--run-cap", "1"]);
    const GRACE: u64 = 10;
    let script = checkpointing(&case.file("ckpt.starts"), &case.file("ckpt.marker"));
    case.create(&local_job_with(
        "ckpt",
        &script,
        &format!("  terminationGracePeriodSeconds: {GRACE}\n"),
    ))
    .await;
    let running = case.wait_phase("ckpt", JobPhase::Running).await;
    // The trap is set once the first line is there.
    wait_lines(&case, "ckpt.starts", 1).await;
    let pgid: i32 = running
        .workload
        .unwrap()
        .trim_start_matches("pid/")
        .parse()
        .unwrap();
    assert!(managed_jobs::process::group_exists(pgid));
    let (suspended, took) = case.suspend("ckpt", true).await;
    eprintln!(
        "running local job (TERM handler) suspended in {:.2} s",
        took.as_secs_f64()
    );
    assert!(
        took <= Duration::from_secs(GRACE) + SLACK,
        "the stop took {took:?}"
    );
    assert!(
        !managed_jobs::process::group_exists(pgid),
        "the workload's process group survived the suspension"
    );
    assert_eq!(
        case.lines("ckpt.marker"),
        ["saved"],
        "the TERM handler ran once"
    );
    assert_eq!((suspended.restart_count, suspended.recovery_count), (0, 0));
    // The run slot was given back: a new job runs (run cap 1) while it is suspended.
    let done = case
        .resume_ahead_of_a_later_job("ckpt", &suspended, false)
        .await;
    assert_eq!((done.restart_count, done.recovery_count), (0, 0));
    assert_eq!(done.attempt, suspended.attempt + 1, "{:?}", done.attempts);
    assert!(
        done.attempts
            .iter()
            .any(|a| a.attempt == suspended.attempt && a.action == "Suspended"),
        "the history lost the suspended attempt: {:?}",
        done.attempts
    );
    assert_eq!(case.lines("ckpt.starts"), ["start", "resumed"]);
    assert_eq!(
        case.lines("ckpt.marker"),
        ["saved"],
        "the checkpoint was written exactly once"
    );
    watch.abort();
}

#[tokio::test]
async fn a_running_pod_job_loses_its_pod_and_resumes_in_a_new_one() {
    let cp = control_plane_or_skip!();
    let (case, watch) = case(cp, "susp-pod").await;
    let (pod_watch, pods) = watch_pods(&case.client, &case.ns);
    let _op = support::OperatorProcess::start(cp, &case.ns, &["--run-cap", "1"]);
    const GRACE: i64 = 7;
    case.create(&pod_job("trainer", "15s", GRACE)).await;
    case.wait_phase("trainer", JobPhase::Running).await;
    let first = support::pod_name(&case.client, &case.ns, "trainer", 1).await;
    let (suspended, took) = case.suspend("trainer", true).await;
    eprintln!("running pod job suspended in {:.2} s", took.as_secs_f64());
    assert!(
        took <= Duration::from_secs(GRACE as u64) + SLACK,
        "the stop took {took:?}"
    );
    // Its Pod is gone (kwok deletes a Pod at once once it is being deleted), deleted with the
    // job's grace.
    let api: Api<Pod> = Api::namespaced(case.client.clone(), &case.ns);
    let start = Instant::now();
    while api.get_opt(&first).await.unwrap().is_some() {
        assert!(start.elapsed() < T, "{first} was never deleted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seen = pods
        .lock()
        .unwrap()
        .get(&first)
        .cloned()
        .unwrap_or_default();
    eprintln!("{first}: {seen:?}");
    assert!(seen.deleted, "{first}: {seen:?}");
    assert_eq!(
        seen.deletion_grace,
        Some(GRACE),
        "{first} was not deleted with the job's grace"
    );
    let done = case
        .resume_ahead_of_a_later_job("trainer", &suspended, false)
        .await;
    assert_eq!((done.restart_count, done.recovery_count), (0, 0));
    assert_eq!(done.attempt, suspended.attempt + 1);
    assert!(
        done.attempts
            .iter()
            .any(|a| a.attempt == suspended.attempt && a.action == "Suspended"),
        "{:?}",
        done.attempts
    );
    pod_watch.abort();
    let names: Vec<String> = pods.lock().unwrap().keys().cloned().collect();
    let second = support::pod_name(&case.client, &case.ns, "trainer", 2).await;
    assert_eq!(
        names,
        {
            let mut v = vec![first, second];
            v.sort();
            v
        },
        "one Pod per attempt, none while suspended"
    );
    watch.abort();
}

/// A running gang suspended shows no members running (issue 43: it kept `readyNodes: 4/4` with
/// no Pod left), and none of its Pods is left.
#[tokio::test]
async fn a_suspended_gang_shows_no_ready_members() {
    let cp = control_plane_or_skip!();
    let (case, watch) = case(cp, "susp-gang").await;
    let _op = support::OperatorProcess::start(cp, &case.ns, &["--gang-scheduling", "off"]);
    let yaml = pod_job("gang", "300s", 1).replace(
        "spec:
  termination",
        "spec:
  nodes: 4
  termination",
    );
    case.create(&yaml).await;
    case.wait("gang", "Running 4/4", |s| {
        s.phase == Some(JobPhase::Running) && s.ready_nodes.as_deref() == Some("4/4")
    })
    .await;
    let (suspended, _) = case.suspend("gang", true).await;
    assert_eq!(suspended.ready_nodes, None, "{suspended:?}");
    let api: Api<Pod> = Api::namespaced(case.client.clone(), &case.ns);
    let start = Instant::now();
    while !api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .is_empty()
    {
        assert!(
            start.elapsed() < T,
            "the suspended gang's Pods were never deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    watch.abort();
}

#[tokio::test]
async fn a_pipeline_suspended_in_its_second_task_resumes_at_that_task() {
    let cp = control_plane_or_skip!();
    let (case, watch) = case(cp, "susp-pipe").await;
    let _op = support::OperatorProcess::start(cp, &case.ns, &["--run-cap", "1"]);
    let ran = case.file("ran");
    let tasks = [
        ("prepare", format!("echo prepare >> {}", ran.display())),
        (
            "train",
            format!(
                "echo train >> {}; {}",
                ran.display(),
                checkpointing(&case.file("train.starts"), &case.file("train.marker"))
            ),
        ),
        ("evaluate", format!("echo evaluate >> {}", ran.display())),
    ];
    let mut yaml = "apiVersion: managedjobs.dev/v1alpha1\nkind: ManagedJob\nmetadata:\n  name: etl\nspec:\n  terminationGracePeriodSeconds: 10\n  tasks:\n".to_string();
    for (task, run) in &tasks {
        yaml.push_str(&format!("    - name: {task}\n      run: {run:?}\n"));
    }
    case.create(&yaml).await;
    case.wait("etl", "running its second task", |s| {
        s.phase == Some(JobPhase::Running) && s.current_task == Some(1)
    })
    .await;
    wait_lines(&case, "train.starts", 1).await;
    let (suspended, took) = case.suspend("etl", true).await;
    eprintln!(
        "pipeline suspended in task 2/3 in {:.2} s",
        took.as_secs_f64()
    );
    assert_eq!(suspended.current_task, Some(1));
    let phases: Vec<TaskPhase> = suspended.tasks.iter().map(|t| t.phase).collect();
    assert_eq!(
        phases,
        [
            TaskPhase::Succeeded,
            TaskPhase::Suspended,
            TaskPhase::Pending
        ],
        "{:?}",
        suspended.tasks
    );
    assert!(
        suspended
            .attempts
            .iter()
            .any(|a| a.action == "Suspended" && a.task.as_deref() == Some("train")),
        "{:?}",
        suspended.attempts
    );
    assert_eq!(case.lines("train.marker"), ["saved"]);
    let done = case
        .resume_ahead_of_a_later_job("etl", &suspended, false)
        .await;
    assert_eq!(
        done.tasks.iter().map(|t| t.phase).collect::<Vec<_>>(),
        [TaskPhase::Succeeded; 3]
    );
    assert_eq!((done.restart_count, done.recovery_count), (0, 0));
    for t in &done.tasks {
        assert_eq!((t.restart_count, t.recovery_count), (0, 0), "{}", t.name);
    }
    assert_eq!(
        case.lines("ran"),
        ["prepare", "train", "train", "evaluate"],
        "the first task ran once, the second twice"
    );
    assert_eq!(case.lines("train.starts"), ["start", "resumed"]);
    assert_eq!(case.lines("train.marker"), ["saved"]);
    watch.abort();
}

/// A local script that appends to `starts` at each start and runs for ever the first time,
/// a second the next.
fn counted(starts: &Path) -> String {
    let starts = starts.display();
    format!(
        "echo start >> {starts}; if [ $(wc -l < {starts}) -ge 2 ]; then sleep 1; exit 0; fi; sleep 600"
    )
}

#[tokio::test]
async fn suspended_jobs_stay_suspended_across_operator_restarts() {
    let cp = control_plane_or_skip!();
    let (case, watch) = case(cp, "susp-restart").await;
    let (pod_watch, pods) = watch_pods(&case.client, &case.ns);
    let mut op = support::OperatorProcess::start(cp, &case.ns, &["--run-cap", "4"]);
    let from = Instant::now();
    // Running, then suspended: a local job and a pod job. Suspended from its creation: a local
    // job (as a suspend kept in git would be applied).
    case.create(&local_job("local", &counted(&case.file("local"))))
        .await;
    case.create(&pod_job("pod", "15s", 3)).await;
    let born = format!("echo start >> {}; sleep 1", case.file("born").display());
    let since = jiff::Timestamp::now().as_second();
    case.create_as_manager(&local_job_with("born", &born, "  suspend: true\n"))
        .await;
    for job in ["local", "pod"] {
        case.wait_phase(job, JobPhase::Running).await;
    }
    wait_lines(&case, "local", 1).await;
    let born_status = case.wait_phase("born", JobPhase::Suspended).await;
    check_suspended("born", &born_status, false, since);
    let mut before = BTreeMap::new();
    for job in ["local", "pod"] {
        before.insert(job, case.suspend(job, true).await.0);
    }
    before.insert("born", born_status);
    let first_pod = support::pod_name(&case.client, &case.ns, "pod", 1).await;
    // A crash (SIGKILL of the operator and its job controllers), then a rollout (SIGTERM).
    op.kill_with_job_controllers();
    tokio::time::sleep(Duration::from_secs(1)).await;
    op.start_again();
    tokio::time::sleep(Duration::from_secs(6)).await;
    op.terminate();
    tokio::time::sleep(Duration::from_millis(500)).await;
    op.start_again();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let to = Instant::now();
    for job in ["local", "pod", "born"] {
        case.stayed_suspended(job, from, to);
        let s = case.wait(job, "", |_| true).await;
        assert_eq!(s.phase, Some(JobPhase::Suspended), "{job}: {:?}", s.message);
        assert_eq!(s.job_id, before[job].job_id, "{job} kept its id");
    }
    assert_eq!(case.lines("local"), ["start"], "started while suspended");
    assert!(
        case.lines("born").is_empty(),
        "born started while suspended"
    );
    assert_eq!(
        pods.lock().unwrap().keys().cloned().collect::<Vec<_>>(),
        std::slice::from_ref(&first_pod),
        "a Pod was created while the job was suspended"
    );
    // Resumed, each Succeeds.
    for job in ["local", "pod", "born"] {
        case.resume(job, &before[job], false).await;
    }
    for job in ["local", "pod", "born"] {
        let s = case.wait_succeeded(job).await;
        assert_eq!((s.restart_count, s.recovery_count), (0, 0), "{job}");
    }
    assert_eq!(case.lines("local"), ["start", "start"]);
    assert_eq!(case.lines("born"), ["start"]);
    pod_watch.abort();
    let second = support::pod_name(&case.client, &case.ns, "pod", 2).await;
    assert_eq!(pods.lock().unwrap().keys().cloned().collect::<Vec<_>>(), {
        let mut v = vec![first_pod, second];
        v.sort();
        v
    });
    watch.abort();
}

#[tokio::test]
async fn suspended_jobs_stay_suspended_across_a_lost_store() {
    let cp = control_plane_or_skip!();
    let (case, watch) = case(cp, "susp-lost").await;
    let (pod_watch, pods) = watch_pods(&case.client, &case.ns);
    let mut op = support::OperatorProcess::start(cp, &case.ns, &["--run-cap", "4"]);
    let from = Instant::now();
    case.create(&local_job("local", &counted(&case.file("local"))))
        .await;
    case.create(&pod_job("pod", "15s", 3)).await;
    let born = format!("echo start >> {}; sleep 1", case.file("born").display());
    case.create_as_manager(&local_job_with("born", &born, "  suspend: true\n"))
        .await;
    for job in ["local", "pod"] {
        case.wait_phase(job, JobPhase::Running).await;
    }
    wait_lines(&case, "local", 1).await;
    let born_status = case.wait_phase("born", JobPhase::Suspended).await;
    let mut before = BTreeMap::new();
    for job in ["local", "pod"] {
        before.insert(job, case.suspend(job, true).await.0);
    }
    before.insert("born", born_status);
    let first_pod = support::pod_name(&case.client, &case.ns, "pod", 1).await;
    // The store is lost while the operator is down.
    op.kill_with_job_controllers();
    let store = managed_jobs::state_dir::StateDir::new(op.state_path()).store();
    for suffix in ["", "-wal", "-shm"] {
        let mut path = store.clone().into_os_string();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
    assert!(!store.exists());
    op.start_again();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let to = Instant::now();
    for job in ["local", "pod", "born"] {
        case.stayed_suspended(job, from, to);
        let s = case.wait(job, "", |_| true).await;
        assert_eq!(s.phase, Some(JobPhase::Suspended), "{job}: {:?}", s.message);
        assert_eq!(s.job_id, before[job].job_id, "{job} kept its id");
        assert_eq!(
            s.attempts, before[job].attempts,
            "{job}: the attempt history changed"
        );
    }
    assert_eq!(case.lines("local"), ["start"]);
    assert!(case.lines("born").is_empty());
    assert_eq!(
        pods.lock().unwrap().keys().cloned().collect::<Vec<_>>(),
        std::slice::from_ref(&first_pod)
    );
    for job in ["local", "pod", "born"] {
        case.resume(job, &before[job], false).await;
    }
    for job in ["local", "pod", "born"] {
        let s = case.wait_succeeded(job).await;
        assert_eq!((s.restart_count, s.recovery_count), (0, 0), "{job}");
    }
    assert_eq!(case.lines("local"), ["start", "start"]);
    assert_eq!(case.lines("born"), ["start"]);
    pod_watch.abort();
    let second = support::pod_name(&case.client, &case.ns, "pod", 2).await;
    assert_eq!(pods.lock().unwrap().keys().cloned().collect::<Vec<_>>(), {
        let mut v = vec![first_pod, second];
        v.sort();
        v
    });
    watch.abort();
}
