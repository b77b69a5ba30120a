//! The configuration file (src/config/file.rs): YAML text through `parse` and `from_parts`
//! (the validation `config::build` does for the file and the CRD alike) never panics; every
//! error names a field (or, for YAML syntax, says where); and a configuration that
//! validates can be run: its QUIC transport and TLS server configurations build, and its
//! upstream address reads back the same. Input: the file's text. Every host gets the same
//! self-signed certificate for a.test, b.test and *.w.test (a `certFile` named `missing`
//! reads as a missing file).
#![no_main]

use std::sync::{Arc, OnceLock};

use h3_ingress::config::{self, file};
use h3_ingress::proxy::observe::metrics::Metrics;
use h3_ingress::proxy::quic::{cc::CcStats, tls, transport};
use libfuzzer_sys::fuzz_target;

struct Fixed {
    cert: Vec<u8>,
    key: Vec<u8>,
    metrics: Arc<Metrics>,
}

fn fixed() -> &'static Fixed {
    static F: OnceLock<Fixed> = OnceLock::new();
    F.get_or_init(|| {
        let names = ["a.test", "b.test", "*.w.test"].map(String::from).to_vec();
        let ck = rcgen::generate_simple_self_signed(names).expect("self-signed certificate");
        Fixed {
            cert: ck.cert.pem().into_bytes(),
            key: ck.signing_key.serialize_pem().into_bytes(),
            metrics: Metrics::new(),
        }
    })
}

/// 2026-01-15: inside the certificate's validity, and fixed so a run reproduces.
const NOW: i64 = 1_768_435_200;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let f = match file::parse(text) {
        Ok(f) => f,
        Err(e) => {
            assert!(!e.errors.is_empty());
            assert!(e.errors.iter().all(|fe| !fe.message.is_empty()), "{e}");
            return;
        }
    };
    let fx = fixed();
    let host_files = f
        .hosts
        .iter()
        .map(|h| file::HostFiles {
            name: h.name.clone(),
            cert: if h.cert_file == "missing" {
                Err(std::io::ErrorKind::NotFound.into())
            } else {
                Ok(fx.cert.clone())
            },
            key: Ok(fx.key.clone()),
            cert_path: h.cert_file.clone().into(),
            key_path: h.key_file.clone().into(),
        })
        .collect();
    let cfg = match file::from_parts(&f, host_files, NOW) {
        Ok(c) => c,
        Err(e) => {
            assert!(!e.errors.is_empty());
            for fe in &e.errors {
                assert!(!fe.path.is_empty() && !fe.message.is_empty(), "{fe}");
            }
            return;
        }
    };
    let addr = config::parse_host_port(&cfg.upstream.address.to_string())
        .unwrap_or_else(|e| panic!("{} does not read back: {e}", cfg.upstream.address));
    assert_eq!(addr, cfg.upstream.address);
    assert_eq!(cfg.hosts.len(), f.hosts.len());
    for ipv6 in [false, true] {
        for mtu in [None, Some(1280), Some(9000), Some(u32::MAX)] {
            let payload = transport::max_udp_payload(&cfg.transport, ipv6, mtu);
            assert!(payload >= transport::INITIAL_MTU, "{payload}");
            transport::transport_config(&cfg.transport, payload, CcStats::new());
        }
    }
    tls::server_crypto(cfg.hosts.clone(), fx.metrics.clone()).expect("TLS server config");
});
