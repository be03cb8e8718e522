//! Remote members of a served array: fail a member whose host stays unreachable (also when
//! no I/O touches it), and bring it back when its host answers again.

use crate::{cmd, members};
use anyhow::Result;
use sbod_core::array::Member;
use sbod_core::superblock::SlotState;
use sbod_core::Array;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const EVERY: Duration = Duration::from_millis(250);

/// Watch the array's remote members until `stop`.
pub async fn watch(array: Arc<Array>, mut stop: tokio::sync::watch::Receiver<bool>) {
    // Members failed while their host was unreachable: re-added when it answers again (a
    // member the administrator failed stays failed).
    let mut away: HashSet<Uuid> = HashSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        let st = array.state();
        let mut changed = false;
        for s in &st.slots {
            if let Some((r, _)) = &s.replacement {
                if r.dev.link_up() == Some(false) {
                    array.fail_member(r, "unreachable").await;
                    changed = true;
                }
            }
            let Some(m) = &s.member else { continue };
            match (m.dev.link_up(), s.state) {
                (Some(false), SlotState::Active | SlotState::Rebuilding) => {
                    array.fail_member(m, "unreachable").await;
                    away.insert(m.uuid);
                    changed = true;
                }
                (Some(false), SlotState::Failed) => {
                    away.insert(m.uuid);
                }
                (Some(true), SlotState::Failed) if away.contains(&m.uuid) => {
                    away.remove(&m.uuid);
                    match re_add(&array, m).await {
                        Ok(()) => {
                            eprintln!("sbod: {}: {} answers again; re-added", array.name, m.path)
                        }
                        Err(e) => eprintln!(
                            "sbod: {}: {} answers again but could not be re-added: {e:#}",
                            array.name, m.path
                        ),
                    }
                    changed = true;
                }
                _ => {}
            }
        }
        for sp in &st.spares {
            if sp.dev.link_up() == Some(false) {
                array.fail_member(sp, "unreachable").await;
                changed = true;
            }
        }
        if changed {
            if let Err(e) = cmd::save_registry(&array) {
                eprintln!("sbod: {}: recording members: {e:#}", array.name);
            }
        }
    }
}

/// Bring a member whose host came back into its slot again.
async fn re_add(array: &Arc<Array>, m: &Arc<Member>) -> Result<()> {
    // INTEGRATION POINT (issue 13, branch trust-asm): once the engine can re-add a former
    // member (Array::re_add, with recovery from the write-intent bitmap), call it here so
    // only the regions written while the host was away are resynced. Until then the member
    // is rebuilt in full, in place (a replace by itself, with fresh connections).
    let (path, domain) = (m.path.clone(), m.domain.clone());
    let spec = tokio::task::spawn_blocking(move || members::open(&path, &domain)).await??;
    array.replace(&m.uuid.to_string(), spec, true).await?;
    Ok(())
}
