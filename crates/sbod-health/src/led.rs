//! The locate and fault LEDs of a member's slot: written through sysfs (an SES enclosure
//! component's `locate`/`fault`, a PCIe slot's `attention`), or by `ledctl` (ledmon: VMD,
//! NPEM, SGPIO, IBPI) where sysfs offers no LED and ledctl is installed.

use crate::sysfs::Sysfs;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Led {
    /// "Find me": a blinking LED for the person at the rack.
    Locate,
    /// The slot's fault (failure) LED.
    Fault,
}

impl std::fmt::Display for Led {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Led::Locate => "locate",
            Led::Fault => "fault",
        })
    }
}

/// How the LED was set, in words ("sysfs /sys/class/enclosure/0:0:12:0/Slot 03/locate").
pub type How = String;

/// Set a whole disk's LED on or off. `ledctl`: the program to fall back to (None: look it
/// up on PATH).
pub fn set(sysfs: &Sysfs, disk: &str, led: Led, on: bool) -> Result<How, String> {
    set_with(sysfs, disk, led, on, crate::smart::find_program("ledctl"))
}

pub fn set_with(
    sysfs: &Sysfs,
    disk: &str,
    led: Led,
    on: bool,
    ledctl: Option<PathBuf>,
) -> Result<How, String> {
    if let Some((_, files)) = sysfs.location(disk) {
        let file = match led {
            Led::Locate => files.locate,
            // A PCIe slot's one LED (attention) stands for a fault too.
            Led::Fault => files.fault.or(files.locate),
        };
        if let Some(f) = file {
            return write_led(&f, on).map(|_| format!("sysfs {}", shown(sysfs, &f)));
        }
    }
    let Some(ledctl) = ledctl else {
        return Err(format!(
            "no {led} LED known for /dev/{disk}: no enclosure or PCIe slot in sysfs lists it, \
             and ledctl is not installed (apt-get install ledmon)"
        ));
    };
    // ledctl's IBPI patterns: locate / locate_off, failure / normal.
    let pattern = match (led, on) {
        (Led::Locate, true) => "locate",
        (Led::Locate, false) => "locate_off",
        (Led::Fault, true) => "failure",
        (Led::Fault, false) => "normal",
    };
    let arg = format!("{pattern}=/dev/{disk}");
    let mut cmd = std::process::Command::new(&ledctl);
    cmd.arg(&arg);
    match crate::smart::run_with_timeout(&mut cmd, Duration::from_secs(10)) {
        Ok((st, _)) if st.success() => Ok(format!("{} {arg}", ledctl.display())),
        Ok((st, _)) => Err(format!("{} {arg}: {st}", ledctl.display())),
        Err(e) => Err(format!("{} {arg}: {e}", ledctl.display())),
    }
}

/// Set the LED of a slot known by its location (a failed disk may have left it).
pub fn set_location(
    sysfs: &Sysfs,
    loc: &sbod_types::Location,
    led: Led,
    on: bool,
) -> Result<How, String> {
    let files = sysfs
        .slot_leds(loc)
        .ok_or_else(|| format!("no slot {loc} in sysfs"))?;
    let f = match led {
        Led::Locate => files.locate,
        Led::Fault => files.fault.or(files.locate),
    }
    .ok_or_else(|| format!("slot {loc} has no {led} LED"))?;
    write_led(&f, on).map(|_| format!("sysfs {}", shown(sysfs, &f)))
}

fn shown(sysfs: &Sysfs, f: &Path) -> String {
    match f.strip_prefix(sysfs.root()) {
        Ok(r) => format!("/{}", r.display()),
        Err(_) => f.display().to_string(),
    }
}

fn write_led(f: &Path, on: bool) -> Result<(), String> {
    std::fs::write(f, if on { "1" } else { "0" })
        .map_err(|e| format!("writing {}: {e}", f.display()))
}

/// Read an LED's state back (tests, `status`): Some(true) when lit.
pub fn get(sysfs: &Sysfs, disk: &str, led: Led) -> Option<bool> {
    let (_, files) = sysfs.location(disk)?;
    let f = match led {
        Led::Locate => files.locate?,
        Led::Fault => files.fault.or(files.locate)?,
    };
    let s = std::fs::read_to_string(f).ok()?;
    Some(s.trim() != "0")
}
