//! OTLP through a real reverse proxy: nginx, as ingress-nginx puts in front of a Collector,
//! with a body limit (`client_max_body_size`; ingress-nginx's `proxy-body-size` is 1 MiB by
//! default, the agent's gRPC requests 1 MiB). Over gRPC a refusal arrives as HTTP 413 with
//! no gRPC status: the agent must send again in pieces, not retry the same request forever.
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::ExportMetricsServiceRequest,
    common::v1::{any_value, AnyValue, KeyValue},
    metrics::v1::ResourceMetrics,
    resource::v1::Resource,
};
use otel::{
    export::{ExportCounters, OtlpExporter},
    settings::OtlpConfig,
};
use prost::Message;
use tests::{
    otlp_receiver::{attr_str, Kind, Receiver},
    prom::free_port,
    random_hex,
};

/// nginx on a free port of 127.0.0.1, speaking h2c and passing gRPC to `upstream`; bodies
/// over `limit` are refused with 413. Stopped when dropped.
struct Nginx {
    port: u16,
    child: Child,
    dir: PathBuf,
}

impl Nginx {
    fn start(upstream: std::net::SocketAddr, limit: &str) -> Nginx {
        let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect(
                "no nginx: `cargo xtask test` installs it (as root), else \
                 apt-get install -y --no-install-recommends nginx",
            );
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("nginx-{}", random_hex(8)));
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let conf = format!(
            "pid {dir}/nginx.pid;\n\
             error_log {dir}/logs/error.log info;\n\
             events {{}}\n\
             http {{\n\
               access_log {dir}/logs/access.log;\n\
               client_body_temp_path {dir}/body;\n\
               proxy_temp_path {dir}/proxy;\n\
               fastcgi_temp_path {dir}/fastcgi;\n\
               uwsgi_temp_path {dir}/uwsgi;\n\
               scgi_temp_path {dir}/scgi;\n\
               server {{\n\
                 listen 127.0.0.1:{port} http2;\n\
                 client_max_body_size {limit};\n\
                 location / {{ grpc_pass grpc://{upstream}; }}\n\
               }}\n\
             }}\n",
            dir = dir.display()
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let child = Command::new(bin)
            .args([
                "-e",
                "stderr",
                "-g",
                "daemon off; master_process off;",
                "-c",
            ])
            .arg(dir.join("nginx.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting nginx");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nginx never listened on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nginx { port, child, dir }
    }

    /// The requests nginx answered, one status per line.
    fn statuses(&self) -> Vec<u16> {
        std::fs::read_to_string(self.dir.join("logs/access.log"))
            .unwrap_or_default()
            .lines()
            // combined format: `"POST /... HTTP/2.0" 413 ...`
            .filter_map(|l| l.split("\" ").nth(1)?.split(' ').next()?.parse().ok())
            .collect()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An export of `n` resources of about `bytes` each, told apart by `service.name`.
fn request(n: usize, bytes: usize) -> Vec<u8> {
    let text = |s: String| AnyValue {
        value: Some(any_value::Value::StringValue(s)),
    };
    let resource_metrics = (0..n)
        .map(|i| ResourceMetrics {
            resource: Some(Resource {
                attributes: vec![
                    KeyValue {
                        key: "service.name".into(),
                        value: Some(text(format!("r{i}"))),
                        ..Default::default()
                    },
                    KeyValue {
                        key: "padding".into(),
                        value: Some(text("x".repeat(bytes))),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }.encode_to_vec()
}

fn names(r: &ExportMetricsServiceRequest) -> Vec<String> {
    r.resource_metrics
        .iter()
        .filter_map(|rm| attr_str(&rm.resource.as_ref()?.attributes, "service.name"))
        .map(str::to_string)
        .collect()
}

#[test]
fn grpc_refused_by_a_proxys_body_limit_goes_again_in_pieces() {
    let rx = Receiver::start(Kind::Grpc, 0);
    let nginx = Nginx::start(rx.addr, "300k");
    let settings = OtlpConfig {
        endpoint: Some(format!("http://127.0.0.1:{}", nginx.port)),
        protocol: Some("grpc".into()),
        ..Default::default()
    }
    .resolve(|_| None)
    .unwrap()
    .unwrap();
    assert_eq!(settings.max_request_bytes, 1 << 20, "gRPC's default");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _in_rt = rt.enter(); // the channel is made in the runtime
    let counters = Arc::new(ExportCounters::default());
    let mut ex = OtlpExporter::new(settings, counters.clone());
    // 900 KB: under the agent's 1 MiB, over the proxy's 300 KiB.
    rt.block_on(ex.export(request(9, 100_000)));
    let want: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
    let got: Vec<String> = rx
        .received
        .all()
        .iter()
        .flat_map(|(r, _)| names(r))
        .collect();
    assert_eq!(
        got,
        want,
        "every resource once, in order; nginx answered {:?}",
        nginx.statuses()
    );
    assert_eq!(ex.queued(), 0, "nothing left to retry");
    assert_eq!(counters.dropped_batches.load(Relaxed), 0);
    let statuses = nginx.statuses();
    assert_eq!(statuses.first(), Some(&413), "{statuses:?}");
    assert!(statuses.contains(&200), "{statuses:?}");
    let refused = statuses.iter().filter(|&&s| s == 413).count() as u64;
    assert_eq!(counters.failures.load(Relaxed), refused);
    // The agent's next exports are cut to fit at once (`otlp::requests` reads this).
    assert!(
        ex.max_request_bytes() <= 300 << 10,
        "{}",
        ex.max_request_bytes()
    );
}
