//! The lab's command line: subcommands and the path emulation flags.

use clap::{Args, Subcommand, ValueEnum};

use crate::emu::{default_flight_gap_us, ms_to_us, EmuConfig, FlightRule, LinkConfig, RuleProto};
use crate::{bench, smoke, throughput, topology, LabError};

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Name prefix of the namespaces (`<prefix>-c`, `<prefix>-s`), TUN devices and `/run/<prefix>`.
    #[arg(long, default_value = "h3lab")]
    pub prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProtoArg {
    Udp,
    Tcp,
    Any,
}

/// Path emulation settings; the per-direction flags override the symmetric ones.
#[derive(Args, Debug, Clone)]
pub struct EmuArgs {
    /// Round-trip time in ms, split evenly over both directions (presets used: 11, 42, 100, 200).
    #[arg(long, default_value_t = 0.0)]
    pub rtt: f64,
    /// One-way delay client->server in ms (overrides --rtt for this direction).
    #[arg(long)]
    pub delay_c2s: Option<f64>,
    /// One-way delay server->client in ms.
    #[arg(long)]
    pub delay_s2c: Option<f64>,
    /// Random loss probability (0..1) in both directions, e.g. 0.01.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    #[arg(long)]
    pub loss_c2s: Option<f64>,
    #[arg(long)]
    pub loss_s2c: Option<f64>,
    /// Seed of the random-loss generators.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Bottleneck rate in Mbit/s in both directions (default: unlimited).
    #[arg(long)]
    pub rate_mbit: Option<f64>,
    #[arg(long)]
    pub rate_c2s_mbit: Option<f64>,
    #[arg(long)]
    pub rate_s2c_mbit: Option<f64>,
    /// Drop-tail queue in front of the bottleneck, bytes.
    #[arg(long, default_value_t = 1_000_000)]
    pub queue_bytes: u64,
    /// Path MTU in bytes (576..=1500) in both directions.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    #[arg(long)]
    pub mtu_c2s: Option<u32>,
    #[arg(long)]
    pub mtu_s2c: Option<u32>,
    /// ICMP frag-needed / packet-too-big for oversized packets (`off`: MTU black hole).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub icmp: OnOff,
    /// Per-connection drop rule: none, first-flight-last, first-flight-last-handshake,
    /// `first-flight:N[,last][,last-handshake]`.
    #[arg(long, default_value = "none")]
    pub drop_rule: String,
    /// Protocol the drop rule applies to.
    #[arg(long, value_enum, default_value_t = ProtoArg::Any)]
    pub drop_proto: ProtoArg,
    /// Quiet time (ms) after which the server's first flight counts as ended
    /// (default: a quarter of the round trip, 1..50 ms).
    #[arg(long)]
    pub flight_gap_ms: Option<f64>,
}

impl EmuArgs {
    /// Validates the flags and builds the emulator configuration. Pure.
    pub fn to_config(&self) -> Result<EmuConfig, LabError> {
        let bad = |m: String| Err(LabError::Config(m));
        if !(0.0..=10_000.0).contains(&self.rtt) {
            return bad(format!("--rtt {} ms is out of range 0..10000", self.rtt));
        }
        let link = |delay: Option<f64>, loss: Option<f64>, rate: Option<f64>, mtu: Option<u32>| {
            let delay_ms = delay.unwrap_or(self.rtt / 2.0);
            let loss = loss.unwrap_or(self.loss);
            let rate = rate.or(self.rate_mbit);
            let mtu = mtu.unwrap_or(self.mtu);
            if !(0.0..=5_000.0).contains(&delay_ms) {
                return Err(LabError::Config(format!(
                    "one-way delay {delay_ms} ms out of range"
                )));
            }
            if !(0.0..=1.0).contains(&loss) {
                return Err(LabError::Config(format!("loss {loss} must be within 0..1")));
            }
            if !(576..=topology::TUN_MTU).contains(&mtu) {
                return Err(LabError::Config(format!(
                    "MTU {mtu} must be within 576..={}",
                    topology::TUN_MTU
                )));
            }
            if let Some(r) = rate {
                if !(r > 0.0 && r <= 100_000.0) {
                    return Err(LabError::Config(format!("rate {r} Mbit/s out of range")));
                }
            }
            Ok(LinkConfig {
                delay_us: ms_to_us(delay_ms),
                loss,
                rate_kbit: rate.map(|r| (r * 1000.0).round() as u64),
                queue_bytes: self.queue_bytes,
                mtu,
                icmp: self.icmp == OnOff::On,
            })
        };
        let proto = match self.drop_proto {
            ProtoArg::Udp => RuleProto::Udp,
            ProtoArg::Tcp => RuleProto::Tcp,
            ProtoArg::Any => RuleProto::Any,
        };
        let c2s = link(
            self.delay_c2s,
            self.loss_c2s,
            self.rate_c2s_mbit,
            self.mtu_c2s,
        )?;
        let s2c = link(
            self.delay_s2c,
            self.loss_s2c,
            self.rate_s2c_mbit,
            self.mtu_s2c,
        )?;
        let gap_us = match self.flight_gap_ms {
            Some(g) if (0.1..=1000.0).contains(&g) => ms_to_us(g),
            Some(g) => return bad(format!("--flight-gap-ms {g} out of range 0.1..1000")),
            None => default_flight_gap_us(c2s.delay_us + s2c.delay_us),
        };
        let rule = FlightRule::parse(&self.drop_rule, proto, gap_us).map_err(LabError::Config)?;
        Ok(EmuConfig {
            c2s,
            s2c,
            seed: self.seed,
            rule,
        })
    }
}

#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Create the namespaces and start the router (or reconfigure a running one).
    Up {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        emu: EmuArgs,
    },
    /// Stop the router, end processes left in the lab namespaces, delete the namespaces.
    Down {
        #[command(flatten)]
        common: Common,
    },
    /// The router itself (foreground, long-running); `lab up` starts it in the background.
    Router {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        emu: EmuArgs,
        /// Full emulator configuration as JSON (used by `lab up`; overrides the flags).
        #[arg(long, hide = true)]
        config_json: Option<String>,
    },
    /// Print the router's counters (and its configuration) as JSON.
    Counters {
        #[command(flatten)]
        common: Common,
        /// Zero the counters after reading them.
        #[arg(long)]
        reset: bool,
    },
    /// Bulk TCP transfer through the router (iperf-style), prints Mbit/s.
    Throughput(throughput::ThroughputArgs),
    /// The benchmark: HTTP/2 vs HTTP/3 servers through the emulated paths.
    Bench(bench::BenchArgs),
    /// One download per scenario with counter checks; for CI (< 2 minutes).
    Smoke(smoke::SmokeArgs),
    /// Print the scenario table (cases, targets, smoke steps) and the bench's rows.
    Scenarios,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        emu: EmuArgs,
    }

    fn cfg(args: &[&str]) -> Result<EmuConfig, LabError> {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        T::parse_from(v).emu.to_config()
    }

    #[test]
    fn flags_build_per_direction_links() {
        let c = cfg(&[
            "--rtt",
            "200",
            "--loss",
            "0.01",
            "--mtu",
            "1280",
            "--icmp",
            "off",
            "--drop-rule",
            "first-flight-last",
            "--drop-proto",
            "udp",
            "--delay-c2s",
            "10",
            "--rate-mbit",
            "50",
        ])
        .unwrap();
        assert_eq!(c.s2c.delay_us, 100_000);
        assert_eq!(c.c2s.delay_us, 10_000);
        assert_eq!(c.c2s.loss, 0.01);
        assert_eq!(c.s2c.mtu, 1280);
        assert!(!c.s2c.icmp);
        assert_eq!(c.c2s.rate_kbit, Some(50_000));
        let r = c.rule.unwrap();
        assert_eq!(r.proto, RuleProto::Udp);
        assert_eq!(r.gap_us, 27_500, "a quarter of the 10 + 100 ms round trip");
    }

    #[test]
    fn rejects_out_of_range_settings() {
        assert!(cfg(&["--loss", "1.5"]).is_err());
        assert!(cfg(&["--mtu", "9000"]).is_err());
        assert!(cfg(&["--mtu-s2c", "500"]).is_err());
        assert!(cfg(&["--drop-rule", "sometimes"]).is_err());
        assert!(cfg(&["--rate-mbit", "0"]).is_err());
        assert!(cfg(&[]).unwrap().rule.is_none());
    }
}
