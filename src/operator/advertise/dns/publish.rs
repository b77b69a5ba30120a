//! Keeps one listener's HTTPS records in the user's zones: the I/O around [`super::plan`].
//!
//! [`Publisher::sync`] makes the zones hold a record for exactly the hosts given. It knows
//! what it wrote; after a start (or when [`Publisher::check`] sees a zone's serial move
//! without us) it first reads the registry record of every host it might own, one TCP
//! connection per zone. A batch whose prerequisites fail is split until the host that failed
//! is found: a creation that fails is retried as a replacement (the record may be ours from
//! before a restart), and a host that fails both is someone else's and is left alone,
//! reported as a conflict. At rest nothing is sent but one SOA question per zone and check.

use std::collections::{BTreeMap, BTreeSet};

use super::client::{DnsError, Outcome, Server};
use super::plan::{self, Known, Op, Owner};
use super::wire::{Name, Record, TYPE_HTTPS};

/// One listener's zones, as its spec names them.
#[derive(Debug, Clone)]
pub struct Target {
    pub server: Server,
    pub zones: Vec<Name>,
    pub owner: Owner,
}

/// What the last sync achieved, for the listener's status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Hosts whose record is in their zone.
    pub published: usize,
    /// Hosts left alone because the zone holds a record that is not ours.
    pub conflicts: BTreeSet<Name>,
    /// Hosts in none of the zones.
    pub outside: BTreeSet<Name>,
    /// UPDATE messages sent by this sync.
    pub updates: usize,
}

pub struct Publisher {
    target: Target,
    known: Known,
    /// Hosts whose zone holds a record that is not ours: not tried again until the zone
    /// changes (then the registry is read again).
    conflicts: BTreeSet<Name>,
    /// Each zone's serial after our last change; another value means someone else wrote.
    serials: BTreeMap<Name, u32>,
    synced: bool,
    next_id: u16,
}

impl Publisher {
    pub fn new(target: Target) -> Self {
        Publisher {
            target,
            known: Known::new(),
            conflicts: BTreeSet::new(),
            serials: BTreeMap::new(),
            synced: false,
            next_id: 0,
        }
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Makes the zones hold exactly `want` (host -> record) of ours.
    pub async fn sync(&mut self, want: &BTreeMap<Name, Record>) -> Result<Report, DnsError> {
        if !self.synced {
            self.conflicts.clear();
            self.read_registry(want).await?;
            self.synced = true;
        }
        let mut report = Report::default();
        let mut by_zone: BTreeMap<Name, BTreeMap<Name, Record>> = BTreeMap::new();
        for (host, record) in want {
            if self.conflicts.contains(host) {
                report.conflicts.insert(host.clone());
                continue;
            }
            match plan::zone_of(host, &self.target.zones) {
                Some(z) => {
                    by_zone
                        .entry(z.clone())
                        .or_default()
                        .insert(host.clone(), record.clone());
                }
                None => {
                    report.outside.insert(host.clone());
                }
            }
        }
        for zone in self.target.zones.clone() {
            let zone_want = by_zone.remove(&zone).unwrap_or_default();
            let zone_known: Known = (self.known.iter())
                .filter(|(h, _)| plan::zone_of(h, &self.target.zones) == Some(&zone))
                .map(|(h, r)| (h.clone(), r.clone()))
                .collect();
            let ops = plan::diff(&zone_want, &zone_known);
            for batch in plan::batches(&ops) {
                self.apply(&zone, batch, &mut report).await?;
            }
            if !ops.is_empty() {
                let serial = self.target.server.reader().await?.serial(&zone).await?;
                self.serials.insert(zone.clone(), serial);
            }
        }
        report.published = want
            .keys()
            .filter(|h| matches!(self.known.get(*h), Some(Some(_))))
            .count();
        Ok(report)
    }

    /// Whether every zone is as we left it; when one is not, the next sync reads the registry
    /// again. One SOA question per zone.
    pub async fn check(&mut self) -> Result<bool, DnsError> {
        let mut reader = self.target.server.reader().await?;
        let mut same = true;
        for zone in &self.target.zones {
            let serial = reader.serial(zone).await?;
            if self.serials.get(zone).is_some_and(|s| *s != serial) {
                same = false;
            }
            self.serials.insert(zone.clone(), serial);
        }
        if !same {
            self.synced = false;
        }
        Ok(same)
    }

    /// Learns which hosts are ours from their registry records: every host we want and every
    /// one we think we own.
    async fn read_registry(&mut self, want: &BTreeMap<Name, Record>) -> Result<(), DnsError> {
        let text = self.target.owner.text();
        let hosts: BTreeSet<Name> = want.keys().chain(self.known.keys()).cloned().collect();
        let mut reader = self.target.server.reader().await?;
        let mut known = Known::new();
        for host in hosts {
            let Ok(registry) = plan::registry_name(&host) else {
                continue;
            };
            let registry = reader.txt(&registry).await?;
            let have = reader.records(&host, TYPE_HTTPS).await?;
            if !registry.contains(&text) {
                // Someone else's record (or registry): known without trying to write it.
                if !(have.is_empty() && registry.is_empty()) && want.contains_key(&host) {
                    self.conflicts.insert(host);
                }
                continue;
            }
            // Ours: if it holds exactly what we want, nothing needs to be sent for it.
            let exact = want
                .get(&host)
                .filter(|w| have.len() == 1 && have[0] == (w.ttl, w.rdata.clone()));
            known.insert(host, exact.cloned());
        }
        for zone in &self.target.zones {
            self.serials
                .insert(zone.clone(), reader.serial(zone).await?);
        }
        self.known = known;
        Ok(())
    }

    /// Sends one batch; on a failed prerequisite splits it down to the host that failed.
    async fn apply(&mut self, zone: &Name, ops: &[Op], r: &mut Report) -> Result<(), DnsError> {
        let mut stack: Vec<Vec<Op>> = vec![ops.to_vec()];
        while let Some(batch) = stack.pop() {
            if self.send(zone, &batch, r).await? == Outcome::Applied {
                self.record(&batch);
                continue;
            }
            if batch.len() > 1 {
                let (a, b) = plan::halves(&batch);
                stack.push(b.to_vec());
                stack.push(a.to_vec());
                continue;
            }
            self.refused(zone, batch.into_iter().next().expect("one op"), r)
                .await?;
        }
        Ok(())
    }

    /// One change whose prerequisite failed alone.
    async fn refused(&mut self, zone: &Name, op: Op, r: &mut Report) -> Result<(), DnsError> {
        match op {
            Op::Create(record) => {
                // Ours from before a restart? Then replacing it is allowed.
                let replace = [Op::Replace(record.clone())];
                if self.send(zone, &replace, r).await? == Outcome::Applied {
                    self.record(&replace);
                } else {
                    self.conflict(record.name, r);
                }
            }
            Op::Replace(record) => self.conflict(record.name, r),
            // Gone already, or no longer ours: either way nothing of ours is there.
            Op::Delete(host) => {
                self.known.remove(&host);
            }
        }
        Ok(())
    }

    async fn send(&mut self, zone: &Name, ops: &[Op], r: &mut Report) -> Result<Outcome, DnsError> {
        self.next_id = self.next_id.wrapping_add(1);
        let update =
            plan::update(self.next_id, zone, ops, &self.target.owner).map_err(|source| {
                DnsError::Wire {
                    server: self.target.server.address.clone(),
                    source,
                }
            })?;
        r.updates += 1;
        self.target.server.send(&update).await
    }

    fn conflict(&mut self, host: Name, r: &mut Report) {
        self.known.remove(&host);
        self.conflicts.insert(host.clone());
        r.conflicts.insert(host);
    }

    fn record(&mut self, ops: &[Op]) {
        for op in ops {
            match op {
                Op::Create(rec) | Op::Replace(rec) => {
                    self.known.insert(rec.name.clone(), Some(rec.clone()));
                }
                Op::Delete(host) => {
                    self.known.remove(host);
                }
            }
        }
    }
}
