//! The spawner: a small process forked from rdeploy once, first thing (before the runtime, the
//! parsed stack and the journal exist), that starts the tools rdeploy's own threads cannot.
//!
//! Tools without a relay (shell lines, kubectl) are started without it: a thread that lives as
//! long as rdeploy (`main`'s, and every thread of [`runtime`], whose idle threads are kept for
//! `u32::MAX` seconds, 136 years) clones the child itself with `clone(CLONE_VM | CLONE_VFORK)`,
//! as `posix_spawn` does (no page tables copied, however much rdeploy holds), and the child
//! closes rdeploy's descriptors and sets its death signal before its exec ([`spawn_here`]). That signal fires
//! when the *thread* that cloned the child exits, hence the condition on the thread. The
//! spawner starts the rest: a child asked for from any other thread (a test's, the PostgreSQL
//! store's), a tool with a relay (terraform's, helm's and ansible's SIGINT), a program found on
//! PATH (`execvp` searches `environ`, which a process with other threads must not swap), a file
//! the kernel does not run itself (`execvp`'s `sh` fallback) or finds busy.
//!
//! Why (issue 29, shell sub-changes at 1.15x the C durable floor): the spawner's round trip was
//! a wake-up of the spawner and one of rdeploy on its answer for every child, and reading the
//! child's start from `/proc/PID/stat` while it execs waited for its exec; both are gone (the
//! start is read from the boot clock around the clone, see `StartTick`). Measured at 1,000
//! sub-changes running `sh -c true` (release builds, alternated, `perf stat`, the 2-core machine
//! loaded by other builds): context switches of the whole run 10.0-10.5k with the spawner,
//! 6.25-6.4k now (the floor's: 6.0k). On the quiet machine, `benches/core.sh`: rdeploy's time
//! beyond the floor per sub-change .168-.286 ms with the spawner, .097-.145 ms now at 1,000;
//! .221 against .129 ms at 10,000.
//!
//! Forking a tool from rdeploy itself copies rdeploy's page tables, which grow with what it
//! holds (a 100,000-sub-change stack is a large heap), on every sub-change; `posix_spawn`
//! would not copy them but cannot set `PR_SET_PDEATHSIG`. The spawner is as small as rdeploy
//! was when it started, so its fork costs what a fork of a small process costs, whatever rdeploy
//! holds later.
//!
//! A tool the spawner starts is still rdeploy's child, not the spawner's: it is started with
//! `clone(CLONE_PARENT)`, so rdeploy reaps it (through a pidfd), its `PR_SET_PDEATHSIG` means
//! rdeploy's death (the parent it names is the rdeploy thread that started the spawner, which
//! lives as long as rdeploy: `main`'s, or in a test binary a thread that never exits), and a
//! `getppid()` check in the child still tells whether rdeploy died before the signal was set.
//! Everything else the child does before its `exec` is what the fork path did: its own process
//! group, output to the files rdeploy passed (over a unix socket, `SCM_RIGHTS`), its directory,
//! no signal blocked or ignored, the death signal or the relay that sends it once to the group
//! ([`relay_one_death_signal`]), and `execvp` with the child's environment, as std does.
//!
//! Why it stays (issue 30 asked for 20% of rdeploy's own cost or its removal): measured on the
//! shared 2-core machine (load average 9-16 from other builds), release build, shell
//! sub-changes running `sh -c true`, one binary switched between the spawner and a plain
//! `tokio::process::Command` with a `pre_exec` (process group, death signal), alternating, CPU
//! of every process of the run from a cpuacct cgroup (the spawner's included): at 1,000
//! sub-changes rdeploy's own CPU beyond the C durable floor (`benches/floor.c`) was 0.28 / 0.35
//! / 0.70 ms per sub-change with the spawner against 1.18 / 1.67 / 2.53 ms forking from
//! rdeploy (41-86% saved, 83% in the median pair); at 10,000, 0.26 ms with the spawner, while
//! the forking run had used 115 s of CPU (13.1 ms per sub-change, rising with the heap each
//! fork copies) when it was stopped after 8,810 of them, against 17.8 s for all 10,000 with
//! the spawner.
//!
//! Every `unsafe` of the process code lives here, each with its `// SAFETY:` comment: the
//! spawner's fork, clone and exec, the pidfd wait, and for the fork path without a spawner
//! [`die_with_rdeploy`] and [`relay_one_death_signal`].
//!
//! The spawner itself dies with rdeploy (`PR_SET_PDEATHSIG` SIGKILL) or when rdeploy closes its
//! end of the socket; it ignores the terminal's signals (rdeploy decides what a Ctrl-C means) and
//! holds no descriptor but its socket (it is forked before rdeploy opens any, and closes those it
//! was given), so not the state directory's lock.

use std::collections::BTreeMap;
use std::ffi::{CString, OsStr, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::{Mutex, OnceLock};

use nix::libc;
use nix::sys::signal::Signal;
use tokio::io::unix::AsyncFd;

/// The connection to the spawner; `None` when none could be started (then rdeploy forks its
/// children itself, as before).
static SPAWNER: OnceLock<Option<Mutex<Connection>>> = OnceLock::new();

struct Connection {
    socket: UnixStream,
    /// Cleared when the spawner is gone: later children are forked by rdeploy itself.
    alive: bool,
    spawner: libc::pid_t,
}

/// Starts the spawner from the calling thread, which must live as long as the process (`main`'s,
/// called first thing, while rdeploy is one small thread). Later calls do nothing.
pub fn start_from_this_thread() {
    SPAWNER.get_or_init(|| fork_spawner().map_err(|e| tracing::debug!(error = %e, "no spawner")).ok().map(Mutex::new));
}

/// The spawner's pid, while it serves.
#[cfg(test)]
pub(super) fn pid() -> Option<libc::pid_t> {
    let conn = connection()?.lock().unwrap_or_else(|e| e.into_inner());
    conn.alive.then_some(conn.spawner)
}

/// The spawner, started on first use when `main` did not (a test binary): from a thread that
/// never exits, so its death signal means the process's death.
fn connection() -> Option<&'static Mutex<Connection>> {
    SPAWNER
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let thread = std::thread::Builder::new().name("rdeploy-spawner".into()).spawn(move || {
                let _ = tx.send(fork_spawner());
                loop {
                    std::thread::park();
                }
            });
            let started = thread.ok().and_then(|_| rx.recv().ok());
            match started {
                Some(Ok(conn)) => Some(Mutex::new(conn)),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "no spawner");
                    None
                }
                None => None,
            }
        })
        .as_ref()
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn fork_spawner() -> std::io::Result<Connection> {
    let (ours, theirs) = UnixStream::pair()?;
    // SAFETY: getpid and fork are plain system calls; the child runs `serve`, which never
    // returns and takes no lock another thread of the parent could have held (see there).
    let rdeploy = unsafe { libc::getpid() };
    match unsafe { libc::fork() } {
        -1 => Err(last_error()),
        0 => {
            drop(ours);
            // SAFETY: in the forked child, which ends in `_exit` and never returns.
            unsafe { serve(theirs, rdeploy) }
        }
        spawner => Ok(Connection { socket: ours, alive: true, spawner }),
    }
}

/// What rdeploy asks the spawner to start.
pub(super) struct Request<'a> {
    pub program: &'a OsStr,
    pub args: &'a [OsString],
    /// Variables set on top of rdeploy's own environment, later ones winning.
    pub env: &'a [(&'a OsString, &'a OsString)],
    pub cwd: Option<&'a Path>,
    pub death_signal: Signal,
    /// Start the tool under the relay that sends `death_signal` once to its group.
    pub relay: bool,
    pub stdout: &'a std::fs::File,
    pub stderr: &'a std::fs::File,
}

/// A child started by the spawner or [`spawn_here`]: rdeploy's own, reaped through its pidfd.
pub(super) struct Spawned {
    pid: u32,
    /// When it started, as `/proc/PID/stat` says (see [`StartTick`]), when known.
    start: Option<u64>,
    pidfd: AsyncFd<OwnedFd>,
    reaped: bool,
}

impl Spawned {
    pub fn id(&self) -> u32 {
        self.pid
    }

    pub fn start(&self) -> Option<u64> {
        self.start
    }

    /// Waits for the child to exit and reaps it (cancel safe: a wait dropped half-way leaves
    /// the child to the next one).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        loop {
            let mut ready = self.pidfd.readable().await?;
            let mut status = 0;
            // SAFETY: waitpid on our own child.
            match unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, libc::WNOHANG) } {
                0 => ready.clear_ready(),
                -1 if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
                -1 => return Err(last_error()),
                _ => {
                    self.reaped = true;
                    return Ok(ExitStatus::from_raw(status));
                }
            }
        }
    }
}

impl Drop for Spawned {
    /// A child not waited for to its end (the run's future dropped: see `Unreaped`) is reaped
    /// when it ends, so it leaves no zombie.
    fn drop(&mut self) {
        if !self.reaped {
            let pid = self.pid as libc::pid_t;
            let _ = std::thread::Builder::new().name("rdeploy-reaper".into()).spawn(move || reap(pid));
        }
    }
}

fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waitpid on our own child; retried when a signal interrupts it.
    while unsafe { libc::waitpid(pid, &mut status, 0) } == -1
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
}

/// The moment a child is started, in the clock ticks after boot that `/proc/PID/stat` gives as a
/// process's start (field 22: `CLOCK_BOOTTIME`, whole ticks of `sysconf(_SC_CLK_TCK)`), read
/// before and after the clone: the same tick both times is the child's start, read without
/// asking `/proc` (which, read while the child execs, also waits for the exec).
struct StartTick(Option<u64>);

impl StartTick {
    fn before() -> StartTick {
        StartTick(boot_ticks())
    }

    /// The child's start, unless a tick went by during the clone.
    fn after(self) -> Option<u64> {
        self.0.filter(|&before| boot_ticks() == Some(before))
    }
}

fn boot_ticks() -> Option<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    // SAFETY: sysconf only reads a value.
    let per_second = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|&hz| hz > 0)?;
    let nanos = u64::try_from(now.tv_sec()).ok()?.checked_mul(1_000_000_000)?.checked_add(now.tv_nsec() as u64)?;
    Some(nanos / (1_000_000_000 / per_second))
}

/// Starts a child through the spawner. `None` when there is no spawner (then nothing was
/// started and the caller forks the child itself).
pub(super) fn spawn(req: &Request<'_>) -> Option<std::io::Result<Spawned>> {
    let conn = connection()?;
    let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
    if !conn.alive {
        return None;
    }
    let message = match encode(req) {
        Ok(message) => message,
        Err(e) => return Some(Err(e)),
    };
    let started = StartTick::before();
    if let Err(e) = send(&conn.socket, &message, [req.stdout.as_raw_fd(), req.stderr.as_raw_fd()]) {
        // The spawner acts on a whole request only: nothing was started.
        tracing::debug!(error = %e, "the spawner is gone: forking children from rdeploy");
        conn.gone();
        return None;
    }
    let mut reply = [0u8; 8];
    if let Err(e) = (&conn.socket).read_exact(&mut reply) {
        // A request sent and no answer: the child may exist, so it is not started again.
        conn.gone();
        return Some(Err(std::io::Error::other(format!("the spawner ended while starting the command: {e}"))));
    }
    let start = started.after();
    let pid = i32::from_ne_bytes(reply[..4].try_into().expect("4 bytes"));
    let errno = i32::from_ne_bytes(reply[4..].try_into().expect("4 bytes"));
    drop(conn);
    if errno != 0 {
        if pid > 0 {
            // The child could not exec and exits at once: ours to reap.
            reap(pid);
        }
        return Some(Err(std::io::Error::from_raw_os_error(errno)));
    }
    Some(adopt(pid, start))
}

thread_local! {
    /// Whether this thread lives as long as rdeploy (see [`lives_as_long_as_rdeploy`]).
    static LONG_LIVED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The stack of the children this thread starts with [`start_sharing_memory`] (the
    /// spawner's, or [`spawn_here`]'s), kept and grown when a request's argv needs more.
    static STACK: std::cell::RefCell<Option<Box<[u8]>>> = const { std::cell::RefCell::new(None) };
    /// How many children [`spawn_here`] started from this thread.
    #[cfg(test)]
    static STARTED_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many children [`spawn_here`] started from the calling thread.
#[cfg(test)]
pub(super) fn started_here() -> usize {
    STARTED_HERE.with(|n| n.get())
}

/// Says that the calling thread lives as long as rdeploy: `main`'s, and the threads of
/// [`runtime`]. A child's death signal fires when the *thread* that started it exits, so only
/// from such a thread may a child be started here, without the spawner (see [`spawn_here`]).
pub fn lives_as_long_as_rdeploy() {
    LONG_LIVED.with(|l| l.set(true));
}

/// The multi-thread runtime rdeploy runs on: every thread of it lives as long as it does (an idle
/// one is kept for `u32::MAX` seconds, 136 years, where tokio's default retires it after 10 s, as
/// it does a worker that ran `block_in_place`), so its threads start their children themselves
/// ([`spawn_here`]).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_keep_alive(std::time::Duration::from_secs(u32::MAX.into()))
        .on_thread_start(lives_as_long_as_rdeploy)
        .build()
}

/// Starts a child from the calling thread, as `posix_spawn` would, when it can: the thread lives
/// as long as rdeploy (see [`lives_as_long_as_rdeploy`]), the tool needs no relay, and its
/// program is a path (nothing to search: the environment is handed to `execve`, `environ` is
/// never touched in a process with other threads). `None` otherwise, and when the kernel does not
/// run the file itself (`ENOEXEC`: `execvp`'s shell fallback is the spawner's) or finds it busy
/// (`ETXTBSY`): then nothing ran and the spawner starts it.
///
/// Measured at shell sub-changes (see `benches/core.sh`): the spawner's round trip (a wake-up of
/// the spawner, and one of rdeploy on its answer) was a sizeable part of rdeploy's cost beyond a
/// plain `posix_spawn`. A clone of rdeploy with `CLONE_VM` copies no page tables, whatever it
/// holds: the spawner is kept for the children this cannot start.
pub(super) fn spawn_here(req: &Request<'_>) -> Option<std::io::Result<Spawned>> {
    if req.relay || !LONG_LIVED.with(|l| l.get()) || !req.program.as_bytes().contains(&b'/') {
        return None;
    }
    let mut exec = match Exec::of(req) {
        Ok(exec) => exec,
        Err(e) => return Some(Err(e)),
    };
    let child = Child {
        req: &exec.decoded,
        argv: &mut exec.argv,
        out: req.stdout.as_raw_fd(),
        err: req.stderr.as_raw_fd(),
        rdeploy: rdeploy_pid(),
        from: Starter::Rdeploy { stdin: dev_null()?, envp: exec.envp.as_ptr() },
    };
    let blocked = AllSignalsBlocked::new();
    let started = StartTick::before();
    // SAFETY: every signal is blocked in this thread; the stack is this thread's; what `child`
    // points to is this frame's and nothing changes it until the child has exec'd.
    let (pid, errno) = STACK.with(|stack| unsafe { start_sharing_memory(child, &mut stack.borrow_mut(), 0) });
    let start = started.after();
    drop(blocked);
    match (pid, errno) {
        (0, errno) => Some(Err(std::io::Error::from_raw_os_error(errno))),
        (pid, 0) => {
            #[cfg(test)]
            STARTED_HERE.with(|n| n.set(n.get() + 1));
            Some(adopt(pid, start))
        }
        (pid, errno) => {
            // The child could not exec and exits at once: ours to reap.
            reap(pid);
            // Nothing ran: the spawner tries it again (a file busy for a moment, held open for
            // writing by another child between its clone or fork and its exec, is likely free
            // by then).
            (errno != libc::ENOEXEC && errno != libc::ETXTBSY).then(|| Err(std::io::Error::from_raw_os_error(errno)))
        }
    }
}

/// What a child [`spawn_here`] starts reads until its exec, all made before the clone:
/// rdeploy's own variables are pointed to where they are kept, the request's are made here.
struct Exec {
    decoded: Decoded,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// The request's variables, which `envp` points into.
    _set: Vec<CString>,
}

impl Exec {
    fn of(req: &Request<'_>) -> std::io::Result<Exec> {
        let text = |s: &[u8]| CString::new(s).map_err(|_| nul_byte());
        let decoded = Decoded {
            death_signal: req.death_signal as i32,
            relay: false,
            cwd: req.cwd.map(|dir| text(dir.as_os_str().as_bytes())).transpose()?,
            program: text(req.program.as_bytes())?,
            args: req.args.iter().map(|arg| text(arg.as_bytes())).collect::<std::io::Result<_>>()?,
            env: Vec::new(),
        };
        let vars = child_env(req);
        let set: Vec<CString> = vars
            .iter()
            .filter_map(|var| match var {
                Var::Own(_) => None,
                Var::Set(var) => Some(text(var)),
            })
            .collect::<std::io::Result<_>>()?;
        let mut made = set.iter();
        let envp = vars
            .iter()
            .map(|var| match var {
                Var::Own(var) => var.as_ptr().cast(),
                Var::Set(_) => made.next().expect("one made for each").as_ptr(),
            })
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        Ok(Exec { argv: decoded.argv(), decoded, envp, _set: set })
    }
}

/// rdeploy's pid, asked once (not once per child).
fn rdeploy_pid() -> libc::pid_t {
    static PID: OnceLock<libc::pid_t> = OnceLock::new();
    // SAFETY: getpid is a plain system call.
    *PID.get_or_init(|| unsafe { libc::getpid() })
}

/// /dev/null, opened once, for the children's stdin (as the spawner's own stdin is).
fn dev_null() -> Option<RawFd> {
    static NULL: OnceLock<Option<OwnedFd>> = OnceLock::new();
    NULL.get_or_init(|| std::fs::OpenOptions::new().read(true).write(true).open("/dev/null").ok().map(OwnedFd::from))
        .as_ref()
        .map(|fd| fd.as_raw_fd())
}

impl Connection {
    fn gone(&mut self) {
        self.alive = false;
        let mut status = 0;
        // SAFETY: reaps the spawner if it already exited (it is our child); never blocks.
        unsafe { libc::waitpid(self.spawner, &mut status, libc::WNOHANG) };
    }
}

/// The pidfd through which rdeploy waits for its new child.
fn adopt(pid: i32, start: Option<u64>) -> std::io::Result<Spawned> {
    // SAFETY: pidfd_open returns a new descriptor we own, or -1. The child is ours and not yet
    // reaped, so the pid cannot name another process.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, libc::PIDFD_NONBLOCK) };
    if fd < 0 {
        let e = last_error();
        // Never left unreaped (a tool rdeploy cannot wait for would run unobserved).
        // SAFETY: our own child.
        unsafe { libc::kill(-pid, libc::SIGKILL) };
        reap(pid);
        return Err(e);
    }
    // SAFETY: a descriptor just returned by pidfd_open, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    // SAFETY: the AsyncFd owns the descriptor and deregisters it before closing it.
    let pidfd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
    match pidfd {
        Ok(pidfd) => Ok(Spawned { pid: pid as u32, start, pidfd, reaped: false }),
        Err(e) => {
            // SAFETY: our own child, in its own group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            reap(pid);
            Err(e.into())
        }
    }
}

/// The request as bytes: the death signal, the relay flag, then NUL-ended strings with counts:
/// the directory (or none), the program, the arguments, the environment (`KEY=VALUE`, the whole
/// of it, sorted as std sorts a changed environment).
fn encode(req: &Request<'_>) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(own_env().bytes + 1024);
    out.extend_from_slice(&(req.death_signal as i32).to_ne_bytes());
    out.push(req.relay as u8);
    let string = |out: &mut Vec<u8>, bytes: &[u8]| -> std::io::Result<()> {
        if bytes.contains(&0) {
            return Err(nul_byte());
        }
        out.extend_from_slice(bytes);
        out.push(0);
        Ok(())
    };
    match req.cwd {
        Some(dir) => {
            out.push(1);
            string(&mut out, dir.as_os_str().as_bytes())?;
        }
        None => out.push(0),
    }
    string(&mut out, req.program.as_bytes())?;
    out.extend_from_slice(&(req.args.len() as u32).to_ne_bytes());
    for arg in req.args {
        string(&mut out, arg.as_bytes())?;
    }
    // The count goes before the variables: written once they are.
    let count_at = out.len();
    out.extend_from_slice(&0u32.to_ne_bytes());
    let mut count = 0u32;
    for var in child_env(req) {
        match var {
            Var::Own(var) => out.extend_from_slice(var),
            Var::Set(var) => string(&mut out, &var)?,
        }
        count += 1;
    }
    out[count_at..count_at + 4].copy_from_slice(&count.to_ne_bytes());
    Ok(out)
}

/// A request's string that holds a NUL byte, which no C string can (std's words).
fn nul_byte() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "nul byte found in provided data")
}

/// One variable of a child's environment, `NAME=VALUE`.
enum Var {
    /// One of rdeploy's own, NUL-ended.
    Own(&'static [u8]),
    /// The request's, without its NUL.
    Set(Vec<u8>),
}

/// The child's environment: the request's own variables, later ones winning, merged into
/// rdeploy's (sorted once), in order.
fn child_env(req: &Request<'_>) -> Vec<Var> {
    let overrides: BTreeMap<&OsStr, &OsStr> = req.env.iter().map(|(k, v)| (k.as_os_str(), v.as_os_str())).collect();
    let own = own_env();
    let mut vars = Vec::with_capacity(own.vars.len() + overrides.len());
    let mut mine = own.vars.iter().peekable();
    for (k, v) in &overrides {
        while let Some((_, var)) = mine.next_if(|(key, _)| key.as_os_str() < *k) {
            vars.push(Var::Own(var));
        }
        // Replaced by the request's value.
        mine.next_if(|(key, _)| key.as_os_str() == *k);
        let mut var = k.as_bytes().to_vec();
        var.push(b'=');
        var.extend_from_slice(v.as_bytes());
        vars.push(Var::Set(var));
    }
    vars.extend(mine.map(|(_, var)| Var::Own(var)));
    vars
}

/// rdeploy's own environment, read once: nothing in rdeploy changes it after it starts (it
/// never calls `set_var`), and reading, sorting and copying it for every child was a cost of each.
struct OwnEnv {
    /// Sorted by name (the last of a repeated name): the name, and `NAME=VALUE` NUL-ended as
    /// a request carries it.
    vars: Vec<(OsString, Vec<u8>)>,
    /// All of them together.
    bytes: usize,
}

fn own_env() -> &'static OwnEnv {
    static ENV: OnceLock<OwnEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        let sorted: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
        let vars: Vec<(OsString, Vec<u8>)> = sorted
            .into_iter()
            .map(|(k, v)| {
                let mut var = k.as_bytes().to_vec();
                var.push(b'=');
                var.extend_from_slice(v.as_bytes());
                var.push(0);
                (k, var)
            })
            .collect();
        let bytes = vars.iter().map(|(_, v)| v.len()).sum();
        OwnEnv { vars, bytes }
    })
}

/// A request read back in the spawner.
struct Decoded {
    death_signal: i32,
    relay: bool,
    cwd: Option<CString>,
    program: CString,
    args: Vec<CString>,
    env: Vec<CString>,
}

impl Decoded {
    /// The program and its arguments as `exec` takes them, null-ended.
    fn argv(&self) -> Vec<*const libc::c_char> {
        std::iter::once(self.program.as_ptr())
            .chain(self.args.iter().map(|a| a.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    }

    /// The environment as `exec` takes it, null-ended.
    fn envp(&self) -> Vec<*const libc::c_char> {
        self.env.iter().map(|v| v.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
    }
}

fn decode(bytes: &[u8]) -> Option<Decoded> {
    let death_signal = i32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    let relay = *bytes.get(4)? != 0;
    let has_cwd = *bytes.get(5)? != 0;
    let mut rest = &bytes[6..];
    let cwd = if has_cwd { Some(cstring(&mut rest)?) } else { None };
    let program = cstring(&mut rest)?;
    let n = count(&mut rest)?;
    let args = (0..n).map(|_| cstring(&mut rest)).collect::<Option<Vec<_>>>()?;
    let n = count(&mut rest)?;
    let env = (0..n).map(|_| cstring(&mut rest)).collect::<Option<Vec<_>>>()?;
    Some(Decoded { death_signal, relay, cwd, program, args, env })
}

fn count(rest: &mut &[u8]) -> Option<usize> {
    let n = u32::from_ne_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    *rest = &rest[4..];
    Some(n)
}

fn cstring(rest: &mut &[u8]) -> Option<CString> {
    let end = rest.iter().position(|&b| b == 0)?;
    let s = CString::new(&rest[..end]).ok()?;
    *rest = &rest[end + 1..];
    Some(s)
}

/// One request: its length with the two output descriptors, and its bytes, in one message (the
/// spawner reads the length and the descriptors, then the bytes); what a full socket buffer
/// left unsent follows.
fn send(socket: &UnixStream, message: &[u8], fds: [RawFd; 2]) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let len = (message.len() as u32).to_ne_bytes();
    let iov = [std::io::IoSlice::new(&len), std::io::IoSlice::new(message)];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    // A signal before anything went is no reason to give the spawner up: sent again.
    let sent = loop {
        match sendmsg::<()>(socket.as_raw_fd(), &iov, &cmsg, MsgFlags::MSG_NOSIGNAL, None) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other?,
        }
    };
    if sent < len.len() {
        return Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "short write to the spawner"));
    }
    let mut socket = socket;
    socket.write_all(&message[sent - len.len()..])
}

/// The spawner's loop, in the process forked from rdeploy: reads a request, starts the child,
/// answers its pid and errno (0: it runs the program), until rdeploy closes the socket or dies.
///
/// It may have been forked from a multi-threaded process (a test binary), so it takes no lock
/// such a process's other threads could have held at the fork: no std environment, stdio or
/// tracing, only system calls and the allocator (which glibc's fork leaves usable).
///
/// # Safety
/// Only in the child of `fork_spawner`'s fork: it ends the process.
unsafe fn serve(socket: UnixStream, rdeploy: libc::pid_t) -> ! {
    // SAFETY: system calls on our own process and descriptors.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
        if libc::getppid() != rdeploy {
            libc::_exit(0);
        }
        libc::prctl(libc::PR_SET_NAME, c"rdeploy-spawner".as_ptr() as libc::c_ulong);
        // The terminal's signals reach rdeploy's whole group: rdeploy decides what they mean.
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGQUIT, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // The spawner's dispositions are final now (nothing in it sets one again): the
        // handlers it inherited are read once here, not asked of all 64 signals in each child.
        HANDLED.get_or_init(|| (1..=libc::SIGRTMAX()).filter(|&sig| has_handler(sig)).collect());
        // Nothing of rdeploy's input or output: a test reading rdeploy's stdout to its end must
        // not wait for the spawner. The children get /dev/null as stdin from here.
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..3 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
        // No descriptor of rdeploy's is the spawner's business, nor its children's (a tool gets
        // its stdin, its two output files and nothing else, as from rdeploy's threads): held
        // here one would keep a pipe of another thread's child open.
        let keep = socket.as_raw_fd();
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            let fds: Vec<RawFd> =
                dir.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).filter(|&fd| fd > 2).collect();
            for fd in fds {
                if fd != keep {
                    libc::close(fd);
                }
            }
        }
        let mut socket = socket;
        loop {
            let Some((len, fds)) = receive(&socket) else { libc::_exit(0) };
            let mut message = vec![0u8; len];
            if socket.read_exact(&mut message).is_err() {
                libc::_exit(0);
            }
            let (pid, errno) = match (decode(&message), fds) {
                (Some(req), Some([out, err])) => {
                    let started = start_child(&req, out.as_raw_fd(), err.as_raw_fd(), rdeploy);
                    drop((out, err));
                    started
                }
                _ => (0, libc::EINVAL),
            };
            let mut reply = [0u8; 8];
            reply[..4].copy_from_slice(&pid.to_ne_bytes());
            reply[4..].copy_from_slice(&errno.to_ne_bytes());
            if socket.write_all(&reply).is_err() {
                libc::_exit(0);
            }
        }
    }
}

/// A request's length and its two descriptors; `None` when rdeploy closed the socket.
fn receive(socket: &UnixStream) -> Option<(usize, Option<[OwnedFd; 2]>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut len = [0u8; 4];
    let mut space = nix::cmsg_space!([RawFd; 2]);
    let (got, fds) = loop {
        let mut iov = [std::io::IoSliceMut::new(&mut len)];
        match recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC) {
            Ok(msg) => {
                let mut fds: Vec<OwnedFd> = Vec::new();
                for cmsg in msg.cmsgs().ok()? {
                    if let ControlMessageOwned::ScmRights(received) = cmsg {
                        // SAFETY: descriptors the kernel just installed for us.
                        fds.extend(received.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
                    }
                }
                break (msg.bytes, fds);
            }
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return None,
        }
    };
    if got == 0 {
        return None;
    }
    if got < len.len() {
        let mut socket = socket;
        socket.read_exact(&mut len[got..]).ok()?;
    }
    let fds = <[OwnedFd; 2]>::try_from(fds).ok();
    Some((u32::from_ne_bytes(len) as usize, fds))
}

/// Starts one child as rdeploy's (`CLONE_PARENT`) and waits until it has exec'd: `(pid, 0)`, or
/// `(pid, errno)` when it could not (it then exits 127 and rdeploy reaps it), `(0, errno)` when
/// no process could be made.
///
/// # Safety
/// Only in the spawner, which is single-threaded.
unsafe fn start_child(req: &Decoded, out: RawFd, err: RawFd, rdeploy: libc::pid_t) -> (i32, i32) {
    let mut argv = req.argv();
    let envp = req.envp();
    extern "C" {
        static mut environ: *const *const libc::c_char;
    }
    // `execvp` in the child searches the PATH of `environ` (`execvpe` too: its `envp` is only
    // what the program gets), so the child's environment is the spawner's own for the length of
    // the clone: the spawner is single-threaded and reads no variable of its own.
    // SAFETY: single-threaded; restored before `envp` is dropped.
    let saved = unsafe { environ };
    unsafe { environ = envp.as_ptr() };
    let blocked = AllSignalsBlocked::new();
    // SAFETY: as this function's; every signal is blocked.
    let started = unsafe {
        if req.relay {
            start_copy(req, &mut argv, out, err, rdeploy)
        } else {
            let child = Child { req, argv: &mut argv, out, err, rdeploy, from: Starter::spawner() };
            STACK.with(|stack| start_sharing_memory(child, &mut stack.borrow_mut(), libc::CLONE_PARENT))
        }
    };
    drop(blocked);
    // SAFETY: `environ` as it was (single-threaded, as above).
    unsafe { environ = saved };
    started
}

/// Every signal blocked in the calling thread while it lives, as `posix_spawn` blocks them
/// across its clone: no handler may run in a child that shares the caller's memory before it
/// reset the handlers ([`exec_child`]). The mask before is restored when it is dropped.
struct AllSignalsBlocked(libc::sigset_t);

impl AllSignalsBlocked {
    fn new() -> AllSignalsBlocked {
        // SAFETY: a sigset_t is plain data for which all zeroes is a valid (empty) value;
        // sigfillset and pthread_sigmask work on sets of our own.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut before: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
            AllSignalsBlocked(before)
        }
    }
}

impl Drop for AllSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// [`start_child`] for a tool with a relay, which forks a process of its own in the child: the
/// child is a full copy of the spawner, reporting a failure before its exec through a pipe.
///
/// # Safety
/// Only in the spawner, which is single-threaded.
unsafe fn start_copy(
    req: &Decoded,
    argv: &mut [*const libc::c_char],
    out: RawFd,
    err: RawFd,
    rdeploy: libc::pid_t,
) -> (i32, i32) {
    // SAFETY: system calls in the single-threaded spawner; the child only makes
    // async-signal-safe calls on memory prepared above, then execs or `_exit`s.
    unsafe {
        let mut pipe = [0; 2];
        if libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return (0, errno());
        }
        let pid = libc::syscall(libc::SYS_clone, libc::CLONE_PARENT | libc::SIGCHLD, 0, 0, 0, 0);
        if pid == 0 {
            libc::close(pipe[0]);
            let code = exec_child(&Child { req, argv, out, err, rdeploy, from: Starter::spawner() });
            let bytes = code.to_ne_bytes();
            libc::write(pipe[1], bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127);
        }
        libc::close(pipe[1]);
        if pid < 0 {
            libc::close(pipe[0]);
            return (0, errno());
        }
        let mut bytes = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            let n = libc::read(pipe[0], bytes[got..].as_mut_ptr().cast(), 4 - got);
            if n == -1 && errno() == libc::EINTR {
                continue;
            }
            if n <= 0 {
                break;
            }
            got += n as usize;
        }
        libc::close(pipe[0]);
        if got == 4 {
            (pid as i32, i32::from_ne_bytes(bytes))
        } else {
            (pid as i32, 0)
        }
    }
}

/// What a new child works on until its exec: memory of the process that cloned it (the
/// spawner's, or rdeploy's for [`spawn_here`]), prepared before the clone.
struct Child<'a> {
    req: &'a Decoded,
    argv: &'a mut [*const libc::c_char],
    out: RawFd,
    err: RawFd,
    rdeploy: libc::pid_t,
    from: Starter<'a>,
}

impl Starter<'static> {
    /// The spawner, with the handlers it read when it started.
    fn spawner() -> Starter<'static> {
        Starter::Spawner { handled: HANDLED.get().map(Vec::as_slice) }
    }
}

/// Who starts a child, and so what its exec must set up.
enum Starter<'a> {
    /// The spawner: the handlers to reset are the ones it read when it started (`None`: all are
    /// asked), its stdin is /dev/null, it holds no other descriptor than the request's, and
    /// `environ` is the child's for the clone (see [`start_child`]).
    Spawner { handled: Option<&'a [libc::c_int]> },
    /// One of rdeploy's threads ([`spawn_here`]): every handler is asked (rdeploy may have set
    /// one since it started), stdin is `stdin`, rdeploy's descriptors are closed, and the
    /// environment is `envp`.
    Rdeploy { stdin: RawFd, envp: *const *const libc::c_char },
}

/// The least stack of a child between its clone and its exec (see [`STACK`]); an exec of a
/// script without `#!` rebuilds argv on it, hence room per argument on top.
const CHILD_STACK_SIZE: usize = 256 * 1024;

/// Starts `child` as `posix_spawn` starts one: `clone(CLONE_VM | CLONE_VFORK)`, the child
/// running on the caller's memory (no page tables copied, nothing torn down at its exec) until
/// it execs, the calling thread stopped meanwhile, every signal blocked across the clone (no
/// handler may run in a child that shares the caller's memory before it reset them, see
/// [`exec_child`]). The child is the calling process's, or with `parent` `CLONE_PARENT` its
/// parent's (the spawner's children are rdeploy's). A failure before the exec is reported in that
/// memory, so no pipe is needed either. Returns `(pid, 0)`, `(pid, errno)` when the child could
/// not exec (it then exits 127, to be reaped), `(0, errno)` when no process could be made.
///
/// # Safety
/// `stack` is this thread's alone, and every signal is blocked in the calling thread.
/// `CLONE_VFORK` stops only the calling thread: the child reads only what `child` points to,
/// which nothing else changes until it has exec'd, and makes async-signal-safe calls only.
unsafe fn start_sharing_memory(child: Child<'_>, stack: &mut Option<Box<[u8]>>, parent: libc::c_int) -> (i32, i32) {
    struct Shared<'a> {
        child: Child<'a>,
        /// Written by the child when it cannot exec.
        errno: i32,
    }
    extern "C" fn run(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the `Shared` of the stopped caller, alive until this child execs or
        // exits; only async-signal-safe calls follow.
        unsafe {
            let shared = &mut *(arg as *mut Shared<'_>);
            let code = exec_child(&shared.child);
            std::ptr::write_volatile(&mut shared.errno, code);
            libc::_exit(127)
        }
    }
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD | parent;
    // Room for an argv rebuilt on the stack (a script without `#!`), however many arguments.
    let size = CHILD_STACK_SIZE + child.argv.len() * 2 * std::mem::size_of::<*const libc::c_char>();
    let mut shared = Shared { child, errno: 0 };
    if stack.as_ref().is_none_or(|s| s.len() < size) {
        *stack = Some(vec![0; size].into());
    }
    let stack = stack.as_mut().expect("made above");
    // SAFETY: as this function's; the stack grows down from its end, kept 16-byte aligned.
    unsafe {
        let top = (stack.as_mut_ptr().add(stack.len()) as usize & !15) as *mut libc::c_void;
        let pid = libc::clone(run, top, flags, (&mut shared as *mut Shared<'_>).cast());
        if pid < 0 {
            return (0, errno());
        }
        (pid, std::ptr::read_volatile(&shared.errno))
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
}

/// In the new child: everything std's fork path did before exec, then the exec. Returns the
/// errno of what failed.
///
/// # Safety
/// Only in a child [`start_child`] or [`spawn_here`] made.
unsafe fn exec_child(child: &Child<'_>) -> i32 {
    let Child { req, ref argv, out, err, rdeploy, ref from } = *child;
    // SAFETY: async-signal-safe calls in the child, on memory the caller prepared.
    unsafe {
        // Its output files, and its stdin (the spawner's own is /dev/null already).
        if let Starter::Rdeploy { stdin, .. } = from {
            if libc::dup2(*stdin, 0) < 0 {
                return errno();
            }
        }
        if libc::dup2(out, 1) < 0 || libc::dup2(err, 2) < 0 {
            return errno();
        }
        // No descriptor of rdeploy's, not even one opened without CLOEXEC (as from the spawner,
        // which holds none), closed first thing: one held here keeps a pipe open, and a file
        // written through one busy (`ETXTBSY`) for another thread's exec. Where `close_range`
        // is missing (Linux before 5.9) those without CLOEXEC stay.
        if let Starter::Rdeploy { .. } = from {
            libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, 0 as libc::c_uint);
        }
        // Started as std starts a child: no signal blocked, none ignored (the spawner ignores
        // the terminal's), and no handler of the cloning process (a test binary's, rdeploy's)
        // left to run before the exec; signals stay blocked (see `start_child`) until then.
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGQUIT, libc::SIGHUP, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_DFL);
        }
        match from {
            Starter::Spawner { handled: Some(handled) } => {
                for &sig in handled.iter() {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
            Starter::Spawner { handled: None } | Starter::Rdeploy { .. } => {
                for sig in (1..=libc::SIGRTMAX()).filter(|&sig| has_handler(sig)) {
                    libc::signal(sig, libc::SIG_DFL);
                }
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        if let Some(dir) = &req.cwd {
            if libc::chdir(dir.as_ptr()) != 0 {
                return errno();
            }
        }
        if libc::setpgid(0, 0) != 0 {
            return errno();
        }
        let signal = Signal::try_from(req.death_signal).unwrap_or(Signal::SIGTERM);
        if req.relay {
            if let Err(e) = relay_one_death_signal(nix::unistd::Pid::from_raw(rdeploy), signal) {
                return e.raw_os_error().unwrap_or(libc::EIO);
            }
        } else {
            if libc::prctl(libc::PR_SET_PDEATHSIG, req.death_signal as libc::c_ulong) != 0 {
                return errno();
            }
            // rdeploy may have died before the signal was set; then none would come.
            if libc::getppid() != rdeploy {
                return libc::ESRCH;
            }
        }
        match from {
            // The program's path holds a slash: nothing to search (see [`spawn_here`]).
            Starter::Rdeploy { envp, .. } => libc::execve(req.program.as_ptr(), argv.as_ptr(), *envp),
            // `environ` is the child's environment already (see `start_child`).
            Starter::Spawner { .. } => libc::execvp(req.program.as_ptr(), argv.as_ptr()),
        };
        errno()
    }
}

/// The signals the spawner has a handler for (inherited from rdeploy: std's, a test binary's),
/// read once when it starts serving; each child sets them back to the default before its exec.
static HANDLED: OnceLock<Vec<libc::c_int>> = OnceLock::new();

/// Whether `sig` runs a handler here (neither the default nor ignored).
fn has_handler(sig: libc::c_int) -> bool {
    // SAFETY: sigaction only reads the disposition into a zeroed struct of our own.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction != libc::SIG_DFL
            && old.sa_sigaction != libc::SIG_IGN
    }
}

/// The fork path, when there is no spawner: in the child forked from rdeploy, before its exec,
/// the tool's death signal (or the relay that sends it once to the group) set as the spawner
/// sets it.
pub(super) fn die_with_rdeploy(
    cmd: &mut tokio::process::Command,
    parent: nix::unistd::Pid,
    signal: Signal,
    relay: bool,
) {
    // SAFETY: only async-signal-safe calls (prctl, getppid, fork, sigprocmask, waitpid,
    // sigwaitinfo, close_range, kill, _exit), touching no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            // No descriptor of rdeploy's reaches the tool, as from the spawner or rdeploy's
            // threads (marked to close at the exec: std's own pipe reports a failed exec).
            // Where `close_range` cannot (Linux before 5.11) those without CLOEXEC stay.
            libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC);
            if relay {
                return relay_one_death_signal(parent, signal);
            }
            nix::sys::prctl::set_pdeathsig(signal).map_err(std::io::Error::from)?;
            // The parent may have died between fork and prctl; then no signal would come.
            // (No allocation after fork: ESRCH, "no such process", is the parent gone.)
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(nix::libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// In the forked child: makes sure the tool's group gets `signal` once when rdeploy dies, as a
/// terminal's Ctrl-C would send it.
///
/// The kernel sends a pdeathsig each time the child's parent *thread* exits and the child passes
/// to another thread of the same process: a kill -9 of multi-threaded rdeploy gave terraform two
/// SIGINTs, the second of which means "exit immediately, data loss may occur". And a pdeathsig
/// reaches only the direct child, while terraform's provisioners run on in its group. So the
/// tool is started one level down: this process forks again and stays as a single-threaded
/// relay. Its own pdeathsig (SIGUSR1, however often it comes) makes it send `signal` to the
/// whole group once; it blocks the terminal signals (so cancellation and timeouts, sent to the
/// group, reach only the tool), holds no file open, and exits with the tool's status.
///
/// # Safety
/// Only in a child forked from rdeploy (a `pre_exec` closure): it forks and may `_exit`.
pub(super) unsafe fn relay_one_death_signal(rdeploy: nix::unistd::Pid, signal: Signal) -> std::io::Result<()> {
    // SAFETY: the caller is a child forked from rdeploy, before exec; every call below is
    // async-signal-safe.
    unsafe {
        let mut blocked: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut blocked);
        for sig in [libc::SIGCHLD, libc::SIGUSR1, libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
            libc::sigaddset(&mut blocked, sig);
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGUSR1 as libc::c_ulong) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The parent may have died between fork and prctl; then no signal would come.
        if libc::getppid() != rdeploy.as_raw() {
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        libc::sigprocmask(libc::SIG_BLOCK, &blocked, std::ptr::null_mut());
        match libc::fork() {
            -1 => Err(std::io::Error::last_os_error()),
            0 => {
                // The tool starts with no signal blocked, as std would start it.
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                Ok(())
            }
            tool => {
                // Above all not the pipe through which the spawn learns whether exec worked.
                if libc::syscall(libc::SYS_close_range, 0u32, u32::MAX, 0u32) != 0 {
                    for fd in 0..4096 {
                        libc::close(fd);
                    }
                }
                let mut waited: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut waited);
                libc::sigaddset(&mut waited, libc::SIGCHLD);
                libc::sigaddset(&mut waited, libc::SIGUSR1);
                let mut sent = false;
                let mut status = 0;
                loop {
                    if libc::waitpid(tool, &mut status, libc::WNOHANG) == tool {
                        break;
                    }
                    let got = libc::sigwaitinfo(&waited, std::ptr::null_mut());
                    // The death signal also comes when the rdeploy *thread* that forked us exits
                    // (tokio retires blocking threads); we are then handed to another of its
                    // threads and our parent is still rdeploy. Only a real death reparents us.
                    if got == libc::SIGUSR1 && !sent && libc::getppid() != rdeploy.as_raw() {
                        sent = true;
                        libc::kill(0, signal as libc::c_int);
                    }
                }
                if libc::WIFSIGNALED(status) {
                    let sig = libc::WTERMSIG(status);
                    libc::signal(sig, libc::SIG_DFL);
                    let mut only: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut only);
                    libc::sigaddset(&mut only, sig);
                    libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
                    libc::kill(libc::getpid(), sig);
                    libc::_exit(128 + sig);
                }
                libc::_exit(libc::WEXITSTATUS(status));
            }
        }
    }
}
