//! Why a data plane pod is not ready, in the kubelet's own words: its container's current
//! waiting reason (`CrashLoopBackOff`, `ImagePullBackOff`, ...) and how its last run ended
//! (`OOMKilled`, `Error` with the exit code). Users otherwise see only "1 of 2 pods ready"
//! in the listener's status and must find the pod to learn that a memory limit is too small
//! or a pull secret is missing. Pure: reads a pod's status, no I/O.

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use k8s_openapi::jiff::Timestamp;

use super::text;

/// At most this many characters of the kubelet's waiting message (an image pull error names
/// the registry and the reason; longer text adds nothing a status needs).
pub const MAX_WAITING_MESSAGE: usize = 160;

/// What the kubelet says about one container when it is not simply running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerTrouble {
    /// `waiting: REASON (MESSAGE)`, unless it is the normal way to start.
    pub waiting: Option<String>,
    pub last_exit: Option<LastExit>,
    pub restarts: i32,
}

/// How the container's last finished run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastExit {
    /// The kubelet's reason: `OOMKilled`, `Error`, `Completed`, ...
    pub reason: String,
    pub exit_code: i32,
    pub finished: Option<Timestamp>,
}

impl ContainerTrouble {
    /// One line: `waiting: CrashLoopBackOff (...), last exit: OOMKilled (exit code 137), 3 restarts`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(w) = &self.waiting {
            parts.push(w.clone());
        }
        if let Some(e) = &self.last_exit {
            parts.push(e.describe());
        }
        if self.restarts > 0 {
            let s = if self.restarts == 1 { "" } else { "s" };
            parts.push(format!("{} restart{s}", self.restarts));
        }
        parts.join(", ")
    }
}

impl LastExit {
    pub fn describe(&self) -> String {
        let mut s = format!("last exit: {} (exit code {})", self.reason, self.exit_code);
        if let Some(t) = self.finished {
            // Absolute, not "N s ago": a status message that changed on every look would be
            // written on every reconcile.
            s.push_str(&format!(" at {}", t.strftime("%Y-%m-%dT%H:%M:%SZ")));
        }
        s
    }
}

/// What the kubelet says about `container`, or `None` when it has nothing to report
/// (running and never restarted, or no status yet).
pub fn container_trouble(status: &PodStatus, container: &str) -> Option<ContainerTrouble> {
    let c = status
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)?;
    let t = ContainerTrouble {
        waiting: waiting(c),
        last_exit: last_exit(c),
        restarts: c.restart_count,
    };
    (t.waiting.is_some() || t.last_exit.is_some() || t.restarts > 0).then_some(t)
}

fn waiting(c: &ContainerStatus) -> Option<String> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    let reason = w.reason.as_deref().unwrap_or("Waiting");
    // ContainerCreating and PodInitializing are the normal way to start, not trouble.
    if matches!(reason, "ContainerCreating" | "PodInitializing") {
        return None;
    }
    Some(match w.message.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => format!("waiting: {reason} ({})", shorten(m)),
        None => format!("waiting: {reason}"),
    })
}

/// The run that ended last. During a restart back-off the kubelet reports that run as the
/// current state (`terminated`) and the one before it as `lastState`; once the container
/// waits or runs again, the run is in `lastState`.
fn last_exit(c: &ContainerStatus) -> Option<LastExit> {
    let current = c.state.as_ref().and_then(|s| s.terminated.as_ref());
    let t = current.or_else(|| c.last_state.as_ref()?.terminated.as_ref())?;
    Some(LastExit {
        reason: t.reason.clone().unwrap_or_else(|| "Terminated".into()),
        exit_code: t.exit_code,
        finished: t.finished_at.as_ref().map(|t| t.0),
    })
}

fn shorten(s: &str) -> String {
    text::cut(s.trim(), MAX_WAITING_MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn status(c: ContainerStatus) -> PodStatus {
        PodStatus {
            container_statuses: Some(vec![c]),
            ..Default::default()
        }
    }

    fn container(name: &str) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ..Default::default()
        }
    }

    fn waiting_state(reason: &str, message: Option<&str>) -> Option<ContainerState> {
        Some(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.into()),
                message: message.map(Into::into),
            }),
            ..Default::default()
        })
    }

    #[test]
    fn oom_killed_crash_loop_says_reason_exit_code_and_restarts() {
        let mut c = container("h3-ingress");
        c.restart_count = 3;
        c.state = waiting_state("CrashLoopBackOff", Some("back-off 40s restarting failed"));
        c.last_state = terminated("OOMKilled", 137, "2026-12-02T16:30:05Z");
        let t = container_trouble(&status(c), "h3-ingress").unwrap();
        assert_eq!(
            t.describe(),
            "waiting: CrashLoopBackOff (back-off 40s restarting failed), \
             last exit: OOMKilled (exit code 137) at 2026-12-02T16:30:05Z, 3 restarts"
        );
        assert_eq!(t.last_exit.unwrap().reason, "OOMKilled");
    }

    fn terminated(reason: &str, code: i32, at: &str) -> Option<ContainerState> {
        Some(ContainerState {
            terminated: Some(ContainerStateTerminated {
                reason: Some(reason.into()),
                exit_code: code,
                finished_at: Some(Time(at.parse().unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// What a real kubelet (v1.37) reports for the whole back-off after an exit: the run that
    /// just ended as the current state, the one before it as lastState.
    #[test]
    fn during_back_off_the_run_that_just_ended_is_the_last_exit() {
        let mut c = container("h3-ingress");
        c.restart_count = 2;
        c.state = terminated("OOMKilled", 137, "2026-12-02T16:31:00Z");
        c.last_state = terminated("Error", 1, "2026-12-02T16:30:05Z");
        let t = container_trouble(&status(c), "h3-ingress").unwrap();
        assert_eq!(
            t.describe(),
            "last exit: OOMKilled (exit code 137) at 2026-12-02T16:31:00Z, 2 restarts"
        );
    }

    #[test]
    fn image_pull_error_message_is_kept_but_bounded() {
        let mut c = container("h3-ingress");
        let long = format!("failed to pull: {}", "x".repeat(400));
        c.state = waiting_state("ErrImagePull", Some(&long));
        let t = container_trouble(&status(c), "h3-ingress")
            .unwrap()
            .describe();
        assert!(
            t.starts_with("waiting: ErrImagePull (failed to pull: xxx"),
            "{t}"
        );
        assert!(t.len() < MAX_WAITING_MESSAGE + 40, "{}", t.len());
        assert!(t.ends_with("...)"), "{t}");
    }

    #[test]
    fn starting_or_healthy_containers_and_other_containers_say_nothing() {
        let mut starting = container("h3-ingress");
        starting.state = waiting_state("ContainerCreating", None);
        assert_eq!(container_trouble(&status(starting), "h3-ingress"), None);
        assert_eq!(
            container_trouble(&status(container("h3-ingress")), "h3-ingress"),
            None
        );
        let mut other = container("tune");
        other.restart_count = 2;
        assert_eq!(container_trouble(&status(other), "h3-ingress"), None);
        assert_eq!(container_trouble(&PodStatus::default(), "h3-ingress"), None);
    }

    #[test]
    fn one_restart_is_singular() {
        let mut c = container("h3-ingress");
        c.restart_count = 1;
        assert_eq!(
            container_trouble(&status(c), "h3-ingress").map(|t| t.describe()),
            Some("1 restart".to_string())
        );
    }
}
