//! Which Kubernetes Events a status change deserves. Pure: compares the stored status with the
//! next one; the controller publishes the result on the listener and on the Ingress,
//! HTTPRoute or annotated Gateway the host came from.

use std::collections::BTreeMap;

use crate::api::{conditions, host_states, reasons, HostOrigin, HostStatus, Http3ListenerStatus};

/// Event reasons (besides the per-host reasons of `api::reasons`, which are reused).
pub mod event_reasons {
    pub const HTTP3_ENABLED: &str = "Http3Enabled";
    pub const HTTP3_DISABLED: &str = "Http3Disabled";
    /// Host transitions beyond those that got events of their own.
    pub const HOSTS_CHANGED: &str = "HostsChanged";
}

/// The `action` of the events about the listener as a whole.
pub const ACTION: &str = "Reconcile";
/// The API server's limit on an Event's `action`.
pub const MAX_ACTION: usize = 128;

/// The `action` of an event: `Serve HOST` for one about a host, else [`ACTION`]. kube's
/// recorder counts an event with the reason, action and object of an earlier one as a repeat
/// of it (its note is not compared), so the host in the action gives each host its own
/// series: a second host refused for the same reason on the same Ingress is an event of its
/// own, naming it, not a count on the first one's.
pub fn action(host: Option<&str>) -> String {
    match host {
        Some(h) => super::text::cut(&format!("Serve {h}"), MAX_ACTION),
        None => ACTION.to_string(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Listener,
    /// `namespace/name` of an Ingress.
    Ingress(String),
    /// `namespace/name` of an HTTPRoute.
    HttpRoute(String),
    /// `namespace/name` of a Gateway (for hosts of an annotated Gateway, not of its routes).
    Gateway(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedEvent {
    pub target: Target,
    /// The host it is about, if any (see [`action`]).
    pub host: Option<String>,
    pub warning: bool,
    pub reason: String,
    pub note: String,
}

/// A host entry's identity: its name and where it came from.
type HostKey = (String, HostOrigin);

fn by_key(hosts: Option<&[HostStatus]>) -> BTreeMap<HostKey, &HostStatus> {
    hosts
        .map(|hosts| {
            hosts
                .iter()
                .map(|h| ((h.name.clone(), h.origin.clone()), h))
                .collect()
        })
        .unwrap_or_default()
}

/// The object the host came from, if any: its Ingress, HTTPRoute, or annotated Gateway.
fn source_target(h: &HostStatus) -> Option<Target> {
    let o = &h.origin;
    match (&o.ingress, &o.http_route, &o.gateway) {
        (Some(i), _, _) => Some(Target::Ingress(i.clone())),
        (None, Some(r), _) => Some(Target::HttpRoute(r.clone())),
        (None, None, Some(g)) => Some(Target::Gateway(g.clone())),
        (None, None, None) => None,
    }
}

/// The event on the listener and on the object the host came from.
fn both(out: &mut Vec<PlannedEvent>, h: &HostStatus, warning: bool, reason: &str, note: String) {
    out.push(PlannedEvent {
        target: Target::Listener,
        host: Some(h.name.clone()),
        warning,
        reason: reason.to_string(),
        note: note.clone(),
    });
    if let Some(target) = source_target(h) {
        out.push(PlannedEvent {
            target,
            host: Some(h.name.clone()),
            warning,
            reason: reason.to_string(),
            note,
        });
    }
}

/// At most this many host transitions get events of their own per reconcile; the rest are
/// summed up in one event on the listener, so 10,000 hosts appearing at once cost a few
/// events, not 20,000.
pub const MAX_HOST_EVENTS: usize = 20;

/// The hosts the next status is compared with for per-host events: those this operator last
/// published (`remembered`); none at all for a listener never given a status (`published`
/// false), so its first reconcile announces every host it refuses or serves; and unknown
/// (`None`, no per-host event) after an operator restart, when the listener has a status but
/// memory is empty: replaying an event per host on every restart would be noise.
pub fn hosts_before(remembered: Option<&[HostStatus]>, published: bool) -> Option<&[HostStatus]> {
    match (remembered, published) {
        (Some(hosts), _) => Some(hosts),
        (None, false) => Some(&[]),
        (None, true) => None,
    }
}

/// Events for host transitions between `old_hosts` (see [`hosts_before`]: empty for a new
/// listener, whose every host is then a transition; `None` after an operator restart, when no
/// per-host event is planned) and `new_hosts`, and for condition transitions between the
/// stored status `old` and `new`.
///
/// `ConfigPending` is the normal gap between "can be served" and "a pod serves it" and would
/// make every rollout noisy, so it produces no event of its own.
pub fn plan(
    old_hosts: Option<&[HostStatus]>,
    new_hosts: &[HostStatus],
    old: Option<&Http3ListenerStatus>,
    new: &Http3ListenerStatus,
) -> Vec<PlannedEvent> {
    let mut out = match old_hosts {
        Some(before) => host_events(before, new_hosts),
        None => Vec::new(),
    };
    out.extend(condition_events(old, new));
    out
}

/// Per-host transitions, at most [`MAX_HOST_EVENTS`] of them with their own events.
fn host_events(old: &[HostStatus], new: &[HostStatus]) -> Vec<PlannedEvent> {
    let mut out = Vec::new();
    let mut transitions = 0usize;
    let before = by_key(Some(old));
    let after = by_key(Some(new));
    let mut event = |out: &mut Vec<PlannedEvent>, h: &HostStatus, warning, reason: &str, note| {
        transitions += 1;
        if transitions <= MAX_HOST_EVENTS {
            both(out, h, warning, reason, note);
        }
    };

    for (key, h) in &after {
        let prev = before.get(key);
        let was_serving = prev.is_some_and(|p| p.state == host_states::SERVING);
        if h.state == host_states::SERVING {
            if !was_serving {
                event(
                    &mut out,
                    h,
                    false,
                    event_reasons::HTTP3_ENABLED,
                    format!("HTTP/3 enabled for {}", h.name),
                );
            }
            // A value of its policy not carried: said once per change of it. (A host served
            // with the last good certificate, `SecretUnreadable`, has the read error as its
            // message: the Degraded condition says that.)
            if h.reason == reasons::SERVING
                && !h.message.is_empty()
                && prev.is_none_or(|p| p.message != h.message)
            {
                let note = format!("HTTP/3 serves {} without: {}", h.name, h.message);
                event(&mut out, h, true, reasons::POLICY_VALUE_IGNORED, note);
            }
        } else if h.reason != reasons::CONFIG_PENDING && prev.is_none_or(|p| p.reason != h.reason) {
            let note = if h.message.is_empty() {
                format!("HTTP/3 not served for {}: {}", h.name, h.reason)
            } else {
                format!("HTTP/3 not served for {}: {}", h.name, h.message)
            };
            event(&mut out, h, true, &h.reason, note);
        }
    }
    for (key, h) in &before {
        if !after.contains_key(key) && h.state == host_states::SERVING {
            event(
                &mut out,
                h,
                false,
                event_reasons::HTTP3_DISABLED,
                format!("HTTP/3 disabled for {}", h.name),
            );
        }
    }

    if transitions > MAX_HOST_EVENTS {
        out.push(PlannedEvent {
            target: Target::Listener,
            host: None,
            warning: false,
            reason: event_reasons::HOSTS_CHANGED.to_string(),
            note: format!(
                "{} more hosts changed state (the listener's status has the counts)",
                transitions - MAX_HOST_EVENTS
            ),
        });
    }
    out
}

/// Condition transitions: bad states warn, and Ready's good state is announced.
fn condition_events(
    old: Option<&Http3ListenerStatus>,
    new: &Http3ListenerStatus,
) -> Vec<PlannedEvent> {
    let mut out = Vec::new();
    for c in &new.conditions {
        let prev = old.and_then(|o| o.conditions.iter().find(|p| p.type_ == c.type_));
        let changed = prev.is_none_or(|p| p.status != c.status || p.reason != c.reason);
        // PublicRoots says what the certificates a user chose are, ClientAddress how the
        // listener was set up, not something that went wrong: the status and `kubectl
        // h3-ingress status` carry them, no event (the hosts held back get their own). Nor
        // does DNS publishing the user switched off.
        let switched_off = c.type_ == conditions::DNS_ADVERTISED && c.reason == reasons::DISABLED;
        if !changed
            || [conditions::PUBLIC_ROOTS, conditions::CLIENT_ADDRESS].contains(&c.type_.as_str())
            || switched_off
        {
            continue;
        }
        // Degraded=True and the other conditions False are the bad states; Unknown (no
        // reports yet) and the good states get Normal events, and only Ready's good state
        // is worth one.
        let bad = if c.type_ == conditions::DEGRADED {
            c.status == "True"
        } else {
            c.status == "False"
        };
        if bad || (c.type_ == conditions::READY && c.status == "True") {
            out.push(PlannedEvent {
                target: Target::Listener,
                host: None,
                warning: bad,
                reason: c.reason.clone(),
                note: if c.message.is_empty() {
                    format!("{} is {}", c.type_, c.status)
                } else {
                    format!("{} is {}: {}", c.type_, c.status, c.message)
                },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn host(name: &str, ingress: Option<&str>, state: &str, reason: &str, msg: &str) -> HostStatus {
        HostStatus {
            name: name.into(),
            origin: HostOrigin {
                ingress: ingress.map(str::to_string),
                ..Default::default()
            },
            state: state.into(),
            reason: reason.into(),
            message: msg.into(),
            ..Default::default()
        }
    }

    fn cond(t: &str, s: &str, r: &str) -> Condition {
        Condition {
            type_: t.into(),
            status: s.into(),
            reason: r.into(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    fn status(hosts: Vec<HostStatus>, conds: Vec<Condition>) -> Http3ListenerStatus {
        Http3ListenerStatus {
            hosts,
            conditions: conds,
            ..Default::default()
        }
    }

    /// `plan` with hosts before and after taken from the statuses (none before: nothing).
    fn p(old: Option<&Http3ListenerStatus>, new: &Http3ListenerStatus) -> Vec<PlannedEvent> {
        let before = old.map(|o| o.hosts.as_slice()).unwrap_or_default();
        plan(Some(before), &new.hosts, old, new)
    }

    fn summary(events: &[PlannedEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                let t = match &e.target {
                    Target::Listener => "listener".to_string(),
                    Target::Ingress(i) => i.clone(),
                    Target::HttpRoute(r) => format!("httproute {r}"),
                    Target::Gateway(g) => format!("gateway {g}"),
                };
                format!(
                    "{t} {} {}: {}",
                    if e.warning { "W" } else { "N" },
                    e.reason,
                    e.note
                )
            })
            .collect()
    }

    #[test]
    fn each_host_has_its_own_action_so_its_events_are_its_own_series() {
        assert_eq!(action(None), ACTION);
        assert_eq!(action(Some("a.example.com")), "Serve a.example.com");
        let long = format!("{}.example.com", "a".repeat(300));
        assert!(action(Some(&long)).len() <= MAX_ACTION);
        let new = status(
            vec![
                host(
                    "a.example.com",
                    Some("shop/web"),
                    "NotServing",
                    reasons::SECRET_NOT_FOUND,
                    "x",
                ),
                host(
                    "b.example.com",
                    Some("shop/web"),
                    "NotServing",
                    reasons::SECRET_NOT_FOUND,
                    "y",
                ),
            ],
            vec![],
        );
        let planned = plan(Some(&[]), &new.hosts, None, &new);
        let hosts: Vec<Option<&str>> = planned
            .iter()
            .filter(|e| e.reason == reasons::SECRET_NOT_FOUND)
            .map(|e| e.host.as_deref())
            .collect();
        assert_eq!(
            hosts,
            [
                Some("a.example.com"),
                Some("a.example.com"),
                Some("b.example.com"),
                Some("b.example.com")
            ]
        );
    }

    #[test]
    fn gateway_api_hosts_are_announced_on_their_httproute_or_annotated_gateway() {
        let routed = HostStatus {
            origin: HostOrigin::gateway(Some("apps/web".into()), "infra/gw".into(), "https".into()),
            ..host(
                "a.example.com",
                None,
                "NotServing",
                reasons::REF_NOT_PERMITTED,
                "no grant",
            )
        };
        let from_gateway = HostStatus {
            origin: HostOrigin::gateway(None, "infra/gw".into(), "https".into()),
            ..host("b.example.com", None, "Serving", reasons::SERVING, "")
        };
        let new = status(vec![routed.clone(), from_gateway], vec![]);
        assert_eq!(
            summary(&p(None, &new)),
            [
                "listener W RefNotPermitted: HTTP/3 not served for a.example.com: no grant",
                "httproute apps/web W RefNotPermitted: HTTP/3 not served for a.example.com: no grant",
                "listener N Http3Enabled: HTTP/3 enabled for b.example.com",
                "gateway infra/gw N Http3Enabled: HTTP/3 enabled for b.example.com",
            ]
        );
        // The same host through another listener section is another entry.
        let moved = HostStatus {
            origin: HostOrigin::gateway(
                Some("apps/web".into()),
                "infra/gw".into(),
                "https-2".into(),
            ),
            ..routed
        };
        let after = status(vec![moved], vec![]);
        let events = summary(&p(Some(&new), &after));
        assert!(events.contains(&"httproute apps/web W RefNotPermitted: HTTP/3 not served for a.example.com: no grant".to_string()), "{events:?}");
    }

    #[test]
    fn host_transitions_are_announced_on_the_listener_and_the_ingress() {
        let old = status(
            vec![
                host(
                    "a.example.com",
                    Some("default/web"),
                    "NotServing",
                    reasons::CONFIG_PENDING,
                    "",
                ),
                host(
                    "b.example.com",
                    Some("default/web"),
                    "Serving",
                    reasons::SERVING,
                    "",
                ),
                host("c.example.com", None, "Serving", reasons::SERVING, ""),
            ],
            vec![],
        );
        let new = status(
            vec![
                host(
                    "a.example.com",
                    Some("default/web"),
                    "Serving",
                    reasons::SERVING,
                    "",
                ),
                host(
                    "b.example.com",
                    Some("default/web"),
                    "NotServing",
                    reasons::SECRET_NOT_FOUND,
                    "Secret default/x not found",
                ),
            ],
            vec![],
        );
        assert_eq!(
            summary(&p(Some(&old), &new)),
            [
                "listener N Http3Enabled: HTTP/3 enabled for a.example.com",
                "default/web N Http3Enabled: HTTP/3 enabled for a.example.com",
                "listener W SecretNotFound: HTTP/3 not served for b.example.com: Secret default/x not found",
                "default/web W SecretNotFound: HTTP/3 not served for b.example.com: Secret default/x not found",
                "listener N Http3Disabled: HTTP/3 disabled for c.example.com",
            ]
        );
        // Nothing changed, nothing said.
        assert!(p(Some(&new), &new).is_empty());
    }

    #[test]
    fn a_policy_value_not_carried_is_said_once_per_change() {
        let note = "proxy-read-timeout: \"ten\" on Ingress default/web is not a whole number";
        let served = |msg: &str| {
            status(
                vec![host(
                    "a.example.com",
                    Some("default/web"),
                    "Serving",
                    reasons::SERVING,
                    msg,
                )],
                vec![],
            )
        };
        let before = served("");
        let after = served(note);
        assert_eq!(
            summary(&p(Some(&before), &after)),
            [
                format!(
                    "listener W PolicyValueIgnored: HTTP/3 serves a.example.com without: {note}"
                ),
                format!(
                    "default/web W PolicyValueIgnored: HTTP/3 serves a.example.com without: {note}"
                ),
            ]
        );
        assert!(p(Some(&after), &after).is_empty());
        // A held-back host is announced with its reason, once.
        let held = status(
            vec![host(
                "a.example.com",
                Some("default/web"),
                "NotServing",
                reasons::CLIENT_ADDRESS_POLICY,
                "nginx.ingress.kubernetes.io/whitelist-source-range: ...",
            )],
            vec![],
        );
        let events = summary(&p(Some(&before), &held));
        assert_eq!(events.len(), 2);
        assert!(events[0]
            .starts_with("listener W ClientAddressPolicy: HTTP/3 not served for a.example.com"));
        assert!(p(Some(&held), &held).is_empty());
    }

    #[test]
    fn pending_hosts_are_quiet() {
        let new = status(
            vec![host(
                "a.example.com",
                Some("default/web"),
                "NotServing",
                reasons::CONFIG_PENDING,
                "",
            )],
            vec![],
        );
        assert!(p(None, &new).is_empty());
        let was = status(
            vec![host(
                "a.example.com",
                Some("default/web"),
                "Serving",
                reasons::SERVING,
                "",
            )],
            vec![],
        );
        assert!(p(Some(&was), &new).is_empty());
    }

    #[test]
    fn many_host_transitions_are_summed_up_and_a_restart_announces_nothing() {
        let hosts: Vec<HostStatus> = (0..1000)
            .map(|i| {
                host(
                    &format!("h{i}.test"),
                    Some("default/web"),
                    "Serving",
                    reasons::SERVING,
                    "",
                )
            })
            .collect();
        let new = status(hosts.clone(), vec![]);
        let events = p(None, &new);
        // Two events (listener and Ingress) for each of the first hosts, one summary.
        assert_eq!(events.len(), 2 * MAX_HOST_EVENTS + 1);
        assert_eq!(
            events.last().unwrap().note,
            format!(
                "{} more hosts changed state (the listener's status has the counts)",
                1000 - MAX_HOST_EVENTS
            )
        );
        // After an operator restart nothing is known of the hosts before: no host event.
        assert!(plan(None, &hosts, None, &new).is_empty());
    }

    #[test]
    fn a_new_listener_compares_with_no_hosts_a_restart_with_unknown_ones() {
        let known = [host("a.example.com", None, "Serving", reasons::SERVING, "")];
        // Never published, nothing remembered: a new listener.
        assert_eq!(hosts_before(None, false), Some(&[][..]));
        // Published, nothing remembered: the operator restarted.
        assert_eq!(hosts_before(None, true), None);
        // Remembered: the last published hosts, whatever the listener carries.
        assert_eq!(hosts_before(Some(&known), true), Some(&known[..]));
        assert_eq!(hosts_before(Some(&known), false), Some(&known[..]));
    }

    #[test]
    fn a_new_listener_announces_its_hosts_and_a_restart_does_not() {
        let hosts = vec![
            host(
                "a.example.com",
                Some("shop/web"),
                "Serving",
                reasons::SERVING,
                "",
            ),
            host(
                "missing.example.com",
                Some("shop/web"),
                "NotServing",
                reasons::SECRET_NOT_FOUND,
                "Secret shop/missing not found",
            ),
        ];
        let new = status(hosts.clone(), vec![]);
        let first = plan(hosts_before(None, false), &hosts, None, &new);
        assert_eq!(
            summary(&first),
            [
                "listener N Http3Enabled: HTTP/3 enabled for a.example.com",
                "shop/web N Http3Enabled: HTTP/3 enabled for a.example.com",
                "listener W SecretNotFound: HTTP/3 not served for missing.example.com: Secret shop/missing not found",
                "shop/web W SecretNotFound: HTTP/3 not served for missing.example.com: Secret shop/missing not found",
            ]
        );
        // The same hosts after a restart, the status already published: nothing to say.
        let restarted = plan(hosts_before(None, true), &hosts, Some(&new), &new);
        assert!(restarted.is_empty(), "{restarted:?}");
        // Remembered: only what changed since.
        let served = vec![
            hosts[0].clone(),
            host(
                "missing.example.com",
                Some("shop/web"),
                "Serving",
                reasons::SERVING,
                "",
            ),
        ];
        let next = status(served.clone(), vec![]);
        assert_eq!(
            summary(&plan(
                hosts_before(Some(&hosts), true),
                &served,
                Some(&new),
                &next
            )),
            [
                "listener N Http3Enabled: HTTP/3 enabled for missing.example.com",
                "shop/web N Http3Enabled: HTTP/3 enabled for missing.example.com",
            ]
        );
    }

    #[test]
    fn ten_thousand_hosts_on_a_new_listener_cost_a_few_events() {
        let hosts: Vec<HostStatus> = (0..10_000)
            .map(|i| {
                let name = format!("h{i}.test");
                match i % 2 {
                    0 => host(&name, Some("default/web"), "Serving", reasons::SERVING, ""),
                    _ => host(
                        &name,
                        Some("default/web"),
                        "NotServing",
                        reasons::SECRET_NOT_FOUND,
                        "",
                    ),
                }
            })
            .collect();
        let new = status(hosts.clone(), vec![]);
        let events = plan(hosts_before(None, false), &hosts, None, &new);
        // Listener and Ingress for each of the first hosts, then one summary on the listener.
        assert_eq!(events.len(), 2 * MAX_HOST_EVENTS + 1);
        let last = events.last().unwrap();
        assert_eq!(
            (&last.target, last.reason.as_str()),
            (&Target::Listener, event_reasons::HOSTS_CHANGED)
        );
        assert!(last
            .note
            .starts_with(&format!("{} more hosts", 10_000 - MAX_HOST_EVENTS)));
    }

    #[test]
    fn condition_transitions_warn_when_bad_and_announce_ready() {
        let old = status(
            vec![],
            vec![
                cond(conditions::READY, "False", reasons::PODS_NOT_READY),
                cond(conditions::BUFFERS_APPLIED, "Unknown", reasons::NO_REPORTS),
                cond(conditions::DEGRADED, "False", reasons::AS_EXPECTED),
            ],
        );
        let new = status(
            vec![],
            vec![
                cond(conditions::READY, "True", reasons::ALL_HOSTS_SERVING),
                cond(conditions::BUFFERS_APPLIED, "False", reasons::CLAMPED),
                cond(conditions::DEGRADED, "True", reasons::UDP_DROPS),
                cond(conditions::PUBLIC_ROOTS, "False", reasons::PRIVATE_ROOTS),
            ],
        );
        assert_eq!(
            summary(&p(Some(&old), &new)),
            [
                "listener N AllHostsServing: Ready is True",
                "listener W Clamped: BuffersApplied is False",
                "listener W UdpDrops: Degraded is True",
            ]
        );
        // Recovering buffers is not news; Degraded going back to normal is not either.
        assert_eq!(
            summary(&p(Some(&new), &old)),
            ["listener W PodsNotReady: Ready is False"]
        );
    }
}
