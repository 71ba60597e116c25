//! The processes of a control plane that are stopped and started again:
//! a kube-apiserver (on the same port, of this or another version) and an
//! etcd member (on the same ports, from its data directory).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::{Assets, Error, Process, io_err, wait_for_port};

fn poisoned(what: &str) -> Error {
    Error::Io {
        what: format!("{what} lock"),
        source: io::Error::other("poisoned"),
    }
}

/// One kube-apiserver.
#[derive(Debug)]
pub(crate) struct Apiserver {
    pub(crate) name: String,
    pub(crate) port: u16,
    pub(crate) args: Vec<String>,
    pub(crate) log: PathBuf,
    /// Its binary's assets: the control plane's version, or another one
    /// (a rolling upgrade).
    pub(crate) assets: Mutex<Assets>,
    pub(crate) process: Mutex<Process>,
}

impl Apiserver {
    pub(crate) fn spawn(
        name: String,
        port: u16,
        args: Vec<String>,
        log: PathBuf,
        assets: Assets,
    ) -> Result<Apiserver, Error> {
        let process = Process::spawn(&name, &assets.binary("kube-apiserver"), &args, &log)
            .map_err(io_err(format!("starting {name}")))?;
        Ok(Apiserver {
            name,
            port,
            args,
            log,
            assets: Mutex::new(assets),
            process: Mutex::new(process),
        })
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&Process) -> T) -> Result<T, Error> {
        let p = self.process.lock().map_err(|_| poisoned(&self.name))?;
        Ok(f(&p))
    }

    /// Starts it again (it must be stopped), with `assets`' binary when
    /// given.
    pub(crate) fn respawn(&self, assets: Option<Assets>) -> Result<(), Error> {
        let binary = {
            let mut current = self.assets.lock().map_err(|_| poisoned(&self.name))?;
            if let Some(a) = assets {
                *current = a;
            }
            current.binary("kube-apiserver")
        };
        let fresh = Process::spawn(&self.name, &binary, &self.args, &self.log)
            .map_err(io_err(format!("restarting {}", self.name)))?;
        *self.process.lock().map_err(|_| poisoned(&self.name))? = fresh;
        Ok(())
    }

    /// Its binary's directory, to tell versions apart.
    pub(crate) fn assets(&self) -> Option<Assets> {
        self.assets.lock().ok().map(|a| a.clone())
    }
}

/// One etcd member.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) client_port: u16,
    pub(crate) binary: PathBuf,
    pub(crate) data: PathBuf,
    /// The flags of a restart (a multi-member cluster's
    /// `--initial-cluster-state existing`).
    pub(crate) restart_args: Vec<String>,
    pub(crate) log: PathBuf,
    pub(crate) process: Mutex<Process>,
}

impl Member {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spawn(
        name: String,
        client_port: u16,
        binary: PathBuf,
        data: PathBuf,
        first_args: Vec<String>,
        restart_args: Vec<String>,
        log: PathBuf,
    ) -> Result<Member, Error> {
        let process = Process::spawn(&name, &binary, &first_args, &log)
            .map_err(io_err(format!("starting {name}")))?;
        Ok(Member {
            name,
            client_port,
            binary,
            data,
            restart_args,
            log,
            process: Mutex::new(process),
        })
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&Process) -> T) -> Result<T, Error> {
        let p = self.process.lock().map_err(|_| poisoned(&self.name))?;
        Ok(f(&p))
    }

    /// Waits until its client port accepts connections.
    pub(crate) fn wait_listening(&self, timeout: Duration) -> Result<(), Error> {
        let p = self.process.lock().map_err(|_| poisoned(&self.name))?;
        wait_for_port(&p, self.client_port, timeout)
    }

    /// Starts it again from its data directory (it must be stopped).
    pub(crate) fn respawn(&self) -> Result<(), Error> {
        let fresh = Process::spawn(&self.name, &self.binary, &self.restart_args, &self.log)
            .map_err(io_err(format!("restarting {}", self.name)))?;
        *self.process.lock().map_err(|_| poisoned(&self.name))? = fresh;
        self.wait_listening(Duration::from_secs(30))
    }

    pub(crate) fn data(&self) -> &Path {
        &self.data
    }
}
