#!/usr/bin/env python3
"""Generates server/api/src/schema/types.json, skerry's per-type field table.

serde gives skerry the JSON shape of every Kubernetes type, but two things need facts that
serde does not carry: the protobuf wire format (field tags and kinds) and strategic merge
patch (patchStrategy, patchMergeKey, listType, listMapKey). This script joins two crates'
generated sources, message by message:

- k8s-pb 0.9.0: prost messages. `#[prost(...)]` gives each field's kind and tag; the doc
  comments still carry the Go markers `+patchMergeKey=`, `+patchStrategy=`, `+listType=`,
  `+listMapKey=` and `+protobuf.nullable=true` (a message that wraps a list on the wire but
  is a plain JSON array).
- k8s-openapi 0.28.0, `src/v1_32`: the Deserialize impls give the exact JSON field names
  (`"hostIPC" => Field::Key_host_ipc`), `schema_name()` gives the OpenAPI definition name,
  and the Rust field types say which fields are required (not `Option`).

Messages join on module path plus type name compared case-insensitively (prost writes
`PodDnsConfig` for Go's `PodDNSConfig`); fields join when their Rust names match after
lower-casing and removing underscores. Nothing is guessed: a field that does not join is
printed and left out of the table, and the script exits non-zero if a reachable type fails
to join at all.

Usage (python3, stdlib only; rerun by hand when upgrading either crate):

    python3 server/api/gen/schema.py [--registry ~/.cargo/registry/src/<index>]

If k8s-pb is missing, `cargo fetch` in a scratch crate that depends on `k8s-pb = "0.9"`.
"""

import argparse
import glob
import json
import os
import re
import sys

PB_CRATE = "k8s-pb-0.9.0"
OPENAPI_CRATE = "k8s-openapi-0.28.0"
OPENAPI_VERSION_DIR = "src/v1_32"

HERE = os.path.dirname(os.path.abspath(__file__))
API_CRATE = os.path.dirname(HERE)
CATALOGUE = os.path.join(API_CRATE, "src", "catalogue.rs")
OUTPUT = os.path.join(API_CRATE, "src", "schema", "types.json")

# Types reachable from the catalogue's kinds are always included; these are the request and
# response types the apiserver speaks besides them.
META_ROOTS = [
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Status",
    "io.k8s.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    "io.k8s.apimachinery.pkg.apis.meta.v1.WatchEvent",
    "io.k8s.apimachinery.pkg.apis.meta.v1.PartialObjectMetadata",
    "io.k8s.apimachinery.pkg.apis.meta.v1.PartialObjectMetadataList",
    "io.k8s.api.authentication.v1.TokenRequest",
    "io.k8s.api.autoscaling.v1.Scale",
    "io.k8s.api.core.v1.Binding",
    "io.k8s.api.authorization.v1.SelfSubjectAccessReview",
]

# Types Kubernetes encodes specially: the JSON form is not an object of the proto fields.
# The codec (protobuf.rs) knows each by this name; the proto fields are still listed.
SPECIAL = {
    "io.k8s.apimachinery.pkg.apis.meta.v1.Time": "time",
    "io.k8s.apimachinery.pkg.apis.meta.v1.MicroTime": "micro_time",
    "io.k8s.apimachinery.pkg.apis.meta.v1.Duration": "duration",
    "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": "fields_v1",
    "io.k8s.apimachinery.pkg.api.resource.Quantity": "quantity",
    "io.k8s.apimachinery.pkg.util.intstr.IntOrString": "int_or_string",
    "io.k8s.apimachinery.pkg.runtime.RawExtension": "raw_extension",
}

# The JSON names of the two metadata-only kinds, which k8s-openapi does not define. Source:
# k8s.io/apimachinery/pkg/apis/meta/v1/types.go (json tags `metadata`, `items`), the same
# names as every `*List` (k8s-openapi src/v1_32/list.rs).
METADATA_ONLY_JSON = {
    "PartialObjectMetadata": {"metadata": "metadata"},
    "PartialObjectMetadataList": {"metadata": "metadata", "items": "items"},
}

PB_SCALARS = {"string", "bool", "int32", "int64", "double", "bytes"}


def norm(name):
    """Rust field name -> join key (`host_ipc`, `r#type`, `type_` -> `hostipc`, `type`)."""
    return name.replace("r#", "").replace("_", "").lower()


def def_prefix(module):
    """k8s-pb / k8s-openapi module path -> OpenAPI definition prefix."""
    head = module[0].replace("_", "-")
    return "io.k8s." + ".".join([head] + module[1:])


# ---------------------------------------------------------------- k8s-pb


class PbField:
    def __init__(self, name, attr, rust_type, docs):
        self.name = name
        self.attr = attr
        self.rust_type = rust_type
        self.docs = docs


def parse_pb_file(path, module):
    """Every message of one k8s-pb module: {name: (docs, [PbField])}."""
    messages = {}
    lines = open(path, encoding="utf-8").read().split("\n")
    i = 0
    docs = []
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("///"):
            docs.append(line[3:].strip())
            i += 1
            continue
        m = re.match(r"pub struct (\w+) \{(\})?$", line)
        if m:
            name = m.group(1)
            struct_docs = docs
            docs = []
            fields = []
            if m.group(2):
                messages[name] = (struct_docs, fields)
                i += 1
                continue
            i += 1
            field_docs = []
            attr = None
            while i < len(lines) and lines[i].strip() != "}":
                fl = lines[i].strip()
                if fl.startswith("///"):
                    field_docs.append(fl[3:].strip())
                    i += 1
                elif fl.startswith("#[prost("):
                    attr = fl[len("#[prost(") : -2]
                    i += 1
                elif fl.startswith("pub "):
                    # The type may span lines; it ends at a ',' with balanced brackets.
                    text = fl
                    while text.count("<") != text.count(">") or not text.endswith(","):
                        i += 1
                        text += " " + lines[i].strip()
                    fm = re.match(r"pub ([\w#]+):\s*(.*),$", text)
                    if not fm or attr is None:
                        sys.exit(f"{path}: cannot parse field `{text}`")
                    fields.append(PbField(fm.group(1), attr, fm.group(2), field_docs))
                    field_docs = []
                    attr = None
                    i += 1
                else:
                    i += 1
            messages[name] = (struct_docs, fields)
            i += 1
            continue
        if not line.startswith("#["):
            docs = []
        i += 1
    return messages


def load_pb(root):
    """{(module tuple, lower-case name): (module, name, docs, fields)}."""
    result = {}
    for path in glob.glob(os.path.join(root, "src", "**", "mod.rs"), recursive=True):
        rel = os.path.relpath(os.path.dirname(path), os.path.join(root, "src"))
        if rel == ".":
            continue
        module = tuple(rel.split(os.sep))
        for name, (docs, fields) in parse_pb_file(path, module).items():
            result[(module, name.lower())] = (module, name, docs, fields)
    return result


def resolve_pb_path(module, path):
    """A prost type path relative to `module` -> (module, name)."""
    parts = [p for p in path.split("::") if p]
    current = list(module)
    while parts and parts[0] == "super":
        current.pop()
        parts.pop(0)
    return tuple(current + parts[:-1]), parts[-1]


def pb_message_type(module, rust_type):
    """The message named in a prost field type (Option/Vec/Box/BTreeMap wrappers removed)."""
    t = rust_type.replace(" ", "")
    for wrapper in ("::core::option::Option<", "::prost::alloc::vec::Vec<", "::prost::alloc::boxed::Box<"):
        while t.startswith(wrapper):
            t = t[len(wrapper) : -1]
    if t.startswith("::prost::alloc::collections::BTreeMap<"):
        t = t[len("::prost::alloc::collections::BTreeMap<") : -1]
        t = t.split(",", 1)[1]
    return resolve_pb_path(module, t.rstrip(","))


def pb_markers(docs):
    markers = {}
    for d in docs:
        for key in ("patchMergeKey", "patchStrategy", "listType", "listMapKey"):
            m = re.match(r"\+" + key + r"=(\S+)", d)
            if m:
                markers.setdefault(key, []).append(m.group(1))
    return markers


# ---------------------------------------------------------------- k8s-openapi


class OpenApiType:
    def __init__(self, module, name, definition, fields, json_names, shape):
        self.module = module
        self.name = name
        self.definition = definition
        self.fields = fields  # [(rust name, rust type)]
        self.json_names = json_names  # {rust name: json name}
        self.shape = shape  # "struct" | "newtype" | "enum"


def parse_openapi_file(path, module):
    text = open(path, encoding="utf-8").read()
    dm = re.search(r'"(io\.k8s\.[^"]+)"\.into\(\)', text)
    if not dm:
        return None
    definition = dm.group(1)
    sm = re.search(r"^pub struct (\w+)(<[^>]*>)? \{\n(.*?)^\}", text, re.S | re.M)
    if sm:
        fields = re.findall(r"^    pub ([\w#]+): (.*),$", sm.group(3), re.M)
        name, shape = sm.group(1), "struct"
    else:
        em = re.search(r"^pub (struct|enum) (\w+)", text, re.M)
        if not em:
            return None
        name, shape, fields = em.group(2), ("newtype" if em.group(1) == "struct" else "enum"), []
    json_names = {}
    for json_name, key in re.findall(r'"([^"]+)" => Field::Key_(\w+),', text):
        json_names[key] = json_name
    return OpenApiType(module, name, definition, fields, json_names, shape)


def load_openapi(root):
    """{definition: OpenApiType} and {(module, struct name): definition}."""
    by_definition = {}
    by_path = {}
    base = os.path.join(root, OPENAPI_VERSION_DIR)
    for path in glob.glob(os.path.join(base, "**", "*.rs"), recursive=True):
        if os.path.basename(path) in ("mod.rs", "list.rs"):
            continue
        module = tuple(os.path.relpath(os.path.dirname(path), base).split(os.sep))
        t = parse_openapi_file(path, module)
        if t is None:
            continue
        by_definition[t.definition] = t
        by_path[(module, t.name)] = t.definition
    list_text = open(os.path.join(base, "list.rs"), encoding="utf-8").read()
    list_json = dict(re.findall(r'"(\w+)" => Field::Key_(\w+),', list_text))
    return by_definition, by_path, {v: k for k, v in list_json.items()}


def openapi_shape(rust_type):
    """(required, container, element) of a k8s-openapi field type."""
    t = rust_type.replace(" ", "")
    required = True
    if t.startswith("Option<"):
        required, t = False, t[len("Option<") : -1]
    if t.startswith("std::boxed::Box<"):
        t = t[len("std::boxed::Box<") : -1]
    if t.startswith("std::vec::Vec<"):
        return required, "vec", t[len("std::vec::Vec<") : -1]
    if t.startswith("std::collections::BTreeMap<std::string::String,"):
        return required, "map", t[len("std::collections::BTreeMap<std::string::String,") : -1]
    return required, "single", t


def openapi_element_definition(element, by_path):
    m = re.match(r"crate::([\w:]+)::(\w+)$", element)
    if not m:
        return None
    return by_path.get((tuple(m.group(1).split("::")), m.group(2)))


# ---------------------------------------------------------------- the join


class Join:
    def __init__(self, pb, openapi, openapi_paths, list_json):
        self.pb = pb
        self.openapi = openapi
        self.openapi_paths = openapi_paths
        self.list_json = list_json
        self.pb_to_definition = {}
        self.types = {}
        self.failures = []
        self.pending = []
        self.modules = {def_prefix(list(module)): module for (module, _) in pb}

    def definition_module_name(self, definition):
        """A definition name -> its k8s-pb message (module prefix plus case-folded name)."""
        prefix, _, name = definition.rpartition(".")
        module = self.modules.get(prefix)
        if module is None:
            return None
        return self.pb.get((module, name.lower()))

    def pb_definition(self, module, name):
        """A pb message -> definition name: the joined one, else the module's prefix."""
        entry = self.pb.get((module, name.lower()))
        if entry is None:
            return None
        known = self.pb_to_definition.get((module, name.lower()))
        if known:
            return known
        for definition, t in self.openapi.items():
            if t.module == module and t.name.lower() == name.lower():
                return definition
        return def_prefix(list(module)) + "." + name

    def require(self, definition):
        if definition not in self.types and definition not in self.pending:
            self.pending.append(definition)

    def run(self, roots):
        for r in roots:
            self.require(r)
        while self.pending:
            definition = self.pending.pop(0)
            if definition in self.types:
                continue
            self.types[definition] = None
            built = self.build(definition)
            if built is None:
                del self.types[definition]
                self.failures.append(f"{definition}: no message joined")
            else:
                self.types[definition] = built

    def build(self, definition, inherited=None):
        """One type's record. `inherited` carries the JSON names of an embedding struct when
        this message is a Go struct inlined into it (`json:",inline"`), which k8s-openapi
        flattens and protobuf keeps as a nested message."""
        entry = self.definition_module_name(definition)
        if entry is None:
            return None
        module, pb_name, docs, pb_fields = entry
        self.pb_to_definition[(module, pb_name.lower())] = definition
        record = {"proto": "k8s.io." + ".".join(module) + "." + pb_name}
        if definition in SPECIAL:
            record["special"] = SPECIAL[definition]
        if any(d == "+protobuf.nullable=true" for d in docs):
            record["special"] = "list_wrapper"

        t = self.openapi.get(definition)
        json_names = {}
        required = {}
        element_types = {}
        typed = False  # JSON names come from a k8s-openapi struct: unmatched ones are failures
        if inherited is not None:
            json_names, required, element_types = inherited
            typed = True
        elif definition in SPECIAL or record.get("special") == "list_wrapper":
            # The JSON form is not an object of these fields: list them by proto name.
            json_names = {norm(f.name): camel(f.name.replace("r#", "")) for f in pb_fields}
        elif t is not None and t.shape == "struct":
            typed = True
            for rust_name, rust_type in t.fields:
                json_name = t.json_names.get(rust_name)
                if json_name is None:
                    self.failures.append(f"{definition}.{rust_name}: no JSON name in k8s-openapi")
                    continue
                req, container, element = openapi_shape(rust_type)
                json_names[norm(rust_name)] = json_name
                required[norm(rust_name)] = req
                element_types[norm(rust_name)] = (container, element)
            if "apiVersion" in t.json_names.values():
                record["type_meta"] = True
        elif t is not None and t.shape == "enum" and definition.endswith(".WatchEvent"):
            # Only `type` and `object` are WatchEvent's; the enum's other names belong to
            # the BOOKMARK object k8s-openapi builds by hand.
            pb_norms = {norm(f.name) for f in pb_fields}
            json_names = {norm(v): v for v in t.json_names.values() if norm(v) in pb_norms}
        elif pb_name.endswith("List") and any(f.name == "items" for f in pb_fields):
            # `*List`: k8s-openapi's generic List<T> (list.rs) holds the JSON names.
            json_names = {norm(rust): j for rust, j in self.list_json.items() if j not in ("apiVersion", "kind")}
            record["type_meta"] = True
        elif pb_name in METADATA_ONLY_JSON:
            json_names = {norm(k): v for k, v in METADATA_ONLY_JSON[pb_name].items()}
            record["type_meta"] = True
        else:
            return None

        pb_by_norm = {norm(f.name): f for f in pb_fields}
        fields = []
        unmatched = {}
        for key, json_name in json_names.items():
            f = pb_by_norm.get(key)
            if f is None and json_name in ("apiVersion", "kind"):
                # TypeMeta travels in the runtime.Unknown envelope, not in the message.
                record["type_meta"] = True
                continue
            if f is None:
                unmatched[key] = json_name
                continue
            field = self.field(definition, module, json_name, f)
            if field is None:
                continue
            if required.get(key):
                field["required"] = True
            self.check_openapi_type(definition, json_name, field, element_types.get(key))
            fields.append(field)
        for key, f in pb_by_norm.items():
            if key in json_names:
                continue
            inline = self.inline_member(definition, module, f, unmatched, required, element_types, typed)
            if inline is not None:
                fields.append(inline)
            elif inherited is None and typed and definition not in SPECIAL:
                # Newer than v1_32 (k8s-pb follows a later release): not served, not a failure.
                record.setdefault("proto_only", []).append(f.name.replace("r#", ""))
        for json_name in unmatched.values():
            self.failures.append(f"{definition}.{json_name}: no protobuf field in {pb_name}")
        fields.sort(key=lambda x: x["tag"])
        record["fields"] = fields
        return record

    def inline_member(self, definition, module, f, unmatched, required, element_types, typed):
        """A proto message field standing for an inlined Go struct whose fields are among the
        JSON names left unmatched; claims them and builds the embedded type."""
        if not typed or not unmatched or not f.attr.startswith("message, optional"):
            return None
        mod, name = pb_message_type(module, f.rust_type)
        entry = self.pb.get((mod, name.lower()))
        if entry is None:
            return None
        members = {norm(g.name) for g in entry[3]}
        claimed = {k: v for k, v in unmatched.items() if k in members}
        if not claimed:
            return None
        for k in claimed:
            del unmatched[k]
        inline_definition = self.pb_definition(mod, name)
        if inline_definition in self.openapi:
            self.require(inline_definition)
        elif inline_definition not in self.types:
            self.types[inline_definition] = None
            built = self.build(
                inline_definition,
                (claimed, {k: required.get(k) for k in claimed}, {k: element_types.get(k) for k in claimed}),
            )
            if built is None:
                del self.types[inline_definition]
                self.failures.append(f"{definition}: inlined {name} did not join")
                return None
            built["inline_only"] = True
            self.types[inline_definition] = built
        tm = re.search(r'tag = "(\d+)"', f.attr)
        return {"json": "", "tag": int(tm.group(1)), "kind": "message", "type": inline_definition, "inline": True}

    def field(self, definition, module, json_name, f):
        am = re.match(r'(\w+)(?: = "([^"]*)")?, (.*)', f.attr)
        if not am:
            self.failures.append(f"{definition}.{json_name}: unparsed prost attribute {f.attr}")
            return None
        kind, kind_arg, rest = am.group(1), am.group(2), am.group(3)
        tm = re.search(r'tag = "(\d+)"', rest)
        field = {"json": json_name, "tag": int(tm.group(1))}
        if kind == "btree_map":
            key_kind, value_kind = [s.strip() for s in kind_arg.split(",")]
            field["kind"] = "map"
            field["key"] = key_kind
            field["value"] = value_kind
            if value_kind == "message":
                mod, name = pb_message_type(module, f.rust_type)
                field["type"] = self.pb_definition(mod, name)
                if field["type"] is None:
                    self.failures.append(f"{definition}.{json_name}: no message {'::'.join(mod)}::{name}")
                    return None
                self.require(field["type"])
        else:
            field["kind"] = kind
            if kind == "message":
                mod, name = pb_message_type(module, f.rust_type)
                field["type"] = self.pb_definition(mod, name)
                if field["type"] is None:
                    self.failures.append(f"{definition}.{json_name}: no message {'::'.join(mod)}::{name}")
                    return None
                self.require(field["type"])
            elif kind not in PB_SCALARS:
                self.failures.append(f"{definition}.{json_name}: unknown proto kind {kind}")
                return None
            if "repeated" in rest.split(", "):
                field["repeated"] = True
        markers = pb_markers(f.docs)
        if "patchStrategy" in markers:
            field["patch_strategy"] = markers["patchStrategy"][0]
        if "patchMergeKey" in markers:
            field["patch_merge_key"] = markers["patchMergeKey"][0]
        if "listType" in markers:
            field["list_type"] = markers["listType"][0]
        if "listMapKey" in markers:
            field["list_map_keys"] = markers["listMapKey"]
        return field

    def check_openapi_type(self, definition, json_name, field, shape):
        """Cross-check the message type named by k8s-pb against k8s-openapi's Rust type."""
        if shape is None:
            return
        container, element = shape
        if field.get("type") and element.startswith("crate::"):
            expected = openapi_element_definition(element, self.openapi_paths)
            if expected is not None and expected != field["type"]:
                self.failures.append(
                    f"{definition}.{json_name}: k8s-pb names {field['type']}, k8s-openapi {expected}"
                )
        if container == "vec" and not field.get("repeated") and field["kind"] != "bytes":
            target = self.openapi_wrapper(field)
            if not target:
                self.failures.append(f"{definition}.{json_name}: a JSON list but not repeated in proto")


    def openapi_wrapper(self, field):
        entry = self.definition_module_name(field.get("type") or "")
        return entry is not None and any(d == "+protobuf.nullable=true" for d in entry[2])


def camel(name):
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def catalogue_roots():
    text = open(CATALOGUE, encoding="utf-8").read()
    kinds = re.findall(r'"(io\.k8s\.[\w.]+)"\s*\)', text)
    if not kinds:
        sys.exit(f"{CATALOGUE}: no definitions found")
    roots = []
    for k in kinds:
        roots.append(k)
        roots.append(k + "List")  # skipped below when Kubernetes has no list (reviews)
    return roots


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_registry = sorted(glob.glob(os.path.expanduser("~/.cargo/registry/src/*/")))
    parser.add_argument("--registry", default=default_registry[0] if default_registry else None)
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args()
    pb_root = os.path.join(args.registry, PB_CRATE)
    openapi_root = os.path.join(args.registry, OPENAPI_CRATE)
    for p in (pb_root, openapi_root):
        if not os.path.isdir(p):
            sys.exit(f"missing {p}: `cargo fetch` a crate depending on it first")

    pb = load_pb(pb_root)
    openapi, openapi_paths, list_json = load_openapi(openapi_root)
    join = Join(pb, openapi, openapi_paths, list_json)
    roots = [r for r in catalogue_roots() + META_ROOTS if not r.endswith("List") or join.definition_module_name(r)]
    join.run(roots)

    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as out:
        out.write("{\n")
        out.write(f'"generator": "server/api/gen/schema.py from {PB_CRATE} and {OPENAPI_CRATE} {OPENAPI_VERSION_DIR}",\n')
        out.write('"types": {\n')
        names = sorted(join.types)
        for i, name in enumerate(names):
            sep = "," if i + 1 < len(names) else ""
            out.write(json.dumps(name) + ": " + json.dumps(join.types[name], separators=(",", ":")) + sep + "\n")
        out.write("}\n}\n")

    proto_only = sum(len(t.get("proto_only", [])) for t in join.types.values())
    print(f"{len(join.types)} types, {sum(len(t['fields']) for t in join.types.values())} fields -> {args.output}")
    print(f"{proto_only} proto-only fields (newer than v1_32) listed under proto_only")
    for f in join.failures:
        print("not joined:", f)
    if any(f.endswith("no message joined") for f in join.failures):
        sys.exit(1)


if __name__ == "__main__":
    main()
