//! A QUIC client endpoint for tests that judge the served certificate themselves.

use std::sync::Arc;

/// An HTTP/3 (ALPN h3, TLS 1.3) client endpoint on an ephemeral IPv4 port that accepts any
/// server certificate: the tests compare the one served with what they expect.
pub fn any_certificate_client() -> quinn::Endpoint {
    any_certificate_client_pinging(None)
}

/// [`any_certificate_client`], sending a PING every `keep_alive` (as Chrome does every 15 s
/// while it waits on a stream), so a response slower than the idle timeout still arrives.
pub fn any_certificate_client_pinging(keep_alive: Option<std::time::Duration>) -> quinn::Endpoint {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(h3_ingress::pki::AnyServerCertificate::new())
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    let mut client = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.keep_alive_interval(keep_alive);
    client.transport_config(Arc::new(transport));
    ep.set_default_client_config(client);
    ep
}
