//! The router's control socket: one JSON request line, one JSON reply line, per connection.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::emu::{Counters, EmuConfig};
use super::LabError;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "camelCase")]
pub enum Request {
    Ping,
    Counters,
    /// Returns the counters and zeroes them.
    Reset,
    Get,
    Set {
        config: EmuConfig,
    },
    Quit,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<Counters>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<EmuConfig>,
    pub uptime_ms: u64,
    /// Packets sitting in the delay line right now.
    pub queued: u64,
    pub pid: u32,
}

pub fn request(socket: &Path, req: &Request) -> Result<Reply, LabError> {
    let mut s = UnixStream::connect(socket)
        .map_err(|e| LabError::io(format!("connect {}", socket.display()), e))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| LabError::io("control socket timeout", e))?;
    let mut line = serde_json::to_string(req).map_err(|e| LabError::Control(e.to_string()))?;
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| LabError::io("control socket write", e))?;
    let mut reply = String::new();
    BufReader::new(&s)
        .read_line(&mut reply)
        .map_err(|e| LabError::io("control socket read", e))?;
    let r: Reply = serde_json::from_str(reply.trim())
        .map_err(|e| LabError::Control(format!("bad reply {reply:?}: {e}")))?;
    if !r.ok {
        return Err(LabError::Control(
            r.error
                .unwrap_or_else(|| "router refused the request".into()),
        ));
    }
    Ok(r)
}
