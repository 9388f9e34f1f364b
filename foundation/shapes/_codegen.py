"""Generate the pydantic shape modules of ``foundation/shapes`` from botocore's service models.

    python -m eaglenest.foundation.shapes._codegen            # rewrite the checked-in modules
    python -m eaglenest.foundation.shapes._codegen --check    # exit 1 if they are out of date
    python foundation/shapes/_codegen.py OUT_DIR    # write elsewhere (works even if the
                                                    # generated modules are broken)

Only the stdlib and botocore are imported here, so the generator runs even when the
generated modules are missing or broken. The output depends only on botocore's model.

Every botocore shape ``X`` reachable from :data:`RESOURCES` gets a module-level name
``T_X``: an ``Annotated`` alias for strings, numbers, lists and maps, and ``T_X = X`` for a
structure ``class X``. Field annotations only ever name ``T_*`` aliases, because a member
is often called like its shape (``ImageConfig: ImageConfig``), which would shadow the class
inside the class body. Shapes reachable from two resources go to ``common.py``.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path
from typing import Any

import botocore
import botocore.session
from botocore.model import ServiceModel, Shape

RESOURCES: dict[str, tuple[str, ...]] = {
    "models": ("CreateModel", "DescribeModel", "ListModels", "DeleteModel"),
    "endpoint_configs": (
        "CreateEndpointConfig",
        "DescribeEndpointConfig",
        "ListEndpointConfigs",
        "DeleteEndpointConfig",
    ),
    "endpoints": (
        "CreateEndpoint",
        "DescribeEndpoint",
        "ListEndpoints",
        "UpdateEndpoint",
        "UpdateEndpointWeightsAndCapacities",
        "DeleteEndpoint",
    ),
    "optimization_jobs": (
        "CreateOptimizationJob",
        "DescribeOptimizationJob",
        "ListOptimizationJobs",
        "StopOptimizationJob",
        "DeleteOptimizationJob",
    ),
    "tags": ("AddTags", "ListTags", "DeleteTags"),
}
COMMON = "shared"
REGISTRY = "operations"
#: the Resource Groups Tagging API (botocore service model of its own): one self-contained
#: module, with its own operation -> shape tables (INPUT_SHAPES / OUTPUT_SHAPES)
TAGGING_SERVICE = "resourcegroupstaggingapi"
TAGGING = "tagging"
TAGGING_OPERATIONS = ("GetResources", "TagResources", "UntagResources")
#: CloudWatch's read operations (botocore service model "cloudwatch", signing name
#: "monitoring", served by api/cloudwatch/): one self-contained module like the Tagging API's
CLOUDWATCH_SERVICE = "cloudwatch"
CLOUDWATCH = "cloudwatch"
CLOUDWATCH_OPERATIONS = ("GetMetricStatistics", "GetMetricData", "ListMetrics")
OUT_DIR = Path(__file__).resolve().parent

# Member names that cannot be pydantic field names as-is: they get a trailing "_" and an alias.
RESERVED = frozenset({"Field", "Config", "Schema", "Json"}) | frozenset(keyword.kwlist)
BASE_MODEL_ATTRS = frozenset(
    {
        "construct",
        "copy",
        "dict",
        "from_orm",
        "json",
        "parse_file",
        "parse_obj",
        "parse_raw",
        "schema",
        "schema_json",
        "update_forward_refs",
        "validate",
    }
)
SCALARS = ("string", "integer", "long", "float", "double", "boolean", "timestamp")


def load_model(service: str = "sagemaker") -> ServiceModel:
    return botocore.session.get_session().get_service_model(service)


def operations() -> tuple[str, ...]:
    return tuple(op for ops in RESOURCES.values() for op in ops)


def python_name(member: str) -> str:
    """The pydantic field name for a wire member name (an alias keeps the wire name)."""
    clash = (
        member in RESERVED
        or member.lower() in BASE_MODEL_ATTRS
        or member.startswith(("model_", "_", "T_"))
    )
    return member + "_" if clash else member


def closure(model: ServiceModel, ops: tuple[str, ...]) -> dict[str, Shape]:
    """Every shape reachable from the operations' inputs and outputs, dependencies first."""
    done: dict[str, Shape] = {}
    active: set[str] = set()

    def visit(shape: Shape) -> None:
        if shape.name in done:
            return
        if shape.name in active:
            raise NotImplementedError(f"recursive shape {shape.name}")
        if "_" in shape.name:
            raise NotImplementedError(f"shape name {shape.name} would clash with T_ aliases")
        active.add(shape.name)
        for child in children(shape):
            visit(child)
        active.discard(shape.name)
        done[shape.name] = shape

    for op in ops:
        op_model = model.operation_model(op)
        for shape in (op_model.input_shape, op_model.output_shape):
            if shape is not None:
                visit(shape)
    return done


def children(shape: Shape) -> list[Shape]:
    if shape.type_name == "structure":
        return list(shape.members.values())
    if shape.type_name == "list":
        return [shape.member]
    if shape.type_name == "map":
        return [shape.key, shape.value]
    if shape.type_name in SCALARS:
        return []
    raise NotImplementedError(f"{shape.name}: botocore type {shape.type_name} is not supported")


def module_of(model: ServiceModel) -> dict[str, str]:
    """Shape name -> module: the one resource using it, or ``common``."""
    users: dict[str, set[str]] = {}
    for resource, ops in RESOURCES.items():
        for name in closure(model, ops):
            users.setdefault(name, set()).add(resource)
    return {name: (next(iter(r)) if len(r) == 1 else COMMON) for name, r in users.items()}


def py_str(text: str) -> str:
    """A double-quoted python literal for ``text``."""
    if text.isprintable() and '"' not in text and "\\" not in text:
        return f'"{text}"'
    return repr(text)


def py_raw(text: str) -> str:
    """A raw-string literal for a regex when possible (readable), else a plain one."""
    trailing = len(text) - len(text.rstrip("\\"))
    if text.isprintable() and '"' not in text and trailing % 2 == 0:
        return f'r"{text}"'
    return repr(text)


def field_args(meta: dict[str, Any], length: bool, strict: bool) -> list[str]:
    args = ["strict=True"] if strict else []
    low, high = ("min_length", "max_length") if length else ("ge", "le")
    if "min" in meta:
        args.append(f"{low}={meta['min']!r}")
    if "max" in meta:
        args.append(f"{high}={meta['max']!r}")
    if "pattern" in meta:
        args.append(f"pattern=aws_pattern({py_raw(meta['pattern'])})")
    return args


def annotated(base: str, args: list[str]) -> str:
    return f"Annotated[{base}, Field({', '.join(args)})]" if args else base


def literal(values: list[str]) -> str:
    inline = "Literal[" + ", ".join(py_str(v) for v in values) + "]"
    if len(inline) <= 80:
        return inline
    return "Literal[\n" + "".join(f"    {py_str(v)},\n" for v in values) + "]"


def alias_expr(shape: Shape) -> str:
    """The right-hand side of ``T_<shape> = ...`` for a non-structure shape."""
    meta = shape.metadata
    kind = shape.type_name
    if kind == "string":
        if "enum" in meta:
            return literal(list(meta["enum"]))
        return annotated("str", field_args(meta, length=True, strict=True))
    if kind in ("integer", "long"):
        return annotated("int", field_args(meta, length=False, strict=True))
    if kind in ("float", "double"):
        return annotated("float", field_args(meta, length=False, strict=True))
    if kind == "boolean":
        return "Annotated[bool, Field(strict=True)]"
    if kind == "timestamp":
        return "AwsTimestamp"
    if kind == "list":
        return annotated(f"list[T_{shape.member.name}]", field_args(meta, True, False))
    if kind == "map":
        inner = f"dict[T_{shape.key.name}, T_{shape.value.name}]"
        return annotated(inner, field_args(meta, True, False))
    raise NotImplementedError(f"{shape.name}: {kind}")


def member_line(name: str, shape: Shape, required: bool) -> str:
    field = python_name(name)
    ref = f"T_{shape.name}"
    if field == name:
        return f"    {name}: {ref}" if required else f"    {name}: {ref} | None = None"
    if required:
        return f"    {field}: {ref} = Field(alias={py_str(name)})"
    return f"    {field}: {ref} | None = Field(default=None, alias={py_str(name)})"


def class_source(shape: Shape) -> str:
    base = "AwsUnion" if shape.metadata.get("union") else "AwsShape"
    required = set(shape.required_members)
    unknown = required - set(shape.members)
    if unknown:
        raise NotImplementedError(f"{shape.name}: required {sorted(unknown)} not members")
    lines = [f"class {shape.name}({base}):"]
    lines += [member_line(n, s, n in required) for n, s in shape.members.items()]
    if len(lines) == 1:
        lines.append("    pass")
    return "\n".join(lines) + f"\n\n\nT_{shape.name} = {shape.name}\n"


def header(service: str = "sagemaker") -> str:
    return (
        "# Generated by `python -m eaglenest.foundation.shapes._codegen` from botocore "
        f"{botocore.__version__}"
        f' ("{service}" service model).\n'
        "# Do not edit: change foundation/shapes/_codegen.py and re-run it.\n"
        "# ruff: noqa: E501\n# fmt: off\n"
    )


def imports(body: str, local: set[str], owner: dict[str, str]) -> str:
    """Import lines for the names ``body`` uses and does not define."""
    blocks: list[str] = []
    typing_names = [n for n in ("Annotated", "Literal") if re.search(rf"\b{n}\[", body)]
    if typing_names:
        blocks.append(f"from typing import {', '.join(typing_names)}\n")
    if "Field(" in body:
        blocks.append("from pydantic import Field\n")
    local_lines: list[str] = []
    base_names = ["AwsShape", "AwsTimestamp", "AwsUnion", "aws_pattern"]
    used_base = [n for n in base_names if re.search(rf"\b{n}\b", body)]
    if used_base:
        local_lines.append(f"from .base import {', '.join(used_base)}\n")
    by_module: dict[str, list[str]] = {}
    for ref in sorted(set(re.findall(r"\bT_([A-Za-z0-9]+)\b", body)) - local):
        by_module.setdefault(owner[ref], []).append(ref)
    for module in sorted(by_module):
        names = "".join(f"    T_{ref},\n" for ref in by_module[module])
        local_lines.append(f"from .{module} import (\n{names})\n")
    blocks.append("".join(local_lines))
    return "\n".join(blocks)


def render_module(module: str, shapes: list[Shape], owner: dict[str, str],
                  service: str = "sagemaker", tables: str = "") -> str:
    """One module's source; `tables`: operation tables appended to its body."""
    scalars = sorted((s for s in shapes if s.type_name in SCALARS), key=lambda s: s.name)
    parts = [f"T_{s.name} = {alias_expr(s)}\n" for s in scalars]
    for shape in shapes:
        if shape.type_name == "structure":
            parts.append("\n\n" + class_source(shape))
        elif shape.type_name not in SCALARS:
            parts.append(f"\n\nT_{shape.name} = {alias_expr(shape)}\n")
    body = "".join(parts).lstrip("\n") + tables
    local = {s.name for s in shapes}
    title = "SageMaker shapes" if service == "sagemaker" else f"{service} shapes"
    doc = f'"""{title}: {module.replace("_", " ")}."""\n\n'
    gap = "\n\n" if body.startswith("class ") else "\n"  # what ruff's isort wants
    return header(service) + doc + imports(body, local, owner) + gap + body


def render_registry(model: ServiceModel, owner: dict[str, str]) -> str:
    rows_in: list[str] = []
    rows_out: list[str] = []
    used: dict[str, set[str]] = {}
    for op in operations():
        op_model = model.operation_model(op)
        used.setdefault(owner[op_model.input_shape.name], set()).add(op_model.input_shape.name)
        rows_in.append(f'    "{op}": {op_model.input_shape.name},\n')
        out = op_model.output_shape
        if out is not None:
            used.setdefault(owner[out.name], set()).add(out.name)
        rows_out.append(f'    "{op}": {out.name if out is not None else "None"},\n')
    lines = [header(), '"""Operation name -> input / output shape (None: no output)."""\n\n']
    lines.append("from .base import AwsShape\n")
    for module in sorted(used):
        names = "".join(f"    {n},\n" for n in sorted(used[module]))
        lines.append(f"from .{module} import (\n{names})\n")
    lines.append("\nINPUT_SHAPES: dict[str, type[AwsShape]] = {\n" + "".join(rows_in) + "}\n")
    lines.append("OUTPUT_SHAPES: dict[str, type[AwsShape] | None] = {\n")
    lines.append("".join(rows_out) + "}\n")
    return "".join(lines)


def render(model: ServiceModel | None = None) -> dict[str, str]:
    """File name -> source of every generated module."""
    model = model or load_model()
    owner = module_of(model)
    everything = closure(model, operations())
    files: dict[str, str] = {}
    for module in (COMMON, *RESOURCES):
        shapes = [s for name, s in everything.items() if owner[name] == module]
        files[f"{module}.py"] = render_module(module, shapes, owner)
    files[f"{REGISTRY}.py"] = render_registry(model, owner)
    files[f"{TAGGING}.py"] = render_service(TAGGING, TAGGING_SERVICE, TAGGING_OPERATIONS)
    files[f"{CLOUDWATCH}.py"] = render_service(CLOUDWATCH, CLOUDWATCH_SERVICE,
                                               CLOUDWATCH_OPERATIONS)
    return files


def render_service(module: str, service: str, ops: tuple[str, ...],
                   model: ServiceModel | None = None) -> str:
    """One self-contained module of another service than SageMaker (the Tagging API's,
    CloudWatch's): the shapes of `ops` and its operation tables (INPUT_SHAPES /
    OUTPUT_SHAPES)."""
    model = model or load_model(service)
    shapes = closure(model, ops)
    owner = dict.fromkeys(shapes, module)
    rows_in, rows_out = [], []
    for op in ops:
        op_model = model.operation_model(op)
        rows_in.append(f'    "{op}": {op_model.input_shape.name},\n')
        out = op_model.output_shape
        rows_out.append(f'    "{op}": {out.name if out is not None else "None"},\n')
    tables = ("\n\nINPUT_SHAPES: dict[str, type[AwsShape]] = {\n" + "".join(rows_in) + "}\n"
              "OUTPUT_SHAPES: dict[str, type[AwsShape] | None] = {\n" + "".join(rows_out)
              + "}\n")
    return render_module(module, list(shapes.values()), owner, service, tables)


def write(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, source in render().items():
        path = out_dir / name
        path.write_text(source, encoding="utf-8", newline="\n")
        written.append(path)
    return written


def stale(out_dir: Path) -> list[str]:
    """Generated files under ``out_dir`` whose content differs from a fresh render."""
    return [
        name
        for name, source in render().items()
        if not (out_dir / name).is_file() or (out_dir / name).read_text("utf-8") != source
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", nargs="?", type=Path, default=OUT_DIR)
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale(args.out_dir)
        for name in outdated:
            print(f"out of date: {args.out_dir / name}", file=sys.stderr)
        return 1 if outdated else 0
    for path in write(args.out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
