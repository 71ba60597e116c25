"""A client of the matrix (tests/real_clients.rs): the Python `kubernetes`
client lists a namespace's ConfigMaps, then follows them with
`watch.Watch().stream` from the list's resourceVersion, as its docs show.

Prints one JSON line per step on stdout: {"ready": rv} after the list, then
{"type", "name", "rv"} per event, and, after `count` events,
{"final": {name: rv}}: the list's state with the events applied.

Usage: watch_configmaps.py KUBECONFIG NAMESPACE COUNT
"""

import json
import sys

from kubernetes import client, config, watch


def main():
    kubeconfig, namespace, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    listed = api.list_namespaced_config_map(namespace)
    state = {o.metadata.name: o.metadata.resource_version for o in listed.items}
    rv = listed.metadata.resource_version
    print(json.dumps({"ready": rv}), flush=True)
    seen = 0
    for event in watch.Watch().stream(
        api.list_namespaced_config_map,
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
