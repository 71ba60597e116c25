#!/usr/bin/env python3
"""Writes crates/apimachinery/src/protobuf/schema.rs: how kube-apiserver
encodes each built-in type in protobuf, for the JSON-to-protobuf transcoder.

Usage: protobuf_schema.py STAGING_SRC_K8S_IO > ../src/protobuf/schema.rs

STAGING_SRC_K8S_IO is `staging/src/k8s.io` of a Kubernetes tree (v1.36.2
for the committed file). For every message of the `generated.proto` files
under api/, apimachinery/ (meta, runtime, resource, intstr),
apiextensions-apiserver/ and kube-aggregator/ it records the fields (number,
JSON name, type) and, from the Go struct the message was generated from,
when the Go marshaller writes each field:

- a non-pointer Go field (string, integer, bool, struct) is written always,
  even when empty (`generated.pb.go`'s `MarshalToSizedBuffer`);
- a pointer, a `[]byte`, or a named slice type (`ExtraValue`) is written
  only when set;
- repeated fields and maps are written element by element, map entries in
  sorted key order;
- a field embedded in JSON (`json:",inline"`) is a sub-message read from
  the same JSON object.

The `.proto` files alone cannot say which fields are pointers; the Go
structs can. For the way back (protobuf to JSON, as `encoding/json` writes
the Go struct the apiserver decoded), each plain message also lists its JSON
keys in the Go struct's declaration order, each with when `encoding/json`
leaves it out (`omitempty`: an empty string, slice or map, a zero number,
false, a nil pointer, never a struct; `omitzero` on a `metav1.Time`: the
zero time), and where an embedded `TypeMeta` (`kind`, `apiVersion`) goes.
"""

import os
import re
import sys

SCALARS = {"string": "Str", "bytes": "Bytes", "bool": "Bool", "int32": "I32", "int64": "I64", "double": "F64"}
# Types whose JSON form is not a JSON object of their fields.
SPECIAL = {
    "k8s.io.apimachinery.pkg.apis.meta.v1.Time": "Time",
    "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime": "MicroTime",
    "k8s.io.apimachinery.pkg.api.resource.Quantity": "Quantity",
    "k8s.io.apimachinery.pkg.util.intstr.IntOrString": "IntOrString",
    "k8s.io.apimachinery.pkg.runtime.RawExtension": "RawExtension",
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1": "FieldsV1",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Duration": "Duration",
}
# Types with a JSON form of their own (custom MarshalJSON) the transcoder
# does not model: objects holding them are not served in protobuf.
UNSUPPORTED = ("JSON", "JSONSchemaPropsOrArray", "JSONSchemaPropsOrBool", "JSONSchemaPropsOrStringArray")
SKIP_DIRS = ("testapigroup", "example", "apiserver/pkg/apis/audit", "/testing", "/test/")


def proto_files(root):
    for base in ("api", "apimachinery/pkg", "apiextensions-apiserver/pkg/apis", "kube-aggregator/pkg/apis"):
        for d, _, files in os.walk(os.path.join(root, base)):
            if "generated.proto" in files and not any(s in d for s in SKIP_DIRS):
                yield os.path.join(d, "generated.proto")


FIELD = re.compile(r"^\s*(optional|repeated|required)\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*[;\[]")
MAP = re.compile(r"^\s*map<\s*(\w+)\s*,\s*([\w.]+)\s*>\s+(\w+)\s*=\s*(\d+)\s*;")


def parse_proto(path):
    package = None
    go_package = None
    messages = {}
    current = None
    depth = 0
    for line in open(path, encoding="utf-8"):
        code = line.split("//", 1)[0]
        if m := re.match(r"^package\s+([\w.]+);", code):
            package = m.group(1)
        if m := re.match(r'^option go_package = "([^"]+)";', code):
            go_package = m.group(1)
        if m := re.match(r"^message\s+(\w+)\s*{", code):
            current = m.group(1)
            messages[current] = []
            depth = 1
            continue
        if current is None:
            continue
        if m := FIELD.match(code):
            if depth == 1:
                messages[current].append(
                    {"label": m.group(1), "type": m.group(2), "name": m.group(3), "number": int(m.group(4))}
                )
        elif m := MAP.match(code):
            if depth == 1:
                messages[current].append(
                    {"label": "map", "key": m.group(1), "type": m.group(2), "name": m.group(3), "number": int(m.group(4))}
                )
        depth += code.count("{") - code.count("}")
        if depth == 0:
            current = None
    return package, go_package, messages


STRUCT = re.compile(r"^type\s+(\w+)\s+struct\s*{")
SLICE = re.compile(r"^type\s+(\w+)\s+\[\](\w+)\s*$")
GOFIELD = re.compile(r"^\s*(\w+)\s+([^\s`]+)\s+`([^`]*)`")
EMBEDDED = re.compile(r"^\s*([*\w.]+)\s+`([^`]*)`")


def tag(tags, key):
    m = re.search(key + r':"([^"]*)"', tags)
    return m.group(1) if m else None


def parse_go(directory):
    structs = {}
    slices = set()
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".go") or name.endswith("_test.go") or name.startswith("zz_generated") or name == "generated.pb.go":
            continue
        current = None
        for line in open(os.path.join(directory, name), encoding="utf-8"):
            code = line.split("//", 1)[0].rstrip()
            if current is None:
                if m := STRUCT.match(code):
                    structs[m.group(1)] = []
                    depth = code.count("{") - code.count("}")
                    current = m.group(1) if depth > 0 else None
                elif m := SLICE.match(code):
                    slices.add(m.group(1))
                continue
            depth += code.count("{") - code.count("}")
            if depth <= 0:
                current = None
                continue
            if depth > 1 or "{" in code:
                continue
            if m := GOFIELD.match(code):
                go_name, go_type, tags = m.groups()
            elif m := EMBEDDED.match(code):
                go_type, tags = m.groups()
                go_name = go_type.lstrip("*").split(".")[-1]
            else:
                continue
            structs[current].append({"go": go_name, "type": go_type, "json": tag(tags, "json"), "protobuf": tag(tags, "protobuf")})
    return structs, slices


def main(root):
    packages = {}  # package -> (go dir, messages)
    for path in proto_files(root):
        package, go_package, messages = parse_proto(path)
        packages[package] = (os.path.dirname(path), messages)
    full = {}
    for package, (_, messages) in packages.items():
        for name in messages:
            full[f"{package}.{name}"] = (package, name)
    names = sorted(full)
    index = {n: i for i, n in enumerate(names)}

    def resolve(package, t):
        if t in SCALARS:
            return None
        if t.startswith("."):
            return t[1:]
        return f"{package}.{t}"

    go_cache = {}
    out_messages = []
    problems = []
    for name in names:
        package, short = full[name]
        directory, messages = packages[package]
        if directory not in go_cache:
            go_cache[directory] = parse_go(directory)
        structs, slices = go_cache[directory]
        special = SPECIAL.get(name) or ("Unsupported" if "apiextensions" in package and short in UNSUPPORTED else None)
        wrapped = short in slices
        go_fields = structs.get(short, [])
        by_number = {}
        ignored = []
        for f in go_fields:
            pb = f["protobuf"]
            if pb and pb != "-":
                number = int(pb.split(",")[1])
                by_number[number] = f
                continue
            json_name = (f["json"] or "").split(",")[0]
            if f["go"] == "TypeMeta":
                ignored += ["kind", "apiVersion"]
            elif json_name and json_name != "-":
                ignored.append(json_name)
            elif f["json"] and ",inline" in f["json"]:
                problems.append(f"{name}: inline {f['go']} without a protobuf tag")
        fields = []
        # (number, card, target, presence) of each field written, by index.
        field_specs = []
        for pf in sorted(messages[short], key=lambda f: f["number"]):
            target = resolve(package, pf["type"])
            if target is not None and target not in index:
                problems.append(f"{name}.{pf['name']}: unknown type {target}")
                continue
            kind = f"K::M({index[target]})" if target is not None else f"K::{SCALARS[pf['type']]}"
            gf = by_number.get(pf["number"])
            json_name = pf["name"]
            presence = "P::Always"
            if pf["label"] == "repeated":
                card = "C::Repeated"
            elif pf["label"] == "map":
                if pf["key"] != "string":
                    problems.append(f"{name}.{pf['name']}: map key {pf['key']}")
                card = "C::Map"
            else:
                card = "C::One"
            if gf is None:
                if not special and not wrapped:
                    problems.append(f"{name}.{pf['name']}: no Go field")
            else:
                json_tag = gf["json"] or ""
                json_name = json_tag.split(",")[0]
                if json_tag.startswith(",") and ",inline" in json_tag:
                    presence = "P::Inline"
                    json_name = ""
                if card == "C::One" and presence != "P::Inline":
                    pointer = gf["type"].startswith("*")
                    if pointer or pf["type"] == "bytes" or is_wrapped(packages, full, go_cache, target):
                        presence = "P::IfSet"
            fields.append(f'f("{json_name}", {pf["number"]}, {kind}, {card}, {presence})')
            field_specs.append((pf["number"], card, target, presence))
        kind = f"S::{special}" if special else ("S::Wrapped" if wrapped else "S::Plain")
        ign = ", ".join(f'"{i}"' for i in ignored)
        json_keys = []
        if kind == "S::Plain":
            json_keys = json_order(name, go_fields, field_specs, index, problems)
        out_messages.append(
            f'    m("{name}", {kind}, &[{", ".join(fields)}], &[{ign}], &[{", ".join(json_keys)}]),'
        )
    groups = []
    for package, (directory, _) in sorted(packages.items()):
        group = group_name(directory)
        if group is None:
            continue
        version = package.rsplit(".", 1)[1]
        groups.append(f'    ("{group}", "{version}", "{package}"),')
    for p in problems:
        print(f"warning: {p}", file=sys.stderr)
    print(HEADER)
    print(f"pub static MESSAGES: [Message; {len(out_messages)}] = [")
    print("\n".join(out_messages))
    print("];")
    print()
    print("/// Group, version and the protobuf package of its types.")
    print(f"pub static GROUP_VERSIONS: [(&str, &str, &str); {len(groups)}] = [")
    print("\n".join(sorted(groups)))
    print("];")


def json_order(name, go_fields, field_specs, index, problems):
    """The message's JSON keys as `encoding/json` writes its Go struct: in
    declaration order, `j(field index, omit)`, `TM` for an embedded
    `TypeMeta`."""
    at = {number: i for i, (number, *_rest) in enumerate(field_specs)}
    keys = []
    for f in go_fields:
        json_tag = f["json"] or ""
        options = json_tag.split(",")[1:]
        json_name = json_tag.split(",")[0]
        pb = f["protobuf"]
        if f["go"] == "TypeMeta" and not pb:
            keys.append("TM")
            continue
        if json_name == "-" and not options:
            continue
        if not pb or pb == "-":
            problems.append(f"{name}: JSON key {json_name or f['go']} has no protobuf field")
            continue
        number = int(pb.split(",")[1])
        if number not in at:
            problems.append(f"{name}: field {number} not written")
            continue
        i = at[number]
        _, card, target, presence = field_specs[i]
        if "string" in options:
            problems.append(f"{name}.{json_name}: ,string")
        if "omitzero" in options:
            if target in ("k8s.io.apimachinery.pkg.apis.meta.v1.Time", "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime") and card == "C::One":
                omit = "O::Zero"
            else:
                problems.append(f"{name}.{json_name}: omitzero on {target}")
                omit = "O::Never"
        elif "omitempty" in options:
            struct_value = card == "C::One" and target is not None and presence != "P::IfSet"
            omit = "O::Never" if struct_value or presence == "P::Inline" else "O::Empty"
        else:
            omit = "O::Never"
        keys.append(f"j({i}, {omit})")
    covered = sorted(int(k[2:].split(",")[0]) for k in keys if k != "TM")
    if covered != list(range(len(field_specs))):
        # Left empty: the message is not written as JSON (the way back
        # refuses it).
        problems.append(f"{name}: JSON keys do not cover its fields; not written as JSON")
        return []
    return keys


def is_wrapped(packages, full, go_cache, target):
    if target is None:
        return False
    package, short = full[target]
    directory = packages[package][0]
    if directory not in go_cache:
        go_cache[directory] = parse_go(directory)
    return short in go_cache[directory][1]


def group_name(directory):
    if "/apimachinery/" in directory:
        return None
    for name in ("register.go", "doc.go"):
        p = os.path.join(directory, name)
        if os.path.exists(p):
            text = open(p, encoding="utf-8").read()
            if m := re.search(r'const GroupName = "([^"]*)"', text):
                return m.group(1)
            if m := re.search(r"\+groupName=([\w.]+)", text):
                return m.group(1)
    if directory.endswith("/core/v1"):
        return ""
    return None


HEADER = """// @generated by crates/apimachinery/generate/protobuf_schema.py from the
// Kubernetes v1.36.2 sources (staging/src/k8s.io: the generated.proto files
// and the Go types they were generated from). Do not edit.

use super::schema_types::{
    Cardinality as C, FieldKind as K, Message, Omit as O, Presence as P, Special as S, TM, f, j, m,
};
"""

if __name__ == "__main__":
    main(sys.argv[1])
