//! NBD URIs, the syntax libnbd and qemu accept (NetworkBlockDevice/nbd, doc/uri.md):
//! `nbd://HOST[:PORT][/EXPORT]`, `nbds://...` (TLS), `nbd+unix:///EXPORT?socket=PATH` and
//! `nbds+unix://...`. The export name is the path after its first `/`, percent-decoded.

use std::fmt;
use std::path::PathBuf;

/// The IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp { host: String, port: u16 },
    Unix { socket: PathBuf },
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub transport: Transport,
    pub export: String,
    /// `nbds`: STARTTLS is required.
    pub tls: bool,
    /// `tls-certificates=DIR`: a directory holding `ca-cert.pem` (libnbd's convention);
    /// without it the system's trust store is used.
    pub tls_certificates: Option<PathBuf>,
    /// `tls-verify-peer=false` skips checking the server's certificate (tests only).
    pub tls_verify_peer: bool,
    /// `tls-hostname=NAME`: the name the server's certificate must carry (default: HOST).
    pub tls_hostname: Option<String>,
}

/// Does this member path look like an NBD URI (rather than a file or device path)?
pub fn is_uri(s: &str) -> bool {
    ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"]
        .iter()
        .any(|p| s.starts_with(p))
        || s.starts_with("nbd+") // nbd+tcp, nbd+vsock: parsed to say what is missing
        || s.starts_with("nbds+")
}

fn decode(s: &str, what: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in the {what} '{s}'"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("the {what} '{s}' is not UTF-8"))
}

fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::new();
    for c in s.bytes() {
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) || (keep_slash && c == b'/') {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

fn parse_bool(v: &str, key: &str) -> Result<bool, String> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!("{key}={v}: expected true or false")),
    }
}

impl NbdUri {
    pub fn parse(s: &str) -> Result<NbdUri, String> {
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| format!("'{s}' is not an NBD URI (nbd://HOST[:PORT]/EXPORT)"))?;
        let (tls, unix) = match scheme {
            "nbd" | "nbd+tcp" => (false, false),
            "nbds" | "nbds+tcp" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            _ => {
                return Err(format!(
                    "'{s}': unsupported scheme '{scheme}' (use nbd://, nbds://, nbd+unix:// or nbds+unix://)"
                ))
            }
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        if rest.contains('#') {
            return Err(format!("'{s}': NBD URIs have no fragment"));
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        // The export name is the path without its first '/'.
        let export = decode(path.strip_prefix('/').unwrap_or(path), "export name")?;
        if export.len() > 4096 {
            return Err(format!("'{s}': export names are at most 4096 bytes"));
        }
        let mut uri = NbdUri {
            transport: Transport::Unix {
                socket: PathBuf::new(),
            },
            export,
            tls,
            tls_certificates: None,
            tls_verify_peer: true,
            tls_hostname: None,
        };
        let mut socket = None;
        for kv in query.into_iter().flat_map(|q| q.split('&')) {
            if kv.is_empty() {
                continue;
            }
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            let v = decode(v, "query value")?;
            match k {
                "socket" => socket = Some(PathBuf::from(v)),
                "tls-certificates" => uri.tls_certificates = Some(PathBuf::from(v)),
                "tls-verify-peer" => uri.tls_verify_peer = parse_bool(&v, k)?,
                "tls-hostname" => uri.tls_hostname = Some(v),
                "tls-psk-file" | "tls-username" => {
                    return Err(format!(
                        "'{s}': {k}: TLS with pre-shared keys is not supported; use certificates (tls-certificates=DIR)"
                    ))
                }
                // libnbd ignores parameters it does not know; so do we, aloud.
                _ => tracing::warn!(uri = s, parameter = k, "unknown NBD URI parameter ignored"),
            }
        }
        if unix {
            if !authority.is_empty() {
                return Err(format!(
                    "'{s}': nbd+unix URIs have no host (nbd+unix:///EXPORT?socket=PATH)"
                ));
            }
            let socket = socket.ok_or_else(|| {
                format!("'{s}': nbd+unix needs the socket path (nbd+unix:///EXPORT?socket=PATH)")
            })?;
            uri.transport = Transport::Unix { socket };
        } else {
            if socket.is_some() {
                return Err(format!(
                    "'{s}': socket= belongs to nbd+unix:// URIs, not TCP ones"
                ));
            }
            let (host, port) = split_host_port(authority)
                .map_err(|e| format!("'{s}': {e} (nbd://HOST[:PORT]/EXPORT)"))?;
            uri.transport = Transport::Tcp { host, port };
        }
        Ok(uri)
    }

    /// The host this export lives on: its failure domain by default. Unix sockets are on
    /// this host: no domain.
    pub fn host(&self) -> Option<&str> {
        match &self.transport {
            Transport::Tcp { host, .. } => Some(host),
            Transport::Unix { .. } => None,
        }
    }
}

fn split_host_port(a: &str) -> Result<(String, u16), String> {
    if a.contains('@') {
        return Err("user names are not part of NBD URIs".into());
    }
    let (host, port) = if let Some(r) = a.strip_prefix('[') {
        let (h, after) = r
            .split_once(']')
            .ok_or_else(|| "unclosed '[' in an IPv6 address".to_string())?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected '{p}' after the address"))?,
            ),
        };
        (h.to_string(), port)
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (a.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("'{p}' is not a port"))?,
    };
    Ok((decode(&host, "host")?.to_ascii_lowercase(), port))
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls { "nbds" } else { "nbd" };
        let mut q = Vec::new();
        match &self.transport {
            Transport::Tcp { host, port } => {
                let h = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                write!(f, "{s}://{h}")?;
                if *port != DEFAULT_PORT {
                    write!(f, ":{port}")?;
                }
            }
            Transport::Unix { socket } => {
                write!(f, "{s}+unix://")?;
                q.push(format!(
                    "socket={}",
                    encode(&socket.to_string_lossy(), true)
                ));
            }
        }
        write!(f, "/{}", encode(&self.export, false))?;
        if let Some(d) = &self.tls_certificates {
            q.push(format!(
                "tls-certificates={}",
                encode(&d.to_string_lossy(), true)
            ));
        }
        if !self.tls_verify_peer {
            q.push("tls-verify-peer=false".into());
        }
        if let Some(h) = &self.tls_hostname {
            q.push(format!("tls-hostname={}", encode(h, false)));
        }
        if !q.is_empty() {
            write!(f, "?{}", q.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_forms() {
        let u = NbdUri::parse("nbd://node1/disk0").unwrap();
        assert_eq!(
            u.transport,
            Transport::Tcp {
                host: "node1".into(),
                port: DEFAULT_PORT
            }
        );
        assert_eq!(u.export, "disk0");
        assert!(!u.tls);
        assert_eq!(u.host(), Some("node1"));
        let u = NbdUri::parse("nbds://10.0.0.2:10900/a%20b").unwrap();
        assert!(u.tls);
        assert_eq!(
            u.transport,
            Transport::Tcp {
                host: "10.0.0.2".into(),
                port: 10900
            }
        );
        assert_eq!(u.export, "a b");
        let u = NbdUri::parse("nbd://[::1]:2000").unwrap();
        assert_eq!(
            u.transport,
            Transport::Tcp {
                host: "::1".into(),
                port: 2000
            }
        );
        assert_eq!(u.export, "");
        // A second slash belongs to the export name.
        assert_eq!(NbdUri::parse("nbd://h//x").unwrap().export, "/x");
    }

    #[test]
    fn unix_forms() {
        let u = NbdUri::parse("nbd+unix:///vol?socket=/run/n.sock").unwrap();
        assert_eq!(
            u.transport,
            Transport::Unix {
                socket: "/run/n.sock".into()
            }
        );
        assert_eq!(u.export, "vol");
        assert_eq!(u.host(), None);
        assert!(NbdUri::parse("nbd+unix:///vol").is_err());
        assert!(NbdUri::parse("nbd+unix://host/vol?socket=/x").is_err());
    }

    #[test]
    fn refusals() {
        for bad in [
            "nbd://",
            "nbd://h:0/x",
            "nbd://h:99999/x",
            "nbd://u@h/x",
            "nbd://h/x?socket=/s",
            "nbd+vsock://1/x",
            "http://h/x",
            "nbd://h/%zz",
            "nbds://h/x?tls-psk-file=/k",
        ] {
            assert!(NbdUri::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn display_roundtrips() {
        for s in [
            "nbd://node1/disk0",
            "nbds://node2:10900/a%20b?tls-certificates=/etc/pki/x",
            "nbd+unix:///vol?socket=/run/n.sock",
            "nbd://[::1]/x",
        ] {
            let u = NbdUri::parse(s).unwrap();
            assert_eq!(NbdUri::parse(&u.to_string()).unwrap(), u, "{s}");
        }
    }
}
