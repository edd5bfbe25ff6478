//! Build script: records the git commit the binary is built from, for `rdeploy --version`.
//! Outside a git checkout (a source tarball, `cargo install` from a registry) or without git,
//! the version says so instead of failing the build; `RDEPLOY_BUILD_COMMIT` overrides both (for
//! packagers that build from an exported tree).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=RDEPLOY_BUILD_COMMIT");
    let commit = match std::env::var("RDEPLOY_BUILD_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_string(),
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(commit) => {
                // Rebuild when HEAD moves: HEAD itself (a checkout) and the ref it points to (a commit).
                for path in [
                    git(&["rev-parse", "--git-path", "HEAD"]),
                    git(&["rev-parse", "--symbolic-full-name", "HEAD"])
                        .and_then(|r| git(&["rev-parse", "--git-path", &r])),
                ]
                .into_iter()
                .flatten()
                {
                    println!("cargo:rerun-if-changed={path}");
                }
                let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
                if dirty {
                    format!("{commit}, with uncommitted changes")
                } else {
                    commit
                }
            }
            None => "not built from a git checkout".to_string(),
        },
    };
    println!("cargo:rustc-env=RDEPLOY_BUILD_COMMIT={commit}");
}
