//! Kubernetes Events on each ManagedJob for the transitions a user cares about
//! (`docs/design.md`, "Operations"), derived from the store's history of transitions.
//!
//! They are created through the core `v1` Events API with both the new fields (`eventTime`,
//! `action`, `reportingComponent`, `reportingInstance`, `related`) and the ones `kubectl get
//! events` and most dashboards read (`firstTimestamp`, `lastTimestamp`, `count`): the
//! `events.k8s.io/v1` API refuses the latter on a new Event, and without them `kubectl get
//! events --sort-by=.lastTimestamp` could not order ours (issue 43). Both APIs serve the same
//! objects.
//!
//! A job that runs straight through gets two Events, `Launched` and `Succeeded`, like a
//! Kubernetes Job's `SuccessfulCreate` and `Completed`. Admission is not an Event of its own: the
//! `Launched` note says how long the job waited in the queue. Restarts, recoveries, failures and
//! cancellation each get one. Every API write counts against the budget of 4 per straight-through
//! job beyond its create (docs/design.md#operations), so Events are kept to these.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::Client;
use kube::api::{Api, PostParams};

use crate::api::{JobPhase, ScheduleState};
use crate::lifecycle::{HistoryEntry, Reason};

/// Longest `note` (core v1: `message`) the API server accepts on an events.k8s.io/v1 Event (1
/// KiB); kept for ours too.
pub const MAX_NOTE_BYTES: usize = 1024;

/// `Normal` or `Warning`, as events.k8s.io/v1 defines `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something the user may need to act on.
    Warning,
}

impl EventType {
    /// `Normal` or `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One Event to publish about a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobEvent {
    /// `Normal` or `Warning`.
    pub type_: EventType,
    /// CamelCase reason (also used as the action): `Launched`, `Restarting`, `Recovering`,
    /// `Succeeded`, `Failed` or `Cancelled`.
    pub reason: &'static str,
    /// Human-readable note, at most [`MAX_NOTE_BYTES`].
    pub note: String,
    /// When the transition happened (ms since the epoch): the Event's `eventTime`.
    pub at_ms: i64,
    /// The history entry this Event tells of (its id in the store), or None for an Event about
    /// the present (e.g. `StatusWriteFailed`). An Event of a transition has a name derived from
    /// it ([`transition_event_name`]), so publishing it again (after a restart between the
    /// create and its record) is refused as `AlreadyExists` instead of shown twice.
    pub transition: Option<i64>,
}

/// The Events for the transitions of `history` (one job's, ordered by id) whose id is above
/// `after`. Entries at or below `after` were published before; they are only read to know how
/// long the job waited before an admission.
pub fn events_for(history: &[HistoryEntry], after: i64) -> Vec<JobEvent> {
    let mut events = Vec::new();
    // When the job last entered a queue (Waiting, or AliveWaiting for a recovery), and how long
    // it waited there before its last admission.
    let mut queued_at: Option<i64> = None;
    let mut waited_ms: Option<i64> = None;
    for t in history {
        let phase = Some(t.to_phase);
        let entered = t.from_phase != Some(t.to_phase);
        let queue_state = matches!(
            t.to_schedule,
            ScheduleState::Waiting | ScheduleState::AliveWaiting
        );
        if queue_state && t.from_schedule != Some(t.to_schedule) {
            queued_at = Some(t.at_ms);
        }
        if t.reason == Reason::Scheduled {
            waited_ms = queued_at.map(|q| (t.at_ms - q).max(0));
        }
        // A rebuilt row repeats what the object showed: no Event.
        if t.id <= after || t.reason == Reason::Restored {
            continue;
        }
        let event = |type_, reason, note: Cow<'_, str>| JobEvent {
            type_,
            reason,
            note: truncate(&note, MAX_NOTE_BYTES),
            at_ms: t.at_ms,
            transition: Some(t.id),
        };
        match (t.reason, phase) {
            (Reason::Restarting, _) => events.push(event(
                EventType::Warning,
                "Restarting",
                t.message.as_str().into(),
            )),
            (Reason::Recovering, _) => events.push(event(
                EventType::Warning,
                "Recovering",
                t.message.as_str().into(),
            )),
            (Reason::Ignored, _) => events.push(event(
                EventType::Normal,
                "Ignored",
                t.message.as_str().into(),
            )),
            (Reason::PodTerminating, _) => events.push(event(
                EventType::Warning,
                "PodTerminating",
                t.message.as_str().into(),
            )),
            (Reason::TaskSucceeded, _) => events.push(event(
                EventType::Normal,
                "TaskSucceeded",
                t.message.as_str().into(),
            )),
            (Reason::LaunchTimedOut, _) => events.push(event(
                EventType::Warning,
                "LaunchTimedOut",
                t.message.as_str().into(),
            )),
            (Reason::Requeued, _) => events.push(event(
                EventType::Warning,
                "Requeued",
                t.message.as_str().into(),
            )),
            (Reason::Suspended, _) => events.push(event(
                EventType::Normal,
                "Suspended",
                t.message.as_str().into(),
            )),
            (Reason::Resumed, _) => events.push(event(
                EventType::Normal,
                "Resumed",
                t.message.as_str().into(),
            )),
            (Reason::Preempted, _) => events.push(event(
                EventType::Warning,
                "Preempted",
                t.message.as_str().into(),
            )),
            (Reason::ClaimLapsed, _) => events.push(event(
                EventType::Warning,
                "ClaimLapsed",
                t.message.as_str().into(),
            )),
            (_, Some(JobPhase::Running)) if entered => {
                let note = match waited_ms.take() {
                    Some(ms) => format!("{} (waited {} in the queue)", t.message, seconds(ms)),
                    None => t.message.clone(),
                };
                events.push(event(EventType::Normal, "Launched", note.into()))
            }
            (_, Some(JobPhase::Succeeded)) if entered => events.push(event(
                EventType::Normal,
                "Succeeded",
                t.message.as_str().into(),
            )),
            (_, Some(JobPhase::Cancelled)) if entered => events.push(event(
                EventType::Normal,
                "Cancelled",
                t.message.as_str().into(),
            )),
            (_, Some(p)) if entered && p.is_failure() => events.push(event(
                EventType::Warning,
                "Failed",
                t.message.as_str().into(),
            )),
            _ => {}
        }
    }
    events
}

/// `1.2s`, `45ms`, `3m20s`.
fn seconds(ms: i64) -> String {
    match ms {
        ..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        _ => format!("{}m{}s", ms / 60_000, (ms % 60_000) / 1000),
    }
}

/// Longest `reportingController` and `reportingInstance` an events.k8s.io/v1 Event may carry
/// (the API server's validation: 128 characters).
pub const MAX_REPORTING: usize = 128;

/// Longest object name the API accepts (a DNS subdomain).
pub const MAX_NAME: usize = 253;

/// The name of an Event about object `name` at `nanos` since the epoch:
/// `<name>.<nanos, hex>` as client-go's recorder names them, with `name` cut so the whole fits
/// in [`MAX_NAME`] (a ManagedJob's name can itself have 253 characters). The time suffix keeps
/// names unique; a cut name stays a valid subdomain (no trailing `.` or `-`).
pub fn event_name(name: &str, nanos: i128) -> String {
    with_suffix(name, &format!(".{nanos:x}"))
}

/// `name` cut so that `name` + `suffix` fits in [`MAX_NAME`], a valid subdomain.
fn with_suffix(name: &str, suffix: &str) -> String {
    let keep = MAX_NAME - suffix.len();
    let base = truncate(name, keep);
    let base = base.trim_end_matches(['.', '-']);
    format!("{base}{suffix}")
}

/// The name of the Event that tells object `name` of one transition:
/// `<name>.<ns, hex>.<hash, 16 hex>`, where `ns` is the transition's time `at_ms` (ms since the
/// epoch) in nanoseconds, as client-go's recorder names Events by their time, and `hash` the
/// 64-bit FNV-1a hash of the job's uid `job_uid`, the history entry's id `transition` and the
/// Event's `reason`. The same Event always gets the same name; an Event about another object
/// (a Kustomization told of the job's failure) differs by `name` and `reason`; two transitions
/// within one millisecond, or many jobs' failures told to one Kustomization in one millisecond,
/// differ by the hash (a collision needs two equal 64-bit hashes). `name` is cut as in
/// [`event_name`].
pub fn transition_event_name(
    name: &str,
    at_ms: i64,
    job_uid: &str,
    transition: i64,
    reason: &str,
) -> String {
    // FNV-1a, 64 bits (offset basis and prime from the FNV specification, draft-eastlake-fnv).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = job_uid
        .bytes()
        .chain([0])
        .chain(transition.to_le_bytes())
        .chain(reason.bytes());
    for b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let nanos = i128::from(at_ms.max(0)) * 1_000_000;
    with_suffix(name, &format!(".{nanos:x}.{hash:016x}"))
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A reference to the ManagedJob of store row `row` (kind, API version, namespace, name, uid):
/// what an Event about the job is `regarding`.
pub fn job_reference(row: &crate::lifecycle::JobRow) -> ObjectReference {
    ObjectReference {
        api_version: Some("managedjobs.dev/v1alpha1".into()),
        kind: Some("ManagedJob".into()),
        name: Some(row.name.clone()),
        namespace: Some(row.namespace.clone()),
        uid: Some(row.uid.clone()),
        ..Default::default()
    }
}

/// Label kustomize-controller puts on every object it applies: its Kustomization's name.
pub const FLUX_KUSTOMIZATION_NAME: &str = "kustomize.toolkit.fluxcd.io/name";
/// Label kustomize-controller puts on every object it applies: its Kustomization's namespace.
pub const FLUX_KUSTOMIZATION_NAMESPACE: &str = "kustomize.toolkit.fluxcd.io/namespace";

/// The Flux Kustomization that applied a job, from the labels kustomize-controller puts on what
/// it applies; None for a job no Kustomization manages.
pub fn flux_kustomization(
    labels: &std::collections::BTreeMap<String, String>,
) -> Option<ObjectReference> {
    Some(ObjectReference {
        api_version: Some("kustomize.toolkit.fluxcd.io/v1".into()),
        kind: Some("Kustomization".into()),
        name: Some(labels.get(FLUX_KUSTOMIZATION_NAME)?.clone()),
        namespace: Some(labels.get(FLUX_KUSTOMIZATION_NAMESPACE)?.clone()),
        ..Default::default()
    })
}

/// The Event that tells the Kustomization which applied job `namespace/name` why that job
/// failed, or None for any other Event of the job: Flux's own health check names a failed
/// object but never its message (fluxcd/pkg/ssa's wait prints only the kstatus status), so
/// `kubectl describe kustomization` and `flux events` show this Warning `ManagedJobFailed` beside
/// Flux's `HealthCheckFailed`.
pub fn for_kustomization(namespace: &str, name: &str, event: &JobEvent) -> Option<JobEvent> {
    (event.reason == "Failed").then(|| JobEvent {
        type_: EventType::Warning,
        reason: "ManagedJobFailed",
        note: truncate(
            &format!("ManagedJob {namespace}/{name} failed: {}", event.note),
            MAX_NOTE_BYTES,
        ),
        at_ms: event.at_ms,
        transition: event.transition,
    })
}

/// Creates Events with one POST each.
///
/// kube's `Recorder` is not used: it keeps every Event it published for six minutes (to turn a
/// repeated Event into an `EventSeries` update) and scans that whole cache on every publish. Our
/// Events never repeat (each records one transition of one job), so with 10,000 jobs the cache
/// would hold ~20,000 objects for nothing and cost a quadratic scan.
#[derive(Clone)]
pub struct EventPublisher {
    client: Client,
    controller: String,
    instance: String,
}

impl EventPublisher {
    /// `controller` becomes `reportingController`; `instance` (e.g. the Pod name)
    /// `reportingInstance`, defaulting to the controller name. Each is cut to
    /// [`MAX_REPORTING`] bytes, the API's limit (a longer one loses every Event).
    pub fn new(client: Client, controller: &str, instance: Option<String>) -> Self {
        EventPublisher {
            client,
            controller: truncate(controller, MAX_REPORTING),
            instance: truncate(instance.as_deref().unwrap_or(controller), MAX_REPORTING),
        }
    }

    /// The `reportingInstance` this publisher writes.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Creates one Event regarding `regarding`, in its namespace, named
    /// `<name>.<nanoseconds since the epoch, hex>` as client-go's recorder names them (for an
    /// Event of a transition, the name [`transition_event_name`] gives), with the transition's
    /// time as `eventTime`. An Event of a transition that exists already (published before a
    /// restart) is not created again: `Ok(Published::Existed)`.
    ///
    /// # Errors
    /// The API server's refusal (e.g. 403 without `create` on `events`).
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        event: &JobEvent,
    ) -> Result<Published, kube::Error> {
        self.publish_related(regarding, None, event).await
    }

    /// [`EventPublisher::publish`], with `related` as the Event's secondary object (e.g. the job
    /// an Event regarding its Kustomization is about).
    ///
    /// # Errors
    /// The API server's refusal (e.g. 403 without `create` on events in `regarding`'s
    /// namespace).
    pub async fn publish_related(
        &self,
        regarding: &ObjectReference,
        related: Option<&ObjectReference>,
        event: &JobEvent,
    ) -> Result<Published, kube::Error> {
        let now = jiff::Timestamp::now();
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let name = regarding.name.as_deref().unwrap_or(&self.controller);
        // The job is the related object of an Event about its Kustomization.
        let job_uid = related
            .and_then(|r| r.uid.as_deref())
            .or(regarding.uid.as_deref())
            .unwrap_or_default();
        let event_name = match event.transition {
            Some(id) => transition_event_name(name, event.at_ms, job_uid, id, event.reason),
            None => event_name(name, now.as_nanosecond()),
        };
        let at = jiff::Timestamp::from_millisecond(event.at_ms).unwrap_or(now);
        let k8s_event = Event {
            metadata: ObjectMeta {
                name: Some(event_name),
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            event_time: Some(MicroTime(at)),
            // Each Event is one occurrence: first and last seen at the transition's time.
            first_timestamp: Some(Time(at)),
            last_timestamp: Some(Time(at)),
            count: Some(1),
            action: Some(event.reason.to_string()),
            reason: Some(event.reason.to_string()),
            message: Some(event.note.clone()),
            type_: Some(event.type_.as_str().to_string()),
            involved_object: regarding.clone(),
            related: related.cloned(),
            reporting_component: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            source: Some(EventSource {
                component: Some(self.controller.clone()),
                host: None,
            }),
            ..Default::default()
        };
        match Api::<Event>::namespaced(self.client.clone(), namespace)
            .create(&PostParams::default(), &k8s_event)
            .await
        {
            Ok(_) => Ok(Published::Created),
            Err(kube::Error::Api(e))
                if e.code == 409 && e.reason == "AlreadyExists" && event.transition.is_some() =>
            {
                Ok(Published::Existed)
            }
            Err(e) => Err(e),
        }
    }
}

/// What [`EventPublisher::publish`] did with an Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Published {
    /// Created now.
    Created,
    /// An Event of the same transition existed already (published before a restart).
    Existed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_told_to_the_kustomization_that_applied_the_job() {
        let mut labels = std::collections::BTreeMap::new();
        assert_eq!(flux_kustomization(&labels), None);
        labels.insert(FLUX_KUSTOMIZATION_NAME.to_string(), "apps".to_string());
        assert_eq!(flux_kustomization(&labels), None, "both labels are needed");
        labels.insert(
            FLUX_KUSTOMIZATION_NAMESPACE.to_string(),
            "flux-system".to_string(),
        );
        let k = flux_kustomization(&labels).unwrap();
        assert_eq!(
            (k.kind.as_deref(), k.name.as_deref(), k.namespace.as_deref()),
            (Some("Kustomization"), Some("apps"), Some("flux-system"))
        );
        let failed = JobEvent {
            type_: EventType::Warning,
            reason: "Failed",
            note: "attempt 1 run exited with code 3 (ExitCode)".into(),
            at_ms: 7,
            transition: Some(12),
        };
        let told = for_kustomization("ml", "train", &failed).unwrap();
        assert_eq!(
            (told.type_, told.reason, told.at_ms),
            (EventType::Warning, "ManagedJobFailed", 7)
        );
        assert_eq!(
            told.note,
            "ManagedJob ml/train failed: attempt 1 run exited with code 3 (ExitCode)"
        );
        for reason in [
            "Launched",
            "Succeeded",
            "Cancelled",
            "Restarting",
            "Recovering",
        ] {
            let other = JobEvent {
                reason,
                ..failed.clone()
            };
            assert_eq!(for_kustomization("ml", "train", &other), None, "{reason}");
        }
    }

    #[test]
    fn an_event_of_a_transition_is_named_by_it_alone() {
        let at = 1_764_000_000_123;
        let name = |obj, at, uid, id, reason| transition_event_name(obj, at, uid, id, reason);
        let launched = name("train", at, "uid-1", 41, "Launched");
        assert_eq!(
            launched,
            name("train", at, "uid-1", 41, "Launched"),
            "again"
        );
        assert!(launched.starts_with("train."), "{launched}");
        // Named by the transition's time, as client-go's names are by theirs.
        let mut parts = launched.rsplit('.');
        let hash = parts.next().unwrap();
        let nanos = i128::from_str_radix(parts.next().unwrap(), 16).unwrap();
        assert_eq!((nanos, hash.len()), (i128::from(at) * 1_000_000, 16));
        let long = "x".repeat(MAX_NAME);
        let cut = name(&long, at, "uid-1", 41, "Launched");
        assert!(cut.len() <= MAX_NAME && cut.ends_with(hash), "{cut}");
        let others = [
            name("train", at, "uid-1", 42, "Launched"),
            name("train", at, "uid-2", 41, "Launched"),
            name("train", at + 1, "uid-1", 41, "Launched"),
            name("other", at, "uid-1", 41, "Launched"),
            name("train", at, "uid-1", 41, "Succeeded"),
        ];
        for other in others {
            assert_ne!(launched, other);
        }
    }

    #[test]
    fn event_names_always_fit() {
        let long = "a".repeat(253);
        let n = event_name(&long, i128::from(i64::MAX));
        assert!(n.len() <= MAX_NAME, "{}", n.len());
        assert!(n.ends_with(&format!(".{:x}", i64::MAX)));
        assert_ne!(event_name(&long, 1), event_name(&long, 2));
        let dotted = format!("{}.{}", "b".repeat(233), "c".repeat(19));
        let n = event_name(&dotted, 0x1234_5678_9abc_def0);
        assert!(n.len() <= MAX_NAME && !n.contains(".."), "{n}");
        assert_eq!(event_name("hello", 255), "hello.ff");
    }

    fn t(id: i64, at_ms: i64, from: (&str, &str), to: (&str, &str), reason: &str) -> HistoryEntry {
        HistoryEntry {
            id,
            at_ms,
            from_phase: (!from.0.is_empty()).then(|| JobPhase::parse(from.0).expect("a phase")),
            to_phase: JobPhase::parse(to.0).expect("a phase"),
            from_schedule: (!from.1.is_empty())
                .then(|| ScheduleState::parse(from.1).expect("a schedule state")),
            to_schedule: ScheduleState::parse(to.1).expect("a schedule state"),
            reason: Reason::parse(reason).expect("a known reason"),
            message: format!("{reason} message"),
        }
    }

    fn straight_through() -> Vec<HistoryEntry> {
        vec![
            t(1, 1_000, ("", ""), ("Pending", "Waiting"), "Submitted"),
            t(
                2,
                3_500,
                ("Pending", "Waiting"),
                ("Pending", "Launching"),
                "Scheduled",
            ),
            t(
                3,
                3_600,
                ("Pending", "Launching"),
                ("Starting", "Launching"),
                "Starting",
            ),
            t(
                4,
                3_700,
                ("Starting", "Launching"),
                ("Running", "Alive"),
                "Running",
            ),
            t(
                5,
                9_000,
                ("Running", "Alive"),
                ("Succeeded", "Done"),
                "Succeeded",
            ),
        ]
    }

    #[test]
    fn a_straight_through_job_gets_launched_and_succeeded_only() {
        let events = events_for(&straight_through(), 0);
        let reasons: Vec<_> = events.iter().map(|e| e.reason).collect();
        assert_eq!(reasons, ["Launched", "Succeeded"]);
        assert_eq!(events[0].note, "Running message (waited 2.5s in the queue)");
        assert_eq!(events[0].type_, EventType::Normal);
    }

    #[test]
    fn published_entries_are_skipped_but_the_wait_is_still_known() {
        let events = events_for(&straight_through(), 3);
        assert_eq!(events.len(), 2);
        assert!(events[0].note.ends_with("(waited 2.5s in the queue)"));
        assert_eq!(events_for(&straight_through(), 4).len(), 1);
        assert!(events_for(&straight_through(), 5).is_empty());
    }

    #[test]
    fn a_recovery_reports_its_own_wait() {
        let mut h = straight_through();
        h.truncate(4);
        h.extend([
            t(
                5,
                10_000,
                ("Running", "Alive"),
                ("Recovering", "AliveWaiting"),
                "Recovering",
            ),
            t(
                6,
                10_040,
                ("Recovering", "AliveWaiting"),
                ("Recovering", "Launching"),
                "Scheduled",
            ),
            t(
                7,
                10_100,
                ("Recovering", "Launching"),
                ("Running", "Alive"),
                "Running",
            ),
            t(
                8,
                70_100,
                ("Running", "Alive"),
                ("Failed", "Done"),
                "Failed",
            ),
        ]);
        let events = events_for(&h, 4);
        let got: Vec<_> = events.iter().map(|e| (e.type_, e.reason)).collect();
        assert_eq!(
            got,
            [
                (EventType::Warning, "Recovering"),
                (EventType::Normal, "Launched"),
                (EventType::Warning, "Failed"),
            ]
        );
        assert!(events[1].note.ends_with("(waited 40ms in the queue)"));
    }

    #[test]
    fn notes_are_cut_to_the_api_limit_at_a_character_boundary() {
        let mut h = straight_through();
        h[4].message = "é".repeat(MAX_NOTE_BYTES);
        let note = &events_for(&h, 4)[0].note;
        assert!(note.len() <= MAX_NOTE_BYTES && note.len() >= MAX_NOTE_BYTES - 1);
        assert_eq!(seconds(200_000), "3m20s");
    }
}
