"""torch-mlir's tensor constants as plain dense attributes.

torch-mlir's FX importer writes a tensor literal as ``dense_resource<name>``, its bytes in
the module text's ``dialect_resources`` section. kf's own ops (``kf.constant``, which
kf-linalg-to-gpu makes of every constant buffer a kernel reads) and its folds take
``DenseElementsAttr`` only, so each resource literal of the text is written as the
dense attribute of the same bytes (``dense<"0x...">``) before the text is parsed: after
parsing, the context may have renamed the blobs (``name_1``)."""

from __future__ import annotations

import re

#: one blob of the dialect_resources section: ``name: "0x<alignment, 4 bytes><data>"``
_BLOB = re.compile(r'^\s*([\w.$-]+): "0x([0-9A-Fa-f]*)"', re.M)
#: a resource literal and its tensor type
_LITERAL = re.compile(r"dense_resource<([\w.$-]+)>(\s*:\s*)(tensor<([0-9x]*)(i1|[a-z]+[0-9A-Za-z]*)>)")


def resource_blobs(text: str) -> dict[str, bytes]:
    """The data of each builtin resource blob of a module's text (less its 4-byte
    alignment prefix)."""
    start = text.rfind("{-#")
    if start < 0:
        return {}
    return {name: bytes.fromhex(hexdata)[4:] for name, hexdata in _BLOB.findall(text[start:])}


def _hex(data: bytes, elem: str) -> str:
    """MLIR's hex form of the elements: their little-endian bytes; for i1 (torch's bool,
    one byte an element) one bit an element, packed from the low bit."""
    if elem == "i1":
        packed = bytearray((len(data) + 7) // 8)
        for i, b in enumerate(data):
            if b:
                packed[i // 8] |= 1 << (i % 8)
        data = bytes(packed)
    return data.hex().upper()


def inline_dense_resources(text: str) -> str:
    """text with every ``dense_resource<...> : tensor<...>`` literal written as the dense
    literal of the same value."""
    blobs = resource_blobs(text)
    if not blobs:
        return text

    def literal(m: re.Match) -> str:
        data = blobs.get(m.group(1))
        if data is None or not data:
            return m.group(0)
        return f'dense<"0x{_hex(data, m.group(5))}">{m.group(2)}{m.group(3)}'

    return _LITERAL.sub(literal, text)
