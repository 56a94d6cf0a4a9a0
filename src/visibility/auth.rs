//! Who is asking, and what they may see: Kubernetes decides both.
//!
//! Authentication, in this order:
//! - **Through the API server** (the aggregated `APIService`, as `kubectl get --raw` and the
//!   CLI reach it): the request comes over a TLS connection whose client certificate chains to
//!   the cluster's request-header CA and names an allowed front proxy (both read from the
//!   `kube-system/extension-apiserver-authentication` ConfigMap, as every aggregated API server
//!   does); its `X-Remote-User`, `X-Remote-Uid`, `X-Remote-Group` and `X-Remote-Extra-*`
//!   headers carry the identity the API server authenticated. Those headers are ignored on any
//!   other connection.
//! - **A bearer token** (`Authorization: Bearer ...`, talking to the Service directly): a
//!   TokenReview asks the API server whose token it is.
//! - Nothing else: no credential is 401, a token the API server does not know is 401.
//!
//! Authorization: a SubjectAccessReview per namespace asks whether the caller may `list`
//! `managedjobs.managedjobs.dev` there (in every namespace: the review without a namespace);
//! a job's kept logs also need `get` on `pods/log` there ([`Access`]).
//! Answers, positive and negative, are kept [`CACHE_TTL`]: a revoked permission stops showing
//! data within that.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;

/// How long a TokenReview's or a SubjectAccessReview's answer is kept.
pub const CACHE_TTL: Duration = Duration::from_secs(10);

/// Entries kept at most per cache; a full cache is emptied (a burst of distinct tokens costs
/// reviews, never memory).
pub const CACHE_ENTRIES: usize = 4096;

/// The caller, as Kubernetes authenticated it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    /// Its user name (`system:serviceaccount:NS:NAME` for a ServiceAccount).
    pub username: String,
    /// Its uid, when known.
    pub uid: Option<String>,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its extra attributes (keys lowercased, as the API server sends them).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is refused.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// 401: no credential, or one Kubernetes does not accept.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403: the caller may not list ManagedJobs where it asked.
    #[error("{0}")]
    Forbidden(String),
    /// 503: a review could not be made (the API server is unreachable).
    #[error("{0}")]
    Unavailable(String),
}

/// The front proxy's settings, from `kube-system/extension-apiserver-authentication`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontProxy {
    /// The CA its client certificate chains to (PEM).
    pub client_ca_pem: String,
    /// Common names a front proxy's certificate may carry; empty: any the CA signed.
    pub allowed_names: Vec<String>,
    /// Headers carrying the user name (first present wins).
    pub username_headers: Vec<String>,
    /// Headers carrying the uid.
    pub uid_headers: Vec<String>,
    /// Headers carrying the groups (each may repeat).
    pub group_headers: Vec<String>,
    /// Prefixes of the headers carrying extra attributes.
    pub extra_prefixes: Vec<String>,
}

impl FrontProxy {
    /// Reads the ConfigMap; None when it is absent, has no request-header CA, or cannot be read
    /// (the reason logged): only bearer tokens are accepted then.
    pub async fn discover(client: &kube::Client) -> Option<FrontProxy> {
        use k8s_openapi::api::core::v1::ConfigMap;
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "kube-system");
        let cm = match api.get_opt("extension-apiserver-authentication").await {
            Ok(Some(cm)) => cm,
            Ok(None) => {
                tracing::warn!(
                    "no kube-system/extension-apiserver-authentication ConfigMap: the visibility API accepts bearer tokens only"
                );
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "kube-system/extension-apiserver-authentication could not be read (the operator's Role binding to extension-apiserver-authentication-reader?): the visibility API accepts bearer tokens only");
                return None;
            }
        };
        let data = cm.data.unwrap_or_default();
        let ca = data.get("requestheader-client-ca-file")?.clone();
        let list = |key: &str, default: &[&str]| -> Vec<String> {
            data.get(key)
                .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.iter().map(|s| s.to_string()).collect())
        };
        Some(FrontProxy {
            client_ca_pem: ca,
            allowed_names: list("requestheader-allowed-names", &[]),
            username_headers: list("requestheader-username-headers", &["X-Remote-User"]),
            uid_headers: list("requestheader-uid-headers", &["X-Remote-Uid"]),
            group_headers: list("requestheader-group-headers", &["X-Remote-Group"]),
            extra_prefixes: list("requestheader-extra-headers-prefix", &["X-Remote-Extra-"]),
        })
    }

    /// True when a verified client certificate of common name `cn` is a front proxy.
    pub fn allows(&self, cn: &str) -> bool {
        self.allowed_names.is_empty() || self.allowed_names.iter().any(|n| n == cn)
    }

    /// The caller the front proxy's headers name; None without a user name header.
    pub fn caller(&self, headers: &http::HeaderMap) -> Option<Caller> {
        let first = |names: &[String]| {
            names
                .iter()
                .find_map(|h| headers.get(h.as_str())?.to_str().ok().map(str::to_string))
        };
        let username = first(&self.username_headers).filter(|u| !u.is_empty())?;
        let groups = self
            .group_headers
            .iter()
            .flat_map(|h| headers.get_all(h.as_str()))
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (name, value) in headers {
            for prefix in &self.extra_prefixes {
                let prefix = prefix.to_ascii_lowercase();
                if let Some(key) = name.as_str().strip_prefix(&prefix)
                    && let Ok(v) = value.to_str()
                {
                    // Keys are percent-encoded by the API server; values as sent.
                    extra
                        .entry(percent_decode(key))
                        .or_default()
                        .push(v.to_string());
                }
            }
        }
        Some(Caller {
            username,
            uid: first(&self.uid_headers),
            groups,
            extra,
        })
    }
}

/// Decodes `%XX` escapes (the API server escapes extra keys so that any may travel as a header
/// name); anything malformed is kept as it is.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let escaped = (b[i] == b'%')
            .then(|| b.get(i + 1..i + 3))
            .flatten()
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match escaped {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Answers of SubjectAccessReviews: per (caller, namespace, access), when and whether allowed.
type AccessCache = HashMap<(Caller, String, Access), (Instant, bool)>;

/// Reviews of tokens and of access, cached.
pub struct Reviewer {
    client: kube::Client,
    tokens: Mutex<HashMap<String, (Instant, Option<Caller>)>>,
    access: Mutex<AccessCache>,
}

impl Reviewer {
    /// Reviews through `client` (the operator's identity: it needs `create` on
    /// `tokenreviews` and `subjectaccessreviews`).
    pub fn new(client: kube::Client) -> Reviewer {
        Reviewer {
            client,
            tokens: Mutex::default(),
            access: Mutex::default(),
        }
    }

    /// Whose `token` is (a TokenReview, cached); 401 when the API server does not know it.
    pub async fn token(&self, token: &str) -> Result<Caller, Refused> {
        if let Some((at, known)) = self.tokens.lock().expect("cache").get(token).cloned()
            && at.elapsed() < CACHE_TTL
        {
            return known.ok_or_else(|| Refused::Unauthenticated("the token is not valid".into()));
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refused::Unavailable(format!("TokenReview failed: {e}")))?;
        let status = answer.status.unwrap_or_default();
        let caller = (status.authenticated == Some(true))
            .then(|| caller_of(status.user.unwrap_or_default()));
        let mut cache = self.tokens.lock().expect("cache");
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(token.to_string(), (Instant::now(), caller.clone()));
        caller.ok_or_else(|| {
            Refused::Unauthenticated(format!(
                "the token is not valid{}",
                status.error.map(|e| format!(": {e}")).unwrap_or_default()
            ))
        })
    }

    /// Whether `caller` may do `access` in `namespace` ("": in every namespace), by a
    /// SubjectAccessReview (cached [`CACHE_TTL`], allowed or not).
    pub async fn may(
        &self,
        caller: &Caller,
        namespace: &str,
        access: Access,
    ) -> Result<bool, Refused> {
        let key = (caller.clone(), namespace.to_string(), access);
        if let Some((at, allowed)) = self.access.lock().expect("cache").get(&key).copied()
            && at.elapsed() < CACHE_TTL
        {
            return Ok(allowed);
        }
        let (group, resource, subresource, verb) = access.attributes();
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(caller.username.clone()),
                uid: caller.uid.clone(),
                groups: Some(caller.groups.clone()),
                extra: (!caller.extra.is_empty()).then(|| caller.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.into()),
                    resource: Some(resource.into()),
                    subresource: subresource.map(str::to_string),
                    verb: Some(verb.into()),
                    namespace: (!namespace.is_empty()).then(|| namespace.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Refused::Unavailable(format!("SubjectAccessReview failed: {e}")))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let mut cache = self.access.lock().expect("cache");
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, (Instant::now(), allowed));
        Ok(allowed)
    }
}

/// What a caller asks to do, as a SubjectAccessReview names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Access {
    /// `list` `managedjobs.managedjobs.dev`: every answer about a namespace's jobs needs it.
    ListManagedJobs,
    /// `get` `pods/log`: a job's kept logs need it too (the output of its workload, which a
    /// user who may only list jobs does not read from their Pods either).
    ReadPodLogs,
}

impl Access {
    /// (API group, resource, subresource, verb).
    pub fn attributes(
        self,
    ) -> (
        &'static str,
        &'static str,
        Option<&'static str>,
        &'static str,
    ) {
        match self {
            Access::ListManagedJobs => (crate::api::GROUP, "managedjobs", None, "list"),
            Access::ReadPodLogs => ("", "pods", Some("log"), "get"),
        }
    }

    /// How a refusal says what was missing, e.g. `list managedjobs.managedjobs.dev`.
    pub fn describe(self) -> String {
        let (group, resource, sub, verb) = self.attributes();
        let resource = match sub {
            Some(sub) => format!("{resource}/{sub}"),
            None => resource.to_string(),
        };
        if group.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}.{group}")
        }
    }
}

fn caller_of(u: UserInfo) -> Caller {
    Caller {
        username: u.username.unwrap_or_default(),
        uid: u.uid,
        groups: u.groups.unwrap_or_default(),
        extra: u.extra.unwrap_or_default().into_iter().collect(),
    }
}

/// The bearer token of `headers`, if any.
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let v = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> FrontProxy {
        FrontProxy {
            client_ca_pem: String::new(),
            allowed_names: vec!["front-proxy-client".into()],
            username_headers: vec!["X-Remote-User".into()],
            uid_headers: vec!["X-Remote-Uid".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_prefixes: vec!["X-Remote-Extra-".into()],
        }
    }

    #[test]
    fn the_front_proxy_headers_name_the_caller() {
        let mut h = http::HeaderMap::new();
        h.insert("x-remote-user", "alice".parse().unwrap());
        h.append("x-remote-group", "team-a".parse().unwrap());
        h.append("x-remote-group", "system:authenticated".parse().unwrap());
        h.insert("x-remote-extra-scopes%2fa", "s1".parse().unwrap());
        let c = proxy().caller(&h).unwrap();
        assert_eq!(c.username, "alice");
        assert_eq!(c.groups, vec!["team-a", "system:authenticated"]);
        assert_eq!(c.extra.get("scopes/a"), Some(&vec!["s1".to_string()]));
        assert!(proxy().caller(&http::HeaderMap::new()).is_none());
    }

    #[test]
    fn only_allowed_names_are_front_proxies() {
        assert!(proxy().allows("front-proxy-client"));
        assert!(!proxy().allows("admin"));
        let any = FrontProxy {
            allowed_names: vec![],
            ..proxy()
        };
        assert!(any.allows("whoever"));
    }

    #[test]
    fn each_access_names_what_a_role_grants() {
        assert_eq!(
            Access::ListManagedJobs.describe(),
            "list managedjobs.managedjobs.dev"
        );
        assert_eq!(Access::ReadPodLogs.describe(), "get pods/log");
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let mut h = http::HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(http::header::AUTHORIZATION, "bearer  ".parse().unwrap());
        assert_eq!(bearer(&h), None);
    }
}
