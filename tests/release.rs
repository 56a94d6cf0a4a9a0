//! A release is one version everywhere it is written (docs/upgrades.md, "A release"): Cargo.toml,
//! the chart's `version` and `appVersion` (the default image tag), CHANGELOG.md's latest
//! release, `managed-jobs --version`; and the previous release that the backward-compatibility
//! tests upgrade from (`hack/previous-release`) is an earlier version whose commit this
//! clone holds.

use std::process::Command;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// `(major, minor, patch)` of `v` (a leading `v` allowed).
fn semver(v: &str) -> (u64, u64, u64) {
    let parts: Vec<u64> = v
        .trim_start_matches('v')
        .split(['.', '-'])
        .take(3)
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("{v} is not MAJOR.MINOR.PATCH"))
        })
        .collect();
    assert_eq!(parts.len(), 3, "{v} is not MAJOR.MINOR.PATCH");
    (parts[0], parts[1], parts[2])
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
    let changelog = read("CHANGELOG.md");
    let latest = changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .find(|h| !h.starts_with("Unreleased"))
        .expect("CHANGELOG.md has a release heading");
    assert!(
        latest.starts_with(&format!("{VERSION} ")),
        "CHANGELOG.md's latest release is '{latest}', Cargo.toml says {VERSION}"
    );
    let section = &changelog[changelog.find(&format!("## {latest}")).unwrap()..];
    assert!(
        section.contains("### Upgrade notes"),
        "CHANGELOG.md's {VERSION} has no upgrade notes"
    );
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
fn the_previous_release_is_an_earlier_version_this_clone_holds() {
    let file = read("hack/previous-release");
    let line = file
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .expect("hack/previous-release names a release");
    let mut words = line.split_whitespace();
    let (tag, commit) = (words.next().unwrap(), words.next().expect("a commit"));
    assert!(tag.starts_with('v'), "{tag}: tags are v<version>");
    assert!(
        semver(tag) < semver(VERSION),
        "the previous release {tag} is not before {VERSION}"
    );
    assert!(
        commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()),
        "{commit}: a full commit hash"
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
