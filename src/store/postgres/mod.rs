//! The PostgreSQL store (`--state postgres://...`): the checkpoint journal, snapshots, history
//! and lock of many stacks in one shared database, so CI runners and operators on different
//! machines deploy the same stacks safely. Tables live in the `rdeploy` schema (see [`schema`]).
//!
//! - The lock is a lease: a row per stack naming the holder, with a random token and an expiry
//!   on the database's clock. The holder renews it from a heartbeat; another run may take it
//!   over only once it has expired.
//! - Every write is fenced by the lease: it runs in the same statement as a check that the
//!   lock row still carries this run's token (`FOR SHARE` on that row, so a takeover and a
//!   write are serialized by PostgreSQL). A run that lost its lease (paused, partitioned) gets
//!   an error instead of writing after another took over.
//! - Group commit as in the local store: `append` commits each record at once with
//!   `synchronous_commit = off` (on the server before it returns, so the rdeploy process may
//!   die), and `sync` commits a lease renewal with `synchronous_commit = on`, which flushes the
//!   WAL up to it, so every record before it survives a database crash too. `sync` also checks
//!   that the records since the last sync are there and writes any a database crash lost.
//! - Connection errors while writing are retried with backoff for a bounded time; a record is
//!   written at most once (`ON CONFLICT DO NOTHING` on its sequence number).
//!
//! The `Store` methods are synchronous and are called from inside the driver's tokio runtime
//! (from async tasks and from `EventSink::emit`, with the checkpoint's mutex held). A client
//! that starts its own runtime would panic there, and `block_in_place` on the caller's runtime
//! would make the lease heartbeat depend on that runtime having a free worker. So the store
//! owns a dedicated thread running a current-thread runtime: the connections, the heartbeat
//! and every query live there, callers hand it a future and wait for the answer (inside
//! `block_in_place` when they are on a multi-thread runtime's worker, so the driver's other
//! tasks, e.g. reading a tool's output, keep running meanwhile).

pub mod bench;
pub mod schema;
pub mod transfer;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_postgres::{Client, Statement};

use super::local::StateDir;
use super::pg_tls;
use super::{hostname, Holder, LockError};
use super::{JournalWriter, LockGuard, Store};
use crate::checkpoint::{now, Deploy, Entry, Record, Timestamp, FORMAT, VERSION};
use crate::exit::{Code, Refusal};

/// Timings, from the environment so tests can shorten them.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// How long a lease lasts without renewal (`RDEPLOY_LEASE_SECONDS`, default 10).
    pub lease: Duration,
    /// How often the holder renews it (`RDEPLOY_HEARTBEAT_SECONDS`, default a third of the lease).
    pub heartbeat: Duration,
    /// How long a write keeps retrying an unreachable database (`RDEPLOY_STATE_RETRY_SECONDS`,
    /// default 30).
    pub retry: Duration,
    /// How long one connection attempt or read may take.
    pub timeout: Duration,
}

impl Settings {
    pub fn from_env() -> Settings {
        let secs = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64)
        };
        let lease = secs("RDEPLOY_LEASE_SECONDS").unwrap_or(Duration::from_secs(10));
        Settings {
            lease,
            heartbeat: secs("RDEPLOY_HEARTBEAT_SECONDS").unwrap_or(lease / 3),
            retry: secs("RDEPLOY_STATE_RETRY_SECONDS").unwrap_or(Duration::from_secs(30)),
            timeout: Duration::from_secs(5),
        }
    }
}

/// Whether a `--state` value or `state:` key names a PostgreSQL database.
pub fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// The URL without its password or query string, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let rest = rest.split('?').next().unwrap_or(rest);
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => format!("{}@{host}", userinfo.split(':').next().unwrap_or("")),
        None => authority.to_string(),
    };
    format!("{scheme}://{authority}{path}")
}

/// A stack's checkpoint and lock in PostgreSQL.
#[derive(Clone)]
pub struct PostgresStore {
    shared: Arc<Shared>,
}

struct Shared {
    config: tokio_postgres::Config,
    /// TLS as the URL's `sslmode` asks (see [`pg_tls`]).
    tls: pg_tls::Connector,
    display: String,
    stack: String,
    settings: Settings,
    /// Records and reads: `synchronous_commit = off` (see the module docs).
    journal_line: tokio::sync::Mutex<Option<Conn>>,
    /// The lease, `sync` and archiving: `synchronous_commit = on`.
    lease_line: tokio::sync::Mutex<Option<Conn>>,
    migrated: AtomicBool,
    /// The lease this process holds on the stack, if any.
    lease: Mutex<Option<LeaseState>>,
    /// The local state directory whose scratch (adapters' work dirs) is cleared on archive.
    scratch: Option<StateDir>,
    worker: Worker,
}

#[derive(Clone)]
struct LeaseState {
    token: String,
    lost: Arc<AtomicBool>,
}

impl PostgresStore {
    /// A store for one stack. Connects lazily: nothing is contacted until first use.
    pub fn open(url: &str, stack: &str, scratch: Option<StateDir>) -> anyhow::Result<PostgresStore> {
        Self::with_settings(url, stack, scratch, Settings::from_env())
    }

    pub fn with_settings(
        url: &str,
        stack: &str,
        scratch: Option<StateDir>,
        settings: Settings,
    ) -> anyhow::Result<PostgresStore> {
        let display = redact(url);
        if !is_url(url) {
            return Err(Refusal::new(Code::BadInput, format!("`{display}` is not a PostgreSQL URL"))
                .with_hint("pass `--state postgres://user@host/db`, or `--state-dir DIR` for a local directory")
                .into());
        }
        let (url, tls, connector) = pg_tls::split(url, |k| std::env::var(k).ok())
            .and_then(|(url, tls)| tls.connector().map(|connector| (url, tls, connector)))
            .map_err(|e| {
                Refusal::new(Code::BadInput, format!("`{display}`: {e}"))
                    .with_hint("TLS settings follow libpq: `?sslmode=verify-full&sslrootcert=/path/to/ca.pem`")
            })?;
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| {
            Refusal::new(Code::BadInput, format!("`{display}` is not a valid PostgreSQL URL: {e}"))
                .with_hint("the form is `postgres://user[:password]@host[:port]/database`; the password may come from `PGPASSWORD`")
        })?;
        if config.get_user().is_none() {
            let user = std::env::var("PGUSER").or_else(|_| std::env::var("USER")).unwrap_or_else(|_| "postgres".into());
            config.user(user);
        }
        if config.get_password().is_none() {
            if let Ok(password) = std::env::var("PGPASSWORD") {
                config.password(password);
            }
        }
        config.connect_timeout(settings.timeout);
        config.application_name("rdeploy");
        config.ssl_mode(tls.mode.negotiation());
        // Only `hostaddr=`: the address is also the name TLS checks, as there is no other.
        if config.get_hosts().is_empty() {
            for addr in config.get_hostaddrs().to_vec() {
                config.host(addr.to_string());
            }
        }
        let hosts = config.get_hosts();
        // An empty host name (`postgres://u@:5432/db?hostaddr=...`) leaves verify-full nothing
        // to check the certificate against.
        if tls.mode == pg_tls::SslMode::VerifyFull
            && hosts.iter().any(|h| matches!(h, tokio_postgres::config::Host::Tcp(name) if name.is_empty()))
        {
            return Err(Refusal::new(
                Code::BadInput,
                format!("`{display}`: sslmode=verify-full needs the host name the server's certificate carries, and the URL gives an empty one"),
            )
            .with_hint("name it: `postgres://user@db.internal/rdeploy?hostaddr=10.0.0.5&sslmode=verify-full`")
            .into());
        }
        // libpq never tries TLS over a Unix socket (PostgreSQL offers none there).
        if !hosts.is_empty() && hosts.iter().all(|h| !matches!(h, tokio_postgres::config::Host::Tcp(_))) {
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        }
        Ok(PostgresStore {
            shared: Arc::new(Shared {
                config,
                tls: connector,
                display,
                stack: stack.to_string(),
                settings,
                journal_line: tokio::sync::Mutex::new(None),
                lease_line: tokio::sync::Mutex::new(None),
                migrated: AtomicBool::new(false),
                lease: Mutex::new(None),
                scratch,
                worker: Worker::start()?,
            }),
        })
    }

    /// Runs `op` on the worker once (reads, the lock): no retry, so a command that only reads
    /// fails fast when the database is down.
    fn once<T, F>(&self, line: Line, op: F) -> Result<T, OpError>
    where
        T: Send + 'static,
        F: for<'c> FnMut(&'c mut Conn) -> OpFuture<'c, T> + Send + 'static,
    {
        let shared = self.shared.clone();
        self.shared.worker.call(async move { run(&shared, line, Duration::ZERO, op).await })
    }

    /// Runs `op` on the worker, retrying connection errors within the retry budget.
    fn retried<T, F>(&self, line: Line, op: F) -> Result<T, OpError>
    where
        T: Send + 'static,
        F: for<'c> FnMut(&'c mut Conn) -> OpFuture<'c, T> + Send + 'static,
    {
        self.within(self.shared.settings.retry, line, op)
    }

    fn within<T, F>(&self, budget: Duration, line: Line, op: F) -> Result<T, OpError>
    where
        T: Send + 'static,
        F: for<'c> FnMut(&'c mut Conn) -> OpFuture<'c, T> + Send + 'static,
    {
        let shared = self.shared.clone();
        self.shared.worker.call(async move { run(&shared, line, budget, op).await })
    }

    fn lease(&self) -> anyhow::Result<LeaseState> {
        let lease = self.shared.lease.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let lease = lease.ok_or_else(|| {
            anyhow::anyhow!("writing the checkpoint to {} needs its lock (internal error)", self.location())
        })?;
        if lease.lost.load(Ordering::SeqCst) {
            return Err(self.lost_lease());
        }
        Ok(lease)
    }

    fn lost_lease(&self) -> anyhow::Error {
        anyhow::anyhow!(
            "this run lost the lock on stack `{}` in {}: its lease ran out (the run was paused or cut off from the database for more than {:.0}s) and another run took it over; nothing more is written by this run; `rdeploy status` shows the deploy as the other run keeps it",
            self.shared.stack,
            self.shared.display,
            self.shared.settings.lease.as_secs_f64()
        )
    }

    fn error(&self, e: OpError, what: &str) -> anyhow::Error {
        match e {
            OpError::Fenced => self.lost_lease(),
            OpError::Unreachable { error, waited } => anyhow::anyhow!(
                "the state database {} is unreachable while {what}: {error} (gave up after retrying for {:.0}s); every record written before is kept: when the database is back, `rdeploy recover` resumes from there",
                self.shared.display,
                waited.as_secs_f64()
            ),
            OpError::Connection(error) => anyhow::anyhow!("could not reach the state database {} while {what}: {error}", self.shared.display),
            OpError::Other(error) => error.context(format!("{what} in {}", self.location())),
        }
    }

    /// Reads the unfinished deploy: its journal's id and its state.
    fn read_unfinished(&self) -> Result<Option<(i64, Deploy)>, OpError> {
        let stack = self.shared.stack.clone();
        self.once(Line::Journal, move |c| {
            let stack = stack.clone();
            Box::pin(async move {
                let tx = c.client.build_transaction().isolation_level(tokio_postgres::IsolationLevel::RepeatableRead).read_only(true).start().await?;
                let Some(row) = tx.query_opt("SELECT id, format, version FROM rdeploy.journals WHERE stack = $1", &[&stack]).await? else {
                    return Ok(None);
                };
                let (id, format, version): (i64, String, i32) = (row.get(0), row.get(1), row.get(2));
                if format != FORMAT || version != VERSION as i32 {
                    return Err(OpError::Other(anyhow::anyhow!(
                        "journal format {format} version {version} is not supported by this rdeploy (wants {FORMAT} {VERSION})"
                    )));
                }
                let snapshot = tx.query_opt("SELECT deploy FROM rdeploy.snapshots WHERE journal_id = $1", &[&id]).await?;
                // A snapshot is only a cache of the records: when it is unreadable, replay all.
                let mut deploy = snapshot
                    .and_then(|row| serde_json::from_value::<Deploy>(row.get(0)).ok())
                    .filter(|d| d.version == VERSION)
                    .unwrap_or_else(Deploy::empty);
                let from = deploy.seq as i64;
                let rows = tx.query("SELECT seq, ts, record FROM rdeploy.records WHERE journal_id = $1 AND seq > $2 ORDER BY seq", &[&id, &from]).await?;
                for row in rows {
                    let (seq, ts, record): (i64, String, Value) = (row.get(0), row.get(1), row.get(2));
                    let record: Record = serde_json::from_value(record)
                        .map_err(|e| OpError::Other(anyhow::anyhow!("journal record {seq} is unreadable: {e}")))?;
                    let ts = Timestamp::parse(&ts).map_err(|e| OpError::Other(e.context(format!("journal record {seq}"))))?;
                    deploy.apply(seq as u64, &ts, &record);
                }
                tx.commit().await?;
                Ok(Some((id, deploy)))
            })
        })
    }

    /// Every record of the unfinished deploy, in order (for `state migrate`).
    pub fn entries(&self) -> anyhow::Result<Option<Vec<Entry>>> {
        let stack = self.shared.stack.clone();
        self.once(Line::Journal, move |c| {
            let stack = stack.clone();
            Box::pin(async move {
                let rows = c
                    .client
                    .query(
                        "SELECT r.seq, r.ts, r.record FROM rdeploy.journals j LEFT JOIN rdeploy.records r ON r.journal_id = j.id WHERE j.stack = $1 ORDER BY r.seq",
                        &[&stack],
                    )
                    .await?;
                if rows.is_empty() {
                    return Ok(None);
                }
                let mut entries = Vec::new();
                for row in rows {
                    let Some(seq) = row.get::<_, Option<i64>>(0) else { continue };
                    let record: Record = serde_json::from_value(row.get(2))
                        .map_err(|e| OpError::Other(anyhow::anyhow!("journal record {seq} is unreadable: {e}")))?;
                    let ts = Timestamp::parse(row.get(1)).map_err(|e| OpError::Other(e.context(format!("journal record {seq}"))))?;
                    entries.push(Entry { seq: seq as u64, ts, record });
                }
                Ok(Some(entries))
            })
        })
        .map_err(|e| self.error(e, "reading the journal"))
    }

    /// Every finished deploy of the stack, oldest first (for `state migrate`).
    pub fn history(&self) -> anyhow::Result<Vec<Deploy>> {
        let stack = self.shared.stack.clone();
        self.once(Line::Journal, move |c| {
            let stack = stack.clone();
            Box::pin(async move {
                let rows = c
                    .client
                    .query("SELECT deploy FROM rdeploy.history WHERE stack = $1 ORDER BY id", &[&stack])
                    .await?;
                rows.into_iter()
                    .map(|row| {
                        serde_json::from_value(row.get(0))
                            .map_err(|e| OpError::Other(anyhow::anyhow!("a history entry is unreadable: {e}")))
                    })
                    .collect()
            })
        })
        .map_err(|e| self.error(e, "reading the history"))
    }

    /// Adds finished deploys to the history (for `state migrate`; needs the lock).
    pub fn import_history(&self, deploys: &[Deploy]) -> anyhow::Result<()> {
        let lease = self.lease()?;
        let stack = self.shared.stack.clone();
        let rows: Vec<(String, String, Value)> = deploys
            .iter()
            .map(|d| Ok((d.deploy_id.clone(), state_name(d), serde_json::to_value(d)?)))
            .collect::<anyhow::Result<_>>()?;
        self.retried(Line::Lease, move |c| {
            let (stack, token, rows) = (stack.clone(), lease.token.clone(), rows.clone());
            Box::pin(async move {
                let tx = c.client.transaction().await?;
                fence(&tx, &stack, &token).await?;
                for (id, state, deploy) in &rows {
                    tx.execute(
                        "INSERT INTO rdeploy.history (stack, deploy_id, state, deploy) VALUES ($1, $2, $3, $4)",
                        &[&stack, id, state, deploy],
                    )
                    .await?;
                }
                tx.commit().await?;
                Ok(())
            })
        })
        .map_err(|e| self.error(e, "writing the history"))
    }

    /// Forgets the unfinished deploy without archiving it (for `state migrate`, once it was
    /// copied elsewhere; needs the lock).
    pub fn remove_unfinished(&self) -> anyhow::Result<()> {
        let lease = self.lease()?;
        let stack = self.shared.stack.clone();
        self.retried(Line::Lease, move |c| {
            let (stack, token) = (stack.clone(), lease.token.clone());
            Box::pin(async move {
                let n = c
                    .client
                    .execute(
                        "WITH l AS (SELECT 1 FROM rdeploy.locks WHERE stack = $1 AND token = $2 FOR SHARE)
                         DELETE FROM rdeploy.journals WHERE stack = $1 AND EXISTS (SELECT 1 FROM l)",
                        &[&stack, &token],
                    )
                    .await?;
                let _ = n;
                Ok(())
            })
        })
        .map_err(|e| self.error(e, "removing the moved journal"))
    }

    fn clear_scratch(&self) {
        if let Some(dir) = &self.shared.scratch {
            // Adapters' work files of a finished deploy, as the local store clears them.
            let _ = fs_err::remove_dir_all(dir.path.join("steps"));
        }
    }
}

fn state_name(d: &Deploy) -> String {
    serde_json::to_value(d.state).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// The lock row, as a [`Holder`].
const HOLDER_COLUMNS: &str = "pid, host, command, started,
    to_char(expires AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    extract(epoch FROM now() - renewed)::float8, extract(epoch FROM expires - now())::float8";

fn holder_from(row: &tokio_postgres::Row, at: usize) -> Holder {
    Holder {
        pid: row.get::<_, i32>(at) as u32,
        host: row.get(at + 1),
        command: row.get(at + 2),
        started: row.get(at + 3),
        lease_expires: Some(row.get(at + 4)),
        lease_age: Some(round(row.get(at + 5))),
        lease_expires_in: Some(round(row.get(at + 6))),
    }
}

fn round(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

impl Store for PostgresStore {
    fn entries(&self) -> anyhow::Result<Option<Vec<Entry>>> {
        PostgresStore::entries(self)
    }

    fn history(&self) -> anyhow::Result<Vec<Deploy>> {
        PostgresStore::history(self)
    }

    fn import_history(&self, deploys: &[Deploy]) -> anyhow::Result<()> {
        PostgresStore::import_history(self, deploys)
    }

    fn retire_unfinished(&self) -> anyhow::Result<String> {
        self.remove_unfinished()?;
        Ok("the journal was removed from the database".into())
    }

    fn location(&self) -> String {
        format!("{} (stack {})", self.shared.display, self.shared.stack)
    }

    fn lock(&self, command: &str) -> Result<Box<dyn LockGuard>, LockError> {
        let token = ulid::Ulid::new().to_string();
        let me = (std::process::id() as i32, hostname(), command.to_string(), now().to_string());
        let stack = self.shared.stack.clone();
        let lease_secs = self.shared.settings.lease.as_secs_f64();
        let took = {
            let token = token.clone();
            self.once(Line::Lease, move |c| {
                let (stack, token, me) = (stack.clone(), token.clone(), me.clone());
                Box::pin(async move {
                    let tx = c.client.transaction().await?;
                    let sql = format!("SELECT {HOLDER_COLUMNS}, expires > now() FROM rdeploy.locks WHERE stack = $1 FOR UPDATE");
                    let current = tx.query_opt(&sql, &[&stack]).await?;
                    let took_over_from = match current {
                        Some(row) if row.get::<_, bool>(7) => return Ok(Err(holder_from(&row, 0))),
                        Some(row) => {
                            tx.execute(
                                "UPDATE rdeploy.locks SET token = $2, pid = $3, host = $4, command = $5, started = $6,
                                     renewed = now(), expires = now() + make_interval(secs => $7) WHERE stack = $1",
                                &[&stack, &token, &me.0, &me.1, &me.2, &me.3, &lease_secs],
                            )
                            .await?;
                            Some(holder_from(&row, 0))
                        }
                        None => {
                            let n = tx
                                .execute(
                                    "INSERT INTO rdeploy.locks (stack, token, pid, host, command, started, renewed, expires)
                                     VALUES ($1, $2, $3, $4, $5, $6, now(), now() + make_interval(secs => $7))
                                     ON CONFLICT (stack) DO NOTHING",
                                    &[&stack, &token, &me.0, &me.1, &me.2, &me.3, &lease_secs],
                                )
                                .await?;
                            if n == 0 {
                                // Another run inserted it between our read and our insert.
                                drop(tx);
                                let sql = format!("SELECT {HOLDER_COLUMNS} FROM rdeploy.locks WHERE stack = $1");
                                let row = c.client.query_one(&sql, &[&stack]).await?;
                                return Ok(Err(holder_from(&row, 0)));
                            }
                            None
                        }
                    };
                    tx.commit().await?;
                    Ok(Ok(took_over_from))
                })
            })
        };
        let took_over_from = match took {
            Ok(Ok(took)) => took,
            Ok(Err(holder)) => return Err(LockError::Held { dir: self.location(), holder: holder.to_string() }),
            Err(e) => return Err(LockError::Io(self.error(e, "taking the lock"))),
        };
        let lost = Arc::new(AtomicBool::new(false));
        *self.shared.lease.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(LeaseState { token: token.clone(), lost: lost.clone() });
        let heartbeat = self.shared.worker.handle.spawn(heartbeat(self.shared.clone(), token.clone(), lost));
        Ok(Box::new(PostgresLock { store: self.clone(), token, took_over_from, heartbeat }))
    }

    fn holder(&self) -> Option<Holder> {
        let stack = self.shared.stack.clone();
        self.once(Line::Journal, move |c| {
            let stack = stack.clone();
            Box::pin(async move {
                let sql = format!("SELECT {HOLDER_COLUMNS} FROM rdeploy.locks WHERE stack = $1 AND expires > now()");
                Ok(c.client.query_opt(&sql, &[&stack]).await?.map(|row| holder_from(&row, 0)))
            })
        })
        .ok()
        .flatten()
    }

    fn load_unfinished(&self) -> anyhow::Result<Option<Deploy>> {
        Ok(self.read_unfinished().map_err(|e| self.error(e, "reading the checkpoint"))?.map(|(_, d)| d))
    }

    fn last_finished(&self) -> anyhow::Result<Option<Deploy>> {
        let stack = self.shared.stack.clone();
        self.once(Line::Journal, move |c| {
            let stack = stack.clone();
            Box::pin(async move {
                let row = c
                    .client
                    .query_opt(
                        "SELECT deploy FROM rdeploy.history WHERE stack = $1 ORDER BY id DESC LIMIT 1",
                        &[&stack],
                    )
                    .await?;
                row.map(|row| {
                    serde_json::from_value(row.get(0))
                        .map_err(|e| OpError::Other(anyhow::anyhow!("the last history entry is unreadable: {e}")))
                })
                .transpose()
            })
        })
        .map_err(|e| self.error(e, "reading the history"))
    }

    fn has_unfinished(&self) -> anyhow::Result<bool> {
        let stack = self.shared.stack.clone();
        self.once(Line::Journal, move |c| {
            let stack = stack.clone();
            Box::pin(async move {
                Ok(c.client
                    .query_one("SELECT EXISTS (SELECT 1 FROM rdeploy.journals WHERE stack = $1)", &[&stack])
                    .await?
                    .get(0))
            })
        })
        .map_err(|e| self.error(e, "reading the checkpoint"))
    }

    fn create_journal(&self) -> anyhow::Result<Box<dyn JournalWriter>> {
        let lease = self.lease()?;
        let stack = self.shared.stack.clone();
        let created = now().to_string();
        let token = lease.token.clone();
        let id = self
            .retried(Line::Lease, move |c| {
                let (stack, token, created) = (stack.clone(), token.clone(), created.clone());
                Box::pin(async move {
                    let rows = c
                        .client
                        .query(
                            "WITH l AS (SELECT 1 FROM rdeploy.locks WHERE stack = $1 AND token = $2 FOR SHARE)
                             INSERT INTO rdeploy.journals (stack, format, version, created)
                             SELECT $1, $3, $4, $5 FROM l
                             ON CONFLICT (stack) DO NOTHING RETURNING id",
                            &[&stack, &token, &FORMAT, &(VERSION as i32), &created],
                        )
                        .await?;
                    match rows.first() {
                        Some(row) => Ok(row.get::<_, i64>(0)),
                        None => {
                            let held = c
                                .client
                                .query_opt(
                                    "SELECT 1 FROM rdeploy.locks WHERE stack = $1 AND token = $2",
                                    &[&stack, &token],
                                )
                                .await?;
                            if held.is_none() {
                                Err(OpError::Fenced)
                            } else {
                                Err(OpError::Other(anyhow::anyhow!("an unfinished deploy is already recorded")))
                            }
                        }
                    }
                })
            })
            .map_err(|e| self.error(e, "creating the journal"))?;
        Ok(Box::new(PostgresJournal {
            store: self.clone(),
            journal_id: id,
            lease,
            unsynced: Vec::new(),
            gave_up: false,
        }))
    }

    fn open_journal(&self) -> anyhow::Result<(Box<dyn JournalWriter>, Deploy)> {
        let lease = self.lease()?;
        let (id, deploy) = self
            .read_unfinished()
            .map_err(|e| self.error(e, "reading the checkpoint"))?
            .ok_or_else(|| anyhow::anyhow!("no unfinished deploy is recorded in {}", self.location()))?;
        Ok((
            Box::new(PostgresJournal {
                store: self.clone(),
                journal_id: id,
                lease,
                unsynced: Vec::new(),
                gave_up: false,
            }),
            deploy,
        ))
    }
}

/// The lease on a stack; renewed by a heartbeat on the store's thread, released on drop.
struct PostgresLock {
    store: PostgresStore,
    token: String,
    took_over_from: Option<Holder>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl LockGuard for PostgresLock {
    fn took_over_from(&self) -> Option<&Holder> {
        self.took_over_from.as_ref()
    }
}

impl Drop for PostgresLock {
    fn drop(&mut self) {
        self.heartbeat.abort();
        *self.store.shared.lease.lock().unwrap_or_else(|e| e.into_inner()) = None;
        let (stack, token) = (self.store.shared.stack.clone(), self.token.clone());
        // Deleting the row (rather than expiring it) tells the next run this one ended cleanly.
        // When the database is unreachable the lease simply runs out.
        let _ = self.store.once(Line::Lease, move |c| {
            let (stack, token) = (stack.clone(), token.clone());
            Box::pin(async move {
                c.client
                    .execute("DELETE FROM rdeploy.locks WHERE stack = $1 AND token = $2", &[&stack, &token])
                    .await?;
                Ok(())
            })
        });
    }
}

/// Renews the lease every `heartbeat`; marks it lost when another run took it over.
async fn heartbeat(shared: Arc<Shared>, token: String, lost: Arc<AtomicBool>) {
    let lease_secs = shared.settings.lease.as_secs_f64();
    loop {
        tokio::time::sleep(shared.settings.heartbeat).await;
        let (stack, token2) = (shared.stack.clone(), token.clone());
        let renewed = run(&shared, Line::Lease, Duration::ZERO, move |c| {
            let (stack, token) = (stack.clone(), token2.clone());
            Box::pin(async move {
                let st = c.statement(RENEW).await?;
                Ok(c.client.execute(&st, &[&stack, &token, &lease_secs]).await? == 1)
            })
        })
        .await;
        match renewed {
            Ok(true) => {}
            Ok(false) => {
                lost.store(true, Ordering::SeqCst);
                tracing::warn!("lost the lock on stack `{}`: another run took over an expired lease", shared.stack);
                return;
            }
            // Unreachable for now: try again next beat; writes fail on their own if it lasts.
            Err(_) => {}
        }
    }
}

const RENEW: &str = "UPDATE rdeploy.locks SET renewed = now(), expires = now() + make_interval(secs => $3) WHERE stack = $1 AND token = $2";

/// Appends one record, fenced by the lease; a retry after an unknown outcome is a no-op.
const APPEND: &str = "WITH l AS (SELECT 1 FROM rdeploy.locks WHERE stack = $1::text AND token = $2::text FOR SHARE),
     ins AS (INSERT INTO rdeploy.records (journal_id, seq, ts, record)
             SELECT $3::int8, $4::int8, $5::text, $6::jsonb FROM l
             ON CONFLICT (journal_id, seq) DO NOTHING RETURNING 1)
     SELECT (SELECT count(*) FROM l), (SELECT count(*) FROM ins)";

/// Renews the lease with a synchronous commit (flushing the WAL over every record before it)
/// and counts which of the records since the last sync are there.
const SYNC: &str = "WITH l AS (UPDATE rdeploy.locks SET renewed = now(), expires = now() + make_interval(secs => $3)
                         WHERE stack = $1 AND token = $2 RETURNING 1)
     SELECT (SELECT count(*) FROM l), (SELECT coalesce(array_agg(seq), '{}') FROM rdeploy.records WHERE journal_id = $4 AND seq = ANY($5))";

/// Writes records again (after a database crash lost unsynced ones), fenced.
const REWRITE: &str = "WITH l AS (SELECT 1 FROM rdeploy.locks WHERE stack = $1::text AND token = $2::text FOR SHARE)
     INSERT INTO rdeploy.records (journal_id, seq, ts, record)
     SELECT $3::int8, s, t, r FROM l, unnest($4::int8[], $5::text[], $6::jsonb[]) AS u(s, t, r)
     ON CONFLICT (journal_id, seq) DO NOTHING";

/// One deploy's journal in PostgreSQL.
struct PostgresJournal {
    store: PostgresStore,
    journal_id: i64,
    lease: LeaseState,
    /// Records appended since the last `sync`: written, but maybe not yet flushed by the server.
    unsynced: Vec<(i64, String, Value)>,
    /// A write already waited out the retry budget: later ones (the step's failure, the final
    /// report's records) try once, so a run against a dead database stops in bounded time.
    gave_up: bool,
}

impl PostgresJournal {
    fn check_lease(&self) -> anyhow::Result<()> {
        if self.lease.lost.load(Ordering::SeqCst) {
            return Err(self.store.lost_lease());
        }
        Ok(())
    }

    fn budget(&self) -> Duration {
        if self.gave_up {
            Duration::ZERO
        } else {
            self.store.shared.settings.retry
        }
    }

    /// Turns a failed write into the error the driver reports, remembering what it means.
    fn failed(&mut self, e: OpError, what: &str) -> anyhow::Error {
        match e {
            OpError::Fenced => self.lease.lost.store(true, Ordering::SeqCst),
            OpError::Connection(error) => {
                // Only once an earlier write waited out the budget (see `budget`).
                self.gave_up = true;
                return OpError::Unreachable { error, waited: self.store.shared.settings.retry }
                    .into_error(&self.store, what);
            }
            OpError::Unreachable { .. } => self.gave_up = true,
            OpError::Other(_) => {}
        }
        self.store.error(e, what)
    }
}

impl JournalWriter for PostgresJournal {
    fn append(&mut self, entry: &Entry) -> anyhow::Result<()> {
        self.check_lease()?;
        let row = (entry.seq as i64, entry.ts.to_string(), serde_json::to_value(&entry.record)?);
        let (stack, token, id) = (self.store.shared.stack.clone(), self.lease.token.clone(), self.journal_id);
        let written = row.clone();
        let result = self.store.within(self.budget(), Line::Journal, move |c| {
            let (stack, token, (seq, ts, record)) = (stack.clone(), token.clone(), written.clone());
            Box::pin(async move {
                let st = c.statement(APPEND).await?;
                let row = match c.client.query_one(&st, &[&stack, &token, &id, &seq, &ts, &record]).await {
                    Ok(row) => row,
                    // The journal is gone: another run took over and finished the deploy.
                    Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::FOREIGN_KEY_VIOLATION) => {
                        return Err(OpError::Fenced)
                    }
                    Err(e) => return Err(e.into()),
                };
                let (held, inserted): (i64, i64) = (row.get(0), row.get(1));
                if held == 0 {
                    return Err(OpError::Fenced);
                }
                if inserted == 0 {
                    // Already there: an earlier attempt committed before its connection broke.
                    let same = c
                        .client
                        .query_opt(
                            "SELECT 1 FROM rdeploy.records WHERE journal_id = $1 AND seq = $2 AND record = $3",
                            &[&id, &seq, &record],
                        )
                        .await?;
                    if same.is_none() {
                        return Err(OpError::Other(anyhow::anyhow!(
                            "journal record {seq} was already written with other content"
                        )));
                    }
                }
                Ok(())
            })
        });
        if let Err(e) = result {
            return Err(self.failed(e, "writing the checkpoint journal"));
        }
        self.gave_up = false;
        self.unsynced.push(row);
        Ok(())
    }

    fn sync(&mut self) -> anyhow::Result<()> {
        self.check_lease()?;
        let (stack, token, id) = (self.store.shared.stack.clone(), self.lease.token.clone(), self.journal_id);
        let lease_secs = self.store.shared.settings.lease.as_secs_f64();
        let unsynced = self.unsynced.clone();
        let result = self.store.within(self.budget(), Line::Lease, move |c| {
            let (stack, token, unsynced) = (stack.clone(), token.clone(), unsynced.clone());
            Box::pin(async move {
                let seqs: Vec<i64> = unsynced.iter().map(|(s, ..)| *s).collect();
                let st = c.statement(SYNC).await?;
                let row = c.client.query_one(&st, &[&stack, &token, &lease_secs, &id, &seqs]).await?;
                let (held, present): (i64, Vec<i64>) = (row.get(0), row.get(1));
                if held == 0 {
                    return Err(OpError::Fenced);
                }
                let missing: Vec<&(i64, String, Value)> =
                    unsynced.iter().filter(|(s, ..)| !present.contains(s)).collect();
                if !missing.is_empty() {
                    // The database restarted after a crash that lost them: write them again,
                    // durably this time (this line commits synchronously).
                    let s: Vec<i64> = missing.iter().map(|(s, ..)| *s).collect();
                    let t: Vec<String> = missing.iter().map(|(_, t, _)| t.clone()).collect();
                    let r: Vec<Value> = missing.iter().map(|(.., r)| r.clone()).collect();
                    let st = c.statement(REWRITE).await?;
                    c.client.execute(&st, &[&stack, &token, &id, &s, &t, &r]).await?;
                }
                Ok(())
            })
        });
        match result {
            Ok(()) => {
                self.gave_up = false;
                self.unsynced.clear();
                Ok(())
            }
            Err(e) => Err(self.failed(e, "syncing the checkpoint journal")),
        }
    }

    fn snapshot(&mut self, deploy: &Deploy) -> anyhow::Result<()> {
        self.check_lease()?;
        let (stack, token, id) = (self.store.shared.stack.clone(), self.lease.token.clone(), self.journal_id);
        let (seq, deploy) = (deploy.seq as i64, serde_json::to_value(deploy)?);
        // A snapshot is a cache: one attempt, no retry; failing loses nothing.
        self.store
            .once(Line::Journal, move |c| {
                let (stack, token, deploy) = (stack.clone(), token.clone(), deploy.clone());
                Box::pin(async move {
                    c.client
                        .execute(
                            "WITH l AS (SELECT 1 FROM rdeploy.locks WHERE stack = $1::text AND token = $2::text FOR SHARE)
                             INSERT INTO rdeploy.snapshots (journal_id, seq, deploy) SELECT $3::int8, $4::int8, $5::jsonb FROM l
                             ON CONFLICT (journal_id) DO UPDATE SET seq = excluded.seq, deploy = excluded.deploy",
                            &[&stack, &token, &id, &seq, &deploy],
                        )
                        .await?;
                    Ok(())
                })
            })
            .map_err(|e| self.store.error(e, "writing the snapshot"))
    }

    fn archive(&mut self, deploy: &Deploy) -> anyhow::Result<()> {
        self.sync()?;
        let (stack, token, id) = (self.store.shared.stack.clone(), self.lease.token.clone(), self.journal_id);
        let (deploy_id, state, value) = (deploy.deploy_id.clone(), state_name(deploy), serde_json::to_value(deploy)?);
        let result = self.store.within(self.budget(), Line::Lease, move |c| {
            let (stack, token, deploy_id, state, value) =
                (stack.clone(), token.clone(), deploy_id.clone(), state.clone(), value.clone());
            Box::pin(async move {
                let tx = c.client.transaction().await?;
                fence(&tx, &stack, &token).await?;
                let removed = tx.execute("DELETE FROM rdeploy.journals WHERE id = $1", &[&id]).await?;
                if removed == 1 {
                    tx.execute(
                        "INSERT INTO rdeploy.history (stack, deploy_id, state, deploy) VALUES ($1, $2, $3, $4)",
                        &[&stack, &deploy_id, &state, &value],
                    )
                    .await?;
                }
                // removed == 0: an earlier attempt committed before its connection broke.
                tx.commit().await?;
                Ok(())
            })
        });
        if let Err(e) = result {
            return Err(self.failed(e, "archiving the finished deploy"));
        }
        self.store.clear_scratch();
        Ok(())
    }
}

/// Which connection an operation uses (see the module docs on group commit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    Journal,
    Lease,
}

/// A connection with its prepared statements.
struct Conn {
    client: Client,
    statements: HashMap<&'static str, Statement>,
}

impl Conn {
    async fn statement(&mut self, sql: &'static str) -> Result<Statement, tokio_postgres::Error> {
        if let Some(st) = self.statements.get(sql) {
            return Ok(st.clone());
        }
        let st = self.client.prepare(sql).await?;
        self.statements.insert(sql, st.clone());
        Ok(st)
    }
}

type OpFuture<'c, T> = Pin<Box<dyn Future<Output = Result<T, OpError>> + Send + 'c>>;

impl OpError {
    fn into_error(self, store: &PostgresStore, what: &str) -> anyhow::Error {
        store.error(self, what)
    }
}

/// Every write runs in a transaction that first proves this run still holds the lease: a run
/// that lost it (paused, partitioned, taken over) cannot write after the new holder started.
async fn fence(tx: &tokio_postgres::Transaction<'_>, stack: &str, token: &str) -> Result<(), OpError> {
    let held = tx
        .query_opt("SELECT 1 FROM rdeploy.locks WHERE stack = $1 AND token = $2 FOR SHARE", &[&stack, &token])
        .await?;
    held.map(|_| ()).ok_or(OpError::Fenced)
}

#[derive(Debug)]
enum OpError {
    /// The lease is no longer ours: another run took it over.
    Fenced,
    /// The database could not be reached (one attempt).
    Connection(String),
    /// The database stayed unreachable for the whole retry budget.
    Unreachable {
        error: String,
        waited: Duration,
    },
    Other(anyhow::Error),
}

impl From<tokio_postgres::Error> for OpError {
    fn from(e: tokio_postgres::Error) -> OpError {
        if is_connection_error(&e) {
            OpError::Connection(describe(&e))
        } else {
            OpError::Other(anyhow::anyhow!(describe(&e)))
        }
    }
}

/// The message of a database error (tokio-postgres says only "db error" at the top).
fn describe(e: &tokio_postgres::Error) -> String {
    if pg_tls::is_tls_failure(e) {
        let source = std::error::Error::source(e).map(|s| s.to_string()).unwrap_or_else(|| e.to_string());
        return format!(
            "the server's TLS certificate was not accepted ({source}); check `sslrootcert`, or that the URL's host is a name the certificate carries (`sslmode=verify-ca` checks the chain only)"
        );
    }
    match (e.as_db_error(), std::error::Error::source(e)) {
        (Some(db), _) => db.to_string(),
        (None, Some(source)) => format!("{e}: {source}"),
        (None, None) => e.to_string(),
    }
}

/// Errors worth retrying: the connection broke or the server is restarting.
fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    // A certificate that does not verify will not verify on the next attempt either.
    if pg_tls::is_tls_failure(e) {
        return false;
    }
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let code = code.code();
        // 08: connection exception; 57P01-03: shutting down / starting up; 40001/40P01: retry.
        return code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "40001" | "40P01");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    e.to_string().starts_with("timeout")
}

/// Runs `op` on a line's connection (connecting, and migrating the schema, when needed);
/// connection errors are retried with backoff until `budget` is spent.
async fn run<T, F>(shared: &Shared, line: Line, budget: Duration, mut op: F) -> Result<T, OpError>
where
    F: for<'c> FnMut(&'c mut Conn) -> OpFuture<'c, T>,
{
    let start = Instant::now();
    let mut backoff = Duration::from_millis(100);
    loop {
        let error = match attempt(shared, line, &mut op).await {
            Err(OpError::Connection(error)) => error,
            other => return other,
        };
        let waited = start.elapsed();
        if waited + backoff > budget {
            return Err(if budget.is_zero() {
                OpError::Connection(error)
            } else {
                OpError::Unreachable { error, waited }
            });
        }
        tracing::warn!("the state database {} is unreachable ({error}); retrying in {backoff:?}", shared.display);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn attempt<T, F>(shared: &Shared, line: Line, op: &mut F) -> Result<T, OpError>
where
    F: for<'c> FnMut(&'c mut Conn) -> OpFuture<'c, T>,
{
    let mut slot = match line {
        Line::Journal => shared.journal_line.lock().await,
        Line::Lease => shared.lease_line.lock().await,
    };
    if slot.as_ref().is_none_or(|c| c.client.is_closed()) {
        *slot = None;
        *slot = Some(connect(shared, line).await?);
    }
    let conn = slot.as_mut().expect("connected above");
    let result = match tokio::time::timeout(shared.settings.retry.max(shared.settings.timeout), op(conn)).await {
        Ok(result) => result,
        Err(_) => Err(OpError::Connection("no answer from the database".into())),
    };
    if matches!(result, Err(OpError::Connection(_))) {
        // Start afresh next time: the connection may be half-dead.
        *slot = None;
    }
    result
}

async fn connect(shared: &Shared, line: Line) -> Result<Conn, OpError> {
    let mut config = shared.config.clone();
    if line == Line::Journal {
        // Records are acknowledged once on the server; `sync` (the lease line) makes them durable.
        config.options("-c synchronous_commit=off");
    }
    let (mut client, connection) =
        match tokio::time::timeout(shared.settings.timeout, config.connect(shared.tls.clone())).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) if is_connection_error(&e) => return Err(OpError::Connection(describe(&e))),
            Ok(Err(e)) => {
                return Err(OpError::Other(anyhow::anyhow!(
                    "could not connect to {}: {}",
                    shared.display,
                    describe(&e)
                )))
            }
            Err(_) => return Err(OpError::Connection("timed out connecting".into())),
        };
    tokio::spawn(async move {
        let _ = connection.await;
    });
    if !shared.migrated.load(Ordering::SeqCst) {
        match schema::migrate(&mut client).await {
            Ok(_) => shared.migrated.store(true, Ordering::SeqCst),
            Err(e) => match e.downcast::<tokio_postgres::Error>() {
                Ok(e) => return Err(e.into()),
                Err(e) => return Err(OpError::Other(e)),
            },
        }
    }
    Ok(Conn { client, statements: HashMap::new() })
}

/// A thread running a current-thread runtime that owns the store's connections.
struct Worker {
    handle: tokio::runtime::Handle,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Worker {
    fn start() -> anyhow::Result<Worker> {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let handle = runtime.handle().clone();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new().name("rdeploy-postgres".into()).spawn(move || {
            let _ = runtime.block_on(stop);
        })?;
        Ok(Worker { handle, shutdown: Some(shutdown) })
    }

    /// Runs a future on the worker and waits for its answer.
    fn call<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        self.handle.spawn(async move {
            let _ = tx.send(fut.await);
        });
        let wait = move || rx.recv().expect("the postgres store's thread stopped");
        match tokio::runtime::Handle::try_current() {
            // Lend this worker's other tasks to another thread while we wait.
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(wait)
            }
            _ => wait(),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

#[cfg(test)]
#[path = "../../../tests/common/postgres.rs"]
pub(crate) mod test_server;

#[cfg(test)]
mod tests {
    use super::*;

    fn warning(seq: u64, message: &str) -> Entry {
        Entry { seq, ts: now(), record: Record::Warning { step: None, message: message.into() } }
    }

    /// A one-second lease that nothing renews, so a test can let it run out.
    fn short_lease(url: &str) -> PostgresStore {
        lease_of(url, Duration::from_secs(1))
    }

    /// A lease of `lease` that nothing renews.
    fn lease_of(url: &str, lease: Duration) -> PostgresStore {
        let settings = Settings {
            lease,
            heartbeat: Duration::from_secs(3600),
            retry: Duration::from_secs(2),
            timeout: Duration::from_secs(5),
        };
        PostgresStore::with_settings(url, "s", None, settings).unwrap()
    }

    #[test]
    fn a_lease_is_taken_over_only_once_expired_and_the_old_holder_is_fenced() {
        let server = test_server::PgServer::start();
        // b's own lease is long: the checks after its takeover must not race its expiry on a
        // loaded machine (a lease nothing renews, 1 s, ran out before `b.holder()` at load 72).
        let (a, b) = (short_lease(&server.url()), lease_of(&server.url(), Duration::from_secs(120)));
        let lock_a = a.lock("up").unwrap();
        let mut journal_a = a.create_journal().unwrap();
        journal_a.append(&warning(1, "from a")).unwrap();
        journal_a.sync().unwrap();
        assert!(matches!(b.lock("recover"), Err(LockError::Held { .. })), "a live lease is not taken over");

        std::thread::sleep(Duration::from_millis(1300));
        let lock_b = b.lock("recover").unwrap();
        let old = lock_b.took_over_from().expect("the expired holder is named");
        assert_eq!((old.pid, old.command.as_str()), (std::process::id(), "up"));

        let err = journal_a.append(&warning(2, "from a, too late")).unwrap_err().to_string();
        assert!(err.contains("lost the lock on stack `s`"), "{err}");
        assert!(journal_a.sync().is_err(), "a lost lease stays lost");
        let (mut journal_b, deploy) = b.open_journal().unwrap();
        assert_eq!((deploy.seq, deploy.warnings.clone()), (1, vec!["from a".to_string()]));
        journal_b.append(&warning(2, "from b")).unwrap();
        journal_b.sync().unwrap();
        assert_eq!(
            server.psql("SELECT string_agg(record->>'message', ',' ORDER BY seq) FROM rdeploy.records"),
            "from a,from b"
        );

        // The old guard's release must not free the new holder's lease.
        drop(lock_a);
        assert_eq!(b.holder().unwrap().command, "recover");
        drop(lock_b);
        assert!(b.holder().is_none());
        assert_eq!(
            server.psql("SELECT string_agg(version::text, ',' ORDER BY version) FROM rdeploy.schema_migrations"),
            "1,2"
        );
    }

    #[test]
    fn sync_writes_again_records_a_database_crash_lost() {
        let server = test_server::PgServer::start();
        let store = short_lease(&server.url());
        let _lock = store.lock("up").unwrap();
        let mut journal = store.create_journal().unwrap();
        journal.append(&warning(1, "one")).unwrap();
        journal.append(&warning(2, "two")).unwrap();
        // As if the server crashed before flushing the second, asynchronously committed record.
        server.psql("DELETE FROM rdeploy.records WHERE seq = 2");
        journal.sync().unwrap();
        assert_eq!(store.load_unfinished().unwrap().unwrap().warnings, ["one", "two"]);
        // Retrying a record that did land is a no-op; different content under its number is not.
        journal.append(&warning(2, "two")).unwrap();
        let err = format!("{:#}", journal.append(&warning(2, "other")).unwrap_err());
        assert!(err.contains("already written with other content"), "{err}");
    }

    #[test]
    fn urls_are_shown_without_their_password() {
        assert_eq!(
            redact("postgres://ci:s3cret@db.internal:5432/rdeploy?sslmode=disable"),
            "postgres://ci@db.internal:5432/rdeploy"
        );
        assert_eq!(redact("postgresql://db/rdeploy"), "postgresql://db/rdeploy");
        assert!(!PostgresStore::open("postgres://u:pw@h/db", "s", None).unwrap().location().contains("pw"));
    }

    #[test]
    fn only_postgres_urls_are_accepted() {
        assert!(is_url("postgres://h/db") && is_url("postgresql://h/db") && !is_url("./state"));
        let err = PostgresStore::open("mysql://h/db", "s", None).err().unwrap();
        assert!(err.to_string().contains("not a PostgreSQL URL"), "{err}");
    }
}
