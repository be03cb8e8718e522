//! SCSI-3 persistent reservations (SPC-4 5.13), kept in memory for the life of the target
//! (APTPL, persistence across restarts, is not offered: REPORT CAPABILITIES says so).

use crate::sense::{self, Sense};

/// An I_T nexus: the initiator port (name and ISID); the target has one port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Nexus {
    pub initiator: String,
    pub isid: [u8; 6],
}

pub const WE: u8 = 1;
pub const EA: u8 = 3;
pub const WE_RO: u8 = 5;
pub const EA_RO: u8 = 6;
pub const WE_AR: u8 = 7;
pub const EA_AR: u8 = 8;

#[derive(Default, Debug)]
pub struct Pr {
    pub generation: u32,
    regs: Vec<(Nexus, u64)>,
    /// The holder (for the all-registrants types, the registrant that reserved) and type.
    holder: Option<(Nexus, u8)>,
}

/// What a command does to the medium, for the conflict check.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
    Other,
}

pub enum PrError {
    Conflict,
    Check(Sense),
}

fn all_registrants(t: u8) -> bool {
    t == WE_AR || t == EA_AR
}

impl Pr {
    fn key_of(&self, n: &Nexus) -> Option<u64> {
        self.regs.iter().find(|(r, _)| r == n).map(|(_, k)| *k)
    }

    fn holds(&self, n: &Nexus) -> bool {
        match &self.holder {
            Some((h, t)) => h == n || (all_registrants(*t) && self.key_of(n).is_some()),
            None => false,
        }
    }

    /// Whether `n` may do `a` under the reservation (SPC-4 table 63, the medium commands).
    pub fn allows(&self, n: &Nexus, a: Access) -> bool {
        let Some((_, t)) = &self.holder else {
            return true;
        };
        if a == Access::Other || self.holds(n) {
            return true;
        }
        let registered = self.key_of(n).is_some();
        match (*t, a) {
            (WE, Access::Read) => true,
            (WE, _) | (EA, _) => false,
            (WE_RO | WE_AR, Access::Read) => true,
            (WE_RO | WE_AR | EA_RO | EA_AR, _) => registered,
            _ => false,
        }
    }

    /// PERSISTENT RESERVE IN.
    pub fn read(&self, sa: u8) -> Result<Vec<u8>, Sense> {
        let mut d = Vec::new();
        match sa {
            0 => {
                d.extend_from_slice(&self.generation.to_be_bytes());
                d.extend_from_slice(&((self.regs.len() * 8) as u32).to_be_bytes());
                for (_, k) in &self.regs {
                    d.extend_from_slice(&k.to_be_bytes());
                }
            }
            1 => {
                d.extend_from_slice(&self.generation.to_be_bytes());
                match &self.holder {
                    Some((h, t)) => {
                        d.extend_from_slice(&16u32.to_be_bytes());
                        let key = if all_registrants(*t) {
                            0
                        } else {
                            self.key_of(h).unwrap_or(0)
                        };
                        d.extend_from_slice(&key.to_be_bytes());
                        d.extend_from_slice(&[0, 0, 0, 0, 0, *t & 0x0f, 0, 0]);
                    }
                    None => d.extend_from_slice(&0u32.to_be_bytes()),
                }
            }
            2 => {
                // Length 8; CRH no, SIP_C no, ATP_C no, PTPL_C no; TMV with the types.
                d.extend_from_slice(&[0, 8, 0, 0x80, 0x80 | 0x40 | 0x20 | 0x08 | 0x02, 0x01, 0, 0]);
            }
            3 => {
                // READ FULL STATUS: each registration with its iSCSI TransportID.
                d.extend_from_slice(&self.generation.to_be_bytes());
                d.extend_from_slice(&0u32.to_be_bytes());
                for (n, k) in &self.regs {
                    let mut tid = vec![0x05, 0, 0, 0];
                    tid.extend_from_slice(n.initiator.as_bytes());
                    tid.push(0);
                    while tid.len() % 4 != 0 || tid.len() < 24 {
                        tid.push(0);
                    }
                    let l = (tid.len() - 4) as u16;
                    tid[2..4].copy_from_slice(&l.to_be_bytes());
                    d.extend_from_slice(&k.to_be_bytes());
                    d.extend_from_slice(&[0; 4]);
                    let holder = self.holder.as_ref().filter(|_| self.holds(n));
                    d.push(if holder.is_some() { 1 } else { 0 });
                    d.push(holder.map(|(_, t)| *t & 0x0f).unwrap_or(0));
                    d.extend_from_slice(&[0; 4]);
                    d.extend_from_slice(&1u16.to_be_bytes());
                    d.extend_from_slice(&(tid.len() as u32).to_be_bytes());
                    d.extend_from_slice(&tid);
                }
                let l = (d.len() - 8) as u32;
                d[4..8].copy_from_slice(&l.to_be_bytes());
            }
            _ => return Err(sense::INVALID_FIELD_CDB),
        }
        Ok(d)
    }

    /// PERSISTENT RESERVE OUT with its parameter list (24 bytes, checked by the caller).
    pub fn out(&mut self, n: &Nexus, sa: u8, ty: u8, scope: u8, p: &[u8]) -> Result<(), PrError> {
        let key = u64::from_be_bytes(p[0..8].try_into().unwrap());
        let sark = u64::from_be_bytes(p[8..16].try_into().unwrap());
        let flags = p[20];
        if flags & 0x0d != 0 {
            // SPEC_I_PT, APTPL: not offered (REPORT CAPABILITIES); ALL_TG_PT: one port.
            if flags & 0x01 != 0 || flags & 0x08 != 0 {
                return Err(PrError::Check(sense::INVALID_FIELD_PARAM));
            }
        }
        let mine = self.key_of(n);
        let typed = |ty: u8| matches!(ty, WE | EA | WE_RO | EA_RO | WE_AR | EA_AR);
        match sa {
            // REGISTER / REGISTER AND IGNORE EXISTING KEY
            0 | 6 => {
                match mine {
                    None if sa == 0 && key != 0 => return Err(PrError::Conflict),
                    Some(k) if sa == 0 && k != key => return Err(PrError::Conflict),
                    _ => {}
                }
                if sark == 0 {
                    if mine.is_some() {
                        self.unregister(n);
                    }
                } else if mine.is_some() {
                    self.regs.iter_mut().find(|(r, _)| r == n).unwrap().1 = sark;
                } else {
                    self.regs.push((n.clone(), sark));
                }
                self.generation = self.generation.wrapping_add(1);
            }
            // RESERVE
            1 => {
                if mine != Some(key) {
                    return Err(PrError::Conflict);
                }
                if scope != 0 || !typed(ty) {
                    return Err(PrError::Check(sense::INVALID_FIELD_CDB));
                }
                match &self.holder {
                    Some((_, t)) if self.holds(n) && *t == ty => {}
                    Some(_) => return Err(PrError::Conflict),
                    None => self.holder = Some((n.clone(), ty)),
                }
            }
            // RELEASE
            2 => {
                if mine != Some(key) {
                    return Err(PrError::Conflict);
                }
                match &self.holder {
                    Some((_, t)) if self.holds(n) => {
                        if *t != ty || scope != 0 {
                            return Err(PrError::Check(sense::INVALID_RELEASE));
                        }
                        self.holder = None;
                    }
                    _ => {}
                }
            }
            // CLEAR
            3 => {
                if mine != Some(key) {
                    return Err(PrError::Conflict);
                }
                self.regs.clear();
                self.holder = None;
                self.generation = self.generation.wrapping_add(1);
            }
            // PREEMPT / PREEMPT AND ABORT
            4 | 5 => {
                if mine != Some(key) {
                    return Err(PrError::Conflict);
                }
                if scope != 0 || !typed(ty) {
                    return Err(PrError::Check(sense::INVALID_FIELD_CDB));
                }
                match self.holder.clone() {
                    Some((_, t)) if all_registrants(t) => {
                        if sark == 0 {
                            self.regs.retain(|(r, _)| r == n);
                            self.holder = Some((n.clone(), ty));
                        } else {
                            self.regs.retain(|(r, k)| r == n || *k != sark);
                        }
                    }
                    Some((h, _)) if self.key_of(&h) == Some(sark) => {
                        self.regs.retain(|(r, k)| r == n || *k != sark);
                        self.holder = Some((n.clone(), ty));
                    }
                    _ => {
                        if sark == 0 {
                            return Err(PrError::Check(sense::INVALID_FIELD_PARAM));
                        }
                        let before = self.regs.len();
                        self.regs.retain(|(r, k)| r == n || *k != sark);
                        if self.regs.len() == before {
                            return Err(PrError::Conflict);
                        }
                    }
                }
                self.generation = self.generation.wrapping_add(1);
            }
            _ => return Err(PrError::Check(sense::INVALID_FIELD_CDB)),
        }
        Ok(())
    }

    fn unregister(&mut self, n: &Nexus) {
        self.regs.retain(|(r, _)| r != n);
        if let Some((h, t)) = &self.holder {
            if all_registrants(*t) {
                if self.regs.is_empty() {
                    self.holder = None;
                }
            } else if h == n {
                self.holder = None;
            }
        }
    }

    /// An I_T nexus is gone for good (not used: registrations outlive connections).
    pub fn is_empty(&self) -> bool {
        self.regs.is_empty() && self.holder.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nx(i: u8) -> Nexus {
        Nexus {
            initiator: format!("iqn.test:{i}"),
            isid: [i; 6],
        }
    }
    fn param(key: u64, sark: u64) -> Vec<u8> {
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sark.to_be_bytes());
        p
    }

    #[test]
    fn exclusive_access_keeps_others_out_until_preempted() {
        let mut pr = Pr::default();
        let (a, b) = (nx(1), nx(2));
        assert!(pr.out(&a, 0, 0, 0, &param(0, 0xa)).is_ok());
        assert!(pr.out(&b, 0, 0, 0, &param(0, 0xb)).is_ok());
        assert!(matches!(
            pr.out(&b, 0, 0, 0, &param(1, 0xb)),
            Err(PrError::Conflict)
        ));
        assert!(pr.out(&a, 1, EA, 0, &param(0xa, 0)).is_ok());
        assert!(!pr.allows(&b, Access::Read));
        assert!(pr.allows(&a, Access::Write));
        assert!(matches!(
            pr.out(&b, 1, EA, 0, &param(0xb, 0)),
            Err(PrError::Conflict)
        ));
        assert!(pr.out(&b, 4, WE, 0, &param(0xb, 0xa)).is_ok());
        assert!(pr.allows(&a, Access::Read) && !pr.allows(&a, Access::Write));
        assert_eq!(pr.read(0).unwrap().len(), 8 + 8);
    }
}
