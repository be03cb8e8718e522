use std::io;

/// Engine errors. Messages are written for the person at the terminal: say what happened
/// and what to do next.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// More members lost than the layout survives: data is not available.
    #[error("array has failed: {0}")]
    Failed(String),
    /// A request or argument the engine cannot honour.
    #[error("{0}")]
    Invalid(String),
    /// Refused to protect data (foreign member, signature, in use); `--force` may override.
    #[error("{0}")]
    Refused(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A member's file system is out of space (ENOSPC, EDQUOT): the write did not complete,
    /// and no member was failed for it. Writes succeed again once space is freed.
    #[error("{0}")]
    NoSpace(String),
    #[error("array is shutting down")]
    ShutDown,
    #[error("{0}")]
    Busy(String),
}

impl Error {
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
