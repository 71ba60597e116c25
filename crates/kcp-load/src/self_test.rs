//! `--self-test`: every measurement, small, against the simulated
//! apiserver and an in-process proxy; an error or a miscount fails it.

use anyhow::{Result, anyhow, bail};

use crate::authz::{AuthzArgs, authz_on};
use crate::client::{Proto, Target};
use crate::common::plan::{Compared, LoadArgs, path_resource};
use crate::common::target::{Encoding, Env, TargetArgs};
use crate::env::{SimArgs, SimEnv};
use crate::get::{GetArgs, get_on};
use crate::idle::{IdleArgs, idle_on};
use crate::ingest::{IngestArgs, IngestPath, ObjectKind, ingest};
use crate::list::{ListArgs, list_on};
use crate::real::RealArgs;
use crate::watch::{ResourceArgs, WatchArgs, watch_on};

pub async fn self_test() -> Result<()> {
    let sim_args = SimArgs {
        sim: true,
        direct: false,
        proxy_bin: None,
        sim_pods: 300,
        sim_nodes: 10,
        watcher_buffer: None,
    };
    let target_args = TargetArgs {
        kubeconfig: None,
        context: None,
        proto: Proto::H2,
        encoding: Encoding::Json,
        sim: sim_args.clone(),
        real: RealArgs {
            real: false,
            pods: 0,
            configmaps: 0,
        },
    };
    let sim_env = SimEnv::start(&sim_args).await?;
    let target = Target::from_kubeconfig(Some(&sim_env.kubeconfig(false)?), None).await?;
    let env = Env::Sim(sim_env);
    let mut failures = Vec::new();

    for encoding in [Encoding::Json, Encoding::Protobuf] {
        println!("=== watch ({encoding:?}): 50 watchers, 1 writer at 20 writes/s for 3s");
        let target = target.clone().with_accept(encoding.accept());
        let w = watch_on(
            &target,
            Some(&env),
            &WatchArgs {
                target: TargetArgs {
                    encoding,
                    ..target_args.clone()
                },
                resource: ResourceArgs {
                    namespace: "default".into(),
                    group: String::new(),
                    version: "v1".into(),
                    resource: "configmaps".into(),
                    kind: None,
                },
                watchers: 50,
                watchers_per_conn: 20,
                writers: 1,
                rate: 20.0,
                duration: 3,
                objects_per_writer: 2,
                payload_bytes: 64,
                drain: 5,
                lists: 3,
                list_path: "/api/v1/pods?resourceVersion=0".into(),
                keep: false,
            },
        )
        .await?;
        if w.writes == 0 || w.delivered != w.expected || w.errors > 0 {
            failures.push(format!("watch ({encoding:?}): {w:?}"));
        }
    }

    let load_args = |concurrency: usize, write_rate: f64| LoadArgs {
        concurrency,
        rounds: 1,
        write_rate,
        write_collection: None,
        other_write_rate: if write_rate > 0.0 { 10.0 } else { 0.0 },
        compare_kubeconfig: None,
    };
    println!("=== get: 50 requests per path");
    let g = get_on(
        &target,
        Some(&env),
        &GetArgs {
            target: target_args.clone(),
            requests: 50,
            warmup: 5,
            paths: Vec::new(),
            load: load_args(1, 0.0),
        },
    )
    .await?;
    failures.extend(check_compared(&g));

    println!("=== get: 20 clients, a consistent GET (passed through, no probe)");
    let g = get_on(
        &target,
        Some(&env),
        &GetArgs {
            target: target_args.clone(),
            requests: 10,
            warmup: 1,
            paths: vec!["/api/v1/namespaces/default/configmaps/kcp-load-get".into()],
            load: load_args(20, 0.0),
        },
    )
    .await?;
    failures.extend(check_compared(&g));
    for c in &g {
        let reads = c.target.reads.clone().unwrap_or_default();
        let passed = reads
            .get(
                ["configmaps", "GET", "upstream", "consistent_get"]
                    .map(String::from)
                    .as_slice(),
            )
            .copied()
            .unwrap_or(0.0);
        let probes: f64 = c.target.probes.iter().flatten().map(|(_, v)| v).sum();
        if passed != c.target.requests as f64 || probes > 0.0 {
            failures.push(format!(
                "consistent get: {passed} of {} passed through early, {probes} probes: {reads:?}",
                c.target.requests
            ));
        }
    }

    println!("=== list: 20 clients, consistent and RV=0 lists, a writer at 20/s");
    let l = list_on(
        &target,
        Some(&env),
        &ListArgs {
            target: target_args.clone(),
            requests: 5,
            warmup: 1,
            paths: vec!["/api/v1/namespaces/default/configmaps".into()],
            load: load_args(20, 20.0),
        },
    )
    .await?;
    failures.extend(check_compared(&l));
    let l0 = list_on(
        &target,
        Some(&env),
        &ListArgs {
            target: target_args.clone(),
            requests: 5,
            warmup: 1,
            paths: vec!["/api/v1/namespaces/default/configmaps?resourceVersion=0".into()],
            load: load_args(20, 0.0),
        },
    )
    .await?;
    failures.extend(check_compared(&l0));
    for c in l.iter().chain(&l0) {
        let resource = path_resource(&c.path);
        let counted: f64 = c
            .target
            .reads
            .iter()
            .flatten()
            .filter(|(k, _)| k[0] == "configmaps" && k[1] == "LIST")
            .map(|(_, v)| v)
            .sum();
        if counted != c.target.requests as f64 {
            failures.push(format!(
                "list {}: the proxy counted {counted} reads of {}",
                c.path, c.target.requests
            ));
        }
        if c.path.ends_with("resourceVersion=0")
            && resource.and_then(|r| c.target.cache_share(&r)) != Some(1.0)
        {
            failures.push(format!("list {}: not all from the cache", c.path));
        }
    }

    println!("=== idle: 200 watches");
    let idle = idle_on(
        &target,
        Some(&env),
        &IdleArgs {
            target: target_args.clone(),
            watchers: 200,
            watchers_per_conn: 100,
            path: "/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3D{node}&resourceVersion={rv}&timeoutSeconds=600".into(),
            rv_path: "/api/v1/pods?limit=1".into(),
            pid: None,
            steps: 2,
            hold: 0,
        },
    )
    .await?;
    println!(
        "(idle: {:.0} B per watch, in-process: proxy, sim and clients together)",
        idle.per_watcher
    );
    if idle.errors > 0 {
        failures.push(format!("idle: {idle:?}"));
    }

    println!("=== authz: 20 identities");
    let Env::Sim(sim_env) = &env else {
        bail!("the self-test runs against --sim");
    };
    let z = authz_on(
        sim_env,
        &AuthzArgs {
            target: target_args.clone(),
            identities: 20,
            warm: 3,
            path: "/api/v1/namespaces/default/configmaps?resourceVersion=0".into(),
        },
    )
    .await?;
    if z.decision_cache_us.is_nan() || z.decision_upstream_us.is_nan() {
        failures.push(format!("authz: a decision source was never seen: {z:?}"));
    }
    env.stop().await;

    println!("=== ingest: 2000 pods");
    let i = ingest(&IngestArgs {
        objects: 2000,
        kind: ObjectKind::Pod,
        via: IngestPath::Apply,
        protobuf: true,
        protobuf_cache_mib: 64,
        protobuf_cache_percent: 5,
        protobuf_reads: 1,
    })?;
    // The RSS figure means something only in a fresh process (`kcp-load
    // ingest`): here the sim's and proxy's freed memory is reused.
    println!(
        "(ingest RSS ratio {:.3}: not meaningful in the self-test's used process)",
        i.ratio
    );
    if i.accounted == 0 {
        failures.push(format!("ingest: {i:?}"));
    }

    if failures.is_empty() {
        println!("self-test: passed");
        Ok(())
    } else {
        Err(anyhow!("self-test failed: {}", failures.join("; ")))
    }
}

/// Errors of compared runs, as self-test failures.
fn check_compared(runs: &[Compared]) -> Vec<String> {
    let mut failures = Vec::new();
    for c in runs {
        for (side, o) in [("proxy", Some(&c.target)), ("direct", c.direct.as_ref())] {
            match o {
                Some(o) if o.errors > 0 || o.requests == 0 => failures.push(format!(
                    "{} via {side}: {} errors of {} requests: {:?}",
                    c.path, o.errors, o.requests, o.last_error
                )),
                None => failures.push(format!("{}: no direct run to compare with", c.path)),
                Some(_) => {}
            }
        }
    }
    failures
}
