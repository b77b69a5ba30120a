//! The process's lifecycle signals, handled in one place for every command: SIGTERM and
//! SIGINT cancel the shutdown token the command runs under; SIGHUP becomes a stream of reload
//! requests for the file source.

use std::io;

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::info;

/// Cancels `shutdown` on the first SIGTERM or SIGINT. The handlers are installed before this
/// returns, so a signal that arrives afterwards is never lost.
pub fn cancel_on_shutdown_signals(shutdown: CancellationToken) -> io::Result<()> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            // Cancelled from inside (a fatal error): nothing left to wait for.
            _ = shutdown.cancelled() => return,
        };
        info!("{name}: shutting down");
        shutdown.cancel();
    });
    Ok(())
}

/// A new shutdown token that SIGTERM or SIGINT cancels.
pub fn shutdown_token() -> io::Result<CancellationToken> {
    let shutdown = CancellationToken::new();
    cancel_on_shutdown_signals(shutdown.clone())?;
    Ok(shutdown)
}

/// One item per SIGHUP. Signals that arrive while a reload is still queued are folded into
/// it: the reload reads the file after them anyway.
pub fn hangups() -> io::Result<mpsc::Receiver<()>> {
    let mut hup = signal(SignalKind::hangup())?;
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                return;
            }
        }
    });
    Ok(rx)
}
