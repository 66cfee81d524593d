"""The op table page of the documentation site (docsite.py builds the rest).

Generated from the op table itself (``tensorgrad.ops.registry``) on every docs build: one
example call per public op (:data:`OP_EXAMPLES`), traced with its backward to show the shapes
in and out, the primitives it records and what its gradient records; then every primitive
with its doc line, an instance of its shapes, its kernel kind and its backward rule's source.
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def public_ops() -> dict[str, Callable[..., Any]]:
    """The op table's public functions (`tg.relu`, ...), by name."""
    from tensorgrad.ops.registry import PUBLIC

    return dict(sorted(PUBLIC.items()))


# ---- the op table ----------------------------------------------------------------------------

# One example call per public op: the expression (shown as is, and traced) and its tensors
# ({name: shape} f32, or (shape, "i32")). The op table page traces each one to show the shapes
# in and out, the primitives it records and what its backward records.
F = (2, 3)
OP_EXAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "abs": ("tg.abs(x)", {"x": F}),
    "add": ("tg.add(a, b)", {"a": F, "b": (3,)}),
    "arange": ("tg.arange(5)", {}),
    "argmax": ("tg.argmax(x, axis=1)", {"x": F}),
    "argmin": ("tg.argmin(x, axis=1)", {"x": F}),
    "capture": ('tg.capture("h", x)', {"x": F}),
    "categorical": ("tg.categorical(logits)", {"logits": (2, 5)}),
    "clamp": ("tg.clamp(x, min=-0.5, max=0.5)", {"x": F}),
    "concat": ("tg.concat([a, b], axis=1)", {"a": F, "b": (2, 2)}),
    "conv2d": ("tg.conv2d(x, w, padding=1)", {"x": (1, 2, 5, 5), "w": (3, 2, 3, 3)}),
    "cos": ("tg.cos(x)", {"x": F}),
    "cross_entropy": ("tg.cross_entropy(logits, targets)",
                      {"logits": (4, 5), "targets": ((4,), "i32")}),
    "div": ("tg.div(a, b)", {"a": F, "b": F}),
    "dropout": ("tg.dropout(x, 0.5)", {"x": F}),
    "embedding": ("tg.embedding(table, idx)", {"table": (10, 4), "idx": ((2, 3), "i32")}),
    "erf": ("tg.erf(x)", {"x": F}),
    "exp": ("tg.exp(x)", {"x": F}),
    "gelu": ("tg.gelu(x)", {"x": F}),
    "greater": ("tg.greater(a, b)", {"a": F, "b": F}),
    "layer_norm": ("tg.layer_norm(x, weight, bias)", {"x": (2, 4), "weight": (4,), "bias": (4,)}),
    "leaky_relu": ("tg.leaky_relu(x)", {"x": F}),
    "less": ("tg.less(a, b)", {"a": F, "b": F}),
    "log": ("tg.log(x)", {"x": F}),
    "log_softmax": ("tg.log_softmax(x)", {"x": (2, 5)}),
    "matmul": ("tg.matmul(a, b)", {"a": F, "b": (3, 4)}),
    "max_pool2d": ("tg.max_pool2d(x, 2)", {"x": (1, 1, 4, 4)}),
    "maximum": ("tg.maximum(a, b)", {"a": F, "b": F}),
    "mean": ("tg.mean(x, axis=1)", {"x": F}),
    "merge_heads": ("tg.merge_heads(x)", {"x": (2, 4, 3, 5)}),
    "minimum": ("tg.minimum(a, b)", {"a": F, "b": F}),
    "mul": ("tg.mul(a, b)", {"a": F, "b": F}),
    "narrow": ("tg.narrow(x, 0, 1, 2)", {"x": (4, 3)}),
    "nearest_upsample2d": ("tg.nearest_upsample2d(x, 2)", {"x": (1, 1, 2, 2)}),
    "neg": ("tg.neg(x)", {"x": F}),
    "nll_loss": ("tg.nll_loss(log_probs, targets)",
                 {"log_probs": (4, 5), "targets": ((4,), "i32")}),
    "one_hot": ("tg.one_hot(idx, 4)", {"idx": ((3,), "i32")}),
    "ones": ("tg.ones((2, 3))", {}),
    "permute": ("tg.permute(x, (2, 0, 1))", {"x": (2, 3, 4)}),
    "randn": ("tg.randn((2, 3))", {}),
    "relu": ("tg.relu(x)", {"x": F}),
    "reshape": ("tg.reshape(x, (3, 2))", {"x": F}),
    "rms_norm": ("tg.rms_norm(x, weight)", {"x": (2, 4), "weight": (4,)}),
    "rope": ("tg.rope(q, k)", {"q": (1, 4, 8), "k": (1, 4, 8)}),
    "rsqrt": ("tg.rsqrt(x)", {"x": F}),
    "scaled_dot_product_attention": ("tg.scaled_dot_product_attention(q, k, v, is_causal=True)",
                                     {"q": (1, 2, 4, 8), "k": (1, 2, 4, 8),
                                      "v": (1, 2, 4, 8)}),
    "sigmoid": ("tg.sigmoid(x)", {"x": F}),
    "silu": ("tg.silu(x)", {"x": F}),
    "sin": ("tg.sin(x)", {"x": F}),
    "softmax": ("tg.softmax(x)", {"x": (2, 5)}),
    "softmax_causal": ("tg.softmax_causal(x)", {"x": (4, 4)}),
    "softplus": ("tg.softplus(x)", {"x": F}),
    "split": ("tg.split(x, [2, 4])", {"x": (6, 2)}),
    "split_heads": ("tg.split_heads(x, 2)", {"x": (2, 4, 6)}),
    "sqrt": ("tg.sqrt(x)", {"x": F}),
    "square": ("tg.square(x)", {"x": F}),
    "stack": ("tg.stack([a, b])", {"a": F, "b": F}),
    "stop_gradient": ("tg.stop_gradient(x)", {"x": F}),
    "sub": ("tg.sub(a, b)", {"a": F, "b": F}),
    "sum": ("tg.sum(x, axis=1)", {"x": F}),
    "swap_axes": ("tg.swap_axes(x, 0, 2)", {"x": (2, 3, 4)}),
    "take_along_axis": ("tg.take_along_axis(x, idx, 1)", {"x": (2, 5), "idx": ((2, 3), "i32")}),
    "tanh": ("tg.tanh(x)", {"x": F}),
    "where": ("tg.where(tg.greater(a, 0.0), a, b)", {"a": F, "b": F}),
    "where_causal": ('tg.where_causal(x, float("-inf"))', {"x": (4, 4)}),
    "zeros": ("tg.zeros((2, 3))", {}),
}


def _type(node: Any) -> str:
    return f"{node.dtype}{list(node.shape)}"


@dataclass
class OpExample:
    """One public op's example, traced: its inputs, outputs, forward primitives, the inputs a
    gradient reaches and the primitives the backward records."""

    expr: str
    inputs: dict[str, str]
    outputs: list[str]
    forward: list[str]
    grad_to: list[str]
    backward: list[str]
    instances: dict[str, str]   # primitive -> "in, in -> out" of its first node here


def _backward(graph: Any, seeds: dict[int, Any]) -> set[int]:
    """Append the backward of `graph` from the cotangents `seeds` ({node id: Tensor}) as
    autograd does from a loss (:func:`tensorgrad.autograd.backward`); the ids of the leaves
    a gradient reached."""
    from tensorgrad.autograd import backward

    return set(backward(graph, seeds))


def op_example(name: str) -> OpExample:
    """Trace `OP_EXAMPLES[name]` and its backward from a cotangent per f32 output."""
    import tensorgrad as tg
    from tensorgrad.ir import LEAF_OPS, Graph
    from tensorgrad.tensor import Tensor, leaf, tracing

    expr, decls = OP_EXAMPLES[name]
    graph = Graph()
    with tracing(graph):
        env: dict[str, Any] = {"tg": tg}
        for arg, decl in decls.items():
            shape, dtype = (decl if isinstance(decl[-1], str) else (decl, "f32"))
            env[arg] = leaf("param" if dtype == "f32" else "input", arg, shape, dtype)
        start = len(graph.nodes)
        value = eval(expr, env)
        end = len(graph.nodes)
        outs = list(value) if isinstance(value, (list, tuple)) else [value]
        seeds = {o.id: leaf("input", f"d{k}", o.shape, "f32")
                 for k, o in enumerate(outs) if o.dtype == "f32"}
        mark = len(graph.nodes)
        reached_ids = _backward(graph, seeds)
    nodes = graph.nodes
    reached = {nodes[i].attrs["name"] for i in reached_ids}
    instances: dict[str, str] = {}
    for n in nodes[start:end] + nodes[mark:]:
        if n.op not in LEAF_OPS:
            instances.setdefault(n.op, ", ".join(_type(nodes[i]) for i in n.inputs)
                                 + f" → {_type(n)}")
    assert all(isinstance(o, Tensor) for o in outs)
    return OpExample(
        expr, {a: _type(nodes[t.id]) for a, t in env.items() if isinstance(t, Tensor)},
        [_type(nodes[o.id]) for o in outs],
        [n.op for n in nodes[start:end] if n.op not in LEAF_OPS],
        [a for a in decls if a in reached and nodes[env[a].id].op == "param"],
        [n.op for n in nodes[mark:] if n.op not in LEAF_OPS], instances)


def _gradient(op: Any) -> tuple[str, str]:
    """(short label, sentence) for an OpDef's backward rule."""
    from tensorgrad.ops.registry import GRAD_ERROR, NO_GRAD

    if op.vjp == NO_GRAD:
        return "none", "No gradient flows back through it (`NO_GRAD`)."
    if op.vjp == GRAD_ERROR:
        return "error", ("A backward or optimizer op: differentiating through it raises "
                         "(`GRAD_ERROR`).")
    return "yes", "Differentiable: its backward rule, written in forward ops, is below."


def _kernel(op: Any) -> str:
    parts = []
    if op.expr is not None:
        parts.append("elementwise (fusable)")
    if op.view is not None:
        parts.append("a view of its input where the plan allows")
    if op.pack:
        parts.append("placed by the buffer plan (no kernel)")
    if op.stitch is not None:
        if op.stitch.prologue:
            parts.append("stitches elementwise producers of inputs "
                         + ", ".join(str(k) for k in op.stitch.prologue))
        if op.stitch.epilogue:
            parts.append("stitches an elementwise epilogue")
    if op.zeros is not None:
        parts.append("tracks zero triangles")
    return "; ".join(parts) or "its own kernel"


def _vjp_source(op: Any) -> str:
    try:
        return textwrap.dedent(inspect.getsource(op.vjp)).rstrip()
    except (OSError, TypeError):
        return ""


def cell(text: str) -> str:
    """`text` fit for a Markdown table cell (pipes escaped, one line)."""
    return text.replace("|", "\\|").replace("\n", " ")


def _counted(ops: list[str]) -> str:
    counts: dict[str, int] = {}
    for op in ops:
        counts[op] = counts.get(op, 0) + 1
    return ", ".join(f"[{op}](#{op})" + (f" ×{n}" if n > 1 else "") for op, n in counts.items())


def op_table_markdown() -> str:
    """The op table page: each public op's example traced (shapes in and out, primitives,
    gradient), then every primitive of tensorgrad.ops.registry.OPS with its doc line, an
    instance of its shapes, its kernel kind and its gradient rule."""
    from tensorgrad.ops.registry import OPS

    examples = {name: op_example(name) for name in public_ops() if name in OP_EXAMPLES}
    users: dict[str, list[str]] = {}
    instances: dict[str, str] = {}
    for name, ex in examples.items():
        for p in dict.fromkeys(ex.forward):
            users.setdefault(p, []).append(name)
        for p, text in ex.instances.items():
            instances.setdefault(p, f"{text} (in `tg.{name}`'s example)")
    out = ["# Op table", "",
           ("Generated from the op table (`tensorgrad/ops/registry.py`) when the docs are "
           "built. A *public op* is what you call (`tg.matmul`); it records one or more "
           "*primitives* into the graph. The first table traces one example call of each "
           "public op: the tensors in and out, the primitives it records, the inputs its "
           "gradient reaches and the primitives its backward records (every backward rule is "
           "written in forward ops; a rule may give an input's gradient at the broadcast "
           "shape of the op's output, and autograd sums it back to the input's shape). The "
           "second lists every primitive: its doc line (the shape "
           "rule), its kernel and its gradient rule — *yes* (a backward rule), *none* (no "
           "gradient flows back) or *error* (backward and optimizer ops, never "
           "differentiated)."), "",
           "## Public ops", "",
           "| op | example: in → out | records | gradient: to (backward records) |",
           "|---|---|---|---|"]
    for name, fn in public_ops().items():
        ex = examples.get(name)
        link = f"[`tg.{name}`](ops.md#{fn.__module__}.{name})"
        if ex is None:
            out.append(f"| {link} | (no example) | | |")
            continue
        ins = ", ".join(f"{a}: `{t}`" for a, t in ex.inputs.items()) or "—"
        outs = ", ".join(f"`{t}`" for t in ex.outputs)
        grad = "none" if not ex.grad_to else f"to {', '.join(ex.grad_to)}" + (
            f" ({_counted(ex.backward)})" if ex.backward else "")
        out.append(f"| {link} | `{cell(ex.expr)}`<br>{ins} → {outs} | "
                   f"{_counted(ex.forward) or '—'} | {grad} |")
    out += ["", "## Primitives", "", "| primitive | shapes | gradient |", "|---|---|---|"]
    for name, op in OPS.items():
        out.append(f"| [{name}](#{name}) | {cell(op.doc)} | {_gradient(op)[0]} |")
    for name, op in OPS.items():
        label, sentence = _gradient(op)
        out += ["", f"### {name} {{#{name}}}", "", op.doc, ""]
        if name in instances:
            out.append(f"- for example: `{instances[name].split(' (')[0]}`"
                       + instances[name][len(instances[name].split(' (')[0]):])
        out += [f"- kernel: {_kernel(op)}", f"- gradient: **{label}**. {sentence}"]
        if users.get(name):
            out.append("- recorded by: " + ", ".join(f"`tg.{u}`" for u in users[name]))
        source = _vjp_source(op) if label == "yes" else ""
        if source:
            out += ["", '??? note "backward rule"', "", "    ```python"]
            out += [f"    {line}" if line else "" for line in source.splitlines()]
            out.append("    ```")
    return "\n".join(out) + "\n"
