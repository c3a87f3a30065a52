//! GPU instance profiles (the MIG profiles a GPU can be partitioned into), from a device's
//! `mig_profiles` scenario key: `nvmlDeviceGetGpuInstanceProfileInfo` (v1 struct) and
//! `nvmlDeviceGetGpuInstanceProfileInfoV` (the versioned struct, v2, with the name), and where
//! a profile's instances may be placed (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`).
use std::ffi::{c_char, c_uint, c_ulonglong};

use crate::scenario::{Feature, MigProfileSpec, PROFILE_COUNT};
use crate::{
    fill_chars, put, resolve_gpu, with_loaded, Device, Ret, ARGUMENT_VERSION_MISMATCH,
    INSUFFICIENT_SIZE, INVALID_ARGUMENT, NOT_SUPPORTED,
};

/// nvmlGpuInstanceProfileInfo_t (v1): 48 bytes.
#[repr(C)]
pub struct ProfileInfoV1 {
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: c_ulonglong,
}

/// nvmlGpuInstanceProfileInfo_v2_t: 152 bytes, `version` first and the name last.
#[repr(C)]
pub struct ProfileInfoV2 {
    version: c_uint,
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: c_ulonglong,
    name: [c_char; 96],
}

// Layouts checked against nvml.h (nvml-wrapper-sys 0.10's bindgen output).
const _: () = {
    assert!(std::mem::size_of::<ProfileInfoV1>() == 48);
    assert!(std::mem::size_of::<ProfileInfoV2>() == 152);
};

/// nvmlGpuInstanceProfileInfo_v2: NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2).
pub const PROFILE_INFO_V2_VERSION: c_uint =
    (std::mem::size_of::<ProfileInfoV2>() as c_uint) | (2 << 24);

/// The scenario's entry for `profile` on a whole GPU: INVALID_ARGUMENT for an index nvml.h
/// does not define, NOT_SUPPORTED for a GPU without MIG or without that profile.
fn lookup(device: Device, profile: c_uint, f: impl Fn(&MigProfileSpec) -> Result<(), Ret>) -> Ret {
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Mig))?;
        if profile >= PROFILE_COUNT {
            return Err(INVALID_ARGUMENT);
        }
        let spec = t.dev.mig_profiles.iter().find(|p| p.profile == profile);
        f(spec.ok_or(NOT_SUPPORTED)?)
    })
}

fn v1(p: &MigProfileSpec) -> ProfileInfoV1 {
    ProfileInfoV1 {
        id: p.id,
        is_p2p_supported: c_uint::from(p.p2p),
        slice_count: p.slices,
        instance_count: p.instances,
        multiprocessor_count: p.multiprocessors,
        copy_engine_count: p.copy_engines,
        decoder_count: p.decoders,
        encoder_count: p.encoders,
        jpeg_count: p.jpegs,
        ofa_count: p.ofas,
        memory_size_mb: p.memory_mib,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: Device,
    profile: c_uint,
    info: *mut ProfileInfoV1,
) -> Ret {
    counted!();
    lookup(device, profile, |p| put(info, v1(p)))
}

/// Checks `version` first, as the driver does: only v2 is answered.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: Device,
    profile: c_uint,
    info: *mut ProfileInfoV2,
) -> Ret {
    counted!();
    lookup(device, profile, |p| {
        if info.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        // SAFETY: non-null; the caller sets `version` before the call.
        if unsafe { (*info).version } != PROFILE_INFO_V2_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let o = v1(p);
        put(
            info,
            ProfileInfoV2 {
                version: PROFILE_INFO_V2_VERSION,
                id: o.id,
                is_p2p_supported: o.is_p2p_supported,
                slice_count: o.slice_count,
                instance_count: o.instance_count,
                multiprocessor_count: o.multiprocessor_count,
                copy_engine_count: o.copy_engine_count,
                decoder_count: o.decoder_count,
                encoder_count: o.encoder_count,
                jpeg_count: o.jpeg_count,
                ofa_count: o.ofa_count,
                memory_size_mb: o.memory_size_mb,
                name: fill_chars(&p.name),
            },
        )
    })
}

/// nvmlGpuInstancePlacement_t: 8 bytes.
#[repr(C)]
pub struct Placement {
    start: c_uint,
    size: c_uint,
}

const _: () = assert!(std::mem::size_of::<Placement>() == 8);

/// The placements of the profile whose *id* is `profile_id` (not its index), as nvml.h
/// has it: `placements` NULL asks for the count; a buffer of fewer than the count is
/// INSUFFICIENT_SIZE with the count written; a GPU without MIG, or a profile id the GPU
/// does not list or lists no placements for, NOT_SUPPORTED.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: Device,
    profile_id: c_uint,
    placements: *mut Placement,
    count: *mut c_uint,
) -> Ret {
    counted!();
    with_loaded(|l, _| {
        let t = resolve_gpu(l, device, Some(Feature::Mig))?;
        if count.is_null() {
            return Err(INVALID_ARGUMENT);
        }
        let spec = t.dev.mig_profiles.iter().find(|p| p.id == profile_id);
        let list = &spec.ok_or(NOT_SUPPORTED)?.placements;
        if list.is_empty() {
            return Err(NOT_SUPPORTED);
        }
        let n = list.len() as c_uint;
        // SAFETY: non-null; the caller passes a valid in/out count.
        let room = unsafe { count.read() };
        // SAFETY: as above.
        unsafe { count.write(n) };
        if placements.is_null() {
            return Ok(());
        }
        if room < n {
            return Err(INSUFFICIENT_SIZE);
        }
        for (i, [start, size]) in list.iter().enumerate() {
            let p = Placement {
                start: *start,
                size: *size,
            };
            // SAFETY: the caller's buffer holds `room` >= n placements.
            unsafe { placements.add(i).write(p) };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_versioned_struct_carries_its_size_and_version() {
        assert_eq!(PROFILE_INFO_V2_VERSION, 0x0200_0098);
    }
}
