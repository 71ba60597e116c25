//! Child processes that cannot outlive the test binary that started them.
//!
//! A Rust test binary has no hook that runs at exit (statics are never
//! dropped), and a failed or killed test must not leave etcd, an apiserver
//! or a hollow kubelet running. So every child gets `PR_SET_PDEATHSIG`
//! (`SIGKILL`): the kernel kills it when its parent goes away, however the
//! parent ends. The signal is tied to the *thread* that forked the child,
//! not the process, and the test harness runs each test on a thread that
//! ends with the test; so children are spawned from one thread that lives
//! as long as the process.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

type Job = (Command, mpsc::Sender<io::Result<Child>>);

/// The spawning thread's queue. The sender lives in a static, so the
/// thread's loop never ends.
static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();

fn spawner() -> io::Result<&'static Mutex<mpsc::Sender<Job>>> {
    if let Some(s) = SPAWNER.get() {
        return Ok(s);
    }
    let (tx, rx) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("testenv-spawner".into())
        .spawn(move || {
            for (mut command, reply) in rx {
                let _ = reply.send(command.spawn());
            }
        })?;
    Ok(SPAWNER.get_or_init(|| Mutex::new(tx)))
}

/// Spawns `command` so that the kernel kills it (`SIGKILL`) when this
/// process ends, however it ends: a test binary's failed test, or a load
/// tool stopped with Ctrl-C, leaves nothing running.
///
/// # Errors
/// When it cannot be started.
pub fn spawn_tied(mut command: Command) -> io::Result<Child> {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes two system calls (prctl, getppid), both async-signal-safe;
    // it allocates nothing and takes no lock.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The parent may have died before the signal was armed.
            if rustix::process::getppid() != Some(parent) {
                return Err(io::Error::other("the parent process is gone"));
            }
            Ok(())
        });
    }
    let (reply, result) = mpsc::channel();
    spawner()?
        .lock()
        .map_err(|_| io::Error::other("spawner lock poisoned"))?
        .send((command, reply))
        .map_err(|_| io::Error::other("spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| io::Error::other("spawner thread is gone"))?
}

/// A running child process, with its output in a log file. Dropping it
/// kills it.
#[derive(Debug)]
pub struct Process {
    name: String,
    child: Mutex<Child>,
    log: PathBuf,
}

// === impl Process ===

impl Process {
    /// Starts `program` with `args`, its stdout and stderr appended to
    /// `log`, killed with the test binary.
    ///
    /// # Errors
    /// When the log cannot be opened or the program cannot be started.
    pub fn spawn(name: &str, program: &Path, args: &[String], log: &Path) -> io::Result<Process> {
        let out = File::options().create(true).append(true).open(log)?;
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = spawn_tied(command)?;
        Ok(Process {
            name: name.to_string(),
            child: Mutex::new(child),
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.lock().map(|c| c.id()).unwrap_or_default()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&self) -> Option<ExitStatus> {
        self.child
            .lock()
            .ok()
            .and_then(|mut c| c.try_wait().ok().flatten())
    }

    fn signal(&self, signal: Signal) -> io::Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.pid()).unwrap_or_default())
            .ok_or_else(|| io::Error::other("no pid"))?;
        rustix::process::kill_process(pid, signal)?;
        Ok(())
    }

    /// Suspends it (`SIGSTOP`): it keeps its sockets but answers nothing,
    /// like a hung server.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause(&self) -> io::Result<()> {
        self.signal(Signal::STOP)
    }

    /// Resumes it after [`Process::pause`] (`SIGCONT`).
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume(&self) -> io::Result<()> {
        self.signal(Signal::CONT)
    }

    /// Sends `SIGTERM` and waits up to `grace` for it to exit, then kills
    /// it.
    pub fn terminate(&self, grace: Duration) {
        let _ = self.signal(Signal::TERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }

    /// Kills it (`SIGKILL`) and reaps it.
    pub fn kill(&self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The last `bytes` of its output, for failure messages.
    pub fn log_tail(&self, bytes: u64) -> String {
        tail(&self.log, bytes)
    }

    /// Its log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The name it was started with.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `bytes` of a file, lossily as text.
pub fn tail(path: &Path, bytes: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or_default();
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(bytes)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Whether process `pid` exists.
pub fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}
