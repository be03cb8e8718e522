//! Child processes the lab starts (fio, `sbod serve`, `sbod` commands), and their CPU time.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// What a child gets when the lab process dies without cleaning up (SIGKILL, a crash).
#[derive(Clone, Copy, Debug)]
pub enum ChildSignal {
    /// fio: stop at once.
    Kill,
    /// `sbod serve`: SIGTERM stops it cleanly (members closed, superblocks clean).
    Term,
}

/// Put the child in its own process group, so a Ctrl-C in the terminal reaches only the lab
/// (which then stops its children in order), and have the kernel signal it if the lab dies.
pub fn prepare_child(cmd: &mut Command, on_parent_death: ChildSignal) {
    cmd.process_group(0);
    let sig = match on_parent_death {
        ChildSignal::Kill => libc::SIGKILL,
        ChildSignal::Term => libc::SIGTERM,
    };
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid are async-signal-safe; nothing is allocated after fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong);
            // The parent may have died between fork and prctl.
            if libc::getppid() != parent {
                libc::raise(sig);
            }
            Ok(())
        });
    }
}

/// Signal a child's whole process group (fio forks one process per job).
pub fn kill_group(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall; the group is the child's own (prepare_child).
    unsafe {
        libc::kill(-(pid as libc::pid_t), sig);
    }
}

/// Signal one process.
pub fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: plain syscall.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// usr+sys CPU seconds a process (all its threads) has used, from /proc/PID/stat.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat_cpu(&text).map(|ticks| ticks as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime (fields 14 and 15) of a /proc/PID/stat line. The command name (field 2) is
/// in parentheses and may contain spaces, so fields are counted after its closing parenthesis.
pub fn parse_stat_cpu(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_spaces() {
        let s =
            "1234 (sbod serve x) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1 2 3";
        assert_eq!(parse_stat_cpu(s), Some(325));
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let mut x = 0u64;
        for i in 0..3_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(cpu_secs(std::process::id()).is_some());
    }
}
