//! Fake kubelet pod-resources and CRI servers, generated from the same protos as the
//! agent's clients, serving on unix sockets the test creates (and removes, to make them
//! vanish).
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use node_api::{
    cri::{
        runtime_service_server::{RuntimeService, RuntimeServiceServer},
        Container, ContainerMetadata, ContainerStatusRequest, ContainerStatusResponse,
        ListContainersRequest, ListContainersResponse, VersionRequest, VersionResponse,
    },
    podresources::{
        pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
        AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
        ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse, PodResources,
    },
    tonic,
};

/// A container as the runtime and the kubelet describe it.
#[derive(Clone, Debug)]
pub struct FakeContainer {
    pub id: String,
    pub pod_uid: String,
    pub namespace: String,
    pub pod: String,
    pub name: String,
    /// nvidia.com/gpu device ids the kubelet allocated.
    pub gpus: Vec<String>,
}

#[derive(Clone, Default)]
pub struct World {
    containers: Arc<Mutex<Vec<FakeContainer>>>,
    list_calls: Arc<std::sync::atomic::AtomicUsize>,
}

impl World {
    pub fn set(&self, cs: Vec<FakeContainer>) {
        *self.containers.lock().unwrap() = cs;
    }

    /// How many ListContainers calls arrived (the agent must not poll blindly).
    pub fn list_calls(&self) -> usize {
        self.list_calls.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct Cri(World);

#[tonic::async_trait]
impl RuntimeService for Cri {
    async fn version(
        &self,
        _: tonic::Request<VersionRequest>,
    ) -> Result<tonic::Response<VersionResponse>, tonic::Status> {
        Ok(tonic::Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "1".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn list_containers(
        &self,
        _: tonic::Request<ListContainersRequest>,
    ) -> Result<tonic::Response<ListContainersResponse>, tonic::Status> {
        self.0
            .list_calls
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let containers = self
            .0
            .containers
            .lock()
            .unwrap()
            .iter()
            .map(|c| Container {
                id: c.id.clone(),
                pod_sandbox_id: format!("sandbox-{}", c.pod),
                metadata: Some(ContainerMetadata {
                    name: c.name.clone(),
                    attempt: 0,
                }),
                state: 1,
                labels: HashMap::from([
                    ("io.kubernetes.pod.name".into(), c.pod.clone()),
                    ("io.kubernetes.pod.namespace".into(), c.namespace.clone()),
                    ("io.kubernetes.pod.uid".into(), c.pod_uid.clone()),
                    ("io.kubernetes.container.name".into(), c.name.clone()),
                ]),
                ..Default::default()
            })
            .collect();
        Ok(tonic::Response::new(ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        r: tonic::Request<ContainerStatusRequest>,
    ) -> Result<tonic::Response<ContainerStatusResponse>, tonic::Status> {
        let id = r.into_inner().container_id;
        Err(tonic::Status::not_found(format!(
            "container {id} not found"
        )))
    }
}

struct PodRes(World);

#[tonic::async_trait]
impl PodResourcesLister for PodRes {
    async fn list(
        &self,
        _: tonic::Request<ListPodResourcesRequest>,
    ) -> Result<tonic::Response<ListPodResourcesResponse>, tonic::Status> {
        let mut pods: Vec<PodResources> = vec![];
        for c in self.0.containers.lock().unwrap().iter() {
            let cr = ContainerResources {
                name: c.name.clone(),
                devices: if c.gpus.is_empty() {
                    vec![]
                } else {
                    vec![ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: c.gpus.clone(),
                    }]
                },
            };
            match pods
                .iter_mut()
                .find(|p| p.name == c.pod && p.namespace == c.namespace)
            {
                Some(p) => p.containers.push(cr),
                None => pods.push(PodResources {
                    name: c.pod.clone(),
                    namespace: c.namespace.clone(),
                    containers: vec![cr],
                }),
            }
        }
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        Ok(tonic::Response::new(AllocatableResourcesResponse::default()))
    }
}

/// Both servers on sockets in `dir`; stop() removes the sockets (they "vanish").
pub struct FakeNode {
    pub cri: PathBuf,
    pub pod_resources: PathBuf,
    pub world: World,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeNode {
    pub fn start(dir: &Path, world: World) -> FakeNode {
        let cri = dir.join("cri.sock");
        let pod_resources = dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&cri);
        let _ = std::fs::remove_file(&pod_resources);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (c, p, w) = (cri.clone(), pod_resources.clone(), world.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let cl = tokio::net::UnixListener::bind(&c).unwrap();
                let pl = tokio::net::UnixListener::bind(&p).unwrap();
                ready_tx.send(()).unwrap();
                let (tx1, rx1) = tokio::sync::oneshot::channel::<()>();
                let (tx2, rx2) = tokio::sync::oneshot::channel::<()>();
                let a = tonic::transport::Server::builder()
                    .add_service(RuntimeServiceServer::new(Cri(w.clone())))
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(cl),
                        async {
                            let _ = rx1.await;
                        },
                    );
                let b = tonic::transport::Server::builder()
                    .add_service(PodResourcesListerServer::new(PodRes(w)))
                    .serve_with_incoming_shutdown(
                        tokio_stream::wrappers::UnixListenerStream::new(pl),
                        async {
                            let _ = rx2.await;
                        },
                    );
                let stop = async {
                    let _ = stop_rx.await;
                    let _ = tx1.send(());
                    let _ = tx2.send(());
                };
                let _ = tokio::join!(a, b, stop);
            });
        });
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("fake node sockets");
        FakeNode {
            cri,
            pod_resources,
            world,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    pub fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.cri);
        let _ = std::fs::remove_file(&self.pod_resources);
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        self.stop();
    }
}
