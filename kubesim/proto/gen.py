#!/usr/bin/env python3
"""Builds kubesim/proto/schema.txt, the protobuf field tables kubesim decodes request bodies
with, from the k8s.io/api and k8s.io/apimachinery sources (Apache-2.0, see LICENSE-NOTE.md).

usage: gen.py API_CHECKOUT APIMACHINERY_CHECKOUT > schema.txt

For every message of the packages below, each field gets: number, wire form (scalar type,
message type, map), repeated or not, its JSON name, and how Go's encoding/json writes it: a
pointer field is written whenever set (an explicit false/0/"" means something), a non-pointer
field with omitempty is dropped when zero, as the real API server's typed round trip does.
The pointer/omitempty facts come from the struct tags of types.go (the `protobuf:"...,name=X"`
tag ties a Go field to its proto field); an `inline` field (`json:",inline"`, e.g. a Volume's
VolumeSource, an IngressRule's IngressRuleValue) has its fields written into its parent.
"""
import os, re, sys

API, MACH = sys.argv[1], sys.argv[2]
PKGS = [
    (MACH, "pkg/apis/meta/v1", "k8s.io.apimachinery.pkg.apis.meta.v1"),
    (MACH, "pkg/runtime", "k8s.io.apimachinery.pkg.runtime"),
    (MACH, "pkg/util/intstr", "k8s.io.apimachinery.pkg.util.intstr"),
    (MACH, "pkg/api/resource", "k8s.io.apimachinery.pkg.api.resource"),
]
for d in ["core/v1", "apps/v1", "batch/v1", "rbac/v1", "networking/v1", "policy/v1",
          "autoscaling/v1", "autoscaling/v2", "storage/v1", "admissionregistration/v1",
          "scheduling/v1", "coordination/v1", "discovery/v1", "events/v1", "node/v1",
          "certificates/v1", "flowcontrol/v1"]:
    PKGS.append((API, d, "k8s.io.api." + d.replace("/", ".")))

FIELD = re.compile(r"^\s*(optional|repeated)?\s*(map<\s*(\S+)\s*,\s*(\S+)\s*>|\S+)\s+(\w+)\s*=\s*(\d+)\s*;")
TAG = re.compile(r'^\s*(\w+)?\s+(\*?)\S.*?`json:"([^"]*)".*?protobuf:"[^"]*name=(\w+)')
ANON = re.compile(r"^\s*\*?[\w.]+\s+`")
STRUCT = re.compile(r"^type (\w+) struct \{")

def go_fields(path):
    """struct -> proto name -> (json name, pointer, omitempty) from every non-test .go file."""
    out = {}
    for f in sorted(os.listdir(path)):
        if not f.endswith(".go") or f.endswith("_test.go") or f.startswith("zz_") or f == "generated.pb.go":
            continue
        cur = None
        for line in open(os.path.join(path, f)):
            m = STRUCT.match(line)
            if m:
                cur = out.setdefault(m.group(1), {})
                continue
            if line.startswith("}"):
                cur = None
                continue
            if cur is None:
                continue
            m = TAG.match(line)
            if m:
                jname, opts = m.group(3).split(",")[0], m.group(3).split(",")[1:]
                cur[m.group(4)] = (jname, m.group(2) == "*", "omitempty" in opts or "omitzero" in opts,
                                   jname == "" and ANON.match(line) is not None)
    return out

def resolve(t, pkg):
    if t in ("string", "int32", "int64", "bool", "bytes", "double", "float", "uint32", "uint64", "fixed64", "fixed32", "sint32", "sint64"):
        return t
    return t[1:] if t.startswith(".") else pkg + "." + t

for root, d, pkg in PKGS:
    go = go_fields(os.path.join(root, d))
    text = re.sub(r"//[^\n]*", "", open(os.path.join(root, d, "generated.proto")).read())
    depth, msg = 0, None
    for line in text.splitlines():
        m = re.match(r"^\s*message (\w+) \{", line)
        if m and depth == 0:
            msg = m.group(1)
            print("message %s.%s" % (pkg, msg))
            depth = 1
            continue
        if depth and line.strip() == "}":
            depth, msg = 0, None
            continue
        m = FIELD.match(line) if msg else None
        if not m:
            continue
        label, typ, k, v, name, num = m.groups()
        jname, ptr, omit, inline = go.get(msg, {}).get(name, (name, False, True, False))
        if jname == "":
            jname = name
        flags = ("p" if ptr else "") + ("o" if omit else "") + ("i" if inline else "")
        if k:
            print("  %s %s map:%s:%s %s" % (num, jname, resolve(k, pkg), resolve(v, pkg), flags or "-"))
        else:
            print("  %s %s %s%s %s" % (num, jname, "[]" if label == "repeated" else "", resolve(typ, pkg), flags or "-"))
