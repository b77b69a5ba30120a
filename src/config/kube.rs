//! Builds the same [`super::ProxyConfig`] from Kubernetes objects (an `Http3Listener`, the
//! annotated Ingresses and the TLS Secrets they reference). Pure: the caller owns the watches.
