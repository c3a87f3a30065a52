//! Namespaces: every namespaced object in the rendering's one namespace, and bindings to
//! the ServiceAccounts rendered there.
use super::{s, seq, Rendered, CLUSTER_SCOPED};

/// Every namespaced object carries the namespace of the one Namespace its kustomization
/// creates (a Helm release's: its own), and the ServiceAccount subjects of bindings point
/// there.
pub fn namespace_problems(r: &Rendered) -> Vec<String> {
    let names: Vec<&str> = r
        .of_kind("Namespace")
        .map(|n| s(&n["metadata"]["name"]))
        .collect();
    let ns = match (&r.namespace, &names[..]) {
        (Some(release), []) => release.as_str(),
        (None, [ns]) => *ns,
        (Some(release), _) => {
            return vec![format!(
                "{}: creates Namespaces {names:?}: `helm install --create-namespace` makes \
                the release's ({release})",
                r.name
            )]
        }
        (None, _) => {
            return vec![format!(
                "{}: creates {} Namespaces, not one: {names:?}",
                r.name,
                names.len()
            )]
        }
    };
    let mut p = vec![];
    for o in r
        .objs
        .iter()
        .filter(|o| !CLUSTER_SCOPED.contains(&s(&o["kind"])))
    {
        let on = s(&o["metadata"]["namespace"]);
        let why = "`kubectl apply -k` and `helm template | kubectl apply` put it in the \
            current namespace";
        flag!(
            p,
            on.is_empty(),
            "{}: no metadata.namespace (must be {ns}): {why}",
            r.at(o)
        );
        flag!(
            p,
            !on.is_empty() && on != ns,
            "{}: metadata.namespace {on}, not {ns}",
            r.at(o)
        );
    }
    for b in r
        .of_kind("ClusterRoleBinding")
        .chain(r.of_kind("RoleBinding"))
    {
        for sub in seq(&b["subjects"])
            .iter()
            .filter(|sub| sub["kind"] == "ServiceAccount")
        {
            let (name, sub_ns) = (s(&sub["name"]), s(&sub["namespace"]));
            let sa = r.find("ServiceAccount", name);
            let at = r.at(b);
            flag!(
                p,
                sub_ns != ns || sa.is_none(),
                "{at}: subject ServiceAccount {sub_ns}/{name} \
                is not the ServiceAccount {ns}/{name} rendered here"
            );
        }
    }
    p
}
