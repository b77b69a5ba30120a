//! Version skew with the cluster, as the Kubernetes path meets it: a listener that carries
//! fields this binary does not know (the served CRD is newer) is read anyway, and said once.
//!
//! The operator reconciles each listener every minute and the data plane re-evaluates its
//! listener on every watch event, so "once" means once per listener and set of unknown
//! fields: a line when a listener first shows a set (or a different one), none while it stays
//! the same. The process writes at most [`LINES_PER_MINUTE`] such lines a minute; a listener
//! whose line was held back is reported at its next event.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use kube::ResourceExt;

use crate::api::Http3Listener;

/// Lines the unknown-field log may write per minute, all listeners together.
pub const LINES_PER_MINUTE: u32 = 10;
/// Listeners remembered; past this the memory starts over (each then logs once more).
const REMEMBERED: usize = 10_000;

/// Which set of unknown fields was last reported for each listener.
pub struct UnknownFieldLog {
    state: Mutex<LogState>,
}

#[derive(Default)]
struct LogState {
    reported: BTreeMap<String, Vec<String>>,
    minute: u64,
    lines: u32,
}

/// The process's log: listeners are read by whichever task, the line budget is the process's.
pub static LOG: UnknownFieldLog = UnknownFieldLog::new();

impl UnknownFieldLog {
    pub const fn new() -> Self {
        Self {
            state: Mutex::new(LogState {
                reported: BTreeMap::new(),
                minute: 0,
                lines: 0,
            }),
        }
    }

    /// Whether `fields` of listener `name` deserve a line at `minute` (minutes since the
    /// epoch); counts the line when they do. No fields: nothing to say, and a later set is new.
    pub fn first_sight(&self, name: &str, fields: &[String], minute: u64) -> bool {
        let mut s = self.state.lock().expect("not poisoned");
        if fields.is_empty() {
            s.reported.remove(name);
            return false;
        }
        if s.reported.get(name).is_some_and(|f| f == fields) {
            return false;
        }
        if s.minute != minute {
            s.minute = minute;
            s.lines = 0;
        }
        if s.lines >= LINES_PER_MINUTE {
            return false;
        }
        s.lines += 1;
        if s.reported.len() >= REMEMBERED && !s.reported.contains_key(name) {
            s.reported.clear();
        }
        s.reported.insert(name.to_string(), fields.to_vec());
        true
    }
}

impl Default for UnknownFieldLog {
    fn default() -> Self {
        Self::new()
    }
}

fn minute_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() / 60)
        .unwrap_or(0)
}

/// Logs (once, see the module) the fields of `listener` this binary ignores.
pub fn note_unknown_fields(listener: &Http3Listener) {
    let fields = listener.unknown_fields();
    if LOG.first_sight(&listener.name_any(), &fields, minute_now()) {
        tracing::warn!(
            listener = %listener.name_any(),
            fields = %fields.join(", "),
            version = crate::version::VERSION,
            "the Http3Listener has fields this h3-ingress does not know; they are ignored. The \
             served CRD is newer than this binary: upgrade the operator (its data plane follows)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(paths: &[&str]) -> Vec<String> {
        paths.iter().map(|p| p.to_string()).collect()
    }

    #[test]
    fn each_listener_and_field_set_is_said_once() {
        let log = UnknownFieldLog::new();
        let a = f(&["spec.upstream.futureSetting"]);
        assert!(log.first_sight("l1", &a, 1));
        assert!(!log.first_sight("l1", &a, 1), "same set again");
        assert!(!log.first_sight("l1", &a, 500), "same set, much later");
        assert!(log.first_sight("l2", &a, 500), "another listener");
        let b = f(&["spec.upstream.futureSetting", "spec.x"]);
        assert!(log.first_sight("l1", &b, 500), "a different set");
        assert!(!log.first_sight("l1", &[], 500), "nothing unknown: no line");
        assert!(log.first_sight("l1", &b, 500), "the set came back");
    }

    #[test]
    fn lines_are_bounded_per_minute_and_held_back_ones_come_later() {
        let log = UnknownFieldLog::new();
        let a = f(&["spec.y"]);
        let said = (0..25)
            .filter(|i| log.first_sight(&format!("l{i}"), &a, 7))
            .count();
        assert_eq!(said, LINES_PER_MINUTE as usize);
        assert!(!log.first_sight("l24", &a, 7));
        assert!(log.first_sight("l24", &a, 8), "next minute");
        assert!(!log.first_sight("l0", &a, 8), "already said");
    }
}
