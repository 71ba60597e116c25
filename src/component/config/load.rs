//! Loading: the YAML file read and parsed (an empty one is the defaults;
//! an error never quotes the file's contents), the defaults printed back as
//! YAML, and the command-line flags applied over the file.

use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::schema::{API_VERSION, Config, IdentityMode, KIND, TlsVersion};

/// Command-line values that override the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
    pub metrics_listen: Option<String>,
    pub upstream_kubeconfig: Option<PathBuf>,
    pub upstream_context: Option<String>,
    pub upstream_identity: Option<IdentityMode>,
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    pub client_ca_file: Option<PathBuf>,
    pub tls_min_version: Option<TlsVersion>,
    pub shutdown_grace_period_seconds: Option<u64>,
    pub node_name: Option<String>,
    pub cache_persistence_directory: Option<PathBuf>,
    pub takeover_socket_path: Option<PathBuf>,
}

impl Config {
    /// Reads and parses a YAML file. Does not validate.
    ///
    /// # Errors
    /// [`ConfigError::Read`] or [`ConfigError::Parse`] (unknown field, wrong
    /// type), naming the file and the field.
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_yaml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses YAML text. An empty document is the default configuration.
    ///
    /// # Errors
    /// The parser's message, which names the field.
    pub fn from_yaml(text: &str) -> Result<Config, String> {
        if text.trim().is_empty() {
            return Ok(Config::default());
        }
        serde_saphyr::from_str::<Config>(text).map_err(|e| yaml_error(&e))
    }

    /// The default configuration as a YAML document, with `apiVersion` and
    /// `kind` (what `--print-default-config` prints): serialized from
    /// [`Config::default`], so it cannot drift from the code.
    ///
    /// # Errors
    /// The serializer's message (none is expected).
    pub fn default_yaml() -> Result<String, String> {
        let config = Config {
            api_version: Some(API_VERSION.to_string()),
            kind: Some(KIND.to_string()),
            ..Config::default()
        };
        serde_saphyr::to_string(&config).map_err(|e| e.to_string())
    }

    /// Applies command-line overrides.
    pub fn apply(&mut self, o: &Overrides) {
        if let Some(v) = &o.listen {
            self.listen = v.clone();
        }
        if let Some(v) = &o.admin_listen {
            self.admin_listen = v.clone();
        }
        if let Some(v) = &o.metrics_listen {
            self.metrics_listen = Some(v.clone()).filter(|v| !v.is_empty());
        }
        if let Some(v) = &o.upstream_kubeconfig {
            self.upstream.kubeconfig = Some(v.clone());
        }
        if let Some(v) = o.upstream_identity {
            self.upstream.identity = v;
        }
        if let Some(v) = &o.upstream_context {
            self.upstream.context = Some(v.clone());
        }
        if let Some(v) = &o.tls_cert_file {
            self.tls.cert_file = Some(v.clone());
        }
        if let Some(v) = &o.tls_private_key_file {
            self.tls.private_key_file = Some(v.clone());
        }
        if let Some(v) = &o.client_ca_file {
            self.tls.client_ca_file = Some(v.clone());
        }
        if let Some(v) = o.tls_min_version {
            self.tls.min_version = v;
        }
        if let Some(v) = o.shutdown_grace_period_seconds {
            self.shutdown_grace_period_seconds = v;
        }
        if let Some(v) = &o.node_name {
            self.node_name = v.clone();
        }
        if let Some(v) = &o.cache_persistence_directory {
            self.cache.persistence.directory =
                Some(v.clone()).filter(|v| !v.as_os_str().is_empty());
        }
        if let Some(v) = &o.takeover_socket_path {
            self.takeover.socket_path = Some(v.clone()).filter(|v| !v.as_os_str().is_empty());
        }
    }
}

/// A YAML parse error without any of the text it was parsing: the
/// parser's message and location (`... at line L, column C`), and the
/// names of unknown, missing or duplicate fields, but no source snippet
/// and no quoted value. A file given by mistake (a private key, a
/// kubeconfig with a token) must never reach a log or a terminal.
pub fn yaml_error(e: &serde_saphyr::Error) -> String {
    let text = e.without_snippet().to_string();
    let first = text.lines().next().unwrap_or_default();
    redact_quoted(first)
}

/// `first` with the contents of every `"..."` and `` `...` `` replaced by
/// `…`, except field names (`` field `name` ``), which are the schema's
/// vocabulary or a misspelling of it.
fn redact_quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(['"', '`']) {
        let quote = rest[start..].chars().next().unwrap_or('"');
        let Some(len) = rest[start + 1..].find(quote) else {
            break;
        };
        let before = &rest[..start];
        let inner = &rest[start + 1..start + 1 + len];
        out.push_str(before);
        out.push(quote);
        if before.ends_with("field ") {
            out.push_str(inner);
        } else {
            out.push('…');
        }
        out.push(quote);
        rest = &rest[start + 2 + len..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_errors_show_no_file_contents() {
        let key = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgSECRETSECRET\n-----END PRIVATE KEY-----\n";
        let err = Config::from_yaml(key).unwrap_err();
        assert!(err.contains("line 1, column 1"), "{err}");
        assert!(!err.contains("SECRET") && !err.contains("PRIVATE"), "{err}");
        for (yaml, secret, kept) in [
            (
                "upstream:\n  identity: hunter2secret\n",
                "hunter2secret",
                "line 2",
            ),
            ("listen: [topsecret]\n", "topsecret", "line 1"),
            ("maxConnections: topsecret\n", "topsecret", "line 1"),
            ("topsecret: 1\n", "zzz-never", "field `topsecret`"),
            ("listen: 'a\n", "zzz-never", "line 2"),
        ] {
            let err = Config::from_yaml(yaml).unwrap_err();
            assert!(!err.contains(secret), "{yaml}: {err}");
            assert!(err.contains(kept), "{yaml}: {err}");
            assert_eq!(err.lines().count(), 1, "{yaml}: {err}");
        }
        assert_eq!(
            redact_quoted(r#"unknown variant `x`, expected "y"; missing field `z` `q"#),
            r#"unknown variant `…`, expected "…"; missing field `z` `q"#
        );
    }

    #[test]
    fn empty_is_default() {
        assert_eq!(Config::from_yaml("").unwrap(), Config::default());
    }

    #[test]
    fn unknown_field_is_named() {
        let err = Config::from_yaml("listen: 127.0.0.1:1\nbogus: 1\n").unwrap_err();
        assert!(err.contains("bogus"), "{err}");
        let err = Config::from_yaml("upstream:\n  kubeconfg: x\n").unwrap_err();
        assert!(err.contains("kubeconfg"), "{err}");
    }

    #[test]
    fn default_yaml_parses_back_to_the_defaults() {
        let yaml = Config::default_yaml().unwrap();
        assert!(
            yaml.starts_with(
                "apiVersion: kubecacheproxy.io/v1alpha1\nkind: KubeCacheProxyConfiguration\n"
            ),
            "{yaml}"
        );
        assert!(yaml.contains("clientCAFile:"), "{yaml}");
        assert!(yaml.contains("minVersion: VersionTLS12"), "{yaml}");
        let mut c = Config::from_yaml(&yaml).unwrap();
        c.api_version = None;
        c.kind = None;
        assert_eq!(c, Config::default());
    }

    #[test]
    fn overrides_win() {
        let mut c = Config::from_yaml("listen: 127.0.0.1:1\n").unwrap();
        c.apply(&Overrides {
            listen: Some("127.0.0.1:2".into()),
            ..Overrides::default()
        });
        assert_eq!(c.listen, "127.0.0.1:2");
    }
}
