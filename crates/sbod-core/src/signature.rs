//! What else might live on a device: file systems, partition tables, other RAID and volume
//! managers. sbod refuses to overwrite any of these without `--force`.
//!
//! Hand-written because the only complete library (libblkid) would add a C dependency and
//! bindgen to the build for a few dozen byte comparisons; these are the signatures users
//! actually have on disks they might point sbod at by mistake.

/// Bytes from the start of the device that `probe` looks at.
pub const PROBE_BYTES: usize = 256 * 1024;

fn at(b: &[u8], off: usize, magic: &[u8]) -> bool {
    b.len() >= off + magic.len() && &b[off..off + magic.len()] == magic
}

/// Describe the first signature found in the first `PROBE_BYTES` of a device.
pub fn probe(b: &[u8]) -> Option<&'static str> {
    if at(b, 0, &crate::superblock::MAGIC)
        || at(b, crate::superblock::COPY_SIZE, &crate::superblock::MAGIC)
    {
        return Some("an sbod superblock");
    }
    if at(b, 512, b"EFI PART") || at(b, 4096, b"EFI PART") {
        return Some("a GPT partition table");
    }
    if at(b, 0, b"LUKS\xba\xbe") {
        return Some("a LUKS encrypted volume");
    }
    if at(b, 0, b"XFSB") {
        return Some("an XFS file system");
    }
    if at(b, 1024 + 56, &[0x53, 0xef]) && b.len() > 1024 + 100 {
        // ext2/3/4: also require a plausible block size (s_log_block_size <= 6)
        let lbs = u32::from_le_bytes(b[1024 + 24..1024 + 28].try_into().unwrap());
        if lbs <= 6 {
            return Some("an ext2/3/4 file system");
        }
    }
    if at(b, 65536 + 64, b"_BHRfS_M") {
        return Some("a btrfs file system");
    }
    if at(b, 3, b"NTFS    ") {
        return Some("an NTFS file system");
    }
    if at(b, 54, b"FAT") || at(b, 82, b"FAT32") {
        return Some("a FAT file system");
    }
    for sector in 0..4 {
        if at(b, sector * 512, b"LABELONE") {
            return Some("an LVM physical volume");
        }
    }
    if at(b, 4096, &0xa92b_4efc_u32.to_le_bytes()) || at(b, 0, &0xa92b_4efc_u32.to_le_bytes()) {
        return Some("a Linux md RAID superblock");
    }
    if at(b, 4096 - 10, b"SWAPSPACE2") || at(b, 4096 - 10, b"SWAP-SPACE") {
        return Some("a swap area");
    }
    let zfs = 0x00ba_b10c_u64.to_le_bytes();
    if (0..128).any(|i| at(b, 128 * 1024 + i * 1024, &zfs)) {
        return Some("a ZFS pool label");
    }
    if at(b, 32769, b"CD001") {
        return Some("an ISO 9660 image");
    }
    if at(b, 510, &[0x55, 0xaa]) {
        // An MBR: count non-empty partition entries.
        let used = (0..4).any(|i| {
            let e = &b[446 + i * 16..446 + (i + 1) * 16];
            e[4] != 0
        });
        if used {
            return Some("an MBR partition table");
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_common_signatures() {
        let mut b = vec![0u8; PROBE_BYTES];
        assert_eq!(probe(&b), None);
        b[1024 + 56] = 0x53;
        b[1024 + 57] = 0xef;
        assert_eq!(probe(&b), Some("an ext2/3/4 file system"));
        let mut b = vec![0u8; PROBE_BYTES];
        b[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(probe(&b), Some("a GPT partition table"));
        let mut b = vec![0u8; PROBE_BYTES];
        b[510] = 0x55;
        b[511] = 0xaa;
        assert_eq!(
            probe(&b),
            None,
            "boot signature alone is not a partition table"
        );
        b[446 + 4] = 0x83;
        assert_eq!(probe(&b), Some("an MBR partition table"));
        assert_eq!(probe(&[1, 2, 3]), None);
    }
}
