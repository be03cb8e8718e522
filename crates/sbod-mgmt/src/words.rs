//! How each client words an error: the engine and this library say what happened and
//! which steps apply ([`sbod_types::Step`]); here they become the CLI's options and
//! commands (`--force`, `sbod fail vol0 d3.img`) or the HTTP API's fields and routes
//! (`"force": true`). Nothing below this layer spells a command line.

use crate::error::advice_of;
use sbod_types::advice::with_steps;
use sbod_types::Step;

/// Whose words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// The `sbod` command line (and the control socket, whose client it is).
    Cli,
    /// The HTTP API (`sbod web`).
    Api,
}

/// A setting of the layout as each client names it.
fn setting(name: &str, style: Style) -> String {
    match style {
        Style::Cli => format!("--{}", name.replace('_', "-")),
        Style::Api => format!("\"{name}\""),
    }
}

/// One step in a client's words.
pub fn step(s: &Step, style: Style) -> String {
    let opt = |name: &str| match style {
        Style::Cli => format!("--{name}"),
        Style::Api => format!("\"{name}\": true"),
    };
    match s {
        Step::Say { text } => text.clone(),
        Step::Force { does } => format!("use {} to {does}", opt("force")),
        Step::Degraded { does } => format!("use {} to {does}", opt("degraded")),
        Step::Preallocate => format!(
            "give the members their space when they are made ({})",
            opt("preallocate")
        ),
        Step::Examine => match style {
            Style::Cli => "compare the superblocks with `sbod examine MEMBER`".into(),
            Style::Api => {
                "compare the members' superblocks (`sbod examine MEMBER` on the host)".into()
            }
        },
        Step::AddLog => match style {
            Style::Cli => "add a log device (sbod add NAME --log DEV, an SSD): it journals every write, and with one such an array starts with --degraded alone".into(),
            Style::Api => "add a log device (an SSD, the \"log\" of the add action): it journals every write, and with one such an array starts degraded".into(),
        },
        Step::Command { verb, array, member } if member.is_empty() => match style {
            Style::Cli => format!("{verb} it (sbod {verb} {array})"),
            Style::Api => format!("{verb} it (POST /api/v1/arrays/{array}/{verb})"),
        },
        Step::Serve { array } => match style {
            Style::Cli => format!(
                "serve it (sbod serve {array}, or systemctl start sbod@{array}) and try again"
            ),
            Style::Api => format!(
                "serve it on the host (`sbod serve {array}`, or its service sbod@{array}) and try again"
            ),
        },
        Step::Option { name, does } => format!("use {} to {does}", setting(name, style)),
        Step::Command {
            verb,
            array,
            member,
        } => {
            let extra = if verb == "replace" { " NEW" } else { "" };
            let first = if verb == "fail" { " first" } else { "" };
            match style {
                Style::Cli => format!("{verb} it{first} (sbod {verb} {array} {member}{extra})"),
                Style::Api => format!(
                    "{verb} it{first} (POST /api/v1/arrays/{array}/{verb} with member {member:?}{})",
                    if extra.is_empty() { "" } else { " and the new one" }
                ),
            }
        }
    }
}

/// The whole message of an error in a client's words: what happened (the chain of
/// contexts), then what can be done.
pub fn message(e: &anyhow::Error, style: Style) -> String {
    let mut text = format!("{e:#}");
    if let Some(sbod_core::Error::BadSetting {
        setting: name,
        value,
        why,
    }) = e.chain().find_map(|c| c.downcast_ref::<sbod_core::Error>())
    {
        let plain = format!("{name} {value}: {why}");
        let worded = format!("{} {value}: {why}", setting(name, style));
        text = text.replacen(&plain, &worded, 1);
    }
    with_steps(&text, &advice_of(e), |s| step(s, style))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_words_the_same_steps_its_own_way() {
        let e = anyhow::Error::new(sbod_core::Error::Refused(
            sbod_core::error::Msg::new("d3.img holds an ext4 file system")
                .or(Step::say("pick another device"))
                .or(Step::force("overwrite it")),
        ));
        assert_eq!(
            message(&e, Style::Cli),
            "d3.img holds an ext4 file system; pick another device, or use --force to overwrite it"
        );
        assert_eq!(
            message(&e, Style::Api),
            "d3.img holds an ext4 file system; pick another device, or use \"force\": true to overwrite it"
        );
        let e = anyhow::Error::new(sbod_core::Error::BadSetting {
            setting: "bitmap_region",
            value: "0".into(),
            why: "the region is a non-zero multiple of the chunk".into(),
        })
        .context("creating 'v'");
        assert_eq!(
            message(&e, Style::Cli),
            "creating 'v': --bitmap-region 0: the region is a non-zero multiple of the chunk"
        );
        assert!(message(&e, Style::Api).contains("\"bitmap_region\" 0"));
        let fail = step(&Step::command("fail", "vol0", "d3.img"), Style::Cli);
        assert_eq!(fail, "fail it first (sbod fail vol0 d3.img)");
        let stop = Step::on_array("stop", "vol0");
        assert_eq!(step(&stop, Style::Cli), "stop it (sbod stop vol0)");
        assert_eq!(
            step(&stop, Style::Api),
            "stop it (POST /api/v1/arrays/vol0/stop)"
        );
        let name = Step::option("name", "register it under another name");
        assert_eq!(
            step(&name, Style::Cli),
            "use --name to register it under another name"
        );
        assert_eq!(
            step(&name, Style::Api),
            "use \"name\" to register it under another name"
        );
        assert!(step(&Step::serve("vol0"), Style::Cli).contains("sbod serve vol0"));
        assert!(step(&Step::serve("vol0"), Style::Api).contains("on the host"));
    }
}
