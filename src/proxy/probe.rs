//! The data plane's answers to `h3-ingress probe` ([`crate::probe`]): started once the
//! configuration is loaded and the server runs, ready when [`Shared::readiness`] says so.

use std::sync::{Arc, OnceLock};

use super::state::Shared;
use crate::probe::ProbeSource;

/// Filled in by the server once it runs; until then the process is alive but not started.
#[derive(Default)]
pub struct ProbeState {
    shared: OnceLock<Arc<Shared>>,
}

impl ProbeState {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn set(&self, shared: Arc<Shared>) {
        let _ = self.shared.set(shared);
    }
}

impl ProbeSource for ProbeState {
    fn started(&self) -> Result<(), String> {
        self.shared
            .get()
            .map(|_| ())
            .ok_or_else(|| "loading the configuration".to_string())
    }

    fn ready(&self) -> Result<(), String> {
        let shared = self.shared.get().ok_or("loading the configuration")?;
        shared.readiness().map_err(|r| shared.not_ready_text(r))
    }
}
