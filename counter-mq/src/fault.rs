//! Named points in a batch where a test makes the consumer's process die,
//! to prove that no crash loses or doubles a message. Not for production
//! use; hidden from the documentation.

use std::{fmt, sync::Arc};

/// Where in a batch the hook is called.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// The deltas are sent, the `COMMIT` is not.
    BeforeCommit,
    /// Committed, nothing acknowledged.
    AfterCommit,
    /// The first half of the batch acknowledged, the second not.
    BetweenAcks,
}

impl FaultPoint {
    /// The point named `name` (`before-commit`, `after-commit`,
    /// `between-acks`).
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "before-commit" => Some(Self::BeforeCommit),
            "after-commit" => Some(Self::AfterCommit),
            "between-acks" => Some(Self::BetweenAcks),
            _ => None,
        }
    }
}

/// The hook a consumer calls at each [`FaultPoint`] (none by default).
#[derive(Clone, Default)]
pub(crate) struct Fault(Option<Arc<dyn Fn(FaultPoint) + Send + Sync>>);

impl Fault {
    pub fn new(hook: Arc<dyn Fn(FaultPoint) + Send + Sync>) -> Self {
        Self(Some(hook))
    }

    pub fn at(&self, point: FaultPoint) {
        if let Some(hook) = &self.0 {
            hook(point);
        }
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Fault(hook)"
        } else {
            "Fault(none)"
        })
    }
}
