//! The standalone YAML file: a pure parser and a thin loader that reads the certificate files.

use std::path::{Path, PathBuf};

use super::{build, ConfigError, FieldError, HostEntry, HostTable, ProxyConfig};
use crate::api::unknown::{path_string, UnknownFields};
use crate::api::FileConfig;

/// Parses the YAML text. Unknown fields and wrong types are errors naming the field path;
/// every unknown field is named at once. (The types themselves accept unknown fields, which
/// the Kubernetes path needs: `api::unknown`.)
pub fn parse(yaml: &str) -> Result<FileConfig, ConfigError> {
    let de = serde_norway::Deserializer::from_str(yaml);
    let mut unknown = Vec::new();
    let mut record = |p: serde_ignored::Path<'_>| unknown.push(path_string(&p));
    let parsed: FileConfig =
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(de, &mut record))
            .map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." { String::new() } else { path };
                ConfigError::single(path, e.into_inner().to_string())
            })?;
    if unknown.is_empty() {
        return Ok(parsed);
    }
    Err(ConfigError {
        errors: UnknownFields::new(unknown)
            .paths()
            .iter()
            .map(|path| FieldError {
                path: path.clone(),
                message: "unknown field".into(),
            })
            .collect(),
    })
}

/// Certificate material read from disk, per host, in file order.
pub struct HostFiles {
    pub name: String,
    pub cert: std::io::Result<Vec<u8>>,
    pub key: std::io::Result<Vec<u8>>,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

/// Builds the configuration from parsed YAML and the bytes of the certificate files. Pure.
pub fn from_parts(
    file: &FileConfig,
    host_files: Vec<HostFiles>,
    now_unix: i64,
) -> Result<ProxyConfig, ConfigError> {
    let mut errors = Vec::new();
    let mut table = HostTable::default();
    for (i, h) in host_files.into_iter().enumerate() {
        let field = |f: &str| format!("hosts[{i}].{f}");
        let cert = match h.cert {
            Ok(b) => b,
            Err(e) => {
                errors.push(FieldError {
                    path: field("certFile"),
                    message: format!("{}: {e}", h.cert_path.display()),
                });
                continue;
            }
        };
        let key = match h.key {
            Ok(b) => b,
            Err(e) => {
                errors.push(FieldError {
                    path: field("keyFile"),
                    message: format!("{}: {e}", h.key_path.display()),
                });
                continue;
            }
        };
        match HostEntry::from_pem(&h.name, &cert, &key, now_unix) {
            Ok(entry) => {
                let name = entry.name.clone();
                if !table.insert(entry) {
                    errors.push(FieldError {
                        path: field("name"),
                        message: format!("{name:?} is listed twice"),
                    });
                }
            }
            Err(super::HostError::InvalidName(n)) => errors.push(FieldError {
                path: field("name"),
                message: format!("{n:?} is not a valid host name"),
            }),
            Err(e) => errors.push(FieldError {
                path: field("certFile"),
                message: format!("{} ({}): {e}", h.cert_path.display(), h.name),
            }),
        }
    }
    if file
        .keys
        .file
        .as_deref()
        .is_some_and(|f| f.trim().is_empty())
    {
        errors.push(FieldError {
            path: "keys.file".into(),
            message: "is empty; give a path or leave keys.file out".into(),
        });
    }
    let built = build(file.listener_settings(), &[], table, "");
    match built {
        Ok(c) if errors.is_empty() => Ok(c),
        Ok(_) => Err(ConfigError { errors }),
        Err(mut e) => {
            e.errors.extend(errors);
            Err(e)
        }
    }
}

/// Reads and validates a configuration file and the certificates it names. Relative
/// certificate paths are resolved against the file's directory.
pub fn load(path: &Path) -> Result<ProxyConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::single("", format!("{}: {e}", path.display())))?;
    let file = parse(&text).map_err(|mut e| {
        for fe in &mut e.errors {
            fe.message = format!("{} ({})", fe.message, path.display());
        }
        e
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let host_files = file
        .hosts
        .iter()
        .map(|h| {
            let cert_path = base.join(&h.cert_file);
            let key_path = base.join(&h.key_file);
            HostFiles {
                name: h.name.clone(),
                cert: std::fs::read(&cert_path),
                key: std::fs::read(&key_path),
                cert_path,
                key_path,
            }
        })
        .collect();
    let mut config = from_parts(&file, host_files, unix_now())?;
    config.keys_file = file.keys.file.as_ref().map(|f| base.join(f));
    Ok(config)
}

pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testcerts::self_signed;

    #[test]
    fn unknown_field_is_named_with_its_path() {
        let e = parse("upstream: {address: '127.0.0.1:443', tsl: true}").unwrap_err();
        assert_eq!(e.to_string(), "upstream.tsl: unknown field");
        // Every unknown field at once, at any depth, in path order.
        let e = parse(
            "upstream: {address: 'a:1', futureSetting: 1}\nhosts:\n- {name: a, certFile: c, keyFile: k, extra: x}\ntop: {nested: 1}",
        )
        .unwrap_err();
        let paths: Vec<&str> = e.errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["hosts[0].extra", "top", "upstream.futureSetting"]);
        let e =
            parse("upstream: {address: 'a:1'}\nsocket: {receiveBufferBytes: lots}").unwrap_err();
        assert_eq!(e.errors[0].path, "socket.receiveBufferBytes");
        let e =
            parse("upstream: {address: 'a:1'}\ntransport: {congestionControl: reno}").unwrap_err();
        assert_eq!(e.errors[0].path, "transport.congestionControl");
        assert!(e.errors[0].message.contains("`cubic-hs-lt`"), "{e}");
        let f = parse("upstream: {address: 'a:1'}\ntransport: {congestionControl: cubic-hs-lt}")
            .unwrap();
        assert_eq!(
            f.transport.congestion_control,
            crate::api::CongestionControl::CubicHsLt
        );
    }

    #[test]
    fn missing_upstream_is_an_error() {
        let e = parse("port: 443").unwrap_err();
        assert!(e.to_string().contains("missing field `upstream`"), "{e}");
    }

    #[test]
    fn host_errors_name_the_index() {
        let (c, k) = self_signed(&["a.example.com"]);
        let f = parse(
            "upstream: {address: '127.0.0.1:443'}\nhosts:\n- {name: a.example.com, certFile: a.pem, keyFile: a.key}\n- {name: b.example.com, certFile: a.pem, keyFile: a.key}\n- {name: a.example.com, certFile: a.pem, keyFile: a.key}\n- {name: c.example.com, certFile: missing.pem, keyFile: a.key}",
        )
        .unwrap();
        let files = f
            .hosts
            .iter()
            .map(|h| HostFiles {
                name: h.name.clone(),
                cert: if h.cert_file == "missing.pem" {
                    Err(std::io::Error::from(std::io::ErrorKind::NotFound))
                } else {
                    Ok(c.clone().into_bytes())
                },
                key: Ok(k.clone().into_bytes()),
                cert_path: h.cert_file.clone().into(),
                key_path: h.key_file.clone().into(),
            })
            .collect();
        let e = from_parts(&f, files, unix_now()).unwrap_err();
        let m: Vec<String> = e.errors.iter().map(|e| e.to_string()).collect();
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m[0].starts_with("hosts[1].certFile: a.pem (b.example.com): certificate is not valid for b.example.com"), "{m:?}");
        assert!(
            m[1].starts_with("hosts[2].name: \"a.example.com\" is listed twice"),
            "{m:?}"
        );
        assert!(m[2].starts_with("hosts[3].certFile: missing.pem"), "{m:?}");
    }
}
