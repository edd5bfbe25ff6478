//! The shell fast path: a `run:` line that is one simple command is started without `/bin/sh`,
//! exactly as `sh -c` would start it (the same program found the same way, the same arguments,
//! the `PWD` dash exports), and anything the kernel would not run itself goes to the shell after
//! all, so the verdict is always the shell's. The generic spawner knows nothing of this beyond
//! the script a [`Command`] may carry.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Command, Started};

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
pub(super) fn simple_command(script: &str) -> Option<Vec<&str>> {
    let plain = |c: char| c == ' ' || c.is_ascii_alphanumeric() || "_./:,+@%=-".contains(c);
    if !script.chars().all(plain) {
        return None;
    }
    let words: Vec<&str> = script.split(' ').filter(|w| !w.is_empty()).collect();
    let first = *words.first()?;
    (!first.contains('=') && !SHELL_WORDS.contains(&first)).then_some(words)
}

/// `sh -c script`, the way stack files mean their `run:` lines. A line that is one simple
/// command (`./migrate.sh up 42`) is started directly, as make does: the same program with the
/// same arguments, one exec of the shell fewer per sub-change.
pub(super) fn command(script: &str) -> Command {
    match simple_command(script) {
        Some(words) => {
            let mut cmd = Command::new(words[0]).args(&words[1..]);
            cmd.script = Some(script.to_string());
            cmd
        }
        None => sh(script),
    }
}

fn sh(script: &str) -> Command {
    Command::new("/bin/sh").arg("-c").arg(script)
}

/// Starts a line that skipped the shell. A program the kernel would not run itself (a script
/// without `#!`, a foreign binary), or that cannot be started (missing, not executable), goes to
/// the shell instead, which runs or rejects it as it always would.
pub(super) fn start(cmd: &Command, script: &str) -> std::io::Result<Started> {
    let through_shell = || {
        let sh = sh(script);
        Command { program: sh.program, args: sh.args, script: None, ..cmd.clone() }.start_plain(&[])
    };
    // glibc's execvp hands a file the kernel rejects to `sh` as a script, where dash would say
    // "Exec format error": only what the kernel runs itself skips the shell.
    if !kernel_runs(cmd) {
        return through_shell();
    }
    let pwd = shell_pwd(cmd).map(|p| (OsString::from("PWD"), p.into_os_string()));
    cmd.start_plain(pwd.as_slice()).or_else(|source| {
        tracing::debug!(command = %cmd, error = %source, "running it through the shell");
        through_shell()
    })
}

/// A variable as the child will see it: the command's own setting, else rdeploy's.
fn child_env(cmd: &Command, key: &str) -> Option<OsString> {
    match cmd.env.iter().rev().find(|(k, _)| k == key) {
        Some((_, v)) => Some(v.clone()),
        None => std::env::var_os(key),
    }
}

/// The PWD `sh` would export in the child's directory: the inherited one when it is an
/// absolute path to that same directory (a logical path through a symlink stays), otherwise the
/// physical path, as getcwd gives it.
fn shell_pwd(cmd: &Command) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dir = match &cmd.cwd {
        Some(dir) => std::fs::canonicalize(dir).ok()?,
        None => std::env::current_dir().ok()?,
    };
    let inherited = child_env(cmd, "PWD").map(PathBuf::from);
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

/// Whether the kernel itself runs this program: a `#!` script, or an ELF file for this machine
/// (class, byte order and architecture as rdeploy's own).
fn kernel_runs(cmd: &Command) -> bool {
    static NATIVE: std::sync::OnceLock<Option<[u8; 20]>> = std::sync::OnceLock::new();
    let head = |path: &Path| -> Option<[u8; 20]> {
        let mut read = Vec::with_capacity(20);
        std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::open(path).ok()?, 20), &mut read).ok()?;
        let mut head = [0u8; 20];
        head[..read.len()].copy_from_slice(&read);
        Some(head)
    };
    let path = if cmd.program.components().count() > 1 {
        match &cmd.cwd {
            Some(dir) => dir.join(&cmd.program),
            None => cmd.program.clone(),
        }
    } else {
        // execvp's search, in the child's directory: an empty or relative PATH entry means a
        // directory relative to it (the `which` crate resolves those against rdeploy's own
        // directory, and expands `~`, which execvp does not).
        use std::os::unix::fs::PermissionsExt;
        let Some(path_var) = child_env(cmd, "PATH") else { return false };
        let cwd = cmd.cwd.clone().unwrap_or_default();
        let found = std::env::split_paths(&path_var)
            .map(|entry| cwd.join(entry).join(&cmd.program))
            .find(|c| std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0));
        match found {
            Some(path) => path,
            None => return false,
        }
    };
    match (head(&path), NATIVE.get_or_init(|| head(Path::new("/proc/self/exe")))) {
        (Some(h), _) if h.starts_with(b"#!") => true,
        (Some(h), Some(native)) => h.starts_with(b"\x7fELF") && h[4..6] == native[4..6] && h[18..20] == native[18..20],
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::run;
    use super::*;
    use crate::Stream;

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
}
