//! The bench's rows: each server (and protocol) it measures, as one table. A row measured
//! only in one scenario is listed in that scenario's entry (`scenario::Scenario::only_rows`).

use crate::client::Proto;
use crate::servers::{ProxyVariant, INGRESS_PORT};

/// HTTP/2 to the TCP ingress: the reference every target compares with.
pub const H2: &str = "h2-nginx";
/// The product's default controller (`transport.congestionControl`); a test holds it to
/// `CongestionControl::default()`.
pub const DEFAULT_CC: &str = "cubic-hs-lt";
/// The row the targets are about: our proxy with its default controller, `cubic-hs-lt`
/// (random loss read as random while the pipe is not full).
pub const OURS: &str = "h3-ingress-cubic-hs-lt";
/// `cubic-hs`, the default before `cubic-hs-lt`: every loss after the handshake read as
/// congestion, as TCP does. Judged by the same targets when it runs.
pub const CUBIC_HS: &str = "h3-ingress-cubic-hs";
/// Our default with the socket buffers Linux gives without tuning (see
/// [`SMALL_BUFFER_REQUEST`]).
pub const SMALL_BUFFERS: &str = "h3-ingress-208k";
/// Our default controller with RFC 9002's initial window of 10 packets.
pub const RFC_IW: &str = "h3-ingress-iw10";

/// 104 KiB requested; the kernel doubles it (socket(7)), so the socket holds 208 KiB: Linux's
/// default, which dropped 284 datagrams of a 20 MB upload in docs/field-reports.md, "002 64 KB
/// / 208 KB brakes".
pub const SMALL_BUFFER_REQUEST: u32 = 106_496;

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub id: &'static str,
    pub label: &'static str,
    pub proto: Proto,
    pub port: u16,
    pub server: ServerKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ServerKind {
    /// nginx 1.22, the TCP ingress itself (h2).
    Ingress,
    Ours {
        variant: ProxyVariant,
        metrics_port: u16,
    },
    Caddy,
    /// nginx 1.26 from the trixie chroot, serving the files itself.
    NginxH3,
}

const fn ours(
    id: &'static str,
    label: &'static str,
    variant: ProxyVariant,
    port: u16,
    metrics_port: u16,
) -> Row {
    Row {
        id,
        label,
        proto: Proto::H3,
        port,
        server: ServerKind::Ours {
            variant,
            metrics_port,
        },
    }
}

const fn cc(congestion_control: &'static str) -> ProxyVariant {
    ProxyVariant {
        congestion_control,
        buffer_bytes: None,
        initial_window_packets: None,
    }
}

/// Every row, in the table's order.
pub const ROWS: &[Row] = &[
    Row {
        id: H2,
        label: "h2 nginx 1.22",
        proto: Proto::H2,
        port: INGRESS_PORT,
        server: ServerKind::Ingress,
    },
    ours(
        OURS,
        "h3 h3-ingress cubic-hs-lt (default)",
        cc(DEFAULT_CC),
        4436,
        9486,
    ),
    ours(
        CUBIC_HS,
        "h3 h3-ingress cubic-hs",
        cc("cubic-hs"),
        4431,
        9481,
    ),
    ours(
        "h3-ingress-cubic",
        "h3 h3-ingress cubic",
        cc("cubic"),
        4432,
        9482,
    ),
    ours("h3-ingress-bbr", "h3 h3-ingress bbr", cc("bbr"), 4433, 9483),
    ours(
        SMALL_BUFFERS,
        "h3 h3-ingress cubic-hs-lt (default), 208 KB buffers",
        ProxyVariant {
            buffer_bytes: Some(SMALL_BUFFER_REQUEST),
            ..cc(DEFAULT_CC)
        },
        4434,
        9484,
    ),
    ours(
        RFC_IW,
        "h3 h3-ingress cubic-hs-lt (default), IW 10",
        ProxyVariant {
            initial_window_packets: Some(10),
            ..cc(DEFAULT_CC)
        },
        4435,
        9485,
    ),
    Row {
        id: "caddy",
        label: "h3 Caddy 2.6",
        proto: Proto::H3,
        port: 8443,
        server: ServerKind::Caddy,
    },
    Row {
        id: "nginx-1.26",
        label: "h3 nginx 1.26",
        proto: Proto::H3,
        port: 9443,
        server: ServerKind::NginxH3,
    },
];

/// Every row id, for messages and the `--rows` help: "h2-nginx, h3-ingress-cubic-hs-lt, ...".
pub fn ids() -> String {
    ROWS.iter().map(|r| r.id).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_distinct_ids_and_ports() {
        let mut ports: Vec<u16> = ROWS.iter().map(|r| r.port).collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), ROWS.len());
        let mut metrics: Vec<u16> = ROWS
            .iter()
            .filter_map(|r| match r.server {
                ServerKind::Ours { metrics_port, .. } => Some(metrics_port),
                _ => None,
            })
            .collect();
        let n = metrics.len();
        metrics.sort();
        metrics.dedup();
        assert_eq!(metrics.len(), n);
        let mut ids: Vec<&str> = ROWS.iter().map(|r| r.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), ROWS.len());
        for id in [H2, OURS, CUBIC_HS, SMALL_BUFFERS, RFC_IW] {
            assert!(ROWS.iter().any(|r| r.id == id), "{id}");
        }
    }

    #[test]
    fn the_default_rows_run_the_products_default_controller() {
        let default = h3_ingress::api::CongestionControl::default().as_str();
        assert_eq!(DEFAULT_CC, default);
        for id in [OURS, SMALL_BUFFERS, RFC_IW] {
            let row = ROWS.iter().find(|r| r.id == id).unwrap();
            let ServerKind::Ours { variant, .. } = &row.server else {
                panic!("{id}")
            };
            assert_eq!(variant.congestion_control, default, "{id}");
            assert!(row.label.contains("(default)"), "{}", row.label);
        }
    }
}
