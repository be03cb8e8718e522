//! The member name of a modelled drive:
//!
//! ```text
//! model:PROFILE[,OPTION...]:PATH
//! ```
//!
//! `PROFILE` is a built-in profile (`sbod_drive::profile::NAMES`), `PATH` the file that
//! keeps the drive's data (sparse; `sbod create --size-each` makes it). Options:
//!
//! - `span=full` (default): the member is spread over the drive's whole stroke, so seeks
//!   and zones are those of a full drive; `span=size`: the member is the drive's first
//!   bytes (a short-stroked drive).
//! - `wce=on|off`: the write cache (FLUSH and FUA cost only with it on).
//! - `qd=N`: the drive's queue depth (1: no command queueing).
//! - `sched=sptf|fifo`: shortest positioning time first (NCQ) or arrival order.
//! - `link=NAME@RATE`: the drive sits behind a shared path (an HBA port, an expander's
//!   uplink) of RATE bytes/s each way (`2.4G`, `600M`); every modelled drive naming the
//!   same link in the same directory shares it, across processes (its state is the file
//!   `.sbod-link-NAME` beside the member file). Give several for a chain.
//!
//! - `slow=K` (1 to 1000, default 1): the drive in slow motion, every time it takes (seek,
//!   rotation, transfer, queueing, its links' transfers) K times longer, so each drive
//!   moves 1/K of its bytes per second and the ratios between layouts stay those of the
//!   real drive. For labs whose CPUs cannot keep up with the drives at full speed (a few
//!   dozen HDDs on two cores): the drives, not the CPU, stay the limit. Drives that share a
//!   link must share K too.
//!
//! Example: `model:hdd-nearline,link=exp0@2.4G:/srv/lab/m0.img`.

use crate::profile::{self, Profile};

pub const PREFIX: &str = "model:";

/// Is this member name a modelled drive?
pub fn is_model(name: &str) -> bool {
    name.starts_with(PREFIX)
}

#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    pub profile_name: String,
    pub profile: Profile,
    /// The options as written (kept for the canonical name).
    pub options: Vec<String>,
    pub full_span: bool,
    /// Slow motion: the model's clock runs this many times slower than the wall's.
    pub slow: u64,
    /// (name, bytes/s).
    pub links: Vec<(String, f64)>,
    pub path: String,
}

/// A rate with an SI suffix: `2.4G` = 2.4e9 bytes/s.
pub fn parse_rate(s: &str) -> Result<f64, String> {
    let s = s.trim().trim_end_matches("B/s").trim_end_matches('B');
    let (num, mul) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1e3,
                'M' => 1e6,
                'G' => 1e9,
                'T' => 1e12,
                _ => return Err(format!("'{s}': use a rate such as 600M or 2.4G (bytes/s)")),
            };
            (&s[..i], m)
        }
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("'{s}': use a rate such as 600M or 2.4G (bytes/s)"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("'{s}': a rate must be above 0"));
    }
    Ok(v * mul)
}

fn names() -> String {
    profile::NAMES
        .iter()
        .map(|(n, _)| *n)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Spec {
    pub fn parse(name: &str) -> Result<Spec, String> {
        let rest = name
            .strip_prefix(PREFIX)
            .ok_or_else(|| format!("'{name}' is not a modelled drive (model:PROFILE:PATH)"))?;
        let (head, path) = rest.split_once(':').ok_or_else(|| {
            format!("'{name}': give the file that keeps the data (model:PROFILE[,OPTIONS]:PATH)")
        })?;
        if path.is_empty() {
            return Err(format!(
                "'{name}': give the file that keeps the data (model:PROFILE[,OPTIONS]:PATH)"
            ));
        }
        let mut parts = head.split(',');
        let pname = parts.next().unwrap_or_default();
        let mut prof = profile::by_name(pname).ok_or_else(|| {
            format!(
                "'{name}': no drive profile '{pname}' (profiles: {})",
                names()
            )
        })?;
        let mut spec = Spec {
            profile_name: pname.to_string(),
            profile: prof.clone(),
            options: Vec::new(),
            full_span: true,
            slow: 1,
            links: Vec::new(),
            path: path.to_string(),
        };
        for o in parts {
            let (k, v) = o
                .split_once('=')
                .ok_or_else(|| format!("'{name}': option '{o}' must be KEY=VALUE"))?;
            let bad = || format!("'{name}': option '{o}': bad value");
            match (k, &mut prof) {
                ("span", _) => {
                    spec.full_span = match v {
                        "full" => true,
                        "size" => false,
                        _ => return Err(format!("'{name}': span is full or size")),
                    }
                }
                ("slow", _) => {
                    spec.slow = v
                        .parse()
                        .ok()
                        .filter(|k| (1..=1000).contains(k))
                        .ok_or_else(|| format!("'{name}': slow=K takes K from 1 to 1000"))?
                }
                ("link", _) => {
                    let (ln, rate) = v.split_once('@').ok_or_else(|| {
                        format!("'{name}': link=NAME@RATE (such as link=exp0@2.4G)")
                    })?;
                    if ln.is_empty()
                        || !ln
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                    {
                        return Err(format!(
                            "'{name}': a link's name is letters, digits, '-' and '_'"
                        ));
                    }
                    spec.links.push((ln.to_string(), parse_rate(rate)?));
                }
                ("wce", Profile::Hdd(h)) => {
                    h.write_cache = match v {
                        "on" => true,
                        "off" => false,
                        _ => return Err(bad()),
                    }
                }
                ("qd", Profile::Hdd(h)) => {
                    h.queue_depth = v.parse().ok().filter(|&q| q >= 1).ok_or_else(bad)?
                }
                ("qd", Profile::Ssd(s)) => {
                    s.queue_depth = v.parse().ok().filter(|&q| q >= 1).ok_or_else(bad)?
                }
                ("sched", Profile::Hdd(h)) => {
                    h.sptf = match v {
                        "sptf" => true,
                        "fifo" => false,
                        _ => return Err(bad()),
                    }
                }
                _ => {
                    return Err(format!(
                    "'{name}': unknown option '{k}' for {pname} (span, wce, qd, sched, link, slow)"
                ))
                }
            }
            spec.options.push(o.to_string());
        }
        if let Profile::Hdd(h) = &prof {
            h.check().map_err(|e| format!("'{name}': {e}"))?;
        }
        spec.profile = prof;
        Ok(spec)
    }

    /// The name with another path (an absolute one, for the registry).
    pub fn with_path(&self, path: &str) -> String {
        let mut s = format!("{PREFIX}{}", self.profile_name);
        for o in &self.options {
            s.push(',');
            s.push_str(o);
        }
        s.push(':');
        s.push_str(path);
        s
    }
}

/// The file behind a member name: the path of a modelled drive, or the name itself.
pub fn data_path(name: &str) -> &str {
    match name.strip_prefix(PREFIX).and_then(|r| r.split_once(':')) {
        Some((_, p)) => p,
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        let s = Spec::parse("model:hdd-nearline,wce=off,link=exp0@2.4G:/a/b:c.img").unwrap();
        assert_eq!(s.path, "/a/b:c.img");
        assert_eq!(s.links, vec![("exp0".to_string(), 2.4e9)]);
        let Profile::Hdd(h) = &s.profile else {
            panic!()
        };
        assert!(!h.write_cache);
        assert_eq!(
            s.with_path("/x"),
            "model:hdd-nearline,wce=off,link=exp0@2.4G:/x"
        );
        assert_eq!(data_path("model:nvme-dc:/m/0"), "/m/0");
        assert_eq!(data_path("/m/0"), "/m/0");
        for bad in [
            "model:nope:/x",
            "model:hdd-nearline",
            "model:hdd-nearline:",
            "model:hdd-nearline,span=half:/x",
            "model:hdd-nearline,link=e:/x",
            "model:hdd-nearline,link=e@fast:/x",
            "model:hdd-nearline,qd=0:/x",
            "model:nvme-dc,wce=on:/x",
        ] {
            assert!(Spec::parse(bad).is_err(), "{bad}");
        }
        assert!(Spec::parse("model:nope:/x")
            .unwrap_err()
            .contains("hdd-nearline"));
    }
}
