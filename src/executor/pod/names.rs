//! The deterministic names of each attempt's Pods, recorded before they are created so that a
//! retried create adopts instead of duplicating (docs/design.md#the-store-against-the-world).

use crate::lifecycle::JobRow;

/// Longest Pod name we generate: a DNS label, so the Pod's hostname is its name.
pub const MAX_POD_NAME: usize = 63;

/// `<job name>-<job id>-<attempt>-<uid tag>`, with the job name cut so the whole fits in 63
/// characters (e.g. `train-7-1-x7b2kq`). Unique per job object and attempt: the tag
/// ([`uid_tag`]) comes from the object's uid, so two jobs whose names share their first
/// characters and whose ids are equal (two shards, each with its own ids, in one namespace)
/// never want one Pod name. Valid for any legal ManagedJob name.
pub fn pod_name(job_name: &str, uid: &str, job_id: i64, attempt: i32) -> String {
    with_suffix(job_name, &format!("-{job_id}-{attempt}-{}", uid_tag(uid)))
}

/// Characters of a [`uid_tag`]: Kubernetes' `rand.SafeEncodeString` alphabet (no vowels, no
/// look-alikes such as 0/o, 1/l), as in the names of a ReplicaSet's Pods.
pub const TAG_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
/// Characters in a [`uid_tag`]: 27^6, about 3.9 x 10^8 tags.
pub const TAG_LEN: usize = 6;

/// A short, stable tag of an object's uid ([`TAG_LEN`] characters of [`TAG_ALPHABET`] from the
/// uid's 64-bit FNV-1a hash): the part of a Pod name that tells two jobs apart when their
/// names and ids agree.
pub fn uid_tag(uid: &str) -> String {
    // FNV-1a, 64 bits (offset basis and prime from the FNV reference): stable across releases
    // and platforms, as a name recorded before a create must be.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in uid.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..TAG_LEN)
        .map(|_| {
            let c = TAG_ALPHABET[(h % TAG_ALPHABET.len() as u64) as usize] as char;
            h /= TAG_ALPHABET.len() as u64;
            c
        })
        .collect()
}

/// The Pod name of `row`'s `attempt` (the job's count): [`pod_name`] for a job of one task;
/// `<job name>-<job id>-<task index>-<attempt within the task>-<uid tag>` for a pipeline's
/// current task (e.g. `etl-7-1-2-x7b2kq`: the second attempt of task 1, counted from 0), cut to
/// 63 characters the same way.
pub fn attempt_pod_name(row: &JobRow, attempt: i32) -> String {
    if !row.spec.is_pipeline() {
        return pod_name(&row.name, &row.uid, row.id, attempt);
    }
    let task = crate::lifecycle::tasks::task_attempt(row, attempt);
    task_pod_name(row, row.task_index.max(0) as usize, task)
}

/// The Pod name of attempt `task_attempt` (from 1) of task `index` of `row`'s pipeline.
pub fn task_pod_name(row: &JobRow, index: usize, task_attempt: i32) -> String {
    pipeline_pod_name(&row.name, &row.uid, row.id, index, task_attempt)
}

/// `<job name>-<job id>-<task index>-<task attempt>-<uid tag>`, cut to 63 characters as
/// [`pod_name`] is.
pub fn pipeline_pod_name(
    job_name: &str,
    uid: &str,
    job_id: i64,
    index: usize,
    task_attempt: i32,
) -> String {
    with_suffix(
        job_name,
        &format!("-{job_id}-{index}-{task_attempt}-{}", uid_tag(uid)),
    )
}

/// The name an attempt's Pod had before names carried a [`uid_tag`] (operators before issue
/// 21): `<job name>-<job id>-<attempt>`, or `<job name>-<job id>-<task>-<task attempt>`. A Pod
/// so named, created before an upgrade, is still its attempt's (matched by
/// `executor::pod::is_attempt_pod`, deleted by a stop); no new Pod gets such a name.
pub fn legacy_attempt_pod_name(row: &JobRow, attempt: i32) -> String {
    if !row.spec.is_pipeline() {
        return with_suffix(&row.name, &format!("-{}-{attempt}", row.id));
    }
    let task = crate::lifecycle::tasks::task_attempt(row, attempt);
    with_suffix(
        &row.name,
        &format!("-{}-{}-{task}", row.id, row.task_index.max(0)),
    )
}

/// The Pod name of member `rank` of `attempt`: [`attempt_pod_name`] for a job without `nodes`;
/// for a multi-node job (or task) `<job name>-<job id>-<attempt>-<rank>-<uid tag>` (a pipeline:
/// `<job name>-<job id>-<task>-<task attempt>-<rank>-<uid tag>`), cut to 63 characters as
/// [`pod_name`] is: the suffix has at most 7 + 10 + 2 + 2 + 6 + 5 separators characters with a
/// rank below 64, so the job's name keeps at least its first 20.
pub fn member_pod_name(row: &JobRow, attempt: i32, rank: u32) -> String {
    let task = crate::lifecycle::tasks::current_task(row);
    if task.nodes.is_none() {
        return attempt_pod_name(row, attempt);
    }
    let tag = uid_tag(&row.uid);
    if !row.spec.is_pipeline() {
        return with_suffix(&row.name, &format!("-{}-{attempt}-{rank}-{tag}", row.id));
    }
    let task_attempt = crate::lifecycle::tasks::task_attempt(row, attempt);
    task_member_pod_name(row, task.index, task_attempt, rank)
}

/// The Pod name of member `rank` of attempt `task_attempt` (from 1) of task `index` of `row`'s
/// pipeline: [`task_pod_name`] for a task without `nodes`, else
/// `<job name>-<job id>-<task>-<task attempt>-<rank>-<uid tag>`.
pub fn task_member_pod_name(row: &JobRow, index: usize, task_attempt: i32, rank: u32) -> String {
    if row.spec.task(index).nodes.is_none() {
        return task_pod_name(row, index, task_attempt);
    }
    with_suffix(
        &row.name,
        &format!(
            "-{}-{index}-{task_attempt}-{rank}-{}",
            row.id,
            uid_tag(&row.uid)
        ),
    )
}

/// The hostname of member `rank` of a multi-node job, the same in every attempt and task:
/// `<job name>-<rank>`, cut to a DNS label of at most 63 characters. With the job's Service as
/// subdomain ([`service_name`]) it is the member's DNS name, `<hostname>.<service>` in the job's
/// namespace.
pub fn member_hostname(job_name: &str, rank: u32) -> String {
    with_suffix(job_name, &format!("-{rank}"))
}

/// The headless Service of a multi-node job (its members' subdomain): `<job name>-<uid tag>`,
/// cut to 63 characters, starting with a letter (a Service name is a DNS-1035 label: a job
/// named `1train` gets `j1train-<tag>`).
pub fn service_name(job_name: &str, uid: &str) -> String {
    let name = with_suffix(job_name, &format!("-{}", uid_tag(uid)));
    if name.starts_with(|c: char| c.is_ascii_lowercase()) {
        name
    } else {
        with_suffix(&format!("j{job_name}"), &format!("-{}", uid_tag(uid)))
    }
}

/// The PodGroup of `attempt` of a multi-node job (kube-scheduler's gang, one per attempt): the
/// name a Pod of a job without `nodes` would have ([`attempt_pod_name`]).
pub fn pod_group_name(row: &JobRow, attempt: i32) -> String {
    attempt_pod_name(row, attempt)
}

fn with_suffix(job_name: &str, suffix: &str) -> String {
    let keep = MAX_POD_NAME.saturating_sub(suffix.len());
    let mut base: String = job_name.chars().take(keep).collect();
    // A name cut inside a dotted subdomain must still end alphanumerically; dots become dashes
    // so the result is a DNS label.
    base = base.replace('.', "-");
    let base = base.trim_end_matches('-');
    let base = if base.is_empty() { "job" } else { base };
    format!("{base}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, uid: &str, name: &str) -> JobRow {
        let spec = crate::api::ManagedJobSpec {
            template: Some(Default::default()),
            ..Default::default()
        };
        let object = crate::lifecycle::Object {
            uid,
            namespace: "ns",
            name,
            generation: 1,
            spec: &spec,
            created_at_ms: 0,
            resource_version: "",
        };
        JobRow {
            id,
            ..JobRow::new(&object, 0)
        }
    }

    #[test]
    fn a_pipelines_pods_are_named_by_task_and_attempt_within_it() {
        let task = |name: &str| crate::api::TaskSpec {
            name: name.into(),
            template: Some(Default::default()),
            ..Default::default()
        };
        let mut row = row(77, "u", &"x".repeat(253));
        row.spec = crate::api::ManagedJobSpec {
            tasks: vec![task("prepare"), task("train")],
            ..Default::default()
        };
        row.task_index = 1;
        row.task_first_attempt = 3;
        let name = attempt_pod_name(&row, 4);
        assert!(name.len() <= MAX_POD_NAME, "{name}");
        assert!(
            name.ends_with(&format!("-77-1-2-{}", uid_tag(&row.uid))),
            "second attempt of task 1: {name}"
        );
    }

    /// A multi-node job's names fit their limits for the longest job name and every rank, are
    /// unique per rank and attempt, and its hostnames and Service are DNS labels.
    #[test]
    fn member_names_fit_and_are_unique() {
        let mut r = row(123_456_789, "u", &"a".repeat(253));
        r.spec.nodes = Some(crate::api::MAX_NODES);
        let mut seen = std::collections::HashSet::new();
        for attempt in [1, 99_999] {
            for rank in 0..crate::api::MAX_NODES as u32 {
                let n = member_pod_name(&r, attempt, rank);
                assert!(n.len() <= MAX_POD_NAME, "{n}");
                assert!(
                    n.ends_with(&format!("-{attempt}-{rank}-{}", uid_tag("u"))),
                    "{n}"
                );
                assert!(seen.insert(n));
                let h = member_hostname(&r.name, rank);
                assert!(crate::api::is_dns_label(&h), "{h}");
            }
        }
        let s = service_name("1.train", "u");
        assert!(
            s.len() <= 63 && s.starts_with('j') && !s.contains('.'),
            "{s}"
        );
        assert_eq!(
            service_name("train", "u"),
            format!("train-{}", uid_tag("u"))
        );
        r.spec.nodes = None;
        assert_eq!(member_pod_name(&r, 1, 0), attempt_pod_name(&r, 1));
    }

    #[test]
    fn pod_names_fit_and_are_unique() {
        let long = "a".repeat(253);
        let n = pod_name(&long, "u", 123456, 7);
        assert!(n.len() <= MAX_POD_NAME, "{n}");
        assert!(n.ends_with(&format!("-123456-7-{}", uid_tag("u"))), "{n}");
        assert_ne!(pod_name(&long, "u", 1, 1), pod_name(&long, "u", 1, 2));
        let dotted = format!("{}.b", "x".repeat(60));
        let n = pod_name(&dotted, "u", 5, 1);
        assert!(!n.contains('.') && n.len() <= MAX_POD_NAME, "{n}");
        assert_eq!(
            pod_name("hello", "2b3f9c1e-0000-4000-8000-000000000001", 1, 2),
            format!(
                "hello-1-2-{}",
                uid_tag("2b3f9c1e-0000-4000-8000-000000000001")
            )
        );
        let tag = uid_tag("u");
        assert_eq!(
            pod_name(&format!("{}-", "y".repeat(48)), "u", 1, 1),
            format!("{}-1-1-{tag}", "y".repeat(48))
        );
    }

    /// Issue 21, class 6: two jobs whose names share their first 59 characters and whose ids
    /// and attempts are equal (two shards in one namespace) get two Pod names, each still at
    /// most 63 characters and readable (name, id, attempt, tag); the tag is stable.
    #[test]
    fn two_jobs_never_want_one_pod_name() {
        let prefix = "p".repeat(59);
        let (a, b) = (format!("{prefix}-alpha"), format!("{prefix}-beta"));
        let (ua, ub) = (
            "6f1d2c3b-1111-4a5b-9c8d-0123456789ab",
            "6f1d2c3b-2222-4a5b-9c8d-0123456789ab",
        );
        let (na, nb) = (pod_name(&a, ua, 1, 1), pod_name(&b, ub, 1, 1));
        assert_ne!(na, nb);
        assert!(na.len() <= MAX_POD_NAME && nb.len() <= MAX_POD_NAME);
        assert!(na.starts_with("ppp") && na.contains("-1-1-"), "{na}");
        assert_eq!(uid_tag(ua), uid_tag(ua), "stable");
        assert_eq!(uid_tag(ua).len(), TAG_LEN);
        // Distinct uids give distinct tags (a sample of 10,000: no collision).
        let tags: std::collections::HashSet<String> = (0..10_000)
            .map(|i| uid_tag(&format!("00000000-0000-4000-8000-{i:012}")))
            .collect();
        assert_eq!(tags.len(), 10_000);
    }

    /// A Pod created before names carried a uid tag keeps its old name.
    #[test]
    fn a_legacy_name_has_no_tag() {
        assert_eq!(
            legacy_attempt_pod_name(&row(3, "uid-3", "job"), 1),
            "job-3-1"
        );
    }
}
