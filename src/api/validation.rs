//! The limits of a spec and the checks the operator makes itself ([`validate_spec`]): the API
//! server enforces the same through the CRD's schema ([`super::schema`]), so these matter only
//! when a CRD without our rules was installed.

use super::failure::{
    ExitCodeOperator, FailurePolicy, MAX_FAILURE_RULES, MAX_RULE_EXIT_CODES, MAX_RULE_ITEMS,
    MAX_TASK_FAILURE_RULES,
};
use super::types::{ManagedJobSpec, TaskView};

/// Longest `spec.terminationGracePeriodSeconds`: a day. Every wait is bounded (a cancel or a
/// `kubectl delete mj` must end), and a Pod delete takes the grace as a 32-bit count.
pub const MAX_GRACE_SECONDS: i64 = 86_400;
/// Most nodes of a multi-node job (`spec.nodes`, a task's `nodes`). The distributed jobs this
/// serves run 2 to 64 workers; each attempt writes one Pod per node, and
/// `MANAGEDJOB_NODE_ADDRS` lists them all (64 names of at most 127 characters: about 8 KiB, far
/// below a variable's 128 KiB). A rank has at most 2 digits, which the Pod name leaves room for
/// (`executor::pod::names`).
pub const MAX_NODES: i32 = 64;
/// `MASTER_PORT` when the template's containers set none: torchrun's default
/// (`--master-port 29500`).
pub const DEFAULT_MASTER_PORT: i32 = 29500;

/// Most tasks in one pipeline (`spec.tasks`).
pub const MAX_TASKS: usize = 32;
/// Largest accepted `run`/`setup` script, in bytes (keeps CEL cost estimates bounded).
pub const MAX_SCRIPT_BYTES: usize = 65_536;

/// Most bytes of one `spec.env` value (the kernel takes at most 128 KiB per environment string,
/// MAX_ARG_STRLEN; a value of 32,768 characters may be 4 times as many bytes).
pub const MAX_ENV_VALUE_BYTES: usize = 32_768;

/// Most variables in `spec.env`.
pub const MAX_ENV_VARS: usize = 256;

/// Most variables in one task's `spec.tasks[].env` (merged over `spec.env`). Lower than
/// [`MAX_ENV_VARS`]: the API server bounds the estimated cost of each CEL rule of a CRD (by the
/// largest input the schema allows), and a task's rules count once per possible task (32).
pub const MAX_TASK_ENV_VARS: usize = 32;

/// Most bytes of one `spec.tasks[].env` value (see [`MAX_TASK_ENV_VARS`] for why it is lower
/// than [`MAX_ENV_VALUE_BYTES`]); a large value shared by every task belongs in `spec.env`.
pub const MAX_TASK_ENV_VALUE_BYTES: usize = 8_192;

/// Most bytes of `spec.env` names and values in all. Each value may hold 32 KiB, but 256 of them
/// would make an 8 MiB object: past etcd's 1.5 MiB limit on a stored object (so the job's status
/// could never be written) and Linux's 2 MiB default `ARG_MAX` for a process' argv and
/// environment together (so it could never start). 256 KiB leaves room for the scripts, the
/// status and the finalizer. Enforced by a CEL rule at the API, and by [`validate_spec`].
pub const MAX_ENV_BYTES: usize = 262_144;
/// The largest object etcd stores: its default `--max-request-bytes`, 1.5 MiB, which
/// kube-apiserver does not change (a write above it fails `etcdserver: request is too large`).
/// Everything of a ManagedJob lives in it: its spec, its metadata (annotations alone may take
/// 256 KiB, and `kubectl apply`'s copy of the object counts there), its status, and the
/// `deletionTimestamp` a deletion writes.
pub const ETCD_OBJECT_BYTES: usize = 1_572_864;

/// The largest status the operator writes, in bytes of JSON: 32 task records and the job's
/// conditions, each message at most [`MAX_STATUS_MESSAGE_BYTES`], and 10 attempts
/// (`status::tests` builds the largest: 93,714 bytes).
pub const MAX_STATUS_BYTES: usize = 131_072;

/// The longest message the operator keeps in a status (`status.message`, each condition's and
/// each task record's): longer ones (a kubelet's or an admission webhook's words quoted) are
/// cut there, so that the largest status stays within [`MAX_STATUS_BYTES`].
pub const MAX_STATUS_MESSAGE_BYTES: usize = 2_048;

/// What an object's metadata and JSON structure may take beside its spec's scripts and
/// environment: all of its annotations (256 KiB, the API server's own limit), its name,
/// labels, finalizer and managedFields (16 KiB), and the spec's keys, failure rules and the
/// escaping of its scripts (64 KiB).
pub const METADATA_ALLOWANCE_BYTES: usize = 262_144 + 16_384 + 65_536;

/// Most characters of scripts and environment in one ManagedJob, across `spec.run`,
/// `spec.setup`, `spec.env` and every task's `run`, `setup` and `env` (names and values): with
/// the largest status and its metadata an object must fit in etcd ([`ETCD_OBJECT_BYTES`]), or
/// its status could never be written, nor its deletion (issue 30: 11 tasks of a 63,990-byte
/// `run` and a 64,000-byte `setup` with 163,136 bytes of environment kept every per-field bound
/// and could neither show its status nor be deleted). 1 MiB:
/// `ETCD_OBJECT_BYTES - METADATA_ALLOWANCE_BYTES - MAX_STATUS_BYTES` leaves 64 KiB more, for
/// characters that take several bytes. Counted in characters (what a CEL rule can count
/// cheaply); a pod template's size is not bounded here (the schema keeps its fields open):
/// a status that would not fit is written in its minimal form ([`crate::status`]).
pub const MAX_SPEC_PAYLOAD: usize = 1_048_576;

const _: () = assert!(
    MAX_SPEC_PAYLOAD + METADATA_ALLOWANCE_BYTES + MAX_STATUS_BYTES < ETCD_OBJECT_BYTES,
    "a largest spec, its metadata and its largest status must fit in etcd"
);

/// The characters of scripts and environment `spec` holds ([`MAX_SPEC_PAYLOAD`] bounds them):
/// `run`, `setup` and `env` (names and values), the job's and every task's.
pub fn spec_payload(spec: &ManagedJobSpec) -> usize {
    let chars = |s: &Option<String>| s.as_deref().map_or(0, |s| s.chars().count());
    let env = |env: &[super::types::EnvVar]| -> usize {
        env.iter()
            .map(|e| e.name.chars().count() + e.value.chars().count())
            .sum()
    };
    chars(&spec.run)
        + chars(&spec.setup)
        + env(&spec.env)
        + spec
            .tasks
            .iter()
            .map(|t| chars(&t.run) + chars(&t.setup) + env(&t.env))
            .sum::<usize>()
}

/// What the API (and [`validate_spec`]) says of a spec holding `payload` characters of scripts
/// and environment, more than [`MAX_SPEC_PAYLOAD`].
pub fn spec_payload_message(payload: usize) -> String {
    format!(
        "spec holds {payload} characters of scripts and environment, more than {MAX_SPEC_PAYLOAD}, counted over spec.run, spec.setup, spec.env and every task's run, setup and env: with its status and metadata the object would not fit in etcd ({ETCD_OBJECT_BYTES} bytes), so its status could never be written, nor its deletion"
    )
}

/// Most containers, and most init containers, in a pod template: the CEL rule that each
/// failure rule's `onExitCodes.containerName` names one of them is costed from this bound.
pub const MAX_POD_CONTAINERS: usize = 64;

/// Checks a multi-node job's (or task's) `nodes` at `field`: within 1..[`MAX_NODES`], and only
/// with a pod template (`pods`).
fn check_nodes(nodes: Option<i32>, pods: bool, field: &str) -> Result<(), String> {
    if let Some(n) = nodes {
        if !(1..=MAX_NODES).contains(&n) {
            return Err(format!("{field}.nodes {n} is outside 1..{MAX_NODES}"));
        }
        if !pods {
            return Err(format!(
                "{field}.nodes needs a pod template: a local job runs on the operator's node only"
            ));
        }
    }
    Ok(())
}

/// Validates what the API schema cannot: returns a sentence naming the field, or `Ok(())`.
///
/// Used when the CRD was installed without our rules (e.g. an older copy): the operator then fails
/// the one job with FailedPrecheck instead of acting on bad input.
pub fn validate_spec(spec: &ManagedJobSpec) -> Result<(), String> {
    let set = [
        spec.run.is_some(),
        spec.template.is_some(),
        spec.is_pipeline(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err("exactly one of spec.run, spec.template and spec.tasks must be set".into());
    }
    if !(-1000..=1000).contains(&spec.priority) {
        return Err(format!(
            "spec.priority {} is outside -1000..1000",
            spec.priority
        ));
    }
    if let Some(queue) = &spec.queue
        && !super::queue::is_queue_name(queue)
    {
        return Err(format!(
            "spec.queue {queue:?} is not a queue name (lowercase letters, digits, '-' and '.', at most 253 characters)"
        ));
    }
    if spec.active_deadline_seconds.is_some_and(|s| s < 1) {
        return Err("spec.activeDeadlineSeconds must be >= 1".into());
    }
    if spec.launch_timeout_seconds.is_some_and(|s| s < 1) {
        return Err("spec.launchTimeoutSeconds must be >= 1".into());
    }
    if spec
        .termination_grace_period_seconds
        .is_some_and(|s| !(0..=MAX_GRACE_SECONDS).contains(&s))
    {
        return Err(format!(
            "spec.terminationGracePeriodSeconds must be within 0..{MAX_GRACE_SECONDS}"
        ));
    }
    let payload = spec_payload(spec);
    if payload > MAX_SPEC_PAYLOAD {
        return Err(spec_payload_message(payload));
    }
    check_nodes(spec.nodes, spec.template.is_some(), "spec")?;
    if spec.resources.is_some() && spec.run.is_none() && !spec.tasks.iter().all(|t| t.run.is_some())
    {
        return Err(
            "spec.resources is for local jobs: a pod job's resources are its template's requests"
                .into(),
        );
    }
    if spec.is_pipeline() {
        if spec.setup.is_some() {
            return Err(
                "spec.setup cannot be set with spec.tasks: give each task its own setup".into(),
            );
        }
        if spec.tasks.len() > MAX_TASKS {
            return Err(format!(
                "spec.tasks holds {} tasks, more than {MAX_TASKS}",
                spec.tasks.len()
            ));
        }
        let pods = spec.tasks.iter().filter(|t| t.template.is_some()).count();
        if pods != 0 && pods != spec.tasks.len() {
            return Err("spec.tasks must all use one executor: every task sets run (local) or every task sets template (pod)".into());
        }
        for (i, task) in spec.tasks.iter().enumerate() {
            if !is_dns_label(&task.name) {
                return Err(format!(
                    "spec.tasks[{i}].name {:?} is not a DNS label (lowercase letters, digits and '-', at most 63 characters)",
                    task.name
                ));
            }
            if spec.tasks[..i].iter().any(|t| t.name == task.name) {
                return Err(format!(
                    "spec.tasks[{i}].name {:?} is used by an earlier task",
                    task.name
                ));
            }
            if task.run.is_some() == task.template.is_some() {
                return Err(format!(
                    "spec.tasks[{i}] must set exactly one of run and template"
                ));
            }
            check_nodes(
                task.nodes,
                task.template.is_some(),
                &format!("spec.tasks[{i}]"),
            )?;
            if task.setup.is_some() && task.run.is_none() {
                return Err(format!(
                    "spec.tasks[{i}].setup runs before run (the local executor); a task with a template has no setup"
                ));
            }
            if task.env.len() > MAX_TASK_ENV_VARS {
                return Err(format!(
                    "spec.tasks[{i}].env holds {} variables, more than {MAX_TASK_ENV_VARS}",
                    task.env.len()
                ));
            }
            if let Some(var) = task
                .env
                .iter()
                .find(|v| v.value.len() > MAX_TASK_ENV_VALUE_BYTES)
            {
                return Err(format!(
                    "spec.tasks[{i}].env value of {} holds {} bytes, more than {MAX_TASK_ENV_VALUE_BYTES}",
                    var.name,
                    var.value.len()
                ));
            }
            if task.active_deadline_seconds.is_some_and(|s| s < 1) {
                return Err(format!(
                    "spec.tasks[{i}].activeDeadlineSeconds must be >= 1"
                ));
            }
            if let Some(policy) = &task.failure_policy {
                validate_policy(
                    policy,
                    &format!("spec.tasks[{i}].failurePolicy"),
                    MAX_TASK_FAILURE_RULES,
                )?;
            }
            let names = task.failure_policy.is_some() || task.template.is_none();
            validate_task(&spec.task(i), &format!("spec.tasks[{i}]"), names)?;
        }
        if let Some(policy) = &spec.failure_policy {
            validate_policy(policy, "spec.failurePolicy", MAX_FAILURE_RULES)?;
            // A pod pipeline's job-level rules apply to each task without its own: a name
            // must be a container (or init container) of some task's template.
            let pods: Vec<_> = spec
                .tasks
                .iter()
                .filter_map(|t| t.template.as_ref()?.spec.as_ref())
                .collect();
            for (i, rule) in policy.rules.iter().enumerate() {
                if let Some(name) = rule
                    .on_exit_codes
                    .as_ref()
                    .and_then(|o| o.container_name.as_ref())
                    && !pods.is_empty()
                    && !pods.iter().any(|pod| {
                        pod.containers
                            .iter()
                            .chain(pod.init_containers.iter().flatten())
                            .any(|c| c.name == *name)
                    })
                {
                    return Err(format!(
                        "spec.failurePolicy.rules[{i}].onExitCodes.containerName {name:?} names no container or initContainer of any task template (spec.tasks[].template)"
                    ));
                }
            }
        }
        return Ok(());
    }
    if let Some(policy) = &spec.failure_policy {
        validate_policy(policy, "spec.failurePolicy", MAX_FAILURE_RULES)?;
    }
    validate_task(&spec.task(0), "spec", true)
}

/// The checks of a failure policy at `at` (the API's CEL rules, [`super::schema`]): 1 to
/// `max_rules` rules, each matching on exactly one of exit codes, Pod conditions and reasons;
/// exit codes 0 to 255, no 0 listed `In`; no code listed `In` by two rules for the same
/// container, nor by a rule for any container and a later one; names unique DNS labels other
/// than `default`.
pub fn validate_policy(policy: &FailurePolicy, at: &str, max_rules: usize) -> Result<(), String> {
    if policy.rules.is_empty() || policy.rules.len() > max_rules {
        return Err(format!(
            "{at}.rules holds {} rules; 1 to {max_rules} are allowed",
            policy.rules.len()
        ));
    }
    for (i, rule) in policy.rules.iter().enumerate() {
        let field = format!("{at}.rules[{i}]");
        let matchers = usize::from(rule.on_exit_codes.is_some())
            + usize::from(rule.on_pod_conditions.is_some())
            + usize::from(rule.on_reasons.is_some());
        if matchers != 1 {
            return Err(format!(
                "{field} must set exactly one of onExitCodes, onPodConditions and onReasons"
            ));
        }
        if let Some(name) = &rule.name {
            if !is_dns_label(name) || name == "default" {
                return Err(format!(
                    "{field}.name {name:?} must be a DNS label other than \"default\""
                ));
            }
            if policy.rules[..i]
                .iter()
                .any(|r| r.name.as_ref() == Some(name))
            {
                return Err(format!("{field}.name {name:?} is used by an earlier rule"));
            }
        }
        if let Some(on) = &rule.on_exit_codes {
            if on.values.is_empty() || on.values.len() > MAX_RULE_EXIT_CODES {
                return Err(format!(
                    "{field}.onExitCodes.values must hold 1 to {MAX_RULE_EXIT_CODES} codes"
                ));
            }
            if on.operator == ExitCodeOperator::In && on.values.contains(&0) {
                return Err(format!(
                    "{field}.onExitCodes.values: exit code 0 is a success and never matches a rule; it cannot be listed with operator In"
                ));
            }
            if let Some(code) = on.values.iter().find(|c| !(0..=255).contains(*c)) {
                return Err(format!(
                    "{field}.onExitCodes.values: {code} is not an exit code (0 to 255)"
                ));
            }
            if on
                .container_name
                .as_deref()
                .is_some_and(|c| !is_dns_label(c))
            {
                return Err(format!(
                    "{field}.onExitCodes.containerName must be a DNS label"
                ));
            }
            if on.operator == ExitCodeOperator::In {
                let earlier = policy.rules[..i]
                    .iter()
                    .enumerate()
                    .filter_map(|(j, r)| Some((j, r.on_exit_codes.as_ref()?)));
                // An earlier rule for the same container, or for any container, matches the
                // code first: this rule never would.
                for (j, other) in earlier.filter(|(_, o)| {
                    o.operator == ExitCodeOperator::In
                        && (o.container_name == on.container_name || o.container_name.is_none())
                }) {
                    if let Some(code) = on.values.iter().find(|c| other.values.contains(c)) {
                        let whose = if other.container_name == on.container_name {
                            "the same container"
                        } else {
                            "any container (it has no containerName)"
                        };
                        return Err(format!(
                            "{field}.onExitCodes.values: exit code {code} is listed with operator In by {at}.rules[{j}] for {whose}, which matches first: this rule would never match it"
                        ));
                    }
                }
            }
        }
        let items = rule
            .on_pod_conditions
            .as_ref()
            .map_or(1, Vec::len)
            .min(rule.on_reasons.as_ref().map_or(1, Vec::len));
        let most = rule
            .on_pod_conditions
            .as_ref()
            .map_or(0, Vec::len)
            .max(rule.on_reasons.as_ref().map_or(0, Vec::len));
        if items == 0 || most > MAX_RULE_ITEMS {
            return Err(format!(
                "{field} lists 1 to {MAX_RULE_ITEMS} Pod conditions or reasons"
            ));
        }
    }
    Ok(())
}

/// The checks of one task (or of a job of one task), naming fields under `at` (`spec` or
/// `spec.tasks[i]`).
/// `names`: whether to check the containerName of the task's rules against its own parts (not
/// for a pod pipeline's task under the job's rules: those name any task's containers).
fn validate_task(task: &TaskView<'_>, at: &str, names: bool) -> Result<(), String> {
    if task.run.is_some_and(str::is_empty) {
        return Err(format!("{at}.run must not be empty"));
    }
    if task.recovery.max_restarts_on_errors < 0 {
        return Err(format!("{at}.recovery.maxRestartsOnErrors must be >= 0"));
    }
    if task.recovery.max_recoveries.is_some_and(|n| n < 0) {
        return Err(format!("{at}.recovery.maxRecoveries must be >= 0"));
    }
    if task
        .recovery
        .max_ignored
        .is_some_and(|n| !(0..=1000).contains(&n))
    {
        return Err(format!("{at}.recovery.maxIgnored must be within 0..1000"));
    }
    // What the task's rules may name: a local workload has no Pod, and only its two scripts;
    // a Pod's containers and init containers.
    if let Some(pod) = task.template.and_then(|t| t.spec.as_ref()) {
        for (list, len) in [
            ("containers", pod.containers.len()),
            (
                "initContainers",
                pod.init_containers.as_ref().map_or(0, Vec::len),
            ),
        ] {
            if len > MAX_POD_CONTAINERS {
                return Err(format!(
                    "{at}.template.spec.{list} holds {len}, more than {MAX_POD_CONTAINERS}"
                ));
            }
        }
    }
    if let Some(policy) = task.failure_policy {
        let parts: Vec<String> = match task.template.and_then(|t| t.spec.as_ref()) {
            Some(pod) => pod
                .init_containers
                .iter()
                .flatten()
                .chain(&pod.containers)
                .map(|c| c.name.clone())
                .collect(),
            None => vec!["setup".into(), "run".into()],
        };
        for (i, rule) in policy.rules.iter().enumerate() {
            if task.template.is_none() && rule.on_pod_conditions.is_some() {
                return Err(format!(
                    "{at}: the failurePolicy's rules[{i}].onPodConditions cannot match a local workload (it has no Pod)"
                ));
            }
            if let Some(name) = rule
                .on_exit_codes
                .as_ref()
                .and_then(|o| o.container_name.as_ref())
                && names
                && !parts.contains(name)
            {
                let what = if task.template.is_some() {
                    "no container or initContainer of the template"
                } else {
                    "no part of a local workload (containerName is setup or run, its scripts, or unset)"
                };
                return Err(format!(
                    "{at}: the failurePolicy's rules[{i}].onExitCodes.containerName {name:?} names {what}; it has {}",
                    parts.join(", ")
                ));
            }
        }
    }
    for (field, script) in [("run", task.run), ("setup", task.setup)] {
        if let Some(s) = script
            && s.len() > MAX_SCRIPT_BYTES
        {
            return Err(format!(
                "{at}.{field} holds {} bytes, more than {MAX_SCRIPT_BYTES}",
                s.len()
            ));
        }
        if script.is_some_and(|s| s.contains('\0')) {
            return Err(format!(
                "{at}.{field} contains a NUL byte, which no process can receive"
            ));
        }
    }
    // For a task, its environment merged over the job's: what its process receives.
    let env_field = if at == "spec" {
        "spec.env"
    } else {
        "spec.env with spec.tasks[].env"
    };
    let env_bytes: usize = task.env.iter().map(|v| v.name.len() + v.value.len()).sum();
    if env_bytes > MAX_ENV_BYTES {
        return Err(format!(
            "{env_field} holds {env_bytes} bytes of names and values, more than {MAX_ENV_BYTES} in all"
        ));
    }
    for (i, var) in task.env.iter().enumerate() {
        // The merged environment has no index of its own in the spec: name the variable.
        let field = if at == "spec" {
            format!("spec.env[{i}]")
        } else {
            format!("{env_field} (variable {})", var.name)
        };
        if !is_shell_identifier(&var.name) {
            return Err(format!(
                "{field}.name {:?} is not a valid variable name",
                var.name
            ));
        }
        if var.value.len() > MAX_ENV_VALUE_BYTES {
            return Err(format!(
                "{field}.value (variable {}) holds {} bytes, more than {MAX_ENV_VALUE_BYTES}",
                var.name,
                var.value.len()
            ));
        }
        if var.value.contains('\0') {
            return Err(format!(
                "{field}.value (variable {}) contains a NUL byte, which no process can receive",
                var.name
            ));
        }
    }
    if let Some(template) = task.template {
        let containers = template
            .spec
            .as_ref()
            .map(|s| s.containers.len())
            .unwrap_or(0);
        if containers == 0 {
            return Err(format!(
                "{at}.template.spec.containers must hold at least one container"
            ));
        }
        let policy = template
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref());
        if policy.is_some_and(|p| p != "Never") {
            return Err(format!("{at}.template.spec.restartPolicy must be Never"));
        }
    }
    Ok(())
}

/// True for an RFC 1123 DNS label: 1..63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn is_shell_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::EnvVar;

    #[test]
    fn validate_spec_names_the_field() {
        let mut spec = ManagedJobSpec {
            run: Some("true".into()),
            ..Default::default()
        };
        assert!(validate_spec(&spec).is_ok());
        spec.env.push(EnvVar {
            name: "A=B".into(),
            value: "x".into(),
        });
        assert!(
            validate_spec(&spec)
                .unwrap_err()
                .contains("spec.env[0].name")
        );
    }

    fn spec(json: serde_json::Value) -> ManagedJobSpec {
        serde_json::from_value(json).expect("a spec")
    }

    fn codes(container: Option<&str>, values: &[i32]) -> serde_json::Value {
        let mut on = serde_json::json!({"operator": "In", "values": values});
        if let Some(c) = container {
            on["containerName"] = c.into();
        }
        serde_json::json!({"action": "FailJob", "onExitCodes": on})
    }

    fn pod(containers: &[&str]) -> serde_json::Value {
        let list: Vec<_> = containers
            .iter()
            .map(|c| serde_json::json!({"name": c, "image": "busybox"}))
            .collect();
        serde_json::json!({"spec": {"containers": list}})
    }

    #[test]
    fn container_names_must_name_a_part_of_the_workload() {
        let job = |rules: serde_json::Value| {
            validate_spec(&spec(serde_json::json!({
                "template": pod(&["c"]),
                "failurePolicy": {"rules": rules},
            })))
        };
        let err = job(serde_json::json!([codes(Some("trainer"), &[3])])).unwrap_err();
        assert!(
            err.contains("rules[0].onExitCodes.containerName \"trainer\" names no container or initContainer of the template; it has c"),
            "{err}"
        );
        assert!(job(serde_json::json!([codes(Some("c"), &[3])])).is_ok());
        let local = validate_spec(&spec(serde_json::json!({
            "run": "true",
            "failurePolicy": {"rules": [codes(Some("trainer"), &[3])]},
        })))
        .unwrap_err();
        assert!(
            local.contains("containerName \"trainer\" names no part of a local workload (containerName is setup or run"),
            "{local}"
        );
        // A pipeline's own rules name a container of any task; a task's, of its template.
        let pipeline = |rules: serde_json::Value, own: Option<serde_json::Value>| {
            let mut a = serde_json::json!({"name": "a", "template": pod(&["main"])});
            if let Some(own) = own {
                a["failurePolicy"] = serde_json::json!({"rules": own});
            }
            validate_spec(&spec(serde_json::json!({
                "tasks": [a, {"name": "b", "template": pod(&["eval"])}],
                "failurePolicy": {"rules": rules},
            })))
        };
        assert!(pipeline(serde_json::json!([codes(Some("eval"), &[3])]), None).is_ok());
        let err = pipeline(serde_json::json!([codes(Some("trainer"), &[3])]), None).unwrap_err();
        assert!(
            err.contains("spec.failurePolicy.rules[0].onExitCodes.containerName \"trainer\" names no container or initContainer of any task template"),
            "{err}"
        );
        let err = pipeline(
            serde_json::json!([codes(Some("eval"), &[3])]),
            Some(serde_json::json!([codes(Some("eval"), &[4])])),
        )
        .unwrap_err();
        assert!(
            err.contains(
                "spec.tasks[0]: the failurePolicy's rules[0].onExitCodes.containerName \"eval\""
            ),
            "{err}"
        );
    }

    #[test]
    fn exit_codes_are_0_to_255_and_a_rule_for_any_container_shadows_later_ones() {
        let job = |rules: serde_json::Value| {
            validate_spec(&spec(serde_json::json!({
                "template": pod(&["run", "side"]),
                "failurePolicy": {"rules": rules},
            })))
        };
        for bad in [-1, 256] {
            let err = job(serde_json::json!([codes(None, &[3, bad])])).unwrap_err();
            assert!(
                err.contains(&format!(
                    "spec.failurePolicy.rules[0].onExitCodes.values: {bad} is not an exit code (0 to 255)"
                )),
                "{err}"
            );
        }
        assert!(job(serde_json::json!([codes(None, &[1, 255])])).is_ok());
        let err = job(serde_json::json!([
            codes(None, &[3]),
            codes(Some("run"), &[3])
        ]))
        .unwrap_err();
        assert!(
            err.contains("spec.failurePolicy.rules[1].onExitCodes.values: exit code 3 is listed with operator In by spec.failurePolicy.rules[0] for any container (it has no containerName)"),
            "{err}"
        );
        let err = job(serde_json::json!([
            codes(Some("run"), &[3]),
            codes(Some("run"), &[4, 3])
        ]))
        .unwrap_err();
        assert!(
            err.contains("rules[1].onExitCodes.values: exit code 3"),
            "{err}"
        );
        assert!(err.contains("for the same container"), "{err}");
        // A rule for one container before a rule for any: each matches what the other does not.
        assert!(
            job(serde_json::json!([
                codes(Some("run"), &[3]),
                codes(Some("side"), &[3]),
                codes(None, &[3])
            ]))
            .is_ok()
        );
    }
}
