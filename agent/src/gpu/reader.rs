//! One NVML call on one device, its error sorted: a metric the device does not support is
//! named (and absent, never 0), a lost device stops further calls, any other failure leaves
//! the value absent.
use nvml_wrapper::error::NvmlError;

enum Metric<T> {
    Value(T),
    Unsupported,
    Lost,
    Failed,
}

fn metric<T>(r: Result<T, NvmlError>) -> Metric<T> {
    match r {
        Ok(v) => Metric::Value(v),
        Err(NvmlError::NotSupported) | Err(NvmlError::FunctionNotFound) => Metric::Unsupported,
        Err(NvmlError::FailedToLoadSymbol(_)) => Metric::Unsupported,
        Err(NvmlError::GpuLost) => Metric::Lost,
        Err(e) => {
            tracing::debug!("nvml: {e}");
            Metric::Failed
        }
    }
}

/// Reads metrics off one device: records the unsupported ones, and stops asking once the
/// device is lost.
pub struct Reader {
    pub(super) unsupported: Vec<&'static str>,
    pub(super) lost: bool,
}

impl Reader {
    pub fn read<T>(
        &mut self,
        name: &'static str,
        call: impl FnOnce() -> Result<T, NvmlError>,
    ) -> Option<T> {
        if self.lost {
            return None;
        }
        match metric(call()) {
            Metric::Value(v) => Some(v),
            Metric::Unsupported => {
                self.unsupported.push(name);
                None
            }
            Metric::Lost => {
                self.lost = true;
                None
            }
            Metric::Failed => None,
        }
    }
}
