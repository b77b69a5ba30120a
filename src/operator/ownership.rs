//! Which operator runs a listener, when several are installed (per-team releases, staging
//! beside production, a migration). Pure.
//!
//! Every operator has a controller name (`--controller-name`, the chart's `controllerName`)
//! and runs exactly the listeners whose `spec.controllerName` is that name, as an ingress
//! controller serves the Ingresses of its IngressClass. Operators find each other through their
//! Leases: each one keeps a Lease in its namespace (the leader-election Lease, renewed every few
//! seconds) annotated with its controller name, and reads the others' by label. A Lease renewed
//! within [`REGISTRATION_TTL`] is a running operator; the namespace is its identity (one
//! operator per namespace: its DaemonSets, ServiceAccounts and hosts namespace are scoped by
//! it). An operator older than controller names writes no annotation and claims every
//! listener, so its Lease counts as one with [`DEFAULT_CONTROLLER_NAME`].
//!
//! For one listener an operator then finds [`Ownership`]: its own; claimed by two running
//! operators (neither touches it, `ControllerConflict`); another running operator's (it removes
//! a data plane it has for it once the other's pods are ready); or nobody's (`NoController`).
//! A refusal is written to the status by exactly one operator (the first namespace in order),
//! so two operators never write one listener's status.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;

use super::labels;
use crate::api::{annotations, reasons, Http3Listener, DEFAULT_CONTROLLER_NAME};

/// How long after its last renewal an operator's Lease still says it runs. Longer than an
/// operator's restart or a leader hand-over (the Lease is released and taken again within
/// seconds), so a rolling update of one operator never makes another call its listeners
/// unclaimed; an uninstall deletes the Lease (`operator::uninstall`), a namespace deletion too.
pub const REGISTRATION_TTL: Duration = Duration::from_secs(90);

/// What one operator's Lease says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub namespace: String,
    pub controller_name: String,
    /// The Lease's renewTime (or acquireTime).
    pub renewed: Option<Timestamp>,
}

/// The registration an operator's Lease carries.
pub fn registration(lease: &Lease) -> Registration {
    let spec = lease.spec.as_ref();
    let renewed = spec
        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
        .map(|t| t.0);
    Registration {
        namespace: lease.namespace().unwrap_or_default(),
        controller_name: lease
            .annotations()
            .get(annotations::CONTROLLER_NAME)
            .cloned()
            .unwrap_or_else(|| DEFAULT_CONTROLLER_NAME.to_string()),
        renewed,
    }
}

/// The operators running at `now`: namespace -> controller name (of the Lease renewed last,
/// when a namespace has two, e.g. after `leaderElection.leaseName` changed).
pub fn running(regs: &[Registration], now: Timestamp) -> BTreeMap<String, String> {
    let ttl = SignedDuration::try_from(REGISTRATION_TTL).expect("a small duration");
    let mut newest: BTreeMap<&str, &Registration> = BTreeMap::new();
    for r in regs {
        let Some(t) = r.renewed else { continue };
        if t + ttl <= now || r.namespace.is_empty() {
            continue;
        }
        let slot = newest.entry(&r.namespace).or_insert(r);
        if slot.renewed < r.renewed {
            *slot = r;
        }
    }
    newest
        .into_iter()
        .map(|(ns, r)| (ns.to_string(), r.controller_name.clone()))
        .collect()
}

/// This operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Me {
    pub namespace: String,
    pub controller_name: String,
}

/// Who runs a listener, as this operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// This operator, alone.
    Mine,
    /// Several running operators have its controller name (their namespaces, in order, this
    /// one among them): none touches it. `writes_status`: this one says so.
    Conflict {
        namespaces: Vec<String>,
        writes_status: bool,
    },
    /// Another running operator (its namespace).
    Other { namespace: String },
    /// No running operator has its controller name. `running`: (namespace, controller name)
    /// of every running operator, for the message. `writes_status`: this one says so.
    Unclaimed {
        running: Vec<(String, String)>,
        writes_status: bool,
    },
}

/// The listener's controller name (the CRD fills the default in; a listener read from an
/// older CRD has none).
pub fn wanted(listener: &Http3Listener) -> &str {
    let name = listener.spec.controller_name.as_str();
    if name.is_empty() {
        DEFAULT_CONTROLLER_NAME
    } else {
        name
    }
}

/// Who runs a listener that wants `wanted`, given the running operators (this one is added).
pub fn decide(wanted: &str, me: &Me, running: &BTreeMap<String, String>) -> Ownership {
    let mut running = running.clone();
    running.insert(me.namespace.clone(), me.controller_name.clone());
    let claimants: Vec<String> = running
        .iter()
        .filter(|(_, name)| name.as_str() == wanted)
        .map(|(ns, _)| ns.clone())
        .collect();
    // Of all running operators (or of the claimants), the first namespace speaks.
    let first = |among: &[String]| among.first() == Some(&me.namespace);
    match claimants.as_slice() {
        [] => {
            let namespaces: Vec<String> = running.keys().cloned().collect();
            Ownership::Unclaimed {
                writes_status: first(&namespaces),
                running: running.into_iter().collect(),
            }
        }
        [only] if *only == me.namespace => Ownership::Mine,
        [only] => Ownership::Other {
            namespace: only.clone(),
        },
        _ => {
            let mine = claimants.contains(&me.namespace);
            Ownership::Conflict {
                writes_status: mine && first(&claimants),
                namespaces: claimants,
            }
        }
    }
}

impl Ownership {
    /// The Ready reason and message of a refusal this operator writes; `None` when it writes
    /// nothing (its own listener, another operator's, or a refusal another one writes).
    pub fn refusal(&self, wanted: &str) -> Option<(&'static str, String)> {
        match self {
            Ownership::Conflict {
                namespaces,
                writes_status: true,
            } => Some((
                reasons::CONTROLLER_CONFLICT,
                format!(
                    "the operators in namespaces {} all have controller name {wanted:?}: none of \
                     them runs or changes this listener's data plane until all but one get \
                     another --controller-name (the chart's controllerName)",
                    namespaces.join(", ")
                ),
            )),
            Ownership::Unclaimed {
                running,
                writes_status: true,
            } => {
                let others: Vec<String> = running
                    .iter()
                    .map(|(ns, name)| format!("{name:?} in namespace {ns}"))
                    .collect();
                Some((
                    reasons::NO_CONTROLLER,
                    format!(
                        "no running h3-ingress operator has controller name {wanted:?} (running: \
                         {}): nothing starts or updates this listener's data plane; set \
                         spec.controllerName to a running operator's name, or install one with \
                         this name",
                        others.join("; ")
                    ),
                ))
            }
            _ => None,
        }
    }
}

/// Whether the listener's new owner serves it: its status is of the current generation and
/// every node it selects has a ready pod. Only then does the previous owner remove its own
/// data plane, so a hand-over leaves no node without one.
pub fn new_owner_serving(listener: &Http3Listener) -> bool {
    let Some(s) = listener.status.as_ref() else {
        return false;
    };
    let current =
        s.observed_generation.is_some() && s.observed_generation == listener.metadata.generation;
    current
        && s.nodes
            .as_ref()
            .is_some_and(|n| n.desired > 0 && n.ready >= n.desired)
}

/// Whether an object was made by the operator in `namespace` (its
/// [`labels::OPERATOR_NAMESPACE`]). Namespaced objects are only ever looked for in an
/// operator's own namespaces; this tells the cluster-scoped ones apart.
pub fn made_here(labels_: &BTreeMap<String, String>, namespace: &str) -> bool {
    labels_.get(labels::OPERATOR_NAMESPACE).map(String::as_str) == Some(namespace)
}

/// Whether a ClusterRoleBinding from before release-scoped names (no
/// [`labels::OPERATOR_NAMESPACE`], named after the listener alone) is this operator's: it binds
/// only ServiceAccounts of `namespace`. Two installations of those versions applied one such
/// binding each for the same listener, in turn; the other's is left to it.
pub fn legacy_binding_here(b: &ClusterRoleBinding, namespace: &str) -> bool {
    let subjects = b.subjects.as_deref().unwrap_or_default();
    !b.labels().contains_key(labels::OPERATOR_NAMESPACE)
        && !subjects.is_empty()
        && subjects
            .iter()
            .all(|s| s.kind == "ServiceAccount" && s.namespace.as_deref() == Some(namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::NodesStatus;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn lease(ns: &str, name: Option<&str>, renewed: i64) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("h3-ingress-operator".into()),
                namespace: Some(ns.into()),
                annotations: name.map(|n| {
                    [(annotations::CONTROLLER_NAME.to_string(), n.to_string())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("x".into()),
                renew_time: Some(MicroTime(t(renewed))),
                ..Default::default()
            }),
        }
    }

    fn me(ns: &str, name: &str) -> Me {
        Me {
            namespace: ns.into(),
            controller_name: name.into(),
        }
    }

    fn map(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn leases_renewed_within_the_ttl_are_running_operators_one_per_namespace() {
        let ttl = REGISTRATION_TTL.as_secs() as i64;
        let regs: Vec<Registration> = [
            lease("prod", Some("example.com/prod"), 1000),
            lease("staging", Some("example.com/staging"), 1000 - ttl),
            // An operator from before controller names claims the default.
            lease("old", None, 990),
            // Two Leases in one namespace: the one renewed last counts.
            lease("team", Some("example.com/a"), 900),
            lease("team", Some("example.com/b"), 950),
        ]
        .iter()
        .map(registration)
        .collect();
        assert_eq!(
            running(&regs, t(1000)),
            map(&[
                ("old", DEFAULT_CONTROLLER_NAME),
                ("prod", "example.com/prod"),
                ("team", "example.com/b"),
            ]),
            "staging's Lease expired exactly at renew + ttl"
        );
        let released = Lease {
            spec: None,
            ..lease("gone", Some("x/y"), 1)
        };
        assert_eq!(registration(&released).renewed, None);
        assert!(running(&[registration(&released)], t(1)).is_empty());
    }

    #[test]
    fn an_operator_runs_exactly_the_listeners_with_its_name() {
        let prod = me("prod", DEFAULT_CONTROLLER_NAME);
        let staging = me("staging", "example.com/staging");
        let both = map(&[
            ("prod", DEFAULT_CONTROLLER_NAME),
            ("staging", "example.com/staging"),
        ]);
        assert_eq!(
            decide(DEFAULT_CONTROLLER_NAME, &prod, &both),
            Ownership::Mine
        );
        assert_eq!(
            decide(DEFAULT_CONTROLLER_NAME, &staging, &both),
            Ownership::Other {
                namespace: "prod".into()
            }
        );
        assert_eq!(
            decide("example.com/staging", &staging, &both),
            Ownership::Mine
        );
        // Before its own Lease is read back, an operator still counts itself.
        assert_eq!(
            decide("example.com/staging", &staging, &BTreeMap::new()),
            Ownership::Mine
        );
    }

    #[test]
    fn a_name_two_operators_have_is_refused_and_said_once() {
        let running = map(&[("a", "x.dev/op"), ("b", "x.dev/op"), ("c", "x.dev/other")]);
        let a = decide("x.dev/op", &me("a", "x.dev/op"), &running);
        let b = decide("x.dev/op", &me("b", "x.dev/op"), &running);
        let c = decide("x.dev/op", &me("c", "x.dev/other"), &running);
        let want = |writes| Ownership::Conflict {
            namespaces: vec!["a".into(), "b".into()],
            writes_status: writes,
        };
        assert_eq!((a.clone(), b.clone()), (want(true), want(false)));
        assert_eq!(
            c,
            Ownership::Conflict {
                namespaces: vec!["a".into(), "b".into()],
                writes_status: false
            },
            "a third operator neither claims nor writes"
        );
        let (reason, message) = a.refusal("x.dev/op").unwrap();
        assert_eq!(reason, reasons::CONTROLLER_CONFLICT);
        assert!(message.contains("namespaces a, b"), "{message}");
        assert!(message.contains("--controller-name"), "{message}");
        assert_eq!(b.refusal("x.dev/op"), None);
    }

    #[test]
    fn a_name_nobody_runs_is_refused_by_the_first_running_operator() {
        let running = map(&[("prod", DEFAULT_CONTROLLER_NAME), ("staging", "x.dev/s")]);
        let p = decide("x.dev/gone", &me("prod", DEFAULT_CONTROLLER_NAME), &running);
        let s = decide("x.dev/gone", &me("staging", "x.dev/s"), &running);
        assert!(matches!(
            p,
            Ownership::Unclaimed {
                writes_status: true,
                ..
            }
        ));
        assert!(matches!(
            s,
            Ownership::Unclaimed {
                writes_status: false,
                ..
            }
        ));
        let (reason, message) = p.refusal("x.dev/gone").unwrap();
        assert_eq!(reason, reasons::NO_CONTROLLER);
        assert!(
            message.contains(r#""x.dev/s" in namespace staging"#),
            "{message}"
        );
        assert!(message.contains("spec.controllerName"), "{message}");
        assert_eq!(s.refusal("x.dev/gone"), None);
        assert_eq!(Ownership::Mine.refusal("x"), None);
    }

    #[test]
    fn only_objects_of_this_operator_are_its_own() {
        let labelled = |ns: Option<&str>| -> BTreeMap<String, String> {
            let mut l = BTreeMap::from([(labels::INSTANCE.to_string(), "public".to_string())]);
            if let Some(ns) = ns {
                l.insert(labels::OPERATOR_NAMESPACE.into(), ns.into());
            }
            l
        };
        assert!(made_here(&labelled(Some("prod")), "prod"));
        assert!(!made_here(&labelled(Some("staging")), "prod"));
        assert!(!made_here(&labelled(None), "prod"));

        let binding = |subjects: &[(&str, &str)], ns_label: Option<&str>| ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some("h3-ingress-data-plane-public".into()),
                labels: Some(labelled(ns_label)),
                ..Default::default()
            },
            subjects: Some(
                subjects
                    .iter()
                    .map(|(kind, ns)| k8s_openapi::api::rbac::v1::Subject {
                        kind: kind.to_string(),
                        name: "h3-ingress-public".into(),
                        namespace: Some(ns.to_string()),
                        api_group: None,
                    })
                    .collect(),
            ),
            ..Default::default()
        };
        assert!(legacy_binding_here(
            &binding(&[("ServiceAccount", "prod")], None),
            "prod"
        ));
        // The other installation's turn of the same binding: left alone.
        assert!(!legacy_binding_here(
            &binding(&[("ServiceAccount", "staging")], None),
            "prod"
        ));
        assert!(!legacy_binding_here(
            &binding(
                &[("ServiceAccount", "prod"), ("ServiceAccount", "staging")],
                None
            ),
            "prod"
        ));
        assert!(!legacy_binding_here(
            &binding(&[("User", "prod")], None),
            "prod"
        ));
        assert!(!legacy_binding_here(&binding(&[], None), "prod"));
        assert!(
            !legacy_binding_here(
                &binding(&[("ServiceAccount", "prod")], Some("prod")),
                "prod"
            ),
            "a release-scoped one is not legacy"
        );
    }

    #[test]
    fn the_previous_owner_waits_for_the_new_one_to_serve_every_node() {
        let mut l = crate::operator::resources::tests::listener(
            "l",
            serde_json::json!({"upstream": {"address": "a:443"}}),
        );
        assert_eq!(wanted(&l), DEFAULT_CONTROLLER_NAME);
        l.metadata.generation = Some(2);
        assert!(!new_owner_serving(&l), "no status yet");
        let status = |generation: i64, ready: i32, desired: i32| {
            Some(crate::api::Http3ListenerStatus {
                observed_generation: Some(generation),
                nodes: Some(NodesStatus {
                    desired,
                    ready,
                    summary: format!("{ready}/{desired}"),
                }),
                ..Default::default()
            })
        };
        l.status = status(1, 2, 2);
        assert!(!new_owner_serving(&l), "the old owner's status");
        l.status = status(2, 1, 2);
        assert!(!new_owner_serving(&l), "one node not ready");
        l.status = status(2, 0, 0);
        assert!(
            !new_owner_serving(&l),
            "its DaemonSet has not counted nodes yet"
        );
        l.status = status(2, 2, 2);
        assert!(new_owner_serving(&l));
    }
}
