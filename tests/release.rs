//! A release is one version everywhere it is written (docs/upgrades.md, "Making a release"):
//! Cargo.toml, the chart's `version` and `appVersion` (the default image tag), CHANGELOG.md,
//! `managed-jobs --version`. Git tags do not travel with main, so `hack/previous-release` (the
//! pin) and CHANGELOG.md are the record of the releases: each release's heading names its
//! commit once it is cut, and the pin is the last release before main's own version, the one
//! the backward-compatibility tests upgrade from. Main is either a release (its version is
//! CHANGELOG.md's newest, with nothing unreleased) or on its way to the next one (a `-dev`
//! version above the newest release, with an "Unreleased" section): it never calls itself a
//! release it has moved past.

use std::process::Command;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// `(major, minor, patch, released)` of `v` (a leading `v` allowed): `released` is false for a
/// pre-release (`0.3.0-dev`), which orders before the release itself.
fn semver(v: &str) -> (u64, u64, u64, bool) {
    let v = v.trim_start_matches('v');
    let (core, pre) = match v.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (v, None),
    };
    let parts: Vec<u64> = core
        .split('.')
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("{v} is not MAJOR.MINOR.PATCH[-PRE]"))
        })
        .collect();
    assert_eq!(parts.len(), 3, "{v} is not MAJOR.MINOR.PATCH[-PRE]");
    (parts[0], parts[1], parts[2], pre.is_none())
}

/// One release of CHANGELOG.md: `## VERSION (DATE[, commit SHA])`.
#[derive(Debug)]
struct Release {
    version: String,
    /// The abbreviated commit its heading records, once cut.
    commit: Option<String>,
    /// Its section has "### Upgrade notes".
    upgrade_notes: bool,
}

/// CHANGELOG.md: the text of its "Unreleased" section (None without one) and its releases,
/// newest first.
fn changelog() -> (Option<String>, Vec<Release>) {
    let text = read("CHANGELOG.md");
    let mut unreleased = None;
    let mut releases = Vec::new();
    let sections: Vec<&str> = text.split("\n## ").skip(1).collect();
    for section in sections {
        let (heading, body) = section.split_once('\n').unwrap_or((section, ""));
        if heading.trim() == "Unreleased" {
            unreleased = Some(body.to_string());
            continue;
        }
        let (version, rest) = heading.split_once(' ').unwrap_or_else(|| {
            panic!("CHANGELOG.md heading '{heading}': VERSION (DATE[, commit SHA])")
        });
        semver(version);
        let commit = rest
            .split("commit ")
            .nth(1)
            .map(|c| c.trim_end_matches(')').trim().to_string());
        releases.push(Release {
            version: version.to_string(),
            commit,
            upgrade_notes: body.contains("### Upgrade notes"),
        });
    }
    (unreleased, releases)
}

/// The value of `key: value` at the start of a line of `yaml`, unquoted.
fn yaml_field(yaml: &str, key: &str) -> String {
    yaml.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in Chart.yaml"))
        .trim()
        .trim_matches('"')
        .to_string()
}

const VERSION: &str = env!("CARGO_PKG_VERSION");

#[test]
fn the_chart_the_changelog_and_the_binary_carry_the_crates_version() {
    let chart = read("charts/managed-jobs/Chart.yaml");
    assert_eq!(yaml_field(&chart, "version"), VERSION, "Chart.yaml version");
    assert_eq!(
        yaml_field(&chart, "appVersion"),
        VERSION,
        "Chart.yaml appVersion"
    );
    let (unreleased, releases) = changelog();
    let newest = releases.first().expect("CHANGELOG.md has a release");
    // Every release but the first says what upgrading to it takes.
    for r in &releases[..releases.len() - 1] {
        assert!(
            r.upgrade_notes,
            "CHANGELOG.md's {} has no upgrade notes",
            r.version
        );
    }
    if semver(VERSION).3 {
        // A release: CHANGELOG.md's newest, nothing left unreleased.
        assert_eq!(
            newest.version, VERSION,
            "Cargo.toml says the release {VERSION}, CHANGELOG.md's newest is {}",
            newest.version
        );
        assert!(
            unreleased.is_none(),
            "{VERSION} is a release, yet CHANGELOG.md has an Unreleased section: a change after a \
             release moves the version to the next one's -dev"
        );
    } else {
        // On its way to the next release: above the newest one, its changes under Unreleased.
        assert!(
            semver(VERSION) > semver(&newest.version),
            "{VERSION} is not above the newest release {}",
            newest.version
        );
        assert!(
            unreleased.is_some_and(|u| u.contains("### ")),
            "{VERSION} is on its way to a release: CHANGELOG.md needs an Unreleased section"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_managed-jobs"))
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.starts_with(&format!("managed-jobs {VERSION}\n")),
        "--version: {text}"
    );
    assert!(
        text.contains(&format!(
            "store schema step: {}",
            managed_jobs::store::schema::CURRENT_STEP
        )) && text.contains("api: managedjobs.dev/v1alpha1"),
        "--version names the store's step and the API: {text}"
    );
}

#[test]
fn the_previous_release_is_the_last_release_before_this_version() {
    let file = read("hack/previous-release");
    let line = file
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .expect("hack/previous-release names a release");
    let mut words = line.split_whitespace();
    let (tag, commit) = (words.next().unwrap(), words.next().expect("a commit"));
    assert!(tag.starts_with('v'), "{tag}: tags are v<version>");
    assert!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}: a full commit hash"
    );
    let (_, releases) = changelog();
    let last = releases
        .iter()
        .find(|r| semver(&r.version) < semver(VERSION))
        .expect("a release before this version");
    assert_eq!(
        tag,
        format!("v{}", last.version),
        "hack/previous-release pins {tag}; the last release before {VERSION} is {}",
        last.version
    );
    let recorded = last.commit.as_deref().unwrap_or_else(|| {
        panic!(
            "CHANGELOG.md's {} does not record its commit: `## VERSION (DATE, commit SHA)`",
            last.version
        )
    });
    assert!(
        recorded.len() >= 7 && commit.starts_with(recorded),
        "hack/previous-release pins {commit}, CHANGELOG.md records {} at {recorded}",
        last.version
    );
    // A checkout without its history (an exported tree) cannot say more.
    if !root().join(".git").exists() {
        return;
    }
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .arg("-C")
            .arg(root())
            .args(args)
            .output()
            .expect("git");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )
    };
    let (shallow, answer) = git(&["rev-parse", "--is-shallow-repository"]);
    if shallow && answer == "true" {
        return;
    }
    assert!(
        git(&["cat-file", "-e", &format!("{commit}^{{commit}}")]).0,
        "{tag}'s commit {commit} is not in this clone's history"
    );
    // Where the tag was fetched too, it names that commit.
    let (tagged, at) = git(&["rev-parse", "-q", "--verify", &format!("{tag}^{{commit}}")]);
    if tagged {
        assert_eq!(
            at, commit,
            "the tag {tag} is on {at}, hack/previous-release says {commit}"
        );
    }
}

/// A release reads what earlier ones stored: the names of every enum the store, the status, the metrics or the history keep are
/// derived from the variants (strum), in declaration order; pinned here, so that renaming
/// a variant (which would strand what earlier releases stored) fails a test, and each name
/// parses back to its variant and is the one serde writes.
#[test]
fn stored_names_never_change() {
    fn names<T: Copy + PartialEq + std::fmt::Debug>(
        all: &[T],
        name: impl Fn(T) -> &'static str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Vec<&'static str> {
        for &v in all {
            assert_eq!(parse(name(v)), Some(v));
        }
        all.iter().map(|&v| name(v)).collect()
    }
    use managed_jobs::api::{ExecutorKind, FailureAction, JobPhase, ScheduleState, WaitReason};
    use managed_jobs::lifecycle::reason::{FailureReason, Reason};
    use managed_jobs::lifecycle::rules::Verdict;
    use managed_jobs::store::pods::PodState;
    assert_eq!(
        names(JobPhase::ALL, JobPhase::as_str, JobPhase::parse),
        [
            "Pending",
            "Submitted",
            "Starting",
            "Running",
            "Recovering",
            "Succeeded",
            "Cancelling",
            "Suspended",
            "Cancelled",
            "Failed",
            "FailedSetup",
            "FailedPrecheck",
            "FailedNoResource",
            "FailedController"
        ]
    );
    assert_eq!(
        names(
            ScheduleState::ALL,
            ScheduleState::as_str,
            ScheduleState::parse
        ),
        [
            "Inactive",
            "Waiting",
            "Launching",
            "Alive",
            "AliveWaiting",
            "Done"
        ]
    );
    assert_eq!(
        names(ExecutorKind::ALL, ExecutorKind::as_str, ExecutorKind::parse),
        ["local", "pod"]
    );
    assert_eq!(
        names(WaitReason::ALL, WaitReason::as_str, WaitReason::parse),
        [
            "QueueMissing",
            "NamespaceNotAdmitted",
            "QueueMaxRunning",
            "QueueMaxLaunching",
            "ShareUsed",
            "RunCapReached",
            "LaunchCapReached",
            "Queued",
            "Preempted",
            "InsufficientQuota",
            "InsufficientCapacity",
            "PoolMissing"
        ]
    );
    assert_eq!(
        names(FailureAction::ALL, FailureAction::as_str, |s| s
            .parse()
            .ok()),
        ["FailJob", "Restart", "Recover", "Ignore"]
    );
    assert_eq!(
        names(PodState::ALL, PodState::as_str, PodState::parse),
        [
            "pending",
            "unschedulable",
            "running",
            "succeeded",
            "failed",
            "setup-failed",
            "refused",
            "deadline-exceeded",
            "invalid",
            "terminating",
            "lost"
        ]
    );
    assert_eq!(
        names(Reason::ALL, Reason::as_str, Reason::parse),
        [
            "Created",
            "Submitted",
            "KeptFinalStatus",
            "Restored",
            "Scheduled",
            "ControllerStarted",
            "ControllerExited",
            "Starting",
            "Launch",
            "Running",
            "Unschedulable",
            "WaitingToStart",
            "PodTerminating",
            "Stopping",
            "LaunchTimedOut",
            "WaitingForLaunchSlot",
            "Restarting",
            "Recovering",
            "Ignored",
            "TaskSucceeded",
            "Succeeded",
            "Failed",
            "Cancelling",
            "Cancelled",
            "Requeued",
            "Queued",
            "ClaimLapsed",
            "Suspended",
            "Resumed",
            "PreemptionRequested",
            "Preempted"
        ]
    );
    assert_eq!(
        names(
            FailureReason::ALL,
            FailureReason::as_str,
            FailureReason::parse
        ),
        [
            "InvalidSpec",
            "ExecutorDisabled",
            "LaunchFailed",
            "PodRejected",
            "DeadlineExceeded",
            "LaunchTimeout",
            "RecoveryBudgetSpent",
            "ControllerCrashed",
            "ControllerStartFailed",
            "NamespaceTerminating",
            "Unschedulable",
            "CreateFailed",
            "PodNotSeen",
            "FailureRule"
        ]
    );
    assert_eq!(
        names(Verdict::ALL, Verdict::as_str, Verdict::parse),
        ["Succeeded", "FailJob", "Restart", "Recover", "Ignore"]
    );
    // What serde writes (the API, the spec) is the same name; Display too.
    let serde_name = |v: serde_json::Value| v.as_str().unwrap().to_string();
    for &p in JobPhase::ALL {
        assert_eq!(serde_name(serde_json::to_value(p).unwrap()), p.as_str());
        assert_eq!(p.to_string(), p.as_str());
    }
    for &s in ScheduleState::ALL {
        assert_eq!(serde_name(serde_json::to_value(s).unwrap()), s.as_str());
    }
    for &k in ExecutorKind::ALL {
        assert_eq!(serde_name(serde_json::to_value(k).unwrap()), k.as_str());
        assert_eq!(k.to_string(), k.as_str());
    }
    for &a in FailureAction::ALL {
        assert_eq!(serde_name(serde_json::to_value(a).unwrap()), a.as_str());
    }
    assert_eq!(PodState::SetupFailed.to_string(), "setup-failed");
    assert_eq!(Reason::KeptFinalStatus.to_string(), "KeptFinalStatus");
}
