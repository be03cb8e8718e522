//! Modelled drives: members for the lab and tests that keep their data in a file (or
//! memory) and answer in the time a drive of a given model would.
//!
//! - [`profile`]: the drives (datasheet figures, with their sources);
//! - [`model`]: the timing model, pure, on a nanosecond clock (HDD: seek by distance,
//!   rotation, zones, NCQ, write cache, FLUSH and FUA, read-ahead, actuators; SSD: latency,
//!   IOPS and bandwidth ceilings);
//! - [`link`]: a bandwidth ceiling shared by the drives behind one HBA port or expander;
//! - [`dev`]: [`ModelDev`], the member, in real time with one timer thread per process;
//! - [`spec`]: the member name `model:PROFILE[,OPTIONS]:PATH`.
//!
//! docs/LAB.md, "Modelled drives", says how to use them and what each profile rests on.

pub mod dev;
pub mod link;
pub mod model;
pub mod profile;
pub mod spec;

pub use dev::ModelDev;
pub use spec::{is_model, Spec};

use link::Link;
use model::{HddModel, Model, SsdModel};
use profile::Profile;
use sbod_core::dev::BlockDev;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// The links a spec names, their state kept beside the member file (`dir`).
pub fn links_of(spec: &Spec, dir: &Path) -> io::Result<Vec<Arc<Link>>> {
    spec.links
        .iter()
        .map(|(n, r)| Link::shared(n, *r, &dir.join(format!(".sbod-link-{n}"))))
        .collect()
}

/// A timing model for `member` bytes on the drive `spec` names.
pub fn model_for(spec: &Spec, member: u64, links: Vec<Arc<Link>>) -> Box<dyn Model> {
    match &spec.profile {
        Profile::Hdd(h) => Box::new(HddModel::new(h.clone(), member, spec.full_span, links)),
        Profile::Ssd(s) => Box::new(SsdModel::new(s.clone(), links)),
    }
}

/// Wrap the device that keeps a modelled drive's data (opened from `spec.path`) as the
/// drive named `name`.
pub fn wrap(name: String, spec: &Spec, inner: Arc<dyn BlockDev>) -> io::Result<Arc<dyn BlockDev>> {
    let dir = Path::new(&spec.path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let links = links_of(spec, dir)?;
    let model = model_for(spec, inner.size(), links);
    Ok(Arc::new(ModelDev::new(name, inner, model, spec.slow)))
}
