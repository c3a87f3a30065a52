"""Drives Helm v4 (helm-python-sdk's libhelm, no binary, no cluster) for tests/tests/helm.rs.

Reads one JSON request on stdin:
  {"chart": DIR, "release": NAME, "namespace": NS, "kube_version": "v1.30.0",
   "variants": [{"name": ..., "values": {...}}], "refused": [{"name": ..., "values": {...}}]}
and writes one JSON answer on stdout:
  {"variants": {NAME: {"manifests": {TEMPLATE: YAML}, "render_error": null,
                       "lint": {"messages": [...], "errors": [...]}}},
   "refused": {NAME: {"schema_error": TEXT or null, "render_error": TEXT or null}}}
Each variant is rendered as `helm install` would (values merged over the chart's, checked
against values.schema.json) and linted with --strict; each refused set of values is checked
against the schema and rendered, and both must fail.
"""

import json
import sys

from helm_python import chart as H


def render(chart, request, values):
    try:
        manifests = chart.render(
            values,
            name=request["release"],
            namespace=request["namespace"],
            is_install=True,
        )
        return manifests, None
    except Exception as e:  # noqa: BLE001 - any failure is the answer
        return None, f"{type(e).__name__}: {e}"


def main():
    request = json.load(sys.stdin)
    chart = H.Chart.load(request["chart"])
    answer = {"variants": {}, "refused": {}}
    for v in request["variants"]:
        manifests, error = render(chart, request, v["values"])
        lint = H.lint(
            request["chart"],
            v["values"],
            strict=True,
            namespace=request["namespace"],
            kube_version=request["kube_version"],
        )
        answer["variants"][v["name"]] = {
            "manifests": manifests,
            "render_error": error,
            "lint": lint,
        }
    for v in request["refused"]:
        try:
            chart.validate_schema(v["values"])
            schema_error = None
        except Exception as e:  # noqa: BLE001
            schema_error = f"{type(e).__name__}: {e}"
        _, render_error = render(chart, request, v["values"])
        answer["refused"][v["name"]] = {
            "schema_error": schema_error,
            "render_error": render_error,
        }
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
