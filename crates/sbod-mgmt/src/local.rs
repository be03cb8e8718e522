//! Management of an array open in this process: the serving process answers its control
//! socket with it, and the CLI uses it on an array nothing serves. Each verb is written
//! once, here.

use crate::error::{err, ErrorKind};
use crate::metrics::IoStats;
use crate::{members, registry};
use anyhow::Result;
use sbod_core::Array;
use sbod_types::control::{Request, SetReply};
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

    fn save(&self) -> Result<()> {
        registry::save_array(&self.array, Some(&self.name))
    }

    /// Execute one request. Member names are absolute paths or uuids (see
    /// [`registry::member_ref`]); membership changes are recorded in the registry.
    pub async fn call(&self, req: Request) -> Result<Value> {
        let a = &self.array;
        Ok(match req {
            Request::Status => serde_json::to_value(a.status())?,
            Request::Fail { member, force } => {
                let r = a.fail(&member, force).await;
                self.save()?;
                r?;
                Value::Null
            }
            Request::Remove { member } if a.is_log_device(&member) => {
                let r = a.remove_log(&member).await;
                self.save()?;
                r?;
                Value::Null
            }
            Request::Remove { member } => {
                let r = a.remove(&member).await;
                self.save()?;
                r?;
                Value::Null
            }
            Request::Add {
                member,
                domain,
                force,
            } => {
                // A failed member the array still holds open goes back on that handle
                // (opening it again would meet its own lock).
                let spec = match a.held_device(&member) {
                    Some(s) => s,
                    None => members::open(&member, &domain)?,
                };
                let outcome = a.add(spec, force).await?;
                self.save()?;
                serde_json::to_value(outcome)?
            }
            Request::AddLog { device, force } => {
                let spec = members::open(&device, "")?;
                let r = a.add_log(spec, force).await;
                self.save()?;
                r?;
                Value::Null
            }
            Request::Replace { old, new, force } => {
                let spec = members::open(&new, "")?;
                a.replace(&old, spec, force).await?;
                self.save()?;
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
                let mut s = a.settings.lock();
                if let Some(v) = rebuild_min_rate {
                    s.rebuild_min_rate = v;
                }
                if let Some(v) = rebuild_max_rate {
                    s.rebuild_max_rate = v;
                }
                serde_json::to_value(SetReply {
                    settings: s.clone(),
                    sync: a.sync_mode(),
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
