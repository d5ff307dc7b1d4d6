//! `?` on a counter call in a Loco handler (feature `loco`).
//!
//! A Loco handler returns `loco_rs::Result`, and `?` applies one `From`:
//! neither `loco_rs::Error` nor [`CounterError`] belongs to the application,
//! so only this crate can provide the conversion. It maps by
//! [`CounterError::kind`], like any HTTP front end should:
//!
//! | kind | Loco error | response |
//! |---|---|---|
//! | [`ErrorKind::InvalidInput`] | `BadRequest` | 400 with the message |
//! | [`ErrorKind::Overflow`] | `CustomError(409)` | 409 with the message |
//! | [`ErrorKind::Transient`] | `CustomError(503)`, the cause logged | 503, "try again later" |
//! | anything else | `Error::wrap` | 500, the cause logged by Loco |

use http::StatusCode;
use loco_rs::controller::ErrorDetail;

use crate::{CounterError, ErrorKind};

impl From<CounterError> for loco_rs::Error {
    fn from(err: CounterError) -> Self {
        match err.kind() {
            ErrorKind::InvalidInput => Self::BadRequest(err.to_string()),
            ErrorKind::Overflow => Self::CustomError(
                StatusCode::CONFLICT,
                ErrorDetail::new("conflict", err.to_string()),
            ),
            ErrorKind::Transient => {
                tracing::warn!(error = %err, "counter call failed; the client may retry");
                Self::CustomError(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorDetail::new("unavailable", "try again later"),
                )
            }
            _ => Self::wrap(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a Loco handler does: `?` on counter calls, no `map_err`.
    fn handler(key: &str) -> loco_rs::Result<()> {
        crate::validate_key(key)?;
        Err(CounterError::Overflow {
            context: "a test".into(),
        })?
    }

    #[test]
    fn question_mark_works_in_a_loco_handler_and_keeps_the_class() {
        assert!(
            matches!(handler("no spaces"), Err(loco_rs::Error::BadRequest(m)) if m.contains("invalid counter key"))
        );
        assert!(matches!(
            handler("likes"),
            Err(loco_rs::Error::CustomError(StatusCode::CONFLICT, _))
        ));
        let busy = loco_rs::Error::from(CounterError::ReconcileBusy {
            table: "t".into(),
            key: "k".into(),
            waited_secs: 60,
        });
        assert!(matches!(
            busy,
            loco_rs::Error::CustomError(StatusCode::SERVICE_UNAVAILABLE, _)
        ));
        let misuse = loco_rs::Error::from(CounterError::TransactionRequired {
            table: "t".into(),
            operation: "insert",
            call_site: None,
        });
        assert!(matches!(misuse, loco_rs::Error::Any(_)));
    }
}
