//! One batch of messages, one transaction: the new ids recorded in the
//! dedup table and only their deltas applied, or nothing at all.

use std::collections::HashSet;

use counter_core::{
    DeltaBatch, ErrorKind,
    observe::{self, Touched},
};
use sea_orm::{DatabaseConnection, TransactionTrait};

use crate::{
    dedup,
    error::{MqError, Rejection},
    fault::{Fault, FaultPoint},
    tables::Checked,
};

/// What one committed transaction did.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// Messages whose deltas were applied.
    pub applied: u64,
    /// Messages whose id was recorded already: skipped.
    pub duplicates: u64,
    /// SQL statements sent, `BEGIN` and `COMMIT` included.
    pub statements: u64,
}

/// How a batch failed.
#[derive(Debug)]
pub(crate) enum Failed {
    /// The database refuses one of the messages for good (a slot would
    /// overflow): nothing was applied; the batch must be split.
    Refused(Rejection),
    /// Anything else (a broken connection, a deadlock): nothing is known to
    /// be applied; the same batch may be tried again, the dedup rows make
    /// the retry exact.
    Retry(MqError),
}

/// Applies `messages` of `source` exactly once: `BEGIN`; one `INSERT` of
/// the ids that returns the new ones; one sorted multi-row upsert per table
/// (a [`DeltaBatch`]) of the new messages' deltas; `COMMIT`. Then every
/// owner of the batch, duplicates included, is told to the cache observers
/// (a duplicate may be the redelivery of a batch whose process died after
/// its commit and before its cache step).
pub(crate) async fn apply_batch(
    db: &DatabaseConnection,
    source: &str,
    messages: &[Checked],
    fault: &Fault,
) -> Result<Applied, Failed> {
    // The scope keeps the batch write from reporting its owners as written
    // outside a transaction; what it collected is a subset of the owners of
    // `messages`, which are reported once, below, duplicates included (the
    // batch that applied a duplicate may have died before telling the cache).
    let ((result, statements), _collected) = observe::scope(async {
        let mut statements = 0u64;
        let result = transaction(db, source, messages, fault, &mut statements).await;
        (result, statements)
    })
    .await;
    let mut applied = result?;
    applied.statements = statements;
    let mut touched = Touched::new();
    for message in messages {
        touched.touch(message.message.table(), message.owners());
    }
    touched.committed().await;
    Ok(applied)
}

async fn transaction(
    db: &DatabaseConnection,
    source: &str,
    messages: &[Checked],
    fault: &Fault,
    statements: &mut u64,
) -> Result<Applied, Failed> {
    let retry = |e: sea_orm::DbErr| Failed::Retry(e.into());
    let txn = db.begin().await.map_err(retry)?;
    *statements += 1;
    let ids: Vec<&str> = messages.iter().map(|m| m.message.id()).collect();
    let new = dedup::record_new(&txn, source, &ids).await.map_err(retry)?;
    *statements += 1;
    let mut batch = DeltaBatch::new();
    let mut seen = HashSet::with_capacity(new.len());
    let mut applied = Applied::default();
    let mut duplicates = Vec::new();
    for message in messages {
        // An id twice in one batch (published twice, delivered together)
        // is applied once.
        if new.contains(message.message.id()) && seen.insert(message.message.id()) {
            message.fold_into(&mut batch).map_err(Failed::Refused)?;
            applied.applied += 1;
        } else {
            applied.duplicates += 1;
            if !new.contains(message.message.id()) {
                duplicates.push(message.message.id());
            }
        }
    }
    if !duplicates.is_empty() {
        dedup::touch(&txn, source, &duplicates)
            .await
            .map_err(retry)?;
        *statements += 1;
    }
    let report = batch.apply_in(&txn).await.map_err(|e| match e {
        // A retry meets these again: a total leaving `i64`, or (in a
        // region) a slot at its cap that only a settlement over every
        // region's slots could take further.
        _ if e.kind() == ErrorKind::Overflow => Failed::Refused(Rejection::Overflow(e.to_string())),
        counter_core::CounterError::CrossRegion { .. } => {
            Failed::Refused(Rejection::Overflow(e.to_string()))
        }
        _ => Failed::Retry(e.into()),
    })?;
    *statements += report.statements as u64;
    fault.at(FaultPoint::BeforeCommit);
    txn.commit().await.map_err(retry)?;
    *statements += 1;
    fault.at(FaultPoint::AfterCommit);
    Ok(applied)
}
