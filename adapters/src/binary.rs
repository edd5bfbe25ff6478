//! Where a step's tool is found: one PATH search, with execvp's rules, for preflight and for
//! spawning, so the binary preflight checked is the one that runs.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::contract::{AdapterError, StepContext};

/// The search path glibc's execvp uses when `PATH` is not set at all.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Looks `name` (a bare program name) up on `path` as execvp does: entries in order, an empty
/// or relative entry names a directory relative to `cwd` (the child's working directory), no
/// `~` expansion, and the first regular file with an execute bit wins. `None` for `path` means
/// `PATH` is unset (execvp's default, `/bin:/usr/bin`).
///
/// The search is `which::which_in`'s; the entries are made absolute against `cwd` first, as
/// `which` would resolve a relative one against rdeploy's own directory and expand a leading `~`.
pub fn search_path(name: &OsStr, path: Option<&OsStr>, cwd: &Path) -> Option<PathBuf> {
    if name.is_empty() || Path::new(name).components().count() != 1 {
        return None;
    }
    let path = path.unwrap_or(OsStr::new(DEFAULT_PATH));
    // An entry made absolute under a directory whose name holds a `:` cannot be written in a
    // search list: it is passed over (the stack directory would have to be named so).
    let entries =
        std::env::split_paths(path).map(|entry| cwd.join(entry)).filter(|e| std::env::join_paths([e]).is_ok());
    let absolute = std::env::join_paths(entries).ok()?;
    which::which_in(name, Some(absolute), cwd).ok()
}

/// Finds a step's tool: a name with a slash is a path relative to the stack file; a bare name
/// is looked up ([`search_path`]) on the step's PATH (its `env:` may prepend a virtualenv or a
/// pinned version), else rdeploy's own, with relative entries against the stack directory,
/// where the tool runs.
pub fn resolve_binary(ctx: &StepContext, name: &str, install_hint: &str) -> Result<PathBuf, AdapterError> {
    let missing = |tool: String| AdapterError::ToolMissing { tool, hint: install_hint.to_string() };
    if name.contains('/') {
        let path = ctx.resolve(Path::new(name));
        return if path.is_file() { Ok(path) } else { Err(missing(path.display().to_string())) };
    }
    let path = ctx.env.get("PATH").map(std::ffi::OsString::from).or_else(|| std::env::var_os("PATH"));
    search_path(OsStr::new(name), path.as_deref(), &ctx.stack_dir).ok_or_else(|| missing(name.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn tool(dir: &Path, name: &str, mode: u32) {
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join(name);
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn searches_path_as_execvp_does() {
        let root = tempfile::tempdir().unwrap();
        let cwd = root.path().join("stack");
        tool(&cwd.join("bin"), "t", 0o755);
        tool(&root.path().join("abs"), "t", 0o755);
        tool(&root.path().join("noexec"), "t", 0o644);
        let abs = root.path().join("abs");
        let noexec = root.path().join("noexec");
        let path = |entries: &[&Path]| std::env::join_paths(entries).unwrap();
        let find = |p: &std::ffi::OsString| search_path(OsStr::new("t"), Some(p), &cwd);
        // A relative entry is the child's directory's, not rdeploy's; a file without an
        // execute bit is passed over; the first match wins.
        assert_eq!(find(&path(&[Path::new("bin"), &abs])), Some(cwd.join("bin/t")));
        assert_eq!(find(&path(&[&noexec, &abs])), Some(abs.join("t")));
        // An empty entry is the child's directory itself.
        tool(&cwd, "t", 0o755);
        assert_eq!(find(&std::ffi::OsString::from(format!(":{}", abs.display()))), Some(cwd.join("t")));
        // No `~` expansion: `~/bin` is a directory named `~` under the child's directory.
        assert_eq!(find(&std::ffi::OsString::from("~/bin")), None);
        tool(&cwd.join("~/bin"), "t", 0o755);
        assert_eq!(find(&std::ffi::OsString::from("~/bin")), Some(cwd.join("~/bin/t")));
        assert_eq!(search_path(OsStr::new("sh"), None, &cwd), Some(PathBuf::from("/bin/sh")));
    }
}
