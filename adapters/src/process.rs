//! The one place that spawns a child: its own process group, stdout and stderr streamed line
//! by line without deadlock, a bounded tail for error messages, secrets redacted, and SIGINT
//! forwarded once on cancellation so the tool can stop cleanly (terraform releases its lock).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::{AdapterError, Stream};

/// How many lines of each stream are kept for error messages.
const TAIL_LINES: usize = 20;
/// After a timeout the group gets SIGINT (the tool's own clean stop: terraform releases its
/// lock), then SIGTERM after this grace period, then SIGKILL after it again.
pub const TIMEOUT_GRACE: Duration = Duration::from_secs(5);
/// After the child exits, how long to wait for grandchildren still holding its pipes.
const DRAIN_GRACE: Duration = Duration::from_secs(3);

/// The process groups of this run's live children, noted in `running/<rdeploy pid>` so a run
/// that takes over after a crash can tell whether a tool of the dead run still lives (a tool
/// outlives a killed rdeploy: it finishes its work unobserved, and the next run waits for it).
struct RunningNotes {
    file: PathBuf,
    groups: std::collections::BTreeMap<i32, String>,
}

static RUNNING: Mutex<Option<RunningNotes>> = Mutex::new(None);

impl RunningNotes {
    fn save(&self) {
        // One file rewritten in place: creating and deleting a file per child costs more than
        // the child on ext4.
        let text: String = self.groups.iter().map(|(pgid, cmd)| format!("{pgid}\t{cmd}\n")).collect();
        let _ = std::fs::write(&self.file, text);
    }
}

fn note_group(pgid: Pid, command: impl FnOnce() -> String) {
    if let Some(notes) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        notes.groups.insert(pgid.as_raw(), command());
        notes.save();
    }
}

fn forget_group(pgid: Pid) {
    if let Some(notes) = RUNNING.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        if notes.groups.remove(&pgid.as_raw()).is_some() {
            notes.save();
        }
    }
}

/// Notes every child's process group under `dir` while it runs. Called once by the driver.
pub fn note_running_children_in(dir: PathBuf) {
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(std::process::id().to_string());
    *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(RunningNotes { file, groups: Default::default() });
}

/// Process groups noted by earlier runs that are still alive: `(pgid, command)`. Notes whose
/// groups are all gone are removed.
pub fn surviving_children(dir: &Path) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut alive = Vec::new();
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let live: Vec<(i32, String)> = text
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter_map(|(pgid, cmd)| Some((pgid.parse::<i32>().ok()?, cmd.to_string())))
            .filter(|(pgid, _)| killpg(Pid::from_raw(*pgid), None).is_ok())
            .collect();
        if live.is_empty() {
            let _ = std::fs::remove_file(entry.path());
        }
        alive.extend(live);
    }
    alive
}

/// A command to run, built like `std::process::Command` but with what rdeploy needs.
#[derive(Clone, Debug)]
pub struct Command {
    program: PathBuf,
    args: Vec<OsString>,
    cwd: Option<PathBuf>,
    env: Vec<(OsString, OsString)>,
    redact: Vec<String>,
    /// Set when a `run:` line is started without the shell (see [`Command::shell`]): if the
    /// program cannot be started, the shell runs the line instead, so it fails (or, for a
    /// script without `#!`, succeeds) exactly as `sh -c` would.
    script: Option<String>,
}

/// The shell's own commands and keywords (dash and POSIX): a line starting with one of these
/// always goes to the shell, even when `/usr/bin` has a program of the same name.
const SHELL_WORDS: &[&str] = &[
    ".", ":", "[", "alias", "bg", "break", "case", "cd", "chdir", "command", "continue", "do", "done", "echo", "elif",
    "else", "esac", "eval", "exec", "exit", "export", "false", "fc", "fg", "fi", "for", "function", "getopts", "hash",
    "if", "in", "jobs", "kill", "local", "printf", "pwd", "read", "readonly", "return", "select", "set", "shift",
    "test", "then", "times", "trap", "true", "type", "ulimit", "umask", "unalias", "unset", "until", "wait", "while",
];

/// The words of `script` when it is one simple command the shell would only split on spaces
/// and run: nothing but letters, digits, spaces and `_ . / : , + @ % = -` (no quoting,
/// expansion, globbing, redirection, operators or comments), not starting with an assignment
/// or a shell word. `sh -c` would exec exactly these words, so rdeploy can skip the shell.
fn simple_command(script: &str) -> Option<Vec<&str>> {
    let plain = |c: char| c == ' ' || c.is_ascii_alphanumeric() || "_./:,+@%=-".contains(c);
    if !script.chars().all(plain) {
        return None;
    }
    let words: Vec<&str> = script.split(' ').filter(|w| !w.is_empty()).collect();
    let first = *words.first()?;
    (!first.contains('=') && !SHELL_WORDS.contains(&first)).then_some(words)
}

impl Command {
    pub fn new(program: impl Into<PathBuf>) -> Command {
        Command {
            program: program.into(),
            args: Vec::new(),
            cwd: None,
            env: Vec::new(),
            redact: Vec::new(),
            script: None,
        }
    }

    /// `sh -c script`, the way stack files mean their `run:` lines. A line that is one simple
    /// command (`./migrate.sh up 42`) is started directly, as make does: the same program with
    /// the same arguments, one exec of the shell fewer per sub-change.
    pub fn shell(script: &str) -> Command {
        match simple_command(script) {
            Some(words) => {
                let mut cmd = Command::new(words[0]).args(&words[1..]);
                cmd.script = Some(script.to_string());
                cmd
            }
            None => Command::sh(script),
        }
    }

    fn sh(script: &str) -> Command {
        Command::new("/bin/sh").arg("-c").arg(script)
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Command {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn cwd(mut self, dir: impl AsRef<Path>) -> Command {
        self.cwd = Some(dir.as_ref().to_path_buf());
        self
    }

    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Command {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn envs<I, K, V>(mut self, vars: I) -> Command
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        self.env.extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Values replaced by `***` in every line handed out and kept.
    pub fn redact<I, S>(mut self, secrets: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.redact.extend(secrets.into_iter().map(Into::into).filter(|s| !s.is_empty()));
        self
    }

    /// The command line as an operator would type it (redacted).
    pub fn display(&self) -> String {
        let mut words = vec![self.program.to_string_lossy().into_owned()];
        words.extend(self.args.iter().map(|a| a.to_string_lossy().into_owned()));
        redact_line(&crate::display_command(&words), &self.redact)
    }

    /// Starts the child in its own process group, with piped output.
    fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        // A relative path names a file in the child's directory, as it does for `sh -c`: the
        // child changes directory before it execs (the fork path pre_exec implies; a test holds
        // this), and the interpreter of a `#!` script sees the path as written in `$0`.
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        if self.script.is_some() {
            if let Some(pwd) = self.shell_pwd() {
                cmd.env("PWD", pwd);
            }
        }
        // If rdeploy itself dies (kill -9), its direct child (terraform, ansible-playbook, helm,
        // kubectl, a shell step's `sh` or program) gets SIGTERM rather than working on unobserved;
        // terraform treats it like Ctrl-C and writes its state. Whatever still survives (a
        // grandchild) is noted below and blocks the next run until it is gone. The price is a
        // fork instead of a vfork per child (pre_exec), measured in benches/core.sh.
        let parent = nix::unistd::getpid();
        // SAFETY: prctl and getppid are async-signal-safe and touch no memory of the parent.
        unsafe {
            cmd.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
                // The parent may have died between fork and prctl; then no signal would come.
                if nix::unistd::getppid() != parent {
                    return Err(std::io::Error::other("rdeploy exited before the tool started"));
                }
                Ok(())
            });
        }
        cmd.spawn()
    }

    /// A variable as the child will see it: the command's own setting, else rdeploy's.
    fn child_env(&self, key: &str) -> Option<OsString> {
        match self.env.iter().rev().find(|(k, _)| k == key) {
            Some((_, v)) => Some(v.clone()),
            None => std::env::var_os(key),
        }
    }

    /// The PWD `sh` would export in the child's directory: the inherited one when it is an
    /// absolute path to that same directory (a logical path through a symlink stays), otherwise
    /// the physical path, as getcwd gives it.
    fn shell_pwd(&self) -> Option<PathBuf> {
        use std::os::unix::fs::MetadataExt;
        let dir = match &self.cwd {
            Some(dir) => std::fs::canonicalize(dir).ok()?,
            None => std::env::current_dir().ok()?,
        };
        let inherited = self.child_env("PWD").map(PathBuf::from);
        let same = |a: &Path, b: &Path| match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
            _ => false,
        };
        let logical = inherited.filter(|p| {
            p.is_absolute()
                && !p.components().any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::CurDir))
                && same(p, &dir)
        });
        Some(logical.unwrap_or(dir))
    }

    /// Starts the child. A `run:` line whose program the kernel would not run itself (a script
    /// without `#!`, a foreign binary), or that cannot be started (missing, not executable), goes
    /// to the shell instead, which runs or rejects it as it always would.
    fn spawn_or_shell(&self) -> Result<tokio::process::Child, AdapterError> {
        let through_shell = |script: &str| {
            let sh = Command::sh(script);
            Command { program: sh.program, args: sh.args, script: None, ..self.clone() }.spawn()
        };
        let result = match &self.script {
            // glibc's execvp hands a file the kernel rejects to `sh` as a script, where dash
            // would say "Exec format error": only what the kernel runs itself skips the shell.
            Some(script) if !self.kernel_runs() => through_shell(script),
            Some(script) => self.spawn().or_else(|source| {
                tracing::debug!(command = %self.display(), error = %source, "running it through the shell");
                through_shell(script)
            }),
            None => self.spawn(),
        };
        result.map_err(|source| AdapterError::Spawn { command: self.display(), source })
    }

    /// Whether the kernel itself runs this program: a `#!` script, or an ELF file for this
    /// machine (class, byte order and architecture as rdeploy's own).
    fn kernel_runs(&self) -> bool {
        static NATIVE: std::sync::OnceLock<Option<[u8; 20]>> = std::sync::OnceLock::new();
        let head = |path: &Path| -> Option<[u8; 20]> {
            let mut read = Vec::with_capacity(20);
            std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(path).ok()?, 20), &mut read)
                .ok()?;
            let mut head = [0u8; 20];
            head[..read.len()].copy_from_slice(&read);
            Some(head)
        };
        let path = if self.program.components().count() > 1 {
            match &self.cwd {
                Some(dir) => dir.join(&self.program),
                None => self.program.clone(),
            }
        } else {
            // execvp's search, in the child's directory: an empty or relative PATH entry means
            // a directory relative to it (the `which` crate resolves those against rdeploy's own
            // directory, and expands `~`, which execvp does not).
            use std::os::unix::fs::PermissionsExt;
            let Some(path_var) = self.child_env("PATH") else { return false };
            let cwd = self.cwd.clone().unwrap_or_default();
            let found = std::env::split_paths(&path_var)
                .map(|entry| cwd.join(entry).join(&self.program))
                .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0));
            match found {
                Some(path) => path,
                None => return false,
            }
        };
        match (head(&path), NATIVE.get_or_init(|| head(Path::new("/proc/self/exe")))) {
            (Some(h), _) if h.starts_with(b"#!") => true,
            (Some(h), Some(native)) => {
                h.starts_with(b"\x7fELF") && h[4..6] == native[4..6] && h[18..20] == native[18..20]
            }
            _ => false,
        }
    }

    /// Runs to completion, handing each output line to `on_line` as it arrives.
    ///
    /// Cancellation sends SIGINT to the child's process group once and keeps waiting: the tool
    /// decides how to stop. A timeout sends SIGINT, then SIGTERM and SIGKILL, each after
    /// [`TIMEOUT_GRACE`], so every tool is stopped the same way.
    pub async fn run(
        &self,
        cancel: &CancellationToken,
        timeout: Option<Duration>,
        on_line: &mut (dyn FnMut(Stream, &str) + Send),
    ) -> Result<Outcome, AdapterError> {
        let mut child = self.spawn_or_shell()?;
        let pgid = child.id().map(|id| Pid::from_raw(id as i32));
        tracing::debug!(command = %self.display(), pid = ?child.id(), cwd = ?self.cwd, "spawned");
        if let Some(pgid) = pgid {
            note_group(pgid, || self.display());
        }
        let (tx, mut rx) = mpsc::channel::<(Stream, String)>(256);
        let readers = [
            child.stdout.take().map(|out| tokio::spawn(forward_lines(out, Stream::Stdout, tx.clone()))),
            child.stderr.take().map(|err| tokio::spawn(forward_lines(err, Stream::Stderr, tx.clone()))),
        ];
        drop(tx);

        let mut outcome = Outcome::default();
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        // The next signal of a timeout's escalation, and when to send it.
        let mut escalate: Option<(tokio::time::Instant, Signal)> = None;
        let mut streams_open = true;
        let status = loop {
            tokio::select! {
                line = rx.recv(), if streams_open => match line {
                    Some((stream, line)) => self.deliver(&mut outcome, stream, line, on_line),
                    None => streams_open = false,
                },
                status = child.wait() => break status.map_err(|source| AdapterError::Spawn { command: self.display(), source })?,
                _ = cancel.cancelled(), if !outcome.interrupted => {
                    tracing::debug!(command = %self.display(), "forwarding SIGINT to the process group");
                    outcome.interrupted = true;
                    signal_group(pgid, Signal::SIGINT);
                }
                _ = sleep_until(deadline), if deadline.is_some() && !outcome.timed_out => {
                    tracing::debug!(command = %self.display(), "timed out: SIGINT to the process group");
                    outcome.timed_out = true;
                    signal_group(pgid, Signal::SIGINT);
                    escalate = Some((tokio::time::Instant::now() + TIMEOUT_GRACE, Signal::SIGTERM));
                }
                _ = sleep_until(escalate.map(|(at, _)| at)), if escalate.is_some() => {
                    let (_, signal) = escalate.take().expect("guarded by is_some");
                    tracing::debug!(command = %self.display(), ?signal, "still running after a timeout");
                    signal_group(pgid, signal);
                    if signal == Signal::SIGTERM {
                        escalate = Some((tokio::time::Instant::now() + TIMEOUT_GRACE, Signal::SIGKILL));
                    }
                }
            }
        };
        // The child is gone; collect what it wrote, but do not wait forever on a grandchild
        // that inherited the pipes.
        let drain = async {
            while let Some((stream, line)) = rx.recv().await {
                self.deliver(&mut outcome, stream, line, on_line);
            }
        };
        if tokio::time::timeout(DRAIN_GRACE, drain).await.is_err() {
            for reader in readers.into_iter().flatten() {
                reader.abort();
            }
        }
        // Reaped: only a run that dies before this line leaves its note behind.
        if let Some(pgid) = pgid {
            forget_group(pgid);
        }
        outcome.code = status.code();
        outcome.signal = status.signal();
        tracing::debug!(command = %self.display(), code = ?outcome.code, signal = ?outcome.signal, interrupted = outcome.interrupted, "exited");
        Ok(outcome)
    }

    fn deliver(
        &self,
        outcome: &mut Outcome,
        stream: Stream,
        line: String,
        on_line: &mut (dyn FnMut(Stream, &str) + Send),
    ) {
        let line = redact_line(&line, &self.redact);
        on_line(stream, &line);
        let tail = match stream {
            Stream::Stdout => &mut outcome.stdout_tail,
            Stream::Stderr => &mut outcome.stderr_tail,
        };
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line);
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn signal_group(pgid: Option<Pid>, signal: Signal) {
    if let Some(pgid) = pgid {
        // ESRCH means the group already exited, which is what we wanted.
        let _ = killpg(pgid, signal);
    }
}

async fn forward_lines<R: AsyncRead + Unpin>(reader: R, stream: Stream, tx: mpsc::Sender<(Stream, String)>) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                while matches!(buf.last(), Some(b'\n' | b'\r')) {
                    buf.pop();
                }
                let line = String::from_utf8_lossy(&buf).into_owned();
                if tx.send((stream, line)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Which stdout lines [`capture`] copies to the step's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdoutLog {
    /// Every line, as it arrives.
    Lines,
    /// Only human output: a JSON document (`-o json`) is not worth a line each in the log.
    UnlessJson,
}

/// Runs a command to completion, keeping its stdout and stderr for parsing and copying them
/// to the step's log through `sink`.
pub async fn capture(
    cmd: &Command,
    ctx: &crate::StepContext,
    timeout: Option<Duration>,
    sink: Option<&dyn crate::EventSink>,
    log_stdout: StdoutLog,
) -> Result<(Outcome, Vec<String>, Vec<String>), AdapterError> {
    let log = |stream, line: &str| {
        if let Some(sink) = sink {
            sink.emit(crate::Event::Output { stream, line: line.to_string() });
        }
    };
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let outcome = cmd
        .run(&ctx.cancel, timeout, &mut |stream, line| match stream {
            Stream::Stdout => {
                if log_stdout == StdoutLog::Lines {
                    log(stream, line);
                }
                stdout.push(line.to_string());
            }
            Stream::Stderr => {
                log(stream, line);
                stderr.push(line.to_string());
            }
        })
        .await?;
    if log_stdout == StdoutLog::UnlessJson && !stdout.first().is_some_and(|l| l.starts_with('[') || l.starts_with('{'))
    {
        for line in &stdout {
            log(Stream::Stdout, line);
        }
    }
    Ok((outcome, stdout, stderr))
}

/// Replaces every secret in `line` by `***`.
pub fn redact_line(line: &str, secrets: &[String]) -> String {
    let mut out = line.to_string();
    for secret in secrets {
        if out.contains(secret.as_str()) {
            out = out.replace(secret.as_str(), "***");
        }
    }
    out
}

/// How a child ended.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    pub stdout_tail: VecDeque<String>,
    pub stderr_tail: VecDeque<String>,
    /// Cancellation forwarded SIGINT to it.
    pub interrupted: bool,
    pub timed_out: bool,
}

impl Outcome {
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.interrupted && !self.timed_out
    }

    /// "exited with status 3" or "was killed by signal 9".
    pub fn describe_status(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exited with status {code}"),
            (None, Some(sig)) => {
                let name = Signal::try_from(sig).map(|s| s.as_str()).unwrap_or("unknown");
                format!("was killed by signal {sig} ({name})")
            }
            (None, None) => "ended without a status".to_string(),
        }
    }

    /// The most telling line of the error output: the last non-empty stderr line, else stdout.
    pub fn last_error_line(&self) -> Option<String> {
        let pick =
            |tail: &VecDeque<String>| tail.iter().rev().find(|l| !l.trim().is_empty()).map(|l| l.trim().to_string());
        pick(&self.stderr_tail).or_else(|| pick(&self.stdout_tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run(cmd: Command) -> (Outcome, Vec<(Stream, String)>) {
        let mut lines = Vec::new();
        let outcome =
            cmd.run(&CancellationToken::new(), None, &mut |s, l| lines.push((s, l.to_string()))).await.unwrap();
        (outcome, lines)
    }

    #[test]
    fn only_a_plain_simple_command_skips_the_shell() {
        assert_eq!(simple_command("./migrate.sh up 42"), Some(vec!["./migrate.sh", "up", "42"]));
        assert_eq!(
            simple_command("  kubectl  rollout status deploy/web --timeout=60s "),
            Some(vec!["kubectl", "rollout", "status", "deploy/web", "--timeout=60s"])
        );
        for shell_needed in [
            "echo a >> out",
            "a && b",
            "a; b",
            "a | b",
            "echo $HOME",
            "ls *.yaml",
            "cat ~/.x",
            "run 'quoted arg'",
            "FOO=1 ./x",
            "cd dir",
            "true",
            "test -f x",
            "a\tb",
            "a # comment",
            "if",
            "",
        ] {
            assert_eq!(simple_command(shell_needed), None, "{shell_needed:?}");
        }
    }

    /// A line started without the shell behaves as `sh -c` would: a relative program resolves in
    /// the working directory, argv[0] is the word as written, and what cannot be started (a
    /// missing program, a script without `#!`) gets the shell's own verdict.
    #[tokio::test]
    async fn a_simple_line_runs_directly_and_falls_back_to_the_shell() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        };
        write("args.sh", "#!/bin/sh\necho \"$0|$1|$2\"\n");
        write("bare.sh", "echo no shebang $1\n");
        let (outcome, lines) = run(Command::shell("./args.sh a b").cwd(dir.path())).await;
        assert!(outcome.success());
        assert_eq!(lines, [(Stream::Stdout, "./args.sh|a|b".to_string())]);

        let (outcome, lines) = run(Command::shell("./bare.sh x").cwd(dir.path())).await;
        assert!(outcome.success(), "{lines:?}");
        assert_eq!(lines, [(Stream::Stdout, "no shebang x".to_string())]);

        // PWD is the working directory, as `sh` would export it, not rdeploy's own; an
        // inherited PWD naming the same directory through a symlink is kept, as dash keeps it.
        let (outcome, lines) = run(Command::shell("env").cwd(dir.path()).env("PWD", "/elsewhere")).await;
        assert!(outcome.success());
        let pwd = format!("PWD={}", dir.path().canonicalize().unwrap().display());
        assert!(lines.iter().any(|(_, l)| *l == pwd), "{pwd} in {lines:?}");
        let link = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path(), link.path().join("here")).unwrap();
        let logical = link.path().join("here");
        let (_, lines) = run(Command::shell("env").cwd(&logical).env("PWD", &logical)).await;
        let pwd = format!("PWD={}", logical.display());
        assert!(lines.iter().any(|(_, l)| *l == pwd), "{pwd} in {lines:?}");
        let sh = std::process::Command::new("/bin/sh")
            .args(["-c", "echo $PWD"])
            .current_dir(&logical)
            .env("PWD", &logical)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&sh.stdout).trim(), logical.display().to_string(), "sh agrees");

        // A relative PATH entry names a directory relative to the step's, as for execvp.
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        write("bin/hello", "#!/bin/sh\necho hello from bin\n");
        let (outcome, lines) = run(Command::shell("hello").cwd(dir.path()).env("PATH", "bin:/usr/bin:/bin")).await;
        assert!(outcome.success(), "{lines:?}");
        assert_eq!(lines, [(Stream::Stdout, "hello from bin".to_string())]);

        // A binary for another machine: the shell's verdict (126), not glibc's "run it as a script".
        let mut foreign = b"\x7fELF\x02\x01\x01".to_vec();
        foreign.resize(64, 0);
        foreign[18] = 0xb7; // EM_AARCH64 (or, on an arm64 host, read as foreign anyway below)
        if std::fs::read("/proc/self/exe").unwrap()[18] == 0xb7 {
            foreign[18] = 0x3e; // EM_X86_64
        }
        std::fs::write(dir.path().join("foreign"), &foreign).unwrap();
        std::fs::set_permissions(dir.path().join("foreign"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let (outcome, lines) = run(Command::shell("./foreign").cwd(dir.path())).await;
        assert_eq!(outcome.code, Some(126), "{lines:?}");
        assert!(lines.iter().any(|(_, l)| l.contains("Exec format error")), "{lines:?}");

        let (outcome, lines) = run(Command::shell("./missing.sh").cwd(dir.path())).await;
        assert_eq!(outcome.code, Some(127));
        assert!(lines.iter().any(|(s, l)| *s == Stream::Stderr && l.contains("not found")), "{lines:?}");
    }

    #[tokio::test]
    async fn streams_both_outputs_and_keeps_the_status() {
        let (outcome, lines) = run(Command::shell("echo out; echo err >&2; exit 3")).await;
        assert_eq!(outcome.code, Some(3));
        assert!(!outcome.success());
        assert!(lines.contains(&(Stream::Stdout, "out".into())));
        assert!(lines.contains(&(Stream::Stderr, "err".into())));
        assert_eq!(outcome.last_error_line().as_deref(), Some("err"));
        assert_eq!(outcome.describe_status(), "exited with status 3");
    }

    #[tokio::test]
    async fn large_output_on_both_streams_does_not_deadlock() {
        let script = "i=0; while [ $i -lt 20000 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done";
        let (outcome, lines) = run(Command::shell(script)).await;
        assert!(outcome.success());
        assert_eq!(lines.len(), 40000);
        assert_eq!(outcome.stderr_tail.len(), TAIL_LINES);
        assert_eq!(outcome.stderr_tail.back().map(String::as_str), Some("err19999"));
    }

    #[tokio::test]
    async fn secrets_are_redacted_everywhere() {
        let cmd = Command::shell("echo token=hunter2 >&2; exit 1").redact(["hunter2"]);
        let shown = Command::shell("deploy --token hunter2").redact(["hunter2"]).display();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("***"), "{shown}");
        let (outcome, lines) = run(cmd).await;
        assert_eq!(lines, vec![(Stream::Stderr, "token=***".to_string())]);
        assert_eq!(outcome.last_error_line().as_deref(), Some("token=***"));
    }

    #[tokio::test]
    async fn cancellation_forwards_sigint_once_and_waits() {
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            trigger.cancel();
        });
        // The child traps SIGINT, cleans up and exits on its own, as terraform does.
        let cmd = Command::shell("trap 'echo cleaning; exit 7' INT; echo ready; while :; do sleep 0.05; done");
        let mut lines = Vec::new();
        let outcome = cmd.run(&cancel, None, &mut |_, l| lines.push(l.to_string())).await.unwrap();
        assert!(outcome.interrupted);
        assert_eq!(outcome.code, Some(7));
        assert!(lines.contains(&"cleaning".to_string()));
    }

    #[tokio::test]
    async fn timeout_interrupts_the_group_first() {
        let cmd = Command::shell("sleep 30");
        let started = std::time::Instant::now();
        let outcome =
            cmd.run(&CancellationToken::new(), Some(Duration::from_millis(200)), &mut |_, _| {}).await.unwrap();
        assert!(outcome.timed_out);
        assert_eq!(outcome.signal, Some(Signal::SIGINT as i32));
        assert!(started.elapsed() < TIMEOUT_GRACE);
    }

    #[tokio::test]
    async fn timeout_escalates_to_sigterm_then_sigkill() {
        // Ignores SIGINT: SIGTERM after one grace period ends it.
        let outcome = Command::shell("trap '' INT; echo ready; while :; do sleep 0.05; done")
            .run(&CancellationToken::new(), Some(Duration::from_millis(200)), &mut |_, _| {})
            .await
            .unwrap();
        assert!(outcome.timed_out);
        assert_eq!(outcome.signal, Some(Signal::SIGTERM as i32));
        // Ignores both: SIGKILL after the second.
        let outcome = Command::shell("trap '' INT TERM; echo ready; while :; do sleep 0.05; done")
            .run(&CancellationToken::new(), Some(Duration::from_millis(200)), &mut |_, _| {})
            .await
            .unwrap();
        assert!(outcome.timed_out);
        assert_eq!(outcome.signal, Some(Signal::SIGKILL as i32));
    }

    #[tokio::test]
    async fn a_missing_program_is_a_spawn_error() {
        let err =
            Command::new("/nonexistent/tool").run(&CancellationToken::new(), None, &mut |_, _| {}).await.unwrap_err();
        assert!(matches!(err, AdapterError::Spawn { .. }));
    }
}
