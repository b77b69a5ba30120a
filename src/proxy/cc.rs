//! Placeholder until the cubic-hs branch lands: stock quinn controllers.
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::api::CongestionControl;

#[derive(Debug, Default)]
pub struct CcStats {
    pub losses_forgiven: AtomicU64,
    pub congestion_events: AtomicU64,
}

pub fn factory(
    kind: CongestionControl,
    initial_window_bytes: u64,
    _stats: Arc<CcStats>,
) -> Arc<dyn quinn::congestion::ControllerFactory + Send + Sync> {
    match kind {
        CongestionControl::NewReno => {
            let mut c = quinn::congestion::NewRenoConfig::default();
            c.initial_window(initial_window_bytes);
            Arc::new(c)
        }
        CongestionControl::Bbr => {
            let mut c = quinn::congestion::BbrConfig::default();
            c.initial_window(initial_window_bytes);
            Arc::new(c)
        }
        _ => {
            let mut c = quinn::congestion::CubicConfig::default();
            c.initial_window(initial_window_bytes);
            Arc::new(c)
        }
    }
}
