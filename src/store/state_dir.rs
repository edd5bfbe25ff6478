//! The state directory (`.rdeploy/` beside the stack): the scratch space every store uses on
//! the machine that runs the tools (the tools' logs, adapters' work dirs, the last report), and
//! the home of the local store's files (see [`local`](super::local)).
//!
//! rdeploy often runs as root in CI, in directories other users may write to. So the directory
//! must belong to the user running rdeploy and must not be writable by others; everything in it
//! is created 0700 (directories) / 0600 (files) whatever the umask, and files are opened
//! without following symbolic links ([`StateDir::create_file`], [`StateDir::write_atomic`]).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::exit::{Code, Refusal};

/// Mode of every directory rdeploy creates in the state directory.
pub use rdeploy_adapters::private::DIR_MODE;

/// A stack's state directory.
#[derive(Clone, Debug)]
pub struct StateDir {
    pub path: PathBuf,
    /// The directory the stacks beside one another share (`.rdeploy/`, which holds
    /// `.rdeploy/<stack>/` for each): the fleet's records live there. The same as `path` for a
    /// directory given with `--state-dir`.
    pub shared: PathBuf,
}

impl StateDir {
    /// A state directory of its own (`--state-dir DIR`, a test's directory).
    pub fn new(path: impl Into<PathBuf>) -> StateDir {
        let path = path.into();
        StateDir { shared: path.clone(), path }
    }

    /// The default state directory of stack `name`: `ROOT/<name>/`, where ROOT (`.rdeploy/`
    /// beside the stack file) is shared by every stack file of that directory.
    pub fn keyed(root: impl Into<PathBuf>, name: &str) -> StateDir {
        let shared = root.into();
        StateDir { path: shared.join(name), shared }
    }

    pub fn journal_path(&self) -> PathBuf {
        self.path.join("journal.jsonl")
    }

    pub fn snapshot_path(&self) -> PathBuf {
        self.path.join("snapshot.json")
    }

    pub fn report_path(&self) -> PathBuf {
        self.path.join("report.md")
    }

    pub fn step_dir(&self, step: &str) -> PathBuf {
        self.path.join("steps").join(step)
    }

    /// What adapters keep between deploys, each answer under a digest of its inputs (see
    /// `StepContext::cache_dir`); unlike `steps/`, a finished deploy does not remove it.
    pub fn cache_dir(&self) -> PathBuf {
        self.path.join("cache")
    }

    pub fn log_path(&self, step: &str) -> PathBuf {
        self.path.join("logs").join(format!("{step}.log"))
    }

    pub fn history_dir(&self) -> PathBuf {
        self.path.join("history")
    }

    pub fn lock_path(&self) -> PathBuf {
        self.path.join("lock")
    }

    /// Creates the state directory (0700) if needed and checks it is safe to write in: a
    /// directory (not a file), owned by this user, not writable by others. Nothing has run
    /// when this fails, so the error is exit 2 and says so.
    pub fn ensure(&self) -> anyhow::Result<()> {
        // The shared `.rdeploy/` first: nothing is made inside a directory another user owns.
        if self.shared != self.path {
            if let Err(e) = create_dirs(&self.shared) {
                return Err(self.unwritable(&self.shared, &e));
            }
            self.check_owner(&self.shared)?;
        }
        if let Err(e) = create_dirs(&self.path) {
            return Err(self.unwritable(&self.path, &e));
        }
        self.check_owner(&self.path)?;
        // A directory an older rdeploy made under umask 022: tighten it, logs and plans inside.
        let mode = fs_err::metadata(&self.path)?.permissions().mode();
        if mode & 0o077 != 0 {
            fs_err::set_permissions(&self.path, std::fs::Permissions::from_mode(DIR_MODE))?;
        }
        Ok(())
    }

    /// Refuses a path in the state directory that another user owns or others may write.
    pub fn check_owner(&self, path: &Path) -> anyhow::Result<()> {
        let meta = fs_err::metadata(path)?;
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me {
            return Err(Refusal::new(
                Code::BadInput,
                format!(
                    "{} belongs to uid {}, not to the user running rdeploy (uid {me}); refusing to use it: another user could plant files there",
                    path.display(),
                    meta.uid()
                ),
            )
            .with_hint(format!(
                "check who made it; if it is yours, `chown -R {me} {}`, or pass another `--state-dir`",
                path.display()
            ))
            .into());
        }
        if meta.permissions().mode() & 0o002 != 0 {
            return Err(Refusal::new(
                Code::BadInput,
                format!(
                    "{} is writable by every user (mode {:o}); refusing to use it: another user could plant files there",
                    path.display(),
                    meta.permissions().mode() & 0o7777
                ),
            )
            .with_hint(format!("`chmod 700 {}`, or pass another `--state-dir`", path.display()))
            .into());
        }
        Ok(())
    }

    /// The error for a state directory that cannot be written before anything ran: exit 2
    /// ("nothing changed"), naming what could not be written.
    pub fn unwritable(&self, what: &Path, e: &dyn std::fmt::Display) -> anyhow::Error {
        Refusal::new(
            Code::BadInput,
            format!("could not write {} ({e}); nothing ran, no checkpoint was started", what.display()),
        )
        .with_hint(format!(
            "make the state directory {} writable (free space, a writable mount) or pass another `--state-dir`, then run this again",
            self.path.display()
        ))
        .into()
    }

    /// Creates a directory (and its parents) under the state directory, 0700.
    pub fn create_dir(&self, path: &Path) -> anyhow::Result<()> {
        create_dirs(path).with_context(|| format!("creating {}", path.display()))
    }

    /// Opens a file in the state directory for appending, creating it 0600 (its directory
    /// 0700), never following a symbolic link planted at its name. Every file rdeploy writes
    /// in the state directory goes through here or [`StateDir::write_atomic`]: tools' logs, the
    /// `running/` notes, saved plans.
    pub fn create_file(&self, path: &Path) -> anyhow::Result<File> {
        if let Some(dir) = path.parent() {
            self.create_dir(dir)?;
        }
        open_private(path, OpenOptions::new().create(true).append(true))
    }

    /// Writes a file so that readers see the old or the new content, never a mix: a 0600
    /// temporary file with a random name in the same directory, synced, then renamed.
    pub fn write_atomic(&self, path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
        write_atomic(path, bytes)
    }
}

/// Creates `path` and its missing parents with mode 0700.
fn create_dirs(path: &Path) -> std::io::Result<()> {
    rdeploy_adapters::private::create_dir_all(path)?;
    if !path.is_dir() {
        return Err(std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it exists and is not a directory"));
    }
    Ok(())
}

/// Opens with `O_NOFOLLOW` (a planted symlink is an error, never followed), mode 0600.
pub fn open_private(path: &Path, options: &mut OpenOptions) -> anyhow::Result<File> {
    rdeploy_adapters::private::open(path, options).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            anyhow::Error::from(
                Refusal::new(
                    Code::BadInput,
                    format!(
                        "{} is a symbolic link; rdeploy never follows links in its state directory",
                        path.display()
                    ),
                )
                .with_hint(format!("remove it (`rm {}`) and check who planted it", path.display())),
            )
        } else {
            anyhow::Error::new(e).context(format!("opening {}", path.display()))
        }
    })
}

/// Writes a file so that readers see the old or the new content, never a mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    // tempfile creates the file O_EXCL with a random name, 0600: nothing planted can be followed.
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{}.", path.file_name().unwrap_or_default().to_string_lossy()))
        .suffix(".tmp")
        .tempfile_in(dir)
        .with_context(|| format!("creating a temporary file for {}", path.display()))?;
    tmp.write_all(bytes).with_context(|| format!("writing {}", path.display()))?;
    tmp.as_file().sync_all().with_context(|| format!("syncing {}", path.display()))?;
    tmp.persist(path).map_err(|e| anyhow::Error::new(e.error).context(format!("renaming onto {}", path.display())))?;
    sync_dir(dir)
}

pub fn sync_dir(dir: &Path) -> anyhow::Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing directory {}", dir.display()))
}
