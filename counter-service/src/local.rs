//! The service's adds called in process, without HTTP: [`Local`].

use crate::{
    domain::adds::Op,
    domain::admission::Arrival,
    domain::idempotency,
    domain::writes::{self, BatchAddReply, BatchItem},
    problem::{Problem, ProblemBody},
    state::AppState,
};

/// A started service's adds called in process, without HTTP
/// ([`Service::local`](crate::Service::local)).
///
/// A process that embeds the service ([`crate::Service::router`] on a
/// listener of its own) may add beside its HTTP callers, and the `limits`
/// bench measures what HTTP costs against exactly this path. A call goes
/// through the checks, the add queue and the groups of `counters:batchAdd`;
/// it carries no token (the embedding process is trusted with every
/// namespace) and records its ids under the ledger source of a caller
/// without one. Cloning is cheap; it keeps working while the service
/// serves.
#[derive(Clone)]
pub struct Local {
    state: AppState,
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Local").finish_non_exhaustive()
    }
}

impl Local {
    pub(crate) fn new(state: AppState) -> Self {
        Self { state }
    }

    /// Applies `items` in `namespace` as `counters:batchAdd` does, all or
    /// nothing, each item with an `id` once per id and the whole call once
    /// per `idempotency_key` (a retry answers the first call's reply).
    /// Errors are the problem documents the HTTP answer would carry.
    pub async fn batch_add(
        &self,
        namespace: &str,
        items: Vec<BatchItem>,
        idempotency_key: Option<&str>,
    ) -> Result<BatchAddReply, ProblemBody> {
        self.apply(namespace, items, idempotency_key)
            .await
            .map_err(|problem| problem.body())
    }

    async fn apply(
        &self,
        namespace: &str,
        items: Vec<BatchItem>,
        idempotency_key: Option<&str>,
    ) -> Result<BatchAddReply, Problem> {
        let ns = self
            .state
            .namespaces
            .get(namespace)
            .ok_or_else(|| Problem::unknown_namespace(namespace))?;
        let max = self.state.server.max_batch_items;
        if items.is_empty() || items.len() > max {
            return Err(Problem::out_of_range("batch items", 1, max, items.len()));
        }
        if let Some(key) = idempotency_key {
            idempotency::check_id(key)?;
        }
        let outcome = writes::apply(
            ns,
            ns.source_for(None),
            idempotency_key.map(str::to_owned),
            None,
            Arrival::now(),
            Op::Batch,
            items,
        )
        .await?;
        serde_json::from_str(&outcome.body)
            .map_err(|e| Problem::internal(format!("a batch add's answer: {e}")))
    }
}
