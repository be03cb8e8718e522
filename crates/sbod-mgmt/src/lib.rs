//! sbod's management library: one typed interface ([`Manager`]) to every management verb
//! (status, fail, remove, add, replace, scrub, set, stop, assemble, create, forget,
//! examine, metrics), with a local implementation ([`Local`], on an array opened in this
//! process) and a remote one ([`control`], the serving process's control socket). The CLI,
//! the HTTP API, the dashboard and the monitor are its clients. The registry of named
//! arrays and its policy live here too ([`registry`]).

pub mod control;
pub mod error;
pub mod health;
pub mod local;
pub mod manager;
pub mod members;
pub mod metrics;
pub mod monitor;
pub mod registry;
pub mod rejoin;
pub mod words;

pub use error::{advice_of, err, err_advised, kind_of, Error, ErrorKind};
pub use local::Local;
pub use manager::{Logged, Manager, Offline, Reporter, Via};
pub use metrics::IoStats;
