"""A client of the matrix (tests/real/clients.rs): the Python `kubernetes`
client lists a namespace's ConfigMaps (or Pods), then follows them with
`watch.Watch().stream` from the list's resourceVersion, as its docs show.

Prints one JSON line per step on stdout: {"ready": rv} after the list, then
{"type", "name", "rv"} per event, and, after `count` events,
{"final": {name: rv}}: the list's state with the events applied.

Usage: list_watch.py KUBECONFIG NAMESPACE COUNT [RESOURCE]

RESOURCE: configmaps (default), pods or services.

KUBECONFIG `in-cluster`: the in-cluster configuration, loaded as client-go's
rest.InClusterConfig does (KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT,
/var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt}), by the
client's own `config.load_incluster_config()`.
"""

import json
import sys

from kubernetes import client, config, watch


def main():
    kubeconfig, namespace, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    resource = sys.argv[4] if len(sys.argv) > 4 else "configmaps"
    if kubeconfig == "in-cluster":
        config.load_incluster_config()
        api = client.CoreV1Api()
    else:
        api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    list_fn = {
        "configmaps": api.list_namespaced_config_map,
        "pods": api.list_namespaced_pod,
        "services": api.list_namespaced_service,
    }[resource]
    listed = list_fn(namespace)
    state = {o.metadata.name: o.metadata.resource_version for o in listed.items}
    rv = listed.metadata.resource_version
    print(json.dumps({"ready": rv}), flush=True)
    seen = 0
    for event in watch.Watch().stream(
        list_fn,
        namespace,
        resource_version=rv,
        timeout_seconds=60,
    ):
        o = event["object"]
        name, version = o.metadata.name, o.metadata.resource_version
        print(json.dumps({"type": event["type"], "name": name, "rv": version}), flush=True)
        if event["type"] == "DELETED":
            state.pop(name, None)
        else:
            state[name] = version
        seen += 1
        if seen >= count:
            break
    print(json.dumps({"final": state}), flush=True)


if __name__ == "__main__":
    main()
