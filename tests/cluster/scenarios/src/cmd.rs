//! Commands as subprocesses: the environment's plumbing (`scripts/cluster.sh`), clients that
//! run on a node (`ip netns exec`), and the tools that are themselves under test (helm, kubectl
//! columns and `auth can-i`, the kubectl plugin). They inherit the environment that
//! [`crate::Env::load_sync`] exported (KUBECONFIG, PATH with kubectl and helm).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::Command;

use crate::{Error, Result};

/// The repository this runner was built from (its scripts, chart and Python clients).
pub fn repo() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().nth(3).unwrap_or(here).to_path_buf()
}

/// What a finished command printed and how it ended.
#[derive(Debug)]
pub struct Output {
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }
}

/// `program args...` as it would read in a shell, for messages.
fn shown<S: AsRef<OsStr>>(program: &str, args: &[S]) -> String {
    let mut s = program.to_string();
    for a in args {
        s.push(' ');
        s.push_str(&a.as_ref().to_string_lossy());
    }
    s
}

/// Runs a command to its end, whatever its exit status.
pub async fn output<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Result<Output> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| Error::Command(format!("{}: {e}", shown(program, args))))?;
    Ok(Output {
        status: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Runs a command and returns its stdout; a non-zero exit fails with its stderr.
pub async fn run<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Result<String> {
    let out = output(program, args).await?;
    if !out.success() {
        let err = out.stderr.trim();
        let err = if err.is_empty() {
            out.stdout.trim()
        } else {
            err
        };
        return Err(Error::Command(format!(
            "{} exited {:?}: {}",
            shown(program, args),
            out.status,
            tail(err, 1500)
        )));
    }
    Ok(out.stdout)
}

/// `ip netns exec NODE program args...`: a client on a node.
pub async fn netns<S: AsRef<OsStr>>(node: &str, program: &str, args: &[S]) -> Result<String> {
    let mut all: Vec<&OsStr> = vec![OsStr::new("netns"), OsStr::new("exec")];
    all.push(OsStr::new(node));
    all.push(OsStr::new(program));
    all.extend(args.iter().map(|a| a.as_ref()));
    run("ip", &all).await
}

/// `kubectl auth can-i ARGS`: `yes` or `no`, as the API server judges (empty when kubectl
/// failed to ask).
pub async fn can_i(args: &[&str]) -> String {
    let mut all = vec!["auth", "can-i"];
    all.extend(args);
    output("kubectl", &all)
        .await
        .map(|o| o.stdout.trim().to_string())
        .unwrap_or_default()
}

/// The last `max` bytes of a text, cut at a character boundary.
pub fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The first `max` characters of a text.
pub fn head(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failing_command_names_itself_and_its_stderr() {
        let e = run("sh", &["-c", "echo out; echo bad >&2; exit 3"])
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "sh -c echo out; echo bad >&2; exit 3 exited Some(3): bad"
        );
        assert_eq!(run("sh", &["-c", "echo fine"]).await.unwrap(), "fine\n");
    }

    #[test]
    fn tail_and_head_cut_on_characters() {
        assert_eq!(tail("aé b", 2), " b");
        assert_eq!(tail("aéb", 2), "b");
        assert_eq!(head("aéb", 2), "aé");
        assert!(repo().join("charts/h3-ingress/Chart.yaml").exists());
    }
}
