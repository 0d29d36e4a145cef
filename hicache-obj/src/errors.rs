//! Failures of either S3 client, classified by error variant (never by message text) into
//! hicache errors: transport failures that may pass are [`Error::Unavailable`] (retryable),
//! the rest [`Error::Backend`], each with a hint where one helps.

use hicache_core::Error;
use hicache_core::raw::SharedSource;
use object_store::client::{HttpError, HttpErrorKind};

use crate::NAME;

/// What went wrong, as far as it decides what the user should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The credentials were refused (HTTP 401/403).
    Denied,
    /// The bucket (or the object, where a miss is not expected) does not exist (HTTP 404).
    NotFound,
    /// No connection to the endpoint could be made.
    Unreachable,
    /// The request timed out, was cut or the server failed it (HTTP 5xx), after the
    /// client's own retries.
    Transient,
    /// Anything else.
    Other,
}

impl Failure {
    /// A hint (with its `; hint: ` prefix) for the failures users can fix.
    pub(crate) fn hint(self) -> &'static str {
        match self {
            Failure::Denied => {
                "; hint: the credentials were refused: check access_key/secret_key (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
            }
            Failure::NotFound => "; hint: the bucket does not exist: create it or fix `bucket`",
            Failure::Unreachable => {
                "; hint: the endpoint did not answer: check `endpoint` and that the server runs"
            }
            Failure::Transient | Failure::Other => "",
        }
    }

    /// The hicache error for a failed `op` with `message`.
    pub(crate) fn into_error(self, message: String, source: SharedSource) -> Error {
        let message = format!("{message}{}", self.hint());
        match self {
            Failure::Unreachable | Failure::Transient => Error::Unavailable {
                component: NAME.into(),
                message,
                source: Some(source),
            },
            _ => Error::Backend {
                component: NAME.into(),
                message,
                source: Some(source),
            },
        }
    }
}

/// Classifies an object_store error: by its variant, and for transport errors by the kind
/// of the HTTP client error in its source chain.
pub(crate) fn classify(e: &object_store::Error) -> Failure {
    use object_store::Error as E;
    match e {
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Failure::Denied,
        E::NotFound { .. } => Failure::NotFound,
        E::Generic { .. } => match http_error_kind(e) {
            Some(HttpErrorKind::Connect) => Failure::Unreachable,
            Some(HttpErrorKind::Timeout | HttpErrorKind::Interrupted | HttpErrorKind::Request) => {
                Failure::Transient
            }
            _ => Failure::Other,
        },
        _ => Failure::Other,
    }
}

fn http_error_kind(e: &(dyn std::error::Error + 'static)) -> Option<HttpErrorKind> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(http) = err.downcast_ref::<HttpError>() {
            return Some(http.kind());
        }
        next = err.source();
    }
    None
}

/// An object_store failure of `op` on `what` as a hicache error.
pub(crate) fn store_error(op: &str, what: &dyn std::fmt::Display, e: object_store::Error) -> Error {
    classify(&e).into_error(format!("{op} {what}: {e}"), std::sync::Arc::new(e))
}

/// object_store's message plus a hint for the failures users can fix.
pub(crate) fn describe(e: &object_store::Error) -> String {
    format!("{e}{}", classify(e).hint())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generic(kind: HttpErrorKind) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(HttpError::new(kind, std::io::Error::other("wire"))),
        }
    }

    #[test]
    fn variants_decide_the_failure() {
        let denied = object_store::Error::PermissionDenied {
            path: "p".into(),
            source: "403".into(),
        };
        assert_eq!(classify(&denied), Failure::Denied);
        let missing = object_store::Error::NotFound {
            path: "p".into(),
            source: "404".into(),
        };
        assert_eq!(classify(&missing), Failure::NotFound);
        assert_eq!(
            classify(&generic(HttpErrorKind::Connect)),
            Failure::Unreachable
        );
        assert_eq!(
            classify(&generic(HttpErrorKind::Timeout)),
            Failure::Transient
        );
        assert_eq!(classify(&generic(HttpErrorKind::Decode)), Failure::Other);
        // The same words in a message change nothing: only the variant counts.
        let text = object_store::Error::Generic {
            store: "S3",
            source: "403 AccessDenied Connection refused".into(),
        };
        assert_eq!(classify(&text), Failure::Other);
    }

    #[test]
    fn transport_failures_are_retryable_and_keep_their_source() {
        use std::error::Error as _;
        let e = store_error("put", &"k", generic(HttpErrorKind::Timeout));
        assert!(
            e.is_retryable() && matches!(e, Error::Unavailable { .. }),
            "{e}"
        );
        assert!(e.clone().source().is_some());
        let e = store_error("put", &"k", generic(HttpErrorKind::Connect));
        assert!(
            e.is_retryable() && e.to_string().contains("check `endpoint`"),
            "{e}"
        );
        let denied = object_store::Error::Unauthenticated {
            path: "p".into(),
            source: "401".into(),
        };
        let e = store_error("get", &"k", denied);
        assert!(
            !e.is_retryable() && e.to_string().contains("access_key"),
            "{e}"
        );
    }
}
