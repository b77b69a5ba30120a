//! QUIC transport parameters from `transport.*`, the congestion controller included.
//!
//! The defaults remove the flow-control brakes of docs/field-reports.md "002 64 KB / 208 KB
//! brakes" (a stream may have MiBs in flight, not 64 KB) and the black holes of "000
//! dual-stack socket without DF" and "003 ICMP-blind MTU black hole": datagrams start at 1200
//! bytes, path-MTU discovery probes upwards with DF set and detects black holes itself,
//! without ICMP (RFC 8899).

use std::sync::Arc;
use std::time::Duration;

use quinn::{IdleTimeout, MtuDiscoveryConfig, TransportConfig, VarInt};

use super::cc::{self, CcStats};
use crate::api::TransportSettings;

/// The smallest UDP payload every QUIC path must carry (RFC 9000 section 14).
pub const INITIAL_MTU: u16 = 1200;

/// Headers between the interface MTU and the UDP payload.
const IPV4_UDP_HEADERS: u16 = 20 + 8;
const IPV6_UDP_HEADERS: u16 = 40 + 8;

/// Largest MTU of the host's non-loopback interfaces that are up, if any.
pub fn largest_interface_mtu() -> Option<u32> {
    let dir = std::fs::read_dir("/sys/class/net").ok()?;
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name() != "lo")
        .filter(|e| {
            std::fs::read_to_string(e.path().join("operstate"))
                .map(|s| s.trim() != "down")
                .unwrap_or(false)
        })
        .filter_map(|e| {
            std::fs::read_to_string(e.path().join("mtu"))
                .ok()?
                .trim()
                .parse::<u32>()
                .ok()
        })
        .max()
}

/// Upper bound for path-MTU probes: configured, else the interface MTU minus headers.
pub fn max_udp_payload(t: &TransportSettings, ipv6: bool, interface_mtu: Option<u32>) -> u16 {
    if let Some(m) = t.max_udp_payload_bytes {
        return m;
    }
    let mtu = interface_mtu.unwrap_or(1500).min(65_535) as u16;
    let headers = if ipv6 {
        IPV6_UDP_HEADERS
    } else {
        IPV4_UDP_HEADERS
    };
    mtu.saturating_sub(headers).clamp(INITIAL_MTU, 65_527)
}

/// How long the server lets a connection go without sending before it sends a PING.
///
/// While a request waits for its upstream (a host's response timeout may be far longer than
/// the idle timeout) the server has nothing to send; a client that does not PING (aioquic,
/// curl) would then see the connection idle-time out and lose the request. A third of the
/// idle timeout leaves two more PINGs (or their ACKs) to get through a lossy path before
/// the peer's timer, if it is as long as ours, runs out. It also keeps connections with no
/// request in flight alive, so those are closed by the connection task's own idle timer
/// (`http3::lifecycle`), not by QUIC's.
pub fn keep_alive_interval(idle_timeout: Duration) -> Duration {
    idle_timeout / 3
}

/// Builds the whole transport config for one address family: flow control, stream limits,
/// idle timeout, path MTU and the congestion controller (`transport.congestionControl`, whose
/// counters go to `cc_stats`).
pub fn transport_config(
    t: &TransportSettings,
    max_udp_payload: u16,
    cc_stats: Arc<CcStats>,
) -> TransportConfig {
    let initial_window = t.initial_window_packets as u64 * INITIAL_MTU as u64;
    let congestion = cc::factory(t.congestion_control, initial_window, cc_stats);
    let mut tc = TransportConfig::default();
    tc.max_concurrent_bidi_streams(VarInt::from_u32(t.max_concurrent_streams));
    // HTTP/3 clients open a control stream and two QPACK streams; leave room for grease.
    tc.max_concurrent_uni_streams(VarInt::from_u32(16));
    tc.stream_receive_window(
        VarInt::from_u64(t.stream_receive_window_bytes).unwrap_or(VarInt::MAX),
    );
    tc.receive_window(VarInt::from_u64(t.connection_receive_window_bytes).unwrap_or(VarInt::MAX));
    tc.send_window(t.send_window_bytes);
    let idle = Duration::from_secs(t.idle_timeout_seconds as u64);
    tc.max_idle_timeout(Some(
        IdleTimeout::try_from(idle).expect("idle timeout validated to at most 600 s"),
    ));
    tc.keep_alive_interval(Some(keep_alive_interval(idle)));
    tc.initial_mtu(INITIAL_MTU);
    tc.min_mtu(INITIAL_MTU);
    let mut mtud = MtuDiscoveryConfig::default();
    mtud.upper_bound(max_udp_payload.max(INITIAL_MTU));
    tc.mtu_discovery_config(Some(mtud));
    tc.enable_segmentation_offload(true);
    tc.congestion_controller_factory(congestion);
    tc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_pings_well_within_the_idle_timeout() {
        assert_eq!(
            keep_alive_interval(Duration::from_secs(30)),
            Duration::from_secs(10)
        );
        let t = TransportSettings {
            idle_timeout_seconds: 1,
            ..Default::default()
        };
        let tc = transport_config(&t, 1452, Arc::new(CcStats::default()));
        let debug = format!("{tc:?}");
        assert!(
            debug.contains("keep_alive_interval: Some(333.333333ms)"),
            "{debug}"
        );
    }

    #[test]
    fn payload_bound_from_interface_mtu() {
        let t = TransportSettings::default();
        assert_eq!(max_udp_payload(&t, false, Some(1500)), 1472);
        assert_eq!(max_udp_payload(&t, true, Some(1500)), 1452);
        assert_eq!(max_udp_payload(&t, true, Some(9000)), 8952);
        assert_eq!(max_udp_payload(&t, true, None), 1452);
        assert_eq!(max_udp_payload(&t, false, Some(1280)), 1252);
        assert_eq!(max_udp_payload(&t, true, Some(1280)), 1232);
        let t = TransportSettings {
            max_udp_payload_bytes: Some(1350),
            ..Default::default()
        };
        assert_eq!(max_udp_payload(&t, true, Some(9000)), 1350);
    }
}
