//! Watch events reduced to the ones that matter: [`ChangeFilter`] passes an object only when
//! the part of it a consumer reads changed. Shared by the operator's triggers and the Gateway
//! API watches (which both the operator and tools read), so neither imports the other.

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
