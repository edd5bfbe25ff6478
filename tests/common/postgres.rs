//! A throwaway PostgreSQL server for tests: `initdb` into a temp directory, `pg_ctl start` on a
//! free loopback port, stopped and removed on drop. PostgreSQL refuses to run as root, so as
//! root the server runs as the `postgres` user (or `nobody`) that owns the directory. A missing
//! PostgreSQL fails the test loudly (run `scripts/setup-postgres.sh`), it never skips.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub struct PgServer {
    /// Holds the data directory, the socket and the log.
    dir: tempfile::TempDir,
    pub port: u16,
    bin: PathBuf,
    user: Option<String>,
    /// `-c` settings for TLS, when the server was started with a certificate.
    tls_options: String,
}

/// A test certificate authority and a server certificate it signed for `localhost` only.
pub struct TestCa {
    dir: tempfile::TempDir,
    pub server_cert: String,
    pub server_key: String,
}

impl TestCa {
    pub fn new() -> TestCa {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, "rdeploy test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("self-signed CA");
        let key = KeyPair::generate().expect("server key");
        let mut server = CertificateParams::new(vec!["localhost".to_string()]).expect("server params");
        server.distinguished_name.push(DnType::CommonName, "localhost");
        let cert = server.signed_by(&key, &ca_cert, &ca_key).expect("server certificate");
        let dir = tempfile::Builder::new().prefix("rdeploy-ca").tempdir().expect("temp dir");
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        TestCa { dir, server_cert: cert.pem(), server_key: key.serialize_pem() }
    }

    /// The CA certificate (PEM) a client trusts.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }
}

/// The directory holding `initdb`, `pg_ctl` and `postgres`.
fn bin_dir() -> PathBuf {
    if let Ok(initdb) = which::which("initdb") {
        // /usr/local/bin wrappers and distribution symlinks: pg_ctl sits beside initdb.
        return initdb.parent().unwrap().to_path_buf();
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path().join("bin"))).filter(|b| b.join("initdb").exists()).collect())
        .unwrap_or_default();
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!("PostgreSQL server binaries (`initdb`, `pg_ctl`) are required by this test and were not found: run `scripts/setup-postgres.sh`")
    })
}

/// Who runs the server: ourselves, or an unprivileged user when we are root.
fn server_user() -> Option<String> {
    let id = |args: &[&str]| Command::new("id").args(args).output().ok().filter(|o| o.status.success());
    let me = id(&["-u"]).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if me.as_deref() != Some("0") {
        return None;
    }
    for name in ["postgres", "nobody"] {
        if id(&["-u", name]).is_some() {
            return Some(name.to_string());
        }
    }
    panic!(
        "running as root, and neither a `postgres` nor a `nobody` user exists to run PostgreSQL as (it refuses root)"
    )
}

impl PgServer {
    /// Starts a fresh server; panics with its log when it cannot.
    pub fn start() -> PgServer {
        PgServer::start_with(None)
    }

    /// Starts a server that accepts TCP connections over TLS only (`hostssl` in pg_hba.conf),
    /// with the server certificate `ca` signed.
    pub fn start_tls(ca: &TestCa) -> PgServer {
        PgServer::start_with(Some(ca))
    }

    fn start_with(ca: Option<&TestCa>) -> PgServer {
        let bin = bin_dir();
        let user = server_user();
        let dir = tempfile::Builder::new().prefix("rdeploy-pg").tempdir().expect("temp dir");
        if let Some(name) = &user {
            let chown = Command::new("chown").arg(name).arg(dir.path()).status().expect("run chown");
            assert!(chown.success(), "could not hand {} to {name}", dir.path().display());
        }
        let mut server = PgServer { dir, port: 0, bin, user, tls_options: String::new() };
        let data = server.data();
        server.run_ok(
            "initdb",
            &["-D", data.to_str().unwrap(), "-U", "postgres", "--auth=trust", "-N", "-E", "UTF8", "--locale=C"],
        );
        if let Some(ca) = ca {
            let (cert, key) = (server.dir.path().join("server.crt"), server.dir.path().join("server.key"));
            std::fs::write(&cert, &ca.server_cert).unwrap();
            std::fs::write(&key, &ca.server_key).unwrap();
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostssl all all ::1/128 trust\n",
            )
            .unwrap();
            for file in [&cert, &key, &data.join("pg_hba.conf")] {
                if let Some(name) = &server.user {
                    let chown = Command::new("chown").arg(name).arg(file).status().expect("run chown");
                    assert!(chown.success(), "could not hand {} to {name}", file.display());
                }
            }
            // PostgreSQL refuses a private key others can read.
            std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
            server.tls_options =
                format!(" -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}", cert.display(), key.display());
        }
        // A port is free when we look and may be taken when the server binds: try a few.
        for _ in 0..5 {
            server.port = free_port();
            if server.pg_ctl_start() {
                return server;
            }
        }
        panic!("could not start PostgreSQL:\n{}", server.log());
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `postgres://` URL of the server's `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn command(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        let mut cmd = match &self.user {
            Some(user) => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", user, "--"]).arg(path);
                cmd
            }
            None => Command::new(path),
        };
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        self.command(tool).args(args).output().unwrap_or_else(|e| panic!("could not run {tool}: {e}"))
    }

    fn run_ok(&self, tool: &str, args: &[&str]) {
        let out = self.run(tool, args);
        assert!(
            out.status.success(),
            "`{tool} {}` failed: {}\n{}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn pg_ctl_start(&self) -> bool {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=50{}",
            self.port,
            self.dir.path().display(),
            self.tls_options
        );
        let log = self.dir.path().join("server.log");
        self.run(
            "pg_ctl",
            &[
                "start",
                "-w",
                "-t",
                "30",
                "-D",
                self.data().to_str().unwrap(),
                "-l",
                log.to_str().unwrap(),
                "-o",
                &options,
            ],
        )
        .status
        .success()
    }

    /// Stops the server (`fast`: clients are disconnected, committed work is kept).
    pub fn stop(&self) {
        self.run_ok("pg_ctl", &["stop", "-w", "-m", "fast", "-D", self.data().to_str().unwrap()]);
    }

    /// Kills the server as a crash would (`immediate`: no shutdown checkpoint).
    pub fn crash(&self) {
        self.run_ok("pg_ctl", &["stop", "-w", "-m", "immediate", "-D", self.data().to_str().unwrap()]);
    }

    /// Starts it again on the same port.
    pub fn start_again(&self) {
        assert!(self.pg_ctl_start(), "could not restart PostgreSQL:\n{}", self.log());
    }

    /// Runs SQL with `psql` and returns its unaligned output.
    pub fn psql(&self, sql: &str) -> String {
        let psql = if self.bin.join("psql").exists() { self.bin.join("psql") } else { PathBuf::from("psql") };
        let out = Command::new(psql)
            .args([
                "-X",
                "-q",
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-c",
                sql,
            ])
            .output()
            .expect("run psql (installed with PostgreSQL: `scripts/setup-postgres.sh`)");
        assert!(out.status.success(), "psql failed on {sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = self.run("pg_ctl", &["stop", "-w", "-m", "immediate", "-D", self.data().to_str().unwrap()]);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free loopback port")
}
