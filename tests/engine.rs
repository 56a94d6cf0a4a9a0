//! The engine with real job controller processes, real workloads and a real SQLite file, without
//! Kubernetes: lifecycle, restarts, caps, cancellation and crash resumption.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use managed_jobs::api::{EnvVar, JobPhase, ManagedJobSpec, RecoverySpec, ScheduleState};
use managed_jobs::capacity::{Caps, Overrides, compute};
use managed_jobs::engine::{Config, Engine};
use managed_jobs::lifecycle::JobRow;
use managed_jobs::{api::ExecutorKind, process};

fn config(dir: &Path, caps: Caps) -> Config {
    let mut capacity = compute(2, 4096, Overrides::default());
    capacity.caps = caps;
    Config {
        state_dir: dir.to_path_buf(),
        namespace: None,
        executors: vec![ExecutorKind::Local],
        capacity,
        cancel_grace: Duration::from_secs(2),
        restart_backoff: Duration::from_millis(100),
        max_controller_crashes: 3,
        launch_timeout: managed_jobs::defaults::LAUNCH_TIMEOUT,
        max_launch_timeouts: managed_jobs::defaults::MAX_LAUNCH_TIMEOUTS,
        self_exe: env!("CARGO_BIN_EXE_managed-jobs").into(),
        shard: None,
        gang_scheduling: true,
        queues_from_api: false,
        claims: false,
        kept_log_bytes: managed_jobs::defaults::KEPT_LOG_BYTES,
        burst: managed_jobs::pacing::BurstPolicy::OFF,
    }
}

fn spec(run: &str) -> ManagedJobSpec {
    ManagedJobSpec {
        run: Some(run.into()),
        ..Default::default()
    }
}

fn submit(engine: &Engine, name: &str, spec: &ManagedJobSpec) -> i64 {
    let id = engine
        .store()
        .upsert(&format!("uid-{name}"), "test", name, 1, spec)
        .unwrap()
        .row
        .id;
    engine.wake_all();
    id
}

async fn wait_for(
    engine: &Engine,
    id: i64,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&JobRow) -> bool,
) -> JobRow {
    let start = Instant::now();
    loop {
        let row = engine.store().get(id).unwrap();
        if pred(&row) {
            return row;
        }
        assert!(
            start.elapsed() < timeout,
            "job {id} never reached {what}; now {:?}/{:?}: {}\nhistory: {:#?}",
            row.phase,
            row.schedule_state,
            row.message,
            engine.store().history(id).unwrap()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn wait_done(engine: &Engine, id: i64) -> JobRow {
    wait_for(engine, id, "Done", Duration::from_secs(60), |r| {
        r.schedule_state == ScheduleState::Done
    })
    .await
}

fn start(dir: &Path, caps: Caps) -> Arc<Engine> {
    Engine::start(config(dir, caps)).expect("engine starts")
}

const CAPS: Caps = Caps { launch: 4, run: 8 };

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_succeeds_with_its_output_logged() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let id = submit(&engine, "hello", &spec("echo hello from $MANAGEDJOB_NAME"));
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
    assert_eq!(row.exit_code, Some(0));
    assert_eq!(row.attempt, 1);
    assert_eq!(row.controller_starts, 1);
    let log = std::fs::read_to_string(dir.path().join(format!("logs/{id}.workload.log"))).unwrap();
    assert_eq!(log, "hello from hello\n");
    let phases: Vec<String> = engine
        .store()
        .history(id)
        .unwrap()
        .into_iter()
        .map(|t| t.to_phase.to_string())
        .collect();
    // Submitted is written over Pending when the engine records the new process; a job
    // controller that outruns that write (a loaded machine) has already moved it to Starting.
    for p in ["Pending", "Starting", "Running", "Succeeded"] {
        assert!(
            phases.contains(&p.to_string()),
            "{p} missing from {phases:?}"
        );
    }
    let order: Vec<&str> = phases
        .iter()
        .map(String::as_str)
        .filter(|p| *p != "Pending")
        .collect();
    assert!(
        order == ["Submitted", "Starting", "Running", "Succeeded"]
            || order == ["Starting", "Running", "Succeeded"],
        "{phases:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quoting_reaches_the_script_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let spec = ManagedJobSpec {
        run: Some("printf '%s\\n' \"hello, $WHO\" 'literal $HOME `id`'\n".into()),
        env: vec![EnvVar {
            name: "WHO".into(),
            value: "wörld; rm -rf / #".into(),
        }],
        ..Default::default()
    };
    let id = submit(&engine, "quoting", &spec);
    assert_eq!(wait_done(&engine, id).await.phase, JobPhase::Succeeded);
    let log = std::fs::read_to_string(dir.path().join(format!("logs/{id}.workload.log"))).unwrap();
    assert_eq!(log, "hello, wörld; rm -rf / #\nliteral $HOME `id`\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_sees_only_the_specs_environment() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    // SAFETY: set before any job controller is spawned; tests in this binary don't read it.
    unsafe { std::env::set_var("MJ_SECRET_OF_THE_OPERATOR", "leaked") };
    let id = submit(&engine, "env", &spec("env | sort"));
    assert_eq!(wait_done(&engine, id).await.phase, JobPhase::Succeeded);
    let log = std::fs::read_to_string(dir.path().join(format!("logs/{id}.workload.log"))).unwrap();
    assert!(!log.contains("MJ_SECRET"), "{log}");
    assert!(log.contains("MANAGEDJOB_ID="), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_job_gets_exactly_one_plus_max_restarts_attempts() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let spec = ManagedJobSpec {
        run: Some("echo attempt $MANAGEDJOB_ATTEMPT; exit 7".into()),
        recovery: RecoverySpec {
            max_restarts_on_errors: 2,
            max_recoveries: None,
            max_ignored: None,
        },
        ..Default::default()
    };
    let id = submit(&engine, "failing", &spec);
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::Failed, "{}", row.message);
    assert_eq!(row.exit_code, Some(7));
    assert_eq!(row.restart_count, 2);
    assert_eq!(row.attempt, 3);
    let log = std::fs::read_to_string(dir.path().join(format!("logs/{id}.workload.log"))).unwrap();
    assert_eq!(log, "attempt 1\nattempt 2\nattempt 3\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_failure_is_failed_setup() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let spec = ManagedJobSpec {
        setup: Some("exit 4".into()),
        run: Some("echo never".into()),
        ..Default::default()
    };
    let id = submit(&engine, "setup", &spec);
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::FailedSetup);
    assert_eq!(row.exit_code, Some(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caps_are_never_exceeded_and_every_job_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), Caps { launch: 2, run: 3 });
    let ids: Vec<i64> = (0..20)
        .map(|i| submit(&engine, &format!("batch-{i}"), &spec("sleep 0.2")))
        .collect();
    let mut max_alive = 0;
    let mut max_launching = 0;
    loop {
        let usage = engine.store().slot_usage().unwrap();
        max_alive = max_alive.max(usage.alive);
        max_launching = max_launching.max(usage.launching);
        let done = ids
            .iter()
            .filter(|id| engine.store().get(**id).unwrap().schedule_state == ScheduleState::Done)
            .count();
        if done == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(max_alive <= 3, "alive peaked at {max_alive}");
    assert!(max_launching <= 2, "launching peaked at {max_launching}");
    assert_eq!(max_alive, 3, "the run cap should be used");
    for id in ids {
        assert_eq!(engine.store().get(id).unwrap().phase, JobPhase::Succeeded);
    }
}

/// While a burst of jobs arrives (issue 34: 250 arrivals a second, as the operator's watch
/// reports them), new jobs launch at the burst launch rate, not as fast as the caps allow; once
/// the arrivals stop, the rest launch at full speed and every job runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_paces_new_launches_then_every_job_runs_once() {
    use managed_jobs::pacing::{BurstPolicy, Pace};
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), Caps { launch: 8, run: 64 });
    cfg.burst = BurstPolicy {
        threshold_per_s: 20,
        launch_rate: 2,
        api_qps: 5,
        hold: Duration::from_secs(30),
    };
    let engine = Engine::start(cfg).expect("engine starts");
    let arrive = |n: usize| {
        for _ in 0..n {
            engine.pacer.arrive(managed_jobs::lifecycle::now_ms());
        }
    };
    arrive(50);
    assert_eq!(engine.pacer.pace(), Pace::Paced);
    let ids: Vec<i64> = (0..30)
        .map(|i| submit(&engine, &format!("burst-{i}"), &spec("true")))
        .collect();
    let burst = Instant::now();
    let mut free_at = Vec::new();
    while burst.elapsed() < Duration::from_secs(3) {
        arrive(5);
        if engine.pacer.pace() == Pace::Free {
            free_at.push(burst.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seconds = burst.elapsed().as_secs_f64();
    assert!(
        free_at.is_empty(),
        "the pacing ended during the burst at {free_at:?}"
    );
    let launched = ids
        .iter()
        .filter(|id| engine.store().get(**id).unwrap().schedule_state != ScheduleState::Waiting)
        .count();
    // One at once, then one every 500 ms.
    let most = 1 + (seconds * 2.0).ceil() as usize;
    assert!(
        (1..=most).contains(&launched),
        "{launched} of 30 jobs launched during a {seconds:.1} s burst paced at 2/s (at most {most})"
    );
    for id in ids {
        let row = wait_done(&engine, id).await;
        assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
        assert_eq!((row.attempt, row.controller_starts), (1, 1));
    }
    assert_eq!(engine.pacer.pace(), Pace::Free);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_within_a_priority_and_higher_priority_first() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), Caps { launch: 1, run: 1 });
    let blocker = submit(&engine, "blocker", &spec("sleep 1"));
    wait_for(&engine, blocker, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let low: Vec<i64> = (0..3)
        .map(|i| submit(&engine, &format!("low-{i}"), &spec("true")))
        .collect();
    let high = submit(
        &engine,
        "high",
        &ManagedJobSpec {
            priority: 100,
            ..spec("true")
        },
    );
    let mut order: Vec<(i64, i64)> = Vec::new();
    for id in low.iter().chain([&high]) {
        let row = wait_done(&engine, *id).await;
        order.push((row.started_at_ms.unwrap(), *id));
    }
    order.sort();
    let started: Vec<i64> = order.into_iter().map(|(_, id)| id).collect();
    assert_eq!(started, vec![high, low[0], low[1], low[2]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_pending_starts_no_process() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), Caps { launch: 1, run: 1 });
    let blocker = submit(&engine, "blocker", &spec("sleep 30"));
    wait_for(&engine, blocker, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let queued = submit(&engine, "queued", &spec("sleep 30"));
    let row = engine.store().get(queued).unwrap();
    assert_eq!(row.schedule_state, ScheduleState::Waiting);
    let row = engine.cancel(row, false).unwrap();
    assert_eq!(row.phase, JobPhase::Cancelled);
    assert_eq!(row.schedule_state, ScheduleState::Done);
    assert_eq!(row.controller_starts, 0);
    let blocker_row = engine.store().get(blocker).unwrap();
    engine.cancel(blocker_row, false).unwrap();
    wait_done(&engine, blocker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_while_running_stops_the_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let id = submit(&engine, "long", &spec("sleep 300 & sleep 300; wait"));
    let row = wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let pgid = wrapper_pid(&row);
    assert!(process::group_exists(pgid));
    let row = engine.store().get(id).unwrap();
    engine.cancel(row, false).unwrap();
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::Cancelled);
    assert!(
        !process::group_exists(pgid),
        "the workload's group survived"
    );
    let phases: Vec<String> = engine
        .store()
        .history(id)
        .unwrap()
        .into_iter()
        .map(|t| t.to_phase.to_string())
        .collect();
    assert!(phases.contains(&"Cancelling".to_string()), "{phases:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_job_controller_is_resumed_and_the_job_runs_once() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let id = submit(
        &engine,
        "resume",
        &spec("echo started >> runs.txt; sleep 1; echo ok"),
    );
    let row = wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let pid = row.controller_pid.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
    assert_eq!(row.controller_crashes, 1);
    assert_eq!(row.controller_starts, 2);
    assert_eq!(
        row.attempt, 1,
        "the workload must be adopted, not relaunched"
    );
    let runs = std::fs::read_to_string(dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "started\n");
}

/// A job controller that recorded an attempt's launch and stopped before it started the process
/// (killed between the two, with its operator) leaves an attempt that never ran: the next
/// operator's controller starts that same attempt; it does not count it lost and run a second.
/// The store is left as that kill leaves it (admitted, a controller recorded and gone, attempt
/// 1's launch recorded) by the transitions the engine and the controller write, with no
/// process and no exit file; then an engine starts on it.
#[test]
fn an_attempt_whose_launch_was_recorded_but_never_started_runs_as_the_same_attempt() {
    use managed_jobs::lifecycle::{Transition, admit, controller_started, starting};
    use managed_jobs::store::Store;
    let dir = tempfile::tempdir().unwrap();
    let state = managed_jobs::state_dir::StateDir::new(dir.path());
    std::fs::create_dir_all(dir.path()).unwrap();
    let id = {
        let mut store = Store::open(&state.store(), 1024).unwrap();
        let spec = spec("echo \"run $MANAGEDJOB_ATTEMPT\" >> runs.txt");
        let mut row = store
            .upsert("uid-never-started", "test", "never-started", 1, &spec)
            .unwrap()
            .row;
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let (pid, start_time) = (gone.id() as i32, process::start_time(gone.id() as i32));
        gone.wait().unwrap();
        let steps: [&dyn Fn(&JobRow) -> Transition; 3] = [
            &admit,
            &|r| controller_started(r, pid, start_time.unwrap_or(1)),
            &|r| starting(r, 1),
        ];
        for step in steps {
            let t = step(&row);
            row = store
                .transition(row.id, &t)
                .unwrap()
                .applied()
                .unwrap_or_else(|| panic!("{t:?} refused"));
        }
        assert_eq!(
            (row.schedule_state, row.launched_attempt),
            (ScheduleState::Launching, 1)
        );
        row.id
    };
    assert!(!state.exit_file(id, 1).exists());

    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let engine = start(dir.path(), CAPS);
        let row = wait_done(&engine, id).await;
        let history = engine.store().history(id).unwrap();
        assert_eq!(
            row.phase,
            JobPhase::Succeeded,
            "{}: {history:#?}",
            row.message
        );
        assert_eq!(row.attempt, 1, "started again as attempt 1: {history:#?}");
        assert_eq!(row.recovery_count, 0, "{history:#?}");
        assert_eq!(row.restart_count, 0, "{history:#?}");
        assert_eq!(row.controller_crashes, 0, "a hand-over: {history:#?}");
    });
    let runs = std::fs::read_to_string(dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "run 1\n");
}

/// An attempt seen running that leaves no trace at all (no process, no exit file: a wrapper of
/// an earlier release, or one whose first write failed, killed with its group) did run: it is
/// lost and recovered as attempt 2, never started again as attempt 1. The controller is
/// stopped (SIGSTOP) while its attempt is killed and the exit file removed, then killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_seen_running_that_left_no_trace_is_lost_not_started_again() {
    use nix::sys::signal::{Signal, kill, killpg};
    use nix::unistd::Pid;
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let id = submit(
        &engine,
        "no-trace",
        &spec("echo \"began $MANAGEDJOB_ATTEMPT\" >> runs.txt; sleep 1"),
    );
    let row = wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let exit_file = managed_jobs::state_dir::StateDir::new(dir.path()).exit_file(id, 1);
    // Running is written once the wrapper is spawned; its mark follows within moments.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mark = loop {
        match std::fs::read_to_string(&exit_file) {
            Ok(mark) if !mark.is_empty() => break mark,
            seen if Instant::now() > deadline => panic!("no start mark after 10 s: {seen:?}"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert_eq!(mark, "started\n", "the wrapper marks its start");
    let controller = Pid::from_raw(row.controller_pid.unwrap());
    kill(controller, Signal::SIGSTOP).unwrap();
    killpg(Pid::from_raw(wrapper_pid(&row)), Signal::SIGKILL).unwrap();
    std::fs::remove_file(&exit_file).unwrap();
    kill(controller, Signal::SIGKILL).unwrap();

    let row = wait_done(&engine, id).await;
    let history = engine.store().history(id).unwrap();
    assert_eq!(
        row.phase,
        JobPhase::Succeeded,
        "{}: {history:#?}",
        row.message
    );
    assert_eq!((row.attempt, row.recovery_count), (2, 1), "{history:#?}");
    let runs = std::fs::read_to_string(dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "began 1\nbegan 2\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_workload_is_recovered_within_max_recoveries() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let spec = ManagedJobSpec {
        run: Some("if [ \"$MANAGEDJOB_ATTEMPT\" = 1 ]; then sleep 300; fi".into()),
        recovery: RecoverySpec {
            max_restarts_on_errors: 0,
            max_recoveries: Some(1),
            max_ignored: None,
        },
        ..Default::default()
    };
    let id = submit(&engine, "preempted", &spec);
    let row = wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let pgid = wrapper_pid(&row);
    // Preemption: the whole group goes at once, before the wrapper can record an exit code.
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pgid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
    assert_eq!(row.recovery_count, 1);
    assert_eq!(row.attempt, 2);
}

#[test]
fn engine_restart_adopts_running_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let first = tokio::runtime::Runtime::new().unwrap();
    let id = first.block_on(async {
        let engine = start(dir.path(), CAPS);
        let id = submit(&engine, "survivor", &spec("echo run >> runs.txt; sleep 2"));
        wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
            r.phase == JobPhase::Running
        })
        .await;
        id
    });
    // Stopping the runtime drops every task of the first engine and with them its lock; the
    // job controller process (own session) keeps running.
    first.shutdown_timeout(Duration::from_secs(1));
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let engine = start(dir.path(), CAPS);
        let row = wait_done(&engine, id).await;
        assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
        assert_eq!(
            row.controller_starts, 1,
            "the running controller is adopted"
        );
        assert_eq!(row.controller_crashes, 0);
    });
    let runs = std::fs::read_to_string(dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "run\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_engine_on_one_state_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = start(dir.path(), CAPS);
    let err = Engine::start(config(dir.path(), CAPS))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("another operator"), "{err}");
}

/// docs/design.md#processes-crashes-and-resumption: an operator restart is a hand-over. Three times, the engine goes away
/// together with the job's controller (as a container restart takes both); each start finds the
/// controller dead and resumes the job without counting a crash, though the crash limit is 3.
#[test]
fn operator_restarts_that_take_the_job_controller_along_are_not_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let id = rt.block_on(async {
            let engine = start(dir.path(), CAPS);
            let id = submit(&engine, "handover", &spec("echo run >> runs.txt; sleep 6"));
            wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
                r.phase == JobPhase::Running
            })
            .await;
            id
        });
        rt.shutdown_timeout(Duration::from_secs(1));
        id
    };
    let kill_controller = || {
        let store = managed_jobs::store::Store::open(
            &managed_jobs::state_dir::StateDir::new(dir.path()).store(),
            256,
        )
        .unwrap();
        let row = store.get(id).unwrap();
        let pid = row.controller_pid.expect("a recorded controller");
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        // Wait until it is gone: it was the child of an engine whose runtime is shut down, so
        // nobody reaps it and a zombie counts as gone (as the engine's liveness check has it).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process::start_time(pid).is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    kill_controller();
    for round in 0..3 {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let done = rt.block_on(async {
            let engine = start(dir.path(), CAPS);
            if round < 2 {
                wait_for(
                    &engine,
                    id,
                    "a new controller",
                    Duration::from_secs(30),
                    |r| r.controller_pid.is_some() && r.controller_starts == round + 2,
                )
                .await;
                None
            } else {
                Some(wait_done(&engine, id).await)
            }
        });
        rt.shutdown_timeout(Duration::from_secs(1));
        if let Some(row) = done {
            assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
            assert_eq!(row.controller_crashes, 0, "hand-overs are not crashes");
            assert_eq!(row.controller_starts, 4, "one start, three resumptions");
            assert_eq!(row.attempt, 1, "the workload was adopted each time");
        } else {
            kill_controller();
        }
    }
    let runs = std::fs::read_to_string(dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "run\n", "the workload ran once");
}

/// docs/upgrades.md: a version change is a hand-over. An engine of one build starts a job's
/// controller, goes away (its controller stays, as a host operator's SIGTERM leaves it), and an
/// engine of another build (a copy of the binary: another executable) starts on the state dir:
/// it stops the old build's controller before it touches the store, leaving the workload, and
/// a controller of its own build adopts the workload. One run, no crash, no relaunch.
#[test]
fn an_engine_of_another_build_replaces_the_job_controllers_and_adopts_their_workloads() {
    let dir = tempfile::tempdir().unwrap();
    let builds = tempfile::tempdir().unwrap();
    let old_build = builds.path().join("managed-jobs-old");
    std::fs::copy(env!("CARGO_BIN_EXE_managed-jobs"), &old_build).unwrap();
    let gate = dir.path().join("go");
    let script = format!(
        "echo run >> runs.txt; while [ ! -e '{}' ]; do sleep 0.1; done",
        gate.display()
    );
    let (id, old_pid) = {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let out = rt.block_on(async {
            let mut cfg = config(dir.path(), CAPS);
            cfg.self_exe = old_build.clone();
            let engine = Engine::start(cfg).expect("engine starts");
            let id = submit(&engine, "upgraded", &spec(&script));
            let row = wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
                r.phase == JobPhase::Running
            })
            .await;
            (id, row.controller_pid.expect("a controller"))
        });
        rt.shutdown_timeout(Duration::from_secs(1));
        out
    };
    assert_eq!(
        process::executable_identity(old_pid),
        process::file_identity(&old_build),
        "the first engine's controller runs its build"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let row = rt.block_on(async {
        let engine = start(dir.path(), CAPS);
        assert!(
            process::start_time(old_pid).is_none(),
            "the old build's controller is gone once the new engine has started"
        );
        let row = wait_for(
            &engine,
            id,
            "a controller of the new build",
            Duration::from_secs(30),
            |r| r.controller_pid.is_some_and(|p| p != old_pid),
        )
        .await;
        let pid = row.controller_pid.unwrap();
        assert_eq!(
            process::executable_identity(pid),
            process::file_identity(Path::new(env!("CARGO_BIN_EXE_managed-jobs")))
        );
        std::fs::write(&gate, "").unwrap();
        wait_done(&engine, id).await
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
    assert_eq!(row.controller_crashes, 0, "a version change is no crash");
    assert_eq!(row.controller_starts, 2, "one start, one hand-over");
    assert_eq!(row.attempt, 1, "the workload was adopted");
    let runs = std::fs::read_to_string(dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "run\n", "the workload ran once");
}

/// `activeDeadlineSeconds` holds between attempts: a deadline that passes during a restart
/// back-off fails the job DeadlineExceeded at once; the next attempt never starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_passing_in_a_back_off_fails_the_job_without_another_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), CAPS);
    cfg.restart_backoff = Duration::from_secs(30);
    let engine = Engine::start(cfg).expect("engine starts");
    let spec = ManagedJobSpec {
        run: Some("echo attempt >> runs.txt; sleep 1; exit 1".into()),
        recovery: RecoverySpec {
            max_restarts_on_errors: 3,
            max_recoveries: None,
            max_ignored: None,
        },
        active_deadline_seconds: Some(3),
        ..Default::default()
    };
    let id = submit(&engine, "deadline", &spec);
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::Failed, "{}", row.message);
    assert_eq!(
        row.failure_reason.as_ref().map(|f| f.as_str()),
        Some("DeadlineExceeded")
    );
    let ran = row.finished_at_ms.unwrap() - row.started_at_ms.unwrap();
    assert!(
        (3_000..5_000).contains(&ran),
        "failed {ran} ms after the start, not at the deadline"
    );
    let runs = std::fs::read_to_string(dir.path().join(format!("work/{id}/runs.txt"))).unwrap();
    assert_eq!(runs, "attempt\n", "no attempt after the first");
}

/// A workload that exits within its own spawn still records that it ran: Running is in the
/// history (the Launched Event comes from it) and startedAt is set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ends_at_once_still_records_that_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    for i in 0..5 {
        let id = submit(&engine, &format!("instant-{i}"), &spec("true"));
        let row = wait_done(&engine, id).await;
        assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
        assert!(row.started_at_ms.is_some(), "startedAt is set");
        let phases: Vec<String> = engine
            .store()
            .history(id)
            .unwrap()
            .into_iter()
            .map(|t| t.to_phase.to_string())
            .collect();
        assert!(phases.contains(&"Running".to_string()), "{phases:?}");
    }
}

/// Processes still marked as `job`'s `attempt` (its environment mark, executor::contain).
/// The pid of a running local attempt's wrapper (`status.workload` is `pid/<pid>`), which leads
/// the attempt's process group.
fn wrapper_pid(row: &JobRow) -> i32 {
    match &row.workload {
        Some(managed_jobs::lifecycle::Workload::Process(pid)) => *pid,
        other => panic!("not a local workload: {other:?}"),
    }
}

fn marked(dir: &Path, job: i64, attempt: i32) -> Vec<i32> {
    let scope = managed_jobs::state_dir::StateDir::new(dir).exit_file(job, attempt);
    managed_jobs::executor::contain::with_scope(&scope.to_string_lossy())
}

/// Every process a local attempt starts, however it detaches (a background child in its group,
/// `setsid -f` into a session of its own), is stopped when the attempt ends: on success, on
/// failure, on cancel and on the deadline. The run slot is never released while they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_escape_their_attempt_are_stopped_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let escape = "sleep 300 & setsid -f sleep 301";
    let succeeds = submit(&engine, "succeeds", &spec(&format!("{escape}; exit 0")));
    let fails = submit(&engine, "fails", &spec(&format!("{escape}; exit 3")));
    let cancelled = submit(&engine, "cancelled", &spec(&format!("{escape}; sleep 300")));
    let mut deadline = spec(&format!("{escape}; sleep 300"));
    deadline.active_deadline_seconds = Some(2);
    let deadline = submit(&engine, "deadline", &deadline);
    wait_for(
        &engine,
        cancelled,
        "Running",
        Duration::from_secs(30),
        |r| r.phase == JobPhase::Running,
    )
    .await;
    // Both escapees exist while the attempt runs.
    let start = Instant::now();
    while marked(dir.path(), cancelled, 1).len() < 4 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            marked(dir.path(), cancelled, 1)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let row = engine.store().get(cancelled).unwrap();
    engine.cancel(row, false).unwrap();
    for (id, phase) in [
        (succeeds, JobPhase::Succeeded),
        (fails, JobPhase::Failed),
        (cancelled, JobPhase::Cancelled),
        (deadline, JobPhase::Failed),
    ] {
        let row = wait_done(&engine, id).await;
        assert_eq!(row.phase, phase, "{}", row.message);
        assert_eq!(
            marked(dir.path(), id, 1),
            Vec::<i32>::new(),
            "{phase}: processes of the attempt outlived it"
        );
        if matches!(phase, JobPhase::Succeeded) {
            assert!(
                row.message
                    .contains("stopped 2 processes the attempt left running"),
                "{}",
                row.message
            );
        }
    }
}

/// The same after a hand-over: the job controller that started the attempt is killed, the
/// detached process is reparented away from it, and the job controller that adopts the attempt
/// still stops it when the attempt ends (found by its environment mark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escapee_is_stopped_after_a_job_controller_hand_over() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let id = submit(
        &engine,
        "handover",
        &spec("setsid -f sleep 304; sleep 3; exit 0"),
    );
    let row = wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let start = Instant::now();
    while marked(dir.path(), id, 1).len() < 3 {
        assert!(start.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(row.controller_pid.unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let row = wait_done(&engine, id).await;
    assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
    assert_eq!(row.attempt, 1, "adopted, not relaunched");
    assert_eq!(row.controller_starts, 2);
    assert_eq!(marked(dir.path(), id, 1), Vec::<i32>::new());
}

/// A workload that ignores SIGTERM and keeps forking detached processes while it is being
/// stopped: every one is caught (each look for processes is repeated while the stop waits), and
/// a stop of processes that exit at once takes no longer than they do (the wrapper's zombie is
/// reaped, not waited on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_forked_while_the_attempt_is_stopped_are_stopped_too() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let forker = submit(
        &engine,
        "forker",
        &spec(
            "trap '' TERM; for i in $(seq 1 40); do setsid -f sleep 306; sleep 0.2; done; sleep 100",
        ),
    );
    let quick = submit(&engine, "quick", &spec("sleep 100"));
    for id in [forker, quick] {
        wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
            r.phase == JobPhase::Running
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in [forker, quick] {
        let row = engine.store().get(id).unwrap();
        engine.cancel(row, false).unwrap();
    }
    let started = Instant::now();
    let row = wait_done(&engine, quick).await;
    assert_eq!(row.phase, JobPhase::Cancelled);
    // `sleep` exits on SIGTERM at once: the stop must not wait out the 2 s grace and then the
    // 10 s after SIGKILL (12 s) for a zombie; 7 s leaves room for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(7),
        "a stop of a process that exits at once took {:?}",
        started.elapsed()
    );
    let row = wait_done(&engine, forker).await;
    assert_eq!(row.phase, JobPhase::Cancelled);
    assert_eq!(marked(dir.path(), forker, 1), Vec::<i32>::new());
}

/// Issue 21, class 8 (stops that re-signal): a stop is SIGTERM once, then SIGKILL after the
/// grace period. A workload whose TERM handler runs a command (`sleep 2`, then saves) gets one
/// SIGTERM: the handler runs once, to its end, and the cancel takes the handler's 2 s, not the
/// grace (5 s) nor more. Every TERM the handler saw is counted in a file over the whole test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_signals_once_and_a_term_handler_runs_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), CAPS);
    cfg.cancel_grace = Duration::from_secs(5);
    let engine = Engine::start(cfg).expect("engine starts");
    let (started, terms, saved) = (
        out.path().join("started"),
        out.path().join("terms"),
        out.path().join("saved"),
    );
    let run = format!(
        "trap 'echo term >> {terms}; sleep 2; echo saved > {saved}; exit 0' TERM\n\
         echo started >> {started}\n\
         while true; do sleep 0.1; done",
        terms = terms.display(),
        saved = saved.display(),
        started = started.display(),
    );
    let id = submit(&engine, "checkpointer", &spec(&run));
    wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
        r.phase == JobPhase::Running
    })
    .await;
    let begin = Instant::now();
    while !started.exists() {
        assert!(begin.elapsed() < Duration::from_secs(10), "never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let row = engine.store().get(id).unwrap();
    let asked = Instant::now();
    engine.cancel(row, false).unwrap();
    let row = wait_done(&engine, id).await;
    let took = asked.elapsed();
    assert_eq!(row.phase, JobPhase::Cancelled, "{}", row.message);
    assert_eq!(
        std::fs::read_to_string(&terms).unwrap(),
        "term\n",
        "the TERM handler ran more than once: the workload was signalled again"
    );
    assert_eq!(std::fs::read_to_string(&saved).unwrap(), "saved\n");
    assert_eq!(std::fs::read_to_string(&started).unwrap(), "started\n");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "the cancel took {took:?}: the handler needs 2 s, the grace is 5 s"
    );
}

/// A tmpfs of `mib` MiB mounted on a fresh directory, unmounted when dropped; None (after
/// saying why) where mounting is not permitted, which fails the test under `CI`.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mib: u32) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path())
            .output();
        match mounted {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            other => {
                let e = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
                    Err(e) => e.to_string(),
                };
                let ci = std::env::var("CI").is_ok_and(|v| !v.is_empty());
                assert!(
                    !ci,
                    "CI is set but a tmpfs cannot be mounted ({e}): this test needs CAP_SYS_ADMIN"
                );
                println!("SKIPPED: mounting a tmpfs needs CAP_SYS_ADMIN ({e})");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes zeros into `fill` until the file system is full.
    fn fill(&self) {
        use std::io::Write as _;
        let mut f = std::fs::File::create(self.path().join("fill")).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while f.write_all(&chunk).is_ok() {}
        let _ = f.sync_all();
        // The last bytes: whatever a partial chunk left.
        while f.write_all(&[0u8; 512]).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.path().join("fill")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .output();
    }
}

/// Issue 21, class 4 (a full disk runs a finished job twice): the state dir is a 16 MiB tmpfs,
/// filled while a local job's workload exits. The exit is held, not lost: the wrapper keeps
/// trying to write its exit file and the job controller its transition, across an operator
/// restart while the disk is still full (the new operator starts, adopts, and says the state
/// dir fails); once space returns the job ends Succeeded on its only attempt, its run slot goes
/// to the job queued behind it, and the workload started once over the whole test.
#[test]
fn a_full_disk_holds_a_finished_jobs_outcome_and_never_runs_it_again() {
    let Some(fs) = Tmpfs::mount(16) else {
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let (starts, go, finished) = (
        out.path().join("starts"),
        out.path().join("go"),
        out.path().join("finished"),
    );
    let run = format!(
        "echo started >> {starts}; while [ ! -e {go} ]; do sleep 0.1; done; echo done >> {finished}",
        starts = starts.display(),
        go = go.display(),
        finished = finished.display(),
    );
    let caps = Caps { launch: 2, run: 1 };
    let first = tokio::runtime::Runtime::new().unwrap();
    let (id, next) = first.block_on(async {
        let engine = start(fs.path(), caps);
        let id = submit(&engine, "holder", &spec(&run));
        let next = submit(&engine, "next", &spec("true"));
        wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
            r.phase == JobPhase::Running
        })
        .await;
        fs.fill();
        assert!(
            engine.probe_state_dir().is_some(),
            "the probe sees the full state dir"
        );
        // The workload exits while nothing can be written.
        std::fs::write(&go, "").unwrap();
        let start = Instant::now();
        while !finished.exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "never finished");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let row = engine.store().get(id).unwrap();
        assert_eq!(row.phase, JobPhase::Running, "{}", row.message);
        (id, next)
    });
    // The operator restarts while the disk is still full.
    first.shutdown_timeout(Duration::from_secs(1));
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let engine = start(fs.path(), caps);
        assert!(engine.probe_state_dir().is_some());
        tokio::time::sleep(Duration::from_secs(3)).await;
        let row = engine.store().get(id).unwrap();
        assert_eq!(row.phase, JobPhase::Running, "{}", row.message);
        fs.free();
        let row = wait_done(&engine, id).await;
        assert_eq!(row.phase, JobPhase::Succeeded, "{}", row.message);
        assert_eq!(
            (row.attempt, row.recovery_count, row.restart_count),
            (1, 0, 0)
        );
        assert_eq!(row.exit_code, Some(0));
        let queued = wait_done(&engine, next).await;
        assert_eq!(queued.phase, JobPhase::Succeeded, "{}", queued.message);
        assert!(engine.probe_state_dir().is_none(), "healthy again");
    });
    assert_eq!(std::fs::read_to_string(&starts).unwrap(), "started\n");
    assert_eq!(std::fs::read_to_string(&finished).unwrap(), "done\n");
}

/// Issue 43, class 3 (a full state dir fails the users' jobs): the state dir is a 30 MiB
/// tmpfs; 20 local jobs each print 30 lines of 1,500 bytes, the middle 10 while another writer
/// has filled the file system. Their output goes through a pipe to a sink the operator owns, so
/// every job ends Succeeded on its only attempt, no restart spent, each workload started once;
/// its log keeps the first and last 10 lines with a note between them saying what was dropped,
/// and its message counts the dropped bytes ("output truncated: the state dir was full").
#[test]
fn a_full_state_dir_drops_and_counts_output_and_fails_no_job() {
    let Some(fs) = Tmpfs::mount(30) else {
        return;
    };
    const JOBS: usize = 20;
    const LINE: usize = 1_501; // 1,500 bytes and the newline
    let out = tempfile::tempdir().unwrap();
    let (full, room) = (out.path().join("full"), out.path().join("room"));
    let wait = |gate: &Path| format!("while [ ! -e {} ]; do sleep 0.1; done", gate.display());
    let lines = |label: &str| {
        format!("i=0; while [ $i -lt 10 ]; do printf '%1500s\\n' {label}$i; i=$((i+1)); done")
    };
    let counted = out.path().join("counted");
    std::fs::create_dir(&counted).unwrap();
    let caps = Caps {
        launch: JOBS,
        run: JOBS,
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let engine = start(fs.path(), caps);
        let ids: Vec<i64> = (0..JOBS)
            .map(|n| {
                let run = format!(
                    "echo $MANAGEDJOB_NAME >> {counted}/starts; {first}; touch {counted}/$MANAGEDJOB_NAME; {w1}; {middle}; {w2}; {last}",
                    counted = counted.display(),
                    first = lines("a"),
                    w1 = wait(&full),
                    middle = lines("b"),
                    w2 = wait(&room),
                    last = lines("c"),
                );
                submit(&engine, &format!("printer-{n:02}"), &spec(&run))
            })
            .collect();
        // Every job printed its first lines (kept) and waits.
        let start = Instant::now();
        while std::fs::read_dir(&counted).unwrap().count() < JOBS + 1 {
            assert!(start.elapsed() < Duration::from_secs(120), "the jobs never all started");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        fs.fill();
        std::fs::write(&full, "").unwrap();
        // The middle lines meet the full state dir; nothing fails meanwhile.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for id in &ids {
            let row = engine.store().get(*id).unwrap();
            assert_eq!(row.phase, JobPhase::Running, "{}: {}", row.name, row.message);
        }
        fs.free();
        std::fs::write(&room, "").unwrap();
        for id in &ids {
            let row = wait_done(&engine, *id).await;
            assert_eq!(row.phase, JobPhase::Succeeded, "{}: {}", row.name, row.message);
            assert_eq!(
                (row.attempt, row.restart_count, row.recovery_count, row.exit_code),
                (1, 0, 0, Some(0)),
                "{}: {}",
                row.name,
                row.message
            );
            let log = std::fs::read_to_string(fs.path().join(format!("logs/{id}.workload.log")))
                .unwrap();
            let count = |label: &str| {
                log.lines()
                    .filter(|l| l.len() == LINE - 1 && l.trim_start().starts_with(label))
                    .count()
            };
            assert_eq!((count("a"), count("c")), (10, 10), "{}: {log}", row.name);
            let note = log
                .lines()
                .find(|l| l.contains("output truncated: the state dir is full"))
                .unwrap_or_else(|| panic!("{}: no note in its log", row.name));
            let dropped: usize = note
                .split_whitespace()
                .find_map(|w| w.parse().ok())
                .expect("the note counts bytes");
            // The filler may have left part of a page (tmpfs allocates 4 KiB pages), which
            // the first writer's lines took.
            assert!(
                (10 * LINE - 4096..=10 * LINE).contains(&dropped),
                "{}: {note}",
                row.name
            );
            assert!(
                row.message.contains(&format!(
                    "output truncated: the state dir was full, {dropped} bytes of output dropped"
                )),
                "{}: {}",
                row.name,
                row.message
            );
        }
    });
    // Each workload started once.
    let starts = std::fs::read_to_string(counted.join("starts")).unwrap();
    let mut names: Vec<&str> = starts.lines().collect();
    names.sort();
    names.dedup();
    assert_eq!(
        (starts.lines().count(), names.len()),
        (JOBS, JOBS),
        "{starts}"
    );
}

/// A job controller's child between fork and exec (its workload's wrapper, for a moment) shows
/// the controller's command line. The world check must never take it for a stray job
/// controller: the wake-up signal (SIGUSR1) would kill the workload it becomes (seen as a
/// recovery during operator restarts, and a job run twice). Job controllers lead their own
/// session; two look-alike processes with the command line of job 1's controller, one leading
/// a session and one not, show which the world check's observation takes.
#[tokio::test]
async fn only_session_leaders_are_taken_for_job_controllers() {
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let state = dir.path().to_string_lossy().into_owned();
    // `sh -c SCRIPT ARGS...` keeps its arguments in its command line, as a job controller has
    // them (`; true`: the shell stays, it does not exec `sleep`). Not python3: on a machine
    // where it is a shim script, it execs through other processes first.
    let look_alike = |leader: bool| {
        let mut cmd = std::process::Command::new("/bin/sh");
        cmd.args([
            "-c",
            "sleep 30; true",
            "job-controller",
            "--state-dir",
            &state,
            "--job-id",
            "1",
        ]);
        if leader {
            use std::os::unix::process::CommandExt as _;
            // SAFETY: setsid is async-signal-safe.
            unsafe {
                cmd.pre_exec(|| {
                    nix::unistd::setsid().map_err(std::io::Error::from)?;
                    Ok(())
                });
            }
        }
        cmd.spawn().unwrap()
    };
    let mut child = look_alike(false);
    let mut leader = look_alike(true);
    // Both have exec'd once their command line shows the arguments.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while [child.id(), leader.id()].iter().any(|pid| {
        !managed_jobs::process::cmdline(*pid as i32)
            .unwrap_or_default()
            .contains(&"job-controller".to_string())
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "look-alikes never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen: Vec<i32> = engine
        .observe_world()
        .unwrap()
        .controllers
        .iter()
        .map(|c| c.pid)
        .collect();
    let _ = child.kill();
    let _ = leader.kill();
    let _ = child.wait();
    let _ = leader.wait();
    assert!(
        !seen.contains(&(child.id() as i32)),
        "a process in another's session was taken for a job controller: {seen:?}"
    );
    assert!(
        seen.contains(&(leader.id() as i32)),
        "a session leader with a job controller's command line was not seen: {seen:?}"
    );
}

/// A wrapper killed alone (not its group): what the attempt started runs on, and must be
/// stopped before the attempt is taken as lost, whether the job is relaunched (a recovery) or
/// ends (a failure rule on `ProcessLost`). Counted over the whole run: the attempt's processes
/// never outlive it, and the next attempt never runs beside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_wrappers_processes_are_stopped_before_the_job_goes_on() {
    use managed_jobs::api::{FailureAction, FailurePolicy, FailureRule};
    let dir = tempfile::tempdir().unwrap();
    let engine = start(dir.path(), CAPS);
    let recovered = ManagedJobSpec {
        run: Some("if [ \"$MANAGEDJOB_ATTEMPT\" = 1 ]; then sleep 300; fi".into()),
        recovery: RecoverySpec {
            max_restarts_on_errors: 0,
            max_recoveries: Some(1),
            max_ignored: None,
        },
        ..Default::default()
    };
    let mut failed = spec("sleep 301; exit 0");
    failed.failure_policy = Some(FailurePolicy {
        rules: vec![FailureRule {
            name: Some("vanished".into()),
            action: FailureAction::FailJob,
            on_reasons: Some(vec!["ProcessLost".into(), "WorkloadVanished".into()]),
            ..Default::default()
        }],
    });
    for (name, spec, phase, attempts) in [
        ("recovered", recovered, JobPhase::Succeeded, 2),
        ("failed", failed, JobPhase::Failed, 1),
    ] {
        let id = submit(&engine, name, &spec);
        let row = wait_for(&engine, id, "Running", Duration::from_secs(30), |r| {
            r.phase == JobPhase::Running
        })
        .await;
        let wrapper = wrapper_pid(&row);
        // The attempt's script runs under the wrapper.
        let start = Instant::now();
        while marked(dir.path(), id, 1).len() < 2 {
            assert!(start.elapsed() < Duration::from_secs(10), "{name}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(wrapper),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        // Over the whole run: attempt 1's processes are gone before attempt 2 is launched.
        loop {
            let row = engine.store().get(id).unwrap();
            if row.launched_attempt >= 2 || row.schedule_state == ScheduleState::Done {
                assert_eq!(
                    marked(dir.path(), id, 1),
                    Vec::<i32>::new(),
                    "{name}: attempt 1's processes outlived it ({:?}, {})",
                    row.phase,
                    row.message
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let row = wait_done(&engine, id).await;
        assert_eq!(row.phase, phase, "{name}: {}", row.message);
        assert_eq!(row.attempt, attempts, "{name}");
        if name == "failed" {
            assert!(row.message.contains("vanished"), "{}", row.message);
            assert!(row.message.contains("ProcessLost"), "{}", row.message);
        }
        assert_eq!(marked(dir.path(), id, 1), Vec::<i32>::new(), "{name}");
    }
}
