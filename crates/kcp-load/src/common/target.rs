//! The target of a run: `TargetArgs` (a kubeconfig's server, `--sim` or
//! `--real`), the `--encoding` of reads, the started apiserver and proxy
//! (`Env`), and the resourceVersion of a list.

use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use clap::{Args, ValueEnum};
use http::{Method, StatusCode};
use serde_json::Value;

use crate::client::{Proto, Target};
use crate::env::{RunningProxy, SimArgs, SimEnv};
use crate::real::{RealArgs, RealEnv};

#[derive(Debug, Clone, Args)]
pub struct TargetArgs {
    /// Kubeconfig of the server to load (the proxy, or an apiserver).
    /// Unset, and without --sim: the in-cluster configuration.
    #[arg(long, env = "KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Context of the kubeconfig.
    #[arg(long)]
    pub context: Option<String>,
    /// HTTP version.
    #[arg(long, value_enum, default_value_t = Proto::H2)]
    pub proto: Proto,
    /// What reads ask for: `json` (`application/json`), `protobuf`
    /// (`application/vnd.kubernetes.protobuf,application/json`, what
    /// kubelet and kube-proxy send), or `table` (what `kubectl get` sends).
    #[arg(long, value_enum, default_value_t = Encoding::Json)]
    pub encoding: Encoding,
    #[command(flatten)]
    pub sim: SimArgs,
    #[command(flatten)]
    pub real: RealArgs,
}

/// The `--encoding` of reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Encoding {
    Json,
    Protobuf,
    /// A `Table`, as `kubectl get` asks.
    Table,
}

impl Encoding {
    pub fn accept(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Protobuf => "application/vnd.kubernetes.protobuf,application/json",
            Encoding::Table => {
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            }
        }
    }
}

/// A started apiserver (simulated or real) and the proxy in front of it.
pub enum Env {
    Sim(SimEnv),
    Real(Box<RealEnv>),
}

impl Env {
    pub fn proxy(&self) -> &RunningProxy {
        match self {
            Env::Sim(e) => &e.proxy,
            Env::Real(e) => &e.proxy,
        }
    }

    /// A kubeconfig for admin (`system:masters`) reaching the proxy, or
    /// the apiserver when `direct`.
    pub fn kubeconfig(&self, direct: bool) -> Result<PathBuf> {
        match self {
            Env::Sim(e) => e.kubeconfig(direct),
            Env::Real(e) => e.kubeconfig(direct),
        }
    }

    /// The apiserver, directly, as admin.
    pub async fn direct(&self) -> Result<Target> {
        match self {
            Env::Sim(e) => Target::from_kubeconfig(Some(&e.kubeconfig(true)?), None).await,
            Env::Real(e) => Ok(e.direct.clone()),
        }
    }

    pub fn proxy_pid(&self) -> u32 {
        self.proxy().pid()
    }

    pub fn proxy_is_separate(&self) -> bool {
        self.proxy().is_separate()
    }

    pub async fn stop(self) {
        match self {
            Env::Sim(e) => e.stop().await,
            Env::Real(e) => e.stop().await,
        }
    }
}

/// The target: a started apiserver and proxy, or a kubeconfig's server.
pub async fn resolve(t: &TargetArgs) -> Result<(Target, Option<Env>)> {
    if t.real.real {
        let env = Env::Real(Box::new(RealEnv::start(&t.real, &t.sim).await?));
        let target = Target::from_kubeconfig(Some(&env.kubeconfig(false)?), None)
            .await?
            .with_accept(t.encoding.accept());
        println!("target: {} (the proxy)", target.base());
        Ok((target, Some(env)))
    } else if t.sim.sim {
        let env = Env::Sim(SimEnv::start(&t.sim).await?);
        let kubeconfig = env.kubeconfig(t.sim.direct)?;
        let target = Target::from_kubeconfig(Some(&kubeconfig), None)
            .await?
            .with_accept(t.encoding.accept());
        println!(
            "target: {} ({})",
            target.base(),
            if t.sim.direct {
                "the simulated apiserver, directly"
            } else {
                "the proxy"
            }
        );
        Ok((target, Some(env)))
    } else {
        let target = Target::from_kubeconfig(t.kubeconfig.as_deref(), t.context.clone())
            .await?
            .with_accept(t.encoding.accept());
        println!("target: {}", target.base());
        Ok((target, None))
    }
}

pub fn encode_query(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `metadata.resourceVersion` of a list response.
pub async fn list_rv(target: &Target, proto: Proto, path: &str) -> Result<String> {
    let target = target.clone().with_accept("application/json");
    let mut conn = target.connect(proto).await?;
    let resp = target.fetch(&mut conn, Method::GET, path, None).await?;
    if resp.status != StatusCode::OK {
        bail!(
            "GET {path}: {} {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
    }
    let v: Value = serde_json::from_slice(&resp.body)?;
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("GET {path}: no metadata.resourceVersion"))
}
