//! The integration-test harness: a temp project, the real `rdeploy` binary run in it, and
//! helpers to find the real tools (a missing tool fails the test loudly, never skips it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The workspace root (where `tools/` and `.venv/` live).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The path of a tool the test needs; panics with the install command when it is missing.
pub fn require_tool(name: &str, install: &str) -> PathBuf {
    which::which(name)
        .unwrap_or_else(|_| panic!("`{name}` is required by this test and was not found on PATH: {install}"))
}

/// Five sub-changes, each appending its name to `out`; the fifth fails while `fail-five` exists.
pub const FIVE: &str = r#"
name: demo
steps:
  - name: seed
    tool: shell
    sub_changes:
      - { name: one, run: echo one >> out }
      - { name: two, run: echo two >> out }
      - { name: three, run: echo three >> out }
      - { name: four, run: echo four >> out }
      - { name: five, run: "if [ -f fail-five ]; then echo 'five: connection refused' >&2; exit 3; fi; echo five >> out" }
  - name: after
    tool: shell
    needs: [seed]
    run: echo after >> out
"#;

/// A temporary project directory holding a stack and its files.
pub struct Project {
    pub dir: tempfile::TempDir,
    env: Vec<(String, String)>,
}

impl Project {
    pub fn new() -> Project {
        Project { dir: tempfile::Builder::new().prefix("rdeploy-test").tempdir().expect("temp dir"), env: Vec::new() }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Writes a file (parents created) and returns the project for chaining.
    pub fn file(&self, rel: &str, content: &str) -> &Project {
        let path = self.path(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        self
    }

    pub fn stack(&self, yaml: &str) -> &Project {
        self.file("stack.yaml", yaml)
    }

    /// The path (relative to the project) of `rel` in the default state directory of the stack
    /// in `stack.yaml`: `.rdeploy/<its name>/rel` (`rel` empty: the directory itself).
    pub fn state(&self, rel: &str) -> String {
        let yaml = self.read("stack.yaml");
        let name = yaml
            .lines()
            .find_map(|l| l.strip_prefix("name:"))
            .map(|n| n.split('#').next().unwrap_or_default().trim().trim_matches(|c| c == '"' || c == '\'').to_string())
            .unwrap_or_else(|| panic!("no top-level `name:` in the project's stack.yaml:\n{yaml}"));
        if rel.is_empty() {
            format!(".rdeploy/{name}")
        } else {
            format!(".rdeploy/{name}/{rel}")
        }
    }

    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).exists()
    }

    pub fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.path(rel)).unwrap_or_default()
    }

    /// The lines of a file (empty when it does not exist).
    pub fn lines(&self, rel: &str) -> Vec<String> {
        self.read(rel).lines().map(str::to_string).collect()
    }

    pub fn remove(&self, rel: &str) {
        let _ = std::fs::remove_file(self.path(rel));
    }

    /// Copies a fixture directory from the repository into the project.
    pub fn copy_fixture(&self, fixture: &str, to: &str) -> &Project {
        copy_dir(&repo_root().join("fixtures").join(fixture), &self.path(to));
        self
    }

    /// An environment variable for every rdeploy run of this project.
    pub fn env(&mut self, key: &str, value: &str) -> &mut Project {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdeploy"));
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .env("CI", "1")
            .env_remove("RDEPLOY_STATE_DIR")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        cmd
    }

    /// Runs rdeploy to completion.
    pub fn rdeploy(&self, args: &[&str]) -> Run {
        let output = self.command(args).output().expect("run rdeploy");
        Run::from(output, args)
    }

    /// Starts rdeploy in the background.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn rdeploy")
    }

    /// `rdeploy status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let run = self.rdeploy(&["status", "--json"]);
        run.code(0);
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("status --json is not JSON ({e}):\n{}", run.stdout))
    }

    /// Waits until a file exists (a child reached a point), or panics after `timeout`.
    pub fn wait_for(&self, rel: &str, timeout: Duration) {
        let start = Instant::now();
        while !self.exists(rel) {
            assert!(start.elapsed() < timeout, "timed out waiting for {rel}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A finished rdeploy run.
pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
    args: String,
}

impl Run {
    pub fn from(output: Output, args: &[&str]) -> Run {
        Run {
            status: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            args: args.join(" "),
        }
    }

    /// Asserts the exit code, showing both streams when it differs.
    pub fn code(&self, expected: i32) -> &Run {
        assert_eq!(
            self.status, expected,
            "`rdeploy {}` exited {} (expected {expected})\n--- stdout\n{}\n--- stderr\n{}",
            self.args, self.status, self.stdout, self.stderr
        );
        self
    }

    pub fn stdout_has(&self, text: &str) -> &Run {
        assert!(self.stdout.contains(text), "stdout lacks {text:?}:\n{}\n--- stderr\n{}", self.stdout, self.stderr);
        self
    }

    pub fn stderr_has(&self, text: &str) -> &Run {
        assert!(self.stderr.contains(text), "stderr lacks {text:?}:\n{}", self.stderr);
        self
    }
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap_or_else(|e| panic!("reading {}: {e}", from.display())) {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// Finds a step in `status --json` by name.
pub fn step<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name} in {status}"))
}

/// `id: status` pairs of a step's sub-changes.
pub fn sub_statuses(status: &serde_json::Value, name: &str) -> Vec<(String, String)> {
    step(status, name)["sub_changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_str().unwrap().to_string(), s["status"].as_str().unwrap().to_string()))
        .collect()
}

/// The helm process (and its group) working on `release`, from the process table.
pub fn helm_group_for(release: &str, verb: &str) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<String> =
            raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let is_helm = args.first().is_some_and(|a| a.ends_with("/helm"));
        if is_helm && args.iter().any(|a| a == verb) && args.iter().any(|a| a == release) {
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // Field 5, after the parenthesised command name: the process group.
            return stat.rsplit_once(')')?.1.split_whitespace().nth(2)?.parse().ok();
        }
    }
    None
}

/// A project on the fleet: the kubesim environment and a one-Deployment chart.
pub fn fleet_project(sim: &kubesim::testing::Kubesim) -> Project {
    let mut p = Project::new();
    for (k, v) in sim.env() {
        p.env(&k, &v);
    }
    p.file("chart/Chart.yaml", "apiVersion: v2\nname: agent\nversion: 0.1.0\n");
    p.file("chart/values.yaml", "image: nginx:1.27\n");
    p.file(
        "chart/templates/deployment.yaml",
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: agent
spec:
  replicas: 1
  selector:
    matchLabels: { app: agent }
  template:
    metadata:
      labels: { app: agent }
    spec:
      containers:
        - name: agent
          image: {{ .Values.image | quote }}
"#,
    );
    p
}
