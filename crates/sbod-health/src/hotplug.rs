//! Disks arriving and leaving: the kernel's uevents for block devices (a
//! NETLINK_KOBJECT_UEVENT socket through `netlink-sys`, each message parsed by
//! `kobject-uevent`), behind an [`EventSource`] trait so that tests drive a [`FakeSource`]
//! (in process) or a [`FileSource`] (the serving process, `SBOD_HOTPLUG_EVENTS`).
//! [`decide`] says what an arriving disk calls for: a former member is given back (the
//! array resyncs it from its write-intent bitmap); a disk in a failed member's slot
//! replaces it only where the array's autoreplace policy says so (ZFS's `autoreplace`),
//! never otherwise; anything else is left alone.

use sbod_types::{Identity, Location};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Add,
    Remove,
    Change,
}

/// A block device's event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskEvent {
    pub action: Action,
    /// The kernel's name ("sdc", "nvme1n1", "sdc1").
    pub name: String,
    /// A whole disk (else a partition).
    pub disk: bool,
}

/// Where block device events come from.
pub trait EventSource: Send {
    /// The next event, waiting at most `timeout` (None: none came).
    fn next(&mut self, timeout: Duration) -> io::Result<Option<DiskEvent>>;
}

/// The kernel's uevents (multicast group 1 of NETLINK_KOBJECT_UEVENT): what udev itself
/// listens to, before its rules run.
pub struct Uevents {
    sock: netlink_sys::Socket,
}

impl Uevents {
    pub fn open() -> io::Result<Uevents> {
        let mut sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_KOBJECT_UEVENT)?;
        sock.bind(&netlink_sys::SocketAddr::new(0, 1))?;
        Ok(Uevents { sock })
    }
}

/// A uevent's packet as a block device event (None: another subsystem, or an action that
/// does not matter here).
pub fn parse_uevent(pkt: &[u8]) -> Option<DiskEvent> {
    let ev = kobject_uevent::UEvent::from_netlink_packet(pkt).ok()?;
    if ev.subsystem != "block" {
        return None;
    }
    let action = match ev.action {
        kobject_uevent::ActionType::Add => Action::Add,
        kobject_uevent::ActionType::Remove => Action::Remove,
        kobject_uevent::ActionType::Change => Action::Change,
        _ => return None,
    };
    let name = ev.env.get("DEVNAME").cloned().or_else(|| {
        ev.devpath
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
    })?;
    let name = name.trim_start_matches("/dev/").to_string();
    Some(DiskEvent {
        action,
        disk: ev.env.get("DEVTYPE").is_none_or(|t| t == "disk"),
        name,
    })
}

impl EventSource for Uevents {
    fn next(&mut self, timeout: Duration) -> io::Result<Option<DiskEvent>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let mut pfd = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let n =
                unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Ok(None);
            }
            let (pkt, _) = self.sock.recv_from_full()?;
            if let Some(ev) = parse_uevent(&pkt) {
                return Ok(Some(ev));
            }
            if left.is_zero() {
                return Ok(None);
            }
        }
    }
}

/// Events a test sends.
pub struct FakeSource {
    rx: mpsc::Receiver<DiskEvent>,
}

impl FakeSource {
    pub fn new() -> (mpsc::Sender<DiskEvent>, FakeSource) {
        let (tx, rx) = mpsc::channel();
        (tx, FakeSource { rx })
    }
}

impl EventSource for FakeSource {
    fn next(&mut self, timeout: Duration) -> io::Result<Option<DiskEvent>> {
        match self.rx.recv_timeout(timeout) {
            Ok(e) => Ok(Some(e)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the event source has ended",
            )),
        }
    }
}

/// Events written as lines to a file, one per line: `add sdc`, `remove sdc`, `change sdc`,
/// `add sdc1 partition` (the serving process reads it instead of the kernel's uevents
/// where `SBOD_HOTPLUG_EVENTS` names it: tests drive the real serving process's
/// hot-plug duty with it). Lines are read as they are appended; one that does not parse
/// is skipped (and said); the file need not exist yet.
pub struct FileSource {
    path: std::path::PathBuf,
    offset: u64,
    pending: String,
}

impl FileSource {
    pub fn new(path: impl Into<std::path::PathBuf>) -> FileSource {
        FileSource {
            path: path.into(),
            offset: 0,
            pending: String::new(),
        }
    }

    /// Read what was appended since the last look.
    fn read_more(&mut self) -> io::Result<()> {
        use std::io::{Read, Seek};
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        f.seek(io::SeekFrom::Start(self.offset))?;
        let mut b = Vec::new();
        f.read_to_end(&mut b)?;
        self.offset += b.len() as u64;
        self.pending.push_str(&String::from_utf8_lossy(&b));
        Ok(())
    }

    /// The next whole line's event, skipping lines that are not one.
    fn take(&mut self) -> Option<DiskEvent> {
        while let Some(n) = self.pending.find('\n') {
            let line: String = self.pending.drain(..=n).collect();
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match parse_line(line) {
                Some(ev) => return Some(ev),
                None => eprintln!(
                    "{}: '{line}' is not a disk event (ACTION NAME [partition]); skipped",
                    self.path.display()
                ),
            }
        }
        None
    }
}

/// One line of a [`FileSource`]: `ACTION NAME [partition]`.
pub fn parse_line(line: &str) -> Option<DiskEvent> {
    let mut w = line.split_whitespace();
    let action = match w.next()? {
        "add" => Action::Add,
        "remove" => Action::Remove,
        "change" => Action::Change,
        _ => return None,
    };
    let name = w.next()?.trim_start_matches("/dev/").to_string();
    let disk = match w.next() {
        None | Some("disk") => true,
        Some("partition") => false,
        Some(_) => return None,
    };
    if w.next().is_some() || name.is_empty() || name.contains('/') {
        return None;
    }
    Some(DiskEvent { action, name, disk })
}

impl EventSource for FileSource {
    fn next(&mut self, timeout: Duration) -> io::Result<Option<DiskEvent>> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(ev) = self.take() {
                return Ok(Some(ev));
            }
            self.read_more()?;
            if let Some(ev) = self.take() {
                return Ok(Some(ev));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
}

/// A member out of service, as last seen while it was there.
#[derive(Clone, Debug, Default)]
pub struct OutMember {
    /// How the array names it (its registered path, or its uuid).
    pub member: String,
    pub identity: Option<Identity>,
    pub location: Option<Location>,
}

/// What an arriving disk calls for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A former member is back: give it back (`add`), resynced from the bitmap.
    ReAdd { member: String, device: String },
    /// A new disk in a failed member's slot, and the array's policy is autoreplace.
    Replace { old: String, new: String },
    /// A new disk in a failed member's slot, but autoreplace is off: the operator
    /// replaces it by hand (why, in words, with the commands).
    Withheld {
        old: String,
        new: String,
        why: String,
    },
    /// Nothing to do, and why.
    Leave(String),
}

/// What a disk that arrived (`device`, its identity and slot as sysfs tells them) calls
/// for, given the array's members out of service.
pub fn decide(
    device: &str,
    identity: &Identity,
    location: Option<&Location>,
    out: &[OutMember],
    autoreplace: bool,
) -> Decision {
    let same_disk = |m: &OutMember| {
        let Some(id) = &m.identity else { return false };
        (id.wwn.is_some() && id.wwn == identity.wwn)
            || (id.wwn.is_none() && id.serial.is_some() && id.serial == identity.serial)
    };
    if let Some(m) = out.iter().find(|m| same_disk(m)) {
        return Decision::ReAdd {
            member: m.member.clone(),
            device: device.to_string(),
        };
    }
    let Some(loc) = location else {
        return Decision::Leave(format!(
            "{device}: not a former member, and in no known slot"
        ));
    };
    let Some(m) = out.iter().find(|m| m.location.as_ref() == Some(loc)) else {
        return Decision::Leave(format!(
            "{device} in {loc}: not a former member, and no failed member was in that slot"
        ));
    };
    if !autoreplace {
        return Decision::Withheld {
            old: m.member.clone(),
            new: device.to_string(),
            why: format!(
                "{device} arrived in {loc}, the slot of {}: autoreplace is off (sbod set NAME --health-policy autoreplace=on), replace it by hand (sbod replace NAME {} {device})",
                m.member, m.member
            ),
        };
    }
    Decision::Replace {
        old: m.member.clone(),
        new: device.to_string(),
    }
}

/// What a block device event calls for: an added whole disk is looked up in sysfs (its
/// identity and slot) and [`decide`]d; other events call for nothing (None).
pub fn on_event(
    sysfs: &crate::sysfs::Sysfs,
    ev: &DiskEvent,
    out: &[OutMember],
    autoreplace: bool,
) -> Option<Decision> {
    if ev.action != Action::Add || !ev.disk {
        return None;
    }
    let identity = sysfs.identity(&ev.name);
    let location = sysfs.location(&ev.name).map(|(l, _)| l);
    Some(decide(
        &sysfs.dev_path(&ev.name),
        &identity,
        location.as_ref(),
        out,
        autoreplace,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_uevent_parses() {
        let pkt = b"add@/devices/pci0000:00/0000:00:1f.2/ata3/host2/target2:0:0/2:0:0:0/block/sdc\0ACTION=add\0DEVPATH=/devices/pci0000:00/0000:00:1f.2/ata3/host2/target2:0:0/2:0:0:0/block/sdc\0SUBSYSTEM=block\0MAJOR=8\0MINOR=32\0DEVNAME=sdc\0DEVTYPE=disk\0SEQNUM=4321\0";
        assert_eq!(
            parse_uevent(pkt),
            Some(DiskEvent {
                action: Action::Add,
                name: "sdc".into(),
                disk: true
            })
        );
        let part = b"remove@/devices/x/block/sdc/sdc1\0ACTION=remove\0DEVPATH=/devices/x/block/sdc/sdc1\0SUBSYSTEM=block\0DEVNAME=sdc1\0DEVTYPE=partition\0SEQNUM=4322\0";
        assert_eq!(
            parse_uevent(part).map(|e| (e.action, e.disk)),
            Some((Action::Remove, false))
        );
        let usb =
            b"add@/devices/usb1\0ACTION=add\0DEVPATH=/devices/usb1\0SUBSYSTEM=usb\0SEQNUM=9\0";
        assert_eq!(parse_uevent(usb), None);
    }

    /// A file of events, read as lines are appended; bad lines skipped, partial lines
    /// kept until whole.
    #[test]
    fn a_file_of_events_is_read_as_it_grows() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events");
        let mut src = FileSource::new(&p);
        assert_eq!(
            src.next(Duration::from_millis(10)).unwrap(),
            None,
            "no file yet"
        );
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(b"add sdc\nbogus line\nremove /dev/sdd\nadd sdc1 part")
            .unwrap();
        let ev = |a, n: &str, d| {
            Some(DiskEvent {
                action: a,
                name: n.into(),
                disk: d,
            })
        };
        let t = Duration::from_millis(10);
        assert_eq!(src.next(t).unwrap(), ev(Action::Add, "sdc", true));
        assert_eq!(src.next(t).unwrap(), ev(Action::Remove, "sdd", true));
        assert_eq!(src.next(t).unwrap(), None, "a partial line waits");
        f.write_all(b"ition\n").unwrap();
        assert_eq!(src.next(t).unwrap(), ev(Action::Add, "sdc1", false));
        assert_eq!(parse_line("add ../sda"), None);
        assert_eq!(parse_line("add sda disk extra"), None);
    }
}
