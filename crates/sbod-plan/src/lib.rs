//! sbod-plan
