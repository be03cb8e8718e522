//! Layouts: a level, how the disks split into redundancy groups, and hot spares.
//!
//! Level names and semantics are shared with the rest of sbod:
//! `raid0`, `concat`, `raid1` (the whole group is one n-way mirror set), `raid10` (stripe
//! over mirror sets of `copies` disks, default 2), `raid5`, `raid6`, `ec:K+M` (group width
//! K+M). `groups` stripes the volume over that many equal groups (RAID50/60 style); hot
//! spares are taken from the disk count.
//!
//! The compact spelling used by `sbod plan --compare` (see [`LayoutSpec`]) is
//! `LEVEL[:GxW][:cN][:sN]`, e.g. `raid6:6x10`, `raid1:20x3`, `raid10:1x60:c3`,
//! `ec:8+3:5x11:s5`.

use std::str::FromStr;

use anyhow::{bail, Context, Result};
use serde::Serialize;

pub use sbod_types::level::{Level, LEVELS_HINT};

/// The share of the declustered rebuild's bound ([`Layout::rebuild_bound`]) that sbod's
/// distributed rebuild reaches, measured side by side with raid6 groups and hot spares on
/// the same modelled nearline drives: 0.86-0.89 at 24 members, 0.80-0.84 at 48
/// (docs/PERFORMANCE.md, "Rows for whole sweeps, and the aim side by side"). The planner's
/// rebuild window is the measured one, not the bound.
pub const DECLUSTERED_REBUILD_EFFICIENCY: f64 = 0.8;

/// A layout as the user wrote it; [`Layout::resolve`] checks it against a disk count and
/// fills in what was left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayoutSpec {
    pub level: Level,
    /// Number of redundancy groups the volume stripes over.
    pub groups: Option<u32>,
    /// Disks per group.
    pub width: Option<u32>,
    /// Copies per mirror set (raid1, raid10).
    pub copies: Option<u32>,
    /// Hot spares, taken from the disk count (declustered: disks' worth of spare space
    /// spread over every disk).
    pub spares: Option<u32>,
    /// Declustered (`sbod create --declustered`, the spelling's `:d`): the groups' stripes
    /// and the spare space spread over every disk.
    pub declustered: bool,
}

impl LayoutSpec {
    pub fn new(level: Level) -> LayoutSpec {
        LayoutSpec {
            level,
            groups: None,
            width: None,
            copies: None,
            spares: None,
            declustered: false,
        }
    }
}

const SPEC_HINT: &str = "write LEVEL[:GxW][:cN][:sN][:d], e.g. raid6:6x10 (6 groups of 10), \
                         raid1:20x3 (20 three-way mirrors), raid10:1x60:c3, ec:8+3:5x11:s5 \
                         (5 groups of 11 and 5 hot spares), raid6:2x10:s4:d (the same \
                         declustered: stripes and 4 disks' worth of spare space on all 24)";

impl FromStr for LayoutSpec {
    type Err = anyhow::Error;

    /// Parses the compact spelling `LEVEL[:GxW][:cN][:sN]`.
    fn from_str(s: &str) -> Result<LayoutSpec> {
        let t = s.trim();
        let mut parts: Vec<&str> = t.split(':').collect();
        // `ec:K+M` carries its own colon.
        let level_text = if parts[0].eq_ignore_ascii_case("ec") && parts.len() > 1 {
            let l = format!("{}:{}", parts[0], parts[1]);
            parts.drain(..2);
            l
        } else {
            parts.remove(0).to_string()
        };
        let level: Level = level_text.parse()?;
        let mut spec = LayoutSpec::new(level);
        for field in parts {
            let f = field.trim().to_ascii_lowercase();
            let number = |n: &str| -> Result<u32> {
                n.parse().with_context(|| {
                    format!("{field:?} in layout {s:?} is not understood: {SPEC_HINT}")
                })
            };
            if let Some((g, w)) = f.split_once('x') {
                set_once(&mut spec.groups, number(g)?, "groups", s)?;
                set_once(&mut spec.width, number(w)?, "group width", s)?;
            } else if let Some(n) = f.strip_prefix('c') {
                set_once(&mut spec.copies, number(n)?, "copies", s)?;
            } else if let Some(n) = f.strip_prefix('s') {
                set_once(&mut spec.spares, number(n)?, "spares", s)?;
            } else if f == "d" {
                if spec.declustered {
                    bail!("layout {s:?} says declustered twice");
                }
                spec.declustered = true;
            } else {
                bail!("{field:?} in layout {s:?} is not understood: {SPEC_HINT}");
            }
        }
        Ok(spec)
    }
}

fn set_once(slot: &mut Option<u32>, v: u32, what: &str, spec: &str) -> Result<()> {
    if slot.is_some() {
        bail!("layout {spec:?} gives the {what} twice");
    }
    *slot = Some(v);
    Ok(())
}

/// A layout checked against a disk count: every figure the models need.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Layout {
    /// The canonical compact spelling, e.g. `raid6:6x10` or `ec:8+3:5x11:s5`.
    pub spec: String,
    pub level: Level,
    /// A sentence for people, e.g. "6 groups of 10 disks (8 data + 2 parity), striped".
    pub description: String,
    /// All disks, spares included.
    pub disks: u32,
    pub spares: u32,
    /// Disks in redundancy groups: `disks - spares`.
    pub members: u32,
    pub groups: u32,
    pub group_width: u32,
    /// Copies per mirror set (raid1, raid10).
    pub copies: Option<u32>,
    /// Disks' worth of user data: `members - redundancy_disks`.
    pub data_disks: u32,
    /// Disks' worth of parity or extra copies.
    pub redundancy_disks: u32,
    /// Independent failure units for the reliability model: redundancy groups, or mirror
    /// sets for raid10, or the whole array for raid0/concat.
    pub sets: u32,
    /// Disks in each failure unit.
    pub set_width: u32,
    /// Failures each unit survives.
    pub set_tolerates: u32,
    /// Declustered: every stripe and the spare space spread over all disks (one failure
    /// unit of all of them).
    pub declustered: bool,
}

impl Layout {
    /// Checks `spec` against `disks`, filling in what it leaves out; errors say what would work.
    pub fn resolve(spec: &LayoutSpec, disks: u32) -> Result<Layout> {
        let level = spec.level;
        let min = min_width(level, spec.copies.unwrap_or(2));
        if disks == 0 {
            bail!("zero disks: give --disks N ({level} needs at least {min})");
        }
        if let (
            Some(_),
            Level::Raid0 | Level::Concat | Level::Raid5 | Level::Raid6 | Level::Ec { .. },
        ) = (spec.copies, level)
        {
            bail!("copies apply to raid1 and raid10 only, not {level}: drop --copies");
        }
        if let Level::Ec { k, m } = level {
            check_ec(k, m)?;
        }
        if spec.copies.is_some_and(|c| c < 2) {
            bail!("a mirror needs at least 2 copies; for no redundancy use raid0");
        }
        if spec.declustered && !matches!(level, Level::Raid5 | Level::Raid6 | Level::Ec { .. }) {
            bail!("{level} cannot be declustered: raid5, raid6 and ec:K+M can (drop :d)");
        }
        let spares = spec.spares.unwrap_or(0);
        if spares >= disks || disks - spares < min {
            let most = disks.saturating_sub(min);
            bail!(
                "{disks} disks with {spares} hot spares leave {} for data, and {level} needs at \
                 least {min}: use at most {most} spares{}",
                disks.saturating_sub(spares),
                if disks < min {
                    format!(" and at least {min} disks")
                } else {
                    String::new()
                }
            );
        }
        let members = disks - spares;
        let copies = spec.copies.unwrap_or(2);
        let (groups, width) = match level {
            Level::Raid0 | Level::Concat => {
                if spec.groups.is_some_and(|g| g > 1) {
                    bail!(
                        "{level} has no redundancy groups to stripe over: drop the groups \
                         (for striped parity groups use e.g. raid6 with {} groups)",
                        spec.groups.unwrap_or(2)
                    );
                }
                if spec.width.is_some_and(|w| w != members) {
                    bail!(
                        "{level} uses all {} as one set",
                        disks_phrase(members, spares)
                    );
                }
                (1, members)
            }
            Level::Raid1 => {
                let width = spec.copies.or(spec.width);
                if let (Some(c), Some(w)) = (spec.copies, spec.width) {
                    if c != w {
                        bail!("raid1 groups are one mirror set, so copies ({c}) and group width ({w}) must agree");
                    }
                }
                split(level, copies, members, spares, spec.groups, width)?
            }
            Level::Ec { k, m } => split(
                level,
                copies,
                members,
                spares,
                spec.groups,
                Some(spec.width.unwrap_or(u32::from(k + m))),
            )?,
            Level::Raid10 | Level::Raid5 | Level::Raid6 => {
                split(level, copies, members, spares, spec.groups, spec.width)?
            }
        };
        if width < min {
            bail!(
                "{}",
                too_narrow(level, spec.copies.unwrap_or(2), members, groups, width)
            );
        }
        if let Level::Ec { k, m } = level {
            if width != u32::from(k + m) {
                bail!(
                    "{level} groups are {} disks wide, not {width}: {}",
                    k + m,
                    ec_alternatives(k, m, members, spares)
                );
            }
        }
        if level == Level::Raid6 && width - 2 > 255 {
            bail!(
                "raid6 groups hold at most 255 data disks (the P+Q code's limit); {width} disks \
                 per group is too wide: use at least {} groups",
                members.div_ceil(257)
            );
        }
        if level == Level::Raid10 {
            let c = copies;
            if width % c != 0 {
                bail!(
                    "raid10 groups of {width} disks don't split into {c}-way mirror sets: {}",
                    group_alternatives(level, c, members, spares)
                );
            }
        }
        let (sets, set_width, set_tolerates, data_disks) = match level {
            Level::Raid0 | Level::Concat => (1, members, 0, members),
            Level::Raid1 => (groups, width, width - 1, groups),
            Level::Raid10 => (members / copies, copies, copies - 1, members / copies),
            Level::Raid5 => (groups, width, 1, groups * (width - 1)),
            Level::Raid6 => (groups, width, 2, groups * (width - 2)),
            Level::Ec { k, m } => (groups, width, m.into(), groups * u32::from(k)),
        };
        let copies = match level {
            Level::Raid1 => Some(width),
            Level::Raid10 => Some(copies),
            _ => None,
        };
        // Declustered: any stripe may lie on any disk, so all of them are one failure
        // unit that survives the parity's failures.
        let (sets, set_width) = match spec.declustered {
            true => (1, disks),
            false => (sets, set_width),
        };
        let mut layout = Layout {
            spec: String::new(),
            level,
            description: String::new(),
            disks,
            spares,
            members,
            groups,
            group_width: width,
            copies,
            data_disks,
            redundancy_disks: members - data_disks,
            sets,
            set_width,
            set_tolerates,
            declustered: spec.declustered,
        };
        layout.spec = layout.canonical_spec();
        layout.description = layout.describe();
        Ok(layout)
    }

    fn canonical_spec(&self) -> String {
        let mut s = self.level.to_string();
        if !matches!(self.level, Level::Raid0 | Level::Concat) {
            s += &format!(":{}x{}", self.groups, self.group_width);
        }
        if self.level == Level::Raid10 {
            s += &format!(":c{}", self.copies.unwrap_or(2));
        }
        if self.spares > 0 {
            s += &format!(":s{}", self.spares);
        }
        if self.declustered {
            s += ":d";
        }
        s
    }

    /// Data chunks per stripe (parity layouts).
    pub fn stripe_data(&self) -> u32 {
        match self.level {
            Level::Raid5 => self.group_width - 1,
            Level::Raid6 => self.group_width - 2,
            Level::Ec { k, .. } => u32::from(k),
            _ => 1,
        }
    }

    /// How much faster a failed disk is rebuilt than onto one replacement: a declustered
    /// layout with spare space reads the `D` chunks of each lost chunk's stripe and writes
    /// it from and to all `N - 1` survivors at once, at best `(N - 1) / (D + 1)`
    /// ([`Layout::rebuild_bound`]), and sbod's distributed rebuild reaches
    /// [`DECLUSTERED_REBUILD_EFFICIENCY`] of that (at least 1); every other layout writes
    /// one replacement, 1.
    pub fn rebuild_speedup(&self) -> f64 {
        match self.declustered && self.spares > 0 {
            true => (self.rebuild_bound() * DECLUSTERED_REBUILD_EFFICIENCY).max(1.0),
            false => 1.0,
        }
    }

    /// The declustered rebuild's bound: `(N - 1) / (D + 1)` times one replacement's (at
    /// least 1; 1 for every layout without distributed spare space).
    pub fn rebuild_bound(&self) -> f64 {
        match self.declustered && self.spares > 0 {
            true => ((self.disks - 1) as f64 / (self.stripe_data() + 1) as f64).max(1.0),
            false => 1.0,
        }
    }

    fn describe(&self) -> String {
        let (g, w) = (self.groups, self.group_width);
        let groups = |inner: String| {
            if g == 1 {
                format!("one group of {w} ({inner})")
            } else {
                format!("{g} groups of {w} ({inner}), striped")
            }
        };
        let mut d = match self.level {
            Level::Raid0 => format!("striped over {w} disks, no redundancy"),
            Level::Concat => format!("{w} disks concatenated, no redundancy"),
            Level::Raid1 if g == 1 => format!("one {w}-way mirror"),
            Level::Raid1 => format!("{g} {w}-way mirrors, striped"),
            Level::Raid10 => format!(
                "striped over {} {}-way mirror sets",
                self.sets, self.set_width
            ),
            Level::Raid5 => groups(format!("{} data + 1 parity", w - 1)),
            Level::Raid6 => groups(format!("{} data + 2 parity", w - 2)),
            Level::Ec { k, m } => groups(format!("{k} data + {m} parity")),
        };
        if self.declustered {
            d += &format!(
                ", declustered over all {} disks with {} disk{}' worth of spare space",
                self.disks,
                self.spares,
                if self.spares == 1 { "" } else { "s" }
            );
        } else if self.spares > 0 {
            d += &format!(
                ", {} hot spare{}",
                self.spares,
                if self.spares == 1 { "" } else { "s" }
            );
        }
        d
    }
}

/// The fewest disks a group of `level` may have.
fn min_width(level: Level, copies: u32) -> u32 {
    match level {
        Level::Raid0 | Level::Concat => 1,
        Level::Raid1 => 2,
        Level::Raid10 => copies.max(2),
        Level::Raid5 => 3,
        Level::Raid6 => 4,
        Level::Ec { k, m } => u32::from(k + m),
    }
}

fn check_ec(k: u16, m: u16) -> Result<()> {
    let (k, m) = (u32::from(k), u32::from(m));
    if k == 0 {
        bail!("ec:{k}+{m} has no data disks: K must be at least 1, e.g. ec:8+3");
    }
    if m == 0 {
        bail!("ec:{k}+{m} has no parity, so no redundancy: use raid0, or ec:{k}+2 / ec:{k}+3");
    }
    if m > k {
        bail!(
            "ec:{k}+{m} has more parity ({m}) than data ({k}): a {}-way mirror (raid1 --copies {}) \
             survives as many failures with simpler I/O; or use ec:K+{m} with K >= {m}, e.g. ec:{}+{m}",
            m + 1,
            m + 1,
            (2 * m).max(k)
        );
    }
    if k + m > 256 {
        bail!(
            "ec:{k}+{m} has {} disks per group; the Reed-Solomon code allows at most 256",
            k + m
        );
    }
    Ok(())
}

fn width_ok(level: Level, copies: u32, width: u32) -> bool {
    width >= min_width(level, copies)
        && match level {
            Level::Raid10 => width % copies.max(1) == 0,
            Level::Raid6 => width - 2 <= 255,
            Level::Ec { k, m } => width == u32::from(k + m),
            _ => true,
        }
}

fn feasible_groups(level: Level, copies: u32, members: u32) -> Vec<u32> {
    (1..=members)
        .filter(|g| members % g == 0 && width_ok(level, copies, members / g))
        .collect()
}

fn or_list(items: &[u32]) -> String {
    match items {
        [] => String::new(),
        [one] => one.to_string(),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(u32::to_string).collect();
            format!("{} or {last}", rest.join(", "))
        }
    }
}

fn disks_phrase(members: u32, spares: u32) -> String {
    if spares == 0 {
        format!("{members} disks")
    } else {
        format!("{members} disks (after {spares} spares)")
    }
}

fn group_alternatives(level: Level, copies: u32, members: u32, spares: u32) -> String {
    let ok = feasible_groups(level, copies, members);
    if ok.is_empty() {
        return format!(
            "no group count works for {level} on {}; change the spares or the disk count",
            disks_phrase(members, spares)
        );
    }
    format!(
        "{} groups would work for {level} on {}",
        or_list(&ok),
        disks_phrase(members, spares)
    )
}

fn ec_alternatives(k: u16, m: u16, members: u32, spares: u32) -> String {
    let (k, m) = (u32::from(k), u32::from(m));
    let w = k + m;
    let fit = members / w;
    let mut s = String::new();
    if fit > 0 {
        let left = members - fit * w;
        s += &format!(
            "{} hold {fit} such group{} ({} disks) with {left} left over: keep them as hot spares \
             (ec:{k}+{m}:{fit}x{w}:s{})",
            disks_phrase(members, spares),
            if fit == 1 { "" } else { "s" },
            fit * w,
            left + spares
        );
    }
    // The few widths closest to the one asked for that divide the disks evenly.
    let mut widths: Vec<u32> = (2 * m..=members.min(256))
        .filter(|&width| members % width == 0)
        .collect();
    widths.sort_by_key(|&width| (width as i64 - w as i64).abs());
    widths.truncate(4);
    widths.sort_unstable();
    let others: Vec<String> = widths
        .iter()
        .map(|width| format!("ec:{}+{m}", width - m))
        .collect();
    if !others.is_empty() {
        if !s.is_empty() {
            s += ", or ";
        }
        s += &format!("use a width that divides {members}: {}", others.join(", "));
    }
    if s.is_empty() {
        s = format!("{members} disks are too few for ec:{k}+{m}");
    }
    s
}

fn too_narrow(level: Level, copies: u32, members: u32, groups: u32, width: u32) -> String {
    let min = min_width(level, copies);
    let ok = feasible_groups(level, copies, members);
    let mut s = format!(
        "{level} needs at least {min} disks per group; {members} disks in {groups} group{} give {width}",
        if groups == 1 { "" } else { "s" }
    );
    if let Some(&most) = ok.last() {
        // Suggest the split closest to 10 disks per group, a common choice.
        let best = ok
            .iter()
            .min_by_key(|&&g| ((members / g) as i64 - 10).abs())
            .copied()
            .unwrap_or(most);
        s += &format!(
            ": use at most {most} groups (e.g. {best} group{} of {})",
            if best == 1 { "" } else { "s" },
            members / best
        );
    }
    s
}

/// Works out (groups, width) from what the user gave; one group when neither is given.
fn split(
    level: Level,
    copies: u32,
    members: u32,
    spares: u32,
    groups: Option<u32>,
    width: Option<u32>,
) -> Result<(u32, u32)> {
    match (groups, width) {
        (Some(0), _) => bail!("zero groups: give at least 1"),
        (_, Some(0)) => bail!(
            "zero disks per group: give at least {}",
            min_width(level, copies)
        ),
        (Some(g), Some(w)) => {
            if g.checked_mul(w) != Some(members) {
                let used = g as u64 * w as u64;
                let hint = if used < members as u64
                    && g as u64 * w as u64 + spares as u64 <= u32::MAX as u64
                {
                    let left = members as u64 - used;
                    format!(
                        "; to keep the other {left} as hot spare{} say so (:s{} or --spares {})",
                        if left == 1 { "" } else { "s" },
                        members as u64 - used + spares as u64,
                        members as u64 - used + spares as u64
                    )
                } else {
                    String::new()
                };
                bail!(
                    "{g} groups of {w} use {used} disks but the layout has {}{hint}",
                    disks_phrase(members, spares)
                );
            }
            Ok((g, w))
        }
        (Some(g), None) => {
            if members % g != 0 {
                let ok = feasible_groups(level, copies, members);
                bail!(
                    "{} don't split into {g} equal groups; {}",
                    disks_phrase(members, spares),
                    if ok.is_empty() {
                        "change the spares or the disk count".to_string()
                    } else {
                        format!("{} groups would", or_list(&ok))
                    }
                );
            }
            Ok((g, members / g))
        }
        (None, Some(w)) => {
            if let (Level::Ec { k, m }, true) = (level, members % w != 0) {
                bail!(
                    "{level} doesn't fit: {}",
                    ec_alternatives(k, m, members, spares)
                );
            }
            if members % w != 0 {
                bail!(
                    "{} don't split into groups of {w}; {} left over: {}",
                    disks_phrase(members, spares),
                    members % w,
                    group_alternatives(level, copies, members, spares)
                );
            }
            Ok((members / w, w))
        }
        (None, None) => Ok((1, members)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(s: &str) -> LayoutSpec {
        s.parse().unwrap()
    }

    fn err(s: &str, disks: u32) -> String {
        format!("{:#}", Layout::resolve(&spec(s), disks).unwrap_err())
    }

    #[test]
    fn parses_levels_and_specs() {
        assert_eq!("RAID6".parse::<Level>().unwrap(), Level::Raid6);
        assert_eq!("ec:8+3".parse::<Level>().unwrap(), Level::Ec { k: 8, m: 3 });
        assert!("raid7"
            .parse::<Level>()
            .unwrap_err()
            .to_string()
            .contains("raid6"));
        assert!("ec:8"
            .parse::<Level>()
            .unwrap_err()
            .to_string()
            .contains("ec:K+M"));
        let s = spec("ec:8+3:5x11:s5");
        assert_eq!(s.level, Level::Ec { k: 8, m: 3 });
        assert_eq!((s.groups, s.width, s.spares), (Some(5), Some(11), Some(5)));
        let s = spec("raid10:c3");
        assert_eq!(s.copies, Some(3));
        assert!("raid6:6y10".parse::<LayoutSpec>().is_err());
        assert!("raid6:s1:s2"
            .parse::<LayoutSpec>()
            .unwrap_err()
            .to_string()
            .contains("twice"));
    }

    #[test]
    fn field_reference_layouts() {
        let l = Layout::resolve(&spec("raid6:6x10"), 60).unwrap();
        assert_eq!(
            (l.groups, l.group_width, l.data_disks, l.redundancy_disks),
            (6, 10, 48, 12)
        );
        assert_eq!((l.sets, l.set_width, l.set_tolerates), (6, 10, 2));
        assert_eq!(l.spec, "raid6:6x10");
        let l = Layout::resolve(&spec("raid1:20x3"), 60).unwrap();
        assert_eq!(
            (l.data_disks, l.sets, l.set_width, l.set_tolerates),
            (20, 20, 3, 2)
        );
        let l = Layout::resolve(&spec("raid1:c2"), 60).unwrap();
        assert_eq!((l.groups, l.data_disks, l.copies), (30, 30, Some(2)));
        let l = Layout::resolve(&spec("ec:12+3"), 60).unwrap();
        assert_eq!((l.groups, l.data_disks, l.set_tolerates), (4, 48, 3));
        let l = Layout::resolve(&spec("ec:8+3:5x11:s5"), 60).unwrap();
        assert_eq!((l.members, l.data_disks), (55, 40));
        let l = Layout::resolve(&spec("raid10"), 60).unwrap();
        assert_eq!(
            (l.sets, l.set_width, l.data_disks, l.spec.as_str()),
            (30, 2, 30, "raid10:1x60:c2")
        );
        let l = Layout::resolve(&spec("raid0"), 60).unwrap();
        assert_eq!(
            (l.sets, l.set_width, l.set_tolerates, l.data_disks),
            (1, 60, 0, 60)
        );
        let l = Layout::resolve(&spec("raid1"), 2).unwrap();
        assert_eq!(l.description, "one 2-way mirror");
    }

    #[test]
    fn errors_say_what_would_work() {
        let e = err("raid6:7x1", 7);
        assert!(e.contains("at least 4 disks per group"), "{e}");
        let e = Layout::resolve(
            &LayoutSpec {
                groups: Some(7),
                ..LayoutSpec::new(Level::Raid6)
            },
            60,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("60 disks don't split into 7 equal groups"),
            "{e}"
        );
        assert!(
            e.contains("1, 2, 3, 4, 5, 6, 10, 12 or 15 groups would"),
            "{e}"
        );
        let e = Layout::resolve(
            &LayoutSpec {
                groups: Some(20),
                ..LayoutSpec::new(Level::Raid6)
            },
            60,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("raid6 needs at least 4 disks per group; 60 disks in 20 groups give 3"),
            "{e}"
        );
        assert!(e.contains("at most 15 groups (e.g. 6 groups of 10)"), "{e}");
        let e = err("ec:2+3", 60);
        assert!(e.contains("more parity (3) than data (2)"), "{e}");
        let e = err("ec:8+3", 60);
        assert!(
            e.contains("5 such groups (55 disks) with 5 left over"),
            "{e}"
        );
        assert!(e.contains("ec:8+3:5x11:s5"), "{e}");
        assert!(e.contains("ec:12+3"), "{e}");
        let e = err("raid6", 0);
        assert!(e.contains("zero disks"), "{e}");
        let e = err("raid6:s3", 6);
        assert!(e.contains("use at most 2 spares"), "{e}");
        let e = err("raid6:6x9", 60);
        assert!(e.contains("keep the other 6 as hot spares"), "{e}");
        let e = err("raid10:1x9:c3", 10);
        assert!(e.contains("9 disks but the layout has 10"), "{e}");
        let e = err("raid10:c4", 10);
        assert!(e.contains("don't split into 4-way mirror sets"), "{e}");
        let e = err("raid5:c2", 10);
        assert!(e.contains("copies apply to raid1 and raid10"), "{e}");
        let e = err("raid0:2x5", 10);
        assert!(e.contains("no redundancy groups"), "{e}");
    }
}
