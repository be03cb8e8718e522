use std::io;
use uuid::Uuid;

pub use sbod_types::Step;

/// What happened, in words for the person at the terminal, and what they can do about it
/// as typed [`Step`]s that each client words in its own terms (the CLI's options, the HTTP
/// API's fields): the engine never spells a command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Msg {
    pub text: String,
    pub advice: Vec<Step>,
}

impl Msg {
    pub fn new(text: impl Into<String>) -> Msg {
        Msg {
            text: text.into(),
            advice: Vec::new(),
        }
    }

    /// Add a step the person can take.
    pub fn or(mut self, step: Step) -> Msg {
        self.advice.push(step);
        self
    }
}

impl From<String> for Msg {
    fn from(text: String) -> Msg {
        Msg::new(text)
    }
}

impl From<&str> for Msg {
    fn from(text: &str) -> Msg {
        Msg::new(text)
    }
}

impl std::ops::Deref for Msg {
    type Target = str;
    fn deref(&self) -> &str {
        &self.text
    }
}

impl std::fmt::Display for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// Engine errors, by kind. Messages say what happened; what to do about it is in the
/// typed advice ([`Error::advice`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// More members lost than the layout survives: data is not available.
    #[error("array has failed: {0}")]
    Failed(Msg),
    /// A request or argument the engine cannot honour.
    #[error("{0}")]
    Invalid(Msg),
    /// A setting of the layout out of range: `setting` names it as the engine does
    /// (`chunk`, `groups`, `spares`, `copies`, `bitmap_region`), `value` as given.
    #[error("{setting} {value}: {why}")]
    BadSetting {
        setting: &'static str,
        value: String,
        why: String,
    },
    /// Refused to protect data (foreign member, signature, in use); `force` may override.
    #[error("{0}")]
    Refused(Msg),
    /// The parity codec refused buffers the engine sized: a fault of the engine, never of
    /// the request (clients get EIO).
    #[error("parity computation failed: {0}")]
    Codec(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// A member's file system is out of space (ENOSPC, EDQUOT): the write did not complete,
    /// and no member was failed for it. Writes succeed again once space is freed.
    #[error("{0}")]
    NoSpace(Msg),
    #[error("array is shutting down")]
    ShutDown,
    #[error("{0}")]
    Busy(Msg),
    /// Members the array had in service when it stopped were not given. Start without
    /// them only with `AssembleOptions::degraded` (or `force`).
    #[error("{0}")]
    MissingMembers(MissingMembers),
    /// Two sets of members each went on without the other; `force` takes the newest side.
    #[error("{0}")]
    SplitBrain(Msg),
    /// A management command (fail) would leave a group with fewer members than it needs,
    /// so the array would stop serving; `force` does it anyway.
    #[error("{0}")]
    WouldFail(Msg),
    /// The array was started read-only (a rescue): nothing is written.
    #[error("{0}")]
    ReadOnly(Msg),
}

/// Slots whose member was in service when the array stopped and is not here now.
#[derive(Clone, Debug)]
pub struct MissingMembers {
    pub array: String,
    pub slots: Vec<MissingSlot>,
    /// Devices given but not used, with the reason (they may be the missing ones).
    pub ignored: Vec<(String, String)>,
}

#[derive(Clone, Debug)]
pub struct MissingSlot {
    pub slot: usize,
    pub group: usize,
    /// The member the array records in the slot.
    pub uuid: Option<Uuid>,
}

impl MissingMembers {
    /// The message, naming each missing member as `name_of` knows it (a path from a
    /// registry), else by its uuid.
    pub fn describe(&self, name_of: impl Fn(&Uuid) -> Option<String>) -> String {
        let who: Vec<String> = self
            .slots
            .iter()
            .map(|s| {
                let name = s
                    .uuid
                    .as_ref()
                    .and_then(&name_of)
                    .or_else(|| s.uuid.map(|u| format!("member {u}")))
                    .unwrap_or_else(|| "its member".into());
                format!("{name} (slot {})", s.slot)
            })
            .collect();
        let verb = if who.len() == 1 { "is" } else { "are" };
        let mut msg = format!(
            "'{}' had {} in service when it stopped and {verb} missing now",
            self.array,
            who.join(", "),
        );
        for (p, why) in &self.ignored {
            msg.push_str(&format!("; {p} was given but not used: {why}"));
        }
        msg
    }

    /// What can be done: bring them back, or start without them.
    pub fn advice(&self) -> Vec<Step> {
        let (it, they, comes) = if self.slots.len() == 1 {
            ("it", "it is", "it comes")
        } else {
            ("them", "they are", "they come")
        };
        vec![
            Step::say(format!("connect {it} and run the command again")),
            Step::degraded(format!(
                "start without {it} ({they} resynced from the write-intent bitmap when {comes} back)"
            )),
        ]
    }
}

impl std::fmt::Display for MissingMembers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(|_| None))
    }
}

impl Error {
    /// The same error again, for each of several callers it reaches (a coalesced stripe
    /// write's riders): errors are not `Clone`, an I/O error's payload is not.
    ///
    /// The match names every variant (no catch-all): a new variant must decide here how it
    /// is repeated, instead of silently becoming `Failed`.
    pub(crate) fn again(&self) -> Error {
        match self {
            Error::Failed(m) => Error::Failed(m.clone()),
            Error::NoSpace(m) => Error::NoSpace(m.clone()),
            Error::ReadOnly(m) => Error::ReadOnly(m.clone()),
            Error::Busy(m) => Error::Busy(m.clone()),
            Error::Invalid(m) => Error::Invalid(m.clone()),
            Error::Refused(m) => Error::Refused(m.clone()),
            Error::WouldFail(m) => Error::WouldFail(m.clone()),
            Error::Codec(m) => Error::Codec(m.clone()),
            Error::ShutDown => Error::ShutDown,
            Error::Io { context, source } => Error::Io {
                context: context.clone(),
                source: match source.raw_os_error() {
                    Some(n) => std::io::Error::from_raw_os_error(n),
                    None => std::io::Error::new(source.kind(), source.to_string()),
                },
            },
            Error::SplitBrain(m) => Error::SplitBrain(m.clone()),
            Error::MissingMembers(m) => Error::MissingMembers(m.clone()),
            Error::BadSetting {
                setting,
                value,
                why,
            } => Error::BadSetting {
                setting,
                value: value.clone(),
                why: why.clone(),
            },
        }
    }

    /// What the person can do about this error.
    pub fn advice(&self) -> Vec<Step> {
        match self {
            Error::Failed(m)
            | Error::Invalid(m)
            | Error::Refused(m)
            | Error::NoSpace(m)
            | Error::Busy(m)
            | Error::SplitBrain(m)
            | Error::WouldFail(m)
            | Error::ReadOnly(m) => m.advice.clone(),
            Error::MissingMembers(m) => m.advice(),
            Error::BadSetting { .. } | Error::Codec(_) | Error::Io { .. } | Error::ShutDown => {
                Vec::new()
            }
        }
    }

    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// `again` keeps the kind and the words of every variant.
    #[test]
    fn again_keeps_kind_and_message() {
        let all = vec![
            Error::Failed(Msg::new("f").or(Step::Examine)),
            Error::Invalid("i".into()),
            Error::BadSetting {
                setting: "chunk",
                value: "3".into(),
                why: "not a power of two".into(),
            },
            Error::Refused("r".into()),
            Error::Codec("c".into()),
            Error::io("ctx", io::Error::from_raw_os_error(libc::EIO)),
            Error::io("ctx", io::Error::other("no os error")),
            Error::NoSpace("n".into()),
            Error::ShutDown,
            Error::Busy("b".into()),
            Error::MissingMembers(MissingMembers {
                array: "a".into(),
                slots: vec![MissingSlot {
                    slot: 1,
                    group: 0,
                    uuid: None,
                }],
                ignored: Vec::new(),
            }),
            Error::SplitBrain("s".into()),
            Error::WouldFail("w".into()),
            Error::ReadOnly("ro".into()),
        ];
        for e in &all {
            let a = e.again();
            assert_eq!(
                std::mem::discriminant(e),
                std::mem::discriminant(&a),
                "{e:?} became {a:?}"
            );
            assert_eq!(e.to_string(), a.to_string());
            assert_eq!(e.advice(), a.advice());
            if let (Error::Io { source: x, .. }, Error::Io { source: y, .. }) = (e, &a) {
                assert_eq!(x.raw_os_error(), y.raw_os_error());
                assert_eq!(x.kind(), y.kind());
            }
        }
    }
}
