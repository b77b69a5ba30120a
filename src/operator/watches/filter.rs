//! Watch events reduced to the ones that matter: [`ChangeFilter`] passes an object only when
//! the part of it a consumer reads changed. Shared by the operator's triggers
//! ([`super`]) and the Gateway API watches ([`super::gateway`]), so neither imports the other.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use futures_util::{future, Stream, StreamExt};
use kube::runtime::watcher;
use kube::Resource;

/// Identity of a watched object: a recreated object (new uid) is a new object.
type ObjKey = (Option<String>, String, Option<String>);

fn obj_key<K: Resource>(o: &K) -> ObjKey {
    let m = o.meta();
    (
        m.namespace.clone(),
        m.name.clone().unwrap_or_default(),
        m.uid.clone(),
    )
}

/// The annotation `kubectl apply` keeps the whole last object in: never read here.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

pub fn hash_of(v: &impl Hash) -> u64 {
    let mut h = DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// Passes a watched object only when its key (what a reconcile reads from it) changed since
/// the last event for it; deletions always pass. After a relist, objects not seen again are
/// forgotten. Pure, so the filtering is tested without a watch.
pub struct ChangeFilter<K> {
    key: fn(&K) -> u64,
    seen: HashMap<ObjKey, u64>,
    relisting: Option<HashSet<ObjKey>>,
}

impl<K: Resource> ChangeFilter<K> {
    /// How many objects the filter remembers (one entry per live object).
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }

    pub fn new(key: fn(&K) -> u64) -> Self {
        Self {
            key,
            seen: HashMap::new(),
            relisting: None,
        }
    }

    /// The object the event carries, when it should trigger.
    pub fn accept(&mut self, ev: watcher::Event<K>) -> Option<K> {
        match ev {
            watcher::Event::Init => {
                self.relisting = Some(HashSet::new());
                None
            }
            watcher::Event::InitDone => {
                if let Some(listed) = self.relisting.take() {
                    self.seen.retain(|k, _| listed.contains(k));
                }
                None
            }
            watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                let k = obj_key(&o);
                if let Some(listed) = &mut self.relisting {
                    listed.insert(k.clone());
                }
                let value = (self.key)(&o);
                (self.seen.insert(k, value) != Some(value)).then_some(o)
            }
            watcher::Event::Delete(o) => {
                self.seen.remove(&obj_key(&o));
                Some(o)
            }
        }
    }
}

/// A watch event stream reduced to the objects [`ChangeFilter`] passes (errors pass through,
/// for the controller to log and back off).
pub fn changes<K, S>(stream: S, key: fn(&K) -> u64) -> impl Stream<Item = Result<K, watcher::Error>>
where
    K: Resource,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    stream
        .scan(ChangeFilter::new(key), |f, ev| {
            future::ready(Some(match ev {
                Ok(e) => f.accept(e).map(Ok),
                Err(e) => Some(Err(e)),
            }))
        })
        .filter_map(future::ready)
}

/// How often one cause of watch failure is logged; the watches retry with backoff meanwhile,
/// and a 403 while RBAC is pending would otherwise be logged on every retry of every watch.
pub const ERROR_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

/// Logs watch failures at most once per cause per [`ERROR_LOG_INTERVAL`], with how many were
/// left out since. A cause is the watched kind and the kind of failure (the HTTP status and
/// reason the API server gave, or the transport's error kind), not the object's name, so
/// thousands of watches failing the same way make one line a minute.
#[derive(Default)]
pub struct ErrorLog {
    last: std::sync::Mutex<HashMap<String, (std::time::Instant, u64)>>,
}

/// The cause of a watch failure, without names or messages that vary per object.
pub fn cause(what: &str, e: &watcher::Error) -> String {
    let kind = match e {
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => match k {
            kube::Error::Api(s) => format!("HTTP {} {}", s.code, s.reason),
            other => transport_kind(other),
        },
        watcher::Error::WatchError(s) => format!("watch error {} {}", s.code, s.reason),
        watcher::Error::NoResourceVersion => "no resourceVersion".to_string(),
    };
    format!("{what}: {kind}")
}

/// A transport failure's kind: its variant, without the message (which names hosts and ports).
fn transport_kind(e: &kube::Error) -> String {
    let text = format!("{e:?}");
    text.split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_string()
}

impl ErrorLog {
    /// Logs `e` unless its cause was logged within the interval (then only counts it).
    pub fn warn(&self, what: &str, e: &watcher::Error) {
        if let Some(left_out) = self.admit(cause(what, e), std::time::Instant::now()) {
            tracing::warn!(watch = what, error = %e, left_out, "watch failed (retrying with backoff)");
        }
    }

    /// `Some(count left out since the last line)` when a line for `cause` is due at `now`.
    pub fn admit(&self, cause: String, now: std::time::Instant) -> Option<u64> {
        let mut last = self.last.lock().expect("not poisoned");
        match last.get_mut(&cause) {
            Some((at, left_out)) if now.duration_since(*at) < ERROR_LOG_INTERVAL => {
                *left_out += 1;
                None
            }
            Some((at, left_out)) => {
                let n = *left_out;
                *at = now;
                *left_out = 0;
                Some(n)
            }
            None => {
                last.insert(cause, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_cause_per_interval_with_the_count_left_out() {
        let log = ErrorLog::default();
        let t0 = std::time::Instant::now();
        assert_eq!(log.admit("Secret: HTTP 403 Forbidden".into(), t0), Some(0));
        for _ in 0..1000 {
            assert_eq!(log.admit("Secret: HTTP 403 Forbidden".into(), t0), None);
        }
        // Another cause is its own line.
        assert_eq!(log.admit("Secret: HTTP 404 NotFound".into(), t0), Some(0));
        let later = t0 + ERROR_LOG_INTERVAL;
        assert_eq!(
            log.admit("Secret: HTTP 403 Forbidden".into(), later),
            Some(1000)
        );
        assert_eq!(log.admit("Secret: HTTP 403 Forbidden".into(), later), None);
    }

    #[test]
    fn causes_leave_out_object_names() {
        let forbidden = |name: &str| {
            watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
                kube::core::Status::failure(
                    &format!("secrets \"{name}\" is forbidden"),
                    "Forbidden",
                )
                .with_code(403),
            )))
        };
        assert_eq!(
            cause("Secret", &forbidden("a")),
            cause("Secret", &forbidden("b"))
        );
        assert_eq!(
            cause("Secret", &forbidden("a")),
            "Secret: HTTP 403 Forbidden"
        );
    }
}
