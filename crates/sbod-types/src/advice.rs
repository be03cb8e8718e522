//! What a person can do about an error, as typed steps. The engine and the management
//! library say which steps apply; each client words them in its own terms: the CLI in its
//! options and commands (`--force`, `sbod fail vol0 d3.img`), the HTTP API in its fields
//! and routes (`"force": true`). The message an error carries says what happened, never
//! how to type the remedy.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Something to do, in words that fit every client ("free space there").
    Say { text: String },
    /// Run the same request again with the `force` option, which then does `does`
    /// ("overwrite it").
    Force { does: String },
    /// Start the array with the `degraded` option, which does `does` ("start without
    /// them").
    Degraded { does: String },
    /// Give member files all their space when they are made (the `preallocate` option).
    Preallocate,
    /// Compare the members' superblocks (the `examine` command).
    Examine,
    /// Give the array a log device: it journals every write, which closes the write hole.
    AddLog,
    /// Another command first: `verb` (fail, replace, add, remove) on `member` of `array`;
    /// with no member, on the array itself (stop, forget).
    Command {
        verb: String,
        array: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        member: String,
    },
    /// Serve the array (start its serving process), then try again.
    Serve { array: String },
    /// Give an option of the request (`name`, as the API's field: "rebuild_min_rate"),
    /// which then does `does`.
    Option { name: String, does: String },
}

impl Step {
    pub fn say(text: impl Into<String>) -> Step {
        Step::Say { text: text.into() }
    }

    pub fn force(does: impl Into<String>) -> Step {
        Step::Force { does: does.into() }
    }

    pub fn degraded(does: impl Into<String>) -> Step {
        Step::Degraded { does: does.into() }
    }

    /// `verb` on the array itself (stop, forget).
    pub fn on_array(verb: &str, array: &str) -> Step {
        Step::command(verb, array, "")
    }

    pub fn serve(array: &str) -> Step {
        Step::Serve {
            array: array.into(),
        }
    }

    pub fn option(name: &str, does: impl Into<String>) -> Step {
        Step::Option {
            name: name.into(),
            does: does.into(),
        }
    }

    pub fn command(verb: &str, array: &str, member: &str) -> Step {
        Step::Command {
            verb: verb.into(),
            array: array.into(),
            member: member.into(),
        }
    }
}

/// `message` followed by the steps, each worded by `word`: "message; step, or step".
pub fn with_steps(message: &str, steps: &[Step], word: impl Fn(&Step) -> String) -> String {
    if steps.is_empty() {
        return message.to_string();
    }
    let words: Vec<String> = steps.iter().map(word).collect();
    format!("{message}; {}", words.join(", or "))
}
