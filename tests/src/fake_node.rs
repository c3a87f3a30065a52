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
        ListContainersRequest, ListContainersResponse, ListPodSandboxRequest,
        ListPodSandboxResponse, PodSandbox, PodSandboxMetadata, VersionRequest, VersionResponse,
    },
    podresources::{
        pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
        AllocatableResourcesRequest, AllocatableResourcesResponse, CdiDevice, ClaimResource,
        ContainerDevices, ContainerResources, DynamicResource, ListPodResourcesRequest,
        ListPodResourcesResponse, PodResources,
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

/// A DRA claim the kubelet reports for a container of pod `namespace/pod` (pod-resources
/// `dynamic_resources`), verbatim: the claim's name and namespace and its `ClaimResource`s
/// (driver, pool, device name, CDI device names) as given.
#[derive(Clone, Debug)]
pub struct FakeClaim {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub claim: DynamicResource,
}

/// One device of a claim, as given.
pub fn claim_resource(driver: &str, pool: &str, device: &str, cdi: &[String]) -> ClaimResource {
    ClaimResource {
        cdi_devices: cdi.iter().map(|n| CdiDevice { name: n.clone() }).collect(),
        driver_name: driver.into(),
        pool_name: pool.into(),
        device_name: device.into(),
    }
}

/// Claim `namespace/name` of NVIDIA's driver (`gpu.nvidia.com`, pool `pool`) as the kubelet
/// reports it: a `ClaimResource` per (device name, its CDI device name), and since the
/// kubelet declares a claim's CDI list once, outside its loop over the devices, each
/// carries the CDI names of the devices up to its own.
pub fn kubelet_claim(
    namespace: &str,
    name: &str,
    pool: &str,
    devices: &[(&str, &str)],
) -> DynamicResource {
    let mut cdi = vec![];
    let claim_resources = devices
        .iter()
        .map(|(device, name)| {
            cdi.push(name.to_string());
            claim_resource("gpu.nvidia.com", pool, device, &cdi)
        })
        .collect();
    DynamicResource {
        claim_name: name.into(),
        claim_namespace: namespace.into(),
        claim_resources,
    }
}

/// Labels as (key, value) pairs.
pub type Labels = Vec<(String, String)>;

#[derive(Clone, Default)]
pub struct World {
    containers: Arc<Mutex<Vec<FakeContainer>>>,
    claims: Arc<Mutex<Vec<FakeClaim>>>,
    /// nvidia.com/gpu device ids the kubelet can allocate (time-slicing: `<uuid>::N`).
    allocatable: Arc<Mutex<Vec<String>>>,
    /// CRI Version's runtime_name; "fake" when unset.
    runtime_name: Arc<Mutex<Option<String>>>,
    list_calls: Arc<std::sync::atomic::AtomicUsize>,
    /// The pods' own labels, by (namespace, pod): what the kubelet gives the sandbox.
    pod_labels: Arc<Mutex<HashMap<(String, String), Labels>>>,
    /// ListPodSandbox answers UNIMPLEMENTED, as a runtime without it does.
    no_sandboxes: Arc<std::sync::atomic::AtomicBool>,
}

impl World {
    pub fn set(&self, cs: Vec<FakeContainer>) {
        *self.containers.lock().unwrap() = cs;
    }

    /// The containers as set last.
    pub fn containers(&self) -> Vec<FakeContainer> {
        self.containers.lock().unwrap().clone()
    }

    pub fn set_claims(&self, cs: Vec<FakeClaim>) {
        *self.claims.lock().unwrap() = cs;
    }

    pub fn set_allocatable(&self, ids: Vec<String>) {
        *self.allocatable.lock().unwrap() = ids;
    }

    pub fn set_runtime_name(&self, name: &str) {
        *self.runtime_name.lock().unwrap() = Some(name.to_string());
    }

    /// Pod `namespace/pod`'s own labels (its sandbox's, besides the kubelet's
    /// `io.kubernetes.pod.*`).
    pub fn set_pod_labels(&self, namespace: &str, pod: &str, labels: &[(&str, &str)]) {
        let labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let key = (namespace.to_string(), pod.to_string());
        self.pod_labels
            .lock()
            .unwrap()
            .insert(key, labels.collect());
    }

    /// Forgets pod `namespace/pod`'s labels (the pod is gone).
    pub fn remove_pod_labels(&self, namespace: &str, pod: &str) {
        let key = (namespace.to_string(), pod.to_string());
        self.pod_labels.lock().unwrap().remove(&key);
    }

    /// Whether ListPodSandbox is refused as unimplemented.
    pub fn set_sandboxes_unimplemented(&self, no: bool) {
        self.no_sandboxes
            .store(no, std::sync::atomic::Ordering::SeqCst);
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
        let name = self.0.runtime_name.lock().unwrap().clone();
        Ok(tonic::Response::new(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: name.unwrap_or_else(|| "fake".into()),
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
                pod_sandbox_id: sandbox_id(c),
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

    async fn list_pod_sandbox(
        &self,
        _: tonic::Request<ListPodSandboxRequest>,
    ) -> Result<tonic::Response<ListPodSandboxResponse>, tonic::Status> {
        if self
            .0
            .no_sandboxes
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(tonic::Status::unimplemented("ListPodSandbox"));
        }
        let labels = self.0.pod_labels.lock().unwrap().clone();
        let mut items: Vec<PodSandbox> = vec![];
        for c in self.0.containers.lock().unwrap().iter() {
            let id = sandbox_id(c);
            if items.iter().any(|s| s.id == id) {
                continue;
            }
            let key = (c.namespace.clone(), c.pod.clone());
            let mut all: HashMap<String, String> = HashMap::from([
                ("io.kubernetes.pod.name".into(), c.pod.clone()),
                ("io.kubernetes.pod.namespace".into(), c.namespace.clone()),
                ("io.kubernetes.pod.uid".into(), c.pod_uid.clone()),
            ]);
            all.extend(labels.get(&key).into_iter().flatten().cloned());
            items.push(PodSandbox {
                id,
                metadata: Some(PodSandboxMetadata {
                    name: c.pod.clone(),
                    uid: c.pod_uid.clone(),
                    namespace: c.namespace.clone(),
                    attempt: 0,
                }),
                labels: all,
                ..Default::default()
            });
        }
        Ok(tonic::Response::new(ListPodSandboxResponse { items }))
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

fn sandbox_id(c: &FakeContainer) -> String {
    format!("sandbox-{}", c.pod_uid)
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
                dynamic_resources: vec![],
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
        for cl in self.0.claims.lock().unwrap().iter() {
            add_claim(&mut pods, cl);
        }
        Ok(tonic::Response::new(ListPodResourcesResponse {
            pod_resources: pods,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<AllocatableResourcesResponse>, tonic::Status> {
        let ids = self.0.allocatable.lock().unwrap().clone();
        let devices = if ids.is_empty() {
            vec![]
        } else {
            vec![ContainerDevices {
                resource_name: "nvidia.com/gpu".into(),
                device_ids: ids,
            }]
        };
        Ok(tonic::Response::new(AllocatableResourcesResponse {
            devices,
        }))
    }
}

/// The claim on its container, which is added (with no devices) if the pod lacks it.
fn add_claim(pods: &mut Vec<PodResources>, cl: &FakeClaim) {
    let dr = cl.claim.clone();
    let pod = match pods
        .iter()
        .position(|p| p.name == cl.pod && p.namespace == cl.namespace)
    {
        Some(i) => &mut pods[i],
        None => {
            pods.push(PodResources {
                name: cl.pod.clone(),
                namespace: cl.namespace.clone(),
                containers: vec![],
            });
            pods.last_mut().unwrap()
        }
    };
    match pod.containers.iter_mut().find(|c| c.name == cl.container) {
        Some(c) => c.dynamic_resources.push(dr),
        None => pod.containers.push(ContainerResources {
            name: cl.container.clone(),
            devices: vec![],
            dynamic_resources: vec![dr],
        }),
    }
}

/// The agent's `[metadata]` table for `node`'s sockets, or for sockets in `dir` that do not
/// exist (no node): the runtime and the kubelet asked every second.
pub fn metadata_config(dir: &Path, node: Option<&FakeNode>) -> String {
    let (cri, podres) = match node {
        Some(n) => (n.cri.clone(), n.pod_resources.clone()),
        None => (dir.join("no-cri.sock"), dir.join("no-kubelet.sock")),
    };
    format!(
        "[metadata]\ncri_socket = \"{}\"\npod_resources_socket = \"{}\"\ndocker_socket = \"{}\"\nallocation_interval_secs = 1\n",
        cri.display(),
        podres.display(),
        dir.join("no-docker.sock").display()
    )
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
