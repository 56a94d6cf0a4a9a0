//! Failure rules (docs/design.md#failure-rules): which rule of a task's policy matches an ended
//! attempt, and the action that decides its job's next step ([`decide`]). Pure: the budgets
//! and back-offs that carry the action out are [`super::transitions::after_outcome`]'s.
//!
//! A rule matches as batch/v1 `podFailurePolicy` rules do: `onExitCodes` when a part (a
//! container, an init container, or a local `setup`/`run` script; only the one named by
//! `containerName` when set) exited with a non-zero code that is `In` (or `NotIn`) the values
//! (a lost workload shows no exits: its containers were stopped for it, `super::pod::observed`);
//! `onPodConditions` when the Pod had one of the conditions with the status given (`True` by
//! default); `onReasons` when one of the reasons was given for the end (a part's termination
//! reason, the Pod's reason, a True condition's reason, the outcome's own). The first rule that
//! matches wins; none: the default for the outcome ([`Verdict::default_for`]). Rules never
//! apply to a success or to a workload that can never start ([`Outcome::Invalid`]).

use crate::api::{ExitCodeOperator, FailureAction, FailurePolicy, FailureRule};

use super::outcome::{Evidence, Outcome};

/// What an ended attempt leads to, before budgets: the label of `status.attempts[].action` and
/// of the `managedjobs_attempts_total` metric.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    strum::VariantArray,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::Display,
)]
pub enum Verdict {
    /// Every part exited 0.
    Succeeded,
    /// The job fails at once.
    FailJob,
    /// A restart, against `maxRestartsOnErrors`.
    Restart,
    /// A recovery, against `maxRecoveries`.
    Recover,
    /// A relaunch counted as neither, against `maxIgnored`.
    Ignore,
}

impl Verdict {
    /// Every verdict.
    pub const ALL: &'static [Verdict] = <Verdict as strum::VariantArray>::VARIANTS;

    /// The CamelCase name.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// The verdict named `s`, if any.
    pub fn parse(s: &str) -> Option<Verdict> {
        s.parse().ok()
    }

    /// What the operator does with `outcome` when no rule matches (docs/design.md#failures):
    /// a success succeeds; the workload's own failure (an exit, an OOM kill, a node's refusal)
    /// is a restart; a lost workload a recovery; a workload that can never start fails.
    pub fn default_for(outcome: &Outcome) -> Verdict {
        match outcome {
            Outcome::Succeeded => Verdict::Succeeded,
            Outcome::Failed { .. }
            | Outcome::SetupFailed { .. }
            | Outcome::Refused { .. }
            | Outcome::DeadlineExceeded { .. } => Verdict::Restart,
            Outcome::Lost { .. } => Verdict::Recover,
            Outcome::Invalid { .. } => Verdict::FailJob,
        }
    }
}

impl From<FailureAction> for Verdict {
    fn from(a: FailureAction) -> Verdict {
        match a {
            FailureAction::FailJob => Verdict::FailJob,
            FailureAction::Restart => Verdict::Restart,
            FailureAction::Recover => Verdict::Recover,
            FailureAction::Ignore => Verdict::Ignore,
        }
    }
}

/// The name of the rule decided by no rule, in `status.attempts[].rule` and messages.
pub const DEFAULT_RULE: &str = "default";

/// How an ended attempt was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// What it leads to, before budgets.
    pub verdict: Verdict,
    /// The rule that decided: its index in the policy and its label ([`label`]); None for the
    /// default.
    pub rule: Option<(usize, String)>,
    /// Why a rule that matched did not decide (its `Ignore` has no budget left), for the
    /// message.
    pub note: Option<String>,
}

impl Decision {
    /// The rule's label, or [`DEFAULT_RULE`].
    pub fn rule_label(&self) -> &str {
        self.rule.as_ref().map_or(DEFAULT_RULE, |(_, l)| l.as_str())
    }

    /// True when a rule decided (not the default).
    pub fn by_rule(&self) -> bool {
        self.rule.is_some()
    }
}

/// How a rule is named in the status, messages and Events: its `name`, or `rules[<index>]`.
pub fn label(rule: &FailureRule, index: usize) -> String {
    match &rule.name {
        Some(name) => name.clone(),
        None => format!("rules[{index}]"),
    }
}

/// True when `rule` matches an attempt that ended with `outcome` (see the module's doc). Never
/// for a success or a workload that can never start.
pub fn matches(rule: &FailureRule, outcome: &Outcome) -> bool {
    let Some(evidence) = outcome.evidence() else {
        return false;
    };
    if let Some(on) = &rule.on_exit_codes {
        return evidence.exits.iter().any(|part| {
            part.code != 0
                && on.container_name.as_ref().is_none_or(|n| *n == part.name)
                && match on.operator {
                    ExitCodeOperator::In => on.values.contains(&part.code),
                    ExitCodeOperator::NotIn => !on.values.contains(&part.code),
                }
        });
    }
    if let Some(patterns) = &rule.on_pod_conditions {
        return patterns.iter().any(|p| {
            let status = p.status.as_deref().unwrap_or("True");
            evidence
                .conditions
                .iter()
                .any(|(t, s)| *t == p.type_ && s == status)
        });
    }
    if let Some(reasons) = &rule.on_reasons {
        return reasons
            .iter()
            .any(|r| given_reasons(outcome, evidence).any(|g| g == r));
    }
    false
}

/// Every reason given for an end: the outcome's own, each part's, the evidence's.
fn given_reasons<'a>(
    outcome: &'a Outcome,
    evidence: &'a Evidence,
) -> impl Iterator<Item = &'a str> {
    std::iter::once(outcome.reason())
        .chain(evidence.exits.iter().map(|p| p.reason.as_str()))
        .chain(evidence.reasons.iter().map(String::as_str))
}

/// The first rule of `policy` that matches `outcome`, with its index.
pub fn first_match<'a>(
    policy: Option<&'a FailurePolicy>,
    outcome: &Outcome,
) -> Option<(usize, &'a FailureRule)> {
    policy?
        .rules
        .iter()
        .enumerate()
        .find(|(_, r)| matches(r, outcome))
}

/// Decides an attempt that ended with `outcome` under `policy` (the task's rules): the first
/// rule that matches, else the default. A rule's `Ignore` decides only while the task has
/// ignored fewer than `max_ignored` attempts (`ignored` so far); past that the attempt is
/// decided as if no rule matched (a note says so), so that `Ignore` is bounded like every
/// other relaunch.
pub fn decide(
    policy: Option<&FailurePolicy>,
    outcome: &Outcome,
    ignored: i32,
    max_ignored: i32,
) -> Decision {
    let default = Decision {
        verdict: Verdict::default_for(outcome),
        rule: None,
        note: None,
    };
    let Some((index, rule)) = first_match(policy, outcome) else {
        return default;
    };
    let name = label(rule, index);
    if rule.action == FailureAction::Ignore && ignored >= max_ignored {
        return Decision {
            note: Some(format!(
                "rule {name} says Ignore, but {ignored} attempts were ignored already (maxIgnored {max_ignored})"
            )),
            ..default
        };
    }
    Decision {
        verdict: rule.action.into(),
        rule: Some((index, name)),
        note: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{OnExitCodes, OnPodCondition};
    use crate::lifecycle::outcome::PartExit;
    use proptest::prelude::*;

    fn codes(container: Option<&str>, operator: ExitCodeOperator, values: &[i32]) -> OnExitCodes {
        OnExitCodes {
            container_name: container.map(str::to_string),
            operator,
            values: values.to_vec(),
        }
    }

    fn rule(action: FailureAction, on: OnExitCodes) -> FailureRule {
        FailureRule {
            action,
            on_exit_codes: Some(on),
            ..Default::default()
        }
    }

    fn failed(parts: &[(&str, i32)]) -> Outcome {
        let (name, code) = parts
            .iter()
            .find(|(_, c)| *c != 0)
            .copied()
            .unwrap_or(parts[0]);
        Outcome::Failed {
            code,
            reason: "Error".into(),
            detail: Some(format!("container {name} exited with code {code}")),
            evidence: Evidence {
                exits: parts
                    .iter()
                    .map(|(n, c)| PartExit {
                        name: n.to_string(),
                        init: false,
                        code: *c,
                        reason: if *c == 0 { "Completed" } else { "Error" }.into(),
                    })
                    .collect(),
                ..Default::default()
            },
        }
    }

    /// The shapes of batch/v1: `In` and `NotIn`, scoped to a container or not; 0 never
    /// matches; conditions with their status; reasons from every source.
    #[test]
    fn rules_match_as_pod_failure_policy_rules_do() {
        use ExitCodeOperator::*;
        let both = failed(&[("sidecar", 2), ("main", 75)]);
        assert!(matches(
            &rule(FailureAction::Recover, codes(Some("main"), In, &[75])),
            &both
        ));
        assert!(!matches(
            &rule(FailureAction::FailJob, codes(Some("main"), In, &[2])),
            &both
        ));
        assert!(matches(
            &rule(FailureAction::FailJob, codes(None, In, &[2])),
            &both
        ));
        assert!(matches(
            &rule(FailureAction::FailJob, codes(Some("main"), NotIn, &[2])),
            &both
        ));
        assert!(!matches(
            &rule(FailureAction::FailJob, codes(Some("main"), NotIn, &[75])),
            &both
        ));
        // A part that succeeded never matches, not even NotIn.
        let side = failed(&[("main", 0), ("sidecar", 3)]);
        assert!(!matches(
            &rule(FailureAction::FailJob, codes(Some("main"), NotIn, &[1])),
            &side
        ));
        // Conditions: the status defaults to True.
        let evicted = Outcome::Lost {
            reason: "Pod p: EvictionByEvictionAPI".into(),
            evidence: Evidence {
                conditions: vec![("DisruptionTarget".into(), "True".into())],
                reasons: vec!["EvictionByEvictionAPI".into()],
                ..Default::default()
            },
        };
        let on_condition = |status: Option<&str>| FailureRule {
            action: FailureAction::FailJob,
            on_pod_conditions: Some(vec![OnPodCondition {
                type_: "DisruptionTarget".into(),
                status: status.map(str::to_string),
            }]),
            ..Default::default()
        };
        assert!(matches(&on_condition(None), &evicted));
        assert!(!matches(&on_condition(Some("False")), &evicted));
        assert!(!matches(&on_condition(None), &both));
        // Reasons: the outcome's, a part's, the evidence's.
        let on_reasons = |r: &[&str]| FailureRule {
            action: FailureAction::FailJob,
            on_reasons: Some(r.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        };
        assert!(matches(&on_reasons(&["EvictionByEvictionAPI"]), &evicted));
        assert!(matches(&on_reasons(&["Error"]), &both));
        let oom = Outcome::Failed {
            code: 0,
            reason: "OOMKilled".into(),
            detail: None,
            evidence: Evidence::exit("main", false, 0, "OOMKilled"),
        };
        assert!(matches(&on_reasons(&["OOMKilled"]), &oom));
        assert!(!matches(
            &rule(FailureAction::FailJob, codes(None, NotIn, &[1])),
            &oom
        ));
        let refused = Outcome::Refused {
            reason: "OutOfcpu".into(),
            message: "Pod was rejected".into(),
            evidence: Evidence::reason("OutOfcpu"),
        };
        assert!(matches(&on_reasons(&["OutOfcpu"]), &refused));
        // Never a success, never a workload that cannot start.
        assert!(!matches(&on_reasons(&["Succeeded"]), &Outcome::Succeeded));
        let invalid = Outcome::Invalid {
            reason: "InvalidImageName".into(),
            message: "m".into(),
        };
        assert!(!matches(&on_reasons(&["InvalidImageName"]), &invalid));
    }

    /// No rule: the defaults. An Ignore without budget left: the default, saying why.
    #[test]
    fn no_match_keeps_the_defaults_and_a_spent_ignore_falls_back_to_them() {
        let policy = FailurePolicy {
            rules: vec![FailureRule {
                name: Some("preempted".into()),
                action: FailureAction::Ignore,
                on_reasons: Some(vec!["PodDeleted".into()]),
                ..Default::default()
            }],
        };
        let deleted = Outcome::lost("Pod p: PodDeleted", "PodDeleted");
        let d = decide(Some(&policy), &deleted, 0, 1);
        assert_eq!((d.verdict, d.rule_label()), (Verdict::Ignore, "preempted"));
        let d = decide(Some(&policy), &deleted, 1, 1);
        assert_eq!(
            (d.verdict, d.rule_label()),
            (Verdict::Recover, DEFAULT_RULE)
        );
        assert!(d.note.unwrap().contains("maxIgnored 1"));
        let d = decide(Some(&policy), &failed(&[("main", 1)]), 0, 1);
        assert_eq!((d.verdict, d.rule), (Verdict::Restart, None));
        assert_eq!(
            decide(None, &Outcome::Succeeded, 0, 0).verdict,
            Verdict::Succeeded
        );
        assert_eq!(
            label(&FailureRule::default(), 3),
            "rules[3]",
            "an unnamed rule is named by its index"
        );
    }

    fn action() -> impl Strategy<Value = FailureAction> {
        prop::sample::select(FailureAction::ALL.to_vec())
    }

    /// A rule over a small universe: containers `main`/`side`, codes 1..6, two reasons.
    fn any_rule() -> impl Strategy<Value = FailureRule> {
        let exit = (
            prop::option::of(prop::sample::select(vec!["main", "side"])),
            any::<bool>(),
            prop::collection::btree_set(1i32..6, 1..3),
        )
            .prop_map(|(c, not_in, v)| {
                Some(codes(
                    c,
                    if not_in {
                        ExitCodeOperator::NotIn
                    } else {
                        ExitCodeOperator::In
                    },
                    &v.into_iter().collect::<Vec<_>>(),
                ))
            });
        let reasons = prop::collection::vec(prop::sample::select(vec!["OOMKilled", "Error"]), 1..2)
            .prop_map(|r| Some(r.into_iter().map(str::to_string).collect::<Vec<_>>()));
        (
            action(),
            prop_oneof![
                exit.prop_map(|e| (e, None)),
                reasons.prop_map(|r| (None, r))
            ],
        )
            .prop_map(|(action, (on_exit_codes, on_reasons))| FailureRule {
                action,
                on_exit_codes,
                on_reasons,
                ..Default::default()
            })
    }

    /// An outcome over the same universe: each container's exit code 0..6 and reason.
    fn any_outcome() -> impl Strategy<Value = Outcome> {
        (0i32..6, 0i32..6, any::<bool>()).prop_map(|(main, side, oom)| {
            let mut o = failed(&[("main", main), ("side", side)]);
            if oom && let Outcome::Failed { evidence, .. } = &mut o {
                evidence.exits[0].reason = "OOMKilled".into();
            }
            o
        })
    }

    /// Whether `rule` matches, said otherwise: the set of (container, code, reason) triples the
    /// outcome shows, against what the rule accepts.
    fn oracle(rule: &FailureRule, outcome: &Outcome) -> bool {
        let parts: Vec<(String, i32, String)> = outcome
            .evidence()
            .unwrap()
            .exits
            .iter()
            .map(|p| (p.name.clone(), p.code, p.reason.clone()))
            .collect();
        if let Some(on) = &rule.on_exit_codes {
            let accepted: Vec<i32> = (1..6)
                .filter(|c| (on.operator == ExitCodeOperator::In) == on.values.contains(c))
                .collect();
            return parts.iter().any(|(name, code, _)| {
                accepted.contains(code) && on.container_name.as_deref().is_none_or(|n| n == name)
            });
        }
        let reasons = rule.on_reasons.as_ref().unwrap();
        reasons
            .iter()
            .any(|r| r == outcome.reason() || parts.iter().any(|(_, _, pr)| pr == r))
    }

    proptest! {
        /// For random rule lists and outcomes, the action is the first matching rule's (an
        /// Ignore with budget left), else the default's.
        #[test]
        fn the_first_matching_rule_decides(
            rules in prop::collection::vec(any_rule(), 0..6),
            outcome in any_outcome(),
            ignored in 0i32..3,
            max_ignored in 0i32..3,
        ) {
            let policy = FailurePolicy { rules: rules.clone() };
            let d = decide(Some(&policy), &outcome, ignored, max_ignored);
            match rules.iter().position(|r| oracle(r, &outcome)) {
                Some(i) if rules[i].action == FailureAction::Ignore && ignored >= max_ignored => {
                    prop_assert_eq!(d.verdict, Verdict::default_for(&outcome));
                    prop_assert!(d.rule.is_none() && d.note.is_some());
                }
                Some(i) => {
                    prop_assert_eq!(d.verdict, Verdict::from(rules[i].action));
                    prop_assert_eq!(d.rule, Some((i, format!("rules[{i}]"))));
                }
                None => {
                    prop_assert_eq!(d.verdict, Verdict::default_for(&outcome));
                    prop_assert!(d.rule.is_none());
                }
            }
        }
    }
}
