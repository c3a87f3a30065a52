//! `gpu-agent rightsize --plan` and `--emit` on a usage-record file this test writes: the
//! layouts and GPUs freed (known answers), the emitted files checked against the formats
//! of the projects that read them (kubernetes-validate for the Kubernetes objects,
//! NVIDIA's own mig-parted and DRA driver files in ../shared/nvidia, the device plugin's
//! sharing rules), and the placements this node's (fake) NVML lists winning over the table.
use std::{collections::BTreeSet, path::Path, process::Command};

use serde_json::{json, Value};
use tests::{
    fake_nvml_lib,
    manifests::{run, tool},
    nvml::Scenario,
    rightsize::{device_plugin_problems, rightsize, rightsize_json, strategic_merge, Record},
    TempDir,
};

const GIB: u64 = 1 << 30;
const MIN: u64 = 60_000;
const H100: &str = "NVIDIA H100 80GB HBM3";
const H100_MEMORY: u64 = 85_520_809_984;
const A100_40: &str = "NVIDIA A100-SXM4-40GB";
const L4: &str = "NVIDIA L4";

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// The node: on H100s three workloads that fit 3g.40gb, one that needs its GPU, one
/// never used; on A100 40GBs three that fit 1g.5gb; on L4s (no MIG) four that fit a third.
fn write_records(path: &Path) {
    let end = now_ms() - 5 * MIN;
    let w = |kind, name, model, memory, peak, sm_p95| Record {
        namespace: "ml",
        kind,
        name,
        pod: name,
        model,
        memory,
        peak,
        sm_p95,
    };
    let mut all = vec![];
    for n in ["infer-a", "infer-b", "infer-c"] {
        all.push(w("Deployment", n, H100, H100_MEMORY, 30 * GIB, 35));
    }
    all.push(w("Job", "train", H100, H100_MEMORY, 75 * GIB, 95));
    all.push(w("Deployment", "idle", H100, H100_MEMORY, 0, 0));
    for n in ["embed-a", "embed-b", "embed-c"] {
        all.push(w("StatefulSet", n, A100_40, 40 * GIB, 3 * GIB, 10));
    }
    for n in ["ocr-a", "ocr-b", "ocr-c", "ocr-d"] {
        all.push(w("Deployment", n, L4, 23034 << 20, 6 * GIB, 15));
    }
    let mut lines = vec![];
    for r in &all {
        let start = end - 60 * MIN;
        lines.push(r.json(start, start + 30 * MIN).to_string());
        lines.push(r.json(start + 30 * MIN, end).to_string());
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

const ARGS: [&str; 4] = [
    "--min-coverage",
    "30s",
    "--nvml-lib",
    "/nonexistent/libnvidia-ml.so.1",
];

fn plans(lines: &[Value]) -> Vec<&Value> {
    lines.iter().filter_map(|l| l.get("plan")).collect()
}

fn plan_of<'a>(lines: &'a [Value], model: &str) -> &'a Value {
    (plans(lines).into_iter())
        .find(|p| p["model"] == model)
        .unwrap_or_else(|| panic!("no plan for {model}: {lines:#?}"))
}

#[test]
fn the_plan_packs_each_model_under_its_rules() {
    let dir = TempDir::new("rightsize-plan");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    let lines = rightsize_json(&file, &[&ARGS[..], &["--plan"]].concat(), &[]);
    // The workload lines first, then one plan line per model.
    assert_eq!(lines.len(), 12 + 3, "{lines:#?}");
    assert!(lines[..12].iter().all(|l| l.get("workload").is_some()));
    let h100 = plan_of(&lines, H100);
    assert_eq!(
        h100,
        &json!({"model": H100, "gpus_held": 5, "gpus_needed": 3, "gpus_freed": 2, "layouts": [
            {"gpus": 2, "mig_devices": {"3g.40gb": 2}, "replicas": null,
             "workloads": ["ml/Deployment/infer-a", "ml/Deployment/infer-b", "ml/Deployment/infer-c"]},
            {"gpus": 1, "mig_devices": {}, "replicas": null, "workloads": ["ml/Job/train"]}]})
    );
    // 1g.5gb x 7 on one GPU: the A100's two others come back.
    let a100 = plan_of(&lines, A100_40);
    assert_eq!(
        (
            &a100["gpus_held"],
            &a100["gpus_needed"],
            &a100["gpus_freed"]
        ),
        (&json!(3), &json!(1), &json!(2))
    );
    assert_eq!(a100["layouts"][0]["mig_devices"], json!({"1g.5gb": 7}));
    // No MIG on the L4: time-slicing, three replicas a GPU.
    let l4 = plan_of(&lines, L4);
    assert_eq!(
        (l4["gpus_needed"].as_u64(), l4["gpus_freed"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(l4["layouts"][0]["replicas"], 3);
    assert_eq!(l4["layouts"][0]["mig_devices"], json!({}));

    // The table: the plan section, and the realizable figure beside the fractional one.
    let f = file.to_str().unwrap();
    let table = rightsize(&[&["--file", f, "--plan"], &ARGS[..]].concat(), &[]);
    assert_eq!(table.code, 0, "{}", table.stderr);
    let out = &table.stdout;
    for want in [
        "\nplan:\nNVIDIA A100-SXM4-40GB: 3 GPUs held, 1 needed, 2 freed\n",
        "\n  2 GPUs as 3g.40gb + 3g.40gb: ml/infer-a, ml/infer-b, ml/infer-c\n",
        "\n  1 GPU whole: ml/train\n",
        "\n  2 GPUs as time-slicing x3: ml/ocr-a, ml/ocr-b, ml/ocr-c, ml/ocr-d\n",
        "GPUs reclaimable (fractional); the plan frees 6 of 12 GPUs\n",
        "MIG packing of NVIDIA H100 80GB HBM3: exact",
    ] {
        assert!(out.contains(want), "{want:?} in:\n{out}");
    }
    // On paper each 3g.40gb workload gives back 4/7 of a GPU: 1.71 for three, where the
    // plan frees one.
    let fractional: f64 = (lines.iter())
        .filter(|l| {
            l["workload"]
                .as_str()
                .is_some_and(|w| w.starts_with("infer"))
        })
        .map(|l| l["gpus_saved"].as_f64().unwrap())
        .sum();
    assert!((fractional - 12.0 / 7.0).abs() < 1e-3, "{fractional}");

    let csv = rightsize(
        &[&["--file", f, "--plan", "--format", "csv"], &ARGS[..]].concat(),
        &[],
    );
    let plan_csv = csv
        .stdout
        .split("\n\n")
        .nth(1)
        .expect("a plan section after a blank line");
    assert!(
        plan_csv.starts_with(
            "model,gpus_held,gpus_needed,gpus_freed,layout_gpus,mig_devices,replicas,workloads\n"
        ),
        "{plan_csv}"
    );
    assert!(
        plan_csv.contains("\nNVIDIA H100 80GB HBM3,5,3,2,2,3g.40gb:2,,ml/Deployment/infer-a ml/Deployment/infer-b ml/Deployment/infer-c\n"),
        "{plan_csv}"
    );
}

/// An H100 whose driver lets 3g.40gb start at slice 0 only (and lists the placements of
/// the others as the table has them): three 3g.40gb need three GPUs here.
#[test]
fn the_placements_this_nodes_nvml_lists_win_over_the_table() {
    let dir = TempDir::new("rightsize-plan-nvml");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    let p = |profile: u32, id: u32, name: &str, slices: u32, mib: u64, places: Value| {
        json!({"profile": profile, "id": id, "name": name, "slices": slices,
               "memory_mib": mib, "placements": places})
    };
    let sc = Scenario::new(&json!({"devices": [{
        "uuid": "GPU-0a0a0a0a-1111-2222-3333-444444444444", "name": H100, "memory_total": H100_MEMORY,
        "mig_profiles": [
            p(0, 19, "MIG 1g.10gb", 1, 9984, json!([[0,1],[1,1],[2,1],[3,1],[4,1],[5,1],[6,1]])),
            p(2, 9, "MIG 3g.40gb", 3, 40448, json!([[0, 4]])),
            p(3, 5, "MIG 4g.40gb", 4, 40448, json!([[0, 4]])),
            p(4, 0, "MIG 7g.80gb", 7, 81152, json!([[0, 8]]))]
    }]}));
    let lib = fake_nvml_lib();
    let env = [("FAKE_NVML_SCENARIO", sc.path())];
    let args = [
        "--min-coverage",
        "30s",
        "--plan",
        "--nvml-lib",
        lib.to_str().unwrap(),
    ];
    let lines = rightsize_json(&file, &args, &env);
    let h100 = plan_of(&lines, H100);
    assert_eq!(h100["layouts"][0]["gpus"], 3, "{h100:#}");
    assert_eq!(h100["layouts"][0]["mig_devices"], json!({"3g.40gb": 1}));
    assert_eq!(h100["gpus_freed"], 1);
}

/// Every `key: value` pair's keys, recursively, under `v`'s maps and lists.
fn keys(v: &serde_yaml::Value, out: &mut BTreeSet<String>) {
    if let Some(m) = v.as_mapping() {
        for (k, v) in m {
            out.insert(k.as_str().unwrap_or_default().to_string());
            keys(v, out);
        }
    }
    for v in v.as_sequence().into_iter().flatten() {
        keys(v, out);
    }
}

fn yaml(path: &Path) -> serde_yaml::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn shared_nvidia(file: &str) -> std::path::PathBuf {
    let p = tests::root().join("../shared/nvidia").join(file);
    assert!(
        p.exists(),
        "{} missing: NVIDIA's files are read in place",
        p.display()
    );
    p
}

/// `kubernetes-validate --strict` on `files` for Kubernetes 1.34 and 1.37 (resource.k8s.io/v1
/// is in 1.34 on): every object passes.
fn kubernetes_validate(files: &[String]) {
    let how = "pip install kubernetes-validate==1.37.0 (`cargo xtask test` installs it)";
    let kv = tool("kubernetes-validate", how);
    for v in ["1.34.0", "1.37.0"] {
        let (ok, text) = run(Command::new(&kv).args(["--strict", "-k", v]).args(files));
        let passed = text
            .lines()
            .filter(|l| l.contains(" passed for resource "))
            .count();
        assert!(
            ok && passed == files.len(),
            "Kubernetes {v}: {passed} of {}:\n{text}",
            files.len()
        );
    }
}

/// The workload a patch is for, as a cluster would hold it: one container `main` asking
/// for a whole GPU.
fn base_workload(kind: &str, name: &str) -> Value {
    let pod = json!({"containers": [{"name": "main", "image": "busybox",
        "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"nvidia.com/gpu": 1}}}],
        "restartPolicy": if kind == "Job" { "Never" } else { "Always" }});
    let template = json!({"metadata": {"labels": {"app": name}}, "spec": pod});
    let spec = match kind {
        "Job" => json!({"template": template}),
        _ => json!({"selector": {"matchLabels": {"app": name}}, "template": template}),
    };
    let api = if kind == "Job" { "batch/v1" } else { "apps/v1" };
    json!({"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": "ml"}, "spec": spec})
}

#[test]
fn the_emitted_files_follow_their_formats() {
    let dir = TempDir::new("rightsize-emit");
    let file = dir.0.join("usage.jsonl");
    write_records(&file);
    let out_dir = dir.0.join("plan");
    let (f, d) = (file.to_str().unwrap(), out_dir.to_str().unwrap());
    let emit = rightsize(&[&["--file", f, "--emit", d], &ARGS[..]].concat(), &[]);
    assert_eq!(emit.code, 0, "{}", emit.stderr);
    assert!(
        emit.stdout.contains("\nplan:\n"),
        "--emit plans: {}",
        emit.stdout
    );
    let mut names: Vec<String> = walk(&out_dir);
    names.sort();
    let want = [
        "README.md",
        "device-plugin-sharing.yaml",
        "dra/ml-deployment-infer-a.yaml",
        "dra/ml-deployment-infer-b.yaml",
        "dra/ml-deployment-infer-c.yaml",
        "dra/ml-deployment-ocr-a.yaml",
        "dra/ml-deployment-ocr-b.yaml",
        "dra/ml-deployment-ocr-c.yaml",
        "dra/ml-deployment-ocr-d.yaml",
        "dra/ml-statefulset-embed-a.yaml",
        "dra/ml-statefulset-embed-b.yaml",
        "dra/ml-statefulset-embed-c.yaml",
        "mig-parted.yaml",
        "workloads/ml-deployment-idle.yaml",
        "workloads/ml-deployment-infer-a.yaml",
        "workloads/ml-deployment-infer-b.yaml",
        "workloads/ml-deployment-infer-c.yaml",
        "workloads/ml-deployment-ocr-a.yaml",
        "workloads/ml-deployment-ocr-b.yaml",
        "workloads/ml-deployment-ocr-c.yaml",
        "workloads/ml-deployment-ocr-d.yaml",
        "workloads/ml-statefulset-embed-a.yaml",
        "workloads/ml-statefulset-embed-b.yaml",
        "workloads/ml-statefulset-embed-c.yaml",
    ];
    assert_eq!(names, want);
    check_mig_parted(&out_dir.join("mig-parted.yaml"));
    check_sharing(&out_dir.join("device-plugin-sharing.yaml"));
    check_patches(&out_dir);
    check_claims(&out_dir);
    check_examples(&out_dir);
    let readme = std::fs::read_to_string(out_dir.join("README.md")).unwrap();
    for want in [
        "nvidia.com/mig.config=h100-80gb-hbm3-2x3g.40gb",
        "nvidia.com/device-plugin.config=time-slicing-3",
        "## In this order",
        "## What to check after",
        "- `workloads/ml-deployment-infer-a.yaml`: a strategic-merge patch",
    ] {
        assert!(readme.contains(want), "{want:?} in:\n{readme}");
    }

    // A directory with something in it is refused, naming the flag, unless --force.
    let again = rightsize(&[&["--file", f, "--emit", d], &ARGS[..]].concat(), &[]);
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert!(
        again.stderr.contains("--force") && again.stderr.contains(d),
        "{}",
        again.stderr
    );
    assert!(again.stdout.is_empty(), "refused before anything is read");
    let forced = rightsize(
        &[&["--file", f, "--emit", d, "--force"], &ARGS[..]].concat(),
        &[],
    );
    assert_eq!(forced.code, 0, "{}", forced.stderr);
}

/// Files under `dir`, relative to it.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if p.is_dir() {
            out.extend(walk(&p).into_iter().map(|f| format!("{name}/{f}")));
        } else {
            out.push(name);
        }
    }
    out
}

/// mig-parted's format as its own example and default configs use it: `version: v1`,
/// `mig-configs` of lists of `{devices, mig-enabled, mig-devices}`, every profile one the
/// GPU Operator's default config names.
fn check_mig_parted(path: &Path) {
    let ours = yaml(path);
    let example = yaml(&shared_nvidia("mig-parted-config.yaml"));
    let default = yaml(&shared_nvidia("mig-parted-config-default.yaml"));
    assert_eq!(ours["version"], example["version"]);
    let (mut theirs, mut mine) = (BTreeSet::new(), BTreeSet::new());
    for config in example["mig-configs"].as_mapping().unwrap().values() {
        for entry in config.as_sequence().unwrap() {
            theirs.extend(
                entry
                    .as_mapping()
                    .unwrap()
                    .keys()
                    .map(|k| k.as_str().unwrap().to_string()),
            );
        }
    }
    let mut profiles = BTreeSet::new();
    keys(&default["mig-configs"], &mut profiles);
    let configs = ours["mig-configs"].as_mapping().unwrap();
    let names: Vec<&str> = configs.keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["a100-sxm4-40gb-7x1g.5gb", "h100-80gb-hbm3-2x3g.40gb"]
    );
    for (name, config) in configs {
        let name = name.as_str().unwrap();
        // A label value: 63 characters of [A-Za-z0-9._-].
        assert!(
            name.len() <= 63
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        );
        for entry in config.as_sequence().unwrap() {
            mine.extend(
                entry
                    .as_mapping()
                    .unwrap()
                    .keys()
                    .map(|k| k.as_str().unwrap().to_string()),
            );
            assert_eq!(entry["devices"], "all");
            assert_eq!(entry["mig-enabled"], true);
            for (p, n) in entry["mig-devices"].as_mapping().unwrap() {
                let p = p.as_str().unwrap();
                assert!(
                    profiles.contains(p),
                    "{p}: not a profile NVIDIA's default config names"
                );
                assert!(
                    n.as_u64().is_some_and(|n| (1..=7).contains(&n)),
                    "{p}: {n:?}"
                );
            }
        }
    }
    assert!(mine.is_subset(&theirs), "{mine:?} not within {theirs:?}");
}

/// A ConfigMap (kubernetes-validate) whose every value the device plugin accepts.
fn check_sharing(path: &Path) {
    kubernetes_validate(&[path.to_str().unwrap().to_string()]);
    let cm = yaml(path);
    let data = cm["data"].as_mapping().unwrap();
    let keys: Vec<&str> = data.keys().map(|k| k.as_str().unwrap()).collect();
    assert_eq!(keys, ["time-slicing-3"]);
    for v in data.values() {
        let config: Value = serde_yaml::from_str(v.as_str().unwrap()).unwrap();
        assert_eq!(
            device_plugin_problems(&config),
            Vec::<String>::new(),
            "{config}"
        );
        assert_eq!(
            config["sharing"]["timeSlicing"]["resources"][0]["replicas"],
            3
        );
    }
}

/// Each patch merged into the workload it is for passes kubernetes-validate, asks for the
/// plan's resource and no longer for a whole GPU.
fn check_patches(dir: &Path) {
    let merged_dir = dir.join("../merged");
    std::fs::create_dir_all(&merged_dir).unwrap();
    let mut files = vec![];
    for name in walk(&dir.join("workloads")) {
        let patch: Value =
            serde_yaml::from_value(yaml(&dir.join("workloads").join(&name))).unwrap();
        let kind = patch["kind"].as_str().unwrap();
        let mut w = base_workload(kind, patch["metadata"]["name"].as_str().unwrap());
        strategic_merge(&mut w, &patch);
        let limits = &w["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"];
        assert!(limits.get("nvidia.com/gpu").is_none(), "{name}: {w:#}");
        let want = match name.as_str() {
            n if n.contains("infer") => Some("nvidia.com/mig-3g.40gb"),
            n if n.contains("embed") => Some("nvidia.com/mig-1g.5gb"),
            n if n.contains("ocr") => Some("nvidia.com/gpu.shared"),
            _ => None,
        };
        let asked: Vec<&String> = limits
            .as_object()
            .map(|m| m.keys().collect())
            .unwrap_or_default();
        assert_eq!(asked.first().map(|s| s.as_str()), want, "{name}: {w:#}");
        if name.contains("ocr") {
            let sel = &w["spec"]["template"]["spec"]["nodeSelector"];
            assert_eq!(
                sel["nvidia.com/device-plugin.config"], "time-slicing-3",
                "{name}"
            );
        }
        let out = merged_dir.join(&name);
        std::fs::write(&out, serde_yaml::to_string(&w).unwrap()).unwrap();
        files.push(out.to_str().unwrap().to_string());
    }
    kubernetes_validate(&files);
}

/// deploy/examples/dra, which docs/rightsizing.md shows, holds what `--emit` writes for
/// ml/infer-a (its template) and ml/ocr-a (its template's `spec.spec`, as a claim shared by
/// the pods of one GPU).
fn check_examples(dir: &Path) {
    let example = |file: &str, kind: &str| -> serde_yaml::Value {
        let path = tests::root().join("deploy/examples/dra").join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        let docs = serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .find(|d: &serde_yaml::Value| d["kind"] == kind);
        docs.unwrap_or_else(|| panic!("{}: no {kind}", path.display()))
    };
    assert_eq!(
        yaml(&dir.join("dra/ml-deployment-infer-a.yaml")),
        example("mig.yaml", "ResourceClaimTemplate"),
        "deploy/examples/dra/mig.yaml's template is not what --emit writes"
    );
    assert_eq!(
        yaml(&dir.join("dra/ml-deployment-ocr-a.yaml"))["spec"]["spec"],
        example("shared.yaml", "ResourceClaim")["spec"],
        "deploy/examples/dra/shared.yaml's claim is not the spec --emit writes"
    );
}

/// The ResourceClaimTemplates pass kubernetes-validate and ask as NVIDIA's DRA driver's own
/// examples do: its device classes, its `profile` attribute, its GpuConfig.
fn check_claims(dir: &Path) {
    let files: Vec<String> = (walk(&dir.join("dra")).iter())
        .map(|f| dir.join("dra").join(f).to_str().unwrap().to_string())
        .collect();
    kubernetes_validate(&files);
    let docs = |file: &str| -> Vec<serde_yaml::Value> {
        let text = std::fs::read_to_string(shared_nvidia(file)).unwrap();
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .filter(|d: &serde_yaml::Value| d["kind"] == "ResourceClaimTemplate")
            .collect()
    };
    let mig_example =
        &docs("dra-driver-gpu-test4.yaml")[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"];
    let mps_example = &docs("dra-driver-gpu-test-mps.yaml")[0]["spec"]["spec"]["devices"];
    let example_cel = mig_example["selectors"][0]["cel"]["expression"]
        .as_str()
        .unwrap();
    let attr = example_cel.split(" == ").next().unwrap();
    for f in &files {
        let c = yaml(Path::new(f));
        let exactly = &c["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        let cel = exactly["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap();
        if f.contains("infer") || f.contains("embed") {
            assert_eq!(
                exactly["deviceClassName"], mig_example["deviceClassName"],
                "{f}"
            );
            let profile = if f.contains("infer") {
                "3g.40gb"
            } else {
                "1g.5gb"
            };
            assert!(
                cel.starts_with(&format!("{attr} == '{profile}'")),
                "{f}: {cel}"
            );
        } else {
            assert_eq!(
                exactly["deviceClassName"],
                mps_example["requests"][0]["exactly"]["deviceClassName"]
            );
            let ours = &c["spec"]["spec"]["devices"]["config"][0]["opaque"];
            let theirs = &mps_example["config"][0]["opaque"];
            assert_eq!(ours["driver"], theirs["driver"]);
            assert_eq!(
                ours["parameters"]["apiVersion"],
                theirs["parameters"]["apiVersion"]
            );
            assert_eq!(ours["parameters"]["kind"], theirs["parameters"]["kind"]);
            assert_eq!(
                ours["parameters"]["sharing"]["strategy"], "TimeSlicing",
                "{f}"
            );
        }
        assert!(
            cel.contains("device.attributes['gpu.nvidia.com'].productName == 'NVIDIA "),
            "{f}: {cel}"
        );
    }
}

/// The records a new user might edit or copy: each is left out, counted with its place on
/// stderr, and the answers are those of the clean file, for `rightsize` and `report` alike.
#[test]
fn records_out_of_range_and_duplicates_are_left_out_and_counted() {
    let dir = TempDir::new("rightsize-bad-records");
    let clean = dir.0.join("clean.jsonl");
    write_records(&clean);
    let text = std::fs::read_to_string(&clean).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let mut edited = vec![];
    let mut big = first.clone();
    big["gpus_allocated"] = json!(1e6);
    big["start_ms"] = json!(first["start_ms"].as_u64().unwrap() - 1);
    edited.push(big);
    let mut backwards = first.clone();
    backwards["end_ms"] = json!(first["start_ms"].as_u64().unwrap() - 60_000);
    edited.push(backwards);
    let mut hot = first.clone();
    hot["sm_p95"] = json!(150);
    hot["start_ms"] = json!(first["start_ms"].as_u64().unwrap() + 1);
    edited.push(hot);
    let dirty = dir.0.join("usage.jsonl");
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    lines.push(lines[0].clone());
    lines.extend(edited.iter().map(|v| v.to_string()));
    std::fs::write(&dirty, lines.join("\n") + "\n").unwrap();
    let n = text.lines().count();

    let args = [&ARGS[..], &["--plan"]].concat();
    assert_eq!(
        rightsize_json(&dirty, &args, &[]),
        rightsize_json(&clean, &args, &[])
    );
    let f = dirty.to_str().unwrap();
    let out = rightsize(
        &[&["--file", f, "--format", "json"], &ARGS[..]].concat(),
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    for want in [
        format!("1 duplicate records left out (same container, device and start): usage.jsonl:{}", n + 1),
        format!("3 records out of range left out: gpus_allocated 1000000 (one device: 0 to 1) at usage.jsonl:{}", n + 2),
        format!("end_ms {} before start_ms", backwards_end(&first)),
        format!("sm_p95 150 (a percentage) at usage.jsonl:{}", n + 4),
    ] {
        assert!(out.stderr.contains(&want), "{want:?} in:\n{}", out.stderr);
    }

    let report = |file: &Path| {
        let out = Command::new(tests::agent_binary())
            .args([
                "report",
                "--file",
                file.to_str().unwrap(),
                "--by",
                "pod",
                "--format",
                "csv",
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (text(&out.stdout), text(&out.stderr))
    };
    let ((dirty_out, dirty_err), (clean_out, clean_err)) = (report(&dirty), report(&clean));
    assert_eq!(dirty_out, clean_out);
    assert!(clean_err.is_empty(), "{clean_err}");
    assert!(
        dirty_err.contains("gpu-agent report: 3 records out of range left out: ")
            && dirty_err.contains("gpu-agent report: 1 duplicate records left out"),
        "{dirty_err}"
    );
}

fn backwards_end(first: &Value) -> u64 {
    first["start_ms"].as_u64().unwrap() - 60_000
}

/// A Prometheus that takes the connection and never answers: `--prometheus-timeout` ends
/// the wait and says so; a timeout of 0 is refused naming the flag.
#[test]
fn a_prometheus_that_does_not_answer_fails_within_the_timeout() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", silent.local_addr().unwrap());
    let started = std::time::Instant::now();
    let args = [
        "--prometheus",
        &url,
        "--rule-interval",
        "5m",
        "--prometheus-timeout",
        "2s",
    ];
    let out = rightsize(&args, &[]);
    let took = started.elapsed();
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains(&url)
            && out
                .stderr
                .contains("no answer within 2 s (--prometheus-timeout)"),
        "{}",
        out.stderr
    );
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    let zero = rightsize(&["--prometheus", &url, "--prometheus-timeout", "0s"], &[]);
    assert_eq!(zero.code, 2);
    assert!(
        zero.stderr.contains("--prometheus-timeout"),
        "{}",
        zero.stderr
    );
    let bad = rightsize(&["--prometheus", &url, "--prometheus-timeout", "soon"], &[]);
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("--prometheus-timeout"),
        "{}",
        bad.stderr
    );
}
