//! What the architecture scenario compares: the image index the cluster pushed (its OCI layout
//! under the instance's state directory), what a node's containerd holds after the kubelet
//! pulled it, and the machine a running process's executable is built for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use h3i_scenarios::cmd::{repo, run as sh};
use h3i_scenarios::error::IoContext;
use h3i_scenarios::{fail, Error, Result};
use serde_json::Value;

/// One platform of the index: its manifest, its config (the CRI image ID of a pull of that
/// platform) and its last layer (the binary's; the root files' layer is shared).
#[derive(Clone, Debug, PartialEq)]
pub struct Platform {
    pub manifest: String,
    pub config: String,
    pub binary_layer: String,
}

/// The image index a layout's `index.json` names.
#[derive(Clone, Debug, PartialEq)]
pub struct Index {
    pub digest: String,
    /// By `platform.architecture`.
    pub platforms: BTreeMap<String, Platform>,
}

fn json_of(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).context(|| format!("read {}", path.display()))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        context: path.display().to_string(),
        source,
    })
}

fn str_at<'a>(v: &'a Value, what: &str, pointer: &str) -> Result<&'a str> {
    match v.pointer(pointer).and_then(Value::as_str) {
        Some(s) => Ok(s),
        None => fail(format!("{what}: no {pointer}")),
    }
}

/// Reads the layout `DIR` (`scripts/image.sh`'s `oci/`): the index and each platform's image.
pub fn read_layout(dir: &Path) -> Result<Index> {
    let blob = |digest: &str| json_of(&dir.join("blobs").join(digest.replacen(':', "/", 1)));
    let top = json_of(&dir.join("index.json"))?;
    let digest = str_at(&top, "index.json", "/manifests/0/digest")?.to_string();
    let index = blob(&digest)?;
    let mut platforms = BTreeMap::new();
    for m in index["manifests"].as_array().into_iter().flatten() {
        let arch = str_at(m, "index entry", "/platform/architecture")?;
        let manifest = str_at(m, "index entry", "/digest")?;
        let body = blob(manifest)?;
        let layers = body["layers"].as_array().cloned().unwrap_or_default();
        let Some(last) = layers.last() else {
            return fail(format!("{arch} manifest {manifest} has no layers"));
        };
        platforms.insert(
            arch.to_string(),
            Platform {
                manifest: manifest.to_string(),
                config: str_at(&body, manifest, "/config/digest")?.to_string(),
                binary_layer: str_at(last, manifest, "/digest")?.to_string(),
            },
        );
    }
    Ok(Index { digest, platforms })
}

/// Unpacks the layer `digest` of the layout `DIR` into `into` after checking that its bytes
/// hash to its digest (so it is the blob the registry serves under that name): the image's
/// `/h3-ingress`.
pub async fn unpack_binary(dir: &Path, digest: &str, into: &Path) -> Result<PathBuf> {
    let blob = dir.join("blobs").join(digest.replacen(':', "/", 1));
    let bytes = std::fs::read(&blob).context(|| format!("read {}", blob.display()))?;
    let got = format!("sha256:{}", h3i_scenarios::pki::sha256_hex(&bytes));
    if got != digest {
        return fail(format!("{}: its bytes hash to {got}", blob.display()));
    }
    std::fs::create_dir_all(into).context(|| format!("mkdir {}", into.display()))?;
    let (b, i) = (blob.to_string_lossy(), into.to_string_lossy());
    sh("tar", &["-xf", &b, "-C", &i, "h3-ingress"]).await?;
    Ok(into.join("h3-ingress"))
}

/// A node's containerd as the kubelet uses it (CRI's namespace `k8s.io`), through the `ctr`
/// of the node build.
pub struct NodeCtr {
    ctr: PathBuf,
    state: PathBuf,
}

impl NodeCtr {
    pub async fn new(state: &Path) -> Result<NodeCtr> {
        let bin = sh(
            &repo().join("scripts/nodes-build.sh").to_string_lossy(),
            &["bin"],
        )
        .await?;
        Ok(NodeCtr {
            ctr: PathBuf::from(bin.trim()).join("ctr"),
            state: state.to_path_buf(),
        })
    }

    /// `ctr -n k8s.io ARGS...` against NODE's containerd: its stdout.
    pub async fn run(&self, node: &str, args: &[&str]) -> Result<String> {
        let sock = self
            .state
            .join("nodes")
            .join(node)
            .join("containerd/containerd.sock");
        let sock = sock.to_string_lossy();
        let mut all = vec!["--address", &sock, "-n", "k8s.io"];
        all.extend_from_slice(args);
        sh(&self.ctr.to_string_lossy(), &all).await
    }

    /// Every digest in NODE's content store.
    pub async fn content(&self, node: &str) -> Result<Vec<String>> {
        let out = self.run(node, &["content", "ls", "-q"]).await?;
        Ok(out.lines().map(|l| l.trim().to_string()).collect())
    }

    /// NODE's image names (CRI also names each image by its ID, the config digest).
    pub async fn image_names(&self, node: &str) -> Result<Vec<String>> {
        let out = self.run(node, &["images", "ls", "-q"]).await?;
        Ok(out.lines().map(|l| l.trim().to_string()).collect())
    }

    /// `ctr images ls`'s header and the lines of the images whose target is `digest`.
    pub async fn images_of(&self, node: &str, digest: &str) -> Result<String> {
        let out = self.run(node, &["images", "ls"]).await?;
        let lines = out
            .lines()
            .enumerate()
            .filter(|(i, l)| *i == 0 || l.split_whitespace().nth(2) == Some(digest))
            .map(|(_, l)| l);
        Ok(lines.collect::<Vec<_>>().join("\n"))
    }
}

/// The `kubernetes.io/arch` name of the machine an ELF executable is built for (its header's
/// `e_machine`).
pub fn elf_architecture(head: &[u8]) -> Option<&'static str> {
    if head.len() < 20 || &head[..4] != b"\x7fELF" || head[5] != 1 {
        return None;
    }
    match u16::from_le_bytes([head[18], head[19]]) {
        62 => Some("amd64"),
        183 => Some("arm64"),
        _ => None,
    }
}

/// The architecture and SHA-256 of a file (a process's `/proc/PID/exe`, a built binary).
pub fn executable(path: &Path) -> Result<(String, String)> {
    let bytes = std::fs::read(path).context(|| format!("read {}", path.display()))?;
    let arch = elf_architecture(&bytes).unwrap_or("not an x86-64 or AArch64 executable");
    Ok((arch.to_string(), h3i_scenarios::pki::sha256_hex(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(dir: &Path, v: &Value) -> String {
        let body = v.to_string();
        let digest = format!("sha256:{}", h3i_scenarios::pki::sha256_hex(body.as_bytes()));
        let p = dir.join("blobs").join(digest.replacen(':', "/", 1));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
        digest
    }

    #[test]
    fn reads_each_platform_of_the_index() {
        let dir = h3i_scenarios::scratch_dir("h3i-arch-test").unwrap();
        let manifest = |arch: &str| {
            let d = |s: &str| format!("sha256:{arch}{s}");
            serde_json::json!({"config": {"digest": d("c")},
                "layers": [{"digest": "sha256:rootfs"}, {"digest": d("b")}]})
        };
        let (amd, arm) = (put(&dir, &manifest("amd64")), put(&dir, &manifest("arm64")));
        let index = put(
            &dir,
            &serde_json::json!({"manifests": [
                {"digest": amd, "platform": {"architecture": "amd64", "os": "linux"}},
                {"digest": arm, "platform": {"architecture": "arm64", "os": "linux"}}]}),
        );
        let top = serde_json::json!({"manifests": [{"digest": index}]});
        std::fs::write(dir.join("index.json"), top.to_string()).unwrap();
        let got = read_layout(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(got.digest, index);
        assert_eq!(got.platforms.keys().collect::<Vec<_>>(), ["amd64", "arm64"]);
        assert_eq!(
            got.platforms["arm64"],
            Platform {
                manifest: arm,
                config: "sha256:arm64c".into(),
                binary_layer: "sha256:arm64b".into()
            }
        );
    }

    #[test]
    fn names_the_machine_of_an_elf_header() {
        let mut head = b"\x7fELF\x02\x01\x01".to_vec();
        head.resize(20, 0);
        head[18] = 62;
        assert_eq!(elf_architecture(&head), Some("amd64"));
        head[18] = 183;
        assert_eq!(elf_architecture(&head), Some("arm64"));
        head[18] = 40; // 32-bit ARM
        assert_eq!(elf_architecture(&head), None);
        assert_eq!(elf_architecture(b"#!/bin/sh\n"), None);
        let me = executable(Path::new("/proc/self/exe")).unwrap();
        let machine = std::env::consts::ARCH.replace("x86_64", "amd64");
        assert_eq!(me.0, machine.replace("aarch64", "arm64"));
    }
}
