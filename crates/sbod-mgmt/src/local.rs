//! Management of an array open in this process: the serving process answers its control
//! socket with it, and the CLI uses it on an array nothing serves. Each verb is written
//! once, here.

use crate::error::{err, err_advised, ErrorKind};
use crate::metrics::IoStats;
use crate::{members, registry};
use anyhow::Result;
use sbod_core::Array;
use sbod_types::control::{GrowReply, Request, SetReply};
use sbod_types::Step;
use serde_json::Value;
use std::sync::Arc;

pub struct Local {
    /// The name the array is registered under.
    pub name: String,
    pub array: Arc<Array>,
    /// Client I/O counters (a serving process only).
    pub io: Option<Arc<IoStats>>,
    /// Fired by `stop` (a serving process only).
    pub on_stop: Option<Arc<tokio::sync::Notify>>,
}

impl Local {
    /// An array opened here for one command.
    pub fn offline(name: &str, array: Arc<Array>) -> Local {
        Local {
            name: name.to_string(),
            array,
            io: None,
            on_stop: None,
        }
    }

    /// Record the membership after a change `done` (in words: "d3.img failed") that has
    /// happened on the members, in the room taken before it. The members' superblocks
    /// are the truth; if the registration cannot be written, the error says that the
    /// change happened and only the registration is behind, and how it catches up.
    fn record(&self, room: registry::Reserved, done: &str, new_member: Option<&str>) -> Result<()> {
        let reg = registry::of_array(&self.array, Some(&self.name));
        room.commit(&reg).map_err(|e| {
            let mut advice = crate::error::advice_of(&e);
            let served = self.on_stop.is_some();
            advice.push(Step::say(match (new_member, served) {
                (_, true) => {
                    "the serving process records it again when the array stops".to_string()
                }
                (Some(p), false) => format!(
                    "until it is recorded, the array starts only with {p} named with its other members (assembling it registers it again)"
                ),
                (None, false) => {
                    "the next start records it again from the members' superblocks".to_string()
                }
            }));
            err_advised(
                ErrorKind::Io,
                format!(
                    "{}: {done} (on the members: that has happened), but the registration was not updated: {e:#}",
                    self.name
                ),
                advice,
            )
        })
    }

    /// A narrowing lets its members go when its reshape ends, long after the request:
    /// the serving process records the membership then (an assembly from a registration
    /// that still names a member let go, whose superblock is wiped, would refuse it).
    /// Offline, the caller records it after running the reshape here.
    fn save_when_reshaped(&self) {
        if self.on_stop.is_none() {
            return;
        }
        let (array, name) = (self.array.clone(), self.name.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                if Arc::strong_count(&array) == 1 {
                    // The serving process let the array go: its stop records it.
                    return;
                }
                if array.status().state != sbod_types::ArrayState::Reshaping {
                    break;
                }
            }
            if let Err(e) = registry::save_array(&array, Some(&name)) {
                tracing::warn!(array = %name, error = %e, "the registration was not brought up to date after a narrowing; the next stop does it");
            }
        });
    }

    /// After a change: recorded if it happened; if it was refused or failed, what it may
    /// have changed on the way is recorded as well as can be, and its error returned.
    fn record_after<T>(
        &self,
        room: registry::Reserved,
        r: sbod_core::Result<T>,
        done: &str,
        new_member: Option<&str>,
    ) -> Result<T> {
        match r {
            Ok(v) => {
                self.record(room, done, new_member)?;
                Ok(v)
            }
            Err(e) => {
                let _ = room.commit(&registry::of_array(&self.array, Some(&self.name)));
                Err(e.into())
            }
        }
    }

    /// Execute one request. Member names are absolute paths or uuids (see
    /// [`registry::member_ref`]); membership changes are recorded in the registry, in room
    /// taken before anything changes (a full or read-only state directory refuses the
    /// request, changing nothing).
    pub async fn call(&self, req: Request) -> Result<Value> {
        let room = if changes_membership(&req) {
            Some(registry::reserve(&self.name)?)
        } else {
            None
        };
        self.call_with(req, room).await
    }

    /// [`Local::call`] with the registration's room already taken (`None` for requests
    /// that change no membership), by a caller that takes it before opening the array.
    pub async fn call_with(&self, req: Request, room: Option<registry::Reserved>) -> Result<Value> {
        let a = &self.array;
        let room = || {
            room.ok_or_else(|| {
                anyhow::anyhow!("internal: a membership change without room for its record")
            })
        };
        Ok(match req {
            Request::Status => serde_json::to_value(a.status())?,
            Request::Fail { member, force } => {
                let room = room()?;
                let r = a.fail(&member, force).await;
                self.record_after(room, r, &format!("{member} failed"), None)?;
                Value::Null
            }
            Request::Remove { member } if a.is_log_device(&member) => {
                let room = room()?;
                let r = a.remove_log(&member).await;
                self.record_after(room, r, &format!("log device {member} removed"), None)?;
                Value::Null
            }
            Request::Remove { member } => {
                let room = room()?;
                let r = a.remove(&member).await;
                self.record_after(room, r, &format!("{member} removed"), None)?;
                Value::Null
            }
            Request::Add {
                member,
                domain,
                force,
            } => {
                let room = room()?;
                // A failed member the array still holds open goes back on that handle
                // (opening it again would meet its own lock), unless the handle is a
                // remote link given up as unreachable: the operator says the host is
                // back, so it is asked again on a new connection rather than answered
                // from the old link's failure.
                let (spec, why) = match a.held_device(&member) {
                    Some(s) if s.dev.link_up() != Some(false) => (s, None),
                    _ => {
                        // The other LUN of a member's dual-actuator drive joins its domain.
                        let (domain, why) = crate::health::joining_domains(
                            &a.status(),
                            std::slice::from_ref(&member),
                            &domain,
                            None,
                            false,
                            force,
                        )?
                        .remove(0);
                        (members::open(&member, &domain)?, why)
                    }
                };
                let r = a.add(spec, force).await;
                let outcome = self
                    .record_after(room, r, &format!("{member} added"), Some(&member))
                    .map_err(|e| explained(e, why))?;
                serde_json::to_value(outcome)?
            }
            Request::AddLog { device, force } => {
                let room = room()?;
                let spec = members::open(&device, "")?;
                let r = a.add_log(spec, force).await;
                let done = format!("log device {device} added");
                self.record_after(room, r, &done, Some(&device))?;
                Value::Null
            }
            Request::Grow {
                add,
                drop,
                remove,
                domain,
                new_groups,
                level,
                member_size,
                chunk,
                force,
            } => {
                let room = room()?;
                let before = a.size();
                let mut why = None;
                let r = match &drop {
                    None if chunk.is_some() || !remove.is_empty() => match chunk {
                        Some(c) => a.grow_chunk(c, force).await,
                        None => a.grow_remove(&remove, force).await,
                    }
                    .map(|o| {
                        let g = a.geometry();
                        let (from, to, g) = match o {
                            sbod_core::GrowOutcome::Reshaping { from, to, geometry } => {
                                (from, to, geometry)
                            }
                            _ => (before, a.size(), g),
                        };
                        self.save_when_reshaped();
                        GrowReply {
                            kind: "reshape".into(),
                            from,
                            to,
                            level: g.level,
                            groups: g.groups,
                            width: g.width,
                            chunk: g.chunk,
                        }
                    }),
                    None if add.is_empty() => {
                        let target = match member_size {
                            Some(sbod_types::control::MemberSize::Bytes(b)) => {
                                sbod_core::SizeTarget::Bytes(b)
                            }
                            _ => sbod_core::SizeTarget::Max,
                        };
                        a.grow_size(target).await.map(|_| {
                            let g = a.geometry();
                            GrowReply {
                                kind: "resized".into(),
                                from: before,
                                to: a.size(),
                                level: g.level,
                                groups: g.groups,
                                width: g.width,
                                chunk: g.chunk,
                            }
                        })
                    }
                    Some(who) => a.drop_copy(who, force).await.map(|()| GrowReply {
                        kind: "dropped".into(),
                        from: before,
                        to: a.size(),
                        level: a.geometry().level,
                        groups: a.geometry().groups,
                        width: a.geometry().width,
                        chunk: a.geometry().chunk,
                    }),
                    None => {
                        let mut specs = Vec::new();
                        let domains = crate::health::joining_domains(
                            &a.status(),
                            &add,
                            &domain,
                            None,
                            false,
                            force,
                        )?;
                        for (p, (d, w)) in add.iter().zip(domains) {
                            specs.push(members::open(p, &d)?);
                            why = why.or(w);
                        }
                        a.grow_to(level, specs, new_groups, force).await.map(|o| {
                            let g = a.geometry();
                            let (kind, from, to, g) = match o {
                                sbod_core::GrowOutcome::Reshaping { from, to, geometry } => {
                                    ("reshape", from, to, geometry)
                                }
                                sbod_core::GrowOutcome::Copies { .. } => {
                                    ("copies", before, a.size(), g)
                                }
                                sbod_core::GrowOutcome::Parity { .. } => {
                                    ("parity", before, a.size(), g)
                                }
                                sbod_core::GrowOutcome::Resized { from, to } => {
                                    ("resized", from, to, g)
                                }
                                sbod_core::GrowOutcome::Appended { from, to } => {
                                    ("appended", from, to, g)
                                }
                            };
                            GrowReply {
                                kind: kind.into(),
                                from,
                                to,
                                level: g.level,
                                groups: g.groups,
                                width: g.width,
                                chunk: g.chunk,
                            }
                        })
                    }
                };
                let done = match &drop {
                    Some(d) => format!("{d} dropped"),
                    None if !remove.is_empty() => {
                        format!(
                            "narrowing: {} leave when the data has moved",
                            remove.join(", ")
                        )
                    }
                    None if add.is_empty() => "members grown".to_string(),
                    None => format!("grown by {}", add.join(", ")),
                };
                let out = self
                    .record_after(room, r, &done, add.first().map(|s| s.as_str()))
                    .map_err(|e| explained(e, why))?;
                serde_json::to_value(out)?
            }
            Request::Replace { old, new, force } => {
                let room = room()?;
                let (domain, why) = crate::health::joining_domains(
                    &a.status(),
                    std::slice::from_ref(&new),
                    "",
                    Some(&old),
                    false,
                    force,
                )?
                .remove(0);
                let spec = members::open(&new, &domain)?;
                let r = a.replace(&old, spec, force).await;
                let done = format!("{new} is being rebuilt to replace {old}");
                self.record_after(room, r, &done, Some(&new))
                    .map_err(|e| explained(e, why))?;
                Value::Null
            }
            Request::Scrub { repair } => serde_json::to_value(a.start_scrub(repair)?.status())?,
            Request::Set {
                rebuild_min_rate,
                rebuild_max_rate,
                sync,
            } => {
                if let Some(m) = sync {
                    a.set_sync(m).await?;
                }
                let settings = a.update_settings(|s| {
                    if let Some(v) = rebuild_min_rate {
                        s.rebuild_min_rate = v;
                    }
                    if let Some(v) = rebuild_max_rate {
                        s.rebuild_max_rate = v;
                    }
                });
                serde_json::to_value(SetReply {
                    settings,
                    sync: a.sync_mode(),
                    health_policy: None,
                })?
            }
            Request::Stop => match &self.on_stop {
                Some(n) => {
                    n.notify_one();
                    Value::Null
                }
                None => {
                    return Err(err(
                        ErrorKind::Conflict,
                        format!("{} is not served", self.name),
                    ))
                }
            },
            Request::Metrics => match &self.io {
                Some(io) => serde_json::to_value(io.snapshot())?,
                None => {
                    return Err(err(
                        ErrorKind::Conflict,
                        format!("{} is not served", self.name),
                    ))
                }
            },
        })
    }
}

/// A refusal of a device that was given its dual-actuator partner's failure domain says
/// why it has that domain.
fn explained(e: anyhow::Error, why: Option<String>) -> anyhow::Error {
    match why {
        Some(w) => e.context(w),
        None => e,
    }
}

/// Requests that change who is a member (recorded in the registration).
pub fn changes_membership(req: &Request) -> bool {
    matches!(
        req,
        Request::Fail { .. }
            | Request::Remove { .. }
            | Request::Add { .. }
            | Request::AddLog { .. }
            | Request::Replace { .. }
            | Request::Grow { .. }
    )
}
