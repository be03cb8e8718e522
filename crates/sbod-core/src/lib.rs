//! sbod-core
