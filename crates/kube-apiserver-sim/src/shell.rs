//! What a simulated container runs for `exec` and `attach`: a handful of
//! commands and a small shell, enough for `kubectl exec pod -- echo hi`,
//! `kubectl exec -i pod -- cat`, `kubectl exec pod -- sh -c 'exit 3'` and
//! an interactive `kubectl exec -it pod -- sh` to behave as they do against
//! a real container.
//!
//! Commands: `echo [-n]`, `cat` (stdin, or `/etc/hostname`), `true`,
//! `false`, `exit [n]`, `hostname`, `pwd`, `whoami`, `uname [-a]`, `date`,
//! `env`, `ls`, `sleep n`, `sh`/`bash` (`-c script`, or interactive).
//! Scripts split on `;` and words on blanks, with '…' and "…" quotes. A
//! command the container does not have fails as the runtime does: exec
//! answers an `InternalError` ("executable file not found in $PATH"), the
//! shell prints `sh: x: not found` and sets status 127.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

const STDOUT: u8 = 1;
const STDERR: u8 = 2;
/// The longest `sleep`, in seconds.
const MAX_SLEEP: u64 = 3600;

/// How a program ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// It could not be run.
    Error(String),
}

/// A program's standard streams.
#[derive(Debug)]
pub struct Io {
    stdin: Option<mpsc::Receiver<Bytes>>,
    /// Read from stdin, not consumed yet.
    pending: Vec<u8>,
    out: mpsc::Sender<(u8, Bytes)>,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

// === impl Io ===

impl Io {
    /// Streams over `stdin` (when asked for) and `out` (channel, bytes).
    pub fn new(
        stdin: Option<mpsc::Receiver<Bytes>>,
        out: mpsc::Sender<(u8, Bytes)>,
        stdout: bool,
        stderr: bool,
        tty: bool,
    ) -> Io {
        Io {
            stdin,
            pending: Vec::new(),
            out,
            stdout,
            stderr,
            tty,
        }
    }

    async fn send(&self, channel: u8, bytes: Vec<u8>) {
        // The session has ended if this fails; the program ends soon after.
        let _ = self.out.send((channel, Bytes::from(bytes))).await;
    }

    /// Writes `text` to stdout; a terminal turns `\n` into `\r\n`.
    async fn print(&self, text: &str) {
        if self.stdout {
            self.send(STDOUT, self.terminal(text)).await;
        }
    }

    /// Writes `text` to stderr (to stdout on a terminal, which has one
    /// stream).
    async fn eprint(&self, text: &str) {
        if self.tty {
            self.print(text).await;
        } else if self.stderr {
            self.send(STDERR, text.as_bytes().to_vec()).await;
        }
    }

    fn terminal(&self, text: &str) -> Vec<u8> {
        if self.tty {
            text.replace('\n', "\r\n").into_bytes()
        } else {
            text.as_bytes().to_vec()
        }
    }

    /// The next bytes of stdin; `None` at its end.
    async fn read(&mut self) -> Option<Vec<u8>> {
        if !self.pending.is_empty() {
            return Some(std::mem::take(&mut self.pending));
        }
        let chunk = self.stdin.as_mut()?.recv().await?;
        Some(chunk.to_vec())
    }

    /// The next line of stdin, without its end; `None` at the end of
    /// stdin (or Ctrl-D on an empty terminal line). A terminal echoes what
    /// is typed and handles backspace and Ctrl-C.
    async fn read_line(&mut self) -> Option<String> {
        let mut line: Vec<u8> = Vec::new();
        loop {
            let Some(chunk) = self.read().await else {
                return (!line.is_empty()).then(|| String::from_utf8_lossy(&line).into_owned());
            };
            let mut echo = Vec::new();
            for (i, &b) in chunk.iter().enumerate() {
                match b {
                    b'\r' | b'\n' => {
                        let mut rest = &chunk[i + 1..];
                        if b == b'\r' && rest.first() == Some(&b'\n') {
                            rest = &rest[1..];
                        }
                        self.pending = rest.to_vec();
                        if self.tty {
                            echo.extend_from_slice(b"\r\n");
                            self.send(STDOUT, echo).await;
                        }
                        return Some(String::from_utf8_lossy(&line).into_owned());
                    }
                    0x7f | 0x08 if self.tty => {
                        if line.pop().is_some() {
                            echo.extend_from_slice(b"\x08 \x08");
                        }
                    }
                    0x03 if self.tty => {
                        self.pending = chunk[i + 1..].to_vec();
                        echo.extend_from_slice(b"^C\r\n");
                        self.send(STDOUT, echo).await;
                        return Some(String::new());
                    }
                    0x04 if self.tty => {
                        if line.is_empty() {
                            return None;
                        }
                    }
                    _ => {
                        line.push(b);
                        if self.tty {
                            echo.push(b);
                        }
                    }
                }
            }
            if !echo.is_empty() {
                self.send(STDOUT, echo).await;
            }
        }
    }
}

/// Runs `argv` in the container of `pod`.
pub async fn exec(argv: &[String], pod: &str, mut io: Io) -> Exit {
    let Some(name) = argv.first() else {
        return Exit::Error("exec: \"\": executable file not found in $PATH".into());
    };
    if !is_command(name) {
        return Exit::Error(format!(
            "exec: \"{name}\": executable file not found in $PATH"
        ));
    }
    let mut shell = Shell { pod, status: 0 };
    match shell.run(argv, &mut io).await {
        Flow::Next(code) | Flow::Exit(code) => Exit::Code(code),
    }
}

/// Attaches to the container's main process: a shell reading stdin, or,
/// without stdin, one line of output and nothing more until the client
/// leaves.
pub async fn attach(pod: &str, mut io: Io) -> Exit {
    if io.stdin.is_none() {
        io.print(&format!(
            "attached to {pod}: its main process writes nothing more\n"
        ))
        .await;
        std::future::pending::<()>().await;
    }
    let mut shell = Shell { pod, status: 0 };
    Exit::Code(shell.interactive(&mut io).await)
}

fn base(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

fn is_command(name: &str) -> bool {
    matches!(
        base(name),
        "echo"
            | "cat"
            | "true"
            | "false"
            | "exit"
            | "hostname"
            | "pwd"
            | "whoami"
            | "uname"
            | "date"
            | "env"
            | "printenv"
            | "ls"
            | "sleep"
            | "sh"
            | "bash"
    )
}

/// Whether the shell goes on after a command.
enum Flow {
    Next(i32),
    Exit(i32),
}

struct Shell<'a> {
    pod: &'a str,
    /// `$?`.
    status: i32,
}

impl Shell<'_> {
    /// An interactive shell: a prompt on a terminal, one line at a time,
    /// until `exit` or the end of stdin.
    async fn interactive(&mut self, io: &mut Io) -> i32 {
        loop {
            if io.tty {
                io.print("# ").await;
            }
            let Some(line) = io.read_line().await else {
                return self.status;
            };
            if let Flow::Exit(code) = self.script(&line, io).await {
                return code;
            }
        }
    }

    /// Runs `script`: commands separated by `;`.
    async fn script(&mut self, script: &str, io: &mut Io) -> Flow {
        for command in script.split(';') {
            let argv = words(command);
            if argv.is_empty() {
                continue;
            }
            match Box::pin(self.run(&argv, io)).await {
                Flow::Next(code) => self.status = code,
                Flow::Exit(code) => return Flow::Exit(code),
            }
        }
        Flow::Next(self.status)
    }

    async fn run(&mut self, argv: &[String], io: &mut Io) -> Flow {
        let args = &argv[1..];
        let code = match base(&argv[0]) {
            "echo" => {
                let (newline, args) = match args.first().map(String::as_str) {
                    Some("-n") => (false, &args[1..]),
                    _ => (true, args),
                };
                let mut text = args.join(" ");
                if newline {
                    text.push('\n');
                }
                io.print(&text).await;
                0
            }
            "cat" if args.is_empty() => {
                while let Some(chunk) = io.read().await {
                    if io.tty && chunk.contains(&0x04) {
                        break;
                    }
                    io.print(&String::from_utf8_lossy(&chunk)).await;
                }
                0
            }
            "cat" => {
                let mut code = 0;
                for file in args {
                    if file == "/etc/hostname" {
                        io.print(&format!("{}\n", self.pod)).await;
                    } else {
                        io.eprint(&format!("cat: {file}: No such file or directory\n"))
                            .await;
                        code = 1;
                    }
                }
                code
            }
            "true" => 0,
            "false" => 1,
            "exit" => {
                let code = args
                    .first()
                    .map_or(Some(self.status), |a| a.parse::<i32>().ok());
                return match code {
                    Some(code) => Flow::Exit(code & 0xff),
                    None => {
                        io.eprint("sh: exit: Illegal number\n").await;
                        Flow::Exit(2)
                    }
                };
            }
            "hostname" => {
                io.print(&format!("{}\n", self.pod)).await;
                0
            }
            "pwd" => {
                io.print("/\n").await;
                0
            }
            "whoami" => {
                io.print("root\n").await;
                0
            }
            "uname" => {
                let text = if args.iter().any(|a| a == "-a") {
                    format!("Linux {} 6.12.38-demo #1 SMP x86_64 GNU/Linux\n", self.pod)
                } else {
                    "Linux\n".into()
                };
                io.print(&text).await;
                0
            }
            "date" => {
                io.print(&format!(
                    "{}\n",
                    jiff::Timestamp::now().strftime("%a %b %e %H:%M:%S UTC %Y")
                ))
                .await;
                0
            }
            "env" | "printenv" => {
                io.print(&format!(
                    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\nHOSTNAME={}\nHOME=/root\n",
                    self.pod
                ))
                .await;
                0
            }
            "ls" => {
                io.print("bin\ndev\netc\nhome\nproc\nroot\nsys\ntmp\nusr\nvar\n")
                    .await;
                0
            }
            "sleep" => match args.first().and_then(|a| a.parse::<u64>().ok()) {
                Some(seconds) => {
                    tokio::time::sleep(Duration::from_secs(seconds.min(MAX_SLEEP))).await;
                    0
                }
                None => {
                    io.eprint("sleep: invalid number\n").await;
                    1
                }
            },
            "sh" | "bash" => match args {
                [flag, script, ..] if flag == "-c" => {
                    let mut inner = Shell {
                        pod: self.pod,
                        status: 0,
                    };
                    match Box::pin(inner.script(script, io)).await {
                        Flow::Next(code) | Flow::Exit(code) => code,
                    }
                }
                [flag] if flag == "-c" => {
                    io.eprint("sh: -c requires an argument\n").await;
                    2
                }
                _ => {
                    let mut inner = Shell {
                        pod: self.pod,
                        status: 0,
                    };
                    Box::pin(inner.interactive(io)).await
                }
            },
            other => {
                io.eprint(&format!("sh: {other}: not found\n")).await;
                127
            }
        };
        Flow::Next(code)
    }
}

/// Splits a command into words: blanks separate, '…' and "…" quote.
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in command.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(argv: &[&str], stdin: &[&str], tty: bool) -> (Exit, String, String) {
        let (in_tx, in_rx) = mpsc::channel(16);
        let (out_tx, mut out_rx) = mpsc::channel(1024);
        for chunk in stdin {
            in_tx.send(Bytes::from(chunk.to_string())).await.unwrap();
        }
        drop(in_tx);
        let io = Io::new(Some(in_rx), out_tx, true, true, tty);
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let exit = exec(&argv, "pod-1", io).await;
        let (mut out, mut err) = (String::new(), String::new());
        while let Some((channel, bytes)) = out_rx.recv().await {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            if channel == STDOUT {
                out.push_str(&text);
            } else {
                err.push_str(&text);
            }
        }
        (exit, out, err)
    }

    #[tokio::test]
    async fn commands() {
        assert_eq!(
            run(&["echo", "hello", "world"], &[], false).await,
            (Exit::Code(0), "hello world\n".into(), String::new())
        );
        assert_eq!(
            run(&["cat"], &["a\n", "b"], false).await,
            (Exit::Code(0), "a\nb".into(), String::new())
        );
        assert_eq!(
            run(&["sh", "-c", "echo 'a b'; exit 3; echo no"], &[], false).await,
            (Exit::Code(3), "a b\n".into(), String::new())
        );
        assert_eq!(
            run(&["sh", "-c", "nope"], &[], false).await,
            (
                Exit::Code(127),
                String::new(),
                "sh: nope: not found\n".into()
            )
        );
        assert!(matches!(
            run(&["nope"], &[], false).await.0,
            Exit::Error(m) if m.contains("executable file not found")
        ));
        assert_eq!(
            run(&["sh"], &["hostname\nfalse\n"], false).await,
            (Exit::Code(1), "pod-1\n".into(), String::new())
        );
    }

    #[tokio::test]
    async fn an_interactive_terminal_echoes_and_edits() {
        let (exit, out, _) = run(&["sh"], &["ecx\x7fho hi\r", "exit 4\r"], true).await;
        assert_eq!(exit, Exit::Code(4));
        assert_eq!(out, "# ecx\x08 \x08ho hi\r\nhi\r\n# exit 4\r\n");
    }
}
