//! SQL for every state change and read. Functions are generic over a sqlx executor where the
//! caller may want its own transaction; finalization and claiming own their transactions.

pub mod admin;
pub mod batch_ops;
pub mod callbacks;
pub mod claim;
pub mod copy;
pub mod descriptors;
pub mod dlq;
pub mod engine;
pub mod foreign;
pub mod insert;
pub mod key_rewrite;
pub mod migrations;
pub mod pool;
pub mod queue_storage;
pub mod routing;
pub mod runtime_instances;
pub mod transition;

/// Send the wake-up hint (`awa:<queue>` NOTIFY) for each queue; listeners re-claim at once,
/// pollers find the jobs anyway.
pub(crate) async fn wake_queues<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    queues: &[String],
) -> crate::error::Result<()> {
    sqlx::query("SELECT pg_notify(awa.queue_channel(q), '') FROM unnest($1::text[]) AS q")
        .bind(queues)
        .execute(executor)
        .await?;
    Ok(())
}
