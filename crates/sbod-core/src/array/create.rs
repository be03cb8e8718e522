//! Creating an array: every layout value is checked before anything is touched, devices
//! that hold something are refused, the new members' metadata areas are claimed, and the
//! first superblocks are written.

use super::{now_secs, Array, Lineage, Member, MemberSpec, SlotRt, State};
use crate::bitmap::Bitmap;
use crate::buf::AlignedBuf;
use crate::dev::{self, BlockDev, IoClass};
use crate::error::{Error, Msg, Result, Step};
use crate::layout::{Geometry, Level};
use crate::placement::Placement;
use crate::superblock::{self, SlotState, Superblock};
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use uuid::Uuid;

#[derive(Clone, Debug)]
pub struct CreateSpec {
    pub name: String,
    pub level: Level,
    pub chunk: u32,
    /// Redundancy groups (RAID50/60); raid10 derives its groups from `copies`.
    pub groups: u32,
    /// How many of the given members are hot spares (the last ones); declustered: how
    /// many members' worth of spare space is spread over all of them.
    pub spares: usize,
    /// Spread the groups' stripes and the spare space over every member (`--declustered`,
    /// raid5, raid6 and ec:K+M: see `placement`).
    pub declustered: bool,
    /// Mirror copies for raid10 (default 2).
    pub copies: u32,
    pub bitmap_region: Option<u64>,
    /// Members are known to be zero (freshly created files) or the user says parity is in
    /// sync: skip the initial resync.
    pub assume_clean: bool,
    /// Checksums on every block (`--integrity`).
    pub integrity: crate::integrity::Kind,
    pub force: bool,
}

impl CreateSpec {
    /// Check every value of the layout that does not depend on the members' sizes, for
    /// `members` devices (spares included), before anything is created or written: a
    /// clear error naming the option and what would work. Returns (groups, width).
    pub fn check(&self, members: usize) -> Result<(u32, u32)> {
        let bad = |m: String| Err(Error::Invalid(m.into()));
        let setting = |setting: &'static str, value: String, why: String| {
            Err(Error::BadSetting {
                setting,
                value,
                why,
            })
        };
        if self.name.is_empty() || self.name.len() > superblock::MAX_NAME {
            return bad(format!(
                "array names are 1 to {} bytes",
                superblock::MAX_NAME
            ));
        }
        if !self
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return bad(format!(
                "array name '{}' may only contain letters, digits, '-', '_' and '.'",
                self.name
            ));
        }
        let chunk = self.chunk as u64;
        if !chunk.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
            return setting(
                "chunk",
                if chunk < 1024 {
                    chunk.to_string()
                } else {
                    crate::layout::human(chunk)
                },
                "the chunk is a power of two from 4K to 16M (64K is a good default)".into(),
            );
        }
        if self.groups == 0 {
            return setting(
                "groups",
                "0".into(),
                "an array has at least one group (the default, 1)".into(),
            );
        }
        if members == 0 {
            return bad("no members given".into());
        }
        if self.spares >= members {
            return setting(
                "spares",
                self.spares.to_string(),
                format!("with {members} members, that leaves none for data"),
            );
        }
        let data_members = members - self.spares;
        if self.declustered && !matches!(self.level, Level::Raid5 | Level::Raid6 | Level::Ec { .. })
        {
            return setting(
                "declustered",
                self.level.to_string(),
                "raid5, raid6 and ec:K+M can be declustered (their groups and spare space spread over every member); mirrors and raid0 cannot".into(),
            );
        }
        if self.declustered {
            let want = match self.level {
                Level::Ec { k, m } => (k + m) as usize * self.groups as usize,
                Level::Raid6 => 4 * self.groups as usize,
                _ => 3 * self.groups as usize,
            };
            if data_members < want {
                return bad(format!(
                    "a declustered {} in {} group{} with {} spare{} needs at least {} members, not {members}: give more members, or fewer groups or spares",
                    self.level,
                    self.groups,
                    if self.groups == 1 { "" } else { "s" },
                    self.spares,
                    if self.spares == 1 { "" } else { "s" },
                    want + self.spares
                ));
            }
        }
        let groups = match self.level {
            Level::Raid10 => {
                if self.groups > 1 {
                    return setting(
                        "groups",
                        self.groups.to_string(),
                        "raid10 forms its groups from its copies (mirror sets): leave groups out"
                            .into(),
                    );
                }
                let c = self.copies as usize;
                if c < 2 {
                    return setting(
                        "copies",
                        c.to_string(),
                        "a mirror set holds at least 2 copies (2 is the default)".into(),
                    );
                }
                if !data_members.is_multiple_of(c) {
                    return bad(format!(
                        "raid10 with {c} copies needs a multiple of {c} members, not {data_members}"
                    ));
                }
                (data_members / c) as u32
            }
            Level::Concat | Level::Raid0 if self.groups > 1 => {
                return setting(
                    "groups",
                    self.groups.to_string(),
                    format!("{} does not take groups", self.level),
                );
            }
            _ => self.groups,
        };
        if !data_members.is_multiple_of(groups as usize) {
            let ok: Vec<String> = (1..=data_members)
                .filter(|g| data_members.is_multiple_of(*g))
                .map(|g| g.to_string())
                .collect();
            return bad(format!(
                "{data_members} members don't split into {groups} equal groups; {} groups would",
                ok.join(", ")
            ));
        }
        let width = (data_members / groups as usize) as u32;
        if let Some(r) = self.bitmap_region {
            if r == 0 || !r.is_multiple_of(chunk) || r > MAX_MEMBER_DATA {
                return setting(
                    "bitmap_region",
                    r.to_string(),
                    format!(
                        "the region is a non-zero multiple of the chunk ({}), e.g. {}",
                        crate::layout::human(chunk),
                        crate::layout::human(chunk.max(1 << 20))
                    ),
                );
            }
        }
        // The rest of the layout's rules, on a stand-in size.
        Geometry {
            level: self.level,
            groups,
            width,
            chunk: self.chunk,
            member_size: chunk,
            data_offset: 1 << 20,
            dedicated: 0,
            declustered: self.declustered.then_some(crate::layout::Declustered {
                spares: self.spares as u32,
                seed: crate::layout::DECLUSTER_SEED,
                height: 1,
                map: 1,
            }),
        }
        .validate()
        .map_err(|e| Error::Invalid(e.into()))?;
        Ok((groups, width))
    }
}

/// Chunk limits (power of two in between).
pub const MIN_CHUNK: u64 = 4096;
pub const MAX_CHUNK: u64 = 16 << 20;
/// The most data one member may hold (the layout's limit).
pub const MAX_MEMBER_DATA: u64 = 1 << 60;

/// Refuse a device that holds anything recognisable, unless forced.
pub async fn check_blank(dev: &Arc<dyn BlockDev>, force: bool) -> Result<()> {
    let n = (crate::signature::PROBE_BYTES as u64).min(dev.size() / 4096 * 4096) as usize;
    if n == 0 {
        return Ok(());
    }
    let buf = AlignedBuf::zeroed(n).into_shared();
    dev::read_at(dev, 0, buf.clone(), IoClass::Foreground)
        .await
        .map_err(|e| Error::io(format!("reading {}", dev.name()), e))?;
    let buf = buf.try_unwrap().expect("sole owner");
    if force {
        return Ok(());
    }
    if let Ok(sb) = Superblock::decode_area(&buf) {
        return Err(Error::Refused(
            Msg::new(format!(
                "{} is a member of sbod array '{}' ({})",
                dev.name(),
                sb.name,
                sb.array_uuid
            ))
            .or(Step::say("stop that array and wipe the member"))
            .or(Step::force("overwrite it")),
        ));
    }
    if let Some(what) = crate::signature::probe(&buf) {
        return Err(Error::Refused(
            Msg::new(format!(
                "{} holds {what}: sbod does not overwrite it by itself",
                dev.name()
            ))
            .or(Step::force("overwrite it")),
        ));
    }
    Ok(())
}

/// Write zeros over a new member's whole metadata area (both superblock copies, the
/// bitmap), so that a member file holds the blocks every later superblock and bitmap write
/// lands on: state changes must be recorded even when the file system is full (a
/// superblock that cannot be written fails its member), and sparse files would otherwise
/// allocate the second superblock copy only at the array's second state change.
pub(crate) async fn claim_metadata(
    dev: &Arc<dyn BlockDev>,
    data_offset: u64,
    path: &str,
) -> Result<()> {
    let zero = AlignedBuf::zeroed(data_offset as usize).into_shared();
    dev::write_at(dev, 0, zero, true, IoClass::Foreground)
        .await
        .map_err(|e| {
            if crate::datapath::is_nospace(&e) {
                Error::NoSpace(
                    Msg::new(format!(
                        "no space left on the file system of {path} for its metadata"
                    ))
                    .or(Step::say("free space there"))
                    .or(Step::Preallocate),
                )
            } else {
                Error::io(format!("writing {path}"), e)
            }
        })
}

/// Default bitmap region: about 1024 regions per member, 1 MiB to 128 MiB, a multiple of
/// the chunk.
pub(crate) fn default_region(member_size: u64, chunk: u32) -> u64 {
    let r = (member_size / 1024)
        .next_power_of_two()
        .clamp(1 << 20, 128 << 20);
    r.max(chunk as u64)
}

impl Array {
    /// Create a new array on `members` (spares last).
    pub async fn create(spec: CreateSpec, members: Vec<MemberSpec>) -> Result<Arc<Array>> {
        let total = members.len();
        let (groups, width) = spec.check(total)?;
        // Declustered: every member is a slot (the spare space is on all of them).
        let data_members = match spec.declustered {
            true => total,
            false => total - spec.spares,
        };
        let min_size = members.iter().map(|m| m.dev.size()).min().unwrap_or(0);
        // Metadata: 2 superblock copies, then the bitmap, data 1 MiB aligned.
        let provisional = min_size.saturating_sub(2 << 20) / spec.chunk as u64 * spec.chunk as u64;
        let region = match spec.bitmap_region {
            Some(r) => r, // checked above
            None => default_region(provisional, spec.chunk),
        };
        let bitmap_bytes = Bitmap::bytes_for(provisional.div_ceil(region).max(1));
        // Checksums: a tag region between the bitmap and the data (see `integrity`).
        let tags = (spec.integrity == crate::integrity::Kind::Crc32c).then(|| {
            crate::integrity::TagLayout {
                offset: superblock::BITMAP_OFFSET + bitmap_bytes,
                // For the largest member's space: more than any member's data.
                bytes: crate::integrity::TagLayout::bytes_for(
                    members.iter().map(|m| m.dev.size()).max().unwrap_or(0),
                ),
                // Known zero (files sbod made, or the user says so): never-written blocks
                // are checked as zeros. Otherwise the initial resync tags every block.
                zeroed: spec.assume_clean,
            }
        });
        let meta_end = superblock::BITMAP_OFFSET + bitmap_bytes + tags.map_or(0, |t| t.bytes);
        let data_offset = meta_end.div_ceil(1 << 20) * (1 << 20);
        let per_member =
            |size: u64| size.saturating_sub(data_offset) / spec.chunk as u64 * spec.chunk as u64;
        let member_size = if spec.level == Level::Concat {
            members
                .iter()
                .map(|m| per_member(m.dev.size()))
                .max()
                .unwrap_or(0)
        } else {
            per_member(min_size)
        };
        let geometry = Geometry {
            level: spec.level,
            groups,
            width,
            chunk: spec.chunk,
            member_size,
            data_offset,
            dedicated: 0,
            declustered: spec.declustered.then_some(crate::layout::Declustered {
                spares: spec.spares as u32,
                seed: crate::layout::DECLUSTER_SEED,
                height: crate::tuning::decl_height().unwrap_or_else(|| {
                    crate::layout::Declustered::height_for(
                        member_size,
                        spec.chunk as u64,
                        groups as usize * width as usize + spec.spares,
                    )
                }),
                map: 1,
            }),
        };
        geometry.validate().map_err(|e| {
            if member_size == 0 {
                Error::Invalid(format!(
                    "members are too small: the smallest has {} and sbod needs more than {} of metadata",
                    crate::layout::human(min_size),
                    crate::layout::human(data_offset)
                ).into())
            } else {
                Error::Invalid(e.into())
            }
        })?;
        for m in &members {
            if per_member(m.dev.size()) == 0 {
                return Err(Error::Invalid(
                    format!("{} is too small to hold data", m.path).into(),
                ));
            }
        }
        // Failure domains: no domain may take out more members of a group than it survives.
        let redundancy = geometry.redundancy();
        let sizes: Vec<u64> = members[..data_members]
            .iter()
            .map(|m| match geometry.level {
                Level::Concat => per_member(m.dev.size()),
                _ => member_size,
            })
            .collect();
        let map = Placement::new(&geometry, &sizes);
        if !spec.force {
            for g in 0..map.sets() {
                let mut count: HashMap<&str, Vec<&str>> = HashMap::new();
                for m in &members[map.set_slots(g)] {
                    if !m.domain.is_empty() {
                        count.entry(&m.domain).or_default().push(&m.path);
                    }
                }
                for (dom, who) in count {
                    if who.len() > redundancy {
                        return Err(Error::Refused(
                            Msg::new(match map.declustered() {
                                Some(_) => format!(
                                    "failure domain '{dom}' holds {} members of the declustered array ({}), a stripe may lie on all of them, and a stripe survives only {redundancy} failure{}",
                                    who.len(),
                                    who.join(", "),
                                    if redundancy == 1 { "" } else { "s" }
                                ),
                                None => format!(
                                    "failure domain '{dom}' holds {} members of group {g} ({}) but the group survives only {redundancy} failure{}",
                                    who.len(),
                                    who.join(", "),
                                    if redundancy == 1 { "" } else { "s" }
                                ),
                            })
                            .or(Step::say(match map.declustered() {
                                Some(_) => format!(
                                    "a declustered layout may put a stripe on any of its members: spread them over at least {} domains of at most {redundancy} member{} each, or create it without declustering and order the members so each group spans more domains",
                                    data_members.div_ceil(redundancy.max(1)),
                                    if redundancy == 1 { "" } else { "s" }
                                ),
                                None => "order the members so each group spans more domains".into(),
                            }))
                            .or(Step::force("create it anyway")),
                        ));
                    }
                }
            }
        }
        // Refuse devices in use by something else, and duplicates.
        let mut seen = std::collections::HashSet::new();
        for m in &members {
            if !seen.insert(m.path.clone()) {
                return Err(Error::Invalid(format!("{} is given twice", m.path).into()));
            }
        }
        // One device under two names (a file and a loop device over it, two URIs of one
        // export): by device numbers first, writing nothing.
        crate::owner::check_local(members.iter().map(|m| m.path.as_str()))?;
        for m in &members {
            check_blank(&m.dev, spec.force).await?;
        }
        // Then by what each reads back (the only way for remote members).
        let named: Vec<(String, Arc<dyn crate::dev::BlockDev>)> = members
            .iter()
            .map(|m| (m.path.clone(), m.dev.clone()))
            .collect();
        crate::owner::probe_identity(&named).await?;
        let uuid = Uuid::new_v4();
        let opened: Vec<Arc<Member>> = members
            .into_iter()
            .map(|m| {
                let size = if geometry.level == Level::Concat {
                    per_member(m.dev.size())
                } else {
                    member_size
                };
                Arc::new(Member {
                    dev: m.dev,
                    uuid: Uuid::new_v4(),
                    path: m.path,
                    domain: m.domain,
                    size,
                    is_file: m.is_file,
                    stats: Default::default(),
                    tags: Default::default(),
                })
            })
            .collect();
        let (slot_members, spare_members) = opened.split_at(data_members);
        let state = State {
            slots: slot_members
                .iter()
                .map(|m| SlotRt {
                    entry: Some(m.entry()),
                    member: Some(m.clone()),
                    state: SlotState::Active,
                    recovery: Arc::new(AtomicU64::new(0)),
                    replacement: None,
                    out: None,
                    bitmap_recovery: false,
                    note: None,
                })
                .collect(),
            spares: spare_members.to_vec(),
            failed: None,
        };
        let resync = if spec.assume_clean || geometry.redundancy() == 0 {
            u64::MAX
        } else {
            0
        };
        let (session, history) = Lineage::start(&[], 1);
        let array = Array::build(
            spec.name.clone(),
            uuid,
            now_secs(),
            geometry,
            state,
            0,
            region,
            bitmap_bytes as u32,
            resync,
            &[],
            Lineage {
                session,
                history,
                bitmap_since: AtomicU64::new(1),
                tags,
                extensions: Vec::new(),
            },
        )?;
        // Zero the metadata areas (both superblock copies and the bitmap), then write the
        // superblocks.
        let futs = opened
            .iter()
            .map(|m| claim_metadata(&m.dev, data_offset, &m.path));
        futures::future::try_join_all(futs).await?;
        // Held by this head from its first superblock on (the blocks were just zeroed:
        // nobody else holds them).
        let claim = super::ownership::Claim::take(
            named,
            uuid,
            &spec.name,
            crate::owner::default_config(),
            false,
        )
        .await?;
        array.hold(&claim);
        let st = array.dp().state.load_full();
        let failed = array.persist(&st, false).await;
        if !failed.is_empty() {
            return Err(Error::Invalid(
                format!(
                    "could not write the superblock to {}",
                    failed
                        .iter()
                        .map(|m| m.path.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
                .into(),
            ));
        }
        array.start_processes();
        Ok(array)
    }
}
