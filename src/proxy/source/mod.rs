//! The proxy's inputs, side by side: a YAML file reloaded on SIGHUP ([`mod@file`]) or one
//! `Http3Listener` and its certificate mirrors ([`kube`], whose pure core is
//! [`crate::config::mirrors`]).
//!
//! Each feeds the running proxy through one [`ConfigUpdate`] channel and stops with the
//! proxy's shutdown token (or when the proxy drops the channel); [`super::run`] connects
//! them. Both report a configuration they cannot use the same way, as
//! [`ConfigUpdate::Invalid`]: the proxy counts it in
//! `h3_ingress_config_reloads_total{result="invalid"}`, logs why and keeps serving the last
//! good configuration.

pub mod file;
pub mod kube;

use crate::config::ProxyConfig;

/// A configuration change delivered to the running proxy.
#[derive(Debug)]
pub enum ConfigUpdate {
    Apply(Box<ProxyConfig>),
    /// An update that failed validation; counted and logged, the running config stays.
    Invalid(String),
}

/// Updates waiting for the proxy. They are rare; a source waits while the channel is full.
pub const UPDATE_QUEUE: usize = 4;
