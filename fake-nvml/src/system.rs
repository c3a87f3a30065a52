//! Init, shutdown, error strings and the system-wide version queries.
use std::ffi::{c_char, c_int, c_uint, CStr};

use crate::state::{self, InitError};
use crate::{guard, put, put_str, with_loaded, Ret, DRIVER_NOT_LOADED, SUCCESS, UNINITIALIZED};

fn init() -> Ret {
    guard(|| {
        let env = std::env::var_os(state::ENV_SCENARIO);
        match state::lock().init(env) {
            Ok(()) => SUCCESS,
            Err(InitError::NoScenario | InitError::DriverNotLoaded) => DRIVER_NOT_LOADED,
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Ret {
    counted!();
    init()
}

#[no_mangle]
pub extern "C" fn nvmlInit() -> Ret {
    counted!();
    init()
}

/// Flags only relax failures this fake never has, so they are ignored.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    counted!();
    init()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Ret {
    counted!();
    guard(|| {
        if state::lock().shutdown() {
            SUCCESS
        } else {
            UNINITIALIZED
        }
    })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    counted!();
    let s: &'static CStr = match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"GPU access blocked by the operating system",
        18 => c"RM has detected an NVML/RM version mismatch",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        25 => c"Argument version mismatch",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| put_str(version, length, &l.scenario.driver_version))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Ret {
    counted!();
    with_loaded(|l, _| put_str(version, length, &l.scenario.nvml_version_string()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) -> Ret {
    counted!();
    with_loaded(|l, _| put(version, l.scenario.cuda_version()))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> Ret {
    counted!();
    with_loaded(|l, _| put(version, l.scenario.cuda_version()))
}
