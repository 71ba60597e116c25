//! Loading the upstream configuration: a kubeconfig file (with an optional
//! context) or the in-cluster service-account files, without echoing a
//! file's contents in errors.

use std::path::Path;

use kube::config::KubeconfigError;

use super::error::{UpstreamError, error_chain};
use crate::component::config::yaml_error;

/// Loads a kubeconfig file (with an optional context) or, with no path,
/// the in-cluster configuration.
///
/// # Errors
/// [`UpstreamError::Config`] describing what could not be loaded.
pub async fn load_kube_config(
    path: Option<&Path>,
    context: Option<String>,
) -> Result<kube::Config, UpstreamError> {
    let options = kube::config::KubeConfigOptions {
        context,
        ..Default::default()
    };
    match path {
        Some(path) => {
            let failed = |e: &KubeconfigError| {
                UpstreamError::Config(format!("{}: {}", path.display(), kubeconfig_error(e)))
            };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| failed(&e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| failed(&e))
        }
        None => kube::Config::incluster().map_err(|e| {
            UpstreamError::Config(format!(
                "no upstream kubeconfig given and the in-cluster configuration is unavailable: {e}"
            ))
        }),
    }
}

/// A kubeconfig error without the file's contents: a YAML error is the
/// parser's message and location only (a key file given by mistake, or a
/// kubeconfig holding a token, must not be echoed; [`yaml_error`]).
fn kubeconfig_error(e: &KubeconfigError) -> String {
    match e {
        KubeconfigError::Parse(yaml) => {
            format!("failed to parse kubeconfig YAML: {}", yaml_error(yaml))
        }
        other => error_chain(other),
    }
}
