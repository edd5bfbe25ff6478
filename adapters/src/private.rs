//! Files and directories the adapters make in the state directory (running notes, tool output,
//! inventories, object files): never through a planted symbolic link (`O_NOFOLLOW`), and
//! readable by their owner only (files 0600, directories 0700), whatever the umask. The
//! binary's `StateDir` opens its own files through [`open`] too, so there is one way.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

/// The mode of every file rdeploy creates in the state directory.
pub const FILE_MODE: u32 = 0o600;
/// The mode of every directory rdeploy creates in the state directory.
pub const DIR_MODE: u32 = 0o700;

/// Opens with `O_NOFOLLOW | O_CLOEXEC`, creating (when `options` says so) with mode 0600. A
/// symbolic link at `path` fails with `ELOOP`.
pub fn open(path: &Path, options: &mut OpenOptions) -> std::io::Result<File> {
    options.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC).mode(FILE_MODE).open(path)
}

/// Replaces the content of the file at `path` (created 0600, never through a link).
pub fn write(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    open(path, OpenOptions::new().write(true).create(true).truncate(true))?.write_all(bytes)
}

/// Creates the directory `path` (its parent must exist) with mode 0700.
pub fn create_dir(path: &Path) -> std::io::Result<()> {
    DirBuilder::new().mode(DIR_MODE).create(path)
}

/// Creates `path` and its missing parents with mode 0700.
pub fn create_dir_all(path: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(path)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{symlink, PermissionsExt as _};

    use super::*;

    #[test]
    fn files_are_0600_directories_0700_and_links_are_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        create_dir_all(&sub).unwrap();
        assert_eq!(std::fs::metadata(&sub).unwrap().permissions().mode() & 0o777, DIR_MODE);
        let file = sub.join("f");
        write(&file, b"x").unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, FILE_MODE);
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let planted = sub.join("planted");
        symlink(&victim, &planted).unwrap();
        let e = write(&planted, b"clobber").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ELOOP));
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }
}
