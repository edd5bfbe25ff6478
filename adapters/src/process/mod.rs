//! The one place that spawns a child: its own process group, stdout and stderr written to files
//! and followed line by line (so a tool outlives a killed rdeploy without dying of a broken
//! pipe), a bounded tail for error messages, secrets redacted, SIGINT forwarded once on
//! cancellation so the tool can stop cleanly (terraform releases its lock), and every live child
//! noted so a run that takes over after a crash can wait for a tool the dead run left behind.
//!
//! cargo's `ProcessBuilder` is the model: a [`Command`] with documented fields, shown as the
//! shell would print it, and one error ([`AdapterError::Spawn`]). The `sh -c` fast path for
//! `run:` lines lives apart, in [`shell_line`].

mod shell_line;
mod spawner;

pub use spawner::{lives_as_long_as_rdeploy, runtime, start_from_this_thread as start_spawner};

use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::fmt;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::killpg;
pub use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio_util::sync::CancellationToken;

use crate::redact::redact_line;
use crate::{AdapterError, Stream};

/// How many lines of each stream are kept for error messages.
const TAIL_LINES: usize = 20;
/// After a timeout the group gets SIGINT (the tool's own clean stop: terraform releases its
/// lock), then SIGTERM after this grace period, then SIGKILL after it again.
pub const TIMEOUT_GRACE: Duration = Duration::from_secs(5);
/// How often the output files are read while the child runs and writes nothing: a line reaches
/// the adapter's parser at most this late. A read finds every byte written so far.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(10);
/// Most bytes read from one output file per poll, so one chatty stream cannot starve the other.
const READ_PER_POLL: usize = 1 << 20;

/// A command to run, built like `std::process::Command` but with what rdeploy needs.
#[derive(Clone, Debug)]
pub struct Command {
    /// The program: a path (relative ones name a file in `cwd`, as for `sh -c`) or a name
    /// searched in `PATH`.
    program: PathBuf,
    /// Its arguments after the program.
    args: Vec<OsString>,
    /// Runs of `args` shown otherwise wherever the command is displayed, in order: where the
    /// run starts, how many arguments it spans, and the words shown instead
    /// ([`Command::args_shown_as`]).
    shown: Vec<(usize, usize, Vec<OsString>)>,
    /// Its working directory; rdeploy's own when unset.
    cwd: Option<PathBuf>,
    /// Variables set on top of rdeploy's own environment, later ones winning.
    env: Vec<(OsString, OsString)>,
    /// Values replaced by `***` in every line kept or displayed, and in the lines handed out
    /// unless `raw_lines`.
    redact: Vec<String>,
    /// The line handler gets each line as the tool wrote it, so a parser sees JSON whole (a
    /// short secret replaced inside a JSON line could break it); the caller redacts what it
    /// keeps. The tails kept for errors are redacted either way.
    raw_lines: bool,
    /// What the child gets when rdeploy dies before it (`PR_SET_PDEATHSIG`): the tool's graceful
    /// stop, so it ends its work and persists its state rather than stopping mid-write.
    death_signal: Signal,
    /// Where the child's stdout and stderr go. They are never pipes: a pipe whose reader died
    /// kills the writer (SIGPIPE) on its next line, which for terraform may be mid-way through
    /// rewriting its state.
    output: Output,
    /// Where the child's process group is noted while it runs.
    tracker: ProcessTracker,
    /// Set when a `run:` line is started without the shell ([`Command::shell`]): if the program
    /// cannot be started, the shell runs the line instead, so it fails (or, for a script
    /// without `#!`, succeeds) exactly as `sh -c` would.
    script: Option<String>,
    /// Set for a tool whose processes leave its group (ansible's workers each call `setsid`):
    /// an interrupt or a timeout reaches every process group of the tool's tree, and a tree
    /// still alive this long after it is stopped with SIGTERM, then SIGKILL (see [`Tree`]).
    stop_tree: Option<Duration>,
}

/// Where a child's output is written while rdeploy follows it.
#[derive(Clone, Debug, Default)]
enum Output {
    /// Memory files (else unnamed files in the temporary directory): gone once the child and
    /// rdeploy have both closed them.
    #[default]
    Unnamed,
    /// The same, the fallback unnamed file in this directory (the step's work directory).
    UnnamedIn(PathBuf),
    /// Files that stay after the child ends, so a later run can read what it did (terraform's
    /// JSON stream of an apply that outlived a killed rdeploy).
    Files { stdout: PathBuf, stderr: PathBuf },
}

/// A started child and the read ends of its output files.
struct Started {
    child: Child,
    stdout: Reader,
    stderr: Reader,
}

/// The end of an output file rdeploy reads.
struct Reader {
    file: File,
    /// A memory file, whose pages rdeploy gives back once it has read them.
    release: bool,
}

/// A child rdeploy waits for: started by one of its threads or the spawner (see [`spawner`]),
/// or forked by rdeploy itself when there is no spawner.
enum Child {
    Spawned(spawner::Spawned),
    Forked(tokio::process::Child),
}

impl Child {
    fn id(&self) -> Option<u32> {
        match self {
            Child::Spawned(child) => Some(child.id()),
            Child::Forked(child) => child.id(),
        }
    }

    /// Waits for the child's exit and reaps it; cancel safe.
    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Child::Spawned(child) => child.wait().await,
            Child::Forked(child) => child.wait().await,
        }
    }
}

impl Command {
    pub fn new(program: impl Into<PathBuf>) -> Command {
        Command {
            program: program.into(),
            args: Vec::new(),
            shown: Vec::new(),
            cwd: None,
            env: Vec::new(),
            redact: Vec::new(),
            raw_lines: false,
            death_signal: Signal::SIGTERM,
            output: Output::default(),
            tracker: ProcessTracker::default(),
            script: None,
            stop_tree: None,
        }
    }

    /// `sh -c script`, the way stack files mean their `run:` lines (a simple command skips the
    /// shell: see [`shell_line`]).
    pub fn shell(script: &str) -> Command {
        shell_line::command(script)
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

    /// Arguments run as `run` but shown as `shown` wherever the command is displayed (messages,
    /// logs, the process notes): a fleet cluster's tool runs with the kubeconfig cut for that
    /// cluster, and is shown with the user's, as the user would type it.
    pub fn args_shown_as<I, S, J, T>(mut self, run: I, shown: J) -> Command
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
        J: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let from = self.args.len();
        self.args.extend(run.into_iter().map(Into::into));
        let shown: Vec<OsString> = shown.into_iter().map(Into::into).collect();
        if self.args[from..] != shown[..] {
            self.shown.push((from, self.args.len() - from, shown));
        }
        self
    }

    /// The arguments as they are run (not as shown), for tests.
    #[cfg(test)]
    pub(crate) fn run_args(&self) -> Vec<String> {
        self.args.iter().map(|a| a.to_string_lossy().into_owned()).collect()
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
        let mut redact = std::mem::take(&mut self.redact);
        redact.extend(secrets.into_iter().map(Into::into));
        self.redact = crate::redact::normalize(redact);
        self
    }

    /// Runs as part of a step: the child is noted in the step's process tracker while it runs
    /// and its output files live in the step's work directory.
    pub fn in_step(mut self, ctx: &crate::StepContext) -> Command {
        self.tracker = ctx.processes.clone();
        // The step's secret `env` values and the run's secrets never reach anything rdeploy
        // prints or records.
        let mut redact = std::mem::take(&mut self.redact);
        redact.extend(crate::redact::env_secrets(&ctx.env));
        redact.extend(ctx.secrets.values());
        self.redact = crate::redact::normalize(redact);
        if !matches!(self.output, Output::Files { .. }) {
            self.output = Output::UnnamedIn(ctx.work_dir.clone());
        }
        self
    }

    /// Hands the line handler each line unredacted, for parsing (see `raw_lines`); redact what
    /// you keep with [`Command::redact_text`].
    pub fn raw_lines(mut self) -> Command {
        self.raw_lines = true;
        self
    }

    /// `text` with this command's secrets replaced by `***`.
    pub fn redact_text(&self, text: &str) -> String {
        redact_line(text, &self.redact)
    }

    /// The signal the child gets if rdeploy dies first (SIGTERM unless set): the one the tool
    /// stops gracefully on, finishing what it started and saving its state.
    pub fn on_rdeploy_death(mut self, signal: Signal) -> Command {
        self.death_signal = signal;
        self
    }

    /// For a tool whose own processes leave its process group (ansible's workers each start a
    /// session of their own, and the task's processes live in the worker's), so a signal to
    /// the group misses them. An interrupt or a timeout then sends SIGINT to every group of the
    /// tool's process tree, once each, including groups made after it (a worker forked while
    /// the tool handled the signal, which the tool itself never tells); and should any process of
    /// the tree still live `grace` later, the whole tree gets SIGTERM, then SIGKILL after
    /// [`TIMEOUT_GRACE`]. Only for a tool whose SIGINT means "stop now": terraform's second
    /// signal means "abandon the state", so terraform is never given this.
    pub fn stop_whole_tree(mut self, grace: Duration) -> Command {
        self.stop_tree = Some(grace);
        self
    }

    /// Writes the child's stdout and stderr to these files (created 0600, truncated) and keeps
    /// them, so a later run can read what a child that outlived rdeploy did.
    ///
    /// Their size is not bounded, on purpose: a file never pushes back as a full pipe did, but
    /// rotating or truncating it under the child would lose exactly what it is kept for (the
    /// lines an orphan wrote after rdeploy died, which no log has), and the step's log holds
    /// the same lines anyway, so a bound here would not bound the disk use. Each command
    /// truncates its files when it starts, so they hold one command's output at most.
    pub fn output_files(mut self, stdout: impl Into<PathBuf>, stderr: impl Into<PathBuf>) -> Command {
        self.output = Output::Files { stdout: stdout.into(), stderr: stderr.into() };
        self
    }

    /// The command line as an operator would type it (redacted); the same as its `Display`.
    pub fn display(&self) -> String {
        self.to_string()
    }

    /// [`Command::display`] cut to a few hundred bytes, for messages: a command the kernel
    /// refused for its length (`Argument list too long`) would fill a screen with it.
    pub fn display_short(&self) -> String {
        const MAX: usize = 300;
        let full = self.display();
        if full.len() <= MAX {
            return full;
        }
        let mut end = MAX;
        while !full.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}... ({} bytes in all)", &full[..end], full.len())
    }

    /// Starts the child (through the shell when its `run:` line needs it).
    fn start(&self) -> Result<Started, AdapterError> {
        let started = match &self.script {
            Some(script) => shell_line::start(self, script),
            None => self.start_plain(&[]),
        };
        started.map_err(|source| AdapterError::Spawn { command: self.display_short(), source })
    }

    /// Starts exactly this program in its own process group, output to files, with `extra_env`
    /// on top of the command's own.
    fn start_plain(&self, extra_env: &[(OsString, OsString)]) -> std::io::Result<Started> {
        let (stdout_write, stdout_read) = self.output_file(Stream::Stdout)?;
        let (stderr_write, stderr_read) = self.output_file(Stream::Stderr)?;
        let stdout = stdout_write.as_ref().unwrap_or(&stdout_read.file);
        let stderr = stderr_write.as_ref().unwrap_or(&stderr_read.file);
        let signal = self.death_signal;
        let relay = signal != Signal::SIGTERM && signal != Signal::SIGKILL;
        let env: Vec<(&OsString, &OsString)> = self.env.iter().chain(extra_env).map(|(k, v)| (k, v)).collect();
        // Noted the moment the child exists: a kill -9 of rdeploy right after the tool started
        // must still leave its note for the next run to wait on.
        let note = self.tracker.notes.is_some().then(|| (self.tracker.clone(), self.display()));
        // Started from this thread when it lives as long as rdeploy, else by the spawner (see
        // [`spawner`]: the same child either way, without copying rdeploy).
        let request = spawner::Request {
            program: self.program.as_os_str(),
            args: &self.args,
            env: &env,
            cwd: self.cwd.as_deref(),
            death_signal: signal,
            relay,
            stdout,
            stderr,
        };
        if let Some(spawned) = spawner::spawn_here(&request).or_else(|| spawner::spawn(&request)) {
            let child = spawned?;
            if let Some((tracker, command)) = note {
                tracker.note(child.id(), child.start(), || command);
            }
            return Ok(Started { child: Child::Spawned(child), stdout: stdout_read, stderr: stderr_read });
        }
        // No spawner: rdeploy forks the child itself, the same way.
        // A relative path names a file in the child's directory, as it does for `sh -c`: the
        // child changes directory before it execs (the fork path pre_exec implies; a test holds
        // this), and the interpreter of a `#!` script sees the path as written in `$0`.
        let (stdout, stderr) = (stdout.try_clone()?, stderr.try_clone()?);
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .process_group(0);
        if let Some(dir) = &self.cwd {
            cmd.current_dir(dir);
        }
        // If rdeploy itself dies (kill -9), the tool gets its graceful signal rather than
        // working on unobserved: a shell step's `sh` or program its SIGTERM straight from the
        // kernel (pdeathsig), a tool with a graceful signal of its own (terraform's SIGINT, as
        // Ctrl-C) exactly once, for its whole group, through a relay (see
        // [`relay_one_death_signal`]); terraform then stops, writes its state (to a file nobody
        // needs to read) and ends. Whatever still survives is noted below and the next run waits
        // for it. Every child is forked from one thread that lives as long as rdeploy
        // ([`spawn_on_the_spawning_thread`]), so the kernel's death signal means rdeploy's
        // death, not a retired thread's.
        spawner::die_with_rdeploy(&mut cmd, nix::unistd::getpid(), signal, relay);
        let child = spawn_on_the_spawning_thread(cmd, note)?;
        Ok(Started { child: Child::Forked(child), stdout: stdout_read, stderr: stderr_read })
    }

    /// One output file: the end the child writes and the end rdeploy reads (with `pread` at its
    /// own position, so reading never moves the child's write offset). A memory or unnamed file
    /// is one descriptor, opened for both (`None` for the writing end): the spawner gets a copy
    /// of it in its request, as the child does, and rdeploy reads from its own (no duplicate is
    /// made and closed for each child).
    fn output_file(&self, stream: Stream) -> std::io::Result<(Option<File>, Reader)> {
        // A memory file (`memfd_create`): a tool's output (which may hold a secret the tool
        // printed) is not written to a filesystem (memory may still be swapped), and making one
        // costs a fraction of an `O_TMPFILE` on ext4, which scans its inode table for each. What rdeploy has read is given back as
        // it goes (see [`Follower::release_read`]), so memory holds only the unread tail.
        let memory = || -> std::io::Result<(Option<File>, Reader)> {
            let fd = nix::sys::memfd::memfd_create(c"rdeploy-output", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)?;
            // Appending: a memory file's position is not locked across writers as a file
            // opened by name is, so a tool and a process it left running (or two threads)
            // writing at once would overwrite each other's lines at a shared offset.
            nix::fcntl::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(&fd),
                nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_APPEND),
            )?;
            Ok((None, Reader { file: File::from(fd), release: true }))
        };
        // Where memory files are not to be had (an old kernel, a seccomp filter): an unnamed
        // file on disk, gone once the child and rdeploy have both closed it.
        let unnamed = |dir: &Path| -> std::io::Result<(Option<File>, Reader)> {
            Ok((None, Reader { file: tempfile::tempfile_in(dir)?, release: false }))
        };
        match &self.output {
            Output::Unnamed => memory().or_else(|_| unnamed(&std::env::temp_dir())),
            // The step's directory is made before the step runs; a preflight runs earlier.
            Output::UnnamedIn(dir) => memory().or_else(|_| unnamed(dir)).or_else(|_| unnamed(&std::env::temp_dir())),
            Output::Files { stdout, stderr } => {
                let path = match stream {
                    Stream::Stdout => stdout,
                    Stream::Stderr => stderr,
                };
                let write =
                    crate::private::open(path, std::fs::OpenOptions::new().write(true).create(true).truncate(true))?;
                let read = crate::private::open(path, std::fs::OpenOptions::new().read(true))?;
                Ok((Some(write), Reader { file: read, release: false }))
            }
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
        let started = self.start()?;
        self.follow_to_the_end(started, cancel, timeout, on_line).await
    }

    /// [`Command::run`] once the child is started.
    async fn follow_to_the_end(
        &self,
        started: Started,
        cancel: &CancellationToken,
        timeout: Option<Duration>,
        on_line: &mut (dyn FnMut(Stream, &str) + Send),
    ) -> Result<Outcome, AdapterError> {
        let Started { mut child, stdout, stderr } = started;
        let pid = child.id();
        let pgid = pid.map(|id| Pid::from_raw(id as i32));
        tracing::debug!(command = %self, pid = ?pid, cwd = ?self.cwd, "spawned");
        // Until the child is reaped below: should this future be dropped first (a panic
        // unwinding, a caller that stopped waiting), the tool is stopped as if rdeploy had died.
        let mut unreaped = Unreaped { pgid, signal: self.death_signal };
        let mut followers = [Follower::new(stdout, Stream::Stdout), Follower::new(stderr, Stream::Stderr)];
        let mut outcome = Outcome::default();
        let mut follow = |outcome: &mut Outcome, followers: &mut [Follower; 2]| {
            for follower in followers.iter_mut() {
                follower.read(&mut |stream, line| self.deliver(outcome, stream, line, on_line));
            }
        };

        // The first read one interval in: the child has just started and written nothing yet,
        // and an interval's immediate first tick costs a wake-up of its own (the timer rounds it
        // up to the next millisecond) for every child, most of which end before the second.
        let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + FOLLOW_INTERVAL, FOLLOW_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // None when the clock cannot hold it: a deadline that far away never comes (no panic).
        let deadline = timeout.and_then(|t| tokio::time::Instant::now().checked_add(t));
        // The next signal of a timeout's escalation, and when to send it.
        let mut escalate: Option<(tokio::time::Instant, Signal)> = None;
        // The tool's whole process tree, for a tool whose processes leave its group.
        let mut tree = self.stop_tree.and(pid).map(|pid| Tree::new(pid as i32));
        let mut next_sweep = tokio::time::Instant::now();
        let status = loop {
            tokio::select! {
                status = child.wait() => break status.map_err(|source| AdapterError::Spawn { command: self.display(), source })?,
                _ = poll.tick() => {
                    follow(&mut outcome, &mut followers);
                    if let Some(tree) = tree.as_mut().filter(|t| t.stopping) {
                        let now = tokio::time::Instant::now();
                        if now >= next_sweep {
                            next_sweep = now + TREE_SWEEP_INTERVAL;
                            tree.sweep();
                        }
                    }
                }
                _ = cancel.cancelled(), if !outcome.interrupted => {
                    tracing::debug!(command = %self, "forwarding SIGINT to the process group");
                    outcome.interrupted = true;
                    // The tree is read before the signal scatters it (a worker that dies at once
                    // leaves its task's processes to PID 1, out of the tree).
                    if let Some(tree) = tree.as_mut() {
                        tree.sweep();
                    }
                    signal_group(pgid, Signal::SIGINT);
                    if let (Some(tree), Some(grace)) = (tree.as_mut(), self.stop_tree) {
                        tree.interrupt();
                        if escalate.is_none() {
                            escalate = Some((tokio::time::Instant::now() + grace, Signal::SIGTERM));
                        }
                    }
                }
                _ = sleep_until(deadline), if deadline.is_some() && !outcome.timed_out => {
                    tracing::debug!(command = %self, "timed out: SIGINT to the process group");
                    outcome.timed_out = true;
                    if let Some(tree) = tree.as_mut() {
                        tree.sweep();
                    }
                    signal_group(pgid, Signal::SIGINT);
                    if let Some(tree) = tree.as_mut() {
                        tree.interrupt();
                    }
                    let grace = self.stop_tree.map_or(TIMEOUT_GRACE, |grace| grace.min(TIMEOUT_GRACE));
                    let at = tokio::time::Instant::now() + grace;
                    escalate = Some(match escalate {
                        Some((sooner, signal)) if sooner <= at => (sooner, signal),
                        _ => (at, Signal::SIGTERM),
                    });
                }
                _ = sleep_until(escalate.map(|(at, _)| at)), if escalate.is_some() => {
                    let (_, signal) = escalate.take().expect("guarded by is_some");
                    tracing::debug!(command = %self, ?signal, "still running after a timeout or an interrupt");
                    signal_group(pgid, signal);
                    if let Some(tree) = tree.as_mut() {
                        tree.signal_all(signal);
                    }
                    if signal == Signal::SIGTERM {
                        escalate = Some((tokio::time::Instant::now() + TIMEOUT_GRACE, Signal::SIGKILL));
                    }
                }
            }
        };
        // A tool stopped by rdeploy leaves nothing of its tree running (a worker in a session of
        // its own would go on with its task unobserved).
        if let Some(tree) = tree.as_mut().filter(|_| outcome.interrupted || outcome.timed_out) {
            tree.signal_all(Signal::SIGTERM);
        }
        // The child is gone: what it wrote is all in the files, the last line perhaps without
        // its newline. Read to the end of each (however much it wrote in its last moments; a
        // grandchild that keeps writing is not waited for beyond that).
        for follower in &mut followers {
            follower.read_to_end(&mut |stream, line| self.deliver(&mut outcome, stream, line, on_line));
        }
        for follower in &mut followers {
            follower.finish(&mut |stream, line| self.deliver(&mut outcome, stream, line, on_line));
            // All of it: a process the tool left running may keep the file, and write on.
            follower.release_read(0);
        }
        unreaped.pgid = None;
        // Reaped: only a run that dies (or is dropped) before this line leaves its note behind.
        if let Some(pid) = pid {
            self.tracker.forget(pid);
        }
        outcome.code = status.code();
        outcome.signal = status.signal();
        tracing::debug!(command = %self, code = ?outcome.code, signal = ?outcome.signal, interrupted = outcome.interrupted, "exited");
        Ok(outcome)
    }

    fn deliver(
        &self,
        outcome: &mut Outcome,
        stream: Stream,
        line: String,
        on_line: &mut (dyn FnMut(Stream, &str) + Send),
    ) {
        let shown = redact_line(&line, &self.redact);
        on_line(stream, if self.raw_lines { &line } else { &shown });
        let line = shown;
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

/// A child not yet reaped by [`Command::run`]. Dropped before (the run's future dropped: a panic
/// unwinding, a caller that gave up waiting), it sends the tool's graceful death signal to its
/// whole group, as a dying rdeploy would, instead of the SIGKILL of tokio's `kill_on_drop`,
/// which reached only the direct child (the relay, or `sh`) and left the tool orphaned without a
/// word. The tool's running note stays: the next run waits for it, as after a crash. The relay,
/// which blocks the terminal signals, passes nothing on and is reaped by tokio once the tool ends.
struct Unreaped {
    pgid: Option<Pid>,
    signal: Signal,
}

impl Drop for Unreaped {
    fn drop(&mut self) {
        if self.pgid.is_some() {
            tracing::debug!(pgid = ?self.pgid, signal = ?self.signal, "dropped while the child runs: stopping its group");
            signal_group(self.pgid, self.signal);
        }
    }
}

/// A job for the spawning thread: the command, the runtime its child belongs to, where to note
/// the child (and as what), and where to send the started child.
type SpawnJob = (
    tokio::process::Command,
    tokio::runtime::Handle,
    Option<(ProcessTracker, String)>,
    std::sync::mpsc::SyncSender<std::io::Result<tokio::process::Child>>,
);

/// Forks every child from one long-lived thread that never exits.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not only when
/// rdeploy dies: a child forked from a tokio thread that the runtime later retires (blocking
/// threads end after a while idle; a worker that ran `block_in_place` becomes one) got its death
/// signal while rdeploy lived on, and a long shell or kubectl command was killed for nothing.
/// From this thread, the signal comes only with rdeploy's death.
fn spawn_on_the_spawning_thread(
    mut cmd: tokio::process::Command,
    note: Option<(ProcessTracker, String)>,
) -> std::io::Result<tokio::process::Child> {
    use std::sync::mpsc;
    static SPAWNER: std::sync::OnceLock<std::io::Result<mpsc::Sender<SpawnJob>>> = std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<SpawnJob>();
        std::thread::Builder::new().name("rdeploy-spawner".into()).spawn(move || {
            // The static sender lives as long as the process: this loop never ends.
            while let Ok((mut cmd, runtime, note, reply)) = queue.recv() {
                let _entered = runtime.enter();
                let child = cmd.spawn();
                note_child(&child, note);
                let _ = reply.send(child);
            }
        })?;
        Ok(jobs)
    });
    let jobs = match spawner {
        Ok(jobs) => jobs,
        // No thread could be started (it is retried by nobody): fork from this one, as before.
        Err(e) => {
            tracing::debug!(error = %e, "no spawning thread: forking from the caller's");
            let child = cmd.spawn();
            note_child(&child, note);
            return child;
        }
    };
    let (reply, started) = mpsc::sync_channel(1);
    let runtime = tokio::runtime::Handle::current();
    jobs.send((cmd, runtime, note, reply)).map_err(|_| std::io::Error::other("the spawning thread is gone"))?;
    started.recv().map_err(|_| std::io::Error::other("the spawning thread is gone"))?
}

fn note_child(child: &std::io::Result<tokio::process::Child>, note: Option<(ProcessTracker, String)>) {
    if let (Ok(child), Some((tracker, command))) = (child, note) {
        if let Some(pid) = child.id() {
            tracker.note(pid, None, || command);
        }
    }
}

/// The command line as the shell would print it for an operator to type, secrets redacted.
impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = |a: &OsString| a.to_string_lossy().into_owned();
        let mut words = vec![self.program.to_string_lossy().into_owned()];
        let mut at = 0;
        for (from, count, shown) in &self.shown {
            words.extend(self.args.get(at..*from).unwrap_or_default().iter().map(word));
            words.extend(shown.iter().map(word));
            at = from + count;
        }
        words.extend(self.args.get(at..).unwrap_or_default().iter().map(word));
        f.write_str(&redact_line(&crate::display_command(&words), &self.redact))
    }
}

/// Reads one output file as it grows and cuts it into lines; a line split across reads is put
/// back together.
struct Follower {
    file: File,
    stream: Stream,
    /// Where the next read starts.
    at: u64,
    /// For a memory file: up to where its pages were given back.
    released: Option<u64>,
    /// Bytes read after the last newline.
    partial: Vec<u8>,
    /// How much of `partial` is known to hold no newline.
    scanned: usize,
    /// Made at the first read that fills the small buffer on the stack: most children write a
    /// few lines or nothing.
    buf: Vec<u8>,
}

/// Pages of a memory file given back once this much of it was read.
const RELEASE_EVERY: u64 = 1 << 20;

impl Follower {
    fn new(reader: Reader, stream: Stream) -> Follower {
        let released = reader.release.then_some(0);
        Follower { file: reader.file, stream, at: 0, released, partial: Vec::new(), scanned: 0, buf: Vec::new() }
    }

    /// Hands out the full lines written so far, up to [`READ_PER_POLL`] bytes of them. Returns
    /// whether it reached the end of what was written.
    fn read(&mut self, emit: &mut dyn FnMut(Stream, String)) -> bool {
        use std::os::unix::fs::FileExt as _;
        let mut small = [0u8; 4096];
        let mut total = 0;
        let reached_end = loop {
            if total >= READ_PER_POLL {
                break false;
            }
            let buf: &mut [u8] = if self.buf.is_empty() { &mut small } else { &mut self.buf };
            match self.file.read_at(buf, self.at) {
                Ok(0) => break true,
                Ok(n) => {
                    let full = n == buf.len();
                    total += n;
                    self.at += n as u64;
                    self.partial.extend_from_slice(&buf[..n]);
                    if full && self.buf.is_empty() {
                        self.buf = vec![0; 64 * 1024];
                    }
                    self.split(emit);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::debug!(error = %e, "could not read the child's output");
                    break true;
                }
            }
        };
        self.release_read(RELEASE_EVERY);
        reached_end
    }

    /// Gives a memory file's pages back up to what was read once at least `every` bytes of it
    /// are held: the file keeps its length (where the writers append), the hole reads as zeros
    /// nobody reads again.
    fn release_read(&mut self, every: u64) {
        use nix::fcntl::FallocateFlags as F;
        let Some(released) = self.released else { return };
        let upto = self.at & !4095;
        if upto <= released || upto < released + every {
            return;
        }
        let len = (upto - released) as i64;
        match nix::fcntl::fallocate(
            std::os::fd::AsRawFd::as_raw_fd(&self.file),
            F::FALLOC_FL_PUNCH_HOLE | F::FALLOC_FL_KEEP_SIZE,
            released as i64,
            len,
        ) {
            Ok(()) => self.released = Some(upto),
            // Kept whole (a kernel without holes in memory files): only memory, as on a disk.
            Err(e) => {
                tracing::debug!(error = %e, "could not release the output already read");
                self.released = None;
            }
        }
    }

    /// Hands out every full line written so far, however many: for after the child exited. It
    /// stops at the length the file had when called: a grandchild that inherited the output and
    /// keeps writing (a daemon started with `&`) must not keep the step from ending.
    fn read_to_end(&mut self, emit: &mut dyn FnMut(Stream, String)) {
        let end = self.file.metadata().map(|m| m.len()).unwrap_or(0);
        while self.at < end && !self.read(emit) {}
    }

    fn split(&mut self, emit: &mut dyn FnMut(Stream, String)) {
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(offset) = self.partial[from..].iter().position(|&b| b == b'\n') {
            let end = from + offset;
            emit(self.stream, line_text(&self.partial[start..end]));
            start = end + 1;
            from = start;
        }
        self.partial.drain(..start);
        self.scanned = self.partial.len();
    }

    /// The last line, when the child ended without a newline after it.
    fn finish(&mut self, emit: &mut dyn FnMut(Stream, String)) {
        if !self.partial.is_empty() {
            emit(self.stream, line_text(&self.partial));
            self.partial.clear();
            self.scanned = 0;
        }
    }
}

fn line_text(mut line: &[u8]) -> String {
    while let [rest @ .., b'\r' | b'\n'] = line {
        line = rest;
    }
    String::from_utf8_lossy(line).into_owned()
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How often, once a tool run with [`Command::stop_whole_tree`] is being stopped, its process
/// tree is read again from `/proc`: how soon a group made since gets its SIGINT.
const TREE_SWEEP_INTERVAL: Duration = Duration::from_millis(200);

/// The processes of a tool being stopped, however they left its process group (`setsid`,
/// `setpgid`): the descendants of its first process, read from `/proc` when it is interrupted
/// and again while it stops, and kept once seen (a worker whose parent died in the meantime is
/// still the tool's), each by its pid and start time, so a reused pid is never signalled. A
/// process that had already left the tree before the interrupt (a daemon a task started on
/// purpose, adopted by PID 1) is not the tool's to stop, as a Ctrl-C would not reach it either.
struct Tree {
    root: i32,
    /// Every process seen in the tree: pid -> (start time, process group).
    known: std::collections::BTreeMap<i32, (u64, i32)>,
    /// The groups that got SIGINT (each gets it once: a second SIGINT may mean "abandon").
    interrupted: std::collections::BTreeSet<i32>,
    /// Set once the tool is being stopped: every group seen later gets its SIGINT at once.
    stopping: bool,
}

impl Tree {
    fn new(root: i32) -> Tree {
        Tree { root, known: Default::default(), interrupted: Default::default(), stopping: false }
    }

    /// Reads the tree from `/proc`: the root's descendants, and those of processes seen before
    /// that still live (an orphan's children). Once stopping, a group not yet interrupted gets
    /// its SIGINT now.
    fn sweep(&mut self) {
        let Ok(entries) = std::fs::read_dir("/proc") else { return };
        let all: Vec<(i32, ProcStat)> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(|pid| Some((pid, proc_stat(pid)?)))
            .collect();
        // Still the process seen before (not a reused pid), and alive.
        self.known.retain(|pid, (start, _)| all.iter().any(|(p, s)| p == pid && s.start == *start && s.lives()));
        let mut parents: Vec<i32> = std::iter::once(self.root).chain(self.known.keys().copied()).collect();
        while let Some(parent) = parents.pop() {
            for (pid, stat) in &all {
                if stat.ppid == parent && stat.lives() && !self.known.contains_key(pid) {
                    self.known.insert(*pid, (stat.start, stat.pgrp));
                    parents.push(*pid);
                }
            }
        }
        if self.stopping {
            self.interrupt_new_groups();
        }
    }

    /// The tool is interrupted (its own group got SIGINT from the caller): every other group
    /// of its tree gets SIGINT too, now and as it appears.
    fn interrupt(&mut self) {
        self.stopping = true;
        self.interrupted.insert(self.root);
        self.sweep();
    }

    fn interrupt_new_groups(&mut self) {
        let groups: std::collections::BTreeSet<i32> = self.known.values().map(|&(_, pgrp)| pgrp).collect();
        for pgrp in groups {
            // Only a group the tree made (its leader is one of the tool's processes); a process
            // in someone else's group is signalled alone.
            let ours = pgrp == self.root || self.known.contains_key(&pgrp);
            if ours && self.interrupted.insert(pgrp) {
                tracing::debug!(pgrp, "SIGINT to a process group the tool made");
                let _ = killpg(Pid::from_raw(pgrp), Signal::SIGINT);
            }
        }
        let strays: Vec<i32> = self
            .known
            .iter()
            .filter(|(_, (_, pgrp))| *pgrp != self.root && !self.known.contains_key(pgrp))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in strays {
            if self.interrupted.insert(-pid) {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGINT);
            }
        }
    }

    /// `signal` to every group of the tree and to every process of it still alive.
    fn signal_all(&mut self, signal: Signal) {
        self.sweep();
        let groups: std::collections::BTreeSet<i32> = self
            .known
            .values()
            .map(|&(_, pgrp)| pgrp)
            .filter(|pgrp| *pgrp == self.root || self.known.contains_key(pgrp))
            .collect();
        for pgrp in groups {
            let _ = killpg(Pid::from_raw(pgrp), signal);
        }
        for pid in self.known.keys() {
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid), signal);
        }
    }
}

fn signal_group(pgid: Option<Pid>, signal: Signal) {
    if let Some(pgid) = pgid {
        // ESRCH means the group already exited, which is what we wanted.
        let _ = killpg(pgid, signal);
    }
}

/// The process groups of a run's live children, noted in `running/<rdeploy pid>` (one line per
/// child: its pid, which is its group, its start time from `/proc/PID/stat` and its command) so
/// a run that takes over after a crash can tell whether a tool of the dead run still lives: a
/// tool outlives a killed rdeploy, finishes its work unobserved, and the next run waits for it.
/// Created once by the driver and handed to every step in its [`crate::StepContext`]; the
/// default notes nothing.
#[derive(Clone, Debug, Default)]
pub struct ProcessTracker {
    notes: Option<Arc<Mutex<RunningNotes>>>,
}

#[derive(Debug)]
struct RunningNotes {
    path: PathBuf,
    /// The note file, opened once and rewritten in place (see [`RunningNotes::save`]).
    file: Option<File>,
    /// How many bytes the file holds: its longest text so far.
    len: usize,
    /// pid -> (start time, command)
    groups: BTreeMap<u32, (u64, String)>,
}

impl RunningNotes {
    /// Rewrites the note with one `pwrite` at offset 0 into the file opened once; a shorter text
    /// is padded with empty lines (which say nothing) to the file's length, so the file is never
    /// truncated. On ext4 a truncation frees the file's block (a synchronous discard on a
    /// `discard` mount) and makes the next close flush it: twice per child, that cost more than
    /// the child.
    fn save(&mut self) {
        let mut text: Vec<u8> = self
            .groups
            .iter()
            .map(|(pid, (start, cmd))| format!("{pid}\t{start}\t{}\n", cmd.replace(['\n', '\r'], " ")))
            .collect::<String>()
            .into_bytes();
        for _ in 0..2 {
            let Ok((file, len)) = self.open() else { continue };
            // Padding only ever adds empty lines, so a retry may write it again.
            text.resize(text.len().max(len), b'\n');
            if std::os::unix::fs::FileExt::write_all_at(file, &text, 0).is_ok() {
                self.len = text.len();
                return;
            }
            self.file = None;
        }
    }

    /// The note file and its length: the one opened before while it still has a name, else
    /// opened (created 0600, never through a link) again. A file of an earlier process with the
    /// same pid is overwritten whole by the next save, as its length is taken here.
    fn open(&mut self) -> std::io::Result<(&File, usize)> {
        let still_named = |f: &File| f.metadata().is_ok_and(|m| std::os::unix::fs::MetadataExt::nlink(&m) > 0);
        if !self.file.as_ref().is_some_and(still_named) {
            let options = || std::fs::OpenOptions::new().write(true).create(true).clone();
            let file = match crate::private::open(&self.path, &mut options()) {
                Ok(file) => file,
                Err(_) => {
                    // `running/` itself, never the state directory above it: a state directory
                    // deleted mid-run is not recreated here (the driver says it is gone).
                    if let Some(dir) = self.path.parent() {
                        let _ = crate::private::create_dir(dir);
                    }
                    crate::private::open(&self.path, &mut options())?
                }
            };
            self.len = file.metadata().map_or(0, |m| m.len() as usize);
            self.file = Some(file);
        }
        Ok((self.file.as_ref().expect("opened above"), self.len))
    }
}

impl ProcessTracker {
    /// Notes every child of this rdeploy process under `dir` while it runs.
    /// Nothing is written until a child starts.
    pub fn in_dir(dir: PathBuf) -> ProcessTracker {
        let path = dir.join(std::process::id().to_string());
        let notes = RunningNotes { path, file: None, len: 0, groups: BTreeMap::new() };
        ProcessTracker { notes: Some(Arc::new(Mutex::new(notes))) }
    }

    /// Notes a child that is not reaped yet, and its start (as `/proc/PID/stat` gives it) when
    /// the caller knows it.
    fn note(&self, pid: u32, start: Option<u64>, command: impl FnOnce() -> String) {
        let Some(notes) = &self.notes else { return };
        // Read before the child is reaped: even a child that already exited (a zombie) still
        // has its start time.
        let start = start.or_else(|| proc_stat(pid as i32).map(|s| s.start)).unwrap_or(0);
        let mut notes = notes.lock().unwrap_or_else(|e| e.into_inner());
        notes.groups.insert(pid, (start, command()));
        notes.save();
    }

    /// Forgets a reaped child: its line is rewritten out of the note at once, so a clean end
    /// (or a kill -9 after it) leaves no line a later run could take for a survivor. Keeping
    /// the line of a child whose group was empty saved one write per child, but after a pid
    /// wrap an unrelated group with that pid would then read as a survivor and lock `recover`.
    fn forget(&self, pid: u32) {
        let Some(notes) = &self.notes else { return };
        let mut notes = notes.lock().unwrap_or_else(|e| e.into_inner());
        if notes.groups.remove(&pid).is_some() {
            notes.save();
        }
    }
}

/// What `/proc/PID/stat` says of a process.
#[derive(Clone, Copy, Debug)]
struct ProcStat {
    /// `R`, `S`, `D`, `Z` (a zombie: exited, not yet reaped), ...
    state: char,
    ppid: i32,
    pgrp: i32,
    /// Clock ticks after boot (field 22): with the pid, it names one process for good.
    start: u64,
}

impl ProcStat {
    /// A zombie has exited: it only waits for its parent (or a slow PID 1) to reap it.
    fn lives(&self) -> bool {
        !matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Whether `pid` names a live process here: a zombie (exited, waiting for its parent or a slow
/// PID 1 to reap it) is not alive, although `kill(pid, 0)` succeeds on it.
pub fn process_lives(pid: i32) -> bool {
    proc_stat(pid).is_some_and(|s| s.lives())
}

fn proc_stat(pid: i32) -> Option<ProcStat> {
    // Read into a buffer on the stack: `read_to_string` asks a /proc file (size 0) for its length,
    // then reads it in doubling pieces from 32 bytes, six reads where one does (a line is a few
    // hundred bytes), and this is read for every child started.
    use std::io::Read as _;
    let mut file = std::fs::File::open(format!("/proc/{pid}/stat")).ok()?;
    let mut buf = [0u8; 1024];
    let mut len = 0;
    while len < buf.len() && !buf[..len].ends_with(b"\n") {
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    // A command name is any bytes (a program may name itself so): not UTF-8 is still a process.
    let text = String::from_utf8_lossy(&buf[..len]);
    // The command name (field 2) is in parentheses and may hold spaces and parentheses itself.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// Whether the process group a tool was started in still has a live process of that tool. The
/// leader (the noted pid) counts if it is no zombie and started when noted (else its pid was
/// reused). When it is gone or a zombie, any live member of its group counts: a group's number
/// is not handed out again while any member lives.
fn group_lives(pgid: i32, start: Option<u64>) -> bool {
    match proc_stat(pgid) {
        Some(leader) if start.is_some_and(|s| s != leader.start) => return false,
        Some(leader) if leader.lives() => return true,
        _ => {}
    }
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != pgid)
        .filter_map(proc_stat)
        .any(|s| s.pgrp == pgid && s.lives() && start.is_none_or(|start| s.start >= start))
}

/// Process groups noted by earlier runs that are still alive: `(pgid, command)`. Zombies and
/// reused pids are not the tool. Notes whose groups are all gone are removed.
pub fn surviving_children(dir: &Path) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut alive = Vec::new();
    for entry in entries.flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let live: Vec<(i32, String)> = text
            .lines()
            .filter_map(parse_note)
            .filter(|(pgid, start, _)| group_lives(*pgid, *start))
            .map(|(pgid, _, cmd)| (pgid, cmd))
            .collect();
        if live.is_empty() {
            let _ = std::fs::remove_file(entry.path());
        }
        alive.extend(live);
    }
    alive
}

/// `pid \t start \t command`, or the older `pid \t command` (no start time known).
fn parse_note(line: &str) -> Option<(i32, Option<u64>, String)> {
    let (pgid, rest) = line.split_once('\t')?;
    let pgid = pgid.parse().ok()?;
    match rest.split_once('\t') {
        Some((start, cmd)) if start.parse::<u64>().is_ok() => {
            let start = start.parse::<u64>().ok().filter(|&s| s != 0);
            Some((pgid, start, cmd.to_string()))
        }
        _ => Some((pgid, None, rest.to_string())),
    }
}

/// Waits, up to `bound`, for the tools earlier runs left running under `dir` to end; `waiting`
/// is told what is waited for, once, before the first wait. Returns those still alive.
pub fn wait_for_survivors(dir: &Path, bound: Duration, waiting: impl FnOnce(&[(i32, String)])) -> Vec<(i32, String)> {
    let mut alive = surviving_children(dir);
    if alive.is_empty() {
        return alive;
    }
    waiting(&alive);
    let until = crate::saturating_deadline(bound);
    while !alive.is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        alive = surviving_children(dir);
    }
    alive
}

/// Which stdout lines [`capture`] copies to the step's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdoutLog {
    /// Every line, as it arrives.
    Lines,
    /// Only human output: a JSON document (`-o json`) is not worth a line each in the log.
    UnlessJson,
}

/// What [`capture`] kept of a finished command.
#[derive(Clone, Debug, Default)]
pub struct Captured {
    pub outcome: Outcome,
    /// Every stdout line as the tool wrote it, for parsing (`-o json`): a secret replaced inside
    /// a JSON line could break it. Redact what you keep from it ([`Command::redact_text`]).
    pub stdout: Vec<String>,
    /// Every stderr line, redacted.
    pub stderr: Vec<String>,
}

/// Runs a command of a step to completion, keeping its stdout and stderr for parsing and
/// copying them to the step's log (redacted) through `sink`.
pub async fn capture(
    cmd: &Command,
    ctx: &crate::StepContext,
    timeout: Option<Duration>,
    sink: Option<&dyn crate::EventSink>,
    log_stdout: StdoutLog,
) -> Result<Captured, AdapterError> {
    let cmd = cmd.clone().in_step(ctx).raw_lines();
    let log = |stream, line: &str| {
        if let Some(sink) = sink {
            sink.emit(crate::Event::Output { stream, line: cmd.redact_text(line) });
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
                stderr.push(cmd.redact_text(line));
            }
        })
        .await?;
    if log_stdout == StdoutLog::UnlessJson && !stdout.first().is_some_and(|l| l.starts_with('[') || l.starts_with('{'))
    {
        for line in &stdout {
            log(Stream::Stdout, line);
        }
    }
    Ok(Captured { outcome, stdout, stderr })
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
pub(super) mod tests {
    use super::*;

    /// Drives `run` until `file` exists (`None`), or to its end if that comes first (its output).
    async fn run_until_exists<F: std::future::Future>(
        mut run: std::pin::Pin<&mut F>,
        file: &Path,
    ) -> Option<F::Output> {
        while !file.exists() {
            tokio::select! {
                output = &mut run => return Some(output),
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        None
    }

    pub(crate) async fn run(cmd: Command) -> (Outcome, Vec<(Stream, String)>) {
        let mut lines = Vec::new();
        let outcome =
            cmd.run(&CancellationToken::new(), None, &mut |s, l| lines.push((s, l.to_string()))).await.unwrap();
        (outcome, lines)
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

    /// Lines reach the caller while the child still runs (the child here waits for the file the
    /// caller writes when it sees `ready`), and a line written in two pieces arrives whole.
    #[tokio::test]
    async fn output_is_followed_while_the_child_runs_and_split_lines_are_joined() {
        let dir = tempfile::tempdir().unwrap();
        let go = dir.path().join("go");
        let script = "printf 'par'; sleep 0.2; printf 'tial\\n'; echo ready; \
                      while [ ! -f go ]; do sleep 0.01; done; echo err >&2; printf 'no newline'";
        let cmd = Command::shell(script).cwd(dir.path());
        let mut lines = Vec::new();
        let outcome = cmd
            .run(&CancellationToken::new(), Some(Duration::from_secs(60)), &mut |s, l| {
                if l == "ready" {
                    std::fs::write(&go, "").unwrap();
                }
                lines.push((s, l.to_string()));
            })
            .await
            .unwrap();
        assert!(outcome.success() && !outcome.timed_out, "{lines:?}");
        assert_eq!(
            lines,
            [
                (Stream::Stdout, "partial".to_string()),
                (Stream::Stdout, "ready".to_string()),
                (Stream::Stderr, "err".to_string()),
                (Stream::Stdout, "no newline".to_string()),
            ]
        );
    }

    /// Everything a child wrote reaches the caller, even megabytes written in its last moments
    /// (more than one poll reads): after the exit the files are read to their end.
    #[tokio::test]
    async fn output_written_just_before_exit_is_read_to_the_end() {
        let dir = tempfile::tempdir().unwrap();
        // 5 MiB of numbered lines on each stream, copied at once by `cat`, which then exits.
        let lines: String = (0..500_000).map(|i| format!("line {i:06}\n")).collect();
        assert!(lines.len() >= 5 << 20);
        std::fs::write(dir.path().join("big"), &lines).unwrap();
        let (outcome, got) = run(Command::shell("cat big; cat big >&2").cwd(dir.path())).await;
        assert!(outcome.success());
        for stream in [Stream::Stdout, Stream::Stderr] {
            let of: Vec<&str> = got.iter().filter(|(s, _)| *s == stream).map(|(_, l)| l.as_str()).collect();
            assert_eq!(of.len(), 500_000, "{stream:?}: every line");
            assert_eq!(of.last(), Some(&"line 499999"), "{stream:?}");
        }
    }

    /// A grandchild that inherited the output and keeps writing (a daemon started with `&`)
    /// does not keep the run from ending once the child exited: what was written by then is
    /// read, the rest is not waited for.
    #[tokio::test]
    async fn a_grandchild_writing_forever_does_not_keep_the_run_from_ending() {
        let dir = tempfile::tempdir().unwrap();
        // The background loop writes as fast as it can; its pid goes to a file to stop it after.
        let script = "(while :; do echo spam; done) & echo $! > spammer; sleep 0.5; echo last";
        let (outcome, got) = run(Command::shell(script).cwd(dir.path())).await;
        let pid: i32 = std::fs::read_to_string(dir.path().join("spammer")).unwrap().trim().parse().unwrap();
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
        assert!(outcome.success());
        assert!(got.iter().any(|(s, l)| *s == Stream::Stdout && l == "last"), "the child's own last line is read");
    }

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(60), "{what}: never happened");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A child started from a thread that then exits (tokio retires its blocking threads) gets
    /// no death signal: only rdeploy's death sends one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_child_outlives_the_thread_it_was_started_from() {
        let dir = tempfile::tempdir().unwrap();
        for signal in [Signal::SIGTERM, Signal::SIGINT] {
            let _ = std::fs::remove_file(dir.path().join("go"));
            let _ = std::fs::remove_file(dir.path().join("ready"));
            let cmd = Command::shell(
                "trap 'echo INT; exit 8' INT; trap 'echo TERM; exit 9' TERM; touch ready; \
                 while [ ! -f go ]; do sleep 0.01; done; echo finished",
            )
            .cwd(dir.path())
            .on_rdeploy_death(signal);
            let runtime = tokio::runtime::Handle::current();
            let on_thread = cmd.clone();
            let (started, tid) = std::thread::spawn(move || {
                let _entered = runtime.enter();
                let started = on_thread.start().unwrap();
                wait_for("the child's trap", || on_thread.cwd.as_ref().unwrap().join("ready").exists());
                (started, nix::unistd::gettid())
            })
            .join()
            .unwrap();
            // The thread is gone for good (its death signals, if any, were sent).
            wait_for("the thread's end", || !Path::new(&format!("/proc/self/task/{tid}")).exists());
            std::fs::write(dir.path().join("go"), "").unwrap();
            let mut lines = Vec::new();
            let outcome = cmd
                .follow_to_the_end(started, &CancellationToken::new(), None, &mut |_, l| lines.push(l.to_string()))
                .await
                .unwrap();
            assert_eq!(lines, ["finished"], "{signal:?}: {}", outcome.describe_status());
            assert!(outcome.success(), "{signal:?}: {}", outcome.describe_status());
        }
    }

    /// A run whose future is dropped while its tool runs (a panic unwinding, Ctrl-C's path)
    /// stops the tool with its graceful signal, for its whole group, and leaves its running note
    /// for the next run to wait on.
    #[tokio::test]
    async fn dropping_the_run_sends_the_graceful_signal_and_keeps_the_note() {
        for signal in [Signal::SIGINT, Signal::SIGTERM] {
            let dir = tempfile::tempdir().unwrap();
            let running = dir.path().join("running");
            let mut cmd = Command::shell(
                "trap 'echo INT > got; exit 0' INT; trap 'echo TERM > got; exit 0' TERM; touch ready; \
                 i=0; while [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done",
            )
            .cwd(dir.path())
            .on_rdeploy_death(signal);
            cmd.tracker = ProcessTracker::in_dir(running.clone());
            let cancel = CancellationToken::new();
            let ready = dir.path().join("ready");
            let mut ignore = |_: Stream, _: &str| {};
            {
                let run = cmd.run(&cancel, None, &mut ignore);
                tokio::pin!(run);
                assert!(run_until_exists(run.as_mut(), &ready).await.is_none(), "the tool ended by itself");
            } // dropped here
            let got = dir.path().join("got");
            wait_for("the tool's trap", || !std::fs::read_to_string(&got).unwrap_or_default().is_empty());
            let name = signal.as_str().trim_start_matches("SIG");
            assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), name);
            let note = std::fs::read_to_string(running.join(std::process::id().to_string())).unwrap();
            assert!(note.contains("trap"), "the note stays: {note:?}");
        }
    }

    /// Named output files stay after the child, for a later run to read.
    /// A timeout the clock cannot add to now (a stack's `timeout` of 2^64-1 seconds, in a
    /// checkpoint written before validation bounded it) is no deadline, never a panic.
    #[tokio::test]
    async fn a_timeout_too_far_for_the_clock_is_no_deadline() {
        let cmd = Command::shell("echo ran");
        let mut lines = Vec::new();
        let outcome = cmd
            .run(&CancellationToken::new(), Some(Duration::MAX), &mut |_, line| lines.push(line.to_string()))
            .await
            .unwrap();
        assert!(outcome.success() && !outcome.timed_out, "{outcome:?}");
        assert_eq!(lines, ["ran"]);
        assert!(crate::deadline_after(Duration::MAX).is_none());
        assert!(crate::saturating_deadline(Duration::MAX) > Instant::now());
    }

    #[tokio::test]
    async fn named_output_files_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (out, err) = (dir.path().join("out"), dir.path().join("err"));
        std::fs::write(&out, "an older run's line\n").unwrap();
        let (outcome, lines) = run(Command::shell("echo one; echo two >&2").output_files(&out, &err)).await;
        assert!(outcome.success());
        assert_eq!(lines.len(), 2);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "one\n", "truncated, then written by the child");
        assert_eq!(std::fs::read_to_string(&err).unwrap(), "two\n");
    }

    /// Arguments shown as other words are run as given and displayed as shown; shown as
    /// nothing, they are left out of the display.
    #[tokio::test]
    async fn arguments_shown_otherwise_run_as_given() {
        let cmd = Command::new("/bin/echo")
            .arg("a")
            .args_shown_as(["--kubeconfig", "/cut"], ["--kubeconfig", "kube/fleet.yaml"])
            .arg("b")
            .args_shown_as(["--kubeconfig", "/cut"], None::<&str>)
            .args_shown_as(["c"], ["c"]);
        assert_eq!(cmd.display(), "/bin/echo a --kubeconfig kube/fleet.yaml b c");
        let (outcome, lines) = run(cmd).await;
        assert!(outcome.success());
        assert_eq!(lines, [(Stream::Stdout, "a --kubeconfig /cut b --kubeconfig /cut c".to_string())]);
    }

    /// The running notes are 0600 and never written through a link planted at their
    /// predictable name (rdeploy's pid).
    #[test]
    fn running_notes_are_private_and_never_follow_a_planted_link() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let running = dir.path().join("running");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        std::fs::create_dir(&running).unwrap();
        let planted = running.join(std::process::id().to_string());
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let tracker = ProcessTracker::in_dir(running.clone());
        tracker.note(1, None, || "init".into());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n", "not written through the link");

        std::fs::remove_file(&planted).unwrap();
        tracker.note(1, None, || "init".into());
        assert_eq!(std::fs::metadata(&planted).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&planted).unwrap().contains("\tinit\n"));
    }

    /// A program named without a `/` is looked up in the PATH the command sets, not rdeploy's:
    /// with and without the death-signal relay (two ways the spawner starts a child).
    #[tokio::test]
    async fn a_program_is_found_on_the_commands_own_path() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let pinned = dir.path().join("pinned");
        std::fs::create_dir(&pinned).unwrap();
        let tool = pinned.join("rdeploy-test-pinned-tool");
        std::fs::write(&tool, "#!/bin/sh\necho pinned\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = format!("{}:/usr/bin:/bin", pinned.display());
        for signal in [Signal::SIGTERM, Signal::SIGINT] {
            let cmd = Command::new("rdeploy-test-pinned-tool").env("PATH", &path).on_rdeploy_death(signal);
            let (outcome, lines) = run(cmd).await;
            assert!(outcome.success(), "{signal}: {outcome:?}");
            assert_eq!(lines, [(Stream::Stdout, "pinned".to_string())], "{signal}");
        }
    }

    /// A memory file's pages are given back as rdeploy reads them; every line still arrives,
    /// the file keeps its length, and the child's next write lands after what it wrote.
    #[test]
    fn a_memory_file_is_given_back_as_it_is_read() {
        use std::io::Write as _;
        use std::os::unix::fs::MetadataExt as _;
        let fd = nix::sys::memfd::memfd_create(c"test", nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC).unwrap();
        let mut write = File::from(fd);
        let text: String = (0..100_000).map(|i| format!("line {i:06} of the tool's output\n")).collect();
        write.write_all(text.as_bytes()).unwrap();
        let mut follower = Follower::new(Reader { file: write.try_clone().unwrap(), release: true }, Stream::Stdout);
        let mut lines = Vec::new();
        follower.read_to_end(&mut |_, line| lines.push(line));
        assert_eq!(lines.len(), 100_000);
        assert_eq!(lines[99_999], "line 099999 of the tool's output");
        let meta = write.metadata().unwrap();
        assert_eq!(meta.len(), text.len() as u64, "the length stays");
        assert!(
            meta.blocks() * 512 < text.len() as u64 - RELEASE_EVERY,
            "{} bytes held of {}",
            meta.blocks() * 512,
            text.len()
        );
        write.write_all(b"after\n").unwrap();
        follower.read_to_end(&mut |_, line| lines.push(line));
        assert_eq!(lines.last().map(String::as_str), Some("after"));
    }

    /// The note is one file rewritten in place (never truncated): a shorter note leaves no line
    /// of a longer one, an older process's file with the same pid is overwritten whole, and a
    /// file deleted under the run (its state directory removed) is made again.
    #[test]
    fn running_notes_are_rewritten_in_place() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let running = dir.path().join("running");
        std::fs::create_dir(&running).unwrap();
        let path = running.join(std::process::id().to_string());
        std::fs::write(&path, "99\t5\tan older rdeploy's tool with a long command line\n".repeat(3)).unwrap();
        let pids = || -> Vec<i32> {
            std::fs::read_to_string(&path).unwrap().lines().filter_map(parse_note).map(|(pid, ..)| pid).collect()
        };
        let tracker = ProcessTracker::in_dir(running.clone());
        tracker.note(11, None, || "terraform apply -auto-approve -input=false".into());
        assert_eq!(pids(), [11], "the older file is overwritten whole");
        tracker.note(12, None, || "helm".into());
        let inode = std::fs::metadata(&path).unwrap().ino();
        tracker.forget(11);
        assert_eq!(pids(), [12]);
        tracker.forget(12);
        assert_eq!(pids(), Vec::<i32>::new());
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), inode, "rewritten in place");
        std::fs::remove_dir_all(&running).unwrap();
        tracker.note(13, None, || "kubectl".into());
        assert_eq!(pids(), [13], "noted again after its file was deleted");
    }

    fn note(dir: &Path, lines: &[(u32, u64, &str)]) {
        let text: String = lines.iter().map(|(pid, start, cmd)| format!("{pid}\t{start}\t{cmd}\n")).collect();
        std::fs::write(dir.join("1"), text).unwrap();
    }

    fn wait_for_state(pid: u32, zombie: bool) -> ProcStat {
        let start = Instant::now();
        loop {
            let stat = proc_stat(pid as i32).unwrap();
            if stat.lives() != zombie {
                return stat;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "process {pid} never reached the state");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn spawn_group(args: &[&str]) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new(args[0]).args(&args[1..]).process_group(0).spawn().unwrap()
    }

    /// A zombie is not alive (PID 1 may take seconds to reap one); a pid whose start time
    /// differs from the noted one was reused; a group whose leader is a zombie but whose member
    /// lives is alive.
    #[test]
    fn zombies_and_reused_pids_are_not_survivors() {
        let dir = tempfile::tempdir().unwrap();

        // Not waited for: a zombie until reaped below.
        let mut zombie = spawn_group(&["true"]);
        let stat = wait_for_state(zombie.id(), true);
        assert!(killpg(Pid::from_raw(zombie.id() as i32), None).is_ok(), "kill(-pgid, 0) believes a zombie lives");
        note(dir.path(), &[(zombie.id(), stat.start, "true")]);
        assert_eq!(surviving_children(dir.path()), []);
        assert!(!dir.path().join("1").exists(), "a note with nothing alive is removed");

        let mut live = spawn_group(&["sleep", "60"]);
        let stat = wait_for_state(live.id(), false);
        note(dir.path(), &[(live.id(), stat.start, "sleep 60")]);
        assert_eq!(surviving_children(dir.path()), [(live.id() as i32, "sleep 60".to_string())]);
        note(dir.path(), &[(live.id(), stat.start + 1, "sleep 60")]);
        assert_eq!(surviving_children(dir.path()), [], "the pid belongs to another process now");

        // The leader exits (a zombie, not waited for), its background child lives on in the group.
        let mut leader = spawn_group(&["sh", "-c", "sleep 60 &"]);
        let _ = leader.id();
        let stat = proc_stat(leader.id() as i32).unwrap();
        wait_for_state(leader.id(), true);
        note(dir.path(), &[(leader.id(), stat.start, "sh")]);
        assert_eq!(surviving_children(dir.path()), [(leader.id() as i32, "sh".to_string())]);

        for child in [&mut zombie, &mut live, &mut leader] {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            child.wait().unwrap();
        }
    }

    /// The death signal is the one set on the command: a child whose parent dies gets it, the
    /// relayed SIGINT and the kernel's own SIGTERM alike, started by the spawner or (SIGTERM, from
    /// a thread that lives as long as rdeploy) by rdeploy's own thread.
    #[test]
    fn a_dying_parent_sends_the_commands_signal() {
        for (signal, here) in [("INT", false), ("TERM", false), ("TERM", true)] {
            let dir = tempfile::tempdir().unwrap();
            // An intermediate process that starts the tool through this very code, then dies.
            let exe = std::env::current_exe().unwrap();
            let mut parent = std::process::Command::new(exe)
                .args(["--exact", "process::tests::death_signal_helper", "--nocapture", "--include-ignored"])
                .env("RDEPLOY_TEST_DEATH_DIR", dir.path())
                .env("RDEPLOY_TEST_DEATH_SIGNAL", signal)
                .env("RDEPLOY_TEST_DEATH_HERE", if here { "1" } else { "" })
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            let started_here = dir.path().join("started-here");
            let start = Instant::now();
            while std::fs::read_to_string(&started_here).unwrap_or_default().is_empty() {
                assert!(start.elapsed() < Duration::from_secs(60), "the helper never started its child");
                std::thread::sleep(Duration::from_millis(10));
            }
            // SIGINT needs the relay, which only the spawner starts.
            let expected = if here { "1" } else { "0" };
            assert_eq!(std::fs::read_to_string(&started_here).unwrap(), expected, "{signal}: started here");
            parent.kill().unwrap();
            parent.wait().unwrap();
            let got = dir.path().join("got");
            let start = Instant::now();
            while std::fs::read_to_string(&got).unwrap_or_default().is_empty() {
                assert!(start.elapsed() < Duration::from_secs(60), "the child never heard of its parent's death");
                std::thread::sleep(Duration::from_millis(10));
            }
            assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), signal, "started here: {here}");
        }
    }

    #[tokio::test]
    #[ignore = "run by a_dying_parent_sends_the_commands_signal"]
    async fn death_signal_helper() {
        let Some(dir) = std::env::var_os("RDEPLOY_TEST_DEATH_DIR") else { return };
        let signal = match std::env::var("RDEPLOY_TEST_DEATH_SIGNAL").as_deref() {
            Ok("TERM") => Signal::SIGTERM,
            _ => Signal::SIGINT,
        };
        // This thread runs the test to its end, when the whole process is killed.
        if std::env::var_os("RDEPLOY_TEST_DEATH_HERE").is_some_and(|here| !here.is_empty()) {
            spawner::lives_as_long_as_rdeploy();
        }
        let script = "trap 'echo INT > got; exit 0' INT; trap 'echo TERM > got; exit 0' TERM; touch ready; \
                      while :; do sleep 0.05; done";
        let dir = PathBuf::from(dir);
        let cmd = Command::shell(script).cwd(&dir).on_rdeploy_death(signal);
        let cancel = CancellationToken::new();
        let mut ignore = |_: Stream, _: &str| {};
        let run = cmd.run(&cancel, None, &mut ignore);
        tokio::pin!(run);
        if run_until_exists(run.as_mut(), &dir.join("ready")).await.is_some() {
            return;
        }
        // How it was started, for the test to check before it kills this process.
        std::fs::write(dir.join("started-here"), spawner::started_here().to_string()).unwrap();
        let _ = run.await;
    }

    /// From a thread that lives as long as rdeploy a child is started right there, without the
    /// spawner, and it is the same child: rdeploy's, in its own group, stdin from /dev/null, in
    /// the command's directory with its environment, its status and output followed. A file the
    /// kernel does not run itself still runs (the spawner's `execvp` hands it to `sh`), a program
    /// without a slash is searched for on PATH (by the spawner), and a missing one is a spawn
    /// error.
    #[tokio::test]
    async fn a_thread_that_lives_as_long_as_rdeploy_starts_its_children_itself() {
        // The current-thread runtime's: every child below ends before the test (and the thread).
        spawner::lives_as_long_as_rdeploy();
        let dir = tempfile::tempdir().unwrap();
        let before = spawner::started_here();
        let script = "echo $GREETING; pwd; echo ppid=$PPID; echo pgid=$(cut -d' ' -f5 /proc/self/stat) pid=$$; \
                      readlink /proc/self/fd/0; exit 4";
        let (outcome, lines) = run(Command::shell(script).env("GREETING", "hello").cwd(dir.path())).await;
        assert_eq!(spawner::started_here(), before + 1, "started here");
        assert_eq!(outcome.code, Some(4), "{lines:?}");
        let lines: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(lines[..2], ["hello", dir.path().canonicalize().unwrap().to_str().unwrap()]);
        assert_eq!(lines[2], format!("ppid={}", std::process::id()), "rdeploy's child");
        let (pgid, pid) = lines[3].trim_start_matches("pgid=").split_once(" pid=").unwrap();
        assert_eq!(pgid, pid, "its own process group");
        assert_eq!(lines[4], "/dev/null");

        let script = dir.path().join("no-interpreter-line");
        std::fs::write(&script, "echo ran by sh\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let (outcome, lines) = run(Command::new(&script)).await;
        assert!(outcome.success(), "{lines:?}");
        assert_eq!(lines, [(Stream::Stdout, "ran by sh".to_string())]);
        let (outcome, lines) = run(Command::new("printf").arg("found on PATH")).await;
        assert!(outcome.success(), "{lines:?}");
        assert_eq!(lines, [(Stream::Stdout, "found on PATH".to_string())]);
        assert_eq!(spawner::started_here(), before + 1, "the spawner started these two");

        let err = Command::new(dir.path().join("missing")).run(&CancellationToken::new(), None, &mut |_, _| {}).await;
        assert!(matches!(err, Err(AdapterError::Spawn { .. })), "{err:?}");
    }

    /// A child's start is read from the boot clock around its clone, as `/proc/PID/stat` gives
    /// it (what the running note keys it by), whether the spawner or this thread started it.
    #[tokio::test]
    async fn a_childs_start_is_read_as_proc_gives_it() {
        let null = std::fs::OpenOptions::new().write(true).open("/dev/null").unwrap();
        let args: [OsString; 2] = ["-c".into(), "sleep 60".into()];
        let request = spawner::Request {
            program: std::ffi::OsStr::new("/bin/sh"),
            args: &args,
            env: &[],
            cwd: None,
            death_signal: Signal::SIGTERM,
            relay: false,
            stdout: &null,
            stderr: &null,
        };
        // The spawner's first, then this thread's (a thread once said to live long stays so).
        for here in [false, true] {
            if here {
                spawner::lives_as_long_as_rdeploy();
            }
            // A clock tick may pass during the clone (the start is then read from /proc): tried
            // until one does not.
            for tries in 1.. {
                let before = spawner::started_here();
                let started = if here { spawner::spawn_here(&request) } else { spawner::spawn(&request) };
                let mut child = started.expect("a way to start it").unwrap();
                assert_eq!(spawner::started_here(), before + usize::from(here), "started here: {here}");
                let (start, proc) = (child.start(), proc_stat(child.id() as i32).unwrap().start);
                signal_group(Some(Pid::from_raw(child.id() as i32)), Signal::SIGKILL);
                child.wait().await.unwrap();
                if let Some(start) = start {
                    assert_eq!(start, proc, "started here: {here}");
                    break;
                }
                assert!(tries < 50, "a clock tick passed during each of {tries} clones");
            }
        }
    }

    /// A running child's note holds the start `/proc/PID/stat` gives it (what tells it from a
    /// later process with its pid), started by the spawner or from a thread that lives as long
    /// as rdeploy.
    #[tokio::test]
    async fn a_child_is_noted_with_its_start_as_proc_gives_it() {
        for here in [false, true] {
            if here {
                spawner::lives_as_long_as_rdeploy();
            }
            let dir = tempfile::tempdir().unwrap();
            let running = dir.path().join("running");
            let mut cmd = Command::shell("touch ready; while [ ! -f go ]; do sleep 0.01; done").cwd(dir.path());
            cmd.tracker = ProcessTracker::in_dir(running.clone());
            let mut ignore = |_: Stream, _: &str| {};
            let cancel = CancellationToken::new();
            let run = cmd.run(&cancel, None, &mut ignore);
            tokio::pin!(run);
            let ready = dir.path().join("ready");
            assert!(run_until_exists(run.as_mut(), &ready).await.is_none(), "the tool ended by itself");
            let note = std::fs::read_to_string(running.join(std::process::id().to_string())).unwrap();
            let (pid, start, _) = parse_note(note.lines().next().unwrap()).unwrap();
            assert_eq!(start, Some(proc_stat(pid).unwrap().start), "started here: {here}: {note:?}");
            std::fs::write(dir.path().join("go"), "").unwrap();
            assert!(run.await.unwrap().success());
        }
    }

    /// Children are not forked from rdeploy but started by the spawner, forked before rdeploy
    /// opened anything, or from a thread of rdeploy that closes rdeploy's descriptors before the
    /// exec: a descriptor rdeploy opens later, even one an exec would keep, never reaches a tool;
    /// the tool's parent is still rdeploy, which reaps it; it runs in its own process group with
    /// stdin from /dev/null.
    #[tokio::test]
    async fn children_come_from_the_spawner_and_see_none_of_rdeploys_descriptors() {
        let (outcome, _) = run(Command::shell("true")).await; // the spawner exists from here
        assert!(outcome.success());
        let dir = tempfile::tempdir().unwrap();
        let kept = std::fs::File::create(dir.path().join("rdeploy-only")).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&kept);
        // Inheritable, as a fork of rdeploy would hand it down.
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).unwrap();
        let script = format!(
            "test -e /proc/self/fd/{fd} && echo inherited; echo ppid=$PPID; \
             echo pgid=$(cut -d' ' -f5 /proc/self/stat) pid=$$; readlink /proc/self/fd/0"
        );
        // The spawner's child, then one this thread starts itself (it closes them).
        for here in [false, true] {
            if here {
                spawner::lives_as_long_as_rdeploy();
            }
            let before = spawner::started_here();
            let (outcome, lines) = run(Command::shell(&script)).await;
            assert_eq!(spawner::started_here(), before + usize::from(here), "started here: {here}");
            assert!(outcome.success(), "{lines:?}");
            let lines: Vec<&str> = lines.iter().map(|(_, l)| l.as_str()).collect();
            assert!(!lines.contains(&"inherited"), "the tool got rdeploy's descriptor {fd} (here: {here}): {lines:?}");
            assert!(lines.contains(&format!("ppid={}", std::process::id()).as_str()), "rdeploy's child: {lines:?}");
            let group = lines.iter().find(|l| l.starts_with("pgid=")).unwrap();
            let (pgid, pid) = group.trim_start_matches("pgid=").split_once(" pid=").unwrap();
            assert_eq!(pgid, pid, "its own process group");
            assert!(lines.contains(&"/dev/null"), "{lines:?}");
        }
        // The spawner: named so, a child of this process. (Counting processes by that name
        // would also count another test's tool between its clone and its exec.)
        let spawner = spawner::pid().expect("a spawner runs");
        let stat = std::fs::read_to_string(format!("/proc/{spawner}/stat")).unwrap();
        assert!(stat.contains("(rdeploy-spawner)"), "{stat}");
        let ppid = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1)).unwrap();
        assert_eq!(ppid, std::process::id().to_string(), "a child of this process: {stat}");
        drop(kept);
    }
}
