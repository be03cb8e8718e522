//! sbod-gpu
