//! The configuration error: a file that cannot be read or parsed, or a
//! field whose value is not allowed, named by its YAML path.

use std::path::PathBuf;

/// A configuration error, naming the offending field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML for this schema (unknown field, wrong type).
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    /// A field holds a value that is not allowed.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
}

impl ConfigError {
    pub(super) fn invalid(field: &str, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.to_string(),
            message: message.into(),
        }
    }
}
