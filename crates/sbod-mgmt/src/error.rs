//! Errors with a kind, so that every client answers in its own terms (the CLI's message and
//! exit code, the HTTP API's status) without parsing messages. The library works in
//! `anyhow`; an [`Error`] anywhere in the chain gives the kind, an engine error maps to one,
//! and anything else is taken as bad input unless an I/O error is in the chain.

pub use sbod_types::control::ErrorKind;
use sbod_types::Step;
use std::fmt;

/// A management error of a known kind, with what can be done about it (worded by each
/// client, see [`crate::words`]).
#[derive(Debug)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub advice: Vec<Step>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// An error of `kind` saying `msg`.
pub fn err(kind: ErrorKind, msg: impl Into<String>) -> anyhow::Error {
    err_advised(kind, msg, Vec::new())
}

/// An error of `kind` saying `msg`, with steps the person can take.
pub fn err_advised(kind: ErrorKind, msg: impl Into<String>, advice: Vec<Step>) -> anyhow::Error {
    anyhow::Error::new(Error {
        kind,
        message: msg.into(),
        advice,
    })
}

/// What can be done about an error: the steps of the first error in the chain that has
/// any.
pub fn advice_of(e: &anyhow::Error) -> Vec<Step> {
    for cause in e.chain() {
        if let Some(m) = cause.downcast_ref::<Error>() {
            if !m.advice.is_empty() {
                return m.advice.clone();
            }
        }
        if let Some(c) = cause.downcast_ref::<sbod_core::Error>() {
            let a = c.advice();
            if !a.is_empty() {
                return a;
            }
        }
    }
    Vec::new()
}

/// The kind of an error: its typed cause if it has one.
pub fn kind_of(e: &anyhow::Error) -> ErrorKind {
    for cause in e.chain() {
        if let Some(m) = cause.downcast_ref::<Error>() {
            return m.kind;
        }
        if let Some(c) = cause.downcast_ref::<sbod_core::Error>() {
            return match c {
                sbod_core::Error::Invalid(_) | sbod_core::Error::BadSetting { .. } => {
                    ErrorKind::Invalid
                }
                sbod_core::Error::Refused(_)
                | sbod_core::Error::MissingMembers(_)
                | sbod_core::Error::SplitBrain(_)
                | sbod_core::Error::WouldFail(_) => ErrorKind::Refused,
                sbod_core::Error::ReadOnly(_) => ErrorKind::Conflict,
                sbod_core::Error::NoSpace(_) => ErrorKind::Io,
                sbod_core::Error::Failed(_)
                | sbod_core::Error::Busy(_)
                | sbod_core::Error::ShutDown => ErrorKind::Conflict,
                sbod_core::Error::Io { .. } | sbod_core::Error::Codec(_) => ErrorKind::Io,
            };
        }
        if cause.downcast_ref::<std::io::Error>().is_some() {
            return ErrorKind::Io;
        }
    }
    ErrorKind::Invalid
}
