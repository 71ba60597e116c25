//! How `get` and `list` run (`LoadArgs`, `Plan`): each path through the
//! target and directly, in rounds, while writers run; both sides' figures
//! printed, and a table row for docs/performance.md.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::load::{LoadOut, Meters, load};
use super::target::{Env, TargetArgs};
use super::writers::{WriteOut, WriterPlan, writer};
use crate::client::{Proto, Target};
use crate::env::RunningProxy;
use crate::stats::{Summary, mib};

/// How `get` and `list` load their target, and what else happens meanwhile.
#[derive(Debug, Clone, Args)]
pub struct LoadArgs {
    /// Clients at once, each on its own connection, each sending its
    /// requests one after another.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Rounds, each through the proxy and then directly (when there is a
    /// direct server to compare with); figures are over all rounds, so
    /// that drift in the machine's load falls on both sides.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Writes per second to objects of the measured resource (creates, then
    /// updates with PUT, of 10 objects in turn) while measuring, sent to
    /// the apiserver directly: a busy resource. 0: a quiet one.
    #[arg(long, default_value_t = 0.0)]
    pub write_rate: f64,
    /// Collection that --write-rate writes to (configmaps, secrets or
    /// leases, namespaced). Default: the measured path's collection.
    #[arg(long, value_name = "PATH")]
    pub write_collection: Option<String>,
    /// Writes per second to Leases in `default` (another resource, as node
    /// heartbeats are) while measuring: the apiserver's resourceVersion
    /// moves while the measured resource stays quiet.
    #[arg(long, default_value_t = 0.0)]
    pub other_write_rate: f64,
    /// Also run the requests against this kubeconfig's server (the
    /// apiserver directly) for comparison, and read its /metrics for the
    /// requests that reached it. With --sim or --real: the apiserver started.
    #[arg(long, value_name = "FILE")]
    pub compare_kubeconfig: Option<PathBuf>,
}

/// The resource a request path names: `(group, resource, verb)`, the verb
/// as kube-apiserver's metrics name it (`GET` with a name, else `LIST`).
pub fn path_resource(path: &str) -> Option<(String, String, &'static str)> {
    let path = path.split('?').next().unwrap_or(path);
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => (group.to_string(), rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, r, tail @ ..] if !r.is_empty() => {
            let mut v = vec![*r];
            v.extend(tail);
            v
        }
        other => other.to_vec(),
    };
    match rest.as_slice() {
        [r] => Some((group, r.to_string(), "LIST")),
        [r, _name] => Some((group, r.to_string(), "GET")),
        _ => None,
    }
}

/// A namespaced collection path: `(apiVersion, namespace, resource)`.
pub fn parse_collection(path: &str) -> Option<(String, String, String)> {
    let path = path.split('?').next().unwrap_or(path);
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", v, "namespaces", ns, r, ..] => Some((v.to_string(), ns.to_string(), r.to_string())),
        ["apis", g, v, "namespaces", ns, r, ..] => {
            Some((format!("{g}/{v}"), ns.to_string(), r.to_string()))
        }
        _ => None,
    }
}

/// A path's figures through the target and directly.
#[derive(Debug)]
pub struct Compared {
    pub path: String,
    pub target: LoadOut,
    pub direct: Option<LoadOut>,
}

/// Who is measured, against what, and what runs meanwhile.
pub struct Plan<'a> {
    target: &'a Target,
    /// The target is the proxy started here.
    proxy: Option<&'a RunningProxy>,
    /// The apiserver directly, to compare with.
    direct: Option<Target>,
    /// Where writes and `/metrics` of the apiserver go.
    apiserver: Option<Target>,
    proto: Proto,
    load: &'a LoadArgs,
}

impl<'a> Plan<'a> {
    pub async fn new(
        target: &'a Target,
        env: Option<&'a Env>,
        t: &TargetArgs,
        load: &'a LoadArgs,
    ) -> Result<Plan<'a>> {
        let direct = match (env, &load.compare_kubeconfig) {
            (_, Some(k)) => Some(Target::from_kubeconfig(Some(k), None).await?),
            (Some(env), None) if !t.sim.direct => Some(env.direct().await?),
            _ => None,
        };
        // Compared in the same representation; writes and metrics in JSON.
        let direct = direct.map(|d| d.with_accept(t.encoding.accept()));
        let apiserver = match (&direct, env) {
            (Some(d), _) => Some(d.clone().with_accept("application/json")),
            (None, Some(env)) => Some(env.direct().await?),
            (None, None) => None,
        };
        Ok(Plan {
            target,
            proxy: env.filter(|_| !t.sim.direct).map(Env::proxy),
            direct,
            apiserver,
            proto: t.proto,
            load,
        })
    }

    /// Starts a writer of `rate` writes/s to 10 objects of `collection`
    /// (sent to the apiserver directly when known).
    fn writer(
        &self,
        collection: &str,
        rate: f64,
        stop: &CancellationToken,
    ) -> Result<tokio::task::JoinHandle<WriteOut>> {
        let (api_version, namespace, resource) = parse_collection(collection)
            .ok_or_else(|| anyhow!("{collection}: not a namespaced collection to write to"))?;
        let kind = match resource.as_str() {
            "configmaps" => "ConfigMap",
            "secrets" => "Secret",
            "leases" => "Lease",
            other => bail!("writing {other} is not supported (configmaps, secrets, leases)"),
        };
        let run_id = &uuid::Uuid::new_v4().simple().to_string()[..8];
        println!("write: {rate:.1} writes/s to 10 {kind}s of {collection}, directly");
        Ok(tokio::spawn(writer(
            self.apiserver
                .clone()
                .unwrap_or_else(|| self.target.clone()),
            Proto::H2,
            WriterPlan {
                kind: kind.into(),
                api_version,
                namespace,
                collection: collection.split('?').next().unwrap_or(collection).into(),
                names: (0..10).map(|k| format!("kcp-load-{run_id}-{k}")).collect(),
                payload: "A".repeat(64),
                interval: Duration::from_secs_f64(1.0 / rate.max(0.001)),
                end: Instant::now() + Duration::from_secs(24 * 3600),
                stop: stop.clone(),
            },
        )))
    }

    /// Measures every path, `rounds` times through the target and directly,
    /// while the writers run; prints and returns the figures.
    pub async fn run(
        &self,
        paths: &[String],
        requests: usize,
        warmup: usize,
    ) -> Result<Vec<Compared>> {
        let l = self.load;
        let stop = CancellationToken::new();
        let mut writers = Vec::new();
        let started = Instant::now();
        if l.write_rate > 0.0 {
            let collection = match &l.write_collection {
                Some(c) => c.clone(),
                None => {
                    let (v, ns, r) =
                        paths
                            .first()
                            .and_then(|p| parse_collection(p))
                            .ok_or_else(|| {
                                anyhow!(
                                    "--write-collection is required: the path is not namespaced"
                                )
                            })?;
                    if v.contains('/') {
                        format!("/apis/{v}/namespaces/{ns}/{r}")
                    } else {
                        format!("/api/{v}/namespaces/{ns}/{r}")
                    }
                }
            };
            writers.push(self.writer(&collection, l.write_rate, &stop)?);
        }
        if l.other_write_rate > 0.0 {
            writers.push(self.writer(
                "/apis/coordination.k8s.io/v1/namespaces/default/leases",
                l.other_write_rate,
                &stop,
            )?);
        }
        if !writers.is_empty() {
            // Let the writers create their objects and reach their rate.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let result = self.measure(paths, requests, warmup).await;
        stop.cancel();
        let secs = started.elapsed().as_secs_f64();
        for w in writers {
            let o = w.await?;
            println!(
                "write: {} ok ({:.1}/s), {} errors{}",
                o.ok,
                o.ok as f64 / secs,
                o.errors,
                o.last_error
                    .map(|e| format!("; last: {e}"))
                    .unwrap_or_default()
            );
        }
        result
    }

    async fn measure(
        &self,
        paths: &[String],
        requests: usize,
        warmup: usize,
    ) -> Result<Vec<Compared>> {
        let l = self.load;
        let through = Meters {
            proxy: self.proxy,
            apiserver: self.apiserver.as_ref(),
        };
        let direct_meters = Meters {
            proxy: None,
            apiserver: self.apiserver.as_ref(),
        };
        let name = if self.proxy.is_some() {
            "proxy"
        } else {
            "target"
        };
        let mut all = Vec::new();
        for path in paths {
            println!(
                "--- GET {path}: {} clients x {requests} requests (after {warmup}), {} round(s)",
                l.concurrency, l.rounds
            );
            let mut t = LoadOut::default();
            let mut d = self.direct.as_ref().map(|_| LoadOut::default());
            for _ in 0..l.rounds.max(1) {
                t.merge(
                    load(
                        self.target,
                        self.proto,
                        path,
                        l.concurrency,
                        requests,
                        warmup,
                        &through,
                    )
                    .await?,
                );
                if let (Some(direct), Some(d)) = (&self.direct, d.as_mut()) {
                    d.merge(
                        load(
                            direct,
                            self.proto,
                            path,
                            l.concurrency,
                            requests,
                            warmup,
                            &direct_meters,
                        )
                        .await?,
                    );
                }
            }
            let resource = path_resource(path);
            report(name, self.target.base(), &mut t, resource.as_ref());
            if let (Some(direct), Some(d)) = (&self.direct, d.as_mut()) {
                report("direct", direct.base(), d, resource.as_ref());
                compare(path, l.concurrency, &mut t, d, resource.as_ref());
            }
            all.push(Compared {
                path: path.clone(),
                target: t,
                direct: d,
            });
        }
        Ok(all)
    }
}

fn per(n: f64, requests: usize) -> String {
    format!("{:.3}", n / requests.max(1) as f64)
}

/// Prints one side's figures.
fn report(name: &str, base: &str, o: &mut LoadOut, resource: Option<&(String, String, &str)>) {
    let lat = Summary::of(&mut o.latencies);
    println!(
        "{name} ({base}): {} requests, {} errors, {:.1} requests/s; latency {lat}",
        o.requests,
        o.errors,
        o.per_second()
    );
    if let Some(items) = o.items {
        let ttfb = Summary::of(&mut o.first_byte);
        println!(
            "{name}: {items} items, {} per response, {:.1} MiB/s; time to first byte {ttfb}",
            mib(o.bytes / o.latencies.len().max(1) as u64),
            o.bytes as f64 / o.wall.as_secs_f64().max(1e-9) / (1024.0 * 1024.0),
        );
    }
    if let Some(e) = &o.last_error {
        println!("{name}: last error: {e}");
    }
    if let Some(m) = &o.apiserver {
        let lines: Vec<String> = m
            .iter()
            .map(|(k, v)| {
                let r = if k[1].is_empty() {
                    k[2].clone()
                } else {
                    format!("{}.{}", k[2], k[1])
                };
                format!(
                    "{} {} {v} ({}/req)",
                    k[0],
                    if r.is_empty() { "-" } else { &r },
                    per(*v, o.requests)
                )
            })
            .collect();
        let total = resource
            .and_then(|r| o.upstream_per_request(r))
            .map(|v| format!("{v:.3}"))
            .unwrap_or_else(|| "?".into());
        println!(
            "{name}: apiserver requests meanwhile (apiserver_request_total): reads of the resource and SubjectAccessReviews {total} per request; all: {}",
            if lines.is_empty() {
                "none".into()
            } else {
                lines.join(", ")
            }
        );
    }
    if let Some(m) = &o.reads {
        let lines: Vec<String> = m
            .iter()
            .map(|(k, v)| {
                format!(
                    "{} {} {}{} {v} ({}/req)",
                    k[1],
                    k[0],
                    k[2],
                    if k[3].is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", k[3])
                    },
                    per(*v, o.requests)
                )
            })
            .collect();
        let probes: Vec<String> = o
            .probes
            .iter()
            .flatten()
            .map(|(k, v)| format!("{} {} {v} ({}/req)", k[0], k[1], per(*v, o.requests)))
            .collect();
        let progress: Vec<String> = o
            .progress
            .iter()
            .flatten()
            .map(|(k, v)| format!("{} {v}", k[0]))
            .collect();
        println!(
            "{name}: proxy cache reads (kube_cache_proxy_cache_reads_total): {}; consistency probes: {}; progress watches: {}",
            if lines.is_empty() {
                "none".into()
            } else {
                lines.join(", ")
            },
            if probes.is_empty() {
                "none".into()
            } else {
                probes.join(", ")
            },
            if progress.is_empty() {
                "none".into()
            } else {
                progress.join(", ")
            },
        );
    }
}

/// Prints the difference and a table row for docs/performance.md.
fn compare(
    path: &str,
    clients: usize,
    t: &mut LoadOut,
    d: &mut LoadOut,
    resource: Option<&(String, String, &str)>,
) {
    let (ts, ds) = (Summary::of(&mut t.latencies), Summary::of(&mut d.latencies));
    let diff = |a: f64, b: f64| format!("{:+.3}", (a - b) / 1000.0);
    println!(
        "{path}: added by the proxy: p50 {}ms p90 {}ms p99 {}ms mean {}ms",
        diff(ts.p50 as f64, ds.p50 as f64),
        diff(ts.p90 as f64, ds.p90 as f64),
        diff(ts.p99 as f64, ds.p99 as f64),
        diff(ts.mean, ds.mean),
    );
    let opt = |v: Option<f64>, pct: bool| match v {
        Some(v) if pct => format!("{:.0} %", v * 100.0),
        Some(v) => format!("{v:.3}"),
        None => "?".into(),
    };
    let ms3 = |s: &Summary| {
        format!(
            "{:.2} / {:.2} / {:.2}",
            s.p50 as f64 / 1000.0,
            s.p99 as f64 / 1000.0,
            s.mean / 1000.0
        )
    };
    println!(
        "row: | `{path}` | {clients} | {} | {} | {} / {} | {:.0} / {:.0} | {} / {} | {} | {} |",
        ms3(&ts),
        ms3(&ds),
        diff(ts.p50 as f64, ds.p50 as f64),
        diff(ts.mean, ds.mean),
        t.per_second(),
        d.per_second(),
        opt(resource.and_then(|r| t.upstream_per_request(r)), false),
        opt(resource.and_then(|r| d.upstream_per_request(r)), false),
        opt(resource.and_then(|r| t.probes_per_request(r)), false),
        opt(resource.and_then(|r| t.cache_share(r)), true),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_resource_of_a_path() {
        let r = |p: &str| path_resource(p).map(|(g, r, v)| format!("{g}/{r}/{v}"));
        assert_eq!(
            r("/api/v1/pods?resourceVersion=0").as_deref(),
            Some("/pods/LIST")
        );
        assert_eq!(
            r("/api/v1/namespaces/default/configmaps/x").as_deref(),
            Some("/configmaps/GET")
        );
        assert_eq!(
            r("/apis/coordination.k8s.io/v1/namespaces/d/leases").as_deref(),
            Some("coordination.k8s.io/leases/LIST")
        );
        assert_eq!(
            r("/api/v1/namespaces/default").as_deref(),
            Some("/namespaces/GET")
        );
        assert_eq!(r("/healthz"), None);
        assert_eq!(
            parse_collection("/api/v1/namespaces/default/configmaps/x?a=b"),
            Some(("v1".into(), "default".into(), "configmaps".into()))
        );
        assert_eq!(
            parse_collection("/apis/coordination.k8s.io/v1/namespaces/n/leases"),
            Some(("coordination.k8s.io/v1".into(), "n".into(), "leases".into()))
        );
        assert_eq!(parse_collection("/api/v1/pods"), None);
    }
}
