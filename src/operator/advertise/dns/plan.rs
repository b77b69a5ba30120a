//! What to change in a zone so that it holds an HTTPS record for exactly the hosts a listener
//! serves over HTTP/3, without ever touching a record someone else made. Pure.
//!
//! Ownership is marked as external-dns marks it: beside each HTTPS record it writes, the
//! operator keeps a TXT record at a registry name ([`registry_name`]) holding its owner text
//! ([`Owner::text`]). A record is created only where neither exists, and replaced or deleted
//! only while the registry record is exactly ours. Both are RFC 2136 prerequisites, so the
//! server checks them atomically with the change, even when someone else writes the zone at
//! the same moment. Changes go in batches ([`batches`]); a batch whose prerequisites fail
//! changes nothing, and the caller splits it ([`halves`]) to find the host that failed.

use std::collections::BTreeMap;

use super::wire::{Name, Record, Update, WireError, TYPE_HTTPS, TYPE_TXT};

/// The first label of every registry name.
pub const REGISTRY_LABEL: &str = "_h3-ingress";
/// The registry label of a wildcard host (`*` can only be a name's first label).
pub const REGISTRY_WILDCARD_LABEL: &str = "_h3-ingress-wildcard";
/// Host changes per UPDATE message: about 300 bytes each, so a batch stays far below a DNS
/// message's 64 KiB, and one refused prerequisite costs a few splits.
pub const BATCH: usize = 64;
/// What the records advertise: HTTP/3, and HTTP/2 for a client that cannot use it (RFC 9460
/// section 7.1.2: the list is what the origin supports, and we serve h3 beside the TCP
/// ingress's h2).
pub const ALPN: [&str; 2] = ["h3", "h2"];

/// Who writes: the operator (its controller name: two installs never take each other's
/// records) and the listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub id: String,
    pub listener: String,
}

impl Owner {
    /// The registry record's text, in external-dns's `key=value,...` style.
    pub fn text(&self) -> String {
        format!(
            "heritage=h3-ingress,h3-ingress/owner={},h3-ingress/resource=http3listener/{}",
            self.id, self.listener
        )
    }
}

/// Where the registry record of `host` lives: `_h3-ingress.HOST`, or
/// `_h3-ingress-wildcard.PARENT` for `*.PARENT`.
pub fn registry_name(host: &Name) -> Result<Name, WireError> {
    let text = host.to_string();
    match text.strip_prefix("*.") {
        Some(parent) => Name::parse(&format!("{REGISTRY_WILDCARD_LABEL}.{parent}")),
        None => host.child(REGISTRY_LABEL),
    }
}

/// The HTTPS record of a host served on UDP `port` (`port=` only when it is not 443).
pub fn record(host: &Name, port: u16, ttl: u32) -> Record {
    Record::https(host, ttl, &ALPN, (port != 443).then_some(port))
}

/// One host's change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Add the record where no HTTPS record and no registry record exist.
    Create(Record),
    /// Replace the HTTPS records of a host whose registry record is ours.
    Replace(Record),
    /// Remove the HTTPS records and our registry record of a host whose registry is ours.
    Delete(Name),
}

impl Op {
    pub fn host(&self) -> &Name {
        match self {
            Op::Create(r) | Op::Replace(r) => &r.name,
            Op::Delete(n) => n,
        }
    }
}

/// What the zone holds of ours, as far as the operator knows: per host, the record it wrote
/// (`None` when the registry says the host is ours but not what we wrote, as after a restart).
pub type Known = BTreeMap<Name, Option<Record>>;

/// The changes that make the zone hold `want` (host -> record) and nothing else of ours.
/// Nothing when the two agree: a zone at rest costs no update.
pub fn diff(want: &BTreeMap<Name, Record>, known: &Known) -> Vec<Op> {
    let mut ops = Vec::new();
    for (host, record) in want {
        match known.get(host) {
            None => ops.push(Op::Create(record.clone())),
            Some(Some(had)) if had == record => {}
            Some(_) => ops.push(Op::Replace(record.clone())),
        }
    }
    for host in known.keys() {
        if !want.contains_key(host) {
            ops.push(Op::Delete(host.clone()));
        }
    }
    ops
}

/// The UPDATE that applies `ops` to `zone` as `owner`, all or nothing.
pub fn update(id: u16, zone: &Name, ops: &[Op], owner: &Owner) -> Result<Update, WireError> {
    let text = owner.text();
    let mut u = Update {
        id,
        zone: zone.clone(),
        prerequisites: Vec::with_capacity(ops.len() * 2),
        updates: Vec::with_capacity(ops.len() * 2),
    };
    for op in ops {
        let host = op.host();
        let registry = Record::txt(&registry_name(host)?, 0, &text);
        match op {
            Op::Create(r) => {
                u.prerequisites.push(Record::rrset_absent(host, TYPE_HTTPS));
                u.prerequisites
                    .push(Record::rrset_absent(&registry.name, TYPE_TXT));
                u.updates.push(r.clone());
                u.updates.push(Record {
                    ttl: r.ttl,
                    ..registry
                });
            }
            Op::Replace(r) => {
                u.prerequisites.push(Record::rrset_equals(&registry));
                u.updates.push(Record::delete_rrset(host, TYPE_HTTPS));
                u.updates.push(r.clone());
            }
            Op::Delete(_) => {
                u.prerequisites.push(Record::rrset_equals(&registry));
                u.updates.push(Record::delete_rrset(host, TYPE_HTTPS));
                u.updates.push(Record::delete_one(&registry));
            }
        }
    }
    Ok(u)
}

/// `ops` in batches of at most [`BATCH`].
pub fn batches(ops: &[Op]) -> impl Iterator<Item = &[Op]> {
    ops.chunks(BATCH)
}

/// A batch split in two, to find the change whose prerequisite failed.
pub fn halves(ops: &[Op]) -> (&[Op], &[Op]) {
    ops.split_at(ops.len() / 2)
}

/// The zone of `host` among `zones`: the longest one that contains it.
pub fn zone_of<'a>(host: &Name, zones: &'a [Name]) -> Option<&'a Name> {
    zones
        .iter()
        .filter(|z| host.is_in(z))
        .max_by_key(|z| z.to_string().len())
}

#[cfg(test)]
mod tests {
    use super::super::wire::{CLASS_ANY, CLASS_IN, CLASS_NONE};
    use super::*;

    fn n(s: &str) -> Name {
        Name::parse(s).unwrap()
    }

    fn owner() -> Owner {
        Owner {
            id: "h3-ingress.dev/operator".into(),
            listener: "public".into(),
        }
    }

    #[test]
    fn registry_names_sit_beside_each_host_and_wildcards_get_their_own_label() {
        assert_eq!(
            registry_name(&n("a.example.com")).unwrap().to_string(),
            "_h3-ingress.a.example.com"
        );
        assert_eq!(
            registry_name(&n("*.example.com")).unwrap().to_string(),
            "_h3-ingress-wildcard.example.com"
        );
        assert_eq!(
            owner().text(),
            "heritage=h3-ingress,h3-ingress/owner=h3-ingress.dev/operator,\
             h3-ingress/resource=http3listener/public"
        );
    }

    #[test]
    fn the_diff_creates_replaces_and_deletes_only_what_differs() {
        let want: BTreeMap<_, _> = [("a.example.com", 443), ("b.example.com", 8443)]
            .into_iter()
            .map(|(h, p)| (n(h), record(&n(h), p, 60)))
            .collect();
        assert_eq!(
            diff(&want, &Known::new()),
            vec![
                Op::Create(want[&n("a.example.com")].clone()),
                Op::Create(want[&n("b.example.com")].clone()),
            ]
        );
        let mut known: Known = want
            .iter()
            .map(|(h, r)| (h.clone(), Some(r.clone())))
            .collect();
        assert!(diff(&want, &known).is_empty(), "at rest: nothing to send");
        known.insert(n("b.example.com"), None);
        known.insert(
            n("gone.example.com"),
            Some(record(&n("gone.example.com"), 443, 60)),
        );
        assert_eq!(
            diff(&want, &known),
            vec![
                Op::Replace(want[&n("b.example.com")].clone()),
                Op::Delete(n("gone.example.com")),
            ]
        );
    }

    #[test]
    fn every_change_is_guarded_by_its_prerequisites() {
        let zone = n("example.com");
        let a = n("a.example.com");
        let reg = n("_h3-ingress.a.example.com");
        let ops = [
            Op::Create(record(&a, 443, 60)),
            Op::Replace(record(&a, 443, 60)),
            Op::Delete(a.clone()),
        ];
        let u = update(7, &zone, &ops, &owner()).unwrap();
        let p: Vec<_> = u
            .prerequisites
            .iter()
            .map(|r| (r.name.to_string(), r.rtype, r.class))
            .collect();
        assert_eq!(
            p,
            [
                ("a.example.com".into(), TYPE_HTTPS, CLASS_NONE),
                (reg.to_string(), TYPE_TXT, CLASS_NONE),
                (reg.to_string(), TYPE_TXT, CLASS_IN),
                (reg.to_string(), TYPE_TXT, CLASS_IN),
            ]
        );
        assert!(u.prerequisites[2].ttl == 0 && !u.prerequisites[2].rdata.is_empty());
        let w: Vec<_> = u
            .updates
            .iter()
            .map(|r| (r.name.to_string(), r.rtype, r.class))
            .collect();
        assert_eq!(
            w,
            [
                ("a.example.com".into(), TYPE_HTTPS, CLASS_IN),
                (reg.to_string(), TYPE_TXT, CLASS_IN),
                ("a.example.com".into(), TYPE_HTTPS, CLASS_ANY),
                ("a.example.com".into(), TYPE_HTTPS, CLASS_IN),
                ("a.example.com".into(), TYPE_HTTPS, CLASS_ANY),
                (reg.to_string(), TYPE_TXT, CLASS_NONE),
            ]
        );
        assert_eq!(
            u.updates[1].ttl, 60,
            "the registry record lives as long as the record"
        );
    }

    #[test]
    fn batches_and_halves_cover_every_change_once() {
        let ops: Vec<Op> = (0..150)
            .map(|i| Op::Delete(n(&format!("h{i}.example.com"))))
            .collect();
        let sizes: Vec<usize> = batches(&ops).map(<[Op]>::len).collect();
        assert_eq!(sizes, [64, 64, 22]);
        let (l, r) = halves(&ops[..5]);
        assert_eq!((l.len(), r.len()), (2, 3));
        let u = update(1, &n("example.com"), &ops[..BATCH], &owner()).unwrap();
        assert!(u.encode().unwrap().len() < 32 * 1024);
    }

    #[test]
    fn a_host_belongs_to_the_longest_zone_that_contains_it() {
        let zones = [n("example.com"), n("eu.example.com")];
        assert_eq!(zone_of(&n("a.eu.example.com"), &zones), Some(&zones[1]));
        assert_eq!(zone_of(&n("a.example.com"), &zones), Some(&zones[0]));
        assert_eq!(zone_of(&n("a.example.org"), &zones), None);
    }
}
