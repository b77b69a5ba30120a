//! The allowed range of every numeric setting (and the length of the one free-text path),
//! written once.
//!
//! Each [`Bound`] feeds both checks of its field: the CRD schema, through
//! `#[schemars(range(min = B.min, max = B.max))]` on the field in `super::settings`, so the
//! API server refuses an out-of-range spec; and `config::build`, which refuses the same values
//! from the standalone file (and from a spec written before the CRD had the bound) with an
//! error naming [`Bound::field`].

/// An inclusive range of a numeric setting, with the setting's path under the listener
/// settings (`transport.idleTimeoutSeconds`), as error messages and the CRD schema name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub field: &'static str,
    pub min: u64,
    pub max: u64,
}

impl Bound {
    pub const fn new(field: &'static str, min: u64, max: u64) -> Self {
        Self { field, min, max }
    }

    pub fn contains(&self, value: u64) -> bool {
        (self.min..=self.max).contains(&value)
    }
}

/// The longest `altSvc.probePath`, in bytes (a path, not a document).
pub const MAX_ALT_SVC_PROBE_PATH_BYTES: usize = 1024;

/// UDP port of the QUIC sockets (0 would let the kernel pick one no client knows).
pub const PORT: Bound = Bound::new("port", 1, 65_535);

pub const CONNECT_TIMEOUT_SECONDS: Bound = Bound::new("upstream.connectTimeoutSeconds", 1, 300);
pub const RESPONSE_TIMEOUT_SECONDS: Bound = Bound::new("upstream.responseTimeoutSeconds", 1, 3600);
pub const RESPONSE_BODY_IDLE_TIMEOUT_SECONDS: Bound =
    Bound::new("upstream.responseBodyIdleTimeoutSeconds", 1, 3600);
/// The upstream connection window is this many 512 KiB stream windows: at 1000, 500 MiB, a
/// quarter of h2's 2 GiB maximum. nginx and HAProxy announce 100-128 streams by default.
pub const MAX_STREAMS_PER_CONNECTION: Bound =
    Bound::new("upstream.maxStreamsPerConnection", 1, 1000);
/// At most a day: the grace covers a renewal in progress, not a certificate nobody rolled out.
pub const SERVED_CERTIFICATE_GRACE_SECONDS: Bound =
    Bound::new("upstream.servedCertificateGraceSeconds", 0, 86_400);

pub const RECEIVE_BUFFER_BYTES: Bound = Bound::new("socket.receiveBufferBytes", 65_536, 1 << 30);
pub const SEND_BUFFER_BYTES: Bound = Bound {
    field: "socket.sendBufferBytes",
    ..RECEIVE_BUFFER_BYTES
};

pub const INITIAL_WINDOW_PACKETS: Bound = Bound::new("transport.initialWindowPackets", 2, 100);
/// At least 1 MiB: a stream sends at most one window per round trip, and 64 KB windows were
/// one of the brakes in docs/field-reports.md (002).
pub const STREAM_RECEIVE_WINDOW_BYTES: Bound =
    Bound::new("transport.streamReceiveWindowBytes", 1 << 20, 1 << 28);
pub const CONNECTION_RECEIVE_WINDOW_BYTES: Bound =
    Bound::new("transport.connectionReceiveWindowBytes", 1 << 20, 1 << 30);
pub const SEND_WINDOW_BYTES: Bound = Bound {
    field: "transport.sendWindowBytes",
    ..CONNECTION_RECEIVE_WINDOW_BYTES
};
/// 1200 is QUIC's minimum datagram size (RFC 9000 14); 65527 the largest UDP payload.
pub const MAX_UDP_PAYLOAD_BYTES: Bound = Bound::new("transport.maxUdpPayloadBytes", 1200, 65_527);
pub const IDLE_TIMEOUT_SECONDS: Bound = Bound::new("transport.idleTimeoutSeconds", 1, 600);
pub const MAX_CONCURRENT_STREAMS: Bound = Bound::new("transport.maxConcurrentStreams", 1, 10_000);
pub const HANDSHAKE_TIMEOUT_SECONDS: Bound =
    Bound::new("transport.handshakeTimeoutSeconds", 1, 120);

pub const MAX_FIELD_SECTION_SIZE_BYTES: Bound =
    Bound::new("http.maxFieldSectionSizeBytes", 4096, 1 << 20);
pub const DRAIN_TIMEOUT_SECONDS: Bound = Bound::new("http.drainTimeoutSeconds", 0, 3600);
pub const REQUEST_HEADERS_TIMEOUT_SECONDS: Bound =
    Bound::new("http.requestHeadersTimeoutSeconds", 1, 300);
pub const REQUEST_BODY_IDLE_TIMEOUT_SECONDS: Bound =
    Bound::new("http.requestBodyIdleTimeoutSeconds", 1, 3600);
/// Frames other than DATA and HEADERS (SETTINGS, GOAWAY, ...) are a few bytes from any real
/// client; 1 KiB is the least that leaves room for extensions.
pub const MAX_CONTROL_FRAME_BYTES: Bound = Bound::new("http.maxControlFrameBytes", 1024, 1 << 20);

/// The process-wide budget for buffered request bytes (header sections, read-ahead bodies).
pub const BUFFERED_REQUEST_BYTES: Bound =
    Bound::new("limits.bufferedRequestBytes", 1 << 20, 1 << 36);
pub const BUFFERED_REQUEST_BYTES_PER_CONNECTION: Bound = Bound::new(
    "limits.bufferedRequestBytesPerConnection",
    64 << 10,
    1 << 32,
);
/// At least one maximal header section (`http.maxFieldSectionSizeBytes` is at least 4096)
/// plus a small body.
pub const BUFFERED_REQUEST_BYTES_PER_STREAM: Bound =
    Bound::new("limits.bufferedRequestBytesPerStream", 16 << 10, 1 << 30);

/// 0 is off; at most 30 days.
pub const MAX_CONNECTION_AGE_SECONDS: Bound =
    Bound::new("http.maxConnectionAgeSeconds", 0, 30 * 86_400);

pub const HALF_OPEN_THRESHOLD: Bound =
    Bound::new("addressValidation.halfOpenThreshold", 1, 1_000_000);
pub const HALF_OPEN_CONNECTIONS: Bound = Bound::new("limits.halfOpenConnections", 1, 1_000_000);
pub const HALF_OPEN_CONNECTIONS_PER_SOURCE: Bound = Bound {
    field: "limits.halfOpenConnectionsPerSource",
    ..HALF_OPEN_CONNECTIONS
};
pub const CONNECTIONS: Bound = Bound::new("limits.connections", 1, 10_000_000);
pub const CONNECTIONS_PER_SOURCE: Bound = Bound {
    field: "limits.connectionsPerSource",
    ..CONNECTIONS
};
pub const HANDSHAKES_PER_SECOND: Bound = Bound::new("limits.handshakesPerSecond", 1, 1_000_000);
/// A /8 still separates networks; longer than the address is meaningless.
pub const SOURCE_PREFIX_LENGTH_IPV4: Bound = Bound::new("limits.sourcePrefixLengthIpv4", 8, 32);
pub const SOURCE_PREFIX_LENGTH_IPV6: Bound = Bound::new("limits.sourcePrefixLengthIpv6", 16, 128);

/// TTL of the published HTTPS records: at least 10 s (resolvers clamp lower values anyway),
/// at most an hour, which bounds how long a withdrawn record can still send clients to HTTP/3.
pub const DNS_TTL_SECONDS: Bound = Bound::new("advertise.dns.ttlSeconds", 10, 3600);

/// Every bound, for tests that hold the schema and the check to them.
pub const ALL: [Bound; 34] = [
    PORT,
    CONNECT_TIMEOUT_SECONDS,
    RESPONSE_TIMEOUT_SECONDS,
    RESPONSE_BODY_IDLE_TIMEOUT_SECONDS,
    MAX_STREAMS_PER_CONNECTION,
    SERVED_CERTIFICATE_GRACE_SECONDS,
    RECEIVE_BUFFER_BYTES,
    SEND_BUFFER_BYTES,
    INITIAL_WINDOW_PACKETS,
    STREAM_RECEIVE_WINDOW_BYTES,
    CONNECTION_RECEIVE_WINDOW_BYTES,
    SEND_WINDOW_BYTES,
    MAX_UDP_PAYLOAD_BYTES,
    IDLE_TIMEOUT_SECONDS,
    MAX_CONCURRENT_STREAMS,
    MAX_FIELD_SECTION_SIZE_BYTES,
    DRAIN_TIMEOUT_SECONDS,
    REQUEST_HEADERS_TIMEOUT_SECONDS,
    REQUEST_BODY_IDLE_TIMEOUT_SECONDS,
    MAX_CONTROL_FRAME_BYTES,
    BUFFERED_REQUEST_BYTES,
    BUFFERED_REQUEST_BYTES_PER_CONNECTION,
    BUFFERED_REQUEST_BYTES_PER_STREAM,
    HANDSHAKE_TIMEOUT_SECONDS,
    MAX_CONNECTION_AGE_SECONDS,
    HALF_OPEN_THRESHOLD,
    HALF_OPEN_CONNECTIONS,
    HALF_OPEN_CONNECTIONS_PER_SOURCE,
    CONNECTIONS,
    CONNECTIONS_PER_SOURCE,
    HANDSHAKES_PER_SECOND,
    SOURCE_PREFIX_LENGTH_IPV4,
    SOURCE_PREFIX_LENGTH_IPV6,
    DNS_TTL_SECONDS,
];
