//! The node's own gRPC APIs, over unix sockets: the container runtime (CRI) and the
//! kubelet's pod-resources service. Servers are generated too, for the tests' fakes.
use std::path::{Path, PathBuf};

pub use tonic;

pub mod cri {
    tonic::include_proto!("runtime.v1");
}

pub mod podresources {
    tonic::include_proto!("v1");
}

/// A lazily connecting channel to a gRPC server on a unix socket.
pub fn unix_channel(path: &Path) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    // The URI is required by tonic but unused: every connection goes to the socket.
    Ok(tonic::transport::Endpoint::try_from("http://[::1]:1")?
        .connect_timeout(std::time::Duration::from_secs(2))
        .timeout(std::time::Duration::from_secs(5))
        .connect_with_connector_lazy(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        })))
}
