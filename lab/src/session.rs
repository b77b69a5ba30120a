//! One lab run (bench or smoke): router and namespaces, a work directory, the PKI, and the
//! server processes. Everything is torn down on drop, also when the run fails half-way.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::emu::EmuConfig;
use super::netns::{self, LabNames};
use super::pki::{self, Pki};
use super::servers::{ChrootView, Proc, Work};
use super::{LabError, Snapshot};

pub struct Session {
    pub names: LabNames,
    pub work: Work,
    pub pki: Pki,
    procs: Vec<Proc>,
    views: Vec<ChrootView>,
    current: Option<EmuConfig>,
}

impl Session {
    pub fn start(prefix: &str, cfg: &EmuConfig) -> Result<Session, LabError> {
        netns::require_root("the lab")?;
        let names = LabNames::new(prefix)?;
        // A previous run that was killed may have left its router and namespaces behind.
        super::down(&names)?;
        let mut guard = Cleanup(Some(names.clone()));
        super::up(&names, cfg)?;
        let work = Work::create(&names.state_dir.join("work"))?;
        let cwd = std::env::current_dir().map_err(|e| LabError::io("current dir", e))?;
        let pki = pki::make_pki(&work, &cwd.join(super::output_dir()).join("pki"))?;
        guard.0 = None;
        Ok(Session {
            names,
            work,
            pki,
            procs: Vec::new(),
            views: Vec::new(),
            current: Some(cfg.clone()),
        })
    }

    pub fn keep(&mut self, p: Proc) {
        self.procs.push(p);
    }

    pub fn mount_chroot(&mut self, root: &Path) -> Result<&ChrootView, LabError> {
        let v = ChrootView::mount(root, &self.names.prefix, &self.work)?;
        self.views.push(v);
        Ok(self.views.last().expect("just pushed"))
    }

    /// The pid of the kept process started under `name`.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.iter().find(|p| p.name == name).map(|p| p.pid())
    }

    /// The first kept process that died, if any.
    pub fn dead_process(&mut self) -> Option<String> {
        self.procs.iter_mut().find_map(|p| p.exited())
    }

    /// Applies an emulator configuration unless it is already active. When the path MTU
    /// changes, the hosts' learned path MTUs are flushed so no step inherits the last one's.
    pub fn set(&mut self, cfg: &EmuConfig) -> Result<(), LabError> {
        if self.current.as_ref() == Some(cfg) {
            return Ok(());
        }
        let mtu_changed = self.current.as_ref().is_none_or(|c| {
            (c.c2s.mtu, c.s2c.mtu, c.c2s.icmp, c.s2c.icmp)
                != (cfg.c2s.mtu, cfg.s2c.mtu, cfg.c2s.icmp, cfg.s2c.icmp)
        });
        super::set_config(&self.names, cfg)?;
        self.current = Some(cfg.clone());
        if mtu_changed {
            self.flush_route_caches()?;
        }
        Ok(())
    }

    /// Forgets path MTUs learned from ICMP in both namespaces.
    pub fn flush_route_caches(&self) -> Result<(), LabError> {
        for ns in [&self.names.client_ns, &self.names.server_ns] {
            netns::ip(&["-n", ns, "route", "flush", "cache"])?;
            netns::ip(&["-n", ns, "-6", "route", "flush", "cache"])?;
        }
        Ok(())
    }

    pub fn snapshot(&self) -> Result<Snapshot, LabError> {
        super::snapshot(&self.names, false)
    }

    pub fn udp_stats(&self, server_side: bool) -> Result<UdpStats, LabError> {
        let ns = if server_side {
            &self.names.server_ns
        } else {
            &self.names.client_ns
        };
        let snmp = netns::read_proc_net(ns, "snmp")?;
        let snmp6 = netns::read_proc_net(ns, "snmp6").unwrap_or_default();
        Ok(parse_udp_stats(&snmp, &snmp6))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Servers first (they live in the namespaces), then the chroot mounts, then the lab.
        self.procs.clear();
        self.views.clear();
        if let Err(e) = super::down(&self.names) {
            eprintln!("lab teardown of {}: {e}", self.names.prefix);
        }
    }
}

struct Cleanup(Option<LabNames>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            let _ = super::down(&n);
        }
    }
}

/// UDP counters of one namespace, IPv4 and IPv6 summed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UdpStats {
    pub in_datagrams: u64,
    pub in_errors: u64,
    pub rcvbuf_errors: u64,
    pub sndbuf_errors: u64,
}

impl UdpStats {
    pub fn delta(&self, earlier: &Self) -> Self {
        Self {
            in_datagrams: self.in_datagrams.saturating_sub(earlier.in_datagrams),
            in_errors: self.in_errors.saturating_sub(earlier.in_errors),
            rcvbuf_errors: self.rcvbuf_errors.saturating_sub(earlier.rcvbuf_errors),
            sndbuf_errors: self.sndbuf_errors.saturating_sub(earlier.sndbuf_errors),
        }
    }
    pub fn add(&mut self, o: &Self) {
        self.in_datagrams += o.in_datagrams;
        self.in_errors += o.in_errors;
        self.rcvbuf_errors += o.rcvbuf_errors;
        self.sndbuf_errors += o.sndbuf_errors;
    }
}

/// Parses the `Udp:` table of /proc/net/snmp and the `Udp6*` lines of /proc/net/snmp6. Pure.
pub fn parse_udp_stats(snmp: &str, snmp6: &str) -> UdpStats {
    let mut st = UdpStats::default();
    let udp: Vec<&str> = snmp.lines().filter(|l| l.starts_with("Udp:")).collect();
    if let [head, vals, ..] = udp.as_slice() {
        for (k, v) in head.split_whitespace().zip(vals.split_whitespace()).skip(1) {
            let v: u64 = v.parse().unwrap_or(0);
            match k {
                "InDatagrams" => st.in_datagrams += v,
                "InErrors" => st.in_errors += v,
                "RcvbufErrors" => st.rcvbuf_errors += v,
                "SndbufErrors" => st.sndbuf_errors += v,
                _ => {}
            }
        }
    }
    for line in snmp6.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next()) else {
            continue;
        };
        let v: u64 = v.parse().unwrap_or(0);
        match k {
            "Udp6InDatagrams" => st.in_datagrams += v,
            "Udp6InErrors" => st.in_errors += v,
            "Udp6RcvbufErrors" => st.rcvbuf_errors += v,
            "Udp6SndbufErrors" => st.sndbuf_errors += v,
            _ => {}
        }
    }
    st
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_snmp_tables() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdp: 1000 3 284 900 284 0 0 0 0\nUdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdpLite: 0 0 0 0 0 0 0 0 0\n";
        let snmp6 = "Udp6InDatagrams                 	50\nUdp6RcvbufErrors                	7\nUdpLite6RcvbufErrors 99\n";
        let st = parse_udp_stats(snmp, snmp6);
        assert_eq!(
            st,
            UdpStats {
                in_datagrams: 1050,
                in_errors: 284,
                rcvbuf_errors: 291,
                sndbuf_errors: 0
            }
        );
        let later = UdpStats {
            rcvbuf_errors: 300,
            ..st.clone()
        };
        assert_eq!(later.delta(&st).rcvbuf_errors, 9);
    }
}
