//! The `kube-cache-proxy` binary: parse flags, load and validate the
//! configuration (exit 64 on error, before any socket is bound), run until
//! SIGTERM or SIGINT.

use std::process::ExitCode;

use clap::Parser;
use kube_cache_proxy::cli::{Cli, Command, LogFormat, ServeArgs};
use kube_cache_proxy::config::Config;
use kube_cache_proxy::{Listeners, RunError};

/// `EX_USAGE` from sysexits.h: the configuration or the command line is wrong.
const EXIT_USAGE: u8 = 64;

fn main() -> ExitCode {
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
    init_tracing(cli.log_format);
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
            .block_on(kube_cache_proxy::demo::run(args, shutdown_signal()))
            .map_err(anyhow::Error::from),
        Some(Command::Serve(args)) => runtime.block_on(serve(args)),
        None => runtime.block_on(serve(cli.serve)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // RunError messages already carry their causes.
            eprintln!("kube-cache-proxy: {e}");
            let usage = e
                .downcast_ref::<RunError>()
                .is_some_and(|e| matches!(e, RunError::Config(_)));
            if usage {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path).map_err(RunError::Config)?,
        None => Config::default(),
    };
    config.apply(&args.overrides());
    config.validate().map_err(RunError::Config)?;
    let listeners = Listeners::acquire(&config).await?;
    kube_cache_proxy::run(listeners, config, shutdown_signal()).await?;
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

fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
