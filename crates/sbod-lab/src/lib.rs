//! sbod-lab
