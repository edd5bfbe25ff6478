//! The ansible step's cache files under the state directory's `cache/STEP/` (the passed syntax
//! check, the callback settings): each replaced whole, and the temporary files of a writer that
//! died (kill -9) cleaned on the next write. What a file holds is its owner module's.

use std::path::Path;

/// Replaces the file `name` in `dir` (made 0700 if missing) whole: written to `name.PID` (this
/// process's), then renamed over it, so a reader never sees half of it. A `name.PID` left by a
/// process that died between the two is removed first; one whose process lives is another
/// rdeploy's write in progress and is left alone. On an error nothing of ours is left.
pub fn replace(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    crate::private::create_dir_all(dir)?;
    remove_stale_temps(dir, name);
    let temp = dir.join(format!("{name}.{}", std::process::id()));
    let written = crate::private::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, dir.join(name)));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

/// Removes each `name.PID` in `dir` whose process is gone (not this one's: it is about to be
/// written).
fn remove_stale_temps(dir: &Path, name: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let prefix = format!("{name}.");
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(pid) = file.to_str().and_then(|f| f.strip_prefix(&prefix)).and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid != std::process::id() as i32 && !crate::process::process_lives(pid) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn replace_writes_whole_and_removes_the_temp_files_of_dead_writers_only() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache/step");
        crate::private::create_dir_all(&cache).unwrap();
        // A writer killed between write and rename: its pid is no live process.
        let mut dead = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = dead.id();
        dead.wait().unwrap();
        let stale = cache.join(format!("x.json.{dead_pid}"));
        std::fs::write(&stale, "half").unwrap();
        // Another rdeploy writing right now (pid 1 lives), and a temp file of another name.
        let busy = cache.join("x.json.1");
        std::fs::write(&busy, "in progress").unwrap();
        let other = cache.join(format!("y.json.{dead_pid}"));
        std::fs::write(&other, "not ours").unwrap();

        replace(&cache, "x.json", b"{}").unwrap();
        assert_eq!(std::fs::read_to_string(cache.join("x.json")).unwrap(), "{}");
        assert!(!stale.exists(), "a dead writer's temp file is removed");
        assert!(busy.exists(), "a live writer's temp file is left alone");
        assert!(other.exists(), "another file's temp file is left alone");
        assert!(!cache.join(format!("x.json.{}", std::process::id())).exists(), "renamed, not left behind");
        let mode = std::fs::metadata(cache.join("x.json")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, crate::private::FILE_MODE);
    }
}
