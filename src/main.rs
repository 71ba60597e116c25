//! The `kube-cache-proxy` binary: parse flags, load and check the
//! configuration (exit 64 on a bad one, before any socket is bound), run
//! until SIGTERM or SIGINT. `--help` lists every exit status
//! ([`kube_cache_proxy::component::cli::EXIT_STATUSES`]).

// `kube-cache-proxy demo`: only with the `demo` feature, which brings in
// the simulated apiserver; the production image is built without it.
#[cfg(feature = "demo")]
mod demo;

use std::process::ExitCode;

use clap::Parser;
use kube_cache_proxy::component::cli::{Cli, Command, ServeArgs};
use kube_cache_proxy::component::config::Config;
use kube_cache_proxy::server::tls::ServerTls;
use kube_cache_proxy::upstream::identity::Identity;
use kube_cache_proxy::upstream::{self, Upstream, UpstreamError};
use kube_cache_proxy::{Listeners, RunError};

/// `EX_USAGE` from sysexits.h: the command line or the configuration is
/// wrong; the operator must fix it (restarting will not help).
const EXIT_USAGE: u8 = 64;

/// jemalloc, not glibc's malloc: the watch cache's resident memory is
/// 1.41-1.43x its objects' JSON in every run, where glibc's arenas keep
/// 1.36-1.80x from one run to the next; the large buffers of a list
/// are returned to the kernel once freed (`oversize_threshold`), and the
/// rest of what a burst freed within about a second, by a background
/// thread, even in an idle proxy (`background_thread`, `dirty_decay_ms`;
/// all set in .cargo/config.toml). Measured in docs/performance.md (i),
/// "The allocator, jemalloc", and (c), "A first list packed as it is read".
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Test builds only: fault injection points named in FAILPOINTS.
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    // Test builds only: a protobuf schema without the fields named in
    // KUBE_CACHE_PROXY_TEST_HIDE_PROTOBUF_FIELDS (`<message>.<jsonName>`,
    // comma-separated), as an older proxy's.
    #[cfg(feature = "failpoints")]
    if let Ok(fields) = std::env::var("KUBE_CACHE_PROXY_TEST_HIDE_PROTOBUF_FIELDS") {
        apimachinery::protobuf::transcode::hide_fields(
            fields
                .split(',')
                .filter_map(|f| f.trim().rsplit_once('.'))
                .map(|(m, k)| (m.to_string(), k.to_string()))
                .collect(),
        );
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let usage = e.use_stderr();
            let _ = e.print();
            return if usage {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if cli.print_default_config {
        return match Config::default_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("kube-cache-proxy: {e}");
                ExitCode::FAILURE
            }
        };
    }
    kube_cache_proxy::component::logging::init(cli.logging_format, cli.v);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kube-cache-proxy: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        #[cfg(feature = "demo")]
        Some(Command::Demo(args)) => runtime
            .block_on(demo::run(args, shutdown_signal()))
            .map_err(anyhow::Error::from),
        Some(Command::Serve(args)) => runtime.block_on(serve(args)),
        Some(Command::PrepareStateDir(args)) => prepare_state_dir(&args),
        Some(Command::Probe(args)) => runtime.block_on(probe(&args)),
        Some(Command::Status(args)) => runtime.block_on(status(&args)),
        None => match cli.validate_config {
            Some(file) => runtime.block_on(validate(file, cli.serve)),
            None => runtime.block_on(serve(cli.serve)),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // RunError messages already carry their causes.
            eprintln!("kube-cache-proxy: {e}");
            let usage = e.downcast_ref::<RunError>().is_some_and(is_configuration);
            if usage {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Whether the operator must fix the configuration (exit 64): the file or
/// flags, or the TLS material and kubeconfig they name. Binding and
/// metrics errors are runtime failures (exit 1).
fn is_configuration(e: &RunError) -> bool {
    match e {
        RunError::Config(_) | RunError::Tls(_) => true,
        RunError::Upstream(e) => matches!(e, UpstreamError::Config(_)),
        RunError::Bind { .. } | RunError::Metrics(_) | RunError::Takeover(_) => false,
    }
}

/// The configuration from `--config` (or the defaults) with the flags
/// applied, validated field by field.
fn load(args: &ServeArgs) -> Result<Config, RunError> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => Config::default(),
    };
    config.apply(&args.overrides());
    config.validate()?;
    Ok(config)
}

/// Loads what the configuration names, as `run` will, without binding or
/// connecting: the serving certificate and key (matched), the client CA,
/// the upstream kubeconfig and the identity it gives. With `tls.csr` the
/// serving certificate is obtained at run time; its section is validated.
async fn check(config: &Config) -> Result<(), RunError> {
    if !config.tls.csr.enabled {
        ServerTls::load(&config.tls)?;
    }
    let kube_config = upstream::load_kube_config(
        config.upstream.kubeconfig.as_deref(),
        config.upstream.context.clone(),
    )
    .await?;
    // client-go refuses a certificate authority it cannot parse ("unable
    // to load root certificates"); kube would trust nothing and fail every
    // request instead.
    if kube_config.root_cert.as_ref().is_some_and(Vec::is_empty) {
        return Err(UpstreamError::Config(format!(
            "{}: the certificate authority holds no PEM certificate",
            config.upstream.kubeconfig.as_deref().map_or_else(
                || "in-cluster ca.crt".to_string(),
                |p| p.display().to_string()
            )
        ))
        .into());
    }
    Identity::detect(&kube_config, config.upstream.identity, &config.node_name)
        .map_err(UpstreamError::Config)?;
    Upstream::new(
        &kube_config,
        std::time::Duration::from_secs(config.upstream.connect_timeout_seconds),
        std::time::Duration::from_secs(config.upstream.idle_timeout_seconds),
    )?;
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let config = load(&args)?;
    // Everything the operator could have got wrong fails here, before any
    // socket is bound.
    check(&config).await?;
    let listeners = Listeners::acquire(&config).await?;
    kube_cache_proxy::run(listeners, config, shutdown_signal()).await?;
    Ok(())
}

/// `--validate-config FILE`: the checks `serve` makes before binding.
async fn validate(file: std::path::PathBuf, mut args: ServeArgs) -> anyhow::Result<()> {
    args.config = Some(file.clone());
    let config = load(&args)?;
    check(&config).await?;
    println!("{}: valid", file.display());
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            let _ = tokio::signal::ctrl_c().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `prepare-state-dir`: the directory, owned by the proxy's user, 0700.
fn prepare_state_dir(
    args: &kube_cache_proxy::component::cli::PrepareStateDirArgs,
) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(&args.dir)?;
    std::os::unix::fs::chown(&args.dir, Some(args.uid), Some(args.gid))?;
    std::fs::set_permissions(&args.dir, std::fs::Permissions::from_mode(0o700))?;
    tracing::info!(dir = %args.dir.display(), uid = args.uid, gid = args.gid, "state directory ready");
    Ok(())
}

/// `probe`: a GET of a plain-HTTP URL; an error unless it answers 200.
async fn probe(args: &kube_cache_proxy::component::cli::ProbeArgs) -> anyhow::Result<()> {
    let (status, body) = plain_get(&args.url, args.timeout_seconds).await?;
    if status == http::StatusCode::OK {
        Ok(())
    } else {
        anyhow::bail!("{}: {status}: {}", args.url, String::from_utf8_lossy(&body))
    }
}

/// `status`: the admin port's `/debug/caches`, as a table or as it is.
async fn status(args: &kube_cache_proxy::component::cli::StatusArgs) -> anyhow::Result<()> {
    use kube_cache_proxy::cache::status::{Status, table};
    use kube_cache_proxy::component::cli::StatusOutput;
    let url = format!("http://{}/debug/caches", args.admin_address);
    let (code, body) = plain_get(&url, args.timeout_seconds).await?;
    if code != http::StatusCode::OK {
        anyhow::bail!("{url}: {code}: {}", String::from_utf8_lossy(&body));
    }
    match args.output {
        StatusOutput::Json => print!("{}", String::from_utf8_lossy(&body)),
        StatusOutput::Table => {
            let status: Status = serde_json::from_slice(&body)
                .map_err(|e| anyhow::anyhow!("{url}: not a status: {e}"))?;
            print!("{}", table(&status));
        }
    }
    Ok(())
}

/// A GET of a plain-HTTP URL on this host (the admin port): its status
/// and body, within `timeout_seconds`.
async fn plain_get(
    url: &str,
    timeout_seconds: u64,
) -> anyhow::Result<(http::StatusCode, bytes::Bytes)> {
    use http_body_util::BodyExt;
    let uri: http::Uri = url.parse()?;
    let authority = uri
        .authority()
        .ok_or_else(|| anyhow::anyhow!("{url}: no host:port"))?
        .clone();
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(authority.as_str()).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(http::header::HOST, authority.as_str())
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(std::time::Duration::from_secs(timeout_seconds), exchange)
        .await
        .map_err(|_| anyhow::anyhow!("{url}: no answer in {timeout_seconds} s"))?
}
