//! sbod-nbd
