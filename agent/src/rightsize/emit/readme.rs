//! DIR/README.md: what each file is, the order to apply them in, and what to check after.
use std::fmt::Write as _;

use super::{workload_file, PLUGIN_CONFIGMAP, PLUGIN_CONFIG_LABEL, PLUGIN_NAMESPACE};
use crate::rightsize::plan::{render::describe, workload_name, Cut, Plan, WorkloadPlan};

/// The README, listing `files` (paths relative to DIR) and the workloads whose patch must
/// be written by hand (`by_hand`: no container names from the source).
pub fn render(plan: &Plan, files: &[&String], by_hand: &[&WorkloadPlan]) -> String {
    let mut s = String::from("# Applying the rightsizing plan\n\n");
    s += "Written by `gpu-agent rightsize --plan --emit`. The plan, per GPU model:\n\n";
    for m in &plan.models {
        let _ = writeln!(
            s,
            "- **{}**: {} GPUs held, {} needed, {} freed",
            m.model, m.gpus_held, m.gpus_needed, m.gpus_freed
        );
        for l in &m.layouts {
            let label = match &l.cut {
                Cut::Mig { config } => format!(" (`nvidia.com/mig.config={config}`)"),
                Cut::Shared { sharing, replicas } => format!(
                    " (`{PLUGIN_CONFIG_LABEL}={}`)",
                    super::plugin_key(*sharing, *replicas)
                ),
                Cut::Whole => String::new(),
            };
            let _ = writeln!(s, "  - {}{label}: {}", describe(l), l.workloads.join(", "));
        }
    }
    s += "\n## Files\n\n";
    for f in files {
        let _ = writeln!(s, "- `{f}`: {}", what(f));
    }
    s += STEPS;
    if !by_hand.is_empty() {
        s += "\n## Patches to write by hand\n\nThe source named no containers for these \
              (from Prometheus, none of theirs was in the raw per-container series of the \
              window's last day): ask for the resource their claim file names, in each \
              container that uses the GPU.\n\n";
        for w in by_hand {
            let file = workload_file(w).unwrap_or_default();
            let _ = writeln!(
                s,
                "- {} (`dra/{file}` says what to ask for)",
                workload_name(&w.key)
            );
        }
    }
    s
}

fn what(file: &str) -> String {
    match file {
        "mig-parted.yaml" => "the MIG layouts, one mig-parted config per layout (`version: v1`, \
            `mig-configs`), for the GPU Operator's MIG manager"
            .into(),
        "device-plugin-sharing.yaml" => format!(
            "ConfigMap `{PLUGIN_NAMESPACE}/{PLUGIN_CONFIGMAP}`: one NVIDIA device plugin config \
             (`version: v1`, `sharing.timeSlicing` or `sharing.mps`) per replica count, shared \
             replicas advertised as `nvidia.com/gpu.shared`"
        ),
        f if f.starts_with("workloads/") => {
            "a strategic-merge patch of the workload's GPU containers' resources".into()
        }
        f if f.starts_with("dra/") => {
            "the same request as a `resource.k8s.io/v1` ResourceClaimTemplate, for NVIDIA's DRA driver"
                .into()
        }
        _ => String::new(),
    }
}

const STEPS: &str = "
## In this order

1. **MIG layouts** (`mig-parted.yaml`). Put its configs into the MIG manager's ConfigMap
   (the GPU Operator's `migManager.config.name`; keep the default configs beside them), with
   the `mixed` MIG strategy. Then label each node with the config its GPUs take:
   `kubectl label node NODE nvidia.com/mig.config=CONFIG --overwrite`. The MIG manager
   drains the node's GPU pods and repartitions; wait for
   `nvidia.com/mig.config.state=success` on the node. A node's GPUs all take one config:
   pick nodes with as many GPUs of the model as the layout's count, or split a layout's
   GPUs across nodes of one config.
2. **Sharing** (`device-plugin-sharing.yaml`). `kubectl apply -f device-plugin-sharing.yaml`,
   set the GPU Operator's `devicePlugin.config.name` to that ConfigMap, and label each node
   that shares its GPUs: `kubectl label node NODE nvidia.com/device-plugin.config=KEY`.
3. **Workloads** (`workloads/`). `kubectl patch KIND NAME -n NAMESPACE --type strategic
   --patch-file workloads/FILE`. A patch sets the new resource and removes the old one
   (`null`); a shared one also selects the nodes of its replica count. A Job's or a bare
   Pod's template cannot change: apply the patch to its manifest and create it again.
4. **Or DRA** (`dra/`), instead of 1 to 3 on a cluster with NVIDIA's DRA driver: apply the
   ResourceClaimTemplate, add it to the pod spec's `resourceClaims`
   (`resourceClaimTemplateName`) and the container's `resources.claims`, and drop the
   `nvidia.com/*` request. Pods that share one GPU share one ResourceClaim: create one from
   the template's `spec.spec` and name it with `resourceClaimName` in each pod.

## What to check after

- Each node advertises what the plan asks for: `kubectl get node NODE -o
  jsonpath='{.status.allocatable}'` lists `nvidia.com/mig-<profile>` counts or
  `nvidia.com/gpu.shared` replicas.
- Every patched workload's pods are running, none Pending for want of a resource.
- After a few days, `gpu-agent rightsize --plan` again: each workload should be advised
  the device or share it now has, with nothing more to save, and the freed GPUs hold no
  pods (`container_gpu_allocated_idle`, the GPUs' utilization in Grafana).
";
