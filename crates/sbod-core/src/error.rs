use std::io;
use uuid::Uuid;

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
    NoSpace(String),
    #[error("array is shutting down")]
    ShutDown,
    #[error("{0}")]
    Busy(String),
    /// Members the array had in service when it stopped were not given. Start without
    /// them only with `AssembleOptions::degraded` (or `force`).
    #[error("{0}")]
    MissingMembers(MissingMembers),
    /// Two sets of members each went on without the other; `force` takes the newest side.
    #[error("{0}")]
    SplitBrain(String),
    /// A management command (fail) would leave a group with fewer members than it needs,
    /// so the array would stop serving; `force` does it anyway.
    #[error("{0}")]
    WouldFail(String),
    /// The array was started read-only (a rescue): nothing is written.
    #[error("{0}")]
    ReadOnly(String),
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
        let (verb, it, they, comes) = if who.len() == 1 {
            ("is", "it", "it is", "it comes")
        } else {
            ("are", "them", "they are", "they come")
        };
        let mut msg = format!(
            "'{}' had {} in service when it stopped and {verb} missing now: connect {it} and run the command again, or start without {it} with --degraded ({they} resynced from the write-intent bitmap when {comes} back)",
            self.array,
            who.join(", "),
        );
        for (p, why) in &self.ignored {
            msg.push_str(&format!("; {p} was given but not used: {why}"));
        }
        msg
    }
}

impl std::fmt::Display for MissingMembers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe(|_| None))
    }
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
