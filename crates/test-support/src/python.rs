//! The Python `kubernetes` client (`tests/python/`, from PyPI, installed
//! into a virtualenv under the test's target directory).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A virtualenv with `tests/python/requirements.txt` installed, made once
/// under the test binary's target directory; `None` (the test skips, and
/// says why) where python3, its venv module or PyPI is unavailable.
pub fn python() -> Option<PathBuf> {
    let requirements = crate::repo().join("tests/python/requirements.txt");
    let venv = crate::target_tmpdir().join("python-clients");
    let python = venv.join("bin/python");
    let stamp = venv.join("requirements.txt");
    if python.exists() && std::fs::read(&stamp).ok() == std::fs::read(&requirements).ok() {
        return Some(python);
    }
    let _ = std::fs::remove_dir_all(&venv);
    let run = |program: &Path, args: &[&std::ffi::OsStr]| {
        std::process::Command::new(program)
            .args(args)
            .env("PIP_ROOT_USER_ACTION", "ignore")
            .output()
            .map(|o| {
                (
                    o.status.success(),
                    String::from_utf8_lossy(&o.stderr).into_owned(),
                )
            })
    };
    match run(
        Path::new("python3"),
        &["-m".as_ref(), "venv".as_ref(), venv.as_os_str()],
    ) {
        Ok((true, _)) => {}
        other => {
            kube_testenv::skip::skip(format!("the Python client: no python3 venv: {other:?}"));
            return None;
        }
    }
    match run(
        &python,
        &[
            "-m".as_ref(),
            "pip".as_ref(),
            "install".as_ref(),
            "--disable-pip-version-check".as_ref(),
            "--quiet".as_ref(),
            "-r".as_ref(),
            requirements.as_os_str(),
        ],
    ) {
        Ok((true, _)) => {}
        other => {
            kube_testenv::skip::skip(format!("the Python client: pip install failed: {other:?}"));
            return None;
        }
    }
    std::fs::copy(&requirements, &stamp).unwrap();
    Some(python)
}

/// What the Python client saw: its events and its final state.
pub struct PythonRun {
    pub events: Vec<(String, String, String)>,
    pub last: BTreeMap<String, String>,
}

/// `tests/python/list_watch.py KUBECONFIG NAMESPACE COUNT`.
pub fn list_watch_script() -> PathBuf {
    crate::repo().join("tests/python/list_watch.py")
}

/// Starts `tests/python/list_watch.py` on `kubeconfig`, waits until it
/// has listed; the returned task ends with what it saw after `count` events.
pub async fn python_client(
    python: &Path,
    kubeconfig: &Path,
    ns: &str,
    count: usize,
) -> tokio::task::JoinHandle<PythonRun> {
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(list_watch_script())
        .arg(kubeconfig)
        .arg(ns)
        .arg(count.to_string());
    python_run(cmd).await
}

/// Starts `cmd` (a client speaking `list_watch.py`'s protocol on stdout:
/// the Python client, or another client in a pod), waits until it has
/// listed; the returned task ends with what it saw. What is not a JSON
/// object (a test harness's own lines) is skipped.
pub async fn python_run(mut cmd: tokio::process::Command) -> tokio::task::JoinHandle<PythonRun> {
    use tokio::io::AsyncBufReadExt;
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    // A line's JSON object: from its first `{` (a test harness may have
    // written the test's name before it), or none.
    let object = |line: &str| line.find('{').map(|i| line[i..].to_string());
    let first = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the client lists within 60 s")
            .unwrap()
            .expect("the client lists");
        if let Some(object) = object(&line) {
            break object;
        }
    };
    let ready: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert!(ready["ready"].is_string(), "{first}");
    tokio::spawn(async move {
        let _child = child;
        let mut run = PythonRun {
            events: Vec::new(),
            last: BTreeMap::new(),
        };
        while let Ok(Ok(Some(line))) =
            tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await
        {
            let Some(line) = object(&line) else {
                continue;
            };
            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            if let Some(last) = v.get("final") {
                run.last = serde_json::from_value(last.clone()).unwrap();
                break;
            }
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            run.events.push((field("type"), field("name"), field("rv")));
        }
        run
    })
}
