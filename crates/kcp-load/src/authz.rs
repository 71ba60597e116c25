//! `authz` (`--sim` only): cached reads by new identities, the first with
//! no cached authorization decision (a SubjectAccessReview upstream),
//! the next with it cached.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use http::{Method, StatusCode};

use crate::client::Target;
use crate::common::target::TargetArgs;
use crate::env::SimEnv;
use crate::stats::{Summary, micros};

#[derive(Debug, Clone, Args)]
pub struct AuthzArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Identities (client certificates in system:masters), each on its own
    /// connection: its first request finds no cached decision.
    #[arg(long, default_value_t = 300)]
    pub identities: usize,
    /// Further requests per identity, with the decision cached.
    #[arg(long, default_value_t = 5)]
    pub warm: usize,
    /// The cached read.
    #[arg(
        long,
        default_value = "/api/v1/namespaces/default/configmaps?resourceVersion=0"
    )]
    pub path: String,
}

/// What `authz` measured, in microseconds.
#[derive(Debug)]
pub struct AuthzReport {
    pub cold: Summary,
    pub warm: Summary,
    /// Mean decision time from the proxy's
    /// `kube_cache_proxy_authorization_duration_seconds`, by source.
    pub decision_cache_us: f64,
    pub decision_upstream_us: f64,
}

pub async fn authz(a: &AuthzArgs) -> Result<AuthzReport> {
    if !a.target.sim.sim || a.target.sim.direct {
        bail!("authz needs --sim (it mints client certificates) and the proxy as target");
    }
    let env = SimEnv::start(&a.target.sim).await?;
    let result = authz_on(&env, a).await;
    env.stop().await;
    result
}

pub async fn authz_on(env: &SimEnv, a: &AuthzArgs) -> Result<AuthzReport> {
    let proto = a.target.proto;
    let before = decision_times(env).await?;
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for i in 0..a.identities {
        let user = format!("kcp-load-user-{i}");
        let issued = env.sim.issue_client(&user, Some("system:masters"));
        let file = env.dir.join("authz.kubeconfig");
        std::fs::write(
            &file,
            apimachinery::kubeconfig::with_certificate(
                &env.proxy.url,
                &env.proxy.ca_pem,
                &user,
                &issued.cert_pem,
                &issued.key_pem,
            ),
        )?;
        let target = Target::from_kubeconfig(Some(&file), None).await?;
        let mut conn = target.connect(proto).await?;
        for n in 0..=a.warm {
            let start = Instant::now();
            let r = target.fetch(&mut conn, Method::GET, &a.path, None).await?;
            let took = micros(start.elapsed());
            if r.status != StatusCode::OK {
                bail!(
                    "GET {} as {user}: {} {}",
                    a.path,
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
            }
            if n == 0 {
                cold.push(took)
            } else {
                warm.push(took)
            }
        }
    }
    let after = decision_times(env).await?;
    let mean = |source: &str| -> f64 {
        let (sum, count) = (
            after[source].0 - before[source].0,
            after[source].1 - before[source].1,
        );
        if count > 0.0 {
            sum / count * 1e6
        } else {
            f64::NAN
        }
    };
    let report = AuthzReport {
        cold: Summary::of(&mut cold),
        warm: Summary::of(&mut warm),
        decision_cache_us: mean("cache"),
        decision_upstream_us: mean("upstream"),
    };
    println!(
        "authz: GET {} as {} new identities, each on its own connection",
        a.path, a.identities
    );
    println!(
        "authz: cold (first request, SubjectAccessReview upstream): {}",
        report.cold
    );
    println!(
        "authz: warm (the next {} requests, decision cached): {}",
        a.warm, report.warm
    );
    println!(
        "authz: added by a cold decision: p50 {:+.3}ms p99 {:+.3}ms",
        (report.cold.p50 as f64 - report.warm.p50 as f64) / 1000.0,
        (report.cold.p99 as f64 - report.warm.p99 as f64) / 1000.0
    );
    println!(
        "authz: decision time in the proxy (mean, its histogram): cached {:.1}us, upstream {:.1}us",
        report.decision_cache_us, report.decision_upstream_us
    );
    Ok(report)
}

/// (sum in seconds, count) of the proxy's authorization decisions by
/// source (`cache`, `upstream`), from its metrics.
async fn decision_times(
    env: &SimEnv,
) -> Result<std::collections::HashMap<&'static str, (f64, f64)>> {
    let (_, metrics) = env.admin_get("/metrics").await?;
    let value = |suffix: &str, source: &str| -> f64 {
        let prefix = format!("kube_cache_proxy_authorization_duration_seconds_{suffix}{{");
        let label = format!("source=\"{source}\"");
        metrics
            .lines()
            .filter(|l| l.starts_with(&prefix) && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    Ok(["cache", "upstream"]
        .into_iter()
        .map(|source| (source, (value("sum", source), value("count", source))))
        .collect())
}
