//! `exec` and `attach` over WebSocket: kubectl's remotecommand channel
//! protocol, as kube-apiserver v1.36 serves it
//! ([`staging/src/k8s.io/apiserver/pkg/util/proxy/websocket.go`](https://github.com/kubernetes/kubernetes/blob/v1.36.2/staging/src/k8s.io/apiserver/pkg/util/proxy/websocket.go),
//! [`wsstream`](https://github.com/kubernetes/kubernetes/blob/v1.36.2/staging/src/k8s.io/apimachinery/pkg/util/httpstream/wsstream/conn.go))
//! and the kubelet's v4 (`cri-streaming/.../remotecommand/websocket.go`):
//!
//! - subprotocol `v5.channel.k8s.io` (preferred) or `v4.channel.k8s.io`;
//! - every binary message starts with its channel: 0 stdin, 1 stdout,
//!   2 stderr, 3 error, 4 resize (JSON `{"Width":..,"Height":..}`), and
//!   with v5, 255 close: `[255, 0]` half-closes stdin;
//! - the server first writes an empty message on stdout (else stderr, else
//!   error), then the streams, then a `metav1.Status` on the error channel
//!   (`Success`, or `Failure` with reason `NonZeroExitCode` and the exit
//!   code as an `ExitCode` cause, or `InternalError`) and closes.
//!
//! What runs is [`shell`](super::shell): a few commands a container of
//! the demo can run.

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Message, Role};

use super::shell::{self, Exit, Io};
use super::shutdown::until_stopped;

/// `v5.channel.k8s.io`: v4 plus the close signal.
pub const V5: &str = "v5.channel.k8s.io";
/// `v4.channel.k8s.io`: exit codes in the error channel's Status.
pub const V4: &str = "v4.channel.k8s.io";

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;
const CLOSE: u8 = 255;

/// Messages buffered between the connection and the program, each way.
const QUEUE: usize = 16;

/// The subprotocol to answer with, from those the client offers.
pub fn negotiate(offered: &[String]) -> Option<&'static str> {
    [V5, V4]
        .into_iter()
        .find(|p| offered.iter().any(|o| o == p))
}

/// What the request asked for (`PodExecOptions`/`PodAttachOptions`).
#[derive(Debug, Clone, Default)]
pub struct Options {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// What to run: a command (exec) or the container's main process
/// (attach).
#[derive(Debug, Clone)]
pub enum Program {
    Exec(Vec<String>),
    Attach,
}

/// Serves one session on an upgraded connection.
pub async fn serve(
    upgraded: Upgraded,
    protocol: &'static str,
    options: Options,
    program: Program,
    pod: String,
    shutdown: watch::Receiver<bool>,
) {
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
    let (mut sink, mut source) = ws.split();
    let first = if options.stdout {
        STDOUT
    } else if options.stderr {
        STDERR
    } else {
        ERROR
    };
    if sink.send(frame(first, &[])).await.is_err() {
        return;
    }
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Bytes)>(QUEUE);
    let (in_tx, in_rx) = mpsc::channel::<Bytes>(QUEUE);
    let mut stdin = options.stdin.then_some(in_tx);
    let io = Io::new(
        options.stdin.then_some(in_rx),
        out_tx,
        options.stdout,
        options.stderr,
        options.tty,
    );
    let mut running = tokio::spawn(async move {
        match program {
            Program::Exec(argv) => shell::exec(&argv, &pod, io).await,
            Program::Attach => shell::attach(&pod, io).await,
        }
    });
    let mut writer = tokio::spawn(async move {
        while let Some((channel, data)) = out_rx.recv().await {
            if sink.send(frame(channel, &data)).await.is_err() {
                return None;
            }
        }
        Some(sink)
    });
    let exit = loop {
        tokio::select! {
            exit = &mut running => break exit.unwrap_or(Exit::Code(1)),
            message = source.next() => match message {
                Some(Ok(Message::Binary(data))) => match (data.first(), data.get(1)) {
                    (Some(&STDIN), _) => {
                        if let Some(tx) = &stdin {
                            // The program has ended if this fails.
                            let _ = tx.send(data.slice(1..)).await;
                        }
                    }
                    (Some(&CLOSE), Some(&STDIN)) if protocol == V5 => stdin = None,
                    // Terminal sizes are accepted and ignored.
                    (Some(&RESIZE), _) => {}
                    _ => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                    running.abort();
                    writer.abort();
                    return;
                }
                Some(Ok(_)) => {}
            },
            () = until_stopped(shutdown.clone()) => {
                running.abort();
                writer.abort();
                return;
            }
        }
    };
    // Every output queued is written before the status.
    let Ok(Some(mut sink)) = (&mut writer).await else {
        return;
    };
    let _ = sink
        .send(frame(ERROR, exit_status(&exit).to_string().as_bytes()))
        .await;
    // A normal closure: client-go reports any other as an error.
    let close = CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    };
    let _ = sink.send(Message::Close(Some(close))).await;
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::Binary(bytes.into())
}

/// The `metav1.Status` the kubelet writes on the error channel
/// (`cri-streaming/pkg/streaming/remotecommand/exec.go`, `ServeExec`).
pub fn exit_status(exit: &Exit) -> serde_json::Value {
    match exit {
        Exit::Code(0) => json!({"metadata": {}, "status": "Success"}),
        Exit::Code(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command, exit code {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Exit::Error(message) => {
            let message = format!("error executing command in container: {message}");
            json!({
                "metadata": {},
                "status": "Failure",
                "message": format!("Internal error occurred: {message}"),
                "reason": "InternalError",
                "details": {"causes": [{"message": message}]},
                "code": 500,
            })
        }
    }
}

/// WebSocket `portforward`: every message is sent back as it came.
pub async fn echo(upgraded: Upgraded, shutdown: watch::Receiver<bool>) {
    let mut ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
    loop {
        tokio::select! {
            message = ws.next() => match message {
                Some(Ok(m @ (Message::Binary(_) | Message::Text(_)))) => {
                    if ws.send(m).await.is_err() {
                        return;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
            () = until_stopped(shutdown.clone()) => return,
        }
    }
}
