#!/usr/bin/env python3
"""Generates server/api/src/schema/go_json.json: Go's JSON omission facts per served field.

Kubernetes prints its objects with Go's encoding/json, whose output depends on two facts
that neither k8s-pb nor k8s-openapi carries: whether a struct field is a pointer, and
whether its tag says `omitempty`. Go's generated protobuf code writes every non-pointer
scalar even when it is zero, so a decoder that wants Kubernetes' JSON back must know, per
field, whether Go would drop a zero (`hostIPC: false`), keep it (`replicas: 0` through a
pointer, `containerPort: 0` without omitempty), or print a nil slice as `null`.

Inputs: the Go struct definitions under gen/go/ (excerpts of k8s.io/api and
k8s.io/apimachinery, see gen/go/README.md) and the table src/schema/types.json. A struct
joins a definition by package and name (`gen/go/api/core/v1` + `PodSpec` ->
`io.k8s.api.core.v1.PodSpec`), a field by its JSON name. Nothing is guessed: a served
definition or field the Go excerpts do not have is printed and left out, and the decoder
keeps such fields as they were decoded.

Output: {"types": {definition: {json name: flags}}}, flags a string of
  p  the Go field is a pointer (nil and zero differ, so a zero is always printed)
  o  the tag has omitempty
so "" is a non-pointer without omitempty (always printed, zero included).

`omitzero` (Go 1.24) appears in newer Kubernetes sources (ObjectMeta.creationTimestamp
since 1.34); Kubernetes 1.32 is built with Go 1.23, which ignores it, so it is reported
and not applied.

Usage (python3, stdlib only): python3 server/api/gen/go_json.py
"""

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
API_CRATE = os.path.dirname(HERE)
GO_ROOT = os.path.join(HERE, "go")
TYPES = os.path.join(API_CRATE, "src", "schema", "types.json")
OUTPUT = os.path.join(API_CRATE, "src", "schema", "go_json.json")

# gen/go/<dir> -> OpenAPI definition prefix.
PACKAGES = {
    "api/apps/v1": "io.k8s.api.apps.v1",
    "api/authentication/v1": "io.k8s.api.authentication.v1",
    "api/authorization/v1": "io.k8s.api.authorization.v1",
    "api/autoscaling/v1": "io.k8s.api.autoscaling.v1",
    "api/coordination/v1": "io.k8s.api.coordination.v1",
    "api/core/v1": "io.k8s.api.core.v1",
    "api/discovery/v1": "io.k8s.api.discovery.v1",
    "api/policy/v1": "io.k8s.api.policy.v1",
    "api/rbac/v1": "io.k8s.api.rbac.v1",
    "api/scheduling/v1": "io.k8s.api.scheduling.v1",
    "apimachinery/meta/v1": "io.k8s.apimachinery.pkg.apis.meta.v1",
}

STRUCT_RE = re.compile(r"^type (\w+) struct \{$")
# `Name Type `tags`` or an embedded `pkg.Type `tags``.
FIELD_RE = re.compile(r"^(?:(\w+)\s+)?(\S+)\s+`([^`]*)`$")
JSON_TAG_RE = re.compile(r'json:"([^"]*)"')
BUILTIN_SCALARS = {"bool": "bool", "string": "string", "int32": "int32", "int64": "int64", "float64": "double"}


class GoField:
    def __init__(self, name, go_type, json_name, options, embedded):
        self.name = name
        self.go_type = go_type
        self.json_name = json_name
        self.options = options
        self.embedded = embedded

    @property
    def pointer(self):
        return self.go_type.startswith("*")

    @property
    def inline(self):
        return self.embedded and (self.json_name == "" or "inline" in self.options)


def parse_go(path):
    """{struct name: [GoField]} of one excerpt file."""
    structs = {}
    current = None
    for number, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = raw.strip()
        if not line or line.startswith("//") or line.startswith("package "):
            continue
        m = STRUCT_RE.match(line)
        if m:
            current = structs.setdefault(m.group(1), [])
            continue
        if line == "}":
            current = None
            continue
        if current is None:
            sys.exit(f"{path}:{number}: unexpected line outside a struct: {line}")
        fm = FIELD_RE.match(line)
        jm = fm and JSON_TAG_RE.search(fm.group(3))
        if not jm:
            sys.exit(f"{path}:{number}: cannot parse field: {line}")
        name, go_type = fm.group(1), fm.group(2)
        json_name, *options = jm.group(1).split(",")
        current.append(GoField(name or go_type.split(".")[-1], go_type, json_name, options, name is None))
    return structs


def load_go():
    """{definition: [GoField]} for every struct in the excerpts."""
    result = {}
    for package, prefix in PACKAGES.items():
        directory = os.path.join(GO_ROOT, package)
        for file in sorted(os.listdir(directory)):
            if file.endswith(".go"):
                for name, fields in parse_go(os.path.join(directory, file)).items():
                    result[f"{prefix}.{name}"] = fields
    return result


def check_kind(definition, go, field, problems):
    """Cross-check the Go type against the protobuf kind: catches a wrong excerpt line."""
    base = go.go_type.lstrip("*")
    repeated = field.get("repeated", False)
    kind = field["kind"]
    if base == "[]byte":
        ok = kind == "bytes" and not repeated
    elif base.startswith("[]"):
        ok = repeated or kind == "message"  # a +protobuf.nullable list wrapper is a message
    elif base.startswith("map["):
        ok = kind == "map"
    elif base in BUILTIN_SCALARS:
        ok = kind == BUILTIN_SCALARS[base] and not repeated
    else:
        ok = not repeated  # a named type: struct or string/int alias
    if not ok:
        problems.append(f"{definition}.{field['json']}: Go {go.go_type} vs protobuf {kind}{' repeated' if repeated else ''}")


def main():
    table = json.load(open(TYPES, encoding="utf-8"))["types"]
    go_structs = load_go()
    out = {}
    missing_types, missing_fields, problems, omitzero = [], [], [], []
    for definition in sorted(table):
        ty = table[definition]
        if ty.get("special"):
            continue  # their JSON form is their own MarshalJSON, not their fields
        go_fields = go_structs.get(definition)
        if go_fields is None:
            missing_types.append(definition)
            continue
        by_json = {f.json_name: f for f in go_fields if not f.inline and f.json_name not in ("", "-")}
        inline_types = {f.go_type.lstrip("*").split(".")[-1]: f for f in go_fields if f.inline}
        flags = {}
        for field in ty["fields"]:
            if field.get("inline"):
                member = inline_types.get(field["type"].rsplit(".", 1)[-1])
                if member is None:
                    missing_fields.append(f"{definition}: inline {field['type']}")
                elif member.pointer:
                    problems.append(f"{definition}: inline {field['type']} is a pointer")
                continue
            go = by_json.get(field["json"])
            if go is None:
                missing_fields.append(f"{definition}.{field['json']}")
                continue
            check_kind(definition, go, field, problems)
            if "omitzero" in go.options:
                omitzero.append(f"{definition}.{field['json']}")
            flags[field["json"]] = ("p" if go.pointer else "") + ("o" if "omitempty" in go.options else "")
            # (`required` in types.json is k8s-openapi's "not an Option", which also covers
            # defaulted fields such as LocalObjectReference.name and every kind's metadata,
            # so it cannot be cross-checked against omitempty.)
        out[definition] = flags

    with open(OUTPUT, "w", encoding="utf-8") as f:
        f.write("{\n")
        f.write('"generator": "server/api/gen/go_json.py from gen/go/ (Go struct tags) and schema/types.json",\n')
        f.write('"flags": "p = the Go field is a pointer, o = its json tag has omitempty",\n')
        f.write('"types": {\n')
        names = sorted(out)
        for i, name in enumerate(names):
            sep = "," if i + 1 < len(names) else ""
            f.write(json.dumps(name) + ": " + json.dumps(out[name], separators=(",", ":"), sort_keys=True) + sep + "\n")
        f.write("}\n}\n")

    print(f"{len(out)} types, {sum(len(v) for v in out.values())} fields -> {OUTPUT}")
    for m in missing_types:
        print("no Go struct:", m)
    for m in missing_fields:
        print("no Go field:", m)
    for m in omitzero:
        print("omitzero ignored (Go 1.24; Kubernetes 1.32 builds with Go 1.23):", m)
    for p in problems:
        print("MISMATCH:", p)
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
