//! The PostgreSQL store's schema: numbered migrations, applied in order on first use and
//! recorded in `rdeploy.schema_migrations`, so an older database is upgraded in place and a
//! newer one (written by a later rdeploy) is refused instead of misread.

use tokio_postgres::Client;

/// Every migration, oldest first. Never edit one that has shipped: add the next number.
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "journals, records, snapshots, history and locks keyed by stack",
        r#"
        -- One row per unfinished deploy; at most one per stack.
        CREATE TABLE rdeploy.journals (
            id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            stack    text NOT NULL UNIQUE,
            format   text NOT NULL,
            version  integer NOT NULL,
            created  text NOT NULL
        );
        -- One row per journal record, in sequence; removed with its journal.
        CREATE TABLE rdeploy.records (
            journal_id bigint NOT NULL REFERENCES rdeploy.journals (id) ON DELETE CASCADE,
            seq        bigint NOT NULL,
            ts         text NOT NULL,
            record     jsonb NOT NULL,
            PRIMARY KEY (journal_id, seq)
        );
        -- The folded state up to `seq`: a cache, so loading need not replay every record.
        CREATE TABLE rdeploy.snapshots (
            journal_id bigint PRIMARY KEY REFERENCES rdeploy.journals (id) ON DELETE CASCADE,
            seq        bigint NOT NULL,
            deploy     jsonb NOT NULL
        );
        -- The final state of every finished deploy (complete, reverted or reset).
        CREATE TABLE rdeploy.history (
            id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            stack     text NOT NULL,
            deploy_id text NOT NULL,
            state     text NOT NULL,
            finished  timestamptz NOT NULL DEFAULT now(),
            deploy    jsonb NOT NULL
        );
        -- The lock of each stack: a lease its holder renews; another run may take it over
        -- only once `expires` has passed (by the database's clock, so runners' clocks may drift).
        CREATE TABLE rdeploy.locks (
            stack     text PRIMARY KEY,
            token     text NOT NULL,
            pid       integer NOT NULL,
            host      text NOT NULL,
            command   text NOT NULL,
            started   text NOT NULL,
            renewed   timestamptz NOT NULL,
            expires   timestamptz NOT NULL
        );
        "#,
    ),
    (
        2,
        "index history by stack, newest first",
        "CREATE INDEX history_stack_newest ON rdeploy.history (stack, id DESC);",
    ),
];

/// An arbitrary constant: the advisory lock that keeps two runners from migrating at once.
const MIGRATION_LOCK: i64 = 0x7264_6570_6c6f_7901;

/// Brings the schema up to date. Safe to run concurrently from many runners.
pub async fn migrate(client: &mut Client) -> anyhow::Result<i32> {
    // The common case, read-only: a role that may use the tables but not create schemas in the
    // database works once they exist.
    let current: Option<i32> = client
        .query_one(
            // Fails (and so migrates) while the table does not exist.
            "SELECT coalesce(max(version), 0) FROM rdeploy.schema_migrations",
            &[],
        )
        .await
        .ok()
        .and_then(|row| row.get(0));
    match current {
        Some(v) if v == latest() => return Ok(v),
        Some(v) if v > latest() => anyhow::bail!(
            "the state database's schema is version {v}, newer than this rdeploy knows (version {}); upgrade rdeploy on this runner",
            latest()
        ),
        _ => {}
    }
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
    tx.batch_execute(
        "CREATE SCHEMA IF NOT EXISTS rdeploy;
         CREATE TABLE IF NOT EXISTS rdeploy.schema_migrations (
             version integer PRIMARY KEY,
             name    text NOT NULL,
             applied timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await?;
    let current: i32 =
        tx.query_one("SELECT coalesce(max(version), 0) FROM rdeploy.schema_migrations", &[]).await?.get(0);
    let latest = latest();
    if current > latest {
        anyhow::bail!(
            "the state database's schema is version {current}, newer than this rdeploy knows (version {latest}); upgrade rdeploy on this runner"
        );
    }
    for (version, name, sql) in MIGRATIONS.iter().filter(|(v, ..)| *v > current) {
        tx.batch_execute(sql).await.map_err(|e| anyhow::anyhow!("schema migration {version} ({name}) failed: {e}"))?;
        tx.execute("INSERT INTO rdeploy.schema_migrations (version, name) VALUES ($1, $2)", &[version, name]).await?;
    }
    tx.commit().await?;
    Ok(latest)
}

pub fn latest() -> i32 {
    MIGRATIONS.last().map(|(v, ..)| *v).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_one_by_one_from_one() {
        for (i, (version, name, sql)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*version, i as i32 + 1, "migration {name} is out of order");
            assert!(!sql.trim().is_empty());
            assert!(sql.contains("rdeploy."), "migration {version} must name the rdeploy schema");
        }
    }
}
