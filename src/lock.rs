//! The state directory's lock: one run at a time. An `flock` on `lock` is the truth (the
//! kernel drops it when its holder dies, even on kill -9); the file's content names the holder
//! so a second run can say who, and a lock left by a dead holder is reported when taken over.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use anyhow::Context as _;
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

/// Who holds (or held) the lock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Holder {
    pub pid: u32,
    pub host: String,
    pub started: String,
    pub command: String,
    /// A shared store's lock is a lease the holder keeps renewing: when it runs out, in RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires: Option<String>,
    /// Seconds since the holder last renewed its lease (its heartbeat); large means stuck or gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_age: Option<f64>,
    /// Seconds left before the lease runs out and another run may take over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_in: Option<f64>,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`rdeploy {}` (pid {} on {}, since {}", self.command, self.pid, self.host, self.started)?;
        match (self.lease_age, self.lease_expires_in) {
            (Some(age), Some(left)) if left >= 0.0 => {
                write!(f, "; lease renewed {age:.1}s ago, expires in {left:.1}s")?
            }
            (Some(age), Some(left)) => write!(f, "; lease renewed {age:.1}s ago, expired {:.1}s ago", -left)?,
            _ => {}
        }
        write!(f, ")")
    }
}

impl Holder {
    /// Whether this holder is a live process on this host.
    pub fn is_alive_here(&self) -> bool {
        self.host == hostname() && nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid as i32), None).is_ok()
    }
}

pub fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("another run holds the lock on {dir}: {holder}")]
    Held { dir: String, holder: String },
    #[error(transparent)]
    Io(#[from] anyhow::Error),
}

/// The held lock; released on drop.
pub struct Lock {
    file: Flock<File>,
    /// A holder that died without releasing (crash, kill -9), if we took over from one.
    pub took_over_from: Option<Holder>,
}

impl Lock {
    /// Takes the lock or says who has it. Never waits.
    pub fn acquire(dir: &Path, command: &str) -> Result<Lock, LockError> {
        fs_err::create_dir_all(dir).map_err(anyhow::Error::from)?;
        let path = dir.join("lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let mut file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err((_, errno)) if errno != nix::errno::Errno::EWOULDBLOCK => {
                return Err(LockError::Io(anyhow::anyhow!("locking {}: {errno}", path.display())));
            }
            Err((mut file, _)) => {
                let holder = read_holder(&mut file)
                    .map(|h| h.to_string())
                    .unwrap_or_else(|| "a process that has not written its name yet".into());
                return Err(LockError::Held { dir: dir.display().to_string(), holder });
            }
        };
        // We hold the flock: any name still in the file belongs to a run that died holding it.
        let took_over_from = read_holder(&mut file);
        let me = Holder {
            pid: std::process::id(),
            host: hostname(),
            started: crate::checkpoint::now().to_string(),
            command: command.to_string(),
            lease_expires: None,
            lease_age: None,
            lease_expires_in: None,
        };
        write_holder(&mut file, Some(&me)).context("writing the lock holder")?;
        Ok(Lock { file, took_over_from })
    }

    /// Who holds the lock now, without taking it (for `status`).
    pub fn current_holder(dir: &Path) -> Option<Holder> {
        // Read-only: taking even a shared flock here could make a concurrent `up` see the
        // lock as held. A name in the file is a holder unless it is a dead process on this host.
        let mut file = OpenOptions::new().read(true).open(dir.join("lock")).ok()?;
        let holder = read_holder(&mut file)?;
        let dead_here = holder.host == hostname() && !holder.is_alive_here();
        (!dead_here).then_some(holder)
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Clear our name first so the next run does not mistake a clean exit for a crash.
        let _ = write_holder(&mut self.file, None);
    }
}

fn read_holder(file: &mut File) -> Option<Holder> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}

fn write_holder(file: &mut File, holder: Option<&Holder>) -> std::io::Result<()> {
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    if let Some(holder) = holder {
        file.write_all(serde_json::to_string(holder).unwrap_or_default().as_bytes())?;
    }
    file.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_and_told_who() {
        let tmp = tempfile::tempdir().unwrap();
        let first = Lock::acquire(tmp.path(), "up").unwrap();
        assert!(first.took_over_from.is_none());
        match Lock::acquire(tmp.path(), "recover") {
            Err(LockError::Held { holder, .. }) => {
                assert!(holder.contains(&format!("pid {}", std::process::id())), "{holder}")
            }
            _ => panic!("second lock must be refused"),
        }
        assert_eq!(Lock::current_holder(tmp.path()).unwrap().command, "up");
        drop(first);
        let again = Lock::acquire(tmp.path(), "up").unwrap();
        assert!(again.took_over_from.is_none(), "a clean release leaves no holder behind");
    }

    #[test]
    fn a_dead_holder_is_reported_when_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let dead = Holder {
            pid: 999_999,
            host: hostname(),
            started: "then".into(),
            command: "up".into(),
            lease_expires: None,
            lease_age: None,
            lease_expires_in: None,
        };
        fs_err::write(tmp.path().join("lock"), serde_json::to_string(&dead).unwrap()).unwrap();
        assert!(!dead.is_alive_here());
        let lock = Lock::acquire(tmp.path(), "recover").unwrap();
        assert_eq!(lock.took_over_from, Some(dead));
    }
}
