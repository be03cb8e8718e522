//! What the lab needs from sbod: arrays to create, serve, fail and rebuild. The real
//! implementation ([`crate::sbod::SbodBackend`]) drives the `sbod` command as child
//! processes; the orchestration tests use a fake.

use crate::fio::Target;
use crate::schema::ArrayInfo;
use anyhow::Result;

/// The array's health as `sbod status --json` reports it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ArrayState {
    /// optimal / degraded / rebuilding / resyncing / failed
    pub state: String,
    /// A background process now running: (kind, done bytes, total bytes).
    pub process: Option<(String, u64, u64)>,
    /// The last finished process: (kind, total bytes, elapsed seconds).
    pub last_process: Option<(String, u64, f64)>,
}

impl ArrayState {
    /// A rebuild (or a resync) is under way.
    pub fn busy(&self) -> bool {
        self.process.is_some() || self.state == "rebuilding" || self.state == "resyncing"
    }

    pub fn percent(&self) -> Option<f64> {
        self.process.as_ref().map(|(_, d, t)| {
            if *t > 0 {
                100.0 * *d as f64 / *t as f64
            } else {
                0.0
            }
        })
    }
}

pub trait Backend {
    /// The array the run measures (layout, members, size), checked for use.
    fn describe(&mut self) -> Result<ArrayInfo>;
    /// BASELINE: serve every member alone through sbod (a one-member raid0 each); one
    /// target per member, sized to its whole export.
    fn baseline_up(&mut self) -> Result<Vec<Target>>;
    /// Stop the baseline servers and undo what they needed.
    fn baseline_down(&mut self) -> Result<()>;
    /// Serve the array (creating it where the run owns it) and wait until it is optimal;
    /// `keep_going` is polled while waiting.
    fn array_up(&mut self, keep_going: &mut dyn FnMut() -> bool) -> Result<(Target, ArrayInfo)>;
    fn array_state(&mut self) -> Result<ArrayState>;
    /// DEVICE DOWN: take a member out of service.
    fn fail(&mut self, member: &str) -> Result<()>;
    /// DEVICE REBUILD: start rebuilding the failed member's slot. Returns the replacement.
    fn start_rebuild(&mut self, failed: &str) -> Result<String>;
    /// Rebuild rate floor (while clients do I/O) and ceiling, bytes/s; 0 means none.
    fn set_rebuild_rate(&mut self, min: u64, max: u64) -> Result<()>;
    /// usr+sys CPU seconds used so far by the sbod servers now running.
    fn server_cpu_secs(&mut self) -> f64;
    /// Stop serving the array.
    fn array_down(&mut self) -> Result<()>;
    /// Stop whatever still runs and remove what the run created. Never fails; safe to call
    /// more than once.
    fn cleanup(&mut self);
    /// True when the array outlives the run (`sbod bench NAME`): a member failed for DEVICE
    /// DOWN must then be rebuilt before the run ends.
    fn keeps_array(&self) -> bool;
}
