//! The local store's lock: one run at a time. An `flock` on `lock` is the truth (the kernel
//! drops it when its holder dies, even on kill -9); the file's content names the holder so a
//! second run can say who, and a lock left by a dead holder is reported when taken over.
//!
//! The file is opened with `O_NOFOLLOW` and never truncated before it is locked and checked to
//! be a regular file of ours: a symlink planted at `.rdeploy/lock` is refused, not followed.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};

use anyhow::Context as _;
use nix::fcntl::{Flock, FlockArg};

use crate::store::state_dir::{open_private, StateDir};
use crate::store::{hostname, Holder, LockError};

/// The held lock; released on drop.
pub struct Lock {
    file: Flock<File>,
    /// A holder that died without releasing (crash, kill -9), if we took over from one.
    pub took_over_from: Option<Holder>,
}

/// How long a lock whose named holder is dead may stay held (by a child the holder was forking)
/// before it counts as held by someone else.
const DEAD_HOLDER_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

impl Lock {
    /// Takes the lock or says who has it. Never waits.
    pub fn acquire(dir: &StateDir, command: &str) -> Result<Lock, LockError> {
        dir.ensure()?;
        let path = dir.lock_path();
        let file = open_private(&path, OpenOptions::new().read(true).write(true).create(true).truncate(false))
            .map_err(|e| match e.downcast_ref::<std::io::Error>() {
                Some(_) => dir.unwritable(&path, &format!("{e:#}")),
                None => e,
            })?;
        let meta = file.metadata().with_context(|| format!("reading {}", path.display()))?;
        if !meta.is_file() {
            return Err(LockError::Io(anyhow::anyhow!("{} is not a regular file", path.display())));
        }
        dir.check_owner(&path)?;
        // A holder that died can leave the flock held for a moment: a child it was forking when
        // it was killed shares the lock's open file until that child execs (which closes it) or
        // dies of its death signal. So while the named holder is dead here, wait for the lock a
        // little before calling it held.
        let dead_holder_grace = std::time::Instant::now() + DEAD_HOLDER_GRACE;
        let mut file = file;
        let mut file = loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(locked) => break locked,
                Err((_, errno)) if errno != nix::errno::Errno::EWOULDBLOCK => {
                    return Err(LockError::Io(anyhow::anyhow!("locking {}: {errno}", path.display())));
                }
                Err((mut unlocked, _)) => {
                    let holder = read_holder(&mut unlocked);
                    let holder_dead = holder.as_ref().is_some_and(|h| h.host == hostname() && !h.is_alive_here());
                    if holder_dead && std::time::Instant::now() < dead_holder_grace {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        file = unlocked;
                        continue;
                    }
                    let holder = holder
                        .map(|h| h.to_string())
                        .unwrap_or_else(|| "a process that has not written its name yet".into());
                    return Err(LockError::Held { dir: dir.path.display().to_string(), holder });
                }
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
        write_holder(&mut file, Some(&me)).map_err(|e| dir.unwritable(&path, &e))?;
        Ok(Lock { file, took_over_from })
    }

    /// Who holds the lock now, without taking it (for `status`).
    pub fn current_holder(dir: &StateDir) -> Option<Holder> {
        // Read-only: taking even a shared flock here could make a concurrent `up` see the
        // lock as held. A name in the file is a holder unless it is a dead process on this host.
        let mut file = open_private(&dir.lock_path(), OpenOptions::new().read(true)).ok()?;
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
        let first = Lock::acquire(&StateDir::new(tmp.path()), "up").unwrap();
        assert!(first.took_over_from.is_none());
        match Lock::acquire(&StateDir::new(tmp.path()), "recover") {
            Err(LockError::Held { holder, .. }) => {
                assert!(holder.contains(&format!("pid {}", std::process::id())), "{holder}")
            }
            _ => panic!("second lock must be refused"),
        }
        assert_eq!(Lock::current_holder(&StateDir::new(tmp.path())).unwrap().command, "up");
        drop(first);
        let again = Lock::acquire(&StateDir::new(tmp.path()), "up").unwrap();
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
        let lock = Lock::acquire(&StateDir::new(tmp.path()), "recover").unwrap();
        assert_eq!(lock.took_over_from, Some(dead));
    }
}
