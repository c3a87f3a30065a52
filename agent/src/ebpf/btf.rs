//! Just enough of BTF (the kernel's own type information, /sys/kernel/btf/vmlinux) to find a
//! struct member's offset and an enumerator's value by name. The start-up task iterator
//! reads `task_struct` and the cgroup structs at offsets that differ between kernel builds;
//! the programs use no CO-RE, so the loader finds them here and patches them in.
/// The running kernel's BTF.
pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// A parsed type section: where each type's record starts, by type id.
pub struct Btf {
    data: Vec<u8>,
    /// Byte offset of each type's record in `data` (index 0 is the void type: unused).
    types: Vec<usize>,
    strings: usize,
    strings_len: usize,
}

/// One member of a struct or union.
struct Member {
    name_off: u32,
    type_id: u32,
    /// In bits; bitfields are refused by the callers (they need no bitfield).
    bit_offset: u32,
    bitfield: bool,
}

impl Btf {
    #[cfg(test)]
    pub fn from_sys_fs() -> Result<Btf, String> {
        let data = std::fs::read(VMLINUX).map_err(|e| format!("{VMLINUX}: {e}"))?;
        Btf::parse(data)
    }

    /// Parses a little-endian BTF blob (the host's byte order: it is the running kernel's).
    pub fn parse(data: Vec<u8>) -> Result<Btf, String> {
        let u16_at = |o: usize| data.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
        if u16_at(0) != Some(MAGIC) {
            return Err("not BTF (bad magic)".into());
        }
        let word = |o: usize| read_u32(&data, o).ok_or("BTF header truncated");
        let hdr_len = word(4)? as usize;
        let (type_off, type_len) = (word(8)? as usize, word(12)? as usize);
        let (str_off, str_len) = (word(16)? as usize, word(20)? as usize);
        let (start, strings) = (hdr_len + type_off, hdr_len + str_off);
        if start + type_len > data.len() || strings + str_len > data.len() {
            return Err("BTF sections run past the end".into());
        }
        let mut types = vec![0];
        let mut at = start;
        while at < start + type_len {
            types.push(at);
            let info = read_u32(&data, at + 4).ok_or("BTF type truncated")?;
            at += 12 + trailer_len(info)?;
        }
        Ok(Btf {
            data,
            types,
            strings,
            strings_len: str_len,
        })
    }

    fn name(&self, name_off: u32) -> &[u8] {
        let from = self.strings + name_off as usize;
        let end = self.strings + self.strings_len;
        let s = self.data.get(from..end).unwrap_or_default();
        &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())]
    }

    fn word(&self, at: usize) -> u32 {
        read_u32(&self.data, at).unwrap_or(0)
    }

    fn kind(&self, id: u32) -> u32 {
        (self.word(self.types[id as usize] + 4) >> 24) & 0x1f
    }

    /// The type id of the struct named `name`, the first one with members.
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        (1..self.types.len() as u32).find(|&id| {
            let at = self.types[id as usize];
            self.kind(id) == KIND_STRUCT
                && self.word(at + 4) & 0xffff != 0
                && self.name(self.word(at)) == name.as_bytes()
        })
    }

    fn members(&self, id: u32) -> impl Iterator<Item = Member> + '_ {
        let at = self.types[id as usize];
        let info = self.word(at + 4);
        let (vlen, kind_flag) = (info & 0xffff, info >> 31 == 1);
        (0..vlen as usize).map(move |i| {
            let m = at + 12 + i * 12;
            let off = self.word(m + 8);
            Member {
                name_off: self.word(m),
                type_id: self.word(m + 4),
                bit_offset: if kind_flag { off & 0xff_ffff } else { off },
                bitfield: kind_flag && off >> 24 != 0,
            }
        })
    }

    /// Byte offset of member `name` of struct `id`, looking into anonymous structs and
    /// unions (randomised layouts and unions nest them).
    pub fn member_offset(&self, id: u32, name: &str) -> Option<u32> {
        for m in self.members(id) {
            if m.bitfield || m.bit_offset % 8 != 0 {
                continue;
            }
            if self.name(m.name_off) == name.as_bytes() {
                return Some(m.bit_offset / 8);
            }
            let inner = self.skip_modifiers(m.type_id);
            let anonymous = m.name_off == 0 && matches!(self.kind(inner), KIND_STRUCT | KIND_UNION);
            if let Some(o) = anonymous.then(|| self.member_offset(inner, name)).flatten() {
                return Some(m.bit_offset / 8 + o);
            }
        }
        None
    }

    /// Typedefs, const, volatile, restrict and type tags, skipped.
    fn skip_modifiers(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            if id == 0 || id as usize >= self.types.len() {
                return 0;
            }
            match self.kind(id) {
                8..=11 | 18 => id = self.word(self.types[id as usize] + 8),
                _ => return id,
            }
        }
        id
    }

    /// `struct_name.member` in bytes.
    pub fn offset_of(&self, struct_name: &str, member: &str) -> Option<u32> {
        self.member_offset(self.struct_id(struct_name)?, member)
    }

    /// The value of enumerator `name`, in any enum.
    pub fn enumerator(&self, name: &str) -> Option<u64> {
        for id in 1..self.types.len() as u32 {
            if self.kind(id) != KIND_ENUM {
                continue;
            }
            let at = self.types[id as usize];
            let vlen = self.word(at + 4) & 0xffff;
            for i in 0..vlen as usize {
                let e = at + 12 + i * 8;
                if self.name(self.word(e)) == name.as_bytes() {
                    return Some(self.word(e + 4) as u64);
                }
            }
        }
        None
    }
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    let b = data.get(at..at + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Bytes after a type's 12-byte common part, by kind (the kernel's btf_type layout).
fn trailer_len(info: u32) -> Result<usize, String> {
    let vlen = (info & 0xffff) as usize;
    Ok(match (info >> 24) & 0x1f {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
        KIND_ARRAY => 12,
        KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
        KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
        2 | 7..=12 | 16 | 18 => 0,
        k => return Err(format!("unknown BTF kind {k}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A blob with `struct outer { int a; union { long b; int c; }; }` and
    /// `enum e { X = 7 }`, laid out as the kernel writes BTF.
    fn blob() -> Vec<u8> {
        let strings = b"\0outer\0a\0b\0c\0e\0X\0int\0long\0".to_vec();
        let s = |name: &str| {
            let mut at = 0;
            for part in strings.split(|&b| b == 0) {
                if part == name.as_bytes() {
                    return at as u32;
                }
                at += part.len() + 1;
            }
            panic!("{name}")
        };
        let mut types: Vec<u32> = vec![];
        let info = |kind: u32, vlen: u32| kind << 24 | vlen;
        // 1: int, 2: long
        types.extend([s("int"), info(KIND_INT, 0), 4, 32]);
        types.extend([s("long"), info(KIND_INT, 0), 8, 64]);
        // 3: the anonymous union { long b; int c; }
        types.extend([0, info(KIND_UNION, 2), 8, s("b"), 2, 0, s("c"), 1, 0]);
        // 4: struct outer { int a; <union at byte 8> }
        types.extend([s("outer"), info(KIND_STRUCT, 2), 16, s("a"), 1, 0, 0, 3, 64]);
        // 5: enum e { X = 7 }
        types.extend([s("e"), info(KIND_ENUM, 1), 4, s("X"), 7]);
        let type_bytes: Vec<u8> = types.iter().flat_map(|w| w.to_le_bytes()).collect();
        let mut out = vec![];
        out.extend(MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        for w in [24u32, 0, type_bytes.len() as u32, type_bytes.len() as u32] {
            out.extend(w.to_le_bytes());
        }
        out.extend((strings.len() as u32).to_le_bytes());
        out.extend(type_bytes);
        out.extend(strings);
        out
    }

    #[test]
    fn members_are_found_through_anonymous_unions() {
        let btf = Btf::parse(blob()).unwrap();
        assert_eq!(btf.offset_of("outer", "a"), Some(0));
        assert_eq!(btf.offset_of("outer", "b"), Some(8));
        assert_eq!(btf.offset_of("outer", "c"), Some(8));
        assert_eq!(btf.offset_of("outer", "d"), None);
        assert_eq!(btf.offset_of("inner", "a"), None);
        assert_eq!(btf.enumerator("X"), Some(7));
        assert_eq!(btf.enumerator("Y"), None);
    }

    #[test]
    fn a_truncated_blob_is_an_error_not_a_panic() {
        let b = blob();
        for cut in [0, 3, 20, 30, b.len() - 1] {
            assert!(Btf::parse(b[..cut].to_vec()).is_err(), "cut at {cut}");
        }
    }

    /// The running kernel's own BTF (this VM's and CI's kernels have it): what the task
    /// iterator needs is there, and task_struct's pid and tgid are neighbours.
    #[test]
    fn this_kernels_task_struct() {
        let btf = Btf::from_sys_fs().expect("this kernel's BTF");
        let pid = btf.offset_of("task_struct", "pid").unwrap();
        assert_eq!(btf.offset_of("task_struct", "tgid"), Some(pid + 4));
        for m in ["comm", "real_parent", "cgroups", "start_boottime"] {
            assert!(btf.offset_of("task_struct", m).is_some(), "{m}");
        }
        assert!(btf.offset_of("css_set", "dfl_cgrp").is_some());
        assert!(btf.offset_of("kernfs_node", "id").is_some());
        assert!(btf.enumerator("memory_cgrp_id").is_some());
    }
}
