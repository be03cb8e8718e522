//! sbod-plan: before buying 60 disks, how much usable space, how safe over five years, how
//! fast, and which layout. A pure model ([`Plan`]) and the `sbod plan` command ([`cli`]).
//!
//! ```
//! use sbod_plan::{Assumptions, Disk, Layout, Plan};
//! let layout = Layout::resolve(&"raid6:6x10".parse().unwrap(), 60).unwrap();
//! let disk = Disk { size_bytes: 20_000_000_000_000, mttf_hours: 2.5e6, seq_mb_s: None, random_iops: None };
//! let plan = Plan::new(&layout, &disk, &Assumptions::default()).unwrap();
//! assert_eq!(plan.capacity.usable.tb, 960.0);
//! assert!(plan.reliability.p_loss < 1e-6);
//! ```
//!
//! The models and their assumptions are described in docs/PLANNER.md.

pub mod capacity;
pub mod ceph;
pub mod cli;
pub mod grow;
pub mod layout;
pub mod performance;
pub mod plan;
pub mod reliability;
pub mod units;

pub use capacity::{Capacity, Size, TibConvention};
pub use grow::{Grow, GrowKind, SpeedSource};
pub use layout::{Layout, LayoutSpec, Level};
pub use performance::{closed_ops, Figure, Performance, Queueing};
pub use plan::{Assumptions, Disk, Plan, ASSUMED_DISK_MB_S};
pub use reliability::{Rebuild, Reliability};
