//! Bulk insert by `COPY awa.jobs (...) FROM STDIN` in PostgreSQL's binary format.
//!
//! The binary format is used instead of text or CSV so that nothing needs escaping: every
//! field is sent as its length and its bytes (JSON text behind a version byte for `jsonb`, an
//! array header for `text[]`), so backslashes, tabs, newlines and quotes in args, metadata or
//! tags reach the table exactly as they were.
//!
//! COPY is one statement: on a connection outside a transaction it commits or fails as a whole,
//! and inside a caller's transaction it commits or rolls back with it. It fires the table's
//! statement-level `AFTER INSERT` trigger (with its transition table) once, so workers are
//! woken as after `insert_jobs`.

use super::insert::kinds_summary;
use crate::error::{is_unique_conflict, AwaError, Result};
use crate::model::job::JOB_COLUMNS;
use crate::model::{JobRow, NewJob};
use chrono::{DateTime, TimeZone, Utc};
use sqlx::PgConnection;

/// Rows are encoded into a buffer that is sent whenever it passes this size, so memory stays
/// flat whatever the batch size.
const CHUNK_BYTES: usize = 256 * 1024;

/// The 11-byte signature, the flags word and the header-extension length of binary COPY.
const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";

/// `text`'s type OID: the element type a binary `text[]` must name.
const TEXT_OID: i32 = 25;

/// The COPY statement: `id` first when the ids were drawn beforehand
/// ([`insert_many_copy_returning`]); `state` and `run_at` last when some job has a `run_at`
/// (without one they are left to their column defaults: 'available', the database's `now()`).
fn copy_statement(with_ids: bool, with_run_at: bool) -> String {
    format!(
        "COPY awa.canonical_jobs ({}kind, queue, args, priority, max_attempts, tags, metadata, unique_key, \
         unique_states, ordering_key{}) FROM STDIN (FORMAT binary)",
        if with_ids { "id, " } else { "" },
        if with_run_at { ", state, run_at" } else { "" },
    )
}

/// Insert already-validated jobs with one `COPY ... FROM STDIN` and return how many rows were
/// written. All or nothing: a unique conflict on any row (with a stored job or within the
/// batch) fails the whole COPY with [`AwaError::UniqueConflict`] and writes nothing.
///
/// It takes a connection, not a pool, so that it can run inside a caller's transaction
/// (`&mut *tx`); an error then leaves that transaction aborted, as any failed statement does.
///
/// A job without `run_at` runs at the database's `now()` and is available; a job with one is
/// scheduled when that time is after the database's `now()` (read once per batch, and only
/// when some job has a `run_at`), as `insert_jobs` decides.
///
/// Not cancel-safe: dropping the future in the middle of the stream leaves the connection in
/// COPY mode, so a caller that may cancel should run it to completion on a task of its own.
pub async fn insert_many_copy(conn: &mut PgConnection, jobs: &[NewJob]) -> Result<u64> {
    copy_jobs(conn, jobs, None).await
}

/// [`insert_many_copy`], returning the inserted rows in input order (what awa-pg's
/// `insert_many_copy` returns). COPY cannot return rows, so the ids are drawn from the
/// table's sequence first (one statement), sent with the rows, and the rows read back by id
/// on the same connection: three statements instead of one, and the rows cost what reading
/// and converting them costs. A job a worker claimed in between is returned as it is then.
pub async fn insert_many_copy_returning(
    conn: &mut PgConnection,
    jobs: &[NewJob],
) -> Result<Vec<JobRow>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<i64> = sqlx::query_scalar(
        "SELECT nextval(pg_get_serial_sequence('awa.canonical_jobs', 'id')) FROM generate_series(1, $1)",
    )
    .bind(jobs.len() as i64)
    .fetch_all(&mut *conn)
    .await?;
    copy_jobs(conn, jobs, Some(&ids)).await?;
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLUMNS} FROM unnest($1::bigint[]) WITH ORDINALITY AS t(id, ord)
         JOIN awa.canonical_jobs USING (id) ORDER BY t.ord"
    ))
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| JobRow::from_row(r).map_err(AwaError::from))
        .collect()
}

async fn copy_jobs(conn: &mut PgConnection, jobs: &[NewJob], ids: Option<&[i64]>) -> Result<u64> {
    if jobs.is_empty() {
        return Ok(0);
    }
    let now = if jobs.iter().any(|j| j.run_at.is_some()) {
        let now: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *conn)
            .await?;
        Some(now)
    } else {
        None
    };
    let statement = copy_statement(ids.is_some(), now.is_some());
    let result = stream(
        conn,
        &statement,
        jobs.iter().enumerate(),
        |buf, (i, job)| encode_row(buf, job, ids.and_then(|ids| ids.get(i).copied()), now),
    )
    .await;
    match result {
        Ok(n) => {
            crate::metrics::series::record_each(
                jobs.iter().map(|j| (j.kind.as_str(), j.queue.as_str())),
                crate::metrics::series::JobEvent::Inserted,
            );
            Ok(n)
        }
        Err(CopyError::Db(e)) if is_unique_conflict(&e) => Err(AwaError::UniqueConflict {
            kind: if jobs.len() == 1 {
                jobs[0].kind.clone()
            } else {
                kinds_summary(jobs)
            },
        }),
        Err(e) => Err(e.into()),
    }
}

/// Why streaming stopped: the database refused (mapped by the caller) or a row could not be
/// encoded (the COPY was aborted first).
pub(crate) enum CopyError {
    Db(sqlx::Error),
    Encode(AwaError),
}

impl From<CopyError> for AwaError {
    fn from(e: CopyError) -> Self {
        match e {
            CopyError::Db(e) => e.into(),
            CopyError::Encode(e) => e,
        }
    }
}

impl From<sqlx::Error> for CopyError {
    fn from(e: sqlx::Error) -> Self {
        CopyError::Db(e)
    }
}

/// Run a binary `COPY ... FROM STDIN` (`statement`), encoding each item with `encode` (one
/// tuple: its field count, then its fields, with the `put_*` helpers) and sending the buffer in
/// chunks; returns the rows written.
pub(crate) async fn stream<T>(
    conn: &mut PgConnection,
    statement: &str,
    items: impl Iterator<Item = T>,
    mut encode: impl FnMut(&mut Vec<u8>, T) -> std::result::Result<(), AwaError>,
) -> std::result::Result<u64, CopyError> {
    let mut copy = conn.copy_in_raw(statement).await?;
    let mut buf = Vec::with_capacity(CHUNK_BYTES + 4096);
    buf.extend_from_slice(HEADER);
    for item in items {
        if let Err(e) = encode(&mut buf, item) {
            // Ends the COPY on the server (nothing is written) and leaves the connection usable.
            copy.abort(e.to_string()).await?;
            return Err(CopyError::Encode(e));
        }
        if buf.len() >= CHUNK_BYTES {
            copy.send(buf.as_slice()).await?;
            buf.clear();
        }
    }
    // The trailer: a field count of -1.
    buf.extend_from_slice(&(-1i16).to_be_bytes());
    copy.send(buf.as_slice()).await?;
    Ok(copy.finish().await?)
}

/// Append one tuple in the order of the statement's column list.
fn encode_row(
    buf: &mut Vec<u8>,
    job: &NewJob,
    id: Option<i64>,
    now: Option<DateTime<Utc>>,
) -> std::result::Result<(), AwaError> {
    let fields: i16 = 10 + i16::from(id.is_some()) + if now.is_some() { 2 } else { 0 };
    buf.extend_from_slice(&fields.to_be_bytes());
    if let Some(id) = id {
        put_bytes(buf, &id.to_be_bytes())?;
    }
    put_bytes(buf, job.kind.as_bytes())?;
    put_bytes(buf, job.queue.as_bytes())?;
    put_jsonb(buf, &job.args)?;
    put_bytes(buf, &job.priority.to_be_bytes())?;
    put_bytes(buf, &job.max_attempts.to_be_bytes())?;
    put_text_array(buf, &job.tags)?;
    put_jsonb(buf, &job.metadata)?;
    match &job.unique_key {
        Some(key) => put_bytes(buf, key)?,
        None => put_null(buf),
    }
    match job.unique_states {
        Some(states) => put_bytes(buf, &i16::from(states).to_be_bytes())?,
        None => put_null(buf),
    }
    match &job.ordering_key {
        Some(key) => put_bytes(buf, key.as_bytes())?,
        None => put_null(buf),
    }
    if let Some(now) = now {
        let run_at = job.run_at.unwrap_or(now);
        let state = if run_at > now {
            "scheduled"
        } else {
            "available"
        };
        put_bytes(buf, state.as_bytes())?;
        put_bytes(buf, &pg_timestamp(run_at)?.to_be_bytes())?;
    }
    Ok(())
}

pub(crate) fn put_null(buf: &mut Vec<u8>) {
    buf.extend_from_slice(&(-1i32).to_be_bytes());
}

fn field_len(len: usize) -> std::result::Result<i32, AwaError> {
    i32::try_from(len).map_err(|_| {
        AwaError::Serialization(format!(
            "a field of {len} bytes does not fit a COPY row (the limit is {} bytes)",
            i32::MAX
        ))
    })
}

pub(crate) fn put_bytes(buf: &mut Vec<u8>, bytes: &[u8]) -> std::result::Result<(), AwaError> {
    buf.extend_from_slice(&field_len(bytes.len())?.to_be_bytes());
    buf.extend_from_slice(bytes);
    Ok(())
}

/// `jsonb`'s binary form: version byte 1, then the JSON text. The text is written straight
/// into the buffer and its length filled in afterwards.
pub(crate) fn put_jsonb(
    buf: &mut Vec<u8>,
    value: &serde_json::Value,
) -> std::result::Result<(), AwaError> {
    let at = buf.len();
    buf.extend_from_slice(&0i32.to_be_bytes());
    buf.push(1);
    serde_json::to_writer(&mut *buf, value)?;
    let len = field_len(buf.len() - at - 4)?;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// A one-dimensional `text[]` without NULLs (an empty one has no dimensions).
pub(crate) fn put_text_array(
    buf: &mut Vec<u8>,
    items: &[String],
) -> std::result::Result<(), AwaError> {
    let at = buf.len();
    buf.extend_from_slice(&0i32.to_be_bytes());
    let dims: i32 = if items.is_empty() { 0 } else { 1 };
    buf.extend_from_slice(&dims.to_be_bytes());
    buf.extend_from_slice(&0i32.to_be_bytes()); // no NULL elements
    buf.extend_from_slice(&TEXT_OID.to_be_bytes());
    if !items.is_empty() {
        buf.extend_from_slice(&field_len(items.len())?.to_be_bytes());
        buf.extend_from_slice(&1i32.to_be_bytes()); // lower bound
        for item in items {
            put_bytes(buf, item.as_bytes())?;
        }
    }
    let len = field_len(buf.len() - at - 4)?;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    Ok(())
}

/// `timestamptz`'s binary form: microseconds since 2000-01-01 00:00 UTC (truncated, as sqlx
/// encodes a bound `DateTime` for `insert_jobs`).
pub(crate) fn pg_timestamp(at: DateTime<Utc>) -> std::result::Result<i64, AwaError> {
    let epoch = Utc
        .with_ymd_and_hms(2000, 1, 1, 0, 0, 0)
        .single()
        .ok_or_else(|| AwaError::State("the PostgreSQL epoch is not a valid time".into()))?;
    (at - epoch)
        .num_microseconds()
        .ok_or_else(|| AwaError::Serialization(format!("run_at {at} is out of range")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job() -> NewJob {
        crate::model::validate("k", json!({"a": "x\ty\\z\n"}), &Default::default()).expect("valid")
    }

    #[test]
    fn row_layout_without_run_at() {
        let mut buf = Vec::new();
        encode_row(&mut buf, &job(), None, None).expect("encode");
        assert_eq!(&buf[..2], &10i16.to_be_bytes());
        // kind: length 1, "k".
        assert_eq!(&buf[2..7], &[0, 0, 0, 1, b'k']);
        // queue: "default".
        assert_eq!(&buf[7..11], &7i32.to_be_bytes());
        assert_eq!(&buf[11..18], b"default");
        // args: version 1 and the JSON text, escapes kept as JSON escapes.
        let text = br#"{"a":"x\ty\\z\n"}"#;
        assert_eq!(&buf[18..22], &(text.len() as i32 + 1).to_be_bytes());
        assert_eq!(buf[22], 1);
        assert_eq!(&buf[23..23 + text.len()], text);
    }

    #[test]
    fn text_arrays_empty_and_not() {
        let mut empty = Vec::new();
        put_text_array(&mut empty, &[]).expect("encode");
        assert_eq!(empty.len(), 4 + 12);
        assert_eq!(&empty[..4], &12i32.to_be_bytes());
        let mut two = Vec::new();
        put_text_array(&mut two, &["a".into(), "b,c".into()]).expect("encode");
        // header 12 + one dimension 8 + (4 + 1) + (4 + 3)
        assert_eq!(&two[..4], &32i32.to_be_bytes());
        assert_eq!(&two[16..20], &2i32.to_be_bytes());
    }

    #[test]
    fn timestamps_count_from_2000() {
        let t = Utc
            .with_ymd_and_hms(2000, 1, 1, 0, 0, 1)
            .single()
            .expect("time");
        assert_eq!(pg_timestamp(t).expect("in range"), 1_000_000);
        let early = Utc
            .with_ymd_and_hms(1, 1, 1, 0, 0, 0)
            .single()
            .expect("time");
        assert!(pg_timestamp(early).expect("in range") < 0);
    }
}
