#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../agent/src/process/cgroup/parse.rs"]
#[allow(dead_code)]
mod parse;

fn is_lower_hex(b: u8) -> bool {
    b.is_ascii_digit() || (b'a'..=b'f').contains(&b)
}

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let Some(r) = parse::parse_cgroup_path(path) else {
        return;
    };
    assert!(r.container_id.is_some() || r.pod_uid.is_some(), "{r:?}");
    if let Some(id) = &r.container_id {
        assert!(id.len() == 64 && id.bytes().all(is_lower_hex), "{id:?}");
        // The id is taken verbatim from the path.
        assert!(path.contains(&**id));
    } else {
        assert!(r.runtime.is_none(), "{r:?}");
    }
    if let Some(uid) = &r.pod_uid {
        assert_eq!(uid.len(), 36, "{uid:?}");
        for (i, b) in uid.bytes().enumerate() {
            match i {
                8 | 13 | 18 | 23 => assert_eq!(b, b'-', "{uid:?}"),
                _ => assert!(is_lower_hex(b), "{uid:?}"),
            }
        }
    } else {
        assert!(r.qos.is_none(), "{r:?}");
    }
});
