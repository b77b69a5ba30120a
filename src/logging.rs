//! Log output of the commands: to stderr, filtered by `RUST_LOG` or else by a default.

use tracing_subscriber::EnvFilter;

/// The default filter of the long-running commands (`proxy`, `operator`, `demo`): our own
/// lines at INFO (sockets and endpoints at startup, the admin address, each applied reload,
/// shutdown), every dependency (quinn, h3, rustls, hyper, kube, ...) at WARN. EnvFilter
/// matches target prefixes, so a directive like `h3=warn` would silence `h3_ingress` too;
/// this filter needs none.
pub const SERVER: &str = "warn,h3_ingress=info";

/// The data plane's default: [`SERVER`], except kube-runtime's watcher, which warns on every
/// retry of a refused watch (a 403 while the operator's RBAC is pending, every backoff step);
/// the proxy's source logs each watch failure itself, at most once per cause per minute.
pub const PROXY: &str = "warn,h3_ingress=info,kube_runtime::watcher=error";

/// The default filter of the one-shot commands: warnings and errors only.
pub const QUIET: &str = "warn";

fn filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}

/// Sends log lines to stderr, filtered by `RUST_LOG` when set, else by `default`. Colours
/// only on a terminal: `kubectl logs` and log collectors would otherwise store escape codes.
pub fn init(default: &str) {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter(default))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn server_default_shows_our_info_and_only_warnings_of_dependencies() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(SERVER))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "h3_ingress::proxy::server", "ours-info");
            tracing::debug!(target: "h3_ingress::proxy::server", "ours-debug");
            // A target must be a constant, hence the macro.
            macro_rules! dependency {
                ($($t:literal),*) => {$(
                    tracing::info!(target: $t, "dep-info {}", $t);
                    tracing::warn!(target: $t, "dep-warn {}", $t);
                )*};
            }
            dependency!(
                "h3",
                "h3_quinn",
                "quinn",
                "quinn_proto",
                "rustls",
                "hyper",
                "kube"
            );
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("ours-info"), "{text}");
        assert!(!text.contains("ours-debug"), "{text}");
        assert!(!text.contains("dep-info"), "{text}");
        assert_eq!(text.matches("dep-warn").count(), 7, "{text}");
    }

    #[test]
    fn the_proxy_default_leaves_refused_watches_to_the_source() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(PROXY))
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "h3_ingress::proxy::source::kube", "ours-info");
            tracing::warn!(target: "kube_runtime::watcher", "watcher-warn");
            tracing::error!(target: "kube_runtime::watcher", "watcher-error");
            tracing::warn!(target: "kube_client", "client-warn");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        for shown in ["ours-info", "watcher-error", "client-warn"] {
            assert!(text.contains(shown), "{shown}: {text}");
        }
        assert!(!text.contains("watcher-warn"), "{text}");
    }
}
