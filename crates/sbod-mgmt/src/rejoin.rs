//! Remote members of a served array: fail a member whose host stays unreachable (also when
//! no I/O touches it), and bring it back when its host answers again. Run by `sbod serve`
//! beside the array; what happens is said in the log (warnings reach the terminal).

use crate::{members, registry};
use anyhow::Result;
use sbod_core::array::Member;
use sbod_core::superblock::SlotState;
use sbod_core::Array;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

const EVERY: Duration = Duration::from_millis(250);
/// Members missing since assembly are tried every this many watches (2 s).
const RETRY_MISSING: u64 = 8;

/// Watch the array's remote members until `stop`. `missing`: registered remote members
/// that could not be opened when the array was assembled (their host was down); they are
/// tried again now and then and rejoin the array when their host answers.
pub async fn watch(
    array: Arc<Array>,
    mut missing: Vec<String>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    // Members failed while their host was unreachable: re-added when it answers again (a
    // member the administrator failed stays failed).
    let mut away: HashSet<Uuid> = HashSet::new();
    let mut tick = 0u64;
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tokio::time::sleep(EVERY) => {}
        }
        tick += 1;
        let mut changed = false;
        if !missing.is_empty() && tick % RETRY_MISSING == 0 {
            let mut still = Vec::new();
            for uri in missing {
                match rejoin(&array, &uri).await {
                    Ok(true) => {
                        tracing::warn!(array = %array.name(), member = %uri, "answers; rejoined the array");
                        changed = true;
                    }
                    Ok(false) => still.push(uri),
                    Err(e) => {
                        tracing::warn!(array = %array.name(), member = %uri, "answers but cannot rejoin: {e:#}");
                    }
                }
            }
            missing = still;
        }
        let st = array.state();
        for s in &st.slots {
            if let Some((r, _)) = &s.replacement {
                if r.dev.link_up() == Some(false) {
                    array
                        .fail_member(r, sbod_core::superblock::OutReason::Unreachable)
                        .await;
                    changed = true;
                }
            }
            let Some(m) = &s.member else { continue };
            match (m.dev.link_up(), s.state) {
                (Some(false), SlotState::Active | SlotState::Rebuilding) => {
                    array
                        .fail_member(m, sbod_core::superblock::OutReason::Unreachable)
                        .await;
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
                            tracing::warn!(array = %array.name(), member = %m.path, "answers again; re-added")
                        }
                        Err(e) => {
                            tracing::warn!(array = %array.name(), member = %m.path, "answers again but could not be re-added: {e:#}")
                        }
                    }
                    changed = true;
                }
                _ => {}
            }
        }
        for sp in &st.spares {
            if sp.dev.link_up() == Some(false) {
                array
                    .fail_member(sp, sbod_core::superblock::OutReason::Unreachable)
                    .await;
                changed = true;
            }
        }
        if changed {
            if let Err(e) = registry::save_array(&array, None) {
                tracing::warn!(array = %array.name(), "recording members: {e:#}");
            }
        }
    }
}

/// Bring a member whose host came back into its slot again.
async fn re_add(array: &Arc<Array>, m: &Arc<Member>) -> Result<()> {
    // Only what was written while the host was away is resynced: the write-intent
    // bitmap has recorded it since the member went out (a full rebuild where it cannot).
    let (path, domain) = (m.path.clone(), m.domain.clone());
    let spec = tokio::task::spawn_blocking(move || members::open(&path, &domain)).await??;
    let r = array.re_add(spec).await?;
    tracing::info!(member = %r.path, bitmap = r.bitmap, bytes = r.planned_bytes, "re-added");
    Ok(())
}

/// Try a member that was missing at assembly. `Ok(false)`: still unreachable.
async fn rejoin(array: &Arc<Array>, uri: &str) -> Result<bool> {
    let u = uri.to_string();
    let Ok(Ok(spec)) = tokio::task::spawn_blocking(move || members::open(&u, "")).await else {
        return Ok(false);
    };
    let sb = match sbod_core::array::read_superblock(&spec.dev).await {
        Ok(sb) => sb,
        Err(e) => {
            spec.dev.close();
            anyhow::bail!("{e}");
        }
    };
    let st = array.state();
    let slot = st.slots.iter().find(|s| {
        s.entry.as_ref().is_some_and(|e| e.uuid == sb.this_member)
            && s.state != SlotState::Active
            && s.state != SlotState::Rebuilding
    });
    let (Some(slot), true) = (slot, sb.array_uuid == array.uuid) else {
        spec.dev.close();
        anyhow::bail!("it no longer holds a member this array waits for");
    };
    let entry = slot.entry.as_ref().expect("found by its entry");
    let mut spec = spec;
    spec.domain = entry.domain.clone();
    // As in re_add: only what it missed, from the bitmap.
    let r = array.re_add(spec).await?;
    tracing::info!(member = %r.path, bitmap = r.bitmap, bytes = r.planned_bytes, "rejoined");
    Ok(true)
}
