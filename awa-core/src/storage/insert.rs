//! Inserting jobs. Every function takes any executor, so a caller's transaction works and the
//! job commits (or rolls back) with the caller's own rows.

use crate::error::{is_unique_conflict, AwaError, Result};
use crate::model::job::JOB_COLUMNS;
use crate::model::{validate, EnqueueRequest, InsertOpts, JobArgs, JobRow, NewJob};
use sqlx::postgres::PgArguments;
use sqlx::query::Query;
use sqlx::{PgConnection, PgExecutor, Postgres, Row};

/// Validate typed args with options into a [`NewJob`].
pub fn prepare<A: JobArgs>(request: &EnqueueRequest<A>) -> Result<NewJob> {
    let args = serde_json::to_value(&request.args)?;
    Ok(validate(&A::kind(), args, &request.opts)?)
}

/// Insert one job with default options.
pub async fn insert<'e, E, A>(executor: E, args: A) -> Result<JobRow>
where
    E: PgExecutor<'e>,
    A: JobArgs,
{
    insert_with(executor, EnqueueRequest::new(args)).await
}

/// Insert one job with options.
pub async fn insert_with<'e, E, A>(
    executor: E,
    request: impl Into<EnqueueRequest<A>>,
) -> Result<JobRow>
where
    E: PgExecutor<'e>,
    A: JobArgs,
{
    let job = prepare(&request.into())?;
    let mut rows = insert_jobs(executor, std::slice::from_ref(&job)).await?;
    rows.pop()
        .ok_or_else(|| AwaError::State("insert returned no row".into()))
}

/// Insert many jobs of one args type in one statement: all or nothing.
pub async fn insert_many<'e, E, A>(
    executor: E,
    requests: Vec<EnqueueRequest<A>>,
) -> Result<Vec<JobRow>>
where
    E: PgExecutor<'e>,
    A: JobArgs,
{
    let jobs = requests.iter().map(prepare).collect::<Result<Vec<_>>>()?;
    insert_jobs(executor, &jobs).await
}

/// Insert an untyped job (kind + JSON args) with options.
pub async fn insert_untyped<'e, E>(
    executor: E,
    kind: &str,
    args: serde_json::Value,
    opts: &InsertOpts,
) -> Result<JobRow>
where
    E: PgExecutor<'e>,
{
    let job = validate(kind, args, opts)?;
    let mut rows = insert_jobs(executor, std::slice::from_ref(&job)).await?;
    rows.pop()
        .ok_or_else(|| AwaError::State("insert returned no row".into()))
}

/// Insert already-validated jobs in one statement, returning them in input order.
/// A unique conflict on any row fails the whole statement with [`AwaError::UniqueConflict`].
pub async fn insert_jobs<'e, E>(executor: E, jobs: &[NewJob]) -> Result<Vec<JobRow>>
where
    E: PgExecutor<'e>,
{
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    if let [job] = jobs {
        return insert_single(executor, job).await.map(|row| vec![row]);
    }
    let sql = format!("{INSERT_UNNEST} ORDER BY t.ord RETURNING {JOB_COLUMNS}");
    let n = jobs.len();
    let ord: Vec<i32> = (0..n as i32).collect();
    let result = JobColumns::new(jobs.iter())
        .bind(sqlx::query(&sql))
        .bind(ord)
        .fetch_all(executor)
        .await;
    match result {
        Ok(rows) => {
            record_inserted(jobs);
            rows.iter()
                .map(|r| JobRow::from_row(r).map_err(AwaError::from))
                .collect()
        }
        Err(e) if is_unique_conflict(&e) => {
            let kind = if n == 1 {
                jobs[0].kind.clone()
            } else {
                kinds_summary(jobs)
            };
            Err(AwaError::UniqueConflict { kind })
        }
        Err(e) => Err(e.into()),
    }
}

/// A multi-row insert of [`JobColumns`] (bound as $1–$11, with $12 each row's position),
/// up to its `ORDER BY`: the rows are inserted, and so numbered and returned, in that order.
const INSERT_UNNEST: &str =
    "INSERT INTO awa.canonical_jobs (kind, queue, args, state, priority, max_attempts, run_at, tags,
                           metadata, unique_key, unique_states, ordering_key)
     SELECT t.kind, t.queue, t.args,
            CASE WHEN t.run_at IS NULL OR t.run_at <= now() THEN 'available' ELSE 'scheduled' END,
            t.priority, t.max_attempts, coalesce(t.run_at, now()),
            CASE WHEN t.tags = '[]'::jsonb THEN '{}'::text[]
                 ELSE ARRAY(SELECT jsonb_array_elements_text(t.tags)) END, t.metadata, t.unique_key,
            t.unique_states, t.ordering_key
     FROM unnest($1::text[], $2::text[], $3::jsonb[], $4::smallint[], $5::int[],
                 $6::timestamptz[], $7::jsonb[], $8::jsonb[], $9::bytea[], $10::smallint[],
                 $11::text[], $12::int[])
          AS t(kind, queue, args, priority, max_attempts, run_at, tags, metadata,
               unique_key, unique_states, ordering_key, ord)";

/// The follow-ups of a batch of completions, in one statement.
///
/// Deduplication is `ON CONFLICT DO NOTHING` with `idx_awa_jobs_unique`'s key and predicate
/// as the arbiter: a follow-up whose key that index already holds (a committed row, or one
/// this statement inserted earlier) is skipped without a subtransaction, and a conflict on
/// any other unique index is an error, as on the per-job path. The only trigger on
/// `awa.jobs` is the statement-level wake-up (`awa_jobs_notify`), which sees only the rows
/// inserted, so nothing turns a skipped row into an error or a write. The wake-up is deferred
/// (`awa.defer_notify`, migration 3) by the `defer` CTE, which the executor evaluates before
/// the first row is inserted and so before the statement's trigger fires.
const INSERT_FOLLOW_UPS: &str = "WITH defer AS MATERIALIZED (
         SELECT set_config('awa.defer_notify', 'on', true) AS setting)";

/// Insert the follow-ups of a batch of completions inside the caller's open transaction, in
/// the order given, in one statement (see [`INSERT_FOLLOW_UPS`]); the queues are woken by the
/// caller after its commit. Returns what happened to each follow-up, in the order given.
///
/// The statement returns the inserted rows in insertion order, each with its unique key and
/// states, so the inserted follow-ups are the subsequence of the input that matches the
/// returned rows one after another. A follow-up with no key is always inserted, and of
/// several with one key and states the first offered is inserted and the rest skipped; the
/// one exception (the row holding the key is released by another transaction between two of
/// them, so a later one is inserted) is reported as the earlier one, which only changes the
/// trigger job named by the debug log.
pub(crate) async fn insert_follow_ups_in_tx(
    conn: &mut PgConnection,
    jobs: &[&NewJob],
) -> Result<Vec<FollowUpInsert>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let sql = format!(
        "{INSERT_FOLLOW_UPS} {INSERT_UNNEST} CROSS JOIN defer
         ORDER BY t.ord
         ON CONFLICT (unique_key)
             WHERE unique_key IS NOT NULL AND (unique_states & awa.state_bit(state)) <> 0
             DO NOTHING
         RETURNING id, unique_key, unique_states"
    );
    let ord: Vec<i32> = (0..jobs.len() as i32).collect();
    let rows = JobColumns::new(jobs.iter().copied())
        .bind(sqlx::query(&sql))
        .bind(ord)
        .fetch_all(&mut *conn)
        .await?;
    let mut inserted = Vec::with_capacity(rows.len());
    for row in &rows {
        let id: i64 = row.try_get(0)?;
        let key: Option<Vec<u8>> = row.try_get(1)?;
        let states: Option<i16> = row.try_get(2)?;
        inserted.push((id, key, states));
    }
    let mut next = inserted.into_iter().peekable();
    let results = jobs
        .iter()
        .map(|job| {
            let states = job.unique_states.map(i16::from);
            match next
                .next_if(|(_, key, s)| key.as_deref() == job.unique_key.as_deref() && *s == states)
            {
                Some((id, _, _)) => FollowUpInsert::Inserted(id),
                None => FollowUpInsert::SkippedDuplicate,
            }
        })
        .collect::<Vec<_>>();
    if next.next().is_some() {
        return Err(AwaError::State(
            "a batch of follow-ups returned rows it was not sent".into(),
        ));
    }
    Ok(results)
}

/// Jobs as one array per column, for statements that take many jobs at once (`unnest`, or a
/// function looping over them). Bound in the insert's column order: kind, queue, args,
/// priority, max_attempts, run_at, tags (each a JSON array), metadata, unique_key,
/// unique_states, ordering_key.
pub(crate) struct JobColumns<'a> {
    kinds: Vec<&'a str>,
    queues: Vec<&'a str>,
    args: Vec<&'a serde_json::Value>,
    priorities: Vec<i16>,
    attempts: Vec<i32>,
    run_ats: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    tags: Vec<serde_json::Value>,
    metadata: Vec<&'a serde_json::Value>,
    keys: Vec<Option<&'a [u8]>>,
    states: Vec<Option<i16>>,
    ordering: Vec<Option<&'a str>>,
}

impl<'a> JobColumns<'a> {
    pub(crate) fn new(jobs: impl Iterator<Item = &'a NewJob>) -> Self {
        let n = jobs.size_hint().0;
        let mut c = JobColumns {
            kinds: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
            args: Vec::with_capacity(n),
            priorities: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            run_ats: Vec::with_capacity(n),
            tags: Vec::with_capacity(n),
            metadata: Vec::with_capacity(n),
            keys: Vec::with_capacity(n),
            states: Vec::with_capacity(n),
            ordering: Vec::with_capacity(n),
        };
        for j in jobs {
            c.kinds.push(j.kind.as_str());
            c.queues.push(j.queue.as_str());
            c.args.push(&j.args);
            c.priorities.push(j.priority);
            c.attempts.push(j.max_attempts);
            c.run_ats.push(j.run_at);
            c.tags.push(serde_json::Value::from(j.tags.clone()));
            c.metadata.push(&j.metadata);
            c.keys.push(j.unique_key.as_deref());
            c.states.push(j.unique_states.map(i16::from));
            c.ordering.push(j.ordering_key.as_deref());
        }
        c
    }

    /// Bind the eleven arrays, in column order, onto `query`.
    pub(crate) fn bind<'q>(
        self,
        query: Query<'q, Postgres, PgArguments>,
    ) -> Query<'q, Postgres, PgArguments>
    where
        'a: 'q,
    {
        query
            .bind(self.kinds)
            .bind(self.queues)
            .bind(self.args)
            .bind(self.priorities)
            .bind(self.attempts)
            .bind(self.run_ats)
            .bind(self.tags)
            .bind(self.metadata)
            .bind(self.keys)
            .bind(self.states)
            .bind(self.ordering)
    }
}

/// One job: a plain `VALUES` insert, cheaper to plan and run than the bulk `unnest` form.
async fn insert_single<'e, E>(executor: E, job: &NewJob) -> Result<JobRow>
where
    E: PgExecutor<'e>,
{
    let sql = format!("{SINGLE_INSERT} {JOB_COLUMNS}");
    let result = bind_job(sqlx::query(&sql), job).fetch_one(executor).await;
    match result {
        Ok(row) => {
            record_inserted(std::slice::from_ref(job));
            Ok(JobRow::from_row(&row)?)
        }
        Err(e) if is_unique_conflict(&e) => Err(AwaError::UniqueConflict {
            kind: job.kind.clone(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Count inserted jobs by kind and queue (when the statement returned: inside an open
/// transaction that later rolls back they are still counted, as statements executed).
fn record_inserted(jobs: &[NewJob]) {
    crate::metrics::series::record_each(
        jobs.iter().map(|j| (j.kind.as_str(), j.queue.as_str())),
        crate::metrics::series::JobEvent::Inserted,
    );
}

/// Bind one job's eleven columns, in the insert's column order ($1–$11 of [`SINGLE_INSERT`]
/// and of `awa.insert_follow_up`).
fn bind_job<'q>(
    query: Query<'q, Postgres, PgArguments>,
    job: &'q NewJob,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(&job.kind)
        .bind(&job.queue)
        .bind(&job.args)
        .bind(job.priority)
        .bind(job.max_attempts)
        .bind(job.run_at)
        .bind(&job.tags)
        .bind(&job.metadata)
        .bind(job.unique_key.as_deref())
        .bind(job.unique_states.map(i16::from))
        .bind(job.ordering_key.as_deref())
}

/// The single-row insert, up to its `RETURNING` list.
const SINGLE_INSERT: &str =
    "INSERT INTO awa.canonical_jobs (kind, queue, args, state, priority, max_attempts, run_at,
        tags, metadata, unique_key, unique_states, ordering_key)
     VALUES ($1, $2, $3,
        CASE WHEN $6::timestamptz IS NULL OR $6 <= now() THEN 'available' ELSE 'scheduled' END,
        $4, $5, coalesce($6, now()), $7, $8, $9, $10, $11)
     RETURNING";

/// The single-row insert for a statement another driver runs (`awa.bridge`: the application's
/// asyncpg, psycopg, SQLAlchemy or Django connection, inside its own transaction). Every
/// parameter is text (`$1`..`$11`, [`driver_insert_params`]' order) cast in SQL, and each
/// appears once, so the statement works with any placeholder style (`$n`, `%(name)s`,
/// `:name`) and any driver's parameter adaptation. `awa.driver_insert` (migration 12) writes
/// to the engine new jobs go to, with the state rule and columns of [`SINGLE_INSERT`] on
/// canonical; the one result column is the new row as JSON text (`id, kind, queue,
/// args, state, priority, attempt, max_attempts, run_at, created_at, metadata, tags`), so
/// each driver hands back the same thing whatever its type codecs.
pub const DRIVER_INSERT: &str = "SELECT awa.driver_insert(
    CAST($1 AS text), CAST($2 AS text), CAST(CAST($3 AS text) AS jsonb),
    CAST(CAST($4 AS text) AS smallint), CAST(CAST($5 AS text) AS integer),
    CAST(CAST($6 AS text) AS timestamptz), CAST(CAST($7 AS text) AS jsonb),
    CAST(CAST($8 AS text) AS jsonb), decode(CAST($9 AS text), 'hex'),
    CAST(CAST($10 AS text) AS smallint), CAST($11 AS text)) AS job";

/// The eleven text parameters of [`DRIVER_INSERT`] for one validated job.
pub fn driver_insert_params(job: &NewJob) -> Vec<Option<String>> {
    let hex = |key: &[u8]| key.iter().map(|b| format!("{b:02x}")).collect::<String>();
    vec![
        Some(job.kind.clone()),
        Some(job.queue.clone()),
        Some(job.args.to_string()),
        Some(job.priority.to_string()),
        Some(job.max_attempts.to_string()),
        job.run_at.map(|t| t.to_rfc3339()),
        Some(serde_json::Value::from(job.tags.clone()).to_string()),
        Some(job.metadata.to_string()),
        job.unique_key.as_deref().map(hex),
        job.unique_states.map(|s| s.to_string()),
        job.ordering_key.clone(),
    ]
}

/// The distinct kinds of a batch, for the message of a unique conflict in it.
pub(crate) fn kinds_summary<J: std::borrow::Borrow<NewJob>>(jobs: &[J]) -> String {
    let mut kinds: Vec<&str> = jobs.iter().map(|j| j.borrow().kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds.join(", ")
}

/// What happened to one follow-up inserted inside a completion transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowUpInsert {
    Inserted(i64),
    /// A row with the same unique key already exists in one of its unique states.
    SkippedDuplicate,
}

/// `awa.insert_follow_up` reports a skipped duplicate as NULL.
impl From<Option<i64>> for FollowUpInsert {
    fn from(id: Option<i64>) -> Self {
        match id {
            Some(id) => FollowUpInsert::Inserted(id),
            None => FollowUpInsert::SkippedDuplicate,
        }
    }
}

/// Insert a follow-up inside an open transaction, in one round trip (`awa.insert_follow_up`,
/// migration 4). A unique follow-up runs under a savepoint (the function's exception block is
/// a subtransaction), so that a conflict on `idx_awa_jobs_unique` is skipped and the outer
/// transaction survives; any other error is returned and must roll the outer transaction back.
/// With `defer_notify` the insert does not NOTIFY: the caller wakes the queue after its commit.
pub async fn insert_follow_up_in_tx(
    conn: &mut PgConnection,
    job: &NewJob,
    defer_notify: bool,
) -> Result<FollowUpInsert> {
    let sql = "SELECT awa.insert_follow_up($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
    let row = bind_job(sqlx::query(sql), job)
        .bind(defer_notify)
        .fetch_one(&mut *conn)
        .await?;
    let id: Option<i64> = row.try_get(0)?;
    Ok(id.into())
}
