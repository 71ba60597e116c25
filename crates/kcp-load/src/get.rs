//! `get`: GETs of one object through the proxy and directly; with `--sim`
//! or `--real`, of a secret and a configmap it creates first.

use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use serde_json::json;

use crate::client::Target;
use crate::common::plan::{Compared, LoadArgs, Plan};
use crate::common::target::{Env, TargetArgs, resolve};
use crate::real;

#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Requests per path and client, one after another on its connection.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Requests per path and client before measuring.
    #[arg(long, default_value_t = 100)]
    pub warmup: usize,
    /// Paths to GET (repeatable). Default with --sim or --real: a secret
    /// `default/kcp-load-get` (passed through: secrets are not cached) and
    /// a configmap of that name, consistent (RV unset: passed through) and
    /// with `resourceVersion=0` (from the cache), created first.
    #[arg(long = "path")]
    pub paths: Vec<String>,
    #[command(flatten)]
    pub load: LoadArgs,
}

pub async fn get(a: &GetArgs) -> Result<()> {
    let (target, env) = resolve(&a.target).await?;
    let result = get_on(&target, env.as_ref(), a).await;
    if let Some(env) = env {
        env.stop().await;
    }
    result.map(|_| ())
}

pub async fn get_on(target: &Target, env: Option<&Env>, a: &GetArgs) -> Result<Vec<Compared>> {
    let mut paths = a.paths.clone();
    if let Some(env) = env {
        // A secret (not cached: passed through) and a configmap (cached).
        let direct = env.direct().await?;
        for (resource, kind, extra) in [
            ("secrets", "Secret", json!({"data": {"k": "dmFsdWU="}})),
            ("configmaps", "ConfigMap", json!({"data": {"k": "value"}})),
        ] {
            let mut o = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": "kcp-load-get", "namespace": "default"}});
            if let (Some(m), Some(e)) = (o.as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            real::create(
                &direct,
                &format!("/api/v1/namespaces/default/{resource}"),
                &o,
            )
            .await?;
        }
        if paths.is_empty() {
            paths = vec![
                "/api/v1/namespaces/default/secrets/kcp-load-get".into(),
                "/api/v1/namespaces/default/configmaps/kcp-load-get".into(),
                "/api/v1/namespaces/default/configmaps/kcp-load-get?resourceVersion=0".into(),
            ];
        }
        // Let the cache see the new configmap.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if paths.is_empty() {
        bail!("--path is required without --sim or --real");
    }
    let plan = Plan::new(target, env, &a.target, &a.load).await?;
    plan.run(&paths, a.requests, a.warmup).await
}
