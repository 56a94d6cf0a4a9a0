//! Where `managed-jobs queue` and `logs` read from, and which namespace and job they mean:
//! pure decisions, taken before any request is made (docs/tasks/visibility.md, "From your
//! machine").
//!
//! - **Is the visibility API served?** Decided from discovery (`GET /apis`: does the API
//!   server list the group `visibility.managedjobs.dev` with version `v1alpha1`?), never from
//!   the wording of a failed request: an API server that does not serve a group answers a
//!   request under it with a plain-text `404 page not found`, which says nothing a client can
//!   rely on ([`served`]).
//! - **Which source**: an operator's store named with `--state-dir`; else the visibility API
//!   when it is served; else the default state dir of an operator run by hand on this machine
//!   (said on stderr); else an error saying why neither could be read ([`choose`]).
//! - **Which namespace**: kubectl's rule. `-n` names it, `-A` means every one, else the
//!   kubeconfig context's namespace (`default` when it names none, or without a kubeconfig);
//!   a store named with `--state-dir` is the operator's own view: every namespace unless
//!   `-n` ([`scope`]). A job is `NAME` in that namespace, `NAMESPACE/NAME`, or a store's job
//!   id ([`job_ref`]).

use std::path::PathBuf;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIGroupList;

/// The namespace kubectl uses when the kubeconfig's context names none (and without a
/// kubeconfig).
pub const DEFAULT_NAMESPACE: &str = "default";

/// True when `groups` (the API server's `GET /apis`) lists `group` with `version`: the API
/// server then routes requests under `/apis/<group>/<version>` to whatever serves it (for
/// the visibility API, the chart's APIService). A registered APIService is listed whether or
/// not its service answers now; a request then fails with 503, which is the operator's
/// state, not a missing API.
pub fn served(groups: &APIGroupList, group: &str, version: &str) -> bool {
    groups
        .groups
        .iter()
        .filter(|g| g.name == group)
        .flat_map(|g| &g.versions)
        .any(|v| v.version == version)
}

/// What asking the API server's discovery found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Discovery {
    /// No API server to ask: no kubeconfig (nor in-cluster configuration), or discovery
    /// failed (unreachable, refused); the sentence says which.
    NoApiServer(String),
    /// The API server answered discovery and does not serve the visibility API's
    /// group/version (no APIService: the operator was not installed by the chart).
    NotServed,
    /// The API server serves the visibility API.
    Served,
}

/// Where to read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// The visibility API, through the API server, as the caller.
    Api,
    /// An operator's store in `dir`.
    Store {
        /// The state dir.
        dir: PathBuf,
        /// Chosen because the visibility API could not be asked (not given with
        /// `--state-dir`): the sentence to print on stderr, saying why and where.
        note: Option<String>,
    },
}

/// Where `queue` and `logs` read from: `state_dir` (the `--state-dir` flag) when given;
/// else the visibility API when discovery says it is [`Discovery::Served`]; else
/// `default_dir`, the default state dir of an operator run by hand on this machine, when it
/// holds a store (`has_store`; with a note saying why it is read); else an error naming what
/// was missing and what to do.
pub fn choose(
    state_dir: Option<PathBuf>,
    discovery: &Discovery,
    default_dir: PathBuf,
    has_store: bool,
) -> Result<Source, String> {
    if let Some(dir) = state_dir {
        return Ok(Source::Store { dir, note: None });
    }
    let why = match discovery {
        Discovery::Served => return Ok(Source::Api),
        Discovery::NotServed => format!(
            "the API server does not serve the visibility API ({}: no APIService, as the chart installs)",
            crate::visibility::view::API_VERSION
        ),
        Discovery::NoApiServer(why) => format!("no API server to ask ({why})"),
    };
    if has_store {
        Ok(Source::Store {
            note: Some(format!(
                "note: {why}; reading the store of the operator run by hand on this machine, {}",
                default_dir.display()
            )),
            dir: default_dir,
        })
    } else {
        Err(format!(
            "{why}, and no operator keeps a store in the default state dir on this machine \
             ({}): install the chart (docs/tasks/install.md), run `managed-jobs run` here, \
             or name an operator's state dir with --state-dir DIR",
            default_dir.display()
        ))
    }
}

/// Which namespaces an answer shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace (the caller may list ManagedJobs in; from a store, all).
    All,
}

/// The namespaces `queue` shows: `-n NS` (`namespace`), `-A` (`all`), else every namespace
/// for a store named with `--state-dir` (`explicit_store`: the operator's own view), else the
/// kubeconfig context's namespace (`context`), else [`DEFAULT_NAMESPACE`].
pub fn scope(
    namespace: Option<&str>,
    all: bool,
    explicit_store: bool,
    context: Option<&str>,
) -> Scope {
    match namespace {
        Some(ns) => Scope::Namespace(ns.to_string()),
        None if all || explicit_store => Scope::All,
        None => Scope::Namespace(context.unwrap_or(DEFAULT_NAMESPACE).to_string()),
    }
}

/// A job named on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobRef {
    /// A store's job id (`status.jobId`): only an operator's store knows it.
    Id(i64),
    /// A ManagedJob by namespace and name.
    Name {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// The job `arg` names: a job id (digits only), `NAMESPACE/NAME`, or `NAME` in `-n NS`
/// (`namespace`), else in the kubeconfig context's namespace (`context`), else in
/// [`DEFAULT_NAMESPACE`] (kubectl's rule). Errors: an empty part, more than one `/`, or a
/// `NAMESPACE/NAME` whose namespace `-n` contradicts.
pub fn job_ref(
    arg: &str,
    namespace: Option<&str>,
    context: Option<&str>,
) -> Result<JobRef, String> {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_digit()) {
        return match arg.parse() {
            Ok(id) => Ok(JobRef::Id(id)),
            Err(e) => Err(format!("job id {arg}: {e}")),
        };
    }
    let (ns, name) = match arg.split_once('/') {
        Some((ns, name)) => {
            if ns.is_empty() || name.is_empty() || name.contains('/') {
                return Err(format!(
                    "{arg:?} is not a job: give NAME, NAMESPACE/NAME or a job id"
                ));
            }
            if let Some(flag) = namespace
                && flag != ns
            {
                return Err(format!(
                    "{arg} is in namespace {ns}, but -n says {flag}: give one of them"
                ));
            }
            (ns.to_string(), name.to_string())
        }
        None if arg.is_empty() => {
            return Err("no job named: give NAME, NAMESPACE/NAME or a job id".into());
        }
        None => (
            namespace
                .or(context)
                .unwrap_or(DEFAULT_NAMESPACE)
                .to_string(),
            arg.to_string(),
        ),
    };
    Ok(JobRef::Name {
        namespace: ns,
        name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{APIGroup, GroupVersionForDiscovery};

    fn groups(list: &[(&str, &[&str])]) -> APIGroupList {
        APIGroupList {
            groups: list
                .iter()
                .map(|(name, versions)| APIGroup {
                    name: name.to_string(),
                    versions: versions
                        .iter()
                        .map(|v| GroupVersionForDiscovery {
                            group_version: format!("{name}/{v}"),
                            version: v.to_string(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    const G: &str = crate::visibility::GROUP;

    #[test]
    fn served_only_when_discovery_lists_the_group_and_version() {
        // The dev control plane without the chart: no group of ours.
        let bare = groups(&[("apps", &["v1"]), ("managedjobs.dev", &["v1alpha1"])]);
        assert!(!served(&bare, G, "v1alpha1"));
        // The CRDs' group is not the visibility API's.
        assert!(!served(&bare, "managedjobs.dev", "v1beta1"));
        // The chart's APIService.
        let chart = groups(&[("apps", &["v1"]), (G, &["v1alpha1"])]);
        assert!(served(&chart, G, "v1alpha1"));
        // Another version of the group only.
        let other = groups(&[(G, &["v1beta1"])]);
        assert!(!served(&other, G, "v1alpha1"));
        assert!(!served(&APIGroupList::default(), G, "v1alpha1"));
    }

    #[test]
    fn the_source_is_the_flag_then_the_api_then_a_store_on_this_machine() {
        let here = PathBuf::from("/home/u/.local/state/managed-jobs");
        let named = PathBuf::from("/var/lib/managed-jobs");
        // --state-dir wins over everything, without a note.
        for d in [
            Discovery::Served,
            Discovery::NotServed,
            Discovery::NoApiServer("x".into()),
        ] {
            assert_eq!(
                choose(Some(named.clone()), &d, here.clone(), true),
                Ok(Source::Store {
                    dir: named.clone(),
                    note: None
                })
            );
        }
        // Served: the API, even with a store here (the chart's operator is the one asked).
        assert_eq!(
            choose(None, &Discovery::Served, here.clone(), true),
            Ok(Source::Api)
        );
        // Not served (the README's quick start): the store here, saying so.
        match choose(None, &Discovery::NotServed, here.clone(), true) {
            Ok(Source::Store { dir, note: Some(n) }) => {
                assert_eq!(dir, here);
                assert!(n.contains("does not serve the visibility API"), "{n}");
                assert!(n.contains(&here.display().to_string()), "{n}");
            }
            other => panic!("{other:?}"),
        }
        match choose(
            None,
            &Discovery::NoApiServer("no kubeconfig".into()),
            here.clone(),
            true,
        ) {
            Ok(Source::Store { note: Some(n), .. }) => assert!(n.contains("no kubeconfig"), "{n}"),
            other => panic!("{other:?}"),
        }
        // Neither: an error that says what is missing and what to do.
        let e = choose(None, &Discovery::NotServed, here.clone(), false).unwrap_err();
        assert!(
            e.contains("does not serve")
                && e.contains("--state-dir")
                && e.contains("chart")
                && e.contains(&here.display().to_string()),
            "{e}"
        );
        let e = choose(
            None,
            &Discovery::NoApiServer("connection refused".into()),
            here.clone(),
            false,
        )
        .unwrap_err();
        assert!(e.contains("connection refused"), "{e}");
    }

    #[test]
    fn the_namespace_follows_kubectl_and_a_named_store_shows_all() {
        let ns = |s: &str| Scope::Namespace(s.to_string());
        assert_eq!(
            scope(Some("team-a"), false, false, Some("dev")),
            ns("team-a")
        );
        assert_eq!(scope(Some("team-a"), false, true, None), ns("team-a"));
        assert_eq!(scope(None, true, false, Some("dev")), Scope::All);
        assert_eq!(scope(None, false, false, Some("dev")), ns("dev"));
        assert_eq!(scope(None, false, false, None), ns("default"));
        assert_eq!(scope(None, false, true, Some("mj-system")), Scope::All);
    }

    #[test]
    fn a_job_is_a_name_in_the_contexts_namespace_unless_told_otherwise() {
        let name = |ns: &str, n: &str| {
            Ok(JobRef::Name {
                namespace: ns.into(),
                name: n.into(),
            })
        };
        assert_eq!(job_ref("hello", None, Some("dev")), name("dev", "hello"));
        assert_eq!(job_ref("hello", None, None), name("default", "hello"));
        assert_eq!(
            job_ref("hello", Some("team-a"), Some("dev")),
            name("team-a", "hello")
        );
        assert_eq!(
            job_ref("team-a/hello", None, Some("dev")),
            name("team-a", "hello")
        );
        assert_eq!(
            job_ref("team-a/hello", Some("team-a"), None),
            name("team-a", "hello")
        );
        assert_eq!(job_ref("42", None, Some("dev")), Ok(JobRef::Id(42)));
        let e = job_ref("team-a/hello", Some("team-b"), None).unwrap_err();
        assert!(e.contains("team-a") && e.contains("team-b"), "{e}");
        for bad in ["", "/hello", "team-a/", "a/b/c"] {
            assert!(job_ref(bad, None, None).is_err(), "{bad:?}");
        }
        // Too large for an id.
        assert!(job_ref("99999999999999999999", None, None).is_err());
    }
}
