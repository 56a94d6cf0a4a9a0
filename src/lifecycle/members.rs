//! An attempt's members, as the decisions see them: what an executor observes of each member of
//! the current attempt ([`Observed`]: one [`Member`] per rank, each running, pending with a
//! reason, exited with a code and reason, lost with a cause...), whatever the workload's kind (a
//! local process, a Pod, one Pod per node of a multi-node job), and what that means for the
//! attempt as a whole ([`view`]): the rules of a gang (`docs/design.md#multi-node-jobs`).
//!
//! - **All or nothing**: the attempt runs only when every member runs ([`View::Running`]);
//!   until then it is launching, and a launch deadline or a wait for nodes removes all of them.
//! - **Fail fast**: the first member to end badly (exited non-zero, refused, lost) decides the
//!   attempt ([`View::Ended`], naming its rank); the others still alive are stopped before the
//!   attempt's end is recorded (`others_alive`), so no member of a new attempt ever runs beside
//!   one of the old.
//! - **Recover as one**: a lost member (evicted, preempted, deleted, its node gone) ends the
//!   attempt as lost; the whole gang is relaunched as one recovery.
//!
//! A job of one member (every local job, a pod job without `nodes`) reads exactly as before:
//! its member's state is the attempt's.

use super::outcome::{Outcome, Workload};

/// What an executor observes of one attempt: each member, by rank (0..N-1, N the attempt's
/// size). An executor reports every rank, [`MemberState::NotFound`] for one it has no trace of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// One per rank, in rank order; never empty.
    pub members: Vec<Member>,
    /// The cluster places the members all or nothing (kube-scheduler's gang policy, a
    /// `PodGroup`): none is bound until every one fits. False when each member is placed on
    /// its own (no gang scheduling served), so a partly placed attempt holds nodes while the
    /// rest wait.
    pub placed_together: bool,
}

/// One member of an attempt: a process, a Pod, one rank of a multi-node job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its rank, 0..N-1 (0 for a job of one member).
    pub rank: u32,
    /// What it runs, when known (a Pod's deterministic name is known before it exists; a local
    /// attempt's pid only once it runs).
    pub workload: Option<Workload>,
    /// Where it stands.
    pub state: MemberState,
    /// When it ended or began to be taken away (ms since epoch), when known: of two members
    /// that ended badly, the first decides the attempt (a member the operator stopped because
    /// another failed ends later than that one).
    pub ended_at_ms: Option<i64>,
}

/// Where one member of an attempt stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberState {
    /// No trace of it: never created, not seen yet (a Pod the watch has not reported), or gone
    /// without a recorded end.
    NotFound,
    /// Created, not running yet (being scheduled, pulling its image...).
    Pending {
        /// CamelCase reason of what it waits on (e.g. `ImagePullBackOff`), empty when nothing
        /// says.
        reason: String,
        /// What it waits on, naming the container (e.g. "container main: Back-off pulling
        /// image ..."), or where it is bound; may be empty.
        message: String,
    },
    /// It waits for a node; `message` is the scheduler's reason.
    Unschedulable {
        /// E.g. "0/4 nodes are available: ...".
        message: String,
    },
    /// Deleted (by someone else: a user, a controller, an eviction) but not gone yet, and it had
    /// not exited: it no longer counts as running.
    Terminating {
        /// E.g. "Pod x-1-1 on node n1 is terminating".
        message: String,
        /// When it has outlived its grace period plus a margin (ms since epoch): past it, on a
        /// node that is not Ready, it is force-deleted.
        force_at_ms: Option<i64>,
        /// Whether its node is Ready, when asked (past `force_at_ms`); None: not asked or
        /// unknown (never forced then).
        node_ready: Option<bool>,
    },
    /// Its create failed and may succeed later (the API answered 5xx, or could not be
    /// reached): tried again at `retry_at_ms`, against the launch deadline.
    CreateFailed {
        /// What the API said.
        message: String,
        /// When to try the create again (ms since epoch).
        retry_at_ms: i64,
    },
    /// It runs.
    Running,
    /// It ended; here is how.
    Ended(Outcome),
}

impl Observed {
    /// The observation of an attempt of one member.
    pub fn one(workload: Option<Workload>, state: MemberState) -> Observed {
        Observed {
            members: vec![Member {
                rank: 0,
                workload,
                state,
                ended_at_ms: None,
            }],
            placed_together: true,
        }
    }

    /// An attempt of one member of which nothing is known.
    pub fn not_found() -> Observed {
        Observed::one(None, MemberState::NotFound)
    }

    /// The attempt's size (its members, N).
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// Members that run or have succeeded, and the attempt's size: `status.ready` (e.g. 3/4).
    pub fn ready(&self) -> (u32, u32) {
        let ready = self
            .members
            .iter()
            .filter(|m| {
                matches!(
                    m.state,
                    MemberState::Running | MemberState::Ended(Outcome::Succeeded)
                )
            })
            .count();
        (ready as u32, self.members.len() as u32)
    }
}

impl Member {
    /// How messages name it: its workload ("Pod x-1-1"), or its rank when its workload is
    /// unknown ("rank 2"); "the workload" for an unknown member of a job of one.
    pub fn noun(&self, size: usize) -> String {
        match (&self.workload, size) {
            (Some(w), 1) => w.noun(),
            (Some(w), _) => format!("rank {} ({})", self.rank, w.noun()),
            (None, 1) => "the workload".into(),
            (None, _) => format!("rank {}", self.rank),
        }
    }

    /// True while it may still run or start: what a fail-fast stop has to stop. A member lost
    /// with its node too: its Pod is still there, on a node that will never confirm its end
    /// (and one not Ready may still run it), until the stop removes it
    /// ([`super::nodes::removes_at_once`]).
    pub fn alive(&self) -> bool {
        match &self.state {
            MemberState::Pending { .. }
            | MemberState::Unschedulable { .. }
            | MemberState::Terminating { .. }
            | MemberState::Running => true,
            MemberState::Ended(o @ Outcome::Lost { .. }) => {
                super::nodes::removes_at_once(o.reason())
            }
            _ => false,
        }
    }

    /// True once it is bound to a node or beyond (it holds a node's resources).
    fn placed(&self) -> bool {
        matches!(
            self.state,
            MemberState::Pending { .. } | MemberState::Running | MemberState::Ended(_)
        )
    }
}

/// What an attempt's members mean for the attempt, as [`crate::lifecycle::next_action`]
/// decides on it ([`view`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum View {
    /// A member was never created (or not seen yet): the launch creates what is missing.
    NotFound,
    /// A member's create failed and may succeed later.
    CreateFailed {
        /// How messages name the member.
        noun: String,
        /// What the API said.
        message: String,
        /// When to try again (ms since epoch).
        retry_at_ms: i64,
    },
    /// Every member exists, and one does not run yet (the first such by rank).
    Pending {
        /// What messages say waits ("Pod x-1-1", or "3 of 4 members, first rank 1 (Pod ...)").
        noun: String,
        /// CamelCase reason of what it waits on, empty when nothing says.
        reason: String,
        /// What it waits on; may be empty.
        message: String,
    },
    /// A member waits for a node.
    Unschedulable {
        /// What messages say waits.
        noun: String,
        /// The member's workload, as `status.workload` shows the attempt's.
        workload: Option<Workload>,
        /// The scheduler's reason.
        message: String,
        /// Some members are placed while others wait (no gang scheduling): the attempt holds
        /// nodes, so its wait is bounded whether or not another job wants its run slot.
        holds_nodes: bool,
    },
    /// The member of a job of one was deleted by someone else and is not gone yet.
    Terminating {
        /// How messages name it.
        noun: String,
        /// Its workload.
        workload: Option<Workload>,
        /// E.g. "Pod x-1-1 on node n1 is terminating".
        message: String,
        /// Past it, on a node that is not Ready, it is force-deleted.
        force_at_ms: Option<i64>,
        /// Whether its node is Ready, when asked.
        node_ready: Option<bool>,
    },
    /// Every member runs (or has succeeded while the others run).
    Running {
        /// The attempt's workload as `status.workload` shows it (rank 0's).
        workload: Workload,
    },
    /// The attempt ended: every member succeeded, or one ended badly and decides.
    Ended {
        /// How it ended (for a multi-node job, the deciding member's outcome, naming its rank).
        outcome: Outcome,
        /// The deciding member's rank (None for a success or a job of one).
        rank: Option<u32>,
        /// Members still run, start or terminate (the others, or the deciding one while it
        /// terminates), or were lost with their node and are still there ([`Member::alive`]):
        /// they are stopped (with the job's grace; one lost with its node removed at once)
        /// before the end is recorded.
        others_alive: bool,
    },
}

/// The order in which ended members decide: the first to end; at the same time (or unknown), a
/// member that failed on its own before one that was lost, then the lower rank.
fn decides_first(m: &Member) -> (i64, u8, u32) {
    let lost = matches!(m.state, MemberState::Ended(Outcome::Lost { .. }))
        || matches!(m.state, MemberState::Terminating { .. });
    (m.ended_at_ms.unwrap_or(i64::MAX), u8::from(lost), m.rank)
}

/// What `observed` means for its attempt (the module documentation gives the rules). Pure.
pub fn view(observed: &Observed) -> View {
    let size = observed.size();
    let gang = size > 1;
    let members = &observed.members;
    // Fail fast: a member that ended badly decides (a terminating member of a gang is being
    // lost: the rest are stopped now rather than after it is gone).
    let decider = members
        .iter()
        .filter(|m| match &m.state {
            MemberState::Ended(o) => *o != Outcome::Succeeded,
            MemberState::Terminating { .. } => gang,
            _ => false,
        })
        .min_by_key(|m| decides_first(m));
    if let Some(m) = decider {
        // Every member still alive is stopped first: the others, and the decider itself when it
        // is still terminating (a new attempt must not start beside it).
        let others_alive = members.iter().any(Member::alive);
        let outcome = match &m.state {
            MemberState::Ended(o) => o.clone(),
            MemberState::Terminating { message, .. } => {
                Outcome::lost(message.clone(), "PodTerminating")
            }
            _ => unreachable!("filtered above"),
        };
        return if gang {
            View::Ended {
                outcome: outcome.of_rank(m.rank, &m.noun(size)),
                rank: Some(m.rank),
                others_alive,
            }
        } else {
            View::Ended {
                outcome,
                rank: None,
                others_alive,
            }
        };
    }
    if members
        .iter()
        .all(|m| m.state == MemberState::Ended(Outcome::Succeeded))
    {
        return View::Ended {
            outcome: Outcome::Succeeded,
            rank: None,
            others_alive: false,
        };
    }
    if members.iter().any(|m| m.state == MemberState::NotFound) {
        return View::NotFound;
    }
    let waiting = |pred: fn(&MemberState) -> bool| {
        let all: Vec<&Member> = members.iter().filter(|m| pred(&m.state)).collect();
        let noun = match all.as_slice() {
            [] => String::new(),
            [m] if !gang => m.noun(size),
            [m, ..] => format!("{} of {size} members, first {}", all.len(), m.noun(size)),
        };
        (all.first().copied(), noun)
    };
    if let (Some(m), noun) = waiting(|s| matches!(s, MemberState::CreateFailed { .. })) {
        let MemberState::CreateFailed {
            message,
            retry_at_ms,
        } = &m.state
        else {
            unreachable!("filtered")
        };
        return View::CreateFailed {
            noun,
            message: message.clone(),
            retry_at_ms: *retry_at_ms,
        };
    }
    if let (Some(m), noun) = waiting(|s| matches!(s, MemberState::Terminating { .. })) {
        let MemberState::Terminating {
            message,
            force_at_ms,
            node_ready,
        } = &m.state
        else {
            unreachable!("filtered")
        };
        return View::Terminating {
            noun,
            workload: m.workload.clone(),
            message: message.clone(),
            force_at_ms: *force_at_ms,
            node_ready: *node_ready,
        };
    }
    if let (Some(m), noun) = waiting(|s| matches!(s, MemberState::Unschedulable { .. })) {
        let MemberState::Unschedulable { message } = &m.state else {
            unreachable!("filtered")
        };
        return View::Unschedulable {
            noun,
            workload: members[0].workload.clone().or_else(|| m.workload.clone()),
            message: message.clone(),
            holds_nodes: gang && !observed.placed_together && members.iter().any(Member::placed),
        };
    }
    if let (Some(m), noun) = waiting(|s| matches!(s, MemberState::Pending { .. })) {
        let MemberState::Pending { reason, message } = &m.state else {
            unreachable!("filtered")
        };
        return View::Pending {
            noun,
            reason: reason.clone(),
            message: message.clone(),
        };
    }
    // Every member runs, or has succeeded while the others run.
    match members[0].workload.clone() {
        Some(workload) => View::Running { workload },
        // A running member always names its workload; without one nothing is known.
        None => View::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::outcome::Evidence;

    fn member(rank: u32, state: MemberState, at: Option<i64>) -> Member {
        Member {
            rank,
            workload: Some(Workload::Pod(format!("p-{rank}"))),
            state,
            ended_at_ms: at,
        }
    }

    fn failed(code: i32) -> MemberState {
        MemberState::Ended(Outcome::Failed {
            code,
            reason: "Error".into(),
            detail: Some(format!("container main exited with code {code}")),
            evidence: Evidence::exit("main", false, code, "Error"),
        })
    }

    fn gang(members: Vec<Member>, together: bool) -> Observed {
        Observed {
            members,
            placed_together: together,
        }
    }

    #[test]
    fn a_gang_runs_only_when_every_member_runs() {
        let mut o = gang(
            (0..4)
                .map(|r| member(r, MemberState::Running, None))
                .collect(),
            true,
        );
        o.members[3].state = MemberState::Pending {
            reason: String::new(),
            message: String::new(),
        };
        assert!(matches!(view(&o), View::Pending { .. }), "{:?}", view(&o));
        assert_eq!(o.ready(), (3, 4));
        o.members[3].state = MemberState::Running;
        assert_eq!(
            view(&o),
            View::Running {
                workload: Workload::Pod("p-0".into())
            }
        );
        // A member that finished first does not end a gang whose others still run.
        o.members[0].state = MemberState::Ended(Outcome::Succeeded);
        assert!(matches!(view(&o), View::Running { .. }));
        assert_eq!(o.ready(), (4, 4));
    }

    #[test]
    fn the_first_member_to_end_badly_decides_and_the_rest_are_stopped() {
        let o = gang(
            vec![
                member(0, MemberState::Running, None),
                member(
                    1,
                    MemberState::Ended(Outcome::lost("deleted", "PodDeleted")),
                    Some(20),
                ),
                member(2, failed(3), Some(10)),
                member(3, MemberState::Running, None),
            ],
            true,
        );
        let View::Ended {
            outcome,
            rank,
            others_alive,
        } = view(&o)
        else {
            panic!("{:?}", view(&o))
        };
        assert_eq!(rank, Some(2));
        assert!(others_alive);
        assert_eq!(outcome.exit_code(), Some(3));
        assert_eq!(outcome.evidence().and_then(|e| e.rank), Some(2));
    }

    #[test]
    fn a_terminating_member_of_a_gang_is_lost_at_once() {
        let o = gang(
            vec![
                member(0, MemberState::Running, None),
                member(
                    1,
                    MemberState::Terminating {
                        message: "Pod p-1 is terminating".into(),
                        force_at_ms: None,
                        node_ready: None,
                    },
                    Some(5),
                ),
            ],
            true,
        );
        let View::Ended {
            outcome: Outcome::Lost { .. },
            rank: Some(1),
            others_alive: true,
        } = view(&o)
        else {
            panic!("{:?}", view(&o))
        };
    }

    #[test]
    fn a_partly_placed_gang_holds_nodes_only_without_gang_scheduling() {
        let members = vec![
            member(0, MemberState::Running, None),
            member(
                1,
                MemberState::Unschedulable {
                    message: "0/4 nodes are available".into(),
                },
                None,
            ),
        ];
        let View::Unschedulable { holds_nodes, .. } = view(&gang(members.clone(), false)) else {
            panic!()
        };
        assert!(holds_nodes);
        let View::Unschedulable { holds_nodes, .. } = view(&gang(members, true)) else {
            panic!()
        };
        assert!(!holds_nodes);
    }

    #[test]
    fn one_member_reads_as_before() {
        let o = Observed::one(Some(Workload::Pod("p".into())), failed(2));
        assert_eq!(
            view(&o),
            View::Ended {
                outcome: match failed(2) {
                    MemberState::Ended(o) => o,
                    _ => unreachable!(),
                },
                rank: None,
                others_alive: false
            }
        );
        assert_eq!(view(&Observed::not_found()), View::NotFound);
    }
}
